-- Erasure and retention (issue 30), as Postgres's V14__erasure.sql: a
-- finished run's content can be erased (`RunLog::erase_run`): its events
-- are rewritten in place as tombstones (glia_proto::erasure), keeping
-- sequence numbers, kinds, times and spend. The run records when and by
-- whom (`erased_at` in nanoseconds, `erased_by`).
ALTER TABLE runs ADD COLUMN erased_at INTEGER;
ALTER TABLE runs ADD COLUMN erased_by TEXT;
-- The retention sweeper's scan: a tenant's finished runs not yet erased,
-- oldest last commit first.
CREATE INDEX runs_retention ON runs (tenant, ended_at) WHERE status = 'done' AND erased_at IS NULL;

-- Events stay append-only but for erasure: an UPDATE is refused unless it
-- runs inside `erase_run`'s transaction (which lists the run in `erasing`
-- for its duration, as Postgres's `glia.erasing` setting), the run is
-- marked erased, and it keeps the event's run, seq, kind and time. DELETE
-- stays refused (001).
CREATE TABLE erasing (
    run_id  TEXT PRIMARY KEY
) STRICT;
DROP TRIGGER events_no_update;
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
WHEN NEW.run_id IS NOT OLD.run_id OR NEW.seq IS NOT OLD.seq OR NEW.kind IS NOT OLD.kind OR NEW.at IS NOT OLD.at
  OR NOT EXISTS (SELECT 1 FROM erasing WHERE run_id = OLD.run_id)
  OR NOT EXISTS (SELECT 1 FROM runs WHERE id = OLD.run_id AND erased_at IS NOT NULL)
BEGIN SELECT RAISE(ABORT, 'glia: events is append-only; UPDATE rejected (only erasure rewrites an erased run''s payloads)'); END;
