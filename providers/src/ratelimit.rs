//! Fleet-wide provider rate limits: the port an [`HttpProvider`] calls
//! around each attempt ([`Limiter`]), what it draws on, and (with the
//! `redis` feature) the limiter in Redis, `redis_limiter::RateLimiter`.
//!
//! [`HttpProvider`]: crate::http::HttpProvider
//!
//! Every worker shares, per provider, model and API key (a fingerprint of
//! it, never the key), three token buckets: requests, input tokens and
//! output tokens per minute. Buckets refill continuously (capacity per
//! 60 000 ms). Around each attempt:
//!
//! 1. **reserve** (one Lua script): if a cooldown is active, the caller is
//!    told to wait until it ends plus its own slot (`slot × spacing` plus a
//!    jitter below one spacing), so callers resume spread out, never in
//!    lockstep; otherwise, if all three buckets hold the estimated cost, it is
//!    taken; else the caller is told how long until they will.
//! 2. **settle** (one Lua script) after the answer: the reservation is
//!    replaced by the actual usage (unused tokens go back, extra tokens are
//!    owed).
//! 3. **cooldown** (one Lua script) on a 429 with `retry-after`: the key's
//!    cooldown is pushed to at least `now + retry-after`; every worker's next
//!    reservation waits for it.
//!
//! Each reservation carries a request id. The script records its answer
//! under that id, and settlement deletes it, so a script call retried
//! after a lost reply (the connection manager returns the in-flight error)
//! never counts twice. Times come from the caller's [`Clock`] (Unix ms), so
//! tests drive the buckets with a scaled clock.
//!
//! If Redis is unreachable, calls proceed without a permit (logged): losing
//! Redis must not stop the fleet, and the buckets rebuild themselves.

use std::time::Duration;

use async_trait::async_trait;
use glia_proto::Usage;
use glia_proto::provider::ModelRequest;
use sha2::{Digest, Sha256};

use crate::clock::Clock;
use crate::config::ApiKey;
use crate::error::CallError;

/// Per-minute limits of one key. `0` means unlimited for that dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimits {
    /// Requests per minute.
    pub requests_per_minute: u64,
    /// Input tokens per minute (uncached input plus cache writes).
    pub input_tokens_per_minute: u64,
    /// Output tokens per minute.
    pub output_tokens_per_minute: u64,
    /// Gap between the slots of callers resuming after a cooldown, ms;
    /// `None` = 60 000 / requests per minute (at least 1 ms; 100 ms when
    /// requests are unlimited).
    pub resume_spacing_ms: Option<u64>,
}

impl RateLimits {
    /// No cap applies (every per-minute limit is 0).
    pub fn uncapped(&self) -> bool {
        self.requests_per_minute == 0
            && self.input_tokens_per_minute == 0
            && self.output_tokens_per_minute == 0
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn spacing_ms(&self) -> u64 {
        self.resume_spacing_ms
            .unwrap_or(match self.requests_per_minute {
                0 => 100,
                rpm => (60_000 / rpm).max(1),
            })
    }
}

/// Which buckets a call draws from: provider, model, key fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RateKey {
    /// `anthropic` / `openai`.
    pub provider: String,
    /// Model name.
    pub model: String,
    /// First 12 hex digits of SHA-256 of the key, or `nokey`.
    pub key_id: String,
}

impl RateKey {
    /// The key for `provider`, `model` and `key` (fingerprinted).
    pub fn new(provider: &str, model: &str, key: Option<&ApiKey>) -> Self {
        let key_id = key.map_or_else(
            || "nokey".to_owned(),
            |k| {
                Sha256::digest(format!("glia-rate-key:{}", k.expose()).as_bytes())
                    .iter()
                    .take(6)
                    .map(|b| format!("{b:02x}"))
                    .collect()
            },
        );
        RateKey {
            provider: provider.to_owned(),
            model: model.to_owned(),
            key_id,
        }
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn tag(&self) -> String {
        format!("{{{}:{}:{}}}", self.provider, self.model, self.key_id)
    }
}

/// What one call draws from the buckets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateCost {
    /// Requests (1 per attempt).
    pub requests: u64,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
}

impl RateCost {
    /// The estimate reserved before a call: one request, input tokens as
    /// the prompt's JSON bytes / 4 (rounded up), output tokens `max_tokens`.
    pub fn estimate(request: &ModelRequest) -> Self {
        let bytes = request.system.len()
            + serde_json::to_string(&request.messages).map_or(0, |s| s.len())
            + serde_json::to_string(&request.tools).map_or(0, |s| s.len());
        RateCost {
            requests: 1,
            input_tokens: (bytes as u64).div_ceil(4),
            output_tokens: u64::from(request.max_tokens),
        }
    }

    /// What a finished call consumed: uncached input plus cache writes
    /// (cache reads do not count toward input limits), and output.
    pub fn from_usage(usage: &Usage) -> Self {
        RateCost {
            requests: 1,
            input_tokens: usage.input_tokens + usage.cache_write_tokens,
            output_tokens: usage.output_tokens,
        }
    }
}

/// A reservation's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The cost was taken; send the call.
    Granted,
    /// Wait this long, then reserve again (with a new request id).
    Wait(Duration),
}

/// A granted reservation, to be settled after the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permit {
    /// The buckets.
    pub key: RateKey,
    /// The reservation's request id.
    pub request_id: String,
    /// What was reserved.
    pub cost: RateCost,
}

/// What an [`HttpProvider`](crate::http::HttpProvider) asks of a rate
/// limiter around each attempt: a permit before it (waiting as told), the
/// actual cost after it, and a cooldown on a 429 with `retry-after`. The
/// fleet's is `redis_limiter::RateLimiter` (Redis, with the `redis` feature).
#[async_trait]
pub trait Limiter: Send + Sync + std::fmt::Debug {
    /// Reserve `cost`, waiting on `clock` as told, for at most `max_wait`.
    /// Returns the permit (`None`: the call goes ahead unlimited) and the
    /// time waited.
    ///
    /// Errors: [`CallError::WaitTooLong`] when the next wait would pass
    /// `max_wait`.
    async fn acquire(
        &self,
        key: &RateKey,
        request_id: &str,
        cost: RateCost,
        clock: &dyn Clock,
        max_wait: Duration,
    ) -> Result<(Option<Permit>, Duration), CallError>;

    /// Replace `permit`'s reservation by `actual`; a failure is logged.
    async fn settle_quietly(&self, permit: &Permit, actual: RateCost, now_ms: u64);

    /// Start (or extend) the cooldown of `key` to `now_ms + wait`; a
    /// failure is logged.
    async fn cooldown_quietly(&self, key: &RateKey, wait: Duration, now_ms: u64);
}
