-- glia single node (SQLite), schema version 1. Applied by `SqliteLog::open`
-- (rusqlite_migration, tracked in `PRAGMA user_version`) on the writer
-- connection, in one transaction.
--
-- The same tables as the Postgres schema (backends/migrations/V1__init.sql)
-- plus the job queue and the ledger, which the fleet keeps in RabbitMQ and
-- Redis. Conventions: ids are UUIDs as lowercase hyphenated text (UUIDv7
-- text sorts in creation order); times are INTEGER nanoseconds since the
-- Unix epoch (UTC), so event times round-trip exactly; JSON is serde_json
-- text (which escapes U+0000, so no byte fallback is needed); sequences and
-- amounts are INTEGER (i64).

CREATE TABLE batches (
    id          TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    created_at  INTEGER NOT NULL
) STRICT;

CREATE TABLE runs (
    id               TEXT PRIMARY KEY,
    tenant           TEXT NOT NULL,
    idempotency_key  TEXT,
    batch_id         TEXT REFERENCES batches (id),
    goal             TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('runnable', 'parked', 'done')),
    phase            TEXT NOT NULL,
    pull_point       TEXT,
    outcome          TEXT,
    head_seq         INTEGER NOT NULL CHECK (head_seq >= 1),
    lease_owner      TEXT,
    lease_token      TEXT,
    lease_expires_at INTEGER,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    CHECK ((lease_token IS NULL) = (lease_expires_at IS NULL))
) STRICT;
CREATE UNIQUE INDEX runs_idempotency ON runs (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX runs_tenant ON runs (tenant, id);
CREATE INDEX runs_batch ON runs (batch_id, id) WHERE batch_id IS NOT NULL;
CREATE INDEX runs_status ON runs (status, id);

-- The log: serde_json of `EventKind` per event.
CREATE TABLE events (
    run_id   TEXT NOT NULL REFERENCES runs (id),
    seq      INTEGER NOT NULL CHECK (seq >= 1),
    kind     TEXT NOT NULL,
    at       INTEGER NOT NULL,
    payload  TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
) STRICT, WITHOUT ROWID;

-- Append-only, enforced by the database.
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'glia: events is append-only; UPDATE rejected'); END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'glia: events is append-only; DELETE rejected'); END;

-- The run's state after event `seq` (serde_json of `RunState`); only the
-- latest is kept.
CREATE TABLE checkpoints (
    run_id  TEXT NOT NULL REFERENCES runs (id),
    seq     INTEGER NOT NULL CHECK (seq >= 1),
    state   TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
) STRICT;

CREATE TABLE approvals (
    id            INTEGER PRIMARY KEY,
    run_id        TEXT NOT NULL REFERENCES runs (id),
    tenant        TEXT NOT NULL,
    call_id       TEXT NOT NULL,
    tool          TEXT NOT NULL,
    input         TEXT NOT NULL,
    args_hash     TEXT NOT NULL,
    status        TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'decided')),
    requested_at  INTEGER NOT NULL,
    expires_at    INTEGER,
    escalated     INTEGER NOT NULL DEFAULT 0,
    interrupted   INTEGER NOT NULL DEFAULT 0,
    decided_at    INTEGER
) STRICT;
CREATE INDEX approvals_run ON approvals (run_id, call_id);
CREATE INDEX approvals_pending ON approvals (requested_at, id) WHERE status = 'pending';
CREATE INDEX approvals_tenant ON approvals (tenant, requested_at, id);

-- Payloads posted to parked runs (serde_json of `Resume`); ids never reused.
CREATE TABLE inbox (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT NOT NULL REFERENCES runs (id),
    dedupe_key  TEXT,
    payload     TEXT NOT NULL,
    consumed    INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL
) STRICT;
CREATE UNIQUE INDEX inbox_dedupe ON inbox (run_id, dedupe_key) WHERE dedupe_key IS NOT NULL;
CREATE INDEX inbox_pending ON inbox (run_id, id) WHERE consumed = 0;

-- Jobs written with what causes them; the relay moves them to `jobs`.
CREATE TABLE outbox (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT NOT NULL,
    head_seq    INTEGER NOT NULL,
    created_at  INTEGER NOT NULL
) STRICT;

-- The job queue (`SqliteQueue`): jobs not yet acknowledged, oldest first.
-- Which are handed out is kept in process (one process per file): at open,
-- every job not dead-lettered is ready again.
CREATE TABLE jobs (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id       TEXT NOT NULL,
    head_seq     INTEGER NOT NULL,
    enqueued_at  INTEGER NOT NULL,
    dead         INTEGER NOT NULL DEFAULT 0
) STRICT;

-- The ledger (`SqliteLedger`): cancellation flags and budget counters.
CREATE TABLE cancels (
    run_id  TEXT PRIMARY KEY,
    at      INTEGER NOT NULL
) STRICT;

CREATE TABLE budgets (
    scope            TEXT PRIMARY KEY,
    tokens           INTEGER NOT NULL,
    cost_usd_micros  INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL
) STRICT;

-- Request ids a counter has seen: the amount still reserved, or NULL once
-- settled. Deleted with their counter.
CREATE TABLE budget_requests (
    scope            TEXT NOT NULL REFERENCES budgets (scope) ON DELETE CASCADE,
    request_id       TEXT NOT NULL,
    reserved_tokens  INTEGER,
    reserved_cost    INTEGER,
    PRIMARY KEY (scope, request_id)
) STRICT;
