-- Issue 32, child runs (the Postgres V16 migration's columns): a child run's
-- parent, the parent's call that started it, and its depth (0 for a run a
-- client started). Written once at admission.
ALTER TABLE runs ADD COLUMN parent_run_id TEXT;
ALTER TABLE runs ADD COLUMN parent_call_id TEXT;
ALTER TABLE runs ADD COLUMN depth INTEGER NOT NULL DEFAULT 0 CHECK (depth >= 0);

CREATE INDEX runs_parent ON runs (parent_run_id, id) WHERE parent_run_id IS NOT NULL;
