-- glia event log, schema version 1. Applied by `PgLog::connect` (refinery,
-- embedded) under an advisory lock, so processes starting together do not race.
--
-- Conventions: times are `timestamptz` from the database clock (`now()`);
-- sequences are `bigint` (Rust u64 below 2^63); JSON that must round-trip
-- exactly and may contain U+0000 (which `jsonb` and `text` reject) has a
-- `bytea` fallback column or goes to `blobs`.

-- A batch of runs admitted together; owned by one tenant.
CREATE TABLE batches (
    id          uuid PRIMARY KEY,
    tenant      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per run: identity, a summary of its state (written by every
-- commit from the caller's state), its head sequence and its lease.
CREATE TABLE runs (
    id               uuid PRIMARY KEY,
    tenant           text NOT NULL,
    idempotency_key  text,
    batch_id         uuid REFERENCES batches (id),
    goal             text NOT NULL,
    status           text NOT NULL CHECK (status IN ('runnable', 'parked', 'done')),
    phase            text NOT NULL,
    pull_point       json,
    outcome          json,
    head_seq         bigint NOT NULL CHECK (head_seq >= 1),
    lease_owner      text,
    lease_token      uuid,
    lease_expires_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CHECK ((lease_token IS NULL) = (lease_expires_at IS NULL))
) WITH (fillfactor = 80); -- room for HOT updates: commits and leases rewrite unindexed columns
CREATE UNIQUE INDEX runs_idempotency ON runs (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX runs_tenant ON runs (tenant, id);
CREATE INDEX runs_batch ON runs (batch_id, id) WHERE batch_id IS NOT NULL;
CREATE INDEX runs_status ON runs (status, id);
-- The reconciler's scan (`orphaned`): runs that are not done.
CREATE INDEX runs_live ON runs (id) WHERE status <> 'done';

-- Large or NUL-carrying event payloads: the serialised JSON, by SHA-256 (hex).
CREATE TABLE blobs (
    hash        text PRIMARY KEY CHECK (hash ~ '^[0-9a-f]{64}$'),
    bytes       bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The log. `payload` is serde_json of `EventKind` (`{"type": …, "data": …}`),
-- or NULL when the payload is in `blobs`. `at` is the event's time truncated
-- to the microsecond; `at_nanos` the nanoseconds below it, so `at` round-trips.
CREATE TABLE events (
    run_id     uuid NOT NULL REFERENCES runs (id),
    seq        bigint NOT NULL CHECK (seq >= 1),
    kind       text NOT NULL,
    at         timestamptz NOT NULL,
    at_nanos   integer NOT NULL DEFAULT 0 CHECK (at_nanos BETWEEN 0 AND 999),
    payload    jsonb,
    blob_hash  text REFERENCES blobs (hash),
    PRIMARY KEY (run_id, seq),
    CHECK ((payload IS NULL) <> (blob_hash IS NULL))
);

-- Append-only, enforced by the database: any UPDATE, DELETE or TRUNCATE of
-- events (and any UPDATE of blobs, which hold event payloads) is rejected.
CREATE FUNCTION glia_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'glia: % is append-only; % rejected', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$;
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION glia_append_only();
CREATE TRIGGER blobs_immutable BEFORE UPDATE ON blobs
    FOR EACH STATEMENT EXECUTE FUNCTION glia_append_only();

-- The run's state after event `seq` (serde_json of `RunState`), derived from
-- the log. Written every N events; only the latest is kept.
CREATE TABLE checkpoints (
    run_id      uuid NOT NULL REFERENCES runs (id),
    seq         bigint NOT NULL CHECK (seq >= 1),
    state       jsonb,
    state_raw   bytea,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq),
    CHECK ((state IS NULL) <> (state_raw IS NULL))
);

-- Tool calls waiting for (or past) a person's decision, from
-- `approval.requested` events; decided by a posted decision or
-- `approval.resolved`.
CREATE TABLE approvals (
    id            bigserial PRIMARY KEY,
    run_id        uuid NOT NULL REFERENCES runs (id),
    tenant        text NOT NULL,
    call_id       text NOT NULL,
    tool          text NOT NULL,
    input         json NOT NULL,
    args_hash     text NOT NULL,
    status        text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'decided')),
    requested_at  timestamptz NOT NULL,
    decided_at    timestamptz
);
CREATE INDEX approvals_run ON approvals (run_id, call_id);
CREATE INDEX approvals_pending ON approvals (requested_at, id) WHERE status = 'pending';
CREATE INDEX approvals_tenant ON approvals (tenant, requested_at, id);

-- Payloads posted to parked runs (serde_json of `Resume`). A dedupe key is
-- accepted once per run.
CREATE TABLE inbox (
    id           bigserial PRIMARY KEY,
    run_id       uuid NOT NULL REFERENCES runs (id),
    dedupe_key   text,
    payload      jsonb,
    payload_raw  bytea,
    consumed     boolean NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CHECK ((payload IS NULL) <> (payload_raw IS NULL))
);
CREATE UNIQUE INDEX inbox_dedupe ON inbox (run_id, dedupe_key) WHERE dedupe_key IS NOT NULL;
CREATE INDEX inbox_pending ON inbox (run_id, id) WHERE NOT consumed;

-- Jobs written in the same transaction as what causes them; the relay
-- publishes and deletes them.
CREATE TABLE outbox (
    id          bigserial PRIMARY KEY,
    job         json NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
