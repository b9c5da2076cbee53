//! Durable timers and event waits (issue 32, `docs/waits.md`): what the
//! dispatcher's waits loop (`dispatcher/src/waits.rs`) reads to wake runs,
//! and the events `POST /v1/events` keeps.
//!
//! # Contract
//!
//! - What is due is derived from the state at each commit: a run parked at
//!   `awaiting_timer` is due at its pull point's `wake_at_ms`, one parked at
//!   `awaiting_event` at its `timeout_at_ms` ([`Waits::due_waits`]; an
//!   indexed read of the run rows, no table of its own), until a wake for
//!   that time is posted.
//! - An event is kept once per `(tenant, id)` ([`Waits::keep_event`]) until
//!   [`Waits::forget_events`] drops it (the loop forgets what is older than
//!   the retention, `docs/waits.md`).
//! - [`Waits::event_deliveries`] pairs a kept event with each run of its
//!   tenant parked at `awaiting_event` on its key that has not been posted
//!   it yet (an inbox item with dedupe key `event:{id}`) and has no event
//!   wake waiting unconsumed: one event per run per call, the oldest. Another
//!   tenant's run is never paired.

use async_trait::async_trait;
use glia_proto::ArrivedEvent;
use uuid::Uuid;

use super::inbox::Inbox;
use crate::LogError;

/// A run whose wait is due: post it a [`glia_proto::Payload::Wake`] with
/// `due_at_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DueWait {
    /// The run.
    pub run_id: Uuid,
    /// Its pull point's due time, Unix ms.
    pub due_at_ms: i64,
}

/// Timers and event waits. See the [module](self) for the contract.
#[async_trait]
pub trait Waits: Inbox {
    /// Runs parked at `awaiting_timer` whose `wake_at_ms`, or at
    /// `awaiting_event` whose `timeout_at_ms`, is at or before `now_ms`
    /// (Unix ms) and that were not posted a wake for that time yet (an
    /// inbox item `wake:{due_at_ms}`: so wakes waiting for a worker never
    /// hide later due runs from a pass), earliest first, at most `limit`.
    async fn due_waits(&self, now_ms: i64, limit: usize) -> Result<Vec<DueWait>, LogError>;

    /// Keep `event` of `tenant` for delivery. `false` when an event with the
    /// same `(tenant, id)` is kept already: nothing changes (a repeated
    /// `POST /v1/events` with the same id).
    async fn keep_event(&self, tenant: &str, event: &ArrivedEvent) -> Result<bool, LogError>;

    /// The deliveries to post now, `(run, event)`: kept events received at
    /// or after `since_ms` (Unix ms), each paired with the runs of its tenant
    /// parked at `awaiting_event` with its key among the pull point's
    /// `keys`, not yet posted that event (dedupe key `event:{id}`) and with
    /// no unconsumed event wake; per run only the oldest such event. `only`
    /// (tenant, id) restricts the events to that one. At most `limit` pairs.
    async fn event_deliveries(
        &self,
        since_ms: i64,
        only: Option<(&str, Uuid)>,
        limit: usize,
    ) -> Result<Vec<(Uuid, ArrivedEvent)>, LogError>;

    /// Drop the kept events received before `before_ms` (Unix ms); how many.
    async fn forget_events(&self, before_ms: i64) -> Result<u64, LogError>;
}
