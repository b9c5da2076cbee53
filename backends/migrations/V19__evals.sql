-- Evals (`glia_backends::evals`, issue 31): datasets, experiments and the
-- grade of each experiment cell.
--
-- A dataset version is immutable: `cases` is the canonical JSON Lines text
-- of its cases (`glia_evals::dataset::to_jsonl`), `content_hash` its
-- SHA-256; a new upload of a name is the next version, unless it is the
-- latest version's content again.
CREATE TABLE eval_datasets (
    tenant        text NOT NULL,
    name          text NOT NULL,
    version       integer NOT NULL CHECK (version >= 1),
    content_hash  text NOT NULL,
    case_count    integer NOT NULL,
    cases         text NOT NULL,
    created_at    timestamptz NOT NULL,
    PRIMARY KEY (tenant, name, version)
);

-- An experiment: the eval spec as the dispatcher validated it (`spec`,
-- opaque JSON text), the batch of each agent version (`batches`, a JSON
-- array of ids in the spec's order; empty until they are submitted), its
-- state and which dispatcher tends it. `(tenant, idempotency_key)` makes a repeated submit answer the
-- first experiment.
CREATE TABLE eval_experiments (
    id               uuid PRIMARY KEY,
    tenant           text NOT NULL,
    name             text NOT NULL,
    idempotency_key  text,
    request_hash     text NOT NULL,
    spec             text NOT NULL,
    batches          text NOT NULL DEFAULT '[]',
    state            text NOT NULL CHECK (state IN ('running', 'completed', 'cancelled')),
    created_at       timestamptz NOT NULL,
    finished_at      timestamptz,
    -- The dispatcher tending it (posting scripted turns, deciding
    -- approvals, grading) and until when; another takes over after.
    tended_by        uuid,
    tended_until     timestamptz,
    UNIQUE (tenant, idempotency_key)
);
CREATE INDEX eval_experiments_running ON eval_experiments (id) WHERE state = 'running';
CREATE INDEX eval_experiments_tenant ON eval_experiments (tenant, id);

-- A cell's grade, written once: the first grade of a cell wins, so a
-- grader that costs money (a judge) is never paid for twice.
CREATE TABLE eval_grades (
    experiment_id  uuid NOT NULL REFERENCES eval_experiments (id) ON DELETE CASCADE,
    version        text NOT NULL,
    cell           text NOT NULL,
    run_id         uuid NOT NULL,
    grade          text NOT NULL,
    graded_at      timestamptz NOT NULL,
    PRIMARY KEY (experiment_id, version, cell)
);
