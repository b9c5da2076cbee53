//! Run control: what moves a parked or running run on, by posting into its
//! inbox. Approval decisions (`decide_one`, `decide_many`), operator
//! pause and resume, cancel; and `visible_run`, the tenant check every
//! run endpoint makes first. The handlers, the inbox pages and the batch
//! admission loop all call these.

use glia_backends::{ApprovalFilter, ApprovalRow, RunStatus, RunSummary};
use glia_proto::{ApprovalStatus, Decision, DecisionChoice, PauseReason, Payload, PullPoint};
use uuid::Uuid;

use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;

use crate::model::{Accepted, DecisionBody};

/// The run, if `p` may see it; another tenant's run is 404, like a missing one.
pub(crate) async fn visible_run(
    app: &App,
    p: &Principal,
    run_id: Uuid,
) -> Result<RunSummary, ApiError> {
    let run = app.log.get_run(run_id).await?;
    if p.sees(&run.tenant) {
        Ok(run)
    } else {
        Err(ApiError::RunNotFound(run_id))
    }
}

pub(crate) fn not_done(run: &RunSummary) -> Result<(), ApiError> {
    if run.status == RunStatus::Done {
        Err(ApiError::RunFinished(run.run_id))
    } else {
        Ok(())
    }
}

pub(crate) async fn post(
    app: &App,
    run_id: Uuid,
    payload: Payload,
) -> Result<(i64, &'static str), glia_backends::LogError> {
    let kind = match &payload {
        Payload::Approval { .. } => "approval",
        Payload::ToolResult { .. } => "tool_result",
        Payload::Input { .. } => "input",
        Payload::ExtendBudget { .. } => "extend_budget",
        Payload::Pause { .. } => "pause",
        Payload::Resume { .. } => "resume",
        Payload::Close { .. } => "close",
        Payload::Cancel { .. } => "cancel",
        Payload::Escalate { .. } => "escalate",
        Payload::ApprovalContested { .. } => "approval_contested",
        // issue 32: waits
        Payload::Wake { .. } => "wake",
        Payload::ChildEnded { .. } => "child_ended",
    };
    let id = app.log.post(run_id, payload).await?;
    app.metrics().posted(kind);
    app.wake_relay();
    Ok((id, kind))
}

/// The approval row of `call_id` in run `run_id`, if the log has one.
pub(crate) async fn approval_row(
    app: &App,
    run_id: Uuid,
    call_id: &str,
) -> Result<Option<ApprovalRow>, glia_backends::LogError> {
    let filter = ApprovalFilter {
        run_id: Some(run_id),
        limit: app.limits.max_page,
        ..Default::default()
    };
    Ok(app
        .log
        .approvals(&filter)
        .await?
        .into_iter()
        .find(|a| a.call_id == call_id))
}

pub(crate) async fn decide_one(
    app: &App,
    p: &Principal,
    run_id: Uuid,
    call_id: String,
    body: &DecisionBody,
) -> Result<Accepted, ApiError> {
    let decision = body.to_decision()?;
    let run = visible_run(app, p, run_id).await?;
    not_done(&run)?;
    let state = app.log.load(run_id).await?;
    let Some(call) = state.call(&call_id) else {
        let known = approval_row(app, run_id, &call_id).await?.is_some();
        return Err(if known {
            lost(app, p, &run, call_id, &decision).await
        } else {
            ApiError::CallNotFound { run_id, call_id }
        });
    };
    match call.approval {
        ApprovalStatus::Requested => {}
        ApprovalStatus::Approved | ApprovalStatus::Rejected => {
            return Err(lost(app, p, &run, call_id, &decision).await);
        }
        ApprovalStatus::NotNeeded | ApprovalStatus::Due => {
            return Err(ApiError::ApprovalNotFound { run_id, call_id });
        }
    }
    if let Some(got) = &body.args_hash
        && *got != call.args_hash
    {
        return Err(ApiError::StaleArgs {
            expected: call.args_hash.clone(),
            got: got.clone(),
        });
    }
    // Edited arguments are checked like the model's: against the tool's schema.
    if let Decision::Edit { input } = &decision
        && let Some(spec) = state.step_tools.iter().find(|t| t.name == call.name)
        && let Ok(validator) = jsonschema::validator_for(&spec.input_schema)
    {
        let problems: Vec<String> = validator
            .iter_errors(input)
            .map(|e| format!("{} at '{}'", e, e.instance_path()))
            .collect();
        if !problems.is_empty() {
            let reason = format!(
                "does not match the input schema of {}: {}",
                call.name,
                problems.join("; ")
            );
            return Err(ApiError::InvalidField {
                field: "input".into(),
                reason,
            });
        }
    }
    let payload = Payload::Approval {
        call_id: call_id.clone(),
        args_hash: call.args_hash.clone(),
        decision: decision.clone(),
        by: Some(p.by()),
        request_seq: call.requested_seq,
    };
    let (id, kind) = match post(app, run_id, payload).await {
        Ok(posted) => posted,
        Err(glia_backends::LogError::Duplicate { .. }) => {
            return Err(lost(app, p, &run, call_id, &decision).await);
        }
        Err(e) => return Err(e.into()),
    };
    if let Ok(Some(row)) = approval_row(app, run_id, &call_id).await {
        let label = match &decision {
            Decision::Approve => "approve",
            Decision::Reject { .. } => "reject",
            Decision::Edit { .. } => "edit",
            Decision::Expire => "expire",
        };
        app.metrics()
            .approval_waited(label, chrono::Utc::now() - row.requested_at);
    }
    Ok(Accepted {
        run_id,
        call_id: Some(call_id),
        inbox_ids: vec![id],
        kinds: vec![kind.into()],
        decision: Some(decision),
    })
}

/// The answer to an attempt to decide `call_id` after another decision
/// won: 409 `already_decided` naming the winner, once the attempt is
/// recorded (`approval.contested`, posted for the worker to record: who,
/// what, when). A record that cannot be posted (the run ended meanwhile,
/// the store failed) is logged and the answer stays the 409.
async fn lost(
    app: &App,
    p: &Principal,
    run: &RunSummary,
    call_id: String,
    decision: &Decision,
) -> ApiError {
    let chose = match decision {
        Decision::Reject { .. } => DecisionChoice::Reject,
        Decision::Edit { .. } => DecisionChoice::Edit,
        Decision::Approve | Decision::Expire => DecisionChoice::Approve,
    };
    let record = Payload::ApprovalContested {
        call_id: call_id.clone(),
        by: Some(p.by()),
        chose,
        attempted_at: chrono::Utc::now(),
    };
    if let Err(e) = post(app, run.run_id, record).await {
        tracing::warn!(run_id = %run.run_id, %call_id, by = %p.by(), "a losing approval attempt was not recorded: {e}");
    }
    let winner = match winner(app, run, &call_id).await {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(run_id = %run.run_id, %call_id, "the winning decision could not be read: {e}");
            None
        }
    };
    ApiError::AlreadyDecided {
        run_id: run.run_id,
        call_id,
        winner,
    }
}

/// The decision that answered `call_id`, in words: from the log
/// (`approval.resolved`: `reject by ana at 2025-…`), or, not yet applied,
/// from the run's inbox (`approve by ana, posted, not yet applied`).
async fn winner(
    app: &App,
    run: &RunSummary,
    call_id: &str,
) -> Result<Option<String>, glia_backends::LogError> {
    let who = |by: &Option<String>| by.clone().unwrap_or_else(|| "someone".to_owned());
    let records = crate::history::run_records(&*app.log, run).await?;
    if let Some(r) = records
        .iter()
        .rev()
        .find(|r| r.call_id == call_id && r.decision.is_some())
    {
        let at = r
            .decided_at
            .map(|t| {
                format!(
                    " at {}",
                    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                )
            })
            .unwrap_or_default();
        return Ok(Some(format!(
            "{} by {}{at}",
            r.resolution.as_str(),
            who(&r.decided_by)
        )));
    }
    Ok(app
        .log
        .inbox(run.run_id)
        .await?
        .into_iter()
        .find_map(|i| match i.payload {
            Payload::Approval {
                call_id: c,
                decision,
                by,
                ..
            } if c == call_id => Some(format!(
                "{} by {} (posted, not yet applied)",
                match decision {
                    Decision::Approve => "approved",
                    Decision::Edit { .. } => "edited",
                    Decision::Reject { .. } => "rejected",
                    Decision::Expire => "expired",
                },
                who(&by)
            )),
            _ => None,
        }))
}

/// How many runs' decisions a bulk request posts at once: each decision is
/// a few reads and a commit, so one after another a request of 100 took
/// about 100 commit latencies while the workers waited for them.
const BULK_RUNS_AT_ONCE: usize = 8;

/// Decide `items` (`(run, call, decision)`), each on its own as
/// [`decide_one`]: one run's decisions one after another in the given order
/// (they reach the run's inbox in that order), up to [`BULK_RUNS_AT_ONCE`]
/// runs at once. The answers are in the order of `items`.
pub(crate) async fn decide_many(
    app: &App,
    p: &Principal,
    items: &[(Uuid, String, DecisionBody)],
) -> Vec<Result<Accepted, ApiError>> {
    use futures::StreamExt;
    // Each run's items, runs in order of first appearance.
    let mut runs: Vec<(Uuid, Vec<usize>)> = Vec::new();
    for (i, (run_id, _, _)) in items.iter().enumerate() {
        match runs.iter_mut().find(|(r, _)| r == run_id) {
            Some((_, of_run)) => of_run.push(i),
            None => runs.push((*run_id, vec![i])),
        }
    }
    let answered: Vec<Vec<(usize, Result<Accepted, ApiError>)>> = futures::stream::iter(runs)
        .map(|(_, of_run)| async move {
            let mut answers = Vec::with_capacity(of_run.len());
            for i in of_run {
                let (run_id, call_id, body) = &items[i];
                answers.push((i, decide_one(app, p, *run_id, call_id.clone(), body).await));
            }
            answers
        })
        .buffer_unordered(BULK_RUNS_AT_ONCE)
        .collect()
        .await;
    let mut answers: Vec<Option<Result<Accepted, ApiError>>> =
        std::iter::repeat_with(|| None).take(items.len()).collect();
    for (i, answer) in answered.into_iter().flatten() {
        answers[i] = Some(answer);
    }
    answers
        .into_iter()
        .map(|a| a.expect("every item belongs to one run and is answered"))
        .collect()
}

/// The reason of the operator pause run `id` is under or about to be under,
/// once the payloads waiting in `inbox` are applied: the last `pause` or
/// `resume` there decides (a resume withdraws or ends a pause); with
/// neither, the run's state: parked at `paused` by an operator, or a
/// `session.pause_requested` not yet in effect.
pub(crate) async fn operator_pause(
    app: &App,
    id: Uuid,
    inbox: &[glia_backends::InboxItem],
) -> Result<Option<String>, ApiError> {
    let last = inbox.iter().rev().find_map(|i| match &i.payload {
        Payload::Pause { reason, .. } => Some(Some(reason.clone())),
        Payload::Resume { .. } => Some(None),
        _ => None,
    });
    if let Some(decided) = last {
        return Ok(decided);
    }
    let state = app.log.load(id).await?;
    Ok(match state.parked {
        Some(PullPoint::Paused {
            reason: PauseReason::Operator { reason },
        }) => Some(reason),
        _ => state.pause_due,
    })
}

/// Post a pause to run `id` and set its pause flag: the durable part of
/// `POST /v1/runs/{id}/pause`, also used when a batch is paused or reaches
/// its spend cap. `None` when the run is already paused or pausing.
pub(crate) async fn pause_run(
    app: &App,
    id: Uuid,
    reason: &str,
    by: &str,
) -> Result<Option<i64>, ApiError> {
    let inbox = app.log.inbox(id).await?;
    if operator_pause(app, id, &inbox).await?.is_some() {
        return Ok(None);
    }
    let (inbox_id, _) = post(
        app,
        id,
        Payload::Pause {
            reason: reason.to_owned(),
            by: Some(by.to_owned()),
        },
    )
    .await?;
    // The durable part is done; the flag only makes a busy worker look sooner.
    if let Err(e) = app.ledger.set_paused(id, true).await {
        tracing::warn!(run_id = %id, "pause flag not set (the posted pause applies at the run's next job): {e}");
    }
    tracing::info!(run_id = %id, %by, %reason, "pause requested");
    pause_children(app, id, by).await;
    Ok(Some(inbox_id))
}

/// Clear run `id`'s pause flag before a resume is posted. A flag left set
/// costs a busy worker one reload of the run (it finds no pause posted).
pub(crate) async fn unflag_pause(app: &App, id: Uuid) {
    if let Err(e) = app.ledger.set_paused(id, false).await {
        tracing::warn!(run_id = %id, "pause flag not cleared: {e}");
    }
}

/// Resume run `id` if an operator pause whose reason `parked_by` accepts
/// holds it or is about to (see [`operator_pause`]); true when a resume was
/// posted. What a batch's resume does for the runs it paused.
pub(crate) async fn resume_paused_by(
    app: &App,
    id: Uuid,
    by: &str,
    parked_by: impl Fn(&str) -> bool,
) -> Result<bool, ApiError> {
    let inbox = app.log.inbox(id).await?;
    // One resume: it withdraws a pause not yet in effect, or ends one in
    // effect (a run parked at another pause stays there).
    match operator_pause(app, id, &inbox).await? {
        Some(reason) if parked_by(&reason) => {
            unflag_pause(app, id).await;
            post(
                app,
                id,
                Payload::Resume {
                    by: Some(by.to_owned()),
                },
            )
            .await?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Post a cancel to run `id` (or find the one already waiting) and set its
/// cancel flag: the durable part of `POST /v1/runs/{id}/cancel`, also used
/// when a batch is cancelled. Answers the cancel's inbox id.
pub(crate) async fn cancel_run(
    app: &App,
    id: Uuid,
    reason: &str,
    by: &str,
) -> Result<i64, ApiError> {
    let pending = app
        .log
        .inbox(id)
        .await?
        .into_iter()
        .find(|i| matches!(i.payload, Payload::Cancel { .. }));
    let inbox_id = match pending {
        Some(item) => item.id,
        None => match post(
            app,
            id,
            Payload::Cancel {
                reason: reason.to_owned(),
            },
        )
        .await
        {
            Ok((inbox_id, _)) => inbox_id,
            // A concurrent cancel got there first: answer with it.
            Err(glia_backends::LogError::Duplicate { .. }) => app
                .log
                .inbox(id)
                .await?
                .into_iter()
                .find(|i| matches!(i.payload, Payload::Cancel { .. }))
                .map(|i| i.id)
                .ok_or(ApiError::RunFinished(id))?,
            Err(e) => return Err(e.into()),
        },
    };
    // The durable part is done; the flag only makes a busy worker stop sooner.
    if let Err(e) = app.ledger.cancel(id).await {
        tracing::warn!(run_id = %id, "cancel flag not set (the posted cancel still applies): {e}");
    }
    app.metrics().cancels_requested.inc();
    tracing::info!(run_id = %id, %by, %reason, "cancel requested");
    cancel_children(app, id, by).await;
    Ok(inbox_id)
}

// ----- issue 32, child runs: cancel, pause and resume cascade -----

/// The start of the reason of a pause a parent's operator pause passed on
/// to its children (`docs/child-runs.md`): a parent's resume resumes the
/// children paused so, and only them.
pub(crate) const PARENT_PAUSED: &str = "the parent run was paused";

/// The child runs of run `id`, newest first (at most 1,000).
pub(crate) async fn children_of(
    app: &App,
    id: Uuid,
) -> Result<Vec<RunSummary>, glia_backends::LogError> {
    let filter = glia_backends::RunFilter {
        parent: Some(id),
        limit: 1000,
        ..Default::default()
    };
    app.log.list_runs(&filter).await
}

/// The child runs of run `id` that are not done (at most 1,000).
pub(crate) async fn running_children(
    app: &App,
    id: Uuid,
) -> Result<Vec<RunSummary>, glia_backends::LogError> {
    Ok(children_of(app, id)
        .await?
        .into_iter()
        .filter(|r| r.status != RunStatus::Done)
        .collect())
}

type Cascade<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;

/// Cancel the running children of run `id` (each cascades to its own):
/// what cancelling a parent does after its own cancel is posted. Failures
/// are logged (a child left running ends on its own; its `child_ended` is
/// refused by the finished parent).
pub(crate) fn cancel_children<'a>(app: &'a App, id: Uuid, by: &'a str) -> Cascade<'a> {
    Box::pin(async move {
        let children = match running_children(app, id).await {
            Ok(children) => children,
            Err(e) => {
                tracing::warn!(run_id = %id, "children not cancelled: {e}");
                return;
            }
        };
        for child in children {
            let reason = format!("the parent run {id} was cancelled");
            if let Err(e) = cancel_run(app, child.run_id, &reason, by).await {
                tracing::warn!(run_id = %child.run_id, parent = %id, "child not cancelled: {e}");
            }
        }
    })
}

/// Pause the running children of run `id` (an operator pause, reason
/// starting [`PARENT_PAUSED`]; each cascades to its own).
pub(crate) fn pause_children<'a>(app: &'a App, id: Uuid, by: &'a str) -> Cascade<'a> {
    Box::pin(async move {
        let children = match running_children(app, id).await {
            Ok(children) => children,
            Err(e) => {
                tracing::warn!(run_id = %id, "children not paused: {e}");
                return;
            }
        };
        for child in children {
            let reason = format!("{PARENT_PAUSED} ({id})");
            if let Err(e) = pause_run(app, child.run_id, &reason, by).await {
                tracing::warn!(run_id = %child.run_id, parent = %id, "child not paused: {e}");
            }
        }
    })
}

/// Resume the children of run `id` that its pause paused (and theirs):
/// what resuming a parent does after its own resume is posted.
pub(crate) fn resume_children<'a>(app: &'a App, id: Uuid, by: &'a str) -> Cascade<'a> {
    Box::pin(async move {
        let children = match running_children(app, id).await {
            Ok(children) => children,
            Err(e) => {
                tracing::warn!(run_id = %id, "children not resumed: {e}");
                return;
            }
        };
        for child in children {
            match resume_paused_by(app, child.run_id, by, |r| r.starts_with(PARENT_PAUSED)).await {
                Ok(_) => resume_children(app, child.run_id, by).await,
                Err(e) => {
                    tracing::warn!(run_id = %child.run_id, parent = %id, "child not resumed: {e}")
                }
            }
        }
    })
}
