//! The fleet-wide rate limiter against a real Redis (`GLIA_REDIS_URL`,
//! default `redis://127.0.0.1:6379`). Each test uses its own key prefix and
//! deletes its keys at the end. Time comes from test clocks: a 16-second
//! `retry-after` runs in 1.6 s of real time.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Reply, ScaledClock, Server, fixture, request};
use glia_agent::provider::Provider;
use glia_providers::RateLimiter;
use glia_providers::http::{HttpProvider, http_client};
use glia_providers::ratelimit::{Admission, Permit, RateCost, RateKey, RateLimits};
use glia_providers::{Anthropic, ApiKey};

const T0: u64 = 1_767_225_600_000;

fn url() -> String {
    std::env::var("GLIA_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

fn prefix() -> String {
    format!("glia-test:{}:", uuid::Uuid::now_v7())
}

/// Deletes a test's keys even when the test panics.
struct Keys(String);

impl Drop for Keys {
    fn drop(&mut self) {
        if let Ok(mut conn) = redis::Client::open(url()).and_then(|c| c.get_connection()) {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{}*", self.0))
                .query(&mut conn)
                .unwrap_or_default();
            if !keys.is_empty() {
                let _: Result<(), _> = redis::cmd("DEL").arg(&keys).query(&mut conn);
            }
        }
    }
}

async fn cleanup(prefix: &str) {
    let client = redis::Client::open(url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    if !keys.is_empty() {
        let _: () = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let left: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(left.is_empty(), "keys left behind: {left:?}");
}

fn limits(rpm: u64, itpm: u64, otpm: u64) -> RateLimits {
    RateLimits {
        requests_per_minute: rpm,
        input_tokens_per_minute: itpm,
        output_tokens_per_minute: otpm,
        resume_spacing_ms: None,
    }
}

fn key() -> RateKey {
    RateKey::new(
        "anthropic",
        "claude-sonnet-4-5",
        Some(&ApiKey::new("sk-ant-rate-test")),
    )
}

fn cost(input: u64, output: u64) -> RateCost {
    RateCost {
        requests: 1,
        input_tokens: input,
        output_tokens: output,
    }
}

#[tokio::test]
async fn buckets_grant_wait_and_refill_per_minute() {
    let p = prefix();
    let _keys = Keys(p.clone());
    let rl = RateLimiter::connect(&url(), p.clone(), limits(2, 1000, 1000))
        .await
        .unwrap();
    let k = key();
    assert_eq!(
        rl.reserve(&k, "r1", cost(100, 100), T0, 0).await.unwrap(),
        Admission::Granted
    );
    assert_eq!(
        rl.reserve(&k, "r2", cost(100, 100), T0, 0).await.unwrap(),
        Admission::Granted
    );
    // Two requests per minute: the third waits until one has refilled (30 s).
    assert_eq!(
        rl.reserve(&k, "r3", cost(100, 100), T0, 0).await.unwrap(),
        Admission::Wait(Duration::from_millis(30_000))
    );
    assert_eq!(
        rl.reserve(&k, "r4", cost(100, 100), T0 + 30_000, 0)
            .await
            .unwrap(),
        Admission::Granted
    );
    // Token dimensions too: 1000 - 200 taken + 500 refilled in 30 s (capped at
    // 1000) - 100 taken = 900 output tokens left; 950 wait for 50 more (3 s).
    // (No request is asked for: the request bucket is empty again.)
    let tokens_only = RateCost {
        requests: 0,
        input_tokens: 100,
        output_tokens: 950,
    };
    assert_eq!(
        rl.reserve(&k, "r5", tokens_only, T0 + 30_000, 0)
            .await
            .unwrap(),
        Admission::Wait(Duration::from_millis(3000))
    );
    // The key never holds the API key.
    assert!(!k.key_id.contains("rate-test") && k.key_id.len() == 12);
    cleanup(&p).await;
}

#[tokio::test]
async fn a_retried_script_call_never_counts_twice() {
    let p = prefix();
    let _keys = Keys(p.clone());
    let rl = RateLimiter::connect(&url(), p.clone(), limits(1, 0, 0))
        .await
        .unwrap();
    let k = key();
    assert_eq!(
        rl.reserve(&k, "same", cost(1, 1), T0, 0).await.unwrap(),
        Admission::Granted
    );
    // The same request id again (a retry after a lost reply): same answer, nothing taken.
    assert_eq!(
        rl.reserve(&k, "same", cost(1, 1), T0, 0).await.unwrap(),
        Admission::Granted
    );
    assert!(matches!(
        rl.reserve(&k, "other", cost(1, 1), T0, 0).await.unwrap(),
        Admission::Wait(_)
    ));
    let permit = Permit {
        key: k.clone(),
        request_id: "same".into(),
        cost: cost(1, 1),
    };
    assert!(rl.settle(&permit, cost(1, 1), T0).await.unwrap());
    assert!(
        !rl.settle(&permit, cost(1, 1), T0).await.unwrap(),
        "a retried settlement is a no-op"
    );
    cleanup(&p).await;
}

#[tokio::test]
async fn settlement_returns_what_was_not_used() {
    let p = prefix();
    let _keys = Keys(p.clone());
    let rl = RateLimiter::connect(&url(), p.clone(), limits(0, 0, 1000))
        .await
        .unwrap();
    let k = key();
    assert_eq!(
        rl.reserve(&k, "a", cost(0, 800), T0, 0).await.unwrap(),
        Admission::Granted
    );
    assert!(matches!(
        rl.reserve(&k, "b", cost(0, 800), T0, 0).await.unwrap(),
        Admission::Wait(_)
    ));
    let permit = Permit {
        key: k.clone(),
        request_id: "a".into(),
        cost: cost(0, 800),
    };
    assert!(rl.settle(&permit, cost(0, 100), T0).await.unwrap());
    // 1000 - 800 + 700 = 900 left.
    assert_eq!(
        rl.reserve(&k, "c", cost(0, 800), T0, 0).await.unwrap(),
        Admission::Granted
    );
    cleanup(&p).await;
}

#[tokio::test]
async fn callers_resume_after_a_cooldown_in_distinct_slots() {
    let p = prefix();
    let _keys = Keys(p.clone());
    let spacing = 100;
    let rl = RateLimiter::connect(
        &url(),
        p.clone(),
        RateLimits {
            resume_spacing_ms: Some(spacing),
            ..limits(600, 0, 0)
        },
    )
    .await
    .unwrap();
    let k = key();
    assert_eq!(
        rl.cooldown(&k, Duration::from_secs(16), T0).await.unwrap(),
        T0 + 16_000
    );
    // A shorter cooldown never shortens a longer one.
    assert_eq!(
        rl.cooldown(&k, Duration::from_secs(5), T0 + 1000)
            .await
            .unwrap(),
        T0 + 16_000
    );
    assert_eq!(
        rl.cooldown_remaining(&k, T0 + 6000).await.unwrap(),
        Some(Duration::from_secs(10))
    );
    let mut waits = Vec::new();
    for i in 0..50u64 {
        match rl
            .reserve(&k, &format!("run{i}"), cost(10, 10), T0 + 1000, i % spacing)
            .await
            .unwrap()
        {
            Admission::Wait(w) => waits.push(w.as_millis() as u64),
            Admission::Granted => panic!("granted during the cooldown"),
        }
    }
    // Slot i resumes at 16 s + i × spacing (+ its jitter): nobody before 16 s, nobody together.
    for (i, w) in waits.iter().enumerate() {
        let at = 1000 + w;
        assert!(
            at >= 16_000 + i as u64 * spacing && at < 16_000 + (i as u64 + 1) * spacing,
            "slot {i} resumes at {at}"
        );
    }
    cleanup(&p).await;
}

/// With 50 runs sharing one key and a 429 carrying `retry-after: 16`, no call
/// is sent before 16 s and the resumed calls are spread out. Five "workers"
/// (each its own provider and Redis connection) run ten runs each; the clock
/// runs ten times faster than real time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_runs_respect_a_fleet_wide_retry_after() {
    fifty_runs_after_a_retry_after(limits(600, 0, 0)).await;
}

/// The same with no cap: no call takes a permit, yet the 429's
/// `retry-after` is shared and holds every worker's calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_runs_respect_a_fleet_wide_retry_after_with_no_cap() {
    fifty_runs_after_a_retry_after(limits(0, 0, 0)).await;
}

async fn fifty_runs_after_a_retry_after(caps: RateLimits) {
    let p = prefix();
    let _keys = Keys(p.clone());
    let clock = ScaledClock::new(T0, 10);
    let server = Server::start(
        |n, _| {
            if n == 0 {
                Reply::json(429, fixture("anthropic/error_429.json")).header("retry-after", "16")
            } else {
                Reply::sse(fixture("anthropic/refusal.sse"))
            }
        },
        Some({
            let clock = clock.clone();
            Arc::new(move || clock.now_ms_for_test())
        }),
    )
    .await;
    let mut workers = Vec::new();
    for _ in 0..5 {
        let limiter = Arc::new(RateLimiter::connect(&url(), p.clone(), caps).await.unwrap());
        let provider = HttpProvider::new(
            Anthropic::default(),
            http_client().unwrap(),
            &server.base,
            Some(ApiKey::new("sk-ant-shared-key")),
        )
        .with_clock(clock.clone())
        .with_rate_limiter(limiter.clone());
        workers.push((Arc::new(provider), limiter));
    }
    // Run 0 gets the 429 …
    let first = workers[0].0.clone();
    let run0 =
        tokio::spawn(async move { first.generate(&request("claude-sonnet-4-5"), &|_| {}).await });
    let k = workers[0].0.rate_key("claude-sonnet-4-5");
    let waiting_since = std::time::Instant::now();
    let until = loop {
        if let Some(left) = workers[0]
            .1
            .cooldown_remaining(&k, clock.now_ms_for_test())
            .await
            .unwrap()
        {
            break clock.now_ms_for_test() + left.as_millis() as u64;
        }
        assert!(
            waiting_since.elapsed() < Duration::from_secs(30),
            "no cooldown after 30 s: the 429 was not recorded (server saw {} requests)",
            server.seen().len()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let got_429_at = server.seen()[0].at_ms;
    assert!(until >= got_429_at + 16_000);
    // … then 49 more runs start, spread over the five workers.
    let mut runs = vec![run0];
    for i in 1..50 {
        let provider = workers[i % 5].0.clone();
        runs.push(tokio::spawn(async move {
            provider
                .generate(&request("claude-sonnet-4-5"), &|_| {})
                .await
        }));
    }
    for r in runs {
        assert_eq!(r.await.unwrap().unwrap().stop_reason, "refusal");
    }
    let seen = server.seen();
    assert_eq!(seen.len(), 51, "one 429, then every run once");
    let mut sent: Vec<u64> = seen[1..].iter().map(|s| s.at_ms).collect();
    sent.sort_unstable();
    assert!(
        sent[0] >= got_429_at + 16_000,
        "a call went out {} ms after the 429",
        sent[0] - got_429_at
    );
    // Spread out: each caller that met the cooldown was given its own slot,
    // the cooldown's end (at least 16 s after the 429 left the server) plus
    // `slot × 100 ms` (600 rpm) plus a jitter below one spacing, and goes
    // out no earlier. A busy machine can only make calls late (and so bunch
    // them); it cannot make one early, so the k-th call to go out left no
    // earlier than the k-th slot. (A window of 100 ms on the ×10 clock, 10 ms
    // of real time, checked bunching instead: lateness broke it.) The
    // scaled clock's rounding (1 ms of real time is 10 ms here) is allowed
    // one spacing.
    for (k, at) in sent.iter().enumerate().skip(1) {
        let slot = got_429_at + 16_000 + (k as u64 - 1) * 100;
        assert!(
            *at >= slot,
            "call {k} went out at {at}, before slot {} ({slot}): {sent:?}",
            k - 1
        );
    }
    cleanup(&p).await;
}

/// A clock that moves only when told (Unix ms); its sleeps end at once.
struct ManualClock(std::sync::atomic::AtomicU64);

impl glia_providers::clock::Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn sleep(&self, _: Duration) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(async {})
    }
}

/// Keys under `prefix` now.
async fn keys_under(prefix: &str) -> Vec<String> {
    let client = redis::Client::open(url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// With no cap, a call reserves nothing, settles nothing and leaves no
/// key; the only read is the key's cooldown, at most once a second: a
/// cooldown another worker sets is seen from the next read on, and holds
/// the call.
#[tokio::test]
async fn no_cap_reserves_nothing_and_leaves_no_key() {
    let p = prefix();
    let _keys = Keys(p.clone());
    let rl = RateLimiter::connect(&url(), p.clone(), limits(0, 0, 0))
        .await
        .unwrap();
    let clock = ManualClock(std::sync::atomic::AtomicU64::new(T0));
    let k = key();
    for i in 0..100 {
        let (permit, waited) = rl
            .acquire(&k, &format!("run{i}"), cost(10, 10), &clock, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!((permit, waited), (None, Duration::ZERO));
    }
    assert_eq!(keys_under(&p).await, Vec::<String>::new(), "no key left");

    // Another worker meets a `retry-after` of 30 s.
    let other = RateLimiter::connect(&url(), p.clone(), limits(0, 0, 0))
        .await
        .unwrap();
    other
        .cooldown(&k, Duration::from_secs(30), T0)
        .await
        .unwrap();
    // A second of clock time later it reads the cooldown again, and the
    // call waits for it.
    clock
        .0
        .store(T0 + 1000, std::sync::atomic::Ordering::SeqCst);
    let held = rl
        .acquire(&k, "run-b", cost(10, 10), &clock, Duration::from_secs(1))
        .await;
    assert!(
        matches!(held, Err(glia_providers::error::CallError::WaitTooLong { wait }) if wait >= Duration::from_secs(28)),
        "{held:?}"
    );
    cleanup(&p).await;
}

/// Reservation records do not pile up: a settled one is deleted, and a
/// `wait` answer's lasts its wait and a minute more, not 15 minutes.
#[tokio::test]
async fn reservation_records_are_bounded() {
    let p = prefix();
    let _keys = Keys(p.clone());
    let rl = RateLimiter::connect(&url(), p.clone(), limits(1, 0, 0))
        .await
        .unwrap();
    let k = key();
    assert_eq!(
        rl.reserve(&k, "first", cost(1, 1), T0, 0).await.unwrap(),
        Admission::Granted
    );
    let permit = Permit {
        key: k.clone(),
        request_id: "first".into(),
        cost: cost(1, 1),
    };
    assert!(rl.settle(&permit, cost(1, 1), T0).await.unwrap());
    assert!(
        !rl.settle(&permit, cost(1, 1), T0).await.unwrap(),
        "a retried settlement takes nothing back twice"
    );
    let Admission::Wait(wait) = rl.reserve(&k, "second", cost(1, 1), T0, 0).await.unwrap() else {
        panic!("one request a minute: the second waits");
    };
    let records: Vec<String> = keys_under(&p)
        .await
        .into_iter()
        .filter(|k| k.contains(":req:"))
        .collect();
    assert_eq!(records.len(), 1, "only the waiting answer's: {records:?}");
    let client = redis::Client::open(url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&records[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    let most = wait.as_millis() as i64 + 60_000;
    assert!(ttl > 0 && ttl <= most, "{ttl} ms, at most {most}");
    cleanup(&p).await;
}
