//! What glia offers over MCP, as data: the tool of each agent (name,
//! description, input and output schema), glia's own tools (names that no
//! agent can take), and the arguments of every tool read strictly, naming
//! the field (`docs/mcp.md`, "glia as an MCP server").

use std::collections::BTreeMap;
use std::sync::Arc;

use glia_backends::AgentVersion;
use glia_proto::AgentDefinition;
use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use uuid::Uuid;

/// Lists the token's pending approvals (scope `approve`).
pub const LIST_APPROVALS: &str = "_glia_list_approvals";
/// Decides one pending approval (scope `approve`).
pub const DECIDE_APPROVAL: &str = "_glia_decide_approval";
/// Waits for a run (bounded) and answers as an agent tool does.
pub const WAIT_RUN: &str = "_glia_wait_run";
/// Cancels a run (scope `submit`).
pub const CANCEL_RUN: &str = "_glia_cancel_run";

/// An argument that does not fit its tool's input schema: the field's path
/// (`tags[2]`, `goal`; empty for the whole object) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgError {
    /// Path of the field, as in the HTTP API's errors.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl std::fmt::Display for ArgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.is_empty() {
            write!(f, "arguments: {}", self.reason)
        } else {
            write!(f, "arguments.{}: {}", self.field, self.reason)
        }
    }
}

/// The tool of a registered agent (its latest version): named after the
/// agent (agent names are already provider-safe; the rule is
/// [`glia_proto::tool_names::provider_tool_name`]), described by the
/// definition's `description`, taking [`agent_input_schema`] and answering
/// [`result_schema`] with the definition's `output_schema` as `output`.
pub fn agent_tool(agent: &AgentVersion) -> Tool {
    let def: Option<AgentDefinition> = glia_proto::strict::from_json_str(&agent.definition).ok();
    let description = def
        .as_ref()
        .map(|d| d.description.trim().to_owned())
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| format!("The glia agent {}.", agent.name));
    let description = format!(
        "{description}\n\nStarts a run of the glia agent {}@{} on `goal` and answers when it ends; a run that must wait (for an approval, a tool result, a message) answers with its run id and how to continue ({DECIDE_APPROVAL}, {WAIT_RUN}).",
        agent.name, agent.version
    );
    let output = def.and_then(|d| d.output_schema);
    Tool::new(
        glia_proto::tool_names::provider_tool_name(&agent.name).into_owned(),
        description,
        object(agent_input_schema()),
    )
    .with_title(agent.name.clone())
    .with_raw_output_schema(object(result_schema(output.as_ref())))
}

/// glia's own tools the principal may call: the approval tools with scope
/// `approve`, cancel with `submit`, wait with any token.
pub fn own_tools(approve: bool, submit: bool) -> Vec<Tool> {
    let mut tools = Vec::new();
    if approve {
        tools.push(
            Tool::new(
                LIST_APPROVALS,
                "Lists the approvals waiting for a decision (oldest first): each with its run id, call id, tool, arguments and args_hash. Decide them with _glia_decide_approval.",
                object(list_approvals_schema()),
            )
            .with_annotations(ToolAnnotations::new().read_only(true))
            .with_raw_output_schema(object(json!({
                "type": "object",
                "required": ["approvals"],
                "properties": {"approvals": {"type": "array", "items": approval_schema()}}
            }))),
        );
        tools.push(
            Tool::new(
                DECIDE_APPROVAL,
                "Decides a pending approval of a glia run: approve, reject (with a reason the run's model sees) or edit (replacement arguments in `input`). The first decision wins. Then call _glia_wait_run for the run's answer.",
                object(decide_schema()),
            )
            .with_annotations(ToolAnnotations::new().destructive(false))
            .with_raw_output_schema(object(json!({
                "type": "object",
                "required": ["run_id", "call_id", "decision"],
                "properties": {
                    "run_id": {"type": "string"},
                    "call_id": {"type": "string"},
                    "decision": {"type": "object"},
                    "inbox_ids": {"type": "array", "items": {"type": "integer"}}
                }
            }))),
        );
    }
    tools.push(
        Tool::new(
            WAIT_RUN,
            "Waits for a glia run (bounded by wait_ms) and answers as an agent tool does: its answer when it ends, or where it waits and how to continue.",
            object(wait_schema()),
        )
        .with_annotations(ToolAnnotations::new().read_only(true))
        .with_raw_output_schema(object(result_schema(None))),
    );
    if submit {
        tools.push(
            Tool::new(
                CANCEL_RUN,
                "Cancels a glia run (its children too). A run already done is left as it is.",
                object(cancel_schema()),
            )
            .with_raw_output_schema(object(json!({
                "type": "object",
                "required": ["run_id", "status"],
                "properties": {"run_id": {"type": "string"}, "status": {"enum": ["cancelling", "done"]}}
            }))),
        );
    }
    tools
}

fn object(v: Value) -> Arc<JsonObject> {
    match v {
        Value::Object(map) => Arc::new(map),
        _ => unreachable!("every tool schema is an object"),
    }
}

/// The input of every agent tool: `goal` (required, not blank), `tags`
/// and `metadata` (the labels of `POST /v1/runs`, `docs/limits.md`).
/// Agent definitions declare no input of their own.
pub fn agent_input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "goal": {"type": "string", "minLength": 1, "pattern": "\\S", "description": "What the agent should do: the run's goal, its first user message."},
            "tags": {"type": "array", "maxItems": crate::admission::MAX_TAGS, "items": {"type": "string"}, "description": "Labels to find the run by (GET /v1/runs?tag=…): 1 to 64 bytes of ASCII letters, digits and _ - . : / @."},
            "metadata": {"type": "object", "additionalProperties": {"type": "string"}, "description": "String pairs to find the run by (GET /v1/runs?meta=key=value)."}
        },
        "required": ["goal"],
        "additionalProperties": false
    })
}

fn list_approvals_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "run_id": {"type": "string", "format": "uuid", "description": "Only this run's."},
            "tool": {"type": "string", "description": "Only this tool's."},
            "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "At most this many (default 100)."}
        },
        "additionalProperties": false
    })
}

fn decide_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "run_id": {"type": "string", "format": "uuid"},
            "call_id": {"type": "string", "minLength": 1},
            "decision": {"enum": ["approve", "reject", "edit"]},
            "reason": {"type": "string", "description": "For reject: shown to the run's model."},
            "input": {"type": "object", "description": "For edit (required there): the replacement arguments."},
            "args_hash": {"type": "string", "description": "The args_hash seen; a decision on other arguments is refused (stale_args)."}
        },
        "required": ["run_id", "call_id", "decision"],
        "additionalProperties": false
    })
}

fn wait_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "run_id": {"type": "string", "format": "uuid"},
            "wait_ms": {"type": "integer", "minimum": 0, "description": "Longest wait in ms (default: the server's call wait, at most its maximum)."}
        },
        "required": ["run_id"],
        "additionalProperties": false
    })
}

fn cancel_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "run_id": {"type": "string", "format": "uuid"},
            "reason": {"type": "string", "description": "Recorded with the cancel (default: cancelled over MCP)."}
        },
        "required": ["run_id"],
        "additionalProperties": false
    })
}

/// One pending approval, as the approval tools and a waiting run's result
/// show it.
pub fn approval_schema() -> Value {
    json!({
        "type": "object",
        "required": ["run_id", "call_id", "tool", "input", "args_hash"],
        "properties": {
            "run_id": {"type": "string"},
            "call_id": {"type": "string"},
            "tool": {"type": "string"},
            "input": {},
            "args_hash": {"type": "string"},
            "requested_at": {"type": "string"},
            "expires_at": {"type": ["string", "null"]},
            "interrupted": {"type": "boolean"}
        }
    })
}

/// What a call of an agent tool (and [`WAIT_RUN`]) answers as
/// `structuredContent`: the run id and `status` (`succeeded`, `failed`,
/// `cancelled`: done; `waiting`: parked where someone outside must act;
/// `running`: the wait limit came first), with `answer` and `output` of a
/// finished run, `error` of a failed or cancelled one, and for a run not
/// done `pull_point`, `approvals`, `calls` and `next` (how to continue).
/// `output` is typed by the agent's `output_schema` when that schema has
/// no `$ref` (a reference would resolve against this envelope, not the
/// agent's schema).
pub fn result_schema(output: Option<&Value>) -> Value {
    let output = match output {
        Some(schema) if !has_ref(schema) => {
            let mut schema = schema.clone();
            if let Value::Object(map) = &mut schema {
                map.remove("$schema");
                map.remove("$id");
            }
            schema
        }
        _ => json!({}),
    };
    json!({
        "type": "object",
        "required": ["run_id", "status"],
        "properties": {
            "run_id": {"type": "string"},
            "status": {"enum": ["succeeded", "failed", "cancelled", "waiting", "running"]},
            "answer": {"type": "string"},
            "output": output,
            "error": {"type": "string"},
            "pull_point": {"type": "object"},
            "approvals": {"type": "array", "items": approval_schema()},
            "calls": {"type": "array", "items": {"type": "object"}},
            "next": {"type": "array", "items": {
                "type": "object",
                "required": ["action"],
                "properties": {
                    "action": {"type": "string"},
                    "tool": {"type": "string"},
                    "arguments": {"type": "object"},
                    "http": {"type": "string"}
                }
            }}
        }
    })
}

fn has_ref(v: &Value) -> bool {
    match v {
        Value::Object(map) => map.iter().any(|(k, v)| k == "$ref" || has_ref(v)),
        Value::Array(items) => items.iter().any(has_ref),
        _ => false,
    }
}

/// The arguments of an agent tool.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentArgs {
    /// The run's goal.
    pub goal: String,
    /// Its tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Its metadata.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// The arguments of [`LIST_APPROVALS`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// Only this run's.
    #[serde(default)]
    pub run_id: Option<Uuid>,
    /// Only this tool's.
    #[serde(default)]
    pub tool: Option<String>,
    /// Page size.
    #[serde(default)]
    pub limit: Option<usize>,
}

/// The arguments of [`DECIDE_APPROVAL`]: one decision of `POST
/// /v1/approvals`.
pub type DecideArgs = crate::model::BulkDecision;

/// The arguments of [`WAIT_RUN`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitArgs {
    /// The run.
    pub run_id: Uuid,
    /// Longest wait, ms.
    #[serde(default)]
    pub wait_ms: Option<u64>,
}

/// The arguments of [`CANCEL_RUN`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelArgs {
    /// The run.
    pub run_id: Uuid,
    /// Why.
    #[serde(default)]
    pub reason: Option<String>,
}

/// The input schema of glia's own tool `name`, or `None` for any other name.
fn own_schema(name: &str) -> Option<Value> {
    Some(match name {
        LIST_APPROVALS => list_approvals_schema(),
        DECIDE_APPROVAL => decide_schema(),
        WAIT_RUN => wait_schema(),
        CANCEL_RUN => cancel_schema(),
        _ => return None,
    })
}

/// `args` (absent: `{}`) checked against the input schema of tool `name`
/// (an agent's when it is none of glia's own) and read as `T`. Errors: the
/// first offending field and why.
pub fn parse<T: DeserializeOwned>(name: &str, args: Option<&JsonObject>) -> Result<T, ArgError> {
    let schema = own_schema(name).unwrap_or_else(agent_input_schema);
    let mut value = Value::Object(args.cloned().unwrap_or_default());
    glia_proto::json::integral_numbers(&mut value);
    let validator = jsonschema::validator_for(&schema).map_err(|e| ArgError {
        field: String::new(),
        reason: format!("the tool's schema does not compile: {e}"),
    })?;
    if let Some(e) = validator.iter_errors(&value).next() {
        let (mut field, mut reason) = crate::extract::place(&e);
        if let jsonschema::error::ValidationErrorKind::Required { property } = e.kind() {
            field = property.as_str().unwrap_or_default().to_owned();
            reason = "is required".into();
        }
        return Err(ArgError { field, reason });
    }
    glia_proto::strict::from_json_value(value).map_err(|e| ArgError {
        field: e.path,
        reason: e.reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DecisionKind;

    fn args(v: Value) -> JsonObject {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn agent_arguments_are_read_strictly_naming_the_field() {
        let ok: AgentArgs = parse(
            "support",
            Some(&args(json!({"goal": "Refund A1", "tags": ["t"]}))),
        )
        .unwrap();
        assert_eq!(ok.goal, "Refund A1");
        let err = |v: Value| parse::<AgentArgs>("support", Some(&args(v))).unwrap_err();
        assert_eq!(err(json!({})).field, "goal");
        assert_eq!(err(json!({"goal": 3})).field, "goal");
        assert_eq!(err(json!({"goal": "  "})).field, "goal");
        assert_eq!(err(json!({"goal": "x", "tags": ["a", 2]})).field, "tags[1]");
        let unknown = err(json!({"goal": "x", "config": {}}));
        assert_eq!(
            (unknown.field.as_str(), unknown.reason.as_str()),
            ("config", "unknown field")
        );
        assert_eq!(
            parse::<AgentArgs>("support", None).unwrap_err().to_string(),
            "arguments.goal: is required"
        );
    }

    #[test]
    fn own_tool_arguments_are_read_strictly() {
        let d: DecideArgs = parse(
            DECIDE_APPROVAL,
            Some(&args(
                json!({"run_id": Uuid::nil(), "call_id": "c1", "decision": "approve"}),
            )),
        )
        .unwrap();
        assert_eq!(d.decision, DecisionKind::Approve);
        let e = parse::<DecideArgs>(
            DECIDE_APPROVAL,
            Some(&args(
                json!({"run_id": Uuid::nil(), "call_id": "c1", "decision": "maybe"}),
            )),
        )
        .unwrap_err();
        assert_eq!(e.field, "decision");
        let e = parse::<WaitArgs>(WAIT_RUN, Some(&args(json!({"run_id": "nope"})))).unwrap_err();
        assert_eq!(e.field, "run_id");
        let w: WaitArgs = parse(
            WAIT_RUN,
            Some(&args(json!({"run_id": Uuid::nil(), "wait_ms": 5.0}))),
        )
        .unwrap();
        assert_eq!(w.wait_ms, Some(5));
    }

    #[test]
    fn own_tool_names_cannot_be_agent_names() {
        for name in [LIST_APPROVALS, DECIDE_APPROVAL, WAIT_RUN, CANCEL_RUN] {
            let def = json!({"name": name, "model": "m"});
            let def: AgentDefinition = glia_proto::strict::from_json_value(def).unwrap();
            assert_eq!(
                def.validate().map_err(|e| e.field),
                Err("name".to_owned()),
                "{name} is refused as an agent name"
            );
            assert_eq!(glia_proto::tool_names::provider_tool_name(name), name);
        }
    }

    #[test]
    fn an_output_schema_with_references_is_not_nested() {
        let plain = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        assert_eq!(result_schema(Some(&plain))["properties"]["output"], plain);
        let with_ref = json!({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"});
        assert_eq!(
            result_schema(Some(&with_ref))["properties"]["output"],
            json!({})
        );
    }
}
