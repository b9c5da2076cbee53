//! Logs and the worker's metrics endpoint.
//!
//! - Logs go to stderr through `tracing`, as text or (`--log-format json`)
//!   one JSON object per line. A worker's lines about a run carry its
//!   `run_id` (in `span`, the job's span) and, for events, their `seq`.
//!   `RUST_LOG` filters (default `info`; `glia_worker=debug` logs every
//!   recorded event).
//! - `glia worker --metrics-listen ADDR` serves `/metrics` (OpenMetrics
//!   text, [`glia_worker::metrics`]) and `/healthz` on ADDR.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::Router;
use axum::http::header;
use axum::routing::get;
use glia_worker::metrics::WorkerMetrics;
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `fields`, `target`,
    /// and `span` (the current span's fields, e.g. `run_id`).
    Json,
}

/// Install the global subscriber: stderr, `RUST_LOG` (default `info`), in `format`.
pub fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().with_current_span(true).with_span_list(false).init(),
    }
}

/// The content type of the OpenMetrics text format.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serve `/metrics` and `/healthz` on `addr` until `shutdown` turns true.
pub async fn serve_metrics(addr: SocketAddr, metrics: Arc<WorkerMetrics>, mut shutdown: watch::Receiver<bool>) -> Result<()> {
    let app = Router::new()
        .route("/metrics", get(move || {
            let metrics = metrics.clone();
            async move { ([(header::CONTENT_TYPE, OPENMETRICS)], metrics.encode()) }
        }))
        .route("/healthz", get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding --metrics-listen {addr}"))?;
    tracing::info!(%addr, "worker metrics listening");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|s| *s).await;
        })
        .await?;
    Ok(())
}
