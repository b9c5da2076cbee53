//! Evals (issue 31, `docs/evals.md`): a tenant's datasets, its experiments
//! and the grade of each experiment cell.
//!
//! - A **dataset** is versioned and immutable: [`EvalStore::put_dataset`]
//!   stores a name's next version, unless the content is the latest
//!   version's again (then it answers that version, unchanged). The cases
//!   are kept as the canonical JSON Lines text the dispatcher wrote; the
//!   store knows nothing of their shape.
//! - An **experiment** keeps its spec as the dispatcher validated it
//!   ([`Experiment::spec`], opaque JSON text), the batch that runs each agent
//!   version ([`Experiment::batches`], in the spec's order; set once they
//!   are submitted) and whether it is still running.
//! - A **grade** is written once per cell ([`EvalStore::record_grade`]): the
//!   first grade of a cell wins, so a grader that costs money (a judge run,
//!   an HTTP call) decides a cell once whatever the dispatchers do.
//!
//! Methods taking `tenant` see only that tenant's objects (`None`: every
//! tenant's, for admins and the dispatcher's loop); another tenant's object
//! reads exactly like a missing one. Postgres implements [`EvalStore`]
//! ([`PgLog`](crate::postgres::PgLog), migration V19), so do the single
//! node's file ([`SqliteLog`](crate::sqlite::SqliteLog), migration 012) and
//! the in-memory twin [`MemoryEvals`]; `conformance::evals` (feature
//! `testkit`) holds all three to the same semantics.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::LogError;

/// Most objects one listing answers.
pub const MAX_PAGE: usize = 1000;

/// One version of a dataset, without its cases.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetInfo {
    /// The owning tenant.
    pub tenant: String,
    /// Its name, unique within the tenant.
    pub name: String,
    /// 1, 2, 3 … per name.
    pub version: u32,
    /// SHA-256 (hex) of [`Dataset::cases`].
    pub content_hash: String,
    /// How many cases it holds.
    pub cases: u32,
    /// When this version was stored (kept to the microsecond).
    pub created_at: DateTime<Utc>,
}

/// One version of a dataset with its cases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataset {
    /// The version.
    pub info: DatasetInfo,
    /// The cases: JSON Lines text, opaque to the store.
    pub cases: String,
}

/// What [`EvalStore::put_dataset`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutDataset {
    /// A new version was stored.
    Created(DatasetInfo),
    /// The content is the latest version's: that version, unchanged.
    Unchanged(DatasetInfo),
}

/// Whether an experiment is still at work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExperimentState {
    /// Its runs are going or not all graded yet.
    Running,
    /// Every cell ended and is graded.
    Completed,
    /// Cancelled by its tenant; cells not graded stay so.
    Cancelled,
}

impl ExperimentState {
    /// `running`, `completed` or `cancelled` (the column's values).
    pub fn as_str(self) -> &'static str {
        match self {
            ExperimentState::Running => "running",
            ExperimentState::Completed => "completed",
            ExperimentState::Cancelled => "cancelled",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<ExperimentState, LogError> {
        match s {
            "running" => Ok(ExperimentState::Running),
            "completed" => Ok(ExperimentState::Completed),
            "cancelled" => Ok(ExperimentState::Cancelled),
            other => Err(LogError::Corrupt(format!("experiment state {other:?}"))),
        }
    }
}

/// A stored experiment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Experiment {
    /// Its id (UUID v7).
    pub id: Uuid,
    /// The owning tenant; its runs are the tenant's.
    pub tenant: String,
    /// Its name (the eval's).
    pub name: String,
    /// Per-tenant idempotency key: a second create with it answers the first.
    pub idempotency_key: Option<String>,
    /// SHA-256 (hex) of the request that created it.
    pub request_hash: String,
    /// The eval spec as the dispatcher validated it: JSON text, opaque to the store.
    pub spec: String,
    /// The batch of each agent version, in the spec's order; empty until
    /// they are submitted ([`EvalStore::set_batches`]).
    pub batches: Vec<Uuid>,
    /// Running, completed or cancelled.
    pub state: ExperimentState,
    /// When it was created (kept to the microsecond).
    pub created_at: DateTime<Utc>,
    /// When it completed or was cancelled.
    pub finished_at: Option<DateTime<Utc>>,
}

/// One cell's grade.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grade {
    /// The experiment.
    pub experiment_id: Uuid,
    /// The agent version's label.
    pub version: String,
    /// The cell within the version: its batch item's `custom_id` (`{case}#{rep}`).
    pub cell: String,
    /// The run graded.
    pub run_id: Uuid,
    /// The verdicts: JSON text, opaque to the store.
    pub grade: String,
    /// When it was graded (kept to the microsecond).
    pub graded_at: DateTime<Utc>,
}

/// Storage of datasets, experiments and grades.
#[async_trait]
pub trait EvalStore: Send + Sync {
    /// Store `cases` (JSON Lines text, `count` cases, SHA-256 `hash`) as the
    /// next version of the tenant's dataset `name`, at `at`; when the
    /// latest version has the same hash, answer it unchanged
    /// ([`PutDataset::Unchanged`]). Two concurrent puts of one name get
    /// different versions or one of them `Unchanged`, never the same
    /// version twice.
    ///
    /// Errors: [`LogError::Unavailable`] when the store fails.
    async fn put_dataset(
        &self,
        tenant: &str,
        name: &str,
        cases: &str,
        hash: &str,
        count: u32,
        at: DateTime<Utc>,
    ) -> Result<PutDataset, LogError>;

    /// Version `version` of the dataset (the latest for `None`), if
    /// `tenant` sees it.
    ///
    /// Errors: [`LogError::Unavailable`]; [`LogError::Corrupt`] for a row
    /// that does not decode.
    async fn dataset(
        &self,
        tenant: Option<&str>,
        name: &str,
        version: Option<u32>,
    ) -> Result<Option<Dataset>, LogError>;

    /// What [`EvalStore::dataset`] answers, without its cases (a listing's
    /// read: no case text is read).
    ///
    /// Errors: as [`EvalStore::dataset`].
    async fn dataset_info(
        &self,
        tenant: Option<&str>,
        name: &str,
        version: Option<u32>,
    ) -> Result<Option<DatasetInfo>, LogError>;

    /// Every version of the tenant's datasets (every tenant's for `None`),
    /// by name then version, at most [`MAX_PAGE`].
    ///
    /// Errors: as [`EvalStore::dataset`].
    async fn datasets(&self, tenant: Option<&str>) -> Result<Vec<DatasetInfo>, LogError>;

    /// Store `experiment` (its state and batches as given). When its tenant
    /// has an experiment with the same idempotency key, store nothing and
    /// answer that one with `false`; else the stored one with `true`.
    ///
    /// Errors: [`LogError::Unavailable`].
    async fn create_experiment(
        &self,
        experiment: &Experiment,
    ) -> Result<(Experiment, bool), LogError>;

    /// The experiment `id`, if `tenant` sees it.
    ///
    /// Errors: as [`EvalStore::dataset`].
    async fn experiment(
        &self,
        tenant: Option<&str>,
        id: Uuid,
    ) -> Result<Option<Experiment>, LogError>;

    /// The tenant's experiments (every tenant's for `None`), newest first,
    /// older than `before` when given, at most `limit` (1 to [`MAX_PAGE`];
    /// clamped).
    ///
    /// Errors: as [`EvalStore::dataset`].
    async fn experiments(
        &self,
        tenant: Option<&str>,
        before: Option<Uuid>,
        limit: usize,
    ) -> Result<Vec<Experiment>, LogError>;

    /// Every tenant's running experiments, least recently claimed first
    /// (never claimed first, then by when the last claim runs out; ties
    /// oldest first), at most `limit` (1 to [`MAX_PAGE`]; clamped): what the
    /// dispatcher's loop tends. A pass's claims send those experiments to
    /// the back, so more running experiments than `limit` take turns.
    ///
    /// Errors: as [`EvalStore::dataset`].
    async fn running_experiments(&self, limit: usize) -> Result<Vec<Experiment>, LogError>;

    /// Claim the running experiment `id` for dispatcher `owner` until
    /// `until`: true when no other dispatcher holds it at `now` (never
    /// claimed, its claim ran out, or `owner`'s own, which this extends).
    /// One dispatcher tends an experiment at a time (posts its runs'
    /// scripted turns and decisions, grades its cells); another takes over
    /// when the holder stops renewing. False for an experiment that is not
    /// running.
    ///
    /// Errors: [`LogError::Unavailable`].
    async fn tend(
        &self,
        id: Uuid,
        owner: Uuid,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, LogError>;

    /// Record the batches of a running experiment (in the spec's order).
    /// False when it is not running (or gone); nothing is written then.
    ///
    /// Errors: [`LogError::Unavailable`].
    async fn set_batches(&self, id: Uuid, batches: &[Uuid]) -> Result<bool, LogError>;

    /// End a running experiment as `state` (completed or cancelled) at
    /// `at`. False when it is not running (or not `tenant`'s); nothing is
    /// written then.
    ///
    /// Errors: [`LogError::Unavailable`].
    async fn finish_experiment(
        &self,
        tenant: Option<&str>,
        id: Uuid,
        state: ExperimentState,
        at: DateTime<Utc>,
    ) -> Result<bool, LogError>;

    /// Write a cell's grade unless the cell has one: true when this one was
    /// written, false when an earlier grade stands (it is kept as it was).
    ///
    /// Errors: [`LogError::Unavailable`]; a grade of an experiment that
    /// does not exist is [`LogError::NotFound`].
    async fn record_grade(&self, grade: &Grade) -> Result<bool, LogError>;

    /// Every grade of the experiment, by version then cell.
    ///
    /// Errors: as [`EvalStore::dataset`].
    async fn grades(&self, experiment: Uuid) -> Result<Vec<Grade>, LogError>;

    /// How many cells of the experiment are graded (a listing's read).
    ///
    /// Errors: as [`EvalStore::dataset`].
    async fn grade_count(&self, experiment: Uuid) -> Result<u64, LogError>;
}

/// `t` kept to the microsecond, as the stores keep times.
fn micros(t: DateTime<Utc>) -> DateTime<Utc> {
    crate::schedules::micros(t)
}

// ----- in memory -----------------------------------------------------------------------

/// The in-memory twin of [`EvalStore`] (`glia dev`, fast tests).
#[derive(Debug, Default)]
pub struct MemoryEvals {
    inner: Mutex<MemoryInner>,
}

#[derive(Debug, Default)]
struct MemoryInner {
    /// By (tenant, name, version).
    datasets: BTreeMap<(String, String, u32), Dataset>,
    experiments: BTreeMap<Uuid, Experiment>,
    /// Who tends each experiment, until when.
    tended: BTreeMap<Uuid, (Uuid, DateTime<Utc>)>,
    /// By (experiment, version, cell).
    grades: BTreeMap<(Uuid, String, String), Grade>,
}

impl MemoryEvals {
    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn sees(tenant: Option<&str>, owner: &str) -> bool {
    tenant.is_none_or(|t| t == owner)
}

#[async_trait]
impl EvalStore for MemoryEvals {
    async fn put_dataset(
        &self,
        tenant: &str,
        name: &str,
        cases: &str,
        hash: &str,
        count: u32,
        at: DateTime<Utc>,
    ) -> Result<PutDataset, LogError> {
        let mut inner = self.lock();
        let latest = inner
            .datasets
            .range(
                (tenant.to_owned(), name.to_owned(), 0)
                    ..=(tenant.to_owned(), name.to_owned(), u32::MAX),
            )
            .next_back()
            .map(|(_, d)| d.info.clone());
        if let Some(latest) = &latest
            && latest.content_hash == hash
        {
            return Ok(PutDataset::Unchanged(latest.clone()));
        }
        let info = DatasetInfo {
            tenant: tenant.to_owned(),
            name: name.to_owned(),
            version: latest.map_or(1, |l| l.version + 1),
            content_hash: hash.to_owned(),
            cases: count,
            created_at: micros(at),
        };
        inner.datasets.insert(
            (tenant.to_owned(), name.to_owned(), info.version),
            Dataset {
                info: info.clone(),
                cases: cases.to_owned(),
            },
        );
        Ok(PutDataset::Created(info))
    }

    async fn dataset(
        &self,
        tenant: Option<&str>,
        name: &str,
        version: Option<u32>,
    ) -> Result<Option<Dataset>, LogError> {
        let inner = self.lock();
        let mut found = inner
            .datasets
            .values()
            .filter(|d| sees(tenant, &d.info.tenant) && d.info.name == name)
            .filter(|d| version.is_none_or(|v| d.info.version == v));
        // Every tenant's, for `None`: the last of the first tenant found.
        Ok(found.next_back().cloned())
    }

    async fn dataset_info(
        &self,
        tenant: Option<&str>,
        name: &str,
        version: Option<u32>,
    ) -> Result<Option<DatasetInfo>, LogError> {
        Ok(self.dataset(tenant, name, version).await?.map(|d| d.info))
    }

    async fn datasets(&self, tenant: Option<&str>) -> Result<Vec<DatasetInfo>, LogError> {
        let inner = self.lock();
        let mut all: Vec<DatasetInfo> = inner
            .datasets
            .values()
            .filter(|d| sees(tenant, &d.info.tenant))
            .map(|d| d.info.clone())
            .collect();
        all.sort_by(|a, b| (&a.name, a.version, &a.tenant).cmp(&(&b.name, b.version, &b.tenant)));
        all.truncate(MAX_PAGE);
        Ok(all)
    }

    async fn create_experiment(
        &self,
        experiment: &Experiment,
    ) -> Result<(Experiment, bool), LogError> {
        let mut inner = self.lock();
        if let Some(key) = &experiment.idempotency_key
            && let Some(first) = inner
                .experiments
                .values()
                .find(|e| e.tenant == experiment.tenant && e.idempotency_key.as_ref() == Some(key))
        {
            return Ok((first.clone(), false));
        }
        let stored = Experiment {
            created_at: micros(experiment.created_at),
            finished_at: experiment.finished_at.map(micros),
            ..experiment.clone()
        };
        inner.experiments.insert(stored.id, stored.clone());
        Ok((stored, true))
    }

    async fn experiment(
        &self,
        tenant: Option<&str>,
        id: Uuid,
    ) -> Result<Option<Experiment>, LogError> {
        Ok(self
            .lock()
            .experiments
            .get(&id)
            .filter(|e| sees(tenant, &e.tenant))
            .cloned())
    }

    async fn experiments(
        &self,
        tenant: Option<&str>,
        before: Option<Uuid>,
        limit: usize,
    ) -> Result<Vec<Experiment>, LogError> {
        Ok(self
            .lock()
            .experiments
            .values()
            .rev()
            .filter(|e| sees(tenant, &e.tenant))
            .filter(|e| before.is_none_or(|b| e.id < b))
            .take(limit.clamp(1, MAX_PAGE))
            .cloned()
            .collect())
    }

    async fn running_experiments(&self, limit: usize) -> Result<Vec<Experiment>, LogError> {
        let inner = self.lock();
        let mut running: Vec<&Experiment> = inner
            .experiments
            .values()
            .filter(|e| e.state == ExperimentState::Running)
            .collect();
        running.sort_by_key(|e| (inner.tended.get(&e.id).map(|(_, until)| *until), e.id));
        Ok(running
            .into_iter()
            .take(limit.clamp(1, MAX_PAGE))
            .cloned()
            .collect())
    }

    async fn tend(
        &self,
        id: Uuid,
        owner: Uuid,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<bool, LogError> {
        let mut inner = self.lock();
        if inner
            .experiments
            .get(&id)
            .is_none_or(|e| e.state != ExperimentState::Running)
        {
            return Ok(false);
        }
        match inner.tended.get(&id) {
            Some((holder, held_until)) if *holder != owner && *held_until >= now => Ok(false),
            _ => {
                inner.tended.insert(id, (owner, until));
                Ok(true)
            }
        }
    }

    async fn set_batches(&self, id: Uuid, batches: &[Uuid]) -> Result<bool, LogError> {
        let mut inner = self.lock();
        match inner.experiments.get_mut(&id) {
            Some(e) if e.state == ExperimentState::Running => {
                e.batches = batches.to_vec();
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn finish_experiment(
        &self,
        tenant: Option<&str>,
        id: Uuid,
        state: ExperimentState,
        at: DateTime<Utc>,
    ) -> Result<bool, LogError> {
        let mut inner = self.lock();
        match inner.experiments.get_mut(&id) {
            Some(e) if e.state == ExperimentState::Running && sees(tenant, &e.tenant) => {
                e.state = state;
                e.finished_at = Some(micros(at));
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn record_grade(&self, grade: &Grade) -> Result<bool, LogError> {
        let mut inner = self.lock();
        if !inner.experiments.contains_key(&grade.experiment_id) {
            return Err(LogError::NotFound(grade.experiment_id));
        }
        let key = (
            grade.experiment_id,
            grade.version.clone(),
            grade.cell.clone(),
        );
        if inner.grades.contains_key(&key) {
            return Ok(false);
        }
        inner.grades.insert(
            key,
            Grade {
                graded_at: micros(grade.graded_at),
                ..grade.clone()
            },
        );
        Ok(true)
    }

    async fn grades(&self, experiment: Uuid) -> Result<Vec<Grade>, LogError> {
        Ok(self
            .lock()
            .grades
            .range((experiment, String::new(), String::new())..)
            .take_while(|((e, _, _), _)| *e == experiment)
            .map(|(_, g)| g.clone())
            .collect())
    }

    async fn grade_count(&self, experiment: Uuid) -> Result<u64, LogError> {
        Ok(self
            .lock()
            .grades
            .range((experiment, String::new(), String::new())..)
            .take_while(|((e, _, _), _)| *e == experiment)
            .count() as u64)
    }
}

pub(crate) fn batches_text(batches: &[Uuid]) -> String {
    serde_json::to_string(batches).expect("ids serialise")
}

pub(crate) fn batches_of(text: &str) -> Result<Vec<Uuid>, LogError> {
    serde_json::from_str(text).map_err(|e| LogError::Corrupt(format!("experiment batches: {e}")))
}

// ----- Postgres ------------------------------------------------------------------------

mod pg {
    use tokio_postgres::Row;
    use tokio_postgres::error::SqlState;

    use super::*;
    use crate::postgres::{PgLog, col, unavailable};

    const EXPERIMENT: &str = "id, tenant, name, idempotency_key, request_hash, spec, batches, state, created_at, finished_at";
    const INFO: &str = "tenant, name, version, content_hash, case_count, created_at";
    /// The dataset `dataset` and `dataset_info` answer: `$1` tenant (NULL:
    /// any), `$2` name, `$3` version (NULL: the latest).
    const PICK_DATASET: &str = "FROM eval_datasets WHERE ($1::text IS NULL OR tenant = $1) AND name = $2 \
         AND ($3::int IS NULL OR version = $3) ORDER BY version DESC LIMIT 1";

    fn info(row: &Row) -> Result<DatasetInfo, LogError> {
        Ok(DatasetInfo {
            tenant: col(row, "tenant")?,
            name: col(row, "name")?,
            version: col::<i32>(row, "version")?.max(0) as u32,
            content_hash: col(row, "content_hash")?,
            cases: col::<i32>(row, "case_count")?.max(0) as u32,
            created_at: col(row, "created_at")?,
        })
    }

    fn experiment(row: &Row) -> Result<Experiment, LogError> {
        Ok(Experiment {
            id: col(row, "id")?,
            tenant: col(row, "tenant")?,
            name: col(row, "name")?,
            idempotency_key: col(row, "idempotency_key")?,
            request_hash: col(row, "request_hash")?,
            spec: col(row, "spec")?,
            batches: batches_of(&col::<String>(row, "batches")?)?,
            state: ExperimentState::parse(&col::<String>(row, "state")?)?,
            created_at: col(row, "created_at")?,
            finished_at: col(row, "finished_at")?,
        })
    }

    fn grade(row: &Row) -> Result<Grade, LogError> {
        Ok(Grade {
            experiment_id: col(row, "experiment_id")?,
            version: col(row, "version")?,
            cell: col(row, "cell")?,
            run_id: col(row, "run_id")?,
            grade: col(row, "grade")?,
            graded_at: col(row, "graded_at")?,
        })
    }

    fn page(limit: usize) -> i64 {
        limit.clamp(1, MAX_PAGE) as i64
    }

    #[async_trait]
    impl EvalStore for PgLog {
        async fn put_dataset(
            &self,
            tenant: &str,
            name: &str,
            cases: &str,
            hash: &str,
            count: u32,
            at: DateTime<Utc>,
        ) -> Result<PutDataset, LogError> {
            self.bounded("put dataset", async {
                let mut client = self.client().await?;
                let fail = |e: tokio_postgres::Error| unavailable("put dataset", &e);
                // Puts of one name are serialised by a transaction-scoped
                // advisory lock, so each reads the latest version it follows.
                let tx = client.transaction().await.map_err(fail)?;
                tx.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended('glia.eval_datasets:' || $1 || '/' || $2, 0))",
                    &[&tenant, &name],
                )
                .await
                .map_err(fail)?;
                let latest = tx
                    .query_opt(
                        &format!("SELECT {INFO} FROM eval_datasets WHERE tenant = $1 AND name = $2 ORDER BY version DESC LIMIT 1"),
                        &[&tenant, &name],
                    )
                    .await
                    .map_err(fail)?;
                let latest = latest.as_ref().map(info).transpose()?;
                if let Some(latest) = &latest
                    && latest.content_hash == hash
                {
                    return Ok(PutDataset::Unchanged(latest.clone()));
                }
                let version = latest.map_or(1, |l| l.version as i32 + 1);
                let row = tx
                    .query_one(
                        &format!(
                            "INSERT INTO eval_datasets (tenant, name, version, content_hash, case_count, cases, created_at) \
                             VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {INFO}"
                        ),
                        &[&tenant, &name, &version, &hash, &(count as i32), &cases, &at],
                    )
                    .await
                    .map_err(fail)?;
                let created = info(&row)?;
                tx.commit().await.map_err(fail)?;
                Ok(PutDataset::Created(created))
            })
            .await
        }

        async fn dataset(
            &self,
            tenant: Option<&str>,
            name: &str,
            version: Option<u32>,
        ) -> Result<Option<Dataset>, LogError> {
            self.bounded("dataset", async {
                let client = self.client().await?;
                let version = version.map(|v| v.min(i32::MAX as u32) as i32);
                let row = client
                    .query_opt(
                        &format!("SELECT {INFO}, cases {PICK_DATASET}"),
                        &[&tenant, &name, &version],
                    )
                    .await
                    .map_err(|e| unavailable("dataset", &e))?;
                row.map(|r| {
                    Ok(Dataset {
                        info: info(&r)?,
                        cases: col(&r, "cases")?,
                    })
                })
                .transpose()
            })
            .await
        }

        async fn dataset_info(
            &self,
            tenant: Option<&str>,
            name: &str,
            version: Option<u32>,
        ) -> Result<Option<DatasetInfo>, LogError> {
            self.bounded("dataset info", async {
                let client = self.client().await?;
                let version = version.map(|v| v.min(i32::MAX as u32) as i32);
                let row = client
                    .query_opt(
                        &format!("SELECT {INFO} {PICK_DATASET}"),
                        &[&tenant, &name, &version],
                    )
                    .await
                    .map_err(|e| unavailable("dataset info", &e))?;
                row.map(|r| info(&r)).transpose()
            })
            .await
        }

        async fn datasets(&self, tenant: Option<&str>) -> Result<Vec<DatasetInfo>, LogError> {
            self.bounded("datasets", async {
                let client = self.client().await?;
                let rows = client
                    .query(
                        &format!(
                            "SELECT {INFO} FROM eval_datasets WHERE ($1::text IS NULL OR tenant = $1) \
                             ORDER BY name COLLATE \"C\", version, tenant COLLATE \"C\" LIMIT {MAX_PAGE}"
                        ),
                        &[&tenant],
                    )
                    .await
                    .map_err(|e| unavailable("datasets", &e))?;
                rows.iter().map(info).collect()
            })
            .await
        }

        async fn create_experiment(&self, e: &Experiment) -> Result<(Experiment, bool), LogError> {
            self.bounded("create experiment", async {
                let client = self.client().await?;
                let inserted = client
                    .query_opt(
                        &format!(
                            "INSERT INTO eval_experiments ({EXPERIMENT}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
                             ON CONFLICT (tenant, idempotency_key) DO NOTHING RETURNING {EXPERIMENT}"
                        ),
                        &[
                            &e.id,
                            &e.tenant,
                            &e.name,
                            &e.idempotency_key,
                            &e.request_hash,
                            &e.spec,
                            &batches_text(&e.batches),
                            &e.state.as_str(),
                            &e.created_at,
                            &e.finished_at,
                        ],
                    )
                    .await
                    .map_err(|err| unavailable("create experiment", &err))?;
                if let Some(row) = inserted {
                    return Ok((experiment(&row)?, true));
                }
                let first = client
                    .query_one(
                        &format!("SELECT {EXPERIMENT} FROM eval_experiments WHERE tenant = $1 AND idempotency_key = $2"),
                        &[&e.tenant, &e.idempotency_key],
                    )
                    .await
                    .map_err(|err| unavailable("create experiment", &err))?;
                Ok((experiment(&first)?, false))
            })
            .await
        }

        async fn experiment(
            &self,
            tenant: Option<&str>,
            id: Uuid,
        ) -> Result<Option<Experiment>, LogError> {
            self.bounded("experiment", async {
                let client = self.client().await?;
                let row = client
                    .query_opt(
                        &format!("SELECT {EXPERIMENT} FROM eval_experiments WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)"),
                        &[&id, &tenant],
                    )
                    .await
                    .map_err(|e| unavailable("experiment", &e))?;
                row.as_ref().map(experiment).transpose()
            })
            .await
        }

        async fn experiments(
            &self,
            tenant: Option<&str>,
            before: Option<Uuid>,
            limit: usize,
        ) -> Result<Vec<Experiment>, LogError> {
            self.bounded("experiments", async {
                let client = self.client().await?;
                let rows = client
                    .query(
                        &format!(
                            "SELECT {EXPERIMENT} FROM eval_experiments WHERE ($1::text IS NULL OR tenant = $1) \
                             AND ($2::uuid IS NULL OR id < $2) ORDER BY id DESC LIMIT $3"
                        ),
                        &[&tenant, &before, &page(limit)],
                    )
                    .await
                    .map_err(|e| unavailable("experiments", &e))?;
                rows.iter().map(experiment).collect()
            })
            .await
        }

        async fn running_experiments(&self, limit: usize) -> Result<Vec<Experiment>, LogError> {
            self.bounded("running experiments", async {
                let client = self.client().await?;
                let rows = client
                    .query(
                        &format!("SELECT {EXPERIMENT} FROM eval_experiments WHERE state = 'running' ORDER BY tended_until NULLS FIRST, id LIMIT $1"),
                        &[&page(limit)],
                    )
                    .await
                    .map_err(|e| unavailable("running experiments", &e))?;
                rows.iter().map(experiment).collect()
            })
            .await
        }

        async fn tend(
            &self,
            id: Uuid,
            owner: Uuid,
            now: DateTime<Utc>,
            until: DateTime<Utc>,
        ) -> Result<bool, LogError> {
            self.bounded("tend experiment", async {
                let client = self.client().await?;
                let n = client
                    .execute(
                        "UPDATE eval_experiments SET tended_by = $2, tended_until = $4 WHERE id = $1 AND state = 'running' \
                         AND (tended_by IS NULL OR tended_by = $2 OR tended_until < $3)",
                        &[&id, &owner, &now, &until],
                    )
                    .await
                    .map_err(|e| unavailable("tend experiment", &e))?;
                Ok(n > 0)
            })
            .await
        }

        async fn set_batches(&self, id: Uuid, batches: &[Uuid]) -> Result<bool, LogError> {
            self.bounded("set experiment batches", async {
                let client = self.client().await?;
                let n = client
                    .execute(
                        "UPDATE eval_experiments SET batches = $2 WHERE id = $1 AND state = 'running'",
                        &[&id, &batches_text(batches)],
                    )
                    .await
                    .map_err(|e| unavailable("set experiment batches", &e))?;
                Ok(n > 0)
            })
            .await
        }

        async fn finish_experiment(
            &self,
            tenant: Option<&str>,
            id: Uuid,
            state: ExperimentState,
            at: DateTime<Utc>,
        ) -> Result<bool, LogError> {
            self.bounded("finish experiment", async {
                let client = self.client().await?;
                let n = client
                    .execute(
                        "UPDATE eval_experiments SET state = $3, finished_at = $4 \
                         WHERE id = $1 AND ($2::text IS NULL OR tenant = $2) AND state = 'running'",
                        &[&id, &tenant, &state.as_str(), &at],
                    )
                    .await
                    .map_err(|e| unavailable("finish experiment", &e))?;
                Ok(n > 0)
            })
            .await
        }

        async fn record_grade(&self, g: &Grade) -> Result<bool, LogError> {
            self.bounded("record grade", async {
                let client = self.client().await?;
                let n = client
                    .execute(
                        "INSERT INTO eval_grades (experiment_id, version, cell, run_id, grade, graded_at) \
                         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (experiment_id, version, cell) DO NOTHING",
                        &[&g.experiment_id, &g.version, &g.cell, &g.run_id, &g.grade, &g.graded_at],
                    )
                    .await;
                match n {
                    Ok(n) => Ok(n > 0),
                    Err(e) if e.code() == Some(&SqlState::FOREIGN_KEY_VIOLATION) => {
                        Err(LogError::NotFound(g.experiment_id))
                    }
                    Err(e) => Err(unavailable("record grade", &e)),
                }
            })
            .await
        }

        async fn grades(&self, experiment: Uuid) -> Result<Vec<Grade>, LogError> {
            self.bounded("grades", async {
                let client = self.client().await?;
                let rows = client
                    .query(
                        "SELECT experiment_id, version, cell, run_id, grade, graded_at FROM eval_grades \
                         WHERE experiment_id = $1 ORDER BY version COLLATE \"C\", cell COLLATE \"C\"",
                        &[&experiment],
                    )
                    .await
                    .map_err(|e| unavailable("grades", &e))?;
                rows.iter().map(grade).collect()
            })
            .await
        }

        async fn grade_count(&self, experiment: Uuid) -> Result<u64, LogError> {
            self.bounded("grade count", async {
                let client = self.client().await?;
                let row = client
                    .query_one(
                        "SELECT count(*) AS n FROM eval_grades WHERE experiment_id = $1",
                        &[&experiment],
                    )
                    .await
                    .map_err(|e| unavailable("grade count", &e))?;
                Ok(col::<i64>(&row, "n")?.max(0) as u64)
            })
            .await
        }
    }
}
