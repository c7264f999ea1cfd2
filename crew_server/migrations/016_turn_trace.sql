-- Where the time of a turn went (issue 26): a JSON object of step → epoch milliseconds.
-- The Computer sends its steps with the finish (post, wake, claimed, registered,
-- server_ready, prompt_sent, engine_accepted, first_token, acked); the server adds the time its
-- first `crew reply` of the turn arrived (reply_received) and was written
-- (reply_stored). NULL: a turn of an older Computer, or one that sent no trace.
ALTER TABLE turns ADD COLUMN trace TEXT;
