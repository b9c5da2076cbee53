//! [`BatchStore`] on the single node's file (migration
//! `003_batches.sql`): the same semantics as the Postgres adapter, which
//! `conformance::batch_store` (feature `testkit`) checks on both.
//!
//! One difference, from the single writer: a write cannot stay open while
//! the next chunk of an upload arrives, so [`BatchStore::submit`] writes the
//! batch row as `uploading` (not `managed`: no read of batches sees it),
//! each chunk of items in a write of its own, and makes the batch `managed`
//! and `active` in its last write, where the idempotency key is checked
//! again. An upload that is refused, cut off or dropped by its caller is
//! deleted (an `Uploading` guard); one left by a process that died is
//! deleted by the next [`SqliteLog::open`] (the parent's `recover_batches`,
//! which also releases the dead process's admission claims). So a refused
//! batch stores nothing that anyone sees, and an upload never holds memory
//! beyond its current chunk.
//!
//! Reads that must agree with each other (spend: finished items and the
//! live runs' events) run in one read transaction, one WAL snapshot.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use futures::StreamExt;
use futures::stream::BoxStream;
use glia_proto::EventKind;
use rusqlite::{Connection, OptionalExtension, Row, params};
use uuid::Uuid;

use super::{SqliteLog, Store, db, get, i64_of, nanos, parse, time, ttl_nanos, uuid_of};
use crate::batches::{
    Batch, BatchState, BatchStore, Claim, ItemView, Lane, NewBatch, SubmitError, Submitted, Upload,
    WINDOW_ENDED, window_ended,
};
use crate::{LogError, Spend, SpendCap};

const BATCH_COLUMNS: &str = "id, tenant, spec, request_hash, state, max_in_flight, cap_tokens, cap_usd_micros, expires_at, items_total, created_at, updated_at";

/// What a caller sees of an item: the item's own state, or its run's (as
/// the Postgres adapter's).
const STATUS: &str = concat!(
    "CASE WHEN i.state IN ('queued', 'admitting') THEN 'queued' \
     WHEN i.state IN ('expired', 'cancelled') THEN i.state \
     WHEN r.id IS NULL THEN 'failed' \
     WHEN i.error = '",
    window_ended!(),
    "' AND r.status = 'done' AND json_extract(r.outcome, '$.kind') = 'cancelled' THEN 'expired' \
     WHEN r.status = 'done' THEN coalesce(json_extract(r.outcome, '$.kind'), 'failed') \
     WHEN r.status = 'parked' THEN 'parked:' || coalesce(json_extract(r.pull_point, '$.kind'), 'unknown') \
     ELSE 'running' END"
);

fn number(row: &Row<'_>, name: &str) -> Result<Option<u64>, LogError> {
    Ok(get::<Option<i64>>(row, name)?.map(|v| v.max(0) as u64))
}

fn batch(row: &Row<'_>) -> Result<Batch, LogError> {
    Ok(Batch {
        id: uuid_of(&get::<String>(row, "id")?, "batch id")?,
        tenant: get(row, "tenant")?,
        spec: get::<Option<String>>(row, "spec")?.unwrap_or_default(),
        request_hash: get::<Option<String>>(row, "request_hash")?.unwrap_or_default(),
        state: BatchState::parse(&get::<String>(row, "state")?)?,
        max_in_flight: get::<Option<i64>>(row, "max_in_flight")?
            .map(|v| v.clamp(1, u32::MAX as i64) as u32),
        cap: SpendCap {
            tokens: number(row, "cap_tokens")?,
            cost_usd_micros: number(row, "cap_usd_micros")?,
        },
        expires_at: get::<Option<i64>>(row, "expires_at")?.map(time),
        items_total: number(row, "items_total")?.unwrap_or(0),
        created_at: time(get(row, "created_at")?),
        updated_at: time(get(row, "updated_at")?),
    })
}

fn opt_i64(v: Option<u64>) -> Option<i64> {
    v.map(i64_of)
}

/// The spend of `run_id` from its events.
fn run_spend(conn: &Connection, run_id: &str) -> Result<Spend, LogError> {
    let mut st = conn
        .prepare_cached(&format!(
            "SELECT payload FROM events WHERE run_id = ?1 AND kind IN {}",
            *super::SPEND_KINDS
        ))
        .map_err(db("batch spend"))?;
    let mut rows = st.query([run_id]).map_err(db("batch spend"))?;
    let mut spend = Spend::ZERO;
    while let Some(row) = rows.next().map_err(db("batch spend"))? {
        let kind: EventKind = parse(&get::<String>(row, "payload")?, "batch spend event")?;
        spend = spend.saturating_add(Spend::of_event(&kind).unwrap_or_default());
    }
    Ok(spend)
}

/// Counts by [`STATUS`] of the items of the batches `filter` selects.
fn counts_where(
    conn: &Connection,
    filter: &str,
    args: impl rusqlite::Params,
) -> Result<BTreeMap<String, u64>, LogError> {
    let sql = format!(
        "SELECT {STATUS} AS status, count(*) AS n FROM batch_items i LEFT JOIN runs r ON r.id = i.run_id WHERE {filter} GROUP BY 1"
    );
    let mut st = conn.prepare_cached(&sql).map_err(db("batch counts"))?;
    let mut rows = st.query(args).map_err(db("batch counts"))?;
    let mut out = BTreeMap::new();
    while let Some(row) = rows.next().map_err(db("batch counts"))? {
        *out.entry(get::<String>(row, "status")?).or_insert(0) += number(row, "n")?.unwrap_or(0);
    }
    Ok(out)
}

/// Deletes an unfinished upload when dropped (refused, cut off, or its
/// caller went away), unless [`Uploading::finished`] was called.
struct Uploading {
    store: std::sync::Arc<Store>,
    id: Uuid,
    done: bool,
}

impl Uploading {
    fn finished(mut self) {
        self.done = true;
    }
}

impl Drop for Uploading {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let (store, id) = (self.store.clone(), self.id.to_string());
        let forget = async move {
            let deleted = store
                .write("forget batch upload", move |conn| forget_upload(conn, &id))
                .await;
            if let Err(e) = deleted {
                tracing::warn!(error = %e, "an unfinished batch upload was not deleted; the next open deletes it");
            }
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(forget);
        }
    }
}

/// Delete upload `id` (its items, then its row), if it is still uploading.
fn forget_upload(conn: &Connection, id: &str) -> Result<(), LogError> {
    conn.execute("DELETE FROM batch_items WHERE batch_id = ?1 AND EXISTS (SELECT 1 FROM batches WHERE id = ?1 AND state = 'uploading')", [id])
        .map_err(db("forget batch upload"))?;
    conn.execute(
        "DELETE FROM batches WHERE id = ?1 AND state = 'uploading'",
        [id],
    )
    .map_err(db("forget batch upload"))?;
    Ok(())
}

/// The managed batch of `tenant` with idempotency `key`.
fn by_key(conn: &Connection, tenant: &str, key: &str) -> Result<Option<Batch>, LogError> {
    conn.query_row(&format!("SELECT {BATCH_COLUMNS} FROM batches WHERE tenant = ?1 AND idempotency_key = ?2 AND managed = 1"), [tenant, key], |row| {
        Ok(batch(row))
    })
    .optional()
    .map_err(db("submit batch"))?
    .transpose()
}

#[async_trait]
impl BatchStore for SqliteLog {
    async fn submit(
        &self,
        new: NewBatch,
        mut upload: BoxStream<'_, Result<Upload, SubmitError>>,
    ) -> Result<Submitted, SubmitError> {
        let store = &self.store;
        let earlier = match new.idempotency_key.clone() {
            None => None,
            Some(key) => {
                let tenant = new.tenant.clone();
                store
                    .read("submit batch", move |conn| by_key(conn, &tenant, &key))
                    .await?
            }
        };
        if let Some(batch) = earlier {
            // An idempotent repeat: its items are read to the end (for the
            // hash the caller compares), not stored.
            while let Some(next) = upload.next().await {
                if let Upload::Done { request_hash } = next? {
                    return Ok(Submitted {
                        batch,
                        created: false,
                        upload_hash: request_hash,
                    });
                }
            }
            return Err(SubmitError::Truncated);
        }
        let id = new.id.to_string();
        {
            let (id, new) = (id.clone(), new.clone());
            store
                .write("submit batch", move |conn| {
                    let now = nanos(Utc::now());
                    conn.execute(
                        "INSERT INTO batches (id, tenant, created_at, managed, idempotency_key, spec, state, max_in_flight, cap_tokens, cap_usd_micros, \
                                              expires_at, updated_at) \
                         VALUES (?1, ?2, ?3, 0, ?4, ?5, 'uploading', ?6, ?7, ?8, ?9, ?3)",
                        params![
                            id,
                            new.tenant,
                            now,
                            new.idempotency_key,
                            new.spec,
                            new.max_in_flight.map(i64::from),
                            opt_i64(new.cap.tokens),
                            opt_i64(new.cap.cost_usd_micros),
                            new.expires_at.map(nanos)
                        ],
                    )
                    .map_err(db("submit batch"))?;
                    Ok(())
                })
                .await?;
        }
        let guard = Uploading {
            store: store.clone(),
            id: new.id,
            done: false,
        };
        let mut total: u64 = 0;
        let request_hash = loop {
            let Some(next) = upload.next().await else {
                return Err(SubmitError::Truncated);
            };
            match next? {
                Upload::Done { request_hash } => break request_hash,
                Upload::Items(items) => {
                    let (id, from) = (id.clone(), total);
                    let count = items.len() as u64;
                    let duplicate = store
                        .write("submit batch items", move |conn| {
                            let mut st = conn
                                .prepare_cached(
                                    "INSERT INTO batch_items (batch_id, n, custom_id, goal, metadata, config, tags, recorded_tools) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT DO NOTHING",
                                )
                                .map_err(db("submit batch items"))?;
                            for (i, item) in items.into_iter().enumerate() {
                                let n = i64_of(from + i as u64);
                                if st.execute(params![id, n, item.custom_id, item.goal, item.metadata, item.config, item.tags, item.recorded_tools]).map_err(db("submit batch items"))? == 0 {
                                    return Ok(Some((item.line, item.custom_id)));
                                }
                            }
                            Ok(None)
                        })
                        .await?;
                    if let Some((line, custom_id)) = duplicate {
                        return Err(SubmitError::DuplicateCustomId { line, custom_id });
                    }
                    total += count;
                }
            }
        };
        let (tenant, key, hash) = (
            new.tenant.clone(),
            new.idempotency_key.clone(),
            request_hash.clone(),
        );
        let (batch, created) = store
            .write("submit batch", move |conn| {
                // A submit with the same key that finished meanwhile wins.
                if let Some(key) = key
                    && let Some(first) = by_key(conn, &tenant, &key)?
                {
                    forget_upload(conn, &id)?;
                    return Ok((first, false));
                }
                let sql = format!(
                    "UPDATE batches SET managed = 1, state = 'active', request_hash = ?2, items_total = ?3, updated_at = ?4 \
                     WHERE id = ?1 AND state = 'uploading' RETURNING {BATCH_COLUMNS}"
                );
                let row = conn.query_row(&sql, params![id, hash, i64_of(total), nanos(Utc::now())], |row| Ok(batch(row))).map_err(db("submit batch"))?;
                Ok((row?, true))
            })
            .await?;
        guard.finished();
        Ok(Submitted {
            batch,
            created,
            upload_hash: request_hash,
        })
    }

    async fn batch(&self, tenant: Option<&str>, id: Uuid) -> Result<Option<Batch>, LogError> {
        let tenant = tenant.map(str::to_owned);
        self.store
            .read("batch", move |conn| {
                let sql = format!("SELECT {BATCH_COLUMNS} FROM batches WHERE id = ?1 AND managed = 1 AND (?2 IS NULL OR tenant = ?2)");
                conn.query_row(&sql, params![id.to_string(), tenant], |row| Ok(batch(row))).optional().map_err(db("batch"))?.transpose()
            })
            .await
    }

    async fn batches(
        &self,
        tenant: Option<&str>,
        after: Option<Uuid>,
        limit: usize,
    ) -> Result<Vec<Batch>, LogError> {
        let tenant = tenant.map(str::to_owned);
        self.store
            .read("batches", move |conn| {
                let sql = format!(
                    "SELECT {BATCH_COLUMNS} FROM batches WHERE managed = 1 AND (?1 IS NULL OR tenant = ?1) AND (?2 IS NULL OR id > ?2) ORDER BY id LIMIT ?3"
                );
                let mut st = conn.prepare_cached(&sql).map_err(db("batches"))?;
                let mut rows = st.query(params![tenant, after.map(|a| a.to_string()), limit.clamp(1, 1000) as i64]).map_err(db("batches"))?;
                let mut out = Vec::new();
                while let Some(row) = rows.next().map_err(db("batches"))? {
                    out.push(batch(row)?);
                }
                Ok(out)
            })
            .await
    }

    async fn counts(&self, id: Uuid) -> Result<BTreeMap<String, u64>, LogError> {
        self.store
            .read("batch counts", move |conn| {
                counts_where(conn, "i.batch_id = ?1", [id.to_string()])
            })
            .await
    }

    async fn spend(&self, id: Uuid) -> Result<Spend, LogError> {
        self.store
            .read("batch spend", move |conn| {
                // One snapshot: an item the sweep finishes meanwhile counts once.
                let tx = conn.transaction().map_err(db("batch spend"))?;
                let (tokens, cost): (i64, i64) = tx
                    .query_row(
                        "SELECT coalesce(sum(tokens), 0), coalesce(sum(cost_usd_micros), 0) FROM batch_items WHERE batch_id = ?1 AND state = 'finished'",
                        [id.to_string()],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .map_err(db("batch spend"))?;
                let mut spend = Spend { tokens: tokens.max(0) as u64, cost_usd_micros: cost.max(0) as u64 };
                let live: Vec<String> = {
                    let mut st = tx.prepare_cached("SELECT run_id FROM batch_items WHERE batch_id = ?1 AND state = 'running'").map_err(db("batch spend"))?;
                    st.query_map([id.to_string()], |r| r.get(0)).and_then(|rows| rows.collect()).map_err(db("batch spend"))?
                };
                for run in live {
                    spend = spend.saturating_add(run_spend(&tx, &run)?);
                }
                Ok(spend)
            })
            .await
    }

    async fn items(&self, id: Uuid, from: u64, limit: usize) -> Result<Vec<ItemView>, LogError> {
        self.store
            .read("batch items", move |conn| {
                let sql = format!(
                    "SELECT i.n, i.custom_id, i.metadata, {STATUS} AS status, i.run_id, r.outcome, r.pull_point, i.state, i.tokens, i.cost_usd_micros, i.error \
                     FROM batch_items i LEFT JOIN runs r ON r.id = i.run_id WHERE i.batch_id = ?1 AND i.n >= ?2 ORDER BY i.n LIMIT ?3"
                );
                let mut st = conn.prepare_cached(&sql).map_err(db("batch items"))?;
                let mut rows = st.query(params![id.to_string(), i64_of(from), limit.clamp(1, 10_000) as i64]).map_err(db("batch items"))?;
                let mut out = Vec::new();
                while let Some(row) = rows.next().map_err(db("batch items"))? {
                    let finished = get::<String>(row, "state")? == "finished";
                    let spend = Spend { tokens: number(row, "tokens")?.unwrap_or(0), cost_usd_micros: number(row, "cost_usd_micros")?.unwrap_or(0) };
                    out.push(ItemView {
                        n: number(row, "n")?.unwrap_or(0),
                        custom_id: get(row, "custom_id")?,
                        metadata: get(row, "metadata")?,
                        status: get(row, "status")?,
                        run_id: get::<Option<String>>(row, "run_id")?.map(|r| uuid_of(&r, "batch item run id")).transpose()?,
                        outcome: get::<Option<String>>(row, "outcome")?.map(|o| parse(&o, "run outcome")).transpose()?,
                        pull_point: get::<Option<String>>(row, "pull_point")?.map(|p| parse(&p, "run pull point")).transpose()?,
                        spend: finished.then_some(spend),
                        error: get(row, "error")?,
                    });
                }
                Ok(out)
            })
            .await
    }

    async fn update(
        &self,
        tenant: Option<&str>,
        id: Uuid,
        state: Option<BatchState>,
        cap: Option<SpendCap>,
    ) -> Result<Option<Batch>, LogError> {
        let tenant = tenant.map(str::to_owned);
        self.store
            .write("update batch", move |conn| {
                let sql = format!(
                    "UPDATE batches SET state = CASE WHEN state = 'cancelled' THEN state ELSE coalesce(?3, state) END, \
                            cap_tokens = CASE WHEN ?4 THEN ?5 ELSE cap_tokens END, cap_usd_micros = CASE WHEN ?4 THEN ?6 ELSE cap_usd_micros END, \
                            updated_at = ?7 \
                     WHERE id = ?1 AND managed = 1 AND (?2 IS NULL OR tenant = ?2) RETURNING {BATCH_COLUMNS}"
                );
                let args = params![
                    id.to_string(),
                    tenant,
                    state.map(BatchState::as_str),
                    cap.is_some(),
                    opt_i64(cap.and_then(|c| c.tokens)),
                    opt_i64(cap.and_then(|c| c.cost_usd_micros)),
                    nanos(Utc::now())
                ];
                let Some(updated) = conn.query_row(&sql, args, |row| Ok(batch(row))).optional().map_err(db("update batch"))?.transpose()? else {
                    return Ok(None);
                };
                if updated.state == BatchState::Cancelled {
                    conn.execute("UPDATE batch_items SET state = 'cancelled' WHERE batch_id = ?1 AND state = 'queued'", [id.to_string()])
                        .map_err(db("update batch"))?;
                }
                Ok(Some(updated))
            })
            .await
    }

    async fn live_runs(&self, id: Uuid) -> Result<Vec<Uuid>, LogError> {
        self.store
            .read("batch runs", move |conn| {
                let mut st = conn.prepare_cached("SELECT run_id FROM batch_items WHERE batch_id = ?1 AND state = 'running' ORDER BY n").map_err(db("batch runs"))?;
                let ids: Vec<String> = st.query_map([id.to_string()], |r| r.get(0)).and_then(|rows| rows.collect()).map_err(db("batch runs"))?;
                ids.iter().map(|r| uuid_of(r, "batch item run id")).collect()
            })
            .await
    }

    async fn lanes(&self) -> Result<Vec<Lane>, LogError> {
        self.store
            .read("batch lanes", move |conn| {
                let mut st = conn
                    .prepare_cached(
                        "SELECT b.id, b.tenant, b.state, b.max_in_flight, b.cap_tokens, b.cap_usd_micros, \
                                (SELECT count(*) FROM batch_items i WHERE i.batch_id = b.id AND i.state IN ('admitting', 'running')) AS in_flight, \
                                (SELECT count(*) FROM batch_items i WHERE i.batch_id = b.id AND i.state IN ('queued', 'admitting')) AS waiting \
                         FROM batches b WHERE b.managed = 1 AND b.id IN ( \
                             SELECT batch_id FROM batch_items WHERE state IN ('queued', 'admitting', 'running')) \
                         ORDER BY b.id",
                    )
                    .map_err(db("batch lanes"))?;
                let mut rows = st.query([]).map_err(db("batch lanes"))?;
                let mut out = Vec::new();
                while let Some(row) = rows.next().map_err(db("batch lanes"))? {
                    out.push(Lane {
                        batch_id: uuid_of(&get::<String>(row, "id")?, "batch id")?,
                        tenant: get(row, "tenant")?,
                        state: BatchState::parse(&get::<String>(row, "state")?)?,
                        max_in_flight: get::<Option<i64>>(row, "max_in_flight")?.map(|v| v.clamp(1, u32::MAX as i64) as u32),
                        cap: SpendCap { tokens: number(row, "cap_tokens")?, cost_usd_micros: number(row, "cap_usd_micros")? },
                        in_flight: number(row, "in_flight")?.unwrap_or(0),
                        waiting: number(row, "waiting")?.unwrap_or(0),
                    });
                }
                Ok(out)
            })
            .await
    }

    async fn claim(
        &self,
        batch: Uuid,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<Claim>, LogError> {
        self.store
            .write("claim batch items", move |conn| {
                let now = nanos(Utc::now());
                // `state IN (…)` as written in the partial index `batch_items_open`, so that it is used.
                let mut st = conn
                    .prepare_cached(
                        "UPDATE batch_items SET state = 'admitting', claimed_at = ?3 \
                         WHERE batch_id = ?1 AND n IN (SELECT n FROM batch_items \
                             WHERE batch_id = ?1 AND state IN ('queued', 'admitting') AND (state = 'queued' OR claimed_at < ?4) \
                             ORDER BY n LIMIT ?2) \
                         RETURNING n, custom_id, goal, config, metadata, tags, recorded_tools",
                    )
                    .map_err(db("claim batch items"))?;
                let mut rows = st.query(params![batch.to_string(), limit as i64, now, now.saturating_sub(ttl_nanos(lease))]).map_err(db("claim batch items"))?;
                let mut claims = Vec::new();
                while let Some(row) = rows.next().map_err(db("claim batch items"))? {
                    claims.push(Claim {
                        batch_id: batch,
                        n: number(row, "n")?.unwrap_or(0),
                        custom_id: get(row, "custom_id")?,
                        goal: get(row, "goal")?,
                        config: get(row, "config")?,
                        metadata: get(row, "metadata")?,
                        tags: get(row, "tags")?,
                        recorded_tools: get(row, "recorded_tools")?,
                    });
                }
                claims.sort_by_key(|c| c.n);
                Ok(claims)
            })
            .await
    }

    async fn admitted(&self, batch: Uuid, n: u64, run_id: Uuid) -> Result<BatchState, LogError> {
        self.store
            .write("admitted", move |conn| {
                conn.execute(
                    "UPDATE batch_items SET state = 'running', run_id = ?3, claimed_at = NULL \
                     WHERE batch_id = ?1 AND n = ?2 AND state IN ('admitting', 'queued', 'cancelled', 'expired')",
                    params![batch.to_string(), i64_of(n), run_id.to_string()],
                )
                .map_err(db("admitted"))?;
                let state: Option<String> =
                    conn.query_row("SELECT state FROM batches WHERE id = ?1", [batch.to_string()], |r| r.get(0)).optional().map_err(db("admitted"))?;
                BatchState::parse(&state.ok_or(LogError::NotFound(batch))?)
            })
            .await
    }

    async fn refused(&self, batch: Uuid, n: u64, error: &str) -> Result<(), LogError> {
        let error = error.to_owned();
        self.store
            .write("refused", move |conn| {
                conn.execute(
                    "UPDATE batch_items SET state = 'finished', error = ?3, claimed_at = NULL, tokens = 0, cost_usd_micros = 0 WHERE batch_id = ?1 AND n = ?2",
                    params![batch.to_string(), i64_of(n), error],
                )
                .map_err(db("refused"))?;
                Ok(())
            })
            .await
    }

    async fn expire_runs(&self, limit: usize) -> Result<Vec<Uuid>, LogError> {
        let runs: Vec<String> = self
            .store
            .write("expire batch runs", move |conn| {
                let mut st = conn
                    .prepare_cached(
                        "UPDATE batch_items SET error = ?3 WHERE (batch_id, n) IN ( \
                             SELECT i.batch_id, i.n FROM batch_items i JOIN batches b ON b.id = i.batch_id JOIN runs r ON r.id = i.run_id \
                             WHERE i.state = 'running' AND b.expires_at < ?2 AND r.status <> 'done' LIMIT ?1) \
                         RETURNING run_id",
                    )
                    .map_err(db("expire batch runs"))?;
                st.query_map(params![limit as i64, nanos(Utc::now()), WINDOW_ENDED], |r| r.get(0)).and_then(|rows| rows.collect()).map_err(db("expire batch runs"))
            })
            .await?;
        runs.iter().map(|r| uuid_of(r, "run id")).collect()
    }

    async fn sweep(&self, limit: usize) -> Result<u64, LogError> {
        // Read the items whose runs are done and their spend, then fold it in
        // (only into items still running: a second sweep changes nothing).
        let done: Vec<(String, i64, Spend)> = self
            .store
            .read("batch sweep", move |conn| {
                let tx = conn.transaction().map_err(db("batch sweep"))?;
                let rows: Vec<(String, i64, String)> = {
                    let mut st = tx
                        .prepare_cached(
                            "SELECT i.batch_id, i.n, i.run_id FROM batch_items i JOIN runs r ON r.id = i.run_id \
                             WHERE i.state = 'running' AND r.status = 'done' LIMIT ?1",
                        )
                        .map_err(db("batch sweep"))?;
                    st.query_map([limit as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).and_then(|rows| rows.collect()).map_err(db("batch sweep"))?
                };
                let done: Vec<(String, i64, Spend)> = rows.into_iter().map(|(batch, n, run)| Ok((batch, n, run_spend(&tx, &run)?))).collect::<Result<_, LogError>>()?;
                Ok(done)
            })
            .await?;
        self.store
            .write("batch sweep", move |conn| {
                let mut changed = 0;
                {
                    let mut st = conn
                        .prepare_cached(
                            "UPDATE batch_items SET state = 'finished', tokens = ?3, cost_usd_micros = ?4 WHERE batch_id = ?1 AND n = ?2 AND state = 'running'",
                        )
                        .map_err(db("batch sweep"))?;
                    for (batch, n, spend) in &done {
                        changed += st.execute(params![batch, n, i64_of(spend.tokens), i64_of(spend.cost_usd_micros)]).map_err(db("batch sweep"))?;
                    }
                }
                let expired = conn
                    .execute(
                        "UPDATE batch_items SET state = 'expired' WHERE (batch_id, n) IN ( \
                             SELECT i.batch_id, i.n FROM batch_items i JOIN batches b ON b.id = i.batch_id \
                             WHERE i.state = 'queued' AND b.expires_at < ?2 LIMIT ?1)",
                        params![limit as i64, nanos(Utc::now())],
                    )
                    .map_err(db("batch sweep"))?;
                Ok((changed + expired) as u64)
            })
            .await
    }

    async fn gauges(&self) -> Result<BTreeMap<String, u64>, LogError> {
        self.store
            .read("batch gauges", move |conn| {
                counts_where(conn, "i.batch_id IN (SELECT DISTINCT batch_id FROM batch_items WHERE state IN ('queued', 'admitting', 'running'))", [])
            })
            .await
    }
}
