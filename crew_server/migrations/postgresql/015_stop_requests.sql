-- Twin of ../015_stop_requests.sql.
ALTER TABLE turns ADD COLUMN stop_requested_at TEXT COLLATE "C";
