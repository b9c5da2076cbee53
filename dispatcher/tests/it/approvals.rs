//! The approval queue and decisions: first decision wins, decisions bind to
//! their own call and its argument hash, bulk decisions.

use crate::common;

use axum::http::{Method, StatusCode};
use common::*;
use glia_backends::{Inbox, RunLog};
use glia_proto::{ApprovalStatus, Decision, EventKind, Payload, args_hash};
use serde_json::json;

#[tokio::test]
async fn queue_lists_pending_oldest_first_with_filters_and_tenants() {
    let h = harness();
    let r1 = create(&h, SUB_A, json!({"goal": "one"})).await;
    let r2 = create(&h, SUB_A, json!({"goal": "two"})).await;
    let rb = create(&h, SUB_B, json!({"goal": "theirs"})).await;
    park_for_approval(&*h.log, r1, &[("c1", "refund", json!({"amount": 1}))]).await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    park_for_approval(
        &*h.log,
        r2,
        &[
            ("c1", "refund", json!({"amount": 2})),
            ("c2", "email", json!({"to": "x"})),
        ],
    )
    .await;
    park_for_approval(&*h.log, rb, &[("c9", "refund", json!({"amount": 9}))]).await;

    let all = get(&h, "/v1/approvals?status=pending", APP_A).await;
    assert_eq!(all.status, StatusCode::OK, "{}", all.text);
    let rows = all.body["approvals"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "tenant a's only: {}", all.text);
    assert_eq!(rows[0]["run_id"], r1.to_string(), "oldest first");
    assert_eq!(rows[0]["args_hash"], args_hash(&json!({"amount": 1})));
    let refunds = get(&h, "/v1/approvals?tool=refund", APP_A).await;
    assert_eq!(refunds.body["approvals"].as_array().unwrap().len(), 2);
    let of_r2 = get(&h, &format!("/v1/approvals?run_id={r2}"), APP_A).await;
    assert_eq!(of_r2.body["approvals"].as_array().unwrap().len(), 2);
    assert_eq!(
        get(&h, "/v1/approvals", ADMIN).await.body["approvals"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
    // A submit-only token may not see the queue.
    let denied = get(&h, "/v1/approvals", SUB_A).await;
    assert_eq!(
        (denied.status, denied.code()),
        (StatusCode::FORBIDDEN, "forbidden")
    );
    // Decided approvals leave the pending queue but stay in `all`.
    let d = post(
        &h,
        &format!("/v1/runs/{r1}/approvals/c1"),
        APP_A,
        json!({"decision": "approve"}),
    )
    .await;
    assert_eq!(d.status, StatusCode::ACCEPTED, "{}", d.text);
    assert_eq!(
        get(&h, "/v1/approvals", APP_A).await.body["approvals"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let everything = get(&h, "/v1/approvals?status=all", APP_A).await;
    assert_eq!(everything.body["approvals"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn a_decision_is_posted_bound_to_the_pending_hash_and_the_first_wins() {
    let h = harness();
    let id = create(&h, SUB_A, json!({"goal": "g"})).await;
    let input = json!({"amount": 30, "order": "A1"});
    park_for_approval(&*h.log, id, &[("c1", "refund", input.clone())]).await;
    let outbox_before = snapshot(&h).await.outbox;
    let r = post(
        &h,
        &format!("/v1/runs/{id}/approvals/c1"),
        APP_A,
        json!({"decision": "approve", "args_hash": args_hash(&input)}),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    assert_eq!(r.body["call_id"], "c1");
    assert_eq!(r.body["kinds"], json!(["approval"]));
    let inbox = h.log.inbox(id).await.unwrap();
    assert_eq!(inbox.len(), 1);
    assert_eq!(
        inbox[0].payload,
        Payload::Approval {
            call_id: "c1".into(),
            args_hash: args_hash(&input),
            decision: Decision::Approve,
            by: Some("ana".into()),
            request_seq: h
                .log
                .load(id)
                .await
                .unwrap()
                .call("c1")
                .unwrap()
                .requested_seq
        }
    );
    assert_eq!(
        snapshot(&h).await.outbox,
        outbox_before + 1,
        "the post wrote a job"
    );
    // A second decision: 409 naming the winner; nothing written but the
    // record of the losing attempt (for the worker to log).
    let before = snapshot(&h).await;
    let again = post(
        &h,
        &format!("/v1/runs/{id}/approvals/c1"),
        APP_A,
        json!({"decision": "reject", "reason": "no"}),
    )
    .await;
    assert_eq!(
        (again.status, again.code()),
        (StatusCode::CONFLICT, "already_decided")
    );
    assert!(
        again.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("approved by ana (posted, not yet applied)"),
        "{}",
        again.text
    );
    let after = snapshot(&h).await;
    assert_eq!(after.runs, before.runs, "no event");
    assert_eq!(after.outbox, before.outbox + 1, "the record's job");
    let posted = h.log.inbox(id).await.unwrap();
    assert_eq!(posted.len(), 2);
    assert!(
        matches!(&posted[1].payload, Payload::ApprovalContested { by: Some(by), chose: glia_proto::DecisionChoice::Reject, .. } if by == "ana"),
        "{posted:?}"
    );
    // After a worker consumed it, still 409 (the call left the batch).
    let item = inbox[0].id;
    commit_consuming(
        &*h.log,
        id,
        vec![
            EventKind::ApprovalResolved {
                call_id: "c1".into(),
                args_hash: args_hash(&input),
                decision: Decision::Approve,
                by: Some("ana".into()),
            },
            EventKind::ToolResult {
                call_id: "c1".into(),
                content: "ok".into(),
                reminder: None,
                duration_ms: 1,
                redactions: Vec::new(),
            },
        ],
        &[item],
    )
    .await;
    let late = post(
        &h,
        &format!("/v1/runs/{id}/approvals/c1"),
        APP_A,
        json!({"decision": "approve"}),
    )
    .await;
    assert_eq!(
        (late.status, late.code()),
        (StatusCode::CONFLICT, "already_decided")
    );
    // The row carries the decision, the decider and the time, from the log.
    let rows = get(&h, &format!("/v1/approvals?status=all&run_id={id}"), APP_A).await;
    let row = &rows.body["approvals"][0];
    assert_eq!(
        (&row["status"], &row["decision"], &row["decided_by"]),
        (
            &json!("decided"),
            &json!({"kind": "approve"}),
            &json!("ana")
        ),
        "{row}"
    );
    assert!(row["decided_at"].is_string(), "{row}");
    let history = get(&h, "/v1/approvals/history", APP_A).await;
    assert_eq!(
        history.body["approvals"][0]["resolution"], "approved",
        "{}",
        history.body
    );
    assert_eq!(
        get(&h, "/v1/approvals/history", SUB_B).await.body["approvals"],
        json!([]),
        "another tenant sees none of it"
    );
}

#[tokio::test]
async fn refusals_unknown_call_stale_hash_bad_decisions() {
    let h = harness();
    let id = create(&h, SUB_A, json!({"goal": "g"})).await;
    park_for_approval(&*h.log, id, &[("c1", "refund", json!({"amount": 1}))]).await;
    let before = snapshot(&h).await;
    let cases = [
        (
            "c404",
            json!({"decision": "approve"}),
            StatusCode::NOT_FOUND,
            "call_not_found",
        ),
        (
            "c1",
            json!({"decision": "approve", "args_hash": "deadbeef"}),
            StatusCode::CONFLICT,
            "stale_args",
        ),
        (
            "c1",
            json!({"decision": "edit"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            "c1",
            json!({"decision": "edit", "input": [1]}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            "c1",
            json!({"decision": "approve", "input": {"amount": 5}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            "c1",
            json!({"decision": "maybe"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
        (
            "c1",
            json!({"decision": "approve", "extra": 1}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
        ),
    ];
    for (call, body, status, code) in cases {
        let r = post(
            &h,
            &format!("/v1/runs/{id}/approvals/{call}"),
            APP_A,
            body.clone(),
        )
        .await;
        assert_eq!((r.status, r.code()), (status, code), "{body}: {}", r.text);
    }
    // Wrong scope, other tenant.
    let r = post(
        &h,
        &format!("/v1/runs/{id}/approvals/c1"),
        SUB_A,
        json!({"decision": "approve"}),
    )
    .await;
    assert_eq!((r.status, r.code()), (StatusCode::FORBIDDEN, "forbidden"));
    let r = post(
        &h,
        &format!("/v1/runs/{id}/approvals/c1"),
        SUB_B,
        json!({"decision": "approve"}),
    )
    .await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::NOT_FOUND, "run_not_found")
    );
    assert_eq!(snapshot(&h).await, before, "nothing written");
    // A call that needs no approval.
    let ext = create(&h, SUB_A, json!({"goal": "g"})).await;
    park_for_tool(&*h.log, ext).await;
    let r = post(
        &h,
        &format!("/v1/runs/{ext}/approvals/ext1"),
        APP_A,
        json!({"decision": "approve"}),
    )
    .await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::NOT_FOUND, "approval_not_found")
    );
    // An edit with a reason-less reject gets a default reason.
    let r = post(
        &h,
        &format!("/v1/runs/{id}/approvals/c1"),
        APP_A,
        json!({"decision": "reject"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED);
    assert_eq!(
        r.body["decision"],
        json!({"kind": "reject", "reason": "no reason given"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_conflicting_decisions_one_wins() {
    for _ in 0..20 {
        let h = harness();
        let id = create(&h, SUB_A, json!({"goal": "g"})).await;
        park_for_approval(&*h.log, id, &[("c1", "refund", json!({"amount": 1}))]).await;
        let uri = format!("/v1/runs/{id}/approvals/c1");
        let (ra, rb) = (h.router.clone(), h.router.clone());
        let (ua, ub) = (uri.clone(), uri.clone());
        let a = tokio::spawn(async move {
            send(
                &ra,
                request(
                    Method::POST,
                    &ua,
                    Some(APP_A),
                    Some(&json!({"decision": "approve"})),
                ),
            )
            .await
        });
        let b = tokio::spawn(async move {
            send(
                &rb,
                request(
                    Method::POST,
                    &ub,
                    Some(APP_A),
                    Some(&json!({"decision": "reject", "reason": "no"})),
                ),
            )
            .await
        });
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        let mut statuses = [a.status.as_u16(), b.status.as_u16()];
        statuses.sort();
        assert_eq!(statuses, [202, 409], "{} / {}", a.text, b.text);
        let loser = if a.status == StatusCode::CONFLICT {
            &a
        } else {
            &b
        };
        assert_eq!(loser.code(), "already_decided");
        let winner = if a.status == StatusCode::ACCEPTED {
            &a
        } else {
            &b
        };
        let inbox = h.log.inbox(id).await.unwrap();
        let decisions: Vec<_> = inbox
            .iter()
            .filter(|i| matches!(i.payload, Payload::Approval { .. }))
            .collect();
        assert_eq!(decisions.len(), 1, "exactly one decision is posted");
        assert_eq!(inbox.len(), 2, "and the losing attempt's record: {inbox:?}");
        match &decisions[0].payload {
            Payload::Approval { decision, .. } => assert_eq!(
                serde_json::to_value(decision).unwrap(),
                winner.body["decision"]
            ),
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_parallel_calls_decided_out_of_order_each_bind_to_their_own_call() {
    let h = harness();
    let id = create(&h, SUB_A, json!({"goal": "g"})).await;
    let calls = [
        ("c1", "refund", json!({"amount": 1})),
        ("c2", "refund", json!({"amount": 2})),
        ("c3", "email", json!({"to": "x"})),
    ];
    park_for_approval(&*h.log, id, &calls).await;
    let decisions = [
        ("c3", json!({"decision": "reject", "reason": "not now"})),
        (
            "c1",
            json!({"decision": "edit", "input": {"amount": 10}, "args_hash": args_hash(&json!({"amount": 1}))}),
        ),
        (
            "c2",
            json!({"decision": "approve", "args_hash": args_hash(&json!({"amount": 2}))}),
        ),
    ];
    let tasks: Vec<_> = decisions
        .iter()
        .map(|(call, body)| {
            let router = h.router.clone();
            let uri = format!("/v1/runs/{id}/approvals/{call}");
            let body = body.clone();
            tokio::spawn(async move {
                send(
                    &router,
                    request(Method::POST, &uri, Some(APP_A), Some(&body)),
                )
                .await
            })
        })
        .collect();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    }
    let inbox = h.log.inbox(id).await.unwrap();
    assert_eq!(inbox.len(), 3);
    // Each payload names its own call and that call's hash.
    for item in &inbox {
        let Payload::Approval {
            call_id,
            args_hash: hash,
            ..
        } = &item.payload
        else {
            panic!("{:?}", item.payload)
        };
        let (_, _, input) = calls.iter().find(|(c, _, _)| c == call_id).unwrap();
        assert_eq!(
            *hash,
            args_hash(input),
            "{call_id} binds to its own arguments"
        );
    }
    // A worker applying them in inbox order (whatever it is) ends with each call decided as asked.
    let mut kinds = Vec::new();
    for item in &inbox {
        let Payload::Approval {
            call_id,
            args_hash,
            decision,
            by,
            request_seq: Some(_),
        } = item.payload.clone()
        else {
            unreachable!()
        };
        kinds.push(EventKind::ApprovalResolved {
            call_id,
            args_hash,
            decision,
            by,
        });
    }
    let ids: Vec<i64> = inbox.iter().map(|i| i.id).collect();
    commit_consuming(&*h.log, id, kinds, &ids).await;
    let state = h.log.load(id).await.unwrap();
    assert_eq!(state.call("c1").unwrap().approval, ApprovalStatus::Approved);
    assert_eq!(
        state.call("c1").unwrap().input,
        json!({"amount": 10}),
        "the edit applied to c1"
    );
    assert_eq!(state.call("c2").unwrap().approval, ApprovalStatus::Approved);
    assert_eq!(state.call("c2").unwrap().input, json!({"amount": 2}));
    assert_eq!(state.call("c3").unwrap().approval, ApprovalStatus::Rejected);
}

#[tokio::test]
async fn bulk_decisions_report_per_item() {
    let h = harness();
    let r1 = create(&h, SUB_A, json!({"goal": "one"})).await;
    let r2 = create(&h, SUB_A, json!({"goal": "two"})).await;
    let rb = create(&h, SUB_B, json!({"goal": "theirs"})).await;
    park_for_approval(&*h.log, r1, &[("c1", "refund", json!({"amount": 1}))]).await;
    park_for_approval(&*h.log, r2, &[("c1", "refund", json!({"amount": 2}))]).await;
    park_for_approval(&*h.log, rb, &[("c1", "refund", json!({"amount": 3}))]).await;
    let body = json!({"decisions": [
        {"run_id": r1, "call_id": "c1", "decision": "approve"},
        {"run_id": r2, "call_id": "c1", "decision": "reject", "reason": "too much"},
        {"run_id": r1, "call_id": "c1", "decision": "approve"},
        {"run_id": r2, "call_id": "nope", "decision": "approve"},
        {"run_id": rb, "call_id": "c1", "decision": "approve"},
    ]});
    let r = post(&h, "/v1/approvals", APP_A, body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let results = r.body["results"].as_array().unwrap();
    let statuses: Vec<u64> = results
        .iter()
        .map(|x| x["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, vec![202, 202, 409, 404, 404]);
    assert_eq!(results[2]["error"]["code"], "already_decided");
    assert_eq!(results[3]["error"]["code"], "call_not_found");
    assert_eq!(
        results[4]["error"]["code"], "run_not_found",
        "another tenant's run is invisible"
    );
    assert_eq!(h.log.inbox(rb).await.unwrap().len(), 0);

    // Many runs in one request (posted several runs at once): the answers
    // come in request order, and one run's decisions reach its inbox in the
    // order given, also when other runs' decisions are between them.
    let mut runs = Vec::new();
    for i in 0..12 {
        let run = create(&h, SUB_A, json!({"goal": format!("many {i}")})).await;
        park_for_approval(
            &*h.log,
            run,
            &[
                ("c1", "refund", json!({"amount": i})),
                ("c2", "email", json!({"to": i})),
            ],
        )
        .await;
        runs.push(run);
    }
    let mut decisions = Vec::new();
    for run in &runs {
        decisions.push(json!({"run_id": run, "call_id": "c2", "decision": "approve"}));
    }
    for run in &runs {
        decisions
            .push(json!({"run_id": run, "call_id": "c1", "decision": "reject", "reason": "no"}));
    }
    decisions.push(json!({"run_id": runs[3], "call_id": "c2", "decision": "approve"}));
    let r = post(&h, "/v1/approvals", APP_A, json!({"decisions": decisions})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let results = r.body["results"].as_array().unwrap();
    let answered: Vec<(String, String, u64)> = results
        .iter()
        .map(|x| {
            (
                x["run_id"].as_str().unwrap().to_owned(),
                x["call_id"].as_str().unwrap().to_owned(),
                x["status"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut expected: Vec<(String, String, u64)> = runs
        .iter()
        .map(|r| (r.to_string(), "c2".to_owned(), 202))
        .collect();
    expected.extend(runs.iter().map(|r| (r.to_string(), "c1".to_owned(), 202)));
    expected.push((runs[3].to_string(), "c2".to_owned(), 409));
    assert_eq!(
        answered, expected,
        "one answer per decision, in request order; the repeat is refused"
    );
    for run in &runs {
        let calls: Vec<String> = h
            .log
            .inbox(*run)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|item| match item.payload {
                Payload::Approval { call_id, .. } => Some(call_id),
                // The refused repeat's record.
                Payload::ApprovalContested { .. } => None,
                other => panic!("not a decision: {other:?}"),
            })
            .collect();
        assert_eq!(
            calls,
            vec!["c2", "c1"],
            "run {run}: its decisions in the order given"
        );
    }

    // Too many decisions at once.
    let many: Vec<_> = (0..101)
        .map(|_| json!({"run_id": r1, "call_id": "c1", "decision": "approve"}))
        .collect();
    let r = post(&h, "/v1/approvals", APP_A, json!({"decisions": many})).await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_body")
    );
}
