//! A fleet with the operator's catalogue: `glia dispatcher --catalogue` and
//! two `glia worker --catalogue` processes on the real services, runs whose
//! config names real MCP servers (server-everything and server-filesystem,
//! from npm: `npm ci --prefix .ci/mcp`) and an HTTP tool, with an approval
//! policy. Both workers are `kill -9`ed while tool calls are in flight; every
//! run completes, and the destructive tool (`move_file`) never runs twice:
//! the servers' own stdin, recorded by `tee`, is the ledger of the calls they
//! received.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use glia_proto::{EventKind, ToolErrorKind};
use glia_testkit::fleet::*;
use glia_testkit::http::{Reply, Server};
use serde_json::{Value, json};

const RUNS: usize = 20;

fn package(name: &str) -> Option<String> {
    let path = glia_testkit::workspace_root()
        .join(".ci/mcp/node_modules/@modelcontextprotocol")
        .join(name)
        .join("dist/index.js");
    let found = path
        .exists()
        .then(|| path.canonicalize().unwrap().display().to_string());
    glia_testkit::require(
        found,
        format!("the MCP server {}", path.display()),
        "npm ci --prefix .ci/mcp; scripts/test does",
    )
}

/// Every JSON-RPC message the servers received, from the `tee` files.
fn wire(dir: &Path, prefix: &str) -> Vec<Value> {
    let mut messages = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(prefix)
        {
            let text = std::fs::read_to_string(&path).unwrap();
            messages.extend(
                text.lines()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok()),
            );
        }
    }
    messages
}

/// How often each idempotency key was called, per tool.
fn calls_by_key(messages: &[Value], tool: &str) -> HashMap<String, usize> {
    let mut by_key = HashMap::new();
    for m in messages
        .iter()
        .filter(|m| m["method"] == "tools/call" && m["params"]["name"] == tool)
    {
        *by_key
            .entry(
                m["params"]["_meta"]["glia/idempotency_key"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
            .or_insert(0) += 1;
    }
    by_key
}

#[test]
fn twenty_runs_with_mcp_and_http_tools_survive_kill_9_mid_call() {
    let (Some(everything), Some(filesystem)) =
        (package("server-everything"), package("server-filesystem"))
    else {
        return;
    };
    // The HTTP tool's endpoint: answers every call, records each request.
    let lookup_server =
        Server::background(vec![
            Reply::json(200, br#"{"status":"shipped"}"#.to_vec());
            10 * RUNS
        ]);
    let lookup = lookup_server.base.clone();
    let scripts: Vec<(String, Value)> = (0..RUNS)
        .map(|i| {
            (
                format!("mcp{i}"),
                json!([
                    {"tool_calls": [
                        {"name": "trigger-long-running-operation", "input": {"duration": 1.5, "steps": 3}},
                        {"name": "lookup", "input": {"order": i}}
                    ]},
                    {"tool_calls": [{"name": "move_file", "input": {"source": "SRC", "destination": "DST"}}]},
                    {"text": "done"}
                ]),
            )
        })
        .collect();
    let named: Vec<(&str, Value)> = scripts
        .iter()
        .map(|(n, v)| (n.as_str(), v.clone()))
        .collect();
    let mut fleet = Fleet::new(&named);
    let files = fleet.dir.join("files");
    let wire_dir = fleet.dir.join("wire");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::create_dir_all(&wire_dir).unwrap();
    let files = files.canonicalize().unwrap();
    // Each run moves a file of its own: the scripts get their paths.
    for (i, (name, _)) in scripts.iter().enumerate() {
        std::fs::write(files.join(format!("src-{i}.txt")), format!("run {i}")).unwrap();
        let path = fleet.dir.join("scripts").join(format!("{name}.json"));
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text
            .replace(
                "SRC",
                &files.join(format!("src-{i}.txt")).display().to_string(),
            )
            .replace(
                "DST",
                &files.join(format!("dst-{i}.txt")).display().to_string(),
            );
        std::fs::write(&path, text).unwrap();
    }
    let tee = |name: &str, command: String| {
        format!("tee {}/{name}.$$ | exec {command}", wire_dir.display())
    };
    let catalogue = format!(
        "[mcp_servers.everything]\ntransport = \"stdio\"\ncommand = \"sh\"\nargs = [\"-c\", {:?}]\ntrust = \"trusted\"\n\n\
         [mcp_servers.files]\ntransport = \"stdio\"\ncommand = \"sh\"\nargs = [\"-c\", {:?}]\nenv = {{ GLIA_PROBE = \"GLIA_TEST_MCP_SECRET\" }}\n\n\
         [http]\nallowed_origins = [{lookup:?}]\n",
        tee("everything", format!("node {everything} stdio")),
        format!(
            "echo probe=$GLIA_PROBE >&2; {}",
            tee("files", format!("node {filesystem} {}", files.display()))
        ),
    );
    fleet.use_catalogue(&catalogue);
    // A secret the files server gets in its environment (and prints to its
    // stderr): it must reach no event and no log line.
    let secret = format!("s3cret-{}", uuid::Uuid::now_v7().simple());
    fleet
        .extra_env
        .push(("GLIA_TEST_MCP_SECRET".into(), secret.clone()));
    fleet.start_dispatcher();
    let lease_ms = 2_000;
    fleet.start_worker(lease_ms);
    fleet.start_worker(lease_ms);
    // A third worker logging at debug level to a file.
    let log_path = fleet.dir.join("worker-debug.log");
    let scripts_dir = fleet.dir.join("scripts").display().to_string();
    let mut logged = fleet
        .command(&[
            "worker",
            "--scripts",
            &scripts_dir,
            "--lease-ms",
            &lease_ms.to_string(),
            "--id",
            "w-logged",
        ])
        .args(&fleet.worker_args)
        .env("RUST_LOG", "debug")
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .expect("worker starts");

    let config = |i: usize| {
        json!({
            "model": format!("script:mcp{i}"),
            "mcp": [
                {"server": "everything", "allow": ["trigger-long-running-operation"]},
                {"server": "files", "allow": ["move_file"]}
            ],
            "http_tools": [{"name": "lookup", "description": "Look an order up.", "url": format!("{lookup}/lookup"), "idempotent": true,
                "input_schema": {"type": "object", "properties": {"order": {"type": "integer"}}, "required": ["order"]}}],
            "tool_policy": {"move_file": {"requires_approval": true}}
        })
    };
    // The dispatcher knows the catalogue too: a server it lacks is refused.
    let (status, body) = fleet.post(
        "/v1/runs",
        json!({"goal": "g", "config": {"mcp": [{"server": "shell", "allow": ["run"]}]}}),
    );
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (422, Some("config.mcp[0].server")),
        "{body}"
    );

    let runs: Vec<(String, String)> = (0..RUNS)
        .map(|i| {
            (
                format!("mcp{i}"),
                fleet.submit(&format!("order {i}"), config(i)),
            )
        })
        .collect();
    // Kill both workers (one after the other, each replaced) once several
    // long-running MCP calls are in flight: recorded, without a result.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "no MCP calls in flight");
        let in_flight = runs
            .iter()
            .filter(|(_, id)| {
                let events = fleet.events(id);
                let started = events.iter().any(|e| {
                    e["type"] == "tool.call"
                        && e["data"]["name"] == "trigger-long-running-operation"
                });
                let ended = events.iter().any(|e| {
                    (e["type"] == "tool.result" || e["type"] == "tool.error")
                        && e["data"]["call_id"] == "call_1"
                });
                started && !ended
            })
            .count();
        if in_flight >= 4 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    fleet.kill_and_replace_worker(0, lease_ms);
    fleet.kill_and_replace_worker(1, lease_ms);

    let results = drive_all(&fleet, &runs, Instant::now() + Duration::from_secs(240));
    assert_eq!(results.len(), RUNS);
    let everything_calls = wire(&wire_dir, "everything.");
    let move_calls = calls_by_key(&wire(&wire_dir, "files."), "move_file");
    for (_, run_id, run) in &results {
        assert_eq!(run["outcome"]["kind"], "succeeded", "run {run_id}: {run}");
        let events = check_log(&fleet, run_id);
        let step_tools = events.iter().find_map(|e| match &e.kind {
            EventKind::StepStart { tools, .. } => Some(tools.clone()),
            _ => None,
        });
        let step_tools = step_tools.unwrap();
        for name in ["trigger-long-running-operation", "move_file", "lookup"] {
            assert!(
                step_tools
                    .iter()
                    .any(|t| t.name == name && t.source.is_some()),
                "run {run_id}: {name} is offered with its source"
            );
        }
        let moves: Vec<&glia_proto::ToolCallRecord> = events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::ToolCall(c) if c.name == "move_file" => Some(c),
                _ => None,
            })
            .collect();
        assert_eq!(moves.len(), 1, "run {run_id}: one move_file call");
        assert!(events.iter().any(|e| matches!(&e.kind, EventKind::ApprovalRequested { tool, .. } if tool == "move_file")), "run {run_id}: approval asked");
        let ran = move_calls
            .get(&moves[0].idempotency_key)
            .copied()
            .unwrap_or(0);
        assert!(
            ran <= 1,
            "run {run_id}: the destructive tool ran {ran} times"
        );
        let outcome = events.iter().find_map(|e| match &e.kind {
            EventKind::ToolResult {
                call_id, content, ..
            } if *call_id == moves[0].call_id => Some(Ok(content.clone())),
            EventKind::ToolError { call_id, error, .. } if *call_id == moves[0].call_id => {
                Some(Err(*error))
            }
            _ => None,
        });
        match outcome {
            Some(Ok(_)) => assert_eq!(
                ran, 1,
                "run {run_id}: a result for a call the server never received"
            ),
            Some(Err(ToolErrorKind::OutcomeUnknown)) => {}
            other => panic!("run {run_id}: move_file outcome {other:?}"),
        }
    }
    // Both workers died with calls in flight: some idempotent call ran again
    // (with its key), and the HTTP tool's keys are the runs' keys.
    let long = calls_by_key(&everything_calls, "trigger-long-running-operation");
    assert!(
        long.values().any(|n| *n >= 2),
        "an interrupted idempotent MCP call ran again with the same key: {long:?}"
    );
    let lookups: Vec<String> = lookup_server
        .seen()
        .iter()
        .map(|r| r.header("idempotency-key").unwrap_or_default().to_owned())
        .collect();
    assert!(
        lookups.len() >= RUNS && lookups.iter().all(|k| k.contains(':')),
        "{lookups:?}"
    );
    let moved = (0..RUNS)
        .filter(|i| files.join(format!("dst-{i}.txt")).exists())
        .count();
    assert_eq!(
        moved,
        move_calls.values().sum::<usize>(),
        "every move the servers received took effect once"
    );
    let _ = logged.kill();
    let _ = logged.wait();
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        log.contains("probe=[redacted]"),
        "the server's stderr is logged, the secret redacted"
    );
    assert!(!log.contains(&secret), "a secret reached the worker's log");
    for (_, run_id, _) in &results {
        assert!(
            !serde_json::to_string(&fleet.events(run_id))
                .unwrap()
                .contains(&secret),
            "a secret reached an event of run {run_id}"
        );
    }
}

/// A catalogue with an unknown key stops `glia worker` and `glia
/// dispatcher` at start, naming the file and the key; so does a secret
/// variable that is not set (for the worker, which needs the values).
#[test]
fn a_bad_catalogue_is_a_startup_error_naming_the_key() {
    let dir =
        std::env::temp_dir().join(format!("glia-catalogue-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("fleet.toml");
    std::fs::write(
        &bad,
        "[mcp_servers.files]\ntransport = \"stdio\"\ncommand = \"npx\"\nargz = [\"x\"]\n",
    )
    .unwrap();
    let unset = dir.join("unset.toml");
    std::fs::write(&unset, "[mcp_servers.files]\ntransport = \"stdio\"\ncommand = \"npx\"\nenv = { TOKEN = \"GLIA_TEST_NEVER_SET_VARIABLE\" }\n").unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(glia_testkit::bin::glia_bin())
            .args(args)
            .env("GLIA_DATABASE_URL", "postgres://127.0.0.1:1/none")
            .env_remove("GLIA_CATALOGUE")
            .env_remove("GLIA_TEST_NEVER_SET_VARIABLE")
            .output()
            .expect("glia runs");
        assert!(
            !out.status.success(),
            "{args:?} started with a bad catalogue"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let path = bad.display().to_string();
    for command in ["worker", "dispatcher"] {
        let err = run(&[command, "--catalogue", &path]);
        assert!(
            err.contains(&format!(
                "{path}: mcp_servers.files.argz: unknown field `argz`"
            )),
            "{command}: {err}"
        );
    }
    let err = run(&["worker", "--catalogue", &unset.display().to_string()]);
    assert!(
        err.contains("mcp_servers.files.env.TOKEN")
            && err.contains("GLIA_TEST_NEVER_SET_VARIABLE is not set"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
