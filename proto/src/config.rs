//! A run's configuration: recorded once in `session.start`, so replay and
//! every worker see the same settings.
//!
//! A run config and an agent definition ([`crate::AgentDefinition`]) share
//! most of their fields; the macro `run_fields!` declares those once for both.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::budget::{BudgetLimits, Pricing};
use crate::config_error::{ConfigError, TOOL_NAME, config_error};
use crate::guardrails::Guardrails;
use crate::limits::{
    MAX_HOOKS, MAX_PATTERN_BYTES, MAX_POLICIES, MAX_TOOL_NAME_BYTES, MAX_TOOLS, check_schema, over,
};
use crate::stop::StopPolicy;
use crate::tool_names::{ToolNameClash, same_tool};
use crate::tool_sources::{ResolvedPolicy, ToolOutputSchema, ToolSource};
use std::collections::BTreeMap;

pub use crate::json::json_type;
pub use crate::limits::compile_tool_schema;
pub use crate::tool_names::OUTPUT_TOOL;

/// Default cap on model calls within one turn (one user input to one answer).
pub const DEFAULT_MAX_MODEL_CALLS_PER_TURN: u32 = 16;
/// Default cap on re-asks after a rejected answer.
pub const DEFAULT_MAX_REASKS: u32 = 2;

/// Declares a struct with the fields a [`RunConfig`] and an
/// [`crate::AgentDefinition`] share, each declared once here (its doc, its
/// type, its serde attributes), where the struct's field list says
/// `common NAME,`; the struct's other fields are written as usual. A
/// shared field may take attributes of its own struct after its name
/// (`common guardrails #[serde(skip_serializing_if = "…")],`): the two
/// structs serialise a few of them differently.
///
/// A macro, not a shared struct under `#[serde(flatten)]`: flatten does
/// not work with `deny_unknown_fields`, and strict parsing
/// ([`crate::strict`]) refuses unknown fields naming their path.
///
/// Shared fields carry field-level serde defaults equal to
/// `RunConfig::default()`'s values, so both structs read absent fields
/// alike; `model` has none (a definition must name it; a config takes its
/// container default).
macro_rules! run_fields {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($body:tt)* }) => {
        $crate::config::run_fields!(@munch [$(#[$meta])* $vis struct $name] [] $($body)*);
    };
    (@munch [$($head:tt)*] [$($done:tt)*]) => {
        $($head)* { $($done)* }
    };
    (@munch $head:tt [$($done:tt)*] common $field:ident $(#[$extra:meta])*, $($rest:tt)*) => {
        $crate::config::run_fields!(@common $field [$(#[$extra])*] $head [$($done)*] $($rest)*);
    };
    (@munch $head:tt [$($done:tt)*] $(#[$m:meta])* $v:vis $field:ident : $ty:ty, $($rest:tt)*) => {
        $crate::config::run_fields!(@munch $head [$($done)* $(#[$m])* $v $field: $ty,] $($rest)*);
    };
    (@common model $extra:tt $head:tt [$($done:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@field $head [$($done)*] $extra [
            /// Provider model name, e.g. `claude-sonnet-4-5`; not blank.
            #[cfg_attr(feature = "schemars", schemars(pattern($crate::config_error::NOT_BLANK)))]
            pub model: String
        ] $($rest)*);
    };
    (@common system $extra:tt $head:tt [$($done:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@field $head [$($done)*] $extra [
            /// Stable system prompt (the cacheable prefix).
            #[serde(default)]
            pub system: String
        ] $($rest)*);
    };
    (@common external_tools $extra:tt $head:tt [$($done:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@field $head [$($done)*] $extra [
            /// Client-executed tools: the run parks at `awaiting_tool` until a
            /// result is posted.
            #[serde(default)]
            #[cfg_attr(feature = "schemars", schemars(length(max = $crate::limits::MAX_TOOLS)))]
            pub external_tools: Vec<$crate::config::ToolSpec>
        ] $($rest)*);
    };
    (@common policies $extra:tt $head:tt [$($done:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@field $head [$($done)*] $extra [
            /// Declarative tool-call policies, first match wins; no match = allow.
            #[serde(default)]
            #[cfg_attr(feature = "schemars", schemars(length(max = $crate::limits::MAX_POLICIES)))]
            pub policies: Vec<$crate::config::Policy>
        ] $($rest)*);
    };
    (@common budget $extra:tt $head:tt [$($done:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@field $head [$($done)*] $extra [
            /// Per-run budget.
            #[serde(default)]
            pub budget: $crate::budget::BudgetLimits
        ] $($rest)*);
    };
    (@common conversational $extra:tt $head:tt [$($done:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@field $head [$($done)*] $extra [
            /// When true the run parks at `awaiting_input` after each answer
            /// instead of finishing; it finishes when the caller closes it.
            #[serde(default)]
            pub conversational: bool
        ] $($rest)*);
    };
    (@common planner $extra:tt $head:tt [$($done:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@field $head [$($done)*] $extra [
            /// Which planner drafts the plan.
            #[serde(default)]
            pub planner: $crate::config::PlannerKind
        ] $($rest)*);
    };
    (@common output_schema $extra:tt $head:tt [$($done:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@field $head [$($done)*] $extra [
            /// JSON Schema of the final answer (a JSON object); when set the
            /// model answers through the forced tool [`OUTPUT_TOOL`](crate::config::OUTPUT_TOOL) and
            /// its arguments are validated.
            #[serde(default)]
            #[cfg_attr(
                feature = "schemars",
                schemars(with = "Option<crate::tool_schema::ToolInputSchema>")
            )]
            pub output_schema: Option<serde_json::Value>
        ] $($rest)*);
    };
    (@common approval_timeout_ms $extra:tt $head:tt [$($done:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@field $head [$($done)*] $extra [
            /// How long an approval may wait, in ms; `None` waits forever.
            #[serde(default)]
            pub approval_timeout_ms: Option<u64>
        ] $($rest)*);
    };
    (@common guardrails $extra:tt $head:tt [$($done:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@field $head [$($done)*] $extra [
            /// Declarative guardrails over the goal, user messages, answers
            /// and tool results (see [`crate::Guardrails`]); empty by default.
            #[serde(default)]
            pub guardrails: $crate::guardrails::Guardrails
        ] $($rest)*);
    };
    (@common compaction $extra:tt $head:tt [$($done:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@field $head [$($done)*] $extra [
            /// Declarative compaction before model calls; `None` never compacts.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub compaction: Option<$crate::compaction::CompactionSpec>
        ] $($rest)*);
    };
    (@common mcp $extra:tt $head:tt [$($done:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@field $head [$($done)*] $extra [
            /// Tools of the operator's MCP servers the run may use, by catalogue
            /// server name and an explicit allow list ([`crate::tool_sources`]).
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            pub mcp: Vec<$crate::tool_sources::McpToolSource>
        ] $($rest)*);
    };
    (@common http_tools $extra:tt $head:tt [$($done:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@field $head [$($done)*] $extra [
            /// Tools the worker runs as JSON POSTs to catalogue-allowed origins.
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            pub http_tools: Vec<$crate::tool_sources::HttpTool>
        ] $($rest)*);
    };
    (@common tool_policy $extra:tt $head:tt [$($done:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@field $head [$($done)*] $extra [
            /// Per-tool overrides (approval, idempotency, timeout, hand-off,
            /// output schema check) by tool name, for MCP tools (over their
            /// annotations) and HTTP tools; ignored for the worker's own tools,
            /// except `max_result_bytes`, which applies to every tool. An MCP
            /// tool may be keyed by its own name (`calendar.read`) or the name
            /// the model sees ([`crate::tool_names`]); other keys match
            /// `^[a-zA-Z0-9_-]{1,64}$`.
            #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
            #[cfg_attr(
                feature = "schemars",
                schemars(extend("propertyNames" = {"minLength": 1, "maxLength": $crate::limits::MAX_TOOL_NAME_BYTES}))
            )]
            pub tool_policy: std::collections::BTreeMap<String, $crate::tool_sources::ToolPolicy>
        ] $($rest)*);
    };
    (@common max_result_bytes $extra:tt $head:tt [$($done:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@field $head [$($done)*] $extra [
            /// The most bytes of a tool result's text that enter the
            /// conversation, for every tool without its own
            /// `tool_policy.NAME.max_result_bytes`: a longer result is cut to
            /// its head and a marked notice of its size while the log keeps
            /// it whole. Images count separately (5 MiB each). Default 65536
            /// (64 KiB); 1 to 1048576 (1 MiB).
            #[serde(
                default = "crate::config::default_max_result_bytes",
                skip_serializing_if = "crate::config::is_default_max_result_bytes"
            )]
            #[cfg_attr(feature = "schemars", schemars(range(min = 1, max = 1_048_576)))]
            pub max_result_bytes: u64
        ] $($rest)*);
    };
    (@common provider $extra:tt $head:tt [$($done:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@field $head [$($done)*] $extra [
            /// Name of a model provider in the operator's catalogue (e.g.
            /// `anthropic`); `None` = the worker's default provider.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[cfg_attr(feature = "schemars", schemars(pattern($crate::config_error::NOT_BLANK)))]
            pub provider: Option<String>
        ] $($rest)*);
    };
    // --- issue 32: waits ---
    (@common builtin_tools $extra:tt $head:tt [$($done:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@field $head [$($done)*] $extra [
            /// glia's built-in tools this run offers the model: `sleep`,
            /// `wait_until`, `wait_for_event` ([`crate::wait`],
            /// `docs/waits.md`); each at most once. A call parks the run at
            /// `awaiting_timer` or `awaiting_event` and no worker holds it.
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            #[cfg_attr(feature = "schemars", schemars(length(max = 3)))]
            pub builtin_tools: Vec<String>
        ] $($rest)*);
    };
    // --- end waits ---
    // Issue 32, child runs: the agents offered as tools.
    (@common agents $extra:tt $head:tt [$($done:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@field $head [$($done)*] $extra [
            /// Registered agents of the tenant offered to the model as tools
            /// (`docs/child-runs.md`): `name@VERSION`, or `name` for the
            /// latest version at admission. A call starts a child run whose
            /// answer is the tool's result. The tool name is the agent's
            /// name; its input is `{"goal": string}`. At most 16
            /// ([`crate::children::MAX_AGENTS`]); resolved and frozen at
            /// admission ([`RunConfig::child_agents`]).
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            #[cfg_attr(feature = "schemars", schemars(length(max = $crate::children::MAX_AGENTS)))]
            pub agents: Vec<String>
        ] $($rest)*);
    };
    // Issue 33: HTTP hooks of the operator's catalogue.
    (@common hooks $extra:tt $head:tt [$($done:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@field $head [$($done)*] $extra [
            /// HTTP hooks of the operator's catalogue (`[hooks.NAME]`) this
            /// run is also called with, by name (never a URL): at most 16,
            /// each once, `^[a-zA-Z0-9_-]{1,64}$`. Added to the hooks the
            /// operator applies to the run; nothing here removes one
            /// (`docs/hooks.md`). A name the catalogue lacks is refused at
            /// admission and by the worker.
            #[serde(default, skip_serializing_if = "Vec::is_empty")]
            #[cfg_attr(
                feature = "schemars",
                schemars(
                    length(max = $crate::limits::MAX_HOOKS),
                    inner(pattern(crate::config_error::TOOL_NAME_PATTERN))
                )
            )]
            pub hooks: Vec<String>
        ] $($rest)*);
    };
    (@field $head:tt [$($done:tt)*] [$($extra:tt)*] [$($decl:tt)*] $($rest:tt)*) => {
        $crate::config::run_fields!(@munch $head [$($done)* $($extra)* $($decl)*,] $($rest)*);
    };
}
pub(crate) use run_fields;

run_fields! {
    /// What a run is allowed to do and how it is driven.
    ///
    /// JSON example: `{"model": "claude-sonnet-4-5", "system": "You are …",
    /// "policies": [{"tool": "refund", "action": {"kind": "require_approval"}}],
    /// "budget": {"max_turns": 20}, "conversational": true}`. Every field is
    /// optional; unknown fields are refused (422 naming the field).
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
    #[serde(default, deny_unknown_fields)]
    pub struct RunConfig {
        common model,
        common system,
        /// Names of the worker's registered tools this run may call; `None` = all the
        /// worker has (`glia worker` has the demo tools only with `--demo`). At
        /// most 128 tools in `tools`, `external_tools`, `http_tools` and `mcp`
        /// allow lists together (docs/limits.md).
        #[cfg_attr(feature = "schemars", schemars(length(max = MAX_TOOLS)))]
        pub tools: Option<Vec<String>>,
        common external_tools,
        common policies,
        common budget,
        /// Model calls allowed per turn; a wrap-up notice precedes the last one.
        #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
        pub max_model_calls_per_turn: u32,
        common conversational,
        common planner,
        common output_schema,
        /// Re-asks allowed after a rejected answer (guardrail or invalid output).
        pub max_reasks: u32,
        /// Prices for cost accounting; `None` counts cost as zero.
        pub pricing: Option<Pricing>,
        /// Output token cap per model call.
        #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
        pub max_tokens: u32,
        common approval_timeout_ms,
        /// What the reconciler does with an approval past its deadline.
        pub on_approval_timeout: ApprovalTimeout,
        /// What happens to a non-idempotent call whose worker died while it ran
        /// (an idempotent one simply runs again with the same idempotency key).
        pub on_interrupted_call: InterruptedCall,
        /// What the loop does with an answer that is not a finished turn (cut off
        /// by the output limit, empty, refused, filtered, an unknown stop
        /// reason): re-ask, pause or fail, per class. See [`crate::stop`].
        pub stop_reasons: StopPolicy,
        /// What happens when a tool source the run names (an MCP server)
        /// cannot list its tools: attempts, backoff, then pause or fail. See
        /// [`crate::tool_sources::ToolSourceUnavailable`].
        pub on_tool_source_unavailable: crate::tool_sources::ToolSourceUnavailable,
        common guardrails #[serde(skip_serializing_if = "Guardrails::is_empty")],
        common compaction,
        /// The agent definition this config was resolved from (name, version,
        /// content hash), recorded so a run never depends on the registry later.
        /// Set by the dispatcher from a request's `agent`; refused in a
        /// request's config.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub agent: Option<AgentRef>,
        common mcp,
        common http_tools,
        common tool_policy,
        common provider,
        common max_result_bytes,
        common builtin_tools,
        // Issue 32, child runs.
        common agents,
        // Issue 33, HTTP hooks.
        common hooks,
        /// The agents of [`RunConfig::agents`] as the dispatcher resolved
        /// them for the run's tenant at admission (name, version, content
        /// hash), in the same order: what the worker offers, so a run never
        /// depends on the registry later. Set by the dispatcher; refused in
        /// a request's config.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        #[cfg_attr(feature = "schemars", schemars(skip))]
        pub child_agents: Vec<crate::children::ChildAgent>,
        /// Issue 32, a delayed start (`docs/waits.md`): when the run is to
        /// start, Unix ms (UTC). A run whose `session.start` is recorded
        /// before this time parks at `awaiting_timer` with no calls until the
        /// dispatcher wakes it ([`crate::Payload::Wake`]); a time already
        /// past starts it at once. Set by the dispatcher from a request's
        /// `start_at`; refused in a request's config.
        #[serde(skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "schemars", schemars(skip))]
        pub start_at_ms: Option<i64>,
        /// Tools answered from a recording of earlier runs
        /// ([`crate::recorded`]): offered instead of every other tool the
        /// config names, and no call runs. Set by the dispatcher from a
        /// request's `recorded_tools`; refused in a request's config.
        #[serde(skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "schemars", schemars(skip))]
        pub recorded_tools: Option<crate::recorded::RecordedTools>,
    }
}

/// The definition a run was resolved from, recorded in its config
/// (`session.start`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AgentRef {
    /// Agent name.
    pub name: String,
    /// Registry version, from 1.
    #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
    pub version: u32,
    /// [`crate::AgentDefinition::content_hash`]: `sha256:` and 64 hex digits.
    #[cfg_attr(feature = "schemars", schemars(extend("pattern" = "^sha256:[0-9a-f]{64}$")))]
    pub content_hash: String,
}

/// What happens to a non-idempotent tool call a crash interrupted: it was
/// cleared and started, and nobody knows whether it took effect.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum InterruptedCall {
    /// Give the model an `outcome_unknown` error result at once.
    #[default]
    OutcomeUnknown,
    /// Ask a person (`approval.requested` with `interrupted: true`): approve
    /// to run it again after checking it did not take effect, reject to give
    /// the model the `outcome_unknown` result.
    RequireApproval,
}

/// What happens to an approval nobody decided in time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ApprovalTimeout {
    /// Reject it; the model sees "approval expired".
    #[default]
    Reject,
    /// Keep it pending but mark it escalated, for a second line of approvers.
    Escalate,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            model: "scripted".into(),
            system: String::new(),
            tools: None,
            external_tools: Vec::new(),
            policies: Vec::new(),
            budget: BudgetLimits::default(),
            max_model_calls_per_turn: DEFAULT_MAX_MODEL_CALLS_PER_TURN,
            conversational: false,
            planner: PlannerKind::Single,
            output_schema: None,
            max_reasks: DEFAULT_MAX_REASKS,
            pricing: None,
            max_tokens: 4096,
            approval_timeout_ms: None,
            on_approval_timeout: ApprovalTimeout::Reject,
            on_interrupted_call: InterruptedCall::OutcomeUnknown,
            stop_reasons: StopPolicy::default(),
            on_tool_source_unavailable: Default::default(),
            guardrails: Guardrails::default(),
            compaction: None,
            agent: None,
            builtin_tools: Vec::new(),
            mcp: Vec::new(),
            http_tools: Vec::new(),
            tool_policy: BTreeMap::new(),
            provider: None,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            // Issue 32, child runs.
            agents: Vec::new(),
            child_agents: Vec::new(),
            hooks: Vec::new(),
            start_at_ms: None,
            recorded_tools: None,
        }
    }
}

/// Which planner a run uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum PlannerKind {
    /// One implicit step: "reach the goal".
    #[default]
    Single,
    /// The model drafts a list of steps and may replan after each.
    Model,
}

/// A tool as the model sees it (the request's tool list) plus how glia runs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// Name, `^[a-zA-Z0-9_-]{1,64}$`, not `final_output`.
    #[cfg_attr(
        feature = "schemars",
        schemars(
            pattern(crate::config_error::TOOL_NAME_PATTERN),
            extend("not" = {"const": OUTPUT_TOOL})
        )
    )]
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON Schema of the arguments object.
    #[cfg_attr(
        feature = "schemars",
        schemars(with = "crate::tool_schema::ToolInputSchema")
    )]
    pub input_schema: Value,
    /// Safe to run twice with the same idempotency key.
    #[serde(default)]
    pub idempotent: bool,
    /// Per-call timeout in ms.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Executed by the caller, not by a worker.
    #[serde(default)]
    pub external: bool,
    /// When a call of this tool succeeds, the run completes with the call's
    /// result as its answer and the model is not called again: a hand-off
    /// (LangChain's `return_direct`; tau-bench's terminate tools, such as
    /// `transfer_to_human_agents`). A failed call does not end the run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub return_direct: bool,
    /// How long a call of this tool that is already running when its run is
    /// cancelled may go on, in ms, so that its result is recorded; a call
    /// still running at the end of it is abandoned (and its task aborted)
    /// with an `outcome_unknown` error. Default [`DEFAULT_CANCEL_GRACE_MS`].
    /// The call's own `timeout_ms` still applies.
    #[serde(default = "default_cancel_grace_ms")]
    pub cancel_grace_ms: u64,
    /// Where the worker gets the tool from, for tools of MCP servers and
    /// HTTP tools (set by the worker when it freezes a step's tools; `None`
    /// for the worker's registered tools and for external tools, where a
    /// config may not set it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(skip))]
    pub source: Option<ToolSource>,
    /// The policy the step resolved for this tool and who decided it (set
    /// by the worker when it freezes a step's tools; `None` in a config and
    /// in logs written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(skip))]
    pub policy: Option<ResolvedPolicy>,
    /// The most bytes of a result's text that enter the conversation
    /// ([`crate::ToolContent::cut`], applied in [`crate::RunState::apply`]
    /// to `tool.result` content and `tool.error` messages): the tenant's
    /// `tool_policy.NAME.max_result_bytes`, else the run's
    /// [`RunConfig::max_result_bytes`] (set by the worker when it freezes a
    /// step's tools; `None` in a config, and in logs written before results
    /// were cut, whose results are not cut).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(skip))]
    pub max_result_bytes: Option<u64>,
    /// The JSON Schema the tool's server declares for its results'
    /// `structuredContent` (MCP `outputSchema`, from `tools/list`) and how
    /// a result is checked against it (set by the worker for MCP tools;
    /// `None` for tools without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(skip))]
    pub output_schema: Option<ToolOutputSchema>,
}

/// Default [`RunConfig::max_result_bytes`]: 64 KiB of result text (about
/// 16,000 tokens at ~4 bytes a token, under a tenth of a 200k-token
/// context, so a handful of results fit beside the conversation; also the
/// Postgres log's blob threshold, so every cut result's whole is stored
/// once as a blob).
pub const DEFAULT_MAX_RESULT_BYTES: u64 = 64 * 1024;

impl ToolSpec {
    /// Issue 32: the tool the model is offered for agent `agent`
    /// ([`crate::ChildAgent`]): its name, a description, the input
    /// `{"goal": string}` (agent definitions declare no input of their
    /// own), and its source [`ToolSource::Agent`].
    pub fn of_agent(agent: &crate::children::ChildAgent) -> ToolSpec {
        let about = if agent.description.trim().is_empty() {
            String::new()
        } else {
            format!(" {}", agent.description.trim())
        };
        ToolSpec {
            source: Some(ToolSource::Agent {
                agent: agent.reference(),
                content_hash: agent.content_hash.clone(),
            }),
            ..ToolSpec::new(
                agent.name.clone(),
                format!(
                    "Hand a task to the agent {:?} (version {}) and wait for its answer.{about}",
                    agent.name, agent.version
                ),
                crate::children::child_input_schema(),
            )
        }
    }

    /// A tool the worker runs, with the defaults: not idempotent, a 30 s
    /// timeout, no hand-off, a [`DEFAULT_CANCEL_GRACE_MS`] grace. Set
    /// `external: true` (struct update) for a tool the caller executes.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
    ) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            input_schema,
            idempotent: false,
            timeout_ms: default_timeout_ms(),
            external: false,
            return_direct: false,
            cancel_grace_ms: DEFAULT_CANCEL_GRACE_MS,
            source: None,
            policy: None,
            max_result_bytes: None,
            output_schema: None,
        }
    }

    /// The tool for people: `MCP server "S" tool "ORIGINAL"` for an MCP
    /// tool (its own name, which may differ from the name the model sees,
    /// [`crate::tool_names`]), else `tool "NAME"`.
    pub fn describe(&self) -> String {
        match &self.source {
            Some(ToolSource::Mcp { server, tool, .. }) => {
                format!("MCP server {server:?} tool {tool:?}")
            }
            Some(ToolSource::Agent { agent, .. }) => format!("agent {agent}"),
            _ => format!("tool {:?}", self.name),
        }
    }

    /// Every tool of a step's list has a name of its own (the names the
    /// model sees; the output tool counts too). Errors: the first
    /// [`ToolNameClash`], naming both tools ([`ToolSpec::describe`]).
    pub fn check_distinct(tools: &[ToolSpec]) -> Result<(), ToolNameClash> {
        let mut seen: std::collections::HashMap<&str, &ToolSpec> = std::collections::HashMap::new();
        for spec in tools {
            if let Some(first) = seen.insert(spec.name.as_str(), spec) {
                return Err(ToolNameClash {
                    name: spec.name.clone(),
                    first: first.describe(),
                    second: spec.describe(),
                });
            }
        }
        Ok(())
    }

    /// Whether every call of this tool needs a person's approval before it
    /// runs: its resolved [`ToolSpec::policy`] when recorded, else what its
    /// [`ToolSource`] says (logs from before policies were resolved).
    pub fn requires_approval(&self) -> bool {
        match &self.policy {
            Some(p) => p.requires_approval,
            None => self
                .source
                .as_ref()
                .is_some_and(ToolSource::requires_approval),
        }
    }
}

pub(crate) fn default_max_result_bytes() -> u64 {
    DEFAULT_MAX_RESULT_BYTES
}

pub(crate) fn is_default_max_result_bytes(bytes: &u64) -> bool {
    *bytes == DEFAULT_MAX_RESULT_BYTES
}

impl RunConfig {
    /// The result budget of tool `name` in bytes of text: its
    /// `tool_policy.NAME.max_result_bytes`, else [`RunConfig::max_result_bytes`].
    /// The worker records it in the step's [`ToolSpec::max_result_bytes`].
    pub fn max_result_bytes_for(&self, name: &str) -> u64 {
        self.tool_policy_for(name)
            .and_then(|p| p.max_result_bytes)
            .unwrap_or(self.max_result_bytes)
    }
}

/// Default [`ToolSpec::cancel_grace_ms`]: 5 s.
pub const DEFAULT_CANCEL_GRACE_MS: u64 = 5_000;

fn default_timeout_ms() -> u64 {
    30_000
}

fn default_cancel_grace_ms() -> u64 {
    DEFAULT_CANCEL_GRACE_MS
}

/// A result budget (`field` names it) is 1 to [`crate::limits::MAX_RESULT_BYTES`].
fn check_result_bytes(field: &str, bytes: u64) -> Result<(), ConfigError> {
    if bytes == 0 {
        return Err(config_error(field, "must be at least 1"));
    }
    let max = crate::limits::MAX_RESULT_BYTES;
    if bytes > max {
        return Err(over(
            field,
            format!("{bytes} bytes"),
            max as usize,
            "max_result_bytes",
        ));
    }
    Ok(())
}

impl RunConfig {
    /// Check every bound of [`crate::limits`] on the config, counting and measuring
    /// only (nothing is compiled). Errors name the field (`guardrails`,
    /// `policies`, `external_tools[2].input_schema`) and the limit.
    fn check_limits(&self) -> Result<(), ConfigError> {
        let config = self;
        crate::guardrails::check_guardrails(&config.guardrails)
            .map_err(|e| config_error(format!("guardrails.{}", e.field), e.reason))?;
        if config.hooks.len() > MAX_HOOKS {
            return Err(over(
                "hooks",
                format!("{} hooks", config.hooks.len()),
                MAX_HOOKS,
                "max_hooks",
            ));
        }
        if config.policies.len() > MAX_POLICIES {
            return Err(over(
                "policies",
                format!("{} policies", config.policies.len()),
                MAX_POLICIES,
                "max_policies",
            ));
        }
        let policy_bytes: usize = config
            .policies
            .iter()
            .filter_map(|p| p.args.as_ref())
            .map(String::len)
            .sum();
        if policy_bytes > MAX_PATTERN_BYTES {
            return Err(over(
                "policies",
                format!("{policy_bytes} bytes of args patterns"),
                MAX_PATTERN_BYTES,
                "max_pattern_bytes",
            ));
        }
        let tools = config.tools.as_ref().map_or(0, Vec::len)
            + config.external_tools.len()
            + config.http_tools.len()
            + config.mcp.iter().map(|m| m.allow.len()).sum::<usize>();
        if tools > MAX_TOOLS {
            return Err(over(
                "tools",
                format!(
                    "{tools} tools (tools, external_tools, http_tools and mcp allow lists together)"
                ),
                MAX_TOOLS,
                "max_tools",
            ));
        }
        if config.tool_policy.len() > MAX_TOOLS {
            return Err(over(
                "tool_policy",
                format!("{} entries", config.tool_policy.len()),
                MAX_TOOLS,
                "max_tools",
            ));
        }
        let schemas = config
            .external_tools
            .iter()
            .enumerate()
            .map(|(i, t)| (format!("external_tools[{i}].input_schema"), &t.input_schema))
            .chain(
                config
                    .http_tools
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (format!("http_tools[{i}].input_schema"), &t.input_schema)),
            )
            .chain(
                config
                    .output_schema
                    .iter()
                    .map(|s| ("output_schema".to_owned(), s)),
            );
        for (field, schema) in schemas {
            check_schema(&field, schema)?;
        }
        Ok(())
    }

    /// The checks of [`crate::tool_sources`] fields that need no catalogue:
    /// MCP sources name a server and at least one valid tool, listed once;
    /// HTTP tools have valid names distinct from every other tool, compiling
    /// schemas, `http(s)` URLs and non-zero limits; policies name a tool and
    /// set a non-zero timeout; the provider name is not blank. `names` holds
    /// the tool names taken so far.
    fn validate_tool_sources<'a>(
        &'a self,
        names: &mut std::collections::HashSet<&'a str>,
    ) -> Result<(), ConfigError> {
        let mut servers = std::collections::HashSet::new();
        for (i, source) in self.mcp.iter().enumerate() {
            if source.server.trim().is_empty() {
                return Err(config_error(format!("mcp[{i}].server"), "is blank"));
            }
            if !servers.insert(source.server.as_str()) {
                return Err(config_error(
                    format!("mcp[{i}].server"),
                    format!("{:?} is listed twice; merge the allow lists", source.server),
                ));
            }
            if source.allow.is_empty() {
                return Err(config_error(
                    format!("mcp[{i}].allow"),
                    "is empty: list the server's tools the model may call",
                ));
            }
            for (j, name) in source.allow.iter().enumerate() {
                // A server's own name may be any text (`calendar.read`):
                // the model is offered its provider-safe form
                // ([`crate::tool_names`]); either form may be written.
                check_mcp_tool_name(&format!("mcp[{i}].allow[{j}]"), name)?;
                if let Some(k) = source.allow[..j].iter().position(|n| same_tool(n, name)) {
                    return Err(config_error(
                        format!("mcp[{i}].allow[{j}]"),
                        format!(
                            "{name:?} names the same tool as mcp[{i}].allow[{k}] ({:?})",
                            source.allow[k]
                        ),
                    ));
                }
            }
        }
        for (i, t) in self.http_tools.iter().enumerate() {
            let field = |f: &str| format!("http_tools[{i}].{f}");
            if !TOOL_NAME.is_match(&t.name) {
                return Err(config_error(
                    field("name"),
                    format!("{:?} must match ^[a-zA-Z0-9_-]{{1,64}}$", t.name),
                ));
            }
            if t.name == OUTPUT_TOOL || !names.insert(t.name.as_str()) {
                return Err(config_error(
                    field("name"),
                    format!("{:?} is taken by another tool", t.name),
                ));
            }
            compile_tool_schema(&t.input_schema)
                .map_err(|reason| config_error(field("input_schema"), reason))?;
            crate::tool_sources::url_origin(&t.url)
                .map_err(|reason| config_error(field("url"), reason))?;
            if t.timeout_ms == 0 {
                return Err(config_error(field("timeout_ms"), "must be at least 1"));
            }
            if t.max_response_bytes == 0 {
                return Err(config_error(
                    field("max_response_bytes"),
                    "must be at least 1",
                ));
            }
        }
        for (name, policy) in &self.tool_policy {
            // Any other tool's name matches the grammar; a name that does
            // not must be an MCP tool's, as an allow list writes it.
            if !TOOL_NAME.is_match(name) {
                check_mcp_tool_name(&format!("tool_policy.{name}"), name)?;
                if !self.mcp_allows(name) {
                    return Err(config_error(
                        format!("tool_policy.{name}"),
                        "must name a tool: ^[a-zA-Z0-9_-]{1,64}$, or an MCP tool's own name that an mcp[].allow list names (either form)",
                    ));
                }
            }
            if let Some(other) = self
                .tool_policy
                .keys()
                .find(|k| *k < name && same_tool(k, name))
            {
                return Err(config_error(
                    format!("tool_policy.{name}"),
                    format!(
                        "names the same tool as tool_policy.{other} (one is the other's provider-safe form); keep one"
                    ),
                ));
            }
            if policy.timeout_ms == Some(0) {
                return Err(config_error(
                    format!("tool_policy.{name}.timeout_ms"),
                    "must be at least 1",
                ));
            }
            if policy.max_total_ms == Some(0) {
                return Err(config_error(
                    format!("tool_policy.{name}.max_total_ms"),
                    "must be at least 1",
                ));
            }
            let not_mcp = self.http_tools.iter().any(|t| t.name == *name)
                || self.external_tools.iter().any(|t| t.name == *name)
                || self.tools.iter().flatten().any(|t| t == name);
            if policy.max_total_ms.is_some() && not_mcp {
                return Err(config_error(
                    format!("tool_policy.{name}.max_total_ms"),
                    "applies to MCP tools only: this run's other tools report no progress, and their timeout_ms bounds the whole call",
                ));
            }
            if let (Some(timeout_ms), total @ Some(_)) = (policy.timeout_ms, policy.max_total_ms) {
                crate::tool_sources::resolve_max_total_ms(timeout_ms, total).map_err(|reason| {
                    config_error(format!("tool_policy.{name}.max_total_ms"), reason)
                })?;
            }
            if let Some(bytes) = policy.max_result_bytes {
                check_result_bytes(&format!("tool_policy.{name}.max_result_bytes"), bytes)?;
            }
        }
        check_result_bytes("max_result_bytes", self.max_result_bytes)?;
        // --- issue 32: waits ---
        for (i, name) in self.builtin_tools.iter().enumerate() {
            if !crate::wait::BUILTIN_TOOLS.contains(&name.as_str()) {
                return Err(config_error(
                    format!("builtin_tools[{i}]"),
                    format!(
                        "{name:?} is not a built-in tool; the built-in tools are {}",
                        crate::wait::BUILTIN_TOOLS.join(", ")
                    ),
                ));
            }
            if self.builtin_tools[..i].contains(name) {
                return Err(config_error(
                    format!("builtin_tools[{i}]"),
                    format!("{name:?} is listed twice"),
                ));
            }
            if self.external_tools.iter().any(|t| t.name == *name)
                || self.http_tools.iter().any(|t| t.name == *name)
                || self.tools.iter().flatten().any(|t| t == name)
            {
                return Err(config_error(
                    format!("builtin_tools[{i}]"),
                    format!(
                        "{name:?} is also the name of another tool of the run; rename that one"
                    ),
                ));
            }
        }
        // --- end waits ---
        if self.provider.as_ref().is_some_and(|p| p.trim().is_empty()) {
            return Err(config_error("provider", "is blank"));
        }
        Ok(())
    }

    /// Every check that needs no worker: the bounds of [`crate::limits`]
    /// (counted before anything compiles); the model is named; the per-turn
    /// caps are at least 1; external tools have valid, distinct names (not
    /// [`OUTPUT_TOOL`]) and input schemas that compile
    /// ([`compile_tool_schema`]); policies name a tool and their `args`
    /// regexes compile; the output schema compiles. The dispatcher runs it at
    /// admission (422), the CLI before it submits or runs, the worker before
    /// `session.start`.
    ///
    /// Errors: the first problem, naming its field.
    ///
    /// ```
    /// let mut config = glia_proto::RunConfig::default();
    /// config.output_schema = Some(serde_json::json!({"type": "bogus"}));
    /// assert_eq!(config.validate().unwrap_err().field, "output_schema");
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        // Counts and sizes first, before anything is compiled.
        self.check_limits()?;
        if self.model.trim().is_empty() {
            return Err(config_error("model", "is blank"));
        }
        if self.max_model_calls_per_turn == 0 {
            return Err(config_error(
                "max_model_calls_per_turn",
                "must be at least 1",
            ));
        }
        if self.max_tokens == 0 {
            return Err(config_error("max_tokens", "must be at least 1"));
        }
        let mut hooks = std::collections::HashSet::new();
        for (i, h) in self.hooks.iter().enumerate() {
            if !TOOL_NAME.is_match(h) {
                return Err(config_error(
                    format!("hooks[{i}]"),
                    format!("{h:?} must match ^[a-zA-Z0-9_-]{{1,64}}$ (a catalogue hook's name)"),
                ));
            }
            if !hooks.insert(h.as_str()) {
                return Err(config_error(
                    format!("hooks[{i}]"),
                    format!("{h:?} is listed twice"),
                ));
            }
        }
        let mut names = std::collections::HashSet::new();
        for (i, t) in self.external_tools.iter().enumerate() {
            let field = |f: &str| format!("external_tools[{i}].{f}");
            if !TOOL_NAME.is_match(&t.name) {
                return Err(config_error(
                    field("name"),
                    format!("{:?} must match ^[a-zA-Z0-9_-]{{1,64}}$", t.name),
                ));
            }
            if t.name == OUTPUT_TOOL {
                return Err(config_error(
                    field("name"),
                    format!("{:?} is reserved for the output schema's tool", t.name),
                ));
            }
            if !names.insert(t.name.as_str()) {
                return Err(config_error(
                    field("name"),
                    format!("{:?} is listed twice", t.name),
                ));
            }
            compile_tool_schema(&t.input_schema)
                .map_err(|reason| config_error(field("input_schema"), reason))?;
            if t.source.is_some() {
                return Err(config_error(
                    field("source"),
                    "is set by the worker; an external tool has none",
                ));
            }
            if t.policy.is_some() {
                return Err(config_error(
                    field("policy"),
                    "is set by the worker (use tool_policy and policies)",
                ));
            }
            if t.max_result_bytes.is_some() {
                return Err(config_error(
                    field("max_result_bytes"),
                    "is set by the worker (use tool_policy.NAME.max_result_bytes)",
                ));
            }
            if t.output_schema.is_some() {
                return Err(config_error(
                    field("output_schema"),
                    "is set by the worker from an MCP tool's outputSchema; an external tool has none",
                ));
            }
        }
        self.validate_tool_sources(&mut names)?;
        self.validate_agents(&mut names)?;
        if let Some(recorded) = &self.recorded_tools {
            recorded.validate()?;
            // Built-in waits the run enables are offered beside them.
            if let Some((i, t)) = recorded
                .tools
                .iter()
                .enumerate()
                .find(|(_, t)| self.builtin_tools.contains(&t.name))
            {
                return Err(config_error(
                    format!("recorded_tools.tools[{i}].name"),
                    format!("{:?} is a built-in tool the run enables", t.name),
                ));
            }
        }
        self.on_tool_source_unavailable
            .validate()
            .map_err(|(field, reason)| {
                config_error(format!("on_tool_source_unavailable.{field}"), reason)
            })?;
        for (i, p) in self.policies.iter().enumerate() {
            if p.tool.trim().is_empty() {
                return Err(config_error(
                    format!("policies[{i}].tool"),
                    "is blank (use \"*\" for any tool)",
                ));
            }
            if p.tool != "*" && !TOOL_NAME.is_match(&p.tool) {
                check_mcp_tool_name(&format!("policies[{i}].tool"), &p.tool)?;
            }
            if let Some(re) = &p.args
                && let Err(e) = crate::limits::compile_regex(re, self.policies.len())
            {
                return Err(config_error(
                    format!("policies[{i}].args"),
                    format!("not a valid regex: {e}"),
                ));
            }
        }
        if let Some(schema) = &self.output_schema {
            compile_tool_schema(schema).map_err(|reason| config_error("output_schema", reason))?;
        }
        let (declared, complete) = self.declared_tool_names();
        self.validate_tool_names(&declared, complete)?;
        self.guardrails
            .compile()
            .map_err(|e| config_error(format!("guardrails.{}", e.field), e.reason))?;
        if let Some(c) = &self.compaction {
            c.validate()
                .map_err(|e| config_error(format!("compaction.{}", e.field), e.reason))?;
        }
        Ok(())
    }
}

impl RunConfig {
    /// Issue 32, child runs: `agents` well formed (`name` or
    /// `name@VERSION`), each named once, no name taken by an external or
    /// HTTP tool or the output tool, and `child_agents`, when set, naming
    /// the same agents in the same order. Errors name `agents[i]`.
    fn validate_agents<'a>(
        &'a self,
        names: &mut std::collections::HashSet<&'a str>,
    ) -> Result<(), ConfigError> {
        if self.agents.len() > crate::children::MAX_AGENTS {
            return Err(config_error(
                "agents",
                format!(
                    "{} agents; at most {}",
                    self.agents.len(),
                    crate::children::MAX_AGENTS
                ),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, a) in self.agents.iter().enumerate() {
            let field = format!("agents[{i}]");
            let (name, _) = crate::children::parse_agent_ref(a)
                .map_err(|reason| config_error(field.clone(), format!("{a:?}: {reason}")))?;
            if !seen.insert(name) {
                return Err(config_error(
                    field,
                    format!("agent {name:?} is listed twice"),
                ));
            }
            if name == OUTPUT_TOOL || !names.insert(name) {
                return Err(config_error(
                    field,
                    format!("the tool name {name:?} is taken by another tool"),
                ));
            }
            if let Some(tools) = &self.tools
                && tools.iter().any(|t| t == name)
            {
                return Err(config_error(
                    field,
                    format!("the tool name {name:?} is taken by a tool in `tools`"),
                ));
            }
        }
        if !self.child_agents.is_empty() {
            let same = self.child_agents.len() == self.agents.len()
                && self.child_agents.iter().zip(&self.agents).all(|(c, a)| {
                    crate::children::parse_agent_ref(a).is_ok_and(|(name, version)| {
                        c.name == name && version.is_none_or(|v| v == c.version)
                    })
                });
            if !same {
                return Err(config_error(
                    "child_agents",
                    "does not match `agents` (it is set by the dispatcher)",
                ));
            }
        }
        Ok(())
    }

    /// The tool names this config offers by itself: its external tools,
    /// HTTP tools, the MCP tools its `mcp[].allow` lists name, its `tools`
    /// list and the output tool when it has an output schema. The second
    /// value says whether that is every tool the run can be offered: false
    /// when `tools` is unset (the worker's registered tools are offered too,
    /// and only the worker knows them).
    pub fn declared_tool_names(&self) -> (Vec<&str>, bool) {
        let mut names: Vec<&str> = self
            .external_tools
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        names.extend(self.http_tools.iter().map(|t| t.name.as_str()));
        names.extend(
            self.mcp
                .iter()
                .flat_map(|s| s.allow.iter().map(String::as_str)),
        );
        names.extend(self.tools.iter().flatten().map(String::as_str));
        names.extend(self.builtin_tools.iter().map(String::as_str));
        // Issue 32: the agents offered as tools, by name.
        names.extend(
            self.agents
                .iter()
                .filter_map(|a| crate::children::parse_agent_ref(a).ok().map(|(n, _)| n)),
        );
        if self.output_schema.is_some() {
            names.push(OUTPUT_TOOL);
        }
        (names, self.tools.is_some())
    }

    /// Every tool name the config writes — `tools[i]`, `policies[i].tool`
    /// (but `*`) and `tool_policy.NAME` — names one of `offered`
    /// ([`same_tool`]: byte for byte, or an MCP tool's own name and its
    /// provider-safe form; no case folding, no `-`/`_` equivalence: two
    /// names never become one). With `complete` false (`offered` may lack
    /// tools only the worker knows), a name that is not offered is refused
    /// only when it is a near miss of one that is (the same but for case or
    /// `-`/`_`) or cannot be a worker tool's (outside the provider grammar);
    /// the worker checks again with every tool at step start (offering
    /// each MCP tool's own name beside the name the model sees).
    ///
    /// Errors: the field's path (`tool_policy.issue-credit`,
    /// `policies[0].tool`) and a reason with the nearest offered name
    /// (`did you mean "issue_credit"?`).
    ///
    /// ```
    /// let mut config = glia_proto::RunConfig::default();
    /// config.policies.push(glia_proto::Policy { tool: "issue-credit".into(), args: None, action: glia_proto::PolicyAction::RequireApproval });
    /// let e = config.validate_tool_names(&["issue_credit"], true).unwrap_err();
    /// assert_eq!(e.field, "policies[0].tool");
    /// assert!(e.reason.contains("did you mean \"issue_credit\"?"), "{}", e.reason);
    /// ```
    pub fn validate_tool_names(&self, offered: &[&str], complete: bool) -> Result<(), ConfigError> {
        let mut written: Vec<(String, &str)> = Vec::new();
        written.extend(
            self.tools
                .iter()
                .flatten()
                .enumerate()
                .map(|(i, n)| (format!("tools[{i}]"), n.as_str())),
        );
        written.extend(
            self.policies
                .iter()
                .enumerate()
                .filter(|(_, p)| p.tool != "*")
                .map(|(i, p)| (format!("policies[{i}].tool"), p.tool.as_str())),
        );
        written.extend(
            self.tool_policy
                .keys()
                .map(|n| (format!("tool_policy.{n}"), n.as_str())),
        );
        for (field, name) in written {
            if offered.iter().any(|o| same_tool(o, name)) {
                continue;
            }
            // Only an MCP tool's name can fall outside the grammar, and
            // every MCP tool is offered through an allow list: such a name
            // that matches none is refused even when `offered` is partial.
            if !complete && TOOL_NAME.is_match(name) && near_miss(name, offered).is_none() {
                continue;
            }
            let hint = nearest(name, offered)
                .map(|n| format!("; did you mean {n:?}?"))
                .unwrap_or_default();
            let reason =
                format!("{name:?} is not a tool this run is offered (names match exactly){hint}");
            return Err(config_error(field, reason));
        }
        Ok(())
    }
}

/// Check a name written for an MCP tool: not empty, at most
/// [`MAX_TOOL_NAME_BYTES`] bytes, no control characters.
fn check_mcp_tool_name(field: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() {
        return Err(config_error(field, "is empty: name a tool"));
    }
    if name.len() > MAX_TOOL_NAME_BYTES {
        return Err(over(
            field,
            format!("a {}-byte tool name", name.len()),
            MAX_TOOL_NAME_BYTES,
            "max_tool_name_bytes",
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(config_error(
            field,
            format!("{name:?} holds a control character"),
        ));
    }
    Ok(())
}

impl RunConfig {
    /// Whether an `mcp[].allow` list names `name` (either form, [`same_tool`]).
    fn mcp_allows(&self, name: &str) -> bool {
        self.mcp
            .iter()
            .flat_map(|s| &s.allow)
            .any(|a| same_tool(a, name))
    }

    /// The `tool_policy` entry for the offered tool `name` (the name the
    /// model sees): the one keyed by `name` itself or, for an MCP tool, by
    /// its own name (`validate` refuses two keys naming one tool).
    ///
    /// ```
    /// let mut config = glia_proto::RunConfig::default();
    /// config.tool_policy.insert("calendar.read".into(), glia_proto::ToolPolicy { requires_approval: Some(true), ..Default::default() });
    /// let offered = glia_proto::tool_names::provider_tool_name("calendar.read");
    /// assert_eq!(config.tool_policy_for(&offered).and_then(|p| p.requires_approval), Some(true));
    /// ```
    pub fn tool_policy_for(&self, name: &str) -> Option<&crate::tool_sources::ToolPolicy> {
        self.tool_policy.get(name).or_else(|| {
            self.tool_policy
                .iter()
                .find(|(k, _)| same_tool(k, name))
                .map(|(_, p)| p)
        })
    }
}

impl Policy {
    /// Whether this policy is about calls of the offered tool `tool` (the
    /// name the model calls): `*`, or a name that names it ([`same_tool`]).
    pub fn applies_to(&self, tool: &str) -> bool {
        self.tool == "*" || same_tool(&self.tool, tool)
    }
}

/// The fold two names that are easy to mistake for each other share:
/// lowercase, `-` as `_`. Used for hints and refusals only, never to match.
fn folded(name: &str) -> String {
    name.to_ascii_lowercase().replace('-', "_")
}

/// An offered name `name` differs from only in case or `-`/`_` (a name
/// that is easy to mistake for it; never used to match).
pub fn near_miss<'a>(name: &str, offered: &[&'a str]) -> Option<&'a str> {
    let key = folded(name);
    offered
        .iter()
        .copied()
        .find(|o| *o != name && folded(o) == key)
}

/// The offered name closest to `name`, for a "did you mean" hint: a
/// [`near_miss`], else the one fewest edits away (at most a third of the
/// name's length, at least 1), ignoring case and `-`/`_`.
pub fn nearest<'a>(name: &str, offered: &[&'a str]) -> Option<&'a str> {
    near_miss(name, offered).or_else(|| {
        offered
            .iter()
            .copied()
            .map(|o| (strsim::damerau_levenshtein(&folded(name), &folded(o)), o))
            .filter(|(d, _)| *d <= (name.chars().count() / 3).max(1))
            .min_by_key(|(d, o)| (*d, *o))
            .map(|(_, o)| o)
    })
}

/// A declarative rule over tool calls: tool name (exact, or `*` for any) and
/// an optional regex over the arguments' canonical JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Tool name or `*`.
    #[cfg_attr(
        feature = "schemars",
        schemars(pattern(crate::config_error::NOT_BLANK))
    )]
    pub tool: String,
    /// Regex (Rust `regex` syntax) searched in the canonical JSON of the
    /// arguments (see [`crate::canonical_json`]); `None` matches any arguments.
    #[serde(default)]
    #[cfg_attr(feature = "schemars", schemars(extend("format" = "regex")))]
    pub args: Option<String>,
    /// What happens on a match.
    pub action: PolicyAction,
}

/// The effect of a matching [`Policy`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum PolicyAction {
    /// Run the call.
    Allow,
    /// Do not run it; the model sees an error result with the reason.
    Deny {
        /// Shown to the model.
        reason: String,
    },
    /// Park at `awaiting_approval` until a person decides.
    RequireApproval,
    /// Run it and prepend a marked reminder to the result the model sees.
    Remind {
        /// Reminder text.
        text: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guardrails::TextRule;

    fn rule(i: usize, pattern: &str) -> TextRule {
        TextRule {
            name: format!("r{i}"),
            deny: Some(pattern.into()),
            ..TextRule::default()
        }
    }

    #[test]
    fn counts_are_checked_before_anything_compiles() {
        let mut config = RunConfig::default();
        config.guardrails.input = (0..500).map(|i| rule(i, "x{19999}")).collect();
        let e = config.validate().unwrap_err();
        assert_eq!(e.field, "guardrails.input");
        assert!(
            e.reason.contains("500 rules") && e.reason.contains("max_guardrail_rules"),
            "{e}"
        );
        // 64 rules pass the count, but each one's share of the budget is too small for x{19999}.
        config.guardrails.input.truncate(64);
        let e = config.validate().unwrap_err();
        assert_eq!(e.field, "guardrails.input[0].deny");
        assert!(e.reason.contains("size limit"), "{e}");
        config.guardrails.input = vec![
            rule(0, r"\b\d{4}[ -]?\d{4}[ -]?\d{4}[ -]?\d{4}\b"),
            TextRule {
                name: "email".into(),
                redact: Some(r"[\w.+-]+@[\w-]+\.[\w.]+".into()),
                ..TextRule::default()
            },
        ];
        config.validate().unwrap();
        config.guardrails.input = (0..64)
            .map(|i| rule(i, r"[\w.+-]+@[\w-]+\.[\w.]+"))
            .collect();
        config.validate().unwrap();
    }

    #[test]
    fn schemas_are_bounded_in_depth_and_size() {
        let mut deep = serde_json::json!({"type": "object"});
        for _ in 0..40 {
            deep = serde_json::json!({"type": "object", "properties": {"a": deep}});
        }
        let e = check_schema("output_schema", &deep).unwrap_err();
        assert!(e.reason.contains("max_schema_depth"), "{e}");
        let big = serde_json::json!({"type": "object", "description": "x".repeat(crate::limits::MAX_SCHEMA_BYTES)});
        let e = check_schema("output_schema", &big).unwrap_err();
        assert!(e.reason.contains("max_schema_bytes"), "{e}");
        let mut config = RunConfig {
            tools: Some((0..129).map(|i| format!("t{i}")).collect()),
            ..RunConfig::default()
        };
        assert_eq!(config.validate().unwrap_err().field, "tools");
        config.tools = None;
        config.output_schema = Some(deep);
        assert_eq!(config.validate().unwrap_err().field, "output_schema");
    }

    /// `on_tool_source_unavailable` is parsed strictly and bounded, each
    /// error naming its field.
    #[test]
    fn tool_source_policy_is_strict_and_bounded() {
        let config: RunConfig = serde_json::from_value(serde_json::json!({
            "on_tool_source_unavailable": {"attempts": 2, "then": "fail"}
        }))
        .unwrap();
        let policy = config.on_tool_source_unavailable;
        assert_eq!(
            (policy.attempts, policy.backoff_ms, policy.then),
            (2, 1_000, crate::tool_sources::UnavailableAction::Fail)
        );
        config.validate().unwrap();
        let unknown = serde_json::from_value::<RunConfig>(serde_json::json!({
            "on_tool_source_unavailable": {"tries": 2}
        }));
        assert!(
            unknown
                .unwrap_err()
                .to_string()
                .contains("unknown field `tries`")
        );
        for (field, value) in [("attempts", 0u64), ("attempts", 21), ("backoff_ms", 60_001)] {
            let config: RunConfig = serde_json::from_value(serde_json::json!({
                "on_tool_source_unavailable": {field: value}
            }))
            .unwrap();
            assert_eq!(
                config.validate().unwrap_err().field,
                format!("on_tool_source_unavailable.{field}")
            );
        }
    }
}

// --- issue 32: waits ---
/// The built-in wait tool `name` ([`crate::wait`]) as offered to the model, or `None` for a name
/// that is not one of [`crate::wait::BUILTIN_TOOLS`].
pub fn builtin_tool_spec(name: &str) -> Option<ToolSpec> {
    let (description, schema) = match name {
        crate::wait::SLEEP => (
            "Pause this task for a number of seconds, then continue. Nothing runs while it sleeps; the result says when it woke.",
            serde_json::json!({
                "type": "object",
                "properties": {"seconds": {"type": "number", "minimum": 0, "maximum": crate::wait::MAX_WAIT_MS / 1000,
                    "description": "How long to sleep, in seconds (fractions allowed; at most 366 days)."}},
                "required": ["seconds"],
                "additionalProperties": false
            }),
        ),
        crate::wait::WAIT_UNTIL => (
            "Pause this task until a time, then continue. A time already past continues at once.",
            serde_json::json!({
                "type": "object",
                "properties": {"time": {"type": "string",
                    "description": "RFC 3339 time with an offset, e.g. 2026-12-07T10:00:00Z (at most 366 days ahead)."}},
                "required": ["time"],
                "additionalProperties": false
            }),
        ),
        crate::wait::WAIT_FOR_EVENT => (
            "Pause this task until an event with this key is posted, or the timeout passes. The result is the event's payload, or {\"timed_out\": true}.",
            serde_json::json!({
                "type": "object",
                "properties": {
                    "key": {"type": "string", "pattern": crate::wait::EVENT_KEY_PATTERN,
                        "description": "The event key: letters, digits and . _ : / @ -, 1 to 200 characters."},
                    "timeout_seconds": {"type": "number", "minimum": 0, "maximum": crate::wait::MAX_WAIT_MS / 1000,
                        "description": "Give up after this many seconds (default and most: 366 days)."}
                },
                "required": ["key"],
                "additionalProperties": false
            }),
        ),
        _ => return None,
    };
    Some(ToolSpec {
        name: name.to_owned(),
        description: description.to_owned(),
        input_schema: schema,
        idempotent: true,
        timeout_ms: 30_000,
        external: false,
        return_direct: false,
        cancel_grace_ms: DEFAULT_CANCEL_GRACE_MS,
        source: None,
        policy: None,
        max_result_bytes: None,
        output_schema: None,
    })
}

#[cfg(test)]
mod builtin_tests {
    #[test]
    fn every_builtin_has_a_schema_that_compiles() {
        for name in crate::wait::BUILTIN_TOOLS {
            let spec = super::builtin_tool_spec(name).unwrap();
            super::compile_tool_schema(&spec.input_schema).unwrap();
        }
        assert!(super::builtin_tool_spec("nap").is_none());
    }
}
// --- end waits ---
