//! A run's configuration: recorded once in `session.start`, so replay and
//! every worker see the same settings.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::budget::{BudgetLimits, Pricing};
use crate::stop::StopPolicy;

/// Default cap on model calls within one turn (one user input to one answer).
pub const DEFAULT_MAX_MODEL_CALLS_PER_TURN: u32 = 16;
/// Default cap on re-asks after a rejected answer.
pub const DEFAULT_MAX_REASKS: u32 = 2;

/// What a run is allowed to do and how it is driven.
///
/// JSON example: `{"model": "claude-sonnet-4-5", "system": "You are …",
/// "policies": [{"tool": "refund", "action": {"kind": "require_approval"}}],
/// "budget": {"max_turns": 20}, "conversational": true}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunConfig {
    /// Provider model name, e.g. `claude-sonnet-4-5`.
    pub model: String,
    /// Stable system prompt (the cacheable prefix).
    pub system: String,
    /// Names of the worker's registered tools this run may call; `None` = all.
    pub tools: Option<Vec<String>>,
    /// Client-executed tools: the run parks at `awaiting_tool` until a result
    /// is posted.
    pub external_tools: Vec<ToolSpec>,
    /// Declarative tool-call policies, first match wins; no match = allow.
    pub policies: Vec<Policy>,
    /// Per-run budget.
    pub budget: BudgetLimits,
    /// Model calls allowed per turn; a wrap-up notice precedes the last one.
    pub max_model_calls_per_turn: u32,
    /// When true the run parks at `awaiting_input` after each answer instead of
    /// finishing; it finishes when the caller closes it.
    pub conversational: bool,
    /// Which planner drafts the plan.
    pub planner: PlannerKind,
    /// JSON Schema of the final answer; when set the model answers through the
    /// forced tool [`crate::OUTPUT_TOOL`] and its arguments are validated.
    pub output_schema: Option<Value>,
    /// Re-asks allowed after a rejected answer (guardrail or invalid output).
    pub max_reasks: u32,
    /// Prices for cost accounting; `None` counts cost as zero.
    pub pricing: Option<Pricing>,
    /// Output token cap per model call.
    pub max_tokens: u32,
    /// How long an approval may wait, in ms; `None` waits forever.
    pub approval_timeout_ms: Option<u64>,
    /// What the reconciler does with an approval past its deadline.
    pub on_approval_timeout: ApprovalTimeout,
    /// What happens to a non-idempotent call whose worker died while it ran
    /// (an idempotent one simply runs again with the same idempotency key).
    pub on_interrupted_call: InterruptedCall,
    /// What the loop does with an answer that is not a finished turn (cut off
    /// by the output limit, empty, refused, filtered, an unknown stop
    /// reason): re-ask, pause or fail, per class. See [`crate::stop`].
    pub stop_reasons: StopPolicy,
}

/// What happens to a non-idempotent tool call a crash interrupted: it was
/// cleared and started, and nobody knows whether it took effect.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
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
        }
    }
}

/// Which planner a run uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
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
pub struct ToolSpec {
    /// Name, `^[a-zA-Z0-9_-]{1,64}$`.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON Schema of the arguments object.
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
}

fn default_timeout_ms() -> u64 {
    30_000
}

/// A declarative rule over tool calls: tool name (exact, or `*` for any) and
/// an optional regex over the arguments' canonical JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    /// Tool name or `*`.
    pub tool: String,
    /// Regex searched in the canonical JSON of the arguments (see
    /// [`crate::canonical_json`]); `None` matches any arguments.
    #[serde(default)]
    pub args: Option<String>,
    /// What happens on a match.
    pub action: PolicyAction,
}

/// The effect of a matching [`Policy`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
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
