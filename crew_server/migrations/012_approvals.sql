-- Approvals (issue 24): each agent's permission policy (the user's form of
-- `crew_common.permissions`, normalised, as JSON; agents from before it get the default,
-- `autonomous`: everything runs, as before), and the approval cards an `ask` rule puts
-- to the person, fenced to the turn that asked (one per turn and engine request id).
ALTER TABLE agents ADD COLUMN permission TEXT NOT NULL DEFAULT '{"preset":"autonomous","rules":[],"ask_timeout_s":600}';
CREATE TABLE approvals (
    id          TEXT PRIMARY KEY,
    turn_id     TEXT NOT NULL REFERENCES turns(id),
    request_id  TEXT NOT NULL,
    agent_id    TEXT NOT NULL REFERENCES agents(id),
    computer_id TEXT NOT NULL REFERENCES computers(id),
    room_id     TEXT NOT NULL REFERENCES rooms(id),
    message_id  TEXT,
    tool        TEXT NOT NULL,
    patterns    TEXT NOT NULL,
    always      TEXT NOT NULL,
    summary     TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('pending', 'allowed', 'denied', 'expired')),
    decision    TEXT CHECK (decision IN ('once', 'always', 'deny')),
    reason      TEXT,
    decided_by  TEXT,
    created_at  TEXT NOT NULL,
    expires_at  TEXT NOT NULL,
    decided_at  TEXT,
    UNIQUE (turn_id, request_id)
);
CREATE INDEX approvals_by_state ON approvals(state, expires_at);
CREATE INDEX approvals_by_message ON approvals(message_id);
CREATE INDEX approvals_by_room ON approvals(room_id, decided_at);
