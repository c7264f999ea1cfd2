-- Twin of ../016_turn_trace.sql.
ALTER TABLE turns ADD COLUMN trace TEXT;
