//! OpenAPI plumbing: the document's header (title, security scheme) and
//! hand-written schemas for the contract types that live in `glia-proto` and
//! `glia-backends` (which do not derive `utoipa::ToSchema`). Each marker type
//! here stands for the real type in the document only; tests check the real
//! types' JSON against these schemas.

use std::borrow::Cow;

use serde_json::{Value, json};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

/// The document's header and security scheme; paths are added by the router.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "glia dispatcher",
        description = "Durable, resumable LLM agent runs: admit runs, read and stream their event logs, decide approvals, post external tool results and user messages, extend budgets, cancel. Every error is `{\"error\": {\"code\", \"message\"}}`.",
        license(name = "MIT")
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "runs", description = "Admission, listing, event logs and streams"),
        (name = "approvals", description = "The approval queue and decisions"),
        (name = "payloads", description = "Tool results, messages, resume, cancel"),
        (name = "ops", description = "Health, readiness, metrics, this document")
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()));
    }
}

/// A placeholder; [`crate::openapi`] replaces it with the hand-written JSON
/// (utoipa's schema model cannot hold every JSON Schema 2020-12 form).
fn placeholder() -> RefOr<Schema> {
    RefOr::T(Schema::Object(utoipa::openapi::ObjectBuilder::new().build()))
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

/// Component name → hand-written JSON Schema, for the types defined outside this crate.
pub fn foreign_schemas() -> Vec<(&'static str, Value)> {
    vec![
        ("BudgetLimits", BudgetLimitsDoc::json()),
        ("RunConfig", RunConfigDoc::json()),
        ("RunSummary", RunSummaryDoc::json()),
        ("Event", EventDoc::json()),
        ("ApprovalRow", ApprovalRowDoc::json()),
        ("Decision", DecisionDoc::json()),
    ]
}

const PULL_POINTS: [&str; 4] = ["awaiting_tool", "awaiting_approval", "awaiting_input", "paused"];

/// Event type names of the catalogue (persisted events).
pub const EVENT_TYPES: [&str; 23] = [
    "session.start",
    "plan.draft",
    "plan.commit",
    "step.start",
    "step.end",
    "model.call",
    "model.response",
    "tool.call",
    "tool.result",
    "tool.error",
    "approval.requested",
    "approval.resolved",
    "input.received",
    "guardrail.tripped",
    "context.compacted",
    "budget.warn",
    "budget.extended",
    "session.pause",
    "session.resume",
    "session.cancel",
    "session.complete",
    "error",
    "hook.applied",
];

fn limits_json() -> Value {
    let n = json!({"type": ["integer", "null"], "minimum": 0});
    json!({
        "type": "object",
        "description": "Budget limits; null or absent = unlimited. Units: counts, milliseconds of active time, tokens, USD micros (1 USD = 1,000,000).",
        "properties": {
            "max_turns": n, "max_tool_calls": n, "max_active_ms": n, "max_input_tokens": n,
            "max_output_tokens": n, "max_cache_write_tokens": n, "max_cache_read_tokens": n, "max_cost_usd_micros": n
        }
    })
}

foreign_schema!(
    /// `glia_proto::BudgetLimits`.
    BudgetLimitsDoc, "BudgetLimits", limits_json());

foreign_schema!(
    /// `glia_proto::RunConfig`.
    RunConfigDoc, "RunConfig", json!({
        "type": "object",
        "description": "A run's configuration, recorded in session.start. Every field is optional (defaults: model `scripted`, 16 model calls per turn, 2 re-asks, 4096 max tokens).",
        "properties": {
            "model": {"type": "string"},
            "system": {"type": "string"},
            "tools": {"type": ["array", "null"], "items": {"type": "string"}, "description": "Registered tools this run may call; null = all."},
            "external_tools": {"type": "array", "items": {"type": "object", "required": ["name", "description", "input_schema"], "properties": {
                "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"}, "description": {"type": "string"}, "input_schema": {"type": "object"},
                "idempotent": {"type": "boolean"}, "timeout_ms": {"type": "integer", "minimum": 0}, "external": {"type": "boolean"}, "return_direct": {"type": "boolean", "description": "A successful call ends the run with its result (a hand-off)."}}}},
            "policies": {"type": "array", "items": {"type": "object", "required": ["tool", "action"], "properties": {
                "tool": {"type": "string"}, "args": {"type": ["string", "null"], "description": "Regex over the arguments' canonical JSON."},
                "action": {"type": "object", "required": ["kind"], "properties": {"kind": {"enum": ["allow", "deny", "require_approval", "remind"]}, "reason": {"type": "string"}, "text": {"type": "string"}}}}}},
            "budget": {"$ref": "#/components/schemas/BudgetLimits"},
            "max_model_calls_per_turn": {"type": "integer", "minimum": 1},
            "conversational": {"type": "boolean"},
            "planner": {"enum": ["single", "model"]},
            "output_schema": {"description": "JSON Schema of the final answer."},
            "max_reasks": {"type": "integer", "minimum": 0},
            "pricing": {"type": ["object", "null"]},
            "max_tokens": {"type": "integer", "minimum": 1},
            "approval_timeout_ms": {"type": ["integer", "null"], "minimum": 0, "description": "How long an approval may wait, ms; null waits forever."},
            "on_approval_timeout": {"enum": ["reject", "escalate"], "description": "What the reconciler does past the deadline."},
            "on_interrupted_call": {"enum": ["outcome_unknown", "require_approval"], "description": "A non-idempotent call whose worker died while it ran: an outcome_unknown result at once, or a person's word on running it again."},
            "stop_reasons": {"type": "object", "additionalProperties": false,
                "description": "What the loop does with an answer that is not a finished turn, per class (defaults: truncated and empty re-ask; refusal, content_filter, context_window and unknown fail). No class can be made to succeed.",
                "properties": {
                    "truncated": {"enum": ["reask", "pause", "fail"]}, "empty": {"enum": ["reask", "pause", "fail"]},
                    "refusal": {"enum": ["reask", "pause", "fail"]}, "content_filter": {"enum": ["reask", "pause", "fail"]},
                    "context_window": {"enum": ["reask", "pause", "fail"]}, "unknown": {"enum": ["reask", "pause", "fail"]}}}
        }
    }));

fn pull_point_json() -> Value {
    json!({
        "type": ["object", "null"],
        "required": ["kind"],
        "properties": {"kind": {"enum": PULL_POINTS}, "call_ids": {"type": "array", "items": {"type": "string"}}, "reason": {"type": "object"}}
    })
}

foreign_schema!(
    /// `glia_backends::RunSummary`.
    RunSummaryDoc, "RunSummary", json!({
        "type": "object",
        "required": ["run_id", "tenant", "goal", "status", "phase", "head_seq", "created_at", "updated_at"],
        "properties": {
            "run_id": {"type": "string", "format": "uuid"},
            "tenant": {"type": "string"},
            "batch_id": {"type": ["string", "null"], "format": "uuid"},
            "goal": {"type": "string"},
            "status": {"enum": ["runnable", "parked", "done"]},
            "phase": {"enum": ["idle", "planning", "executing", "awaiting_tool", "reflecting", "done"]},
            "pull_point": pull_point_json(),
            "outcome": {"type": ["object", "null"], "required": ["kind"], "properties": {"kind": {"enum": ["succeeded", "failed", "cancelled"]}}},
            "head_seq": {"type": "integer", "minimum": 0},
            "created_at": {"type": "string", "format": "date-time"},
            "updated_at": {"type": "string", "format": "date-time"}
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
            "type": {"enum": EVENT_TYPES},
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
            "interrupted": {"type": "boolean", "description": "The call started once and its worker died: it may have taken effect. Approve to run it again, reject to leave its outcome unknown."}
        }
    }));

foreign_schema!(
    /// `glia_proto::Decision`, as posted.
    DecisionDoc, "Decision", json!({
        "type": "object",
        "required": ["kind"],
        "properties": {"kind": {"enum": ["approve", "reject", "edit"]}, "reason": {"type": "string"}, "input": {}}
    }));
