//! `glia runs list` and `glia runs get` against a real dispatcher (HTTP on
//! a loopback port, the in-memory log): filters as flags, newest first,
//! `--all` following cursors, the table and `--json`, a run's fields.

use std::sync::Arc;

use glia_backends::memory::{MemoryLedger, MemoryLog, MemoryQueue};
use glia_dispatcher::{App, Auth};
use serde_json::{Value, json};

use crate::common::glia;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_list_filters_pages_and_prints_a_table_or_json() {
    let app = App::new(
        Arc::new(MemoryLog::default()),
        Arc::new(MemoryQueue::default()),
        Arc::new(MemoryLedger::default()),
        Auth::open(),
    );
    let server = crate::common::serve(app).await;
    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for i in 0..5 {
        let tags = if i % 2 == 0 {
            json!(["even"])
        } else {
            json!([])
        };
        let created: Value = http
            .post(format!("{server}/v1/runs"))
            .json(
                &json!({"goal": format!("refund order {i}\n\u{1b}[31mred"), "tags": tags,
                          "metadata": {"order": i.to_string()}}),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        ids.push(created["run_id"].as_str().unwrap().to_owned());
    }

    // JSON Lines, newest first, every page with --all.
    let out = glia(
        &["runs", "list", "--json", "--all", "--limit", "2"],
        &server,
    )
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["run_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!(listed, newest_first);

    // One page: the next cursor on stderr, and it gives the next page.
    let out = glia(&["runs", "list", "--json", "--limit", "2"], &server).await;
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let cursor = stderr
        .split("--cursor ")
        .nth(1)
        .unwrap_or_else(|| panic!("no cursor: {stderr}"))
        .trim()
        .to_owned();
    let out = glia(
        &[
            "runs", "list", "--json", "--limit", "2", "--cursor", &cursor,
        ],
        &server,
    )
    .await;
    let page: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(page[0]["run_id"].as_str(), Some(newest_first[2].as_str()));

    // Filters as flags.
    let out = glia(
        &[
            "runs", "list", "--json", "--tag", "even", "--meta", "order=2",
        ],
        &server,
    )
    .await;
    let only: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(only.len(), 1);
    assert_eq!(only[0]["run_id"].as_str(), Some(ids[2].as_str()));

    // The table: a header, one line per run, control characters gone.
    let out = glia(&["runs", "list", "--tag", "even"], &server).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    for column in [
        "RUN", "STATUS", "AGENT", "STEPS", "TOKENS", "COST", "DURATION", "STARTED", "GOAL",
    ] {
        assert!(lines[0].contains(column), "{table}");
    }
    assert!(
        lines[1].contains(&ids[4]) && lines[1].contains("refund order 4"),
        "{table}"
    );
    assert!(
        lines[1].contains("$0.00") && lines[1].contains("runnable"),
        "{table}"
    );
    assert!(
        !table.contains('\u{1b}'),
        "no escape sequence reaches the terminal"
    );

    // A bad flag value is refused before anything is sent.
    let out = glia(&["runs", "list", "--status", "sleeping"], &server).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("sleeping"));

    // One run's fields.
    let out = glia(&["runs", "get", &ids[1]], &server).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for line in [
        "status      runnable",
        "metadata    order=1",
        "cost        $0.00",
        "tokens      0 input, 0 output, 0 cache write, 0 cache read",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}");
    }
    assert!(
        text.contains(&format!("trace id    {}", ids[1].replace('-', ""))),
        "{text}"
    );
    let out = glia(&["runs", "get", "--json", &ids[1]], &server).await;
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["metadata"], json!({"order": "1"}));
}
