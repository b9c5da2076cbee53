//! The MCP client against real MCP servers nobody here wrote, installed
//! from npm by the test set-up (`npm ci --prefix .ci/mcp`, pinned in
//! `.ci/mcp/package-lock.json`): `@modelcontextprotocol/server-everything`
//! over stdio and over streamable HTTP, `@modelcontextprotocol/server-filesystem`
//! over stdio. Without them the tests fail under `GLIA_TEST_STRICT=1` (set
//! by `scripts/test`) and are skipped loudly otherwise
//! (`glia_testkit::require`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use glia_agent::agent::{Agent, EventSink, SinkError};
use glia_agent::catalogue::Catalogue;
use glia_agent::provider::{ScriptedProvider, ScriptedTurn};
use glia_agent::tool::ToolContext;
use glia_agent::tool_sources::{OfferError, ToolSources};
use glia_proto::{
    ContentBlock, Event, EventKind, ImageSource, LiveEvent, McpToolSource, Outcome, ResultBlock,
    Role, RunConfig, RunState, Status, ToolContent, ToolErrorKind, ToolPolicy, ToolSource,
    args_hash,
};
use serde_json::{Value, json};
use uuid::Uuid;

fn ci_mcp() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.ci/mcp/node_modules/@modelcontextprotocol")
}

/// The entry script of an installed server package, or `None` (skip) when
/// it is not installed (a failure under `GLIA_TEST_STRICT=1`).
pub(super) fn server(package: &str) -> Option<String> {
    let path = ci_mcp().join(package).join("dist/index.js");
    let found = path.exists().then(|| {
        path.canonicalize()
            .expect("canonical path")
            .display()
            .to_string()
    });
    glia_testkit::require(
        found,
        format!("the MCP server {}", path.display()),
        "npm ci --prefix .ci/mcp; scripts/test does",
    )
}

pub(super) fn everything_stdio(name: &str, script: &str) -> String {
    // Trusted: these tests check that a trusted server's annotations are believed.
    format!(
        "[mcp_servers.{name}]\ntransport = \"stdio\"\ncommand = \"node\"\nargs = [{script:?}, \"stdio\"]\ntrust = \"trusted\"\n"
    )
}

pub(super) fn sources(toml: &str) -> Arc<ToolSources> {
    let catalogue = Catalogue::parse(toml, "<test>").expect("valid catalogue");
    Arc::new(ToolSources::start(catalogue).with_connect_wait(Duration::from_secs(60)))
}

pub(super) fn ctx(call_id: &str) -> ToolContext {
    ToolContext {
        run_id: Uuid::now_v7(),
        call_id: call_id.into(),
        idempotency_key: format!("key-{call_id}"),
    }
}

pub(super) fn allow(server: &str, tools: &[&str]) -> McpToolSource {
    McpToolSource {
        server: server.into(),
        allow: tools.iter().map(|t| (*t).to_owned()).collect(),
    }
}

/// A catalogue entry for server-everything over stdio named `teed`, behind
/// `tee`, which records the server's stdin: the directory (to remove), the
/// record's path and the entry.
pub(super) fn teed_everything(everything: &str) -> (PathBuf, PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("glia-mcp-{}", Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let wire = dir.join("stdin.jsonl");
    let script = format!(
        "tee {:?} | exec node {:?} stdio",
        wire.display().to_string(),
        everything
    );
    let toml = format!(
        "[mcp_servers.teed]\ntransport = \"stdio\"\ncommand = \"sh\"\nargs = [\"-c\", {script:?}]\n"
    );
    (dir, wire, toml)
}

/// The `tools/call` recorded at `wire` and the `notifications/cancelled`
/// for it (waiting up to 60 s for one), asserting that it names the call.
pub(super) async fn call_and_cancel_on_wire(wire: &std::path::Path) -> (Value, Value) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let text = loop {
        let text = std::fs::read_to_string(wire).unwrap_or_default();
        if text.contains("notifications/cancelled") || tokio::time::Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let messages: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let request = messages
        .iter()
        .find(|m| m["method"] == "tools/call")
        .expect("tools/call on the wire")
        .clone();
    let cancelled = messages
        .iter()
        .find(|m| m["method"] == "notifications/cancelled")
        .expect("notifications/cancelled on the wire")
        .clone();
    assert_eq!(cancelled["params"]["requestId"], request["id"]);
    (request, cancelled)
}

/// A sink that keeps events and live events, and may act on a live event.
/// A hook called with each live event.
type OnLive = Box<dyn Fn(&LiveEvent) + Send + Sync>;

/// Each call's text result, or its error kind and message.
type ToolOutcome = (Option<String>, Option<(ToolErrorKind, String)>);

#[derive(Default)]
struct Recorder {
    events: Vec<Event>,
    live: Arc<Mutex<Vec<LiveEvent>>>,
    on_live: Option<OnLive>,
}

#[glia_agent::async_trait]
impl EventSink for Recorder {
    async fn record(&mut self, event: &Event) -> Result<(), SinkError> {
        self.events.push(event.clone());
        Ok(())
    }
    fn live(&self, event: &LiveEvent) {
        self.live.lock().unwrap().push(event.clone());
        if let Some(f) = &self.on_live {
            f(event);
        }
    }
}

fn agent(sources: &Arc<ToolSources>, turns: Vec<ScriptedTurn>) -> Agent {
    Agent::new(Arc::new(ScriptedProvider::new(turns))).with_tool_sources(sources.clone())
}

fn tool_outcome(events: &[Event]) -> Vec<ToolOutcome> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult { content, .. } => Some((Some(content.to_string()), None)),
            EventKind::ToolError { error, message, .. } => {
                Some((None, Some((*error, message.clone()))))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_list_call_content_kinds_and_progress() {
    let Some(everything) = server("server-everything") else {
        return;
    };
    let sources = sources(&everything_stdio("everything", &everything));
    let mut config = RunConfig::default();
    config.mcp.push(allow(
        "everything",
        &[
            "echo",
            "get-sum",
            "get-tiny-image",
            "get-structured-content",
            "no-such-tool",
        ],
    ));
    match sources.offered(&config).await {
        Err(OfferError::Invalid(why)) => {
            assert!(why.starts_with(r#"mcp[0].allow[4]: MCP server "everything" offers no tool "no-such-tool" (it offers: "#), "{why}");
            assert!(why.contains("get-tiny-image"), "{why}");
        }
        other => panic!("an allowed tool the server lacks must be the run's error, got {other:?}"),
    }
    config.mcp[0] = allow(
        "everything",
        &[
            "echo",
            "get-sum",
            "get-tiny-image",
            "get-structured-content",
            "trigger-long-running-operation",
        ],
    );
    config.tool_policy.insert(
        "get-sum".into(),
        ToolPolicy {
            requires_approval: Some(true),
            ..ToolPolicy::default()
        },
    );
    let specs = sources.offered(&config).await.expect("tools listed");
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "echo",
            "get-sum",
            "get-tiny-image",
            "get-structured-content",
            "trigger-long-running-operation"
        ],
        "allow-list order"
    );
    for spec in &specs {
        let Some(ToolSource::Mcp {
            server,
            tool,
            schema_hash,
            ..
        }) = &spec.source
        else {
            panic!("{} has no MCP source", spec.name)
        };
        assert_eq!(
            (server.as_str(), tool.as_str()),
            ("everything", spec.name.as_str())
        );
        assert_eq!(*schema_hash, args_hash(&spec.input_schema));
        glia_proto::compile_tool_schema(&spec.input_schema).expect("MCP schemas compile");
    }
    let long = specs
        .iter()
        .find(|s| s.name == "trigger-long-running-operation")
        .unwrap();
    assert!(
        long.idempotent,
        "readOnlyHint/idempotentHint make a tool idempotent"
    );
    let sum = specs.iter().find(|s| s.name == "get-sum").unwrap();
    assert!(
        sum.source.as_ref().unwrap().requires_approval(),
        "tool_policy overrides the annotations"
    );

    let quiet = |_: String| {};
    let echo = specs.iter().find(|s| s.name == "echo").unwrap();
    let out = sources
        .execute(echo, json!({"message": "hello"}), &ctx("c1"), &quiet)
        .await
        .expect("echo");
    assert_eq!(out, "Echo: hello");

    // An image: text, image, text blocks, the image as the server sent it.
    let image = specs.iter().find(|s| s.name == "get-tiny-image").unwrap();
    let out = sources
        .execute(image, json!({}), &ctx("c2"), &quiet)
        .await
        .expect("image");
    assert_eq!(
        out,
        ToolContent::Blocks(vec![
            ResultBlock::text("Here's the image you requested:"),
            ResultBlock::Image {
                source: ImageSource::base64("image/png", tiny_image())
            },
            ResultBlock::text("The image above is the MCP logo."),
        ])
    );

    // structuredContent: the server also sends it as a text block (as the
    // spec asks), so that text is the result, not a second copy.
    let weather = specs
        .iter()
        .find(|s| s.name == "get-structured-content")
        .unwrap();
    let out = sources
        .execute(weather, json!({"location": "Chicago"}), &ctx("c3"), &quiet)
        .await
        .expect("structured");
    let ToolContent::Text(text) = &out else {
        panic!("{out:?}")
    };
    assert_eq!(
        serde_json::from_str::<Value>(text).unwrap(),
        json!({"temperature": 36, "conditions": "Light rain / drizzle", "humidity": 82})
    );
    let seen = Mutex::new(Vec::new());
    let record = |m: String| seen.lock().unwrap().push(m);
    let out = sources
        .execute(
            long,
            json!({"duration": 0.3, "steps": 3}),
            &ctx("c4"),
            &record,
        )
        .await
        .expect("long-running operation");
    assert!(
        out.to_text().contains("Long running operation completed"),
        "{out}"
    );
    let seen = seen.lock().unwrap().clone();
    // Reports come in order; the last one races the result (see glia_agent::mcp).
    assert!(
        ["1/3", "2/3", "3/3"].starts_with(&seen.iter().map(String::as_str).collect::<Vec<_>>())
            && seen.len() >= 2,
        "{seen:?}"
    );

    let bad = sources
        .execute(echo, json!({"message": 5}), &ctx("c5"), &quiet)
        .await
        .expect_err("the server refuses bad arguments");
    assert!(
        bad.message.contains("message") || bad.message.to_lowercase().contains("invalid"),
        "{bad:?}"
    );
    sources.shutdown().await;
}

/// The base64 PNG `get-tiny-image` returns, read from the installed
/// server's source, so the test compares with what the server really sends.
fn tiny_image() -> String {
    let source =
        std::fs::read_to_string(ci_mcp().join("server-everything/dist/tools/get-tiny-image.js"))
            .expect("server source");
    let start = source
        .find("MCP_TINY_IMAGE = \"")
        .expect("the image constant")
        + "MCP_TINY_IMAGE = \"".len();
    let len = source[start..].find('"').expect("end of the constant");
    source[start..start + len].to_owned()
}

/// Embedded resources and resource links from a real server: a text
/// resource is a text block headed by its URI, a binary one (not an image)
/// a note naming URI, type and size, a link a text naming URI and name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resources_and_resource_links_become_text() {
    let Some(everything) = server("server-everything") else {
        return;
    };
    let sources = sources(&everything_stdio("everything", &everything));
    let mut config = RunConfig::default();
    config.mcp.push(allow(
        "everything",
        &["get-resource-reference", "get-resource-links"],
    ));
    let specs = sources.offered(&config).await.expect("tools listed");
    let quiet = |_: String| {};
    let reference = specs
        .iter()
        .find(|s| s.name == "get-resource-reference")
        .unwrap();

    let out = sources
        .execute(
            reference,
            json!({"resourceType": "Text", "resourceId": 2}),
            &ctx("r1"),
            &quiet,
        )
        .await
        .expect("text resource");
    let ToolContent::Text(text) = &out else {
        panic!("{out:?}")
    };
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "Returning resource reference for Resource 2:");
    assert_eq!(lines[1], "[resource: demo://resource/dynamic/text/2]");
    assert!(
        lines[2].starts_with("Resource 2: This is a plaintext resource created at "),
        "{text}"
    );
    assert_eq!(
        lines[3],
        "You can access this resource using the URI: demo://resource/dynamic/text/2"
    );

    let out = sources
        .execute(
            reference,
            json!({"resourceType": "Blob", "resourceId": 1}),
            &ctx("r2"),
            &quiet,
        )
        .await
        .expect("blob resource");
    let ToolContent::Text(text) = &out else {
        panic!("{out:?}")
    };
    let note = text.lines().nth(1).unwrap();
    let size = "Resource 1: This is a base64 blob created at ".len();
    assert!(
        note.starts_with("[resource left out: demo://resource/dynamic/blob/1, text/plain, "),
        "{note}"
    );
    assert!(
        note.ends_with(" bytes; binary content the model cannot take]"),
        "{note}"
    );
    let bytes: usize = note
        .split(", ")
        .nth(2)
        .unwrap()
        .trim_end_matches(" bytes; binary content the model cannot take]")
        .parse()
        .unwrap();
    assert!(bytes > size, "the decoded size, timestamp included: {note}");

    let links = specs
        .iter()
        .find(|s| s.name == "get-resource-links")
        .unwrap();
    let out = sources
        .execute(links, json!({"count": 2}), &ctx("r3"), &quiet)
        .await
        .expect("links");
    assert_eq!(
        out,
        "Here are 2 resource links to resources available in this server:\n\
         [resource link: demo://resource/dynamic/blob/1 \"Blob Resource 1\", text/plain: Resource 1: plaintext resource]\n\
         [resource link: demo://resource/dynamic/text/2 \"Text Resource 2\", text/plain: Resource 2: plaintext resource]"
    );
    sources.shutdown().await;
}

/// A run whose model calls `get-tiny-image`: the next model request carries
/// the image inside the tool result (the scripted provider validates it
/// like the API), and the state replayed from the log has it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_model_request_carries_the_image_in_the_tool_result() {
    let Some(everything) = server("server-everything") else {
        return;
    };
    let sources = sources(&everything_stdio("everything", &everything));
    let mut config = RunConfig::default();
    config.mcp.push(allow("everything", &["get-tiny-image"]));
    let provider = Arc::new(ScriptedProvider::new(vec![
        ScriptedTurn::call("get-tiny-image", json!({})),
        ScriptedTurn::text("a logo"),
    ]));
    let agent = Agent::new(provider.clone()).with_tool_sources(sources.clone());
    let mut sink = Recorder::default();
    let (_, status) = agent
        .run(Uuid::now_v7(), "show me", config, &mut sink)
        .await
        .expect("run");
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { ref answer, .. }) if answer == "a logo"),
        "{status:?}"
    );
    let requests = provider.requests();
    assert_eq!(requests.len(), 2);
    let last = requests[1].messages.last().expect("a last message");
    assert_eq!(last.role, Role::User);
    let [
        ContentBlock::ToolResult {
            content: ToolContent::Blocks(blocks),
            is_error: false,
            ..
        },
    ] = last.content.as_slice()
    else {
        panic!("{last:?}")
    };
    assert_eq!(
        blocks[1],
        ResultBlock::Image {
            source: ImageSource::base64("image/png", tiny_image())
        }
    );
    let replayed = RunState::replay(sink.events[0].run_id, &sink.events).expect("replay");
    assert!(
        replayed.messages.iter().any(|m| m == last),
        "the log holds the image"
    );
    sources.shutdown().await;
}

/// The loop: step.start freezes the MCP tools with their source; progress
/// becomes live `tool.progress`; a tool the policy marks gets approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_offers_mcp_tools_and_streams_progress() {
    let Some(everything) = server("server-everything") else {
        return;
    };
    let sources = sources(&everything_stdio("everything", &everything));
    let mut config = RunConfig::default();
    config.mcp.push(allow(
        "everything",
        &["echo", "trigger-long-running-operation"],
    ));
    let turns = vec![
        ScriptedTurn::calls(&[
            ("echo", json!({"message": "hi"})),
            (
                "trigger-long-running-operation",
                json!({"duration": 0.2, "steps": 2}),
            ),
        ]),
        ScriptedTurn::text("done"),
    ];
    let agent = agent(&sources, turns);
    let mut sink = Recorder::default();
    let (_, status) = agent
        .run(Uuid::now_v7(), "go", config, &mut sink)
        .await
        .expect("run");
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { ref answer, .. }) if answer == "done"),
        "{status:?}"
    );
    let frozen = sink.events.iter().find_map(|e| match &e.kind {
        EventKind::StepStart { tools, .. } => Some(tools.clone()),
        _ => None,
    });
    let frozen = frozen.expect("step.start");
    assert!(
        frozen
            .iter()
            .all(|t| matches!(t.source, Some(ToolSource::Mcp { .. }))),
        "{frozen:?}"
    );
    let outcomes = tool_outcome(&sink.events);
    assert_eq!(outcomes[0].0.as_deref(), Some("Echo: hi"));
    assert!(
        outcomes[1]
            .0
            .as_deref()
            .is_some_and(|t| t.contains("completed")),
        "{outcomes:?}"
    );
    let progress: Vec<LiveEvent> = sink
        .live
        .lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e, LiveEvent::ToolProgress { .. }))
        .cloned()
        .collect();
    let call_id = sink.events.iter().find_map(|e| match &e.kind {
        EventKind::ToolCall(c) if c.name == "trigger-long-running-operation" => {
            Some(c.call_id.clone())
        }
        _ => None,
    });
    let all = [
        LiveEvent::ToolProgress {
            call_id: call_id.clone().unwrap(),
            message: "1/2".into(),
        },
        LiveEvent::ToolProgress {
            call_id: call_id.unwrap(),
            message: "2/2".into(),
        },
    ];
    assert!(
        all.starts_with(&progress) && !progress.is_empty(),
        "live tool.progress in order: {progress:?}"
    );
    // The replayed state equals the live one (nothing outside the log).
    let replayed = RunState::replay(sink.events[0].run_id, &sink.events).expect("replay");
    assert_eq!(replayed.status(), status);
    sources.shutdown().await;
}

/// A server killed during a call: the model gets a clear tool error, the
/// run goes on (and completes), and the server is started again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_call_is_a_tool_error_and_is_restarted() {
    let Some(everything) = server("server-everything") else {
        return;
    };
    let sources = sources(&everything_stdio("everything", &everything));
    let mut config = RunConfig::default();
    config.mcp.push(allow(
        "everything",
        &["echo", "trigger-long-running-operation"],
    ));
    let first = {
        let specs = sources.offered(&config).await.expect("listed");
        assert!(!specs.is_empty());
        sources.mcp().pid("everything").expect("a stdio child")
    };
    let turns = vec![
        ScriptedTurn::call(
            "trigger-long-running-operation",
            json!({"duration": 30, "steps": 30}),
        ),
        ScriptedTurn::call("echo", json!({"message": "after"})),
        ScriptedTurn::text("recovered"),
    ];
    let agent = agent(&sources, turns);
    let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let on_live = {
        let killed = killed.clone();
        move |e: &LiveEvent| {
            if matches!(e, LiveEvent::ToolProgress { .. })
                && !killed.swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                let status = std::process::Command::new("kill")
                    .args(["-9", &first.to_string()])
                    .status()
                    .expect("kill");
                assert!(status.success());
            }
        }
    };
    let mut sink = Recorder {
        on_live: Some(Box::new(on_live)),
        ..Recorder::default()
    };
    let (_, status) = agent
        .run(Uuid::now_v7(), "go", config, &mut sink)
        .await
        .expect("run");
    assert!(
        killed.load(std::sync::atomic::Ordering::SeqCst),
        "the server was killed during the call"
    );
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { ref answer, .. }) if answer == "recovered"),
        "{status:?}"
    );
    let outcomes = tool_outcome(&sink.events);
    let (kind, message) = outcomes[0]
        .1
        .clone()
        .expect("the killed call is a tool error");
    assert_eq!(kind, ToolErrorKind::OutcomeUnknown);
    assert!(
        message.contains("MCP server everything stopped")
            && message.contains("was killed by signal 9 (SIGKILL)"),
        "{message}"
    );
    assert_eq!(
        outcomes[1].0.as_deref(),
        Some("Echo: after"),
        "the restarted server answers the next call"
    );
    let second = sources.mcp().pid("everything").expect("restarted");
    assert_ne!(first, second);
    sources.shutdown().await;
}

/// A slow call hits its timeout (tool_policy): a timeout tool error, the run goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_call_hits_its_timeout() {
    let Some(everything) = server("server-everything") else {
        return;
    };
    let sources = sources(&everything_stdio("everything", &everything));
    let mut config = RunConfig::default();
    config
        .mcp
        .push(allow("everything", &["trigger-long-running-operation"]));
    config.tool_policy.insert(
        "trigger-long-running-operation".into(),
        ToolPolicy {
            timeout_ms: Some(300),
            ..ToolPolicy::default()
        },
    );
    let turns = vec![
        ScriptedTurn::call(
            "trigger-long-running-operation",
            json!({"duration": 20, "steps": 2}),
        ),
        ScriptedTurn::text("gave up"),
    ];
    let mut sink = Recorder::default();
    let (_, status) = agent(&sources, turns)
        .run(Uuid::now_v7(), "go", config, &mut sink)
        .await
        .expect("run");
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { .. })),
        "{status:?}"
    );
    let (kind, message) = tool_outcome(&sink.events)[0].1.clone().expect("a timeout");
    assert_eq!(kind, ToolErrorKind::Timeout);
    assert!(
        message.contains("no progress report for 300 ms"),
        "{message}"
    );
    sources.shutdown().await;
}

/// Abandoning a call sends `notifications/cancelled` for it, and the call
/// carried its idempotency key in `_meta`: the server's stdin is recorded
/// by `tee` in front of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_sends_notifications_cancelled_with_the_key_in_meta() {
    let Some(everything) = server("server-everything") else {
        return;
    };
    let (dir, wire, toml) = teed_everything(&everything);
    let sources = sources(&toml);
    let mut config = RunConfig::default();
    config
        .mcp
        .push(allow("teed", &["trigger-long-running-operation"]));
    let specs = sources.offered(&config).await.expect("listed");
    let notify = tokio::sync::Notify::new();
    let progressed = |_: String| notify.notify_one();
    let call_ctx = ctx("cancel-me");
    let call = sources.execute(
        &specs[0],
        json!({"duration": 30, "steps": 30}),
        &call_ctx,
        &progressed,
    );
    tokio::select! {
        _ = call => panic!("the call finished"),
        () = notify.notified() => {}
    }
    // The call's future is dropped: the client tells the server.
    let (request, _) = call_and_cancel_on_wire(&wire).await;
    assert_eq!(
        request["params"]["_meta"][glia_agent::mcp::IDEMPOTENCY_META_KEY],
        "key-cancel-me"
    );
    sources.shutdown().await;
    std::fs::remove_dir_all(&dir).ok();
}

/// server-everything over streamable HTTP: list, call, progress; the
/// header's secret (from the environment) never reaches an event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_http_list_call_progress() {
    let Some(everything) = server("server-everything") else {
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = tokio::process::Command::new("node")
        .args([everything.as_str(), "streamableHttp"])
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("node");
    let secret = format!("Bearer s3cret-{}", Uuid::now_v7().simple());
    // SAFETY: set before any thread of this test reads the environment; the
    // variable's name is unique to this test.
    unsafe { std::env::set_var("GLIA_TEST_MCP_AUTH", &secret) };
    let toml = format!(
        "[mcp_servers.web]\ntransport = \"streamable_http\"\nurl = \"http://127.0.0.1:{port}/mcp\"\nheaders = {{ Authorization = \"GLIA_TEST_MCP_AUTH\" }}\ntrust = \"trusted\"\n"
    );
    let sources = sources(&toml);
    let mut config = RunConfig::default();
    config
        .mcp
        .push(allow("web", &["echo", "trigger-long-running-operation"]));
    let turns = vec![
        ScriptedTurn::calls(&[
            ("echo", json!({"message": "over http"})),
            (
                "trigger-long-running-operation",
                json!({"duration": 0.2, "steps": 2}),
            ),
        ]),
        ScriptedTurn::text("ok"),
    ];
    let mut sink = Recorder::default();
    let (_, status) = agent(&sources, turns)
        .run(Uuid::now_v7(), "go", config, &mut sink)
        .await
        .expect("run");
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { .. })),
        "{status:?}"
    );
    let outcomes = tool_outcome(&sink.events);
    assert_eq!(
        outcomes[0].0.as_deref(),
        Some("Echo: over http"),
        "{outcomes:?}"
    );
    assert!(
        outcomes[1]
            .0
            .as_deref()
            .is_some_and(|t| t.contains("completed")),
        "{outcomes:?}"
    );
    let progress = sink
        .live
        .lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e, LiveEvent::ToolProgress { .. }))
        .count();
    assert!(progress >= 1, "progress over streamable HTTP");
    let events = serde_json::to_string(&sink.events).unwrap();
    assert!(
        !events.contains(&secret) && !events.contains("s3cret"),
        "a secret reached an event"
    );
    assert!(
        !format!("{:?}", sources.catalogue()).contains("s3cret"),
        "the catalogue holds names, not values"
    );
    sources.shutdown().await;
    child.kill().await.ok();
}

/// server-filesystem over stdio: read, list, and its write tool (annotated
/// destructive) needs approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_server_over_stdio() {
    let Some(files) = server("server-filesystem") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("glia-fs-{}", Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let dir = dir.canonicalize().unwrap();
    std::fs::write(dir.join("notes.txt"), "first line\nsecond line\n").unwrap();
    let toml = format!(
        "[mcp_servers.files]\ntransport = \"stdio\"\ncommand = \"node\"\nargs = [{files:?}, {:?}]\n",
        dir.display().to_string()
    );
    let sources = sources(&toml);
    let mut config = RunConfig::default();
    config.mcp.push(allow(
        "files",
        &["read_text_file", "list_directory", "write_file"],
    ));
    let path = dir.join("notes.txt").display().to_string();
    let turns = vec![
        ScriptedTurn::calls(&[
            ("read_text_file", json!({"path": path})),
            ("list_directory", json!({"path": dir.display().to_string()})),
        ]),
        ScriptedTurn::call(
            "write_file",
            json!({"path": dir.join("new.txt").display().to_string(), "content": "x"}),
        ),
        ScriptedTurn::text("read"),
    ];
    let mut sink = Recorder::default();
    let (state, status) = agent(&sources, turns)
        .run(Uuid::now_v7(), "go", config, &mut sink)
        .await
        .expect("run");
    let outcomes = tool_outcome(&sink.events);
    assert!(
        outcomes[0]
            .0
            .as_deref()
            .is_some_and(|t| t.contains("second line")),
        "{outcomes:?}"
    );
    assert!(
        outcomes[1]
            .0
            .as_deref()
            .is_some_and(|t| t.contains("notes.txt")),
        "{outcomes:?}"
    );
    // write_file is annotated destructiveHint: the run waits for a person.
    assert!(
        matches!(
            status,
            Status::Parked(glia_proto::PullPoint::AwaitingApproval { .. })
        ),
        "{status:?}"
    );
    assert!(sink.events.iter().any(
        |e| matches!(&e.kind, EventKind::ApprovalRequested { tool, .. } if tool == "write_file")
    ));
    assert!(
        !dir.join("new.txt").exists(),
        "nothing written before approval"
    );
    drop(state);
    sources.shutdown().await;
    std::fs::remove_dir_all(&dir).ok();
}

/// A server that cannot start: listing fails with a clear error (the
/// loop leaves the run runnable), and a call is a tool error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_down_is_a_clear_error() {
    let toml =
        "[mcp_servers.broken]\ntransport = \"stdio\"\ncommand = \"/nonexistent/mcp-server\"\n";
    let catalogue = Catalogue::parse(toml, "<test>").unwrap();
    let sources =
        Arc::new(ToolSources::start(catalogue).with_connect_wait(Duration::from_millis(300)));
    let mut config = RunConfig::default();
    config.mcp.push(allow("broken", &["x"]));
    let mut sink = Recorder::default();
    let agent = agent(&sources, vec![ScriptedTurn::text("never")]);
    let err = agent
        .run(Uuid::now_v7(), "go", config, &mut sink)
        .await
        .expect_err("the step's tools cannot be listed");
    let text = err.to_string();
    assert!(
        matches!(err, glia_agent::AgentError::ToolSource { .. }),
        "{err:?}"
    );
    assert!(
        text.contains("MCP server broken is not available") && text.contains("could not start"),
        "{text}"
    );
    assert!(
        !sink
            .events
            .iter()
            .any(|e| matches!(e.kind, EventKind::StepStart { .. })),
        "no step started without its tools"
    );
    sources.shutdown().await;
}

/// `render` over MCP results no server here sends (audio, image blobs,
/// images a model cannot take, an error with an image, unknown content
/// kinds), written as MCP 2025-06-18 `CallToolResult` JSON.
#[test]
fn render_maps_every_mcp_content_kind() {
    use glia_agent::mcp::render;
    let result = |v: Value| {
        serde_json::from_value::<rmcp::model::CallToolResult>(v).expect("a CallToolResult")
    };
    let png = "iVBORw0KGgo=";
    let out = render(result(json!({"content": [
        {"type": "audio", "data": "UklGRg==", "mimeType": "audio/wav"},
        {"type": "image", "data": png, "mimeType": "image/jpeg"},
        {"type": "image", "data": "PHN2Zy8+", "mimeType": "image/svg+xml"},
        {"type": "resource", "resource": {"uri": "file:///shot.png", "mimeType": "image/png", "blob": png}},
        {"type": "resource", "resource": {"uri": "file:///shot.bmp", "mimeType": "image/bmp", "blob": "Qk0="}},
        {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "hello"}},
        {"type": "resource_link", "uri": "file:///b.bin", "name": "b", "size": 9},
        {"type": "text", "text": "{\"n\":1}"}
    ], "structuredContent": {"n": 2}})))
    .expect("a result");
    let image = ResultBlock::Image {
        source: ImageSource::base64("image/png", png),
    };
    assert_eq!(
        out,
        ToolContent::Blocks(vec![
            ResultBlock::text(
                "[audio left out: audio/wav, 4 bytes; the model cannot take audio in a tool result]"
            ),
            image.clone(),
            ResultBlock::text(
                "[image left out: image/svg+xml, 6 bytes; image/svg+xml is not a type a model accepts (PNG, JPEG, GIF or WebP)]"
            ),
            image,
            ResultBlock::text(
                "[image left out: image/bmp, 2 bytes; image/bmp is not a type a model accepts (PNG, JPEG, GIF or WebP)] (resource file:///shot.bmp)"
            ),
            ResultBlock::text("[resource: file:///a.txt]\nhello"),
            ResultBlock::text("[resource link: file:///b.bin \"b\", 9 bytes]"),
            ResultBlock::text("{\"n\":1}"),
            ResultBlock::text("{\"structuredContent\":{\"n\":2}}"),
        ])
    );

    // An error is a tool failure whose text names the image it carried.
    let failed = render(result(json!({"isError": true, "content": [{"type": "text", "text": "no"}, {"type": "image", "data": png, "mimeType": "image/png"}]})))
        .expect_err("isError");
    assert_eq!(failed.message, "no\n[image: image/png, 8 bytes]");
    assert_eq!(failed.kind, ToolErrorKind::Failed);

    // An image over the limit is a note, its data never copied.
    let big = "A".repeat(glia_proto::MAX_IMAGE_BASE64_LEN + 4);
    let out = render(result(
        json!({"content": [{"type": "image", "data": big, "mimeType": "image/png"}]}),
    ))
    .expect("a result");
    assert_eq!(
        out,
        "[image left out: image/png, 3932163 bytes; its base64 data is 5242884 bytes, over the 5242880 bytes a model request may carry]"
    );
}
