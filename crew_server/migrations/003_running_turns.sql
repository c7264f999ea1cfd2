-- Registering a turn interrupts the agent's turns still `running` (they lost their
-- end): find them without scanning the agent's whole history.
CREATE INDEX turns_running_by_agent ON turns(agent_id) WHERE status = 'running';
