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

use std::time::Duration;

use async_trait::async_trait;
use glia_proto::{Event, RunState};
use uuid::Uuid;

use crate::{Lease, LogError, NewRun, RunFilter, RunSummary};

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
}
