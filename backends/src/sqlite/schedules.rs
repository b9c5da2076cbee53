//! [`ScheduleStore`] on the single node's file (migration
//! `010_schedules.sql`): the same semantics as the Postgres adapter, which
//! `conformance::schedules` (feature `testkit`) checks on both. Writes run on
//! the one writer thread, so a check and the write after it (the name is
//! free, the revision is the stored one) are one atomic step.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, Row, params};
use uuid::Uuid;

use super::{SqliteLog, db, get, nanos, time, uuid_of};
use crate::LogError;
use crate::schedules::{MAX_PAGE, Saved, Schedule, ScheduleStore};

const COLUMNS: &str = "id, tenant, name, spec, paused, cursor_at, next_due_at, last_run_id, buffered_at, last_error, revision, created_at, updated_at";

fn schedule(row: &Row<'_>) -> Result<Schedule, LogError> {
    Ok(Schedule {
        id: uuid_of(&get::<String>(row, "id")?, "schedule id")?,
        tenant: get(row, "tenant")?,
        name: get(row, "name")?,
        spec: get(row, "spec")?,
        paused: get::<i64>(row, "paused")? != 0,
        cursor: time(get(row, "cursor_at")?),
        next_due_at: get::<Option<i64>>(row, "next_due_at")?.map(time),
        last_run_id: get::<Option<String>>(row, "last_run_id")?
            .map(|t| uuid_of(&t, "schedule last_run_id"))
            .transpose()?,
        buffered: get::<Option<i64>>(row, "buffered_at")?.map(time),
        last_error: get(row, "last_error")?,
        revision: get::<i64>(row, "revision")?.max(0) as u64,
        created_at: time(get(row, "created_at")?),
        updated_at: time(get(row, "updated_at")?),
    })
}

/// Nanoseconds of `t` kept to the microsecond, as Postgres keeps it.
fn at(t: DateTime<Utc>) -> i64 {
    nanos(crate::schedules::micros(t))
}

fn by_id(conn: &Connection, id: &str) -> Result<Option<Schedule>, LogError> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM schedules WHERE id = ?1"),
        [id],
        |row| Ok(schedule(row)),
    )
    .optional()
    .map_err(db("schedule"))?
    .transpose()
}

fn name_taken(conn: &Connection, tenant: &str, name: &str, id: &str) -> Result<bool, LogError> {
    conn.query_row(
        "SELECT 1 FROM schedules WHERE tenant = ?1 AND name = ?2 AND id <> ?3",
        [tenant, name, id],
        |_| Ok(()),
    )
    .optional()
    .map_err(db("schedule name"))
    .map(|found| found.is_some())
}

fn collect(
    conn: &Connection,
    sql: &str,
    args: impl rusqlite::Params,
) -> Result<Vec<Schedule>, LogError> {
    let mut st = conn.prepare_cached(sql).map_err(db("schedules"))?;
    let mut rows = st.query(args).map_err(db("schedules"))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(db("schedules"))? {
        out.push(schedule(row)?);
    }
    Ok(out)
}

#[async_trait]
impl ScheduleStore for SqliteLog {
    async fn create(&self, s: &Schedule) -> Result<Saved, LogError> {
        let s = s.clone();
        self.store
            .write("create schedule", move |conn| {
                let id = s.id.to_string();
                if by_id(conn, &id)?.is_some() {
                    return Ok(Saved::Stale);
                }
                if name_taken(conn, &s.tenant, &s.name, &id)? {
                    return Ok(Saved::NameTaken);
                }
                conn.execute(
                    &format!("INSERT INTO schedules ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 1, ?11, ?12)"),
                    params![
                        id,
                        s.tenant,
                        s.name,
                        s.spec,
                        s.paused as i64,
                        at(s.cursor),
                        s.next_due_at.map(at),
                        s.last_run_id.map(|r| r.to_string()),
                        s.buffered.map(at),
                        s.last_error,
                        at(s.created_at),
                        at(s.updated_at),
                    ],
                )
                .map_err(db("create schedule"))?;
                Ok(Saved::Saved(by_id(conn, &id)?.ok_or_else(|| {
                    LogError::Unavailable("create schedule: the row vanished".into())
                })?))
            })
            .await
    }

    async fn schedule(&self, tenant: Option<&str>, id: Uuid) -> Result<Option<Schedule>, LogError> {
        let tenant = tenant.map(str::to_owned);
        self.store
            .read("schedule", move |conn| {
                Ok(by_id(conn, &id.to_string())?
                    .filter(|s| tenant.as_deref().is_none_or(|t| s.tenant == t)))
            })
            .await
    }

    async fn schedules(
        &self,
        tenant: Option<&str>,
        after: Option<Uuid>,
        limit: usize,
    ) -> Result<Vec<Schedule>, LogError> {
        let tenant = tenant.map(str::to_owned);
        let after = after.map(|a| a.to_string());
        let limit = limit.clamp(1, MAX_PAGE) as i64;
        self.store
            .read("schedules", move |conn| {
                collect(
                    conn,
                    &format!(
                        "SELECT {COLUMNS} FROM schedules WHERE (?1 IS NULL OR tenant = ?1) AND (?2 IS NULL OR id > ?2) ORDER BY id LIMIT ?3"
                    ),
                    params![tenant, after, limit],
                )
            })
            .await
    }

    async fn save(&self, s: &Schedule) -> Result<Saved, LogError> {
        let s = s.clone();
        self.store
            .write("save schedule", move |conn| {
                let id = s.id.to_string();
                let Some(current) = by_id(conn, &id)? else {
                    return Ok(Saved::Stale);
                };
                if current.revision != s.revision {
                    return Ok(Saved::Stale);
                }
                if name_taken(conn, &current.tenant, &s.name, &id)? {
                    return Ok(Saved::NameTaken);
                }
                conn.execute(
                    "UPDATE schedules SET name = ?2, spec = ?3, paused = ?4, cursor_at = ?5, next_due_at = ?6, last_run_id = ?7, \
                            buffered_at = ?8, last_error = ?9, updated_at = ?10, revision = revision + 1 WHERE id = ?1",
                    params![
                        id,
                        s.name,
                        s.spec,
                        s.paused as i64,
                        at(s.cursor),
                        s.next_due_at.map(at),
                        s.last_run_id.map(|r| r.to_string()),
                        s.buffered.map(at),
                        s.last_error,
                        at(s.updated_at),
                    ],
                )
                .map_err(db("save schedule"))?;
                Ok(Saved::Saved(by_id(conn, &id)?.ok_or_else(|| {
                    LogError::Unavailable("save schedule: the row vanished".into())
                })?))
            })
            .await
    }

    async fn delete(&self, tenant: Option<&str>, id: Uuid) -> Result<bool, LogError> {
        let tenant = tenant.map(str::to_owned);
        self.store
            .write("delete schedule", move |conn| {
                let n = conn
                    .execute(
                        "DELETE FROM schedules WHERE id = ?1 AND (?2 IS NULL OR tenant = ?2)",
                        params![id.to_string(), tenant],
                    )
                    .map_err(db("delete schedule"))?;
                Ok(n > 0)
            })
            .await
    }

    async fn due(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Schedule>, LogError> {
        let now = nanos(now);
        let limit = limit.clamp(1, MAX_PAGE) as i64;
        self.store
            .read("due schedules", move |conn| {
                collect(
                    conn,
                    &format!(
                        "SELECT {COLUMNS} FROM schedules WHERE paused = 0 AND (next_due_at <= ?1 OR buffered_at IS NOT NULL) \
                         ORDER BY next_due_at IS NULL, next_due_at, id LIMIT ?2"
                    ),
                    params![now, limit],
                )
            })
            .await
    }
}
