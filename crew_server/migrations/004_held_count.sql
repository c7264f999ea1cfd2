-- HELD is bounded (issue 10): how many replies of the agent in this room were held
-- since it last posted there or last claimed it; the third one is posted.
ALTER TABLE positions ADD COLUMN held_count INTEGER NOT NULL DEFAULT 0;
