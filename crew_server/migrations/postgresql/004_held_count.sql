-- Twin of ../004_held_count.sql.
ALTER TABLE positions ADD COLUMN held_count BIGINT NOT NULL DEFAULT 0;
