//! Tenancy answers the same for "not yours" and "not there": for every
//! route that takes an id, tenant B naming tenant A's run, batch, webhook,
//! agent or call gets exactly what B gets for an id that does not exist —
//! 404 with the same code and message (but for the id) — never a 500, never
//! a 403 that tells the id exists. B holds every scope, so a 403 can only
//! come from ownership. The owner's own request is the control: it finds the
//! resource (anything but 404 and 5xx), so the test cannot pass by every
//! answer being 404.
//!
//! The routes come from the OpenAPI document the dispatcher serves: a route
//! whose path parameter this test cannot fill fails the test, so a new
//! route is covered when it is added. Beside them: the inbox pages
//! (server-rendered, not in the document), `POST /v1/runs` naming a
//! `batch_id`, and bulk decisions naming a run. SSE answers
//! (`text/event-stream`) never end: for those only status and headers are
//! read. Real Postgres (the store whose ownership check answered 500).

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use common::park_for_approval;
use glia_backends::Inbox;
use glia_backends::memory::{MemoryLedger, MemoryQueue};
use glia_backends::postgres::PgLog;
use glia_backends::testkit::TestDb;
use glia_dispatcher::batches::BatchConfig;
use glia_dispatcher::webhooks::{WebhookConfig, WebhookPolicy};
use glia_dispatcher::{App, Auth, Principal, Scope};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;
use uuid::Uuid;

const A: &str = "tok-tenant-a";
const B: &str = "tok-tenant-b";

struct T {
    _db: TestDb,
    log: Arc<PgLog>,
    router: Router,
}

async fn harness() -> T {
    let db = TestDb::new().await;
    let log = Arc::new(db.log().await);
    let all = [Scope::Submit, Scope::Approve, Scope::Agents, Scope::Erase];
    let p = |t: &str| Principal {
        tenant: t.into(),
        scopes: all.to_vec(),
        name: Some(format!("user-{t}")),
    };
    let auth = Auth::from_tokens([(A.to_owned(), p("a")), (B.to_owned(), p("b"))]).unwrap();
    let app = App::new(
        log.clone(),
        Arc::new(MemoryQueue::default()),
        Arc::new(MemoryLedger::default()),
        auth,
    )
    .with_batches(BatchConfig {
        store: Some(log.clone()),
        admission: Default::default(),
    })
    .with_webhooks(WebhookConfig {
        store: Some(log.clone()),
        policy: WebhookPolicy {
            allow_hosts: vec!["127.0.0.1".into()],
            ..WebhookPolicy::default()
        },
        public_url: None,
    })
    .with_schedules(log.clone())
    .with_evals(log.clone());
    T {
        router: glia_dispatcher::router(app),
        log,
        _db: db,
    }
}

/// An answer: status, content type, and the body (not read for SSE).
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    content_type: String,
    body: String,
}

async fn call(router: &Router, req: Request<Body>) -> Answer {
    let res = tokio::time::timeout(Duration::from_secs(60), router.clone().oneshot(req))
        .await
        .expect("an answer within 60 s")
        .unwrap();
    let status = res.status();
    let content_type = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    if content_type.starts_with("text/event-stream") {
        // An event stream does not end: never read it.
        return Answer {
            status,
            content_type,
            body: String::new(),
        };
    }
    let bytes = tokio::time::timeout(Duration::from_secs(60), res.into_body().collect())
        .await
        .expect("a body within 60 s")
        .unwrap()
        .to_bytes();
    Answer {
        status,
        content_type,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

fn api(method: &Method, uri: &str, token: &str, body: Option<&Value>) -> Request<Body> {
    let b = Request::builder()
        .method(method.clone())
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {token}"));
    match body {
        Some(v) => b
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(v.to_string()))
            .unwrap(),
        None => b.body(Body::empty()).unwrap(),
    }
}

/// Tenant A's things, and ids of things that do not exist.
struct Ids {
    run: Uuid,
    batch: Uuid,
    webhook: Uuid,
    schedule: Uuid,
    experiment: Uuid,
    /// The agent's name, also the name of a dataset of A's.
    agent: String,
    missing: Uuid,
}

impl Ids {
    /// `path` with its parameters filled: A's things (`owned`) or ones that
    /// do not exist. Panics on a parameter it does not know.
    fn fill(&self, path: &str, owned: bool) -> String {
        let id = match path {
            _ if !owned => self.missing.to_string(),
            p if p.starts_with("/v1/runs/") => self.run.to_string(),
            p if p.starts_with("/v1/batches/") => self.batch.to_string(),
            p if p.starts_with("/v1/webhooks/") => self.webhook.to_string(),
            p if p.starts_with("/v1/schedules/") => self.schedule.to_string(),
            p if p.starts_with("/v1/experiments/") => self.experiment.to_string(),
            p if p.contains("{id}") => {
                panic!("{path}: the test does not know what {{id}} names; add it here")
            }
            _ => String::new(),
        };
        let name = if owned {
            self.agent.clone()
        } else {
            "nobody-made-this".to_owned()
        };
        let filled = path
            .replace("{id}", &id)
            .replace("{call_id}", "c1")
            .replace("{name}", &name)
            .replace("{version}", "1");
        assert!(
            !filled.contains('{'),
            "{path}: a path parameter the test cannot fill; add it here"
        );
        filled
    }

    /// The body with every id of this test replaced by `<id>`, so answers
    /// about A's thing and about a missing one compare equal when they say
    /// the same.
    fn neutral(&self, body: &str) -> String {
        body.replace(&self.run.to_string(), "<id>")
            .replace(&self.batch.to_string(), "<id>")
            .replace(&self.webhook.to_string(), "<id>")
            .replace(&self.schedule.to_string(), "<id>")
            .replace(&self.experiment.to_string(), "<id>")
            .replace(&self.missing.to_string(), "<id>")
            .replace(&self.agent, "<name>")
            .replace("nobody-made-this", "<name>")
    }
}

/// A body the route accepts from its owner (the checks under test come
/// after the body is read).
fn body_for(method: &str, path: &str) -> Option<Value> {
    match (method, path) {
        ("post", p) if p.ends_with("/approvals/{call_id}") => Some(json!({"decision": "approve"})),
        ("post", p) if p.ends_with("/tool-results/{call_id}") => Some(json!({"content": "42"})),
        ("post", p) if p.ends_with("/messages") => Some(json!({"text": "hello"})),
        ("post", p) if p.ends_with("/backfill") => {
            Some(json!({"from": "2025-01-01T00:00:00Z", "to": "2025-01-01T02:00:00Z"}))
        }
        ("patch", _) => Some(json!({})),
        ("post", _) => Some(json!({})),
        ("put", "/v1/agents/{name}") => None,
        _ => None,
    }
}

/// Every (method, path) of the OpenAPI document with a path parameter.
fn routes_with_ids() -> Vec<(String, String)> {
    let doc = glia_dispatcher::openapi();
    let mut routes = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        if !path.contains('{') {
            continue;
        }
        for method in item
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| ["get", "post", "put", "delete", "patch"].contains(&k.as_str()))
        {
            routes.push((method.clone(), path.clone()));
        }
    }
    routes.sort();
    routes
}

/// The id (field `field`) of what a 201 answer created.
fn created_id(answer: &Answer, field: &str) -> Uuid {
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    serde_json::from_str::<Value>(&answer.body).unwrap()[field]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

async fn tenant_a_things(t: &T) -> Ids {
    let created = call(
        &t.router,
        api(
            &Method::POST,
            "/v1/runs",
            A,
            Some(&json!({"goal": "refund A1"})),
        ),
    )
    .await;
    let run = created_id(&created, "run_id");
    park_for_approval(&*t.log, run, &[("c1", "refund", json!({"amount": 1}))]).await;
    let batch = call(
        &t.router,
        api(
            &Method::POST,
            "/v1/batches",
            A,
            Some(&json!({"config": {}, "items": [{"custom_id": "x", "goal": "g"}]})),
        ),
    )
    .await;
    let batch = created_id(&batch, "id");
    let hook = call(
        &t.router,
        api(
            &Method::POST,
            "/v1/webhooks",
            A,
            Some(&json!({"url": "http://127.0.0.1:9/hook"})),
        ),
    )
    .await;
    let webhook = created_id(&hook, "id");
    let agent = "a-support".to_owned();
    let def = json!({"name": agent, "model": "script:x", "system": "You help."});
    let put = call(
        &t.router,
        api(&Method::PUT, &format!("/v1/agents/{agent}"), A, Some(&def)),
    )
    .await;
    assert_eq!(put.status, StatusCode::CREATED, "{}", put.body);
    let created = call(
        &t.router,
        api(
            &Method::POST,
            "/v1/schedules",
            A,
            Some(
                &json!({"name": "nightly", "cron": "0 * * * *", "time_zone": "Europe/Berlin",
                         "goal": "Reconcile the tickets of {{ fire_time }}"}),
            ),
        ),
    )
    .await;
    let schedule = created_id(&created, "id");
    // A dataset named as the agent, and an experiment over it.
    let put = call(
        &t.router,
        api(
            &Method::PUT,
            &format!("/v1/datasets/{agent}"),
            A,
            Some(&json!({"cases": [{"id": "c1", "goal": "g"}]})),
        ),
    )
    .await;
    assert_eq!(put.status, StatusCode::CREATED, "{}", put.body);
    let created = call(
        &t.router,
        api(
            &Method::POST,
            "/v1/experiments",
            A,
            Some(
                &json!({"eval": {"name": "e", "dataset": agent, "agents": [agent],
                "graders": [{"kind": "contains", "value": "x"}]}}),
            ),
        ),
    )
    .await;
    let experiment = created_id(&created, "id");
    Ids {
        run,
        batch,
        webhook,
        schedule,
        experiment,
        agent,
        missing: Uuid::now_v7(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_id_answers_as_a_missing_one_on_every_route() {
    let t = harness().await;
    let ids = tenant_a_things(&t).await;
    let routes = routes_with_ids();
    assert!(
        routes.len() >= 20,
        "the document lists the routes with ids: {routes:?}"
    );
    let mut checked = Vec::new();
    for (method, path) in &routes {
        // A name is a tenant's own namespace: B's PUT of A's agent name
        // registers B's agent (checked below: A's stays untouched).
        if method == "put" {
            continue;
        }
        let m: Method = method.to_uppercase().parse().unwrap();
        let body = body_for(method, path);
        let theirs = call(&t.router, api(&m, &ids.fill(path, true), B, body.as_ref())).await;
        let missing = call(&t.router, api(&m, &ids.fill(path, false), B, body.as_ref())).await;
        assert_eq!(
            theirs.status,
            StatusCode::NOT_FOUND,
            "{method} {path}: tenant B on tenant A's: {theirs:?}"
        );
        assert_eq!(
            (
                theirs.status,
                &theirs.content_type,
                ids.neutral(&theirs.body)
            ),
            (
                missing.status,
                &missing.content_type,
                ids.neutral(&missing.body)
            ),
            "{method} {path}: another tenant's answers as a missing one"
        );
        checked.push((method.clone(), path.clone()));
    }
    // The controls, after every check (they change things; the delete last):
    // the owner finds each one.
    let mut controls = checked.clone();
    controls.sort_by_key(|(m, _)| m == "delete");
    for (method, path) in &controls {
        let m: Method = method.to_uppercase().parse().unwrap();
        let mine = call(
            &t.router,
            api(
                &m,
                &ids.fill(path, true),
                A,
                body_for(method, path).as_ref(),
            ),
        )
        .await;
        assert!(
            mine.status != StatusCode::NOT_FOUND && !mine.status.is_server_error(),
            "{method} {path}: the owner's own request finds it (the check above can fail): {mine:?}"
        );
        if path.ends_with("/stream") {
            assert!(
                mine.content_type.starts_with("text/event-stream"),
                "{method} {path}: {mine:?}"
            );
        }
    }
    // A's agent is A's, whatever B registers under its name.
    let def = json!({"name": ids.agent, "model": "script:y", "system": "B's own."});
    assert_eq!(
        call(
            &t.router,
            api(
                &Method::PUT,
                &format!("/v1/agents/{}", ids.agent),
                B,
                Some(&def)
            )
        )
        .await
        .status,
        StatusCode::CREATED
    );
    let a_agent = call(
        &t.router,
        api(&Method::GET, &format!("/v1/agents/{}", ids.agent), A, None),
    )
    .await;
    assert!(
        a_agent.body.contains("script:x") && !a_agent.body.contains("script:y"),
        "{a_agent:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_names_only_its_own_tenants_batch() {
    let t = harness().await;
    let ids = tenant_a_things(&t).await;
    let submit = |token: &'static str, batch: Uuid| {
        api(
            &Method::POST,
            "/v1/runs",
            token,
            Some(&json!({"goal": "g", "batch_id": batch})),
        )
    };
    let theirs = call(&t.router, submit(B, ids.batch)).await;
    let missing = call(&t.router, submit(B, ids.missing)).await;
    assert_eq!(theirs.status, StatusCode::NOT_FOUND, "{theirs:?}");
    assert!(theirs.body.contains("\"batch_not_found\""), "{theirs:?}");
    assert_eq!(
        (theirs.status, ids.neutral(&theirs.body)),
        (missing.status, ids.neutral(&missing.body))
    );
    // Nothing was created in either case; the owner's own batch takes the run.
    let b_runs = call(&t.router, api(&Method::GET, "/v1/runs", B, None)).await;
    assert_eq!(
        serde_json::from_str::<Value>(&b_runs.body).unwrap()["runs"],
        json!([]),
        "{b_runs:?}"
    );
    let mine = call(&t.router, submit(A, ids.batch)).await;
    assert_eq!(mine.status, StatusCode::CREATED, "{mine:?}");
    // Listing by another tenant's batch shows nothing, as for a missing one.
    let list = |batch: Uuid| api(&Method::GET, &format!("/v1/runs?batch_id={batch}"), B, None);
    let (theirs, missing) = (
        call(&t.router, list(ids.batch)).await,
        call(&t.router, list(ids.missing)).await,
    );
    assert_eq!(
        (theirs.status, &theirs.body),
        (missing.status, &missing.body)
    );
    assert_eq!(theirs.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_decisions_and_inbox_pages_answer_the_same_for_another_tenants_run() {
    let t = harness().await;
    let ids = tenant_a_things(&t).await;
    // Bulk decisions: one result per decision, A's run as a missing one.
    let bulk =
        |run: Uuid| json!({"decisions": [{"run_id": run, "call_id": "c1", "decision": "approve"}]});
    let theirs = call(
        &t.router,
        api(&Method::POST, "/v1/approvals", B, Some(&bulk(ids.run))),
    )
    .await;
    let missing = call(
        &t.router,
        api(&Method::POST, "/v1/approvals", B, Some(&bulk(ids.missing))),
    )
    .await;
    assert_eq!(
        serde_json::from_str::<Value>(&theirs.body).unwrap()["results"][0]["status"],
        404,
        "{theirs:?}"
    );
    assert_eq!(
        (theirs.status, ids.neutral(&theirs.body)),
        (missing.status, ids.neutral(&missing.body))
    );

    // The inbox, signed in as B (who may approve).
    let login = Request::builder()
        .method(Method::POST)
        .uri("/inbox/login")
        .header(header::HOST, "glia.test")
        .header(header::ORIGIN, "http://glia.test")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("token={B}")))
        .unwrap();
    let res = t.router.clone().oneshot(login).await.unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    let cookie = res.headers()[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let queue = call(
        &t.router,
        Request::builder()
            .uri("/inbox")
            .header(header::COOKIE, &cookie)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(queue.status, StatusCode::OK);
    assert!(
        !queue.body.contains(&ids.run.to_string()),
        "A's approval is not in B's queue"
    );
    let csrf = queue
        .body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_owned();
    let get = |uri: String| {
        Request::builder()
            .uri(uri)
            .header(header::COOKIE, &cookie)
            .body(Body::empty())
            .unwrap()
    };
    let form = |uri: String, fields: &[(&str, &str)]| {
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(fields)
            .extend_pairs([("csrf", csrf.as_str())])
            .finish();
        Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header(header::HOST, "glia.test")
            .header(header::ORIGIN, "http://glia.test")
            .header(header::COOKIE, &cookie)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(body))
            .unwrap()
    };
    let hash = glia_proto::args_hash(&json!({"amount": 1}));
    let pages = |run: Uuid| {
        vec![
            // The inbox's old run page redirects here for anyone (it reads nothing).
            ("run page", get(format!("/console/runs/{run}"))),
            ("call page", get(format!("/inbox/runs/{run}/calls/c1"))),
            (
                "edit preview",
                form(
                    format!("/inbox/runs/{run}/calls/c1/edit"),
                    &[("input", "{\"amount\": 2}")],
                ),
            ),
            (
                "decide",
                form(
                    format!("/inbox/runs/{run}/calls/c1/decide"),
                    &[("decision", "approve"), ("args_hash", hash.as_str())],
                ),
            ),
        ]
    };
    for ((what, theirs), (_, missing)) in pages(ids.run).into_iter().zip(pages(ids.missing)) {
        let (theirs, missing) = (
            call(&t.router, theirs).await,
            call(&t.router, missing).await,
        );
        assert_eq!(theirs.status, StatusCode::NOT_FOUND, "{what}: {theirs:?}");
        assert_eq!(
            (theirs.status, ids.neutral(&theirs.body)),
            (missing.status, ids.neutral(&missing.body)),
            "{what}"
        );
    }
    assert!(
        t.log.inbox(ids.run).await.unwrap().is_empty(),
        "nothing was posted to A's run"
    );
}
