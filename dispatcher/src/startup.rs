//! A dispatcher that serves before its dependencies answer.
//!
//! `glia dispatcher` binds its address at once and serves a [`Gate`]'s
//! router while it connects to Postgres, RabbitMQ and Redis (each retried
//! with backoff by the binary). Until [`Gate::open`]:
//!
//! - `GET /healthz` answers 200 (the process lives: liveness);
//! - `GET /readyz` answers 503 `not_ready` with each dependency's state
//!   (`event_log`, `job_queue`, `ledger` → `ok`, `connecting`, or
//!   `connecting: <last error>`) and `api: starting` (so it never says ready
//!   before the API serves), the same shape as the app's own `/readyz`;
//! - every other request answers 503 `not_ready` with `Retry-After: 1`, which
//!   clients retry.
//!
//! After [`Gate::open`] every request goes to [`crate::router`] of the app,
//! whose `/readyz` checks the live ports on each call (so readiness also
//! reflects a dependency that goes away later).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;
use tower::ServiceExt;

use crate::app::App;
use crate::handlers::ops;
use crate::server::{ServeError, router, serve_router};

/// Each dependency a process waits for at start → `ok`, `connecting`, or
/// `connecting: <last error>`. Cheap to clone (shared).
#[derive(Clone, Debug, Default)]
pub struct Startup {
    checks: Arc<Mutex<BTreeMap<String, String>>>,
}

impl Startup {
    /// Every dependency in `names` is `connecting`.
    pub fn new(names: &[&str]) -> Startup {
        let checks = names
            .iter()
            .map(|n| ((*n).to_owned(), "connecting".to_owned()))
            .collect();
        Startup {
            checks: Arc::new(Mutex::new(checks)),
        }
    }

    /// Record `dependency`'s state (`ok`, or why it is not yet).
    pub fn set(&self, dependency: &str, state: impl Into<String>) {
        self.checks
            .lock()
            .expect("startup checks")
            .insert(dependency.to_owned(), state.into());
    }

    /// A snapshot of every dependency's state.
    pub fn checks(&self) -> BTreeMap<String, String> {
        self.checks.lock().expect("startup checks").clone()
    }
}

/// The router of a dispatcher still starting, then of its app. Cheap to clone.
#[derive(Clone)]
pub struct Gate {
    startup: Startup,
    app: watch::Sender<Option<Router>>,
    requires_loopback: bool,
}

impl Gate {
    /// A gate waiting for `startup`'s dependencies. `requires_loopback`: no
    /// API tokens are configured ([`App::requires_loopback`]).
    pub fn new(startup: Startup, requires_loopback: bool) -> Gate {
        Gate {
            startup,
            app: watch::channel(None).0,
            requires_loopback,
        }
    }

    /// The dependencies' states, for the binary to update.
    pub fn startup(&self) -> &Startup {
        &self.startup
    }

    /// From now on serve `app` ([`crate::router`]).
    pub fn open(&self, app: App) {
        self.app.send_replace(Some(router(app)));
    }

    /// True once [`Gate::open`] was called.
    pub fn is_open(&self) -> bool {
        self.app.borrow().is_some()
    }

    /// The gate's router: the starting answers above, or the app's router.
    pub fn router(&self) -> Router {
        let (app, startup) = (self.app.subscribe(), self.startup.clone());
        Router::new().fallback_service(tower::service_fn(move |req: Request| {
            let current = app.borrow().clone();
            let startup = startup.clone();
            async move {
                match current {
                    Some(router) => router.oneshot(req).await,
                    None => Ok(starting(req, &startup)),
                }
            }
        }))
    }
}

/// The answer of a dispatcher still connecting.
fn starting(req: Request, startup: &Startup) -> Response {
    match req.uri().path() {
        "/healthz" => ops::healthz_answer().into_response(),
        "/readyz" => ops::readiness_answer(starting_checks(startup)),
        _ => {
            let waiting: Vec<String> = starting_checks(startup)
                .into_iter()
                .filter(|(_, v)| v != "ok")
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            let error = crate::error::ApiError::NotReady(format!(
                "the dispatcher is starting; waiting for {}",
                waiting.join("; ")
            ));
            let mut resp = error.into_response();
            debug_assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            resp
        }
    }
}

/// The dependencies' states while the gate is shut, plus `api: starting`:
/// every service may already answer `ok` while the app is still being built
/// (between the last connect and [`Gate::open`]), and a dispatcher that
/// refuses requests must not report ready.
fn starting_checks(startup: &Startup) -> BTreeMap<String, String> {
    let mut checks = startup.checks();
    checks.insert("api".to_owned(), "starting".to_owned());
    checks
}

/// Serve `gate`'s router on `listener` until `shutdown` resolves, with the
/// loopback rule of [`crate::serve`].
pub async fn serve_gate(
    gate: Gate,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    serve_router(gate.router(), gate.requires_loopback, 0, listener, shutdown).await
}
