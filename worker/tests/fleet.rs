//! Workers over the in-memory ports: many runs, approvals, external tools,
//! user messages, budget pauses, lost leases. (The same scenarios run against
//! the real services in the end-to-end tests.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Add, AddArgs};
use glia_backends::memory::{MemoryLedger, MemoryLog, MemoryQueue};
use glia_backends::{EventLog, JobQueue, NewRun, RunFilter, RunStatus};
use glia_proto::{BudgetLimits, Decision, Event, EventKind, Outcome, Policy, PolicyAction, PullPoint, Resume, RunConfig, RunState, ToolSpec};
use glia_worker::fleet::{Worker, WorkerOptions};
use glia_worker::provider::{ScriptLibrary, ScriptedTurn};
use glia_worker::tool::{Tool, ToolContext, ToolFailure, ToolRegistry};
use glia_worker::Agent;
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
}

fn scripts() -> ScriptLibrary {
    let mut lib = ScriptLibrary::default();
    lib.insert("plain", vec![ScriptedTurn::call("add", json!({"a": 1, "b": 2})), ScriptedTurn::text("3")]);
    lib.insert("approval", vec![ScriptedTurn::call("refund", json!({"order": "A1"})), ScriptedTurn::text("refunded")]);
    lib.insert("external", vec![ScriptedTurn::call("ask", json!({"q": "which?"})), ScriptedTurn::text("thanks")]);
    lib.insert("chat", vec![ScriptedTurn::text("hello"), ScriptedTurn::text("bye")]);
    lib.insert("budget", vec![ScriptedTurn::call("add", json!({"a": 1, "b": 1})), ScriptedTurn::text("2")]);
    let mut long: Vec<ScriptedTurn> = (0..20).map(|i| ScriptedTurn::call("nap", json!({"a": i, "b": 0}))).collect();
    long.push(ScriptedTurn::text("rested"));
    lib.insert("long", long);
    lib
}

fn config(script: &str) -> RunConfig {
    let mut c = RunConfig { model: format!("script:{script}"), ..RunConfig::default() };
    c.external_tools.push(ToolSpec { name: "ask".into(), description: "Ask the client.".into(), input_schema: json!({"type": "object"}), idempotent: false, timeout_ms: 0, external: true, return_direct: false });
    c.external_tools.push(ToolSpec { name: "refund".into(), description: "Refund.".into(), input_schema: json!({"type": "object"}), idempotent: false, timeout_ms: 0, external: true, return_direct: false });
    c.policies.push(Policy { tool: "refund".into(), args: None, action: PolicyAction::RequireApproval });
    match script {
        "chat" => c.conversational = true,
        "budget" => c.budget = BudgetLimits { max_turns: Some(1), ..BudgetLimits::default() },
        _ => {}
    }
    c
}

impl Fleet {
    fn start(workers: usize, lease_ttl: Duration) -> Fleet {
        let log = Arc::new(MemoryLog::default());
        let queue = Arc::new(MemoryQueue::default());
        let ledger = Arc::new(MemoryLedger::default());
        let (stop, rx) = watch::channel(false);
        let mut tools = ToolRegistry::default();
        tools.register(Add).register(Nap);
        let agent = Arc::new(Agent::new(Arc::new(scripts())).with_tools(tools));
        for i in 0..workers {
            let options = WorkerOptions { id: format!("w{i}"), concurrency: 4, lease_ttl };
            let worker = Arc::new(Worker::new(agent.clone(), log.clone(), queue.clone(), ledger.clone(), options));
            tokio::spawn(worker.run(rx.clone()));
        }
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
                if tick % 20 == 0 {
                    for job in l.orphaned(100).await.unwrap() {
                        q.publish(&job).await.unwrap();
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        Fleet { log, queue, ledger, stop }
    }

    async fn submit(&self, script: &str) -> Uuid {
        let run_id = Uuid::now_v7();
        let start = Event { run_id, seq: 1, at: chrono::Utc::now(), kind: EventKind::SessionStart { goal: script.into(), config: config(script) } };
        self.log.create_run(NewRun { tenant: "t".into(), idempotency_key: None, batch_id: None, start }).await.unwrap();
        run_id
    }

    async fn wait_parked_or_done(&self, run_id: Uuid) -> RunState {
        for _ in 0..2000 {
            let s = self.log.get_run(run_id).await.unwrap();
            if s.status != RunStatus::Runnable && self.log.inbox(run_id).await.unwrap().is_empty() {
                return self.log.load(run_id).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("run {run_id} never settled: {:?}", self.log.get_run(run_id).await.unwrap());
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
                    Resume::Approval { call_id: c.call_id.clone(), args_hash: c.args_hash.clone(), decision: Decision::Approve, by: None, request_seq: None }
                }
                Some(PullPoint::AwaitingTool { call_ids }) => Resume::ToolResult { call_id: call_ids[0].clone(), content: "A1".into(), is_error: false },
                Some(PullPoint::AwaitingInput) if replies == 0 => {
                    replies += 1;
                    Resume::Input { text: "refund please".into() }
                }
                Some(PullPoint::AwaitingInput) if replies == 1 => {
                    replies += 1;
                    Resume::Close { text: None }
                }
                Some(PullPoint::AwaitingInput) => Resume::Cancel { reason: "conversation over".into() },
                Some(PullPoint::Paused { .. }) => Resume::ExtendBudget { extra: BudgetLimits { max_turns: Some(5), ..BudgetLimits::default() } },
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
        runs.push((kinds[i % kinds.len()], fleet.submit(kinds[i % kinds.len()]).await));
    }
    let drives = runs.iter().map(|(_, id)| fleet.drive(*id));
    let finals = futures::future::join_all(drives).await;
    for ((kind, run_id), state) in runs.iter().zip(finals) {
        let outcome = state.outcome.clone().unwrap_or_else(|| panic!("{kind} run not done"));
        match *kind {
            _ => assert!(matches!(outcome, Outcome::Succeeded { .. }), "{kind}: {outcome:?}"),
        }
        check_log(&fleet.log.events(*run_id, 0, 10_000).await.unwrap());
    }
    let done = fleet.log.list_runs(&RunFilter { status: Some(RunStatus::Done), limit: 1000, ..Default::default() }).await.unwrap();
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
        fleet.queue.publish(&glia_backends::Job { run_id, head_seq: head }).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(fleet.log.events(run_id, 0, 1000).await.unwrap(), before);
    let _ = fleet.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_lease_is_taken_over_by_the_reconciler() {
    let fleet = Fleet::start(1, Duration::from_millis(300));
    let run_id = fleet.submit("plain").await;
    // Steal the lease as a dead worker would hold it, before anyone runs the job.
    let _dead = fleet.log.acquire(run_id, "dead-worker", Duration::from_millis(200)).await.unwrap();
    let state = fleet.drive(run_id).await;
    assert!(matches!(state.outcome, Some(Outcome::Succeeded { .. })), "{:?}", state.outcome);
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
    fleet.log.post(run_id, Resume::Cancel { reason: "stop".into() }).await.unwrap();
    fleet.ledger.cancel(run_id).await.unwrap();
    let state = fleet.wait_parked_or_done(run_id).await;
    assert_eq!(state.outcome, Some(Outcome::Cancelled { reason: "stop".into() }));
    let events = fleet.log.events(run_id, 0, 10_000).await.unwrap();
    let naps = events.iter().filter(|e| matches!(e.kind, EventKind::ToolResult { .. })).count();
    assert!(naps < 20, "the run stopped early, after {naps} naps");
    check_log(&events);
    let _ = fleet.stop.send(true);
}
