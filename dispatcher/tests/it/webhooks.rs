//! Webhooks on the real Postgres event log with a local receiver: the
//! trigger writes a delivery for each subscribed event in the event's own
//! transaction; the deliverer signs (Standard Webhooks) and sends them; a
//! receiver that is down gets every delivery once it is back, with the same
//! `webhook-id` on retries (at-least-once, no other duplicates).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::routing::post;
use base64::Engine;
use common::{ADMIN, APP_A, SUB_B, request, send};
use glia_backends::memory::{MemoryLedger, MemoryQueue};
use glia_backends::testkit::TestDb;
use glia_backends::{NewRun, RunLog};
use glia_dispatcher::webhooks::{DeliveryOptions, WebhookConfig, WebhookPolicy, deliver};
use glia_dispatcher::{App, router};
use glia_proto::{Decision, EventKind, RunState, ToolErrorKind};
use hmac::{Hmac, Mac};
use serde_json::{Value, json};

/// (path, headers, body as parsed, body as sent).
type Received = Arc<Mutex<Vec<(String, HeaderMap, Value, String)>>>;

async fn receive(
    State(got): State<Received>,
    axum::extract::Path(path): axum::extract::Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let raw = String::from_utf8_lossy(&body).into_owned();
    got.lock().unwrap().push((
        path,
        headers,
        serde_json::from_str(&raw).unwrap_or(Value::Null),
        raw,
    ));
    StatusCode::NO_CONTENT
}

/// Verify a Standard Webhooks signature independently of the sender's code.
fn verifies(secret: &str, headers: &HeaderMap, body: &str) -> bool {
    let h = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.trim_start_matches("whsec_"))
        .unwrap();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{}.{}.{}", h("webhook-id"), h("webhook-timestamp"), body).as_bytes());
    let want = format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    );
    h("webhook-signature").split(' ').any(|s| s == want)
}

async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn parked_run(log: &dyn RunLog, tenant: &str) -> (uuid::Uuid, RunState) {
    let s = glia_backends::conformance::sample_log();
    log.create_run(NewRun {
        tenant: tenant.into(),
        idempotency_key: None,
        batch_id: None,
        start: s.parked[0].clone(),
        tags: Vec::new(),
        metadata: Default::default(),
        custom_id: None,
        parent_run_id: None,
        parent_call_id: None,
        depth: 0,
    })
    .await
    .unwrap();
    let lease = log
        .acquire(s.run_id, "w", Duration::from_secs(30))
        .await
        .unwrap();
    let state = RunState::replay(s.run_id, &s.parked).unwrap();
    log.commit(&lease, &s.parked[1..], &state, &[])
        .await
        .unwrap();
    log.release(&lease).await.unwrap();
    (s.run_id, state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_are_signed_durable_and_survive_a_receiver_outage() {
    let db = TestDb::new().await;
    let log = Arc::new(db.log().await);
    let policy = WebhookPolicy {
        allow_hosts: vec!["127.0.0.1".into()],
        ..WebhookPolicy::default()
    };
    let app = App::new(
        log.clone(),
        Arc::new(MemoryQueue::default()),
        Arc::new(MemoryLedger::default()),
        common::auth(),
    )
    .with_webhooks(WebhookConfig {
        store: Some(log.clone()),
        policy,
        public_url: Some("https://glia.example.com".into()),
    });
    let api = router(app.clone());

    // The receiver's port is chosen now; nothing listens on it yet (it is "down").
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}");

    // Subscriptions of tenant `a`: standard and Slack. The secret is shown once.
    let r = send(
        &api,
        request(
            Method::POST,
            "/v1/webhooks",
            Some(APP_A),
            Some(&json!({"url": format!("{base}/hooks/std")})),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let secret = r.body["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"));
    let std_id = r.body["id"].as_str().unwrap().to_owned();
    let r = send(&api, request(Method::POST, "/v1/webhooks", Some(APP_A), Some(&json!({"url": format!("{base}/hooks/slack"), "format": "slack", "events": ["approval.requested"]})))).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let listed = send(
        &api,
        request(Method::GET, "/v1/webhooks", Some(APP_A), None),
    )
    .await;
    assert_eq!(listed.body["webhooks"].as_array().unwrap().len(), 2);
    assert!(
        !listed.body.to_string().contains(&secret),
        "the secret is never listed"
    );
    assert_eq!(
        send(
            &api,
            request(Method::GET, "/v1/webhooks", Some(SUB_B), None)
        )
        .await
        .body["webhooks"],
        json!([]),
        "tenant b sees none of a's"
    );
    assert_eq!(
        send(
            &api,
            request(Method::GET, "/v1/webhooks", Some(ADMIN), None)
        )
        .await
        .body["webhooks"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // A receiver on an internal address needs the operator's leave.
    let strict = router(
        App::new(
            log.clone(),
            Arc::new(MemoryQueue::default()),
            Arc::new(MemoryLedger::default()),
            common::auth(),
        )
        .with_webhooks(WebhookConfig {
            store: Some(log.clone()),
            ..WebhookConfig::default()
        }),
    );
    let refused = send(
        &strict,
        request(
            Method::POST,
            "/v1/webhooks",
            Some(APP_A),
            Some(&json!({"url": "http://127.0.0.1:9/x"})),
        ),
    )
    .await;
    assert_eq!(
        refused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        refused.body
    );
    assert!(
        refused.body.to_string().contains("loopback"),
        "{}",
        refused.body
    );
    let unknown = send(
        &api,
        request(
            Method::POST,
            "/v1/webhooks",
            Some(APP_A),
            Some(&json!({"url": format!("{base}/x"), "events": ["run.exploded"]})),
        ),
    )
    .await;
    assert_eq!(unknown.status, StatusCode::UNPROCESSABLE_ENTITY);

    // Events: an approved run that completes, an escalated one that expires
    // and is cancelled; and a run of tenant b, which a's hooks never see.
    let (approved, _) = parked_run(&*log, "a").await;
    common::commit(
        &*log,
        approved,
        glia_backends::conformance::sample_log()
            .rest
            .into_iter()
            .map(|e| e.kind)
            .collect(),
    )
    .await;
    let (expired, state) = parked_run(&*log, "a").await;
    let hash = state.call("c1").unwrap().args_hash.clone();
    common::commit(
        &*log,
        expired,
        vec![
            EventKind::ApprovalEscalated {
                call_id: "c1".into(),
                expires_at: None,
            },
            EventKind::ApprovalResolved {
                call_id: "c1".into(),
                args_hash: hash,
                decision: Decision::Expire,
                by: Some("reconciler".into()),
            },
            EventKind::ToolError {
                call_id: "c1".into(),
                error: ToolErrorKind::Expired,
                message: "No decision before the deadline".into(),
                duration_ms: 0,
            },
            EventKind::SessionCancel {
                reason: "nobody answered".into(),
            },
        ],
    )
    .await;
    let _ = parked_run(&*log, "b").await;

    // The deliverer runs while the receiver is down: attempts fail and are retried.
    let options = DeliveryOptions {
        poll: Duration::from_millis(20),
        base_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(400),
        timeout: Duration::from_secs(2),
        max_attempts: 10_000,
        ..DeliveryOptions::default()
    };
    let deliverer = tokio::spawn(deliver(app.clone(), options));
    let log_path = format!("/v1/webhooks/{std_id}/deliveries");
    wait_until("failed attempts while the receiver is down", || async {
        let d = send(&api, request(Method::GET, &log_path, Some(APP_A), None))
            .await
            .body["deliveries"]
            .clone();
        d.as_array().is_some_and(|d| {
            d.len() == 7
                && d.iter().all(|x| {
                    x["status"] == "pending"
                        && x["attempts"].as_u64() >= Some(2)
                        && x["last_error"].is_string()
                })
        })
    })
    .await;

    // The receiver comes back: every delivery arrives.
    let got: Received = Arc::default();
    let receiver = axum::Router::new()
        .route("/hooks/{path}", post(receive))
        .with_state(got.clone());
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, receiver).await });
    wait_until("every delivery delivered", || async {
        let d = send(&api, request(Method::GET, &log_path, Some(APP_A), None))
            .await
            .body["deliveries"]
            .clone();
        d.as_array()
            .is_some_and(|d| d.len() == 7 && d.iter().all(|x| x["status"] == "delivered"))
    })
    .await;
    wait_until("the Slack delivery", || async {
        got.lock().unwrap().iter().any(|(p, _, _, _)| p == "slack")
    })
    .await;
    deliverer.abort();
    server.abort();

    let got = got.lock().unwrap().clone();
    let standard: Vec<&(String, HeaderMap, Value, String)> =
        got.iter().filter(|(p, _, _, _)| p == "std").collect();
    for (_, headers, _, raw) in &standard {
        assert!(
            verifies(&secret, headers, raw),
            "signature verifies: {headers:?} {raw}"
        );
    }
    // At-least-once: a message may come twice, always with the same id and body; none is missing.
    let mut by_id: BTreeMap<String, Value> = BTreeMap::new();
    for (_, headers, body, _) in &standard {
        let id = headers["webhook-id"].to_str().unwrap().to_owned();
        if let Some(seen) = by_id.insert(id.clone(), body.clone()) {
            assert_eq!(&seen, body, "a repeated webhook-id carries the same body");
        }
    }
    let per_run = |run: uuid::Uuid| -> BTreeSet<String> {
        by_id
            .values()
            .filter(|b| b["data"]["run_id"] == run.to_string())
            .map(|b| b["type"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        per_run(approved),
        ["approval.requested", "approval.resolved", "run.completed"]
            .map(String::from)
            .into()
    );
    assert_eq!(
        per_run(expired),
        [
            "approval.requested",
            "approval.escalated",
            "approval.expired",
            "run.failed"
        ]
        .map(String::from)
        .into()
    );
    assert_eq!(
        by_id.len(),
        7,
        "nothing of tenant b, nothing twice under different ids"
    );
    let resolved = by_id
        .values()
        .find(|b| b["type"] == "approval.resolved")
        .unwrap();
    assert_eq!(
        (
            resolved["data"]["decision"].as_str(),
            resolved["data"]["decided_by"].as_str()
        ),
        (Some("approve"), Some("ana"))
    );
    let slack: Vec<&Value> = got
        .iter()
        .filter(|(p, _, _, _)| p == "slack")
        .map(|(_, _, b, _)| b)
        .collect();
    assert_eq!(
        slack
            .iter()
            .map(|b| b["text"].as_str().unwrap().to_owned())
            .collect::<BTreeSet<_>>()
            .len(),
        2,
        "one Slack message per requested approval"
    );
    assert!(
        slack[0]["text"]
            .as_str()
            .unwrap()
            .contains("<https://glia.example.com/inbox/runs/"),
        "{}",
        slack[0]
    );
    assert!(
        !serde_json::to_string(&got.iter().map(|(_, _, _, raw)| raw).collect::<Vec<_>>())
            .unwrap()
            .contains(&secret)
    );

    // Unsubscribing drops the subscription (and its log).
    let gone = send(
        &api,
        request(
            Method::DELETE,
            &format!("/v1/webhooks/{std_id}"),
            Some(APP_A),
            None,
        ),
    )
    .await;
    assert_eq!(gone.status, StatusCode::NO_CONTENT);
    assert_eq!(
        send(
            &api,
            request(
                Method::DELETE,
                &format!("/v1/webhooks/{std_id}"),
                Some(APP_A),
                None
            )
        )
        .await
        .status,
        StatusCode::NOT_FOUND
    );
}
