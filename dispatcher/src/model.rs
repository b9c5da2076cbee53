//! The API's request and response shapes (the types layer): what the
//! handlers take and answer and what the OpenAPI document describes. Imports
//! nothing but the document's schema mirrors ([`crate::docs`]) and the error
//! body: no handler, no state.
//!
//! The batch shapes are in [`batches`].

pub mod batches;
pub mod evals;
pub mod schedules;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use glia_backends::{OutcomeKind, RunFilter, RunStatus, RunSummary};
use glia_proto::{BudgetLimits, Decision, Event, RunConfig};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::docs::{
    ApprovalRowDoc, BudgetLimitsDoc, DecisionDoc, EventDoc, RunConfigDoc, RunSummaryDoc,
};
use crate::error::{ApiError, ErrorDetail};

/// A request body the OpenAPI document describes: the name of its component
/// schema. [`crate::extract::ApiJson`] and [`crate::extract::OptJson`] check every body against it before
/// it is deserialised, so what the document refuses the server refuses
/// (serde alone would take, e.g., an array for a struct).
pub trait Documented {
    /// Name of the component in `#/components/schemas`.
    const SCHEMA: &'static str;
}

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
    /// Labels to find the run by (`GET /v1/runs?tag=…`): at most 20, each 1
    /// to 64 bytes of ASCII letters, digits and `_ - . : / @`; a repeated
    /// tag is kept once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 20, value_type = Vec<String>)]
    pub tags: Vec<String>,
    /// String pairs to find the run by (`GET /v1/runs?meta=key=value`): at
    /// most 20 keys, each 1 to 64 bytes of ASCII letters, digits and
    /// `_ - . : / @`; values at most 256 bytes of text without control
    /// characters.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schema(value_type = BTreeMap<String, String>)]
    pub metadata: BTreeMap<String, String>,
    /// Issue 32, a delayed start (`docs/waits.md`): an RFC 3339 time with an
    /// offset; the run is admitted now (its id, its idempotency) and parks
    /// at `awaiting_timer` with no calls until then, holding no worker. A
    /// time already past starts it at once; more than 366 days ahead is 422
    /// naming `start_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<DateTime<Utc>>,
    /// Answer the run's tool calls from a recording of earlier runs
    /// (`docs/evals.md`, "Replay evals"): the run is offered the
    /// recording's tools instead of any other, and a call is answered with
    /// the recorded output of the same tool and arguments (a call the
    /// recording lacks is an error result); nothing runs. At most 128
    /// tools, 10,000 calls and 1 MiB as JSON; 422 naming
    /// `recorded_tools.…` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::docs::RecordedToolsDoc>)]
    pub recorded_tools: Option<glia_proto::recorded::RecordedTools>,
}

/// A page of runs, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunPage {
    /// The runs.
    #[schema(value_type = Vec<RunSummaryDoc>)]
    pub runs: Vec<RunSummary>,
    /// Pass as `cursor` (with the same filters) for the next page, older
    /// runs; null on the last page. Opaque.
    pub next_cursor: Option<String>,
}

/// Query of `GET /v1/runs`: every filter given must match. Read from the
/// query string by [`ListRunsQuery::parse`] (`tag` and `meta` repeat); the
/// console's runs page takes the same parameters.
#[derive(Debug, Clone, Default, PartialEq, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListRunsQuery {
    /// `runnable`, `parked` or `done`.
    #[param(inline, value_type = Option<crate::docs::RunStatusDoc>)]
    pub status: Option<RunStatus>,
    /// How a finished run ended: `succeeded`, `failed` or `cancelled`.
    #[param(inline, value_type = Option<crate::docs::OutcomeKindDoc>)]
    pub outcome: Option<OutcomeKind>,
    /// Only runs of this registered agent (admitted with `agent`).
    pub agent: Option<String>,
    /// Only runs of this agent version (from 1).
    #[param(minimum = 1)]
    pub version: Option<u32>,
    /// Only runs of this batch.
    pub batch_id: Option<Uuid>,
    /// Only runs carrying this tag; repeat for several (all must match).
    #[param(required = false)]
    pub tag: Vec<String>,
    /// Only runs whose metadata has this `key=value` pair; repeat for
    /// several (all must match). Empty: no filter.
    #[param(required = false, pattern = "^$|=")]
    pub meta: Vec<String>,
    /// Only runs admitted at or after this time (RFC 3339).
    pub since: Option<DateTime<Utc>>,
    /// Only runs admitted before this time (RFC 3339).
    pub until: Option<DateTime<Utc>>,
    /// Only runs that have cost at least this many USD micros.
    pub min_cost_usd_micros: Option<u64>,
    /// Only runs that have cost at most this many USD micros.
    pub max_cost_usd_micros: Option<u64>,
    /// Only failed or cancelled runs whose error (or cancel reason) contains
    /// this text, compared case-insensitively.
    pub error: Option<String>,
    /// Only this tenant's runs (admins only; others always see their own).
    pub tenant: Option<String>,
    /// Issue 32: only the child runs of this run (`docs/child-runs.md`).
    pub parent: Option<Uuid>,
    /// The `next_cursor` of the previous page (22 base64url characters:
    /// 16 bytes); empty: the first page.
    #[param(pattern = "^$|^[A-Za-z0-9_-]{21}[AQgw]$")]
    pub cursor: Option<String>,
    /// Page size, 1 to 1,000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

impl ListRunsQuery {
    /// The query of a `GET /v1/runs` URL's query string (`None`: no query).
    /// Errors: 400 `invalid_query` naming the parameter (an unknown one, a
    /// value of the wrong shape, a `meta` without `=`, a cursor this API did
    /// not issue).
    pub fn parse(query: Option<&str>) -> Result<ListRunsQuery, ApiError> {
        fn value<T: std::str::FromStr>(name: &str, v: &str) -> Result<T, ApiError>
        where
            T::Err: std::fmt::Display,
        {
            v.parse().map_err(|e| ApiError::InvalidParam {
                name: name.to_owned(),
                reason: format!("{e}"),
            })
        }
        fn once<T>(slot: &mut Option<T>, name: &str, v: T) -> Result<(), ApiError> {
            if slot.replace(v).is_some() {
                return Err(ApiError::InvalidParam {
                    name: name.to_owned(),
                    reason: "is given twice".into(),
                });
            }
            Ok(())
        }
        fn time(name: &str, v: &str) -> Result<DateTime<Utc>, ApiError> {
            DateTime::parse_from_rfc3339(v)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|e| ApiError::InvalidParam {
                    name: name.to_owned(),
                    reason: format!("not an RFC 3339 time ({e})"),
                })
        }
        let mut q = ListRunsQuery::default();
        for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            let v = v.as_ref();
            match k.as_ref() {
                "status" => once(&mut q.status, "status", value("status", v)?)?,
                "outcome" => once(&mut q.outcome, "outcome", value("outcome", v)?)?,
                "agent" => once(&mut q.agent, "agent", v.to_owned())?,
                "version" => {
                    let version: u32 = value("version", v)?;
                    if version == 0 {
                        return Err(ApiError::InvalidParam {
                            name: "version".into(),
                            reason: "versions start at 1".into(),
                        });
                    }
                    once(&mut q.version, "version", version)?
                }
                "batch_id" => once(&mut q.batch_id, "batch_id", value("batch_id", v)?)?,
                "tag" => q.tag.push(v.to_owned()),
                "meta" => q.meta.push(v.to_owned()),
                "since" => once(&mut q.since, "since", time("since", v)?)?,
                "until" => once(&mut q.until, "until", time("until", v)?)?,
                "min_cost_usd_micros" => once(
                    &mut q.min_cost_usd_micros,
                    "min_cost_usd_micros",
                    value("min_cost_usd_micros", v)?,
                )?,
                "max_cost_usd_micros" => once(
                    &mut q.max_cost_usd_micros,
                    "max_cost_usd_micros",
                    value("max_cost_usd_micros", v)?,
                )?,
                "error" => once(&mut q.error, "error", v.to_owned())?,
                "tenant" => once(&mut q.tenant, "tenant", v.to_owned())?,
                "parent" => once(&mut q.parent, "parent", value("parent", v)?)?,
                "cursor" => once(&mut q.cursor, "cursor", v.to_owned())?,
                "limit" => once(&mut q.limit, "limit", value("limit", v)?)?,
                other => {
                    return Err(ApiError::InvalidParam {
                        name: other.to_owned(),
                        reason: "is not a parameter of this listing".into(),
                    });
                }
            }
        }
        Ok(q)
    }

    /// The filter of this query for a caller who sees `tenant`'s runs
    /// (`None`: every tenant's, an admin without `tenant`), pages of
    /// `limit`. Empty `agent`, `error`, `tag`, `meta` and `cursor` values
    /// filter nothing (an empty form field). Errors: 400 `invalid_query` naming `meta` (no `=`) or
    /// `cursor` (not one this API issued).
    pub fn filter(&self, tenant: Option<String>, limit: usize) -> Result<RunFilter, ApiError> {
        let mut metadata = BTreeMap::new();
        for pair in self.meta.iter().filter(|p| !p.is_empty()) {
            let Some((k, v)) = pair.split_once('=') else {
                return Err(ApiError::InvalidParam {
                    name: "meta".into(),
                    reason: format!("{pair:?} is not key=value"),
                });
            };
            metadata.insert(k.to_owned(), v.to_owned());
        }
        let before = (self.cursor.as_deref())
            .filter(|c| !c.is_empty())
            .map(run_cursor::decode)
            .transpose()?;
        let nonempty = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
        Ok(RunFilter {
            tenant,
            status: self.status,
            outcome: self.outcome,
            agent: nonempty(&self.agent),
            agent_version: self.version,
            batch_id: self.batch_id,
            tags: self.tag.iter().filter(|t| !t.is_empty()).cloned().collect(),
            metadata,
            created_after: self.since,
            created_before: self.until,
            min_cost_usd_micros: self.min_cost_usd_micros,
            max_cost_usd_micros: self.max_cost_usd_micros,
            q: nonempty(&self.error),
            parent: self.parent,
            pull_point: None,
            before,
            limit,
        })
    }
}

/// The opaque cursor of `GET /v1/runs`: the last run id of a page, its 16
/// bytes in unpadded base64url (22 characters).
pub mod run_cursor {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use uuid::Uuid;

    use crate::error::ApiError;

    /// The cursor after run `last`.
    pub fn encode(last: Uuid) -> String {
        URL_SAFE_NO_PAD.encode(last.as_bytes())
    }

    /// The run id of a cursor. Errors: 400 `invalid_query` naming `cursor`.
    pub fn decode(cursor: &str) -> Result<Uuid, ApiError> {
        URL_SAFE_NO_PAD
            .decode(cursor)
            .ok()
            .and_then(|bytes| Uuid::from_slice(&bytes).ok())
            .ok_or_else(|| ApiError::InvalidParam {
                name: "cursor".into(),
                reason: "is not a cursor of this listing (pass a page's next_cursor as given)"
                    .into(),
            })
    }
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
    pub(crate) fn to_decision(&self) -> Result<Decision, ApiError> {
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

// --- issue 32: waits ---
/// Body of `POST /v1/events`: `{"key": "order/42:signed", "payload": {…},
/// "id": "…"}` (`docs/waits.md`).
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventBody {
    /// The event key the waits name: letters, digits and `. _ : / @ -`,
    /// 1 to 200 characters.
    #[schema(
        pattern = "^[A-Za-z0-9._:/@-]{1,200}$",
        min_length = 1,
        max_length = 200
    )]
    pub key: String,
    /// Any JSON, at most 64 KiB serialised: the waiting calls' result.
    #[schema(value_type = Object)]
    pub payload: Value,
    /// Idempotency: the same id posted again by the same tenant is the same
    /// event (delivered once per run); without it glia makes one up.
    #[serde(default)]
    pub id: Option<Uuid>,
}

/// Answer of `POST /v1/events` (202).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
pub struct EventAccepted {
    /// The event's id (the one posted, or the one glia made up).
    pub id: Uuid,
    /// How many waiting runs it was posted to now; waits that begin within
    /// the retention get it later.
    pub delivered: usize,
    /// True when an event with this id was posted before: the first one is
    /// kept, this body is not stored again.
    pub duplicate: bool,
}
// --- end waits ---

/// The component schema each request body is checked against (see [`Documented`]).
macro_rules! documented {
    ($($ty:ty => $name:literal),* $(,)?) => {
        $(impl Documented for $ty {
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
    EventBody => "EventBody",
}
