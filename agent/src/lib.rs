//! glia-agent: the agent loop and what it calls, without storage.
//!
//! Its one job is to advance a run to its next pull point: it reads a
//! [`glia_proto::RunState`], calls the model and tools, and hands every
//! event to an [`EventSink`]. Where the events go (a log, a ledger, a queue)
//! is the caller's: this crate links no storage, broker or cache
//! (`glia-worker` is the job consumer that does).
//!
//! - [`agent`]: the loop, [`agent::Agent::advance`], read top to bottom;
//! - [`provider`]: the offline [`provider::ScriptedProvider`] (the boundary
//!   itself is [`glia_proto::provider`]);
//! - [`tool`]: typed tools, schema validation, the registry;
//! - [`hooks`]: the ten hook topics;
//! - [`policy`]: declarative tool policies and guardrails;
//! - [`compact`]: context compaction strategies;
//! - [`planner`]: the single-step and model planners;
//! - [`budget_gate`]: the port for spend counted across runs (per-tenant daily caps);
//! - [`catalogue`]: the operator's catalogue (providers, MCP servers, HTTP origins);
//! - [`mcp`]: the MCP client (rmcp), one supervised connection per catalogue server;
//! - [`http_tool`]: HTTP tools (JSON POST);
//! - [`tool_sources`]: a run's MCP and HTTP tools as step tools, and their calls.

#![warn(missing_docs)]

pub mod agent;
pub mod budget_gate;
pub mod catalogue;
pub mod compact;
pub mod hooks;
pub mod http_hooks;
pub mod http_tool;
pub mod mcp;
pub mod planner;
pub mod policy;
pub mod provider;
pub mod tool;
pub mod tool_sources;

pub use agent::{Agent, AgentError, Clock, EventSink, FixedClock, SinkError, SystemClock};
pub use async_trait::async_trait;
