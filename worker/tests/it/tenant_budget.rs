//! Per-tenant daily caps enforced across runs and workers by the budget gate
//! ([`LedgerGate`]): on the in-memory ports, and on a real Redis
//! (`GLIA_REDIS_URL`, default `redis://127.0.0.1:6379`; the test's keys live
//! under a prefix of its own and are deleted at the end) with its counter
//! deleted mid-batch and rebuilt from the log.
//!
//! Every model call here costs exactly what is reserved for it (100 output
//! tokens at 1 USD per million: 100 micros; input is free), so which calls a
//! cap lets through does not depend on how the workers interleave.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};
use glia_agent::budget_gate::{TenantCap, TenantCaps};
use glia_agent::provider::{ScriptLibrary, ScriptedTurn};
use glia_agent::{Agent, FixedClock};
use glia_backends::memory::{MemoryLedger, MemoryLog, MemoryQueue};
use glia_backends::redis_ledger::RedisLedger;
use glia_backends::{
    Inbox, JobQueue, Ledger, NewRun, Outbox, Reports, RunLog, RunStatus, Settlement, Spend,
    tenant_day_scope,
};
use glia_proto::{
    Event, EventKind, Limit, Outcome, PauseReason, Payload, Pricing, PullPoint, RunConfig,
    RunState, ToolSpec, Usage,
};
use glia_worker::consumer::{LedgerGate, Worker, WorkerOptions};
use serde_json::json;
use tokio::sync::watch;
use uuid::Uuid;

/// Noon of the day every event and every counter of these tests is on.
fn noon() -> DateTime<Utc> {
    day().and_hms_opt(12, 0, 0).unwrap().and_utc()
}

fn day() -> NaiveDate {
    NaiveDate::from_ymd_opt(2025, 6, 1).unwrap()
}

/// Per call: 100 output tokens, 100 USD micros.
const CALL: u64 = 100;

fn turn(t: ScriptedTurn) -> ScriptedTurn {
    ScriptedTurn {
        usage: Some(Usage {
            output_tokens: CALL,
            ..Usage::default()
        }),
        ..t
    }
}

fn scripts() -> ScriptLibrary {
    let mut lib = ScriptLibrary::default();
    // Two model calls, the first asking the client (an external tool).
    lib.insert(
        "external",
        vec![
            turn(ScriptedTurn::call("ask", json!({"q": "which?"}))),
            turn(ScriptedTurn::text("thanks")),
        ],
    );
    lib
}

fn config(script: &str) -> RunConfig {
    let mut c = RunConfig {
        model: format!("script:{script}"),
        max_tokens: CALL as u32,
        ..RunConfig::default()
    };
    c.pricing = Some(Pricing {
        input: 0,
        output: 1_000_000,
        cache_write: 0,
        cache_read: 0,
    });
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
    c
}

fn cost_caps(tenant: &str, micros: u64) -> TenantCaps {
    TenantCaps(
        [(
            tenant.to_owned(),
            TenantCap {
                daily_cost_usd_micros: Some(micros),
                daily_tokens: None,
            },
        )]
        .into(),
    )
}

struct Fleet {
    log: Arc<MemoryLog>,
    gate: Arc<LedgerGate>,
    stop: watch::Sender<bool>,
}

impl Fleet {
    /// Two workers over the memory log and queue and `ledger`, their agent
    /// gated by `caps`; agent and gate on the same fixed clock.
    fn start(ledger: Arc<dyn Ledger>, caps: TenantCaps) -> Fleet {
        let log = Arc::new(MemoryLog::default());
        let queue = Arc::new(MemoryQueue::default());
        let (stop, rx) = watch::channel(false);
        let gate = Arc::new(
            LedgerGate::new(ledger.clone(), log.clone(), caps).with_clock(FixedClock(noon())),
        );
        let agent = Arc::new(
            Agent::new(Arc::new(scripts()))
                .with_clock(FixedClock(noon()))
                .with_budget_gate(gate.clone()),
        );
        for i in 0..2 {
            let options = WorkerOptions {
                id: format!("w{i}"),
                concurrency: 4,
                lease_ttl: Duration::from_secs(30),
            };
            let worker = Arc::new(Worker::new(
                agent.clone(),
                log.clone(),
                queue.clone(),
                ledger.clone(),
                options,
            ));
            tokio::spawn(worker.run(rx.clone()));
        }
        // The relay, as the dispatcher runs it.
        let (l, q, mut r) = (log.clone(), queue.clone(), rx.clone());
        tokio::spawn(async move {
            while !*r.borrow_and_update() {
                for (id, job) in l.outbox(100).await.unwrap() {
                    q.publish(&job).await.unwrap();
                    l.outbox_done(&[id]).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        Fleet { log, gate, stop }
    }

    async fn submit(&self, tenant: &str, script: &str) -> Uuid {
        let run_id = Uuid::now_v7();
        let start = Event {
            run_id,
            seq: 1,
            at: noon(),
            kind: EventKind::SessionStart {
                redactions: Vec::new(),
                goal: script.into(),
                config: config(script),
            },
        };
        self.log
            .create_run(NewRun {
                tenant: tenant.into(),
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

    /// The run's state once no worker has anything left to do for it.
    async fn settled(&self, run_id: Uuid) -> RunState {
        for _ in 0..4000 {
            let s = self.log.get_run(run_id).await.unwrap();
            if s.status != RunStatus::Runnable && self.log.inbox(run_id).await.unwrap().is_empty() {
                return self.log.load(run_id).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!(
            "run {run_id} never settled: {:?}",
            self.log.get_run(run_id).await.unwrap()
        );
    }

    async fn all_settled(&self, runs: &[Uuid]) -> Vec<RunState> {
        futures::future::join_all(runs.iter().map(|r| self.settled(*r))).await
    }

    /// Answer a run's external call, if it waits for one.
    async fn answer(&self, state: &RunState) {
        if let Some(PullPoint::AwaitingTool { call_ids }) = &state.parked {
            self.log
                .post(
                    state.run_id,
                    Payload::ToolResult {
                        call_id: call_ids[0].clone(),
                        content: "A1".into(),
                        is_error: false,
                    },
                )
                .await
                .unwrap();
        }
    }

    async fn spent(&self, tenant: &str) -> u64 {
        self.log
            .tenant_usage(tenant, day())
            .await
            .unwrap()
            .cost_usd_micros
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

fn paused_by(state: &RunState) -> Option<Limit> {
    match &state.parked {
        Some(PullPoint::Paused {
            reason: PauseReason::Budget { limit },
        }) => Some(*limit),
        _ => None,
    }
}

fn succeeded(state: &RunState) -> bool {
    matches!(state.outcome, Some(Outcome::Succeeded { .. }))
}

/// Events of the run, checked: consecutive sequences, and the log replays.
async fn events(log: &MemoryLog, run_id: Uuid) -> Vec<Event> {
    let events = log.events(run_id, 0, 10_000).await.unwrap();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "no gap, no duplicate");
    }
    RunState::replay(run_id, &events).expect("the log replays");
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runs_of_a_tenant_share_its_daily_cap() {
    let fleet = Fleet::start(Arc::new(MemoryLedger::default()), cost_caps("t", 3 * CALL));
    // The first run: two calls, 200 micros.
    let first = fleet.submit("t", "external").await;
    let parked = fleet.settled(first).await;
    fleet.answer(&parked).await;
    assert!(succeeded(&fleet.settled(first).await));
    assert_eq!(fleet.spent("t").await, 2 * CALL);
    // The second: its first call fits (300), its second does not.
    let second = fleet.submit("t", "external").await;
    let parked = fleet.settled(second).await;
    fleet.answer(&parked).await;
    let paused = fleet.settled(second).await;
    assert_eq!(
        paused_by(&paused),
        Some(Limit::TenantDailyCost),
        "{:?}",
        paused.parked
    );
    assert_eq!(fleet.spent("t").await, 3 * CALL, "the cap, exactly");
    let log = events(&fleet.log, second).await;
    let warns: Vec<&EventKind> = log
        .iter()
        .map(|e| &e.kind)
        .filter(|k| matches!(k, EventKind::BudgetWarn { .. }))
        .collect();
    assert!(
        matches!(
            warns[..],
            [EventKind::BudgetWarn {
                limit: Limit::TenantDailyCost,
                ..
            }]
        ),
        "{warns:?}"
    );
    assert_eq!(
        log.iter()
            .filter(|e| matches!(e.kind, EventKind::ModelCall { .. }))
            .count(),
        1,
        "the refused call was never made"
    );
    // Another tenant is not capped: its run is not held back.
    let other = fleet.submit("u", "external").await;
    let parked = fleet.settled(other).await;
    fleet.answer(&parked).await;
    assert!(succeeded(&fleet.settled(other).await));
    // Resumed with the cap unchanged: refused again, nothing spent.
    fleet
        .log
        .post(
            second,
            Payload::Resume {
                by: Some("ops".into()),
            },
        )
        .await
        .unwrap();
    let paused = fleet.settled(second).await;
    assert_eq!(paused_by(&paused), Some(Limit::TenantDailyCost));
    assert_eq!(fleet.spent("t").await, 3 * CALL);
    // Raised, then resumed: it goes on.
    fleet.gate.set_caps(cost_caps("t", 10 * CALL));
    fleet
        .log
        .post(
            second,
            Payload::Resume {
                by: Some("ops".into()),
            },
        )
        .await
        .unwrap();
    assert!(succeeded(&fleet.settled(second).await));
    assert_eq!(fleet.spent("t").await, 4 * CALL);
    events(&fleet.log, second).await;
}

/// A batch of six two-call runs of one tenant, capped at nine calls. Each
/// run's first call is made and the run parks for its external tool; the
/// counter is then lost (`lose_counter`); the batch goes on. The counter is
/// rebuilt from the log, so exactly three more calls are let through. Then
/// the cap is raised by one call, the counter lost again and every paused run
/// resumed: exactly one more goes through.
async fn a_lost_counter_is_rebuilt_from_the_log<F, Fut>(ledger: Arc<dyn Ledger>, lose_counter: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    let fleet = Fleet::start(ledger.clone(), cost_caps("t", 9 * CALL));
    let mut runs = Vec::new();
    for _ in 0..6 {
        runs.push(fleet.submit("t", "external").await);
    }
    let parked = fleet.all_settled(&runs).await;
    assert!(
        parked
            .iter()
            .all(|s| matches!(s.parked, Some(PullPoint::AwaitingTool { .. }))),
        "each made its first call"
    );
    assert_eq!(fleet.spent("t").await, 6 * CALL);

    lose_counter().await;
    for state in &parked {
        fleet.answer(state).await;
    }
    let after = fleet.all_settled(&runs).await;
    let done = after.iter().filter(|s| succeeded(s)).count();
    let paused = after
        .iter()
        .filter(|s| paused_by(s) == Some(Limit::TenantDailyCost))
        .count();
    assert_eq!(
        (done, paused),
        (3, 3),
        "{:?}",
        after
            .iter()
            .map(|s| (&s.parked, &s.outcome))
            .collect::<Vec<_>>()
    );
    assert_eq!(fleet.spent("t").await, 9 * CALL, "the cap, exactly");
    let scope = tenant_day_scope("t", day());
    assert_eq!(
        ledger.settle(&scope, "probe", Spend::ZERO).await.unwrap(),
        Settlement::Settled {
            used: Spend {
                tokens: 9 * CALL,
                cost_usd_micros: 9 * CALL
            }
        }
    );

    fleet.gate.set_caps(cost_caps("t", 10 * CALL));
    lose_counter().await;
    for state in after.iter().filter(|s| paused_by(s).is_some()) {
        fleet
            .log
            .post(state.run_id, Payload::Resume { by: None })
            .await
            .unwrap();
    }
    let last = fleet.all_settled(&runs).await;
    let done = last.iter().filter(|s| succeeded(s)).count();
    let paused = last
        .iter()
        .filter(|s| paused_by(s) == Some(Limit::TenantDailyCost))
        .count();
    assert_eq!((done, paused), (4, 2));
    assert_eq!(fleet.spent("t").await, 10 * CALL);
    for run_id in runs {
        let log = events(&fleet.log, run_id).await;
        let calls = log
            .iter()
            .filter(|e| matches!(e.kind, EventKind::ModelCall { .. }))
            .count();
        let responses = log
            .iter()
            .filter(|e| matches!(e.kind, EventKind::ModelResponse { .. }))
            .count();
        assert_eq!(
            calls, responses,
            "every call made was answered; refused ones were never made"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_counter_is_rebuilt_from_the_log() {
    let ledger = Arc::new(MemoryLedger::default());
    let forget = ledger.clone();
    a_lost_counter_is_rebuilt_from_the_log(ledger, || {
        forget.forget_budgets();
        async {}
    })
    .await;
}

// ---------------------------------------------------------------------------
// On a real Redis.

fn redis_url() -> String {
    std::env::var("GLIA_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// Delete every key matching `pattern` with `redis-cli`, as an operator's
/// flush would.
fn delete_keys(pattern: &str) {
    let url = redis_url();
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("redis-cli -u '{url}' --scan --pattern '{pattern}' | xargs -r redis-cli -u '{url}' del >/dev/null"))
        .status()
        .expect("redis-cli");
    assert!(status.success(), "deleting {pattern}");
}

/// Deletes the test's keys when dropped, pass or fail.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        delete_keys(&format!("{}:*", self.0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keys_deleted_mid_batch_and_the_cap_still_holds() {
    let prefix = format!("glia-test-{}", Uuid::now_v7());
    let _cleanup = Cleanup(prefix.clone());
    let ledger = Arc::new(
        RedisLedger::connect(&redis_url(), &prefix)
            .await
            .expect("Redis at GLIA_REDIS_URL"),
    );
    let key = ledger.budget_key(&tenant_day_scope("t", day()));
    let pattern = format!("{prefix}:budget:*");
    a_lost_counter_is_rebuilt_from_the_log(ledger, || {
        let (key, pattern) = (key.clone(), pattern.clone());
        async move {
            let listed = std::process::Command::new("redis-cli")
                .args(["-u", &redis_url(), "exists", &key])
                .output()
                .expect("redis-cli");
            assert_eq!(
                String::from_utf8_lossy(&listed.stdout).trim(),
                "1",
                "the counter exists before it is deleted"
            );
            delete_keys(&pattern);
        }
    })
    .await;
}
