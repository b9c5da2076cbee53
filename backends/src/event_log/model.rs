//! The run store's records and errors: what the [`crate::event_log`]
//! traits take and answer ([`RunSummary`], [`Lease`], [`InboxItem`],
//! [`ApprovalRow`], [`Job`]…), [`LogError`], and the posting rule every
//! adapter applies ([`dedupe_key`], [`post_refusal`]). Re-exported from the
//! crate root.

use chrono::{DateTime, Utc};
use std::collections::BTreeMap;

use glia_proto::{BudgetUsage, Event, Outcome, Payload, Phase, PullPoint, RunState, Status};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

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
    /// Queues hand resumes out before starts ([`crate::JobQueue::next`]). Absent
    /// on the wire means false, so outbox rows and messages written before
    /// the field existed still read as starts; a start is written without it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resume: bool,
}

/// A run with work and no live lease ([`crate::Outbox::orphaned`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Orphan {
    /// The job that would wake it: at its head, a resume when a payload
    /// waits in its inbox.
    pub job: Job,
    /// Admitted and never started, as far as the log tells: runnable, no
    /// lease (none taken, or one let go) and nothing after its
    /// `session.start` (head 1). A delayed start (parked at admission) is
    /// not queued: its wake is a payload like any parked run's.
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

/// A run's row: identity, what it was submitted with, and a summary of its
/// state (rewritten by every commit, [`RunSummary::updated`]).
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
    /// Name of the registered agent it was admitted with (`agent:
    /// "name@N"`), from its `session.start` config; `None` for a run
    /// submitted with an inline config.
    #[serde(default)]
    pub agent: Option<String>,
    /// That agent's registry version (from 1).
    #[serde(default)]
    pub agent_version: Option<u32>,
    /// Labels given at submission, in the order given, without duplicates
    /// (see `docs/limits.md` for their limits).
    #[serde(default)]
    pub tags: Vec<String>,
    /// String pairs given at submission (see `docs/limits.md`).
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// The batch item's `custom_id`, for a run of a batch.
    #[serde(default)]
    pub custom_id: Option<String>,
    /// What it has consumed so far (turns, tool calls, active ms, tokens by
    /// kind, cost in USD micros): the state's usage at its last commit.
    #[serde(default)]
    pub usage: BudgetUsage,
    /// Plan steps started so far in its current plan (a replan starts
    /// counting again from its first step); 0 before the first step.
    #[serde(default)]
    pub steps: u32,
    /// Why it ended, when it ended failed (the error) or cancelled (the
    /// reason); `None` otherwise.
    #[serde(default)]
    pub error: Option<String>,
    /// When it reached `done` (the commit that ended it).
    #[serde(default)]
    pub ended_at: Option<DateTime<Utc>>,
    /// The OpenTelemetry trace id of every span of the run: the run id's 16
    /// bytes as 32 lowercase hex digits ([`trace_id`]); derived, never stored.
    #[serde(default)]
    pub trace_id: String,
    /// When its content was erased ([`crate::RunLog::erase_run`]); the goal
    /// and outcome then read as [`glia_proto::TOMBSTONE`]. `None`: not erased.
    #[serde(default)]
    pub erased_at: Option<DateTime<Utc>>,
    /// Who erased it (a token's name, or `retention` for the sweeper).
    #[serde(default)]
    pub erased_by: Option<String>,
    // Issue 32, child runs.
    /// The run whose agent-tool call started this one (`docs/child-runs.md`).
    #[serde(default)]
    pub parent_run_id: Option<Uuid>,
    /// That call's id in the parent.
    #[serde(default)]
    pub parent_call_id: Option<String>,
    /// 0 for a run a client started, the parent's depth + 1 for a child.
    #[serde(default)]
    pub depth: u32,
}

impl RunSummary {
    /// The row of run `new` admitted at `now`: its identity and submission
    /// fields, and the summary of `state` (its `session.start` applied).
    pub fn admitted(new: &NewRun, state: &RunState, now: DateTime<Utc>) -> RunSummary {
        let (agent, agent_version) = agent_of(state);
        let run = RunSummary {
            run_id: state.run_id,
            tenant: new.tenant.clone(),
            batch_id: new.batch_id,
            goal: state.goal.clone(),
            status: RunStatus::of(state),
            phase: state.phase,
            pull_point: None,
            outcome: None,
            head_seq: state.head_seq,
            created_at: now,
            updated_at: now,
            agent,
            agent_version,
            tags: new.tags.clone(),
            metadata: new.metadata.clone(),
            custom_id: new.custom_id.clone(),
            usage: BudgetUsage::default(),
            steps: 0,
            error: None,
            ended_at: None,
            trace_id: trace_id(state.run_id),
            erased_at: None,
            erased_by: None,
            parent_run_id: new.parent_run_id,
            parent_call_id: new.parent_call_id.clone(),
            depth: new.depth,
        };
        run.updated(state, now)
    }

    /// The summary of `state` committed at `now`, keeping identity and
    /// submission fields from `self`; `ended_at` is set by the commit that
    /// ends the run and kept after.
    pub fn updated(&self, state: &RunState, now: DateTime<Utc>) -> RunSummary {
        let status = RunStatus::of(state);
        RunSummary {
            status,
            phase: state.phase,
            pull_point: state.parked.clone(),
            outcome: state.outcome.clone(),
            head_seq: state.head_seq,
            updated_at: now,
            usage: state.usage,
            steps: steps_of(state),
            error: state.outcome.as_ref().and_then(error_of).map(str::to_owned),
            ended_at: match status {
                RunStatus::Done => Some(self.ended_at.unwrap_or(now)),
                _ => None,
            },
            ..self.clone()
        }
    }
}

/// The OpenTelemetry trace id of run `run_id`'s spans: the id's 16 bytes as
/// 32 lowercase hex digits (`run_id.simple()`).
pub fn trace_id(run_id: Uuid) -> String {
    run_id.simple().to_string()
}

/// Plan steps started in `state`'s current plan.
pub fn steps_of(state: &RunState) -> u32 {
    state.step.map_or(0, |i| {
        u32::try_from(i).unwrap_or(u32::MAX).saturating_add(1)
    })
}

/// The error of a failed run or the reason of a cancelled one.
pub fn error_of(outcome: &Outcome) -> Option<&str> {
    match outcome {
        Outcome::Succeeded { .. } => None,
        Outcome::Failed { error } => Some(error),
        Outcome::Cancelled { reason } => Some(reason),
    }
}

/// The agent reference of a run's `session.start` config: name and version.
pub fn agent_of(state: &RunState) -> (Option<String>, Option<u32>) {
    match &state.config.agent {
        Some(agent) => (Some(agent.name.clone()), Some(agent.version)),
        None => (None, None),
    }
}

/// How a finished run ended, without its details: what
/// [`RunFilter::outcome`] selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeKind {
    /// The goal was reached.
    Succeeded,
    /// The run failed.
    Failed,
    /// The run was cancelled.
    Cancelled,
}

impl OutcomeKind {
    /// The kind of `outcome`.
    pub fn of(outcome: &Outcome) -> OutcomeKind {
        match outcome {
            Outcome::Succeeded { .. } => OutcomeKind::Succeeded,
            Outcome::Failed { .. } => OutcomeKind::Failed,
            Outcome::Cancelled { .. } => OutcomeKind::Cancelled,
        }
    }

    /// `succeeded`, `failed`, `cancelled` (the `kind` of [`Outcome`]'s JSON).
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeKind::Succeeded => "succeeded",
            OutcomeKind::Failed => "failed",
            OutcomeKind::Cancelled => "cancelled",
        }
    }
}

impl std::str::FromStr for OutcomeKind {
    type Err = String;

    fn from_str(s: &str) -> Result<OutcomeKind, String> {
        match s {
            "succeeded" => Ok(OutcomeKind::Succeeded),
            "failed" => Ok(OutcomeKind::Failed),
            "cancelled" => Ok(OutcomeKind::Cancelled),
            other => Err(format!(
                "unknown outcome {other:?} (succeeded, failed or cancelled)"
            )),
        }
    }
}

impl std::str::FromStr for RunStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<RunStatus, String> {
        match s {
            "runnable" => Ok(RunStatus::Runnable),
            "parked" => Ok(RunStatus::Parked),
            "done" => Ok(RunStatus::Done),
            other => Err(format!(
                "unknown status {other:?} (runnable, parked or done)"
            )),
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
    /// Labels ([`RunSummary::tags`]), already validated by the caller.
    pub tags: Vec<String>,
    /// String pairs ([`RunSummary::metadata`]), already validated.
    pub metadata: BTreeMap<String, String>,
    /// The batch item's `custom_id`, for a run of a batch.
    pub custom_id: Option<String>,
    // Issue 32, child runs.
    /// The parent run, for a child run.
    pub parent_run_id: Option<Uuid>,
    /// The parent's call that started it.
    pub parent_call_id: Option<String>,
    /// 0, or the parent's depth + 1.
    pub depth: u32,
}

/// Which runs to list: newest first (by `run_id` descending; run ids are
/// UUIDv7, so that is admission order). Every filter set must match; `None`
/// and empty filters match every run. `before` is the cursor: the last
/// `run_id` of the previous page.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunFilter {
    /// Only this tenant's runs (`None`: all tenants, for admins).
    pub tenant: Option<String>,
    /// Only runs with this status.
    pub status: Option<RunStatus>,
    /// Only finished runs that ended this way.
    pub outcome: Option<OutcomeKind>,
    /// Only runs admitted with this registered agent.
    pub agent: Option<String>,
    /// Only runs of this agent version (with or without `agent`).
    pub agent_version: Option<u32>,
    /// Only runs of this batch.
    pub batch_id: Option<Uuid>,
    /// Only runs carrying every one of these tags.
    pub tags: Vec<String>,
    /// Only runs whose metadata holds every one of these pairs.
    pub metadata: BTreeMap<String, String>,
    /// Only runs admitted at or after this time.
    pub created_after: Option<DateTime<Utc>>,
    /// Only runs admitted before this time.
    pub created_before: Option<DateTime<Utc>>,
    /// Only runs that have cost at least this many USD micros.
    pub min_cost_usd_micros: Option<u64>,
    /// Only runs that have cost at most this many USD micros.
    pub max_cost_usd_micros: Option<u64>,
    /// Only runs whose [`RunSummary::error`] contains this text, compared
    /// case-insensitively (ASCII and Unicode simple case folding).
    pub q: Option<String>,
    /// Issue 32: only the children of this run.
    pub parent: Option<Uuid>,
    /// Issue 32: only runs parked at this pull point (its name, e.g.
    /// `awaiting_children`); for the dispatcher's loops, not the API.
    pub pull_point: Option<String>,
    /// Page cursor: only runs older than this one (ids below it).
    pub before: Option<Uuid>,
    /// Page size (1 to 1,000; 0 reads as 1).
    pub limit: usize,
}

impl RunFilter {
    /// True when a text filter holds U+0000, which no stored text can (so
    /// the filter matches nothing; SQL adapters answer an empty page).
    pub fn has_nul(&self) -> bool {
        let nul = |s: &String| s.contains('\0');
        self.tenant.as_ref().is_some_and(nul)
            || self.pull_point.as_ref().is_some_and(nul)
            || self.agent.as_ref().is_some_and(nul)
            || self.q.as_ref().is_some_and(nul)
            || self.tags.iter().any(nul)
            || self.metadata.iter().any(|(k, v)| nul(k) || nul(v))
    }

    /// True when `run` passes every filter but the cursor and the limit:
    /// the rule every adapter implements (the in-memory one with this).
    pub fn matches(&self, run: &RunSummary) -> bool {
        self.tenant.as_ref().is_none_or(|t| *t == run.tenant)
            && self.status.is_none_or(|s| s == run.status)
            && self
                .outcome
                .is_none_or(|o| run.outcome.as_ref().map(OutcomeKind::of) == Some(o))
            && self
                .agent
                .as_ref()
                .is_none_or(|a| run.agent.as_ref() == Some(a))
            && self
                .agent_version
                .is_none_or(|v| run.agent_version == Some(v))
            && self.batch_id.is_none_or(|b| run.batch_id == Some(b))
            && self.tags.iter().all(|t| run.tags.contains(t))
            && self
                .metadata
                .iter()
                .all(|(k, v)| run.metadata.get(k) == Some(v))
            && self.parent.is_none_or(|p| run.parent_run_id == Some(p))
            && self.pull_point.as_ref().is_none_or(|n| {
                run.status == RunStatus::Parked
                    && run.pull_point.as_ref().map(PullPoint::name) == Some(n.as_str())
            })
            && self.created_after.is_none_or(|t| run.created_at >= t)
            && self.created_before.is_none_or(|t| run.created_at < t)
            && self
                .min_cost_usd_micros
                .is_none_or(|c| run.usage.cost_usd_micros >= c)
            && self
                .max_cost_usd_micros
                .is_none_or(|c| run.usage.cost_usd_micros <= c)
            && self.q.as_ref().is_none_or(|q| {
                run.error
                    .as_ref()
                    .is_some_and(|e| e.to_lowercase().contains(&q.to_lowercase()))
            })
    }
}

/// Which finished runs [`crate::RunLog::expired_runs`] finds: those of
/// `tenant` (or of every tenant not in `except_tenants`) that finished
/// (`ended_at`, the commit that ended them) before `finished_before`.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpiredFilter {
    /// Only this tenant's runs; `None`: every tenant not in `except_tenants`.
    pub tenant: Option<String>,
    /// Tenants left out when `tenant` is `None` (those with a retention
    /// period of their own).
    pub except_tenants: Vec<String>,
    /// Runs whose `ended_at` (when they finished) is before this.
    pub finished_before: DateTime<Utc>,
    /// Most ids answered (at most 1,000).
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
    pub payload: Payload,
}

/// What [`crate::Inbox::open`] made of a job.
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

/// A run opened for a worker ([`crate::Inbox::open`]).
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

/// Why an [`crate::EventLog`] call failed.
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
    /// The run is not done: its content cannot be erased until it is
    /// (cancel it first).
    #[error("run {0} is not finished; cancel it before erasing it")]
    NotFinished(Uuid),
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

/// Counts of the event log for the dispatcher's gauges ([`crate::Reports::gauges`]).
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
/// a cancel once ([`CANCEL_KEY`]), a child's end once per call and child
/// run; other payloads are not deduplicated. So
/// a call that is asked about again (after a crash), or a later call that
/// reuses a call id (some providers number ids per response), can still be
/// decided.
pub fn dedupe_key(payload: &Payload) -> Option<String> {
    match payload {
        Payload::Approval {
            call_id,
            request_seq: Some(seq),
            ..
        } => Some(format!("approval:{call_id}:{seq}")),
        Payload::Approval {
            call_id, args_hash, ..
        } => Some(format!("approval:{call_id}:{args_hash}")),
        Payload::ToolResult { call_id, .. } => Some(format!("tool:{call_id}")),
        Payload::Escalate {
            call_id,
            request_seq,
            ..
        } => Some(format!("escalate:{call_id}:{}", request_seq.unwrap_or(0))),
        Payload::Cancel { .. } => Some(CANCEL_KEY.to_owned()),
        // --- issue 32: waits --- an event once per run, a due time once.
        Payload::Wake {
            event: Some(event), ..
        } => Some(format!("event:{}", event.id)),
        Payload::Wake {
            due_at_ms,
            event: None,
        } => Some(format!("wake:{due_at_ms}")),
        // --- end waits ---
        // Issue 32: a child's end once per call and child. (A child that
        // never started has no id: such a post is not deduplicated here, and
        // a second one is dropped by the worker, the call having its result.)
        Payload::ChildEnded {
            call_id,
            child_run_id: Some(child),
            ..
        } => Some(format!("child:{call_id}:{child}")),
        _ => None,
    }
}

/// The dedupe key of a cancel: one cancel waits in an inbox at a time, and
/// while it waits [`crate::Inbox::post`] takes nothing else ([`LogError::Cancelled`]).
pub const CANCEL_KEY: &str = "cancel";

/// The facts about a run that decide whether [`crate::Inbox::post`] takes a
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

/// The posting rule of [`crate::Inbox::post`], the one every adapter applies:
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
