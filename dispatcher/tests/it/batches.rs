//! Batches on the real Postgres store: submissions stored whole or not at
//! all (JSON and streamed JSON Lines), idempotent submit, admission under
//! per-batch, per-tenant and fleet caps with fair share across tenants,
//! results, cancel, pause and resume, expiry, and a pass that died between
//! creating a run and marking its item (no second run). Runs are moved on by
//! hand-built worker commits (`common::commit`); the process-level tests
//! (dispatcher killed mid-admission, workers, spend caps) are in
//! `tests/fleet/durability/batches.rs`.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use common::{ADMIN, Reply, SUB_A, SUB_B, commit, finish, send};
use glia_backends::batches::{BatchState, BatchStore, Lane};
use glia_backends::memory::{MemoryLedger, MemoryQueue};
use glia_backends::postgres::PgLog;
use glia_backends::testkit::{TestDb, postgres_connect};
use glia_backends::{AgentRegistry, Inbox, RunFilter, RunLog, SpendCap};
use glia_dispatcher::batches::{Admission, BatchConfig, admit_once, share};
use glia_dispatcher::{App, router};
use glia_proto::{EventKind, Outcome};
use serde_json::{Value, json};
use uuid::Uuid;

struct B {
    db: TestDb,
    log: Arc<PgLog>,
    app: App,
    router: axum::Router,
}

async fn harness(admission: Admission) -> B {
    let db = TestDb::new().await;
    let log = Arc::new(db.log().await);
    let app = App::new(
        log.clone(),
        Arc::new(MemoryQueue::default()),
        Arc::new(MemoryLedger::default()),
        common::auth(),
    )
    .with_batches(BatchConfig {
        store: Some(log.clone()),
        admission,
    });
    let router = router(app.clone());
    B {
        db,
        log,
        app,
        router,
    }
}

async fn jsonl(b: &B, token: &str, lines: &[Value], key: Option<&str>) -> Reply {
    let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
    post_raw(b, token, "application/jsonl", body, key).await
}

async fn post_raw(
    b: &B,
    token: &str,
    content_type: &str,
    body: String,
    key: Option<&str>,
) -> Reply {
    let mut req = Request::builder()
        .method(Method::POST)
        .uri("/v1/batches")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, content_type);
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    send(&b.router, req.body(Body::from(body)).unwrap()).await
}

async fn post_json(b: &B, token: &str, uri: &str, body: Value) -> Reply {
    send(
        &b.router,
        common::request(Method::POST, uri, Some(token), Some(&body)),
    )
    .await
}

async fn get(b: &B, token: &str, uri: &str) -> Reply {
    send(
        &b.router,
        common::request(Method::GET, uri, Some(token), None),
    )
    .await
}

fn item(i: usize) -> Value {
    json!({"custom_id": format!("t-{i}"), "goal": "Triage ticket {{ n }}", "inputs": {"n": i},
           "metadata": {"row": i.to_string()}, "tags": ["triage", format!("n-{}", i % 2)]})
}

fn spec() -> Value {
    json!({"config": {"model": "script:x"}})
}

async fn stored_items(b: &B) -> i64 {
    let client = postgres_connect(&b.db.config()).await;
    client
        .query_one("SELECT count(*) FROM batch_items", &[])
        .await
        .unwrap()
        .get(0)
}

async fn stored_batches(b: &B) -> i64 {
    let client = postgres_connect(&b.db.config()).await;
    client
        .query_one("SELECT count(*) FROM batches WHERE managed", &[])
        .await
        .unwrap()
        .get(0)
}

async fn batch_runs(b: &B, batch: Uuid) -> Vec<glia_backends::RunSummary> {
    b.log
        .list_runs(&RunFilter {
            batch_id: Some(batch),
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
}

fn id_of(r: &Reply) -> Uuid {
    r.body["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no id: {}", r.text))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_submission_is_refused_whole_and_stores_nothing() {
    let b = harness(Admission::default()).await;
    // 1,200 good items (three chunks stored) and a malformed line after them.
    let mut lines = vec![spec()];
    lines.extend((0..1200).map(item));
    let mut body: String = lines.iter().map(|l| format!("{l}\n")).collect();
    body.push_str("{\"custom_id\": \"broken\", \"goal\": \n");
    let r = post_raw(&b, SUB_A, "application/x-ndjson", body, None).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert_eq!(r.code(), "malformed_json");
    assert_eq!(r.body["error"]["line"], 1202, "{}", r.text);

    // A repeated custom_id, named with its line.
    let mut lines = vec![spec()];
    lines.extend((0..700).map(item));
    lines.push(item(3));
    let r = jsonl(&b, SUB_A, &lines, None).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert_eq!(
        (
            r.body["error"]["line"].as_u64(),
            r.body["error"]["field"].as_str()
        ),
        (Some(702), Some("custom_id")),
        "{}",
        r.text
    );
    assert!(r.text.contains("t-3"), "{}", r.text);

    // An item of the wrong shape, a goal whose template needs an input it lacks.
    let r = jsonl(
        &b,
        SUB_A,
        &[
            spec(),
            item(0),
            json!({"custom_id": "x", "goal": "g", "colour": "red"}),
        ],
        None,
    )
    .await;
    assert_eq!(
        (r.status, r.body["error"]["line"].as_u64()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some(3)),
        "{}",
        r.text
    );
    let r = jsonl(
        &b,
        SUB_A,
        &[
            spec(),
            json!({"custom_id": "x", "goal": "Ticket {{ missing }}", "inputs": {}}),
        ],
        None,
    )
    .await;
    assert_eq!(
        (
            r.status,
            r.body["error"]["line"].as_u64(),
            r.body["error"]["field"].as_str()
        ),
        (StatusCode::UNPROCESSABLE_ENTITY, Some(2), Some("goal")),
        "{}",
        r.text
    );

    // An unknown agent, a config a run would refuse, no items.
    let r = jsonl(&b, SUB_A, &[json!({"agent": "triage@3"}), item(0)], None).await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("agent_not_found")),
        "{}",
        r.text
    );
    let r = jsonl(&b, SUB_A, &[json!({"agent": "triage@x"}), item(0)], None).await;
    assert_eq!(
        (r.status, r.body["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("agent")),
        "{}",
        r.text
    );
    let r = post_json(
        &b,
        SUB_A,
        "/v1/batches",
        json!({"config": {"output_schema": {"type": "string"}}, "items": [item(0)]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(
        r.body["error"]["field"]
            .as_str()
            .unwrap_or_default()
            .starts_with("config"),
        "{}",
        r.text
    );
    let r = jsonl(&b, SUB_A, &[spec()], None).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    let r = post_json(
        &b,
        SUB_A,
        "/v1/batches",
        json!({"config": {}, "items": [item(0), item(0)]}),
    )
    .await;
    assert_eq!(
        (r.status, r.body["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("items[1].custom_id")),
        "{}",
        r.text
    );

    // Item tags and metadata have the limits of `POST /v1/runs`; metadata
    // values are strings.
    let r = post_json(
        &b,
        SUB_A,
        "/v1/batches",
        json!({"config": {}, "items": [item(0), {"custom_id": "x", "goal": "g", "tags": ["ok", "not ok"]}]}),
    )
    .await;
    assert_eq!(
        (r.status, r.body["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("items[1].tags[1]")),
        "{}",
        r.text
    );
    let long = "v".repeat(257);
    let r = jsonl(
        &b,
        SUB_A,
        &[
            spec(),
            json!({"custom_id": "x", "goal": "g", "metadata": {"k": long}}),
        ],
        None,
    )
    .await;
    assert_eq!(
        (
            r.status,
            r.body["error"]["line"].as_u64(),
            r.body["error"]["field"].as_str()
        ),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some(2),
            Some("metadata.k")
        ),
        "{}",
        r.text
    );
    let r = jsonl(
        &b,
        SUB_A,
        &[
            spec(),
            json!({"custom_id": "x", "goal": "g", "metadata": {"row": 1}}),
        ],
        None,
    )
    .await;
    assert_eq!(
        (r.status, r.body["error"]["line"].as_u64()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some(2)),
        "a metadata value that is not a string: {}",
        r.text
    );

    assert_eq!(
        (stored_batches(&b).await, stored_items(&b).await),
        (0, 0),
        "nothing of a refused batch is stored"
    );
    let r = get(&b, SUB_A, "/v1/batches").await;
    assert_eq!(r.body["batches"], json!([]));
}

/// Put `definition` (JSON) as the next version of tenant `a`'s agent.
async fn put_agent(b: &B, definition: Value) -> u32 {
    let def: glia_proto::AgentDefinition = serde_json::from_value(definition).unwrap();
    let text = serde_json::to_string(&def).unwrap();
    b.log
        .put_agent("a", &def.name, &text, &def.content_hash())
        .await
        .unwrap()
        .0
        .version
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_batch_runs_the_version_current_at_submit() {
    let b = harness(Admission {
        claim_lease: Duration::from_secs(30),
        ..Admission::default()
    })
    .await;
    assert_eq!(
        put_agent(
            &b,
            json!({"name": "triage", "model": "script:v1", "system": "Version one."})
        )
        .await,
        1
    );
    let r = post_json(
        &b,
        SUB_A,
        "/v1/batches",
        json!({"agent": "triage", "items": (0..3).map(item).collect::<Vec<_>>()}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(
        r.body["agent"], "triage@1",
        "the version is pinned at submit: {}",
        r.text
    );
    let batch = id_of(&r);
    // A newer version registered before admission changes nothing for the batch.
    assert_eq!(
        put_agent(
            &b,
            json!({"name": "triage", "model": "script:v2", "system": "Version two."})
        )
        .await,
        2
    );
    assert_eq!(admit_once(&b.app).await.unwrap(), 3);
    let runs = batch_runs(&b, batch).await;
    assert_eq!(runs.len(), 3);
    for run in runs {
        let first = b.log.events(run.run_id, 0, 1).await.unwrap();
        let EventKind::SessionStart { config, .. } = &first[0].kind else {
            panic!("{:?}", first[0].kind)
        };
        assert_eq!(
            (
                config.model.as_str(),
                config.agent.as_ref().map(|a| (a.name.as_str(), a.version))
            ),
            ("script:v1", Some(("triage", 1)))
        );
    }
    // Another tenant cannot name tenant a's agent.
    let r = post_json(
        &b,
        SUB_B,
        "/v1/batches",
        json!({"agent": "triage", "items": [item(0)]}),
    )
    .await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("agent_not_found")),
        "{}",
        r.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_config_patches_the_batch_config_for_its_run_only() {
    let b = harness(Admission::default()).await;
    let base = json!({"config": {"model": "script:base", "system": "Shared.", "budget": {"max_turns": 7}}});
    // A patch that makes a config a run would refuse is refused at submit, naming the line and the field.
    for (bad, field) in [
        (
            json!({"budget": {"max_turns": "seven"}}),
            "config.budget.max_turns",
        ),
        (json!({"compactor": {"keep": 3}}), "config.compactor"),
        (json!({"model": ""}), "config.model"),
    ] {
        let r = jsonl(
            &b,
            SUB_A,
            &[
                base.clone(),
                item(0),
                json!({"custom_id": "bad", "goal": "g", "config": bad}),
            ],
            None,
        )
        .await;
        assert_eq!(
            (
                r.status,
                r.body["error"]["line"].as_u64(),
                r.body["error"]["field"].as_str()
            ),
            (StatusCode::UNPROCESSABLE_ENTITY, Some(3), Some(field)),
            "{bad}: {}",
            r.text
        );
    }
    // Not with an agent (the definition is the config).
    put_agent(
        &b,
        json!({"name": "triage", "model": "script:v1", "system": "One."}),
    )
    .await;
    let r = post_json(&b, SUB_A, "/v1/batches", json!({"agent": "triage", "items": [{"custom_id": "a", "goal": "g", "config": {"model": "script:other"}}]})).await;
    assert_eq!(
        (r.status, r.body["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("items[0].config")),
        "{}",
        r.text
    );
    assert_eq!(
        (stored_batches(&b).await, stored_items(&b).await),
        (0, 0),
        "nothing of a refused batch is stored"
    );

    // Item 1 changes the model and the system prompt; `null` removes the budget (back to the default).
    let items = [
        json!({"custom_id": "plain", "goal": "g0"}),
        json!({"custom_id": "own", "goal": "g1", "config": {"model": "script:own", "system": "Mine."}}),
        json!({"custom_id": "unbudgeted", "goal": "g2", "config": {"budget": null}}),
    ];
    let r = jsonl(&b, SUB_A, &[&[base.clone()][..], &items[..]].concat(), None).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let batch = id_of(&r);
    assert_eq!(admit_once(&b.app).await.unwrap(), 3);
    let mut seen = std::collections::BTreeMap::new();
    for run in batch_runs(&b, batch).await {
        let first = b.log.events(run.run_id, 0, 1).await.unwrap();
        let EventKind::SessionStart { config, goal, .. } = &first[0].kind else {
            panic!("{:?}", first[0].kind)
        };
        seen.insert(
            goal.clone(),
            (
                config.model.clone(),
                config.system.clone(),
                config.budget.max_turns,
            ),
        );
    }
    let system = |s: &str| s.to_owned();
    assert_eq!(
        seen,
        [
            (
                "g0".to_owned(),
                ("script:base".to_owned(), system("Shared."), Some(7))
            ),
            (
                "g1".to_owned(),
                ("script:own".to_owned(), system("Mine."), Some(7))
            ),
            (
                "g2".to_owned(),
                (
                    "script:base".to_owned(),
                    system("Shared."),
                    glia_proto::BudgetLimits::default().max_turns
                )
            ),
        ]
        .into()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_is_idempotent_per_tenant() {
    let b = harness(Admission::default()).await;
    let lines: Vec<Value> = std::iter::once(spec()).chain((0..3).map(item)).collect();
    let first = jsonl(&b, SUB_A, &lines, Some("k1")).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text);
    assert_eq!(first.body["total"], 3);
    assert_eq!(first.body["counts"]["queued"], 3);
    let again = jsonl(&b, SUB_A, &lines, Some("k1")).await;
    assert_eq!(
        (again.status, id_of(&again)),
        (StatusCode::OK, id_of(&first))
    );
    let other: Vec<Value> = std::iter::once(spec()).chain((0..4).map(item)).collect();
    let conflict = jsonl(&b, SUB_A, &other, Some("k1")).await;
    assert_eq!(
        (conflict.status, conflict.code()),
        (StatusCode::CONFLICT, "idempotency_conflict")
    );
    // Another tenant's key space is its own.
    let b_first = jsonl(&b, SUB_B, &lines, Some("k1")).await;
    assert_eq!(b_first.status, StatusCode::CREATED);
    assert_eq!(stored_items(&b).await, 6);
    // JSON too.
    let body = json!({"config": {}, "items": [item(0)]});
    let j1 = send(&b.router, keyed(SUB_A, &body, "j")).await;
    let j2 = send(&b.router, keyed(SUB_A, &body, "j")).await;
    assert_eq!(
        (j1.status, j2.status, id_of(&j1)),
        (StatusCode::CREATED, StatusCode::OK, id_of(&j2))
    );
    // Another tenant cannot see it.
    assert_eq!(
        get(&b, SUB_B, &format!("/v1/batches/{}", id_of(&j1)))
            .await
            .code(),
        "batch_not_found"
    );
}

fn keyed(token: &str, body: &Value, key: &str) -> Request<Body> {
    let mut req = common::request(Method::POST, "/v1/batches", Some(token), Some(body));
    req.headers_mut()
        .insert("idempotency-key", key.parse().unwrap());
    req
}

async fn succeed(log: &dyn RunLog, run_id: Uuid, answer: &str) {
    commit(
        log,
        run_id,
        vec![EventKind::SessionComplete {
            outcome: Outcome::Succeeded {
                answer: answer.into(),
                output: None,
            },
        }],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_are_admitted_within_the_batch_cap_and_collected() {
    let b = harness(Admission {
        claim_lease: Duration::from_secs(30),
        ..Admission::default()
    })
    .await;
    let r = post_json(
        &b,
        SUB_A,
        "/v1/batches",
        json!({"config": {"model": "script:x"}, "options": {"max_in_flight": 3}, "items": (0..10).map(item).collect::<Vec<_>>()}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let batch = id_of(&r);
    assert_eq!(admit_once(&b.app).await.unwrap(), 3);
    assert_eq!(
        admit_once(&b.app).await.unwrap(),
        0,
        "the batch's cap holds"
    );
    let runs = batch_runs(&b, batch).await;
    assert_eq!(runs.len(), 3);
    // Items start in submission order, goals rendered with their inputs.
    let mut goals: Vec<&str> = runs.iter().map(|r| r.goal.as_str()).collect();
    goals.sort();
    assert_eq!(
        goals,
        ["Triage ticket 0", "Triage ticket 1", "Triage ticket 2"]
    );
    let status = get(&b, SUB_A, &format!("/v1/batches/{batch}")).await;
    assert_eq!(
        (
            status.body["counts"]["queued"].as_u64(),
            status.body["counts"]["running"].as_u64()
        ),
        (Some(7), Some(3)),
        "{}",
        status.text
    );

    // Finish runs as they come; every pass fills the freed slots.
    let mut finished = BTreeSet::new();
    loop {
        let live: Vec<_> = batch_runs(&b, batch)
            .await
            .into_iter()
            .filter(|r| !finished.contains(&r.run_id))
            .collect();
        assert!(
            live.len() <= 3,
            "at most max_in_flight runs live: {}",
            live.len()
        );
        if live.is_empty() {
            break;
        }
        for run in live {
            if run.goal.ends_with('7') {
                finish(&*b.log, run.run_id).await
            } else {
                succeed(&*b.log, run.run_id, &format!("done: {}", run.goal)).await
            }
            finished.insert(run.run_id);
        }
        admit_once(&b.app).await.unwrap();
    }
    let runs = batch_runs(&b, batch).await;
    assert_eq!(runs.len(), 10, "one run per item");
    // Each run carries its item's custom_id, metadata and tags.
    for run in &runs {
        let n = run.goal.trim_start_matches("Triage ticket ");
        assert_eq!(run.custom_id.as_deref(), Some(format!("t-{n}").as_str()));
        assert_eq!(run.metadata, [("row".to_owned(), n.to_owned())].into());
        let parity: u32 = n.parse::<u32>().unwrap() % 2;
        assert_eq!(run.tags, ["triage".to_owned(), format!("n-{parity}")]);
    }
    let odd = get(
        &b,
        SUB_A,
        &format!("/v1/runs?batch_id={batch}&tag=triage&tag=n-1&meta=row%3D7"),
    )
    .await;
    assert_eq!(odd.status, StatusCode::OK, "{}", odd.text);
    assert_eq!(
        odd.body["runs"].as_array().unwrap().len(),
        1,
        "{}",
        odd.text
    );
    assert_eq!(odd.body["runs"][0]["custom_id"], "t-7");
    let status = get(&b, SUB_A, &format!("/v1/batches/{batch}")).await;
    assert_eq!(status.body["status"], "completed", "{}", status.text);
    assert_eq!(
        (
            status.body["counts"]["succeeded"].as_u64(),
            status.body["counts"]["failed"].as_u64()
        ),
        (Some(9), Some(1))
    );

    let results = get(&b, SUB_A, &format!("/v1/batches/{batch}/results")).await;
    assert_eq!(results.status, StatusCode::OK);
    assert_eq!(results.headers[header::CONTENT_TYPE], "application/jsonl");
    let lines: Vec<Value> = results
        .text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 10);
    let ids: BTreeSet<&str> = lines
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 10, "each custom_id once");
    let t4 = lines.iter().find(|l| l["custom_id"] == "t-4").unwrap();
    assert_eq!(
        (
            t4["status"].as_str(),
            t4["answer"].as_str(),
            &t4["metadata"]
        ),
        (
            Some("succeeded"),
            Some("done: Triage ticket 4"),
            &json!({"row": "4"})
        )
    );
    assert_eq!(t4["usage"], json!({"tokens": 0, "usd_micros": 0}));
    let t7 = lines.iter().find(|l| l["custom_id"] == "t-7").unwrap();
    assert_eq!(
        (t7["status"].as_str(), t7["error"].as_str()),
        (Some("failed"), Some("test"))
    );

    // Listing.
    let list = get(&b, SUB_A, "/v1/batches").await;
    assert_eq!(list.body["batches"].as_array().unwrap().len(), 1);
    assert_eq!(
        get(&b, SUB_B, "/v1/batches").await.body["batches"],
        json!([])
    );
    assert_eq!(
        get(&b, ADMIN, "/v1/batches").await.body["batches"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_share_the_fleet_cap_fairly() {
    let b = harness(Admission {
        max_in_flight: 10,
        per_tenant: 4,
        ..Admission::default()
    })
    .await;
    let big = post_json(
        &b,
        SUB_A,
        "/v1/batches",
        json!({"config": {}, "items": (0..50).map(item).collect::<Vec<_>>()}),
    )
    .await;
    let small = post_json(
        &b,
        SUB_B,
        "/v1/batches",
        json!({"config": {}, "items": (0..5).map(item).collect::<Vec<_>>()}),
    )
    .await;
    admit_once(&b.app).await.unwrap();
    let (a_runs, b_runs) = (
        batch_runs(&b, id_of(&big)).await.len(),
        batch_runs(&b, id_of(&small)).await.len(),
    );
    assert_eq!(
        (a_runs, b_runs),
        (4, 4),
        "an even split, each tenant at its cap"
    );
    // Tenant B's runs finish: B's last item starts; A stays at its tenant cap.
    for run in batch_runs(&b, id_of(&small)).await {
        succeed(&*b.log, run.run_id, "ok").await;
    }
    admit_once(&b.app).await.unwrap();
    assert_eq!(
        batch_runs(&b, id_of(&big)).await.len(),
        4,
        "A is held at its tenant cap"
    );
    assert_eq!(batch_runs(&b, id_of(&small)).await.len(), 5);
}

fn lane(tenant: &str, in_flight: u64, waiting: u64, max: Option<u32>) -> Lane {
    Lane {
        batch_id: Uuid::now_v7(),
        tenant: tenant.into(),
        state: BatchState::Active,
        max_in_flight: max,
        cap: SpendCap::default(),
        in_flight,
        waiting,
    }
}

#[test]
fn fair_share_follows_weights_and_caps() {
    let a = Admission {
        per_tenant: 100,
        weights: BTreeMap::from([("a".to_owned(), 3)]),
        ..Admission::default()
    };
    let lanes = vec![lane("a", 0, 1000, None), lane("b", 0, 1000, None)];
    let g = share(&lanes, 40, &a);
    assert_eq!(
        (g[&lanes[0].batch_id], g[&lanes[1].batch_id]),
        (30, 10),
        "3:1 by weight"
    );
    // A busy tenant gets nothing until the other catches up.
    let lanes = vec![lane("a", 20, 1000, None), lane("b", 0, 1000, None)];
    let g = share(&lanes, 10, &Admission::default());
    assert_eq!(
        (g.get(&lanes[0].batch_id), g[&lanes[1].batch_id]),
        (None, 10)
    );
    // A batch's own cap and its waiting items bound its grant; two batches of one tenant split its share.
    let lanes = vec![
        lane("a", 0, 2, None),
        lane("b", 0, 100, Some(4)),
        lane("c", 0, 100, None),
        lane("c", 0, 100, None),
    ];
    let g = share(&lanes, 30, &Admission::default());
    assert_eq!(
        (
            g[&lanes[0].batch_id],
            g[&lanes[1].batch_id],
            g[&lanes[2].batch_id],
            g[&lanes[3].batch_id]
        ),
        (2, 4, 12, 12)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_pause_resume_and_expiry() {
    let b = harness(Admission {
        max_in_flight: 2,
        ..Admission::default()
    })
    .await;
    let r = post_json(
        &b,
        SUB_A,
        "/v1/batches",
        json!({"config": {}, "items": (0..6).map(item).collect::<Vec<_>>()}),
    )
    .await;
    let batch = id_of(&r);
    // Paused: nothing starts; resumed: items start again.
    assert_eq!(
        post_json(&b, SUB_A, &format!("/v1/batches/{batch}/pause"), json!({}))
            .await
            .body["status"],
        "paused"
    );
    assert_eq!(admit_once(&b.app).await.unwrap(), 0);
    let resumed = send(
        &b.router,
        Request::builder()
            .method(Method::POST)
            .uri(format!("/v1/batches/{batch}/resume"))
            .header(header::AUTHORIZATION, format!("Bearer {SUB_A}"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(resumed.body["status"], "active", "{}", resumed.text);
    assert_eq!(admit_once(&b.app).await.unwrap(), 2);
    // Cancel: the two runs get a cancel, the four queued items are cancelled, nothing more starts.
    let c = post_json(&b, SUB_A, &format!("/v1/batches/{batch}/cancel"), json!({})).await;
    assert_eq!(c.status, StatusCode::OK, "{}", c.text);
    assert_eq!(
        (
            c.body["status"].as_str(),
            c.body["counts"]["cancelled"].as_u64()
        ),
        (Some("cancelled"), Some(4)),
        "{}",
        c.text
    );
    for run in batch_runs(&b, batch).await {
        assert!(
            b.log
                .inbox(run.run_id)
                .await
                .unwrap()
                .iter()
                .any(|i| matches!(i.payload, glia_proto::Payload::Cancel { .. })),
            "run {} got a cancel",
            run.run_id
        );
    }
    assert_eq!(admit_once(&b.app).await.unwrap(), 0);
    // A cancel is final: pause and resume answer 409 `batch_ended`, and change nothing.
    for action in ["resume", "pause"] {
        let r = post_json(
            &b,
            SUB_A,
            &format!("/v1/batches/{batch}/{action}"),
            json!({}),
        )
        .await;
        assert_eq!(
            (r.status, r.code()),
            (StatusCode::CONFLICT, "batch_ended"),
            "{action}: {}",
            r.text
        );
    }
    assert_eq!(
        get(&b, SUB_A, &format!("/v1/batches/{batch}")).await.body["status"],
        "cancelled"
    );

    // Expiry: items not started when the window closes expire.
    let r = post_json(&b, SUB_B, "/v1/batches", json!({"config": {}, "options": {"completion_window_secs": 3600}, "items": [item(0), item(1)]})).await;
    let late = id_of(&r);
    let client = postgres_connect(&b.db.config()).await;
    client
        .execute(
            "UPDATE batches SET expires_at = now() - interval '1 second' WHERE id = $1",
            &[&late],
        )
        .await
        .unwrap();
    admit_once(&b.app).await.unwrap();
    let s = get(&b, SUB_B, &format!("/v1/batches/{late}")).await;
    assert_eq!(
        (
            s.body["counts"]["expired"].as_u64(),
            s.body["status"].as_str()
        ),
        (Some(2), Some("expired")),
        "{}",
        s.text
    );
    assert!(batch_runs(&b, late).await.is_empty());
    let results = get(&b, SUB_B, &format!("/v1/batches/{late}/results")).await;
    for line in results
        .text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
    {
        assert_eq!(
            (line["status"].as_str(), line["error_code"].as_str()),
            (Some("expired"), Some("expired")),
            "{line}"
        );
    }
    let r = post_json(&b, SUB_B, &format!("/v1/batches/{late}/pause"), json!({})).await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::CONFLICT, "batch_ended"),
        "{}",
        r.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_that_died_after_creating_a_run_creates_no_second_one() {
    let b = harness(Admission {
        claim_lease: Duration::ZERO,
        ..Admission::default()
    })
    .await;
    let r = post_json(
        &b,
        SUB_A,
        "/v1/batches",
        json!({"config": {"model": "script:x"}, "items": (0..4).map(item).collect::<Vec<_>>()}),
    )
    .await;
    let batch = id_of(&r);
    // A pass claimed two items and created the first one's run, then died.
    let store: &dyn BatchStore = &*b.log;
    let claimed = store
        .claim(batch, 2, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    // (It created the run as the pass does: the item's tags and metadata.)
    let labels = &item(claimed[0].n as usize);
    let body = json!({"goal": claimed[0].goal, "config": {"model": "script:x"}, "batch_id": batch,
                      "tags": labels["tags"], "metadata": labels["metadata"]});
    let mut req = common::request(Method::POST, "/v1/runs", Some(SUB_A), Some(&body));
    req.headers_mut().insert(
        "idempotency-key",
        format!("glia-batch:{batch}:{}", claimed[0].custom_id)
            .parse()
            .unwrap(),
    );
    let orphan = send(&b.router, req).await;
    assert_eq!(orphan.status, StatusCode::CREATED, "{}", orphan.text);
    // The next dispatcher's pass takes the lapsed claims again.
    assert_eq!(admit_once(&b.app).await.unwrap(), 4);
    let runs = batch_runs(&b, batch).await;
    assert_eq!(runs.len(), 4, "one run per item, none twice");
    assert!(
        runs.iter()
            .any(|r| r.run_id.to_string() == orphan.body["run_id"].as_str().unwrap()),
        "the dead pass's run is the item's run"
    );
    let results = get(&b, SUB_A, &format!("/v1/batches/{batch}/results")).await;
    let t0 = results
        .text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["custom_id"] == claimed[0].custom_id.as_str())
        .unwrap();
    assert_eq!(t0["run_id"], orphan.body["run_id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_of_batches_with_nothing_left_to_admit_still_hold_their_slots() {
    let b = harness(Admission {
        max_in_flight: 4,
        ..Admission::default()
    })
    .await;
    let first = id_of(
        &post_json(
            &b,
            SUB_A,
            "/v1/batches",
            json!({"config": {}, "items": (0..3).map(item).collect::<Vec<_>>()}),
        )
        .await,
    );
    assert_eq!(admit_once(&b.app).await.unwrap(), 3);
    // A paused batch's runs too.
    let second = id_of(
        &post_json(
            &b,
            SUB_B,
            "/v1/batches",
            json!({"config": {}, "items": (0..5).map(item).collect::<Vec<_>>()}),
        )
        .await,
    );
    assert_eq!(
        admit_once(&b.app).await.unwrap(),
        1,
        "the fleet cap counts the first batch's three runs"
    );
    post_json(&b, SUB_B, &format!("/v1/batches/{second}/pause"), json!({})).await;
    let third = id_of(
        &post_json(
            &b,
            ADMIN,
            "/v1/batches",
            json!({"config": {}, "items": (0..5).map(item).collect::<Vec<_>>()}),
        )
        .await,
    );
    assert_eq!(
        admit_once(&b.app).await.unwrap(),
        0,
        "the paused batch's run still holds its slot"
    );
    for run in batch_runs(&b, first).await {
        succeed(&*b.log, run.run_id, "ok").await;
    }
    assert_eq!(admit_once(&b.app).await.unwrap(), 3);
    assert_eq!(batch_runs(&b, third).await.len(), 3);
}
