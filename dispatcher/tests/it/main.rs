//! glia-dispatcher's integration tests: one test binary, a module per
//! concern (see `tests/README.md`).

mod common;

mod admission;
mod agents;
mod approvals;
mod bad_input;
mod batches;
mod children;
mod console;
mod console_experiments;
mod console_more;
mod contract;
mod evals;
mod inbox;
mod mcp;
mod module_graph;
mod ops;
mod payloads;
mod retention;
mod run_listing;
mod runs;
mod schedules;
mod schemathesis;
mod stream;
mod tenancy;
mod waits;
mod webhooks;
