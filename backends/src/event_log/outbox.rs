//! Where the queue's jobs come from: the outbox, and the runs whose job
//! was lost.
//!
//! # Contract
//!
//! - Every write that causes work (an admission, a post) writes a [`Job`]
//!   to the outbox in its own transaction; a relay
//!   publishes outbox jobs after commit ([`Outbox::outbox`]) and marks them
//!   relayed ([`Outbox::outbox_done`]). A job published and not marked is
//!   published again: jobs are wake-ups, so at least once is safe.
//! - A run with work and no live lease is an [`Orphan`]
//!   ([`Outbox::orphaned`]): the reconciler re-enqueues it, so a lost job or
//!   a dead worker never loses a run.

use async_trait::async_trait;

use crate::{Job, LogError, Orphan};

/// Jobs awaiting relay and runs awaiting a job. See the [module](self) for
/// the contract.
#[async_trait]
pub trait Outbox: Send + Sync {
    /// Up to `limit` outbox jobs not yet relayed, oldest first, with their ids.
    async fn outbox(&self, limit: usize) -> Result<Vec<(i64, Job)>, LogError>;

    /// Mark outbox jobs relayed.
    async fn outbox_done(&self, ids: &[i64]) -> Result<(), LogError>;

    /// Runs that have work (runnable, or with unconsumed inbox items) and no
    /// live lease, the runs started before the runs never started (so a
    /// backlog of the latter does not hide the former from `limit`), each
    /// part by run id: the reconciler re-enqueues them.
    async fn orphaned(&self, limit: usize) -> Result<Vec<Orphan>, LogError>;
}
