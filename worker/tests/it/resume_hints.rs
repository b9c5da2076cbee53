//! Resume hints: a payload posted to a parked run on Postgres reaches the
//! worker that let go of it last by `NOTIFY`, ahead of the queue. Here the
//! outbox is never relayed after the start, so a run can only resume
//! through its hint; the hint listener's connection is killed in between
//! and must come back on its own. The job queue is the in-memory twin (only
//! the start goes through it); the log is a real Postgres database.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::Add;
use glia_agent::Agent;
use glia_agent::provider::{ScriptLibrary, ScriptedTurn};
use glia_agent::tool::ToolRegistry;
use glia_backends::memory::{MemoryLedger, MemoryQueue};
use glia_backends::postgres::{PgOptions, hint_channel};
use glia_backends::testkit::TestDb;
use glia_backends::{Inbox, JobQueue, NewRun, Outbox, RunLog};
use glia_proto::{
    Decision, Event, EventKind, Payload, Policy, PolicyAction, PullPoint, RunConfig, RunState,
};
use glia_worker::consumer::{Worker, WorkerOptions};
use serde_json::json;
use tokio::sync::watch;
use uuid::Uuid;

/// Poll (every 10 ms, at most 20 s: a bound on a hang) until `check` holds.
async fn until(
    log: &dyn RunLog,
    run_id: Uuid,
    what: &str,
    check: impl Fn(&RunState) -> bool,
) -> RunState {
    for _ in 0..2000 {
        let state = log.load(run_id).await.unwrap();
        if check(&state) {
            return state;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("run {run_id}: never {what}");
}

/// Wait until one connection listens on `channel` (its last statement is
/// the `LISTEN`).
async fn listening(db: &TestDb, channel: &str) {
    let sql = db.sql().await;
    let q =
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = $1";
    for _ in 0..1000 {
        let n: i64 = sql
            .query_one(q, &[&format!("LISTEN {channel}")])
            .await
            .unwrap()
            .get(0);
        if n == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("nothing listens on {channel}");
}

/// Approve the call the run waits on.
async fn approve(log: &dyn Inbox, state: &RunState) {
    let Some(PullPoint::AwaitingApproval { call_ids }) = &state.parked else {
        panic!("not awaiting approval: {:?}", state.parked)
    };
    let c = state.call(&call_ids[0]).unwrap();
    let decision = Payload::Approval {
        call_id: c.call_id.clone(),
        args_hash: c.args_hash.clone(),
        decision: Decision::Approve,
        by: None,
        request_seq: None,
    };
    log.post(state.run_id, decision).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_posted_payload_resumes_the_run_through_its_hint_alone_even_after_the_listener_reconnects()
 {
    let db = TestDb::new().await;
    let pg = db
        .log_with(PgOptions {
            max_connections: 4,
            ..PgOptions::default()
        })
        .await;
    let log = Arc::new(pg.clone());
    let queue = Arc::new(MemoryQueue::default());
    let mut scripts = ScriptLibrary::default();
    let add = |a: i64| ScriptedTurn::call("add", json!({"a": a, "b": 1}));
    scripts.insert("twice", vec![add(1), add(2), ScriptedTurn::text("done")]);
    let mut tools = ToolRegistry::default();
    tools.register(Add);
    let agent = Arc::new(Agent::new(Arc::new(scripts)).with_tools(tools));
    let id = format!("w-hint-{}", Uuid::now_v7().simple());
    let options = WorkerOptions {
        id: id.clone(),
        concurrency: 2,
        lease_ttl: Duration::from_secs(30),
    };
    let worker = Worker::new(
        agent,
        log.clone(),
        queue.clone(),
        Arc::new(MemoryLedger::default()),
        options,
    )
    .with_hints(pg.resume_hints(&id));
    let (stop, stopped) = watch::channel(false);
    let worker = tokio::spawn(Arc::new(worker).run(stopped));

    let run_id = Uuid::now_v7();
    let mut config = RunConfig {
        model: "script:twice".into(),
        ..RunConfig::default()
    };
    config.policies.push(Policy {
        tool: "add".into(),
        args: None,
        action: PolicyAction::RequireApproval,
    });
    let start = Event {
        run_id,
        seq: 1,
        at: chrono::Utc::now(),
        kind: EventKind::SessionStart {
            redactions: Vec::new(),
            goal: "add twice".into(),
            config,
        },
    };
    log.create_run(NewRun {
        tenant: "t".into(),
        idempotency_key: None,
        batch_id: None,
        start,
        tags: Vec::new(),
        metadata: Default::default(),
        custom_id: None,
        parent_run_id: None,
        parent_call_id: None,
        depth: 0,
    })
    .await
    .unwrap();
    // Only the start is relayed; every later outbox job stays where it is.
    let (first, start_job) = log.outbox(10).await.unwrap().remove(0);
    queue.publish(&start_job).await.unwrap();
    log.outbox_done(&[first]).await.unwrap();

    let sql = db.sql().await;
    let parked = |s: &RunState| s.parked.is_some() && s.head_seq > 1;
    let state = until(&*log, run_id, "parked at its first approval", parked).await;
    // The lease is let go after the park (release_if_idle), keeping its owner as the last.
    for _ in 0..500 {
        let row = sql
            .query_opt(
                "SELECT last_owner FROM runs WHERE id = $1 AND lease_token IS NULL",
                &[&run_id],
            )
            .await
            .unwrap();
        if row.and_then(|r| r.get::<_, Option<String>>(0)).as_deref() == Some(id.as_str()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let channel = hint_channel(&id);
    listening(&db, &channel).await;
    approve(&*log, &state).await;
    let head = state.head_seq;
    let state = until(&*log, run_id, "parked at its second approval", |s| {
        parked(s) && s.head_seq > head
    })
    .await;
    let results = log
        .events(run_id, 0, 1000)
        .await
        .unwrap()
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ToolResult { .. }))
        .count();
    assert_eq!(results, 1, "the first call ran after its approval");

    // Kill the listener's connection: it reconnects on its own.
    let killed: i64 = sql
        .query_one("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() AND query = $1", &[&format!("LISTEN {channel}")])
        .await
        .unwrap()
        .get(0);
    assert_eq!(killed, 1, "one connection listened on {channel}");
    listening(&db, &channel).await;
    approve(&*log, &state).await;
    let state = until(&*log, run_id, "done after its second approval", |s| {
        s.outcome.is_some()
    })
    .await;
    assert!(
        matches!(&state.outcome, Some(glia_proto::Outcome::Succeeded { answer, .. }) if answer == "done"),
        "{:?}",
        state.outcome
    );
    assert_eq!(
        queue.depth().await.unwrap(),
        0,
        "nothing but the start went through the queue"
    );
    assert!(
        log.outbox(10).await.unwrap().len() >= 2,
        "the decisions' jobs are still in the outbox, never relayed"
    );
    let _ = stop.send(true);
    let _ = worker.await;
}
