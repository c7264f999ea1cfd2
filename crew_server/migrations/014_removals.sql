-- Deleting (issue 25). An agent or a Computer is deleted softly: their rows stay for the
-- turns and approvals that name them (history), but every list, token and claim skips
-- them. A deleted agent's handle is freed (it becomes `~<id>`, which no handle can be);
-- its name stays, so its messages in groups still say who wrote them. A deleted
-- Computer's token stops working at once. Rooms are deleted for good (store/removals.py).
ALTER TABLE agents ADD COLUMN deleted_at TEXT;
ALTER TABLE computers ADD COLUMN deleted_at TEXT;
