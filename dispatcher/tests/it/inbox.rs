//! The inbox's sessions, forms and filters over HTTP (no browser; the
//! browser story is `tests/fleet/approvals/inbox_browser.rs`): the cookie's attributes,
//! scope and tenant checks, CSRF and origin checks, tampered cookies, filters.

use crate::common;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use common::*;
use glia_backends::Inbox;
use glia_proto::{Decision, EventKind, Payload, args_hash};
use serde_json::json;

pub(crate) fn form(
    uri: &str,
    cookie: Option<&str>,
    origin: Option<&str>,
    fields: &[(&str, &str)],
) -> Request<Body> {
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(fields)
        .finish();
    let mut b = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::HOST, "glia.test")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(c) = cookie {
        b = b.header(header::COOKIE, c);
    }
    if let Some(o) = origin {
        b = b.header(header::ORIGIN, o);
    }
    b.body(Body::from(body)).unwrap()
}

pub(crate) fn page(uri: &str, cookie: &str) -> Request<Body> {
    Request::builder()
        .uri(uri)
        .header(header::COOKIE, cookie)
        .body(Body::empty())
        .unwrap()
}

/// Sign in with `token`: the cookie (`name=value`) and the page's form token.
pub(crate) async fn sign_in(h: &H, token: &str) -> (String, String) {
    let r = send(
        &h.router,
        form(
            "/inbox/login",
            None,
            Some("http://glia.test"),
            &[("token", token)],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let set = r.headers[header::SET_COOKIE].to_str().unwrap().to_owned();
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/;"] {
        assert!(set.contains(attr), "{set}");
    }
    assert!(!set.contains(token), "the cookie does not carry the token");
    let cookie = set.split(';').next().unwrap().to_owned();
    let queue = send(&h.router, page("/inbox", &cookie)).await;
    assert_eq!(queue.status, StatusCode::OK);
    (cookie, csrf_of(&queue.text))
}

/// The form token a page carries.
pub(crate) fn csrf_of(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .unwrap_or_else(|| panic!("no form token on the page: {page}"))
        .split('"')
        .next()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn sessions_forms_and_filters() {
    let h = harness();
    // No session: to the sign-in page. A token without scope `approve`, or
    // an unknown one, does not sign in.
    let r = send(
        &h.router,
        Request::builder()
            .uri("/inbox")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(
        (r.status, r.headers[header::LOCATION].to_str().unwrap()),
        (StatusCode::SEE_OTHER, "/inbox/login")
    );
    for bad in [SUB_A, "nope"] {
        let r = send(
            &h.router,
            form("/inbox/login", None, None, &[("token", bad)]),
        )
        .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{bad}");
        assert!(r.headers.get(header::SET_COOKIE).is_none());
    }
    // A sign-in posted from another site is refused.
    let r = send(
        &h.router,
        form(
            "/inbox/login",
            None,
            Some("https://evil.example"),
            &[("token", APP_A)],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);

    let refund = create(&h, SUB_A, json!({"goal": "refund <b>A1</b>"})).await;
    park_for_approval(&*h.log, refund, &[("c1", "refund", json!({"order": "A1"}))]).await;
    let ship = create(&h, SUB_A, json!({"goal": "ship A2"})).await;
    park_for_approval(&*h.log, ship, &[("c1", "ship", json!({"order": "A2"}))]).await;
    let other = create(&h, SUB_B, json!({"goal": "tenant b's"})).await;
    park_for_approval(&*h.log, other, &[("c1", "refund", json!({"order": "B1"}))]).await;

    let (cookie, csrf) = sign_in(&h, APP_A).await;
    let all = send(&h.router, page("/inbox", &cookie)).await;
    assert!(
        all.headers[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .contains("script-src 'self'")
    );
    assert_eq!(
        all.text.matches("<tr class=\"item").count(),
        2,
        "tenant a's two, not b's"
    );
    assert!(
        all.text.contains("refund &lt;b&gt;A1") && !all.text.contains("<b>A1"),
        "the goal is escaped"
    );
    let filtered = send(&h.router, page("/inbox?tool=ship", &cookie)).await;
    assert_eq!(filtered.text.matches("<tr class=\"item").count(), 1);
    assert!(
        filtered.text.contains(&ship.to_string()) && !filtered.text.contains(&refund.to_string())
    );
    let old_only = send(&h.router, page("/inbox?min_age=60", &cookie)).await;
    assert_eq!(
        old_only.text.matches("<tr class=\"item").count(),
        0,
        "nothing has waited an hour"
    );
    // Another tenant's run is not found.
    let r = send(
        &h.router,
        page(&format!("/inbox/runs/{other}/calls/c1"), &cookie),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    // Decisions: refused without the form token, from another origin, or
    // with a tampered cookie; accepted with them, recorded with the token's name.
    let decide = format!("/inbox/runs/{refund}/calls/c1/decide");
    let hash = args_hash(&json!({"order": "A1"}));
    let fields = [
        ("decision", "reject"),
        ("reason", "not today"),
        ("args_hash", hash.as_str()),
    ];
    let r = send(&h.router, form(&decide, Some(&cookie), None, &fields)).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "no CSRF token");
    let with_csrf = [fields.as_slice(), &[("csrf", csrf.as_str())]].concat();
    let r = send(
        &h.router,
        form(
            &decide,
            Some(&cookie),
            Some("https://evil.example"),
            &with_csrf,
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "another origin");
    let tampered = format!("{}x", cookie);
    let r = send(&h.router, form(&decide, Some(&tampered), None, &with_csrf)).await;
    assert_eq!(
        (r.status, r.headers[header::LOCATION].to_str().unwrap()),
        (StatusCode::SEE_OTHER, "/inbox/login"),
        "a tampered cookie is no session"
    );
    assert!(
        h.log.inbox(refund).await.unwrap().is_empty(),
        "nothing was posted"
    );
    let r = send(
        &h.router,
        form(&decide, Some(&cookie), Some("http://glia.test"), &with_csrf),
    )
    .await;
    assert_eq!(
        (r.status, r.headers[header::LOCATION].to_str().unwrap()),
        (
            StatusCode::SEE_OTHER,
            format!("/inbox/runs/{ship}/calls/c1").as_str()
        ),
        "on to the next approval waiting"
    );
    let posted = h.log.inbox(refund).await.unwrap();
    assert!(
        matches!(&posted[0].payload, Payload::Approval { decision: Decision::Reject { reason }, by: Some(by), .. } if reason == "not today" && by == "ana"),
        "{posted:?}"
    );

    // Signing out ends the session in the browser (the cookie is cleared).
    let r = send(
        &h.router,
        form("/inbox/logout", Some(&cookie), None, &[("csrf", &csrf)]),
    )
    .await;
    assert!(
        r.headers[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
}

/// Edits are part of the conversation: after an approver's edit, the run
/// page's conversation shows the call with the edited arguments (the ones
/// that ran) beside its result; the model's proposal stays in the events.
#[tokio::test]
async fn the_run_page_shows_the_edited_arguments() {
    let h = harness();
    let run = create(&h, SUB_A, json!({"goal": "refund A1"})).await;
    let proposed = json!({"order": "A1", "amount": 3000});
    park_for_approval(&*h.log, run, &[("c1", "refund", proposed.clone())]).await;
    let edited = json!({"order": "A1", "amount": 10});
    commit(
        &*h.log,
        run,
        vec![
            EventKind::ApprovalResolved {
                call_id: "c1".into(),
                args_hash: args_hash(&proposed),
                decision: Decision::Edit { input: edited },
                by: Some("ana".into()),
            },
            EventKind::ToolResult {
                call_id: "c1".into(),
                content: "refunded 10".into(),
                reminder: None,
                duration_ms: 1,
                redactions: Vec::new(),
            },
        ],
    )
    .await;
    let (cookie, _) = sign_in(&h, APP_A).await;
    // The old run page is the console's now.
    let r = send(&h.router, page(&format!("/inbox/runs/{run}"), &cookie)).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    let to = r.headers[header::LOCATION].to_str().unwrap().to_owned();
    assert_eq!(to, format!("/console/runs/{run}"));
    let r = send(&h.router, page(&to, &cookie)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let entry = |kind: &str| {
        r.text
            .split(&format!("data-type=\"{kind}\""))
            .nth(1)
            .unwrap_or_else(|| panic!("no {kind} in {}", r.text))
            .split("</li>")
            .next()
            .unwrap()
            .to_owned()
    };
    // The edit as a diff of the proposed and the edited arguments (keys in
    // any order: a store may reorder them, Postgres jsonb).
    let resolved = entry("approval.resolved");
    assert!(
        resolved.contains("Edited and approved by ana"),
        "{resolved}"
    );
    let removed: Vec<&str> = resolved.split("class=\"ddel\">").skip(1).collect();
    let added: Vec<&str> = resolved.split("class=\"dadd\">").skip(1).collect();
    assert!(
        removed
            .iter()
            .any(|l| l.starts_with("-") && l.contains("3000"))
            && added.iter().any(|l| l.starts_with("+") && l.contains("10")),
        "{resolved}"
    );
    assert!(entry("tool.result").contains("refunded 10"));
    assert!(
        entry("tool.call").contains("3000"),
        "the proposal stays in the log"
    );
}

/// The approval card says why the call waits, in plain words: the tool's
/// resolved policy as its step recorded it and who decided it (here the
/// operator's catalogue), or the run's `policies` matching these
/// arguments; and what the tool is: its description, where it runs, how
/// far its server is trusted, and its MCP annotations as server-supplied
/// hints (escaped: the server wrote them).
#[tokio::test]
async fn the_card_says_why_and_what_the_tool_is() {
    use glia_proto::{McpToolHints, PolicyOrigin, ResolvedPolicy, ToolSource, ToolSpec};
    let h = harness();
    let gated = ResolvedPolicy {
        requires_approval: true,
        approval_by: PolicyOrigin::Operator,
        idempotent: false,
        idempotent_by: PolicyOrigin::Default,
        trusted_server: Some(false),
    };
    let open = ResolvedPolicy {
        requires_approval: false,
        approval_by: PolicyOrigin::Default,
        idempotent: false,
        idempotent_by: PolicyOrigin::Default,
        trusted_server: None,
    };
    let tools = vec![
        ToolSpec {
            policy: Some(gated),
            source: Some(ToolSource::Mcp {
                server: "payments".into(),
                tool: "refund".into(),
                schema_hash: String::new(),
                requires_approval: true,
                max_total_ms: None,
                hints: Some(McpToolHints {
                    title: Some("<b>Refund</b>".into()),
                    read_only_hint: Some(true),
                    destructive_hint: Some(false),
                    ..McpToolHints::default()
                }),
            }),
            ..ToolSpec::new(
                "refund",
                "Refund an order <script>x</script>.",
                json!({"type": "object"}),
            )
        },
        ToolSpec {
            policy: Some(open),
            ..ToolSpec::new("ship", "Ship.", json!({"type": "object"}))
        },
    ];
    let run = create(&h, SUB_A, json!({"goal": "refund A1"})).await;
    park_for_approval_with_tools(
        &*h.log,
        run,
        &[
            ("c1", "refund", json!({"order": "A1"})),
            ("c2", "ship", json!({"order": "A1"})),
        ],
        tools,
    )
    .await;
    let (cookie, _) = sign_in(&h, APP_A).await;
    let card = send(
        &h.router,
        page(&format!("/inbox/runs/{run}/calls/c1"), &cookie),
    )
    .await;
    assert_eq!(card.status, StatusCode::OK, "{}", card.text);
    let part = |id: &str, end: &str| {
        card.text
            .split(&format!("id=\"{id}\">"))
            .nth(1)
            .and_then(|t| t.split(end).next())
            .unwrap_or_else(|| panic!("no {id}: {}", card.text))
            .to_owned()
    };
    assert_eq!(
        part("why", "</p>"),
        "<strong>Why approval is needed:</strong> The operator&#x27;s catalogue requires approval for every call of this tool."
    );
    assert_eq!(
        part("tool-description", "</dd>"),
        "Refund an order &lt;script&gt;x&lt;&#x2f;script&gt;."
    );
    assert!(part("tool-source", "</dd>").contains("MCP server &quot;payments&quot;"));
    assert!(part("tool-trust", "</dd>").starts_with("untrusted server"));
    let hints = part("tool-hints", "</dd>");
    assert!(
        card.text.contains("Server-supplied hints")
            && hints.contains("not verified")
            && hints.contains("readOnlyHint: true")
            && hints.contains("destructiveHint: false")
            && hints.contains("&lt;b&gt;Refund"),
        "{hints}"
    );
    assert!(part("policy", "</dd>").contains("untrusted server"));
    let card = send(
        &h.router,
        page(&format!("/inbox/runs/{run}/calls/c2"), &cookie),
    )
    .await;
    let why = card
        .text
        .split("id=\"why\">")
        .nth(1)
        .and_then(|t| t.split("</p>").next())
        .unwrap();
    assert!(
        why.contains("a rule in the `policies` of the run&#x27;s config matched these arguments"),
        "{why}"
    );
    assert!(card.text.contains("a tool of the worker"));
}
