//! Logs and the worker's metrics endpoint.
//!
//! - Logs go to stderr through `tracing`, as text or (`--log-format json`)
//!   one JSON object per line. A worker's lines about a run carry its
//!   `run_id` (in `span`, the job's span) and, for events, their `seq`.
//!   `RUST_LOG` filters (default `info`; `glia_worker=debug` logs every
//!   recorded event).
//! - `glia worker --metrics-listen ADDR` serves `/metrics` (OpenMetrics
//!   text, [`glia_worker::metrics`]), `/healthz` (liveness: 200 while the
//!   process runs) and `/readyz` (200 when Postgres, RabbitMQ and Redis
//!   answer; 503 `not_ready` naming each that does not, also while the
//!   worker is still connecting at start) on ADDR.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result};
use axum::Router;
use axum::http::header;
use axum::routing::get;
use glia_dispatcher::Startup;
use glia_dispatcher::handlers::ops as dispatcher_ops;
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

/// Install the global subscriber: stderr, `RUST_LOG` (default
/// `default_level`, e.g. `info`), in `format`. Built with the `otlp` feature and with
/// `OTEL_EXPORTER_OTLP_ENDPOINT` set, spans are also exported over OTLP/HTTP
/// (service name from `OTEL_SERVICE_NAME`, default `glia`). Keep the
/// returned guard until exit: dropping it flushes the spans not yet sent.
pub fn init_logging(format: LogFormat, default_level: &str) -> Telemetry {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| default_level.into());
    let text = (format == LogFormat::Text)
        .then(|| tracing_subscriber::fmt::layer().with_writer(std::io::stderr));
    let json = (format == LogFormat::Json).then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(std::io::stderr)
    });
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(text)
        .with(json);
    #[cfg(feature = "otlp")]
    {
        let (layer, provider) = otlp::layer().unzip();
        registry.with(layer).init();
        Telemetry { provider }
    }
    #[cfg(not(feature = "otlp"))]
    {
        registry.init();
        Telemetry {}
    }
}

/// Flushes exported spans when dropped (a no-op without the `otlp` feature).
pub struct Telemetry {
    #[cfg(feature = "otlp")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        #[cfg(feature = "otlp")]
        if let Some(p) = self.provider.take()
            && let Err(e) = p.shutdown()
        {
            eprintln!("OTLP export: flushing spans at exit failed: {e}");
        }
    }
}

/// The OTLP span exporter (feature `otlp`).
#[cfg(feature = "otlp")]
mod otlp {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;

    /// A layer exporting spans to `OTEL_EXPORTER_OTLP_ENDPOINT` over
    /// OTLP/HTTP (batched) and its provider (to flush at exit), or `None`
    /// when the variable is unset or the exporter cannot be built (reported
    /// on stderr).
    pub fn layer<S>() -> Option<(
        tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>,
        SdkTracerProvider,
    )>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT")?;
        let exporter = match opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
        {
            Ok(e) => e,
            Err(e) => {
                eprintln!("OTLP export disabled: {e}");
                return None;
            }
        };
        let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "glia".into());
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(service)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("glia");
        opentelemetry::global::set_tracer_provider(provider.clone());
        Some((tracing_opentelemetry::layer().with_tracer(tracer), provider))
    }
}

/// The content type of the OpenMetrics text format.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A worker's readiness: while it connects, each service's state at start;
/// once connected, whether its ports answer now
/// ([`glia_backends::readiness`], 2 s per check). Cheap to clone.
#[derive(Clone)]
pub struct Readiness {
    startup: Startup,
    ports: Arc<OnceLock<crate::ports::Ports>>,
}

impl Readiness {
    /// Not connected yet; `startup` is kept current by the connecting code.
    pub fn new(startup: Startup) -> Readiness {
        Readiness {
            startup,
            ports: Arc::new(OnceLock::new()),
        }
    }

    /// The services' states at start, for the connecting code to update.
    pub fn startup(&self) -> &Startup {
        &self.startup
    }

    /// From now on check `ports` themselves.
    pub fn connected(&self, ports: &crate::ports::Ports) {
        let _ = self.ports.set(ports.clone());
    }

    /// Each service → `ok` or why not.
    pub async fn checks(&self) -> std::collections::BTreeMap<String, String> {
        match self.ports.get() {
            Some(p) => {
                glia_backends::readiness(
                    p.log.as_ref(),
                    p.queue.as_ref(),
                    p.ledger.as_ref(),
                    glia_dispatcher::Limits::default().ready_timeout,
                )
                .await
            }
            None => self.startup.checks(),
        }
    }
}

/// Serve `/metrics`, `/healthz` and `/readyz` (same answers as the
/// dispatcher's: [`glia_dispatcher::handlers::ops::readiness_answer`]) on `addr` until
/// `shutdown` turns true.
pub async fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<WorkerMetrics>,
    readiness: Readiness,
    mut shutdown: watch::Receiver<bool>,
) -> Result<()> {
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move { ([(header::CONTENT_TYPE, OPENMETRICS)], metrics.encode()) }
            }),
        )
        .route(
            "/healthz",
            get(|| async { dispatcher_ops::healthz_answer() }),
        )
        .route(
            "/readyz",
            get(move || {
                let readiness = readiness.clone();
                async move { dispatcher_ops::readiness_answer(readiness.checks().await) }
            }),
        );
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding --metrics-listen {addr}"))?;
    tracing::info!(%addr, "worker metrics listening");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|s| *s).await;
        })
        .await?;
    Ok(())
}
