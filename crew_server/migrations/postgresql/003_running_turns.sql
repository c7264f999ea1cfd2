-- Twin of ../003_running_turns.sql.
CREATE INDEX turns_running_by_agent ON turns(agent_id) WHERE status = 'running';
