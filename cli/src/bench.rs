//! `glia bench`: the measurements behind `BENCHMARKS.md`, on the real
//! services. Each makes its own database, queue and Redis key prefix and
//! removes the database and queue afterwards; each prints one JSON object of
//! results on stdout (medians over `--repeat` rounds where it repeats).
//!
//! - `steps`: durable step throughput of the whole fleet (dispatcher and
//!   workers on Postgres, RabbitMQ, Redis) on the agent-step workload, beside
//!   the raw single-row insert rate of the same Postgres, and the fleet's
//!   Postgres work alone at the same concurrency (the ceiling of the ratio
//!   between the two: [`writes_alone`]); with `--target
//!   sqlite` the same for the single node (dispatcher and workers on one
//!   SQLite file), `--target both` one after the other in the same run.
//! - `growth`: one long run; commit latency and bytes written per step early
//!   and late.
//! - `memory`: resident memory of a `glia worker` process advancing many
//!   runs at once.
//! - `listing`: `GET /v1/runs` with each filter on 100,000 runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use futures::StreamExt;
use glia_agent::agent::{EventSink, SinkError};
use glia_agent::provider::{ScriptLibrary, ScriptedProvider, ScriptedTurn};
use glia_agent::{Agent, async_trait};
use glia_backends::rabbitmq::{QueueOptions, RabbitQueue};
use glia_backends::redis_ledger::RedisLedger;
use glia_backends::{EventLog, Inbox, JobQueue, NewRun, RunLog};
use glia_proto::{Event, EventKind, Policy, PolicyAction, RunConfig, RunState};
use glia_worker::consumer::{Worker, WorkerOptions};
use reqwest::Method;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use uuid::Uuid;

use crate::client::{Server, checked};
use crate::ports::Urls;
use crate::tau_driver::percentile;

/// `glia bench …`.
#[derive(Subcommand)]
pub enum BenchCommand {
    /// Durable steps per second of the fleet on the agent-step workload, and
    /// the raw Postgres single-row insert rate at the same concurrency.
    Steps(StepsArgs),
    /// One long run: step commit latency and bytes written per step, early
    /// versus late.
    Growth(GrowthArgs),
    /// Resident memory of a worker process advancing many runs at once.
    Memory(MemoryArgs),
    /// Decision posted → `approval.resolved` committed by a worker, for
    /// decisions made in the inbox (its HTML form, with session cookie and
    /// CSRF token) and through the JSON API, interleaved.
    Approvals(ApprovalsArgs),
    /// `GET /v1/runs` with each of its filters and a deep cursor on a table
    /// of many runs (100,000 by default), through a dispatcher in this
    /// process on Postgres.
    Listing(ListingArgs),
}

/// `glia bench approvals`.
#[derive(Args)]
pub struct ApprovalsArgs {
    #[command(flatten)]
    urls: Urls,
    /// Decisions per path (inbox and API each).
    #[arg(long, default_value_t = 100)]
    decisions: usize,
}

/// What `glia bench steps` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// The fleet: Postgres, RabbitMQ, Redis.
    Fleet,
    /// The single node: one SQLite file (in a temporary directory).
    Sqlite,
    /// Both, the fleet first, in the same run; prints `{"fleet": …, "sqlite": …}`.
    Both,
}

/// `glia bench steps`.
#[derive(Args)]
pub struct StepsArgs {
    #[command(flatten)]
    urls: Urls,
    /// What to measure.
    #[arg(long, value_enum, default_value_t = Target::Fleet)]
    target: Target,
    /// Runs per round.
    #[arg(long, default_value_t = 400)]
    runs: usize,
    /// Tool turns per run (then a final answer); the first tool call needs
    /// an approval (in the runs `--gated-every` picks).
    #[arg(long, default_value_t = 10)]
    turns: usize,
    /// Gate every K-th run by an approval (1: every run). With K > 1 the
    /// other runs keep the fleet busy while the decisions arrive one by one
    /// as their runs park: approval → resume while the fleet is saturated,
    /// rather than after a flood of decisions.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    gated_every: u64,
    /// Workers (in this process, each with its own connections).
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Runs each worker advances at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Rounds; medians are reported.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Seconds of raw inserts per measurement.
    #[arg(long, default_value_t = 3)]
    raw_seconds: u64,
    /// How the fleet's workers commit a step on Postgres, one or more
    /// (comma-separated): each round runs every variant in turn, so their
    /// figures are measured side by side. One result per variant.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "group")]
    variants: Vec<Variant>,
    /// Slots of each worker kept for resumes (`Worker::with_resume_slots`;
    /// the `group_fifo` variant keeps none).
    #[arg(long, default_value_t = 1)]
    resume_slots: usize,
    /// Pooled Postgres connections of each worker in the `statement` and
    /// `group` variants (`transaction` keeps one per run in flight, as
    /// before group commit).
    #[arg(long, default_value_t = 8)]
    pool: usize,
}

/// A way for the fleet's workers to commit steps (`glia bench steps --variants`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    /// `BEGIN`, lock the run row, the writes, `COMMIT`: four round trips and
    /// one fsync per step; a connection per run in flight; the cancel flag
    /// read after each commit (the fleet before group commit).
    Transaction,
    /// One fenced statement per step: one round trip, one fsync; the cancel
    /// flag read after each commit.
    Statement,
    /// Group commit (a worker's concurrent steps in one transaction, one
    /// round trip and one fsync per group); the cancel flag read after each
    /// commit.
    GroupSerial,
    /// Group commit, the cancel flag read while the commit is in flight,
    /// resume hints from Postgres (`PgLog::resume_hints`) besides the
    /// queue (the default).
    Group,
    /// `group` without resume hints: every resume comes through the outbox
    /// relay and the queue.
    GroupQueued,
    /// `group` with the queue as it was before resumes first: every job
    /// published as a start (one first-in-first-out queue) and no worker
    /// slot kept for resumes.
    GroupFifo,
}

impl Variant {
    fn commit_mode(self) -> glia_backends::postgres::CommitMode {
        use glia_backends::postgres::CommitMode;
        match self {
            Variant::Transaction => CommitMode::Transaction,
            Variant::Statement => CommitMode::Statement,
            Variant::GroupSerial | Variant::Group | Variant::GroupQueued | Variant::GroupFifo => {
                CommitMode::Group
            }
        }
    }

    /// A worker's event log options: its pool (`pool` connections; in a
    /// transaction, one per run in flight, so no commit waits for one) and
    /// how it commits.
    fn worker_log(
        self,
        urls: &Urls,
        concurrency: usize,
        pool: usize,
    ) -> glia_backends::postgres::PgOptions {
        let max_connections = if self == Variant::Transaction {
            concurrency.max(1)
        } else {
            pool.max(1)
        };
        glia_backends::postgres::PgOptions {
            max_connections,
            commit_mode: self.commit_mode(),
            group_lanes: urls.group_lanes.into(),
            ..Default::default()
        }
    }

    /// The cancel flag is read after each commit returns.
    fn serial_cancel_check(self) -> bool {
        matches!(
            self,
            Variant::Transaction | Variant::Statement | Variant::GroupSerial
        )
    }
}

/// The job queue before resumes first (`Variant::GroupFifo`): every job is
/// published as a start, so resumes wait in line behind the starts queued
/// before them.
struct Fifo(Arc<dyn JobQueue>);

#[async_trait]
impl JobQueue for Fifo {
    async fn publish(&self, job: &glia_backends::Job) -> Result<(), glia_backends::QueueError> {
        self.0
            .publish(&glia_backends::Job {
                resume: false,
                ..*job
            })
            .await
    }
    async fn next(&self) -> Result<glia_backends::Delivery, glia_backends::QueueError> {
        self.0.next().await
    }
    async fn next_resume(&self) -> Result<glia_backends::Delivery, glia_backends::QueueError> {
        self.0.next_resume().await
    }
    async fn depth(&self) -> Result<u64, glia_backends::QueueError> {
        self.0.depth().await
    }
    async fn stats(&self) -> Result<glia_backends::QueueStats, glia_backends::QueueError> {
        self.0.stats().await
    }
}

/// `glia bench growth`.
#[derive(Args)]
pub struct GrowthArgs {
    #[command(flatten)]
    urls: Urls,
    /// Tool turns of the run.
    #[arg(long, default_value_t = 400)]
    turns: usize,
    /// Turns compared around each measuring point (turn 10, and the last
    /// turns).
    #[arg(long, default_value_t = 10)]
    window: usize,
}

/// `glia bench memory`.
#[derive(Args)]
pub struct MemoryArgs {
    #[command(flatten)]
    urls: Urls,
    /// Runs submitted; each makes one tool call.
    #[arg(long, default_value_t = 64)]
    runs: usize,
    /// Runs the worker advances at once (`glia worker --concurrency`);
    /// default: `--runs` (every run in flight together).
    #[arg(long)]
    concurrency: Option<usize>,
    /// How long each run's one tool call takes (ms), so that every run is
    /// in flight at the same time (the demo tool; not with `--mcp-result-bytes`).
    #[arg(long, default_value_t = 3000)]
    tool_ms: u64,
    /// Each run's tool call is instead the `big` tool of the test MCP
    /// server `odd-mcp` (over stdio, started by the worker from its
    /// catalogue), answering a single-line text of this many bytes
    /// (5 MiB: 5242880).
    #[arg(long, value_name = "BYTES", requires = "odd_mcp")]
    mcp_result_bytes: Option<u64>,
    /// The `odd-mcp` binary (`cargo build --release -p glia-testkit --bin
    /// odd-mcp`: `target/release/odd-mcp`).
    #[arg(long, value_name = "PATH")]
    odd_mcp: Option<std::path::PathBuf>,
}

/// Run one benchmark.
pub async fn bench(cmd: BenchCommand) -> Result<()> {
    let result = match cmd {
        BenchCommand::Steps(args) => match args.target {
            Target::Fleet => one_or_all(steps(&args, Target::Fleet).await?)?,
            Target::Sqlite => one_or_all(steps(&args, Target::Sqlite).await?)?,
            Target::Both => {
                json!({ "fleet": one_or_all(steps(&args, Target::Fleet).await?)?, "sqlite": one_or_all(steps(&args, Target::Sqlite).await?)? })
            }
        },
        BenchCommand::Growth(args) => serde_json::to_value(growth(&args).await?)?,
        BenchCommand::Memory(args) => serde_json::to_value(memory(&args).await?)?,
        BenchCommand::Approvals(args) => serde_json::to_value(approvals(&args).await?)?,
        BenchCommand::Listing(args) => serde_json::to_value(listing(&args).await?)?,
    };
    outln!("{}", serde_json::to_string_pretty(&result)?);
    Ok(())
}

/// One variant's result as it is; several as a list.
fn one_or_all(mut results: Vec<StepsResult>) -> Result<Value> {
    Ok(if results.len() == 1 {
        serde_json::to_value(results.remove(0))?
    } else {
        serde_json::to_value(results)?
    })
}

/// A database of its own on the server of `url`, dropped with the value.
async fn private_db(url: &str) -> Result<ScratchDb> {
    let admin: tokio_postgres::Config = url
        .parse()
        .with_context(|| format!("parsing the database URL {url}"))?;
    ScratchDb::on(admin).await
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(&v, 0.5).unwrap_or(0.0)
}

// ----- steps -------------------------------------------------------------------

/// One round of `steps`.
#[derive(Debug, Clone, Serialize)]
pub struct StepsRound {
    /// Durable steps (model responses and tool results, each committed) per second.
    pub steps_per_s: f64,
    /// Runs finished per second.
    pub runs_per_s: f64,
    /// Approval posted (inbox row committed) → `approval.resolved` committed, ms.
    pub approval_resume_p50_ms: f64,
    /// The same, 99th percentile.
    pub approval_resume_p99_ms: f64,
    /// `POST /v1/runs` answered (32 at once, while the fleet runs), ms.
    pub admission_p50_ms: f64,
    /// Raw single-row inserts per second, one connection.
    pub raw_inserts_per_s_1: f64,
    /// Raw single-row inserts per second at the fleet's concurrency.
    pub raw_inserts_per_s_c: f64,
    /// The fleet's Postgres work alone, set up as this variant's workers
    /// and at the same concurrency: steps per second when nothing else runs
    /// (see [`writes_alone`]; 0 for the single node).
    pub writes_alone_steps_per_s: f64,
    /// Steps committed in the round.
    pub steps: i64,
    /// Wall time of the round (submit to last run done), s.
    pub wall_s: f64,
}

/// `steps`: medians over the rounds, and the rounds.
#[derive(Debug, Serialize)]
pub struct StepsResult {
    /// How steps were committed (the fleet; `null` for the single node).
    pub variant: Option<Variant>,
    /// Workload.
    pub runs: usize,
    /// Tool turns per run.
    pub turns: usize,
    /// Every K-th run is gated by an approval.
    pub gated_every: u64,
    /// Workers.
    pub workers: usize,
    /// Runs per worker at once.
    pub concurrency: usize,
    /// Connections of the raw insert comparison (runs in flight).
    pub raw_concurrency: usize,
    /// Each figure's median over the rounds.
    pub median: StepsRound,
    /// Median steps/s ÷ median raw inserts/s at the same concurrency.
    pub ratio_to_raw: f64,
    /// Median writes-alone steps/s ÷ median raw inserts/s: the most
    /// `ratio_to_raw` could be for this variant on this machine, with every
    /// run writing and reading in Postgres what it does, if the rest of the
    /// fleet (queue, model, tools, ledger, HTTP) cost nothing (0 for the
    /// single node).
    pub writes_alone_ratio: f64,
    /// Every round.
    pub rounds: Vec<StepsRound>,
}

/// The agent-step script: an approval-gated call, `turns - 1` more tool
/// calls, a final answer.
fn step_script(turns: usize) -> Vec<ScriptedTurn> {
    let mut script = vec![ScriptedTurn::call("get_order", json!({ "order_id": "A1" }))];
    script.extend(
        (1..turns)
            .map(|i| ScriptedTurn::call("calculator", json!({ "op": "add", "a": i, "b": 1 }))),
    );
    script.push(ScriptedTurn::text("done"));
    script
}

fn step_config(model: &str, turns: usize) -> RunConfig {
    RunConfig {
        model: model.into(),
        policies: vec![Policy {
            tool: "get_order".into(),
            args: None,
            action: PolicyAction::RequireApproval,
        }],
        max_model_calls_per_turn: u32::try_from(turns + 2).unwrap_or(u32::MAX),
        ..RunConfig::default()
    }
}

/// Where a round's runs are kept.
// One per round: boxing the large variant would buy nothing.
#[allow(clippy::large_enum_variant)]
enum BenchStore {
    /// The fleet's services: a private database, queue and key prefix.
    Fleet {
        db: ScratchDb,
        sql: tokio_postgres::Client,
        queue_name: String,
        amqp_url: String,
    },
    /// The single node: a SQLite file in a temporary directory.
    Sqlite { dir: ScratchDir },
}

/// The fleet of one round: a dispatcher and workers in this process.
struct BenchFleet {
    store: BenchStore,
    server: Server,
    stop: watch::Sender<bool>,
}

impl BenchFleet {
    /// On the services: private database, queue and key prefix; each worker
    /// with its own connections.
    async fn start(
        urls: &Urls,
        agent: Arc<Agent>,
        workers: usize,
        concurrency: usize,
    ) -> Result<BenchFleet> {
        BenchFleet::start_with(
            urls,
            agent,
            workers,
            concurrency,
            None,
            Variant::Group,
            concurrency,
            1,
        )
        .await
    }

    /// [`BenchFleet::start`] with one bearer token (`TOKEN:TENANT:SCOPES[:NAME]`),
    /// a commit variant, each worker's pool and resume slots.
    #[allow(clippy::too_many_arguments)]
    async fn start_with(
        urls: &Urls,
        agent: Arc<Agent>,
        workers: usize,
        concurrency: usize,
        token: Option<&str>,
        variant: Variant,
        pool: usize,
        resume_slots: usize,
    ) -> Result<BenchFleet> {
        let db = private_db(&urls.database_url).await?;
        let name = format!("glia_bench_{}", Uuid::now_v7().simple());
        let (stop, shutdown) = watch::channel(false);
        let fifo = variant == Variant::GroupFifo;
        let ports = |log: glia_backends::postgres::PgLog| {
            let (amqp, redis, queue, prefix) = (
                urls.amqp_url.clone(),
                urls.redis_url.clone(),
                name.clone(),
                name.clone(),
            );
            async move {
                let queue: Arc<dyn JobQueue> = Arc::new(
                    RabbitQueue::connect(&amqp, QueueOptions::new(queue))
                        .await
                        .context("connecting to RabbitMQ")?,
                );
                let queue = if fifo { Arc::new(Fifo(queue)) } else { queue };
                let ledger = RedisLedger::connect(&redis, &prefix)
                    .await
                    .context("connecting to Redis")?;
                anyhow::Ok((
                    Arc::new(log) as Arc<dyn EventLog>,
                    queue,
                    Arc::new(ledger) as Arc<dyn glia_backends::Ledger>,
                ))
            }
        };
        let (log, queue, ledger) = ports(db.log().await?).await?;
        let server = serve(log, queue, ledger, token, shutdown.clone()).await?;
        for n in 0..workers {
            let log = db
                .log_with(variant.worker_log(urls, concurrency, pool))
                .await?;
            let options = WorkerOptions {
                id: format!("bench-{n}"),
                concurrency,
                lease_ttl: Duration::from_secs(30),
            };
            let hints = (variant == Variant::Group).then(|| log.resume_hints(&options.id));
            let (log, queue, ledger) = ports(log).await?;
            let mut worker = Worker::new(agent.clone(), log, queue, ledger, options)
                .with_serial_cancel_check(variant.serial_cancel_check())
                .with_resume_slots(if fifo { 0 } else { resume_slots });
            if let Some(hints) = hints {
                worker = worker.with_hints(hints);
            }
            tokio::spawn(Arc::new(worker).run(shutdown.clone()));
        }
        let sql = db.sql().await?;
        Ok(BenchFleet {
            store: BenchStore::Fleet {
                db,
                sql,
                queue_name: name,
                amqp_url: urls.amqp_url.clone(),
            },
            server,
            stop,
        })
    }

    /// The single node: dispatcher and workers on one SQLite file (as
    /// `glia serve` runs them).
    async fn start_sqlite(
        agent: Arc<Agent>,
        workers: usize,
        concurrency: usize,
    ) -> Result<BenchFleet> {
        let dir = ScratchDir::new()?;
        let ports = crate::ports::Ports::sqlite(&dir.db()).await?;
        let (stop, shutdown) = watch::channel(false);
        let server = serve(
            ports.log.clone(),
            ports.queue.clone(),
            ports.ledger.clone(),
            None,
            shutdown.clone(),
        )
        .await?;
        for n in 0..workers {
            let options = WorkerOptions {
                id: format!("bench-{n}"),
                concurrency,
                lease_ttl: Duration::from_secs(30),
            };
            tokio::spawn(
                Arc::new(Worker::new(
                    agent.clone(),
                    ports.log.clone(),
                    ports.queue.clone(),
                    ports.ledger.clone(),
                    options,
                ))
                .run(shutdown.clone()),
            );
        }
        Ok(BenchFleet {
            store: BenchStore::Sqlite { dir },
            server,
            stop,
        })
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        tokio::time::sleep(Duration::from_millis(200)).await;
        if let BenchStore::Fleet {
            queue_name,
            amqp_url,
            ..
        } = &self.store
        {
            match RabbitQueue::connect(amqp_url, QueueOptions::new(queue_name.clone())).await {
                Ok(q) => {
                    if let Err(e) = q.delete_topology().await {
                        errln!("bench: queue {queue_name} not deleted: {e}");
                    }
                    q.close().await;
                }
                Err(e) => errln!("bench: queue {queue_name} not deleted: {e}"),
            }
        }
    }

    /// A count from the store (`SELECT count(*) …`, the same SQL on both).
    async fn count(&self, sql: &'static str) -> Result<i64> {
        match &self.store {
            BenchStore::Fleet { sql: client, .. } => Ok(client.query_one(sql, &[]).await?.get(0)),
            BenchStore::Sqlite { dir } => {
                let path = dir.db();
                tokio::task::spawn_blocking(move || {
                    let conn = rusqlite::Connection::open_with_flags(
                        &path,
                        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
                    )?;
                    conn.busy_timeout(Duration::from_secs(5))?;
                    anyhow::Ok(conn.query_row(sql, [], |r| r.get(0))?)
                })
                .await?
            }
        }
    }

    /// Approval posted (inbox row committed) → `approval.resolved`
    /// committed, ms, each.
    async fn approval_latencies(&self) -> Result<Vec<f64>> {
        match &self.store {
            BenchStore::Fleet { sql, .. } => Ok(sql
                .query(
                    "SELECT (extract(epoch FROM (e.at - i.created_at)) * 1000)::float8 FROM inbox i JOIN events e \
                     ON e.run_id = i.run_id AND e.kind = 'approval.resolved' AND e.payload->'data'->>'call_id' = i.payload->>'call_id' \
                     WHERE i.payload->>'kind' = 'approval'",
                    &[],
                )
                .await?
                .iter()
                .map(|r| r.get::<_, f64>(0))
                .collect()),
            BenchStore::Sqlite { dir } => {
                let path = dir.db();
                tokio::task::spawn_blocking(move || {
                    let conn = rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
                    conn.busy_timeout(Duration::from_secs(5))?;
                    let mut st = conn.prepare(
                        "SELECT (e.at - i.created_at) / 1e6 FROM inbox i JOIN events e \
                         ON e.run_id = i.run_id AND e.kind = 'approval.resolved' AND json_extract(e.payload, '$.data.call_id') = json_extract(i.payload, '$.call_id') \
                         WHERE json_extract(i.payload, '$.kind') = 'approval'",
                    )?;
                    let rows = st.query_map([], |r| r.get::<_, f64>(0))?.collect::<Result<Vec<f64>, _>>()?;
                    anyhow::Ok(rows)
                })
                .await?
            }
        }
    }
}

/// A dispatcher on the ports, on an ephemeral loopback port.
/// A dispatcher on a loopback port, open or with one bearer token
/// (`TOKEN:TENANT:SCOPES[:NAME]`, which the returned client then sends).
async fn serve(
    log: Arc<dyn EventLog>,
    queue: Arc<dyn JobQueue>,
    ledger: Arc<dyn glia_backends::Ledger>,
    token: Option<&str>,
    shutdown: watch::Receiver<bool>,
) -> Result<Server> {
    let specs = token.map(glia_dispatcher::Auth::parse_spec).transpose()?;
    let app = glia_dispatcher::App::new(
        log,
        queue,
        ledger,
        glia_dispatcher::Auth::from_tokens(specs)?,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let token = token.map(|t| t.split(':').next().unwrap_or_default().to_owned());
    let server = Server {
        server: format!("http://{}", listener.local_addr()?),
        token,
        max_outage_secs: 0,
    };
    tokio::spawn(crate::serve::run_dispatcher(
        app,
        listener,
        Duration::from_secs(2),
        Duration::from_secs(5),
        shutdown,
    ));
    Ok(server)
}

async fn steps(args: &StepsArgs, target: Target) -> Result<Vec<StepsResult>> {
    let mut library = ScriptLibrary::default();
    library.insert("bench", step_script(args.turns));
    let agent = Arc::new(Agent::new(Arc::new(library)).with_tools(crate::demo::tools()));
    let raw_concurrency = args.runs.min(args.workers.max(1) * args.concurrency);
    let recorded = RecordedRun::record(&agent, args.turns).await?;
    let variants: Vec<Option<Variant>> = match target {
        Target::Sqlite => vec![None],
        _ => args.variants.iter().copied().map(Some).collect(),
    };
    let mut rounds: Vec<Vec<StepsRound>> = vec![Vec::new(); variants.len()];
    for round in 0..args.repeat.max(1) {
        // Every variant in turn, then the raw rate: side by side in each round.
        let mut results = Vec::new();
        for variant in &variants {
            let fleet = match variant {
                None => {
                    BenchFleet::start_sqlite(agent.clone(), args.workers, args.concurrency).await?
                }
                Some(v) => {
                    BenchFleet::start_with(
                        &args.urls,
                        agent.clone(),
                        args.workers,
                        args.concurrency,
                        None,
                        *v,
                        args.pool,
                        args.resume_slots,
                    )
                    .await?
                }
            };
            let result = steps_round(args, &fleet).await;
            fleet.stop().await;
            results.push(result?);
        }
        // The raw rate, on a store of its own once the fleet is gone.
        let seconds = Duration::from_secs(args.raw_seconds);
        let (raw_1, raw_c, alone) = if target == Target::Sqlite {
            (
                raw_sqlite_inserts(1, seconds).await?,
                raw_sqlite_inserts(raw_concurrency, seconds).await?,
                vec![0.0; variants.len()],
            )
        } else {
            let raw_db = private_db(&args.urls.database_url).await?;
            let (raw_1, raw_c) = (
                raw_inserts(&raw_db, 1, seconds).await?,
                raw_inserts(&raw_db, raw_concurrency, seconds).await?,
            );
            let mut alone = Vec::new();
            for variant in variants.iter().flatten() {
                alone.push(
                    writes_alone(&raw_db, &recorded, args, *variant, raw_concurrency, seconds)
                        .await?,
                );
            }
            drop(raw_db);
            (raw_1, raw_c, alone)
        };
        for (i, mut result) in results.into_iter().enumerate() {
            result.raw_inserts_per_s_1 = raw_1;
            result.raw_inserts_per_s_c = raw_c;
            result.writes_alone_steps_per_s = alone[i];
            errln!(
                "{target:?} {:?} round {}: {:.0} steps/s ({:.2} of raw {:.0}/s; writes alone {:.0}/s, {:.2} of raw), approval→resume p50 {:.1} ms p99 {:.1} ms, admission p50 {:.1} ms",
                variants[i],
                round + 1,
                result.steps_per_s,
                result.steps_per_s / raw_c.max(1.0),
                raw_c,
                alone[i],
                alone[i] / raw_c.max(1.0),
                result.approval_resume_p50_ms,
                result.approval_resume_p99_ms,
                result.admission_p50_ms
            );
            rounds[i].push(result);
        }
    }
    Ok(variants
        .into_iter()
        .zip(rounds)
        .map(|(variant, rounds)| summarise(args, variant, raw_concurrency, rounds))
        .collect())
}

/// Medians over a variant's rounds.
fn summarise(
    args: &StepsArgs,
    variant: Option<Variant>,
    raw_concurrency: usize,
    rounds: Vec<StepsRound>,
) -> StepsResult {
    let m = |f: fn(&StepsRound) -> f64| median(rounds.iter().map(f).collect());
    let medians = StepsRound {
        steps_per_s: m(|r| r.steps_per_s),
        runs_per_s: m(|r| r.runs_per_s),
        approval_resume_p50_ms: m(|r| r.approval_resume_p50_ms),
        approval_resume_p99_ms: m(|r| r.approval_resume_p99_ms),
        admission_p50_ms: m(|r| r.admission_p50_ms),
        raw_inserts_per_s_1: m(|r| r.raw_inserts_per_s_1),
        raw_inserts_per_s_c: m(|r| r.raw_inserts_per_s_c),
        writes_alone_steps_per_s: m(|r| r.writes_alone_steps_per_s),
        steps: median(rounds.iter().map(|r| r.steps as f64).collect()) as i64,
        wall_s: m(|r| r.wall_s),
    };
    let of_raw = |x: f64| {
        if medians.raw_inserts_per_s_c > 0.0 {
            x / medians.raw_inserts_per_s_c
        } else {
            0.0
        }
    };
    let (ratio_to_raw, writes_alone_ratio) = (
        of_raw(medians.steps_per_s),
        of_raw(medians.writes_alone_steps_per_s),
    );
    StepsResult {
        variant,
        runs: args.runs,
        turns: args.turns,
        gated_every: args.gated_every,
        workers: args.workers,
        concurrency: args.concurrency,
        raw_concurrency,
        median: medians,
        ratio_to_raw,
        writes_alone_ratio,
        rounds,
    }
}

async fn steps_round(args: &StepsArgs, fleet: &BenchFleet) -> Result<StepsRound> {
    let client = crate::client::http_client()?;
    let gated = step_config("script:bench", args.turns);
    let ungated = RunConfig {
        policies: Vec::new(),
        ..gated.clone()
    };
    let started = Instant::now();
    let created: Vec<Result<f64>> = futures::stream::iter(0..args.runs)
        .map(|i| {
            let config = if (i as u64).is_multiple_of(args.gated_every) {
                gated.clone()
            } else {
                ungated.clone()
            };
            let (client, server) = (client.clone(), &fleet.server);
            async move {
                let sent = Instant::now();
                let req = server
                    .request(&client, Method::POST, "/v1/runs")
                    .json(&json!({ "goal": format!("bench run {i}"), "config": config }));
                checked(req.send().await.context("connecting to the dispatcher")?).await?;
                Ok(sent.elapsed().as_secs_f64() * 1000.0)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let mut admissions = created.into_iter().collect::<Result<Vec<f64>>>()?;
    admissions.sort_by(f64::total_cmp);
    // Approve whatever waits, until every run is done.
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let page = checked(
            fleet
                .server
                .request(&client, Method::GET, "/v1/approvals?limit=500")
                .send()
                .await?,
        )
        .await?;
        let decisions: Vec<Value> = page["approvals"]
            .as_array()
            .map(|a| a.iter().map(|x| json!({ "run_id": x["run_id"], "call_id": x["call_id"], "decision": "approve", "args_hash": x["args_hash"] })).collect())
            .unwrap_or_default();
        for chunk in decisions.chunks(100) {
            checked(
                fleet
                    .server
                    .request(&client, Method::POST, "/v1/approvals")
                    .json(&json!({ "decisions": chunk }))
                    .send()
                    .await?,
            )
            .await?;
        }
        let done = fleet
            .count("SELECT count(*) FROM runs WHERE status = 'done'")
            .await?;
        if done as usize >= args.runs {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the round did not finish in 10 minutes ({done} of {} runs done)",
                args.runs
            );
        }
        if decisions.is_empty() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let wall_s = started.elapsed().as_secs_f64();
    let steps = fleet.count("SELECT count(*) FROM events WHERE kind IN ('model.response', 'tool.result', 'tool.error')").await?;
    let failed = fleet
        .count("SELECT count(*) FROM events WHERE kind = 'error'")
        .await?;
    if failed > 0 {
        bail!("{failed} runs recorded an error; the workload is broken");
    }
    let mut latencies = fleet.approval_latencies().await?;
    latencies.sort_by(f64::total_cmp);
    Ok(StepsRound {
        steps_per_s: steps as f64 / wall_s,
        runs_per_s: args.runs as f64 / wall_s,
        approval_resume_p50_ms: percentile(&latencies, 0.5).unwrap_or(0.0),
        approval_resume_p99_ms: percentile(&latencies, 0.99).unwrap_or(0.0),
        admission_p50_ms: percentile(&admissions, 0.5).unwrap_or(0.0),
        raw_inserts_per_s_1: 0.0,
        raw_inserts_per_s_c: 0.0,
        writes_alone_steps_per_s: 0.0,
        steps,
        wall_s,
    })
}

/// Single-row autocommit inserts (a small JSON payload, like an event) on
/// `connections` connections for `duration`: rows per second.
async fn raw_inserts(db: &ScratchDb, connections: usize, duration: Duration) -> Result<f64> {
    db.sql().await?.batch_execute("CREATE TABLE IF NOT EXISTS raw_inserts (id bigserial PRIMARY KEY, run_id uuid NOT NULL, payload jsonb NOT NULL)").await?;
    let payload = json!({ "type": "tool.result", "data": { "call_id": "call_1", "content": "{\"order_id\":\"A1\",\"status\":\"shipped\"}", "duration_ms": 0 } });
    let mut clients = Vec::new();
    for _ in 0..connections.max(1) {
        clients.push(db.sql().await?);
    }
    let started = Instant::now();
    let until = started + duration;
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|client| {
            let payload = payload.clone();
            tokio::spawn(async move {
                let insert = client
                    .prepare("INSERT INTO raw_inserts (run_id, payload) VALUES ($1, $2)")
                    .await?;
                let mut n = 0u64;
                while Instant::now() < until {
                    client
                        .execute(&insert, &[&Uuid::now_v7(), &payload])
                        .await?;
                    n += 1;
                }
                anyhow::Ok(n)
            })
        })
        .collect();
    rate(tasks, started).await
}

/// Rows per second since `started`: the sum of the tasks' counts.
async fn rate(tasks: Vec<tokio::task::JoinHandle<Result<u64>>>, started: Instant) -> Result<f64> {
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// One ungated run of the workload, as a worker commits it: its
/// `session.start` (which admission writes) and each later commit's events
/// with the state after them.
struct RecordedRun {
    start: Event,
    commits: Vec<(Vec<Event>, RunState)>,
}

impl RecordedRun {
    /// Run the workload's script once in memory, keeping the commits.
    async fn record(agent: &Agent, turns: usize) -> Result<RecordedRun> {
        let mut sink = RecordingSink::default();
        let config = RunConfig {
            policies: Vec::new(),
            ..step_config("script:bench", turns)
        };
        let (state, _) = agent
            .run(Uuid::now_v7(), "bench run", config, &mut sink)
            .await?;
        if !matches!(state.outcome, Some(glia_proto::Outcome::Succeeded { .. })) {
            bail!("the recorded run did not succeed: {:?}", state.outcome);
        }
        let mut commits = sink.commits.into_iter();
        let start = match commits.next() {
            Some((mut events, _))
                if events.len() == 1
                    && matches!(events[0].kind, EventKind::SessionStart { .. }) =>
            {
                events.remove(0)
            }
            other => {
                bail!("the recorded run's first commit is not its session.start alone: {other:?}")
            }
        };
        Ok(RecordedRun {
            start,
            commits: commits.collect(),
        })
    }
}

/// Keeps each commit's events and the state after them.
#[derive(Default)]
struct RecordingSink {
    buffer: Vec<Event>,
    commits: Vec<(Vec<Event>, RunState)>,
}

#[async_trait]
impl EventSink for RecordingSink {
    async fn record(&mut self, event: &Event) -> Result<(), SinkError> {
        self.buffer.push(event.clone());
        Ok(())
    }

    async fn commit(&mut self, state: &RunState) -> Result<(), SinkError> {
        if !self.buffer.is_empty() {
            self.commits
                .push((std::mem::take(&mut self.buffer), state.clone()));
        }
        Ok(())
    }
}

/// The fleet's Postgres work alone, for `duration`: as many writers as
/// runs in flight (`writers`), spread over `args.workers` event logs set up
/// as the fleet's workers' are for `variant` (pool, commit mode, group
/// lanes). Each writer admits runs one after another and does what a
/// worker does in Postgres for each: `open` (the lease and the reads),
/// `recorded`'s commits, `release_if_idle`. No queue, model, tools, ledger
/// or HTTP. Steps (model responses and tool results, as [`steps_round`]
/// counts them) committed per second: on the same server and at the same
/// concurrency as the raw inserts, the ceiling of the fleet's
/// `ratio_to_raw` for that variant.
async fn writes_alone(
    db: &ScratchDb,
    recorded: &RecordedRun,
    args: &StepsArgs,
    variant: Variant,
    writers: usize,
    duration: Duration,
) -> Result<f64> {
    let mut logs = Vec::new();
    for _ in 0..args.workers.max(1) {
        logs.push(Arc::new(
            db.log_with(variant.worker_log(&args.urls, args.concurrency, args.pool))
                .await?,
        ));
    }
    let commits: Arc<Vec<(Vec<Event>, RunState, u64)>> = Arc::new(
        recorded
            .commits
            .iter()
            .map(|(events, state)| {
                let steps = events
                    .iter()
                    .filter(|e| {
                        matches!(
                            e.kind,
                            EventKind::ModelResponse { .. }
                                | EventKind::ToolResult { .. }
                                | EventKind::ToolError { .. }
                        )
                    })
                    .count();
                (events.clone(), state.clone(), steps as u64)
            })
            .collect(),
    );
    if commits.iter().all(|(_, _, n)| *n == 0) {
        bail!("the recorded run committed no step");
    }
    // Every connection opened and its statements prepared first (one run
    // per writer), as the raw inserts connect before their clock starts.
    let warm = Instant::now() + Duration::from_millis(1);
    rate(
        write_runs(&logs, &commits, &recorded.start, writers, warm),
        Instant::now(),
    )
    .await?;
    let started = Instant::now();
    rate(
        write_runs(
            &logs,
            &commits,
            &recorded.start,
            writers,
            started + duration,
        ),
        started,
    )
    .await
}

/// [`writes_alone`]'s writers, spread over `logs`: each admits a run and
/// writes all its commits, then the next, until `until` has passed (at
/// least one run each; the rate counts the time to the last run's end),
/// answering the steps it committed.
fn write_runs(
    logs: &[Arc<glia_backends::postgres::PgLog>],
    commits: &Arc<Vec<(Vec<Event>, RunState, u64)>>,
    start: &Event,
    writers: usize,
    until: Instant,
) -> Vec<tokio::task::JoinHandle<Result<u64>>> {
    (0..writers.max(1))
        .map(|w| {
            let (log, commits, start) =
                (logs[w % logs.len()].clone(), commits.clone(), start.clone());
            tokio::spawn(async move {
                let mut steps = 0u64;
                loop {
                    let run_id = Uuid::now_v7();
                    let start = Event {
                        run_id,
                        ..start.clone()
                    };
                    log.create_run(NewRun {
                        tenant: "bench".into(),
                        idempotency_key: None,
                        batch_id: None,
                        start,
                        tags: Vec::new(),
                        metadata: Default::default(),
                        custom_id: None,
                        parent_run_id: None,
                        parent_call_id: None,
                        depth: 0,
                    })
                    .await?;
                    let lease = match log
                        .open(
                            &glia_backends::Job::start(run_id, 1),
                            &format!("bench-writer-{w}"),
                            Duration::from_secs(30),
                        )
                        .await?
                    {
                        glia_backends::Opening::Opened(opened) => opened.lease,
                        _ => bail!("run {run_id} did not open"),
                    };
                    for (events, state, n) in commits.iter() {
                        let events: Vec<Event> = events
                            .iter()
                            .map(|e| Event {
                                run_id,
                                ..e.clone()
                            })
                            .collect();
                        let state = RunState {
                            run_id,
                            ..state.clone()
                        };
                        log.commit(&lease, &events, &state, &[]).await?;
                        steps += n;
                    }
                    if !log.release_if_idle(&lease).await?.is_empty() {
                        bail!("run {run_id} has payloads no one posted");
                    }
                    if Instant::now() >= until {
                        break;
                    }
                }
                anyhow::Ok(steps)
            })
        })
        .collect()
}

/// Single-row autocommit inserts (the same payload as [`raw_inserts`]) into
/// a new SQLite file in WAL mode with `synchronous = FULL` (as the single
/// node commits steps), from `connections` threads, each with its own
/// connection, for `duration`: rows per second. SQLite has one writer at a
/// time; more connections only contend for it.
async fn raw_sqlite_inserts(connections: usize, duration: Duration) -> Result<f64> {
    let dir = ScratchDir::new()?;
    let path = dir.db();
    {
        let conn = rusqlite::Connection::open(&path)?;
        conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
        conn.execute_batch("CREATE TABLE raw_inserts (id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, payload TEXT NOT NULL)")?;
    }
    let payload = json!({ "type": "tool.result", "data": { "call_id": "call_1", "content": "{\"order_id\":\"A1\",\"status\":\"shipped\"}", "duration_ms": 0 } }).to_string();
    let started = Instant::now();
    let until = started + duration;
    let tasks: Vec<_> = (0..connections.max(1))
        .map(|_| {
            let (path, payload) = (path.clone(), payload.clone());
            tokio::task::spawn_blocking(move || {
                let conn = rusqlite::Connection::open(&path)?;
                conn.execute_batch("PRAGMA synchronous = FULL")?;
                conn.busy_timeout(Duration::from_secs(30))?;
                let mut insert =
                    conn.prepare("INSERT INTO raw_inserts (run_id, payload) VALUES (?1, ?2)")?;
                let mut n = 0u64;
                while Instant::now() < until {
                    insert.execute(rusqlite::params![Uuid::now_v7().to_string(), payload])?;
                    n += 1;
                }
                anyhow::Ok(n)
            })
        })
        .collect();
    rate(tasks, started).await
}

// ----- growth ------------------------------------------------------------------

/// `growth`: the commit of each step of one long run.
#[derive(Debug, Serialize)]
pub struct GrowthResult {
    /// Tool turns of the run.
    pub turns: usize,
    /// Median over the turns around turn 10 of a turn's commit latency (its
    /// two steps' commits), ms.
    pub early_commit_ms: f64,
    /// The same over the last turns, ms.
    pub late_commit_ms: f64,
    /// late ÷ early.
    pub latency_ratio: f64,
    /// Median WAL bytes of a turn's commits, around turn 10.
    pub early_wal_bytes: f64,
    /// The same over the last turns.
    pub late_wal_bytes: f64,
    /// Mean WAL bytes of a turn's commits around turn 10 (state checkpoints,
    /// every 64 events, included).
    pub early_wal_bytes_mean: f64,
    /// The same over the last turns.
    pub late_wal_bytes_mean: f64,
    /// Mean JSON bytes of the events a turn's commits wrote, around turn 10.
    pub early_event_bytes: f64,
    /// The same over the last turns.
    pub late_event_bytes: f64,
    /// Commits measured.
    pub commits: usize,
}

/// Commits each step to Postgres under a lease, timing the commit and
/// reading the WAL position around it.
struct MeasuringSink {
    log: glia_backends::postgres::PgLog,
    lease: glia_backends::Lease,
    sql: tokio_postgres::Client,
    buffer: Vec<Event>,
    /// (model calls so far, commit ms, WAL bytes, event JSON bytes).
    samples: Vec<(u64, f64, f64, f64)>,
}

/// The server's WAL position, in bytes.
async fn wal_position(sql: &tokio_postgres::Client) -> Result<i64, SinkError> {
    let row = sql
        .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint", &[])
        .await
        .map_err(|e| SinkError(e.to_string()))?;
    Ok(row.get(0))
}

#[async_trait]
impl EventSink for MeasuringSink {
    async fn record(&mut self, event: &Event) -> Result<(), SinkError> {
        self.buffer.push(event.clone());
        Ok(())
    }

    async fn commit(&mut self, state: &RunState) -> Result<(), SinkError> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let before = wal_position(&self.sql).await?;
        let started = Instant::now();
        self.log
            .commit(&self.lease, &self.buffer, state, &[])
            .await
            .map_err(|e| SinkError(e.to_string()))?;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        let after = wal_position(&self.sql).await?;
        let json: usize = self
            .buffer
            .iter()
            .map(|e| serde_json::to_string(&e.kind).map_or(0, |s| s.len()))
            .sum();
        self.samples
            .push((state.usage.turns, ms, (after - before) as f64, json as f64));
        self.buffer.clear();
        Ok(())
    }
}

async fn growth(args: &GrowthArgs) -> Result<GrowthResult> {
    let db = private_db(&args.urls.database_url).await?;
    let log = db.log().await?;
    let mut script: Vec<ScriptedTurn> = (0..args.turns)
        .map(|i| ScriptedTurn::call("calculator", json!({ "op": "add", "a": i, "b": 1 })))
        .collect();
    script.push(ScriptedTurn::text("done"));
    let agent =
        Agent::new(Arc::new(ScriptedProvider::new(script))).with_tools(crate::demo::tools());
    let config = RunConfig {
        max_model_calls_per_turn: u32::try_from(args.turns + 2).unwrap_or(u32::MAX),
        ..RunConfig::default()
    };
    let run_id = Uuid::now_v7();
    let start = Event {
        run_id,
        seq: 1,
        at: chrono::Utc::now(),
        kind: EventKind::SessionStart {
            redactions: Vec::new(),
            goal: "a long run".into(),
            config,
        },
    };
    log.create_run(NewRun {
        tenant: "bench".into(),
        idempotency_key: None,
        batch_id: None,
        start,
        tags: Vec::new(),
        metadata: Default::default(),
        custom_id: None,
        parent_run_id: None,
        parent_call_id: None,
        depth: 0,
    })
    .await?;
    let lease = log
        .acquire(run_id, "bench", Duration::from_secs(3600))
        .await?;
    let mut state = log.load(run_id).await?;
    let sql = db.sql().await?;
    let mut sink = MeasuringSink {
        log,
        lease,
        sql,
        buffer: Vec::new(),
        samples: Vec::new(),
    };
    agent.advance(&mut state, None, &mut sink).await?;
    if !matches!(state.outcome, Some(glia_proto::Outcome::Succeeded { .. })) {
        bail!("the long run did not succeed: {:?}", state.outcome);
    }
    // A turn is two steps (a model call, a tool execution), each committed:
    // sum each turn's commits, then compare turns.
    let mut per_turn: std::collections::BTreeMap<u64, (f64, f64, f64)> =
        std::collections::BTreeMap::new();
    for (turn, ms, wal, json) in &sink.samples {
        let t = per_turn.entry(*turn).or_default();
        t.0 += ms;
        t.1 += wal;
        t.2 += json;
    }
    let window = |from: u64, to: u64| -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let picked: Vec<&(f64, f64, f64)> = per_turn.range(from..to).map(|(_, v)| v).collect();
        (
            picked.iter().map(|s| s.0).collect(),
            picked.iter().map(|s| s.1).collect(),
            picked.iter().map(|s| s.2).collect(),
        )
    };
    let half = (args.window / 2) as u64;
    let turns = args.turns as u64;
    let (early_ms, early_wal, early_json) = window(10u64.saturating_sub(half), 10 + half);
    let (late_ms, late_wal, late_json) =
        window(turns.saturating_sub(args.window as u64), turns + 1);
    let mean = |v: &[f64]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let (early_wal_mean, late_wal_mean) = (mean(&early_wal), mean(&late_wal));
    let (early, late) = (median(early_ms), median(late_ms));
    Ok(GrowthResult {
        turns: args.turns,
        early_commit_ms: early,
        late_commit_ms: late,
        latency_ratio: if early > 0.0 { late / early } else { 0.0 },
        early_wal_bytes: median(early_wal),
        late_wal_bytes: median(late_wal),
        early_wal_bytes_mean: early_wal_mean,
        late_wal_bytes_mean: late_wal_mean,
        early_event_bytes: mean(&early_json),
        late_event_bytes: mean(&late_json),
        commits: sink.samples.len(),
    })
}

// ----- memory ------------------------------------------------------------------

/// `memory`: a worker process's resident set.
#[derive(Debug, Serialize)]
pub struct MemoryResult {
    /// Runs submitted (each made one tool call).
    pub runs: usize,
    /// Runs the worker advanced at once.
    pub concurrency: usize,
    /// Bytes of each run's MCP tool result (`--mcp-result-bytes`); 0 for
    /// the demo tool.
    pub result_bytes: u64,
    /// Resident set before any run, MiB.
    pub idle_rss_mib: f64,
    /// Largest resident set sampled (every 20 ms) while runs were in flight, MiB.
    pub peak_rss_mib: f64,
    /// The kernel's high-water mark of the resident set (`VmHWM`) when
    /// every run was done, MiB.
    pub hwm_mib: f64,
    /// Resident set once every run was done (after 2 s of quiet), MiB.
    pub after_rss_mib: f64,
    /// after − idle: what serving the runs left behind, MiB.
    pub growth_mib: f64,
    /// (peak − idle) ÷ runs in flight at once, KiB.
    pub per_run_kib: f64,
}

/// A `/proc/PID/status` figure in KiB (`VmRSS`, `VmHWM`).
fn status_kib(pid: u32, key: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn rss_kib(pid: u32) -> Option<f64> {
    status_kib(pid, "VmRSS")
}

/// The worker's script and config for the memory benchmark, and the
/// catalogue file it needs (written into `dir`): one call of the demo
/// tool, or of the `big` tool of `odd-mcp` answering `bytes` bytes.
fn memory_workload(
    args: &MemoryArgs,
    dir: &std::path::Path,
) -> Result<(Vec<ScriptedTurn>, RunConfig, Option<std::path::PathBuf>)> {
    let config = RunConfig {
        model: "script:slow".into(),
        ..RunConfig::default()
    };
    let (Some(bytes), Some(odd_mcp)) = (args.mcp_result_bytes, &args.odd_mcp) else {
        let script = vec![
            ScriptedTurn::call("refund_order", json!({ "order_id": "A1" })),
            ScriptedTurn::text("done"),
        ];
        return Ok((script, config, None));
    };
    let odd_mcp = odd_mcp
        .canonicalize()
        .with_context(|| format!("the odd-mcp binary {}", odd_mcp.display()))?;
    let state = dir.join("odd-mcp");
    std::fs::create_dir_all(&state)?;
    let catalogue = dir.join("catalogue.toml");
    std::fs::write(
        &catalogue,
        format!(
            "[mcp_servers.odd]\ntransport = \"stdio\"\ncommand = {:?}\nargs = [\"stdio\", {:?}]\n",
            odd_mcp.display().to_string(),
            state.display().to_string()
        ),
    )?;
    let script = vec![
        ScriptedTurn::call("big", json!({ "bytes": bytes })),
        ScriptedTurn::text("done"),
    ];
    let config = RunConfig {
        tools: Some(Vec::new()),
        mcp: vec![glia_proto::McpToolSource {
            server: "odd".into(),
            allow: vec!["big".into()],
        }],
        tool_policy: [(
            "big".to_owned(),
            glia_proto::ToolPolicy {
                timeout_ms: Some(120_000),
                ..glia_proto::ToolPolicy::default()
            },
        )]
        .into(),
        ..config
    };
    Ok((script, config, Some(catalogue)))
}

async fn memory(args: &MemoryArgs) -> Result<MemoryResult> {
    // The worker process serves scripts from a directory of its own.
    let dir = std::env::temp_dir().join(format!("glia-bench-{}", Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir)?;
    let (script, config, catalogue) = memory_workload(args, &dir)?;
    let concurrency = args.concurrency.unwrap_or(args.runs).max(1);
    std::fs::write(dir.join("slow.json"), serde_json::to_vec(&script)?)?;
    let mut library = ScriptLibrary::default();
    library.insert("slow", script);
    // The dispatcher in this process, no workers of its own.
    let fleet = BenchFleet::start(&args.urls, Arc::new(Agent::new(Arc::new(library))), 0, 1).await;
    let fleet = fleet?;
    let _ = fleet.stop.send(false);
    let BenchStore::Fleet { db, queue_name, .. } = &fleet.store else {
        bail!("the memory benchmark runs on the fleet")
    };
    let db_url = match args.urls.database_url.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{}", db.name),
        None => bail!(
            "the database URL {} names no database",
            args.urls.database_url
        ),
    };
    let mut worker = std::process::Command::new(std::env::current_exe()?);
    worker.args([
        "worker",
        "--scripts",
        dir.to_str().unwrap_or_default(),
        "--concurrency",
        &concurrency.to_string(),
        "--id",
        "bench-memory",
    ]);
    if let Some(catalogue) = &catalogue {
        worker.arg("--catalogue").arg(catalogue);
    }
    let mut child = worker
        .env("GLIA_DATABASE_URL", &db_url)
        .env("GLIA_AMQP_URL", &args.urls.amqp_url)
        .env("GLIA_REDIS_URL", &args.urls.redis_url)
        .env("GLIA_QUEUE", queue_name)
        .env("GLIA_REDIS_PREFIX", queue_name)
        .env("GLIA_DEMO_TOOL_DELAY_MS", args.tool_ms.to_string())
        .env("GLIA_DEMO_EFFECTS", dir.join("effects.log"))
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .spawn()
        .context("starting a worker process")?;
    let result = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let pid = child.id();
        let idle = rss_kib(pid).context("reading the worker's resident set")?;
        let client = crate::client::http_client()?;
        for i in 0..args.runs {
            let req = fleet
                .server
                .request(&client, Method::POST, "/v1/runs")
                .json(&json!({ "goal": format!("memory run {i}"), "config": config }));
            checked(req.send().await?).await?;
        }
        let mut peak = idle;
        let bound = Duration::from_secs(120).max(Duration::from_secs(3) * args.runs as u32);
        let deadline = Instant::now() + bound;
        loop {
            peak = peak.max(rss_kib(pid).unwrap_or(0.0));
            let done = fleet
                .count("SELECT count(*) FROM runs WHERE status = 'done'")
                .await?;
            if done as usize >= args.runs {
                break;
            }
            if Instant::now() > deadline {
                bail!("{done} of {} runs done after {bound:?}", args.runs);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let failed = fleet
            .count("SELECT count(*) FROM runs WHERE status = 'done' AND outcome->>'kind' IS DISTINCT FROM 'succeeded'")
            .await?;
        if failed > 0 {
            bail!("{failed} of {} runs did not succeed", args.runs);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = rss_kib(pid).context("reading the worker's resident set")?;
        let hwm = status_kib(pid, "VmHWM").context("reading the worker's high-water mark")?;
        anyhow::Ok(MemoryResult {
            runs: args.runs,
            concurrency,
            result_bytes: args.mcp_result_bytes.unwrap_or(0),
            idle_rss_mib: idle / 1024.0,
            peak_rss_mib: peak / 1024.0,
            hwm_mib: hwm / 1024.0,
            after_rss_mib: after / 1024.0,
            growth_mib: (after - idle) / 1024.0,
            per_run_kib: (peak - idle) / concurrency.min(args.runs).max(1) as f64,
        })
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    fleet.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

// ----- approvals -----------------------------------------------------------------

/// Latencies of one decision path, ms.
#[derive(Debug, Clone, Serialize)]
pub struct PathLatency {
    /// Decisions measured.
    pub decisions: usize,
    /// Median decision → `approval.resolved`, ms.
    pub p50_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Median time the decision request itself took (answer received), ms.
    pub request_p50_ms: f64,
}

/// `approvals`: the inbox path beside the API path.
#[derive(Debug, Serialize)]
pub struct ApprovalsResult {
    /// Decisions posted through the inbox's HTML form.
    pub inbox: PathLatency,
    /// Decisions posted through `POST /v1/runs/{id}/approvals/{call_id}`.
    pub api: PathLatency,
    /// Both paths, measured inside Postgres as `glia bench steps` does:
    /// from the start of the decision's transaction (its inbox row's
    /// `created_at`) to the worker's `approval.resolved` (its `at`), without
    /// the HTTP request around it; median, ms.
    pub in_db_p50_ms: f64,
    /// The same, 99th percentile, ms.
    pub in_db_p99_ms: f64,
}

const BENCH_TOKEN: &str = "bench-approver:bench:submit,approve:bench-approver";

async fn approvals(args: &ApprovalsArgs) -> Result<ApprovalsResult> {
    let mut library = ScriptLibrary::default();
    library.insert("bench", step_script(1));
    let agent = Arc::new(Agent::new(Arc::new(library)).with_tools(crate::demo::tools()));
    let fleet = BenchFleet::start_with(
        &args.urls,
        agent,
        1,
        16,
        Some(BENCH_TOKEN),
        Variant::Group,
        16,
        1,
    )
    .await?;
    let result = approvals_round(args, &fleet).await;
    fleet.stop().await;
    result
}

/// Sign in to the inbox: the session cookie and the form token.
async fn inbox_session(server: &Server) -> Result<(String, String)> {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let token = server.token.clone().unwrap_or_default();
    let resp = client
        .post(format!("{}/inbox/login", server.server))
        .form(&[("token", token.as_str())])
        .send()
        .await?;
    let cookie = resp
        .headers()
        .get(reqwest::header::SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::to_owned)
        .context("the inbox set no session cookie")?;
    let page = client
        .get(format!("{}/inbox", server.server))
        .header(reqwest::header::COOKIE, &cookie)
        .send()
        .await?
        .text()
        .await?;
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .context("no form token on the queue page")?
        .to_owned();
    Ok((cookie, csrf))
}

async fn approvals_round(args: &ApprovalsArgs, fleet: &BenchFleet) -> Result<ApprovalsResult> {
    let client = crate::client::http_client()?;
    let form_client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let (cookie, csrf) = inbox_session(&fleet.server).await?;
    let BenchStore::Fleet { sql, .. } = &fleet.store else {
        bail!("the approvals benchmark runs on the fleet")
    };
    let config = step_config("script:bench", 1);
    let n = args.decisions.max(1) * 2;
    let mut runs = Vec::with_capacity(n);
    for i in 0..n {
        let req = fleet
            .server
            .request(&client, Method::POST, "/v1/runs")
            .json(&json!({ "goal": format!("approval bench {i}"), "config": config }));
        runs.push(
            checked(req.send().await?).await?["run_id"]
                .as_str()
                .context("run id")?
                .to_owned(),
        );
    }
    // Wait until every run waits for its approval.
    let deadline = Instant::now() + Duration::from_secs(300);
    let pending = loop {
        let page = checked(
            fleet
                .server
                .request(&client, Method::GET, "/v1/approvals?limit=1000")
                .send()
                .await?,
        )
        .await?;
        let rows = page["approvals"].as_array().cloned().unwrap_or_default();
        if rows.len() >= n {
            break rows;
        }
        if Instant::now() > deadline {
            bail!("only {} of {n} runs reached their approval", rows.len());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (mut inbox, mut api, mut inbox_req, mut api_req) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, row) in pending.iter().enumerate() {
        let (run_id, call_id, hash) = (
            row["run_id"].as_str().unwrap_or(""),
            row["call_id"].as_str().unwrap_or(""),
            row["args_hash"].as_str().unwrap_or(""),
        );
        let sent = chrono::Utc::now();
        let t = Instant::now();
        let via_inbox = i % 2 == 0;
        if via_inbox {
            let resp = form_client
                .post(format!(
                    "{}/inbox/runs/{run_id}/calls/{call_id}/decide",
                    fleet.server.server
                ))
                .header(reqwest::header::COOKIE, &cookie)
                .form(&[
                    ("csrf", csrf.as_str()),
                    ("decision", "approve"),
                    ("args_hash", hash),
                ])
                .send()
                .await?;
            if resp.status() != reqwest::StatusCode::SEE_OTHER {
                bail!(
                    "the inbox refused the decision: {} {}",
                    resp.status(),
                    resp.text().await.unwrap_or_default()
                );
            }
        } else {
            let req = fleet
                .server
                .request(
                    &client,
                    Method::POST,
                    &format!("/v1/runs/{run_id}/approvals/{call_id}"),
                )
                .json(&json!({ "decision": "approve", "args_hash": hash }));
            checked(req.send().await?).await?;
        }
        let request_ms = t.elapsed().as_secs_f64() * 1000.0;
        // Wait for the worker's commit of `approval.resolved`, then take its time.
        let run: Uuid = run_id.parse()?;
        let at: chrono::DateTime<chrono::Utc> = loop {
            let row = sql
                .query_opt(
                    "SELECT at FROM events WHERE run_id = $1 AND kind = 'approval.resolved'",
                    &[&run],
                )
                .await?;
            if let Some(row) = row {
                break row.get(0);
            }
            if t.elapsed() > Duration::from_secs(60) {
                bail!("run {run_id} did not record its decision within a minute");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        let ms = (at - sent).num_microseconds().unwrap_or(0) as f64 / 1000.0;
        if via_inbox {
            inbox.push(ms);
            inbox_req.push(request_ms);
        } else {
            api.push(ms);
            api_req.push(request_ms);
        }
    }
    let summarize = |mut v: Vec<f64>, req: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        PathLatency {
            decisions: v.len(),
            p50_ms: percentile(&v, 0.5).unwrap_or(0.0),
            p90_ms: percentile(&v, 0.9).unwrap_or(0.0),
            p99_ms: percentile(&v, 0.99).unwrap_or(0.0),
            request_p50_ms: median(req),
        }
    };
    let mut in_db = fleet.approval_latencies().await?;
    in_db.sort_by(f64::total_cmp);
    Ok(ApprovalsResult {
        inbox: summarize(inbox, inbox_req),
        api: summarize(api, api_req),
        in_db_p50_ms: percentile(&in_db, 0.5).unwrap_or(0.0),
        in_db_p99_ms: percentile(&in_db, 0.99).unwrap_or(0.0),
    })
}

/// A Postgres database of the bench's own (`glia_bench_<uuid>`) on the
/// server an admin URL names, dropped with its connections when this is.
struct ScratchDb {
    /// Database name.
    name: String,
    admin: tokio_postgres::Config,
}

impl ScratchDb {
    /// Create it on the server `admin` connects to (whose database is only
    /// used to create and drop this one).
    async fn on(admin: tokio_postgres::Config) -> Result<ScratchDb> {
        let name = format!("glia_bench_{}", Uuid::now_v7().simple());
        connect(&admin)
            .await?
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .with_context(|| format!("creating the database {name}"))?;
        Ok(ScratchDb { name, admin })
    }

    fn config(&self) -> tokio_postgres::Config {
        let mut config = self.admin.clone();
        config.dbname(&self.name);
        config
    }

    /// A [`glia_backends::postgres::PgLog`] on it, default options.
    async fn log(&self) -> Result<glia_backends::postgres::PgLog> {
        self.log_with(glia_backends::postgres::PgOptions::default())
            .await
    }

    /// A [`glia_backends::postgres::PgLog`] on it with `options`.
    async fn log_with(
        &self,
        options: glia_backends::postgres::PgOptions,
    ) -> Result<glia_backends::postgres::PgLog> {
        Ok(glia_backends::postgres::PgLog::connect_with(self.config(), options).await?)
    }

    /// A plain connection.
    async fn sql(&self) -> Result<tokio_postgres::Client> {
        connect(&self.config()).await
    }
}

impl Drop for ScratchDb {
    fn drop(&mut self) {
        let (name, admin) = (self.name.clone(), self.admin.clone());
        // Drop may run inside a runtime: use a thread with its own.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async move {
                let client = connect(&admin).await.ok()?;
                client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
                    .ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            errln!("could not drop the bench database {}", self.name);
        }
    }
}

/// A plain connection to `config`, its connection task spawned.
async fn connect(config: &tokio_postgres::Config) -> Result<tokio_postgres::Client> {
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .context("connecting to Postgres")?;
    tokio::spawn(connection);
    Ok(client)
}

/// A directory of the bench's own (`glia-bench-<uuid>` in the temporary
/// directory) for a single node's SQLite file, removed with everything in it
/// when dropped.
struct ScratchDir {
    path: std::path::PathBuf,
}

impl ScratchDir {
    fn new() -> Result<ScratchDir> {
        let path = std::env::temp_dir().join(format!("glia-bench-{}", Uuid::now_v7().simple()));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(ScratchDir { path })
    }

    /// `DIR/node.db`: the single node's file.
    fn db(&self) -> std::path::PathBuf {
        self.path.join("node.db")
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

// ----- listing -------------------------------------------------------------------

/// `glia bench listing`.
#[derive(Args)]
pub struct ListingArgs {
    #[command(flatten)]
    urls: Urls,
    /// Runs in the database (half of them the measured tenant's).
    #[arg(long, default_value_t = 100_000)]
    runs: u64,
    /// Requests per query; medians are reported.
    #[arg(long, default_value_t = 20)]
    repeat: usize,
    /// Page size of every request.
    #[arg(long, default_value_t = 50)]
    limit: usize,
}

/// The time of one `GET /v1/runs` query, over `--repeat` requests.
#[derive(Debug, Clone, Serialize)]
pub struct QueryTime {
    /// What it asks.
    pub query: String,
    /// Runs on the (first) page.
    pub runs: usize,
    /// Median request time (HTTP round trip to the dispatcher in this
    /// process: its query, JSON and the client), ms.
    pub p50_ms: f64,
    /// 90th percentile, ms.
    pub p90_ms: f64,
}

/// `listing`: `GET /v1/runs` on a big table.
#[derive(Debug, Serialize)]
pub struct ListingResult {
    /// Runs in the database.
    pub runs: u64,
    /// The measured tenant's runs.
    pub tenant_runs: u64,
    /// Seconds to insert the runs (one `INSERT … SELECT generate_series`)
    /// and analyse the table.
    pub insert_secs: f64,
    /// Whether the error search has its trigram index (pg_trgm present).
    pub trigram_index: bool,
    /// Each query.
    pub queries: Vec<QueryTime>,
}

/// The measured tenant of `glia bench listing`.
const LISTING_TENANT: &str = "bench-big";

/// Run `i` of `n` (from 1) as SQL over `generate_series(1, n) AS i`: ids
/// UUIDv7-shaped in creation order (one every 30 s, the newest now), half
/// of them `bench-big`'s and the rest spread over 50 tenants; 70% done (one
/// in seven failed with one of a few error texts, one in thirteen
/// cancelled), 20% parked at an approval, 10% runnable; four agents with
/// five versions each and a quarter without; two or three tags; two
/// metadata pairs; costs and tokens spread.
const FILL_RUNS: &str = "
WITH s AS (
  SELECT i, now() - ($1::bigint - i) * interval '30 seconds' AS at,
         md5(i::text) AS h
  FROM generate_series(1, $1::bigint) AS i
), r AS (
  SELECT i, at, h,
    CASE WHEN i % 2 = 0 THEN 'bench-big' ELSE 'bench-' || (i % 50) END AS tenant,
    CASE WHEN i % 10 < 7 THEN 'done' WHEN i % 10 < 9 THEN 'parked' ELSE 'runnable' END AS status,
    CASE WHEN i % 10 >= 7 THEN NULL WHEN i % 7 = 0 THEN 'failed' WHEN i % 13 = 0 THEN 'cancelled' ELSE 'succeeded' END AS outcome
  FROM s
)
INSERT INTO runs (id, tenant, goal, status, phase, pull_point, outcome, head_seq, created_at, updated_at,
                  agent, agent_version, tags, metadata, turns, tool_calls, active_ms,
                  input_tokens, output_tokens, cost_usd_micros, steps, error, ended_at)
SELECT
  (lpad(to_hex((extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
  tenant,
  'Triage ticket ' || i || ': the customer asks about order ' || (i * 7 % 100000),
  status,
  CASE status WHEN 'done' THEN 'done' WHEN 'parked' THEN 'awaiting_tool' ELSE 'executing' END,
  CASE WHEN status = 'parked' THEN '{\"kind\": \"awaiting_approval\", \"call_ids\": [\"c1\"]}'::json END,
  CASE outcome
    WHEN 'succeeded' THEN '{\"kind\": \"succeeded\", \"answer\": \"Done.\", \"output\": null}'::json
    WHEN 'failed' THEN json_build_object('kind', 'failed', 'error', CASE WHEN i % 29 = 0 THEN 'model quota exceeded for tenant' ELSE 'tool crm_lookup failed: upstream timeout after ' || (i % 50) || ' s' END)
    WHEN 'cancelled' THEN json_build_object('kind', 'cancelled', 'reason', 'cancelled by operator ' || (i % 5))
  END,
  12,
  at,
  at + interval '20 seconds',
  CASE i % 4 WHEN 0 THEN 'triage' WHEN 1 THEN 'support' WHEN 2 THEN 'billing' END,
  CASE WHEN i % 4 < 3 THEN 1 + (i / 4) % 5 END,
  CASE WHEN i % 97 = 0 THEN ARRAY['vip', 'env-' || (i % 3), 'team-' || (i % 17)] ELSE ARRAY['env-' || (i % 3), 'team-' || (i % 17)] END,
  jsonb_build_object('customer', 'c-' || (i % 1000), 'channel', CASE i % 3 WHEN 0 THEN 'email' WHEN 1 THEN 'chat' ELSE 'phone' END),
  1 + i % 9, i % 7, 1000 + i % 60000,
  (i * 7919) % 50000, (i * 104729) % 5000, (i * 7919) % 500000, 1 + i % 4,
  CASE outcome
    WHEN 'failed' THEN CASE WHEN i % 29 = 0 THEN 'model quota exceeded for tenant' ELSE 'tool crm_lookup failed: upstream timeout after ' || (i % 50) || ' s' END
    WHEN 'cancelled' THEN 'cancelled by operator ' || (i % 5)
  END,
  CASE WHEN status = 'done' THEN at + interval '20 seconds' END
FROM r";

async fn listing(args: &ListingArgs) -> Result<ListingResult> {
    let admin: tokio_postgres::Config = args.urls.database_url.parse().context("--database-url")?;
    let db = ScratchDb::on(admin).await?;
    let log = db.log().await?;
    let sql = db.sql().await?;
    let started = Instant::now();
    let n = i64::try_from(args.runs).context("--runs")?;
    sql.execute(FILL_RUNS, &[&n])
        .await
        .context("inserting the runs")?;
    sql.batch_execute("ANALYZE runs").await?;
    let insert_secs = started.elapsed().as_secs_f64();
    let trigram_index: bool = sql
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_indexes WHERE indexname = 'runs_error_trgm')",
            &[],
        )
        .await?
        .get(0);
    let tenant_runs: i64 = sql
        .query_one(
            "SELECT count(*) FROM runs WHERE tenant = $1",
            &[&LISTING_TENANT],
        )
        .await?
        .get(0);
    // A cursor deep in the tenant's runs: after its 40,000th newest (or
    // its middle, with fewer).
    let depth = (tenant_runs * 4 / 5).min(40_000);
    let deep: Uuid = sql
        .query_one(
            "SELECT id FROM runs WHERE tenant = $1 ORDER BY id DESC OFFSET $2 LIMIT 1",
            &[&LISTING_TENANT, &(depth.max(1) - 1)],
        )
        .await?
        .get(0);
    let day: chrono::DateTime<chrono::Utc> = sql
        .query_one(
            "SELECT created_at FROM runs WHERE tenant = $1 ORDER BY id DESC OFFSET $2 LIMIT 1",
            &[&LISTING_TENANT, &(tenant_runs / 2)],
        )
        .await?
        .get(0);
    let (shutdown_tx, shutdown) = watch::channel(false);
    let server = serve(
        Arc::new(log),
        Arc::new(glia_backends::memory::MemoryQueue::default()),
        Arc::new(glia_backends::memory::MemoryLedger::default()),
        Some(&format!("bench-lister:{LISTING_TENANT}:submit")),
        shutdown,
    )
    .await?;
    let cursor = glia_dispatcher::model::run_cursor::encode(deep);
    let since =
        (day - chrono::Duration::hours(12)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let until =
        (day + chrono::Duration::hours(12)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let queries = [
        ("no filter".to_owned(), String::new()),
        (
            "status=done&outcome=failed".to_owned(),
            "status=done&outcome=failed".to_owned(),
        ),
        (
            "agent=triage&version=3".to_owned(),
            "agent=triage&version=3".to_owned(),
        ),
        ("tag=vip (1 run in 97)".to_owned(), "tag=vip".to_owned()),
        (
            "meta=customer=c-42".to_owned(),
            format!("meta={}", enc("customer=c-42")),
        ),
        (
            "error=quota (1 run in 29 of the failed)".to_owned(),
            "error=quota".to_owned(),
        ),
        (
            "since..until (one day)".to_owned(),
            format!("since={}&until={}", enc(&since), enc(&until)),
        ),
        (
            format!("cursor after run {depth}"),
            format!("cursor={cursor}"),
        ),
        (
            "outcome=failed&error=timeout&cursor deep".to_owned(),
            format!("outcome=failed&error=timeout&cursor={cursor}"),
        ),
    ];
    let client = crate::client::http_client()?;
    let mut times = Vec::new();
    for (what, query) in queries {
        let path = format!("/v1/runs?limit={}&{query}", args.limit);
        let mut ms = Vec::with_capacity(args.repeat);
        let mut runs = 0;
        // One request first, not counted: the statement is prepared then.
        for round in 0..=args.repeat {
            let t = Instant::now();
            let page = server.get(&client, &path).await?;
            if round > 0 {
                ms.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            runs = page["runs"].as_array().map_or(0, Vec::len);
        }
        ms.sort_by(f64::total_cmp);
        times.push(QueryTime {
            query: what,
            runs,
            p50_ms: percentile(&ms, 0.5).unwrap_or(0.0),
            p90_ms: percentile(&ms, 0.9).unwrap_or(0.0),
        });
    }
    let _ = shutdown_tx.send(true);
    Ok(ListingResult {
        runs: args.runs,
        tenant_runs: u64::try_from(tenant_runs).unwrap_or(0),
        insert_secs,
        trigram_index,
        queries: times,
    })
}
