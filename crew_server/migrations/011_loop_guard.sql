-- The loop guard (issue 24). Per dm or group: how many agent messages in a row (since the
-- user last wrote) may wake other agents, and how many agent messages a minute may. Per
-- room (threads too, with their group's limits): the run of agent messages so far, and
-- the pause it led to — from which seq on claims hold the room's messages back, since when
-- and why (`hops` | `rate`). Per position: how far a notice that woke the agent in a
-- paused room (a reminder) lets its claim go.
ALTER TABLE rooms ADD COLUMN agent_hop_limit INTEGER NOT NULL DEFAULT 3;
ALTER TABLE rooms ADD COLUMN agent_rate_limit INTEGER NOT NULL DEFAULT 12;
ALTER TABLE rooms ADD COLUMN agent_run INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rooms ADD COLUMN agents_paused_seq INTEGER;
ALTER TABLE rooms ADD COLUMN agents_paused_at TEXT;
ALTER TABLE rooms ADD COLUMN agents_paused_reason TEXT;
ALTER TABLE positions ADD COLUMN loop_release_seq INTEGER NOT NULL DEFAULT 0;
-- The per-minute cap reads a room's newest agent messages.
CREATE INDEX messages_by_room_author ON messages(room_id, author_kind, seq);
