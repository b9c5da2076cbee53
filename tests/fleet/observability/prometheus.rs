//! A real Prometheus (the Debian package's `/usr/bin/prometheus`, on its own
//! port and storage directory) scrapes a dispatcher and two workers while a
//! scripted batch runs — approvals, tool errors, a budget pause, a retried
//! rate-limited call, a failing model call — and then every PromQL
//! expression of the dashboard (`deploy/grafana/dashboards/glia.json`) and
//! of the alert rules (`deploy/prometheus/alerts.yml`, loaded by that
//! Prometheus) is evaluated through the HTTP API: each must return data.
//!
//! An alert expression returns data only while it fires, so its top-level
//! comparisons are evaluated with the `bool` modifier (`x > 0` becomes
//! `x > bool 0`): the whole expression, thresholds included, is evaluated on
//! the fleet's series.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use glia_testkit::fleet::{
    Fleet, KINDS, drive_all, free_port, http, mixed_config, mixed_scripts, submit_kind,
};
use serde_json::{Value, json};

/// The repository's `deploy/` directory.
fn deploy_dir() -> PathBuf {
    glia_testkit::workspace_root().join("deploy")
}

/// The prometheus binary: `GLIA_PROMETHEUS`, else `prometheus` on the PATH
/// (the Debian package installs `/usr/bin/prometheus`).
fn prometheus_bin() -> PathBuf {
    if let Ok(p) = std::env::var("GLIA_PROMETHEUS") {
        return PathBuf::from(p);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("prometheus"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("prometheus not found on the PATH: install the Debian package (`apt-get install -y prometheus`; scripts/test does) or set GLIA_PROMETHEUS to the binary")
    })
}

/// A private Prometheus: own port, own storage; killed and removed on drop.
struct Prometheus {
    child: Child,
    url: String,
    dir: PathBuf,
}

impl Prometheus {
    /// Start one scraping `dispatcher` and `workers` (host:port) every
    /// second, evaluating the repository's alert rules every second.
    fn start(dispatcher: &str, workers: &[String]) -> Prometheus {
        let dir =
            std::env::temp_dir().join(format!("glia_prometheus_{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let rules = deploy_dir()
            .join("prometheus/alerts.yml")
            .canonicalize()
            .expect("deploy/prometheus/alerts.yml exists");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {rules}\nscrape_configs:\n  - job_name: glia-dispatcher\n    static_configs:\n      - targets: [\"{dispatcher}\"]\n  - job_name: glia-worker\n    static_configs:\n      - targets: [{workers}]\n",
            rules = rules.display(),
            workers = workers
                .iter()
                .map(|w| format!("\"{w}\""))
                .collect::<Vec<_>>()
                .join(", "),
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(prometheus_bin())
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", prometheus_bin().display()));
        let p = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !http("GET", &format!("{}/-/ready", p.url), None).is_ok_and(|(s, _)| s == 200) {
            assert!(
                Instant::now() < deadline,
                "prometheus did not become ready: {}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// An instant query's result vector; a query Prometheus rejects fails the test.
    fn query(&self, expr: &str) -> Vec<Value> {
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        let resp = client
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", expr)])
            .send()
            .expect("prometheus answers");
        let status = resp.status();
        let body: Value = resp.json().expect("prometheus answers JSON");
        assert!(
            status.is_success() && body["status"] == "success",
            "query {expr:?} rejected: {status} {body}"
        );
        body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The alerting rules Prometheus loaded: `(name, query)`.
    fn alert_rules(&self) -> Vec<(String, String)> {
        let (status, body) = http(
            "GET",
            &format!("{}/api/v1/rules?type=alert", self.url),
            None,
        )
        .expect("prometheus answers");
        assert_eq!(status, 200, "{body}");
        let groups = body["data"]["groups"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        groups
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .map(|r| {
                assert_eq!(r["health"], "ok", "rule {} is unhealthy: {r}", r["name"]);
                (
                    r["name"].as_str().unwrap().to_owned(),
                    r["query"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Every PromQL expression of the dashboard: `(panel title, expr)`, with
/// Grafana's `$__rate_interval` set to one minute.
fn dashboard_exprs(dashboard: &Value) -> Vec<(String, String)> {
    fn walk(panels: &[Value], out: &mut Vec<(String, String)>) {
        for p in panels {
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"]
                    .as_str()
                    .unwrap_or_else(|| panic!("panel {} has a target without expr", p["title"]));
                out.push((
                    p["title"].as_str().unwrap_or_default().to_owned(),
                    expr.replace("$__rate_interval", "1m"),
                ));
            }
            walk(p["panels"].as_array().map_or(&[][..], Vec::as_slice), out);
        }
    }
    let mut out = Vec::new();
    walk(
        dashboard["panels"]
            .as_array()
            .expect("dashboard has panels"),
        &mut out,
    );
    out
}

/// `expr` with the `bool` modifier on each comparison outside parentheses,
/// braces, brackets and strings: `a > 0 and b == 0` → `a > bool 0 and b == bool 0`.
fn with_bool(expr: &str) -> String {
    let chars: Vec<char> = expr.chars().collect();
    let (mut out, mut depth, mut quote, mut i) = (String::new(), 0i32, None::<char>, 0);
    while i < chars.len() {
        let c = chars[i];
        if let Some(q) = quote {
            out.push(c);
            if c == '\\' && i + 1 < chars.len() {
                out.push(chars[i + 1]);
                i += 1;
            } else if c == q {
                quote = None;
            }
            i += 1;
            continue;
        }
        match c {
            '"' | '\'' | '`' => quote = Some(c),
            '(' | '{' | '[' => depth += 1,
            ')' | '}' | ']' => depth -= 1,
            _ => {}
        }
        let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
        let op = if depth == 0 && ["==", "!=", ">=", "<="].contains(&two.as_str()) {
            Some(two)
        } else if depth == 0 && (c == '>' || c == '<') {
            Some(c.to_string())
        } else {
            None
        };
        match op {
            Some(op) => {
                out.push_str(&op);
                out.push_str(" bool");
                i += op.chars().count();
            }
            None => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

#[test]
fn with_bool_marks_top_level_comparisons_only() {
    assert_eq!(with_bool("max(x) > 0"), "max(x) > bool 0");
    assert_eq!(
        with_bool(r#"sum(rate(x{a!="ok"}[5m])) / sum(y) >= 0.1 and z == 0"#),
        r#"sum(rate(x{a!="ok"}[5m])) / sum(y) >= bool 0.1 and z == bool 0"#
    );
    assert_eq!(with_bool("count(up == 1)"), "count(up == 1)");
}

/// Scripts beyond the mixed batch's: a tool called with bad arguments, a
/// call retried after a rate limit, a model call the provider rejects.
fn extra_scripts() -> Vec<(&'static str, Value)> {
    vec![
        (
            "tool_error",
            json!([{"tool_calls": [{"name": "calculator", "input": {"op": "pow", "a": "two"}}]}, {"text": "I could not compute that."}]),
        ),
        (
            "retry",
            json!([{"retries": [{"attempt": 1, "cause": "rate_limited", "message": "429 Too Many Requests", "delay_ms": 1500}], "text": "Answered after a retry."}]),
        ),
        ("model_error", json!([{"error": "invalid"}])),
    ]
}

#[test]
fn prometheus_scrapes_the_fleet_and_every_dashboard_and_alert_query_returns_data() {
    let mut scripts = mixed_scripts();
    scripts.extend(extra_scripts());
    let mut fleet = Fleet::new(&scripts);
    fleet
        .extra_env
        .push(("GLIA_METRICS_SAMPLE_MS".into(), "250".into()));
    fleet.start_dispatcher();
    let mut workers = Vec::new();
    for _ in 0..2 {
        let addr = format!("127.0.0.1:{}", free_port());
        fleet
            .extra_env
            .push(("GLIA_METRICS_LISTEN".into(), addr.clone()));
        fleet.start_worker(30_000);
        fleet.extra_env.pop();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !http("GET", &format!("http://{addr}/healthz"), None).is_ok_and(|(s, _)| s == 200) {
            assert!(
                Instant::now() < deadline,
                "worker metrics endpoint {addr} did not come up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        workers.push(addr);
    }
    let dispatcher = fleet.server.trim_start_matches("http://").to_owned();
    let prom = Prometheus::start(&dispatcher, &workers);

    // All three targets scraped and up.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let up = prom.query("up == 1");
        if up.len() == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "targets not all up: {up:?}\n{}",
            prom.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // The batch: two of each kind.
    let kinds: Vec<&str> = KINDS
        .iter()
        .copied()
        .chain(extra_scripts().iter().map(|(k, _)| *k))
        .collect();
    let runs: Vec<(String, String)> = (0..2)
        .flat_map(|i| kinds.iter().map(move |k| (i, *k)))
        .map(|(i, kind)| {
            let id = if KINDS.contains(&kind) {
                submit_kind(&fleet, kind, i)
            } else {
                fleet.submit(&format!("{kind} #{i}"), mixed_config(kind))
            };
            (kind.to_owned(), id)
        })
        .collect();
    let results = drive_all(&fleet, &runs, Instant::now() + Duration::from_secs(120));
    for (kind, run_id, run) in &results {
        let expected = if kind == "model_error" {
            "failed"
        } else {
            "succeeded"
        };
        assert_eq!(
            run["outcome"]["kind"], expected,
            "{kind} run {run_id}: {run}"
        );
    }

    // What the fleet exports, by metric family name.
    let mut exported = String::new();
    for target in std::iter::once(&dispatcher).chain(&workers) {
        let (status, body) =
            http("GET", &format!("http://{target}/metrics"), None).expect("metrics answer");
        assert_eq!(status, 200);
        exported.push_str(body.as_str().unwrap_or_default());
    }
    for (name, value) in [
        ("glia_worker_budget_pauses_total{limit=\"turns\"}", 2.0),
        ("glia_worker_runs_completed_total{outcome=\"failed\"}", 2.0),
        (
            "glia_worker_approvals_requested_total{tool=\"refund_order\"}",
            2.0,
        ),
    ] {
        let total: f64 = exported
            .lines()
            .filter_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .sum();
        assert_eq!(total, value, "{name} across the workers");
    }

    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(deploy_dir().join("grafana/dashboards/glia.json")).unwrap(),
    )
    .unwrap();
    let mut exprs: Vec<(String, String)> = dashboard_exprs(&dashboard)
        .into_iter()
        .map(|(title, e)| (format!("panel {title:?}"), e))
        .collect();
    let alerts = prom.alert_rules();
    assert_eq!(alerts.len(), 5, "alert rules loaded: {alerts:?}");
    exprs.extend(
        alerts
            .into_iter()
            .map(|(name, q)| (format!("alert {name}"), with_bool(&q))),
    );

    // Rates need a few scrapes after the last change: retry until every
    // expression answers or the deadline passes.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let empty: Vec<&(String, String)> = exprs
            .iter()
            .filter(|(_, e)| prom.query(e).is_empty())
            .collect();
        if empty.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} expressions return no data:\n{}",
            empty.len(),
            exprs.len(),
            empty
                .iter()
                .map(|(w, e)| format!("  {w}: {e}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    eprintln!(
        "{} dashboard and alert expressions return data",
        exprs.len()
    );
}
