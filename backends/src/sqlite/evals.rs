//! [`EvalStore`] on the single node's file (migration `012_evals.sql`): the
//! same semantics as the Postgres adapter, which `conformance::evals`
//! (feature `testkit`) checks on both. Writes run on the one writer
//! thread, so a check and the write after it (the next dataset version, an
//! idempotency key free, a cell not yet graded) are one atomic step.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, Row, params};
use uuid::Uuid;

use super::{SqliteLog, db, get, nanos, time, uuid_of};
use crate::LogError;
use crate::evals::{
    Dataset, DatasetInfo, EvalStore, Experiment, ExperimentState, Grade, MAX_PAGE, PutDataset,
    batches_of, batches_text,
};

const EXPERIMENT: &str = "id, tenant, name, idempotency_key, request_hash, spec, batches, state, created_at, finished_at";
const INFO: &str = "tenant, name, version, content_hash, case_count, created_at";
/// The dataset `dataset` and `dataset_info` answer: `?1` tenant (NULL:
/// any), `?2` name, `?3` version (NULL: the latest).
const PICK_DATASET: &str = "FROM eval_datasets WHERE (?1 IS NULL OR tenant = ?1) AND name = ?2 \
     AND (?3 IS NULL OR version = ?3) ORDER BY version DESC LIMIT 1";

fn at(t: DateTime<Utc>) -> i64 {
    nanos(crate::schedules::micros(t))
}

fn info(row: &Row<'_>) -> Result<DatasetInfo, LogError> {
    Ok(DatasetInfo {
        tenant: get(row, "tenant")?,
        name: get(row, "name")?,
        version: get::<i64>(row, "version")?.clamp(0, u32::MAX as i64) as u32,
        content_hash: get(row, "content_hash")?,
        cases: get::<i64>(row, "case_count")?.clamp(0, u32::MAX as i64) as u32,
        created_at: time(get(row, "created_at")?),
    })
}

fn experiment(row: &Row<'_>) -> Result<Experiment, LogError> {
    Ok(Experiment {
        id: uuid_of(&get::<String>(row, "id")?, "experiment id")?,
        tenant: get(row, "tenant")?,
        name: get(row, "name")?,
        idempotency_key: get(row, "idempotency_key")?,
        request_hash: get(row, "request_hash")?,
        spec: get(row, "spec")?,
        batches: batches_of(&get::<String>(row, "batches")?)?,
        state: ExperimentState::parse(&get::<String>(row, "state")?)?,
        created_at: time(get(row, "created_at")?),
        finished_at: get::<Option<i64>>(row, "finished_at")?.map(time),
    })
}

fn grade(row: &Row<'_>) -> Result<Grade, LogError> {
    Ok(Grade {
        experiment_id: uuid_of(&get::<String>(row, "experiment_id")?, "grade experiment")?,
        version: get(row, "version")?,
        cell: get(row, "cell")?,
        run_id: uuid_of(&get::<String>(row, "run_id")?, "grade run")?,
        grade: get(row, "grade")?,
        graded_at: time(get(row, "graded_at")?),
    })
}

fn rows<T>(
    conn: &Connection,
    what: &'static str,
    sql: &str,
    args: impl rusqlite::Params,
    decode: fn(&Row<'_>) -> Result<T, LogError>,
) -> Result<Vec<T>, LogError> {
    let mut st = conn.prepare_cached(sql).map_err(db(what))?;
    let mut rows = st.query(args).map_err(db(what))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(db(what))? {
        out.push(decode(row)?);
    }
    Ok(out)
}

fn experiment_by_id(conn: &Connection, id: &str) -> Result<Option<Experiment>, LogError> {
    rows(
        conn,
        "experiment",
        &format!("SELECT {EXPERIMENT} FROM eval_experiments WHERE id = ?1"),
        [id],
        experiment,
    )
    .map(|mut v| v.pop())
}

#[async_trait]
impl EvalStore for SqliteLog {
    async fn put_dataset(
        &self,
        tenant: &str,
        name: &str,
        cases: &str,
        hash: &str,
        count: u32,
        created: DateTime<Utc>,
    ) -> Result<PutDataset, LogError> {
        let (tenant, name, cases, hash) = (
            tenant.to_owned(),
            name.to_owned(),
            cases.to_owned(),
            hash.to_owned(),
        );
        self.store
            .write("put dataset", move |conn| {
                let latest = rows(
                    conn,
                    "put dataset",
                    &format!("SELECT {INFO} FROM eval_datasets WHERE tenant = ?1 AND name = ?2 ORDER BY version DESC LIMIT 1"),
                    params![tenant, name],
                    info,
                )?
                .pop();
                if let Some(latest) = &latest
                    && latest.content_hash == hash
                {
                    return Ok(PutDataset::Unchanged(latest.clone()));
                }
                let info = DatasetInfo {
                    tenant,
                    name,
                    version: latest.map_or(1, |l| l.version + 1),
                    content_hash: hash,
                    cases: count,
                    created_at: crate::schedules::micros(created),
                };
                conn.execute(
                    "INSERT INTO eval_datasets (tenant, name, version, content_hash, case_count, cases, created_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    params![
                        info.tenant,
                        info.name,
                        info.version as i64,
                        info.content_hash,
                        info.cases as i64,
                        cases,
                        at(info.created_at)
                    ],
                )
                .map_err(db("put dataset"))?;
                Ok(PutDataset::Created(info))
            })
            .await
    }

    async fn dataset(
        &self,
        tenant: Option<&str>,
        name: &str,
        version: Option<u32>,
    ) -> Result<Option<Dataset>, LogError> {
        let (tenant, name) = (tenant.map(str::to_owned), name.to_owned());
        let version = version.map(i64::from);
        self.store
            .read("dataset", move |conn| {
                conn.query_row(
                    &format!("SELECT {INFO}, cases {PICK_DATASET}"),
                    params![tenant, name, version],
                    |row| {
                        Ok(info(row).and_then(|info| {
                            Ok(Dataset {
                                info,
                                cases: get(row, "cases")?,
                            })
                        }))
                    },
                )
                .optional()
                .map_err(db("dataset"))?
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
        let (tenant, name) = (tenant.map(str::to_owned), name.to_owned());
        let version = version.map(i64::from);
        self.store
            .read("dataset info", move |conn| {
                conn.query_row(
                    &format!("SELECT {INFO} {PICK_DATASET}"),
                    params![tenant, name, version],
                    |row| Ok(info(row)),
                )
                .optional()
                .map_err(db("dataset info"))?
                .transpose()
            })
            .await
    }

    async fn datasets(&self, tenant: Option<&str>) -> Result<Vec<DatasetInfo>, LogError> {
        let tenant = tenant.map(str::to_owned);
        self.store
            .read("datasets", move |conn| {
                rows(
                    conn,
                    "datasets",
                    &format!(
                        "SELECT {INFO} FROM eval_datasets WHERE (?1 IS NULL OR tenant = ?1) ORDER BY name, version, tenant LIMIT {MAX_PAGE}"
                    ),
                    params![tenant],
                    info,
                )
            })
            .await
    }

    async fn create_experiment(&self, e: &Experiment) -> Result<(Experiment, bool), LogError> {
        let e = e.clone();
        self.store
            .write("create experiment", move |conn| {
                if let Some(key) = &e.idempotency_key {
                    let first = rows(
                        conn,
                        "create experiment",
                        &format!("SELECT {EXPERIMENT} FROM eval_experiments WHERE tenant = ?1 AND idempotency_key = ?2"),
                        params![e.tenant, key],
                        experiment,
                    )?
                    .pop();
                    if let Some(first) = first {
                        return Ok((first, false));
                    }
                }
                let id = e.id.to_string();
                conn.execute(
                    &format!("INSERT INTO eval_experiments ({EXPERIMENT}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"),
                    params![
                        id,
                        e.tenant,
                        e.name,
                        e.idempotency_key,
                        e.request_hash,
                        e.spec,
                        batches_text(&e.batches),
                        e.state.as_str(),
                        at(e.created_at),
                        e.finished_at.map(at),
                    ],
                )
                .map_err(db("create experiment"))?;
                let stored = experiment_by_id(conn, &id)?.ok_or_else(|| {
                    LogError::Unavailable("create experiment: the row vanished".into())
                })?;
                Ok((stored, true))
            })
            .await
    }

    async fn experiment(
        &self,
        tenant: Option<&str>,
        id: Uuid,
    ) -> Result<Option<Experiment>, LogError> {
        let tenant = tenant.map(str::to_owned);
        self.store
            .read("experiment", move |conn| {
                Ok(experiment_by_id(conn, &id.to_string())?
                    .filter(|e| tenant.as_deref().is_none_or(|t| e.tenant == t)))
            })
            .await
    }

    async fn experiments(
        &self,
        tenant: Option<&str>,
        before: Option<Uuid>,
        limit: usize,
    ) -> Result<Vec<Experiment>, LogError> {
        let tenant = tenant.map(str::to_owned);
        let before = before.map(|b| b.to_string());
        let limit = limit.clamp(1, MAX_PAGE) as i64;
        self.store
            .read("experiments", move |conn| {
                rows(
                    conn,
                    "experiments",
                    &format!(
                        "SELECT {EXPERIMENT} FROM eval_experiments WHERE (?1 IS NULL OR tenant = ?1) \
                         AND (?2 IS NULL OR id < ?2) ORDER BY id DESC LIMIT ?3"
                    ),
                    params![tenant, before, limit],
                    experiment,
                )
            })
            .await
    }

    async fn running_experiments(&self, limit: usize) -> Result<Vec<Experiment>, LogError> {
        let limit = limit.clamp(1, MAX_PAGE) as i64;
        self.store
            .read("running experiments", move |conn| {
                rows(
                    conn,
                    "running experiments",
                    &format!("SELECT {EXPERIMENT} FROM eval_experiments WHERE state = 'running' ORDER BY tended_until NULLS FIRST, id LIMIT ?1"),
                    params![limit],
                    experiment,
                )
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
        self.store
            .write("tend experiment", move |conn| {
                let n = conn
                    .execute(
                        "UPDATE eval_experiments SET tended_by = ?2, tended_until = ?4 WHERE id = ?1 AND state = 'running' \
                         AND (tended_by IS NULL OR tended_by = ?2 OR tended_until < ?3)",
                        params![id.to_string(), owner.to_string(), at(now), at(until)],
                    )
                    .map_err(db("tend experiment"))?;
                Ok(n > 0)
            })
            .await
    }

    async fn set_batches(&self, id: Uuid, batches: &[Uuid]) -> Result<bool, LogError> {
        let text = batches_text(batches);
        self.store
            .write("set experiment batches", move |conn| {
                let n = conn
                    .execute(
                        "UPDATE eval_experiments SET batches = ?2 WHERE id = ?1 AND state = 'running'",
                        params![id.to_string(), text],
                    )
                    .map_err(db("set experiment batches"))?;
                Ok(n > 0)
            })
            .await
    }

    async fn finish_experiment(
        &self,
        tenant: Option<&str>,
        id: Uuid,
        state: ExperimentState,
        when: DateTime<Utc>,
    ) -> Result<bool, LogError> {
        let tenant = tenant.map(str::to_owned);
        self.store
            .write("finish experiment", move |conn| {
                let n = conn
                    .execute(
                        "UPDATE eval_experiments SET state = ?3, finished_at = ?4 \
                         WHERE id = ?1 AND (?2 IS NULL OR tenant = ?2) AND state = 'running'",
                        params![id.to_string(), tenant, state.as_str(), at(when)],
                    )
                    .map_err(db("finish experiment"))?;
                Ok(n > 0)
            })
            .await
    }

    async fn record_grade(&self, g: &Grade) -> Result<bool, LogError> {
        let g = g.clone();
        self.store
            .write("record grade", move |conn| {
                let experiment = g.experiment_id.to_string();
                if experiment_by_id(conn, &experiment)?.is_none() {
                    return Err(LogError::NotFound(g.experiment_id));
                }
                let n = conn
                    .execute(
                        "INSERT INTO eval_grades (experiment_id, version, cell, run_id, grade, graded_at) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (experiment_id, version, cell) DO NOTHING",
                        params![
                            experiment,
                            g.version,
                            g.cell,
                            g.run_id.to_string(),
                            g.grade,
                            at(g.graded_at)
                        ],
                    )
                    .map_err(db("record grade"))?;
                Ok(n > 0)
            })
            .await
    }

    async fn grades(&self, experiment: Uuid) -> Result<Vec<Grade>, LogError> {
        self.store
            .read("grades", move |conn| {
                rows(
                    conn,
                    "grades",
                    "SELECT experiment_id, version, cell, run_id, grade, graded_at FROM eval_grades \
                     WHERE experiment_id = ?1 ORDER BY version, cell",
                    [experiment.to_string()],
                    grade,
                )
            })
            .await
    }

    async fn grade_count(&self, experiment: Uuid) -> Result<u64, LogError> {
        self.store
            .read("grade count", move |conn| {
                let n: i64 = conn
                    .query_row(
                        "SELECT count(*) FROM eval_grades WHERE experiment_id = ?1",
                        [experiment.to_string()],
                        |row| row.get(0),
                    )
                    .map_err(db("grade count"))?;
                Ok(n.max(0) as u64)
            })
            .await
    }
}
