//! Issue 32: built-in waits in the transition function: a wait parks at
//! `awaiting_timer` / `awaiting_event`, its result (a wake) unparks, a
//! timeout result too, the pull point carries the earliest due time, the
//! checkpoint serialises and resumes, and replay equals the live state.

use serde_json::json;
use uuid::Uuid;

use crate::testing::EventLog as Log;
use crate::wait::Wait;
use crate::*;

fn start() -> EventKind {
    EventKind::SessionStart {
        redactions: Vec::new(),
        goal: "g".into(),
        config: RunConfig {
            builtin_tools: vec!["sleep".into(), "wait_for_event".into()],
            ..RunConfig::default()
        },
    }
}

fn uses(calls: &[(&str, &str)]) -> [EventKind; 2] {
    [
        EventKind::ModelCall {
            model: "m".into(),
            messages: 1,
            wrap_up: false,
            forced_tool: None,
        },
        EventKind::ModelResponse {
            redactions: Vec::new(),
            message: Message {
                role: Role::Assistant,
                content: calls
                    .iter()
                    .map(|(id, name)| ContentBlock::ToolUse {
                        id: (*id).into(),
                        name: (*name).into(),
                        input: json!({}),
                    })
                    .collect(),
            },
            usage: Usage::default(),
            stop_reason: "tool_use".into(),
            duration_ms: 0,
            cost_usd_micros: 0,
            rejected: None,
        },
    ]
}

fn waits(id: &str, name: &str, wait: Wait) -> EventKind {
    EventKind::ToolCall(ToolCallRecord {
        call_id: id.into(),
        name: name.into(),
        input: json!({}),
        args_hash: args_hash(&json!({})),
        idempotency_key: format!("k:{id}"),
        disposition: Disposition::Wait { wait },
    })
}

fn result(id: &str, text: &str) -> EventKind {
    EventKind::ToolResult {
        call_id: id.into(),
        content: text.into(),
        reminder: None,
        duration_ms: 0,
        redactions: Vec::new(),
    }
}

fn started() -> Log {
    let mut log = Log::new();
    log.ok(start())
        .ok(EventKind::PlanCommit {
            steps: vec!["a".into()],
        })
        .ok(EventKind::StepStart {
            index: 0,
            description: "a".into(),
            tools: vec![],
        });
    log
}

fn timer(wake_at_ms: i64) -> Wait {
    Wait::Timer {
        started_at_ms: 1_000,
        wake_at_ms,
    }
}

fn event(key: &str, timeout_at_ms: i64) -> Wait {
    Wait::Event {
        key: key.into(),
        started_at_ms: 1_000,
        timeout_at_ms,
    }
}

#[test]
fn a_sleep_parks_at_awaiting_timer_and_its_result_unparks() {
    let mut log = started();
    let [c, r] = uses(&[("s1", "sleep")]);
    log.ok(c).ok(r).ok(waits("s1", "sleep", timer(5_000)));
    let park = log.state.tool_park().expect("a wait parks");
    assert_eq!(
        park,
        PullPoint::AwaitingTimer {
            call_ids: vec!["s1".into()],
            wake_at_ms: 5_000
        }
    );
    assert_eq!(park.name(), "awaiting_timer");
    assert!(
        !log.state.call("s1").unwrap().needs_worker(),
        "no worker acts on a waiting call"
    );
    assert!(
        log.state.pausable(),
        "an operator pause may land while a run waits"
    );
    assert!(
        !log.state.call("s1").unwrap().cleared_without_result(),
        "a wait is never an interrupted call"
    );
    assert_eq!(
        log.state.usage.tool_calls, 1,
        "a wait counts as a tool call"
    );
    log.ok(EventKind::SessionPause { pull_point: park });
    assert!(matches!(
        log.state.status(),
        Status::Parked(PullPoint::AwaitingTimer { .. })
    ));
    // Nothing else moves a parked run; the wake's result does.
    assert!(matches!(
        log.refused(EventKind::ModelCall {
            model: "m".into(),
            messages: 1,
            wrap_up: false,
            forced_tool: None
        }),
        TransitionError::Illegal { .. }
    ));
    log.ok(result("s1", r#"{"woke_at":"…"}"#));
    assert_eq!(log.state.status(), Status::Runnable);
    assert_eq!(log.state.phase, Phase::Executing);
    assert!(matches!(
        log.state.messages.last().unwrap().content[0],
        ContentBlock::ToolResult { .. }
    ));
    assert_eq!(
        RunState::replay(Uuid::nil(), &log.events).unwrap(),
        log.state
    );
}

#[test]
fn an_event_wait_parks_at_awaiting_event_with_the_earliest_due_time() {
    let mut log = started();
    let [c, r] = uses(&[
        ("e1", "wait_for_event"),
        ("e2", "wait_for_event"),
        ("s1", "sleep"),
    ]);
    log.ok(c)
        .ok(r)
        .ok(waits("e1", "wait_for_event", event("k/b", 9_000)))
        .ok(waits("e2", "wait_for_event", event("k/a", 8_000)))
        .ok(waits("s1", "sleep", timer(3_000)));
    let park = log.state.tool_park().unwrap();
    assert_eq!(
        park,
        PullPoint::AwaitingEvent {
            call_ids: vec!["e1".into(), "e2".into(), "s1".into()],
            keys: vec!["k/a".into(), "k/b".into()],
            timeout_at_ms: Some(3_000),
        },
        "an event wait before a timer; the timer's due time is the earliest"
    );
    log.ok(EventKind::SessionPause { pull_point: park });
    // The timer fires: the run re-parks on what is still due.
    log.ok(result("s1", "woke"));
    assert_eq!(
        log.state.parked,
        Some(PullPoint::AwaitingEvent {
            call_ids: vec!["e1".into(), "e2".into()],
            keys: vec!["k/a".into(), "k/b".into()],
            timeout_at_ms: Some(8_000),
        })
    );
    // An event for k/a, then the timeout of k/b.
    log.ok(result("e2", r#"{"payload":{"signed":true}}"#));
    assert_eq!(
        log.state.parked,
        Some(PullPoint::AwaitingEvent {
            call_ids: vec!["e1".into()],
            keys: vec!["k/b".into()],
            timeout_at_ms: Some(9_000),
        })
    );
    log.ok(result("e1", r#"{"timed_out":true}"#));
    assert_eq!(log.state.status(), Status::Runnable);
    let replayed = RunState::replay(Uuid::nil(), &log.events).unwrap();
    assert_eq!(replayed, log.state, "replay equals the live state");
}

#[test]
fn approvals_and_caller_results_come_before_waits() {
    let mut log = started();
    let [c, r] = uses(&[("s1", "sleep"), ("x1", "t")]);
    log.ok(c)
        .ok(r)
        .ok(waits("s1", "sleep", timer(3_000)))
        .ok(EventKind::ToolCall(ToolCallRecord {
            call_id: "x1".into(),
            name: "t".into(),
            input: json!({}),
            args_hash: args_hash(&json!({})),
            idempotency_key: "k:x1".into(),
            disposition: Disposition::External,
        }));
    assert_eq!(
        log.state.tool_park(),
        Some(PullPoint::AwaitingTool {
            call_ids: vec!["x1".into()]
        })
    );
}

#[test]
fn only_a_builtin_tool_of_the_run_waits_and_the_checkpoint_resumes() {
    let mut log = started();
    let [c, r] = uses(&[("s1", "nap")]);
    log.ok(c).ok(r);
    assert!(matches!(
        log.refused(waits("s1", "nap", timer(3_000))),
        TransitionError::Illegal { .. }
    ));
    let mut log = started();
    let [c, r] = uses(&[("s1", "sleep")]);
    log.ok(c).ok(r).ok(waits("s1", "sleep", timer(3_000)));
    let park = log.state.tool_park().unwrap();
    log.ok(EventKind::SessionPause { pull_point: park });
    // The checkpoint (JSON) resumes where it stood: the wait included.
    let text = serde_json::to_string(&log.state).unwrap();
    let mut resumed: RunState = serde_json::from_str(&text).unwrap();
    assert_eq!(resumed, log.state);
    assert_eq!(
        resumed.call("s1").unwrap().wait,
        Some(timer(3_000)),
        "the wait is in the checkpoint"
    );
    let next = log.event(result("s1", "woke"));
    resumed.apply(&next).unwrap();
    log.ok(result("s1", "woke"));
    assert_eq!(resumed, log.state);
    // An old checkpoint without the field still reads.
    let mut old = serde_json::to_value(&log.state).unwrap();
    old.as_object_mut().unwrap().remove("wait");
    let _: RunState = serde_json::from_value(old).unwrap();
}

#[test]
fn erased_waits_still_replay() {
    let mut log = started();
    let [c, r] = uses(&[("e1", "wait_for_event"), ("e2", "wait_for_event")]);
    log.ok(c)
        .ok(r)
        .ok(waits(
            "e1",
            "wait_for_event",
            event("customer/ann@x.example", 9_000),
        ))
        .ok(waits(
            "e2",
            "wait_for_event",
            event("customer/bob@x.example", 9_000),
        ));
    let park = log.state.tool_park().unwrap();
    log.ok(EventKind::SessionPause { pull_point: park })
        .ok(result("e1", "{}"))
        .ok(result("e2", "{}"))
        .ok(EventKind::SessionComplete {
            outcome: Outcome::Failed { error: "x".into() },
        });
    let erased: Vec<Event> = log.events.iter().map(Event::erased).collect();
    let text = serde_json::to_string(&erased).unwrap();
    assert!(!text.contains("x.example"), "event keys are erased");
    RunState::replay(Uuid::nil(), &erased).expect("the erased log replays");
    let wake = Payload::Wake {
        due_at_ms: 1,
        event: Some(ArrivedEvent {
            id: Uuid::nil(),
            key: "customer/ann@x.example".into(),
            payload: json!({"secret": "s3cr3t"}),
            received_at_ms: 1,
        }),
    };
    let erased = serde_json::to_string(&wake.erased()).unwrap();
    assert!(!erased.contains("x.example") && !erased.contains("s3cr3t"));
}

fn delayed(start_at_ms: i64) -> EventKind {
    EventKind::SessionStart {
        redactions: Vec::new(),
        goal: "g".into(),
        config: RunConfig {
            start_at_ms: Some(start_at_ms),
            ..RunConfig::default()
        },
    }
}

#[test]
fn a_delayed_start_parks_on_a_timer_with_no_calls_until_glia_resumes_it() {
    let mut log = Log::new();
    log.ok(delayed(5_000));
    let park = PullPoint::AwaitingTimer {
        call_ids: vec![],
        wake_at_ms: 5_000,
    };
    assert_eq!(log.state.status(), Status::Parked(park.clone()));
    assert_eq!(log.phase(), Phase::Planning);
    // Nothing moves it but its wake: no plan, no operator's resume.
    log.refused(EventKind::PlanCommit {
        steps: vec!["a".into()],
    });
    log.refused(EventKind::SessionResume {
        by: Some("ops".into()),
    });
    // A pause requested while it waits stays due past the start.
    log.ok(EventKind::SessionPauseRequested {
        reason: "hold".into(),
        by: Some("ops".into()),
    });
    log.ok(EventKind::SessionResume { by: None });
    assert_eq!(log.state.status(), Status::Runnable);
    assert_eq!(log.state.pause_due.as_deref(), Some("hold"));
    assert!(log.state.pausable());
    let replayed = RunState::replay(Uuid::nil(), &log.events).unwrap();
    assert_eq!(replayed, log.state, "replay equals the live state");
    let checkpoint: RunState =
        serde_json::from_str(&serde_json::to_string(&log.state).unwrap()).unwrap();
    assert_eq!(checkpoint, log.state);
}

#[test]
fn a_start_time_not_after_session_start_starts_at_once() {
    // The test log's events are at the Unix epoch.
    let mut log = Log::new();
    log.ok(delayed(0));
    assert_eq!(log.state.status(), Status::Runnable);
    log.refused(EventKind::SessionResume { by: None });
    let mut log = Log::new();
    log.ok(delayed(-1));
    assert_eq!(log.state.status(), Status::Runnable);
}
