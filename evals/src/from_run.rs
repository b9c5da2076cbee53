//! A replay case from a recorded glia run (`glia eval dataset from-runs`).
//!
//! The case keeps the run's inputs and what it did, so another agent
//! version can be tried on the same inputs without touching the systems
//! the run reached:
//!
//! - `goal` from `session.start`; `turns`, the user messages the run
//!   received after it (`input.received`), the last of them the `farewell`
//!   when no model call followed it;
//! - `expected.answer` (and `expected.output`, with structured output): the
//!   run's answer; `expected.tools`: its tool calls, `{"name", "input"}` in
//!   order, every `tool.call` as the trajectory grader counts them;
//! - `recorded_tools` ([`glia_proto::recorded`]): every tool its steps
//!   offered (not glia's built-in waits nor the output tool), an approval
//!   kept where one was required, and each call's recorded answer under
//!   the arguments it ran with (an approver's edit applied): a result, or
//!   the tool's own error (a failure, a timeout, invalid output); a call
//!   glia refused, a person rejected, whose outcome is unknown, or that has
//!   no answer yet, is not recorded;
//! - `metadata.source_run`: the run's id (and `source_agent`, `name@version`,
//!   when it ran a registered agent).
//!
//! Only a run that succeeded, and whose content is not erased, makes a
//! case: its answer is what the case expects.

use std::collections::BTreeMap;

use glia_proto::recorded::{RecordedCall, RecordedToolSpec, RecordedTools};
use glia_proto::{Disposition, Event, EventKind, OUTPUT_TOOL, Outcome, ToolContent, ToolErrorKind};
use serde_json::{Map, Value, json};

use crate::dataset::Case;

/// The case of run `events` (a whole log, from `session.start`), with id
/// `id`. Errors (a sentence): the run has not succeeded, or its log has no
/// `session.start`.
pub fn case_from_run(id: &str, events: &[Event]) -> Result<Case, String> {
    let Some(first) = events.first() else {
        return Err("the run has no events".into());
    };
    let EventKind::SessionStart { goal, config, .. } = &first.kind else {
        return Err("the run's log does not begin with session.start".into());
    };
    if goal == glia_proto::TOMBSTONE {
        return Err("the run's content was erased".into());
    }
    let mut texts: Vec<(String, bool)> = Vec::new(); // (text, a model call followed)
    let mut offered: Vec<RecordedToolSpec> = Vec::new();
    let mut trajectory: Vec<Value> = Vec::new();
    // Calls that may get an answer, in log order: (call id, tool, the
    // arguments it runs with, its answer and whether that is an error).
    type Answered = Option<(ToolContent, bool)>;
    let mut calls: Vec<(String, String, Value, Answered)> = Vec::new();
    // The open call with this id (ids may repeat across turns).
    fn open<'a>(
        calls: &'a mut [(String, String, Value, Answered)],
        id: &str,
    ) -> Option<&'a mut (String, String, Value, Answered)> {
        calls.iter_mut().rev().find(|c| c.0 == id && c.3.is_none())
    }
    let mut outcome = None;
    for e in events {
        match &e.kind {
            EventKind::InputReceived { text, .. } => texts.push((text.clone(), false)),
            EventKind::ModelCall { .. } => {
                if let Some(last) = texts.last_mut() {
                    last.1 = true;
                }
            }
            EventKind::StepStart { tools, .. } => {
                for t in tools {
                    let builtin = t.source.is_none()
                        && glia_proto::wait::BUILTIN_TOOLS.contains(&t.name.as_str());
                    if t.name == OUTPUT_TOOL || builtin || offered.iter().any(|o| o.name == t.name)
                    {
                        continue;
                    }
                    offered.push(RecordedToolSpec {
                        name: t.name.clone(),
                        description: t.description.clone(),
                        input_schema: t.input_schema.clone(),
                        requires_approval: t.requires_approval(),
                    });
                }
            }
            EventKind::ToolCall(call) => {
                trajectory.push(json!({"name": call.name, "input": call.input}));
                let refused = matches!(
                    call.disposition,
                    Disposition::Refused { .. } | Disposition::Wait { .. }
                );
                if !refused && call.name != OUTPUT_TOOL {
                    calls.push((
                        call.call_id.clone(),
                        call.name.clone(),
                        call.input.clone(),
                        None,
                    ));
                }
            }
            EventKind::ApprovalResolved {
                call_id,
                decision: glia_proto::Decision::Edit { input },
                ..
            } => {
                if let Some(call) = open(&mut calls, call_id) {
                    call.2 = input.clone();
                }
            }
            EventKind::ToolResult {
                call_id, content, ..
            } => {
                if let Some(call) = open(&mut calls, call_id) {
                    call.3 = Some((content.clone(), false));
                }
            }
            EventKind::ToolError {
                call_id,
                error,
                message,
                ..
            } => {
                if let Some(call) = open(&mut calls, call_id) {
                    // Glia's decision about a call is no answer of the tool.
                    call.3 = Some((ToolContent::Text(message.clone()), true))
                        .filter(|_| the_tools_own(*error));
                    if call.3.is_none() {
                        call.0.clear(); // closed, unanswered
                    }
                }
            }
            EventKind::SessionComplete { outcome: o } => outcome = Some(o.clone()),
            _ => {}
        }
    }
    let (answer, output) = match outcome {
        Some(Outcome::Succeeded { answer, output }) => (answer, output),
        Some(Outcome::Failed { error }) => return Err(format!("the run failed: {error}")),
        Some(Outcome::Cancelled { reason }) => {
            return Err(format!("the run was cancelled: {reason}"));
        }
        None => return Err("the run has not finished".into()),
    };
    let farewell = match texts.last() {
        Some((_, false)) => texts.pop().map(|(text, _)| text),
        _ => None,
    };
    let mut expected = Map::new();
    expected.insert("answer".into(), Value::String(answer));
    if let Some(output) = output {
        expected.insert("output".into(), output);
    }
    expected.insert("tools".into(), Value::Array(trajectory));
    let recorded = RecordedTools {
        calls: calls
            .into_iter()
            .filter(|(_, name, ..)| offered.iter().any(|t| &t.name == name))
            .filter_map(|(_, name, input, answer)| {
                let (output, error) = answer?;
                Some(RecordedCall {
                    name,
                    input,
                    output,
                    error,
                })
            })
            .collect(),
        tools: offered,
    };
    recorded
        .validate()
        .map_err(|e| format!("its recording cannot be replayed: {e}"))?;
    let mut metadata = BTreeMap::from([("source_run".to_owned(), first.run_id.to_string())]);
    if let Some(agent) = &config.agent {
        metadata.insert(
            "source_agent".into(),
            format!("{}@{}", agent.name, agent.version),
        );
    }
    Ok(Case {
        id: id.to_owned(),
        goal: goal.clone(),
        turns: texts.into_iter().map(|(text, _)| text).collect(),
        farewell,
        expected,
        metadata,
        config: None,
        recorded_tools: Some(recorded),
    })
}

/// Whether an error kind is the tool's own answer (recorded), not glia's
/// decision about the call (refused, rejected, cancelled: not recorded).
fn the_tools_own(kind: ToolErrorKind) -> bool {
    match kind {
        ToolErrorKind::Failed
        | ToolErrorKind::InvalidOutput
        | ToolErrorKind::Panicked
        | ToolErrorKind::Timeout => true,
        ToolErrorKind::UnknownTool
        | ToolErrorKind::Unavailable
        | ToolErrorKind::InvalidArguments
        | ToolErrorKind::Denied
        | ToolErrorKind::Rejected
        | ToolErrorKind::Cancelled
        | ToolErrorKind::OutcomeUnknown
        | ToolErrorKind::BudgetExceeded
        | ToolErrorKind::Expired => false,
    }
}

#[cfg(test)]
mod tests {
    use glia_proto::{Decision, RunConfig, ToolCallRecord, ToolSpec};
    use serde_json::json;
    use uuid::Uuid;

    use super::*;

    fn log(kinds: Vec<EventKind>) -> Vec<Event> {
        kinds
            .into_iter()
            .enumerate()
            .map(|(i, kind)| Event {
                run_id: Uuid::from_u128(7),
                seq: i as u64 + 1,
                at: chrono::DateTime::UNIX_EPOCH,
                kind,
            })
            .collect()
    }

    fn start(goal: &str) -> EventKind {
        EventKind::SessionStart {
            goal: goal.into(),
            config: RunConfig::default(),
            redactions: Vec::new(),
        }
    }

    fn step() -> EventKind {
        let tool = |name: &str| ToolSpec::new(name, "", json!({"type": "object"}));
        let sleep = glia_proto::config::builtin_tool_spec("sleep").unwrap();
        EventKind::StepStart {
            index: 0,
            description: "goal".into(),
            tools: vec![tool("get"), tool("pay"), sleep],
        }
    }

    fn call(id: &str, name: &str, input: Value, disposition: Disposition) -> EventKind {
        EventKind::ToolCall(ToolCallRecord {
            call_id: id.into(),
            name: name.into(),
            input: input.clone(),
            args_hash: glia_proto::args_hash(&input),
            idempotency_key: format!("k:{id}"),
            disposition,
        })
    }

    fn run() -> Disposition {
        Disposition::Run { reminder: None }
    }

    fn result(id: &str, text: &str) -> EventKind {
        EventKind::ToolResult {
            call_id: id.into(),
            content: ToolContent::Text(text.into()),
            reminder: None,
            duration_ms: 1,
            redactions: Vec::new(),
        }
    }

    fn error(id: &str, error: ToolErrorKind) -> EventKind {
        EventKind::ToolError {
            call_id: id.into(),
            error,
            message: format!("{error:?}"),
            duration_ms: 1,
        }
    }

    fn model() -> EventKind {
        EventKind::ModelCall {
            model: "m".into(),
            messages: 1,
            wrap_up: false,
            forced_tool: None,
        }
    }

    fn done(answer: &str) -> EventKind {
        EventKind::SessionComplete {
            outcome: Outcome::Succeeded {
                answer: answer.into(),
                output: None,
            },
        }
    }

    fn input(text: &str) -> EventKind {
        EventKind::InputReceived {
            text: text.into(),
            redactions: Vec::new(),
        }
    }

    #[test]
    fn a_run_becomes_a_case_with_its_recording() {
        let events = log(vec![
            start("Pay order 7"),
            step(),
            model(),
            call("c0", "get", json!({"id": 7}), run()),
            result("c0", "open"),
            // The same id again in a later turn, answered by the tool's error.
            call("c0", "get", json!({"id": 7}), run()),
            error("c0", ToolErrorKind::Timeout),
            // An approver edited the amount: recorded as it ran.
            call("c1", "pay", json!({"amount": 90}), Disposition::Approval),
            EventKind::ApprovalResolved {
                call_id: "c1".into(),
                args_hash: "h".into(),
                decision: Decision::Edit {
                    input: json!({"amount": 80}),
                },
                by: None,
            },
            result("c1", "paid 80"),
            // Refused, rejected and unknown: no answer of the tool's.
            call(
                "c2",
                "pay",
                json!({}),
                Disposition::Refused {
                    error: ToolErrorKind::Denied,
                    message: "no".into(),
                },
            ),
            error("c2", ToolErrorKind::Denied),
            call("c3", "pay", json!({"amount": 1}), run()),
            error("c3", ToolErrorKind::OutcomeUnknown),
            input("Thanks, and order 8?"),
            model(),
            input("Bye!"),
            done("Paid."),
        ]);
        let case = case_from_run("c", &events).unwrap();
        assert_eq!(case.goal, "Pay order 7");
        assert_eq!(case.turns, ["Thanks, and order 8?"]);
        assert_eq!(case.farewell.as_deref(), Some("Bye!"));
        assert_eq!(case.expected["answer"], "Paid.");
        assert_eq!(case.expected["tools"].as_array().unwrap().len(), 5);
        assert_eq!(case.metadata["source_run"], Uuid::from_u128(7).to_string());
        let recorded = case.recorded_tools.unwrap();
        let names: Vec<&str> = recorded.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["get", "pay"], "not the built-in wait");
        let calls: Vec<(&str, Value, String, bool)> = recorded
            .calls
            .iter()
            .map(|c| {
                (
                    c.name.as_str(),
                    c.input.clone(),
                    c.output.to_text().into_owned(),
                    c.error,
                )
            })
            .collect();
        assert_eq!(
            calls,
            [
                ("get", json!({"id": 7}), "open".to_owned(), false),
                ("get", json!({"id": 7}), "Timeout".to_owned(), true),
                ("pay", json!({"amount": 80}), "paid 80".to_owned(), false),
            ]
        );
    }

    #[test]
    fn only_a_run_that_succeeded_and_is_not_erased() {
        let failed = log(vec![
            start("g"),
            EventKind::SessionComplete {
                outcome: Outcome::Failed {
                    error: "boom".into(),
                },
            },
        ]);
        assert_eq!(
            case_from_run("c", &failed).unwrap_err(),
            "the run failed: boom"
        );
        let open = log(vec![start("g")]);
        assert_eq!(
            case_from_run("c", &open).unwrap_err(),
            "the run has not finished"
        );
        let erased = log(vec![start(glia_proto::TOMBSTONE), done("x")]);
        assert_eq!(
            case_from_run("c", &erased).unwrap_err(),
            "the run's content was erased"
        );
        assert!(case_from_run("c", &[]).is_err());
    }
}
