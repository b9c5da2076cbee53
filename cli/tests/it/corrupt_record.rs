//! A corrupt row is the store's final answer, not an outage: the dispatcher
//! answers 500 `corrupt_record` (not 503 "retry later"), and `glia` reports
//! it at once instead of retrying for `--max-outage-secs` (two minutes by
//! default). Real Postgres (a database of its own); needs `GLIA_DATABASE_URL`
//! or the local default.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use glia_backends::memory::{MemoryLedger, MemoryQueue};
use glia_backends::testkit::TestDb;
use glia_dispatcher::{App, Auth};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_row_answers_500_and_is_not_retried() {
    let db = TestDb::new().await;
    let log = Arc::new(db.log().await);
    let app = App::new(
        log,
        Arc::new(MemoryQueue::default()),
        Arc::new(MemoryLedger::default()),
        Auth::open(),
    );
    let server = crate::common::serve(app).await;

    let http = reqwest::Client::new();
    let created: serde_json::Value = http
        .post(format!("{server}/v1/runs"))
        .json(&serde_json::json!({"goal": "refund order 7"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run_id: uuid::Uuid = created["run_id"].as_str().unwrap().parse().unwrap();

    // A phase no build of glia writes.
    let sql = db.sql().await;
    let changed = sql
        .execute(
            "UPDATE runs SET phase = 'not-a-phase' WHERE id = $1",
            &[&run_id],
        )
        .await
        .unwrap();
    assert_eq!(changed, 1);

    let resp = http
        .get(format!("{server}/v1/runs/{run_id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 500);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "corrupt_record", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("column phase"), "{message}");
    assert!(
        !message.contains("not-a-phase"),
        "the stored value stays out of the answer: {message}"
    );

    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_glia"))
            .args(["runs", "get", "--server", &server, &run_id.to_string()])
            .env_remove("GLIA_TOKEN")
            .env("GLIA_MAX_OUTAGE_SECS", "120")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("corrupt_record"), "{stderr}");
    assert!(
        took < Duration::from_secs(20),
        "glia gave up after {took:?}: a 500 is not an outage\n{stderr}"
    );
}
