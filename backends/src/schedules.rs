//! Schedules: a tenant's recurring run starts (cron or interval), and the
//! bookkeeping of the dispatchers that fire them.
//!
//! The store keeps a schedule's definition as the dispatcher validated it
//! ([`Schedule::spec`], opaque JSON text: the store knows nothing of cron
//! expressions, zones or run configs) and the scheduler's bookkeeping:
//!
//! - [`Schedule::cursor`]: the last nominal fire time handled (or the time
//!   fire times count from: creation, unpause, a change of the spec);
//! - [`Schedule::next_due_at`]: when the scheduler must look next (the next
//!   nominal fire time plus its jitter; `None`: never);
//! - [`Schedule::last_run_id`]: the last run a firing started (the overlap
//!   policies look at its status);
//! - [`Schedule::buffered`]: one nominal fire time waiting for the last run
//!   to end (overlap policy `buffer_one`);
//! - [`Schedule::last_error`]: why the last firing could not start its run.
//!
//! Every write goes through [`ScheduleStore::save`], a compare-and-set on
//! [`Schedule::revision`]: two dispatchers that handled the same fire time
//! never both record it (the run itself is created once whatever happens:
//! its idempotency key is the schedule's id and the nominal fire time), and
//! an edit through the API made while a dispatcher worked makes that
//! dispatcher's write stale, so it reads the schedule again.
//!
//! Times are the caller's (the scheduler's injectable clock), kept to the
//! microsecond. Postgres implements [`ScheduleStore`]
//! ([`PgLog`](crate::postgres::PgLog), migration V17), so do the single
//! node's file ([`SqliteLog`](crate::sqlite::SqliteLog), migration 010) and
//! the in-memory twin [`MemorySchedules`]; `conformance::schedules`
//! (feature `testkit`) holds all three to the same semantics.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::LogError;

/// A stored schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// Its id (UUID v7).
    pub id: Uuid,
    /// The tenant that owns it; its runs are the tenant's.
    pub tenant: String,
    /// Its name, unique within the tenant.
    pub name: String,
    /// The definition as the dispatcher validated it: JSON text, opaque to
    /// the store.
    pub spec: String,
    /// A paused schedule fires nothing and is never [`ScheduleStore::due`].
    pub paused: bool,
    /// The last nominal fire time handled; fire times after it are pending.
    pub cursor: DateTime<Utc>,
    /// When the scheduler must look next (the next nominal fire time plus
    /// its jitter); `None`: no further fire time.
    pub next_due_at: Option<DateTime<Utc>>,
    /// The run the last firing started, if any.
    pub last_run_id: Option<Uuid>,
    /// A nominal fire time waiting for [`Schedule::last_run_id`] to end
    /// (overlap policy `buffer_one`).
    pub buffered: Option<DateTime<Utc>>,
    /// Why the last firing started no run (`None` once one did).
    pub last_error: Option<String>,
    /// Grows by one with every write ([`ScheduleStore::save`]); from 1.
    pub revision: u64,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was last written.
    pub updated_at: DateTime<Utc>,
}

/// The answer to a write ([`ScheduleStore::create`], [`ScheduleStore::save`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Saved {
    /// Written; the schedule as stored (its new revision).
    Saved(Schedule),
    /// Not written: the stored revision is not the one given (another
    /// writer came first), or the schedule no longer exists. Read it again.
    Stale,
    /// Not written: the tenant has another schedule of this name.
    NameTaken,
}

/// Most schedules one [`ScheduleStore::schedules`] or
/// [`ScheduleStore::due`] call answers.
pub const MAX_PAGE: usize = 1000;

/// Storage of schedules. Methods taking `tenant` see only that tenant's
/// schedules (`None`: every tenant's, for admins and the scheduler); another
/// tenant's schedule reads exactly like a missing one.
#[async_trait]
pub trait ScheduleStore: Send + Sync {
    /// Store a new schedule as given, at revision 1 (the given revision is
    /// ignored). [`Saved::NameTaken`] when its tenant has a schedule of that
    /// name; nothing is written then. Creating an id that exists is
    /// [`Saved::Stale`].
    ///
    /// Errors: [`LogError::Unavailable`] when the store fails.
    async fn create(&self, schedule: &Schedule) -> Result<Saved, LogError>;

    /// The schedule `id`, if `tenant` (or anyone, for `None`) sees it.
    ///
    /// Errors: [`LogError::Unavailable`]; [`LogError::Corrupt`] for a row
    /// that does not decode.
    async fn schedule(&self, tenant: Option<&str>, id: Uuid) -> Result<Option<Schedule>, LogError>;

    /// The tenant's schedules (every tenant's for `None`) by id, after
    /// `after`, at most `limit` (1 to [`MAX_PAGE`]; clamped).
    ///
    /// Errors: as [`ScheduleStore::schedule`].
    async fn schedules(
        &self,
        tenant: Option<&str>,
        after: Option<Uuid>,
        limit: usize,
    ) -> Result<Vec<Schedule>, LogError>;

    /// Write every mutable field of `schedule` (name, spec, paused, cursor,
    /// next due time, last run, buffered time, last error, updated time) if
    /// the stored revision is `schedule.revision`; the stored revision then
    /// grows by one. [`Saved::Stale`] when it is not (or the schedule is
    /// gone), [`Saved::NameTaken`] when the new name is another schedule's
    /// of the tenant; nothing is written then. The tenant, id and creation
    /// time never change.
    ///
    /// Errors: [`LogError::Unavailable`] when the store fails.
    async fn save(&self, schedule: &Schedule) -> Result<Saved, LogError>;

    /// Delete the schedule; false when `tenant` has no such schedule. The
    /// runs it started stay.
    ///
    /// Errors: [`LogError::Unavailable`].
    async fn delete(&self, tenant: Option<&str>, id: Uuid) -> Result<bool, LogError>;

    /// Schedules of every tenant the scheduler must look at `now`: not
    /// paused, and due (`next_due_at <= now`) or holding a buffered fire
    /// time; the earliest due first (buffered ones without a due time
    /// last), at most `limit` (1 to [`MAX_PAGE`]; clamped).
    ///
    /// Errors: as [`ScheduleStore::schedule`].
    async fn due(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Schedule>, LogError>;
}

/// True when `s` is one [`ScheduleStore::due`] answers at `now` (the rule
/// the in-memory twin applies as the SQL adapters do).
pub fn is_due(s: &Schedule, now: DateTime<Utc>) -> bool {
    !s.paused && (s.next_due_at.is_some_and(|t| t <= now) || s.buffered.is_some())
}

/// `t` kept to the microsecond, as the stores keep times.
pub fn micros(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
}

fn stored(mut s: Schedule) -> Schedule {
    s.cursor = micros(s.cursor);
    s.next_due_at = s.next_due_at.map(micros);
    s.buffered = s.buffered.map(micros);
    s.created_at = micros(s.created_at);
    s.updated_at = micros(s.updated_at);
    s
}

// ----- in memory -----------------------------------------------------------------------

/// The in-memory twin of [`ScheduleStore`] (`glia dev`, fast tests).
#[derive(Debug, Default)]
pub struct MemorySchedules {
    inner: Mutex<BTreeMap<Uuid, Schedule>>,
}

impl MemorySchedules {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<Uuid, Schedule>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn name_taken(map: &BTreeMap<Uuid, Schedule>, s: &Schedule) -> bool {
    map.values()
        .any(|o| o.id != s.id && o.tenant == s.tenant && o.name == s.name)
}

#[async_trait]
impl ScheduleStore for MemorySchedules {
    async fn create(&self, schedule: &Schedule) -> Result<Saved, LogError> {
        let mut map = self.map();
        if map.contains_key(&schedule.id) {
            return Ok(Saved::Stale);
        }
        if name_taken(&map, schedule) {
            return Ok(Saved::NameTaken);
        }
        let s = stored(Schedule {
            revision: 1,
            ..schedule.clone()
        });
        map.insert(s.id, s.clone());
        Ok(Saved::Saved(s))
    }

    async fn schedule(&self, tenant: Option<&str>, id: Uuid) -> Result<Option<Schedule>, LogError> {
        Ok(self
            .map()
            .get(&id)
            .filter(|s| tenant.is_none_or(|t| s.tenant == t))
            .cloned())
    }

    async fn schedules(
        &self,
        tenant: Option<&str>,
        after: Option<Uuid>,
        limit: usize,
    ) -> Result<Vec<Schedule>, LogError> {
        Ok(self
            .map()
            .values()
            .filter(|s| tenant.is_none_or(|t| s.tenant == t))
            .filter(|s| after.is_none_or(|a| s.id > a))
            .take(limit.clamp(1, MAX_PAGE))
            .cloned()
            .collect())
    }

    async fn save(&self, schedule: &Schedule) -> Result<Saved, LogError> {
        let mut map = self.map();
        let Some(current) = map.get(&schedule.id) else {
            return Ok(Saved::Stale);
        };
        if current.revision != schedule.revision {
            return Ok(Saved::Stale);
        }
        let next = stored(Schedule {
            tenant: current.tenant.clone(),
            created_at: current.created_at,
            revision: current.revision + 1,
            ..schedule.clone()
        });
        if name_taken(&map, &next) {
            return Ok(Saved::NameTaken);
        }
        map.insert(next.id, next.clone());
        Ok(Saved::Saved(next))
    }

    async fn delete(&self, tenant: Option<&str>, id: Uuid) -> Result<bool, LogError> {
        let mut map = self.map();
        match map.get(&id) {
            Some(s) if tenant.is_none_or(|t| s.tenant == t) => {
                map.remove(&id);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn due(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Schedule>, LogError> {
        let mut due: Vec<Schedule> = self
            .map()
            .values()
            .filter(|s| is_due(s, now))
            .cloned()
            .collect();
        due.sort_by_key(|s| (s.next_due_at.is_none(), s.next_due_at, s.id));
        due.truncate(limit.clamp(1, MAX_PAGE));
        Ok(due)
    }
}

// ----- Postgres ------------------------------------------------------------------------

mod pg {
    use tokio_postgres::Row;
    use tokio_postgres::error::SqlState;

    use super::*;
    use crate::postgres::{PgLog, col, unavailable};

    const COLUMNS: &str = "id, tenant, name, spec, paused, cursor_at, next_due_at, last_run_id, buffered_at, last_error, revision, created_at, updated_at";

    fn schedule(row: &Row) -> Result<Schedule, LogError> {
        Ok(Schedule {
            id: col(row, "id")?,
            tenant: col(row, "tenant")?,
            name: col(row, "name")?,
            spec: col(row, "spec")?,
            paused: col(row, "paused")?,
            cursor: col(row, "cursor_at")?,
            next_due_at: col(row, "next_due_at")?,
            last_run_id: col(row, "last_run_id")?,
            buffered: col(row, "buffered_at")?,
            last_error: col(row, "last_error")?,
            revision: col::<i64>(row, "revision")?.max(0) as u64,
            created_at: col(row, "created_at")?,
            updated_at: col(row, "updated_at")?,
        })
    }

    fn is_unique(e: &tokio_postgres::Error) -> bool {
        e.code() == Some(&SqlState::UNIQUE_VIOLATION)
    }

    fn unique_on_name(e: &tokio_postgres::Error) -> bool {
        is_unique(e)
            && e.as_db_error()
                .and_then(|d| d.constraint())
                .is_some_and(|c| c.contains("name"))
    }

    #[async_trait]
    impl ScheduleStore for PgLog {
        async fn create(&self, s: &Schedule) -> Result<Saved, LogError> {
            self.bounded("create schedule", async {
                let client = self.client().await?;
                let sql = format!(
                    "INSERT INTO schedules ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 1, $11, $12) RETURNING {COLUMNS}"
                );
                match client
                    .query_one(
                        &sql,
                        &[
                            &s.id,
                            &s.tenant,
                            &s.name,
                            &s.spec,
                            &s.paused,
                            &s.cursor,
                            &s.next_due_at,
                            &s.last_run_id,
                            &s.buffered,
                            &s.last_error,
                            &s.created_at,
                            &s.updated_at,
                        ],
                    )
                    .await
                {
                    Ok(row) => Ok(Saved::Saved(schedule(&row)?)),
                    Err(e) if unique_on_name(&e) => Ok(Saved::NameTaken),
                    Err(e) if is_unique(&e) => Ok(Saved::Stale),
                    Err(e) => Err(unavailable("create schedule", &e)),
                }
            })
            .await
        }

        async fn schedule(
            &self,
            tenant: Option<&str>,
            id: Uuid,
        ) -> Result<Option<Schedule>, LogError> {
            self.bounded("schedule", async {
                let client = self.client().await?;
                let sql = format!("SELECT {COLUMNS} FROM schedules WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)");
                let row = client.query_opt(&sql, &[&id, &tenant]).await.map_err(|e| unavailable("schedule", &e))?;
                row.as_ref().map(schedule).transpose()
            })
            .await
        }

        async fn schedules(
            &self,
            tenant: Option<&str>,
            after: Option<Uuid>,
            limit: usize,
        ) -> Result<Vec<Schedule>, LogError> {
            self.bounded("schedules", async {
                let client = self.client().await?;
                let sql = format!(
                    "SELECT {COLUMNS} FROM schedules WHERE ($1::text IS NULL OR tenant = $1) AND ($2::uuid IS NULL OR id > $2) ORDER BY id LIMIT $3"
                );
                let rows = client
                    .query(&sql, &[&tenant, &after, &(limit.clamp(1, MAX_PAGE) as i64)])
                    .await
                    .map_err(|e| unavailable("schedules", &e))?;
                rows.iter().map(schedule).collect()
            })
            .await
        }

        async fn save(&self, s: &Schedule) -> Result<Saved, LogError> {
            self.bounded("save schedule", async {
                let client = self.client().await?;
                let sql = format!(
                    "UPDATE schedules SET name = $3, spec = $4, paused = $5, cursor_at = $6, next_due_at = $7, last_run_id = $8, \
                            buffered_at = $9, last_error = $10, updated_at = $11, revision = revision + 1 \
                     WHERE id = $1 AND revision = $2 RETURNING {COLUMNS}"
                );
                let revision = i64::try_from(s.revision).unwrap_or(i64::MAX);
                match client
                    .query_opt(
                        &sql,
                        &[
                            &s.id,
                            &revision,
                            &s.name,
                            &s.spec,
                            &s.paused,
                            &s.cursor,
                            &s.next_due_at,
                            &s.last_run_id,
                            &s.buffered,
                            &s.last_error,
                            &s.updated_at,
                        ],
                    )
                    .await
                {
                    Ok(Some(row)) => Ok(Saved::Saved(schedule(&row)?)),
                    Ok(None) => Ok(Saved::Stale),
                    Err(e) if is_unique(&e) => Ok(Saved::NameTaken),
                    Err(e) => Err(unavailable("save schedule", &e)),
                }
            })
            .await
        }

        async fn delete(&self, tenant: Option<&str>, id: Uuid) -> Result<bool, LogError> {
            self.bounded("delete schedule", async {
                let client = self.client().await?;
                let n = client
                    .execute(
                        "DELETE FROM schedules WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)",
                        &[&id, &tenant],
                    )
                    .await
                    .map_err(|e| unavailable("delete schedule", &e))?;
                Ok(n > 0)
            })
            .await
        }

        async fn due(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Schedule>, LogError> {
            self.bounded("due schedules", async {
                let client = self.client().await?;
                let sql = format!(
                    "SELECT {COLUMNS} FROM schedules WHERE NOT paused AND (next_due_at <= $1 OR buffered_at IS NOT NULL) \
                     ORDER BY next_due_at NULLS LAST, id LIMIT $2"
                );
                let rows = client
                    .query(&sql, &[&now, &(limit.clamp(1, MAX_PAGE) as i64)])
                    .await
                    .map_err(|e| unavailable("due schedules", &e))?;
                rows.iter().map(schedule).collect()
            })
            .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_means_active_and_past_its_time_or_buffered() {
        let now = Utc::now();
        let s = Schedule {
            id: Uuid::now_v7(),
            tenant: "t".into(),
            name: "n".into(),
            spec: "{}".into(),
            paused: false,
            cursor: now,
            next_due_at: Some(now),
            last_run_id: None,
            buffered: None,
            last_error: None,
            revision: 1,
            created_at: now,
            updated_at: now,
        };
        assert!(is_due(&s, now));
        assert!(!is_due(&s, now - chrono::Duration::milliseconds(1)));
        let paused = Schedule {
            paused: true,
            ..s.clone()
        };
        assert!(!is_due(&paused, now));
        let buffered = Schedule {
            next_due_at: None,
            buffered: Some(now),
            ..s
        };
        assert!(is_due(&buffered, now - chrono::Duration::days(1)));
    }
}
