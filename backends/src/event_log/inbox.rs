//! The inbox: payloads posted to runs (approval decisions, tool results,
//! user messages, budget extensions, pauses, resumes, cancels), and opening
//! a run for a worker together with what waits in it.
//!
//! # Contract
//!
//! - [`Inbox::post`] writes the payload and a resume [`Job`] in one
//!   transaction, serialised with the run's other posts and commits, and
//!   applies the posting rule ([`crate::post_refusal`]): a done run takes
//!   nothing, a waiting cancel takes nothing else, a dedupe key
//!   ([`crate::dedupe_key`]) is taken once per run.
//! - Items stay unconsumed, oldest first ([`Inbox::inbox`]), until a commit
//!   names them ([`RunLog::commit`]).
//! - [`Inbox::open`] and [`Inbox::release_if_idle`] are the worker's two
//!   ends of a job: neither leaves a payload behind a released lease without
//!   a job to wake the run.

use std::time::Duration;

use async_trait::async_trait;
use glia_proto::Payload;
use uuid::Uuid;

use super::runs::RunLog;
use crate::{InboxItem, Job, Lease, LogError, Opened, Opening, RunStatus};

/// Payloads posted to runs, and the worker's open and release around them.
/// See the [module](self) for the contract.
#[async_trait]
pub trait Inbox: RunLog {
    /// Queue a payload for a parked run and write a job. A payload with a
    /// dedupe key already used for the run (an approval or an external
    /// result for the same call, a second cancel) is refused with
    /// [`LogError::Duplicate`]. Atomically with the write, and serialised
    /// with other posts and commits of the run: a run that is done refuses
    /// every payload ([`LogError::Finished`]); a run with a cancel waiting in
    /// its inbox refuses every other payload ([`LogError::Cancelled`]), so
    /// nothing posted after a cancel is accepted. Other validation against
    /// the run's state is the caller's.
    async fn post(&self, run_id: Uuid, payload: Payload) -> Result<i64, LogError>;

    /// The run's unconsumed inbox items, oldest first.
    async fn inbox(&self, run_id: Uuid) -> Result<Vec<InboxItem>, LogError>;

    /// Everything a worker needs to handle `job`, read at once: the job is
    /// [`Opening::Done`] when the run is finished, [`Opening::Stale`] when it
    /// names a head the run has moved past while its inbox is empty and
    /// either the run waits at a pull point (a duplicate or an old wake-up)
    /// or the job is a resume and another worker holds the run (the holder
    /// took the payload the job announced: a resume hint beat its job);
    /// otherwise the run's lease is taken for `ttl` and its state (as
    /// [`RunLog::load`]) and unconsumed inbox (as [`Inbox::inbox`]) are
    /// read under it ([`Opening::Opened`]).
    ///
    /// The default composes [`RunLog::get_run`], [`RunLog::acquire`],
    /// [`RunLog::load`] and [`Inbox::inbox`]; the Postgres adapter sends
    /// the fenced lease update and the three reads pipelined, one round trip.
    ///
    /// Errors: [`LogError::NotFound`], [`LogError::LeaseHeld`],
    /// [`LogError::Unavailable`] (the lease, if it was taken, is released
    /// when the store still answers, else it lapses).
    async fn open(&self, job: &Job, owner: &str, ttl: Duration) -> Result<Opening, LogError> {
        let run_id = job.run_id;
        let summary = self.get_run(run_id).await?;
        if summary.status == RunStatus::Done {
            return Ok(Opening::Done);
        }
        let moved = job.head_seq < summary.head_seq;
        if moved && summary.status != RunStatus::Runnable && self.inbox(run_id).await?.is_empty() {
            return Ok(Opening::Stale);
        }
        let lease = match self.acquire(run_id, owner, ttl).await {
            Ok(lease) => lease,
            Err(LogError::LeaseHeld { .. })
                if job.resume && moved && self.inbox(run_id).await?.is_empty() =>
            {
                return Ok(Opening::Stale);
            }
            Err(e) => return Err(e),
        };
        let read =
            async { Ok::<_, LogError>((self.load(run_id).await?, self.inbox(run_id).await?)) };
        match read.await {
            Ok((state, inbox)) => Ok(Opening::Opened(Opened {
                lease,
                state,
                inbox,
            })),
            Err(e) => {
                let _ = self.release(&lease).await;
                Err(e)
            }
        }
    }

    /// Let `lease` go unless the run's inbox holds unconsumed items: then
    /// keep it and return them (oldest first) for the holder to apply. An
    /// empty answer means released (or the lease was already lost). A
    /// payload posted after the release writes its own job, as always.
    ///
    /// The default composes [`Inbox::inbox`] and [`RunLog::release`];
    /// the Postgres adapter pipelines the read and a release conditioned on
    /// an empty inbox, one round trip.
    ///
    /// Errors: [`LogError::NotFound`], [`LogError::Unavailable`].
    async fn release_if_idle(&self, lease: &Lease) -> Result<Vec<InboxItem>, LogError> {
        let items = self.inbox(lease.run_id).await?;
        if items.is_empty() {
            self.release(lease).await?;
        }
        Ok(items)
    }
}
