//! The deployment files are checked without services: the dashboard JSON
//! and the alert rules name only metrics the dispatcher and the workers
//! export, every panel uses the provisioned datasource, the compose file
//! mounts what exists and matches the scrape config, `promtool` accepts the
//! Prometheus config and rules, and the Kubernetes manifests carry probes,
//! resources, a grace period and the KEDA scaler. (That every expression
//! returns data against a live fleet is `tests/prometheus.rs`.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use yaml_rust2::{Yaml, YamlLoader};

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(deploy(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

fn yaml(path: &str) -> Vec<Yaml> {
    YamlLoader::load_from_str(&read(path)).unwrap_or_else(|e| panic!("{path} is not YAML: {e}"))
}

fn dashboard() -> Value {
    serde_json::from_str(&read("deploy/grafana/dashboards/glia.json"))
        .expect("the dashboard is JSON")
}

/// Every non-row panel, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<Value> {
    fn walk(panels: &[Value], out: &mut Vec<Value>) {
        for p in panels {
            if p["type"] != "row" {
                out.push(p.clone());
            }
            walk(p["panels"].as_array().map_or(&[][..], Vec::as_slice), out);
        }
    }
    let mut out = Vec::new();
    walk(dashboard["panels"].as_array().expect("panels"), &mut out);
    out
}

/// Series names the services can export: from the `# TYPE` lines of the
/// dispatcher's and a worker's registries (counters as `NAME_total`,
/// histograms as `NAME_bucket`, `_sum`, `_count`), with one series created
/// in every labelled family (an empty family is not exported).
fn exported_series() -> BTreeSet<String> {
    use glia_dispatcher::metrics as d;
    use glia_worker::metrics as w;
    let s = String::new;
    let worker = w::WorkerMetrics::new("scripted");
    let model = || w::ModelLabels {
        provider: s(),
        model: s(),
    };
    let _ = worker
        .runs_completed
        .get_or_create(&w::OutcomeLabel { outcome: s() });
    let _ = worker.model_calls.get_or_create(&w::ModelOutcomeLabels {
        provider: s(),
        model: s(),
        outcome: s(),
    });
    let _ = worker.model_ttft.get_or_create(&model());
    let _ = worker.model_duration.get_or_create(&model());
    let _ = worker.model_tokens.get_or_create(&w::TokenLabels {
        provider: s(),
        model: s(),
        kind: s(),
    });
    let _ = worker.model_cost.get_or_create(&model());
    let _ = worker.model_retries.get_or_create(&w::RetryLabels {
        provider: s(),
        model: s(),
        cause: s(),
    });
    let _ = worker.model_stops.get_or_create(&w::StopLabels {
        provider: s(),
        model: s(),
        stop: s(),
        action: s(),
    });
    let _ = worker.model_usage_estimated.get_or_create(&model());
    let _ = worker.rate_limit_wait.get_or_create(&model());
    let _ = worker.tool_calls.get_or_create(&w::ToolLabels {
        tool: s(),
        outcome: s(),
    });
    let _ = worker
        .tool_duration
        .get_or_create(&w::ToolName { tool: s() });
    let _ = worker
        .approvals_requested
        .get_or_create(&w::ToolName { tool: s() });
    let _ = worker
        .approvals_resolved
        .get_or_create(&w::DecisionLabel { decision: s() });
    let _ = worker
        .budget_pauses
        .get_or_create(&w::LimitLabel { limit: s() });
    let _ = worker
        .pauses
        .get_or_create(&w::PullPointLabel { pull_point: s() });
    worker.job("advanced");
    let dispatcher = glia_dispatcher::Metrics::new();
    let _ = dispatcher.http_requests.get_or_create(&d::HttpLabels {
        route: s(),
        method: s(),
        status: s(),
    });
    let _ = dispatcher.http_duration.get_or_create(&d::RouteLabels {
        route: s(),
        method: s(),
    });
    let _ = dispatcher.batch_items.get_or_create(&d::BatchItemLabels {
        state: s(),
        pull_point: s(),
    });
    dispatcher.posted("approval");
    let _ = dispatcher.runs.get_or_create(&d::RunLabels {
        status: s(),
        pull_point: s(),
    });
    let _ = dispatcher
        .approval_wait
        .get_or_create(&d::DecisionLabels { decision: s() });
    let _ = dispatcher
        .sample_errors
        .get_or_create(&d::SourceLabels { source: s() });
    let text = format!("{}{}", worker.encode(), dispatcher.encode());
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').expect("# TYPE NAME KIND");
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

/// The `glia_…` metric names an expression uses.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("glia_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

/// The uid of the provisioned Prometheus datasource.
fn datasource_uid() -> String {
    let docs = yaml("deploy/grafana/provisioning/datasources/prometheus.yml");
    let ds = &docs[0]["datasources"][0];
    assert_eq!(ds["type"].as_str(), Some("prometheus"));
    ds["uid"]
        .as_str()
        .expect("the datasource has a uid")
        .to_owned()
}

fn alert_exprs() -> Vec<(String, String)> {
    let docs = yaml("deploy/prometheus/alerts.yml");
    let mut out = Vec::new();
    for group in docs[0]["groups"].as_vec().expect("groups") {
        for rule in group["rules"].as_vec().expect("rules") {
            let name = rule["alert"]
                .as_str()
                .expect("alerting rules only")
                .to_owned();
            assert!(
                rule["annotations"]["summary"].as_str().is_some(),
                "alert {name} has no summary"
            );
            out.push((name, rule["expr"].as_str().expect("expr").to_owned()));
        }
    }
    out
}

#[test]
fn every_dashboard_and_alert_metric_is_exported() {
    let exported = exported_series();
    assert!(
        exported.contains("glia_worker_model_calls_total")
            && exported.contains("glia_dispatcher_queue_messages"),
        "{exported:?}"
    );
    let mut exprs: Vec<(String, String)> = Vec::new();
    for p in panels(&dashboard()) {
        for t in p["targets"].as_array().expect("targets") {
            exprs.push((
                format!("panel {}", p["title"]),
                t["expr"].as_str().expect("expr").to_owned(),
            ));
        }
    }
    exprs.extend(
        alert_exprs()
            .into_iter()
            .map(|(n, e)| (format!("alert {n}"), e)),
    );
    let mut used = 0;
    for (what, expr) in &exprs {
        let names = metric_names(expr);
        assert!(
            !names.is_empty() || expr.contains("up{"),
            "{what} uses no glia metric: {expr}"
        );
        for name in names {
            assert!(
                exported.contains(&name),
                "{what} uses {name}, which no service exports"
            );
            used += 1;
        }
    }
    assert!(used >= 40, "only {used} metric uses found");
}

#[test]
fn the_dashboard_has_the_sections_and_every_panel_uses_the_provisioned_datasource() {
    let uid = datasource_uid();
    let d = dashboard();
    assert_eq!(d["uid"], "glia-fleet");
    let rows: Vec<&str> = d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "row")
        .filter_map(|p| p["title"].as_str())
        .collect();
    assert_eq!(
        rows,
        [
            "Fleet overview",
            "Model and cost",
            "Tools",
            "Approvals queue",
            "Queue and workers",
            "Errors",
            "Batches"
        ]
    );
    let panels = panels(&d);
    let mut ids = BTreeSet::new();
    for p in &panels {
        assert!(
            ids.insert(p["id"].as_i64().expect("panel id")),
            "duplicate panel id {}",
            p["id"]
        );
        assert_eq!(
            p["datasource"]["uid"].as_str(),
            Some(uid.as_str()),
            "panel {}",
            p["title"]
        );
        assert!(
            p["gridPos"]["w"].as_i64().is_some_and(|w| w > 0 && w <= 24),
            "panel {} gridPos",
            p["title"]
        );
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        for t in targets {
            assert_eq!(
                t["datasource"]["uid"].as_str(),
                Some(uid.as_str()),
                "a target of panel {}",
                p["title"]
            );
        }
    }
    // The dashboards provider points where compose mounts the dashboards.
    let provider = &yaml("deploy/grafana/provisioning/dashboards/glia.yml")[0]["providers"][0];
    assert_eq!(
        provider["options"]["path"].as_str(),
        Some("/var/lib/grafana/dashboards")
    );
}

/// `promtool` from the Debian `prometheus` package.
fn promtool(args: &[&str]) {
    let out = Command::new("promtool").args(args).output().unwrap_or_else(|e| {
        panic!("promtool not runnable ({e}): install the Debian package `prometheus` (apt-get install -y prometheus; scripts/test does)")
    });
    assert!(
        out.status.success(),
        "promtool {args:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn promtool_accepts_the_config_and_the_rules() {
    promtool(&[
        "check",
        "rules",
        deploy("deploy/prometheus/alerts.yml").to_str().unwrap(),
    ]);
    promtool(&[
        "check",
        "config",
        deploy("deploy/prometheus/prometheus.yml").to_str().unwrap(),
    ]);
}

fn strings(y: &Yaml) -> Vec<String> {
    y.as_vec()
        .map(|v| {
            v.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn compose_runs_prometheus_and_grafana_provisioned_and_scraping_the_fleet() {
    let compose = &yaml("docker-compose.yml")[0];
    let services = &compose["services"];
    for s in [
        "postgres",
        "rabbitmq",
        "redis",
        "dispatcher",
        "worker-1",
        "worker-2",
        "prometheus",
        "grafana",
    ] {
        assert!(!services[s].is_badvalue(), "compose has no service {s}");
    }
    // Every volume's host side exists.
    for s in ["prometheus", "grafana"] {
        for v in strings(&services[s]["volumes"]) {
            let host = v.split(':').next().unwrap();
            assert!(
                deploy(host).exists(),
                "{s} mounts {host}, which does not exist"
            );
        }
    }
    // The scrape targets are compose services on the ports they serve.
    let prom = &yaml("deploy/prometheus/prometheus.yml")[0];
    let mut targets = Vec::new();
    for job in prom["scrape_configs"].as_vec().expect("scrape_configs") {
        targets.extend(strings(&job["static_configs"][0]["targets"]));
    }
    for w in ["worker-1", "worker-2"] {
        let cmd = strings(&services[w]["command"]);
        let listen = cmd
            .iter()
            .position(|a| a == "--metrics-listen")
            .map(|i| cmd[i + 1].clone())
            .unwrap_or_else(|| panic!("{w} serves no metrics"));
        let port = listen.rsplit(':').next().unwrap();
        assert!(
            targets.contains(&format!("{w}:{port}")),
            "{w}:{port} not scraped: {targets:?}"
        );
    }
    let cmd = strings(&services["dispatcher"]["command"]);
    let port = cmd[cmd.iter().position(|a| a == "--listen").unwrap() + 1]
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    assert!(
        targets.contains(&format!("dispatcher:{port}")),
        "dispatcher not scraped: {targets:?}"
    );
    assert_eq!(strings(&prom["rule_files"]), ["alerts.yml"]);
}

#[test]
fn kubernetes_manifests_have_probes_resources_grace_and_keda() {
    let docs: Vec<Yaml> = ["config.yaml", "dispatcher.yaml", "worker.yaml", "keda.yaml"]
        .iter()
        .flat_map(|f| yaml(&format!("deploy/k8s/{f}")))
        .collect();
    let find = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| {
                d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name)
            })
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    };
    for name in ["glia-dispatcher", "glia-worker"] {
        let spec = &find("Deployment", name)["spec"]["template"]["spec"];
        let c = &spec["containers"][0];
        for probe in ["readinessProbe", "livenessProbe"] {
            assert!(
                c[probe]["httpGet"]["path"].as_str().is_some(),
                "{name} has no {probe}"
            );
        }
        assert!(
            c["resources"]["requests"]["cpu"].as_str().is_some()
                && c["resources"]["limits"]["memory"].as_str().is_some(),
            "{name} resources"
        );
    }
    let worker = &find("Deployment", "glia-worker")["spec"]["template"]["spec"];
    // Longer than a step: well beyond the default lease (30 s) and a long model call.
    assert!(
        worker["terminationGracePeriodSeconds"]
            .as_i64()
            .is_some_and(|s| s >= 300),
        "worker grace period"
    );
    assert!(strings(&worker["containers"][0]["args"]).contains(&"--metrics-listen".to_owned()));
    let scaled = find("ScaledObject", "glia-worker");
    assert_eq!(
        scaled["spec"]["scaleTargetRef"]["name"].as_str(),
        Some("glia-worker")
    );
    let trigger = &scaled["spec"]["triggers"][0];
    assert_eq!(trigger["type"].as_str(), Some("rabbitmq"));
    assert_eq!(trigger["metadata"]["mode"].as_str(), Some("QueueLength"));
    assert_eq!(
        trigger["metadata"]["queueName"].as_str(),
        find("ConfigMap", "glia")["data"]["GLIA_QUEUE"].as_str()
    );
}
