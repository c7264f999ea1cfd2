-- Set when an unread claim was cut at its size bound: the ack of that turn wakes the
-- agent again, so the rest is claimed by the next turn.
ALTER TABLE agents ADD COLUMN claim_more INTEGER NOT NULL DEFAULT 0;
