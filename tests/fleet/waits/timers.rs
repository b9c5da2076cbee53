//! See the [module](super).

use std::time::{Duration, Instant};

use glia_testkit::fleet::{Api, Fleet};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(180);

/// The run's summary once `done(run)` holds; panics after [`DEADLINE`].
fn wait_run(api: &Api, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let until = Instant::now() + DEADLINE;
    loop {
        if let Ok((200, run)) = glia_testkit::fleet::http_as(
            "GET",
            &format!("{}/v1/runs/{id}", api.server),
            None,
            api.token.as_deref(),
        ) && done(&run)
        {
            return run;
        }
        assert!(Instant::now() < until, "{what}: not within {DEADLINE:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn parked_at(run: &Value, kind: &str) -> bool {
    run["status"] == "parked" && run["pull_point"]["kind"] == kind
}

fn succeeded(run: &Value) -> bool {
    run["status"] == "done"
}

/// The content of the run's `tool.result` events.
fn results(api: &Api, id: &str) -> Vec<String> {
    api.events(id)
        .iter()
        .filter(|e| e["type"] == "tool.result")
        .map(|e| {
            let c = &e["data"]["content"];
            c.as_str().map_or_else(|| c.to_string(), str::to_owned)
        })
        .collect()
}

fn assert_answer(run: &Value, answer: &str) {
    assert_eq!(run["outcome"]["kind"], "succeeded", "{run}");
    assert_eq!(run["outcome"]["answer"], answer, "{run}");
}

#[test]
fn a_run_sleeps_across_a_dispatcher_restart_and_wakes() {
    let mut fleet = Fleet::new(&[(
        "sleepy",
        json!([{"tool_calls": [{"name": "sleep", "input": {"seconds": 3}}]}, {"text": "awake"}]),
    )]);
    fleet.start_dispatcher();
    fleet.start_worker(2_000);
    let id = fleet.submit(
        "sleep three seconds",
        json!({"model": "script:sleepy", "builtin_tools": ["sleep"]}),
    );
    let parked = wait_run(&fleet, &id, "parked at awaiting_timer", |r| {
        parked_at(r, "awaiting_timer") || succeeded(r)
    });
    assert!(parked_at(&parked, "awaiting_timer"), "{parked}");
    assert_eq!(
        fleet.live_leases_of("w0"),
        0,
        "no worker holds a sleeping run"
    );
    fleet.restart_dispatcher();
    let done = wait_run(&fleet, &id, "woken and done", succeeded);
    assert_answer(&done, "awake");
    let results = results(&fleet, &id);
    assert_eq!(results.len(), 1, "{results:?}");
    let woke: Value = serde_json::from_str(&results[0]).unwrap();
    let due = chrono::DateTime::parse_from_rfc3339(woke["due_at"].as_str().unwrap()).unwrap();
    let at = chrono::DateTime::parse_from_rfc3339(woke["woke_at"].as_str().unwrap()).unwrap();
    assert!(at >= due, "never early: {woke}");
}

#[test]
fn a_waiting_run_whose_worker_was_killed_completes_when_the_event_arrives() {
    let mut fleet = Fleet::new(&[(
        "waiter",
        json!([
            {"tool_calls": [{"name": "wait_for_event", "input": {"key": "order/7:signed", "timeout_seconds": 3600}}]},
            {"text": "signed"}
        ]),
    )]);
    fleet.start_dispatcher();
    fleet.start_worker(2_000);
    let id = fleet.submit(
        "wait for the signature",
        json!({"model": "script:waiter", "builtin_tools": ["wait_for_event"]}),
    );
    let parked = wait_run(&fleet, &id, "parked at awaiting_event", |r| {
        parked_at(r, "awaiting_event") || succeeded(r)
    });
    assert!(parked_at(&parked, "awaiting_event"), "{parked}");
    assert_eq!(parked["pull_point"]["keys"], json!(["order/7:signed"]));
    fleet.kill_worker(0);
    fleet.start_worker(2_000);
    let (status, body) = fleet.post(
        "/v1/events",
        json!({"key": "order/7:signed", "payload": {"signed_by": "ann"}}),
    );
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["delivered"], 1, "{body}");
    let done = wait_run(&fleet, &id, "resumed by the event", succeeded);
    assert_answer(&done, "signed");
    let results = results(&fleet, &id);
    assert_eq!(results.len(), 1, "{results:?}");
    let got: Value = serde_json::from_str(&results[0]).unwrap();
    assert_eq!(got["payload"], json!({"signed_by": "ann"}), "{got}");
}

#[test]
fn an_event_posted_before_the_wait_is_delivered_when_it_begins() {
    let mut fleet = Fleet::new(&[(
        "late",
        json!([
            {"tool_calls": [{"name": "wait_for_event", "input": {"key": "doc/1:approved"}}]},
            {"text": "approved"}
        ]),
    )]);
    fleet.start_dispatcher();
    let (status, body) = fleet.post(
        "/v1/events",
        json!({"key": "doc/1:approved", "payload": {"by": "legal"}}),
    );
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["delivered"], 0, "nobody waits yet: {body}");
    fleet.start_worker(2_000);
    let id = fleet.submit(
        "wait for legal",
        json!({"model": "script:late", "builtin_tools": ["wait_for_event"]}),
    );
    let done = wait_run(&fleet, &id, "the kept event delivered", succeeded);
    assert_answer(&done, "approved");
    let results = results(&fleet, &id);
    assert_eq!(results.len(), 1, "once: {results:?}");
    let got: Value = serde_json::from_str(&results[0]).unwrap();
    assert_eq!(got["payload"], json!({"by": "legal"}), "{got}");
}

#[test]
fn a_delayed_start_parks_across_a_dispatcher_restart_and_runs_once_due() {
    let mut fleet = Fleet::new(&[("later", json!([{"text": "started"}]))]);
    fleet.start_dispatcher();
    fleet.start_worker(2_000);
    // Far enough ahead that a busy machine admits it before the time.
    let start_at = chrono::Utc::now() + chrono::Duration::seconds(20);
    let (status, run) = fleet.post(
        "/v1/runs",
        json!({"goal": "start in twenty seconds", "config": {"model": "script:later"},
               "start_at": start_at.to_rfc3339()}),
    );
    assert_eq!(status, 201, "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    assert!(parked_at(&run, "awaiting_timer"), "admitted parked: {run}");
    assert_eq!(run["pull_point"]["call_ids"], json!([]), "{run}");
    assert_eq!(
        run["pull_point"]["wake_at_ms"],
        json!(start_at.timestamp_millis())
    );
    assert_eq!(
        fleet.live_leases_of("w0"),
        0,
        "no worker holds a run waiting to start"
    );
    fleet.restart_dispatcher();
    let done = wait_run(&fleet, &id, "started and done", succeeded);
    assert_answer(&done, "started");
    let events = fleet.events(&id);
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds[..2], ["session.start", "session.resume"], "{kinds:?}");
    assert_eq!(events[1]["data"]["by"], Value::Null, "glia's own resume");
    assert_eq!(
        kinds.iter().filter(|k| **k == "session.resume").count(),
        1,
        "started once: {kinds:?}"
    );
    let first_call = events
        .iter()
        .find(|e| e["type"] == "model.call")
        .expect("a model call");
    let at = chrono::DateTime::parse_from_rfc3339(first_call["at"].as_str().unwrap()).unwrap();
    assert!(at >= start_at, "never before its start time: {first_call}");
}
