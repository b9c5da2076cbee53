//! Bad input never crashes a run: a tool returning invalid JSON, panicking,
//! timing out or failing, a model calling an unknown tool or passing invalid
//! arguments, an illegal transition, a stale or duplicate approval, a crash
//! between a tool call and its result. Each gives a typed error or an error
//! result the model sees, and the run stays resumable.

use crate::common;

use common::*;
use glia_agent::AgentError;
use glia_agent::provider::ScriptedTurn;
use glia_proto::{
    ContentBlock, Decision, Disposition, Event, EventKind, Outcome, Payload, PullPoint, RunConfig,
    RunState, Status, ToolErrorKind, TransitionError,
};
use serde_json::json;

/// The tool errors in `log`, in order.
fn tool_errors(log: &[Event]) -> Vec<(ToolErrorKind, String)> {
    log.iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolError { error, message, .. } => Some((*error, message.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn every_tool_failure_becomes_an_error_result_the_model_sees() {
    let script = vec![
        ScriptedTurn::calls(&[
            ("garbage", json!({})),
            ("crashy", json!({})),
            ("slow", json!({})),
            ("failing", json!({})),
            ("no_such_tool", json!({"x": 1})),
            ("add", json!({"a": "two", "b": 3})),
            ("add", json!({"a": 2})),
        ]),
        ScriptedTurn::text("Everything failed, sorry."),
    ];
    let (agent, provider) = agent(script);
    let mut log = Vec::new();
    let (state, status) = agent
        .run(run_id(), "try everything", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { .. })),
        "{status:?}"
    );
    let kinds: Vec<ToolErrorKind> = tool_errors(&log).into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        kinds,
        [
            ToolErrorKind::UnknownTool,
            ToolErrorKind::InvalidArguments,
            ToolErrorKind::InvalidArguments,
            ToolErrorKind::InvalidOutput,
            ToolErrorKind::Panicked,
            ToolErrorKind::Timeout,
            ToolErrorKind::Failed,
        ],
        "refusals are recorded as decided, executions in call order"
    );
    let messages: Vec<String> = tool_errors(&log).into_iter().map(|(_, m)| m).collect();
    assert!(
        messages[0].starts_with("Unknown tool \"no_such_tool\". Available tools:"),
        "{}",
        messages[0]
    );
    // Arguments the schema refuses are refused when the call is decided, before anything runs.
    assert!(
        messages[1].contains("\"two\" is not of type \"integer\""),
        "{}",
        messages[1]
    );
    assert!(
        messages[2].contains("\"b\" is a required property"),
        "{}",
        messages[2]
    );
    assert!(messages[3].contains("invalid JSON"), "{}", messages[3]);
    assert!(
        messages[4].contains("crashy crashed: index out of bounds"),
        "{}",
        messages[4]
    );
    assert!(
        messages[5].contains("timed out after 50 ms"),
        "{}",
        messages[5]
    );
    assert_eq!(messages[6], "database unavailable");

    // The model saw all seven as error results in one user turn, in call order.
    let second = &provider.requests()[1];
    let results = &second.messages.last().unwrap().content;
    assert_eq!(results.len(), 7);
    let ids: Vec<&str> = results
        .iter()
        .map(|b| match b {
            ContentBlock::ToolResult {
                tool_use_id,
                is_error: true,
                ..
            } => tool_use_id.as_str(),
            other => panic!("expected an error result, got {other:?}"),
        })
        .collect();
    assert_eq!(
        ids,
        [
            "call_1", "call_2", "call_3", "call_4", "call_5", "call_6", "call_7"
        ]
    );
    assert_replays(&log, &state);
}

#[tokio::test]
async fn illegal_transitions_are_typed_errors_and_change_nothing() {
    let (agent, _) = agent(vec![
        ScriptedTurn::call("refund", json!({"order": "A1", "amount": 30})),
        ScriptedTurn::text("ok"),
    ]);
    let mut log = Vec::new();
    let (mut state, status) = agent
        .run(run_id(), "refund", approval_config(), &mut log)
        .await
        .unwrap();
    assert!(matches!(
        status,
        Status::Parked(PullPoint::AwaitingApproval { .. })
    ));
    let before = state.clone();
    let len = log.len();

    // An approval on other arguments than the ones pending.
    let stale = Payload::Approval {
        call_id: "call_1".into(),
        args_hash: glia_proto::args_hash(&json!({"order": "A1", "amount": 3})),
        decision: Decision::Approve,
        by: None,
        request_seq: None,
    };
    let err = agent
        .advance(&mut state, Some(stale), &mut log)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            AgentError::Transition(TransitionError::ArgsMismatch { .. })
        ),
        "{err:?}"
    );
    // An approval for a call that does not exist.
    let unknown = Payload::Approval {
        call_id: "call_9".into(),
        args_hash: String::new(),
        decision: Decision::Approve,
        by: None,
        request_seq: None,
    };
    let err = agent
        .advance(&mut state, Some(unknown), &mut log)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            AgentError::Transition(TransitionError::UnknownCall { .. })
        ),
        "{err:?}"
    );
    // A user message while the run waits for an approval.
    let err = agent
        .advance(
            &mut state,
            Some(Payload::Input {
                text: "hello?".into(),
                redactions: Vec::new(),
            }),
            &mut log,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::InvalidResume(_)), "{err:?}");
    // A tool result for a call that is not external.
    let err = agent
        .advance(
            &mut state,
            Some(Payload::ToolResult {
                call_id: "call_1".into(),
                content: "done".into(),
                is_error: false,
            }),
            &mut log,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::InvalidResume(_)), "{err:?}");
    // Resuming a run that is not paused.
    let err = agent
        .advance(&mut state, Some(Payload::Resume { by: None }), &mut log)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            AgentError::Transition(TransitionError::Illegal {
                event: "session.resume",
                ..
            })
        ),
        "{err:?}"
    );

    assert_eq!(state, before, "refused payloads leave the state unchanged");
    assert_eq!(log.len(), len, "and record nothing");

    // The run is still resumable: the right decision goes through, a second one is refused.
    let call = state.call("call_1").unwrap().clone();
    let approve = Payload::Approval {
        call_id: call.call_id.clone(),
        args_hash: call.args_hash.clone(),
        decision: Decision::Approve,
        by: None,
        request_seq: None,
    };
    let status = agent
        .advance(&mut state, Some(approve.clone()), &mut log)
        .await
        .unwrap();
    assert!(matches!(status, Status::Done(Outcome::Succeeded { .. })));
    let err = agent
        .advance(&mut state, Some(approve), &mut log)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            AgentError::Transition(TransitionError::Finished { .. })
        ),
        "{err:?}"
    );
    assert_replays(&log, &state);
}

#[test]
fn transition_rejects_out_of_order_and_foreign_events() {
    let start = Event {
        run_id: run_id(),
        seq: 1,
        at: epoch(),
        kind: EventKind::SessionStart {
            redactions: Vec::new(),
            goal: "g".into(),
            config: RunConfig::default(),
        },
    };
    let mut state = RunState::replay(run_id(), std::slice::from_ref(&start)).unwrap();
    let dup = start.clone();
    assert_eq!(
        state.apply(&dup),
        Err(TransitionError::OutOfOrder {
            expected: 2,
            got: 1
        })
    );
    let foreign = Event {
        run_id: uuid::Uuid::nil(),
        seq: 2,
        ..start.clone()
    };
    assert!(matches!(
        state.apply(&foreign),
        Err(TransitionError::WrongRun { .. })
    ));
    let early_answer = Event {
        seq: 2,
        kind: EventKind::StepEnd {
            index: 0,
            answer: "x".into(),
            skipped: false,
        },
        ..start.clone()
    };
    assert!(matches!(
        state.apply(&early_answer),
        Err(TransitionError::Illegal {
            event: "step.end",
            ..
        })
    ));
    let restart = Event { seq: 2, ..start };
    assert!(matches!(
        state.apply(&restart),
        Err(TransitionError::Illegal {
            event: "session.start",
            ..
        })
    ));
    assert_eq!(state.head_seq, 1);
}

/// A worker died after `tool.call` was durable but before the result: cut the
/// log there and advance from a state rebuilt from the cut log.
async fn crash_after_tool_call(tool: &str, input: serde_json::Value) -> (Vec<Event>, RunState) {
    let script = vec![ScriptedTurn::call(tool, input), ScriptedTurn::text("done")];
    let (agent, _) = agent(script.clone());
    let mut full = Vec::new();
    agent
        .run(run_id(), "go", RunConfig::default(), &mut full)
        .await
        .unwrap();
    let cut = full
        .iter()
        .position(|e| matches!(e.kind, EventKind::ToolCall(_)))
        .unwrap()
        + 1;
    let mut log = full[..cut].to_vec();
    let mut state = RunState::replay(run_id(), &log).unwrap();
    assert!(matches!(
        state.call("call_1").unwrap().disposition,
        Some(Disposition::Run { .. })
    ));
    let (fresh, _) = agent_at(script, served(&log));
    let status = fresh.advance(&mut state, None, &mut log).await.unwrap();
    assert!(matches!(status, Status::Done(Outcome::Succeeded { .. })));
    assert_replays(&log, &state);
    (log, state)
}

#[tokio::test]
async fn interrupted_idempotent_call_is_run_again_with_the_same_key() {
    let (log, _) = crash_after_tool_call("add", json!({"a": 1, "b": 2})).await;
    let result = log.iter().find_map(|e| match &e.kind {
        EventKind::ToolResult {
            call_id, content, ..
        } => Some((call_id.clone(), content.clone())),
        _ => None,
    });
    assert_eq!(result, Some(("call_1".into(), "{\"sum\":3}".into())));
}

#[tokio::test]
async fn interrupted_non_idempotent_call_gets_outcome_unknown() {
    let (log, _) = crash_after_tool_call("refund", json!({"order": "A1", "amount": 5})).await;
    let errors = tool_errors(&log);
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].0, ToolErrorKind::OutcomeUnknown);
    assert!(glia_proto::marker::is_machine_text(&errors[0].1));
    assert!(
        !names(&log).contains(&"tool.result"),
        "a non-idempotent call is never re-run"
    );
}

#[tokio::test]
async fn script_exhaustion_fails_the_run_with_a_clear_error() {
    let (agent, _) = agent(vec![]);
    let mut log = Vec::new();
    let (_, status) = agent
        .run(run_id(), "go", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert_eq!(
        status,
        Status::Done(Outcome::Failed {
            error: "model call failed: script exhausted after 0 responses".into()
        })
    );
}

#[tokio::test]
async fn transient_provider_failure_leaves_the_run_runnable() {
    let script = vec![
        ScriptedTurn {
            error: Some("transient".into()),
            ..Default::default()
        },
        ScriptedTurn::text("ok now"),
    ];
    let (agent, _) = agent(script);
    let mut log = Vec::new();
    let mut state = agent
        .start(run_id(), "go", RunConfig::default(), &mut log)
        .await
        .unwrap();
    let err = agent.advance(&mut state, None, &mut log).await.unwrap_err();
    assert!(matches!(err, AgentError::Provider(_)), "{err:?}");
    assert_eq!(state.status(), Status::Runnable);
    let status = agent.advance(&mut state, None, &mut log).await.unwrap();
    assert_eq!(
        status,
        Status::Done(Outcome::Succeeded {
            answer: "ok now".into(),
            output: None
        })
    );
    assert_replays(&log, &state);
}

#[tokio::test]
async fn spend_cap_pauses_the_run() {
    let script = vec![
        ScriptedTurn {
            error: Some("spend_cap".into()),
            ..Default::default()
        },
        ScriptedTurn::text("ok"),
    ];
    let (agent, _) = agent(script);
    let mut log = Vec::new();
    let (mut state, status) = agent
        .run(run_id(), "go", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert!(
        matches!(status, Status::Parked(PullPoint::Paused { .. })),
        "{status:?}"
    );
    let status = agent
        .advance(&mut state, Some(Payload::Resume { by: None }), &mut log)
        .await
        .unwrap();
    assert!(matches!(status, Status::Done(Outcome::Succeeded { .. })));
}

#[tokio::test]
async fn invalid_config_is_refused_before_anything_is_recorded() {
    let (agent, _) = agent(vec![]);
    let mut log = Vec::new();
    let bad_policy = RunConfig {
        policies: vec![glia_proto::Policy {
            tool: "*".into(),
            args: Some("(unclosed".into()),
            action: glia_proto::PolicyAction::Allow,
        }],
        ..RunConfig::default()
    };
    let err = agent
        .start(run_id(), "go", bad_policy, &mut log)
        .await
        .unwrap_err();
    assert!(
        matches!(err, AgentError::Config(ref m) if m.contains("policies[0].args: not a valid regex")),
        "{err:?}"
    );
    let unknown_tool = RunConfig {
        tools: Some(vec!["nope".into()]),
        ..RunConfig::default()
    };
    assert!(matches!(
        agent.start(run_id(), "go", unknown_tool, &mut log).await,
        Err(AgentError::Config(_))
    ));
    assert!(log.is_empty());
}

/// An agent that resumes a run from `log` (the script served so far), with
/// the refund tool's executions counted.
fn resumed(
    script: &[ScriptedTurn],
    log: &[Event],
) -> (
    glia_agent::Agent,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    let refunds = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let provider = std::sync::Arc::new(
        glia_agent::provider::ScriptedProvider::new(script.to_vec()).starting_at(served(log)),
    );
    let agent = glia_agent::Agent::new(provider)
        .with_tools(tools(refunds.clone()))
        .with_clock(glia_agent::FixedClock(epoch()));
    (agent, refunds)
}

/// With `on_interrupted_call: require_approval`, an interrupted
/// non-idempotent call waits for a person: approved, it runs again (once);
/// rejected, the model sees `outcome_unknown`; a decision on the request
/// made before the crash is refused.
#[tokio::test]
async fn interrupted_non_idempotent_call_asks_a_person_by_policy() {
    let config = RunConfig {
        on_interrupted_call: glia_proto::InterruptedCall::RequireApproval,
        ..RunConfig::default()
    };
    let script = vec![
        ScriptedTurn::call("refund", json!({"order": "A1", "amount": 5})),
        ScriptedTurn::text("done"),
    ];
    for approve in [true, false] {
        let (agent, _) = agent(script.clone());
        let mut full = Vec::new();
        agent
            .run(run_id(), "go", config.clone(), &mut full)
            .await
            .unwrap();
        let cut = full
            .iter()
            .position(|e| matches!(e.kind, EventKind::ToolCall(_)))
            .unwrap()
            + 1;
        let mut log = full[..cut].to_vec();
        let mut state = RunState::replay(run_id(), &log).unwrap();
        let (fresh, refunds) = resumed(&script, &log);
        let status = fresh.advance(&mut state, None, &mut log).await.unwrap();
        assert_eq!(
            status,
            Status::Parked(PullPoint::AwaitingApproval {
                call_ids: vec!["call_1".into()]
            })
        );
        assert!(log.iter().any(|e| matches!(
            &e.kind,
            EventKind::ApprovalRequested {
                interrupted: true,
                ..
            }
        )));
        assert_eq!(
            refunds.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "nothing runs before the person's word"
        );
        let call = state.call("call_1").unwrap().clone();
        assert!(call.interrupted);
        let stale = Payload::Approval {
            call_id: "call_1".into(),
            args_hash: call.args_hash.clone(),
            decision: Decision::Approve,
            by: None,
            request_seq: Some(1),
        };
        assert!(matches!(
            fresh.advance(&mut state, Some(stale), &mut log).await,
            Err(glia_agent::AgentError::InvalidResume(_))
        ));
        let decision = if approve {
            Decision::Approve
        } else {
            Decision::Reject {
                reason: "the refund went through".into(),
            }
        };
        let resume = Payload::Approval {
            call_id: "call_1".into(),
            args_hash: call.args_hash,
            decision,
            by: None,
            request_seq: call.requested_seq,
        };
        let status = fresh
            .advance(&mut state, Some(resume), &mut log)
            .await
            .unwrap();
        assert!(
            matches!(status, Status::Done(Outcome::Succeeded { .. })),
            "{status:?}"
        );
        assert_replays(&log, &state);
        if approve {
            assert_eq!(
                refunds.load(std::sync::atomic::Ordering::SeqCst),
                1,
                "run again once"
            );
            assert!(tool_errors(&log).is_empty());
        } else {
            assert_eq!(refunds.load(std::sync::atomic::Ordering::SeqCst), 0);
            let errors = tool_errors(&log);
            assert_eq!(errors.len(), 1);
            assert_eq!(errors[0].0, ToolErrorKind::OutcomeUnknown);
            assert!(
                errors[0].1.contains("the refund went through"),
                "{}",
                errors[0].1
            );
            // A crash right after the rejection was recorded: the recovery
            // still reports an unknown outcome, not a plain rejection.
            let cut = log
                .iter()
                .rposition(|e| matches!(e.kind, EventKind::ApprovalResolved { .. }))
                .unwrap()
                + 1;
            let mut again = log[..cut].to_vec();
            let mut state = RunState::replay(run_id(), &again).unwrap();
            let provider = std::sync::Arc::new(
                glia_agent::provider::ScriptedProvider::new(script.clone())
                    .starting_at(served(&again)),
            );
            let fresh = glia_agent::Agent::new(provider)
                .with_tools(tools(refunds.clone()))
                .with_clock(glia_agent::FixedClock(epoch()));
            fresh.advance(&mut state, None, &mut again).await.unwrap();
            assert_eq!(tool_errors(&again)[0].0, ToolErrorKind::OutcomeUnknown);
            assert_eq!(refunds.load(std::sync::atomic::Ordering::SeqCst), 0);
        }
    }
}

/// A sink over a log whose store answers every key with `held`; it counts
/// commits and keeps the keys marked running.
#[derive(Default)]
struct Answering {
    log: Vec<Event>,
    held: Option<glia_proto::Held>,
    commits: usize,
    marked: std::sync::Mutex<Vec<String>>,
}

#[glia_agent::async_trait]
impl glia_agent::agent::EventSink for Answering {
    async fn record(&mut self, event: &Event) -> Result<(), glia_agent::agent::SinkError> {
        self.log.push(event.clone());
        Ok(())
    }
    async fn commit(&mut self, _state: &RunState) -> Result<(), glia_agent::agent::SinkError> {
        self.commits += 1;
        Ok(())
    }
    async fn mark_running(&self, keys: &[String]) -> Result<(), glia_agent::agent::SinkError> {
        self.marked.lock().unwrap().extend_from_slice(keys);
        Ok(())
    }
    async fn held(
        &mut self,
        _key: &str,
    ) -> Result<Option<glia_proto::Held>, glia_agent::agent::SinkError> {
        Ok(self.held.clone())
    }
}

/// A call cleared to run and without a result that is still marked running
/// elsewhere is neither given `outcome_unknown` nor put to a person, by
/// either policy: the advance stops with `CallRunning` and records and
/// commits nothing. The worker that ran it marked it before the commit that
/// cleared it.
#[tokio::test]
async fn a_call_still_running_elsewhere_is_neither_interrupted_nor_put_to_a_person() {
    let script = vec![
        ScriptedTurn::call("refund", json!({"order": "A1", "amount": 5})),
        ScriptedTurn::text("done"),
    ];
    for on_interrupted_call in [
        glia_proto::InterruptedCall::OutcomeUnknown,
        glia_proto::InterruptedCall::RequireApproval,
    ] {
        let config = RunConfig {
            on_interrupted_call,
            ..RunConfig::default()
        };
        let (agent, _) = agent(script.clone());
        let mut first = Answering::default();
        agent.run(run_id(), "go", config, &mut first).await.unwrap();
        let call = first
            .log
            .iter()
            .position(|e| matches!(e.kind, EventKind::ToolCall(_)))
            .unwrap();
        let key = format!("{}:1:call_1", run_id());
        assert_eq!(
            first.marked.lock().unwrap().first(),
            Some(&key),
            "marked under its idempotency key"
        );
        // Cut after `tool.call`: the worker lost the lease while it ran.
        let cut = first.log[..=call].to_vec();
        let mut state = RunState::replay(run_id(), &cut).unwrap();
        let (fresh, _) = agent_at(script.clone(), served(&cut));
        let mut next = Answering {
            log: cut.clone(),
            held: Some(glia_proto::Held::Running),
            ..Answering::default()
        };
        let err = fresh
            .advance(&mut state, None, &mut next)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, AgentError::CallRunning(c) if c == "call_1"),
            "{err:?}"
        );
        assert_eq!(next.log, cut, "nothing recorded: {:?}", names(&next.log));
        assert_eq!(next.commits, 0, "nothing committed");
    }
}

/// A person approves running an interrupted call again, but its first run
/// has returned and been held since they were asked (a late hold): the held
/// result is recovered and the tool does not run a second time; still
/// running, the advance waits (`CallRunning`) instead of running it.
#[tokio::test]
async fn a_reapproved_call_whose_first_run_was_held_meanwhile_is_recovered_not_run_again() {
    let config = RunConfig {
        on_interrupted_call: glia_proto::InterruptedCall::RequireApproval,
        ..RunConfig::default()
    };
    let script = vec![
        ScriptedTurn::call("refund", json!({"order": "A1", "amount": 5})),
        ScriptedTurn::text("done"),
    ];
    let (agent, _) = agent(script.clone());
    let mut full = Vec::new();
    agent.run(run_id(), "go", config, &mut full).await.unwrap();
    let cut = full
        .iter()
        .position(|e| matches!(e.kind, EventKind::ToolCall(_)))
        .unwrap()
        + 1;
    let late = glia_proto::HeldResult {
        call_id: "call_1".into(),
        content: "{\"refunded\":\"A1\",\"late\":true}".into(),
        error: None,
        duration_ms: 7,
    };
    for (held, recovered) in [
        (Some(glia_proto::Held::Finished(late.clone())), true),
        (Some(glia_proto::Held::Running), false),
    ] {
        let mut log = full[..cut].to_vec();
        let mut state = RunState::replay(run_id(), &log).unwrap();
        let (fresh, refunds) = resumed(&script, &log);
        // Asked while nothing was held or marked.
        let status = fresh.advance(&mut state, None, &mut log).await.unwrap();
        assert!(
            matches!(status, Status::Parked(PullPoint::AwaitingApproval { .. })),
            "{status:?}"
        );
        let call = state.call("call_1").unwrap().clone();
        assert!(call.interrupted);
        let approve = Payload::Approval {
            call_id: "call_1".into(),
            args_hash: call.args_hash,
            decision: Decision::Approve,
            by: None,
            request_seq: None,
        };
        let mut sink = Answering {
            log,
            held,
            ..Answering::default()
        };
        let result = fresh.advance(&mut state, Some(approve), &mut sink).await;
        assert_eq!(
            refunds.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "the approved call does not run a second time"
        );
        if recovered {
            assert!(
                matches!(result, Ok(Status::Done(Outcome::Succeeded { .. }))),
                "{result:?}"
            );
            let kinds = names(&sink.log);
            assert!(kinds.contains(&"tool.recovered"), "{kinds:?}");
            let content = sink.log.iter().find_map(|e| match &e.kind {
                EventKind::ToolResult { content, .. } => Some(content.to_text().into_owned()),
                _ => None,
            });
            assert_eq!(
                content.as_deref(),
                Some("{\"refunded\":\"A1\",\"late\":true}")
            );
            assert_replays(&sink.log, &state);
        } else {
            assert!(
                matches!(&result, Err(AgentError::CallRunning(c)) if c == "call_1"),
                "{result:?}"
            );
        }
    }
}
