-- The turn identity (issue 22): the Computer gets a secret for each turn it registers and
-- hands it to that turn's `crew`, which sends it with each write (`Crew-Turn`); only its
-- sha256 is kept. Each agent message records the turn it belongs to, so a failed,
-- interrupted or late turn acknowledges exactly the rooms it answered.
ALTER TABLE turns ADD COLUMN secret_hash TEXT;
CREATE UNIQUE INDEX turns_by_secret ON turns(secret_hash);
ALTER TABLE messages ADD COLUMN turn_id TEXT;
CREATE INDEX messages_by_turn ON messages(turn_id);
-- Unread claims of each agent, and the count a turn was registered with: a write of a turn
-- that is over is refused once the agent claimed again (a newer turn has its messages).
ALTER TABLE agents ADD COLUMN claims INTEGER NOT NULL DEFAULT 0;
ALTER TABLE turns ADD COLUMN claim_no INTEGER;
