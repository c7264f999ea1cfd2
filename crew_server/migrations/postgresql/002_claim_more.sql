-- Twin of ../002_claim_more.sql.
ALTER TABLE agents ADD COLUMN claim_more BIGINT NOT NULL DEFAULT 0;
