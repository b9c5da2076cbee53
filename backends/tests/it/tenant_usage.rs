//! `Reports::tenant_usage`, the sum a missing budget counter is rebuilt
//! from, on the memory twin and on Postgres (`GLIA_DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/postgres`, allowed to create
//! databases; each test works in a database of its own, dropped at the end).

use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};
use glia_backends::memory::MemoryLog;
use glia_backends::testkit::TestDb;
use glia_backends::{NewRun, Reports, RunLog, Spend};
use glia_proto::{Event, EventKind, Message, RunConfig, RunState, Usage};
use uuid::Uuid;

const TTL: Duration = Duration::from_secs(30);

fn day() -> NaiveDate {
    NaiveDate::from_ymd_opt(2025, 3, 9).unwrap()
}

/// `h:m:s.nanos` on `day() + offset` days, UTC.
fn at(offset: i64, h: u32, m: u32, s: u32, nanos: u32) -> DateTime<Utc> {
    (day() + chrono::Duration::days(offset))
        .and_hms_nano_opt(h, m, s, nanos)
        .unwrap()
        .and_utc()
}

/// When a model spend happened and what it was.
#[derive(Clone, Copy)]
struct Spent {
    at: DateTime<Utc>,
    tokens: Usage,
    cost: u64,
}

fn spent(at: DateTime<Utc>, input_tokens: u64, output_tokens: u64, cost: u64) -> Spent {
    Spent {
        at,
        tokens: Usage {
            input_tokens,
            output_tokens,
            ..Usage::default()
        },
        cost,
    }
}

/// A run's log with one spend of each kind: a plan draft (the run's first
/// events share its time), a compaction, and a model response saying `answer`.
fn run_log(
    run_id: Uuid,
    plan: Spent,
    compacted: Spent,
    response: Spent,
    answer: &str,
) -> Vec<Event> {
    let steps = vec!["Do it.".to_owned()];
    let kinds = vec![
        (
            plan.at,
            EventKind::SessionStart {
                redactions: Vec::new(),
                goal: "g".into(),
                config: RunConfig::default(),
            },
        ),
        (
            plan.at,
            EventKind::PlanDraft {
                steps: steps.clone(),
                usage: plan.tokens,
                cost_usd_micros: plan.cost,
            },
        ),
        (plan.at, EventKind::PlanCommit { steps }),
        (
            plan.at,
            EventKind::StepStart {
                index: 0,
                description: "Do it.".into(),
                tools: vec![],
            },
        ),
        (
            compacted.at,
            EventKind::ContextCompacted {
                strategy: "summarize".into(),
                removed: 0,
                messages: vec![Message::user("g")],
                usage: compacted.tokens,
                cost_usd_micros: compacted.cost,
            },
        ),
        (
            compacted.at,
            EventKind::ModelCall {
                model: "m".into(),
                messages: 1,
                wrap_up: false,
                forced_tool: None,
            },
        ),
        (
            response.at,
            EventKind::ModelResponse {
                redactions: Vec::new(),
                message: Message::assistant(answer),
                usage: response.tokens,
                stop_reason: "end_turn".into(),
                duration_ms: 1,
                cost_usd_micros: response.cost,
                rejected: None,
            },
        ),
    ];
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, (at, kind))| Event {
            run_id,
            seq: i as u64 + 1,
            at,
            kind,
        })
        .collect()
}

async fn admit(log: &dyn RunLog, tenant: &str, events: Vec<Event>) {
    let run_id = events[0].run_id;
    log.create_run(NewRun {
        tenant: tenant.into(),
        idempotency_key: None,
        batch_id: None,
        start: events[0].clone(),
        tags: Vec::new(),
        metadata: Default::default(),
        custom_id: None,
        parent_run_id: None,
        parent_call_id: None,
        depth: 0,
    })
    .await
    .unwrap();
    let lease = log.acquire(run_id, "w", TTL).await.unwrap();
    let state = RunState::replay(run_id, &events).expect("the log replays");
    log.commit(&lease, &events[1..], &state, &[]).await.unwrap();
    log.release(&lease).await.unwrap();
}

/// Runs of two tenants with spend just before, at, inside, at the end of and
/// just after the day; one response big and carrying U+0000 (Postgres keeps
/// it in `blobs`). Every kind of spend and every day boundary counts.
async fn sums_a_tenants_day(log: &dyn Reports) {
    let zero = |at| spent(at, 0, 0, 0);
    let big = format!("{}\u{0}", "x".repeat(100_000));
    // Plan the nanosecond before the day (out), compaction and response at its first instant (in).
    admit(
        log,
        "a",
        run_log(
            Uuid::now_v7(),
            spent(at(-1, 23, 59, 59, 999_999_999), 1, 2, 3),
            spent(at(0, 0, 0, 0, 0), 2, 3, 1),
            Spent {
                at: at(0, 0, 0, 0, 0),
                tokens: Usage {
                    input_tokens: 10,
                    output_tokens: 5,
                    cache_write_tokens: 2,
                    cache_read_tokens: 1,
                    estimated: false,
                },
                cost: 7,
            },
            "one",
        ),
    )
    .await;
    // Plan at noon (in), compaction at the day's last nanosecond (in), response at the next day's first instant (out).
    admit(
        log,
        "a",
        run_log(
            Uuid::now_v7(),
            spent(at(0, 12, 0, 0, 0), 3, 1, 2),
            spent(at(0, 23, 59, 59, 999_999_999), 1, 0, 1),
            spent(at(1, 0, 0, 0, 0), 60, 40, 100),
            "two",
        ),
    )
    .await;
    // A response kept in a blob (in).
    admit(
        log,
        "a",
        run_log(
            Uuid::now_v7(),
            zero(at(0, 18, 0, 0, 0)),
            zero(at(0, 18, 0, 0, 0)),
            spent(at(0, 18, 0, 0, 1), 20, 10, 11),
            &big,
        ),
    )
    .await;
    // Another tenant, same day (out).
    admit(
        log,
        "b",
        run_log(
            Uuid::now_v7(),
            spent(at(0, 10, 0, 0, 0), 500, 500, 1000),
            zero(at(0, 10, 0, 0, 0)),
            zero(at(0, 10, 0, 0, 0)),
            "b",
        ),
    )
    .await;

    let usage = |tenant: &'static str, offset: i64| async move {
        log.tenant_usage(tenant, day() + chrono::Duration::days(offset))
            .await
            .unwrap()
    };
    // (2+3) + (10+5+2+1) + (3+1) + (1+0) + (20+10) tokens; 1 + 7 + 2 + 1 + 11 micros.
    assert_eq!(
        usage("a", 0).await,
        Spend {
            tokens: 5 + 18 + 4 + 1 + 30,
            cost_usd_micros: 22
        }
    );
    assert_eq!(
        usage("a", -1).await,
        Spend {
            tokens: 3,
            cost_usd_micros: 3
        }
    );
    assert_eq!(
        usage("a", 1).await,
        Spend {
            tokens: 100,
            cost_usd_micros: 100
        }
    );
    assert_eq!(
        usage("b", 0).await,
        Spend {
            tokens: 1000,
            cost_usd_micros: 1000
        }
    );
    assert_eq!(
        usage("c", 0).await,
        Spend::ZERO,
        "an unknown tenant spent nothing"
    );
    assert_eq!(usage("a", 2).await, Spend::ZERO, "a day without events");
}

#[tokio::test]
async fn memory_log_sums_a_tenants_day() {
    sums_a_tenants_day(&MemoryLog::default()).await;
}

#[tokio::test]
async fn postgres_sums_a_tenants_day() {
    let db = TestDb::new().await;
    let log = db.log().await;
    sums_a_tenants_day(&log).await;
    let blobs: i64 = db
        .sql()
        .await
        .query_one(
            "SELECT count(*) FROM events WHERE blob_hash IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(blobs, 1, "the big response is in blobs, and was counted");
}

// ---------------------------------------------------------------------------
// A database of its own (the pattern of tests/postgres.rs).
