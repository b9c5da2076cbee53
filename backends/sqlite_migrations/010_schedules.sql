-- Schedules (the Postgres V17 migration's table): a tenant's recurring run
-- starts and the dispatcher's bookkeeping. Times are nanoseconds since the
-- epoch; `paused` is 0 or 1.
CREATE TABLE schedules (
    id           TEXT PRIMARY KEY,
    tenant       TEXT NOT NULL,
    name         TEXT NOT NULL,
    spec         TEXT NOT NULL,
    paused       INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    cursor_at    INTEGER NOT NULL,
    next_due_at  INTEGER,
    last_run_id  TEXT,
    buffered_at  INTEGER,
    last_error   TEXT,
    revision     INTEGER NOT NULL DEFAULT 1,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    UNIQUE (tenant, name)
);
CREATE INDEX schedules_due ON schedules (next_due_at) WHERE paused = 0;
CREATE INDEX schedules_buffered ON schedules (id) WHERE buffered_at IS NOT NULL AND paused = 0;
