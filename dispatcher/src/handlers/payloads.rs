//! What a caller posts to a run: external tool results, messages, pause,
//! resume (with budget extension), cancel, close.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use glia_proto::{BudgetLimits, Disposition, PauseReason, Payload, PullPoint};
use uuid::Uuid;

use crate::app::App;
use crate::auth::{Principal, Scope};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiPath, OptJson};

use crate::model::*;

use crate::admission::redacted_input;
use crate::control::{
    cancel_run, not_done, operator_pause, pause_run, post, unflag_pause, visible_run,
};

/// Post the result of an external (client-executed) tool call.
#[utoipa::path(post, path = "/v1/runs/{id}/tool-results/{call_id}", tag = "payloads", request_body = ToolResultBody,
    params(("id" = Uuid, Path, description = "Run id"), ("call_id" = String, Path, description = "Tool call id")),
    responses((status = 202, body = Accepted), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn post_tool_result(
    State(app): State<App>,
    p: Principal,
    ApiPath((id, call_id)): ApiPath<(Uuid, String)>,
    ApiJson(body): ApiJson<ToolResultBody>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    p.require(Scope::Submit)?;
    let run = visible_run(&app, &p, id).await?;
    not_done(&run)?;
    let state = app.log.load(id).await?;
    let call = state.call(&call_id).ok_or_else(|| ApiError::CallNotFound {
        run_id: id,
        call_id: call_id.clone(),
    })?;
    if call.disposition != Some(Disposition::External) {
        return Err(ApiError::NotExternal(call_id));
    }
    if call.result.is_some() {
        return Err(ApiError::AlreadyAnswered(call_id));
    }
    let payload = Payload::ToolResult {
        call_id: call_id.clone(),
        content: body.content,
        is_error: body.is_error,
    };
    let (inbox_id, kind) = post(&app, id, payload).await.map_err(|e| match e {
        glia_backends::LogError::Duplicate { .. } => ApiError::AlreadyAnswered(call_id.clone()),
        e => e.into(),
    })?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Accepted {
            run_id: id,
            call_id: Some(call_id),
            inbox_ids: vec![inbox_id],
            kinds: vec![kind.into()],
            decision: None,
        }),
    ))
}

/// Post the user's next message to a run parked at `awaiting_input`.
#[utoipa::path(post, path = "/v1/runs/{id}/messages", tag = "payloads", request_body = MessageBody,
    params(("id" = Uuid, Path, description = "Run id")),
    responses((status = 202, body = Accepted), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn post_message(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
    ApiJson(body): ApiJson<MessageBody>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    p.require(Scope::Submit)?;
    let run = visible_run(&app, &p, id).await?;
    if body.text.trim().is_empty() {
        return Err(ApiError::Invalid("`text` is blank".into()));
    }
    not_done(&run)?;
    if run.pull_point != Some(PullPoint::AwaitingInput) {
        return Err(ApiError::NotAwaitingInput(id));
    }
    if app
        .log
        .inbox(id)
        .await?
        .iter()
        .any(|i| matches!(i.payload, Payload::Input { .. } | Payload::Close { .. }))
    {
        return Err(ApiError::AlreadyPosted {
            run_id: id,
            what: "a message or a close".into(),
        });
    }
    head_unmoved(&app, &p, id, body.head_seq).await?;
    let (text, redactions) = redacted_input(&app, id, "text", body.text).await?;
    let (inbox_id, kind) = post(&app, id, Payload::Input { text, redactions }).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Accepted {
            run_id: id,
            call_id: None,
            inbox_ids: vec![inbox_id],
            kinds: vec![kind.into()],
            decision: None,
        }),
    ))
}

/// With `expected` (a message's or close's `head_seq`), 409 `head_moved`
/// unless the run's head is still `expected`. Read after the inbox check:
/// a waiting input that a worker takes meanwhile moves the head in the same
/// commit, so a retried post either finds it waiting or finds the head moved.
async fn head_unmoved(
    app: &App,
    p: &Principal,
    id: Uuid,
    expected: Option<u64>,
) -> Result<(), ApiError> {
    let Some(expected) = expected else {
        return Ok(());
    };
    let actual = visible_run(app, p, id).await?.head_seq;
    if actual != expected {
        return Err(ApiError::HeadMoved {
            run_id: id,
            expected,
            actual,
        });
    }
    Ok(())
}

/// Resume a paused run, optionally extending its budget first.
///
/// With `extend` (amounts added to the current limits) the run gets an
/// `extend_budget` payload, which also resumes a run paused by its budget; a
/// run paused for another reason additionally gets a `resume`. Without it,
/// a `resume`. A run resumed while still over budget pauses again.
#[utoipa::path(post, path = "/v1/runs/{id}/resume", tag = "payloads", request_body(content = ResumeBody, description = "May be empty"),
    params(("id" = Uuid, Path, description = "Run id")),
    responses((status = 202, body = Accepted), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn resume(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
    OptJson(body): OptJson<ResumeBody>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    p.require_any(&[Scope::Submit, Scope::Approve])?;
    let run = visible_run(&app, &p, id).await?;
    not_done(&run)?;
    let inbox = app.log.inbox(id).await?;
    if inbox.iter().any(|i| {
        matches!(
            i.payload,
            Payload::ExtendBudget { .. } | Payload::Resume { .. }
        )
    }) {
        return Err(ApiError::AlreadyPosted {
            run_id: id,
            what: "a resume".into(),
        });
    }
    let operator = operator_pause(&app, id, &inbox).await?;
    let parked = match &run.pull_point {
        Some(PullPoint::Paused { reason }) => Some(reason.clone()),
        _ => None,
    };
    let mut payloads = Vec::new();
    // An operator pause requested and not in effect yet: a first resume
    // withdraws it (and clears the flag).
    let pending = operator.is_some() && !matches!(parked, Some(PauseReason::Operator { .. }));
    if operator.is_some() {
        unflag_pause(&app, id).await;
    }
    if pending {
        payloads.push(Payload::Resume { by: Some(p.by()) });
    }
    match parked {
        None if pending => {}
        None => return Err(ApiError::NotPaused(id)),
        Some(reason) => {
            let extend = body.extend.filter(|l| *l != BudgetLimits::default());
            if let Some(extra) = extend {
                payloads.push(Payload::ExtendBudget { extra });
            }
            if extend.is_none() || !matches!(reason, PauseReason::Budget { .. }) {
                payloads.push(Payload::Resume { by: Some(p.by()) });
            }
        }
    }
    let mut accepted = Accepted {
        run_id: id,
        call_id: None,
        inbox_ids: vec![],
        kinds: vec![],
        decision: None,
    };
    for payload in payloads {
        let (inbox_id, kind) = post(&app, id, payload).await?;
        accepted.inbox_ids.push(inbox_id);
        accepted.kinds.push(kind.into());
    }
    // Issue 32: the children this run's pause paused resume with it.
    if operator.is_some() {
        crate::control::resume_children(&app, id, &p.by()).await;
    }
    Ok((StatusCode::ACCEPTED, Json(accepted)))
}

/// Pause a run at its next step boundary (an operator pause).
///
/// Posts a `pause` payload and sets the run's pause flag in the ledger. A
/// worker busy with the run sees the flag at its next durability barrier
/// (after the model call or tool calls in flight finish; nothing is
/// aborted), records `session.pause_requested` and parks the run at
/// `paused` (reason `operator`). A run parked elsewhere (an approval, a
/// tool result, a message) records the request now and pauses as soon as
/// its payload lets it go on. `POST /v1/runs/{id}/resume` resumes it, or
/// withdraws a pause not yet in effect.
#[utoipa::path(post, path = "/v1/runs/{id}/pause", tag = "payloads", request_body(content = PauseBody, description = "May be empty"),
    params(("id" = Uuid, Path, description = "Run id")),
    responses((status = 202, body = Accepted), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn pause(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
    OptJson(body): OptJson<PauseBody>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    p.require(Scope::Submit)?;
    let run = visible_run(&app, &p, id).await?;
    not_done(&run)?;
    let reason = body
        .reason
        .as_deref()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map_or_else(|| format!("paused by {}", p.by()), str::to_owned);
    let inbox_id = pause_run(&app, id, &reason, &p.by())
        .await?
        .ok_or(ApiError::AlreadyPaused(id))?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Accepted {
            run_id: id,
            call_id: None,
            inbox_ids: vec![inbox_id],
            kinds: vec!["pause".into()],
            decision: None,
        }),
    ))
}

/// Cancel a run.
///
/// Posts a `cancel` payload (durable: the worker that next holds the run
/// records `session.cancel` and the run is done) and sets the run's cancel
/// flag in the ledger, so a worker busy with the run stops cooperatively: an
/// in-flight model stream is aborted; a tool call already running may
/// finish within its grace period (`cancel_grace_ms` of its tool, default
/// 5 s) and its result is recorded; one still running then is abandoned
/// with an `outcome_unknown` error. A second cancel while the first waits in
/// the inbox answers 202 with the same inbox id; any other payload posted
/// from now on answers 409 `run_cancelled`.
#[utoipa::path(post, path = "/v1/runs/{id}/cancel", tag = "payloads", request_body(content = CancelBody, description = "May be empty"),
    params(("id" = Uuid, Path, description = "Run id")),
    responses((status = 202, body = Accepted), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
    OptJson(body): OptJson<CancelBody>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    p.require(Scope::Submit)?;
    let run = visible_run(&app, &p, id).await?;
    not_done(&run)?;
    let reason = body
        .reason
        .as_deref()
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map_or_else(|| format!("cancelled by {}", p.by()), str::to_owned);
    let inbox_id = cancel_run(&app, id, &reason, &p.by()).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Accepted {
            run_id: id,
            call_id: None,
            inbox_ids: vec![inbox_id],
            kinds: vec!["cancel".into()],
            decision: None,
        }),
    ))
}

/// Close a conversational run waiting at `awaiting_input`, or a run paused by
/// its budget: it completes with its last answer. An optional body
/// `{"text": "…"}` (only at `awaiting_input`) records the user's last words
/// first; no model call follows them.
#[utoipa::path(post, path = "/v1/runs/{id}/close", tag = "payloads", request_body(content = CloseBody, description = "May be empty"),
    params(("id" = Uuid, Path, description = "Run id")),
    responses((status = 202, body = Accepted), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn close(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
    OptJson(body): OptJson<CloseBody>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    p.require(Scope::Submit)?;
    let run = visible_run(&app, &p, id).await?;
    not_done(&run)?;
    let closable = match &run.pull_point {
        Some(PullPoint::AwaitingInput) => true,
        Some(PullPoint::Paused {
            reason: PauseReason::Budget { .. },
        }) => body.text.is_none(),
        _ => false,
    };
    if !closable {
        return Err(ApiError::NotAwaitingInput(id));
    }
    if body.text.as_deref().is_some_and(|t| t.trim().is_empty()) {
        return Err(ApiError::Invalid(
            "text: the closing message is empty".into(),
        ));
    }
    if app
        .log
        .inbox(id)
        .await?
        .iter()
        .any(|i| matches!(i.payload, Payload::Input { .. } | Payload::Close { .. }))
    {
        return Err(ApiError::AlreadyPosted {
            run_id: id,
            what: "a message or a close".into(),
        });
    }
    head_unmoved(&app, &p, id, body.head_seq).await?;
    let (text, redactions) = match body.text {
        Some(text) => {
            let (text, redactions) = redacted_input(&app, id, "text", text).await?;
            (Some(text), redactions)
        }
        None => (None, Vec::new()),
    };
    let (inbox_id, kind) = post(&app, id, Payload::Close { text, redactions }).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Accepted {
            run_id: id,
            call_id: None,
            inbox_ids: vec![inbox_id],
            kinds: vec![kind.into()],
            decision: None,
        }),
    ))
}
