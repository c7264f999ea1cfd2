-- PostgreSQL twin of ../013_room_status.sql: the dismissed failures of the room's status
-- line. Unlike SQLite's, a PostgreSQL index does not end with the row's order: an agent's
-- recent turns (newest first, ties by rowid) get an index that does.
CREATE TABLE room_status_dismissals (
    user_id      TEXT COLLATE "C" NOT NULL,
    room_id      TEXT COLLATE "C" NOT NULL,
    agent_id     TEXT COLLATE "C" NOT NULL,
    turn_id      TEXT COLLATE "C" NOT NULL,
    dismissed_at TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (user_id, room_id, agent_id)
);
CREATE INDEX turns_by_agent_recent ON turns(agent_id, started_at, rowid);
