//! A worker stops renewing a run's lease before it lets the lease go
//! (issue 35): a renewal after the release finds the lease gone and is
//! logged as "lease renewal failed; commits will be refused", which an
//! operator reads as a real loss.
//!
//! A real worker, the real loop and the in-memory ports, behind an event
//! log that answers a release slowly (as a database over a network may):
//! it sleeps a whole lease length after letting go, so a heartbeat still
//! running then is certain to try a renewal. Time is Tokio's paused clock
//! (a current-thread runtime: timers fire in deadline order, and every task
//! logs under this test's subscriber), so nothing here depends on how busy
//! the machine is.

use crate::common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use common::Add;
use glia_agent::Agent;
use glia_agent::tool::ToolRegistry;
use glia_backends::memory::{MemoryLedger, MemoryLog, MemoryQueue};
use glia_backends::{
    AgentRegistry, AgentVersion, ApprovalFilter, ApprovalRow, Approvals, DueWait, ExpiredFilter,
    Inbox, InboxItem, Job, JobQueue, Lease, LogError, NewRun, Opening, Orphan, Outbox, Reports,
    RunFilter, RunLog, RunStatus, RunSummary, Spend, Waits,
};
use glia_proto::{ArrivedEvent, Event, Outcome, Payload, PullPoint, RunState};
use glia_worker::consumer::{Worker, WorkerOptions};
use tokio::sync::watch;
use uuid::Uuid;

/// The lease length: renewed every 10 s of the paused clock.
const TTL: Duration = Duration::from_secs(30);

/// The in-memory log, answering a release a lease length late, counting
/// what the heartbeat does around releases.
struct Watched {
    log: MemoryLog,
    /// Tokens of the leases let go.
    released: Mutex<HashSet<Uuid>>,
    /// Renewals of a lease already let go: each is a spurious "lease
    /// renewal failed".
    late_renewals: AtomicUsize,
    /// Post the result of the call a run waits for just before its release
    /// (once per run): something posted while the worker lets go.
    answer_on_release: bool,
    answered: Mutex<HashSet<Uuid>>,
    /// Set once an answer was posted that way: the next commit is as slow
    /// as the release, so the heartbeat has to renew meanwhile.
    slow_commit: AtomicBool,
    committing_slowly: AtomicBool,
    /// Renewals that succeeded during that slow commit.
    renewed_after_answer: AtomicUsize,
    /// Runs whose release at their end has returned.
    finished: Mutex<HashSet<Uuid>>,
}

impl Watched {
    fn new(answer_on_release: bool) -> Watched {
        Watched {
            log: MemoryLog::default(),
            released: Mutex::default(),
            late_renewals: AtomicUsize::new(0),
            answer_on_release,
            answered: Mutex::default(),
            slow_commit: AtomicBool::new(false),
            committing_slowly: AtomicBool::new(false),
            renewed_after_answer: AtomicUsize::new(0),
            finished: Mutex::default(),
        }
    }

    fn let_go(&self, lease: &Lease) {
        self.released.lock().unwrap().insert(lease.token);
    }

    /// When the run waits for an external call's result it has not been
    /// given yet this way: post it.
    async fn answer(&self, run_id: Uuid) {
        if !self.answer_on_release || !self.answered.lock().unwrap().insert(run_id) {
            return;
        }
        let state = self.log.load(run_id).await.unwrap();
        let Some(PullPoint::AwaitingTool { call_ids }) = &state.parked else {
            self.answered.lock().unwrap().remove(&run_id);
            return;
        };
        self.log
            .post(run_id, tool_result(&call_ids[0]))
            .await
            .unwrap();
        self.slow_commit.store(true, Ordering::SeqCst);
    }
}

fn tool_result(call_id: &str) -> Payload {
    Payload::ToolResult {
        call_id: call_id.to_owned(),
        content: "A1".into(),
        is_error: false,
    }
}

#[async_trait]
impl RunLog for Watched {
    async fn create_run(&self, new: NewRun) -> Result<(RunSummary, bool), LogError> {
        self.log.create_run(new).await
    }
    async fn get_run(&self, run_id: Uuid) -> Result<RunSummary, LogError> {
        self.log.get_run(run_id).await
    }
    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, LogError> {
        self.log.list_runs(filter).await
    }
    async fn stranded_children(&self, limit: usize) -> Result<Vec<(Uuid, Uuid)>, LogError> {
        self.log.stranded_children(limit).await
    }
    async fn events(&self, run_id: Uuid, after: u64, limit: usize) -> Result<Vec<Event>, LogError> {
        self.log.events(run_id, after, limit).await
    }
    async fn load(&self, run_id: Uuid) -> Result<RunState, LogError> {
        self.log.load(run_id).await
    }
    async fn acquire(&self, run_id: Uuid, owner: &str, ttl: Duration) -> Result<Lease, LogError> {
        self.log.acquire(run_id, owner, ttl).await
    }
    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease, LogError> {
        if self.released.lock().unwrap().contains(&lease.token) {
            self.late_renewals.fetch_add(1, Ordering::SeqCst);
        }
        let renewed = self.log.renew(lease, ttl).await;
        if renewed.is_ok() && self.committing_slowly.load(Ordering::SeqCst) {
            self.renewed_after_answer.fetch_add(1, Ordering::SeqCst);
        }
        renewed
    }
    async fn release(&self, lease: &Lease) -> Result<(), LogError> {
        self.log.release(lease).await?;
        self.let_go(lease);
        Ok(())
    }
    async fn commit(
        &self,
        lease: &Lease,
        events: &[Event],
        state: &RunState,
        consumed: &[i64],
    ) -> Result<(), LogError> {
        if self.slow_commit.swap(false, Ordering::SeqCst) {
            self.committing_slowly.store(true, Ordering::SeqCst);
            tokio::time::sleep(TTL).await;
            self.committing_slowly.store(false, Ordering::SeqCst);
        }
        self.log.commit(lease, events, state, consumed).await
    }
    async fn erase_run(
        &self,
        run_id: Uuid,
        by: &str,
        at: DateTime<Utc>,
    ) -> Result<RunSummary, LogError> {
        self.log.erase_run(run_id, by, at).await
    }
    async fn expired_runs(&self, filter: &ExpiredFilter) -> Result<Vec<Uuid>, LogError> {
        self.log.expired_runs(filter).await
    }
}

#[async_trait]
impl Inbox for Watched {
    async fn post(&self, run_id: Uuid, payload: Payload) -> Result<i64, LogError> {
        self.log.post(run_id, payload).await
    }
    async fn inbox(&self, run_id: Uuid) -> Result<Vec<InboxItem>, LogError> {
        self.log.inbox(run_id).await
    }
    async fn open(&self, job: &Job, owner: &str, ttl: Duration) -> Result<Opening, LogError> {
        self.log.open(job, owner, ttl).await
    }
    async fn release_if_idle(&self, lease: &Lease) -> Result<Vec<InboxItem>, LogError> {
        self.answer(lease.run_id).await;
        let more = self.log.release_if_idle(lease).await?;
        if more.is_empty() {
            self.let_go(lease);
            // The answer to the release takes a lease length to come back.
            tokio::time::sleep(TTL).await;
            if self.log.get_run(lease.run_id).await?.status == RunStatus::Done {
                self.finished.lock().unwrap().insert(lease.run_id);
            }
        }
        Ok(more)
    }
}

#[async_trait]
impl Approvals for Watched {
    async fn approvals(&self, filter: &ApprovalFilter) -> Result<Vec<ApprovalRow>, LogError> {
        self.log.approvals(filter).await
    }
    async fn escalate(&self, run_id: Uuid, call_id: &str) -> Result<(), LogError> {
        self.log.escalate(run_id, call_id).await
    }
}

#[async_trait]
impl Outbox for Watched {
    async fn outbox(&self, limit: usize) -> Result<Vec<(i64, Job)>, LogError> {
        self.log.outbox(limit).await
    }
    async fn outbox_done(&self, ids: &[i64]) -> Result<(), LogError> {
        self.log.outbox_done(ids).await
    }
    async fn orphaned(&self, limit: usize) -> Result<Vec<Orphan>, LogError> {
        self.log.orphaned(limit).await
    }
}

#[async_trait]
impl AgentRegistry for Watched {
    async fn put_agent(
        &self,
        tenant: &str,
        name: &str,
        definition: &str,
        content_hash: &str,
    ) -> Result<(AgentVersion, bool), LogError> {
        self.log
            .put_agent(tenant, name, definition, content_hash)
            .await
    }
    async fn get_agent(
        &self,
        tenant: &str,
        name: &str,
        version: Option<u32>,
    ) -> Result<Option<AgentVersion>, LogError> {
        self.log.get_agent(tenant, name, version).await
    }
    async fn list_agents(&self, tenant: &str) -> Result<Vec<AgentVersion>, LogError> {
        self.log.list_agents(tenant).await
    }
}

#[async_trait]
impl Reports for Watched {
    async fn tenant_usage(&self, tenant: &str, day: NaiveDate) -> Result<Spend, LogError> {
        self.log.tenant_usage(tenant, day).await
    }
    async fn ready(&self) -> Result<(), LogError> {
        self.log.ready().await
    }
}

#[async_trait]
impl Waits for Watched {
    async fn due_waits(&self, now_ms: i64, limit: usize) -> Result<Vec<DueWait>, LogError> {
        self.log.due_waits(now_ms, limit).await
    }
    async fn keep_event(&self, tenant: &str, event: &ArrivedEvent) -> Result<bool, LogError> {
        self.log.keep_event(tenant, event).await
    }
    async fn event_deliveries(
        &self,
        since_ms: i64,
        only: Option<(&str, Uuid)>,
        limit: usize,
    ) -> Result<Vec<(Uuid, ArrivedEvent)>, LogError> {
        self.log.event_deliveries(since_ms, only, limit).await
    }
    async fn forget_events(&self, before_ms: i64) -> Result<u64, LogError> {
        self.log.forget_events(before_ms).await
    }
}

/// Captured log lines (this test's subscriber writes here).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

/// A worker on `log`, and the dispatcher's relay; stops when `stop` turns true.
fn start(log: Arc<Watched>, stop: &watch::Sender<bool>) {
    let queue = Arc::new(MemoryQueue::default());
    let mut tools = ToolRegistry::default();
    tools.register(Add);
    let agent = Arc::new(Agent::new(Arc::new(crate::consumer::scripts())).with_tools(tools));
    let worker = Worker::new(
        agent,
        log.clone(),
        queue.clone(),
        Arc::new(MemoryLedger::default()),
        WorkerOptions {
            id: "w".into(),
            concurrency: 4,
            lease_ttl: TTL,
        },
    );
    tokio::spawn(Arc::new(worker).run(stop.subscribe()));
    let mut stopped = stop.subscribe();
    tokio::spawn(async move {
        while !*stopped.borrow_and_update() {
            for (id, job) in log.outbox(100).await.unwrap() {
                queue.publish(&job).await.unwrap();
                log.outbox_done(&[id]).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
}

async fn submit(log: &Watched, script: &str) -> Uuid {
    let new = crate::consumer::new_run(script);
    let run_id = new.start.run_id;
    log.create_run(new).await.unwrap();
    run_id
}

/// Until the run is done and the worker's release at its end has returned,
/// answering the call it waits for (with `answer`).
async fn drive(log: &Watched, run_id: Uuid, answer: bool) -> RunState {
    let mut polls = 0u32;
    loop {
        polls += 1;
        assert!(polls < 100_000, "run {run_id} never finished");
        if log.finished.lock().unwrap().contains(&run_id) {
            return log.load(run_id).await.unwrap();
        }
        let summary = log.get_run(run_id).await.unwrap();
        if answer
            && summary.status != RunStatus::Runnable
            && log.inbox(run_id).await.unwrap().is_empty()
        {
            let state = log.load(run_id).await.unwrap();
            if let Some(PullPoint::AwaitingTool { call_ids }) = &state.parked {
                // The worker may still be letting go: posting now is as
                // good as any time.
                let _ = log.post(run_id, tool_result(&call_ids[0])).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn capture() -> (Captured, tracing::subscriber::DefaultGuard) {
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    (logs, guard)
}

#[tokio::test(start_paused = true)]
async fn a_lease_let_go_is_never_renewed_after() {
    let (logs, _guard) = capture();
    let log = Arc::new(Watched::new(false));
    let (stop, _) = watch::channel(false);
    start(log.clone(), &stop);
    let mut runs = Vec::new();
    for script in ["plain", "external", "plain", "external"] {
        runs.push(submit(&log, script).await);
    }
    for run_id in runs {
        let state = drive(&log, run_id, true).await;
        assert!(
            matches!(state.outcome, Some(Outcome::Succeeded { .. })),
            "{:?}",
            state.outcome
        );
    }
    let _ = stop.send(true);
    // Each run was let go at its end, the external ones also while parked.
    assert!(log.released.lock().unwrap().len() >= 6);
    let text = logs.text();
    assert_eq!(
        log.late_renewals.load(Ordering::SeqCst),
        0,
        "a lease was renewed after its release: {text}"
    );
    assert!(!text.contains("lease renewal failed"), "{text}");
}

/// Something posted while the worker lets go keeps the lease, and the
/// heartbeat renews it again while that is applied.
#[tokio::test(start_paused = true)]
async fn a_lease_kept_for_a_late_post_is_renewed_again() {
    let (logs, _guard) = capture();
    let log = Arc::new(Watched::new(true));
    let (stop, _) = watch::channel(false);
    start(log.clone(), &stop);
    let run_id = submit(&log, "external").await;
    let state = drive(&log, run_id, false).await;
    assert!(
        matches!(state.outcome, Some(Outcome::Succeeded { .. })),
        "{:?}",
        state.outcome
    );
    let _ = stop.send(true);
    assert!(log.answered.lock().unwrap().contains(&run_id));
    let text = logs.text();
    assert!(
        log.renewed_after_answer.load(Ordering::SeqCst) > 0,
        "the heartbeat did not renew the lease kept: {text}"
    );
    assert_eq!(log.late_renewals.load(Ordering::SeqCst), 0, "{text}");
    assert!(!text.contains("lease renewal failed"), "{text}");
}
