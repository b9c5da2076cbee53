//! The Redis ledger against a real Redis: `GLIA_REDIS_URL` (default
//! `redis://127.0.0.1:6379`). Each test uses its own key prefix
//! (`glia-test-<uuid>`) and deletes its keys at the end, pass or fail.
//!
//! `ledger_survives_a_redis_restart` starts a private `redis-server` of its
//! own ([`glia_backends::testkit::PrivateRedis`]: a free port, no
//! persistence), kills and restarts it, and never touches the Redis at
//! `GLIA_REDIS_URL`.

use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::BoxStream;
use glia_backends::redis_ledger::RedisLedger;
use glia_backends::testkit::{PrivateRedis, RedisKeys, free_port};
use glia_backends::{Ledger, LedgerError, Signal};
use glia_proto::LiveEvent;
use uuid::Uuid;

fn url() -> String {
    std::env::var("GLIA_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

fn prefix() -> String {
    format!("glia-test-{}", Uuid::now_v7())
}

fn delta(text: &str) -> LiveEvent {
    LiveEvent::ModelDelta {
        channel: "text".into(),
        delta: text.into(),
    }
}

/// Await `fut`, failing the test if it takes longer than `secs` (a bound on
/// a hang, not a timing assertion).
async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {secs}s"))
}

async fn next<T>(stream: &mut BoxStream<'static, T>) -> T {
    within(10, "stream item", stream.next())
        .await
        .expect("the stream does not end")
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

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("connect to Redis at GLIA_REDIS_URL")
}

async fn connect() -> (RedisLedger, RedisKeys) {
    let prefix = prefix();
    let ledger = RedisLedger::connect(&url(), &prefix)
        .await
        .expect("connect to Redis at GLIA_REDIS_URL");
    (ledger, RedisKeys { url: url(), prefix })
}

#[tokio::test]
async fn cancellation_flag_with_ttl_and_notification() {
    let (ledger, _cleanup) = connect().await;
    let mut cancellations = ledger.subscribe_cancellations().await.unwrap();
    let (run, other) = (Uuid::now_v7(), Uuid::now_v7());
    assert!(!ledger.is_cancelled(run).await.unwrap());

    ledger.cancel(run).await.unwrap();
    assert!(ledger.is_cancelled(run).await.unwrap());
    assert!(
        !ledger.is_cancelled(other).await.unwrap(),
        "flags are per run"
    );
    assert_eq!(
        next(&mut cancellations).await,
        run,
        "subscribers hear of the cancellation"
    );
    ledger.cancel(run).await.expect("cancelling twice is fine");
    assert_eq!(next(&mut cancellations).await, run);

    // The flag is a key with the default TTL (7 days).
    let mut conn = raw(&url()).await;
    let ttl: i64 = redis::cmd("TTL")
        .arg(ledger.cancel_key(run))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(ttl > 6 * 24 * 3600 && ttl <= 7 * 24 * 3600, "ttl {ttl}");

    // A short TTL expires.
    let short = RedisLedger::connect(&url(), ledger.prefix())
        .await
        .unwrap()
        .with_cancel_ttl(Duration::from_secs(1));
    short.cancel(other).await.unwrap();
    assert!(short.is_cancelled(other).await.unwrap());
    assert_eq!(
        next(&mut cancellations).await,
        other,
        "every ledger on the prefix shares the channel"
    );
    eventually(10, "flag expired", || async {
        !short.is_cancelled(other).await.unwrap()
    })
    .await;
}

#[tokio::test]
async fn pause_flag_is_read_with_the_cancel_flag_in_one_signal() {
    let (ledger, _cleanup) = connect().await;
    let (run, other) = (Uuid::now_v7(), Uuid::now_v7());
    assert_eq!(ledger.signal(run).await.unwrap(), Signal::default());
    ledger.set_paused(run, true).await.unwrap();
    ledger
        .set_paused(run, true)
        .await
        .expect("setting twice is fine");
    assert_eq!(
        ledger.signal(run).await.unwrap(),
        Signal {
            cancelled: false,
            paused: true
        }
    );
    assert_eq!(
        ledger.signal(other).await.unwrap(),
        Signal::default(),
        "flags are per run"
    );
    ledger.cancel(run).await.unwrap();
    assert_eq!(
        ledger.signal(run).await.unwrap(),
        Signal {
            cancelled: true,
            paused: true
        }
    );
    let mut conn = raw(&url()).await;
    let ttl: i64 = redis::cmd("TTL")
        .arg(ledger.pause_key(run))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        ttl > 6 * 24 * 3600 && ttl <= 7 * 24 * 3600,
        "the pause flag expires like the cancel flag: ttl {ttl}"
    );
    ledger.set_paused(run, false).await.unwrap();
    ledger
        .set_paused(run, false)
        .await
        .expect("clearing twice is fine");
    assert_eq!(
        ledger.signal(run).await.unwrap(),
        Signal {
            cancelled: true,
            paused: false
        }
    );
}

#[tokio::test]
async fn live_events_fan_out_per_run() {
    let (ledger, _cleanup) = connect().await;
    let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
    ledger
        .publish_live(a, &delta("nobody listens"))
        .await
        .expect("publishing to no subscriber is fine");

    let mut a1 = ledger.subscribe_live(a).await.unwrap();
    let mut a2 = ledger.subscribe_live(a).await.unwrap();
    let mut b1 = ledger.subscribe_live(b).await.unwrap();
    let progress = LiveEvent::ToolProgress {
        call_id: "c1".into(),
        message: "half way".into(),
    };
    ledger.publish_live(a, &delta("Hel")).await.unwrap();
    // A payload that is not a live event is skipped by subscribers.
    let mut conn = raw(&url()).await;
    let _: i64 = redis::cmd("PUBLISH")
        .arg(ledger.live_channel(a))
        .arg("garbage")
        .query_async(&mut conn)
        .await
        .unwrap();
    ledger.publish_live(a, &delta("lo")).await.unwrap();
    ledger.publish_live(a, &progress).await.unwrap();
    ledger.publish_live(b, &delta("for b")).await.unwrap();

    for sub in [&mut a1, &mut a2] {
        assert_eq!(next(sub).await, delta("Hel"));
        assert_eq!(next(sub).await, delta("lo"));
        assert_eq!(next(sub).await, progress);
    }
    assert_eq!(
        next(&mut b1).await,
        delta("for b"),
        "b hears only b's events"
    );

    // A subscription opened later does not replay earlier events.
    let mut late = ledger.subscribe_live(a).await.unwrap();
    ledger.publish_live(a, &delta("!")).await.unwrap();
    assert_eq!(next(&mut late).await, delta("!"));

    // Dropping a stream closes its subscription.
    let subscribers = |conn: redis::aio::MultiplexedConnection, channel: String| async move {
        let mut conn = conn;
        let (_, n): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(&mut conn)
            .await
            .unwrap();
        n
    };
    assert_eq!(subscribers(conn.clone(), ledger.live_channel(a)).await, 3);
    drop((a1, a2, late));
    eventually(10, "subscriptions closed", || {
        let count = subscribers(conn.clone(), ledger.live_channel(a));
        async move { count.await == 0 }
    })
    .await;
    assert_eq!(subscribers(conn.clone(), ledger.live_channel(b)).await, 1);
}

#[tokio::test]
async fn ready_and_connect_errors() {
    let (ledger, _cleanup) = connect().await;
    ledger.ready().await.unwrap();
    let err = RedisLedger::connect(&format!("redis://127.0.0.1:{}", free_port()), "x")
        .await
        .err()
        .expect("nothing listens");
    assert!(matches!(err, LedgerError::Unavailable(_)), "{err}");
    let err = RedisLedger::connect("not a url", "x")
        .await
        .err()
        .expect("bad url");
    assert!(matches!(err, LedgerError::Unavailable(_)), "{err}");
}

// ---------------------------------------------------------------------------
// A private redis-server (glia_backends::testkit), restarted under the ledger.

#[tokio::test]
async fn ledger_survives_a_redis_restart() {
    let mut redis = PrivateRedis::new();
    if glia_testkit::require_ok(
        redis.start(),
        "redis-server",
        "apt-get install redis-server; scripts/test does",
    )
    .is_none()
    {
        return;
    }
    redis.wait_ready(Duration::from_secs(30)).await;
    let ledger = RedisLedger::connect(&redis.url(), "glia").await.unwrap();
    let run = Uuid::now_v7();
    let mut live = ledger.subscribe_live(run).await.unwrap();
    let mut cancellations = ledger.subscribe_cancellations().await.unwrap();
    // A worker's watch: each cancel as it is flagged, a marker after a
    // resubscription (what was flagged meanwhile is read back by id).
    let mut watch = ledger
        .watch_cancellations()
        .await
        .unwrap()
        .expect("Redis announces");
    ledger.cancel(run).await.unwrap();
    assert_eq!(next(&mut cancellations).await, run);
    assert_eq!(next(&mut watch).await, Some(run));
    ledger.publish_live(run, &delta("before")).await.unwrap();
    assert_eq!(next(&mut live).await, delta("before"));

    redis.kill();
    let err = within(
        30,
        "is_cancelled while Redis is down",
        ledger.is_cancelled(run),
    )
    .await
    .expect_err("Redis is down");
    assert!(matches!(err, LedgerError::Unavailable(_)), "{err}");
    assert!(matches!(
        within(30, "ready while down", ledger.ready()).await,
        Err(LedgerError::Unavailable(_))
    ));

    redis.start().unwrap();
    redis.wait_ready(Duration::from_secs(30)).await;
    // The same ledger reconnects on its own.
    eventually(30, "ledger answers again", || async {
        ledger.ready().await.is_ok()
    })
    .await;
    assert!(
        !ledger.is_cancelled(run).await.unwrap(),
        "a restarted Redis without persistence lost the flag (the log keeps the truth)"
    );
    // The watch says it resubscribed: nothing it missed is announced, so
    // a worker reads its runs' flags, in one round trip.
    assert_eq!(
        within(60, "the watch's resubscription", watch.next()).await,
        Some(None)
    );
    ledger.cancel(run).await.unwrap();
    assert!(ledger.is_cancelled(run).await.unwrap());
    let other = Uuid::now_v7();
    assert_eq!(
        ledger.cancelled_among(&[other, run]).await.unwrap(),
        vec![run]
    );

    // Subscriptions opened before the restart resubscribe by themselves;
    // what was published while they were away is lost, so publish until
    // one arrives.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut tries = 0;
    loop {
        tries += 1;
        ledger.publish_live(run, &delta("after")).await.unwrap();
        match tokio::time::timeout(Duration::from_millis(200), live.next()).await {
            Ok(Some(event)) => {
                assert_eq!(event, delta("after"));
                break;
            }
            Ok(None) => panic!("the live stream ended"),
            Err(_) => assert!(
                Instant::now() < deadline,
                "live subscription did not come back"
            ),
        }
    }
    eprintln!("live subscription back after {tries} publishes");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        ledger.cancel(run).await.unwrap();
        match tokio::time::timeout(Duration::from_millis(200), cancellations.next()).await {
            Ok(Some(id)) => {
                assert_eq!(id, run);
                break;
            }
            Ok(None) => panic!("the cancellation stream ended"),
            Err(_) => assert!(
                Instant::now() < deadline,
                "cancellation subscription did not come back"
            ),
        }
    }
    redis.kill();
}

#[tokio::test]
async fn redis_marks_running_calls() {
    let (ledger, _cleanup) = connect().await;
    glia_backends::conformance::marks_running_calls(&ledger).await;
}

#[tokio::test]
async fn redis_holds_tool_results() {
    let (ledger, _cleanup) = connect().await;
    glia_backends::conformance::holds_tool_results(&ledger).await;
    // A held result is a key of its own that lives seven days.
    let key = format!("{}:1:c9", Uuid::now_v7());
    let held = glia_backends::HeldResult {
        call_id: "c9".into(),
        content: "ok".into(),
        error: None,
        duration_ms: 1,
    };
    ledger.hold_results(&[(key.clone(), held)]).await.unwrap();
    let mut conn = raw(&url()).await;
    let ttl: i64 = redis::cmd("TTL")
        .arg(ledger.held_key(&key))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(ttl > 6 * 24 * 3600 && ttl <= 7 * 24 * 3600, "ttl {ttl}");
}
