//! glia-agent's integration tests: one test binary, a module per
//! concern (see `tests/README.md`).

mod common;

mod bad_input;
mod child_runs;
mod declarative;
mod gate_bypass;
mod hooks;
mod http_hooks;
mod http_tools;
mod loop_features;
mod markers;
mod mcp;
mod mcp_calls;
mod mcp_content;
mod mcp_discovery;
mod mcp_names;
mod provider_events;
mod pull_points;
mod replay_prop;
mod result_budget;
mod waits;
