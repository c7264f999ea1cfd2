-- The reference crew server's schema. Times are fixed-width RFC 3339 UTC text
-- (see crew_server.clock.iso), so text order is time order.

CREATE TABLE settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE computers (
    id           TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    token_hash   TEXT NOT NULL UNIQUE,
    epoch        INTEGER NOT NULL DEFAULT 0,
    hostname     TEXT,
    platform     TEXT,
    version      TEXT,
    capacity     INTEGER,
    models       TEXT NOT NULL DEFAULT '[]',
    connected_at TEXT,
    created_at   TEXT NOT NULL
);

CREATE TABLE agents (
    id          TEXT PRIMARY KEY,
    handle      TEXT NOT NULL UNIQUE,
    name        TEXT NOT NULL,
    persona     TEXT NOT NULL,
    engine      TEXT NOT NULL,
    model       TEXT NOT NULL,
    computer_id TEXT REFERENCES computers(id),
    problem     TEXT,
    created_at  TEXT NOT NULL
);
CREATE INDEX agents_by_computer ON agents(computer_id);

-- Agent tokens live until their Computer connects again (a newer epoch).
CREATE TABLE agent_tokens (
    token_hash  TEXT PRIMARY KEY,
    agent_id    TEXT NOT NULL REFERENCES agents(id),
    computer_id TEXT NOT NULL REFERENCES computers(id),
    epoch       INTEGER NOT NULL,
    created_at  TEXT NOT NULL
);
CREATE INDEX agent_tokens_by_computer ON agent_tokens(computer_id, epoch);

CREATE TABLE rooms (
    id              TEXT PRIMARY KEY,
    kind            TEXT NOT NULL CHECK (kind IN ('dm', 'group', 'thread')),
    title           TEXT,
    parent_room_id  TEXT REFERENCES rooms(id),
    root_message_id TEXT UNIQUE,
    last_seq        INTEGER NOT NULL DEFAULT 0,
    created_at      TEXT NOT NULL
);

-- Agent members of dm and group rooms (a thread's members are its group's).
CREATE TABLE room_members (
    room_id  TEXT NOT NULL REFERENCES rooms(id),
    agent_id TEXT NOT NULL REFERENCES agents(id),
    PRIMARY KEY (room_id, agent_id)
) WITHOUT ROWID;
CREATE INDEX room_members_by_agent ON room_members(agent_id);

-- Delivery and read positions. A row exists for every dm/group membership and
-- for every thread the agent follows (wrote the root, wrote in it, was mentioned).
CREATE TABLE positions (
    agent_id      TEXT NOT NULL REFERENCES agents(id),
    room_id       TEXT NOT NULL REFERENCES rooms(id),
    delivered_seq INTEGER NOT NULL DEFAULT 0,
    read_seq      INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (agent_id, room_id)
) WITHOUT ROWID;
CREATE INDEX positions_by_room ON positions(room_id);

CREATE TABLE messages (
    id             TEXT PRIMARY KEY,
    room_id        TEXT NOT NULL REFERENCES rooms(id),
    seq            INTEGER NOT NULL,
    author_kind    TEXT NOT NULL CHECK (author_kind IN ('user', 'agent', 'system')),
    author_id      TEXT NOT NULL,
    body           TEXT NOT NULL,
    kind           TEXT NOT NULL CHECK (kind IN ('normal', 'notice')),
    mentions       TEXT NOT NULL DEFAULT '[]',
    thread_id      TEXT,
    thread_replies INTEGER NOT NULL DEFAULT 0,
    thread_last_at TEXT,
    created_at     TEXT NOT NULL,
    UNIQUE (room_id, seq)
);

CREATE TABLE mutes (
    agent_id TEXT NOT NULL REFERENCES agents(id),
    room_id  TEXT NOT NULL REFERENCES rooms(id),
    until    TEXT,
    PRIMARY KEY (agent_id, room_id)
) WITHOUT ROWID;
CREATE INDEX mutes_by_room ON mutes(room_id);

CREATE TABLE tasks (
    number          INTEGER PRIMARY KEY AUTOINCREMENT,
    title           TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('todo', 'in_progress', 'in_review', 'done')),
    assignee_id     TEXT REFERENCES agents(id),
    room_id         TEXT NOT NULL REFERENCES rooms(id),
    host_message_id TEXT NOT NULL UNIQUE REFERENCES messages(id),
    thread_id       TEXT NOT NULL REFERENCES rooms(id),
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL
);
CREATE INDEX tasks_by_room ON tasks(room_id);
CREATE INDEX tasks_by_thread ON tasks(thread_id);

CREATE TABLE reminders (
    id          TEXT PRIMARY KEY,
    agent_id    TEXT NOT NULL REFERENCES agents(id),
    room_id     TEXT NOT NULL REFERENCES rooms(id),
    title       TEXT NOT NULL,
    next_at     TEXT NOT NULL,
    every       INTEGER,
    daily       TEXT,
    weekly_day  TEXT,
    weekly_time TEXT,
    tz          TEXT,
    created_at  TEXT NOT NULL
);
CREATE INDEX reminders_by_next ON reminders(next_at);
CREATE INDEX reminders_by_agent ON reminders(agent_id);

CREATE TABLE turns (
    id          TEXT PRIMARY KEY,
    agent_id    TEXT NOT NULL REFERENCES agents(id),
    computer_id TEXT NOT NULL REFERENCES computers(id),
    fence       INTEGER NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('running', 'succeeded', 'failed', 'cancelled', 'interrupted')),
    failure     TEXT,
    rooms       TEXT NOT NULL,
    input       TEXT NOT NULL,
    engine      TEXT NOT NULL,
    model       TEXT NOT NULL,
    session_id  TEXT,
    usage       TEXT,
    next_index  INTEGER NOT NULL DEFAULT 0,
    gaps        TEXT NOT NULL DEFAULT '[]',
    started_at  TEXT NOT NULL,
    finished_at TEXT
);
CREATE INDEX turns_by_agent ON turns(agent_id, started_at);
CREATE INDEX turns_running ON turns(computer_id, status);

CREATE TABLE turn_events (
    turn_id TEXT NOT NULL REFERENCES turns(id),
    idx     INTEGER NOT NULL,
    type    TEXT NOT NULL,
    at      TEXT NOT NULL,
    data    TEXT NOT NULL,
    PRIMARY KEY (turn_id, idx)
) WITHOUT ROWID;

-- The bounded log of SSE events per Computer, replayed after Last-Event-ID.
CREATE TABLE computer_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    computer_id TEXT NOT NULL,
    event       TEXT NOT NULL,
    data        TEXT NOT NULL,
    created_at  TEXT NOT NULL
);
CREATE INDEX computer_events_by_computer ON computer_events(computer_id, id);
