//! glia-replay's integration tests: one test binary, a module per
//! concern (see `tests/README.md`).

mod mcp_server;
mod tau_bench;
