//! Datasets: cases as JSON Lines.
//!
//! One case a line, an object:
//!
//! ```text
//! {"id": "refund-1", "goal": "Refund order 42", "expected": {"answer": "Refunded"}}
//! {"id": "refund-2", "messages": [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Order 7"}]}
//! ```
//!
//! - `id`: the case's id, unique in the dataset; 1 to 200 characters, no
//!   control characters;
//! - `goal` (a non-blank string), or `messages` instead: user messages
//!   `{"role": "user", "content": …}`, the first the goal and the rest the
//!   `turns`. A run starts from its goal, so only user messages can be
//!   scripted;
//! - `turns`: scripted customer messages, posted in order each time the run
//!   waits for input (not with `messages`); when they run out the
//!   conversation is closed;
//! - `farewell`: the customer's last words, given with the close (recorded,
//!   and no model call follows: a "thanks, bye" that needs no answer);
//! - `expected`: an object the graders read (`expected.answer`,
//!   `expected.tools`, …);
//! - `metadata`: string → string, at most 20 keys;
//! - `config`: a JSON merge patch over the version's run config (checked by
//!   the server; only for versions given inline);
//! - `recorded_tools`: the tools a recorded run was offered and what its
//!   calls answered ([`glia_proto::recorded::RecordedTools`]): the case's
//!   runs are offered those tools and answered from the recording, so
//!   nothing they reach is touched (`glia eval dataset from-runs` writes
//!   them).
//!
//! Blank lines are skipped; unknown keys are refused.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Most cases in one dataset.
pub const MAX_CASES: usize = 100_000;
/// Most bytes of one line.
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// Most characters of a case id.
pub const MAX_ID_CHARS: usize = 200;
/// Most keys of a case's `metadata`.
pub const MAX_METADATA_KEYS: usize = 20;

/// One case, as stored (the canonical line of [`to_jsonl`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// Unique in its dataset.
    pub id: String,
    /// The run's goal (its first user message).
    pub goal: String,
    /// Scripted customer messages, posted in order each time the run waits
    /// for input.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turns: Vec<String>,
    /// The customer's last words, posted with the close once `turns` ran
    /// out (no model call follows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub farewell: Option<String>,
    /// What the graders compare against, by key.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub expected: Map<String, Value>,
    /// Free labels, string → string.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// A JSON merge patch over the version's run config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Map<String, Value>>,
    /// Tools answered from a recording ([`glia_proto::recorded`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_tools: Option<glia_proto::recorded::RecordedTools>,
}

/// A dataset that does not parse: where (`line`, from 1; 0 for the dataset
/// as a whole), which field (`id`, `messages[1].role`; `None` for the line
/// itself) and why. Displays as `line 3: id: "c1" is used by line 1`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}{reason}",
    if *line == 0 { String::new() } else { format!("line {line}: ") },
    field.as_deref().map(|f| format!("{f}: ")).unwrap_or_default())]
pub struct DatasetError {
    /// The line, from 1; 0 when the error is about the whole dataset.
    pub line: usize,
    /// The field's path in the line's object.
    pub field: Option<String>,
    /// What is wrong.
    pub reason: String,
}

/// Parse a dataset. Errors: the first bad line (not JSON, not an object, an
/// unknown or invalid field, longer than [`MAX_LINE_BYTES`]), a duplicate
/// id (naming the line that used it first), no case at all, more than
/// [`MAX_CASES`].
pub fn parse_jsonl(text: &str) -> Result<Vec<Case>, DatasetError> {
    let mut cases = Vec::new();
    let mut lines_of: BTreeMap<String, usize> = BTreeMap::new();
    for (i, raw) in text.split('\n').enumerate() {
        let line = i + 1;
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        if raw.trim().is_empty() {
            continue;
        }
        let err = |field: Option<&str>, reason: String| DatasetError {
            line,
            field: field.map(str::to_owned),
            reason,
        };
        if raw.len() > MAX_LINE_BYTES {
            let reason = format!(
                "{} bytes, more than the {MAX_LINE_BYTES} allowed",
                raw.len()
            );
            return Err(err(None, reason));
        }
        if cases.len() == MAX_CASES {
            return Err(err(None, format!("more than {MAX_CASES} cases")));
        }
        let value: Value =
            serde_json::from_str(raw).map_err(|e| err(None, format!("not valid JSON: {e}")))?;
        let Value::Object(object) = value else {
            return Err(err(None, "must be a JSON object".into()));
        };
        let case = parse_case(object).map_err(|(field, reason)| err(Some(&field), reason))?;
        if let Some(first) = lines_of.insert(case.id.clone(), line) {
            return Err(err(
                Some("id"),
                format!("{:?} is used by line {first}", case.id),
            ));
        }
        cases.push(case);
    }
    if cases.is_empty() {
        return Err(DatasetError {
            line: 0,
            field: None,
            reason: "the dataset has no cases".into(),
        });
    }
    Ok(cases)
}

/// The canonical text of `cases`: one compact JSON object a line, fields in
/// [`Case`]'s order, empty ones left out, keys of `expected` and `config`
/// sorted at every level; it parses back to the same cases.
pub fn to_jsonl(cases: &[Case]) -> String {
    let mut out = String::new();
    for case in cases {
        let mut canonical = case.clone();
        canonical.expected = sorted(case.expected.clone());
        canonical.config = case.config.clone().map(sorted);
        out.push_str(&serde_json::to_string(&canonical).expect("a case serialises"));
        out.push('\n');
    }
    out
}

/// SHA-256 of [`to_jsonl`], lowercase hex (64 characters): the same cases
/// give the same hash, whatever the key order they were written in.
pub fn content_hash(cases: &[Case]) -> String {
    let digest = Sha256::digest(to_jsonl(cases).as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn sorted(map: Map<String, Value>) -> Map<String, Value> {
    match glia_proto::json::sort_keys(&Value::Object(map)) {
        Value::Object(map) => map,
        _ => unreachable!("sort_keys keeps an object an object"),
    }
}

/// A field that is wrong: its path and why.
type FieldError = (String, String);

fn parse_case(mut object: Map<String, Value>) -> Result<Case, FieldError> {
    const KEYS: [&str; 9] = [
        "id",
        "goal",
        "messages",
        "turns",
        "farewell",
        "expected",
        "metadata",
        "config",
        "recorded_tools",
    ];
    if let Some(unknown) = object.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err((
            unknown.clone(),
            format!("unknown field (expected one of {})", KEYS.join(", ")),
        ));
    }
    let id = match object.remove("id") {
        None => return Err(("id".into(), "missing".into())),
        Some(v) => string("id", v)?,
    };
    let chars = id.chars().count();
    if chars == 0 || chars > MAX_ID_CHARS || id.trim().is_empty() {
        return Err((
            "id".into(),
            format!("must be 1 to {MAX_ID_CHARS} characters, not blank"),
        ));
    }
    if id.chars().any(char::is_control) {
        return Err(("id".into(), format!("{id:?} has a control character")));
    }
    let (goal, turns) = match (object.remove("goal"), object.remove("messages")) {
        (Some(_), Some(_)) => {
            return Err(("messages".into(), "give goal or messages, not both".into()));
        }
        (None, None) => {
            return Err(("goal".into(), "missing (give goal, or messages)".into()));
        }
        (Some(goal), None) => {
            let goal = non_blank("goal", goal)?;
            let turns = match object.remove("turns") {
                None => Vec::new(),
                Some(Value::Array(items)) => items
                    .into_iter()
                    .enumerate()
                    .map(|(i, t)| non_blank(&format!("turns[{i}]"), t))
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err(("turns".into(), "must be an array of strings".into())),
            };
            (goal, turns)
        }
        (None, Some(messages)) => {
            if object.contains_key("turns") {
                let reason = "not with messages (the messages after the first are the turns)";
                return Err(("turns".into(), reason.into()));
            }
            let mut texts = messages_texts(messages)?.into_iter();
            let goal = texts.next().expect("messages_texts refuses an empty list");
            (goal, texts.collect())
        }
    };
    let farewell = object
        .remove("farewell")
        .map(|v| non_blank("farewell", v))
        .transpose()?;
    let expected = match object.remove("expected") {
        None => Map::new(),
        Some(Value::Object(map)) => map,
        Some(_) => return Err(("expected".into(), "must be an object".into())),
    };
    let metadata = match object.remove("metadata") {
        None => BTreeMap::new(),
        Some(Value::Object(map)) => {
            if map.len() > MAX_METADATA_KEYS {
                let reason = format!(
                    "{} keys, more than the {MAX_METADATA_KEYS} allowed",
                    map.len()
                );
                return Err(("metadata".into(), reason));
            }
            map.into_iter()
                .map(|(k, v)| Ok((k.clone(), string(&format!("metadata.{k}"), v)?)))
                .collect::<Result<_, FieldError>>()?
        }
        Some(_) => return Err(("metadata".into(), "must be an object of strings".into())),
    };
    let config = match object.remove("config") {
        None => None,
        Some(Value::Object(map)) => Some(map),
        Some(_) => {
            let reason = "must be an object (a JSON merge patch over the run config)";
            return Err(("config".into(), reason.into()));
        }
    };
    let recorded_tools = match object.remove("recorded_tools") {
        None => None,
        Some(value) => {
            let recorded: glia_proto::recorded::RecordedTools = serde_json::from_value(value)
                .map_err(|e| ("recorded_tools".to_owned(), e.to_string()))?;
            recorded.validate().map_err(|e| (e.field, e.reason))?;
            Some(recorded)
        }
    };
    Ok(Case {
        id,
        goal,
        turns,
        farewell,
        expected,
        metadata,
        config,
        recorded_tools,
    })
}

/// The contents of `messages`: at least one, each `{"role": "user",
/// "content": non-blank string}`.
fn messages_texts(messages: Value) -> Result<Vec<String>, FieldError> {
    let Value::Array(items) = messages else {
        return Err(("messages".into(), "must be an array of messages".into()));
    };
    if items.is_empty() {
        return Err(("messages".into(), "must hold at least one message".into()));
    }
    let mut texts = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let Value::Object(mut message) = item else {
            let reason = r#"must be an object {"role": "user", "content": "…"}"#;
            return Err((format!("messages[{i}]"), reason.into()));
        };
        if let Some(unknown) = message.keys().find(|k| *k != "role" && *k != "content") {
            let reason = "unknown field (expected role, content)";
            return Err((format!("messages[{i}].{unknown}"), reason.into()));
        }
        let role = match message.remove("role") {
            None => return Err((format!("messages[{i}].role"), "missing".into())),
            Some(role) => string(&format!("messages[{i}].role"), role)?,
        };
        if role != "user" {
            let reason = format!(
                "{role:?}: a run starts from its goal and only user messages can be scripted"
            );
            return Err((format!("messages[{i}].role"), reason));
        }
        let path = format!("messages[{i}].content");
        match message.remove("content") {
            None => return Err((path, "missing".into())),
            Some(content) => texts.push(non_blank(&path, content)?),
        }
    }
    Ok(texts)
}

fn string(path: &str, value: Value) -> Result<String, FieldError> {
    match value {
        Value::String(s) => Ok(s),
        other => Err((
            path.to_owned(),
            format!("must be a string, not {}", glia_proto::json_type(&other)),
        )),
    }
}

fn non_blank(path: &str, value: Value) -> Result<String, FieldError> {
    let s = string(path, value)?;
    if s.trim().is_empty() {
        return Err((path.to_owned(), "must not be blank".into()));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn error(text: &str) -> String {
        parse_jsonl(text).unwrap_err().to_string()
    }

    #[test]
    fn goals_messages_and_turns() {
        let text = concat!(
            r#"{"id": "a", "goal": "Refund 42", "turns": ["yes"], "expected": {"answer": "ok"}, "metadata": {"tier": "gold"}}"#,
            "\n\n  \r\n",
            r#"{"id": "b", "messages": [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Order 7"}], "config": {"model": "m"}}"#,
            "\n",
        );
        let cases = parse_jsonl(text).unwrap();
        assert_eq!(cases.len(), 2);
        assert_eq!(cases[0].turns, ["yes"]);
        assert_eq!(cases[0].expected["answer"], "ok");
        assert_eq!(cases[0].metadata["tier"], "gold");
        assert_eq!(
            (cases[1].goal.as_str(), cases[1].turns.as_slice()),
            ("Hi", &["Order 7".to_owned()][..])
        );
        assert_eq!(cases[1].config.as_ref().unwrap()["model"], "m");
        assert_eq!(parse_jsonl(&to_jsonl(&cases)).unwrap(), cases);
    }

    #[test]
    fn errors_name_line_and_field() {
        let dup = "{\"id\": \"c1\", \"goal\": \"g\"}\n\n{\"id\": \"c1\", \"goal\": \"h\"}";
        assert_eq!(error(dup), r#"line 3: id: "c1" is used by line 1"#);
        let e = parse_jsonl(r#"{"id": "a", "goal": "g", "expect": {}}"#).unwrap_err();
        assert_eq!((e.line, e.field.as_deref()), (1, Some("expect")));
        assert!(e.reason.starts_with("unknown field"), "{e}");
        let role = r#"{"id": "a", "messages": [{"role": "user", "content": "g"}, {"role": "assistant", "content": "x"}]}"#;
        let e = parse_jsonl(role).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("messages[1].role"));
        assert!(
            e.reason.contains("only user messages can be scripted"),
            "{e}"
        );
        assert_eq!(
            error(r#"{"id": "a", "messages": [{"role": "user", "content": "g", "name": "x"}]}"#),
            "line 1: messages[0].name: unknown field (expected role, content)"
        );
        assert_eq!(
            error(r#"{"id": "a", "messages": [{"role": "user", "content": "g"}], "turns": []}"#),
            "line 1: turns: not with messages (the messages after the first are the turns)"
        );
        assert_eq!(
            error(r#"{"id": "a", "goal": "g", "messages": []}"#),
            "line 1: messages: give goal or messages, not both"
        );
        assert_eq!(
            error(r#"{"id": "a"}"#),
            "line 1: goal: missing (give goal, or messages)"
        );
        assert_eq!(
            error(r#"{"id": "a", "goal": "  "}"#),
            "line 1: goal: must not be blank"
        );
        assert_eq!(error(r#"{"goal": "g"}"#), "line 1: id: missing");
        assert_eq!(
            error(r#"{"id": 7, "goal": "g"}"#),
            "line 1: id: must be a string, not number"
        );
        assert!(error(r#"{"id": "a\u0007", "goal": "g"}"#).contains("control character"));
        let long = format!(r#"{{"id": "{}", "goal": "g"}}"#, "x".repeat(201));
        assert_eq!(
            error(&long),
            "line 1: id: must be 1 to 200 characters, not blank"
        );
        assert_eq!(
            error(r#"{"id": "a", "goal": "g", "turns": ["ok", 3]}"#),
            "line 1: turns[1]: must be a string, not number"
        );
        assert_eq!(
            error(r#"{"id": "a", "goal": "g", "metadata": {"k": 1}}"#),
            "line 1: metadata.k: must be a string, not number"
        );
        let many: Map<String, Value> = (0..21).map(|i| (format!("k{i}"), json!("v"))).collect();
        let line = json!({"id": "a", "goal": "g", "metadata": many}).to_string();
        assert_eq!(
            error(&line),
            "line 1: metadata: 21 keys, more than the 20 allowed"
        );
        assert_eq!(
            error(r#"{"id": "a", "goal": "g", "expected": []}"#),
            "line 1: expected: must be an object"
        );
        assert_eq!(error("[1]"), "line 1: must be a JSON object");
        assert!(
            error("{\"id\": \"a\", \"goal\": \"g\"}\n{oops").starts_with("line 2: not valid JSON")
        );
        assert_eq!(error("\n \n"), "the dataset has no cases");
        let huge = format!(r#"{{"id": "a", "goal": "{}"}}"#, "x".repeat(MAX_LINE_BYTES));
        let want = format!(
            "line 1: {} bytes, more than the 1048576 allowed",
            huge.len()
        );
        assert_eq!(error(&huge), want);
    }

    #[test]
    fn canonical_text_and_hash_ignore_key_order() {
        let a =
            parse_jsonl(r#"{"goal": "g", "id": "a", "expected": {"b": 1, "a": {"y": 2, "x": 1}}}"#)
                .unwrap();
        let b =
            parse_jsonl(r#"{"id": "a", "expected": {"a": {"x": 1, "y": 2}, "b": 1}, "goal": "g"}"#)
                .unwrap();
        assert_eq!(
            to_jsonl(&a),
            "{\"id\":\"a\",\"goal\":\"g\",\"expected\":{\"a\":{\"x\":1,\"y\":2},\"b\":1}}\n"
        );
        assert_eq!(content_hash(&a), content_hash(&b));
        assert_eq!(content_hash(&a).len(), 64);
        let c = parse_jsonl(r#"{"id": "a", "goal": "h"}"#).unwrap();
        assert_ne!(content_hash(&a), content_hash(&c));
    }
}
