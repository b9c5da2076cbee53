//! The agent registry through the dispatcher, on each event log: the
//! in-memory twin, SQLite (the single node) and Postgres (the fleet).
//! Registering is idempotent per content, versions are immutable and per
//! tenant, a run started from an agent records the resolved version and
//! hash, and bad definitions are refused naming the field with nothing
//! stored.

use crate::common;

use std::sync::Arc;

use axum::Router;
use axum::http::{Method, StatusCode};
use glia_backends::EventLog;
use glia_backends::memory::{MemoryLedger, MemoryLog, MemoryQueue};
use glia_backends::sqlite::{SqliteLog, SqliteOptions};
use glia_backends::testkit::TestDb;
use glia_dispatcher::{App, Auth, Principal, Scope};
use glia_proto::EventKind;
use serde_json::{Value, json};
use uuid::Uuid;

use common::{Reply, request, send};

const AGENTS_A: &str = "tok-agents-a";
const SUB_A: &str = "tok-sub-a";
const SUB_B: &str = "tok-sub-b";
const ADMIN_B: &str = "tok-admin-b";

fn router(log: Arc<dyn EventLog>) -> Router {
    let p = |t: &str, s: &[Scope]| Principal {
        tenant: t.into(),
        scopes: s.to_vec(),
        name: None,
    };
    let auth = Auth::from_tokens([
        (AGENTS_A.to_owned(), p("a", &[Scope::Agents])),
        (SUB_A.to_owned(), p("a", &[Scope::Submit])),
        (SUB_B.to_owned(), p("b", &[Scope::Submit])),
        (ADMIN_B.to_owned(), p("b", &[Scope::Admin])),
    ])
    .unwrap();
    glia_dispatcher::router(App::new(
        log,
        Arc::new(MemoryQueue::default()),
        Arc::new(MemoryLedger::default()),
        auth,
    ))
}

async fn put(r: &Router, token: &str, name: &str, body: &Value) -> Reply {
    send(
        r,
        request(
            Method::PUT,
            &format!("/v1/agents/{name}"),
            Some(token),
            Some(body),
        ),
    )
    .await
}

async fn get(r: &Router, token: &str, uri: &str) -> Reply {
    send(r, request(Method::GET, uri, Some(token), None)).await
}

fn support() -> Value {
    json!({
        "name": "support", "description": "Order questions", "model": "claude-sonnet-4-5", "system": "You help with orders.",
        "tools": ["get_order"], "conversational": true, "budget": {"max_turns": 12},
        "guardrails": {"input": [{"name": "no-cards", "deny": "\\b\\d{16}\\b", "reason": "card numbers are not accepted"}], "max_output_chars": 2000},
        "compaction": {"strategy": "drop_oldest", "max_tokens": 20000}
    })
}

fn with(mut v: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let target = v.pointer_mut(parent).unwrap();
    match target {
        Value::Array(items) => items[key.parse::<usize>().unwrap()] = value,
        other => {
            other[key] = value;
        }
    }
    v
}

async fn start_config(r: &Router, token: &str, run_id: &str) -> glia_proto::RunConfig {
    let events = get(r, token, &format!("/v1/runs/{run_id}/events")).await;
    let first: glia_proto::Event =
        serde_json::from_value(events.body["events"][0].clone()).unwrap();
    match first.kind {
        EventKind::SessionStart { config, .. } => config,
        other => panic!("first event is {other:?}"),
    }
}

/// The whole registry contract through the API on `log`.
async fn registry_contract(log: Arc<dyn EventLog>) {
    let r = router(log.clone());
    let created = put(&r, AGENTS_A, "support", &support()).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
    assert_eq!(created.body["version"], 1);
    let hash = created.body["content_hash"].as_str().unwrap().to_owned();
    assert!(
        hash.starts_with("sha256:") && hash.len() == 7 + 64,
        "{hash}"
    );

    let again = put(&r, AGENTS_A, "support", &support()).await;
    assert_eq!(
        (again.status, again.body["version"].clone()),
        (StatusCode::OK, json!(1)),
        "the same content is the same version: {}",
        again.text
    );
    let spelled = with(
        with(support(), "/planner", json!("single")),
        "/external_tools",
        json!([]),
    );
    let same = put(&r, AGENTS_A, "support", &spelled).await;
    assert_eq!(
        (same.status, same.body["content_hash"].as_str()),
        (StatusCode::OK, Some(hash.as_str())),
        "defaults written out change nothing"
    );

    let v2 = put(
        &r,
        AGENTS_A,
        "support",
        &with(support(), "/model", json!("claude-haiku-4-5")),
    )
    .await;
    assert_eq!(
        (v2.status, v2.body["version"].clone()),
        (StatusCode::CREATED, json!(2))
    );

    // Reads: the latest by name, each version as registered, per tenant.
    let list = get(&r, SUB_A, "/v1/agents").await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.text);
    assert_eq!(list.body["agents"].as_array().unwrap().len(), 1);
    assert_eq!(list.body["agents"][0]["version"], 2);
    assert_eq!(
        get(&r, SUB_A, "/v1/agents/support").await.body["definition"]["model"],
        "claude-haiku-4-5"
    );
    let v1 = get(&r, SUB_A, "/v1/agents/support/versions/1").await;
    assert_eq!(
        (
            v1.body["definition"]["model"].clone(),
            v1.body["content_hash"].clone()
        ),
        (json!("claude-sonnet-4-5"), json!(hash))
    );
    assert_eq!(
        get(&r, SUB_A, "/v1/agents/support/versions/3").await.code(),
        "agent_not_found"
    );
    assert_eq!(
        get(&r, SUB_B, "/v1/agents/support").await.code(),
        "agent_not_found",
        "another tenant's agents are not visible"
    );
    assert!(
        get(&r, SUB_B, "/v1/agents").await.body["agents"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    // Writing needs `agents` (or `admin`, for its own tenant).
    assert_eq!(
        put(&r, SUB_A, "support", &support()).await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        put(&r, ADMIN_B, "support", &support()).await.status,
        StatusCode::CREATED
    );

    // Bad definitions: 422 naming the field; nothing stored.
    let cases: Vec<(Value, &str)> = vec![
        (
            with(support(), "/compactor", json!({"strategy": "drop_oldest"})),
            "compactor",
        ),
        (with(support(), "/command", json!("/bin/sh")), "command"),
        (
            with(support(), "/guardrails/input/0/deny", json!("(unclosed")),
            "guardrails.input[0].deny",
        ),
        (
            with(
                support(),
                "/guardrails/output",
                json!([{"name": "x", "deny": "a", "url": "http://x"}]),
            ),
            "guardrails.output[0].url",
        ),
        (
            with(
                support(),
                "/output_schema",
                json!({"type": "object", "properties": {"a": {"type": "nope"}}}),
            ),
            "output_schema.properties.a.type",
        ),
        (
            with(support(), "/output_schema", json!({"type": "string"})),
            "output_schema.type",
        ),
        (
            with(support(), "/compaction/threshold", json!(5)),
            "compaction.threshold",
        ),
        (
            with(support(), "/budget/max_turns", json!("many")),
            "budget.max_turns",
        ),
        (
            with(
                support(),
                "/external_tools",
                json!([{"name": "t", "description": "", "input_schema": {"type": "object"}, "timeout": 5}]),
            ),
            "external_tools[0].timeout",
        ),
        (
            with(
                support(),
                "/policies",
                json!([{"tool": "get_order", "args": "[", "action": {"kind": "allow"}}]),
            ),
            "policies[0].args",
        ),
        (with(support(), "/name", json!("other")), "name"),
        (
            with(support(), "/tools", json!(["get_order", "get_order"])),
            "tools[1]",
        ),
    ];
    for (body, field) in cases {
        let reply = put(&r, AGENTS_A, "support", &body).await;
        assert_eq!(
            reply.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{field}: {}",
            reply.text
        );
        assert_eq!(reply.body["error"]["field"], field, "{}", reply.text);
    }
    assert_eq!(
        get(&r, SUB_A, "/v1/agents/support").await.body["version"],
        2,
        "nothing stored"
    );
    assert!(
        log.get_agent("a", "support", Some(3))
            .await
            .unwrap()
            .is_none()
    );

    // Runs from an agent record the resolved version and hash.
    let run = send(
        &r,
        request(
            Method::POST,
            "/v1/runs",
            Some(SUB_A),
            Some(&json!({"goal": "where is A1?", "agent": "support@1"})),
        ),
    )
    .await;
    assert_eq!(run.status, StatusCode::CREATED, "{}", run.text);
    let config = start_config(&r, SUB_A, run.body["run_id"].as_str().unwrap()).await;
    let stamp = config.agent.clone().expect("session.start names the agent");
    assert_eq!(
        (
            stamp.name.as_str(),
            stamp.version,
            stamp.content_hash.as_str()
        ),
        ("support", 1, hash.as_str())
    );
    assert_eq!(
        (
            config.model.as_str(),
            config.tools.clone(),
            config.conversational
        ),
        (
            "claude-sonnet-4-5",
            Some(vec!["get_order".to_owned()]),
            true
        )
    );
    assert_eq!(config.guardrails.input[0].name, "no-cards");
    let latest = send(
        &r,
        request(
            Method::POST,
            "/v1/runs",
            Some(SUB_A),
            Some(&json!({"goal": "g", "agent": "support"})),
        ),
    )
    .await;
    let latest_id = latest.body["run_id"].as_str().unwrap().to_owned();
    assert_eq!(
        start_config(&r, SUB_A, &latest_id)
            .await
            .agent
            .unwrap()
            .version,
        2
    );
    // A later version changes nothing for a run already started.
    put(
        &r,
        AGENTS_A,
        "support",
        &with(support(), "/system", json!("v3")),
    )
    .await;
    assert_eq!(
        start_config(&r, SUB_A, &latest_id).await.model,
        "claude-haiku-4-5"
    );

    for (body, status, field) in [
        (
            json!({"goal": "g", "agent": "support@9"}),
            StatusCode::NOT_FOUND,
            Value::Null,
        ),
        (
            json!({"goal": "g", "agent": "nobody"}),
            StatusCode::NOT_FOUND,
            Value::Null,
        ),
        (
            json!({"goal": "g", "agent": "support@0"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            json!("agent"),
        ),
        (
            json!({"goal": "g", "agent": "support", "config": {"model": "x"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            json!("config"),
        ),
        (
            json!({"goal": "g", "config": {"agent": {"name": "support", "version": 1, "content_hash": hash}}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            json!("config.agent"),
        ),
        (
            json!({"goal": "g", "config": {"compactor": {"max_tokens": 5}}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            json!("config.compactor"),
        ),
        (
            json!({"goal": "g", "config": {"budget": {"max_turn": 5}}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            json!("config.budget.max_turn"),
        ),
        (
            json!({"goal": "g", "config": {"guardrails": {"input": [{"name": "n", "deny": "("}]}}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            json!("config.guardrails.input[0].deny"),
        ),
    ] {
        let reply = send(
            &r,
            request(Method::POST, "/v1/runs", Some(SUB_B), Some(&body)),
        )
        .await;
        assert_eq!(reply.status, status, "{body}: {}", reply.text);
        assert_eq!(reply.body["error"]["field"], field, "{}", reply.text);
    }
    let b_support = send(
        &r,
        request(
            Method::POST,
            "/v1/runs",
            Some(SUB_B),
            Some(&json!({"goal": "g", "agent": "support"})),
        ),
    )
    .await;
    assert_eq!(
        b_support.status,
        StatusCode::CREATED,
        "tenant b's own agent: {}",
        b_support.text
    );
}

#[tokio::test]
async fn registry_on_the_memory_log() {
    registry_contract(Arc::new(MemoryLog::default())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_on_sqlite() {
    let dir = std::env::temp_dir().join(format!("glia-agents-{}", Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = SqliteLog::open(dir.join("glia.db"), SqliteOptions::default())
        .await
        .unwrap();
    registry_contract(Arc::new(log)).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn registry_on_postgres() {
    let db = TestDb::new().await;
    registry_contract(Arc::new(db.log().await)).await;
}

/// `glia agents apply` (PUT /v1/agents/NAME) runs the admission a run
/// started from the definition would get: a catalogue-forbidden HTTP tool
/// URL, an MCP tool the operator does not allow and a policy naming a tool
/// the definition does not offer are refused at apply, naming the field,
/// with nothing stored.
#[tokio::test]
async fn apply_refuses_what_admission_would_refuse() {
    let catalogue = glia_agent::catalogue::Catalogue::parse(
        "[http]\nallowed_origins = [\"https://orders.example.com\"]\n\n[mcp_servers.files]\ntransport = \"stdio\"\ncommand = \"npx\"\ntools_deny = [\"get_env\"]\n",
        "fleet.toml",
    )
    .unwrap();
    let p = |t: &str, s: &[Scope]| Principal {
        tenant: t.into(),
        scopes: s.to_vec(),
        name: None,
    };
    let auth = Auth::from_tokens([(AGENTS_A.to_owned(), p("a", &[Scope::Agents]))]).unwrap();
    let app = App::new(
        Arc::new(MemoryLog::default()),
        Arc::new(MemoryQueue::default()),
        Arc::new(MemoryLedger::default()),
        auth,
    )
    .with_admission(Arc::new(move |config| catalogue.admit(config)));
    let r = glia_dispatcher::router(app);
    let http_tool = |url: &str| json!({"name": "issue_credit", "description": "Credit.", "input_schema": {"type": "object"}, "url": url});
    let cases = [
        (
            json!({"http_tools": [http_tool("https://evil.example.net/credit")]}),
            "http_tools[0].url",
            "not an origin this fleet's catalogue allows",
        ),
        (
            json!({"mcp": [{"server": "files", "allow": ["read", "get_env"]}]}),
            "mcp[0].allow[1]",
            "tools_deny",
        ),
        (
            json!({"http_tools": [http_tool("https://orders.example.com/credit")], "tool_policy": {"issue-credit": {"requires_approval": true}}}),
            "tool_policy.issue-credit",
            "did you mean \"issue_credit\"?",
        ),
        (
            json!({"policies": [{"tool": "refund", "action": {"kind": "require_approval"}}]}),
            "policies[0].tool",
            "not a tool this run is offered",
        ),
    ];
    for (patch, field, reason) in cases {
        let mut def = support();
        for (k, v) in patch.as_object().unwrap() {
            def[k] = v.clone();
        }
        let reply = put(&r, AGENTS_A, "support", &def).await;
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
    assert_eq!(
        get(&r, AGENTS_A, "/v1/agents").await.body["agents"],
        json!([]),
        "nothing stored"
    );
    let mut ok = support();
    ok["http_tools"] = json!([http_tool("https://orders.example.com/credit")]);
    ok["tools"] = json!(["get_order"]);
    ok["tool_policy"] = json!({"issue_credit": {"requires_approval": true}});
    let reply = put(&r, AGENTS_A, "support", &ok).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
}
