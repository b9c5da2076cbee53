//! End to end: `glia dispatcher` and `glia worker` processes on the real
//! Postgres, RabbitMQ and Redis, driven over HTTP like a client would, with
//! faults injected: workers killed with SIGKILL mid-batch, Redis keys flushed,
//! jobs delivered twice or stale. RabbitMQ restarted mid-batch is in
//! `broker_restart.rs` (it boots a private node, which takes a while).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use glia_testkit::fleet::*;
use glia_proto::EventKind;

#[test]
fn fifty_mixed_runs_on_a_dispatcher_and_two_worker_processes() {
    let mut fleet = Fleet::new(&mixed_scripts());
    fleet.start_dispatcher();
    fleet.start_worker(30_000);
    fleet.start_worker(30_000);
    let results = batch(&fleet, 50, Instant::now() + Duration::from_secs(120));
    assert_eq!(results.len(), 50);
    let refunds = check_batch(&fleet, &results);
    assert_eq!(refunds.len(), 10, "no crash: every approved refund ran exactly once");
    // Conversational runs got their reply and were closed.
    let chat = results.iter().find(|(k, _, _)| k == "chat").unwrap();
    let events = check_log(&fleet, &chat.1);
    assert_eq!(events.iter().filter(|e| matches!(e.kind, EventKind::InputReceived { .. })).count(), 1);
}

#[test]
fn workers_killed_with_sigkill_mid_batch() {
    let mut fleet = Fleet::new(&mixed_scripts());
    // Refunds take a while, so kills land before, during and after tools.
    fleet.extra_env.push(("GLIA_DEMO_TOOL_DELAY_MS".into(), "150".into()));
    fleet.start_dispatcher();
    let lease_ms = 1_500;
    fleet.start_worker(lease_ms);
    fleet.start_worker(lease_ms);
    let fleet = Arc::new(Mutex::new(fleet));
    let stop = Arc::new(AtomicBool::new(false));
    let killer = {
        let (fleet, stop) = (fleet.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut kills = 0;
            let mut seed = 0x9e37_79b9_u32;
            while !stop.load(Ordering::SeqCst) && kills < 12 {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                std::thread::sleep(Duration::from_millis(150 + u64::from(seed % 400)));
                fleet.lock().unwrap().kill_and_replace_worker((seed % 2) as usize, lease_ms);
                kills += 1;
            }
            kills
        })
    };
    let api = fleet.lock().unwrap().api.clone();
    let results = batch(&api, 30, Instant::now() + Duration::from_secs(240));
    stop.store(true, Ordering::SeqCst);
    let kills = killer.join().unwrap();
    assert!(kills > 0);
    check_batch(&api, &results);
    drop(fleet);
}

#[test]
fn redis_keys_flushed_mid_batch() {
    let mut fleet = Fleet::new(&mixed_scripts());
    fleet.start_dispatcher();
    fleet.start_worker(30_000);
    fleet.start_worker(30_000);
    let name = fleet.name.clone();
    let redis = fleet.redis_url.clone();
    let flusher = std::thread::spawn(move || {
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(200));
            let _ = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("redis-cli -u '{redis}' --scan --pattern '{name}*' | xargs -r redis-cli -u '{redis}' del >/dev/null"))
                .status();
        }
    });
    let results = batch(&fleet, 25, Instant::now() + Duration::from_secs(120));
    flusher.join().unwrap();
    check_batch(&fleet, &results);
    // Budgets come from the log: every budget run paused exactly once at its limit.
    for (kind, run_id, _) in results.iter().filter(|(k, _, _)| k == "budget") {
        let events = check_log(&fleet, run_id);
        let warns = events.iter().filter(|e| matches!(e.kind, EventKind::BudgetWarn { .. })).count();
        assert_eq!(warns, 1, "{kind} run {run_id}");
    }
}

#[test]
fn duplicate_and_stale_jobs_change_nothing() {
    let mut fleet = Fleet::new(&mixed_scripts());
    fleet.start_dispatcher();
    fleet.start_worker(30_000);
    let results = batch(&fleet, 5, Instant::now() + Duration::from_secs(60));
    check_batch(&fleet, &results);
    let before: Vec<usize> = results.iter().map(|(_, id, _)| fleet.events(id).len()).collect();
    // Publish, straight to the broker, every run's first job (stale) and a
    // job for its current head, twice.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use glia_backends::JobQueue;
        let queue = glia_backends::rabbitmq::RabbitQueue::connect(&fleet.amqp_url, glia_backends::rabbitmq::QueueOptions::new(fleet.name.clone())).await.unwrap();
        for (_, id, run) in &results {
            let run_id = id.parse().unwrap();
            let head = run["head_seq"].as_u64().unwrap();
            for head_seq in [1, head, head] {
                queue.publish(&glia_backends::Job { run_id, head_seq }).await.unwrap();
            }
        }
    });
    // A fresh run, queued behind every stale job on the one worker's FIFO
    // queue (and re-queued at each of its steps): once it is done, the worker
    // has taken every stale job. No sleep stands in for that.
    let sentinel = submit_kind(&fleet, "plain", 99);
    drive(&fleet, &sentinel, Instant::now() + Duration::from_secs(60));
    let after: Vec<usize> = results.iter().map(|(_, id, _)| fleet.events(id).len()).collect();
    assert_eq!(before, after);
}
