//! glia-proto: the contract every other glia crate speaks.
//!
//! - [`content`]: content blocks, messages, usage;
//! - [`event`]: the event catalogue and its envelope;
//! - [`state`]: `RunState` and its one transition function [`RunState::apply`];
//! - [`budget`]: limits, usage arithmetic, prices, spend counted across runs;
//! - [`repair`]: building a provider-valid message list from any history;
//! - [`marker`]: text glia inserts into conversations, and its predicate;
//! - [`config`]: a run's configuration, tool specs and policies;
//! - [`limits`]: bounds on tenant input (rules, patterns, tools, schemas);
//! - [`stop`]: stop reasons as outcomes: classes, the run's policy;
//! - [`agent`]: agent definitions, declarative guardrails and compaction;
//! - [`strict`]: parsing configuration strictly, errors naming the path.
//! - [`tool_sources`]: MCP and HTTP tools a run names, per-tool policy;
//! - [`provider`]: the provider boundary (the [`Provider`] trait, request,
//!   response, error) and the provider kinds;
//! - [`held`]: a tool call's outcome held until it is committed.
//!
//! Pure: no I/O and no async runtime.

#![warn(missing_docs)]

pub mod agent;
pub mod budget;
pub mod config;
pub mod content;
pub mod event;
pub mod held;
pub mod limits;
pub mod marker;
pub mod provider;
pub mod repair;
pub mod state;
pub mod stop;
pub mod strict;
pub mod tool_sources;

pub use agent::{
    AgentDefinition, AgentRef, CompactionSpec, CompactionStrategy, Guardrails, Redaction, TextRule,
    Withheld,
};
pub use budget::{BudgetLimits, BudgetUsage, Limit, Pricing, Spend, SpendCap};
pub use config::{
    ApprovalTimeout, ConfigError, DEFAULT_CANCEL_GRACE_MS, InterruptedCall, PlannerKind, Policy,
    PolicyAction, RunConfig, ToolSpec, compile_tool_schema, json_type,
};
pub use content::{
    ContentBlock, IMAGE_MEDIA_TYPES, ImageSource, MAX_IMAGE_BASE64_LEN, Message, ResultBlock, Role,
    ToolContent, Usage,
};
pub use event::{
    Decision, Disposition, Event, EventKind, GuardrailStage, HookEffect, HookTopic, LiveEvent,
    Outcome, PauseReason, PullPoint, Resume, Retry, ToolCallRecord, ToolErrorKind,
};
pub use held::HeldResult;
pub use provider::{
    ModelRequest, ModelResponse, Provider, ProviderError, ProviderKind, ToolChoice,
    validate_request,
};
pub use state::{ApprovalStatus, PendingCall, Phase, RunState, Status, TransitionError};
pub use stop::{ProtectedTurn, RefusedTurn, RejectedAnswer, StopAction, StopClass, StopPolicy};
pub use tool_sources::{
    HttpTool, McpToolSource, PolicyOrigin, ResolvedPolicy, ToolPolicy, ToolSource,
};

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Name of the forced tool through which a run with an output schema answers.
pub const OUTPUT_TOOL: &str = "final_output";

/// `value` as JSON with object keys sorted at every level and no whitespace:
/// the form hashed by [`args_hash`] and matched by policy regexes.
///
/// ```
/// let v = serde_json::json!({"b": 1, "a": {"d": [2], "c": null}});
/// assert_eq!(glia_proto::canonical_json(&v), r#"{"a":{"c":null,"d":[2]},"b":1}"#);
/// ```
pub fn canonical_json(value: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                Value::Object(
                    entries
                        .into_iter()
                        .map(|(k, v)| (k.clone(), sorted(v)))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(value).to_string()
}

/// SHA-256 of [`canonical_json`] of `input`, lowercase hex (64 chars). An
/// approval binds to this hash.
pub fn args_hash(input: &Value) -> String {
    let digest = Sha256::digest(canonical_json(input).as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

pub mod testing;

#[cfg(test)]
mod state_tests;
