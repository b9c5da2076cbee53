-- What `GET /v1/runs` shows and filters runs by (the Postgres V13 migration's
-- columns): what a run was submitted with (written once at admission) and
-- what it has consumed and how it ended (written by every commit from the
-- run's state). `tags` is a JSON array of strings, `metadata` a JSON object
-- of strings; times are nanoseconds since the epoch.
ALTER TABLE runs ADD COLUMN agent TEXT;
ALTER TABLE runs ADD COLUMN agent_version INTEGER CHECK (agent_version >= 1);
ALTER TABLE runs ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';
ALTER TABLE runs ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}';
ALTER TABLE runs ADD COLUMN custom_id TEXT;
ALTER TABLE runs ADD COLUMN turns INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN tool_calls INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN active_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN cache_read_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN tokens_estimated INTEGER NOT NULL DEFAULT 0 CHECK (tokens_estimated IN (0, 1));
ALTER TABLE runs ADD COLUMN cost_usd_micros INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN steps INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN error TEXT;
ALTER TABLE runs ADD COLUMN ended_at INTEGER;

-- Backfill (as in V13): the agent from `session.start`, error and end time
-- from the outcome, usage and steps from the latest checkpoint (a run that
-- ended before the upgrade keeps its last checkpoint's usage).
UPDATE runs
SET agent = (SELECT json_extract(e.payload, '$.data.config.agent.name') FROM events e WHERE e.run_id = runs.id AND e.seq = 1),
    agent_version = (SELECT json_extract(e.payload, '$.data.config.agent.version') FROM events e WHERE e.run_id = runs.id AND e.seq = 1)
WHERE EXISTS (SELECT 1 FROM events e WHERE e.run_id = runs.id AND e.seq = 1
              AND json_extract(e.payload, '$.data.config.agent') IS NOT NULL);

UPDATE runs
SET ended_at = updated_at,
    error = CASE json_extract(outcome, '$.kind')
              WHEN 'failed' THEN json_extract(outcome, '$.error')
              WHEN 'cancelled' THEN json_extract(outcome, '$.reason')
            END
WHERE status = 'done';

UPDATE runs
SET (turns, tool_calls, active_ms, input_tokens, output_tokens, cache_write_tokens, cache_read_tokens,
     tokens_estimated, cost_usd_micros, steps) = (
    SELECT coalesce(json_extract(c.state, '$.usage.turns'), 0),
           coalesce(json_extract(c.state, '$.usage.tool_calls'), 0),
           coalesce(json_extract(c.state, '$.usage.active_ms'), 0),
           coalesce(json_extract(c.state, '$.usage.tokens.input_tokens'), 0),
           coalesce(json_extract(c.state, '$.usage.tokens.output_tokens'), 0),
           coalesce(json_extract(c.state, '$.usage.tokens.cache_write_tokens'), 0),
           coalesce(json_extract(c.state, '$.usage.tokens.cache_read_tokens'), 0),
           coalesce(json_extract(c.state, '$.usage.tokens.estimated'), 0),
           coalesce(json_extract(c.state, '$.usage.cost_usd_micros'), 0),
           coalesce(json_extract(c.state, '$.step') + 1, 0)
    FROM checkpoints c WHERE c.run_id = runs.id ORDER BY c.seq DESC LIMIT 1)
WHERE EXISTS (SELECT 1 FROM checkpoints c WHERE c.run_id = runs.id);

-- Newest first per tenant: `runs_tenant (tenant, id)` read backwards; the
-- selective filters get their own.
CREATE INDEX runs_tenant_status ON runs (tenant, status, id);
CREATE INDEX runs_tenant_agent ON runs (tenant, agent, agent_version, id) WHERE agent IS NOT NULL;

-- A batch item's tags (JSON array text), given to its run at admission.
ALTER TABLE batch_items ADD COLUMN tags TEXT;
