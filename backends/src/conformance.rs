//! The [`EventLog`] contract as executable checks. Every adapter's tests call
//! each of these against a fresh, isolated instance (the memory twin in
//! `tests/memory.rs`, Postgres in its own database per test), so the twin and
//! the real adapter cannot drift apart.
//!
//! Each check panics with a message on the first violation.

use std::time::Duration;

use chrono::{DateTime, Utc};
use glia_proto::{
    ContentBlock, Decision, Disposition, Event, EventKind, Message, Outcome, Payload, PullPoint,
    Role, RunConfig, RunState, ToolCallRecord, Usage, args_hash,
};
use serde_json::json;
use uuid::Uuid;

use crate::archive::{Archive, Imported};
use crate::{
    AgentRegistry, ApprovalFilter, ApprovalStatus, EventLog, Inbox, Job, JobQueue, LogError,
    NewRun, Opening, Orphan, RunFilter, RunGaugeKey, RunLog, RunStatus,
};

pub mod listing;
// Issue 32, schedules.
pub mod evals;
pub mod schedules;
pub mod waits;
// Issue 32, child runs.
pub mod children;

const TTL: Duration = Duration::from_secs(30);

fn at() -> DateTime<Utc> {
    DateTime::UNIX_EPOCH
}

/// A realistic log that parks at `awaiting_approval` for call `c1`
/// (`park_at` events), then finishes (`all`).
pub struct SampleLog {
    /// The run.
    pub run_id: Uuid,
    /// Every event up to and including the `session.pause`.
    pub parked: Vec<Event>,
    /// The events after the approval, to the end.
    pub rest: Vec<Event>,
}

/// Build a [`SampleLog`] for a new run.
pub fn sample_log() -> SampleLog {
    let run_id = Uuid::now_v7();
    let input = json!({"order": "A1", "amount": 30});
    let hash = args_hash(&input);
    let kinds = vec![
        EventKind::SessionStart {
            redactions: Vec::new(),
            goal: "refund A1".into(),
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
        EventKind::ModelCall {
            model: "m".into(),
            messages: 1,
            wrap_up: false,
            forced_tool: None,
        },
        EventKind::ModelResponse {
            redactions: Vec::new(),
            message: Message {
                role: Role::Assistant,
                content: vec![ContentBlock::ToolUse {
                    id: "c1".into(),
                    name: "refund".into(),
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
        },
        EventKind::ToolCall(ToolCallRecord {
            call_id: "c1".into(),
            name: "refund".into(),
            input: input.clone(),
            args_hash: hash.clone(),
            idempotency_key: format!("{run_id}:c1"),
            disposition: Disposition::Approval,
        }),
        EventKind::ApprovalRequested {
            call_id: "c1".into(),
            tool: "refund".into(),
            input,
            args_hash: hash.clone(),
            expires_at: None,
            interrupted: false,
        },
        EventKind::SessionPause {
            pull_point: PullPoint::AwaitingApproval {
                call_ids: vec!["c1".into()],
            },
        },
    ];
    let rest = vec![
        EventKind::ApprovalResolved {
            call_id: "c1".into(),
            args_hash: hash,
            decision: Decision::Approve,
            by: Some("ana".into()),
        },
        EventKind::ToolResult {
            call_id: "c1".into(),
            content: "{\"refunded\":30}".into(),
            reminder: None,
            duration_ms: 1,
            redactions: Vec::new(),
        },
        EventKind::ModelCall {
            model: "m".into(),
            messages: 3,
            wrap_up: false,
            forced_tool: None,
        },
        EventKind::ModelResponse {
            redactions: Vec::new(),
            message: Message::assistant("Refunded."),
            usage: Usage::default(),
            stop_reason: "end_turn".into(),
            duration_ms: 2,
            cost_usd_micros: 0,
            rejected: None,
        },
        EventKind::StepEnd {
            index: 0,
            answer: "Refunded.".into(),
            skipped: false,
        },
        EventKind::SessionComplete {
            outcome: Outcome::Succeeded {
                answer: "Refunded.".into(),
                output: None,
            },
        },
    ];
    let stamp = |(i, kind): (usize, EventKind)| Event {
        run_id,
        seq: i as u64 + 1,
        at: at(),
        kind,
    };
    let parked: Vec<Event> = kinds.into_iter().enumerate().map(stamp).collect();
    let n = parked.len();
    let rest = rest
        .into_iter()
        .enumerate()
        .map(|(i, k)| stamp((i + n, k)))
        .collect();
    SampleLog {
        run_id,
        parked,
        rest,
    }
}

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

fn state_after(run_id: Uuid, events: &[Event]) -> RunState {
    RunState::replay(run_id, events).expect("sample log replays")
}

/// Admit, then admit again with the same key: the first run comes back,
/// nothing new is written; another tenant's same key is a different run.
pub async fn admits_runs_idempotently(log: &dyn EventLog) {
    let a = sample_log();
    let (first, created) = log
        .create_run(new_run("t1", Some("k1"), &a.parked[0]))
        .await
        .unwrap();
    assert!(created);
    assert_eq!(
        (first.run_id, first.head_seq, first.status),
        (a.run_id, 1, RunStatus::Runnable)
    );
    let b = sample_log();
    let (again, created) = log
        .create_run(new_run("t1", Some("k1"), &b.parked[0]))
        .await
        .unwrap();
    assert!(!created, "same tenant, same key: the first run");
    assert_eq!(again.run_id, a.run_id);
    assert!(
        matches!(log.get_run(b.run_id).await, Err(LogError::NotFound(_))),
        "nothing written for the second"
    );
    let (other, created) = log
        .create_run(new_run("t2", Some("k1"), &b.parked[0]))
        .await
        .unwrap();
    assert!(created && other.run_id == b.run_id, "keys are per tenant");
    let jobs = log.outbox(100).await.unwrap();
    assert!(
        jobs.iter().any(|(_, j)| *j == Job::start(a.run_id, 1)),
        "admission writes a job, a start"
    );
}

/// Commits are fenced by the head and the lease; a lapsed lease can be taken
/// over and then writes nothing.
pub async fn commits_are_fenced(log: &dyn RunLog) {
    let s = sample_log();
    log.create_run(new_run("t", None, &s.parked[0]))
        .await
        .unwrap();
    let lease = log.acquire(s.run_id, "w1", TTL).await.unwrap();
    assert!(!lease.taken_over, "a fresh run's lease is not a takeover");
    assert!(matches!(
        log.acquire(s.run_id, "w2", TTL).await,
        Err(LogError::LeaseHeld { .. })
    ));
    let first = &s.parked[1..5];
    log.commit(&lease, first, &state_after(s.run_id, &s.parked[..5]), &[])
        .await
        .unwrap();
    // The same events again: the head moved.
    let err = log
        .commit(&lease, first, &state_after(s.run_id, &s.parked[..5]), &[])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LogError::Conflict {
                expected: 1,
                actual: 5,
                ..
            }
        ),
        "{err:?}"
    );
    log.release(&lease).await.unwrap();
    // Released: another worker takes it; the old lease cannot write.
    let lease2 = log.acquire(s.run_id, "w2", TTL).await.unwrap();
    assert!(!lease2.taken_over, "a released lease is not taken over");
    let err = log
        .commit(
            &lease,
            &s.parked[5..6],
            &state_after(s.run_id, &s.parked[..6]),
            &[],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, LogError::LeaseLost(_)), "{err:?}");
    log.commit(
        &lease2,
        &s.parked[5..],
        &state_after(s.run_id, &s.parked),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(
        log.get_run(s.run_id).await.unwrap().head_seq,
        s.parked.len() as u64
    );
    // A lapsed lease is taken over.
    log.release(&lease2).await.unwrap();
    let short = log
        .acquire(s.run_id, "w3", Duration::from_millis(50))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(matches!(
        log.renew(&short, TTL).await,
        Err(LogError::LeaseLost(_))
    ));
    let taken = log.acquire(s.run_id, "w4", TTL).await.unwrap();
    assert_ne!(taken.token, short.token);
    assert!(taken.taken_over, "the lapsed lease was taken over");
    log.release(&taken).await.unwrap();
}

/// `load` equals the replay of `events`; `events` pages by `after`; the
/// summary follows the state.
pub async fn load_equals_replay(log: &dyn RunLog) {
    let s = sample_log();
    log.create_run(new_run("t", None, &s.parked[0]))
        .await
        .unwrap();
    let lease = log.acquire(s.run_id, "w", TTL).await.unwrap();
    for i in 1..s.parked.len() {
        log.commit(
            &lease,
            &s.parked[i..i + 1],
            &state_after(s.run_id, &s.parked[..=i]),
            &[],
        )
        .await
        .unwrap();
    }
    let all = log.events(s.run_id, 0, 1000).await.unwrap();
    assert_eq!(all, s.parked);
    assert_eq!(
        log.events(s.run_id, 3, 2).await.unwrap(),
        s.parked[3..5].to_vec()
    );
    assert!(log.events(s.run_id, 100, 10).await.unwrap().is_empty());
    let loaded = log.load(s.run_id).await.unwrap();
    assert_eq!(loaded, state_after(s.run_id, &s.parked));
    let summary = log.get_run(s.run_id).await.unwrap();
    assert_eq!(summary.status, RunStatus::Parked);
    assert_eq!(
        summary.pull_point,
        Some(PullPoint::AwaitingApproval {
            call_ids: vec!["c1".into()]
        })
    );
    log.commit(
        &lease,
        &s.rest,
        &state_after(s.run_id, &[s.parked.clone(), s.rest.clone()].concat()),
        &[],
    )
    .await
    .unwrap();
    let done = log.get_run(s.run_id).await.unwrap();
    assert_eq!(done.status, RunStatus::Done);
    assert!(matches!(done.outcome, Some(Outcome::Succeeded { .. })));
    assert_eq!(
        log.load(s.run_id).await.unwrap().head_seq,
        (s.parked.len() + s.rest.len()) as u64
    );
}

/// Steps of many runs committed at once (what a worker does with its runs in
/// flight, and what a group commit gathers into one transaction): each run
/// gets its own answer. A stale lease and a moved head fail only their own
/// step; every other run's steps are all written, in order, once; approvals
/// requested, decided and consumed inbox items land on their own run.
pub async fn concurrent_commits_across_runs(log: &dyn EventLog) {
    const RUNS: usize = 12;
    let runs: Vec<SampleLog> = (0..RUNS).map(|_| sample_log()).collect();
    let mut leases = Vec::new();
    for s in &runs {
        log.create_run(new_run(&format!("t-{}", s.run_id), None, &s.parked[0]))
            .await
            .unwrap();
        leases.push(log.acquire(s.run_id, "w", TTL).await.unwrap());
    }
    // Run 0's lease changes hands: its old holder keeps committing.
    log.release(&leases[0]).await.unwrap();
    let fresh = log.acquire(runs[0].run_id, "w2", TTL).await.unwrap();
    // One step at a time for every run, all runs at once.
    for i in 1..runs[0].parked.len() {
        let commits = runs
            .iter()
            .zip(&leases)
            .enumerate()
            .map(|(n, (s, lease))| async move {
                // Run 1 keeps committing its third event: a head it does not have.
                let at = if n == 1 { 2 } else { i };
                log.commit(
                    lease,
                    &s.parked[at..=at],
                    &state_after(s.run_id, &s.parked[..=at]),
                    &[],
                )
                .await
            });
        let results = futures::future::join_all(commits).await;
        for (n, r) in results.iter().enumerate() {
            match (n, i, r) {
                (0, _, Err(LogError::LeaseLost(_))) => {}
                (
                    1,
                    _,
                    Err(LogError::Conflict {
                        expected: 2,
                        actual: 1,
                        ..
                    }),
                ) => {}
                (n, _, Ok(())) if n >= 2 => {}
                other => panic!("step {i}: {other:?}"),
            }
        }
    }
    assert_eq!(
        log.get_run(runs[0].run_id).await.unwrap().head_seq,
        1,
        "a stale lease writes nothing"
    );
    assert_eq!(
        log.events(runs[1].run_id, 0, 100).await.unwrap(),
        runs[1].parked[..1].to_vec(),
        "a moved head writes nothing"
    );
    // The fresh holder of run 0 writes from where the log is.
    log.commit(
        &fresh,
        &runs[0].parked[1..],
        &state_after(runs[0].run_id, &runs[0].parked),
        &[],
    )
    .await
    .unwrap();
    // Decide every approval but run 1's (never requested), then finish all at once, consuming the decisions.
    let mut decided = Vec::new();
    for s in runs.iter().skip(2).chain(std::iter::once(&runs[0])) {
        let pending = log
            .approvals(&ApprovalFilter {
                run_id: Some(s.run_id),
                pending_only: true,
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(pending.len(), 1, "run {}: one approval requested", s.run_id);
        let decision = Payload::Approval {
            call_id: "c1".into(),
            args_hash: pending[0].args_hash.clone(),
            decision: Decision::Approve,
            by: None,
            request_seq: None,
        };
        decided.push((s, log.post(s.run_id, decision).await.unwrap()));
    }
    let finishing = decided.iter().map(|(s, id)| {
        let lease = if s.run_id == runs[0].run_id {
            &fresh
        } else {
            &leases[runs.iter().position(|r| r.run_id == s.run_id).unwrap()]
        };
        async move {
            let full = [s.parked.clone(), s.rest.clone()].concat();
            log.commit(lease, &s.rest, &state_after(s.run_id, &full), &[*id])
                .await
        }
    });
    for r in futures::future::join_all(finishing).await {
        r.unwrap();
    }
    for (s, _) in &decided {
        let full = [s.parked.clone(), s.rest.clone()].concat();
        assert_eq!(
            log.events(s.run_id, 0, 100).await.unwrap(),
            full,
            "run {}: every step once, in order",
            s.run_id
        );
        assert_eq!(log.get_run(s.run_id).await.unwrap().status, RunStatus::Done);
        assert!(
            log.inbox(s.run_id).await.unwrap().is_empty(),
            "run {}: its decision consumed",
            s.run_id
        );
        let filter = ApprovalFilter {
            run_id: Some(s.run_id),
            limit: 10,
            ..Default::default()
        };
        let approvals = log.approvals(&filter).await.unwrap();
        assert_eq!(approvals.len(), 1);
        assert_eq!(approvals[0].status, ApprovalStatus::Decided);
    }
}

/// Approvals appear when requested, a decision is accepted once, the inbox
/// holds it until a commit consumes it.
pub async fn inbox_and_approvals(log: &dyn EventLog) {
    let s = sample_log();
    let tenant = format!("t-{}", s.run_id);
    log.create_run(new_run(&tenant, None, &s.parked[0]))
        .await
        .unwrap();
    let lease = log.acquire(s.run_id, "w", TTL).await.unwrap();
    log.commit(
        &lease,
        &s.parked[1..],
        &state_after(s.run_id, &s.parked),
        &[],
    )
    .await
    .unwrap();
    log.release(&lease).await.unwrap();
    let gauges = log.gauges(Utc::now()).await.unwrap();
    let parked = RunGaugeKey {
        status: "parked",
        pull_point: "awaiting_approval".into(),
    };
    assert!(
        gauges.runs.get(&parked).is_some_and(|n| *n >= 1),
        "{gauges:?}"
    );
    assert!(
        gauges.approvals_pending >= 1 && gauges.oldest_approval_age_seconds >= 0.0,
        "{gauges:?}"
    );
    let filter = ApprovalFilter {
        tenant: Some(tenant.clone()),
        pending_only: true,
        limit: 10,
        ..Default::default()
    };
    let pending = log.approvals(&filter).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(
        (pending[0].call_id.as_str(), pending[0].tool.as_str()),
        ("c1", "refund")
    );
    assert!(!pending[0].interrupted);
    let decision = Payload::Approval {
        call_id: "c1".into(),
        args_hash: pending[0].args_hash.clone(),
        decision: Decision::Approve,
        by: None,
        request_seq: None,
    };
    let id = log.post(s.run_id, decision.clone()).await.unwrap();
    assert!(
        matches!(
            log.post(s.run_id, decision.clone()).await,
            Err(LogError::Duplicate { .. })
        ),
        "the first decision wins"
    );
    assert!(
        log.approvals(&filter).await.unwrap().is_empty(),
        "decided approvals leave the pending queue"
    );
    let after = log.gauges(Utc::now()).await.unwrap();
    assert_eq!(
        after.approvals_pending,
        gauges.approvals_pending - 1,
        "a decided approval is no longer pending"
    );
    let all = log
        .approvals(&ApprovalFilter {
            tenant: Some(tenant),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all[0].status, ApprovalStatus::Decided);
    let inbox = log.inbox(s.run_id).await.unwrap();
    assert_eq!(inbox.len(), 1);
    assert_eq!((inbox[0].id, &inbox[0].payload), (id, &decision));
    assert!(
        log.orphaned(1000)
            .await
            .unwrap()
            .iter()
            .any(|o| o.job.run_id == s.run_id),
        "a parked run with a payload has work"
    );
    let lease = log.acquire(s.run_id, "w", TTL).await.unwrap();
    let full = [s.parked.clone(), s.rest.clone()].concat();
    log.commit(&lease, &s.rest, &state_after(s.run_id, &full), &[id])
        .await
        .unwrap();
    assert!(
        log.inbox(s.run_id).await.unwrap().is_empty(),
        "consumed with the commit"
    );
    assert!(matches!(
        log.post(Uuid::now_v7(), decision).await,
        Err(LogError::NotFound(_))
    ));
}

/// A call a crash interrupted, asked about again, shows as such in the
/// approval queue.
pub async fn an_interrupted_call_is_marked_in_the_queue(log: &dyn EventLog) {
    let mut s = sample_log();
    let tenant = format!("t-{}", s.run_id);
    for e in &mut s.parked {
        match &mut e.kind {
            EventKind::ToolCall(record) => record.disposition = Disposition::Run { reminder: None },
            EventKind::ApprovalRequested { interrupted, .. } => *interrupted = true,
            _ => {}
        }
    }
    log.create_run(new_run(&tenant, None, &s.parked[0]))
        .await
        .unwrap();
    let lease = log.acquire(s.run_id, "w", TTL).await.unwrap();
    log.commit(
        &lease,
        &s.parked[1..],
        &state_after(s.run_id, &s.parked),
        &[],
    )
    .await
    .unwrap();
    let filter = ApprovalFilter {
        tenant: Some(tenant),
        pending_only: true,
        limit: 10,
        ..Default::default()
    };
    let pending = log.approvals(&filter).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert!(pending[0].interrupted, "{:?}", pending[0]);
}

/// A run that ends (here: cancelled) while an approval waits takes the
/// approval out of the pending queue.
pub async fn ending_a_run_closes_its_approvals(log: &dyn EventLog) {
    let s = sample_log();
    let tenant = format!("t-{}", s.run_id);
    log.create_run(new_run(&tenant, None, &s.parked[0]))
        .await
        .unwrap();
    let lease = log.acquire(s.run_id, "w", TTL).await.unwrap();
    log.commit(
        &lease,
        &s.parked[1..],
        &state_after(s.run_id, &s.parked),
        &[],
    )
    .await
    .unwrap();
    let filter = ApprovalFilter {
        tenant: Some(tenant),
        pending_only: true,
        limit: 10,
        ..Default::default()
    };
    assert_eq!(log.approvals(&filter).await.unwrap().len(), 1);
    let cancel = Event {
        run_id: s.run_id,
        seq: s.parked.len() as u64 + 1,
        at: Utc::now(),
        kind: EventKind::SessionCancel {
            reason: "stop".into(),
        },
    };
    let all = [s.parked.clone(), vec![cancel.clone()]].concat();
    log.commit(&lease, &[cancel], &state_after(s.run_id, &all), &[])
        .await
        .unwrap();
    assert!(
        log.approvals(&filter).await.unwrap().is_empty(),
        "a finished run has no pending approvals"
    );
    assert_eq!(log.gauges(Utc::now()).await.unwrap().approvals_pending, 0);
}

/// Once a cancel is posted nothing else is taken (a second cancel is a
/// duplicate); once the run is done, nothing at all.
pub async fn nothing_is_taken_after_a_cancel(log: &dyn Inbox) {
    let s = sample_log();
    log.create_run(new_run(&format!("t-{}", s.run_id), None, &s.parked[0]))
        .await
        .unwrap();
    let lease = log.acquire(s.run_id, "w", TTL).await.unwrap();
    log.commit(
        &lease,
        &s.parked[1..],
        &state_after(s.run_id, &s.parked),
        &[],
    )
    .await
    .unwrap();
    let hash = args_hash(&json!({"order": "A1", "amount": 30}));
    let approval = Payload::Approval {
        call_id: "c1".into(),
        args_hash: hash,
        decision: Decision::Approve,
        by: None,
        request_seq: None,
    };
    let cancel = log
        .post(
            s.run_id,
            Payload::Cancel {
                reason: "stop".into(),
            },
        )
        .await
        .unwrap();
    let refused = log.post(s.run_id, approval.clone()).await;
    assert!(
        matches!(refused, Err(LogError::Cancelled(id)) if id == s.run_id),
        "an approval after a cancel: {refused:?}"
    );
    let refused = log.post(s.run_id, Payload::Resume { by: None }).await;
    assert!(
        matches!(refused, Err(LogError::Cancelled(_))),
        "a resume after a cancel: {refused:?}"
    );
    let again = log
        .post(
            s.run_id,
            Payload::Cancel {
                reason: "again".into(),
            },
        )
        .await;
    assert!(
        matches!(again, Err(LogError::Duplicate { .. })),
        "a second cancel: {again:?}"
    );
    assert_eq!(
        log.inbox(s.run_id)
            .await
            .unwrap()
            .iter()
            .map(|i| i.id)
            .collect::<Vec<_>>(),
        [cancel],
        "only the cancel waits"
    );
    let end = Event {
        run_id: s.run_id,
        seq: s.parked.len() as u64 + 1,
        at: Utc::now(),
        kind: EventKind::SessionCancel {
            reason: "stop".into(),
        },
    };
    let all = [s.parked.clone(), vec![end.clone()]].concat();
    log.commit(&lease, &[end], &state_after(s.run_id, &all), &[cancel])
        .await
        .unwrap();
    let refused = log.post(s.run_id, approval).await;
    assert!(
        matches!(refused, Err(LogError::Finished(_))),
        "an approval to a finished run: {refused:?}"
    );
    let refused = log
        .post(
            s.run_id,
            Payload::Cancel {
                reason: "late".into(),
            },
        )
        .await;
    assert!(
        matches!(refused, Err(LogError::Finished(_))),
        "a cancel to a finished run: {refused:?}"
    );
}

/// A repeated approval while a cancel waits is refused as [`LogError::Cancelled`]
/// (the waiting cancel decides before the dedupe key: [`crate::post_refusal`]),
/// on every adapter alike.
pub async fn a_repeated_approval_during_a_pending_cancel_is_cancelled(log: &dyn Inbox) {
    let s = sample_log();
    log.create_run(new_run(&format!("t-{}", s.run_id), None, &s.parked[0]))
        .await
        .unwrap();
    let lease = log.acquire(s.run_id, "w", TTL).await.unwrap();
    log.commit(
        &lease,
        &s.parked[1..],
        &state_after(s.run_id, &s.parked),
        &[],
    )
    .await
    .unwrap();
    let approval = Payload::Approval {
        call_id: "c1".into(),
        args_hash: args_hash(&json!({"order": "A1", "amount": 30})),
        decision: Decision::Approve,
        by: None,
        request_seq: None,
    };
    let first = log.post(s.run_id, approval.clone()).await.unwrap();
    let again = log.post(s.run_id, approval.clone()).await;
    assert!(
        matches!(&again, Err(LogError::Duplicate { what, .. }) if what == "approval c1"),
        "a repeated approval: {again:?}"
    );
    let cancel = log
        .post(
            s.run_id,
            Payload::Cancel {
                reason: "stop".into(),
            },
        )
        .await
        .unwrap();
    let refused = log.post(s.run_id, approval).await;
    assert!(
        matches!(refused, Err(LogError::Cancelled(id)) if id == s.run_id),
        "a repeated approval while a cancel waits: {refused:?}"
    );
    assert_eq!(
        log.inbox(s.run_id)
            .await
            .unwrap()
            .iter()
            .map(|i| i.id)
            .collect::<Vec<_>>(),
        [first, cancel],
        "the first approval and the cancel wait"
    );
}

/// A job opens its run (lease, state, inbox) unless the run is done or the
/// job is stale; `release_if_idle` keeps the lease while the inbox holds
/// something and lets go once it is empty. The state opened equals a load
/// (here past a checkpoint, on adapters that write one that early).
pub async fn open_and_release_if_idle(log: &dyn Inbox) {
    let s = sample_log();
    log.create_run(new_run(&format!("t-{}", s.run_id), None, &s.parked[0]))
        .await
        .unwrap();
    let opened = |o: Opening| match o {
        Opening::Opened(o) => o,
        other => panic!("expected the run opened, got {other:?}"),
    };
    let first = opened(log.open(&Job::start(s.run_id, 1), "w1", TTL).await.unwrap());
    assert!(!first.lease.taken_over && first.inbox.is_empty());
    assert_eq!(first.state, state_after(s.run_id, &s.parked[..1]));
    let held = log.open(&Job::start(s.run_id, 1), "w2", TTL).await;
    assert!(
        matches!(held, Err(LogError::LeaseHeld { .. })),
        "a second worker: {held:?}"
    );
    log.commit(
        &first.lease,
        &s.parked[1..],
        &state_after(s.run_id, &s.parked),
        &[],
    )
    .await
    .unwrap();
    assert!(
        log.release_if_idle(&first.lease).await.unwrap().is_empty(),
        "nothing waits: released"
    );
    // Parked with an empty inbox: the admission's job is stale, a job at the head is not.
    assert!(matches!(
        log.open(&Job::start(s.run_id, 1), "w2", TTL).await.unwrap(),
        Opening::Stale
    ));
    let at_head = opened(
        log.open(&Job::resume(s.run_id, s.parked.len() as u64), "w2", TTL)
            .await
            .unwrap(),
    );
    assert!(
        !at_head.lease.taken_over,
        "the lease was released, not lapsed"
    );
    assert_eq!(at_head.state, state_after(s.run_id, &s.parked));
    let hash = args_hash(&json!({"order": "A1", "amount": 30}));
    let decision = Payload::Approval {
        call_id: "c1".into(),
        args_hash: hash,
        decision: Decision::Approve,
        by: None,
        request_seq: None,
    };
    let id = log.post(s.run_id, decision.clone()).await.unwrap();
    // Posted while held: the holder keeps the lease and gets the item.
    let kept = log.release_if_idle(&at_head.lease).await.unwrap();
    assert_eq!(
        kept.iter().map(|i| (i.id, &i.payload)).collect::<Vec<_>>(),
        [(id, &decision)]
    );
    assert!(
        matches!(
            log.acquire(s.run_id, "w3", TTL).await,
            Err(LogError::LeaseHeld { .. })
        ),
        "kept while the inbox holds an item"
    );
    log.release(&at_head.lease).await.unwrap();
    // A stale job for a run with a payload waiting is not stale.
    let resumed = opened(log.open(&Job::start(s.run_id, 1), "w3", TTL).await.unwrap());
    assert_eq!(resumed.inbox.iter().map(|i| i.id).collect::<Vec<_>>(), [id]);
    let full = [s.parked.clone(), s.rest.clone()].concat();
    let resolved = s.parked.len() + 1;
    log.commit(
        &resumed.lease,
        &s.rest[..1],
        &state_after(s.run_id, &full[..resolved]),
        &[id],
    )
    .await
    .unwrap();
    // Held, the payload taken: the decision's resume job (at the old head) is stale; a start is held.
    let resume_job = Job::resume(s.run_id, s.parked.len() as u64);
    assert!(
        matches!(
            log.open(&resume_job, "w4", TTL).await.unwrap(),
            Opening::Stale
        ),
        "a resume whose payload the holder took"
    );
    assert!(
        matches!(
            log.open(&Job::start(s.run_id, 1), "w4", TTL).await,
            Err(LogError::LeaseHeld { .. })
        ),
        "a start for a held runnable run"
    );
    let paused = log
        .post(
            s.run_id,
            Payload::Pause {
                reason: "look".into(),
                by: None,
            },
        )
        .await
        .unwrap();
    assert!(
        matches!(
            log.open(&resume_job, "w4", TTL).await,
            Err(LogError::LeaseHeld { .. })
        ),
        "a resume for a held run with a payload waiting"
    );
    assert_eq!(
        log.release_if_idle(&resumed.lease)
            .await
            .unwrap()
            .iter()
            .map(|i| i.id)
            .collect::<Vec<_>>(),
        [paused],
        "kept: the pause waits"
    );
    log.commit(
        &resumed.lease,
        &[],
        &state_after(s.run_id, &full[..resolved]),
        &[paused],
    )
    .await
    .unwrap();
    log.commit(
        &resumed.lease,
        &s.rest[1..],
        &state_after(s.run_id, &full),
        &[],
    )
    .await
    .unwrap();
    assert!(
        log.release_if_idle(&resumed.lease)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        log.open(&Job::resume(s.run_id, full.len() as u64), "w4", TTL)
            .await
            .unwrap(),
        Opening::Done
    ));
    assert_eq!(
        log.load(s.run_id).await.unwrap(),
        state_after(s.run_id, &full)
    );
    let missing = log.open(&Job::start(Uuid::now_v7(), 1), "w4", TTL).await;
    assert!(matches!(missing, Err(LogError::NotFound(_))), "{missing:?}");
    // A lapsed lease is taken over through `open`; the lapsed holder lets go of nothing.
    let t = sample_log();
    log.create_run(new_run(&format!("t-{}", t.run_id), None, &t.parked[0]))
        .await
        .unwrap();
    let short = opened(
        log.open(&Job::start(t.run_id, 1), "w5", Duration::from_millis(50))
            .await
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(120)).await;
    let taken = opened(log.open(&Job::start(t.run_id, 1), "w6", TTL).await.unwrap());
    assert!(taken.lease.taken_over, "the lapsed lease was taken over");
    assert!(
        log.release_if_idle(&short.lease).await.unwrap().is_empty(),
        "a lost lease: nothing held"
    );
    assert!(
        matches!(
            log.acquire(t.run_id, "w7", TTL).await,
            Err(LogError::LeaseHeld { .. })
        ),
        "the new holder keeps it"
    );
    log.release(&taken.lease).await.unwrap();
}

/// The outbox drains; runnable runs without a live lease are orphaned; parked
/// and leased runs are not. An orphan is `queued` only while it was never
/// started; started orphans come first.
pub async fn outbox_and_orphans(log: &dyn EventLog) {
    let s = sample_log();
    log.create_run(new_run("t", None, &s.parked[0]))
        .await
        .unwrap();
    let jobs = log.outbox(10_000).await.unwrap();
    let ours: Vec<i64> = jobs
        .iter()
        .filter(|(_, j)| j.run_id == s.run_id)
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(ours.len(), 1);
    log.outbox_done(&ours).await.unwrap();
    assert!(
        !log.outbox(10_000)
            .await
            .unwrap()
            .iter()
            .any(|(_, j)| j.run_id == s.run_id)
    );
    let orphan = |job: Job, queued: bool| Orphan { job, queued };
    assert!(
        log.orphaned(10_000)
            .await
            .unwrap()
            .contains(&orphan(Job::start(s.run_id, 1), true)),
        "runnable, never started: a start, queued"
    );
    let short = log
        .acquire(s.run_id, "w", Duration::from_millis(50))
        .await
        .unwrap();
    assert!(
        !log.orphaned(10_000)
            .await
            .unwrap()
            .iter()
            .any(|o| o.job.run_id == s.run_id),
        "leased"
    );
    tokio::time::sleep(Duration::from_millis(120)).await;
    let orphans = log.orphaned(10_000).await.unwrap();
    assert!(
        orphans.contains(&orphan(Job::start(s.run_id, 1), false)),
        "runnable, its lease lapsed: started"
    );
    let first_queued = orphans
        .iter()
        .position(|o| o.queued)
        .unwrap_or(orphans.len());
    assert!(
        orphans[first_queued..].iter().all(|o| o.queued),
        "started orphans first: {orphans:?}"
    );
    let lease = log.acquire(s.run_id, "w", TTL).await.unwrap();
    assert!(
        short.token != lease.token,
        "a lapsed lease is taken with a new token"
    );
    log.commit(
        &lease,
        &s.parked[1..],
        &state_after(s.run_id, &s.parked),
        &[],
    )
    .await
    .unwrap();
    log.release(&lease).await.unwrap();
    assert!(
        !log.orphaned(10_000)
            .await
            .unwrap()
            .iter()
            .any(|o| o.job.run_id == s.run_id),
        "parked without payloads"
    );
    let pending = log
        .approvals(&ApprovalFilter {
            run_id: Some(s.run_id),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    let decision = Payload::Approval {
        call_id: "c1".into(),
        args_hash: pending[0].args_hash.clone(),
        decision: Decision::Approve,
        by: None,
        request_seq: None,
    };
    log.post(s.run_id, decision).await.unwrap();
    let head = s.parked.len() as u64;
    let jobs: Vec<Job> = log
        .outbox(10_000)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, j)| j)
        .filter(|j| j.run_id == s.run_id)
        .collect();
    assert_eq!(
        jobs,
        vec![Job::resume(s.run_id, head)],
        "a posted payload writes a resume"
    );
    assert!(
        log.orphaned(10_000)
            .await
            .unwrap()
            .contains(&orphan(Job::resume(s.run_id, head), false)),
        "parked, a payload waiting: a resume"
    );

    // A delayed start parks at admission (head 1, no lease): with its wake
    // waiting it is a resume, never a queued start.
    let delayed = sample_log();
    let mut start = delayed.parked[0].clone();
    if let EventKind::SessionStart { config, .. } = &mut start.kind {
        config.start_at_ms = Some(at().timestamp_millis() + 60_000);
    }
    let (run, _) = log.create_run(new_run("t", None, &start)).await.unwrap();
    assert_eq!(run.status, RunStatus::Parked);
    assert!(
        !log.orphaned(10_000)
            .await
            .unwrap()
            .iter()
            .any(|o| o.job.run_id == delayed.run_id),
        "waiting for its start time"
    );
    log.post(
        delayed.run_id,
        Payload::Wake {
            due_at_ms: at().timestamp_millis() + 60_000,
            event: None,
        },
    )
    .await
    .unwrap();
    assert!(
        log.orphaned(10_000)
            .await
            .unwrap()
            .contains(&orphan(Job::resume(delayed.run_id, 1), false)),
        "its wake waiting: a resume, not queued"
    );
}

/// Listing filters by tenant, status and batch, and pages by run id.
pub async fn lists_runs(log: &dyn EventLog) {
    let tenant = format!("list-{}", Uuid::now_v7());
    let batch = Uuid::now_v7();
    let mut ids = Vec::new();
    for i in 0..5 {
        let s = sample_log();
        let new = NewRun {
            tenant: tenant.clone(),
            idempotency_key: None,
            batch_id: (i % 2 == 0).then_some(batch),
            start: s.parked[0].clone(),
            tags: Vec::new(),
            metadata: Default::default(),
            custom_id: None,
            parent_run_id: None,
            parent_call_id: None,
            depth: 0,
        };
        log.create_run(new).await.unwrap();
        ids.push(s.run_id);
    }
    let page = |before, limit| RunFilter {
        tenant: Some(tenant.clone()),
        before,
        limit,
        ..Default::default()
    };
    // Newest first.
    ids.reverse();
    let first = log.list_runs(&page(None, 3)).await.unwrap();
    assert_eq!(first.iter().map(|r| r.run_id).collect::<Vec<_>>(), ids[..3]);
    let second = log.list_runs(&page(Some(ids[2]), 3)).await.unwrap();
    assert_eq!(
        second.iter().map(|r| r.run_id).collect::<Vec<_>>(),
        ids[3..]
    );
    let batched = log
        .list_runs(&RunFilter {
            batch_id: Some(batch),
            limit: 100,
            ..page(None, 100)
        })
        .await
        .unwrap();
    assert_eq!(batched.len(), 3);
    let parked = log
        .list_runs(&RunFilter {
            status: Some(RunStatus::Parked),
            ..page(None, 100)
        })
        .await
        .unwrap();
    assert!(parked.is_empty());
    let other = log
        .list_runs(&RunFilter {
            tenant: Some("nobody".into()),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(other.is_empty());
    // Filters no stored name can match (U+0000) match nothing; they are not errors.
    let nul = log
        .list_runs(&RunFilter {
            tenant: Some("a\0b".into()),
            limit: 100,
            ..Default::default()
        })
        .await;
    assert!(nul.is_ok_and(|r| r.is_empty()));
    let nul = log
        .approvals(&ApprovalFilter {
            tenant: Some("a\0".into()),
            tool: Some("t\0".into()),
            limit: 100,
            ..Default::default()
        })
        .await;
    assert!(nul.is_ok_and(|r| r.is_empty()));
}

/// A run exported from one file and imported into another is the same run:
/// log, state, approvals, inbox (and its dedupe keys), idempotency key; a
/// second import changes nothing; a runnable run gets a job.
pub async fn export_import_round_trip(src: &dyn Archive, dst: &dyn Archive) {
    let s = sample_log();
    let tenant = format!("t-{}", s.run_id);
    src.create_run(NewRun {
        tenant,
        idempotency_key: Some("k".into()),
        batch_id: Some(Uuid::now_v7()),
        start: s.parked[0].clone(),
        tags: vec!["vip".into(), "eu".into()],
        metadata: [("ticket".to_owned(), "T-1".to_owned())].into(),
        custom_id: Some("row-1".into()),
        // A child run: its parent link travels (its parent need not).
        parent_run_id: Some(Uuid::now_v7()),
        parent_call_id: Some("call_7".into()),
        depth: 2,
    })
    .await
    .unwrap();
    let lease = src.acquire(s.run_id, "w", TTL).await.unwrap();
    src.commit(
        &lease,
        &s.parked[1..],
        &RunState::replay(s.run_id, &s.parked).unwrap(),
        &[],
    )
    .await
    .unwrap();
    let pending = src
        .approvals(&ApprovalFilter {
            run_id: Some(s.run_id),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    let decision = Payload::Approval {
        call_id: "c1".into(),
        args_hash: pending[0].args_hash.clone(),
        decision: Decision::Approve,
        by: None,
        request_seq: None,
    };
    src.post(s.run_id, decision.clone()).await.unwrap();

    let record = src.export_run(s.run_id).await.unwrap();
    assert_eq!(record.events, s.parked);
    assert_eq!(dst.import_run(&record).await.unwrap(), Imported::Created);
    assert_eq!(
        dst.import_run(&record).await.unwrap(),
        Imported::AlreadyPresent
    );
    let back = dst.export_run(s.run_id).await.unwrap();
    assert!(
        (back.created_at - record.created_at).abs() < chrono::Duration::microseconds(1),
        "admission time kept (to the microsecond)"
    );
    assert_eq!(
        crate::archive::RunRecord {
            created_at: record.created_at,
            ..back
        },
        record,
        "the same record back"
    );
    assert_eq!(
        dst.load(s.run_id).await.unwrap(),
        src.load(s.run_id).await.unwrap()
    );
    let summary = dst.get_run(s.run_id).await.unwrap();
    assert_eq!(
        (summary.head_seq, summary.batch_id),
        (s.parked.len() as u64, record.batch_id)
    );
    let first = src.get_run(s.run_id).await.unwrap();
    assert_eq!(
        (&summary.tags, &summary.metadata, &summary.custom_id),
        (&first.tags, &first.metadata, &first.custom_id),
        "submission fields travel"
    );
    assert_eq!(
        (
            summary.parent_run_id,
            &summary.parent_call_id,
            summary.depth
        ),
        (first.parent_run_id, &first.parent_call_id, 2),
        "the parent link travels"
    );
    assert!(first.parent_run_id.is_some());
    assert_eq!(
        (summary.usage, summary.steps, &summary.agent),
        (first.usage, first.steps, &first.agent),
        "the summary is the state's"
    );
    assert!(
        matches!(
            dst.post(s.run_id, decision).await,
            Err(LogError::Duplicate { .. })
        ),
        "the decision was already posted"
    );
    assert!(
        dst.outbox(100)
            .await
            .unwrap()
            .iter()
            .any(|(_, j)| j.run_id == s.run_id),
        "a job for the run with a payload waiting"
    );
    assert!(
        dst.acquire(s.run_id, "w2", TTL).await.is_ok(),
        "no lease travels"
    );

    let mut broken = record.clone();
    broken.run_id = Uuid::now_v7();
    assert!(
        matches!(dst.import_run(&broken).await, Err(LogError::Invalid { .. })),
        "events of another run"
    );
    let mut longer = record.clone();
    longer.events.truncate(3);
    assert!(
        matches!(
            dst.import_run(&longer).await,
            Err(LogError::Conflict { .. })
        ),
        "present at another head"
    );

    // An erased run exports as its tombstones and stays erased where it is
    // imported.
    let (e, lease) = finished_sample(src, &format!("t-{}", Uuid::now_v7())).await;
    src.release(&lease).await.unwrap();
    let when = DateTime::from_timestamp(2_000_000_000, 0).expect("a valid time");
    src.erase_run(e.run_id, "ana", when).await.unwrap();
    let erased = src.export_run(e.run_id).await.unwrap();
    let line = serde_json::to_string(&erased).unwrap();
    assert_eq!(holds_sample_content(&line), None, "content left in {line}");
    assert_eq!(
        erased.erased,
        Some(crate::archive::Erasure {
            at: when,
            by: "ana".into()
        })
    );
    assert_eq!(dst.import_run(&erased).await.unwrap(), Imported::Created);
    let imported = dst.get_run(e.run_id).await.unwrap();
    assert_eq!(
        (imported.erased_at, imported.goal.as_str()),
        (Some(when), glia_proto::TOMBSTONE)
    );
    let back = dst.export_run(e.run_id).await.unwrap();
    assert_eq!(back.events, erased.events);
    assert_eq!(back.erased, erased.erased);
    // A record marked erased whose content is still there (an older
    // export, edited) is erased on import.
    let (f, lease) = finished_sample(src, &format!("t-{}", Uuid::now_v7())).await;
    src.release(&lease).await.unwrap();
    let mut marked = src.export_run(f.run_id).await.unwrap();
    assert!(holds_sample_content(&serde_json::to_string(&marked).unwrap()).is_some());
    marked.erased = Some(crate::archive::Erasure {
        at: when,
        by: "ana".into(),
    });
    assert_eq!(dst.import_run(&marked).await.unwrap(), Imported::Created);
    let back = dst.export_run(f.run_id).await.unwrap();
    assert_eq!(
        holds_sample_content(&serde_json::to_string(&back).unwrap()),
        None
    );
}

/// The [`JobQueue`] contract on a fresh, empty queue with no other consumer:
/// resumes go before starts, each line first in, first out.
///
/// 1. `starts` starts, then a resume, are published (each confirmed): the
///    first [`JobQueue::next`] hands out the resume, though it was published
///    last; the starts follow in publish order.
/// 2. A start, then a resume: [`JobQueue::next_resume`] hands out the
///    resume, and the start waits for [`JobQueue::next`].
/// 3. A requeued resume is still a resume (`next_resume` takes it again);
///    [`JobQueue::depth`] counts both lines.
///
/// Every delivery is acked; the queue is empty afterwards.
pub async fn resumes_before_starts(queue: &dyn JobQueue, starts: u64) {
    let run = Uuid::now_v7();
    let take = |resume_only: bool| async move {
        let d = tokio::time::timeout(Duration::from_secs(30), async {
            if resume_only {
                queue.next_resume().await
            } else {
                queue.next().await
            }
        })
        .await
        .expect("a job within 30 s (a bound on a hang)")
        .expect("next");
        d.acker.ack().await.expect("ack");
        d.job
    };
    for seq in 1..=starts {
        queue.publish(&Job::start(run, seq)).await.unwrap();
    }
    queue.publish(&Job::resume(run, 0)).await.unwrap();
    assert_eq!(
        queue.depth().await.unwrap(),
        starts + 1,
        "depth counts starts and resumes"
    );
    assert_eq!(
        take(false).await,
        Job::resume(run, 0),
        "the resume published after {starts} starts is handed out first"
    );
    for seq in 1..=starts {
        assert_eq!(
            take(false).await,
            Job::start(run, seq),
            "then the starts, in publish order"
        );
    }

    queue.publish(&Job::start(run, 100)).await.unwrap();
    queue.publish(&Job::resume(run, 101)).await.unwrap();
    assert_eq!(
        take(true).await,
        Job::resume(run, 101),
        "next_resume takes the resume behind a start"
    );
    assert_eq!(
        take(false).await,
        Job::start(run, 100),
        "the start is still there for next"
    );

    queue.publish(&Job::start(run, 200)).await.unwrap();
    queue.publish(&Job::resume(run, 201)).await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(30), queue.next_resume())
        .await
        .expect("a job within 30 s")
        .expect("next_resume");
    assert_eq!(d.job, Job::resume(run, 201));
    d.acker.nack(true).await.expect("requeue");
    assert_eq!(
        take(true).await,
        Job::resume(run, 201),
        "a requeued resume is still a resume"
    );
    assert_eq!(take(false).await, Job::start(run, 200));
    assert_eq!(queue.depth().await.unwrap(), 0, "every job was acked");
}

/// Run every check, each on a fresh log from `fresh`.
pub async fn all<L: EventLog, F: std::future::Future<Output = L>>(fresh: impl Fn() -> F) {
    admits_runs_idempotently(&fresh().await).await;
    commits_are_fenced(&fresh().await).await;
    concurrent_commits_across_runs(&fresh().await).await;
    load_equals_replay(&fresh().await).await;
    inbox_and_approvals(&fresh().await).await;
    ending_a_run_closes_its_approvals(&fresh().await).await;
    nothing_is_taken_after_a_cancel(&fresh().await).await;
    a_repeated_approval_during_a_pending_cancel_is_cancelled(&fresh().await).await;
    open_and_release_if_idle(&fresh().await).await;
    an_interrupted_call_is_marked_in_the_queue(&fresh().await).await;
    outbox_and_orphans(&fresh().await).await;
    lists_runs(&fresh().await).await;
    agent_versions(&fresh().await).await;
    erases_a_finished_run(&fresh().await).await;
    finds_expired_runs(&fresh().await).await;
}

/// Up to ten approval records of `run_id`, oldest first.
async fn approvals_of(log: &dyn EventLog, run_id: Uuid) -> Vec<crate::ApprovalRow> {
    log.approvals(&ApprovalFilter {
        run_id: Some(run_id),
        limit: 10,
        ..Default::default()
    })
    .await
    .unwrap()
}

/// Text of the sample log's content (goal, arguments, result, answer):
/// found in no erased record.
const SAMPLE_CONTENT: [&str; 3] = ["A1", "Refunded", "refunded"];

fn holds_sample_content(json: &str) -> Option<&'static str> {
    SAMPLE_CONTENT.into_iter().find(|c| json.contains(c))
}

/// A sample run driven to done under lease `w`, an external result with
/// content posted (and consumed) on the way; the lease is still held.
async fn finished_sample(log: &dyn EventLog, tenant: &str) -> (SampleLog, crate::Lease) {
    let s = sample_log();
    log.create_run(new_run(tenant, None, &s.parked[0]))
        .await
        .unwrap();
    let lease = log.acquire(s.run_id, "w", TTL).await.unwrap();
    log.commit(
        &lease,
        &s.parked[1..],
        &state_after(s.run_id, &s.parked),
        &[],
    )
    .await
    .unwrap();
    let item = log
        .post(
            s.run_id,
            Payload::ToolResult {
                call_id: "c9".into(),
                content: "A1 was refunded".into(),
                is_error: false,
            },
        )
        .await
        .unwrap();
    let all: Vec<Event> = s.parked.iter().chain(&s.rest).cloned().collect();
    log.commit(&lease, &s.rest, &state_after(s.run_id, &all), &[item])
        .await
        .unwrap();
    (s, lease)
}

/// [`RunLog::erase_run`]: a run not done is refused and one under a live
/// lease too, nothing written; a finished one keeps every event's seq, kind,
/// time and spend while its content becomes tombstones (events, summary,
/// approvals), it still loads (the tombstones replay, to the same usage),
/// it records who and when, takes no payload, and erasing it again changes
/// nothing.
pub async fn erases_a_finished_run(log: &dyn EventLog) {
    let when = DateTime::from_timestamp(2_000_000_000, 0).expect("a valid time");
    let unknown = Uuid::now_v7();
    assert!(matches!(
        log.erase_run(unknown, "ana", when).await,
        Err(LogError::NotFound(_))
    ));
    // Not done: refused.
    let parked = sample_log();
    log.create_run(new_run("t", None, &parked.parked[0]))
        .await
        .unwrap();
    assert!(
        matches!(
            log.erase_run(parked.run_id, "ana", when).await,
            Err(LogError::NotFinished(_))
        ),
        "a run not done is not erased"
    );
    assert_eq!(log.get_run(parked.run_id).await.unwrap().erased_at, None);

    let (s, lease) = finished_sample(log, "t").await;
    let before = log.events(s.run_id, 0, 1000).await.unwrap();
    let usage_before = log.load(s.run_id).await.unwrap().usage;
    let spent = log.tenant_usage("t", at().date_naive()).await.unwrap();
    assert!(
        matches!(
            log.erase_run(s.run_id, "ana", when).await,
            Err(LogError::LeaseHeld { .. })
        ),
        "a run under a live lease is not raced"
    );
    assert_eq!(log.events(s.run_id, 0, 1000).await.unwrap(), before);
    log.release(&lease).await.unwrap();

    let erased = log.erase_run(s.run_id, "ana", when).await.unwrap();
    assert_eq!(
        (erased.erased_at, erased.erased_by.as_deref()),
        (Some(when), Some("ana"))
    );
    assert_eq!(erased.goal, glia_proto::TOMBSTONE);
    assert_eq!(
        erased.outcome,
        Some(Outcome::Succeeded {
            answer: glia_proto::TOMBSTONE.into(),
            output: None
        })
    );
    assert_eq!(
        (erased.status, erased.head_seq),
        (RunStatus::Done, before.len() as u64)
    );
    let after = log.events(s.run_id, 0, 1000).await.unwrap();
    assert_eq!(after.len(), before.len(), "no event added or removed");
    for (a, b) in after.iter().zip(&before) {
        assert_eq!(*a, b.erased(), "event {} is its tombstone", b.seq);
        assert_eq!((a.seq, a.at, a.kind.name()), (b.seq, b.at, b.kind.name()));
        assert_eq!(
            a.kind.spend(),
            b.kind.spend(),
            "event {}'s spend stays",
            b.seq
        );
    }
    let text = serde_json::to_string(&after).unwrap();
    assert_eq!(holds_sample_content(&text), None, "content left in {text}");
    assert!(text.contains(glia_proto::TOMBSTONE));
    let state = log.load(s.run_id).await.unwrap();
    assert_eq!(state.usage, usage_before, "usage unchanged");
    assert_eq!(
        state,
        state_after(s.run_id, &after),
        "load = replay of the tombstones"
    );
    assert_eq!(
        log.tenant_usage("t", at().date_naive()).await.unwrap(),
        spent,
        "the tenant's spend unchanged"
    );
    let approvals = approvals_of(log, s.run_id).await;
    assert!(!approvals.is_empty());
    for a in &approvals {
        assert_eq!(a.input, glia_proto::erasure::erased_value());
        assert_eq!(a.args_hash, glia_proto::erasure::erased_args_hash());
    }
    assert!(matches!(
        log.post(s.run_id, Payload::Cancel { reason: "x".into() })
            .await,
        Err(LogError::Finished(_))
    ));
    // Again: idempotent, the first erasure's record kept.
    let again = log
        .erase_run(s.run_id, "bo", when + chrono::Duration::hours(1))
        .await
        .unwrap();
    assert_eq!(again, erased);
    assert_eq!(log.events(s.run_id, 0, 1000).await.unwrap(), after);
    // The other run is untouched.
    assert_eq!(
        log.get_run(parked.run_id).await.unwrap().goal,
        "refund A1",
        "only the erased run changes"
    );
}

/// [`RunLog::expired_runs`]: finished, not erased runs of the tenant (or of
/// every tenant but the excepted), last committed before the time, oldest
/// first, at most the limit.
pub async fn finds_expired_runs(log: &dyn EventLog) {
    let (a, lease_a) = finished_sample(log, "ta").await;
    log.release(&lease_a).await.unwrap();
    let (b, lease_b) = finished_sample(log, "tb").await;
    log.release(&lease_b).await.unwrap();
    let (c, lease_c) = finished_sample(log, "ta").await;
    log.release(&lease_c).await.unwrap();
    let running = sample_log();
    log.create_run(new_run("ta", None, &running.parked[0]))
        .await
        .unwrap();
    let later = Utc::now() + chrono::Duration::hours(1);
    let find = |tenant: Option<&str>, except: &[&str], before: DateTime<Utc>, limit: usize| {
        let filter = crate::ExpiredFilter {
            tenant: tenant.map(str::to_owned),
            except_tenants: except.iter().map(|t| (*t).to_owned()).collect(),
            finished_before: before,
            limit,
        };
        async move { log.expired_runs(&filter).await.unwrap() }
    };
    assert_eq!(
        find(Some("ta"), &[], later, 10).await,
        vec![a.run_id, c.run_id],
        "finished runs of the tenant, oldest first; not the running one"
    );
    assert_eq!(find(Some("ta"), &[], later, 1).await, vec![a.run_id]);
    assert!(
        find(Some("ta"), &[], at(), 10).await.is_empty(),
        "none finished before then"
    );
    let others = find(None, &["ta"], later, 1000).await;
    assert!(others.contains(&b.run_id) && !others.contains(&a.run_id));
    log.erase_run(a.run_id, "retention", Utc::now())
        .await
        .unwrap();
    assert_eq!(
        find(Some("ta"), &[], later, 10).await,
        vec![c.run_id],
        "an erased run is not found again"
    );
}

/// The agent registry: the same content again is the same version (nothing
/// written), new content the next version, versions immutable and per
/// tenant, the latest listed per name; concurrent puts get distinct versions
/// for distinct content.
pub async fn agent_versions(log: &dyn AgentRegistry) {
    let (a1, created) = log
        .put_agent("t1", "support", r#"{"v":1}"#, "sha256:1")
        .await
        .unwrap();
    assert!(created);
    assert_eq!(
        (a1.version, a1.tenant.as_str(), a1.definition.as_str()),
        (1, "t1", r#"{"v":1}"#)
    );
    let (again, created) = log
        .put_agent("t1", "support", r#"{"v":1}"#, "sha256:1")
        .await
        .unwrap();
    assert!(!created, "same content, same version");
    assert_eq!(again, a1);
    let (a2, created) = log
        .put_agent("t1", "support", r#"{"v":2}"#, "sha256:2")
        .await
        .unwrap();
    assert!(created);
    assert_eq!(a2.version, 2);
    assert_eq!(
        log.get_agent("t1", "support", None)
            .await
            .unwrap()
            .unwrap()
            .version,
        2,
        "latest"
    );
    assert_eq!(
        log.get_agent("t1", "support", Some(1))
            .await
            .unwrap()
            .unwrap(),
        a1,
        "versions are immutable"
    );
    assert_eq!(log.get_agent("t1", "support", Some(3)).await.unwrap(), None);
    assert_eq!(
        log.get_agent("t2", "support", None).await.unwrap(),
        None,
        "per tenant"
    );
    let (other, _) = log
        .put_agent("t2", "support", r#"{"v":9}"#, "sha256:9")
        .await
        .unwrap();
    assert_eq!(other.version, 1, "another tenant's agent of the same name");
    log.put_agent("t1", "billing", r#"{"v":1}"#, "sha256:1")
        .await
        .unwrap();
    let listed: Vec<(String, u32)> = log
        .list_agents("t1")
        .await
        .unwrap()
        .into_iter()
        .map(|a| (a.name, a.version))
        .collect();
    assert_eq!(
        listed,
        vec![("billing".to_owned(), 1), ("support".to_owned(), 2)]
    );
    let puts = (0..6).map(|i| async move {
        log.put_agent(
            "t1",
            "race",
            &format!("{{\"v\":{}}}", i % 3),
            &format!("sha256:r{}", i % 3),
        )
        .await
        .unwrap()
    });
    let results = futures::future::join_all(puts).await;
    let mut versions: Vec<u32> = results
        .iter()
        .filter(|(_, created)| *created)
        .map(|(a, _)| a.version)
        .collect();
    versions.sort_unstable();
    assert_eq!(
        versions,
        (1..=versions.len() as u32).collect::<Vec<_>>(),
        "created versions are consecutive and distinct"
    );
    let latest = log.get_agent("t1", "race", None).await.unwrap().unwrap();
    assert_eq!(latest.version as usize, versions.len());
}

/// The [`BatchStore`](crate::batches::BatchStore) contract on `store`, whose
/// items' runs live in `log` (a fresh instance of each): a submission
/// stored whole or not at all, idempotent per tenant, tenant visibility,
/// claims in order with leases, admission, refusal, lanes, live runs,
/// sweep with spend, counts and item views, update and cancel.
pub async fn batch_store(log: &dyn RunLog, store: &dyn crate::batches::BatchStore) {
    use crate::batches::{BatchState, NewBatch, NewItem, SubmitError, Upload};
    use futures::StreamExt;
    let tenant = format!("t-{}", Uuid::now_v7());
    let new = |key: Option<&str>| NewBatch {
        id: Uuid::now_v7(),
        tenant: tenant.clone(),
        idempotency_key: key.map(str::to_owned),
        spec: "{}".into(),
        max_in_flight: Some(2),
        cap: crate::SpendCap::default(),
        expires_at: None,
    };
    // Odd items carry a configuration patch, even ones recorded tools,
    // each kept as given.
    let item = |i: u64| NewItem {
        custom_id: format!("c-{i}"),
        goal: format!("goal {i}"),
        metadata: Some(format!("{{\"i\":\"{i}\"}}")),
        tags: i.is_multiple_of(2).then(|| format!("[\"even\",\"t-{i}\"]")),
        config: (i % 2 == 1).then(|| format!("{{\"model\":\"m-{i}\"}}")),
        recorded_tools: i
            .is_multiple_of(2)
            .then(|| format!("{{\"tools\":[],\"i\":{i}}}")),
        line: i + 2,
    };
    let upload = |chunks: Vec<Vec<NewItem>>, done: bool| {
        let mut parts: Vec<Result<Upload, SubmitError>> =
            chunks.into_iter().map(|c| Ok(Upload::Items(c))).collect();
        if done {
            parts.push(Ok(Upload::Done {
                request_hash: "h1".into(),
            }));
        }
        futures::stream::iter(parts).boxed()
    };

    // Refused whole: a repeated custom_id (across chunks), a cut-off upload.
    let dup = new(None);
    let err = store
        .submit(
            dup.clone(),
            upload(vec![vec![item(0), item(1)], vec![item(1)]], true),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, SubmitError::DuplicateCustomId { line: 3, ref custom_id } if custom_id == "c-1"),
        "{err:?}"
    );
    assert_eq!(
        store.batch(None, dup.id).await.unwrap(),
        None,
        "nothing of a refused batch is stored"
    );
    let cut = new(None);
    assert!(matches!(
        store
            .submit(cut.clone(), upload(vec![vec![item(0)]], false))
            .await,
        Err(SubmitError::Truncated)
    ));
    assert_eq!(store.batch(None, cut.id).await.unwrap(), None);

    // Stored, then idempotent per tenant.
    let first = new(Some("k"));
    let s = store
        .submit(
            first.clone(),
            upload(vec![vec![item(0), item(1)], vec![item(2), item(3)]], true),
        )
        .await
        .unwrap();
    assert!(s.created);
    assert_eq!(
        (
            s.batch.items_total,
            s.batch.state,
            s.batch.request_hash.as_str(),
            s.upload_hash.as_str()
        ),
        (4, BatchState::Active, "h1", "h1")
    );
    let again = store
        .submit(new(Some("k")), upload(vec![vec![item(9)]], true))
        .await
        .unwrap();
    assert!(
        !again.created && again.batch.id == first.id,
        "same tenant, same key: the first batch"
    );
    assert_eq!(
        store.batch(Some("someone-else"), first.id).await.unwrap(),
        None,
        "another tenant's batch is invisible"
    );
    assert!(
        store
            .batches(Some(&tenant), None, 10)
            .await
            .unwrap()
            .iter()
            .any(|b| b.id == first.id)
    );
    let id = first.id;
    assert_eq!(
        store.counts(id).await.unwrap(),
        [("queued".to_owned(), 4)].into()
    );
    let items = store.items(id, 1, 2).await.unwrap();
    assert_eq!(
        items
            .iter()
            .map(|i| (i.n, i.custom_id.as_str(), i.metadata.as_deref()))
            .collect::<Vec<_>>(),
        [
            (1, "c-1", Some("{\"i\":\"1\"}")),
            (2, "c-2", Some("{\"i\":\"2\"}"))
        ]
    );

    // Claims come in order, with what the item's run is admitted with; a
    // live claim is not taken again, a lapsed one is.
    let claims = store.claim(id, 2, TTL).await.unwrap();
    assert_eq!(
        claims
            .iter()
            .map(|c| (c.n, c.goal.as_str(), c.config.as_deref()))
            .collect::<Vec<_>>(),
        [
            (0, "goal 0", None),
            (1, "goal 1", Some("{\"model\":\"m-1\"}"))
        ]
    );
    assert_eq!(
        claims
            .iter()
            .map(|c| (c.metadata.as_deref(), c.tags.as_deref()))
            .collect::<Vec<_>>(),
        [
            (Some("{\"i\":\"0\"}"), Some("[\"even\",\"t-0\"]")),
            (Some("{\"i\":\"1\"}"), None)
        ]
    );
    assert_eq!(
        claims
            .iter()
            .map(|c| c.recorded_tools.as_deref())
            .collect::<Vec<_>>(),
        [Some("{\"tools\":[],\"i\":0}"), None]
    );
    let lane = store
        .lanes()
        .await
        .unwrap()
        .into_iter()
        .find(|l| l.batch_id == id)
        .expect("a lane for the batch");
    assert_eq!(
        (
            lane.in_flight,
            lane.waiting,
            lane.max_in_flight,
            lane.tenant.as_str()
        ),
        (2, 4, Some(2), tenant.as_str())
    );
    assert_eq!(
        store
            .claim(id, 1, TTL)
            .await
            .unwrap()
            .iter()
            .map(|c| c.n)
            .collect::<Vec<_>>(),
        [2]
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        store
            .claim(id, 1, Duration::from_millis(1))
            .await
            .unwrap()
            .iter()
            .map(|c| c.n)
            .collect::<Vec<_>>(),
        [0],
        "a lapsed claim is taken again"
    );

    // Item 0 becomes a run; item 1 is refused.
    let s0 = sample_log();
    log.create_run(NewRun {
        tenant: tenant.clone(),
        idempotency_key: None,
        batch_id: Some(id),
        start: s0.parked[0].clone(),
        tags: Vec::new(),
        metadata: Default::default(),
        custom_id: None,
        parent_run_id: None,
        parent_call_id: None,
        depth: 0,
    })
    .await
    .unwrap();
    assert_eq!(
        store.admitted(id, 0, s0.run_id).await.unwrap(),
        BatchState::Active
    );
    store.refused(id, 1, "no such agent").await.unwrap();
    assert_eq!(store.live_runs(id).await.unwrap(), [s0.run_id]);
    let views = store.items(id, 0, 10).await.unwrap();
    assert_eq!(
        (views[0].status.as_str(), views[0].run_id),
        ("running", Some(s0.run_id))
    );
    assert_eq!(
        (
            views[1].status.as_str(),
            views[1].error.as_deref(),
            views[1].spend
        ),
        (
            "failed",
            Some("no such agent"),
            Some(crate::Spend::default())
        )
    );
    // Parked, then done: the sweep folds its spend into the item.
    let lease = log.acquire(s0.run_id, "w", TTL).await.unwrap();
    log.commit(
        &lease,
        &s0.parked[1..],
        &state_after(s0.run_id, &s0.parked),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(
        store.items(id, 0, 1).await.unwrap()[0].status,
        "parked:awaiting_approval"
    );
    let all = [s0.parked.clone(), s0.rest.clone()].concat();
    let done = state_after(s0.run_id, &all);
    log.commit(&lease, &s0.rest, &done, &[]).await.unwrap();
    let spent = crate::Spend::of(&done.usage.tokens, done.usage.cost_usd_micros);
    assert_eq!(
        store.spend(id).await.unwrap(),
        spent,
        "a live run's spend counts before the sweep"
    );
    assert!(store.sweep(100).await.unwrap() >= 1);
    let view = &store.items(id, 0, 1).await.unwrap()[0];
    assert_eq!(
        (view.status.as_str(), view.spend),
        ("succeeded", Some(spent))
    );
    assert!(matches!(view.outcome, Some(Outcome::Succeeded { .. })));
    assert_eq!(
        store.spend(id).await.unwrap(),
        spent,
        "and the same after it"
    );
    assert!(store.live_runs(id).await.unwrap().is_empty());

    // Pause keeps items queued; cancel cancels the queued ones and is final.
    let paused = store
        .update(
            Some(&tenant),
            id,
            Some(BatchState::Paused),
            Some(crate::SpendCap {
                tokens: Some(5),
                cost_usd_micros: None,
            }),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (paused.state, paused.cap.tokens),
        (BatchState::Paused, Some(5))
    );
    assert_eq!(
        store
            .update(Some("someone-else"), id, Some(BatchState::Active), None)
            .await
            .unwrap(),
        None
    );
    let cancelled = store
        .update(None, id, Some(BatchState::Cancelled), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(cancelled.state, BatchState::Cancelled);
    let counts = store.counts(id).await.unwrap();
    assert_eq!(
        (counts.get("cancelled"), counts.get("queued")),
        (Some(&1), Some(&1)),
        "item 3 was queued; item 2, claimed, shows queued: {counts:?}"
    );
    let still = store
        .update(None, id, Some(BatchState::Active), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        still.state,
        BatchState::Cancelled,
        "a cancelled batch stays cancelled"
    );

    // The completion window ends: queued items expire; a run still going is
    // answered (each time until it is done) for its cancel, and once it ended
    // cancelled its item shows `expired`. A batch within its window is left alone.
    let within = NewBatch {
        expires_at: Some(chrono::Utc::now() + chrono::Duration::hours(1)),
        ..new(None)
    };
    store
        .submit(within.clone(), upload(vec![vec![item(0)]], true))
        .await
        .unwrap();
    let open = store.claim(within.id, 1, TTL).await.unwrap();
    let s1 = sample_log();
    log.create_run(NewRun {
        tenant: tenant.clone(),
        idempotency_key: None,
        batch_id: Some(within.id),
        start: s1.parked[0].clone(),
        tags: Vec::new(),
        metadata: Default::default(),
        custom_id: None,
        parent_run_id: None,
        parent_call_id: None,
        depth: 0,
    })
    .await
    .unwrap();
    store
        .admitted(within.id, open[0].n, s1.run_id)
        .await
        .unwrap();
    let late = NewBatch {
        expires_at: Some(chrono::Utc::now() - chrono::Duration::seconds(1)),
        ..new(None)
    };
    store
        .submit(late.clone(), upload(vec![vec![item(0), item(1)]], true))
        .await
        .unwrap();
    let started = store.claim(late.id, 1, TTL).await.unwrap();
    let s2 = sample_log();
    log.create_run(NewRun {
        tenant: tenant.clone(),
        idempotency_key: None,
        batch_id: Some(late.id),
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
    store
        .admitted(late.id, started[0].n, s2.run_id)
        .await
        .unwrap();
    let lease = log.acquire(s2.run_id, "w", TTL).await.unwrap();
    log.commit(
        &lease,
        &s2.parked[1..],
        &state_after(s2.run_id, &s2.parked),
        &[],
    )
    .await
    .unwrap();
    store.sweep(100).await.unwrap();
    assert_eq!(
        store.expire_runs(100).await.unwrap(),
        [s2.run_id],
        "only the run of the batch past its window"
    );
    assert_eq!(
        store.expire_runs(100).await.unwrap(),
        [s2.run_id],
        "answered again until it is done"
    );
    let views = store.items(late.id, 0, 10).await.unwrap();
    assert_eq!(
        (views[0].status.as_str(), views[1].status.as_str()),
        ("parked:awaiting_approval", "expired")
    );
    let cancel = Event {
        run_id: s2.run_id,
        seq: s2.parked.len() as u64 + 1,
        at: at(),
        kind: EventKind::SessionCancel {
            reason: "window".into(),
        },
    };
    let events = [s2.parked.clone(), vec![cancel.clone()]].concat();
    log.commit(&lease, &[cancel], &state_after(s2.run_id, &events), &[])
        .await
        .unwrap();
    assert!(
        store.expire_runs(100).await.unwrap().is_empty(),
        "a run that is done is not answered"
    );
    store.sweep(100).await.unwrap();
    let views = store.items(late.id, 0, 10).await.unwrap();
    assert_eq!(
        (
            views[0].status.as_str(),
            views[0].run_id,
            views[1].status.as_str()
        ),
        ("expired", Some(s2.run_id), "expired")
    );
    assert_eq!(
        store.counts(late.id).await.unwrap(),
        [("expired".to_owned(), 2)].into()
    );
    assert_eq!(
        store.items(within.id, 0, 1).await.unwrap()[0].status,
        "running",
        "the batch within its window is untouched"
    );
}

/// Held tool results ([`crate::Ledger::hold_results`]): held under the
/// call's idempotency key, read back exactly (text and blocks, results and
/// errors), replaced when held again, independent per key, and gone once
/// released; an unknown key holds nothing.
pub async fn holds_tool_results(ledger: &dyn crate::Ledger) {
    use crate::HeldResult;
    use glia_proto::{ToolContent, ToolErrorKind};
    let run_id = Uuid::now_v7();
    let (k1, k2) = (format!("{run_id}:1:call_1"), format!("{run_id}:1:call_2"));
    assert_eq!(
        ledger.held_result(&k1).await.unwrap(),
        None,
        "nothing held yet"
    );
    let ok = HeldResult {
        call_id: "call_1".into(),
        content: ToolContent::from("{\"refunded\":30}"),
        error: None,
        duration_ms: 12,
    };
    let blocks: ToolContent = serde_json::from_value(json!([{"type": "text", "text": "done ✓"}]))
        .expect("a block list is tool content");
    let failed = HeldResult {
        call_id: "call_2".into(),
        content: blocks,
        error: Some(ToolErrorKind::Failed),
        duration_ms: 3,
    };
    ledger
        .hold_results(&[(k1.clone(), ok.clone()), (k2.clone(), failed.clone())])
        .await
        .unwrap();
    assert_eq!(ledger.held_result(&k1).await.unwrap(), Some(ok.clone()));
    assert_eq!(
        ledger.held_result(&k2).await.unwrap(),
        Some(failed.clone()),
        "errors and content blocks round-trip"
    );
    assert_eq!(
        ledger
            .held_result(&format!("{run_id}:2:call_1"))
            .await
            .unwrap(),
        None,
        "another turn's call of the same id is another key"
    );
    // Holding again (a retry) replaces; holding nothing is fine.
    let again = HeldResult {
        duration_ms: 13,
        ..ok.clone()
    };
    ledger
        .hold_results(&[(k1.clone(), again.clone())])
        .await
        .unwrap();
    ledger.hold_results(&[]).await.unwrap();
    assert_eq!(ledger.held_result(&k1).await.unwrap(), Some(again));
    // Released once committed: gone; the other key stays.
    ledger
        .release_held(std::slice::from_ref(&k1))
        .await
        .unwrap();
    ledger.release_held(&[]).await.unwrap();
    assert_eq!(ledger.held_result(&k1).await.unwrap(), None, "released");
    assert_eq!(
        ledger.held_result(&k2).await.unwrap(),
        Some(failed),
        "released alone"
    );
    ledger
        .release_held(&[k2.clone(), "never-held".into()])
        .await
        .unwrap();
    assert_eq!(ledger.held_result(&k2).await.unwrap(), None);
    // Forgetting a run (its erasure) drops its held results and running
    // marks, and only its own.
    let other = Uuid::now_v7();
    let theirs = format!("{other}:1:call_1");
    let running = format!("{run_id}:3:call_3");
    ledger
        .hold_results(&[(k1.clone(), ok.clone()), (theirs.clone(), ok.clone())])
        .await
        .unwrap();
    ledger
        .mark_running(
            std::slice::from_ref(&running),
            std::time::Duration::from_secs(60),
        )
        .await
        .unwrap();
    ledger.forget_run(run_id).await.unwrap();
    ledger.forget_run(run_id).await.unwrap();
    assert_eq!(ledger.held_result(&k1).await.unwrap(), None, "forgotten");
    assert_eq!(
        ledger.held_result(&theirs).await.unwrap(),
        Some(ok),
        "another run's result stays"
    );
    if ledger.running(&running).await.unwrap() {
        panic!("a forgotten run's running mark stays");
    }
}

/// Running marks ([`crate::Ledger::mark_running`]): a marked key reads as
/// running until its result is held (the hold removes the mark) or the mark
/// lapses; marking again extends it; an unmarked key is not running.
pub async fn marks_running_calls(ledger: &dyn crate::Ledger) {
    use crate::HeldResult;
    use glia_proto::ToolContent;
    use std::time::Duration;
    let run_id = Uuid::now_v7();
    let (k1, k2) = (format!("{run_id}:1:call_1"), format!("{run_id}:1:call_2"));
    assert!(!ledger.running(&k1).await.unwrap(), "not marked yet");
    ledger
        .mark_running(&[k1.clone(), k2.clone()], Duration::from_secs(60))
        .await
        .unwrap();
    ledger
        .mark_running(&[], Duration::from_secs(60))
        .await
        .unwrap();
    assert!(ledger.running(&k1).await.unwrap(), "marked");
    assert!(ledger.running(&k2).await.unwrap(), "marked together");
    assert!(
        !ledger.running(&format!("{run_id}:2:call_1")).await.unwrap(),
        "another turn's call of the same id is another key"
    );
    // Held: the result is there and the call no longer runs.
    let ok = HeldResult {
        call_id: "call_1".into(),
        content: ToolContent::from("{\"refunded\":30}"),
        error: None,
        duration_ms: 12,
    };
    ledger
        .hold_results(&[(k1.clone(), ok.clone())])
        .await
        .unwrap();
    assert!(!ledger.running(&k1).await.unwrap(), "the hold unmarks");
    assert_eq!(ledger.held_result(&k1).await.unwrap(), Some(ok));
    assert!(ledger.running(&k2).await.unwrap(), "unmarked alone");
    // A mark nobody refreshes lapses (a worker that died mid-call).
    ledger
        .mark_running(std::slice::from_ref(&k2), Duration::from_millis(50))
        .await
        .unwrap();
    let mut lapsed = false;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(25)).await;
        if !ledger.running(&k2).await.unwrap() {
            lapsed = true;
            break;
        }
    }
    assert!(lapsed, "a mark lapses after its time to live");
    ledger.release_held(&[k1]).await.unwrap();
}
