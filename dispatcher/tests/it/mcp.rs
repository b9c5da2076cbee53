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
