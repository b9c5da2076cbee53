//! The single node's store: the three ports on one SQLite file.
//! [`SqliteLog`] (the event log), [`SqliteQueue`] (run jobs) and
//! [`SqliteLedger`] (cancellation flags, budget counters; live deltas stay in
//! process) share the file and its connections; open it with
//! [`SqliteLog::open`].
//!
//! ## Why these parts
//!
//! - `rusqlite` with the `bundled` feature: the maintained SQLite binding,
//!   with SQLite compiled in, so the single node needs nothing installed.
//! - **One writer connection**, on a thread of its own, with group commit:
//!   the writes queued while the last batch was syncing run in the next
//!   batch's one `BEGIN IMMEDIATE` transaction, each in a savepoint of its
//!   own (a write that fails is rolled back alone), then one `COMMIT` — one
//!   sync for the batch — and each caller gets its answer. So writes are
//!   serialised in process, never wait for a lock another connection holds,
//!   and commits of many runs share a sync.
//! - **Readers**: a pool (`deadpool`, which already pools Postgres
//!   connections here, with `deadpool-sync`) of `query_only` connections;
//!   every call runs on Tokio's blocking pool (`interact`), never on the
//!   async runtime's threads; in WAL mode they read the last committed state
//!   while the writer writes. The manager is the few lines of
//!   `SqliteManager` rather than `deadpool-sqlite`'s, whose recycle check
//!   runs a query (one more trip through the blocking pool) at every
//!   checkout; a connection to a local file does not go stale.
//! - `rusqlite_migration`: migrations (`backends/sqlite_migrations/*.sql`,
//!   compiled in) applied at open, tracked in `PRAGMA user_version`.
//!
//! ## Durability
//!
//! `journal_mode=WAL`, `synchronous=FULL`: in WAL mode, `FULL` syncs the
//! write-ahead log at every commit, so a transaction that returned has
//! survived power loss, not only a crash of the process. (`NORMAL` would sync
//! only at checkpoints of the WAL: a power cut could take back the last
//! committed steps, which then run again — a tool call twice.) Every write
//! is committed (with its batch) before it is answered; `busy_timeout` covers the moments
//! another connection (a reader checkpointing the WAL, `sqlite3` opened by
//! an operator) holds a lock.
//!
//! A batch made only of writes whose loss is harmless commits with
//! `synchronous=NORMAL` (it survives a crash of the process, not
//! necessarily a power cut): jobs and their acks (wake-ups; the reconciler
//! finds runs with work from the log), outbox marks (a job relayed twice is
//! dropped as stale) and leases.
//!
//! One process at a time: [`SqliteLog::open`] takes an exclusive advisory
//! lock on `FILE.lock` (released by the kernel when the process dies, also by
//! `kill -9`), and a second process opening the same file is refused with a
//! clear error. Holding it, open lets the previous process's leases lapse
//! (the next acquisition reports a takeover), makes every job not acked
//! ready again, deletes its unfinished batch uploads and releases its batch
//! admission claims (`sqlite/batches.rs`).

//! ## Tables and invariants
//!
//! The Postgres schema's (`runs`, append-only `events` enforced by triggers,
//! `checkpoints`, `approvals`, `inbox`, `outbox`, `batches`, `batch_items`,
//! `agents`) plus `jobs` (the queue), `cancels`,
//! `budgets`/`budget_requests` and `held_results` (the ledger). A
//! commit is fenced by the lease (token and expiry) and the head, like
//! Postgres'; checkpoints follow [`crate::postgres::next_checkpoint`] and are
//! where transitions are verified; only the latest is kept. Times are the
//! process's clock (one node, one clock), stored in nanoseconds.

mod batches;
// Issue 32, schedules: the schedule store on the single node's file.
mod evals;
mod schedules;
mod waits;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use deadpool::Runtime;
use deadpool::managed::{Metrics, PoolConfig, RecycleError, RecycleResult, Timeouts};
use deadpool_sync::SyncWrapper;
use futures::stream::BoxStream;
use glia_proto::{Event, EventKind, LiveEvent, Payload, Phase, RunState, erasure};
use rusqlite::{Connection, OptionalExtension, Row, Savepoint, params};
use rusqlite_migration::{M, Migrations};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::archive::{ApprovalRecord, Archive, Imported, InboxRecord, RunRecord};
use crate::memory::MemoryLedger;
use crate::postgres::next_checkpoint;
use crate::{
    Acker, AgentRegistry, AgentVersion, ApprovalFilter, ApprovalRow, ApprovalStatus, Approvals,
    CapKind, Delivery, ExpiredFilter, HELD_RESULT_TTL, HeldResult, Inbox, InboxItem, Job, JobQueue,
    Lease, Ledger, LedgerError, LogError, LogGauges, NewRun, Orphan, Outbox, QueueError,
    QueueStats, Reports, Reservation, RunFilter, RunGaugeKey, RunLog, RunStatus, RunSummary,
    Settlement, Signal, Spend, SpendCap, dedupe_key,
};

/// The event kinds that carry model spend, as an SQL list
/// (`('model.response', …)`), from the catalogue ([`EventKind::SPEND_NAMES`]).
pub(crate) static SPEND_KINDS: LazyLock<String> = LazyLock::new(|| {
    let names: Vec<String> = EventKind::SPEND_NAMES
        .iter()
        .map(|n| format!("'{n}'"))
        .collect();
    format!("({})", names.join(", "))
});

/// A tenant's spend events of a day: `?1` tenant, `[?2, ?3)` the day.
static TENANT_USAGE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT e.payload FROM runs r JOIN events e ON e.run_id = r.id \
         WHERE r.tenant = ?1 AND r.updated_at >= ?2 AND e.at >= ?2 AND e.at < ?3 \
         AND e.kind IN {}",
        *SPEND_KINDS
    )
});

/// The migrations, in order; never edit one that shipped, add the next.
const MIGRATIONS: &[&str] = &[
    include_str!("../sqlite_migrations/001_init.sql"),
    include_str!("../sqlite_migrations/002_agents.sql"),
    include_str!("../sqlite_migrations/003_batches.sql"),
    include_str!("../sqlite_migrations/004_resume_jobs.sql"),
    include_str!("../sqlite_migrations/005_held_results.sql"),
    include_str!("../sqlite_migrations/006_run_listing.sql"),
    include_str!("../sqlite_migrations/007_erasure.sql"),
    // issue 32: waits
    include_str!("../sqlite_migrations/008_waits.sql"),
    // Issue 32, child runs.
    include_str!("../sqlite_migrations/009_child_runs.sql"),
    // Issue 32, schedules.
    include_str!("../sqlite_migrations/010_schedules.sql"),
    // Issue 32, child runs: live children (`stranded_children`).
    include_str!("../sqlite_migrations/011_live_children.sql"),
    // Issue 31, evals.
    include_str!("../sqlite_migrations/012_evals.sql"),
    // Issue 31, replay evals: an item's recorded tools.
    include_str!("../sqlite_migrations/013_batch_item_recordings.sql"),
];

/// How a store is opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    /// Reader connections (default 4; at least 1).
    pub readers: usize,
    /// `PRAGMA busy_timeout` of every connection (default 5 s): how long a
    /// statement waits for a lock another connection holds before failing
    /// with [`LogError::Unavailable`].
    pub busy_timeout: Duration,
    /// Longest wait for a free pooled connection (default 30 s).
    pub wait_timeout: Duration,
    /// The first checkpoint is written at this many events, the next ones at
    /// least this many apart (default 64), as in Postgres.
    pub checkpoint_every: u64,
    /// A job delivered this many times without an ack is dead-lettered
    /// (default 20), like the quorum queue's delivery limit.
    pub delivery_limit: u32,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            readers: 4,
            busy_timeout: Duration::from_secs(5),
            wait_timeout: Duration::from_secs(30),
            checkpoint_every: 64,
            delivery_limit: 20,
        }
    }
}

/// What the three adapters share: the pools, the queue's wake-up, live
/// deltas, and the file lock (held while any adapter lives).
struct Store {
    path: PathBuf,
    writer: std::sync::mpsc::Sender<WriteJob>,
    readers: Pool,
    /// Ready jobs, resumes and starts, with the deliveries each had in this
    /// process.
    ready: std::sync::Mutex<Lines>,
    /// A resume became ready.
    resumes_ready: Notify,
    /// A start became ready.
    starts_ready: Notify,
    /// Recent runs' states, each the log's own (rebuilt from it, then kept
    /// up to date by applying every committed event), by run.
    states: std::sync::Mutex<std::collections::HashMap<Uuid, RunState>>,
    live: MemoryLedger,
    checkpoint_every: u64,
    delivery_limit: u32,
    _lock: File,
}

/// A ready job of the queue.
#[derive(Debug, Clone, Copy)]
struct Ready {
    id: i64,
    job: Job,
    enqueued_at: i64,
    deliveries: u32,
}

/// The queue's ready jobs in two lines, each oldest first.
#[derive(Debug, Default)]
struct Lines {
    resumes: std::collections::VecDeque<Ready>,
    starts: std::collections::VecDeque<Ready>,
}

impl Lines {
    fn line(&mut self, job: &Job) -> &mut std::collections::VecDeque<Ready> {
        if job.resume {
            &mut self.resumes
        } else {
            &mut self.starts
        }
    }

    /// The oldest resume, else (when `starts`) the oldest start.
    fn pop(&mut self, starts: bool) -> Option<Ready> {
        self.resumes.pop_front().or_else(|| {
            if starts {
                self.starts.pop_front()
            } else {
                None
            }
        })
    }

    fn len(&self) -> usize {
        self.resumes.len() + self.starts.len()
    }
}

/// The event log on a SQLite file. Cheap to clone. [`SqliteLog::queue`] and
/// [`SqliteLog::ledger`] give the other two ports on the same file.
#[derive(Clone)]
pub struct SqliteLog {
    store: Arc<Store>,
}

impl std::fmt::Debug for SqliteLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteLog")
            .field("path", &self.store.path)
            .finish_non_exhaustive()
    }
}

/// The job queue in the same file as its [`SqliteLog`].
#[derive(Clone)]
pub struct SqliteQueue {
    store: Arc<Store>,
}

/// The ledger in the same file as its [`SqliteLog`]: cancellation flags and
/// budget counters are rows (they survive restarts); live deltas are pushed
/// to subscribers in this process only (they are never persisted anywhere).
#[derive(Clone)]
pub struct SqliteLedger {
    store: Arc<Store>,
}

// ---------------------------------------------------------------------------
// Opening

/// `PATH.lock` beside the database.
fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// Opens connections to the file with the given pragmas; a connection is
/// reused as long as its mutex is not poisoned (a call panicked in it).
struct SqliteManager {
    path: PathBuf,
    pragmas: String,
}

impl deadpool::managed::Manager for SqliteManager {
    type Type = SyncWrapper<Connection>;
    type Error = rusqlite::Error;

    async fn create(&self) -> Result<Self::Type, Self::Error> {
        let (path, pragmas) = (self.path.clone(), self.pragmas.clone());
        SyncWrapper::new(Runtime::Tokio1, move || {
            let conn = Connection::open(path)?;
            conn.execute_batch(&pragmas)?;
            register_functions(&conn)?;
            Ok(conn)
        })
        .await
    }

    async fn recycle(&self, conn: &mut Self::Type, _: &Metrics) -> RecycleResult<Self::Error> {
        if conn.is_mutex_poisoned() {
            Err(RecycleError::message(
                "a call panicked holding the connection",
            ))
        } else {
            Ok(())
        }
    }
}

type Pool = deadpool::managed::Pool<SqliteManager>;

/// `glia_lower(text)`: the text in Unicode lower case, as Rust's
/// `str::to_lowercase` (SQLite's own `lower()` folds ASCII only), for the
/// case-insensitive error search of [`RunLog::list_runs`]; NULL stays NULL.
fn register_functions(conn: &Connection) -> rusqlite::Result<()> {
    use rusqlite::functions::FunctionFlags;
    conn.create_scalar_function(
        "glia_lower",
        1,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        |ctx| Ok(ctx.get::<Option<String>>(0)?.map(|s| s.to_lowercase())),
    )
}

fn pool(
    path: &Path,
    size: usize,
    options: &SqliteOptions,
    pragmas: String,
) -> Result<Pool, LogError> {
    let mut config = PoolConfig::new(size.max(1));
    config.timeouts = Timeouts {
        wait: Some(options.wait_timeout),
        create: Some(Duration::from_secs(10)),
        recycle: Some(Duration::from_secs(10)),
    };
    Pool::builder(SqliteManager {
        path: path.to_owned(),
        pragmas,
    })
    .config(config)
    .runtime(Runtime::Tokio1)
    .build()
    .map_err(|e| LogError::Unavailable(format!("sqlite pool: {e}")))
}

impl SqliteLog {
    /// Open (creating if needed) the store at `path`: take the file lock,
    /// set WAL mode, apply pending migrations, let the leases of the previous
    /// process lapse, make its jobs ready again, build the pools.
    ///
    /// Errors: [`LogError::Unavailable`] naming the cause — the directory
    /// does not exist or is not writable, another process has the file open
    /// (its lock), the file is not a SQLite database, a migration failed, or
    /// the file was written by a newer glia (a schema version this build
    /// does not know).
    pub async fn open(
        path: impl AsRef<Path>,
        options: SqliteOptions,
    ) -> Result<SqliteLog, LogError> {
        let path = path.as_ref().to_owned();
        let setup_path = path.clone();
        let (lock, ready) = tokio::task::spawn_blocking(move || prepare(&setup_path))
            .await
            .map_err(|e| LogError::Unavailable(format!("opening {}: {e}", path.display())))??;
        let busy = options.busy_timeout.as_millis().max(1);
        let common = format!(
            "PRAGMA busy_timeout = {busy}; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;"
        );
        let writer = spawn_writer(&path, &common)?;
        let readers = pool(
            &path,
            options.readers,
            &options,
            format!("{common} PRAGMA query_only = ON;"),
        )?;
        let store = Store {
            path,
            writer,
            readers,
            ready: std::sync::Mutex::new(ready),
            resumes_ready: Notify::new(),
            starts_ready: Notify::new(),
            states: Default::default(),
            live: MemoryLedger::default(),
            checkpoint_every: options.checkpoint_every.max(1),
            delivery_limit: options.delivery_limit.max(1),
            _lock: lock,
        };
        Ok(SqliteLog {
            store: Arc::new(store),
        })
    }

    /// The job queue on the same file.
    pub fn queue(&self) -> SqliteQueue {
        SqliteQueue {
            store: self.store.clone(),
        }
    }

    /// The ledger on the same file.
    pub fn ledger(&self) -> SqliteLedger {
        SqliteLedger {
            store: self.store.clone(),
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.store.path
    }
}

/// What a queued write does on the writer's connection: its work, whether
/// it succeeded, and how to answer once the batch's outcome is known.
/// Given no connection, it does nothing and answers with the batch's error.
type RunJob = Box<dyn FnOnce(Option<&mut Connection>) -> (bool, Finish) + Send>;
type Finish = Box<dyn FnOnce(Result<(), LogError>) + Send>;

/// A write queued for the writer thread.
struct WriteJob {
    relaxed: bool,
    run: RunJob,
}

/// Most writes committed together.
const WRITE_BATCH: usize = 128;

/// The writer: one connection on a thread of its own. It takes every write
/// queued (up to [`WRITE_BATCH`]), runs them in one `BEGIN IMMEDIATE`
/// transaction, each in a savepoint (a write that fails is rolled back
/// alone), commits once — one sync for the batch: group commit — and then
/// answers each. It stops when the store is dropped.
fn spawn_writer(path: &Path, pragmas: &str) -> Result<std::sync::mpsc::Sender<WriteJob>, LogError> {
    let conn = Connection::open(path).map_err(|e| {
        LogError::Unavailable(format!("{}: opening the writer: {e}", path.display()))
    })?;
    conn.execute_batch(pragmas)
        .map_err(|e| LogError::Unavailable(format!("{}: writer pragmas: {e}", path.display())))?;
    let (tx, rx) = std::sync::mpsc::channel::<WriteJob>();
    std::thread::Builder::new()
        .name("glia-sqlite-writer".into())
        .spawn(move || writer_loop(conn, rx))
        .map_err(|e| LogError::Unavailable(format!("starting the sqlite writer: {e}")))?;
    Ok(tx)
}

fn writer_loop(mut conn: Connection, jobs: std::sync::mpsc::Receiver<WriteJob>) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < WRITE_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let sync = if batch.iter().all(|j| j.relaxed) {
            "PRAGMA synchronous = NORMAL"
        } else {
            "PRAGMA synchronous = FULL"
        };
        let begun = conn
            .execute_batch(sync)
            .and_then(|()| conn.execute_batch("BEGIN IMMEDIATE"))
            .map_err(db("begin"));
        if let Err(e) = begun {
            let _ = conn.execute_batch("ROLLBACK");
            for job in batch {
                let (_, finish) = (job.run)(None);
                finish(Err(e.clone()));
            }
            continue;
        }
        let mut finishes = Vec::with_capacity(batch.len());
        for job in batch {
            if conn.execute_batch("SAVEPOINT job").is_err() {
                finishes.push((job.run)(None).1);
                continue;
            }
            let (ok, finish) = (job.run)(Some(&mut conn));
            let end = if ok {
                "RELEASE job"
            } else {
                "ROLLBACK TO job; RELEASE job"
            };
            let _ = conn.execute_batch(end);
            finishes.push(finish);
        }
        let committed = conn.execute_batch("COMMIT").map_err(db("commit"));
        if committed.is_err() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        for finish in finishes {
            finish(committed.clone());
        }
    }
}

/// At open, holding the file lock, every upload and admission claim in the
/// file is a dead process's: its uploads are deleted, and its claims are
/// released at once (not after the claim lease), since the run a dead pass
/// may have created is found again by the item's idempotency key
/// (`glia-batch:{batch}:{custom_id}`) when the item is admitted again.
fn recover_batches(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "DELETE FROM batch_items WHERE batch_id IN (SELECT id FROM batches WHERE state = 'uploading'); \
         DELETE FROM batches WHERE state = 'uploading'; \
         UPDATE batch_items SET state = 'queued', claimed_at = NULL WHERE state = 'admitting';",
    )
}

/// Lock, WAL, migrations; the leases of the previous process lapse; the
/// jobs not dead-lettered, ready (blocking).
fn prepare(path: &Path) -> Result<(File, Lines), LogError> {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        LogError::Unavailable(format!("{}: {what}: {e}", path.display()))
    };
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(lock_path(path))
        .map_err(|e| fail("creating its lock file", &e))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(LogError::Unavailable(format!(
                "{} is in use by another glia process (it holds {})",
                path.display(),
                lock_path(path).display()
            )));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(fail("locking", &e)),
    }
    let mut conn = Connection::open(path).map_err(|e| fail("opening", &e))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(|e| fail("setting WAL mode", &e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(LogError::Unavailable(format!(
            "{}: the file system refused WAL mode (journal mode is {mode})",
            path.display()
        )));
    }
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")
        .map_err(|e| fail("pragmas", &e))?;
    let migrations = Migrations::new(MIGRATIONS.iter().map(|sql| M::up(sql)).collect());
    migrations
        .to_latest(&mut conn)
        .map_err(|e| fail("migrations", &e))?;
    recover_batches(&conn).map_err(|e| fail("recovering batch uploads and claims", &e))?;
    // We hold the file lock: every lease in the file is a dead process's.
    // They lapse now (an acquisition reports the takeover).
    let now = nanos(Utc::now());
    conn.execute(
        "UPDATE runs SET lease_expires_at = ?1 WHERE lease_expires_at > ?1",
        [now],
    )
    .map_err(|e| fail("lapsing old leases", &e))?;
    let mut st = conn
        .prepare(
            "SELECT id, run_id, head_seq, enqueued_at, resume FROM jobs WHERE dead = 0 ORDER BY id",
        )
        .map_err(|e| fail("reading jobs", &e))?;
    let rows = st
        .query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, bool>(4)?,
            ))
        })
        .map_err(|e| fail("reading jobs", &e))?;
    let mut ready = Lines::default();
    for row in rows {
        let (id, run, head, enqueued_at, resume) = row.map_err(|e| fail("reading jobs", &e))?;
        let job = Job {
            run_id: uuid_of(&run, "job run id")?,
            head_seq: u64_of(head, "head_seq")?,
            resume,
        };
        ready.line(&job).push_back(Ready {
            id,
            job,
            enqueued_at,
            deliveries: 0,
        });
    }
    Ok((lock, ready))
}

// ---------------------------------------------------------------------------
// Calls, errors, values

/// Most run states kept in memory; past it the cache starts over.
const STATE_CACHE: usize = 4096;

impl Store {
    /// Wake one consumer that may take `job` (made ready).
    fn notify_ready(&self, job: &Job) {
        if job.resume {
            self.resumes_ready.notify_one()
        } else {
            self.starts_ready.notify_one()
        }
    }

    /// The cached state of `run_id` if it is at `head`.
    fn cached(&self, run_id: Uuid, head: u64) -> Option<RunState> {
        self.states
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&run_id)
            .filter(|s| s.head_seq == head)
            .cloned()
    }

    /// Keep `state` (the log's), unless the run is done.
    fn remember(&self, state: RunState) {
        let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        if state.phase == Phase::Done {
            states.remove(&state.run_id);
            return;
        }
        if states.len() >= STATE_CACHE && !states.contains_key(&state.run_id) {
            states.clear();
        }
        states.insert(state.run_id, state);
    }

    /// Drop the cached state of `run_id` (its log was rewritten).
    fn forget(&self, run_id: Uuid) {
        self.states
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&run_id);
    }

    /// Bring a cached state past committed `events` (dropping it if they do
    /// not follow it or do not apply, or the run is done).
    fn advance(&self, run_id: Uuid, events: &[Event]) {
        let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        let Some(state) = states.get_mut(&run_id) else {
            return;
        };
        let follows = events.first().is_some_and(|e| e.seq == state.head_seq + 1);
        if !follows || events.iter().any(|e| state.apply(e).is_err()) || state.phase == Phase::Done
        {
            states.remove(&run_id);
        }
    }

    /// Run `f` on the writer thread, inside the batch transaction of the
    /// writes queued with it, its own savepoint around it; answered once
    /// that transaction committed (`synchronous = FULL`: on disk).
    async fn write<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(&mut Connection) -> Result<T, LogError> + Send + 'static,
    ) -> Result<T, LogError> {
        self.write_with(what, false, f).await
    }

    /// [`Store::write`] for writes whose loss is harmless: a batch made only
    /// of these commits with `synchronous = NORMAL` (it survives a crash of
    /// the process, the WAL is written, but a power cut may take it back).
    /// Jobs and their acks (wake-ups: the reconciler finds runs with work
    /// from the log), outbox marks (a job relayed twice is dropped as
    /// stale), leases (the leases of a process that died lapse at the next
    /// open).
    async fn write_relaxed<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(&mut Connection) -> Result<T, LogError> + Send + 'static,
    ) -> Result<T, LogError> {
        self.write_with(what, true, f).await
    }

    async fn write_with<T: Send + 'static>(
        &self,
        what: &'static str,
        relaxed: bool,
        f: impl FnOnce(&mut Connection) -> Result<T, LogError> + Send + 'static,
    ) -> Result<T, LogError> {
        let (answer, answered) = tokio::sync::oneshot::channel::<Result<T, LogError>>();
        let run: RunJob = Box::new(move |conn: Option<&mut Connection>| {
            let result = match conn {
                None => Err(LogError::Unavailable(format!("{what}: not run"))),
                Some(conn) => {
                    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(conn))) {
                        Ok(result) => result,
                        Err(_) => Err(LogError::Unavailable(format!("{what}: the write panicked"))),
                    }
                }
            };
            let ok = result.is_ok();
            let finish: Finish = Box::new(move |committed: Result<(), LogError>| {
                let _ = answer.send(committed.and(result));
            });
            (ok, finish)
        });
        self.writer
            .send(WriteJob { relaxed, run })
            .map_err(|_| LogError::Unavailable(format!("{what}: the sqlite writer stopped")))?;
        answered
            .await
            .map_err(|_| LogError::Unavailable(format!("{what}: the sqlite writer stopped")))?
    }

    /// Run `f` on a reader connection, on the blocking pool.
    async fn read<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(&mut Connection) -> Result<T, LogError> + Send + 'static,
    ) -> Result<T, LogError> {
        let conn = self
            .readers
            .get()
            .await
            .map_err(|e| LogError::Unavailable(format!("{what}: sqlite reader: {e}")))?;
        conn.interact(f)
            .await
            .map_err(|e| LogError::Unavailable(format!("{what}: {e}")))?
    }
}

/// A SQLite failure: the store's (busy, I/O…), reported as
/// unavailable with what was being done.
fn db(what: &'static str) -> impl Fn(rusqlite::Error) -> LogError {
    move |e| LogError::Unavailable(format!("{what}: {e}"))
}

fn corrupt(what: String) -> LogError {
    LogError::Corrupt(what)
}

/// One write's own atomic unit inside the writer's batch transaction: a
/// savepoint, rolled back when dropped uncommitted.
fn immediate(conn: &mut Connection) -> Result<Savepoint<'_>, LogError> {
    conn.savepoint().map_err(db("savepoint"))
}

/// Nanoseconds since the epoch (saturating outside 1677–2262).
fn nanos(t: DateTime<Utc>) -> i64 {
    t.timestamp_nanos_opt().unwrap_or(if t.timestamp() < 0 {
        i64::MIN
    } else {
        i64::MAX
    })
}

fn time(n: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_nanos(n)
}

fn ttl_nanos(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_nanos()).unwrap_or(i64::MAX)
}

fn i64_of(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn u64_of(n: i64, what: &str) -> Result<u64, LogError> {
    u64::try_from(n).map_err(|_| corrupt(format!("{what} is negative ({n})")))
}

fn uuid_of(text: &str, what: &str) -> Result<Uuid, LogError> {
    Uuid::parse_str(text).map_err(|e| corrupt(format!("{what} {text:?}: {e}")))
}

fn json<T: serde::Serialize>(run_id: Uuid, value: &T, what: &str) -> Result<String, LogError> {
    serde_json::to_string(value).map_err(|e| LogError::Invalid {
        run_id,
        reason: format!("{what} does not serialise: {e}"),
    })
}

fn parse<T: DeserializeOwned>(text: &str, what: &str) -> Result<T, LogError> {
    serde_json::from_str(text).map_err(|e| corrupt(format!("{what}: {e}")))
}

fn get<T: rusqlite::types::FromSql>(row: &Row<'_>, name: &str) -> Result<T, LogError> {
    row.get(name)
        .map_err(|e| corrupt(format!("column {name}: {e}")))
}

const SUMMARY_COLUMNS: &str = "id, tenant, batch_id, goal, status, phase, pull_point, outcome, head_seq, created_at, updated_at, \
     agent, agent_version, tags, metadata, custom_id, turns, tool_calls, active_ms, input_tokens, output_tokens, cache_write_tokens, cache_read_tokens, \
     tokens_estimated, cost_usd_micros, steps, error, ended_at, erased_at, erased_by, parent_run_id, parent_call_id, depth";

/// A non-negative integer column.
fn count<T: TryFrom<i64>>(row: &Row<'_>, name: &str) -> Result<T, LogError> {
    let n: i64 = get(row, name)?;
    T::try_from(n).map_err(|_| corrupt(format!("column {name} is out of range ({n})")))
}

fn summary(row: &Row<'_>) -> Result<RunSummary, LogError> {
    let phase: String = get(row, "phase")?;
    let run_id = uuid_of(&get::<String>(row, "id")?, "run id")?;
    Ok(RunSummary {
        run_id,
        tenant: get(row, "tenant")?,
        batch_id: get::<Option<String>>(row, "batch_id")?
            .map(|b| uuid_of(&b, "batch id"))
            .transpose()?,
        goal: get(row, "goal")?,
        status: crate::postgres::parse_status(&get::<String>(row, "status")?)?,
        phase: serde_json::from_value(serde_json::Value::String(phase))
            .map_err(|e| corrupt(format!("column phase: {e}")))?,
        pull_point: get::<Option<String>>(row, "pull_point")?
            .map(|t| parse(&t, "column pull_point"))
            .transpose()?,
        outcome: get::<Option<String>>(row, "outcome")?
            .map(|t| parse(&t, "column outcome"))
            .transpose()?,
        head_seq: u64_of(get(row, "head_seq")?, "head_seq")?,
        created_at: time(get(row, "created_at")?),
        updated_at: time(get(row, "updated_at")?),
        agent: get(row, "agent")?,
        agent_version: get::<Option<i64>>(row, "agent_version")?
            .map(|v| u32::try_from(v).map_err(|_| corrupt(format!("column agent_version is {v}"))))
            .transpose()?,
        tags: parse(&get::<String>(row, "tags")?, "column tags")?,
        metadata: parse(&get::<String>(row, "metadata")?, "column metadata")?,
        custom_id: get(row, "custom_id")?,
        usage: crate::postgres::usage_of(
            |name| count(row, name),
            get::<i64>(row, "tokens_estimated")? != 0,
        )?,
        steps: count(row, "steps")?,
        error: get(row, "error")?,
        ended_at: get::<Option<i64>>(row, "ended_at")?.map(time),
        trace_id: crate::trace_id(run_id),
        erased_at: get::<Option<i64>>(row, "erased_at")?.map(time),
        erased_by: get(row, "erased_by")?,
        parent_run_id: get::<Option<String>>(row, "parent_run_id")?
            .map(|p| uuid_of(&p, "parent run id"))
            .transpose()?,
        parent_call_id: get(row, "parent_call_id")?,
        depth: count(row, "depth")?,
    })
}

/// [`RunLog::erase_run`] inside the writer's transaction `tx`; a run
/// already erased is left as it is.
fn erase_in(tx: &Connection, run_id: Uuid, by: &str, at: DateTime<Utc>) -> Result<(), LogError> {
    let id = run_id.to_string();
    /// Status, erased at, lease owner and expiry, goal, outcome, pull point.
    type Locked = (
        String,
        Option<i64>,
        Option<String>,
        Option<i64>,
        String,
        Option<String>,
        Option<String>,
    );
    let row: Option<Locked> = tx
        .query_row(
            "SELECT status, erased_at, lease_owner, lease_expires_at, goal, outcome, pull_point FROM runs WHERE id = ?1",
            [&id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?)),
        )
        .optional()
        .map_err(db("erase_run"))?;
    let Some((status, erased_at, owner, until, goal, outcome, pull_point)) = row else {
        return Err(LogError::NotFound(run_id));
    };
    if erased_at.is_some() {
        return Ok(());
    }
    if status != RunStatus::Done.as_str() {
        return Err(LogError::NotFinished(run_id));
    }
    if let (Some(owner), Some(until)) = (owner, until)
        && until > nanos(Utc::now())
    {
        return Err(LogError::LeaseHeld {
            run_id,
            owner,
            until: time(until),
        });
    }
    let outcome = outcome
        .map(|t| {
            parse::<glia_proto::Outcome>(&t, "column outcome")
                .and_then(|o| json(run_id, &o.erased(), "outcome"))
        })
        .transpose()?;
    let pull_point = pull_point
        .map(|t| {
            parse::<glia_proto::PullPoint>(&t, "column pull_point")
                .and_then(|p| json(run_id, &p.erased(), "pull point"))
        })
        .transpose()?;
    // The run is marked first: the events' trigger lets only an erased
    // run's payloads be rewritten.
    tx.execute(
        "UPDATE runs SET goal = ?2, outcome = ?3, pull_point = ?4, erased_at = ?5, erased_by = ?6, \
         error = CASE WHEN error IS NULL THEN NULL ELSE ?7 END WHERE id = ?1",
        params![
            id,
            erasure::erased_text(&goal),
            outcome,
            pull_point,
            nanos(at),
            by,
            glia_proto::TOMBSTONE
        ],
    )
    .map_err(db("erase_run"))?;
    let events = read_events(tx, run_id, 0, usize::MAX)?;
    // Listed in `erasing` while its events are rewritten (007's trigger).
    tx.execute("INSERT INTO erasing (run_id) VALUES (?1)", [&id])
        .map_err(db("erase_run"))?;
    let mut update = tx
        .prepare_cached("UPDATE events SET payload = ?3 WHERE run_id = ?1 AND seq = ?2")
        .map_err(db("erase_run"))?;
    for e in &events {
        let erased = e.kind.erased();
        if erased != e.kind {
            let payload = json(run_id, &erased, &format!("event {}", e.seq))?;
            update
                .execute(params![id, i64_of(e.seq), payload])
                .map_err(db("erase_run"))?;
        }
    }
    tx.execute("DELETE FROM erasing WHERE run_id = ?1", [&id])
        .map_err(db("erase_run"))?;
    tx.execute("DELETE FROM checkpoints WHERE run_id = ?1", [&id])
        .map_err(db("erase_run"))?;
    tx.execute(
        "UPDATE approvals SET input = ?2, args_hash = ?3 WHERE run_id = ?1",
        params![
            id,
            json(run_id, &erasure::erased_value(), "input")?,
            erasure::erased_args_hash()
        ],
    )
    .map_err(db("erase_run"))?;
    let items: Vec<(i64, String)> = tx
        .prepare("SELECT id, payload FROM inbox WHERE run_id = ?1")
        .and_then(|mut st| {
            st.query_map([&id], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        })
        .map_err(db("erase_run"))?;
    for (item, text) in items {
        let payload: Payload = parse(&text, &format!("inbox item {item}"))?;
        tx.execute(
            "UPDATE inbox SET payload = ?2 WHERE id = ?1",
            params![item, json(run_id, &payload.erased(), "inbox payload")?],
        )
        .map_err(db("erase_run"))?;
    }
    tx.execute(
        "UPDATE batch_items SET goal = ?2, recorded_tools = NULL WHERE run_id = ?1",
        params![id, glia_proto::TOMBSTONE],
    )
    .map_err(db("erase_run"))?;
    // The ledger's held results share the file: `{run_id}:{turn}:{call_id}`.
    tx.execute(
        "DELETE FROM held_results WHERE substr(key, 1, 37) = ?1",
        [format!("{id}:")],
    )
    .map_err(db("erase_run"))?;
    Ok(())
}

/// The summary columns a commit writes from a state (see [`SUMMARY_SET`]).
struct SummaryColumns {
    status: &'static str,
    phase: String,
    pull_point: Option<String>,
    outcome: Option<String>,
    head_seq: i64,
    usage: [i64; 10],
    error: Option<String>,
}

fn summary_columns(state: &RunState) -> Result<SummaryColumns, LogError> {
    let run_id = state.run_id;
    Ok(SummaryColumns {
        status: RunStatus::of(state).as_str(),
        phase: crate::postgres::phase_name(state.phase)?,
        pull_point: state
            .parked
            .as_ref()
            .map(|p| json(run_id, p, "pull point"))
            .transpose()?,
        outcome: state
            .outcome
            .as_ref()
            .map(|o| json(run_id, o, "outcome"))
            .transpose()?,
        head_seq: i64_of(state.head_seq),
        usage: crate::postgres::usage_cells(state),
        error: state
            .outcome
            .as_ref()
            .and_then(crate::error_of)
            .map(str::to_owned),
    })
}

/// The update of run `?1`'s row to [`SummaryColumns`] (`?2`–`?6` status,
/// phase, pull point, outcome, head; `?7` the time; `?8`–`?17` the usage
/// columns; `?18` the error). `ended_at` is set to the time by the update
/// that makes the run done, and kept after.
static UPDATE_SUMMARY: LazyLock<String> = LazyLock::new(|| {
    let usage: Vec<String> = crate::postgres::USAGE_COLUMNS
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{c} = ?{}", i + 8))
        .collect();
    format!(
        "UPDATE runs SET status = ?2, phase = ?3, pull_point = ?4, outcome = ?5, head_seq = ?6, updated_at = ?7, {}, \
         error = ?18, ended_at = CASE WHEN ?2 = 'done' THEN coalesce(ended_at, ?7) END WHERE id = ?1",
        usage.join(", ")
    )
});

/// Writes `columns` to run `run_id`'s row, dated `at`.
fn update_summary(
    tx: &Connection,
    run_id: Uuid,
    columns: &SummaryColumns,
    at: i64,
) -> Result<(), LogError> {
    let mut values: Vec<rusqlite::types::Value> = vec![
        run_id.to_string().into(),
        columns.status.to_owned().into(),
        columns.phase.clone().into(),
        columns.pull_point.clone().into(),
        columns.outcome.clone().into(),
        columns.head_seq.into(),
        at.into(),
    ];
    values.extend(
        columns
            .usage
            .iter()
            .map(|&n| rusqlite::types::Value::from(n)),
    );
    values.push(columns.error.clone().into());
    tx.prepare_cached(&UPDATE_SUMMARY)
        .and_then(|mut st| st.execute(rusqlite::params_from_iter(values)))
        .map_err(db("writing the run's summary"))?;
    Ok(())
}

fn read_events(
    conn: &Connection,
    run_id: Uuid,
    after: u64,
    limit: usize,
) -> Result<Vec<Event>, LogError> {
    let mut st = conn.prepare_cached("SELECT seq, kind, at, payload FROM events WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3").map_err(db("reading events"))?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut rows = st
        .query(params![run_id.to_string(), i64_of(after), limit])
        .map_err(db("reading events"))?;
    let mut events = Vec::new();
    while let Some(row) = rows.next().map_err(db("reading events"))? {
        let seq = u64_of(get(row, "seq")?, "seq")?;
        let kind: EventKind = parse(
            &get::<String>(row, "payload")?,
            &format!("event {run_id}/{seq}"),
        )?;
        let name: String = get(row, "kind")?;
        if name != kind.name() {
            return Err(corrupt(format!(
                "event {run_id}/{seq}: kind {name} but payload {}",
                kind.name()
            )));
        }
        events.push(Event {
            run_id,
            seq,
            at: time(get(row, "at")?),
            kind,
        });
    }
    Ok(events)
}

fn run_exists(conn: &Connection, run_id: Uuid) -> Result<bool, LogError> {
    let mut st = conn
        .prepare_cached("SELECT 1 FROM runs WHERE id = ?1")
        .map_err(db("reading runs"))?;
    st.exists([run_id.to_string()]).map_err(db("reading runs"))
}

/// The run's state from the log: the latest usable checkpoint plus the
/// events after it; `None` for a run without events.
fn rebuild(conn: &Connection, run_id: Uuid) -> Result<Option<RunState>, LogError> {
    let checkpoint: Option<(i64, String)> = conn
        .prepare_cached(
            "SELECT seq, state FROM checkpoints WHERE run_id = ?1 ORDER BY seq DESC LIMIT 1",
        )
        .and_then(|mut st| {
            st.query_row([run_id.to_string()], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(db("reading the checkpoint"))?;
    let checkpoint =
        checkpoint.and_then(
            |(seq, text)| match serde_json::from_str::<RunState>(&text) {
                Ok(state) if state.run_id == run_id && i64_of(state.head_seq) == seq => Some(state),
                Ok(_) | Err(_) => {
                    tracing::warn!(%run_id, seq, "unusable checkpoint; replaying the whole log");
                    None
                }
            },
        );
    let after = checkpoint.as_ref().map_or(0, |s| s.head_seq);
    let events = read_events(conn, run_id, after, usize::MAX)?;
    if checkpoint.is_none() && events.is_empty() {
        return Ok(None);
    }
    let mut state = checkpoint.unwrap_or_else(|| RunState::new(run_id));
    for e in &events {
        state
            .apply(e)
            .map_err(|err| corrupt(format!("event {run_id}/{} does not apply: {err}", e.seq)))?;
    }
    Ok(Some(state))
}

/// Insert events (already checked consecutive) in `tx`.
fn insert_events(
    tx: &Connection,
    run_id: Uuid,
    events: &[(u64, &'static str, i64, String)],
) -> Result<(), LogError> {
    let mut st = tx
        .prepare_cached(
            "INSERT INTO events (run_id, seq, kind, at, payload) VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .map_err(db("writing events"))?;
    let id = run_id.to_string();
    for (seq, kind, at, payload) in events {
        st.execute(params![id, i64_of(*seq), kind, at, payload])
            .map_err(db("writing events"))?;
    }
    Ok(())
}

fn encode_events(
    run_id: Uuid,
    events: &[Event],
) -> Result<Vec<(u64, &'static str, i64, String)>, LogError> {
    events
        .iter()
        .map(|e| {
            Ok((
                e.seq,
                e.kind.name(),
                nanos(e.at),
                json(run_id, &e.kind, &format!("event {}", e.seq))?,
            ))
        })
        .collect()
}

/// What a run's row is written with once, at admission or import.
struct RunRow<'a> {
    run_id: Uuid,
    tenant: &'a str,
    idempotency_key: Option<&'a str>,
    batch_id: Option<Uuid>,
    tags: &'a [String],
    metadata: &'a std::collections::BTreeMap<String, String>,
    custom_id: Option<&'a str>,
    created_at: i64,
    // Issue 32, child runs.
    parent_run_id: Option<Uuid>,
    parent_call_id: Option<&'a str>,
    depth: u32,
}

/// The run's row, no lease: `row`, and the summary `columns` of `state`
/// dated `updated_at`.
fn insert_run(
    tx: &Connection,
    row: &RunRow<'_>,
    state: &RunState,
    columns: &SummaryColumns,
    updated_at: i64,
) -> Result<(), LogError> {
    let run_id = row.run_id;
    let (agent, agent_version) = crate::agent_of(state);
    let tags = json(run_id, &row.tags, "tags")?;
    let metadata = json(run_id, &row.metadata, "metadata")?;
    tx.prepare_cached(
        "INSERT INTO runs (id, tenant, idempotency_key, batch_id, goal, status, phase, head_seq, created_at, updated_at, \
           agent, agent_version, tags, metadata, custom_id, parent_run_id, parent_call_id, depth) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
    )
    .and_then(|mut st| {
        st.execute(params![
            run_id.to_string(),
            row.tenant,
            row.idempotency_key,
            row.batch_id.map(|b| b.to_string()),
            state.goal,
            columns.status,
            columns.phase,
            columns.head_seq,
            row.created_at,
            agent,
            agent_version,
            tags,
            metadata,
            row.custom_id,
            row.parent_run_id.map(|p| p.to_string()),
            row.parent_call_id,
            i64::from(row.depth),
        ])
    })
    .map_err(db("writing the run"))?;
    update_summary(tx, run_id, columns, updated_at)
}

fn insert_outbox(tx: &Connection, job: Job, now: i64) -> Result<(), LogError> {
    tx.prepare_cached(
        "INSERT INTO outbox (run_id, head_seq, created_at, resume) VALUES (?1, ?2, ?3, ?4)",
    )
    .and_then(|mut st| {
        st.execute(params![
            job.run_id.to_string(),
            i64_of(job.head_seq),
            now,
            job.resume
        ])
    })
    .map_err(db("writing the outbox"))?;
    Ok(())
}

/// Create the batch on first use; a batch of another tenant is refused.
fn claim_batch(
    tx: &Connection,
    run_id: Uuid,
    batch: Uuid,
    tenant: &str,
    now: i64,
) -> Result<(), LogError> {
    tx.execute("INSERT INTO batches (id, tenant, created_at) VALUES (?1, ?2, ?3) ON CONFLICT (id) DO NOTHING", params![batch.to_string(), tenant, now])
        .map_err(db("writing the batch"))?;
    let owner: String = tx
        .query_row(
            "SELECT tenant FROM batches WHERE id = ?1",
            [batch.to_string()],
            |r| r.get(0),
        )
        .map_err(db("reading the batch"))?;
    if owner != tenant {
        return Err(LogError::Invalid {
            run_id,
            reason: format!("batch {batch} belongs to another tenant"),
        });
    }
    Ok(())
}

fn insert_approval(
    tx: &Connection,
    run_id: Uuid,
    tenant: &str,
    a: &ApprovalRecord,
) -> Result<(), LogError> {
    tx.prepare_cached(
        "INSERT INTO approvals (run_id, tenant, call_id, tool, input, args_hash, status, requested_at, expires_at, escalated, interrupted) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )
    .and_then(|mut st| {
        st.execute(params![
            run_id.to_string(),
            tenant,
            a.call_id,
            a.tool,
            a.input.to_string(),
            a.args_hash,
            if a.status == ApprovalStatus::Pending { "pending" } else { "decided" },
            nanos(a.requested_at),
            a.expires_at.map(nanos),
            a.escalated,
            a.interrupted
        ])
    })
    .map_err(db("writing approvals"))?;
    Ok(())
}

/// One version of an agent (`None`: the latest).
fn agent_row(
    conn: &Connection,
    tenant: &str,
    name: &str,
    version: Option<u32>,
) -> Result<Option<AgentVersion>, LogError> {
    let mut st = conn
        .prepare_cached(
            "SELECT tenant, name, version, content_hash, definition, created_at FROM agents \
             WHERE tenant = ?1 AND name = ?2 AND (?3 IS NULL OR version = ?3) ORDER BY version DESC LIMIT 1",
        )
        .map_err(db("get_agent"))?;
    let mut rows = st
        .query(params![tenant, name, version])
        .map_err(db("get_agent"))?;
    rows.next()
        .map_err(db("get_agent"))?
        .map(agent_of)
        .transpose()
}

fn agent_of(row: &Row<'_>) -> Result<AgentVersion, LogError> {
    let version: i64 = get(row, "version")?;
    Ok(AgentVersion {
        tenant: get(row, "tenant")?,
        name: get(row, "name")?,
        version: u32::try_from(version).map_err(|_| corrupt(format!("agent version {version}")))?,
        content_hash: get(row, "content_hash")?,
        definition: get(row, "definition")?,
        created_at: time(get(row, "created_at")?),
    })
}

fn approval_row(row: &Row<'_>) -> Result<ApprovalRow, LogError> {
    let status: String = get(row, "status")?;
    Ok(ApprovalRow {
        run_id: uuid_of(&get::<String>(row, "run_id")?, "run id")?,
        tenant: get(row, "tenant")?,
        call_id: get(row, "call_id")?,
        tool: get(row, "tool")?,
        input: parse(&get::<String>(row, "input")?, "approval input")?,
        args_hash: get(row, "args_hash")?,
        status: match status.as_str() {
            "pending" => ApprovalStatus::Pending,
            "decided" => ApprovalStatus::Decided,
            other => return Err(corrupt(format!("unknown approval status {other:?}"))),
        },
        requested_at: time(get(row, "requested_at")?),
        expires_at: get::<Option<i64>>(row, "expires_at")?.map(time),
        escalated: get(row, "escalated")?,
        interrupted: get(row, "interrupted")?,
    })
}

/// A `SELECT` with optional `AND` predicates bound to numbered parameters.
struct Select {
    sql: String,
    params: Vec<rusqlite::types::Value>,
}

impl Select {
    fn new(sql: impl Into<String>) -> Select {
        Select {
            sql: sql.into(),
            params: Vec::new(),
        }
    }

    fn and(&mut self, predicate: &str, value: impl Into<rusqlite::types::Value>) {
        self.params.push(value.into());
        self.sql
            .push_str(&format!(" AND {predicate} ?{}", self.params.len()));
    }

    /// Append `ORDER BY {order} LIMIT n`, run it, map each row.
    fn rows<T>(
        mut self,
        conn: &Connection,
        order: &str,
        limit: usize,
        map: impl Fn(&Row<'_>) -> Result<T, LogError>,
    ) -> Result<Vec<T>, LogError> {
        self.params.push(rusqlite::types::Value::Integer(
            i64::try_from(limit).unwrap_or(i64::MAX),
        ));
        self.sql
            .push_str(&format!(" ORDER BY {order} LIMIT ?{}", self.params.len()));
        let mut st = conn.prepare_cached(&self.sql).map_err(db("listing"))?;
        let mut rows = st
            .query(rusqlite::params_from_iter(self.params.iter()))
            .map_err(db("listing"))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(db("listing"))? {
            out.push(map(row)?);
        }
        Ok(out)
    }
}

// ---------------------------------------------------------------------------
// The event log

/// [`RunLog::stranded_children`]: children not done whose parent is done.
const STRANDED_SQL: &str = "SELECT c.id, p.id FROM runs c JOIN runs p ON p.id = c.parent_run_id \
     WHERE c.parent_run_id IS NOT NULL AND c.status <> 'done' AND p.status = 'done' \
       AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.run_id = c.id \
         AND i.dedupe_key = 'cancel' AND i.consumed = 0) LIMIT ?1";

#[async_trait]
impl RunLog for SqliteLog {
    /// One transaction: the batch (created on first use), the run row,
    /// `session.start` and a job. A used idempotency key returns that run.
    async fn create_run(&self, new: NewRun) -> Result<(RunSummary, bool), LogError> {
        let run_id = new.start.run_id;
        let state = RunState::replay(run_id, std::slice::from_ref(&new.start)).map_err(|e| {
            LogError::Invalid {
                run_id,
                reason: e.to_string(),
            }
        })?;
        let encoded = encode_events(run_id, std::slice::from_ref(&new.start))?;
        let columns = summary_columns(&state)?;
        self.store
            .write("create_run", move |conn| {
                let tx = immediate(conn)?;
                let now = nanos(Utc::now());
                if let Some(key) = &new.idempotency_key {
                    let existing = tx
                        .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM runs WHERE tenant = ?1 AND idempotency_key = ?2"))
                        .map_err(db("create_run"))?
                        .query_row(params![new.tenant, key], |row| Ok(summary(row)))
                        .optional()
                        .map_err(db("create_run"))?;
                    if let Some(found) = existing {
                        return Ok((found?, false));
                    }
                }
                if run_exists(&tx, run_id)? {
                    return Err(LogError::Invalid { run_id, reason: "run id already exists".into() });
                }
                if let Some(batch) = new.batch_id {
                    claim_batch(&tx, run_id, batch, &new.tenant, now)?;
                }
                let row = RunRow {
                    run_id,
                    tenant: &new.tenant,
                    idempotency_key: new.idempotency_key.as_deref(),
                    batch_id: new.batch_id,
                    tags: &new.tags,
                    metadata: &new.metadata,
                    custom_id: new.custom_id.as_deref(),
                    created_at: now,
                    parent_run_id: new.parent_run_id,
                    parent_call_id: new.parent_call_id.as_deref(),
                    depth: new.depth,
                };
                insert_run(&tx, &row, &state, &columns, now)?;
                insert_events(&tx, run_id, &encoded)?;
                insert_outbox(&tx, Job::start(run_id, state.head_seq), now)?;
                let created = tx
                    .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM runs WHERE id = ?1"))
                    .map_err(db("create_run"))?
                    .query_row([run_id.to_string()], |row| Ok(summary(row)))
                    .map_err(db("create_run"))??;
                tx.commit().map_err(db("create_run"))?;
                Ok((created, true))
            })
            .await
    }

    async fn get_run(&self, run_id: Uuid) -> Result<RunSummary, LogError> {
        self.store
            .read("get_run", move |conn| {
                conn.prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM runs WHERE id = ?1"))
                    .map_err(db("get_run"))?
                    .query_row([run_id.to_string()], |row| Ok(summary(row)))
                    .optional()
                    .map_err(db("get_run"))?
                    .ok_or(LogError::NotFound(run_id))?
            })
            .await
    }

    /// Filters become SQL predicates, newest first: tags and metadata
    /// pairs are looked up in the row's JSON (`json_each`), the error
    /// search compares Unicode lower case (`glia_lower`).
    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, LogError> {
        let mut select = Select::new(format!("SELECT {SUMMARY_COLUMNS} FROM runs WHERE 1"));
        if let Some(tenant) = &filter.tenant {
            select.and("tenant =", tenant.clone());
        }
        if let Some(status) = filter.status {
            select.and("status =", status.as_str().to_owned());
        }
        if let Some(outcome) = filter.outcome {
            select.and(
                "status = 'done' AND json_extract(outcome, '$.kind') =",
                outcome.as_str().to_owned(),
            );
        }
        if let Some(agent) = &filter.agent {
            select.and("agent =", agent.clone());
        }
        if let Some(version) = filter.agent_version {
            select.and("agent_version =", i64::from(version));
        }
        if let Some(batch) = filter.batch_id {
            select.and("batch_id =", batch.to_string());
        }
        for tag in &filter.tags {
            select.and(
                "EXISTS (SELECT 1 FROM json_each(runs.tags) t WHERE t.value =",
                tag.clone(),
            );
            select.sql.push(')');
        }
        for (key, value) in &filter.metadata {
            select.and(
                "EXISTS (SELECT 1 FROM json_each(runs.metadata) m WHERE m.key =",
                key.clone(),
            );
            select.and("m.value =", value.clone());
            select.sql.push(')');
        }
        if let Some(after) = filter.created_after {
            select.and("created_at >=", nanos(after));
        }
        if let Some(before) = filter.created_before {
            select.and("created_at <", nanos(before));
        }
        if let Some(min) = filter.min_cost_usd_micros {
            let Ok(min) = i64::try_from(min) else {
                return Ok(Vec::new());
            };
            select.and("cost_usd_micros >=", min);
        }
        if let Some(max) = filter.max_cost_usd_micros {
            select.and("cost_usd_micros <=", i64_of(max));
        }
        if let Some(q) = &filter.q {
            select.and(
                "status = 'done' AND instr(glia_lower(error),",
                q.to_lowercase(),
            );
            select.sql.push_str(") > 0");
        }
        if let Some(parent) = filter.parent {
            select.and("parent_run_id =", parent.to_string());
        }
        if let Some(point) = &filter.pull_point {
            select.and(
                "status = 'parked' AND json_extract(pull_point, '$.kind') =",
                point.clone(),
            );
        }
        if let Some(before) = filter.before {
            select.and("id <", before.to_string());
        }
        let limit = filter.limit.clamp(1, 1000);
        self.store
            .read("list_runs", move |conn| {
                select.rows(conn, "id DESC", limit, summary)
            })
            .await
    }

    async fn stranded_children(&self, limit: usize) -> Result<Vec<(Uuid, Uuid)>, LogError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.store
            .read("stranded_children", move |conn| {
                let mut st = conn
                    .prepare_cached(STRANDED_SQL)
                    .map_err(db("stranded_children"))?;
                let ids = st
                    .query_map([limit], |row| {
                        Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
                    })
                    .map_err(db("stranded_children"))?
                    .collect::<Result<Vec<(String, String)>, _>>()
                    .map_err(db("stranded_children"))?;
                ids.iter()
                    .map(|(c, p)| Ok((uuid_of(c, "run id")?, uuid_of(p, "parent run id")?)))
                    .collect()
            })
            .await
    }

    async fn events(&self, run_id: Uuid, after: u64, limit: usize) -> Result<Vec<Event>, LogError> {
        self.store
            .read("events", move |conn| {
                let tx = conn.transaction().map_err(db("events"))?;
                let events = read_events(&tx, run_id, after, limit)?;
                if events.is_empty() && !run_exists(&tx, run_id)? {
                    return Err(LogError::NotFound(run_id));
                }
                Ok(events)
            })
            .await
    }

    /// The state kept in memory when it is at the run's head (one process
    /// owns the file, so it is the log's: rebuilt from it, then advanced by
    /// every commit); otherwise the latest checkpoint plus the events after
    /// it, in one read transaction.
    async fn load(&self, run_id: Uuid) -> Result<RunState, LogError> {
        let store = self.store.clone();
        self.store
            .read("load", move |conn| {
                let tx = conn.transaction().map_err(db("load"))?;
                let head: i64 = tx
                    .prepare_cached("SELECT head_seq FROM runs WHERE id = ?1")
                    .and_then(|mut st| st.query_row([run_id.to_string()], |r| r.get(0)).optional())
                    .map_err(db("load"))?
                    .ok_or(LogError::NotFound(run_id))?;
                if let Some(state) = store.cached(run_id, u64_of(head, "head_seq")?) {
                    return Ok(state);
                }
                let state = rebuild(&tx, run_id)?.ok_or(LogError::NotFound(run_id))?;
                store.remember(state.clone());
                Ok(state)
            })
            .await
    }

    async fn acquire(&self, run_id: Uuid, owner: &str, ttl: Duration) -> Result<Lease, LogError> {
        let owner = owner.to_owned();
        self.store
            .write_relaxed("acquire", move |conn| {
                let tx = immediate(conn)?;
                let now = Utc::now();
                let held: Option<(Option<String>, Option<i64>)> = tx
                    .prepare_cached("SELECT lease_owner, lease_expires_at FROM runs WHERE id = ?1")
                    .and_then(|mut st| st.query_row([run_id.to_string()], |r| Ok((r.get(0)?, r.get(1)?))).optional())
                    .map_err(db("acquire"))?;
                let Some((holder, expires)) = held else { return Err(LogError::NotFound(run_id)) };
                if let Some(until) = expires.filter(|e| *e > nanos(now)) {
                    return Err(LogError::LeaseHeld { run_id, owner: holder.unwrap_or_default(), until: time(until) });
                }
                let token = Uuid::now_v7();
                let expires_at = nanos(now).saturating_add(ttl_nanos(ttl));
                tx.prepare_cached("UPDATE runs SET lease_owner = ?2, lease_token = ?3, lease_expires_at = ?4 WHERE id = ?1")
                    .and_then(|mut st| st.execute(params![run_id.to_string(), owner, token.to_string(), expires_at]))
                    .map_err(db("acquire"))?;
                tx.commit().map_err(db("acquire"))?;
                Ok(Lease { run_id, owner, token, expires_at: time(expires_at), taken_over: expires.is_some() })
            })
            .await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease, LogError> {
        let lease = lease.clone();
        self.store
            .write_relaxed("renew", move |conn| {
                let now = nanos(Utc::now());
                let expires_at = now.saturating_add(ttl_nanos(ttl));
                let n = conn
                    .prepare_cached("UPDATE runs SET lease_expires_at = ?3 WHERE id = ?1 AND lease_token = ?2 AND lease_expires_at > ?4")
                    .and_then(|mut st| st.execute(params![lease.run_id.to_string(), lease.token.to_string(), expires_at, now]))
                    .map_err(db("renew"))?;
                match n {
                    1 => Ok(Lease { expires_at: time(expires_at), taken_over: false, ..lease }),
                    _ if run_exists(conn, lease.run_id)? => Err(LogError::LeaseLost(lease.run_id)),
                    _ => Err(LogError::NotFound(lease.run_id)),
                }
            })
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<(), LogError> {
        let (run_id, token) = (lease.run_id, lease.token);
        self.store
            .write_relaxed("release", move |conn| {
                conn.prepare_cached("UPDATE runs SET lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL WHERE id = ?1 AND lease_token = ?2")
                    .and_then(|mut st| st.execute(params![run_id.to_string(), token.to_string()]))
                    .map_err(db("release"))?;
                Ok(())
            })
            .await
    }

    /// One `BEGIN IMMEDIATE` transaction: check the lease (token, expiry)
    /// and the head, append the events, update the summary, approvals and
    /// inbox, and at checkpoint positions write the state the log says
    /// (verifying the transitions). A commit without events only consumes
    /// inbox items.
    async fn commit(
        &self,
        lease: &Lease,
        events: &[Event],
        state: &RunState,
        consumed: &[i64],
    ) -> Result<(), LogError> {
        let run_id = lease.run_id;
        crate::postgres::check_envelope(run_id, events, state)?;
        let encoded = encode_events(run_id, events)?;
        let columns = summary_columns(state)?;
        let mut requested = Vec::new();
        let mut resolved = Vec::new();
        for e in events {
            requested.extend(ApprovalRecord::requested(e));
            if let EventKind::ApprovalResolved { call_id, .. } = &e.kind {
                resolved.push(call_id.clone());
            }
        }
        let token = lease.token.to_string();
        let events = events.to_vec();
        let claimed = state.clone();
        let consumed = consumed.to_vec();
        let every = self.store.checkpoint_every;
        let committed = self
            .store
            .write("commit", move |conn| {
                let tx = immediate(conn)?;
                let now = nanos(Utc::now());
                let row: Option<(i64, String, Option<String>, Option<i64>)> = tx
                    .prepare_cached("SELECT head_seq, tenant, lease_token, lease_expires_at FROM runs WHERE id = ?1")
                    .and_then(|mut st| st.query_row([run_id.to_string()], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))).optional())
                    .map_err(db("commit"))?;
                let Some((head, tenant, held, expires)) = row else { return Err(LogError::NotFound(run_id)) };
                if held.as_deref() != Some(token.as_str()) || expires.is_none_or(|e| e <= now) {
                    return Err(LogError::LeaseLost(run_id));
                }
                let head = u64_of(head, "head_seq")?;
                match events.first() {
                    Some(first) if first.seq != head + 1 => return Err(LogError::Conflict { run_id, expected: first.seq - 1, actual: head }),
                    None if claimed.head_seq != head => return Err(LogError::Conflict { run_id, expected: claimed.head_seq, actual: head }),
                    _ => {}
                }
                let checkpoint = if !events.is_empty() && claimed.head_seq >= next_checkpoint(head, every) {
                    let mut rebuilt = rebuild(&tx, run_id)?.ok_or_else(|| corrupt(format!("run {run_id} has no events")))?;
                    for e in &events {
                        rebuilt.apply(e).map_err(|err| LogError::Invalid { run_id, reason: err.to_string() })?;
                    }
                    if rebuilt != claimed {
                        tracing::warn!(%run_id, seq = rebuilt.head_seq, "the committed state differs from the log's; checkpointing the log's");
                    }
                    Some((rebuilt.head_seq, json(run_id, &rebuilt, "state")?))
                } else {
                    None
                };
                let id = run_id.to_string();
                if !events.is_empty() {
                    insert_events(&tx, run_id, &encoded)?;
                    update_summary(&tx, run_id, &columns, now)?;
                }
                for a in &requested {
                    insert_approval(&tx, run_id, &tenant, a)?;
                }
                for call_id in &resolved {
                    tx.prepare_cached("UPDATE approvals SET status = 'decided', decided_at = ?3 WHERE run_id = ?1 AND call_id = ?2 AND status = 'pending'")
                        .and_then(|mut st| st.execute(params![id, call_id, now]))
                        .map_err(db("commit"))?;
                }
                if claimed.phase == Phase::Done {
                    tx.prepare_cached("UPDATE approvals SET status = 'decided', decided_at = ?2 WHERE run_id = ?1 AND status = 'pending'")
                        .and_then(|mut st| st.execute(params![id, now]))
                        .map_err(db("commit"))?;
                }
                for item in &consumed {
                    tx.prepare_cached("UPDATE inbox SET consumed = 1 WHERE run_id = ?1 AND id = ?2")
                        .and_then(|mut st| st.execute(params![id, item]))
                        .map_err(db("commit"))?;
                }
                if let Some((seq, state)) = checkpoint {
                    tx.execute("INSERT INTO checkpoints (run_id, seq, state) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING", params![id, i64_of(seq), state])
                        .map_err(db("commit"))?;
                    tx.execute("DELETE FROM checkpoints WHERE run_id = ?1 AND seq < ?2", params![id, i64_of(seq)]).map_err(db("commit"))?;
                }
                tx.commit().map_err(db("commit"))?;
                Ok(events)
            })
            .await?;
        if !committed.is_empty() {
            self.store.advance(run_id, &committed);
        }
        Ok(())
    }

    /// One transaction on the writer; the ledger's held results of the run
    /// (in the same file) go with it.
    async fn erase_run(
        &self,
        run_id: Uuid,
        by: &str,
        at: DateTime<Utc>,
    ) -> Result<RunSummary, LogError> {
        let by = by.to_owned();
        let summary = self
            .store
            .write("erase_run", move |conn| {
                let tx = immediate(conn)?;
                erase_in(&tx, run_id, &by, at)?;
                let summary = tx
                    .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM runs WHERE id = ?1"))
                    .map_err(db("erase_run"))?
                    .query_row([run_id.to_string()], |row| Ok(summary(row)))
                    .map_err(db("erase_run"))??;
                tx.commit().map_err(db("erase_run"))?;
                Ok(summary)
            })
            .await?;
        self.store.forget(run_id);
        Ok(summary)
    }

    async fn expired_runs(&self, filter: &ExpiredFilter) -> Result<Vec<Uuid>, LogError> {
        let mut select = Select::new(
            "SELECT id FROM runs WHERE status = 'done' AND erased_at IS NULL".to_owned(),
        );
        select.and("ended_at <", nanos(filter.finished_before));
        match &filter.tenant {
            Some(tenant) => select.and("tenant =", tenant.clone()),
            None => {
                for t in &filter.except_tenants {
                    select.and("tenant <>", t.clone());
                }
            }
        }
        let limit = filter.limit.clamp(1, 1000);
        let ids: Vec<String> = self
            .store
            .read("expired_runs", move |conn| {
                select.rows(conn, "ended_at, id", limit, |row| get::<String>(row, "id"))
            })
            .await?;
        ids.iter().map(|id| uuid_of(id, "run id")).collect()
    }
}

#[async_trait]
impl Inbox for SqliteLog {
    /// One transaction: the inbox row (a used dedupe key is
    /// [`LogError::Duplicate`]), the approval marked decided, a job.
    async fn post(&self, run_id: Uuid, payload: Payload) -> Result<i64, LogError> {
        let key = dedupe_key(&payload);
        let text = json(run_id, &payload, "payload")?;
        let decided = match &payload {
            Payload::Approval { call_id, .. } => Some(call_id.clone()),
            _ => None,
        };
        self.store
            .write("post", move |conn| {
                let tx = immediate(conn)?;
                let now = nanos(Utc::now());
                let id = run_id.to_string();
                // The writer is the only one: the run's status and a waiting
                // cancel cannot change between this read and the insert.
                let (head, status, cancel_pending): (i64, String, bool) = tx
                    .prepare_cached(
                        "SELECT head_seq, status, EXISTS (SELECT 1 FROM inbox WHERE run_id = ?1 AND dedupe_key = 'cancel' AND consumed = 0) \
                         FROM runs WHERE id = ?1",
                    )
                    .and_then(|mut st| st.query_row([&id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).optional())
                    .map_err(db("post"))?
                    .ok_or(LogError::NotFound(run_id))?;
                let key_taken = match &key {
                    Some(k) => tx
                        .prepare_cached("SELECT 1 FROM inbox WHERE run_id = ?1 AND dedupe_key = ?2")
                        .and_then(|mut st| st.exists(params![id, k]))
                        .map_err(db("post"))?,
                    None => false,
                };
                let facts = crate::PostFacts { done: status == "done", cancel_pending, key_taken };
                if let Some(refused) = crate::post_refusal(run_id, key.as_deref(), facts) {
                    return Err(refused);
                }
                let item: i64 = tx
                    .prepare_cached("INSERT INTO inbox (run_id, dedupe_key, payload, created_at) VALUES (?1, ?2, ?3, ?4) RETURNING id")
                    .and_then(|mut st| st.query_row(params![id, key, text, now], |r| r.get(0)))
                    .map_err(db("post"))?;
                if let Some(call_id) = &decided {
                    tx.prepare_cached("UPDATE approvals SET status = 'decided', decided_at = ?3 WHERE run_id = ?1 AND call_id = ?2 AND status = 'pending'")
                        .and_then(|mut st| st.execute(params![id, call_id, now]))
                        .map_err(db("post"))?;
                }
                insert_outbox(&tx, Job::resume(run_id, u64_of(head, "head_seq")?), now)?;
                tx.commit().map_err(db("post"))?;
                Ok(item)
            })
            .await
    }

    async fn inbox(&self, run_id: Uuid) -> Result<Vec<InboxItem>, LogError> {
        self.store
            .read("inbox", move |conn| {
                let tx = conn.transaction().map_err(db("inbox"))?;
                let mut st = tx.prepare_cached("SELECT id, payload FROM inbox WHERE run_id = ?1 AND consumed = 0 ORDER BY id").map_err(db("inbox"))?;
                let mut rows = st.query([run_id.to_string()]).map_err(db("inbox"))?;
                let mut items = Vec::new();
                while let Some(row) = rows.next().map_err(db("inbox"))? {
                    let id: i64 = get(row, "id")?;
                    items.push(InboxItem { id, payload: parse(&get::<String>(row, "payload")?, &format!("inbox item {id}"))? });
                }
                drop(rows);
                drop(st);
                if items.is_empty() && !run_exists(&tx, run_id)? {
                    return Err(LogError::NotFound(run_id));
                }
                Ok(items)
            })
            .await
    }
}

#[async_trait]
impl Approvals for SqliteLog {
    async fn approvals(&self, filter: &ApprovalFilter) -> Result<Vec<ApprovalRow>, LogError> {
        let mut select = Select::new(
            "SELECT run_id, tenant, call_id, tool, input, args_hash, status, requested_at, expires_at, escalated, interrupted FROM approvals WHERE 1",
        );
        if let Some(tenant) = &filter.tenant {
            select.and("tenant =", tenant.clone());
        }
        if let Some(tool) = &filter.tool {
            select.and("tool =", tool.clone());
        }
        if let Some(run) = filter.run_id {
            select.and("run_id =", run.to_string());
        }
        if filter.pending_only {
            select.sql.push_str(" AND status = 'pending'");
        }
        if let Some(t) = filter.expired_by {
            select
                .sql
                .push_str(" AND status = 'pending' AND escalated = 0");
            select.and("expires_at <=", nanos(t));
        }
        let limit = filter.limit.clamp(1, 1000);
        self.store
            .read("approvals", move |conn| {
                select.rows(conn, "requested_at, id", limit, approval_row)
            })
            .await
    }

    async fn escalate(&self, run_id: Uuid, call_id: &str) -> Result<(), LogError> {
        let call_id = call_id.to_owned();
        self.store
            .write("escalate", move |conn| {
                let n = conn
                    .execute(
                        "UPDATE approvals SET escalated = 1 WHERE run_id = ?1 AND call_id = ?2",
                        params![run_id.to_string(), call_id],
                    )
                    .map_err(db("escalate"))?;
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
impl Outbox for SqliteLog {
    async fn outbox(&self, limit: usize) -> Result<Vec<(i64, Job)>, LogError> {
        self.store
            .read("outbox", move |conn| {
                let mut st = conn
                    .prepare_cached(
                        "SELECT id, run_id, head_seq, resume FROM outbox ORDER BY id LIMIT ?1",
                    )
                    .map_err(db("outbox"))?;
                let mut rows = st
                    .query([i64::try_from(limit).unwrap_or(i64::MAX)])
                    .map_err(db("outbox"))?;
                let mut jobs = Vec::new();
                while let Some(row) = rows.next().map_err(db("outbox"))? {
                    let job = Job {
                        run_id: uuid_of(&get::<String>(row, "run_id")?, "outbox run id")?,
                        head_seq: u64_of(get(row, "head_seq")?, "head_seq")?,
                        resume: get(row, "resume")?,
                    };
                    jobs.push((get(row, "id")?, job));
                }
                Ok(jobs)
            })
            .await
    }

    /// Relayed jobs are deleted.
    async fn outbox_done(&self, ids: &[i64]) -> Result<(), LogError> {
        let ids = ids.to_vec();
        self.store
            .write_relaxed("outbox_done", move |conn| {
                let tx = immediate(conn)?;
                {
                    let mut st = tx
                        .prepare_cached("DELETE FROM outbox WHERE id = ?1")
                        .map_err(db("outbox_done"))?;
                    for id in &ids {
                        st.execute([id]).map_err(db("outbox_done"))?;
                    }
                }
                tx.commit().map_err(db("outbox_done"))
            })
            .await
    }

    async fn orphaned(&self, limit: usize) -> Result<Vec<Orphan>, LogError> {
        self.store
            .read("orphaned", move |conn| {
                let mut st = conn
                    .prepare_cached(
                        "SELECT id, head_seq, resume, queued FROM ( \
                           SELECT id, head_seq, status, (head_seq = 1 AND status = 'runnable' AND lease_expires_at IS NULL) AS queued, \
                             EXISTS (SELECT 1 FROM inbox i WHERE i.run_id = r.id AND i.consumed = 0) AS resume FROM runs r \
                           WHERE status <> 'done' AND (lease_expires_at IS NULL OR lease_expires_at <= ?1) \
                         ) WHERE status = 'runnable' OR resume \
                         ORDER BY queued, id LIMIT ?2",
                    )
                    .map_err(db("orphaned"))?;
                let mut rows = st.query(params![nanos(Utc::now()), i64::try_from(limit).unwrap_or(i64::MAX)]).map_err(db("orphaned"))?;
                let mut jobs = Vec::new();
                while let Some(row) = rows.next().map_err(db("orphaned"))? {
                    let job = Job { run_id: uuid_of(&get::<String>(row, "id")?, "run id")?, head_seq: u64_of(get(row, "head_seq")?, "head_seq")?, resume: get(row, "resume")? };
                    jobs.push(Orphan { job, queued: get(row, "queued")? });
                }
                Ok(jobs)
            })
            .await
    }
}

#[async_trait]
impl AgentRegistry for SqliteLog {
    async fn put_agent(
        &self,
        tenant: &str,
        name: &str,
        definition: &str,
        content_hash: &str,
    ) -> Result<(AgentVersion, bool), LogError> {
        let (tenant, name, definition, content_hash) = (
            tenant.to_owned(),
            name.to_owned(),
            definition.to_owned(),
            content_hash.to_owned(),
        );
        self.store
            .write("put_agent", move |conn| {
                // The writer thread runs one write at a time: read and insert cannot interleave with another put.
                if let Some(last) = agent_row(conn, &tenant, &name, None)?
                    && last.content_hash == content_hash
                {
                    return Ok((last, false));
                }
                let version: i64 = conn
                    .query_row("SELECT COALESCE(MAX(version), 0) + 1 FROM agents WHERE tenant = ?1 AND name = ?2", params![tenant, name], |r| r.get(0))
                    .map_err(db("put_agent"))?;
                let now = Utc::now();
                conn.execute(
                    "INSERT INTO agents (tenant, name, version, content_hash, definition, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![tenant, name, version, content_hash, definition, nanos(now)],
                )
                .map_err(db("put_agent"))?;
                let version = u32::try_from(version).map_err(|_| corrupt(format!("agent {name}: version {version}")))?;
                Ok((AgentVersion { tenant, name, version, content_hash, definition, created_at: time(nanos(now)) }, true))
            })
            .await
    }

    async fn get_agent(
        &self,
        tenant: &str,
        name: &str,
        version: Option<u32>,
    ) -> Result<Option<AgentVersion>, LogError> {
        let (tenant, name) = (tenant.to_owned(), name.to_owned());
        self.store
            .read("get_agent", move |conn| {
                agent_row(conn, &tenant, &name, version)
            })
            .await
    }

    async fn list_agents(&self, tenant: &str) -> Result<Vec<AgentVersion>, LogError> {
        let tenant = tenant.to_owned();
        self.store
            .read("list_agents", move |conn| {
                let mut st = conn
                    .prepare_cached(
                        "SELECT tenant, name, version, content_hash, definition, created_at FROM agents a WHERE tenant = ?1 \
                         AND version = (SELECT MAX(version) FROM agents b WHERE b.tenant = a.tenant AND b.name = a.name) ORDER BY name",
                    )
                    .map_err(db("list_agents"))?;
                let mut rows = st.query(params![tenant]).map_err(db("list_agents"))?;
                let mut out = Vec::new();
                while let Some(row) = rows.next().map_err(db("list_agents"))? {
                    out.push(agent_of(row)?);
                }
                Ok(out)
            })
            .await
    }
}

#[async_trait]
impl Reports for SqliteLog {
    /// Reads the spending events of the tenant's runs updated since the day
    /// began and sums them in Rust ([`Spend::of_event`]).
    async fn tenant_usage(&self, tenant: &str, day: NaiveDate) -> Result<Spend, LogError> {
        let start = day.and_time(chrono::NaiveTime::MIN).and_utc();
        let end = start + chrono::Duration::days(1);
        let tenant = tenant.to_owned();
        self.store
            .read("tenant_usage", move |conn| {
                let mut st = conn
                    .prepare_cached(&TENANT_USAGE)
                    .map_err(db("tenant_usage"))?;
                let mut rows = st
                    .query(params![tenant, nanos(start), nanos(end)])
                    .map_err(db("tenant_usage"))?;
                let mut spend = Spend::ZERO;
                while let Some(row) = rows.next().map_err(db("tenant_usage"))? {
                    let kind: EventKind =
                        parse(&get::<String>(row, "payload")?, "tenant_usage event")?;
                    spend = spend.saturating_add(Spend::of_event(&kind).unwrap_or_default());
                }
                Ok(spend)
            })
            .await
    }

    async fn ready(&self) -> Result<(), LogError> {
        self.store
            .read("ready", |conn| {
                conn.query_row("SELECT 1", [], |_| Ok(()))
                    .map_err(db("ready"))
            })
            .await
    }

    /// Two counting queries in one read transaction.
    async fn gauges(&self, now: DateTime<Utc>) -> Result<LogGauges, LogError> {
        self.store
            .read("gauges", move |conn| {
                let tx = conn.transaction().map_err(db("gauges"))?;
                let mut g = LogGauges::default();
                {
                    let mut st = tx
                        .prepare_cached(
                            "SELECT status, coalesce(json_extract(pull_point, '$.kind'), '') AS pull_point, count(*) AS n FROM runs WHERE status <> 'done' GROUP BY 1, 2",
                        )
                        .map_err(db("gauges"))?;
                    let mut rows = st.query([]).map_err(db("gauges"))?;
                    while let Some(row) = rows.next().map_err(db("gauges"))? {
                        let status = crate::postgres::parse_status(&get::<String>(row, "status")?)?;
                        let pull_point: String = get(row, "pull_point")?;
                        let key = RunGaugeKey { status: status.as_str(), pull_point: if status == RunStatus::Parked { pull_point } else { String::new() } };
                        *g.runs.entry(key).or_default() += u64_of(get(row, "n")?, "count")?;
                    }
                }
                let (pending, overdue, oldest): (i64, i64, Option<i64>) = tx
                    .query_row(
                        "SELECT count(*), count(*) FILTER (WHERE expires_at <= ?1), min(requested_at) FROM approvals WHERE status = 'pending'",
                        [nanos(now)],
                        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                    )
                    .map_err(db("gauges"))?;
                g.approvals_pending = u64_of(pending, "count")?;
                g.approvals_overdue = u64_of(overdue, "count")?;
                g.oldest_approval_age_seconds = oldest.map_or(0.0, |t| (nanos(now).saturating_sub(t)).max(0) as f64 / 1e9);
                Ok(g)
            })
            .await
    }
}

// ---------------------------------------------------------------------------
// Export and import

#[async_trait]
impl Archive for SqliteLog {
    async fn export_run(&self, run_id: Uuid) -> Result<RunRecord, LogError> {
        self.store
            .read("export_run", move |conn| {
                let tx = conn.transaction().map_err(db("export_run"))?;
                let id = run_id.to_string();
                type Identity = (String, Option<String>, Option<String>, i64, String, String, Option<String>, Option<i64>, Option<String>);
                type Parent = (Option<String>, Option<String>, i64);
                let row: Option<(Identity, Parent)> = tx
                    .query_row("SELECT tenant, idempotency_key, batch_id, created_at, tags, metadata, custom_id, erased_at, erased_by, parent_run_id, parent_call_id, depth FROM runs WHERE id = ?1", [&id], |r| Ok(((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?, r.get(8)?), (r.get(9)?, r.get(10)?, r.get(11)?))))
                    .optional()
                    .map_err(db("export_run"))?;
                let Some(((tenant, idempotency_key, batch_id, created_at, tags, metadata, custom_id, erased_at, erased_by), (parent_run_id, parent_call_id, depth))) = row else { return Err(LogError::NotFound(run_id)) };
                let events = read_events(&tx, run_id, 0, usize::MAX)?;
                let approvals = Select::new("SELECT run_id, tenant, call_id, tool, input, args_hash, status, requested_at, expires_at, escalated, interrupted FROM approvals WHERE 1")
                    .tap_and("run_id =", id.clone())
                    .rows(&tx, "id", usize::MAX >> 1, approval_row)?
                    .into_iter()
                    .map(ApprovalRecord::from)
                    .collect();
                let mut inbox = Vec::new();
                {
                    let mut st = tx.prepare("SELECT payload, dedupe_key, consumed FROM inbox WHERE run_id = ?1 ORDER BY id").map_err(db("export_run"))?;
                    let mut rows = st.query([&id]).map_err(db("export_run"))?;
                    while let Some(row) = rows.next().map_err(db("export_run"))? {
                        inbox.push(InboxRecord { payload: parse(&get::<String>(row, "payload")?, "inbox payload")?, dedupe_key: get(row, "dedupe_key")?, consumed: get(row, "consumed")? });
                    }
                }
                Ok(RunRecord {
                    run_id,
                    tenant,
                    idempotency_key,
                    batch_id: batch_id.map(|b| uuid_of(&b, "batch id")).transpose()?,
                    created_at: time(created_at),
                    events,
                    approvals,
                    inbox,
                    tags: parse(&tags, "column tags")?,
                    metadata: parse(&metadata, "column metadata")?,
                    custom_id,
                    erased: erased_at.map(|at| crate::archive::Erasure { at: time(at), by: erased_by.unwrap_or_default() }),
                    parent_run_id: parent_run_id.map(|p| uuid_of(&p, "parent run id")).transpose()?,
                    parent_call_id,
                    depth: u32::try_from(depth).map_err(|_| corrupt(format!("depth {depth}")))?,
                })
            })
            .await
    }

    async fn import_run(&self, run: &RunRecord) -> Result<Imported, LogError> {
        let run = &run.erased_content();
        let state = run.validate()?;
        let job = run.job(&state);
        let encoded = encode_events(run.run_id, &run.events)?;
        let columns = summary_columns(&state)?;
        let run = run.clone();
        self.store
            .write("import_run", move |conn| {
                let tx = immediate(conn)?;
                let run_id = run.run_id;
                let id = run_id.to_string();
                let now = nanos(Utc::now());
                let head: Option<i64> = tx.query_row("SELECT head_seq FROM runs WHERE id = ?1", [&id], |r| r.get(0)).optional().map_err(db("import_run"))?;
                if let Some(head) = head {
                    let head = u64_of(head, "head_seq")?;
                    return if head == state.head_seq { Ok(Imported::AlreadyPresent) } else { Err(LogError::Conflict { run_id, expected: state.head_seq, actual: head }) };
                }
                if let Some(key) = &run.idempotency_key {
                    let other: Option<String> =
                        tx.query_row("SELECT id FROM runs WHERE tenant = ?1 AND idempotency_key = ?2", params![run.tenant, key], |r| r.get(0)).optional().map_err(db("import_run"))?;
                    if let Some(other) = other {
                        return Err(LogError::Invalid { run_id, reason: format!("tenant {} already uses idempotency key {key:?} for run {other}", run.tenant) });
                    }
                }
                if let Some(batch) = run.batch_id {
                    claim_batch(&tx, run_id, batch, &run.tenant, now)?;
                }
                let updated_at = run.events.last().map_or(now, |e| nanos(e.at));
                let row = RunRow {
                    run_id,
                    tenant: &run.tenant,
                    idempotency_key: run.idempotency_key.as_deref(),
                    batch_id: run.batch_id,
                    tags: &run.tags,
                    metadata: &run.metadata,
                    custom_id: run.custom_id.as_deref(),
                    created_at: nanos(run.created_at),
                    // Issue 32: the parent link (archive version 3).
                    parent_run_id: run.parent_run_id,
                    parent_call_id: run.parent_call_id.as_deref(),
                    depth: run.depth,
                };
                insert_run(&tx, &row, &state, &columns, updated_at)?;
                if let Some(erased) = &run.erased {
                    tx.execute(
                        "UPDATE runs SET goal = ?2, erased_at = ?3, erased_by = ?4 WHERE id = ?1",
                        params![id, glia_proto::TOMBSTONE, nanos(erased.at), erased.by],
                    )
                    .map_err(db("import_run"))?;
                }
                insert_events(&tx, run_id, &encoded)?;
                for a in &run.approvals {
                    insert_approval(&tx, run_id, &run.tenant, a)?;
                }
                for item in &run.inbox {
                    let payload = json(run_id, &item.payload, "inbox payload")?;
                    tx.execute(
                        "INSERT INTO inbox (run_id, dedupe_key, payload, consumed, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                        params![id, item.dedupe_key, payload, item.consumed, now],
                    )
                    .map_err(db("import_run"))?;
                }
                if let Some(job) = job {
                    insert_outbox(&tx, job, now)?;
                }
                tx.commit().map_err(db("import_run"))?;
                Ok(Imported::Created)
            })
            .await
    }
}

impl Select {
    fn tap_and(mut self, predicate: &str, value: impl Into<rusqlite::types::Value>) -> Select {
        self.and(predicate, value);
        self
    }
}

// ---------------------------------------------------------------------------
// The job queue

fn queue_error(e: LogError) -> QueueError {
    QueueError::Unavailable(e.to_string())
}

struct SqliteAcker {
    store: Arc<Store>,
    ready: Ready,
}

#[async_trait]
impl Acker for SqliteAcker {
    /// Deletes the job (a relaxed write: see [`SqliteQueue`]).
    async fn ack(&self) -> Result<(), QueueError> {
        let id = self.ready.id;
        self.store
            .write_relaxed("ack", move |conn| {
                conn.prepare_cached("DELETE FROM jobs WHERE id = ?1")
                    .and_then(|mut st| st.execute([id]))
                    .map(|_| ())
                    .map_err(db("ack"))
            })
            .await
            .map_err(queue_error)
    }

    /// Requeued: ready again, first in its line; otherwise dead-lettered
    /// (kept, marked dead, counted in [`QueueStats::dead_lettered`]).
    async fn nack(&self, requeue: bool) -> Result<(), QueueError> {
        if requeue {
            self.store
                .ready
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .line(&self.ready.job)
                .push_front(self.ready);
            self.store.notify_ready(&self.ready.job);
            return Ok(());
        }
        let id = self.ready.id;
        self.store
            .write_relaxed("nack", move |conn| {
                conn.execute("UPDATE jobs SET dead = 1 WHERE id = ?1", [id])
                    .map(|_| ())
                    .map_err(db("nack"))
            })
            .await
            .map_err(queue_error)
    }
}

impl SqliteQueue {
    /// The loop of [`JobQueue::next`] (`starts`: a start may be taken when
    /// no resume is ready) and [`JobQueue::next_resume`].
    async fn take(&self, starts: bool) -> Result<Delivery, QueueError> {
        let store = &self.store;
        loop {
            let next = store
                .ready
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop(starts);
            // A job made ready between the look and the wait wakes a waiter
            // or leaves a permit (`notify_one`) that ends this wait at once.
            let Some(mut ready) = next else {
                if starts {
                    tokio::select! {
                        _ = store.resumes_ready.notified() => {}
                        _ = store.starts_ready.notified() => {}
                    }
                } else {
                    store.resumes_ready.notified().await;
                }
                continue;
            };
            if ready.deliveries >= self.store.delivery_limit {
                let id = ready.id;
                self.store
                    .write_relaxed("dead-letter", move |conn| {
                        conn.execute("UPDATE jobs SET dead = 1 WHERE id = ?1", [id])
                            .map(|_| ())
                            .map_err(db("dead-letter"))
                    })
                    .await
                    .map_err(queue_error)?;
                continue;
            }
            ready.deliveries += 1;
            let acker = SqliteAcker {
                store: self.store.clone(),
                ready,
            };
            return Ok(Delivery {
                job: ready.job,
                redelivered: ready.deliveries > 1,
                acker: Box::new(acker),
                enqueued_at: Some(time(ready.enqueued_at)),
            });
        }
    }
}

/// The job queue. Jobs are rows of the store's file, written with a relaxed
/// sync (`synchronous = NORMAL` for that write): a job survives a crash of
/// the process, and one lost to a power cut is a lost wake-up, which the
/// dispatcher's reconciler replaces from the log. Which jobs are ready is
/// kept in process (one process per file): [`JobQueue::next`] takes the
/// oldest without touching the file, an ack deletes the row, and every job
/// not acked is ready again when the file is opened next. Resumes and starts
/// are two lines in process; [`JobQueue::next`] takes the oldest resume
/// before the oldest start.
#[async_trait]
impl JobQueue for SqliteQueue {
    async fn publish(&self, job: &Job) -> Result<(), QueueError> {
        let job = *job;
        let enqueued_at = nanos(Utc::now());
        let id = self
            .store
            .write_relaxed("publish", move |conn| {
                conn.prepare_cached("INSERT INTO jobs (run_id, head_seq, enqueued_at, resume) VALUES (?1, ?2, ?3, ?4) RETURNING id")
                    .and_then(|mut st| st.query_row(params![job.run_id.to_string(), i64_of(job.head_seq), enqueued_at, job.resume], |r| r.get::<_, i64>(0)))
                    .map_err(db("publish"))
            })
            .await
            .map_err(queue_error)?;
        self.store
            .ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .line(&job)
            .push_back(Ready {
                id,
                job,
                enqueued_at,
                deliveries: 0,
            });
        self.store.notify_ready(&job);
        Ok(())
    }

    /// The oldest ready resume, else the oldest ready start; one already
    /// delivered [`SqliteOptions::delivery_limit`] times in this process is
    /// dead-lettered instead. Waits for a publish or a requeue otherwise.
    async fn next(&self) -> Result<Delivery, QueueError> {
        self.take(true).await
    }

    /// [`JobQueue::next`] for resumes only.
    async fn next_resume(&self) -> Result<Delivery, QueueError> {
        self.take(false).await
    }

    async fn depth(&self) -> Result<u64, QueueError> {
        Ok(self
            .store
            .ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len() as u64)
    }

    /// Ready and dead-lettered jobs; consumers are not tracked.
    async fn stats(&self) -> Result<QueueStats, QueueError> {
        let dead = self
            .store
            .read("queue stats", |conn| {
                conn.query_row("SELECT count(*) FROM jobs WHERE dead = 1", [], |r| {
                    r.get::<_, i64>(0)
                })
                .map_err(db("queue stats"))
            })
            .await
            .map_err(queue_error)?;
        Ok(QueueStats {
            ready: self.depth().await?,
            consumers: None,
            dead_lettered: Some(dead.max(0) as u64),
        })
    }
}

// ---------------------------------------------------------------------------
// The ledger

fn ledger_error(e: LogError) -> LedgerError {
    LedgerError::Unavailable(e.to_string())
}

fn spend_of(tokens: i64, cost: i64) -> Spend {
    Spend {
        tokens: tokens.max(0) as u64,
        cost_usd_micros: cost.max(0) as u64,
    }
}

/// The live counter of `scope` (expired ones deleted first), in `tx`.
fn counter(tx: &Connection, scope: &str) -> Result<Option<Spend>, LogError> {
    let now = nanos(Utc::now());
    tx.execute(
        "DELETE FROM budgets WHERE scope = ?1 AND expires_at <= ?2",
        params![scope, now],
    )
    .map_err(db("budget"))?;
    tx.query_row(
        "SELECT tokens, cost_usd_micros FROM budgets WHERE scope = ?1",
        [scope],
        |r| Ok(spend_of(r.get(0)?, r.get(1)?)),
    )
    .optional()
    .map_err(db("budget"))
}

fn set_counter(tx: &Connection, scope: &str, used: Spend) -> Result<(), LogError> {
    tx.execute(
        "UPDATE budgets SET tokens = ?2, cost_usd_micros = ?3 WHERE scope = ?1",
        params![scope, i64_of(used.tokens), i64_of(used.cost_usd_micros)],
    )
    .map_err(db("budget"))?;
    Ok(())
}

#[async_trait]
impl Ledger for SqliteLedger {
    async fn cancel(&self, run_id: Uuid) -> Result<(), LedgerError> {
        self.store
            .write("cancel", move |conn| {
                conn.execute(
                    "INSERT INTO cancels (run_id, at) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                    params![run_id.to_string(), nanos(Utc::now())],
                )
                .map(|_| ())
                .map_err(db("cancel"))
            })
            .await
            .map_err(ledger_error)
    }

    async fn is_cancelled(&self, run_id: Uuid) -> Result<bool, LedgerError> {
        self.store
            .read("is_cancelled", move |conn| {
                conn.prepare_cached("SELECT 1 FROM cancels WHERE run_id = ?1")
                    .and_then(|mut st| st.exists([run_id.to_string()]))
                    .map_err(db("is_cancelled"))
            })
            .await
            .map_err(ledger_error)
    }

    /// Pause flags are kept in process, like live deltas: one process owns
    /// the file, and after its restart every run's next job reads the inbox
    /// (where the pause is) first.
    async fn set_paused(&self, run_id: Uuid, paused: bool) -> Result<(), LedgerError> {
        self.store.live.set_paused(run_id, paused).await
    }

    async fn signal(&self, run_id: Uuid) -> Result<Signal, LedgerError> {
        let cancelled = self.is_cancelled(run_id).await?;
        Ok(Signal {
            cancelled,
            ..self.store.live.signal(run_id).await?
        })
    }

    async fn publish_live(&self, run_id: Uuid, event: &LiveEvent) -> Result<(), LedgerError> {
        self.store.live.publish_live(run_id, event).await
    }

    async fn subscribe_live(
        &self,
        run_id: Uuid,
    ) -> Result<BoxStream<'static, LiveEvent>, LedgerError> {
        self.store.live.subscribe_live(run_id).await
    }

    async fn ready(&self) -> Result<(), LedgerError> {
        Reports::ready(&SqliteLog {
            store: self.store.clone(),
        })
        .await
        .map_err(ledger_error)
    }

    async fn reserve(
        &self,
        scope: &str,
        request_id: &str,
        amount: Spend,
        cap: SpendCap,
    ) -> Result<Reservation, LedgerError> {
        let (scope, request_id) = (scope.to_owned(), request_id.to_owned());
        self.store
            .write("reserve", move |conn| {
                let tx = immediate(conn)?;
                let Some(used) = counter(&tx, &scope)? else { return Ok(Reservation::Missing) };
                let seen = tx.query_row("SELECT 1 FROM budget_requests WHERE scope = ?1 AND request_id = ?2", params![scope, request_id], |_| Ok(())).optional().map_err(db("reserve"))?;
                if seen.is_some() {
                    return Ok(Reservation::Granted { used });
                }
                let refuses = |cap: Option<u64>, used: u64, amount: u64| cap.is_some_and(|cap| used >= cap || used.saturating_add(amount) > cap);
                if refuses(cap.cost_usd_micros, used.cost_usd_micros, amount.cost_usd_micros) {
                    return Ok(Reservation::Exceeded { used, cap: CapKind::Cost });
                }
                if refuses(cap.tokens, used.tokens, amount.tokens) {
                    return Ok(Reservation::Exceeded { used, cap: CapKind::Tokens });
                }
                let used = used.saturating_add(amount);
                set_counter(&tx, &scope, used)?;
                tx.execute(
                    "INSERT INTO budget_requests (scope, request_id, reserved_tokens, reserved_cost) VALUES (?1, ?2, ?3, ?4)",
                    params![scope, request_id, i64_of(amount.tokens), i64_of(amount.cost_usd_micros)],
                )
                .map_err(db("reserve"))?;
                tx.commit().map_err(db("reserve"))?;
                Ok(Reservation::Granted { used })
            })
            .await
            .map_err(ledger_error)
    }

    async fn settle(
        &self,
        scope: &str,
        request_id: &str,
        actual: Spend,
    ) -> Result<Settlement, LedgerError> {
        let (scope, request_id) = (scope.to_owned(), request_id.to_owned());
        self.store
            .write("settle", move |conn| {
                let tx = immediate(conn)?;
                let Some(used) = counter(&tx, &scope)? else { return Ok(Settlement::Missing) };
                let seen: Option<(Option<i64>, Option<i64>)> = tx
                    .query_row("SELECT reserved_tokens, reserved_cost FROM budget_requests WHERE scope = ?1 AND request_id = ?2", params![scope, request_id], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })
                    .optional()
                    .map_err(db("settle"))?;
                let reserved = match seen {
                    Some((None, _)) | Some((_, None)) => return Ok(Settlement::Settled { used }),
                    Some((Some(t), Some(c))) => spend_of(t, c),
                    None => Spend::ZERO,
                };
                let used = Spend {
                    tokens: used.tokens.saturating_sub(reserved.tokens).saturating_add(actual.tokens),
                    cost_usd_micros: used.cost_usd_micros.saturating_sub(reserved.cost_usd_micros).saturating_add(actual.cost_usd_micros),
                };
                set_counter(&tx, &scope, used)?;
                tx.execute(
                    "INSERT INTO budget_requests (scope, request_id, reserved_tokens, reserved_cost) VALUES (?1, ?2, NULL, NULL) \
                     ON CONFLICT (scope, request_id) DO UPDATE SET reserved_tokens = NULL, reserved_cost = NULL",
                    params![scope, request_id],
                )
                .map_err(db("settle"))?;
                tx.commit().map_err(db("settle"))?;
                Ok(Settlement::Settled { used })
            })
            .await
            .map_err(ledger_error)
    }

    async fn seed(&self, scope: &str, used: Spend, ttl: Duration) -> Result<bool, LedgerError> {
        let scope = scope.to_owned();
        self.store
            .write("seed", move |conn| {
                let tx = immediate(conn)?;
                if counter(&tx, &scope)?.is_some() {
                    return Ok(false);
                }
                let ttl = Duration::from_secs(ttl.as_secs().max(1));
                let expires = nanos(Utc::now()).saturating_add(ttl_nanos(ttl));
                tx.execute(
                    "INSERT INTO budgets (scope, tokens, cost_usd_micros, expires_at) VALUES (?1, ?2, ?3, ?4)",
                    params![scope, i64_of(used.tokens), i64_of(used.cost_usd_micros), expires],
                )
                .map_err(db("seed"))?;
                tx.commit().map_err(db("seed"))?;
                Ok(true)
            })
            .await
            .map_err(ledger_error)
    }

    /// One row per key in `held_results` (replaced), expired rows deleted.
    async fn hold_results(&self, held: &[(String, HeldResult)]) -> Result<(), LedgerError> {
        let mut rows = Vec::with_capacity(held.len());
        for (key, result) in held {
            rows.push((
                key.clone(),
                serde_json::to_string(result)
                    .map_err(|e| LedgerError::Unavailable(format!("encode held result: {e}")))?,
            ));
        }
        self.store
            .write("hold_results", move |conn| {
                let tx = immediate(conn)?;
                let now = nanos(Utc::now());
                tx.execute("DELETE FROM held_results WHERE expires_at <= ?1", [now]).map_err(db("hold_results"))?;
                let expires = now.saturating_add(ttl_nanos(HELD_RESULT_TTL));
                for (key, json) in &rows {
                    tx.execute("INSERT OR REPLACE INTO held_results (key, result, expires_at) VALUES (?1, ?2, ?3)", params![key, json, expires])
                        .map_err(db("hold_results"))?;
                }
                tx.commit().map_err(db("hold_results"))?;
                Ok(())
            })
            .await
            .map_err(ledger_error)?;
        self.store
            .live
            .unmark_running(held.iter().map(|(key, _)| key));
        Ok(())
    }

    /// Marks live in this process, like live deltas: the file's lock keeps
    /// its runs, and so their tool calls, to one process, and a call dies
    /// with it.
    async fn mark_running(&self, keys: &[String], ttl: Duration) -> Result<(), LedgerError> {
        self.store.live.mark_running(keys, ttl).await
    }

    async fn running(&self, key: &str) -> Result<bool, LedgerError> {
        self.store.live.running(key).await
    }

    async fn held_result(&self, key: &str) -> Result<Option<HeldResult>, LedgerError> {
        let key = key.to_owned();
        let json: Option<String> = self
            .store
            .read("held_result", move |conn| {
                conn.query_row(
                    "SELECT result FROM held_results WHERE key = ?1 AND expires_at > ?2",
                    params![key, nanos(Utc::now())],
                    |r| r.get(0),
                )
                .optional()
                .map_err(db("held_result"))
            })
            .await
            .map_err(ledger_error)?;
        json.map(|j| {
            serde_json::from_str(&j)
                .map_err(|e| LedgerError::Unavailable(format!("decode held result: {e}")))
        })
        .transpose()
    }

    /// The held results in the file, and the running marks kept in process.
    async fn forget_run(&self, run_id: Uuid) -> Result<(), LedgerError> {
        self.store.live.forget_run(run_id).await?;
        self.store
            .write_relaxed("forget_run", move |conn| {
                let tx = immediate(conn)?;
                tx.execute(
                    "DELETE FROM held_results WHERE substr(key, 1, 37) = ?1",
                    [format!("{run_id}:")],
                )
                .map_err(db("forget_run"))?;
                tx.commit().map_err(db("forget_run"))?;
                Ok(())
            })
            .await
            .map_err(ledger_error)
    }

    async fn release_held(&self, keys: &[String]) -> Result<(), LedgerError> {
        if keys.is_empty() {
            return Ok(());
        }
        let keys = keys.to_vec();
        self.store
            .write_relaxed("release_held", move |conn| {
                let tx = immediate(conn)?;
                for key in &keys {
                    tx.execute("DELETE FROM held_results WHERE key = ?1", [key])
                        .map_err(db("release_held"))?;
                }
                tx.commit().map_err(db("release_held"))?;
                Ok(())
            })
            .await
            .map_err(ledger_error)
    }
}
