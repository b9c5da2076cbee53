//! Runs and their events: admission, reads, leases, and commits fenced by
//! the head and the lease.
//!
//! # Contract
//!
//! - A run is admitted once per tenant and idempotency key
//!   ([`RunLog::create_run`]): its row, its `session.start` (seq 1) and a
//!   start [`Job`](crate::Job) in the outbox, atomically.
//! - A run's events are append-only and consecutive from 1; a reader sees a
//!   prefix of them ([`RunLog::events`]), and [`RunLog::load`] (the latest
//!   checkpoint plus the events after it) equals replaying them all.
//! - At most one unexpired [`Lease`] per run ([`RunLog::acquire`],
//!   [`RunLog::renew`], [`RunLog::release`]); only its holder commits.
//! - [`RunLog::commit`] appends at the stored head + 1 under the lease, in
//!   one transaction with the run's summary, its consumed inbox items, its
//!   approval records and any job the commit causes; on a moved head or a
//!   lost lease nothing is written.
//! - Erasure is the one exception to append-only ([`RunLog::erase_run`]): a
//!   finished run's content becomes tombstones in place
//!   ([`glia_proto::erasure`]); no event is added, removed or renumbered.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use glia_proto::{Event, RunState};
use uuid::Uuid;

use crate::{ExpiredFilter, Lease, LogError, NewRun, RunFilter, RunSummary};

/// Runs, their append-only event logs, leases and checkpoints. See the
/// [module](self) for the contract.
#[async_trait]
pub trait RunLog: Send + Sync {
    /// Admit a run: its row, `session.start` and a job, atomically. With an
    /// idempotency key already used by the tenant, returns that run and
    /// `false`, writing nothing.
    async fn create_run(&self, new: NewRun) -> Result<(RunSummary, bool), LogError>;

    /// One run's summary. Errors: [`LogError::NotFound`].
    async fn get_run(&self, run_id: Uuid) -> Result<RunSummary, LogError>;

    /// A page of runs.
    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, LogError>;

    /// Issue 32, child runs: child runs not done whose parent is done (a
    /// cancel cascade cut short by a crash, a child admitted while its
    /// parent's cancel waited) and with no cancel waiting in their inbox,
    /// at most `limit`, in no promised order. The dispatcher's children
    /// loop cancels them: no child outlives its parent. (A child whose
    /// cancel waits for a worker is left out, so such children never fill
    /// a page and hide others.) Each as `(child, parent)`.
    async fn stranded_children(&self, limit: usize) -> Result<Vec<(Uuid, Uuid)>, LogError>;

    /// Events with `seq > after`, in order, at most `limit`.
    async fn events(&self, run_id: Uuid, after: u64, limit: usize) -> Result<Vec<Event>, LogError>;

    /// The run's state: its latest checkpoint plus the events after it.
    async fn load(&self, run_id: Uuid) -> Result<RunState, LogError>;

    /// Take the run's lease for `ttl`. Errors: [`LogError::LeaseHeld`] when
    /// another unexpired lease exists.
    async fn acquire(&self, run_id: Uuid, owner: &str, ttl: Duration) -> Result<Lease, LogError>;

    /// Extend a lease. Errors: [`LogError::LeaseLost`].
    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Lease, LogError>;

    /// Give a lease up. Releasing a lost lease is not an error.
    async fn release(&self, lease: &Lease) -> Result<(), LogError>;

    /// Append `events` (consecutive, starting at the stored head + 1) in one
    /// transaction fenced by the head and `lease`; update the run's summary
    /// from `state` (its state after the events); mark inbox items `consumed`;
    /// record approvals requested and resolved. Writes a checkpoint now and
    /// then, never on every commit. Errors: [`LogError::Conflict`],
    /// [`LogError::LeaseLost`]; nothing is written then.
    async fn commit(
        &self,
        lease: &Lease,
        events: &[Event],
        state: &RunState,
        consumed: &[i64],
    ) -> Result<(), LogError>;

    /// Erase the content of finished run `run_id`, for `by` (who asked: a
    /// token's name, or `retention`), at `at`. In one transaction, fenced
    /// against the run's writers:
    ///
    /// - every event becomes its tombstone ([`glia_proto::Event::erased`]):
    ///   sequence numbers, kinds, times, ids, usage, cost and durations
    ///   stay, so counts and costs (and [`crate::Reports::tenant_usage`])
    ///   are unchanged, while goal, messages, tool arguments and results,
    ///   model output, reasons and decisions' edits read
    ///   [`glia_proto::TOMBSTONE`]. No event is added or removed;
    /// - payloads stored apart (Postgres `blobs`) that no other run's event
    ///   references are deleted; checkpoints are deleted (they hold the
    ///   conversation; the state is rebuilt from the tombstones);
    /// - the run's inbox payloads ([`glia_proto::Payload::erased`]), its
    ///   approval records' arguments, its webhook deliveries' reasons and
    ///   errors, and its batch item's goal and error are tombstoned;
    /// - the run row's goal and outcome become tombstones and it records
    ///   `erased_at = at` and `erased_by = by` ([`RunSummary::erased_at`]).
    ///
    /// The run's identity, tenant, batch, idempotency key, head, status,
    /// times and configuration stay. Idempotent: erasing an erased run
    /// writes nothing and answers its summary (with the first erasure's
    /// time and author). Held results in the [`crate::Ledger`] are the
    /// caller's to forget ([`crate::Ledger::forget_run`]).
    ///
    /// Errors: [`LogError::NotFound`]; [`LogError::NotFinished`] when the
    /// run is not done (cancel it first); [`LogError::LeaseHeld`] when a
    /// worker still holds an unexpired lease on it (it is letting it go;
    /// ask again). Nothing is written then.
    async fn erase_run(
        &self,
        run_id: Uuid,
        by: &str,
        at: DateTime<Utc>,
    ) -> Result<RunSummary, LogError>;

    /// Finished runs not yet erased that ended (`ended_at`) before
    /// `filter.finished_before`, the longest finished first, at most `filter.limit` (at
    /// most 1,000): what the retention sweeper erases.
    async fn expired_runs(&self, filter: &ExpiredFilter) -> Result<Vec<Uuid>, LogError>;
}
