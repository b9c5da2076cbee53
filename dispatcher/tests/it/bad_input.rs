//! Bad input to every endpoint answers a 4xx JSON error with a stable code,
//! never a 5xx, and writes nothing (runs, events, inboxes, outbox, queue,
//! cancel flags are compared before and after).

use crate::common;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use common::*;
use serde_json::{Value, json};
use uuid::Uuid;

struct Ep {
    method: Method,
    uri: String,
    /// A valid body (None: the endpoint takes none).
    body: Option<Value>,
    /// Well-formed JSON of the wrong shape.
    wrong: Option<Value>,
    /// A token that lacks the scope.
    denied: Option<&'static str>,
    /// The URI names a run.
    run: bool,
    /// Takes query parameters: a bad one.
    bad_query: Option<&'static str>,
}

fn endpoints(id: Uuid) -> Vec<Ep> {
    let ep = |method: Method,
              uri: String,
              body: Option<Value>,
              wrong: Option<Value>,
              denied: Option<&'static str>,
              run: bool,
              bad_query: Option<&'static str>| Ep {
        method,
        uri,
        body,
        wrong,
        denied,
        run,
        bad_query,
    };
    vec![
        ep(
            Method::POST,
            "/v1/runs".into(),
            Some(json!({"goal": "g"})),
            Some(json!({"goal": 5})),
            Some(APP_A),
            false,
            None,
        ),
        ep(
            Method::GET,
            "/v1/runs".into(),
            None,
            None,
            None,
            false,
            Some("limit=0"),
        ),
        ep(
            Method::GET,
            format!("/v1/runs/{id}"),
            None,
            None,
            None,
            true,
            None,
        ),
        ep(
            Method::GET,
            format!("/v1/runs/{id}/events"),
            None,
            None,
            None,
            true,
            Some("after=-1"),
        ),
        ep(
            Method::GET,
            format!("/v1/runs/{id}/events/stream"),
            None,
            None,
            None,
            true,
            Some("after=x"),
        ),
        ep(
            Method::GET,
            "/v1/approvals".into(),
            None,
            None,
            Some(SUB_A),
            false,
            Some("status=bogus"),
        ),
        ep(
            Method::POST,
            "/v1/approvals".into(),
            Some(json!({"decisions": [{"run_id": id, "call_id": "c1", "decision": "approve"}]})),
            Some(json!({"decisions": "all"})),
            Some(SUB_A),
            false,
            None,
        ),
        ep(
            Method::POST,
            format!("/v1/runs/{id}/approvals/c1"),
            Some(json!({"decision": "approve"})),
            Some(json!({"decision": 1})),
            Some(SUB_A),
            true,
            None,
        ),
        ep(
            Method::POST,
            format!("/v1/runs/{id}/tool-results/ext1"),
            Some(json!({"content": "x"})),
            Some(json!({"content": 1})),
            Some(APP_A),
            true,
            None,
        ),
        ep(
            Method::POST,
            format!("/v1/runs/{id}/messages"),
            Some(json!({"text": "hi"})),
            Some(json!({"text": []})),
            Some(APP_A),
            true,
            None,
        ),
        ep(
            Method::POST,
            format!("/v1/runs/{id}/resume"),
            Some(json!({})),
            Some(json!({"extend": "lots"})),
            None,
            true,
            None,
        ),
        ep(
            Method::POST,
            format!("/v1/runs/{id}/pause"),
            Some(json!({"reason": "r"})),
            Some(json!({"reason": 5})),
            Some(APP_A),
            true,
            None,
        ),
        ep(
            Method::POST,
            format!("/v1/runs/{id}/cancel"),
            Some(json!({"reason": "r"})),
            Some(json!({"reason": 5})),
            Some(APP_A),
            true,
            None,
        ),
        ep(
            Method::POST,
            format!("/v1/runs/{id}/close"),
            None,
            None,
            Some(APP_A),
            true,
            None,
        ),
        // Issue 32, schedules (the id names no schedule: these cases fail
        // before it is looked up).
        ep(
            Method::POST,
            "/v1/schedules".into(),
            Some(json!({"name": "n", "cron": "0 * * * *", "goal": "g"})),
            Some(json!({"name": 5, "cron": "0 * * * *", "goal": "g"})),
            Some(APP_A),
            false,
            None,
        ),
        ep(
            Method::GET,
            "/v1/schedules".into(),
            None,
            None,
            None,
            false,
            Some("limit=0"),
        ),
        ep(
            Method::GET,
            format!("/v1/schedules/{id}"),
            None,
            None,
            None,
            false,
            None,
        ),
        ep(
            Method::PATCH,
            format!("/v1/schedules/{id}"),
            Some(json!({"goal": "g2"})),
            Some(json!({"cron": 5})),
            Some(APP_A),
            false,
            None,
        ),
        ep(
            Method::DELETE,
            format!("/v1/schedules/{id}"),
            None,
            None,
            Some(APP_A),
            false,
            None,
        ),
        ep(
            Method::POST,
            format!("/v1/schedules/{id}/pause"),
            None,
            None,
            Some(APP_A),
            false,
            None,
        ),
        ep(
            Method::POST,
            format!("/v1/schedules/{id}/unpause"),
            None,
            None,
            Some(APP_A),
            false,
            None,
        ),
        ep(
            Method::POST,
            format!("/v1/schedules/{id}/backfill"),
            Some(json!({"from": "2025-01-01T00:00:00Z", "to": "2025-01-01T01:00:00Z"})),
            Some(json!({"from": 5, "to": "2025-01-01T01:00:00Z"})),
            Some(APP_A),
            false,
            None,
        ),
        ep(
            Method::POST,
            "/v1/events".into(),
            Some(json!({"key": "k", "payload": {}})),
            Some(json!({"key": 5, "payload": {}})),
            Some(APP_A),
            false,
            None,
        ),
    ]
}

fn raw(
    method: &Method,
    uri: &str,
    token: Option<&str>,
    content_type: Option<&str>,
    body: impl Into<Body>,
) -> Request<Body> {
    let mut b = Request::builder().method(method.clone()).uri(uri);
    if let Some(t) = token {
        b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    if let Some(ct) = content_type {
        b = b.header(header::CONTENT_TYPE, ct);
    }
    b.body(body.into()).unwrap()
}

fn swap_run(uri: &str, id: Uuid, other: &str) -> String {
    uri.replace(&id.to_string(), other)
}

#[tokio::test]
async fn bad_input_to_every_endpoint_is_a_json_4xx_and_writes_nothing() {
    let h = harness();
    let id = create(&h, SUB_A, json!({"goal": "g"})).await;
    park_for_approval(&*h.log, id, &[("c1", "refund", json!({"amount": 1}))]).await;
    let before = snapshot(&h).await;
    let big = format!("{{\"goal\": \"{}\"}}", "x".repeat((1 << 20) + 10));
    let mut checked = 0;
    for ep in endpoints(id) {
        let mut cases: Vec<(String, Request<Body>, StatusCode, &str)> = Vec::new();
        let good_token = if ep.denied == Some(SUB_A) {
            APP_A
        } else {
            SUB_A
        };
        let body = || ep.body.as_ref().map_or(String::new(), |b| b.to_string());
        let json_ct = ep.body.as_ref().map(|_| "application/json");
        cases.push((
            "missing token".into(),
            raw(&ep.method, &ep.uri, None, json_ct, body()),
            StatusCode::UNAUTHORIZED,
            "missing_token",
        ));
        cases.push((
            "invalid token".into(),
            raw(&ep.method, &ep.uri, Some("nope"), json_ct, body()),
            StatusCode::UNAUTHORIZED,
            "invalid_token",
        ));
        if let Some(t) = ep.denied {
            cases.push((
                "wrong scope".into(),
                raw(&ep.method, &ep.uri, Some(t), json_ct, body()),
                StatusCode::FORBIDDEN,
                "forbidden",
            ));
        }
        if ep.run {
            cases.push((
                "other tenant".into(),
                raw(&ep.method, &ep.uri, Some(SUB_B), json_ct, body()),
                StatusCode::NOT_FOUND,
                "run_not_found",
            ));
            let unknown = swap_run(&ep.uri, id, &Uuid::now_v7().to_string());
            cases.push((
                "unknown run".into(),
                raw(&ep.method, &unknown, Some(ADMIN), json_ct, body()),
                StatusCode::NOT_FOUND,
                "run_not_found",
            ));
            let bad_id = swap_run(&ep.uri, id, "not-a-uuid");
            cases.push((
                "bad run id".into(),
                raw(&ep.method, &bad_id, Some(ADMIN), json_ct, body()),
                StatusCode::BAD_REQUEST,
                "invalid_path",
            ));
        }
        if let Some(q) = ep.bad_query {
            let uri = format!("{}?{q}", ep.uri);
            cases.push((
                format!("bad query {q}"),
                raw(&ep.method, &uri, Some(ADMIN), None, ""),
                StatusCode::BAD_REQUEST,
                "invalid_query",
            ));
            let uri = format!("{}?unknown=1", ep.uri);
            cases.push((
                "unknown query parameter".into(),
                raw(&ep.method, &uri, Some(ADMIN), None, ""),
                StatusCode::BAD_REQUEST,
                "invalid_query",
            ));
        }
        if let Some(wrong) = &ep.wrong {
            let ct = Some("application/json");
            cases.push((
                "malformed json".into(),
                raw(&ep.method, &ep.uri, Some(good_token), ct, "{\"goal\": "),
                StatusCode::BAD_REQUEST,
                "malformed_json",
            ));
            cases.push((
                "not json at all".into(),
                raw(&ep.method, &ep.uri, Some(good_token), ct, "goal=g"),
                StatusCode::BAD_REQUEST,
                "malformed_json",
            ));
            // Whitespace is no body only when it does not claim to be JSON.
            cases.push((
                "whitespace sent as json".into(),
                raw(&ep.method, &ep.uri, Some(good_token), ct, "\n"),
                StatusCode::BAD_REQUEST,
                "malformed_json",
            ));
            cases.push((
                "wrong types".into(),
                raw(&ep.method, &ep.uri, Some(good_token), ct, wrong.to_string()),
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_body",
            ));
            cases.push((
                "json array".into(),
                raw(&ep.method, &ep.uri, Some(good_token), ct, "[]"),
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_body",
            ));
            cases.push((
                "missing content type".into(),
                raw(&ep.method, &ep.uri, Some(good_token), None, body()),
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
            ));
            cases.push((
                "text/plain".into(),
                raw(
                    &ep.method,
                    &ep.uri,
                    Some(good_token),
                    Some("text/plain"),
                    body(),
                ),
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
            ));
            cases.push((
                "oversized body".into(),
                raw(&ep.method, &ep.uri, Some(good_token), ct, big.clone()),
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
            ));
        }
        for (what, req, status, code) in cases {
            let r = send(&h.router, req).await;
            let label = format!("{} {} — {what}", ep.method, ep.uri);
            assert_eq!(r.status, status, "{label}: {}", r.text);
            assert_eq!(
                r.headers
                    .get(header::CONTENT_TYPE)
                    .map(|v| v.to_str().unwrap()),
                Some("application/json"),
                "{label}"
            );
            assert_eq!(r.code(), code, "{label}");
            assert!(
                !r.body["error"]["message"].as_str().unwrap().is_empty(),
                "{label}"
            );
            checked += 1;
        }
        assert_eq!(
            snapshot(&h).await,
            before,
            "{} {} wrote something",
            ep.method,
            ep.uri
        );
    }
    assert!(checked > 80, "{checked} cases");
}

#[tokio::test]
async fn unknown_routes_and_methods_are_json_errors() {
    let h = harness();
    for (method, uri, status, code) in [
        (
            Method::GET,
            "/nope",
            StatusCode::NOT_FOUND,
            "route_not_found",
        ),
        (
            Method::GET,
            "/v1/runs/x/y/z",
            StatusCode::NOT_FOUND,
            "route_not_found",
        ),
        (
            Method::POST,
            "/v2/runs",
            StatusCode::NOT_FOUND,
            "route_not_found",
        ),
        (
            Method::DELETE,
            "/v1/runs",
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            Method::PUT,
            "/healthz",
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            Method::GET,
            "/v1/runs/00000000-0000-0000-0000-000000000000/cancel",
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
    ] {
        let r = send(&h.router, request(method.clone(), uri, Some(SUB_A), None)).await;
        assert_eq!(
            (r.status, r.code()),
            (status, code),
            "{method} {uri}: {}",
            r.text
        );
    }
}

#[tokio::test]
async fn authorization_header_variants() {
    let h = harness();
    let cases: [(&str, StatusCode); 6] = [
        ("Bearer tok-sub-a", StatusCode::OK),
        ("bearer tok-sub-a", StatusCode::OK),
        ("Basic dXNlcjpwYXNz", StatusCode::UNAUTHORIZED),
        ("Bearer", StatusCode::UNAUTHORIZED),
        ("tok-sub-a", StatusCode::UNAUTHORIZED),
        ("Bearer tok-sub-a-but-longer", StatusCode::UNAUTHORIZED),
    ];
    for (value, status) in cases {
        let req = Request::builder()
            .uri("/v1/runs")
            .header(header::AUTHORIZATION, value)
            .body(Body::empty())
            .unwrap();
        let r = send(&h.router, req).await;
        assert_eq!(r.status, status, "{value}: {}", r.text);
        if status == StatusCode::UNAUTHORIZED {
            assert_eq!(r.headers[header::WWW_AUTHENTICATE], "Bearer");
        }
    }
}

#[tokio::test]
async fn open_mode_acts_as_admin_and_requires_loopback() {
    let h = harness_with(glia_dispatcher::Auth::open());
    assert!(h.app.requires_loopback());
    assert!(!harness().app.requires_loopback());
    let r = send(
        &h.router,
        request(Method::POST, "/v1/runs", None, Some(&json!({"goal": "g"}))),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(r.body["tenant"], glia_dispatcher::OPEN_TENANT);
    // serve() refuses a non-loopback listener without tokens.
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let err = glia_dispatcher::serve(h.app.clone(), listener, async {})
        .await
        .unwrap_err();
    assert!(
        matches!(err, glia_dispatcher::ServeError::NotLoopback(_)),
        "{err}"
    );
    // ... and serves loopback.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    glia_dispatcher::serve(h.app.clone(), listener, async {})
        .await
        .unwrap();
}
