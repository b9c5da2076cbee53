//! The gauges sampled from the stores (runs by status, batch items, the
//! outbox, approvals): [`sample`], a background task of `glia dispatcher`.

use std::time::Duration;

use glia_backends::RunGaugeKey;

use crate::app::App;
use crate::metrics::*;
use crate::model::batches::BatchCounts;

/// Refresh the sampled gauges once: [`glia_backends::Reports::gauges`] and
/// [`glia_backends::JobQueue::stats`]. A failing source is counted in
/// `sample_errors_total` and its gauges keep their last values.
pub async fn sample_once(app: &App) {
    let m = app.metrics();
    match app.log.gauges(chrono::Utc::now()).await {
        Ok(g) => {
            for (status, pull_point) in RUN_BUCKETS {
                let key = RunGaugeKey {
                    status,
                    pull_point: pull_point.to_owned(),
                };
                let n = g.runs.get(&key).copied().unwrap_or(0);
                m.runs
                    .get_or_create(&RunLabels {
                        status: status.to_owned(),
                        pull_point: pull_point.to_owned(),
                    })
                    .set(n as i64);
            }
            m.approvals_pending.set(g.approvals_pending as i64);
            m.approvals_overdue.set(g.approvals_overdue as i64);
            m.approval_oldest_age.set(g.oldest_approval_age_seconds);
        }
        Err(e) => {
            tracing::warn!("metrics: sampling the event log failed: {e}");
            m.sample_errors
                .get_or_create(&SourceLabels {
                    source: "log".into(),
                })
                .inc();
        }
    }
    if let Some(store) = &app.batches.store {
        match store.gauges().await {
            Ok(by_status) => {
                let counts = BatchCounts::of(&by_status);
                let set = |state: &str, pull_point: &str, n: u64| {
                    m.batch_items
                        .get_or_create(&BatchItemLabels {
                            state: state.to_owned(),
                            pull_point: pull_point.to_owned(),
                        })
                        .set(n as i64);
                };
                for (state, n) in [
                    ("queued", counts.queued),
                    ("running", counts.running),
                    ("succeeded", counts.succeeded),
                    ("failed", counts.failed),
                    ("cancelled", counts.cancelled),
                    ("expired", counts.expired),
                ] {
                    set(state, "", n);
                }
                for pull_point in [
                    "awaiting_approval",
                    "awaiting_tool",
                    "awaiting_input",
                    "paused",
                ] {
                    set(
                        "parked",
                        pull_point,
                        counts.parked.get(pull_point).copied().unwrap_or(0),
                    );
                }
            }
            Err(e) => {
                tracing::warn!("metrics: sampling batches failed: {e}");
                m.sample_errors
                    .get_or_create(&SourceLabels {
                        source: "batches".into(),
                    })
                    .inc();
            }
        }
    }
    match app.queue.stats().await {
        Ok(q) => {
            m.queue_messages.set(q.ready as i64);
            if let Some(c) = q.consumers {
                m.queue_consumers.set(c as i64);
            }
            if let Some(d) = q.dead_lettered {
                m.queue_dead_lettered.set(d as i64);
            }
        }
        Err(e) => {
            tracing::warn!("metrics: sampling the job queue failed: {e}");
            m.sample_errors
                .get_or_create(&SourceLabels {
                    source: "queue".into(),
                })
                .inc();
        }
    }
}

/// Refresh the sampled gauges every `every` ([`sample_once`]). Never
/// returns; abort the task to stop it.
pub async fn sample(app: App, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        sample_once(&app).await;
    }
}
