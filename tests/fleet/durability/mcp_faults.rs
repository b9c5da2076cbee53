//! MCP servers that misbehave, on a real fleet (a dispatcher and a worker
//! process on Postgres, RabbitMQ and Redis, the operator's catalogue naming
//! `testkit`'s `odd-mcp` over stdio and streamable HTTP): a cursor that never
//! advances, a server that never lists its tools, a call that never ends,
//! one that dies by a signal, a 5 MiB answer, a result breaking its output
//! schema, banners on stdout, an expired HTTP session. Every fault ends in a
//! recorded event and a run that finishes, pauses or fails with a named
//! reason within a bound: no run stays at its first event.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use glia_proto::tool_names::provider_tool_name;
use glia_testkit::fleet::*;
use glia_testkit::odd_mcp::{odd_mcp_bin, requests};
use serde_json::{Value, json};

/// An `odd-mcp http` process on a free port, killed on drop.
struct HttpServer {
    child: Child,
    url: String,
}

impl HttpServer {
    fn start(state: &Path) -> HttpServer {
        use std::io::BufRead;
        let mut child = Command::new(odd_mcp_bin())
            .args(["http", "127.0.0.1:0", &state.display().to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("odd-mcp starts");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("odd-mcp prints its URL");
        HttpServer {
            child,
            url: line.trim().to_owned(),
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One fault: a script for the model, the run's config, and what its log
/// must show.
struct Fault {
    name: &'static str,
    turns: Value,
    config: Value,
}

fn fault(name: &'static str, server: &str, allow: &[&str], turns: Value) -> Fault {
    Fault {
        name,
        turns,
        config: json!({
            "model": format!("script:{name}"),
            "mcp": [{"server": server, "allow": allow}],
        }),
    }
}

fn call(name: &str, input: Value) -> Value {
    json!({"tool_calls": [{"name": name, "input": input}]})
}

/// Wait until the run is done or parked at a pull point (not at its first
/// event), up to `deadline`; answers the run.
fn settled(fleet: &Fleet, run_id: &str, deadline: Instant) -> Value {
    loop {
        let (status, run) = fleet.get(&format!("/v1/runs/{run_id}"));
        assert_eq!(status, 200, "{run}");
        if run["status"] == "done" || run["status"] == "parked" {
            return run;
        }
        assert!(
            Instant::now() < deadline,
            "run {run_id} neither finished nor parked: {run}\nevents: {}\n{}",
            Value::Array(fleet.events(run_id)),
            fleet.log_tails(40)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

#[test]
fn every_mcp_fault_ends_in_an_event_and_a_named_outcome() {
    let faults = vec![
        fault(
            "hang",
            "odd",
            &["hang"],
            json!([call("hang", json!({})), {"text": "gave up"}]),
        ),
        fault(
            "die",
            "mortal",
            &["die", "echo"],
            json!([call("die", json!({"signal": 9})), call("echo", json!({})), {"text": "recovered"}]),
        ),
        fault(
            "big",
            "odd",
            &["big"],
            json!([call("big", json!({})), {"text": "read it"}]),
        ),
        fault(
            "violates",
            "odd",
            &["violates"],
            json!([call("violates", json!({})), {"text": "noted"}]),
        ),
        fault(
            "banner",
            "odd",
            &["noisy"],
            json!([call("noisy", json!({})), {"text": "quiet"}]),
        ),
        fault(
            "expired",
            "odd_http",
            &["expire_session", "echo"],
            json!([call("expire_session", json!({})), call("echo", json!({})), {"text": "again"}]),
        ),
        fault(
            "names",
            "odd",
            &["calendar.read"],
            json!([call(&provider_tool_name("calendar.read"), json!({})), {"text": "read"}]),
        ),
        fault(
            "looping",
            "looping",
            &["echo"],
            json!([call("echo", json!({})), {"text": "listed"}]),
        ),
        fault(
            "silent",
            "silent",
            &["echo"],
            json!([call("echo", json!({})), {"text": "never"}]),
        ),
    ];
    let scripts: Vec<(&str, Value)> = faults.iter().map(|f| (f.name, f.turns.clone())).collect();
    let mut fleet = Fleet::new(&scripts);
    let state = fleet.dir.join("odd");
    let http = HttpServer::start(&state.join("http"));
    let bin = odd_mcp_bin().display().to_string();
    let stdio = |name: &str, extra: &[&str]| {
        let mut args = vec!["stdio".to_owned(), state.join(name).display().to_string()];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        format!(
            "[mcp_servers.{name}]\ntransport = \"stdio\"\ncommand = {bin:?}\nargs = {args:?}\n\n"
        )
    };
    let catalogue = format!(
        "{}{}{}{}[mcp_servers.odd_http]\ntransport = \"streamable_http\"\nurl = {:?}\n",
        stdio("odd", &["--banner"]),
        stdio("mortal", &[]),
        stdio("looping", &["--list", "looping-cursor"]),
        stdio("silent", &["--list", "never"]),
        http.url,
    );
    fleet.use_catalogue(&catalogue);
    fleet.start_dispatcher();
    fleet.start_worker(2_000);

    let runs: Vec<(&Fault, String)> = faults
        .iter()
        .map(|f| {
            let mut config = f.config.clone();
            match f.name {
                "hang" => config["tool_policy"] = json!({"hang": {"timeout_ms": 1000}}),
                "silent" => {
                    config["on_tool_source_unavailable"] =
                        json!({"attempts": 2, "backoff_ms": 100, "then": "pause"})
                }
                _ => {}
            }
            (f, fleet.submit(f.name, config))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(300);
    for (f, run_id) in &runs {
        let run = settled(&fleet, run_id, deadline);
        let events = fleet.events(run_id);
        assert!(
            events.len() > 1,
            "{}: the run stayed at its first event",
            f.name
        );
        let errors = of_type(&events, "tool.error");
        let error_text = |kind: &str| {
            errors
                .iter()
                .find(|e| e["data"]["error"] == kind)
                .map(|e| e["data"]["message"].as_str().unwrap_or_default().to_owned())
                .unwrap_or_else(|| {
                    panic!(
                        "{}: no {kind} tool error in {}",
                        f.name,
                        Value::Array(events.clone())
                    )
                })
        };
        match f.name {
            "hang" => {
                assert_eq!(run["outcome"]["kind"], "succeeded", "{run}");
                error_text("timeout");
                assert!(
                    requests(&state.join("odd"))
                        .iter()
                        .any(|l| l.starts_with("cancelled")),
                    "the cut call was cancelled at the server"
                );
            }
            "die" => {
                assert_eq!(run["outcome"]["kind"], "succeeded", "{run}");
                let message = error_text("outcome_unknown");
                assert!(
                    message.contains("signal 9") || message.contains("SIGKILL"),
                    "{message}"
                );
                assert!(
                    message.contains("odd-mcp: fatal"),
                    "the last stderr lines: {message}"
                );
            }
            "big" => {
                assert_eq!(run["outcome"]["kind"], "succeeded", "{run}");
                let result = &of_type(&events, "tool.result")[0]["data"]["content"];
                assert_eq!(
                    result.as_str().map(str::len),
                    Some(5 * 1024 * 1024),
                    "the log keeps the whole result"
                );
            }
            "violates" => {
                assert_eq!(run["outcome"]["kind"], "succeeded", "{run}");
                let message = error_text("invalid_output");
                assert!(message.contains("count"), "{message}");
            }
            "names" => {
                assert_eq!(run["outcome"]["kind"], "succeeded", "{run}");
                let result = &of_type(&events, "tool.result")[0]["data"]["content"];
                assert_eq!(
                    result, "called as calendar.read",
                    "the server got its own name"
                );
            }
            "banner" | "looping" => {
                assert_eq!(run["outcome"]["kind"], "succeeded", "{run}");
            }
            "expired" => {
                assert_eq!(run["outcome"]["kind"], "succeeded", "{run}");
                assert!(
                    requests(&state.join("http"))
                        .iter()
                        .any(|l| l.starts_with("expired")),
                    "the session expired at the server"
                );
                assert!(
                    !errors
                        .iter()
                        .any(|e| e["data"]["error"] == "outcome_unknown"),
                    "a request the server refused with 404 never ran: {errors:?}"
                );
            }
            "silent" => {
                let unavailable = of_type(&events, "tool_source.unavailable");
                assert!(!unavailable.is_empty(), "no event names the silent server");
                assert_eq!(unavailable.len(), 2, "one event an attempt");
                assert_eq!(unavailable[0]["data"]["server"], "silent");
                assert_eq!(run["status"], "parked", "{run}");
                assert_eq!(run["pull_point"]["kind"], "paused", "{run}");
            }
            other => unreachable!("{other}"),
        }
    }
    let looping_lists = requests(&state.join("looping"))
        .iter()
        .filter(|l| l.starts_with("list"))
        .count();
    assert!(
        looping_lists < 1000,
        "a looping cursor was followed {looping_lists} times"
    );
}
