//! HTTP hooks of the operator's catalogue on the fleet: a `before_tool_call`
//! hook changes a refund's arguments; the call parks for approval; its
//! worker is killed (`kill -9`); the approval is posted; a new worker
//! finishes the run — the hook was called exactly once, the refund ran once
//! with the hook's arguments, and the `on_complete` notification arrived.
//! And a worker killed while the hook is still answering: the next worker
//! asks again under the same `webhook-id` (the hook can dedupe). The hook's
//! signing secret reaches no event and no process log.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use glia_testkit::fleet::{Fleet, check_log};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(180);
const LEASE_MS: u64 = 2_000;
const SECRET: &str = "whsec_c2VjcmV0LWtleS1vZi10aGUtZmxlZXQtdGVzdA==";

/// A hook server on 127.0.0.1:0 in a thread of its own: checks every
/// request's signature, keeps `(topic, webhook-id, body)`, and answers a
/// `before_tool_call` by changing `order_id` to `B2` (with `hold_first`,
/// the first one is never answered).
struct HookServer {
    url: String,
    requests: Arc<Mutex<Vec<(String, String, Value)>>>,
    unsigned: Arc<Mutex<usize>>,
}

fn hook_server(hold_first: bool) -> HookServer {
    let requests: Arc<Mutex<Vec<(String, String, Value)>>> = Arc::default();
    let unsigned: Arc<Mutex<usize>> = Arc::default();
    let (r, u) = (requests.clone(), unsigned.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = axum::Router::new().route(
                "/hook",
                axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                    let (requests, unsigned) = (r.clone(), u.clone());
                    async move {
                        let Some(id) = glia_testkit::signed::verified(SECRET, &headers, &body)
                        else {
                            *unsigned.lock().unwrap() += 1;
                            return StatusCode::UNAUTHORIZED.into_response();
                        };
                        let body: Value = serde_json::from_slice(&body).unwrap();
                        let topic = body["topic"].as_str().unwrap_or_default().to_owned();
                        requests
                            .lock()
                            .unwrap()
                            .push((topic.clone(), id, body.clone()));
                        let asked = requests
                            .lock()
                            .unwrap()
                            .iter()
                            .filter(|(t, ..)| t == "before_tool_call")
                            .count();
                        if topic == "before_tool_call" && hold_first && asked == 1 {
                            std::future::pending::<()>().await;
                        }
                        if topic == "before_tool_call" {
                            let mut input = body["payload"]["input"].clone();
                            input["order_id"] = json!("B2");
                            axum::Json(json!({"verdict": "allow", "input": input})).into_response()
                        } else {
                            StatusCode::NO_CONTENT.into_response()
                        }
                    }
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    let addr = rx.recv().expect("the hook server listens");
    HookServer {
        url: format!("http://{addr}/hook"),
        requests,
        unsigned,
    }
}

fn wait_for<T>(fleet: &Fleet, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(t) = probe() {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            fleet.log_tails(40)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A fleet of one worker with the hook `gate` in its catalogue, and a run
/// whose refund needs approval.
fn fleet_and_run(server: &HookServer) -> (Fleet, String) {
    let mut fleet = Fleet::new(&[(
        "refund",
        json!([
            {"tool_calls": [{"name": "refund_order", "input": {"order_id": "A1"}}]},
            {"text": "Refunded."}
        ]),
    )]);
    fleet.use_catalogue(&format!(
        "[hooks.gate]\nurl = \"{}\"\ntopics = [\"before_tool_call\", \"on_complete\"]\nsecret_env = \"GLIA_TEST_HOOK_SECRET\"\ntimeout_ms = 30000\non_failure = \"closed\"\n",
        server.url
    ));
    fleet
        .extra_env
        .push(("GLIA_TEST_HOOK_SECRET".into(), SECRET.into()));
    fleet.start_dispatcher();
    fleet.start_worker(LEASE_MS);
    let run = fleet.submit(
        "refund A1",
        json!({
            "model": "script:refund",
            "policies": [{"tool": "refund_order", "action": {"kind": "require_approval"}}]
        }),
    );
    (fleet, run)
}

fn pending_approval(fleet: &Fleet, run: &str) -> Value {
    wait_for(fleet, "the refund to wait for approval", || {
        let (_, pending) = fleet.get("/v1/approvals");
        pending["approvals"]
            .as_array()?
            .iter()
            .find(|a| a["run_id"] == run)
            .cloned()
    })
}

fn approve_and_finish(fleet: &Fleet, run: &str, call: &Value) {
    let path = format!(
        "/v1/runs/{run}/approvals/{}",
        call["call_id"].as_str().unwrap()
    );
    let (status, body) = fleet.post(&path, json!({"decision": "approve"}));
    assert!(status == 200 || status == 202, "approve: {status} {body}");
    let done = wait_for(fleet, "the run to finish", || {
        let (_, r) = fleet.get(&format!("/v1/runs/{run}"));
        (r["status"] == "done").then_some(r)
    });
    assert_eq!(done["outcome"]["kind"], "succeeded", "{done}");
    assert_eq!(fleet.effects().len(), 1, "the refund ran once");
}

#[test]
fn a_worker_killed_while_the_hook_answers_asks_again_under_the_same_id() {
    let server = hook_server(true);
    let (mut fleet, run) = fleet_and_run(&server);
    wait_for(&fleet, "the hook to be asked", || {
        (!server.requests.lock().unwrap().is_empty()).then_some(())
    });
    fleet.kill_and_replace_worker(0, LEASE_MS);
    let call = pending_approval(&fleet, &run);
    assert_eq!(call["input"], json!({"order_id": "B2"}));
    approve_and_finish(&fleet, &run, &call);
    let asked: Vec<String> = server
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|(t, ..)| t == "before_tool_call")
        .map(|(_, id, _)| id.clone())
        .collect();
    assert_eq!(asked.len(), 2, "asked again: no answer was recorded");
    assert_eq!(
        asked[0], asked[1],
        "the same webhook-id for the same logical call"
    );
    assert_eq!(*server.unsigned.lock().unwrap(), 0);
}

#[test]
fn a_hook_answered_before_a_kill_is_not_called_again() {
    let server = hook_server(false);
    let (mut fleet, run) = fleet_and_run(&server);
    let call = pending_approval(&fleet, &run);
    assert_eq!(
        call["input"],
        json!({"order_id": "B2"}),
        "the hook's arguments wait for approval"
    );
    // The worker that asked the hook dies; another takes the run up.
    fleet.kill_and_replace_worker(0, LEASE_MS);
    approve_and_finish(&fleet, &run, &call);
    wait_for(&fleet, "the on_complete notification", || {
        server
            .requests
            .lock()
            .unwrap()
            .iter()
            .any(|(t, ..)| t == "on_complete")
            .then_some(())
    });
    let requests = server.requests.lock().unwrap().clone();
    let mut by_topic: HashMap<&str, usize> = HashMap::new();
    for (topic, ..) in &requests {
        *by_topic.entry(topic.as_str()).or_default() += 1;
    }
    assert_eq!(by_topic.get("before_tool_call"), Some(&1), "{requests:?}");
    assert_eq!(by_topic.get("on_complete"), Some(&1), "{requests:?}");
    assert_eq!(
        *server.unsigned.lock().unwrap(),
        0,
        "every request is signed"
    );
    assert_eq!(requests[0].2["run_id"], run.as_str());
    assert_eq!(requests[0].2["tenant"], "default", "{:?}", requests[0].2);
    // The refund ran with the hook's arguments; the answer is in the log.
    let events = check_log(&fleet, &run);
    let recorded: Vec<&glia_proto::Event> = events
        .iter()
        .filter(|e| {
            matches!(
                &e.kind,
                glia_proto::EventKind::HookApplied { call: Some(_), .. }
            )
        })
        .collect();
    assert_eq!(recorded.len(), 2, "modified, then continued: {recorded:?}");
    let refund = events
        .iter()
        .find_map(|e| match &e.kind {
            glia_proto::EventKind::ToolCall(c) => Some(c.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(refund.input, json!({"order_id": "B2"}));
    // The secret is in no event and no process log.
    let secret_key = SECRET.trim_start_matches("whsec_");
    assert!(!serde_json::to_string(&events).unwrap().contains(secret_key));
    for role in ["dispatcher", "w0"] {
        let log = std::fs::read_to_string(fleet.log_file(role)).unwrap_or_default();
        assert!(
            !log.contains(secret_key),
            "the secret reached the {role} log"
        );
    }
}
