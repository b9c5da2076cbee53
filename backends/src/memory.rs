//! In-memory twins of the three ports, for `glia dev` and fast unit tests.
//! They keep the same contract as the real adapters (the `conformance` (feature `testkit`)
//! suite runs against both) but nothing survives the process.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use futures::StreamExt;
use futures::stream::BoxStream;
use glia_proto::erasure::{erased_args_hash, erased_text, erased_value};
use glia_proto::{Event, EventKind, LiveEvent, Outcome, Payload, Phase, PullPoint, RunState};
use tokio::sync::broadcast;
use uuid::Uuid;

use crate::{
    Acker, AgentRegistry, AgentVersion, ApprovalFilter, ApprovalRow, ApprovalStatus, Approvals,
    CapKind, Delivery, ExpiredFilter, HeldResult, Inbox, InboxItem, Job, JobQueue, Lease, Ledger,
    LedgerError, LogError, NewRun, Orphan, Outbox, PostFacts, QueueError, Reports, Reservation,
    RunFilter, RunLog, RunStatus, RunSummary, Settlement, Signal, Spend, SpendCap, dedupe_key,
    post_refusal,
};

struct Record {
    summary: RunSummary,
    state: RunState,
    events: Vec<Event>,
    lease: Option<Lease>,
    inbox: Vec<(InboxItem, Option<String>, bool)>,
}

#[derive(Default)]
struct Inner {
    runs: HashMap<Uuid, Record>,
    keys: HashMap<(String, String), Uuid>,
    approvals: Vec<ApprovalRow>,
    outbox: BTreeMap<i64, Job>,
    next_id: i64,
    agents: BTreeMap<(String, String), Vec<AgentVersion>>,
    /// Kept events (issue 32: waits), by tenant, in arrival order.
    wait_events: Vec<(String, glia_proto::ArrivedEvent)>,
}

impl Inner {
    fn id(&mut self) -> i64 {
        self.next_id += 1;
        self.next_id
    }
}

/// The event log in memory.
#[derive(Default)]
pub struct MemoryLog {
    inner: Mutex<Inner>,
}

fn lock(m: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn ttl_of(ttl: Duration) -> chrono::Duration {
    chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::MAX)
}

#[async_trait]
impl RunLog for MemoryLog {
    async fn create_run(&self, new: NewRun) -> Result<(RunSummary, bool), LogError> {
        let mut inner = lock(&self.inner);
        let run_id = new.start.run_id;
        if let Some(key) = &new.idempotency_key
            && let Some(existing) = inner.keys.get(&(new.tenant.clone(), key.clone()))
        {
            return Ok((inner.runs[existing].summary.clone(), false));
        }
        let state = RunState::replay(run_id, std::slice::from_ref(&new.start)).map_err(|e| {
            LogError::Invalid {
                run_id,
                reason: e.to_string(),
            }
        })?;
        let now = Utc::now();
        let summary = RunSummary::admitted(&new, &state, now);
        if inner.runs.contains_key(&run_id) {
            return Err(LogError::Invalid {
                run_id,
                reason: "run id already exists".into(),
            });
        }
        if let Some(key) = new.idempotency_key {
            inner.keys.insert((new.tenant, key), run_id);
        }
        inner.runs.insert(
            run_id,
            Record {
                summary: summary.clone(),
                state,
                events: vec![new.start],
                lease: None,
                inbox: Vec::new(),
            },
        );
        let id = inner.id();
        inner.outbox.insert(id, Job::start(run_id, 1));
        Ok((summary, true))
    }

    async fn get_run(&self, run_id: Uuid) -> Result<RunSummary, LogError> {
        lock(&self.inner)
            .runs
            .get(&run_id)
            .map(|r| r.summary.clone())
            .ok_or(LogError::NotFound(run_id))
    }

    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, LogError> {
        let inner = lock(&self.inner);
        let mut runs: Vec<RunSummary> = inner
            .runs
            .values()
            .map(|r| &r.summary)
            .filter(|s| filter.before.is_none_or(|b| s.run_id < b) && filter.matches(s))
            .cloned()
            .collect();
        runs.sort_by_key(|s| std::cmp::Reverse(s.run_id));
        runs.truncate(filter.limit.clamp(1, 1000));
        Ok(runs)
    }

    async fn stranded_children(&self, limit: usize) -> Result<Vec<(Uuid, Uuid)>, LogError> {
        let inner = lock(&self.inner);
        let done = |id: &Uuid| {
            inner
                .runs
                .get(id)
                .is_some_and(|p| p.summary.status == RunStatus::Done)
        };
        Ok(inner
            .runs
            .values()
            .filter(|r| {
                r.summary.status != RunStatus::Done
                    && !r.inbox.iter().any(|(_, d, consumed)| {
                        !consumed && d.as_deref() == Some(crate::CANCEL_KEY)
                    })
            })
            .filter_map(|r| {
                let parent = r.summary.parent_run_id.filter(done)?;
                Some((r.summary.run_id, parent))
            })
            .take(limit)
            .collect())
    }

    async fn events(&self, run_id: Uuid, after: u64, limit: usize) -> Result<Vec<Event>, LogError> {
        let inner = lock(&self.inner);
        let r = inner.runs.get(&run_id).ok_or(LogError::NotFound(run_id))?;
        Ok(r.events
            .iter()
            .skip(after as usize)
            .take(limit)
            .cloned()
            .collect())
    }

    async fn load(&self, run_id: Uuid) -> Result<RunState, LogError> {
        lock(&self.inner)
            .runs
            .get(&run_id)
            .map(|r| r.state.clone())
            .ok_or(LogError::NotFound(run_id))
    }

    async fn acquire(&self, run_id: Uuid, owner: &str, ttl: Duration) -> Result<Lease, LogError> {
        let mut inner = lock(&self.inner);
        let r = inner
            .runs
            .get_mut(&run_id)
            .ok_or(LogError::NotFound(run_id))?;
        let now = Utc::now();
        if let Some(held) = &r.lease
            && held.expires_at > now
        {
            return Err(LogError::LeaseHeld {
                run_id,
                owner: held.owner.clone(),
                until: held.expires_at,
            });
        }
        let lease = Lease {
            run_id,
            owner: owner.to_owned(),
            token: Uuid::now_v7(),
            expires_at: now + ttl_of(ttl),
            taken_over: r.lease.is_some(),
        };
        r.lease = Some(lease.clone());
        Ok(lease)
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease, LogError> {
        let mut inner = lock(&self.inner);
        let r = inner
            .runs
            .get_mut(&lease.run_id)
            .ok_or(LogError::NotFound(lease.run_id))?;
        let now = Utc::now();
        match &mut r.lease {
            Some(held) if held.token == lease.token && held.expires_at > now => {
                held.expires_at = now + ttl_of(ttl);
                Ok(held.clone())
            }
            _ => Err(LogError::LeaseLost(lease.run_id)),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<(), LogError> {
        let mut inner = lock(&self.inner);
        if let Some(r) = inner.runs.get_mut(&lease.run_id)
            && r.lease.as_ref().is_some_and(|l| l.token == lease.token)
        {
            r.lease = None;
        }
        Ok(())
    }

    async fn commit(
        &self,
        lease: &Lease,
        events: &[Event],
        state: &RunState,
        consumed: &[i64],
    ) -> Result<(), LogError> {
        let mut inner = lock(&self.inner);
        let run_id = lease.run_id;
        let r = inner
            .runs
            .get_mut(&run_id)
            .ok_or(LogError::NotFound(run_id))?;
        if !r
            .lease
            .as_ref()
            .is_some_and(|l| l.token == lease.token && l.expires_at > Utc::now())
        {
            return Err(LogError::LeaseLost(run_id));
        }
        let head = r.summary.head_seq;
        if let Some(first) = events.first()
            && first.seq != head + 1
        {
            return Err(LogError::Conflict {
                run_id,
                expected: first.seq - 1,
                actual: head,
            });
        }
        let mut next = r.state.clone();
        for e in events {
            next.apply(e).map_err(|err| LogError::Invalid {
                run_id,
                reason: err.to_string(),
            })?;
        }
        if next.head_seq != state.head_seq {
            return Err(LogError::Invalid {
                run_id,
                reason: "state does not match the events".into(),
            });
        }
        r.events.extend_from_slice(events);
        r.summary = r.summary.updated(&next, Utc::now());
        r.state = next;
        for (item, _, done) in &mut r.inbox {
            if consumed.contains(&item.id) {
                *done = true;
            }
        }
        let tenant = r.summary.tenant.clone();
        for e in events {
            match &e.kind {
                EventKind::ApprovalRequested { .. } => {
                    inner.approvals.extend(
                        crate::archive::ApprovalRecord::requested(e)
                            .map(|a| a.into_row(run_id, tenant.clone())),
                    );
                }
                EventKind::ApprovalResolved { call_id, .. } => {
                    for a in inner
                        .approvals
                        .iter_mut()
                        .filter(|a| a.run_id == run_id && &a.call_id == call_id)
                    {
                        a.status = ApprovalStatus::Decided;
                    }
                }
                _ => {}
            }
        }
        if state.phase == Phase::Done {
            for a in inner.approvals.iter_mut().filter(|a| a.run_id == run_id) {
                a.status = ApprovalStatus::Decided;
            }
        }
        Ok(())
    }

    /// The state is rebuilt by replaying the tombstones.
    async fn erase_run(
        &self,
        run_id: Uuid,
        by: &str,
        at: DateTime<Utc>,
    ) -> Result<RunSummary, LogError> {
        let mut inner = lock(&self.inner);
        let r = inner
            .runs
            .get_mut(&run_id)
            .ok_or(LogError::NotFound(run_id))?;
        if r.summary.erased_at.is_some() {
            return Ok(r.summary.clone());
        }
        if r.summary.status != RunStatus::Done {
            return Err(LogError::NotFinished(run_id));
        }
        if let Some(held) = r.lease.as_ref().filter(|l| l.expires_at > Utc::now()) {
            return Err(LogError::LeaseHeld {
                run_id,
                owner: held.owner.clone(),
                until: held.expires_at,
            });
        }
        let events: Vec<Event> = r.events.iter().map(Event::erased).collect();
        let state = crate::erased_replay(run_id, &events)?;
        r.events = events;
        r.state = state;
        for (item, _, _) in &mut r.inbox {
            item.payload = item.payload.erased();
        }
        r.summary.goal = erased_text(&r.summary.goal);
        r.summary.outcome = r.summary.outcome.as_ref().map(Outcome::erased);
        r.summary.pull_point = r.summary.pull_point.as_ref().map(PullPoint::erased);
        if r.summary.error.is_some() {
            r.summary.error = Some(glia_proto::TOMBSTONE.to_owned());
        }
        r.summary.erased_at = Some(at);
        r.summary.erased_by = Some(by.to_owned());
        let summary = r.summary.clone();
        for a in inner.approvals.iter_mut().filter(|a| a.run_id == run_id) {
            a.input = erased_value();
            a.args_hash = erased_args_hash();
        }
        Ok(summary)
    }

    async fn expired_runs(&self, filter: &ExpiredFilter) -> Result<Vec<Uuid>, LogError> {
        let inner = lock(&self.inner);
        let mut runs: Vec<&RunSummary> = inner
            .runs
            .values()
            .map(|r| &r.summary)
            .filter(|s| crate::expired(s, filter))
            .collect();
        runs.sort_by_key(|s| (s.ended_at.unwrap_or(s.updated_at), s.run_id));
        Ok(runs
            .into_iter()
            .take(filter.limit.clamp(1, 1000))
            .map(|s| s.run_id)
            .collect())
    }
}

#[async_trait]
impl Inbox for MemoryLog {
    async fn post(&self, run_id: Uuid, payload: Payload) -> Result<i64, LogError> {
        let mut inner = lock(&self.inner);
        let id = inner.id();
        let key = dedupe_key(&payload);
        let r = inner
            .runs
            .get_mut(&run_id)
            .ok_or(LogError::NotFound(run_id))?;
        let facts = PostFacts {
            done: r.summary.status == RunStatus::Done,
            cancel_pending: r
                .inbox
                .iter()
                .any(|(_, d, done)| !done && d.as_deref() == Some(crate::CANCEL_KEY)),
            key_taken: key
                .as_ref()
                .is_some_and(|k| r.inbox.iter().any(|(_, d, _)| d.as_ref() == Some(k))),
        };
        if let Some(refused) = post_refusal(run_id, key.as_deref(), facts) {
            return Err(refused);
        }
        r.inbox.push((
            InboxItem {
                id,
                payload: payload.clone(),
            },
            key,
            false,
        ));
        let head_seq = r.summary.head_seq;
        if let Payload::Approval { call_id, .. } = &payload {
            for a in inner
                .approvals
                .iter_mut()
                .filter(|a| a.run_id == run_id && &a.call_id == call_id)
            {
                a.status = ApprovalStatus::Decided;
            }
        }
        let job_id = inner.id();
        inner.outbox.insert(job_id, Job::resume(run_id, head_seq));
        Ok(id)
    }

    async fn inbox(&self, run_id: Uuid) -> Result<Vec<InboxItem>, LogError> {
        let inner = lock(&self.inner);
        let r = inner.runs.get(&run_id).ok_or(LogError::NotFound(run_id))?;
        Ok(r.inbox
            .iter()
            .filter(|(_, _, done)| !done)
            .map(|(i, _, _)| i.clone())
            .collect())
    }
}

#[async_trait]
impl Approvals for MemoryLog {
    async fn approvals(&self, filter: &ApprovalFilter) -> Result<Vec<ApprovalRow>, LogError> {
        let inner = lock(&self.inner);
        let mut rows: Vec<ApprovalRow> = inner
            .approvals
            .iter()
            .filter(|a| filter.tenant.as_ref().is_none_or(|t| &a.tenant == t))
            .filter(|a| filter.tool.as_ref().is_none_or(|t| &a.tool == t))
            .filter(|a| filter.run_id.is_none_or(|r| a.run_id == r))
            .filter(|a| !filter.pending_only || a.status == ApprovalStatus::Pending)
            .filter(|a| {
                filter.expired_by.is_none_or(|t| {
                    a.status == ApprovalStatus::Pending
                        && !a.escalated
                        && a.expires_at.is_some_and(|e| e <= t)
                })
            })
            .cloned()
            .collect();
        rows.sort_by_key(|a| a.requested_at);
        rows.truncate(filter.limit.clamp(1, 1000));
        Ok(rows)
    }

    async fn escalate(&self, run_id: Uuid, call_id: &str) -> Result<(), LogError> {
        let mut inner = lock(&self.inner);
        let row = inner
            .approvals
            .iter_mut()
            .find(|a| a.run_id == run_id && a.call_id == call_id)
            .ok_or(LogError::NotFound(run_id))?;
        row.escalated = true;
        Ok(())
    }
}

#[async_trait]
impl Outbox for MemoryLog {
    async fn outbox(&self, limit: usize) -> Result<Vec<(i64, Job)>, LogError> {
        Ok(lock(&self.inner)
            .outbox
            .iter()
            .take(limit)
            .map(|(id, job)| (*id, *job))
            .collect())
    }

    async fn outbox_done(&self, ids: &[i64]) -> Result<(), LogError> {
        let mut inner = lock(&self.inner);
        for id in ids {
            inner.outbox.remove(id);
        }
        Ok(())
    }

    async fn orphaned(&self, limit: usize) -> Result<Vec<Orphan>, LogError> {
        let inner = lock(&self.inner);
        let now = Utc::now();
        let mut jobs: Vec<Orphan> = inner
            .runs
            .values()
            .filter(|r| {
                r.summary.status == RunStatus::Runnable || r.inbox.iter().any(|(_, _, done)| !done)
            })
            .filter(|r| r.summary.status != RunStatus::Done)
            .filter(|r| r.lease.as_ref().is_none_or(|l| l.expires_at <= now))
            .map(|r| Orphan {
                job: Job {
                    run_id: r.summary.run_id,
                    head_seq: r.summary.head_seq,
                    resume: r.inbox.iter().any(|(_, _, done)| !done),
                },
                queued: r.summary.head_seq == 1
                    && r.summary.status == RunStatus::Runnable
                    && r.lease.is_none(),
            })
            .collect();
        jobs.sort_by_key(|o| (o.queued, o.job.run_id));
        jobs.truncate(limit);
        Ok(jobs)
    }
}

#[async_trait]
impl AgentRegistry for MemoryLog {
    async fn put_agent(
        &self,
        tenant: &str,
        name: &str,
        definition: &str,
        content_hash: &str,
    ) -> Result<(AgentVersion, bool), LogError> {
        let mut inner = lock(&self.inner);
        let versions = inner
            .agents
            .entry((tenant.to_owned(), name.to_owned()))
            .or_default();
        if let Some(last) = versions.last()
            && last.content_hash == content_hash
        {
            return Ok((last.clone(), false));
        }
        let version = AgentVersion {
            tenant: tenant.to_owned(),
            name: name.to_owned(),
            version: u32::try_from(versions.len() + 1)
                .map_err(|_| LogError::Unavailable("too many versions".into()))?,
            content_hash: content_hash.to_owned(),
            definition: definition.to_owned(),
            created_at: Utc::now(),
        };
        versions.push(version.clone());
        Ok((version, true))
    }

    async fn get_agent(
        &self,
        tenant: &str,
        name: &str,
        version: Option<u32>,
    ) -> Result<Option<AgentVersion>, LogError> {
        let inner = lock(&self.inner);
        let Some(versions) = inner.agents.get(&(tenant.to_owned(), name.to_owned())) else {
            return Ok(None);
        };
        Ok(match version {
            None => versions.last().cloned(),
            Some(v) => versions.iter().find(|a| a.version == v).cloned(),
        })
    }

    async fn list_agents(&self, tenant: &str) -> Result<Vec<AgentVersion>, LogError> {
        let inner = lock(&self.inner);
        Ok(inner
            .agents
            .iter()
            .filter(|((t, _), _)| t == tenant)
            .filter_map(|(_, versions)| versions.last().cloned())
            .collect())
    }
}

#[async_trait]
impl Reports for MemoryLog {
    async fn tenant_usage(&self, tenant: &str, day: NaiveDate) -> Result<Spend, LogError> {
        let start = day.and_time(chrono::NaiveTime::MIN).and_utc();
        let end = start + chrono::Duration::days(1);
        let inner = lock(&self.inner);
        let spend = inner
            .runs
            .values()
            .filter(|r| r.summary.tenant == tenant)
            .flat_map(|r| &r.events)
            .filter(|e| e.at >= start && e.at < end)
            .filter_map(|e| Spend::of_event(&e.kind))
            .fold(Spend::ZERO, Spend::saturating_add);
        Ok(spend)
    }

    async fn ready(&self) -> Result<(), LogError> {
        Ok(())
    }
}

/// The job queue in memory: two unbounded multi-consumer channels
/// (resumes, starts) shared by every consumer, none of which waits for
/// another (a worker waiting for a resume does not hold back the starts);
/// [`JobQueue::next`] takes a ready resume before a ready start.
pub struct MemoryQueue {
    tx: Senders,
    rx: Receivers,
    depth: std::sync::Arc<AtomicU64>,
}

type Sender = async_channel::Sender<(Job, bool)>;
type Receiver = async_channel::Receiver<(Job, bool)>;

/// The sending ends: resumes and starts.
#[derive(Clone)]
struct Senders {
    resumes: Sender,
    starts: Sender,
}

impl Senders {
    /// Queue `job` in its line (`redelivered` as it will be delivered).
    fn send(&self, job: Job, redelivered: bool) -> Result<(), QueueError> {
        let line = if job.resume {
            &self.resumes
        } else {
            &self.starts
        };
        line.try_send((job, redelivered))
            .map_err(|_| QueueError::Closed)
    }
}

struct Receivers {
    resumes: Receiver,
    starts: Receiver,
}

impl Default for MemoryQueue {
    fn default() -> Self {
        let (resumes, resumes_rx) = async_channel::unbounded();
        let (starts, starts_rx) = async_channel::unbounded();
        MemoryQueue {
            tx: Senders { resumes, starts },
            rx: Receivers {
                resumes: resumes_rx,
                starts: starts_rx,
            },
            depth: Default::default(),
        }
    }
}

impl MemoryQueue {
    fn delivery(&self, (job, redelivered): (Job, bool)) -> Delivery {
        self.depth.fetch_sub(1, Ordering::SeqCst);
        let acker = MemoryAcker {
            job,
            tx: self.tx.clone(),
            depth: self.depth.clone(),
        };
        Delivery {
            job,
            redelivered,
            acker: Box::new(acker),
            enqueued_at: None,
        }
    }
}

struct MemoryAcker {
    job: Job,
    tx: Senders,
    depth: std::sync::Arc<AtomicU64>,
}

#[async_trait]
impl Acker for MemoryAcker {
    async fn ack(&self) -> Result<(), QueueError> {
        Ok(())
    }

    /// Requeued at the back of its line.
    async fn nack(&self, requeue: bool) -> Result<(), QueueError> {
        if requeue {
            self.depth.fetch_add(1, Ordering::SeqCst);
            self.tx.send(self.job, true)?;
        }
        Ok(())
    }
}

#[async_trait]
impl JobQueue for MemoryQueue {
    async fn publish(&self, job: &Job) -> Result<(), QueueError> {
        self.depth.fetch_add(1, Ordering::SeqCst);
        self.tx.send(*job, false)
    }

    async fn next(&self) -> Result<Delivery, QueueError> {
        // Both receives are cancel-safe: a job is taken only by the one
        // that completes.
        let Receivers { resumes, starts } = &self.rx;
        let got = tokio::select! {
            biased;
            got = resumes.recv() => got,
            got = starts.recv() => got,
        };
        Ok(self.delivery(got.map_err(|_| QueueError::Closed)?))
    }

    async fn next_resume(&self) -> Result<Delivery, QueueError> {
        let got = self.rx.resumes.recv().await;
        Ok(self.delivery(got.map_err(|_| QueueError::Closed)?))
    }

    async fn depth(&self) -> Result<u64, QueueError> {
        Ok(self.depth.load(Ordering::SeqCst))
    }
}

/// The ledger in memory. Budget counters follow the same rules as the Redis
/// adapter's (see [`Ledger`]); an expired counter is missing.
#[derive(Default)]
pub struct MemoryLedger {
    cancelled: Mutex<HashSet<Uuid>>,
    paused: Mutex<HashSet<Uuid>>,
    live: Mutex<HashMap<Uuid, broadcast::Sender<LiveEvent>>>,
    budgets: Mutex<HashMap<String, Counter>>,
    held: Mutex<HashMap<String, (HeldResult, std::time::Instant)>>,
    /// Calls marked running, by idempotency key: when the mark lapses.
    running: Mutex<HashMap<String, std::time::Instant>>,
}

/// One budget scope's counter and the request ids it has seen: `Some(amount)`
/// reserved, `None` settled.
struct Counter {
    used: Spend,
    requests: HashMap<String, Option<Spend>>,
    expires_at: std::time::Instant,
}

impl MemoryLedger {
    /// Drop every budget counter, as a flushed or restarted Redis would
    /// (for tests of the rebuild from the log).
    pub fn forget_budgets(&self) {
        self.budget_counters().clear();
    }

    /// Drop every held tool result, as a flushed or lost Redis would (for
    /// tests of what happens then).
    pub fn forget_held(&self) {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Remove the running marks of `keys` (their results are held).
    pub(crate) fn unmark_running<'a>(&self, keys: impl IntoIterator<Item = &'a String>) {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        for key in keys {
            running.remove(key);
        }
    }

    /// The budget counters, expired ones removed.
    fn budget_counters(&self) -> std::sync::MutexGuard<'_, HashMap<String, Counter>> {
        let mut budgets = self.budgets.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        budgets.retain(|_, c| c.expires_at > now);
        budgets
    }

    fn channel(&self, run_id: Uuid) -> broadcast::Sender<LiveEvent> {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|_, tx| tx.receiver_count() > 0);
        live.entry(run_id)
            .or_insert_with(|| broadcast::channel(1024).0)
            .clone()
    }
}

#[async_trait]
impl Ledger for MemoryLedger {
    async fn cancel(&self, run_id: Uuid) -> Result<(), LedgerError> {
        self.cancelled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(run_id);
        Ok(())
    }

    async fn is_cancelled(&self, run_id: Uuid) -> Result<bool, LedgerError> {
        Ok(self
            .cancelled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&run_id))
    }

    async fn set_paused(&self, run_id: Uuid, paused: bool) -> Result<(), LedgerError> {
        let mut flags = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        if paused {
            flags.insert(run_id);
        } else {
            flags.remove(&run_id);
        }
        Ok(())
    }

    async fn signal(&self, run_id: Uuid) -> Result<Signal, LedgerError> {
        Ok(Signal {
            cancelled: self.is_cancelled(run_id).await?,
            paused: self
                .paused
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&run_id),
        })
    }

    async fn publish_live(&self, run_id: Uuid, event: &LiveEvent) -> Result<(), LedgerError> {
        let _ = self.channel(run_id).send(event.clone());
        Ok(())
    }

    async fn subscribe_live(
        &self,
        run_id: Uuid,
    ) -> Result<BoxStream<'static, LiveEvent>, LedgerError> {
        let rx = self.channel(run_id).subscribe();
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(e) => return Some((e, rx)),
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
        Ok(stream.boxed())
    }

    async fn ready(&self) -> Result<(), LedgerError> {
        Ok(())
    }

    async fn reserve(
        &self,
        scope: &str,
        request_id: &str,
        amount: Spend,
        cap: SpendCap,
    ) -> Result<Reservation, LedgerError> {
        let mut budgets = self.budget_counters();
        let Some(c) = budgets.get_mut(scope) else {
            return Ok(Reservation::Missing);
        };
        if c.requests.contains_key(request_id) {
            return Ok(Reservation::Granted { used: c.used });
        }
        let refuses = |cap: Option<u64>, used: u64, amount: u64| {
            cap.is_some_and(|cap| used >= cap || used.saturating_add(amount) > cap)
        };
        if refuses(
            cap.cost_usd_micros,
            c.used.cost_usd_micros,
            amount.cost_usd_micros,
        ) {
            return Ok(Reservation::Exceeded {
                used: c.used,
                cap: CapKind::Cost,
            });
        }
        if refuses(cap.tokens, c.used.tokens, amount.tokens) {
            return Ok(Reservation::Exceeded {
                used: c.used,
                cap: CapKind::Tokens,
            });
        }
        c.used = c.used.saturating_add(amount);
        c.requests.insert(request_id.to_owned(), Some(amount));
        Ok(Reservation::Granted { used: c.used })
    }

    async fn settle(
        &self,
        scope: &str,
        request_id: &str,
        actual: Spend,
    ) -> Result<Settlement, LedgerError> {
        let mut budgets = self.budget_counters();
        let Some(c) = budgets.get_mut(scope) else {
            return Ok(Settlement::Missing);
        };
        let reserved = match c.requests.get(request_id) {
            Some(None) => return Ok(Settlement::Settled { used: c.used }),
            Some(Some(amount)) => *amount,
            None => Spend::ZERO,
        };
        c.used = Spend {
            tokens: c
                .used
                .tokens
                .saturating_sub(reserved.tokens)
                .saturating_add(actual.tokens),
            cost_usd_micros: c
                .used
                .cost_usd_micros
                .saturating_sub(reserved.cost_usd_micros)
                .saturating_add(actual.cost_usd_micros),
        };
        c.requests.insert(request_id.to_owned(), None);
        Ok(Settlement::Settled { used: c.used })
    }

    async fn seed(&self, scope: &str, used: Spend, ttl: Duration) -> Result<bool, LedgerError> {
        let mut budgets = self.budget_counters();
        if budgets.contains_key(scope) {
            return Ok(false);
        }
        let now = std::time::Instant::now();
        let expires_at = now
            .checked_add(ttl.max(Duration::from_secs(1)))
            .unwrap_or(now + Duration::from_secs(100 * 365 * 24 * 3600));
        budgets.insert(
            scope.to_owned(),
            Counter {
                used,
                requests: HashMap::new(),
                expires_at,
            },
        );
        Ok(true)
    }

    async fn hold_results(&self, held: &[(String, HeldResult)]) -> Result<(), LedgerError> {
        let mut kept = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        kept.retain(|_, (_, expires_at)| *expires_at > now);
        let expires_at = now + crate::HELD_RESULT_TTL;
        for (key, result) in held {
            kept.insert(key.clone(), (result.clone(), expires_at));
        }
        self.unmark_running(held.iter().map(|(key, _)| key));
        Ok(())
    }

    async fn mark_running(&self, keys: &[String], ttl: Duration) -> Result<(), LedgerError> {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        running.retain(|_, until| *until > now);
        let until = now + ttl.max(Duration::from_millis(1));
        for key in keys {
            running.insert(key.clone(), until);
        }
        Ok(())
    }

    async fn running(&self, key: &str) -> Result<bool, LedgerError> {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        Ok(running
            .get(key)
            .is_some_and(|until| *until > std::time::Instant::now()))
    }

    async fn held_result(&self, key: &str) -> Result<Option<HeldResult>, LedgerError> {
        let kept = self.held.lock().unwrap_or_else(|e| e.into_inner());
        Ok(kept
            .get(key)
            .filter(|(_, expires_at)| *expires_at > std::time::Instant::now())
            .map(|(r, _)| r.clone()))
    }

    async fn release_held(&self, keys: &[String]) -> Result<(), LedgerError> {
        let mut kept = self.held.lock().unwrap_or_else(|e| e.into_inner());
        for key in keys {
            kept.remove(key);
        }
        Ok(())
    }

    async fn forget_run(&self, run_id: Uuid) -> Result<(), LedgerError> {
        let prefix = format!("{run_id}:");
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|key, _| !key.starts_with(&prefix));
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|key, _| !key.starts_with(&prefix));
        Ok(())
    }
}

// --- issue 32: waits ---
#[async_trait]
impl crate::Waits for MemoryLog {
    async fn due_waits(&self, now_ms: i64, limit: usize) -> Result<Vec<crate::DueWait>, LogError> {
        let inner = lock(&self.inner);
        let mut due: Vec<crate::DueWait> = inner
            .runs
            .values()
            .filter(|r| r.summary.status == RunStatus::Parked)
            .filter_map(|r| {
                let at = match r.summary.pull_point.as_ref()? {
                    PullPoint::AwaitingTimer { wake_at_ms, .. } => *wake_at_ms,
                    PullPoint::AwaitingEvent {
                        timeout_at_ms: Some(at),
                        ..
                    } => *at,
                    _ => return None,
                };
                let key = format!("wake:{at}");
                let posted = r.inbox.iter().any(|(_, d, _)| d.as_ref() == Some(&key));
                (at <= now_ms && !posted).then_some(crate::DueWait {
                    run_id: r.summary.run_id,
                    due_at_ms: at,
                })
            })
            .collect();
        due.sort_by_key(|d| (d.due_at_ms, d.run_id));
        due.truncate(limit);
        Ok(due)
    }

    async fn keep_event(
        &self,
        tenant: &str,
        event: &glia_proto::ArrivedEvent,
    ) -> Result<bool, LogError> {
        let mut inner = lock(&self.inner);
        if inner
            .wait_events
            .iter()
            .any(|(t, e)| t == tenant && e.id == event.id)
        {
            return Ok(false);
        }
        inner.wait_events.push((tenant.to_owned(), event.clone()));
        Ok(true)
    }

    async fn event_deliveries(
        &self,
        since_ms: i64,
        only: Option<(&str, Uuid)>,
        limit: usize,
    ) -> Result<Vec<(Uuid, glia_proto::ArrivedEvent)>, LogError> {
        let inner = lock(&self.inner);
        let mut events: Vec<&(String, glia_proto::ArrivedEvent)> = inner
            .wait_events
            .iter()
            .filter(|(t, e)| {
                e.received_at_ms >= since_ms
                    && only.is_none_or(|(tenant, id)| tenant == t && id == e.id)
            })
            .collect();
        events.sort_by_key(|(_, e)| (e.received_at_ms, e.id));
        let mut out = Vec::new();
        let mut runs: Vec<&Record> = inner.runs.values().collect();
        runs.sort_by_key(|r| r.summary.run_id);
        for r in runs {
            let Some(PullPoint::AwaitingEvent { keys, .. }) = &r.summary.pull_point else {
                continue;
            };
            if r.summary.status != RunStatus::Parked {
                continue;
            }
            let pending = r.inbox.iter().any(|(_, key, consumed)| {
                !consumed && key.as_deref().is_some_and(|k| k.starts_with("event:"))
            });
            if pending {
                continue;
            }
            let first = events.iter().find(|(t, e)| {
                *t == r.summary.tenant
                    && keys.contains(&e.key)
                    && !r
                        .inbox
                        .iter()
                        .any(|(_, key, _)| key.as_deref() == Some(&format!("event:{}", e.id)))
            });
            if let Some((_, e)) = first {
                out.push((r.summary.run_id, e.clone()));
                if out.len() >= limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    async fn forget_events(&self, before_ms: i64) -> Result<u64, LogError> {
        let mut inner = lock(&self.inner);
        let before = inner.wait_events.len();
        inner
            .wait_events
            .retain(|(_, e)| e.received_at_ms >= before_ms);
        Ok((before - inner.wait_events.len()) as u64)
    }
}
// --- end waits ---
