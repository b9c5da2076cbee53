//! The job consumer: what a `glia worker` process does with each job.
//!
//! For every job: open the run ([`Inbox::open`](glia_backends::Inbox::open): skip a done run or a
//! stale job; a lease held elsewhere → publish the job again a little later;
//! otherwise the lease, the run rebuilt from its checkpoint and its inbox,
//! in one call); ack the job at once, so a long model call or tool never
//! meets the broker's consumer timeout; heartbeat the lease; apply each
//! unconsumed inbox payload and advance the run to its next pull point,
//! committing every step fenced by the lease; let go once the inbox is empty
//! ([`Inbox::release_if_idle`](glia_backends::Inbox::release_if_idle)). N jobs at a time.
//!
//! Resumes first: the queue hands out a job that resumes a parked run (a
//! posted approval, tool result, user message, …) before any job that
//! starts one ([`JobQueue::next`]), and a worker keeps its last free slot
//! for resumes ([`Worker::with_resume_slots`]): it takes a start only while
//! another slot stays free, so a resume is never queued behind a start in
//! the same worker. A worker with one slot takes both.
//!
//! A commit that fails (lease lost, head moved) abandons the in-memory state:
//! the log is the truth and the next job rebuilds from it. A commit the
//! database did not answer ([`LogError::is_transient`]: a restart, a pool
//! timeout) is retried with backoff ([`COMMIT_RETRY_MAX`]) for as long as the
//! lease lives; the heartbeat, meanwhile, tries to renew every
//! [`HEARTBEAT_RETRY`], so the lease is renewed as soon as the database
//! answers again. Tool results are held in the ledger from the moment they
//! exist until their commit lands ([`Ledger::hold_results`]), so a lease lost
//! anyway throws no finished call away: the next worker commits the held
//! result (`tool.recovered`).
//!
//! Tenants' daily caps are enforced across the fleet by [`LedgerGate`], the
//! agent's budget gate: counters in the ledger (Redis), rebuilt from the
//! event log when missing.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use backon::{BackoffBuilder, ExponentialBuilder};
use chrono::NaiveDate;
use glia_backends::{
    CapKind, Delivery, EventLog, HeldResult, InboxItem, Job, JobQueue, Lease, Ledger, LedgerError,
    LogError, Opened, Opening, Reservation, RunStatus, Settlement, Signal, tenant_day_scope,
};
use glia_proto::{
    Event, Held, Limit, LiveEvent, Payload, Phase, RUNNING_MARK_TTL, RunState, Status,
};
use tokio::sync::{Semaphore, mpsc, watch};
use tracing::{debug, info, warn};
use uuid::Uuid;

use tracing::Instrument;

use crate::cancel_watch::CancelWatch;
use crate::metrics::{RunObserver, WorkerMetrics};
use glia_agent::agent::{Agent, AgentError, Clock, EventSink, SinkError, SystemClock};
use glia_agent::budget_gate::{BudgetGate, GateDecision, GateError, Spend, TenantCap, TenantCaps};

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Worker id recorded as lease owner, e.g. `host-pid`.
    pub id: String,
    /// Jobs handled at once.
    pub concurrency: usize,
    /// Lease length; renewed every third of it.
    pub lease_ttl: Duration,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            id: format!("worker-{}", std::process::id()),
            concurrency: 16,
            lease_ttl: Duration::from_secs(30),
        }
    }
}

/// What became of one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// The run was advanced; its status afterwards.
    Advanced(RunStatus),
    /// The job named a head the run has moved past and it has nothing to do.
    Stale,
    /// Another worker holds the run; the job is published again a little
    /// later ([`RETRY_HELD_AFTER`]), in case the holder lets go without
    /// having seen what the job announced.
    Held,
    /// The run does not exist or is done.
    Gone,
    /// The lease was lost or the head moved mid-way; the work is abandoned.
    Abandoned,
    /// The log or queue failed; the job was requeued.
    Retry,
}

impl Handled {
    /// `advanced`, `stale`, `held`, `gone`, `abandoned`, `retry`.
    pub fn name(&self) -> &'static str {
        match self {
            Handled::Advanced(_) => "advanced",
            Handled::Stale => "stale",
            Handled::Held => "held",
            Handled::Gone => "gone",
            Handled::Abandoned => "abandoned",
            Handled::Retry => "retry",
        }
    }
}

/// A worker: the agent plus the three ports.
pub struct Worker {
    agent: Arc<Agent>,
    log: Arc<dyn EventLog>,
    queue: Arc<dyn JobQueue>,
    ledger: Arc<dyn Ledger>,
    options: WorkerOptions,
    metrics: Option<Arc<WorkerMetrics>>,
    /// The provider's label in spans (see [`Worker::with_provider_label`]).
    provider: String,
    serial_cancel_check: bool,
    resume_slots: usize,
    hints: Mutex<Option<mpsc::Receiver<Job>>>,
    /// One watch of the cancel flags for every run in hand, made when the
    /// worker starts ([`crate::cancel_watch`]); `None`: each run polls.
    cancels: Mutex<Option<Arc<CancelWatch>>>,
}

/// A job in hand: from the queue, or a resume hint ([`Worker::with_hints`]).
enum Taken {
    Queued(Delivery),
    Hint(Job),
}

impl Worker {
    /// A worker over these ports.
    pub fn new(
        agent: Arc<Agent>,
        log: Arc<dyn EventLog>,
        queue: Arc<dyn JobQueue>,
        ledger: Arc<dyn Ledger>,
        options: WorkerOptions,
    ) -> Self {
        Worker {
            agent,
            log,
            queue,
            ledger,
            options,
            metrics: None,
            provider: String::new(),
            serial_cancel_check: false,
            resume_slots: 1,
            hints: Mutex::new(None),
            cancels: Mutex::new(None),
        }
    }

    /// Also take resume hints from `hints` (on Postgres,
    /// `PgLog::resume_hints` for this worker's id): a hint is handled like a
    /// resume job from the queue, in a free slot (the slot kept for resumes
    /// included), except that it is never acked, requeued or published
    /// again: the same job is in the queue anyway, and is found stale or
    /// handled as usual when its turn comes. A job's log span says where it
    /// came from (`via` = `hint` or `queue`; its outcome is logged at debug
    /// level, and counted in the jobs metric).
    pub fn with_hints(self, hints: mpsc::Receiver<Job>) -> Self {
        *self.hints.lock().unwrap_or_else(|e| e.into_inner()) = Some(hints);
        self
    }

    /// Keep `slots` of the worker's slots for resumes (default 1): a start
    /// job is taken only while more than `slots` slots are free; with fewer
    /// free, the worker waits for a resume ([`JobQueue::next_resume`]) or
    /// for another slot to free up, whichever comes first. Capped at
    /// concurrency − 1, so a worker always takes starts when it is idle (a
    /// worker with one slot takes both kinds, resumes first). 0 takes any
    /// job into any slot (how workers did before resumes first, kept to
    /// measure the difference in `glia bench steps`).
    pub fn with_resume_slots(mut self, slots: usize) -> Self {
        self.resume_slots = slots;
        self
    }

    /// Read a run's cancel flag after each commit returns instead of while
    /// it is in flight (one more round trip per step; how workers did it
    /// before, kept to measure the difference in `glia bench steps`).
    pub fn with_serial_cancel_check(mut self, serial: bool) -> Self {
        self.serial_cancel_check = serial;
        self
    }

    /// Label the spans of model calls with `provider` (`scripted`,
    /// `anthropic`, `openai`: `gen_ai.provider.name`) when a run names no
    /// catalogue provider; default: the metrics' label, else none.
    pub fn with_provider_label(mut self, provider: &str) -> Self {
        provider.clone_into(&mut self.provider);
        self
    }

    /// Count jobs, runs, model and tool calls in `metrics` (see
    /// [`crate::metrics`]).
    pub fn with_metrics(mut self, metrics: Arc<WorkerMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Consume jobs until `shutdown` turns true; then stop taking jobs, let
    /// the ones in hand finish their current step, release their leases and
    /// return.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let concurrency = self.options.concurrency.max(1);
        let slots = Arc::new(Semaphore::new(concurrency));
        // Slots kept for resumes: a start needs more than this many free.
        let reserved = self.resume_slots.min(concurrency - 1);
        if let Some(m) = &self.metrics {
            m.slots.set(concurrency as i64);
        }
        let mut hints = self.hints.lock().unwrap_or_else(|e| e.into_inner()).take();
        let cancels = CancelWatch::start(self.ledger.clone()).await;
        *self.cancels.lock().unwrap_or_else(|e| e.into_inner()) = cancels;
        info!(worker = %self.options.id, concurrency, reserved, hints = hints.is_some(), "worker started");
        'slots: loop {
            let permit = tokio::select! {
                p = slots.clone().acquire_owned() => p.expect("semaphore never closes"),
                _ = shutdown.wait_for(|s| *s) => break,
            };
            // Only this loop takes permits, so the free slots counted here
            // can only grow while it waits.
            let taken = loop {
                if slots.available_permits() >= reserved {
                    // Other free slots cover the reserve: any job, resumes first.
                    break tokio::select! {
                        d = self.queue.next() => d.map(Taken::Queued),
                        Some(job) = next_hint(&mut hints) => Ok(Taken::Hint(job)),
                        _ = shutdown.wait_for(|s| *s) => break 'slots,
                    };
                }
                // This is a reserved slot: a resume, unless another slot
                // frees up first (then look again; `next_resume` is
                // cancel-safe).
                tokio::select! {
                    biased;
                    d = self.queue.next_resume() => break d.map(Taken::Queued),
                    Some(job) = next_hint(&mut hints) => break Ok(Taken::Hint(job)),
                    freed = slots.clone().acquire_owned() => drop(freed),
                    _ = shutdown.wait_for(|s| *s) => break 'slots,
                }
            };
            match taken {
                Ok(taken) => {
                    let me = self.clone();
                    let (job, via) = match &taken {
                        Taken::Queued(d) => (d.job, "queue"),
                        Taken::Hint(job) => (*job, "hint"),
                    };
                    let span =
                        crate::trace::job_span(job.run_id, job.head_seq, via, &self.options.id);
                    tokio::spawn(
                        async move {
                            if let Some(m) = &me.metrics {
                                m.busy_slots.inc();
                            }
                            let handled = me.handle(taken).await;
                            debug!(?handled, "job handled");
                            if let Some(m) = &me.metrics {
                                m.busy_slots.dec();
                                m.job(handled.name());
                            }
                            drop(permit);
                        }
                        .instrument(span),
                    );
                }
                Err(e) => {
                    warn!(error = %e, "job queue closed");
                    break;
                }
            }
        }
        let _ = slots
            .acquire_many(self.options.concurrency.max(1) as u32)
            .await;
        // Its subscription ends with it.
        drop(
            self.cancels
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        info!(worker = %self.options.id, "worker stopped");
    }

    /// Handle one job: open the run (lease, state and inbox in one call,
    /// [`Inbox::open`](glia_backends::Inbox::open)), ack, advance, release. A hint is never acked,
    /// requeued or published again ([`Worker::with_hints`]).
    async fn handle(&self, taken: Taken) -> Handled {
        let (job, delivery) = match taken {
            Taken::Queued(delivery) => (delivery.job, Some(delivery)),
            Taken::Hint(job) => (job, None),
        };
        let run_id = job.run_id;
        if let (Some(m), Some(at)) = (&self.metrics, delivery.as_ref().and_then(|d| d.enqueued_at))
        {
            m.job_lag.observe(
                (chrono::Utc::now() - at)
                    .num_microseconds()
                    .unwrap_or(0)
                    .max(0) as f64
                    / 1e6,
            );
        }
        let opened = match self
            .log
            .open(&job, &self.options.id, self.options.lease_ttl)
            .await
        {
            Ok(Opening::Opened(opened)) => opened,
            Ok(Opening::Done) | Err(LogError::NotFound(_)) => {
                return ack(delivery, Handled::Gone).await;
            }
            Ok(Opening::Stale) => return ack(delivery, Handled::Stale).await,
            Err(LogError::LeaseHeld { .. }) => {
                if delivery.is_some() {
                    self.publish_later(job, RETRY_HELD_AFTER.min(self.options.lease_ttl));
                }
                return ack(delivery, Handled::Held).await;
            }
            Err(e) => {
                // Held for a while first, so that an outage of the database
                // does not turn into a tight loop of deliveries.
                warn!(%run_id, error = %e, "could not open the run; requeueing the job in {} ms", REQUEUE_AFTER.as_millis());
                if let Some(d) = delivery {
                    tokio::time::sleep(REQUEUE_AFTER).await;
                    let _ = d.acker.nack(true).await;
                }
                return Handled::Retry;
            }
        };
        let lease = opened.lease.clone();
        if lease.taken_over {
            info!(%run_id, "took over a lapsed lease");
            if let Some(m) = &self.metrics {
                m.lease_takeovers.inc();
            }
        }
        // Holding the lease, the job has done its part: ack now.
        ack(delivery, ()).await;
        let (mut heartbeat, renewed) =
            Heartbeat::start(self.log.clone(), self.options.lease_ttl, lease.clone());
        // Watched while in hand, so that a cancel reaches a call under way;
        // one flagged before it was watched is read once now.
        let cancels = self
            .cancels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let watched = cancels.map(|w| w.watch(run_id));
        if let Some(w) = &watched
            && self.ledger.is_cancelled(run_id).await.unwrap_or(false)
        {
            w.flag();
        }
        let mut released = false;
        let mut retry_after = None;
        let handled = self
            .drive(
                opened,
                renewed,
                watched.as_ref().map(|w| w.cancelled.clone()),
                &mut heartbeat,
                &mut retry_after,
                &mut released,
            )
            .await;
        // Stopped (and a renewal under way finished) before the lease is let
        // go: a renewal after the release would find it gone.
        heartbeat.stop().await;
        // A transient failure without a wait keeps the lease until it
        // lapses (the reconciler retries then); with one (the provider's
        // hint, or an interrupted call still running elsewhere), let go and
        // come back then.
        let keep = handled == Handled::Retry && retry_after.is_none();
        if !keep
            && !released
            && let Err(e) = self.log.release(&lease).await
        {
            warn!(%run_id, error = %e, "release failed; the lease will lapse");
        }
        if let Some(delay) = retry_after {
            self.publish_later(Job::start(run_id, 0), delay);
        }
        handled
    }

    /// Publish `job` again after `delay`, on a task of its own. If this
    /// process dies first, the reconciler re-enqueues the run once its lease
    /// lapses, as after any crash.
    fn publish_later(&self, job: Job, delay: Duration) {
        let queue = self.queue.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Err(e) = queue.publish(&job).await {
                warn!(run_id = %job.run_id, error = %e, "could not publish the retried job; the reconciler will");
            }
        });
    }

    /// Apply inbox payloads and advance until the run parks or ends, then
    /// let go of the lease once the inbox is empty ([`Inbox::release_if_idle`](glia_backends::Inbox::release_if_idle),
    /// which sets `released`). With [`Handled::Retry`], `retry_after` is how
    /// long to wait before trying again, if known: the provider's wait hint,
    /// the run's backoff for a tool source that could not list its tools,
    /// or [`RETRY_RUNNING_AFTER`] for a call still marked running.
    async fn drive(
        &self,
        opened: Opened,
        renewed: watch::Receiver<Lease>,
        cancel_flag: Option<watch::Receiver<bool>>,
        heartbeat: &mut Heartbeat,
        retry_after: &mut Option<Duration>,
        released: &mut bool,
    ) -> Handled {
        let Opened {
            lease,
            mut state,
            inbox,
        } = opened;
        let run_id = lease.run_id;
        // The unconsumed items known to be current; `None`: read them again.
        let mut inbox: Option<Vec<InboxItem>> = Some(inbox);
        let mut cancelled = false;
        // The last advance stopped on the pause flag; and whether that flag
        // turned out stale (no pause posted): then it is not watched until
        // the inbox holds something again.
        let mut flag_seen = false;
        let mut stale_flag = false;
        loop {
            let items = match inbox.take() {
                Some(items) => items,
                None => match self.log.inbox(run_id).await {
                    Ok(items) => items,
                    Err(e) => {
                        warn!(%run_id, error = %e, "could not read the inbox");
                        return Handled::Abandoned;
                    }
                },
            };
            if std::mem::take(&mut flag_seen) {
                stale_flag = !items
                    .iter()
                    .any(|i| matches!(i.payload, Payload::Pause { .. }));
            } else if !items.is_empty() {
                stale_flag = false;
            }
            let mut sink = LogSink {
                log: self.log.clone(),
                ledger: self.ledger.clone(),
                lease: lease.clone(),
                renewed: renewed.clone(),
                held: Vec::new(),
                buffer: Vec::new(),
                consumed: Vec::new(),
                observer: RunObserver::new(self.metrics.clone(), &state)
                    .with_default_provider(&self.provider),
                serial_cancel_check: self.serial_cancel_check,
                cancelled: cancel_flag.clone(),
                watch_pause: !stale_flag,
                pause_flagged: false,
            };
            let mut items = items.into_iter();
            let result = if let Some(item) = items.next() {
                sink.consumed.push(item.id);
                let payload: Payload = item.payload;
                match self
                    .agent
                    .advance(&mut state, Some(payload), &mut sink)
                    .await
                {
                    Err(AgentError::InvalidResume(why)) => {
                        warn!(%run_id, item = item.id, %why, "payload no longer fits the run; dropped");
                        sink.commit(&state)
                            .await
                            .map(|_| state.status())
                            .map_err(AgentError::from)
                    }
                    Err(AgentError::Transition(why)) => {
                        warn!(%run_id, item = item.id, %why, "payload no longer fits the run; dropped");
                        sink.commit(&state)
                            .await
                            .map(|_| state.status())
                            .map_err(AgentError::from)
                    }
                    other => other,
                }
            } else if state.status() == Status::Runnable {
                // Cancelled by flag with no cancel in the inbox: cancel it here.
                let input = cancelled.then(|| Payload::Cancel {
                    reason: "cancelled".into(),
                });
                self.agent.advance(&mut state, input, &mut sink).await
            } else {
                // Parked or done with nothing left to apply: let go, unless
                // something was posted meanwhile. The heartbeat stops first
                // (a renewal under way finishes): one after the release
                // would find the lease gone and call it lost.
                heartbeat.stop().await;
                match self.log.release_if_idle(&lease).await {
                    Ok(more) if more.is_empty() => {
                        *released = true;
                        return Handled::Advanced(RunStatus::of(&state));
                    }
                    Ok(more) => {
                        // Still held: renew it again while those are applied.
                        heartbeat.resume();
                        inbox = Some(more);
                        continue;
                    }
                    Err(e) => {
                        warn!(%run_id, error = %e, "could not read the inbox to let go");
                        return Handled::Advanced(RunStatus::of(&state));
                    }
                }
            };
            match result {
                // The item applied was consumed by the advance's commits;
                // the rest are still waiting, in order.
                Ok(_) => inbox = Some(items.collect()),
                Err(AgentError::Provider(e)) => {
                    *retry_after = e.retry_after_ms().map(Duration::from_millis);
                    match retry_after {
                        Some(d) => {
                            warn!(%run_id, error = %e, "provider unavailable; retrying in {} ms, as it asked", d.as_millis())
                        }
                        None => {
                            warn!(%run_id, error = %e, "provider unavailable; retrying after the lease lapses")
                        }
                    }
                    return Handled::Retry;
                }
                Err(AgentError::Budget(e)) => {
                    warn!(%run_id, error = %e, "budget gate unavailable; retrying after the lease lapses");
                    return Handled::Retry;
                }
                Err(AgentError::Hooks(e)) => {
                    // The run's tenant (which decides its hooks) could not
                    // be read: nothing was advanced without its hooks.
                    warn!(%run_id, error = %e, "the run's hooks cannot be decided (its tenant could not be read); retrying after the lease lapses");
                    return Handled::Retry;
                }
                Err(AgentError::ToolSource {
                    reason,
                    retry_in_ms,
                }) => {
                    // Recorded (`tool_source.unavailable`) and committed;
                    // the run's policy bounds the attempts.
                    warn!(%run_id, error = %reason, "a tool source is unavailable; retrying in {retry_in_ms} ms");
                    *retry_after = Some(Duration::from_millis(retry_in_ms));
                    return Handled::Retry;
                }
                Err(AgentError::CallRunning(call_id)) => {
                    info!(%run_id, %call_id, "an interrupted call may still be running under a worker that lost its lease; looking again in {} ms", RETRY_RUNNING_AFTER.as_millis());
                    *retry_after = Some(RETRY_RUNNING_AFTER);
                    return Handled::Retry;
                }
                Err(AgentError::HeldResults(e)) => {
                    warn!(%run_id, error = %e, "cannot tell whether an interrupted call has a held result; retrying after the lease lapses");
                    return Handled::Retry;
                }
                // The loop saw the cancel flag (while a model call or tools
                // ran, or at a commit), or the pause flag between steps; what
                // it recorded is committed. Reload, then pick up the cancel,
                // or the posted pause next in the inbox (read again).
                Err(e) if is_cancel(&e) || matches!(e, AgentError::PauseFlagged) => {
                    if is_cancel(&e) {
                        cancelled = true;
                    } else {
                        flag_seen = true;
                    }
                    state = match self.log.load(run_id).await {
                        Ok(s) => s,
                        Err(e) => {
                            warn!(%run_id, error = %e, "could not reload the run after a cancel or pause flag");
                            return Handled::Abandoned;
                        }
                    };
                }
                Err(e) => {
                    warn!(%run_id, error = %e, "abandoning the run's current work");
                    return Handled::Abandoned;
                }
            }
        }
    }
}

/// How often a worker tries to renew a lease whose renewal the database did
/// not answer (while the lease lives).
pub const HEARTBEAT_RETRY: Duration = Duration::from_millis(250);

/// A run's lease renewal: a task renewing the lease every third of its
/// length, whose receiver sees the lease as last renewed (its expiry bounds
/// commit retries, see [`LogSink::commit`]). A renewal the database did not
/// answer is tried again every [`HEARTBEAT_RETRY`] while the lease lives, so
/// it is renewed as soon as the database is back; a lease lost or lapsed
/// ends the task.
///
/// It is stopped, and awaited, before the lease is let go
/// ([`Heartbeat::stop`]): a renewal after the release would find the lease
/// gone and report it lost. Dropped without a stop, it stops at its next
/// wake-up.
struct Heartbeat {
    log: Arc<dyn EventLog>,
    ttl: Duration,
    /// The running task and the flag that stops it.
    running: Option<(watch::Sender<bool>, tokio::task::JoinHandle<Beat>)>,
    /// Stopped by [`Heartbeat::stop`], the lease still ours: what
    /// [`Heartbeat::resume`] needs to renew it again.
    stopped: Option<watch::Sender<Lease>>,
}

/// How a heartbeat task ended.
enum Beat {
    /// Told to stop; the renewed lease's sender, to start again with.
    Stopped(watch::Sender<Lease>),
    /// The lease was lost or lapsed.
    Lost,
}

impl Heartbeat {
    /// Start renewing `lease`; the receiver sees it as last renewed.
    fn start(
        log: Arc<dyn EventLog>,
        ttl: Duration,
        lease: Lease,
    ) -> (Heartbeat, watch::Receiver<Lease>) {
        let (renewed_tx, renewed) = watch::channel(lease);
        let mut heartbeat = Heartbeat {
            log,
            ttl,
            running: None,
            stopped: Some(renewed_tx),
        };
        heartbeat.resume();
        (heartbeat, renewed)
    }

    /// Stop renewing, and wait for a renewal under way to finish: after
    /// this, nothing touches the lease until [`Heartbeat::resume`].
    async fn stop(&mut self) {
        let Some((stop, task)) = self.running.take() else {
            return;
        };
        let _ = stop.send(true);
        if let Ok(Beat::Stopped(renewed)) = task.await {
            self.stopped = Some(renewed);
        }
    }

    /// Renew again after a [`Heartbeat::stop`] (the lease kept), from the
    /// lease as last renewed; nothing if it is running or the lease was lost.
    fn resume(&mut self) {
        if self.running.is_some() {
            return;
        }
        let Some(renewed) = self.stopped.take() else {
            return;
        };
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(beat(self.log.clone(), self.ttl, renewed, rx));
        self.running = Some((stop, task));
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        if let Some((stop, _)) = &self.running {
            let _ = stop.send(true);
        }
    }
}

/// The heartbeat's task: renew the lease in `renewed` every third of `ttl`
/// until `stop` turns true.
async fn beat(
    log: Arc<dyn EventLog>,
    ttl: Duration,
    renewed: watch::Sender<Lease>,
    mut stop: watch::Receiver<bool>,
) -> Beat {
    let mut lease = renewed.borrow().clone();
    let mut wait = ttl / 3;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return Beat::Stopped(renewed),
        }
        match log.renew(&lease, ttl).await {
            Ok(fresh) => {
                if wait != ttl / 3 {
                    info!(run_id = %lease.run_id, "lease renewed again");
                }
                lease = fresh;
                wait = ttl / 3;
                renewed.send_replace(lease.clone());
            }
            Err(e) if e.is_transient() && chrono::Utc::now() < lease.expires_at => {
                if wait != HEARTBEAT_RETRY {
                    warn!(run_id = %lease.run_id, error = %e, "lease renewal failed; trying again every {} ms while the lease lives", HEARTBEAT_RETRY.as_millis());
                }
                wait = HEARTBEAT_RETRY;
            }
            Err(e) => {
                warn!(run_id = %lease.run_id, error = %e, "lease renewal failed; commits will be refused");
                return Beat::Lost;
            }
        }
    }
}

/// Longest wait between two attempts of a commit the database did not
/// answer (the first wait is 50 ms, doubling, with jitter). Attempts go on
/// while the lease lives.
pub const COMMIT_RETRY_MAX: Duration = Duration::from_secs(1);

/// How long a job for a run another worker holds waits before it is
/// published again.
pub const RETRY_HELD_AFTER: Duration = Duration::from_millis(500);

/// How long a job waits before it is published again when the run's
/// interrupted call is still marked running by a worker that lost its lease
/// ([`glia_proto::Held::Running`]): until the call's result is held, or its
/// mark lapses ([`RUNNING_MARK_TTL`]).
pub const RETRY_RUNNING_AFTER: Duration = Duration::from_secs(1);

/// How long a job whose run could not be opened (the event log did not
/// answer) is held before it is requeued.
pub const REQUEUE_AFTER: Duration = Duration::from_secs(1);

/// How often a worker looks at the cancel flag of a run it is advancing
/// (while a model call or a tool runs; also at every commit).
pub const CANCEL_POLL: Duration = Duration::from_secs(1);

/// Ack the job, if it came from the queue; answer `then`.
async fn ack<T>(delivery: Option<Delivery>, then: T) -> T {
    if let Some(d) = delivery {
        let _ = d.acker.ack().await;
    }
    then
}

/// The next resume hint; pending forever without hints (or once their
/// listener is gone).
async fn next_hint(hints: &mut Option<mpsc::Receiver<Job>>) -> Option<Job> {
    match hints {
        Some(rx) => match rx.recv().await {
            Some(job) => Some(job),
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// What [`LogSink::commit`] answers when the run was cancelled mid-advance.
const CANCELLED: &str = "run cancelled";

/// True when `advance` stopped because the run was cancelled: the loop saw
/// the flag, or a commit did.
fn is_cancel(e: &AgentError) -> bool {
    match e {
        AgentError::Cancelled => true,
        AgentError::Sink(SinkError(why)) => why == CANCELLED,
        _ => false,
    }
}

/// Buffers a step's events and commits them to the event log, fenced by the
/// lease, at each of the loop's durability barriers.
struct LogSink {
    log: Arc<dyn EventLog>,
    ledger: Arc<dyn Ledger>,
    lease: Lease,
    /// The lease as the heartbeat last renewed it: commits the database did
    /// not answer are retried until it expires.
    renewed: watch::Receiver<Lease>,
    /// Idempotency keys of the results held ([`EventSink::hold`]) or
    /// recovered since the last commit: released once a commit lands.
    held: Vec<String>,
    buffer: Vec<Event>,
    consumed: Vec<i64>,
    observer: RunObserver,
    serial_cancel_check: bool,
    /// The run's flag from the worker's cancel watch; `None`: poll.
    cancelled: Option<watch::Receiver<bool>>,
    /// Look at the operator-pause flag at each commit.
    watch_pause: bool,
    /// The pause flag as of the last commit ([`EventSink::pause_flagged`]).
    pause_flagged: bool,
}

#[async_trait]
impl EventSink for LogSink {
    async fn record(&mut self, event: &Event) -> Result<(), SinkError> {
        self.observer.record(event);
        self.buffer.push(event.clone());
        Ok(())
    }

    async fn commit(&mut self, state: &RunState) -> Result<(), SinkError> {
        if self.buffer.is_empty() && self.consumed.is_empty() {
            return Ok(());
        }
        // Cooperative cancellation: at each durability barrier (before a model
        // call or a tool execution), stop if the run was cancelled meanwhile;
        // the worker then applies the posted cancel from the inbox. The flag
        // is read while the commit is in flight, off the step's critical
        // path: a cancel whose flag was set before the commit began is seen
        // here (the dispatcher sets it after the cancel is in the inbox); one
        // set while the commit is in flight is seen at the next barrier, or
        // by the poll while a call runs ([`CANCEL_POLL`]).
        let run_id = self.lease.run_id;
        let ledger = &self.ledger;
        // The pause flag is read with it; the loop asks for it between
        // steps ([`EventSink::pause_flagged`]).
        let check = async {
            if state.phase == Phase::Done {
                return Signal::default();
            }
            let signal = ledger.signal(run_id).await.unwrap_or_default();
            Signal {
                cancelled: signal.cancelled,
                paused: signal.paused && self.watch_pause && state.pause_due.is_none(),
            }
        };
        let commit = self.commit_retrying(state);
        let (committed, signal) = if self.serial_cancel_check {
            let committed = commit.await;
            let signal = if committed.is_ok() {
                check.await
            } else {
                Signal::default()
            };
            (committed, signal)
        } else {
            futures::join!(commit, check)
        };
        committed.map_err(|e| SinkError(e.to_string()))?;
        self.buffer.clear();
        self.consumed.clear();
        if !self.held.is_empty() {
            // In the log now: the held copies can go (they would expire).
            let (ledger, keys) = (self.ledger.clone(), std::mem::take(&mut self.held));
            tokio::spawn(async move {
                if let Err(e) = ledger.release_held(&keys).await {
                    debug!(error = %e, "held results not released; they expire");
                }
            });
        }
        self.pause_flagged = signal.paused;
        if signal.cancelled {
            return Err(SinkError(CANCELLED.into()));
        }
        Ok(())
    }

    /// Ends when the worker's cancel watch flags the run; without a watch,
    /// polls the run's cancel flag in the ledger every [`CANCEL_POLL`] (a
    /// ledger that does not answer counts as not cancelled).
    fn cancelled(&self) -> futures::future::BoxFuture<'_, ()> {
        let (ledger, run_id) = (self.ledger.clone(), self.lease.run_id);
        let watched = self.cancelled.clone();
        Box::pin(async move {
            if let Some(mut flag) = watched
                && flag.wait_for(|cancelled| *cancelled).await.is_ok()
            {
                return;
            }
            // No watch, or no longer watched (the run was taken up again
            // in this worker): poll.
            loop {
                tokio::time::sleep(CANCEL_POLL).await;
                if ledger.is_cancelled(run_id).await.unwrap_or(false) {
                    return;
                }
            }
        })
    }

    fn pause_flagged(&self) -> bool {
        self.pause_flagged
    }

    async fn hold(&mut self, held: &[(String, HeldResult)]) -> Result<(), SinkError> {
        self.ledger
            .hold_results(held)
            .await
            .map_err(|e| SinkError(e.to_string()))?;
        self.held.extend(held.iter().map(|(key, _)| key.clone()));
        Ok(())
    }

    async fn mark_running(&self, keys: &[String]) -> Result<(), SinkError> {
        self.ledger
            .mark_running(keys, RUNNING_MARK_TTL)
            .await
            .map_err(|e| SinkError(e.to_string()))
    }

    /// The running mark is read before the held result: a hold writes the
    /// result before it removes the mark, so "not running" then "not held"
    /// means nothing was held (a hold between the two reads is seen as held).
    async fn held(&mut self, key: &str) -> Result<Option<Held>, SinkError> {
        let running = self
            .ledger
            .running(key)
            .await
            .map_err(|e| SinkError(e.to_string()))?;
        let held = self
            .ledger
            .held_result(key)
            .await
            .map_err(|e| SinkError(e.to_string()))?;
        match held {
            Some(held) => {
                info!(run_id = %self.lease.run_id, key, "recovering a tool result its worker held but did not commit");
                self.held.push(key.to_owned());
                Ok(Some(Held::Finished(held)))
            }
            None => Ok(running.then_some(Held::Running)),
        }
    }

    fn live(&self, event: &LiveEvent) {
        self.observer.live(event);
        let ledger = self.ledger.clone();
        let run_id = self.lease.run_id;
        let event = event.clone();
        tokio::spawn(async move {
            let _ = ledger.publish_live(run_id, &event).await;
        });
    }
}

impl LogSink {
    /// [`RunLog::commit`](glia_backends::RunLog::commit), tried again with backoff while the database
    /// does not answer and the lease (as last renewed) lives. An attempt
    /// that was not answered may have landed: when a later attempt finds
    /// the head already where this commit puts it (a conflict under our
    /// own lease, which nobody else can write under), it did.
    async fn commit_retrying(&self, state: &RunState) -> Result<(), LogError> {
        let mut delays = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(50))
            .with_max_delay(COMMIT_RETRY_MAX)
            .with_jitter()
            .without_max_times()
            .build();
        let mut unanswered = false;
        loop {
            match self
                .log
                .commit(&self.lease, &self.buffer, state, &self.consumed)
                .await
            {
                Ok(()) => return Ok(()),
                Err(LogError::Conflict { actual, .. })
                    if unanswered && !self.buffer.is_empty() && actual == state.head_seq =>
                {
                    info!(run_id = %self.lease.run_id, head = actual, "a commit that was not answered had landed");
                    return Ok(());
                }
                Err(e)
                    if e.is_transient()
                        && chrono::Utc::now() < self.renewed.borrow().expires_at =>
                {
                    let delay = delays.next().unwrap_or(COMMIT_RETRY_MAX);
                    warn!(run_id = %self.lease.run_id, error = %e, "commit not answered; trying again in {} ms while the lease lives", delay.as_millis());
                    unanswered = true;
                    tokio::time::sleep(delay).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// How long a tenant's daily budget counter lives in the ledger by default:
/// two days, so the counter of a day outlives it.
pub const DEFAULT_BUDGET_TTL: Duration = Duration::from_secs(2 * 24 * 3600);

/// The fleet's [`BudgetGate`]: each tenant's daily caps ([`TenantCaps`])
/// counted in the [`Ledger`] under [`tenant_day_scope`] of the current UTC
/// day (by the gate's clock), shared by every worker.
///
/// The tenant of a run is read from its summary in the event log (once per
/// run, then remembered). A tenant without caps costs nothing: no ledger
/// call. When the day's counter is missing (first use of the day, or Redis
/// restarted or flushed) it is seeded with what the tenant's runs spent that
/// day according to the log ([`Reports::tenant_usage`](glia_backends::Reports::tenant_usage)) and the call is
/// asked again. A flush forgets only what was in flight at that moment:
/// calls then running count again once they return and settle (other calls
/// may be let through meanwhile), and spend settled but not yet committed to
/// the log is not counted that day.
///
/// Caps can be changed while running ([`LedgerGate::set_caps`]); a tenant
/// that was uncapped for a while is not counted meanwhile, so its counter,
/// if it already existed that day, misses that spend.
pub struct LedgerGate {
    ledger: Arc<dyn Ledger>,
    log: Arc<dyn EventLog>,
    caps: RwLock<TenantCaps>,
    tenants: crate::run_tenants::LogTenants,
    clock: Arc<dyn Clock>,
    ttl: Duration,
}

/// How many times a gate seeds a counter that keeps disappearing before it
/// gives up.
const SEED_ATTEMPTS: usize = 3;

fn gate_error(e: impl std::fmt::Display) -> GateError {
    GateError(e.to_string())
}

impl LedgerGate {
    /// A gate over these ports with these caps, on the system clock, with
    /// counters living [`DEFAULT_BUDGET_TTL`].
    pub fn new(ledger: Arc<dyn Ledger>, log: Arc<dyn EventLog>, caps: TenantCaps) -> LedgerGate {
        LedgerGate {
            ledger,
            tenants: crate::run_tenants::LogTenants::new(log.clone()),
            log,
            caps: RwLock::new(caps),
            clock: Arc::new(SystemClock),
            ttl: DEFAULT_BUDGET_TTL,
        }
    }

    /// Take the day from `clock` (use the agent's, so that the day of a
    /// reservation is the day of its events).
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> LedgerGate {
        self.clock = Arc::new(clock);
        self
    }

    /// Keep counters for `ttl` instead of [`DEFAULT_BUDGET_TTL`].
    pub fn with_ttl(mut self, ttl: Duration) -> LedgerGate {
        self.ttl = ttl;
        self
    }

    /// Replace the caps, e.g. to let paused runs of a tenant go on today.
    pub fn set_caps(&self, caps: TenantCaps) {
        *self.caps.write().unwrap_or_else(|e| e.into_inner()) = caps;
    }

    /// The tenant's caps, when it has any.
    fn cap_of(&self, tenant: &str) -> Option<TenantCap> {
        self.caps
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(tenant)
            .copied()
    }

    /// The run's tenant, from its summary (remembered).
    async fn tenant(&self, run_id: Uuid) -> Result<String, GateError> {
        use glia_agent::http_hooks::RunTenants;
        self.tenants.tenant(run_id).await.map_err(GateError)
    }

    /// The capped tenant of the run, its caps, today and today's scope; `None`
    /// for an uncapped tenant.
    async fn scope(
        &self,
        state: &RunState,
    ) -> Result<Option<(String, TenantCap, NaiveDate, String)>, GateError> {
        if self
            .caps
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
        {
            return Ok(None);
        }
        let tenant = self.tenant(state.run_id).await?;
        let Some(cap) = self.cap_of(&tenant) else {
            return Ok(None);
        };
        let day = self.clock.now().date_naive();
        let scope = tenant_day_scope(&tenant, day);
        Ok(Some((tenant, cap, day, scope)))
    }

    /// Create the day's counter from the log, unless another worker did.
    async fn seed(&self, tenant: &str, day: NaiveDate, scope: &str) -> Result<(), GateError> {
        let used = self
            .log
            .tenant_usage(tenant, day)
            .await
            .map_err(gate_error)?;
        let created = self
            .ledger
            .seed(scope, used, self.ttl)
            .await
            .map_err(gate_error)?;
        if created {
            info!(tenant, %day, tokens = used.tokens, cost_usd_micros = used.cost_usd_micros, "budget counter rebuilt from the log");
        }
        Ok(())
    }
}

#[async_trait]
impl BudgetGate for LedgerGate {
    /// Errors: the log or the ledger did not answer.
    async fn reserve(
        &self,
        state: &RunState,
        request_id: &str,
        estimate: Spend,
    ) -> Result<GateDecision, GateError> {
        let Some((tenant, cap, day, scope)) = self.scope(state).await? else {
            return Ok(GateDecision::Granted);
        };
        for _ in 0..SEED_ATTEMPTS {
            match self
                .ledger
                .reserve(&scope, request_id, estimate, cap.spend_cap())
                .await
                .map_err(gate_error)?
            {
                Reservation::Granted { .. } => return Ok(GateDecision::Granted),
                Reservation::Exceeded {
                    cap: CapKind::Cost, ..
                } => return Ok(GateDecision::Exceeded(Limit::TenantDailyCost)),
                Reservation::Exceeded {
                    cap: CapKind::Tokens,
                    ..
                } => return Ok(GateDecision::Exceeded(Limit::TenantDailyTokens)),
                Reservation::Missing => self.seed(&tenant, day, &scope).await?,
            }
        }
        Err(gate_error(LedgerError::Unavailable(format!(
            "{scope}: the counter disappeared {SEED_ATTEMPTS} times"
        ))))
    }

    /// Settles into the counter of the day it is now (a call that spanned
    /// midnight counts on the day it returned, as its event does).
    ///
    /// Errors: the log or the ledger did not answer.
    async fn settle(
        &self,
        state: &RunState,
        request_id: &str,
        actual: Spend,
    ) -> Result<(), GateError> {
        let Some((tenant, _, day, scope)) = self.scope(state).await? else {
            return Ok(());
        };
        for _ in 0..SEED_ATTEMPTS {
            match self
                .ledger
                .settle(&scope, request_id, actual)
                .await
                .map_err(gate_error)?
            {
                Settlement::Settled { .. } => return Ok(()),
                Settlement::Missing => self.seed(&tenant, day, &scope).await?,
            }
        }
        Err(gate_error(LedgerError::Unavailable(format!(
            "{scope}: the counter disappeared {SEED_ATTEMPTS} times"
        ))))
    }
}
