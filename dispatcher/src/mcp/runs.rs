//! Following a run for an MCP call: its events read from the log as the
//! SSE stream reads them (each once, in order), sent as progress
//! notifications, until the run is done, parks where someone outside must
//! act, the wait limit comes, or the call is cancelled; and the result the
//! call answers ([`result`]).

use std::time::Duration;

use glia_backends::{ApprovalFilter, ApprovalRow, RunStatus, RunSummary};
use glia_proto::{Event, EventKind, Outcome, PullPoint};
use rmcp::model::{CallToolResult, ContentBlock, ProgressNotificationParam, ProgressToken};
use rmcp::service::{Peer, RoleServer};
use serde_json::{Value, json};
use tokio::time::Instant;
use uuid::Uuid;

use crate::app::App;
use crate::error::ApiError;
use crate::mcp::tools::{DECIDE_APPROVAL, WAIT_RUN};

/// Where following a run stopped.
#[derive(Debug)]
pub enum Stop {
    /// The run is done, or parked where only someone outside moves it on
    /// ([`needs_outside`]) with nothing posted yet, or the wait limit came:
    /// the run as last read.
    Answer(Box<RunSummary>),
    /// The call was cancelled or its session ended: nobody reads the answer.
    Abandoned,
}

/// Progress notifications of one call: the client's token and the session.
pub struct Progress {
    /// Where to send them.
    pub peer: Peer<RoleServer>,
    /// The request's `progressToken`.
    pub token: ProgressToken,
}

/// True at a pull point only someone outside glia moves on: an approval,
/// an external tool result, the user's message, a resume, an event. Timers
/// and child runs are moved on by the dispatcher itself, so a call keeps
/// waiting there.
pub fn needs_outside(point: &PullPoint) -> bool {
    !matches!(
        point,
        PullPoint::AwaitingTimer { .. } | PullPoint::AwaitingChildren { .. }
    )
}

/// How often the run's row is read again when no event arrived (a posted
/// payload a worker drops moves no event).
const RECHECK: Duration = Duration::from_secs(1);
/// Failed log reads in a row after which the call stops waiting.
const MAX_FAILURES: u32 = 20;
/// The longest a progress notification may take to go out (a client that
/// stops reading its stream): after it, the call sends no more progress
/// and still answers by its deadline.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(10);

/// Follow run `run` (as admitted or last read) from event `after` until
/// `deadline` or `cancelled` resolves; each event read is sent to
/// `progress` (progress = its seq, message = [`describe`]). A store that
/// keeps failing ends the wait early with the run as last read (the run
/// goes on; the answer says how to wait again).
pub async fn follow(
    app: &App,
    mut run: RunSummary,
    mut after: u64,
    progress: Option<&Progress>,
    deadline: Instant,
    cancelled: impl std::future::Future<Output = ()>,
) -> Stop {
    tokio::pin!(cancelled);
    let id = run.run_id;
    let mut failures = 0u32;
    let mut checked = Instant::now();
    let mut check = true;
    let mut stalled = false;
    loop {
        match app.log.events(id, after, app.limits.stream_page).await {
            Ok(events) => {
                failures = 0;
                let full = events.len() == app.limits.stream_page;
                for e in &events {
                    if let Some(p) = progress.filter(|_| !stalled) {
                        let give_up = deadline.min(Instant::now() + NOTIFY_TIMEOUT);
                        tokio::select! {
                            _ = notify(p, id, e) => {}
                            _ = tokio::time::sleep_until(give_up) => {
                                tracing::debug!(run_id = %id, "MCP progress stalled (the client reads no more); no more progress for this call");
                                stalled = true;
                            }
                            _ = &mut cancelled => return Stop::Abandoned,
                        }
                    }
                    after = e.seq;
                }
                check |= !events.is_empty() || checked.elapsed() >= RECHECK;
                if full {
                    continue;
                }
            }
            Err(e) => {
                failures += 1;
                tracing::warn!(run_id = %id, "MCP call: reading the run's events failed ({failures}): {e}");
                if failures >= MAX_FAILURES {
                    return Stop::Answer(Box::new(run));
                }
            }
        }
        if check && failures == 0 {
            checked = Instant::now();
            check = false;
            match settled(app, id).await {
                Ok((now, settled)) => {
                    run = now;
                    // Events the read did not see yet go out first, so
                    // progress ends with the event the answer follows.
                    if run.head_seq > after {
                        continue;
                    }
                    if settled {
                        return Stop::Answer(Box::new(run));
                    }
                }
                Err(e) => tracing::warn!(run_id = %id, "MCP call: reading the run failed: {e}"),
            }
        }
        let wait = if failures > 0 {
            app.limits.stream_poll.max(Duration::from_millis(250))
        } else {
            app.limits.stream_poll
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = tokio::time::sleep_until(deadline) => return Stop::Answer(Box::new(run)),
            _ = &mut cancelled => return Stop::Abandoned,
        }
    }
}

/// The run now, and whether a call should answer with it: done, or parked
/// where someone outside must act with nothing waiting in its inbox (a
/// decision posted and not yet applied moves it on soon).
async fn settled(app: &App, id: Uuid) -> Result<(RunSummary, bool), ApiError> {
    let run = app.log.get_run(id).await?;
    let settled = match (&run.status, &run.pull_point) {
        (RunStatus::Done, _) => true,
        (RunStatus::Parked, Some(point)) if needs_outside(point) => {
            app.log.inbox(id).await?.is_empty()
        }
        _ => false,
    };
    Ok((run, settled))
}

async fn notify(p: &Progress, run_id: Uuid, e: &Event) {
    let mut param =
        ProgressNotificationParam::new(p.token.clone(), e.seq as f64).with_message(describe(e));
    let mut meta = rmcp::model::NotificationMetaObject::default();
    meta.0.0.insert("glia/run_id".into(), json!(run_id));
    meta.0.0.insert("glia/seq".into(), json!(e.seq));
    meta.0.0.insert("glia/event".into(), json!(e.kind.name()));
    param.meta = Some(meta);
    if let Err(err) = p.peer.notify_progress(param).await {
        tracing::debug!(%run_id, "MCP progress notification not sent: {err}");
    }
}

/// One line about event `e` for a progress message: its seq, its type and
/// what it names (a tool and call, a step, a pull point, an outcome), never
/// arguments, results or text.
pub fn describe(e: &Event) -> String {
    let what = match &e.kind {
        EventKind::StepStart { index, .. } => format!("step {} started", index + 1),
        EventKind::StepEnd { index, .. } => format!("step {} ended", index + 1),
        EventKind::ModelCall { model, .. } => format!("model {model} called"),
        EventKind::ToolCall(call) => format!("tool {} called ({})", call.name, call.call_id),
        EventKind::ToolResult { call_id, .. } => format!("tool result ({call_id})"),
        EventKind::ToolError { call_id, .. } => format!("tool error ({call_id})"),
        EventKind::ApprovalRequested { call_id, tool, .. } => {
            format!("approval of {tool} requested ({call_id})")
        }
        EventKind::ApprovalResolved { call_id, .. } => format!("approval decided ({call_id})"),
        EventKind::SessionPause { pull_point } => format!("waits: {}", pull_point.name()),
        EventKind::SessionComplete { outcome } => match outcome {
            Outcome::Succeeded { .. } => "succeeded".into(),
            Outcome::Failed { .. } => "failed".into(),
            Outcome::Cancelled { .. } => "cancelled".into(),
        },
        other => other.name().to_owned(),
    };
    format!("{} {}: {what}", e.seq, e.kind.name())
}

/// The pending approvals of run `id`, oldest first.
pub async fn pending_approvals(app: &App, id: Uuid) -> Result<Vec<ApprovalRow>, ApiError> {
    let filter = ApprovalFilter {
        run_id: Some(id),
        pending_only: true,
        limit: app.limits.max_page,
        ..Default::default()
    };
    Ok(app.log.approvals(&filter).await?)
}

/// One approval as the MCP tools show it.
pub fn approval_json(a: &ApprovalRow) -> Value {
    json!({
        "run_id": a.run_id,
        "call_id": a.call_id,
        "tool": a.tool,
        "input": a.input,
        "args_hash": a.args_hash,
        "requested_at": a.requested_at,
        "expires_at": a.expires_at,
        "interrupted": a.interrupted,
    })
}

/// The answer of a call that followed `run` to `stop`: its answer (text,
/// and `output` when it has structured output) when it succeeded; an
/// error result with the reason when it failed or was cancelled; else the
/// structured "continue" result: where it waits, the pending approvals or
/// calls, and `next` (the tools and HTTP requests that move it on). The
/// structured content always matches [`crate::mcp::tools::result_schema`].
pub async fn result(
    app: &App,
    run: &RunSummary,
    wait: Duration,
) -> Result<CallToolResult, ApiError> {
    let id = run.run_id;
    let mut body = json!({"run_id": id});
    let wait_next = json!({"action": "wait", "tool": WAIT_RUN, "arguments": {"run_id": id}, "http": format!("GET /v1/runs/{id}/events/stream")});
    if run.status == RunStatus::Done {
        let (status, text, error) = match &run.outcome {
            Some(Outcome::Succeeded { answer, output }) => {
                body["answer"] = json!(answer);
                if let Some(output) = output {
                    body["output"] = output.clone();
                }
                let text = if answer.is_empty() {
                    output.as_ref().map(Value::to_string).unwrap_or_default()
                } else {
                    answer.clone()
                };
                ("succeeded", text, false)
            }
            Some(Outcome::Failed { error }) => {
                body["error"] = json!(error);
                ("failed", format!("The run {id} failed: {error}"), true)
            }
            Some(Outcome::Cancelled { reason }) => {
                body["error"] = json!(reason);
                (
                    "cancelled",
                    format!("The run {id} was cancelled: {reason}"),
                    true,
                )
            }
            None => {
                let reason = run
                    .error
                    .clone()
                    .unwrap_or_else(|| "no outcome recorded".into());
                body["error"] = json!(reason);
                ("failed", format!("The run {id} ended: {reason}"), true)
            }
        };
        body["status"] = json!(status);
        return Ok(answer(text, body, error));
    }
    // A payload posted and not yet applied (a decision, a message) moves
    // the run on: it is running, not waiting for anyone.
    let parked = match (&run.status, &run.pull_point) {
        (RunStatus::Parked, Some(point)) if needs_outside(point) => {
            app.log.inbox(id).await?.is_empty().then_some(point)
        }
        _ => None,
    };
    let Some(point) = parked else {
        return Ok(running(run, wait, false));
    };
    body["status"] = json!("waiting");
    body["pull_point"] = json!(point);
    let mut next = Vec::new();
    let text = match point {
        PullPoint::AwaitingApproval { .. } => {
            let approvals = pending_approvals(app, id).await?;
            let mut lines = Vec::new();
            for a in &approvals {
                lines.push(format!(
                    "- call {}: {} {} (args_hash {})",
                    a.call_id, a.tool, a.input, a.args_hash
                ));
                next.push(json!({
                    "action": "decide_approval",
                    "tool": DECIDE_APPROVAL,
                    "arguments": {"run_id": id, "call_id": a.call_id, "decision": "approve", "args_hash": a.args_hash},
                    "http": format!("POST /v1/runs/{id}/approvals/{}", a.call_id),
                }));
            }
            body["approvals"] = Value::Array(approvals.iter().map(approval_json).collect());
            format!(
                "The run {id} waits for a decision on {} tool call(s):\n{}\nDecide each with the tool {DECIDE_APPROVAL} (decision approve, reject with a reason, or edit with input), or POST /v1/runs/{id}/approvals/CALL_ID; then call {WAIT_RUN} with {{\"run_id\": \"{id}\"}} for the run's answer.",
                approvals.len(),
                lines.join("\n")
            )
        }
        PullPoint::AwaitingTool { call_ids } => {
            let state = app.log.load(id).await?;
            let calls: Vec<Value> = call_ids
                .iter()
                .filter_map(|c| state.call(c))
                .map(|c| json!({"call_id": c.call_id, "tool": c.name, "input": c.input}))
                .collect();
            for c in call_ids {
                next.push(json!({"action": "post_tool_result", "http": format!("POST /v1/runs/{id}/tool-results/{c}")}));
            }
            body["calls"] = Value::Array(calls);
            format!(
                "The run {id} waits for the results of external tool calls ({}). Post each with POST /v1/runs/{id}/tool-results/CALL_ID, then call {WAIT_RUN}.",
                call_ids.join(", ")
            )
        }
        PullPoint::AwaitingInput => {
            let state = app.log.load(id).await?;
            body["answer"] = json!(state.answer);
            next.push(
                json!({"action": "post_message", "http": format!("POST /v1/runs/{id}/messages")}),
            );
            next.push(json!({"action": "close", "http": format!("POST /v1/runs/{id}/close")}));
            format!(
                "{}\n\n(The run {id} waits for the user's next message: POST /v1/runs/{id}/messages, or POST /v1/runs/{id}/close to end it.)",
                state.answer
            )
        }
        PullPoint::Paused { reason } => {
            next.push(json!({"action": "resume", "http": format!("POST /v1/runs/{id}/resume")}));
            format!(
                "The run {id} is paused ({}). An operator resumes it with POST /v1/runs/{id}/resume; then call {WAIT_RUN}.",
                json!(reason)
            )
        }
        PullPoint::AwaitingEvent { keys, .. } => {
            next.push(json!({"action": "post_event", "http": "POST /v1/events"}));
            format!(
                "The run {id} waits for events with the keys {}: POST /v1/events delivers one; then call {WAIT_RUN}.",
                keys.join(", ")
            )
        }
        PullPoint::AwaitingTimer { .. } | PullPoint::AwaitingChildren { .. } => {
            unreachable!("needs_outside is false there")
        }
    };
    next.push(wait_next);
    body["next"] = Value::Array(next);
    Ok(answer(text, body, false))
}

/// The "running" continue result of `run` (not done, or where it waits
/// could not be read: `unread`): its id and how to wait for it again.
pub fn running(run: &RunSummary, wait: Duration, unread: bool) -> CallToolResult {
    let id = run.run_id;
    let mut body = json!({"run_id": id, "status": "running"});
    if let Some(point) = &run.pull_point {
        body["pull_point"] = json!(point);
    }
    body["next"] = json!([{"action": "wait", "tool": WAIT_RUN, "arguments": {"run_id": id}, "http": format!("GET /v1/runs/{id}/events/stream")}]);
    let why = if unread {
        "glia could not read where it stands (its store failed)".to_owned()
    } else {
        format!("still running after the wait limit ({} s)", wait.as_secs())
    };
    let text = format!(
        "The run {id} is {why}. Call {WAIT_RUN} with {{\"run_id\": \"{id}\"}} to wait for it again."
    );
    answer(text, body, false)
}

/// A result: `text`, then `body` as JSON text (for clients that read only
/// content) and as `structuredContent`.
fn answer(text: String, body: Value, error: bool) -> CallToolResult {
    let mut result = if error {
        CallToolResult::structured_error(body)
    } else {
        CallToolResult::structured(body)
    };
    result.content.insert(0, ContentBlock::text(text));
    result
}
