-- The agent registry: one row per immutable version of a tenant's agent
-- definition (glia_proto::AgentDefinition). `definition` is its canonical
-- JSON text (kept as text: the bytes hashed are the bytes served),
-- `content_hash` is `sha256:` and hex. Writers of one (tenant, name) are
-- serialised by a transaction-scoped advisory lock (PgLog::put_agent).

CREATE TABLE agents (
    tenant        text NOT NULL,
    name          text NOT NULL,
    version       integer NOT NULL CHECK (version >= 1),
    content_hash  text NOT NULL,
    definition    text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, name, version)
);
