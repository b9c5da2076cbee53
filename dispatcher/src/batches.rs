//! Batches: many goals run with one configuration, submitted at once,
//! admitted progressively, watched, capped, cancelled and collected.
//!
//! | endpoint | scope | success | errors besides auth and bad input |
//! |---|---|---|---|
//! | `POST /v1/batches` | submit | 201 batch (200 on an idempotent repeat) | 409 `idempotency_conflict`, 422 `invalid_request` (`line` for JSONL) |
//! | `GET /v1/batches` | any | 200 page | – |
//! | `GET /v1/batches/{id}` | any | 200 batch with counts and spend | 404 `batch_not_found` |
//! | `GET /v1/batches/{id}/results` | any | 200 JSON Lines, one [`ItemResult`] per item | 404 |
//! | `GET /v1/batches/{id}/stream` | any | 200 SSE `progress` frames | 404 |
//! | `POST /v1/batches/{id}/cancel` | submit | 200 batch | 404 |
//! | `POST /v1/batches/{id}/pause`, `/resume` | submit | 200 batch | 404, 409 `batch_ended` |
//!
//! Every endpoint answers 404 `not_available` on a dispatcher without a
//! batch store (the SQLite single node, `glia serve`, for now; `glia dev`
//! has the in-memory twin).
//!
//! **Submission.** As JSON ([`CreateBatch`], at most
//! [`crate::Limits::max_body_bytes`]) or as JSON Lines (`Content-Type:
//! application/jsonl` or `application/x-ndjson`): line 1 is the
//! [`BatchSpec`], every further non-blank line one [`BatchItem`]. The upload
//! is read as it arrives and stored in chunks of [`CHUNK`] items inside one
//! transaction: the dispatcher never holds the file, and a malformed line
//! (reported with its `line` number), a bad item or a repeated `custom_id`
//! refuses the whole batch with nothing stored. An item's goal may use its
//! `inputs` as minijinja variables (`Summarise ticket {{ id }}`); an unknown
//! variable is an error of that item. An item's `config` is a JSON merge
//! patch (RFC 7396) over the batch's config for its run alone, checked at
//! submit as `POST /v1/runs` checks a config and applied at admission.
//!
//! **Admission** ([`admit`]): a background loop of every dispatcher. Each
//! pass folds finished runs' spend into their items, expires items past the
//! completion window and cancels the runs still going in a batch past it
//! (those items end `expired`, [`EXPIRED_REASON`]), then grants free slots: the fleet-wide cap on batch
//! runs in flight ([`Admission::max_in_flight`]) is shared among tenants by
//! weighted fair share (each slot goes to the tenant with the fewest runs in
//! flight per unit of weight that still has admissible work and is under
//! [`Admission::per_tenant`]; within a tenant, to its batch with the fewest
//! runs in flight under the batch's own `max_in_flight`). Items are claimed
//! in submission order and become runs through the same function as `POST
//! /v1/runs`, with the idempotency key `glia-batch:{batch}:{custom_id}`: a
//! dispatcher killed between creating a run and marking its item finds the
//! run again when the claim lapses, so no item runs twice and none is lost.
//! A batch whose spend reached its cap admits nothing more until the cap is
//! raised (`POST /v1/batches/{id}/resume` with `spend_cap`): the pass that
//! sees the cap reached pauses the batch.
//!
//! **Pause.** A paused batch admits nothing, and its runs get an operator
//! pause (as `POST /v1/runs/{id}/pause`) with the reason `batch {id} paused
//! by NAME` or, at the spend cap, `batch {id} reached its spend cap`: each
//! parks at `paused` at its next step boundary, so spend stops growing
//! within one model call per running run. Resuming the batch resumes only
//! the runs whose pause carries one of its reasons (a run an operator paused
//! on its own stays paused). See `docs/batches.md`.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use glia_backends::batches::{
    Batch, BatchState, BatchStore, Claim, ItemView, Lane, NewBatch, NewItem, SubmitError, Upload,
};
use glia_backends::{Spend, SpendCap};
use glia_proto::RunConfig;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::App;
use crate::api::{
    CreateRun, admit_run, cancel_run, catalogue_check, idempotency_key, pause_run,
    resume_paused_by, run_config, validate_run,
};
use crate::auth::{Principal, Scope};
use crate::docs::RunConfigDoc;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{
    ApiJson, ApiPath, ApiQuery, Documented, OptJson, conforms, integral_numbers, is_json,
};

/// The cancel reason of a run its batch's completion window ended.
pub const EXPIRED_REASON: &str = "the batch's completion window ended";

/// Items stored per statement while a submission streams in.
pub const CHUNK: usize = 500;

/// Fleet-wide admission settings. [`Admission::default`] is production's.
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    /// Most batch runs not done at once across every tenant (default 256).
    /// Keep it below the fleet's worker slots so single runs always find one.
    pub max_in_flight: u32,
    /// Most batch runs not done at once per tenant (default 128).
    pub per_tenant: u32,
    /// Fair-share weight per tenant (default 1 for every tenant).
    pub weights: BTreeMap<String, u32>,
    /// Pause between admission passes when nothing woke the loop (default 200 ms).
    pub poll: Duration,
    /// Age after which an item claimed by a pass that did not finish is claimed again (default 30 s).
    pub claim_lease: Duration,
    /// Most items one pass admits (default 512).
    pub per_pass: usize,
    /// Most items in one batch (default 1,000,000).
    pub max_items: u64,
    /// Largest JSON Lines upload in bytes (default 1 GiB).
    pub max_upload_bytes: u64,
    /// Largest line of an upload in bytes (default 1 MiB).
    pub max_line_bytes: usize,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            max_in_flight: 256,
            per_tenant: 128,
            weights: BTreeMap::new(),
            poll: Duration::from_millis(200),
            claim_lease: Duration::from_secs(30),
            per_pass: 512,
            max_items: 1_000_000,
            max_upload_bytes: 1 << 30,
            max_line_bytes: 1 << 20,
        }
    }
}

/// The batch store and admission settings of an [`App`].
#[derive(Clone, Default)]
pub struct BatchConfig {
    /// The store; `None` answers 404 `not_available`.
    pub store: Option<Arc<dyn BatchStore>>,
    /// Admission settings.
    pub admission: Admission,
}

// ----- shapes ----------------------------------------------------------------------

/// A spend cap: tokens (every kind) and/or USD micros (1 USD = 1,000,000).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SpendCapBody {
    /// Most tokens.
    #[schema(minimum = 0, maximum = 9_223_372_036_854_775_807_i64)]
    pub tokens: Option<u64>,
    /// Most USD micros.
    #[schema(minimum = 0, maximum = 9_223_372_036_854_775_807_i64)]
    pub usd_micros: Option<u64>,
}

impl From<SpendCapBody> for SpendCap {
    fn from(c: SpendCapBody) -> SpendCap {
        SpendCap {
            tokens: c.tokens,
            cost_usd_micros: c.usd_micros,
        }
    }
}

impl From<SpendCap> for SpendCapBody {
    fn from(c: SpendCap) -> SpendCapBody {
        SpendCapBody {
            tokens: c.tokens,
            usd_micros: c.cost_usd_micros,
        }
    }
}

/// A batch's options.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchOptions {
    /// Most runs of this batch not done at once (default: only the tenant's and the fleet's caps).
    #[schema(minimum = 1, maximum = 100000)]
    pub max_in_flight: Option<u32>,
    /// Spend cap of the whole batch. Reached, no further item is started;
    /// raise it with `POST /v1/batches/{id}/resume`.
    pub spend_cap: Option<SpendCapBody>,
    /// Seconds after submission after which items not yet started expire.
    #[schema(minimum = 1, maximum = 31622400)]
    pub completion_window_secs: Option<u64>,
}

/// What a batch runs and how: line 1 of a JSON Lines submission, and
/// [`CreateBatch`] without its items.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchSpec {
    /// Configuration of every item's run (as in `POST /v1/runs`).
    #[serde(default)]
    #[schema(value_type = Option<RunConfigDoc>)]
    pub config: Option<RunConfig>,
    /// A registered agent of the tenant's, `name` or `name@version`, instead
    /// of `config`; `name` is pinned to its latest version at submit (the
    /// batch's `agent` then reads `name@N`).
    pub agent: Option<String>,
    /// Options.
    #[serde(default)]
    pub options: BatchOptions,
}

/// One item: a goal and what to echo back with its result.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchItem {
    /// The caller's id for the item, unique within the batch; 1 to 255 characters.
    #[schema(min_length = 1, max_length = 255)]
    pub custom_id: String,
    /// The run's goal; may use `inputs` as minijinja variables.
    #[schema(
        pattern = "[^\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
    )] // crate::docs::NOT_BLANK
    pub goal: String,
    /// Variables for the goal's template.
    #[schema(value_type = Option<Object>)]
    pub inputs: Option<Map<String, Value>>,
    /// Echoed in the item's result.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
    /// This item's own configuration: a JSON merge patch (RFC 7396) applied
    /// to the batch's `config` for its run (`{"model": "…", "system": "…"}`
    /// changes those two; `null` removes a key, back to its default). The
    /// result is checked at submit as `POST /v1/runs` checks a config; not
    /// allowed in a batch that names an `agent`.
    #[schema(value_type = Option<Object>)]
    pub config: Option<Map<String, Value>>,
}

/// Body of `POST /v1/batches` as JSON.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBatch {
    /// As in [`BatchSpec`].
    #[serde(default)]
    #[schema(value_type = Option<RunConfigDoc>)]
    pub config: Option<RunConfig>,
    /// As in [`BatchSpec`].
    pub agent: Option<String>,
    /// As in [`BatchSpec`].
    #[serde(default)]
    pub options: BatchOptions,
    /// The items, at least one.
    #[schema(min_items = 1)]
    pub items: Vec<BatchItem>,
}

/// Items by what became of them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, ToSchema)]
pub struct BatchCounts {
    /// Not started yet.
    pub queued: u64,
    /// Running (runnable).
    pub running: u64,
    /// Parked, by pull point (`awaiting_approval`, `awaiting_input`, `awaiting_tool`, `paused`).
    pub parked: BTreeMap<String, u64>,
    /// Finished with an answer.
    pub succeeded: u64,
    /// Finished with an error (or refused at admission).
    pub failed: u64,
    /// Cancelled (runs, and items never started).
    pub cancelled: u64,
    /// Not started before the completion window closed.
    pub expired: u64,
}

impl BatchCounts {
    /// Fold counts by [`ItemView::status`] (`parked:{pull point}` → [`BatchCounts::parked`]).
    pub fn of(by_status: &BTreeMap<String, u64>) -> BatchCounts {
        let mut c = BatchCounts::default();
        for (status, &n) in by_status {
            match status.as_str() {
                "queued" => c.queued += n,
                "running" => c.running += n,
                "succeeded" => c.succeeded += n,
                "cancelled" => c.cancelled += n,
                "expired" => c.expired += n,
                s if s.starts_with("parked:") => {
                    *c.parked.entry(s["parked:".len()..].to_owned()).or_insert(0) += n
                }
                _ => c.failed += n,
            }
        }
        c
    }

    /// Items not finished one way or another.
    pub fn open(&self) -> u64 {
        self.queued + self.running + self.parked.values().sum::<u64>()
    }
}

/// A batch's status: the one function every view of a batch uses (`GET
/// /v1/batches`, `GET /v1/batches/{id}`, its stream, `glia batch status`
/// and the progress bars read it from those), so no two views disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BatchStatus {
    /// Items are started as capacity allows, or runs are still going.
    Active,
    /// Paused (by a person or at its spend cap) with items not finished.
    Paused,
    /// Every item finished (succeeded, failed or cancelled one by one), none expired.
    Completed,
    /// Every item finished, and the completion window ended some: items not
    /// started, and runs still going, which were cancelled (`expired` in the results).
    Expired,
    /// Cancelled: nothing more starts, runs not done were cancelled. Final.
    Cancelled,
}

impl BatchStatus {
    /// The status of a batch in `state` whose items are `counts`: a cancel
    /// wins; then a batch with nothing open has ended (`expired` when any
    /// item expired, else `completed`); otherwise its state.
    pub fn of(state: BatchState, counts: &BatchCounts) -> BatchStatus {
        match state {
            BatchState::Cancelled => BatchStatus::Cancelled,
            _ if counts.open() == 0 && counts.expired > 0 => BatchStatus::Expired,
            _ if counts.open() == 0 => BatchStatus::Completed,
            BatchState::Paused => BatchStatus::Paused,
            BatchState::Active => BatchStatus::Active,
        }
    }

    /// `active`, `paused`, `completed`, `expired` or `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            BatchStatus::Active => "active",
            BatchStatus::Paused => "paused",
            BatchStatus::Completed => "completed",
            BatchStatus::Expired => "expired",
            BatchStatus::Cancelled => "cancelled",
        }
    }

    /// Completed, expired or cancelled: nothing will change any more, and
    /// pause and resume answer 409 `batch_ended`.
    pub fn ended(self) -> bool {
        matches!(
            self,
            BatchStatus::Completed | BatchStatus::Expired | BatchStatus::Cancelled
        )
    }
}

/// What was spent: tokens (every kind) and USD micros.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
pub struct SpendView {
    /// Tokens.
    pub tokens: u64,
    /// USD micros.
    pub usd_micros: u64,
}

impl From<Spend> for SpendView {
    fn from(s: Spend) -> SpendView {
        SpendView {
            tokens: s.tokens,
            usd_micros: s.cost_usd_micros,
        }
    }
}

/// A batch as the API shows it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
pub struct BatchView {
    /// Its id.
    pub id: Uuid,
    /// Owning tenant.
    pub tenant: String,
    /// What became of the batch ([`BatchStatus::of`]).
    pub status: BatchStatus,
    /// True when its spend reached its cap (no item is started until the cap is raised).
    pub cap_reached: bool,
    /// Number of items.
    pub total: u64,
    /// Items by what became of them.
    pub counts: BatchCounts,
    /// Spend so far.
    pub spend: SpendView,
    /// Agent reference (`name@version`, pinned at submit), when submitted with one.
    pub agent: Option<String>,
    /// Options (the spend cap as it is now).
    pub options: BatchOptions,
    /// Submission time.
    pub created_at: DateTime<Utc>,
    /// Last change of state or options.
    pub updated_at: DateTime<Utc>,
    /// When items not yet started expire.
    pub expires_at: Option<DateTime<Utc>>,
}

/// A page of batches, by id (creation order).
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct BatchPage {
    /// The batches, each as `GET /v1/batches/{id}` shows it.
    pub batches: Vec<BatchView>,
    /// Pass as `after` for the next page; absent on the last page.
    pub next: Option<Uuid>,
}

/// Query of `GET /v1/batches`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListBatchesQuery {
    /// Cursor: the `next` of the previous page.
    pub after: Option<Uuid>,
    /// Page size, 1 to 1,000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

/// Body of `POST /v1/batches/{id}/resume` (may be empty): `{"spend_cap": {…}}` replaces the cap.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeBatchBody {
    /// The new spend cap (replaces the old one; a field left out is uncapped).
    pub spend_cap: Option<SpendCapBody>,
}

/// One line of `GET /v1/batches/{id}/results`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
pub struct ItemResult {
    /// The caller's id.
    pub custom_id: String,
    /// Its run, once started.
    pub run_id: Option<Uuid>,
    /// `queued`, `running`, `parked:{pull point}`, `succeeded`, `failed`, `cancelled` or `expired`.
    pub status: String,
    /// The final answer (succeeded).
    pub answer: Option<String>,
    /// Validated structured output (succeeded, with an output schema).
    #[schema(value_type = Option<Object>)]
    pub output: Option<Value>,
    /// Why it failed, was cancelled or expired.
    pub error: Option<String>,
    /// What ended an item that did not succeed: `expired` (the completion
    /// window ended before it started, or ended its run: the run was
    /// cancelled), `refused` (admission refused it; no run), `failed` (its
    /// run failed) or `cancelled` (its run or the batch was cancelled).
    /// Absent while it goes on and when it succeeded.
    pub error_code: Option<String>,
    /// Spend of a finished item.
    pub usage: Option<SpendView>,
    /// The item's metadata, as submitted.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
}

impl ItemResult {
    fn of(item: ItemView) -> ItemResult {
        use glia_proto::Outcome;
        let (answer, output, error) = match item.outcome {
            Some(Outcome::Succeeded { answer, output }) => (Some(answer), output, None),
            Some(Outcome::Failed { error }) => (None, None, Some(error)),
            Some(Outcome::Cancelled { reason }) => (None, None, Some(reason)),
            None if item.status == "expired" => (
                None,
                None,
                Some("the batch's completion window ended before the item started".into()),
            ),
            None => (
                None,
                None,
                item.error
                    .filter(|e| e != glia_backends::batches::WINDOW_ENDED),
            ),
        };
        let error_code = match item.status.as_str() {
            "expired" => Some("expired"),
            "failed" if item.run_id.is_none() => Some("refused"),
            "failed" => Some("failed"),
            "cancelled" => Some("cancelled"),
            _ => None,
        };
        ItemResult {
            custom_id: item.custom_id,
            run_id: item.run_id,
            status: item.status,
            answer,
            output,
            error,
            error_code: error_code.map(str::to_owned),
            usage: item.spend.map(SpendView::from),
            metadata: item.metadata.and_then(|m| serde_json::from_str(&m).ok()),
        }
    }
}

impl Documented for CreateBatch {
    const SCHEMA: &'static str = "CreateBatch";
}
impl Documented for ResumeBatchBody {
    const SCHEMA: &'static str = "ResumeBatchBody";
}

// ----- helpers -----------------------------------------------------------------------

fn store(app: &App) -> Result<&Arc<dyn BatchStore>, ApiError> {
    app.batches.store.as_ref().ok_or_else(|| {
        ApiError::NotAvailable(
            "batches are not available on this dispatcher (it was built without a batch store)"
                .into(),
        )
    })
}

fn tenant_of(p: &Principal) -> Option<&str> {
    (!p.is_admin()).then_some(p.tenant.as_str())
}

/// The spec's checks, as `POST /v1/runs` makes them (a config that
/// validates, or an agent of the tenant's that exists), and the agent's
/// version pinned: `name` becomes `name@N` with N the latest version at
/// submit, so every item runs the same definition whatever is registered
/// later. Errors: 422 naming `config` or `agent`, 404 `agent_not_found`.
async fn check_spec(app: &App, tenant: &str, spec: &mut BatchSpec) -> Result<RunConfig, ApiError> {
    let probe = CreateRun {
        goal: "batch".into(),
        config: spec.config.clone().unwrap_or_default(),
        batch_id: None,
        agent: spec.agent.clone(),
    };
    let config = run_config(app, tenant, &probe).await?;
    if let Some(agent) = &config.agent {
        spec.agent = Some(format!("{}@{}", agent.name, agent.version));
    }
    Ok(config)
}

/// How the items of one submission are checked.
struct ItemRules {
    /// Renders goals with their inputs (an unknown variable is an error).
    env: minijinja::Environment<'static>,
    /// The batch's config as JSON, the base of each item's patch; `None` in
    /// a batch that names an agent (its items take no config).
    base: Option<Value>,
    /// For the catalogue check of each patched config.
    app: App,
    /// The input guardrails of the batch's config (an agent's resolved),
    /// compiled once: they screen each item's goal that has no config of
    /// its own.
    screen: glia_proto::agent::CompiledGuardrails,
}

impl ItemRules {
    fn new(app: &App, spec: &BatchSpec, config: &RunConfig) -> Result<ItemRules, ApiError> {
        let mut env = minijinja::Environment::new();
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        let base = spec.agent.is_none().then(|| base_config(spec));
        let screen = config
            .guardrails
            .compile()
            .map_err(|e| ApiError::InvalidField {
                field: format!("config.guardrails.{}", e.field),
                reason: e.reason,
            })?;
        Ok(ItemRules {
            env,
            base,
            app: app.clone(),
            screen,
        })
    }
}

/// The batch's config as JSON: what an item's patch applies to.
fn base_config(spec: &BatchSpec) -> Value {
    serde_json::to_value(spec.config.clone().unwrap_or_default()).expect("a config serialises")
}

/// `base` with an item's `patch` applied (RFC 7396). Errors: the place in
/// the patched config that does not deserialize (`config.budget.max_turns:
/// invalid type…`, `config: unknown field…`).
fn patched_config(
    base: &Value,
    patch: &Map<String, Value>,
) -> Result<RunConfig, (Option<String>, String)> {
    let mut merged = base.clone();
    json_patch::merge(&mut merged, &Value::Object(patch.clone()));
    serde_path_to_error::deserialize::<_, RunConfig>(merged).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." {
            "config".to_owned()
        } else {
            format!("config.{path}")
        };
        (Some(field), e.into_inner().to_string())
    })
}

/// An item's goal checked by the input guardrails of its config: a goal a
/// deny rule refuses fails the submission naming the item's `goal`, the
/// rule and the length, and is stored nowhere.
fn screened_goal(
    screen: &glia_proto::agent::CompiledGuardrails,
    goal: &str,
) -> Result<(), (Option<String>, String)> {
    match crate::api::screen_compiled(screen, "goal", goal) {
        Ok(_) => Ok(()),
        Err(ApiError::ScreenedInput {
            field,
            guardrail,
            reason,
            chars,
        }) => Err((
            Some(field),
            format!(
                "refused by the input guardrail {guardrail} ({reason}); {chars} characters, not stored"
            ),
        )),
        Err(other) => Err((Some("config".into()), other.to_string())),
    }
}

/// One item as stored: the goal rendered with its inputs, metadata and the
/// config patch as JSON text (the patched config checked as `POST /v1/runs`
/// checks one).
fn prepare(
    item: BatchItem,
    line: u64,
    rules: &ItemRules,
) -> Result<NewItem, (Option<String>, String)> {
    if item.custom_id.is_empty() || item.custom_id.chars().count() > 255 {
        return Err((
            Some("custom_id".into()),
            "must be 1 to 255 characters".into(),
        ));
    }
    let goal = match &item.inputs {
        None => item.goal,
        Some(inputs) => rules
            .env
            .render_str(&item.goal, inputs)
            .map_err(|e| (Some("goal".into()), format!("rendering with inputs: {e}")))?,
    };
    if goal.trim().is_empty() {
        return Err((Some("goal".into()), "is blank".into()));
    }
    if goal.contains('\0') || item.custom_id.contains('\0') {
        return Err((Some("goal".into()), "contains U+0000".into()));
    }
    let config = match (&item.config, &rules.base) {
        (None, _) => None,
        (Some(_), None) => {
            return Err((
                Some("config".into()),
                "cannot be combined with the batch's `agent` (the definition is the config)".into(),
            ));
        }
        (Some(patch), Some(base)) => {
            let config = patched_config(base, patch)?;
            let probe = CreateRun {
                goal: goal.clone(),
                config,
                batch_id: None,
                agent: None,
            };
            let checked =
                validate_run(&probe).and_then(|()| catalogue_check(&rules.app, &probe.config));
            checked.map_err(|e| match e {
                ApiError::InvalidField { field, reason } => (Some(field), reason),
                other => (Some("config".into()), other.to_string()),
            })?;
            let screen = probe
                .config
                .guardrails
                .compile()
                .map_err(|e| (Some(format!("config.guardrails.{}", e.field)), e.reason))?;
            screened_goal(&screen, &goal)?;
            Some(serde_json::to_string(patch).expect("JSON serialises"))
        }
    };
    if config.is_none() {
        screened_goal(&rules.screen, &goal)?;
    }
    let metadata = item
        .metadata
        .map(|m| serde_json::to_string(&m).expect("JSON serialises"));
    Ok(NewItem {
        custom_id: item.custom_id,
        goal,
        metadata,
        config,
        line,
    })
}

fn new_batch(p: &Principal, key: Option<String>, spec: &BatchSpec) -> NewBatch {
    let id = Uuid::now_v7();
    let stored = BatchSpec {
        options: BatchOptions {
            spend_cap: None,
            ..spec.options.clone()
        },
        ..spec.clone()
    };
    NewBatch {
        id,
        tenant: p.tenant.clone(),
        idempotency_key: key,
        spec: serde_json::to_string(&stored).expect("a spec serialises"),
        max_in_flight: spec.options.max_in_flight,
        cap: spec
            .options
            .spend_cap
            .map(SpendCap::from)
            .unwrap_or_default(),
        expires_at: spec
            .options
            .completion_window_secs
            .map(|s| Utc::now() + chrono::Duration::seconds(s.min(i64::MAX as u64) as i64)),
    }
}

fn view(batch: &Batch, counts: BatchCounts, spend: Spend) -> BatchView {
    let spec: BatchSpec = serde_json::from_str(&batch.spec).unwrap_or_default();
    BatchView {
        id: batch.id,
        tenant: batch.tenant.clone(),
        status: BatchStatus::of(batch.state, &counts),
        cap_reached: reached(batch.cap, spend),
        total: batch.items_total,
        counts,
        spend: spend.into(),
        agent: spec.agent,
        options: BatchOptions {
            spend_cap: (batch.cap != SpendCap::default()).then(|| batch.cap.into()),
            ..spec.options
        },
        created_at: batch.created_at,
        updated_at: batch.updated_at,
        expires_at: batch.expires_at,
    }
}

fn reached(cap: SpendCap, spend: Spend) -> bool {
    cap.tokens.is_some_and(|t| spend.tokens >= t)
        || cap
            .cost_usd_micros
            .is_some_and(|c| spend.cost_usd_micros >= c)
}

async fn full_view(app: &App, batch: &Batch) -> Result<BatchView, ApiError> {
    let store = store(app)?;
    let (counts, spend) = futures::try_join!(store.counts(batch.id), store.spend(batch.id))?;
    Ok(view(batch, BatchCounts::of(&counts), spend))
}

async fn visible_batch(app: &App, p: &Principal, id: Uuid) -> Result<Batch, ApiError> {
    store(app)?
        .batch(tenant_of(p), id)
        .await?
        .ok_or(ApiError::BatchNotFound(id))
}

/// The error a refused submission answers, placing it at `line` (JSON
/// Lines) or `items[i]` (JSON).
fn submit_error(e: SubmitError, jsonl: bool) -> ApiError {
    let place = |line: u64, field: Option<String>| -> String {
        match (jsonl, field) {
            (true, Some(f)) => f,
            (true, None) => String::new(),
            (false, Some(f)) => format!("items[{line}].{f}"),
            (false, None) => format!("items[{line}]"),
        }
    };
    match e {
        SubmitError::Input {
            item: Some(line),
            field,
            reason,
        } if jsonl => ApiError::InvalidLine {
            line,
            field,
            code: "invalid_request",
            reason,
        },
        SubmitError::Input {
            item: Some(line),
            field,
            reason,
        } => ApiError::InvalidField {
            field: place(line, field),
            reason,
        },
        SubmitError::Input {
            item: None,
            field: Some(field),
            reason,
        } => ApiError::InvalidField { field, reason },
        SubmitError::Input {
            item: None,
            field: None,
            reason,
        } => ApiError::Invalid(reason),
        SubmitError::DuplicateCustomId { line, custom_id } if jsonl => ApiError::InvalidLine {
            line,
            field: Some("custom_id".into()),
            code: "invalid_request",
            reason: format!("custom_id {custom_id:?} is used by an earlier line"),
        },
        SubmitError::DuplicateCustomId { line, custom_id } => ApiError::InvalidField {
            field: place(line, Some("custom_id".into())),
            reason: format!("custom_id {custom_id:?} is used by an earlier item"),
        },
        SubmitError::Truncated => ApiError::BodyRead("the upload ended early".into()),
        SubmitError::Other(e) => match e.downcast::<ApiError>() {
            Ok(e) => *e,
            Err(e) => ApiError::Invalid(e.to_string()),
        },
        SubmitError::Log(e) => e.into(),
    }
}

// ----- submission -----------------------------------------------------------------------

/// Submit a batch: JSON ([`CreateBatch`]) or JSON Lines (line 1 a
/// [`BatchSpec`], then one [`BatchItem`] per line), stored whole or not at
/// all. With an `Idempotency-Key` the tenant used before: 200 with that
/// batch (409 `idempotency_conflict` when the request differs). Errors name
/// the field, and for JSON Lines the `line`.
#[utoipa::path(post, path = "/v1/batches", tag = "batches",
    request_body(content((CreateBatch = "application/json"), (String = "application/jsonl")), description = "JSON, or JSON Lines: line 1 a BatchSpec, then one BatchItem per line"),
    params(("Idempotency-Key" = Option<String>, Header, description = "Per-tenant idempotency key, 1 to 255 visible ASCII characters")),
    responses(
        (status = 201, description = "Stored; items are admitted progressively", body = BatchView),
        (status = 200, description = "Idempotent repeat: the existing batch", body = BatchView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(app): State<App>,
    p: Principal,
    request: Request,
) -> Result<Response, ApiError> {
    p.require(Scope::Submit)?;
    let store = store(&app)?.clone();
    let key = idempotency_key(request.headers())?;
    let headers = request.headers().clone();
    let (submitted, hash) = if is_jsonl(&headers) {
        let mut lines = Lines::new(request.into_body(), &app.batches.admission);
        let Some((line, first)) = lines.next_line().await? else {
            return Err(ApiError::InvalidBody(
                "the upload is empty: line 1 must be the batch spec".into(),
            ));
        };
        let mut spec: BatchSpec = parse_line(line, &first, "BatchSpec")?;
        let config = check_spec(&app, &p.tenant, &mut spec).await?;
        let new = new_batch(&p, key.clone(), &spec);
        let upload = jsonl_upload(
            lines,
            ItemRules::new(&app, &spec, &config)?,
            app.batches.admission.max_items,
        );
        let submitted = store
            .submit(new, upload)
            .await
            .map_err(|e| submit_error(e, true))?;
        let hash = submitted.upload_hash.clone();
        (submitted, hash)
    } else {
        if !is_json(&headers) {
            return Err(ApiError::UnsupportedMediaType);
        }
        let ApiJson(body) =
            <ApiJson<CreateBatch> as axum::extract::FromRequest<App>>::from_request(request, &app)
                .await?;
        let hash = hex(&Sha256::digest(
            serde_json::to_vec(&body).expect("a body serialises"),
        ));
        let mut spec = BatchSpec {
            config: body.config,
            agent: body.agent,
            options: body.options,
        };
        let config = check_spec(&app, &p.tenant, &mut spec).await?;
        if body.items.len() as u64 > app.batches.admission.max_items {
            return Err(ApiError::InvalidField {
                field: "items".into(),
                reason: format!("at most {} items", app.batches.admission.max_items),
            });
        }
        let rules = ItemRules::new(&app, &spec, &config)?;
        let mut items = Vec::with_capacity(body.items.len());
        for (i, item) in body.items.into_iter().enumerate() {
            items.push(prepare(item, i as u64, &rules).map_err(|(field, reason)| {
                submit_error(
                    SubmitError::Input {
                        item: Some(i as u64),
                        field,
                        reason,
                    },
                    false,
                )
            })?);
        }
        let mut chunks: Vec<Result<Upload, SubmitError>> = Vec::new();
        let mut rest = items.into_iter().peekable();
        while rest.peek().is_some() {
            chunks.push(Ok(Upload::Items(rest.by_ref().take(CHUNK).collect())));
        }
        chunks.push(Ok(Upload::Done {
            request_hash: hash.clone(),
        }));
        let submitted = store
            .submit(
                new_batch(&p, key.clone(), &spec),
                futures::stream::iter(chunks).boxed(),
            )
            .await
            .map_err(|e| submit_error(e, false))?;
        (submitted, hash)
    };
    if !submitted.created {
        if submitted.batch.request_hash != hash {
            return Err(ApiError::IdempotencyConflict(key.unwrap_or_default()));
        }
        return Ok((
            StatusCode::OK,
            Json(full_view(&app, &submitted.batch).await?),
        )
            .into_response());
    }
    tracing::info!(batch_id = %submitted.batch.id, tenant = %p.tenant, items = submitted.batch.items_total, "batch submitted");
    app.wake_admission();
    let location = HeaderValue::from_str(&format!("/v1/batches/{}", submitted.batch.id))
        .expect("a uuid path is a valid header");
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(full_view(&app, &submitted.batch).await?),
    )
        .into_response())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn is_jsonl(headers: &HeaderMap) -> bool {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    matches!(
        essence.as_str(),
        "application/jsonl"
            | "application/x-ndjson"
            | "application/jsonlines"
            | "application/x-jsonlines"
    )
}

/// Parse one line as the document's schema `name`: 400 `malformed_json` or
/// 422 naming the line and the field.
fn parse_line<T: serde::de::DeserializeOwned>(
    line: u64,
    text: &[u8],
    name: &str,
) -> Result<T, ApiError> {
    let mut value: Value = serde_json::from_slice(text).map_err(|e| ApiError::InvalidLine {
        line,
        field: None,
        code: "malformed_json",
        reason: e.to_string(),
    })?;
    if !value.is_object() {
        return Err(ApiError::InvalidLine {
            line,
            field: None,
            code: "invalid_body",
            reason: "each line must be a JSON object".into(),
        });
    }
    integral_numbers(&mut value);
    conforms(name, &value).map_err(|e| match e {
        ApiError::BodyAt { field, reason } => ApiError::InvalidLine {
            line,
            field: Some(field),
            code: "invalid_body",
            reason,
        },
        other => ApiError::InvalidLine {
            line,
            field: None,
            code: "invalid_body",
            reason: other.to_string(),
        },
    })?;
    serde_json::from_value(value).map_err(|e| ApiError::InvalidLine {
        line,
        field: None,
        code: "invalid_body",
        reason: e.to_string(),
    })
}

/// A request body read line by line as it arrives, hashing every byte.
struct Lines {
    body: BoxStream<'static, Result<Bytes, axum::Error>>,
    buf: Vec<u8>,
    line: u64,
    read: u64,
    ended: bool,
    hash: Sha256,
    max_bytes: u64,
    max_line: usize,
}

impl Lines {
    fn new(body: Body, limits: &Admission) -> Lines {
        Lines {
            body: body.into_data_stream().boxed(),
            buf: Vec::new(),
            line: 0,
            read: 0,
            ended: false,
            hash: Sha256::new(),
            max_bytes: limits.max_upload_bytes,
            max_line: limits.max_line_bytes,
        }
    }

    /// The next non-blank line with its number (from 1), or `None` at the end.
    async fn next_line(&mut self) -> Result<Option<(u64, Vec<u8>)>, ApiError> {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
                line.pop();
                self.line += 1;
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Some((self.line, line)));
            }
            if self.buf.len() > self.max_line {
                return Err(ApiError::InvalidLine {
                    line: self.line + 1,
                    field: None,
                    code: "invalid_body",
                    reason: format!("longer than {} bytes", self.max_line),
                });
            }
            if self.ended {
                if self.buf.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None);
                }
                self.line += 1;
                return Ok(Some((self.line, std::mem::take(&mut self.buf))));
            }
            match self.body.next().await {
                None => self.ended = true,
                Some(Err(e)) => return Err(ApiError::BodyRead(e.to_string())),
                Some(Ok(chunk)) => {
                    self.read += chunk.len() as u64;
                    if self.read > self.max_bytes {
                        return Err(ApiError::BodyTooLarge(
                            self.max_bytes.min(usize::MAX as u64) as usize,
                        ));
                    }
                    self.hash.update(&chunk);
                    self.buf.extend_from_slice(&chunk);
                }
            }
        }
    }
}

/// The items of a JSON Lines upload after its spec line, in chunks of
/// [`CHUNK`], then [`Upload::Done`] with the hash of every byte.
fn jsonl_upload(
    lines: Lines,
    rules: ItemRules,
    max_items: u64,
) -> BoxStream<'static, Result<Upload, SubmitError>> {
    futures::stream::unfold(Some((lines, rules, 0u64)), move |state| async move {
        let (mut lines, rules, mut count) = state?;
        let mut chunk = Vec::with_capacity(CHUNK);
        while chunk.len() < CHUNK {
            match lines.next_line().await {
                Err(e) => return Some((Err(SubmitError::Other(Box::new(e))), None)),
                Ok(None) => break,
                Ok(Some((line, text))) => {
                    count += 1;
                    if count > max_items {
                        return Some((
                            Err(SubmitError::Input {
                                item: Some(line),
                                field: None,
                                reason: format!("at most {max_items} items per batch"),
                            }),
                            None,
                        ));
                    }
                    let item = match parse_line::<BatchItem>(line, &text, "BatchItem") {
                        Ok(item) => item,
                        Err(e) => return Some((Err(SubmitError::Other(Box::new(e))), None)),
                    };
                    match prepare(item, line, &rules) {
                        Ok(item) => chunk.push(item),
                        Err((field, reason)) => {
                            return Some((
                                Err(SubmitError::Input {
                                    item: Some(line),
                                    field,
                                    reason,
                                }),
                                None,
                            ));
                        }
                    }
                }
            }
        }
        if chunk.is_empty() {
            if count == 0 {
                return Some((
                    Err(SubmitError::Input {
                        item: None,
                        field: None,
                        reason: "the batch has no items (line 2 on are items)".into(),
                    }),
                    None,
                ));
            }
            let request_hash = hex(&lines.hash.clone().finalize());
            return Some((Ok(Upload::Done { request_hash }), None));
        }
        Some((Ok(Upload::Items(chunk)), Some((lines, rules, count))))
    })
    .boxed()
}

// ----- reading ----------------------------------------------------------------------

/// List batches visible to the caller, by id (creation order).
#[utoipa::path(get, path = "/v1/batches", tag = "batches", params(ListBatchesQuery),
    responses((status = 200, body = BatchPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(app): State<App>,
    p: Principal,
    ApiQuery(q): ApiQuery<ListBatchesQuery>,
) -> Result<Json<BatchPage>, ApiError> {
    let limit = match q.limit {
        None => app.limits.default_page,
        Some(n) if (1..=app.limits.max_page).contains(&n) => n,
        Some(n) => {
            return Err(ApiError::InvalidQuery(format!(
                "limit {n} is outside 1..={}",
                app.limits.max_page
            )));
        }
    };
    let batches = store(&app)?.batches(tenant_of(&p), q.after, limit).await?;
    let next = (batches.len() == limit)
        .then(|| batches.last().map(|b| b.id))
        .flatten();
    // Each as the single get shows it (the same status function, counts and spend).
    let views = futures::stream::iter(batches)
        .map(|b| {
            let app = app.clone();
            async move { full_view(&app, &b).await }
        })
        .buffered(8)
        .try_collect()
        .await?;
    Ok(Json(BatchPage {
        batches: views,
        next,
    }))
}

/// One batch: state, counts by what became of the items, spend so far.
#[utoipa::path(get, path = "/v1/batches/{id}", tag = "batches", params(("id" = Uuid, Path, description = "Batch id")),
    responses((status = 200, body = BatchView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<BatchView>, ApiError> {
    let batch = visible_batch(&app, &p, id).await?;
    Ok(Json(full_view(&app, &batch).await?))
}

/// Every item's result as JSON Lines, in submission order, streamed (one
/// [`ItemResult`] per line; items not finished show their status).
#[utoipa::path(get, path = "/v1/batches/{id}/results", tag = "batches", params(("id" = Uuid, Path, description = "Batch id")),
    responses((status = 200, description = "One ItemResult per line", content_type = "application/jsonl", body = String), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn results(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Response, ApiError> {
    let batch = visible_batch(&app, &p, id).await?;
    let store = store(&app)?.clone();
    const PAGE: usize = 1000;
    let lines = futures::stream::unfold(Some(0u64), move |from| {
        let store = store.clone();
        async move {
            let from = from?;
            match store.items(batch.id, from, PAGE).await {
                Err(e) => {
                    tracing::warn!(batch_id = %batch.id, "results cut off: {e}");
                    Some((Err(std::io::Error::other(e.to_string())), None))
                }
                Ok(items) if items.is_empty() => None,
                Ok(items) => {
                    let next = (items.len() == PAGE)
                        .then(|| items.last().map(|i| i.n + 1))
                        .flatten();
                    let mut out = Vec::new();
                    for item in items {
                        serde_json::to_writer(&mut out, &ItemResult::of(item))
                            .expect("results serialise");
                        out.push(b'\n');
                    }
                    Some((Ok(Bytes::from(out)), Some(next.unwrap_or(u64::MAX))))
                }
            }
        }
    });
    Ok((
        [(header::CONTENT_TYPE, "application/jsonl")],
        Body::from_stream(lines),
    )
        .into_response())
}

/// The batch's progress as server-sent events: a `progress` frame (a
/// [`BatchView`]) now and whenever it changes (checked every second); the
/// stream ends after the frame that shows it completed or cancelled with no
/// run left.
#[utoipa::path(get, path = "/v1/batches/{id}/stream", tag = "batches", params(("id" = Uuid, Path, description = "Batch id")),
    responses((status = 200, description = "Server-sent events; the schema describes one event (frame) of the stream", content_type = "text/event-stream", body = crate::docs::BatchProgressEventDoc), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn stream(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Response, ApiError> {
    let batch = visible_batch(&app, &p, id).await?;
    let frames = progress(app, p, batch.id);
    Ok(Sse::new(frames)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

fn progress(app: App, p: Principal, id: Uuid) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    futures::stream::unfold((None::<BatchView>, false), move |(last, done)| {
        let (app, p) = (app.clone(), p.clone());
        async move {
            if done {
                return None;
            }
            let mut first = last.is_none();
            loop {
                if !first {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                first = false;
                let Ok(batch) = visible_batch(&app, &p, id).await else {
                    continue;
                };
                let Ok(now) = full_view(&app, &batch).await else {
                    continue;
                };
                let comparable =
                    |v: &BatchView| (v.status, v.counts.clone(), v.spend, v.cap_reached);
                if last.as_ref().map(comparable) == Some(comparable(&now)) {
                    continue;
                }
                let finished = now.counts.open() == 0;
                let frame = SseEvent::default()
                    .event("progress")
                    .data(serde_json::to_string(&now).expect("a view serialises"));
                return Some((Ok(frame), (Some(now), finished)));
            }
        }
    })
}

// ----- control ----------------------------------------------------------------------------

/// Cancel a batch: nothing more is started, items not started are
/// `cancelled`, and every run not done gets a cancel (as `POST
/// /v1/runs/{id}/cancel`).
#[utoipa::path(post, path = "/v1/batches/{id}/cancel", tag = "batches", params(("id" = Uuid, Path, description = "Batch id")),
    responses((status = 200, body = BatchView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<BatchView>, ApiError> {
    p.require(Scope::Submit)?;
    let store = store(&app)?;
    let batch = store
        .update(tenant_of(&p), id, Some(BatchState::Cancelled), None)
        .await?
        .ok_or(ApiError::BatchNotFound(id))?;
    let reason = format!("batch {id} cancelled by {}", p.by());
    for run_id in store.live_runs(id).await? {
        match cancel_run(&app, run_id, &reason, &p.by()).await {
            Ok(_) | Err(ApiError::RunFinished(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Json(full_view(&app, &batch).await?))
}

/// Pause a batch: nothing more is started, and every run of it not done
/// gets an operator pause (see the module doc): it parks at `paused` at its
/// next step boundary. A batch that ended answers 409 `batch_ended`.
#[utoipa::path(post, path = "/v1/batches/{id}/pause", tag = "batches", params(("id" = Uuid, Path, description = "Batch id")),
    responses((status = 200, body = BatchView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "`batch_ended`: the batch completed, expired or was cancelled", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn pause(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<BatchView>, ApiError> {
    p.require(Scope::Submit)?;
    let store = store(&app)?;
    not_ended(&app, &p, id).await?;
    let batch = store
        .update(tenant_of(&p), id, Some(BatchState::Paused), None)
        .await?
        .ok_or(ApiError::BatchNotFound(id))?;
    if batch.state == BatchState::Paused {
        park_runs(
            &app,
            id,
            &format!("batch {id} paused by {}", p.by()),
            &p.by(),
        )
        .await?;
        // Resumed meanwhile (a concurrent `resume` passed these runs before
        // their pause was posted): take the pauses back.
        if store
            .batch(None, id)
            .await?
            .is_some_and(|b| b.state == BatchState::Active)
        {
            resume_parked(&app, id, &p.by()).await?;
        }
    }
    Ok(Json(full_view(&app, &batch).await?))
}

/// 404 unless the caller sees batch `id`; 409 `batch_ended` when it has
/// ended ([`BatchStatus::ended`]: an ended batch never changes again, so
/// the answer cannot go stale before the caller's change).
async fn not_ended(app: &App, p: &Principal, id: Uuid) -> Result<(), ApiError> {
    let status = full_view(app, &visible_batch(app, p, id).await?)
        .await?
        .status;
    if status.ended() {
        return Err(ApiError::BatchEnded(id, status.as_str()));
    }
    Ok(())
}

/// Give every run of batch `id` not done an operator pause with `reason`
/// (runs already paused or pausing, and runs that finished meanwhile, are
/// left as they are).
async fn park_runs(app: &App, id: Uuid, reason: &str, by: &str) -> Result<(), ApiError> {
    for run_id in store(app)?.live_runs(id).await? {
        match pause_run(app, run_id, reason, by).await {
            Ok(_) | Err(ApiError::RunFinished(_) | ApiError::RunCancelled(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Resume the runs of batch `id` that one of its pauses (or its spend cap)
/// holds or is about to hold; a run an operator paused on its own stays.
async fn resume_parked(app: &App, id: Uuid, by: &str) -> Result<(), ApiError> {
    let ours = format!("batch {id} ");
    for run_id in store(app)?.live_runs(id).await? {
        match resume_paused_by(app, run_id, by, |reason| reason.starts_with(&ours)).await {
            Ok(_) | Err(ApiError::RunFinished(_) | ApiError::RunCancelled(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Resume a paused batch, optionally replacing its spend cap (a batch that
/// reached its cap starts items again once the cap is above its spend). A
/// batch that ended (completed, expired, cancelled) answers 409 `batch_ended`.
#[utoipa::path(post, path = "/v1/batches/{id}/resume", tag = "batches", request_body(content = ResumeBatchBody, description = "May be empty"),
    params(("id" = Uuid, Path, description = "Batch id")),
    responses((status = 200, body = BatchView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "`batch_ended`: the batch completed, expired or was cancelled", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn resume(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
    OptJson(body): OptJson<ResumeBatchBody>,
) -> Result<Json<BatchView>, ApiError> {
    p.require(Scope::Submit)?;
    let cap = body.spend_cap.map(SpendCap::from);
    let store = store(&app)?;
    not_ended(&app, &p, id).await?;
    let batch = store
        .update(tenant_of(&p), id, Some(BatchState::Active), cap)
        .await?
        .ok_or(ApiError::BatchNotFound(id))?;
    // Only the runs this batch paused (its pause, or its spend cap), and not
    // while the cap is still reached: the next pass would pause them again.
    let capped = batch.cap != SpendCap::default() && reached(batch.cap, store.spend(id).await?);
    if batch.state == BatchState::Active && !capped {
        resume_parked(&app, id, &p.by()).await?;
    }
    app.wake_admission();
    Ok(Json(full_view(&app, &batch).await?))
}

// ----- admission ----------------------------------------------------------------------------

/// Slots granted per batch: weighted fair share of `free` slots across
/// tenants, then across each tenant's batches (see the module doc).
/// Every lane's `in_flight` counts as load; a lane is granted at most its
/// `waiting` (the caller sets it to 0 for a batch that may not admit).
pub fn share(lanes: &[Lane], free: u64, admission: &Admission) -> HashMap<Uuid, u64> {
    let mut tenant_load: HashMap<&str, u64> = HashMap::new();
    for lane in lanes {
        *tenant_load.entry(lane.tenant.as_str()).or_insert(0) += lane.in_flight;
    }
    let mut grants: HashMap<Uuid, u64> = HashMap::new();
    let per_tenant = u64::from(admission.per_tenant);
    for _ in 0..free {
        let open = |lane: &&Lane| {
            let g = grants.get(&lane.batch_id).copied().unwrap_or(0);
            g < lane.waiting
                && lane
                    .max_in_flight
                    .is_none_or(|m| lane.in_flight + g < u64::from(m))
                && tenant_load[lane.tenant.as_str()] < per_tenant
        };
        let weight = |t: &str| u64::from(admission.weights.get(t).copied().unwrap_or(1).max(1));
        // The tenant with the least load per weight (compared as fractions), then the oldest batch id.
        let Some(tenant) = lanes
            .iter()
            .filter(open)
            .map(|l| l.tenant.as_str())
            .min_by(|a, b| {
                (u128::from(tenant_load[a]) * u128::from(weight(b)))
                    .cmp(&(u128::from(tenant_load[b]) * u128::from(weight(a))))
                    .then(a.cmp(b))
            })
        else {
            break;
        };
        let lane = lanes
            .iter()
            .filter(open)
            .filter(|l| l.tenant == tenant)
            .min_by_key(|l| {
                (
                    l.in_flight + grants.get(&l.batch_id).copied().unwrap_or(0),
                    l.batch_id,
                )
            })
            .expect("the tenant has an open lane");
        *grants.entry(lane.batch_id).or_insert(0) += 1;
        *tenant_load
            .get_mut(tenant)
            .expect("every tenant is counted") += 1;
    }
    grants
}

/// One admission pass: sweep, then grant and admit. Answers how many items
/// became runs.
pub async fn admit_once(app: &App) -> Result<u64, ApiError> {
    let store = store(app)?;
    let a = &app.batches.admission;
    store.sweep(1000).await?;
    // Batches past their completion window: their runs not done are
    // cancelled (answered again each pass until a worker applies the cancel).
    for run_id in store.expire_runs(1000).await? {
        match cancel_run(app, run_id, EXPIRED_REASON, "glia").await {
            Ok(_) | Err(ApiError::RunFinished(_) | ApiError::RunCancelled(_)) => {}
            Err(e) => {
                tracing::warn!(run_id = %run_id, "completion window ended; the run's cancel was not posted (retried next pass): {e}")
            }
        }
    }
    let lanes = store.lanes().await?;
    // Every batch's runs in flight count against the caps; only active
    // batches under their spend cap are granted slots.
    let mut admissible = Vec::with_capacity(lanes.len());
    let mut in_flight = 0;
    for mut lane in lanes {
        in_flight += lane.in_flight;
        let capped = lane.state == BatchState::Active
            && lane.waiting + lane.in_flight > 0
            && lane.cap != SpendCap::default()
            && reached(lane.cap, store.spend(lane.batch_id).await?);
        if capped {
            // The cap is reached: its runs pause, then the batch. A pass that
            // fails to park them all leaves the batch active, so the next
            // pass tries again (runs already pausing are skipped).
            let id = lane.batch_id;
            match park_runs(
                app,
                id,
                &format!("batch {id} reached its spend cap"),
                "glia",
            )
            .await
            {
                Ok(()) => {
                    if store
                        .update(None, id, Some(BatchState::Paused), None)
                        .await?
                        .is_some_and(|b| b.state == BatchState::Paused)
                    {
                        tracing::info!(batch_id = %id, "spend cap reached; batch paused");
                    }
                }
                Err(e) => {
                    tracing::warn!(batch_id = %id, "spend cap reached; not every run was paused (retried next pass): {e}")
                }
            }
        }
        if lane.state != BatchState::Active || capped {
            lane.waiting = 0;
        }
        admissible.push(lane);
    }
    let free = u64::from(a.max_in_flight)
        .saturating_sub(in_flight)
        .min(a.per_pass as u64);
    let grants = share(&admissible, free, a);
    let mut claims: Vec<Claim> = Vec::new();
    for lane in &admissible {
        if let Some(&n) = grants.get(&lane.batch_id) {
            claims.extend(
                store
                    .claim(lane.batch_id, n as usize, a.claim_lease)
                    .await?,
            );
        }
    }
    let tenants: HashMap<Uuid, &str> = admissible
        .iter()
        .map(|l| (l.batch_id, l.tenant.as_str()))
        .collect();
    let mut specs: HashMap<Uuid, Option<BatchSpec>> = HashMap::new();
    for claim in &claims {
        if !specs.contains_key(&claim.batch_id) {
            let spec = store
                .batch(None, claim.batch_id)
                .await?
                .and_then(|b| serde_json::from_str(&b.spec).ok());
            specs.insert(claim.batch_id, spec);
        }
    }
    let admitted = futures::stream::iter(claims)
        .map(|claim| {
            let spec = specs.get(&claim.batch_id).cloned().flatten();
            let tenant = tenants
                .get(&claim.batch_id)
                .copied()
                .unwrap_or_default()
                .to_owned();
            async move { admit_item(app, &tenant, spec, claim).await }
        })
        .buffer_unordered(16)
        .filter(|r| {
            if let Err(e) = r {
                // The item stays `admitting`; a later pass claims it again when the claim lapses.
                tracing::warn!("batch item not admitted (retried after the claim lapses): {e}");
            }
            futures::future::ready(matches!(r, Ok(true)))
        })
        .count()
        .await;
    Ok(admitted as u64)
}

/// Turn one claimed item into its run. Ok(false): refused (recorded on the item).
async fn admit_item(
    app: &App,
    tenant: &str,
    spec: Option<BatchSpec>,
    claim: Claim,
) -> Result<bool, ApiError> {
    let store = store(app)?;
    let Some(spec) = spec else {
        store
            .refused(
                claim.batch_id,
                claim.n,
                "the batch's stored specification cannot be read",
            )
            .await?;
        return Ok(false);
    };
    // The item's own config: its patch over the batch's (checked at submit;
    // a stored patch that no longer applies refuses the item).
    let config = match claim
        .config
        .as_deref()
        .map(serde_json::from_str::<Map<String, Value>>)
    {
        None => spec.config.clone().unwrap_or_default(),
        Some(Ok(patch)) => match patched_config(&base_config(&spec), &patch) {
            Ok(config) => config,
            Err((field, reason)) => {
                store
                    .refused(
                        claim.batch_id,
                        claim.n,
                        &format!("{}: {reason}", field.unwrap_or_default()),
                    )
                    .await?;
                return Ok(false);
            }
        },
        Some(Err(e)) => {
            store
                .refused(
                    claim.batch_id,
                    claim.n,
                    &format!("the item's stored config cannot be read: {e}"),
                )
                .await?;
            return Ok(false);
        }
    };
    let req = CreateRun {
        goal: claim.goal.clone(),
        config,
        batch_id: Some(claim.batch_id),
        agent: spec.agent,
    };
    let key = format!("glia-batch:{}:{}", claim.batch_id, claim.custom_id);
    let run = match admit_run(app, tenant, Some(key), &req).await {
        Ok((run, _)) => run,
        Err(e) if e.status().is_client_error() => {
            tracing::warn!(batch_id = %claim.batch_id, custom_id = %claim.custom_id, "item refused at admission: {e}");
            store
                .refused(claim.batch_id, claim.n, &e.to_string())
                .await?;
            return Ok(false);
        }
        Err(e) => return Err(e),
    };
    let state = store.admitted(claim.batch_id, claim.n, run.run_id).await?;
    if state == BatchState::Paused {
        // Paused while this item was admitted: its run pauses too.
        match pause_run(
            app,
            run.run_id,
            &format!("batch {} paused", claim.batch_id),
            "glia",
        )
        .await
        {
            Ok(_) | Err(ApiError::RunFinished(_) | ApiError::RunCancelled(_)) => {}
            Err(e) => return Err(e),
        }
        // Resumed meanwhile: take the pause back.
        if store
            .batch(None, claim.batch_id)
            .await?
            .is_some_and(|b| b.state == BatchState::Active)
        {
            let ours = format!("batch {} ", claim.batch_id);
            match resume_paused_by(app, run.run_id, "glia", |reason| reason.starts_with(&ours))
                .await
            {
                Ok(_) | Err(ApiError::RunFinished(_) | ApiError::RunCancelled(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
    if state == BatchState::Cancelled {
        match cancel_run(
            app,
            run.run_id,
            &format!("batch {} cancelled", claim.batch_id),
            "glia",
        )
        .await
        {
            Ok(_) | Err(ApiError::RunFinished(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// The admission loop (spawned by `glia dispatcher`): a pass every
/// [`Admission::poll`], or at once after a submit or resume; failures are
/// logged and the next pass tries again. Returns at once without a store.
pub async fn admit(app: App) {
    if app.batches.store.is_none() {
        return;
    }
    loop {
        match admit_once(&app).await {
            Ok(n) if n > 0 => {
                tracing::debug!(admitted = n, "batch admission pass");
                continue;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("batch admission pass failed: {e}"),
        }
        let _ = tokio::time::timeout(app.batches.admission.poll, app.admission_woken()).await;
    }
}
