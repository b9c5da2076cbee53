//! End to end, RabbitMQ restarted mid-batch: a dispatcher and two worker
//! processes on a private RabbitMQ node ([`PrivateRabbit`]: own node name,
//! ports and data directory; the machine's broker is never touched), with
//! the machine's Postgres and Redis. While a mixed batch is being driven the
//! node is stopped cleanly, kept down for a few seconds (runs are admitted and
//! payloads posted meanwhile, so publishing jobs fails) and started again on
//! the same data. Every run must then complete with the same checks as the
//! other fault tests, on the same worker processes.
//!
//! The node boots twice (10–20 s the first time), so this lives apart from
//! `fleet_e2e.rs`. `GLIA_TEST_KEEP_BROKER=1` leaves the node's directory
//! behind for inspection.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use glia_testkit::fleet::*;
use glia_testkit::isolation::PrivateRabbit;

/// How long the node stays down (a fault duration, not an assertion).
const DOWN_FOR: Duration = Duration::from_secs(3);

/// What the restarter saw.
struct Outage {
    /// Runs done when the node was down.
    done_while_down: usize,
    /// Runs submitted while the node was down: `(kind, run_id)`.
    submitted_while_down: Vec<(String, String)>,
    /// `relay_errors_total` just before the stop.
    relay_errors_before: f64,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Wait until the batch is under way (a run is done), stop the node, keep it
/// down while admitting a few runs, start it again and wait until it serves.
fn restart_mid_batch(api: &Api, broker: &Mutex<PrivateRabbit>) -> Outage {
    let rt = runtime();
    let deadline = Instant::now() + Duration::from_secs(60);
    while api.done_runs() == 0 {
        assert!(
            Instant::now() < deadline,
            "no run finished within 60s of the batch starting"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let relay_errors_before = api.metric("glia_dispatcher_relay_errors_total");
    let mut broker = broker.lock().unwrap();
    let stopping = Instant::now();
    rt.block_on(broker.stop());
    let done_while_down = api.done_runs();
    eprintln!(
        "private node stopped in {:?} with {done_while_down} runs done",
        stopping.elapsed()
    );

    // Admission needs only Postgres: these get 201 and their jobs wait in
    // the outbox until the broker is back.
    let submitted_while_down: Vec<(String, String)> = KINDS
        .iter()
        .enumerate()
        .map(|(i, kind)| (kind.to_string(), submit_kind(api, kind, 1000 + i)))
        .collect();
    std::thread::sleep(DOWN_FOR);

    let starting = Instant::now();
    broker.start().expect("spawn rabbitmq-server again");
    rt.block_on(broker.wait_ready(Duration::from_secs(120)));
    eprintln!(
        "private node serving again {:?} after the start, {:?} after the stop",
        starting.elapsed(),
        stopping.elapsed()
    );
    Outage {
        done_while_down,
        submitted_while_down,
        relay_errors_before,
    }
}

#[test]
fn rabbitmq_restarted_mid_batch() {
    let started = Instant::now();
    let Some(broker) = glia_testkit::require(
        PrivateRabbit::new(),
        "the rabbitmq-server script",
        "apt-get install rabbitmq-server; scripts/test does",
    ) else {
        return;
    };
    // Declared before the fleet, so dropped after its processes are killed.
    let broker = Mutex::new(broker);
    {
        let mut b = broker.lock().unwrap();
        b.start().expect("spawn rabbitmq-server");
        runtime().block_on(b.wait_ready(Duration::from_secs(120)));
        eprintln!(
            "private node {} on port {} ready after {:?}",
            b.node(),
            b.port(),
            started.elapsed()
        );
    }

    let mut fleet = Fleet::new(&mixed_scripts());
    fleet.amqp_url = broker.lock().unwrap().url();
    fleet.start_dispatcher();
    fleet.start_worker(10_000);
    fleet.start_worker(10_000);

    let n = 40;
    let deadline = Instant::now() + Duration::from_secs(180);
    let (results, outage) = std::thread::scope(|s| {
        let restarter = s.spawn(|| restart_mid_batch(&fleet.api, &broker));
        let results = batch(&fleet, n, deadline);
        let outage = restarter
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (results, outage)
    });
    assert!(
        outage.done_while_down < n,
        "the node was stopped mid-batch ({} of {n} done)",
        outage.done_while_down
    );

    let late = drive_all(&fleet, &outage.submitted_while_down, deadline);
    let all: Vec<_> = results.into_iter().chain(late).collect();
    assert_eq!(all.len(), n + KINDS.len());
    let refunds = check_batch(&fleet, &all);
    let approval_runs = all.iter().filter(|(k, _, _)| k == "approval").count();
    assert_eq!(
        refunds.len(),
        approval_runs,
        "no worker crashed: every approved refund ran exactly once"
    );

    // Jobs were published while the node was down, and failed: the relay
    // retried them after the restart.
    let relay_errors = fleet.metric("glia_dispatcher_relay_errors_total");
    assert!(
        relay_errors > outage.relay_errors_before,
        "relay errors {} → {relay_errors}",
        outage.relay_errors_before
    );
    // The same processes carried on: none died, and both workers consume
    // from the restarted node again.
    for (i, w) in fleet.workers.iter_mut().enumerate() {
        assert!(w.try_wait().unwrap().is_none(), "worker {i} exited");
    }
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
    let rt = runtime();
    let b = broker.lock().unwrap();
    let consumers_deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stats = rt.block_on(b.queue_stats(&fleet.name));
        if stats.as_ref().is_ok_and(|s| s.consumers == 2) {
            break;
        }
        assert!(
            Instant::now() < consumers_deadline,
            "both workers consume again: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(b);
    eprintln!(
        "{} runs completed across the restart ({} done while the node was down, {} submitted then); relay errors {relay_errors}; total {:?}",
        all.len(),
        outage.done_while_down,
        outage.submitted_while_down.len(),
        started.elapsed()
    );
    drop(fleet);
}
