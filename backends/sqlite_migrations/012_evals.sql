-- Evals (the Postgres V19 migration's tables): datasets, experiments and
-- the grade of each experiment cell. Times are nanoseconds since the epoch.
CREATE TABLE eval_datasets (
    tenant        TEXT NOT NULL,
    name          TEXT NOT NULL,
    version       INTEGER NOT NULL CHECK (version >= 1),
    content_hash  TEXT NOT NULL,
    case_count    INTEGER NOT NULL,
    cases         TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    PRIMARY KEY (tenant, name, version)
);
CREATE TABLE eval_experiments (
    id               TEXT PRIMARY KEY,
    tenant           TEXT NOT NULL,
    name             TEXT NOT NULL,
    idempotency_key  TEXT,
    request_hash     TEXT NOT NULL,
    spec             TEXT NOT NULL,
    batches          TEXT NOT NULL DEFAULT '[]',
    state            TEXT NOT NULL CHECK (state IN ('running', 'completed', 'cancelled')),
    created_at       INTEGER NOT NULL,
    finished_at      INTEGER,
    tended_by        TEXT,
    tended_until     INTEGER,
    UNIQUE (tenant, idempotency_key)
);
CREATE INDEX eval_experiments_running ON eval_experiments (id) WHERE state = 'running';
CREATE INDEX eval_experiments_tenant ON eval_experiments (tenant, id);
CREATE TABLE eval_grades (
    experiment_id  TEXT NOT NULL REFERENCES eval_experiments (id) ON DELETE CASCADE,
    version        TEXT NOT NULL,
    cell           TEXT NOT NULL,
    run_id         TEXT NOT NULL,
    grade          TEXT NOT NULL,
    graded_at      INTEGER NOT NULL,
    PRIMARY KEY (experiment_id, version, cell)
);
