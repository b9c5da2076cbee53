//! The console's batches and agents pages, the inbox's next-item redirect
//! and race record, and sign-in-free local use, over HTTP (no browser; the
//! browser story is `tests/fleet/console/console_more_browser.rs`).

use crate::common;
use crate::inbox::{csrf_of, form, page, sign_in};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use common::*;
use glia_backends::{AgentRegistry, Inbox, RunLog};
use glia_dispatcher::{Auth, Principal, Scope};
use glia_proto::{Decision, DecisionChoice, EventKind, Payload, args_hash};
use serde_json::{Value, json};
use uuid::Uuid;

/// A second approver of tenant `a`.
const BOB_A: &str = "tok-bob-a";

/// The common tokens and bob.
fn with_bob() -> H {
    let bob = Principal {
        tenant: "a".into(),
        scopes: vec![Scope::Approve],
        name: Some("bob".into()),
    };
    let ana = Principal {
        tenant: "a".into(),
        scopes: vec![Scope::Approve],
        name: Some("ana".into()),
    };
    let sub = |t: &str| Principal {
        tenant: t.into(),
        scopes: vec![Scope::Submit, Scope::Approve],
        name: None,
    };
    harness_with(
        Auth::from_tokens([
            (SUB_A.to_owned(), sub("a")),
            (SUB_B.to_owned(), sub("b")),
            (APP_A.to_owned(), ana),
            (BOB_A.to_owned(), bob),
        ])
        .unwrap(),
    )
}

fn anonymous(uri: &str) -> Request<Body> {
    Request::builder().uri(uri).body(Body::empty()).unwrap()
}

/// Register `definition` as the next version of `tenant`'s agent.
async fn put_agent(h: &H, tenant: &str, definition: Value) -> u32 {
    let def: glia_proto::AgentDefinition = serde_json::from_value(definition).unwrap();
    let canonical = glia_proto::canonical_json(&serde_json::to_value(&def).unwrap());
    let (v, _) = h
        .log
        .put_agent(tenant, &def.name, &canonical, &def.content_hash())
        .await
        .unwrap();
    v.version
}

#[tokio::test]
async fn agents_pages_list_versions_show_definitions_and_diff_them_escaped() {
    let h = harness();
    let v1 = json!({"name": "triage", "description": "Sorts <script>alert(1)</script> tickets", "model": "script:one", "system": "Be brief."});
    let mut v2 = v1.clone();
    v2["system"] = json!("Be brief. Never <img src=x onerror=alert(2)> refund.");
    assert_eq!(put_agent(&h, "a", v1).await, 1);
    assert_eq!(put_agent(&h, "a", v2).await, 2);
    put_agent(&h, "b", json!({"name": "secret", "model": "script:b"})).await;
    let (cookie, _) = sign_in(&h, APP_A).await;

    let list = send(&h.router, page("/console/agents", &cookie)).await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.text);
    assert!(list.text.contains("data-agent=\"triage\"") && list.text.contains("v2"));
    assert!(
        !list.text.contains("secret"),
        "tenant b's agent is not listed"
    );

    let one = send(&h.router, page("/console/agents/triage", &cookie)).await;
    assert_eq!(one.status, StatusCode::OK);
    assert!(
        one.text.contains("id=\"v1\"") && one.text.contains("id=\"v2\""),
        "both versions"
    );
    assert!(
        !one.text.contains("<script>alert") && !one.text.contains("<img src=x"),
        "definition text is escaped: {}",
        one.text
    );
    assert!(
        one.text
            .contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;")
    );

    let diff = send(
        &h.router,
        page("/console/agents/triage/diff?from=1&to=2", &cookie),
    )
    .await;
    assert_eq!(diff.status, StatusCode::OK, "{}", diff.text);
    let del = diff
        .text
        .split("<span class=\"ddel\">")
        .nth(1)
        .and_then(|t| t.split("</span>").next())
        .unwrap_or_else(|| panic!("no removed line: {}", diff.text));
    let add = diff
        .text
        .split("<span class=\"dadd\">")
        .nth(1)
        .and_then(|t| t.split("</span>").next())
        .unwrap();
    assert_eq!(del, "-   &quot;system&quot;: &quot;Be brief.&quot;,");
    assert!(
        add.starts_with("+   &quot;system&quot;: &quot;Be brief. Never &lt;img src=x"),
        "{add}"
    );
    assert!(diff.text.contains("1 changed line") || diff.text.contains("2 changed lines"));
    assert!(!diff.text.contains("<img src=x"));

    // Another tenant's agent, a missing version, a bad number.
    for (uri, status) in [
        ("/console/agents/secret", StatusCode::NOT_FOUND),
        (
            "/console/agents/secret/diff?from=1&to=1",
            StatusCode::NOT_FOUND,
        ),
        (
            "/console/agents/triage/diff?from=1&to=9",
            StatusCode::NOT_FOUND,
        ),
        (
            "/console/agents/triage/diff?from=x&to=2",
            StatusCode::BAD_REQUEST,
        ),
        ("/console/agents/triage/diff?to=2", StatusCode::BAD_REQUEST),
    ] {
        let r = send(&h.router, page(uri, &cookie)).await;
        assert_eq!(r.status, status, "{uri}: {}", r.text);
    }
    let bad = send(
        &h.router,
        page("/console/agents/triage/diff?from=x&to=2", &cookie),
    )
    .await;
    assert!(
        bad.text
            .contains("from: &quot;x&quot; is not a version number"),
        "{}",
        bad.text
    );
}

#[tokio::test]
async fn batch_pages_show_progress_spend_failures_and_results() {
    let h = harness();
    let evil = "<img src=x onerror=alert(1)>";
    let body = json!({"config": {}, "items": [
        {"custom_id": evil, "goal": "one"},
        {"custom_id": "ok-2", "goal": "two"},
        {"custom_id": "waits-3", "goal": "three"},
    ]});
    let r = post(&h, "/v1/batches", SUB_A, body).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let batch: Uuid = r.body["id"].as_str().unwrap().parse().unwrap();
    let other = create_batch(&h.router, SUB_B).await;
    // Two items become runs; the first fails, the second succeeds.
    glia_dispatcher::batches::admit_once(&h.app).await.unwrap();
    let runs = h
        .log
        .list_runs(&glia_backends::RunFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    let run_of = |goal: &str| {
        runs.iter()
            .find(|r| r.batch_id == Some(batch) && r.goal == goal)
            .map(|r| r.run_id)
            .unwrap_or_else(|| panic!("no run for {goal}: {runs:?}"))
    };
    let (failed, succeeded) = (run_of("one"), run_of("two"));
    commit(
        &*h.log,
        failed,
        vec![EventKind::SessionComplete {
            outcome: glia_proto::Outcome::Failed {
                error: "the model <b>refused</b>".into(),
            },
        }],
    )
    .await;
    commit(
        &*h.log,
        succeeded,
        vec![EventKind::SessionComplete {
            outcome: glia_proto::Outcome::Succeeded {
                answer: "done".into(),
                output: None,
            },
        }],
    )
    .await;
    glia_dispatcher::batches::admit_once(&h.app).await.unwrap();

    let (cookie, _) = sign_in(&h, APP_A).await;
    let list = send(&h.router, page("/console/batches", &cookie)).await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.text);
    assert!(list.text.contains(&batch.to_string()));
    assert!(
        !list.text.contains(&other.to_string()),
        "tenant b's batch is not listed"
    );

    let one = send(
        &h.router,
        page(&format!("/console/batches/{batch}"), &cookie),
    )
    .await;
    assert_eq!(one.status, StatusCode::OK, "{}", one.text);
    assert!(!one.text.contains(evil), "custom ids are escaped");
    assert!(one.text.contains("&lt;img src=x onerror=alert(1)&gt;"));
    assert!(
        one.text
            .contains("the model &lt;b&gt;refused&lt;&#x2f;b&gt;")
    );
    assert!(
        one.text
            .contains(&format!("href=\"/console/runs/{failed}\"")),
        "the failure links its run"
    );
    assert!(
        !one.text.contains("ok-2</code>"),
        "a succeeded item is not a failure"
    );
    for state in ["succeeded", "failed"] {
        assert!(
            one.text.contains(&format!("data-state=\"{state}\"")),
            "{state}: {}",
            one.text
        );
    }
    assert!(one.text.contains("id=\"spend\"><strong>$0."));

    let results = send(
        &h.router,
        page(&format!("/console/batches/{batch}/results"), &cookie),
    )
    .await;
    assert_eq!(results.status, StatusCode::OK);
    assert!(
        results.headers[header::CONTENT_DISPOSITION]
            .to_str()
            .unwrap()
            .starts_with("attachment")
    );
    let lines: Vec<Value> = results
        .text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["custom_id"], evil);
    assert_eq!(lines[1]["status"], "succeeded");
    assert_eq!(
        results.text,
        get(&h, &format!("/v1/batches/{batch}/results"), SUB_A)
            .await
            .text,
        "the same as the API's"
    );

    // The queue names a batch run's batch and item.
    park_for_approval(
        &*h.log,
        run_of("three"),
        &[("c1", "refund", json!({"n": 3}))],
    )
    .await;
    let queue = send(&h.router, page("/inbox", &cookie)).await;
    let row = queue
        .text
        .split("<tr class=\"item")
        .nth(1)
        .unwrap_or_else(|| panic!("no row: {}", queue.text));
    assert!(
        row.contains("<code>waits-3</code>")
            && row.contains(&format!("href=\"/console/batches/{batch}\"")),
        "{row}"
    );

    for uri in [
        format!("/console/batches/{other}"),
        format!("/console/batches/{other}/results"),
        "/console/batches/not-a-uuid".to_owned(),
    ] {
        let r = send(&h.router, page(&uri, &cookie)).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{uri}");
        assert!(!r.text.contains("\"custom_id\""), "{uri}");
    }
}

/// After a decision the approver lands on the next approval waiting, then
/// on the queue when none is left.
#[tokio::test]
async fn a_decision_leads_to_the_next_item() {
    let h = harness();
    let first = create(&h, SUB_A, json!({"goal": "first"})).await;
    park_for_approval(&*h.log, first, &[("c1", "refund", json!({"n": 1}))]).await;
    let second = create(&h, SUB_A, json!({"goal": "second"})).await;
    park_for_approval(&*h.log, second, &[("c/2 x", "refund", json!({"n": 2}))]).await;
    let (cookie, csrf) = sign_in(&h, APP_A).await;
    let decide = |run: Uuid, call: &str, n: i64| {
        let hash = args_hash(&json!({"n": n}));
        form(
            &format!("/inbox/runs/{run}/calls/{call}/decide"),
            Some(&cookie),
            None,
            &[
                ("decision", "approve"),
                ("args_hash", &hash),
                ("csrf", &csrf),
            ],
        )
    };
    let r = send(&h.router, decide(first, "c1", 1)).await;
    assert_eq!(
        (r.status, r.headers[header::LOCATION].to_str().unwrap()),
        (
            StatusCode::SEE_OTHER,
            format!("/inbox/runs/{second}/calls/c%2F2%20x").as_str()
        )
    );
    let card = send(
        &h.router,
        page(&format!("/inbox/runs/{second}/calls/c%2F2%20x"), &cookie),
    )
    .await;
    assert_eq!(card.status, StatusCode::OK, "the link opens the card");
    let r = send(&h.router, decide(second, "c%2F2%20x", 2)).await;
    assert_eq!(
        (r.status, r.headers[header::LOCATION].to_str().unwrap()),
        (StatusCode::SEE_OTHER, "/inbox"),
        "nothing left: the queue"
    );
}

/// Two approvers decide the same call: the second is answered 409 naming
/// the winner (API and page), and its attempt is recorded for the worker to
/// log as `approval.contested`; the history lists it with the decision.
#[tokio::test]
async fn a_race_loser_is_recorded_and_told_who_won() {
    let h = with_bob();
    let run = create(&h, SUB_A, json!({"goal": "refund"})).await;
    let input = json!({"order": "A1"});
    park_for_approval(&*h.log, run, &[("c1", "refund", input.clone())]).await;
    let uri = format!("/v1/runs/{run}/approvals/c1");
    let r = post(&h, &uri, APP_A, json!({"decision": "approve"})).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    // Before the worker applied the winner: named from the inbox.
    let lost = post(
        &h,
        &uri,
        BOB_A,
        json!({"decision": "reject", "reason": "no"}),
    )
    .await;
    assert_eq!(
        (lost.status, lost.code()),
        (StatusCode::CONFLICT, "already_decided")
    );
    let message = lost.body["error"]["message"].as_str().unwrap();
    assert!(message.contains("approved by ana"), "{message}");
    let inbox = h.log.inbox(run).await.unwrap();
    let contested: Vec<_> = inbox
        .iter()
        .filter_map(|i| match &i.payload {
            Payload::ApprovalContested { by, chose, .. } => Some((by.clone(), *chose)),
            _ => None,
        })
        .collect();
    assert_eq!(
        contested,
        vec![(Some("bob".into()), DecisionChoice::Reject)],
        "{inbox:?}"
    );

    // The worker applies both (as it would: the decision, then the record).
    let ids: Vec<i64> = inbox.iter().map(|i| i.id).collect();
    let attempted_at = match &inbox[1].payload {
        Payload::ApprovalContested { attempted_at, .. } => *attempted_at,
        other => panic!("{other:?}"),
    };
    commit_consuming(
        &*h.log,
        run,
        vec![
            EventKind::ApprovalResolved {
                call_id: "c1".into(),
                args_hash: args_hash(&input),
                decision: Decision::Approve,
                by: Some("ana".into()),
            },
            EventKind::ApprovalContested {
                call_id: "c1".into(),
                by: Some("bob".into()),
                chose: DecisionChoice::Reject,
                attempted_at,
            },
        ],
        &ids,
    )
    .await;
    // After: named from the log, on the page too (bob's session).
    let (cookie, csrf) = sign_in(&h, BOB_A).await;
    let r = send(
        &h.router,
        form(
            &format!("/inbox/runs/{run}/calls/c1/decide"),
            Some(&cookie),
            None,
            &[
                ("decision", "approve"),
                ("args_hash", &args_hash(&input)),
                ("csrf", &csrf),
            ],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert!(
        r.text.contains("already decided: approved by ana at "),
        "{}",
        r.text
    );
    assert_eq!(
        h.log
            .inbox(run)
            .await
            .unwrap()
            .iter()
            .filter(|i| matches!(i.payload, Payload::ApprovalContested { .. }))
            .count(),
        1,
        "bob's second attempt is recorded too"
    );

    let history = get(&h, "/v1/approvals/history", APP_A).await;
    let record = &history.body["approvals"][0];
    assert_eq!(record["decided_by"], "ana");
    assert_eq!(record["contested"][0]["by"], "bob");
    assert_eq!(record["contested"][0]["chose"], "reject");
    let page_ = send(&h.router, page("/inbox/history", &cookie)).await;
    assert!(
        page_.text.contains("lost: bob chose reject at"),
        "{}",
        page_.text
    );
}

/// The history page lists decided approvals only: one still waiting is
/// the queue's.
#[tokio::test]
async fn history_lists_decided_items_only() {
    let h = harness();
    let waiting = create(&h, SUB_A, json!({"goal": "waits"})).await;
    park_for_approval(&*h.log, waiting, &[("c1", "refund", json!({"n": 1}))]).await;
    let decided = create(&h, SUB_A, json!({"goal": "decided"})).await;
    let input = json!({"n": 2});
    park_for_approval(&*h.log, decided, &[("c1", "refund", input.clone())]).await;
    commit(
        &*h.log,
        decided,
        vec![EventKind::ApprovalResolved {
            call_id: "c1".into(),
            args_hash: args_hash(&input),
            decision: Decision::Approve,
            by: Some("ana".into()),
        }],
    )
    .await;
    let (cookie, _) = sign_in(&h, APP_A).await;
    let r = send(&h.router, page("/inbox/history", &cookie)).await;
    assert!(r.text.contains(&format!("data-run=\"{decided}\"")));
    assert!(
        !r.text.contains(&format!("data-run=\"{waiting}\"")),
        "{}",
        r.text
    );
}

/// With no tokens configured (`glia dev`, a loopback dispatcher; `serve`
/// refuses any other address, `bad_input::open_mode_acts_as_admin_and_requires_loopback`)
/// the console and inbox open without sign-in, as the API does; forms
/// still need their token. With tokens, they do not.
#[tokio::test]
async fn pages_open_without_sign_in_only_without_tokens() {
    let open = harness_with(Auth::open());
    let run = create(&open, "anything", json!({"goal": "local"})).await;
    let input = json!({"n": 1});
    park_for_approval(&*open.log, run, &[("c1", "refund", input.clone())]).await;
    let mut csrf = String::new();
    for uri in [
        "/inbox",
        "/inbox/history",
        "/console/batches",
        "/console/agents",
    ] {
        let r = send(&open.router, anonymous(uri)).await;
        assert_eq!(r.status, StatusCode::OK, "{uri}: {}", r.text);
        assert!(r.text.contains("no sign-in"), "{uri}");
        if uri == "/inbox" {
            csrf = csrf_of(&r.text);
        }
    }
    let r = send(&open.router, anonymous("/inbox/login")).await;
    assert_eq!(
        (r.status, r.headers[header::LOCATION].to_str().unwrap()),
        (StatusCode::SEE_OTHER, "/inbox")
    );
    let decide = format!("/inbox/runs/{run}/calls/c1/decide");
    let hash = args_hash(&input);
    let fields = [("decision", "approve"), ("args_hash", hash.as_str())];
    let r = send(&open.router, form(&decide, None, None, &fields)).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "no form token: refused");
    let r = send(
        &open.router,
        form(
            &decide,
            None,
            Some("https://evil.example"),
            &[fields.as_slice(), &[("csrf", csrf.as_str())]].concat(),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "another origin: refused");
    assert!(open.log.inbox(run).await.unwrap().is_empty());
    let r = send(
        &open.router,
        form(
            &decide,
            None,
            None,
            &[fields.as_slice(), &[("csrf", csrf.as_str())]].concat(),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert_eq!(open.log.inbox(run).await.unwrap().len(), 1);

    let signed = harness();
    for uri in [
        "/inbox",
        "/console/batches",
        "/console/agents",
        "/console/agents/x/diff?from=1&to=2",
    ] {
        let r = send(&signed.router, anonymous(uri)).await;
        assert_eq!(
            (r.status, r.headers[header::LOCATION].to_str().unwrap()),
            (StatusCode::SEE_OTHER, "/inbox/login"),
            "{uri}"
        );
    }
}

/// Issue 32: the schedules page lists the tenant's schedules (not another
/// tenant's), their rule, next fire time in the zone, and escapes names.
#[tokio::test]
async fn the_schedules_page_lists_the_tenants_schedules() {
    let h = with_bob();
    let mine = post(
        &h,
        "/v1/schedules",
        SUB_A,
        json!({"name": "nightly", "cron": "30 2 * * *", "time_zone": "Europe/Berlin",
               "goal": "<b>Reconcile</b> {{ fire_time }}", "overlap": "buffer_one"}),
    )
    .await;
    assert_eq!(mine.status, StatusCode::CREATED, "{}", mine.text);
    let theirs = post(
        &h,
        "/v1/schedules",
        SUB_B,
        json!({"name": "theirs", "interval_ms": 60000, "goal": "g"}),
    )
    .await;
    assert_eq!(theirs.status, StatusCode::CREATED, "{}", theirs.text);
    let (cookie, _) = sign_in(&h, APP_A).await;
    let list = send(&h.router, page("/console/schedules", &cookie)).await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.text);
    assert!(list.text.contains("nightly"), "{}", list.text);
    assert!(
        list.text.contains("30 2 * * * (Europe&#x2f;Berlin)"),
        "{}",
        list.text
    );
    assert!(list.text.contains("buffer_one"));
    assert!(
        list.text.contains("T02:30:00+0") || list.text.contains("T03:00:00+02:00"),
        "the next fire time in the zone: {}",
        list.text
    );
    assert!(
        !list.text.contains("theirs"),
        "tenant b's schedule is not listed"
    );
    assert!(list.text.contains("href=\"/console/schedules\""));
    let bad = send(&h.router, page("/console/schedules?after=x", &cookie)).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}
