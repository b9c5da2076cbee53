//! The state every handler gets: [`App`] (the three ports, tokens, limits,
//! settings, metrics, wake-ups) and its [`Limits`].

use std::sync::Arc;
use std::time::Duration;

use glia_backends::{EventLog, JobQueue, Ledger};
use tokio::sync::Notify;

use crate::auth::Auth;
use crate::config::{BatchConfig, InboxConfig, Retention, WebhookConfig};
use crate::metrics::Metrics;

/// Size and pacing limits. [`Limits::default`] is what production uses.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Largest request body in bytes (default 1 MiB); larger bodies answer
    /// 413 `body_too_large`.
    pub max_body_bytes: usize,
    /// Default page size for listings (default 100).
    pub default_page: usize,
    /// Largest page size for listings (default 1,000); larger answers 400
    /// `invalid_query`.
    pub max_page: usize,
    /// Largest number of decisions in one bulk request (default 100).
    pub max_bulk: usize,
    /// How often an SSE stream polls the event log for new events (default 20 ms).
    pub stream_poll: Duration,
    /// Events read per log page by an SSE stream (default 500).
    pub stream_page: usize,
    /// How often the relay polls the outbox when nothing woke it (default 10 ms).
    pub relay_poll: Duration,
    /// Outbox jobs taken per relay pass (default 256).
    pub relay_batch: usize,
    /// Time each readiness check may take (default 2 s).
    pub ready_timeout: Duration,
    // --- issue 32: waits ---
    /// How often the waits loop ([`crate::waits::waits`]) looks for due
    /// timers, timeouts and undelivered events (default 1 s).
    pub waits_poll: Duration,
    /// How long an event posted to `POST /v1/events` is kept for waits that
    /// begin after it arrived (default 15 min; `docs/waits.md`).
    pub event_retention: Duration,
    // --- end waits ---
    /// How long an MCP `tools/call` of an agent waits for its run before it
    /// answers where the run stands (default 50 s, under the 60 s request
    /// timeout common MCP clients keep; `docs/mcp.md`).
    pub mcp_wait: Duration,
    /// The longest wait an MCP call may ask for (`_meta` `glia/wait_ms`,
    /// `_glia_wait_run`'s `wait_ms`; default 10 min).
    pub mcp_max_wait: Duration,
    /// MCP sessions one principal may hold open on this dispatcher (default
    /// 100; beyond, `initialize` answers 429 `too_many_mcp_sessions`).
    pub mcp_sessions_per_principal: usize,
    /// MCP sessions this dispatcher holds open in all (default 2000, about
    /// 150 KB each; beyond, `initialize` answers 503 `too_many_mcp_sessions`).
    pub mcp_sessions: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 1 << 20,
            default_page: 100,
            max_page: 1000,
            max_bulk: 100,
            stream_poll: Duration::from_millis(20),
            stream_page: 500,
            relay_poll: Duration::from_millis(10),
            relay_batch: 256,
            ready_timeout: Duration::from_secs(2),
            waits_poll: Duration::from_secs(1),
            event_retention: Duration::from_secs(15 * 60),
            mcp_wait: Duration::from_secs(50),
            mcp_max_wait: Duration::from_secs(600),
            mcp_sessions_per_principal: 100,
            mcp_sessions: 2000,
        }
    }
}

/// An admission check of a run's config: `Err` names the field (from the
/// config's root) and why.
pub type Admission =
    Arc<dyn Fn(&glia_proto::RunConfig) -> Result<(), glia_proto::ConfigError> + Send + Sync>;

/// Everything a handler needs: the three ports, the tokens, the limits, the
/// metrics and the relay's wake-up. Cheap to clone (all `Arc`s). Build it with
/// [`App::new`]; the fields are public for reading and for swapping limits.
#[derive(Clone)]
pub struct App {
    /// The run store (Postgres, or the in-memory twin).
    pub log: Arc<dyn EventLog>,
    /// The job queue (RabbitMQ, or the in-memory twin).
    pub queue: Arc<dyn JobQueue>,
    /// The ledger (Redis, or the in-memory twin): cancel flags, live deltas.
    pub ledger: Arc<dyn Ledger>,
    /// Bearer tokens.
    pub auth: Auth,
    /// Size and pacing limits.
    pub limits: Limits,
    /// The inbox's session key and cookie settings.
    pub inbox: Arc<InboxConfig>,
    /// Webhook store, receiver policy and public URL.
    pub webhooks: Arc<WebhookConfig>,
    /// The operator's admission check of a run's config against the fleet's
    /// catalogue (MCP servers, HTTP tool origins, providers: `glia
    /// dispatcher --catalogue`); `None` admits every valid config.
    pub admission: Option<Admission>,
    /// Batch store and admission settings.
    pub batches: Arc<BatchConfig>,
    /// Retention periods per tenant and the sweeper's pace.
    pub retention: Arc<Retention>,
    /// The schedule store (issue 32); `None`: `/v1/schedules` answers 404
    /// `not_available` and no scheduler runs.
    pub schedules: Option<Arc<dyn glia_backends::schedules::ScheduleStore>>,
    /// The eval store (issue 31); `None`: `/v1/datasets` and
    /// `/v1/experiments` answer 404 `not_available` and no experiment is tended.
    pub evals: Option<Arc<dyn glia_backends::evals::EvalStore>>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) wake: Arc<Notify>,
    pub(crate) wake_admission: Arc<Notify>,
    /// Held by each relay pass ([`relay_once`](crate::relay::relay_once)): the relay loop and the
    /// reconciler's tick never publish the same outbox rows twice.
    pub(crate) relaying: Arc<tokio::sync::Mutex<()>>,
}

impl App {
    /// An app over these ports with [`Limits::default`] and fresh [`Metrics`].
    pub fn new(
        log: Arc<dyn EventLog>,
        queue: Arc<dyn JobQueue>,
        ledger: Arc<dyn Ledger>,
        auth: Auth,
    ) -> App {
        App {
            log,
            queue,
            ledger,
            auth,
            limits: Limits::default(),
            inbox: Arc::new(InboxConfig::default()),
            webhooks: Arc::new(WebhookConfig::default()),
            admission: None,
            batches: Arc::new(BatchConfig::default()),
            retention: Arc::new(Retention::default()),
            schedules: None,
            evals: None,
            metrics: Arc::new(Metrics::new()),
            wake: Arc::new(Notify::new()),
            wake_admission: Arc::new(Notify::new()),
            relaying: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// The same app with this batch store and these admission settings.
    pub fn with_batches(mut self, config: BatchConfig) -> App {
        self.batches = Arc::new(config);
        self
    }

    /// The same app with this schedule store (`/v1/schedules` and the
    /// scheduler, [`crate::schedules::schedules`]).
    pub fn with_schedules(
        mut self,
        store: Arc<dyn glia_backends::schedules::ScheduleStore>,
    ) -> App {
        self.schedules = Some(store);
        self
    }

    /// The same app with this eval store (`/v1/datasets`, `/v1/experiments`
    /// and the loop that tends experiments, [`crate::evals::evals`]).
    pub fn with_evals(mut self, store: Arc<dyn glia_backends::evals::EvalStore>) -> App {
        self.evals = Some(store);
        self
    }

    /// The same app with these retention settings.
    pub fn with_retention(mut self, retention: Retention) -> App {
        self.retention = Arc::new(retention);
        self
    }

    /// Wake the batch admission loop ([`crate::batches::admit`]) now.
    pub fn wake_admission(&self) {
        self.wake_admission.notify_one();
    }

    /// Wait until [`App::wake_admission`] is called (or was called since the last wait).
    pub(crate) async fn admission_woken(&self) {
        self.wake_admission.notified().await
    }

    /// The same app with these webhook settings (store, policy, public URL).
    pub fn with_webhooks(mut self, config: WebhookConfig) -> App {
        self.webhooks = Arc::new(config);
        self
    }

    /// The same app with this inbox configuration (session key, cookies).
    pub fn with_inbox(mut self, config: InboxConfig) -> App {
        self.inbox = Arc::new(config);
        self
    }

    /// The same app refusing configs `check` refuses (422 naming
    /// `config.FIELD`), e.g. a run naming an MCP server or HTTP origin the
    /// operator's catalogue lacks.
    pub fn with_admission(mut self, check: Admission) -> App {
        self.admission = Some(check);
        self
    }

    /// The same app with other limits.
    pub fn with_limits(mut self, limits: Limits) -> App {
        self.limits = limits;
        self
    }

    /// True when no tokens are configured: every request then acts as an admin
    /// of [`crate::OPEN_TENANT`], so the server must listen on a loopback address only.
    /// [`crate::serve`] enforces this; a binary that serves otherwise must too.
    pub fn requires_loopback(&self) -> bool {
        self.auth.is_open()
    }

    /// The metric handles (also served at `/metrics`).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Wake the [`crate::relay()`] now (after a write that put a job in the outbox).
    pub fn wake_relay(&self) {
        self.wake.notify_one();
    }

    /// Wait until [`App::wake_relay`] is called (or was called since the last wait).
    pub(crate) async fn woken(&self) {
        self.wake.notified().await
    }
}
