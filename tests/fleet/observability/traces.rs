//! Traces in a real OTLP receiver: Arize Phoenix (from PyPI, pinned in
//! `.ci/requirements-phoenix.txt`, installed by `scripts/test` into
//! `.ci/phoenix-venv`) on its own ports and working directory. A worker
//! configured with the standard `OTEL_EXPORTER_OTLP_*` variables runs a
//! scripted agent that calls a tool, then one that needs an approval (so
//! the run spans two jobs); Phoenix's REST API must then hold the run's
//! trace:
//!
//! - every span's trace id is the run id (`run_id.simple()`);
//! - the tree: the root `invoke_agent glia` (span id = the run id's last 8
//!   bytes, no parent) ← one `job` span per job ← `step 0` ← `chat
//!   script:traced` and `execute_tool {tool}`;
//! - the GenAI attributes carry the right values: operation names, model,
//!   provider, tokens per call (as the run's events record them), tool
//!   names and call ids, the run's totals and outcome on the root;
//! - no attribute carries the goal, a message, a tool argument or the OTLP
//!   headers (a secret only the exporter knows).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use glia_testkit::fleet::{Fleet, drive, free_port, http};
use glia_testkit::require::require;
use serde_json::{Value, json};

/// The `phoenix` command: `GLIA_PHOENIX`, else `.ci/phoenix-venv/bin/phoenix`
/// (what `scripts/test` installs), if it exists.
fn phoenix_bin() -> Option<PathBuf> {
    let path = std::env::var_os("GLIA_PHOENIX").map_or_else(
        || glia_testkit::workspace_root().join(".ci/phoenix-venv/bin/phoenix"),
        PathBuf::from,
    );
    path.is_file().then_some(path)
}

/// A private Phoenix: own HTTP (OTLP/HTTP and REST) and gRPC ports, own
/// working directory (its SQLite database); killed and removed on drop.
struct Phoenix {
    child: Child,
    url: String,
    dir: PathBuf,
}

impl Phoenix {
    /// Start one and wait until its REST API answers; `None` when the
    /// `phoenix` command is not installed.
    fn start() -> Option<Phoenix> {
        let bin = phoenix_bin()?;
        let dir =
            std::env::temp_dir().join(format!("glia_phoenix_{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.join("phoenix.log")).unwrap();
        let child = Command::new(bin)
            .arg("serve")
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", port.to_string())
            .env("PHOENIX_GRPC_PORT", free_port().to_string())
            .env("PHOENIX_WORKING_DIR", &dir)
            // No telemetry of its own, no browser, no outside calls.
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .env("DO_NOT_TRACK", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("phoenix serve starts");
        let mut phoenix = Phoenix {
            child,
            url: format!("http://127.0.0.1:{port}"),
            dir,
        };
        // A cold start (migrations, imports) takes a while on a busy machine.
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Ok((200, _)) = http("GET", &format!("{}/v1/projects", phoenix.url), None) {
                return Some(phoenix);
            }
            if let Ok(Some(status)) = phoenix.child.try_wait() {
                panic!("phoenix exited ({status}):\n{}", phoenix.log());
            }
            assert!(
                Instant::now() < deadline,
                "phoenix did not answer within 180 s:\n{}",
                phoenix.log()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("phoenix.log")).unwrap_or_default()
    }

    /// Every span of trace `trace_id` in the default project (paged).
    fn spans(&self, trace_id: &str) -> Vec<Value> {
        let mut spans = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut url = format!(
                "{}/v1/projects/default/spans?trace_id={trace_id}&limit=1000",
                self.url
            );
            if let Some(c) = &cursor {
                url.push_str(&format!("&cursor={c}"));
            }
            match http("GET", &url, None) {
                Ok((200, page)) => {
                    spans.extend(page["data"].as_array().cloned().unwrap_or_default());
                    match page["next_cursor"].as_str() {
                        Some(c) => cursor = Some(c.to_owned()),
                        None => return spans,
                    }
                }
                // The project appears with the first span.
                Ok((404, _)) => return spans,
                other => panic!("GET {url}: {other:?}"),
            }
        }
    }
}

impl Drop for Phoenix {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

fn span_id(span: &Value) -> &str {
    span["context"]["span_id"].as_str().unwrap_or("")
}

fn parent(span: &Value) -> Option<&str> {
    span["parent_id"].as_str()
}

fn named<'a>(spans: &'a [Value], prefix: &str) -> Vec<&'a Value> {
    spans
        .iter()
        .filter(|s| s["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
        .collect()
}

#[test]
fn a_runs_spans_reach_phoenix_as_one_genai_trace() {
    let Some(phoenix) = require(
        Phoenix::start(),
        "Arize Phoenix (.ci/phoenix-venv/bin/phoenix)",
        "scripts/test installs it from .ci/requirements-phoenix.txt; or set GLIA_PHOENIX",
    ) else {
        return;
    };
    let usage =
        |i: u64, o: u64| json!({"input_tokens": i, "output_tokens": o, "cache_read_tokens": 5});
    let script = json!([
        {"tool_calls": [{"name": "get_order", "input": {"order_id": "ARG-SECRET-7"}}], "usage": usage(101, 11)},
        {"tool_calls": [{"name": "refund_order", "input": {"order_id": "ARG-SECRET-7"}}], "usage": usage(202, 22)},
        {"text": "ANSWER-SECRET-9: refunded.", "usage": usage(303, 33)},
    ]);
    let mut fleet = Fleet::new(&[("traced", script)]);
    let header_secret = format!("hdr-{}", uuid::Uuid::now_v7().simple());
    fleet.worker_env.insert(
        0,
        vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), phoenix.url.clone()),
            (
                "OTEL_EXPORTER_OTLP_HEADERS".into(),
                format!("x-glia-test={header_secret}"),
            ),
            ("OTEL_SERVICE_NAME".into(), "glia-worker-test".into()),
            // Spans leave every 200 ms instead of every 5 s.
            ("OTEL_BSP_SCHEDULE_DELAY".into(), "200".into()),
        ],
    );
    fleet.start_dispatcher();
    fleet.start_worker(2_000);

    let goal = format!(
        "GOAL-SECRET-{}: refund order ARG-SECRET-7",
        uuid::Uuid::now_v7().simple()
    );
    let run_id = fleet.submit(
        &goal,
        json!({
            "model": "script:traced",
            "policies": [{"tool": "refund_order", "action": {"kind": "require_approval"}}],
        }),
    );
    let run = drive(&fleet, &run_id, Instant::now() + Duration::from_secs(120));
    assert_eq!(run["outcome"]["kind"], "succeeded", "{run}");
    let events = fleet.events(&run_id);
    let trace_id = uuid::Uuid::parse_str(&run_id).unwrap().simple().to_string();

    // The root is exported last (at the run's end): wait for it and for the
    // spans of the calls.
    let deadline = Instant::now() + Duration::from_secs(90);
    let spans = loop {
        let spans = phoenix.spans(&trace_id);
        let root = spans.iter().any(|s| parent(s).is_none());
        if root && named(&spans, "chat ").len() >= 3 && named(&spans, "execute_tool ").len() >= 2 {
            break spans;
        }
        assert!(
            Instant::now() < deadline,
            "the run's spans did not reach Phoenix: {} span(s): {}\nworker log:\n{}\nphoenix log:\n{}",
            spans.len(),
            serde_json::to_string_pretty(&spans).unwrap(),
            std::fs::read_to_string(fleet.log_file("w0")).unwrap_or_default(),
            phoenix.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    };

    // One trace: the run's.
    for s in &spans {
        assert_eq!(s["context"]["trace_id"], trace_id.as_str(), "{s}");
    }

    // The root: the run, its span id from the run id.
    let roots: Vec<&Value> = spans.iter().filter(|s| parent(s).is_none()).collect();
    assert_eq!(roots.len(), 1, "one root: {roots:?}");
    let root = roots[0];
    assert_eq!(root["name"], "invoke_agent glia");
    assert_eq!(span_id(root), &trace_id[16..]);
    assert_eq!(attr(root, "gen_ai.operation.name"), "invoke_agent");
    assert_eq!(attr(root, "gen_ai.agent.name"), "glia");
    assert_eq!(attr(root, "gen_ai.conversation.id"), run_id.as_str());
    assert_eq!(attr(root, "gen_ai.request.model"), "script:traced");
    assert_eq!(attr(root, "glia.run.outcome"), "succeeded");
    // Totals: uncached input + cache reads, as the GenAI convention counts input.
    assert_eq!(
        attr(root, "gen_ai.usage.input_tokens"),
        101 + 202 + 303 + 15
    );
    assert_eq!(attr(root, "gen_ai.usage.output_tokens"), 11 + 22 + 33);

    // Jobs under the root: the approval splits the run into two or more.
    let jobs = named(&spans, "job");
    assert!(jobs.len() >= 2, "a job per advance: {jobs:?}");
    for j in &jobs {
        assert_eq!(parent(j), Some(span_id(root)), "{j}");
        assert_eq!(j["attributes"]["run_id"], run_id.as_str());
        assert_eq!(j["attributes"]["trace_id"], trace_id.as_str());
    }
    let job_ids: Vec<&str> = jobs.iter().map(|j| span_id(j)).collect();

    // Steps under jobs; model and tool calls under steps.
    let steps = named(&spans, "step ");
    assert!(!steps.is_empty(), "step spans");
    for s in &steps {
        assert!(job_ids.contains(&parent(s).unwrap_or("")), "{s}");
        assert_eq!(attr(s, "glia.step.index"), 0);
    }
    let step_ids: Vec<&str> = steps.iter().map(|s| span_id(s)).collect();

    let mut chats = named(&spans, "chat ");
    chats.sort_by_key(|c| c["start_time"].as_str().unwrap_or("").to_owned());
    let responses: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "model.response")
        .collect();
    assert_eq!(chats.len(), 3, "a chat span per model call: {chats:?}");
    assert_eq!(responses.len(), 3);
    for (r, (input, output)) in responses.iter().zip([(101, 11), (202, 22), (303, 33)]) {
        assert_eq!(
            r["data"]["usage"]["input_tokens"], input,
            "the script's usage: {r}"
        );
        assert_eq!(r["data"]["usage"]["output_tokens"], output);
    }
    for (i, c) in chats.iter().enumerate() {
        assert_eq!(c["name"], "chat script:traced");
        assert!(step_ids.contains(&parent(c).unwrap_or("")), "{c}");
        assert_eq!(attr(c, "gen_ai.operation.name"), "chat");
        assert_eq!(attr(c, "gen_ai.request.model"), "script:traced");
        assert_eq!(attr(c, "gen_ai.provider.name"), "scripted");
        let (input, output) = [(101, 11), (202, 22), (303, 33)][i];
        assert_eq!(attr(c, "gen_ai.usage.input_tokens"), input + 5, "{c}");
        assert_eq!(attr(c, "gen_ai.usage.output_tokens"), output, "{c}");
        assert_eq!(attr(c, "gen_ai.usage.cache_read.input_tokens"), 5, "{c}");
        let finish = if i < 2 { "tool_use" } else { "end_turn" };
        assert_eq!(attr(c, "gen_ai.response.finish_reasons"), finish, "{c}");
    }

    let calls: Vec<(String, String)> = events
        .iter()
        .filter(|e| e["type"] == "tool.call")
        .map(|e| {
            (
                e["data"]["name"].as_str().unwrap_or("").to_owned(),
                e["data"]["call_id"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    let tools = named(&spans, "execute_tool ");
    assert_eq!(tools.len(), 2, "{tools:?}");
    for t in &tools {
        assert!(step_ids.contains(&parent(t).unwrap_or("")), "{t}");
        assert_eq!(attr(t, "gen_ai.operation.name"), "execute_tool");
        let name = attr(t, "gen_ai.tool.name").as_str().unwrap_or("");
        let id = attr(t, "gen_ai.tool.call.id").as_str().unwrap_or("");
        assert_eq!(t["name"], format!("execute_tool {name}"));
        assert!(
            calls.contains(&(name.to_owned(), id.to_owned())),
            "{name}#{id} is one of the run's calls {calls:?}"
        );
    }

    // No content, no secret: the goal, tool arguments, the answer and the
    // exporter's headers appear in no span.
    let text = serde_json::to_string(&spans).unwrap();
    for secret in [
        "GOAL-SECRET",
        "ARG-SECRET",
        "ANSWER-SECRET",
        header_secret.as_str(),
    ] {
        assert!(!text.contains(secret), "{secret} exported: {text}");
    }
}
