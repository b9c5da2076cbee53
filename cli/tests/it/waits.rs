//! `glia submit --start-at` and `glia events post` against a real
//! dispatcher (HTTP on a loopback port, the in-memory stores): a delayed
//! run is admitted parked at `awaiting_timer` until its start time; an
//! event reaches the run waiting on its key, the same `--id` again is one
//! event, and a bad key or payload fails before anything is sent.

use glia_backends::conformance::waits::{park, waiting_log};
use glia_backends::{Inbox, RunLog, Waits};
use glia_dispatcher::OPEN_TENANT;
use glia_proto::wait::Wait;
use glia_proto::{Payload, PullPoint};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::common::{dispatcher, glia, ok};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_start_at_admits_a_run_parked_until_its_start() {
    let (log, server) = dispatcher().await;
    let at = chrono::Utc::now() + chrono::Duration::hours(2);
    let out = ok(&glia(
        &[
            "submit",
            "--detach",
            "--start-at",
            &at.to_rfc3339(),
            "reconcile later",
        ],
        &server,
    )
    .await);
    let run: Uuid = out.trim().parse().unwrap();
    let summary = log.get_run(run).await.unwrap();
    assert_eq!(
        summary.pull_point,
        Some(PullPoint::AwaitingTimer {
            call_ids: vec![],
            wake_at_ms: at.timestamp_millis()
        })
    );
    // Without --detach it says when the run starts and returns (a delayed
    // run parks at admission: there is nothing to follow until then).
    let out = glia(
        &["submit", "--start-at", &at.to_rfc3339(), "later"],
        &server,
    )
    .await;
    let run: Uuid = ok(&out).trim().parse().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains(&format!("run {run} starts at ")), "{said}");
    let bad = glia(&["submit", "--start-at", "tomorrow", "g"], &server).await;
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("RFC 3339"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_post_reaches_the_waiting_run_once() {
    let (log, server) = dispatcher().await;
    let run = Uuid::now_v7();
    let key = "order/9:signed";
    let now = chrono::Utc::now().timestamp_millis();
    let wait = Wait::Event {
        key: key.into(),
        started_at_ms: now,
        timeout_at_ms: now + 3_600_000,
    };
    let events = waiting_log(run, "wait_for_event", json!({ "key": key }), wait);
    park(&*log, OPEN_TENANT, &events).await;

    let id = Uuid::now_v7().to_string();
    let args = [
        "events",
        "post",
        key,
        r#"{"by": "ann"}"#,
        "--id",
        &id,
        "--json",
    ];
    let first: Value = serde_json::from_str(&ok(&glia(&args, &server).await)).unwrap();
    assert_eq!(first["delivered"], 1, "{first}");
    assert_eq!(first["duplicate"], false, "{first}");
    let again: Value = serde_json::from_str(&ok(&glia(&args, &server).await)).unwrap();
    assert_eq!(
        again["duplicate"], true,
        "the same id is one event: {again}"
    );
    let wakes: Vec<Payload> = log
        .inbox(run)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.payload)
        .collect();
    assert!(
        matches!(&wakes[..], [Payload::Wake { event: Some(e), .. }] if e.payload == json!({"by": "ann"})),
        "{wakes:?}"
    );

    for (bad, says) in [
        (vec!["events", "post", "order 9"], "key"),
        (vec!["events", "post", "order/9", "{not json"], "not JSON"),
    ] {
        let out = glia(&bad, &server).await;
        assert!(!out.status.success(), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{bad:?}: {err}");
    }
    assert_eq!(
        log.forget_events(i64::MAX).await.unwrap(),
        1,
        "only the one good event was kept"
    );
}
