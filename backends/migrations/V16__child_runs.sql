-- Issue 32, child runs (docs/child-runs.md): a run started by a parent's
-- call of an agent tool names its parent and that call, and its depth (0
-- for a run a client started). Written once at admission, never updated
-- (so commits stay HOT). `GET /v1/runs?parent=ID` lists a run's children;
-- the dispatcher's children loop finds parents waiting for children.
--
-- Every ADD COLUMN has a constant default or none: no table rewrite.
ALTER TABLE runs
    ADD COLUMN parent_run_id  uuid,
    ADD COLUMN parent_call_id text,
    ADD COLUMN depth          integer NOT NULL DEFAULT 0 CHECK (depth >= 0);

CREATE INDEX runs_parent ON runs (parent_run_id, id) WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_awaiting_children ON runs (id)
    WHERE status = 'parked' AND pull_point->>'kind' = 'awaiting_children';
