//! End to end: `glia dispatcher` and `glia worker` processes on the real
//! Postgres, RabbitMQ and Redis, driven over HTTP like a client would, with
//! faults injected: workers killed with SIGKILL mid-batch, Redis keys flushed,
//! jobs delivered twice or stale. RabbitMQ restarted mid-batch is in
//! `broker_restart.rs` (it boots a private node, which takes a while).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use glia_proto::EventKind;
use glia_testkit::fleet::*;
use serde_json::{Value, json};

#[test]
fn fifty_mixed_runs_on_a_dispatcher_and_two_worker_processes() {
    let mut fleet = Fleet::new(&mixed_scripts());
    fleet.start_dispatcher();
    fleet.start_worker(30_000);
    fleet.start_worker(30_000);
    let results = batch(&fleet, 50, Instant::now() + Duration::from_secs(120));
    assert_eq!(results.len(), 50);
    let refunds = check_batch(&fleet, &results);
    assert_eq!(
        refunds.len(),
        10,
        "no crash: every approved refund ran exactly once"
    );
    // Conversational runs got their reply and were closed.
    let chat = results.iter().find(|(k, _, _)| k == "chat").unwrap();
    let events = check_log(&fleet, &chat.1);
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::InputReceived { .. }))
            .count(),
        1
    );
}

#[test]
fn workers_killed_with_sigkill_mid_batch() {
    let mut fleet = Fleet::new(&mixed_scripts());
    // Refunds take a while, so kills land before, during and after tools.
    fleet
        .extra_env
        .push(("GLIA_DEMO_TOOL_DELAY_MS".into(), "150".into()));
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
                fleet
                    .lock()
                    .unwrap()
                    .kill_and_replace_worker((seed % 2) as usize, lease_ms);
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

/// The keys under `prefix` on `redis` (`redis-cli --scan`); panics when
/// redis-cli fails.
fn redis_keys(redis: &str, prefix: &str) -> Vec<String> {
    let out = std::process::Command::new("redis-cli")
        .args(["-u", redis, "--scan", "--pattern", &format!("{prefix}:*")])
        .output()
        .expect("run redis-cli");
    assert!(out.status.success(), "redis-cli --scan: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Redis keys deleted under the fleet's prefix while a batch runs. The
/// workers have a tenant cap (far above what the batch spends), so every
/// model call reserves from the tenant's day counter in Redis
/// (`PREFIX:budget:…`): each flush waits until keys are there, deletes
/// them (checking redis-cli's status and that it deleted them), and the
/// workers must rebuild the counter from the log and carry on.
#[test]
fn redis_keys_flushed_mid_batch() {
    let mut fleet = Fleet::new(&mixed_scripts());
    let caps = fleet.dir.join("tenant-caps.json");
    std::fs::write(
        &caps,
        json!({"default": {"daily_tokens": 1_000_000_000u64}}).to_string(),
    )
    .unwrap();
    fleet.worker_args = vec!["--tenant-caps".into(), caps.to_str().unwrap().into()];
    fleet.start_dispatcher();
    fleet.start_worker(30_000);
    fleet.start_worker(30_000);
    let name = fleet.name.clone();
    let redis = fleet.redis_url.clone();
    let done = Arc::new(AtomicBool::new(false));
    let flusher = {
        let done = done.clone();
        std::thread::spawn(move || {
            // Keys deleted by each flush.
            let mut flushes: Vec<usize> = Vec::new();
            while flushes.len() < 5 && !done.load(Ordering::SeqCst) {
                let keys = redis_keys(&redis, &name);
                if keys.is_empty() {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                let out = std::process::Command::new("redis-cli")
                    .args(["-u", &redis, "DEL"])
                    .args(&keys)
                    .output()
                    .expect("run redis-cli");
                assert!(out.status.success(), "redis-cli DEL: {out:?}");
                let deleted: usize = String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("redis-cli DEL answered {out:?}"));
                assert!(deleted > 0, "DEL {keys:?} deleted nothing");
                flushes.push(deleted);
                std::thread::sleep(Duration::from_millis(200));
            }
            flushes
        })
    };
    let results = batch(&fleet, 25, Instant::now() + Duration::from_secs(120));
    done.store(true, Ordering::SeqCst);
    let flushes = flusher.join().unwrap();
    // Each flush after the first found keys again: the counter was rebuilt
    // from the log after the previous one.
    assert!(
        flushes.len() >= 2,
        "the batch ended after {} flush(es) of keys under {}:* ({flushes:?}): the fault was not injected mid-batch",
        flushes.len(),
        fleet.name
    );
    check_batch(&fleet, &results);
    // Budgets come from the log: every budget run paused exactly once at its limit.
    for (kind, run_id, _) in results.iter().filter(|(k, _, _)| k == "budget") {
        let events = check_log(&fleet, run_id);
        let warns = events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::BudgetWarn { .. }))
            .count();
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
    let before: Vec<usize> = results
        .iter()
        .map(|(_, id, _)| fleet.events(id).len())
        .collect();
    // Publish, straight to the broker, every run's first job (stale) and a
    // job for its current head, twice.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use glia_backends::JobQueue;
        let queue = glia_backends::rabbitmq::RabbitQueue::connect(
            &fleet.amqp_url,
            glia_backends::rabbitmq::QueueOptions::new(fleet.name.clone()),
        )
        .await
        .unwrap();
        for (_, id, run) in &results {
            let run_id = id.parse().unwrap();
            let head = run["head_seq"].as_u64().unwrap();
            for head_seq in [1, head, head] {
                queue
                    .publish(&glia_backends::Job::start(run_id, head_seq))
                    .await
                    .unwrap();
            }
        }
    });
    // A fresh run, queued behind every stale job on the one worker's FIFO
    // queue (and re-queued at each of its steps): once it is done, the worker
    // has taken every stale job. No sleep stands in for that.
    let sentinel = submit_kind(&fleet, "plain", 99);
    drive(&fleet, &sentinel, Instant::now() + Duration::from_secs(60));
    let after: Vec<usize> = results
        .iter()
        .map(|(_, id, _)| fleet.events(id).len())
        .collect();
    assert_eq!(before, after);
}

/// A session of the test's own on the fleet's database (blocking calls on a
/// runtime of its own).
struct Sql {
    rt: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
}

impl Sql {
    fn connect(url: &str) -> Sql {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(async {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .expect("connect");
            tokio::spawn(connection);
            client
        });
        Sql { rt, client }
    }

    fn rows(&self, sql: &str) -> Vec<tokio_postgres::Row> {
        self.rt
            .block_on(self.client.query(sql, &[]))
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    fn exec(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        self.rt.block_on(self.client.batch_execute(sql))
    }
}

/// A worker is killed while a group commit holding several runs' steps is in
/// flight (its `BEGIN` and the first steps' statements executed, the group
/// held up by the next statement): the group is all there or not at all (for
/// every run in it, each step whole), the runs finish on another worker, and
/// no sequence number is written twice.
///
/// How the group is held in flight: the test inserts, uncommitted, the next
/// events of a run (the target): a group's insert of that run's next event
/// waits for the test's transaction, and the runs ahead of it in the group
/// (a group writes its runs in id order) are then updated by the group's
/// open transaction, which the test sees (their visible rows' `xmax` is its
/// transaction id). The worker writes one group at a time
/// (`GLIA_GROUP_LANES=1`), so nothing else commits meanwhile.
///
/// How a group of several runs is made, whatever the machine's pace: the
/// first hold (on the run under way with the highest id) stops the worker's only lane,
/// so every other run's next step gathers behind it. While it holds, the
/// test holds a second run from that gathering (the highest id not in the
/// stopped group; its head cannot move while the lane is stopped), then
/// lets the first go: the gathered steps go out as one group and stop at the
/// second hold, after the steps of the runs with lower ids. A group caught
/// with fewer than two runs ahead is let go and the next one is tried.
#[test]
fn a_worker_killed_during_a_group_commit_leaves_each_step_whole() {
    let turns = 12;
    let mut script: Vec<Value> = (0..turns).map(|i| json!({"tool_calls": [{"name": "calculator", "input": {"op": "add", "a": i, "b": 1}}]})).collect();
    script.push(json!({"text": "done"}));
    let mut fleet = Fleet::new(&[("long", Value::Array(script))]);
    fleet
        .extra_env
        .push(("GLIA_DEMO_TOOL_DELAY_MS".into(), "20".into()));
    // One group at a time: while the held group waits, the other runs' steps wait for it.
    fleet
        .extra_env
        .push(("GLIA_GROUP_LANES".into(), "1".into()));
    fleet.start_dispatcher();
    let mut runs: Vec<String> = (0..8)
        .map(|i| fleet.submit(&format!("long #{i}"), json!({"model": "script:long"})))
        .collect();
    runs.sort();
    let sql = Sql::connect(&fleet.db_url);
    let blockers = [Sql::connect(&fleet.db_url), Sql::connect(&fleet.db_url)];
    let lease_ms = 1_500;
    fleet.start_worker(lease_ms);

    let deadline = Instant::now() + Duration::from_secs(90);
    let head_of = |run: &str| -> Option<i64> {
        let row = &sql.rows(&format!(
            "SELECT head_seq, status FROM runs WHERE id = '{run}'"
        ))[0];
        let status: String = row.get(1);
        (status != "done").then(|| row.get(0))
    };
    // Hold `run`'s next events on blocker `b`; false when its head moved meanwhile.
    let hold = |b: usize, run: &str, head: i64| -> bool {
        let sql = format!(
            "BEGIN; INSERT INTO events (run_id, seq, kind, at, at_nanos, payload) \
             SELECT '{run}', s, 'session.pause', now(), 0, '{{}}'::jsonb FROM generate_series({}, {}) AS s",
            head + 1,
            head + 40
        );
        if blockers[b].exec(&sql).is_err() {
            blockers[b].exec("ROLLBACK").unwrap();
            return false;
        }
        true
    };
    // The group commit waiting on the hold of `target` (not the transaction
    // `except`), within 2 s: its backend's pid and transaction id, and the
    // other runs its open transaction has updated.
    let waiting_group = |target: &str,
                         except: Option<&str>|
     -> Option<(i32, String, Vec<String>)> {
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            let waiting = sql.rows(
                "SELECT pid, backend_xid::text FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND query LIKE 'WITH fence%' AND backend_xid IS NOT NULL",
            );
            if let Some(row) = waiting
                .iter()
                .find(|r| Some(r.get::<_, String>(1).as_str()) != except)
            {
                let (pid, xid): (i32, String) = (row.get(0), row.get(1));
                let held = sql
                    .rows(&format!(
                        "SELECT id::text FROM runs WHERE id <> '{target}' AND xmax::text = '{xid}'"
                    ))
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                return Some((pid, xid, held));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    };
    let mut small = 0;
    let (pid, blocker, target, mut group): (i32, usize, String, Vec<String>) = 'hold: loop {
        let open: Vec<(String, i64)> = runs
            .iter()
            .filter_map(|r| head_of(r).map(|h| (r.clone(), h)))
            .collect();
        assert!(
            Instant::now() < deadline && open.len() >= 3,
            "no group commit of several runs was held in flight ({small} groups caught held fewer; {} runs left)",
            open.len()
        );
        // The highest id under way (a worker keeps a slot for resumes, so
        // one of the runs may not have started yet).
        let Some((first, head)) = open.iter().rev().find(|(_, h)| *h >= 3).cloned() else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        if !hold(0, &first, head) {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let Some((pid, xid, held)) = waiting_group(&first, None) else {
            blockers[0].exec("ROLLBACK").unwrap();
            continue;
        };
        if held.len() >= 2 {
            break 'hold (pid, 0, first, held);
        }
        // The lane is stopped: let the other runs' steps gather behind it
        // (each runs a 20 ms tool first), then hold the highest of them.
        std::thread::sleep(Duration::from_millis(150));
        let second = open
            .iter()
            .rev()
            .find(|(r, h)| *r != first && *h >= 3 && !held.contains(r))
            .cloned();
        let Some((second, _)) = second else {
            blockers[0].exec("ROLLBACK").unwrap();
            continue;
        };
        let held_second = head_of(&second).is_some_and(|h| hold(1, &second, h));
        blockers[0].exec("ROLLBACK").unwrap();
        if !held_second {
            continue;
        }
        match waiting_group(&second, Some(&xid)) {
            Some((pid, _, held)) if held.len() >= 2 => break 'hold (pid, 1, second, held),
            _ => {
                small += 1;
                blockers[1].exec("ROLLBACK").unwrap();
            }
        }
    };
    eprintln!("held in flight: {} runs ahead of the held one", group.len());
    group.push(target);
    let heads = |group: &[String]| -> Vec<(i64, i64)> {
        let ids = group
            .iter()
            .map(|r| format!("'{r}'"))
            .collect::<Vec<_>>()
            .join(",");
        // One statement, one snapshot of the whole group.
        let rows = sql.rows(&format!(
            "SELECT id::text, head_seq, (SELECT coalesce(max(seq), 0) FROM events e WHERE e.run_id = r.id) FROM runs r WHERE id IN ({ids})"
        ));
        group
            .iter()
            .map(|g| {
                rows.iter()
                    .find(|r| r.get::<_, String>(0) == *g)
                    .map(|r| (r.get(1), r.get(2)))
                    .unwrap()
            })
            .collect()
    };
    let before = heads(&group);
    let mut worker = fleet.workers.remove(0);
    worker.kill().expect("kill -9 the worker");
    worker.wait().unwrap();
    blockers[blocker].exec("ROLLBACK").unwrap();
    // The group's session ends: its statements and COMMIT were already sent,
    // so it either commits once the held row is free or is rolled back when
    // the server sees the client gone; either way all of the group, or none.
    while !sql
        .rows(&format!("SELECT 1 FROM pg_stat_activity WHERE pid = {pid}"))
        .is_empty()
    {
        assert!(
            Instant::now() < deadline + Duration::from_secs(30),
            "the killed worker's session never ended"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = heads(&group);
    for ((run, (head, max_seq)), (was, _)) in group.iter().zip(&after).zip(&before) {
        assert_eq!(
            head, max_seq,
            "run {run}: a step is all there or not at all"
        );
        assert!(head >= was, "run {run}");
    }
    let moved = group
        .iter()
        .zip(&after)
        .zip(&before)
        .filter(|((_, a), b)| a.0 > b.0)
        .count();
    assert!(
        moved == 0 || moved == group.len(),
        "the group committed for some runs only: before {before:?}, after {after:?}"
    );
    eprintln!(
        "the killed group {}",
        if moved == 0 {
            "was rolled back"
        } else {
            "committed"
        }
    );
    // Another worker finishes every run, each step once.
    fleet.start_worker(lease_ms);
    let deadline = Instant::now() + Duration::from_secs(120);
    while fleet.done_runs() < runs.len() {
        assert!(
            Instant::now() < deadline,
            "runs did not finish after the kill: {} of {}",
            fleet.done_runs(),
            runs.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for run in &runs {
        let events = check_log(&fleet, run);
        let results = events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::ToolResult { .. }))
            .count();
        assert_eq!(results, turns, "run {run}: one result per tool turn");
        assert!(
            matches!(
                events.last().unwrap().kind,
                EventKind::SessionComplete { .. }
            ),
            "run {run} completed"
        );
    }
    let duplicates: i64 = sql.rows(
        "SELECT count(*) FROM (SELECT run_id, seq FROM events GROUP BY 1, 2 HAVING count(*) > 1) d",
    )[0]
    .get(0);
    assert_eq!(duplicates, 0);
}
