//! glia-dispatcher: the fleet's HTTP API.
//!
//! The dispatcher admits runs, serves their logs, and moves parked runs on by
//! *posting* payloads (approval decisions, external tool results, user
//! messages, budget extensions, resumes) into the run's inbox
//! ([`EventLog::post`]). It never writes events itself except the
//! `session.start` of a new run: workers apply inbox items through the loop
//! and commit what happens. Every write that causes work writes a job to the
//! outbox in the same transaction; [`relay()`] publishes outbox jobs to the
//! [`JobQueue`] and [`reconcile`] re-enqueues runs whose job or worker was lost.
//!
//! To serve it (what `glia dispatcher` and `glia dev` do):
//!
//! ```no_run
//! # async fn demo(log: std::sync::Arc<dyn glia_backends::EventLog>,
//! #               queue: std::sync::Arc<dyn glia_backends::JobQueue>,
//! #               ledger: std::sync::Arc<dyn glia_backends::Ledger>) -> Result<(), glia_dispatcher::ServeError> {
//! use glia_dispatcher::{App, Auth, serve, relay, reconcile};
//! let app = App::new(log, queue, ledger, Auth::open());
//! tokio::spawn(relay(app.clone()));
//! tokio::spawn(reconcile(app.clone(), std::time::Duration::from_secs(30)));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! serve(app, listener, std::future::pending()).await
//! # }
//! ```
//!
//! Endpoints, errors and scopes: see [`router`], [`error::ApiError`] and
//! [`auth`]; the OpenAPI 3.1 document is [`openapi`] (served at `/openapi.json`).

#![warn(missing_docs)]
// The run-config schema (docs.rs) is one `json!` literal deeper than the default limit.
#![recursion_limit = "256"]

pub mod agents;
pub mod api;
pub mod auth;
pub mod batches;
pub mod docs;
pub mod error;
pub mod extract;
pub mod history;
pub mod inbox;
pub mod metrics;
pub mod relay;
pub mod startup;
mod stream;
pub mod webhooks;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use glia_backends::{EventLog, JobQueue, Ledger};
use tokio::sync::Notify;

pub use auth::{Auth, AuthError, OPEN_TENANT, Principal, Scope};
pub use error::{ApiError, ErrorBody, ErrorDetail};
pub use metrics::{Metrics, sample};
pub use relay::{
    RECONCILE_BATCH, ReconcileError, Reconciler, RelayError, reconcile, relay, relay_once,
};
pub use startup::{Gate, Startup, serve_gate};

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
    pub inbox: Arc<inbox::InboxConfig>,
    /// Webhook store, receiver policy and public URL.
    pub webhooks: Arc<webhooks::WebhookConfig>,
    /// The operator's admission check of a run's config against the fleet's
    /// catalogue (MCP servers, HTTP tool origins, providers: `glia
    /// dispatcher --catalogue`); `None` admits every valid config.
    pub admission: Option<Admission>,
    /// Batch store and admission settings.
    pub batches: Arc<batches::BatchConfig>,
    metrics: Arc<Metrics>,
    wake: Arc<Notify>,
    wake_admission: Arc<Notify>,
    /// Held by each relay pass ([`relay_once`]): the relay loop and the
    /// reconciler's tick never publish the same outbox rows twice.
    relaying: Arc<tokio::sync::Mutex<()>>,
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
            inbox: Arc::new(inbox::InboxConfig::default()),
            webhooks: Arc::new(webhooks::WebhookConfig::default()),
            admission: None,
            batches: Arc::new(batches::BatchConfig::default()),
            metrics: Arc::new(Metrics::new()),
            wake: Arc::new(Notify::new()),
            wake_admission: Arc::new(Notify::new()),
            relaying: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// The same app with this batch store and these admission settings.
    pub fn with_batches(mut self, config: batches::BatchConfig) -> App {
        self.batches = Arc::new(config);
        self
    }

    /// Wake the batch admission loop ([`batches::admit`]) now.
    pub fn wake_admission(&self) {
        self.wake_admission.notify_one();
    }

    /// Wait until [`App::wake_admission`] is called (or was called since the last wait).
    pub(crate) async fn admission_woken(&self) {
        self.wake_admission.notified().await
    }

    /// The same app with these webhook settings (store, policy, public URL).
    pub fn with_webhooks(mut self, config: webhooks::WebhookConfig) -> App {
        self.webhooks = Arc::new(config);
        self
    }

    /// The same app with this inbox configuration (session key, cookies).
    pub fn with_inbox(mut self, config: inbox::InboxConfig) -> App {
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
    /// of [`OPEN_TENANT`], so the server must listen on a loopback address only.
    /// [`serve`] enforces this; a binary that serves otherwise must too.
    pub fn requires_loopback(&self) -> bool {
        self.auth.is_open()
    }

    /// The metric handles (also served at `/metrics`).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Wake the [`relay()`] now (after a write that put a job in the outbox).
    pub fn wake_relay(&self) {
        self.wake.notify_one();
    }

    /// Wait until [`App::wake_relay`] is called (or was called since the last wait).
    pub(crate) async fn woken(&self) {
        self.wake.notified().await
    }
}

/// The HTTP API over `app`: every endpoint of [`api`] (documented in
/// [`openapi`]), JSON errors for unknown routes (404 `route_not_found`) and
/// methods (405 `method_not_allowed`), panics (500 `internal`), a body limit
/// of [`Limits::max_body_bytes`], and request metrics.
pub fn router(app: App) -> Router {
    let (routes, _) = api::routes().split_for_parts();
    let limit = app.limits.max_body_bytes;
    routes
        .merge(inbox::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(middleware::from_fn_with_state(app.clone(), track))
        .layer(DefaultBodyLimit::max(limit))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(panicked))
        .with_state(app)
}

/// The OpenAPI 3.1 document of [`router`] as JSON (served at `/openapi.json`):
/// generated by utoipa from the handlers, with hand-written schemas for the
/// contract types of glia-proto and glia-backends ([`docs::foreign_schemas`]).
pub fn openapi() -> serde_json::Value {
    let doc = api::routes().split_for_parts().1;
    let mut json = serde_json::to_value(doc).expect("the OpenAPI document serialises");
    for (name, schema) in docs::foreign_schemas() {
        json["components"]["schemas"][name] = schema;
    }
    docs::complete(&mut json);
    json
}

async fn not_found(req: Request) -> ApiError {
    ApiError::RouteNotFound(format!("{} {}", req.method(), req.uri().path()))
}

fn panicked(err: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let what = err
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    tracing::error!("handler panicked: {what}");
    ApiError::Internal("the handler panicked".into()).into_response()
}

async fn track(State(app): State<App>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = req.method().as_str().to_owned();
    let start = Instant::now();
    let response = next.run(req).await;
    let m = app.metrics();
    m.http_duration
        .get_or_create(&metrics::RouteLabels {
            route: route.clone(),
            method: method.clone(),
        })
        .observe(start.elapsed().as_secs_f64());
    m.http_requests
        .get_or_create(&metrics::HttpLabels {
            route,
            method,
            status: response.status().as_u16().to_string(),
        })
        .inc();
    response
}

/// Why [`serve`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// No tokens are configured and the listener is not on a loopback address.
    #[error(
        "no API tokens configured: refusing to serve on non-loopback address {0} (configure tokens or bind 127.0.0.1)"
    )]
    NotLoopback(SocketAddr),
    /// The listener failed.
    #[error("serving failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Serve [`router`] on `listener` until `shutdown` resolves (then finish
/// in-flight requests). With no tokens configured it refuses a non-loopback
/// listener ([`ServeError::NotLoopback`]) and logs a warning that it serves
/// loopback only. Does not start [`relay()`] or [`reconcile()`]: spawn those.
pub async fn serve(
    app: App,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let (open, tokens) = (app.requires_loopback(), app.auth.len());
    serve_router(router(app), open, tokens, listener, shutdown).await
}

/// Serve `router` with the loopback rule of [`serve`] (`requires_loopback`:
/// no tokens are configured).
pub(crate) async fn serve_router(
    router: Router,
    requires_loopback: bool,
    tokens: usize,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let addr = listener.local_addr()?;
    if requires_loopback {
        if !addr.ip().is_loopback() {
            return Err(ServeError::NotLoopback(addr));
        }
        tracing::warn!(%addr, "no API tokens configured: serving on loopback only; every request acts as admin of tenant `{OPEN_TENANT}`");
    }
    tracing::info!(%addr, tokens, "dispatcher listening");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}
