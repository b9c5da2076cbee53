//! Issue 32, child runs on the fleet (`docs/child-runs.md`): `glia
//! dispatcher` and `glia worker` processes on Postgres, RabbitMQ and Redis.
//! A parent whose model calls an agent tool three times in one turn parks;
//! the dispatcher's children loop starts three linked children; their ends
//! resume the parent with all three results. `kill -9` of the worker
//! holding the parent, and separately of a child's worker (and of the
//! dispatcher), starts no child twice (counted with the `parent` filter)
//! and runs no refund twice (the effects file); cancelling the parent
//! cancels its running children; the parent's budget stops a child that
//! would exceed it.

mod runs;
