//! Health, readiness, metrics, the OpenAPI document; relay and reconciler.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::http::{Method, StatusCode, header};
use common::*;
use futures::stream::BoxStream;
use glia_backends::memory::MemoryLog;
use glia_backends::{
    Approvals, Delivery, Inbox, Job, JobQueue, Ledger, LedgerError, Outbox, QueueError, RunLog,
};
use glia_dispatcher::{App, Reconciler};
use glia_proto::{EventKind, LiveEvent, Payload};
use serde_json::{Value, json};
use uuid::Uuid;

struct DownQueue;

#[async_trait]
impl JobQueue for DownQueue {
    async fn publish(&self, _: &Job) -> Result<(), QueueError> {
        Err(QueueError::Unavailable("broker down".into()))
    }
    async fn next(&self) -> Result<Delivery, QueueError> {
        std::future::pending().await
    }
    async fn next_resume(&self) -> Result<Delivery, QueueError> {
        std::future::pending().await
    }
    async fn depth(&self) -> Result<u64, QueueError> {
        Err(QueueError::Unavailable("broker down".into()))
    }
}

/// A broker whose confirms take a moment (as RabbitMQ's do), over the twin.
struct SlowQueue(Arc<glia_backends::memory::MemoryQueue>);

#[async_trait]
impl JobQueue for SlowQueue {
    async fn publish(&self, job: &Job) -> Result<(), QueueError> {
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.0.publish(job).await
    }
    async fn next(&self) -> Result<Delivery, QueueError> {
        self.0.next().await
    }
    async fn next_resume(&self) -> Result<Delivery, QueueError> {
        self.0.next_resume().await
    }
    async fn depth(&self) -> Result<u64, QueueError> {
        self.0.depth().await
    }
}

struct DownLedger;

#[async_trait]
impl Ledger for DownLedger {
    async fn cancel(&self, _: Uuid) -> Result<(), LedgerError> {
        Err(LedgerError::Unavailable("redis down".into()))
    }
    async fn is_cancelled(&self, _: Uuid) -> Result<bool, LedgerError> {
        Err(LedgerError::Unavailable("redis down".into()))
    }
    async fn set_paused(&self, _: Uuid, _: bool) -> Result<(), LedgerError> {
        Err(LedgerError::Unavailable("redis down".into()))
    }
    async fn signal(&self, _: Uuid) -> Result<glia_backends::Signal, LedgerError> {
        Err(LedgerError::Unavailable("redis down".into()))
    }
    async fn publish_live(&self, _: Uuid, _: &LiveEvent) -> Result<(), LedgerError> {
        Err(LedgerError::Unavailable("redis down".into()))
    }
    async fn subscribe_live(&self, _: Uuid) -> Result<BoxStream<'static, LiveEvent>, LedgerError> {
        Err(LedgerError::Unavailable("redis down".into()))
    }
    async fn ready(&self) -> Result<(), LedgerError> {
        Err(LedgerError::Unavailable("redis down".into()))
    }
}

#[tokio::test]
async fn health_and_readiness() {
    let h = harness();
    let r = send(&h.router, request(Method::GET, "/healthz", None, None)).await;
    assert_eq!(
        (r.status, r.body["status"].as_str()),
        (StatusCode::OK, Some("ok"))
    );
    let r = send(&h.router, request(Method::GET, "/readyz", None, None)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        r.body["checks"],
        json!({"event_log": "ok", "job_queue": "ok", "ledger": "ok"})
    );

    let app = App::new(
        Arc::new(MemoryLog::default()),
        Arc::new(DownQueue),
        Arc::new(DownLedger),
        auth(),
    );
    let router = glia_dispatcher::router(app);
    let r = send(&router, request(Method::GET, "/readyz", None, None)).await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::SERVICE_UNAVAILABLE, "not_ready")
    );
    assert_eq!(r.body["checks"]["event_log"], "ok");
    assert!(
        r.body["checks"]["job_queue"]
            .as_str()
            .unwrap()
            .contains("broker down")
    );
    assert!(
        r.body["checks"]["ledger"]
            .as_str()
            .unwrap()
            .contains("redis down")
    );
    let msg = r.body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("job_queue") && msg.contains("ledger") && !msg.contains("event_log"),
        "{msg}"
    );
    // Health does not depend on the ports.
    assert_eq!(
        send(&router, request(Method::GET, "/healthz", None, None))
            .await
            .status,
        StatusCode::OK
    );
}

/// A dispatcher still connecting: live, not ready (naming what it waits
/// for), every other route 503 `not_ready` with `Retry-After`; once the
/// gate opens, the app answers, readiness included.
#[tokio::test]
async fn a_starting_dispatcher_is_live_but_not_ready_until_its_gate_opens() {
    let startup = glia_dispatcher::Startup::new(&["event_log", "job_queue", "ledger"]);
    startup.set("event_log", "ok");
    startup.set("job_queue", "connecting: broker down");
    let gate = glia_dispatcher::Gate::new(startup.clone(), false);
    let router = gate.router();
    assert_eq!(
        send(&router, request(Method::GET, "/healthz", None, None))
            .await
            .status,
        StatusCode::OK
    );
    let r = send(&router, request(Method::GET, "/readyz", None, None)).await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::SERVICE_UNAVAILABLE, "not_ready")
    );
    assert_eq!(
        r.body["checks"],
        json!({"api": "starting", "event_log": "ok", "job_queue": "connecting: broker down", "ledger": "connecting"})
    );
    let msg = r.body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("job_queue: connecting: broker down")
            && msg.contains("ledger: connecting")
            && !msg.contains("event_log"),
        "{msg}"
    );
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
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::SERVICE_UNAVAILABLE, "not_ready")
    );
    assert_eq!(
        r.headers
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    assert!(!gate.is_open());
    // Every service connected but the app not yet serving: still not ready,
    // so nobody is told "ready" and then refused.
    startup.set("job_queue", "ok");
    startup.set("ledger", "ok");
    let r = send(&router, request(Method::GET, "/readyz", None, None)).await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::SERVICE_UNAVAILABLE, "not_ready"),
        "{}",
        r.text
    );
    assert_eq!(r.body["checks"]["api"], "starting");

    let h = harness();
    gate.open(h.app.clone());
    assert!(gate.is_open());
    let r = send(&router, request(Method::GET, "/readyz", None, None)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
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
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
}

#[tokio::test]
async fn cancel_works_without_a_ledger() {
    // The posted cancel is the durable part; the flag is best effort.
    let log = Arc::new(MemoryLog::default());
    let app = App::new(
        log.clone(),
        Arc::new(glia_backends::memory::MemoryQueue::default()),
        Arc::new(DownLedger),
        auth(),
    );
    let router = glia_dispatcher::router(app);
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
    let id = r.body["run_id"].as_str().unwrap();
    let c = send(
        &router,
        request(
            Method::POST,
            &format!("/v1/runs/{id}/cancel"),
            Some(SUB_A),
            None,
        ),
    )
    .await;
    assert_eq!(c.status, StatusCode::ACCEPTED, "{}", c.text);
    let id: Uuid = id.parse().unwrap();
    assert!(matches!(
        log.inbox(id).await.unwrap()[0].payload,
        Payload::Cancel { .. }
    ));
}

#[tokio::test]
async fn metrics_count_requests_admissions_and_payloads() {
    let h = harness();
    let id = create(&h, SUB_A, json!({"goal": "g"})).await;
    park_for_approval(&*h.log, id, &[("c1", "refund", json!({"amount": 1}))]).await;
    post(
        &h,
        &format!("/v1/runs/{id}/approvals/c1"),
        APP_A,
        json!({"decision": "approve"}),
    )
    .await;
    get(&h, "/nope", SUB_A).await;
    let r = send(&h.router, request(Method::GET, "/metrics", None, None)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let text = r.text;
    for line in [
        "glia_dispatcher_runs_admitted_total 1",
        r#"glia_dispatcher_payloads_posted_total{kind="approval"} 1"#,
        r#"glia_dispatcher_http_requests_total{route="/v1/runs",method="POST",status="201"} 1"#,
        r#"glia_dispatcher_http_requests_total{route="/v1/runs/{id}/approvals/{call_id}",method="POST",status="202"} 1"#,
        r#"glia_dispatcher_http_requests_total{route="unmatched",method="GET",status="404"} 1"#,
        "# TYPE glia_dispatcher_http_request_duration_seconds histogram",
        "# TYPE glia_dispatcher_sse_streams gauge",
        "# EOF",
    ] {
        assert!(
            text.lines().any(|l| l == line || l.starts_with(line)),
            "missing {line:?} in\n{text}"
        );
    }
}

/// Every endpoint the API promises, as (method, OpenAPI path).
const ENDPOINTS: &[(&str, &str)] = &[
    ("post", "/v1/runs"),
    ("get", "/v1/runs"),
    ("get", "/v1/runs/{id}"),
    ("delete", "/v1/runs/{id}"),
    ("get", "/v1/runs/{id}/events"),
    ("get", "/v1/runs/{id}/events/stream"),
    ("get", "/v1/approvals"),
    ("post", "/v1/approvals"),
    ("get", "/v1/approvals/history"),
    ("post", "/v1/webhooks"),
    ("get", "/v1/webhooks"),
    ("delete", "/v1/webhooks/{id}"),
    ("get", "/v1/webhooks/{id}/deliveries"),
    ("post", "/v1/batches"),
    ("get", "/v1/batches"),
    ("get", "/v1/batches/{id}"),
    ("get", "/v1/batches/{id}/results"),
    ("get", "/v1/batches/{id}/stream"),
    ("post", "/v1/batches/{id}/cancel"),
    ("post", "/v1/batches/{id}/pause"),
    ("post", "/v1/batches/{id}/resume"),
    // Issue 32, schedules.
    ("post", "/v1/schedules"),
    ("get", "/v1/schedules"),
    ("get", "/v1/schedules/{id}"),
    ("patch", "/v1/schedules/{id}"),
    ("delete", "/v1/schedules/{id}"),
    ("post", "/v1/schedules/{id}/pause"),
    ("post", "/v1/schedules/{id}/unpause"),
    ("post", "/v1/schedules/{id}/backfill"),
    // Issue 31, evals.
    ("put", "/v1/datasets/{name}"),
    ("get", "/v1/datasets"),
    ("get", "/v1/datasets/{name}"),
    ("post", "/v1/experiments"),
    ("get", "/v1/experiments"),
    ("get", "/v1/experiments/{id}"),
    ("post", "/v1/experiments/{id}/cancel"),
    ("post", "/v1/runs/{id}/approvals/{call_id}"),
    ("post", "/v1/runs/{id}/tool-results/{call_id}"),
    ("post", "/v1/runs/{id}/messages"),
    ("post", "/v1/runs/{id}/pause"),
    ("post", "/v1/runs/{id}/resume"),
    ("post", "/v1/runs/{id}/cancel"),
    ("post", "/v1/runs/{id}/close"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
    ("put", "/v1/agents/{name}"),
    ("get", "/v1/agents"),
    ("get", "/v1/agents/{name}"),
    ("get", "/v1/agents/{name}/versions/{version}"),
    ("post", "/v1/events"),
];

#[tokio::test]
async fn openapi_documents_every_route_and_every_documented_route_exists() {
    let h = harness();
    let r = send(&h.router, request(Method::GET, "/openapi.json", None, None)).await;
    assert_eq!(r.status, StatusCode::OK);
    let doc = r.body;
    assert_eq!(doc, glia_dispatcher::openapi());
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    let paths = doc["paths"].as_object().unwrap();
    let mut documented = Vec::new();
    for (path, item) in paths {
        for method in item
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| ["get", "post", "put", "delete", "patch"].contains(&k.as_str()))
        {
            documented.push((method.clone(), path.clone()));
        }
    }
    documented.sort();
    let mut expected: Vec<(String, String)> = ENDPOINTS
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    expected.sort();
    assert_eq!(
        documented, expected,
        "the document lists exactly the API's endpoints"
    );
    // Every operation has an id, and no two share one (OpenAPI requires it;
    // the generated clients under clients/ rely on it).
    let mut ids: Vec<&str> = paths
        .values()
        .flat_map(|item| item.as_object().unwrap().values())
        .filter(|op| op.get("responses").is_some())
        .map(|op| op["operationId"].as_str().expect("an operationId"))
        .collect();
    let count = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), count, "operationIds are unique: {ids:?}");
    // Each documented route is served (not a route_not_found / method_not_allowed).
    for (method, path) in &documented {
        let uri = path
            .replace("{id}", &Uuid::now_v7().to_string())
            .replace("{call_id}", "c1")
            .replace("{name}", "support")
            .replace("{version}", "1");
        let m: Method = method.to_uppercase().parse().unwrap();
        let r = send(&h.router, request(m.clone(), &uri, Some(ADMIN), None)).await;
        if r.status.is_client_error() {
            assert!(
                !["route_not_found", "method_not_allowed"].contains(&r.code()),
                "{method} {path} is not routed: {}",
                r.text
            );
        }
    }
    // Every referenced schema exists; the hand-written ones are in.
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for name in [
        "RunSummary",
        "Event",
        "RunConfig",
        "BudgetLimits",
        "ApprovalRow",
        "Decision",
        "ErrorBody",
        "CreateRun",
        "Accepted",
    ] {
        assert!(schemas.contains_key(name), "missing schema {name}");
    }
    let text = doc.to_string();
    for reference in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
        let name = reference.split('"').next().unwrap();
        assert!(schemas.contains_key(name), "dangling $ref {name}");
    }
    assert!(doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer");
}

fn assert_required(schema: &Value, instance: &Value, what: &str) {
    for field in schema["required"].as_array().unwrap() {
        assert!(
            instance.get(field.as_str().unwrap()).is_some(),
            "{what} lacks documented field {field}: {instance}"
        );
    }
    for key in instance.as_object().unwrap().keys() {
        assert!(
            schema["properties"].get(key).is_some(),
            "{what} has undocumented field {key}"
        );
    }
}

#[tokio::test]
async fn hand_written_schemas_match_the_real_json() {
    let h = harness();
    let doc = glia_dispatcher::openapi();
    let schemas = &doc["components"]["schemas"];
    let id = create(
        &h,
        SUB_A,
        json!({"goal": "g", "config": {"budget": {"max_turns": 3}}}),
    )
    .await;
    park_for_approval(&*h.log, id, &[("c1", "refund", json!({"amount": 1}))]).await;
    let run = get(&h, &format!("/v1/runs/{id}"), SUB_A).await.body;
    assert_required(&schemas["RunSummary"], &run, "RunSummary");
    let events = get(&h, &format!("/v1/runs/{id}/events"), SUB_A).await.body;
    let types: Vec<Value> = schemas["Event"]["properties"]["type"]["enum"]
        .as_array()
        .unwrap()
        .clone();
    for e in events["events"].as_array().unwrap() {
        assert_required(&schemas["Event"], e, "Event");
        assert!(
            types.contains(&e["type"]),
            "{} not in the documented types",
            e["type"]
        );
    }
    let approvals = get(&h, "/v1/approvals", APP_A).await.body;
    assert_required(
        &schemas["ApprovalRow"],
        &approvals["approvals"][0],
        "ApprovalRow",
    );
    let config = serde_json::to_value(glia_proto::RunConfig::default()).unwrap();
    for key in config.as_object().unwrap().keys() {
        assert!(
            schemas["RunConfig"]["properties"].get(key).is_some(),
            "RunConfig field {key} undocumented"
        );
    }
    // Every field of the strict configuration types is documented, and the
    // documents refuse unknown fields as the types do.
    let full: glia_proto::AgentDefinition = glia_proto::strict::from_json_value(json!({"name": "a", "model": "m", "provider": "p", "max_tokens": 5,
        "approval_timeout_ms": 1, "output_schema": {"type": "object"}, "compaction": {"strategy": "summarize", "max_tokens": 9},
        "guardrails": {"input": [{"name": "n", "deny": "x", "reason": "r"}], "output": [], "max_input_chars": 3, "max_output_chars": 4},
        "mcp": [{"server": "files", "allow": ["read_file"]}], "tool_policy": {"read_file": {"requires_approval": true}},
        "http_tools": [{"name": "lookup", "description": "d", "input_schema": {"type": "object"}, "url": "https://tools.example/lookup"}]})).unwrap();
    let definition = serde_json::to_value(&full).unwrap();
    for key in definition.as_object().unwrap().keys() {
        assert!(
            schemas["AgentDefinition"]["properties"].get(key).is_some(),
            "AgentDefinition field {key} undocumented"
        );
    }
    for key in definition["guardrails"].as_object().unwrap().keys() {
        assert!(
            schemas["Guardrails"]["properties"].get(key).is_some(),
            "Guardrails field {key} undocumented"
        );
    }
    for key in definition["compaction"].as_object().unwrap().keys() {
        assert!(
            schemas["CompactionSpec"]["properties"].get(key).is_some(),
            "CompactionSpec field {key} undocumented"
        );
    }
    let resolved = serde_json::to_value(full.resolve(Some(glia_proto::AgentRef {
        name: "a".into(),
        version: 1,
        content_hash: "h".into(),
    })))
    .unwrap();
    for key in resolved.as_object().unwrap().keys() {
        assert!(
            schemas["RunConfig"]["properties"].get(key).is_some(),
            "RunConfig field {key} undocumented"
        );
    }
    for name in [
        "RunConfig",
        "AgentDefinition",
        "BudgetLimits",
        "ToolSpec",
        "Policy",
        "Guardrails",
        "CompactionSpec",
        "AgentRef",
    ] {
        assert_eq!(
            schemas[name]["additionalProperties"],
            json!(false),
            "{name} refuses unknown fields"
        );
    }
    let limits = serde_json::to_value(glia_proto::BudgetLimits::default()).unwrap();
    for key in limits.as_object().unwrap().keys() {
        assert!(
            schemas["BudgetLimits"]["properties"].get(key).is_some(),
            "BudgetLimits field {key} undocumented"
        );
    }
}

#[tokio::test]
async fn relay_keeps_jobs_until_the_queue_confirms() {
    let log = Arc::new(MemoryLog::default());
    let down = App::new(
        log.clone(),
        Arc::new(DownQueue),
        Arc::new(glia_backends::memory::MemoryLedger::default()),
        auth(),
    );
    let router = glia_dispatcher::router(down.clone());
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
    assert_eq!(
        r.status,
        StatusCode::CREATED,
        "admission does not wait for the broker"
    );
    assert!(glia_dispatcher::relay_once(&down).await.is_err());
    assert_eq!(
        log.outbox(10).await.unwrap().len(),
        1,
        "kept for the next pass"
    );
    let queue = Arc::new(glia_backends::memory::MemoryQueue::default());
    let up = App::new(
        log.clone(),
        queue.clone(),
        Arc::new(glia_backends::memory::MemoryLedger::default()),
        auth(),
    );
    assert_eq!(glia_dispatcher::relay_once(&up).await.unwrap(), 1);
    assert!(log.outbox(10).await.unwrap().is_empty());
    assert_eq!(queue.depth().await.unwrap(), 1);
    assert_eq!(up.metrics().jobs_relayed.get(), 1);
}

/// The relay loop and the reconciler's tick relay the same outbox: their
/// passes take turns, so each job is published once, not once per pass
/// that read it while the other was waiting for the broker's confirms.
#[tokio::test]
async fn concurrent_relay_passes_publish_each_job_once() {
    let log = Arc::new(MemoryLog::default());
    let queue = Arc::new(glia_backends::memory::MemoryQueue::default());
    let app = App::new(
        log.clone(),
        Arc::new(SlowQueue(queue.clone())),
        Arc::new(glia_backends::memory::MemoryLedger::default()),
        auth(),
    );
    let router = glia_dispatcher::router(app.clone());
    for i in 0..20 {
        let r = send(
            &router,
            request(
                Method::POST,
                "/v1/runs",
                Some(SUB_A),
                Some(&json!({"goal": format!("run {i}")})),
            ),
        )
        .await;
        assert_eq!(r.status, StatusCode::CREATED);
    }
    let (a, b) = tokio::join!(
        glia_dispatcher::relay_once(&app),
        glia_dispatcher::relay_once(&app)
    );
    assert_eq!(a.unwrap() + b.unwrap(), 20);
    assert_eq!(queue.depth().await.unwrap(), 20, "each job published once");
    assert_eq!(app.metrics().jobs_relayed.get(), 20);
}

#[tokio::test]
async fn reconciler_requeues_runs_whose_job_or_worker_was_lost() {
    let h = harness();
    let lost_job = create(&h, SUB_A, json!({"goal": "lost job"})).await;
    let leased = create(&h, SUB_A, json!({"goal": "worker alive"})).await;
    let dead_worker = create(&h, SUB_A, json!({"goal": "worker died"})).await;
    let parked = create(&h, SUB_A, json!({"goal": "parked"})).await;
    let parked_with_payload = create(&h, SUB_A, json!({"goal": "parked, decided"})).await;
    park_for_approval(&*h.log, parked, &[("c1", "refund", json!({"amount": 1}))]).await;
    park_for_approval(
        &*h.log,
        parked_with_payload,
        &[("c1", "refund", json!({"amount": 1}))],
    )
    .await;
    post(
        &h,
        &format!("/v1/runs/{parked_with_payload}/approvals/c1"),
        APP_A,
        json!({"decision": "approve"}),
    )
    .await;
    // Every job was relayed and then lost.
    glia_dispatcher::relay_once(&h.app).await.unwrap();
    while h.queue.depth().await.unwrap() > 0 {
        h.queue.next().await.unwrap();
    }
    let _alive = h
        .log
        .acquire(leased, "w1", Duration::from_secs(60))
        .await
        .unwrap();
    let _lapsing = h
        .log
        .acquire(dead_worker, "w2", Duration::from_millis(30))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;

    // With a grace period, a first sighting publishes nothing.
    let mut patient = Reconciler::new(h.app.clone(), Duration::from_secs(3600));
    assert!(patient.tick().await.unwrap().is_empty());
    let mut r = Reconciler::new(h.app.clone(), Duration::ZERO);
    let mut jobs: Vec<Uuid> = r.tick().await.unwrap().iter().map(|j| j.run_id).collect();
    jobs.sort();
    let mut expected = vec![lost_job, dead_worker, parked_with_payload];
    expected.sort();
    assert_eq!(jobs, expected);
    assert_eq!(h.queue.depth().await.unwrap(), 3);
    assert_eq!(h.app.metrics().jobs_reconciled.get(), 3);
    let published = h.queue.next().await.unwrap().job;
    assert!(expected.contains(&published.run_id));
}

/// A run waiting its turn behind a backlog has its job in the queue: the
/// reconciler does not duplicate it, however long it waits, until the queue
/// has held no ready job for the grace period. A run whose worker died has
/// no job out and is re-enqueued behind the backlog all the same, once.
#[tokio::test]
async fn reconciler_leaves_runs_waiting_in_a_backlog_alone() {
    let h = harness();
    let dead_worker = create(&h, SUB_A, json!({"goal": "worker died"})).await;
    let mut waiting = Vec::new();
    for i in 0..3 {
        waiting.push(create(&h, SUB_A, json!({"goal": format!("in line {i}")})).await);
    }
    glia_dispatcher::relay_once(&h.app).await.unwrap();
    // A worker took the first run's job, acked it and died holding the lease.
    let taken = h.queue.next().await.unwrap();
    assert_eq!(
        taken.job.run_id, dead_worker,
        "jobs are handed out in order"
    );
    taken.acker.ack().await.unwrap();
    let _lapsing = h
        .log
        .acquire(dead_worker, "w", Duration::from_millis(30))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(h.queue.depth().await.unwrap(), 3, "the backlog");

    let grace = Duration::from_millis(50);
    let mut r = Reconciler::new(h.app.clone(), grace);
    assert!(
        r.tick().await.unwrap().is_empty(),
        "a first sighting publishes nothing"
    );
    tokio::time::sleep(grace * 3).await;
    let published: Vec<Uuid> = r.tick().await.unwrap().iter().map(|j| j.run_id).collect();
    assert_eq!(published, [dead_worker], "only the run whose lease lapsed");
    assert_eq!(
        h.queue.depth().await.unwrap(),
        4,
        "the backlog, and the dead worker's run once"
    );

    // The fleet hands the backlog out; the runs' jobs are lost on the way.
    while h.queue.depth().await.unwrap() > 0 {
        h.queue.next().await.unwrap();
    }
    assert!(
        r.tick()
            .await
            .unwrap()
            .iter()
            .all(|j| j.run_id == dead_worker),
        "drained for less than the grace period"
    );
    tokio::time::sleep(grace * 2).await;
    let mut published: Vec<Uuid> = r
        .tick()
        .await
        .unwrap()
        .iter()
        .map(|j| j.run_id)
        .filter(|id| *id != dead_worker)
        .collect();
    published.sort();
    let mut expected = waiting.clone();
    expected.sort();
    assert_eq!(
        published, expected,
        "drained for the grace period: the runs left orphaned are re-enqueued"
    );
}

/// A run parked at an approval whose deadline has passed, with `action`.
async fn parked_with_expired_approval(h: &common::H, action: glia_proto::ApprovalTimeout) -> Uuid {
    let mut s = glia_backends::conformance::sample_log();
    let mut events = s.parked.clone();
    if let EventKind::SessionStart { config, .. } = &mut events[0].kind {
        config.approval_timeout_ms = Some(1);
        config.on_approval_timeout = action;
    }
    for e in &mut events {
        if let EventKind::ApprovalRequested { expires_at, .. } = &mut e.kind {
            *expires_at = Some(chrono::Utc::now() - chrono::Duration::seconds(1));
        }
    }
    s.parked = events;
    let start = s.parked[0].clone();
    h.log
        .create_run(glia_backends::NewRun {
            tenant: "a".into(),
            idempotency_key: None,
            batch_id: None,
            start,
            tags: Vec::new(),
            metadata: Default::default(),
            custom_id: None,
            parent_run_id: None,
            parent_call_id: None,
            depth: 0,
        })
        .await
        .unwrap();
    let lease = h
        .log
        .acquire(s.run_id, "w", Duration::from_secs(30))
        .await
        .unwrap();
    let state = glia_proto::RunState::replay(s.run_id, &s.parked).unwrap();
    h.log
        .commit(&lease, &s.parked[1..], &state, &[])
        .await
        .unwrap();
    h.log.release(&lease).await.unwrap();
    s.run_id
}

#[tokio::test]
async fn reconciler_rejects_or_escalates_expired_approvals() {
    let h = common::harness();
    let rejected = parked_with_expired_approval(&h, glia_proto::ApprovalTimeout::Reject).await;
    let escalated = parked_with_expired_approval(&h, glia_proto::ApprovalTimeout::Escalate).await;
    let mut r = Reconciler::new(h.app.clone(), Duration::from_secs(3600));
    assert_eq!(r.expire_approvals().await.unwrap(), 2);
    let inbox = h.log.inbox(rejected).await.unwrap();
    assert!(
        matches!(&inbox[0].payload, glia_proto::Payload::Approval { decision: glia_proto::Decision::Expire, by: Some(by), .. } if by == "reconciler"),
        "an expiry is told as an expiry, not as a person's rejection: {inbox:?}"
    );
    let posted = h.log.inbox(escalated).await.unwrap();
    assert!(
        matches!(&posted[..], [glia_backends::InboxItem { payload: glia_proto::Payload::Escalate { call_id, request_seq: Some(_), .. }, .. }] if call_id == "c1"),
        "an escalation is posted for the worker to record as approval.escalated: {posted:?}"
    );
    let rows = h
        .log
        .approvals(&glia_backends::ApprovalFilter {
            run_id: Some(escalated),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(rows[0].escalated && rows[0].status == glia_backends::ApprovalStatus::Pending);
    // Nothing left to expire: the rejection is decided, the escalation is marked.
    assert_eq!(r.expire_approvals().await.unwrap(), 0);
}

/// Ticks for 1.6 s, every 50 ms; how often `id` was published. With
/// `lose`, the queue loses every job between ticks.
async fn tick_for(h: &common::H, r: &mut Reconciler, id: Uuid, lose: bool) -> usize {
    let started = std::time::Instant::now();
    let mut published = 0;
    while started.elapsed() < Duration::from_millis(1600) {
        published += r
            .tick()
            .await
            .unwrap()
            .iter()
            .filter(|j| j.run_id == id)
            .count();
        while lose && h.queue.depth().await.unwrap() > 0 {
            h.queue.next().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    published
}

/// With no worker consuming, an orphaned run is re-enqueued once: its job
/// then waits in the queue, and the queue gains no duplicates while the
/// fleet is down. When its jobs are lost over and over, it is re-enqueued
/// with a growing wait (grace, 2×, 4×, …), not on every tick.
#[tokio::test]
async fn reconciler_backs_off_per_run() {
    let h = common::harness();
    let id = create(&h, SUB_A, json!({"goal": "nobody runs me"})).await;
    glia_dispatcher::relay_once(&h.app).await.unwrap();
    h.queue.next().await.unwrap(); // the job is lost
    let mut r = Reconciler::new(h.app.clone(), Duration::from_millis(100));
    assert_eq!(
        tick_for(&h, &mut r, id, false).await,
        1,
        "published once, then its job waits in the queue"
    );
    assert_eq!(h.queue.depth().await.unwrap(), 1);
    // Due at ~200, ~600 and ~1400 ms after the last (a slow machine only
    // makes it fewer); without the back-off it would be ~30.
    let published = tick_for(&h, &mut r, id, true).await;
    assert!((1..=3).contains(&published), "published {published} times");
}

/// `schemas/` holds exactly what `glia schemas` writes: the configuration
/// types' JSON Schemas as `/openapi.json` serves them, and the document
/// itself (`schemas/openapi.json`, which the clients under `clients/` are
/// generated from and checked against in their suites).
#[test]
fn schemas_directory_is_current() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas");
    let path = dir.join("openapi.json");
    let written = std::fs::read_to_string(&path).unwrap_or_default();
    let expected = format!(
        "{}\n",
        serde_json::to_string_pretty(&glia_dispatcher::openapi()).unwrap()
    );
    assert!(
        written == expected,
        "{} is stale or missing: regenerate with `cargo run -p glia-cli -- schemas` (writes schemas/), regenerate the clients' types (clients/README.md) and commit them",
        path.display()
    );
    for (file, schema) in glia_dispatcher::docs::config_schemas() {
        let path = dir.join(file);
        let written = std::fs::read_to_string(&path).unwrap_or_default();
        let expected = format!("{}\n", serde_json::to_string_pretty(&schema).unwrap());
        assert!(
            written == expected,
            "{} is stale or missing: regenerate with `cargo run -p glia-cli -- schemas` (writes schemas/) and commit it",
            path.display()
        );
        // Each compiles as a JSON Schema and refuses an unknown top-level key.
        let validator = jsonschema::validator_for(&schema).unwrap();
        assert!(
            !validator.is_valid(&json!({"name": "a", "model": "m", "command": "/bin/sh"})),
            "{file} refuses unknown keys"
        );
    }
}
