//! What an operator reads with the CLI, against a real `glia dev --demo`:
//! `glia runs events --follow` prints one readable line per event and
//! follows the run through a park to its end; `--json` prints one event
//! per line; `glia runs resume --extend-…` raises a budget-paused run's
//! limits; every read command ends quietly with status 0 on a closed pipe
//! (`| head`); errors are one line without Rust's debug text.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use glia_testkit::bin::glia_bin;
use glia_testkit::fleet::{Dev, http};
use serde_json::{Value, json};

fn glia(dev: &Dev) -> Command {
    let mut cmd = Command::new(glia_bin());
    cmd.current_dir(glia_testkit::workspace_root())
        .env("GLIA_SERVER", &dev.server)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
    cmd
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn run(dev: &Dev, id: &str) -> Value {
    let (status, run) = http("GET", &format!("{}/v1/runs/{id}", dev.server), None).unwrap();
    assert_eq!(status, 200, "{run}");
    run
}

/// Wait until run `id` is parked (at `kind`) or done.
fn wait_for(dev: &Dev, id: &str, kind: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = run(dev, id);
        if r["pull_point"]["kind"] == kind || (kind == "done" && r["status"] == "done") {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "run {id} never reached {kind}: {r}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `glia approvals approve` the call `parked` (a run view) waits for; its id.
fn approve(dev: &Dev, id: &str, parked: &Value) -> String {
    let call = parked["pull_point"]["call_ids"][0]
        .as_str()
        .unwrap()
        .to_owned();
    ok(&glia(dev)
        .args(["approvals", "approve", id, &call])
        .output()
        .unwrap());
    call
}

fn submit(dev: &Dev, goal: &str, config: Value) -> String {
    let dir = std::env::temp_dir().join(format!("glia_cli_{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let out = glia(dev)
        .args([
            "submit",
            "--detach",
            "--config",
            path.to_str().unwrap(),
            goal,
        ])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    ok(&out).trim().to_owned()
}

fn refund_config() -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(
            glia_testkit::workspace_root().join("examples/refund.config.json"),
        )
        .unwrap(),
    )
    .unwrap()
}

/// `HH:MM:SS.mmm  SEQ  KIND …`: the seq and kind of a readable event line.
fn seq_and_kind(line: &str) -> (u64, String) {
    let mut words = line.split_whitespace();
    let time = words.next().unwrap_or("");
    assert!(
        time.len() == 12 && time.as_bytes()[2] == b':' && time.as_bytes()[8] == b'.',
        "a time first: {line}"
    );
    let seq = words.next().and_then(|s| s.parse().ok()).expect("a seq");
    (seq, words.next().expect("a kind").to_owned())
}

#[test]
fn runs_events_follows_a_run_readably_and_as_json() {
    let dev = Dev::start(&["--demo", "--scripts", "examples/scripts"]);
    let id = submit(&dev, "Refund order A1", refund_config());
    let follower = glia(&dev)
        .args(["runs", "events", &id, "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let parked = wait_for(&dev, &id, "awaiting_approval");
    // Parked: the follower goes on until the run ends.
    let call = approve(&dev, &id, &parked);
    let out = follower.wait_with_output().unwrap();
    let text = ok(&out);
    let done = run(&dev, &id);
    assert_eq!(done["status"], "done", "{done}");
    let head = done["head_seq"].as_u64().unwrap();
    let lines: Vec<(u64, String)> = text.lines().map(seq_and_kind).collect();
    assert_eq!(
        lines.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        (1..=head).collect::<Vec<_>>(),
        "every event once, in order:\n{text}"
    );
    assert_eq!(lines.last().unwrap().1, "session.complete");
    for kind in ["approval.requested", "session.pause", "approval.resolved"] {
        assert!(lines.iter().any(|(_, k)| k == kind), "{kind}:\n{text}");
    }
    let response = text.lines().find(|l| l.contains("model.response")).unwrap();
    assert!(
        response.contains("tokens")
            && response.contains("$0.")
            && response.contains("calls get_order#"),
        "a model call's line has its tokens, cost and tool calls: {response}"
    );
    let tool = text.lines().find(|l| l.contains("tool.call ")).unwrap();
    assert!(
        tool.contains(r#"get_order#"#)
            && tool.contains(r#"{"order_id":"A1"}"#)
            && tool.ends_with("→ run"),
        "{tool}"
    );
    let pause = text.lines().find(|l| l.contains("session.pause")).unwrap();
    assert!(
        pause.contains(&format!("awaiting_approval #{call}")),
        "{pause}"
    );
    assert!(text.contains("succeeded: Order A1"), "{text}");
    assert!(
        !text.contains("Some(") && !text.contains("Run {"),
        "no debug text:\n{text}"
    );

    // --json: the API's events, one per line, the whole log.
    let json = ok(&glia(&dev)
        .args(["runs", "events", &id, "--json"])
        .output()
        .unwrap());
    let seqs: Vec<u64> = json
        .lines()
        .map(|l| {
            serde_json::from_str::<glia_proto::Event>(l)
                .expect("an event")
                .seq
        })
        .collect();
    assert_eq!(seqs, (1..=head).collect::<Vec<_>>());
    // --follow --json on a finished run prints it all and ends.
    let followed = ok(&glia(&dev)
        .args(["runs", "events", &id, "--follow", "--json", "--after", "3"])
        .output()
        .unwrap());
    assert_eq!(followed.lines().count() as u64, head - 3);

    // A closed pipe ends every read command quietly: the read end is
    // closed before the command writes anything, so its first write fails.
    let commands: Vec<Vec<&str>> = vec![
        vec!["runs", "events", &id],
        vec!["runs", "events", &id, "--json"],
        vec!["runs", "events", &id, "--follow"],
        vec!["runs", "list"],
        vec!["runs", "get", &id],
        vec!["approvals", "history"],
        vec!["approvals", "history", "--json"],
        vec!["agents", "list", "--json"],
        vec!["batch", "list"],
    ];
    for args in commands {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut child = glia(&dev)
            .args(&args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        let status = child.wait().unwrap();
        assert!(
            status.success() && stderr.is_empty(),
            "glia {args:?} into a closed pipe: {status}, stderr: {stderr}"
        );
    }

    // An error is one line, `glia: …`, with the dispatcher's code.
    let missing = glia(&dev)
        .args(["runs", "events", "01a24e5f-6482-7473-8e66-447938731da8"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(
        err.starts_with("glia: ")
            && err.contains("404")
            && !err.contains("Caused by")
            && !err.contains("Error {"),
        "{err}"
    );
}

#[test]
fn resume_extends_the_budget_of_a_run_paused_by_it() {
    let dev = Dev::start(&["--demo", "--scripts", "examples/scripts"]);
    let mut config = refund_config();
    config["budget"] = json!({"max_turns": 1});
    let id = submit(&dev, "Refund order A1", config);
    let paused = wait_for(&dev, &id, "paused");
    assert_eq!(paused["pull_point"]["reason"]["kind"], "budget", "{paused}");

    // Refused before anything is sent.
    let bad = glia(&dev)
        .args(["runs", "resume", &id, "--extend-cost-usd=-1"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&bad.stderr)
            .contains("--extend-cost-usd must be a positive amount"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    assert_eq!(run(&dev, &id)["head_seq"], paused["head_seq"]);

    ok(&glia(&dev)
        .args([
            "runs",
            "resume",
            &id,
            "--extend-turns",
            "10",
            "--extend-cost-usd",
            "1.5",
        ])
        .output()
        .unwrap());
    let parked = wait_for(&dev, &id, "awaiting_approval");
    let events = ok(&glia(&dev)
        .args(["runs", "events", &id, "--json"])
        .output()
        .unwrap());
    let extended: Vec<Value> = events
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["type"] == "budget.extended")
        .collect();
    assert_eq!(extended.len(), 1, "{events}");
    assert_eq!(
        extended[0]["data"]["limits"]["max_turns"], 11,
        "{}",
        extended[0]
    );
    let readable = ok(&glia(&dev).args(["runs", "events", &id]).output().unwrap());
    assert!(
        readable
            .lines()
            .any(|l| l.contains("budget.extended") && l.contains("11 turns")),
        "{readable}"
    );
    approve(&dev, &id, &parked);
    let done = wait_for(&dev, &id, "done");
    assert_eq!(done["outcome"]["kind"], "succeeded", "{done}");
}
