-- Tool results held by the worker that ran the call until they are in the
-- log (`Ledger::hold_results`), keyed by the call's idempotency key
-- (`{run_id}:{turn}:{call_id}`); `result` is the `HeldResult` JSON.
CREATE TABLE held_results (
    key         TEXT PRIMARY KEY,
    result      TEXT NOT NULL,
    expires_at  INTEGER NOT NULL
) STRICT;
