//! `glia schedules create|list|get|pause|unpause|backfill|delete` against a
//! real dispatcher (HTTP on a loopback port, the in-memory stores): a
//! schedule made from flags, its next fire times in UTC and in its zone,
//! pause and unpause, a backfill's runs, delete; a bad cron expression
//! fails naming the field.

use serde_json::Value;

use crate::common::{dispatcher, glia, ok};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_commands_create_show_pause_backfill_and_delete() {
    let (log, server) = dispatcher().await;

    let created = ok(&glia(
        &[
            "schedules",
            "create",
            "--name",
            "nightly",
            "--cron",
            "30 2 * * *",
            "--time-zone",
            "Europe/Berlin",
            "--goal",
            "Reconcile {{ fire_time }}",
            "--overlap",
            "buffer_one",
            "--json",
        ],
        &server,
    )
    .await);
    let created: Value = serde_json::from_str(&created).unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(created["definition"]["overlap"], "buffer_one");

    let shown = ok(&glia(&["schedules", "get", &id], &server).await);
    assert!(
        shown.contains("cron \"30 2 * * *\" Europe/Berlin"),
        "{shown}"
    );
    assert!(shown.contains("next fire times"), "{shown}");
    assert!(
        shown.matches("T02:30:00+0").count() + shown.matches("T03:00:00+02:00").count() >= 5,
        "five fire times in the zone: {shown}"
    );

    let listed = ok(&glia(&["schedules", "list"], &server).await);
    assert!(
        listed.contains(&id) && listed.contains("nightly"),
        "{listed}"
    );

    ok(&glia(&["schedules", "pause", &id], &server).await);
    let paused: Value =
        serde_json::from_str(&ok(
            &glia(&["schedules", "get", &id, "--json"], &server).await
        ))
        .unwrap();
    assert_eq!(paused["paused"], true);
    ok(&glia(&["schedules", "unpause", &id], &server).await);

    let now = chrono::Utc::now();
    let to = (now - chrono::Duration::days(1)).to_rfc3339();
    let from = (now - chrono::Duration::days(4)).to_rfc3339();
    let backfilled: Value = serde_json::from_str(&ok(&glia(
        &[
            "schedules",
            "backfill",
            &id,
            "--from",
            &from,
            "--to",
            &to,
            "--json",
        ],
        &server,
    )
    .await))
    .unwrap();
    let runs = backfilled["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "{backfilled}");
    for r in runs {
        let run = r["run_id"].as_str().unwrap().parse().unwrap();
        let summary = glia_backends::RunLog::get_run(&*log, run).await.unwrap();
        assert_eq!(summary.metadata["schedule_id"], id);
    }

    ok(&glia(&["schedules", "delete", &id], &server).await);
    let gone = glia(&["schedules", "get", &id], &server).await;
    assert!(!gone.status.success());
    assert!(String::from_utf8_lossy(&gone.stderr).contains("schedule_not_found"));

    let bad = glia(
        &[
            "schedules",
            "create",
            "--name",
            "bad",
            "--cron",
            "61 * * * *",
            "--goal",
            "g",
        ],
        &server,
    )
    .await;
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("422") && err.contains("cron"), "{err}");
}
