-- Schedules (`glia_backends::schedules`): a tenant's recurring run starts.
-- The store keeps the definition as the dispatcher validated it (`spec`,
-- opaque JSON text) and the dispatcher's bookkeeping: the last nominal fire
-- time handled (`cursor_at`), when it must look next (`next_due_at`: the
-- next nominal fire time plus its jitter), the last run it started, a
-- buffered fire time (overlap policy `buffer_one`) and the last firing's
-- error. `revision` grows with every write: the dispatcher advances a
-- schedule by compare-and-set on it, so two dispatchers never both record
-- a firing (the run itself is keyed by schedule and nominal time).
CREATE TABLE schedules (
    id           uuid PRIMARY KEY,
    tenant       text NOT NULL,
    name         text NOT NULL,
    spec         text NOT NULL,
    paused       boolean NOT NULL DEFAULT false,
    cursor_at    timestamptz NOT NULL,
    next_due_at  timestamptz,
    last_run_id  uuid,
    buffered_at  timestamptz,
    last_error   text,
    revision     bigint NOT NULL DEFAULT 1,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    UNIQUE (tenant, name)
);

-- What the scheduler's tick reads: active schedules by due time, and those
-- holding a buffered fire time.
CREATE INDEX schedules_due ON schedules (next_due_at) WHERE NOT paused;
CREATE INDEX schedules_buffered ON schedules (id) WHERE buffered_at IS NOT NULL AND NOT paused;
