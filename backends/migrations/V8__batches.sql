-- Batches as first-class objects (issue 12). V1 created `batches` as a bare
-- grouping of runs (a client's batch id, created on first use by
-- `POST /v1/runs`); a batch submitted through `POST /v1/batches` is
-- `managed`: it carries its run configuration, its options and its items,
-- and the dispatcher's admission loop turns items into runs progressively.

ALTER TABLE batches
    ADD COLUMN managed          boolean NOT NULL DEFAULT false,
    ADD COLUMN idempotency_key  text,
    -- SHA-256 (hex) of the submitted request: an idempotent repeat must match it.
    ADD COLUMN request_hash     text,
    -- The submission without its items (serde_json of `BatchSpec`; text, not
    -- jsonb, so a config carrying U+0000 round-trips).
    ADD COLUMN spec             text,
    ADD COLUMN state            text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'paused', 'cancelled')),
    ADD COLUMN max_in_flight    integer CHECK (max_in_flight >= 1),
    ADD COLUMN cap_tokens       bigint CHECK (cap_tokens >= 0),
    ADD COLUMN cap_usd_micros   bigint CHECK (cap_usd_micros >= 0),
    -- Items not admitted by then expire.
    ADD COLUMN expires_at       timestamptz,
    ADD COLUMN items_total      integer NOT NULL DEFAULT 0,
    ADD COLUMN updated_at       timestamptz NOT NULL DEFAULT now();
CREATE UNIQUE INDEX batches_idempotency ON batches (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX batches_managed ON batches (tenant, id) WHERE managed;
CREATE INDEX batches_active ON batches (id) WHERE managed AND state = 'active';

-- One row per item, in submission order (`n`, from 0). `state`:
--   queued     waiting for admission
--   admitting  claimed by an admission pass at `claimed_at` (a pass that died
--              leaves it; it is claimed again after the claim lapses, and the
--              run's idempotency key `glia-batch:{batch}:{custom_id}` finds the
--              run the dead pass may already have created)
--   running    its run exists and is not done
--   finished   its run is done (usage folded into tokens / cost_usd_micros),
--              or it was refused at admission (`error`, no run)
--   expired    the completion window closed before it was admitted
--   cancelled  the batch was cancelled before it was admitted
CREATE TABLE batch_items (
    batch_id         uuid NOT NULL REFERENCES batches (id),
    n                integer NOT NULL CHECK (n >= 0),
    custom_id        text NOT NULL,
    goal             text NOT NULL,
    -- serde_json of the item's metadata object, echoed in results.
    metadata         text,
    state            text NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'admitting', 'running', 'finished', 'expired', 'cancelled')),
    run_id           uuid REFERENCES runs (id),
    claimed_at       timestamptz,
    error            text,
    tokens           bigint,
    cost_usd_micros  bigint,
    PRIMARY KEY (batch_id, n),
    UNIQUE (batch_id, custom_id)
);
CREATE INDEX batch_items_open ON batch_items (batch_id, n) WHERE state IN ('queued', 'admitting');
CREATE INDEX batch_items_running ON batch_items (batch_id) WHERE state = 'running';
