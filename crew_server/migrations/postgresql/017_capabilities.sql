-- PostgreSQL twin of ../017_capabilities.sql: each agent's MCP servers and skills.
ALTER TABLE agents ADD COLUMN capabilities TEXT COLLATE "C" NOT NULL DEFAULT '{"mcp_servers":[],"skills":[]}';
ALTER TABLE agents ADD COLUMN capabilities_state TEXT COLLATE "C";
