//! glia as an MCP server (`docs/mcp.md`, "glia as an MCP server") on a
//! real fleet: `glia dispatcher` and `glia worker` processes on Postgres,
//! RabbitMQ and Redis, reached at `/mcp` by real MCP clients over
//! streamable HTTP with bearer tokens:
//!
//! - [`rmcp_client`]: the `rmcp` client lists the agents, calls one that
//!   completes, one that parks for approval (then decides it through the
//!   approval tool and sees the run finish), cancels one mid-run with
//!   `notifications/cancelled`, retries a call without a second run, and
//!   is refused without a token, with another tenant's and with malformed
//!   arguments;
//! - [`sdk_client`]: the official TypeScript SDK client
//!   (`@modelcontextprotocol/sdk`, pinned in `.ci/mcp`) lists the agents and
//!   calls one from a node script the test runs.

mod rmcp_client;
mod sdk_client;

use glia_testkit::fleet::{Fleet, http_as};
use serde_json::{Value, json};

/// `tok-acme`: tenant `acme`, submit and approve; `tok-other`: tenant
/// `other`, submit and approve; `tok-agents`: tenant `acme`, agents only;
/// `tok-submit`: tenant `acme`, submit only.
const TOKENS: &str = "tok-acme:acme:submit,approve:ana tok-other:other:submit,approve tok-agents:acme:agents tok-submit:acme:submit";

/// The fleet's scripts: `answer` answers at once; `refund` looks order A1
/// up and refunds it (the agent requires approval of the refund); `slow`
/// sleeps 60 s (the built-in timer) before it answers.
fn scripts() -> Vec<(&'static str, Value)> {
    vec![
        ("answer", json!([{"text": "Done: the goal is met."}])),
        (
            "refund",
            json!([
                {"text": "Looking up A1.", "tool_calls": [{"name": "get_order", "input": {"order_id": "A1"}}]},
                {"text": "Refunding it.", "tool_calls": [{"name": "refund_order", "input": {"order_id": "A1"}}]},
                {"text": "Order A1 is refunded."}
            ]),
        ),
        (
            "slow",
            json!([
                {"text": "Waiting.", "tool_calls": [{"name": "sleep", "input": {"seconds": 60}}]},
                {"text": "Waited."}
            ]),
        ),
    ]
}

/// A started fleet (one dispatcher, one worker, [`TOKENS`]) with the agents
/// `answerer`, `refunder` and `sleeper` of tenant `acme`.
fn mcp_fleet() -> Fleet {
    let mut fleet = Fleet::new(&scripts());
    fleet.extra_env.push(("GLIA_TOKENS".into(), TOKENS.into()));
    fleet.api.token = Some("tok-acme".into());
    fleet.start_dispatcher();
    fleet.start_worker(5000);
    for def in [
        json!({"name": "answerer", "description": "Answers at once.", "model": "script:answer"}),
        json!({"name": "refunder", "description": "Refunds order A1 once a person approves.", "model": "script:refund",
               "tools": ["get_order", "refund_order"],
               "policies": [{"tool": "refund_order", "action": {"kind": "require_approval"}}]}),
        json!({"name": "sleeper", "description": "Sleeps a minute.", "model": "script:slow", "builtin_tools": ["sleep"]}),
    ] {
        let name = def["name"].as_str().unwrap().to_owned();
        let (status, body) = http_as(
            "PUT",
            &format!("{}/v1/agents/{name}", fleet.server),
            Some(def),
            Some("tok-agents"),
        )
        .unwrap();
        assert!(
            status == 200 || status == 201,
            "register {name}: {status} {body}"
        );
    }
    fleet
}
