-- PostgreSQL twin of ../014_removals.sql: when an agent or a Computer was deleted.
ALTER TABLE agents ADD COLUMN deleted_at TEXT COLLATE "C";
ALTER TABLE computers ADD COLUMN deleted_at TEXT COLLATE "C";
