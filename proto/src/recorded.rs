//! Recorded tools: a run whose tool calls are answered from a recording of
//! earlier runs, so an agent version is tried on the same inputs without
//! touching the systems those runs reached (`docs/evals.md`, "Replay evals").
//!
//! A run with [`RecordedTools`] (in [`crate::RunConfig::recorded_tools`],
//! set by the dispatcher from a request's `recorded_tools`) is offered the
//! recording's tools and nothing else (no registered, external, MCP, HTTP
//! or agent tool; glia's built-in waits stay as its config says), each
//! with [`crate::tool_sources::ToolSource::Recorded`]. No tool source is
//! contacted: a call is answered by [`RecordedTools::answer`], never run.
//! Policies, approvals and budgets apply as to any call.
//!
//! JSON: `{"tools": [{"name": "get_order", "description": "…",
//! "input_schema": {"type": "object"}}], "calls": [{"name": "get_order",
//! "input": {"id": "A1"}, "output": "{\"state\":\"shipped\"}"}]}`.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config_error::{ConfigError, TOOL_NAME, config_error};
use crate::content::{Message, ToolContent};
use crate::json::canonical_json;
use crate::limits::MAX_TOOLS;

/// Most recorded calls a run may carry.
pub const MAX_RECORDED_CALLS: usize = 10_000;

/// Most bytes a recording may take as JSON (1 MiB: a request body's, a
/// batch line's and a dataset line's bound too).
pub const MAX_RECORDED_BYTES: usize = 1 << 20;

/// The tools a recording offered, and the calls it answered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RecordedTools {
    /// The tools offered, as the recording offered them; at most
    /// [`MAX_TOOLS`], names distinct.
    #[cfg_attr(feature = "schemars", schemars(length(max = MAX_TOOLS)))]
    pub tools: Vec<RecordedToolSpec>,
    /// The calls made and what each answered, in the recording's order; at
    /// most [`MAX_RECORDED_CALLS`], each naming one of `tools`.
    #[serde(default)]
    #[cfg_attr(feature = "schemars", schemars(length(max = MAX_RECORDED_CALLS)))]
    pub calls: Vec<RecordedCall>,
}

/// One tool as a recording offered it. Offered idempotent whatever it was
/// (answering from the recording runs nothing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RecordedToolSpec {
    /// Tool name (`^[a-zA-Z0-9_-]{1,64}$`).
    pub name: String,
    /// What the model is told it does.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of its arguments.
    #[cfg_attr(
        feature = "schemars",
        schemars(with = "crate::tool_schema::ToolInputSchema")
    )]
    pub input_schema: Value,
    /// Calls need a person's approval whatever the run's policies say (the
    /// recorded tool's source required it: an MCP annotation, the
    /// operator's catalogue).
    #[serde(default)]
    pub requires_approval: bool,
}

/// One recorded call and its answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RecordedCall {
    /// The tool called.
    pub name: String,
    /// Its arguments (matched as canonical JSON, [`canonical_json`]).
    #[serde(default)]
    pub input: Value,
    /// What it answered: text, or text and image blocks
    /// ([`ToolContent`]).
    #[cfg_attr(feature = "schemars", schemars(with = "Value"))]
    pub output: ToolContent,
    /// The answer was the tool's error (the model sees `output` as an error
    /// result).
    #[serde(default)]
    pub error: bool,
}

impl RecordedTools {
    /// Check counts, sizes, names and schemas. Errors name the field under
    /// `recorded_tools.` (`tools[2].input_schema`, `calls[7].name`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let field = |f: String| format!("recorded_tools.{f}");
        if self.tools.len() > MAX_TOOLS {
            return Err(config_error(
                field("tools".into()),
                format!("{} tools; at most {MAX_TOOLS}", self.tools.len()),
            ));
        }
        if self.calls.len() > MAX_RECORDED_CALLS {
            return Err(config_error(
                field("calls".into()),
                format!("{} calls; at most {MAX_RECORDED_CALLS}", self.calls.len()),
            ));
        }
        let bytes = serde_json::to_vec(self).map_or(usize::MAX, |json| json.len());
        if bytes > MAX_RECORDED_BYTES {
            return Err(config_error(
                field("calls".into()),
                format!("{bytes} bytes as JSON; at most {MAX_RECORDED_BYTES}"),
            ));
        }
        let mut names = HashSet::new();
        for (i, t) in self.tools.iter().enumerate() {
            if !TOOL_NAME.is_match(&t.name) {
                return Err(config_error(
                    field(format!("tools[{i}].name")),
                    format!("{:?} must match ^[a-zA-Z0-9_-]{{1,64}}$", t.name),
                ));
            }
            if t.name == crate::tool_names::OUTPUT_TOOL {
                return Err(config_error(
                    field(format!("tools[{i}].name")),
                    format!("{:?} is reserved for the output schema's tool", t.name),
                ));
            }
            if !names.insert(t.name.as_str()) {
                return Err(config_error(
                    field(format!("tools[{i}].name")),
                    format!("{:?} is listed twice", t.name),
                ));
            }
            let schema_field = field(format!("tools[{i}].input_schema"));
            crate::limits::check_schema(&schema_field, &t.input_schema)?;
            crate::limits::compile_tool_schema(&t.input_schema).map_err(|reason| {
                config_error(field(format!("tools[{i}].input_schema")), reason)
            })?;
        }
        for (i, c) in self.calls.iter().enumerate() {
            if !names.contains(c.name.as_str()) {
                return Err(config_error(
                    field(format!("calls[{i}].name")),
                    format!("{:?} is not one of the recorded tools", c.name),
                ));
            }
        }
        Ok(())
    }

    /// The recorded answer to call `call_id` of `name` with `input`, in a
    /// run whose conversation is `messages` (the assistant message holding
    /// the call among them, its last use of `call_id`): the k-th call of
    /// `name` with these arguments in the conversation gets the k-th such
    /// recorded answer, a call past the recorded ones the last of them, so
    /// a crash and a replay answer it the same way. Arguments are compared
    /// as canonical JSON with integral numbers as integers (`2.0` is `2`).
    /// A compacted conversation counts the calls it still holds. `Ok(Err(text))` is a recorded tool error. `Err` says
    /// the recording has no call of `name` with these arguments (the model
    /// sees it as the call's error; nothing runs).
    pub fn answer(
        &self,
        messages: &[Message],
        call_id: &str,
        name: &str,
        input: &Value,
    ) -> Result<Result<ToolContent, String>, String> {
        let args = key(input);
        let same = |n: &str, i: &Value| n == name && key(i) == args;
        // Calls of it with these arguments before this one (the last use
        // of its id: some providers use an id again in a later turn).
        let uses: Vec<(&str, &str, &Value)> = messages.iter().flat_map(|m| m.tool_uses()).collect();
        let at = uses
            .iter()
            .rposition(|(id, ..)| *id == call_id)
            .unwrap_or(uses.len());
        let earlier = uses[..at].iter().filter(|(_, n, i)| same(n, i)).count();
        let recorded: Vec<&RecordedCall> = self
            .calls
            .iter()
            .filter(|c| same(&c.name, &c.input))
            .collect();
        let Some(call) = recorded.get(earlier).or(recorded.last()) else {
            let mut known: Vec<String> = self
                .calls
                .iter()
                .filter(|c| c.name == name)
                .map(|c| key(&c.input))
                .collect();
            known.dedup();
            let known = if known.is_empty() {
                "none".to_owned()
            } else {
                cut(&known.join(", "), 2_000)
            };
            return Err(format!(
                "the recording has no call of {name} with arguments {}; it recorded calls with: {known}",
                cut(&args, 2_000)
            ));
        };
        Ok(if call.error {
            Err(call.output.to_text().into_owned())
        } else {
            Ok(call.output.clone())
        })
    }
}

/// What two arguments are compared by: canonical JSON, integral numbers
/// as integers ([`crate::json::integral_numbers`]).
fn key(input: &Value) -> String {
    let mut input = input.clone();
    crate::json::integral_numbers(&mut input);
    canonical_json(&input)
}

/// `text` cut to at most `max` characters, `…` marking a cut.
fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((at, _)) => format!("{}…", &text[..at]),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ContentBlock;
    use crate::content::Role;

    fn recording() -> RecordedTools {
        serde_json::from_value(json!({
            "tools": [{"name": "get", "input_schema": {"type": "object"}},
                      {"name": "book", "input_schema": {"type": "object"}, "requires_approval": true}],
            "calls": [
                {"name": "get", "input": {"id": 1, "x": [1, 2]}, "output": "before"},
                {"name": "book", "input": {"id": 1}, "output": "payment declined", "error": true},
                {"name": "get", "input": {"x": [1, 2], "id": 1}, "output": "after"},
            ]
        }))
        .unwrap()
    }

    /// An assistant message calling `get` with the same arguments under
    /// ids `ids` (keys in another order each time).
    fn calls(ids: &[&str]) -> Message {
        Message {
            role: Role::Assistant,
            content: ids
                .iter()
                .map(|id| ContentBlock::ToolUse {
                    id: (*id).into(),
                    name: "get".into(),
                    input: json!({"x": [1, 2], "id": 1}),
                })
                .collect(),
        }
    }

    #[test]
    fn the_kth_call_gets_the_kth_answer_then_the_last() {
        let r = recording();
        r.validate().unwrap();
        let messages = [Message::user("go"), calls(&["a", "b"]), calls(&["c"])];
        let input = json!({"id": 1, "x": [1, 2]});
        let answer = |id| r.answer(&messages, id, "get", &input).unwrap().unwrap();
        assert_eq!(answer("a"), ToolContent::Text("before".into()));
        assert_eq!(answer("b"), ToolContent::Text("after".into()));
        // Past the recorded calls: the last answer again.
        assert_eq!(answer("c"), ToolContent::Text("after".into()));
        // The same call asked again (a replay) gets the same answer.
        assert_eq!(answer("a"), ToolContent::Text("before".into()));
    }

    #[test]
    fn a_recorded_error_and_a_missing_call() {
        let r = recording();
        let messages = [Message::user("go")];
        assert_eq!(
            r.answer(&messages, "z", "book", &json!({"id": 1})),
            Ok(Err("payment declined".into()))
        );
        let missing = r
            .answer(&messages, "z", "get", &json!({"id": 2}))
            .unwrap_err();
        assert!(
            missing.contains("no call of get with arguments {\"id\":2}")
                && missing.contains("{\"id\":1,\"x\":[1,2]}"),
            "{missing}"
        );
        let none = r.answer(&messages, "z", "book", &json!({})).unwrap_err();
        assert!(none.contains("recorded calls with: {\"id\":1}"), "{none}");
    }

    #[test]
    fn an_id_used_again_and_integral_numbers() {
        let r = recording();
        // A provider that numbers calls per turn uses `call_0` again.
        let messages = [Message::user("go"), calls(&["call_0"]), calls(&["call_0"])];
        let input = json!({"id": 1.0, "x": [1, 2.0]});
        assert_eq!(
            r.answer(&messages, "call_0", "get", &input),
            Ok(Ok(ToolContent::Text("after".into())))
        );
    }

    #[test]
    fn validation_names_the_field() {
        let mut r = recording();
        r.calls[1].name = "nope".into();
        assert_eq!(
            r.validate().unwrap_err().field,
            "recorded_tools.calls[1].name"
        );
        let mut r = recording();
        r.tools[1].name = "get".into();
        assert_eq!(
            r.validate().unwrap_err().field,
            "recorded_tools.tools[1].name"
        );
        let mut r = recording();
        r.tools[0].name = crate::tool_names::OUTPUT_TOOL.into();
        assert_eq!(
            r.validate().unwrap_err().field,
            "recorded_tools.tools[0].name"
        );
        let mut r = recording();
        r.calls = vec![r.calls[0].clone(); MAX_RECORDED_CALLS + 1];
        assert_eq!(r.validate().unwrap_err().field, "recorded_tools.calls");
        let mut r = recording();
        r.calls[0].output = ToolContent::Text("x".repeat(MAX_RECORDED_BYTES));
        assert_eq!(r.validate().unwrap_err().field, "recorded_tools.calls");
    }
}
