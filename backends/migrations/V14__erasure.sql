-- Erasure and retention (issue 30). A finished run's content can be erased
-- (`RunLog::erase_run`: on request, `DELETE /v1/runs/{id}`, or by the
-- retention sweeper): its events are rewritten in place as tombstones
-- (glia_proto::erasure), keeping sequence numbers, kinds, times and spend;
-- blobs no other event references are deleted. The run records when and by
-- whom.
ALTER TABLE runs ADD COLUMN erased_at timestamptz, ADD COLUMN erased_by text;
-- The retention sweeper's scan: a tenant's finished runs not yet erased,
-- the longest finished first. By `ended_at`, which a run's commits write
-- once, not `updated_at`, which every commit changes: an index on it would
-- make every step's row update a non-HOT one.
CREATE INDEX runs_retention ON runs (tenant, ended_at) WHERE status = 'done' AND erased_at IS NULL;
-- Whether another event still references a blob an erasure leaves behind.
CREATE INDEX events_blob ON events (blob_hash) WHERE blob_hash IS NOT NULL;

-- Events stay append-only but for erasure. The statement trigger of V1
-- refuses every UPDATE, DELETE and TRUNCATE of events, except an UPDATE in
-- a transaction that set `glia.erasing` (`set_config('glia.erasing', 'on',
-- true)`, which only `erase_run` does); each row such an UPDATE touches
-- must then keep its run, seq, kind and time, and belong to a run already
-- marked erased.
CREATE OR REPLACE FUNCTION glia_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'events' AND TG_OP = 'UPDATE'
       AND current_setting('glia.erasing', true) = 'on' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'glia: % is append-only; % rejected', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$;

CREATE FUNCTION glia_erase_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.run_id, NEW.seq, NEW.kind, NEW.at, NEW.at_nanos) IS DISTINCT FROM (OLD.run_id, OLD.seq, OLD.kind, OLD.at, OLD.at_nanos) THEN
        RAISE EXCEPTION 'glia: erasure rewrites an event''s payload only'
            USING ERRCODE = 'restrict_violation';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM runs WHERE id = NEW.run_id AND erased_at IS NOT NULL) THEN
        RAISE EXCEPTION 'glia: only an erased run''s events are rewritten'
            USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER events_erasure_only BEFORE UPDATE ON events
    FOR EACH ROW EXECUTE FUNCTION glia_erase_event();
