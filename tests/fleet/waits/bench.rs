//! A benchmark, not a test: N runs (default 10,000; `BENCH_WAITS`) sleeping
//! at once on the fleet, and what they hold while they sleep: the worker's
//! RSS, the Postgres connections of the fleet's database, the worker's
//! leases (its slots in use). With `BENCH_WAITS_WAKE` set they then wake
//! (after `BENCH_WAITS_SLEEP_SECS`, default 900) and complete. Prints JSON.
//!
//! `cargo test -p glia-e2e --test fleet -- --ignored bench_waits --nocapture`

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use glia_testkit::fleet::{Fleet, psql};
use serde_json::json;

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn count(fleet: &Fleet, sql: &str) -> u64 {
    psql(&fleet.db_url, sql).trim().parse().unwrap_or(0)
}

#[test]
#[ignore = "benchmark: cargo test -p glia-e2e --test fleet -- --ignored bench_waits --nocapture"]
fn bench_waits() {
    let n: usize = std::env::var("BENCH_WAITS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let sleep_secs: u64 = std::env::var("BENCH_WAITS_SLEEP_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(900);
    let mut fleet = Fleet::new(&[(
        "sleepy",
        json!([{"tool_calls": [{"name": "sleep", "input": {"seconds": sleep_secs}}]}, {"text": "awake"}]),
    )]);
    fleet.start_dispatcher();
    fleet.start_worker(10_000);
    let worker = fleet.workers[0].id();
    let rss_idle = rss_kib(worker);
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|s| {
        for _ in 0..8 {
            let next = next.clone();
            let api = &*fleet;
            s.spawn(move || {
                while next.fetch_add(1, Ordering::Relaxed) < n {
                    api.submit(
                        "sleep",
                        json!({"model": "script:sleepy", "builtin_tools": ["sleep"]}),
                    );
                }
            });
        }
    });
    let submitted = started.elapsed();
    let parked_sql = "SELECT count(*) FROM runs WHERE status = 'parked' AND pull_point->>'kind' = 'awaiting_timer'";
    let deadline = Instant::now() + Duration::from_secs(3600);
    let mut rss_max = rss_idle;
    while (count(&fleet, parked_sql) as usize) < n {
        rss_max = rss_max.max(rss_kib(worker));
        assert!(Instant::now() < deadline, "not all parked");
        std::thread::sleep(Duration::from_secs(1));
    }
    let all_parked = started.elapsed();
    // While they sleep.
    std::thread::sleep(Duration::from_secs(5));
    let db = fleet.name.clone();
    let connections = count(
        &fleet,
        &format!("SELECT count(*) FROM pg_stat_activity WHERE datname = '{db}'"),
    );
    let active = count(
        &fleet,
        &format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = '{db}' AND state = 'active'"
        ),
    );
    let leases = fleet.live_leases_of("w0");
    let rss_sleeping = rss_kib(worker);
    // With BENCH_WAITS_WAKE set, wait until every run woke and completed
    // (at least `sleep_secs` after it parked).
    let all_done = std::env::var_os("BENCH_WAITS_WAKE").map(|_| {
        let done_sql = "SELECT count(*) FROM runs WHERE status = 'done'";
        while (count(&fleet, done_sql) as usize) < n {
            assert!(Instant::now() < deadline, "not all woke");
            std::thread::sleep(Duration::from_secs(1));
        }
        started.elapsed().as_secs_f64()
    });
    println!(
        "{}",
        json!({
            "runs": n,
            "sleep_secs": sleep_secs,
            "submit_secs": submitted.as_secs_f64(),
            "all_parked_secs": all_parked.as_secs_f64(),
            "while_sleeping": {
                "worker_leases_held": leases,
                "postgres_connections_of_the_fleet_db": connections,
                "postgres_connections_active": active,
                "worker_rss_kib": rss_sleeping,
            },
            "worker_rss_kib_idle": rss_idle,
            "worker_rss_kib_max_while_parking": rss_max,
            "all_done_secs": all_done,
        })
    );
    assert_eq!(leases, 0, "no worker slot is held by a sleeping run");
}
