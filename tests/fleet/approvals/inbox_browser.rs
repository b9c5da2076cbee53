//! The approvals inbox in a real headless browser (Debian's chromium and
//! chromedriver, driven over WebDriver by fantoccini) against a real
//! dispatcher and worker on Postgres, RabbitMQ and Redis.
//!
//! One fleet and one browser for the whole story (each step takes well under
//! a second once they are up): sign in; a new approval appears without a
//! reload; edit the arguments and approve; reject with a reason; bulk-approve
//! five; watch a run continue on its page; read the history; a `<script>` /
//! `<img onerror>` argument renders as text; a cross-site form post is
//! refused; another tenant's token sees none of it. Screenshots of the queue
//! and of an approval's page go to `target/screenshots/`, so a test run
//! leaves the tree clean; `GLIA_REFRESH_SCREENSHOTS=1` writes them to
//! `docs/screenshots/` instead (the README shows them).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use glia_testkit::fleet::{Fleet, free_port};
use serde_json::{Value, json};

pub(crate) const TOKEN_A: &str = "inbox-tok-a";
const TOKEN_B: &str = "inbox-tok-b";
const XSS: &str = "<script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=2\">";
pub(crate) const WAIT: Duration = Duration::from_secs(30);

fn config(script: &str) -> Value {
    json!({
        "model": format!("script:{script}"),
        "policies": [{"tool": "refund_order", "action": {"kind": "require_approval"}}],
    })
}

/// chromedriver on a free loopback port; killed on drop.
pub(crate) struct Driver {
    child: Child,
    port: u16,
    profile: PathBuf,
}

impl Driver {
    pub(crate) fn start() -> Driver {
        for bin in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
            assert!(
                std::path::Path::new(bin).exists(),
                "{bin} is missing: install Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)"
            );
        }
        let port = free_port();
        let child = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let profile = std::env::temp_dir().join(format!(
            "glia-inbox-chrome-{}",
            uuid::Uuid::now_v7().simple()
        ));
        Driver {
            child,
            port,
            profile,
        }
    }

    pub(crate) async fn client(&self) -> Client {
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1400,1000",
                    format!("--user-data-dir={}", self.profile.display()),
                ]
            }
        });
        let caps = caps.as_object().unwrap().clone();
        let url = format!("http://127.0.0.1:{}", self.port);
        let deadline = Instant::now() + WAIT;
        loop {
            match ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => return c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("no WebDriver session: {e}"),
            }
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// The JSON API with a bearer token.
pub(crate) struct Api {
    pub(crate) server: String,
    pub(crate) http: reqwest::Client,
}

impl Api {
    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.server))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("dispatcher answers");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn submit(&self, token: &str, script: &str) -> String {
        let (s, b) = self
            .call(
                reqwest::Method::POST,
                "/v1/runs",
                token,
                Some(json!({"goal": format!("Refund for {script}"), "config": config(script)})),
            )
            .await;
        assert_eq!(s, 201, "{b}");
        b["run_id"].as_str().unwrap().to_owned()
    }

    pub(crate) async fn run(&self, run_id: &str) -> Value {
        let (s, b) = self
            .call(
                reqwest::Method::GET,
                &format!("/v1/runs/{run_id}"),
                TOKEN_A,
                None,
            )
            .await;
        assert_eq!(s, 200, "{b}");
        b
    }

    async fn events(&self, run_id: &str) -> Vec<Value> {
        let (s, b) = self
            .call(
                reqwest::Method::GET,
                &format!("/v1/runs/{run_id}/events?limit=1000"),
                TOKEN_A,
                None,
            )
            .await;
        assert_eq!(s, 200, "{b}");
        b["events"].as_array().cloned().unwrap_or_default()
    }

    pub(crate) async fn wait_done(&self, run_id: &str) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let run = self.run(run_id).await;
            if run["status"] == "done" {
                return run;
            }
            assert!(
                Instant::now() < deadline,
                "run {run_id} did not finish: {run}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) async fn wait_parked(&self, run_id: &str) {
        let deadline = Instant::now() + WAIT;
        while self.run(run_id).await["status"] != "parked" {
            assert!(Instant::now() < deadline, "run {run_id} never parked");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Wait until `check` holds on the page (polling the DOM, no reloads).
pub(crate) async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) async fn count(c: &Client, css: &str) -> usize {
    c.find_all(Locator::Css(css)).await.map_or(0, |v| v.len())
}

/// The text of the first element matching `css`. The run page replaces its
/// content while the run moves, so an element found may go stale before it
/// is read: then it is found again.
pub(crate) async fn text(c: &Client, css: &str) -> String {
    let mut last = None;
    for _ in 0..20 {
        match c.find(Locator::Css(css)).await {
            Ok(e) => match e.text().await {
                Ok(t) => return t,
                Err(err) => last = Some(err.to_string()),
            },
            Err(err) => last = Some(err.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{css}: {}", last.unwrap_or_default())
}

pub(crate) async fn sign_in(c: &Client, server: &str, token: &str) {
    c.goto(&format!("{server}/inbox/login")).await.unwrap();
    c.find(Locator::Id("token"))
        .await
        .unwrap()
        .send_keys(token)
        .await
        .unwrap();
    c.find(Locator::Id("sign-in"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until("the queue after sign-in", || async {
        c.current_url().await.is_ok_and(|u| u.path() == "/inbox")
    })
    .await;
}

/// `target/screenshots/`, or `docs/screenshots/` with
/// `GLIA_REFRESH_SCREENSHOTS=1` (the explicit way to refresh the docs).
pub(crate) fn screenshots_dir() -> PathBuf {
    let root = glia_testkit::workspace_root();
    let refresh = std::env::var("GLIA_REFRESH_SCREENSHOTS").is_ok_and(|v| v == "1");
    let dir = if refresh {
        root.join("docs/screenshots")
    } else {
        std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| root.join("target"), PathBuf::from)
            .join("screenshots")
    };
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A page on another origin whose form posts a bulk approval to the
/// dispatcher: what a cross-site request forgery would look like.
fn attacker_page(target: String, item: String) -> (String, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://127.0.0.1:{}/",
        listener.local_addr().unwrap().port()
    );
    let page = format!(
        "<!doctype html><form id=f method=post action=\"{target}/inbox/decide\"><input name=decision value=approve>\
         <input name=item value=\"{item}\"><button id=go type=submit>win a prize</button></form>"
    );
    let handle = std::thread::spawn(move || {
        // Serve the page to the browser's requests (at most a few), then stop.
        listener.set_nonblocking(false).unwrap();
        for stream in listener.incoming().take(2) {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
    (url, handle)
}

/// A fleet on `scripts` with `tokens` (`GLIA_TOKENS`), its dispatcher and
/// one worker started, chromedriver, and a runtime to drive them: what
/// every browser story starts from. Keep the fleet and driver alive.
pub(crate) fn browser_fleet(
    scripts: &[(&str, Value)],
    tokens: String,
) -> (Fleet, Driver, tokio::runtime::Runtime) {
    let mut fleet = Fleet::new(scripts);
    fleet.extra_env.push(("GLIA_TOKENS".into(), tokens));
    fleet.start_dispatcher();
    fleet.start_worker(5000);
    let driver = Driver::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    (fleet, driver, rt)
}

#[test]
fn the_inbox_in_a_real_browser() {
    let (fleet, driver, rt) = browser_fleet(
        &[
            (
                "refund",
                json!([{"tool_calls": [{"name": "refund_order", "input": {"order_id": "A1"}}]}, {"text": "Refunded."}]),
            ),
            (
                "xss",
                json!([{"tool_calls": [{"name": "refund_order", "input": {"order_id": XSS}}]}, {"text": "Done."}]),
            ),
        ],
        format!(
            "{TOKEN_A}:acme:submit,approve:ana@acme {TOKEN_B}:globex:submit,approve:bob@globex"
        ),
    );
    let server = fleet.server.clone();
    rt.block_on(async {
        let api = Api {
            server: server.clone(),
            http: reqwest::Client::new(),
        };
        let c = driver.client().await;

        // Without a session every page sends you to sign in.
        c.goto(&format!("{server}/inbox")).await.unwrap();
        assert_eq!(c.current_url().await.unwrap().path(), "/inbox/login");
        sign_in(&c, &server, TOKEN_A).await;
        assert_eq!(text(&c, "#who").await, "ana@acme");
        assert_eq!(count(&c, "tr.item").await, 0);

        // A new approval appears without reloading the page.
        let edited = api.submit(TOKEN_A, "refund").await;
        until("the new approval in the queue", || async {
            count(&c, "tr.item").await == 1
        })
        .await;
        assert!(text(&c, "tr.item td.tool").await.contains("refund_order"));
        assert!(
            text(&c, "tr.item td.goal")
                .await
                .contains("Refund for refund")
        );
        std::fs::write(
            screenshots_dir().join("inbox-queue.png"),
            c.screenshot().await.unwrap(),
        )
        .unwrap();

        // Its page: context and arguments; edit them and approve.
        c.find(Locator::Css("tr.item td.args a"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        until("the approval page", || async {
            count(&c, "#args").await == 1
        })
        .await;
        assert!(text(&c, "#args").await.contains("\"order_id\": \"A1\""));
        assert!(text(&c, "#goal").await.contains("Refund for refund"));
        // The card says why in plain words, and what the tool is.
        assert!(
            text(&c, "#why")
                .await
                .contains("The run's config requires approval for every call of this tool"),
            "{}",
            text(&c, "#why").await
        );
        assert_eq!(text(&c, "#tool-source").await, "a tool of the worker");
        std::fs::write(
            screenshots_dir().join("inbox-detail.png"),
            c.screenshot().await.unwrap(),
        )
        .unwrap();
        c.find(Locator::Css("details summary"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        // Arguments that break the tool's schema are refused before anything is posted.
        let area = c.find(Locator::Id("edit-input")).await.unwrap();
        area.clear().await.unwrap();
        area.send_keys(r#"{"order_id": 7}"#).await.unwrap();
        c.find(Locator::Id("preview"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        until("the schema error", || async {
            count(&c, "#error").await == 1
        })
        .await;
        assert!(
            text(&c, "#error").await.contains("schema"),
            "{}",
            text(&c, "#error").await
        );
        assert_eq!(
            api.run(&edited).await["status"],
            "parked",
            "nothing was posted"
        );
        c.back().await.unwrap();
        until("the approval page again", || async {
            count(&c, "#edit-input").await == 1
        })
        .await;
        if !c
            .find(Locator::Id("edit-input"))
            .await
            .unwrap()
            .is_displayed()
            .await
            .unwrap()
        {
            c.find(Locator::Css("details summary"))
                .await
                .unwrap()
                .click()
                .await
                .unwrap();
        }
        let area = c.find(Locator::Id("edit-input")).await.unwrap();
        area.clear().await.unwrap();
        area.send_keys(r#"{"order_id": "A2"}"#).await.unwrap();
        c.find(Locator::Id("preview"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        until("the diff", || async { count(&c, "#diff").await == 1 }).await;
        assert!(
            text(&c, "#diff .dadd").await.contains("A2")
                && text(&c, "#diff .ddel").await.contains("A1")
        );
        c.find(Locator::Id("confirm"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        // On to the next approval: none waits, so the queue.
        until("the queue after the decision", || async {
            c.current_url().await.is_ok_and(|u| u.path() == "/inbox")
        })
        .await;
        // The run continues in its page (the console's, live).
        c.goto(&format!("{server}/inbox/runs/{edited}"))
            .await
            .unwrap();
        until("the run page showing the run done", || async {
            count(&c, "#status").await == 1 && text(&c, "#status").await == "succeeded"
        })
        .await;
        assert!(count(&c, "li.ev[data-type='tool.result']").await >= 1);
        let events = api.events(&edited).await;
        let resolved = events
            .iter()
            .find(|e| e["type"] == "approval.resolved")
            .expect("resolved");
        assert_eq!(
            resolved["data"]["decision"],
            json!({"kind": "edit", "input": {"order_id": "A2"}})
        );
        assert_eq!(
            resolved["data"]["by"], "ana@acme",
            "the token's principal is recorded as the decider"
        );

        // Reject with a reason the model sees.
        let rejected = api.submit(TOKEN_A, "refund").await;
        api.wait_parked(&rejected).await;
        c.goto(&format!("{server}/inbox")).await.unwrap();
        until("the second approval", || async {
            count(&c, "tr.item").await == 1
        })
        .await;
        c.find(Locator::Css("tr.item td.args a"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        until("the approval page", || async {
            count(&c, "#reason").await == 1
        })
        .await;
        c.find(Locator::Id("reason"))
            .await
            .unwrap()
            .send_keys("order A1 was already refunded")
            .await
            .unwrap();
        c.find(Locator::Id("reject"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        api.wait_done(&rejected).await;
        let events = api.events(&rejected).await;
        let error = events
            .iter()
            .find(|e| e["type"] == "tool.error")
            .expect("the model got the rejection");
        assert_eq!(error["data"]["error"], "rejected");
        assert!(
            error["data"]["message"]
                .as_str()
                .unwrap()
                .contains("order A1 was already refunded")
        );

        // Bulk: five approvals, selected at once, approved at once.
        let mut five = Vec::new();
        for _ in 0..5 {
            five.push(api.submit(TOKEN_A, "refund").await);
        }
        c.goto(&format!("{server}/inbox")).await.unwrap();
        until("five approvals in the queue", || async {
            count(&c, "tr.item").await == 5
        })
        .await;
        c.find(Locator::Id("select-all"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        c.find(Locator::Id("bulk-approve"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        for run in &five {
            api.wait_done(run).await;
        }
        until("decided approvals leave the queue", || async {
            count(&c, "tr.item").await == 0
        })
        .await;

        // Untrusted text renders as text.
        let xss = api.submit(TOKEN_A, "xss").await;
        until("the xss approval", || async {
            count(&c, "tr.item").await == 1
        })
        .await;
        assert!(
            text(&c, "tr.item td.args")
                .await
                .contains("<script>window.__pwned=1</script>")
        );
        assert_eq!(count(&c, "tr.item img").await, 0);
        c.find(Locator::Css("tr.item td.args a"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        until("the approval page", || async {
            count(&c, "#args").await == 1
        })
        .await;
        assert!(text(&c, "#args").await.contains("onerror"));
        assert_eq!(count(&c, "#args img, #args script").await, 0);
        assert_eq!(
            c.execute("return window.__pwned === undefined", vec![])
                .await
                .unwrap(),
            json!(true),
            "no injected script ran"
        );

        // A cross-site form post is refused, and nothing is decided.
        let (row,) = {
            let (s, b) = api
                .call(
                    reqwest::Method::GET,
                    &format!("/v1/approvals?run_id={xss}"),
                    TOKEN_A,
                    None,
                )
                .await;
            assert_eq!(s, 200);
            (b["approvals"][0].clone(),)
        };
        let item = format!(
            "{} {} {}",
            xss,
            row["call_id"].as_str().unwrap(),
            row["args_hash"].as_str().unwrap()
        );
        let (evil, evil_thread) = attacker_page(server.clone(), item);
        c.goto(&evil).await.unwrap();
        c.find(Locator::Id("go"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        until("the refusal", || async { count(&c, "#error").await == 1 }).await;
        assert!(
            text(&c, "#error").await.contains("cross-site"),
            "{}",
            text(&c, "#error").await
        );
        drop(evil_thread); // it stops after two requests, or with the test process
        assert_eq!(
            api.run(&xss).await["status"],
            "parked",
            "the forged decision was not posted"
        );

        // History, from the event log.
        c.goto(&format!("{server}/inbox/history")).await.unwrap();
        until("the history", || async { count(&c, "tr.rec").await >= 7 }).await;
        assert_eq!(count(&c, "tr.rec.edited").await, 1);
        assert_eq!(count(&c, "tr.rec.rejected").await, 1);
        assert_eq!(count(&c, "tr.rec.approved").await, 5);
        assert!(
            text(&c, "tr.rec.rejected")
                .await
                .contains("order A1 was already refunded")
        );
        assert!(text(&c, "tr.rec.edited td.by").await.contains("ana@acme"));
        let csv = c
            .execute(
                "return fetch(document.getElementById('csv').href).then(r => r.text())",
                vec![],
            )
            .await
            .unwrap();
        assert!(
            csv.as_str().unwrap().starts_with("run_id,call_id,tool"),
            "{csv}"
        );

        // Another tenant sees none of it.
        c.find(Locator::Css("form.logout button"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        until("the sign-in page", || async {
            c.current_url()
                .await
                .is_ok_and(|u| u.path() == "/inbox/login")
        })
        .await;
        sign_in(&c, &server, TOKEN_B).await;
        assert_eq!(
            count(&c, "tr.item").await,
            0,
            "acme's pending approval is not in globex's queue"
        );
        c.goto(&format!(
            "{server}/inbox/runs/{xss}/calls/{}",
            row["call_id"].as_str().unwrap()
        ))
        .await
        .unwrap();
        assert!(text(&c, "#error").await.contains("not found"));
        c.goto(&format!("{server}/inbox/runs/{edited}"))
            .await
            .unwrap();
        assert!(text(&c, "#error").await.contains("not found"));
        c.goto(&format!("{server}/inbox/history")).await.unwrap();
        assert_eq!(count(&c, "tr.rec").await, 0);

        c.close().await.unwrap();
    });
}
