//! The dispatcher's Prometheus metrics (prometheus-client, OpenMetrics text at
//! `/metrics`). Every name is prefixed `glia_dispatcher_`; prometheus-client
//! appends `_total` to counters itself.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `glia_dispatcher_http_requests_total` | counter | `route` (template, or `unmatched`), `method`, `status` | requests answered |
//! | `glia_dispatcher_http_request_duration_seconds` | histogram | `route`, `method` | time to the response head |
//! | `glia_dispatcher_runs_admitted_total` | counter | – | runs created (idempotent repeats not counted) |
//! | `glia_dispatcher_payloads_posted_total` | counter | `kind` (`approval`, `tool_result`, `input`, `extend_budget`, `resume`, `close`, `cancel`) | inbox payloads posted |
//! | `glia_dispatcher_cancels_requested_total` | counter | – | cancel flags set |
//! | `glia_dispatcher_jobs_relayed_total` | counter | – | outbox jobs published and confirmed |
//! | `glia_dispatcher_relay_errors_total` | counter | – | failed relay passes |
//! | `glia_dispatcher_jobs_reconciled_total` | counter | – | jobs re-enqueued by the reconciler |
//! | `glia_dispatcher_sse_streams` | gauge | – | open SSE streams |

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of `http_requests_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// Route template, e.g. `/v1/runs/{id}`, or `unmatched`.
    pub route: String,
    /// HTTP method.
    pub method: String,
    /// Status code, e.g. `201`.
    pub status: String,
}

/// Labels of `http_request_duration_seconds`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// Route template.
    pub route: String,
    /// HTTP method.
    pub method: String,
}

/// Labels of `payloads_posted_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PayloadLabels {
    /// Payload kind: `approval`, `tool_result`, `input`, `extend_budget`, `resume`, `close`, `cancel`.
    pub kind: String,
}

fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
}

/// The metric handles and their registry.
pub struct Metrics {
    registry: Registry,
    /// Requests answered.
    pub http_requests: Family<HttpLabels, Counter>,
    /// Seconds to the response head.
    pub http_duration: Family<RouteLabels, Histogram, fn() -> Histogram>,
    /// Runs created.
    pub runs_admitted: Counter,
    /// Inbox payloads posted, by kind.
    pub payloads_posted: Family<PayloadLabels, Counter>,
    /// Cancel flags set.
    pub cancels_requested: Counter,
    /// Outbox jobs published and confirmed.
    pub jobs_relayed: Counter,
    /// Failed relay passes.
    pub relay_errors: Counter,
    /// Jobs re-enqueued by the reconciler.
    pub jobs_reconciled: Counter,
    /// Open SSE streams.
    pub sse_streams: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Fresh handles registered under the `glia_dispatcher` prefix.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("glia_dispatcher");
        let m = Metrics {
            http_requests: Family::default(),
            http_duration: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            runs_admitted: Counter::default(),
            payloads_posted: Family::default(),
            cancels_requested: Counter::default(),
            jobs_relayed: Counter::default(),
            relay_errors: Counter::default(),
            jobs_reconciled: Counter::default(),
            sse_streams: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register("http_requests", "HTTP requests answered, by route template, method and status", m.http_requests.clone());
        registry.register("http_request_duration_seconds", "Seconds until the response head, by route and method", m.http_duration.clone());
        registry.register("runs_admitted", "Runs created by POST /v1/runs (idempotent repeats excluded)", m.runs_admitted.clone());
        registry.register("payloads_posted", "Payloads posted to run inboxes, by kind", m.payloads_posted.clone());
        registry.register("cancels_requested", "Cancel flags set through POST /v1/runs/{id}/cancel", m.cancels_requested.clone());
        registry.register("jobs_relayed", "Outbox jobs published to the queue and confirmed", m.jobs_relayed.clone());
        registry.register("relay_errors", "Relay passes that failed (event log or queue unavailable)", m.relay_errors.clone());
        registry.register("jobs_reconciled", "Jobs re-enqueued by the reconciler for orphaned runs", m.jobs_reconciled.clone());
        registry.register("sse_streams", "Open SSE event streams", m.sse_streams.clone());
        Metrics { registry, ..m }
    }

    /// Count one posted payload of `kind`.
    pub fn posted(&self, kind: &str) {
        self.payloads_posted.get_or_create(&PayloadLabels { kind: kind.to_owned() }).inc();
    }

    /// The OpenMetrics text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
