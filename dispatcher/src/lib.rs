//! glia-dispatcher: the fleet's HTTP API.
//!
//! The dispatcher admits runs, serves their logs, and moves parked runs on by
//! *posting* payloads (approval decisions, external tool results, user
//! messages, budget extensions, resumes) into the run's inbox
//! ([`glia_backends::Inbox::post`]). It never writes events itself except the
//! `session.start` of a new run: workers apply inbox items through the loop
//! and commit what happens. Every write that causes work writes a job to the
//! outbox in the same transaction; [`relay()`] publishes outbox jobs to the
//! [`glia_backends::JobQueue`] and [`reconcile`] re-enqueues runs whose job or worker was lost.
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
//!
//! ## Layers
//!
//! Imports point one way, down this list (`dispatcher/tests/it/module_graph.rs`
//! fails on any circle):
//!
//! - the top, [`server`]: the router over every handler, the OpenAPI
//!   document, serving; [`startup`] serves it behind a gate while the ports
//!   connect;
//! - the leaves, [`handlers`] (one module per resource of the JSON API),
//!   [`inbox`] (the HTML approvals inbox), [`console`] (the HTML pages of
//!   runs, batches and agents, beside the inbox), [`mcp`] (glia as an MCP
//!   server at `/mcp`) and [`webhooks`] (its API and the deliverer);
//! - the middle: [`admission`] (what makes a request a run), [`control`]
//!   (posting decisions, pause, resume, cancel), [`batches`] (the batch
//!   service and admission loop), [`extract`] (request extractors),
//!   [`mod@relay`], [`retention`] (erasure and its sweeper) and [`sampler`]
//!   (background tasks), [`history`];
//! - the state, [`app`] ([`App`], [`Limits`]), with its settings
//!   ([`config`]), [`auth`] and [`metrics`];
//! - the types: [`model`] (request and response shapes), [`docs`] (schemas
//!   of foreign types), [`error`].

#![warn(missing_docs)]
// The run-config schema (docs.rs) is one `json!` literal deeper than the default limit.
#![recursion_limit = "256"]

pub mod admission;
pub mod app;
pub mod auth;
pub mod batches;
// Issue 32, child runs.
pub mod children;
pub mod config;
pub mod console;
pub mod control;
pub mod docs;
pub mod error;
pub mod evals;
pub mod extract;
pub mod handlers;
pub mod history;
pub mod inbox;
pub mod mcp;
pub mod metrics;
pub mod model;
pub mod relay;
pub mod retention;
pub mod sampler;
pub mod schedules;
pub mod server;
pub mod startup;
pub mod waits;
pub mod webhooks;

pub use app::{Admission, App, Limits};
pub use auth::{Auth, AuthError, OPEN_TENANT, Principal, Scope};
pub use error::{ApiError, ErrorBody, ErrorDetail};
pub use metrics::Metrics;
pub use relay::{
    RECONCILE_BATCH, ReconcileError, Reconciler, RelayError, reconcile, relay, relay_once,
};
pub use sampler::sample;
pub use server::{ServeError, openapi, router, serve};
pub use startup::{Gate, Startup, serve_gate};
