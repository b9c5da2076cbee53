//! Durability: kills of workers and the dispatcher mid-batch, RabbitMQ and
//! Postgres/Redis outages, the single-node mode killed and restarted. Each
//! checks that every run completes, every log is gap- and duplicate-free and
//! replays, and each refund ran at most once with exactly one outcome per run.

mod batches;
mod broker_restart;
mod kills;
mod mcp_faults;
mod outages;
mod single_node;
