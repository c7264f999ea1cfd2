-- PostgreSQL twin of ../007_agent_writes.sql: idempotency keys of agent writes (the
-- primary key makes the dedupe hold across server processes).
CREATE TABLE agent_writes (
    agent_id    TEXT NOT NULL REFERENCES agents(id),
    turn_id     TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status      INTEGER,
    answer      TEXT,
    created_at  TEXT NOT NULL,
    PRIMARY KEY (agent_id, turn_id, key)
);
CREATE INDEX agent_writes_by_age ON agent_writes(created_at);
