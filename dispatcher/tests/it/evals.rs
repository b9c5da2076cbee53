//! Issue 31, evals, in one process: the dispatcher over the in-memory twins
//! with an eval store, a hand-driven worker (the real loop over scripts by
//! model name, [`work`]) and the background passes called by hand (the
//! experiments loop's `tend_once`, batch admission's `admit_once`). Two
//! versions of an agent, one regressing on two cases, graded once per cell;
//! scripted customer turns and approvals; the trajectory grader; a judge
//! run, once per cell, whose garbage is a grading error; bad input refused
//! naming the field with nothing stored; idempotent creation; cancel. The
//! helpers that make and drive experiments are `common/experiments.rs`.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::http::{Method, StatusCode};
use glia_agent::agent::Agent;
use glia_agent::provider::{Script, ScriptedTurn};
use glia_backends::{RunLog, RunStatus, RunSummary};
use glia_dispatcher::batches::admit_once;
use glia_dispatcher::evals::tend_once;
use glia_proto::{ContentBlock, Decision, EventKind};
use serde_json::{Value, json};
use uuid::Uuid;

use common::*;

/// Register agent `def` for tenant `a` and store its dataset `name`.
async fn setup(h: &H, def: Value, name: &str, cases: &[Value]) {
    register(h, "a", def).await;
    put_cases(h, name, cases).await;
}

/// `POST /v1/experiments/{id}/cancel` as `token`.
async fn cancel(h: &H, id: &str, token: &str) -> Reply {
    post(h, &format!("/v1/experiments/{id}/cancel"), token, json!({})).await
}

/// The cells of a view for `version`, in the view's order.
fn cells_of<'a>(view: &'a Value, version: &str) -> Vec<&'a Value> {
    view["cells"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["version"] == version)
        .collect()
}

fn cell<'a>(view: &'a Value, version: &str, case: &str) -> &'a Value {
    cells_of(view, version)
        .into_iter()
        .find(|c| c["case_id"] == case)
        .unwrap_or_else(|| panic!("no cell {version} {case}: {view}"))
}

async fn events(h: &H, run: &str) -> Vec<glia_proto::Event> {
    h.log.events(run.parse().unwrap(), 0, 10_000).await.unwrap()
}

const CASES: [&str; 5] = ["A1", "A2", "A3", "A4", "A5"];

/// `support` v1 and v2 over dataset `cases`, v2 wrong on A4 and A5.
async fn two_versions(h: &H) -> Agent {
    two_versions_over(h, &CASES, &["A4", "A5"]).await
}

fn refunds_eval() -> Value {
    json!({"name": "refunds", "dataset": "cases", "agents": ["support@1", "support@2"],
        "repetitions": 2, "graders": [{"kind": "contains", "expected": "answer"}]})
}

#[tokio::test]
async fn two_versions_one_regresses_every_cell_graded_once() {
    let h = evals_harness();
    let agent = two_versions(&h).await;
    let id = start(&h, refunds_eval()).await;
    let (view, graded) = drive(&h, &agent, &id).await;

    // 2 versions × 5 cases × 2 repetitions, each graded once.
    assert_eq!(graded, 20, "the passes graded each cell once");
    assert_eq!(view["progress"], json!({"cells": 20, "graded": 20}));
    let grades = h
        .app
        .evals
        .as_ref()
        .unwrap()
        .grades(id.parse().unwrap())
        .await
        .unwrap();
    assert_eq!(grades.len(), 20);
    let distinct: BTreeSet<(String, String)> = grades
        .iter()
        .map(|g| (g.version.clone(), g.cell.clone()))
        .collect();
    assert_eq!(distinct.len(), 20);
    let http = reqwest::Client::new();
    assert_eq!(
        tend_once(&h.app, Uuid::now_v7(), &http).await.unwrap(),
        0,
        "nothing is graded again"
    );
    assert_eq!(view["dataset"], "cases@1");
    assert_eq!(view["versions"][0]["label"], "support@1");
    assert_eq!(view["versions"][1]["label"], "support@2");

    // Pass rates, and the cases that changed verdict.
    let summary = &view["summary"];
    assert_eq!(summary["versions"][0]["version"], "support@1");
    assert_eq!(summary["versions"][0]["pass_rate"], json!(1.0));
    assert_eq!(summary["versions"][0]["passed"], json!(10));
    assert_eq!(summary["versions"][1]["pass_rate"], json!(0.6));
    assert_eq!(summary["versions"][1]["passed"], json!(6));
    let changes = summary["changes"].as_array().unwrap();
    let changed: BTreeSet<&str> = changes
        .iter()
        .map(|c| c["case_id"].as_str().unwrap())
        .collect();
    assert_eq!(changed, BTreeSet::from(["A4", "A5"]), "{summary}");
    for c in changes {
        assert_eq!(c["from_version"], "support@1");
        assert_eq!(c["to_version"], "support@2");
        assert_eq!(
            (&c["from_pass"], &c["to_pass"]),
            (&json!(true), &json!(false))
        );
    }
    let regressed = cell(&view, "support@2", "A4");
    assert_eq!(regressed["pass"], json!(false));
    assert!(
        regressed["verdicts"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("order A4 is refunded"),
        "{regressed}"
    );

    // Every cell is a real run of its version, tagged with the experiment.
    let cells = view["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 20);
    let mut runs = BTreeSet::new();
    for c in cells {
        let run = c["run_id"].as_str().unwrap();
        assert!(runs.insert(run.to_owned()), "one run per cell");
        let got = get(&h, &format!("/v1/runs/{run}"), SUB_A).await;
        assert_eq!(got.status, StatusCode::OK, "{}", got.text);
        assert_eq!(got.body["metadata"]["glia.experiment"], json!(id));
        assert_eq!(got.body["outcome"]["kind"], "succeeded", "{}", got.text);
        let version = got.body["agent_version"].as_u64().unwrap();
        assert_eq!(c["version"], json!(format!("support@{version}")));
        let answer = c["facts"]["answer"].as_str().unwrap();
        let case = c["case_id"].as_str().unwrap();
        assert!(answer.contains(case), "{c}");
        let start = events(&h, run).await;
        let EventKind::SessionStart { config, .. } = &start[0].kind else {
            panic!("session.start first")
        };
        let model = match c["version"].as_str().unwrap() {
            "support@1" => "script:support-v1",
            _ => "script:support-v2",
        };
        assert_eq!(config.model, model);
    }

    // The CI gate finds the regression.
    let summary: glia_evals::stats::Summary = serde_json::from_value(summary.clone()).unwrap();
    let failures = glia_evals::stats::gate(&summary, None, Some("support@1"));
    assert_eq!(failures.len(), 2, "{failures:?}");
    assert!(
        failures.iter().any(|f| f.contains("\"A4\"")),
        "{failures:?}"
    );
    assert!(
        failures.iter().any(|f| f.contains("\"A5\"")),
        "{failures:?}"
    );
    assert!(
        glia_evals::stats::gate(&summary, Some(0.9), None)
            .iter()
            .any(|f| f.contains("support@2"))
    );

    // The list shows it, without results.
    let list = get(&h, "/v1/experiments", SUB_A).await;
    assert_eq!(list.body["experiments"].as_array().unwrap().len(), 1);
    assert_eq!(list.body["experiments"][0]["state"], "completed");
    assert!(
        list.body["experiments"][0]
            .get("cells")
            .is_none_or(Value::is_null)
    );
    // Another tenant sees nothing.
    let foreign = get(&h, &format!("/v1/experiments/{id}"), SUB_B).await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND, "{}", foreign.text);
}

#[tokio::test]
async fn scripted_turns_are_posted_and_the_conversation_closed() {
    let h = evals_harness();
    setup(
        &h,
        json!({"name": "chat", "model": "script:chat", "tools": [], "conversational": true}),
        "talk",
        &[
            json!({"id": "one", "goal": "Hello ONE.", "turns": ["second message"], "expected": {"answer": "got it"}}),
            json!({"id": "two", "goal": "Hello TWO.", "turns": ["second message", "third message"], "expected": {"answer": "bye"}}),
            json!({"id": "none", "goal": "Hello NONE.", "expected": {"answer": "what else"}}),
        ],
    )
    .await;
    let chat = vec![
        ScriptedTurn::text("Hi, what else?"),
        ScriptedTurn::text("Got it."),
        ScriptedTurn::text("Got it, bye."),
    ];
    let agent = library(vec![("chat", Script::Turns(chat))]);
    let id = start(
        &h,
        json!({"name": "talk", "dataset": "talk", "agents": ["chat"], "graders": [{"kind": "contains"}]}),
    )
    .await;
    let (view, graded) = drive(&h, &agent, &id).await;
    assert_eq!(graded, 3);
    for (case, turns, answer) in [
        ("one", &["second message"][..], "Got it."),
        (
            "two",
            &["second message", "third message"][..],
            "Got it, bye.",
        ),
        ("none", &[][..], "Hi, what else?"),
    ] {
        let c = cell(&view, "chat@1", case);
        assert_eq!(c["pass"], json!(true), "{c}");
        assert_eq!(c["facts"]["outcome"], "succeeded");
        assert_eq!(c["facts"]["answer"], answer, "{c}");
        let events = events(&h, c["run_id"].as_str().unwrap()).await;
        let inputs: Vec<&str> = events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::InputReceived { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(inputs, turns, "{case}: each turn posted once, in order");
        assert!(
            matches!(
                &events.last().unwrap().kind,
                EventKind::SessionComplete {
                    outcome: glia_proto::Outcome::Succeeded { .. }
                }
            ),
            "{case}: closed after the turns ran out: {:?}",
            events.last()
        );
    }
}

#[tokio::test]
async fn approvals_are_decided_as_the_eval_says() {
    let h = evals_harness();
    setup(
        &h,
        json!({"name": "refunder", "model": "script:refund", "tools": ["calculator"],
            "policies": [{"tool": "calculator", "action": {"kind": "require_approval"}}]}),
        "refund",
        &[json!({"id": "r1", "goal": "Refund order R1.", "expected": {"answer": "finished"}})],
    )
    .await;
    let agent = library(vec![(
        "refund",
        Script::Turns(vec![
            ScriptedTurn::call("calculator", json!({"op": "add", "a": 1, "b": 2})),
            ScriptedTurn::text("Refund finished."),
        ]),
    )]);
    // Deciding approvals is the approve scope's: a submit-only token cannot
    // start an eval that would decide them instead of a person.
    let submit_only = send(
        &h.router,
        request(
            Method::POST,
            "/v1/experiments",
            Some(SUB_A),
            Some(
                &json!({"eval": {"name": "sneaky", "dataset": "refund", "agents": ["refunder"],
                "approvals": "approve", "graders": [{"kind": "contains"}]}}),
            ),
        ),
    )
    .await;
    assert_eq!(
        (submit_only.status, submit_only.code()),
        (StatusCode::FORBIDDEN, "forbidden"),
        "{:?}",
        submit_only.body
    );
    let list = get(&h, "/v1/experiments", SUB_A).await;
    assert_eq!(
        list.body["experiments"].as_array().map(Vec::len),
        Some(0),
        "nothing stored: {:?}",
        list.body
    );
    for approvals in ["approve", "reject"] {
        let id = start(
            &h,
            json!({"name": approvals, "dataset": "refund", "agents": ["refunder"], "approvals": approvals,
                "graders": [{"kind": "contains"}]}),
        )
        .await;
        // The run parks for approval; the loop decides, once however many
        // passes look before a worker applies the decision.
        let http = reqwest::Client::new();
        tend_once(&h.app, OWNER, &http).await.unwrap();
        admit_once(&h.app).await.unwrap();
        let run = all_runs(&h)
            .await
            .into_iter()
            .find(|r| r.metadata.get("glia.experiment") == Some(&id))
            .unwrap();
        let parked = work(&h, &agent, run.run_id).await;
        assert!(
            matches!(
                parked,
                glia_proto::Status::Parked(glia_proto::PullPoint::AwaitingApproval { .. })
            ),
            "{parked:?}"
        );
        for _ in 0..3 {
            tend_once(&h.app, OWNER, &http).await.unwrap();
        }
        let inbox = inbox_of(&h, run.run_id).await;
        assert!(
            matches!(&inbox[..], [glia_proto::Payload::Approval { by: Some(by), .. }] if *by == format!("experiment:{id}")),
            "one decision waits, nothing contested: {inbox:?}"
        );
        let (view, _) = drive(&h, &agent, &id).await;
        let c = cell(&view, "refunder@1", "r1");
        assert_eq!(c["pass"], json!(true), "{c}");
        let run = c["run_id"].as_str().unwrap();
        let events = events(&h, run).await;
        let resolved: Vec<(&Decision, Option<&str>)> = events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::ApprovalResolved { decision, by, .. } => Some((decision, by.as_deref())),
                _ => None,
            })
            .collect();
        let by = format!("experiment:{id}");
        assert_eq!(resolved.len(), 1, "{approvals}: {resolved:?}");
        let decision = match approvals {
            "approve" => Decision::Approve,
            _ => Decision::Reject {
                reason: "rejected by the eval reject".into(),
            },
        };
        assert_eq!(resolved[0].0, &decision, "{approvals}");
        assert_eq!(resolved[0].1, Some(by.as_str()));
        // What the model saw for the call.
        let state = h.log.load(run.parse().unwrap()).await.unwrap();
        let result = state
            .messages
            .iter()
            .flat_map(|m| &m.content)
            .find_map(|b| match b {
                ContentBlock::ToolResult { content, .. } => {
                    Some(serde_json::to_string(content).unwrap())
                }
                _ => None,
            })
            .unwrap();
        match approvals {
            "approve" => assert!(result.contains("result"), "{result}"),
            _ => assert!(
                result.contains("rejected by the eval reject") && !result.contains("result"),
                "the call did not run: {result}"
            ),
        }
    }
}

#[tokio::test]
async fn the_trajectory_grader_compares_tool_calls() {
    let h = evals_harness();
    let add = json!([{"name": "calculator", "input": {"op": "add"}}]);
    setup(
        &h,
        json!({"name": "tooler", "model": "script:tooler", "tools": ["calculator"]}),
        "traj",
        &[
            json!({"id": "right", "goal": "Compute RIGHT.", "expected": {"tools": add}}),
            json!({"id": "wrong-args", "goal": "Compute WRONG.", "expected": {"tools": add}}),
            json!({"id": "no-call", "goal": "Compute NONE.", "expected": {"tools": add}}),
            json!({"id": "extra", "goal": "Compute TWICE.", "expected": {"tools": add}}),
        ],
    )
    .await;
    let call = |op: &str| ScriptedTurn::call("calculator", json!({"op": op, "a": 1, "b": 2}));
    let agent = library(vec![(
        "tooler",
        by_goal(vec![
            ("RIGHT", vec![call("add"), ScriptedTurn::text("3")]),
            ("WRONG", vec![call("sub"), ScriptedTurn::text("-1")]),
            ("NONE", vec![ScriptedTurn::text("3, by heart")]),
            (
                "TWICE",
                vec![call("add"), call("add"), ScriptedTurn::text("3")],
            ),
        ]),
    )]);
    let id = start(
        &h,
        json!({"name": "traj", "dataset": "traj", "agents": ["tooler"],
            "graders": [{"kind": "trajectory", "order": "exact", "args": "subset"}]}),
    )
    .await;
    let (view, graded) = drive(&h, &agent, &id).await;
    assert_eq!(graded, 4);
    let verdict = |case: &str| cell(&view, "tooler@1", case)["verdicts"][0].clone();
    let right = verdict("right");
    assert_eq!(
        (right["pass"].clone(), right["score"].clone()),
        (json!(true), json!(1.0)),
        "{right}"
    );
    for case in ["wrong-args", "no-call", "extra"] {
        let v = verdict(case);
        assert_eq!(v["pass"], json!(false), "{case}: {v}");
        assert!(v["error"].is_null(), "{case}: a verdict, not an error: {v}");
        assert!(!v["reason"].as_str().unwrap().is_empty(), "{case}: {v}");
        assert_eq!(cell(&view, "tooler@1", case)["pass"], json!(false));
    }
    assert_eq!(view["summary"]["versions"][0]["pass_rate"], json!(0.25));
}

/// An HTTP grader the catalogue allows, against a grader server in the
/// test: a verdict grades by it; garbage, a 500, an answer after the
/// timeout and a redirect (not followed) are grading errors; each cell's
/// grader is called once however many passes look.
#[tokio::test]
async fn an_http_grader_grades_and_its_garbage_is_an_error() {
    use axum::extract::State;
    use std::sync::Mutex;
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let grader = axum::Router::new()
        .route(
            "/grade",
            axum::routing::post(
                |State(seen): State<Arc<Mutex<Vec<Value>>>>,
                 axum::Json(body): axum::Json<Value>| async move {
                    seen.lock().unwrap().push(body.clone());
                    let answer = |status: u16, text: &str| {
                        axum::response::Response::builder()
                            .status(status)
                            .header("content-type", "application/json")
                            .header("location", "http://169.254.169.254/latest")
                            .body(axum::body::Body::from(text.to_owned()))
                            .unwrap()
                    };
                    match body["case"]["id"].as_str().unwrap_or_default() {
                        "good" => answer(
                            200,
                            r#"{"score": 0.75, "pass": true, "reason": "polite and right"}"#,
                        ),
                        "garbage" => answer(200, r#"{"verdict": "yes"}"#),
                        "down" => answer(500, r#"{"error": "boom"}"#),
                        "moved" => answer(302, ""),
                        _ => {
                            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                            answer(200, r#"{"score": 1, "pass": true}"#)
                        }
                    }
                },
            ),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, grader).await.unwrap() });
    let h = allowing(&origin);
    let cases: Vec<Value> = ["good", "garbage", "down", "moved", "slow"]
        .iter()
        .map(|id| json!({"id": id, "goal": format!("Answer {id}."), "expected": {"answer": "ok"}}))
        .collect();
    setup(
        &h,
        json!({"name": "support", "model": "script:support-v1", "tools": []}),
        "graded",
        &cases,
    )
    .await;
    let agent = library(vec![(
        "support-v1",
        Script::Turns(vec![ScriptedTurn::text("ok")]),
    )]);
    let id = start(
        &h,
        json!({"name": "http", "dataset": "graded", "agents": ["support"],
            "graders": [{"kind": "http", "url": format!("{origin}/grade"), "timeout_ms": 300}]}),
    )
    .await;
    let (view, graded) = drive(&h, &agent, &id).await;
    assert_eq!(graded, 5);
    let verdict = |case: &str| cell(&view, "support@1", case)["verdicts"][0].clone();
    let good = verdict("good");
    assert_eq!(
        (
            good["pass"].clone(),
            good["score"].clone(),
            good["reason"].clone()
        ),
        (json!(true), json!(0.75), json!("polite and right")),
        "{good}"
    );
    assert_eq!(cell(&view, "support@1", "good")["pass"], json!(true));
    for case in ["garbage", "down", "moved", "slow"] {
        let v = verdict(case);
        assert_eq!(v["pass"], json!(false), "{case}: {v}");
        assert!(v["error"].is_string(), "{case}: a grading error: {v}");
        assert_eq!(
            cell(&view, "support@1", case)["pass"],
            json!(false),
            "{case}"
        );
    }
    assert!(
        verdict("slow")["error"]
            .as_str()
            .unwrap()
            .contains("did not answer")
    );
    // The body: the case and the run's facts; one call per cell.
    let seen = seen.lock().unwrap().clone();
    let mut ids: Vec<&str> = seen
        .iter()
        .map(|b| b["case"]["id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        ["down", "garbage", "good", "moved", "slow"],
        "{seen:?}"
    );
    let good_body = seen.iter().find(|b| b["case"]["id"] == "good").unwrap();
    assert_eq!(good_body["grader"], "http");
    assert_eq!(good_body["case"]["expected"], json!({"answer": "ok"}));
    assert_eq!(good_body["run"]["answer"], "ok");
    assert_eq!(good_body["run"]["outcome"], "succeeded");
}

/// A tenant with `support` v1 and dataset `cases`, on a dispatcher whose
/// catalogue has no provider and allows HTTP to one origin only.
async fn catalogued() -> H {
    let h = allowing("https://grader.example.com");
    one_case(&h).await;
    h
}

/// An evals harness whose catalogue has no provider and allows HTTP to
/// `origin` only.
fn allowing(origin: &str) -> H {
    let mut h = evals_harness();
    let catalogue = glia_agent::catalogue::Catalogue::parse(
        &format!("[http]\nallowed_origins = [\"{origin}\"]\n"),
        "fleet.toml",
    )
    .unwrap();
    h.app = h
        .app
        .clone()
        .with_admission(Arc::new(move |config| catalogue.admit(config)));
    h.router = glia_dispatcher::router(h.app.clone());
    h
}

/// `support` v1 and dataset `cases` of one case.
async fn one_case(h: &H) {
    setup(
        h,
        json!({"name": "support", "model": "script:support-v1", "tools": []}),
        "cases",
        &[json!({"id": "c1", "goal": "g", "expected": {"answer": "a"}})],
    )
    .await;
}

#[tokio::test]
async fn bad_input_is_refused_naming_the_field_with_nothing_stored() {
    let h = catalogued().await;
    // A dataset whose case patches the config (only an inline version takes it).
    put_cases(
        &h,
        "patched",
        &[json!({"id": "p", "goal": "g", "config": {"max_tokens": 100}})],
    )
    .await;
    let base = || {
        json!({"name": "bad", "dataset": "cases", "agents": ["support@1"],
            "graders": [{"kind": "contains"}]})
    };
    let with = |key: &str, value: Value| {
        let mut eval = base();
        eval[key] = value;
        eval
    };
    let cases = [
        (with("grdrs", json!([])), 422, "eval.grdrs"),
        (
            with("graders", json!([{"kind": "regex", "patern": "x"}])),
            422,
            "eval.graders[0].patern",
        ),
        (with("agents", json!(["support@9"])), 422, "eval.agents[0]"),
        (with("agents", json!(["nobody"])), 422, "eval.agents[0]"),
        (
            with("agents", json!(["support@1", "support"])),
            422,
            "eval.agents[1]",
        ),
        (with("dataset", json!("missing")), 404, ""),
        (
            with(
                "graders",
                json!([{"kind": "judge", "provider": "elsewhere", "model": "m", "rubric": "r"}]),
            ),
            422,
            "eval.graders[0].provider",
        ),
        (
            with(
                "graders",
                json!([{"kind": "contains"}, {"kind": "http", "url": "https://evil.example.net/grade"}]),
            ),
            422,
            "eval.graders[1].url",
        ),
        (
            with("graders", json!([{"kind": "exact"}, {"kind": "unknown"}])),
            422,
            "eval.graders[1].kind",
        ),
        (with("repetitions", json!(0)), 422, "eval.repetitions"),
        (
            with("agents", json!([{"label": "x", "config": {"modle": "m"}}])),
            422,
            "eval.agents[0].config.modle",
        ),
        (with("dataset", json!("patched")), 422, "eval.agents[0]"),
        (
            json!({"name": "bad", "dataset_file": "cases.jsonl", "agents": ["support@1"],
                "graders": [{"kind": "contains"}]}),
            422,
            "eval.dataset_file",
        ),
    ];
    for (eval, status, field) in cases {
        let r = create_experiment(&h, eval.clone(), None).await;
        assert_eq!(r.status.as_u16(), status, "{eval}: {}", r.text);
        if status == 404 {
            assert_eq!(r.code(), "dataset_not_found", "{}", r.text);
        } else {
            assert_eq!(r.body["error"]["field"], json!(field), "{eval}: {}", r.text);
        }
    }
    // With no catalogue at all, no HTTP grader.
    let bare = evals_harness();
    one_case(&bare).await;
    let r = create_experiment(
        &bare,
        with(
            "graders",
            json!([{"kind": "http", "url": "https://grader.example.com/x"}]),
        ),
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert_eq!(
        r.body["error"]["field"], "eval.graders[0].url",
        "{}",
        r.text
    );
    assert!(r.text.contains("no catalogue"), "{}", r.text);

    // Datasets: JSON of the wrong shape (a case, not `{"cases": […]}`),
    // neither JSON nor JSON Lines, a repeated id, an unknown key; nothing
    // stored.
    let req = request(
        Method::PUT,
        "/v1/datasets/json",
        Some(SUB_A),
        Some(&json!({"id": "x", "goal": "g"})),
    );
    let r = send(&h.router, req).await;
    assert_eq!(
        (r.status, r.code(), r.body["error"]["field"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", Some("id")),
        "{}",
        r.text
    );
    let plain = axum::http::Request::builder()
        .method(Method::PUT)
        .uri("/v1/datasets/plain")
        .header(axum::http::header::AUTHORIZATION, format!("Bearer {SUB_A}"))
        .header(axum::http::header::CONTENT_TYPE, "text/plain")
        .body(axum::body::Body::from("{\"id\": \"x\", \"goal\": \"g\"}\n"))
        .unwrap();
    let r = send(&h.router, plain).await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{}", r.text);
    let dup = [
        json!({"id": "x", "goal": "g"}),
        json!({"id": "y", "goal": "g"}),
        json!({"id": "x", "goal": "g"}),
    ];
    let r = put_text(&h, "dups", dup.iter().map(|c| format!("{c}\n")).collect()).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert_eq!(r.body["error"]["line"], json!(3), "{}", r.text);
    assert_eq!(r.body["error"]["field"], "id", "{}", r.text);
    assert!(r.text.contains("line 1"), "names the first use: {}", r.text);
    let r = put_text(
        &h,
        "unknown",
        format!("{}\n", json!({"id": "x", "goal": "g", "expectd": {}})),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert_eq!(r.body["error"]["line"], json!(1), "{}", r.text);
    assert_eq!(r.body["error"]["field"], "expectd", "{}", r.text);

    for h in [&h, &bare] {
        let list = get(h, "/v1/experiments", SUB_A).await;
        assert_eq!(list.body["experiments"], json!([]), "{}", list.text);
        let batches = get(h, "/v1/batches", SUB_A).await;
        assert_eq!(batches.body["batches"], json!([]), "{}", batches.text);
        assert!(all_runs(h).await.is_empty());
    }
    let datasets = get(&h, "/v1/datasets", SUB_A).await;
    let names: Vec<&str> = datasets.body["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["cases", "patched"], "{}", datasets.text);

    // What the catalogue has is accepted: the refusals were the fields'.
    let fine = with(
        "graders",
        json!([{"kind": "http", "url": "https://grader.example.com/grade"},
            {"kind": "judge", "model": "m", "rubric": "r"}]),
    );
    let r = create_experiment(&h, fine, None).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.body["eval"]["agents"], json!(["support@1"]));
}

#[tokio::test]
async fn creation_is_idempotent_by_key() {
    let h = evals_harness();
    two_versions(&h).await;
    let first = create_experiment(&h, refunds_eval(), Some("k-1")).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text);
    let again = create_experiment(&h, refunds_eval(), Some("k-1")).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text);
    assert_eq!(again.body["id"], first.body["id"]);
    assert_eq!(again.body["versions"], first.body["versions"]);
    let mut other = refunds_eval();
    other["repetitions"] = json!(3);
    let conflict = create_experiment(&h, other.clone(), Some("k-1")).await;
    assert_eq!(conflict.status, StatusCode::CONFLICT, "{}", conflict.text);
    assert_eq!(conflict.code(), "idempotency_conflict");
    let list = get(&h, "/v1/experiments", SUB_A).await;
    assert_eq!(list.body["experiments"].as_array().unwrap().len(), 1);
    let batches = get(&h, "/v1/batches", SUB_A).await;
    assert_eq!(
        batches.body["batches"].as_array().unwrap().len(),
        2,
        "{}",
        batches.text
    );
    // Another key is another experiment.
    let second = create_experiment(&h, other, Some("k-2")).await;
    assert_eq!(second.status, StatusCode::CREATED, "{}", second.text);
    assert_ne!(second.body["id"], first.body["id"]);

    // A dataset put again unchanged is the same version; changed, the next.
    let cases = get(&h, "/v1/datasets/cases", SUB_A).await;
    assert_eq!(
        cases.body["cases"].as_array().unwrap().len(),
        5,
        "{}",
        cases.text
    );
    let text: String = cases.body["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| format!("{c}\n"))
        .collect();
    let same = put_text(&h, "cases", text.clone()).await;
    assert_eq!(same.status, StatusCode::OK, "{}", same.text);
    assert_eq!(same.body["version"], json!(1), "{}", same.text);
    let more = format!(
        "{text}{}\n",
        json!({"id": "A6", "goal": "Refund order A6."})
    );
    let next = put_text(&h, "cases", more).await;
    assert_eq!(next.status, StatusCode::CREATED, "{}", next.text);
    assert_eq!(next.body["version"], json!(2), "{}", next.text);
    // The experiment stays pinned to the version it started with.
    let first_id = first.body["id"].as_str().unwrap();
    let got = get(&h, &format!("/v1/experiments/{first_id}"), SUB_A).await;
    assert_eq!(got.body["dataset"], "cases@1");
    assert_eq!(got.body["progress"]["cells"], json!(20));
}

#[tokio::test]
async fn a_judge_is_a_run_once_per_cell_and_its_garbage_an_error() {
    let h = evals_harness();
    // One case a judge grades, three it answers garbage on.
    setup(
        &h,
        json!({"name": "support", "model": "script:answers", "tools": []}),
        "judged",
        &[
            json!({"id": "good", "goal": "Refund order GOOD."}),
            json!({"id": "prose", "goal": "Refund order PROSE."}),
            json!({"id": "word", "goal": "Refund order WORD."}),
            json!({"id": "tools", "goal": "Refund order TOOLS."}),
        ],
    )
    .await;
    let verdict = json!({"score": 0.9, "pass": true, "reasoning": "The refund was confirmed."});
    let word = json!({"score": "high", "pass": true, "reasoning": "Great."});
    let lookup = ScriptedTurn::call("lookup", json!({"q": "refund"}));
    let agent = library(vec![
        (
            "answers",
            Script::Turns(vec![ScriptedTurn::text("The refund is approved.")]),
        ),
        (
            "judge",
            by_goal(vec![
                ("GOOD", vec![ScriptedTurn::call("final_output", verdict)]),
                // Text, never the structured output: re-asked, then failed.
                ("PROSE", vec![ScriptedTurn::text("high"); 3]),
                // A score that is a word: refused by the output schema.
                ("WORD", vec![ScriptedTurn::call("final_output", word); 3]),
                // Tools it does not have, until its budget is spent.
                ("TOOLS", vec![lookup; 4]),
            ]),
        ),
    ]);
    let id = start(
        &h,
        json!({"name": "judged", "dataset": "judged", "agents": ["support@1"], "repetitions": 2,
            "graders": [{"kind": "judge", "model": "script:judge", "rubric": "The refund is confirmed."}]}),
    )
    .await;
    let (view, graded) = drive(&h, &agent, &id).await;
    assert_eq!(graded, 8);
    let judges: Vec<RunSummary> = all_runs(&h)
        .await
        .into_iter()
        .filter(|r| r.tags.iter().any(|t| t == "eval-judge"))
        .collect();
    for rep in cells_of(&view, "support@1") {
        let v = &rep["verdicts"][0];
        let reason = v["reason"].as_str().unwrap();
        assert!(
            judges
                .iter()
                .any(|j| reason.contains(&j.run_id.to_string())),
            "the verdict names its judge run: {v}"
        );
        let error = v["error"].as_str().unwrap_or_default();
        match rep["case_id"].as_str().unwrap() {
            "good" => {
                assert_eq!(rep["pass"], json!(true), "{rep}");
                assert_eq!(v["score"], json!(0.9));
                assert!(v["error"].is_null(), "{v}");
                assert!(reason.contains("The refund was confirmed."), "{reason}");
            }
            case => {
                assert_eq!(rep["pass"], json!(false), "garbage never passes: {rep}");
                assert_eq!((&v["pass"], &v["score"]), (&json!(false), &json!(0.0)));
                assert!(rep["error"].as_str().is_some(), "{rep}");
                let why = match case {
                    "prose" => "must be given by calling final_output",
                    "word" => "\"high\" is not of type \"number\"",
                    _ => "budget",
                };
                assert!(error.starts_with("the judge run "), "{case}: {v}");
                assert!(error.contains(why), "{case}: {v}");
            }
        }
    }
    assert_eq!(view["summary"]["versions"][0]["errors"], json!(6));
    assert_eq!(view["summary"]["versions"][0]["passed"], json!(2));
    // One judge run per cell, however many passes looked at it; each
    // tagged and carrying the experiment, and ended.
    assert_eq!(judges.len(), 8, "{judges:?}");
    for j in &judges {
        assert_eq!(j.metadata.get("glia.experiment"), Some(&id));
        assert_eq!(j.status, RunStatus::Done);
        assert_eq!(j.batch_id, None);
    }
}

#[tokio::test]
async fn cancel_ends_the_experiment_and_its_batches() {
    let h = evals_harness();
    let agent = two_versions(&h).await;
    let id = start(&h, refunds_eval()).await;
    // Part of it runs.
    admit_once(&h.app).await.unwrap();
    let first = all_runs(&h).await;
    assert!(!first.is_empty());
    work(&h, &agent, first[0].run_id).await;
    // Another tenant cannot cancel it.
    let foreign = cancel(&h, &id, SUB_B).await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND, "{}", foreign.text);
    assert_eq!(foreign.code(), "experiment_not_found");

    let r = cancel(&h, &id, SUB_A).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["state"], "cancelled");
    assert!(r.body["finished_at"].is_string(), "{}", r.text);
    for v in r.body["versions"].as_array().unwrap() {
        let batch = v["batch_id"].as_str().unwrap();
        let b = get(&h, &format!("/v1/batches/{batch}"), SUB_A).await;
        assert_eq!(b.body["status"], "cancelled", "{}", b.text);
    }
    // Its runs still going are asked to stop.
    let runs = all_runs(&h).await;
    assert_eq!(runs.len(), 20, "every cell was admitted");
    for r in runs.iter().filter(|r| r.status != RunStatus::Done) {
        let inbox = inbox_of(&h, r.run_id).await;
        assert!(
            inbox
                .iter()
                .any(|p| matches!(p, glia_proto::Payload::Cancel { .. })),
            "{inbox:?}"
        );
        work(&h, &agent, r.run_id).await;
    }
    assert!(
        all_runs(&h)
            .await
            .iter()
            .all(|r| r.status == RunStatus::Done)
    );
    let again = cancel(&h, &id, SUB_A).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.text);
    assert_eq!(again.code(), "experiment_ended");
    // The loop leaves it alone: nothing graded, nothing admitted.
    let http = reqwest::Client::new();
    assert_eq!(tend_once(&h.app, Uuid::now_v7(), &http).await.unwrap(), 0);
    admit_once(&h.app).await.unwrap();
    let got = get(&h, &format!("/v1/experiments/{id}"), SUB_A).await;
    assert_eq!(got.body["state"], "cancelled");
    let missing = cancel(&h, &Uuid::now_v7().to_string(), SUB_A).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{}", missing.text);
}

/// The JSON form of a dataset upload, `{"cases": […]}`, is the JSON Lines
/// form's content: the same cases are the same version.
#[tokio::test]
async fn a_dataset_as_json_is_the_same_as_json_lines() {
    let h = evals_harness();
    let cases = [
        json!({"id": "a", "goal": "Refund A1.", "expected": {"answer": "done"}}),
        json!({"id": "b", "messages": [{"role": "user", "content": "Hi"}, {"role": "user", "content": "B2"}]}),
    ];
    let r = put_text(&h, "same", cases.iter().map(|c| format!("{c}\n")).collect()).await;
    assert_eq!(
        (r.status, r.body["version"].as_u64()),
        (StatusCode::CREATED, Some(1)),
        "{}",
        r.text
    );
    let hash = r.body["content_hash"].clone();
    let req = request(
        Method::PUT,
        "/v1/datasets/same",
        Some(SUB_A),
        Some(&json!({"cases": cases})),
    );
    let r = send(&h.router, req).await;
    assert_eq!(
        (
            r.status,
            r.body["version"].as_u64(),
            r.body["content_hash"].clone()
        ),
        (StatusCode::OK, Some(1), hash),
        "{}",
        r.text
    );
    let got = get(&h, "/v1/datasets/same", SUB_A).await;
    assert_eq!(got.body["cases"][1]["turns"], json!(["B2"]), "{}", got.text);
}

/// Replay evals: cases made from two recorded runs
/// ([`glia_evals::case_from_run`]) are run under another version on a
/// worker that has no tools at all. The runs are offered the recording's
/// tools; a call the recording has is answered with the recorded result,
/// one it lacks is an error result (nothing runs either way), and the
/// trajectory grader tells the two apart.
#[tokio::test]
async fn a_replay_eval_answers_tools_from_the_recording_and_runs_nothing() {
    let h = evals_harness();
    let def = |model: &str| json!({"name": "tooler", "model": format!("script:{model}"), "system": model, "tools": ["calculator"]});
    register(&h, "a", def("rec")).await;
    register(&h, "a", def("v2")).await;
    let call = |op: &str| ScriptedTurn::call("calculator", json!({"op": op, "a": 1, "b": 2}));
    let recorder = library(vec![(
        "rec",
        by_goal(vec![
            ("SAME", vec![call("add"), ScriptedTurn::text("3")]),
            ("OTHER", vec![call("add"), ScriptedTurn::text("3")]),
        ]),
    )]);
    let mut recorded = Vec::new();
    for (case, goal) in [("same", "Compute SAME."), ("other", "Compute OTHER.")] {
        let r = post(
            &h,
            "/v1/runs",
            SUB_A,
            json!({"goal": goal, "agent": "tooler@1"}),
        )
        .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
        recorded.push((case, r.body["run_id"].as_str().unwrap().to_owned()));
    }
    work_all(&h, &recorder).await;

    let mut cases = Vec::new();
    for (case, run) in &recorded {
        let c = glia_evals::case_from_run(case, &events(&h, run).await).unwrap();
        assert_eq!(c.expected["answer"], json!("3"));
        assert_eq!(
            c.expected["tools"],
            json!([{"name": "calculator", "input": {"op": "add", "a": 1, "b": 2}}])
        );
        assert_eq!(c.metadata["source_run"], *run);
        assert_eq!(c.metadata["source_agent"], "tooler@1");
        let tools = c.recorded_tools.as_ref().unwrap();
        assert_eq!(tools.tools.len(), 1, "{tools:?}");
        assert_eq!(tools.tools[0].name, "calculator");
        assert_eq!(tools.calls.len(), 1);
        assert_eq!(
            tools.calls[0].output,
            glia_proto::ToolContent::Text(json!({"result": 3}).to_string())
        );
        cases.push(c);
    }
    let put = put_text(&h, "replayed", glia_evals::to_jsonl(&cases)).await;
    assert_eq!(put.status, StatusCode::CREATED, "{}", put.text);

    // Version 2 calls as recorded on SAME and with other arguments on
    // OTHER, on a worker with no tools: nothing could run a call.
    let mut lib = glia_agent::provider::ScriptLibrary::default();
    lib.insert_script(
        "v2",
        by_goal(vec![
            ("SAME", vec![call("add"), ScriptedTurn::text("3")]),
            ("OTHER", vec![call("sub"), ScriptedTurn::text("-1")]),
        ]),
    );
    let replayer = Agent::new(Arc::new(lib));
    let id = start(
        &h,
        json!({"name": "replay", "dataset": "replayed", "agents": ["tooler@2"],
            "graders": [{"kind": "trajectory", "order": "exact", "args": "exact"}]}),
    )
    .await;
    let (view, graded) = drive(&h, &replayer, &id).await;
    assert_eq!(graded, 2);
    assert_eq!(
        cell(&view, "tooler@2", "same")["pass"],
        json!(true),
        "{view}"
    );
    assert_eq!(
        cell(&view, "tooler@2", "other")["pass"],
        json!(false),
        "{view}"
    );

    let same = events(
        &h,
        cell(&view, "tooler@2", "same")["run_id"].as_str().unwrap(),
    )
    .await;
    let offered: Vec<_> = same
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::StepStart { tools, .. } => Some(tools.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert!(!offered.is_empty());
    assert!(
        offered
            .iter()
            .all(|t| matches!(t.source, Some(glia_proto::ToolSource::Recorded { .. }))),
        "{offered:?}"
    );
    let results: Vec<_> = same
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult { content, .. } => Some(content.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        results,
        vec![glia_proto::ToolContent::Text(
            json!({"result": 3}).to_string()
        )]
    );
    let other = events(
        &h,
        cell(&view, "tooler@2", "other")["run_id"].as_str().unwrap(),
    )
    .await;
    let errors: Vec<String> = other
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolError { message, .. } => Some(message.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(errors.len(), 1, "{other:?}");
    assert!(
        errors[0].contains("the recording has no call of calculator"),
        "{errors:?}"
    );
}

/// A recording is tenant input like any other: checked when a dataset is
/// stored and when a run is submitted, 422 naming the field; the run
/// config's own field is the dispatcher's.
#[tokio::test]
async fn a_bad_recording_is_refused_naming_the_field() {
    let h = evals_harness();
    let tool = json!({"name": "lookup", "input_schema": {"type": "object"}});
    let call = |name: &str| json!({"name": name, "input": {}, "output": "ok"});
    let case =
        |recorded: Value| json!({"id": "c1", "goal": "Look it up.", "recorded_tools": recorded});
    for (recorded, field) in [
        (
            json!({"tools": [tool], "calls": [call("other")]}),
            "recorded_tools.calls[0].name",
        ),
        (
            json!({"tools": [tool, tool]}),
            "recorded_tools.tools[1].name",
        ),
        (
            json!({"tools": [{"name": "x", "input_schema": {"type": "bogus"}}]}),
            "recorded_tools.tools[0].input_schema",
        ),
        (json!({"tools": [], "extra": 1}), "recorded_tools"),
    ] {
        let r = put_text(
            &h,
            "bad",
            serde_json::to_string(&case(recorded.clone())).unwrap(),
        )
        .await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
        assert!(r.text.contains(field), "{field}: {}", r.text);
        let r = post(
            &h,
            "/v1/runs",
            SUB_A,
            json!({"goal": "Look it up.", "recorded_tools": recorded}),
        )
        .await;
        assert!(r.status.is_client_error(), "{}", r.text);
    }
    let r = get(&h, "/v1/datasets", SUB_A).await;
    assert_eq!(r.body["datasets"], json!([]), "{}", r.text);
    let r = post(
        &h,
        "/v1/runs",
        SUB_A,
        json!({"goal": "Look it up.", "config": {"recorded_tools": {"tools": [tool]}}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(r.text.contains("config.recorded_tools"), "{}", r.text);
}

/// Cancelling an experiment cancels its judge runs still going, not only
/// its batches: nobody will read their verdicts.
#[tokio::test]
async fn cancel_cancels_its_judge_runs_still_going() {
    let h = evals_harness();
    setup(
        &h,
        json!({"name": "support", "model": "script:answers", "tools": []}),
        "judged",
        &[json!({"id": "one", "goal": "Refund order ONE."})],
    )
    .await;
    let agent = library(vec![(
        "answers",
        Script::Turns(vec![ScriptedTurn::text("The refund is approved.")]),
    )]);
    let id = start(
        &h,
        json!({"name": "judged", "dataset": "judged", "agents": ["support@1"],
            "graders": [{"kind": "judge", "model": "script:judge", "rubric": "The refund is confirmed."}]}),
    )
    .await;
    let http = glia_dispatcher::evals::grader_client();
    // The cell's run ends; the next pass admits its judge, which no
    // worker has taken yet.
    tend_once(&h.app, OWNER, &http).await.unwrap();
    admit_once(&h.app).await.unwrap();
    work_all(&h, &agent).await;
    tend_once(&h.app, OWNER, &http).await.unwrap();
    let judges: Vec<RunSummary> = all_runs(&h)
        .await
        .into_iter()
        .filter(|r| {
            r.tags
                .iter()
                .any(|t| t == glia_dispatcher::evals::JUDGE_TAG)
        })
        .collect();
    assert_eq!(judges.len(), 1, "{judges:?}");
    assert_ne!(judges[0].status, RunStatus::Done);

    let r = cancel(&h, &id, SUB_A).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let inbox = inbox_of(&h, judges[0].run_id).await;
    assert!(
        inbox
            .iter()
            .any(|p| matches!(p, glia_proto::Payload::Cancel { .. })),
        "the judge is asked to stop: {inbox:?}"
    );
}

/// A run out of anything but turns (here tool calls) is cancelled, and its
/// cell fails: it never passes on an answer it did not finish. A run out
/// of turns is closed instead (`scripted_turns_are_posted_…`).
#[tokio::test]
async fn a_run_out_of_tool_calls_is_cancelled_and_its_cell_fails() {
    let h = evals_harness();
    setup(
        &h,
        json!({"name": "looper", "model": "script:looper", "tools": ["calculator"],
            "budget": {"max_tool_calls": 1}}),
        "loops",
        &[json!({"id": "loop", "goal": "Add forever.", "expected": {"answer": "3"}})],
    )
    .await;
    let add = ScriptedTurn::call("calculator", json!({"op": "add", "a": 1, "b": 2}));
    let agent = library(vec![(
        "looper",
        Script::Turns(vec![add.clone(), add, ScriptedTurn::text("3")]),
    )]);
    let id = start(
        &h,
        json!({"name": "loops", "dataset": "loops", "agents": ["looper"],
            "graders": [{"kind": "contains", "expected": "answer"}]}),
    )
    .await;
    let (view, graded) = drive(&h, &agent, &id).await;
    assert_eq!(graded, 1);
    let c = cell(&view, "looper@1", "loop");
    assert_eq!(c["pass"], json!(false), "{c}");
    let run = c["run_id"].as_str().unwrap();
    let cancelled = events(&h, run).await.iter().any(|e| {
        matches!(
            &e.kind,
            EventKind::SessionCancel { reason } if reason.contains("ran out of its tool_calls budget")
        )
    });
    assert!(cancelled, "{c}");
    assert_eq!(c["status"], "cancelled", "{c}");
}
