//! What the model sees of MCP results, against real servers: glia's
//! misbehaving fixture `odd-mcp` (`glia_testkit::odd_mcp`, over stdio and
//! streamable HTTP) and `@modelcontextprotocol/server-everything` from npm
//! (skipped loudly when not installed, a failure under `GLIA_TEST_STRICT=1`).
//!
//! - A 5 MiB single-line result enters the conversation cut to the run's
//!   result budget with a marked notice; the `tool.result` event keeps all
//!   of it.
//! - `structuredContent` keeps the server's key order.
//! - A tool's `outputSchema` is recorded in the frozen spec and checked: a
//!   violation (or no `structuredContent`) is an `invalid_output` tool
//!   error naming the path and the rule, or passes under `warn`.
//! - An image goes to a text-only model as a marked placeholder.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use glia_agent::agent::Agent;
use glia_agent::catalogue::Catalogue;
use glia_agent::provider::{ScriptedProvider, ScriptedTurn};
use glia_agent::tool::ToolContext;
use glia_agent::tool_sources::ToolSources;
use glia_proto::content::cut_notice;
use glia_proto::marker::{Insert, classify};
use glia_proto::{
    ContentBlock, DEFAULT_MAX_RESULT_BYTES, EventKind, McpToolSource, Outcome, OutputSchemaCheck,
    ResultBlock, RunConfig, Status, ToolContent, ToolErrorKind, ToolPolicy, ToolSpec,
};
use glia_testkit::odd_mcp::{ListMode, odd_mcp_bin, spawn_http};
use serde_json::json;
use uuid::Uuid;

use crate::common::LiveSink;

/// A fresh state directory for one odd server.
fn state_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("glia-mcp-content-{test}-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The catalogue entry `odd` for `odd-mcp stdio STATE`.
fn odd_stdio(state: &Path) -> String {
    format!(
        "[mcp_servers.odd]\ntransport = \"stdio\"\ncommand = {:?}\nargs = [\"stdio\", {:?}]\n",
        odd_mcp_bin().display().to_string(),
        state.display().to_string()
    )
}

/// The catalogue entry `odd` for an odd server over streamable HTTP at `url`.
fn odd_http(url: &str) -> String {
    format!("[mcp_servers.odd]\ntransport = \"streamable_http\"\nurl = {url:?}\n")
}

fn sources(toml: &str) -> Arc<ToolSources> {
    let catalogue = Catalogue::parse(toml, "<test>").expect("valid catalogue");
    Arc::new(ToolSources::start(catalogue).with_connect_wait(Duration::from_secs(60)))
}

fn config(server: &str, tools: &[&str]) -> RunConfig {
    let mut config = RunConfig::default();
    config.mcp.push(McpToolSource {
        server: server.into(),
        allow: tools.iter().map(|t| (*t).to_owned()).collect(),
    });
    config
}

fn ctx(call_id: &str) -> ToolContext {
    ToolContext {
        run_id: Uuid::now_v7(),
        call_id: call_id.into(),
        idempotency_key: format!("key-{call_id}"),
    }
}

fn spec<'a>(specs: &'a [ToolSpec], name: &str) -> &'a ToolSpec {
    specs.iter().find(|s| s.name == name).unwrap()
}

/// The npm `server-everything` entry script, or `None` (skip).
fn everything() -> Option<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../.ci/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let found = path
        .exists()
        .then(|| path.canonicalize().unwrap().display().to_string());
    glia_testkit::require(
        found,
        format!("the MCP server {}", path.display()),
        "npm ci --prefix .ci/mcp; scripts/test does",
    )
}

/// A 5 MiB single-line result over stdio: the next request (and the one
/// after) carries its first 64 KiB and the marked notice; the event holds
/// all 5 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5_mib_result_is_cut_in_the_conversation_and_whole_in_the_log() {
    let state = state_dir("big");
    let sources = sources(&odd_stdio(&state));
    let bytes = 5 * 1024 * 1024;
    let provider = Arc::new(ScriptedProvider::new(vec![
        ScriptedTurn::call("big", json!({"bytes": bytes})),
        ScriptedTurn::call("echo", json!({})),
        ScriptedTurn::text("exported"),
    ]));
    let agent = Agent::new(provider.clone()).with_tool_sources(sources.clone());
    let mut sink = LiveSink::default();
    let (_, status) = agent
        .run(
            Uuid::now_v7(),
            "export",
            config("odd", &["big", "echo"]),
            &mut sink,
        )
        .await
        .expect("run");
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { .. })),
        "{status:?}"
    );
    let whole = sink
        .log
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::ToolResult { content, .. } => Some(content.clone()),
            _ => None,
        })
        .expect("a tool.result");
    assert_eq!(whole.text_len(), bytes, "the log keeps the whole result");

    let budget = DEFAULT_MAX_RESULT_BYTES as usize;
    let notice = cut_notice(bytes, budget);
    let requests = provider.requests();
    for request in &requests[1..] {
        let (seen, is_error) = crate::common::result_in(request, "call_1");
        assert!(!is_error);
        let ToolContent::Text(text) = &seen else {
            panic!("{seen:?}")
        };
        assert!(
            text.len() <= budget + 2 + notice.len(),
            "{} bytes",
            text.len()
        );
        assert_eq!(&text[..budget], &whole.to_text()[..budget]);
        assert!(text.ends_with(&format!("\n\n{notice}")));
        assert_eq!(classify(&notice), Some(Insert::Cut));
    }
    sources.shutdown().await;
}

/// `structuredContent` reaches the model with the server's key order, over
/// streamable HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_content_keeps_the_servers_key_order() {
    let state = state_dir("structured");
    let url = spawn_http(&state, ListMode::Normal).await;
    let sources = sources(&odd_http(&url));
    let specs = sources
        .offered(&config("odd", &["structured_only"]))
        .await
        .expect("tools listed");
    let out = sources
        .execute(
            spec(&specs, "structured_only"),
            json!({}),
            &ctx("c1"),
            &|_| {},
        )
        .await
        .expect("a result");
    assert_eq!(
        out,
        r#"{"structuredContent":{"zeta":1,"alpha":{"b":2,"a":1},"mid":[3,1,2]}}"#
    );
    sources.shutdown().await;
}

/// The `outputSchema` is frozen with the tool and enforced: a violation and
/// a missing `structuredContent` are `invalid_output` errors naming the
/// path and the rule; under `tool_policy.NAME.output_schema = "warn"` the
/// violating result passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_schema_violations_are_tool_errors_unless_warned() {
    let state = state_dir("schema");
    let sources = sources(&odd_stdio(&state));
    let mut config = config(
        "odd",
        &["conforms", "violates", "missing_structured", "echo"],
    );
    let specs = sources.offered(&config).await.expect("tools listed");
    let count = json!({"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]});
    for name in ["conforms", "violates", "missing_structured"] {
        let output = spec(&specs, name).output_schema.as_ref().expect(name);
        assert_eq!(output.check, OutputSchemaCheck::Enforce, "the default");
        assert_eq!(
            glia_proto::json::sort_keys(&output.schema),
            glia_proto::json::sort_keys(&count),
            "{name}"
        );
    }
    assert_eq!(spec(&specs, "echo").output_schema, None);

    let call = |name: &'static str, specs: Vec<ToolSpec>| {
        let sources = sources.clone();
        async move {
            sources
                .execute(spec(&specs, name), json!({}), &ctx(name), &|_| {})
                .await
        }
    };
    let ok = call("conforms", specs.clone()).await.expect("conforms");
    assert_eq!(ok, r#"{"count":3}"#);
    let violated = call("violates", specs.clone()).await.unwrap_err();
    assert_eq!(violated.kind, ToolErrorKind::InvalidOutput);
    assert_eq!(
        violated.message,
        r#"MCP tool violates answered a result that does not match its outputSchema: at /count: "many" is not of type "integer" (rule /properties/count/type)"#
    );
    let missing = call("missing_structured", specs).await.unwrap_err();
    assert_eq!(missing.kind, ToolErrorKind::InvalidOutput);
    assert!(
        missing.message.contains("it has no structuredContent"),
        "{}",
        missing.message
    );

    config.tool_policy.insert(
        "violates".into(),
        ToolPolicy {
            output_schema: Some(OutputSchemaCheck::Warn),
            ..ToolPolicy::default()
        },
    );
    let specs = sources.offered(&config).await.expect("tools listed");
    assert_eq!(
        spec(&specs, "violates")
            .output_schema
            .as_ref()
            .unwrap()
            .check,
        OutputSchemaCheck::Warn
    );
    let passed = call("violates", specs).await.expect("warned, not refused");
    assert!(passed.to_text().contains("many"), "{passed}");
    sources.shutdown().await;
}

/// The violation reaches the model as a tool error in the loop, and the
/// run goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_sees_an_output_schema_violation_as_a_tool_error() {
    let state = state_dir("loop");
    let url = spawn_http(&state, ListMode::Normal).await;
    let sources = sources(&odd_http(&url));
    let provider = Arc::new(ScriptedProvider::new(vec![
        ScriptedTurn::call("violates", json!({})),
        ScriptedTurn::text("the count tool is broken"),
    ]));
    let agent = Agent::new(provider.clone()).with_tool_sources(sources.clone());
    let mut sink = LiveSink::default();
    let (_, status) = agent
        .run(
            Uuid::now_v7(),
            "count",
            config("odd", &["violates"]),
            &mut sink,
        )
        .await
        .expect("run");
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { .. })),
        "{status:?}"
    );
    let (seen, is_error) = crate::common::result_in(&provider.requests()[1], "call_1");
    assert!(is_error);
    assert!(
        seen.to_text().contains("at /count:")
            && seen.to_text().contains("(rule /properties/count/type)"),
        "{seen}"
    );
    let frozen = sink
        .log
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::StepStart { tools, .. } => Some(tools.clone()),
            _ => None,
        })
        .unwrap();
    assert!(frozen[0].output_schema.is_some(), "recorded in step.start");
    sources.shutdown().await;
}

/// server-everything's `get-structured-content` declares an outputSchema
/// and conforms to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_servers_structured_result_conforms() {
    let Some(everything) = everything() else {
        return;
    };
    let sources = sources(&format!(
        "[mcp_servers.everything]\ntransport = \"stdio\"\ncommand = \"node\"\nargs = [{everything:?}, \"stdio\"]\n"
    ));
    let specs = sources
        .offered(&config("everything", &["get-structured-content"]))
        .await
        .expect("tools listed");
    let weather = spec(&specs, "get-structured-content");
    assert!(weather.output_schema.is_some());
    let out = sources
        .execute(weather, json!({"location": "Chicago"}), &ctx("w"), &|_| {})
        .await
        .expect("conforms");
    assert_eq!(
        out,
        r#"{"temperature":36,"conditions":"Light rain / drizzle","humidity":82}"#
    );
    sources.shutdown().await;
}

/// server-everything's `get-tiny-image` to a text-only model: the request
/// carries a marked placeholder with the type and size (the scripted
/// provider panics on an image), the log keeps the image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_reaches_a_text_only_model_as_a_placeholder() {
    let Some(everything) = everything() else {
        return;
    };
    let sources = sources(&format!(
        "[mcp_servers.everything]\ntransport = \"stdio\"\ncommand = \"node\"\nargs = [{everything:?}, \"stdio\"]\n"
    ));
    let provider = Arc::new(
        ScriptedProvider::new(vec![
            ScriptedTurn::call("get-tiny-image", json!({})),
            ScriptedTurn::text("a logo, I am told"),
        ])
        .text_only(),
    );
    let agent = Agent::new(provider.clone()).with_tool_sources(sources.clone());
    let mut sink = LiveSink::default();
    let (state, status) = agent
        .run(
            Uuid::now_v7(),
            "show me",
            config("everything", &["get-tiny-image"]),
            &mut sink,
        )
        .await
        .expect("run");
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { .. })),
        "{status:?}"
    );
    let logged = sink
        .log
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::ToolResult { content, .. } => Some(content.clone()),
            _ => None,
        })
        .unwrap();
    let image = logged.images().next().expect("the log keeps the image");
    let (seen, _) = crate::common::result_in(&provider.requests()[1], "call_1");
    let ToolContent::Text(text) = &seen else {
        panic!("a text-only request has text only: {seen:?}")
    };
    let placeholder = Insert::ImageOmitted.wrap(&format!(
        "[image not shown: {}; this model does not take images]",
        image.describe()
    ));
    assert!(text.contains(&placeholder), "{text}");
    assert!(
        state
            .messages
            .iter()
            .flat_map(|m| &m.content)
            .any(|b| matches!(
                b,
                ContentBlock::ToolResult { content: ToolContent::Blocks(blocks), .. }
                    if blocks.iter().any(|b| matches!(b, ResultBlock::Image { .. }))
            )),
        "the state keeps the image; only the request leaves it out"
    );
    sources.shutdown().await;
}
