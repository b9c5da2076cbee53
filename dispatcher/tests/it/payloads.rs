//! External tool results, user messages, resume with budget extension, close, cancel.

use crate::common;

use axum::http::{Method, StatusCode};
use common::*;
use glia_backends::{Inbox, Job, JobQueue, Ledger, Outbox, RunLog};
use glia_proto::{BudgetLimits, EventKind, Payload};
use serde_json::json;

#[tokio::test]
async fn external_tool_result_is_posted_once() {
    let h = harness();
    let id = create(&h, SUB_A, json!({"goal": "g"})).await;
    park_for_tool(&*h.log, id).await;
    let r = post(
        &h,
        &format!("/v1/runs/{id}/tool-results/ext1"),
        SUB_A,
        json!({"content": "{\"temp\": 20}"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    assert_eq!(r.body["kinds"], json!(["tool_result"]));
    let inbox = h.log.inbox(id).await.unwrap();
    assert_eq!(
        inbox[0].payload,
        Payload::ToolResult {
            call_id: "ext1".into(),
            content: "{\"temp\": 20}".into(),
            is_error: false
        }
    );
    let before = snapshot(&h).await;
    for (call, body, status, code) in [
        (
            "ext1",
            json!({"content": "again"}),
            StatusCode::CONFLICT,
            "already_answered",
        ),
        (
            "run1",
            json!({"content": "x"}),
            StatusCode::CONFLICT,
            "not_external",
        ),
        (
            "nope",
            json!({"content": "x"}),
            StatusCode::NOT_FOUND,
            "call_not_found",
        ),
        (
            "ext1",
            json!({"content": {"temp": 20}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            "ext1",
            json!({"content": "x", "is_error": "yes"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
    ] {
        let r = post(
            &h,
            &format!("/v1/runs/{id}/tool-results/{call}"),
            SUB_A,
            body.clone(),
        )
        .await;
        assert_eq!(
            (r.status, r.code()),
            (status, code),
            "{call} {body}: {}",
            r.text
        );
    }
    let r = post(
        &h,
        &format!("/v1/runs/{id}/tool-results/ext1"),
        APP_A,
        json!({"content": "x"}),
    )
    .await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "forbidden"));
    assert_eq!(snapshot(&h).await, before);
    // An error result.
    let id2 = create(&h, SUB_A, json!({"goal": "g"})).await;
    park_for_tool(&*h.log, id2).await;
    let r = post(
        &h,
        &format!("/v1/runs/{id2}/tool-results/ext1"),
        SUB_A,
        json!({"content": "boom", "is_error": true}),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    assert_eq!(
        h.log.inbox(id2).await.unwrap()[0].payload,
        Payload::ToolResult {
            call_id: "ext1".into(),
            content: "boom".into(),
            is_error: true
        }
    );
}

#[tokio::test]
async fn messages_only_at_awaiting_input() {
    let h = harness();
    let id = create(&h, SUB_A, conversational()).await;
    let early = post(
        &h,
        &format!("/v1/runs/{id}/messages"),
        SUB_A,
        json!({"text": "hi"}),
    )
    .await;
    assert_eq!(
        (early.status, early.code()),
        (StatusCode::CONFLICT, "not_awaiting_input")
    );
    park_for_input(&*h.log, id).await;
    let blank = post(
        &h,
        &format!("/v1/runs/{id}/messages"),
        SUB_A,
        json!({"text": "  "}),
    )
    .await;
    assert_eq!(
        (blank.status, blank.code()),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_body")
    );
    let r = post(
        &h,
        &format!("/v1/runs/{id}/messages"),
        SUB_A,
        json!({"text": "next question"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    assert_eq!(
        h.log.inbox(id).await.unwrap()[0].payload,
        Payload::Input {
            text: "next question".into(),
            redactions: Vec::new()
        }
    );
    let again = post(
        &h,
        &format!("/v1/runs/{id}/messages"),
        SUB_A,
        json!({"text": "and another"}),
    )
    .await;
    assert_eq!(
        (again.status, again.code()),
        (StatusCode::CONFLICT, "already_posted")
    );
    let close = send(
        &h.router,
        request(
            Method::POST,
            &format!("/v1/runs/{id}/close"),
            Some(SUB_A),
            None,
        ),
    )
    .await;
    assert_eq!(
        (close.status, close.code()),
        (StatusCode::CONFLICT, "already_posted")
    );
    assert_eq!(h.log.inbox(id).await.unwrap().len(), 1);
}

/// A message or close carrying `head_seq` is posted only while the run's
/// head is still that: a retry whose first attempt landed and was taken
/// (the run moved on) is refused, never taken as the next message.
#[tokio::test]
async fn a_message_with_a_stale_head_is_refused() {
    let h = harness();
    let id = create(&h, SUB_A, conversational()).await;
    park_for_input(&*h.log, id).await;
    let head = h.log.get_run(id).await.unwrap().head_seq;
    for path in ["messages", "close"] {
        let stale = post(
            &h,
            &format!("/v1/runs/{id}/{path}"),
            SUB_A,
            json!({"text": "hi", "head_seq": head - 1}),
        )
        .await;
        assert_eq!(
            (stale.status, stale.code()),
            (StatusCode::CONFLICT, "head_moved"),
            "{path}: {}",
            stale.text
        );
    }
    assert!(h.log.inbox(id).await.unwrap().is_empty(), "nothing posted");
    let r = post(
        &h,
        &format!("/v1/runs/{id}/messages"),
        SUB_A,
        json!({"text": "hi", "head_seq": head}),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    assert_eq!(h.log.inbox(id).await.unwrap().len(), 1);
}

#[tokio::test]
async fn close_a_conversation() {
    let h = harness();
    let id = create(&h, SUB_A, conversational()).await;
    let early = send(
        &h.router,
        request(
            Method::POST,
            &format!("/v1/runs/{id}/close"),
            Some(SUB_A),
            None,
        ),
    )
    .await;
    assert_eq!(
        (early.status, early.code()),
        (StatusCode::CONFLICT, "not_awaiting_input")
    );
    park_for_input(&*h.log, id).await;
    let r = send(
        &h.router,
        request(
            Method::POST,
            &format!("/v1/runs/{id}/close"),
            Some(SUB_A),
            None,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    assert_eq!(
        h.log.inbox(id).await.unwrap()[0].payload,
        Payload::Close {
            text: None,
            redactions: Vec::new()
        }
    );
}

#[tokio::test]
async fn close_with_last_words_or_at_a_budget_pause() {
    let h = harness();
    let id = create(&h, SUB_A, conversational()).await;
    park_for_input(&*h.log, id).await;
    let blank = send(
        &h.router,
        request(
            Method::POST,
            &format!("/v1/runs/{id}/close"),
            Some(SUB_A),
            Some(&json!({ "text": "  " })),
        ),
    )
    .await;
    assert_eq!(
        (blank.status, blank.code()),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_body")
    );
    let r = send(
        &h.router,
        request(
            Method::POST,
            &format!("/v1/runs/{id}/close"),
            Some(SUB_A),
            Some(&json!({ "text": "Thanks, bye!" })),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    assert_eq!(
        h.log.inbox(id).await.unwrap()[0].payload,
        Payload::Close {
            text: Some("Thanks, bye!".into()),
            redactions: Vec::new()
        }
    );

    let paused = create(&h, SUB_A, conversational()).await;
    park_paused(&*h.log, paused, true).await;
    let words = send(
        &h.router,
        request(
            Method::POST,
            &format!("/v1/runs/{paused}/close"),
            Some(SUB_A),
            Some(&json!({ "text": "bye" })),
        ),
    )
    .await;
    assert_eq!(
        (words.status, words.code()),
        (StatusCode::CONFLICT, "not_awaiting_input"),
        "closing words only at awaiting_input"
    );
    let r = send(
        &h.router,
        request(
            Method::POST,
            &format!("/v1/runs/{paused}/close"),
            Some(SUB_A),
            None,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);

    let operator = create(&h, SUB_A, conversational()).await;
    park_paused(&*h.log, operator, false).await;
    let r = send(
        &h.router,
        request(
            Method::POST,
            &format!("/v1/runs/{operator}/close"),
            Some(SUB_A),
            None,
        ),
    )
    .await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::CONFLICT, "not_awaiting_input"),
        "an operator's pause is resumed, not closed"
    );
}

#[tokio::test]
async fn resume_with_and_without_extension() {
    let h = harness();
    // Not paused.
    let id = create(&h, SUB_A, json!({"goal": "g"})).await;
    let r = send(
        &h.router,
        request(
            Method::POST,
            &format!("/v1/runs/{id}/resume"),
            Some(SUB_A),
            None,
        ),
    )
    .await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "not_paused"));
    // Paused by budget + extension: one extend_budget payload (which resumes it).
    park_paused(&*h.log, id, true).await;
    let r = post(
        &h,
        &format!("/v1/runs/{id}/resume"),
        APP_A,
        json!({"extend": {"max_turns": 10}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    assert_eq!(r.body["kinds"], json!(["extend_budget"]));
    let extra = BudgetLimits {
        max_turns: Some(10),
        ..Default::default()
    };
    assert_eq!(
        h.log
            .inbox(id)
            .await
            .unwrap()
            .iter()
            .map(|i| i.payload.clone())
            .collect::<Vec<_>>(),
        vec![Payload::ExtendBudget { extra }]
    );
    let again = send(
        &h.router,
        request(
            Method::POST,
            &format!("/v1/runs/{id}/resume"),
            Some(SUB_A),
            None,
        ),
    )
    .await;
    assert_eq!(
        (again.status, again.code()),
        (StatusCode::CONFLICT, "already_posted")
    );
    // Paused by an operator, no body: a resume.
    let id2 = create(&h, SUB_A, json!({"goal": "g"})).await;
    park_paused(&*h.log, id2, false).await;
    let r = send(
        &h.router,
        request(
            Method::POST,
            &format!("/v1/runs/{id2}/resume"),
            Some(SUB_A),
            None,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    assert_eq!(
        h.log.inbox(id2).await.unwrap()[0].payload,
        Payload::Resume {
            by: Some("a".into())
        }
    );
    // Paused by an operator, with an extension: extend, then resume.
    let id3 = create(&h, SUB_A, json!({"goal": "g"})).await;
    park_paused(&*h.log, id3, false).await;
    let r = post(
        &h,
        &format!("/v1/runs/{id3}/resume"),
        SUB_A,
        json!({"extend": {"max_cost_usd_micros": 5000000}}),
    )
    .await;
    assert_eq!(r.body["kinds"], json!(["extend_budget", "resume"]));
    assert_eq!(h.log.inbox(id3).await.unwrap().len(), 2);
    // Wrong shapes.
    let id4 = create(&h, SUB_A, json!({"goal": "g"})).await;
    park_paused(&*h.log, id4, true).await;
    for body in [
        json!({"extend": {"max_turns": -1}}),
        json!({"extend": 5}),
        json!({"resume": true}),
    ] {
        let r = post(&h, &format!("/v1/runs/{id4}/resume"), SUB_A, body.clone()).await;
        assert_eq!(
            (r.status, r.code()),
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid_body"),
            "{body}"
        );
    }
    assert!(h.log.inbox(id4).await.unwrap().is_empty());
}

#[tokio::test]
async fn pause_posts_a_pause_sets_the_flag_and_a_resume_withdraws_or_resumes_it() {
    let h = harness();
    let id = create(&h, SUB_A, json!({"goal": "g"})).await;
    park_for_approval(&*h.log, id, &[("c1", "refund", json!({"amount": 1}))]).await;
    let r = post(
        &h,
        &format!("/v1/runs/{id}/pause"),
        SUB_A,
        json!({"reason": "audit"}),
    )
    .await;
    assert_eq!(
        (r.status, &r.body["kinds"]),
        (StatusCode::ACCEPTED, &json!(["pause"])),
        "{}",
        r.text
    );
    assert_eq!(
        h.log.inbox(id).await.unwrap()[0].payload,
        Payload::Pause {
            reason: "audit".into(),
            by: Some("a".into())
        }
    );
    assert!(
        h.ledger.signal(id).await.unwrap().paused,
        "the flag tells a busy worker"
    );
    // Twice: refused while the first waits.
    let again = send(
        &h.router,
        request(
            Method::POST,
            &format!("/v1/runs/{id}/pause"),
            Some(SUB_A),
            None,
        ),
    )
    .await;
    assert_eq!(
        (again.status, again.code()),
        (StatusCode::CONFLICT, "already_paused")
    );
    // A resume now withdraws it (posted after the pause) and clears the flag.
    let r = send(
        &h.router,
        request(
            Method::POST,
            &format!("/v1/runs/{id}/resume"),
            Some(SUB_A),
            None,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    let inbox = inbox_of(&h, id).await;
    assert_eq!(
        inbox,
        vec![
            Payload::Pause {
                reason: "audit".into(),
                by: Some("a".into())
            },
            Payload::Resume {
                by: Some("a".into())
            }
        ]
    );
    assert!(!h.ledger.signal(id).await.unwrap().paused);
    // Requested and recorded but not in effect (parked elsewhere): already pausing.
    let pausing = create(&h, SUB_A, json!({"goal": "g"})).await;
    park_for_approval(&*h.log, pausing, &[("c1", "refund", json!({"amount": 1}))]).await;
    commit(
        &*h.log,
        pausing,
        vec![EventKind::SessionPauseRequested {
            reason: "x".into(),
            by: None,
        }],
    )
    .await;
    let r = post(&h, &format!("/v1/runs/{pausing}/pause"), SUB_A, json!({})).await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::CONFLICT, "already_paused")
    );
    let r = post(&h, &format!("/v1/runs/{pausing}/resume"), SUB_A, json!({})).await;
    assert_eq!(
        r.status,
        StatusCode::ACCEPTED,
        "a pending pause is withdrawn: {}",
        r.text
    );
    // Paused by an operator: already paused, until a resume waits in the inbox.
    let paused = create(&h, SUB_A, json!({"goal": "g"})).await;
    park_paused(&*h.log, paused, false).await;
    let r = post(&h, &format!("/v1/runs/{paused}/pause"), SUB_A, json!({})).await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::CONFLICT, "already_paused")
    );
    let r = post(&h, &format!("/v1/runs/{paused}/resume"), SUB_A, json!({})).await;
    assert_eq!(r.body["kinds"], json!(["resume"]), "{}", r.text);
    let r = post(&h, &format!("/v1/runs/{paused}/pause"), SUB_A, json!({})).await;
    assert_eq!(
        r.status,
        StatusCode::ACCEPTED,
        "the waiting resume ends that pause, so it pauses again after it: {}",
        r.text
    );
    // Paused by its budget with a pause requested: the first resume withdraws
    // the pause, the second resumes the budget pause.
    let budget = create(&h, SUB_A, json!({"goal": "g"})).await;
    park_paused(&*h.log, budget, true).await;
    commit(
        &*h.log,
        budget,
        vec![EventKind::SessionPauseRequested {
            reason: "x".into(),
            by: None,
        }],
    )
    .await;
    let r = post(&h, &format!("/v1/runs/{budget}/resume"), SUB_A, json!({})).await;
    assert_eq!(r.body["kinds"], json!(["resume", "resume"]), "{}", r.text);
    // A finished run takes no pause.
    let done = create(&h, SUB_A, json!({"goal": "g"})).await;
    finish(&*h.log, done).await;
    let r = post(&h, &format!("/v1/runs/{done}/pause"), SUB_A, json!({})).await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "run_finished"));
    // Bad input and scopes.
    let r = post(
        &h,
        &format!("/v1/runs/{id}/pause"),
        SUB_A,
        json!({"reasn": "x"}),
    )
    .await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_body"),
        "{}",
        r.text
    );
    let r = post(&h, &format!("/v1/runs/{id}/pause"), APP_A, json!({})).await;
    assert_eq!(
        r.status,
        StatusCode::FORBIDDEN,
        "pausing takes the submit scope"
    );
    let r = post(&h, &format!("/v1/runs/{id}/pause"), SUB_B, json!({})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "another tenant's run");
}

#[tokio::test]
async fn cancel_posts_a_cancel_and_sets_the_flag() {
    let h = harness();
    let id = create(&h, SUB_A, json!({"goal": "g"})).await;
    park_for_approval(&*h.log, id, &[("c1", "refund", json!({"amount": 1}))]).await;
    let r = post(
        &h,
        &format!("/v1/runs/{id}/cancel"),
        SUB_A,
        json!({"reason": "changed my mind"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    assert_eq!(
        h.log.inbox(id).await.unwrap()[0].payload,
        Payload::Cancel {
            reason: "changed my mind".into()
        }
    );
    assert!(h.ledger.is_cancelled(id).await.unwrap());
    assert!(
        h.log
            .outbox(100)
            .await
            .unwrap()
            .iter()
            .any(|(_, j)| *j == Job::resume(id, 9)),
        "a resume wakes a worker"
    );
    // Twice: the same inbox item.
    let again = send(
        &h.router,
        request(
            Method::POST,
            &format!("/v1/runs/{id}/cancel"),
            Some(SUB_A),
            None,
        ),
    )
    .await;
    assert_eq!(again.status, StatusCode::ACCEPTED);
    assert_eq!(again.body["inbox_ids"], r.body["inbox_ids"]);
    assert_eq!(h.log.inbox(id).await.unwrap().len(), 1);
    // A finished run cannot be cancelled, or take any payload.
    let done = create(&h, SUB_A, json!({"goal": "g"})).await;
    finish(&*h.log, done).await;
    let before = snapshot(&h).await;
    for (uri, body) in [
        (format!("/v1/runs/{done}/cancel"), json!({})),
        (format!("/v1/runs/{done}/resume"), json!({})),
        (format!("/v1/runs/{done}/messages"), json!({"text": "hi"})),
        (format!("/v1/runs/{done}/close"), json!({})),
        (
            format!("/v1/runs/{done}/tool-results/c1"),
            json!({"content": "x"}),
        ),
        (
            format!("/v1/runs/{done}/approvals/c1"),
            json!({"decision": "approve"}),
        ),
    ] {
        let r = post(&h, &uri, ADMIN, body).await;
        assert_eq!(
            (r.status, r.code()),
            (StatusCode::CONFLICT, "run_finished"),
            "{uri}"
        );
    }
    assert_eq!(snapshot(&h).await, before);
    assert_eq!(h.queue.depth().await.unwrap(), 0);
}

/// A run's input redact rules apply before anything is stored: the goal in
/// `session.start` (with what matched), user messages and closing words in
/// the inbox. An idempotent repeat of the same submit finds the run.
#[tokio::test]
async fn input_redactions_apply_before_the_goal_and_messages_are_stored() {
    let h = harness();
    let rules = json!({"input": [{"name": "email", "redact": "[\\w.+-]+@[\\w-]+\\.[\\w.]+"}, {"name": "pin", "redact": "\\b\\d{4}\\b", "replacement": "****"}]});
    let body = json!({"goal": "I am ann@example.com, pin 1234", "config": {"conversational": true, "guardrails": rules}});
    let submit = |key: &'static str| {
        let mut req = request(Method::POST, "/v1/runs", Some(SUB_A), Some(&body));
        req.headers_mut()
            .insert("idempotency-key", key.parse().unwrap());
        send(&h.router, req)
    };
    let first = submit("redacted-once").await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text);
    let id: uuid::Uuid = first.body["run_id"].as_str().unwrap().parse().unwrap();
    let events = h.log.events(id, 0, 1).await.unwrap();
    let EventKind::SessionStart {
        goal, redactions, ..
    } = &events[0].kind
    else {
        panic!("{:?}", events[0].kind)
    };
    assert_eq!(goal, "I am [redacted:email], pin ****");
    let matched: Vec<(&str, usize)> = redactions
        .iter()
        .map(|r| (r.guardrail.as_str(), r.count))
        .collect();
    assert_eq!(matched, [("email", 1), ("pin", 1)]);
    let again = submit("redacted-once").await;
    assert_eq!(
        (again.status, again.body["run_id"].clone()),
        (StatusCode::OK, first.body["run_id"].clone()),
        "{}",
        again.text
    );

    park_for_input(&*h.log, id).await;
    let r = post(
        &h,
        &format!("/v1/runs/{id}/messages"),
        SUB_A,
        json!({"text": "write to bob@example.com"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    assert_eq!(
        h.log.inbox(id).await.unwrap()[0].payload,
        Payload::Input {
            text: "write to [redacted:email]".into(),
            redactions: vec![glia_proto::Redaction {
                guardrail: "email".into(),
                count: 1
            }]
        }
    );

    let other = create(
        &h,
        SUB_A,
        json!({"goal": "chat", "config": {"conversational": true, "guardrails": rules}}),
    )
    .await;
    park_for_input(&*h.log, other).await;
    let r = send(
        &h.router,
        request(
            Method::POST,
            &format!("/v1/runs/{other}/close"),
            Some(SUB_A),
            Some(&json!({"text": "bye, 9876"})),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    assert_eq!(
        h.log.inbox(other).await.unwrap()[0].payload,
        Payload::Close {
            text: Some("bye, ****".into()),
            redactions: vec![glia_proto::Redaction {
                guardrail: "pin".into(),
                count: 1
            }]
        }
    );

    let bad = post(
        &h,
        "/v1/runs",
        SUB_A,
        json!({"goal": "g", "config": {"guardrails": {"input": [{"name": "x", "redact": "a*"}]}}}),
    )
    .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", bad.text);
    assert!(
        bad.text.contains("guardrails.input[0].redact"),
        "{}",
        bad.text
    );
}
