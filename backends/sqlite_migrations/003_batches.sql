-- glia single node (SQLite), schema version 3: batches as first-class
-- objects, as Postgres's V8__batches.sql (see there and
-- backends/src/batches.rs for the item states). 001 created `batches` as a
-- bare grouping of runs; a batch submitted through `POST /v1/batches` is
-- `managed` (1) once its upload is complete.
--
-- One difference: the writer cannot hold a transaction open across an
-- upload's chunks, so an upload writes its rows with `state = 'uploading'`
-- and `managed = 0` (invisible to every read of batches), and its last
-- write makes it `managed` and `active`. An upload refused or cut off is
-- deleted; one left by a process that died is deleted when the file is next
-- opened. The idempotency key is unique among managed batches only, so an
-- abandoned upload never holds a key.

ALTER TABLE batches ADD COLUMN managed INTEGER NOT NULL DEFAULT 0 CHECK (managed IN (0, 1));
ALTER TABLE batches ADD COLUMN idempotency_key TEXT;
-- SHA-256 (hex) of the submitted request: an idempotent repeat must match it.
ALTER TABLE batches ADD COLUMN request_hash TEXT;
-- The submission without its items (serde_json of the dispatcher's `BatchSpec`).
ALTER TABLE batches ADD COLUMN spec TEXT;
ALTER TABLE batches ADD COLUMN state TEXT NOT NULL DEFAULT 'active' CHECK (state IN ('uploading', 'active', 'paused', 'cancelled'));
ALTER TABLE batches ADD COLUMN max_in_flight INTEGER CHECK (max_in_flight >= 1);
ALTER TABLE batches ADD COLUMN cap_tokens INTEGER CHECK (cap_tokens >= 0);
ALTER TABLE batches ADD COLUMN cap_usd_micros INTEGER CHECK (cap_usd_micros >= 0);
-- Nanoseconds since the epoch; items not admitted by then expire.
ALTER TABLE batches ADD COLUMN expires_at INTEGER;
ALTER TABLE batches ADD COLUMN items_total INTEGER NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN updated_at INTEGER NOT NULL DEFAULT 0;
CREATE UNIQUE INDEX batches_idempotency ON batches (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL AND managed = 1;
CREATE INDEX batches_managed ON batches (tenant, id) WHERE managed = 1;

-- One row per item, in submission order (`n`, from 0); states as in V8,
-- `config` as in V9.
-- `claimed_at` in nanoseconds.
CREATE TABLE batch_items (
    batch_id         TEXT NOT NULL REFERENCES batches (id),
    n                INTEGER NOT NULL CHECK (n >= 0),
    custom_id        TEXT NOT NULL,
    goal             TEXT NOT NULL,
    metadata         TEXT,
    config           TEXT,
    state            TEXT NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'admitting', 'running', 'finished', 'expired', 'cancelled')),
    run_id           TEXT REFERENCES runs (id),
    claimed_at       INTEGER,
    error            TEXT,
    tokens           INTEGER,
    cost_usd_micros  INTEGER,
    PRIMARY KEY (batch_id, n),
    UNIQUE (batch_id, custom_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX batch_items_open ON batch_items (batch_id, n) WHERE state IN ('queued', 'admitting');
CREATE INDEX batch_items_state ON batch_items (state, batch_id);
