//! The event catalogue: everything that happens to a run, as records.
//!
//! An [`Event`] is an envelope (`run_id`, `seq`, `at`) around an [`EventKind`]
//! whose JSON tag is the dotted name (`{"type": "tool.call", "data": {…}}`).
//! Events are observations: replaying them never calls a model, a tool or a
//! hook again. [`LiveEvent`]s (`model.delta`, `model.discard`,
//! `tool.progress`) are pushed to subscribers and never persisted.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::budget::{BudgetLimits, BudgetUsage, Limit, Spend};
use crate::config::{RunConfig, ToolSpec};
use crate::guardrails::Redaction;
use crate::stop::RejectedAnswer;
use crate::{Message, ToolContent, Usage};

/// One persisted event of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The run.
    pub run_id: Uuid,
    /// Position in the run's log: 1, 2, 3 … with no gaps.
    pub seq: u64,
    /// When it was recorded (UTC).
    pub at: DateTime<Utc>,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// The catalogue. The serde tag is the event's dotted name.
// `session.start` carries the run's whole config, once per run; boxing it
// would change every construction and match of the contract for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum EventKind {
    /// The run was admitted: its goal and configuration.
    #[serde(rename = "session.start")]
    SessionStart {
        /// The goal, the first user message (after the input redact rules).
        goal: String,
        /// Configuration for the whole run.
        config: RunConfig,
        /// The input redact rules that matched the goal (`Guardrails`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        redactions: Vec<Redaction>,
    },
    /// A planner proposed steps.
    #[serde(rename = "plan.draft")]
    PlanDraft {
        /// Step descriptions.
        steps: Vec<String>,
        /// Tokens the planner's model call used (zero for the default planner).
        usage: Usage,
        /// Its cost in USD micros.
        cost_usd_micros: u64,
    },
    /// The drafted plan became the active plan.
    #[serde(rename = "plan.commit")]
    PlanCommit {
        /// Step descriptions; an empty plan finishes the run (`PLANNING → DONE`).
        steps: Vec<String>,
    },
    /// A step began, with the tool list frozen for it.
    #[serde(rename = "step.start")]
    StepStart {
        /// Zero-based index in the plan.
        index: usize,
        /// The step's description.
        description: String,
        /// The tools the model is offered during this step, frozen.
        tools: Vec<ToolSpec>,
    },
    /// A step ended.
    #[serde(rename = "step.end")]
    StepEnd {
        /// Zero-based index in the plan.
        index: usize,
        /// The model's final text for the step (empty when skipped).
        answer: String,
        /// True when a hook skipped the step.
        #[serde(default)]
        skipped: bool,
    },
    /// A model call was sent.
    #[serde(rename = "model.call")]
    ModelCall {
        /// Model name.
        model: String,
        /// Messages in the request (after repair).
        messages: usize,
        /// Whether the wrap-up notice was attached (last call of the turn).
        wrap_up: bool,
        /// Name of the tool the call forced, if any.
        forced_tool: Option<String>,
    },
    /// An attempt of the model call in flight failed and was retried: recorded
    /// after `model.call`, before the `model.response` (or the `error`) of
    /// the same call, one per failed attempt. Changes nothing in the state;
    /// the text a failed attempt streamed was discarded (see
    /// [`LiveEvent::ModelDiscard`]).
    #[serde(rename = "model.retry")]
    ModelRetry(Retry),
    /// A message of the conversation was replaced by a marked elision
    /// ([`crate::repair::elide`]) because the provider refused to process it.
    /// Recorded while a model call is in flight, before its `model.response`,
    /// so a resumed run sends the elided history.
    #[serde(rename = "message.elided")]
    MessageElided {
        /// Index of the message in the run's conversation
        /// ([`crate::RunState::messages`]).
        index: usize,
        /// Why, e.g. `provider refusal`.
        reason: String,
    },
    /// The model answered.
    #[serde(rename = "model.response")]
    ModelResponse {
        /// The assistant message, appended to the conversation.
        message: Message,
        /// Tokens used.
        usage: Usage,
        /// Provider stop reason (`end_turn`, `tool_use`, `max_tokens`, …).
        stop_reason: String,
        /// Active time of the call in ms.
        duration_ms: u64,
        /// Cost in USD micros.
        cost_usd_micros: u64,
        /// Set when the loop did not accept the answer (its stop reason is
        /// not a finished turn; see [`crate::stop`]): the message is kept
        /// here but not added to the conversation, its tool calls are not
        /// run, and `rejected.action` says what follows (a re-ask notice,
        /// `session.pause`, or a failed `session.complete`). Usage and cost
        /// count either way.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rejected: Option<RejectedAnswer>,
        /// The output redact rules that matched the message's text blocks
        /// (`Guardrails`); `message` holds the redacted text.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        redactions: Vec<Redaction>,
    },
    /// A tool call was decided on (after hooks and policies), before it runs.
    #[serde(rename = "tool.call")]
    ToolCall(ToolCallRecord),
    /// A tool call produced a result.
    #[serde(rename = "tool.result")]
    ToolResult {
        /// The call.
        call_id: String,
        /// The whole result: text (JSON results serialised), or text and
        /// image blocks ([`ToolContent`]; a string in logs written before).
        /// The model sees it cut to the tool's result budget
        /// ([`crate::ToolSpec::max_result_bytes`], [`ToolContent::cut`]).
        content: ToolContent,
        /// Policy reminder shown to the model before `content`.
        reminder: Option<String>,
        /// Active time of the call in ms (0 for external results).
        duration_ms: u64,
        /// The `tool_results` redact rules that matched (`Guardrails`);
        /// `content` holds the redacted text.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        redactions: Vec<Redaction>,
    },
    /// A tool call failed; the model sees `message` as an error result.
    #[serde(rename = "tool.error")]
    ToolError {
        /// The call.
        call_id: String,
        /// Why.
        error: ToolErrorKind,
        /// The text the model sees (cut, like a result, to the tool's
        /// result budget).
        message: String,
        /// Active time spent in ms.
        duration_ms: u64,
    },
    /// The result that follows (the next event, a `tool.result` or
    /// `tool.error` of the same call) was not committed by the worker that
    /// ran the call: that worker held it in the ledger under the call's
    /// idempotency key and lost its lease before its commit landed, and
    /// this worker found it there instead of treating the call as
    /// interrupted. The call ran once; nobody was asked again. No state
    /// changes.
    #[serde(rename = "tool.recovered")]
    ToolRecovered {
        /// The call.
        call_id: String,
        /// The key the result was held under (`{run_id}:{turn}:{call_id}`).
        idempotency_key: String,
    },
    /// A tool source the run names could not list its tools before a step
    /// (an MCP server down, not answering `tools/list`, past the listing's
    /// deadline, or listing pages without end). Recorded once per failed
    /// attempt, before the run is tried again after `retry_in_ms`; the
    /// attempt that reaches `RunConfig::on_tool_source_unavailable.attempts`
    /// has no `retry_in_ms` and is followed by `session.pause`
    /// ([`PauseReason::ToolSource`]) or a failed `session.complete`. Counts
    /// the attempts in the state (a `step.start`, or the resume of that
    /// pause, starts the count again).
    #[serde(rename = "tool_source.unavailable")]
    ToolSourceUnavailable {
        /// The catalogue name of the server (`mcp[i].server`).
        server: String,
        /// Why, as glia saw it (not connected and the last connection
        /// error; `tools/list` failed, timed out, or paged without end).
        reason: String,
        /// The failed attempt, from 1, counted since the last step start.
        attempt: u32,
        /// When the run is tried again, in ms; absent at the last attempt.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_in_ms: Option<u64>,
    },
    /// The tools a step is offered differ from the previous step's: the
    /// servers' lists changed meanwhile (`notifications/tools/list_changed`,
    /// a restart), or the run continued on another worker whose servers or
    /// tools differ. Recorded just before the `step.start` that holds the
    /// new list. No state changes.
    #[serde(rename = "tools.changed")]
    ToolsChanged {
        /// Names offered now and not in the previous step, sorted.
        added: Vec<String>,
        /// Names of the previous step no longer offered, sorted.
        removed: Vec<String>,
        /// Names in both whose offer differs (description, input schema,
        /// source or resolved policy), sorted.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        changed: Vec<String>,
    },
    /// A call waits for a person.
    #[serde(rename = "approval.requested")]
    ApprovalRequested {
        /// The call.
        call_id: String,
        /// Tool name.
        tool: String,
        /// Arguments shown to the approver.
        input: Value,
        /// Hash the decision must quote (see [`crate::args_hash`]).
        args_hash: String,
        /// When the approval expires (`RunConfig::approval_timeout_ms`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at: Option<DateTime<Utc>>,
        /// The call was cleared and started, then its worker died before a
        /// result (`RunConfig::on_interrupted_call`): approving runs it again,
        /// rejecting leaves its outcome unknown.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        interrupted: bool,
    },
    /// A person decided.
    #[serde(rename = "approval.resolved")]
    ApprovalResolved {
        /// The call.
        call_id: String,
        /// The arguments hash the decision was made on.
        args_hash: String,
        /// The decision.
        decision: Decision,
        /// Who decided, free text.
        by: Option<String>,
    },
    /// An approval passed its deadline with no decision and was handed to a
    /// second line of approvers (`on_approval_timeout: escalate`); it stays
    /// pending. Recorded by the worker from a [`Payload::Escalate`] the
    /// reconciler posts; no state changes.
    #[serde(rename = "approval.escalated")]
    ApprovalEscalated {
        /// The call.
        call_id: String,
        /// The deadline that passed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at: Option<DateTime<Utc>>,
    },
    /// A person tried to decide an approval another decision had already
    /// answered (two approvers racing, or a stale page): who, what they
    /// chose and when. The first decision stands; this is the record of the
    /// attempt that lost. Recorded by the worker from a
    /// [`Payload::ApprovalContested`] the dispatcher posts when it answers
    /// such an attempt 409 `already_decided`; no state changes.
    #[serde(rename = "approval.contested")]
    ApprovalContested {
        /// The call.
        call_id: String,
        /// Who tried (the token's principal name).
        by: Option<String>,
        /// What they chose.
        chose: DecisionChoice,
        /// When the dispatcher refused the attempt.
        attempted_at: DateTime<Utc>,
    },
    /// The user's next message arrived.
    #[serde(rename = "input.received")]
    InputReceived {
        /// Message text (after the input redact rules).
        text: String,
        /// The input redact rules that matched it.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        redactions: Vec<Redaction>,
    },
    /// A guardrail rejected text.
    #[serde(rename = "guardrail.tripped")]
    GuardrailTripped {
        /// Input or output.
        stage: GuardrailStage,
        /// Guardrail name.
        guardrail: String,
        /// Its reason.
        reason: String,
        /// For output: the marked re-ask appended to the conversation.
        reask: Option<String>,
    },
    /// The context was shrunk; `messages` is the whole new context.
    #[serde(rename = "context.compacted")]
    ContextCompacted {
        /// Strategy name.
        strategy: String,
        /// Messages removed.
        removed: usize,
        /// The conversation after compaction, exactly.
        messages: Vec<Message>,
        /// Tokens a summarising call used.
        usage: Usage,
        /// Its cost in USD micros.
        cost_usd_micros: u64,
    },
    /// A budget limit was reached.
    #[serde(rename = "budget.warn")]
    BudgetWarn {
        /// Which limit.
        limit: Limit,
        /// Usage at that moment.
        usage: BudgetUsage,
        /// Limits in force.
        limits: BudgetLimits,
    },
    /// Limits were raised.
    #[serde(rename = "budget.extended")]
    BudgetExtended {
        /// The new limits in force.
        limits: BudgetLimits,
    },
    /// The run parked at a pull point.
    #[serde(rename = "session.pause")]
    SessionPause {
        /// Where it waits.
        pull_point: PullPoint,
    },
    /// An operator asked the run to pause: it parks at `paused` with
    /// [`PauseReason::Operator`] at its next step boundary (at once when it
    /// is runnable; after the payload it waits for when it is parked).
    /// Recorded from a [`Payload::Pause`]; a `session.resume` before the
    /// pause takes effect withdraws it.
    #[serde(rename = "session.pause_requested")]
    SessionPauseRequested {
        /// Why, free text.
        reason: String,
        /// Who, free text.
        by: Option<String>,
    },
    /// An operator resumed a paused run or, when a pause is requested and not
    /// yet in effect (`session.pause_requested`), withdrew that request (the
    /// run stays where it is; a second resume resumes a run paused for
    /// another reason). With `by` null it is glia's own: a budget extension
    /// ended a budget pause, or a delayed run's start time came (issue 32:
    /// it leaves `awaiting_timer` with no calls).
    #[serde(rename = "session.resume")]
    SessionResume {
        /// Who, free text.
        by: Option<String>,
    },
    /// The run was cancelled (terminal).
    #[serde(rename = "session.cancel")]
    SessionCancel {
        /// Why.
        reason: String,
    },
    /// The run finished (terminal).
    #[serde(rename = "session.complete")]
    SessionComplete {
        /// How.
        outcome: Outcome,
    },
    /// Something failed; when `fatal` the run is done.
    #[serde(rename = "error")]
    Error {
        /// What failed.
        message: String,
        /// Whether the run ended because of it.
        fatal: bool,
    },
    /// A hook changed, cancelled, skipped or paused something; or, for an
    /// HTTP hook of the operator's catalogue (`call` set), its answer on an
    /// intercepting topic, `continued` included: recorded before it takes
    /// effect, and found in the state ([`crate::RunState::hook_answer`]) by
    /// a worker that resumes the run, so the hook is never called again for
    /// the same logical call (`docs/hooks.md`).
    #[serde(rename = "hook.applied")]
    HookApplied {
        /// Topic it ran on.
        topic: HookTopic,
        /// Hook name (an HTTP hook's catalogue name).
        hook: String,
        /// What it did.
        effect: HookEffect,
        /// The HTTP call this answers (HTTP hooks only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call: Option<HookCall>,
    },
    // ----- issue 32, child runs -----
    /// A child run started by a call of an agent tool ended (or could not
    /// start: `child_run_id` is `None` and `outcome` is failed, e.g. past
    /// the depth limit). Recorded by the worker from a
    /// [`Payload::ChildEnded`]; sets the call's result (the child's answer
    /// or structured output; a failure or cancel is an error result) and
    /// adds the child's usage and cost to this run's, so the parent's
    /// budget counts them. Not in [`EventKind::SPEND_NAMES`]: the child's
    /// own events already count toward the tenant's caps.
    #[serde(rename = "child.ended")]
    ChildEnded {
        /// The call of the agent tool.
        call_id: String,
        /// The child run, when one was started.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        child_run_id: Option<Uuid>,
        /// The agent, `name@version`.
        agent: String,
        /// How the child ended.
        outcome: Outcome,
        /// Tokens the child used (its whole run, its own children included).
        usage: Usage,
        /// Its cost in USD micros.
        cost_usd_micros: u64,
    },
}

impl EventKind {
    /// Every persisted event type of the catalogue, by its dotted name, in
    /// declaration order: the one list the OpenAPI document and the SQL
    /// adapters read. Each equals the variant's serde tag and [`Self::name`]
    /// (tested in `tests/roundtrip.rs`).
    pub const NAMES: [&'static str; 32] = [
        "session.start",
        "plan.draft",
        "plan.commit",
        "step.start",
        "step.end",
        "model.call",
        "model.retry",
        "message.elided",
        "model.response",
        "tool.call",
        "tool.result",
        "tool.error",
        "tool.recovered",
        "tool_source.unavailable",
        "tools.changed",
        "approval.requested",
        "approval.resolved",
        "approval.escalated",
        "approval.contested",
        "input.received",
        "guardrail.tripped",
        "context.compacted",
        "budget.warn",
        "budget.extended",
        "session.pause",
        "session.pause_requested",
        "session.resume",
        "session.cancel",
        "session.complete",
        "error",
        "hook.applied",
        // Issue 32, child runs.
        "child.ended",
    ];

    /// The event types that carry model spend (usage and cost), by name:
    /// exactly the kinds for which [`Self::spend`] is `Some`. SQL adapters
    /// select spend by these names.
    pub const SPEND_NAMES: [&'static str; 3] =
        ["model.response", "plan.draft", "context.compacted"];

    /// The model spend this event records, `(usage, cost_usd_micros)`:
    /// `plan.draft`, `model.response` and `context.compacted` carry it,
    /// every other kind `None`.
    pub fn spend(&self) -> Option<(&Usage, u64)> {
        match self {
            EventKind::ModelResponse {
                usage,
                cost_usd_micros,
                ..
            }
            | EventKind::PlanDraft {
                usage,
                cost_usd_micros,
                ..
            }
            | EventKind::ContextCompacted {
                usage,
                cost_usd_micros,
                ..
            } => Some((usage, *cost_usd_micros)),
            _ => None,
        }
    }

    /// Whether this kind carries model spend (its name is in [`Self::SPEND_NAMES`]).
    pub fn carries_spend(&self) -> bool {
        self.spend().is_some()
    }

    /// The dotted name, e.g. `tool.call`.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::SessionStart { .. } => "session.start",
            EventKind::PlanDraft { .. } => "plan.draft",
            EventKind::PlanCommit { .. } => "plan.commit",
            EventKind::StepStart { .. } => "step.start",
            EventKind::StepEnd { .. } => "step.end",
            EventKind::ModelCall { .. } => "model.call",
            EventKind::ModelRetry(_) => "model.retry",
            EventKind::MessageElided { .. } => "message.elided",
            EventKind::ModelResponse { .. } => "model.response",
            EventKind::ToolCall(_) => "tool.call",
            EventKind::ToolResult { .. } => "tool.result",
            EventKind::ToolError { .. } => "tool.error",
            EventKind::ToolRecovered { .. } => "tool.recovered",
            EventKind::ToolSourceUnavailable { .. } => "tool_source.unavailable",
            EventKind::ToolsChanged { .. } => "tools.changed",
            EventKind::ApprovalRequested { .. } => "approval.requested",
            EventKind::ApprovalResolved { .. } => "approval.resolved",
            EventKind::ApprovalEscalated { .. } => "approval.escalated",
            EventKind::ApprovalContested { .. } => "approval.contested",
            EventKind::InputReceived { .. } => "input.received",
            EventKind::GuardrailTripped { .. } => "guardrail.tripped",
            EventKind::ContextCompacted { .. } => "context.compacted",
            EventKind::BudgetWarn { .. } => "budget.warn",
            EventKind::BudgetExtended { .. } => "budget.extended",
            EventKind::SessionPause { .. } => "session.pause",
            EventKind::SessionPauseRequested { .. } => "session.pause_requested",
            EventKind::SessionResume { .. } => "session.resume",
            EventKind::SessionCancel { .. } => "session.cancel",
            EventKind::SessionComplete { .. } => "session.complete",
            EventKind::Error { .. } => "error",
            EventKind::HookApplied { .. } => "hook.applied",
            EventKind::ChildEnded { .. } => "child.ended",
        }
    }
}

/// One failed attempt of a model call that was retried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retry {
    /// The attempt that failed, from 1.
    pub attempt: u32,
    /// A short, stable label of the failure: `rate_limited`, `overloaded`,
    /// `server`, `network`, `stream_cut`, …
    pub cause: String,
    /// The failure as the provider described it (never holds a key).
    pub message: String,
    /// Wait before the next attempt, in ms.
    pub delay_ms: u64,
}

/// The decided form of one tool call, recorded before it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    /// Call id from the model's tool use.
    pub call_id: String,
    /// Tool name.
    pub name: String,
    /// Arguments after hooks (what will run).
    pub input: Value,
    /// SHA-256 of the canonical JSON of `input`, hex.
    pub args_hash: String,
    /// `{run_id}:{call_id}`, handed to the tool so a re-run is recognisable.
    pub idempotency_key: String,
    /// What happens next.
    pub disposition: Disposition,
}

/// How a tool call proceeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Disposition {
    /// A worker runs it now.
    Run {
        /// Reminder from a `remind` policy.
        reminder: Option<String>,
    },
    /// The caller runs it; the run parks at `awaiting_tool`.
    External,
    /// A person must approve it first; the run parks at `awaiting_approval`.
    Approval,
    // --- issue 32: waits ---
    /// A built-in wait (`sleep`, `wait_until`, `wait_for_event`;
    /// [`crate::wait`]): the run parks at `awaiting_timer` or
    /// `awaiting_event` until a [`Payload::Wake`] gives the call its result.
    /// JSON: `{"kind": "wait", "wait": {"kind": "timer", …}}`.
    Wait {
        /// What it waits for, and since when.
        wait: crate::wait::Wait,
    },
    // --- end waits ---
    /// Issue 32: a call of an agent tool; a child run gives its result and
    /// the run parks at `awaiting_children` until it ends.
    Child,
    /// It will not run (a policy denied it, a hook cancelled or skipped it,
    /// the tool is unknown); a `tool.error` with this kind and message
    /// follows at once.
    Refused {
        /// Why.
        error: ToolErrorKind,
        /// The text the model sees.
        message: String,
    },
}

/// Why a tool call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolErrorKind {
    /// The model named a tool that is not in the step's tool list.
    UnknownTool,
    /// The tool is listed but no longer registered on this worker.
    Unavailable,
    /// Arguments failed the tool's JSON Schema.
    InvalidArguments,
    /// The tool returned an error.
    Failed,
    /// The tool returned output that is not valid JSON.
    InvalidOutput,
    /// The tool panicked.
    Panicked,
    /// The tool did not finish within its timeout.
    Timeout,
    /// A policy denied the call.
    Denied,
    /// A person rejected the call.
    Rejected,
    /// A hook cancelled or skipped the call.
    Cancelled,
    /// The worker died while a non-idempotent call ran; nobody knows whether
    /// it took effect.
    OutcomeUnknown,
    /// The run's budget has no room for another tool call.
    BudgetExceeded,
    /// Its approval passed its deadline with no decision
    /// ([`Decision::Expire`]); the call did not run.
    Expired,
}

/// What an approver chose, without its content (the reason of a
/// rejection, edited arguments): `approve`, `reject` or `edit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionChoice {
    /// Approve as proposed.
    Approve,
    /// Reject.
    Reject,
    /// Approve with edited arguments.
    Edit,
}

impl DecisionChoice {
    /// `approve`, `reject` or `edit`.
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionChoice::Approve => "approve",
            DecisionChoice::Reject => "reject",
            DecisionChoice::Edit => "edit",
        }
    }
}

/// A person's decision on an approval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Decision {
    /// Run the call as proposed.
    Approve,
    /// Do not run it; the model sees the reason.
    Reject {
        /// Shown to the model.
        reason: String,
    },
    /// Run it with these arguments instead.
    Edit {
        /// Replacement arguments.
        input: Value,
    },
    /// Nobody decided before the approval's deadline
    /// (`on_approval_timeout: reject`): the call does not run, and the model
    /// is told it expired, not that a person rejected it. Posted by the
    /// dispatcher's reconciler only. JSON: `{"kind": "expire"}`.
    Expire,
}

/// Where a parked run waits. JSON: `{"kind": "awaiting_approval", "call_ids": […]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PullPoint {
    /// External tool results are due.
    AwaitingTool {
        /// Calls without a result.
        call_ids: Vec<String>,
    },
    /// Approvals are due (external results may be due too).
    AwaitingApproval {
        /// Calls awaiting a decision.
        call_ids: Vec<String>,
    },
    /// A conversational run answered; the user's next message is due.
    AwaitingInput,
    /// Paused; budget extension or an operator's resume is due.
    Paused {
        /// Why.
        reason: PauseReason,
    },
    // --- issue 32: waits ---
    /// Built-in timers (`sleep`, `wait_until`) are due later, or, with no
    /// calls, a delayed start ([`crate::RunConfig::start_at_ms`]) has not
    /// come; the dispatcher posts a [`Payload::Wake`] at `wake_at_ms`.
    AwaitingTimer {
        /// The waiting calls; empty for a delayed start.
        call_ids: Vec<String>,
        /// The earliest due time of the turn's waits, Unix ms.
        wake_at_ms: i64,
    },
    /// `wait_for_event` calls wait for events with these keys (timers of the
    /// same turn may wait too).
    AwaitingEvent {
        /// The waiting calls, timers of the same turn included.
        call_ids: Vec<String>,
        /// The keys waited for, sorted, distinct.
        keys: Vec<String>,
        /// The earliest time something of the turn is due without an event
        /// (an event wait's timeout or a timer's wake time), Unix ms.
        timeout_at_ms: Option<i64>,
    },
    // --- end waits ---
    /// Issue 32: child runs started by calls of agent tools are running;
    /// their ends (`child_ended`) are due.
    AwaitingChildren {
        /// Calls whose child has not ended.
        call_ids: Vec<String>,
    },
}

impl PullPoint {
    /// `awaiting_tool`, `awaiting_approval`, `awaiting_input`, `paused`,
    /// `awaiting_timer` or `awaiting_event`.
    pub fn name(&self) -> &'static str {
        match self {
            PullPoint::AwaitingTool { .. } => "awaiting_tool",
            PullPoint::AwaitingApproval { .. } => "awaiting_approval",
            PullPoint::AwaitingInput => "awaiting_input",
            PullPoint::Paused { .. } => "paused",
            PullPoint::AwaitingTimer { .. } => "awaiting_timer",
            PullPoint::AwaitingEvent { .. } => "awaiting_event",
            PullPoint::AwaitingChildren { .. } => "awaiting_children",
        }
    }
}

/// Why a run is paused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PauseReason {
    /// A budget limit was reached.
    Budget {
        /// Which.
        limit: Limit,
    },
    /// The turn used all its model calls and the model still wants tools.
    TurnLimit,
    /// A hook asked for human review.
    Hook {
        /// Hook name.
        hook: String,
        /// Its reason.
        reason: String,
    },
    /// The provider refuses further calls for now (spending cap reached).
    Provider {
        /// The provider's message.
        reason: String,
    },
    /// The model's answer was not a finished turn and the run's stop policy
    /// says pause (`RunConfig::stop_reasons`; see [`crate::stop`]). A resume
    /// calls the model again.
    ModelStop {
        /// The recorded stop reason, e.g. `max_tokens`, `refusal`.
        stop_reason: String,
    },
    /// A tool source the run names stayed unavailable for all the attempts
    /// of `RunConfig::on_tool_source_unavailable` (each recorded as
    /// `tool_source.unavailable`). A resume lists the tools again, with as
    /// many attempts again.
    ToolSource {
        /// The catalogue name of the server.
        server: String,
        /// The last attempt's reason.
        reason: String,
    },
    /// An operator paused the run.
    Operator {
        /// Why.
        reason: String,
    },
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// The goal was reached.
    Succeeded {
        /// The final answer text.
        answer: String,
        /// Validated structured output, when the run has an output schema.
        output: Option<Value>,
    },
    /// The run failed.
    Failed {
        /// Why.
        error: String,
    },
    /// The run was cancelled by its caller or a hook.
    Cancelled {
        /// Why.
        reason: String,
    },
}

/// Where a guardrail looked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GuardrailStage {
    /// Checks the goal and user messages.
    Input,
    /// Checks the model's answer.
    Output,
    /// Checks a tool's result before it is stored (a deny withholds it:
    /// the `tool.result` that follows holds a marked note instead).
    ToolResult,
}

/// The ten hook topics of the harness contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum HookTopic {
    /// Before the planner drafts.
    BeforePlan,
    /// After the plan is drafted, before it is committed.
    AfterPlan,
    /// Before a step starts.
    BeforeStep,
    /// After a step ends.
    AfterStep,
    /// Before a tool call is decided; may change its arguments.
    BeforeToolCall,
    /// After a tool call produced a result; may change the result text.
    AfterToolCall,
    /// After a failure.
    OnError,
    /// When the run parks.
    OnPause,
    /// When a budget limit is reached.
    OnBudgetExceeded,
    /// When the run finishes.
    OnComplete,
}

impl HookTopic {
    /// The snake_case name, as in the catalogue's `topics`.
    pub fn name(self) -> &'static str {
        match self {
            HookTopic::BeforePlan => "before_plan",
            HookTopic::AfterPlan => "after_plan",
            HookTopic::BeforeStep => "before_step",
            HookTopic::AfterStep => "after_step",
            HookTopic::BeforeToolCall => "before_tool_call",
            HookTopic::AfterToolCall => "after_tool_call",
            HookTopic::OnError => "on_error",
            HookTopic::OnPause => "on_pause",
            HookTopic::OnBudgetExceeded => "on_budget_exceeded",
            HookTopic::OnComplete => "on_complete",
        }
    }

    /// Whether the topic intercepts (its hooks' answers may change what
    /// the loop does) rather than notifies (`on_*`).
    pub fn intercepts(self) -> bool {
        !matches!(
            self,
            HookTopic::OnError
                | HookTopic::OnPause
                | HookTopic::OnBudgetExceeded
                | HookTopic::OnComplete
        )
    }

    /// Every topic, in the order of the harness contract.
    pub const ALL: [HookTopic; 10] = [
        HookTopic::BeforePlan,
        HookTopic::AfterPlan,
        HookTopic::BeforeStep,
        HookTopic::AfterStep,
        HookTopic::BeforeToolCall,
        HookTopic::AfterToolCall,
        HookTopic::OnError,
        HookTopic::OnPause,
        HookTopic::OnBudgetExceeded,
        HookTopic::OnComplete,
    ];
}

/// One HTTP hook call as recorded in its `hook.applied` events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookCall {
    /// The logical call: `{topic}:{turns}:{subject}:{payload hash}` (the
    /// subject is the call id, the step index or `plan`). The same on a
    /// retry or a resume at the same point; `webhook-id` is derived from
    /// it. The state keys recorded answers by hook and this key.
    pub key: String,
    /// How the call went; anything but `answered` is the hook's failure
    /// mode at work (its effect says which: `continued` = failed open).
    pub outcome: HookOutcome,
    /// How long the call took, in ms.
    pub duration_ms: u64,
}

/// How an HTTP hook call went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookOutcome {
    /// A 2xx with an answer the topic takes.
    Answered,
    /// No answer within the hook's `timeout_ms`.
    TimedOut,
    /// No connection, or the connection failed.
    Unreachable,
    /// An answer that is not 2xx.
    BadStatus,
    /// A 2xx whose body is not an answer the topic takes (not JSON, an
    /// unknown field or verdict, a change the topic does not allow, too
    /// large).
    BadAnswer,
}

impl HookOutcome {
    /// The snake_case name (metrics label, logs).
    pub fn name(self) -> &'static str {
        match self {
            HookOutcome::Answered => "answered",
            HookOutcome::TimedOut => "timed_out",
            HookOutcome::Unreachable => "unreachable",
            HookOutcome::BadStatus => "bad_status",
            HookOutcome::BadAnswer => "bad_answer",
        }
    }
}

/// What a hook did, as recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HookEffect {
    /// An HTTP hook let the transition go on (recorded so that its answer
    /// is not asked again; in-process hooks record no such effect).
    Continued,
    /// It changed the payload to this.
    Modified {
        /// The payload after the hook.
        payload: Value,
    },
    /// It cancelled the transition.
    Cancelled {
        /// Why.
        reason: String,
    },
    /// It skipped the next step (or the tool call).
    Skipped,
    /// It asked for human review: the run pauses.
    Paused {
        /// Why.
        reason: String,
    },
}

/// Events pushed to live subscribers only; never persisted, never replayed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum LiveEvent {
    /// A streamed piece of the model's answer.
    #[serde(rename = "model.delta")]
    ModelDelta {
        /// `text`, `thinking`, or `tool_call`: the name of a tool the model
        /// has begun to call (once per call; its arguments arrive with the
        /// answer, in `model.response`).
        channel: String,
        /// The piece.
        delta: String,
    },
    /// An attempt of the model call failed and will be retried: drop the
    /// deltas streamed since the call (or the last discard) began; the
    /// next attempt streams its answer from the start.
    #[serde(rename = "model.discard")]
    ModelDiscard {
        /// The attempt that failed, from 1.
        attempt: u32,
        /// Its short failure label (as in [`Retry::cause`]).
        cause: String,
    },
    /// Progress reported by a running tool.
    #[serde(rename = "tool.progress")]
    ToolProgress {
        /// The call.
        call_id: String,
        /// Free text.
        message: String,
    },
}

/// A payload that moves a parked run on, posted by a person or a client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Payload {
    /// A decision on a call waiting at `awaiting_approval`.
    Approval {
        /// The call.
        call_id: String,
        /// [`crate::args_hash`] of the arguments the person saw.
        args_hash: String,
        /// The decision.
        decision: Decision,
        /// Who decided.
        #[serde(default)]
        by: Option<String>,
        /// The `seq` of the `approval.requested` this decision answers (the
        /// dispatcher fills it in): a decision on an earlier request of the
        /// same call is refused, and concurrent decisions are deduplicated
        /// per request.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request_seq: Option<u64>,
    },
    /// The result of an external tool call waiting at `awaiting_tool`.
    ToolResult {
        /// The call.
        call_id: String,
        /// Result text.
        content: String,
        /// True when the tool failed.
        #[serde(default)]
        is_error: bool,
    },
    /// The user's next message, at `awaiting_input`.
    Input {
        /// Message text.
        text: String,
        /// The input redact rules the dispatcher applied to it before
        /// posting (`text` is what they left); `input.received` lists them.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        redactions: Vec<Redaction>,
    },
    /// Raise limits (each `Some(n)` adds `n`); a run paused by its budget resumes.
    ExtendBudget {
        /// Amounts to add.
        extra: BudgetLimits,
    },
    /// Pause the run at its next step boundary (an operator pause; see
    /// [`EventKind::SessionPauseRequested`]). JSON: `{"kind": "pause",
    /// "reason": "…", "by": "…"}`.
    Pause {
        /// Why.
        reason: String,
        /// Who.
        #[serde(default)]
        by: Option<String>,
    },
    /// Resume a paused run as it is, or withdraw a pause not yet in effect.
    Resume {
        /// Who.
        #[serde(default)]
        by: Option<String>,
    },
    /// Close a conversational run waiting at `awaiting_input`, or a run
    /// paused by its budget that is not to be extended: it completes with its
    /// last answer. JSON: `{"kind": "close"}` or, with the user's last words
    /// (a farewell that needs no answer; only at `awaiting_input`),
    /// `{"kind": "close", "text": "Thanks, bye!"}`: they are recorded as
    /// `input.received` first, and no model call follows.
    Close {
        /// The user's last message, recorded before the run completes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        /// The input redact rules applied to `text` before posting.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        redactions: Vec<Redaction>,
    },
    /// Record that the pending approval of `call_id` passed its deadline and
    /// was escalated (`approval.escalated`); the run stays parked. Posted by
    /// the dispatcher's reconciler; dropped when the call no longer waits.
    Escalate {
        /// The call.
        call_id: String,
        /// The `seq` of the `approval.requested` it concerns.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request_seq: Option<u64>,
        /// The deadline that passed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expires_at: Option<DateTime<Utc>>,
    },
    /// Record a losing attempt to decide the approval of `call_id`
    /// (`approval.contested`): the dispatcher refused it because a decision
    /// was already posted. Taken wherever the run stands; changes nothing.
    ApprovalContested {
        /// The call.
        call_id: String,
        /// Who tried.
        #[serde(default)]
        by: Option<String>,
        /// What they chose.
        chose: DecisionChoice,
        /// When the attempt was refused.
        attempted_at: DateTime<Utc>,
    },
    // --- issue 32: waits ---
    /// A wait is over: posted by the dispatcher's waits loop
    /// (`dispatcher/src/waits.rs`), at least once. Without `event`: every
    /// waiting call of the run due at or before `due_at_ms` (a timer's wake
    /// time, an event wait's timeout) gets its result. With `event`: every
    /// call of the run waiting for `event.key` gets the event as its result.
    /// A run parked for its start time is started (`session.resume`). A
    /// wake that finds nothing to end is dropped. Deduplicated per run
    /// ([`Payload::Wake`]'s dedupe key is `event:{id}` for an event, so a run
    /// never receives the same event twice, and `wake:{due_at_ms}` for a time).
    Wake {
        /// The due time this wake is for, Unix ms (for an event, its
        /// arrival).
        due_at_ms: i64,
        /// The event that arrived, for event waits.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        event: Option<crate::wait::ArrivedEvent>,
    },
    // --- end waits ---
    /// Cancel the run (terminal), wherever it stands.
    Cancel {
        /// Why.
        reason: String,
    },
    /// Issue 32: the child run of agent-tool call `call_id` ended, or could
    /// not be started (`child_run_id` `None`, `outcome` failed). Posted by
    /// the dispatcher; recorded as `child.ended`. Refused when the call has
    /// its result already.
    ChildEnded {
        /// The call.
        call_id: String,
        /// The child run, when one was started.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        child_run_id: Option<Uuid>,
        /// How it ended.
        outcome: Outcome,
        /// Tokens it used.
        #[serde(default)]
        usage: Usage,
        /// Its cost in USD micros.
        #[serde(default)]
        cost_usd_micros: u64,
    },
}

impl Spend {
    /// The model spend an event records ([`EventKind::spend`]: the kinds of
    /// [`EventKind::SPEND_NAMES`] carry usage and cost); every other event `None`.
    pub fn of_event(kind: &EventKind) -> Option<Spend> {
        kind.spend()
            .map(|(usage, cost_usd_micros)| Spend::of(usage, cost_usd_micros))
    }
}
