//! Logs and the worker's metrics endpoint.
//!
//! - Logs go to stderr through `tracing`, as text or (`--log-format json`)
//!   one JSON object per line. A worker's lines about a run carry its
//!   `run_id` and `trace_id` (in `span`, the job's span) and, for events,
//!   their `seq`. `RUST_LOG` filters (default `info`; `glia_worker=debug`
//!   logs every recorded event).
//! - Traces: with an OTLP endpoint configured (`OTEL_EXPORTER_OTLP_*`),
//!   the spans of the runs a process advances are exported over OTLP/HTTP
//!   ([`otlp`]; what they are: `glia_worker::trace`, docs/observability.md).
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
    /// Human-readable lines, coloured only when stderr is a terminal and
    /// `NO_COLOR` is unset or empty.
    #[default]
    Text,
    /// One JSON object per line, each key once: `timestamp`, `level`,
    /// `fields` (the event's fields and its `message`), `target`, and `span`
    /// (the current span's fields, e.g. `run_id` and `trace_id`).
    Json,
}

/// Whether text logs on stderr are coloured: only on a terminal, and never
/// with `NO_COLOR` set to anything but the empty string (no-color.org).
fn colour_logs() -> bool {
    use std::io::IsTerminal;
    let no_colour = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_colour && std::io::stderr().is_terminal()
}

/// The log layer for `format` on stderr (no filter: see [`init_logging`]).
fn log_layer<S>(format: LogFormat) -> Box<dyn tracing_subscriber::Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer;
    match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(colour_logs())
            .boxed(),
        LogFormat::Json => json_layer(std::io::stderr).boxed(),
    }
}

/// The JSON log layer writing to `writer`.
fn json_layer<S, W>(writer: W) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt::layer()
        .json()
        .with_current_span(true)
        .with_span_list(false)
        .with_writer(writer)
}

/// Install the global subscriber: logs on stderr in `format`, filtered by
/// `RUST_LOG` (default `default_level`, e.g. `info`); and, when an OTLP
/// endpoint is configured ([`otlp::layer`]), spans exported over
/// OTLP/HTTP (glia's own spans at `info` and above, whatever `RUST_LOG`
/// says, and its warnings and errors as span events). Keep the returned
/// guard until exit: dropping it flushes the spans not yet sent.
pub fn init_logging(format: LogFormat, default_level: &str) -> Telemetry {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| default_level.into());
    let (traces, provider) = otlp::layer().unzip();
    let glia_only = tracing_subscriber::filter::filter_fn(|m| {
        m.target().starts_with("glia")
            && if m.is_span() {
                *m.level() <= tracing::Level::INFO
            } else {
                *m.level() <= tracing::Level::WARN
            }
    });
    tracing_subscriber::registry()
        .with(log_layer(format).with_filter(filter))
        .with(traces.with_filter(glia_only))
        .init();
    Telemetry { provider }
}

/// Flushes exported spans when dropped.
pub struct Telemetry {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take()
            && let Err(e) = p.shutdown()
        {
            errln!("OTLP export: flushing spans at exit failed: {e}");
        }
    }
}

/// The OTLP span exporter.
pub mod otlp {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;

    /// Whether spans are to be exported: an OTLP endpoint is configured
    /// (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`,
    /// not empty), and neither `OTEL_SDK_DISABLED=true` nor
    /// `OTEL_TRACES_EXPORTER=none` turns it off.
    pub fn configured(var: impl Fn(&str) -> Option<String>) -> bool {
        let set = |name: &str| var(name).is_some_and(|v| !v.trim().is_empty());
        let disabled =
            var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        let none =
            var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
        (set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") || set("OTEL_EXPORTER_OTLP_ENDPOINT"))
            && !disabled
            && !none
    }

    /// A layer exporting spans over OTLP/HTTP (protobuf, batched; the
    /// endpoint, headers, timeout and compression from the standard
    /// `OTEL_EXPORTER_OTLP_*` variables) and its provider (to flush at
    /// exit); the service name from `OTEL_SERVICE_NAME` (default `glia`).
    /// `None` when not [`configured`] (nothing is built: no cost), or when
    /// the exporter cannot be built (said on stderr).
    pub fn layer<S>() -> Option<(
        tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>,
        SdkTracerProvider,
    )>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        if !configured(|name| std::env::var(name).ok()) {
            return None;
        }
        if let Ok(protocol) = std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL")
            && protocol.trim() != "http/protobuf"
        {
            errln!(
                "OTLP export: OTEL_EXPORTER_OTLP_PROTOCOL={protocol} is not supported; exporting over http/protobuf"
            );
        }
        let exporter = match opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
        {
            Ok(e) => e,
            Err(e) => {
                errln!("OTLP export disabled: {e}");
                return None;
            }
        };
        let service = std::env::var("OTEL_SERVICE_NAME")
            .ok()
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| "glia".into());
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(service)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("glia");
        opentelemetry::global::set_tracer_provider(provider.clone());
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false);
        Some((layer, provider))
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use glia_proto::{Event, EventKind, RunState};
    use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

    use super::*;

    /// A log writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Buffer {
            self.clone()
        }
    }

    /// Any JSON value whose objects, at every depth, name each key once
    /// (`serde_json::Value` would keep the last of two silently).
    struct EachKeyOnce;

    impl<'de> Deserialize<'de> for EachKeyOnce {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(EachKeyOnceVisitor)
        }
    }

    struct EachKeyOnceVisitor;

    impl<'de> Visitor<'de> for EachKeyOnceVisitor {
        type Value = EachKeyOnce;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<EachKeyOnce, A::Error> {
            let mut seen = HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                if !seen.insert(key.clone()) {
                    return Err(de::Error::custom(format!("key `{key}` twice")));
                }
                map.next_value::<EachKeyOnce>()?;
            }
            Ok(EachKeyOnce)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<EachKeyOnce, A::Error> {
            while seq.next_element::<EachKeyOnce>()?.is_some() {}
            Ok(EachKeyOnce)
        }
        fn visit_bool<E>(self, _: bool) -> Result<EachKeyOnce, E> {
            Ok(EachKeyOnce)
        }
        fn visit_i64<E>(self, _: i64) -> Result<EachKeyOnce, E> {
            Ok(EachKeyOnce)
        }
        fn visit_u64<E>(self, _: u64) -> Result<EachKeyOnce, E> {
            Ok(EachKeyOnce)
        }
        fn visit_f64<E>(self, _: f64) -> Result<EachKeyOnce, E> {
            Ok(EachKeyOnce)
        }
        fn visit_str<E>(self, _: &str) -> Result<EachKeyOnce, E> {
            Ok(EachKeyOnce)
        }
        fn visit_unit<E>(self) -> Result<EachKeyOnce, E> {
            Ok(EachKeyOnce)
        }
    }

    /// A worker's run-scoped lines in JSON: the job span's `run_id` and
    /// `trace_id`, and every key once — a recorded `error` event used to
    /// write `message` twice (its text and the log line's).
    #[test]
    fn json_log_lines_name_each_key_once_and_carry_the_trace_id() {
        use tracing_subscriber::layer::SubscriberExt;
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::registry()
            .with(json_layer(buffer.clone()))
            .with(EnvFilter::new("debug"));
        let run_id = uuid::Uuid::now_v7();
        tracing::subscriber::with_default(subscriber, || {
            let span = glia_worker::trace::job_span(run_id, 0, "queue", "w1");
            let _entered = span.enter();
            let state = RunState::new(run_id);
            let mut observer = glia_worker::metrics::RunObserver::new(None, &state);
            observer.record(&Event {
                run_id,
                seq: 3,
                at: chrono::Utc::now(),
                kind: EventKind::Error {
                    message: "the provider failed".into(),
                    fatal: false,
                },
            });
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines.iter().any(|l| l.contains("run error recorded")),
            "{text}"
        );
        for line in &lines {
            if let Err(e) = serde_json::from_str::<EachKeyOnce>(line) {
                panic!("{e}: {line}");
            }
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["span"]["run_id"], run_id.to_string(), "{line}");
            assert_eq!(v["span"]["trace_id"], run_id.simple().to_string(), "{line}");
        }
        let error = lines
            .iter()
            .find(|l| l.contains("run error recorded"))
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(error).unwrap();
        assert_eq!(v["fields"]["error"], "the provider failed");
        assert_eq!(v["fields"]["message"], "run error recorded");
    }

    #[test]
    fn otlp_export_is_on_only_when_an_endpoint_is_configured() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert!(!otlp::configured(env(&[])));
        assert!(!otlp::configured(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            " "
        )])));
        assert!(otlp::configured(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://127.0.0.1:4318"
        )])));
        assert!(otlp::configured(env(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:4318/v1/traces"
        )])));
        assert!(!otlp::configured(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_SDK_DISABLED", "true"),
        ])));
        assert!(!otlp::configured(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ])));
    }
}
