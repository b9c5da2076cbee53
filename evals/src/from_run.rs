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
//!   kept where one was required, and each call's recorded answer: a
//!   result, or the tool's own error (a failure, a timeout, invalid output,
//!   an unknown outcome); a call glia refused, a person rejected, or that
//!   has no answer yet, is not recorded;
//! - `metadata.source_run`: the run's id (and `source_agent`, `name@version`,
//!   when it ran a registered agent).
//!
//! Only a run that succeeded makes a case: its answer is what the case
//! expects.

use std::collections::{BTreeMap, HashMap};

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
    let mut texts: Vec<(String, bool)> = Vec::new(); // (text, a model call followed)
    let mut offered: Vec<RecordedToolSpec> = Vec::new();
    let mut trajectory: Vec<Value> = Vec::new();
    let mut calls: Vec<(String, String, Value)> = Vec::new(); // (call id, name, input)
    let mut answers: HashMap<String, (ToolContent, bool)> = HashMap::new();
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
                        idempotent: t.idempotent,
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
                    calls.push((call.call_id.clone(), call.name.clone(), call.input.clone()));
                }
            }
            EventKind::ToolResult {
                call_id, content, ..
            } => {
                answers.insert(call_id.clone(), (content.clone(), false));
            }
            EventKind::ToolError {
                call_id,
                error,
                message,
                ..
            } if the_tools_own(*error) => {
                answers.insert(call_id.clone(), (ToolContent::Text(message.clone()), true));
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
            .filter(|(_, name, _)| offered.iter().any(|t| &t.name == name))
            .filter_map(|(call_id, name, input)| {
                let (output, error) = answers.remove(&call_id)?;
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
        | ToolErrorKind::Timeout
        | ToolErrorKind::OutcomeUnknown => true,
        ToolErrorKind::UnknownTool
        | ToolErrorKind::Unavailable
        | ToolErrorKind::InvalidArguments
        | ToolErrorKind::Denied
        | ToolErrorKind::Rejected
        | ToolErrorKind::Cancelled
        | ToolErrorKind::BudgetExceeded
        | ToolErrorKind::Expired => false,
    }
}
