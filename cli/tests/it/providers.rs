//! `glia run --provider anthropic|openai --base-url URL` and `glia dev
//! --provider …` against a local HTTP server that replays recorded provider
//! answers (the fixtures of `providers/tests/fixtures`), and the clear error
//! when no API key is configured.

use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use glia_proto::{Event, EventKind, Outcome, RunState, Status};
use glia_providers::PriceTable;
use glia_testkit::http::Server as Local;
use serde_json::json;

const PRICES: &str = "../providers/prices.example.json";

fn glia() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_glia"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("RUST_LOG", "warn")
        .env_remove("RUST_BACKTRACE");
    cmd
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("glia runs")
}

fn events(out: &Output) -> Vec<Event> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn answer(log: &[Event]) -> String {
    let state = RunState::replay(log[0].run_id, log).expect("the printed log replays");
    match state.status() {
        Status::Done(Outcome::Succeeded { answer, .. }) => answer,
        other => panic!("{other:?}"),
    }
}

fn responses(log: &[Event]) -> Vec<(glia_proto::Usage, u64)> {
    log.iter()
        .filter_map(|e| match &e.kind {
            EventKind::ModelResponse {
                usage,
                cost_usd_micros,
                ..
            } => Some((*usage, *cost_usd_micros)),
            _ => None,
        })
        .collect()
}

#[test]
fn openai_compatible_run_against_a_local_server() {
    let server = Local::streams(&["openai/loop_turn1.sse", "openai/loop_turn2.sse"]);
    let base = format!("{}/v1", server.base);
    let key = "sk-cli-openai-test-0123456789";
    let out = run(glia()
        .args([
            "run",
            "--demo",
            "--json",
            "--provider",
            "openai",
            "--base-url",
            &base,
            "--api-key-env",
            "GLIA_CLI_TEST_OPENAI_KEY",
        ])
        .args(["--prices", PRICES, "--model", "gpt-4o", "What is 2 + 40?"])
        .env("GLIA_CLI_TEST_OPENAI_KEY", key));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = events(&out);
    assert!(answer(&log).contains("42"), "{}", answer(&log));
    // Two turns: the model called `add` (not a tool of `glia run`), got an
    // error result, and answered.
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert!(
        seen.iter().all(|s| s.path == "/v1/chat/completions"),
        "{seen:?}"
    );
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {key}").as_str())
    );
    assert_eq!(seen[0].body["model"], "gpt-4o");
    assert_eq!(seen[0].body["stream"], true);
    let tool_message = seen[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("the tool result is sent")
        .clone();
    assert_eq!(tool_message["tool_call_id"], "call_Add1");
    // Cost from the price file, on the recorded usage.
    let pricing = PriceTable::from_file(format!("{}/{PRICES}", env!("CARGO_MANIFEST_DIR")))
        .unwrap()
        .pricing("openai", "gpt-4o")
        .unwrap();
    let costs = responses(&log);
    assert_eq!(costs.len(), 2);
    for (usage, cost) in costs {
        assert!(cost > 0);
        assert_eq!(cost, pricing.cost_usd_micros(&usage));
    }
    // The key never reaches the output.
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains(key)
            && !String::from_utf8_lossy(&out.stderr).contains(key)
    );
}

#[test]
fn anthropic_run_against_a_local_server() {
    let server = Local::streams(&["anthropic/loop_turn1.sse", "anthropic/loop_turn2.sse"]);
    let config =
        std::env::temp_dir().join(format!("glia-cli-anthropic-{}.json", std::process::id()));
    std::fs::write(&config, json!({"model": "claude-sonnet-4-5", "system": "You are a careful calculator.", "max_tokens": 1024}).to_string()).unwrap();
    let out = run(glia()
        .args([
            "run",
            "--demo",
            "--provider",
            "anthropic",
            "--base-url",
            &server.base,
            "--config",
            config.to_str().unwrap(),
            "What is 2 + 40?",
        ])
        .env("ANTHROPIC_API_KEY", "sk-ant-cli-test-0123456789"));
    std::fs::remove_file(&config).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let names: Vec<&str> = text
        .lines()
        .map(|l| l.split_whitespace().nth(2).unwrap())
        .collect();
    assert_eq!(
        names.iter().filter(|n| **n == "model.response").count(),
        2,
        "{text}"
    );
    assert_eq!(names.last(), Some(&"session.complete"), "{text}");
    assert!(text.contains("42"), "{text}");
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|s| s.path == "/v1/messages"));
    assert_eq!(
        seen[0].header("x-api-key"),
        Some("sk-ant-cli-test-0123456789")
    );
    assert_eq!(seen[0].header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(seen[0].body["model"], "claude-sonnet-4-5");
    assert_eq!(
        seen[0].body["system"][0]["cache_control"],
        json!({"type": "ephemeral"})
    );
    // The second request answers the tool use in the next user turn.
    let messages = seen[1].body["messages"].as_array().unwrap();
    let tool_use_id = messages[1]["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap()["id"]
        .clone();
    assert_eq!(messages[2]["content"][0]["type"], "tool_result");
    assert_eq!(messages[2]["content"][0]["tool_use_id"], tool_use_id);
}

#[test]
fn a_missing_key_names_the_variable_to_set() {
    let out = run(glia()
        .args([
            "run",
            "--provider",
            "openai",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--model",
            "gpt-4o",
            "hi",
        ])
        .env_remove("OPENAI_API_KEY"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "no API key for the openai provider: set the environment variable OPENAI_API_KEY"
        ),
        "{err}"
    );
    let out = run(glia()
        .args([
            "run",
            "--provider",
            "anthropic",
            "--api-key-env",
            "GLIA_CLI_NO_SUCH_KEY",
            "--model",
            "claude-sonnet-4-5",
            "hi",
        ])
        .env_remove("GLIA_CLI_NO_SUCH_KEY"));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("set the environment variable GLIA_CLI_NO_SUCH_KEY")
    );
    // A worker refuses to start the same way, before it connects to anything.
    let out = run(glia()
        .args([
            "worker",
            "--provider",
            "anthropic",
            "--api-key-env",
            "GLIA_CLI_NO_SUCH_KEY",
        ])
        .env("GLIA_DATABASE_URL", "postgres://nobody@127.0.0.1:9/none")
        .env_remove("GLIA_CLI_NO_SUCH_KEY"));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("set the environment variable GLIA_CLI_NO_SUCH_KEY"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_keyless_local_server_needs_allow_missing_key() {
    let server = Local::streams(&["openai/loop_turn2.sse"]);
    let base = format!("{}/v1", server.base);
    let out = run(glia()
        .args([
            "run",
            "--demo",
            "--json",
            "--provider",
            "openai",
            "--base-url",
            &base,
            "--allow-missing-key",
            "--model",
            "llama3",
            "hi",
        ])
        .env_remove("OPENAI_API_KEY"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(answer(&events(&out)).contains("42"));
    assert_eq!(server.seen()[0].header("authorization"), None);
}

#[test]
fn exactly_one_of_script_and_provider() {
    let out = run(glia().args(["run", "goal"]));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--script <SCRIPT>|--provider"));
    let out = run(glia().args([
        "run",
        "--script",
        "../examples/scripts/refund.json",
        "--provider",
        "openai",
        "goal",
    ]));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
    // Provider options need --provider.
    let out = run(glia().args([
        "run",
        "--script",
        "../examples/scripts/refund.json",
        "--base-url",
        "http://x",
        "goal",
    ]));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--base-url only applies with --provider")
    );
    let out = run(glia().args(["worker", "--prices", PRICES]));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--provider"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A real provider needs a model name, and a price file must price it.
    let out = run(glia().args(["run", "--provider", "openai", "--allow-missing-key", "goal"]));
    assert!(String::from_utf8_lossy(&out.stderr).contains("name the openai model to call"));
    let out = run(glia().args([
        "run",
        "--provider",
        "openai",
        "--allow-missing-key",
        "--model",
        "gpt-9",
        "--prices",
        "../examples/refund.config.json",
        "goal",
    ]));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("price table is not valid"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(glia().args([
        "run",
        "--provider",
        "anthropic",
        "--allow-missing-key",
        "--model",
        "claude-9",
        "--prices",
        PRICES,
        "goal",
    ]));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("has no price for anthropic/claude-9"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Kills the child process when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `glia dev` with one worker on Anthropic at `base`, plus `extra`
/// arguments, once its API answers; and the API's URL.
fn dev_on(base: &str, extra: &[&str]) -> (Child, String) {
    let listen = format!("127.0.0.1:{}", free_port());
    let dev = Child(
        glia()
            .args([
                "dev",
                "--demo",
                "--listen",
                &listen,
                "--workers",
                "1",
                "--provider",
                "anthropic",
                "--base-url",
                base,
                "--allow-missing-key",
                "--prices",
                PRICES,
            ])
            .args(extra)
            .env_remove("ANTHROPIC_API_KEY")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("glia dev starts"),
    );
    let dispatcher = format!("http://{listen}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !reqwest::blocking::get(format!("{dispatcher}/healthz"))
        .is_ok_and(|r| r.status().as_u16() == 200)
    {
        assert!(Instant::now() < deadline, "glia dev did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    (dev, dispatcher)
}

/// Submit "What is 2 + 40?" on claude-sonnet-4-5 to `dispatcher` and wait
/// for the run's end: its log, which must answer 42.
fn add_2_and_40(dispatcher: &str) -> Vec<Event> {
    // The run's config names no prices: the worker's price file applies.
    static SUBMITTED: AtomicUsize = AtomicUsize::new(0);
    let config = std::env::temp_dir().join(format!(
        "glia-cli-dev-{}-{}.json",
        std::process::id(),
        SUBMITTED.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(
        &config,
        json!({"model": "claude-sonnet-4-5", "max_tokens": 1024}).to_string(),
    )
    .unwrap();
    let out = run(glia().args([
        "submit",
        "--server",
        dispatcher,
        "--json",
        "--config",
        config.to_str().unwrap(),
        "What is 2 + 40?",
    ]));
    std::fs::remove_file(&config).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = events(&out);
    assert!(answer(&log).contains("42"));
    log
}

#[test]
fn glia_dev_drives_runs_on_a_real_provider_and_prices_them() {
    let server = Local::streams(&["anthropic/loop_turn1.sse", "anthropic/loop_turn2.sse"]);
    let (_dev, dispatcher) = dev_on(&server.base, &[]);
    let log = add_2_and_40(&dispatcher);
    let pricing = PriceTable::from_file(format!("{}/{PRICES}", env!("CARGO_MANIFEST_DIR")))
        .unwrap()
        .pricing("anthropic", "claude-sonnet-4-5")
        .unwrap();
    let costs = responses(&log);
    assert_eq!(costs.len(), 2);
    assert!(
        costs
            .iter()
            .all(|(usage, cost)| *cost > 0 && *cost == pricing.cost_usd_micros(usage)),
        "{costs:?}"
    );
    assert_eq!(server.seen().len(), 2);
    assert_eq!(server.seen()[0].header("x-api-key"), None);
}

/// The worker's `/metrics` as Prometheus scrapes it: the provider adapter's
/// counters under their documented names (`glia_provider_*`, not
/// `glia_worker_glia_provider_*`), and a time to first token for every
/// model call, the one whose answer is a tool call only included.
#[test]
fn glia_dev_serves_provider_metrics_under_their_documented_names() {
    let server = Local::streams(&[
        "anthropic/loop_turn1_tool_only.sse",
        "anthropic/loop_turn2.sse",
    ]);
    let metrics = format!("127.0.0.1:{}", free_port());
    let (_dev, dispatcher) = dev_on(&server.base, &["--metrics-listen", &metrics]);
    let log = add_2_and_40(&dispatcher);
    assert_eq!(responses(&log).len(), 2);
    let scraped = reqwest::blocking::get(format!("http://{metrics}/metrics"))
        .and_then(|r| r.error_for_status())
        .and_then(|r| r.text())
        .expect("the worker serves /metrics");
    let sample = |series: &str| -> Option<f64> {
        scraped
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    };
    assert!(!scraped.contains("glia_worker_glia_provider"), "{scraped}");
    // (A family with no series yet, such as the retries, is not exported.)
    assert!(
        scraped.contains("# TYPE glia_provider_requests counter"),
        "{scraped}"
    );
    assert!(
        sample(
            r#"glia_provider_tokens_total{provider="anthropic",model="claude-sonnet-4-5",kind="output"}"#
        )
        .is_some_and(|n| n > 0.0),
        "{scraped}"
    );
    assert_eq!(
        sample(
            r#"glia_provider_requests_total{provider="anthropic",model="claude-sonnet-4-5",outcome="ok"}"#
        ),
        Some(2.0),
        "{scraped}"
    );
    assert_eq!(
        sample(
            r#"glia_worker_model_calls_total{provider="anthropic",model="claude-sonnet-4-5",outcome="ok"}"#
        ),
        Some(2.0),
        "{scraped}"
    );
    assert_eq!(
        sample(
            r#"glia_worker_model_time_to_first_token_seconds_count{provider="anthropic",model="claude-sonnet-4-5"}"#
        ),
        Some(2.0),
        "{scraped}"
    );
}
