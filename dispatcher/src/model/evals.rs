//! The shapes of `/v1/datasets` and `/v1/experiments`. See [`crate::evals`]
//! and `docs/evals.md`; the eval file itself is `glia_evals::spec`.

use chrono::{DateTime, Utc};
use glia_backends::evals::{DatasetInfo, ExperimentState};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::model::Documented;

/// One version of a dataset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DatasetView {
    /// The dataset's name.
    pub name: String,
    /// Its version, from 1.
    pub version: u32,
    /// How many cases it holds.
    pub cases: u32,
    /// SHA-256 (hex) of its canonical JSON Lines.
    pub content_hash: String,
    /// When this version was stored.
    pub created_at: DateTime<Utc>,
}

impl From<DatasetInfo> for DatasetView {
    fn from(d: DatasetInfo) -> DatasetView {
        DatasetView {
            name: d.name,
            version: d.version,
            cases: d.cases,
            content_hash: d.content_hash,
            created_at: d.created_at,
        }
    }
}

/// Every version of the caller's datasets, by name then version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DatasetList {
    /// The versions.
    pub datasets: Vec<DatasetView>,
}

/// One version of a dataset with its cases.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DatasetCases {
    /// The version.
    pub dataset: DatasetView,
    /// Its cases (`{id, goal, turns?, expected?, metadata?, config?}`), in order.
    #[schema(value_type = Vec<Object>)]
    pub cases: Vec<Value>,
}

/// `?version=N` of `GET /v1/datasets/{name}`.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct DatasetQuery {
    /// The version (default: the latest).
    #[param(minimum = 1)]
    pub version: Option<u32>,
}

/// Body of `POST /v1/experiments`: `{"eval": {…}}`, the eval file as JSON
/// (`docs/evals.md`; `glia eval run` sends it from TOML).
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateExperiment {
    /// The eval: `name`, `dataset` (`name` or `name@N`), `agents`,
    /// `repetitions`, `approvals`, `options`, `graders`. Checked strictly;
    /// an error names the field (`eval.graders[1].pattern`).
    #[schema(value_type = Object)]
    pub eval: Value,
}

impl Documented for CreateExperiment {
    const SCHEMA: &'static str = "CreateExperiment";
}

/// One agent version of an experiment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExperimentVersion {
    /// Its label (`support@4`, or an inline config's label).
    pub label: String,
    /// The batch running it, once submitted (`GET /v1/batches/{id}`).
    pub batch_id: Option<Uuid>,
}

/// How far an experiment got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExperimentProgress {
    /// Cells: versions × cases × repetitions.
    pub cells: u64,
    /// Cells graded.
    pub graded: u64,
}

/// An experiment: what it runs, where it stands, and (in
/// `GET /v1/experiments/{id}`) its results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExperimentView {
    /// Its id.
    pub id: Uuid,
    /// The eval's name.
    pub name: String,
    /// `running`, `completed` or `cancelled`.
    #[schema(value_type = String)]
    pub state: ExperimentState,
    /// The dataset, pinned: `name@N`.
    pub dataset: String,
    /// The versions compared, the first the base.
    pub versions: Vec<ExperimentVersion>,
    /// Runs of each case under each version.
    pub repetitions: u32,
    /// Cells and cells graded.
    pub progress: ExperimentProgress,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it completed or was cancelled.
    pub finished_at: Option<DateTime<Utc>>,
    /// The eval as stored (references pinned).
    #[schema(value_type = Object)]
    pub eval: Value,
    /// Per version the pass rate (95% Wilson interval), cost and latency;
    /// per case each version's majority verdict; the verdict changes
    /// against the first version (`glia_evals::stats::Summary`). Only in
    /// `GET /v1/experiments/{id}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub summary: Option<Value>,
    /// Every cell: version, case, repetition, run, status, verdicts, pass,
    /// error, facts (`glia_evals::stats::Cell`). Only in
    /// `GET /v1/experiments/{id}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub cells: Option<Vec<Value>>,
}

/// A page of experiments, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ExperimentPage {
    /// The experiments (without results).
    pub experiments: Vec<ExperimentView>,
    /// Pass as `before` for the next page; `None` on the last.
    pub next: Option<Uuid>,
}

/// `?before=…&limit=…` of `GET /v1/experiments`.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListExperimentsQuery {
    /// Experiments older than this one.
    pub before: Option<Uuid>,
    /// Page size, 1 to 1,000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

/// The JSON form of `PUT /v1/datasets/{name}`: `{"cases": [{…}, …]}`, each
/// case as a line of the JSON Lines form.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutDataset {
    /// The cases (`{id, goal | messages, turns?, farewell?, expected?,
    /// metadata?, config?, recorded_tools?}`), at least one.
    #[schema(value_type = Vec<Object>, min_items = 1)]
    pub cases: Vec<Value>,
}

impl Documented for PutDataset {
    const SCHEMA: &'static str = "PutDataset";
}
