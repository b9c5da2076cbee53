//! glia-worker's integration tests: one test binary, a module per
//! concern (see `tests/README.md`).

#[path = "../../../agent/tests/it/common/mod.rs"]
mod common;
mod observed;

mod cancel_grace;
mod cancel_watch;
mod consumer;
mod held_results;
mod lease_release;
mod metrics;
mod resume_hints;
mod resumes_first;
mod stop_reasons;
mod tenant_budget;
mod tool_sources;
