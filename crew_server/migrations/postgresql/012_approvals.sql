-- PostgreSQL twin of ../012_approvals.sql: each agent's permission policy, the approvals.
ALTER TABLE agents ADD COLUMN permission TEXT COLLATE "C" NOT NULL DEFAULT '{"preset":"autonomous","rules":[],"ask_timeout_s":600}';
CREATE TABLE approvals (
    id          TEXT COLLATE "C" PRIMARY KEY,
    turn_id     TEXT COLLATE "C" NOT NULL REFERENCES turns(id),
    request_id  TEXT COLLATE "C" NOT NULL,
    agent_id    TEXT COLLATE "C" NOT NULL REFERENCES agents(id),
    computer_id TEXT COLLATE "C" NOT NULL REFERENCES computers(id),
    room_id     TEXT COLLATE "C" NOT NULL REFERENCES rooms(id),
    message_id  TEXT COLLATE "C",
    tool        TEXT COLLATE "C" NOT NULL,
    patterns    TEXT COLLATE "C" NOT NULL,
    always      TEXT COLLATE "C" NOT NULL,
    summary     TEXT COLLATE "C" NOT NULL,
    state       TEXT COLLATE "C" NOT NULL CHECK (state IN ('pending', 'allowed', 'denied', 'expired')),
    decision    TEXT COLLATE "C" CHECK (decision IN ('once', 'always', 'deny')),
    reason      TEXT COLLATE "C",
    decided_by  TEXT COLLATE "C",
    created_at  TEXT COLLATE "C" NOT NULL,
    expires_at  TEXT COLLATE "C" NOT NULL,
    decided_at  TEXT COLLATE "C",
    UNIQUE (turn_id, request_id)
);
CREATE INDEX approvals_by_state ON approvals(state, expires_at);
CREATE INDEX approvals_by_message ON approvals(message_id);
CREATE INDEX approvals_by_room ON approvals(room_id, decided_at);
