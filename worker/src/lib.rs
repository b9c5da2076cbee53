//! glia-worker: the agent loop and what it calls.
//!
//! - [`agent`]: the loop, [`agent::Agent::advance`], read top to bottom;
//! - [`provider`]: the provider boundary and the offline [`provider::ScriptedProvider`];
//! - [`tool`]: typed tools, schema validation, the registry;
//! - [`hooks`]: the ten hook topics;
//! - [`policy`]: declarative tool policies and guardrails;
//! - [`compact`]: context compaction strategies;
//! - [`planner`]: the single-step and model planners;
//! - [`fleet`]: the job consumer of a `glia worker` process;
//! - [`budget_gate`]: spend counted across runs (per-tenant daily caps);
//! - [`catalogue`]: the operator's catalogue (providers, MCP servers, HTTP origins);
//! - [`mcp`]: the MCP client (rmcp), one supervised connection per catalogue server;
//! - [`http_tool`]: HTTP tools (JSON POST);
//! - [`tool_sources`]: a run's MCP and HTTP tools as step tools, and their calls;
//! - [`metrics`]: a worker's Prometheus metrics and GenAI spans, derived from recorded events.

#![warn(missing_docs)]

pub mod agent;
pub mod budget_gate;
pub mod catalogue;
pub mod compact;
pub mod fleet;
pub mod hooks;
pub mod http_tool;
pub mod mcp;
pub mod metrics;
pub mod planner;
pub mod policy;
pub mod provider;
pub mod tool;
pub mod tool_sources;

pub use agent::{Agent, AgentError, Clock, EventSink, FixedClock, SinkError, SystemClock};
pub use async_trait::async_trait;
