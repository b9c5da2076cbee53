//! What a run's records look like after its content is erased: the one
//! definition of a *tombstone*, which every store writes and every reader
//! (replay, the API, exports) meets.
//!
//! Erasure (`DELETE /v1/runs/{id}`, or the retention sweeper) keeps a run's
//! log consistent: every event stays, with its sequence number, its kind,
//! its time, its ids (call ids, tool names, idempotency keys), its flags
//! and counts, and its spend (usage, cost, durations), so counts and costs
//! are unchanged; every piece of *content* becomes the marked text
//! [`TOMBSTONE`]. Content is what flowed through the run: the goal, user
//! messages, every message's text, thinking and images, tool arguments
//! (as the model asked, as decided, as edited by an approver), tool results
//! and error texts, model answers and structured output, plan step
//! descriptions, people's and hooks' reasons, and the failure text of an
//! outcome. What is kept: the run's configuration (the operator's or
//! agent's definition, not the run's content), tool specs, names of
//! guardrails and rules, who decided, stop reasons, and every number.
//!
//! An erased log still replays ([`crate::RunState::replay`]) to a state
//! with the same phase, outcome kind, head and usage: arguments become the
//! JSON string [`TOMBSTONE`] wherever they appear (the model's tool use, the
//! decided call, the approval, an edit), and their hash
//! ([`erased_args_hash`]) is the hash of that string, so the chain of
//! `args_hash` checks holds. Erasing is idempotent: an erased record erased
//! again is unchanged.
//!
//! The marker is glia's ([`crate::marker::Insert::Erased`]): text a tenant
//! writes that starts with it is neutralised where it enters a conversation,
//! like every marker; whether a run *is* erased is its store's record
//! (`erased_at`), never guessed from text.

use serde_json::Value;

use crate::event::{Decision, Disposition, HookEffect, Outcome, PauseReason, PullPoint};
use crate::{ContentBlock, Event, EventKind, Message, Payload, ResultBlock, ToolContent};

/// The text every piece of erased content becomes:
/// [`crate::marker::Insert::Erased`]'s marker and `content erased`.
pub const TOMBSTONE: &str = "⟦glia:erased⟧ content erased";

/// `text` erased: [`TOMBSTONE`], or empty when it was empty (an empty
/// answer of a skipped step holds nothing to erase).
pub fn erased_text(text: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        TOMBSTONE.to_owned()
    }
}

/// Erased JSON (tool arguments, structured output, a hook's payload): the
/// JSON string [`TOMBSTONE`].
pub fn erased_value() -> Value {
    Value::String(TOMBSTONE.to_owned())
}

/// The arguments hash of erased arguments ([`crate::args_hash`] of
/// [`erased_value`]): what every `args_hash` of an erased run reads.
pub fn erased_args_hash() -> String {
    crate::args_hash(&erased_value())
}

fn erased_opt(text: &Option<String>) -> Option<String> {
    text.as_deref().map(erased_text)
}

fn erased_texts(texts: &[String]) -> Vec<String> {
    texts.iter().map(|t| erased_text(t)).collect()
}

impl Message {
    /// This message with its content erased: the role and the number and
    /// kinds of blocks stay (a tool use keeps its id and name, a tool result
    /// its call id and error flag), every text, thinking, argument, result
    /// and image becomes [`TOMBSTONE`]. A thinking block loses its
    /// signature; a redacted thinking block's payload becomes the tombstone.
    pub fn erased(&self) -> Message {
        let content = self
            .content
            .iter()
            .map(|b| match b {
                ContentBlock::Text { text } => ContentBlock::Text {
                    text: erased_text(text),
                },
                ContentBlock::ToolUse { id, name, .. } => ContentBlock::ToolUse {
                    id: id.clone(),
                    name: name.clone(),
                    input: erased_value(),
                },
                ContentBlock::ToolResult {
                    tool_use_id,
                    content,
                    is_error,
                } => ContentBlock::ToolResult {
                    tool_use_id: tool_use_id.clone(),
                    content: content.erased(),
                    is_error: *is_error,
                },
                ContentBlock::Thinking { thinking, .. } => ContentBlock::Thinking {
                    thinking: erased_text(thinking),
                    signature: String::new(),
                },
                ContentBlock::RedactedThinking { .. } => ContentBlock::RedactedThinking {
                    data: TOMBSTONE.to_owned(),
                },
            })
            .collect();
        Message {
            role: self.role,
            content,
        }
    }
}

impl ToolContent {
    /// This result erased: [`TOMBSTONE`] as text (images included).
    pub fn erased(&self) -> ToolContent {
        match self {
            ToolContent::Text(text) => ToolContent::Text(erased_text(text)),
            ToolContent::Blocks(blocks) if blocks.is_empty() => ToolContent::Blocks(Vec::new()),
            ToolContent::Blocks(_) => ToolContent::Blocks(vec![ResultBlock::text(TOMBSTONE)]),
        }
    }
}

impl Outcome {
    /// This outcome erased: the kind stays; the answer, the structured
    /// output, the failure text and the cancel reason become [`TOMBSTONE`].
    pub fn erased(&self) -> Outcome {
        match self {
            Outcome::Succeeded { answer, output } => Outcome::Succeeded {
                answer: erased_text(answer),
                output: output.as_ref().map(|_| erased_value()),
            },
            Outcome::Failed { error } => Outcome::Failed {
                error: erased_text(error),
            },
            Outcome::Cancelled { reason } => Outcome::Cancelled {
                reason: erased_text(reason),
            },
        }
    }
}

impl PullPoint {
    /// This pull point erased: call ids and kinds stay; a pause's free-text
    /// reason (a hook's, a provider's, a tool source's, an operator's)
    /// becomes [`TOMBSTONE`].
    pub fn erased(&self) -> PullPoint {
        match self {
            PullPoint::Paused { reason } => PullPoint::Paused {
                reason: match reason {
                    PauseReason::Hook { hook, reason } => PauseReason::Hook {
                        hook: hook.clone(),
                        reason: erased_text(reason),
                    },
                    PauseReason::Provider { reason } => PauseReason::Provider {
                        reason: erased_text(reason),
                    },
                    PauseReason::ToolSource { server, reason } => PauseReason::ToolSource {
                        server: server.clone(),
                        reason: erased_text(reason),
                    },
                    PauseReason::Operator { reason } => PauseReason::Operator {
                        reason: erased_text(reason),
                    },
                    other @ (PauseReason::Budget { .. }
                    | PauseReason::TurnLimit
                    | PauseReason::ModelStop { .. }) => other.clone(),
                },
            },
            // issue 32: waits. Event keys are the tenant's text: erased
            // (to one tombstone, as the waits' keys in `tool.call` erase to
            // the same text, so the log still replays).
            PullPoint::AwaitingEvent {
                call_ids,
                keys,
                timeout_at_ms,
            } => PullPoint::AwaitingEvent {
                call_ids: call_ids.clone(),
                keys: if keys.is_empty() {
                    Vec::new()
                } else {
                    vec![TOMBSTONE.to_owned()]
                },
                timeout_at_ms: *timeout_at_ms,
            },
            other => other.clone(),
        }
    }
}

impl Decision {
    /// This decision erased: an edit's arguments and a rejection's reason
    /// become [`TOMBSTONE`].
    pub fn erased(&self) -> Decision {
        match self {
            Decision::Reject { reason } => Decision::Reject {
                reason: erased_text(reason),
            },
            Decision::Edit { .. } => Decision::Edit {
                input: erased_value(),
            },
            other @ (Decision::Approve | Decision::Expire) => other.clone(),
        }
    }
}

impl crate::HookCall {
    /// This hook call erased: the key's last part, a hash of the payload
    /// (arguments, descriptions, results), becomes `erased`
    /// (`before_tool_call:3:c1:erased`); its topic, turn and subject, the
    /// outcome and the duration stay. (A resumed erased run asks its hooks
    /// again rather than take an answer about content it no longer holds.)
    pub fn erased(&self) -> crate::HookCall {
        let point = self.key.rsplit_once(':').map_or("", |(point, _)| point);
        crate::HookCall {
            key: format!("{point}:erased"),
            ..self.clone()
        }
    }
}

impl Payload {
    /// This posted payload erased: a decision's edit and reason, an external
    /// result's text, a user's message, a pause's or cancel's reason become
    /// [`TOMBSTONE`]; an approval's hash becomes [`erased_args_hash`]; ids,
    /// who, limits and deadlines stay.
    pub fn erased(&self) -> Payload {
        match self {
            // Who, what they chose and when: no content.
            Payload::ApprovalContested { .. } => self.clone(),
            Payload::Approval {
                call_id,
                decision,
                by,
                request_seq,
                ..
            } => Payload::Approval {
                call_id: call_id.clone(),
                args_hash: erased_args_hash(),
                decision: decision.erased(),
                by: by.clone(),
                request_seq: *request_seq,
            },
            Payload::ToolResult {
                call_id,
                content,
                is_error,
            } => Payload::ToolResult {
                call_id: call_id.clone(),
                content: erased_text(content),
                is_error: *is_error,
            },
            Payload::Input { text, redactions } => Payload::Input {
                text: erased_text(text),
                redactions: redactions.clone(),
            },
            Payload::Pause { reason, by } => Payload::Pause {
                reason: erased_text(reason),
                by: by.clone(),
            },
            Payload::Close { text, redactions } => Payload::Close {
                text: erased_opt(text),
                redactions: redactions.clone(),
            },
            Payload::Cancel { reason } => Payload::Cancel {
                reason: erased_text(reason),
            },
            // issue 32: waits. An event's key and payload are content.
            Payload::Wake { due_at_ms, event } => Payload::Wake {
                due_at_ms: *due_at_ms,
                event: event.as_ref().map(|e| crate::ArrivedEvent {
                    id: e.id,
                    key: TOMBSTONE.to_owned(),
                    payload: erased_value(),
                    received_at_ms: e.received_at_ms,
                }),
            },
            // Issue 32: the child's answer, output or error is content.
            Payload::ChildEnded {
                call_id,
                child_run_id,
                outcome,
                usage,
                cost_usd_micros,
            } => Payload::ChildEnded {
                call_id: call_id.clone(),
                child_run_id: *child_run_id,
                outcome: outcome.erased(),
                usage: *usage,
                cost_usd_micros: *cost_usd_micros,
            },
            other @ (Payload::ExtendBudget { .. }
            | Payload::Resume { .. }
            | Payload::Escalate { .. }) => other.clone(),
        }
    }
}

impl Event {
    /// This event with its content erased ([`EventKind::erased`]); run, seq
    /// and time stay.
    pub fn erased(&self) -> Event {
        Event {
            run_id: self.run_id,
            seq: self.seq,
            at: self.at,
            kind: self.kind.erased(),
        }
    }
}

impl EventKind {
    /// This event's tombstone: the same kind, ids, flags, counts and spend,
    /// every piece of content [`TOMBSTONE`] (see the [module](self) for what
    /// is content). `EventKind::spend` and `EventKind::name` answer
    /// the same for the tombstone as for the event.
    pub fn erased(&self) -> EventKind {
        use EventKind as K;
        match self {
            // Who, what they chose and when: no content.
            K::ApprovalContested { .. } => self.clone(),
            K::SessionStart {
                goal,
                config,
                redactions,
            } => K::SessionStart {
                goal: erased_text(goal),
                config: erased_config(config),
                redactions: redactions.clone(),
            },
            K::PlanDraft {
                steps,
                usage,
                cost_usd_micros,
            } => K::PlanDraft {
                steps: erased_texts(steps),
                usage: *usage,
                cost_usd_micros: *cost_usd_micros,
            },
            K::PlanCommit { steps } => K::PlanCommit {
                steps: erased_texts(steps),
            },
            K::StepStart {
                index,
                description,
                tools,
            } => K::StepStart {
                index: *index,
                description: erased_text(description),
                tools: tools.clone(),
            },
            K::StepEnd {
                index,
                answer,
                skipped,
            } => K::StepEnd {
                index: *index,
                answer: erased_text(answer),
                skipped: *skipped,
            },
            K::ModelRetry(retry) => {
                let mut retry = retry.clone();
                retry.message = erased_text(&retry.message);
                K::ModelRetry(retry)
            }
            K::ModelResponse {
                message,
                usage,
                stop_reason,
                duration_ms,
                cost_usd_micros,
                rejected,
                redactions,
            } => K::ModelResponse {
                message: message.erased(),
                usage: *usage,
                stop_reason: stop_reason.clone(),
                duration_ms: *duration_ms,
                cost_usd_micros: *cost_usd_micros,
                rejected: rejected.as_ref().map(|r| {
                    let mut r = r.clone();
                    r.reask = erased_opt(&r.reask);
                    r
                }),
                redactions: redactions.clone(),
            },
            K::ToolCall(record) => {
                let mut record = record.clone();
                record.input = erased_value();
                record.args_hash = erased_args_hash();
                record.disposition = match &record.disposition {
                    Disposition::Run { reminder } => Disposition::Run {
                        reminder: erased_opt(reminder),
                    },
                    Disposition::Refused { error, message } => Disposition::Refused {
                        error: *error,
                        message: erased_text(message),
                    },
                    // issue 32: waits. The key is the tenant's text.
                    Disposition::Wait { wait } => Disposition::Wait {
                        wait: match wait {
                            crate::Wait::Event {
                                started_at_ms,
                                timeout_at_ms,
                                ..
                            } => crate::Wait::Event {
                                key: TOMBSTONE.to_owned(),
                                started_at_ms: *started_at_ms,
                                timeout_at_ms: *timeout_at_ms,
                            },
                            timer @ crate::Wait::Timer { .. } => timer.clone(),
                        },
                    },
                    other
                    @ (Disposition::External | Disposition::Approval | Disposition::Child) => {
                        other.clone()
                    }
                };
                K::ToolCall(record)
            }
            K::ToolResult {
                call_id,
                content,
                reminder,
                duration_ms,
                redactions,
            } => K::ToolResult {
                call_id: call_id.clone(),
                content: content.erased(),
                reminder: erased_opt(reminder),
                duration_ms: *duration_ms,
                redactions: redactions.clone(),
            },
            K::ToolError {
                call_id,
                error,
                message,
                duration_ms,
            } => K::ToolError {
                call_id: call_id.clone(),
                error: *error,
                message: erased_text(message),
                duration_ms: *duration_ms,
            },
            K::ToolSourceUnavailable {
                server,
                reason,
                attempt,
                retry_in_ms,
            } => K::ToolSourceUnavailable {
                server: server.clone(),
                reason: erased_text(reason),
                attempt: *attempt,
                retry_in_ms: *retry_in_ms,
            },
            K::ApprovalRequested {
                call_id,
                tool,
                expires_at,
                interrupted,
                ..
            } => K::ApprovalRequested {
                call_id: call_id.clone(),
                tool: tool.clone(),
                input: erased_value(),
                args_hash: erased_args_hash(),
                expires_at: *expires_at,
                interrupted: *interrupted,
            },
            K::ApprovalResolved {
                call_id,
                decision,
                by,
                ..
            } => K::ApprovalResolved {
                call_id: call_id.clone(),
                args_hash: erased_args_hash(),
                decision: decision.erased(),
                by: by.clone(),
            },
            K::InputReceived { text, redactions } => K::InputReceived {
                text: erased_text(text),
                redactions: redactions.clone(),
            },
            K::GuardrailTripped {
                stage,
                guardrail,
                reason,
                reask,
            } => K::GuardrailTripped {
                stage: *stage,
                guardrail: guardrail.clone(),
                reason: erased_text(reason),
                reask: erased_opt(reask),
            },
            K::ContextCompacted {
                strategy,
                removed,
                messages,
                usage,
                cost_usd_micros,
            } => K::ContextCompacted {
                strategy: strategy.clone(),
                removed: *removed,
                messages: messages.iter().map(Message::erased).collect(),
                usage: *usage,
                cost_usd_micros: *cost_usd_micros,
            },
            K::SessionPause { pull_point } => K::SessionPause {
                pull_point: pull_point.erased(),
            },
            K::SessionPauseRequested { reason, by } => K::SessionPauseRequested {
                reason: erased_text(reason),
                by: by.clone(),
            },
            K::SessionCancel { reason } => K::SessionCancel {
                reason: erased_text(reason),
            },
            K::SessionComplete { outcome } => K::SessionComplete {
                outcome: outcome.erased(),
            },
            // Issue 32: the child's answer, output or error is content;
            // ids, the agent, usage and cost stay.
            K::ChildEnded {
                call_id,
                child_run_id,
                agent,
                outcome,
                usage,
                cost_usd_micros,
            } => K::ChildEnded {
                call_id: call_id.clone(),
                child_run_id: *child_run_id,
                agent: agent.clone(),
                outcome: outcome.erased(),
                usage: *usage,
                cost_usd_micros: *cost_usd_micros,
            },
            K::Error { message, fatal } => K::Error {
                message: erased_text(message),
                fatal: *fatal,
            },
            K::HookApplied {
                topic,
                hook,
                effect,
                call,
            } => K::HookApplied {
                topic: *topic,
                hook: hook.clone(),
                call: call.as_ref().map(crate::HookCall::erased),
                effect: match effect {
                    HookEffect::Continued => HookEffect::Continued,
                    HookEffect::Modified { .. } => HookEffect::Modified {
                        payload: erased_value(),
                    },
                    HookEffect::Cancelled { reason } => HookEffect::Cancelled {
                        reason: erased_text(reason),
                    },
                    HookEffect::Paused { reason } => HookEffect::Paused {
                        reason: erased_text(reason),
                    },
                    HookEffect::Skipped => HookEffect::Skipped,
                },
            },
            // Ids, names, counts, limits and usage only: nothing to erase.
            other @ (K::ModelCall { .. }
            | K::MessageElided { .. }
            | K::ToolRecovered { .. }
            | K::ToolsChanged { .. }
            | K::ApprovalEscalated { .. }
            | K::BudgetWarn { .. }
            | K::BudgetExtended { .. }
            | K::SessionResume { .. }) => other.clone(),
        }
    }
}

/// `config` with its recorded tools' call inputs and outputs erased (they
/// are content of the runs they were recorded from); the rest is not content.
fn erased_config(config: &crate::RunConfig) -> crate::RunConfig {
    let mut config = config.clone();
    if let Some(recorded) = config.recorded_tools.as_mut() {
        for call in &mut recorded.calls {
            call.input = serde_json::Value::String(TOMBSTONE.to_owned());
            call.output = crate::ToolContent::Text(TOMBSTONE.to_owned());
        }
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::marker::{Insert, classify};

    #[test]
    fn the_tombstone_is_the_erased_marker() {
        assert_eq!(TOMBSTONE, Insert::Erased.wrap("content erased"));
        assert_eq!(classify(TOMBSTONE), Some(Insert::Erased));
        assert_eq!(erased_text(""), "");
        assert_eq!(erased_text("Alice's card 4242"), TOMBSTONE);
    }

    #[test]
    fn a_hook_calls_payload_hash_is_erased() {
        let applied = EventKind::HookApplied {
            topic: crate::HookTopic::BeforeToolCall,
            hook: "limit".into(),
            effect: HookEffect::Continued,
            call: Some(crate::HookCall {
                key: "before_tool_call:3:c1:0123456789abcdef".into(),
                outcome: crate::HookOutcome::Answered,
                duration_ms: 12,
            }),
        };
        let EventKind::HookApplied { call, hook, .. } = applied.erased() else {
            unreachable!()
        };
        let call = call.unwrap();
        assert_eq!(call.key, "before_tool_call:3:c1:erased");
        assert_eq!(hook, "limit");
        assert_eq!(call.outcome, crate::HookOutcome::Answered);
        assert_eq!(call.duration_ms, 12);
        assert!(
            !serde_json::to_string(&call)
                .unwrap()
                .contains("0123456789abcdef")
        );
    }

    #[test]
    fn recorded_calls_in_the_config_are_content() {
        let config = crate::RunConfig {
            recorded_tools: Some(
                serde_json::from_value(serde_json::json!({
                    "tools": [{"name": "card", "input_schema": {"type": "object"}}],
                    "calls": [{"name": "card", "input": {"owner": "Alice"}, "output": "4242"}]
                }))
                .unwrap(),
            ),
            ..Default::default()
        };
        let start = EventKind::SessionStart {
            goal: "g".into(),
            config,
            redactions: Vec::new(),
        };
        let EventKind::SessionStart { config, .. } = start.erased() else {
            unreachable!()
        };
        let recorded = config.recorded_tools.unwrap();
        assert_eq!(recorded.tools[0].name, "card", "names are not content");
        assert_eq!(recorded.calls[0].name, "card");
        assert_eq!(recorded.calls[0].input, Value::String(TOMBSTONE.into()));
        assert_eq!(
            recorded.calls[0].output,
            ToolContent::Text(TOMBSTONE.into())
        );
    }
}
