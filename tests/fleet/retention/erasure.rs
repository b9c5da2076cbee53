//! See the [module](super): erasure leaves no content anywhere.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use glia_testkit::fleet::{Api, Fleet, free_port, http};
use serde_json::{Value, json};
use uuid::Uuid;

/// A string found nowhere unless this test put it there.
fn canary() -> String {
    format!("canary{}", Uuid::now_v7().simple())
}

/// The scripted model: asks the customer (an external tool) with the
/// canary in its arguments, asks for a refund (approval; the approver
/// edits it with the canary), then answers with the canary. The batch
/// item's model answers with it at once.
fn scripts(c: &str) -> Vec<(&'static str, Value)> {
    vec![
        (
            "canary",
            json!([
                {"tool_calls": [{"name": "ask_customer", "input": {"question": format!("{c} which order?")}}]},
                {"tool_calls": [{"name": "refund_order", "input": {"order_id": "A1"}}]},
                {"text": format!("Done: {c} refunded.")}
            ]),
        ),
        (
            "canary_batch",
            json!([{"text": format!("Batch answer {c}.")}]),
        ),
    ]
}

fn config() -> Value {
    json!({
        "model": "script:canary",
        "policies": [{"tool": "refund_order", "action": {"kind": "require_approval"}}],
        "external_tools": [{"name": "ask_customer", "description": "Ask the customer.", "input_schema": {"type": "object"}, "external": true}],
    })
}

/// The body of `GET url` as text (JSON Lines answers included).
fn text(url: &str) -> String {
    let answer = reqwest::blocking::get(url).expect("GET answers");
    assert!(answer.status().is_success(), "{url}: {}", answer.status());
    answer.text().expect("a text body")
}

/// What erasure must leave alone: each event's seq, type, time, and the
/// spend and counts it carries.
fn shape(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .map(|e| {
            let d = &e["data"];
            json!([
                e["seq"],
                e["type"],
                e["at"],
                d["usage"],
                d["cost_usd_micros"],
                d["duration_ms"],
                d["call_id"],
                d["tool"],
                d["name"]
            ])
        })
        .collect()
}

/// What the exercise left to check: the runs, the batch, the events
/// before erasure.
struct Driven {
    run: String,
    batch: String,
    batch_run: String,
    before: Vec<(String, Vec<Value>)>,
}

/// Drive the canary run and the batch run to done through `api`, then
/// erase both through the API (twice: idempotent).
fn exercise(api: &Api, c: &str) -> Driven {
    let deadline = Instant::now() + Duration::from_secs(120);
    let run = api.submit(&format!("Please help {c} with a refund."), config());
    // Each call is answered once (a view read before the worker applied
    // an answer still shows the call waiting).
    let mut answered = std::collections::HashSet::new();
    loop {
        assert!(Instant::now() < deadline, "the run did not finish");
        let (_, view) = api.get(&format!("/v1/runs/{run}"));
        if view["status"] == "done" {
            assert_eq!(view["outcome"]["kind"], "succeeded", "{view}");
            break;
        }
        let pp = &view["pull_point"];
        let call = pp["call_ids"][0].as_str().unwrap_or_default().to_owned();
        if view["status"] != "parked" || !answered.insert(call.clone()) {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let (status, body) = match pp["kind"].as_str() {
            Some("awaiting_tool") => api.post(
                &format!("/v1/runs/{run}/tool-results/{call}"),
                json!({"content": format!("The customer {c} says order A1.")}),
            ),
            Some("awaiting_approval") => api.post(
                &format!("/v1/runs/{run}/approvals/{call}"),
                json!({"decision": "edit", "input": {"order_id": format!("A1 {c}")}}),
            ),
            other => panic!("unexpected pull point {other:?}: {view}"),
        };
        assert!(status < 300, "{status} {body}");
    }
    let (status, batch) = api.post(
        "/v1/batches",
        json!({"config": {"model": "script:canary_batch"}, "items": [{"custom_id": "item-1", "goal": format!("Batch goal {c}.")}]}),
    );
    assert_eq!(status, 201, "{batch}");
    let batch = batch["id"].as_str().unwrap().to_owned();
    let batch_run = loop {
        assert!(Instant::now() < deadline, "the batch did not finish");
        let results = text(&format!("{}/v1/batches/{batch}/results", api.server));
        let line: Option<Value> = results.lines().find_map(|l| serde_json::from_str(l).ok());
        match line {
            Some(item) if item["status"] == "succeeded" => {
                break item["run_id"].as_str().unwrap().to_owned();
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let mut before = Vec::new();
    for id in [&run, &batch_run] {
        let events = api.events(id);
        assert!(
            serde_json::to_string(&events).unwrap().contains(c),
            "the canary is in the log before erasure (the search below can fail)"
        );
        before.push((id.clone(), events));
    }
    let everything = serde_json::to_string(&before[0].1).unwrap();
    for kind in [
        "tool.call",
        "tool.result",
        "approval.resolved",
        "session.complete",
    ] {
        assert!(everything.contains(kind), "the run has a {kind}");
    }
    for id in [&run, &batch_run] {
        let url = format!("{}/v1/runs/{id}", api.server);
        let (status, erased) = http("DELETE", &url, None).unwrap();
        assert_eq!(status, 200, "{erased}");
        assert!(erased["erased_at"].is_string(), "{erased}");
        let (status, again) = http("DELETE", &url, None).unwrap();
        assert_eq!((status, &again), (200, &erased), "idempotent");
    }
    Driven {
        run,
        batch,
        batch_run,
        before,
    }
}

/// After erasure: the API answers nothing of the canary, and every log
/// keeps its shape (seq, kinds, times, usage, cost, ids).
fn check_api(api: &Api, d: &Driven, c: &str) {
    for (id, before) in &d.before {
        let after = api.events(id);
        assert_eq!(after.len(), before.len(), "event count unchanged");
        assert_eq!(
            shape(&after),
            shape(before),
            "seqs, kinds, times, usage, cost unchanged"
        );
        let body = serde_json::to_string(&after).unwrap();
        assert!(
            !body.contains(c),
            "the canary in the events of {id}: {body}"
        );
        assert!(body.contains(glia_proto::TOMBSTONE));
    }
    for path in [
        format!("/v1/runs/{}", d.run),
        format!("/v1/runs/{}", d.batch_run),
        "/v1/runs?limit=100".to_owned(),
        "/v1/approvals".to_owned(),
        "/v1/approvals/history".to_owned(),
        format!("/v1/batches/{}", d.batch),
        format!("/v1/batches/{}/results", d.batch),
    ] {
        let body = text(&format!("{}{path}", api.server));
        assert!(!body.contains(c), "the canary in {path}: {body}");
    }
}

/// `haystack` must not hold the canary; `what` names where it looked.
fn absent(haystack: &str, c: &str, what: &str) {
    if let Some(at) = haystack.find(c) {
        let from = haystack[..at]
            .char_indices()
            .rev()
            .nth(200)
            .map_or(0, |(i, _)| i);
        let to = (at + 200).min(haystack.len());
        let to = (to..haystack.len())
            .find(|i| haystack.is_char_boundary(*i))
            .unwrap_or(haystack.len());
        panic!("the canary is in {what}: …{}…", &haystack[from..to]);
    }
}

fn export(args: &[&str], out: &Path) -> String {
    let status = Command::new(glia_testkit::bin::glia_bin())
        .arg("export")
        .args(args)
        .args(["--out", out.to_str().unwrap()])
        .stdin(Stdio::null())
        .status()
        .expect("glia export runs");
    assert!(status.success(), "glia export failed");
    std::fs::read_to_string(out).expect("the export")
}

#[test]
fn an_erased_run_leaves_no_content_anywhere_in_the_fleet() {
    let c = canary();
    let mut fleet = Fleet::new(&scripts(&c));
    fleet.extra_env.push(("RUST_LOG".into(), "info".into()));
    fleet.start_dispatcher();
    fleet.start_worker(5_000);
    let d = exercise(&fleet, &c);
    check_api(&fleet, &d, &c);

    // Every table, as pg_dump writes it (bytea as hex), and every bytea
    // column (blobs, raw payloads and states) searched as bytes.
    let dump = Command::new("pg_dump")
        .args(["--data-only", &fleet.db_url])
        .output()
        .expect("pg_dump runs");
    assert!(dump.status.success());
    let dump = String::from_utf8_lossy(&dump.stdout).into_owned();
    assert!(dump.contains(&d.run), "the dump holds the run");
    absent(&dump, &c, "the database");
    let columns = glia_testkit::fleet::psql(
        &fleet.db_url,
        "SELECT table_name || '.' || column_name FROM information_schema.columns WHERE table_schema = 'public' AND data_type = 'bytea'",
    );
    assert!(columns.contains("blobs.bytes"), "{columns}");
    for tc in columns.lines() {
        let (table, column) = tc.split_once('.').unwrap();
        let found = glia_testkit::fleet::psql(
            &fleet.db_url,
            &format!(
                "SELECT count(*) FROM {table} WHERE position(convert_to('{c}', 'UTF8') in {column}) > 0"
            ),
        );
        assert_eq!(found, "0", "the canary is in {tc}");
    }
    // The append-only trigger still refuses a plain update.
    let refused = Command::new("psql")
        .args([
            &fleet.db_url,
            "-v",
            "ON_ERROR_STOP=1",
            "-qAtc",
            "UPDATE events SET payload = payload",
        ])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("append-only"));

    // Redis: every key of the fleet, values read.
    let keys = Command::new("redis-cli")
        .args([
            "-u",
            &glia_testkit::fleet::redis_url(),
            "--scan",
            "--pattern",
            &format!("{}:*", fleet.name),
        ])
        .output()
        .unwrap();
    for key in String::from_utf8_lossy(&keys.stdout).lines() {
        absent(key, &c, "a Redis key");
        let value = Command::new("redis-cli")
            .args([
                "-u",
                &glia_testkit::fleet::redis_url(),
                "--no-raw",
                "DUMP",
                key,
            ])
            .output()
            .unwrap();
        absent(
            &String::from_utf8_lossy(&value.stdout),
            &c,
            &format!("Redis key {key}"),
        );
    }

    let out = fleet.dir.join("export.jsonl");
    let exported = export(&["--database-url", &fleet.db_url], &out);
    assert!(exported.contains(&d.run) && exported.contains("\"erased\""));
    absent(&exported, &c, "the export");

    let logs = ["dispatcher", "w0"]
        .iter()
        .map(|role| std::fs::read_to_string(fleet.log_file(role)).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(logs.contains("run content erased"), "the erasure is logged");
    absent(&logs, &c, "the dispatcher's and worker's logs");
}

/// `glia serve` on `data`, its stderr in `log`; killed when dropped.
struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn an_erased_run_leaves_no_content_anywhere_on_the_single_node() {
    let c = canary();
    let dir = std::env::temp_dir().join(format!("glia-erasure-{}", Uuid::now_v7().simple()));
    std::fs::create_dir_all(dir.join("scripts")).unwrap();
    for (name, turns) in scripts(&c) {
        std::fs::write(
            dir.join("scripts").join(format!("{name}.json")),
            turns.to_string(),
        )
        .unwrap();
    }
    let data = dir.join("node.db");
    let server = format!("http://127.0.0.1:{}", free_port());
    let log = dir.join("node.log");
    let node = Node(
        Command::new(glia_testkit::bin::glia_bin())
            .args(["serve", "--demo", "--data", data.to_str().unwrap()])
            .args(["--listen", server.trim_start_matches("http://")])
            .args(["--scripts", dir.join("scripts").to_str().unwrap()])
            .env("RUST_LOG", "info")
            .env("GLIA_DEMO_EFFECTS", dir.join("effects"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let api = Api {
        name: "node".into(),
        dir: dir.clone(),
        server: server.clone(),
        token: None,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !http("GET", &format!("{server}/readyz"), None).is_ok_and(|(s, _)| s == 200) {
        assert!(Instant::now() < deadline, "glia serve did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let d = exercise(&api, &c);
    check_api(&api, &d, &c);
    drop(node);

    // Every table of the file, every column as text (blobs read as UTF-8).
    let conn = rusqlite::Connection::open(&data).unwrap();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(tables.iter().any(|t| t == "held_results"), "{tables:?}");
    let mut rows = 0;
    for table in &tables {
        let mut st = conn.prepare(&format!("SELECT * FROM \"{table}\"")).unwrap();
        let n = st.column_count();
        let mut q = st.query([]).unwrap();
        while let Some(row) = q.next().unwrap() {
            rows += 1;
            for i in 0..n {
                let cell = match row.get_ref(i).unwrap() {
                    rusqlite::types::ValueRef::Text(t) | rusqlite::types::ValueRef::Blob(t) => {
                        String::from_utf8_lossy(t).into_owned()
                    }
                    _ => continue,
                };
                absent(&cell, &c, &format!("table {table}"));
            }
        }
    }
    assert!(rows > 20, "the tables hold the runs ({rows} rows)");
    let refused = conn.execute("UPDATE events SET payload = payload", []);
    assert!(
        refused.is_err_and(|e| e.to_string().contains("append-only")),
        "the append-only trigger still refuses a plain update"
    );
    drop(conn);

    let exported = export(
        &["--data", data.to_str().unwrap()],
        &dir.join("export.jsonl"),
    );
    assert!(exported.contains(&d.run) && exported.contains("\"erased\""));
    absent(&exported, &c, "the export");
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(logs.contains("run content erased"), "the erasure is logged");
    absent(&logs, &c, "the node's log");
    let _ = std::fs::remove_dir_all(&dir);
}
