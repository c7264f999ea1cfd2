-- PostgreSQL twin of ../006_user_reads.sql (for the PostgreSQL backend): how far the
-- user has read each room (the web app's unread counts). No row: nothing read.
CREATE TABLE user_reads (
    room_id  TEXT PRIMARY KEY REFERENCES rooms(id),
    read_seq BIGINT NOT NULL DEFAULT 0
);
