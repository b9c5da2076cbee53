//! glia-worker: the job consumer of a `glia worker` process.
//!
//! Its one job is to turn queued jobs into advanced runs: take a job, open
//! the run under a fenced lease, drive the agent loop (`glia-agent`) with a
//! sink that commits each step to the event log, hold tool results and gate
//! spend on the ledger, release or park. The loop itself lives in
//! `glia-agent`, which links no storage.
//!
//! - [`consumer`]: the job consumer ([`consumer::Worker`]) and the ledger-backed
//!   budget gate;
//! - [`metrics`]: a worker's Prometheus metrics and GenAI spans, derived from recorded events;
//! - [`run_tenants`]: a run's tenant from the event log, for the loop's HTTP hooks;
//! - [`trace`]: how a run's spans form one OpenTelemetry trace (trace id = run id).

#![warn(missing_docs)]

pub mod cancel_watch;
pub mod consumer;
pub mod metrics;
pub mod run_tenants;
pub mod trace;
