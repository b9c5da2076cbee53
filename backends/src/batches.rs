//! Batches as first-class objects: a submission of many items (goals) run
//! with one configuration, admitted progressively by the dispatcher.
//!
//! The store keeps a batch (its specification as the dispatcher wrote it,
//! its options and its state) and its items in submission order. It knows
//! nothing of run configurations: the specification is opaque JSON text.
//! The dispatcher (`glia_dispatcher::batches`) parses submissions, streams
//! their items into [`BatchStore::submit`] (one transaction: a bad item
//! refuses the whole batch and nothing is stored), and runs the admission
//! loop over [`BatchStore::lanes`], [`BatchStore::claim`],
//! [`BatchStore::admitted`] and [`BatchStore::sweep`].
//!
//! Item states (`batch_items.state`, migration V8): `queued` → `admitting`
//! (claimed by an admission pass; a claim older than its lease is claimed
//! again) → `running` (its run exists) → `finished` (its run is done, its
//! spend folded in); or `expired` (completion window) / `cancelled` (batch
//! cancelled) before admission. What a caller sees ([`ItemView::status`])
//! folds in the run: `queued`, `running`, `parked:{pull point}`,
//! `succeeded`, `failed`, `cancelled`, `expired`.
//!
//! When a batch's completion window ends, items not started expire
//! ([`BatchStore::sweep`]), and the runs still going are ended too:
//! [`BatchStore::expire_runs`] marks their items (`error` =
//! [`WINDOW_ENDED`], still `running`) and answers the runs for the
//! dispatcher to cancel; an item so marked whose run ended `cancelled`
//! shows `expired` (a run that finished on its own first keeps its outcome).
//!
//! Postgres implements [`BatchStore`] ([`PgLog`](crate::postgres::PgLog)),
//! and so do the single node's file ([`SqliteLog`](crate::sqlite::SqliteLog),
//! in `sqlite/batches.rs`) and the in-memory twin [`MemoryBatches`] (over
//! any event log); `conformance::batch_store` (feature `testkit`) holds all three to
//! the same semantics.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use glia_proto::{Outcome, PullPoint};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{LogError, Spend, SpendCap};

/// The literal of [`WINDOW_ENDED`], for the adapters' SQL.
macro_rules! window_ended {
    () => {
        "completion window ended"
    };
}
pub(crate) use window_ended;

/// The `error` of an item whose run the end of its batch's completion
/// window cancels ([`BatchStore::expire_runs`]): with its run ended
/// `cancelled`, the item shows `expired`.
pub const WINDOW_ENDED: &str = window_ended!();

/// Whether a batch admits items.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchState {
    /// Items are admitted as capacity allows.
    Active,
    /// No new admissions; the dispatcher gives the runs admitted an operator
    /// pause (they park at `paused` at their next step boundary).
    Paused,
    /// No new admissions; unadmitted items are `cancelled`, runs were cancelled.
    Cancelled,
}

impl BatchState {
    /// `active`, `paused` or `cancelled` (the column's values).
    pub fn as_str(self) -> &'static str {
        match self {
            BatchState::Active => "active",
            BatchState::Paused => "paused",
            BatchState::Cancelled => "cancelled",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<BatchState, LogError> {
        match s {
            "active" => Ok(BatchState::Active),
            "paused" => Ok(BatchState::Paused),
            "cancelled" => Ok(BatchState::Cancelled),
            other => Err(LogError::Unavailable(format!(
                "corrupt row: batch state {other:?}"
            ))),
        }
    }
}

/// A batch to create.
#[derive(Debug, Clone, PartialEq)]
pub struct NewBatch {
    /// Its id (UUIDv7).
    pub id: Uuid,
    /// Owning tenant.
    pub tenant: String,
    /// Per-tenant idempotency key: a second submit with it returns the first batch.
    pub idempotency_key: Option<String>,
    /// The submission without its items, JSON text (opaque to the store).
    pub spec: String,
    /// Most runs of this batch not done at once (`None`: only the tenant's and the fleet's caps).
    pub max_in_flight: Option<u32>,
    /// Spend cap of the whole batch; reached, no item is admitted.
    pub cap: SpendCap,
    /// Items not admitted by then expire.
    pub expires_at: Option<DateTime<Utc>>,
}

/// One item to store.
#[derive(Debug, Clone, PartialEq)]
pub struct NewItem {
    /// Unique within the batch; 1 to 255 characters.
    pub custom_id: String,
    /// The run's goal, as it will be submitted.
    pub goal: String,
    /// JSON text of the item's metadata object (string values), echoed in
    /// results and given to its run ([`crate::RunSummary::metadata`]).
    pub metadata: Option<String>,
    /// JSON text of the item's tags (an array of strings), given to its run.
    pub tags: Option<String>,
    /// JSON text of the item's configuration patch: a JSON merge patch
    /// (RFC 7396) applied to the batch's run configuration for this item's
    /// run; the store keeps it as given.
    pub config: Option<String>,
    /// JSON text of the item's recorded tools
    /// ([`glia_proto::recorded::RecordedTools`]): its run's calls are
    /// answered from them.
    pub recorded_tools: Option<String>,
    /// Where the item is in the caller's input (a JSON Lines line number, an
    /// array index), for errors; not stored.
    pub line: u64,
}

/// What a submission stream yields: items in chunks, then the hash of the
/// whole request (an idempotent repeat must hash the same).
#[derive(Debug, Clone, PartialEq)]
pub enum Upload {
    /// The next items, in order.
    Items(Vec<NewItem>),
    /// The end of the submission: SHA-256 (hex) of the request.
    Done {
        /// SHA-256 (hex).
        request_hash: String,
    },
}

/// Why a submission was refused. Nothing of it is stored.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The input itself is bad (raised by the stream's producer); `item` is
    /// where the item is in the caller's input ([`NewItem::line`]) when one is to blame.
    #[error("{reason}")]
    Input {
        /// [`NewItem::line`] of the item.
        item: Option<u64>,
        /// Which field, when one is to blame (`custom_id`, `goal`, …).
        field: Option<String>,
        /// Why.
        reason: String,
    },
    /// Two items share a `custom_id`; `line` is the second one's [`NewItem::line`].
    #[error("item at {line}: custom_id {custom_id:?} is used by an earlier item")]
    DuplicateCustomId {
        /// [`NewItem::line`] of the repeat.
        line: u64,
        /// The id.
        custom_id: String,
    },
    /// The stream ended without [`Upload::Done`] (the upload was cut off).
    #[error("the upload ended early")]
    Truncated,
    /// The producer's own error, passed through as is.
    #[error("{0}")]
    Other(Box<dyn std::error::Error + Send + Sync>),
    /// The store failed.
    #[error(transparent)]
    Log(#[from] LogError),
}

/// A stored batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    /// Its id.
    pub id: Uuid,
    /// Owning tenant.
    pub tenant: String,
    /// The submission without its items, JSON text.
    pub spec: String,
    /// SHA-256 (hex) of the submitted request.
    pub request_hash: String,
    /// Active, paused or cancelled.
    pub state: BatchState,
    /// See [`NewBatch::max_in_flight`].
    pub max_in_flight: Option<u32>,
    /// See [`NewBatch::cap`].
    pub cap: SpendCap,
    /// See [`NewBatch::expires_at`].
    pub expires_at: Option<DateTime<Utc>>,
    /// Number of items.
    pub items_total: u64,
    /// Submission time.
    pub created_at: DateTime<Utc>,
    /// Last change of state or options.
    pub updated_at: DateTime<Utc>,
}

/// Answer of [`BatchStore::submit`].
#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    /// The batch (the earlier one on an idempotent repeat).
    pub batch: Batch,
    /// False on an idempotent repeat: nothing was stored, and the caller
    /// compares [`Batch::request_hash`] with [`Submitted::upload_hash`].
    pub created: bool,
    /// The hash this submission's stream ended with ([`Upload::Done`]).
    pub upload_hash: String,
}

/// A batch with items waiting or runs in flight, as the admission loop sees
/// it (a paused or cancelled one still holds its runs' slots).
#[derive(Debug, Clone, PartialEq)]
pub struct Lane {
    /// The batch.
    pub batch_id: Uuid,
    /// Its tenant.
    pub tenant: String,
    /// Only an active batch admits.
    pub state: BatchState,
    /// Its own cap on runs in flight.
    pub max_in_flight: Option<u32>,
    /// Its spend cap.
    pub cap: SpendCap,
    /// Items `admitting` or `running`.
    pub in_flight: u64,
    /// Items `queued` (or `admitting` with a lapsed claim).
    pub waiting: u64,
}

/// An item claimed for admission.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The batch.
    pub batch_id: Uuid,
    /// The item's index.
    pub n: u64,
    /// Its custom id.
    pub custom_id: String,
    /// Its goal.
    pub goal: String,
    /// Its configuration patch ([`NewItem::config`]).
    pub config: Option<String>,
    /// Its metadata ([`NewItem::metadata`]).
    pub metadata: Option<String>,
    /// Its tags ([`NewItem::tags`]).
    pub tags: Option<String>,
    /// Its recorded tools ([`NewItem::recorded_tools`]).
    pub recorded_tools: Option<String>,
}

/// One item with its run, for results.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemView {
    /// Index, from 0.
    pub n: u64,
    /// The caller's id.
    pub custom_id: String,
    /// Metadata JSON text, as submitted.
    pub metadata: Option<String>,
    /// `queued`, `running`, `parked:{pull point kind}`, `succeeded`, `failed`, `cancelled` or `expired`.
    pub status: String,
    /// Its run, once admitted.
    pub run_id: Option<Uuid>,
    /// How the run ended.
    pub outcome: Option<Outcome>,
    /// Where the run waits.
    pub pull_point: Option<PullPoint>,
    /// Spend of a finished item (`None` before).
    pub spend: Option<Spend>,
    /// Why admission refused it (no run).
    pub error: Option<String>,
}

/// Storage of batches and their items. Methods taking `tenant` see only that
/// tenant's batches (`None`: every tenant's, for admins).
#[async_trait]
pub trait BatchStore: Send + Sync {
    /// Store `batch` and the items `upload` yields, in one transaction: an
    /// `Err` from the stream, a duplicate `custom_id` or a stream that ends
    /// without [`Upload::Done`] rolls everything back. With an
    /// `idempotency_key` the tenant used before, the stream is still read to
    /// its end (so the caller can hash it) and the earlier batch is returned
    /// with `created: false`.
    async fn submit(
        &self,
        batch: NewBatch,
        upload: BoxStream<'_, Result<Upload, SubmitError>>,
    ) -> Result<Submitted, SubmitError>;

    /// One batch (only managed ones: submitted through [`BatchStore::submit`]).
    async fn batch(&self, tenant: Option<&str>, id: Uuid) -> Result<Option<Batch>, LogError>;

    /// Batches by id (creation order) after `after`, at most `limit`.
    async fn batches(
        &self,
        tenant: Option<&str>,
        after: Option<Uuid>,
        limit: usize,
    ) -> Result<Vec<Batch>, LogError>;

    /// Items by [`ItemView::status`].
    async fn counts(&self, id: Uuid) -> Result<BTreeMap<String, u64>, LogError>;

    /// What the batch's runs spent so far (finished and live).
    async fn spend(&self, id: Uuid) -> Result<Spend, LogError>;

    /// Items with index `>= from`, in order, at most `limit`.
    async fn items(&self, id: Uuid, from: u64, limit: usize) -> Result<Vec<ItemView>, LogError>;

    /// Change the state (and, with `Some`, the spend cap). Cancelling also
    /// cancels every `queued` item. `None` when there is no such batch; a
    /// cancelled batch stays cancelled (the answer shows it).
    async fn update(
        &self,
        tenant: Option<&str>,
        id: Uuid,
        state: Option<BatchState>,
        cap: Option<SpendCap>,
    ) -> Result<Option<Batch>, LogError>;

    /// Runs of the batch not done (items `running`).
    async fn live_runs(&self, id: Uuid) -> Result<Vec<Uuid>, LogError>;

    /// Batches with items waiting or runs in flight, with their counts.
    async fn lanes(&self) -> Result<Vec<Lane>, LogError>;

    /// Claim up to `limit` waiting items of `batch` in order (`admitting`;
    /// a claim older than `lease` is taken again).
    async fn claim(
        &self,
        batch: Uuid,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<Claim>, LogError>;

    /// The claimed item `n` has its run: `running`. Answers the batch's state
    /// (a cancel may have come meanwhile: the caller cancels the run).
    async fn admitted(&self, batch: Uuid, n: u64, run_id: Uuid) -> Result<BatchState, LogError>;

    /// The claimed item `n` cannot run (admission refused it): `finished`
    /// with `error` and no run.
    async fn refused(&self, batch: Uuid, n: u64, error: &str) -> Result<(), LogError>;

    /// Runs of batches past their completion window that are not done, at
    /// most `limit`: their items (still `running`) get `error` =
    /// [`WINDOW_ENDED`]. The caller cancels each run; until a worker applies
    /// the cancel the run is answered again by the next call (so a cancel
    /// lost to a crash is posted again).
    async fn expire_runs(&self, limit: usize) -> Result<Vec<Uuid>, LogError>;

    /// Housekeeping, at most `limit` items each: `running` items whose run is
    /// done become `finished` with their spend; `queued` items of batches
    /// past their window become `expired`. Answers how many changed.
    async fn sweep(&self, limit: usize) -> Result<u64, LogError>;

    /// Items of the batches not finished (with an item queued, admitting or
    /// running) by [`ItemView::status`] (for metrics).
    async fn gauges(&self) -> Result<BTreeMap<String, u64>, LogError>;

    /// Tombstone the goal of the item whose run is `run_id`
    /// ([`glia_proto::TOMBSTONE`]), as part of erasing that run. The SQL
    /// stores (Postgres, SQLite) do it inside
    /// [`crate::RunLog::erase_run`]'s transaction, so for them this does
    /// nothing; the in-memory twin, which keeps items apart from runs, does
    /// it here. Idempotent.
    async fn forget_run(&self, run_id: Uuid) -> Result<(), LogError> {
        let _ = run_id;
        Ok(())
    }
}

// ----- Postgres ------------------------------------------------------------------------

mod pg {
    use futures::StreamExt;
    use tokio_postgres::Row;

    use super::*;
    use crate::postgres::{
        PgLog, SPEND_COLUMNS, SPEND_KINDS, col, corrupt, spend_of_row, unavailable,
    };

    const BATCH_COLUMNS: &str = "id, tenant, spec, request_hash, state, max_in_flight, cap_tokens, cap_usd_micros, expires_at, items_total, created_at, updated_at";

    /// What a caller sees of an item: the item's own state, or its run's.
    const STATUS: &str = concat!(
        "CASE WHEN i.state IN ('queued', 'admitting') THEN 'queued' \
         WHEN i.state IN ('expired', 'cancelled') THEN i.state \
         WHEN r.id IS NULL THEN 'failed' \
         WHEN i.error = '",
        window_ended!(),
        "' AND r.status = 'done' AND r.outcome->>'kind' = 'cancelled' THEN 'expired' \
         WHEN r.status = 'done' THEN coalesce(r.outcome->>'kind', 'failed') \
         WHEN r.status = 'parked' THEN 'parked:' || coalesce(r.pull_point->>'kind', 'unknown') \
         ELSE 'running' END"
    );

    fn number(row: &Row, name: &str) -> Result<Option<u64>, LogError> {
        Ok(col::<Option<i64>>(row, name)?.map(|v| v.max(0) as u64))
    }

    fn batch(row: &Row) -> Result<Batch, LogError> {
        Ok(Batch {
            id: col(row, "id")?,
            tenant: col(row, "tenant")?,
            spec: col::<Option<String>>(row, "spec")?.unwrap_or_default(),
            request_hash: col::<Option<String>>(row, "request_hash")?.unwrap_or_default(),
            state: BatchState::parse(&col::<String>(row, "state")?)?,
            max_in_flight: col::<Option<i32>>(row, "max_in_flight")?.map(|v| v.max(1) as u32),
            cap: SpendCap {
                tokens: number(row, "cap_tokens")?,
                cost_usd_micros: number(row, "cap_usd_micros")?,
            },
            expires_at: col(row, "expires_at")?,
            items_total: col::<i32>(row, "items_total")?.max(0) as u64,
            created_at: col(row, "created_at")?,
            updated_at: col(row, "updated_at")?,
        })
    }

    fn to_i64(v: Option<u64>) -> Option<i64> {
        v.map(|v| i64::try_from(v).unwrap_or(i64::MAX))
    }

    fn json<T: serde::de::DeserializeOwned>(row: &Row, name: &str) -> Result<Option<T>, LogError> {
        match col::<Option<String>>(row, name)? {
            None => Ok(None),
            Some(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| corrupt(format!("batch item {name}: {e}"))),
        }
    }

    /// Spend of each of `runs` (those with none are absent).
    async fn run_spend(
        client: &impl deadpool_postgres::GenericClient,
        runs: &[Uuid],
    ) -> Result<BTreeMap<Uuid, Spend>, LogError> {
        let sql = format!(
            "SELECT e.run_id, {SPEND_COLUMNS} FROM events e LEFT JOIN blobs b ON b.hash = e.blob_hash \
             WHERE e.run_id = ANY($1) AND e.kind = ANY($2) GROUP BY e.run_id"
        );
        let kinds = SPEND_KINDS.to_vec();
        let rows = client
            .query(&sql, &[&runs, &kinds])
            .await
            .map_err(|e| unavailable("batch spend", &e))?;
        rows.iter()
            .map(|row| Ok((col(row, "run_id")?, spend_of_row(row, "batch spend")?)))
            .collect()
    }

    #[async_trait]
    impl BatchStore for PgLog {
        async fn submit(
            &self,
            new: NewBatch,
            mut upload: BoxStream<'_, Result<Upload, SubmitError>>,
        ) -> Result<Submitted, SubmitError> {
            let fail = |e: tokio_postgres::Error| SubmitError::Log(unavailable("submit batch", &e));
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(fail)?;
            let inserted = tx
                .query_opt(
                    "INSERT INTO batches (id, tenant, managed, idempotency_key, spec, max_in_flight, cap_tokens, cap_usd_micros, expires_at) \
                     VALUES ($1, $2, true, $3, $4, $5, $6, $7, $8) \
                     ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING RETURNING id",
                    &[
                        &new.id,
                        &new.tenant,
                        &new.idempotency_key,
                        &new.spec,
                        &new.max_in_flight.map(|v| v.min(i32::MAX as u32) as i32),
                        &to_i64(new.cap.tokens),
                        &to_i64(new.cap.cost_usd_micros),
                        &new.expires_at,
                    ],
                )
                .await
                .map_err(fail)?;
            let insert = tx
                .prepare_cached(
                    "INSERT INTO batch_items (batch_id, n, custom_id, goal, metadata, config, tags, recorded_tools) \
                     SELECT $1, * FROM unnest($2::int[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[]) ON CONFLICT DO NOTHING RETURNING n",
                )
                .await
                .map_err(fail)?;
            let mut total: u64 = 0;
            let mut hash = None;
            while let Some(next) = upload.next().await {
                match next? {
                    Upload::Done { request_hash } => {
                        hash = Some(request_hash);
                        break;
                    }
                    Upload::Items(_) if inserted.is_none() => {}
                    Upload::Items(items) => {
                        let ns: Vec<i32> = (total..total + items.len() as u64)
                            .map(|n| n as i32)
                            .collect();
                        let ids: Vec<&str> = items.iter().map(|i| i.custom_id.as_str()).collect();
                        let goals: Vec<&str> = items.iter().map(|i| i.goal.as_str()).collect();
                        let metadata: Vec<Option<&str>> =
                            items.iter().map(|i| i.metadata.as_deref()).collect();
                        let configs: Vec<Option<&str>> =
                            items.iter().map(|i| i.config.as_deref()).collect();
                        let tags: Vec<Option<&str>> =
                            items.iter().map(|i| i.tags.as_deref()).collect();
                        let recorded: Vec<Option<&str>> =
                            items.iter().map(|i| i.recorded_tools.as_deref()).collect();
                        let rows = tx
                            .query(
                                &insert,
                                &[
                                    &new.id, &ns, &ids, &goals, &metadata, &configs, &tags,
                                    &recorded,
                                ],
                            )
                            .await
                            .map_err(|e| match e.code() {
                                Some(code) if code.code().starts_with("22") => SubmitError::Input {
                                    item: None,
                                    field: None,
                                    reason: format!("an item has a value Postgres refuses: {e}"),
                                },
                                _ => fail(e),
                            })?;
                        if rows.len() < items.len() {
                            let stored: std::collections::BTreeSet<i32> =
                                rows.iter().map(|r| r.get::<_, i32>(0)).collect();
                            let (_, item) = items
                                .iter()
                                .enumerate()
                                .find(|(i, _)| !stored.contains(&ns[*i]))
                                .expect("a row is missing");
                            return Err(SubmitError::DuplicateCustomId {
                                line: item.line,
                                custom_id: item.custom_id.clone(),
                            });
                        }
                        total += items.len() as u64;
                    }
                }
            }
            let request_hash = hash.ok_or(SubmitError::Truncated)?;
            if inserted.is_none() {
                let row = tx
                    .query_one(&format!("SELECT {BATCH_COLUMNS} FROM batches WHERE tenant = $1 AND idempotency_key = $2"), &[&new.tenant, &new.idempotency_key])
                    .await
                    .map_err(fail)?;
                return Ok(Submitted {
                    batch: batch(&row)?,
                    created: false,
                    upload_hash: request_hash,
                });
            }
            let row = tx
                .query_one(
                    &format!("UPDATE batches SET request_hash = $2, items_total = $3 WHERE id = $1 RETURNING {BATCH_COLUMNS}"),
                    &[&new.id, &request_hash, &(total.min(i32::MAX as u64) as i32)],
                )
                .await
                .map_err(fail)?;
            tx.commit().await.map_err(fail)?;
            Ok(Submitted {
                batch: batch(&row)?,
                created: true,
                upload_hash: request_hash,
            })
        }

        async fn batch(&self, tenant: Option<&str>, id: Uuid) -> Result<Option<Batch>, LogError> {
            self.bounded("batch", async {
                let client = self.client().await?;
                let sql = format!("SELECT {BATCH_COLUMNS} FROM batches WHERE id = $1 AND managed AND ($2::text IS NULL OR tenant = $2)");
                let row = client.query_opt(&sql, &[&id, &tenant]).await.map_err(|e| unavailable("batch", &e))?;
                row.as_ref().map(batch).transpose()
            })
            .await
        }

        async fn batches(
            &self,
            tenant: Option<&str>,
            after: Option<Uuid>,
            limit: usize,
        ) -> Result<Vec<Batch>, LogError> {
            self.bounded("batches", async {
                let client = self.client().await?;
                let sql = format!(
                    "SELECT {BATCH_COLUMNS} FROM batches WHERE managed AND ($1::text IS NULL OR tenant = $1) AND ($2::uuid IS NULL OR id > $2) ORDER BY id LIMIT $3"
                );
                let rows = client.query(&sql, &[&tenant, &after, &(limit.clamp(1, 1000) as i64)]).await.map_err(|e| unavailable("batches", &e))?;
                rows.iter().map(batch).collect()
            })
            .await
        }

        async fn counts(&self, id: Uuid) -> Result<BTreeMap<String, u64>, LogError> {
            self.bounded("batch counts", async {
                let client = self.client().await?;
                let sql =
                    format!("SELECT {STATUS} AS status, count(*) AS n FROM batch_items i LEFT JOIN runs r ON r.id = i.run_id WHERE i.batch_id = $1 GROUP BY 1");
                let rows = client.query(&sql, &[&id]).await.map_err(|e| unavailable("batch counts", &e))?;
                rows.iter().map(|row| Ok((col(row, "status")?, col::<i64>(row, "n")?.max(0) as u64))).collect()
            })
            .await
        }

        async fn spend(&self, id: Uuid) -> Result<Spend, LogError> {
            self.bounded("batch spend", async {
                let client = self.client().await?;
                // One statement, so one snapshot: an item the sweep moves from
                // `running` to `finished` meanwhile is counted exactly once.
                let row = client
                    .query_one(
                        "SELECT coalesce(sum(tokens) FILTER (WHERE state = 'finished'), 0)::bigint AS tokens, \
                                coalesce(sum(cost_usd_micros) FILTER (WHERE state = 'finished'), 0)::bigint AS cost, \
                                coalesce(array_agg(run_id) FILTER (WHERE state = 'running'), '{}') AS live \
                         FROM batch_items WHERE batch_id = $1 AND state IN ('finished', 'running')",
                        &[&id],
                    )
                    .await
                    .map_err(|e| unavailable("batch spend", &e))?;
                let mut spend = Spend { tokens: number(&row, "tokens")?.unwrap_or(0), cost_usd_micros: number(&row, "cost")?.unwrap_or(0) };
                // A live run's events only grow: read after the snapshot, they count at least what it had spent then.
                let live: Vec<Uuid> = col(&row, "live")?;
                for s in run_spend(&client, &live).await?.into_values() {
                    spend = spend.saturating_add(s);
                }
                Ok(spend)
            })
            .await
        }

        async fn items(
            &self,
            id: Uuid,
            from: u64,
            limit: usize,
        ) -> Result<Vec<ItemView>, LogError> {
            self.bounded("batch items", async {
                let client = self.client().await?;
                let sql = format!(
                    "SELECT i.n, i.custom_id, i.metadata, {STATUS} AS status, i.run_id, r.outcome::text AS outcome, r.pull_point::text AS pull_point, \
                            i.state, i.tokens, i.cost_usd_micros, i.error \
                     FROM batch_items i LEFT JOIN runs r ON r.id = i.run_id WHERE i.batch_id = $1 AND i.n >= $2 ORDER BY i.n LIMIT $3"
                );
                let from = from.min(i32::MAX as u64) as i32;
                let rows = client.query(&sql, &[&id, &from, &(limit.clamp(1, 10_000) as i64)]).await.map_err(|e| unavailable("batch items", &e))?;
                rows.iter()
                    .map(|row| {
                        let finished = col::<String>(row, "state")? == "finished";
                        let spend = Spend { tokens: number(row, "tokens")?.unwrap_or(0), cost_usd_micros: number(row, "cost_usd_micros")?.unwrap_or(0) };
                        Ok(ItemView {
                            n: col::<i32>(row, "n")?.max(0) as u64,
                            custom_id: col(row, "custom_id")?,
                            metadata: col(row, "metadata")?,
                            status: col(row, "status")?,
                            run_id: col(row, "run_id")?,
                            outcome: json(row, "outcome")?,
                            pull_point: json(row, "pull_point")?,
                            spend: finished.then_some(spend),
                            error: col(row, "error")?,
                        })
                    })
                    .collect()
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
            self.bounded("update batch", async {
                let fail = |e: tokio_postgres::Error| unavailable("update batch", &e);
                let mut client = self.client().await?;
                let tx = client.transaction().await.map_err(fail)?;
                let sql = format!(
                    "UPDATE batches SET state = CASE WHEN state = 'cancelled' THEN state ELSE coalesce($3, state) END, \
                            cap_tokens = CASE WHEN $4 THEN $5 ELSE cap_tokens END, cap_usd_micros = CASE WHEN $4 THEN $6 ELSE cap_usd_micros END, \
                            updated_at = now() \
                     WHERE id = $1 AND managed AND ($2::text IS NULL OR tenant = $2) RETURNING {BATCH_COLUMNS}"
                );
                let row = tx
                    .query_opt(
                        &sql,
                        &[
                            &id,
                            &tenant,
                            &state.map(BatchState::as_str),
                            &cap.is_some(),
                            &to_i64(cap.and_then(|c| c.tokens)),
                            &to_i64(cap.and_then(|c| c.cost_usd_micros)),
                        ],
                    )
                    .await
                    .map_err(fail)?;
                let Some(row) = row else { return Ok(None) };
                let updated = batch(&row)?;
                if updated.state == BatchState::Cancelled {
                    tx.execute("UPDATE batch_items SET state = 'cancelled' WHERE batch_id = $1 AND state = 'queued'", &[&id]).await.map_err(fail)?;
                }
                tx.commit().await.map_err(fail)?;
                Ok(Some(updated))
            })
            .await
        }

        async fn live_runs(&self, id: Uuid) -> Result<Vec<Uuid>, LogError> {
            self.bounded("batch runs", async {
                let client = self.client().await?;
                let rows = client
                    .query("SELECT run_id FROM batch_items WHERE batch_id = $1 AND state = 'running' ORDER BY n", &[&id])
                    .await
                    .map_err(|e| unavailable("batch runs", &e))?;
                Ok(rows.iter().map(|r| r.get(0)).collect())
            })
            .await
        }

        async fn lanes(&self) -> Result<Vec<Lane>, LogError> {
            self.bounded("batch lanes", async {
                let client = self.client().await?;
                let rows = client
                    .query(
                        "SELECT b.id, b.tenant, b.state, b.max_in_flight, b.cap_tokens, b.cap_usd_micros, \
                                (SELECT count(*) FROM batch_items i WHERE i.batch_id = b.id AND i.state IN ('admitting', 'running')) AS in_flight, \
                                (SELECT count(*) FROM batch_items i WHERE i.batch_id = b.id AND i.state IN ('queued', 'admitting')) AS waiting \
                         FROM batches b WHERE b.managed AND b.id IN ( \
                             SELECT batch_id FROM batch_items WHERE state IN ('queued', 'admitting') \
                             UNION SELECT batch_id FROM batch_items WHERE state = 'running') \
                         ORDER BY b.id",
                        &[],
                    )
                    .await
                    .map_err(|e| unavailable("batch lanes", &e))?;
                rows.iter()
                    .map(|row| {
                        Ok(Lane {
                            batch_id: col(row, "id")?,
                            tenant: col(row, "tenant")?,
                            state: BatchState::parse(&col::<String>(row, "state")?)?,
                            max_in_flight: col::<Option<i32>>(row, "max_in_flight")?.map(|v| v.max(1) as u32),
                            cap: SpendCap { tokens: number(row, "cap_tokens")?, cost_usd_micros: number(row, "cap_usd_micros")? },
                            in_flight: col::<i64>(row, "in_flight")?.max(0) as u64,
                            waiting: col::<i64>(row, "waiting")?.max(0) as u64,
                        })
                    })
                    .collect()
            })
            .await
        }

        async fn claim(
            &self,
            batch: Uuid,
            limit: usize,
            lease: Duration,
        ) -> Result<Vec<Claim>, LogError> {
            self.bounded("claim batch items", async {
                let client = self.client().await?;
                let rows = client
                    .query(
                        // The pick is a MATERIALIZED CTE: as an `IN (subquery)`
                        // the planner may scan the subquery again per row, and
                        // each scan skips the rows the last one locked, so more
                        // than `$2` rows were claimed.
                        "WITH picked AS MATERIALIZED (SELECT n FROM batch_items \
                             WHERE batch_id = $1 AND (state = 'queued' OR (state = 'admitting' AND claimed_at < now() - make_interval(secs => $3))) \
                             ORDER BY n LIMIT $2 FOR UPDATE SKIP LOCKED) \
                         UPDATE batch_items i SET state = 'admitting', claimed_at = now() FROM picked \
                         WHERE i.batch_id = $1 AND i.n = picked.n \
                         RETURNING i.n, i.custom_id, i.goal, i.config, i.metadata, i.tags, i.recorded_tools",
                        &[&batch, &(limit as i64), &lease.as_secs_f64()],
                    )
                    .await
                    .map_err(|e| unavailable("claim batch items", &e))?;
                let mut claims: Vec<Claim> = rows
                    .iter()
                    .map(|row| {
                        Ok(Claim {
                            batch_id: batch,
                            n: col::<i32>(row, "n")?.max(0) as u64,
                            custom_id: col(row, "custom_id")?,
                            goal: col(row, "goal")?,
                            config: col(row, "config")?,
                            metadata: col(row, "metadata")?,
                            tags: col(row, "tags")?,
                            recorded_tools: col(row, "recorded_tools")?,
                        })
                    })
                    .collect::<Result<_, LogError>>()?;
                claims.sort_by_key(|c| c.n);
                Ok(claims)
            })
            .await
        }

        async fn admitted(
            &self,
            batch: Uuid,
            n: u64,
            run_id: Uuid,
        ) -> Result<BatchState, LogError> {
            self.bounded("admitted", async {
                let client = self.client().await?;
                let row = client
                    .query_one(
                        "WITH item AS (UPDATE batch_items SET state = 'running', run_id = $3, claimed_at = NULL \
                                       WHERE batch_id = $1 AND n = $2 AND state IN ('admitting', 'queued', 'cancelled', 'expired')) \
                         SELECT state FROM batches WHERE id = $1",
                        &[&batch, &(n as i32), &run_id],
                    )
                    .await
                    .map_err(|e| unavailable("admitted", &e))?;
                BatchState::parse(&col::<String>(&row, "state")?)
            })
            .await
        }

        async fn refused(&self, batch: Uuid, n: u64, error: &str) -> Result<(), LogError> {
            self.bounded("refused", async {
                let client = self.client().await?;
                client
                    .execute(
                        "UPDATE batch_items SET state = 'finished', error = $3, claimed_at = NULL, tokens = 0, cost_usd_micros = 0 WHERE batch_id = $1 AND n = $2",
                        &[&batch, &(n as i32), &error],
                    )
                    .await
                    .map_err(|e| unavailable("refused", &e))?;
                Ok(())
            })
            .await
        }

        async fn expire_runs(&self, limit: usize) -> Result<Vec<Uuid>, LogError> {
            self.bounded("expire batch runs", async {
                let client = self.client().await?;
                let rows = client
                    .query(
                        // Picked once (a MATERIALIZED CTE, see `claim`).
                        "WITH due AS MATERIALIZED (SELECT i.batch_id, i.n FROM batch_items i \
                             JOIN batches b ON b.id = i.batch_id JOIN runs r ON r.id = i.run_id \
                             WHERE i.state = 'running' AND b.expires_at < now() AND r.status <> 'done' LIMIT $1 FOR UPDATE OF i SKIP LOCKED) \
                         UPDATE batch_items i SET error = $2 FROM due WHERE i.batch_id = due.batch_id AND i.n = due.n RETURNING i.run_id",
                        &[&(limit as i64), &WINDOW_ENDED],
                    )
                    .await
                    .map_err(|e| unavailable("expire batch runs", &e))?;
                rows.iter().map(|r| col(r, "run_id")).collect()
            })
            .await
        }

        async fn sweep(&self, limit: usize) -> Result<u64, LogError> {
            self.bounded("batch sweep", async {
                let fail = |e: tokio_postgres::Error| unavailable("batch sweep", &e);
                let client = self.client().await?;
                let done = client
                    .query(
                        "SELECT i.batch_id, i.n, i.run_id FROM batch_items i JOIN runs r ON r.id = i.run_id \
                         WHERE i.state = 'running' AND r.status = 'done' LIMIT $1",
                        &[&(limit as i64)],
                    )
                    .await
                    .map_err(fail)?;
                let runs: Vec<Uuid> = done.iter().map(|r| r.get(2)).collect();
                let spend = run_spend(&client, &runs).await?;
                let batches: Vec<Uuid> = done.iter().map(|r| r.get(0)).collect();
                let ns: Vec<i32> = done.iter().map(|r| r.get(1)).collect();
                let tokens: Vec<i64> = runs.iter().map(|r| to_i64(Some(spend.get(r).copied().unwrap_or_default().tokens)).unwrap_or(0)).collect();
                let cost: Vec<i64> = runs.iter().map(|r| to_i64(Some(spend.get(r).copied().unwrap_or_default().cost_usd_micros)).unwrap_or(0)).collect();
                let finished = client
                    .execute(
                        "UPDATE batch_items i SET state = 'finished', tokens = u.tokens, cost_usd_micros = u.cost \
                         FROM unnest($1::uuid[], $2::int[], $3::bigint[], $4::bigint[]) AS u(batch_id, n, tokens, cost) \
                         WHERE i.batch_id = u.batch_id AND i.n = u.n AND i.state = 'running'",
                        &[&batches, &ns, &tokens, &cost],
                    )
                    .await
                    .map_err(fail)?;
                let expired = client
                    .execute(
                        // The rows are picked once, in a MATERIALIZED CTE: an
                        // `IN (subquery LIMIT … SKIP LOCKED)` may be run again
                        // by the plan and pass its limit (see `claim`).
                        "WITH due AS MATERIALIZED (SELECT i.batch_id, i.n FROM batch_items i JOIN batches b ON b.id = i.batch_id \
                             WHERE i.state = 'queued' AND b.expires_at < now() LIMIT $1 FOR UPDATE OF i SKIP LOCKED) \
                         UPDATE batch_items SET state = 'expired' FROM due WHERE batch_items.batch_id = due.batch_id AND batch_items.n = due.n",
                        &[&(limit as i64)],
                    )
                    .await
                    .map_err(fail)?;
                Ok(finished + expired)
            })
            .await
        }

        async fn gauges(&self) -> Result<BTreeMap<String, u64>, LogError> {
            self.bounded("batch gauges", async {
                let client = self.client().await?;
                let sql = format!(
                    "SELECT {STATUS} AS status, count(*) AS n FROM batch_items i LEFT JOIN runs r ON r.id = i.run_id \
                     WHERE i.batch_id IN (SELECT DISTINCT batch_id FROM batch_items WHERE state IN ('queued', 'admitting', 'running')) GROUP BY 1"
                );
                let rows = client.query(&sql, &[]).await.map_err(|e| unavailable("batch gauges", &e))?;
                rows.iter().map(|row| Ok((col(row, "status")?, col::<i64>(row, "n")?.max(0) as u64))).collect()
            })
            .await
        }
    }
}

// ----- in memory ----------------------------------------------------------------------------

/// The in-memory twin of [`BatchStore`], for `glia dev` and fast tests:
/// batches and items in a mutex, runs read from the [`crate::RunLog`] it
/// was made with (their status, outcome, pull point, and usage for spend).
/// Nothing survives the process. Same semantics as the Postgres adapter,
/// which the dispatcher's batch tests run against both.
pub struct MemoryBatches {
    log: std::sync::Arc<dyn crate::RunLog>,
    inner: std::sync::Mutex<MemoryInner>,
}

#[derive(Default)]
struct MemoryInner {
    batches: BTreeMap<Uuid, (Batch, Vec<MemoryItem>)>,
    keys: std::collections::HashMap<(String, String), Uuid>,
}

#[derive(Clone)]
struct MemoryItem {
    custom_id: String,
    goal: String,
    metadata: Option<String>,
    tags: Option<String>,
    config: Option<String>,
    recorded_tools: Option<String>,
    state: ItemState,
    run_id: Option<Uuid>,
    spend: Spend,
    error: Option<String>,
}

#[derive(Clone, Copy, PartialEq)]
enum ItemState {
    Queued,
    Admitting(DateTime<Utc>),
    Running,
    Finished,
    Expired,
    Cancelled,
}

impl MemoryBatches {
    /// A store whose items' runs live in `log`.
    pub fn new(log: std::sync::Arc<dyn crate::RunLog>) -> MemoryBatches {
        MemoryBatches {
            log,
            inner: std::sync::Mutex::new(MemoryInner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The item's status as a caller sees it, its run's outcome and pull point.
    async fn view(&self, n: u64, item: &MemoryItem) -> Result<ItemView, LogError> {
        let run = match item.run_id {
            Some(id) if matches!(item.state, ItemState::Running | ItemState::Finished) => {
                Some(self.log.get_run(id).await?)
            }
            _ => None,
        };
        let status = match (item.state, &run) {
            (ItemState::Queued | ItemState::Admitting(_), _) => "queued".to_owned(),
            (ItemState::Expired, _) => "expired".to_owned(),
            (ItemState::Cancelled, _) => "cancelled".to_owned(),
            (_, None) => "failed".to_owned(),
            (_, Some(r))
                if item.error.as_deref() == Some(WINDOW_ENDED)
                    && matches!(r.outcome, Some(Outcome::Cancelled { .. })) =>
            {
                "expired".to_owned()
            }
            (_, Some(r)) => match (&r.outcome, &r.pull_point) {
                (Some(o), _) => outcome_kind(o).to_owned(),
                (None, Some(p)) if r.status == crate::RunStatus::Parked => {
                    format!("parked:{}", p.name())
                }
                _ => "running".to_owned(),
            },
        };
        Ok(ItemView {
            n,
            custom_id: item.custom_id.clone(),
            metadata: item.metadata.clone(),
            status,
            run_id: item.run_id,
            outcome: run.as_ref().and_then(|r| r.outcome.clone()),
            pull_point: run.as_ref().and_then(|r| r.pull_point.clone()),
            spend: (item.state == ItemState::Finished).then_some(item.spend),
            error: item.error.clone(),
        })
    }

    /// Items of batch `id` with their index, copied out of the lock.
    fn items_of(&self, id: Uuid) -> Vec<(u64, MemoryItem)> {
        self.lock()
            .batches
            .get(&id)
            .map(|(_, items)| {
                items
                    .iter()
                    .cloned()
                    .enumerate()
                    .map(|(n, i)| (n as u64, i))
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn run_spend(&self, run_id: Uuid) -> Result<Spend, LogError> {
        let state = self.log.load(run_id).await?;
        Ok(Spend::of(&state.usage.tokens, state.usage.cost_usd_micros))
    }
}

/// `succeeded`, `failed` or `cancelled`: the `kind` of an outcome's JSON.
fn outcome_kind(o: &Outcome) -> &'static str {
    match o {
        Outcome::Succeeded { .. } => "succeeded",
        Outcome::Failed { .. } => "failed",
        Outcome::Cancelled { .. } => "cancelled",
    }
}

fn visible(batch: &Batch, tenant: Option<&str>) -> bool {
    tenant.is_none_or(|t| t == batch.tenant)
}

#[async_trait]
impl BatchStore for MemoryBatches {
    async fn forget_run(&self, run_id: Uuid) -> Result<(), LogError> {
        for (_, items) in self.lock().batches.values_mut() {
            for item in items.iter_mut().filter(|i| i.run_id == Some(run_id)) {
                item.goal = glia_proto::TOMBSTONE.to_owned();
                item.recorded_tools = None;
            }
        }
        Ok(())
    }

    async fn submit(
        &self,
        new: NewBatch,
        mut upload: BoxStream<'_, Result<Upload, SubmitError>>,
    ) -> Result<Submitted, SubmitError> {
        use futures::StreamExt;
        let earlier = new.idempotency_key.as_ref().and_then(|k| {
            self.lock()
                .keys
                .get(&(new.tenant.clone(), k.clone()))
                .copied()
        });
        let mut items: Vec<MemoryItem> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut hash = None;
        while let Some(next) = upload.next().await {
            match next? {
                Upload::Done { request_hash } => {
                    hash = Some(request_hash);
                    break;
                }
                Upload::Items(_) if earlier.is_some() => {}
                Upload::Items(chunk) => {
                    for item in chunk {
                        if !seen.insert(item.custom_id.clone()) {
                            return Err(SubmitError::DuplicateCustomId {
                                line: item.line,
                                custom_id: item.custom_id,
                            });
                        }
                        let NewItem {
                            custom_id,
                            goal,
                            metadata,
                            tags,
                            config,
                            recorded_tools,
                            ..
                        } = item;
                        items.push(MemoryItem {
                            custom_id,
                            goal,
                            metadata,
                            tags,
                            config,
                            recorded_tools,
                            state: ItemState::Queued,
                            run_id: None,
                            spend: Spend::default(),
                            error: None,
                        });
                    }
                }
            }
        }
        let upload_hash = hash.ok_or(SubmitError::Truncated)?;
        let mut inner = self.lock();
        let key = new.idempotency_key.clone().map(|k| (new.tenant.clone(), k));
        if let Some(id) = key.as_ref().and_then(|k| inner.keys.get(k)) {
            let batch = inner.batches[id].0.clone();
            return Ok(Submitted {
                batch,
                created: false,
                upload_hash,
            });
        }
        let now = Utc::now();
        let batch = Batch {
            id: new.id,
            tenant: new.tenant,
            spec: new.spec,
            request_hash: upload_hash.clone(),
            state: BatchState::Active,
            max_in_flight: new.max_in_flight,
            cap: new.cap,
            expires_at: new.expires_at,
            items_total: items.len() as u64,
            created_at: now,
            updated_at: now,
        };
        if let Some(k) = key {
            inner.keys.insert(k, batch.id);
        }
        inner.batches.insert(batch.id, (batch.clone(), items));
        Ok(Submitted {
            batch,
            created: true,
            upload_hash,
        })
    }

    async fn batch(&self, tenant: Option<&str>, id: Uuid) -> Result<Option<Batch>, LogError> {
        Ok(self
            .lock()
            .batches
            .get(&id)
            .map(|(b, _)| b.clone())
            .filter(|b| visible(b, tenant)))
    }

    async fn batches(
        &self,
        tenant: Option<&str>,
        after: Option<Uuid>,
        limit: usize,
    ) -> Result<Vec<Batch>, LogError> {
        let inner = self.lock();
        let from = after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        Ok(inner
            .batches
            .range((from, std::ops::Bound::Unbounded))
            .map(|(_, (b, _))| b)
            .filter(|b| visible(b, tenant))
            .take(limit.clamp(1, 1000))
            .cloned()
            .collect())
    }

    async fn counts(&self, id: Uuid) -> Result<BTreeMap<String, u64>, LogError> {
        let mut counts = BTreeMap::new();
        for (n, item) in self.items_of(id) {
            *counts.entry(self.view(n, &item).await?.status).or_insert(0) += 1;
        }
        Ok(counts)
    }

    async fn spend(&self, id: Uuid) -> Result<Spend, LogError> {
        let mut spend = Spend::default();
        for (_, item) in self.items_of(id) {
            match (item.state, item.run_id) {
                (ItemState::Finished, _) => spend = spend.saturating_add(item.spend),
                (ItemState::Running, Some(run_id)) => {
                    spend = spend.saturating_add(self.run_spend(run_id).await?)
                }
                _ => {}
            }
        }
        Ok(spend)
    }

    async fn items(&self, id: Uuid, from: u64, limit: usize) -> Result<Vec<ItemView>, LogError> {
        let mut out = Vec::new();
        for (n, item) in self
            .items_of(id)
            .into_iter()
            .skip(from as usize)
            .take(limit.clamp(1, 10_000))
        {
            out.push(self.view(n, &item).await?);
        }
        Ok(out)
    }

    async fn update(
        &self,
        tenant: Option<&str>,
        id: Uuid,
        state: Option<BatchState>,
        cap: Option<SpendCap>,
    ) -> Result<Option<Batch>, LogError> {
        let mut inner = self.lock();
        let Some((batch, items)) = inner
            .batches
            .get_mut(&id)
            .filter(|(b, _)| visible(b, tenant))
        else {
            return Ok(None);
        };
        if batch.state != BatchState::Cancelled
            && let Some(s) = state
        {
            batch.state = s;
        }
        if let Some(cap) = cap {
            batch.cap = cap;
        }
        batch.updated_at = Utc::now();
        if batch.state == BatchState::Cancelled {
            for item in items.iter_mut().filter(|i| i.state == ItemState::Queued) {
                item.state = ItemState::Cancelled;
            }
        }
        Ok(Some(batch.clone()))
    }

    async fn live_runs(&self, id: Uuid) -> Result<Vec<Uuid>, LogError> {
        Ok(self
            .items_of(id)
            .into_iter()
            .filter(|(_, i)| i.state == ItemState::Running)
            .filter_map(|(_, i)| i.run_id)
            .collect())
    }

    async fn lanes(&self) -> Result<Vec<Lane>, LogError> {
        let inner = self.lock();
        Ok(inner
            .batches
            .values()
            .filter_map(|(b, items)| {
                let in_flight = items
                    .iter()
                    .filter(|i| matches!(i.state, ItemState::Admitting(_) | ItemState::Running))
                    .count() as u64;
                let waiting = items
                    .iter()
                    .filter(|i| matches!(i.state, ItemState::Queued | ItemState::Admitting(_)))
                    .count() as u64;
                (in_flight + waiting > 0).then(|| Lane {
                    batch_id: b.id,
                    tenant: b.tenant.clone(),
                    state: b.state,
                    max_in_flight: b.max_in_flight,
                    cap: b.cap,
                    in_flight,
                    waiting,
                })
            })
            .collect())
    }

    async fn claim(
        &self,
        batch: Uuid,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<Claim>, LogError> {
        let now = Utc::now();
        let lapsed = now - chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::MAX);
        let mut inner = self.lock();
        let Some((_, items)) = inner.batches.get_mut(&batch) else {
            return Ok(Vec::new());
        };
        let mut claims = Vec::new();
        for (n, item) in items.iter_mut().enumerate() {
            if claims.len() == limit {
                break;
            }
            let claimable = match item.state {
                ItemState::Queued => true,
                ItemState::Admitting(at) => at < lapsed,
                _ => false,
            };
            if claimable {
                item.state = ItemState::Admitting(now);
                claims.push(Claim {
                    batch_id: batch,
                    n: n as u64,
                    custom_id: item.custom_id.clone(),
                    goal: item.goal.clone(),
                    config: item.config.clone(),
                    metadata: item.metadata.clone(),
                    tags: item.tags.clone(),
                    recorded_tools: item.recorded_tools.clone(),
                });
            }
        }
        Ok(claims)
    }

    async fn admitted(&self, batch: Uuid, n: u64, run_id: Uuid) -> Result<BatchState, LogError> {
        let mut inner = self.lock();
        let Some((b, items)) = inner.batches.get_mut(&batch) else {
            return Err(LogError::NotFound(batch));
        };
        if let Some(item) = items.get_mut(n as usize)
            && matches!(
                item.state,
                ItemState::Admitting(_)
                    | ItemState::Queued
                    | ItemState::Cancelled
                    | ItemState::Expired
            )
        {
            item.state = ItemState::Running;
            item.run_id = Some(run_id);
        }
        Ok(b.state)
    }

    async fn refused(&self, batch: Uuid, n: u64, error: &str) -> Result<(), LogError> {
        let mut inner = self.lock();
        if let Some(item) = inner
            .batches
            .get_mut(&batch)
            .and_then(|(_, items)| items.get_mut(n as usize))
        {
            item.state = ItemState::Finished;
            item.error = Some(error.to_owned());
            item.spend = Spend::default();
        }
        Ok(())
    }

    async fn expire_runs(&self, limit: usize) -> Result<Vec<Uuid>, LogError> {
        let now = Utc::now();
        let running: Vec<(Uuid, usize, Uuid)> = {
            let inner = self.lock();
            inner
                .batches
                .iter()
                .filter(|(_, (b, _))| b.expires_at.is_some_and(|at| at < now))
                .flat_map(|(id, (_, items))| {
                    items
                        .iter()
                        .enumerate()
                        .filter(|(_, i)| i.state == ItemState::Running)
                        .filter_map(move |(n, i)| Some((*id, n, i.run_id?)))
                })
                .collect()
        };
        let mut runs = Vec::new();
        for (batch, n, run_id) in running {
            if runs.len() >= limit {
                break;
            }
            if self.log.get_run(run_id).await?.status == crate::RunStatus::Done {
                continue;
            }
            let mut inner = self.lock();
            if let Some(item) = inner
                .batches
                .get_mut(&batch)
                .and_then(|(_, items)| items.get_mut(n))
                .filter(|i| i.state == ItemState::Running)
            {
                item.error = Some(WINDOW_ENDED.to_owned());
                runs.push(run_id);
            }
        }
        Ok(runs)
    }

    async fn sweep(&self, limit: usize) -> Result<u64, LogError> {
        let running: Vec<(Uuid, usize, Uuid)> = {
            let inner = self.lock();
            inner
                .batches
                .iter()
                .flat_map(|(id, (_, items))| {
                    items
                        .iter()
                        .enumerate()
                        .filter(|(_, i)| i.state == ItemState::Running)
                        .filter_map(move |(n, i)| Some((*id, n, i.run_id?)))
                })
                .collect()
        };
        let mut changed = 0;
        for (batch, n, run_id) in running {
            if changed as usize >= limit {
                break;
            }
            if self.log.get_run(run_id).await?.status != crate::RunStatus::Done {
                continue;
            }
            let spend = self.run_spend(run_id).await?;
            let mut inner = self.lock();
            if let Some(item) = inner
                .batches
                .get_mut(&batch)
                .and_then(|(_, items)| items.get_mut(n))
                .filter(|i| i.state == ItemState::Running)
            {
                item.state = ItemState::Finished;
                item.spend = spend;
                changed += 1;
            }
        }
        let now = Utc::now();
        let mut inner = self.lock();
        let mut expired = 0;
        for (_, items) in inner
            .batches
            .values_mut()
            .filter(|(b, _)| b.expires_at.is_some_and(|at| at < now))
        {
            for item in items.iter_mut().filter(|i| i.state == ItemState::Queued) {
                if expired >= limit {
                    break;
                }
                item.state = ItemState::Expired;
                expired += 1;
            }
        }
        Ok(changed + expired as u64)
    }

    async fn gauges(&self) -> Result<BTreeMap<String, u64>, LogError> {
        let open: Vec<Uuid> = self
            .lock()
            .batches
            .iter()
            .filter(|(_, (_, items))| {
                items.iter().any(|i| {
                    matches!(
                        i.state,
                        ItemState::Queued | ItemState::Admitting(_) | ItemState::Running
                    )
                })
            })
            .map(|(id, _)| *id)
            .collect();
        let mut gauges = BTreeMap::new();
        for id in open {
            for (status, n) in self.counts(id).await? {
                *gauges.entry(status).or_insert(0) += n;
            }
        }
        Ok(gauges)
    }
}
