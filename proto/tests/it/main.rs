//! glia-proto's integration tests: one test binary, a module per
//! concern (see `tests/README.md`).

mod elision;
mod repair;
mod result_budget;
mod roundtrip;
mod tool_names;
mod tool_policy;
