//! Issue 32, child runs: the dispatcher's children loop
//! (`docs/child-runs.md`).
//!
//! A run whose model called agent tools parks at `awaiting_children`. This
//! loop finds such parents ([`sweep_once`], every [`SWEEP_EVERY`]) and,
//! for each call of an agent tool without a result:
//!
//! - with no child yet, admits the child run: same tenant, linked
//!   (`parent_run_id`, `parent_call_id`, `depth`), its config the agent
//!   version frozen at the parent's admission, its budget the agent's
//!   bounded by the parent's remainder, under the per-tenant idempotency
//!   key [`glia_proto::children::child_key`] of the call, so however many
//!   dispatchers sweep and however often, a call starts one child;
//! - when the child cannot start (past [`glia_proto::MAX_CHILD_DEPTH`],
//!   the agent no longer available to the tenant, a goal its guardrails
//!   refuse), posts `child_ended` with a failure and no child run;
//! - when the child is done, posts `child_ended` with its outcome, usage
//!   and cost; the posting rule's dedupe key (call and child) takes it
//!   once, and the worker records `child.ended`;
//! - when the child is parked at `paused` by its budget (the parent's
//!   remainder, or its own, is spent), cancels it: nobody extends a
//!   child's budget, and its parent gets the failure as a tool error.
//!
//! Every 5 s it also cancels the children of parents that are done
//! ([`cancel_stranded`]): a cancel's cascade cut short by a crash, or a
//! child admitted while its parent's cancel waited, ends all the same.
//!
//! Everything it acts on is read from the store each pass, so a dispatcher
//! that dies between a child's end and the post leaves nothing lost: the
//! next pass (of any dispatcher) posts it. The loop writes no event: it
//! admits (a child's `session.start`) and posts.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;
use glia_backends::{NewRun, RunFilter, RunStatus, RunSummary};
use glia_proto::children::{self, ChildCall};
use glia_proto::{
    AgentDefinition, AgentRef, Disposition, Event, EventKind, Outcome, PauseReason, Payload,
    PullPoint, RunState, Usage,
};
use uuid::Uuid;

use crate::admission::{catalogue_check, resolve_children, screen_input};
use crate::app::App;
use crate::control::{cancel_run, post};
use crate::error::ApiError;

/// How often the loop looks for parents waiting for children: at most this
/// long between a child's end and its `child_ended` post (plus the job's
/// way to a worker).
pub const SWEEP_EVERY: Duration = Duration::from_millis(250);

/// The metadata key under which a child run carries its call's child key
/// ([`children::child_key`]), so a parent's call finds its own child even
/// when a later model turn reuses the call id.
pub const CHILD_KEY_META: &str = "glia.child_key";

/// Who the loop posts and cancels as.
const BY: &str = "glia-children";

/// How many [`SWEEP_EVERY`] passes between two looks for stranded
/// children ([`cancel_stranded`]): every 5 s.
const STRANDED_EVERY_PASSES: u32 = 20;

/// The children loop: [`sweep_once`] every [`SWEEP_EVERY`], and
/// [`cancel_stranded`] every 5 s, for ever.
pub async fn children(app: App) {
    let mut pass: u32 = 0;
    loop {
        if let Err(e) = sweep_once(&app).await {
            tracing::warn!("children sweep failed: {e}");
        }
        if pass.is_multiple_of(STRANDED_EVERY_PASSES)
            && let Err(e) = cancel_stranded(&app).await
        {
            tracing::warn!("stranded children not cancelled: {e}");
        }
        pass = pass.wrapping_add(1);
        tokio::time::sleep(SWEEP_EVERY).await;
    }
}

/// Cancel the children a done parent left behind
/// ([`glia_backends::RunLog::stranded_children`]: its cancel's cascade
/// was cut short by a crash, or a child was admitted while the parent's
/// cancel waited to be applied), at most 1,000 a pass; each cancel
/// cascades to the child's own children. No child outlives its parent.
/// Answers how many cancels it posted. Errors: the store
/// failed (a child whose cancel fails is logged and skipped).
pub async fn cancel_stranded(app: &App) -> Result<usize, ApiError> {
    let stranded = app.log.stranded_children(1000).await?;
    let mut cancelled = 0;
    for (child, parent) in stranded {
        // (A child whose cancel waits for a worker is not listed: nothing
        // is posted twice.)
        let reason = format!("the parent run {parent} ended");
        match cancel_run(app, child, &reason, BY).await {
            Ok(_) => cancelled += 1,
            Err(e) => tracing::warn!(run_id = %child, "stranded child not cancelled: {e}"),
        }
    }
    Ok(cancelled)
}

/// One pass over every parent parked at `awaiting_children` (at most
/// 1,000 a pass, oldest first is not promised). Answers how many children
/// it started, ended or cancelled. Errors: the listing failed (a parent
/// whose own handling fails is logged and skipped).
pub async fn sweep_once(app: &App) -> Result<usize, ApiError> {
    let parents = app
        .log
        .list_runs(&RunFilter {
            pull_point: Some("awaiting_children".into()),
            limit: 1000,
            ..Default::default()
        })
        .await?;
    let mut acted = 0;
    for parent in parents {
        match tend(app, &parent).await {
            Ok(n) => acted += n,
            Err(e) => tracing::warn!(run_id = %parent.run_id, "children of run not tended: {e}"),
        }
    }
    Ok(acted)
}

/// Start, end or stop the children of `parent` as its state asks.
async fn tend(app: &App, parent: &RunSummary) -> Result<usize, ApiError> {
    let state = app.log.load(parent.run_id).await?;
    let waiting: Vec<(String, ChildCall)> = state
        .pending_calls
        .iter()
        .filter(|c| c.result.is_none() && c.disposition == Some(Disposition::Child))
        .filter_map(|c| c.child.clone().map(|child| (c.call_id.clone(), child)))
        .collect();
    if waiting.is_empty() || state.outcome.is_some() {
        return Ok(0);
    }
    let posted: Vec<String> = app
        .log
        .inbox(parent.run_id)
        .await?
        .into_iter()
        .filter_map(|i| match i.payload {
            Payload::ChildEnded { call_id, .. } => Some(call_id),
            _ => None,
        })
        .collect();
    let known = app
        .log
        .list_runs(&RunFilter {
            parent: Some(parent.run_id),
            limit: 1000,
            ..Default::default()
        })
        .await?;
    let mut acted = 0;
    for (call_id, call) in waiting {
        if posted.contains(&call_id) {
            continue;
        }
        let key = children::child_key(&call.key);
        let child = known
            .iter()
            .find(|c| c.metadata.get(CHILD_KEY_META) == Some(&key));
        let ended = match child {
            Some(c) if c.status == RunStatus::Done => Some(Payload::ChildEnded {
                call_id: call_id.clone(),
                child_run_id: Some(c.run_id),
                outcome: c.outcome.clone().unwrap_or(Outcome::Failed {
                    error: "the child run ended without an outcome".into(),
                }),
                usage: c.usage.tokens,
                cost_usd_micros: c.usage.cost_usd_micros,
            }),
            Some(c) => {
                if let Some(PullPoint::Paused {
                    reason: PauseReason::Budget { limit },
                }) = &c.pull_point
                {
                    let reason = format!(
                        "its budget ({limit:?}), bounded by its parent's remaining budget, is spent"
                    );
                    cancel_run(app, c.run_id, &reason, BY).await?;
                    acted += 1;
                }
                None
            }
            None => match start(app, parent, &state, &call_id, &call, &key).await {
                Ok(_) => {
                    acted += 1;
                    None
                }
                Err(refusal) => Some(Payload::ChildEnded {
                    call_id: call_id.clone(),
                    child_run_id: None,
                    outcome: Outcome::Failed { error: refusal },
                    usage: Usage::default(),
                    cost_usd_micros: 0,
                }),
            },
        };
        if let Some(payload) = ended {
            match post(app, parent.run_id, payload).await {
                Ok(_) => acted += 1,
                // Taken already (another dispatcher), or the parent ended.
                Err(glia_backends::LogError::Duplicate { .. })
                | Err(glia_backends::LogError::Finished(_))
                | Err(glia_backends::LogError::Cancelled(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(acted)
}

/// Admit the child run of `call` (idempotent by `key`): answers its id, or
/// why it cannot start, as the text the parent's model sees.
async fn start(
    app: &App,
    parent: &RunSummary,
    state: &RunState,
    call_id: &str,
    call: &ChildCall,
    key: &str,
) -> Result<Uuid, String> {
    let depth = parent.depth.saturating_add(1);
    if depth > glia_proto::MAX_CHILD_DEPTH {
        return Err(format!(
            "Not started: the agent {} would run at depth {depth}, past the limit of {} nested agent calls.",
            call.agent,
            glia_proto::MAX_CHILD_DEPTH
        ));
    }
    let unavailable = |why: String| format!("Not started: the agent {} {why}.", call.agent);
    let (name, version) = children::parse_agent_ref(&call.agent).map_err(unavailable)?;
    let found = app
        .log
        .get_agent(&parent.tenant, name, version)
        .await
        .map_err(|e| unavailable(format!("could not be read from the registry ({e})")))?
        .ok_or_else(|| unavailable("is not registered for this tenant".into()))?;
    if found.content_hash != call.content_hash {
        return Err(unavailable(format!(
            "changed since the run was admitted (hash {}, admitted {})",
            found.content_hash, call.content_hash
        )));
    }
    let def: AgentDefinition = glia_proto::strict::from_json_str(&found.definition)
        .map_err(|e| unavailable(format!("has a definition that does not parse ({e})")))?;
    let mut config = def.resolve(Some(AgentRef {
        name: found.name.clone(),
        version: found.version,
        content_hash: found.content_hash.clone(),
    }));
    config.budget = children::bounded(
        &config.budget,
        &children::remaining(&state.limits, &state.usage),
    );
    let refused = |e: ApiError| unavailable(format!("cannot start: {e}"));
    config
        .validate()
        .map_err(|e| unavailable(format!("has an invalid config ({}: {})", e.field, e.reason)))?;
    catalogue_check(app, &config).map_err(refused)?;
    resolve_children(app, &parent.tenant, &mut config, "agents.")
        .await
        .map_err(refused)?;
    if call.goal.trim().is_empty() {
        return Err("Not started: the goal is blank.".into());
    }
    let (goal, redactions) = screen_input(&config, "goal", &call.goal).map_err(refused)?;
    let run_id = Uuid::now_v7();
    let start = Event {
        run_id,
        seq: 1,
        at: Utc::now(),
        kind: EventKind::SessionStart {
            goal,
            config,
            redactions,
        },
    };
    RunState::new(run_id)
        .apply(&start)
        .map_err(|e| unavailable(format!("cannot start: {e}")))?;
    let new = NewRun {
        tenant: parent.tenant.clone(),
        idempotency_key: Some(key.to_owned()),
        batch_id: None,
        start,
        tags: Vec::new(),
        metadata: BTreeMap::from([(CHILD_KEY_META.to_owned(), key.to_owned())]),
        custom_id: None,
        parent_run_id: Some(parent.run_id),
        parent_call_id: Some(call_id.to_owned()),
        depth,
    };
    match app.log.create_run(new).await {
        Ok((run, created)) => {
            if created {
                app.metrics().runs_admitted.inc();
                app.wake_relay();
                tracing::info!(run_id = %run.run_id, parent = %parent.run_id, call_id, agent = %call.agent, "child run started");
            }
            Ok(run.run_id)
        }
        // A store that fails now is asked again next pass: not a refusal.
        Err(e) => {
            tracing::warn!(parent = %parent.run_id, call_id, "child run not admitted: {e}");
            Ok(Uuid::nil())
        }
    }
}
