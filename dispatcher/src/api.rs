//! The endpoints. JSON in and out; every error is an [`ApiError`].
//!
//! | endpoint | scope | success | errors besides auth (401/403) and bad input (400/413/415/422) |
//! |---|---|---|---|
//! | `POST /v1/runs` | submit | 201 run (200 on an idempotent repeat) | 409 `idempotency_conflict`, 422 `invalid_request` |
//! | `GET /v1/runs` | any | 200 page | – |
//! | `GET /v1/runs/{id}` | any | 200 run | 404 `run_not_found` |
//! | `GET /v1/runs/{id}/events` | any | 200 page | 404 `run_not_found` |
//! | `GET /v1/runs/{id}/events/stream` | any | 200 SSE | 404 `run_not_found`, 400 `invalid_header` |
//! | `GET /v1/approvals` | approve | 200 page | – |
//! | `POST /v1/approvals` | approve | 200 per-item results | – |
//! | `GET /v1/approvals/history` | approve | 200 records (JSON or CSV) | – |
//! | `POST`, `GET /v1/webhooks`, `DELETE /v1/webhooks/{id}`, `GET /v1/webhooks/{id}/deliveries` | submit or approve | see [`crate::webhooks`] | |
//! | `POST /v1/runs/{id}/approvals/{call_id}` | approve | 202 | 404 `run_not_found` / `call_not_found` / `approval_not_found`, 409 `already_decided` / `stale_args` / `run_finished` / `run_cancelled` |
//! | `POST /v1/runs/{id}/tool-results/{call_id}` | submit | 202 | 404 `run_not_found` / `call_not_found`, 409 `not_external` / `already_answered` / `run_finished` / `run_cancelled` |
//! | `POST /v1/runs/{id}/messages` | submit | 202 | 404, 409 `not_awaiting_input` / `already_posted` / `run_finished` / `run_cancelled` |
//! | `POST /v1/runs/{id}/pause` | submit | 202 | 404, 409 `already_paused` / `run_finished` / `run_cancelled` |
//! | `POST /v1/runs/{id}/resume` | submit or approve | 202 | 404, 409 `not_paused` / `already_posted` / `run_finished` / `run_cancelled` |
//! | `POST /v1/runs/{id}/close` | submit | 202 | 404, 409 `not_awaiting_input` / `already_posted` / `run_finished` / `run_cancelled` |
//! | `POST /v1/runs/{id}/cancel` | submit | 202 | 404, 409 `run_finished`, 503 `ledger_unavailable` |
//! | `GET /healthz`, `/readyz`, `/metrics`, `/openapi.json` | none | 200 | 503 `not_ready` |
//!
//! Any handler may answer 503 `log_unavailable` / `queue_unavailable` when a
//! backing store fails, and every route but `/healthz` and `/readyz` answers
//! 503 `not_ready` (with `Retry-After: 1`) while the dispatcher is still
//! connecting to its services at start ([`crate::startup`]).

use std::collections::BTreeMap;
use std::sync::LazyLock;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use glia_backends::{ApprovalFilter, ApprovalRow, NewRun, RunFilter, RunStatus, RunSummary};
use glia_proto::{
    ApprovalStatus, BudgetLimits, Decision, Disposition, Event, EventKind, PauseReason, PullPoint,
    Resume, RunConfig, RunState,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::auth::{Principal, Scope};
use crate::docs::{
    ApiDoc, ApprovalRowDoc, BudgetLimitsDoc, DecisionDoc, EventDoc, RunConfigDoc, RunSummaryDoc,
};
use crate::error::{ApiError, ErrorBody, ErrorDetail};
use crate::extract::{ApiJson, ApiPath, ApiQuery, OptJson};
use crate::{App, stream};

/// Every endpoint with its OpenAPI description.
pub fn routes() -> OpenApiRouter<App> {
    use utoipa::OpenApi;
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(create_run, list_runs))
        .routes(routes!(get_run))
        .routes(routes!(list_events))
        .routes(routes!(stream::stream_events))
        .routes(routes!(list_approvals, decide_bulk))
        .routes(routes!(approval_history))
        .routes(routes!(crate::webhooks::create, crate::webhooks::list))
        .routes(routes!(crate::webhooks::delete))
        .routes(routes!(crate::webhooks::deliveries))
        .routes(routes!(crate::batches::create, crate::batches::list))
        .routes(routes!(crate::batches::get))
        .routes(routes!(crate::batches::results))
        .routes(routes!(crate::batches::stream))
        .routes(routes!(crate::batches::cancel))
        .routes(routes!(crate::batches::pause))
        .routes(routes!(crate::batches::resume))
        .routes(routes!(decide))
        .routes(routes!(post_tool_result))
        .routes(routes!(post_message))
        .routes(routes!(pause))
        .routes(routes!(resume))
        .routes(routes!(cancel))
        .routes(routes!(close))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .routes(routes!(openapi_json))
        .routes(routes!(crate::agents::put_agent, crate::agents::get_agent))
        .routes(routes!(crate::agents::list_agents))
        .routes(routes!(crate::agents::get_version))
}

// ----- shapes ----------------------------------------------------------------

/// Body of `POST /v1/runs`: `{"goal": "…", "config": {…}, "batch_id": "…"}`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRun {
    /// The goal, the run's first user message; not blank.
    #[schema(
        pattern = "[^\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
    )] // crate::docs::NOT_BLANK
    pub goal: String,
    /// The run's configuration (all fields optional).
    #[serde(default)]
    #[schema(value_type = RunConfigDoc)]
    pub config: RunConfig,
    /// A batch of the caller's tenant (`POST /v1/batches`) the run joins;
    /// any other id (another tenant's, or none that exists) is 404
    /// `batch_not_found`.
    #[serde(default)]
    pub batch_id: Option<Uuid>,
    /// A registered agent of the caller's tenant, `name` (its latest
    /// version) or `name@VERSION`: the run's config is the definition's, with
    /// the version and content hash recorded in `session.start`. Not
    /// combined with `config`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,63}(@[0-9]+)?$")]
    pub agent: Option<String>,
}

/// A page of runs, ordered by id (creation order).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunPage {
    /// The runs.
    #[schema(value_type = Vec<RunSummaryDoc>)]
    pub runs: Vec<RunSummary>,
    /// Pass as `after` for the next page; absent on the last page.
    pub next: Option<Uuid>,
}

/// Query of `GET /v1/runs`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListRunsQuery {
    /// `runnable`, `parked` or `done`.
    #[param(inline, value_type = Option<crate::docs::RunStatusDoc>)]
    pub status: Option<RunStatus>,
    /// Only runs of this batch.
    pub batch_id: Option<Uuid>,
    /// Only this tenant's runs (admins only; others always see their own).
    pub tenant: Option<String>,
    /// Cursor: the `next` of the previous page.
    pub after: Option<Uuid>,
    /// Page size, 1 to 1,000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

/// Query of `GET /v1/runs/{id}/events`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Only events with `seq > after` (default 0).
    pub after: Option<u64>,
    /// Page size, 1 to 1,000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

/// A page of a run's events.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventPage {
    /// Events in `seq` order.
    #[schema(value_type = Vec<EventDoc>)]
    pub events: Vec<Event>,
    /// Pass as `after` for the next page (the last seq returned, or the `after` asked).
    pub next_after: u64,
    /// The run's head sequence when the page was read.
    pub head_seq: u64,
}

/// Which approvals to list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatusFilter {
    /// Waiting for a decision (default).
    #[default]
    Pending,
    /// Pending and decided.
    All,
}

/// Query of `GET /v1/approvals`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ApprovalsQuery {
    /// `pending` (default) or `all`.
    #[param(inline, value_type = Option<ApprovalStatusFilter>)]
    pub status: Option<ApprovalStatusFilter>,
    /// Only this tool's.
    pub tool: Option<String>,
    /// Only this run's.
    pub run_id: Option<Uuid>,
    /// Page size, 1 to 1,000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

/// Approvals, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApprovalPage {
    /// The approvals.
    #[schema(value_type = Vec<ApprovalRowDoc>)]
    pub approvals: Vec<crate::history::ApprovalView>,
}

/// Answer of `GET /v1/approvals/history`: newest request first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ApprovalHistory {
    /// The records (see `glia_dispatcher::history::ApprovalRecord`).
    #[schema(value_type = Vec<Object>)]
    pub approvals: Vec<crate::history::ApprovalRecord>,
}

/// What a person decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// Run the call as proposed.
    Approve,
    /// Do not run it; the model sees `reason`.
    Reject,
    /// Run it with `input` instead.
    Edit,
}

/// Body of `POST /v1/runs/{id}/approvals/{call_id}`:
/// `{"decision": "approve"|"reject"|"edit", "reason": "…", "input": {…}, "args_hash": "…"}`.
/// Documented by the hand-written [`crate::docs::DecisionBodyDoc`] (`input`
/// is required for `edit` and refused otherwise, which a derived schema
/// cannot say).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    /// The decision.
    pub decision: DecisionKind,
    /// For `reject`: shown to the model (default "no reason given").
    #[serde(default)]
    pub reason: Option<String>,
    /// For `edit` (required there, refused elsewhere): the replacement arguments, a JSON object.
    #[serde(default)]
    pub input: Option<Value>,
    /// The `args_hash` the person saw; when given it must match the pending
    /// call's, else 409 `stale_args`.
    #[serde(default)]
    pub args_hash: Option<String>,
}

impl DecisionBody {
    fn to_decision(&self) -> Result<Decision, ApiError> {
        match (self.decision, &self.input) {
            (DecisionKind::Edit, Some(input @ Value::Object(_))) => Ok(Decision::Edit {
                input: input.clone(),
            }),
            (DecisionKind::Edit, Some(_)) => Err(ApiError::Invalid(
                "`input` of an edit must be a JSON object".into(),
            )),
            (DecisionKind::Edit, None) => Err(ApiError::Invalid(
                "an edit needs `input`, the replacement arguments".into(),
            )),
            (_, Some(_)) => Err(ApiError::Invalid("`input` is only for `edit`".into())),
            (DecisionKind::Approve, None) => Ok(Decision::Approve),
            (DecisionKind::Reject, None) => {
                let reason = self
                    .reason
                    .as_deref()
                    .map(str::trim)
                    .filter(|r| !r.is_empty())
                    .unwrap_or("no reason given");
                Ok(Decision::Reject {
                    reason: reason.to_owned(),
                })
            }
        }
    }
}

/// One decision of a bulk request (documented by the hand-written
/// [`crate::docs::BulkDecisionDoc`], as [`DecisionBody`]).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BulkDecision {
    /// The run.
    pub run_id: Uuid,
    /// The call.
    pub call_id: String,
    /// The decision.
    pub decision: DecisionKind,
    /// As in [`DecisionBody`].
    #[serde(default)]
    pub reason: Option<String>,
    /// As in [`DecisionBody`].
    #[serde(default)]
    pub input: Option<Value>,
    /// As in [`DecisionBody`].
    #[serde(default)]
    pub args_hash: Option<String>,
}

/// Body of `POST /v1/approvals`: `{"decisions": [{run_id, call_id, decision, …}, …]}` (at most 100).
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkDecisions {
    /// The decisions, each on its own; at most 100. One run's decisions are
    /// applied in the order given; different runs' are posted concurrently.
    #[schema(value_type = Vec<crate::docs::BulkDecisionDoc>, max_items = 100)]
    pub decisions: Vec<BulkDecision>,
}

/// The outcome of one bulk decision.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct BulkItemResult {
    /// The run.
    pub run_id: Uuid,
    /// The call.
    pub call_id: String,
    /// The status the single endpoint would have answered (202, 404, 409 …).
    pub status: u16,
    /// Set on success.
    pub accepted: Option<Accepted>,
    /// Set on failure.
    pub error: Option<ErrorDetail>,
}

/// Answer of `POST /v1/approvals`: one result per decision, in order.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct BulkResults {
    /// The results.
    pub results: Vec<BulkItemResult>,
}

/// A payload was posted; a worker will apply it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
pub struct Accepted {
    /// The run.
    pub run_id: Uuid,
    /// The call, for approvals and tool results.
    pub call_id: Option<String>,
    /// Inbox item ids written (two for an extension of a run paused for a
    /// reason other than its budget: the extension, then the resume).
    pub inbox_ids: Vec<i64>,
    /// Payload kinds posted, in order: `approval`, `tool_result`, `input`,
    /// `extend_budget`, `pause`, `resume`, `close`, `cancel`.
    pub kinds: Vec<String>,
    /// For approvals: the decision as posted.
    #[schema(value_type = Option<DecisionDoc>)]
    pub decision: Option<Decision>,
}

/// Body of `POST /v1/runs/{id}/tool-results/{call_id}`: `{"content": "…", "is_error": false}`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolResultBody {
    /// Result text the model sees (serialise JSON results to a string).
    pub content: String,
    /// True when the tool failed.
    #[serde(default)]
    pub is_error: bool,
}

/// Body of `POST /v1/runs/{id}/messages`: `{"text": "…"}`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageBody {
    /// The user's next message; not blank.
    #[schema(
        pattern = "[^\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
    )] // crate::docs::NOT_BLANK
    pub text: String,
    /// Post only if the run's head is still this sequence number (its
    /// `head_seq` when the sender saw it waiting for input); otherwise 409
    /// `head_moved` and nothing is posted. A client that retries a message
    /// whose first attempt may have landed sends it, so the retry is never
    /// taken as the user's next message.
    #[serde(default)]
    pub head_seq: Option<u64>,
}

/// Body of `POST /v1/runs/{id}/resume` (may be empty): `{"extend": {"max_turns": 10}}`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeBody {
    /// Amounts to add to the limits (each set field adds). Absent or all
    /// null: resume as is.
    #[serde(default)]
    #[schema(value_type = Option<BudgetLimitsDoc>)]
    pub extend: Option<BudgetLimits>,
}

/// Body of `POST /v1/runs/{id}/pause` (may be empty): `{"reason": "…"}`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseBody {
    /// Why; recorded in `session.pause_requested` and in the pause reason
    /// (default `paused by NAME`).
    #[serde(default)]
    pub reason: Option<String>,
}

/// Body of `POST /v1/runs/{id}/cancel` (may be empty): `{"reason": "…"}`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    /// Why; recorded in `session.cancel` (default `cancelled by NAME`).
    #[serde(default)]
    pub reason: Option<String>,
}

/// Body of `POST /v1/runs/{id}/close` (may be empty): `{"text": "…"}`, the
/// user's last message.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CloseBody {
    /// Recorded as the user's last message before the run completes; not blank.
    #[serde(default)]
    #[schema(
        pattern = "[^\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
    )] // crate::docs::NOT_BLANK
    pub text: Option<String>,
    /// Post only if the run's head is still this sequence number (its
    /// `head_seq` when the sender saw it waiting for input); otherwise 409
    /// `head_moved` and nothing is posted. A client that retries a message
    /// whose first attempt may have landed sends it, so the retry is never
    /// taken as the user's next message.
    #[serde(default)]
    pub head_seq: Option<u64>,
}

/// Answer of `/healthz` and `/readyz`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct Health {
    /// `ok` or `ready`.
    pub status: String,
    /// For `/readyz`: `event_log`, `job_queue`, `ledger` → `ok` or the failure.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub checks: BTreeMap<String, String>,
}

/// Answer of a failed `/readyz`: the error plus every check.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct NotReady {
    /// `{"code": "not_ready", "message": "job_queue: …"}`.
    pub error: ErrorDetail,
    /// Each check → `ok` or its failure.
    pub checks: BTreeMap<String, String>,
}

/// The component schema each request body is checked against (see [`crate::extract::Documented`]).
macro_rules! documented {
    ($($ty:ty => $name:literal),* $(,)?) => {
        $(impl crate::extract::Documented for $ty {
            const SCHEMA: &'static str = $name;
        })*
    };
}

documented! {
    CreateRun => "CreateRun",
    DecisionBody => "DecisionBody",
    BulkDecisions => "BulkDecisions",
    ToolResultBody => "ToolResultBody",
    MessageBody => "MessageBody",
    ResumeBody => "ResumeBody",
    PauseBody => "PauseBody",
    CancelBody => "CancelBody",
    CloseBody => "CloseBody",
    crate::webhooks::NewSubscription => "NewSubscription",
}

// ----- helpers -----------------------------------------------------------------

/// The run, if `p` may see it; another tenant's run is 404, like a missing one.
pub(crate) async fn visible_run(
    app: &App,
    p: &Principal,
    run_id: Uuid,
) -> Result<RunSummary, ApiError> {
    let run = app.log.get_run(run_id).await?;
    if p.sees(&run.tenant) {
        Ok(run)
    } else {
        Err(ApiError::RunNotFound(run_id))
    }
}

fn page(limit: Option<usize>, app: &App) -> Result<usize, ApiError> {
    match limit {
        None => Ok(app.limits.default_page),
        Some(n) if (1..=app.limits.max_page).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::InvalidQuery(format!(
            "limit {n} is outside 1..={}",
            app.limits.max_page
        ))),
    }
}

fn not_done(run: &RunSummary) -> Result<(), ApiError> {
    if run.status == RunStatus::Done {
        Err(ApiError::RunFinished(run.run_id))
    } else {
        Ok(())
    }
}

pub(crate) fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let bad = |reason: &str| ApiError::InvalidHeader {
        name: "Idempotency-Key",
        reason: reason.to_owned(),
    };
    let s = v.to_str().map_err(|_| bad("not visible ASCII"))?.trim();
    if s.is_empty() || s.len() > 255 {
        return Err(bad("must be 1 to 255 characters"));
    }
    if !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad("must be visible ASCII without spaces"));
    }
    Ok(Some(s.to_owned()))
}

/// Checks a worker would otherwise fail on late: the dispatcher refuses them
/// at admission, naming the field ([`RunConfig::validate`]: tool and output
/// schemas are compiled as JSON Schema).
pub(crate) fn validate_run(req: &CreateRun) -> Result<(), ApiError> {
    if req.goal.trim().is_empty() {
        return Err(ApiError::InvalidField {
            field: "goal".into(),
            reason: "is blank".into(),
        });
    }
    if req.config.agent.is_some() {
        return Err(ApiError::InvalidField {
            field: "config.agent".into(),
            reason: "is set by the dispatcher: name the agent in `agent`".into(),
        });
    }
    req.config.validate().map_err(|e| ApiError::InvalidField {
        field: format!("config.{}", e.field),
        reason: e.reason,
    })
}

/// The operator's catalogue check of a config (MCP servers, HTTP tool
/// origins, providers; see [`crate::App::admission`]). Errors: 422 naming
/// `config.{field}`.
pub(crate) fn catalogue_check(app: &App, config: &RunConfig) -> Result<(), ApiError> {
    match &app.admission {
        Some(admit) => admit(config).map_err(|e| ApiError::InvalidField {
            field: format!("config.{}", e.field),
            reason: e.reason,
        }),
        None => Ok(()),
    }
}

/// The config a run request admits: its `config`, or, with `agent`, the
/// resolved definition of the tenant's agent ([`crate::agents::resolve`]).
/// The one place a run's config is decided; every way of creating a run
/// goes through it. Errors: 422 `config` when both are given, 404 for an
/// unknown agent.
pub(crate) async fn run_config(
    app: &App,
    tenant: &str,
    req: &CreateRun,
) -> Result<RunConfig, ApiError> {
    validate_run(req)?;
    let Some(agent) = &req.agent else {
        catalogue_check(app, &req.config)?;
        return Ok(req.config.clone());
    };
    if req.config != RunConfig::default() {
        return Err(ApiError::InvalidField {
            field: "config".into(),
            reason: "cannot be combined with `agent` (the definition is the config)".into(),
        });
    }
    let config = crate::agents::resolve(app, tenant, agent).await?;
    config.validate().map_err(|e| ApiError::InvalidField {
        field: format!("agent ({agent}).{}", e.field),
        reason: e.reason,
    })?;
    if let Some(admit) = &app.admission {
        admit(&config).map_err(|e| ApiError::InvalidField {
            field: format!("agent ({agent}).{}", e.field),
            reason: e.reason,
        })?;
    }
    Ok(config)
}

async fn post(
    app: &App,
    run_id: Uuid,
    payload: Resume,
) -> Result<(i64, &'static str), glia_backends::LogError> {
    let kind = match &payload {
        Resume::Approval { .. } => "approval",
        Resume::ToolResult { .. } => "tool_result",
        Resume::Input { .. } => "input",
        Resume::ExtendBudget { .. } => "extend_budget",
        Resume::Pause { .. } => "pause",
        Resume::Resume { .. } => "resume",
        Resume::Close { .. } => "close",
        Resume::Cancel { .. } => "cancel",
        Resume::Escalate { .. } => "escalate",
    };
    let id = app.log.post(run_id, payload).await?;
    app.metrics().posted(kind);
    app.wake_relay();
    Ok((id, kind))
}

// ----- runs ----------------------------------------------------------------------

/// Admit a run.
///
/// Builds its `session.start` (run id: a new UUIDv7), validates it, and
/// writes the run, the event and its job atomically; answers only after the
/// commit. With an `Idempotency-Key` already used by the tenant: 200 with
/// that run (409 `idempotency_conflict` when goal, config or batch differ).
#[utoipa::path(post, path = "/v1/runs", tag = "runs", request_body = CreateRun,
    params(("Idempotency-Key" = Option<String>, Header, description = "Per-tenant idempotency key, 1 to 255 visible ASCII characters")),
    responses(
        (status = 201, description = "Admitted", body = RunSummaryDoc),
        (status = 200, description = "Idempotent repeat: the existing run", body = RunSummaryDoc),
        (status = 404, description = "`agent_not_found`: the tenant has no such agent or version; `batch_not_found`: `batch_id` names no batch of the tenant's", body = ErrorBody),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create_run(
    State(app): State<App>,
    p: Principal,
    headers: HeaderMap,
    ApiJson(req): ApiJson<CreateRun>,
) -> Result<Response, ApiError> {
    p.require(Scope::Submit)?;
    let key = idempotency_key(&headers)?;
    if let Some(batch) = req.batch_id {
        own_batch(&app, &p.tenant, batch).await?;
    }
    let (run, created) = admit_run(&app, &p.tenant, key, &req).await?;
    if !created {
        return Ok((StatusCode::OK, Json(run)).into_response());
    }
    let location = HeaderValue::from_str(&format!("/v1/runs/{}", run.run_id))
        .expect("a uuid path is a valid header");
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(run),
    )
        .into_response())
}

/// 404 `batch_not_found` unless `batch` is a batch of `tenant`'s (one
/// submitted with `POST /v1/batches`): another tenant's batch and one that
/// does not exist answer the same, so the answer tells nothing of other
/// tenants (the run is never created in another tenant's batch, nor in a
/// batch nobody made).
async fn own_batch(app: &App, tenant: &str, batch: Uuid) -> Result<(), ApiError> {
    let found = match &app.batches.store {
        Some(store) => store.batch(Some(tenant), batch).await?.is_some(),
        None => false,
    };
    if found {
        Ok(())
    } else {
        Err(ApiError::BatchNotFound(batch))
    }
}

/// Admit `req` as a run of `tenant`: what `POST /v1/runs` does after
/// authentication, and what a batch's admission loop does for each item
/// (so a batch accepts exactly what a single submit accepts). Answers the
/// run and whether it was created (false: the idempotency key found an
/// earlier run with the same goal, config and batch). Errors: 422 for a bad
/// goal or config, 409 `idempotency_conflict`, 503 when the log fails.
pub(crate) async fn admit_run(
    app: &App,
    tenant: &str,
    key: Option<String>,
    req: &CreateRun,
) -> Result<(RunSummary, bool), ApiError> {
    let config = run_config(app, tenant, req).await?;
    let run_id = Uuid::now_v7();
    // The goal is stored as the input redact rules leave it (so an
    // idempotent repeat is compared as redacted: goals that differ only in
    // what the rules remove are the same request).
    // A goal an input deny rule refuses is answered 422 and stored nowhere.
    let (goal, redactions) = screen_input(&config, "goal", &req.goal)?;
    let start = Event {
        run_id,
        seq: 1,
        at: Utc::now(),
        kind: EventKind::SessionStart {
            goal: goal.clone(),
            config: config.clone(),
            redactions,
        },
    };
    RunState::new(run_id)
        .apply(&start)
        .map_err(|e| ApiError::Invalid(e.to_string()))?;
    let new = NewRun {
        tenant: tenant.to_owned(),
        idempotency_key: key.clone(),
        batch_id: req.batch_id,
        start,
    };
    let (run, created) = app.log.create_run(new).await?;
    if !created {
        let first = app.log.events(run.run_id, 0, 1).await?;
        let same = match first.first().map(|e| &e.kind) {
            Some(EventKind::SessionStart {
                goal: first_goal,
                config: first,
                ..
            }) => *first_goal == goal && *first == config && run.batch_id == req.batch_id,
            _ => false,
        };
        if !same {
            return Err(ApiError::IdempotencyConflict(key.unwrap_or_default()));
        }
        return Ok((run, false));
    }
    app.metrics().runs_admitted.inc();
    app.wake_relay();
    Ok((run, true))
}

/// List runs visible to the caller, by id (creation order), with filters and a cursor.
#[utoipa::path(get, path = "/v1/runs", tag = "runs", params(ListRunsQuery),
    responses((status = 200, body = RunPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_runs(
    State(app): State<App>,
    p: Principal,
    ApiQuery(q): ApiQuery<ListRunsQuery>,
) -> Result<Json<RunPage>, ApiError> {
    let limit = page(q.limit, &app)?;
    let tenant = if p.is_admin() {
        q.tenant
    } else {
        Some(p.tenant.clone())
    };
    let filter = RunFilter {
        tenant,
        status: q.status,
        batch_id: q.batch_id,
        after: q.after,
        limit,
    };
    let runs = app.log.list_runs(&filter).await?;
    let next = (runs.len() == limit)
        .then(|| runs.last().map(|r| r.run_id))
        .flatten();
    Ok(Json(RunPage { runs, next }))
}

/// One run's summary.
#[utoipa::path(get, path = "/v1/runs/{id}", tag = "runs", params(("id" = Uuid, Path, description = "Run id")),
    responses((status = 200, body = RunSummaryDoc), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_run(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<RunSummary>, ApiError> {
    Ok(Json(visible_run(&app, &p, id).await?))
}

/// A page of a run's events with `seq > after`.
#[utoipa::path(get, path = "/v1/runs/{id}/events", tag = "runs", params(("id" = Uuid, Path, description = "Run id"), EventsQuery),
    responses((status = 200, body = EventPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_events(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
    ApiQuery(q): ApiQuery<EventsQuery>,
) -> Result<Json<EventPage>, ApiError> {
    let limit = page(q.limit, &app)?;
    let run = visible_run(&app, &p, id).await?;
    let after = q.after.unwrap_or(0);
    let events = app.log.events(id, after, limit).await?;
    let next_after = events.last().map_or(after, |e| e.seq);
    Ok(Json(EventPage {
        head_seq: run.head_seq.max(next_after),
        events,
        next_after,
    }))
}

// ----- approvals ---------------------------------------------------------------------

/// The approval queue, oldest first.
#[utoipa::path(get, path = "/v1/approvals", tag = "approvals", params(ApprovalsQuery),
    responses((status = 200, body = ApprovalPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_approvals(
    State(app): State<App>,
    p: Principal,
    ApiQuery(q): ApiQuery<ApprovalsQuery>,
) -> Result<Json<ApprovalPage>, ApiError> {
    p.require(Scope::Approve)?;
    let limit = page(q.limit, &app)?;
    let filter = ApprovalFilter {
        tenant: p.tenant_filter(),
        tool: q.tool,
        run_id: q.run_id,
        pending_only: q.status.unwrap_or_default() == ApprovalStatusFilter::Pending,
        expired_by: None,
        limit,
    };
    let rows = app.log.approvals(&filter).await?;
    Ok(Json(ApprovalPage {
        approvals: crate::history::views(&*app.log, rows).await?,
    }))
}

/// The approval history, read from the event log: every request with what
/// became of it (approved, edited, rejected, expired, abandoned, pending),
/// who decided and when, the wait, and escalation; newest first. With
/// `format=csv`: the same as `text/csv` (see `history::to_csv`).
#[utoipa::path(get, path = "/v1/approvals/history", tag = "approvals", params(crate::history::HistoryQuery),
    responses((status = 200, description = "The records: JSON, or CSV with `format=csv`", content((ApprovalHistory = "application/json"), (String = "text/csv"))), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn approval_history(
    State(app): State<App>,
    p: Principal,
    ApiQuery(q): ApiQuery<crate::history::HistoryQuery>,
) -> Result<Response, ApiError> {
    p.require(Scope::Approve)?;
    let records = crate::history::history(&*app.log, p.tenant_filter(), &q).await?;
    match q.format {
        None | Some(crate::history::HistoryFormat::Json) => {
            Ok(Json(ApprovalHistory { approvals: records }).into_response())
        }
        Some(crate::history::HistoryFormat::Csv) => Ok((
            [(header::CONTENT_TYPE, "text/csv; charset=utf-8")],
            crate::history::to_csv(&records),
        )
            .into_response()),
    }
}

/// The approval row of `call_id` in run `run_id`, if the log has one.
async fn approval_row(
    app: &App,
    run_id: Uuid,
    call_id: &str,
) -> Result<Option<ApprovalRow>, glia_backends::LogError> {
    let filter = ApprovalFilter {
        run_id: Some(run_id),
        limit: app.limits.max_page,
        ..Default::default()
    };
    Ok(app
        .log
        .approvals(&filter)
        .await?
        .into_iter()
        .find(|a| a.call_id == call_id))
}

pub(crate) async fn decide_one(
    app: &App,
    p: &Principal,
    run_id: Uuid,
    call_id: String,
    body: &DecisionBody,
) -> Result<Accepted, ApiError> {
    let decision = body.to_decision()?;
    let run = visible_run(app, p, run_id).await?;
    not_done(&run)?;
    let state = app.log.load(run_id).await?;
    let Some(call) = state.call(&call_id) else {
        let known = approval_row(app, run_id, &call_id).await?.is_some();
        return Err(if known {
            ApiError::AlreadyDecided { run_id, call_id }
        } else {
            ApiError::CallNotFound { run_id, call_id }
        });
    };
    match call.approval {
        ApprovalStatus::Requested => {}
        ApprovalStatus::Approved | ApprovalStatus::Rejected => {
            return Err(ApiError::AlreadyDecided { run_id, call_id });
        }
        ApprovalStatus::NotNeeded | ApprovalStatus::Due => {
            return Err(ApiError::ApprovalNotFound { run_id, call_id });
        }
    }
    if let Some(got) = &body.args_hash
        && *got != call.args_hash
    {
        return Err(ApiError::StaleArgs {
            expected: call.args_hash.clone(),
            got: got.clone(),
        });
    }
    // Edited arguments are checked like the model's: against the tool's schema.
    if let Decision::Edit { input } = &decision
        && let Some(spec) = state.step_tools.iter().find(|t| t.name == call.name)
        && let Ok(validator) = jsonschema::validator_for(&spec.input_schema)
    {
        let problems: Vec<String> = validator
            .iter_errors(input)
            .map(|e| format!("{} at '{}'", e, e.instance_path()))
            .collect();
        if !problems.is_empty() {
            let reason = format!(
                "does not match the input schema of {}: {}",
                call.name,
                problems.join("; ")
            );
            return Err(ApiError::InvalidField {
                field: "input".into(),
                reason,
            });
        }
    }
    let payload = Resume::Approval {
        call_id: call_id.clone(),
        args_hash: call.args_hash.clone(),
        decision: decision.clone(),
        by: Some(p.by()),
        request_seq: call.requested_seq,
    };
    let (id, kind) = post(app, run_id, payload).await.map_err(|e| match e {
        glia_backends::LogError::Duplicate { .. } => ApiError::AlreadyDecided {
            run_id,
            call_id: call_id.clone(),
        },
        e => e.into(),
    })?;
    if let Ok(Some(row)) = approval_row(app, run_id, &call_id).await {
        let label = match &decision {
            Decision::Approve => "approve",
            Decision::Reject { .. } => "reject",
            Decision::Edit { .. } => "edit",
            Decision::Expire => "expire",
        };
        app.metrics()
            .approval_waited(label, chrono::Utc::now() - row.requested_at);
    }
    Ok(Accepted {
        run_id,
        call_id: Some(call_id),
        inbox_ids: vec![id],
        kinds: vec![kind.into()],
        decision: Some(decision),
    })
}

/// How many runs' decisions a bulk request posts at once: each decision is
/// a few reads and a commit, so one after another a request of 100 took
/// about 100 commit latencies while the workers waited for them.
const BULK_RUNS_AT_ONCE: usize = 8;

/// Decide `items` (`(run, call, decision)`), each on its own as
/// [`decide_one`]: one run's decisions one after another in the given order
/// (they reach the run's inbox in that order), up to [`BULK_RUNS_AT_ONCE`]
/// runs at once. The answers are in the order of `items`.
pub(crate) async fn decide_many(
    app: &App,
    p: &Principal,
    items: &[(Uuid, String, DecisionBody)],
) -> Vec<Result<Accepted, ApiError>> {
    use futures::StreamExt;
    // Each run's items, runs in order of first appearance.
    let mut runs: Vec<(Uuid, Vec<usize>)> = Vec::new();
    for (i, (run_id, _, _)) in items.iter().enumerate() {
        match runs.iter_mut().find(|(r, _)| r == run_id) {
            Some((_, of_run)) => of_run.push(i),
            None => runs.push((*run_id, vec![i])),
        }
    }
    let answered: Vec<Vec<(usize, Result<Accepted, ApiError>)>> = futures::stream::iter(runs)
        .map(|(_, of_run)| async move {
            let mut answers = Vec::with_capacity(of_run.len());
            for i in of_run {
                let (run_id, call_id, body) = &items[i];
                answers.push((i, decide_one(app, p, *run_id, call_id.clone(), body).await));
            }
            answers
        })
        .buffer_unordered(BULK_RUNS_AT_ONCE)
        .collect()
        .await;
    let mut answers: Vec<Option<Result<Accepted, ApiError>>> =
        std::iter::repeat_with(|| None).take(items.len()).collect();
    for (i, answer) in answered.into_iter().flatten() {
        answers[i] = Some(answer);
    }
    answers
        .into_iter()
        .map(|a| a.expect("every item belongs to one run and is answered"))
        .collect()
}

/// Decide one approval: approve, reject (with a reason the model sees) or
/// edit (replacement arguments). The first decision wins; a second answers
/// 409 `already_decided`. The decision binds to the pending call's
/// `args_hash` (quote it as `args_hash` to refuse a stale view: 409 `stale_args`).
#[utoipa::path(post, path = "/v1/runs/{id}/approvals/{call_id}", tag = "approvals", request_body = crate::docs::DecisionBodyDoc,
    params(("id" = Uuid, Path, description = "Run id"), ("call_id" = String, Path, description = "Tool call id")),
    responses((status = 202, body = Accepted), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn decide(
    State(app): State<App>,
    p: Principal,
    ApiPath((id, call_id)): ApiPath<(Uuid, String)>,
    ApiJson(body): ApiJson<DecisionBody>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    p.require(Scope::Approve)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(decide_one(&app, &p, id, call_id, &body).await?),
    ))
}

/// Decide many approvals; each is validated and posted on its own, and its
/// result carries the status the single endpoint would have answered.
#[utoipa::path(post, path = "/v1/approvals", tag = "approvals", request_body = BulkDecisions,
    responses((status = 200, body = BulkResults), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn decide_bulk(
    State(app): State<App>,
    p: Principal,
    ApiJson(body): ApiJson<BulkDecisions>,
) -> Result<Json<BulkResults>, ApiError> {
    p.require(Scope::Approve)?;
    if body.decisions.len() > app.limits.max_bulk {
        return Err(ApiError::Invalid(format!(
            "at most {} decisions per request",
            app.limits.max_bulk
        )));
    }
    // The shape of every decision first: a malformed one refuses the whole request.
    let singles: Vec<DecisionBody> = body
        .decisions
        .iter()
        .map(|d| DecisionBody {
            decision: d.decision,
            reason: d.reason.clone(),
            input: d.input.clone(),
            args_hash: d.args_hash.clone(),
        })
        .collect();
    for (i, single) in singles.iter().enumerate() {
        single.to_decision().map_err(|e| ApiError::InvalidField {
            field: format!("decisions[{i}].input"),
            reason: e.to_string(),
        })?;
    }
    let items: Vec<(Uuid, String, DecisionBody)> = body
        .decisions
        .into_iter()
        .zip(singles)
        .map(|(d, single)| (d.run_id, d.call_id, single))
        .collect();
    let answers = decide_many(&app, &p, &items).await;
    let results = items
        .into_iter()
        .zip(answers)
        .map(|((run_id, call_id, _), answer)| match answer {
            Ok(accepted) => BulkItemResult {
                run_id,
                call_id,
                status: 202,
                accepted: Some(accepted),
                error: None,
            },
            Err(e) => BulkItemResult {
                run_id,
                call_id,
                status: e.status().as_u16(),
                accepted: None,
                error: Some(e.body().error),
            },
        })
        .collect();
    Ok(Json(BulkResults { results }))
}

// ----- payloads --------------------------------------------------------------------

/// Post the result of an external (client-executed) tool call.
#[utoipa::path(post, path = "/v1/runs/{id}/tool-results/{call_id}", tag = "payloads", request_body = ToolResultBody,
    params(("id" = Uuid, Path, description = "Run id"), ("call_id" = String, Path, description = "Tool call id")),
    responses((status = 202, body = Accepted), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn post_tool_result(
    State(app): State<App>,
    p: Principal,
    ApiPath((id, call_id)): ApiPath<(Uuid, String)>,
    ApiJson(body): ApiJson<ToolResultBody>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    p.require(Scope::Submit)?;
    let run = visible_run(&app, &p, id).await?;
    not_done(&run)?;
    let state = app.log.load(id).await?;
    let call = state.call(&call_id).ok_or_else(|| ApiError::CallNotFound {
        run_id: id,
        call_id: call_id.clone(),
    })?;
    if call.disposition != Some(Disposition::External) {
        return Err(ApiError::NotExternal(call_id));
    }
    if call.result.is_some() {
        return Err(ApiError::AlreadyAnswered(call_id));
    }
    let payload = Resume::ToolResult {
        call_id: call_id.clone(),
        content: body.content,
        is_error: body.is_error,
    };
    let (inbox_id, kind) = post(&app, id, payload).await.map_err(|e| match e {
        glia_backends::LogError::Duplicate { .. } => ApiError::AlreadyAnswered(call_id.clone()),
        e => e.into(),
    })?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Accepted {
            run_id: id,
            call_id: Some(call_id),
            inbox_ids: vec![inbox_id],
            kinds: vec![kind.into()],
            decision: None,
        }),
    ))
}

/// `text` (a user's message for run `id`, in the body's `field`) screened
/// by the run's input guardrails (`Guardrails`, from its `session.start`;
/// see [`screen_input`]): the inbox never stores what the redact rules
/// remove, and `input.received` lists the rules. Errors: 422
/// `screened_input` when a deny rule refuses it, 503 when the log fails.
async fn redacted_input(
    app: &App,
    id: Uuid,
    field: &str,
    text: String,
) -> Result<(String, Vec<glia_proto::Redaction>), ApiError> {
    let first = app.log.events(id, 0, 1).await?;
    let Some(EventKind::SessionStart { config, .. }) = first.first().map(|e| &e.kind) else {
        return Ok((text, Vec::new()));
    };
    screen_input(config, field, &text)
}

/// `text` (a goal or user message, in the body's `field`) as the input
/// guardrails of `config` admit it: with the redact rules applied and what
/// matched, after the deny rules and `max_input_chars` passed the redacted
/// text (as the worker checks it). Errors: 422 `screened_input` naming the
/// field, the rule and the length, never the text (so a refused goal is
/// stored nowhere: not in the log, a run list or this answer).
pub(crate) fn screen_input(
    config: &RunConfig,
    field: &str,
    text: &str,
) -> Result<(String, Vec<glia_proto::Redaction>), ApiError> {
    let g = &config.guardrails;
    if g.input.is_empty() && g.max_input_chars.is_none() {
        return Ok((text.to_owned(), Vec::new()));
    }
    let compiled = g.compile().map_err(|e| ApiError::InvalidField {
        field: format!("config.guardrails.{}", e.field),
        reason: e.reason,
    })?;
    screen_compiled(&compiled, field, text)
}

/// [`screen_input`] with the guardrails compiled already.
pub(crate) fn screen_compiled(
    compiled: &glia_proto::agent::CompiledGuardrails,
    field: &str,
    text: &str,
) -> Result<(String, Vec<glia_proto::Redaction>), ApiError> {
    let (text, redactions) = compiled.redact_input(text);
    match compiled.check_input(&text) {
        Ok(()) => Ok((text, redactions)),
        Err((guardrail, reason)) => Err(ApiError::ScreenedInput {
            field: field.to_owned(),
            guardrail,
            reason,
            chars: text.chars().count(),
        }),
    }
}

/// Post the user's next message to a run parked at `awaiting_input`.
#[utoipa::path(post, path = "/v1/runs/{id}/messages", tag = "payloads", request_body = MessageBody,
    params(("id" = Uuid, Path, description = "Run id")),
    responses((status = 202, body = Accepted), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn post_message(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
    ApiJson(body): ApiJson<MessageBody>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    p.require(Scope::Submit)?;
    let run = visible_run(&app, &p, id).await?;
    if body.text.trim().is_empty() {
        return Err(ApiError::Invalid("`text` is blank".into()));
    }
    not_done(&run)?;
    if run.pull_point != Some(PullPoint::AwaitingInput) {
        return Err(ApiError::NotAwaitingInput(id));
    }
    if app
        .log
        .inbox(id)
        .await?
        .iter()
        .any(|i| matches!(i.payload, Resume::Input { .. } | Resume::Close { .. }))
    {
        return Err(ApiError::AlreadyPosted {
            run_id: id,
            what: "a message or a close".into(),
        });
    }
    head_unmoved(&app, &p, id, body.head_seq).await?;
    let (text, redactions) = redacted_input(&app, id, "text", body.text).await?;
    let (inbox_id, kind) = post(&app, id, Resume::Input { text, redactions }).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Accepted {
            run_id: id,
            call_id: None,
            inbox_ids: vec![inbox_id],
            kinds: vec![kind.into()],
            decision: None,
        }),
    ))
}

/// With `expected` (a message's or close's `head_seq`), 409 `head_moved`
/// unless the run's head is still `expected`. Read after the inbox check:
/// a waiting input that a worker takes meanwhile moves the head in the same
/// commit, so a retried post either finds it waiting or finds the head moved.
async fn head_unmoved(
    app: &App,
    p: &Principal,
    id: Uuid,
    expected: Option<u64>,
) -> Result<(), ApiError> {
    let Some(expected) = expected else {
        return Ok(());
    };
    let actual = visible_run(app, p, id).await?.head_seq;
    if actual != expected {
        return Err(ApiError::HeadMoved {
            run_id: id,
            expected,
            actual,
        });
    }
    Ok(())
}

/// Resume a paused run, optionally extending its budget first.
///
/// With `extend` (amounts added to the current limits) the run gets an
/// `extend_budget` payload, which also resumes a run paused by its budget; a
/// run paused for another reason additionally gets a `resume`. Without it,
/// a `resume`. A run resumed while still over budget pauses again.
#[utoipa::path(post, path = "/v1/runs/{id}/resume", tag = "payloads", request_body(content = ResumeBody, description = "May be empty"),
    params(("id" = Uuid, Path, description = "Run id")),
    responses((status = 202, body = Accepted), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn resume(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
    OptJson(body): OptJson<ResumeBody>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    p.require_any(&[Scope::Submit, Scope::Approve])?;
    let run = visible_run(&app, &p, id).await?;
    not_done(&run)?;
    let inbox = app.log.inbox(id).await?;
    if inbox.iter().any(|i| {
        matches!(
            i.payload,
            Resume::ExtendBudget { .. } | Resume::Resume { .. }
        )
    }) {
        return Err(ApiError::AlreadyPosted {
            run_id: id,
            what: "a resume".into(),
        });
    }
    let operator = operator_pause(&app, id, &inbox).await?;
    let parked = match &run.pull_point {
        Some(PullPoint::Paused { reason }) => Some(reason.clone()),
        _ => None,
    };
    let mut payloads = Vec::new();
    // An operator pause requested and not in effect yet: a first resume
    // withdraws it (and clears the flag).
    let pending = operator.is_some() && !matches!(parked, Some(PauseReason::Operator { .. }));
    if operator.is_some() {
        unflag_pause(&app, id).await;
    }
    if pending {
        payloads.push(Resume::Resume { by: Some(p.by()) });
    }
    match parked {
        None if pending => {}
        None => return Err(ApiError::NotPaused(id)),
        Some(reason) => {
            let extend = body.extend.filter(|l| *l != BudgetLimits::default());
            if let Some(extra) = extend {
                payloads.push(Resume::ExtendBudget { extra });
            }
            if extend.is_none() || !matches!(reason, PauseReason::Budget { .. }) {
                payloads.push(Resume::Resume { by: Some(p.by()) });
            }
        }
    }
    let mut accepted = Accepted {
        run_id: id,
        call_id: None,
        inbox_ids: vec![],
        kinds: vec![],
        decision: None,
    };
    for payload in payloads {
        let (inbox_id, kind) = post(&app, id, payload).await?;
        accepted.inbox_ids.push(inbox_id);
        accepted.kinds.push(kind.into());
    }
    Ok((StatusCode::ACCEPTED, Json(accepted)))
}

/// Pause a run at its next step boundary (an operator pause).
///
/// Posts a `pause` payload and sets the run's pause flag in the ledger. A
/// worker busy with the run sees the flag at its next durability barrier
/// (after the model call or tool calls in flight finish; nothing is
/// aborted), records `session.pause_requested` and parks the run at
/// `paused` (reason `operator`). A run parked elsewhere (an approval, a
/// tool result, a message) records the request now and pauses as soon as
/// its payload lets it go on. `POST /v1/runs/{id}/resume` resumes it, or
/// withdraws a pause not yet in effect.
#[utoipa::path(post, path = "/v1/runs/{id}/pause", tag = "payloads", request_body(content = PauseBody, description = "May be empty"),
    params(("id" = Uuid, Path, description = "Run id")),
    responses((status = 202, body = Accepted), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn pause(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
    OptJson(body): OptJson<PauseBody>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    p.require(Scope::Submit)?;
    let run = visible_run(&app, &p, id).await?;
    not_done(&run)?;
    let reason = body
        .reason
        .as_deref()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map_or_else(|| format!("paused by {}", p.by()), str::to_owned);
    let inbox_id = pause_run(&app, id, &reason, &p.by())
        .await?
        .ok_or(ApiError::AlreadyPaused(id))?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Accepted {
            run_id: id,
            call_id: None,
            inbox_ids: vec![inbox_id],
            kinds: vec!["pause".into()],
            decision: None,
        }),
    ))
}

/// The reason of the operator pause run `id` is under or about to be under,
/// once the payloads waiting in `inbox` are applied: the last `pause` or
/// `resume` there decides (a resume withdraws or ends a pause); with
/// neither, the run's state: parked at `paused` by an operator, or a
/// `session.pause_requested` not yet in effect.
pub(crate) async fn operator_pause(
    app: &App,
    id: Uuid,
    inbox: &[glia_backends::InboxItem],
) -> Result<Option<String>, ApiError> {
    let last = inbox.iter().rev().find_map(|i| match &i.payload {
        Resume::Pause { reason, .. } => Some(Some(reason.clone())),
        Resume::Resume { .. } => Some(None),
        _ => None,
    });
    if let Some(decided) = last {
        return Ok(decided);
    }
    let state = app.log.load(id).await?;
    Ok(match state.parked {
        Some(PullPoint::Paused {
            reason: PauseReason::Operator { reason },
        }) => Some(reason),
        _ => state.pause_due,
    })
}

/// Post a pause to run `id` and set its pause flag: the durable part of
/// `POST /v1/runs/{id}/pause`, also used when a batch is paused or reaches
/// its spend cap. `None` when the run is already paused or pausing.
pub(crate) async fn pause_run(
    app: &App,
    id: Uuid,
    reason: &str,
    by: &str,
) -> Result<Option<i64>, ApiError> {
    let inbox = app.log.inbox(id).await?;
    if operator_pause(app, id, &inbox).await?.is_some() {
        return Ok(None);
    }
    let (inbox_id, _) = post(
        app,
        id,
        Resume::Pause {
            reason: reason.to_owned(),
            by: Some(by.to_owned()),
        },
    )
    .await?;
    // The durable part is done; the flag only makes a busy worker look sooner.
    if let Err(e) = app.ledger.set_paused(id, true).await {
        tracing::warn!(run_id = %id, "pause flag not set (the posted pause applies at the run's next job): {e}");
    }
    tracing::info!(run_id = %id, %by, %reason, "pause requested");
    Ok(Some(inbox_id))
}

/// Clear run `id`'s pause flag before a resume is posted. A flag left set
/// costs a busy worker one reload of the run (it finds no pause posted).
async fn unflag_pause(app: &App, id: Uuid) {
    if let Err(e) = app.ledger.set_paused(id, false).await {
        tracing::warn!(run_id = %id, "pause flag not cleared: {e}");
    }
}

/// Resume run `id` if an operator pause whose reason `parked_by` accepts
/// holds it or is about to (see [`operator_pause`]); true when a resume was
/// posted. What a batch's resume does for the runs it paused.
pub(crate) async fn resume_paused_by(
    app: &App,
    id: Uuid,
    by: &str,
    parked_by: impl Fn(&str) -> bool,
) -> Result<bool, ApiError> {
    let inbox = app.log.inbox(id).await?;
    // One resume: it withdraws a pause not yet in effect, or ends one in
    // effect (a run parked at another pause stays there).
    match operator_pause(app, id, &inbox).await? {
        Some(reason) if parked_by(&reason) => {
            unflag_pause(app, id).await;
            post(
                app,
                id,
                Resume::Resume {
                    by: Some(by.to_owned()),
                },
            )
            .await?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Cancel a run.
///
/// Posts a `cancel` payload (durable: the worker that next holds the run
/// records `session.cancel` and the run is done) and sets the run's cancel
/// flag in the ledger, so a worker busy with the run stops cooperatively: an
/// in-flight model stream is aborted; a tool call already running may
/// finish within its grace period (`cancel_grace_ms` of its tool, default
/// 5 s) and its result is recorded; one still running then is abandoned
/// with an `outcome_unknown` error. A second cancel while the first waits in
/// the inbox answers 202 with the same inbox id; any other payload posted
/// from now on answers 409 `run_cancelled`.
#[utoipa::path(post, path = "/v1/runs/{id}/cancel", tag = "payloads", request_body(content = CancelBody, description = "May be empty"),
    params(("id" = Uuid, Path, description = "Run id")),
    responses((status = 202, body = Accepted), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
    OptJson(body): OptJson<CancelBody>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    p.require(Scope::Submit)?;
    let run = visible_run(&app, &p, id).await?;
    not_done(&run)?;
    let reason = body
        .reason
        .as_deref()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map_or_else(|| format!("cancelled by {}", p.by()), str::to_owned);
    let inbox_id = cancel_run(&app, id, &reason, &p.by()).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Accepted {
            run_id: id,
            call_id: None,
            inbox_ids: vec![inbox_id],
            kinds: vec!["cancel".into()],
            decision: None,
        }),
    ))
}

/// Post a cancel to run `id` (or find the one already waiting) and set its
/// cancel flag: the durable part of `POST /v1/runs/{id}/cancel`, also used
/// when a batch is cancelled. Answers the cancel's inbox id.
pub(crate) async fn cancel_run(
    app: &App,
    id: Uuid,
    reason: &str,
    by: &str,
) -> Result<i64, ApiError> {
    let pending = app
        .log
        .inbox(id)
        .await?
        .into_iter()
        .find(|i| matches!(i.payload, Resume::Cancel { .. }));
    let inbox_id = match pending {
        Some(item) => item.id,
        None => match post(
            app,
            id,
            Resume::Cancel {
                reason: reason.to_owned(),
            },
        )
        .await
        {
            Ok((inbox_id, _)) => inbox_id,
            // A concurrent cancel got there first: answer with it.
            Err(glia_backends::LogError::Duplicate { .. }) => app
                .log
                .inbox(id)
                .await?
                .into_iter()
                .find(|i| matches!(i.payload, Resume::Cancel { .. }))
                .map(|i| i.id)
                .ok_or(ApiError::RunFinished(id))?,
            Err(e) => return Err(e.into()),
        },
    };
    // The durable part is done; the flag only makes a busy worker stop sooner.
    if let Err(e) = app.ledger.cancel(id).await {
        tracing::warn!(run_id = %id, "cancel flag not set (the posted cancel still applies): {e}");
    }
    app.metrics().cancels_requested.inc();
    tracing::info!(run_id = %id, %by, %reason, "cancel requested");
    Ok(inbox_id)
}

/// Close a conversational run waiting at `awaiting_input`, or a run paused by
/// its budget: it completes with its last answer. An optional body
/// `{"text": "…"}` (only at `awaiting_input`) records the user's last words
/// first; no model call follows them.
#[utoipa::path(post, path = "/v1/runs/{id}/close", tag = "payloads", request_body(content = CloseBody, description = "May be empty"),
    params(("id" = Uuid, Path, description = "Run id")),
    responses((status = 202, body = Accepted), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn close(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
    OptJson(body): OptJson<CloseBody>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    p.require(Scope::Submit)?;
    let run = visible_run(&app, &p, id).await?;
    not_done(&run)?;
    let closable = match &run.pull_point {
        Some(PullPoint::AwaitingInput) => true,
        Some(PullPoint::Paused {
            reason: PauseReason::Budget { .. },
        }) => body.text.is_none(),
        _ => false,
    };
    if !closable {
        return Err(ApiError::NotAwaitingInput(id));
    }
    if body.text.as_deref().is_some_and(|t| t.trim().is_empty()) {
        return Err(ApiError::Invalid(
            "text: the closing message is empty".into(),
        ));
    }
    if app
        .log
        .inbox(id)
        .await?
        .iter()
        .any(|i| matches!(i.payload, Resume::Input { .. } | Resume::Close { .. }))
    {
        return Err(ApiError::AlreadyPosted {
            run_id: id,
            what: "a message or a close".into(),
        });
    }
    head_unmoved(&app, &p, id, body.head_seq).await?;
    let (text, redactions) = match body.text {
        Some(text) => {
            let (text, redactions) = redacted_input(&app, id, "text", text).await?;
            (Some(text), redactions)
        }
        None => (None, Vec::new()),
    };
    let (inbox_id, kind) = post(&app, id, Resume::Close { text, redactions }).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Accepted {
            run_id: id,
            call_id: None,
            inbox_ids: vec![inbox_id],
            kinds: vec![kind.into()],
            decision: None,
        }),
    ))
}

// ----- ops ---------------------------------------------------------------------------

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, body = Health)))]
pub async fn healthz() -> Json<Health> {
    healthz_answer()
}

/// The answer of `/healthz`: `{"status": "ok"}`.
pub fn healthz_answer() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        checks: BTreeMap::new(),
    })
}

/// Readiness: the event log, the job queue and the ledger answer within
/// [`crate::Limits::ready_timeout`]. 503 `not_ready` names the failures.
#[utoipa::path(get, path = "/readyz", tag = "ops", responses((status = 200, body = Health), (status = 503, body = NotReady)))]
pub async fn readyz(State(app): State<App>) -> Response {
    readiness_answer(
        glia_backends::readiness(
            app.log.as_ref(),
            app.queue.as_ref(),
            app.ledger.as_ref(),
            app.limits.ready_timeout,
        )
        .await,
    )
}

/// The answer of a readiness probe from its checks (dependency → `ok` or
/// why not): 200 [`Health`] `ready` when every check is `ok`, else 503
/// [`NotReady`] (`not_ready`, the message naming each failing dependency).
/// Served by the dispatcher's `/readyz`, while it starts, and by a worker's
/// `--metrics-listen`.
pub fn readiness_answer(checks: BTreeMap<String, String>) -> Response {
    let failed: Vec<String> = checks
        .iter()
        .filter(|(_, v)| *v != "ok")
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    if failed.is_empty() {
        return Json(Health {
            status: "ready".into(),
            checks,
        })
        .into_response();
    }
    let error = ApiError::NotReady(failed.join("; ")).body().error;
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(NotReady { error, checks }),
    )
        .into_response()
}

/// Prometheus metrics, OpenMetrics text format.
#[utoipa::path(get, path = "/metrics", tag = "ops", responses((status = 200, content_type = "application/openmetrics-text", body = String)))]
pub async fn metrics(State(app): State<App>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics().encode(),
    )
        .into_response()
}

static OPENAPI: LazyLock<String> = LazyLock::new(|| crate::openapi().to_string());

/// This API's OpenAPI 3.1 document.
#[utoipa::path(get, path = "/openapi.json", tag = "ops", responses((status = 200, description = "OpenAPI 3.1 document", content_type = "application/json", body = serde_json::Value)))]
pub async fn openapi_json() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        OPENAPI.as_str(),
    )
        .into_response()
}
