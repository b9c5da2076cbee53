//! The shapes of `/v1/batches`: a batch's spec, items, views and results.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use glia_backends::batches::{BatchState, ItemView};
use glia_backends::{Spend, SpendCap};
use glia_proto::RunConfig;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::docs::RunConfigDoc;

use crate::model::Documented;

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
    /// String pairs: the run's `metadata` (as in `POST /v1/runs`, with its
    /// limits), echoed in the item's result.
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    pub metadata: Option<BTreeMap<String, String>>,
    /// The run's `tags` (as in `POST /v1/runs`, with its limits).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 20, value_type = Vec<String>)]
    pub tags: Vec<String>,
    /// This item's own configuration: a JSON merge patch (RFC 7396) applied
    /// to the batch's `config` for its run (`{"model": "…", "system": "…"}`
    /// changes those two; `null` removes a key, back to its default). The
    /// result is checked at submit as `POST /v1/runs` checks a config; not
    /// allowed in a batch that names an `agent`.
    #[schema(value_type = Option<Object>)]
    pub config: Option<Map<String, Value>>,
    /// Answer the run's tool calls from a recording, as `recorded_tools`
    /// in `POST /v1/runs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::docs::RecordedToolsDoc>)]
    pub recorded_tools: Option<glia_proto::recorded::RecordedTools>,
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
    pub(crate) fn of(item: ItemView) -> ItemResult {
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
