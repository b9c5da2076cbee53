//! Admission, listing, reading runs and events; tenant isolation; relay.

use crate::common;

use axum::http::{Method, StatusCode};
use common::*;
use glia_backends::{Job, JobQueue, Outbox, RunLog};
use glia_proto::EventKind;
use serde_json::json;
use uuid::Uuid;

#[tokio::test]
async fn create_run_commits_run_event_and_job_before_answering() {
    let h = harness();
    let r = post(
        &h,
        "/v1/runs",
        SUB_A,
        json!({"goal": "refund A1", "config": {"model": "m1", "budget": {"max_turns": 5}}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let id: Uuid = r.body["run_id"].as_str().unwrap().parse().unwrap();
    assert_eq!(r.headers["location"], format!("/v1/runs/{id}").as_str());
    assert_eq!(r.body["tenant"], "a");
    assert_eq!(r.body["status"], "runnable");
    assert_eq!(r.body["head_seq"], 1);
    assert_eq!(id.get_version_num(), 7, "run ids are UUIDv7");
    // Committed: the run, its session.start and a job.
    let events = h.log.events(id, 0, 10).await.unwrap();
    assert_eq!(events.len(), 1);
    match &events[0].kind {
        EventKind::SessionStart { goal, config, .. } => {
            assert_eq!(goal, "refund A1");
            assert_eq!(config.model, "m1");
            assert_eq!(config.budget.max_turns, Some(5));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        h.log
            .outbox(10)
            .await
            .unwrap()
            .iter()
            .map(|(_, j)| *j)
            .collect::<Vec<_>>(),
        vec![Job::start(id, 1)]
    );
    // The relay publishes it and marks it done.
    assert_eq!(glia_dispatcher::relay_once(&h.app).await.unwrap(), 1);
    assert!(h.log.outbox(10).await.unwrap().is_empty());
    assert_eq!(h.queue.depth().await.unwrap(), 1);
    let d = h.queue.next().await.unwrap();
    assert_eq!(d.job, Job::start(id, 1));
}

#[tokio::test]
async fn create_run_is_idempotent_per_tenant() {
    let h = harness();
    let body = json!({"goal": "g"});
    let mk = |token: &'static str, key: &'static str, body: serde_json::Value| {
        let mut req = request(Method::POST, "/v1/runs", Some(token), Some(&body));
        req.headers_mut()
            .insert("idempotency-key", key.parse().unwrap());
        req
    };
    let first = send(&h.router, mk(SUB_A, "k-1", body.clone())).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = send(&h.router, mk(SUB_A, "k-1", body.clone())).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text);
    assert_eq!(again.body["run_id"], first.body["run_id"]);
    assert_eq!(snapshot(&h).await.outbox, 1, "the repeat wrote nothing");
    // Same key, other request: conflict, nothing written.
    let before = snapshot(&h).await;
    let other = send(&h.router, mk(SUB_A, "k-1", json!({"goal": "other"}))).await;
    assert_eq!(
        (other.status, other.code()),
        (StatusCode::CONFLICT, "idempotency_conflict")
    );
    assert_eq!(snapshot(&h).await, before);
    // Keys are per tenant.
    let b = send(&h.router, mk(SUB_B, "k-1", body.clone())).await;
    assert_eq!(b.status, StatusCode::CREATED);
    assert_ne!(b.body["run_id"], first.body["run_id"]);
    // A bad key is refused.
    let bad = send(&h.router, mk(SUB_A, "has space", body)).await;
    assert_eq!(
        (bad.status, bad.code()),
        (StatusCode::BAD_REQUEST, "invalid_header")
    );
}

#[tokio::test]
async fn list_and_get_runs_with_filters_pagination_and_tenants() {
    let h = harness();
    let batch = common::create_batch(&h.router, SUB_A).await;
    let mut a_runs = Vec::new();
    for i in 0..5 {
        let body = if i % 2 == 0 {
            json!({"goal": format!("g{i}"), "batch_id": batch})
        } else {
            json!({"goal": format!("g{i}")})
        };
        a_runs.push(create(&h, SUB_A, body).await);
    }
    let b_run = create(&h, SUB_B, json!({"goal": "theirs"})).await;
    finish(&*h.log, a_runs[4]).await;

    // Pagination by cursor, newest first.
    let p1 = get(&h, "/v1/runs?limit=2", SUB_A).await;
    assert_eq!(p1.status, StatusCode::OK, "{}", p1.text);
    let ids = |r: &Reply| {
        r.body["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["run_id"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&p1), vec![a_runs[4].to_string(), a_runs[3].to_string()]);
    let next = p1.body["next_cursor"].as_str().unwrap();
    let p2 = get(&h, &format!("/v1/runs?limit=2&cursor={next}"), SUB_A).await;
    assert_eq!(ids(&p2), vec![a_runs[2].to_string(), a_runs[1].to_string()]);
    let p3 = get(
        &h,
        &format!(
            "/v1/runs?limit=2&cursor={}",
            p2.body["next_cursor"].as_str().unwrap()
        ),
        SUB_A,
    )
    .await;
    assert_eq!(ids(&p3), vec![a_runs[0].to_string()]);
    assert!(p3.body["next_cursor"].is_null(), "last page has no cursor");

    // Filters.
    let in_batch = get(&h, &format!("/v1/runs?batch_id={batch}"), SUB_A).await;
    assert_eq!(ids(&in_batch).len(), 3);
    let done = get(&h, "/v1/runs?status=done", SUB_A).await;
    assert_eq!(ids(&done), vec![a_runs[4].to_string()]);
    let runnable = get(&h, "/v1/runs?status=runnable", SUB_A).await;
    assert_eq!(ids(&runnable).len(), 4);

    // Tenants: b sees only its run; admin sees all, or one tenant on request.
    assert_eq!(
        ids(&get(&h, "/v1/runs", SUB_B).await),
        vec![b_run.to_string()]
    );
    assert_eq!(
        ids(&get(&h, "/v1/runs?tenant=a", SUB_B).await),
        vec![b_run.to_string()],
        "non-admins cannot pick a tenant"
    );
    assert_eq!(ids(&get(&h, "/v1/runs", ADMIN).await).len(), 6);
    assert_eq!(
        ids(&get(&h, "/v1/runs?tenant=b", ADMIN).await),
        vec![b_run.to_string()]
    );

    // Get: own run, other tenant's run is 404, admin sees it.
    let one = get(&h, &format!("/v1/runs/{}", a_runs[0]), SUB_A).await;
    assert_eq!(
        (one.status, one.body["goal"].as_str()),
        (StatusCode::OK, Some("g0"))
    );
    let hidden = get(&h, &format!("/v1/runs/{b_run}"), SUB_A).await;
    assert_eq!(
        (hidden.status, hidden.code()),
        (StatusCode::NOT_FOUND, "run_not_found")
    );
    assert_eq!(
        get(&h, &format!("/v1/runs/{b_run}"), ADMIN).await.status,
        StatusCode::OK
    );
    let missing = get(&h, &format!("/v1/runs/{}", Uuid::now_v7()), SUB_A).await;
    assert_eq!(
        (missing.status, missing.code()),
        (StatusCode::NOT_FOUND, "run_not_found")
    );
}

#[tokio::test]
async fn events_page_by_after_and_limit() {
    let h = harness();
    let id = create(&h, SUB_A, json!({"goal": "g"})).await;
    park_for_approval(&*h.log, id, &[("c1", "refund", json!({"amount": 3}))]).await;
    let all = get(&h, &format!("/v1/runs/{id}/events"), SUB_A).await;
    assert_eq!(all.status, StatusCode::OK, "{}", all.text);
    let seqs = |r: &Reply| {
        r.body["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(seqs(&all), (1..=9).collect::<Vec<_>>());
    assert_eq!(all.body["head_seq"], 9);
    assert_eq!(all.body["events"][0]["type"], "session.start");
    assert_eq!(all.body["events"][8]["type"], "session.pause");
    let page = get(&h, &format!("/v1/runs/{id}/events?after=3&limit=4"), SUB_A).await;
    assert_eq!(seqs(&page), vec![4, 5, 6, 7]);
    assert_eq!(page.body["next_after"], 7);
    let end = get(&h, &format!("/v1/runs/{id}/events?after=9"), SUB_A).await;
    assert_eq!(
        (seqs(&end), end.body["next_after"].as_u64()),
        (vec![], Some(9))
    );
    let other = get(&h, &format!("/v1/runs/{id}/events"), SUB_B).await;
    assert_eq!(
        (other.status, other.code()),
        (StatusCode::NOT_FOUND, "run_not_found")
    );
}

#[tokio::test]
async fn admission_refuses_configs_a_worker_would_fail_on() {
    let h = harness();
    for (body, what) in [
        (json!({"goal": "   "}), "blank goal"),
        (
            json!({"goal": "g", "config": {"policies": [{"tool": "x", "args": "(unclosed", "action": {"kind": "allow"}}]}}),
            "bad regex",
        ),
        (
            json!({"goal": "g", "config": {"external_tools": [{"name": "bad name!", "description": "", "input_schema": {}}]}}),
            "tool name",
        ),
        (
            json!({"goal": "g", "config": {"max_model_calls_per_turn": 0}}),
            "zero calls",
        ),
        (json!({"goal": "g", "config": {"model": ""}}), "blank model"),
    ] {
        let r = post(&h, "/v1/runs", SUB_A, body).await;
        // What the OpenAPI document refuses is `invalid_body`; what only the config's own checks see, `invalid_request`.
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{what}: {}",
            r.text
        );
        assert!(
            ["invalid_body", "invalid_request"].contains(&r.code()),
            "{what}: {}",
            r.text
        );
        assert!(
            r.body["error"]["field"].is_string(),
            "{what} names the field: {}",
            r.text
        );
    }
    assert!(snapshot(&h).await.runs.is_empty());
}

#[tokio::test]
async fn relay_task_wakes_on_admission() {
    let h = harness();
    // Poll rarely: only the wake-up can make the job appear quickly.
    let app = h.app.clone().with_limits(glia_dispatcher::Limits {
        relay_poll: std::time::Duration::from_secs(3600),
        ..Default::default()
    });
    let router = glia_dispatcher::router(app.clone());
    let relay = tokio::spawn(glia_dispatcher::relay(app));
    tokio::time::sleep(std::time::Duration::from_millis(20)).await; // the relay's first pass is over; it sleeps
    let r = send(
        &router,
        request(
            Method::POST,
            "/v1/runs",
            Some(SUB_A),
            Some(&json!({"goal": "g"})),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let d = tokio::time::timeout(std::time::Duration::from_secs(2), h.queue.next())
        .await
        .expect("relayed at once")
        .unwrap();
    assert_eq!(d.job.run_id.to_string(), r.body["run_id"].as_str().unwrap());
    relay.abort();
}
