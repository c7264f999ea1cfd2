-- When a person asked to stop this running turn (NULL: nobody did). The turn's
-- `cancelled` finish then leaves a notice in its rooms ("@ada stopped: you asked").
ALTER TABLE turns ADD COLUMN stop_requested_at TEXT;
