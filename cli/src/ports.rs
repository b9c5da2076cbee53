//! The three ports of a fleet process and how they are reached: the
//! service URLs (`--database-url`, `--amqp-url`, `--redis-url`), connecting
//! to each while it is down ([`wait_for`], retried with backoff and reported
//! in `/readyz`), the single node's SQLite file, the in-memory twins.
//! Shared by `serve` (which runs the services), `observe` (whose `/readyz`
//! checks them) and `provider` (whose fleet-wide rate limiter waits for
//! Redis the same way).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use backon::{BackoffBuilder, ExponentialBuilder};
use clap::Args;
use glia_backends::memory::{MemoryLedger, MemoryLog, MemoryQueue};
use glia_backends::postgres::{PgLog, PgOptions};
use glia_backends::rabbitmq::{QueueOptions, RabbitQueue};
use glia_backends::redis_ledger::RedisLedger;
use glia_backends::sqlite::{SqliteLog, SqliteOptions};
use glia_backends::{EVENT_LOG, EventLog, JOB_QUEUE, JobQueue, LEDGER, Ledger};
use glia_dispatcher::Startup;
use glia_worker::consumer::{Worker, WorkerOptions};
use tokio::sync::watch;
use tracing::{info, warn};

/// Service URLs.
#[derive(Args, Clone)]
pub struct Urls {
    /// Postgres URL.
    #[arg(
        long,
        env = "GLIA_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    pub database_url: String,
    /// RabbitMQ URL.
    #[arg(
        long,
        env = "GLIA_AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub amqp_url: String,
    /// Redis URL.
    #[arg(long, env = "GLIA_REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// Name of the run-job queue (its queue of resumes is `NAME.resume`, its
    /// dead-letter queue `NAME.dlq`).
    #[arg(long, env = "GLIA_QUEUE", default_value = "glia.jobs")]
    pub queue: String,
    /// Prefix of every Redis key.
    #[arg(long, env = "GLIA_REDIS_PREFIX", default_value = "glia")]
    pub redis_prefix: String,
    /// Group commit on Postgres: most groups of step commits written at once,
    /// each on its own pooled connection (see `PgOptions::group_lanes`).
    #[arg(long, env = "GLIA_GROUP_LANES", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    pub group_lanes: u16,
}

/// The three ports (cheap to clone: shared handles).
#[derive(Clone)]
pub struct Ports {
    pub log: Arc<dyn EventLog>,
    pub queue: Arc<dyn JobQueue>,
    pub ledger: Arc<dyn Ledger>,
    /// Webhook subscriptions and deliveries (Postgres only).
    pub webhooks: Option<Arc<dyn glia_backends::webhooks::WebhookStore>>,
    /// Batches and their items (Postgres, the single node's SQLite file,
    /// and the in-memory twin of `glia dev`).
    pub batches: Option<Arc<dyn glia_backends::batches::BatchStore>>,
    /// Schedules (Postgres, the single node's file, the in-memory twin).
    pub schedules: Option<Arc<dyn glia_backends::schedules::ScheduleStore>>,
    /// Datasets, experiments and grades (Postgres, the single node's file,
    /// the in-memory twin).
    pub evals: Option<Arc<dyn glia_backends::evals::EvalStore>>,
    /// The Postgres log, for what only it offers: resume hints
    /// (`PgLog::resume_hints`) for a worker.
    pub postgres: Option<PgLog>,
}

impl Ports {
    /// Connect to the real services (migrations run on connect), waiting for
    /// each as long as it takes: the three connect concurrently, each
    /// retried with backoff ([`wait_for`]) while it fails, each failure
    /// logged and kept in `startup` (`connecting: <error>`, then `ok`) for
    /// `/readyz`. `None` when `shutdown` turned true first.
    ///
    /// Errors: a URL that cannot be parsed (waiting would not help).
    pub async fn connect_waiting(
        urls: &Urls,
        startup: &Startup,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<Option<Ports>> {
        urls.check()?;
        let connect = async {
            let (log, queue, ledger) = tokio::join!(
                wait_for(EVENT_LOG, "Postgres", startup, || PgLog::connect(
                    &urls.database_url,
                    PgOptions {
                        group_lanes: urls.group_lanes.into(),
                        ..PgOptions::default()
                    }
                )),
                wait_for(JOB_QUEUE, "RabbitMQ", startup, || RabbitQueue::connect(
                    &urls.amqp_url,
                    QueueOptions::new(urls.queue.clone())
                )),
                wait_for(LEDGER, "Redis", startup, || RedisLedger::connect(
                    &urls.redis_url,
                    &urls.redis_prefix
                )),
            );
            let postgres = Some(log.clone());
            let log = Arc::new(log);
            Ports {
                log: log.clone(),
                queue: Arc::new(queue),
                ledger: Arc::new(ledger),
                webhooks: Some(log.clone()),
                batches: Some(log.clone()),
                schedules: Some(log.clone()),
                evals: Some(log),
                postgres,
            }
        };
        tokio::select! {
            ports = connect => Ok(Some(ports)),
            _ = shutdown.wait_for(|s| *s) => Ok(None),
        }
    }

    /// The single node's store: all three ports on the SQLite file at
    /// `path` (created if missing; one process at a time).
    pub async fn sqlite(path: &Path) -> Result<Ports> {
        let log = SqliteLog::open(path, SqliteOptions::default())
            .await
            .with_context(|| format!("opening the data file {}", path.display()))?;
        let log = Arc::new(log);
        Ok(Ports {
            queue: Arc::new(log.queue()),
            ledger: Arc::new(log.ledger()),
            log: log.clone(),
            webhooks: None,
            batches: Some(log.clone()),
            schedules: Some(log.clone()),
            evals: Some(log),
            postgres: None,
        })
    }

    /// A worker over these ports, taking resume hints
    /// (`PgLog::resume_hints`) when the log is Postgres.
    pub fn worker(&self, agent: Arc<glia_agent::Agent>, options: WorkerOptions) -> Worker {
        let hints = self
            .postgres
            .as_ref()
            .map(|pg| pg.resume_hints(&options.id));
        let worker = Worker::new(
            agent,
            self.log.clone(),
            self.queue.clone(),
            self.ledger.clone(),
            options,
        );
        match hints {
            Some(hints) => worker.with_hints(hints),
            None => worker,
        }
    }

    /// In-memory twins: nothing survives the process.
    pub fn memory() -> Ports {
        let log = Arc::new(MemoryLog::default());
        let batches = Arc::new(glia_backends::batches::MemoryBatches::new(log.clone()));
        Ports {
            log,
            queue: Arc::new(MemoryQueue::default()),
            ledger: Arc::new(MemoryLedger::default()),
            webhooks: None,
            batches: Some(batches),
            schedules: Some(Arc::new(
                glia_backends::schedules::MemorySchedules::default(),
            )),
            evals: Some(Arc::new(glia_backends::evals::MemoryEvals::default())),
            postgres: None,
        }
    }
}

impl Urls {
    /// Each URL parses and has a scheme its client speaks (`postgres`/
    /// `postgresql`, `amqp`/`amqps`, `redis`/`rediss`/`unix`/`redis+unix`).
    pub fn check(&self) -> Result<()> {
        self.database_url
            .parse::<tokio_postgres::Config>()
            .map_err(|e| anyhow::anyhow!("--database-url is not a Postgres URL: {e}"))?;
        let scheme = |flag: &str, url: &str, allowed: &[&str]| -> Result<()> {
            let parsed =
                reqwest::Url::parse(url).with_context(|| format!("{flag} is not a URL"))?;
            if !allowed.contains(&parsed.scheme()) {
                bail!(
                    "{flag} has scheme '{}'; expected one of {}",
                    parsed.scheme(),
                    allowed.join(", ")
                );
            }
            Ok(())
        };
        scheme("--amqp-url", &self.amqp_url, &["amqp", "amqps"])?;
        scheme(
            "--redis-url",
            &self.redis_url,
            &["redis", "rediss", "unix", "redis+unix"],
        )
    }
}

/// Call `connect` until it succeeds, sleeping with backoff after each
/// failure (500 ms doubling to 5 s, plus up to as much again of random
/// jitter); each failure is logged and recorded in `startup` under `name`
/// (`connecting: <error>`), `ok` once connected.
pub(crate) async fn wait_for<T, E, F, Fut>(
    name: &str,
    service: &str,
    startup: &Startup,
    mut connect: F,
) -> T
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let max = Duration::from_secs(5);
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(max)
        .with_jitter()
        .without_max_times()
        .build();
    let mut failures = 0u32;
    loop {
        match connect().await {
            Ok(t) => {
                startup.set(name, "ok");
                if failures > 0 {
                    info!(
                        dependency = name,
                        "connected to {service} after {failures} failed attempt(s)"
                    );
                }
                return t;
            }
            Err(e) => {
                failures += 1;
                let delay = delays.next().unwrap_or(max);
                startup.set(name, format!("connecting: {e}"));
                warn!(
                    dependency = name,
                    "{service} unavailable ({e}); retrying in {} ms (attempt {failures})",
                    delay.as_millis()
                );
                tokio::time::sleep(delay).await;
            }
        }
    }
}
