//! The console's Runs pages over HTTP (no browser; the browser story is
//! `tests/fleet/console/runs_browser.rs`): pages render, tenant text is
//! escaped, another tenant's run is not there, every action is CSRF- and
//! scope-checked and goes through the API's checks, the live timeline
//! resumes after `Last-Event-ID`, long runs are paged.

use crate::common;
use crate::inbox::page;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use common::*;
use glia_dispatcher::{Auth, Principal, Scope};
use glia_proto::{BudgetLimits, ContentBlock, EventKind, Message, Outcome, Payload, Role, Usage};
use serde_json::json;

/// Tenant `a`'s operator: submit and approve.
const OPS_A: &str = "tok-ops-a";
const XSS: &str = "<script>alert(1)</script><img src=x onerror=alert(2)>";

fn console_auth() -> Auth {
    let p = |t: &str, s: &[Scope], name: &str| Principal {
        tenant: t.into(),
        scopes: s.to_vec(),
        name: Some(name.into()),
    };
    Auth::from_tokens([
        (SUB_A.to_owned(), p("a", &[Scope::Submit], "sub")),
        (APP_A.to_owned(), p("a", &[Scope::Approve], "ana")),
        (
            OPS_A.to_owned(),
            p("a", &[Scope::Submit, Scope::Approve], "ops"),
        ),
        (
            SUB_B.to_owned(),
            p("b", &[Scope::Submit, Scope::Approve], "bob"),
        ),
    ])
    .unwrap()
}

/// A form post (`cookie` empty: none).
fn form(uri: &str, cookie: &str, origin: Option<&str>, fields: &[(&str, &str)]) -> Request<Body> {
    crate::inbox::form(uri, (!cookie.is_empty()).then_some(cookie), origin, fields)
}

/// Sign in at the inbox with `token`: the cookie and the form token.
async fn sign_in(h: &H, token: &str) -> (String, String) {
    let r = send(
        &h.router,
        form(
            "/inbox/login",
            "",
            Some("http://glia.test"),
            &[("token", token)],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let set = r.headers[header::SET_COOKIE].to_str().unwrap().to_owned();
    assert!(
        set.contains("Path=/;"),
        "one sign-in for the inbox and the console: {set}"
    );
    let cookie = set.split(';').next().unwrap().to_owned();
    let runs = send(&h.router, page("/console/runs", &cookie)).await;
    assert_eq!(runs.status, StatusCode::OK, "{}", runs.text);
    (cookie, csrf_of(&runs.text))
}

fn csrf_of(html: &str) -> String {
    html.split("name=\"csrf\" value=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_owned()
}

fn answer(text: &str) -> EventKind {
    EventKind::ModelResponse {
        redactions: Vec::new(),
        message: Message {
            role: Role::Assistant,
            content: vec![ContentBlock::Text { text: text.into() }],
        },
        usage: Usage {
            input_tokens: 1200,
            output_tokens: 34,
            ..Usage::default()
        },
        stop_reason: "end_turn".into(),
        duration_ms: 1500,
        cost_usd_micros: 2_500,
        rejected: None,
    }
}

#[tokio::test]
async fn a_run_page_renders_every_part_escaped() {
    let h = harness_with(console_auth());
    let run = create(&h, SUB_A, json!({"goal": format!("refund {XSS}")})).await;
    park_for_approval(&*h.log, run, &[("c1", "refund", json!({"order": XSS}))]).await;
    let (cookie, _) = sign_in(&h, OPS_A).await;
    let r = send(&h.router, page(&format!("/console/runs/{run}"), &cookie)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        r.headers[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .contains("script-src 'self'")
    );
    assert!(
        !r.text.contains("<script>alert") && !r.text.contains("<img src=x"),
        "tenant text is escaped: {}",
        r.text
    );
    assert!(
        r.text
            .contains("refund &lt;script&gt;alert(1)&lt;&#x2f;script&gt;")
    );
    for kind in [
        "session.start",
        "plan.draft",
        "step.start",
        "model.call",
        "model.response",
        "tool.call",
        "approval.requested",
        "session.pause",
    ] {
        assert!(
            r.text.contains(&format!("data-type=\"{kind}\"")),
            "{kind} in the timeline"
        );
    }
    // The model call's request: the conversation as the state held it (the goal).
    let call = r.text.split("data-type=\"model.call\"").nth(1).unwrap();
    let call = call.split("</li>\n").next().unwrap();
    assert!(call.contains("class=\"request\""), "{call}");
    assert!(
        call.contains("user · text") && call.contains("refund &lt;script"),
        "{call}"
    );
    // The response: tokens, cost and latency.
    let resp = r.text.split("data-type=\"model.response\"").nth(1).unwrap();
    let resp = resp.split("</li>\n").next().unwrap();
    assert!(
        resp.contains("10 in · 5 out") && resp.contains("$0.000007"),
        "{resp}"
    );
    // The approval links to the inbox card; the header lists it as waiting.
    assert!(r.text.contains(&format!("/inbox/runs/{run}/calls/c1")));
    assert!(r.text.contains("class=\"pending-approval\""));
    assert!(r.text.contains(&run.simple().to_string()), "the trace id");
    // One event in full, with its stored JSON (escaped too).
    let one = send(
        &h.router,
        page(&format!("/console/runs/{run}/events/2"), &cookie),
    )
    .await;
    assert_eq!(one.status, StatusCode::OK, "{}", one.text);
    assert!(one.text.contains("Stored JSON") && !one.text.contains("<script>alert"));
    let none = send(
        &h.router,
        page(&format!("/console/runs/{run}/events/999"), &cookie),
    )
    .await;
    assert_eq!(none.status, StatusCode::NOT_FOUND);

    // The old run page sends you here.
    let old = send(&h.router, page(&format!("/inbox/runs/{run}"), &cookie)).await;
    assert_eq!(old.status, StatusCode::SEE_OTHER);
    assert_eq!(
        old.headers[header::LOCATION],
        format!("/console/runs/{run}")
    );
    // Without a session: to sign in.
    let anon = send(
        &h.router,
        Request::builder()
            .uri(format!("/console/runs/{run}"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(anon.status, StatusCode::SEE_OTHER);
    assert_eq!(anon.headers[header::LOCATION], "/inbox/login");
}

#[tokio::test]
async fn a_failed_run_says_why_first_and_shows_the_model_output_escaped() {
    let h = harness_with(console_auth());
    let run = create(&h, SUB_A, json!({"goal": "summarise"})).await;
    let mut kinds = to_model_call();
    kinds.push(answer("<b>bold</b> claim"));
    kinds.push(EventKind::Error {
        message: "provider said <no>".into(),
        fatal: true,
    });
    kinds.push(EventKind::SessionComplete {
        outcome: Outcome::Failed {
            error: "the model failed: <boom>".into(),
        },
    });
    commit(&*h.log, run, kinds).await;
    let (cookie, _) = sign_in(&h, OPS_A).await;
    let r = send(&h.router, page(&format!("/console/runs/{run}"), &cookie)).await;
    assert_eq!(r.status, StatusCode::OK);
    let failure = r
        .text
        .find("id=\"failure-reason\"")
        .expect("the failure reason");
    assert!(failure < r.text.find("id=\"timeline\"").unwrap(), "first");
    assert!(r.text.contains("the model failed: &lt;boom&gt;"));
    assert!(r.text.contains("&lt;b&gt;bold&lt;&#x2f;b&gt; claim") && !r.text.contains("<b>bold"));
    assert!(r.text.contains("1,200 in · 34 out") && r.text.contains("1s"));
    // Done: no actions, no live stream.
    assert!(!r.text.contains("id=\"cancel\"") && !r.text.contains("data-live"));
}

#[tokio::test]
async fn a_delayed_run_says_when_it_starts() {
    let h = harness_with(console_auth());
    let at = chrono::Utc::now() + chrono::Duration::days(30);
    let run = create(
        &h,
        SUB_A,
        json!({"goal": "later", "start_at": at.to_rfc3339()}),
    )
    .await;
    let (cookie, _) = sign_in(&h, OPS_A).await;
    let r = send(&h.router, page(&format!("/console/runs/{run}"), &cookie)).await;
    assert_eq!(r.status, StatusCode::OK);
    let when = glia_proto::wait::rfc3339_ms(at.timestamp_millis());
    assert!(r.text.contains(&format!("starts at {when}")), "{}", r.text);
}

#[tokio::test]
async fn another_tenants_run_is_not_there() {
    let h = harness_with(console_auth());
    let run = create(&h, SUB_A, json!({"goal": "a's"})).await;
    park_paused(&*h.log, run, false).await;
    let (cookie, csrf) = sign_in(&h, SUB_B).await;
    for uri in [
        format!("/console/runs/{run}"),
        format!("/console/runs/{run}/events/1"),
    ] {
        let r = send(&h.router, page(&uri, &cookie)).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{uri}");
        assert!(!r.text.contains("a&#x27;s"), "{}", r.text);
    }
    let live = send(
        &h.router,
        page(&format!("/console/runs/{run}/live"), &cookie),
    )
    .await;
    assert_eq!(live.status, StatusCode::NOT_FOUND);
    for action in ["cancel", "pause", "resume"] {
        let r = send(
            &h.router,
            form(
                &format!("/console/runs/{run}/{action}"),
                &cookie,
                Some("http://glia.test"),
                &[("csrf", &csrf)],
            ),
        )
        .await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{action}: {}", r.text);
    }
    assert!(inbox_of(&h, run).await.is_empty(), "nothing posted");
}

#[tokio::test]
async fn actions_are_csrf_and_scope_checked_and_post_what_the_api_posts() {
    let h = harness_with(console_auth());
    let run = create(&h, SUB_A, json!({"goal": "g"})).await;
    park_paused(&*h.log, run, true).await;
    let (cookie, csrf) = sign_in(&h, OPS_A).await;
    let uri = format!("/console/runs/{run}/cancel");
    // No form token, a wrong one, another site: refused, nothing posted.
    for (fields, origin) in [
        (vec![], Some("http://glia.test")),
        (vec![("csrf", "forged")], Some("http://glia.test")),
        (vec![("csrf", csrf.as_str())], Some("https://evil.example")),
    ] {
        let r = send(&h.router, form(&uri, &cookie, origin, &fields)).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{fields:?} {origin:?}");
    }
    assert!(inbox_of(&h, run).await.is_empty());

    // An approver may resume but not cancel: the page hides it, the server refuses it.
    let (app_cookie, app_csrf) = sign_in(&h, APP_A).await;
    let p = send(
        &h.router,
        page(&format!("/console/runs/{run}"), &app_cookie),
    )
    .await;
    assert!(!p.text.contains("id=\"cancel\"") && p.text.contains("id=\"resume\""));
    let r = send(
        &h.router,
        form(
            &uri,
            &app_cookie,
            Some("http://glia.test"),
            &[("csrf", &app_csrf)],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    assert!(inbox_of(&h, run).await.is_empty());

    // Resume with a budget extension: a bad field is named; then it posts.
    let p = send(&h.router, page(&format!("/console/runs/{run}"), &cookie)).await;
    assert!(p.text.contains("id=\"resume\"") && p.text.contains("id=\"cancel\""));
    assert!(!p.text.contains("id=\"pause\""), "already paused");
    let resume = format!("/console/runs/{run}/resume");
    let r = send(
        &h.router,
        form(
            &resume,
            &cookie,
            None,
            &[("csrf", &csrf), ("extend_turns", "many")],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.text.contains("extend_turns"), "{}", r.text);
    let r = send(
        &h.router,
        form(
            &resume,
            &cookie,
            None,
            &[
                ("csrf", &csrf),
                ("extend_turns", "5"),
                ("extend_cost_usd", "1.25"),
                ("extend_tool_calls", ""),
            ],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert_eq!(r.headers[header::LOCATION], format!("/console/runs/{run}"));
    assert_eq!(
        inbox_of(&h, run).await,
        vec![Payload::ExtendBudget {
            extra: BudgetLimits {
                max_turns: Some(5),
                max_cost_usd_micros: Some(1_250_000),
                ..BudgetLimits::default()
            }
        }],
        "a budget pause resumes with the extension alone, as over the API"
    );
    // A second resume is the API's 409.
    let r = send(&h.router, form(&resume, &cookie, None, &[("csrf", &csrf)])).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);

    // Cancel.
    let r = send(
        &h.router,
        form(
            &uri,
            &cookie,
            Some("http://glia.test"),
            &[("csrf", &csrf), ("reason", "enough")],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert!(inbox_of(&h, run).await.contains(&Payload::Cancel {
        reason: "enough".into()
    }));
}

#[tokio::test]
async fn pause_messages_and_external_tool_results() {
    let h = harness_with(console_auth());
    let (cookie, csrf) = sign_in(&h, OPS_A).await;

    let chat = create(&h, SUB_A, conversational()).await;
    park_for_input(&*h.log, chat).await;
    let p = send(&h.router, page(&format!("/console/runs/{chat}"), &cookie)).await;
    assert!(p.text.contains("id=\"message-text\""));
    let head = p
        .text
        .split("name=\"head_seq\" value=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_owned();
    let r = send(
        &h.router,
        form(
            &format!("/console/runs/{chat}/messages"),
            &cookie,
            None,
            &[
                ("csrf", &csrf),
                ("text", "and <i>then</i>?"),
                ("head_seq", &head),
            ],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert_eq!(
        inbox_of(&h, chat).await,
        vec![Payload::Input {
            text: "and <i>then</i>?".into(),
            redactions: vec![]
        }]
    );

    let tool = create(&h, SUB_A, json!({"goal": "weather"})).await;
    park_for_tool(&*h.log, tool).await;
    let p = send(&h.router, page(&format!("/console/runs/{tool}"), &cookie)).await;
    assert!(
        p.text
            .contains(&format!("/console/runs/{tool}/tool-results/ext1"))
    );
    assert!(
        !p.text.contains("tool-results/run1"),
        "a worker runs that one"
    );
    let r = send(
        &h.router,
        form(
            &format!("/console/runs/{tool}/tool-results/ext1"),
            &cookie,
            None,
            &[("csrf", &csrf), ("content", "sunny"), ("is_error", "1")],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert_eq!(
        inbox_of(&h, tool).await,
        vec![Payload::ToolResult {
            call_id: "ext1".into(),
            content: "sunny".into(),
            is_error: true
        }]
    );
    // The ran call is not external: the API's 409.
    let r = send(
        &h.router,
        form(
            &format!("/console/runs/{tool}/tool-results/run1"),
            &cookie,
            None,
            &[("csrf", &csrf), ("content", "x")],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);

    let pausable = create(&h, SUB_A, json!({"goal": "long"})).await;
    let p = send(
        &h.router,
        page(&format!("/console/runs/{pausable}"), &cookie),
    )
    .await;
    assert!(p.text.contains("id=\"pause\"") && !p.text.contains("id=\"resume\""));
    let r = send(
        &h.router,
        form(
            &format!("/console/runs/{pausable}/pause"),
            &cookie,
            None,
            &[("csrf", &csrf), ("reason", "look first")],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert_eq!(
        inbox_of(&h, pausable).await,
        vec![Payload::Pause {
            reason: "look first".into(),
            by: Some("ops".into())
        }]
    );
}

#[tokio::test]
async fn the_live_timeline_resumes_after_the_last_event_id() {
    let h = harness_with(console_auth());
    let run = create(&h, SUB_A, json!({"goal": "live <one>"})).await;
    let mut kinds = to_model_call();
    kinds.push(answer("<em>done</em>"));
    kinds.push(EventKind::SessionComplete {
        outcome: Outcome::Failed {
            error: "stopped".into(),
        },
    });
    commit(&*h.log, run, kinds).await;
    let (cookie, _) = sign_in(&h, OPS_A).await;
    // A done run: every event after `after`, the header, then `end`.
    let r = send(
        &h.router,
        page(&format!("/console/runs/{run}/live?after=0"), &cookie),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.text.contains("event: event\nid: 1\n") || r.text.contains("id: 1\n"),
        "{}",
        r.text
    );
    assert!(r.text.contains("data-type=\"model.response\""));
    assert!(r.text.contains("&lt;em&gt;done") && !r.text.contains("<em>done"));
    assert!(r.text.contains("event: head") && r.text.contains("event: end"));
    // Resume: `Last-Event-ID` wins over `after`.
    let resumed = send(
        &h.router,
        Request::builder()
            .uri(format!("/console/runs/{run}/live?after=0"))
            .header(header::COOKIE, &cookie)
            .header("last-event-id", "5")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    let ids: Vec<&str> = resumed
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .collect();
    assert_eq!(ids, vec!["6", "7"], "{}", resumed.text);
    // No session: 401, not a page.
    let anon = send(
        &h.router,
        Request::builder()
            .uri(format!("/console/runs/{run}/live"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(anon.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_long_run_is_paged() {
    let h = harness_with(console_auth());
    let run = create(&h, SUB_A, json!({"goal": "long"})).await;
    let mut kinds = Vec::new();
    for i in 0..75 {
        kinds.push(EventKind::SessionPauseRequested {
            reason: format!("r{i}"),
            by: None,
        });
        kinds.push(EventKind::SessionResume { by: None });
    }
    commit(&*h.log, run, kinds).await;
    let (cookie, _) = sign_in(&h, OPS_A).await;
    let newest = send(&h.router, page(&format!("/console/runs/{run}"), &cookie)).await;
    assert_eq!(newest.status, StatusCode::OK);
    assert_eq!(newest.text.matches("<li class=\"ev ").count(), 100);
    assert!(newest.text.contains("id=\"e151\"") && !newest.text.contains("id=\"e51\""));
    assert!(newest.text.contains(&format!("/console/runs/{run}?from=1")));
    assert!(
        newest.text.contains("data-live="),
        "the newest page follows the run"
    );
    let first = send(
        &h.router,
        page(&format!("/console/runs/{run}?from=1"), &cookie),
    )
    .await;
    assert_eq!(first.text.matches("<li class=\"ev ").count(), 100);
    assert!(first.text.contains("id=\"e1\"") && first.text.contains("id=\"e100\""));
    assert!(!first.text.contains("id=\"e101\"") && !first.text.contains("data-live="));
    assert!(
        first
            .text
            .contains(&format!("/console/runs/{run}?from=101"))
    );
}

#[tokio::test]
async fn the_runs_list_filters_pages_and_escapes() {
    let h = harness_with(console_auth());
    let (cookie, _) = sign_in(&h, OPS_A).await;
    let failed = create(
        &h,
        SUB_A,
        json!({"goal": format!("failing {XSS}"), "tags": ["t1", "t2"], "metadata": {"ticket": "T-1"}}),
    )
    .await;
    commit(
        &*h.log,
        failed,
        vec![EventKind::SessionComplete {
            outcome: Outcome::Failed {
                error: "Upstream <timeout>".into(),
            },
        }],
    )
    .await;
    let tagged = create(&h, SUB_A, json!({"goal": "tagged", "tags": ["t1"]})).await;
    let newest = create(&h, SUB_A, json!({"goal": "newest"})).await;
    create(&h, SUB_B, json!({"goal": "b's run"})).await;

    let list = |q: &str| send(&h.router, page(&format!("/console/runs{q}"), &cookie));
    let all = list("").await;
    assert_eq!(all.status, StatusCode::OK, "{}", all.text);
    let order: Vec<usize> = [newest, tagged, failed]
        .iter()
        .map(|r| all.text.find(&format!("data-run=\"{r}\"")).expect("listed"))
        .collect();
    assert!(order.is_sorted(), "newest first: {order:?}");
    assert_eq!(all.text.matches("<tr class=\"run\"").count(), 3, "not b's");
    assert!(!all.text.contains("<script>alert") && all.text.contains("failing &lt;script&gt;"));
    assert!(
        all.text.contains("Upstream &lt;timeout&gt;"),
        "the failure reason"
    );

    // Blank fields are no filter; tags and meta split at spaces; the URL is the query.
    let r = list("?status=&outcome=failed&agent=&tag=t1+t2&meta=ticket%3DT-1&error=TIMEOUT").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.text.matches("<tr class=\"run\"").count(), 1, "{}", r.text);
    assert!(r.text.contains(&format!("data-run=\"{failed}\"")));
    assert!(
        r.text.contains("<option value=\"failed\" selected>"),
        "the form shows the query"
    );
    assert!(r.text.contains("value=\"t1 t2\""));
    let r = list("?tag=t1").await;
    assert_eq!(r.text.matches("<tr class=\"run\"").count(), 2);
    let r = list("?status=done").await;
    assert_eq!(r.text.matches("<tr class=\"run\"").count(), 1);

    // A wrong field is named, as the API names it.
    let r = list("?version=first").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.text.contains("id=\"error\"") && r.text.contains("version"),
        "{}",
        r.text
    );

    // Paging: 50 a page, the next page by cursor, with the same filters.
    for i in 0..50 {
        create(
            &h,
            SUB_A,
            json!({"goal": format!("bulk {i}"), "tags": ["bulk"]}),
        )
        .await;
    }
    let first = list("?tag=bulk").await;
    assert_eq!(first.text.matches("<tr class=\"run\"").count(), 50);
    let next = first
        .text
        .split("id=\"next\" href=\"")
        .nth(1)
        .expect("a next page")
        .split('"')
        .next()
        .unwrap()
        .replace("&amp;", "&");
    assert!(
        next.contains("tag=bulk") && next.contains("cursor="),
        "{next}"
    );
    let second = send(&h.router, page(&next, &cookie)).await;
    assert_eq!(second.status, StatusCode::OK, "{}", second.text);
    assert_eq!(
        second.text.matches("<tr class=\"run\"").count(),
        0,
        "all 50 were on the first"
    );
    let everything = list("").await;
    assert_eq!(everything.text.matches("<tr class=\"run\"").count(), 50);
    let rest = everything
        .text
        .split("id=\"next\" href=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_owned();
    let rest = send(&h.router, page(&rest, &cookie)).await;
    assert_eq!(
        rest.text.matches("<tr class=\"run\"").count(),
        3,
        "the oldest three"
    );
    assert!(rest.text.contains(&format!("data-run=\"{failed}\"")));
}
