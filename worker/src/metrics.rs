//! A worker's Prometheus metrics (prometheus-client; OpenMetrics text served
//! by `glia worker --metrics-listen ADDR` at `/metrics`), and the GenAI
//! tracing spans of the runs it advances.
//!
//! Nothing here is called by the loop: [`RunObserver`] derives everything
//! from the events the worker's sink records (and the live deltas it
//! forwards), and [`crate::consumer::Worker`] counts its own job handling;
//! the one exception, HTTP hook calls (their outcome and latency are not
//! all in events), are reported by the loop's hook client through
//! [`glia_agent::http_hooks::HookObserver`].
//! Events are observed when the loop records them, so work that is
//! abandoned (lease lost) and redone elsewhere is counted twice — as the
//! model calls it made were.
//!
//! Labels are bounded: provider, model, tool, outcome and cause names —
//! never a run, call or tenant id. prometheus-client appends `_total` to
//! counters.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `glia_worker_runs_started_total` | counter | – | runs whose first step a worker recorded |
//! | `glia_worker_runs_completed_total` | counter | `outcome` (`succeeded`, `failed`, `cancelled`) | runs ended |
//! | `glia_worker_steps_total` | counter | – | plan steps ended |
//! | `glia_worker_model_calls_total` | counter | `provider`, `model`, `outcome` (`ok`, `transient`, `failed`, `paused`) | model calls, after the provider's own retries |
//! | `glia_worker_model_time_to_first_token_seconds` | histogram | `provider`, `model` | `model.call` → first streamed delta of the attempt that answered, of any channel (`text`, `thinking`, or `tool_call`: a tool call begun) |
//! | `glia_worker_model_duration_seconds` | histogram | `provider`, `model` | whole call (`model.response` `duration_ms`) |
//! | `glia_worker_model_tokens_total` | counter | `provider`, `model`, `kind` (`input`, `output`, `cache_write`, `cache_read`) | tokens used |
//! | `glia_worker_model_cost_usd_micros_total` | counter | `provider`, `model` | cost in USD micros (1 USD = 1,000,000) |
//! | `glia_worker_model_stops_total` | counter | `provider`, `model`, `stop` (the [`glia_proto::StopClass`] label: `answer`, `tool_use`, `truncated`, `empty`, `refusal`, `content_filter`, `context_window`, `unknown`), `action` (`proceed`, `reask`, `pause`, `fail`) | model answers by why the model stopped and what the loop did |
//! | `glia_worker_model_usage_estimated_total` | counter | `provider`, `model` | model answers whose usage glia estimated (the provider reported none) |
//! | `glia_worker_model_retries_total` | counter | `provider`, `model`, `cause` | failed attempts retried (`model.retry`) |
//! | `glia_worker_rate_limit_wait_seconds_total` | counter | `provider`, `model` | time waited before retrying a rate-limited attempt |
//! | `glia_worker_tool_calls_total` | counter | `tool`, `outcome` (`ok` or the `tool.error` kind) | tool calls finished |
//! | `glia_worker_tool_duration_seconds` | histogram | `tool` | active time of tools a worker ran |
//! | `glia_worker_approvals_requested_total` | counter | `tool` | calls parked for a person |
//! | `glia_worker_approvals_resolved_total` | counter | `decision` (`approve`, `reject`, `edit`) | decisions applied |
//! | `glia_worker_budget_pauses_total` | counter | `limit` | runs paused by a budget limit |
//! | `glia_worker_pauses_total` | counter | `pull_point` | runs parked, by pull point |
//! | `glia_worker_hook_calls_total` | counter | `hook`, `topic`, `outcome` (`answered`, `timed_out`, `unreachable`, `bad_status`, `bad_answer`) | calls of the catalogue's HTTP hooks (`glia_agent::http_hooks`); anything but `answered` had the hook's failure mode applied |
//! | `glia_worker_hook_duration_seconds` | histogram | `hook`, `topic` | seconds an HTTP hook call took (up to its timeout) |
//! | `glia_worker_jobs_total` | counter | `result` (`advanced`, `stale`, `held`, `gone`, `abandoned`, `retry`) | jobs handled |
//! | `glia_worker_job_lag_seconds` | histogram | – | job published → taken by this worker |
//! | `glia_worker_lease_takeovers_total` | counter | – | leases taken over after they lapsed unreleased |
//! | `glia_worker_busy_slots` | gauge | – | jobs in hand |
//! | `glia_worker_slots` | gauge | – | jobs this worker handles at once |
//!
//! Served alongside under their own names, without the `glia_worker_`
//! prefix (added through [`WorkerMetrics::registry_mut`]): the provider
//! adapter's `glia_provider_*` (`glia_providers::ProviderMetrics`).
//!
//! Spans (through `tracing`; exported over OTLP when an endpoint is
//! configured, see `glia-cli`'s `observe`) follow the OpenTelemetry GenAI
//! semantic conventions: `chat {model}` per model call
//! (`gen_ai.operation.name` = `chat`, `gen_ai.provider.name`,
//! `gen_ai.request.model`, `gen_ai.usage.input_tokens` (every input token,
//! cached ones included), `gen_ai.usage.output_tokens`,
//! `gen_ai.usage.cache_read.input_tokens`,
//! `gen_ai.usage.cache_creation.input_tokens`,
//! `gen_ai.response.finish_reasons` (the provider's stop reason),
//! `glia.cost_usd_micros`, `error.type` when it failed), `execute_tool
//! {tool}` per tool call a worker runs (`gen_ai.tool.name`,
//! `gen_ai.tool.call.id`, `error.type`: the `tool.error` kind), and `step
//! {index}` (`glia.step`) per plan step (one span per job that advances the
//! step: a step that parks ends its span) — all inside the worker's `job`
//! span, which carries `run_id` and `trace_id`; and at the run's end its
//! root span `invoke_agent {agent}`. How they form one trace per run:
//! [`crate::trace`]. No span carries content (goal, messages, step
//! descriptions, tool arguments or results).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use glia_proto::{Decision, Disposition, Event, EventKind, LiveEvent, RunState, StopClass, Usage};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tracing::Span;
use tracing::field::Empty;

/// Labels of model metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    /// Provider: `scripted`, `anthropic`, `openai`.
    pub provider: String,
    /// Model name from the run's config.
    pub model: String,
}

/// Labels of model metrics with one more dimension.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelOutcomeLabels {
    /// Provider.
    pub provider: String,
    /// Model.
    pub model: String,
    /// `ok`, `transient`, `failed`, `paused`.
    pub outcome: String,
}

/// Labels of `model_tokens_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    /// Provider.
    pub provider: String,
    /// Model.
    pub model: String,
    /// `input`, `output`, `cache_write`, `cache_read`.
    pub kind: String,
}

/// Labels of `model_stops_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StopLabels {
    /// Provider.
    pub provider: String,
    /// Model.
    pub model: String,
    /// The stop class label (`answer`, `truncated`, `refusal`, …; unknown
    /// provider words are `unknown`, so the set is bounded).
    pub stop: String,
    /// `proceed`, `reask`, `pause`, `fail`.
    pub action: String,
}

/// Labels of `model_retries_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryLabels {
    /// Provider.
    pub provider: String,
    /// Model.
    pub model: String,
    /// Short failure label: `rate_limited`, `overloaded`, `server`, `network`, …
    pub cause: String,
}

/// Labels of `tool_calls_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolLabels {
    /// Tool name.
    pub tool: String,
    /// `ok` or the error kind (`failed`, `invalid_arguments`, `rejected`, …).
    pub outcome: String,
}

/// One label, named by the metric (`tool`, `outcome`, `limit`, …).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolName {
    /// Tool name.
    pub tool: String,
}

/// Label `outcome`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `succeeded`, `failed`, `cancelled`.
    pub outcome: String,
}

/// Label `decision`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabel {
    /// `approve`, `reject`, `edit`.
    pub decision: String,
}

/// Label `limit`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    /// The budget limit, e.g. `turns`, `cost_usd_micros`, `tenant_daily_cost`.
    pub limit: String,
}

/// Label `pull_point`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PullPointLabel {
    /// `awaiting_tool`, `awaiting_approval`, `awaiting_input`, `paused`.
    pub pull_point: String,
}

/// Labels of `hook_calls_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HookLabels {
    /// The hook's catalogue name.
    pub hook: String,
    /// The topic (`before_tool_call`, …).
    pub topic: String,
    /// `answered`, `timed_out`, `unreachable`, `bad_status`, `bad_answer`.
    pub outcome: String,
}

/// Labels of `hook_duration_seconds`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HookTopicLabels {
    /// The hook's catalogue name.
    pub hook: String,
    /// The topic.
    pub topic: String,
}

/// Label `result`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabel {
    /// What became of the job: `advanced`, `stale`, `held`, `gone`, `abandoned`, `retry`.
    pub result: String,
}

type Hist<L> = Family<L, Histogram, fn() -> Histogram>;

fn model_buckets() -> Histogram {
    // 10 ms … ~5.5 min.
    Histogram::new(exponential_buckets(0.01, 2.0, 16))
}

fn short_buckets() -> Histogram {
    // 1 ms … ~16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// The worker's metric handles and their registry. Share it in an `Arc`.
pub struct WorkerMetrics {
    registry: Registry,
    provider: String,
    /// Runs whose first step a worker recorded.
    pub runs_started: Counter,
    /// Runs ended, by outcome.
    pub runs_completed: Family<OutcomeLabel, Counter>,
    /// Plan steps ended.
    pub steps: Counter,
    /// Model calls by outcome.
    pub model_calls: Family<ModelOutcomeLabels, Counter>,
    /// Seconds from `model.call` to the first streamed delta.
    pub model_ttft: Hist<ModelLabels>,
    /// Seconds a model call took.
    pub model_duration: Hist<ModelLabels>,
    /// Tokens by kind.
    pub model_tokens: Family<TokenLabels, Counter>,
    /// Cost in USD micros.
    pub model_cost: Family<ModelLabels, Counter>,
    /// Model answers by stop class and the loop's action.
    pub model_stops: Family<StopLabels, Counter>,
    /// Model answers whose usage was estimated.
    pub model_usage_estimated: Family<ModelLabels, Counter>,
    /// Retried attempts by cause.
    pub model_retries: Family<RetryLabels, Counter>,
    /// Seconds waited before retrying rate-limited attempts.
    pub rate_limit_wait: Family<ModelLabels, Counter<f64>>,
    /// Tool calls by tool and outcome.
    pub tool_calls: Family<ToolLabels, Counter>,
    /// Seconds of tool execution.
    pub tool_duration: Hist<ToolName>,
    /// Approvals requested, by tool.
    pub approvals_requested: Family<ToolName, Counter>,
    /// Approvals resolved, by decision.
    pub approvals_resolved: Family<DecisionLabel, Counter>,
    /// Budget pauses by limit.
    pub budget_pauses: Family<LimitLabel, Counter>,
    /// Runs parked, by pull point.
    pub pauses: Family<PullPointLabel, Counter>,
    /// HTTP hook calls, by hook, topic and outcome.
    pub hook_calls: Family<HookLabels, Counter>,
    /// Seconds of HTTP hook calls, by hook and topic.
    pub hook_duration: Hist<HookTopicLabels>,
    /// Jobs handled, by result.
    pub jobs: Family<JobLabel, Counter>,
    /// Seconds from publish to take.
    pub job_lag: Histogram,
    /// Lapsed leases taken over.
    pub lease_takeovers: Counter,
    /// Jobs in hand.
    pub busy_slots: Gauge,
    /// Jobs handled at once.
    pub slots: Gauge,
}

impl WorkerMetrics {
    /// Fresh handles, registered under `glia_worker_`; `provider` labels
    /// every model metric (a worker talks to one provider: `scripted`,
    /// `anthropic`, `openai`).
    pub fn new(provider: &str) -> WorkerMetrics {
        // The prefix is a sub-registry's: what is added through
        // `registry_mut` keeps its own name.
        let mut registry = Registry::default();
        let m = WorkerMetrics {
            registry: Registry::default(),
            provider: provider.to_owned(),
            runs_started: Counter::default(),
            runs_completed: Family::default(),
            steps: Counter::default(),
            model_calls: Family::default(),
            model_ttft: Family::new_with_constructor(model_buckets as fn() -> Histogram),
            model_duration: Family::new_with_constructor(model_buckets as fn() -> Histogram),
            model_tokens: Family::default(),
            model_cost: Family::default(),
            model_stops: Family::default(),
            model_usage_estimated: Family::default(),
            model_retries: Family::default(),
            rate_limit_wait: Family::default(),
            tool_calls: Family::default(),
            tool_duration: Family::new_with_constructor(short_buckets as fn() -> Histogram),
            approvals_requested: Family::default(),
            approvals_resolved: Family::default(),
            budget_pauses: Family::default(),
            pauses: Family::default(),
            hook_calls: Family::default(),
            hook_duration: Family::new_with_constructor(short_buckets as fn() -> Histogram),
            jobs: Family::default(),
            job_lag: short_buckets(),
            lease_takeovers: Counter::default(),
            busy_slots: Gauge::default(),
            slots: Gauge::default(),
        };
        let r = registry.sub_registry_with_prefix("glia_worker");
        r.register(
            "runs_started",
            "Runs whose first step a worker recorded",
            m.runs_started.clone(),
        );
        r.register(
            "runs_completed",
            "Runs ended, by outcome (succeeded, failed, cancelled)",
            m.runs_completed.clone(),
        );
        r.register("steps", "Plan steps ended", m.steps.clone());
        r.register("model_calls", "Model calls by provider, model and outcome (ok, transient, failed, paused), after provider retries", m.model_calls.clone());
        r.register(
            "model_time_to_first_token_seconds",
            "Seconds from the model call to the first streamed delta of the attempt that answered",
            m.model_ttft.clone(),
        );
        r.register(
            "model_duration_seconds",
            "Seconds a model call took, retries included",
            m.model_duration.clone(),
        );
        r.register(
            "model_tokens",
            "Tokens used by model calls, by kind (input, output, cache_write, cache_read)",
            m.model_tokens.clone(),
        );
        r.register(
            "model_cost_usd_micros",
            "Cost of model calls in USD micros (1 USD = 1,000,000)",
            m.model_cost.clone(),
        );
        r.register("model_stops", "Model answers by stop class (answer, tool_use, truncated, empty, refusal, content_filter, context_window, unknown) and the loop's action (proceed, reask, pause, fail)", m.model_stops.clone());
        r.register(
            "model_usage_estimated",
            "Model answers whose token usage glia estimated because the provider reported none",
            m.model_usage_estimated.clone(),
        );
        r.register(
            "model_retries",
            "Failed model call attempts that were retried, by cause",
            m.model_retries.clone(),
        );
        r.register(
            "rate_limit_wait_seconds",
            "Seconds waited before retrying rate-limited model call attempts",
            m.rate_limit_wait.clone(),
        );
        r.register(
            "tool_calls",
            "Tool calls finished, by tool and outcome (ok or the tool.error kind)",
            m.tool_calls.clone(),
        );
        r.register(
            "tool_duration_seconds",
            "Seconds of tool execution on the worker, by tool",
            m.tool_duration.clone(),
        );
        r.register(
            "approvals_requested",
            "Tool calls parked for a person's approval, by tool",
            m.approvals_requested.clone(),
        );
        r.register(
            "approvals_resolved",
            "Approval decisions applied to runs, by decision",
            m.approvals_resolved.clone(),
        );
        r.register(
            "budget_pauses",
            "Runs paused because a budget limit was reached, by limit",
            m.budget_pauses.clone(),
        );
        r.register("pauses", "Runs parked, by pull point", m.pauses.clone());
        r.register(
            "hook_calls",
            "Calls of the catalogue's HTTP hooks, by hook, topic and outcome (answered, timed_out, unreachable, bad_status, bad_answer)",
            m.hook_calls.clone(),
        );
        r.register(
            "hook_duration_seconds",
            "Seconds an HTTP hook call took, by hook and topic",
            m.hook_duration.clone(),
        );
        r.register(
            "jobs",
            "Jobs handled, by result (advanced, stale, held, gone, abandoned, retry)",
            m.jobs.clone(),
        );
        r.register(
            "job_lag_seconds",
            "Seconds from a job's publication to a worker taking it",
            m.job_lag.clone(),
        );
        r.register(
            "lease_takeovers",
            "Run leases taken over after their holder let them lapse",
            m.lease_takeovers.clone(),
        );
        r.register(
            "busy_slots",
            "Jobs this worker has in hand",
            m.busy_slots.clone(),
        );
        r.register(
            "slots",
            "Jobs this worker handles at once (its concurrency)",
            m.slots.clone(),
        );
        WorkerMetrics { registry, ..m }
    }

    /// The registry, to add more metrics before the handles are shared,
    /// under their own names (no `glia_worker_` prefix): the provider
    /// adapter's `glia_provider_*` (`glia_providers::ProviderMetrics`).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// The OpenMetrics text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Count one handled job.
    pub fn job(&self, result: &str) {
        self.jobs
            .get_or_create(&JobLabel {
                result: result.to_owned(),
            })
            .inc();
    }

    fn model(&self, model: &str) -> ModelLabels {
        ModelLabels {
            provider: self.provider.clone(),
            model: model.to_owned(),
        }
    }

    fn model_call(&self, model: &str, outcome: &str) {
        self.model_calls
            .get_or_create(&ModelOutcomeLabels {
                provider: self.provider.clone(),
                model: model.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }
}

/// The span of plan step `index` (in the current span: the job's).
fn step_span(index: usize) -> Span {
    tracing::info_span!(
        "glia.step",
        otel.name = %format!("step {index}"),
        "glia.step.index" = as_i64(index as u64)
    )
}

/// A count as a signed integer, the type OpenTelemetry attributes take
/// (tracing's `u64` would be exported as text).
fn as_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The model call in flight, between `model.call` and its end.
struct InFlight {
    started: Instant,
    first_token: Option<Duration>,
    span: Span,
}

/// HTTP hook calls are counted here: the loop's hook client reports each
/// (`glia_agent::http_hooks::HttpHooks::with_observer`).
impl glia_agent::http_hooks::HookObserver for WorkerMetrics {
    fn observed(
        &self,
        hook: &str,
        topic: glia_proto::HookTopic,
        outcome: glia_proto::HookOutcome,
        elapsed: Duration,
    ) {
        self.hook_calls
            .get_or_create(&HookLabels {
                hook: hook.to_owned(),
                topic: topic.name().to_owned(),
                outcome: outcome.name().to_owned(),
            })
            .inc();
        self.hook_duration
            .get_or_create(&HookTopicLabels {
                hook: hook.to_owned(),
                topic: topic.name().to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }
}

/// Watches one run's recorded events and live deltas for a worker: counts
/// them in [`WorkerMetrics`] (when given), logs each at debug level with its
/// `seq`, and opens and closes the GenAI spans (see the module docs).
pub struct RunObserver {
    metrics: Option<Arc<WorkerMetrics>>,
    provider: String,
    model: String,
    run_id: uuid::Uuid,
    agent: Option<glia_proto::AgentRef>,
    /// The run's tokens and cost (USD micros) so far, for its root span.
    usage: Usage,
    cost_usd_micros: u64,
    /// Tool name by call id: the calls pending when the observer was made,
    /// and those recorded since.
    tools: HashMap<String, String>,
    /// The calls a client answers (`awaiting_tool`): no worker runs them.
    external: std::collections::HashSet<String>,
    in_flight: Mutex<Option<InFlight>>,
    step: Option<Span>,
    tool_spans: HashMap<String, (Span, Instant)>,
}

impl RunObserver {
    /// An observer of the run in `state` (its model and pending calls).
    pub fn new(metrics: Option<Arc<WorkerMetrics>>, state: &RunState) -> RunObserver {
        // A run on a catalogue provider is labelled with its name (the
        // operator's catalogue: a bounded set); others with the worker's.
        let provider = state.config.provider.clone().unwrap_or_else(|| {
            metrics
                .as_ref()
                .map_or_else(String::new, |m| m.provider.clone())
        });
        RunObserver {
            metrics,
            provider,
            model: state.config.model.clone(),
            run_id: state.run_id,
            agent: state.config.agent.clone(),
            usage: state.usage.tokens,
            cost_usd_micros: state.usage.cost_usd_micros,
            tools: state
                .pending_calls
                .iter()
                .map(|c| (c.call_id.clone(), c.name.clone()))
                .collect(),
            external: state
                .pending_calls
                .iter()
                .filter(|c| c.external)
                .map(|c| c.call_id.clone())
                .collect(),
            in_flight: Mutex::new(None),
            // A step under way when the job began goes on in a span of this job.
            step: state
                .step
                .filter(|_| state.outcome.is_none())
                .map(step_span),
            tool_spans: HashMap::new(),
        }
    }

    /// Label model calls with `provider` when neither the run (a catalogue
    /// provider) nor the metrics name one.
    pub fn with_default_provider(mut self, provider: &str) -> RunObserver {
        if self.provider.is_empty() {
            provider.clone_into(&mut self.provider);
        }
        self
    }

    /// The span a model or tool call belongs to: the current step's, else
    /// the current one (the worker's `job` span).
    fn parent(&self) -> Option<tracing::Id> {
        self.step
            .as_ref()
            .and_then(Span::id)
            .or_else(|| Span::current().id())
    }

    fn tool_name(&self, call_id: &str) -> String {
        self.tools
            .get(call_id)
            .cloned()
            .unwrap_or_else(|| "unknown".into())
    }

    /// Observe one recorded event.
    pub fn record(&mut self, event: &Event) {
        tracing::debug!(target: "glia_worker::run", seq = event.seq, event = event.kind.name(), "recorded");
        let m = self.metrics.clone();
        let m = m.as_deref();
        if event.seq == 2
            && let Some(m) = m
        {
            m.runs_started.inc();
        }
        if let Some((usage, cost)) = event.kind.spend() {
            self.usage += *usage;
            self.cost_usd_micros += cost;
        }
        match &event.kind {
            EventKind::StepStart { index, .. } => self.step = Some(step_span(*index)),
            EventKind::StepEnd { .. } => {
                self.step = None;
                if let Some(m) = m {
                    m.steps.inc();
                }
            }
            EventKind::ModelCall { model, .. } => {
                self.model.clone_from(model);
                let span = tracing::info_span!(
                    parent: self.parent(),
                    "chat",
                    otel.name = %format!("chat {model}"),
                    otel.kind = "client",
                    otel.status_code = Empty,
                    "gen_ai.operation.name" = "chat",
                    "gen_ai.provider.name" = %self.provider,
                    "gen_ai.request.model" = %model,
                    "gen_ai.usage.input_tokens" = Empty,
                    "gen_ai.usage.output_tokens" = Empty,
                    "gen_ai.usage.cache_read.input_tokens" = Empty,
                    "gen_ai.usage.cache_creation.input_tokens" = Empty,
                    "gen_ai.response.finish_reasons" = Empty,
                    "glia.cost_usd_micros" = Empty,
                    "error.type" = Empty,
                );
                *self.in_flight.lock().unwrap_or_else(|e| e.into_inner()) = Some(InFlight {
                    started: Instant::now(),
                    first_token: None,
                    span,
                });
            }
            EventKind::ModelRetry(retry) => {
                if let Some(m) = m {
                    m.model_retries
                        .get_or_create(&RetryLabels {
                            provider: self.provider.clone(),
                            model: self.model.clone(),
                            cause: retry.cause.clone(),
                        })
                        .inc();
                    if retry.cause == "rate_limited" {
                        m.rate_limit_wait
                            .get_or_create(&m.model(&self.model))
                            .inc_by(retry.delay_ms as f64 / 1000.0);
                    }
                }
            }
            EventKind::ModelResponse {
                message,
                usage,
                stop_reason,
                duration_ms,
                cost_usd_micros,
                rejected,
                ..
            } => {
                let call = self
                    .in_flight
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
                if let Some(call) = &call {
                    let span = &call.span;
                    span.record(
                        "gen_ai.usage.input_tokens",
                        as_i64(crate::trace::input_tokens(usage)),
                    );
                    span.record("gen_ai.usage.output_tokens", as_i64(usage.output_tokens));
                    span.record(
                        "gen_ai.usage.cache_read.input_tokens",
                        as_i64(usage.cache_read_tokens),
                    );
                    span.record(
                        "gen_ai.usage.cache_creation.input_tokens",
                        as_i64(usage.cache_write_tokens),
                    );
                    span.record("gen_ai.response.finish_reasons", stop_reason.as_str());
                    span.record("glia.cost_usd_micros", as_i64(*cost_usd_micros));
                    if let Some(r) = rejected {
                        span.record("error.type", r.class.label());
                    }
                }
                if let Some(m) = m {
                    let labels = m.model(&self.model);
                    m.model_call(&self.model, "ok");
                    m.model_duration
                        .get_or_create(&labels)
                        .observe(*duration_ms as f64 / 1000.0);
                    if let Some(ttft) = call.and_then(|c| c.first_token) {
                        m.model_ttft
                            .get_or_create(&labels)
                            .observe(ttft.as_secs_f64());
                    }
                    m.model_cost.get_or_create(&labels).inc_by(*cost_usd_micros);
                    let stop = rejected
                        .as_ref()
                        .map_or_else(|| StopClass::of(stop_reason, message), |r| r.class);
                    let action = rejected.as_ref().map_or("proceed", |r| r.action.label());
                    m.model_stops
                        .get_or_create(&StopLabels {
                            provider: self.provider.clone(),
                            model: self.model.clone(),
                            stop: stop.label().into(),
                            action: action.into(),
                        })
                        .inc();
                    if usage.estimated {
                        m.model_usage_estimated.get_or_create(&labels).inc();
                    }
                    for (kind, n) in [
                        ("input", usage.input_tokens),
                        ("output", usage.output_tokens),
                        ("cache_write", usage.cache_write_tokens),
                        ("cache_read", usage.cache_read_tokens),
                    ] {
                        m.model_tokens
                            .get_or_create(&TokenLabels {
                                provider: self.provider.clone(),
                                model: self.model.clone(),
                                kind: kind.into(),
                            })
                            .inc_by(n);
                    }
                }
            }
            EventKind::Error { fatal, message } => {
                // (`message` is the formatted text's key: the error's is `error`.)
                tracing::warn!(target: "glia_worker::run", seq = event.seq, fatal, error = %message, "run error recorded");
                self.end_model_call(m, if *fatal { "failed" } else { "transient" });
            }
            EventKind::ToolCall(call) => {
                self.tools.insert(call.call_id.clone(), call.name.clone());
                match call.disposition {
                    Disposition::Run { .. } => self.tool_started(&call.call_id),
                    Disposition::External => {
                        self.external.insert(call.call_id.clone());
                    }
                    _ => {}
                }
            }
            EventKind::ToolResult {
                call_id,
                duration_ms,
                ..
            } => {
                let tool = self.tool_name(call_id);
                let ran = self.tool_spans.remove(call_id).is_some();
                if let Some(m) = m {
                    m.tool_calls
                        .get_or_create(&ToolLabels {
                            tool: tool.clone(),
                            outcome: "ok".into(),
                        })
                        .inc();
                    if ran {
                        m.tool_duration
                            .get_or_create(&ToolName { tool })
                            .observe(*duration_ms as f64 / 1000.0);
                    }
                }
            }
            EventKind::ToolError {
                call_id,
                error,
                duration_ms,
                ..
            } => {
                let tool = self.tool_name(call_id);
                let kind = serde_json::to_value(error)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_else(|| "unknown".into());
                let ran = self.tool_spans.remove(call_id).inspect(|(span, _)| {
                    span.record("error.type", kind.as_str());
                    span.record("otel.status_code", "ERROR");
                });
                if let Some(m) = m {
                    m.tool_calls
                        .get_or_create(&ToolLabels {
                            tool: tool.clone(),
                            outcome: kind,
                        })
                        .inc();
                    if ran.is_some() {
                        m.tool_duration
                            .get_or_create(&ToolName { tool })
                            .observe(*duration_ms as f64 / 1000.0);
                    }
                }
            }
            EventKind::ApprovalRequested { tool, .. } => {
                if let Some(m) = m {
                    m.approvals_requested
                        .get_or_create(&ToolName { tool: tool.clone() })
                        .inc();
                }
            }
            EventKind::ApprovalResolved {
                call_id, decision, ..
            } => {
                // An approved call runs on the worker next (unless a client runs it).
                if matches!(decision, Decision::Approve | Decision::Edit { .. })
                    && !self.external.contains(call_id)
                {
                    self.tool_started(call_id);
                }
                let decision = match decision {
                    Decision::Approve => "approve",
                    Decision::Reject { .. } => "reject",
                    Decision::Expire => "expire",
                    Decision::Edit { .. } => "edit",
                };
                if let Some(m) = m {
                    m.approvals_resolved
                        .get_or_create(&DecisionLabel {
                            decision: decision.into(),
                        })
                        .inc();
                }
            }
            EventKind::BudgetWarn { limit, .. } => {
                if let Some(m) = m {
                    m.budget_pauses
                        .get_or_create(&LimitLabel {
                            limit: limit.to_string(),
                        })
                        .inc();
                }
            }
            EventKind::SessionPause { pull_point } => {
                tracing::info!(target: "glia_worker::run", seq = event.seq, pull_point = pull_point.name(), "run parked");
                // A spend cap or a rejected key pauses the run mid-call.
                self.end_model_call(m, "paused");
                if let Some(m) = m {
                    m.pauses
                        .get_or_create(&PullPointLabel {
                            pull_point: pull_point.name().into(),
                        })
                        .inc();
                }
            }
            EventKind::SessionCancel { .. } => self.completed(m, event.seq, "cancelled"),
            EventKind::SessionComplete { outcome } => {
                self.completed(m, event.seq, crate::trace::outcome_label(outcome));
            }
            _ => {}
        }
    }

    /// A tool call the worker runs now: its `execute_tool` span opens.
    fn tool_started(&mut self, call_id: &str) {
        let name = self.tool_name(call_id);
        let span = tracing::info_span!(
            parent: self.parent(),
            "execute_tool",
            otel.name = %format!("execute_tool {name}"),
            otel.status_code = Empty,
            "gen_ai.operation.name" = "execute_tool",
            "gen_ai.tool.name" = %name,
            "gen_ai.tool.call.id" = %call_id,
            "gen_ai.tool.type" = "function",
            "error.type" = Empty,
        );
        self.tool_spans
            .insert(call_id.to_owned(), (span, Instant::now()));
    }

    fn completed(&mut self, m: Option<&WorkerMetrics>, seq: u64, outcome: &str) {
        tracing::info!(target: "glia_worker::run", seq, outcome, "run ended");
        self.step = None;
        crate::trace::export_run_span(&crate::trace::RunSummary {
            run_id: self.run_id,
            agent: self.agent.as_ref().map(|a| a.name.as_str()),
            agent_version: self.agent.as_ref().map(|a| a.version),
            provider: &self.provider,
            model: &self.model,
            usage: self.usage,
            cost_usd_micros: self.cost_usd_micros,
            outcome,
        });
        if let Some(m) = m {
            m.runs_completed
                .get_or_create(&OutcomeLabel {
                    outcome: outcome.into(),
                })
                .inc();
        }
    }

    /// A model call in flight ended without an answer.
    fn end_model_call(&self, m: Option<&WorkerMetrics>, outcome: &str) {
        let Some(call) = self
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        call.span.record("error.type", outcome);
        call.span.record("otel.status_code", "ERROR");
        if let Some(m) = m {
            m.model_call(&self.model, outcome);
            m.model_duration
                .get_or_create(&m.model(&self.model))
                .observe(call.started.elapsed().as_secs_f64());
        }
    }

    /// Observe one live event: the first delta of a call, of any channel
    /// (text, thinking, a tool call begun), is its time to first token; a
    /// discard (the attempt failed) starts that over.
    pub fn live(&self, event: &LiveEvent) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        let Some(call) = in_flight.as_mut() else {
            return;
        };
        match event {
            LiveEvent::ModelDelta { .. } if call.first_token.is_none() => {
                call.first_token = Some(call.started.elapsed())
            }
            LiveEvent::ModelDiscard { .. } => call.first_token = None,
            _ => {}
        }
    }
}
