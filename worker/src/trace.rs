//! A run's trace: how the spans a worker opens for a run
//! ([`crate::metrics::RunObserver`] and the job span) join one
//! OpenTelemetry trace whatever process and job they come from.
//!
//! - **Trace id** = the run id's 16 bytes ([`trace_id`]; as text
//!   `run_id.simple()`, the run view's `trace_id`): every span of a run, in
//!   every job on every worker, is in that one trace.
//! - **The run span** — `invoke_agent {agent}` (`gen_ai.operation.name` =
//!   `invoke_agent`): the root, with a span id derived from the run id
//!   ([`run_span_id`]), from the run's creation (the time in its UUIDv7) to
//!   its end. It is exported once, by the worker that records the run's end
//!   ([`export_run_span`]); until then the trace's job spans point at a
//!   parent that is still to come.
//! - **Job spans** — `job`, one per job a worker handles for the run
//!   ([`job_span`]), children of the run span: `run_id`, `trace_id`,
//!   `head_seq`, `via`, `worker`. Their log lines carry the same fields.
//! - Under a job: `step {index}` (`glia.step`), and under the step (else
//!   the job) `chat {model}` per model call and `execute_tool {tool}` per
//!   tool call the worker runs ([`crate::metrics`]).
//!
//! No span carries the goal, messages, tool arguments or results, step
//! descriptions, or anything from a request's headers: only names, ids,
//! counts, durations and outcomes.
//!
//! Without an OpenTelemetry layer in the process (no OTLP endpoint
//! configured) nothing here costs more than a `tracing` span: the parent is
//! not set and the run span's tracer is the no-op global one.

use std::time::SystemTime;

use glia_proto::{Outcome, Usage};
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer,
};
use opentelemetry::{Context, KeyValue};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use uuid::Uuid;

/// The trace id of every span of run `run_id`: its 16 bytes.
pub fn trace_id(run_id: Uuid) -> TraceId {
    TraceId::from_bytes(*run_id.as_bytes())
}

/// The span id of run `run_id`'s root span: the run id's last 8 bytes (the
/// random part of a UUIDv7), or 1 in the (impossible for a v7 id) case
/// they are all zero, which is not a valid span id.
pub fn run_span_id(run_id: Uuid) -> SpanId {
    let bytes = run_id.as_bytes();
    let mut low = [0u8; 8];
    low.copy_from_slice(&bytes[8..]);
    if low == [0; 8] {
        low[7] = 1;
    }
    SpanId::from_bytes(low)
}

/// The context of run `run_id`'s root span, as a remote parent (sampled):
/// spans opened under it join the run's trace.
pub fn run_context(run_id: Uuid) -> Context {
    Context::new().with_remote_span_context(SpanContext::new(
        trace_id(run_id),
        run_span_id(run_id),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    ))
}

/// The span of one job of run `run_id`, a child of the run's root span.
/// `head_seq` is the job's, `via` where it came from (`queue`, `hint`).
pub fn job_span(run_id: Uuid, head_seq: u64, via: &str, worker: &str) -> Span {
    let span = tracing::info_span!(
        "job",
        run_id = %run_id,
        trace_id = %run_id.simple(),
        head_seq = i64::try_from(head_seq).unwrap_or(i64::MAX),
        via,
        worker,
        "gen_ai.conversation.id" = %run_id,
    );
    // Fails only without an OpenTelemetry layer: nothing to join then.
    let _ = span.set_parent(run_context(run_id));
    span
}

/// What the run span says about a run, gathered by the worker's observer.
pub struct RunSummary<'a> {
    /// The run.
    pub run_id: Uuid,
    /// The agent definition's name, if the run was admitted with one.
    pub agent: Option<&'a str>,
    /// The agent definition's version.
    pub agent_version: Option<u32>,
    /// The provider label (`scripted`, `anthropic`, a catalogue name).
    pub provider: &'a str,
    /// The model of the run's config.
    pub model: &'a str,
    /// Tokens of the whole run.
    pub usage: Usage,
    /// Cost of the whole run, USD micros.
    pub cost_usd_micros: u64,
    /// `succeeded`, `failed` or `cancelled`.
    pub outcome: &'a str,
}

/// The outcome's label: `succeeded`, `failed`, `cancelled`.
pub fn outcome_label(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Succeeded { .. } => "succeeded",
        Outcome::Failed { .. } => "failed",
        Outcome::Cancelled { .. } => "cancelled",
    }
}

/// The GenAI input token count of `usage`: every input token, cached ones
/// included (glia's `input_tokens` are the uncached ones).
pub fn input_tokens(usage: &Usage) -> u64 {
    usage.input_tokens + usage.cache_read_tokens + usage.cache_write_tokens
}

/// Export the run's root span (see the module docs), from the run's
/// creation (its UUIDv7's time; now for an id without one) to now, through
/// the global tracer provider: a no-op when none is installed.
pub fn export_run_span(run: &RunSummary<'_>) {
    let tracer = opentelemetry::global::tracer("glia");
    let now = SystemTime::now();
    let started = run
        .run_id
        .get_timestamp()
        .map(|t| {
            let (secs, nanos) = t.to_unix();
            SystemTime::UNIX_EPOCH + std::time::Duration::new(secs, nanos)
        })
        .filter(|t| *t <= now)
        .unwrap_or(now);
    let agent = run.agent.unwrap_or("glia");
    let mut attributes = vec![
        KeyValue::new("gen_ai.operation.name", "invoke_agent"),
        KeyValue::new("gen_ai.agent.name", agent.to_owned()),
        KeyValue::new("gen_ai.conversation.id", run.run_id.to_string()),
        KeyValue::new("gen_ai.provider.name", run.provider.to_owned()),
        KeyValue::new("gen_ai.request.model", run.model.to_owned()),
        KeyValue::new(
            "gen_ai.usage.input_tokens",
            as_i64(input_tokens(&run.usage)),
        ),
        KeyValue::new(
            "gen_ai.usage.output_tokens",
            as_i64(run.usage.output_tokens),
        ),
        KeyValue::new(
            "gen_ai.usage.cache_read.input_tokens",
            as_i64(run.usage.cache_read_tokens),
        ),
        KeyValue::new(
            "gen_ai.usage.cache_creation.input_tokens",
            as_i64(run.usage.cache_write_tokens),
        ),
        KeyValue::new("glia.run.id", run.run_id.to_string()),
        KeyValue::new("glia.run.outcome", run.outcome.to_owned()),
        KeyValue::new("glia.cost_usd_micros", as_i64(run.cost_usd_micros)),
    ];
    if let Some(v) = run.agent_version {
        attributes.push(KeyValue::new("gen_ai.agent.version", v.to_string()));
    }
    let failed = run.outcome != "succeeded";
    if failed {
        attributes.push(KeyValue::new("error.type", run.outcome.to_owned()));
    }
    let mut span = tracer
        .span_builder(format!("invoke_agent {agent}"))
        .with_kind(SpanKind::Internal)
        .with_trace_id(trace_id(run.run_id))
        .with_span_id(run_span_id(run.run_id))
        .with_start_time(started)
        .with_attributes(attributes)
        .with_status(if failed {
            Status::error(run.outcome.to_owned())
        } else {
            Status::Ok
        })
        .start_with_context(&tracer, &Context::new());
    opentelemetry::trace::Span::end_with_timestamp(&mut span, now);
}

/// A count as an OpenTelemetry integer attribute (saturating).
fn as_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_id_is_the_run_id() {
        let run_id = Uuid::now_v7();
        assert_eq!(trace_id(run_id).to_string(), run_id.simple().to_string());
        let span_id = run_span_id(run_id);
        assert_eq!(span_id.to_string(), run_id.simple().to_string()[16..]);
        assert_ne!(run_span_id(Uuid::nil()), SpanId::INVALID);
        let cx = run_context(run_id);
        let sc = cx.span().span_context().clone();
        assert!(sc.is_valid() && sc.is_remote() && sc.is_sampled());
        assert_eq!(sc.trace_id(), trace_id(run_id));
    }
}
