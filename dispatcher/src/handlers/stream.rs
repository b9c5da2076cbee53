//! `GET /v1/runs/{id}/events/stream`: a run's events as server-sent events.
//!
//! Wire format:
//!
//! - each persisted event: `id: <seq>`, `event: event`, `data: <Event JSON>`;
//! - each live delta (`model.delta`, `tool.progress`, never persisted):
//!   `event: live`, `data: <LiveEvent JSON>`, without an id (so a
//!   reconnecting client's `Last-Event-ID` stays the last persisted seq);
//! - comments (`:`) as keep-alives every 15 s.
//!
//! The stream starts after `Last-Event-ID` (or the `after` query parameter,
//! or from the start), reads the log page by page, then follows it by
//! polling every [`crate::Limits::stream_poll`]: every event is sent exactly
//! once and in order, with no gap. It ends after `session.complete` or
//! `session.cancel`. Live deltas are best effort: those published while no
//! stream listens are lost.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use glia_proto::{Event, EventKind, LiveEvent};
use serde::Deserialize;
use tokio::sync::mpsc;
use utoipa::IntoParams;
use uuid::Uuid;

use crate::app::App;
use crate::auth::Principal;
use crate::control::visible_run;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiPath, ApiQuery};

/// Query of the stream: where to start when no `Last-Event-ID` is sent.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct StreamQuery {
    /// Start after this seq (default 0: from the start). `Last-Event-ID` wins.
    pub after: Option<u64>,
}

fn terminal(e: &Event) -> bool {
    matches!(
        e.kind,
        EventKind::SessionComplete { .. } | EventKind::SessionCancel { .. }
    )
}

fn persisted(e: &Event) -> SseEvent {
    let data = serde_json::to_string(e).expect("events serialise");
    SseEvent::default()
        .id(e.seq.to_string())
        .event("event")
        .data(data)
}

fn live(e: &LiveEvent) -> SseEvent {
    SseEvent::default()
        .event("live")
        .data(serde_json::to_string(e).expect("live events serialise"))
}

/// Stream a run's events (SSE), resuming after `Last-Event-ID`.
///
/// `event: event` frames carry persisted events with `id` = seq;
/// `event: live` frames carry live deltas without ids. The stream ends after
/// `session.complete` or `session.cancel`.
#[utoipa::path(get, path = "/v1/runs/{id}/events/stream", tag = "runs",
    params(("id" = Uuid, Path, description = "Run id"),
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this seq"), StreamQuery),
    responses((status = 200, description = "Server-sent events; the schema describes one event (frame) of the stream", content_type = "text/event-stream", body = crate::docs::SseEventDoc),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn stream_events(
    State(app): State<App>,
    p: Principal,
    headers: HeaderMap,
    ApiPath(id): ApiPath<Uuid>,
    ApiQuery(q): ApiQuery<StreamQuery>,
) -> Result<Response, ApiError> {
    let last = match headers.get("last-event-id") {
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or(ApiError::InvalidHeader {
                    name: "Last-Event-ID",
                    reason: "must be an event seq (a non-negative integer)".into(),
                })?,
        ),
        None => None,
    };
    visible_run(&app, &p, id).await?;
    let after = last.or(q.after).unwrap_or(0);
    // Subscribe before the first read so no delta published meanwhile is missed.
    let live_rx = match app.ledger.subscribe_live(id).await {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(run_id = %id, "live deltas unavailable for this stream: {e}");
            None
        }
    };
    let (tx, rx) = mpsc::channel::<SseEvent>(64);
    tokio::spawn(follow(app, id, after, live_rx, tx));
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    Ok(Sse::new(body)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

struct StreamGauge(App);

impl Drop for StreamGauge {
    fn drop(&mut self) {
        self.0.metrics().sse_streams.dec();
    }
}

/// Read the log after `after` and follow it, interleaving live deltas, until
/// a terminal event is sent or the client goes away.
async fn follow(
    app: App,
    run_id: Uuid,
    mut after: u64,
    mut live_rx: Option<futures::stream::BoxStream<'static, LiveEvent>>,
    tx: mpsc::Sender<SseEvent>,
) {
    app.metrics().sse_streams.inc();
    let _gauge = StreamGauge(app.clone());
    let mut failures = 0u32;
    loop {
        match app.log.events(run_id, after, app.limits.stream_page).await {
            Ok(events) => {
                failures = 0;
                let full = events.len() == app.limits.stream_page;
                for e in &events {
                    if tx.send(persisted(e)).await.is_err() {
                        return;
                    }
                    after = e.seq;
                    if terminal(e) {
                        return;
                    }
                }
                if full {
                    continue;
                }
            }
            Err(e) => {
                failures += 1;
                tracing::warn!(%run_id, "stream read failed ({failures}): {e}");
                if failures >= 20 {
                    let err = ApiError::from(e).body();
                    let _ = tx
                        .send(
                            SseEvent::default()
                                .event("error")
                                .data(serde_json::to_string(&err).unwrap_or_default()),
                        )
                        .await;
                    return;
                }
            }
        }
        let wait = if failures > 0 {
            app.limits.stream_poll.max(Duration::from_millis(250))
        } else {
            app.limits.stream_poll
        };
        let sleep = tokio::time::sleep(wait);
        tokio::pin!(sleep);
        // Forward live deltas until it is time to poll the log again.
        loop {
            tokio::select! {
                _ = &mut sleep => break,
                _ = tx.closed() => return,
                delta = async { match live_rx.as_mut() { Some(s) => s.next().await, None => std::future::pending().await } } => match delta {
                    Some(d) => if tx.send(live(&d)).await.is_err() { return },
                    None => live_rx = None,
                },
            }
        }
    }
}
