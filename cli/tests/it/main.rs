//! glia-cli's integration tests: one test binary, a module per
//! concern (see `tests/README.md`).

mod bench;
mod common;
mod corrupt_record;
mod crate_graph;
mod deploy;
mod evals;
mod providers;
mod run;
mod runs_list;
mod schedules;
mod waits;
