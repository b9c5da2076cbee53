-- glia single node (SQLite), schema version 2: the agent registry, as
-- Postgres's V7__agents.sql. One row per immutable version of a tenant's
-- agent definition; `definition` is its canonical JSON text, `content_hash`
-- `sha256:` and hex.

CREATE TABLE agents (
    tenant        TEXT NOT NULL,
    name          TEXT NOT NULL,
    version       INTEGER NOT NULL CHECK (version >= 1),
    content_hash  TEXT NOT NULL,
    definition    TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    PRIMARY KEY (tenant, name, version)
) STRICT;
