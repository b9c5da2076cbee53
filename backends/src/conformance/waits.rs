//! [`crate::Waits`]: due timers and event waits read from the run rows'
//! pull points, kept events, deliveries per tenant and key, never twice.

use glia_proto::wait::Wait;
use glia_proto::{
    ArrivedEvent, ContentBlock, Disposition, Event, EventKind, Message, Payload, PullPoint, Role,
    RunConfig, RunState, ToolCallRecord, Usage, args_hash,
};
use serde_json::json;
use uuid::Uuid;

use super::{TTL, at, new_run};
use crate::EventLog;

/// The events of a run that called built-in `tool` with `input`, decided
/// as `wait`, parked at the pull point that implies.
pub fn waiting_log(run_id: Uuid, tool: &str, input: serde_json::Value, wait: Wait) -> Vec<Event> {
    let config = RunConfig {
        builtin_tools: vec!["sleep".into(), "wait_for_event".into()],
        ..RunConfig::default()
    };
    let kinds = vec![
        EventKind::SessionStart {
            redactions: Vec::new(),
            goal: "wait".into(),
            config,
        },
        EventKind::PlanDraft {
            steps: vec!["Reach the goal.".into()],
            usage: Usage::default(),
            cost_usd_micros: 0,
        },
        EventKind::PlanCommit {
            steps: vec!["Reach the goal.".into()],
        },
        EventKind::StepStart {
            index: 0,
            description: "Reach the goal.".into(),
            tools: vec![],
        },
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
                content: vec![ContentBlock::ToolUse {
                    id: "w1".into(),
                    name: tool.into(),
                    input: input.clone(),
                }],
            },
            usage: Usage::default(),
            stop_reason: "tool_use".into(),
            duration_ms: 1,
            cost_usd_micros: 0,
            rejected: None,
        },
        EventKind::ToolCall(ToolCallRecord {
            call_id: "w1".into(),
            name: tool.into(),
            input: input.clone(),
            args_hash: args_hash(&input),
            idempotency_key: format!("{run_id}:w1"),
            disposition: Disposition::Wait { wait },
        }),
    ];
    let mut events: Vec<Event> = kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| Event {
            run_id,
            seq: i as u64 + 1,
            at: at(),
            kind,
        })
        .collect();
    let state = RunState::replay(run_id, &events).expect("the waiting log replays");
    let pull_point = state.tool_park().expect("a wait parks");
    events.push(Event {
        run_id,
        seq: events.len() as u64 + 1,
        at: at(),
        kind: EventKind::SessionPause { pull_point },
    });
    events
}

/// Admit a run of `tenant` whose log is `events` (a [`waiting_log`]) and
/// commit the rest: the run is parked where its last event says.
pub async fn park(log: &dyn EventLog, tenant: &str, events: &[Event]) {
    let run_id = events[0].run_id;
    log.create_run(new_run(tenant, None, &events[0]))
        .await
        .unwrap();
    let lease = log.acquire(run_id, "w", TTL).await.unwrap();
    let state = RunState::replay(run_id, events).unwrap();
    log.commit(&lease, &events[1..], &state, &[]).await.unwrap();
    log.release(&lease).await.unwrap();
}

fn event(key: &str, received_at_ms: i64) -> ArrivedEvent {
    ArrivedEvent {
        id: Uuid::now_v7(),
        key: key.into(),
        payload: json!({"signed": true, "by": key}),
        received_at_ms,
    }
}

/// Due waits by due time; events kept once per tenant and id; a delivery
/// pairs an event with its tenant's waiters on its key only, once per run,
/// one event wake at a time; old events are excluded and forgotten.
pub async fn waits(log: &dyn EventLog) {
    let timer = Uuid::now_v7();
    let t1_wait = Uuid::now_v7();
    let t2_wait = Uuid::now_v7();
    park(
        log,
        "t1",
        &waiting_log(
            timer,
            "sleep",
            json!({"seconds": 4}),
            Wait::Timer {
                started_at_ms: 1_000,
                wake_at_ms: 5_000,
            },
        ),
    )
    .await;
    park(
        log,
        "t1",
        &waiting_log(
            t1_wait,
            "wait_for_event",
            json!({"key": "order/1:signed"}),
            Wait::Event {
                key: "order/1:signed".into(),
                started_at_ms: 1_000,
                timeout_at_ms: 9_000,
            },
        ),
    )
    .await;
    park(
        log,
        "t2",
        &waiting_log(
            t2_wait,
            "wait_for_event",
            json!({"key": "order/1:signed"}),
            Wait::Event {
                key: "order/1:signed".into(),
                started_at_ms: 1_000,
                timeout_at_ms: 20_000,
            },
        ),
    )
    .await;
    let run = log.get_run(timer).await.unwrap();
    assert!(
        matches!(
            run.pull_point,
            Some(PullPoint::AwaitingTimer {
                wake_at_ms: 5_000,
                ..
            })
        ),
        "{:?}",
        run.pull_point
    );

    // Due waits, earliest first, by the pull points' due times.
    assert!(log.due_waits(4_999, 10).await.unwrap().is_empty());
    let due = log.due_waits(5_000, 10).await.unwrap();
    assert_eq!(
        due,
        vec![crate::DueWait {
            run_id: timer,
            due_at_ms: 5_000
        }]
    );
    let due: Vec<(Uuid, i64)> = log
        .due_waits(30_000, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.run_id, d.due_at_ms))
        .collect();
    assert_eq!(
        due,
        vec![(timer, 5_000), (t1_wait, 9_000), (t2_wait, 20_000)]
    );
    assert_eq!(log.due_waits(30_000, 2).await.unwrap().len(), 2, "limit");

    // Kept once per (tenant, id).
    let e1 = event("order/1:signed", 2_000);
    assert!(log.keep_event("t1", &e1).await.unwrap());
    assert!(
        !log.keep_event("t1", &e1).await.unwrap(),
        "the same id again"
    );
    let other_key = event("order/2:signed", 2_100);
    assert!(log.keep_event("t1", &other_key).await.unwrap());

    // Paired with its own tenant's waiter on its key only.
    let pairs = log.event_deliveries(0, None, 100).await.unwrap();
    assert_eq!(
        pairs,
        vec![(t1_wait, e1.clone())],
        "t2's wait never sees t1's event"
    );
    assert_eq!(
        log.event_deliveries(0, Some(("t1", e1.id)), 100)
            .await
            .unwrap(),
        vec![(t1_wait, e1.clone())]
    );
    assert!(
        log.event_deliveries(0, Some(("t2", e1.id)), 100)
            .await
            .unwrap()
            .is_empty(),
        "the id under another tenant is another event"
    );
    assert!(
        log.event_deliveries(2_001, None, 100)
            .await
            .unwrap()
            .is_empty(),
        "received before `since`"
    );

    // Posted: never paired with that run again, and no second event while
    // one waits unconsumed.
    log.post(
        t1_wait,
        Payload::Wake {
            due_at_ms: e1.received_at_ms,
            event: Some(e1.clone()),
        },
    )
    .await
    .unwrap();
    let e2 = event("order/1:signed", 2_500);
    assert!(log.keep_event("t1", &e2).await.unwrap());
    assert!(
        log.event_deliveries(0, None, 100).await.unwrap().is_empty(),
        "an event wake waits unconsumed in the run's inbox"
    );
    let again = log
        .post(
            t1_wait,
            Payload::Wake {
                due_at_ms: e1.received_at_ms,
                event: Some(e1.clone()),
            },
        )
        .await;
    assert!(
        matches!(again, Err(crate::LogError::Duplicate { .. })),
        "an event is posted to a run once: {again:?}"
    );

    // t2's own event reaches t2's waiter.
    let e3 = event("order/1:signed", 3_000);
    assert!(log.keep_event("t2", &e3).await.unwrap());
    assert_eq!(
        log.event_deliveries(0, None, 100).await.unwrap(),
        vec![(t2_wait, e3.clone())]
    );

    // A time wake is posted once per due time.
    log.post(
        timer,
        Payload::Wake {
            due_at_ms: 5_000,
            event: None,
        },
    )
    .await
    .unwrap();
    assert!(matches!(
        log.post(
            timer,
            Payload::Wake {
                due_at_ms: 5_000,
                event: None
            }
        )
        .await,
        Err(crate::LogError::Duplicate { .. })
    ));
    // A run posted its wake is not due again for that time: wakes waiting
    // for a worker never hide later due runs from a pass.
    let due: Vec<Uuid> = log
        .due_waits(30_000, 2)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.run_id)
        .collect();
    assert_eq!(due, vec![t1_wait, t2_wait]);

    // Forgotten by age.
    assert_eq!(log.forget_events(2_600).await.unwrap(), 3);
    assert_eq!(
        log.event_deliveries(0, None, 100).await.unwrap(),
        vec![(t2_wait, e3)]
    );
    assert_eq!(log.forget_events(i64::MAX).await.unwrap(), 1);
}
