//! Evals (issue 31) in one process: an eval store on the harness, datasets
//! and experiments through the API, scripted agent versions, and the
//! background passes driven by hand until an experiment completes. Used by
//! `evals.rs` and the console's experiment pages (`console_more.rs`).

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use glia_agent::agent::Agent;
use glia_agent::provider::{GoalScript, Script, ScriptLibrary, ScriptedTurn};
use glia_backends::RunStatus;
use glia_backends::evals::MemoryEvals;
use glia_dispatcher::batches::admit_once;
use glia_dispatcher::evals::tend_once;
use serde_json::{Value, json};
use uuid::Uuid;

use super::*;

/// The harness with an eval store.
pub fn evals_harness() -> H {
    let mut h = harness();
    h.app = h.app.clone().with_evals(Arc::new(MemoryEvals::default()));
    h.router = glia_dispatcher::router(h.app.clone());
    h
}

/// `PUT /v1/datasets/{name}` with `text` as JSON Lines.
pub async fn put_text(h: &H, name: &str, text: String) -> Reply {
    let req = Request::builder()
        .method(Method::PUT)
        .uri(format!("/v1/datasets/{name}"))
        .header(header::AUTHORIZATION, format!("Bearer {SUB_A}"))
        .header(header::CONTENT_TYPE, "application/jsonl")
        .body(Body::from(text))
        .unwrap();
    send(&h.router, req).await
}

/// Store `cases` as dataset `name`; a new version is expected.
pub async fn put_cases(h: &H, name: &str, cases: &[Value]) {
    let text: String = cases.iter().map(|c| format!("{c}\n")).collect();
    let r = put_text(h, name, text).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
}

/// `POST /v1/experiments`, with an `Idempotency-Key` when given.
pub async fn create_experiment(h: &H, eval: Value, key: Option<&str>) -> Reply {
    let mut req = request(
        Method::POST,
        "/v1/experiments",
        Some(SUB_APP_A),
        Some(&json!({ "eval": eval })),
    );
    if let Some(key) = key {
        req.headers_mut()
            .insert("idempotency-key", key.parse().unwrap());
    }
    send(&h.router, req).await
}

/// Create an experiment; its id.
pub async fn start(h: &H, eval: Value) -> String {
    let r = create_experiment(h, eval, None).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.body["state"], "running", "{}", r.text);
    r.body["id"].as_str().unwrap().to_owned()
}

/// A worker's scripts (with the `calculator` tool): `named` by model name.
pub fn library(named: Vec<(&str, Script)>) -> Agent {
    let mut lib = ScriptLibrary::default();
    for (name, script) in named {
        lib.insert_script(name, script);
    }
    let mut tools = glia_agent::tool::ToolRegistry::default();
    tools.register_dyn(Arc::new(Calculator)).unwrap();
    Agent::new(Arc::new(lib)).with_tools(tools)
}

/// A script answering each goal containing a key with its turns.
pub fn by_goal(entries: Vec<(&str, Vec<ScriptedTurn>)>) -> Script {
    Script::ByGoal {
        by_goal: entries
            .into_iter()
            .map(|(contains, turns)| GoalScript {
                contains: contains.into(),
                turns,
            })
            .collect(),
        otherwise: None,
    }
}

/// The dispatcher whose passes the tests make (its claims on experiments
/// last [`glia_dispatcher::evals::CLAIM_FOR`]).
pub const OWNER: Uuid = Uuid::from_u128(31);

/// Drive the fleet by hand until experiment `id` is `completed`: a pass of
/// the experiments loop, one of batch admission, then a worker job for
/// every run that can go on. Answers the experiment's view and how many
/// cells the loop's passes said they graded.
pub async fn drive(h: &H, agent: &Agent, id: &str) -> (Value, usize) {
    let http = glia_dispatcher::evals::grader_client();
    let mut graded = 0;
    for _ in 0..40 {
        graded += tend_once(&h.app, OWNER, &http).await.unwrap();
        // Another dispatcher's pass, and this one's again at once, grade nothing.
        assert_eq!(tend_once(&h.app, Uuid::now_v7(), &http).await.unwrap(), 0);
        assert_eq!(tend_once(&h.app, OWNER, &http).await.unwrap(), 0);
        let got = get(h, &format!("/v1/experiments/{id}"), SUB_A).await;
        assert_eq!(got.status, StatusCode::OK, "{}", got.text);
        if got.body["state"] == "completed" {
            return (got.body, graded);
        }
        admit_once(&h.app).await.unwrap();
        work_all(h, agent).await;
    }
    let left: Vec<String> = all_runs(h)
        .await
        .iter()
        .filter(|r| r.status != RunStatus::Done)
        .map(|r| format!("{} {:?} {:?}", r.run_id, r.tags, r.pull_point))
        .collect();
    let got = get(h, &format!("/v1/experiments/{id}"), SUB_A).await;
    panic!(
        "experiment {id} did not complete; runs left {left:?}: {}",
        got.text
    )
}

/// Register `support` v1 (right on every case) and v2 (wrong on the
/// cases in `regressing`), and store dataset `cases`: one refund case per
/// order in `orders` (its id the order).
pub async fn two_versions_over(h: &H, orders: &[&str], regressing: &[&str]) -> Agent {
    register(
        h,
        "a",
        json!({"name": "support", "model": "script:support-v1", "tools": []}),
    )
    .await;
    register(
        h,
        "a",
        json!({"name": "support", "model": "script:support-v2", "tools": []}),
    )
    .await;
    let cases: Vec<Value> = orders
        .iter()
        .map(|o| json!({"id": o, "goal": format!("Refund order {o}."), "expected": {"answer": format!("order {o} is refunded")}}))
        .collect();
    put_cases(h, "cases", &cases).await;
    let answer =
        |o: &str, word: &str| vec![ScriptedTurn::text(&format!("Done: order {o} is {word}."))];
    let v1 = by_goal(orders.iter().map(|o| (*o, answer(o, "refunded"))).collect());
    let v2 = by_goal(
        orders
            .iter()
            .map(|o| {
                let word = if regressing.contains(o) {
                    "not refundable"
                } else {
                    "refunded"
                };
                (*o, answer(o, word))
            })
            .collect(),
    );
    library(vec![("support-v1", v1), ("support-v2", v2)])
}
