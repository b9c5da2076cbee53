//! The console's batches and agents pages, and two approvers racing, in a
//! real headless browser (Debian's chromium and chromedriver over
//! WebDriver) against a real dispatcher and worker on Postgres, RabbitMQ
//! and Redis.
//!
//! The story: two versions of an agent are registered and diffed in the
//! browser (the changed line shows, the definition's `<script>` stays
//! text); a batch of three runs, one fails, and its page shows progress,
//! spend, the failure with its escaped custom id and run, and downloads the
//! results; two approvers decide the same call, the second is told who
//! won, and the worker records the losing attempt, which the card and the
//! history show. Screenshots (`console-agent-diff.png`,
//! `console-batches.png`, `console-batch.png`) go where the inbox test's
//! go (`GLIA_REFRESH_SCREENSHOTS=1`: `docs/screenshots/`).

use std::time::{Duration, Instant};

use fantoccini::{Client, Locator};
use reqwest::Method;
use serde_json::{Value, json};

use crate::approvals::inbox_browser::{
    Api, WAIT, browser_fleet, count, screenshots_dir, sign_in, text, until,
};

const ANA: &str = "console-tok-ana";
const BOB: &str = "console-tok-bob";
const XSS: &str = "<img src=x onerror=\"window.__pwned=1\">";

async fn shot(c: &Client, name: &str) {
    std::fs::write(screenshots_dir().join(name), c.screenshot().await.unwrap()).unwrap();
}

async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap();
}

async fn not_pwned(c: &Client) {
    assert_eq!(
        c.execute("return window.__pwned === undefined", vec![])
            .await
            .unwrap(),
        json!(true),
        "no injected script ran"
    );
}

/// Poll `GET path` until `done` holds on its body.
async fn poll(api: &Api, path: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT * 2;
    loop {
        let (s, b) = api.call(Method::GET, path, ANA, None).await;
        assert_eq!(s, 200, "{b}");
        if done(&b) {
            return b;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {b}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn batches_agents_and_a_race_in_a_real_browser() {
    let (fleet, driver, rt) = browser_fleet(
        &[
            ("ok", json!([{"text": "Done."}])),
            ("boom", json!([{"error": "invalid"}])),
            (
                "refund",
                json!([
                    {"tool_calls": [{"name": "refund_order", "input": {"order_id": "A1"}}]},
                    {"tool_calls": [{"name": "refund_order", "input": {"order_id": "A2"}}]},
                    {"text": "Refunded."}
                ]),
            ),
        ],
        format!("{ANA}:acme:submit,approve,agents:ana@acme {BOB}:acme:approve:bob@acme"),
    );
    let server = fleet.server.clone();
    rt.block_on(async {
        let api = Api {
            server: server.clone(),
            http: reqwest::Client::new(),
        };
        let c = driver.client().await;
        sign_in(&c, &server, ANA).await;

        // Two versions of an agent, diffed in the browser.
        let v1 = json!({"name": "triage", "description": format!("Sorts tickets {XSS}"), "model": "script:ok",
            "system": "You sort support tickets.\nBe brief."});
        let mut v2 = v1.clone();
        v2["system"] = json!("You sort support tickets.\nBe brief and polite.");
        v2["max_tokens"] = json!(512);
        for (def, want) in [(&v1, 1), (&v2, 2)] {
            let (s, b) = api
                .call(Method::PUT, "/v1/agents/triage", ANA, Some(def.clone()))
                .await;
            assert_eq!(s, 201, "{b}");
            assert_eq!(b["version"], want);
        }
        c.goto(&format!("{server}/console/agents")).await.unwrap();
        until("the agent in the list", || async {
            count(&c, "tr.agent[data-agent='triage']").await == 1
        })
        .await;
        click(&c, "tr.agent a").await;
        until("the agent's page", || async {
            count(&c, "details.version").await == 2
        })
        .await;
        assert!(text(&c, "#v2 pre.definition").await.contains("Be brief and polite."));
        assert!(
            text(&c, "#v2 pre.definition")
                .await
                .contains("Sorts tickets <img src=x"),
            "the definition's text shows as text"
        );
        assert_eq!(count(&c, "pre.definition img").await, 0);
        click(&c, "#compare").await;
        until("the diff", || async { count(&c, "#diff").await == 1 }).await;
        assert_eq!(
            c.current_url().await.unwrap().query(),
            Some("from=1&to=2")
        );
        let removed = text(&c, "#diff .ddel").await;
        let added: Vec<String> = {
            let mut out = Vec::new();
            for e in c.find_all(Locator::Css("#diff .dadd")).await.unwrap() {
                out.push(e.text().await.unwrap());
            }
            out
        };
        assert!(removed.contains("Be brief.\""), "{removed}");
        assert!(
            added.iter().any(|l| l.contains("Be brief and polite."))
                && added.iter().any(|l| l.contains("\"max_tokens\": 512")),
            "{added:?}"
        );
        not_pwned(&c).await;
        shot(&c, "console-agent-diff.png").await;

        // A batch: two items succeed, one fails (its model call is refused).
        let body = json!({"config": {"model": "script:ok"}, "items": [
            {"custom_id": "ticket-1", "goal": "Sort ticket 1"},
            {"custom_id": XSS, "goal": "Sort ticket 2", "config": {"model": "script:boom"}},
            {"custom_id": "ticket-3", "goal": "Sort ticket 3"},
        ]});
        let (s, b) = api.call(Method::POST, "/v1/batches", ANA, Some(body)).await;
        assert_eq!(s, 201, "{b}");
        let batch = b["id"].as_str().unwrap().to_owned();
        poll(&api, &format!("/v1/batches/{batch}"), "the batch to end", |b| {
            b["status"] == "completed"
        })
        .await;
        c.goto(&format!("{server}/console/batches")).await.unwrap();
        until("the batch in the list", || async {
            count(&c, &format!("tr.batch[data-batch='{batch}']")).await == 1
        })
        .await;
        assert!(text(&c, "tr.batch td.progress").await.contains("3 / 3"));
        shot(&c, "console-batches.png").await;
        click(&c, "tr.batch td a").await;
        until("the batch page", || async {
            count(&c, "#failures").await == 1
        })
        .await;
        assert_eq!(text(&c, "#status").await, "completed");
        assert_eq!(count(&c, "tr.failure").await, 1);
        assert_eq!(text(&c, "tr.failure code.custom-id").await, XSS);
        assert_eq!(count(&c, "#failures img").await, 0);
        assert!(!text(&c, "tr.failure td.error-text").await.is_empty());
        let run_link = c
            .find(Locator::Css("tr.failure a"))
            .await
            .unwrap()
            .attr("href")
            .await
            .unwrap()
            .unwrap();
        assert!(run_link.starts_with("/console/runs/"), "{run_link}");
        assert!(text(&c, "#spend").await.starts_with('$'));
        not_pwned(&c).await;
        shot(&c, "console-batch.png").await;
        let results = c
            .execute(
                "return fetch(document.getElementById('results').href).then(r => r.text())",
                vec![],
            )
            .await
            .unwrap();
        let lines: Vec<Value> = results
            .as_str()
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3, "{results}");
        assert_eq!(lines[1]["status"], "failed");
        assert_eq!(lines[1]["custom_id"], XSS);

        // Two approvers decide one call: the second is told who won, and
        // its attempt is recorded in the run's log by the worker (while the
        // run goes on: here it waits at a second approval; a finished run's
        // log takes nothing more, see docs/inbox.md).
        let (s, b) = api
            .call(
                Method::POST,
                "/v1/runs",
                ANA,
                Some(json!({"goal": "Refund A1", "config": {"model": "script:refund",
                    "policies": [{"tool": "refund_order", "action": {"kind": "require_approval"}}]}})),
            )
            .await;
        assert_eq!(s, 201, "{b}");
        let run = b["run_id"].as_str().unwrap().to_owned();
        let pending = poll(&api, &format!("/v1/approvals?run_id={run}"), "the approval", |b| {
            b["approvals"].as_array().is_some_and(|a| !a.is_empty())
        })
        .await;
        let call = pending["approvals"][0]["call_id"].as_str().unwrap().to_owned();
        let decide = format!("/v1/runs/{run}/approvals/{call}");
        let (s, b) = api
            .call(Method::POST, &decide, ANA, Some(json!({"decision": "approve"})))
            .await;
        assert_eq!(s, 202, "{b}");
        let (s, b) = api
            .call(
                Method::POST,
                &decide,
                BOB,
                Some(json!({"decision": "reject", "reason": "no"})),
            )
            .await;
        assert_eq!((s, b["error"]["code"].as_str()), (409, Some("already_decided")));
        assert!(
            b["error"]["message"].as_str().unwrap().contains("by ana@acme"),
            "{b}"
        );
        let events = poll(
            &api,
            &format!("/v1/runs/{run}/events?limit=1000"),
            "the recorded attempt",
            |b| {
                b["events"]
                    .as_array()
                    .is_some_and(|e| e.iter().any(|e| e["type"] == "approval.contested"))
            },
        )
        .await;
        let contested = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["type"] == "approval.contested")
            .unwrap();
        assert_eq!(contested["data"]["by"], "bob@acme");
        assert_eq!(contested["data"]["chose"], "reject");
        // The second approval, then the run ends.
        let second = poll(
            &api,
            &format!("/v1/approvals?run_id={run}&status=pending"),
            "the second approval",
            |b| b["approvals"].as_array().is_some_and(|a| !a.is_empty()),
        )
        .await;
        let (s, b) = api
            .call(
                Method::POST,
                &format!(
                    "/v1/runs/{run}/approvals/{}",
                    second["approvals"][0]["call_id"].as_str().unwrap()
                ),
                ANA,
                Some(json!({"decision": "approve"})),
            )
            .await;
        assert_eq!(s, 202, "{b}");
        poll(&api, &format!("/v1/runs/{run}"), "the run to finish", |r| {
            r["status"] == "done"
        })
        .await;
        c.goto(&format!("{server}/inbox/runs/{run}/calls/{call}"))
            .await
            .unwrap();
        until("the decided card", || async {
            count(&c, "#decided").await == 1
        })
        .await;
        assert!(text(&c, "#contested").await.contains("bob@acme chose reject"));
        c.goto(&format!("{server}/inbox/history")).await.unwrap();
        until("the history", || async { count(&c, "tr.rec").await >= 1 }).await;
        assert!(
            text(&c, "li.lost-attempt").await.contains("lost: bob@acme chose reject"),
            "{}",
            text(&c, "#history").await
        );

        c.close().await.unwrap();
    });
}
