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
pub mod evals;
pub mod event_log;
pub mod memory;
pub mod postgres;
pub mod rabbitmq;
pub mod redis_ledger;
pub mod schedules;
pub mod sqlite;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod webhooks;

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use futures::stream::BoxStream;
use glia_proto::LiveEvent;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use event_log::model::{
    AgentVersion, ApprovalFilter, ApprovalRow, ApprovalStatus, CANCEL_KEY, ExpiredFilter,
    InboxItem, Job, Lease, LogError, LogGauges, NewRun, Opened, Opening, Orphan, OutcomeKind,
    PostFacts, RunFilter, RunGaugeKey, RunStatus, RunSummary, agent_of, dedupe_key, dedupe_what,
    error_of, post_refusal, steps_of, trace_id,
};
pub use event_log::{
    AgentRegistry, Approvals, DueWait, EventLog, Inbox, Outbox, Reports, RunLog, Waits,
};

/// True when `run` is what `filter` finds ([`RunLog::expired_runs`]):
/// done, not erased, of the filter's tenant(s), last committed before its
/// time. The rule the in-memory twin applies as the SQL adapters do.
pub fn expired(run: &RunSummary, filter: &ExpiredFilter) -> bool {
    run.status == RunStatus::Done
        && run.erased_at.is_none()
        && run.ended_at.unwrap_or(run.updated_at) < filter.finished_before
        && match &filter.tenant {
            Some(t) => &run.tenant == t,
            None => !filter.except_tenants.contains(&run.tenant),
        }
}

/// The state of an erased run from its tombstones (`events`, the whole
/// log). Erased logs replay (see [`glia_proto::erasure`]); should one not,
/// the error names the erasure ([`LogError::Corrupt`]) rather than reading
/// as an unexplained fold failure.
pub fn erased_replay(
    run_id: Uuid,
    events: &[glia_proto::Event],
) -> Result<glia_proto::RunState, LogError> {
    glia_proto::RunState::replay(run_id, events).map_err(|e| {
        LogError::Corrupt(format!(
            "run {run_id} was erased and its tombstoned log does not replay: {e}"
        ))
    })
}

/// The spend a ledger counts and the results it holds are the contract's
/// (`glia_proto`): the loop speaks them without linking a backend.
pub use glia_proto::{HeldResult, Spend, SpendCap};

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
    /// Which of `runs` are flagged as cancelled, in their order (one round
    /// trip where the store can: a worker's catch-up over every run it
    /// advances). Default: [`Ledger::is_cancelled`] of each.
    async fn cancelled_among(&self, runs: &[Uuid]) -> Result<Vec<Uuid>, LedgerError> {
        let mut flagged = Vec::new();
        for run in runs {
            if self.is_cancelled(*run).await? {
                flagged.push(*run);
            }
        }
        Ok(flagged)
    }
    /// Cancellations as any process flags them, for a process that watches
    /// many runs with one subscription: `Some(run)` as `run` is flagged;
    /// `None` after the subscription was lost and made again (what was
    /// flagged meanwhile is not announced: read the runs that matter with
    /// [`Ledger::cancelled_among`]). The stream does not end while the
    /// store lives. `Ok(None)`: this store announces nothing (poll
    /// [`Ledger::is_cancelled`]); the default.
    ///
    /// Errors: [`LedgerError::Unavailable`] when the first subscription
    /// fails.
    async fn watch_cancellations(
        &self,
    ) -> Result<Option<BoxStream<'static, Option<Uuid>>>, LedgerError> {
        Ok(None)
    }
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
    /// of treating the call as interrupted. Holding a key removes its
    /// running mark ([`Ledger::mark_running`]), after the result is
    /// written. Holding again is safe.
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

    /// Mark the calls under `keys` (idempotency keys) as running for `ttl`
    /// (at least 1 ms), replacing earlier marks. The worker running a
    /// model turn's calls marks them before the commit that clears them to
    /// run, and again every [`glia_proto::RUNNING_MARK_REFRESH`] while they
    /// run; holding a key's
    /// result ([`Ledger::hold_results`]) removes its mark. A worker that
    /// lost the run's lease while the call ran thereby keeps the next
    /// worker from calling it interrupted until the call returns and its
    /// result is held, or until the mark lapses (the worker died or lost
    /// the store).
    ///
    /// Errors: [`LedgerError::Unavailable`] when the store does not answer;
    /// the loop goes on (the mark only narrows a window). The default marks
    /// nothing.
    async fn mark_running(&self, keys: &[String], ttl: Duration) -> Result<(), LedgerError> {
        let _ = (keys, ttl);
        Ok(())
    }

    /// True while the call under `key` is marked running
    /// ([`Ledger::mark_running`]) and the mark has not lapsed.
    ///
    /// Errors: [`LedgerError::Unavailable`] when the store does not answer:
    /// whether the call still runs is then unknown, and the caller must not
    /// act as if it did not. The default marks nothing (`false`).
    async fn running(&self, key: &str) -> Result<bool, LedgerError> {
        let _ = key;
        Ok(false)
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

    /// Forget everything kept for run `run_id` that holds its content: the
    /// tool results held under its calls' idempotency keys (`{run_id}:…`)
    /// and their running marks. Part of erasing a run
    /// ([`RunLog::erase_run`]); forgetting again is safe.
    ///
    /// Errors: [`LedgerError::Unavailable`] when the store does not answer
    /// (ask again: held results otherwise expire after
    /// [`HELD_RESULT_TTL`]). The default keeps nothing, so forgets nothing.
    async fn forget_run(&self, run_id: Uuid) -> Result<(), LedgerError> {
        let _ = run_id;
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
