//! Getting jobs onto the queue: the outbox relay and the reconciler.
//!
//! - [`relay`] publishes outbox jobs (written in the same transaction as the
//!   writes that cause them) with publisher confirms, then marks them done.
//!   A job published but not marked (crash in between) is published again:
//!   jobs are wake-ups, and a worker drops a duplicate or stale one, so
//!   at-least-once is safe. Several dispatchers may relay the same outbox.
//! - [`reconcile`] re-enqueues runs the log says have work but no live lease
//!   ([`glia_backends::Outbox::orphaned`]): the job was lost (broker
//!   restarted, dead-lettered) or the worker died and its lease lapsed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use glia_backends::{ApprovalFilter, Job, LogError, Orphan, QueueError};
use glia_proto::{ApprovalStatus, ApprovalTimeout, Decision, Payload};
use uuid::Uuid;

use crate::app::App;

/// Why a relay pass stopped early. Jobs confirmed before the failure are marked done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelayError {
    /// Reading or marking the outbox failed.
    #[error("relay: {0}")]
    Log(#[from] LogError),
    /// Publishing failed.
    #[error("relay: {0}")]
    Queue(#[from] QueueError),
}

/// One relay pass: take up to [`crate::Limits::relay_batch`] outbox jobs,
/// publish them (up to 32 in flight, each confirmed; the pass's resumes
/// first, so a decision posted while a big batch of admissions is relayed
/// does not wait for them), mark the confirmed ones done. Returns how many
/// were relayed. One pass at a time per [`App`] (the relay loop and the
/// reconciler's tick would otherwise publish the rows they both read).
pub async fn relay_once(app: &App) -> Result<usize, RelayError> {
    let _pass = app.relaying.lock().await;
    let mut jobs = app.log.outbox(app.limits.relay_batch).await?;
    if jobs.is_empty() {
        return Ok(0);
    }
    jobs.sort_by_key(|(_, job)| !job.resume);
    let results: Vec<(i64, Result<(), QueueError>)> = futures::stream::iter(jobs)
        .map(|(id, job)| async move { (id, app.queue.publish(&job).await) })
        .buffer_unordered(32)
        .collect()
        .await;
    let mut done = Vec::with_capacity(results.len());
    let mut failed = None;
    for (id, r) in results {
        match r {
            Ok(()) => done.push(id),
            Err(e) => failed = Some(e),
        }
    }
    if !done.is_empty() {
        app.log.outbox_done(&done).await?;
        app.metrics().jobs_relayed.inc_by(done.len() as u64);
    }
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(done.len()),
    }
}

/// Relay forever: a pass whenever the dispatcher wrote something
/// ([`App::wake_relay`]) and at least every [`crate::Limits::relay_poll`]
/// (default 10 ms; that catches jobs written by workers and other
/// dispatchers). Failures are logged and retried with backoff up to 5 s.
/// Never returns; abort the task to stop it.
pub async fn relay(app: App) {
    let mut backoff = Duration::ZERO;
    loop {
        match relay_once(&app).await {
            Ok(n) if n == app.limits.relay_batch => {
                backoff = Duration::ZERO;
                continue;
            }
            Ok(_) => backoff = Duration::ZERO,
            Err(e) => {
                app.metrics().relay_errors.inc();
                backoff = (backoff * 2).clamp(Duration::from_millis(50), Duration::from_secs(5));
                tracing::warn!("{e}; retrying in {} ms", backoff.as_millis());
                tokio::time::sleep(backoff).await;
                continue;
            }
        }
        tokio::select! {
            _ = app.woken() => {}
            _ = tokio::time::sleep(app.limits.relay_poll) => {}
        }
    }
}

/// Why a reconciler tick failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReconcileError {
    /// Reading orphaned runs failed.
    #[error("reconcile: {0}")]
    Log(#[from] LogError),
    /// Publishing a job failed.
    #[error("reconcile: {0}")]
    Queue(#[from] QueueError),
}

/// Orphaned runs looked at per tick.
pub const RECONCILE_BATCH: usize = 1000;

/// Re-enqueues orphaned runs, backing off per run.
///
/// A run reported orphaned is published when it has stayed orphaned at the
/// same head for `grace` since it was first seen, then again after twice as
/// long, four times, … up to [`MAX_REQUEUE_BACKOFF`].
///
/// An orphan that was started (its lease lapsed because its worker died
/// after acking the job, or a job on it was abandoned) has no job out: it
/// is published on that schedule whatever the queue holds. An orphan never
/// started ([`Orphan::queued`]), and any orphan once published here,
/// normally has its job in the queue, waiting its turn: it is published
/// (again) only once the queue has held no ready job for `grace` (every job
/// queued when the run was first seen has been handed out by then), or
/// when it has waited [`MAX_REQUEUE_BACKOFF`]. A backlog, or a fleet with no
/// worker consuming, therefore gains no duplicates, each of which would
/// cost a worker a refused lease; a job lost from a busy queue is found
/// again when the queue drains, or after [`MAX_REQUEUE_BACKOFF`]. With
/// `grace` zero every started orphan is published on every tick, and the
/// others on every tick the queue is empty.
pub struct Reconciler {
    app: App,
    grace: Duration,
    /// Run → (head seen, when it was last published or first seen, times published).
    seen: HashMap<Uuid, (u64, Instant, u32)>,
    /// Since when the queue has held no ready job, as of the last tick
    /// (`None`: it held some, or its depth could not be read).
    drained_since: Option<Instant>,
}

/// The longest wait between two re-enqueues of the same orphaned run.
pub const MAX_REQUEUE_BACKOFF: Duration = Duration::from_secs(300);

impl Reconciler {
    /// A reconciler over `app`.
    pub fn new(app: App, grace: Duration) -> Reconciler {
        Reconciler {
            app,
            grace,
            seen: HashMap::new(),
            drained_since: None,
        }
    }

    /// One pass: relay leftover outbox jobs, then publish the jobs of runs
    /// orphaned for at least `grace` (up to [`RECONCILE_BATCH`]). Returns the
    /// jobs published by the second step.
    pub async fn tick(&mut self) -> Result<Vec<Job>, ReconcileError> {
        if let Err(e) = relay_once(&self.app).await {
            tracing::warn!("reconciler: leftover outbox not relayed: {e}");
        }
        if let Err(e) = self.expire_approvals().await {
            tracing::warn!("reconciler: approvals not expired: {e}");
        }
        let orphans = self.app.log.orphaned(RECONCILE_BATCH).await?;
        let now = Instant::now();
        self.drained_since = match self.app.queue.depth().await {
            Ok(0) => Some(self.drained_since.unwrap_or(now)),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!("reconciler: queue depth not read: {e}");
                None
            }
        };
        let drained = self
            .drained_since
            .is_some_and(|since| now.duration_since(since) >= self.grace);
        let mut current = HashMap::with_capacity(orphans.len());
        let mut due = Vec::new();
        for Orphan { job, queued } in orphans {
            let (since, published) = match self.seen.get(&job.run_id) {
                Some((head, since, published)) if *head == job.head_seq => (*since, *published),
                _ => (now, 0),
            };
            let wait = if self.grace.is_zero() {
                Duration::ZERO
            } else {
                (self.grace * 2u32.saturating_pow(published.min(16)))
                    .min(MAX_REQUEUE_BACKOFF.max(self.grace))
            };
            // Its job presumably waits in the queue: its admission's, or
            // the one published here.
            let in_line = (queued || published > 0)
                && !drained
                && now.duration_since(since) < MAX_REQUEUE_BACKOFF;
            if now.duration_since(since) >= wait && !in_line {
                due.push(job);
                current.insert(job.run_id, (job.head_seq, now, published + 1));
            } else {
                current.insert(job.run_id, (job.head_seq, since, published));
            }
        }
        self.seen = current;
        let mut published = Vec::with_capacity(due.len());
        for job in due {
            if let Err(e) = self.app.queue.publish(&job).await {
                // Not published: look at it again next tick.
                self.seen.remove(&job.run_id);
                if published.is_empty() {
                    return Err(e.into());
                }
                tracing::warn!("reconciler: {e}");
                break;
            }
            tracing::info!(run_id = %job.run_id, head_seq = job.head_seq, "re-enqueued orphaned run");
            published.push(job);
        }
        self.app
            .metrics()
            .jobs_reconciled
            .inc_by(published.len() as u64);
        Ok(published)
    }
}

impl Reconciler {
    /// Approvals past their deadline: rejected (the model sees "approval
    /// expired") or escalated, as the run's `on_approval_timeout` says. A
    /// decision that lands first wins; the rejection is then a duplicate and
    /// ignored. Returns how many were handled.
    pub async fn expire_approvals(&mut self) -> Result<usize, LogError> {
        let filter = ApprovalFilter {
            expired_by: Some(chrono::Utc::now()),
            limit: RECONCILE_BATCH,
            ..ApprovalFilter::default()
        };
        let expired = self.app.log.approvals(&filter).await?;
        let mut handled = 0;
        for row in expired {
            let state = self.app.log.load(row.run_id).await?;
            // The request it concerns: the call's pending one, when the run
            // still waits on it.
            let request_seq = state
                .call(&row.call_id)
                .filter(|c| c.approval == ApprovalStatus::Requested)
                .and_then(|c| c.requested_seq);
            match state.config.on_approval_timeout {
                ApprovalTimeout::Escalate => {
                    // The event first (`approval.escalated`, recorded by a
                    // worker), then the row's flag: a crash in between
                    // posts again, and the duplicate is refused.
                    let payload = Payload::Escalate {
                        call_id: row.call_id.clone(),
                        request_seq,
                        expires_at: row.expires_at,
                    };
                    match self.app.log.post(row.run_id, payload).await {
                        Ok(_) | Err(LogError::Duplicate { .. }) => self.app.wake_relay(),
                        Err(e) => return Err(e),
                    }
                    self.app.log.escalate(row.run_id, &row.call_id).await?
                }
                ApprovalTimeout::Reject => {
                    let decision = Decision::Expire;
                    let payload = Payload::Approval {
                        call_id: row.call_id.clone(),
                        args_hash: row.args_hash.clone(),
                        decision,
                        by: Some("reconciler".into()),
                        request_seq,
                    };
                    match self.app.log.post(row.run_id, payload).await {
                        Ok(_) | Err(LogError::Duplicate { .. }) => self.app.wake_relay(),
                        // The run is ending anyway (its approvals close with it).
                        Err(LogError::Cancelled(_) | LogError::Finished(_)) => continue,
                        Err(e) => return Err(e),
                    }
                }
            }
            tracing::info!(run_id = %row.run_id, call_id = %row.call_id, action = ?state.config.on_approval_timeout, "approval expired");
            self.app
                .metrics()
                .approval_waited("expired", chrono::Utc::now() - row.requested_at);
            handled += 1;
        }
        Ok(handled)
    }
}

/// Reconcile forever, a [`Reconciler::tick`] every `every`, with `grace` =
/// `every`: a run orphaned for a whole period is re-enqueued. Failures are
/// logged. Never returns; abort the task to stop it.
pub async fn reconcile(app: App, every: Duration) {
    let mut r = Reconciler::new(app, every.mul_f64(0.9));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = r.tick().await {
            tracing::warn!("{e}");
        }
    }
}
