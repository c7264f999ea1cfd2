-- The wall-clock limit of one turn of this agent, in seconds (NULL: the Computer's
-- bootstrap `turn_time_limit_s`). Sent to the Computer with the agent.
ALTER TABLE agents ADD COLUMN turn_time_limit_s INTEGER;
