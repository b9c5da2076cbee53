//! The Redis adapter of [`Ledger`]: cancellation flags, live deltas and
//! budget counters.
//!
//! # Keys and channels
//!
//! Everything lives under a key prefix `P` ([`RedisLedger::connect`]):
//!
//! | name | kind | holds |
//! |---|---|---|
//! | `P:cancel:{run_id}` | string key, TTL ([`RedisLedger::with_cancel_ttl`], default 7 days) | `1` while the run is flagged cancelled |
//! | `P:pause:{run_id}` | string key, the cancel flag's TTL | `1` while the run is flagged for an operator pause |
//! | `P:cancelled` | pub/sub channel | a run's id (text) each time it is cancelled |
//! | `P:live:{run_id}` | pub/sub channel | the run's [`LiveEvent`]s as JSON |
//! | `P:budget:{scope}` | hash, TTL given to [`Ledger::seed`] | a budget scope's counter and the request ids it has seen |
//! | `P:held:{idempotency_key}` | string key, TTL [`crate::HELD_RESULT_TTL`] (7 days) | a tool call's [`HeldResult`] as JSON, from the moment it exists until it is in the log ([`Ledger::hold_results`]); the key is `{run_id}:{turn}:{call_id}` |
//!
//! Redis is not the truth: a cancellation is also recorded in the run's log,
//! so a flag lost with a flushed or restarted Redis only delays it; a budget
//! counter is rebuilt from the log. A held tool result lost with Redis
//! matters only if its commit to the log also failed: the call is then
//! treated as interrupted (see `docs/held-results.md`).
//!
//! # Budget counters
//!
//! A scope's hash has the fields `tokens` and `cost` (the counter, decimal
//! integers) and one field `req:{request_id}` per request seen: `r:{tokens}:{cost}`
//! while reserved, `s` once settled. Counter and request ids live and die
//! together: one key, one TTL, set by [`Ledger::seed`] (reservations and
//! settlements do not extend it), so a flush can never keep the ids and lose
//! the counter or the other way round. Each operation is one Lua script
//! ([`redis::Script`]: `EVALSHA`, reloaded after a restart), atomic on the
//! server. Amounts and caps are exact below 2^53 (Lua numbers are doubles).
//! Memory: a few dozen bytes per model call per scope, gone with the TTL.
//!
//! # Connections
//!
//! Commands go through one [`ConnectionManager`] (multiplexed, reconnects on
//! its own). It returns the error of a command that was in flight when the
//! connection dropped and reconnects behind it, so idempotent calls
//! ([`Ledger::cancel`], [`Ledger::is_cancelled`], [`Ledger::ready`], and the
//! budget scripts, idempotent per request id) are retried once; [`Ledger::publish_live`] is not (a delta sent twice would
//! show twice; live deltas are best effort). Every command is bounded by a
//! response timeout ([`OP_TIMEOUT`]).
//!
//! Each subscription ([`Ledger::subscribe_live`],
//! [`RedisLedger::subscribe_cancellations`]) has a dedicated pub/sub
//! connection of its own, pinged when idle; when it drops, the stream
//! reconnects and resubscribes with backoff and goes on. Messages published
//! while it was away are lost (live deltas are best effort; the persisted
//! events are read from the event log).

use std::time::Duration;

use async_trait::async_trait;
use backon::{BackoffBuilder, ExponentialBuilder};
use futures::StreamExt;
use futures::stream::BoxStream;
use glia_proto::LiveEvent;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, PubSubSink, PubSubStream};
use redis::{Client, RedisError, RedisResult, RetryMethod, Script};
use tracing::{debug, warn};
use uuid::Uuid;

use crate::{
    CapKind, HELD_RESULT_TTL, HeldResult, Ledger, LedgerError, Reservation, Settlement, Signal,
    Spend, SpendCap,
};

/// Bound on one command's answer, and on opening a connection.
pub const OP_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a subscription may stay silent before its connection is pinged.
pub const PING_INTERVAL: Duration = Duration::from_secs(30);

/// Default lifetime of a cancellation flag.
pub const DEFAULT_CANCEL_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Largest amount or cap the budget scripts count exactly (Lua numbers are
/// doubles); larger ones are clamped to it.
const EXACT_MAX: u64 = 1 << 53;

/// Reserve. `KEYS[1]` the scope's hash; ARGV: request id, tokens, cost, token
/// cap, cost cap (caps `-1` when absent). Returns `{status, tokens, cost,
/// cap}`: status 0 missing, 1 granted, 2 exceeded; cap 1 cost, 2 tokens.
const RESERVE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0, 0, 0} end
local used_t = tonumber(redis.call('HGET', KEYS[1], 'tokens') or '0')
local used_c = tonumber(redis.call('HGET', KEYS[1], 'cost') or '0')
local field = 'req:' .. ARGV[1]
if redis.call('HEXISTS', KEYS[1], field) == 1 then return {1, used_t, used_c, 0} end
local add_t, add_c = tonumber(ARGV[2]), tonumber(ARGV[3])
local cap_t, cap_c = tonumber(ARGV[4]), tonumber(ARGV[5])
if cap_c >= 0 and (used_c >= cap_c or used_c + add_c > cap_c) then return {2, used_t, used_c, 1} end
if cap_t >= 0 and (used_t >= cap_t or used_t + add_t > cap_t) then return {2, used_t, used_c, 2} end
local t = redis.call('HINCRBY', KEYS[1], 'tokens', ARGV[2])
local c = redis.call('HINCRBY', KEYS[1], 'cost', ARGV[3])
redis.call('HSET', KEYS[1], field, 'r:' .. ARGV[2] .. ':' .. ARGV[3])
return {1, t, c, 0}
";

/// Settle. `KEYS[1]` the scope's hash; ARGV: request id, tokens, cost.
/// Returns `{status, tokens, cost}`: status 0 missing, 1 settled.
const SETTLE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0, 0} end
local used_t = tonumber(redis.call('HGET', KEYS[1], 'tokens') or '0')
local used_c = tonumber(redis.call('HGET', KEYS[1], 'cost') or '0')
local field = 'req:' .. ARGV[1]
local rec = redis.call('HGET', KEYS[1], field)
if rec == 's' then return {1, used_t, used_c} end
local res_t, res_c = 0, 0
if rec then
  local t, c = string.match(rec, '^r:(%d+):(%d+)$')
  res_t, res_c = tonumber(t) or 0, tonumber(c) or 0
end
used_t = math.max(0, used_t - res_t + tonumber(ARGV[2]))
used_c = math.max(0, used_c - res_c + tonumber(ARGV[3]))
redis.call('HSET', KEYS[1], 'tokens', string.format('%.0f', used_t), 'cost', string.format('%.0f', used_c), field, 's')
return {1, used_t, used_c}
";

/// Seed. `KEYS[1]` the scope's hash; ARGV: tokens, cost, TTL in seconds.
/// Returns 1 when it created the counter, 0 when it existed.
const SEED: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'tokens', ARGV[1], 'cost', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
";

/// The ledger on Redis. See the [module documentation](self) for the key
/// layout and the reconnect behaviour. Cheap to share (`Arc`); the command
/// connection is multiplexed.
pub struct RedisLedger {
    client: Client,
    conn: ConnectionManager,
    prefix: String,
    cancel_ttl: Duration,
    scripts: Scripts,
}

/// The budget scripts, hashed once.
struct Scripts {
    reserve: Script,
    settle: Script,
    seed: Script,
}

fn exact(n: u64) -> u64 {
    n.min(EXACT_MAX)
}

/// A cap as the scripts take it: `-1` for none.
fn cap_arg(cap: Option<u64>) -> i64 {
    cap.map_or(-1, |c| exact(c) as i64)
}

/// A counter value a script returned (never negative; clamp defensively).
fn counted(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> LedgerError {
    LedgerError::Unavailable(format!("{what}: {e}"))
}

/// True when the error may be the connection manager reporting the drop of
/// the command's connection: worth one more try on the new connection.
fn retryable(e: &RedisError) -> bool {
    !matches!(e.retry_method(), RetryMethod::NoRetry)
}

fn backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .with_jitter()
        .without_max_times()
}

impl RedisLedger {
    /// Connect to Redis at `url` (`redis://[:password@]host:port[/db]`) with
    /// every key and channel under `key_prefix` (e.g. `glia`; no trailing
    /// colon).
    ///
    /// Errors: [`LedgerError::Unavailable`] for a malformed URL, or when Redis
    /// does not answer within a few attempts ([`OP_TIMEOUT`] each).
    pub async fn connect(url: &str, key_prefix: &str) -> Result<RedisLedger, LedgerError> {
        let client = Client::open(url).map_err(|e| unavailable("redis url", e))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(OP_TIMEOUT))
            .set_response_timeout(Some(OP_TIMEOUT))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(100))
            .set_max_delay(Duration::from_secs(1));
        let conn = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(|e| unavailable("connect", e))?;
        let scripts = Scripts {
            reserve: Script::new(RESERVE),
            settle: Script::new(SETTLE),
            seed: Script::new(SEED),
        };
        Ok(RedisLedger {
            client,
            conn,
            prefix: key_prefix.to_owned(),
            cancel_ttl: DEFAULT_CANCEL_TTL,
            scripts,
        })
    }

    /// Keep cancellation flags for `ttl` (whole seconds, at least one)
    /// instead of [`DEFAULT_CANCEL_TTL`].
    pub fn with_cancel_ttl(mut self, ttl: Duration) -> RedisLedger {
        self.cancel_ttl = ttl;
        self
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Key of a run's cancellation flag: `P:cancel:{run_id}`.
    pub fn cancel_key(&self, run_id: Uuid) -> String {
        format!("{}:cancel:{run_id}", self.prefix)
    }

    /// Key of a budget scope's counter: `P:budget:{scope}`.
    pub fn budget_key(&self, scope: &str) -> String {
        format!("{}:budget:{scope}", self.prefix)
    }

    /// Key of a run's operator-pause flag: `P:pause:{run_id}`.
    pub fn pause_key(&self, run_id: Uuid) -> String {
        format!("{}:pause:{run_id}", self.prefix)
    }

    /// Key of a held tool result: `P:held:{idempotency_key}`.
    pub fn held_key(&self, idempotency_key: &str) -> String {
        format!("{}:held:{idempotency_key}", self.prefix)
    }

    /// Key of a running call's mark: `P:running:{idempotency_key}`.
    pub fn running_key(&self, idempotency_key: &str) -> String {
        format!("{}:running:{idempotency_key}", self.prefix)
    }

    /// Channel announcing cancellations (payload: the run id): `P:cancelled`.
    pub fn cancel_channel(&self) -> String {
        format!("{}:cancelled", self.prefix)
    }

    /// Channel of a run's live events (payload: [`LiveEvent`] JSON):
    /// `P:live:{run_id}`.
    pub fn live_channel(&self, run_id: Uuid) -> String {
        format!("{}:live:{run_id}", self.prefix)
    }

    /// Ids of runs cancelled from now on, by any process, as they are
    /// flagged. Same delivery rules as [`Ledger::subscribe_live`]: returns
    /// once subscribed; survives reconnects, missing what was announced
    /// meanwhile (check [`Ledger::is_cancelled`] for runs that matter).
    ///
    /// Errors: [`LedgerError::Unavailable`] when the first subscription
    /// fails.
    pub async fn subscribe_cancellations(&self) -> Result<BoxStream<'static, Uuid>, LedgerError> {
        subscription(self.client.clone(), self.cancel_channel(), None, |bytes| {
            std::str::from_utf8(bytes).ok()?.parse().ok()
        })
        .await
    }

    /// `EXISTS key` (retried once), for the operation `what`.
    async fn exists(&self, what: &str, key: String) -> Result<bool, LedgerError> {
        self.idempotent(what, |mut conn| {
            let key = key.clone();
            async move {
                redis::cmd("EXISTS")
                    .arg(&key)
                    .query_async::<bool>(&mut conn)
                    .await
            }
        })
        .await
    }

    /// Run an idempotent command, once more if the first try met a dropped
    /// connection.
    async fn idempotent<T, F, Fut>(&self, what: &str, op: F) -> Result<T, LedgerError>
    where
        F: Fn(ConnectionManager) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        match op(self.conn.clone()).await {
            Ok(v) => Ok(v),
            Err(e) if retryable(&e) => {
                debug!(error = %e, what, "redis: retrying once");
                op(self.conn.clone())
                    .await
                    .map_err(|e| unavailable(what, e))
            }
            Err(e) => Err(unavailable(what, e)),
        }
    }
}

#[async_trait]
impl Ledger for RedisLedger {
    /// `SET P:cancel:{run_id} 1 EX ttl` and `PUBLISH P:cancelled run_id`, in
    /// one transaction. Idempotent (retried once).
    ///
    /// Errors: [`LedgerError::Unavailable`] when Redis does not answer.
    async fn cancel(&self, run_id: Uuid) -> Result<(), LedgerError> {
        let key = self.cancel_key(run_id);
        let channel = self.cancel_channel();
        let ttl = self.cancel_ttl.as_secs().max(1);
        self.idempotent("cancel", |mut conn| {
            let (key, channel) = (key.clone(), channel.clone());
            async move {
                redis::pipe()
                    .atomic()
                    .cmd("SET")
                    .arg(&key)
                    .arg(1)
                    .arg("EX")
                    .arg(ttl)
                    .ignore()
                    .cmd("PUBLISH")
                    .arg(&channel)
                    .arg(run_id.to_string())
                    .ignore()
                    .query_async::<()>(&mut conn)
                    .await
            }
        })
        .await
    }

    /// `EXISTS P:cancel:{run_id}` (retried once).
    ///
    /// Errors: [`LedgerError::Unavailable`] when Redis does not answer.
    async fn is_cancelled(&self, run_id: Uuid) -> Result<bool, LedgerError> {
        self.exists("is_cancelled", self.cancel_key(run_id)).await
    }

    /// `MGET` of the runs' cancel flags, 1,000 a round trip (each retried
    /// once).
    ///
    /// Errors: [`LedgerError::Unavailable`] when Redis does not answer.
    async fn cancelled_among(&self, runs: &[Uuid]) -> Result<Vec<Uuid>, LedgerError> {
        let mut flagged = Vec::new();
        for chunk in runs.chunks(1000) {
            let keys: Vec<String> = chunk.iter().map(|r| self.cancel_key(*r)).collect();
            let values: Vec<Option<String>> = self
                .idempotent("cancelled_among", |mut conn| {
                    let keys = keys.clone();
                    async move { redis::cmd("MGET").arg(&keys).query_async(&mut conn).await }
                })
                .await?;
            flagged.extend(
                chunk
                    .iter()
                    .zip(values)
                    .filter(|(_, v)| v.is_some())
                    .map(|(r, _)| *r),
            );
        }
        Ok(flagged)
    }

    /// The cancel channel (`P:cancelled`) on a pub/sub connection of its
    /// own, `None` after each resubscription.
    ///
    /// Errors: [`LedgerError::Unavailable`] when the first subscription
    /// fails.
    async fn watch_cancellations(
        &self,
    ) -> Result<Option<BoxStream<'static, Option<Uuid>>>, LedgerError> {
        let stream = subscription(
            self.client.clone(),
            self.cancel_channel(),
            Some(None),
            |bytes| std::str::from_utf8(bytes).ok()?.parse().ok().map(Some),
        )
        .await?;
        Ok(Some(stream))
    }

    /// `SET P:pause:{run_id} 1 EX ttl` (the cancel flag's TTL) or `DEL` it.
    /// Idempotent (retried once).
    ///
    /// Errors: [`LedgerError::Unavailable`] when Redis does not answer.
    async fn set_paused(&self, run_id: Uuid, paused: bool) -> Result<(), LedgerError> {
        let key = self.pause_key(run_id);
        let ttl = self.cancel_ttl.as_secs().max(1);
        self.idempotent("set_paused", |mut conn| {
            let key = key.clone();
            async move {
                if paused {
                    redis::cmd("SET")
                        .arg(&key)
                        .arg(1)
                        .arg("EX")
                        .arg(ttl)
                        .query_async::<()>(&mut conn)
                        .await
                } else {
                    redis::cmd("DEL")
                        .arg(&key)
                        .query_async::<()>(&mut conn)
                        .await
                }
            }
        })
        .await
    }

    /// `EXISTS` of the cancel and of the pause flag, pipelined: one round
    /// trip (retried once).
    ///
    /// Errors: [`LedgerError::Unavailable`] when Redis does not answer.
    async fn signal(&self, run_id: Uuid) -> Result<Signal, LedgerError> {
        let (cancel, pause) = (self.cancel_key(run_id), self.pause_key(run_id));
        self.idempotent("signal", |mut conn| {
            let (cancel, pause) = (cancel.clone(), pause.clone());
            async move {
                let (cancelled, paused): (bool, bool) = redis::pipe()
                    .cmd("EXISTS")
                    .arg(&cancel)
                    .cmd("EXISTS")
                    .arg(&pause)
                    .query_async(&mut conn)
                    .await?;
                Ok(Signal { cancelled, paused })
            }
        })
        .await
    }

    /// `PUBLISH P:live:{run_id} <event JSON>`; nobody listening is fine. Not
    /// retried (a duplicate delta would show).
    ///
    /// Errors: [`LedgerError::Unavailable`] when Redis does not answer; the
    /// caller may ignore it (best effort).
    async fn publish_live(&self, run_id: Uuid, event: &LiveEvent) -> Result<(), LedgerError> {
        let payload = serde_json::to_vec(event).map_err(|e| unavailable("encode live event", e))?;
        let mut conn = self.conn.clone();
        redis::cmd("PUBLISH")
            .arg(self.live_channel(run_id))
            .arg(payload)
            .query_async::<i64>(&mut conn)
            .await
            .map(|_| ())
            .map_err(|e| unavailable("publish_live", e))
    }

    /// The run's live events published after this returns, on a dedicated
    /// pub/sub connection owned by the stream (dropping the stream closes
    /// it). The stream does not end: it resubscribes after a disconnect,
    /// missing what was published meanwhile. Payloads that are not a
    /// [`LiveEvent`] are skipped.
    ///
    /// Errors: [`LedgerError::Unavailable`] when the first subscription
    /// fails.
    async fn subscribe_live(
        &self,
        run_id: Uuid,
    ) -> Result<BoxStream<'static, LiveEvent>, LedgerError> {
        subscription(
            self.client.clone(),
            self.live_channel(run_id),
            None,
            |bytes| serde_json::from_slice(bytes).ok(),
        )
        .await
    }

    /// `PING` (retried once).
    ///
    /// Errors: [`LedgerError::Unavailable`] when Redis does not answer.
    async fn ready(&self) -> Result<(), LedgerError> {
        self.idempotent("ping", |mut conn| async move {
            redis::cmd("PING").query_async::<()>(&mut conn).await
        })
        .await
    }

    /// One script on `P:budget:{scope}` (see the module documentation);
    /// idempotent per request id, so retried once.
    ///
    /// Errors: [`LedgerError::Unavailable`] when Redis does not answer or
    /// answers something else than the script's reply.
    async fn reserve(
        &self,
        scope: &str,
        request_id: &str,
        amount: Spend,
        cap: SpendCap,
    ) -> Result<Reservation, LedgerError> {
        let key = self.budget_key(scope);
        let (tokens, cost) = (exact(amount.tokens), exact(amount.cost_usd_micros));
        let (cap_tokens, cap_cost) = (cap_arg(cap.tokens), cap_arg(cap.cost_usd_micros));
        let reply: (i64, i64, i64, i64) = self
            .idempotent("reserve", |mut conn| {
                let mut invocation = self.scripts.reserve.key(&key);
                invocation
                    .arg(request_id)
                    .arg(tokens)
                    .arg(cost)
                    .arg(cap_tokens)
                    .arg(cap_cost);
                async move { invocation.invoke_async(&mut conn).await }
            })
            .await?;
        let used = Spend {
            tokens: counted(reply.1),
            cost_usd_micros: counted(reply.2),
        };
        match reply {
            (0, ..) => Ok(Reservation::Missing),
            (1, ..) => Ok(Reservation::Granted { used }),
            (2, _, _, 1) => Ok(Reservation::Exceeded {
                used,
                cap: CapKind::Cost,
            }),
            (2, _, _, 2) => Ok(Reservation::Exceeded {
                used,
                cap: CapKind::Tokens,
            }),
            other => Err(unavailable(
                "reserve",
                format!("unexpected script reply {other:?}"),
            )),
        }
    }

    /// One script on `P:budget:{scope}`; idempotent per request id, so
    /// retried once.
    ///
    /// Errors: as [`Ledger::reserve`].
    async fn settle(
        &self,
        scope: &str,
        request_id: &str,
        actual: Spend,
    ) -> Result<Settlement, LedgerError> {
        let key = self.budget_key(scope);
        let (tokens, cost) = (exact(actual.tokens), exact(actual.cost_usd_micros));
        let reply: (i64, i64, i64) = self
            .idempotent("settle", |mut conn| {
                let mut invocation = self.scripts.settle.key(&key);
                invocation.arg(request_id).arg(tokens).arg(cost);
                async move { invocation.invoke_async(&mut conn).await }
            })
            .await?;
        match reply {
            (0, ..) => Ok(Settlement::Missing),
            (1, t, c) => Ok(Settlement::Settled {
                used: Spend {
                    tokens: counted(t),
                    cost_usd_micros: counted(c),
                },
            }),
            other => Err(unavailable(
                "settle",
                format!("unexpected script reply {other:?}"),
            )),
        }
    }

    /// One script: `HSET` and `EXPIRE` unless the key exists. Retried once.
    ///
    /// Errors: as [`Ledger::reserve`].
    async fn seed(&self, scope: &str, used: Spend, ttl: Duration) -> Result<bool, LedgerError> {
        let key = self.budget_key(scope);
        let (tokens, cost) = (exact(used.tokens), exact(used.cost_usd_micros));
        let ttl = ttl.as_secs().max(1);
        self.idempotent("seed", |mut conn| {
            let mut invocation = self.scripts.seed.key(&key);
            invocation.arg(tokens).arg(cost).arg(ttl);
            async move {
                invocation
                    .invoke_async::<i64>(&mut conn)
                    .await
                    .map(|created| created == 1)
            }
        })
        .await
    }

    /// `SET P:held:{key} <json> EX 7d` and `DEL P:running:{key}` for each,
    /// in one transaction. Idempotent (retried once).
    ///
    /// Errors: [`LedgerError::Unavailable`] when Redis does not answer.
    async fn hold_results(&self, held: &[(String, HeldResult)]) -> Result<(), LedgerError> {
        if held.is_empty() {
            return Ok(());
        }
        let mut entries = Vec::with_capacity(held.len());
        for (key, result) in held {
            entries.push((
                self.held_key(key),
                self.running_key(key),
                serde_json::to_vec(result).map_err(|e| unavailable("encode held result", e))?,
            ));
        }
        let ttl = HELD_RESULT_TTL.as_secs();
        self.idempotent("hold_results", |mut conn| {
            let mut pipe = redis::pipe();
            pipe.atomic();
            for (key, running, json) in &entries {
                pipe.cmd("SET")
                    .arg(key)
                    .arg(json.as_slice())
                    .arg("EX")
                    .arg(ttl)
                    .ignore();
                pipe.cmd("DEL").arg(running).ignore();
            }
            async move { pipe.query_async::<()>(&mut conn).await }
        })
        .await
    }

    /// `SET P:running:{key} 1 PX <ttl>` for each, in one transaction
    /// (retried once).
    ///
    /// Errors: [`LedgerError::Unavailable`] when Redis does not answer.
    async fn mark_running(&self, keys: &[String], ttl: Duration) -> Result<(), LedgerError> {
        if keys.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = keys.iter().map(|k| self.running_key(k)).collect();
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        self.idempotent("mark_running", |mut conn| {
            let mut pipe = redis::pipe();
            pipe.atomic();
            for key in &keys {
                pipe.cmd("SET")
                    .arg(key)
                    .arg(1)
                    .arg("PX")
                    .arg(ttl_ms)
                    .ignore();
            }
            async move { pipe.query_async::<()>(&mut conn).await }
        })
        .await
    }

    /// `EXISTS P:running:{key}` (retried once).
    ///
    /// Errors: [`LedgerError::Unavailable`] when Redis does not answer.
    async fn running(&self, key: &str) -> Result<bool, LedgerError> {
        self.exists("running", self.running_key(key)).await
    }

    /// `GET P:held:{key}` (retried once).
    ///
    /// Errors: [`LedgerError::Unavailable`] when Redis does not answer or
    /// the value is not a held result.
    async fn held_result(&self, key: &str) -> Result<Option<HeldResult>, LedgerError> {
        let key = self.held_key(key);
        let json: Option<Vec<u8>> = self
            .idempotent("held_result", |mut conn| {
                let key = key.clone();
                async move { redis::cmd("GET").arg(&key).query_async(&mut conn).await }
            })
            .await?;
        json.map(|j| serde_json::from_slice(&j).map_err(|e| unavailable("decode held result", e)))
            .transpose()
    }

    /// `DEL` of the keys (retried once).
    ///
    /// Errors: [`LedgerError::Unavailable`] when Redis does not answer.
    async fn release_held(&self, keys: &[String]) -> Result<(), LedgerError> {
        if keys.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = keys.iter().map(|k| self.held_key(k)).collect();
        self.idempotent("release_held", |mut conn| {
            let keys = keys.clone();
            async move {
                redis::cmd("DEL")
                    .arg(&keys)
                    .query_async::<()>(&mut conn)
                    .await
            }
        })
        .await
    }

    /// `SCAN` for the run's held results and running marks
    /// (`P:held:{run_id}:*`, `P:running:{run_id}:*`, the prefix's glob
    /// characters escaped), each page deleted as it comes.
    async fn forget_run(&self, run_id: Uuid) -> Result<(), LedgerError> {
        let prefix = glob_escape(&self.prefix);
        let patterns = [
            format!("{prefix}:held:{run_id}:*"),
            format!("{prefix}:running:{run_id}:*"),
        ];
        for pattern in patterns {
            self.idempotent("forget_run", |mut conn| {
                let pattern = pattern.clone();
                async move {
                    let mut cursor: u64 = 0;
                    loop {
                        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                            .arg(cursor)
                            .arg("MATCH")
                            .arg(&pattern)
                            .arg("COUNT")
                            .arg(1000)
                            .query_async(&mut conn)
                            .await?;
                        if !keys.is_empty() {
                            redis::cmd("DEL")
                                .arg(&keys)
                                .query_async::<()>(&mut conn)
                                .await?;
                        }
                        if next == 0 {
                            return Ok(());
                        }
                        cursor = next;
                    }
                }
            })
            .await?;
        }
        Ok(())
    }
}

/// `text` with Redis glob characters (`*`, `?`, `[`, `]`, `\`) escaped.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Open a pub/sub connection and subscribe it to `channel`, bounded by
/// [`OP_TIMEOUT`].
async fn open_subscription(
    client: &Client,
    channel: &str,
) -> RedisResult<(PubSubSink, PubSubStream)> {
    let open = async {
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(channel).await?;
        Ok(pubsub.split())
    };
    match tokio::time::timeout(OP_TIMEOUT, open).await {
        Ok(r) => r,
        Err(_) => Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "subscribe timed out",
        ))),
    }
}

/// A never-ending stream of `channel`'s messages decoded by `decode`
/// (undecodable ones skipped), resubscribing on a new connection after a
/// disconnect, and then yielding `resubscribed` when given (messages
/// published meanwhile are lost). Returns once the first subscription is
/// confirmed.
async fn subscription<T: Clone + Send + Sync + 'static>(
    client: Client,
    channel: String,
    resubscribed: Option<T>,
    decode: fn(&[u8]) -> Option<T>,
) -> Result<BoxStream<'static, T>, LedgerError> {
    let first = open_subscription(&client, &channel)
        .await
        .map_err(|e| unavailable(&format!("subscribe {channel}"), e))?;
    struct State<T> {
        client: Client,
        channel: String,
        link: Option<(PubSubSink, PubSubStream)>,
        resubscribed: Option<T>,
    }
    let state = State {
        client,
        channel,
        link: Some(first),
        resubscribed,
    };
    let stream = futures::stream::unfold(state, move |mut st| async move {
        let mut delays = backoff().build();
        loop {
            let Some((sink, messages)) = st.link.as_mut() else {
                match open_subscription(&st.client, &st.channel).await {
                    Ok(link) => {
                        debug!(channel = %st.channel, "redis: resubscribed");
                        st.link = Some(link);
                        delays = backoff().build();
                        if let Some(marker) = st.resubscribed.clone() {
                            return Some((marker, st));
                        }
                    }
                    Err(e) => {
                        let delay = delays.next().unwrap_or(Duration::from_secs(5));
                        warn!(channel = %st.channel, error = %e, ?delay, "redis: resubscribe failed; retrying");
                        tokio::time::sleep(delay).await;
                    }
                }
                continue;
            };
            enum Next {
                Message(Option<redis::Msg>),
                Idle,
            }
            let next = tokio::select! {
                msg = messages.next() => Next::Message(msg),
                _ = tokio::time::sleep(PING_INTERVAL) => Next::Idle,
            };
            match next {
                Next::Idle => {
                    match tokio::time::timeout(OP_TIMEOUT, sink.ping::<redis::Value>()).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => {
                            warn!(channel = %st.channel, error = %e, "redis: subscription ping failed; reconnecting");
                            st.link = None;
                        }
                        Err(_) => {
                            warn!(channel = %st.channel, "redis: subscription ping timed out; reconnecting");
                            st.link = None;
                        }
                    }
                }
                Next::Message(Some(msg)) => match decode(msg.get_payload_bytes()) {
                    Some(item) => return Some((item, st)),
                    None => warn!(channel = %st.channel, "redis: undecodable message skipped"),
                },
                Next::Message(None) => {
                    warn!(channel = %st.channel, "redis: subscription connection lost; resubscribing");
                    st.link = None;
                }
            }
        }
    });
    Ok(stream.boxed())
}
