-- Twin of ../011_loop_guard.sql: the loop guard's room limits, runs and pauses.
ALTER TABLE rooms ADD COLUMN agent_hop_limit BIGINT NOT NULL DEFAULT 3;
ALTER TABLE rooms ADD COLUMN agent_rate_limit BIGINT NOT NULL DEFAULT 12;
ALTER TABLE rooms ADD COLUMN agent_run BIGINT NOT NULL DEFAULT 0;
ALTER TABLE rooms ADD COLUMN agents_paused_seq BIGINT;
ALTER TABLE rooms ADD COLUMN agents_paused_at TEXT COLLATE "C";
ALTER TABLE rooms ADD COLUMN agents_paused_reason TEXT COLLATE "C";
ALTER TABLE positions ADD COLUMN loop_release_seq BIGINT NOT NULL DEFAULT 0;
CREATE INDEX messages_by_room_author ON messages(room_id, author_kind, seq);
