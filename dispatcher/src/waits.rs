//! The waits loop (issue 32, `docs/waits.md`): wakes runs whose built-in
//! timers are due or whose event waits timed out, delivers kept events to
//! waits that began after the event arrived (or that the direct delivery of
//! `POST /v1/events` missed), starts runs whose `start_at` came, and forgets
//! events older than the retention.
//!
//! Everything it does is a post ([`glia_backends::Inbox::post`]), checked by
//! the one posting rule: a wake is deduplicated per run (`wake:{due_at_ms}`,
//! `event:{id}`), so a second dispatcher, a restart or a repeated pass posts
//! nothing twice, and a duplicate refused is harmless. It keeps no state of
//! its own: a dispatcher that was down wakes what fell due meanwhile on its
//! next pass (late, never lost). At least once: a wake posted but not yet
//! applied is applied by a worker later; one that finds its wait over is
//! dropped by the worker.

use std::time::Duration;

use glia_backends::LogError;
use glia_proto::{ArrivedEvent, Payload};
use tracing::{debug, warn};
use uuid::Uuid;

use crate::app::App;

/// Due waits and deliveries taken per pass.
const PASS: usize = 512;

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pass {
    /// Wakes posted for due timers and timeouts.
    pub woken: usize,
    /// Events posted to waiting runs.
    pub delivered: usize,
    /// Kept events forgotten (older than the retention).
    pub forgotten: u64,
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Post a wake; a refusal by the posting rule (a duplicate, a finished or
/// cancelled run) is the harmless end of an at-least-once delivery.
/// `Ok(true)` when it was taken.
pub async fn post_wake(app: &App, run_id: Uuid, payload: Payload) -> Result<bool, LogError> {
    match crate::control::post(app, run_id, payload).await {
        Ok(_) => Ok(true),
        Err(
            LogError::Duplicate { .. }
            | LogError::Finished(_)
            | LogError::Cancelled(_)
            | LogError::NotFound(_),
        ) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Deliver the kept events the store pairs with waiting runs (`only` one
/// event, or every kept one received within the retention): each posted as
/// a [`Payload::Wake`] with the event. Returns how many were taken.
pub async fn deliver(app: &App, only: Option<(&str, Uuid)>) -> Result<usize, LogError> {
    let since = now_ms() - retention_ms(app);
    let pairs = app.log.event_deliveries(since, only, PASS).await?;
    let mut taken = 0;
    for (run_id, event) in pairs {
        let payload = Payload::Wake {
            due_at_ms: event.received_at_ms,
            event: Some(event),
        };
        if post_wake(app, run_id, payload).await? {
            taken += 1;
        }
    }
    Ok(taken)
}

fn retention_ms(app: &App) -> i64 {
    i64::try_from(app.limits.event_retention.as_millis()).unwrap_or(i64::MAX)
}

/// One pass at time `now_ms` (Unix ms): wake what is due, deliver kept
/// events, forget old ones.
pub async fn waits_once(app: &App, now_ms: i64) -> Result<Pass, LogError> {
    let mut pass = Pass::default();
    for due in app.log.due_waits(now_ms, PASS).await? {
        let payload = Payload::Wake {
            due_at_ms: due.due_at_ms,
            event: None,
        };
        if post_wake(app, due.run_id, payload).await? {
            pass.woken += 1;
        }
    }
    pass.delivered = deliver(app, None).await?;
    pass.forgotten = app.log.forget_events(now_ms - retention_ms(app)).await?;
    Ok(pass)
}

/// The loop: a pass every [`crate::Limits::waits_poll`] (default 1 s);
/// failures are logged and retried with backoff up to 5 s. Never returns;
/// abort the task to stop it. Runs in every dispatcher (the fleet's, the
/// single node's, `glia dev`'s): passes on several dispatchers post nothing
/// twice.
pub async fn waits(app: App) {
    let mut backoff = Duration::ZERO;
    loop {
        match waits_once(&app, now_ms()).await {
            Ok(pass) => {
                backoff = Duration::ZERO;
                if pass != Pass::default() {
                    debug!(?pass, "waits pass");
                }
            }
            Err(e) => {
                backoff = (backoff * 2).clamp(Duration::from_millis(100), Duration::from_secs(5));
                warn!(error = %e, "waits pass failed; retrying in {} ms", backoff.as_millis());
            }
        }
        tokio::time::sleep(app.limits.waits_poll.max(backoff)).await;
    }
}

/// A new event for `tenant` as `POST /v1/events` keeps it.
pub fn arrived(id: Option<Uuid>, key: String, payload: serde_json::Value) -> ArrivedEvent {
    ArrivedEvent {
        id: id.unwrap_or_else(Uuid::now_v7),
        key,
        payload,
        received_at_ms: now_ms(),
    }
}
