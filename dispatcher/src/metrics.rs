//! The dispatcher's Prometheus metrics (prometheus-client, OpenMetrics text at
//! `/metrics`). Every name is prefixed `glia_dispatcher_`; prometheus-client
//! appends `_total` to counters itself.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `glia_dispatcher_http_requests_total` | counter | `route` (template, or `unmatched`), `method`, `status` | requests answered |
//! | `glia_dispatcher_http_request_duration_seconds` | histogram | `route`, `method` | time to the response head |
//! | `glia_dispatcher_runs_admitted_total` | counter | – | runs created (idempotent repeats not counted) |
//! | `glia_dispatcher_payloads_posted_total` | counter | `kind` (`approval`, `tool_result`, `input`, `extend_budget`, `pause`, `resume`, `close`, `cancel`) | inbox payloads posted |
//! | `glia_dispatcher_cancels_requested_total` | counter | – | cancel flags set |
//! | `glia_dispatcher_jobs_relayed_total` | counter | – | outbox jobs published and confirmed |
//! | `glia_dispatcher_relay_errors_total` | counter | – | failed relay passes |
//! | `glia_dispatcher_jobs_reconciled_total` | counter | – | jobs re-enqueued by the reconciler |
//! | `glia_dispatcher_sse_streams` | gauge | – | open SSE streams |
//! | `glia_dispatcher_mcp_sessions` | gauge | – | open MCP sessions (`/mcp`) |
//! | `glia_dispatcher_runs` | gauge | `status` (`runnable`, `parked`), `pull_point` (parked runs: `awaiting_approval`, `awaiting_tool`, `awaiting_input`, `paused`; else empty) | runs not done (sampled; ended runs are `glia_worker_runs_completed_total`) |
//! | `glia_dispatcher_approvals_pending` | gauge | – | approvals waiting for a decision (sampled) |
//! | `glia_dispatcher_approvals_overdue` | gauge | – | pending approvals past their deadline (sampled) |
//! | `glia_dispatcher_approval_oldest_age_seconds` | gauge | – | age of the oldest pending approval (sampled) |
//! | `glia_dispatcher_approval_wait_seconds` | histogram | `decision` (`approve`, `reject`, `edit`, `expired`) | approval requested → decided (or expired by the reconciler) |
//! | `glia_dispatcher_queue_messages` | gauge | – | jobs ready in the run-job queue (sampled) |
//! | `glia_dispatcher_queue_consumers` | gauge | – | consumers (workers) on the run-job queue (sampled; RabbitMQ only) |
//! | `glia_dispatcher_queue_dead_lettered` | gauge | – | jobs in the dead-letter queue (sampled; RabbitMQ only) |
//! | `glia_dispatcher_sample_errors_total` | counter | `source` (`log`, `queue`) | failed samples |
//!
//! The sampled gauges are refreshed by [`crate::sampler::sample`] (every 5 s in `glia
//! dispatcher`): one passive queue declare per queue and two counting
//! queries, whatever the number of scrapes. With several dispatchers each
//! reports the same fleet-wide values: aggregate them with `max`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

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
    /// Payload kind: `approval`, `tool_result`, `input`, `extend_budget`, `pause`, `resume`, `close`, `cancel`.
    pub kind: String,
}

/// Labels of `runs`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RunLabels {
    /// `runnable`, `parked`.
    pub status: String,
    /// The pull point of parked runs, else empty.
    pub pull_point: String,
}

/// Labels of `batch_items`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BatchItemLabels {
    /// `queued`, `running`, `parked`, `succeeded`, `failed`, `cancelled`, `expired`.
    pub state: String,
    /// The pull point of parked items, else empty.
    pub pull_point: String,
}

/// Label `decision` of `approval_wait_seconds`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// `approve`, `reject`, `edit`, or `expired` (rejected or escalated by the reconciler).
    pub decision: String,
}

/// Label `source` of `sample_errors_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    /// `log` or `queue`.
    pub source: String,
}

fn wait_histogram() -> Histogram {
    // 1 s … ~4.5 days.
    Histogram::new(exponential_buckets(1.0, 3.0, 12))
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
    /// Runs whose content was erased (on request or by retention).
    pub runs_erased: Counter,
    /// Experiment cells graded (issue 31).
    pub eval_cells_graded: Counter,
    /// Retention sweeps that failed (event log unavailable).
    pub retention_errors: Counter,
    /// Open SSE streams.
    pub sse_streams: Gauge,
    /// Open MCP sessions.
    pub mcp_sessions: Gauge,
    /// Runs not done, by status and pull point (sampled).
    pub runs: Family<RunLabels, Gauge>,
    /// Pending approvals (sampled).
    pub approvals_pending: Gauge,
    /// Pending approvals past their deadline (sampled).
    pub approvals_overdue: Gauge,
    /// Seconds the oldest pending approval has waited (sampled).
    pub approval_oldest_age: Gauge<f64, AtomicU64>,
    /// Seconds from approval request to decision, by decision.
    pub approval_wait: Family<DecisionLabels, Histogram, fn() -> Histogram>,
    /// Jobs ready in the run-job queue (sampled).
    pub queue_messages: Gauge,
    /// Consumers on the run-job queue (sampled).
    pub queue_consumers: Gauge,
    /// Jobs in the dead-letter queue (sampled).
    pub queue_dead_lettered: Gauge,
    /// Failed samples, by source.
    pub sample_errors: Family<SourceLabels, Counter>,
    /// Items of unfinished batches by state (sampled; no batch label).
    pub batch_items: Family<BatchItemLabels, Gauge>,
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
            runs_erased: Counter::default(),
            eval_cells_graded: Counter::default(),
            retention_errors: Counter::default(),
            sse_streams: Gauge::default(),
            mcp_sessions: Gauge::default(),
            runs: Family::default(),
            approvals_pending: Gauge::default(),
            approvals_overdue: Gauge::default(),
            approval_oldest_age: Gauge::default(),
            approval_wait: Family::new_with_constructor(wait_histogram as fn() -> Histogram),
            queue_messages: Gauge::default(),
            queue_consumers: Gauge::default(),
            queue_dead_lettered: Gauge::default(),
            sample_errors: Family::default(),
            batch_items: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "http_requests",
            "HTTP requests answered, by route template, method and status",
            m.http_requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "Seconds until the response head, by route and method",
            m.http_duration.clone(),
        );
        registry.register(
            "runs_admitted",
            "Runs created by POST /v1/runs (idempotent repeats excluded)",
            m.runs_admitted.clone(),
        );
        registry.register(
            "payloads_posted",
            "Payloads posted to run inboxes, by kind",
            m.payloads_posted.clone(),
        );
        registry.register(
            "cancels_requested",
            "Cancel flags set through POST /v1/runs/{id}/cancel",
            m.cancels_requested.clone(),
        );
        registry.register(
            "jobs_relayed",
            "Outbox jobs published to the queue and confirmed",
            m.jobs_relayed.clone(),
        );
        registry.register(
            "relay_errors",
            "Relay passes that failed (event log or queue unavailable)",
            m.relay_errors.clone(),
        );
        registry.register(
            "jobs_reconciled",
            "Jobs re-enqueued by the reconciler for orphaned runs",
            m.jobs_reconciled.clone(),
        );
        registry.register(
            "runs_erased",
            "Runs whose content was erased, by DELETE /v1/runs/{id} or the retention sweeper",
            m.runs_erased.clone(),
        );
        registry.register(
            "eval_cells_graded",
            "Experiment cells graded (each cell once)",
            m.eval_cells_graded.clone(),
        );
        registry.register(
            "retention_errors",
            "Retention sweeps that failed (event log unavailable)",
            m.retention_errors.clone(),
        );
        registry.register(
            "sse_streams",
            "Open SSE event streams",
            m.sse_streams.clone(),
        );
        registry.register("mcp_sessions", "Open MCP sessions", m.mcp_sessions.clone());
        registry.register(
            "runs",
            "Runs not done in the event log, by status and pull point (sampled)",
            m.runs.clone(),
        );
        registry.register(
            "approvals_pending",
            "Approvals waiting for a decision (sampled)",
            m.approvals_pending.clone(),
        );
        registry.register(
            "approvals_overdue",
            "Pending approvals past their deadline (sampled)",
            m.approvals_overdue.clone(),
        );
        registry.register(
            "approval_oldest_age_seconds",
            "Seconds the oldest pending approval has waited (sampled)",
            m.approval_oldest_age.clone(),
        );
        registry.register("approval_wait_seconds", "Seconds from an approval request to its decision, by decision (expired: by the reconciler)", m.approval_wait.clone());
        registry.register(
            "queue_messages",
            "Jobs ready in the run-job queue (sampled)",
            m.queue_messages.clone(),
        );
        registry.register(
            "queue_consumers",
            "Consumers (workers) attached to the run-job queue (sampled)",
            m.queue_consumers.clone(),
        );
        registry.register(
            "queue_dead_lettered",
            "Jobs in the dead-letter queue (sampled)",
            m.queue_dead_lettered.clone(),
        );
        registry.register(
            "sample_errors",
            "Failed samples of the sampled gauges, by source (log, queue)",
            m.sample_errors.clone(),
        );
        registry.register(
            "batch_items",
            "Items of batches not finished, by state and pull point (sampled)",
            m.batch_items.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Count one posted payload of `kind`.
    pub fn posted(&self, kind: &str) {
        self.payloads_posted
            .get_or_create(&PayloadLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// Observe an approval decided (or expired) `waited` after it was requested.
    pub fn approval_waited(&self, decision: &str, waited: chrono::TimeDelta) {
        let secs = waited.num_milliseconds().max(0) as f64 / 1000.0;
        self.approval_wait
            .get_or_create(&DecisionLabels {
                decision: decision.to_owned(),
            })
            .observe(secs);
    }

    /// The OpenMetrics text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Every bucket of `runs`, so a bucket that empties reads 0 instead of
/// keeping its last value.
pub(crate) const RUN_BUCKETS: [(&str, &str); 5] = [
    ("runnable", ""),
    ("parked", "awaiting_approval"),
    ("parked", "awaiting_tool"),
    ("parked", "awaiting_input"),
    ("parked", "paused"),
];
