//! `GET /v1/runs`'s filters and cursor, and the tags and metadata of
//! `POST /v1/runs`: round trips, limits (422 naming the field), malformed
//! query parameters (400 naming the parameter).

use crate::common;

use axum::http::{Method, StatusCode};
use common::*;
use glia_dispatcher::{Auth, Principal, Scope};
use glia_proto::{EventKind, Outcome};
use serde_json::{Value, json};
use uuid::Uuid;

fn ids(r: &Reply) -> Vec<String> {
    r.body["runs"]
        .as_array()
        .unwrap_or_else(|| panic!("no runs: {}", r.text))
        .iter()
        .map(|x| x["run_id"].as_str().unwrap().to_owned())
        .collect()
}

fn newest_first(runs: &[Uuid]) -> Vec<String> {
    let mut runs = runs.to_vec();
    runs.sort_by(|a, b| b.cmp(a));
    runs.iter().map(Uuid::to_string).collect()
}

/// Tenant `a`'s submitter may register agents too; `b` submits; an admin.
fn labels_harness() -> H {
    let p = |t: &str, s: &[Scope]| Principal {
        tenant: t.into(),
        scopes: s.to_vec(),
        name: None,
    };
    harness_with(
        Auth::from_tokens([
            (SUB_A.to_owned(), p("a", &[Scope::Submit, Scope::Agents])),
            (SUB_B.to_owned(), p("b", &[Scope::Submit])),
            (ADMIN.to_owned(), p("ops", &[Scope::Admin])),
        ])
        .unwrap(),
    )
}

#[tokio::test]
async fn tags_and_metadata_round_trip_and_filter_the_listing() {
    let h = labels_harness();
    let put = send(
        &h.router,
        request(
            Method::PUT,
            "/v1/agents/triage",
            Some(SUB_A),
            Some(&json!({"name": "triage", "model": "m"})),
        ),
    )
    .await;
    assert!(put.status.is_success(), "{}", put.text);
    let vip = create(
        &h,
        SUB_A,
        json!({"goal": "refund A1", "agent": "triage@1", "tags": ["vip", "eu", "vip"],
               "metadata": {"ticket": "T-1", "channel": "email"}}),
    )
    .await;
    let plain = create(&h, SUB_A, json!({"goal": "g", "tags": ["eu"]})).await;
    let failing = create(
        &h,
        SUB_A,
        json!({"goal": "g2", "metadata": {"channel": "chat"}}),
    )
    .await;
    commit(
        &*h.log,
        failing,
        vec![EventKind::SessionComplete {
            outcome: Outcome::Failed {
                error: "Upstream CRM timed out".into(),
            },
        }],
    )
    .await;
    let theirs = create(&h, SUB_B, json!({"goal": "g", "tags": ["vip"]})).await;

    // The view: what was given (a repeated tag once), and the new fields.
    let one = get(&h, &format!("/v1/runs/{vip}"), SUB_A).await;
    assert_eq!(one.status, StatusCode::OK, "{}", one.text);
    assert_eq!(one.body["tags"], json!(["vip", "eu"]));
    assert_eq!(
        one.body["metadata"],
        json!({"channel": "email", "ticket": "T-1"})
    );
    assert_eq!(
        (&one.body["agent"], &one.body["agent_version"]),
        (&json!("triage"), &json!(1))
    );
    assert_eq!(one.body["trace_id"], json!(vip.simple().to_string()));
    assert_eq!(one.body["usage"]["cost_usd_micros"], 0);
    assert_eq!(one.body["steps"], 0);
    assert!(one.body["error"].is_null() && one.body["ended_at"].is_null());
    let failed = get(&h, &format!("/v1/runs/{failing}"), SUB_A).await;
    assert_eq!(failed.body["error"], "Upstream CRM timed out");
    assert!(failed.body["ended_at"].is_string(), "{}", failed.text);

    let all = [vip, plain, failing];
    for (query, want) in [
        ("", newest_first(&all)),
        ("tag=eu", newest_first(&[vip, plain])),
        ("tag=eu&tag=vip", newest_first(&[vip])),
        ("meta=channel%3Demail", newest_first(&[vip])),
        ("meta=channel%3Dchat&meta=ticket%3DT-1", vec![]),
        ("agent=triage&version=1", newest_first(&[vip])),
        ("version=2", vec![]),
        ("outcome=failed", newest_first(&[failing])),
        ("status=done&error=crm", newest_first(&[failing])),
        ("error=nothing+like+it", vec![]),
        ("error=&agent=", newest_first(&all)),
        ("max_cost_usd_micros=0", newest_first(&all)),
        ("min_cost_usd_micros=1", vec![]),
        ("since=2000-01-01T00:00:00Z", newest_first(&all)),
        ("until=2000-01-01T00:00:00%2B02:00", vec![]),
    ] {
        let r = get(&h, &format!("/v1/runs?{query}"), SUB_A).await;
        assert_eq!(r.status, StatusCode::OK, "{query}: {}", r.text);
        assert_eq!(ids(&r), want, "{query}");
    }
    // Another tenant's run with the same tag is not listed; an admin's
    // listing has both.
    let admin = get(&h, "/v1/runs?tag=vip", ADMIN).await;
    assert_eq!(ids(&admin), newest_first(&[vip, theirs]));

    // An idempotent repeat must carry the same labels.
    let mk = |body: &Value| {
        let mut req = request(Method::POST, "/v1/runs", Some(SUB_A), Some(body));
        req.headers_mut()
            .insert("idempotency-key", "labels-1".parse().unwrap());
        req
    };
    let body = json!({"goal": "g", "tags": ["a"], "metadata": {"k": "v"}});
    assert_eq!(send(&h.router, mk(&body)).await.status, StatusCode::CREATED);
    assert_eq!(send(&h.router, mk(&body)).await.status, StatusCode::OK);
    let other = send(
        &h.router,
        mk(&json!({"goal": "g", "tags": ["b"], "metadata": {"k": "v"}})),
    )
    .await;
    assert_eq!(
        (other.status, other.code()),
        (StatusCode::CONFLICT, "idempotency_conflict")
    );
}

#[tokio::test]
async fn tags_and_metadata_beyond_the_limits_are_refused_naming_the_field() {
    let h = harness();
    let many_tags: Vec<String> = (0..21).map(|i| format!("t{i}")).collect();
    let many_keys: serde_json::Map<String, Value> =
        (0..21).map(|i| (format!("k{i}"), json!("v"))).collect();
    for (body, field) in [
        (json!({"goal": "g", "tags": many_tags}), "tags"),
        (json!({"goal": "g", "tags": ["ok", "has space"]}), "tags[1]"),
        (json!({"goal": "g", "tags": [""]}), "tags[0]"),
        (json!({"goal": "g", "tags": ["x".repeat(65)]}), "tags[0]"),
        (json!({"goal": "g", "tags": ["é"]}), "tags[0]"),
        (json!({"goal": "g", "metadata": many_keys}), "metadata"),
        (
            json!({"goal": "g", "metadata": {"bad key": "v"}}),
            "metadata",
        ),
        (
            json!({"goal": "g", "metadata": {"k": "v".repeat(257)}}),
            "metadata.k",
        ),
        (
            json!({"goal": "g", "metadata": {"k": "line\nbreak"}}),
            "metadata.k",
        ),
    ] {
        let r = post(&h, "/v1/runs", SUB_A, body.clone()).await;
        assert_eq!(
            (r.status, r.body["error"]["field"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some(field)),
            "{body}: {}",
            r.text
        );
    }
    // At the limits: accepted.
    let twenty: Vec<String> = (0..20).map(|i| format!("tag-{i}:x/y@z.{i}")).collect();
    let keys: serde_json::Map<String, Value> = (0..20)
        .map(|i| (format!("k{i}"), json!("ü".repeat(128))))
        .collect();
    let r = post(
        &h,
        "/v1/runs",
        SUB_A,
        json!({"goal": "g", "tags": twenty, "metadata": keys}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    // Wrong JSON shapes are refused by the document.
    for body in [
        json!({"goal": "g", "tags": "vip"}),
        json!({"goal": "g", "metadata": {"k": 1}}),
    ] {
        let r = post(&h, "/v1/runs", SUB_A, body.clone()).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{body}: {}",
            r.text
        );
    }
}

#[tokio::test]
async fn malformed_listing_parameters_are_400_naming_the_parameter() {
    let h = harness();
    create(&h, SUB_A, json!({"goal": "g"})).await;
    for (query, param) in [
        ("cursor=not-a-cursor", "cursor"),
        ("cursor=AAAA", "cursor"),
        ("cursor=%F0%9F%98%80", "cursor"),
        ("status=sleeping", "status"),
        ("status=done&status=parked", "status"),
        ("outcome=won", "outcome"),
        ("version=0", "version"),
        ("version=x", "version"),
        ("batch_id=1", "batch_id"),
        ("since=yesterday", "since"),
        ("until=2026-13-01T00:00:00Z", "until"),
        ("min_cost_usd_micros=-1", "min_cost_usd_micros"),
        ("meta=novalue", "meta"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("after=0191d1f0-0000-7000-8000-000000000000", "after"),
    ] {
        let r = get(&h, &format!("/v1/runs?{query}"), SUB_A).await;
        assert_eq!(
            (r.status, r.code(), r.body["error"]["field"].as_str()),
            (StatusCode::BAD_REQUEST, "invalid_query", Some(param)),
            "{query}: {}",
            r.text
        );
    }
}

#[tokio::test]
async fn the_cursor_pages_without_gaps_or_repeats_while_runs_arrive() {
    let h = harness();
    let mut existing = Vec::new();
    for i in 0..5 {
        existing.push(create(&h, SUB_A, json!({"goal": format!("g{i}")})).await);
    }
    let mut seen = Vec::new();
    let mut path = "/v1/runs?limit=2".to_owned();
    loop {
        let page = get(&h, &path, SUB_A).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.text);
        seen.extend(ids(&page));
        create(&h, SUB_A, json!({"goal": "late"})).await;
        match page.body["next_cursor"].as_str() {
            Some(cursor) => {
                assert!(
                    cursor
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                    "base64url: {cursor}"
                );
                path = format!("/v1/runs?limit=2&cursor={cursor}");
            }
            None => break,
        }
    }
    assert_eq!(seen, newest_first(&existing));
}
