-- Durable timers and event waits (issue 32, docs/waits.md).
--
-- What is due is derived from the run row a commit writes anyway: its pull
-- point. A run parked at `awaiting_timer` is due at `wake_at_ms`, one at
-- `awaiting_event` at `timeout_at_ms`, and waits for the event keys in
-- `keys`. The indexes below read only `status` and `pull_point`: a step
-- that keeps both (the common one: runnable, no pull point) is still a HOT
-- update; parking changes the status, which was never HOT.
CREATE INDEX runs_wake_at ON runs (((pull_point->>'wake_at_ms')::bigint))
    WHERE status = 'parked' AND (pull_point->>'kind') = 'awaiting_timer';
CREATE INDEX runs_wait_timeout ON runs (((pull_point->>'timeout_at_ms')::bigint))
    WHERE status = 'parked' AND (pull_point->>'kind') = 'awaiting_event';

-- The event keys an `awaiting_event` pull point waits for, as an array.
CREATE FUNCTION glia_wait_keys(pull_point json) RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT coalesce(array_agg(k), '{}') FROM json_array_elements_text(
              CASE WHEN pull_point->>'kind' = 'awaiting_event' THEN pull_point->'keys' ELSE '[]'::json END) AS k $$;
CREATE INDEX runs_wait_keys ON runs USING gin (glia_wait_keys(pull_point))
    WHERE status = 'parked' AND (pull_point->>'kind') = 'awaiting_event';

-- Events posted to `POST /v1/events`, kept for the retention (default 15
-- minutes) so a wait that begins after its event arrived still gets it.
-- Content (the payload); forgotten by the waits loop after the retention.
CREATE TABLE wait_events (
    tenant          text   NOT NULL,
    id              uuid   NOT NULL,
    key             text   NOT NULL,
    payload         jsonb  NOT NULL,
    received_at_ms  bigint NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX wait_events_received ON wait_events (received_at_ms);
