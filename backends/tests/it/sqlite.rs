//! The single node's SQLite adapters: the event log contract (the same
//! conformance suite as Postgres and the twin), the job queue, what survives
//! closing and opening the file again, and the guards (one process per file,
//! append-only events). Each test works on a file in a directory of its own.

use std::time::Duration;

use glia_backends::conformance::{self, sample_log};
use glia_backends::sqlite::{SqliteLog, SqliteOptions};
use glia_backends::testkit::TempDir;
use glia_backends::{Approvals, Inbox, Job, JobQueue, Ledger, LogError, NewRun, RunLog};
use glia_proto::{Decision, Payload, RunState};
use uuid::Uuid;

const TTL: Duration = Duration::from_secs(30);

async fn open(dir: &TempDir) -> SqliteLog {
    SqliteLog::open(dir.db(), SqliteOptions::default())
        .await
        .expect("open the store")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_log_conformance() {
    let dirs = std::sync::Mutex::new(Vec::new());
    let fresh = || {
        let dir = TempDir::new();
        let path = dir.db();
        dirs.lock().unwrap().push(dir);
        async move {
            SqliteLog::open(path, SqliteOptions::default())
                .await
                .unwrap()
        }
    };
    conformance::all(fresh).await;
    conformance::listing::all(fresh).await;
    conformance::children::all(fresh).await;
}

#[tokio::test]
async fn a_second_process_cannot_open_the_same_file() {
    let dir = TempDir::new();
    let first = open(&dir).await;
    let err = SqliteLog::open(dir.db(), SqliteOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LogError::Unavailable(m) if m.contains("in use by another glia process")),
        "{err}"
    );
    drop(first);
    open(&dir).await;
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_named() {
    let dir = TempDir::new();
    std::fs::write(
        dir.db(),
        b"these are not the pages you are looking for, not at all, no",
    )
    .unwrap();
    let err = SqliteLog::open(dir.db(), SqliteOptions::default())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains(dir.db().to_str().unwrap()),
        "{err}"
    );
    let missing = dir.path().join("no/such/dir/node.db");
    assert!(
        SqliteLog::open(&missing, SqliteOptions::default())
            .await
            .unwrap_err()
            .to_string()
            .contains("no/such/dir")
    );
}

#[tokio::test]
async fn events_are_append_only() {
    let dir = TempDir::new();
    let log = open(&dir).await;
    let s = sample_log();
    log.create_run(NewRun {
        tenant: "t".into(),
        idempotency_key: None,
        batch_id: None,
        start: s.parked[0].clone(),
        tags: Vec::new(),
        metadata: Default::default(),
        custom_id: None,
        parent_run_id: None,
        parent_call_id: None,
        depth: 0,
    })
    .await
    .unwrap();
    drop(log);
    let conn = rusqlite::Connection::open(dir.db()).unwrap();
    for sql in ["UPDATE events SET kind = 'x'", "DELETE FROM events"] {
        let err = conn.execute(sql, []).unwrap_err();
        assert!(err.to_string().contains("append-only"), "{sql}: {err}");
    }
}

/// Everything committed is there after the file is closed and opened again:
/// runs, events, state, approvals, the inbox, cancellation flags, queued jobs.
#[tokio::test]
async fn what_was_committed_survives_a_restart() {
    let dir = TempDir::new();
    let s = sample_log();
    let decision;
    {
        let log = open(&dir).await;
        log.create_run(NewRun {
            tenant: "t".into(),
            idempotency_key: Some("k".into()),
            batch_id: None,
            start: s.parked[0].clone(),
            tags: Vec::new(),
            metadata: Default::default(),
            custom_id: None,
            parent_run_id: None,
            parent_call_id: None,
            depth: 0,
        })
        .await
        .unwrap();
        let lease = log.acquire(s.run_id, "w", TTL).await.unwrap();
        log.commit(
            &lease,
            &s.parked[1..],
            &RunState::replay(s.run_id, &s.parked).unwrap(),
            &[],
        )
        .await
        .unwrap();
        let approvals = log
            .approvals(&glia_backends::ApprovalFilter {
                run_id: Some(s.run_id),
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap();
        decision = Payload::Approval {
            call_id: "c1".into(),
            args_hash: approvals[0].args_hash.clone(),
            decision: Decision::Approve,
            by: None,
            request_seq: None,
        };
        log.post(s.run_id, decision.clone()).await.unwrap();
        log.ledger().cancel(s.run_id).await.unwrap();
        log.queue().publish(&Job::start(s.run_id, 9)).await.unwrap();
        // Lease held when the process "dies": it lapses, nothing releases it.
    }
    let log = open(&dir).await;
    assert_eq!(log.events(s.run_id, 0, 100).await.unwrap(), s.parked);
    assert_eq!(
        log.load(s.run_id).await.unwrap(),
        RunState::replay(s.run_id, &s.parked).unwrap()
    );
    assert_eq!(log.inbox(s.run_id).await.unwrap()[0].payload, decision);
    assert!(
        matches!(
            log.post(s.run_id, decision).await,
            Err(LogError::Duplicate { .. })
        ),
        "still decided once"
    );
    assert!(log.ledger().is_cancelled(s.run_id).await.unwrap());
    assert_eq!(
        log.ledger().signal(s.run_id).await.unwrap(),
        glia_backends::Signal {
            cancelled: true,
            paused: false
        }
    );
    log.ledger().set_paused(s.run_id, true).await.unwrap();
    assert_eq!(
        log.ledger().signal(s.run_id).await.unwrap(),
        glia_backends::Signal {
            cancelled: true,
            paused: true
        }
    );
    log.ledger().set_paused(s.run_id, false).await.unwrap();
    let delivery = log.queue().next().await.unwrap();
    assert_eq!(delivery.job, Job::start(s.run_id, 9));
    let s2 = sample_log();
    let (again, created) = log
        .create_run(NewRun {
            tenant: "t".into(),
            idempotency_key: Some("k".into()),
            batch_id: None,
            start: s2.parked[0].clone(),
            tags: Vec::new(),
            metadata: Default::default(),
            custom_id: None,
            parent_run_id: None,
            parent_call_id: None,
            depth: 0,
        })
        .await
        .unwrap();
    assert!(
        !created && again.run_id == s.run_id,
        "the idempotency key is remembered"
    );
}

/// A taken job is not handed out twice; ack removes it; nack requeues or
/// dead-letters it; a job taken by a process that died is ready again when
/// the file is opened next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_delivers_each_job_once_and_again_after_a_restart() {
    let dir = TempDir::new();
    let (a, b, c) = (
        Job::start(Uuid::now_v7(), 1),
        Job::start(Uuid::now_v7(), 2),
        Job::start(Uuid::now_v7(), 3),
    );
    {
        let log = open(&dir).await;
        let queue = log.queue();
        // A consumer waiting before the publish is woken by it.
        let waiting = tokio::spawn({
            let queue = queue.clone();
            async move {
                queue
                    .next()
                    .await
                    .map(|d| (d.job, d.redelivered, d.enqueued_at.is_some()))
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        for job in [a, b, c] {
            queue.publish(&job).await.unwrap();
        }
        let first = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken by the publish")
            .unwrap()
            .unwrap();
        assert_eq!(first, (a, false, true));
        let second = queue.next().await.unwrap();
        assert_eq!(second.job, b);
        second.acker.nack(true).await.unwrap();
        let again = queue.next().await.unwrap();
        assert_eq!((again.job, again.redelivered), (b, true));
        again.acker.nack(false).await.unwrap();
        let stats = queue.stats().await.unwrap();
        assert_eq!(
            (stats.ready, stats.dead_lettered),
            (1, Some(1)),
            "c ready, b dead-lettered, a taken"
        );
        let third = queue.next().await.unwrap();
        assert_eq!(third.job, c);
        third.acker.ack().await.unwrap();
        assert_eq!(queue.depth().await.unwrap(), 0);
        // `a` is taken and never acked: the process dies.
    }
    let log = open(&dir).await;
    let queue = log.queue();
    let d = queue.next().await.unwrap();
    assert_eq!(d.job, a, "taken, not acked: ready again");
    d.acker.ack().await.unwrap();
    let nothing = tokio::time::timeout(Duration::from_millis(700), queue.next()).await;
    assert!(
        nothing.is_err(),
        "acked and dead-lettered jobs are not delivered"
    );
}

/// Resumes go before starts (the queue contract), and a resume is still a
/// resume when the file is opened again: the kind is stored with the job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_go_first_and_stay_resumes_after_a_restart() {
    let dir = TempDir::new();
    let run = Uuid::now_v7();
    {
        let log = open(&dir).await;
        conformance::resumes_before_starts(&log.queue(), 50).await;
        for job in [Job::start(run, 1), Job::start(run, 2), Job::resume(run, 3)] {
            log.queue().publish(&job).await.unwrap();
        }
    }
    let log = open(&dir).await;
    let queue = log.queue();
    for job in [Job::resume(run, 3), Job::start(run, 1), Job::start(run, 2)] {
        let d = queue.next().await.unwrap();
        assert_eq!(
            d.job, job,
            "after the restart: the resume first, then the starts in order"
        );
        d.acker.ack().await.unwrap();
    }
}

/// A job nobody acks is dead-lettered after the delivery limit.
#[tokio::test]
async fn a_job_past_its_delivery_limit_is_dead_lettered() {
    let dir = TempDir::new();
    let log = SqliteLog::open(
        dir.db(),
        SqliteOptions {
            delivery_limit: 2,
            ..SqliteOptions::default()
        },
    )
    .await
    .unwrap();
    let queue = log.queue();
    let job = Job::start(Uuid::now_v7(), 1);
    queue.publish(&job).await.unwrap();
    for _ in 0..2 {
        queue.next().await.unwrap().acker.nack(true).await.unwrap();
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(700), queue.next())
            .await
            .is_err()
    );
    assert_eq!(queue.stats().await.unwrap().dead_lettered, Some(1));
}

/// A run moves from one file to another whole.
#[tokio::test]
async fn export_then_import_keeps_the_run_whole() {
    let (src_dir, dst_dir) = (TempDir::new(), TempDir::new());
    conformance::export_import_round_trip(&open(&src_dir).await, &open(&dst_dir).await).await;
}

/// Writes queued together are committed together, each in its own
/// savepoint: of concurrent identical decisions exactly one is accepted, of
/// concurrent commits on the same head exactly one wins, and the failures
/// leave nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_batched_together_fail_alone() {
    let dir = TempDir::new();
    let log = open(&dir).await;
    let s = sample_log();
    log.create_run(NewRun {
        tenant: "t".into(),
        idempotency_key: None,
        batch_id: None,
        start: s.parked[0].clone(),
        tags: Vec::new(),
        metadata: Default::default(),
        custom_id: None,
        parent_run_id: None,
        parent_call_id: None,
        depth: 0,
    })
    .await
    .unwrap();
    let lease = log.acquire(s.run_id, "w", TTL).await.unwrap();
    let state = RunState::replay(s.run_id, &s.parked).unwrap();
    let commits = (0..16).map(|_| log.commit(&lease, &s.parked[1..], &state, &[]));
    let won = futures::future::join_all(commits).await;
    assert_eq!(won.iter().filter(|r| r.is_ok()).count(), 1, "{won:?}");
    assert!(
        won.iter()
            .filter_map(|r| r.as_ref().err())
            .all(|e| matches!(e, LogError::Conflict { .. })),
        "{won:?}"
    );
    assert_eq!(log.events(s.run_id, 0, 100).await.unwrap(), s.parked);
    let hash = log
        .approvals(&glia_backends::ApprovalFilter {
            run_id: Some(s.run_id),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap()[0]
        .args_hash
        .clone();
    let decision = Payload::Approval {
        call_id: "c1".into(),
        args_hash: hash,
        decision: Decision::Approve,
        by: None,
        request_seq: None,
    };
    let posts = (0..16).map(|_| log.post(s.run_id, decision.clone()));
    let posted = futures::future::join_all(posts).await;
    assert_eq!(posted.iter().filter(|r| r.is_ok()).count(), 1, "{posted:?}");
    assert_eq!(log.inbox(s.run_id).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_batches_conformance() {
    let dir = TempDir::new();
    let log = open(&dir).await;
    conformance::batch_store(&log, &log).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_schedules_conformance() {
    let dir = TempDir::new();
    let log = open(&dir).await;
    conformance::schedules::all(&log).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_evals_conformance() {
    let dir = TempDir::new();
    let log = open(&dir).await;
    conformance::evals::all(&log).await;
}

/// A batch upload whose caller goes away mid-upload leaves nothing and holds
/// no idempotency key; one left by a process that died is deleted when the
/// file is opened next; a submitted batch and its items survive a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_uploads_are_whole_across_dropped_callers_and_restarts() {
    use futures::StreamExt;
    use glia_backends::batches::{BatchStore, NewBatch, NewItem, Upload};
    let dir = TempDir::new();
    let new = |key: &str| NewBatch {
        id: Uuid::now_v7(),
        tenant: "t".into(),
        idempotency_key: Some(key.into()),
        spec: "{}".into(),
        max_in_flight: None,
        cap: glia_backends::SpendCap::default(),
        expires_at: None,
    };
    let items = |n: u64| {
        (0..n)
            .map(|i| NewItem {
                custom_id: format!("c-{i}"),
                goal: format!("goal {i}"),
                metadata: None,
                tags: None,
                config: None,
                recorded_tools: None,
                line: i + 1,
            })
            .collect::<Vec<_>>()
    };
    let uploading = |dir: &TempDir| -> i64 {
        let conn = rusqlite::Connection::open(dir.db()).unwrap();
        conn.query_row("SELECT (SELECT count(*) FROM batches WHERE state = 'uploading') + (SELECT count(*) FROM batch_items)", [], |r| r.get(0)).unwrap()
    };
    let log = open(&dir).await;

    // The caller goes away after the first chunk was written.
    let (tx, rx) = futures::channel::mpsc::unbounded();
    tx.unbounded_send(Ok(Upload::Items(items(3)))).unwrap();
    let abandoned = new("k");
    let mut submit = log.submit(abandoned.clone(), rx.boxed());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while uploading(&dir) < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "the first chunk was never written"
        );
        let _ = tokio::time::timeout(Duration::from_millis(20), &mut submit).await;
    }
    assert_eq!(
        log.batch(None, abandoned.id).await.unwrap(),
        None,
        "an upload is invisible"
    );
    drop(submit);
    while uploading(&dir) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the abandoned upload was not deleted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(tx);

    // The key was not held: the same key now creates a batch.
    let upload = futures::stream::iter([
        Ok(Upload::Items(items(2))),
        Ok(Upload::Done {
            request_hash: "h".into(),
        }),
    ])
    .boxed();
    let first = log.submit(new("k"), upload).await.unwrap();
    assert!(first.created);
    drop(log);

    // A process that died mid-upload left rows behind.
    {
        let conn = rusqlite::Connection::open(dir.db()).unwrap();
        conn.execute_batch(&format!(
            "INSERT INTO batches (id, tenant, created_at, state, idempotency_key) VALUES ('{}', 't', 0, 'uploading', 'k'); \
             INSERT INTO batch_items (batch_id, n, custom_id, goal) SELECT id, 0, 'x', 'g' FROM batches WHERE state = 'uploading';",
            Uuid::now_v7()
        ))
        .unwrap();
    }
    assert_eq!(
        uploading(&dir),
        2 + 2,
        "two items of the first batch, the dead upload's row and item"
    );
    let log = open(&dir).await;
    assert_eq!(
        uploading(&dir),
        2,
        "the dead upload is gone; the batch's two items remain"
    );
    let batch = log
        .batch(Some("t"), first.batch.id)
        .await
        .unwrap()
        .expect("the batch survives the restart");
    assert_eq!((batch.items_total, batch.request_hash.as_str()), (2, "h"));
    assert_eq!(
        log.counts(batch.id).await.unwrap(),
        [("queued".to_owned(), 2)].into()
    );
    let again = futures::stream::iter([
        Ok(Upload::Items(items(5))),
        Ok(Upload::Done {
            request_hash: "h".into(),
        }),
    ])
    .boxed();
    let repeat = log.submit(new("k"), again).await.unwrap();
    assert!(
        !repeat.created && repeat.batch.id == batch.id,
        "the key is remembered across the restart"
    );
}

#[tokio::test]
async fn sqlite_marks_running_calls() {
    let dir = TempDir::new();
    conformance::marks_running_calls(&open(&dir).await.ledger()).await;
}

#[tokio::test]
async fn sqlite_holds_tool_results_across_a_restart() {
    let dir = TempDir::new();
    conformance::holds_tool_results(&open(&dir).await.ledger()).await;
    let held = glia_backends::HeldResult {
        call_id: "c1".into(),
        content: "ok".into(),
        error: None,
        duration_ms: 1,
    };
    let key = format!("{}:1:c1", Uuid::now_v7());
    {
        open(&dir)
            .await
            .ledger()
            .hold_results(&[(key.clone(), held.clone())])
            .await
            .unwrap();
    }
    assert_eq!(
        open(&dir).await.ledger().held_result(&key).await.unwrap(),
        Some(held),
        "held in the file, not in the process"
    );
}

// issue 32: waits
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_waits_conformance() {
    let dir = TempDir::new();
    let log = open(&dir).await;
    conformance::waits::waits(&log).await;
}
