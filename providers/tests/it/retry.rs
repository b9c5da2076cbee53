use std::sync::{Arc, Mutex};
use std::time::Duration;

use glia_agent::provider::{Provider, ProviderError};
use glia_proto::LiveEvent;
use glia_providers::error::CallError;
use glia_providers::http::{CallObserver, HttpProvider, RetryEvent, RetryPolicy, http_client};
use glia_providers::{Anthropic, ApiKey, OpenAi, ProviderMetrics};

use crate::common::{Reply, Server, StepClock, fixture, request};

/// 2026-01-01T00:00:00Z in Unix ms.
const T0: u64 = 1_767_225_600_000;

#[derive(Default)]
struct Events(Mutex<Vec<RetryEvent>>);

impl CallObserver for Events {
    fn retry(&self, event: &RetryEvent) {
        self.0.lock().unwrap().push(event.clone());
    }
}

fn err(status: u16) -> Reply {
    Reply::json(status, fixture(&format!("anthropic/error_{status}.json")))
}

fn ok() -> Reply {
    Reply::sse(fixture("anthropic/tools.sse"))
}

struct Setup {
    provider: HttpProvider<Anthropic>,
    clock: Arc<StepClock>,
    events: Arc<Events>,
    metrics: ProviderMetrics,
    server: Server,
}

async fn setup(replies: Vec<Reply>, policy: RetryPolicy) -> Setup {
    let server = Server::replay(replies).await;
    let clock = StepClock::at(T0);
    let events = Arc::new(Events::default());
    let metrics = ProviderMetrics::default();
    let provider = HttpProvider::new(
        Anthropic::default(),
        http_client().unwrap(),
        &server.base,
        Some(ApiKey::new("sk-ant-retry-test")),
    )
    .with_retry(policy)
    .with_clock(clock.clone())
    .with_observer(events.clone())
    .with_metrics(metrics.clone());
    Setup {
        provider,
        clock,
        events,
        metrics,
        server,
    }
}

fn between(d: Duration, lo_ms: u64, hi_ms: u64) -> bool {
    d >= Duration::from_millis(lo_ms) && d <= Duration::from_millis(hi_ms)
}

#[tokio::test]
async fn retry_after_seconds_is_honoured() {
    let s = setup(
        vec![err(429).header("retry-after", "3"), ok()],
        RetryPolicy::default(),
    )
    .await;
    let r = s
        .provider
        .call(&request("claude-sonnet-4-5"), &|_| {})
        .await
        .unwrap();
    assert_eq!(r.stop_reason, "tool_use");
    let sleeps = s.clock.sleeps();
    assert_eq!(sleeps.len(), 1);
    assert!(between(sleeps[0], 3000, 3300), "{sleeps:?}");
    let events = s.events.0.lock().unwrap().clone();
    assert_eq!(events.len(), 1);
    assert_eq!(
        (events[0].attempt, events[0].error.kind(), events[0].delay),
        (1, "rate_limited", sleeps[0])
    );
    assert_eq!(
        s.metrics
            .retries("anthropic", "claude-sonnet-4-5", "rate_limited"),
        1
    );
    assert_eq!(
        s.metrics.requests("anthropic", "claude-sonnet-4-5", "ok"),
        1
    );
    assert_eq!(s.server.seen().len(), 2);
}

#[tokio::test]
async fn retry_after_http_date_is_honoured() {
    // 7 s after the test clock's now.
    let date = httpdate::fmt_http_date(std::time::UNIX_EPOCH + Duration::from_millis(T0 + 7000));
    let s = setup(
        vec![err(529).header("retry-after", &date), ok()],
        RetryPolicy::default(),
    )
    .await;
    s.provider.call(&request("m"), &|_| {}).await.unwrap();
    let sleeps = s.clock.sleeps();
    assert!(between(sleeps[0], 7000, 7700), "{sleeps:?} for {date}");
}

#[tokio::test]
async fn retry_after_ms_wins_over_retry_after() {
    let s = setup(
        vec![
            err(500)
                .header("retry-after-ms", "1500")
                .header("retry-after", "30"),
            ok(),
        ],
        RetryPolicy::default(),
    )
    .await;
    s.provider.call(&request("m"), &|_| {}).await.unwrap();
    assert!(
        between(s.clock.sleeps()[0], 1500, 1650),
        "{:?}",
        s.clock.sleeps()
    );
}

#[tokio::test]
async fn without_a_hint_backoff_grows_within_bounds() {
    let policy = RetryPolicy {
        max_retries: 5,
        min_delay: Duration::from_millis(100),
        max_delay: Duration::from_secs(1),
        ..RetryPolicy::default()
    };
    let s = setup(
        vec![err(500), err(529), err(500), err(529), err(500), ok()],
        policy,
    )
    .await;
    s.provider.call(&request("m"), &|_| {}).await.unwrap();
    let sleeps = s.clock.sleeps();
    assert_eq!(sleeps.len(), 5);
    // Factor 2 from min_delay, capped at max_delay, each delay plus a full
    // jitter of up to itself: retry n waits in [base(n), 2·base(n)).
    let bases_ms = [100, 200, 400, 800, 1_000];
    for (n, (slept, base)) in sleeps.iter().zip(bases_ms).enumerate() {
        assert!(
            between(*slept, base, 2 * base - 1),
            "retry {n}: slept {slept:?}, not within [{base} ms, {} ms): {sleeps:?}",
            2 * base
        );
    }
    // Growth: each wait is longer than the one before until the cap, where
    // the base stops growing.
    assert!(
        sleeps[..4].windows(2).all(|w| w[1] > w[0]),
        "the backoff did not grow: {sleeps:?}"
    );
    assert_eq!(s.server.seen().len(), 6);
}

#[tokio::test]
async fn the_retry_budget_ends_retries() {
    let policy = RetryPolicy {
        max_retries: 2,
        min_delay: Duration::from_millis(10),
        ..RetryPolicy::default()
    };
    let s = setup(vec![err(500), err(500), err(500), ok()], policy).await;
    let e = s.provider.call(&request("m"), &|_| {}).await.unwrap_err();
    assert!(matches!(e, CallError::Server { status: 500, .. }));
    assert_eq!(s.server.seen().len(), 3);
    assert_eq!(s.metrics.requests("anthropic", "m", "server"), 1);
    assert_eq!(s.metrics.retries("anthropic", "m", "server"), 2);
}

#[tokio::test]
async fn a_long_hint_goes_back_to_the_loop_as_a_rate_limit() {
    let s = setup(
        vec![err(429).header("retry-after", "120"), ok()],
        RetryPolicy::default(),
    )
    .await;
    let e = s
        .provider
        .generate(&request("m"), &|_| {})
        .await
        .unwrap_err();
    assert_eq!(
        e,
        ProviderError::RateLimited {
            retry_after_ms: 120_000
        }
    );
    assert!(e.is_transient());
    assert!(s.clock.sleeps().is_empty(), "no worker waits two minutes");
}

#[tokio::test]
async fn should_retry_header_overrides() {
    // A 429 the provider marks as not retryable is a spending cap: the run pauses.
    let s = setup(
        vec![err(429).header("x-should-retry", "false"), ok()],
        RetryPolicy::default(),
    )
    .await;
    let e = s
        .provider
        .generate(&request("m"), &|_| {})
        .await
        .unwrap_err();
    assert!(matches!(e, ProviderError::SpendCap(_)), "{e:?}");
    assert_eq!(s.server.seen().len(), 1);
    // A 503 marked not retryable is not retried.
    let s = setup(
        vec![
            Reply::json(503, b"{}".to_vec()).header("x-should-retry", "false"),
            ok(),
        ],
        RetryPolicy::default(),
    )
    .await;
    assert!(s.provider.call(&request("m"), &|_| {}).await.is_err());
    assert_eq!(s.server.seen().len(), 1);
    // A 400 marked retryable is retried.
    let s = setup(
        vec![
            Reply::json(400, b"{}".to_vec()).header("x-should-retry", "true"),
            ok(),
        ],
        RetryPolicy::default(),
    )
    .await;
    s.provider.call(&request("m"), &|_| {}).await.unwrap();
    assert_eq!(s.server.seen().len(), 2);
}

#[tokio::test]
async fn spend_cap_is_not_retried() {
    let s = setup(vec![err(402), ok()], RetryPolicy::default()).await;
    let e = s
        .provider
        .generate(&request("m"), &|_| {})
        .await
        .unwrap_err();
    assert!(matches!(e, ProviderError::SpendCap(m) if m.contains("credit balance")));
    assert_eq!(s.server.seen().len(), 1);
    // OpenAI's insufficient_quota 429 likewise.
    let server = Server::replay(vec![
        Reply::json(429, fixture("openai/error_429_quota.json")),
        Reply::sse(fixture("openai/tools.sse")),
    ])
    .await;
    let p = HttpProvider::new(
        OpenAi::default(),
        http_client().unwrap(),
        &server.base,
        None,
    )
    .with_clock(StepClock::at(T0));
    assert!(matches!(
        p.generate(&request("gpt-4o"), &|_| {}).await,
        Err(ProviderError::SpendCap(_))
    ));
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn a_cut_stream_is_retried_and_charged_once() {
    let s = setup(
        vec![
            Reply::sse(fixture("anthropic/cut.sse")),
            Reply::sse(fixture("anthropic/error_after_200.sse")),
            ok(),
        ],
        RetryPolicy::default(),
    )
    .await;
    let r = s.provider.call(&request("m"), &|_| {}).await.unwrap();
    // Only the complete answer's usage is returned (and so charged).
    assert_eq!(
        r.usage,
        glia_proto::Usage {
            input_tokens: 472,
            output_tokens: 61,
            cache_write_tokens: 1830,
            cache_read_tokens: 0,
            estimated: false
        }
    );
    let kinds: Vec<&str> = s
        .events
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.error.kind())
        .collect();
    assert_eq!(kinds, vec!["stream_cut", "overloaded"]);
}

#[tokio::test]
async fn network_errors_are_retried() {
    // A port nobody listens on: bind, read the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let clock = StepClock::at(T0);
    let events = Arc::new(Events::default());
    let p = HttpProvider::new(
        Anthropic::default(),
        http_client().unwrap(),
        &format!("http://127.0.0.1:{port}"),
        None,
    )
    .with_retry(RetryPolicy {
        max_retries: 2,
        ..RetryPolicy::default()
    })
    .with_clock(clock.clone())
    .with_observer(events.clone());
    let e = p.call(&request("m"), &|_| {}).await.unwrap_err();
    assert!(matches!(e, CallError::Network { .. }), "{e:?}");
    assert_eq!(events.0.lock().unwrap().len(), 2);
    assert!(matches!(
        ProviderError::from(e),
        ProviderError::Transient { .. }
    ));
}

#[tokio::test]
async fn retries_are_reported_with_the_answer_and_discarded_live() {
    let s = setup(
        vec![
            err(529).header("retry-after", "2"),
            Reply::sse(fixture("anthropic/cut.sse")),
            ok(),
        ],
        RetryPolicy::default(),
    )
    .await;
    let live = Mutex::new(Vec::new());
    let r = s
        .provider
        .generate(&request("m"), &|e| live.lock().unwrap().push(e))
        .await
        .unwrap();
    let sleeps = s.clock.sleeps();
    assert_eq!(r.retries.len(), 2);
    let summary: Vec<(u32, &str, u64)> = r
        .retries
        .iter()
        .map(|x| (x.attempt, x.cause.as_str(), x.delay_ms))
        .collect();
    assert_eq!(
        summary,
        vec![
            (1, "overloaded", sleeps[0].as_millis() as u64),
            (2, "stream_cut", sleeps[1].as_millis() as u64)
        ]
    );
    assert!(r.retries[0].message.contains("529"), "{:?}", r.retries[0]);
    assert!(
        !r.retries
            .iter()
            .any(|x| x.message.contains("sk-ant-retry-test"))
    );
    // Listeners are told to drop what each failed attempt streamed, before
    // the next attempt's text: the cut stream's text comes before discard 2.
    let live = live.into_inner().unwrap();
    let discards: Vec<usize> = live
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e, LiveEvent::ModelDiscard { .. }))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(discards.len(), 2);
    assert_eq!(
        live[discards[1]],
        LiveEvent::ModelDiscard {
            attempt: 2,
            cause: "stream_cut".into()
        }
    );
    let after: String = live[discards[1]..]
        .iter()
        .filter_map(|e| match e {
            LiveEvent::ModelDelta { channel, delta } if channel == "text" => Some(delta.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(after, r.message.text());
    // `call` reports them the same way.
    let s = setup(
        vec![err(500), ok()],
        RetryPolicy {
            min_delay: Duration::from_millis(10),
            ..RetryPolicy::default()
        },
    )
    .await;
    let r = s.provider.call(&request("m"), &|_| {}).await.unwrap();
    assert_eq!(
        r.retries
            .iter()
            .map(|x| x.cause.as_str())
            .collect::<Vec<_>>(),
        vec!["server"]
    );
}

#[tokio::test]
async fn a_failure_after_retries_says_how_many_attempts_and_keeps_the_hint() {
    let policy = RetryPolicy {
        max_retries: 2,
        min_delay: Duration::from_millis(10),
        ..RetryPolicy::default()
    };
    let s = setup(vec![err(500), err(500), err(500)], policy).await;
    let e = s
        .provider
        .generate(&request("m"), &|_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ProviderError::Transient { message, retry_after_ms: None } if message.ends_with("(after 3 attempts)")),
        "{e:?}"
    );
    // A server error whose hint is too long to wait for in place goes back
    // to the loop with the hint.
    let s = setup(
        vec![err(529).header("retry-after", "300"), ok()],
        RetryPolicy::default(),
    )
    .await;
    let e = s
        .provider
        .generate(&request("m"), &|_| {})
        .await
        .unwrap_err();
    assert_eq!(e.retry_after_ms(), Some(300_000));
    assert!(
        matches!(
            e,
            ProviderError::Transient {
                retry_after_ms: Some(300_000),
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.is_transient());
    assert_eq!(s.server.seen().len(), 1);
}

#[tokio::test]
async fn a_rejected_key_is_not_retried() {
    let s = setup(vec![err(401), ok()], RetryPolicy::default()).await;
    let e = s
        .provider
        .generate(&request("m"), &|_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ProviderError::Auth(m) if m.contains("401")),
        "{e:?}"
    );
    assert!(!e.is_transient());
    assert!(!e.to_string().contains("sk-ant-retry-test"));
    assert_eq!(s.server.seen().len(), 1);
    assert!(s.clock.sleeps().is_empty());
}
