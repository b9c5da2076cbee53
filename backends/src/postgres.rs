//! The Postgres event log, [`PgLog`]: the fleet's truth.
//!
//! ## Schema
//!
//! Migrations are embedded (`backends/migrations/V*__*.sql`, refinery) and
//! applied by [`PgLog::connect`] under a Postgres advisory lock, so processes
//! starting together do not race. Tables: `runs` (identity, a summary of the
//! state, head sequence, lease, idempotency key unique per tenant; never
//! deleted, which a trigger enforces), `events` (`(run_id, seq)` primary
//! key; UPDATE, DELETE and TRUNCATE are rejected by a trigger; no foreign
//! key: every insert takes its run id from a run row it has just locked or
//! written, V12), `blobs` (large payloads by SHA-256), `checkpoints`,
//! `approvals`, `batches`, `inbox`, `outbox`.
//!
//! ## Writes
//!
//! Every write is one transaction. A step's commit is, by default, one
//! fenced statement written in a group with the worker's other concurrent
//! steps ([`CommitMode`], `postgres/group.rs`). Otherwise, and for commits
//! that checkpoint, store blobs or carry no events, [`RunLog::commit`] locks the run row
//! (`SELECT … FOR NO KEY UPDATE`: the `FOR UPDATE` lock that still lets
//! concurrent foreign-key checks, e.g. a `post` into the inbox, through),
//! checks the lease (token and expiry, by the database clock) and the head,
//! then sends its writes pipelined: blobs, the events (one multi-row insert),
//! the run summary, approvals, consumed inbox items and, now and then, a
//! checkpoint. Its cost is proportional to the events it appends, whatever
//! the run's history; the state is never rewritten per step.
//!
//! ## Checkpoints
//!
//! The commit whose events cross a checkpoint position writes a checkpoint.
//! Positions are [`PgOptions::checkpoint_every`] apart at first, then a
//! quarter of the history apart ([`next_checkpoint`]): a checkpoint's size
//! grows with the history and so does the gap to the next, so checkpoints
//! cost each event about the same however long the run, and a load replays
//! at most about a quarter of the history on top of one. A checkpoint is
//! the latest checkpoint plus the events since (read in the same
//! transaction) with the new events applied, i.e. the state the log says,
//! not the caller's claim. A commit only checks the events' envelope
//! (run, consecutive sequences, `state.head_seq`); this is where transitions
//! are verified: events that do not apply make that commit fail with
//! [`LogError::Invalid`]. Only the latest checkpoint is kept, so a run's
//! storage stays linear. [`RunLog::load`] is the latest checkpoint plus a
//! replay of the events after it; a checkpoint that no longer parses (e.g.
//! after `RunState` changed) is ignored and the whole log is replayed.
//!
//! ## Payloads
//!
//! An event's payload is `serde_json` of its [`glia_proto::EventKind`], as
//! `jsonb`; one whose JSON is longer than [`PgOptions::blob_threshold`], or
//! which contains U+0000 (which `jsonb` cannot hold), is stored in `blobs` by
//! the SHA-256 of its JSON and read back transparently (and verified). An
//! event's time is stored to the microsecond plus its remaining nanoseconds,
//! so events round-trip exactly.
//!
//! ## Errors
//!
//! Connection problems and timeouts (pool, statement, call) are
//! [`LogError::Unavailable`]; rows that do not decode are
//! [`LogError::Corrupt`]; nothing here panics on bad data.
//! Values Postgres refuses (class 22, e.g. a NUL byte in a tenant name) are
//! [`LogError::Invalid`].

use std::future::Future;
use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use deadpool_postgres::{
    GenericClient, Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime, Transaction,
};
use glia_proto::{Event, EventKind, Outcome, Payload, Phase, PullPoint, RunState, erasure};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Config, NoTls, Row};
use uuid::Uuid;

use crate::{
    AgentRegistry, AgentVersion, ApprovalFilter, ApprovalRow, ApprovalStatus, Approvals,
    ExpiredFilter, Inbox, InboxItem, Job, Lease, LogError, LogGauges, NewRun, Opened, Opening,
    Orphan, Outbox, Reports, RunFilter, RunGaugeKey, RunLog, RunStatus, RunSummary, Spend,
    dedupe_key,
};

mod codec;
mod group;
mod waits;

use codec::{
    EncodedEvents, SummaryColumns, describe, encode_events, has_nul, seq_of, sha256_hex, sql_seq,
    summary_set, write_error,
};
pub(crate) use codec::{
    USAGE_COLUMNS, col, corrupt, phase_name, unavailable, usage_cells, usage_of,
};

/// `backends/migrations/V<n>__<name>.sql`, compiled in. Edits to an
/// existing file rebuild the crate; a new file is only picked up once this
/// file (or anything else in the crate) is rebuilt.
mod embedded {
    refinery::embed_migrations!("migrations");
}

/// Advisory lock key held while migrations run ("glia" in ASCII).
const MIGRATION_LOCK: i64 = 0x676c_6961;

/// Longest lease handed out; longer TTLs are capped (about ten years).
const MAX_TTL: Duration = Duration::from_secs(3650 * 24 * 3600);

/// How a [`PgLog`] connects and where it draws its lines. Every timeout is
/// set: deadpool has none unless told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgOptions {
    /// Most pooled connections (default 16; at least 1).
    pub max_connections: usize,
    /// Longest wait for a free pooled connection (default 10 s); then the call
    /// fails with [`LogError::Unavailable`].
    pub wait_timeout: Duration,
    /// Longest time to open a connection: TCP, startup and authentication
    /// (default 5 s). Also the pool's create timeout.
    pub connect_timeout: Duration,
    /// Longest time to check a returned connection before reuse (default 5 s).
    pub recycle_timeout: Duration,
    /// Server-side `statement_timeout` of pooled connections (default 30 s): a
    /// longer statement is cancelled by the server. Migrations run without it.
    pub statement_timeout: Duration,
    /// Server-side `idle_in_transaction_session_timeout` (default 60 s): a
    /// session left idle inside a transaction is closed, releasing its locks.
    pub idle_in_transaction_timeout: Duration,
    /// Client-side bound on one [`EventLog`](crate::EventLog) call, from asking the pool to the
    /// last answer (default 60 s): covers a network that stopped answering,
    /// which no server-side timeout can.
    pub call_timeout: Duration,
    /// The first checkpoint is written at this many events, and the next ones
    /// at least this many apart (default 64; at least 1); see
    /// [`next_checkpoint`].
    pub checkpoint_every: u64,
    /// Event payloads whose JSON is longer than this many bytes go to `blobs`
    /// (default 64 KiB).
    pub blob_threshold: usize,
    /// `application_name` reported to the server unless the URL sets one
    /// (default `glia`).
    pub application_name: String,
    /// How [`RunLog::commit`] writes a step (default [`CommitMode::Group`]).
    pub commit_mode: CommitMode,
    /// Group commit: most groups being written at once, each on its own
    /// pooled connection (default 2; at least 1). While they are all busy,
    /// new commits gather into the next group.
    pub group_lanes: usize,
    /// Group commit: most steps in one group (default 64; at least 1).
    pub group_max: usize,
}

/// How [`RunLog::commit`] writes a step on Postgres. Every mode is equally
/// durable (one synchronous commit covers the step) and fenced by the run's
/// lease and head; they differ in round trips and fsyncs.
///
/// Commits that write a checkpoint, store a payload in `blobs` or carry no
/// events take the [`CommitMode::Transaction`] path in every mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommitMode {
    /// An explicit transaction: `BEGIN`, lock the run row and check the lease
    /// and head, the pipelined writes, `COMMIT` (four round trips).
    Transaction,
    /// One statement (`FENCED_COMMIT`, or `FENCED_APPEND` for a step that
    /// touches no approval or inbox item): the run row's update, fenced by
    /// id, lease token, lease expiry and head, drives the event insert and
    /// the other writes in data-modifying CTEs; one round trip and one
    /// fsync per step. Lease-lost and conflict are told apart by a read
    /// only when the fence refuses.
    Statement,
    /// The step's statement joins a group: a worker's concurrent commits
    /// (of any runs) are sent pipelined as `BEGIN; statement per step;
    /// COMMIT` on one connection, one round trip and one fsync per group.
    /// Each step is fenced by its own run's statement, so one run's lost
    /// lease or moved head only fails that run's step; a statement that
    /// errors (rolling the group back) makes the group's steps be written
    /// again one statement each, so it fails only its own step.
    #[default]
    Group,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            max_connections: 16,
            wait_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            recycle_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(30),
            idle_in_transaction_timeout: Duration::from_secs(60),
            call_timeout: Duration::from_secs(60),
            checkpoint_every: 64,
            blob_threshold: 64 * 1024,
            application_name: "glia".into(),
            commit_mode: CommitMode::Group,
            group_lanes: 2,
            group_max: 64,
        }
    }
}

/// The event log in Postgres: a pool of connections to one database whose
/// schema [`PgLog::connect`] migrated. Cheap to clone (the pool is shared).
#[derive(Clone)]
pub struct PgLog {
    pool: Pool,
    call_timeout: Duration,
    checkpoint_every: u64,
    blob_threshold: usize,
    commit_mode: CommitMode,
    group: Option<group::Committer>,
    /// How [`PgLog::resume_hints`] opens its own connection.
    listen: Config,
}

impl std::fmt::Debug for PgLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLog")
            .field("pool", &self.pool.status())
            .finish_non_exhaustive()
    }
}

impl PgLog {
    /// Connect to `url` (`postgres://user[:password]@host[:port]/db[?…]`,
    /// plain TCP or a Unix socket, no TLS), apply pending migrations and build
    /// the pool. Errors: [`LogError::Unavailable`] for a malformed URL, an
    /// unreachable server or a failed migration.
    pub async fn connect(url: &str, options: PgOptions) -> Result<PgLog, LogError> {
        let config: Config = url
            .parse()
            .map_err(|e| LogError::Unavailable(format!("invalid database url: {e}")))?;
        PgLog::connect_with(config, options).await
    }

    /// [`PgLog::connect`] with a parsed configuration.
    pub async fn connect_with(mut config: Config, options: PgOptions) -> Result<PgLog, LogError> {
        config.connect_timeout(options.connect_timeout);
        config.keepalives_idle(Duration::from_secs(30));
        if config.get_application_name().is_none() {
            config.application_name(options.application_name.as_str());
        }
        migrate(&config).await?;

        let mut session = config;
        let limits = format!(
            "-c statement_timeout={} -c idle_in_transaction_session_timeout={}",
            options.statement_timeout.as_millis().max(1),
            options.idle_in_transaction_timeout.as_millis().max(1)
        );
        let combined = match session.get_options() {
            Some(own) if !own.trim().is_empty() => format!("{own} {limits}"),
            _ => limits,
        };
        session.options(combined);
        let listen = session.clone();
        let manager = Manager::from_config(
            session,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.max_connections.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.wait_timeout))
            .create_timeout(Some(options.connect_timeout))
            .recycle_timeout(Some(options.recycle_timeout))
            .build()
            .map_err(|e| LogError::Unavailable(format!("building the connection pool: {e}")))?;
        let group = (options.commit_mode == CommitMode::Group).then(|| {
            group::Committer::start(
                pool.clone(),
                options.call_timeout,
                options.group_lanes,
                options.group_max,
            )
        });
        Ok(PgLog {
            pool,
            call_timeout: options.call_timeout,
            checkpoint_every: options.checkpoint_every.max(1),
            blob_threshold: options.blob_threshold,
            commit_mode: options.commit_mode,
            group,
            listen,
        })
    }

    /// Resume hints for worker `worker_id`: the jobs of payloads posted to
    /// parked runs whose lease this worker let go of last, pushed by
    /// Postgres (`NOTIFY` on [`hint_channel`]`(worker_id)`, sent by
    /// [`Inbox::post`] in the payload's transaction, so delivered only
    /// once it commits). A hint saves the way through the outbox relay and
    /// the broker; it is never the only wake-up: the same job is queued as
    /// usual, and a worker that misses a hint (not listening, busy,
    /// disconnected) gets the job from the queue.
    ///
    /// Listens on a connection of its own (not pooled), reconnecting with
    /// backoff (100 ms → 5 s) while the receiver lives; hints sent while it
    /// is disconnected are lost, which costs only their speed. At most 256
    /// wait unread; more are dropped.
    pub fn resume_hints(&self, worker_id: &str) -> tokio::sync::mpsc::Receiver<Job> {
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let (config, channel) = (self.listen.clone(), hint_channel(worker_id));
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(100);
            while !tx.is_closed() {
                let mut listened = false;
                match listen(&config, &channel, &tx, &mut listened).await {
                    Ok(()) => return,
                    Err(e) => {
                        if listened {
                            backoff = Duration::from_millis(100);
                        }
                        tracing::warn!(channel, error = %e, "resume hints: listening connection lost; reconnecting in {} ms", backoff.as_millis());
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = tx.closed() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        });
        rx
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Client, LogError> {
        self.pool.get().await.map_err(|e| match e {
            PoolError::Backend(e) => unavailable("connecting", &e),
            other => LogError::Unavailable(format!("database connection: {other}")),
        })
    }

    /// Run `call` within the call timeout.
    pub(crate) async fn bounded<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, LogError>>,
    ) -> Result<T, LogError> {
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(LogError::Unavailable(format!(
                "{what}: no answer within {:?}",
                self.call_timeout
            ))),
        }
    }

    /// The state the log says after `events`, for a checkpoint: the stored
    /// state (checkpoint + replay) with `events` applied.
    async fn checkpoint_state(
        &self,
        tx: &Transaction<'_>,
        run_id: Uuid,
        events: &[Event],
        claimed: &RunState,
    ) -> Result<RunState, LogError> {
        let mut state = rebuild(tx, run_id)
            .await?
            .ok_or_else(|| corrupt(format!("run {run_id} has no events")))?;
        for e in events {
            state.apply(e).map_err(|err| LogError::Invalid {
                run_id,
                reason: err.to_string(),
            })?;
        }
        if state != *claimed {
            tracing::warn!(%run_id, seq = state.head_seq, "the committed state differs from the log's; checkpointing the log's");
        }
        Ok(state)
    }
}

/// The `NOTIFY` channel of worker `worker_id`'s resume hints
/// ([`PgLog::resume_hints`]): `glia_hint_` and the first 32 hex digits of
/// the SHA-256 of the id (any id fits Postgres' 63-byte channel names; the
/// same digits are computed in SQL by [`POST_PAYLOAD`]).
pub fn hint_channel(worker_id: &str) -> String {
    format!("glia_hint_{}", &sha256_hex(worker_id.as_bytes())[..32])
}

/// Listen on `channel` and forward each hint's job to `tx` until `tx` is
/// closed (`Ok`) or the connection fails (`Err`: what failed); `listened`
/// turns true once the `LISTEN` is in place. A payload that is not a job
/// is ignored.
async fn listen(
    config: &Config,
    channel: &str,
    tx: &tokio::sync::mpsc::Sender<Job>,
    listened: &mut bool,
) -> Result<(), String> {
    use futures::StreamExt;
    let (client, mut connection) = config.connect(NoTls).await.map_err(|e| describe(&e))?;
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    let statement = format!("LISTEN {channel}");
    let listening = client.batch_execute(&statement);
    tokio::pin!(listening);
    loop {
        tokio::select! {
            done = &mut listening, if !*listened => {
                done.map_err(|e| describe(&e))?;
                *listened = true;
            }
            message = messages.next() => match message {
                Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                    if let Ok(job) = serde_json::from_str::<Job>(n.payload()) {
                        let _ = tx.try_send(job);
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(describe(&e)),
                None => return Err("the server closed the connection".into()),
            },
            _ = tx.closed() => return Ok(()),
        }
    }
}

/// The first checkpoint position after `seq`: positions start at `every` and
/// are `every` apart until a quarter of a position exceeds `every`; from
/// there each is a quarter beyond the last (64, 128, 192, 256, 320, 400,
/// 500, 625, … for 64).
///
/// ```
/// use glia_backends::postgres::next_checkpoint;
/// assert_eq!(next_checkpoint(0, 64), 64);
/// assert_eq!(next_checkpoint(64, 64), 128);
/// assert_eq!(next_checkpoint(300, 64), 320);
/// assert_eq!(next_checkpoint(400, 64), 500);
/// ```
pub fn next_checkpoint(seq: u64, every: u64) -> u64 {
    let every = every.max(1);
    let mut position = every;
    while position <= seq {
        position += (position / 4).max(every);
    }
    position
}

/// Apply pending migrations on a dedicated connection, holding an advisory
/// lock so that concurrent starts apply them once.
async fn migrate(config: &Config) -> Result<(), LogError> {
    let (mut client, connection) = config
        .connect(NoTls)
        .await
        .map_err(|e| unavailable("connecting for migrations", &e))?;
    let driver = tokio::spawn(connection);
    let result = async {
        client
            .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(|e| unavailable("migration lock", &e))?;
        let report = embedded::migrations::runner()
            .run_async(&mut client)
            .await
            .map_err(|e| LogError::Unavailable(format!("migrations: {e}")));
        let _ = client
            .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
            .await;
        for m in report?.applied_migrations() {
            tracing::info!(migration = %m, "applied");
        }
        Ok(())
    }
    .await;
    drop(client);
    let _ = driver.await;
    result
}

// ---------------------------------------------------------------------------
// Errors and row decoding

/// One version of an agent: `$3` the version, NULL for the latest.
const AGENT_ROW: &str = "SELECT tenant, name, version, content_hash, definition, created_at FROM agents \
                         WHERE tenant = $1 AND name = $2 AND ($3::int IS NULL OR version = $3) ORDER BY version DESC LIMIT 1";

fn agent_of(row: &Row) -> Result<AgentVersion, LogError> {
    let version: i32 = col(row, "version")?;
    Ok(AgentVersion {
        tenant: col(row, "tenant")?,
        name: col(row, "name")?,
        version: u32::try_from(version).map_err(|_| corrupt(format!("agent version {version}")))?,
        content_hash: col(row, "content_hash")?,
        definition: col(row, "definition")?,
        created_at: col(row, "created_at")?,
    })
}

/// A `usize` count as a SQL `LIMIT`.
fn sql_limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `serde_json` of a value, as a `jsonb` text, or as bytes when it contains
/// U+0000 (which `jsonb` rejects).
struct JsonCell {
    text: Option<String>,
    raw: Option<Vec<u8>>,
}

impl JsonCell {
    fn of<T: Serialize>(value: &T) -> Result<JsonCell, serde_json::Error> {
        let json = serde_json::to_string(value)?;
        Ok(if has_nul(&json) {
            JsonCell {
                text: None,
                raw: Some(json.into_bytes()),
            }
        } else {
            JsonCell {
                text: Some(json),
                raw: None,
            }
        })
    }

    fn decode<T: DeserializeOwned>(
        text: Option<String>,
        raw: Option<Vec<u8>>,
    ) -> Result<T, String> {
        match (text, raw) {
            (Some(text), _) => serde_json::from_str(&text).map_err(|e| e.to_string()),
            (None, Some(raw)) => serde_json::from_slice(&raw).map_err(|e| e.to_string()),
            (None, None) => Err("no JSON".into()),
        }
    }
}

pub(crate) fn parse_status(s: &str) -> Result<RunStatus, LogError> {
    s.parse().map_err(corrupt)
}

fn optional_json<T: DeserializeOwned>(row: &Row, name: &str) -> Result<Option<T>, LogError> {
    col::<Option<String>>(row, name)?
        .map(|text| serde_json::from_str(&text).map_err(|e| corrupt(format!("column {name}: {e}"))))
        .transpose()
}

const SUMMARY_COLUMNS: &str = "id, tenant, batch_id, goal, status, phase, pull_point::text AS pull_point, outcome::text AS outcome, head_seq, created_at, updated_at, \
     agent, agent_version, tags, metadata, custom_id, turns, tool_calls, active_ms, input_tokens, output_tokens, cache_write_tokens, cache_read_tokens, \
     tokens_estimated, cost_usd_micros, steps, error, ended_at, erased_at, erased_by, parent_run_id, parent_call_id, depth";

/// A non-negative `bigint` or `integer` column.
fn count<T: TryFrom<i64>>(row: &Row, name: &str) -> Result<T, LogError> {
    let n: i64 = match row.columns().iter().find(|c| c.name() == name) {
        Some(c) if *c.type_() == tokio_postgres::types::Type::INT4 => col::<i32>(row, name)?.into(),
        _ => col(row, name)?,
    };
    T::try_from(n).map_err(|_| corrupt(format!("column {name} is out of range ({n})")))
}

fn summary(row: &Row) -> Result<RunSummary, LogError> {
    let phase: String = col(row, "phase")?;
    let run_id: Uuid = col(row, "id")?;
    let metadata: Value = col(row, "metadata")?;
    Ok(RunSummary {
        run_id,
        tenant: col(row, "tenant")?,
        batch_id: col(row, "batch_id")?,
        goal: col(row, "goal")?,
        status: parse_status(col(row, "status")?)?,
        phase: serde_json::from_value(Value::String(phase))
            .map_err(|e| corrupt(format!("column phase: {e}")))?,
        pull_point: optional_json(row, "pull_point")?,
        outcome: optional_json(row, "outcome")?,
        head_seq: seq_of(col(row, "head_seq")?, "head_seq")?,
        created_at: col(row, "created_at")?,
        updated_at: col(row, "updated_at")?,
        agent: col(row, "agent")?,
        agent_version: col::<Option<i32>>(row, "agent_version")?
            .map(|v| u32::try_from(v).map_err(|_| corrupt(format!("column agent_version is {v}"))))
            .transpose()?,
        tags: col(row, "tags")?,
        metadata: serde_json::from_value(metadata)
            .map_err(|e| corrupt(format!("column metadata: {e}")))?,
        custom_id: col(row, "custom_id")?,
        usage: usage_of(|name| count(row, name), col(row, "tokens_estimated")?)?,
        steps: count(row, "steps")?,
        error: col(row, "error")?,
        ended_at: col(row, "ended_at")?,
        trace_id: crate::trace_id(run_id),
        erased_at: col(row, "erased_at")?,
        erased_by: col(row, "erased_by")?,
        parent_run_id: col(row, "parent_run_id")?,
        parent_call_id: col(row, "parent_call_id")?,
        depth: count(row, "depth")?,
    })
}

// ---------------------------------------------------------------------------
// Events: encoding, reading, rebuilding state

const INSERT_BLOBS: &str = "INSERT INTO blobs (hash, bytes) SELECT * FROM unnest($1::text[], $2::bytea[]) ON CONFLICT (hash) DO NOTHING";

const INSERT_EVENTS: &str = "INSERT INTO events (run_id, seq, kind, at, at_nanos, payload, blob_hash) \
     SELECT $1, t.seq, t.kind, t.at, t.at_nanos, t.payload::jsonb, t.blob_hash \
     FROM unnest($2::bigint[], $3::text[], $4::timestamptz[], $5::int4[], $6::text[], $7::text[]) \
     AS t(seq, kind, at, at_nanos, payload, blob_hash)";

/// Insert encoded events (and their blobs first) in `tx`.
async fn write_events(
    tx: &Transaction<'_>,
    run_id: Uuid,
    enc: &EncodedEvents,
) -> Result<u64, tokio_postgres::Error> {
    let insert = tx.prepare_cached(INSERT_EVENTS).await?;
    let params: [&(dyn ToSql + Sync); 7] = [
        &run_id,
        &enc.seqs,
        &enc.kinds,
        &enc.ats,
        &enc.at_nanos,
        &enc.payloads,
        &enc.blob_hashes,
    ];
    if enc.blobs.is_empty() {
        return tx.execute(&insert, &params).await;
    }
    let blobs = tx.prepare_cached(INSERT_BLOBS).await?;
    let hashes: Vec<&str> = enc.blobs.iter().map(|(h, _)| h.as_str()).collect();
    let bytes: Vec<&[u8]> = enc.blobs.iter().map(|(_, b)| b.as_slice()).collect();
    // Pipelined, blobs first (the events reference them): requests go out in
    // the order the futures are first polled.
    let (_, n) = futures::future::try_join(
        tx.execute(&blobs, &[&hashes, &bytes]),
        tx.execute(&insert, &params),
    )
    .await?;
    Ok(n)
}

/// A tenant's model spend in `[$2, $3)` from events of kinds `$4`: token and
/// cost sums of inline payloads (as text: they may pass `bigint`), and the
/// bytes of payloads stored in blobs. See [`PgLog::tenant_usage`].
/// The spend of the events `e` (with their blobs `b`) an aggregate query
/// selects: `tokens` and `cost` as text, `blobs` the payloads stored as blobs
/// (decoded by [`spend_of_row`]). Only the events of [`SPEND_KINDS`] carry spend.
pub(crate) const SPEND_COLUMNS: &str = "\
       coalesce(sum(coalesce((e.payload #>> '{data,usage,input_tokens}')::numeric, 0) \
                  + coalesce((e.payload #>> '{data,usage,output_tokens}')::numeric, 0) \
                  + coalesce((e.payload #>> '{data,usage,cache_write_tokens}')::numeric, 0) \
                  + coalesce((e.payload #>> '{data,usage,cache_read_tokens}')::numeric, 0)), 0)::text AS tokens, \
       coalesce(sum((e.payload #>> '{data,cost_usd_micros}')::numeric), 0)::text AS cost, \
       coalesce(array_agg(b.bytes) FILTER (WHERE e.payload IS NULL), '{}') AS blobs";

/// Event kinds that carry model spend ([`Spend::of_event`]), from the catalogue.
pub(crate) const SPEND_KINDS: [&str; 3] = EventKind::SPEND_NAMES;

/// The [`Spend`] of a row selected with [`SPEND_COLUMNS`].
pub(crate) fn spend_of_row(row: &Row, what: &str) -> Result<Spend, LogError> {
    let number = |name: &str| -> Result<u64, LogError> {
        let text: String = col(row, name)?;
        text.parse()
            .map_err(|_| corrupt(format!("{what}: {name} is {text:?}")))
    };
    let mut spend = Spend {
        tokens: number("tokens")?,
        cost_usd_micros: number("cost")?,
    };
    for bytes in col::<Vec<Vec<u8>>>(row, "blobs")? {
        let kind: EventKind =
            serde_json::from_slice(&bytes).map_err(|e| corrupt(format!("{what}: blob: {e}")))?;
        spend = spend.saturating_add(Spend::of_event(&kind).unwrap_or_default());
    }
    Ok(spend)
}

static TENANT_USAGE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {SPEND_COLUMNS} \
     FROM runs r JOIN events e ON e.run_id = r.id LEFT JOIN blobs b ON b.hash = e.blob_hash \
     WHERE r.tenant = $1::text AND r.updated_at >= $2::timestamptz - interval '1 hour' \
       AND e.at >= $2::timestamptz AND e.at < $3::timestamptz AND e.kind = ANY($4::text[])"
    )
});

/// What [`decode_event`] reads: events `e` joined to their blobs `b`.
const EVENT_ROWS: &str = "SELECT e.seq, e.kind, e.at, e.at_nanos, e.payload::text AS payload, e.blob_hash, b.bytes \
     FROM events e LEFT JOIN blobs b ON b.hash = e.blob_hash";
static READ_EVENTS: LazyLock<String> = LazyLock::new(|| {
    format!("{EVENT_ROWS} WHERE e.run_id = $1 AND e.seq > $2 ORDER BY e.seq LIMIT $3")
});

fn decode_event(run_id: Uuid, row: &Row) -> Result<Event, LogError> {
    let seq = seq_of(col(row, "seq")?, "seq")?;
    let bad = |what: String| corrupt(format!("event {run_id}/{seq}: {what}"));
    let kind: EventKind = match (
        col::<Option<String>>(row, "payload")?,
        col::<Option<String>>(row, "blob_hash")?,
    ) {
        (Some(json), _) => serde_json::from_str(&json).map_err(|e| bad(e.to_string()))?,
        (None, Some(hash)) => {
            let bytes: Vec<u8> = col::<Option<Vec<u8>>>(row, "bytes")?
                .ok_or_else(|| bad(format!("blob {hash} is missing")))?;
            if sha256_hex(&bytes) != hash {
                return Err(bad(format!("blob {hash} does not match its hash")));
            }
            serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?
        }
        (None, None) => return Err(bad("no payload".into())),
    };
    let name: String = col(row, "kind")?;
    if name != kind.name() {
        return Err(bad(format!("kind {name} but payload {}", kind.name())));
    }
    let at: DateTime<Utc> = col(row, "at")?;
    let nanos: i32 = col(row, "at_nanos")?;
    let at = at
        .checked_add_signed(chrono::Duration::nanoseconds(i64::from(nanos)))
        .ok_or_else(|| bad("time out of range".into()))?;
    Ok(Event {
        run_id,
        seq,
        at,
        kind,
    })
}

async fn read_events(
    c: &impl GenericClient,
    run_id: Uuid,
    after: u64,
    limit: i64,
) -> Result<Vec<Event>, LogError> {
    let st = c
        .prepare_cached(&READ_EVENTS)
        .await
        .map_err(|e| unavailable("reading events", &e))?;
    let rows = c
        .query(&st, &[&run_id, &sql_seq(after), &limit])
        .await
        .map_err(|e| unavailable("reading events", &e))?;
    rows.iter().map(|row| decode_event(run_id, row)).collect()
}

const LATEST_CHECKPOINT: &str = "SELECT seq, state::text AS state, state_raw FROM checkpoints WHERE run_id = $1 ORDER BY seq DESC LIMIT 1";

fn decode_checkpoint(run_id: Uuid, row: &Row) -> Result<RunState, String> {
    let seq: i64 = row.try_get("seq").map_err(|e| e.to_string())?;
    let text: Option<String> = row.try_get("state").map_err(|e| e.to_string())?;
    let raw: Option<Vec<u8>> = row.try_get("state_raw").map_err(|e| e.to_string())?;
    let state: RunState = JsonCell::decode(text, raw)?;
    if state.run_id != run_id || sql_seq(state.head_seq) != seq {
        return Err(format!(
            "checkpoint at {seq} holds run {} at {}",
            state.run_id, state.head_seq
        ));
    }
    Ok(state)
}

/// The run's state from the log: its latest usable checkpoint plus a replay
/// of the events after it. `None` when the run has no events (no such run).
async fn rebuild(c: &impl GenericClient, run_id: Uuid) -> Result<Option<RunState>, LogError> {
    let st = c
        .prepare_cached(LATEST_CHECKPOINT)
        .await
        .map_err(|e| unavailable("reading the checkpoint", &e))?;
    let row = c
        .query_opt(&st, &[&run_id])
        .await
        .map_err(|e| unavailable("reading the checkpoint", &e))?;
    let checkpoint = row.as_ref().and_then(|row| usable_checkpoint(run_id, row));
    let after = checkpoint.as_ref().map_or(0, |s| s.head_seq);
    let events = read_events(c, run_id, after, i64::MAX).await?;
    replay_onto(run_id, checkpoint, &events)
}

/// The checkpoint in `row`, or `None` (with a warning) when it cannot be
/// used: the whole log is replayed instead.
fn usable_checkpoint(run_id: Uuid, row: &Row) -> Option<RunState> {
    decode_checkpoint(run_id, row).map_err(|reason| tracing::warn!(%run_id, %reason, "unusable checkpoint; replaying the whole log")).ok()
}

/// `events` applied to `checkpoint` (a new run's empty state without one);
/// `None` when there is neither.
fn replay_onto(
    run_id: Uuid,
    checkpoint: Option<RunState>,
    events: &[Event],
) -> Result<Option<RunState>, LogError> {
    if checkpoint.is_none() && events.is_empty() {
        return Ok(None);
    }
    let mut state = checkpoint.unwrap_or_else(|| RunState::new(run_id));
    for e in events {
        state
            .apply(e)
            .map_err(|err| corrupt(format!("event {run_id}/{} does not apply: {err}", e.seq)))?;
    }
    Ok(Some(state))
}

/// What [`decode_inbox`] reads: run `$1`'s unconsumed inbox items (callers
/// add conditions and `ORDER BY id`).
const INBOX_ROWS: &str = "SELECT id, payload::text AS payload, payload_raw FROM inbox WHERE run_id = $1 AND NOT consumed";
static INBOX_PENDING: LazyLock<String> = LazyLock::new(|| format!("{INBOX_ROWS} ORDER BY id"));

fn decode_inbox(rows: &[Row]) -> Result<Vec<InboxItem>, LogError> {
    rows.iter()
        .map(|row| {
            let id: i64 = col(row, "id")?;
            let payload = JsonCell::decode(col(row, "payload")?, col(row, "payload_raw")?)
                .map_err(|e| corrupt(format!("inbox item {id}: {e}")))?;
            Ok(InboxItem { id, payload })
        })
        .collect()
}

async fn run_exists(c: &impl GenericClient, run_id: Uuid) -> Result<bool, LogError> {
    let st = c
        .prepare_cached("SELECT 1 FROM runs WHERE id = $1")
        .await
        .map_err(|e| unavailable("reading runs", &e))?;
    Ok(c.query_opt(&st, &[&run_id])
        .await
        .map_err(|e| unavailable("reading runs", &e))?
        .is_some())
}

/// Check a commit's envelope: events of this run, consecutive, ending at
/// `state.head_seq`.
pub(crate) fn check_envelope(
    run_id: Uuid,
    events: &[Event],
    state: &RunState,
) -> Result<(), LogError> {
    let invalid = |reason: String| Err(LogError::Invalid { run_id, reason });
    if state.run_id != run_id {
        return invalid(format!("state is of run {}", state.run_id));
    }
    let Some(first) = events.first() else {
        return Ok(());
    };
    if first.seq < 1 {
        return invalid("event seq 0".into());
    }
    for (i, e) in events.iter().enumerate() {
        if e.run_id != run_id {
            return invalid(format!("event {} is of run {}", e.seq, e.run_id));
        }
        if e.seq != first.seq + i as u64 {
            return invalid(format!(
                "events are not consecutive: {} after {}",
                e.seq,
                first.seq + i as u64 - 1
            ));
        }
    }
    let last = first.seq + events.len() as u64 - 1;
    if state.head_seq != last {
        return invalid(format!(
            "state is at {} but the events end at {last}",
            state.head_seq
        ));
    }
    Ok(())
}

/// An optional pipelined statement.
async fn maybe<F>(statement: Option<F>) -> Result<u64, tokio_postgres::Error>
where
    F: Future<Output = Result<u64, tokio_postgres::Error>>,
{
    match statement {
        Some(f) => f.await,
        None => Ok(0),
    }
}

/// A `lock_timeout` (ms) that ends a lock wait well within `left`, the time
/// a call has left: three quarters of it, at least 1 ms.
fn lock_timeout_ms(left: Duration) -> u128 {
    (left.as_millis() * 3 / 4).max(1)
}

/// Duration as Postgres seconds for `make_interval(secs => …)`.
fn ttl_secs(ttl: Duration) -> f64 {
    ttl.min(MAX_TTL).as_secs_f64()
}

/// `%text%` for `LIKE`/`ILIKE`, with `text`'s own `\\`, `%` and `_` escaped
/// (`\\` is the default escape character): a substring match.
fn like_pattern(text: &str) -> String {
    let mut pattern = String::with_capacity(text.len() + 2);
    pattern.push('%');
    for c in text.chars() {
        if matches!(c, '\\' | '%' | '_') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

/// A `SELECT` with optional `AND` predicates, each bound to the next
/// numbered parameter, so only the filters in use reach the planner.
struct Select {
    sql: String,
    params: Vec<Box<dyn ToSql + Sync + Send>>,
}

impl Select {
    fn new(sql: impl Into<String>) -> Select {
        Select {
            sql: sql.into(),
            params: Vec::new(),
        }
    }

    /// `AND {predicate} $n`, e.g. `and("tenant =", tenant)`.
    fn and(&mut self, predicate: &str, value: impl ToSql + Sync + Send + 'static) {
        self.params.push(Box::new(value));
        self.sql
            .push_str(&format!(" AND {predicate} ${}", self.params.len()));
    }

    /// Append `ORDER BY {order} LIMIT $n` and run it.
    async fn rows(
        mut self,
        log: &PgLog,
        what: &str,
        order: &str,
        limit: usize,
    ) -> Result<Vec<Row>, LogError> {
        self.params.push(Box::new(sql_limit(limit)));
        self.sql
            .push_str(&format!(" ORDER BY {order} LIMIT ${}", self.params.len()));
        log.bounded(what, async {
            let client = log.client().await?;
            let st = client
                .prepare_cached(&self.sql)
                .await
                .map_err(|e| unavailable(what, &e))?;
            let params: Vec<&(dyn ToSql + Sync)> = self
                .params
                .iter()
                .map(|p| &**p as &(dyn ToSql + Sync))
                .collect();
            client
                .query(&st, &params)
                .await
                .map_err(|e| unavailable(what, &e))
        })
        .await
    }
}

// ---------------------------------------------------------------------------
// SQL

/// [`RunLog::create_run`]'s one statement: run `$1` of tenant `$2` (key
/// `$3`, batch `$4`, goal `$5`, status, phase, pull point, outcome and head
/// `$6`–`$10`, agent and version `$20`, `$21`, tags `$22`, metadata `$23`,
/// custom id `$24`; usage starts at zero),
/// its `session.start` (`$11`–`$16`, as in [`INSERT_EVENTS`]), its start job
/// `$17` in the outbox, and the event's blob if it has one (`$18` hashes,
/// `$19` bytes). The run row comes first and every other part is driven
/// by it (`… FROM run`): with the key taken (`ON CONFLICT … DO NOTHING`)
/// or batch `$4` another tenant's, nothing is written and no row answers.
/// A reused run id is a unique violation.
static ADMIT_RUN: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH run AS ( \
           INSERT INTO runs (id, tenant, idempotency_key, batch_id, goal, status, phase, pull_point, outcome, head_seq, \
             agent, agent_version, tags, metadata, custom_id, parent_run_id, parent_call_id, depth) \
           SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $20, $21, $22, $23, $24, $25, $26, $27 \
           WHERE $4::uuid IS NULL OR EXISTS (SELECT 1 FROM batches WHERE id = $4 AND tenant = $2) \
           ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING \
           RETURNING {SUMMARY_COLUMNS}), \
         blob AS ( \
           INSERT INTO blobs (hash, bytes) SELECT b.hash, b.bytes FROM run, unnest($18::text[], $19::bytea[]) AS b(hash, bytes) \
           ON CONFLICT (hash) DO NOTHING), \
         ev AS ( \
           INSERT INTO events (run_id, seq, kind, at, at_nanos, payload, blob_hash) \
           SELECT r.id, t.seq, t.kind, t.at, t.at_nanos, t.payload::jsonb, t.blob_hash FROM run r, \
             unnest($11::bigint[], $12::text[], $13::timestamptz[], $14::int4[], $15::text[], $16::text[]) AS t(seq, kind, at, at_nanos, payload, blob_hash)), \
         job AS (INSERT INTO outbox (job) SELECT $17 FROM run) \
         SELECT * FROM run"
    )
});

/// A pooled connection inside a transaction its holder opened with a
/// pipelined `BEGIN`: dropped before [`InTransaction::ended`], it is taken
/// out of the pool and closed (the server rolls the transaction back), so
/// no other call ever runs inside it.
struct InTransaction(Option<deadpool_postgres::Client>);

impl InTransaction {
    /// The transaction's `COMMIT` or `ROLLBACK` was answered: back to the pool.
    fn ended(mut self) {
        drop(self.0.take());
    }
}

impl Drop for InTransaction {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

/// The run of `tenant` admitted with `key` before (a concurrent admission
/// that won has committed: `ON CONFLICT` waited for it).
async fn admitted_before(
    client: &deadpool_postgres::Client,
    run_id: Uuid,
    tenant: &str,
    key: &Option<String>,
) -> Result<RunSummary, LogError> {
    let fail = |e: tokio_postgres::Error| write_error(run_id, "create_run", &e);
    let existing = client
        .prepare_cached(&format!(
            "SELECT {SUMMARY_COLUMNS} FROM runs WHERE tenant = $1 AND idempotency_key = $2"
        ))
        .await
        .map_err(fail)?;
    let row = client
        .query_opt(&existing, &[&tenant, key])
        .await
        .map_err(fail)?
        .ok_or_else(|| LogError::Unavailable("idempotency key conflict without a run".into()))?;
    summary(&row)
}

const INSERT_BATCH: &str =
    "INSERT INTO batches (id, tenant) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING";
const BATCH_TENANT: &str = "SELECT tenant FROM batches WHERE id = $1";

/// [`LogError::Invalid`] unless `batch` (which must exist) is `tenant`'s:
/// run `run_id` cannot join it. `what`: the call, for a failed read.
async fn batch_owned_by(
    client: &impl GenericClient,
    what: &str,
    run_id: Uuid,
    batch: Uuid,
    tenant: &str,
) -> Result<(), LogError> {
    let row = client
        .query_one(BATCH_TENANT, &[&batch])
        .await
        .map_err(|e| write_error(run_id, what, &e))?;
    if col::<String>(&row, "tenant")? != tenant {
        return Err(LogError::Invalid {
            run_id,
            reason: format!("batch {batch} belongs to another tenant"),
        });
    }
    Ok(())
}

const INSERT_OUTBOX: &str = "INSERT INTO outbox (job) VALUES ($1)";

const LOCK_RUN: &str = "SELECT head_seq, tenant, lease_token, coalesce(lease_expires_at > now(), false) AS live \
     FROM runs WHERE id = $1 FOR NO KEY UPDATE";

/// Run `$1`'s summary `$2`–`$8` ([`summary_set`]).
static UPDATE_SUMMARY: LazyLock<String> =
    LazyLock::new(|| format!("UPDATE runs SET {} WHERE id = $1", summary_set(2, "now()")));

const INSERT_APPROVALS: &str = "INSERT INTO approvals (run_id, tenant, call_id, tool, input, args_hash, requested_at, expires_at, interrupted) \
     SELECT $1, $2, * FROM unnest($3::text[], $4::text[], $5::json[], $6::text[], $7::timestamptz[], $8::timestamptz[], $9::bool[])";

const DECIDE_APPROVALS: &str = "UPDATE approvals SET status = 'decided', decided_at = now() \
     WHERE run_id = $1 AND call_id = ANY($2) AND status = 'pending'";

/// A run that ended leaves nothing to decide.
const CLOSE_APPROVALS: &str = "UPDATE approvals SET status = 'decided', decided_at = now() WHERE run_id = $1 AND status = 'pending'";

const CONSUME_INBOX: &str =
    "UPDATE inbox SET consumed = true WHERE run_id = $1 AND id = ANY($2) AND NOT consumed";

const INSERT_CHECKPOINT: &str = "INSERT INTO checkpoints (run_id, seq, state, state_raw) VALUES ($1, $2, $3::text::jsonb, $4) \
     ON CONFLICT (run_id, seq) DO NOTHING";
const PRUNE_CHECKPOINTS: &str = "DELETE FROM checkpoints WHERE run_id = $1 AND seq < $2";

/// Run `$1`'s row locked for a post; its status tells a finished run (the
/// job's head is read by [`POST_PAYLOAD`], after the lock).
const LOCK_FOR_POST: &str = "SELECT status FROM runs WHERE id = $1 FOR NO KEY UPDATE";
/// Whether a cancel waits in run `$1`'s inbox (its dedupe key is
/// [`crate::CANCEL_KEY`]).
static CANCEL_WAITING: LazyLock<String> = LazyLock::new(|| {
    format!(
        "EXISTS (SELECT 1 FROM inbox WHERE run_id = $1 AND dedupe_key = '{}' AND NOT consumed)",
        crate::CANCEL_KEY
    )
});
/// A post's writes, sent after [`LOCK_FOR_POST`] returned, so that its
/// snapshot sees what committed while the post waited for the lock (a
/// cancel, say; the lock's own statement, whose snapshot predates the wait,
/// would not). `$1` run, `$2` dedupe key, `$3`/`$4` the payload (JSON text,
/// or raw bytes), `$5` the approvals it decides (call ids). The inbox row,
/// unless the run is done, a cancel waits or the dedupe key is taken; only
/// with it: the approvals marked decided, the resume job (`{"run_id",
/// "head_seq", "resume": true}`, [`Job`]'s wire format, with the run's
/// current head) in the outbox, and the same job as a resume hint
/// ([`PgLog::resume_hints`]) to the worker that let go of the run last,
/// while no lease is held. Answers the inbox row's `id` (NULL when refused)
/// and whether a cancel waited (`cancel_pending`).
static POST_PAYLOAD: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH run AS (SELECT head_seq, last_owner, lease_token FROM runs WHERE id = $1 AND status <> 'done'), \
         posted AS ( \
           INSERT INTO inbox (run_id, dedupe_key, payload, payload_raw) SELECT $1, $2, $3::text::jsonb, $4 FROM run \
           WHERE NOT {waiting} ON CONFLICT (run_id, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING RETURNING id), \
         job AS ( \
           SELECT json_build_object('run_id', $1::uuid, 'head_seq', run.head_seq, 'resume', true) AS job, run.last_owner, run.lease_token \
           FROM run, posted), \
         decided AS ( \
           UPDATE approvals SET status = 'decided', decided_at = now() \
           WHERE run_id = $1 AND call_id = ANY($5::text[]) AND status = 'pending' \
             AND cardinality($5::text[]) > 0 AND EXISTS (SELECT 1 FROM posted)), \
         queued AS (INSERT INTO outbox (job) SELECT job FROM job) \
         SELECT (SELECT id FROM posted) AS id, {waiting} AS cancel_pending, \
           (SELECT CASE WHEN last_owner IS NOT NULL AND lease_token IS NULL \
              THEN pg_notify('glia_hint_' || left(encode(sha256(convert_to(last_owner, 'UTF8')), 'hex'), 32), job::text) END FROM job) AS hinted",
        waiting = *CANCEL_WAITING
    )
});

/// Take run `$1`'s lease for owner `$2`, token `$3`, `$4` seconds, when it
/// is free or lapsed (callers add conditions, then [`LEASE_TAKEN`]). `old`
/// is the row before the update: a lease that lapsed (expiry set, not
/// released) is being taken over.
const TAKE_FREE_LEASE: &str = "UPDATE runs r SET lease_owner = $2, lease_token = $3, lease_expires_at = now() + make_interval(secs => $4) \
     FROM runs old WHERE r.id = $1 AND old.id = r.id AND (r.lease_expires_at IS NULL OR r.lease_expires_at <= now())";
const LEASE_TAKEN: &str =
    "RETURNING r.lease_expires_at, old.lease_expires_at IS NOT NULL AS taken_over";
static TAKE_LEASE: LazyLock<String> = LazyLock::new(|| format!("{TAKE_FREE_LEASE} {LEASE_TAKEN}"));
/// [`LogError::LeaseHeld`] from a row of [`LEASE_HOLDER`] or
/// [`OPEN_REFUSED`] whose lease is live.
fn lease_held(run_id: Uuid, row: &Row) -> Result<LogError, LogError> {
    let until: Option<DateTime<Utc>> = col(row, "lease_expires_at")?;
    Ok(LogError::LeaseHeld {
        run_id,
        owner: col::<Option<String>>(row, "lease_owner")?.unwrap_or_default(),
        until: until.ok_or_else(|| corrupt("live lease without expiry".into()))?,
    })
}

/// [`Inbox::open`]'s lease: taken like [`TAKE_LEASE`], but only for a
/// run not done and a job not stale (its head is current, or the run is
/// runnable or has unconsumed inbox items). `$5`: the job's head.
static OPEN_LEASE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{TAKE_FREE_LEASE} AND r.status <> 'done' \
         AND (r.head_seq <= $5 OR r.status = 'runnable' OR EXISTS (SELECT 1 FROM inbox i WHERE i.run_id = r.id AND NOT i.consumed)) {LEASE_TAKEN}"
    )
});
/// Opens the transaction of [`Inbox::open`]'s lease update, committed
/// without waiting for its WAL to reach the disk (`synchronous_commit =
/// off` for that transaction only): the update is on the path from a
/// posted payload to its resume, and the fsync wait was ~2 ms of it under
/// load (BENCHMARKS.md §1g). Losing it is harmless: a lease lost in a
/// crash of the server is a lease that lapsed. Every write under the lease
/// is fenced by its token, and the first durable commit under it flushes
/// it too (the WAL is flushed in order), so nothing durable depends on a
/// lease that was not.
const LEASE_BEGIN: &str = "BEGIN; SET LOCAL synchronous_commit = off";
/// Why [`OPEN_LEASE`] refused.
const OPEN_REFUSED: &str = "SELECT status, head_seq, lease_owner, lease_expires_at, coalesce(lease_expires_at > now(), false) AS live, \
     EXISTS (SELECT 1 FROM inbox i WHERE i.run_id = runs.id AND NOT i.consumed) AS pending FROM runs WHERE id = $1";
/// [`Inbox::open`]'s reads, each empty unless `$2` is the run's lease
/// token (the update before them took the lease): a refused open reads
/// nothing. The latest checkpoint; the events after it (all of them
/// without one); the unconsumed inbox.
const HELD_WITH_TOKEN: &str = "EXISTS (SELECT 1 FROM runs WHERE id = $1 AND lease_token = $2)";
static OPENED_CHECKPOINT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT seq, state::text AS state, state_raw FROM checkpoints WHERE run_id = $1 AND {HELD_WITH_TOKEN} ORDER BY seq DESC LIMIT 1"
    )
});
static OPENED_EVENTS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{EVENT_ROWS} WHERE e.run_id = $1 AND {HELD_WITH_TOKEN} AND e.seq > coalesce((SELECT max(seq) FROM checkpoints WHERE run_id = $1), 0) ORDER BY e.seq"
    )
});
static OPENED_INBOX: LazyLock<String> =
    LazyLock::new(|| format!("{INBOX_ROWS} AND {HELD_WITH_TOKEN} ORDER BY id"));
/// The run's lease token (`NULL` when free).
const LEASE_TOKEN: &str = "SELECT lease_token FROM runs WHERE id = $1";
/// Let run `$1`'s lease go if its token is `$2`, remembering its owner as
/// `last_owner` (where [`POST_PAYLOAD`] sends hints).
const RELEASE: &str = "UPDATE runs SET last_owner = lease_owner, lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL \
     WHERE id = $1 AND lease_token = $2";
/// [`RELEASE`] unless the inbox holds unconsumed items.
static RELEASE_IF_IDLE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{RELEASE} AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.run_id = $1 AND NOT i.consumed)"
    )
});
const LEASE_HOLDER: &str = "SELECT lease_owner, lease_expires_at, coalesce(lease_expires_at > now(), false) AS live FROM runs WHERE id = $1";

#[async_trait]
impl RunLog for PgLog {
    /// One transaction: the batch (created on first use; a batch of another
    /// tenant is [`LogError::Invalid`]), the run row, `session.start` and a
    /// job. A concurrent admission with the same tenant and key waits for
    /// the first and returns it (`ON CONFLICT DO NOTHING`); a reused run id is
    /// [`LogError::Invalid`]. The summary's goal has U+0000 replaced (the
    /// event keeps it).
    async fn create_run(&self, new: NewRun) -> Result<(RunSummary, bool), LogError> {
        let run_id = new.start.run_id;
        let state = RunState::replay(run_id, std::slice::from_ref(&new.start)).map_err(|e| {
            LogError::Invalid {
                run_id,
                reason: e.to_string(),
            }
        })?;
        let encoded = encode_events(
            run_id,
            std::slice::from_ref(&new.start),
            self.blob_threshold,
        )?;
        let columns = SummaryColumns::of(&state)?;
        let goal = state.goal.replace('\0', "\u{FFFD}");
        let (agent, agent_version) = crate::agent_of(&state);
        let agent_version = agent_version.map(|v| i32::try_from(v).unwrap_or(i32::MAX));
        let metadata = serde_json::to_value(&new.metadata)
            .map_err(|e| LogError::Unavailable(e.to_string()))?;
        let job = serde_json::to_value(Job::start(run_id, state.head_seq))
            .map_err(|e| LogError::Unavailable(e.to_string()))?;
        let hashes: Vec<&str> = encoded.blobs.iter().map(|(h, _)| h.as_str()).collect();
        let bytes: Vec<&[u8]> = encoded.blobs.iter().map(|(_, b)| b.as_slice()).collect();
        self.bounded("create_run", async {
            let fail = |e: tokio_postgres::Error| match e.code() {
                Some(&SqlState::UNIQUE_VIOLATION) => LogError::Invalid {
                    run_id,
                    reason: "run id already exists".into(),
                },
                _ => write_error(run_id, "create_run", &e),
            };
            let client = self.client().await?;
            let admit = client.prepare_cached(&ADMIT_RUN).await.map_err(fail)?;
            let depth = i32::try_from(new.depth).unwrap_or(i32::MAX);
            let params: [&(dyn ToSql + Sync); 27] = [
                &run_id,
                &new.tenant,
                &new.idempotency_key,
                &new.batch_id,
                &goal,
                &columns.status,
                &columns.phase,
                &columns.pull_point,
                &columns.outcome,
                &columns.head_seq,
                &encoded.seqs,
                &encoded.kinds,
                &encoded.ats,
                &encoded.at_nanos,
                &encoded.payloads,
                &encoded.blob_hashes,
                &job,
                &hashes,
                &bytes,
                &agent,
                &agent_version,
                &new.tags,
                &metadata,
                &new.custom_id,
                &new.parent_run_id,
                &new.parent_call_id,
                &depth,
            ];
            let Some(batch) = new.batch_id else {
                // One statement, its own transaction: one round trip.
                return match client.query_opt(&admit, &params).await.map_err(fail)? {
                    Some(row) => Ok((summary(&row)?, true)),
                    None => Ok((
                        admitted_before(&client, run_id, &new.tenant, &new.idempotency_key).await?,
                        false,
                    )),
                };
            };
            // The batch first (created on first use) in the run's
            // transaction, pipelined: the statement after it sees its row.
            // Until the transaction's end is answered the connection is
            // `InTransaction`'s: dropped before (a timeout, a caller gone),
            // it is closed, never pooled mid-transaction.
            let insert = client.prepare_cached(INSERT_BATCH).await.map_err(fail)?;
            let open = InTransaction(Some(client));
            let client = open.0.as_ref().expect("held until the end");
            let batch_params: [&(dyn ToSql + Sync); 2] = [&batch, &new.tenant];
            let (begin, batch_row, admitted) = futures::join!(
                client.batch_execute("BEGIN"),
                client.execute(&insert, &batch_params),
                client.query_opt(&admit, &params)
            );
            let result = async {
                begin.map_err(fail)?;
                batch_row.map_err(fail)?;
                if let Some(row) = admitted.map_err(fail)? {
                    return Ok((summary(&row)?, true));
                }
                batch_owned_by(client, "create_run", run_id, batch, &new.tenant).await?;
                Ok((
                    admitted_before(client, run_id, &new.tenant, &new.idempotency_key).await?,
                    false,
                ))
            }
            .await;
            // Only a new run is kept; otherwise nothing is written, a batch
            // row this call created either.
            let end = if matches!(result, Ok((_, true))) {
                "COMMIT"
            } else {
                "ROLLBACK"
            };
            client.batch_execute(end).await.map_err(fail)?;
            open.ended();
            result
        })
        .await
    }

    async fn get_run(&self, run_id: Uuid) -> Result<RunSummary, LogError> {
        self.bounded("get_run", async {
            let client = self.client().await?;
            let st = client
                .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM runs WHERE id = $1"))
                .await
                .map_err(|e| unavailable("get_run", &e))?;
            let row = client
                .query_opt(&st, &[&run_id])
                .await
                .map_err(|e| unavailable("get_run", &e))?;
            summary(&row.ok_or(LogError::NotFound(run_id))?)
        })
        .await
    }

    async fn stranded_children(&self, limit: usize) -> Result<Vec<(Uuid, Uuid)>, LogError> {
        self.bounded("stranded_children", async {
            let client = self.client().await?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = client
                .query(
                    "SELECT c.id, p.id AS parent FROM runs c JOIN runs p ON p.id = c.parent_run_id \
                     WHERE c.parent_run_id IS NOT NULL AND c.status <> 'done' \
                       AND p.status = 'done' \
                       AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.run_id = c.id \
                         AND i.dedupe_key = 'cancel' AND NOT i.consumed) LIMIT $1",
                    &[&limit],
                )
                .await
                .map_err(|e| unavailable("stranded_children", &e))?;
            rows.iter()
                .map(|r| Ok((col(r, "id")?, col(r, "parent")?)))
                .collect()
        })
        .await
    }

    /// Filters become SQL predicates (one cached statement per combination),
    /// newest first: each selective filter has an index that reads the
    /// tenant's newest rows first (V13). A text filter with U+0000 (which no
    /// stored text holds) matches nothing.
    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, LogError> {
        if filter.has_nul() {
            return Ok(Vec::new());
        }
        let mut select = Select::new(format!("SELECT {SUMMARY_COLUMNS} FROM runs WHERE true"));
        if let Some(tenant) = &filter.tenant {
            select.and("tenant =", tenant.clone());
        }
        if let Some(status) = filter.status {
            select.and("status =", status.as_str());
        }
        if let Some(outcome) = filter.outcome {
            select.and("status = 'done' AND outcome->>'kind' =", outcome.as_str());
        }
        if let Some(agent) = &filter.agent {
            select.and("agent =", agent.clone());
        }
        if let Some(version) = filter.agent_version {
            let Ok(version) = i32::try_from(version) else {
                return Ok(Vec::new());
            };
            select.and("agent_version =", version);
        }
        if let Some(batch) = filter.batch_id {
            select.and("batch_id =", batch);
        }
        if !filter.tags.is_empty() {
            select.and("tags @>", filter.tags.clone());
        }
        if !filter.metadata.is_empty() {
            let pairs = serde_json::to_value(&filter.metadata)
                .map_err(|e| LogError::Unavailable(e.to_string()))?;
            select.and("metadata @>", pairs);
        }
        if let Some(after) = filter.created_after {
            select.and("created_at >=", after);
        }
        if let Some(before) = filter.created_before {
            select.and("created_at <", before);
        }
        if let Some(min) = filter.min_cost_usd_micros {
            let Ok(min) = i64::try_from(min) else {
                return Ok(Vec::new());
            };
            select.and("cost_usd_micros >=", min);
        }
        if let Some(max) = filter.max_cost_usd_micros {
            select.and("cost_usd_micros <=", i64::try_from(max).unwrap_or(i64::MAX));
        }
        if let Some(q) = &filter.q {
            // Only a failed or cancelled run has an error: `runs_tenant_status`
            // serves the search where the trigram index does not.
            select.and("status = 'done' AND error ILIKE", like_pattern(q));
        }
        if let Some(parent) = filter.parent {
            select.and("parent_run_id =", parent);
        }
        if let Some(point) = &filter.pull_point {
            select.and("status = 'parked' AND pull_point->>'kind' =", point.clone());
        }
        if let Some(before) = filter.before {
            select.and("id <", before);
        }
        let rows = select
            .rows(self, "list_runs", "id DESC", filter.limit.clamp(1, 1000))
            .await?;
        rows.iter().map(summary).collect()
    }

    /// Payloads stored in blobs are read back (and their hash verified).
    async fn events(&self, run_id: Uuid, after: u64, limit: usize) -> Result<Vec<Event>, LogError> {
        self.bounded("events", async {
            let client = self.client().await?;
            let events = read_events(&client, run_id, after, sql_limit(limit)).await?;
            if events.is_empty() && !run_exists(&client, run_id).await? {
                return Err(LogError::NotFound(run_id));
            }
            Ok(events)
        })
        .await
    }

    /// Reads the latest checkpoint and the events after it (at most about
    /// `max(checkpoint_every, history / 4)` plus one commit's).
    async fn load(&self, run_id: Uuid) -> Result<RunState, LogError> {
        self.bounded("load", async {
            let client = self.client().await?;
            rebuild(&client, run_id)
                .await?
                .ok_or(LogError::NotFound(run_id))
        })
        .await
    }

    /// Expiry is `now() + ttl` by the database clock (TTL capped at about ten
    /// years); the token is a new UUIDv7.
    async fn acquire(&self, run_id: Uuid, owner: &str, ttl: Duration) -> Result<Lease, LogError> {
        let token = Uuid::now_v7();
        let secs = ttl_secs(ttl);
        self.bounded("acquire", async {
            let fail = |e: tokio_postgres::Error| write_error(run_id, "acquire", &e);
            let client = self.client().await?;
            let take = client.prepare_cached(&TAKE_LEASE).await.map_err(fail)?;
            let holder = client.prepare_cached(LEASE_HOLDER).await.map_err(fail)?;
            // A lease released or lapsed between the two statements is taken
            // on the next round.
            for _ in 0..3 {
                if let Some(row) = client
                    .query_opt(&take, &[&run_id, &owner, &token, &secs])
                    .await
                    .map_err(fail)?
                {
                    return Ok(Lease {
                        run_id,
                        owner: owner.to_owned(),
                        token,
                        expires_at: col(&row, "lease_expires_at")?,
                        taken_over: col(&row, "taken_over")?,
                    });
                }
                let row = client
                    .query_opt(&holder, &[&run_id])
                    .await
                    .map_err(fail)?
                    .ok_or(LogError::NotFound(run_id))?;
                if col(&row, "live")? {
                    return Err(lease_held(run_id, &row)?);
                }
            }
            Err(LogError::Unavailable(format!(
                "run {run_id}: lease contended"
            )))
        })
        .await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease, LogError> {
        let secs = ttl_secs(ttl);
        let run_id = lease.run_id;
        self.bounded("renew", async {
            let fail = |e: tokio_postgres::Error| unavailable("renew", &e);
            let client = self.client().await?;
            let st = client
                .prepare_cached(
                    "UPDATE runs SET lease_expires_at = now() + make_interval(secs => $3) \
                     WHERE id = $1 AND lease_token = $2 AND lease_expires_at > now() RETURNING lease_owner, lease_expires_at",
                )
                .await
                .map_err(fail)?;
            match client.query_opt(&st, &[&run_id, &lease.token, &secs]).await.map_err(fail)? {
                Some(row) => Ok(Lease {
                    run_id,
                    owner: col::<Option<String>>(&row, "lease_owner")?.unwrap_or_default(),
                    token: lease.token,
                    expires_at: col(&row, "lease_expires_at")?,
                    taken_over: false,
                }),
                None if run_exists(&client, run_id).await? => Err(LogError::LeaseLost(run_id)),
                None => Err(LogError::NotFound(run_id)),
            }
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<(), LogError> {
        self.bounded("release", async {
            let fail = |e: tokio_postgres::Error| unavailable("release", &e);
            let client = self.client().await?;
            let st = client.prepare_cached(RELEASE).await.map_err(fail)?;
            client
                .execute(&st, &[&lease.run_id, &lease.token])
                .await
                .map_err(fail)?;
            Ok(())
        })
        .await
    }

    /// One transaction, see the module documentation; how it is written
    /// depends on [`PgOptions::commit_mode`]. A commit without
    /// events only consumes inbox items; its `state.head_seq` must equal the
    /// head ([`LogError::Conflict`] otherwise). Transitions are verified when
    /// a checkpoint is written, not on every commit.
    async fn commit(
        &self,
        lease: &Lease,
        events: &[Event],
        state: &RunState,
        consumed: &[i64],
    ) -> Result<(), LogError> {
        let run_id = lease.run_id;
        check_envelope(run_id, events, state)?;
        let encoded = encode_events(run_id, events, self.blob_threshold)?;
        let columns = SummaryColumns::of(state)?;
        let one_statement = self.commit_mode != CommitMode::Transaction
            && encoded.blobs.is_empty()
            && events.first().is_some_and(|first| {
                state.head_seq < next_checkpoint(first.seq - 1, self.checkpoint_every)
            });
        if one_statement {
            let step = group::Step::new(lease, events, state, consumed, encoded, columns);
            return match &self.group {
                Some(committer) => self.bounded("commit", committer.submit(step)).await,
                None => {
                    self.bounded("commit", async {
                        let client = self.client().await?;
                        group::write_alone(&client, &[&step])
                            .await
                            .pop()
                            .unwrap_or(Err(LogError::Unavailable("commit: no answer".into())))
                    })
                    .await
                }
            };
        }
        let (mut calls, mut tools, mut inputs, mut hashes, mut requested_at) =
            (vec![], vec![], vec![], vec![], vec![]);
        let mut expires: Vec<Option<DateTime<Utc>>> = Vec::new();
        let mut interruptions: Vec<bool> = Vec::new();
        let mut resolved: Vec<&str> = Vec::new();
        for e in events {
            match &e.kind {
                EventKind::ApprovalRequested {
                    call_id,
                    tool,
                    input,
                    args_hash,
                    expires_at,
                    interrupted,
                } => {
                    expires.push(*expires_at);
                    interruptions.push(*interrupted);
                    calls.push(call_id.as_str());
                    tools.push(tool.as_str());
                    inputs.push(input);
                    hashes.push(args_hash.as_str());
                    requested_at.push(e.at);
                }
                EventKind::ApprovalResolved { call_id, .. } => resolved.push(call_id.as_str()),
                _ => {}
            }
        }
        self.bounded("commit", async {
            let fail = |e: tokio_postgres::Error| write_error(run_id, "commit", &e);
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(fail)?;
            let lock = tx.prepare_cached(LOCK_RUN).await.map_err(fail)?;
            let row = tx
                .query_opt(&lock, &[&run_id])
                .await
                .map_err(fail)?
                .ok_or(LogError::NotFound(run_id))?;
            let token: Option<Uuid> = col(&row, "lease_token")?;
            if token != Some(lease.token) || !col::<bool>(&row, "live")? {
                return Err(LogError::LeaseLost(run_id));
            }
            let head = seq_of(col(&row, "head_seq")?, "head_seq")?;
            match events.first() {
                Some(first) if first.seq != head + 1 => {
                    return Err(LogError::Conflict {
                        run_id,
                        expected: first.seq - 1,
                        actual: head,
                    });
                }
                None if state.head_seq != head => {
                    return Err(LogError::Conflict {
                        run_id,
                        expected: state.head_seq,
                        actual: head,
                    });
                }
                _ => {}
            }
            let tenant: String = col(&row, "tenant")?;

            let checkpoint = if !events.is_empty()
                && state.head_seq >= next_checkpoint(head, self.checkpoint_every)
            {
                let rebuilt = self.checkpoint_state(&tx, run_id, events, state).await?;
                let cell = JsonCell::of(&rebuilt).map_err(|e| LogError::Invalid {
                    run_id,
                    reason: format!("state does not serialise: {e}"),
                })?;
                Some((sql_seq(rebuilt.head_seq), cell))
            } else {
                None
            };

            let update = tx.prepare_cached(&UPDATE_SUMMARY).await.map_err(fail)?;
            let approve = tx.prepare_cached(INSERT_APPROVALS).await.map_err(fail)?;
            let decide = tx.prepare_cached(DECIDE_APPROVALS).await.map_err(fail)?;
            let close = tx.prepare_cached(CLOSE_APPROVALS).await.map_err(fail)?;
            let ended = state.phase == Phase::Done;
            let close_params: [&(dyn ToSql + Sync); 1] = [&run_id];
            let consume = tx.prepare_cached(CONSUME_INBOX).await.map_err(fail)?;
            let save = tx.prepare_cached(INSERT_CHECKPOINT).await.map_err(fail)?;
            let prune = tx.prepare_cached(PRUNE_CHECKPOINTS).await.map_err(fail)?;
            let has_events = !events.is_empty();
            let summary_params: [&(dyn ToSql + Sync); 8] = [
                &run_id,
                &columns.status,
                &columns.phase,
                &columns.pull_point,
                &columns.outcome,
                &columns.head_seq,
                &columns.usage,
                &columns.error,
            ];
            let approval_params: [&(dyn ToSql + Sync); 9] = [
                &run_id,
                &tenant,
                &calls,
                &tools,
                &inputs,
                &hashes,
                &requested_at,
                &expires,
                &interruptions,
            ];
            let decide_params: [&(dyn ToSql + Sync); 2] = [&run_id, &resolved];
            let consume_params: [&(dyn ToSql + Sync); 2] = [&run_id, &consumed];
            let (checkpoint_seq, checkpoint_text, checkpoint_raw) = match &checkpoint {
                Some((seq, cell)) => (*seq, cell.text.as_deref(), cell.raw.as_deref()),
                None => (0, None, None),
            };
            let save_params: [&(dyn ToSql + Sync); 4] =
                [&run_id, &checkpoint_seq, &checkpoint_text, &checkpoint_raw];
            let prune_params: [&(dyn ToSql + Sync); 2] = [&run_id, &checkpoint_seq];
            // Pipelined: each request is sent when its future is first polled,
            // in this order; the order only matters inside `write_events`.
            futures::try_join!(
                maybe(has_events.then(|| write_events(&tx, run_id, &encoded))),
                maybe(has_events.then(|| tx.execute(&update, &summary_params))),
                maybe((!calls.is_empty()).then(|| tx.execute(&approve, &approval_params))),
                maybe((!resolved.is_empty()).then(|| tx.execute(&decide, &decide_params))),
                maybe(ended.then(|| tx.execute(&close, &close_params))),
                maybe((!consumed.is_empty()).then(|| tx.execute(&consume, &consume_params))),
                maybe(
                    checkpoint
                        .is_some()
                        .then(|| tx.execute(&save, &save_params))
                ),
                maybe(
                    checkpoint
                        .is_some()
                        .then(|| tx.execute(&prune, &prune_params))
                ),
            )
            .map_err(fail)?;
            tx.commit().await.map_err(fail)?;
            Ok(())
        })
        .await
    }

    /// One transaction: the run row locked (`FOR UPDATE`: posts and commits
    /// of the run wait), then the writes of [`RunLog::erase_run`]; events are
    /// rewritten under `glia.erasing` (V14's triggers), only those whose
    /// tombstone differs. A blob is deleted when no event references it any
    /// more; one a concurrent commit of another run has just referenced makes
    /// the erasure fail as [`LogError::Unavailable`] (ask again).
    async fn erase_run(
        &self,
        run_id: Uuid,
        by: &str,
        at: DateTime<Utc>,
    ) -> Result<RunSummary, LogError> {
        self.bounded("erase_run", async {
            let fail = |e: tokio_postgres::Error| write_error(run_id, "erase_run", &e);
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(fail)?;
            let row = tx
                .query_opt(
                    "SELECT status, erased_at IS NOT NULL AS erased, lease_owner, lease_expires_at,                             coalesce(lease_expires_at > now(), false) AS live, goal, outcome::text AS outcome, pull_point::text AS pull_point                      FROM runs WHERE id = $1 FOR UPDATE",
                    &[&run_id],
                )
                .await
                .map_err(fail)?
                .ok_or(LogError::NotFound(run_id))?;
            if !col::<bool>(&row, "erased")? {
                if parse_status(col(&row, "status")?)? != RunStatus::Done {
                    return Err(LogError::NotFinished(run_id));
                }
                if col::<bool>(&row, "live")? {
                    return Err(lease_held(run_id, &row)?);
                }
                erase_in(&tx, run_id, by, at, &row, self.blob_threshold).await?;
            }
            let summary = summary(
                &tx.query_one(&format!("SELECT {SUMMARY_COLUMNS} FROM runs WHERE id = $1"), &[&run_id])
                    .await
                    .map_err(fail)?,
            )?;
            tx.commit().await.map_err(fail)?;
            Ok(summary)
        })
        .await
    }

    async fn expired_runs(&self, filter: &ExpiredFilter) -> Result<Vec<Uuid>, LogError> {
        let mut select =
            Select::new("SELECT id FROM runs WHERE status = 'done' AND erased_at IS NULL");
        select.and("ended_at <", filter.finished_before);
        match &filter.tenant {
            Some(tenant) => select.and("tenant =", tenant.clone()),
            None if !filter.except_tenants.is_empty() => {
                select.params.push(Box::new(filter.except_tenants.clone()));
                select
                    .sql
                    .push_str(&format!(" AND tenant <> ALL(${})", select.params.len()));
            }
            None => {}
        }
        let rows = select
            .rows(
                self,
                "expired_runs",
                "ended_at, id",
                filter.limit.clamp(1, 1000),
            )
            .await?;
        rows.iter().map(|row| col(row, "id")).collect()
    }
}

/// The writes of [`RunLog::erase_run`] for the run locked in `row`, in `tx`.
async fn erase_in(
    tx: &Transaction<'_>,
    run_id: Uuid,
    by: &str,
    at: DateTime<Utc>,
    row: &Row,
    blob_threshold: usize,
) -> Result<(), LogError> {
    let fail = |e: tokio_postgres::Error| write_error(run_id, "erase_run", &e);
    let invalid = |what: &str, e: serde_json::Error| LogError::Invalid {
        run_id,
        reason: format!("{what} does not serialise: {e}"),
    };
    let goal: String = col(row, "goal")?;
    let outcome = optional_json::<Outcome>(row, "outcome")?
        .map(|o| serde_json::to_value(o.erased()))
        .transpose()
        .map_err(|e| invalid("outcome", e))?;
    let pull_point = optional_json::<PullPoint>(row, "pull_point")?
        .map(|p| serde_json::to_value(p.erased()))
        .transpose()
        .map_err(|e| invalid("pull point", e))?;
    // The run is marked first: V14's row trigger rewrites only an erased
    // run's events.
    tx.batch_execute("SELECT set_config('glia.erasing', 'on', true)")
        .await
        .map_err(fail)?;
    tx.execute(
        "UPDATE runs SET goal = $2, outcome = $3, pull_point = $4, erased_at = $5, erased_by = $6, \
         error = CASE WHEN error IS NULL THEN NULL ELSE $7 END WHERE id = $1",
        &[
            &run_id,
            &erasure::erased_text(&goal),
            &outcome,
            &pull_point,
            &at,
            &by,
            &glia_proto::TOMBSTONE,
        ],
    )
    .await
    .map_err(fail)?;
    let old_blobs: Vec<String> = tx
        .query(
            "SELECT DISTINCT blob_hash FROM events WHERE run_id = $1 AND blob_hash IS NOT NULL",
            &[&run_id],
        )
        .await
        .map_err(fail)?
        .iter()
        .map(|r| col(r, "blob_hash"))
        .collect::<Result<_, _>>()?;
    let events = read_events(tx, run_id, 0, i64::MAX).await?;
    let changed: Vec<Event> = events
        .iter()
        .map(Event::erased)
        .zip(&events)
        .filter(|(erased, e)| erased != *e)
        .map(|(erased, _)| erased)
        .collect();
    let enc = encode_events(run_id, &changed, blob_threshold)?;
    if !enc.blobs.is_empty() {
        let hashes: Vec<&str> = enc.blobs.iter().map(|(h, _)| h.as_str()).collect();
        let bytes: Vec<&[u8]> = enc.blobs.iter().map(|(_, b)| b.as_slice()).collect();
        tx.execute(INSERT_BLOBS, &[&hashes, &bytes])
            .await
            .map_err(fail)?;
    }
    tx.execute(
        "UPDATE events e SET payload = t.payload::jsonb, blob_hash = t.blob_hash          FROM unnest($2::bigint[], $3::text[], $4::text[]) AS t(seq, payload, blob_hash)          WHERE e.run_id = $1 AND e.seq = t.seq",
        &[&run_id, &enc.seqs, &enc.payloads, &enc.blob_hashes],
    )
    .await
    .map_err(fail)?;
    if !old_blobs.is_empty() {
        tx.execute(
            "DELETE FROM blobs b WHERE b.hash = ANY($1) AND NOT EXISTS (SELECT 1 FROM events e WHERE e.blob_hash = b.hash)",
            &[&old_blobs],
        )
        .await
        .map_err(|e| match e.code() {
            Some(&SqlState::FOREIGN_KEY_VIOLATION) => {
                unavailable("erase_run: a blob was referenced again meanwhile", &e)
            }
            _ => fail(e),
        })?;
    }
    tx.execute("DELETE FROM checkpoints WHERE run_id = $1", &[&run_id])
        .await
        .map_err(fail)?;
    tx.execute(
        "UPDATE approvals SET input = $2, args_hash = $3 WHERE run_id = $1",
        &[
            &run_id,
            &erasure::erased_value(),
            &erasure::erased_args_hash(),
        ],
    )
    .await
    .map_err(fail)?;
    let items = tx
        .query(
            "SELECT id, payload::text AS payload, payload_raw FROM inbox WHERE run_id = $1",
            &[&run_id],
        )
        .await
        .map_err(fail)?;
    for item in decode_inbox(&items)? {
        let cell = JsonCell::of(&item.payload.erased()).map_err(|e| invalid("inbox payload", e))?;
        tx.execute(
            "UPDATE inbox SET payload = $2::text::jsonb, payload_raw = $3 WHERE id = $1",
            &[&item.id, &cell.text, &cell.raw],
        )
        .await
        .map_err(fail)?;
    }
    // A webhook delivery carries ids and kinds, and a decision's reason or
    // a failure's text: those become the tombstone.
    tx.execute(
        "UPDATE webhook_deliveries SET payload = jsonb_set(payload, '{data}',              (payload->'data') || coalesce((SELECT jsonb_object_agg(k, to_jsonb($2::text))                  FROM jsonb_object_keys(payload->'data') AS k WHERE k IN ('reason', 'error')), '{}'::jsonb))          WHERE run_id = $1 AND jsonb_typeof(payload->'data') = 'object'",
        &[&run_id, &glia_proto::TOMBSTONE],
    )
    .await
    .map_err(fail)?;
    tx.execute(
        "UPDATE batch_items SET goal = $2, recorded_tools = NULL WHERE run_id = $1",
        &[&run_id, &glia_proto::TOMBSTONE],
    )
    .await
    .map_err(fail)?;
    Ok(())
}

#[async_trait]
impl Inbox for PgLog {
    /// One transaction, one round trip: `BEGIN`, the run row locked
    /// ([`LOCK_FOR_POST`], serialising the post with the run's other posts
    /// and its commits), then [`POST_PAYLOAD`] (the inbox row, unless the run
    /// is done, a cancel waits, even one committed while this waited for the
    /// lock, or the dedupe key is taken; with it the approval marked decided,
    /// a job with the current head and a resume hint) and `COMMIT`, sent
    /// together. A refused payload wrote nothing, so its `COMMIT` only lets
    /// go of the lock. Refusals: [`LogError::NotFound`],
    /// [`LogError::Finished`], [`LogError::Cancelled`], [`LogError::Duplicate`].
    async fn post(&self, run_id: Uuid, payload: Payload) -> Result<i64, LogError> {
        let key = dedupe_key(&payload);
        let cell = JsonCell::of(&payload).map_err(|e| LogError::Invalid {
            run_id,
            reason: format!("payload does not serialise: {e}"),
        })?;
        let decided: Vec<&str> = match &payload {
            Payload::Approval { call_id, .. } => vec![call_id.as_str()],
            _ => vec![],
        };
        let deadline = tokio::time::Instant::now() + self.call_timeout;
        let late =
            || LogError::Unavailable(format!("post: no answer within {:?}", self.call_timeout));
        let fail = |e: tokio_postgres::Error| write_error(run_id, "post", &e);
        let (client, lock, post) = tokio::time::timeout_at(deadline, async {
            let client = self.client().await?;
            let (lock, post) = futures::try_join!(
                client.prepare_cached(LOCK_FOR_POST),
                client.prepare_cached(&POST_PAYLOAD)
            )
            .map_err(fail)?;
            Ok::<_, LogError>((client, lock, post))
        })
        .await
        .map_err(|_| late())??;
        // `COMMIT` is on its way before the lock is granted: a wait for a
        // lock (the run row, a concurrent post's dedupe key) must end on the
        // server, failing the transaction, before the caller gives up. (The
        // connection's `statement_timeout` ends it too, first when it is
        // the shorter: by default 30 s against a 60 s call.)
        let begin = format!(
            "BEGIN; SET LOCAL lock_timeout = {}",
            lock_timeout_ms(deadline.saturating_duration_since(tokio::time::Instant::now()))
        );
        let lock_params: [&(dyn ToSql + Sync); 1] = [&run_id];
        let post_params: [&(dyn ToSql + Sync); 5] =
            [&run_id, &key, &cell.text, &cell.raw, &decided];
        // Sent in one write, in this order (each request goes out when its
        // future is first polled); a statement that fails makes `COMMIT` a
        // rollback.
        let pipeline = async {
            futures::join!(
                client.batch_execute(&begin),
                client.query_opt(&lock, &lock_params),
                client.query_one(&post, &post_params),
                client.batch_execute("COMMIT"),
            )
        };
        let (begin, locked, posted, commit) =
            match tokio::time::timeout_at(deadline, pipeline).await {
                Ok(answers) => answers,
                Err(_) => {
                    // Perhaps inside the transaction still: never back to the
                    // pool. A lock wait ends by `lock_timeout`, rolling it back.
                    drop(deadpool_postgres::Object::take(client));
                    return Err(late());
                }
            };
        begin.map_err(fail)?;
        let (locked, posted) = (locked.map_err(fail)?, posted.map_err(fail)?);
        commit.map_err(fail)?;
        let run = locked.ok_or(LogError::NotFound(run_id))?;
        let done = col::<String>(&run, "status")? == "done";
        if !done && let Some(id) = col::<Option<i64>>(&posted, "id")? {
            return Ok(id);
        }
        // Refused in SQL (a done run, a waiting cancel, or, the insert
        // finding its dedupe key taken): the rule tells which answer.
        let facts = crate::PostFacts {
            done,
            cancel_pending: col::<bool>(&posted, "cancel_pending")?,
            key_taken: true,
        };
        Err(crate::post_refusal(run_id, key.as_deref(), facts)
            .unwrap_or_else(|| corrupt("post: refused without a reason".into())))
    }

    async fn inbox(&self, run_id: Uuid) -> Result<Vec<InboxItem>, LogError> {
        self.bounded("inbox", async {
            let client = self.client().await?;
            let st = client
                .prepare_cached(&INBOX_PENDING)
                .await
                .map_err(|e| unavailable("inbox", &e))?;
            let rows = client
                .query(&st, &[&run_id])
                .await
                .map_err(|e| unavailable("inbox", &e))?;
            if rows.is_empty() && !run_exists(&client, run_id).await? {
                return Err(LogError::NotFound(run_id));
            }
            decode_inbox(&rows)
        })
        .await
    }

    /// One round trip: the lease update ([`OPEN_LEASE`], which refuses a
    /// done run and a stale job as well as a held lease; in a transaction
    /// of its own committed without waiting for the disk, [`LEASE_BEGIN`])
    /// and the three reads (the latest checkpoint, the events after it, the
    /// inbox; each in its own implicit transaction) are sent pipelined on
    /// one connection, in that order: the reads see the run as the lease found it (no other
    /// worker can commit to it meanwhile; a post may add to the inbox, and
    /// is then also read by `release_if_idle`), and read nothing when the
    /// update refused (they check the lease token). Only when the update refuses is the
    /// run read again to tell why (a lease let go in between is taken on
    /// the next of three rounds).
    async fn open(&self, job: &Job, owner: &str, ttl: Duration) -> Result<Opening, LogError> {
        let run_id = job.run_id;
        let token = Uuid::now_v7();
        let secs = ttl_secs(ttl);
        let job_head = sql_seq(job.head_seq);
        self.bounded("open", async {
            let fail = |e: tokio_postgres::Error| write_error(run_id, "open", &e);
            let client = self.client().await?;
            let take = client.prepare_cached(&OPEN_LEASE).await.map_err(fail)?;
            let refused = client.prepare_cached(OPEN_REFUSED).await.map_err(fail)?;
            let read_checkpoint = client
                .prepare_cached(&OPENED_CHECKPOINT)
                .await
                .map_err(fail)?;
            let read_events_after = client.prepare_cached(&OPENED_EVENTS).await.map_err(fail)?;
            let read_inbox = client.prepare_cached(&OPENED_INBOX).await.map_err(fail)?;
            let take_params: [&(dyn ToSql + Sync); 5] = [&run_id, &owner, &token, &secs, &job_head];
            let run_params: [&(dyn ToSql + Sync); 1] = [&run_id];
            let read_params: [&(dyn ToSql + Sync); 2] = [&run_id, &token];
            for _ in 0..3 {
                let (begin, taken, commit, checkpoint, events, inbox) = futures::join!(
                    client.batch_execute(LEASE_BEGIN),
                    client.query_opt(&take, &take_params),
                    client.batch_execute("COMMIT"),
                    client.query_opt(&read_checkpoint, &read_params),
                    client.query(&read_events_after, &read_params),
                    client.query(&read_inbox, &read_params),
                );
                begin.map_err(fail)?;
                commit.map_err(fail)?;
                if let Some(row) = taken.map_err(fail)? {
                    let lease = Lease {
                        run_id,
                        owner: owner.to_owned(),
                        token,
                        expires_at: col(&row, "lease_expires_at")?,
                        taken_over: col(&row, "taken_over")?,
                    };
                    let read = async {
                        let (checkpoint, events, inbox) = (
                            checkpoint.map_err(fail)?,
                            events.map_err(fail)?,
                            inbox.map_err(fail)?,
                        );
                        let usable = checkpoint
                            .as_ref()
                            .and_then(|row| usable_checkpoint(run_id, row));
                        let events = if checkpoint.is_some() && usable.is_none() {
                            read_events(&client, run_id, 0, i64::MAX).await?
                        } else {
                            events
                                .iter()
                                .map(|row| decode_event(run_id, row))
                                .collect::<Result<Vec<_>, _>>()?
                        };
                        let state = replay_onto(run_id, usable, &events)?.ok_or_else(|| {
                            corrupt(format!("run {run_id} has a row but no events"))
                        })?;
                        Ok::<_, LogError>((state, decode_inbox(&inbox)?))
                    };
                    return match read.await {
                        Ok((state, inbox)) => Ok(Opening::Opened(Opened {
                            lease,
                            state,
                            inbox,
                        })),
                        Err(e) => {
                            let _ = self.release(&lease).await;
                            Err(e)
                        }
                    };
                }
                let row = client
                    .query_opt(&refused, &run_params)
                    .await
                    .map_err(fail)?
                    .ok_or(LogError::NotFound(run_id))?;
                let status = parse_status(&col::<String>(&row, "status")?)?;
                if status == RunStatus::Done {
                    return Ok(Opening::Done);
                }
                let (moved, pending, live) = (
                    col::<i64>(&row, "head_seq")? > job_head,
                    col::<bool>(&row, "pending")?,
                    col::<bool>(&row, "live")?,
                );
                if moved && !pending && (status != RunStatus::Runnable || (job.resume && live)) {
                    return Ok(Opening::Stale);
                }
                if live {
                    return Err(lease_held(run_id, &row)?);
                }
            }
            Err(LogError::Unavailable(format!(
                "run {run_id}: lease contended"
            )))
        })
        .await
    }

    /// One round trip: the inbox read and [`RELEASE_IF_IDLE`] pipelined, in
    /// that order. Items read: the release saw them too and kept the lease
    /// (unless it was lost; then the holder's commits are refused). Nothing
    /// read and nothing released: the lease is read; lost, the answer is
    /// empty (nothing is held); still ours, a payload was posted between the
    /// two and the pair is sent again (three rounds, then
    /// [`LogError::Unavailable`]).
    ///
    /// A payload whose post was waiting for the run's row lock when the
    /// release ran may be missed by the release's snapshot: the lease is let
    /// go and that payload wakes the run through its own job (no hint: the
    /// post saw the lease held).
    async fn release_if_idle(&self, lease: &Lease) -> Result<Vec<InboxItem>, LogError> {
        let run_id = lease.run_id;
        self.bounded("release_if_idle", async {
            let fail = |e: tokio_postgres::Error| unavailable("release_if_idle", &e);
            let client = self.client().await?;
            let read = client.prepare_cached(&INBOX_PENDING).await.map_err(fail)?;
            let release = client
                .prepare_cached(&RELEASE_IF_IDLE)
                .await
                .map_err(fail)?;
            let (read_params, release_params): (
                [&(dyn ToSql + Sync); 1],
                [&(dyn ToSql + Sync); 2],
            ) = ([&run_id], [&run_id, &lease.token]);
            let holder = client.prepare_cached(LEASE_TOKEN).await.map_err(fail)?;
            for _ in 0..3 {
                let (rows, released) = futures::try_join!(
                    client.query(&read, &read_params),
                    client.execute(&release, &release_params)
                )
                .map_err(fail)?;
                if !rows.is_empty() || released == 1 {
                    return decode_inbox(&rows);
                }
                // Neither: the lease is not ours any more (nothing to let
                // go), or a payload came in between (read again).
                let token: Option<Uuid> = col(
                    &client
                        .query_opt(&holder, &read_params)
                        .await
                        .map_err(fail)?
                        .ok_or(LogError::NotFound(run_id))?,
                    "lease_token",
                )?;
                if token != Some(lease.token) {
                    return Ok(Vec::new());
                }
            }
            Err(LogError::Unavailable(format!(
                "run {run_id}: payloads kept arriving while letting go"
            )))
        })
        .await
    }
}

#[async_trait]
impl Approvals for PgLog {
    /// Oldest first by request time (the event's), then by insertion.
    /// A tenant or tool filter with U+0000 (which `text` cannot hold) matches nothing.
    async fn approvals(&self, filter: &ApprovalFilter) -> Result<Vec<ApprovalRow>, LogError> {
        if [&filter.tenant, &filter.tool]
            .into_iter()
            .flatten()
            .any(|t| t.contains('\0'))
        {
            return Ok(Vec::new());
        }
        let mut select = Select::new(
            "SELECT run_id, tenant, call_id, tool, input::text AS input, args_hash, status, requested_at, expires_at, escalated, interrupted FROM approvals WHERE true",
        );
        if let Some(tenant) = &filter.tenant {
            select.and("tenant =", tenant.clone());
        }
        if let Some(tool) = &filter.tool {
            select.and("tool =", tool.clone());
        }
        if let Some(run) = filter.run_id {
            select.and("run_id =", run);
        }
        if filter.pending_only {
            select.sql.push_str(" AND status = 'pending'");
        }
        if let Some(t) = filter.expired_by {
            select
                .sql
                .push_str(" AND status = 'pending' AND NOT escalated");
            select.and("expires_at <=", t);
        }
        let rows = select
            .rows(
                self,
                "approvals",
                "requested_at, id",
                filter.limit.clamp(1, 1000),
            )
            .await?;
        rows.iter()
            .map(|row| {
                let status: String = col(row, "status")?;
                let input: String = col(row, "input")?;
                Ok(ApprovalRow {
                    run_id: col(row, "run_id")?,
                    tenant: col(row, "tenant")?,
                    call_id: col(row, "call_id")?,
                    tool: col(row, "tool")?,
                    input: serde_json::from_str(&input)
                        .map_err(|e| corrupt(format!("approval input: {e}")))?,
                    args_hash: col(row, "args_hash")?,
                    status: match status.as_str() {
                        "pending" => ApprovalStatus::Pending,
                        "decided" => ApprovalStatus::Decided,
                        other => return Err(corrupt(format!("unknown approval status {other:?}"))),
                    },
                    requested_at: col(row, "requested_at")?,
                    expires_at: col(row, "expires_at")?,
                    escalated: col(row, "escalated")?,
                    interrupted: col(row, "interrupted")?,
                })
            })
            .collect()
    }

    async fn escalate(&self, run_id: Uuid, call_id: &str) -> Result<(), LogError> {
        self.bounded("escalate", async {
            let client = self.client().await?;
            let n = client
                .execute(
                    "UPDATE approvals SET escalated = true WHERE run_id = $1 AND call_id = $2",
                    &[&run_id, &call_id],
                )
                .await
                .map_err(|e| unavailable("escalate", &e))?;
            if n == 0 {
                Err(LogError::NotFound(run_id))
            } else {
                Ok(())
            }
        })
        .await
    }
}

#[async_trait]
impl Outbox for PgLog {
    async fn outbox(&self, limit: usize) -> Result<Vec<(i64, Job)>, LogError> {
        self.bounded("outbox", async {
            let client = self.client().await?;
            let st = client
                .prepare_cached("SELECT id, job::text AS job FROM outbox ORDER BY id LIMIT $1")
                .await
                .map_err(|e| unavailable("outbox", &e))?;
            let rows = client
                .query(&st, &[&sql_limit(limit)])
                .await
                .map_err(|e| unavailable("outbox", &e))?;
            rows.iter()
                .map(|row| {
                    let id: i64 = col(row, "id")?;
                    let job: String = col(row, "job")?;
                    Ok((
                        id,
                        serde_json::from_str(&job)
                            .map_err(|e| corrupt(format!("outbox job {id}: {e}")))?,
                    ))
                })
                .collect()
        })
        .await
    }

    /// Relayed jobs are deleted.
    async fn outbox_done(&self, ids: &[i64]) -> Result<(), LogError> {
        self.bounded("outbox_done", async {
            let client = self.client().await?;
            let st = client
                .prepare_cached("DELETE FROM outbox WHERE id = ANY($1)")
                .await
                .map_err(|e| unavailable("outbox_done", &e))?;
            client
                .execute(&st, &[&ids])
                .await
                .map_err(|e| unavailable("outbox_done", &e))?;
            Ok(())
        })
        .await
    }

    /// Runs not done, runnable or with unconsumed inbox items, whose lease is
    /// absent or expired by the database clock; started runs first, then
    /// by run id.
    async fn orphaned(&self, limit: usize) -> Result<Vec<Orphan>, LogError> {
        self.bounded("orphaned", async {
            let client = self.client().await?;
            let st = client
                .prepare_cached(
                    "SELECT id, head_seq, resume, queued FROM ( \
                       SELECT id, head_seq, status, (head_seq = 1 AND status = 'runnable' AND lease_expires_at IS NULL) AS queued, \
                         EXISTS (SELECT 1 FROM inbox i WHERE i.run_id = r.id AND NOT i.consumed) AS resume FROM runs r \
                       WHERE status <> 'done' AND (lease_expires_at IS NULL OR lease_expires_at <= now()) \
                     ) o WHERE status = 'runnable' OR resume \
                     ORDER BY queued, id LIMIT $1",
                )
                .await
                .map_err(|e| unavailable("orphaned", &e))?;
            let rows = client.query(&st, &[&sql_limit(limit)]).await.map_err(|e| unavailable("orphaned", &e))?;
            rows.iter()
                .map(|row| {
                    let job = Job { run_id: col(row, "id")?, head_seq: seq_of(col(row, "head_seq")?, "head_seq")?, resume: col(row, "resume")? };
                    Ok(Orphan { job, queued: col(row, "queued")? })
                })
                .collect()
        })
        .await
    }
}

#[async_trait]
impl AgentRegistry for PgLog {
    async fn put_agent(
        &self,
        tenant: &str,
        name: &str,
        definition: &str,
        content_hash: &str,
    ) -> Result<(AgentVersion, bool), LogError> {
        self.bounded("put_agent", async {
            let fail = |e: tokio_postgres::Error| unavailable("put_agent", &e);
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(fail)?;
            // One writer per (tenant, name) at a time: the read of the latest version and the insert cannot interleave.
            tx.execute("SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || $2, 7))", &[&tenant, &name]).await.map_err(fail)?;
            let latest = tx.query_opt(AGENT_ROW, &[&tenant, &name, &None::<i32>]).await.map_err(fail)?;
            if let Some(row) = latest {
                let last = agent_of(&row)?;
                if last.content_hash == content_hash {
                    return Ok((last, false));
                }
            }
            let row = tx
                .query_one(
                    "INSERT INTO agents (tenant, name, version, content_hash, definition) \
                     SELECT $1, $2, COALESCE(MAX(version), 0) + 1, $3, $4 FROM agents WHERE tenant = $1 AND name = $2 \
                     RETURNING tenant, name, version, content_hash, definition, created_at",
                    &[&tenant, &name, &content_hash, &definition],
                )
                .await
                .map_err(fail)?;
            let version = agent_of(&row)?;
            tx.commit().await.map_err(fail)?;
            Ok((version, true))
        })
        .await
    }

    async fn get_agent(
        &self,
        tenant: &str,
        name: &str,
        version: Option<u32>,
    ) -> Result<Option<AgentVersion>, LogError> {
        let version = version.map(|v| i32::try_from(v).unwrap_or(i32::MAX));
        self.bounded("get_agent", async {
            let client = self.client().await?;
            let row = client
                .query_opt(AGENT_ROW, &[&tenant, &name, &version])
                .await
                .map_err(|e| unavailable("get_agent", &e))?;
            row.as_ref().map(agent_of).transpose()
        })
        .await
    }

    async fn list_agents(&self, tenant: &str) -> Result<Vec<AgentVersion>, LogError> {
        self.bounded("list_agents", async {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT DISTINCT ON (name) tenant, name, version, content_hash, definition, created_at FROM agents \
                     WHERE tenant = $1 ORDER BY name, version DESC",
                    &[&tenant],
                )
                .await
                .map_err(|e| unavailable("list_agents", &e))?;
            rows.iter().map(agent_of).collect()
        })
        .await
    }
}

#[async_trait]
impl Reports for PgLog {
    /// One statement (one snapshot) over the tenant's runs updated since an
    /// hour before the day began (event times are the workers' clocks,
    /// `updated_at` the database's): inline payloads are summed by the
    /// database from their `usage` and `cost_usd_micros`; payloads stored in
    /// `blobs` (rare: large or NUL-carrying) are decoded here. A rebuild, not
    /// a per-step cost: it reads every event of the tenant's recently active
    /// runs.
    async fn tenant_usage(&self, tenant: &str, day: NaiveDate) -> Result<Spend, LogError> {
        let start = day.and_time(chrono::NaiveTime::MIN).and_utc();
        let end = start + chrono::Duration::days(1);
        let kinds = SPEND_KINDS.to_vec();
        self.bounded("tenant_usage", async {
            let client = self.client().await?;
            let st = client
                .prepare_cached(&TENANT_USAGE)
                .await
                .map_err(|e| unavailable("tenant_usage", &e))?;
            let row = client
                .query_one(&st, &[&tenant, &start, &end, &kinds])
                .await
                .map_err(|e| unavailable("tenant_usage", &e))?;
            spend_of_row(&row, "tenant_usage")
        })
        .await
    }

    async fn ready(&self) -> Result<(), LogError> {
        self.bounded("ready", async {
            let client = self.client().await?;
            client
                .simple_query("SELECT 1")
                .await
                .map_err(|e| unavailable("ready", &e))?;
            Ok(())
        })
        .await
    }

    /// Two counting queries: runs not done (the `runs_live` partial index)
    /// grouped by status and pull point kind; pending approvals (the
    /// `approvals_pending` partial index).
    async fn gauges(&self, now: DateTime<Utc>) -> Result<LogGauges, LogError> {
        self.bounded("gauges", async {
            let fail = |e: tokio_postgres::Error| unavailable("gauges", &e);
            let client = self.client().await?;
            let mut g = LogGauges::default();
            let runs = client
                .query("SELECT status, coalesce(pull_point->>'kind', '') AS pull_point, count(*) AS n FROM runs WHERE status <> 'done' GROUP BY 1, 2", &[])
                .await
                .map_err(fail)?;
            for row in runs {
                let status = parse_status(&col::<String>(&row, "status")?)?;
                let pull_point: String = col(&row, "pull_point")?;
                let n: i64 = col(&row, "n")?;
                let key = RunGaugeKey { status: status.as_str(), pull_point: if status == RunStatus::Parked { pull_point } else { String::new() } };
                *g.runs.entry(key).or_default() += n as u64;
            }
            let row = client
                .query_one(
                    "SELECT count(*) AS pending, count(*) FILTER (WHERE expires_at <= $1) AS overdue, \
                     coalesce(extract(epoch FROM $1 - min(requested_at))::float8, 0) AS oldest \
                     FROM approvals WHERE status = 'pending'",
                    &[&now],
                )
                .await
                .map_err(fail)?;
            g.approvals_pending = col::<i64>(&row, "pending")? as u64;
            g.approvals_overdue = col::<i64>(&row, "overdue")? as u64;
            g.oldest_approval_age_seconds = col::<f64>(&row, "oldest")?.max(0.0);
            Ok(g)
        })
        .await
    }
}

// ---------------------------------------------------------------------------
// Export and import

#[async_trait]
impl crate::archive::Archive for PgLog {
    /// One `REPEATABLE READ` transaction: the row, every event (blobs read
    /// back), approvals and inbox items.
    async fn export_run(&self, run_id: Uuid) -> Result<crate::archive::RunRecord, LogError> {
        use crate::archive::{ApprovalRecord, InboxRecord, RunRecord};
        self.bounded("export_run", async {
            let fail = |e: tokio_postgres::Error| unavailable("export_run", &e);
            let mut client = self.client().await?;
            let tx = client.build_transaction().isolation_level(tokio_postgres::IsolationLevel::RepeatableRead).read_only(true).start().await.map_err(fail)?;
            let row = tx
                .query_opt("SELECT tenant, idempotency_key, batch_id, created_at, tags, metadata, custom_id, erased_at, erased_by, parent_run_id, parent_call_id, depth FROM runs WHERE id = $1", &[&run_id])
                .await
                .map_err(fail)?
                .ok_or(LogError::NotFound(run_id))?;
            let events = read_events(&tx, run_id, 0, i64::MAX).await?;
            let approvals = tx
                .query(
                    "SELECT call_id, tool, input::text AS input, args_hash, status, requested_at, expires_at, escalated, interrupted \
                     FROM approvals WHERE run_id = $1 ORDER BY id",
                    &[&run_id],
                )
                .await
                .map_err(fail)?
                .iter()
                .map(|a| {
                    Ok(ApprovalRecord {
                        call_id: col(a, "call_id")?,
                        tool: col(a, "tool")?,
                        input: serde_json::from_str(&col::<String>(a, "input")?).map_err(|e| corrupt(format!("approval input: {e}")))?,
                        args_hash: col(a, "args_hash")?,
                        status: if col::<String>(a, "status")? == "pending" { ApprovalStatus::Pending } else { ApprovalStatus::Decided },
                        requested_at: col(a, "requested_at")?,
                        expires_at: col(a, "expires_at")?,
                        escalated: col(a, "escalated")?,
                        interrupted: col(a, "interrupted")?,
                    })
                })
                .collect::<Result<Vec<_>, LogError>>()?;
            let inbox = tx
                .query("SELECT id, payload::text AS payload, payload_raw, dedupe_key, consumed FROM inbox WHERE run_id = $1 ORDER BY id", &[&run_id])
                .await
                .map_err(fail)?
                .iter()
                .map(|i| {
                    let id: i64 = col(i, "id")?;
                    let payload = JsonCell::decode(col(i, "payload")?, col(i, "payload_raw")?).map_err(|e| corrupt(format!("inbox item {id}: {e}")))?;
                    Ok(InboxRecord { payload, dedupe_key: col(i, "dedupe_key")?, consumed: col(i, "consumed")? })
                })
                .collect::<Result<Vec<_>, LogError>>()?;
            Ok(RunRecord {
                run_id,
                tenant: col(&row, "tenant")?,
                idempotency_key: col(&row, "idempotency_key")?,
                batch_id: col(&row, "batch_id")?,
                created_at: col(&row, "created_at")?,
                events,
                approvals,
                inbox,
                tags: col(&row, "tags")?,
                metadata: serde_json::from_value(col(&row, "metadata")?)
                    .map_err(|e| corrupt(format!("column metadata: {e}")))?,
                custom_id: col(&row, "custom_id")?,
                erased: match (col(&row, "erased_at")?, col::<Option<String>>(&row, "erased_by")?) {
                    (Some(at), by) => Some(crate::archive::Erasure { at, by: by.unwrap_or_default() }),
                    (None, _) => None,
                },
                parent_run_id: col(&row, "parent_run_id")?,
                parent_call_id: col(&row, "parent_call_id")?,
                depth: u32::try_from(col::<i32>(&row, "depth")?).map_err(|e| corrupt(format!("column depth: {e}")))?,
            })
        })
        .await
    }

    /// One transaction; see [`crate::archive::Archive::import_run`].
    async fn import_run(
        &self,
        run: &crate::archive::RunRecord,
    ) -> Result<crate::archive::Imported, LogError> {
        use crate::archive::Imported;
        let run_id = run.run_id;
        let run = &run.erased_content();
        let state = run.validate()?;
        let job = run.job(&state);
        let encoded = encode_events(run_id, &run.events, self.blob_threshold)?;
        let columns = SummaryColumns::of(&state)?;
        let goal = match run.erased {
            Some(_) => glia_proto::TOMBSTONE.to_owned(),
            None => state.goal.replace('\0', "\u{FFFD}"),
        };
        let (erased_at, erased_by) = run.erased.as_ref().map(|e| (e.at, e.by.clone())).unzip();
        let updated_at = run.events.last().map_or(run.created_at, |e| e.at);
        let depth = i32::try_from(run.depth).map_err(|_| LogError::Invalid {
            run_id,
            reason: format!("depth {} is out of range", run.depth),
        })?;
        self.bounded("import_run", async {
            let fail = |e: tokio_postgres::Error| write_error(run_id, "import_run", &e);
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(fail)?;
            if let Some(row) = tx.query_opt("SELECT head_seq FROM runs WHERE id = $1 FOR UPDATE", &[&run_id]).await.map_err(fail)? {
                let head = seq_of(col(&row, "head_seq")?, "head_seq")?;
                return if head == state.head_seq { Ok(Imported::AlreadyPresent) } else { Err(LogError::Conflict { run_id, expected: state.head_seq, actual: head }) };
            }
            if let Some(key) = &run.idempotency_key
                && let Some(other) = tx.query_opt("SELECT id FROM runs WHERE tenant = $1 AND idempotency_key = $2", &[&run.tenant, key]).await.map_err(fail)?
            {
                let other: Uuid = col(&other, "id")?;
                return Err(LogError::Invalid { run_id, reason: format!("tenant {} already uses idempotency key {key:?} for run {other}", run.tenant) });
            }
            if let Some(batch) = run.batch_id {
                tx.execute(INSERT_BATCH, &[&batch, &run.tenant]).await.map_err(fail)?;
                batch_owned_by(&tx, "import_run", run_id, batch, &run.tenant).await?;
            }
            let (agent, agent_version) = crate::agent_of(&state);
            let agent_version = agent_version.map(|v| i32::try_from(v).unwrap_or(i32::MAX));
            let metadata = serde_json::to_value(&run.metadata).map_err(|e| LogError::Unavailable(e.to_string()))?;
            tx.execute(
                "INSERT INTO runs (id, tenant, idempotency_key, batch_id, goal, status, phase, head_seq, created_at, agent, agent_version, tags, metadata, custom_id, \
                   parent_run_id, parent_call_id, depth) \
                 VALUES ($1, $2, $3, $4, $5, 'runnable', 'planning', 1, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
                &[&run_id, &run.tenant, &run.idempotency_key, &run.batch_id, &goal, &run.created_at, &agent, &agent_version, &run.tags, &metadata, &run.custom_id,
                  &run.parent_run_id, &run.parent_call_id, &depth],
            )
            .await
            .map_err(fail)?;
            // The summary as a commit writes it, dated by the run's last event.
            tx.execute(
                &format!("UPDATE runs SET {} WHERE id = $1", summary_set(2, "$9")),
                &[&run_id, &columns.status, &columns.phase, &columns.pull_point, &columns.outcome, &columns.head_seq, &columns.usage, &columns.error, &updated_at],
            )
            .await
            .map_err(fail)?;
            if erased_at.is_some() {
                tx.execute("UPDATE runs SET erased_at = $2, erased_by = $3 WHERE id = $1", &[&run_id, &erased_at, &erased_by]).await.map_err(fail)?;
            }
            write_events(&tx, run_id, &encoded).await.map_err(fail)?;
            for a in &run.approvals {
                let status = if a.status == ApprovalStatus::Pending { "pending" } else { "decided" };
                tx.execute(
                    "INSERT INTO approvals (run_id, tenant, call_id, tool, input, args_hash, status, requested_at, expires_at, escalated, interrupted) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                    &[&run_id, &run.tenant, &a.call_id, &a.tool, &a.input, &a.args_hash, &status, &a.requested_at, &a.expires_at, &a.escalated, &a.interrupted],
                )
                .await
                .map_err(fail)?;
            }
            for item in &run.inbox {
                let cell = JsonCell::of(&item.payload).map_err(|e| LogError::Invalid { run_id, reason: format!("payload does not serialise: {e}") })?;
                tx.execute(
                    "INSERT INTO inbox (run_id, dedupe_key, payload, payload_raw, consumed) VALUES ($1, $2, $3::text::jsonb, $4, $5)",
                    &[&run_id, &item.dedupe_key, &cell.text, &cell.raw, &item.consumed],
                )
                .await
                .map_err(fail)?;
            }
            if let Some(job) = job {
                let job = serde_json::to_value(job).map_err(|e| LogError::Unavailable(e.to_string()))?;
                tx.execute(INSERT_OUTBOX, &[&job]).await.map_err(fail)?;
            }
            tx.commit().await.map_err(fail)?;
            Ok(Imported::Created)
        })
        .await
    }
}
