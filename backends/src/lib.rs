//! glia-backends: the three ports of the fleet and their adapters.
//!
//! - [`EventLog`]: the truth. Runs, their append-only event logs, leases,
//!   checkpoints, the inbox of posted payloads, approvals, the outbox of jobs,
//!   agent definitions; one trait per concern ([`event_log`]: [`RunLog`],
//!   [`Inbox`], [`Approvals`], [`Outbox`], [`AgentRegistry`], [`Reports`]).
//!   Adapters: [`memory::MemoryLog`]; Postgres ([`postgres`]); SQLite
//!   ([`sqlite`], the single node).
//! - [`JobQueue`]: wake-ups. A [`Job`] names a run and the head sequence it
//!   expects. Adapters: [`memory::MemoryQueue`]; RabbitMQ ([`rabbitmq`]);
//!   SQLite ([`sqlite::SqliteQueue`]).
//! - [`Ledger`]: fast shared counters and signals: cancellation flags, live
//!   deltas, budget counters (per-tenant daily spend, reserved before a
//!   model call and settled after), and tool results held until they are in
//!   the log ([`Ledger::hold_results`]). Adapters: [`memory::MemoryLedger`]; Redis
//!   ([`redis_ledger`]); SQLite ([`sqlite::SqliteLedger`]).
//!
//! [`archive`] moves whole runs between event logs (`glia export`/`import`).
//!
//! Losing a queued job or a ledger key never loses a run: the reconciler
//! re-enqueues runnable runs from the log, and a missing budget counter is
//! rebuilt from the log ([`Reports::tenant_usage`], [`Ledger::seed`]) before
//! it is used.

#![warn(missing_docs)]

pub mod archive;
pub mod batches;
#[cfg(feature = "testkit")]
pub mod conformance;
pub mod event_log;
pub mod memory;
pub mod postgres;
pub mod rabbitmq;
pub mod redis_ledger;
pub mod sqlite;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod webhooks;

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use futures::stream::BoxStream;
use glia_proto::{Event, LiveEvent, Outcome, Phase, PullPoint, Resume, RunState, Status};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

pub use event_log::{AgentRegistry, Approvals, EventLog, Inbox, Outbox, Reports, RunLog};

/// The spend a ledger counts and the results it holds are the contract's
/// (`glia_proto`): the loop speaks them without linking a backend.
pub use glia_proto::{HeldResult, Spend, SpendCap};

/// A wake-up for a run: "run `run_id` has something to do; its head was
/// `head_seq` when this was sent". JSON on the wire: `{"run_id": "…",
/// "head_seq": 7}`, plus `"resume": true` for a [resume](Job::resume).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Job {
    /// The run.
    pub run_id: Uuid,
    /// Head sequence when the job was written.
    pub head_seq: u64,
    /// True when the job resumes a parked run: a payload was posted to it
    /// (approval decision, tool result, user message, budget extension or
    /// resume, operator pause or resume, expiry, cancel). False when it
    /// starts a run or continues one that was not waiting for anyone.
    /// Queues hand resumes out before starts ([`JobQueue::next`]). Absent
    /// on the wire means false, so outbox rows and messages written before
    /// the field existed still read as starts; a start is written without it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resume: bool,
}

/// A run with work and no live lease ([`Outbox::orphaned`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Orphan {
    /// The job that would wake it: at its head, a resume when a payload
    /// waits in its inbox.
    pub job: Job,
    /// Admitted and never started, as far as the log tells: no lease (none
    /// taken, or one let go) and nothing after its `session.start` (head 1).
    /// Its admission's job normally still waits in the queue, behind a
    /// backlog of other starts. False for every other orphan: a lease that
    /// lapsed (its worker died or stalled after acking the job), a run let
    /// go with work left after it recorded something (a job abandoned on a
    /// failing store), a parked run with a payload waiting.
    pub queued: bool,
}

impl Job {
    /// A job that starts or continues run `run_id` at `head_seq`.
    pub fn start(run_id: Uuid, head_seq: u64) -> Job {
        Job {
            run_id,
            head_seq,
            resume: false,
        }
    }

    /// A job that resumes parked run `run_id` at `head_seq` (a payload
    /// waits in its inbox).
    pub fn resume(run_id: Uuid, head_seq: u64) -> Job {
        Job {
            run_id,
            head_seq,
            resume: true,
        }
    }
}

/// Where a run stands, coarsely, for listing and filtering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// A worker can advance it.
    Runnable,
    /// It waits at a pull point.
    Parked,
    /// Finished, failed or cancelled.
    Done,
}

impl RunStatus {
    /// The status of `state`.
    pub fn of(state: &RunState) -> RunStatus {
        match state.status() {
            Status::Runnable => RunStatus::Runnable,
            Status::Parked(_) => RunStatus::Parked,
            Status::Done(_) => RunStatus::Done,
        }
    }

    /// `runnable`, `parked`, `done`.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Runnable => "runnable",
            RunStatus::Parked => "parked",
            RunStatus::Done => "done",
        }
    }
}

/// A run's row: identity and a summary of its state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// The run.
    pub run_id: Uuid,
    /// Owning tenant; a run is visible only to it.
    pub tenant: String,
    /// Batch it belongs to.
    pub batch_id: Option<Uuid>,
    /// The goal.
    pub goal: String,
    /// Coarse status.
    pub status: RunStatus,
    /// State-machine phase.
    pub phase: Phase,
    /// Where it waits, when parked.
    pub pull_point: Option<PullPoint>,
    /// How it ended, when done.
    pub outcome: Option<Outcome>,
    /// Sequence of its last event.
    pub head_seq: u64,
    /// When it was admitted.
    pub created_at: DateTime<Utc>,
    /// When its last event was committed.
    pub updated_at: DateTime<Utc>,
}

impl RunSummary {
    /// The summary of `state`, keeping identity fields from `self`.
    pub fn updated(&self, state: &RunState, now: DateTime<Utc>) -> RunSummary {
        RunSummary {
            status: RunStatus::of(state),
            phase: state.phase,
            pull_point: state.parked.clone(),
            outcome: state.outcome.clone(),
            head_seq: state.head_seq,
            updated_at: now,
            ..self.clone()
        }
    }
}

/// A run to admit.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    /// Owning tenant.
    pub tenant: String,
    /// Per-tenant idempotency key: admitting the same key twice returns the
    /// first run.
    pub idempotency_key: Option<String>,
    /// Batch it belongs to.
    pub batch_id: Option<Uuid>,
    /// Its `session.start` event (seq 1), already validated by applying it to
    /// a fresh [`RunState`].
    pub start: Event,
}

/// Which runs to list. Results are ordered by `run_id` (UUIDv7: creation
/// order); `after` is the last `run_id` of the previous page.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunFilter {
    /// Only this tenant's runs (`None`: all tenants, for admins).
    pub tenant: Option<String>,
    /// Only runs with this status.
    pub status: Option<RunStatus>,
    /// Only runs of this batch.
    pub batch_id: Option<Uuid>,
    /// Page cursor.
    pub after: Option<Uuid>,
    /// Page size (at most 1,000).
    pub limit: usize,
}

/// A worker's exclusive, expiring claim on a run. Every commit is fenced by
/// `token`: a lease that lapsed and was taken over can no longer write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The run.
    pub run_id: Uuid,
    /// Worker id, free text.
    pub owner: String,
    /// Fencing token, new for every acquisition.
    pub token: Uuid,
    /// When it lapses unless renewed.
    pub expires_at: DateTime<Utc>,
    /// True when this acquisition took over a lease that lapsed without
    /// being released (its holder died or stalled); false for a free run and
    /// for a renewed lease.
    pub taken_over: bool,
}

/// A payload posted to a parked run, waiting for a worker to apply it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InboxItem {
    /// Position in the run's inbox (increasing).
    pub id: i64,
    /// The payload.
    pub payload: Resume,
}

/// What [`Inbox::open`] made of a job.
// One per job, moved once into the loop: boxing the large variant would buy
// nothing but an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Opening {
    /// The lease is held; the run was read under it.
    Opened(Opened),
    /// The run is done: the job has nothing to do.
    Done,
    /// The job names a head the run has moved past and the run's inbox is
    /// empty, while the run waits at a pull point, or (for a resume job)
    /// another worker holds it and took the payload: nothing to do.
    Stale,
}

/// A run opened for a worker ([`Inbox::open`]).
#[derive(Debug)]
pub struct Opened {
    /// The worker's lease on the run.
    pub lease: Lease,
    /// The run's state, read under the lease.
    pub state: RunState,
    /// Its unconsumed inbox items, oldest first, read under the lease.
    pub inbox: Vec<InboxItem>,
}

/// A tool call waiting for (or past) a person's decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRow {
    /// The run.
    pub run_id: Uuid,
    /// Its tenant.
    pub tenant: String,
    /// The call.
    pub call_id: String,
    /// Tool name.
    pub tool: String,
    /// Arguments to approve.
    pub input: Value,
    /// Hash a decision must quote.
    pub args_hash: String,
    /// `pending` or `decided`.
    pub status: ApprovalStatus,
    /// When it was requested.
    pub requested_at: DateTime<Utc>,
    /// When it expires, if the run set an approval timeout.
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
    /// Past its deadline and handed to a second line of approvers; still pending.
    #[serde(default)]
    pub escalated: bool,
    /// The call already started once and its worker died: it may have taken
    /// effect. Approving runs it again; rejecting leaves its outcome unknown.
    #[serde(default)]
    pub interrupted: bool,
}

/// Where an approval stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatus {
    /// Waiting for a person.
    Pending,
    /// A decision was posted.
    Decided,
}

/// Which approvals to list: oldest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ApprovalFilter {
    /// Only this tenant's.
    pub tenant: Option<String>,
    /// Only this tool's.
    pub tool: Option<String>,
    /// Only this run's.
    pub run_id: Option<Uuid>,
    /// Only pending ones when true.
    pub pending_only: bool,
    /// Only pending, not yet escalated ones whose deadline is at or before
    /// this time (what the reconciler expires).
    pub expired_by: Option<DateTime<Utc>>,
    /// Page size.
    pub limit: usize,
}

/// One immutable version of a registered agent definition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentVersion {
    /// Owning tenant (definitions are per tenant).
    pub tenant: String,
    /// Agent name.
    pub name: String,
    /// Version, from 1.
    pub version: u32,
    /// `sha256:` and the hex SHA-256 of the canonical JSON.
    pub content_hash: String,
    /// The definition's canonical JSON text.
    pub definition: String,
    /// When this version was registered.
    pub created_at: DateTime<Utc>,
}

/// Why an [`EventLog`] call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    /// No such run.
    #[error("run {0} not found")]
    NotFound(Uuid),
    /// The run's head is not where the commit expected it: someone else
    /// extended it. Nothing was written.
    #[error("run {run_id}: head is {actual}, commit expected {expected}")]
    Conflict {
        /// The run.
        run_id: Uuid,
        /// Head the commit was built on.
        expected: u64,
        /// Head in the log.
        actual: u64,
    },
    /// The lease lapsed or was taken over; nothing was written.
    #[error("run {0}: lease lost")]
    LeaseLost(Uuid),
    /// Another worker holds the run's lease.
    #[error("run {run_id}: leased by {owner} until {until}")]
    LeaseHeld {
        /// The run.
        run_id: Uuid,
        /// The holder.
        owner: String,
        /// When its lease lapses.
        until: DateTime<Utc>,
    },
    /// The same payload was already posted (e.g. a second approval decision).
    #[error("run {run_id}: {what} was already posted")]
    Duplicate {
        /// The run.
        run_id: Uuid,
        /// What, e.g. `approval call_3`.
        what: String,
    },
    /// A cancel waits in the run's inbox: no other payload is taken (the
    /// run ends cancelled as soon as a worker applies it).
    #[error("run {0} is being cancelled; nothing but the cancel is taken")]
    Cancelled(Uuid),
    /// The run is done: no payload is taken.
    #[error("run {0} is finished")]
    Finished(Uuid),
    /// The events do not apply to the run's state (a bug in the caller).
    #[error("run {run_id}: invalid events: {reason}")]
    Invalid {
        /// The run.
        run_id: Uuid,
        /// The transition error.
        reason: String,
    },
    /// The backing store failed (connection, timeout).
    #[error("event log unavailable: {0}")]
    Unavailable(String),
    /// A stored record does not decode (a column of the wrong shape, an
    /// unknown status, events that do not apply). Asking again gets the same
    /// answer: not transient. The text names the record, never its content.
    #[error("corrupt record: {0}")]
    Corrupt(String),
}

impl LogError {
    /// True when asking again may succeed: the store did not answer
    /// ([`LogError::Unavailable`]: connection refused or reset, a pool or
    /// call timeout, the server shutting down). Every other error is the
    /// log's answer (lease lost, head moved, not found…) and is final.
    pub fn is_transient(&self) -> bool {
        matches!(self, LogError::Unavailable(_))
    }
}

/// A bucket of [`LogGauges::runs`]: a status and, for parked runs, the kind
/// of pull point (`awaiting_approval`, `awaiting_tool`, `awaiting_input`,
/// `paused`; empty otherwise).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunGaugeKey {
    /// `runnable` or `parked`.
    pub status: &'static str,
    /// The pull point's kind for parked runs, else empty.
    pub pull_point: String,
}

impl RunGaugeKey {
    /// The bucket of a run with this status and pull point.
    pub fn of(status: RunStatus, pull_point: Option<&PullPoint>) -> RunGaugeKey {
        RunGaugeKey {
            status: status.as_str(),
            pull_point: pull_point
                .filter(|_| status == RunStatus::Parked)
                .map(|p| p.name().to_owned())
                .unwrap_or_default(),
        }
    }
}

/// Counts of the event log for the dispatcher's gauges ([`Reports::gauges`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogGauges {
    /// Runs not done, by status and pull point; buckets with no runs may be absent.
    pub runs: std::collections::BTreeMap<RunGaugeKey, u64>,
    /// Approvals waiting for a decision.
    pub approvals_pending: u64,
    /// Pending approvals whose deadline has passed (escalated ones included).
    pub approvals_overdue: u64,
    /// Age of the oldest pending approval in seconds (0 with none).
    pub oldest_approval_age_seconds: f64,
}

/// The dedupe key of a payload: approvals are accepted once per approval
/// request (its `request_seq`; without one, per call and arguments hash),
/// escalations once per approval request, external results once per call,
/// a cancel once ([`CANCEL_KEY`]); other payloads are not deduplicated. So
/// a call that is asked about again (after a crash), or a later call that
/// reuses a call id (some providers number ids per response), can still be
/// decided.
pub fn dedupe_key(payload: &Resume) -> Option<String> {
    match payload {
        Resume::Approval {
            call_id,
            request_seq: Some(seq),
            ..
        } => Some(format!("approval:{call_id}:{seq}")),
        Resume::Approval {
            call_id, args_hash, ..
        } => Some(format!("approval:{call_id}:{args_hash}")),
        Resume::ToolResult { call_id, .. } => Some(format!("tool:{call_id}")),
        Resume::Escalate {
            call_id,
            request_seq,
            ..
        } => Some(format!("escalate:{call_id}:{}", request_seq.unwrap_or(0))),
        Resume::Cancel { .. } => Some(CANCEL_KEY.to_owned()),
        _ => None,
    }
}

/// The dedupe key of a cancel: one cancel waits in an inbox at a time, and
/// while it waits [`Inbox::post`] takes nothing else ([`LogError::Cancelled`]).
pub const CANCEL_KEY: &str = "cancel";

/// The facts about a run that decide whether [`Inbox::post`] takes a
/// payload; each adapter reads them atomically with its write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PostFacts {
    /// The run is done.
    pub done: bool,
    /// A cancel waits, unconsumed, in the run's inbox.
    pub cancel_pending: bool,
    /// The payload's dedupe key is already used for the run.
    pub key_taken: bool,
}

/// The posting rule of [`Inbox::post`], the one every adapter applies:
/// `None` when the payload with dedupe key `key` is taken, else why not. A
/// done run refuses everything ([`LogError::Finished`]); while a cancel
/// waits, a second cancel is a duplicate and anything else
/// [`LogError::Cancelled`] (even a payload whose key is taken); otherwise a
/// taken key is a [`LogError::Duplicate`].
pub fn post_refusal(run_id: Uuid, key: Option<&str>, facts: PostFacts) -> Option<LogError> {
    if facts.done {
        return Some(LogError::Finished(run_id));
    }
    if facts.cancel_pending {
        return Some(match key {
            Some(CANCEL_KEY) => LogError::Duplicate {
                run_id,
                what: CANCEL_KEY.to_owned(),
            },
            _ => LogError::Cancelled(run_id),
        });
    }
    if facts.key_taken {
        return Some(LogError::Duplicate {
            run_id,
            what: key.map_or_else(|| "payload".to_owned(), dedupe_what),
        });
    }
    None
}

/// What a dedupe key names, for [`LogError::Duplicate`]: `approval call_3`.
pub fn dedupe_what(key: &str) -> String {
    key.splitn(3, ':').take(2).collect::<Vec<_>>().join(" ")
}

/// Why a [`JobQueue`] call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// The broker is unreachable or the channel closed; retry.
    #[error("job queue unavailable: {0}")]
    Unavailable(String),
    /// The broker did not confirm a publish.
    #[error("publish not confirmed: {0}")]
    NotConfirmed(String),
    /// The queue is closed for good (shutdown).
    #[error("job queue closed")]
    Closed,
}

/// Acknowledges one delivery.
#[async_trait]
pub trait Acker: Send + Sync {
    /// The job is handled (or safely dropped).
    async fn ack(&self) -> Result<(), QueueError>;
    /// The job could not be handled; `requeue` puts it back, otherwise it is
    /// dead-lettered.
    async fn nack(&self, requeue: bool) -> Result<(), QueueError>;
}

/// One job handed to a consumer.
pub struct Delivery {
    /// The job.
    pub job: Job,
    /// True when the broker delivered it before.
    pub redelivered: bool,
    /// Its acknowledgement handle.
    pub acker: Box<dyn Acker>,
    /// When it was published, if the queue records it (RabbitMQ does, in a
    /// message header; the in-memory twin does not): the start of the job's
    /// lag (enqueued → taken by a worker).
    pub enqueued_at: Option<DateTime<Utc>>,
}

/// What a queue holds and who consumes it, for metrics and autoscaling.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Jobs ready in the queue, resumes and starts (not counting
    /// delivered, unacked ones).
    pub ready: u64,
    /// Consumers attached to the queue, when the queue knows.
    pub consumers: Option<u64>,
    /// Jobs in the dead-letter queue, when there is one.
    pub dead_lettered: Option<u64>,
}

/// Run jobs. RabbitMQ in the fleet, [`memory::MemoryQueue`] in `glia dev`,
/// [`sqlite::SqliteQueue`] on the single node.
///
/// # Resumes first
///
/// A queue keeps two lines: resumes ([`Job::resume`] true) and starts, each
/// first in, first out. [`JobQueue::next`] hands out a ready resume before
/// any ready start, so a run a person just approved never waits behind a
/// backlog of runs that have not started; [`JobQueue::next_resume`] takes
/// resumes only (a worker uses it for its last free slot). Conformance:
/// `conformance::resumes_before_starts`.
#[async_trait]
pub trait JobQueue: Send + Sync {
    /// Publish a job, persistent, and wait for the broker's confirm.
    async fn publish(&self, job: &Job) -> Result<(), QueueError>;
    /// Wait for the next job: the oldest ready resume, else the oldest
    /// ready start. Reconnects on its own; errors only when closed.
    /// Cancel-safe: dropping the future loses no job.
    async fn next(&self) -> Result<Delivery, QueueError>;
    /// Wait for the next resume, leaving starts queued. As [`JobQueue::next`]
    /// otherwise (errors, cancel safety).
    async fn next_resume(&self) -> Result<Delivery, QueueError>;
    /// Jobs waiting in the queue, resumes and starts.
    async fn depth(&self) -> Result<u64, QueueError>;
    /// Ready jobs, consumers and dead-lettered jobs. The default knows only
    /// [`JobQueue::depth`].
    async fn stats(&self) -> Result<QueueStats, QueueError> {
        Ok(QueueStats {
            ready: self.depth().await?,
            consumers: None,
            dead_lettered: None,
        })
    }
}

/// Why a [`Ledger`] call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    /// The ledger store is unreachable.
    #[error("ledger unavailable: {0}")]
    Unavailable(String),
}

/// Which cap of a [`SpendCap`] refused a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapKind {
    /// [`SpendCap::cost_usd_micros`].
    Cost,
    /// [`SpendCap::tokens`].
    Tokens,
}

/// The answer to [`Ledger::reserve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    /// The amount is reserved (or was already, under this request id).
    Granted {
        /// The scope's counter now, this reservation included.
        used: Spend,
    },
    /// The amount does not fit; nothing was written.
    Exceeded {
        /// The scope's counter.
        used: Spend,
        /// The cap that refused it (cost is checked first).
        cap: CapKind,
    },
    /// The scope has no counter (new day, or Redis restarted or flushed);
    /// nothing was written. Seed it from the log ([`Reports::tenant_usage`],
    /// [`Ledger::seed`]) and reserve again.
    Missing,
}

/// The answer to [`Ledger::settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// The request's amount is final (now, or already by an earlier settle).
    Settled {
        /// The scope's counter now.
        used: Spend,
    },
    /// The scope has no counter; nothing was written. Seed it and settle again.
    Missing,
}

/// The budget scope of a tenant's UTC day: `tenant:{tenant}:day:{YYYY-MM-DD}`.
///
/// ```
/// let day = chrono::NaiveDate::from_ymd_opt(2025, 3, 9).unwrap();
/// assert_eq!(glia_backends::tenant_day_scope("acme", day), "tenant:acme:day:2025-03-09");
/// ```
pub fn tenant_day_scope(tenant: &str, day: NaiveDate) -> String {
    format!("tenant:{tenant}:day:{}", day.format("%Y-%m-%d"))
}

/// Fast shared signals and counters: cancellation flags, live deltas and
/// budget counters. Redis in the fleet, [`memory::MemoryLedger`] in `glia
/// dev`. Losing it loses no run.
///
/// # Budget counters
///
/// A budget *scope* (e.g. [`tenant_day_scope`]) has a counter of [`Spend`]
/// used so far, and remembers the request ids it has seen while the counter
/// lives. A model call is *reserved* before it is made, under a request id
/// that is the same for every retry of the same call, then *settled* with
/// what it actually cost: the reservation is replaced by the actual amount.
/// Repeating a reserve or a settle under the same request id changes nothing,
/// so a caller that lost an answer (a dropped connection) simply asks again.
///
/// A counter is created only by [`Ledger::seed`], from the event log, with a
/// time to live; [`Ledger::reserve`] and [`Ledger::settle`] on a scope without
/// one answer `Missing` and write nothing, so a counter lost to a restart or
/// a flush is never silently restarted from zero.
///
/// The budget methods have default implementations that answer
/// [`LedgerError::Unavailable`], for ledgers that keep no budgets.
#[async_trait]
pub trait Ledger: Send + Sync {
    /// Flag a run as cancelled and notify subscribers.
    async fn cancel(&self, run_id: Uuid) -> Result<(), LedgerError>;
    /// True when the run is flagged as cancelled.
    async fn is_cancelled(&self, run_id: Uuid) -> Result<bool, LedgerError>;
    /// Set (`true`) or clear the run's operator-pause flag. The pause itself
    /// is a `pause` payload in the run's inbox; the flag only tells the
    /// worker advancing the run to look at its inbox at the next durability
    /// barrier. A lost flag delays a pause until the run's next job.
    async fn set_paused(&self, run_id: Uuid, paused: bool) -> Result<(), LedgerError>;
    /// The run's flags as of now, in one read: what a worker checks at each
    /// durability barrier.
    async fn signal(&self, run_id: Uuid) -> Result<Signal, LedgerError>;
    /// Push a live event to the run's subscribers (best effort).
    async fn publish_live(&self, run_id: Uuid, event: &LiveEvent) -> Result<(), LedgerError>;
    /// Live events of a run from now on.
    async fn subscribe_live(
        &self,
        run_id: Uuid,
    ) -> Result<BoxStream<'static, LiveEvent>, LedgerError>;
    /// True when the store answers.
    async fn ready(&self) -> Result<(), LedgerError>;

    /// Reserve `amount` in `scope` under `request_id`, atomically: granted
    /// when, for each capped kind, the counter is below the cap and the
    /// counter plus `amount` does not pass it (a zero amount asks whether any
    /// room is left). A request id the scope has already seen is
    /// [`Reservation::Granted`] again with nothing written, whatever the
    /// caps say now. Amounts and caps are exact below 2^53.
    ///
    /// Errors: [`LedgerError::Unavailable`] when the store does not answer;
    /// the reservation may or may not have been made, and asking again with
    /// the same request id is safe.
    async fn reserve(
        &self,
        scope: &str,
        request_id: &str,
        amount: Spend,
        cap: SpendCap,
    ) -> Result<Reservation, LedgerError> {
        let _ = (scope, request_id, amount, cap);
        Err(LedgerError::Unavailable(
            "this ledger keeps no budgets".into(),
        ))
    }

    /// Settle the call `request_id` at `actual`: its reservation (if the
    /// counter still holds one) is replaced by `actual`; a request id the
    /// counter has not seen (its reservation was lost with an earlier
    /// counter, or spend that was never reserved) adds `actual`; an already
    /// settled one changes nothing. The counter never goes below zero.
    ///
    /// Errors: as [`Ledger::reserve`]; settling again is safe.
    async fn settle(
        &self,
        scope: &str,
        request_id: &str,
        actual: Spend,
    ) -> Result<Settlement, LedgerError> {
        let _ = (scope, request_id, actual);
        Err(LedgerError::Unavailable(
            "this ledger keeps no budgets".into(),
        ))
    }

    /// Create `scope`'s counter at `used`, living `ttl` (whole seconds, at
    /// least one), unless it exists. True when this call created it.
    ///
    /// Errors: as [`Ledger::reserve`]; seeding again is safe.
    async fn seed(&self, scope: &str, used: Spend, ttl: Duration) -> Result<bool, LedgerError> {
        let _ = (scope, used, ttl);
        Err(LedgerError::Unavailable(
            "this ledger keeps no budgets".into(),
        ))
    }

    /// Hold tool results until they are in the log: each under its call's
    /// idempotency key (`{run_id}:{turn}:{call_id}`, the key the tool was
    /// given), for [`HELD_RESULT_TTL`], replacing what the key held. A
    /// worker holds a call's result as soon as the call returns, before it
    /// commits it; if that commit never lands (the database was away longer
    /// than the lease, the worker died), the next worker to advance the run
    /// finds the result here ([`Ledger::held_result`]) and commits it instead
    /// of treating the call as interrupted. Holding again is safe.
    ///
    /// Errors: [`LedgerError::Unavailable`] when the store does not answer
    /// (the results may or may not be held); the default keeps nothing.
    async fn hold_results(&self, held: &[(String, HeldResult)]) -> Result<(), LedgerError> {
        let _ = held;
        Err(LedgerError::Unavailable(
            "this ledger holds no tool results".into(),
        ))
    }

    /// The result held under the idempotency key `key`, if any (never held,
    /// expired, released, or lost with the store).
    ///
    /// Errors: [`LedgerError::Unavailable`] when the store does not answer:
    /// whether a result is held is then unknown, and the caller must not
    /// act as if none were. The default holds nothing (`None`).
    async fn held_result(&self, key: &str) -> Result<Option<HeldResult>, LedgerError> {
        let _ = key;
        Ok(None)
    }

    /// Forget the results held under `keys` (once they are in the log).
    /// Keys not held are ignored.
    ///
    /// Errors: [`LedgerError::Unavailable`] when the store does not answer;
    /// the results then simply expire.
    async fn release_held(&self, keys: &[String]) -> Result<(), LedgerError> {
        let _ = keys;
        Ok(())
    }
}

/// How long a held tool result is kept by default ([`Ledger::hold_results`]):
/// seven days, longer than any lease and any reconciler round, so a run
/// whose worker died is resumed well before its held results go.
pub const HELD_RESULT_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// What [`Ledger::signal`] reads of a run: its cancel and operator-pause
/// flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signal {
    /// Flagged cancelled ([`Ledger::cancel`]).
    pub cancelled: bool,
    /// Flagged for an operator pause ([`Ledger::set_paused`]).
    pub paused: bool,
}

/// Name of the [`EventLog`] in readiness checks.
pub const EVENT_LOG: &str = "event_log";
/// Name of the [`JobQueue`] in readiness checks.
pub const JOB_QUEUE: &str = "job_queue";
/// Name of the [`Ledger`] in readiness checks.
pub const LEDGER: &str = "ledger";

/// Whether each port answers within `timeout`: [`EVENT_LOG`]
/// ([`Reports::ready`]), [`JOB_QUEUE`] ([`JobQueue::depth`], a passive
/// declare on RabbitMQ) and [`LEDGER`] ([`Ledger::ready`]) → `ok`, the
/// port's error, or `no answer within N ms`. The three run concurrently.
/// What `/readyz` of the dispatcher and of a worker report.
pub async fn readiness(
    log: &dyn Reports,
    queue: &dyn JobQueue,
    ledger: &dyn Ledger,
    timeout: Duration,
) -> std::collections::BTreeMap<String, String> {
    let timed = |r: Result<Result<(), String>, tokio::time::error::Elapsed>| match r {
        Ok(Ok(())) => "ok".to_owned(),
        Ok(Err(e)) => e,
        Err(_) => format!("no answer within {} ms", timeout.as_millis()),
    };
    let (l, q, d) = futures::join!(
        tokio::time::timeout(timeout, async {
            log.ready().await.map_err(|e| e.to_string())
        }),
        tokio::time::timeout(timeout, async {
            queue.depth().await.map(|_| ()).map_err(|e| e.to_string())
        }),
        tokio::time::timeout(timeout, async {
            ledger.ready().await.map_err(|e| e.to_string())
        }),
    );
    [
        (EVENT_LOG, timed(l)),
        (JOB_QUEUE, timed(q)),
        (LEDGER, timed(d)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_posting_rule_decides_done_then_cancel_then_dedupe() {
        let run = Uuid::nil();
        let facts = |done, cancel_pending, key_taken| PostFacts {
            done,
            cancel_pending,
            key_taken,
        };
        let answer = |key: Option<&str>, f| post_refusal(run, key, f).map(|e| e.to_string());
        let approval = Some("approval:c1:7");
        assert_eq!(answer(approval, facts(false, false, false)), None);
        assert_eq!(answer(None, facts(false, false, false)), None);
        for key in [approval, Some(CANCEL_KEY), None] {
            assert!(matches!(
                post_refusal(run, key, facts(true, true, true)),
                Some(LogError::Finished(_))
            ));
        }
        // A waiting cancel decides before the dedupe key.
        assert!(matches!(
            post_refusal(run, approval, facts(false, true, true)),
            Some(LogError::Cancelled(_))
        ));
        assert!(matches!(
            post_refusal(run, Some(CANCEL_KEY), facts(false, true, true)),
            Some(LogError::Duplicate { what, .. }) if what == "cancel"
        ));
        assert!(matches!(
            post_refusal(run, approval, facts(false, false, true)),
            Some(LogError::Duplicate { what, .. }) if what == "approval c1"
        ));
    }

    #[test]
    fn a_job_without_the_resume_field_is_a_start_and_a_start_is_written_without_it() {
        let run_id = Uuid::now_v7();
        let old: Job =
            serde_json::from_value(serde_json::json!({"run_id": run_id, "head_seq": 7})).unwrap();
        assert_eq!(
            old,
            Job::start(run_id, 7),
            "outbox rows and messages from before the field read as starts"
        );
        assert_eq!(
            serde_json::to_value(Job::start(run_id, 7)).unwrap(),
            serde_json::json!({"run_id": run_id, "head_seq": 7})
        );
        let resume = serde_json::to_value(Job::resume(run_id, 8)).unwrap();
        assert_eq!(
            resume,
            serde_json::json!({"run_id": run_id, "head_seq": 8, "resume": true})
        );
        assert_eq!(
            serde_json::from_value::<Job>(resume).unwrap(),
            Job::resume(run_id, 8)
        );
    }
}
