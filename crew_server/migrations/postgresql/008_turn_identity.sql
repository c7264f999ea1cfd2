-- PostgreSQL twin of ../008_turn_identity.sql: the turn identity's hash on turns, the turn
-- of each agent message.
ALTER TABLE turns ADD COLUMN secret_hash TEXT COLLATE "C";
CREATE UNIQUE INDEX turns_by_secret ON turns(secret_hash);
ALTER TABLE messages ADD COLUMN turn_id TEXT COLLATE "C";
CREATE INDEX messages_by_turn ON messages(turn_id);
ALTER TABLE agents ADD COLUMN claims BIGINT NOT NULL DEFAULT 0;
ALTER TABLE turns ADD COLUMN claim_no BIGINT;
