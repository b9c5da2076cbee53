-- Durable timers and event waits (issue 32; the Postgres V15 migration's
-- indexes and table). Due times and event keys are read from the run rows'
-- pull points (JSON text); kept events wait in `wait_events` for the
-- retention (docs/waits.md).
CREATE INDEX runs_wake_at ON runs (json_extract(pull_point, '$.wake_at_ms'))
    WHERE status = 'parked' AND json_extract(pull_point, '$.kind') = 'awaiting_timer';
CREATE INDEX runs_wait_timeout ON runs (json_extract(pull_point, '$.timeout_at_ms'))
    WHERE status = 'parked' AND json_extract(pull_point, '$.kind') = 'awaiting_event';
CREATE INDEX runs_event_waiters ON runs (tenant)
    WHERE status = 'parked' AND json_extract(pull_point, '$.kind') = 'awaiting_event';

CREATE TABLE wait_events (
    tenant          TEXT    NOT NULL,
    id              TEXT    NOT NULL,
    key             TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    received_at_ms  INTEGER NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX wait_events_received ON wait_events (received_at_ms);
