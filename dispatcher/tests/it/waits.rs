//! Issue 32: `POST /v1/events` and the waits loop on the in-memory twins.
//! Bad input is a 4xx naming the field and writes nothing; another
//! tenant's event never reaches a wait; an event that arrives before the
//! wait is kept and delivered when the wait begins; a run never receives
//! the same event twice; a due timer is woken once however often the loop
//! passes.

use crate::common;

use axum::http::StatusCode;
use chrono::Utc;
use common::*;
use glia_backends::{Inbox, Outbox, RunLog, Waits};
use glia_dispatcher::waits::waits_once;
use glia_proto::wait::Wait;
use glia_proto::{
    ContentBlock, Disposition, EventKind, Message, Payload, Role, ToolCallRecord, Usage, args_hash,
};
use serde_json::{Value, json};
use uuid::Uuid;

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

async fn waiting_run(h: &H, token: &str) -> Uuid {
    create(
        h,
        token,
        json!({"goal": "wait", "config": {"builtin_tools": ["sleep", "wait_for_event"]}}),
    )
    .await
}

/// The worker's part, by hand: the model calls `name` with `input`, the call
/// is decided as `wait`, the run parks where that implies.
async fn park(h: &H, run_id: Uuid, call_id: &str, name: &str, input: Value, wait: Wait) {
    let mut kinds = to_model_call();
    kinds.push(EventKind::ModelResponse {
        redactions: Vec::new(),
        message: Message {
            role: Role::Assistant,
            content: vec![ContentBlock::ToolUse {
                id: call_id.into(),
                name: name.into(),
                input: input.clone(),
            }],
        },
        usage: Usage::default(),
        stop_reason: "tool_use".into(),
        duration_ms: 1,
        cost_usd_micros: 0,
        rejected: None,
    });
    kinds.push(EventKind::ToolCall(ToolCallRecord {
        call_id: call_id.into(),
        name: name.into(),
        input: input.clone(),
        args_hash: args_hash(&input),
        idempotency_key: format!("{run_id}:{call_id}"),
        disposition: Disposition::Wait { wait },
    }));
    let mut state = h.log.load(run_id).await.unwrap();
    for kind in &kinds {
        let e = glia_proto::Event {
            run_id,
            seq: state.head_seq + 1,
            at: Utc::now(),
            kind: kind.clone(),
        };
        state.apply(&e).unwrap();
    }
    kinds.push(EventKind::SessionPause {
        pull_point: state.tool_park().unwrap(),
    });
    commit(&*h.log, run_id, kinds).await;
}

async fn park_on_event(h: &H, run_id: Uuid, key: &str) {
    let now = now_ms();
    park(
        h,
        run_id,
        "w1",
        "wait_for_event",
        json!({"key": key}),
        Wait::Event {
            key: key.into(),
            started_at_ms: now,
            timeout_at_ms: now + 3_600_000,
        },
    )
    .await;
}

/// The event wakes waiting in the run's inbox.
async fn event_wakes(h: &H, run_id: Uuid) -> Vec<glia_proto::ArrivedEvent> {
    h.log
        .inbox(run_id)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|i| match i.payload {
            Payload::Wake { event, .. } => event,
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn bad_events_are_refused_naming_the_field_and_write_nothing() {
    let h = harness();
    let run = waiting_run(&h, SUB_A).await;
    park_on_event(&h, run, "order/1").await;
    let before = snapshot(&h).await;
    let cases = [
        (
            json!({"key": "order/1", "payload": {}, "extra": 1}),
            "extra",
        ),
        (json!({"payload": {}}), "key"),
        (json!({"key": "order 1", "payload": {}}), "key"),
        (json!({"key": "k".repeat(201), "payload": {}}), "key"),
        (json!({"key": "", "payload": {}}), "key"),
        (
            json!({"key": "order/1", "payload": {"blob": "x".repeat(70_000)}}),
            "payload",
        ),
        (
            json!({"key": "order/1", "payload": {}, "id": "not-a-uuid"}),
            "id",
        ),
    ];
    for (body, field) in cases {
        let r = post(&h, "/v1/events", SUB_A, body.clone()).await;
        assert!(
            r.status.is_client_error(),
            "{body}: {} {}",
            r.status,
            r.text
        );
        assert!(
            r.text.contains(field),
            "the answer names {field}: {}",
            r.text
        );
    }
    let r = post(
        &h,
        "/v1/events",
        APP_A,
        json!({"key": "order/1", "payload": {}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "scope submit: {}", r.text);
    assert_eq!(snapshot(&h).await, before, "nothing was posted");
    assert_eq!(
        h.log.forget_events(i64::MAX).await.unwrap(),
        0,
        "nothing kept"
    );
}

#[tokio::test]
async fn another_tenants_event_never_reaches_my_wait() {
    let h = harness();
    let mine = waiting_run(&h, SUB_A).await;
    park_on_event(&h, mine, "order/1:signed").await;
    let r = post(
        &h,
        "/v1/events",
        SUB_B,
        json!({"key": "order/1:signed", "payload": {"signed": "by b"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    assert_eq!(r.body["delivered"], 0);
    waits_once(&h.app, now_ms()).await.unwrap();
    assert!(
        event_wakes(&h, mine).await.is_empty(),
        "b's event is not a's"
    );
    let r = post(
        &h,
        "/v1/events",
        SUB_A,
        json!({"key": "order/1:signed", "payload": {"signed": "by a"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    assert_eq!(r.body["delivered"], 1);
    let got = event_wakes(&h, mine).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, json!({"signed": "by a"}));
}

#[tokio::test]
async fn an_early_event_is_kept_delivered_when_the_wait_begins_and_never_twice() {
    let h = harness();
    let id = Uuid::now_v7();
    let body = json!({"key": "doc/9:signed", "payload": {"ok": true}, "id": id});
    let r = post(&h, "/v1/events", SUB_A, body.clone()).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    assert_eq!(r.body["delivered"], 0, "nobody waits yet");
    assert_eq!(r.body["id"], id.to_string());
    // The wait begins after the event arrived: the loop delivers it.
    let run = waiting_run(&h, SUB_A).await;
    park_on_event(&h, run, "doc/9:signed").await;
    let pass = waits_once(&h.app, now_ms()).await.unwrap();
    assert_eq!(pass.delivered, 1);
    let got = event_wakes(&h, run).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, id);
    // Another pass, and the same event posted again: nothing new.
    assert_eq!(waits_once(&h.app, now_ms()).await.unwrap().delivered, 0);
    let r = post(&h, "/v1/events", SUB_A, body).await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    assert_eq!(r.body["duplicate"], true);
    assert_eq!(r.body["delivered"], 0);
    assert_eq!(event_wakes(&h, run).await.len(), 1);
    // The worker applies it, and the run waits on the same key again: the
    // event it already received is not delivered a second time, a new one is.
    let item = h.log.inbox(run).await.unwrap()[0].id;
    commit_consuming(
        &*h.log,
        run,
        vec![EventKind::ToolResult {
            call_id: "w1".into(),
            content: "{}".into(),
            reminder: None,
            duration_ms: 0,
            redactions: Vec::new(),
        }],
        &[item],
    )
    .await;
    let now = now_ms();
    let again = vec![
        EventKind::ModelCall {
            model: "m".into(),
            messages: 3,
            wrap_up: false,
            forced_tool: None,
        },
        EventKind::ModelResponse {
            redactions: Vec::new(),
            message: Message {
                role: Role::Assistant,
                content: vec![ContentBlock::ToolUse {
                    id: "w2".into(),
                    name: "wait_for_event".into(),
                    input: json!({"key": "doc/9:signed"}),
                }],
            },
            usage: Usage::default(),
            stop_reason: "tool_use".into(),
            duration_ms: 1,
            cost_usd_micros: 0,
            rejected: None,
        },
        EventKind::ToolCall(ToolCallRecord {
            call_id: "w2".into(),
            name: "wait_for_event".into(),
            input: json!({"key": "doc/9:signed"}),
            args_hash: args_hash(&json!({"key": "doc/9:signed"})),
            idempotency_key: format!("{run}:w2"),
            disposition: Disposition::Wait {
                wait: Wait::Event {
                    key: "doc/9:signed".into(),
                    started_at_ms: now,
                    timeout_at_ms: now + 60_000,
                },
            },
        }),
        EventKind::SessionPause {
            pull_point: glia_proto::PullPoint::AwaitingEvent {
                call_ids: vec!["w2".into()],
                keys: vec!["doc/9:signed".into()],
                timeout_at_ms: Some(now + 60_000),
            },
        },
    ];
    commit(&*h.log, run, again).await;
    assert_eq!(waits_once(&h.app, now_ms()).await.unwrap().delivered, 0);
    assert!(
        event_wakes(&h, run).await.is_empty(),
        "never the same event twice"
    );
    let r = post(
        &h,
        "/v1/events",
        SUB_A,
        json!({"key": "doc/9:signed", "payload": {"ok": "again"}}),
    )
    .await;
    assert_eq!(r.body["delivered"], 1, "{}", r.text);
}

/// The waits loop wakes `run` at `due` (Unix ms), not a ms before, and
/// later passes post nothing more: its inbox holds that one wake.
async fn assert_woken_once_at(h: &H, run: Uuid, due: i64) {
    assert_eq!(
        waits_once(&h.app, due - 1).await.unwrap().woken,
        0,
        "not due yet"
    );
    assert_eq!(waits_once(&h.app, due).await.unwrap().woken, 1);
    for later in [10, 1_000] {
        assert_eq!(
            waits_once(&h.app, due + later).await.unwrap().woken,
            0,
            "a duplicate is refused"
        );
    }
    assert_eq!(
        inbox_of(h, run).await,
        vec![Payload::Wake {
            due_at_ms: due,
            event: None
        }]
    );
}

#[tokio::test]
async fn a_due_timer_is_woken_once_however_often_the_loop_passes() {
    let h = harness();
    let run = waiting_run(&h, SUB_A).await;
    let now = now_ms();
    park(
        &h,
        run,
        "s1",
        "sleep",
        json!({"seconds": 0.1}),
        Wait::Timer {
            started_at_ms: now - 100,
            wake_at_ms: now,
        },
    )
    .await;
    assert_woken_once_at(&h, run, now).await;
    assert!(
        h.log
            .outbox(100)
            .await
            .unwrap()
            .iter()
            .any(|(_, j)| j.run_id == run && j.resume),
        "a resume job goes with the wake"
    );
}

/// `req` with an `Idempotency-Key` header.
fn idempotent(
    mut req: axum::http::Request<axum::body::Body>,
) -> axum::http::Request<axum::body::Body> {
    req.headers_mut()
        .insert("idempotency-key", "start-later-1".parse().unwrap());
    req
}

#[tokio::test]
async fn start_at_admits_now_parks_until_then_and_is_woken_once() {
    let h = harness();
    let at = Utc::now() + chrono::Duration::hours(1);
    let at_ms = at.timestamp_millis();
    let body = json!({"goal": "later", "start_at": at.to_rfc3339()});
    let r = send(
        &h.router,
        idempotent(request(
            axum::http::Method::POST,
            "/v1/runs",
            Some(SUB_A),
            Some(&body),
        )),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let run: Uuid = r.body["run_id"].as_str().unwrap().parse().unwrap();
    assert_eq!(r.body["status"], "parked", "{}", r.body);
    assert_eq!(
        r.body["pull_point"],
        json!({"kind": "awaiting_timer", "call_ids": [], "wake_at_ms": at_ms})
    );
    // The same request again is the same run; another start time is another
    // request.
    let again = send(
        &h.router,
        idempotent(request(
            axum::http::Method::POST,
            "/v1/runs",
            Some(SUB_A),
            Some(&body),
        )),
    )
    .await;
    assert_eq!(again.body["run_id"], r.body["run_id"], "{}", again.text);
    let moved =
        json!({"goal": "later", "start_at": (at + chrono::Duration::seconds(1)).to_rfc3339()});
    let conflict = send(
        &h.router,
        idempotent(request(
            axum::http::Method::POST,
            "/v1/runs",
            Some(SUB_A),
            Some(&moved),
        )),
    )
    .await;
    assert_eq!(conflict.status, StatusCode::CONFLICT, "{}", conflict.text);

    assert_woken_once_at(&h, run, at_ms).await;

    // A time already past starts at once.
    let past = json!({"goal": "now", "start_at": "2020-01-01T00:00:00Z"});
    let r = post(&h, "/v1/runs", SUB_A, past).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.body["status"], "runnable", "{}", r.body);
}

#[tokio::test]
async fn a_bad_start_is_refused_naming_the_field_and_admits_nothing() {
    let h = harness();
    let before = snapshot(&h).await;
    let far = (Utc::now() + chrono::Duration::days(400)).to_rfc3339();
    let cases = [
        (json!({"goal": "g", "start_at": far}), "start_at"),
        (json!({"goal": "g", "start_at": "tomorrow"}), "start_at"),
        (
            json!({"goal": "g", "start_at": "2026-12-07T10:00:00"}),
            "start_at",
        ),
        (
            json!({"goal": "g", "config": {"start_at_ms": 1}}),
            "start_at_ms",
        ),
    ];
    for (body, field) in cases {
        let r = post(&h, "/v1/runs", SUB_A, body.clone()).await;
        assert!(
            r.status.is_client_error(),
            "{body}: {} {}",
            r.status,
            r.text
        );
        assert!(r.text.contains(field), "names {field}: {}", r.text);
    }
    assert_eq!(snapshot(&h).await, before, "nothing admitted");
}
