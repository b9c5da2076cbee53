-- The worker that last held a run's lease, kept when the lease is let go:
-- a payload posted to the parked run notifies that worker directly
-- (`NOTIFY` on its hint channel), ahead of the queued job.
ALTER TABLE runs ADD COLUMN last_owner text;
