//! Erasure through the API (`DELETE /v1/runs/{id}`: scope, tenancy,
//! refusals, idempotence) and the retention sweeper on the in-memory twin,
//! SQLite and Postgres: an old finished run is erased, a newer one, a
//! running one and another tenant's are left.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use chrono::Utc;
use common::*;
use glia_backends::memory::{MemoryLedger, MemoryLog, MemoryQueue};
use glia_backends::sqlite::{SqliteLog, SqliteOptions};
use glia_backends::testkit::TestDb;
use glia_backends::{EventLog, NewRun, RunLog};
use glia_dispatcher::retention::{RETENTION_BY, Retention, sweep_once};
use glia_dispatcher::{App, Auth, Principal, Scope};
use glia_proto::{Event, EventKind, RunConfig, TOMBSTONE};
use serde_json::json;
use uuid::Uuid;

const ERASE_A: &str = "tok-erase-a";
const ERASE_B: &str = "tok-erase-b";

fn auth_with_erasers() -> Auth {
    let p = |t: &str, s: &[Scope], name: &str| Principal {
        tenant: t.into(),
        scopes: s.to_vec(),
        name: Some(name.into()),
    };
    Auth::from_tokens([
        (SUB_A.to_owned(), p("a", &[Scope::Submit], "sub")),
        (ERASE_A.to_owned(), p("a", &[Scope::Erase], "dpo-a")),
        (
            ERASE_B.to_owned(),
            p("b", &[Scope::Erase, Scope::Submit], "dpo-b"),
        ),
    ])
    .unwrap()
}

async fn delete(h: &H, id: Uuid, token: &str) -> Reply {
    send(
        &h.router,
        request(Method::DELETE, &format!("/v1/runs/{id}"), Some(token), None),
    )
    .await
}

#[tokio::test]
async fn delete_erases_a_finished_run_once_for_its_tenant_with_the_erase_scope() {
    let h = harness_with(auth_with_erasers());
    let id = create(
        &h,
        SUB_A,
        json!({"goal": "refund the card of Alice Secretname"}),
    )
    .await;
    let r = delete(&h, id, SUB_A).await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::FORBIDDEN, "forbidden"),
        "submit is not enough"
    );
    let r = delete(&h, id, ERASE_A).await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::CONFLICT, "run_not_finished"),
        "{}",
        r.text
    );
    finish(&*h.log, id).await;
    let events_before = get(&h, &format!("/v1/runs/{id}/events"), SUB_A).await.body;
    let r = delete(&h, id, ERASE_B).await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::NOT_FOUND, "run_not_found"),
        "another tenant's run is not there"
    );
    let r = delete(&h, Uuid::now_v7(), ERASE_A).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    let r = delete(&h, id, ERASE_A).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["goal"], TOMBSTONE);
    assert_eq!(r.body["erased_by"], "dpo-a");
    let erased_at = r.body["erased_at"].clone();
    assert!(erased_at.is_string(), "{}", r.text);
    let again = delete(&h, id, ERASE_A).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body, r.body, "idempotent: the first erasure's record");

    let view = get(&h, &format!("/v1/runs/{id}"), SUB_A).await;
    assert_eq!(view.body["erased_at"], erased_at);
    let events = get(&h, &format!("/v1/runs/{id}/events"), SUB_A).await;
    assert!(!events.text.contains("Secretname"), "{}", events.text);
    assert!(!view.text.contains("Secretname"), "{}", view.text);
    let kinds = |page: &serde_json::Value| -> Vec<(u64, String, String)> {
        page["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["seq"].as_u64().unwrap(),
                    e["type"].as_str().unwrap().to_owned(),
                    e["at"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    assert_eq!(
        kinds(&events.body),
        kinds(&events_before),
        "seqs, kinds, times stay"
    );
    let metrics = send(&h.router, request(Method::GET, "/metrics", None, None)).await;
    assert!(
        metrics
            .text
            .lines()
            .any(|l| l == "glia_dispatcher_runs_erased_total 1"),
        "counted once"
    );
}

/// A run of `tenant` admitted at `seq 1` and, unless `running`, finished.
async fn run_of(log: &dyn RunLog, tenant: &str, running: bool) -> Uuid {
    let run_id = Uuid::now_v7();
    let start = Event {
        run_id,
        seq: 1,
        at: Utc::now(),
        kind: EventKind::SessionStart {
            goal: format!("private goal of {tenant}"),
            config: RunConfig::default(),
            redactions: Vec::new(),
        },
    };
    log.create_run(NewRun {
        tenant: tenant.into(),
        idempotency_key: None,
        batch_id: None,
        tags: Vec::new(),
        metadata: Default::default(),
        custom_id: None,
        start,
        parent_run_id: None,
        parent_call_id: None,
        depth: 0,
    })
    .await
    .unwrap();
    if !running {
        finish(log, run_id).await;
    }
    run_id
}

async fn sweeper_contract(log: Arc<dyn EventLog>) {
    let period = Duration::from_secs(3600);
    let app = App::new(
        log.clone(),
        Arc::new(MemoryQueue::default()),
        Arc::new(MemoryLedger::default()),
        Auth::open(),
    )
    .with_retention(Retention {
        tenants: BTreeMap::from([("a".to_owned(), period)]),
        ..Retention::default()
    });
    let old = run_of(&*log, "a", false).await;
    let other_tenant = run_of(&*log, "b", false).await;
    let running = run_of(&*log, "a", true).await;
    let mut newer = run_of(&*log, "a", false).await;
    let old_at = log.get_run(old).await.unwrap().updated_at;
    while log.get_run(newer).await.unwrap().updated_at <= old_at {
        newer = run_of(&*log, "a", false).await;
    }
    let newer_at = log.get_run(newer).await.unwrap().updated_at;
    // Now is when `newer` turns one period old: `old` is past its period.
    let now = newer_at + chrono::Duration::from_std(period).unwrap();
    assert_eq!(sweep_once(&app, now).await.unwrap(), 1);
    let erased = log.get_run(old).await.unwrap();
    assert_eq!(
        (erased.erased_by.as_deref(), erased.goal.as_str()),
        (Some(RETENTION_BY), TOMBSTONE)
    );
    for (kept, what) in [
        (newer, "a newer finished run"),
        (running, "a running run"),
        (other_tenant, "another tenant's run (no period)"),
    ] {
        let run = log.get_run(kept).await.unwrap();
        assert_eq!(run.erased_at, None, "{what} is kept");
        assert!(run.goal.starts_with("private goal"), "{what}");
    }
    assert_eq!(
        sweep_once(&app, now).await.unwrap(),
        0,
        "a second sweep (another dispatcher's) erases nothing more"
    );
    // With a default period, every other tenant's old runs go too.
    let app = app.with_retention(Retention {
        default: Some(period),
        tenants: BTreeMap::from([("a".to_owned(), period * 1000)]),
        ..Retention::default()
    });
    let later = Utc::now() + chrono::Duration::from_std(period * 2).unwrap();
    assert_eq!(sweep_once(&app, later).await.unwrap(), 1);
    assert!(log.get_run(other_tenant).await.unwrap().erased_at.is_some());
    assert!(
        log.get_run(newer).await.unwrap().erased_at.is_none(),
        "a's own, longer period holds"
    );
}

#[tokio::test]
async fn the_sweeper_erases_old_finished_runs_on_the_memory_log() {
    sweeper_contract(Arc::new(MemoryLog::default())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_erases_old_finished_runs_on_sqlite() {
    let dir = std::env::temp_dir().join(format!("glia-retention-{}", Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = SqliteLog::open(dir.join("glia.db"), SqliteOptions::default())
        .await
        .unwrap();
    sweeper_contract(Arc::new(log)).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_sweeper_erases_old_finished_runs_on_postgres() {
    let db = TestDb::new().await;
    sweeper_contract(Arc::new(db.log().await)).await;
}

#[test]
fn a_retention_file_is_read_strictly() {
    let r =
        Retention::from_json(r#"{"default_days": 90, "tenants": {"acme": {"days": 30}}}"#).unwrap();
    assert_eq!(r.default, Some(Duration::from_secs(90 * 86_400)));
    assert_eq!(r.tenants["acme"], Duration::from_secs(30 * 86_400));
    assert!(Retention::from_json("{}").unwrap().default.is_none());
    let e = Retention::from_json(r#"{"tenants": {"acme": {"dayz": 3}}}"#).unwrap_err();
    assert!(e.contains("tenants.acme"), "{e}");
    let e = Retention::from_json(r#"{"default_days": 0}"#).unwrap_err();
    assert!(e.contains("default_days"), "{e}");
}
