//! The console's Runs pages in a real headless browser (Debian's chromium
//! and chromedriver over WebDriver, as the inbox's test) against a real
//! dispatcher and worker on Postgres, RabbitMQ and Redis.
//!
//! One fleet and one browser: list the runs and filter them (the filter
//! is the URL); open a failed run and find its failure reason and the
//! model request that failed; watch a run parked at an approval move on
//! live when it is approved; answer a conversational run from its page;
//! cancel a run; resume a run paused by its budget with an extension.
//! Screenshots of the list and of a run page go to `target/screenshots/`
//! (`GLIA_REFRESH_SCREENSHOTS=1`: to `docs/screenshots/`, for the README).

use fantoccini::{Client, Locator};
use glia_testkit::fleet::Fleet;
use serde_json::{Value, json};

use crate::approvals::inbox_browser::{
    Api, Driver, TOKEN_A, count, screenshots_dir, sign_in, text, until,
};

const XSS: &str = "<script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=2\">";

async fn submit(api: &Api, body: Value) -> String {
    let (s, b) = api
        .call(reqwest::Method::POST, "/v1/runs", TOKEN_A, Some(body))
        .await;
    assert_eq!(s, 201, "{b}");
    b["run_id"].as_str().unwrap().to_owned()
}

async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"));
}

async fn type_into(c: &Client, css: &str, keys: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .send_keys(keys)
        .await
        .unwrap();
}

async fn status_is(c: &Client, want: &str) -> bool {
    count(c, "#status").await == 1 && text(c, "#status").await == want
}

#[test]
fn the_runs_pages_in_a_real_browser() {
    let mut fleet = Fleet::new(&[
        (
            "refund",
            json!([{"tool_calls": [{"name": "refund_order", "input": {"order_id": XSS}}]}, {"text": "Refunded <b>A1</b>."}]),
        ),
        (
            "twice",
            json!([{"tool_calls": [{"name": "refund_order", "input": {"order_id": "B1"}}]}, {"text": "Done after two turns."}]),
        ),
        (
            "chat",
            json!([{"text": "Hello, what next?"}, {"text": "Noted."}, {"text": "Anything else?"}]),
        ),
    ]);
    fleet.extra_env.push((
        "GLIA_TOKENS".into(),
        format!("{TOKEN_A}:acme:submit,approve:ana@acme"),
    ));
    fleet.start_dispatcher();
    fleet.start_worker(5000);
    let server = fleet.server.clone();
    let driver = Driver::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let api = Api {
            server: server.clone(),
            http: reqwest::Client::new(),
        };
        let c = driver.client().await;

        // A run that fails at its first model call (its model does not exist).
        let failed = submit(
            &api,
            json!({"goal": format!("Summarise the ticket {XSS}"), "config": {"model": "script:no-such-script"}}),
        )
        .await;
        api.wait_done(&failed).await;
        // A run parked at an approval.
        let parked = submit(
            &api,
            json!({"goal": "Refund order A1", "tags": ["ticket-4711", "refunds"], "config": {"model": "script:refund",
                "policies": [{"tool": "refund_order", "action": {"kind": "require_approval"}}]}}),
        )
        .await;
        api.wait_parked(&parked).await;

        // The list: newest first; filter by outcome, and the URL is the query.
        sign_in(&c, &server, TOKEN_A).await;
        c.goto(&format!("{server}/console")).await.unwrap();
        until("the runs list", || async { count(&c, "tr.run").await == 2 }).await;
        assert!(
            text(&c, "tr.run:first-child td.goal").await.contains("Refund order A1"),
            "newest first"
        );
        assert!(
            text(&c, "table.runs").await.contains("<script>window.__pwned=1</script>"),
            "the goal is text"
        );
        c.find(Locator::Css("select[name=outcome]"))
            .await
            .unwrap()
            .select_by_value("failed")
            .await
            .unwrap();
        click(&c, "#filter").await;
        until("the filtered list", || async {
            count(&c, "tr.run").await == 1
                && c.current_url()
                    .await
                    .is_ok_and(|u| u.query().is_some_and(|q| q.contains("outcome=failed")))
        })
        .await;
        assert!(text(&c, "tr.run td.status").await.contains("failed"));

        // The failed run: the reason first, and the model request that failed.
        click(&c, "tr.run td.goal a").await;
        until("the failed run's page", || async {
            count(&c, "#failure-reason").await == 1
        })
        .await;
        assert!(
            text(&c, "#failure-reason").await.contains("no-such-script"),
            "{}",
            text(&c, "#failure-reason").await
        );
        click(&c, "li.ev[data-type='model.call'] details.request > summary").await;
        let request = text(&c, "li.ev[data-type='model.call'] details.request").await;
        assert!(
            request.contains("user · text") && request.contains("Summarise the ticket"),
            "{request}"
        );
        assert_eq!(count(&c, "li.ev img, li.ev script").await, 0);
        assert_eq!(
            c.execute("return window.__pwned === undefined", vec![])
                .await
                .unwrap(),
            json!(true),
            "no injected script ran"
        );

        // A run parked at an approval moves on in its page when approved.
        c.goto(&format!("{server}/console/runs/{parked}"))
            .await
            .unwrap();
        until("the parked run", || async { status_is(&c, "parked").await }).await;
        assert!(text(&c, "#pull-point").await.contains("awaiting approval"));
        assert!(text(&c, "#tags").await.contains("ticket-4711"));
        let before = count(&c, "li.ev").await;
        let (s, approvals) = api
            .call(
                reqwest::Method::GET,
                &format!("/v1/approvals?run_id={parked}"),
                TOKEN_A,
                None,
            )
            .await;
        assert_eq!(s, 200);
        let call = approvals["approvals"][0]["call_id"].as_str().unwrap();
        let (s, b) = api
            .call(
                reqwest::Method::POST,
                &format!("/v1/runs/{parked}/approvals/{call}"),
                TOKEN_A,
                Some(json!({"decision": "approve"})),
            )
            .await;
        assert_eq!(s, 202, "{b}");
        until("the run's new events, live", || async {
            count(&c, "li.ev[data-type='session.complete']").await == 1
        })
        .await;
        until("the header, live", || async { status_is(&c, "succeeded").await }).await;
        assert!(count(&c, "li.ev").await > before + 3);
        assert!(count(&c, "li.ev[data-type='approval.resolved']").await == 1);
        assert!(text(&c, "li.ev[data-type='approval.resolved']").await.contains("ana@acme"));
        assert!(
            text(&c, "li.ev[data-type='tool.call']").await.contains("__pwned"),
            "the arguments, as text"
        );
        assert_eq!(count(&c, "li.ev img, li.ev script").await, 0);
        // The screenshot: the timeline from the model's first call, its request open.
        click(&c, "li.ev[data-type='model.call'] details.request > summary").await;
        c.execute(
            "document.querySelector(\"li.ev[data-type='model.call']\").scrollIntoView()",
            vec![],
        )
        .await
        .unwrap();
        std::fs::write(
            screenshots_dir().join("console-run.png"),
            c.screenshot().await.unwrap(),
        )
        .unwrap();

        // A conversational run: answer it from its page, then cancel it.
        let chat = submit(
            &api,
            json!({"goal": "Chat with me", "config": {"model": "script:chat", "conversational": true}}),
        )
        .await;
        api.wait_parked(&chat).await;
        c.goto(&format!("{server}/console/runs/{chat}")).await.unwrap();
        until("the message form", || async {
            count(&c, "#message-text").await == 1
        })
        .await;
        type_into(&c, "#message-text", "Please <i>continue</i>").await;
        click(&c, "#send-message").await;
        until("the message and the answer, live", || async {
            count(&c, "li.ev[data-type='input.received']").await == 1
                && count(&c, "li.ev[data-type='model.response']").await == 2
        })
        .await;
        assert!(
            text(&c, "li.ev[data-type='input.received']")
                .await
                .contains("Please <i>continue</i>")
        );
        until("parked again", || async {
            count(&c, "#message-text").await == 1
        })
        .await;
        click(&c, "#cancel").await;
        until("the run cancelled", || async {
            status_is(&c, "cancelled").await
        })
        .await;
        assert_eq!(api.run(&chat).await["outcome"]["kind"], "cancelled");
        assert_eq!(count(&c, "#cancel").await, 0, "no actions on a done run");

        // A run paused by its budget: resume it with one more turn.
        let budget = submit(
            &api,
            json!({"goal": "Two turns", "config": {"model": "script:twice", "budget": {"max_turns": 1}}}),
        )
        .await;
        api.wait_parked(&budget).await;
        c.goto(&format!("{server}/console/runs/{budget}")).await.unwrap();
        until("the paused run", || async { count(&c, "#resume").await == 1 }).await;
        assert!(text(&c, "#pull-point").await.contains("budget"));
        type_into(&c, "input[name=extend_turns]", "1").await;
        type_into(&c, "#extend-cost", "0.50").await;
        click(&c, "#resume").await;
        until("the extension and the end, live", || async {
            count(&c, "li.ev[data-type='budget.extended']").await == 1
                && status_is(&c, "succeeded").await
        })
        .await;
        assert!(text(&c, "li.ev[data-type='budget.extended']").await.contains("turns 2"));

        // The list of them all.
        c.goto(&format!("{server}/console/runs")).await.unwrap();
        until("every run listed", || async { count(&c, "tr.run").await == 4 }).await;
        std::fs::write(
            screenshots_dir().join("console-runs.png"),
            c.screenshot().await.unwrap(),
        )
        .unwrap();
        c.close().await.unwrap();
    });
}
