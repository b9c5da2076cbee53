-- Issue 31, replay evals: an item's recorded tools (as V20 on Postgres).
ALTER TABLE batch_items ADD COLUMN recorded_tools TEXT;
