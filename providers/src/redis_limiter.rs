//! The fleet-wide limiter in Redis (three Lua scripts; the algorithm and
//! the [`Limiter`] port are in
//! [`crate::ratelimit`]).

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{RedisError, Script};

use crate::clock::Clock;
use crate::error::CallError;
use crate::ratelimit::{Admission, Limiter, Permit, RateCost, RateKey, RateLimits};

/// Talking to Redis failed.
#[derive(Debug, thiserror::Error)]
pub enum RateLimitError {
    /// Connecting or a command failed (after retries).
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    /// A script answered something unexpected.
    #[error("unexpected rate limiter reply: {0}")]
    Reply(String),
}

const RESERVE: &str = r"
local now = tonumber(ARGV[1])
local prev = redis.call('HGET', KEYS[3], 'result')
if prev then
  return {prev, tonumber(redis.call('HGET', KEYS[3], 'wait'))}
end
local caps = {tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])}
local need = {tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])}
local spacing, jitter, ttl = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local function remember(result, wait)
  wait = math.ceil(wait)
  redis.call('HSET', KEYS[3], 'result', result, 'wait', wait, 'r', need[1], 'i', need[2], 'o', need[3])
  if result == 'wait' then
    redis.call('PEXPIRE', KEYS[3], math.min(ttl, wait + 60000))
  else
    redis.call('PEXPIRE', KEYS[3], ttl)
  end
  return {result, wait}
end
local till = tonumber(redis.call('HGET', KEYS[2], 'until') or '0')
if till > now then
  local slot = redis.call('HINCRBY', KEYS[2], 'seq', 1) - 1
  return remember('wait', till - now + slot * spacing + jitter)
end
local fields = {'r', 'i', 'o'}
local ts = tonumber(redis.call('HGET', KEYS[1], 'ts') or now)
local elapsed = math.max(0, now - ts)
local level = {}
local wait = 0
for k = 1, 3 do
  local cap = caps[k]
  if cap > 0 then
    local cur = tonumber(redis.call('HGET', KEYS[1], fields[k]) or cap)
    cur = math.min(cap, cur + elapsed * cap / 60000)
    level[k] = cur
    local n = math.min(need[k], cap)
    if cur < n then wait = math.max(wait, (n - cur) * 60000 / cap) end
  end
end
if wait > 0 then
  return remember('wait', wait + jitter)
end
for k = 1, 3 do
  if caps[k] > 0 then redis.call('HSET', KEYS[1], fields[k], level[k] - math.min(need[k], caps[k])) end
end
redis.call('HSET', KEYS[1], 'ts', math.max(ts, now))
redis.call('PEXPIRE', KEYS[1], 120000)
return remember('granted', 0)
";

const SETTLE: &str = r"
local rec = redis.call('HMGET', KEYS[2], 'result', 'settled', 'r', 'i', 'o')
if rec[1] ~= 'granted' or rec[2] then return 0 end
redis.call('DEL', KEYS[2])
local fields = {'r', 'i', 'o'}
for k = 1, 3 do
  local cap = tonumber(ARGV[k])
  local cur = tonumber(redis.call('HGET', KEYS[1], fields[k]) or 'nil')
  if cap > 0 and cur then
    local reserved = math.min(tonumber(rec[2 + k]), cap)
    local actual = tonumber(ARGV[3 + k])
    redis.call('HSET', KEYS[1], fields[k], math.max(-cap, math.min(cap, cur + reserved - actual)))
  end
end
return 1
";

const COOLDOWN: &str = r"
local now = tonumber(ARGV[1])
local wanted = now + tonumber(ARGV[2])
local till = tonumber(redis.call('HGET', KEYS[1], 'until') or '0')
if till <= now then redis.call('HSET', KEYS[1], 'seq', 0) end
if wanted > till then
  redis.call('HSET', KEYS[1], 'until', wanted)
  till = wanted
end
redis.call('PEXPIRE', KEYS[1], till - now + 60000)
return till
";

/// How long a granted reservation's record is kept for its settlement
/// (which deletes it) and for idempotent retries, ms; a `wait` answer's
/// record lasts the wait and a minute more.
const RECORD_TTL_MS: u64 = 15 * 60 * 1000;
/// How long a key's cooldown, once read, is taken as known when no cap
/// applies to it, ms.
const COOLDOWN_READ_EVERY_MS: u64 = 1000;

/// A cooldown as last read: clock ms then, the instant then, its end (clock ms).
type Known = (u64, std::time::Instant, u64);
/// Script calls are retried this many times with the same request id.
const SCRIPT_TRIES: usize = 3;

/// The fleet-wide limiter. Cheap to share behind an `Arc`.
#[derive(Clone)]
pub struct RateLimiter {
    conn: ConnectionManager,
    prefix: String,
    default: RateLimits,
    overrides: HashMap<(String, String), RateLimits>,
    reserve: Script,
    settle: Script,
    cooldown: Script,
    /// Uncapped keys' cooldowns as last read: cooldown key → (read at, clock
    /// ms; read at, monotonic; ends at, clock ms).
    cooldowns: std::sync::Arc<std::sync::Mutex<HashMap<String, Known>>>,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("prefix", &self.prefix)
            .field("default", &self.default)
            .finish_non_exhaustive()
    }
}

impl RateLimiter {
    /// Connect to `url` (e.g. `redis://127.0.0.1:6379`); every key starts
    /// with `prefix`; `limits` apply to every provider and model without an
    /// override.
    ///
    /// Errors: [`RateLimitError::Redis`] when the URL is bad or the server
    /// cannot be reached.
    pub async fn connect(
        url: &str,
        prefix: impl Into<String>,
        limits: RateLimits,
    ) -> Result<Self, RateLimitError> {
        let client = redis::Client::open(url)?;
        let conn = ConnectionManager::new(client).await?;
        Ok(RateLimiter {
            conn,
            prefix: prefix.into(),
            default: limits,
            overrides: HashMap::new(),
            reserve: Script::new(RESERVE),
            settle: Script::new(SETTLE),
            cooldown: Script::new(COOLDOWN),
            cooldowns: Default::default(),
        })
    }

    /// Use `limits` for `provider` / `model`.
    pub fn with_model_limits(mut self, provider: &str, model: &str, limits: RateLimits) -> Self {
        self.overrides
            .insert((provider.to_owned(), model.to_owned()), limits);
        self
    }

    /// The limits of `key`.
    pub fn limits(&self, key: &RateKey) -> RateLimits {
        self.overrides
            .get(&(key.provider.clone(), key.model.clone()))
            .copied()
            .unwrap_or(self.default)
    }

    fn keys(&self, key: &RateKey) -> (String, String) {
        let base = format!("{}rl:{}", self.prefix, key.tag());
        (format!("{base}:bucket"), format!("{base}:cooldown"))
    }

    fn record_key(&self, key: &RateKey, request_id: &str) -> String {
        format!("{}rl:{}:req:{request_id}", self.prefix, key.tag())
    }

    /// Run a script, retrying with the same arguments when the connection
    /// drops (the scripts are idempotent per request id).
    async fn run<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[u64],
    ) -> Result<T, RateLimitError> {
        let mut last = None;
        for _ in 0..SCRIPT_TRIES {
            let mut inv = script.prepare_invoke();
            for k in keys {
                inv.key(*k);
            }
            for a in args {
                inv.arg(*a);
            }
            let mut conn = self.conn.clone();
            match inv.invoke_async::<T>(&mut conn).await {
                Ok(v) => return Ok(v),
                Err(e) if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() => {
                    last = Some(e)
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(last.map_or_else(
            || RateLimitError::Reply("no attempt".into()),
            RateLimitError::Redis,
        ))
    }

    /// One reservation attempt at `now_ms` (Unix ms). `jitter_ms` (below
    /// one resume spacing) is added to any wait. Retrying with the same
    /// `request_id` returns the first answer and takes nothing again.
    pub async fn reserve(
        &self,
        key: &RateKey,
        request_id: &str,
        cost: RateCost,
        now_ms: u64,
        jitter_ms: u64,
    ) -> Result<Admission, RateLimitError> {
        let limits = self.limits(key);
        let (bucket, cooldown) = self.keys(key);
        let record = self.record_key(key, request_id);
        let args = [
            now_ms,
            limits.requests_per_minute,
            limits.input_tokens_per_minute,
            limits.output_tokens_per_minute,
            cost.requests,
            cost.input_tokens,
            cost.output_tokens,
            limits.spacing_ms(),
            jitter_ms,
            RECORD_TTL_MS,
        ];
        let (result, wait): (String, u64) = self
            .run(&self.reserve, &[&bucket, &cooldown, &record], &args)
            .await?;
        match result.as_str() {
            "granted" => Ok(Admission::Granted),
            "wait" => Ok(Admission::Wait(Duration::from_millis(wait.max(1)))),
            other => Err(RateLimitError::Reply(other.to_owned())),
        }
    }

    /// Reserve `cost`, waiting on `clock` as told, for at most `max_wait`.
    /// Returns the permit (`None` when Redis is unreachable: the call goes
    /// ahead unlimited) and the time waited.
    ///
    /// Errors: [`CallError::WaitTooLong`] when the next wait would pass
    /// `max_wait`; the run is retried later instead of holding a worker.
    pub async fn acquire(
        &self,
        key: &RateKey,
        request_id: &str,
        cost: RateCost,
        clock: &dyn Clock,
        max_wait: Duration,
    ) -> Result<(Option<Permit>, Duration), CallError> {
        let limits = self.limits(key);
        // No cap applies: nothing is reserved or recorded, and no permit is
        // settled. Only a cooldown (a provider's `retry-after`, set by any
        // worker) holds the call, read at most once a second per key; during
        // one, callers take their slots through the reservation below.
        if limits.uncapped() {
            match self.cooldown_until(key, clock.now_ms()).await {
                Ok(till) if till <= clock.now_ms() => return Ok((None, Duration::ZERO)),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "rate limiter unavailable; calling without a permit");
                    return Ok((None, Duration::ZERO));
                }
            }
        }
        let spacing = limits.spacing_ms();
        let mut waited = Duration::ZERO;
        for round in 0u32.. {
            let id = format!("{request_id}:{round}");
            match self
                .reserve(key, &id, cost, clock.now_ms(), fastrand::u64(0..spacing))
                .await
            {
                Ok(Admission::Granted) => {
                    return Ok((
                        Some(Permit {
                            key: key.clone(),
                            request_id: id,
                            cost,
                        }),
                        waited,
                    ));
                }
                Ok(Admission::Wait(wait)) => {
                    if waited + wait > max_wait {
                        return Err(CallError::WaitTooLong { wait });
                    }
                    clock.sleep(wait).await;
                    waited += wait;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "rate limiter unavailable; calling without a permit");
                    return Ok((None, waited));
                }
            }
        }
        unreachable!("the reservation loop only ends by returning")
    }

    /// Replace `permit`'s reservation by `actual`. Returns false when it was
    /// already settled (a retried settlement) or unknown.
    pub async fn settle(
        &self,
        permit: &Permit,
        actual: RateCost,
        now_ms: u64,
    ) -> Result<bool, RateLimitError> {
        let _ = now_ms;
        let limits = self.limits(&permit.key);
        let (bucket, _) = self.keys(&permit.key);
        let record = self.record_key(&permit.key, &permit.request_id);
        let args = [
            limits.requests_per_minute,
            limits.input_tokens_per_minute,
            limits.output_tokens_per_minute,
            actual.requests,
            actual.input_tokens,
            actual.output_tokens,
        ];
        let n: i64 = self.run(&self.settle, &[&bucket, &record], &args).await?;
        Ok(n == 1)
    }

    /// Start (or extend) the cooldown of `key` to `now_ms + wait`. Returns
    /// the cooldown's end, Unix ms.
    pub async fn cooldown(
        &self,
        key: &RateKey,
        wait: Duration,
        now_ms: u64,
    ) -> Result<u64, RateLimitError> {
        let (_, cooldown) = self.keys(key);
        let till: u64 = self
            .run(
                &self.cooldown,
                &[&cooldown],
                &[now_ms, u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)],
            )
            .await?;
        self.remember(cooldown, now_ms, till);
        Ok(till)
    }

    /// When the cooldown of `key` ends (Unix ms; 0 for none), as read from
    /// Redis at most every [`COOLDOWN_READ_EVERY_MS`] (of clock time and of
    /// real time both: a test clock that stands still reads again).
    async fn cooldown_until(&self, key: &RateKey, now_ms: u64) -> Result<u64, RateLimitError> {
        let (_, cooldown) = self.keys(key);
        let known = self
            .cooldowns
            .lock()
            .expect("the cooldown cache is never poisoned")
            .get(&cooldown)
            .copied();
        if let Some((read_at, read_when, till)) = known
            && now_ms >= read_at
            && now_ms - read_at < COOLDOWN_READ_EVERY_MS
            && read_when.elapsed() < Duration::from_millis(COOLDOWN_READ_EVERY_MS)
        {
            return Ok(till);
        }
        let mut conn = self.conn.clone();
        let till: Option<u64> = redis::cmd("HGET")
            .arg(&cooldown)
            .arg("until")
            .query_async(&mut conn)
            .await?;
        Ok(self.remember(cooldown, now_ms, till.unwrap_or(0)))
    }

    /// Keep what is known of a cooldown (a cooldown only grows while it
    /// lasts, so a read that finishes after a newer end was stored keeps
    /// the later end); answers the end kept.
    fn remember(&self, cooldown: String, now_ms: u64, till: u64) -> u64 {
        let mut known = self
            .cooldowns
            .lock()
            .expect("the cooldown cache is never poisoned");
        // Bounded: keys come from run configs' model names.
        if known.len() >= 4096 && !known.contains_key(&cooldown) {
            known.clear();
        }
        let till = known.get(&cooldown).map_or(till, |k| k.2.max(till));
        known.insert(cooldown, (now_ms, std::time::Instant::now(), till));
        till
    }

    /// How long the cooldown of `key` still lasts at `now_ms`, if any.
    pub async fn cooldown_remaining(
        &self,
        key: &RateKey,
        now_ms: u64,
    ) -> Result<Option<Duration>, RateLimitError> {
        let (_, cooldown) = self.keys(key);
        let mut conn = self.conn.clone();
        let till: Option<u64> = redis::cmd("HGET")
            .arg(&cooldown)
            .arg("until")
            .query_async(&mut conn)
            .await?;
        Ok(till
            .filter(|t| *t > now_ms)
            .map(|t| Duration::from_millis(t - now_ms)))
    }
}

#[async_trait]
impl Limiter for RateLimiter {
    async fn acquire(
        &self,
        key: &RateKey,
        request_id: &str,
        cost: RateCost,
        clock: &dyn Clock,
        max_wait: Duration,
    ) -> Result<(Option<Permit>, Duration), CallError> {
        RateLimiter::acquire(self, key, request_id, cost, clock, max_wait).await
    }

    async fn settle_quietly(&self, permit: &Permit, actual: RateCost, now_ms: u64) {
        if let Err(e) = self.settle(permit, actual, now_ms).await {
            tracing::warn!(error = %e, "rate limiter settlement failed");
        }
    }

    async fn cooldown_quietly(&self, key: &RateKey, wait: Duration, now_ms: u64) {
        if let Err(e) = self.cooldown(key, wait, now_ms).await {
            tracing::warn!(error = %e, "rate limiter cooldown failed");
        }
    }
}
