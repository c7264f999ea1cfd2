-- The room's status line (issue 25): the failed turn of an agent the person dismissed in
-- a room, so the line stays away after a reload until a newer failure. One row per user,
-- room and agent (the newest dismissal wins). No foreign keys: a deleted room, agent or
-- turn leaves a row that matches nothing, and never blocks the deletion.
-- Finding the room's turns needs no new index here: the running ones come from the
-- room's members through `turns_running_by_agent`, the recent ones through
-- `turns_by_agent` (whose entries end with the rowid the store orders ties by).
CREATE TABLE room_status_dismissals (
    user_id      TEXT NOT NULL,
    room_id      TEXT NOT NULL,
    agent_id     TEXT NOT NULL,
    turn_id      TEXT NOT NULL,
    dismissed_at TEXT NOT NULL,
    PRIMARY KEY (user_id, room_id, agent_id)
);
