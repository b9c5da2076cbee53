//! Budget counters of the [`Ledger`]: the same checks against the memory
//! twin and against a real Redis (`GLIA_REDIS_URL`, default
//! `redis://127.0.0.1:6379`; each test under a key prefix of its own,
//! `glia-test-<uuid>`, whose keys are deleted at the end, pass or fail).

use std::sync::Arc;
use std::time::Duration;

use glia_backends::memory::MemoryLedger;
use glia_backends::redis_ledger::RedisLedger;
use glia_backends::sqlite::{SqliteLedger, SqliteLog, SqliteOptions};
use glia_backends::testkit::{RedisKeys, TempDir};
use glia_backends::{CapKind, Ledger, Reservation, Settlement, Spend, SpendCap};
use uuid::Uuid;

const DAY: Duration = Duration::from_secs(2 * 24 * 3600);

fn spend(tokens: u64, cost_usd_micros: u64) -> Spend {
    Spend {
        tokens,
        cost_usd_micros,
    }
}

fn cost_cap(micros: u64) -> SpendCap {
    SpendCap {
        tokens: None,
        cost_usd_micros: Some(micros),
    }
}

// ---------------------------------------------------------------------------
// The checks, for any ledger.

/// Reserve and settle under one request id, then again: nothing more is
/// counted; the reservation is replaced by the actual amount.
async fn reserve_and_settle_are_idempotent(ledger: &dyn Ledger) {
    let scope = "tenant:t:day:2025-03-09";
    assert!(ledger.seed(scope, spend(100, 10), DAY).await.unwrap());
    let cap = SpendCap {
        tokens: Some(10_000),
        cost_usd_micros: Some(1_000),
    };
    assert_eq!(
        ledger
            .reserve(scope, "run:5", spend(500, 50), cap)
            .await
            .unwrap(),
        Reservation::Granted {
            used: spend(600, 60)
        }
    );
    assert_eq!(
        ledger
            .reserve(scope, "run:5", spend(500, 50), cap)
            .await
            .unwrap(),
        Reservation::Granted {
            used: spend(600, 60)
        },
        "a retry"
    );
    assert_eq!(
        ledger.settle(scope, "run:5", spend(30, 4)).await.unwrap(),
        Settlement::Settled {
            used: spend(130, 14)
        }
    );
    assert_eq!(
        ledger.settle(scope, "run:5", spend(30, 4)).await.unwrap(),
        Settlement::Settled {
            used: spend(130, 14)
        },
        "a repeated settle"
    );
    assert_eq!(
        ledger.settle(scope, "run:5", spend(999, 99)).await.unwrap(),
        Settlement::Settled {
            used: spend(130, 14)
        },
        "settled is final"
    );
    assert_eq!(
        ledger
            .reserve(scope, "run:5", spend(500, 50), cap)
            .await
            .unwrap(),
        Reservation::Granted {
            used: spend(130, 14)
        },
        "a late retry"
    );
    // Spend nothing reserved for (a plan draft) is added, once.
    assert_eq!(
        ledger.settle(scope, "run:9", spend(20, 6)).await.unwrap(),
        Settlement::Settled {
            used: spend(150, 20)
        }
    );
    assert_eq!(
        ledger.settle(scope, "run:9", spend(20, 6)).await.unwrap(),
        Settlement::Settled {
            used: spend(150, 20)
        }
    );
    // A failed call gives its reservation back.
    assert!(matches!(
        ledger
            .reserve(scope, "run:12", spend(1000, 900), cap)
            .await
            .unwrap(),
        Reservation::Granted { .. }
    ));
    assert_eq!(
        ledger.settle(scope, "run:12", Spend::ZERO).await.unwrap(),
        Settlement::Settled {
            used: spend(150, 20)
        }
    );
    // Seeding an existing counter changes nothing.
    assert!(!ledger.seed(scope, Spend::ZERO, DAY).await.unwrap());
    assert_eq!(
        ledger.settle(scope, "run:9", Spend::ZERO).await.unwrap(),
        Settlement::Settled {
            used: spend(150, 20)
        }
    );
}

/// Caps: the counter plus the amount may reach a cap, not pass it; a
/// counter at a cap refuses even a zero amount; cost is checked first;
/// a refusal writes nothing; an uncapped kind never refuses.
async fn caps_refuse_what_does_not_fit(ledger: &dyn Ledger) {
    let scope = "tenant:t:day:2025-03-10";
    ledger.seed(scope, spend(0, 90), DAY).await.unwrap();
    let cap = SpendCap {
        tokens: Some(1_000),
        cost_usd_micros: Some(100),
    };
    let exceeded = |cap| Reservation::Exceeded {
        used: spend(0, 90),
        cap,
    };
    assert_eq!(
        ledger
            .reserve(scope, "a", spend(2_000, 11), cap)
            .await
            .unwrap(),
        exceeded(CapKind::Cost),
        "cost first"
    );
    assert_eq!(
        ledger
            .reserve(scope, "a", spend(1_001, 10), cap)
            .await
            .unwrap(),
        exceeded(CapKind::Tokens)
    );
    assert_eq!(
        ledger
            .reserve(scope, "a", spend(1_000, 10), cap)
            .await
            .unwrap(),
        Reservation::Granted {
            used: spend(1_000, 100)
        },
        "up to the cap"
    );
    let full = Reservation::Exceeded {
        used: spend(1_000, 100),
        cap: CapKind::Cost,
    };
    assert_eq!(
        ledger.reserve(scope, "b", Spend::ZERO, cap).await.unwrap(),
        full,
        "no room left, not even for nothing"
    );
    assert_eq!(
        ledger.settle(scope, "b", Spend::ZERO).await.unwrap(),
        Settlement::Settled {
            used: spend(1_000, 100)
        },
        "b was never reserved"
    );
    let uncapped = SpendCap::default();
    assert_eq!(
        ledger
            .reserve(scope, "c", spend(5, 5), uncapped)
            .await
            .unwrap(),
        Reservation::Granted {
            used: spend(1_005, 105)
        }
    );
    // Raised caps: room again.
    let raised = SpendCap {
        tokens: Some(2_000),
        cost_usd_micros: Some(200),
    };
    assert_eq!(
        ledger
            .reserve(scope, "d", spend(1, 1), raised)
            .await
            .unwrap(),
        Reservation::Granted {
            used: spend(1_006, 106)
        }
    );
}

/// A scope without a counter answers `Missing` and writes nothing, so a
/// lost counter never restarts from zero; seeded (from the log), it grants.
async fn missing_then_seeded_then_granted(ledger: &dyn Ledger) {
    let scope = "tenant:t:day:2025-03-11";
    assert_eq!(
        ledger
            .reserve(scope, "r1", spend(1, 1), cost_cap(100))
            .await
            .unwrap(),
        Reservation::Missing
    );
    assert_eq!(
        ledger.settle(scope, "r1", spend(1, 1)).await.unwrap(),
        Settlement::Missing
    );
    assert_eq!(
        ledger
            .reserve(scope, "r1", spend(1, 1), cost_cap(100))
            .await
            .unwrap(),
        Reservation::Missing,
        "still nothing written"
    );
    assert!(ledger.seed(scope, spend(40, 95), DAY).await.unwrap());
    assert!(
        !ledger.seed(scope, spend(0, 0), DAY).await.unwrap(),
        "only if absent"
    );
    assert_eq!(
        ledger
            .reserve(scope, "r1", spend(1, 6), cost_cap(100))
            .await
            .unwrap(),
        Reservation::Exceeded {
            used: spend(40, 95),
            cap: CapKind::Cost
        }
    );
    assert_eq!(
        ledger
            .reserve(scope, "r1", spend(1, 5), cost_cap(100))
            .await
            .unwrap(),
        Reservation::Granted {
            used: spend(41, 100)
        }
    );
}

/// Many tasks reserving at once against one cap: exactly as many as fit
/// are granted, and the counter never passes the cap.
async fn concurrent_reservations_never_pass_the_cap(ledger: Arc<dyn Ledger>) {
    let scope = "tenant:t:day:2025-03-12";
    ledger.seed(scope, Spend::ZERO, DAY).await.unwrap();
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                // Each task retries its own request once, as a reconnect would.
                let first = ledger
                    .reserve(scope, &format!("run:{i}"), spend(1, 7), cost_cap(100))
                    .await
                    .unwrap();
                let again = ledger
                    .reserve(scope, &format!("run:{i}"), spend(1, 7), cost_cap(100))
                    .await
                    .unwrap();
                (first, again)
            })
        })
        .collect();
    let mut granted = 0;
    for task in tasks {
        match task.await.unwrap() {
            (Reservation::Granted { used }, Reservation::Granted { .. }) => {
                assert!(used.cost_usd_micros <= 100, "{used:?}");
                granted += 1;
            }
            (
                Reservation::Exceeded {
                    cap: CapKind::Cost,
                    used,
                },
                _,
            ) => assert!(used.cost_usd_micros + 7 > 100, "{used:?}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(granted, 14, "100 / 7");
    let used = ledger.settle(scope, "probe", Spend::ZERO).await.unwrap();
    assert_eq!(
        used,
        Settlement::Settled {
            used: spend(14, 98)
        }
    );
}

// ---------------------------------------------------------------------------
// The memory twin.

#[tokio::test]
async fn memory_reserve_and_settle_are_idempotent() {
    reserve_and_settle_are_idempotent(&MemoryLedger::default()).await;
}

#[tokio::test]
async fn memory_caps_refuse_what_does_not_fit() {
    caps_refuse_what_does_not_fit(&MemoryLedger::default()).await;
}

#[tokio::test]
async fn memory_missing_then_seeded_then_granted() {
    let ledger = MemoryLedger::default();
    missing_then_seeded_then_granted(&ledger).await;
    ledger.forget_budgets();
    let scope = "tenant:t:day:2025-03-11";
    assert_eq!(
        ledger
            .reserve(scope, "r2", Spend::ZERO, cost_cap(100))
            .await
            .unwrap(),
        Reservation::Missing,
        "forgotten, as by a flush"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_concurrent_reservations_never_pass_the_cap() {
    concurrent_reservations_never_pass_the_cap(Arc::new(MemoryLedger::default())).await;
}

#[tokio::test]
async fn memory_counters_expire() {
    let ledger = MemoryLedger::default();
    ledger
        .seed("s", spend(1, 1), Duration::from_secs(1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        ledger
            .reserve("s", "r", Spend::ZERO, SpendCap::default())
            .await
            .unwrap(),
        Reservation::Missing
    );
}

// ---------------------------------------------------------------------------
// SQLite (the single node): the same checks, and counters that survive a
// restart of the process.

async fn sqlite_ledger(dir: &TempDir) -> SqliteLedger {
    SqliteLog::open(dir.db(), SqliteOptions::default())
        .await
        .unwrap()
        .ledger()
}

#[tokio::test]
async fn sqlite_reserve_and_settle_are_idempotent() {
    let dir = TempDir::new();
    reserve_and_settle_are_idempotent(&sqlite_ledger(&dir).await).await;
}

#[tokio::test]
async fn sqlite_caps_refuse_what_does_not_fit() {
    let dir = TempDir::new();
    caps_refuse_what_does_not_fit(&sqlite_ledger(&dir).await).await;
}

#[tokio::test]
async fn sqlite_missing_then_seeded_then_granted() {
    let dir = TempDir::new();
    missing_then_seeded_then_granted(&sqlite_ledger(&dir).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_concurrent_reservations_never_pass_the_cap() {
    let dir = TempDir::new();
    concurrent_reservations_never_pass_the_cap(Arc::new(sqlite_ledger(&dir).await)).await;
}

#[tokio::test]
async fn sqlite_counters_survive_a_restart_and_expire() {
    let dir = TempDir::new();
    let scope = "tenant:t:day:2025-03-12";
    {
        let ledger = sqlite_ledger(&dir).await;
        ledger.seed(scope, spend(10, 1), DAY).await.unwrap();
        ledger
            .reserve(scope, "r1", spend(5, 2), SpendCap::default())
            .await
            .unwrap();
        ledger
            .seed("short", spend(1, 1), Duration::from_secs(1))
            .await
            .unwrap();
    }
    let ledger = sqlite_ledger(&dir).await;
    assert_eq!(
        ledger
            .reserve(scope, "r1", spend(5, 2), SpendCap::default())
            .await
            .unwrap(),
        Reservation::Granted { used: spend(15, 3) },
        "the request id is remembered"
    );
    assert_eq!(
        ledger.settle(scope, "r1", spend(1, 1)).await.unwrap(),
        Settlement::Settled { used: spend(11, 2) }
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        ledger
            .reserve("short", "r", Spend::ZERO, SpendCap::default())
            .await
            .unwrap(),
        Reservation::Missing,
        "expired"
    );
}

// ---------------------------------------------------------------------------
// Redis.

fn url() -> String {
    std::env::var("GLIA_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A ledger under a fresh key prefix, and a guard deleting its keys.
async fn redis_ledger() -> (RedisLedger, RedisKeys) {
    let prefix = format!("glia-test-{}", Uuid::now_v7());
    let ledger = RedisLedger::connect(&url(), &prefix)
        .await
        .expect("Redis at GLIA_REDIS_URL");
    (ledger, RedisKeys { url: url(), prefix })
}

async fn raw() -> redis::aio::MultiplexedConnection {
    redis::Client::open(url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("connect to Redis at GLIA_REDIS_URL")
}

#[tokio::test]
async fn redis_reserve_and_settle_are_idempotent() {
    let (ledger, _cleanup) = redis_ledger().await;
    reserve_and_settle_are_idempotent(&ledger).await;
    // One hash per scope: the counter and the request ids, with the seed's TTL.
    let key = ledger.budget_key("tenant:t:day:2025-03-09");
    let mut conn = raw().await;
    let fields: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut fields: Vec<String> = fields
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "cost=20",
            "req:run:12=s",
            "req:run:5=s",
            "req:run:9=s",
            "tokens=150"
        ]
    );
    let ttl: i64 = redis::cmd("TTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!((1..=DAY.as_secs() as i64).contains(&ttl), "TTL {ttl}");
}

#[tokio::test]
async fn redis_caps_refuse_what_does_not_fit() {
    let (ledger, _cleanup) = redis_ledger().await;
    caps_refuse_what_does_not_fit(&ledger).await;
}

#[tokio::test]
async fn redis_missing_then_seeded_then_granted() {
    let (ledger, _cleanup) = redis_ledger().await;
    missing_then_seeded_then_granted(&ledger).await;
    // Deleted (a flush, a restart without persistence): missing again, never zero.
    let scope = "tenant:t:day:2025-03-11";
    let _: () = redis::cmd("DEL")
        .arg(ledger.budget_key(scope))
        .query_async(&mut raw().await)
        .await
        .unwrap();
    assert_eq!(
        ledger
            .reserve(scope, "r2", Spend::ZERO, cost_cap(100))
            .await
            .unwrap(),
        Reservation::Missing
    );
    assert_eq!(
        ledger.settle(scope, "r1", spend(1, 1)).await.unwrap(),
        Settlement::Missing
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_concurrent_reservations_never_pass_the_cap() {
    let (ledger, _cleanup) = redis_ledger().await;
    concurrent_reservations_never_pass_the_cap(Arc::new(ledger)).await;
}

#[tokio::test]
async fn redis_counts_large_amounts_exactly() {
    let (ledger, _cleanup) = redis_ledger().await;
    let big = (1u64 << 52) + 1;
    ledger.seed("s", spend(big, big), DAY).await.unwrap();
    assert_eq!(
        ledger
            .reserve("s", "r", spend(3, 3), SpendCap::default())
            .await
            .unwrap(),
        Reservation::Granted {
            used: spend(big + 3, big + 3)
        }
    );
    assert_eq!(
        ledger.settle("s", "r", spend(1, 2)).await.unwrap(),
        Settlement::Settled {
            used: spend(big + 1, big + 2)
        }
    );
}
