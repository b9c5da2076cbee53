//! The main job: the 200 tau-bench airline conversations replayed by
//! `glia batch`, on the embedded fleet and on the real one (dispatcher and
//! two worker processes on Postgres, RabbitMQ and Redis), also with a worker
//! killed by `kill -9` in the middle of the batch. Every run must reproduce
//! its recording exactly.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use glia_testkit::fleet::{
    assert_whole_recording, glia_batch as batch, recording_dir, replay_fleet, summary, trajectories,
};
use serde_json::Value;

/// The main job on the embedded fleet, twice: with the recorded tools in the
/// workers' own registry, and with them served over MCP by a separate
/// process (`glia replay-tools`, which the workers start from their
/// catalogue and call through their MCP client, the call id travelling in
/// `_meta`). Both reproduce all 200 conversations, and their logs are the
/// same event for event: only where the tools came from differs (the run
/// config's tool sources, and the tool list frozen in `step.start`).
#[test]
fn embedded_batch_reproduces_all_200_with_recorded_tools_and_over_mcp_with_the_same_events() {
    let dir = tempdir();
    let logs = |name: &str, extra: &[&str]| -> BTreeMap<String, Vec<Value>> {
        let data = dir.join(format!("{name}.db"));
        let data = data.to_str().unwrap();
        let s = summary(
            batch(&[&["--data", data][..], extra].concat())
                .output()
                .unwrap(),
        );
        assert_whole_recording(&s);
        assert!(s["approval_resume_p50_ms"].as_f64().is_some(), "{s}");
        let out = Command::new(glia_testkit::bin::glia_bin())
            .args(["export", "--data", data])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "glia export: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|record| record["events"].is_array())
            .map(|record| {
                let run_id = record["run_id"].as_str().unwrap().to_owned();
                let events: Vec<Value> = record["events"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|e| normalised(e, &run_id))
                    .collect();
                (
                    events[0]["data"]["config"]["model"]
                        .as_str()
                        .unwrap()
                        .to_owned(),
                    events,
                )
            })
            .collect()
    };
    let recorded = logs("recorded", &[]);
    let mcp = logs("mcp", &["--mcp-server", "recorded"]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(recorded.len(), 200);
    assert_eq!(
        recorded.keys().collect::<Vec<_>>(),
        mcp.keys().collect::<Vec<_>>()
    );
    for (conversation, events) in &recorded {
        let other = &mcp[conversation];
        let first = events.iter().zip(other).position(|(a, b)| a != b);
        assert!(
            first.is_none() && events.len() == other.len(),
            "{conversation}: the logs differ at event {first:?} (lengths {} and {}): {:?} versus {:?}",
            events.len(),
            other.len(),
            first.map(|i| &events[i]),
            first.map(|i| &other[i])
        );
    }
}

/// An event as JSON without what differs between two replays of one
/// conversation by nature (run id, times, durations, active time) or by where its tools
/// come from (the config's tool sources; in `step.start`, each tool's
/// source, timeout and who decided its idempotency).
fn normalised(event: &Value, run_id: &str) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(map) => {
                map.retain(|k, _| {
                    !matches!(k.as_str(), "at" | "duration_ms" | "active_ms") && !k.ends_with("_at")
                });
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut e: Value = serde_json::from_str(&event.to_string().replace(run_id, "RUN")).unwrap();
    strip(&mut e);
    match e["type"].as_str() {
        Some("session.start") => {
            let config = e["data"]["config"].as_object_mut().unwrap();
            for key in ["tools", "mcp", "tool_policy"] {
                config.remove(key);
            }
        }
        Some("step.start") => {
            // Where each tool comes from, and the MCP default timeout; of
            // its resolved policy, who decided the idempotency (the
            // registered tool's code, or the trusted server's annotation)
            // and the server's trust. What the policy decides must agree.
            for tool in e["data"]["tools"].as_array_mut().unwrap() {
                let tool = tool.as_object_mut().unwrap();
                tool.remove("source");
                tool.remove("timeout_ms");
                if let Some(policy) = tool.get_mut("policy").and_then(Value::as_object_mut) {
                    policy.remove("idempotent_by");
                    policy.remove("trusted_server");
                }
            }
        }
        _ => {}
    }
    e
}

#[test]
fn a_diverging_run_fails_the_batch_and_names_the_message() {
    // The driver's copy of the recording has one customer message changed;
    // the fleet (`glia dev`, in-memory) replays the original, so that run's
    // next model call sees a history the recording does not have.
    let dir = tempdir();
    let text = std::fs::read_to_string(recording_dir().join("gpt-4o-airline.json")).unwrap();
    let mut all: Vec<Value> = serde_json::from_str(&text).unwrap();
    all.truncate(3);
    let traj = all[1]["traj"].as_array_mut().unwrap();
    let second_user = traj
        .iter()
        .enumerate()
        .filter(|(_, m)| m["role"] == "user")
        .nth(1)
        .unwrap()
        .0;
    traj[second_user]["content"] = Value::String("Something the customer never said.".into());
    let file = dir.join("gpt-4o-airline.json");
    std::fs::write(&file, serde_json::to_string(&all).unwrap()).unwrap();
    std::fs::copy(recording_dir().join("tools.json"), dir.join("tools.json")).unwrap();

    let dev = glia_testkit::fleet::Dev::start(&["--replay", recording_dir().to_str().unwrap()]);
    let server = dev.server.clone();
    let out = Command::new(glia_testkit::bin::glia_bin())
        .args([
            "batch",
            file.to_str().unwrap(),
            "--server",
            &server,
            "--json",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a diverged run fails the batch");
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            s["runs"].as_u64(),
            s["reproduced"].as_u64(),
            s["diverged"].as_u64(),
            s["failed"].as_u64()
        ),
        (Some(3), Some(2), Some(1), Some(0)),
        "{s}"
    );
    let id = format!("{}-{}", all[1]["task_id"], all[1]["trial"]);
    assert!(stderr.contains(&format!("(conversation {id}): model call failed: replay diverged: conversation {id}: message 2 (recording message {second_user}): expected user: \"")), "{stderr}");
    assert!(
        stderr.contains("got user: \"Something the customer never said.\""),
        "{stderr}"
    );
    assert!(
        stderr.contains("1 run(s) diverged and 0 failed of 3"),
        "{stderr}"
    );
}

/// Nobody listens: after `--max-outage-secs` of retries the error names the
/// server, the bound and the last error, and that nothing was submitted.
#[test]
fn an_unreachable_dispatcher_is_named() {
    let server = format!("http://127.0.0.1:{}", glia_testkit::fleet::free_port());
    let out = Command::new(glia_testkit::bin::glia_bin())
        .args([
            "batch",
            &trajectories(),
            "--server",
            &server,
            "--limit",
            "1",
            "--max-outage-secs",
            "1",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("the dispatcher at {server} did not answer for")),
        "{stderr}"
    );
    assert!(
        stderr.contains("--max-outage-secs 1); last error: ")
            && stderr.contains("onnection refused"),
        "{stderr}"
    );
    assert!(
        stderr.contains("0 run(s) still unfinished and 1 conversation(s) not submitted"),
        "{stderr}"
    );
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("glia-batch-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn real_fleet_reproduces_all_200_conversations() {
    let fleet = replay_fleet();
    let s = summary(batch(&["--server", &fleet.server]).output().unwrap());
    assert_whole_recording(&s);
    assert!(s["approval_resume_p50_ms"].as_f64().is_some(), "{s}");
    // One first-class batch holds the 200 conversations, each item its own run.
    let (status, page) = fleet.get("/v1/batches");
    assert_eq!(status, 200, "{page}");
    let batches = page["batches"].as_array().unwrap();
    assert_eq!(batches.len(), 1, "{page}");
    let (status, view) = fleet.get(&format!(
        "/v1/batches/{}",
        batches[0]["id"].as_str().unwrap()
    ));
    assert_eq!(status, 200, "{view}");
    assert_eq!(
        (
            view["status"].as_str(),
            view["total"].as_u64(),
            view["counts"]["succeeded"].as_u64()
        ),
        (Some("completed"), Some(200), Some(200)),
        "{view}"
    );
}

#[test]
fn real_fleet_reproduces_all_200_with_a_worker_killed_mid_batch() {
    let mut fleet = replay_fleet();
    let child = batch(&["--server", &fleet.server]).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while fleet.done_runs() < 40 {
        assert!(Instant::now() < deadline, "the batch made no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Kill w1 while it holds a run (a lease it has not released), so the
    // kill interrupts work, whatever the timing of this machine.
    while fleet.live_leases_of("w1") == 0 {
        assert!(
            fleet.done_runs() < 200,
            "the batch ended before worker w1 held a run"
        );
        assert!(Instant::now() < deadline, "worker w1 never held a run");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut victim = fleet.workers.remove(1);
    victim.kill().unwrap(); // SIGKILL
    victim.wait().unwrap();
    assert_whole_recording(&summary(child.wait_with_output().unwrap()));
}

/// `--approve manual`: the batch waits while people decide with
/// `glia approvals list` and `glia approvals approve`.
#[test]
fn manual_approvals_are_left_to_people_on_the_cli() {
    const CONSEQUENTIAL: [&str; 6] = [
        "book_reservation",
        "cancel_reservation",
        "update_reservation_flights",
        "update_reservation_baggages",
        "update_reservation_passengers",
        "send_certificate",
    ];
    let all: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(recording_dir().join("gpt-4o-airline.json")).unwrap(),
    )
    .unwrap();
    let n = 8;
    let expected_approvals: usize = all[..n]
        .iter()
        .flat_map(|c| c["traj"].as_array().unwrap().iter())
        .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
        .filter(|c| CONSEQUENTIAL.contains(&c["function"]["name"].as_str().unwrap()))
        .count();
    assert!(expected_approvals > 0);

    let dev = glia_testkit::fleet::Dev::start(&["--replay", recording_dir().to_str().unwrap()]);
    let server = dev.server.clone();
    let mut child = batch(&[
        "--server",
        &server,
        "--approve",
        "manual",
        "--limit",
        &n.to_string(),
    ])
    .spawn()
    .unwrap();
    let glia = |args: &[&str]| {
        let out = Command::new(glia_testkit::bin::glia_bin())
            .args(args)
            .args(["--server", &server])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "glia {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mut approved = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the batch did not finish");
        for line in glia(&["approvals", "list"]).lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            glia(&["approvals", "approve", fields[0], fields[1]]);
            approved += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let s = summary(child.wait_with_output().unwrap());
    assert_eq!(
        (s["runs"].as_u64(), s["reproduced"].as_u64()),
        (Some(n as u64), Some(n as u64)),
        "{s}"
    );
    assert_eq!(s["approvals"], expected_approvals, "{s}");
    assert_eq!(
        approved, expected_approvals,
        "every approval was a person's, on the CLI"
    );
}
