-- Twin of ../005_turn_time_limit.sql.
ALTER TABLE agents ADD COLUMN turn_time_limit_s BIGINT;
