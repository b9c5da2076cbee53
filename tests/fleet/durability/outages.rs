//! Clients and processes wait out outages instead of dying (issue 11):
//!
//! - the dispatcher is killed (`kill -9`) and restarted twice while
//!   `glia batch --server` drives a batch, and while `glia submit` streams a
//!   run's events: both finish and report correctly (no run lost or created
//!   twice, every event printed once, exit code 0);
//! - past `--max-outage-secs` a batch fails naming the server, the last
//!   error and the runs still unfinished;
//! - a dispatcher and a worker started while RabbitMQ (a private node) is
//!   down stay up, answer `/readyz` 503 naming the broker, become ready once
//!   it starts, and a run submitted then completes; when the broker goes
//!   away later, both report not ready until it is back;
//! - the same when Postgres (the machine's, reachable only once the test
//!   opens a port forwarding to it) and Redis (a private server started
//!   late) are down at start.
//!
//! Real processes on the machine's Postgres, RabbitMQ and Redis (the broker
//! test on a private node of its own), each test isolated by [`Fleet`].

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use glia_proto::{Event, EventKind, Outcome};
use glia_testkit::fleet::*;
use glia_testkit::isolation::{PrivateRabbit, PrivateRedis};
use serde_json::{Value, json};

/// Wait for `child` to exit (panics after `timeout`, killing it).
fn wait_exit(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the client did not finish within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Wait until `cond` holds (panics with `what` after `timeout`).
fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "{what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs of the fleet's database (each test has its own), from the API.
fn all_runs(api: &Api) -> Vec<Value> {
    let (status, body) = api.get("/v1/runs?limit=1000");
    assert_eq!(status, 200, "{body}");
    body["runs"].as_array().cloned().unwrap_or_default()
}

/// `glia batch --server … --json --limit N ARGS…`, stdout and stderr to files
/// in the fleet's directory (a pipe nobody reads could block the client).
fn spawn_batch(fleet: &Fleet, n: usize, args: &[&str]) -> (Child, PathBuf, PathBuf) {
    let (out, err) = (fleet.dir.join("batch.out"), fleet.dir.join("batch.err"));
    let child = Command::new(glia_testkit::bin::glia_bin())
        .args([
            "batch",
            recording_dir()
                .join("gpt-4o-airline.json")
                .to_str()
                .unwrap(),
            "--json",
            "--server",
            &fleet.server,
            "--limit",
            &n.to_string(),
        ])
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    (child, out, err)
}

#[test]
fn batch_carries_on_across_two_dispatcher_restarts() {
    let mut fleet = replay_fleet();
    let n = 60;
    let (mut child, out, err) = spawn_batch(&fleet, n, &[]);
    let mut done_at_kill = Vec::new();
    for _ in 0..2 {
        // Progress since the last restart: the batch drives runs again.
        let before = done_at_kill.last().copied().unwrap_or(0);
        wait_until("the batch makes progress", Duration::from_secs(120), || {
            fleet.done_runs() >= before + 3
        });
        let done = fleet.done_runs();
        assert!(
            done < n,
            "the batch ended before the restart ({done} of {n} done)"
        );
        done_at_kill.push(done);
        fleet.restart_dispatcher();
    }
    let status = wait_exit(&mut child, Duration::from_secs(300));
    let stderr = std::fs::read_to_string(&err).unwrap();
    assert!(status.success(), "glia batch failed ({status}):\n{stderr}");
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap())
        .unwrap_or_else(|e| panic!("summary is not JSON ({e}):\n{stderr}"));
    assert_eq!(
        (
            summary["runs"].as_u64(),
            summary["reproduced"].as_u64(),
            summary["diverged"].as_u64(),
            summary["failed"].as_u64()
        ),
        (Some(n as u64), Some(n as u64), Some(0), Some(0)),
        "{summary}"
    );
    // The client saw the outages and waited.
    assert!(
        stderr.contains("dispatcher unavailable"),
        "no retry was logged:\n{stderr}"
    );
    // No run was lost or submitted twice: the fleet holds exactly the batch's runs, all done.
    let runs = all_runs(&fleet);
    assert_eq!(runs.len(), n, "runs in the fleet");
    assert!(runs.iter().all(|r| r["status"] == "done"), "{runs:?}");
    for r in &runs {
        check_log(&fleet, r["run_id"].as_str().unwrap());
    }
    eprintln!("batch of {n} finished across restarts at {done_at_kill:?} runs done");
}

#[test]
fn submit_stream_resumes_across_two_dispatcher_restarts() {
    let script = json!([{"tool_calls": [{"name": "refund_order", "input": {"order_id": "A1"}}]}, {"text": "Refunded."}]);
    let mut fleet = Fleet::new(&[("slow_refund", script)]);
    // The refund takes a while, so the second restart happens while the run goes on.
    fleet
        .extra_env
        .push(("GLIA_DEMO_TOOL_DELAY_MS".into(), "1500".into()));
    fleet.start_dispatcher();
    let config = fleet.dir.join("config.json");
    std::fs::write(&config, json!({"model": "script:slow_refund"}).to_string()).unwrap();
    let err = fleet.dir.join("submit.err");
    let mut child = fleet
        .command(&[
            "submit",
            "--json",
            "--server",
            &fleet.server.clone(),
            "--config",
            config.to_str().unwrap(),
            "Refund order A1",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let (tx, lines) = mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let _ = tx.send(line.unwrap());
        }
    });
    let mut printed: Vec<String> = Vec::new();
    let until = |printed: &mut Vec<String>, kind: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !printed
            .iter()
            .any(|l| l.contains(&format!("\"type\":\"{kind}\"")))
        {
            let left = deadline.saturating_duration_since(Instant::now());
            printed.push(lines.recv_timeout(left).unwrap_or_else(|_| {
                panic!("glia submit printed no {kind} within 60 s: {printed:?}")
            }));
        }
    };
    let streaming = |fleet: &Fleet| fleet.metric("glia_dispatcher_sse_streams") >= 1.0;

    // No worker yet: the run waits at its start while the dispatcher restarts.
    until(&mut printed, "session.start");
    wait_until("the stream is open", Duration::from_secs(30), || {
        streaming(&fleet)
    });
    fleet.restart_dispatcher();
    wait_until(
        "glia submit streams from the new dispatcher",
        Duration::from_secs(60),
        || streaming(&fleet),
    );

    // Then the run moves, and the dispatcher dies while its tool runs.
    fleet.start_worker(10_000);
    until(&mut printed, "tool.call");
    fleet.restart_dispatcher();

    let status = wait_exit(&mut child, Duration::from_secs(120));
    reader.join().unwrap();
    printed.extend(lines.try_iter());
    let stderr = std::fs::read_to_string(&err).unwrap();
    assert!(status.success(), "glia submit failed ({status}):\n{stderr}");
    assert!(
        stderr.contains("resuming") || stderr.contains("dispatcher unavailable"),
        "the client saw no outage:\n{stderr}"
    );

    // Every event printed once, in order, and exactly the run's log.
    let events: Vec<Event> = printed
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let run_id = events[0].run_id.to_string();
    let log = check_log(&fleet, &run_id);
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (1..=log.len() as u64).collect::<Vec<_>>(),
        "printed seqs"
    );
    assert_eq!(printed.len(), log.len());
    assert!(
        matches!(
            &events.last().unwrap().kind,
            EventKind::SessionComplete {
                outcome: Outcome::Succeeded { .. }
            }
        ),
        "{:?}",
        events.last()
    );
    // One run (the retried submission did not create another), one refund.
    assert_eq!(all_runs(&fleet).len(), 1);
    assert_eq!(fleet.effects().len(), 1, "{:?}", fleet.effects());
}

#[test]
fn batch_past_the_outage_bound_names_the_server_and_the_unfinished_runs() {
    let mut fleet = replay_fleet();
    let n = 30;
    let (mut child, _, err) = spawn_batch(&fleet, n, &["--max-outage-secs", "2"]);
    wait_until("the batch makes progress", Duration::from_secs(120), || {
        fleet.done_runs() >= 1
    });
    let mut dispatcher = fleet.dispatcher.take().unwrap();
    dispatcher.kill().unwrap();
    dispatcher.wait().unwrap();
    let killed = Instant::now();
    let status = wait_exit(&mut child, Duration::from_secs(60));
    let stderr = std::fs::read_to_string(&err).unwrap();
    assert!(
        !status.success(),
        "the batch cannot finish without a dispatcher:\n{stderr}"
    );
    assert!(
        killed.elapsed() < Duration::from_secs(40),
        "gave up {:?} after the kill",
        killed.elapsed()
    );
    assert!(
        stderr.contains(&format!(
            "the dispatcher at {} did not answer for",
            fleet.server
        )),
        "{stderr}"
    );
    assert!(stderr.contains("last error:"), "{stderr}");
    assert!(stderr.contains("run(s) still unfinished"), "{stderr}");

    // The runs it names are the batch's unfinished ones (the log says so).
    fleet.start_dispatcher();
    let runs = all_runs(&fleet);
    let open: Vec<&str> = runs
        .iter()
        .filter(|r| r["status"] != "done")
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    let named: Vec<&Value> = runs
        .iter()
        .filter(|r| stderr.contains(r["run_id"].as_str().unwrap()))
        .collect();
    assert!(!named.is_empty(), "{stderr}");
    for id in open {
        assert!(
            stderr.contains(id),
            "unfinished run {id} is not named:\n{stderr}"
        );
    }
}

#[test]
fn dispatcher_and_worker_started_while_the_broker_is_down_become_ready() {
    let Some(broker) = glia_testkit::require(
        PrivateRabbit::new(),
        "the rabbitmq-server script",
        "apt-get install rabbitmq-server; scripts/test does",
    ) else {
        return;
    };
    // Declared before the fleet, so dropped after its processes are killed.
    let mut broker = broker;
    let mut fleet = Fleet::new(&mixed_scripts());
    fleet.amqp_url = broker.url();
    let (dispatcher_ready, worker_ready) = start_not_ready(&mut fleet, &["job_queue"]);
    // The API refuses work meanwhile with a retryable answer.
    let (status, body) = fleet.post("/v1/runs", json!({"goal": "too early"}));
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("not_ready")),
        "{body}"
    );
    assert_alive(&mut fleet);

    broker.start().expect("spawn rabbitmq-server");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(broker.wait_ready(Duration::from_secs(120)));
    let ready = wait_status(&dispatcher_ready, 200, Duration::from_secs(60));
    assert_eq!(ready["checks"]["job_queue"], "ok", "{ready}");
    wait_status(&worker_ready, 200, Duration::from_secs(60));

    let run_id = submit_kind(&fleet, "plain", 0);
    let run = drive(&fleet, &run_id, Instant::now() + Duration::from_secs(60));
    assert_eq!(run["outcome"]["kind"], "succeeded", "{run}");
    check_log(&fleet, &run_id);

    // Readiness follows the broker later too: not ready while it is gone,
    // ready again once it is back, and the same processes carry on.
    rt.block_on(broker.stop());
    for url in [&dispatcher_ready, &worker_ready] {
        let body = wait_status(url, 503, Duration::from_secs(60));
        assert_ne!(body["checks"]["job_queue"], "ok", "{body}");
        assert_eq!(body["checks"]["event_log"], "ok", "{body}");
    }
    broker.start().expect("spawn rabbitmq-server again");
    rt.block_on(broker.wait_ready(Duration::from_secs(120)));
    wait_status(&dispatcher_ready, 200, Duration::from_secs(60));
    wait_status(&worker_ready, 200, Duration::from_secs(60));
    let run_id = submit_kind(&fleet, "plain", 1);
    let run = drive(&fleet, &run_id, Instant::now() + Duration::from_secs(60));
    assert_eq!(run["outcome"]["kind"], "succeeded", "{run}");
    assert_alive(&mut fleet);
    drop(fleet);
}

/// Forward connections on 127.0.0.1:`port` to `target`, from now on: the
/// machine's Postgres, reachable at an address that was dead until now (a
/// server that comes up). Runs until the test process ends.
fn forward(port: u16, target: (String, u16)) {
    use std::net::{Shutdown, TcpListener, TcpStream};
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind the forwarding port");
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { continue };
            let Ok(server) = TcpStream::connect((target.0.as_str(), target.1)) else {
                continue;
            };
            for (mut from, mut to) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server, client),
            ] {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(Shutdown::Write);
                });
            }
        }
    });
}

/// Start the fleet's dispatcher and one worker (with `--metrics-listen`)
/// while the services in `failing` are down; wait until both are live
/// (`/healthz` 200) and report each of `failing` on `/readyz` (503).
/// Returns the dispatcher's and the worker's `/readyz` URLs.
fn start_not_ready(fleet: &mut Fleet, failing: &[&str]) -> (String, String) {
    let metrics = format!("127.0.0.1:{}", free_port());
    fleet.worker_args = vec!["--metrics-listen".into(), metrics.clone()];
    fleet.spawn_dispatcher();
    fleet.start_worker(10_000);
    let (dispatcher_ready, worker_ready) = (
        format!("{}/readyz", fleet.server),
        format!("http://{metrics}/readyz"),
    );
    for (who, url) in [("dispatcher", &dispatcher_ready), ("worker", &worker_ready)] {
        wait_status(
            &url.replace("/readyz", "/healthz"),
            200,
            Duration::from_secs(60),
        );
        wait_not_ready(who, url, failing);
    }
    (dispatcher_ready, worker_ready)
}

/// Neither the dispatcher nor the first worker has exited.
fn assert_alive(fleet: &mut Fleet) {
    assert!(
        fleet
            .dispatcher
            .as_mut()
            .unwrap()
            .try_wait()
            .unwrap()
            .is_none(),
        "the dispatcher exited"
    );
    assert!(
        fleet.workers[0].try_wait().unwrap().is_none(),
        "the worker exited"
    );
}

/// Poll `url` (a `/readyz`) until it answers 503 with every check in
/// `failing` reporting a failed connection attempt; panics otherwise.
fn wait_not_ready(who: &str, url: &str, failing: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = http("GET", url, None).unwrap_or((0, Value::Null));
        if status != 0 {
            assert_eq!(status, 503, "{who} ready too early: {body}");
            assert_eq!(body["error"]["code"], "not_ready", "{body}");
            if failing.iter().all(|k| {
                body["checks"][k]
                    .as_str()
                    .is_some_and(|s| s.starts_with("connecting: "))
            }) {
                let message = body["error"]["message"].as_str().unwrap();
                assert!(failing.iter().all(|k| message.contains(k)), "{message}");
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{who} never reported {failing:?} failing: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn dispatcher_and_worker_wait_for_postgres_and_redis_at_start() {
    let mut redis = PrivateRedis::new();
    let mut fleet = Fleet::new(&mixed_scripts());
    // Postgres at a port nobody listens on yet; Redis not started yet.
    let admin: tokio_postgres::Config = admin_url().parse().expect("GLIA_DATABASE_URL parses");
    let host = match &admin.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        other => panic!("this test needs Postgres over TCP, not {other:?}"),
    };
    let target = (host, admin.get_ports().first().copied().unwrap_or(5432));
    let pg_port = free_port();
    fleet.db_url = format!(
        "postgres://{}@127.0.0.1:{pg_port}/{}",
        admin.get_user().unwrap_or("postgres"),
        fleet.name
    );
    fleet.redis_url = redis.url();
    let (dispatcher_ready, worker_ready) = start_not_ready(&mut fleet, &["event_log", "ledger"]);
    assert_alive(&mut fleet);

    forward(pg_port, target);
    if glia_testkit::require_ok(
        redis.start(),
        "redis-server (for the rest of this test)",
        "apt-get install redis-server; scripts/test does",
    )
    .is_none()
    {
        return;
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(redis.wait_ready(Duration::from_secs(30)));
    wait_status(&dispatcher_ready, 200, Duration::from_secs(60));
    wait_status(&worker_ready, 200, Duration::from_secs(60));

    let run_id = submit_kind(&fleet, "plain", 0);
    let run = drive(&fleet, &run_id, Instant::now() + Duration::from_secs(60));
    assert_eq!(run["outcome"]["kind"], "succeeded", "{run}");
    check_log(&fleet, &run_id);
    drop(fleet);
}
