//! Admission against the operator's catalogue: a run naming an MCP server,
//! an HTTP tool origin or a provider the catalogue lacks is refused with 422
//! naming the field, and nothing is stored.

use crate::common;

use std::sync::Arc;

use axum::http::StatusCode;
use common::*;
use glia_agent::catalogue::Catalogue;
use glia_backends::{RunFilter, RunLog};
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
    h.app = h
        .app
        .clone()
        .with_admission(Arc::new(move |config| catalogue.admit(config)));
    h.router = glia_dispatcher::router(h.app.clone());
    h
}

#[tokio::test]
async fn unknown_servers_hosts_and_providers_are_refused_naming_the_field() {
    let h = with_catalogue();
    let http_tool = |url: &str| json!({"name": "lookup", "description": "Look up.", "input_schema": {"type": "object"}, "url": url});
    let cases = [
        (
            json!({"mcp": [{"server": "files", "allow": ["read_text_file"]}, {"server": "shell", "allow": ["run"]}]}),
            "config.mcp[1].server",
        ),
        (
            json!({"http_tools": [http_tool("https://evil.example.net/x")]}),
            "config.http_tools[0].url",
        ),
        (json!({"provider": "elsewhere"}), "config.provider"),
        (
            json!({"mcp": [{"server": "files", "allow": []}]}),
            "config.mcp[0].allow",
        ),
        (
            json!({"mcp": [{"server": "files", "allow": ["read_text_file"], "command": "rm -rf /"}]}),
            "config.mcp[0]",
        ),
    ];
    for (config, field) in cases {
        let reply = post(
            &h,
            "/v1/runs",
            SUB_A,
            json!({"goal": "g", "config": config}),
        )
        .await;
        assert_eq!(
            reply.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{field}: {}",
            reply.text
        );
        assert!(
            reply.body["error"]["field"]
                .as_str()
                .is_some_and(|f| f.starts_with(field)),
            "{field}: {}",
            reply.text
        );
    }
    assert!(
        h.log
            .list_runs(&RunFilter::default())
            .await
            .unwrap()
            .is_empty(),
        "nothing stored"
    );

    let ok = json!({"mcp": [{"server": "files", "allow": ["read_text_file"]}], "http_tools": [http_tool("https://orders.example.com/lookup")]});
    let reply = post(&h, "/v1/runs", SUB_A, json!({"goal": "g", "config": ok})).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
}

/// Every tool name a run config writes resolves to a tool it is offered,
/// exactly, or the run is refused (422 naming the field, with the nearest
/// name); the operator's allow and deny lists of a server's tools are
/// enforced at admission.
#[tokio::test]
async fn tool_names_resolve_exactly_or_the_run_is_refused() {
    let toml = format!(
        "{CATALOGUE}\n[mcp_servers.env]\ntransport = \"stdio\"\ncommand = \"npx\"\ntools_allow = [\"search\"]\ntools_deny = [\"get_env\"]\n"
    );
    let mut h = harness();
    let catalogue = Catalogue::parse(&toml, "fleet.toml").unwrap();
    h.app = h
        .app
        .clone()
        .with_admission(Arc::new(move |config| catalogue.admit(config)));
    h.router = glia_dispatcher::router(h.app.clone());
    let credit = json!({"name": "issue_credit", "description": "Credit.", "input_schema": {"type": "object"}, "url": "https://orders.example.com/credit"});
    let approval = json!({"requires_approval": true});
    let cases = [
        (
            json!({"http_tools": [credit], "tool_policy": {"issue-credit": approval}}),
            "config.tool_policy.issue-credit",
            "did you mean \"issue_credit\"?",
        ),
        (
            json!({"http_tools": [credit], "policies": [{"tool": "Issue_Credit", "action": {"kind": "require_approval"}}]}),
            "config.policies[0].tool",
            "did you mean \"issue_credit\"?",
        ),
        (
            json!({"tools": ["add"], "policies": [{"tool": "refund", "action": {"kind": "require_approval"}}]}),
            "config.policies[0].tool",
            "not a tool this run is offered",
        ),
        (
            json!({"tools": ["add"], "tool_policy": {"ad": approval}}),
            "config.tool_policy.ad",
            "did you mean \"add\"?",
        ),
        (
            json!({"mcp": [{"server": "env", "allow": ["search", "get_env"]}]}),
            "config.mcp[0].allow[1]",
            "tools_deny",
        ),
        (
            json!({"mcp": [{"server": "env", "allow": ["fetch"]}]}),
            "config.mcp[0].allow[0]",
            "tools_allow",
        ),
        (
            json!({"mcp": [{"server": "files", "allow": ["read_text_file"]}], "tool_policy": {"Read_Text_File": approval}}),
            "config.tool_policy.Read_Text_File",
            "did you mean \"read_text_file\"?",
        ),
    ];
    for (config, field, reason) in cases {
        let reply = post(
            &h,
            "/v1/runs",
            SUB_A,
            json!({"goal": "g", "config": config}),
        )
        .await;
        assert_eq!(
            reply.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{field}: {}",
            reply.text
        );
        assert_eq!(reply.body["error"]["field"], field, "{}", reply.text);
        assert!(
            reply.body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(reason)),
            "{field}: {}",
            reply.text
        );
    }
    assert!(
        h.log
            .list_runs(&RunFilter::default())
            .await
            .unwrap()
            .is_empty(),
        "nothing stored"
    );
    // The same names, exact, are admitted.
    let ok = json!({"http_tools": [credit], "tool_policy": {"issue_credit": approval}, "mcp": [{"server": "env", "allow": ["search"]}],
                    "policies": [{"tool": "search", "action": {"kind": "require_approval"}}]});
    let reply = post(&h, "/v1/runs", SUB_A, json!({"goal": "g", "config": ok})).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
}
