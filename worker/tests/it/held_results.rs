//! A finished effect is never thrown away (issue 28, item 3): a
//! consequential call that returns while Postgres is down is held in the
//! ledger (a real Redis, under a key prefix of this test's own) and
//! committed once the database is back, by the worker that ran it (its
//! commit retried while its lease lives, its lease renewed as soon as the
//! database answers), or, when the outage outlasts the lease, by the next
//! worker (`tool.recovered`). Either way: executed once, one result in the
//! log, nobody asked again.
//!
//! The event log is a private PostgreSQL cluster
//! ([`glia_testkit::PrivatePostgres`]) that the tests stop (`-m fast` and
//! `-m immediate`, a crash) and start again; the machine's cluster is never
//! touched. The job queue is the in-memory twin (jobs are relayed from the
//! Postgres outbox and the lapsed leases re-enqueued by a loop here, as the
//! dispatcher does); the tool is a worker tool that counts its executions.
//!
//! The test waits for what it needs with generous deadlines and asserts no
//! durations; the outage itself is made long (2 s) or longer than the lease.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use glia_agent::Agent;
use glia_agent::provider::{ScriptLibrary, ScriptedTurn};
use glia_agent::tool::{Tool, ToolContext, ToolFailure, ToolRegistry};
use glia_backends::memory::MemoryQueue;
use glia_backends::postgres::{PgLog, PgOptions};
use glia_backends::redis_ledger::RedisLedger;
use glia_backends::testkit::RedisKeys;
use glia_backends::{Inbox, JobQueue, Ledger, NewRun, Outbox, RunLog};
use glia_proto::{
    Decision, Event, EventKind, InterruptedCall, Outcome, Payload, Policy, PolicyAction, PullPoint,
    RunConfig, RunState,
};
use glia_testkit::PrivatePostgres;
use glia_testkit::postgres::StopMode;
use glia_worker::consumer::{Worker, WorkerOptions};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};
use uuid::Uuid;

// Arguments of `refund`: an order id.
#[derive(Deserialize, JsonSchema)]
struct RefundArgs {
    order: String,
}

/// A consequential tool: each execution is counted; the first one waits
/// for the test's word (`finish`) before it returns, and says it started
/// (`started`, with the idempotency key it was given).
#[derive(Default)]
struct Refund {
    executions: AtomicUsize,
    started: Notify,
    finish: Notify,
    key: std::sync::Mutex<Option<String>>,
}

struct RefundTool(Arc<Refund>);

impl Tool for RefundTool {
    type Args = RefundArgs;
    type Output = Value;
    fn name(&self) -> &str {
        "refund"
    }
    fn description(&self) -> &str {
        "Refund an order."
    }
    async fn call(&self, args: RefundArgs, ctx: ToolContext) -> Result<Value, ToolFailure> {
        let n = self.0.executions.fetch_add(1, Ordering::SeqCst) + 1;
        if n == 1 {
            *self.0.key.lock().unwrap() = Some(ctx.idempotency_key.clone());
            self.0.started.notify_one();
            self.0.finish.notified().await;
        }
        Ok(json!({ "refunded": args.order, "execution": n }))
    }
}

fn redis_url() -> String {
    std::env::var("GLIA_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// Poll `check` (every 50 ms) until it answers `Some`, panicking with
/// `what` after `secs` seconds (a bound on a hang, not a timing assertion).
async fn until<T, F: Future<Output = Option<T>>>(
    secs: u64,
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {secs} s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The run's state, once the log answers and `check` holds.
async fn state_when(
    log: &dyn RunLog,
    run_id: Uuid,
    what: &str,
    check: impl Fn(&RunState) -> bool,
) -> RunState {
    until(180, what, || async {
        log.load(run_id).await.ok().filter(|s| check(s))
    })
    .await
}

struct Setup {
    pg: Arc<PrivatePostgres>,
    log: Arc<PgLog>,
    ledger: Arc<RedisLedger>,
    _keys: RedisKeys,
    refund: Arc<Refund>,
    stop: watch::Sender<bool>,
}

/// A private cluster, the Redis ledger under a fresh prefix, and `workers`
/// workers with leases of `lease_ttl`, plus the dispatcher's relay and
/// reconciler (every 200 ms, riding out the outage). `None` when
/// PostgreSQL's server binaries are not installed.
async fn setup(workers: usize, lease_ttl: Duration) -> Option<Setup> {
    let pg = glia_testkit::require(
        tokio::task::spawn_blocking(PrivatePostgres::start_new)
            .await
            .unwrap(),
        "PostgreSQL's server binaries (initdb, pg_ctl)",
        "apt-get install postgresql; scripts/test does",
    )?;
    let pg = Arc::new(pg);
    // Calls bounded well below the lease, so an attempt that meets the
    // outage gives way to the next one in time.
    let options = PgOptions {
        max_connections: 8,
        call_timeout: Duration::from_secs(2),
        wait_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        ..PgOptions::default()
    };
    let log = Arc::new(
        PgLog::connect(&pg.admin_url(), options)
            .await
            .expect("connect to the private cluster"),
    );
    let prefix = format!("glia-test-{}", Uuid::now_v7());
    let ledger = Arc::new(
        RedisLedger::connect(&redis_url(), &prefix)
            .await
            .expect("connect to Redis at GLIA_REDIS_URL"),
    );
    let keys = RedisKeys {
        url: redis_url(),
        prefix,
    };
    let queue = Arc::new(MemoryQueue::default());
    let refund = Arc::new(Refund::default());
    let mut scripts = ScriptLibrary::default();
    scripts.insert(
        "refund",
        vec![
            ScriptedTurn::call("refund", json!({"order": "A1"})),
            ScriptedTurn::text("Refunded."),
        ],
    );
    let mut tools = ToolRegistry::default();
    tools.register(RefundTool(refund.clone()));
    let agent = Arc::new(Agent::new(Arc::new(scripts)).with_tools(tools));
    let (stop, stopped) = watch::channel(false);
    for i in 0..workers {
        let options = WorkerOptions {
            id: format!("w{i}-{}", Uuid::now_v7().simple()),
            concurrency: 2,
            lease_ttl,
        };
        let worker = Worker::new(
            agent.clone(),
            log.clone(),
            queue.clone(),
            ledger.clone(),
            options,
        );
        tokio::spawn(Arc::new(worker).run(stopped.clone()));
    }
    let (l, q, mut r) = (log.clone(), queue.clone(), stopped);
    tokio::spawn(async move {
        while !*r.borrow_and_update() {
            if let Ok(jobs) = l.outbox(100).await {
                for (id, job) in jobs {
                    q.publish(&job).await.unwrap();
                    let _ = l.outbox_done(&[id]).await;
                }
            }
            if let Ok(orphans) = l.orphaned(100).await {
                for orphan in orphans {
                    q.publish(&orphan.job).await.unwrap();
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    Some(Setup {
        pg,
        log,
        ledger,
        _keys: keys,
        refund,
        stop,
    })
}

impl Setup {
    /// Submit a run whose refund needs an approval, wait for it to park
    /// there and approve it.
    async fn submit_and_approve(&self) -> Uuid {
        let run_id = Uuid::now_v7();
        let mut config = RunConfig {
            model: "script:refund".into(),
            ..RunConfig::default()
        };
        config.policies.push(Policy {
            tool: "refund".into(),
            args: None,
            action: PolicyAction::RequireApproval,
        });
        // An interrupted refund goes back to a person: the re-approval the
        // held result must spare.
        config.on_interrupted_call = InterruptedCall::RequireApproval;
        let start = Event {
            run_id,
            seq: 1,
            at: chrono::Utc::now(),
            kind: EventKind::SessionStart {
                redactions: Vec::new(),
                goal: "refund A1".into(),
                config,
            },
        };
        self.log
            .create_run(NewRun {
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
        let state = state_when(&*self.log, run_id, "parked at the approval", |s| {
            matches!(s.parked, Some(PullPoint::AwaitingApproval { .. }))
        })
        .await;
        let call = &state.pending_calls[0];
        let decision = Payload::Approval {
            call_id: call.call_id.clone(),
            args_hash: call.args_hash.clone(),
            decision: Decision::Approve,
            by: Some("ana".into()),
            request_seq: None,
        };
        self.log.post(run_id, decision).await.unwrap();
        run_id
    }

    /// Wait until the refund runs, stop Postgres with `mode`, let the refund
    /// return, and wait until its result is held in Redis: it exists, and
    /// the log cannot have it. Returns the call's idempotency key.
    async fn finish_while_down(&self, mode: StopMode) -> String {
        tokio::time::timeout(Duration::from_secs(120), self.refund.started.notified())
            .await
            .expect("the refund starts after its approval");
        let key = self
            .refund
            .key
            .lock()
            .unwrap()
            .clone()
            .expect("the refund saw its idempotency key");
        let pg = self.pg.clone();
        tokio::task::spawn_blocking(move || pg.stop(mode))
            .await
            .unwrap();
        self.refund.finish.notify_one();
        let held = until(60, "the result held in Redis", || async {
            self.ledger.held_result(&key).await.unwrap()
        })
        .await;
        assert!(
            held.error.is_none() && held.content.to_text().contains("\"execution\":1"),
            "{held:?}"
        );
        key
    }

    async fn start_pg(&self) {
        let pg = self.pg.clone();
        tokio::task::spawn_blocking(move || pg.start())
            .await
            .unwrap();
    }

    /// The run once done; its events.
    async fn done(&self, run_id: Uuid) -> (RunState, Vec<Event>) {
        let state = state_when(&*self.log, run_id, "done", |s| s.outcome.is_some()).await;
        let events = self.log.events(run_id, 0, 1000).await.unwrap();
        (state, events)
    }
}

fn count(events: &[Event], pred: impl Fn(&EventKind) -> bool) -> usize {
    events.iter().filter(|e| pred(&e.kind)).count()
}

/// Executed once, one result, one approval asked (none again), succeeded.
fn assert_once(refund: &Refund, state: &RunState, events: &[Event]) {
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.name()).collect();
    assert!(
        matches!(&state.outcome, Some(Outcome::Succeeded { answer, .. }) if answer == "Refunded."),
        "{:?}: {kinds:?}",
        state.outcome
    );
    assert_eq!(
        refund.executions.load(Ordering::SeqCst),
        1,
        "the refund ran once: {kinds:?}"
    );
    assert_eq!(
        count(events, |k| matches!(k, EventKind::ApprovalRequested { .. })),
        1,
        "nobody was asked again: {kinds:?}"
    );
    assert_eq!(
        count(events, |k| matches!(k, EventKind::ToolResult { .. })),
        1,
        "one result: {kinds:?}"
    );
    assert_eq!(
        count(events, |k| matches!(k, EventKind::ToolError { .. })),
        0,
        "no outcome-unknown: {kinds:?}"
    );
    let result = events.iter().find_map(|e| match &e.kind {
        EventKind::ToolResult { content, .. } => Some(content.to_text().into_owned()),
        _ => None,
    });
    assert!(
        result.is_some_and(|r| r.contains("\"execution\":1")),
        "the result is the first execution's: {kinds:?}"
    );
}

/// The worker that ran the call commits it after a 2 s outage (fast stop
/// and crash): its lease (30 s) outlives the outage.
async fn committed_by_its_worker(mode: StopMode) {
    let Some(s) = setup(1, Duration::from_secs(30)).await else {
        return;
    };
    let run_id = s.submit_and_approve().await;
    let key = s.finish_while_down(mode).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.start_pg().await;
    let (state, events) = s.done(run_id).await;
    assert_once(&s.refund, &state, &events);
    assert_eq!(
        count(&events, |k| matches!(k, EventKind::ToolRecovered { .. })),
        0,
        "committed by the worker that ran it, not recovered"
    );
    let taken_over = s.log.get_run(run_id).await.unwrap();
    assert_eq!(taken_over.status, glia_backends::RunStatus::Done);
    until(30, "the held result released once committed", || async {
        s.ledger
            .held_result(&key)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let _ = s.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_finishes_while_postgres_restarts_fast_is_committed_once_without_a_second_approval()
 {
    committed_by_its_worker(StopMode::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_finishes_while_postgres_crashes_is_committed_once_without_a_second_approval() {
    committed_by_its_worker(StopMode::Immediate).await;
}

/// The outage outlasts the lease (2 s): the worker that ran the call gives
/// up on its commit; the next worker to open the run finds the held result
/// and commits it (`tool.recovered`) instead of asking a person again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_during_the_outage_leaves_the_held_result_to_the_next_worker() {
    let lease = Duration::from_secs(2);
    let Some(s) = setup(2, lease).await else {
        return;
    };
    let run_id = s.submit_and_approve().await;
    let key = s.finish_while_down(StopMode::Immediate).await;
    // Well past the lease (as renewed last, before the stop).
    tokio::time::sleep(lease * 3).await;
    s.start_pg().await;
    let (state, events) = s.done(run_id).await;
    assert_once(&s.refund, &state, &events);
    let recovered: Vec<(u64, &EventKind)> = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ToolRecovered { .. }))
        .map(|e| (e.seq, &e.kind))
        .collect();
    assert_eq!(
        recovered.len(),
        1,
        "recovered once: {:?}",
        events.iter().map(|e| e.kind.name()).collect::<Vec<_>>()
    );
    let (
        seq,
        EventKind::ToolRecovered {
            idempotency_key, ..
        },
    ) = recovered[0]
    else {
        unreachable!()
    };
    assert_eq!(
        idempotency_key, &key,
        "found under the call's idempotency key"
    );
    let next = events
        .iter()
        .find(|e| e.seq == seq + 1)
        .map(|e| e.kind.name());
    assert_eq!(
        next,
        Some("tool.result"),
        "the recovered result follows its marker"
    );
    until(30, "the held result released once committed", || async {
        s.ledger
            .held_result(&key)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let _ = s.stop.send(true);
}

/// The held result is lost with Redis too (flushed): then, and only then,
/// the call is interrupted and a person is asked again, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_held_result_the_interrupted_call_is_put_to_a_person_again() {
    let lease = Duration::from_secs(2);
    let Some(s) = setup(2, lease).await else {
        return;
    };
    let run_id = s.submit_and_approve().await;
    let key = s.finish_while_down(StopMode::Immediate).await;
    s.ledger
        .release_held(std::slice::from_ref(&key))
        .await
        .unwrap();
    tokio::time::sleep(lease * 3).await;
    s.start_pg().await;
    let state = state_when(&*s.log, run_id, "asking again", |st| {
        matches!(st.parked, Some(PullPoint::AwaitingApproval { .. }))
            && st.pending_calls[0].interrupted
    })
    .await;
    let events = s.log.events(run_id, 0, 1000).await.unwrap();
    assert_eq!(
        count(&events, |k| matches!(k, EventKind::ToolRecovered { .. })),
        0
    );
    assert_eq!(
        count(&events, |k| matches!(
            k,
            EventKind::ApprovalRequested {
                interrupted: true,
                ..
            }
        )),
        1,
        "asked again, marked interrupted"
    );
    assert_eq!(
        s.refund.executions.load(Ordering::SeqCst),
        1,
        "not run again without a person's word"
    );
    assert!(state.pending_calls[0].result.is_none());
    let _ = s.stop.send(true);
}

/// The run's lease token in the private cluster (`None` once released).
fn lease_token(s: &Setup, run_id: Uuid) -> Option<String> {
    let sql = format!("SELECT coalesce(lease_token::text, '') FROM runs WHERE id = '{run_id}'");
    let token = glia_testkit::fleet::psql(&s.pg.admin_url(), &sql);
    (!token.is_empty()).then_some(token)
}

/// The outage outlasts the lease while the call is still running (it has
/// not returned yet): the worker that takes the run over finds the call
/// marked running (`Ledger::mark_running`), neither asks a person again nor
/// calls it outcome-unknown, and lets go; once the call returns and its
/// result is held, the next try recovers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_still_running_when_its_lease_is_lost_is_waited_for_not_put_to_a_person() {
    let lease = Duration::from_secs(2);
    let Some(s) = setup(2, lease).await else {
        return;
    };
    let run_id = s.submit_and_approve().await;
    tokio::time::timeout(Duration::from_secs(120), s.refund.started.notified())
        .await
        .expect("the refund starts after its approval");
    let key = s.refund.key.lock().unwrap().clone().unwrap();
    assert!(
        lease_token(&s, run_id).is_some(),
        "held while the call runs"
    );
    assert!(s.ledger.running(&key).await.unwrap(), "marked running");
    let pg = s.pg.clone();
    tokio::task::spawn_blocking(move || pg.stop(StopMode::Immediate))
        .await
        .unwrap();
    tokio::time::sleep(lease * 3).await;
    s.start_pg().await;
    // Released: the worker that ran the call cannot let go before the call
    // returns, so another worker (or slot) has opened the run under a new
    // lease, decided about the interrupted call and let go again.
    until(120, "the run taken over and let go", || async {
        lease_token(&s, run_id).is_none().then_some(())
    })
    .await;
    let events = s.log.events(run_id, 0, 1000).await.unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.name()).collect();
    assert_eq!(
        count(&events, |k| matches!(
            k,
            EventKind::ApprovalRequested { .. }
        )),
        1,
        "nobody asked again while the call runs: {kinds:?}"
    );
    assert_eq!(
        count(&events, |k| matches!(k, EventKind::ToolError { .. })),
        0,
        "not outcome-unknown while the call runs: {kinds:?}"
    );
    assert!(
        s.ledger.running(&key).await.unwrap(),
        "the mark is refreshed while the call runs"
    );
    s.refund.finish.notify_one();
    let (state, events) = s.done(run_id).await;
    assert_once(&s.refund, &state, &events);
    assert_eq!(
        count(&events, |k| matches!(k, EventKind::ToolRecovered { .. })),
        1,
        "recovered by the worker that took the run over"
    );
    assert!(!s.ledger.running(&key).await.unwrap(), "unmarked once held");
    let _ = s.stop.send(true);
}
