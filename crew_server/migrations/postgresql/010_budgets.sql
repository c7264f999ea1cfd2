-- PostgreSQL twin of ../010_budgets.sql: each agent's budget, its "resume once" and the end
-- of its hold; the notices posted per cap, period and level.
ALTER TABLE agents ADD COLUMN budget TEXT COLLATE "C";
ALTER TABLE agents ADD COLUMN budget_extra_turns BIGINT NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN budget_held_until TEXT COLLATE "C";
CREATE TABLE budget_notices (
    agent_id  TEXT COLLATE "C" NOT NULL REFERENCES agents(id),
    cap       TEXT COLLATE "C" NOT NULL,
    period    TEXT COLLATE "C" NOT NULL,
    level     BIGINT NOT NULL,
    posted_at TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (agent_id, cap, period, level)
);
