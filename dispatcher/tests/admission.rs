//! Admission against the operator's catalogue: a run naming an MCP server,
//! an HTTP tool origin or a provider the catalogue lacks is refused with 422
//! naming the field, and nothing is stored.

mod common;

use std::sync::Arc;

use axum::http::StatusCode;
use common::*;
use glia_backends::{EventLog, RunFilter};
use glia_worker::catalogue::Catalogue;
use serde_json::json;

const CATALOGUE: &str = r#"
[mcp_servers.files]
transport = "stdio"
command = "npx"
args = ["@modelcontextprotocol/server-filesystem", "/srv"]

[http]
allowed_origins = ["https://orders.example.com"]
"#;

fn with_catalogue() -> H {
    let mut h = harness();
    let catalogue = Catalogue::parse(CATALOGUE, "fleet.toml").unwrap();
    h.app = h.app.clone().with_admission(Arc::new(move |config| catalogue.admit(config)));
    h.router = glia_dispatcher::router(h.app.clone());
    h
}

#[tokio::test]
async fn unknown_servers_hosts_and_providers_are_refused_naming_the_field() {
    let h = with_catalogue();
    let http_tool = |url: &str| json!({"name": "lookup", "description": "Look up.", "input_schema": {"type": "object"}, "url": url});
    let cases = [
        (json!({"mcp": [{"server": "files", "allow": ["read_text_file"]}, {"server": "shell", "allow": ["run"]}]}), "config.mcp[1].server"),
        (json!({"http_tools": [http_tool("https://evil.example.net/x")]}), "config.http_tools[0].url"),
        (json!({"provider": "elsewhere"}), "config.provider"),
        (json!({"mcp": [{"server": "files", "allow": []}]}), "config.mcp[0].allow"),
        (json!({"mcp": [{"server": "files", "allow": ["read_text_file"], "command": "rm -rf /"}]}), "config.mcp[0]"),
    ];
    for (config, field) in cases {
        let reply = post(&h, "/v1/runs", SUB_A, json!({"goal": "g", "config": config})).await;
        assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{field}: {}", reply.text);
        assert!(reply.body["error"]["field"].as_str().is_some_and(|f| f.starts_with(field)), "{field}: {}", reply.text);
    }
    assert!(h.log.list_runs(&RunFilter::default()).await.unwrap().is_empty(), "nothing stored");

    let ok = json!({"mcp": [{"server": "files", "allow": ["read_text_file"]}], "http_tools": [http_tool("https://orders.example.com/lookup")]});
    let reply = post(&h, "/v1/runs", SUB_A, json!({"goal": "g", "config": ok})).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
}
