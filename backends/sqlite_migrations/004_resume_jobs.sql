-- Resumes first: a job that resumes a parked run (a payload waits in its
-- inbox) is handed out before jobs that start runs. Rows written before
-- this migration are starts.
ALTER TABLE outbox ADD COLUMN resume INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN resume INTEGER NOT NULL DEFAULT 0;
