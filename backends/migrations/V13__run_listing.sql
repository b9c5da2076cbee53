-- What the console, the CLI and `GET /v1/runs` show and filter runs by:
-- what a run was submitted with (agent, tags, metadata, a batch item's
-- custom_id; written once at admission) and what it has consumed and how it
-- ended (usage, steps, error, ended_at; written by every commit from the
-- run's state, `RunSummary::updated`).
--
-- Commits rewrite the run row (`FENCED_COMMIT`, fillfactor 80 for HOT
-- updates): an update stays HOT (no index entries written) only while no
-- indexed column changes. So what a commit changes at nearly every step
-- (usage, cost, steps, updated_at) is fixed-width and never indexed; the
-- cost filters read it from the rows the other conditions select. What is
-- indexed is written once (agent, tags, metadata, created_at) or changes
-- with the status (error; the status itself is already indexed, so those
-- updates were not HOT before either).
--
-- Every ADD COLUMN has a constant default or none: no table rewrite.
ALTER TABLE runs
    ADD COLUMN agent              text,
    ADD COLUMN agent_version      integer CHECK (agent_version >= 1),
    ADD COLUMN tags               text[] NOT NULL DEFAULT '{}',
    ADD COLUMN metadata           jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN custom_id          text,
    ADD COLUMN turns              bigint NOT NULL DEFAULT 0,
    ADD COLUMN tool_calls         bigint NOT NULL DEFAULT 0,
    ADD COLUMN active_ms          bigint NOT NULL DEFAULT 0,
    ADD COLUMN input_tokens       bigint NOT NULL DEFAULT 0,
    ADD COLUMN output_tokens      bigint NOT NULL DEFAULT 0,
    ADD COLUMN cache_write_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN cache_read_tokens  bigint NOT NULL DEFAULT 0,
    ADD COLUMN tokens_estimated   boolean NOT NULL DEFAULT false,
    ADD COLUMN cost_usd_micros    bigint NOT NULL DEFAULT 0,
    ADD COLUMN steps              integer NOT NULL DEFAULT 0,
    ADD COLUMN error              text,
    ADD COLUMN ended_at           timestamptz;

-- Backfill of runs admitted before this migration, from what is cheap to
-- read: the agent from `session.start` (seq 1, by primary key); error and
-- end time from the stored outcome (a done run's last commit ended it);
-- usage and steps from the run's latest checkpoint (one row per run; a run
-- that commits again writes its exact usage, while a run that ended before
-- the upgrade keeps the usage of its last checkpoint, which may miss the
-- last few events' spend).
UPDATE runs r
SET agent = e.payload #>> '{data,config,agent,name}',
    agent_version = (e.payload #>> '{data,config,agent,version}')::integer
FROM events e
WHERE e.run_id = r.id AND e.seq = 1 AND e.kind = 'session.start'
  AND e.payload #> '{data,config,agent}' IS NOT NULL;

UPDATE runs
SET ended_at = updated_at,
    error = CASE outcome->>'kind'
              WHEN 'failed' THEN outcome->>'error'
              WHEN 'cancelled' THEN outcome->>'reason'
            END
WHERE status = 'done';

UPDATE runs r
SET turns              = coalesce((c.state #>> '{usage,turns}')::bigint, 0),
    tool_calls         = coalesce((c.state #>> '{usage,tool_calls}')::bigint, 0),
    active_ms          = coalesce((c.state #>> '{usage,active_ms}')::bigint, 0),
    input_tokens       = coalesce((c.state #>> '{usage,tokens,input_tokens}')::bigint, 0),
    output_tokens      = coalesce((c.state #>> '{usage,tokens,output_tokens}')::bigint, 0),
    cache_write_tokens = coalesce((c.state #>> '{usage,tokens,cache_write_tokens}')::bigint, 0),
    cache_read_tokens  = coalesce((c.state #>> '{usage,tokens,cache_read_tokens}')::bigint, 0),
    tokens_estimated   = coalesce((c.state #>> '{usage,tokens,estimated}')::boolean, false),
    cost_usd_micros    = coalesce((c.state #>> '{usage,cost_usd_micros}')::bigint, 0),
    steps              = coalesce((c.state ->> 'step')::integer + 1, 0)
FROM checkpoints c
WHERE c.run_id = r.id AND c.state IS NOT NULL;

-- Listing is newest first per tenant: `runs_tenant (tenant, id)` (V1) read
-- backwards, or the primary key for an admin's listing of every tenant.
-- Each filter that can be selective has its own path to the newest rows:
CREATE INDEX runs_tenant_status ON runs (tenant, status, id);
CREATE INDEX runs_tenant_agent ON runs (tenant, agent, agent_version, id) WHERE agent IS NOT NULL;
CREATE INDEX runs_tenant_created ON runs (tenant, created_at);
CREATE INDEX runs_tags ON runs USING gin (tags);
CREATE INDEX runs_metadata ON runs USING gin (metadata jsonb_path_ops);

-- Error text search (`error ILIKE '%…%'`): a trigram index, from pg_trgm
-- (Postgres contrib; a trusted extension, so the database owner may create
-- it). Without pg_trgm the search still works, reading the tenant's failed
-- and cancelled runs (`runs_tenant_status`), and the migration says so.
DO $$
BEGIN
    CREATE EXTENSION IF NOT EXISTS pg_trgm;
    CREATE INDEX runs_error_trgm ON runs USING gin (error gin_trgm_ops) WHERE error IS NOT NULL;
EXCEPTION WHEN undefined_file OR insufficient_privilege OR feature_not_supported THEN
    RAISE WARNING 'glia: pg_trgm is not available (%); error text search reads rows without an index', SQLERRM;
END;
$$;

-- A batch item's tags (JSON array text, as `metadata` is JSON object text),
-- given to its run at admission with its metadata and custom_id.
ALTER TABLE batch_items ADD COLUMN tags text;
