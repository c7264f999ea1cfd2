-- PostgreSQL twin of ../009_egress.sql: each agent's egress policy, each turn's gateway usage.
ALTER TABLE agents ADD COLUMN egress TEXT COLLATE "C" NOT NULL DEFAULT '{"mode":"public","allow":[]}';
ALTER TABLE turns ADD COLUMN gateway_usage TEXT COLLATE "C";
