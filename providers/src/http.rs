//! The HTTP engine both adapters share: send one request, classify failures,
//! retry with backoff (backon) honouring the provider's wait hints, take
//! fleet-wide rate-limit permits around every attempt, count metrics.
//!
//! A wire format ([`Wire`]) only builds request bodies and decodes answers;
//! everything about transport, retries and rate limits lives here, so the two
//! adapters behave the same way.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use glia_proto::provider::{ModelRequest, ModelResponse, Provider, ProviderError};
use glia_proto::{LiveEvent, Pricing, Retry, Usage};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use crate::clock::{Clock, SystemClock};
use crate::config::{ApiKey, redact};
use crate::error::{CallError, Failure, retry_after, should_retry};
use crate::metrics::ProviderMetrics;
use crate::pricing::PriceTable;
use crate::ratelimit::{Limiter, RateCost, RateKey};

/// The live-delta callback of [`Provider::generate`].
pub type LiveFn<'a> = dyn Fn(LiveEvent) + Send + Sync + 'a;

/// A response body as a stream of byte chunks (split anywhere).
pub type ByteStream<'a> = BoxStream<'a, Result<Bytes, CallError>>;

/// One provider's wire format: request bodies and response decoding.
pub trait Wire: Send + Sync + 'static {
    /// `anthropic` or `openai`: the provider label of metrics, prices and
    /// rate-limit keys.
    fn provider(&self) -> &'static str;
    /// The endpoint for `base` (no trailing slash).
    fn url(&self, base: &str) -> String;
    /// Auth and version headers. `key` is `None` for keyless local servers.
    fn headers(&self, key: Option<&ApiKey>) -> Vec<(HeaderName, HeaderValue)>;
    /// The JSON body for `request`; `stream` asks for server-sent events.
    fn body(&self, request: &ModelRequest, stream: bool) -> Value;
    /// Decode a complete (non-streaming) JSON answer. Usage the answer did
    /// not carry is returned marked [`Usage::estimated`] with those counts
    /// at zero; the engine estimates them ([`crate::estimate::fill_missing`]).
    fn decode_body(&self, body: &[u8]) -> Result<ModelResponse, CallError>;
    /// Decode a server-sent-event answer, calling `live` with each delta.
    fn decode_stream<'a>(
        &'a self,
        chunks: ByteStream<'a>,
        live: &'a LiveFn<'a>,
    ) -> BoxFuture<'a, Result<ModelResponse, CallError>>;
}

/// How failed attempts are retried.
///
/// Delays grow exponentially from `min_delay` (factor 2, full jitter) up to
/// `max_delay`; a provider hint (`retry-after`, `retry-after-ms`) replaces
/// the computed delay, plus up to 10 % jitter so callers do not retry in
/// lockstep. A hint longer than `max_hinted_wait`, or a wait that would take
/// the call past `max_total_wait`, ends the retries: the error goes back to
/// the loop (a rate limit keeps its wait, so the run is re-queued for later
/// and no worker sits idle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (the retry budget of one call).
    pub max_retries: u32,
    /// First backoff delay.
    pub min_delay: Duration,
    /// Largest backoff delay.
    pub max_delay: Duration,
    /// Longest provider-hinted wait honoured in place.
    pub max_hinted_wait: Duration,
    /// Longest total time spent waiting between attempts of one call.
    pub max_total_wait: Duration,
}

impl Default for RetryPolicy {
    /// 4 retries, 0.5 s to 20 s backoff, hints up to 60 s, 120 s in all.
    fn default() -> Self {
        RetryPolicy {
            max_retries: 4,
            min_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(20),
            max_hinted_wait: Duration::from_secs(60),
            max_total_wait: Duration::from_secs(120),
        }
    }
}

/// A failed attempt that will be retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryEvent {
    /// `anthropic` / `openai`.
    pub provider: &'static str,
    /// Model of the call.
    pub model: String,
    /// The attempt that failed, from 1.
    pub attempt: u32,
    /// Why it failed.
    pub error: CallError,
    /// Wait before the next attempt.
    pub delay: Duration,
}

/// Sees what happens inside one call: retries and rate-limit waits, for
/// logs and tests. (The loop records retries from
/// [`ModelResponse::retries`].)
pub trait CallObserver: Send + Sync {
    /// An attempt failed and will be retried after `event.delay`.
    fn retry(&self, event: &RetryEvent) {
        let _ = event;
    }
    /// The fleet rate limiter made the call wait.
    fn rate_limit_wait(&self, provider: &'static str, model: &str, wait: Duration) {
        let _ = (provider, model, wait);
    }
}

/// A provider over HTTP: one [`Wire`] format plus transport, retries, rate
/// limits and metrics. Built by [`crate::from_config`], or directly with
/// [`HttpProvider::new`] and the `with_*` methods.
pub struct HttpProvider<W> {
    wire: W,
    client: reqwest::Client,
    url: String,
    key: Option<ApiKey>,
    model: Option<String>,
    stream: bool,
    retry: RetryPolicy,
    clock: Arc<dyn Clock>,
    limiter: Option<Arc<dyn Limiter>>,
    observer: Option<Arc<dyn CallObserver>>,
    metrics: Option<ProviderMetrics>,
    prices: Option<Arc<PriceTable>>,
}

impl<W: Wire> std::fmt::Debug for HttpProvider<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpProvider")
            .field("provider", &self.wire.provider())
            .field("url", &self.url)
            .field("key", &self.key)
            .field("model", &self.model)
            .field("stream", &self.stream)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

/// A reqwest client with the adapters' timeouts: 10 s to connect, 300 s
/// without a byte while reading.
pub fn http_client() -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(300))
        .build()
}

impl<W: Wire> HttpProvider<W> {
    /// A streaming provider for `wire` at `base_url` (no trailing slash)
    /// with the default retry policy, no rate limiter, the system clock.
    pub fn new(wire: W, client: reqwest::Client, base_url: &str, key: Option<ApiKey>) -> Self {
        let url = wire.url(base_url.trim_end_matches('/'));
        HttpProvider {
            wire,
            client,
            url,
            key,
            model: None,
            stream: true,
            retry: RetryPolicy::default(),
            clock: Arc::new(SystemClock),
            limiter: None,
            observer: None,
            metrics: None,
            prices: None,
        }
    }

    /// Stream (default) or ask for one JSON answer.
    pub fn streaming(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// Use `model` for every request instead of the run's.
    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Retry with `policy`.
    pub fn with_retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Take time and sleeps from `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Take a fleet-wide permit before every attempt.
    pub fn with_rate_limiter(mut self, limiter: Arc<dyn Limiter>) -> Self {
        self.limiter = Some(limiter);
        self
    }

    /// Report retries and waits to `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn CallObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Count requests, retries, tokens and waits in `metrics`.
    pub fn with_metrics(mut self, metrics: ProviderMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Price calls with `table` when a run's config has no pricing
    /// ([`Provider::pricing`]).
    pub fn with_prices(mut self, table: PriceTable) -> Self {
        self.prices = Some(Arc::new(table));
        self
    }

    /// The endpoint URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The wire format.
    pub fn wire(&self) -> &W {
        &self.wire
    }

    /// The rate-limit key of calls to `model`: provider, model and a
    /// fingerprint of the API key (never the key).
    pub fn rate_key(&self, model: &str) -> RateKey {
        RateKey::new(self.wire.provider(), model, self.key.as_ref())
    }

    /// Send `request`, retrying per the policy. Each failed attempt that is
    /// retried is listed in the answer's [`ModelResponse::retries`] and
    /// streamed as a [`LiveEvent::ModelDiscard`]. Errors are typed
    /// [`CallError`]s; [`Provider::generate`] converts them.
    pub async fn call(
        &self,
        request: &ModelRequest,
        live: &LiveFn<'_>,
    ) -> Result<ModelResponse, CallError> {
        let retries = Mutex::new(Vec::new());
        let result = self.call_recording(request, live, &retries).await;
        result.map(|mut r| {
            r.retries = retries
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            r
        })
    }

    /// [`HttpProvider::call`], collecting the retries in `retries`.
    async fn call_recording(
        &self,
        request: &ModelRequest,
        live: &LiveFn<'_>,
        retries: &Mutex<Vec<Retry>>,
    ) -> Result<ModelResponse, CallError> {
        let mut owned;
        let request = match &self.model {
            Some(m) if *m != request.model => {
                owned = request.clone();
                owned.model.clone_from(m);
                &owned
            }
            _ => request,
        };
        let provider = self.wire.provider();
        let result = self.retrying(request, live, retries).await;
        if let Some(m) = &self.metrics {
            m.request(
                provider,
                &request.model,
                result.as_ref().err().map_or("ok", CallError::kind),
            );
            if let Ok(r) = &result {
                m.tokens(provider, &request.model, &r.usage);
            }
        }
        result
    }

    /// The backon retry loop around [`HttpProvider::attempt`], boxed here
    /// (outside any `async fn`) so the future is provably `Send`.
    fn retrying<'a>(
        &'a self,
        request: &'a ModelRequest,
        live: &'a LiveFn<'a>,
        retries: &'a Mutex<Vec<Retry>>,
    ) -> BoxFuture<'a, Result<ModelResponse, CallError>> {
        let provider = self.wire.provider();
        let call_id: Arc<str> =
            format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..)).into();
        let attempt = Arc::new(AtomicU32::new(0));
        let failed = attempt.clone();
        let waited_ms = AtomicU64::new(0);
        let policy = self.retry;
        let backoff = ExponentialBuilder::default()
            .with_min_delay(policy.min_delay)
            .with_max_delay(policy.max_delay)
            .with_factor(2.0)
            .with_jitter()
            .with_max_times(policy.max_retries as usize);
        let clock = self.clock.clone();
        let future = (move || {
            let n = attempt.fetch_add(1, Ordering::SeqCst) + 1;
            self.attempt(request, call_id.clone(), n, live)
        })
        .retry(backoff)
        .sleep(move |d: Duration| clock.sleep(d))
        .when(|e: &CallError| e.is_retryable())
        .adjust(move |e: &CallError, computed: Option<Duration>| {
            let computed = computed?;
            let delay = match e.retry_after() {
                Some(hint) if hint > policy.max_hinted_wait => return None,
                Some(hint) => {
                    hint + Duration::from_millis(fastrand::u64(
                        0..=(hint.as_millis() as u64 / 10).min(1000),
                    ))
                }
                None => computed,
            };
            let total = waited_ms.load(Ordering::SeqCst) + delay.as_millis() as u64;
            if total > policy.max_total_wait.as_millis() as u64 {
                return None;
            }
            waited_ms.store(total, Ordering::SeqCst);
            Some(delay)
        })
        .notify(move |e: &CallError, delay: Duration| {
            let event = RetryEvent {
                provider,
                model: request.model.clone(),
                attempt: failed.load(Ordering::SeqCst),
                error: e.clone(),
                delay,
            };
            tracing::warn!(
                provider,
                model = request.model.as_str(),
                attempt = event.attempt,
                error = e.to_string().as_str(),
                delay_ms = delay.as_millis() as u64,
                "model call failed; retrying"
            );
            if let Some(m) = &self.metrics {
                m.retry(provider, &request.model, e.kind());
            }
            if let Some(o) = &self.observer {
                o.retry(&event);
            }
            let retry = Retry {
                attempt: event.attempt,
                cause: e.kind().to_owned(),
                message: e.to_string(),
                delay_ms: u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            };
            live(LiveEvent::ModelDiscard {
                attempt: retry.attempt,
                cause: retry.cause.clone(),
            });
            retries
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(retry);
        });
        Box::pin(future)
    }

    /// One attempt: a rate-limit permit, the HTTP exchange, settlement.
    fn attempt<'a>(
        &'a self,
        request: &'a ModelRequest,
        call_id: Arc<str>,
        n: u32,
        live: &'a LiveFn<'a>,
    ) -> BoxFuture<'a, Result<ModelResponse, CallError>> {
        Box::pin(async move {
            let permit = match &self.limiter {
                Some(limiter) => {
                    let key = self.rate_key(&request.model);
                    let cost = RateCost::estimate(request);
                    let id = format!("{call_id}:{n}");
                    let (permit, waited) = limiter
                        .acquire(&key, &id, cost, &*self.clock, self.retry.max_hinted_wait)
                        .await?;
                    if !waited.is_zero() {
                        if let Some(m) = &self.metrics {
                            m.rate_limit_wait(self.wire.provider(), &request.model, waited);
                        }
                        if let Some(o) = &self.observer {
                            o.rate_limit_wait(self.wire.provider(), &request.model, waited);
                        }
                    }
                    Some((limiter.clone(), key, permit))
                }
                None => None,
            };
            let result = self.exchange(request, live).await;
            let Some((limiter, key, permit)) = permit else {
                return result;
            };
            // A 429's `retry-after` holds every worker's calls of the key,
            // whether or not this call needed a permit (a key with no cap
            // takes none).
            if let Err(CallError::RateLimited {
                retry_after: Some(wait),
                ..
            }) = &result
            {
                limiter
                    .cooldown_quietly(&key, *wait, self.clock.now_ms())
                    .await;
            }
            if let Some(permit) = permit {
                // Charge what the provider consumed: the answer's usage; for a
                // cut stream the input it read; nothing for a refused request.
                let used = match &result {
                    Ok(r) => RateCost::from_usage(&r.usage),
                    Err(CallError::StreamCut { .. } | CallError::Network { .. }) => RateCost {
                        requests: 1,
                        input_tokens: permit.cost.input_tokens,
                        output_tokens: 0,
                    },
                    Err(_) => RateCost {
                        requests: 1,
                        input_tokens: 0,
                        output_tokens: 0,
                    },
                };
                limiter
                    .settle_quietly(&permit, used, self.clock.now_ms())
                    .await;
            }
            result
        })
    }

    /// The HTTP exchange: status, error body, or the decoded answer.
    async fn exchange(
        &self,
        request: &ModelRequest,
        live: &LiveFn<'_>,
    ) -> Result<ModelResponse, CallError> {
        let key = self.key.as_ref();
        let network = |e: reqwest::Error| CallError::Network {
            message: redact(key, &error_chain(&e)),
        };
        let mut builder = self
            .client
            .post(&self.url)
            .json(&self.wire.body(request, self.stream));
        for (name, value) in self.wire.headers(key) {
            builder = builder.header(name, value);
        }
        let response = builder.send().await.map_err(network)?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        if !response.status().is_success() {
            let body = response.bytes().await.unwrap_or_default();
            return Err(failure(status, &headers, &body, key, self.clock.now_ms()).classify());
        }
        let is_sse = headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut answer = if self.stream && is_sse {
            let chunks = response.bytes_stream().map_err(network).boxed();
            self.wire.decode_stream(chunks, live).await?
        } else {
            let body = response.bytes().await.map_err(network)?;
            self.wire.decode_body(&body)?
        };
        // Counts the provider did not report are estimated (marked so).
        crate::estimate::fill_missing(&mut answer.usage, request, &answer.message);
        Ok(answer)
    }
}

#[async_trait::async_trait]
impl<W: Wire> Provider for HttpProvider<W> {
    /// [`HttpProvider::call`], with its error converted; a transient error
    /// or a malformed answer that survived retries says how many attempts
    /// were made.
    async fn generate(
        &self,
        request: &ModelRequest,
        live: &(dyn Fn(LiveEvent) + Send + Sync),
    ) -> Result<ModelResponse, ProviderError> {
        let retries = Mutex::new(Vec::new());
        let result = self.call_recording(request, live, &retries).await;
        let retries = retries
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match result {
            Ok(mut r) => {
                r.retries = retries;
                Ok(r)
            }
            Err(e) => {
                let mut e = ProviderError::from(e);
                if let ProviderError::Transient { message, .. } | ProviderError::Malformed(message) =
                    &mut e
                    && !retries.is_empty()
                {
                    message.push_str(&format!(" (after {} attempts)", retries.len() + 1));
                }
                Err(e)
            }
        }
    }

    /// The price table's entry for this provider and the model the call
    /// uses (the configured override, else `model`).
    fn pricing(&self, model: &str) -> Option<Pricing> {
        self.prices
            .as_ref()?
            .pricing(self.wire.provider(), self.model.as_deref().unwrap_or(model))
    }
}

/// A transport error with its sources, e.g. "error sending request: connection refused".
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Read a provider error body. Shapes understood: Anthropic `{"type":
/// "error", "error": {"type", "message"}}`, OpenAI `{"error": {"message",
/// "type", "code"}}`, vLLM `{"object": "error", "message", "type", "code"}`,
/// and plain text.
pub(crate) fn failure(
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
    key: Option<&ApiKey>,
    now_ms: u64,
) -> Failure {
    let mut f = error_object(body);
    f.status = status;
    f.retry_after = retry_after(headers, now_ms);
    f.should_retry = should_retry(headers);
    if f.message.is_empty() {
        f.message = format!("HTTP {status}");
    }
    f.message = redact(key, &f.message);
    f
}

/// The error type, code and message of an error JSON (see [`failure`]).
pub(crate) fn error_object(body: &[u8]) -> Failure {
    let text = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => {
            let e = match v.get("error") {
                Some(e @ Value::Object(_)) => e,
                _ => &v,
            };
            let message = e
                .get("message")
                .and_then(text)
                .or_else(|| v.get("error").and_then(text))
                .unwrap_or_default();
            Failure {
                error_type: e.get("type").and_then(text),
                code: e.get("code").and_then(text),
                message,
                ..Failure::default()
            }
        }
        Err(_) => {
            let s = String::from_utf8_lossy(body);
            Failure {
                message: s.chars().take(500).collect(),
                ..Failure::default()
            }
        }
    }
}

/// A stream-decoding error for a missing completion marker.
pub(crate) fn cut(what: &str) -> CallError {
    CallError::StreamCut {
        message: what.to_owned(),
    }
}

/// A stream that breaks its grammar: [`CallError::Malformed`].
pub(crate) fn malformed(what: impl Into<String>) -> CallError {
    CallError::Malformed {
        message: what.into(),
    }
}

/// Parse an SSE `data:` payload as JSON.
pub(crate) fn json_event(data: &str) -> Result<Value, CallError> {
    serde_json::from_str(data).map_err(|e| CallError::InvalidResponse {
        message: format!(
            "event data is not JSON ({e}): {}",
            data.chars().take(200).collect::<String>()
        ),
    })
}

/// Server-sent events of `chunks`, decoded with eventsource-stream (UTF-8
/// reassembly across chunks included). Transport errors stay `CallError`s;
/// malformed framing is an [`CallError::InvalidResponse`].
pub(crate) fn sse(
    chunks: ByteStream<'_>,
) -> BoxStream<'_, Result<eventsource_stream::Event, CallError>> {
    use eventsource_stream::{EventStreamError, Eventsource};
    chunks
        .eventsource()
        .map(|r| {
            r.map_err(|e| match e {
                EventStreamError::Transport(e) => e,
                EventStreamError::Utf8(e) => CallError::InvalidResponse {
                    message: format!("stream is not UTF-8: {e}"),
                },
                EventStreamError::Parser(e) => CallError::InvalidResponse {
                    message: format!("malformed event stream: {e}"),
                },
            })
        })
        .boxed()
}

/// Usage with every field at least zero; a helper for adapters.
pub(crate) fn usage(input: u64, output: u64, cache_write: u64, cache_read: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cache_write_tokens: cache_write,
        cache_read_tokens: cache_read,
        estimated: false,
    }
}
