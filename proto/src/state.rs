//! `RunState` and its one transition function, [`RunState::apply`].
//!
//! The state machine is the harness contract's: `IDLE → PLANNING → EXECUTING ⇄
//! AWAITING_TOOL`, `EXECUTING → REFLECTING → EXECUTING | PLANNING | DONE`, and
//! `PLANNING → DONE`. A run that waits is additionally *parked* at one of four
//! pull points. Nothing else mutates a `RunState`: the loop records an event
//! and applies it, replay applies the same events, so the same log gives the
//! same state, always.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::budget::{BudgetLimits, BudgetUsage};
use crate::config::{RunConfig, ToolSpec};
use crate::event::{
    Decision, Disposition, Event, EventKind, GuardrailStage, HookEffect, Outcome, PauseReason,
    PullPoint, ToolCallRecord, ToolErrorKind,
};
use crate::marker::{Insert, neutralise};
use crate::repair::elide;
use crate::stop::StopAction;
use crate::{ContentBlock, Message, OUTPUT_TOOL, ResultBlock, Role, ToolContent, args_hash};

/// The six states of the harness contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Not started.
    Idle,
    /// Drafting (or redrafting) the plan.
    Planning,
    /// Working on a step: model calls.
    Executing,
    /// The model asked for tools; their results are due.
    AwaitingTool,
    /// A step ended; next step, replan or done.
    Reflecting,
    /// Finished, failed or cancelled. Terminal.
    Done,
}

/// Where a tool call's approval stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatus {
    /// Not needed.
    NotNeeded,
    /// Needed, not yet requested.
    Due,
    /// Requested; waiting for a person.
    Requested,
    /// Approved (possibly with edited arguments).
    Approved,
    /// Rejected.
    Rejected,
}

/// One tool use of the current model turn and how far it got.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingCall {
    /// Call id.
    pub call_id: String,
    /// Tool name.
    pub name: String,
    /// Arguments (the model's, then as decided by hooks or an approver's edit).
    pub input: Value,
    /// Hash of `input`.
    pub args_hash: String,
    /// Set by `tool.call`; `None` until then.
    pub disposition: Option<Disposition>,
    /// The step's tool list marks this tool as executed by the caller: after
    /// an approval its result is posted, not run by a worker.
    #[serde(default)]
    pub external: bool,
    /// Approval progress.
    pub approval: ApprovalStatus,
    /// Set by `tool.result` / `tool.error`: the text the model sees, and whether
    /// it is an error.
    pub result: Option<(ToolContent, bool)>,
    /// Seq of the call's latest `approval.requested`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_seq: Option<u64>,
    /// A crash interrupted the call and a person was asked whether to run it
    /// again (`approval.requested` with `interrupted`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    // --- issue 32: waits ---
    /// What a built-in wait call waits for (set by its `tool.call`,
    /// [`Disposition::Wait`]); `None` for every other call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<crate::wait::Wait>,
    // --- end waits ---
    /// Issue 32: a call of an agent tool (set by its `tool.call` with
    /// [`Disposition::Child`]): the child it starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<crate::children::ChildCall>,
    /// An approver edited the arguments (`approval.resolved` with `edit`):
    /// the worker asks the `before_tool_call` hooks and the policies about
    /// the edited `input` before it runs the call (`docs/hooks.md`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub edited: bool,
}

impl PendingCall {
    /// True when the loop (not a person or the caller) must act on this call:
    /// decide it, run it, or record a rejection.
    pub fn needs_worker(&self) -> bool {
        if self.result.is_some() {
            return false;
        }
        match &self.disposition {
            None => true,
            Some(Disposition::Run { .. }) => self.approval != ApprovalStatus::Requested,
            Some(Disposition::Refused { .. }) => true,
            Some(Disposition::External | Disposition::Child | Disposition::Wait { .. }) => false,
            Some(Disposition::Approval) => match self.approval {
                ApprovalStatus::Due | ApprovalStatus::Rejected => true,
                ApprovalStatus::Approved => !self.external,
                ApprovalStatus::NotNeeded | ApprovalStatus::Requested => false,
            },
        }
    }

    /// True when this call was cleared for a worker to run (by policy, or
    /// approved) and has no result yet. Found at the start of an `advance`,
    /// such a call was interrupted: a worker stopped while it ran.
    pub fn cleared_without_result(&self) -> bool {
        self.result.is_none()
            && !matches!(
                self.approval,
                ApprovalStatus::Requested | ApprovalStatus::Rejected
            )
            && (matches!(self.disposition, Some(Disposition::Run { .. }))
                || (self.approval == ApprovalStatus::Approved && !self.external))
    }

    /// True when the caller, not a worker, produces this call's result: an
    /// external call, or an approved call of an external tool.
    pub fn awaits_caller(&self) -> bool {
        self.result.is_none()
            && match &self.disposition {
                Some(Disposition::External) => true,
                Some(Disposition::Approval) => {
                    self.external && self.approval == ApprovalStatus::Approved
                }
                _ => false,
            }
    }
}

/// Everything needed to continue a run; derived from its events alone.
/// Serialised as JSON it is the run's checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    /// The run.
    pub run_id: Uuid,
    /// Sequence of the last applied event (0 before `session.start`).
    pub head_seq: u64,
    /// State-machine phase.
    pub phase: Phase,
    /// Set while the run waits at a pull point.
    pub parked: Option<PullPoint>,
    /// The goal.
    pub goal: String,
    /// Configuration from `session.start`.
    pub config: RunConfig,
    /// The conversation as the model will see it (before request repair).
    pub messages: Vec<Message>,
    /// Committed plan.
    pub plan: Vec<String>,
    /// Index of the current step.
    pub step: Option<usize>,
    /// The current step's frozen tool list.
    pub step_tools: Vec<ToolSpec>,
    /// Model calls in the current turn.
    pub turn_calls: u32,
    /// Rejected answers in the current turn (guardrails, invalid output).
    pub reasks: u32,
    /// The tool calls of the last model turn until all have results (one
    /// user turn of results joins the conversation when the last arrives).
    /// Stored as `batch` in checkpoints, the name it had before.
    #[serde(rename = "batch")]
    pub pending_calls: Vec<PendingCall>,
    /// Limits in force.
    pub limits: BudgetLimits,
    /// Consumption so far.
    pub usage: BudgetUsage,
    /// Validated structured output, once accepted.
    pub output: Option<Value>,
    /// Text of the last step's answer.
    pub answer: String,
    /// Set when `phase == Done`.
    pub outcome: Option<Outcome>,
    /// The reason of an operator pause requested (`session.pause_requested`)
    /// and not yet in effect: the loop records `session.pause` with
    /// [`PauseReason::Operator`] as soon as the run is runnable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_due: Option<String>,
    /// Failed attempts to list the next step's tools
    /// (`tool_source.unavailable`) since the last `step.start` or the
    /// resume of a [`PauseReason::ToolSource`] pause.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tool_source_attempts: u32,
    /// Answers of HTTP hooks recorded for hook points not yet behind the
    /// run (`hook.applied` with a `call`), by `"{hook} {key}"`; emptied at
    /// every `model.call`, `plan.commit` and `session.resume`. See
    /// [`RunState::hook_answer`].
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub hook_answers: std::collections::BTreeMap<String, RecordedHookAnswer>,
}

/// An HTTP hook's recorded answer ([`RunState::hook_answers`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RecordedHookAnswer {
    /// The payload as the hook left it, when it changed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    /// Its verdict (`continued`, `cancelled`, `skipped`, `paused`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<HookEffect>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Where a run stands, for callers.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// A worker can advance it now.
    Runnable,
    /// It waits at a pull point.
    Parked(PullPoint),
    /// It is over.
    Done(Outcome),
}

/// Why an event cannot be applied. The state is unchanged when this is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// The event belongs to another run.
    #[error("event for run {got} applied to run {expected}")]
    WrongRun {
        /// This run.
        expected: Uuid,
        /// The event's run.
        got: Uuid,
    },
    /// The event's sequence is not `head_seq + 1`.
    #[error("event seq {got} out of order: expected {expected}")]
    OutOfOrder {
        /// `head_seq + 1`.
        expected: u64,
        /// The event's seq.
        got: u64,
    },
    /// The run is done; nothing more can happen to it.
    #[error("run is done; {event} not allowed")]
    Finished {
        /// Event name.
        event: &'static str,
    },
    /// The event is not allowed in the current phase or pull point.
    #[error("{event} not allowed in phase {phase:?} (parked: {parked}): {reason}")]
    Illegal {
        /// Event name.
        event: &'static str,
        /// Phase at the time.
        phase: Phase,
        /// Pull point at the time, or `none`.
        parked: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The event names a tool call that is not among the pending calls.
    #[error("unknown tool call {call_id}")]
    UnknownCall {
        /// The call id.
        call_id: String,
    },
    /// An approval decision quotes arguments other than the ones pending.
    #[error("approval for {call_id} was made on other arguments (hash {got}, pending {expected})")]
    ArgsMismatch {
        /// The call id.
        call_id: String,
        /// Hash of the pending arguments.
        expected: String,
        /// Hash the decision quoted.
        got: String,
    },
}

impl RunState {
    /// A run that has not started: phase `Idle`, `head_seq` 0.
    pub fn new(run_id: Uuid) -> Self {
        RunState {
            run_id,
            head_seq: 0,
            phase: Phase::Idle,
            parked: None,
            goal: String::new(),
            config: RunConfig::default(),
            messages: Vec::new(),
            plan: Vec::new(),
            step: None,
            step_tools: Vec::new(),
            turn_calls: 0,
            reasks: 0,
            pending_calls: Vec::new(),
            limits: BudgetLimits::default(),
            usage: BudgetUsage::default(),
            output: None,
            answer: String::new(),
            outcome: None,
            pause_due: None,
            tool_source_attempts: 0,
            hook_answers: std::collections::BTreeMap::new(),
        }
    }

    /// Rebuild a state from a log. Fails on the first event that cannot apply.
    ///
    /// ```
    /// use glia_proto::{Event, EventKind, RunConfig, RunState, Phase};
    /// let run_id = uuid::Uuid::nil();
    /// let start = Event { run_id, seq: 1, at: chrono::DateTime::UNIX_EPOCH,
    ///     kind: EventKind::SessionStart { redactions: Vec::new(), goal: "hi".into(), config: RunConfig::default() } };
    /// let state = RunState::replay(run_id, &[start]).unwrap();
    /// assert_eq!(state.phase, Phase::Planning);
    /// ```
    pub fn replay(run_id: Uuid, events: &[Event]) -> Result<RunState, TransitionError> {
        let mut state = RunState::new(run_id);
        for e in events {
            state.apply(e)?;
        }
        Ok(state)
    }

    /// Where the run stands.
    pub fn status(&self) -> Status {
        if let Some(outcome) = &self.outcome {
            return Status::Done(outcome.clone());
        }
        match &self.parked {
            Some(p) => Status::Parked(p.clone()),
            None => Status::Runnable,
        }
    }

    /// True when an operator pause may take effect now: no call is cleared
    /// to run without a result (a pause there would make a clean stop look
    /// like an interrupted call). A pause requested meanwhile waits for the
    /// calls to run, so it lands between a step's tool results and the next
    /// model call.
    pub fn pausable(&self) -> bool {
        !self
            .pending_calls
            .iter()
            .any(PendingCall::cleared_without_result)
    }

    /// A pending call of the last model turn.
    pub fn call(&self, call_id: &str) -> Option<&PendingCall> {
        self.pending_calls.iter().find(|c| c.call_id == call_id)
    }

    /// The one transition function. Validates `event` against the current
    /// state and applies it, or returns why not and leaves `self` unchanged.
    pub fn apply(&mut self, event: &Event) -> Result<(), TransitionError> {
        let name = event.kind.name();
        if self.head_seq > 0 && event.run_id != self.run_id {
            return Err(TransitionError::WrongRun {
                expected: self.run_id,
                got: event.run_id,
            });
        }
        if event.seq != self.head_seq + 1 {
            return Err(TransitionError::OutOfOrder {
                expected: self.head_seq + 1,
                got: event.seq,
            });
        }
        if self.phase == Phase::Done {
            return Err(TransitionError::Finished { event: name });
        }
        let illegal = |s: &Self, reason: &str| TransitionError::Illegal {
            event: name,
            phase: s.phase,
            parked: s.parked.as_ref().map_or("none", PullPoint::name),
            reason: reason.to_owned(),
        };
        let not_parked = |s: &Self| {
            if s.parked.is_some() {
                Err(illegal(s, "run is parked"))
            } else {
                Ok(())
            }
        };

        match &event.kind {
            EventKind::SessionStart { goal, config, .. } => {
                if self.phase != Phase::Idle {
                    return Err(illegal(self, "run already started"));
                }
                self.run_id = event.run_id;
                // Text glia did not write enters the conversation
                // neutralised (`marker::neutralise`): a forged marker in a
                // goal, a message, a tool's output or a model's text stays
                // plain text.
                self.goal = neutralise(goal).into_owned();
                self.config = config.clone();
                self.limits = config.budget;
                self.messages = vec![Message::user(self.goal.clone())];
                self.phase = Phase::Planning;
                // Issue 32, a delayed start: parked on a timer with no calls
                // until the start time (decided against the event's own
                // time, so replay parks the same way).
                if let Some(start_at_ms) = config.start_at_ms
                    && start_at_ms > event.at.timestamp_millis()
                {
                    self.parked = Some(PullPoint::AwaitingTimer {
                        call_ids: Vec::new(),
                        wake_at_ms: start_at_ms,
                    });
                }
            }
            EventKind::PlanDraft {
                usage,
                cost_usd_micros,
                ..
            } => {
                not_parked(self)?;
                if !matches!(self.phase, Phase::Planning | Phase::Reflecting) {
                    return Err(illegal(
                        self,
                        "a plan is drafted while planning or reflecting",
                    ));
                }
                self.usage.tokens += *usage;
                self.usage.cost_usd_micros =
                    self.usage.cost_usd_micros.saturating_add(*cost_usd_micros);
                self.phase = Phase::Planning;
            }
            EventKind::PlanCommit { steps } => {
                not_parked(self)?;
                if self.phase != Phase::Planning {
                    return Err(illegal(self, "a plan is committed while planning"));
                }
                if steps.is_empty() {
                    return Err(illegal(
                        self,
                        "an empty plan is not committed; the run completes instead",
                    ));
                }
                self.plan = steps.clone();
                self.step = None;
                self.phase = Phase::Executing;
            }
            EventKind::StepStart {
                index,
                description,
                tools,
            } => {
                not_parked(self)?;
                let expected = match self.phase {
                    Phase::Executing if self.step.is_none() => 0,
                    Phase::Reflecting => self.step.map_or(0, |s| s + 1),
                    _ => return Err(illegal(self, "a step starts after plan.commit or step.end")),
                };
                if *index != expected || *index >= self.plan.len() {
                    return Err(illegal(
                        self,
                        &format!(
                            "step {index} out of order (expected {expected} of {})",
                            self.plan.len()
                        ),
                    ));
                }
                self.step = Some(*index);
                self.step_tools = tools.clone();
                self.tool_source_attempts = 0;
                self.output = None;
                self.turn_calls = 0;
                self.reasks = 0;
                // Every step opens with a user turn: the goal for a single
                // first step, a marked step note otherwise.
                if self.plan.len() > 1
                    || self
                        .messages
                        .last()
                        .is_some_and(|m| m.role == Role::Assistant)
                {
                    let note = Insert::Step.wrap(&format!(
                        "Step {} of {}: {}",
                        index + 1,
                        self.plan.len(),
                        neutralise(description)
                    ));
                    push_user_text(&mut self.messages, note);
                }
                self.phase = Phase::Executing;
            }
            EventKind::StepEnd { index, answer, .. } => {
                not_parked(self)?;
                if self.phase != Phase::Executing || self.step != Some(*index) {
                    return Err(illegal(
                        self,
                        "step.end closes the current step while executing",
                    ));
                }
                self.answer = answer.clone();
                self.phase = Phase::Reflecting;
            }
            EventKind::ModelCall { .. } => {
                not_parked(self)?;
                if self.phase != Phase::Executing || self.step.is_none() {
                    return Err(illegal(self, "model calls happen while executing a step"));
                }
                if self.messages.last().is_none_or(|m| m.role != Role::User) {
                    return Err(illegal(
                        self,
                        "a model call needs the conversation to end with a user turn",
                    ));
                }
                self.turn_calls += 1;
                self.usage.turns += 1;
            }
            EventKind::ModelRetry(_) => {
                not_parked(self)?;
                if !self.model_call_in_flight() {
                    return Err(illegal(
                        self,
                        "a retry belongs to a model call in flight (after model.call, before model.response)",
                    ));
                }
            }
            EventKind::MessageElided { index, .. } => {
                not_parked(self)?;
                if !self.model_call_in_flight() {
                    return Err(illegal(
                        self,
                        "a message is elided while a model call is in flight",
                    ));
                }
                let Some(message) = self.messages.get(*index) else {
                    return Err(illegal(
                        self,
                        &format!(
                            "no message {index} to elide (the conversation has {})",
                            self.messages.len()
                        ),
                    ));
                };
                self.messages[*index] = elide(message);
            }
            EventKind::ModelResponse {
                message,
                usage,
                duration_ms,
                cost_usd_micros,
                rejected,
                ..
            } => {
                not_parked(self)?;
                if self.phase != Phase::Executing {
                    return Err(illegal(self, "a model response arrives while executing"));
                }
                if message.role != Role::Assistant {
                    return Err(illegal(self, "a model response is an assistant message"));
                }
                if self.messages.last().is_none_or(|m| m.role != Role::User) {
                    return Err(illegal(self, "a model response follows a model call"));
                }
                if let Some(r) = rejected
                    && (r.action == StopAction::Reask) != r.reask.is_some()
                {
                    return Err(illegal(
                        self,
                        "a re-asked answer carries its notice, and only a re-asked one",
                    ));
                }
                // A rejected answer's calls are never run: no pending calls.
                let calls: Vec<PendingCall> = message
                    .tool_uses()
                    .filter(|_| rejected.is_none())
                    .map(|(id, name, input)| PendingCall {
                        call_id: id.to_owned(),
                        name: name.to_owned(),
                        input: input.clone(),
                        args_hash: args_hash(input),
                        disposition: None,
                        external: self.step_tools.iter().any(|t| t.name == name && t.external),
                        approval: ApprovalStatus::NotNeeded,
                        result: None,
                        requested_seq: None,
                        interrupted: false,
                        wait: None,
                        child: None,
                        edited: false,
                    })
                    .collect();
                let mut ids: Vec<&str> = calls.iter().map(|c| c.call_id.as_str()).collect();
                ids.sort_unstable();
                if ids.windows(2).any(|w| w[0] == w[1]) {
                    return Err(illegal(self, "duplicate tool call ids in one response"));
                }
                self.usage.tokens += *usage;
                self.usage.active_ms = self.usage.active_ms.saturating_add(*duration_ms);
                self.usage.cost_usd_micros =
                    self.usage.cost_usd_micros.saturating_add(*cost_usd_micros);
                match rejected {
                    // Not an answer: counted, kept in the log, not in the
                    // conversation; a re-ask notice goes to the last user turn.
                    Some(r) => {
                        if let Some(text) = &r.reask {
                            push_user_text(&mut self.messages, text.clone());
                            self.reasks += 1;
                        }
                    }
                    None => self.messages.push(neutralised_message(message)),
                }
                if !calls.is_empty() {
                    self.pending_calls = calls;
                    self.phase = Phase::AwaitingTool;
                }
            }
            EventKind::ToolCall(ToolCallRecord {
                call_id,
                input,
                args_hash: hash,
                disposition,
                idempotency_key,
                ..
            }) => {
                if self.phase != Phase::AwaitingTool {
                    return Err(illegal(
                        self,
                        "tool.call follows a model response with tool uses",
                    ));
                }
                not_parked(self)?;
                let call = self
                    .pending_calls
                    .iter()
                    .find(|c| &c.call_id == call_id)
                    .ok_or_else(|| TransitionError::UnknownCall {
                        call_id: call_id.clone(),
                    })?;
                if call.disposition.is_some() {
                    return Err(illegal(
                        self,
                        &format!("tool call {call_id} already decided"),
                    ));
                }
                if *hash != args_hash(input) {
                    return Err(illegal(
                        self,
                        &format!("tool call {call_id}: args_hash does not match its input"),
                    ));
                }
                // Issue 32: a child call names an agent tool of the step.
                let child = if *disposition == Disposition::Child {
                    let source = self
                        .step_tools
                        .iter()
                        .find(|t| t.name == call.name)
                        .and_then(|t| t.source.as_ref());
                    let Some(crate::ToolSource::Agent {
                        agent,
                        content_hash,
                    }) = source
                    else {
                        return Err(illegal(
                            self,
                            &format!("tool call {call_id}: only an agent tool starts a child"),
                        ));
                    };
                    // The loop checked the arguments against the tool's
                    // schema; an erased log holds a tombstone instead.
                    let goal = input
                        .get("goal")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    Some(crate::children::ChildCall {
                        agent: agent.clone(),
                        content_hash: content_hash.clone(),
                        goal: goal.to_owned(),
                        key: idempotency_key.clone(),
                        child_run_id: None,
                    })
                } else {
                    None
                };
                // A call counts against `max_tool_calls` when it is decided,
                // approvals included, so approvals cannot overrun the budget.
                let counts = matches!(
                    disposition,
                    Disposition::Run { .. }
                        | Disposition::External
                        | Disposition::Approval
                        | Disposition::Wait { .. }
                        | Disposition::Child
                );
                if matches!(disposition, Disposition::Wait { .. })
                    && !self.config.builtin_tools.contains(&call.name)
                {
                    return Err(illegal(
                        self,
                        &format!(
                            "tool call {call_id} waits, but {:?} is not a built-in tool of the run",
                            call.name
                        ),
                    ));
                }
                let call = self
                    .pending_calls
                    .iter_mut()
                    .find(|c| &c.call_id == call_id)
                    .expect("checked above");
                call.disposition = Some(disposition.clone());
                call.child = child;
                if *disposition == Disposition::Approval {
                    call.approval = ApprovalStatus::Due;
                }
                if let Disposition::Wait { wait } = disposition {
                    call.wait = Some(wait.clone());
                }
                if counts {
                    self.usage.tool_calls += 1;
                }
                self.set_call_input(call_id, input);
            }
            EventKind::ApprovalRequested {
                call_id,
                args_hash: hash,
                interrupted,
                ..
            } => {
                let call = self.pending(call_id)?;
                let due = if *interrupted {
                    // A cleared call without a result: run, or approved.
                    call.result.is_none()
                        && matches!(
                            call.disposition,
                            Some(Disposition::Run { .. } | Disposition::Approval)
                        )
                        && matches!(
                            call.approval,
                            ApprovalStatus::NotNeeded | ApprovalStatus::Approved
                        )
                        && !call.external
                } else {
                    call.approval == ApprovalStatus::Due
                };
                if !due {
                    return Err(illegal(self, &format!("approval for {call_id} is not due")));
                }
                if &call.args_hash != hash {
                    return Err(TransitionError::ArgsMismatch {
                        call_id: call_id.clone(),
                        expected: call.args_hash.clone(),
                        got: hash.clone(),
                    });
                }
                let call = self.pending_mut(call_id);
                call.approval = ApprovalStatus::Requested;
                call.requested_seq = Some(event.seq);
                call.interrupted |= *interrupted;
            }
            EventKind::ApprovalResolved {
                call_id,
                args_hash: hash,
                decision,
                ..
            } => {
                let call = self.pending(call_id)?;
                if call.approval != ApprovalStatus::Requested {
                    return Err(illegal(
                        self,
                        &format!("approval for {call_id} is not pending"),
                    ));
                }
                if &call.args_hash != hash {
                    return Err(TransitionError::ArgsMismatch {
                        call_id: call_id.clone(),
                        expected: call.args_hash.clone(),
                        got: hash.clone(),
                    });
                }
                let call = self.pending_mut(call_id);
                match decision {
                    Decision::Approve => call.approval = ApprovalStatus::Approved,
                    Decision::Edit { input } => {
                        call.approval = ApprovalStatus::Approved;
                        call.edited = true;
                        self.set_call_input(call_id, input);
                    }
                    Decision::Reject { .. } | Decision::Expire => {
                        call.approval = ApprovalStatus::Rejected
                    }
                }
                self.refresh_tool_park();
            }
            EventKind::ApprovalEscalated { call_id, .. } => {
                if self.pending(call_id)?.approval != ApprovalStatus::Requested {
                    return Err(illegal(
                        self,
                        &format!("approval for {call_id} is not pending"),
                    ));
                }
            }
            EventKind::ToolRecovered { call_id, .. } => {
                if !self.pending(call_id)?.cleared_without_result() {
                    return Err(illegal(
                        self,
                        &format!("tool call {call_id} has no result to recover"),
                    ));
                }
            }
            EventKind::ToolResult {
                call_id,
                content,
                reminder,
                duration_ms,
                ..
            } => {
                let call = self.pending(call_id)?;
                let may = match &call.disposition {
                    Some(Disposition::Run { .. })
                    | Some(Disposition::External)
                    | Some(Disposition::Wait { .. }) => true,
                    Some(Disposition::Approval) => call.approval == ApprovalStatus::Approved,
                    _ => false,
                };
                if !may || call.result.is_some() {
                    return Err(illegal(
                        self,
                        &format!("tool call {call_id} cannot take a result now"),
                    ));
                }
                if self.parked.is_some() && !call.awaits_caller() && call.wait.is_none() {
                    return Err(illegal(self, "run is parked"));
                }
                let budget = self.result_budget(&call.name);
                if call.name == OUTPUT_TOOL {
                    self.output = Some(call.input.clone());
                }
                // Neutralised, then cut to the tool's result budget (the log
                // keeps the whole), then the reminder: every later request
                // and a replay see this same form.
                let shown = neutralised_content(content).cut(budget).into_owned();
                let seen = match reminder {
                    Some(r) => shown.prefixed(&Insert::Reminder.wrap(&neutralise(r))),
                    None => shown,
                };
                self.pending_mut(call_id).result = Some((seen, false));
                self.usage.active_ms = self.usage.active_ms.saturating_add(*duration_ms);
                self.finish_turn_if_complete();
            }
            EventKind::ToolError {
                call_id,
                error,
                message,
                duration_ms,
            } => {
                let call = self.pending(call_id)?;
                if call.disposition.is_none() || call.result.is_some() {
                    return Err(illegal(
                        self,
                        &format!("tool call {call_id} cannot take an error now"),
                    ));
                }
                if self.parked.is_some() && !call.awaits_caller() && call.wait.is_none() {
                    return Err(illegal(self, "run is parked"));
                }
                // `outcome_unknown` errors are glia's own (marked) text;
                // every other error text comes from a tool, a caller or a
                // person.
                let seen = if *error == ToolErrorKind::OutcomeUnknown {
                    message.clone().into()
                } else {
                    ToolContent::Text(neutralise(message).into_owned())
                        .cut(self.result_budget(&call.name))
                        .into_owned()
                };
                self.pending_mut(call_id).result = Some((seen, true));
                self.usage.active_ms = self.usage.active_ms.saturating_add(*duration_ms);
                self.finish_turn_if_complete();
            }
            // Issue 32, child runs.
            EventKind::ChildEnded {
                call_id,
                child_run_id,
                agent,
                outcome,
                usage,
                cost_usd_micros,
            } => {
                let call = self.pending(call_id)?;
                let Some(child) = call.child.as_ref() else {
                    return Err(illegal(
                        self,
                        &format!("tool call {call_id} did not start a child"),
                    ));
                };
                if call.result.is_some() || call.disposition != Some(Disposition::Child) {
                    return Err(illegal(
                        self,
                        &format!("tool call {call_id} has its result"),
                    ));
                }
                if child.agent != *agent {
                    return Err(illegal(
                        self,
                        &format!("tool call {call_id} called {}, not {agent}", child.agent),
                    ));
                }
                if self.parked == Some(PullPoint::AwaitingInput) {
                    return Err(illegal(self, "run is parked"));
                }
                if matches!(outcome, Outcome::Succeeded { .. }) && child_run_id.is_none() {
                    return Err(illegal(self, "a child that never ran did not succeed"));
                }
                let (text, is_error) = child_result(agent, outcome);
                let budget = self.result_budget(&call.name);
                let seen = ToolContent::Text(neutralise(&text).into_owned())
                    .cut(budget)
                    .into_owned();
                let call = self.pending_mut(call_id);
                call.result = Some((seen, is_error));
                if let Some(child) = call.child.as_mut() {
                    child.child_run_id = *child_run_id;
                }
                self.usage.tokens += *usage;
                self.usage.cost_usd_micros =
                    self.usage.cost_usd_micros.saturating_add(*cost_usd_micros);
                // A child may end while the run waits elsewhere (a caller's
                // result, an approval, a pause): a pause stays in force.
                let paused = match &self.parked {
                    Some(p @ PullPoint::Paused { .. }) => Some(p.clone()),
                    _ => None,
                };
                self.finish_turn_if_complete();
                if paused.is_some() {
                    self.parked = paused;
                }
            }
            EventKind::InputReceived { text, .. } => {
                if self.parked != Some(PullPoint::AwaitingInput) {
                    return Err(illegal(self, "input is taken at awaiting_input"));
                }
                push_user_text(&mut self.messages, neutralise(text).into_owned());
                self.parked = None;
                self.turn_calls = 0;
                self.reasks = 0;
                self.output = None;
                self.phase = Phase::Executing;
            }
            EventKind::GuardrailTripped {
                stage: GuardrailStage::Output,
                reask,
                ..
            } => {
                not_parked(self)?;
                if let Some(text) = reask {
                    if self.phase != Phase::Executing
                        || self
                            .messages
                            .last()
                            .is_none_or(|m| m.role != Role::Assistant)
                    {
                        return Err(illegal(
                            self,
                            "an answer is re-asked after the model answered",
                        ));
                    }
                    push_user_text(&mut self.messages, text.clone());
                }
                self.reasks += 1;
            }
            EventKind::GuardrailTripped {
                stage: GuardrailStage::Input | GuardrailStage::ToolResult,
                ..
            } => {}
            EventKind::ContextCompacted {
                messages,
                usage,
                cost_usd_micros,
                ..
            } => {
                not_parked(self)?;
                if self.phase != Phase::Executing {
                    return Err(illegal(
                        self,
                        "the context is compacted before a model call",
                    ));
                }
                if messages.last().is_none_or(|m| m.role != Role::User) {
                    return Err(illegal(self, "a compacted context ends with a user turn"));
                }
                self.messages = messages.clone();
                self.usage.tokens += *usage;
                self.usage.cost_usd_micros =
                    self.usage.cost_usd_micros.saturating_add(*cost_usd_micros);
            }
            EventKind::BudgetWarn { .. }
            | EventKind::Error { .. }
            | EventKind::ApprovalContested { .. }
            | EventKind::HookApplied { .. } => {}
            EventKind::ToolSourceUnavailable { attempt, .. } => {
                not_parked(self)?;
                let before_step = match self.phase {
                    Phase::Executing => self.step.is_none(),
                    Phase::Reflecting => true,
                    _ => false,
                };
                if !before_step {
                    return Err(illegal(
                        self,
                        "a step's tools are listed after plan.commit or step.end",
                    ));
                }
                if *attempt != self.tool_source_attempts + 1 {
                    return Err(illegal(
                        self,
                        &format!(
                            "attempt {attempt} out of order (expected {})",
                            self.tool_source_attempts + 1
                        ),
                    ));
                }
                self.tool_source_attempts = *attempt;
            }
            EventKind::ToolsChanged { .. } => not_parked(self)?,
            EventKind::BudgetExtended { limits } => {
                self.limits = *limits;
            }
            EventKind::SessionPause { pull_point } => {
                not_parked(self)?;
                match pull_point {
                    PullPoint::AwaitingTool { call_ids }
                    | PullPoint::AwaitingApproval { call_ids }
                    | PullPoint::AwaitingTimer { call_ids, .. }
                    | PullPoint::AwaitingEvent { call_ids, .. }
                    | PullPoint::AwaitingChildren { call_ids } => {
                        if self.phase != Phase::AwaitingTool
                            || self.tool_park().as_ref() != Some(pull_point)
                        {
                            return Err(illegal(
                                self,
                                &format!(
                                    "nothing to wait for at {} {call_ids:?}",
                                    pull_point.name()
                                ),
                            ));
                        }
                    }
                    PullPoint::AwaitingInput => {
                        if self.phase != Phase::Reflecting || !self.config.conversational {
                            return Err(illegal(
                                self,
                                "a conversational run waits for input after a step ends",
                            ));
                        }
                    }
                    PullPoint::Paused { reason } => {
                        if matches!(reason, PauseReason::Operator { .. }) {
                            if self.pause_due.is_none() {
                                return Err(illegal(
                                    self,
                                    "an operator pause follows a session.pause_requested",
                                ));
                            }
                            if !self.pausable() {
                                return Err(illegal(
                                    self,
                                    "an operator pause waits for the calls cleared to run",
                                ));
                            }
                            self.pause_due = None;
                        }
                    }
                }
                self.parked = Some(pull_point.clone());
            }
            EventKind::SessionPauseRequested { reason, .. } => {
                if self.pause_due.is_some()
                    || matches!(
                        &self.parked,
                        Some(PullPoint::Paused {
                            reason: PauseReason::Operator { .. }
                        })
                    )
                {
                    return Err(illegal(self, "the run is already paused or pausing"));
                }
                self.pause_due = Some(reason.clone());
            }
            EventKind::SessionResume { by } => match &self.parked {
                // Issue 32: the start time of a delayed run came (the
                // worker's answer to its wake; an operator's resume never
                // starts it early). A pause requested meanwhile stays due and
                // takes effect before the first step.
                Some(PullPoint::AwaitingTimer { call_ids, .. })
                    if call_ids.is_empty() && by.is_none() =>
                {
                    self.parked = None
                }
                // A pause not yet in effect is withdrawn first (a run parked
                // at another pause stays there: a second resume resumes it).
                _ if self.pause_due.is_some() => self.pause_due = None,
                Some(PullPoint::Paused { reason }) => {
                    if *reason == PauseReason::TurnLimit {
                        self.turn_calls = 0;
                    }
                    if matches!(reason, PauseReason::ToolSource { .. }) {
                        self.tool_source_attempts = 0;
                    }
                    self.parked = None;
                }
                _ => return Err(illegal(self, "only a paused or pausing run is resumed")),
            },
            EventKind::SessionCancel { reason } => {
                self.parked = None;
                self.phase = Phase::Done;
                self.outcome = Some(Outcome::Cancelled {
                    reason: reason.clone(),
                });
            }
            EventKind::SessionComplete { outcome } => {
                let legal = match outcome {
                    // Never with tool calls outstanding: from planning,
                    // executing (a closing message, a tool that returns
                    // directly), reflecting, awaiting_input, or paused.
                    Outcome::Succeeded { .. } => match &self.parked {
                        None => matches!(
                            self.phase,
                            Phase::Planning | Phase::Executing | Phase::Reflecting
                        ),
                        Some(p) => matches!(p, PullPoint::AwaitingInput | PullPoint::Paused { .. }),
                    },
                    Outcome::Failed { .. } | Outcome::Cancelled { .. } => self.phase != Phase::Idle,
                };
                if !legal {
                    return Err(illegal(
                        self,
                        "a run completes with no tool call outstanding; it fails from anywhere",
                    ));
                }
                self.parked = None;
                self.phase = Phase::Done;
                self.outcome = Some(outcome.clone());
            }
        }
        // HTTP hooks' recorded answers (`hook.applied` with `call`): kept
        // until the point they answer for is behind the run. No hook point
        // spans a model call or a plan's commit, and a resume asks a hook
        // whose failure paused the run again.
        match &event.kind {
            EventKind::ModelCall { .. }
            | EventKind::PlanCommit { .. }
            | EventKind::SessionResume { .. } => self.hook_answers.clear(),
            EventKind::HookApplied {
                hook,
                effect,
                call: Some(call),
                ..
            } => {
                let answer = self
                    .hook_answers
                    .entry(format!("{hook} {}", call.key))
                    .or_default();
                match effect {
                    HookEffect::Modified { payload } => answer.payload = Some(payload.clone()),
                    verdict => answer.verdict = Some(verdict.clone()),
                }
            }
            _ => {}
        }
        self.head_seq = event.seq;
        Ok(())
    }

    /// The recorded answer of the HTTP hook `hook` to the logical call
    /// `key` ([`crate::HookCall::key`]): the payload it left (when it
    /// changed it) and its verdict. `None` until its verdict is recorded:
    /// then the hook is called (again).
    pub fn hook_answer(&self, hook: &str, key: &str) -> Option<(Option<&Value>, &HookEffect)> {
        let answer = self.hook_answers.get(&format!("{hook} {key}"))?;
        Some((answer.payload.as_ref(), answer.verdict.as_ref()?))
    }

    /// True between a `model.call` and its answer: executing a step, at
    /// least one call made this turn, the conversation ending with a user turn.
    fn model_call_in_flight(&self) -> bool {
        self.phase == Phase::Executing
            && self.step.is_some()
            && self.turn_calls > 0
            && self.messages.last().is_some_and(|m| m.role == Role::User)
    }

    /// The result budget of the step's tool `name` in bytes of text
    /// ([`ToolSpec::max_result_bytes`] as frozen in `step.start`);
    /// unbounded for a tool without one (logs written before results were
    /// cut).
    fn result_budget(&self, name: &str) -> usize {
        self.step_tools
            .iter()
            .find(|t| t.name == name)
            .and_then(|t| t.max_result_bytes)
            .map_or(usize::MAX, |b| usize::try_from(b).unwrap_or(usize::MAX))
    }

    fn pending(&self, call_id: &str) -> Result<&PendingCall, TransitionError> {
        if self.phase != Phase::AwaitingTool {
            return Err(TransitionError::UnknownCall {
                call_id: call_id.to_owned(),
            });
        }
        self.call(call_id)
            .ok_or_else(|| TransitionError::UnknownCall {
                call_id: call_id.to_owned(),
            })
    }

    fn pending_mut(&mut self, call_id: &str) -> &mut PendingCall {
        self.pending_calls
            .iter_mut()
            .find(|c| c.call_id == call_id)
            .expect("pending() checked the call exists")
    }

    /// The arguments a pending call runs with (a hook's change in
    /// `tool.call`, an approver's edit): set on the pending call and in its
    /// tool-use block of the latest assistant turn that holds it, so the
    /// conversation the model sees next shows the call that ran beside its
    /// result. The original arguments stay in the log (`model.response`,
    /// `approval.requested`).
    fn set_call_input(&mut self, call_id: &str, input: &Value) {
        let call = self.pending_mut(call_id);
        call.input = input.clone();
        call.args_hash = args_hash(input);
        let turn =
            self.messages.iter_mut().rev().find(|m| {
                m.role == Role::Assistant && m.tool_uses().any(|(id, _, _)| id == call_id)
            });
        if let Some(turn) = turn {
            for block in &mut turn.content {
                if let ContentBlock::ToolUse {
                    id, input: shown, ..
                } = block
                    && id == call_id
                {
                    *shown = input.clone();
                }
            }
        }
    }

    /// The pull point the pending calls implies: approvals first, then
    /// external results; `None` when the loop can act.
    pub fn tool_park(&self) -> Option<PullPoint> {
        if self.phase != Phase::AwaitingTool
            || self.pending_calls.iter().any(PendingCall::needs_worker)
        {
            return None;
        }
        let awaiting: Vec<String> = self
            .pending_calls
            .iter()
            .filter(|c| c.approval == ApprovalStatus::Requested)
            .map(|c| c.call_id.clone())
            .collect();
        if !awaiting.is_empty() {
            return Some(PullPoint::AwaitingApproval { call_ids: awaiting });
        }
        let external: Vec<String> = self
            .pending_calls
            .iter()
            .filter(|c| c.awaits_caller())
            .map(|c| c.call_id.clone())
            .collect();
        if !external.is_empty() {
            return Some(PullPoint::AwaitingTool { call_ids: external });
        }
        // Issue 32, child runs: after approvals and caller results.
        let children: Vec<String> = self
            .pending_calls
            .iter()
            .filter(|c| c.result.is_none() && c.disposition == Some(Disposition::Child))
            .map(|c| c.call_id.clone())
            .collect();
        if !children.is_empty() {
            return Some(PullPoint::AwaitingChildren { call_ids: children });
        }
        // --- issue 32: waits --- (after approvals, caller results and
        // children; an event wait before a timer: its pull point carries the
        // earliest due time of every wait of the turn, timers included)
        let waiting: Vec<&PendingCall> = self
            .pending_calls
            .iter()
            .filter(|c| c.result.is_none() && c.wait.is_some())
            .collect();
        let due = waiting
            .iter()
            .filter_map(|c| c.wait.as_ref().map(crate::wait::Wait::due_at_ms))
            .min()?;
        let call_ids: Vec<String> = waiting.iter().map(|c| c.call_id.clone()).collect();
        let mut keys: Vec<String> = waiting
            .iter()
            .filter_map(|c| c.wait.as_ref().and_then(|w| w.key()).map(str::to_owned))
            .collect();
        keys.sort();
        keys.dedup();
        if keys.is_empty() {
            Some(PullPoint::AwaitingTimer {
                call_ids,
                wake_at_ms: due,
            })
        } else {
            Some(PullPoint::AwaitingEvent {
                call_ids,
                keys,
                timeout_at_ms: Some(due),
            })
        }
        // --- end waits ---
    }

    /// After a payload arrives at a tool pull point: stay parked on what is
    /// still due, or unpark when the loop can act.
    fn refresh_tool_park(&mut self) {
        if matches!(
            self.parked,
            Some(
                PullPoint::AwaitingTool { .. }
                    | PullPoint::AwaitingApproval { .. }
                    | PullPoint::AwaitingTimer { .. }
                    | PullPoint::AwaitingEvent { .. }
                    | PullPoint::AwaitingChildren { .. }
            )
        ) {
            self.parked = self.tool_park();
        }
    }

    /// When every pending call has a result: append them as one user
    /// turn, in call order, and go back to executing.
    fn finish_turn_if_complete(&mut self) {
        if self.pending_calls.iter().any(|c| c.result.is_none()) {
            self.refresh_tool_park();
            return;
        }
        let results = self
            .pending_calls
            .drain(..)
            .map(|c| {
                let (content, is_error) = c.result.expect("checked above");
                ContentBlock::ToolResult {
                    tool_use_id: c.call_id,
                    content,
                    is_error,
                }
            })
            .collect();
        self.messages.push(Message {
            role: Role::User,
            content: results,
        });
        self.parked = None;
        self.phase = Phase::Executing;
    }
}

/// The text the parent's model sees for a child that ended with
/// `outcome`, and whether it is an error: the structured output as JSON
/// when the child has an output schema, else its answer; a failure or a
/// cancel is an error naming the agent.
fn child_result(agent: &str, outcome: &Outcome) -> (String, bool) {
    match outcome {
        Outcome::Succeeded {
            output: Some(output),
            ..
        } => (output.to_string(), false),
        Outcome::Succeeded { answer, .. } => (answer.clone(), false),
        Outcome::Failed { error } => (format!("The agent {agent} failed: {error}"), true),
        Outcome::Cancelled { reason } => {
            (format!("The agent {agent} was cancelled: {reason}"), true)
        }
    }
}

/// Append `text` as a user turn, or as a new block of the last message when
/// that is already a user turn (roles must alternate).
fn push_user_text(messages: &mut Vec<Message>, text: String) {
    match messages.last_mut() {
        Some(m) if m.role == Role::User => m.content.push(ContentBlock::Text { text }),
        _ => messages.push(Message::user(text)),
    }
}

/// A model's message as it enters the conversation: its text blocks
/// neutralised ([`neutralise`]); thinking (signed) and tool uses unchanged.
fn neutralised_message(message: &Message) -> Message {
    let mut m = message.clone();
    for block in &mut m.content {
        if let ContentBlock::Text { text } = block {
            *text = neutralise(text).into_owned();
        }
    }
    m
}

/// A tool's result as it enters the conversation: its text neutralised
/// ([`neutralise`]); borrowed when nothing needed it.
fn neutralised_content(content: &ToolContent) -> Cow<'_, ToolContent> {
    let forged = |text: &str| text.contains(crate::marker::PREFIX);
    let clean = match content {
        ToolContent::Text(text) => !forged(text),
        ToolContent::Blocks(blocks) => !blocks
            .iter()
            .any(|b| matches!(b, ResultBlock::Text { text } if forged(text))),
    };
    if clean {
        return Cow::Borrowed(content);
    }
    Cow::Owned(match content {
        ToolContent::Text(text) => ToolContent::Text(neutralise(text).into_owned()),
        ToolContent::Blocks(blocks) => ToolContent::Blocks(
            blocks
                .iter()
                .map(|b| match b {
                    ResultBlock::Text { text } => ResultBlock::text(neutralise(text).into_owned()),
                    other => other.clone(),
                })
                .collect(),
        ),
    })
}
