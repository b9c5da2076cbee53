//! `/mcp`, glia as an MCP server, at the HTTP level (the MCP conversation
//! itself is tested with real clients on a fleet: `tests/fleet/mcp`): the
//! API's tokens (401 like `/v1`), the host guard with and without tokens,
//! and the body limit.

use crate::common;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use glia_dispatcher::Auth;
use serde_json::{Value, json};
use tower::ServiceExt;

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
           "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})
}

/// `POST /mcp` with `body`, `Host: host` and `token`; only status and
/// headers are read (an answer may be an event stream).
async fn post_mcp(
    h: &common::H,
    host: &str,
    token: Option<&str>,
    body: String,
) -> (StatusCode, axum::http::HeaderMap) {
    let mut b = Request::builder()
        .method(Method::POST)
        .uri("/mcp")
        .header(header::HOST, host)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream");
    if let Some(t) = token {
        b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let res = h
        .router
        .clone()
        .oneshot(b.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    (res.status(), res.headers().clone())
}

#[tokio::test]
async fn mcp_takes_the_api_tokens() {
    let h = common::harness();
    let reply = common::send(
        &h.router,
        common::request(Method::POST, "/mcp", None, Some(&initialize())),
    )
    .await;
    assert_eq!(
        (reply.status, reply.code()),
        (StatusCode::UNAUTHORIZED, "missing_token")
    );
    assert_eq!(reply.headers[header::WWW_AUTHENTICATE], "Bearer");
    let reply = common::send(
        &h.router,
        common::request(Method::POST, "/mcp", Some("nope"), Some(&initialize())),
    )
    .await;
    assert_eq!(
        (reply.status, reply.code()),
        (StatusCode::UNAUTHORIZED, "invalid_token")
    );
    // With tokens, any host is served: the token is the guard.
    let (status, headers) = post_mcp(
        &h,
        "glia.example.com",
        Some(common::SUB_A),
        initialize().to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        headers.contains_key("mcp-session-id"),
        "a session: {headers:?}"
    );
    // Bodies are bounded like the API's.
    let big = format!(
        "{{\"pad\": \"{}\"}}",
        "x".repeat(h.app.limits.max_body_bytes + 1)
    );
    let (status, _) = post_mcp(&h, "glia.example.com", Some(common::SUB_A), big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn without_tokens_only_loopback_hosts_are_served() {
    let h = common::harness_with(Auth::open());
    let (status, _) = post_mcp(&h, "127.0.0.1:8080", None, initialize().to_string()).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the open loopback dispatcher serves MCP without a token"
    );
    let (status, _) = post_mcp(&h, "rebound.example.com", None, initialize().to_string()).await;
    assert!(
        status.is_client_error(),
        "a foreign Host (DNS rebinding) is refused: {status}"
    );
}

/// A request to `/mcp` by `token` in session `session` (none: no
/// `Mcp-Session-Id`), with extra headers; the whole answer is read (only
/// for answers that end).
async fn mcp(
    h: &common::H,
    method: Method,
    token: &str,
    session: Option<&str>,
    extra: &[(&str, &str)],
    body: Option<Value>,
) -> common::Reply {
    let mut b = Request::builder()
        .method(method)
        .uri("/mcp")
        .header(header::HOST, "glia.example.com")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18");
    if let Some(s) = session {
        b = b.header("mcp-session-id", s);
    }
    for (k, v) in extra {
        b = b.header(*k, *v);
    }
    let req = match body {
        Some(v) => b
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(v.to_string()))
            .unwrap(),
        None => b.body(Body::empty()).unwrap(),
    };
    tokio::time::timeout(
        std::time::Duration::from_secs(120),
        common::send(&h.router, req),
    )
    .await
    .expect("an MCP answer within 120 s")
}

/// A session opened by `token` (initialize, then `notifications/initialized`).
async fn open_session(h: &common::H, token: &str) -> String {
    let init = mcp(h, Method::POST, token, None, &[], Some(initialize())).await;
    assert_eq!(init.status, StatusCode::OK, "{}", init.text);
    let id = init.headers["mcp-session-id"].to_str().unwrap().to_owned();
    let done = mcp(
        h,
        Method::POST,
        token,
        Some(&id),
        &[],
        Some(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
    )
    .await;
    assert_eq!(done.status, StatusCode::ACCEPTED, "{}", done.text);
    id
}

/// The JSON-RPC message with `id` in an answer (an SSE stream or JSON).
fn rpc_answer(reply: &common::Reply, id: u64) -> Value {
    reply
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .chain(std::iter::once(reply.body.clone()))
        .find(|m| m["id"] == json!(id))
        .unwrap_or_else(|| panic!("no answer to {id}: {}", reply.text))
}

fn list_tools(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"})
}

#[tokio::test]
async fn a_session_answers_only_the_principal_that_opened_it() {
    let h = common::harness();
    let a = open_session(&h, common::SUB_A).await;
    let not_found = |r: &common::Reply, what: &str| {
        assert_eq!(
            r.status,
            StatusCode::NOT_FOUND,
            "{what} by another token: {}",
            r.text
        );
    };
    // Another token (another tenant, and the same tenant's approver) gets
    // what an unknown session gets, for every method.
    for other in [common::SUB_B, common::APP_A] {
        let r = mcp(&h, Method::POST, other, Some(&a), &[], Some(list_tools(2))).await;
        not_found(&r, "tools/list");
        let unknown = mcp(
            &h,
            Method::POST,
            other,
            Some("no-such-session"),
            &[],
            Some(list_tools(2)),
        )
        .await;
        assert_eq!(
            (unknown.status, &unknown.text),
            (r.status, &r.text),
            "not yours reads as not there"
        );
        let r = mcp(&h, Method::GET, other, Some(&a), &[], None).await;
        not_found(&r, "GET");
        let r = mcp(
            &h,
            Method::GET,
            other,
            Some(&a),
            &[("last-event-id", "0/0")],
            None,
        )
        .await;
        not_found(&r, "a resume");
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}});
        let r = mcp(&h, Method::POST, other, Some(&a), &[], Some(cancel)).await;
        not_found(&r, "notifications/cancelled");
        let r = mcp(&h, Method::DELETE, other, Some(&a), &[], None).await;
        not_found(&r, "DELETE");
    }
    // The owner's session lives on and answers it.
    let r = mcp(
        &h,
        Method::POST,
        common::SUB_A,
        Some(&a),
        &[],
        Some(list_tools(4)),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        rpc_answer(&r, 4)["result"]["tools"].is_array(),
        "{}",
        r.text
    );
    // Its owner closes it; then it is gone for the owner too.
    let r = mcp(&h, Method::DELETE, common::SUB_A, Some(&a), &[], None).await;
    assert!(r.status.is_success(), "DELETE by the owner: {}", r.text);
    let r = mcp(
        &h,
        Method::POST,
        common::SUB_A,
        Some(&a),
        &[],
        Some(list_tools(5)),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
}

#[tokio::test]
async fn sessions_are_capped_per_principal_and_in_total() {
    let h = common::harness();
    let mut limits = h.app.limits.clone();
    limits.mcp_sessions_per_principal = 2;
    limits.mcp_sessions = 3;
    let h = common::H {
        router: glia_dispatcher::router(h.app.clone().with_limits(limits)),
        ..h
    };
    let a1 = open_session(&h, common::SUB_A).await;
    let _a2 = open_session(&h, common::SUB_A).await;
    let refused = |token: &'static str, status: StatusCode, what: &'static str| {
        let h = &h;
        async move {
            let r = mcp(h, Method::POST, token, None, &[], Some(initialize())).await;
            assert_eq!(
                (r.status, r.code()),
                (status, "too_many_mcp_sessions"),
                "{what}"
            );
        }
    };
    refused(
        common::SUB_A,
        StatusCode::TOO_MANY_REQUESTS,
        "a third session of one token",
    )
    .await;
    let _b1 = open_session(&h, common::SUB_B).await;
    refused(
        common::SUB_B,
        StatusCode::SERVICE_UNAVAILABLE,
        "a fourth session in all",
    )
    .await;
    let metrics = common::send(
        &h.router,
        common::request(Method::GET, "/metrics", None, None),
    )
    .await;
    assert!(
        metrics.text.contains("glia_dispatcher_mcp_sessions 3"),
        "{}",
        metrics.text
    );
    // A closed session frees its slot.
    let r = mcp(&h, Method::DELETE, common::SUB_A, Some(&a1), &[], None).await;
    assert!(r.status.is_success(), "{}", r.text);
    open_session(&h, common::SUB_A).await;
}

#[tokio::test]
async fn a_cancel_before_its_call_keeps_the_call_from_starting_a_run() {
    const TOKEN: &str = "tok-agents-a";
    let h = common::harness_with(
        Auth::from_tokens([(
            TOKEN.to_owned(),
            glia_dispatcher::Principal {
                tenant: "a".into(),
                scopes: vec![
                    glia_dispatcher::Scope::Submit,
                    glia_dispatcher::Scope::Agents,
                ],
                name: None,
            },
        )])
        .unwrap(),
    );
    let agent = json!({"name": "helper", "description": "Helps", "model": "claude-sonnet-4-5", "system": "You help."});
    let put = common::send(
        &h.router,
        common::request(Method::PUT, "/v1/agents/helper", Some(TOKEN), Some(&agent)),
    )
    .await;
    assert!(put.status.is_success(), "{}", put.text);
    let s = open_session(&h, TOKEN).await;
    // rmcp runs a request and a cancel notification as separate tasks: the
    // cancel may be handled first.
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7, "reason": "changed my mind"}});
    let r = mcp(&h, Method::POST, TOKEN, Some(&s), &[], Some(cancel)).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "helper", "arguments": {"goal": "hi"}, "_meta": {"glia/wait_ms": 0}}});
    let r = mcp(&h, Method::POST, TOKEN, Some(&s), &[], Some(call)).await;
    let answer = rpc_answer(&r, 7);
    assert_eq!(answer["error"]["data"]["code"], "cancelled", "{answer}");
    let runs = common::get(&h, "/v1/runs", TOKEN).await;
    assert_eq!(
        runs.body["runs"],
        json!([]),
        "no run started: {}",
        runs.text
    );
    // The next call (another id) starts its run; its `_meta` wait takes a
    // whole number written as a float.
    let call = json!({"jsonrpc": "2.0", "id": 8, "method": "tools/call",
        "params": {"name": "helper", "arguments": {"goal": "hi"}, "_meta": {"glia/wait_ms": 0.0}}});
    let r = mcp(&h, Method::POST, TOKEN, Some(&s), &[], Some(call)).await;
    let answer = rpc_answer(&r, 8);
    assert_eq!(
        answer["result"]["structuredContent"]["status"], "running",
        "{answer}"
    );
    let bad = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": "helper", "arguments": {"goal": "hi"}, "_meta": {"glia/wait_ms": 1.5}}});
    let r = mcp(&h, Method::POST, TOKEN, Some(&s), &[], Some(bad)).await;
    let answer = rpc_answer(&r, 9);
    assert_eq!(
        answer["error"]["message"], "_meta.glia/wait_ms: must be a whole number of ms",
        "{answer}"
    );
}
