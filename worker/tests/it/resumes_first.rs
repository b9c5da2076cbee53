//! Resumes first in a worker: it keeps its last free slot for jobs that
//! resume parked runs, so a resume is never queued behind a start; a worker
//! with one slot still takes starts. In-memory ports; jobs are relayed by
//! hand, so the test decides what is in the queue when.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Add, AddArgs};
use glia_agent::Agent;
use glia_agent::provider::{ScriptLibrary, ScriptedTurn};
use glia_agent::tool::{Tool, ToolContext, ToolFailure, ToolRegistry};
use glia_backends::memory::{MemoryLedger, MemoryLog, MemoryQueue};
use glia_backends::{Inbox, JobQueue, NewRun, Outbox, RunLog, RunStatus};
use glia_proto::{Decision, Event, EventKind, Payload, Policy, PolicyAction, PullPoint, RunConfig};
use glia_worker::consumer::{Worker, WorkerOptions};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, watch};
use uuid::Uuid;

/// A tool that holds its caller (and so a worker slot) until the test adds
/// a permit.
struct Gate(Arc<Semaphore>);
impl Tool for Gate {
    type Args = AddArgs;
    type Output = Value;
    fn name(&self) -> &str {
        "gate"
    }
    fn description(&self) -> &str {
        "Wait for the test."
    }
    async fn call(&self, _args: AddArgs, _ctx: ToolContext) -> Result<Value, ToolFailure> {
        self.0.acquire().await.expect("never closed").forget();
        Ok(json!({}))
    }
}

struct Setup {
    log: Arc<MemoryLog>,
    queue: Arc<MemoryQueue>,
    gate: Arc<Semaphore>,
    stop: watch::Sender<bool>,
}

/// One worker with `concurrency` slots (and `resume_slots` when given).
fn setup(concurrency: usize, resume_slots: Option<usize>) -> Setup {
    let mut scripts = ScriptLibrary::default();
    scripts.insert(
        "blocker",
        vec![
            ScriptedTurn::call("gate", json!({"a": 1, "b": 1})),
            ScriptedTurn::text("let go"),
        ],
    );
    scripts.insert(
        "approval",
        vec![
            ScriptedTurn::call("add", json!({"a": 1, "b": 2})),
            ScriptedTurn::text("3"),
        ],
    );
    scripts.insert("plain", vec![ScriptedTurn::text("hello")]);
    let gate = Arc::new(Semaphore::new(0));
    let mut tools = ToolRegistry::default();
    tools.register(Add).register(Gate(gate.clone()));
    let agent = Arc::new(Agent::new(Arc::new(scripts)).with_tools(tools));
    let (log, queue, ledger) = (
        Arc::new(MemoryLog::default()),
        Arc::new(MemoryQueue::default()),
        Arc::new(MemoryLedger::default()),
    );
    let options = WorkerOptions {
        id: format!("w-{}", Uuid::now_v7().simple()),
        concurrency,
        lease_ttl: Duration::from_secs(30),
    };
    let mut worker = Worker::new(agent, log.clone(), queue.clone(), ledger, options);
    if let Some(n) = resume_slots {
        worker = worker.with_resume_slots(n);
    }
    let (stop, rx) = watch::channel(false);
    tokio::spawn(Arc::new(worker).run(rx));
    Setup {
        log,
        queue,
        gate,
        stop,
    }
}

impl Setup {
    /// Admit a run of `script` and put its job on the queue.
    async fn submit(&self, script: &str) -> Uuid {
        let run_id = Uuid::now_v7();
        let mut config = RunConfig {
            model: format!("script:{script}"),
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
                goal: script.into(),
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
        self.relay().await;
        run_id
    }

    /// Publish the outbox's jobs, as the dispatcher's relay does.
    async fn relay(&self) {
        for (id, job) in self.log.outbox(100).await.unwrap() {
            self.queue.publish(&job).await.unwrap();
            self.log.outbox_done(&[id]).await.unwrap();
        }
    }

    /// Poll (every 5 ms, at most 10 s: a bound on a hang) until `check`
    /// holds for the run's state.
    async fn until(&self, run_id: Uuid, what: &str, check: impl Fn(&glia_proto::RunState) -> bool) {
        for _ in 0..2000 {
            if check(&self.log.load(run_id).await.unwrap()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("run {run_id}: never {what}");
    }

    /// Approve the run's pending call and relay the resume.
    async fn approve(&self, run_id: Uuid) {
        let state = self.log.load(run_id).await.unwrap();
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
        self.log.post(run_id, decision).await.unwrap();
        self.relay().await;
    }
}

fn parked(s: &glia_proto::RunState) -> bool {
    s.parked.is_some()
}

fn done(s: &glia_proto::RunState) -> bool {
    s.outcome.is_some()
}

/// The gate's `tool.call` is committed: the blocker holds its slot.
fn in_gate(s: &glia_proto::RunState) -> bool {
    s.status() == glia_proto::Status::Runnable
        && s.pending_calls
            .iter()
            .any(|c| c.name == "gate" && c.disposition.is_some())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_free_slot_takes_a_resume_not_a_start() {
    let w = setup(2, None);
    let approval = w.submit("approval").await;
    w.until(approval, "parked at its approval", parked).await;
    let blocker = w.submit("blocker").await;
    w.until(blocker, "in the gate", in_gate).await;
    // One slot busy, one free: the free one is kept for resumes.
    let start = w.submit("plain").await;
    w.approve(approval).await;
    w.until(approval, "done after its approval", done).await;
    assert_eq!(
        w.log.get_run(start).await.unwrap().head_seq,
        1,
        "the start was not taken into the last free slot"
    );
    assert_eq!(w.queue.depth().await.unwrap(), 1, "its job still waits");
    // The blocker lets go: two slots free, the start is taken.
    w.gate.add_permits(1);
    w.until(start, "done once a second slot was free", done)
        .await;
    w.until(blocker, "done", done).await;
    assert_eq!(
        w.log.get_run(blocker).await.unwrap().status,
        RunStatus::Done
    );
    let _ = w.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_resume_slots_a_start_takes_the_last_free_slot() {
    let w = setup(2, Some(0));
    let blocker = w.submit("blocker").await;
    w.until(blocker, "in the gate", in_gate).await;
    let start = w.submit("plain").await;
    w.until(start, "done while the blocker holds the other slot", done)
        .await;
    assert!(
        in_gate(&w.log.load(blocker).await.unwrap()),
        "the blocker still holds its slot"
    );
    w.gate.add_permits(1);
    w.until(blocker, "done", done).await;
    let _ = w.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_one_slot_takes_starts_and_resumes() {
    let w = setup(1, None);
    let plain = w.submit("plain").await;
    w.until(plain, "done", done).await;
    let approval = w.submit("approval").await;
    w.until(approval, "parked at its approval", parked).await;
    w.approve(approval).await;
    w.until(approval, "done after its approval", done).await;
    let _ = w.stop.send(true);
}
