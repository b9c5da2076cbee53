//! The Postgres event log against a real server (`GLIA_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/postgres`, which must be allowed to
//! create databases). Every test works in a database of its own, created
//! for it and dropped when it ends, also when it fails, so tests run in
//! parallel and leave nothing behind.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use glia_backends::conformance::{self, SampleLog, sample_log};
use glia_backends::postgres::{CommitMode, PgLog, PgOptions};
use glia_backends::testkit::TestDb;
use glia_backends::{
    ApprovalFilter, ApprovalStatus, Approvals, Inbox, Lease, LogError, NewRun, Outbox, Reports,
    RunFilter, RunLog,
};
use glia_proto::{
    ContentBlock, Decision, Disposition, Event, EventKind, ImageSource, MAX_IMAGE_BASE64_LEN,
    Message, Payload, ResultBlock, Role, RunConfig, RunState, ToolCallRecord, ToolContent, Usage,
    args_hash,
};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::Barrier;
use uuid::Uuid;

const TTL: Duration = Duration::from_secs(30);

fn new_run(tenant: &str, key: Option<&str>, start: &Event) -> NewRun {
    NewRun {
        tenant: tenant.into(),
        idempotency_key: key.map(str::to_owned),
        batch_id: None,
        start: start.clone(),
        tags: Vec::new(),
        metadata: Default::default(),
        custom_id: None,
        parent_run_id: None,
        parent_call_id: None,
        depth: 0,
    }
}

fn replay(events: &[Event]) -> RunState {
    RunState::replay(events[0].run_id, events).expect("the log replays")
}

/// Times that exercise the storage of `at`: now (nanoseconds), just before
/// Postgres' epoch (2000) and just after the Unix epoch, both with
/// sub-microsecond parts.
fn at(i: usize) -> DateTime<Utc> {
    match i % 3 {
        0 => Utc::now(),
        1 => DateTime::from_timestamp(946_684_799, 999_999_999).expect("valid time"),
        _ => DateTime::from_timestamp(0, 1_500).expect("valid time"),
    }
}

/// A valid log of `n` events: start, plan, one step, then rounds of model
/// call → tool use → tool call → tool result (`result(round)`).
fn tool_loop(run_id: Uuid, n: usize, result: impl Fn(usize) -> ToolContent) -> Vec<Event> {
    let mut kinds = vec![
        EventKind::SessionStart {
            redactions: Vec::new(),
            goal: "look things up".into(),
            config: RunConfig::default(),
        },
        EventKind::PlanDraft {
            steps: vec!["Reach the goal.".into()],
            usage: Usage::default(),
            cost_usd_micros: 0,
        },
        EventKind::PlanCommit {
            steps: vec!["Reach the goal.".into()],
        },
        EventKind::StepStart {
            index: 0,
            description: "Reach the goal.".into(),
            tools: vec![],
        },
    ];
    let mut round = 0;
    while kinds.len() < n {
        let call_id = format!("c{round}");
        let input = json!({"round": round, "query": format!("item {round}")});
        kinds.push(EventKind::ModelCall {
            model: "m".into(),
            messages: 1 + 2 * round,
            wrap_up: false,
            forced_tool: None,
        });
        kinds.push(EventKind::ModelResponse {
            redactions: Vec::new(),
            message: Message {
                role: Role::Assistant,
                content: vec![ContentBlock::ToolUse {
                    id: call_id.clone(),
                    name: "lookup".into(),
                    input: input.clone(),
                }],
            },
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
                ..Usage::default()
            },
            stop_reason: "tool_use".into(),
            duration_ms: 3,
            cost_usd_micros: 7,
            rejected: None,
        });
        kinds.push(EventKind::ToolCall(ToolCallRecord {
            call_id: call_id.clone(),
            name: "lookup".into(),
            args_hash: args_hash(&input),
            input,
            idempotency_key: format!("{run_id}:{call_id}"),
            disposition: Disposition::Run { reminder: None },
        }));
        kinds.push(EventKind::ToolResult {
            call_id,
            content: result(round),
            reminder: None,
            duration_ms: 1,
            redactions: Vec::new(),
        });
        round += 1;
    }
    kinds.truncate(n);
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| Event {
            run_id,
            seq: i as u64 + 1,
            at: at(i),
            kind,
        })
        .collect()
}

/// Admit `events[0]`, take a lease and commit the rest one event at a time.
async fn commit_one_by_one(log: &PgLog, events: &[Event]) -> Lease {
    log.create_run(new_run("t", None, &events[0]))
        .await
        .unwrap();
    let lease = log.acquire(events[0].run_id, "w", TTL).await.unwrap();
    let mut state = replay(&events[..1]);
    for e in &events[1..] {
        state.apply(e).unwrap();
        log.commit(&lease, std::slice::from_ref(e), &state, &[])
            .await
            .unwrap();
    }
    lease
}

/// A fresh database, a log on it, and the sample run admitted.
async fn admitted(options: PgOptions) -> (TestDb, PgLog, SampleLog) {
    let db = TestDb::new().await;
    let log = db.log_with(options).await;
    let s = sample_log();
    log.create_run(new_run("t", None, &s.parked[0]))
        .await
        .unwrap();
    (db, log, s)
}

#[tokio::test]
async fn postgres_log_conformance() {
    // Every way a step is written: the transaction, one statement, group commit.
    for commit_mode in [
        CommitMode::Transaction,
        CommitMode::Statement,
        CommitMode::Group,
    ] {
        let dbs = Mutex::new(Vec::new());
        let dbs = &dbs;
        let fresh = move || async move {
            let db = TestDb::new().await;
            let log = db
                .log_with(PgOptions {
                    commit_mode,
                    max_connections: 4,
                    ..PgOptions::default()
                })
                .await;
            dbs.lock().unwrap_or_else(|e| e.into_inner()).push(db);
            log
        };
        conformance::all(fresh).await;
        conformance::listing::all(fresh).await;
        conformance::children::all(fresh).await;
    }
}

#[tokio::test]
async fn postgres_batches_conformance() {
    let db = TestDb::new().await;
    let log = db
        .log_with(PgOptions {
            max_connections: 4,
            ..PgOptions::default()
        })
        .await;
    conformance::batch_store(&log, &log).await;
}

#[tokio::test]
async fn postgres_schedules_conformance() {
    let db = TestDb::new().await;
    let log = db
        .log_with(PgOptions {
            max_connections: 4,
            ..PgOptions::default()
        })
        .await;
    conformance::schedules::all(&log).await;
}

#[tokio::test]
async fn postgres_evals_conformance() {
    let db = TestDb::new().await;
    let log = db
        .log_with(PgOptions {
            max_connections: 4,
            ..PgOptions::default()
        })
        .await;
    conformance::evals::all(&log).await;
}

#[tokio::test]
async fn events_reject_update_delete_and_truncate_and_runs_stay() {
    let (db, log, s) = admitted(PgOptions::default()).await;
    let sql = db.sql().await;
    for statement in [
        "UPDATE events SET kind = 'tampered'",
        "DELETE FROM events",
        "TRUNCATE events",
        "UPDATE blobs SET bytes = ''",
    ] {
        let err = sql.batch_execute(statement).await.expect_err(statement);
        let message = err
            .as_db_error()
            .map(|e| e.message().to_owned())
            .unwrap_or_default();
        assert!(message.contains("append-only"), "{statement}: {err}");
    }
    // The events' runs stay (V12: no foreign key checks every event).
    for statement in ["DELETE FROM runs", "TRUNCATE runs CASCADE"] {
        let err = sql.batch_execute(statement).await.expect_err(statement);
        let message = err
            .as_db_error()
            .map(|e| e.message().to_owned())
            .unwrap_or_default();
        assert!(message.contains("never deleted"), "{statement}: {err}");
    }
    assert_eq!(
        log.events(s.run_id, 0, 10).await.unwrap(),
        s.parked[..1].to_vec(),
        "the log is untouched"
    );
    assert_eq!(
        log.get_run(s.run_id).await.unwrap().run_id,
        s.run_id,
        "the run is untouched"
    );
}

/// `statement` fails with a message containing `expect`; a transaction it
/// opened is rolled back.
async fn refused(sql: &tokio_postgres::Client, statement: &str, expect: &str) {
    let err = sql.batch_execute(statement).await.expect_err(statement);
    let message = err
        .as_db_error()
        .map(|e| e.message().to_owned())
        .unwrap_or_default();
    assert!(message.contains(expect), "{statement}: {err}");
    let _ = sql.batch_execute("ROLLBACK").await;
}

/// Erasure rewrites a finished run's events in place (V14): blobs only its
/// events referenced are deleted, one another run shares is kept; outside
/// `erase_run` the log stays append-only, even for an erased run, and inside
/// it only an erased run's payloads change.
#[tokio::test]
async fn erasure_deletes_unshared_blobs_and_the_log_stays_append_only() {
    let db = TestDb::new().await;
    let log = db.log().await;
    let unique = format!("secret-{}", "u".repeat(100 * 1024));
    let shared = format!("shared-{}", "s".repeat(100 * 1024));
    let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
    let mut events_a = tool_loop(a, 12, |round| match round {
        0 => unique.clone().into(),
        1 => shared.clone().into(),
        _ => format!("small {round}").into(),
    });
    events_a.push(Event {
        run_id: a,
        seq: 13,
        at: at(12),
        kind: EventKind::SessionCancel {
            reason: "stop".into(),
        },
    });
    let events_b = tool_loop(b, 12, |round| match round {
        1 => shared.clone().into(),
        _ => format!("other {round}").into(),
    });
    let lease = commit_one_by_one(&log, &events_a).await;
    log.release(&lease).await.unwrap();
    commit_one_by_one(&log, &events_b).await;
    assert_eq!(db.count("SELECT count(*) FROM blobs").await, 2);

    let sql = db.sql().await;
    refused(
        &sql,
        "BEGIN; SELECT set_config('glia.erasing', 'on', true); UPDATE events SET payload = payload WHERE blob_hash IS NULL",
        "only an erased run",
    )
    .await;

    log.erase_run(a, "ana", Utc::now()).await.unwrap();
    let erased = log.events(a, 0, 100).await.unwrap();
    let expected: Vec<Event> = events_a.iter().map(Event::erased).collect();
    assert_eq!(erased, expected);
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM events WHERE run_id = '{a}' AND payload IS NULL"
        ))
        .await,
        0,
        "the tombstones are small: inline"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM blobs").await,
        1,
        "the blob only the erased run used is gone, the shared one kept"
    );
    assert_eq!(
        db.count(
            "SELECT count(*) FROM blobs WHERE position(convert_to('secret-', 'UTF8') in bytes) > 0"
        )
        .await,
        0
    );
    assert_eq!(
        log.events(b, 0, 100).await.unwrap(),
        events_b,
        "the other run reads as before"
    );
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM checkpoints WHERE run_id = '{a}'"
        ))
        .await,
        0
    );
    assert_eq!(
        log.load(a).await.unwrap(),
        replay(&expected),
        "the erased run loads: its tombstones replay"
    );

    // Still append-only: a plain UPDATE or DELETE of the erased run's
    // events is refused; under the erasure setting the keys stay.
    let update_a = format!("UPDATE events SET payload = payload WHERE run_id = '{a}'");
    let delete_a = format!("DELETE FROM events WHERE run_id = '{a}'");
    let renumber = format!(
        "BEGIN; SELECT set_config('glia.erasing', 'on', true); UPDATE events SET seq = seq + 100 WHERE run_id = '{a}'"
    );
    for (statement, expect) in [
        (update_a.as_str(), "append-only"),
        (delete_a.as_str(), "append-only"),
        (renumber.as_str(), "payload only"),
    ] {
        refused(&sql, statement, expect).await;
    }
    assert_eq!(log.events(a, 0, 100).await.unwrap(), expected);
}

#[tokio::test]
async fn large_payloads_go_to_blobs_and_read_back_identical() {
    let db = TestDb::new().await;
    let log = db.log().await;
    let big = format!("{}é✓", "x".repeat(200 * 1024));
    // A PNG of 3.75 MiB, as base64 just under the 5 MiB a request may carry.
    // ("iVBORw0KGgoA" is the PNG signature and a zero byte; "AAAA" 3 zeros.)
    let png = format!(
        "iVBORw0KGgoA{}",
        "AAAA".repeat(MAX_IMAGE_BASE64_LEN / 4 - 4)
    );
    assert_eq!(
        ImageSource::base64("image/png", png.as_str()).check(),
        Ok(()),
        "a request may carry it"
    );
    let image = ToolContent::Blocks(vec![
        ResultBlock::text("a screenshot"),
        ResultBlock::Image {
            source: ImageSource::base64("image/png", png),
        },
    ]);
    let run_id = Uuid::now_v7();
    // Round 0's result is large; round 1's holds U+0000, which jsonb
    // refuses; round 2's is a multi-MB image.
    let events = tool_loop(run_id, 16, |round| match round {
        0 => big.clone().into(),
        1 => "before\0after".into(),
        2 => image.clone(),
        _ => format!("small {round}").into(),
    });
    commit_one_by_one(&log, &events).await;
    assert_eq!(
        log.events(run_id, 0, 100).await.unwrap(),
        events,
        "events round-trip exactly, time included"
    );
    assert_eq!(log.load(run_id).await.unwrap(), replay(&events));

    let sql = db.sql().await;
    let rows = sql
        .query(
            "SELECT seq, blob_hash FROM events WHERE payload IS NULL ORDER BY seq",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        rows.len(),
        3,
        "only the large, the NUL and the image payloads left the row"
    );
    let large: Vec<usize> = rows
        .iter()
        .map(|r| r.get::<_, i64>(0) as usize)
        .filter(|seq| {
            matches!(&events[seq - 1].kind, EventKind::ToolResult { .. })
                && serde_json::to_vec(&events[seq - 1].kind).unwrap().len() > 1000
        })
        .collect();
    assert_eq!(
        large.len(),
        2,
        "the large text and the image results are in blobs"
    );
    for seq in large {
        let json = serde_json::to_vec(&events[seq - 1].kind).unwrap();
        let hash: String = Sha256::digest(&json)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let stored: Vec<u8> = sql
            .query_one("SELECT bytes FROM blobs WHERE hash = $1", &[&hash])
            .await
            .expect("blob by its SHA-256")
            .get(0);
        assert_eq!(stored, json);
    }

    // Content-addressed: a second run with the same large start shares it.
    let goal = "g".repeat(100 * 1024);
    for _ in 0..2 {
        let start = Event {
            run_id: Uuid::now_v7(),
            seq: 1,
            at: at(0),
            kind: EventKind::SessionStart {
                redactions: Vec::new(),
                goal: goal.clone(),
                config: RunConfig::default(),
            },
        };
        log.create_run(new_run("t", None, &start)).await.unwrap();
        assert_eq!(
            log.events(start.run_id, 0, 10).await.unwrap(),
            vec![start.clone()]
        );
        assert_eq!(log.get_run(start.run_id).await.unwrap().goal, goal);
    }
    assert_eq!(db.count("SELECT count(*) FROM blobs").await, 4);
}

#[tokio::test]
async fn nul_characters_round_trip_everywhere() {
    let db = TestDb::new().await;
    let log = db.log().await;
    let start = Event {
        run_id: Uuid::now_v7(),
        seq: 1,
        at: at(0),
        kind: EventKind::SessionStart {
            redactions: Vec::new(),
            goal: "nul \0 goal".into(),
            config: RunConfig::default(),
        },
    };
    let (summary, _) = log.create_run(new_run("t", None, &start)).await.unwrap();
    assert_eq!(
        summary.goal, "nul \u{FFFD} goal",
        "the summary's goal is sanitised"
    );
    assert_eq!(
        log.events(start.run_id, 0, 10).await.unwrap(),
        vec![start.clone()],
        "the event is exact"
    );
    assert_eq!(log.load(start.run_id).await.unwrap().goal, "nul \0 goal");
    let payload = Payload::ToolResult {
        call_id: "c\u{1}".into(),
        content: "a\0b".into(),
        is_error: false,
    };
    let id = log.post(start.run_id, payload.clone()).await.unwrap();
    let inbox = log.inbox(start.run_id).await.unwrap();
    assert_eq!((inbox[0].id, &inbox[0].payload), (id, &payload));
    let refused = log
        .create_run(new_run(
            "bad\0tenant",
            None,
            &Event {
                run_id: Uuid::now_v7(),
                ..start.clone()
            },
        ))
        .await;
    assert!(
        matches!(refused, Err(LogError::Invalid { .. })),
        "{refused:?}"
    );
}

/// Admission is one statement (or, into a batch, one round trip and a
/// `COMMIT`): whatever it refuses or finds admitted before, it writes
/// nothing, a batch it would have created included.
#[tokio::test]
async fn admission_writes_all_or_nothing() {
    let db = TestDb::new().await;
    let log = db.log().await;
    let (a, b, c) = (sample_log(), sample_log(), sample_log());
    let (batch, unused) = (Uuid::now_v7(), Uuid::now_v7());
    let in_batch = |tenant: &str, key: Option<&str>, batch: Uuid, start: &Event| NewRun {
        batch_id: Some(batch),
        ..new_run(tenant, key, start)
    };
    let (first, created) = log
        .create_run(in_batch("t1", Some("k1"), batch, &a.parked[0]))
        .await
        .unwrap();
    assert!(created && first.batch_id == Some(batch), "{first:?}");
    // The same key again, naming a batch no one made: the first run, and no batch.
    let (again, created) = log
        .create_run(in_batch("t1", Some("k1"), unused, &b.parked[0]))
        .await
        .unwrap();
    assert!(!created && again.run_id == a.run_id, "{again:?}");
    // Another tenant's batch, with or without a key.
    for key in [None, Some("k1")] {
        let refused = log
            .create_run(in_batch("t2", key, batch, &b.parked[0]))
            .await;
        assert!(
            matches!(&refused, Err(LogError::Invalid { reason, .. }) if reason.contains("another tenant")),
            "{refused:?}"
        );
    }
    // A run id used before.
    let refused = log.create_run(new_run("t1", None, &a.parked[0])).await;
    assert!(
        matches!(&refused, Err(LogError::Invalid { reason, .. }) if reason.contains("already exists")),
        "{refused:?}"
    );
    // Out of a batch, in one statement.
    let (plain, created) = log
        .create_run(new_run("t2", Some("k1"), &c.parked[0]))
        .await
        .unwrap();
    assert!(created && plain.batch_id.is_none(), "{plain:?}");
    assert!(
        matches!(log.get_run(b.run_id).await, Err(LogError::NotFound(_))),
        "nothing of the refused runs"
    );
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM batches WHERE id = '{unused}'"
        ))
        .await,
        0,
        "no batch for a run not admitted"
    );
    assert_eq!(db.count("SELECT count(*) FROM runs").await, 2);
    assert_eq!(
        db.count("SELECT count(*) FROM events").await,
        2,
        "each run's session.start"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM outbox").await,
        2,
        "each run's start job"
    );
    assert_eq!(
        log.events(a.run_id, 0, 10).await.unwrap(),
        vec![a.parked[0].clone()]
    );
}

/// A batch admission given up mid-transaction (its call timed out while its
/// batch row waited for a lock) leaves no transaction open on a pooled
/// connection: the next admission on the same one-connection pool commits.
#[tokio::test]
async fn an_admission_given_up_mid_transaction_leaves_no_transaction_open() {
    let db = TestDb::new().await;
    let log = db
        .log_with(PgOptions {
            max_connections: 1,
            call_timeout: Duration::from_millis(300),
            ..Default::default()
        })
        .await;
    let (a, b) = (sample_log(), sample_log());
    let batch = Uuid::now_v7();
    let blocker = db.sql().await;
    blocker
        .batch_execute(&format!(
            "BEGIN; INSERT INTO batches (id, tenant) VALUES ('{batch}', 't')"
        ))
        .await
        .unwrap();
    let late = log
        .create_run(NewRun {
            batch_id: Some(batch),
            ..new_run("t", None, &a.parked[0])
        })
        .await;
    assert!(matches!(late, Err(LogError::Unavailable(_))), "{late:?}");
    blocker.batch_execute("ROLLBACK").await.unwrap();
    let (run, created) = log
        .create_run(new_run("t", None, &b.parked[0]))
        .await
        .unwrap();
    assert!(created);
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM runs WHERE id = '{}'",
            run.run_id
        ))
        .await,
        1,
        "the next admission is committed, seen by others"
    );
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM runs WHERE id = '{}'",
            a.run_id
        ))
        .await,
        0,
        "nothing of the one given up"
    );
}

#[tokio::test]
async fn checkpoints_are_amortised_and_load_equals_replay() {
    let db = TestDb::new().await;
    let log = db.log().await;
    let run_id = Uuid::now_v7();
    let events = tool_loop(run_id, 201, |round| format!("result {round}").into());
    commit_one_by_one(&log, &events).await;
    let replayed = replay(&events);
    assert_eq!(log.load(run_id).await.unwrap(), replayed);
    assert_eq!(log.events(run_id, 0, 1000).await.unwrap(), events);

    let sql = db.sql().await;
    let seqs: Vec<i64> = sql
        .query("SELECT seq FROM checkpoints WHERE run_id = $1", &[&run_id])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(seqs, vec![192], "one checkpoint, the latest multiple of 64");
    let state: serde_json::Value = sql
        .query_one(
            "SELECT state FROM checkpoints WHERE run_id = $1",
            &[&run_id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        serde_json::from_value::<RunState>(state).unwrap(),
        replay(&events[..192]),
        "the checkpoint is the state at its seq"
    );

    // load() starts from the checkpoint: a doctored one shows through…
    sql.execute("UPDATE checkpoints SET state = jsonb_set(state, '{goal}', '\"doctored\"') WHERE run_id = $1", &[&run_id]).await.unwrap();
    assert_eq!(log.load(run_id).await.unwrap().goal, "doctored");
    // …and one that no longer parses is ignored: the whole log is replayed.
    sql.execute(
        "UPDATE checkpoints SET state = '{\"from\": \"an older glia\"}' WHERE run_id = $1",
        &[&run_id],
    )
    .await
    .unwrap();
    assert_eq!(log.load(run_id).await.unwrap(), replayed);
}

#[tokio::test]
async fn a_checkpoint_commit_refuses_events_that_do_not_apply() {
    let db = TestDb::new().await;
    let log = db
        .log_with(PgOptions {
            checkpoint_every: 4,
            ..PgOptions::default()
        })
        .await;
    let run_id = Uuid::now_v7();
    let events = tool_loop(run_id, 8, |round| format!("result {round}").into());
    let lease = commit_one_by_one(&log, &events[..3]).await;
    // seq 4 (crossing 4) claims a tool result out of nowhere: envelope fine,
    // transition not.
    let bogus = Event {
        kind: EventKind::ToolResult {
            call_id: "nope".into(),
            content: String::new().into(),
            reminder: None,
            duration_ms: 0,
            redactions: Vec::new(),
        },
        ..events[3].clone()
    };
    let mut claimed = replay(&events[..3]);
    claimed.head_seq = 4;
    let err = log
        .commit(&lease, &[bogus], &claimed, &[])
        .await
        .unwrap_err();
    assert!(matches!(err, LogError::Invalid { .. }), "{err:?}");
    assert_eq!(
        log.get_run(run_id).await.unwrap().head_seq,
        3,
        "nothing written"
    );
    // A broken envelope is refused on any commit.
    let err = log
        .commit(&lease, &events[4..5], &replay(&events[..5]), &[])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LogError::Conflict {
                expected: 4,
                actual: 3,
                ..
            }
        ),
        "{err:?}"
    );
    let err = log
        .commit(
            &lease,
            &[events[3].clone(), events[5].clone()],
            &replay(&events[..6]),
            &[],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, LogError::Invalid { .. }), "a gap: {err:?}");
    log.commit(&lease, &events[3..], &replay(&events), &[])
        .await
        .unwrap();
    assert_eq!(log.load(run_id).await.unwrap(), replay(&events));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commits_on_the_same_head_one_wins() {
    let db = TestDb::new().await;
    // Two pools: two processes, as far as Postgres can tell.
    let (a, b) = (db.log().await, db.log().await);
    let run_id = Uuid::now_v7();
    let events = tool_loop(run_id, 31, |round| format!("result {round}").into());
    a.create_run(new_run("t", None, &events[0])).await.unwrap();
    let mut lease = a.acquire(run_id, "w1", TTL).await.unwrap();
    let mut state = replay(&events[..1]);
    for i in 1..events.len() {
        state.apply(&events[i]).unwrap();
        // Every fifth round the lease changed hands in between: the old
        // holder races the new one.
        let (first, second) = if i % 5 == 0 {
            a.release(&lease).await.unwrap();
            let taken = b.acquire(run_id, "w2", TTL).await.unwrap();
            (std::mem::replace(&mut lease, taken.clone()), taken)
        } else {
            (lease.clone(), lease.clone())
        };
        let barrier = Arc::new(Barrier::new(2));
        let racers = [(a.clone(), first), (b.clone(), second)].map(|(log, lease)| {
            let (barrier, batch, state) = (barrier.clone(), events[i..=i].to_vec(), state.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                log.commit(&lease, &batch, &state, &[]).await
            })
        });
        let mut results = Vec::new();
        for racer in racers {
            results.push(racer.await.unwrap());
        }
        assert_eq!(
            results.iter().filter(|r| r.is_ok()).count(),
            1,
            "round {i}: {results:?}"
        );
        for r in &results {
            match r {
                Ok(()) => {}
                Err(LogError::Conflict {
                    expected, actual, ..
                }) => assert_eq!((*expected, *actual), (i as u64, i as u64 + 1)),
                Err(LogError::LeaseLost(_)) => {
                    assert_eq!(i % 5, 0, "only a replaced lease is lost")
                }
                Err(other) => panic!("round {i}: {other:?}"),
            }
        }
    }
    assert_eq!(
        a.events(run_id, 0, 1000).await.unwrap(),
        events,
        "one event per seq, in order"
    );
    assert_eq!(
        db.count("SELECT count(DISTINCT seq) FROM events").await,
        events.len() as i64
    );
    assert_eq!(b.load(run_id).await.unwrap(), replay(&events));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicate_admissions_make_one_run() {
    let db = TestDb::new().await;
    let log = db.log().await;
    let barrier = Arc::new(Barrier::new(8));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (log, barrier) = (log.clone(), barrier.clone());
            let start = sample_log().parked[0].clone();
            tokio::spawn(async move {
                barrier.wait().await;
                (
                    start.run_id,
                    log.create_run(new_run("t", Some("same-key"), &start)).await,
                )
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        let (tried, result) = task.await.unwrap();
        let (summary, created) = result.expect("a duplicate admission is not an error");
        outcomes.push((tried, summary.run_id, created));
    }
    assert_eq!(outcomes.iter().filter(|o| o.2).count(), 1, "{outcomes:?}");
    let winner = outcomes.iter().find(|o| o.2).unwrap().1;
    assert!(
        outcomes.iter().all(|o| o.1 == winner),
        "everyone gets the first run"
    );
    for (tried, _, created) in &outcomes {
        if !created {
            assert!(
                matches!(log.get_run(*tried).await, Err(LogError::NotFound(_))),
                "nothing written for a duplicate"
            );
        }
    }
    let runs = log
        .list_runs(&RunFilter {
            tenant: Some("t".into()),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(log.outbox(100).await.unwrap().len(), 1, "one job");
    assert_eq!(db.count("SELECT count(*) FROM events").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_approval_decisions_one_is_accepted() {
    let (_db, log, s) = admitted(PgOptions::default()).await;
    let lease = log.acquire(s.run_id, "w", TTL).await.unwrap();
    log.commit(&lease, &s.parked[1..], &replay(&s.parked), &[])
        .await
        .unwrap();
    log.release(&lease).await.unwrap();
    let hash = log
        .approvals(&ApprovalFilter {
            run_id: Some(s.run_id),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap()[0]
        .args_hash
        .clone();
    let barrier = Arc::new(Barrier::new(8));
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (log, barrier) = (log.clone(), barrier.clone());
            let decision = if i % 2 == 0 {
                Decision::Approve
            } else {
                Decision::Reject {
                    reason: format!("no ({i})"),
                }
            };
            let payload = Payload::Approval {
                call_id: "c1".into(),
                args_hash: hash.clone(),
                decision,
                by: Some(format!("person {i}")),
                request_seq: None,
            };
            tokio::spawn(async move {
                barrier.wait().await;
                (payload.clone(), log.post(s.run_id, payload).await)
            })
        })
        .collect();
    let mut accepted = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            (payload, Ok(id)) => accepted.push((id, payload)),
            (_, Err(LogError::Duplicate { what, .. })) => assert_eq!(what, "approval c1"),
            (_, Err(other)) => panic!("{other:?}"),
        }
    }
    assert_eq!(accepted.len(), 1, "exactly one decision wins");
    let inbox = log.inbox(s.run_id).await.unwrap();
    assert_eq!(
        inbox
            .iter()
            .map(|i| (i.id, i.payload.clone()))
            .collect::<Vec<_>>(),
        accepted
    );
    let rows = log
        .approvals(&ApprovalFilter {
            run_id: Some(s.run_id),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        rows.iter().map(|r| r.status).collect::<Vec<_>>(),
        vec![ApprovalStatus::Decided]
    );
    let jobs = log.outbox(100).await.unwrap();
    assert_eq!(
        jobs.len(),
        2,
        "admission and the one accepted decision: {jobs:?}"
    );
    assert_eq!(jobs[1].1.head_seq, s.parked.len() as u64);
}

#[tokio::test]
async fn bad_rows_are_errors_not_panics() {
    let (db, log, s) = admitted(PgOptions::default()).await;
    let sql = db.sql().await;
    sql.execute("UPDATE runs SET phase = 'dancing'", &[])
        .await
        .unwrap();
    assert!(matches!(
        log.get_run(s.run_id).await,
        Err(LogError::Corrupt(_))
    ));
    assert!(matches!(
        log.list_runs(&RunFilter {
            limit: 10,
            ..Default::default()
        })
        .await,
        Err(LogError::Corrupt(_))
    ));
    sql.execute("UPDATE outbox SET job = '{\"run\": 1}'", &[])
        .await
        .unwrap();
    assert!(matches!(log.outbox(10).await, Err(LogError::Corrupt(_))));
    log.post(
        s.run_id,
        Payload::Input {
            text: "hi".into(),
            redactions: Vec::new(),
        },
    )
    .await
    .unwrap();
    sql.execute("UPDATE inbox SET payload = '{\"kind\": \"dance\"}'", &[])
        .await
        .unwrap();
    assert!(matches!(
        log.inbox(s.run_id).await,
        Err(LogError::Corrupt(_))
    ));
}

#[tokio::test]
async fn connection_problems_are_unavailable() {
    let options = PgOptions {
        connect_timeout: Duration::from_secs(2),
        ..PgOptions::default()
    };
    let refused = PgLog::connect("postgres://postgres@127.0.0.1:1/postgres", options.clone()).await;
    assert!(
        matches!(refused, Err(LogError::Unavailable(_))),
        "{refused:?}"
    );
    let malformed = PgLog::connect("postgres://[not a url", options).await;
    assert!(
        matches!(malformed, Err(LogError::Unavailable(_))),
        "{malformed:?}"
    );

    // A statement that outlives the statement timeout (a commit waiting for
    // a row another session holds) is cancelled: Unavailable, nothing written.
    let (db, log, s) = admitted(PgOptions {
        statement_timeout: Duration::from_millis(200),
        ..PgOptions::default()
    })
    .await;
    let lease = log.acquire(s.run_id, "w", TTL).await.unwrap();
    let mut holder = db.sql().await;
    let tx = holder.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE", &[&s.run_id])
        .await
        .unwrap();
    let err = log
        .commit(&lease, &s.parked[1..2], &replay(&s.parked[..2]), &[])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LogError::Unavailable(m) if m.contains("57014")),
        "{err:?}"
    );
    tx.rollback().await.unwrap();
    assert_eq!(log.get_run(s.run_id).await.unwrap().head_seq, 1);
    log.commit(&lease, &s.parked[1..2], &replay(&s.parked[..2]), &[])
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_starts_migrate_once() {
    let db = TestDb::new().await;
    let (a, b, c) = tokio::join!(db.log(), db.log(), db.log());
    for log in [&a, &b, &c] {
        log.ready().await.unwrap();
    }
    let migrations = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
        .unwrap()
        .count() as i64;
    assert_eq!(
        db.count("SELECT count(*) FROM refinery_schema_history")
            .await,
        migrations
    );
    let again = db.log().await;
    again.ready().await.unwrap();
    assert_eq!(
        db.count("SELECT count(*) FROM refinery_schema_history")
            .await,
        migrations,
        "each migration applied once"
    );
}

#[tokio::test]
async fn leases_use_the_database_clock_and_fence() {
    let (db, log, s) = admitted(PgOptions::default()).await;
    let lease = log.acquire(s.run_id, "w1", TTL).await.unwrap();
    let db_now: DateTime<Utc> = db
        .sql()
        .await
        .query_one("SELECT now()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        lease.expires_at > db_now && lease.expires_at <= db_now + chrono::Duration::seconds(31)
    );
    match log.acquire(s.run_id, "w2", TTL).await {
        Err(LogError::LeaseHeld { owner, until, .. }) => {
            assert_eq!((owner.as_str(), until), ("w1", lease.expires_at))
        }
        other => panic!("{other:?}"),
    }
    let renewed = log.renew(&lease, Duration::from_secs(60)).await.unwrap();
    assert_eq!((renewed.token, renewed.owner.as_str()), (lease.token, "w1"));
    assert!(renewed.expires_at > lease.expires_at);
    assert!(matches!(
        log.acquire(Uuid::now_v7(), "w", TTL).await,
        Err(LogError::NotFound(_))
    ));
    assert!(matches!(
        log.renew(
            &Lease {
                run_id: Uuid::now_v7(),
                ..lease.clone()
            },
            TTL
        )
        .await,
        Err(LogError::NotFound(_))
    ));
    // A lease the database clock says has lapsed: set its expiry in the past.
    db.sql()
        .await
        .execute(
            "UPDATE runs SET lease_expires_at = now() - interval '1 second'",
            &[],
        )
        .await
        .unwrap();
    assert!(matches!(
        log.commit(&lease, &s.parked[1..2], &replay(&s.parked[..2]), &[])
            .await,
        Err(LogError::LeaseLost(_))
    ));
    let orphans = log.orphaned(10).await.unwrap();
    assert!(
        orphans.len() == 1 && !orphans[0].queued,
        "a lapsed lease leaves the run to the reconciler: {orphans:?}"
    );
    let taken = log.acquire(s.run_id, "w2", TTL).await.unwrap();
    assert_ne!(taken.token, lease.token);
    log.release(&lease).await.unwrap();
    assert!(
        log.orphaned(10).await.unwrap().is_empty(),
        "releasing a lost lease leaves the new one alone"
    );
}

/// Tool arguments with floats that need 17 significant digits. serde_json
/// without its `float_roundtrip` feature parses about one such float in ten
/// one ULP off, so the replayed arguments hash differently and `load` fails.
#[tokio::test]
async fn float_arguments_round_trip() {
    let db = TestDb::new().await;
    let log = db.log().await;
    let run_id = Uuid::now_v7();
    let mut events = tool_loop(run_id, 8, |round| format!("result {round}").into());
    let input = json!({"amount": 212.918_907_267_134_6_f64, "rate": 479.607_564_269_825_96_f64});
    if let EventKind::ModelResponse { message, .. } = &mut events[5].kind {
        message.content = vec![ContentBlock::ToolUse {
            id: "c0".into(),
            name: "lookup".into(),
            input: input.clone(),
        }];
    }
    if let EventKind::ToolCall(call) = &mut events[6].kind {
        call.args_hash = args_hash(&input);
        call.input = input;
    }
    commit_one_by_one(&log, &events).await;
    assert_eq!(log.events(run_id, 0, 100).await.unwrap(), events);
    assert_eq!(log.load(run_id).await.unwrap(), replay(&events));
}

/// Runs move whole from a single node's SQLite file to Postgres and back.
#[tokio::test]
async fn runs_move_between_sqlite_and_postgres() {
    use glia_backends::sqlite::{SqliteLog, SqliteOptions};
    let dir = glia_backends::testkit::TempDir::new();
    let sqlite = SqliteLog::open(dir.db(), SqliteOptions::default())
        .await
        .unwrap();
    let db = TestDb::new().await;
    let pg = db.log().await;
    conformance::export_import_round_trip(&sqlite, &pg).await;
    conformance::export_import_round_trip(&pg, &sqlite).await;
}

/// An admitted run parked at its approval (call `c1`) with no lease held.
async fn parked_and_let_go(options: PgOptions) -> (TestDb, PgLog, SampleLog) {
    let (db, log, s) = admitted(options).await;
    let lease = log.acquire(s.run_id, "w", TTL).await.unwrap();
    log.commit(&lease, &s.parked[1..], &replay(&s.parked), &[])
        .await
        .unwrap();
    log.release(&lease).await.unwrap();
    (db, log, s)
}

/// The approval of the sample run's call `c1`, as it was requested.
fn approve_c1() -> Payload {
    let hash = args_hash(&json!({"order": "A1", "amount": 30}));
    Payload::Approval {
        call_id: "c1".into(),
        args_hash: hash,
        decision: Decision::Approve,
        by: None,
        request_seq: None,
    }
}

/// A post that gives up while it waits for the run's lock (its call timeout)
/// writes nothing, though its `COMMIT` was sent with the rest: the server
/// ends the wait first (`lock_timeout`), failing the transaction. The
/// payload can then be posted again.
#[tokio::test]
async fn a_post_that_timed_out_waiting_for_the_lock_wrote_nothing() {
    let (db, log, s) = parked_and_let_go(PgOptions {
        max_connections: 4,
        call_timeout: Duration::from_millis(400),
        ..PgOptions::default()
    })
    .await;
    let mut holder = db.sql().await;
    let tx = holder.transaction().await.unwrap();
    tx.query_one(
        "SELECT status FROM runs WHERE id = $1 FOR NO KEY UPDATE",
        &[&s.run_id],
    )
    .await
    .unwrap();
    let approval = approve_c1();
    let timed_out = log.post(s.run_id, approval.clone()).await;
    assert!(
        matches!(&timed_out, Err(LogError::Unavailable(why)) if why.contains("55P03")),
        "the server ended the wait (lock_not_available): {timed_out:?}"
    );
    // Well past the call timeout, still holding the lock, then let go.
    tokio::time::sleep(Duration::from_millis(600)).await;
    tx.commit().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sql = db.sql().await;
    let rows: i64 = sql
        .query_one("SELECT count(*) FROM inbox WHERE run_id = $1", &[&s.run_id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "nothing was committed after the post gave up");
    let resumes: i64 = sql
        .query_one(
            "SELECT count(*) FROM outbox WHERE job->>'run_id' = $1 AND job->>'resume' = 'true'",
            &[&s.run_id.to_string()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(resumes, 0, "no resume job either");
    log.post(s.run_id, approval).await.expect("posted again");
}

/// A payload posted while a cancel is being posted waits for the run's lock
/// and then sees the cancel: refused (`Cancelled`), nothing written. The
/// cancel's transaction is held open by hand until the second post waits.
#[tokio::test]
async fn a_post_that_waited_for_a_cancel_sees_it() {
    let (db, log, s) = parked_and_let_go(PgOptions {
        max_connections: 4,
        ..PgOptions::default()
    })
    .await;
    // The cancel, as `post` writes it, in a transaction left open.
    let mut cancel = db.sql().await;
    let tx = cancel.transaction().await.unwrap();
    tx.query_one(
        "SELECT status FROM runs WHERE id = $1 FOR NO KEY UPDATE",
        &[&s.run_id],
    )
    .await
    .unwrap();
    tx.execute("INSERT INTO inbox (run_id, dedupe_key, payload) VALUES ($1, 'cancel', '{\"kind\":\"cancel\",\"reason\":\"stop\"}')", &[&s.run_id])
        .await
        .unwrap();
    let approval = approve_c1();
    let poster = log.clone();
    let run_id = s.run_id;
    let posted = tokio::spawn(async move { poster.post(run_id, approval).await });
    // Wait until the post waits for the run's lock.
    let sql = db.sql().await;
    for i in 0.. {
        let waiting: i64 = sql
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'", &[])
            .await
            .unwrap()
            .get(0);
        if waiting == 1 {
            break;
        }
        assert!(i < 500, "the post never waited for the lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tx.commit().await.unwrap();
    let refused = posted.await.unwrap();
    assert!(
        matches!(refused, Err(LogError::Cancelled(id)) if id == s.run_id),
        "a post after a cancel committed: {refused:?}"
    );
    let kinds: Vec<String> = sql
        .query(
            "SELECT dedupe_key FROM inbox WHERE run_id = $1",
            &[&s.run_id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<_, Option<String>>(0).unwrap_or_default())
        .collect();
    assert_eq!(kinds, ["cancel"], "only the cancel is in the inbox");
}

// issue 32: waits
#[tokio::test]
async fn postgres_waits_conformance() {
    let db = TestDb::new().await;
    let log = db
        .log_with(PgOptions {
            max_connections: 4,
            ..PgOptions::default()
        })
        .await;
    conformance::waits::waits(&log).await;
}
