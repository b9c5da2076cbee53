//! A cancel does not manufacture unknown outcomes: on the real services
//! (Postgres event log, RabbitMQ jobs, Redis cancel flag), a worker that sees
//! a run cancelled while its tool calls run lets each finish within its
//! tool's grace period and records its result; only a call still running
//! when its grace ends is abandoned (its task aborted) as `outcome_unknown`.
//! Then the posted cancel ends the run.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use glia_agent::Agent;
use glia_agent::provider::{ScriptLibrary, ScriptedTurn};
use glia_agent::tool::{Tool, ToolContext, ToolFailure, ToolRegistry};
use glia_backends::postgres::PgOptions;
use glia_backends::rabbitmq::{QueueOptions, RabbitQueue};
use glia_backends::redis_ledger::RedisLedger;
use glia_backends::testkit::{RedisKeys, TestDb};
use glia_backends::{Inbox, JobQueue, Ledger, NewRun, Outbox, RunLog};
use glia_proto::{Event, EventKind, Outcome, Payload, RunConfig, ToolErrorKind};
use glia_worker::consumer::{Worker, WorkerOptions};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use uuid::Uuid;

#[derive(Deserialize, JsonSchema)]
struct NoArgs {}

/// Sets its flag when dropped: a task that is aborted drops its future.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Takes `takes`, may finish within `grace` of a cancel; `started` is set
/// when it begins, `dropped` when its future is dropped (done or aborted).
struct Sleeper {
    name: &'static str,
    takes: Duration,
    grace: Duration,
    started: Arc<AtomicBool>,
    dropped: Arc<AtomicBool>,
}

impl Sleeper {
    fn new(name: &'static str, takes: Duration, grace: Duration) -> Sleeper {
        Sleeper {
            name,
            takes,
            grace,
            started: Arc::default(),
            dropped: Arc::default(),
        }
    }
}

impl Tool for Sleeper {
    type Args = NoArgs;
    type Output = Value;
    fn name(&self) -> &str {
        self.name
    }
    fn description(&self) -> &str {
        "Takes a while."
    }
    fn timeout(&self) -> Duration {
        Duration::from_secs(120)
    }
    fn cancel_grace(&self) -> Duration {
        self.grace
    }
    async fn call(&self, _args: NoArgs, _ctx: ToolContext) -> Result<Value, ToolFailure> {
        let _guard = SetOnDrop(self.dropped.clone());
        self.started.store(true, Ordering::SeqCst);
        tokio::time::sleep(self.takes).await;
        Ok(json!({"done": self.name}))
    }
}

fn env(key: &str, default: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| default.to_owned())
}

/// Poll `check` every 20 ms until it is true, for at most `within`.
async fn until(within: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "waited {within:?} for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_lets_running_calls_finish_within_their_grace_and_abandons_the_rest() {
    let name = format!("glia_cg_{}", Uuid::now_v7().simple());
    let db = TestDb::new().await;
    let log = Arc::new(
        db.log_with(PgOptions {
            max_connections: 4,
            ..Default::default()
        })
        .await,
    );
    let queue = Arc::new(
        RabbitQueue::connect(
            &env("GLIA_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f"),
            QueueOptions::new(&name),
        )
        .await
        .expect("RabbitMQ"),
    );
    let redis = env("GLIA_REDIS_URL", "redis://127.0.0.1:6379");
    let _keys = RedisKeys {
        url: redis.clone(),
        prefix: name.clone(),
    };
    let ledger = Arc::new(RedisLedger::connect(&redis, &name).await.expect("Redis"));

    // `quick` outlasts the cancel poll but not its grace; `stuck` outlasts its grace.
    let quick = Sleeper::new(
        "quick",
        Duration::from_millis(2500),
        Duration::from_secs(30),
    );
    let stuck = Sleeper::new(
        "stuck",
        Duration::from_secs(600),
        Duration::from_millis(300),
    );
    let (quick_done, stuck_started, stuck_dropped) = (
        quick.dropped.clone(),
        stuck.started.clone(),
        stuck.dropped.clone(),
    );
    let mut tools = ToolRegistry::default();
    tools.register(quick).register(stuck);
    let mut scripts = ScriptLibrary::default();
    scripts.insert(
        "both",
        vec![
            ScriptedTurn::calls(&[("quick", json!({})), ("stuck", json!({}))]),
            ScriptedTurn::text("never asked"),
        ],
    );
    let agent = Arc::new(Agent::new(Arc::new(scripts)).with_tools(tools));
    let (stop, stopped) = watch::channel(false);
    let options = WorkerOptions {
        id: "w-grace".into(),
        concurrency: 2,
        lease_ttl: Duration::from_secs(30),
    };
    let worker = Arc::new(Worker::new(
        agent,
        log.clone(),
        queue.clone(),
        ledger.clone(),
        options,
    ));
    let worker_task = tokio::spawn(worker.run(stopped.clone()));
    // The relay, as the dispatcher runs it.
    let (l, q, mut r) = (log.clone(), queue.clone(), stopped);
    let relay = tokio::spawn(async move {
        while !*r.borrow_and_update() {
            for (id, job) in l.outbox(100).await.unwrap() {
                q.publish(&job).await.unwrap();
                l.outbox_done(&[id]).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });

    let run_id = Uuid::now_v7();
    let config = RunConfig {
        model: "script:both".into(),
        ..RunConfig::default()
    };
    let start = Event {
        run_id,
        seq: 1,
        at: chrono::Utc::now(),
        kind: EventKind::SessionStart {
            redactions: Vec::new(),
            goal: "sleep".into(),
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
    until(Duration::from_secs(30), "both calls to run", async || {
        stuck_started.load(Ordering::SeqCst)
    })
    .await;
    // What the dispatcher does on POST /cancel.
    log.post(
        run_id,
        Payload::Cancel {
            reason: "stop".into(),
        },
    )
    .await
    .unwrap();
    ledger.cancel(run_id).await.unwrap();
    let cancelled_at = Instant::now();
    until(Duration::from_secs(60), "the run to end", async || {
        log.get_run(run_id).await.unwrap().outcome.is_some()
    })
    .await;

    let events = log.events(run_id, 0, 1000).await.unwrap();
    let results: Vec<(String, Option<ToolErrorKind>, String)> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult {
                call_id, content, ..
            } => Some((call_id.clone(), None, content.to_string())),
            EventKind::ToolError {
                call_id,
                error,
                message,
                ..
            } => Some((call_id.clone(), Some(*error), message.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 2, "both calls have an outcome: {results:?}");
    assert_eq!(
        (results[0].1, results[0].2.as_str()),
        (None, r#"{"done":"quick"}"#),
        "the call that finished in its grace kept its result"
    );
    assert_eq!(
        results[1].1,
        Some(ToolErrorKind::OutcomeUnknown),
        "{results:?}"
    );
    assert!(
        results[1].2.contains("grace period of 300 ms"),
        "{}",
        results[1].2
    );
    let last = &events.last().unwrap().kind;
    assert_eq!(
        *last,
        EventKind::SessionCancel {
            reason: "stop".into()
        }
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.kind, EventKind::ModelCall { .. })
                && e.seq
                    > events
                        .iter()
                        .find(|e| matches!(e.kind, EventKind::ToolCall(_)))
                        .unwrap()
                        .seq),
        "no model call after the cancel"
    );
    assert!(matches!(
        log.get_run(run_id).await.unwrap().outcome,
        Some(Outcome::Cancelled { .. })
    ));
    assert!(quick_done.load(Ordering::SeqCst));
    until(
        Duration::from_secs(10),
        "the abandoned call's task to be aborted",
        async || stuck_dropped.load(Ordering::SeqCst),
    )
    .await;
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(30),
        "the stuck call was not waited for"
    );

    let _ = stop.send(true);
    let _ = worker_task.await;
    let _ = relay.await;
    let _ = queue.delete_topology().await;
}
