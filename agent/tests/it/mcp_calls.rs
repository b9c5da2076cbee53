//! Long MCP calls and diagnostics that name the cause (issue 29, items 3
//! and 7), against real servers: `server-everything` (its
//! `trigger-long-running-operation` reports progress once per step) over
//! stdio and streamable HTTP, and the project's misbehaving fixture
//! `odd-mcp` (`glia_testkit::odd_mcp`, which logs what it saw). Bounds are
//! generous: no test asserts that anything is fast.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use glia_agent::tool::ToolFailure;
use glia_agent::tool_sources::ToolSources;
use glia_proto::{RunConfig, ToolContent, ToolErrorKind, ToolPolicy, ToolSpec};
use glia_testkit::odd_mcp;
use serde_json::{Value, json};
use uuid::Uuid;

use super::mcp::{
    allow, call_and_cancel_on_wire, ctx, everything_stdio, server, sources, teed_everything,
};

const LONG: &str = "trigger-long-running-operation";

/// A fresh state directory for an `odd-mcp` server.
fn state_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("glia-odd-{}", Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The catalogue entry of `odd-mcp` over stdio, keeping its files in `state`.
fn odd_stdio(name: &str, state: &std::path::Path, flags: &[&str]) -> String {
    let mut args = vec!["stdio".to_owned(), state.display().to_string()];
    args.extend(flags.iter().map(|f| (*f).to_owned()));
    format!(
        "[mcp_servers.{name}]\ntransport = \"stdio\"\ncommand = {:?}\nargs = {args:?}\n",
        odd_mcp::odd_mcp_bin().display().to_string()
    )
}

fn http_entry(name: &str, url: &str) -> String {
    format!("[mcp_servers.{name}]\ntransport = \"streamable_http\"\nurl = {url:?}\n")
}

/// `server-everything` over streamable HTTP on a free port: the child (killed
/// on drop) and its catalogue entry named `name`.
fn everything_http(name: &str, script: &str) -> (tokio::process::Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = tokio::process::Command::new("node")
        .args([script, "streamableHttp"])
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("node");
    (
        child,
        http_entry(name, &format!("http://127.0.0.1:{port}/mcp")),
    )
}

/// The step's spec of `tool` on `server`, with `policy` for it.
async fn spec(sources: &ToolSources, server: &str, tool: &str, policy: ToolPolicy) -> ToolSpec {
    let mut config = RunConfig::default();
    config.mcp.push(allow(server, &[tool]));
    config.tool_policy.insert(tool.into(), policy);
    let mut specs = sources.offered(&config).await.expect("offered");
    specs.remove(0)
}

/// Call `spec` with `input`: the result and the progress reports seen.
async fn call(
    sources: &ToolSources,
    spec: &ToolSpec,
    input: Value,
) -> (Result<ToolContent, ToolFailure>, usize) {
    let reports = Mutex::new(0usize);
    let progress = |_: String| *reports.lock().unwrap() += 1;
    let result = sources
        .execute(spec, input, &ctx(&Uuid::now_v7().to_string()), &progress)
        .await;
    let seen = *reports.lock().unwrap();
    (result, seen)
}

fn policy(timeout_ms: u64, max_total_ms: Option<u64>) -> ToolPolicy {
    ToolPolicy {
        timeout_ms: Some(timeout_ms),
        max_total_ms,
        ..ToolPolicy::default()
    }
}

/// The catalogues of `server-everything` over stdio and over streamable
/// HTTP (the HTTP child is kept alive by the returned handle).
fn both_transports(script: &str) -> (Vec<(&'static str, Arc<ToolSources>)>, tokio::process::Child) {
    let (child, http) = everything_http("web", script);
    let stdio = sources(&everything_stdio("local", script));
    let web = sources(&http);
    (vec![("local", stdio), ("web", web)], child)
}

/// A call that runs longer than its `timeout_ms` but reports progress more
/// often is not cut: each report starts the idle timeout again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_keeps_a_call_alive_past_its_timeout() {
    let Some(everything) = server("server-everything") else {
        return;
    };
    let (servers, _child) = both_transports(&everything);
    let runs = servers.iter().map(|(name, sources)| async move {
        // 8 s in 40 steps of 200 ms, with an idle timeout of 5 s.
        let spec = spec(sources, name, LONG, policy(5_000, None)).await;
        let (result, reports) = call(sources, &spec, json!({"duration": 8, "steps": 40})).await;
        (name, result, reports)
    });
    for (name, result, reports) in futures::future::join_all(runs).await {
        let text = result
            .unwrap_or_else(|f| panic!("{name}: {f:?}"))
            .to_string();
        assert!(
            text.contains("Long running operation completed"),
            "{name}: {text}"
        );
        assert!(reports >= 2, "{name}: {reports} progress reports");
    }
    for (_, sources) in servers {
        sources.shutdown().await;
    }
}

/// A call that reports no progress is cut at its idle timeout, and the
/// server is sent `notifications/cancelled` for it (stdio: the server's
/// stdin is recorded by `tee`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_without_progress_is_cut_at_its_idle_timeout_and_cancelled() {
    let Some(everything) = server("server-everything") else {
        return;
    };
    let (dir, wire, toml) = teed_everything(&everything);
    let teed = sources(&toml);
    let (_child, http) = everything_http("web", &everything);
    let web = sources(&http);
    for (name, sources) in [("teed", &teed), ("web", &web)] {
        // One step of 120 s: no progress report before the 1 s idle timeout.
        let spec = spec(sources, name, LONG, policy(1_000, Some(600_000))).await;
        let (result, _) = call(sources, &spec, json!({"duration": 120, "steps": 1})).await;
        let failure = result.expect_err("cut");
        assert_eq!(failure.kind, ToolErrorKind::Timeout, "{name}: {failure:?}");
        assert!(
            failure
                .message
                .contains("no progress report for 1000 ms (its timeout_ms, an idle timeout)"),
            "{name}: {}",
            failure.message
        );
    }
    let (request, _) = call_and_cancel_on_wire(&wire).await;
    assert!(
        request["params"]["_meta"]["progressToken"].is_number()
            || request["params"]["_meta"]["progressToken"].is_string(),
        "the request carries a progress token: {request}"
    );
    teed.shutdown().await;
    web.shutdown().await;
    std::fs::remove_dir_all(&dir).ok();
}

/// `max_total_ms` cuts a call that keeps reporting progress, and the error
/// names that bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_total_ms_cuts_a_call_that_keeps_reporting_progress() {
    let Some(everything) = server("server-everything") else {
        return;
    };
    let (servers, _child) = both_transports(&everything);
    let runs = servers.iter().map(|(name, sources)| async move {
        // 120 s in 600 steps of 200 ms: progress well within the 5 s idle
        // timeout, for longer than the 7 s total.
        let spec = spec(sources, name, LONG, policy(5_000, Some(7_000))).await;
        let (result, reports) = call(sources, &spec, json!({"duration": 120, "steps": 600})).await;
        (name, result, reports)
    });
    for (name, result, reports) in futures::future::join_all(runs).await {
        let failure = result.expect_err("cut");
        assert_eq!(failure.kind, ToolErrorKind::Timeout, "{name}: {failure:?}");
        assert!(
            failure
                .message
                .contains("reached its max_total_ms of 7000 ms"),
            "{name}: {}",
            failure.message
        );
        assert!(reports >= 1, "{name}: it reported progress");
    }
    for (_, sources) in servers {
        sources.shutdown().await;
    }
}

/// The frozen spec records the resolved total, and a tenant's total below
/// the (default) timeout is refused naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_step_records_max_total_ms() {
    let state = state_dir();
    let sources = sources(&odd_stdio("odd", &state, &[]));
    let spec = spec(&sources, "odd", "echo", ToolPolicy::default()).await;
    assert!(
        matches!(
            spec.source,
            Some(glia_proto::ToolSource::Mcp {
                max_total_ms: Some(300_000),
                ..
            })
        ),
        "10 × the default 30 s: {:?}",
        spec.source
    );
    let mut config = RunConfig::default();
    config.mcp.push(allow("odd", &["echo"]));
    config.tool_policy.insert(
        "echo".into(),
        ToolPolicy {
            max_total_ms: Some(1_000),
            ..ToolPolicy::default()
        },
    );
    match sources.offered(&config).await {
        Err(glia_agent::tool_sources::OfferError::Invalid(why)) => assert!(
            why.starts_with(
                "tool_policy.echo.max_total_ms: 1000 ms is below the tool's timeout_ms of 30000 ms"
            ),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    sources.shutdown().await;
    std::fs::remove_dir_all(&state).ok();
}

/// A call that never ends is cut at its timeout, over both transports, and
/// the server receives `notifications/cancelled` for it (the fixture logs it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_never_ends_is_cut_and_cancelled() {
    let (stdio_state, http_state) = (state_dir(), state_dir());
    let url = odd_mcp::spawn_http(&http_state, odd_mcp::ListMode::Normal).await;
    let cases = [
        (sources(&odd_stdio("odd", &stdio_state, &[])), &stdio_state),
        (sources(&http_entry("odd", &url)), &http_state),
    ];
    for (sources, state) in &cases {
        let spec = spec(sources, "odd", "hang", policy(1_000, None)).await;
        let (result, _) = call(sources, &spec, json!({})).await;
        let failure = result.expect_err("cut");
        assert_eq!(failure.kind, ToolErrorKind::Timeout, "{failure:?}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !odd_mcp::requests(state)
            .iter()
            .any(|r| r.starts_with("cancelled "))
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no cancellation reached the server: {:?}",
                odd_mcp::requests(state)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        sources.shutdown().await;
    }
    for dir in [stdio_state, http_state] {
        std::fs::remove_dir_all(dir).ok();
    }
}

/// A stdio server that dies by a signal during a call: the error names the
/// signal and shows the last lines of its stderr; the server is started
/// again and the next call works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_by_a_signal_is_named_with_its_stderr() {
    let state = state_dir();
    let sources = sources(&odd_stdio("odd", &state, &[]));
    for (signal, name) in [(9, "SIGKILL"), (15, "SIGTERM")] {
        let die = spec(&sources, "odd", "die", ToolPolicy::default()).await;
        let (result, _) = call(&sources, &die, json!({"signal": signal})).await;
        let failure = result.expect_err("died");
        assert_eq!(failure.kind, ToolErrorKind::OutcomeUnknown, "{failure:?}");
        let message = &failure.message;
        assert!(
            message.contains(&format!("was killed by signal {signal} ({name})")),
            "{message}"
        );
        assert!(
            message.contains("odd-mcp: fatal: raising signal"),
            "the last stderr lines: {message}"
        );
        assert!(!message.contains("gracefully"), "{message}");
        assert!(
            message.contains("a forged marker") && !message.contains(glia_proto::marker::PREFIX),
            "the server's stderr reaches the model with glia's markers neutralised: {message}"
        );
        let echo = spec(&sources, "odd", "echo", ToolPolicy::default()).await;
        let (result, _) = call(&sources, &echo, json!({})).await;
        assert_eq!(result.expect("restarted").to_string(), "called as echo");
    }
    sources.shutdown().await;
    std::fs::remove_dir_all(&state).ok();
}

/// Captured log lines, for the noise test.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

/// A server that prints banners and noise on stdout still works; the noise
/// is logged at `warn`, at most once per 10 s per server, its first 80
/// bytes only. A current-thread runtime: every task logs on this thread,
/// under this test's subscriber.
#[tokio::test]
async fn stdout_noise_is_left_out_and_logged_briefly() {
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let state = state_dir();
    let sources = sources(&odd_stdio("noisy", &state, &["--banner"]));
    let echo = spec(&sources, "noisy", "echo", ToolPolicy::default()).await;
    let noisy = spec(&sources, "noisy", "noisy", ToolPolicy::default()).await;
    for _ in 0..3 {
        let (result, _) = call(&sources, &noisy, json!({})).await;
        assert_eq!(result.expect("answered").to_string(), "quiet now");
    }
    let (result, _) = call(&sources, &echo, json!({})).await;
    assert_eq!(result.expect("answered").to_string(), "called as echo");
    sources.shutdown().await;
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let noise: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("is not JSON-RPC"))
        .collect();
    // Three banner lines and three noisy calls; the first is logged, and
    // the rest fall within the same 10 s unless the machine is very slow.
    assert!(!noise.is_empty(), "{text}");
    assert!(noise[0].contains("WARN"), "{text}");
    // The message ends with the head; the fields follow it.
    let head = |line: &str| {
        let rest = line.split("(first 80 bytes): ").nth(1).expect("the head");
        rest.split(" server=noisy")
            .next()
            .expect("the fields")
            .to_owned()
    };
    assert_eq!(head(noise[0]), "odd-mcp 0.0.0 starting", "{text}");
    assert!(noise[0].contains("bytes=22 suppressed=0"), "{text}");
    assert!(noise.len() <= 6, "{text}");
    for line in &noise {
        let head = head(line);
        assert!(head.len() <= 80, "{line}");
        assert!(!head.contains(&"=".repeat(81)), "{line}");
    }
    std::fs::remove_dir_all(&state).ok();
}

/// An HTTP session that expires: rmcp starts a new session and sends the
/// call again once; when the new session is refused too, the call did not
/// run and says so in plain words (`unavailable`, safe to call again), and
/// the next call works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_http_session_is_a_call_that_did_not_run() {
    let state = state_dir();
    let url = odd_mcp::spawn_http(&state, odd_mcp::ListMode::Normal).await;
    let sources = sources(&http_entry("web", &url));
    let expire = spec(&sources, "web", "expire_session", ToolPolicy::default()).await;
    let echo = spec(&sources, "web", "echo", ToolPolicy::default()).await;
    // Expired once: rmcp's one re-initialisation gets the call through.
    let (result, _) = call(&sources, &expire, json!({})).await;
    assert_eq!(result.expect("answered").to_string(), "expiring");
    let (result, _) = call(&sources, &echo, json!({})).await;
    assert_eq!(
        result.expect("sent again in a new session").to_string(),
        "called as echo"
    );
    // Expired twice: the new session is refused too.
    let (result, _) = call(&sources, &expire, json!({"sessions": 2})).await;
    assert_eq!(result.expect("answered").to_string(), "expiring");
    let calls = |log: Vec<String>| log.iter().filter(|r| r.starts_with("call echo")).count();
    let before = calls(odd_mcp::requests(&state));
    let (result, _) = call(&sources, &echo, json!({})).await;
    let failure = result.expect_err("not run");
    assert_eq!(failure.kind, ToolErrorKind::Unavailable, "{failure:?}");
    let message = &failure.message;
    assert!(
        message.contains("did not run the call of echo"),
        "{message}"
    );
    assert!(message.contains("404"), "{message}");
    assert!(message.contains("calling it again is safe"), "{message}");
    assert!(
        !message.contains("StreamableHttpError") && !message.contains("is unknown"),
        "{message}"
    );
    assert_eq!(
        calls(odd_mcp::requests(&state)),
        before,
        "the refused call never reached the tool"
    );
    let (result, _) = call(&sources, &echo, json!({})).await;
    assert_eq!(
        result.expect("the next call works").to_string(),
        "called as echo"
    );
    assert_eq!(calls(odd_mcp::requests(&state)), before + 1);
    sources.shutdown().await;
    std::fs::remove_dir_all(&state).ok();
}
