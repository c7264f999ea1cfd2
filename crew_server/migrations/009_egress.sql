-- The egress policy of each agent (issue 23): the user's form of `crew_common.egress`,
-- normalised, as JSON; agents from before it get the default, `public`. And what the
-- Computer's model gateway counted over each turn, next to the engine's `usage`.
ALTER TABLE agents ADD COLUMN egress TEXT NOT NULL DEFAULT '{"mode":"public","allow":[]}';
ALTER TABLE turns ADD COLUMN gateway_usage TEXT;
