-- Issue 32, child runs: the children loop looks for children not done whose
-- parent is done (`RunLog::stranded_children`) every 5 s on every
-- dispatcher; this index holds only live children, so the look costs what
-- is running, not every child ever started. `parent_run_id` never changes
-- and `status` is already in `runs_live`'s predicate: commits stay as HOT
-- as before.
CREATE INDEX runs_live_children ON runs (parent_run_id)
    WHERE parent_run_id IS NOT NULL AND status <> 'done';
