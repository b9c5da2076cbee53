-- Issue 32, child runs (the Postgres V18 migration's index): live children
-- only, for the children loop's look for children of done parents
-- (`RunLog::stranded_children`) every 5 s.
CREATE INDEX runs_live_children ON runs (parent_run_id)
    WHERE parent_run_id IS NOT NULL AND status <> 'done';
