-- How far the user has read each room (the web app's unread counts). No row: nothing read.
CREATE TABLE user_reads (
    room_id  TEXT PRIMARY KEY REFERENCES rooms(id),
    read_seq INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
