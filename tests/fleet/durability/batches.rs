//! Batches end to end: `glia dispatcher` and two `glia worker` processes on
//! the real Postgres, RabbitMQ and Redis. A batch submitted as JSON Lines
//! survives its dispatcher being killed with SIGKILL mid-admission (twice):
//! every item runs, none twice. A spend cap stops admissions; raising it
//! lets the batch complete. Pausing a batch parks its runs at `paused`;
//! resuming it completes every item once, through a worker killed with
//! SIGKILL. `glia dev` runs a batch from its in-memory store. The 10,000-item run and the fairness
//! measurement are `bench_*` (ignored; figures in BENCHMARKS.md).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use glia_testkit::fleet::*;
use serde_json::{Value, json};

/// POST a JSON Lines body to `/v1/batches`: `(status, answer)`.
fn submit_jsonl(api: &Api, lines: impl Iterator<Item = Value>) -> (u16, Value) {
    let body: String = lines.map(|l| format!("{l}\n")).collect();
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let resp = client
        .post(format!("{}/v1/batches", api.server))
        .header("content-type", "application/jsonl")
        .body(body)
        .send()
        .expect("dispatcher answers");
    let status = resp.status().as_u16();
    (
        status,
        serde_json::from_str(&resp.text().unwrap()).unwrap_or(Value::Null),
    )
}

/// The batch's view, retried across a dispatcher restart.
fn batch_view(api: &Api, id: &str) -> Value {
    loop {
        if let Ok((200, v)) = http("GET", &format!("{}/v1/batches/{id}", api.server), None) {
            return v;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Poll the batch until `done` holds of its view; panics after `limit`.
fn wait_batch(
    api: &Api,
    id: &str,
    limit: Duration,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let v = batch_view(api, id);
        if done(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "batch {id}: {what} not within {limit:?}: {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every run of the batch (all pages).
fn runs_of(api: &Api, id: &str) -> Vec<Value> {
    let mut runs = Vec::new();
    let mut cursor = String::new();
    loop {
        let (status, page) = api.get(&format!("/v1/runs?batch_id={id}&limit=1000{cursor}"));
        assert_eq!(status, 200, "{page}");
        runs.extend(page["runs"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => return runs,
        }
    }
}

/// The results JSON Lines, parsed.
fn results(api: &Api, id: &str) -> Vec<Value> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let text = client
        .get(format!("{}/v1/batches/{id}/results", api.server))
        .send()
        .unwrap()
        .text()
        .unwrap();
    text.lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("a results line is JSON ({e}): {l}"))
        })
        .collect()
}

fn items(n: usize) -> impl Iterator<Item = Value> {
    (0..n).map(
        |i| json!({"custom_id": format!("item-{i}"), "goal": "Answer {{ i }}", "inputs": {"i": i}}),
    )
}

fn assert_each_item_ran_once(api: &Api, id: &str, n: usize) {
    let lines = results(api, id);
    assert_eq!(lines.len(), n, "one results line per item");
    let ids: BTreeSet<&str> = lines
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), n, "each custom_id once");
    let failed: Vec<&Value> = lines
        .iter()
        .filter(|l| l["status"] != "succeeded")
        .collect();
    assert!(failed.is_empty(), "every item succeeded: {failed:?}");
    let runs = runs_of(api, id);
    assert_eq!(runs.len(), n, "one run per item: none ran twice");
    let goals: BTreeSet<&str> = runs.iter().map(|r| r["goal"].as_str().unwrap()).collect();
    assert_eq!(goals.len(), n, "no goal has two runs");
    let result_runs: BTreeSet<&str> = lines
        .iter()
        .map(|l| l["run_id"].as_str().unwrap())
        .collect();
    let log_runs: BTreeSet<&str> = runs.iter().map(|r| r["run_id"].as_str().unwrap()).collect();
    assert_eq!(
        result_runs, log_runs,
        "the results name exactly the batch's runs"
    );
}

#[test]
fn a_dispatcher_killed_mid_admission_loses_no_item_and_runs_none_twice() {
    let mut fleet = Fleet::new(&[("answer", json!([{"text": "ok"}]))]);
    fleet
        .extra_env
        .push(("GLIA_BATCH_MAX_IN_FLIGHT".into(), "16".into()));
    fleet.start_dispatcher();
    fleet.start_worker(2_000);
    fleet.start_worker(2_000);
    let n = 300;
    let spec = json!({"config": {"model": "script:answer"}});
    let (status, batch) = submit_jsonl(&fleet, std::iter::once(spec).chain(items(n)));
    assert_eq!(status, 201, "{batch}");
    let id = batch["id"].as_str().unwrap().to_owned();
    for round in 0..2 {
        // Mid-admission: some items started, some still queued.
        let started = 40 + round * 100;
        wait_batch(
            &fleet,
            &id,
            Duration::from_secs(120),
            "admission under way",
            |v| {
                let c = &v["counts"];
                c["succeeded"].as_u64().unwrap_or(0) + c["running"].as_u64().unwrap_or(0)
                    >= started as u64
                    && c["queued"].as_u64().unwrap_or(0) > 0
            },
        );
        fleet.restart_dispatcher();
    }
    let done = wait_batch(&fleet, &id, Duration::from_secs(300), "completion", |v| {
        v["status"] == "completed"
    });
    assert_eq!(done["counts"]["succeeded"], n, "{done}");
    assert_each_item_ran_once(&fleet, &id, n);
}

#[test]
fn a_spend_cap_stops_admissions_and_raising_it_completes_the_batch() {
    // Each run makes one model call reporting 100 tokens.
    let mut fleet = Fleet::new(&[(
        "costly",
        json!([{"text": "ok", "usage": {"input_tokens": 60, "output_tokens": 40}}]),
    )]);
    fleet.start_dispatcher();
    fleet.start_worker(2_000);
    fleet.start_worker(2_000);
    let (n, in_flight, cap) = (40u64, 4u64, 1_000u64);
    let spec = json!({"config": {"model": "script:costly"}, "options": {"max_in_flight": in_flight, "spend_cap": {"tokens": cap}}});
    let (status, batch) = submit_jsonl(&fleet, std::iter::once(spec).chain(items(n as usize)));
    assert_eq!(status, 201, "{batch}");
    let id = batch["id"].as_str().unwrap().to_owned();
    // The admission pass after the one that saw the spend reach the cap
    // pauses the batch; until then the view can show the cap reached on an
    // active batch that admits nothing.
    let held = wait_batch(
        &fleet,
        &id,
        Duration::from_secs(120),
        "the cap to pause the batch",
        |v| v["status"] == "paused" && v["counts"]["running"] == 0,
    );
    assert_eq!(held["cap_reached"], true, "only the cap paused it: {held}");
    assert!(
        held["counts"]["queued"].as_u64().unwrap_or(0) > 0,
        "the cap stopped admissions before the end: {held}"
    );
    let spent = held["spend"]["tokens"].as_u64().unwrap();
    assert!(spent >= cap, "admissions stop only at the cap: {held}");
    assert!(
        spent <= cap + in_flight * 100,
        "at most one call per run in flight beyond the cap: {held}"
    );
    // Nothing more starts while the cap holds.
    let again = batch_view(&fleet, &id);
    assert_eq!(again["counts"]["queued"], held["counts"]["queued"]);
    // Raise the cap: the batch completes.
    let (status, resumed) = fleet.post(
        &format!("/v1/batches/{id}/resume"),
        json!({"spend_cap": {"tokens": 100_000}}),
    );
    assert_eq!(status, 200, "{resumed}");
    let done = wait_batch(&fleet, &id, Duration::from_secs(180), "completion", |v| {
        v["status"] == "completed"
    });
    assert_eq!(
        (
            done["counts"]["succeeded"].as_u64(),
            done["spend"]["tokens"].as_u64()
        ),
        (Some(n), Some(n * 100)),
        "{done}"
    );
    assert_each_item_ran_once(&fleet, &id, n as usize);
}

#[test]
fn pausing_a_batch_parks_its_runs_and_resuming_completes_it_through_a_worker_kill() {
    // Three model calls and two tools per run; the consequential refund takes
    // 300 ms and records each execution in the effects file.
    let script = json!([
        {"tool_calls": [{"name": "get_order", "input": {"order_id": "A1"}}]},
        {"tool_calls": [{"name": "refund_order", "input": {"order_id": "A1"}}]},
        {"text": "Refunded."}
    ]);
    let mut fleet = Fleet::new(&[("refunds", script)]);
    fleet
        .extra_env
        .push(("GLIA_DEMO_TOOL_DELAY_MS".into(), "300".into()));
    fleet.start_dispatcher();
    fleet.start_worker(2_000);
    fleet.start_worker(2_000);
    let n = 30;
    let spec = json!({"config": {"model": "script:refunds"}, "options": {"max_in_flight": 6}});
    let (status, batch) = submit_jsonl(&fleet, std::iter::once(spec).chain(items(n)));
    assert_eq!(status, 201, "{batch}");
    let id = batch["id"].as_str().unwrap().to_owned();
    wait_batch(
        &fleet,
        &id,
        Duration::from_secs(120),
        "runs under way",
        |v| v["counts"]["running"].as_u64().unwrap_or(0) >= 3,
    );
    let (status, paused) = fleet.post(&format!("/v1/batches/{id}/pause"), json!({}));
    assert_eq!(
        (status, &paused["status"]),
        (200, &json!("paused")),
        "{paused}"
    );
    // Every run not done parks at `paused` at its next step boundary.
    let held = wait_batch(
        &fleet,
        &id,
        Duration::from_secs(60),
        "every live run parked",
        |v| {
            v["counts"]["running"] == 0 && v["counts"]["parked"]["paused"].as_u64().unwrap_or(0) > 0
        },
    );
    let parked: Vec<Value> = runs_of(&fleet, &id)
        .into_iter()
        .filter(|r| r["status"] != "done")
        .collect();
    assert_eq!(
        parked.len() as u64,
        held["counts"]["parked"]["paused"].as_u64().unwrap(),
        "{held}"
    );
    for run in &parked {
        let reason = run["pull_point"]["reason"]["reason"]
            .as_str()
            .unwrap_or_default();
        assert!(
            reason.starts_with(&format!("batch {id} paused by")),
            "an operator pause of the batch: {run}"
        );
    }
    // Nothing moves while it is paused, even with a worker killed and replaced.
    fleet.kill_worker(0);
    fleet.replace_worker(0, 2_000);
    std::thread::sleep(Duration::from_secs(2));
    let still = batch_view(&fleet, &id);
    assert_eq!(
        still["counts"], held["counts"],
        "nothing started or finished while paused"
    );
    // Resume; kill w1 while it holds a run.
    let (status, resumed) = fleet.post(&format!("/v1/batches/{id}/resume"), json!({}));
    assert_eq!(
        (status, &resumed["status"]),
        (200, &json!("active")),
        "{resumed}"
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while fleet.live_leases_of("w1") == 0 {
        assert!(
            Instant::now() < deadline,
            "worker w1 never held a run after the resume"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    fleet.kill_worker(1);
    let done = wait_batch(&fleet, &id, Duration::from_secs(240), "completion", |v| {
        v["status"] == "completed"
    });
    assert_eq!(done["counts"]["succeeded"], n, "{done}");
    assert_each_item_ran_once(&fleet, &id, n);
    // The refund ran at most once per run (an interrupted one is reported, not repeated).
    let effects = fleet.effects();
    let distinct: BTreeSet<&String> = effects.iter().collect();
    assert_eq!(
        distinct.len(),
        effects.len(),
        "no refund executed twice: {effects:?}"
    );
    // Every refund the log does not show as done was cut short by the kill
    // and is reported to the model as outcome_unknown.
    let interrupted: usize = runs_of(&fleet, &id)
        .iter()
        .map(|r| {
            fleet
                .events(r["run_id"].as_str().unwrap())
                .iter()
                .filter(|e| e["type"] == "tool.error" && e["data"]["error"] == "outcome_unknown")
                .count()
        })
        .sum();
    assert!(
        effects.len() <= n && effects.len() + interrupted >= n,
        "{} refunds, {interrupted} interrupted, of {n}",
        effects.len()
    );
    // Only the kill interrupts calls (a pause never lands between a call and
    // its run): at most one per run w1 held (its --concurrency is 8).
    assert!(
        interrupted <= 8,
        "{interrupted} calls interrupted by one worker kill"
    );
}

/// `glia dev` serves batches from its in-memory store: submit, admit, run,
/// collect, with the same API.
#[test]
fn glia_dev_runs_a_batch_in_memory() {
    let dev = Dev::start(&["--demo", "--scripts", "examples/scripts"]);
    let api = Api {
        name: "dev".into(),
        dir: std::env::temp_dir(),
        server: dev.server.clone(),
        token: None,
    };
    let n = 12;
    let spec = json!({"config": {"model": "script:support"}, "options": {"max_in_flight": 4}});
    let (status, batch) = submit_jsonl(&api, std::iter::once(spec).chain(items(n)));
    assert_eq!(status, 201, "{batch}");
    let id = batch["id"].as_str().unwrap().to_owned();
    let done = wait_batch(&api, &id, Duration::from_secs(60), "completion", |v| {
        v["status"] == "completed"
    });
    assert_eq!(done["counts"]["succeeded"], n, "{done}");
    assert!(
        done["spend"]["tokens"].as_u64().unwrap_or(0) > 0,
        "spend is counted: {done}"
    );
    assert_each_item_ran_once(&api, &id, n);
}

/// The single node (`glia serve --data`) keeps batches in its file: a batch
/// submitted to it is admitted progressively, survives two `kill -9`s of
/// the process mid-batch (claims the dead process held are released when
/// the file is opened again), and completes with each item run once.
#[test]
fn the_single_node_runs_a_batch_through_two_kills() {
    use super::single_node::{Node, node_api};
    let dir = glia_testkit::isolation::TempDir::new();
    let mut node = Node::new(node_api(dir.path()), dir.db());
    node.start();
    let n: u64 = 30;
    let spec = json!({"config": mixed_config("plain"), "options": {"max_in_flight": 4}});
    let (status, batch) = submit_jsonl(&node.api, std::iter::once(spec).chain(items(n as usize)));
    assert_eq!(status, 201, "{batch}");
    let id = batch["id"].as_str().unwrap().to_owned();
    for round in 1..=2 {
        let progress = |v: &Value| v["counts"]["succeeded"].as_u64().unwrap_or(0) >= round * 8;
        wait_batch(
            &node.api,
            &id,
            Duration::from_secs(60),
            "progress before a kill",
            progress,
        );
        node.kill();
        node.start();
    }
    let done = wait_batch(
        &node.api,
        &id,
        Duration::from_secs(120),
        "completion",
        |v| v["status"] == "completed",
    );
    assert_eq!(done["counts"]["succeeded"], n, "{done}");
    assert_each_item_ran_once(&node.api, &id, n as usize);
}

#[test]
fn cancelling_a_batch_cancels_its_runs_and_its_queued_items() {
    // Runs park for an external tool, so they are live when the batch is cancelled.
    let script = json!([{"tool_calls": [{"name": "ask_customer", "input": {"question": "?"}}]}, {"text": "ok"}]);
    let mut fleet = Fleet::new(&[("asks", script)]);
    fleet.start_dispatcher();
    fleet.start_worker(2_000);
    let config = json!({"model": "script:asks", "external_tools": [{"name": "ask_customer", "description": "Ask.", "input_schema": {"type": "object"}, "external": true}]});
    let spec = json!({"config": config, "options": {"max_in_flight": 5}});
    let (status, batch) = submit_jsonl(&fleet, std::iter::once(spec).chain(items(20)));
    assert_eq!(status, 201, "{batch}");
    let id = batch["id"].as_str().unwrap().to_owned();
    wait_batch(
        &fleet,
        &id,
        Duration::from_secs(60),
        "five parked runs",
        |v| v["counts"]["parked"]["awaiting_tool"] == 5,
    );
    let (status, cancelled) = fleet.post(&format!("/v1/batches/{id}/cancel"), json!({}));
    assert_eq!(status, 200, "{cancelled}");
    let done = wait_batch(
        &fleet,
        &id,
        Duration::from_secs(60),
        "every item cancelled",
        |v| v["counts"]["cancelled"] == 20,
    );
    assert_eq!(done["status"], "cancelled");
    assert_eq!(
        runs_of(&fleet, &id).len(),
        5,
        "nothing started after the cancel"
    );
    assert!(
        results(&fleet, &id)
            .iter()
            .all(|l| l["status"] == "cancelled")
    );
}

/// Resident set size of process `pid` in KiB (Linux `/proc`).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// 10,000 scripted items through a dispatcher and two workers; prints JSON
/// (elapsed, items/s, dispatcher RSS while admitting). `BENCH_ITEMS`
/// overrides the count. Figures in BENCHMARKS.md.
#[test]
#[ignore = "benchmark: cargo test -p glia-e2e --test fleet -- --ignored bench_ten_thousand_items --nocapture"]
fn bench_ten_thousand_items() {
    let n: usize = std::env::var("BENCH_ITEMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let mut fleet = Fleet::new(&[(
        "answer",
        json!([{"text": "ok", "usage": {"input_tokens": 10, "output_tokens": 5}}]),
    )]);
    fleet
        .extra_env
        .push(("GLIA_BATCH_MAX_IN_FLIGHT".into(), "64".into()));
    fleet.start_dispatcher();
    fleet.start_worker(5_000);
    fleet.start_worker(5_000);
    let pid = fleet.dispatcher.as_ref().unwrap().id();
    let rss_idle = rss_kib(pid);
    let started = Instant::now();
    let (status, batch) = submit_jsonl(
        &fleet,
        std::iter::once(json!({"config": {"model": "script:answer"}})).chain(items(n)),
    );
    assert_eq!(status, 201, "{batch}");
    let submitted = started.elapsed();
    let rss_after_submit = rss_kib(pid);
    let id = batch["id"].as_str().unwrap().to_owned();
    let mut rss_max = rss_after_submit;
    let mut samples = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        let v = batch_view(&fleet, &id);
        let rss = rss_kib(pid);
        rss_max = rss_max.max(rss);
        samples.push((
            started.elapsed().as_secs_f64(),
            v["counts"]["succeeded"].as_u64().unwrap_or(0),
            rss,
        ));
        if v["status"] == "completed" {
            break;
        }
        assert!(Instant::now() < deadline, "not done: {v}");
        std::thread::sleep(Duration::from_secs(1));
    }
    let elapsed = started.elapsed();
    let results_started = Instant::now();
    assert_each_item_ran_once(&fleet, &id, n);
    let results_secs = results_started.elapsed().as_secs_f64();
    let mid = samples.len() / 2;
    println!(
        "{}",
        json!({
            "items": n,
            "submit_secs": submitted.as_secs_f64(),
            "elapsed_secs": elapsed.as_secs_f64(),
            "items_per_sec": n as f64 / elapsed.as_secs_f64(),
            "results_and_checks_secs": results_secs,
            "dispatcher_rss_kib": {"idle": rss_idle, "after_submit": rss_after_submit, "max_while_admitting": rss_max,
                                   "at_10pct": samples[samples.len() / 10].2, "at_50pct": samples[mid].2, "at_90pct": samples[samples.len() * 9 / 10].2},
        })
    );
}

/// Seconds from submit to the first event after `session.start` of each run.
fn first_step_secs(api: &Api, token: &str, run_ids: &[String]) -> Vec<f64> {
    let mut out = Vec::new();
    for id in run_ids {
        let events = loop {
            let (_, page) = authed(
                api,
                token,
                "GET",
                &format!("/v1/runs/{id}/events?limit=2"),
                None,
            );
            let events = page["events"].as_array().cloned().unwrap_or_default();
            if events.len() == 2 {
                break events;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let at =
            |e: &Value| chrono::DateTime::parse_from_rfc3339(e["at"].as_str().unwrap()).unwrap();
        out.push(
            (at(&events[1]) - at(&events[0]))
                .num_microseconds()
                .unwrap() as f64
                / 1e6,
        );
    }
    out.sort_by(f64::total_cmp);
    out
}

fn authed(api: &Api, token: &str, method: &str, path: &str, body: Option<String>) -> (u16, Value) {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let mut req = client
        .request(method.parse().unwrap(), format!("{}{path}", api.server))
        .header("authorization", format!("Bearer {token}"));
    if let Some(b) = body {
        let ct = if path == "/v1/batches" {
            "application/jsonl"
        } else {
            "application/json"
        };
        req = req.header("content-type", ct).body(b);
    }
    let resp = req.send().unwrap();
    let status = resp.status().as_u16();
    (
        status,
        serde_json::from_str(&resp.text().unwrap()).unwrap_or(Value::Null),
    )
}

/// Tenant B's single runs, submit → first step, while tenant A's
/// 5,000-item batch runs and with the fleet idle; prints p50/p99 of each.
#[test]
#[ignore = "benchmark: cargo test -p glia-e2e --test fleet -- --ignored bench_fairness --nocapture"]
fn bench_fairness() {
    let singles = 100;
    let mut fleet = Fleet::new(&[("answer", json!([{"text": "ok"}]))]);
    fleet
        .extra_env
        .push(("GLIA_TOKENS".into(), "tok-a:a:submit tok-b:b:submit".into()));
    // Two workers of 8 slots: batches may hold 12 of the 16.
    fleet
        .extra_env
        .push(("GLIA_BATCH_MAX_IN_FLIGHT".into(), "12".into()));
    fleet.start_dispatcher();
    fleet.start_worker(5_000);
    fleet.start_worker(5_000);
    let single = |i: usize| -> String {
        let body = json!({"goal": format!("single {i}"), "config": {"model": "script:answer"}})
            .to_string();
        let (status, run) = authed(&fleet, "tok-b", "POST", "/v1/runs", Some(body));
        assert_eq!(status, 201, "{run}");
        run["run_id"].as_str().unwrap().to_owned()
    };
    let idle: Vec<String> = (0..singles)
        .map(|i| {
            let id = single(i);
            std::thread::sleep(Duration::from_millis(50));
            id
        })
        .collect();
    let idle = first_step_secs(&fleet, "tok-b", &idle);
    let body: String = std::iter::once(json!({"config": {"model": "script:answer"}}))
        .chain(items(5_000))
        .map(|l| format!("{l}\n"))
        .collect();
    let (status, batch) = authed(&fleet, "tok-a", "POST", "/v1/batches", Some(body));
    assert_eq!(status, 201, "{batch}");
    let id = batch["id"].as_str().unwrap().to_owned();
    // Wait until A's batch fills its slots, then submit B's runs while it runs.
    loop {
        let (_, v) = authed(&fleet, "tok-a", "GET", &format!("/v1/batches/{id}"), None);
        if v["counts"]["running"].as_u64().unwrap_or(0)
            + v["counts"]["succeeded"].as_u64().unwrap_or(0)
            >= 12
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let busy: Vec<String> = (0..singles)
        .map(|i| {
            let id = single(1000 + i);
            std::thread::sleep(Duration::from_millis(50));
            id
        })
        .collect();
    let busy = first_step_secs(&fleet, "tok-b", &busy);
    let (_, v) = authed(&fleet, "tok-a", "GET", &format!("/v1/batches/{id}"), None);
    assert_ne!(
        v["status"], "completed",
        "A's batch still ran while B's runs were measured: {v}"
    );
    println!(
        "{}",
        json!({
            "singles": singles,
            "idle": {"p50_ms": percentile(&idle, 0.5) * 1e3, "p99_ms": percentile(&idle, 0.99) * 1e3},
            "during_5000_item_batch": {"p50_ms": percentile(&busy, 0.5) * 1e3, "p99_ms": percentile(&busy, 0.99) * 1e3},
            "batch_progress_when_measured": v["counts"],
        })
    );
    authed(
        &fleet,
        "tok-a",
        "POST",
        &format!("/v1/batches/{id}/cancel"),
        Some("{}".into()),
    );
}

#[test]
fn the_cli_submits_watches_and_collects_a_batch() {
    let mut fleet = Fleet::new(&[("answer", json!([{"text": "ok"}]))]);
    fleet.start_dispatcher();
    fleet.start_worker(2_000);
    let config = fleet.dir.join("config.json");
    std::fs::write(&config, json!({"model": "script:answer"}).to_string()).unwrap();
    let good = fleet.dir.join("items.jsonl");
    std::fs::write(
        &good,
        items(25).map(|l| format!("{l}\n")).collect::<String>(),
    )
    .unwrap();
    let glia = |args: &[&str]| {
        let mut all = vec!["batch"];
        all.extend_from_slice(args);
        let out = fleet
            .command(&all)
            .env("GLIA_SERVER", &fleet.server)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = glia(&[
        "submit",
        "--config",
        config.to_str().unwrap(),
        good.to_str().unwrap(),
        "--max-in-flight",
        "4",
        "--wait",
    ]);
    assert!(ok, "{err}");
    let id = out.trim().to_owned();
    assert!(err.contains(&format!("batch {id}: completed")), "{err}");
    // Re-attach by id, collect.
    let (ok, _, err) = glia(&["status", &id, "--wait"]);
    assert!(ok && err.contains("completed"), "{err}");
    let (ok, out, err) = glia(&["results", &id]);
    assert!(ok, "{err}");
    assert_eq!(
        out.lines()
            .filter(|l| serde_json::from_str::<Value>(l).unwrap()["status"] == "succeeded")
            .count(),
        25
    );
    let (ok, out, _) = glia(&["list"]);
    assert!(ok && out.contains(&id), "{out}");
    // A bad line is reported with its line in the file; nothing is stored.
    let bad = fleet.dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"custom_id\": \"a\", \"goal\": \"g\"}\n{\"custom_id\": \"b\", \"goal\": \"g\"}\n{\"custom_id\": \"a\", \"goal\": \"g\"}\n")
        .unwrap();
    let (ok, _, err) = glia(&[
        "submit",
        "--config",
        config.to_str().unwrap(),
        bad.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("bad.jsonl line 3, custom_id"), "{err}");
    let (ok, _, err) = glia(&["submit", "--agent", "triage@2", good.to_str().unwrap()]);
    assert!(!ok && err.contains("agent triage@2 not found"), "{err}");
    let (_, out, _) = glia(&["list"]);
    assert_eq!(
        out.lines().count(),
        1,
        "refused batches are not stored: {out}"
    );
}

/// Run `glia batch ARGS…` against the fleet: (exit ok, stdout, stderr).
fn glia_batch_cli(fleet: &Fleet, args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["batch"];
    all.extend_from_slice(args);
    let out = fleet
        .command(&all)
        .env("GLIA_SERVER", &fleet.server)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What every view of a batch must agree on: its status and its counts.
fn truth(v: &Value) -> (Value, Value, Value) {
    (
        v["status"].clone(),
        v["counts"].clone(),
        v["cap_reached"].clone(),
    )
}

/// The batch as `GET /v1/batches` lists it.
fn listed(api: &Api, id: &str) -> Value {
    let (status, page) = api.get("/v1/batches?limit=1000");
    assert_eq!(status, 200, "{page}");
    page["batches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("batch {id} is listed: {page}"))
}

/// Poll the list, the single get and `glia batch status` until the batch
/// ended; at every poll where nothing moved meanwhile (the list read before
/// and after agree) the three agree. Answers the final view and how many
/// polls were compared.
fn views_agree_until_ended(fleet: &Fleet, id: &str, limit: Duration) -> (Value, usize) {
    let deadline = Instant::now() + limit;
    let mut compared = 0;
    loop {
        let before = listed(fleet, id);
        let single = batch_view(fleet, id);
        let (ok, out, err) = glia_batch_cli(fleet, &["status", id]);
        assert!(ok, "{err}");
        let cli: Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("glia batch status prints the view ({e}): {out}"));
        let after = listed(fleet, id);
        if truth(&before) == truth(&after) {
            compared += 1;
            assert_eq!(
                truth(&single),
                truth(&before),
                "GET /v1/batches/{id} and GET /v1/batches agree"
            );
            assert_eq!(
                truth(&cli),
                truth(&before),
                "glia batch status and GET /v1/batches agree"
            );
            if ["completed", "expired", "cancelled"]
                .contains(&after["status"].as_str().unwrap_or(""))
                && after["counts"]["running"] == 0
            {
                return (after, compared);
            }
        }
        assert!(
            Instant::now() < deadline,
            "batch {id} did not end within {limit:?}: {after}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Batch truth: while a batch with failing items runs, its list entry, its
/// own view and `glia batch status` agree at every poll; `submit --wait` and
/// `status --wait` exit non-zero because items failed; a batch stopped at
/// its spend cap makes `--wait` exit non-zero with items still queued, and
/// pause/resume of an ended batch answer 409 `batch_ended`.
#[test]
fn every_view_of_a_batch_agrees_and_the_cli_exits_non_zero_unless_every_item_succeeded() {
    let mut fleet = Fleet::new(&[
        ("answer", json!([{"text": "ok"}])),
        (
            "costly",
            json!([{"text": "ok", "usage": {"input_tokens": 60, "output_tokens": 40}}]),
        ),
    ]);
    fleet.start_dispatcher();
    fleet.start_worker(2_000);
    let config = fleet.dir.join("config.json");
    std::fs::write(&config, json!({"model": "script:answer"}).to_string()).unwrap();
    // Two of twelve items name a script nobody has: their runs fail.
    let lines: String = (0..12)
        .map(|i| {
            let mut item = json!({"custom_id": format!("item-{i}"), "goal": format!("Answer {i}")});
            if i % 6 == 5 {
                item["config"] = json!({"model": "script:nobody-has-this"});
            }
            format!("{item}\n")
        })
        .collect();
    let items_file = fleet.dir.join("items.jsonl");
    std::fs::write(&items_file, lines).unwrap();
    let (ok, out, err) = glia_batch_cli(
        &fleet,
        &[
            "submit",
            "--config",
            config.to_str().unwrap(),
            items_file.to_str().unwrap(),
            "--max-in-flight",
            "2",
        ],
    );
    assert!(ok, "{err}");
    let id = out.trim().to_owned();
    let (end, compared) = views_agree_until_ended(&fleet, &id, Duration::from_secs(180));
    assert!(compared >= 1, "at least one poll compared the views");
    assert_eq!(
        (
            end["status"].as_str(),
            end["counts"]["succeeded"].as_u64(),
            end["counts"]["failed"].as_u64()
        ),
        (Some("completed"), Some(10), Some(2)),
        "{end}"
    );
    let (ok, _, err) = glia_batch_cli(&fleet, &["status", &id, "--wait"]);
    assert!(
        !ok && err.contains("2 item(s) failed"),
        "status --wait exits non-zero when items failed: {err}"
    );
    let (ok, _, err) = glia_batch_cli(
        &fleet,
        &[
            "submit",
            "--config",
            config.to_str().unwrap(),
            items_file.to_str().unwrap(),
            "--wait",
        ],
    );
    assert!(
        !ok && err.contains("2 item(s) failed"),
        "submit --wait exits non-zero when items failed: {err}"
    );
    for action in ["pause", "resume"] {
        let (status, answer) = fleet.post(&format!("/v1/batches/{id}/{action}"), json!({}));
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (409, Some("batch_ended")),
            "{action} of a completed batch: {answer}"
        );
    }

    // A spend cap stops the batch with items queued: non-zero, and it says so.
    let costly = fleet.dir.join("costly.json");
    std::fs::write(&costly, json!({"model": "script:costly"}).to_string()).unwrap();
    let ten = fleet.dir.join("ten.jsonl");
    std::fs::write(
        &ten,
        items(10).map(|l| format!("{l}\n")).collect::<String>(),
    )
    .unwrap();
    let (ok, out, err) = glia_batch_cli(
        &fleet,
        &[
            "submit",
            "--config",
            costly.to_str().unwrap(),
            ten.to_str().unwrap(),
            "--max-in-flight",
            "1",
            "--cap-tokens",
            "250",
            "--wait",
        ],
    );
    assert!(
        !ok && err.contains("stopped at its spend cap"),
        "submit --wait at the spend cap: {err}"
    );
    let capped = batch_view(&fleet, out.trim());
    assert!(
        capped["cap_reached"] == true && capped["counts"]["queued"].as_u64().unwrap_or(0) > 0,
        "{capped}"
    );
    assert_eq!(
        truth(&listed(&fleet, out.trim())),
        truth(&capped),
        "the list shows the cap as the single view does"
    );
}

/// The completion window ends items already started: their runs (parked for
/// an approval) are cancelled, their approvals closed, and the results say
/// `expired` with an error code; items not started expire too. The batch
/// is `expired` in every view, and nothing consequential ran.
#[test]
fn the_completion_window_ends_started_items() {
    let script = json!([{"tool_calls": [{"name": "refund_order", "input": {"order_id": "A1"}}]}, {"text": "Refunded."}]);
    let mut fleet = Fleet::new(&[("refunds", script)]);
    fleet.start_dispatcher();
    fleet.start_worker(2_000);
    let config = json!({"model": "script:refunds", "policies": [{"tool": "refund_order", "action": {"kind": "require_approval"}}]});
    let spec =
        json!({"config": config, "options": {"max_in_flight": 4, "completion_window_secs": 3600}});
    let (status, batch) = submit_jsonl(&fleet, std::iter::once(spec).chain(items(6)));
    assert_eq!(status, 201, "{batch}");
    let id = batch["id"].as_str().unwrap().to_owned();
    wait_batch(
        &fleet,
        &id,
        Duration::from_secs(120),
        "four runs waiting for approval",
        |v| v["counts"]["parked"]["awaiting_approval"] == 4,
    );
    let (_, pending) = fleet.get("/v1/approvals");
    assert_eq!(
        pending["approvals"].as_array().map(Vec::len),
        Some(4),
        "{pending}"
    );
    // The window ends (moved into the past rather than waited for).
    let sql =
        format!("UPDATE batches SET expires_at = now() - interval '1 second' WHERE id = '{id}'");
    let out = std::process::Command::new("psql")
        .args([
            fleet.db_url.as_str(),
            "-v",
            "ON_ERROR_STOP=1",
            "-qAtc",
            &sql,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (end, _) = views_agree_until_ended(&fleet, &id, Duration::from_secs(120));
    assert_eq!(
        (end["status"].as_str(), end["counts"]["expired"].as_u64()),
        (Some("expired"), Some(6)),
        "{end}"
    );
    let lines = results(&fleet, &id);
    assert!(
        lines
            .iter()
            .all(|l| l["status"] == "expired" && l["error_code"] == "expired"),
        "{lines:?}"
    );
    let started: Vec<&Value> = lines.iter().filter(|l| l["run_id"].is_string()).collect();
    assert_eq!(started.len(), 4, "{lines:?}");
    for line in started {
        let (_, run) = fleet.get(&format!("/v1/runs/{}", line["run_id"].as_str().unwrap()));
        assert_eq!(
            (run["status"].as_str(), run["outcome"]["kind"].as_str()),
            (Some("done"), Some("cancelled")),
            "{run}"
        );
    }
    let (_, pending) = fleet.get("/v1/approvals");
    assert_eq!(
        pending["approvals"],
        json!([]),
        "the expired runs' approvals are closed: {pending}"
    );
    assert!(
        fleet.effects().is_empty(),
        "no refund ran: {:?}",
        fleet.effects()
    );
    let (ok, _, err) = glia_batch_cli(&fleet, &["status", &id, "--wait"]);
    assert!(!ok && err.contains("6 item(s) expired"), "{err}");
    let (status, answer) = fleet.post(&format!("/v1/batches/{id}/resume"), json!({}));
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (409, Some("batch_ended")),
        "{answer}"
    );
}
