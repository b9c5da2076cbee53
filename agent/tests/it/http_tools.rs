//! HTTP tools against a local axum server: the Idempotency-Key arrives,
//! non-2xx and non-JSON answers and oversized bodies are tool errors, and
//! only idempotent tools are retried. Also the catalogue: unknown keys and
//! admission errors name the field.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use glia_agent::agent::Agent;
use glia_agent::catalogue::Catalogue;
use glia_agent::http_tool::{HttpCall, HttpTools};
use glia_agent::provider::{ScriptedProvider, ScriptedTurn};
use glia_agent::tool_sources::ToolSources;
use glia_proto::{EventKind, HttpTool, McpToolSource, Outcome, RunConfig, Status, ToolErrorKind};
use serde_json::{Value, json};
use uuid::Uuid;

/// Per route: the attempts seen (their Idempotency-Key headers).
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<BTreeMap<String, Vec<String>>>>);

impl Seen {
    fn keys(&self, route: &str) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .get(route)
            .cloned()
            .unwrap_or_default()
    }
}

async fn handle(
    State(seen): State<Seen>,
    Path(route): Path<String>,
    headers: HeaderMap,
    body: String,
) -> axum::response::Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let attempt = {
        let mut seen = seen.0.lock().unwrap();
        let keys = seen.entry(route.clone()).or_default();
        keys.push(key.clone());
        keys.len()
    };
    match route.as_str() {
        "ok" => (
            StatusCode::OK,
            [("content-type", "application/json")],
            json!({"key": key, "echo": serde_json::from_str::<Value>(&body).unwrap()}).to_string(),
        )
            .into_response(),
        "down" => (StatusCode::SERVICE_UNAVAILABLE, "try later").into_response(),
        "flaky" if attempt == 1 => (StatusCode::BAD_GATEWAY, "once").into_response(),
        "flaky" => (
            StatusCode::OK,
            [("content-type", "application/json")],
            r#"{"ok":true}"#,
        )
            .into_response(),
        "refused" => (
            StatusCode::UNPROCESSABLE_ENTITY,
            r#"{"error":"order 7 is closed"}"#,
        )
            .into_response(),
        "text" => (StatusCode::OK, "plain words").into_response(),
        "big" => (
            StatusCode::OK,
            [("content-type", "application/json")],
            format!("\"{}\"", "x".repeat(4096)),
        )
            .into_response(),
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn server() -> (String, Seen) {
    let seen = Seen::default();
    let app = Router::new()
        .route("/{route}", post(handle))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, seen)
}

fn call<'a>(url: &'a str, input: &'a Value, idempotent: bool) -> HttpCall<'a> {
    HttpCall {
        tool: "t",
        url,
        input,
        idempotency_key: "run:1:call_1",
        idempotent,
        timeout: Duration::from_secs(20),
        max_response_bytes: 1024,
    }
}

#[tokio::test]
async fn http_tool_answers_and_failures() {
    let (base, seen) = server().await;
    let tools = HttpTools::new();
    let input = json!({"order": 7});

    let out = tools
        .call(call(&format!("{base}/ok"), &input, false))
        .await
        .expect("2xx JSON");
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        out,
        json!({"key": "run:1:call_1", "echo": {"order": 7}}),
        "the body is the arguments; the key is sent"
    );

    let e = tools
        .call(call(&format!("{base}/refused"), &input, true))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ToolErrorKind::Failed);
    assert!(
        e.message.contains("422") && e.message.contains("order 7 is closed"),
        "{e:?}"
    );
    assert_eq!(seen.keys("refused").len(), 1, "a 4xx is not retried");

    let e = tools
        .call(call(&format!("{base}/text"), &input, false))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ToolErrorKind::InvalidOutput);
    assert!(e.message.contains("not JSON"), "{e:?}");

    let e = tools
        .call(call(&format!("{base}/big"), &input, false))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ToolErrorKind::InvalidOutput);
    assert!(e.message.contains("more than 1024 bytes"), "{e:?}");

    // Not idempotent: one attempt only, whatever the status.
    let e = tools
        .call(call(&format!("{base}/down"), &input, false))
        .await
        .unwrap_err();
    assert!(e.message.contains("503"), "{e:?}");
    assert_eq!(
        seen.keys("down").len(),
        1,
        "a non-idempotent tool is never retried"
    );

    // Idempotent: retried with the same key until it answers.
    let out = tools
        .call(call(&format!("{base}/flaky"), &input, true))
        .await
        .expect("retried");
    assert_eq!(out, r#"{"ok":true}"#);
    assert_eq!(
        seen.keys("flaky"),
        ["run:1:call_1", "run:1:call_1"],
        "retried once, same Idempotency-Key"
    );

    // Idempotent, always down: retried, then the error.
    let e = tools
        .call(call(&format!("{base}/down2"), &input, true))
        .await
        .unwrap_err();
    assert!(e.message.contains("404"), "a 404 is not transient: {e:?}");
    assert_eq!(seen.keys("down2").len(), 1);

    // Nothing listening: a transport error, retried only when idempotent,
    // and the timeout bounds the whole call.
    let dead = format!(
        "http://127.0.0.1:{}/x",
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    );
    let e = tools
        .call(HttpCall {
            timeout: Duration::from_millis(700),
            ..call(&dead, &input, true)
        })
        .await
        .unwrap_err();
    assert!(
        matches!(e.kind, ToolErrorKind::Timeout | ToolErrorKind::Unavailable),
        "{e:?}"
    );
}

/// Through the loop: the HTTP tool is offered with its source, called with
/// the run's idempotency key, and its answer is the result.
#[tokio::test]
async fn the_loop_runs_http_tools_within_the_catalogue() {
    let (base, seen) = server().await;
    let catalogue =
        Catalogue::parse(&format!("[http]\nallowed_origins = [{base:?}]\n"), "<test>").unwrap();
    let sources = Arc::new(ToolSources::start(catalogue));
    let mut config = RunConfig::default();
    config.http_tools.push(HttpTool {
        name: "lookup".into(),
        description: "Look an order up.".into(),
        input_schema: json!({"type": "object", "properties": {"order": {"type": "integer"}}, "required": ["order"]}),
        url: format!("{base}/ok"),
        idempotent: true,
        timeout_ms: 10_000,
        max_response_bytes: 4096,
    });
    let agent = Agent::new(Arc::new(ScriptedProvider::new(vec![
        ScriptedTurn::call("lookup", json!({"order": 7})),
        ScriptedTurn::text("found"),
    ])))
    .with_tool_sources(sources.clone());
    let run_id = Uuid::now_v7();
    let mut log = Vec::new();
    let (_, status) = agent
        .run(run_id, "find order 7", config.clone(), &mut log)
        .await
        .expect("run");
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { .. })),
        "{status:?}"
    );
    let key = log.iter().find_map(|e| match &e.kind {
        EventKind::ToolCall(c) => Some(c.idempotency_key.clone()),
        _ => None,
    });
    assert_eq!(
        seen.keys("ok"),
        [key.unwrap()],
        "the call's idempotency key is the header"
    );
    let result = log.iter().find_map(|e| match &e.kind {
        EventKind::ToolResult { content, .. } => Some(content.clone()),
        _ => None,
    });
    assert!(result.unwrap().to_text().contains(r#""order":7"#));

    // An origin the catalogue does not allow: refused before the run starts.
    config.http_tools[0].url = "http://203.0.113.9/steal".into();
    let err = agent
        .run(Uuid::now_v7(), "x", config, &mut Vec::new())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("http_tools[0].url"), "{err}");
}

#[test]
fn catalogue_errors_name_the_key() {
    let e = Catalogue::parse(
        "[mcp_servers.files]\ntransport = \"stdio\"\ncomand = \"npx\"\n",
        "fleet.toml",
    )
    .unwrap_err();
    assert_eq!(e.path, "mcp_servers.files.comand");
    assert!(e.reason.contains("unknown field `comand`"), "{e}");
    assert!(
        e.to_string()
            .starts_with("fleet.toml: mcp_servers.files.comand: unknown field"),
        "{e}"
    );

    let e = Catalogue::parse("[providers.claude]\nkind = \"anthropic\"\nbase_url = \"https://api.anthropic.com\"\napi_key_env = \"K\"\nsecret = \"x\"\n", "f")
        .unwrap_err();
    assert!(e.reason.contains("unknown field `secret`"), "{e}");

    let e = Catalogue::parse("[mcp_servers.files]\ntransport = \"stdio\"\n", "f").unwrap_err();
    assert_eq!(e.path, "mcp_servers.files.command");

    let e = Catalogue::parse("[mcp_servers.web]\ntransport = \"streamable_http\"\nurl = \"http://h/mcp\"\nheaders = { Authorization = \"Bearer abc\" }\n", "f")
        .unwrap_err();
    assert_eq!(
        e.path, "mcp_servers.web.headers.Authorization",
        "a header names a variable, never holds a value: {e}"
    );

    let e = Catalogue::parse(
        "[http]\nallowed_origins = [\"https://a.example/path\"]\n",
        "f",
    )
    .unwrap_err();
    assert_eq!(e.path, "http.allowed_origins[0]");

    let e = Catalogue::parse("[other]\n", "f").unwrap_err();
    assert!(e.reason.contains("unknown field `other`"), "{e}");

    let e = Catalogue::parse("[mcp_servers.x]\ntransport = \"stdio\"\ncommand = \"a\"\nenv = { TOKEN = \"GLIA_TEST_UNSET_VARIABLE_XYZ\" }\n", "f")
        .unwrap()
        .check_environment()
        .unwrap_err();
    assert_eq!(e.0, "mcp_servers.x.env.TOKEN");
}

#[test]
fn admission_names_the_field() {
    let catalogue =
        Catalogue::parse("[mcp_servers.files]\ntransport = \"stdio\"\ncommand = \"npx\"\n[http]\nallowed_origins = [\"https://orders.example.com\"]\n", "f")
            .unwrap();
    let mut config = RunConfig::default();
    config.mcp.push(McpToolSource {
        server: "files".into(),
        allow: vec!["read_text_file".into()],
    });
    catalogue.admit(&config).expect("known server");
    config.mcp.push(McpToolSource {
        server: "shell".into(),
        allow: vec!["run".into()],
    });
    assert_eq!(catalogue.admit(&config).unwrap_err().field, "mcp[1].server");
    config.mcp.pop();
    config.http_tools.push(HttpTool {
        name: "t".into(),
        description: String::new(),
        input_schema: json!({"type": "object"}),
        url: "https://ORDERS.example.com:443/v1".into(),
        idempotent: false,
        timeout_ms: 1,
        max_response_bytes: 1,
    });
    catalogue.admit(&config).expect("same origin, normalised");
    config.http_tools[0].url = "https://orders.example.com.evil.net/v1".into();
    assert_eq!(
        catalogue.admit(&config).unwrap_err().field,
        "http_tools[0].url"
    );
    config.http_tools.clear();
    config.provider = Some("nope".into());
    assert_eq!(catalogue.admit(&config).unwrap_err().field, "provider");
}

/// A tenant's config cannot carry a command or secrets: unknown fields in
/// the tool source types are refused, and an external tool cannot claim a source.
#[test]
fn a_tenant_config_cannot_carry_a_command() {
    let e = serde_json::from_value::<McpToolSource>(
        json!({"server": "x", "allow": ["a"], "command": "rm -rf /"}),
    )
    .unwrap_err();
    assert!(e.to_string().contains("unknown field `command`"), "{e}");
    let e = serde_json::from_value::<HttpTool>(
        json!({"name": "t", "description": "", "input_schema": {"type": "object"}, "url": "https://a", "headers": {"Authorization": "x"}}),
    )
    .unwrap_err();
    assert!(e.to_string().contains("unknown field `headers`"), "{e}");
    let mut config = RunConfig::default();
    config.mcp.push(McpToolSource {
        server: "x".into(),
        allow: vec![],
    });
    assert_eq!(config.validate().unwrap_err().field, "mcp[0].allow");
    config.mcp[0].allow.push("ok".into());
    config.validate().unwrap();
    let mut external = glia_proto::ToolSpec::new("e", "", json!({"type": "object"}));
    external.source = Some(glia_proto::ToolSource::Http {
        url: "https://a".into(),
        max_response_bytes: 1,
        requires_approval: false,
    });
    config.external_tools.push(external);
    assert_eq!(
        config.validate().unwrap_err().field,
        "external_tools[0].source"
    );
}

/// `schemas/catalogue.schema.json` is the catalogue's schema (regenerate:
/// `GLIA_WRITE_SCHEMAS=1 cargo test -p glia-agent --test it http_tools`), and
/// the example catalogue parses.
#[test]
fn catalogue_schema_is_current_and_the_example_parses() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = root.join("schemas/catalogue.schema.json");
    let schema = serde_json::to_string_pretty(&Catalogue::json_schema()).unwrap() + "\n";
    if std::env::var("GLIA_WRITE_SCHEMAS").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &schema).unwrap();
    }
    assert_eq!(
        std::fs::read_to_string(&path).expect("schemas/catalogue.schema.json"),
        schema,
        "regenerate with GLIA_WRITE_SCHEMAS=1"
    );
    let text = std::fs::read_to_string(root.join("examples/catalogue.toml")).unwrap();
    let catalogue = Catalogue::parse(&text, "examples/catalogue.toml").expect("the example parses");
    assert!(catalogue.mcp_servers.contains_key("files"));
    let toml: toml::Value = toml::from_str(&text).unwrap();
    let validator = jsonschema::validator_for(&Catalogue::json_schema()).unwrap();
    assert!(
        validator.is_valid(&serde_json::to_value(toml).unwrap()),
        "the example is valid against the schema"
    );
}
