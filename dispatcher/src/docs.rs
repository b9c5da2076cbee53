//! OpenAPI plumbing: schemas for the contract types that live in `glia-proto` and
//! `glia-backends` (which do not derive `utoipa::ToSchema`). Types of
//! glia-proto that derive `schemars::JsonSchema` (its feature `schemars`)
//! are generated from the Rust types ([`generated_schemas`]); the others
//! are hand-written here. Each marker type here stands for the real type in
//! the document only; tests check the real types' JSON against these
//! schemas.

use std::borrow::Cow;

use serde_json::{Value, json};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

/// A placeholder; [`crate::server::openapi`] replaces it with the hand-written JSON
/// (utoipa's schema model cannot hold every JSON Schema 2020-12 form).
fn placeholder() -> RefOr<Schema> {
    RefOr::T(Schema::Object(
        utoipa::openapi::ObjectBuilder::new().build(),
    ))
}

macro_rules! foreign_schema {
    ($(#[$doc:meta])* $marker:ident, $name:literal, $json:expr) => {
        $(#[$doc])*
        pub struct $marker;
        impl $marker {
            /// The hand-written JSON Schema.
            pub fn json() -> Value {
                $json
            }
        }
        impl PartialSchema for $marker {
            fn schema() -> RefOr<Schema> {
                placeholder()
            }
        }
        impl ToSchema for $marker {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed($name)
            }
        }
    };
}

/// Component name → JSON Schema, for the types defined outside this crate:
/// hand-written (responses, events, decisions), then [`generated_schemas`]
/// (the configuration types).
pub fn foreign_schemas() -> Vec<(String, Value)> {
    let hand_written = vec![
        ("RunSummary", RunSummaryDoc::json()),
        ("Event", EventDoc::json()),
        ("ApprovalRow", ApprovalRowDoc::json()),
        ("Decision", DecisionDoc::json()),
        ("DecisionBody", DecisionBodyDoc::json()),
        ("BulkDecision", BulkDecisionDoc::json()),
        ("SseEvent", SseEventDoc::json()),
        ("BatchProgressEvent", BatchProgressEventDoc::json()),
        ("LiveEvent", LiveEventDoc::json()),
        ("WebhookSubscription", WebhookSubscriptionDoc::json()),
        ("WebhookDelivery", WebhookDeliveryDoc::json()),
    ];
    hand_written
        .into_iter()
        .map(|(name, schema)| (name.to_owned(), schema))
        .chain(generated_schemas())
        .collect()
}

/// The JSON Schemas (2020-12) of glia-proto's types that derive
/// `schemars::JsonSchema`, by component name: each root type and every type
/// it references, references pointing into `#/components/schemas/`.
/// Unsigned integers are bounded by their type's maximum, unless the field
/// sets a smaller one, and lose schemars' non-standard `format` (`uint32`
/// and the like).
pub fn generated_schemas() -> Vec<(String, Value)> {
    let mut generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| {
            s.definitions_path = "/components/schemas".into();
            s.meta_schema = None;
        })
        .with_transform(schemars::transform::RecursiveTransform(bounded_unsigned))
        .into_generator();
    generator.subschema_for::<glia_proto::RunConfig>();
    generator.subschema_for::<glia_proto::AgentDefinition>();
    generator.subschema_for::<glia_proto::BudgetLimits>();
    generator.subschema_for::<glia_proto::CompactionSpec>();
    generator.subschema_for::<glia_proto::AgentRef>();
    generator.subschema_for::<glia_proto::Pricing>();
    generator.subschema_for::<glia_proto::StopPolicy>();
    generator.subschema_for::<glia_proto::ToolPolicy>();
    generator.subschema_for::<glia_proto::McpToolSource>();
    generator.subschema_for::<glia_proto::ToolSpec>();
    generator.subschema_for::<glia_proto::HttpTool>();
    generator.subschema_for::<glia_proto::Policy>();
    generator.subschema_for::<glia_proto::Guardrails>();
    generator.subschema_for::<glia_proto::recorded::RecordedTools>();
    generator.take_definitions(true).into_iter().collect()
}

/// schemars writes an unsigned integer as `format: uint32` (`uint64`,
/// `uint` for usize) with `minimum: 0`; the document states the bound
/// instead, as the hand-written schemas do (a field's own smaller
/// `maximum`, from a schemars `range`, stays).
fn bounded_unsigned(schema: &mut schemars::Schema) {
    let max = match schema.get("format").and_then(Value::as_str) {
        Some("uint32") => u64::from(u32::MAX),
        Some("uint64" | "uint") => MAX_U64,
        _ => return,
    };
    let max = schema
        .get("maximum")
        .and_then(Value::as_u64)
        .map_or(max, |own| own.min(max));
    schema.remove("format");
    // A field's own bound (`schemars(range(max = …))`) is kept.
    if schema.get("maximum").is_none() {
        schema.insert("maximum".into(), json!(max));
    }
}

/// A JSON Schema `pattern` for a string that is not blank
/// ([`glia_proto::config_error::NOT_BLANK`]).
pub const NOT_BLANK: &str = glia_proto::config_error::NOT_BLANK;

/// The documented maximum of the API's unsigned 64-bit integer fields.
pub const MAX_U64: u64 = u64::MAX;

/// A run's status, as a query parameter: `runnable`, `parked` or `done`.
#[derive(utoipa::ToSchema)]
#[schema(as = RunStatus)]
#[allow(dead_code)]
pub enum RunStatusDoc {
    /// A worker can advance it now.
    #[schema(rename = "runnable")]
    Runnable,
    /// It waits at a pull point.
    #[schema(rename = "parked")]
    Parked,
    /// It is over.
    #[schema(rename = "done")]
    Done,
}

/// How a finished run ended (`glia_backends::OutcomeKind`; the `kind` of
/// its `outcome`), as a listing filter.
#[derive(utoipa::ToSchema)]
#[schema(as = OutcomeKind)]
#[allow(dead_code)]
pub enum OutcomeKindDoc {
    /// The goal was reached.
    #[schema(rename = "succeeded")]
    Succeeded,
    /// The run failed.
    #[schema(rename = "failed")]
    Failed,
    /// The run was cancelled.
    #[schema(rename = "cancelled")]
    Cancelled,
}

fn decision_json(bulk: bool) -> Value {
    let mut properties = json!({
        "decision": {"enum": ["approve", "reject", "edit"]},
        "reason": {"type": ["string", "null"], "description": "For `reject`: shown to the model (default \"no reason given\")."},
        "input": {"description": "For `edit` (required there, absent or null otherwise): the replacement arguments, a JSON object; a worker-side check against the tool's input schema answers 422 with `field: input`."},
        "args_hash": {"type": ["string", "null"], "description": "The `args_hash` the person saw; when given it must match the pending call's, else 409 `stale_args`."}
    });
    let mut required = vec!["decision"];
    if bulk {
        properties["run_id"] = json!({"type": "string", "format": "uuid"});
        properties["call_id"] = json!({"type": "string"});
        required.extend(["run_id", "call_id"]);
    }
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": required,
        "properties": properties,
        "oneOf": [
            {"required": ["decision", "input"], "properties": {"decision": {"const": "edit"}, "input": {"type": "object"}}},
            {"properties": {"decision": {"enum": ["approve", "reject"]}, "input": {"type": "null"}}}
        ]
    })
}

foreign_schema!(
    /// Body of `POST /v1/runs/{id}/approvals/{call_id}` (`crate::model::DecisionBody`).
    DecisionBodyDoc, "DecisionBody", decision_json(false));

foreign_schema!(
    /// One decision of `POST /v1/approvals` (`crate::model::BulkDecision`).
    BulkDecisionDoc, "BulkDecision", decision_json(true));

foreign_schema!(
/// `glia_proto::LiveEvent`: a live-only event of the SSE stream.
LiveEventDoc, "LiveEvent", json!({
    "type": "object",
    "required": ["type", "data"],
    "properties": {"type": {"enum": ["model.delta", "model.discard", "tool.progress"]}, "data": {"type": "object"}}
}));

foreign_schema!(
/// One frame of `GET /v1/runs/{id}/events/stream` (text/event-stream), as
/// an SSE parser reads it: `event: event` frames carry a persisted
/// [`glia_proto::Event`] as JSON with `id` = its seq; `event: live`
/// frames carry a [`glia_proto::LiveEvent`] and no id of their own (a
/// parser repeats the last one). Keep-alive comments are not events.
SseEventDoc, "SseEvent", json!({
    "description": "One server-sent event: `event: event` (a persisted event, JSON in `data`, `id` = its seq) or `event: live` (a live delta, no id of its own).",
    "oneOf": [
        {"type": "object", "required": ["event", "data", "id"], "properties": {
            "event": {"const": "event"},
            "id": {"type": "string", "pattern": "^[0-9]+$"},
            "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": {"$ref": "#/components/schemas/Event"}}}},
        {"type": "object", "required": ["event", "data"], "properties": {
            "event": {"const": "live"},
            "id": {"type": "string"},
            "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": {"$ref": "#/components/schemas/LiveEvent"}}}}
    ]
}));

foreign_schema!(
/// One frame of `GET /v1/batches/{id}/stream` (text/event-stream):
/// `event: progress` with a `BatchView` as JSON in `data`.
BatchProgressEventDoc, "BatchProgressEvent", json!({
    "description": "One server-sent event: `event: progress`, the batch's view as JSON in `data`.",
    "type": "object", "required": ["event", "data"], "properties": {
        "event": {"const": "progress"},
        "id": {"type": "string"},
        "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": {"$ref": "#/components/schemas/BatchView"}}}
}));

/// Every `glia_proto::PullPoint` kind (`PullPoint::name`).
const PULL_POINTS: [&str; 7] = [
    "awaiting_tool",
    "awaiting_approval",
    "awaiting_input",
    "paused",
    // Issue 32, waits.
    "awaiting_timer",
    "awaiting_event",
    // Issue 32, child runs.
    "awaiting_children",
];

foreign_schema!(
    /// `glia_proto::BudgetLimits` (generated).
    BudgetLimitsDoc, "BudgetLimits", generated("BudgetLimits"));

/// The generated schema of component `name`.
fn generated(name: &str) -> Value {
    generated_schemas()
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, schema)| schema)
        .unwrap_or_else(|| panic!("no generated schema {name}"))
}

foreign_schema!(
    /// `glia_proto::RunConfig` (generated).
    RunConfigDoc, "RunConfig", generated("RunConfig"));

foreign_schema!(
    /// `glia_proto::recorded::RecordedTools` (generated).
    RecordedToolsDoc, "RecordedTools", generated("RecordedTools"));

foreign_schema!(
    /// `glia_proto::AgentDefinition` (generated).
    AgentDefinitionDoc, "AgentDefinition", generated("AgentDefinition"));

fn pull_point_json() -> Value {
    json!({
        "type": ["object", "null"],
        "required": ["kind"],
        "properties": {
            "kind": {"enum": PULL_POINTS},
            "call_ids": {"type": "array", "items": {"type": "string"}, "description": "The calls waited on (every kind but `awaiting_input` and `paused`; empty for a delayed start)."},
            "reason": {"type": "object", "description": "`paused`: why."},
            "wake_at_ms": {"type": "integer", "description": "`awaiting_timer`: the earliest due time, Unix ms."},
            "keys": {"type": "array", "items": {"type": "string"}, "description": "`awaiting_event`: the event keys waited for."},
            "timeout_at_ms": {"type": ["integer", "null"], "description": "`awaiting_event`: when something is due without an event, Unix ms."}
        }
    })
}

foreign_schema!(
/// `glia_backends::RunSummary`.
RunSummaryDoc, "RunSummary", json!({
    "type": "object",
    "required": ["run_id", "tenant", "goal", "status", "phase", "head_seq", "created_at", "updated_at",
                 "tags", "metadata", "usage", "steps", "trace_id"],
    "properties": {
        "run_id": {"type": "string", "format": "uuid"},
        "tenant": {"type": "string"},
        "batch_id": {"type": ["string", "null"], "format": "uuid"},
        "goal": {"type": "string"},
        "status": {"enum": ["runnable", "parked", "done"]},
        "phase": {"enum": ["idle", "planning", "executing", "awaiting_tool", "reflecting", "done"]},
        "pull_point": pull_point_json(),
        "outcome": {"type": ["object", "null"], "required": ["kind"], "description": "How a done run ended (`glia_proto::Outcome`).", "properties": {
            "kind": {"enum": ["succeeded", "failed", "cancelled"]},
            "answer": {"type": "string", "description": "`succeeded`: the final answer."},
            "output": {"description": "`succeeded`: the validated structured output, when the run has an output schema."},
            "error": {"type": "string", "description": "`failed`: why."},
            "reason": {"type": "string", "description": "`cancelled`: why."}
        }},
        "head_seq": {"type": "integer", "minimum": 0},
        "created_at": {"type": "string", "format": "date-time"},
        "updated_at": {"type": "string", "format": "date-time"},
        "agent": {"type": ["string", "null"], "description": "The registered agent the run was admitted with (`agent: \"name@N\"`); null for an inline config."},
        "agent_version": {"type": ["integer", "null"], "minimum": 1, "maximum": u32::MAX, "description": "That agent's version."},
        "tags": {"type": "array", "items": {"type": "string"}, "description": "Labels given at submission."},
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}, "description": "String pairs given at submission."},
        "custom_id": {"type": ["string", "null"], "description": "The batch item's custom_id, for a run of a batch."},
        "usage": {
            "type": "object",
            "description": "What the run has consumed so far (as of its last commit).",
            "required": ["turns", "tool_calls", "active_ms", "tokens", "cost_usd_micros"],
            "properties": {
                "turns": {"type": "integer", "minimum": 0, "description": "Model calls."},
                "tool_calls": {"type": "integer", "minimum": 0, "description": "Tool calls executed."},
                "active_ms": {"type": "integer", "minimum": 0, "description": "Milliseconds a worker spent on the run (parked time never counts)."},
                "tokens": {
                    "type": "object",
                    "required": ["input_tokens", "output_tokens"],
                    "properties": {
                        "input_tokens": {"type": "integer", "minimum": 0, "description": "Uncached input tokens."},
                        "output_tokens": {"type": "integer", "minimum": 0},
                        "cache_write_tokens": {"type": "integer", "minimum": 0},
                        "cache_read_tokens": {"type": "integer", "minimum": 0},
                        "estimated": {"type": "boolean", "description": "Some counts are glia's estimate (a server that sent no usage)."}
                    }
                },
                "cost_usd_micros": {"type": "integer", "minimum": 0, "description": "Cost in USD micros (1 USD = 1,000,000)."}
            }
        },
        "steps": {"type": "integer", "minimum": 0, "description": "Plan steps started in the current plan."},
        "error": {"type": ["string", "null"], "description": "Why a failed run failed, or why a cancelled run was cancelled."},
        "ended_at": {"type": ["string", "null"], "format": "date-time", "description": "When it reached `done`."},
        "trace_id": {"type": "string", "pattern": "^[0-9a-f]{32}$", "description": "The OpenTelemetry trace id of the run's spans: the run id's 16 bytes in hex."},
        "erased_at": {"type": ["string", "null"], "format": "date-time", "description": "When the run's content was erased (DELETE /v1/runs/{id} or retention); its goal and outcome then read `⟦glia:erased⟧ content erased`."},
        "erased_by": {"type": ["string", "null"], "description": "Who erased it: the token's name, or `retention`."},
        "parent_run_id": {"type": ["string", "null"], "format": "uuid", "description": "Issue 32: the run whose agent-tool call started this child run; null for a run a client started. `GET /v1/runs?parent=ID` lists a run's children."},
        "parent_call_id": {"type": ["string", "null"], "description": "That call's id in the parent."},
        "depth": {"type": "integer", "minimum": 0, "maximum": u32::MAX, "description": "0 for a run a client started; a child's is its parent's + 1 (at most 4)."}
    }
}));

foreign_schema!(
/// `glia_proto::Event`.
EventDoc, "Event", json!({
    "type": "object",
    "description": "One persisted event: `{run_id, seq, at, type, data}`; `data` depends on `type` (see the event catalogue in glia-proto).",
    "required": ["run_id", "seq", "at", "type", "data"],
    "properties": {
        "run_id": {"type": "string", "format": "uuid"},
        "seq": {"type": "integer", "minimum": 1},
        "at": {"type": "string", "format": "date-time"},
        "type": {"enum": glia_proto::EventKind::NAMES},
        "data": {}
    }
}));

foreign_schema!(
/// `glia_backends::ApprovalRow`.
ApprovalRowDoc, "ApprovalRow", json!({
    "type": "object",
    "required": ["run_id", "tenant", "call_id", "tool", "input", "args_hash", "status", "requested_at"],
    "properties": {
        "run_id": {"type": "string", "format": "uuid"},
        "tenant": {"type": "string"},
        "call_id": {"type": "string"},
        "tool": {"type": "string"},
        "input": {"description": "Arguments to approve."},
        "args_hash": {"type": "string", "description": "SHA-256 of the canonical JSON of `input`, hex; quote it in a decision."},
        "status": {"enum": ["pending", "decided"]},
        "requested_at": {"type": "string", "format": "date-time"},
        "expires_at": {"type": ["string", "null"], "format": "date-time", "description": "Deadline from the run's approval_timeout_ms."},
        "escalated": {"type": "boolean", "description": "Past its deadline and escalated; still pending."},
        "interrupted": {"type": "boolean", "description": "The call started once and its worker died: it may have taken effect. Approve to run it again, reject to leave its outcome unknown."},
        "decision": {"description": "The decision as recorded in the event log (null while pending).", "oneOf": [{"$ref": "#/components/schemas/Decision"}, {"type": "null"}]},
        "decided_by": {"type": ["string", "null"], "description": "Who decided: the token's principal name; `reconciler` for an expiry."},
        "decided_at": {"type": ["string", "null"], "format": "date-time"},
        "escalated_at": {"type": ["string", "null"], "format": "date-time", "description": "When `approval.escalated` was recorded."}
    }
}));

foreign_schema!(
/// `glia_backends::webhooks::Subscription`: a tenant's webhook subscription
/// (never its secret).
WebhookSubscriptionDoc, "WebhookSubscription", json!({
    "type": "object",
    "required": ["id", "tenant", "url", "events", "format", "created_at"],
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "tenant": {"type": "string", "description": "The owning tenant."},
        "url": {"type": "string", "description": "The receiver's URL."},
        "events": {"type": "array", "items": {"type": "string"}, "description": "Event types delivered: `approval.requested`, `approval.escalated`, `approval.expired`, `approval.resolved`, `run.completed`, `run.failed`."},
        "format": {"enum": ["standard", "slack"], "description": "The body format."},
        "created_at": {"type": "string", "format": "date-time"}
    }
}));

foreign_schema!(
/// `glia_backends::webhooks::Delivery`: one event for one subscription, with
/// its attempts so far.
WebhookDeliveryDoc, "WebhookDelivery", json!({
    "type": "object",
    "required": ["id", "msg_id", "subscription_id", "event_type", "run_id", "seq", "payload", "status", "attempts", "next_attempt_at", "last_status", "last_error", "created_at", "delivered_at"],
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": MAX_U64},
        "msg_id": {"type": "string", "format": "uuid", "description": "The `webhook-id` header: the same on every attempt."},
        "subscription_id": {"type": "string", "format": "uuid"},
        "event_type": {"type": "string"},
        "run_id": {"type": "string", "format": "uuid"},
        "seq": {"type": "integer", "minimum": 0, "maximum": MAX_U64, "description": "The run event's seq."},
        "payload": {"type": "object", "description": "The standard body: `{type, timestamp, data}`."},
        "status": {"enum": ["pending", "delivered", "dead"]},
        "attempts": {"type": "integer", "minimum": 0, "maximum": 4294967295u32},
        "next_attempt_at": {"type": "string", "format": "date-time", "description": "When the next attempt is due (pending ones)."},
        "last_status": {"type": ["integer", "null"], "minimum": 0, "maximum": 65535, "description": "The last attempt's HTTP status, if one answered."},
        "last_error": {"type": ["string", "null"], "description": "Why the last attempt failed."},
        "created_at": {"type": "string", "format": "date-time"},
        "delivered_at": {"type": ["string", "null"], "format": "date-time", "description": "When a 2xx came back."}
    }
}));

foreign_schema!(
/// `glia_proto::Decision`, as posted.
DecisionDoc, "Decision", json!({
    "type": "object",
    "required": ["kind"],
    "properties": {"kind": {"enum": ["approve", "reject", "edit", "expire"]}, "reason": {"type": "string"}, "input": {}}
}));

/// What the handlers' annotations cannot say, added to the generated
/// document: headers are strings on the wire, never null (`Last-Event-ID` an
/// event seq, `Idempotency-Key` 1 to 255 visible ASCII characters); integer
/// parameters stop at [`MAX_U64`]; and every `/v1` operation may
/// answer 503 when a backing store fails (`log_unavailable`,
/// `queue_unavailable`, `ledger_unavailable`); and an `operationId` the
/// handlers' names repeat across resources (`list`, `create`, `cancel`, …)
/// becomes `<tag>_<id>` (`batches_list`), as OpenAPI requires ids unique
/// (typed clients generated from the document need them so).
pub fn complete(doc: &mut Value) {
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    unique_operation_ids(paths);
    for (path, item) in paths.iter_mut() {
        let Some(operations) = item.as_object_mut() else {
            continue;
        };
        for operation in operations.values_mut() {
            // A body documented "May be empty" is optional: an empty one means the defaults.
            if let Some(body) = operation
                .get_mut("requestBody")
                .and_then(Value::as_object_mut)
                && body.get("description").and_then(Value::as_str) == Some("May be empty")
            {
                body.insert("required".into(), json!(false));
            }
            for param in operation
                .get_mut("parameters")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                let name = param["name"].as_str().unwrap_or_default().to_owned();
                let schema = &mut param["schema"];
                match name.as_str() {
                    "Last-Event-ID" => {
                        *schema = json!({"type": "integer", "minimum": 0, "maximum": MAX_U64})
                    }
                    "Idempotency-Key" => {
                        *schema = json!({"type": "string", "pattern": "^[!-~]{1,255}$"})
                    }
                    _ if schema["type"] == "integer" && schema.get("maximum").is_none() => {
                        schema["maximum"] = json!(MAX_U64)
                    }
                    _ => {}
                }
            }
            if path.starts_with("/v1/")
                && let Some(responses) = operation
                    .get_mut("responses")
                    .and_then(Value::as_object_mut)
            {
                responses.entry("503").or_insert_with(|| {
                    json!({
                        "description": "A backing store failed: `log_unavailable` (Postgres), `queue_unavailable` (RabbitMQ) or `ledger_unavailable` (Redis); retry later.",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
                    })
                });
            }
        }
    }
}

/// Rename each `operationId` that more than one operation of `paths` uses
/// to `<first tag>_<id>`; ids used once are kept.
fn unique_operation_ids(paths: &mut serde_json::Map<String, Value>) {
    let ids = || {
        paths
            .values()
            .filter_map(Value::as_object)
            .flat_map(|item| item.values())
            .filter_map(|op| op.get("operationId").and_then(Value::as_str))
    };
    let mut uses = std::collections::HashMap::<String, usize>::new();
    for id in ids() {
        *uses.entry(id.to_owned()).or_default() += 1;
    }
    for op in paths
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut())
    {
        let (Some(id), Some(tag)) = (
            op.get("operationId").and_then(Value::as_str),
            op.pointer("/tags/0").and_then(Value::as_str),
        ) else {
            continue;
        };
        if uses.get(id).copied().unwrap_or(0) > 1 {
            op["operationId"] = json!(format!("{tag}_{id}"));
        }
    }
}

/// The configuration file types as standalone JSON Schema documents (2020-12),
/// by file name: `run-config.schema.json` ([`glia_proto::RunConfig`]) and
/// `agent.schema.json` ([`glia_proto::AgentDefinition`]). Each is the
/// component `/openapi.json` serves, with the components it references under
/// `$defs`. `glia schemas` writes them to `schemas/`.
pub fn config_schemas() -> Vec<(&'static str, Value)> {
    // Both types and every component they reference are here
    // ([`foreign_schemas`]): the document serves exactly these.
    let components: serde_json::Map<String, Value> = foreign_schemas().into_iter().collect();
    [("run-config.schema.json", "RunConfig"), ("agent.schema.json", "AgentDefinition")]
        .into_iter()
        .map(|(file, root)| {
            let mut defs = serde_json::Map::new();
            let mut todo = vec![root.to_owned()];
            while let Some(name) = todo.pop() {
                if defs.contains_key(&name) {
                    continue;
                }
                let mut schema = components[&name].clone();
                rebase_refs(&mut schema, &mut todo);
                defs.insert(name, schema);
            }
            let doc = json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "$id": format!("https://glia.invalid/schemas/{file}"),
                "title": root,
                "$ref": format!("#/$defs/{root}"),
                "$defs": Value::Object(defs.into_iter().collect::<std::collections::BTreeMap<_, _>>().into_iter().collect()),
            });
            // Keys sorted: the files do not depend on the generator's order.
            (file, glia_proto::json::sort_keys(&doc))
        })
        .collect()
}

/// Point `#/components/schemas/X` references at `#/$defs/X`, noting each X.
fn rebase_refs(value: &mut Value, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get_mut("$ref")
                && let Some(name) = r.strip_prefix("#/components/schemas/")
            {
                found.push(name.to_owned());
                *r = format!("#/$defs/{name}");
            }
            map.values_mut().for_each(|v| rebase_refs(v, found));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rebase_refs(v, found)),
        _ => {}
    }
}
