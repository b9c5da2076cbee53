//! Workers over the in-memory ports: many runs, approvals, external tools,
//! user messages, budget pauses, lost leases. (The same scenarios run against
//! the real services in the end-to-end tests.)

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Add, AddArgs};
use glia_agent::Agent;
use glia_agent::provider::{ScriptLibrary, ScriptedTurn};
use glia_agent::tool::{Tool, ToolContext, ToolFailure, ToolRegistry};
use glia_backends::memory::{MemoryLedger, MemoryLog, MemoryQueue};
use glia_backends::{Inbox, JobQueue, NewRun, Outbox, RunFilter, RunLog, RunStatus};
use glia_proto::{
    BudgetLimits, Decision, Event, EventKind, Outcome, Payload, Policy, PolicyAction, PullPoint,
    RunConfig, RunState, ToolSpec,
};
use glia_worker::consumer::{Worker, WorkerOptions};
use serde_json::{Value, json};
use tokio::sync::watch;
use uuid::Uuid;

struct Nap;
impl Tool for Nap {
    type Args = AddArgs;
    type Output = Value;
    fn name(&self) -> &str {
        "nap"
    }
    fn description(&self) -> &str {
        "Sleep a little."
    }
    async fn call(&self, _args: AddArgs, _ctx: ToolContext) -> Result<Value, ToolFailure> {
        tokio::time::sleep(Duration::from_millis(30)).await;
        Ok(json!({}))
    }
}

struct Fleet {
    log: Arc<MemoryLog>,
    queue: Arc<MemoryQueue>,
    ledger: Arc<MemoryLedger>,
    stop: watch::Sender<bool>,
    agent: Arc<Agent>,
    lease_ttl: Duration,
}

/// The scripts of the runs here, by name.
pub(crate) fn scripts() -> ScriptLibrary {
    let mut lib = ScriptLibrary::default();
    lib.insert(
        "plain",
        vec![
            ScriptedTurn::call("add", json!({"a": 1, "b": 2})),
            ScriptedTurn::text("3"),
        ],
    );
    lib.insert(
        "approval",
        vec![
            ScriptedTurn::call("refund", json!({"order": "A1"})),
            ScriptedTurn::text("refunded"),
        ],
    );
    lib.insert(
        "external",
        vec![
            ScriptedTurn::call("ask", json!({"q": "which?"})),
            ScriptedTurn::text("thanks"),
        ],
    );
    lib.insert(
        "chat",
        vec![ScriptedTurn::text("hello"), ScriptedTurn::text("bye")],
    );
    lib.insert(
        "budget",
        vec![
            ScriptedTurn::call("add", json!({"a": 1, "b": 1})),
            ScriptedTurn::text("2"),
        ],
    );
    let mut long: Vec<ScriptedTurn> = (0..20)
        .map(|i| ScriptedTurn::call("nap", json!({"a": i, "b": 0})))
        .collect();
    long.push(ScriptedTurn::text("rested"));
    lib.insert("long", long);
    lib
}

/// A new run of `script` (from [`scripts`]), tenant `t`.
pub(crate) fn new_run(script: &str) -> NewRun {
    let run_id = Uuid::now_v7();
    let start = Event {
        run_id,
        seq: 1,
        at: chrono::Utc::now(),
        kind: EventKind::SessionStart {
            redactions: Vec::new(),
            goal: script.into(),
            config: config(script),
        },
    };
    NewRun {
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
    }
}

fn config(script: &str) -> RunConfig {
    let mut c = RunConfig {
        model: format!("script:{script}"),
        ..RunConfig::default()
    };
    c.external_tools.push(ToolSpec {
        name: "ask".into(),
        description: "Ask the client.".into(),
        input_schema: json!({"type": "object"}),
        idempotent: false,
        timeout_ms: 0,
        external: true,
        return_direct: false,
        cancel_grace_ms: glia_proto::DEFAULT_CANCEL_GRACE_MS,
        source: None,
        policy: None,
        max_result_bytes: None,
        output_schema: None,
    });
    c.external_tools.push(ToolSpec {
        name: "refund".into(),
        description: "Refund.".into(),
        input_schema: json!({"type": "object"}),
        idempotent: false,
        timeout_ms: 0,
        external: true,
        return_direct: false,
        cancel_grace_ms: glia_proto::DEFAULT_CANCEL_GRACE_MS,
        source: None,
        policy: None,
        max_result_bytes: None,
        output_schema: None,
    });
    c.policies.push(Policy {
        tool: "refund".into(),
        args: None,
        action: PolicyAction::RequireApproval,
    });
    match script {
        "chat" => c.conversational = true,
        "budget" => {
            c.budget = BudgetLimits {
                max_turns: Some(1),
                ..BudgetLimits::default()
            }
        }
        _ => {}
    }
    c
}

impl Fleet {
    fn start(workers: usize, lease_ttl: Duration) -> Fleet {
        Fleet::start_with(workers, lease_ttl, Arc::new(scripts()), true)
    }

    /// A fleet whose workers call `provider`; without `reconcile`, lost jobs
    /// are not re-enqueued (the outbox is still relayed).
    fn start_with(
        workers: usize,
        lease_ttl: Duration,
        provider: Arc<dyn glia_agent::provider::Provider>,
        reconcile: bool,
    ) -> Fleet {
        let log = Arc::new(MemoryLog::default());
        let queue = Arc::new(MemoryQueue::default());
        let ledger = Arc::new(MemoryLedger::default());
        let (stop, rx) = watch::channel(false);
        let mut tools = ToolRegistry::default();
        tools.register(Add).register(Nap);
        let agent = Arc::new(Agent::new(provider).with_tools(tools));
        // Relay and reconciler, as the dispatcher runs them.
        let (l, q, mut r) = (log.clone(), queue.clone(), rx.clone());
        tokio::spawn(async move {
            let mut tick = 0u32;
            while !*r.borrow_and_update() {
                for (id, job) in l.outbox(100).await.unwrap() {
                    q.publish(&job).await.unwrap();
                    l.outbox_done(&[id]).await.unwrap();
                }
                tick += 1;
                if reconcile && tick.is_multiple_of(20) {
                    for orphan in l.orphaned(100).await.unwrap() {
                        q.publish(&orphan.job).await.unwrap();
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        let fleet = Fleet {
            log,
            queue,
            ledger,
            stop,
            agent,
            lease_ttl,
        };
        fleet.spawn_workers(workers);
        fleet
    }

    /// Start `n` more workers.
    /// Wait until the queue is empty (every job published so far taken),
    /// then submit a plain run and drive it to its end: a positive marker
    /// that the workers have got past those jobs, for a test that then checks
    /// they changed nothing.
    async fn taken_everything(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while self.queue.depth().await.unwrap() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the workers took no job for 30 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let sentinel = self.submit("plain").await;
        let state = self.drive(sentinel).await;
        assert!(
            matches!(state.outcome, Some(Outcome::Succeeded { .. })),
            "the sentinel run: {:?}",
            state.outcome
        );
    }

    fn spawn_workers(&self, n: usize) {
        for i in 0..n {
            let options = WorkerOptions {
                id: format!("w{i}-{}", Uuid::now_v7().simple()),
                concurrency: 4,
                lease_ttl: self.lease_ttl,
            };
            let worker = Arc::new(Worker::new(
                self.agent.clone(),
                self.log.clone(),
                self.queue.clone(),
                self.ledger.clone(),
                options,
            ));
            tokio::spawn(worker.run(self.stop.subscribe()));
        }
    }

    async fn submit(&self, script: &str) -> Uuid {
        let new = new_run(script);
        let run_id = new.start.run_id;
        self.log.create_run(new).await.unwrap();
        run_id
    }

    async fn wait_parked_or_done(&self, run_id: Uuid) -> RunState {
        for _ in 0..2000 {
            let s = self.log.get_run(run_id).await.unwrap();
            if s.status != RunStatus::Runnable && self.log.inbox(run_id).await.unwrap().is_empty() {
                // The three reads are not one snapshot: a worker may have
                // consumed a payload in between. Settled means the state
                // itself waits or is done.
                let state = self.log.load(run_id).await.unwrap();
                if state.status() != glia_proto::Status::Runnable {
                    return state;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!(
            "run {run_id} never settled: {:?}",
            self.log.get_run(run_id).await.unwrap()
        );
    }

    /// Post whatever the run waits for until it is done.
    async fn drive(&self, run_id: Uuid) -> RunState {
        let mut replies = 0;
        loop {
            let state = self.wait_parked_or_done(run_id).await;
            let payload = match &state.parked {
                None => return state,
                Some(PullPoint::AwaitingApproval { call_ids }) => {
                    let c = state.call(&call_ids[0]).unwrap();
                    Payload::Approval {
                        call_id: c.call_id.clone(),
                        args_hash: c.args_hash.clone(),
                        decision: Decision::Approve,
                        by: None,
                        request_seq: None,
                    }
                }
                Some(PullPoint::AwaitingTool { call_ids }) => Payload::ToolResult {
                    call_id: call_ids[0].clone(),
                    content: "A1".into(),
                    is_error: false,
                },
                Some(PullPoint::AwaitingInput) if replies == 0 => {
                    replies += 1;
                    Payload::Input {
                        text: "refund please".into(),
                        redactions: Vec::new(),
                    }
                }
                Some(PullPoint::AwaitingInput) if replies == 1 => {
                    replies += 1;
                    Payload::Close {
                        text: None,
                        redactions: Vec::new(),
                    }
                }
                Some(PullPoint::AwaitingInput) => Payload::Cancel {
                    reason: "conversation over".into(),
                },
                Some(PullPoint::Paused { .. }) => Payload::ExtendBudget {
                    extra: BudgetLimits {
                        max_turns: Some(5),
                        ..BudgetLimits::default()
                    },
                },
                // issue 32: waits (what the dispatcher's waits loop posts).
                Some(PullPoint::AwaitingTimer { wake_at_ms, .. }) => Payload::Wake {
                    due_at_ms: *wake_at_ms,
                    event: None,
                },
                Some(PullPoint::AwaitingEvent { timeout_at_ms, .. }) => Payload::Wake {
                    due_at_ms: timeout_at_ms.unwrap_or(i64::MAX),
                    event: None,
                },
                // Issue 32: these runs offer no agents.
                Some(PullPoint::AwaitingChildren { .. }) => {
                    panic!("no run here calls an agent")
                }
            };
            self.log.post(run_id, payload).await.unwrap();
        }
    }
}

fn check_log(events: &[Event]) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "no gap, no duplicate");
    }
    RunState::replay(events[0].run_id, events).expect("the log replays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_runs_with_every_pull_point_complete() {
    let fleet = Fleet::start(2, Duration::from_secs(30));
    let kinds = ["plain", "approval", "external", "chat", "budget"];
    let mut runs = Vec::new();
    for i in 0..50 {
        runs.push((
            kinds[i % kinds.len()],
            fleet.submit(kinds[i % kinds.len()]).await,
        ));
    }
    let drives = runs.iter().map(|(_, id)| fleet.drive(*id));
    let finals = futures::future::join_all(drives).await;
    for ((kind, run_id), state) in runs.iter().zip(finals) {
        let outcome = state
            .outcome
            .clone()
            .unwrap_or_else(|| panic!("{kind} run not done"));
        assert!(
            matches!(outcome, Outcome::Succeeded { .. }),
            "{kind}: {outcome:?}"
        );
        check_log(&fleet.log.events(*run_id, 0, 10_000).await.unwrap());
    }
    let done = fleet
        .log
        .list_runs(&RunFilter {
            status: Some(RunStatus::Done),
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(done.len(), 50);
    let _ = fleet.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_and_duplicate_jobs_change_nothing() {
    let fleet = Fleet::start(1, Duration::from_secs(30));
    let run_id = fleet.submit("plain").await;
    let state = fleet.drive(run_id).await;
    assert!(matches!(state.outcome, Some(Outcome::Succeeded { .. })));
    let before = fleet.log.events(run_id, 0, 1000).await.unwrap();
    // The first job again (stale: head 1), and a job for the current head, twice.
    for head in [1, state.head_seq, state.head_seq] {
        fleet
            .queue
            .publish(&glia_backends::Job::start(run_id, head))
            .await
            .unwrap();
    }
    // Not a fixed sleep: the worker has taken every one of those jobs (the
    // queue is empty), and a fresh run published after them has finished,
    // before the log is checked for what they changed.
    fleet.taken_everything().await;
    assert_eq!(fleet.log.events(run_id, 0, 1000).await.unwrap(), before);
    let _ = fleet.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_lease_is_taken_over_by_the_reconciler() {
    let fleet = Fleet::start(0, Duration::from_millis(300));
    let run_id = fleet.submit("plain").await;
    // The lease as a dead worker would hold it, before any worker runs the job.
    let _dead = fleet
        .log
        .acquire(run_id, "dead-worker", Duration::from_millis(200))
        .await
        .unwrap();
    fleet.spawn_workers(1);
    let state = fleet.drive(run_id).await;
    assert!(
        matches!(state.outcome, Some(Outcome::Succeeded { .. })),
        "{:?}",
        state.outcome
    );
    check_log(&fleet.log.events(run_id, 0, 1000).await.unwrap());
    let _ = fleet.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_a_running_run_at_its_next_step() {
    use glia_backends::Ledger;
    let fleet = Fleet::start(1, Duration::from_secs(30));
    let run_id = fleet.submit("long").await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    // What the dispatcher does on POST /cancel: post the cancel, raise the flag.
    fleet
        .log
        .post(
            run_id,
            Payload::Cancel {
                reason: "stop".into(),
            },
        )
        .await
        .unwrap();
    fleet.ledger.cancel(run_id).await.unwrap();
    let state = fleet.wait_parked_or_done(run_id).await;
    assert_eq!(
        state.outcome,
        Some(Outcome::Cancelled {
            reason: "stop".into()
        })
    );
    let events = fleet.log.events(run_id, 0, 10_000).await.unwrap();
    let naps = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ToolResult { .. }))
        .count();
    assert!(naps < 20, "the run stopped early, after {naps} naps");
    check_log(&events);
    let _ = fleet.stop.send(true);
}

/// Wait for the `long` run to settle, resuming it each time it uses its
/// turn's model calls (`paused` with reason `turn_limit`).
async fn past_turn_limits(fleet: &Fleet, run_id: Uuid) -> RunState {
    loop {
        let state = fleet.wait_parked_or_done(run_id).await;
        if state.parked
            != Some(PullPoint::Paused {
                reason: glia_proto::PauseReason::TurnLimit,
            })
        {
            return state;
        }
        fleet
            .log
            .post(run_id, Payload::Resume { by: None })
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_parks_a_running_run_at_its_next_step_and_a_resume_finishes_it() {
    use glia_backends::Ledger;
    let fleet = Fleet::start(1, Duration::from_secs(30));
    let run_id = fleet.submit("long").await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    // What the dispatcher does on POST /pause: post the pause, raise the flag.
    fleet
        .log
        .post(
            run_id,
            Payload::Pause {
                reason: "audit".into(),
                by: Some("ops".into()),
            },
        )
        .await
        .unwrap();
    fleet.ledger.set_paused(run_id, true).await.unwrap();
    let state = fleet.wait_parked_or_done(run_id).await;
    assert_eq!(
        state.parked,
        Some(PullPoint::Paused {
            reason: glia_proto::PauseReason::Operator {
                reason: "audit".into()
            }
        })
    );
    let events = fleet.log.events(run_id, 0, 10_000).await.unwrap();
    let naps = |events: &[Event]| {
        events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::ToolResult { .. }))
            .count()
    };
    assert!(
        naps(&events) < 20,
        "the run paused early, after {} naps",
        naps(&events)
    );
    let requested = events
        .iter()
        .position(|e| matches!(e.kind, EventKind::SessionPauseRequested { .. }))
        .expect("the request is recorded");
    assert!(
        matches!(events[requested + 1].kind, EventKind::SessionPause { .. }),
        "and the pause follows it at once"
    );
    // Nothing happens while it is paused, even when a job wakes it: the
    // worker takes the job (the queue empties) and finishes a run published
    // after it, before the log is checked.
    fleet
        .queue
        .publish(&glia_backends::Job::start(
            run_id,
            events.last().unwrap().seq,
        ))
        .await
        .unwrap();
    fleet.taken_everything().await;
    assert_eq!(
        fleet.log.events(run_id, 0, 10_000).await.unwrap().len(),
        events.len()
    );
    // What POST /resume does: clear the flag, post the resume.
    fleet.ledger.set_paused(run_id, false).await.unwrap();
    fleet
        .log
        .post(
            run_id,
            Payload::Resume {
                by: Some("ops".into()),
            },
        )
        .await
        .unwrap();
    let state = past_turn_limits(&fleet, run_id).await;
    assert_eq!(
        state.outcome,
        Some(Outcome::Succeeded {
            answer: "rested".into(),
            output: None
        })
    );
    let events = fleet.log.events(run_id, 0, 10_000).await.unwrap();
    assert_eq!(naps(&events), 20, "every nap ran once");
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.kind, EventKind::ToolError { .. })),
        "a pause never lands between a call and its run (no call taken for interrupted)"
    );
    let calls = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ModelCall { .. }))
        .count();
    let turn_limit_pauses = events
        .iter()
        .filter(|e| {
            matches!(
                &e.kind,
                EventKind::SessionPause {
                    pull_point: PullPoint::Paused {
                        reason: glia_proto::PauseReason::TurnLimit
                    }
                }
            )
        })
        .count();
    assert_eq!(
        calls, 21,
        "no model call is recorded twice for the pause ({turn_limit_pauses} turn-limit pauses)"
    );
    check_log(&events);
    let _ = fleet.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_flag_without_a_posted_pause_changes_nothing() {
    use glia_backends::Ledger;
    let fleet = Fleet::start(1, Duration::from_secs(30));
    let run_id = fleet.submit("long").await;
    fleet.ledger.set_paused(run_id, true).await.unwrap();
    let state = past_turn_limits(&fleet, run_id).await;
    assert_eq!(
        state.outcome,
        Some(Outcome::Succeeded {
            answer: "rested".into(),
            output: None
        }),
        "a stale flag neither pauses nor stalls the run: {:?}",
        state.parked
    );
    check_log(&fleet.log.events(run_id, 0, 10_000).await.unwrap());
    let _ = fleet.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_of_a_parked_run_takes_effect_once_its_payload_comes() {
    let fleet = Fleet::start(1, Duration::from_secs(30));
    let run_id = fleet.submit("approval").await;
    let state = fleet.wait_parked_or_done(run_id).await;
    let Some(PullPoint::AwaitingApproval { call_ids }) = state.parked.clone() else {
        panic!("parked for approval: {:?}", state.parked)
    };
    fleet
        .log
        .post(
            run_id,
            Payload::Pause {
                reason: "audit".into(),
                by: None,
            },
        )
        .await
        .unwrap();
    let state = fleet.wait_parked_or_done(run_id).await;
    assert_eq!(
        (
            state.pause_due.as_deref(),
            state.parked.as_ref().map(PullPoint::name)
        ),
        (Some("audit"), Some("awaiting_approval")),
        "still waits for its approval"
    );
    let c = state.call(&call_ids[0]).unwrap();
    let approval = Payload::Approval {
        call_id: c.call_id.clone(),
        args_hash: c.args_hash.clone(),
        decision: Decision::Approve,
        by: None,
        request_seq: None,
    };
    fleet.log.post(run_id, approval).await.unwrap();
    // The approved call is external: the run waits for its result, still pausing.
    let state = fleet.wait_parked_or_done(run_id).await;
    assert_eq!(
        (
            state.pause_due.as_deref(),
            state.parked.as_ref().map(PullPoint::name)
        ),
        (Some("audit"), Some("awaiting_tool"))
    );
    fleet
        .log
        .post(
            run_id,
            Payload::ToolResult {
                call_id: call_ids[0].clone(),
                content: "done".into(),
                is_error: false,
            },
        )
        .await
        .unwrap();
    let state = fleet.wait_parked_or_done(run_id).await;
    assert_eq!(
        state.parked,
        Some(PullPoint::Paused {
            reason: glia_proto::PauseReason::Operator {
                reason: "audit".into()
            }
        }),
        "paused once it could go on"
    );
    assert_eq!(
        state.messages.last().map(|m| m.role),
        Some(glia_proto::Role::User),
        "before the next model call"
    );
    fleet
        .log
        .post(run_id, Payload::Resume { by: None })
        .await
        .unwrap();
    let state = fleet.drive(run_id).await;
    assert_eq!(
        state.outcome,
        Some(Outcome::Succeeded {
            answer: "refunded".into(),
            output: None
        })
    );
    check_log(&fleet.log.events(run_id, 0, 10_000).await.unwrap());
    let _ = fleet.stop.send(true);
}

/// A provider that answers `plain` turns from the scripts, but first hangs
/// (`hang`) or fails once with a wait hint (`flaky`).
struct Awkward {
    scripts: ScriptLibrary,
    calls: std::sync::atomic::AtomicUsize,
}

#[glia_agent::async_trait]
impl glia_agent::provider::Provider for Awkward {
    async fn generate(
        &self,
        request: &glia_agent::provider::ModelRequest,
        live: &(dyn Fn(glia_proto::LiveEvent) + Send + Sync),
    ) -> Result<glia_agent::provider::ModelResponse, glia_agent::provider::ProviderError> {
        let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        match request.model.as_str() {
            "hang" => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                unreachable!("nobody waits an hour")
            }
            "flaky" if n == 0 => Err(glia_agent::provider::ProviderError::Transient {
                message: "overloaded".into(),
                retry_after_ms: Some(100),
            }),
            _ => {
                let request = glia_agent::provider::ModelRequest {
                    model: "script:plain".into(),
                    ..request.clone()
                };
                self.scripts.generate(&request, live).await
            }
        }
    }
}

fn awkward() -> Arc<Awkward> {
    Arc::new(Awkward {
        scripts: scripts(),
        calls: Default::default(),
    })
}

async fn submit_model(fleet: &Fleet, model: &str) -> Uuid {
    let run_id = Uuid::now_v7();
    let config = RunConfig {
        model: model.into(),
        ..RunConfig::default()
    };
    let start = Event {
        run_id,
        seq: 1,
        at: chrono::Utc::now(),
        kind: EventKind::SessionStart {
            redactions: Vec::new(),
            goal: "go".into(),
            config,
        },
    };
    fleet
        .log
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
    run_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_aborts_a_model_call_in_flight() {
    use glia_backends::Ledger;
    let fleet = Fleet::start_with(1, Duration::from_secs(30), awkward(), true);
    let run_id = submit_model(&fleet, "hang").await;
    // Wait until the model call is in flight (durable `model.call`).
    for _ in 0..400 {
        if fleet
            .log
            .events(run_id, 0, 100)
            .await
            .unwrap()
            .iter()
            .any(|e| matches!(e.kind, EventKind::ModelCall { .. }))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let asked = std::time::Instant::now();
    fleet
        .log
        .post(
            run_id,
            Payload::Cancel {
                reason: "stop".into(),
            },
        )
        .await
        .unwrap();
    fleet.ledger.cancel(run_id).await.unwrap();
    let state = fleet.wait_parked_or_done(run_id).await;
    assert_eq!(
        state.outcome,
        Some(Outcome::Cancelled {
            reason: "stop".into()
        })
    );
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "the hanging call was abandoned, not waited for"
    );
    check_log(&fleet.log.events(run_id, 0, 1000).await.unwrap());
    let _ = fleet.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_failure_is_retried_when_the_provider_says_not_when_the_lease_lapses() {
    // No reconciler: only the worker's own retry can bring the run back.
    let fleet = Fleet::start_with(1, Duration::from_secs(30), awkward(), false);
    let run_id = submit_model(&fleet, "flaky").await;
    let started = std::time::Instant::now();
    let state = fleet.wait_parked_or_done(run_id).await;
    assert!(
        matches!(state.outcome, Some(Outcome::Succeeded { .. })),
        "{:?}",
        state.outcome
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "retried after the hint (100 ms), long before the 30 s lease lapsed"
    );
    let events = fleet.log.events(run_id, 0, 1000).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| matches!(&e.kind, EventKind::Error { fatal: false, .. }))
    );
    check_log(&events);
    let _ = fleet.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_for_a_run_held_elsewhere_is_retried_later() {
    // No reconciler: only the worker's own retry can bring the job back.
    let fleet = Fleet::start_with(1, Duration::from_secs(30), Arc::new(scripts()), false);
    let run_id = fleet.submit("approval").await;
    let state = fleet.wait_parked_or_done(run_id).await;
    let call = state.pending_calls[0].clone();
    // Another holder (a worker about to let go) has the run when the
    // decision's job arrives.
    let other = fleet
        .log
        .acquire(run_id, "other", Duration::from_secs(60))
        .await
        .unwrap();
    let decision = Payload::Approval {
        call_id: call.call_id,
        args_hash: call.args_hash,
        decision: glia_proto::Decision::Approve,
        by: None,
        request_seq: call.requested_seq,
    };
    fleet.log.post(run_id, decision).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    fleet.log.release(&other).await.unwrap();
    // The refund is external: the approved call now waits for its result.
    // Applied while the other lease (60 s) is still far from lapsing: only
    // the worker's own retry can have brought the job back. Polled up to
    // 30 s (half the lease), not a tight window a busy machine can miss.
    let started = std::time::Instant::now();
    while !fleet.log.inbox(run_id).await.unwrap().is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the decision was not applied within 30 s, half the other lease"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let state = fleet.log.load(run_id).await.unwrap();
    assert_eq!(
        state.pending_calls[0].approval,
        glia_proto::ApprovalStatus::Approved
    );
    let _ = fleet.stop.send(true);
}
