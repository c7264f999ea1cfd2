-- Budgets per agent (issue 24): the caps as the user set them (`crew_server.budgets`,
-- normalised JSON; NULL: no budget), the "resume once" the user granted (turns the claim
-- may still hand out over a reached cap), and when a held agent's period ends (the
-- scheduler wakes it then). The notices of each cap, period and level are posted once.
ALTER TABLE agents ADD COLUMN budget TEXT;
ALTER TABLE agents ADD COLUMN budget_extra_turns INTEGER NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN budget_held_until TEXT;
CREATE TABLE budget_notices (
    agent_id  TEXT NOT NULL REFERENCES agents(id),
    cap       TEXT NOT NULL,
    period    TEXT NOT NULL,
    level     INTEGER NOT NULL,
    posted_at TEXT NOT NULL,
    PRIMARY KEY (agent_id, cap, period, level)
);
