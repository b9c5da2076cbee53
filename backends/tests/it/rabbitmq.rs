//! The RabbitMQ job queue against a real broker: `GLIA_AMQP_URL` (default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`). Each test uses its own queue
//! (`glia-test-<name>-<uuid>`), deleted with its dead-letter queue and
//! exchange at the end, pass or fail.
//!
//! `consumer_resumes_after_broker_restart` starts a private RabbitMQ node of
//! its own ([`glia_backends::testkit::PrivateRabbit`]: own node name, AMQP
//! and distribution ports, data and log directories under a temporary
//! directory), stops and restarts it, and never touches the broker at
//! `GLIA_AMQP_URL`. It stops the node cleanly
//! (SIGTERM to its start script); `GLIA_TEST_BROKER_SIGKILL_AFTER=<secs>`
//! makes it wait that long and SIGKILL the node instead (with less than
//! about 180 s, RabbitMQ 3.10 may lose the freshly declared queue: see the
//! adapter's documentation). `GLIA_TEST_KEEP_BROKER=1` leaves the node and
//! its directory behind for inspection.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use glia_backends::rabbitmq::{QueueOptions, RabbitQueue};
use glia_backends::testkit::{PrivateRabbit, free_port};
use glia_backends::{Delivery, Job, JobQueue, QueueError};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use uuid::Uuid;

fn url() -> String {
    std::env::var("GLIA_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

fn options(test: &str) -> QueueOptions {
    let mut o = QueueOptions::new(format!("glia-test-{test}-{}", Uuid::now_v7()));
    o.reconnect_min = Duration::from_millis(50);
    o.reconnect_max = Duration::from_millis(500);
    o.connection_name = format!("glia test {test}");
    o
}

fn job(head_seq: u64) -> Job {
    Job::start(Uuid::now_v7(), head_seq)
}

/// Await `fut`, failing the test if it takes longer than `secs` (a bound on
/// a hang, not a timing assertion).
async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {secs}s"))
}

/// Poll `check` every 50 ms until it holds, failing after `secs`.
async fn eventually<F, Fut>(secs: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within {secs}s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Deletes a test's queue, dead-letter queue and exchange when dropped, even
/// when the test panicked (on a thread of its own with its own runtime).
struct Cleanup {
    url: String,
    opts: QueueOptions,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (url, opts) = (self.url.clone(), self.opts.clone());
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                match RabbitQueue::connect(&url, opts.clone()).await {
                    Ok(q) => {
                        if let Err(e) = q.delete_topology().await {
                            eprintln!("cleanup of {}: {e}", opts.queue);
                        }
                        q.close().await;
                    }
                    Err(e) => eprintln!("cleanup of {}: {e}", opts.queue),
                }
            })
        });
        let _ = done.join();
    }
}

async fn connect(opts: &QueueOptions) -> (RabbitQueue, Cleanup) {
    let q = RabbitQueue::connect(&url(), opts.clone())
        .await
        .expect("connect to RabbitMQ at GLIA_AMQP_URL");
    (
        q,
        Cleanup {
            url: url(),
            opts: opts.clone(),
        },
    )
}

async fn next(q: &RabbitQueue) -> Delivery {
    within(30, "next", q.next()).await.expect("next")
}

#[tokio::test]
async fn publish_consume_ack_round_trip() {
    let opts = options("roundtrip");
    let (q, _cleanup) = connect(&opts).await;
    let jobs: Vec<Job> = (1..=3).map(job).collect();
    for j in &jobs {
        q.publish(j).await.expect("publish");
    }
    assert_eq!(
        q.depth().await.unwrap(),
        3,
        "three confirmed jobs wait in the queue"
    );
    let stats = q.stats().await.unwrap();
    assert_eq!(
        (stats.ready, stats.dead_lettered),
        (3, Some(0)),
        "{stats:?}"
    );
    for j in &jobs {
        let d = next(&q).await;
        assert_eq!(&d.job, j, "one consumer gets the jobs in publish order");
        let lag = chrono::Utc::now()
            - d.enqueued_at
                .expect("the publish time travels with the job");
        assert!(lag.num_seconds().abs() < 60, "lag {lag}");
        assert!(!d.redelivered);
        d.acker.ack().await.expect("ack");
        d.acker.ack().await.expect("a second ack is a no-op");
    }
    q.close().await;
    assert_eq!(q.next().await.err(), Some(QueueError::Closed));
    assert_eq!(q.publish(&job(9)).await, Err(QueueError::Closed));

    let (q2, _q2_cleanup) = connect(&opts).await;
    assert_eq!(q2.depth().await.unwrap(), 0, "acked jobs are gone");
    assert_eq!(q2.dead_letter_depth().await.unwrap(), 0);
    q2.close().await;
}

/// The queue contract: a resume published after many starts is handed out
/// first (its own quorum queue and consumer), `next_resume` leaves starts
/// queued, a requeued resume stays a resume.
#[tokio::test]
async fn resumes_before_starts() {
    let opts = options("resumes");
    let (q, _cleanup) = connect(&opts).await;
    glia_backends::conformance::resumes_before_starts(&q, 50).await;
    q.close().await;
}

#[tokio::test]
async fn quorum_queue_and_persistent_messages() {
    let opts = options("declared");
    let (q, _cleanup) = connect(&opts).await;
    let j = job(7);
    q.publish(&j).await.unwrap();

    let conn = Connection::connect(&url(), ConnectionProperties::default())
        .await
        .unwrap();
    // The broker holds exactly these arguments: redeclaring with them is
    // accepted, and with `x-queue-type: classic` instead is refused.
    let args = |queue_type: &str| {
        let mut t = FieldTable::default();
        t.insert(
            "x-queue-type".into(),
            AMQPValue::LongString(queue_type.into()),
        );
        t.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongInt(opts.delivery_limit as i32),
        );
        t.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(opts.dead_letter_exchange().as_str().into()),
        );
        t.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(opts.queue.as_str().into()),
        );
        t
    };
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(opts.queue.as_str().into(), durable, args("quorum"))
        .await
        .expect("same arguments: a durable quorum queue");
    let classic = ch
        .queue_declare(opts.queue.as_str().into(), durable, args("classic"))
        .await;
    let err = classic
        .expect_err("a classic redeclare of a quorum queue must fail")
        .to_string();
    assert!(
        err.contains("PRECONDITION_FAILED") && err.contains("x-queue-type"),
        "{err}"
    );
    // The queue of resumes has the same arguments (same dead-lettering).
    let ch = conn.create_channel().await.unwrap();
    let resume_queue = opts.resume_queue();
    ch.queue_declare(resume_queue.as_str().into(), durable, args("quorum"))
        .await
        .expect("the resume queue: the same arguments");
    let classic = ch
        .queue_declare(resume_queue.as_str().into(), durable, args("classic"))
        .await;
    assert!(classic.is_err(), "the resume queue is a quorum queue");
    // The dead-letter queue and exchange exist.
    let ch = conn.create_channel().await.unwrap();
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    ch.queue_declare(
        opts.dead_letter_queue().as_str().into(),
        passive,
        FieldTable::default(),
    )
    .await
    .expect("dlq declared");
    // The message on the wire: persistent JSON.
    let got = ch
        .basic_get(
            opts.queue.as_str().into(),
            BasicGetOptions { no_ack: false },
        )
        .await
        .unwrap()
        .expect("a message");
    assert_eq!(
        got.delivery.properties.delivery_mode(),
        &Some(2),
        "persistent"
    );
    assert_eq!(
        got.delivery
            .properties
            .content_type()
            .as_ref()
            .map(|s| s.as_str()),
        Some("application/json")
    );
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&got.delivery.data).unwrap(),
        serde_json::json!({"run_id": j.run_id, "head_seq": 7})
    );
    got.delivery.acker.ack(Default::default()).await.unwrap();
    conn.close(200, "bye".into()).await.unwrap();

    // A wrong queue definition is a clear connect error.
    let mut other = opts.clone();
    other.delivery_limit += 1;
    let err = RabbitQueue::connect(&url(), other)
        .await
        .err()
        .expect("declaring with another delivery limit fails");
    assert!(
        matches!(&err, QueueError::Unavailable(m) if m.contains("x-delivery-limit")),
        "{err}"
    );
    q.close().await;
}

#[tokio::test]
async fn nack_without_requeue_dead_letters() {
    let opts = options("nack");
    let (q, _cleanup) = connect(&opts).await;
    let (a, b) = (job(1), job(2));
    q.publish(&a).await.unwrap();
    q.publish(&b).await.unwrap();
    let d = next(&q).await;
    assert_eq!(d.job, a);
    d.acker.nack(false).await.unwrap();
    let d = next(&q).await;
    assert_eq!(d.job, b, "the nacked job does not come back");
    d.acker.nack(true).await.unwrap();
    let d = next(&q).await;
    assert_eq!(d.job, b, "a requeued job comes back");
    assert!(d.redelivered);
    d.acker.ack().await.unwrap();

    eventually(10, "dead letter counted", || async {
        q.dead_letter_depth().await.unwrap() == 1
    })
    .await;
    let dead = q
        .next_dead_letter()
        .await
        .unwrap()
        .expect("the dead letter");
    assert_eq!(dead.job, a);
    dead.acker.ack().await.unwrap();
    assert!(q.next_dead_letter().await.unwrap().is_none());
    assert_eq!(q.dead_letter_depth().await.unwrap(), 0);
    q.close().await;
}

#[tokio::test]
async fn exceeding_the_delivery_limit_dead_letters() {
    let mut opts = options("limit");
    opts.delivery_limit = 2;
    let (q, _cleanup) = connect(&opts).await;
    let j = job(1);
    q.publish(&j).await.unwrap();
    let mut deliveries = 0u32;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            Instant::now() < deadline,
            "not dead-lettered after {deliveries} deliveries"
        );
        tokio::select! {
            d = q.next() => {
                let d = d.unwrap();
                assert_eq!(d.job, j);
                assert_eq!(d.redelivered, deliveries > 0);
                deliveries += 1;
                assert!(deliveries <= opts.delivery_limit + 1, "delivered {deliveries} times with a limit of {}", opts.delivery_limit);
                d.acker.nack(true).await.unwrap();
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                if q.dead_letter_depth().await.unwrap() == 1 {
                    break;
                }
            }
        }
    }
    assert!(
        deliveries >= 2,
        "it was redelivered before being dead-lettered ({deliveries})"
    );
    eprintln!(
        "delivery limit {}: delivered {deliveries} times, then dead-lettered",
        opts.delivery_limit
    );
    let dead = q
        .next_dead_letter()
        .await
        .unwrap()
        .expect("the dead letter");
    assert_eq!(dead.job, j);
    dead.acker.ack().await.unwrap();
    assert_eq!(q.depth().await.unwrap(), 0);
    q.close().await;
}

#[tokio::test]
async fn undecodable_body_is_dead_lettered_and_skipped() {
    let opts = options("poison");
    let (q, _cleanup) = connect(&opts).await;
    let conn = Connection::connect(&url(), ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    // Confirmed, so it is in the queue before the good job.
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let confirm = ch
        .basic_publish(
            "".into(),
            opts.queue.as_str().into(),
            BasicPublishOptions::default(),
            b"not a job",
            BasicProperties::default(),
        )
        .await
        .unwrap();
    assert!(confirm.await.unwrap().is_ack());
    let good = job(3);
    q.publish(&good).await.unwrap();
    let d = next(&q).await;
    assert_eq!(d.job, good);
    d.acker.ack().await.unwrap();
    eventually(10, "poison message dead-lettered", || async {
        q.dead_letter_depth().await.unwrap() == 1
    })
    .await;
    let err = q
        .next_dead_letter()
        .await
        .err()
        .expect("the dead letter is not a job");
    assert!(matches!(err, QueueError::Unavailable(_)), "{err}");
    conn.close(200, "bye".into()).await.unwrap();
    q.close().await;
}

#[tokio::test]
async fn unacked_job_redelivered_after_connection_drops() {
    let opts = options("redeliver");
    let (q, _cleanup) = connect(&opts).await;
    let q = Arc::new(q);

    // Another consumer process dies holding a job: this one gets it.
    let a = job(1);
    let (other, _other_cleanup) = connect(&opts).await;
    q.publish(&a).await.unwrap();
    let held = next(&other).await;
    assert_eq!(held.job, a);
    assert!(!held.redelivered);
    let waiting = tokio::spawn({
        let q = q.clone();
        async move { q.next().await }
    });
    other.close().await;
    let got = within(30, "redelivery to the other consumer", waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.job, a);
    assert!(got.redelivered);
    got.acker.ack().await.unwrap();

    // This consumer's own connection drops with a job unacked.
    let b = job(2);
    q.publish(&b).await.unwrap();
    let d = next(&q).await;
    assert_eq!(d.job, b);
    assert!(!d.redelivered);
    q.drop_connections().await;
    let err = d
        .acker
        .ack()
        .await
        .expect_err("acking on a dead channel fails");
    assert!(matches!(err, QueueError::Unavailable(_)), "{err}");
    let again = next(&q).await;
    assert_eq!(
        again.job, b,
        "the broker redelivers it once the consumer reconnects"
    );
    assert!(again.redelivered);
    again.acker.ack().await.unwrap();

    // A pending next() rides over a reconnect and gets later jobs.
    let waiting = tokio::spawn({
        let q = q.clone();
        async move { q.next().await }
    });
    q.drop_connections().await;
    let c = job(3);
    q.publish(&c).await.expect("publish reconnects");
    let got = within(30, "pending next after reconnect", waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.job, c);
    assert!(!got.redelivered);
    got.acker.ack().await.unwrap();
    q.close().await;
}

#[tokio::test]
async fn unreachable_broker_is_unavailable_and_close_ends_next() {
    let port = free_port();
    let err = RabbitQueue::connect(
        &format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
        options("nobroker"),
    )
    .await
    .err()
    .expect("nothing listens");
    assert!(matches!(err, QueueError::Unavailable(_)), "{err}");

    let opts = options("close");
    let (q, _cleanup) = connect(&opts).await;
    let q = Arc::new(q);
    let waiting = tokio::spawn({
        let q = q.clone();
        async move { q.next().await.err() }
    });
    // Let the consumer attach before closing (not required for correctness).
    eventually(10, "consumer attached", || async {
        q.depth().await.is_ok()
    })
    .await;
    q.close().await;
    assert_eq!(
        within(30, "next after close", waiting).await.unwrap(),
        Some(QueueError::Closed)
    );
    q.close().await;
}

// ---------------------------------------------------------------------------
// A private RabbitMQ node (glia_backends::testkit), restarted under a consumer.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_resumes_after_broker_restart() {
    let Some(mut broker) = glia_testkit::require(
        PrivateRabbit::new(),
        "the rabbitmq-server script",
        "apt-get install rabbitmq-server; scripts/test does",
    ) else {
        return;
    };
    let started = Instant::now();
    broker.start().expect("spawn rabbitmq-server");
    broker.wait_ready(Duration::from_secs(120)).await;
    eprintln!(
        "private node {} on port {} ready after {:?}",
        broker.node(),
        broker.port(),
        started.elapsed()
    );

    let mut opts = options("restart");
    opts.publish_attempts = 3;
    opts.reconnect_max = Duration::from_millis(500);
    opts.connect_timeout = Duration::from_secs(5);
    let q = Arc::new(
        RabbitQueue::connect(&broker.url(), opts)
            .await
            .expect("connect to the private node"),
    );

    // Every fourth a resume: both consumers ride over the restart.
    let jobs: Vec<Job> = (1..=16)
        .map(|i| {
            if i % 4 == 0 {
                Job::resume(Uuid::now_v7(), i)
            } else {
                job(i)
            }
        })
        .collect();
    let mut confirmed: Vec<Job> = Vec::new();
    for j in &jobs[..10] {
        q.publish(j).await.expect("publish before the restart");
        confirmed.push(*j);
    }
    let mut acked = HashSet::new();
    for _ in 0..3 {
        let d = next(&q).await;
        d.acker.ack().await.unwrap();
        acked.insert(d.job);
    }
    let held = next(&q).await;
    assert!(!acked.contains(&held.job));

    // Stop the broker with one job delivered and unacked, six waiting.
    // A clean stop by default: RabbitMQ 3.10 can lose a quorum queue that
    // was declared less than about three minutes before a SIGKILL (see the
    // module documentation). GLIA_TEST_BROKER_SIGKILL_AFTER=<secs> waits
    // that long, then SIGKILLs the node instead.
    match std::env::var("GLIA_TEST_BROKER_SIGKILL_AFTER")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        Some(secs) => {
            eprintln!("waiting {secs}s, then SIGKILL");
            tokio::time::sleep(Duration::from_secs(secs)).await;
            broker.kill();
        }
        None => broker.stop().await,
    }
    let err = within(60, "publish while the broker is down", q.publish(&jobs[10]))
        .await
        .expect_err("nothing to publish to");
    assert!(matches!(err, QueueError::Unavailable(_)), "{err}");
    let held_ack = held.acker.ack().await;
    assert!(
        matches!(held_ack, Err(QueueError::Unavailable(_))),
        "ack after the stop: {held_ack:?}"
    );

    // The consumer keeps waiting through the outage. It must get every
    // confirmed job not acked before the stop (including the held one) and
    // the jobs published after the restart.
    let expected: HashSet<Job> = confirmed
        .iter()
        .filter(|j| !acked.contains(j))
        .chain(&jobs[11..16])
        .copied()
        .collect();
    assert_eq!(expected.len(), 12);
    let collector = tokio::spawn({
        let (q, expected) = (q.clone(), expected.clone());
        async move {
            let mut got: Vec<(Job, bool)> = Vec::new();
            loop {
                let d = q.next().await?;
                if let Err(e) = d.acker.ack().await {
                    eprintln!("ack failed (will be redelivered): {e}");
                }
                got.push((d.job, d.redelivered));
                let seen: HashSet<Job> = got.iter().map(|(j, _)| *j).collect();
                if expected.is_subset(&seen) {
                    return Ok::<_, QueueError>(got);
                }
            }
        }
    });

    let restart = Instant::now();
    broker.start().expect("spawn rabbitmq-server"); // same node name, ports and data directory
    broker.wait_ready(Duration::from_secs(120)).await;
    eprintln!(
        "private node restarted on the same data in {:?}",
        restart.elapsed()
    );

    // The publisher reconnects; a caller retries what failed (here: until
    // confirmed, bounded).
    for j in &jobs[11..16] {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match q.publish(j).await {
                Ok(()) => break,
                Err(e) => {
                    assert!(Instant::now() < deadline, "publish after the restart: {e}");
                    eprintln!("publish after restart not yet confirmed: {e}");
                }
            }
        }
    }

    let got = within(120, "every confirmed job after the restart", collector)
        .await
        .unwrap()
        .unwrap();
    let seen: HashSet<Job> = got.iter().map(|(j, _)| *j).collect();
    assert!(
        expected.is_subset(&seen),
        "missing after restart: {:?}",
        expected.difference(&seen).collect::<Vec<_>>()
    );
    assert!(
        !seen.contains(&jobs[10]),
        "the unconfirmed publish did not happen"
    );
    assert!(
        got.iter()
            .any(|(j, redelivered)| *j == held.job && *redelivered),
        "the job held at the stop comes back redelivered"
    );
    let duplicates = got.len() - seen.len();
    eprintln!(
        "after restart: {} deliveries, {} distinct, {duplicates} duplicates; total {:?}",
        got.len(),
        seen.len(),
        started.elapsed()
    );
    eventually(30, "queue drained", || async {
        q.depth().await.map(|n| n == 0).unwrap_or(false)
    })
    .await;

    q.delete_topology().await.unwrap();
    q.close().await;
    drop(broker);
}
