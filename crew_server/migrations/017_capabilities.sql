-- Capabilities (issue 27): each agent's own MCP servers and skills, the normalised
-- document of `crew_common.capabilities` as JSON, secrets included (the Computer gets
-- them in its agent sync; the user API shows only their names). Agents from before
-- it have none.
ALTER TABLE agents ADD COLUMN capabilities TEXT NOT NULL DEFAULT '{"mcp_servers":[],"skills":[]}';
-- What its Computer last reported of them (JSON: the version it applied, each MCP
-- server's state and why, when); NULL: nothing reported yet.
ALTER TABLE agents ADD COLUMN capabilities_state TEXT;
