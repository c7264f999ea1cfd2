-- Idempotency keys of agent writes (`Idempotency-Key` from `crew`): a retried or late
-- request with the same key gets the first answer. Scoped to the agent and to the turn
-- the write belongs to (the agent's latest turn when the server first took it); kept
-- 48 h (crew_server.store.writes.KEEP). `status` NULL: done, its answer not stored yet.
CREATE TABLE agent_writes (
    agent_id    TEXT NOT NULL REFERENCES agents(id),
    turn_id     TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status      INTEGER,
    answer      TEXT,
    created_at  TEXT NOT NULL,
    PRIMARY KEY (agent_id, turn_id, key)
) WITHOUT ROWID;
CREATE INDEX agent_writes_by_age ON agent_writes(created_at);
