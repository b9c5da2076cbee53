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
//! - [`agent`]: agent definitions;
//! - [`guardrails`]: declarative guardrails over input, output and tool results;
//! - [`compaction`]: declarative compaction;
//! - [`config_error`]: a configuration glia cannot run, naming the field;
//! - [`json`]: canonical JSON and the argument hash;
//! - [`strict`]: parsing configuration strictly, errors naming the path.
//! - [`tool_sources`]: MCP and HTTP tools a run names, per-tool policy;
//! - [`provider`]: the provider boundary (the [`Provider`] trait, request,
//!   response, error) and the provider kinds;
//! - [`held`]: a tool call's outcome held until it is committed;
//! - [`children`]: child runs, agents offered as tools;
//! - [`erasure`]: what a run's records look like once its content is erased;
//! - [`recorded`]: recorded tools, a run's calls answered from a recording.
//!
//! Pure: no I/O and no async runtime.

#![warn(missing_docs)]

pub mod agent;
pub mod budget;
pub mod children;
pub mod compaction;
pub mod config;
pub mod config_error;
pub mod content;
pub mod erasure;
pub mod event;
pub mod guardrails;
pub mod held;
pub mod json;
pub mod limits;
pub mod marker;
pub mod provider;
pub mod recorded;
pub mod repair;
pub mod state;
pub mod stop;
pub mod strict;
pub mod tool_names;
#[cfg(feature = "schemars")]
pub mod tool_schema;
pub mod tool_sources;
pub mod wait;
pub mod webhook_signature;

pub use agent::AgentDefinition;
pub use budget::{BudgetLimits, BudgetUsage, Limit, Pricing, Spend, SpendCap};
pub use children::{ChildAgent, ChildCall, MAX_CHILD_DEPTH};
pub use compaction::{CompactionSpec, CompactionStrategy};
pub use config::{
    AgentRef, ApprovalTimeout, DEFAULT_CANCEL_GRACE_MS, DEFAULT_MAX_RESULT_BYTES, InterruptedCall,
    OUTPUT_TOOL, PlannerKind, Policy, PolicyAction, RunConfig, ToolSpec, compile_tool_schema,
    json_type,
};
pub use config_error::ConfigError;
pub use content::{
    ContentBlock, IMAGE_MEDIA_TYPES, ImageSource, MAX_IMAGE_BASE64_LEN, Message, ResultBlock, Role,
    ToolContent, Usage,
};
pub use erasure::TOMBSTONE;
pub use event::{
    Decision, DecisionChoice, Disposition, Event, EventKind, GuardrailStage, HookCall, HookEffect,
    HookOutcome, HookTopic, LiveEvent, Outcome, PauseReason, Payload, PullPoint, Retry,
    ToolCallRecord, ToolErrorKind,
};
pub use guardrails::{Guardrails, Redaction, TextRule, Withheld};
pub use held::{Held, HeldResult, RUNNING_MARK_REFRESH, RUNNING_MARK_TTL};
pub use json::{args_hash, canonical_json};
pub use provider::{
    ModelRequest, ModelResponse, Provider, ProviderError, ProviderKind, ToolChoice,
    validate_request,
};
pub use state::{ApprovalStatus, PendingCall, Phase, RunState, Status, TransitionError};
pub use stop::{ProtectedTurn, RefusedTurn, RejectedAnswer, StopAction, StopClass, StopPolicy};
pub use tool_sources::{
    HttpTool, McpToolHints, McpToolSource, OutputSchemaCheck, PolicyOrigin, ResolvedPolicy,
    ToolOutputSchema, ToolPolicy, ToolSource,
};
pub use wait::{ArrivedEvent, BUILTIN_TOOLS, Wait};

pub mod testing;

#[cfg(test)]
mod state_tests;
#[cfg(test)]
mod wait_tests;
// Issue 32, child runs.
#[cfg(test)]
mod children_tests;
