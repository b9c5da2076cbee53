//! Stop reasons are outcomes: an answer cut off by the output limit, an
//! empty answer, a refusal, a content filter, a full context window or a
//! stop reason glia does not know never completes a run as succeeded. The
//! run's stop policy re-asks, pauses or fails it, the log says which, a cut
//! tool call never runs, and the metrics count each class and action.

use crate::common;
use crate::observed;

use std::sync::Arc;

use common::run_id;
use glia_agent::provider::ScriptedTurn;
use glia_proto::{
    Event, EventKind, Outcome, PauseReason, Payload, PullPoint, RejectedAnswer, RunConfig,
    RunState, Status, StopAction, StopClass, StopPolicy,
};
use glia_worker::metrics::{RunObserver, WorkerMetrics};
use observed::Observed;
use serde_json::json;

/// Every bad stop, as a scripted answer, with its class.
fn bad_stops() -> Vec<(ScriptedTurn, StopClass)> {
    let stop = |turn: ScriptedTurn, reason: &str| ScriptedTurn {
        stop_reason: Some(reason.into()),
        ..turn
    };
    vec![
        // A tool call cut off by the output cap (its arguments may be incomplete).
        (
            stop(ScriptedTurn::call("add", json!({"a": 2})), "max_tokens"),
            StopClass::Truncated,
        ),
        (
            stop(ScriptedTurn::text("The answer is par"), "max_tokens"),
            StopClass::Truncated,
        ),
        (
            stop(ScriptedTurn::text("Still searching"), "pause_turn"),
            StopClass::Truncated,
        ),
        (stop(ScriptedTurn::text(""), "end_turn"), StopClass::Empty),
        (
            stop(ScriptedTurn::text("I can't help with that."), "refusal"),
            StopClass::Refusal,
        ),
        (
            stop(ScriptedTurn::text(""), "content_filter"),
            StopClass::ContentFilter,
        ),
        (
            stop(ScriptedTurn::text(""), "model_context_window_exceeded"),
            StopClass::ContextWindow,
        ),
        (
            stop(ScriptedTurn::text("4"), "eos_token"),
            StopClass::Unknown,
        ),
    ]
}

fn policy(action: StopAction) -> StopPolicy {
    StopPolicy {
        truncated: action,
        empty: action,
        refusal: action,
        content_filter: action,
        context_window: action,
        unknown: action,
    }
}

fn rejections(log: &[Event]) -> Vec<RejectedAnswer> {
    log.iter()
        .filter_map(|e| match &e.kind {
            EventKind::ModelResponse {
                rejected: Some(r), ..
            } => Some(r.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn no_bad_stop_completes_a_run_as_succeeded_under_any_policy() {
    for (turn, class) in bad_stops() {
        for action in [StopAction::Reask, StopAction::Pause, StopAction::Fail] {
            // The model keeps stopping the same way.
            let (agent, _) =
                common::agent(vec![turn.clone(), turn.clone(), turn.clone(), turn.clone()]);
            let config = RunConfig {
                stop_reasons: policy(action),
                ..RunConfig::default()
            };
            let mut log = Vec::new();
            let (state, status) = agent
                .run(run_id(), "add 2 and 2", config, &mut log)
                .await
                .unwrap();
            let what = format!("{class:?} under {action:?}: {status:?}");
            assert!(
                !matches!(status, Status::Done(Outcome::Succeeded { .. })),
                "{what}"
            );
            match action {
                StopAction::Pause => {
                    let Status::Parked(PullPoint::Paused {
                        reason: PauseReason::ModelStop { stop_reason },
                    }) = &status
                    else {
                        panic!("{what}")
                    };
                    assert_eq!(
                        Some(stop_reason.as_str()),
                        turn.stop_reason.as_deref(),
                        "{what}"
                    );
                }
                // A re-ask is bounded by max_reasks, then fails.
                StopAction::Reask | StopAction::Fail => {
                    let Status::Done(Outcome::Failed { error }) = &status else {
                        panic!("{what}")
                    };
                    assert!(error.contains(class.describe()), "{what}");
                }
            }
            let rejected = rejections(&log);
            assert!(
                rejected.iter().all(|r| r.class == class),
                "{what}: {rejected:?}"
            );
            if action == StopAction::Reask {
                assert_eq!(
                    rejected.len(),
                    3,
                    "two re-asks, then the third bad stop fails: {what}"
                );
                assert_eq!(
                    rejected.iter().map(|r| r.action).collect::<Vec<_>>(),
                    [StopAction::Reask, StopAction::Reask, StopAction::Fail]
                );
            }
            // A rejected answer's tool calls never run; the log replays to the same state.
            assert!(
                !log.iter().any(|e| matches!(e.kind, EventKind::ToolCall(_))),
                "{what}"
            );
            assert!(
                state
                    .messages
                    .iter()
                    .all(|m| m.role == glia_proto::Role::User),
                "{what}: nothing rejected joined the conversation"
            );
            assert_eq!(RunState::replay(run_id(), &log).unwrap(), state, "{what}");
        }
    }
}

#[tokio::test]
async fn a_truncated_tool_call_is_reasked_and_the_finished_answer_completes() {
    let cut = ScriptedTurn {
        stop_reason: Some("max_tokens".into()),
        ..ScriptedTurn::call("add", json!({"a": 2}))
    };
    let (agent, provider) = common::agent(vec![
        cut,
        ScriptedTurn::call("add", json!({"a": 2, "b": 2})),
        ScriptedTurn::text("4"),
    ]);
    let mut log = Vec::new();
    let (_, status) = agent
        .run(run_id(), "add 2 and 2", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert!(
        matches!(&status, Status::Done(Outcome::Succeeded { answer, .. }) if answer == "4"),
        "{status:?}"
    );
    // The cut call was never run; only the complete one was.
    let calls: Vec<_> = log
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCall(c) => Some(c.input.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(calls, vec![json!({"a": 2, "b": 2})]);
    // The second request tells the model why, and does not show it the cut answer.
    let second = &provider.requests()[1];
    let last = second.messages.last().unwrap();
    assert!(
        last.text().contains("⟦glia:re-ask⟧")
            && last.text().contains("cut off by the output limit"),
        "{}",
        last.text()
    );
    assert_eq!(
        second.messages.len(),
        1,
        "the cut answer is not part of the conversation"
    );
}

#[tokio::test]
async fn a_paused_stop_resumes_with_a_new_model_call() {
    let refused = ScriptedTurn {
        stop_reason: Some("refusal".into()),
        ..ScriptedTurn::text("I can't.")
    };
    let (agent, _) = common::agent(vec![refused, ScriptedTurn::text("Here it is.")]);
    let config = RunConfig {
        stop_reasons: StopPolicy {
            refusal: StopAction::Pause,
            ..StopPolicy::default()
        },
        ..RunConfig::default()
    };
    let mut log = Vec::new();
    let (mut state, status) = agent.run(run_id(), "help", config, &mut log).await.unwrap();
    assert_eq!(
        status,
        Status::Parked(PullPoint::Paused {
            reason: PauseReason::ModelStop {
                stop_reason: "refusal".into()
            }
        })
    );
    let status = agent
        .advance(
            &mut state,
            Some(Payload::Resume {
                by: Some("operator".into()),
            }),
            &mut log,
        )
        .await
        .unwrap();
    assert!(
        matches!(&status, Status::Done(Outcome::Succeeded { answer, .. }) if answer == "Here it is."),
        "{status:?}"
    );
}

#[test]
fn the_stop_policy_refuses_unknown_fields_and_has_safe_defaults() {
    let p: StopPolicy = serde_json::from_value(json!({"truncated": "pause"})).unwrap();
    assert_eq!(
        p,
        StopPolicy {
            truncated: StopAction::Pause,
            ..StopPolicy::default()
        }
    );
    assert!(
        serde_json::from_value::<StopPolicy>(json!({"refusal": "proceed"})).is_err(),
        "no class can be made to proceed"
    );
    assert!(serde_json::from_value::<StopPolicy>(json!({"truncation": "fail"})).is_err());
    let d = StopPolicy::default();
    assert_eq!(
        (
            d.truncated,
            d.empty,
            d.refusal,
            d.content_filter,
            d.context_window,
            d.unknown
        ),
        (
            StopAction::Reask,
            StopAction::Reask,
            StopAction::Fail,
            StopAction::Fail,
            StopAction::Fail,
            StopAction::Fail
        )
    );
}

#[tokio::test]
async fn metrics_say_why_the_model_stopped_and_what_the_loop_did() {
    let metrics = Arc::new(WorkerMetrics::new("scripted"));
    let cut = ScriptedTurn {
        stop_reason: Some("max_tokens".into()),
        ..ScriptedTurn::text("The answer is par")
    };
    let refused = ScriptedTurn {
        stop_reason: Some("refusal".into()),
        ..ScriptedTurn::text("No.")
    };
    let (agent, _) = common::agent(vec![cut, refused]);
    let id = run_id();
    let mut sink = Observed(RunObserver::new(Some(metrics.clone()), &RunState::new(id)));
    let config = RunConfig {
        model: "m1".into(),
        ..RunConfig::default()
    };
    let (_, status) = agent
        .run(id, "what is the answer", config, &mut sink)
        .await
        .unwrap();
    assert!(
        matches!(status, Status::Done(Outcome::Failed { .. })),
        "{status:?}"
    );
    let text = metrics.encode();
    let has = |series: &str| {
        text.lines()
            .any(|l| l.strip_prefix(series).is_some_and(|v| v.trim() == "1"))
    };
    assert!(
        has(
            r#"glia_worker_model_stops_total{provider="scripted",model="m1",stop="truncated",action="reask"}"#
        ),
        "{text}"
    );
    assert!(
        has(
            r#"glia_worker_model_stops_total{provider="scripted",model="m1",stop="refusal",action="fail"}"#
        ),
        "{text}"
    );
    assert!(
        has(r#"glia_worker_runs_completed_total{outcome="failed"}"#),
        "{text}"
    );
}
