//! Issue 32: the built-in waits in the loop. `sleep` parks at
//! `awaiting_timer`, a wake resumes it with when it woke; `wait_for_event`
//! parks at `awaiting_event` and gets the event's payload, or a timeout
//! result; bad arguments are tool errors the model sees; a run resumed from
//! its JSON checkpoint writes the same log as one that never stopped.

use crate::common;

use common::*;
use glia_agent::AgentError;
use glia_agent::provider::ScriptedTurn;
use glia_proto::{
    ArrivedEvent, Disposition, EventKind, Outcome, Payload, PullPoint, RunConfig, RunState, Status,
    ToolErrorKind, Wait,
};
use serde_json::json;
use uuid::Uuid;

fn waits_config() -> RunConfig {
    RunConfig {
        builtin_tools: vec!["sleep".into(), "wait_until".into(), "wait_for_event".into()],
        ..RunConfig::default()
    }
}

fn wake_at(state: &RunState) -> Payload {
    let due_at_ms = match &state.parked {
        Some(PullPoint::AwaitingTimer { wake_at_ms, .. }) => *wake_at_ms,
        Some(PullPoint::AwaitingEvent { timeout_at_ms, .. }) => timeout_at_ms.unwrap(),
        other => panic!("not waiting: {other:?}"),
    };
    Payload::Wake {
        due_at_ms,
        event: None,
    }
}

fn signed(key: &str) -> ArrivedEvent {
    ArrivedEvent {
        id: Uuid::from_u128(7),
        key: key.into(),
        payload: json!({"signed": true, "by": "ann"}),
        received_at_ms: 500,
    }
}

#[tokio::test]
async fn sleep_parks_and_a_wake_resumes_it_with_when_it_woke() {
    let script = vec![
        ScriptedTurn::call("sleep", json!({"seconds": 2})),
        ScriptedTurn::text("Slept."),
    ];
    let (agent, provider) = agent(script);
    let mut log = Vec::new();
    let (mut state, status) = agent
        .run(run_id(), "wait two seconds", waits_config(), &mut log)
        .await
        .unwrap();
    assert_eq!(
        status,
        Status::Parked(PullPoint::AwaitingTimer {
            call_ids: vec!["call_1".into()],
            wake_at_ms: 2_000
        }),
        "epoch + 2 s"
    );
    let requests = provider.requests();
    let offered: Vec<&str> = requests[0].tools.iter().map(|t| t.name.as_str()).collect();
    for name in ["sleep", "wait_until", "wait_for_event"] {
        assert!(offered.contains(&name), "{name} is offered: {offered:?}");
    }
    let call = log
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::ToolCall(c) => Some(c.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        call.disposition,
        Disposition::Wait {
            wait: Wait::Timer {
                started_at_ms: 0,
                wake_at_ms: 2_000
            }
        },
        "the call and its wait are recorded before the run parks"
    );
    // A wake for an earlier time ends nothing: refused, nothing recorded.
    let before = log.len();
    let early = agent
        .advance(
            &mut state,
            Some(Payload::Wake {
                due_at_ms: 1_999,
                event: None,
            }),
            &mut log,
        )
        .await;
    assert!(
        matches!(early, Err(AgentError::InvalidResume(_))),
        "{early:?}"
    );
    assert_eq!(log.len(), before);
    let wake = wake_at(&state);
    let status = agent
        .advance(&mut state, Some(wake), &mut log)
        .await
        .unwrap();
    assert!(
        matches!(&status, Status::Done(Outcome::Succeeded { answer, .. }) if answer == "Slept."),
        "{status:?}"
    );
    let (seen, is_error) = result_in(&provider.requests()[1], "call_1");
    assert!(!is_error);
    let seen: serde_json::Value = serde_json::from_str(&seen.to_text()).unwrap();
    assert_eq!(seen["due_at"], "1970-01-01T00:00:02.000Z");
    assert_eq!(seen["woke_at"], "1970-01-01T00:00:02.000Z");
    assert_replays(&log, &state);
    // A duplicate wake after the end changes nothing.
    let again = agent
        .advance(&mut state, Some(wake_at_done()), &mut log)
        .await;
    assert!(
        matches!(again, Err(AgentError::InvalidResume(_))),
        "{again:?}"
    );
}

fn wake_at_done() -> Payload {
    Payload::Wake {
        due_at_ms: 2_000,
        event: None,
    }
}

#[tokio::test]
async fn wait_for_event_gets_the_payload_of_its_key_only() {
    let script = vec![
        ScriptedTurn::call(
            "wait_for_event",
            json!({"key": "order/1:signed", "timeout_seconds": 60}),
        ),
        ScriptedTurn::text("Signed by ann."),
    ];
    let (agent, provider) = agent(script);
    let mut log = Vec::new();
    let (mut state, status) = agent
        .run(run_id(), "wait for the signature", waits_config(), &mut log)
        .await
        .unwrap();
    assert_eq!(
        status,
        Status::Parked(PullPoint::AwaitingEvent {
            call_ids: vec!["call_1".into()],
            keys: vec!["order/1:signed".into()],
            timeout_at_ms: Some(60_000)
        })
    );
    let other = agent
        .advance(
            &mut state,
            Some(Payload::Wake {
                due_at_ms: 500,
                event: Some(signed("order/2:signed")),
            }),
            &mut log,
        )
        .await;
    assert!(
        matches!(other, Err(AgentError::InvalidResume(_))),
        "another key's event ends nothing: {other:?}"
    );
    let status = agent
        .advance(
            &mut state,
            Some(Payload::Wake {
                due_at_ms: 500,
                event: Some(signed("order/1:signed")),
            }),
            &mut log,
        )
        .await
        .unwrap();
    assert!(matches!(status, Status::Done(Outcome::Succeeded { .. })));
    let (seen, is_error) = result_in(&provider.requests()[1], "call_1");
    assert!(!is_error);
    let seen: serde_json::Value = serde_json::from_str(&seen.to_text()).unwrap();
    assert_eq!(seen["payload"], json!({"signed": true, "by": "ann"}));
    assert_eq!(seen["key"], "order/1:signed");
    assert_eq!(seen["event_id"], Uuid::from_u128(7).to_string());
    assert_replays(&log, &state);
}

#[tokio::test]
async fn an_event_wait_times_out_with_a_result_the_model_reads() {
    let script = vec![
        ScriptedTurn::call(
            "wait_for_event",
            json!({"key": "order/1:signed", "timeout_seconds": 0.5}),
        ),
        ScriptedTurn::text("Nobody signed."),
    ];
    let (agent, provider) = agent(script);
    let mut log = Vec::new();
    let (mut state, _) = agent
        .run(run_id(), "wait", waits_config(), &mut log)
        .await
        .unwrap();
    let wake = wake_at(&state);
    let status = agent
        .advance(&mut state, Some(wake), &mut log)
        .await
        .unwrap();
    assert!(matches!(status, Status::Done(Outcome::Succeeded { .. })));
    let (seen, is_error) = result_in(&provider.requests()[1], "call_1");
    assert!(
        !is_error,
        "a timeout is a result the model reads, not a failure"
    );
    let seen: serde_json::Value = serde_json::from_str(&seen.to_text()).unwrap();
    assert_eq!(seen["timed_out"], true);
    assert_eq!(seen["waited_until"], "1970-01-01T00:00:00.500Z");
}

#[tokio::test]
async fn bad_arguments_are_tool_errors_the_model_sees() {
    let script = vec![
        ScriptedTurn::calls(&[
            ("sleep", json!({"seconds": -1})),
            ("sleep", json!({"seconds": 1e12})),
            ("wait_until", json!({"time": "tomorrow"})),
            ("wait_for_event", json!({"key": "a key with spaces"})),
        ]),
        ScriptedTurn::text("I could not wait."),
    ];
    let (agent, provider) = agent(script);
    let mut log = Vec::new();
    let (state, status) = agent
        .run(run_id(), "wait badly", waits_config(), &mut log)
        .await
        .unwrap();
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { .. })),
        "the run goes on: {status:?}"
    );
    let errors: Vec<(ToolErrorKind, String)> = log
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolError { error, message, .. } => Some((*error, message.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(errors.len(), 4, "{errors:?}");
    assert!(
        errors
            .iter()
            .all(|(k, _)| *k == ToolErrorKind::InvalidArguments)
    );
    assert!(
        errors[1].1.contains("366 days") || errors[1].1.contains("maximum"),
        "{errors:?}"
    );
    assert!(errors[2].1.contains("RFC 3339"), "{errors:?}");
    for id in ["call_1", "call_2", "call_3", "call_4"] {
        assert!(
            result_in(&provider.requests()[1], id).1,
            "{id} is an error result"
        );
    }
    assert_replays(&log, &state);
}

#[tokio::test]
async fn a_wait_that_is_not_enabled_is_an_unknown_tool() {
    let script = vec![
        ScriptedTurn::call("sleep", json!({"seconds": 1})),
        ScriptedTurn::text("ok"),
    ];
    let (agent, _) = agent(script);
    let mut log = Vec::new();
    let (_, status) = agent
        .run(run_id(), "sleep", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert!(matches!(status, Status::Done(_)));
    assert!(log.iter().any(|e| matches!(
        &e.kind,
        EventKind::ToolError {
            error: ToolErrorKind::UnknownTool,
            ..
        }
    )));
}

/// Park at each wait, serialise the state, drop every object, resume in a
/// fresh agent from the JSON alone: the same log as one run that never
/// stopped.
#[tokio::test]
async fn resuming_from_the_checkpoint_gives_the_same_log() {
    let script = vec![
        ScriptedTurn::call("sleep", json!({"seconds": 1})),
        ScriptedTurn::call("wait_for_event", json!({"key": "k1"})),
        ScriptedTurn::text("Both done."),
    ];
    let wakes: [fn(&RunState) -> Payload; 2] = [wake_at, |_| Payload::Wake {
        due_at_ms: 500,
        event: Some(signed("k1")),
    }];
    // Uninterrupted.
    let (agent_a, _) = agent(script.clone());
    let mut log_a = Vec::new();
    let (mut state_a, _) = agent_a
        .run(run_id(), "wait twice", waits_config(), &mut log_a)
        .await
        .unwrap();
    for wake in wakes {
        let payload = wake(&state_a);
        agent_a
            .advance(&mut state_a, Some(payload), &mut log_a)
            .await
            .unwrap();
    }
    // Interrupted at each park.
    let mut log_b = Vec::new();
    let mut checkpoint = {
        let (agent_b, _) = agent(script.clone());
        let (state, status) = agent_b
            .run(run_id(), "wait twice", waits_config(), &mut log_b)
            .await
            .unwrap();
        assert!(matches!(
            status,
            Status::Parked(PullPoint::AwaitingTimer { .. })
        ));
        serde_json::to_string(&state).unwrap()
    };
    for wake in wakes {
        let mut state: RunState = serde_json::from_str(&checkpoint).unwrap();
        let (agent_b, _) = agent_at(script.clone(), served(&log_b));
        let payload = wake(&state);
        agent_b
            .advance(&mut state, Some(payload), &mut log_b)
            .await
            .unwrap();
        checkpoint = serde_json::to_string(&state).unwrap();
    }
    let state_b: RunState = serde_json::from_str(&checkpoint).unwrap();
    assert_eq!(log_a, log_b, "resuming from JSON gives the same log");
    assert_eq!(state_a, state_b);
    assert!(matches!(state_b.outcome, Some(Outcome::Succeeded { .. })));
    assert_replays(&log_a, &state_a);
}

#[tokio::test]
async fn a_delayed_start_waits_for_its_wake_then_runs_from_the_top() {
    let (agent, provider) = agent(vec![ScriptedTurn::text("Reconciled.")]);
    let config = RunConfig {
        start_at_ms: Some(5_000),
        ..RunConfig::default()
    };
    let mut log = Vec::new();
    let (mut state, status) = agent
        .run(run_id(), "reconcile", config, &mut log)
        .await
        .unwrap();
    assert_eq!(
        status,
        Status::Parked(PullPoint::AwaitingTimer {
            call_ids: vec![],
            wake_at_ms: 5_000
        })
    );
    assert_eq!(log.len(), 1, "only session.start: {log:?}");
    assert!(
        provider.requests().is_empty(),
        "no model call before the start"
    );
    // Not its wake: an earlier time, an event. Refused, nothing recorded.
    for wrong in [
        Payload::Wake {
            due_at_ms: 4_999,
            event: None,
        },
        Payload::Wake {
            due_at_ms: 5_000,
            event: Some(signed("k")),
        },
    ] {
        let r = agent.advance(&mut state, Some(wrong), &mut log).await;
        assert!(matches!(r, Err(AgentError::InvalidResume(_))), "{r:?}");
        assert_eq!(log.len(), 1);
    }
    let wake = wake_at(&state);
    let status = agent
        .advance(&mut state, Some(wake), &mut log)
        .await
        .unwrap();
    assert!(
        matches!(&status, Status::Done(Outcome::Succeeded { answer, .. }) if answer == "Reconciled."),
        "{status:?}"
    );
    assert_eq!(
        log[1].kind,
        EventKind::SessionResume { by: None },
        "the start is recorded as glia's resume"
    );
    assert_eq!(provider.requests().len(), 1);
    assert_replays(&log, &state);
}
