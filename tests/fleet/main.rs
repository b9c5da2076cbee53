//! The fleet's guarantees, end to end: `glia dispatcher` and `glia worker`
//! processes on real Postgres, RabbitMQ and Redis (private instances for the
//! tests that stop or restart one), driven over HTTP like a client. One test
//! binary, one module per guarantee:
//!
//! - [`durability`]: no run is lost or stuck, and no event is lost or
//!   duplicated, across kills of workers and the dispatcher, broker and
//!   database outages, and the single-node mode's restarts;
//! - [`exactly_once`]: the recorded tau-bench batch reproduces exactly
//!   (every call, result and approval), with a worker killed mid-batch;
//! - [`approvals`]: the approval inbox, in a real browser;
//! - [`console`]: the console's pages (runs, batches, agents), in a real browser;
//! - [`limits`]: the provider's rate limits, retries and prices, fleet-wide;
//!   tenant input bounded (and the dispatcher's memory with it);
//! - [`observability`]: every dashboard and alert expression has data in a
//!   real Prometheus;
//! - [`agents`]: agent definitions applied from files, runs started from them;
//! - [`guardrails`]: denied text stored nowhere, tool results screened;
//! - [`retention`]: an erased run's content found nowhere, its counts and costs kept;
//! - [`waits`]: timers across a dispatcher restart, event waits across a worker kill.
//! - [`children`]: child runs (agents as tools): parallel children, kills, cancel, budgets.
//! - [`evals`]: the tau-bench replay eval on the fleet, through worker and dispatcher kills.
//! - [`clients`]: the Python and TypeScript clients' own suites against a fleet.
//! - [`mcp`]: glia as an MCP server, with the rmcp client and the TypeScript SDK's.
//! - [`hooks`]: HTTP hooks of the operator's catalogue, not called again after a worker kill.

mod agents;
mod approvals;
// Issue 32, child runs.
mod children;
// Issue 33, the Python and TypeScript clients.
mod clients;
mod console;
mod durability;
// Issue 31, evals.
mod evals;
mod exactly_once;
mod guardrails;
// Issue 33, HTTP hooks.
mod hooks;
mod limits;
mod mcp;
mod observability;
mod retention;
mod waits;
