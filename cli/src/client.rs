//! The HTTP client side of the CLI: `glia submit`, `glia runs`, `glia approvals`
//! (and the requests of `glia batch --server`). It speaks the dispatcher's JSON
//! API and nothing else.
//!
//! Every client waits out a bounded outage of the dispatcher instead of dying
//! ([`Server::retrying`]): a connection error, a timeout, a broken answer or a
//! 502/503/504 is retried with exponential backoff (200 ms doubling to 3 s, plus
//! up to as much again of random jitter; a `Retry-After` is honoured) until the dispatcher answers or
//! `--max-outage-secs` (default 120 s) have passed since the outage began;
//! then the error names the server, the time waited and the last error
//! ([`Unreachable`]). What makes a retry safe:
//!
//! - `POST /v1/runs` always carries an `Idempotency-Key` (`--idempotency-key`,
//!   else a fresh UUID per invocation): a retry after a lost answer returns the
//!   run the first attempt created (200) instead of creating another.
//! - Decisions and external tool results are deduplicated by the dispatcher
//!   per approval request and call: a repeat answers 409 (`already_decided`,
//!   `already_answered`); after a retry such a 409 means the lost attempt
//!   landed, and is reported as done. Messages, closes and resumes are
//!   refused (409 `already_posted`) only while the first is still pending:
//!   once consumed, the run may park again and accept the same text as a new
//!   message. `glia batch` therefore re-reads the run before each retry of
//!   one and does not post again when the run moved on.
//! - The event stream resumes with `Last-Event-ID` = the last printed seq: no
//!   event is lost or printed twice across reconnects.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use backon::{ExponentialBuilder, Retryable};
use clap::{Args, Subcommand};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use glia_proto::{BudgetLimits, Event, EventKind, Outcome, RunConfig};
use reqwest::{Client, Method, RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};

/// Default of `--max-outage-secs`: how long a client waits for a dispatcher
/// that does not answer (seconds).
pub const DEFAULT_MAX_OUTAGE_SECS: u64 = 120;

/// Where the dispatcher is, who we are, and how long to wait for it.
#[derive(Args, Clone)]
pub struct Server {
    /// Dispatcher base URL.
    #[arg(long, env = "GLIA_SERVER", default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// Bearer token.
    #[arg(long, env = "GLIA_TOKEN")]
    pub token: Option<String>,
    /// Keep retrying (with backoff) a dispatcher that cannot be reached, times
    /// out or answers 502/503/504 for this many seconds before giving up;
    /// 0 gives up at the first failure.
    #[arg(long, env = "GLIA_MAX_OUTAGE_SECS", default_value_t = DEFAULT_MAX_OUTAGE_SECS)]
    pub max_outage_secs: u64,
}

/// The dispatcher did not answer within the outage bound.
#[derive(Debug, thiserror::Error)]
#[error("the dispatcher at {server} did not answer for {:.1} s ({attempts} attempt(s), --max-outage-secs {max_outage_secs}); last error: {last}", waited.as_secs_f64())]
pub struct Unreachable {
    /// The dispatcher's base URL.
    pub server: String,
    /// From the first failure of the outage to giving up.
    pub waited: Duration,
    /// Attempts made in this outage.
    pub attempts: u32,
    /// The bound, seconds.
    pub max_outage_secs: u64,
    /// What the last attempt got (a connection error, a timeout, a 503…).
    pub last: String,
}

/// Why one attempt failed.
pub enum Attempt {
    /// Worth retrying: the dispatcher is unreachable, restarting or behind a
    /// gateway that cannot reach it. With the `Retry-After` hint, if any.
    Transient(String, Option<Duration>),
    /// Not worth retrying: the dispatcher answered and refused, or the
    /// request itself is wrong.
    Fatal(anyhow::Error),
}

impl Attempt {
    /// A reqwest failure: transient unless the request could not be built or
    /// redirected (those fail the same way every time).
    pub fn from_reqwest(e: reqwest::Error) -> Attempt {
        if e.is_builder() || e.is_redirect() {
            return Attempt::Fatal(anyhow::Error::new(e));
        }
        Attempt::Transient(error_chain(&e), None)
    }
}

/// An error and its sources on one line (reqwest's own message omits the
/// cause, e.g. "Connection refused").
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

/// A status worth retrying: the dispatcher is restarting or not ready (503),
/// or a gateway in front of it cannot reach it (502, 504).
pub fn transient_status(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

/// The `Retry-After` of an answer, in seconds form (the dispatcher's).
fn retry_after(resp: &Response) -> Option<Duration> {
    resp.headers()
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

/// A dispatcher's complete answer: status and JSON body (`Null` when the
/// body is not JSON), and how many attempts it took.
#[derive(Debug)]
pub struct Answer {
    /// The HTTP status (never a transient one: those are retried).
    pub status: StatusCode,
    /// The body as JSON.
    pub body: Value,
    /// 1 when the first attempt was answered.
    pub attempts: u32,
}

impl Answer {
    /// The body of a 2xx answer, else an error carrying the dispatcher's
    /// JSON error (`dispatcher answered 409 Conflict: already_posted: …`).
    pub fn checked(self) -> Result<Value> {
        if !self.status.is_success() {
            bail!(
                "dispatcher answered {}: {}: {}",
                self.status,
                self.code(),
                self.body["error"]["message"].as_str().unwrap_or("")
            );
        }
        Ok(self.body)
    }

    /// The dispatcher's error code (`already_posted`…), `unknown` without one.
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("unknown")
    }
}

impl Server {
    /// A request to `path` on the dispatcher, with the bearer token.
    pub fn request(&self, client: &Client, method: Method, path: &str) -> RequestBuilder {
        let req = client.request(
            method,
            format!("{}{}", self.server.trim_end_matches('/'), path),
        );
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// The outage bound (`--max-outage-secs`).
    pub fn max_outage(&self) -> Duration {
        Duration::from_secs(self.max_outage_secs)
    }

    /// Run `attempt` until it succeeds, fails for good, or the outage that
    /// began at `since` has lasted longer than [`Server::max_outage`]:
    /// transient failures are retried with exponential backoff (200 ms
    /// doubling to 3 s, plus up to as much again of jitter; at least the
    /// `Retry-After` hint) and
    /// logged as warnings. Errors: the fatal error, or [`Unreachable`] with
    /// the last transient failure.
    pub async fn retrying<T, F, Fut>(&self, since: Instant, mut attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Attempt>>,
    {
        let bound = self.max_outage();
        let attempts = AtomicU32::new(0);
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(200))
            .with_max_delay(Duration::from_secs(3))
            .with_jitter()
            .without_max_times();
        let result = (|| {
            attempts.fetch_add(1, Ordering::Relaxed);
            attempt()
        })
        .retry(backoff)
        .when(|e| matches!(e, Attempt::Transient(..)) && since.elapsed() < bound)
        .adjust(|e, delay| match e {
            Attempt::Transient(_, Some(hint)) => delay.map(|d| d.max(*hint)),
            _ => delay,
        })
        .notify(|e, delay| {
            if let Attempt::Transient(why, _) = e {
                tracing::warn!(server = %self.server, "dispatcher unavailable ({why}); retrying in {} ms", delay.as_millis());
            }
        })
        .await;
        match result {
            Ok(t) => Ok(t),
            Err(Attempt::Fatal(e)) => Err(e),
            Err(Attempt::Transient(last, _)) => Err(Unreachable {
                server: self.server.clone(),
                waited: since.elapsed(),
                attempts: attempts.load(Ordering::Relaxed),
                max_outage_secs: self.max_outage_secs,
                last,
            }
            .into()),
        }
    }

    /// One attempt of `method path` with an optional JSON body and extra
    /// headers: the status and the JSON body (`Null` when not JSON), read
    /// whole. A transport failure, a body cut off or a 502/503/504 is an
    /// [`Attempt::Transient`] (with the `Retry-After` hint).
    pub async fn send_once(
        &self,
        client: &Client,
        method: Method,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Result<(StatusCode, Value), Attempt> {
        let mut req = self.request(client, method, path);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let (status, bytes) = self.bytes_once(req).await?;
        Ok((
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }

    /// One attempt of a request built with [`Server::request`] (any body):
    /// the status and the body's bytes, read whole; transient failures as in
    /// [`Server::send_once`]. For bodies that are not JSON (a JSON Lines
    /// upload, the results of a batch).
    pub async fn bytes_once(
        &self,
        req: RequestBuilder,
    ) -> Result<(StatusCode, bytes::Bytes), Attempt> {
        let resp = req.send().await.map_err(Attempt::from_reqwest)?;
        let status = resp.status();
        if transient_status(status) {
            let hint = retry_after(&resp);
            let text = resp.text().await.unwrap_or_default();
            let detail: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            let why = detail["error"]["message"]
                .as_str()
                .map_or_else(|| text.chars().take(200).collect(), str::to_owned);
            return Err(Attempt::Transient(format!("{status}: {why}"), hint));
        }
        let bytes = resp.bytes().await.map_err(Attempt::from_reqwest)?;
        Ok((status, bytes))
    }

    /// [`Server::send_once`] retried through an outage ([`Server::retrying`]).
    /// Only send requests whose repeat is harmless (reads, idempotent or
    /// deduplicated posts: see the module documentation).
    pub async fn call(
        &self,
        client: &Client,
        method: Method,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Result<Answer> {
        let attempts = AtomicU32::new(0);
        let (status, body) = self
            .retrying(Instant::now(), || {
                attempts.fetch_add(1, Ordering::Relaxed);
                self.send_once(client, method.clone(), path, body, headers)
            })
            .await?;
        Ok(Answer {
            status,
            body,
            attempts: attempts.load(Ordering::Relaxed),
        })
    }

    /// GET `path`: the body of a 2xx answer (see [`Server::call`], [`Answer::checked`]).
    pub async fn get(&self, client: &Client, path: &str) -> Result<Value> {
        self.call(client, Method::GET, path, None, &[])
            .await?
            .checked()
    }
}

/// Turn a raw non-2xx answer into an error carrying the dispatcher's JSON
/// error; for requests sent without [`Server::call`] (the benchmarks, whose
/// dispatcher runs in the same process).
pub async fn checked(resp: Response) -> Result<Value> {
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    Answer {
        status,
        body,
        attempts: 1,
    }
    .checked()
}

/// An HTTP client for the dispatcher: a dispatcher that does not answer is
/// a failed attempt after 10 s (connect) or 60 s (a whole request), never a
/// hang. Streams (`events/stream`) are read without the request timeout.
pub fn http_client() -> Result<Client> {
    Ok(Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(64)
        .build()?)
}

/// A client for long-lived streams: connect timeout only (the dispatcher
/// sends a keep-alive comment every 15 s; a stream silent for
/// [`STREAM_IDLE`] is taken as broken and resumed).
fn stream_client() -> Result<Client> {
    Ok(Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()?)
}

/// A stream with nothing (not even a keep-alive) for this long is broken.
const STREAM_IDLE: Duration = Duration::from_secs(45);

/// A stream open this long worked: an outage is counted afresh after it
/// breaks (a stream that breaks sooner without an event counts on).
const HEALTHY_STREAM: Duration = Duration::from_secs(15);

/// `glia submit`.
#[derive(Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    server: Server,
    /// Run configuration (a RunConfig, `.toml` or JSON, parsed strictly).
    #[arg(long, conflicts_with = "agent")]
    config: Option<PathBuf>,
    /// A registered agent: `NAME` (its latest version) or `NAME@VERSION`;
    /// the run's config is the definition's.
    #[arg(long, value_name = "NAME[@VERSION]")]
    agent: Option<String>,
    /// Idempotency key: submitting the same key twice gives the same run.
    /// Default: a fresh key per invocation, so that retries within one
    /// invocation never create a second run.
    #[arg(long)]
    idempotency_key: Option<String>,
    /// Print events as JSON lines.
    #[arg(long)]
    json: bool,
    /// Do not follow the run's events; print its id and return.
    #[arg(long)]
    detach: bool,
    /// Start the run later: an RFC 3339 time with an offset, at most 366
    /// days ahead (`docs/waits.md`). The run is admitted now and parks at
    /// `awaiting_timer` until then; the command prints its id and start
    /// time and returns (follow it later with `glia runs events --follow`).
    #[arg(long, value_name = "RFC3339", value_parser = parse_start_at)]
    start_at: Option<chrono::DateTime<chrono::FixedOffset>>,
    /// The goal.
    goal: String,
}

fn parse_start_at(s: &str) -> Result<chrono::DateTime<chrono::FixedOffset>, String> {
    chrono::DateTime::parse_from_rfc3339(s).map_err(|e| {
        format!("{s:?} is not an RFC 3339 time with an offset (2026-12-07T10:00:00Z): {e}")
    })
}

/// Create a run and stream its events until it parks or ends. Exits with an
/// error when the run failed or was cancelled.
pub async fn submit(args: SubmitArgs) -> Result<()> {
    // What the dispatcher would refuse (422) is refused here, before anything is sent.
    let mut body = match (&args.config, &args.agent) {
        (_, Some(agent)) => json!({ "goal": args.goal, "agent": agent }),
        (Some(p), None) => {
            json!({ "goal": args.goal, "config": crate::config_file::read_config(p)? })
        }
        (None, None) => json!({ "goal": args.goal, "config": RunConfig::default() }),
    };
    if let Some(at) = args.start_at {
        body["start_at"] = json!(at.to_rfc3339());
    }
    let client = http_client()?;
    let key = args
        .idempotency_key
        .clone()
        .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    let answer = args
        .server
        .call(
            &client,
            Method::POST,
            "/v1/runs",
            Some(&body),
            &[("Idempotency-Key", &key)],
        )
        .await
        .context("submitting the run")?;
    let run = answer.checked()?;
    let run_id = run["run_id"]
        .as_str()
        .context("the dispatcher's answer has no run_id")?
        .to_owned();
    if args.detach {
        outln!("{run_id}");
        return Ok(());
    }
    // A delayed start parks at admission (no `session.pause` to follow):
    // say when it starts and let go.
    if run["pull_point"]["kind"] == "awaiting_timer" && run["pull_point"]["call_ids"] == json!([]) {
        outln!("{run_id}");
        errln!(
            "run {run_id} starts at {}",
            run["pull_point"]["wake_at_ms"]
                .as_i64()
                .map_or_else(|| "-".to_owned(), glia_proto::wait::rfc3339_ms)
        );
        return Ok(());
    }
    errln!("run {run_id}");
    match follow(
        &stream_client()?,
        &args.server,
        &run_id,
        0,
        args.json,
        false,
    )
    .await
    .with_context(|| format!("following run {run_id}"))?
    {
        Some(Outcome::Failed { error }) => bail!("run {run_id} failed: {error}"),
        Some(Outcome::Cancelled { reason }) => bail!("run {run_id} was cancelled: {reason}"),
        _ => Ok(()),
    }
}

/// Print a run's events from the SSE stream (after seq `after`) until it
/// parks (unless `until_done`) or ends; the outcome when it ended. A stream that breaks (the dispatcher restarted, a
/// proxy cut it, nothing arrived for [`STREAM_IDLE`]) is resumed after the
/// last printed seq (`Last-Event-ID`), so every event is printed once and in
/// order. Reconnecting fails with [`Unreachable`] once the stream has been
/// broken for `--max-outage-secs` (streams that break at once without
/// delivering an event do not restart the count).
async fn follow(
    client: &Client,
    server: &Server,
    run_id: &str,
    after: u64,
    json: bool,
    until_done: bool,
) -> Result<Option<Outcome>> {
    let path = format!("/v1/runs/{run_id}/events/stream");
    let mut last: u64 = after;
    // Since when the stream has been broken: from the first break after a
    // working stream (one that delivered an event or stayed open for
    // HEALTHY_STREAM) until the next working one.
    let mut outage: Option<Instant> = None;
    loop {
        let since = outage.unwrap_or_else(Instant::now);
        let resp = server
            .retrying(since, || async {
                let mut req = server.request(client, Method::GET, &path);
                if last > 0 {
                    req = req.header("Last-Event-ID", last.to_string());
                }
                let resp = req.send().await.map_err(Attempt::from_reqwest)?;
                let status = resp.status();
                if transient_status(status) {
                    let hint = retry_after(&resp);
                    return Err(Attempt::Transient(format!("{status}"), hint));
                }
                if !status.is_success() {
                    let body: Value = resp.json().await.unwrap_or(Value::Null);
                    let answer = Answer {
                        status,
                        body,
                        attempts: 1,
                    };
                    return Err(Attempt::Fatal(answer.checked().expect_err("not a success")));
                }
                Ok(resp)
            })
            .await?;
        let connected = Instant::now();
        let before = last;
        let mut stream = resp.bytes_stream().eventsource();
        let why = loop {
            let msg = match tokio::time::timeout(STREAM_IDLE, stream.next()).await {
                Err(_) => break format!("nothing received for {} s", STREAM_IDLE.as_secs()),
                Ok(None) => break "the stream ended before the run did".to_owned(),
                Ok(Some(Err(e))) => break format!("reading the event stream: {e}"),
                Ok(Some(Ok(msg))) => msg,
            };
            if msg.event == "error" {
                // The dispatcher could not read the log: its answer says why; try again.
                break format!("the dispatcher reported: {}", msg.data);
            }
            if msg.event == "live" || msg.data.is_empty() {
                continue;
            }
            let event: Event = serde_json::from_str(&msg.data).with_context(|| {
                format!(
                    "the event stream sent an event glia cannot read: {}",
                    msg.data
                )
            })?;
            if event.seq <= last {
                continue; // already printed before a reconnect
            }
            last = event.seq;
            if json {
                outln!("{}", msg.data);
            } else {
                outln!("{}", event_line(&event));
            }
            match event.kind {
                EventKind::SessionPause { pull_point } if !until_done => {
                    errln!("parked at {}", pull_point.name());
                    return Ok(None);
                }
                EventKind::SessionComplete { outcome } => return Ok(Some(outcome)),
                EventKind::SessionCancel { reason } => {
                    return Ok(Some(Outcome::Cancelled { reason }));
                }
                _ => {}
            }
        };
        if last > before || connected.elapsed() >= HEALTHY_STREAM || outage.is_none() {
            outage = Some(Instant::now());
        }
        tracing::warn!(server = %server.server, %run_id, after = last, "event stream broken ({why}); resuming");
    }
}

/// `glia runs resume --extend-…`: amounts added to a run's budget limits
/// (the resume body's `extend`, a [`BudgetLimits`]); a limit the run does
/// not have (unlimited) stays unlimited.
#[derive(Args, Clone, Default)]
pub struct ExtendArgs {
    /// More model calls.
    #[arg(long, value_name = "N")]
    pub extend_turns: Option<u64>,
    /// More tool calls.
    #[arg(long, value_name = "N")]
    pub extend_tool_calls: Option<u64>,
    /// More active time, in seconds.
    #[arg(long, value_name = "SECS")]
    pub extend_active_secs: Option<u64>,
    /// More uncached input tokens.
    #[arg(long, value_name = "N")]
    pub extend_input_tokens: Option<u64>,
    /// More output tokens.
    #[arg(long, value_name = "N")]
    pub extend_output_tokens: Option<u64>,
    /// More cache-write tokens.
    #[arg(long, value_name = "N")]
    pub extend_cache_write_tokens: Option<u64>,
    /// More cache-read tokens.
    #[arg(long, value_name = "N")]
    pub extend_cache_read_tokens: Option<u64>,
    /// More spend, in USD (e.g. 2.50).
    #[arg(long, value_name = "USD")]
    pub extend_cost_usd: Option<f64>,
}

impl ExtendArgs {
    /// The extension, or `None` when no `--extend-…` was given. Errors: a
    /// negative, non-finite or too large amount of USD; an active time
    /// past `u64` milliseconds.
    pub fn limits(&self) -> Result<Option<BudgetLimits>> {
        let cost = match self.extend_cost_usd {
            Some(usd) if !usd.is_finite() || usd <= 0.0 || usd > 1e12 => {
                bail!("--extend-cost-usd must be a positive amount of USD (e.g. 2.50)")
            }
            Some(usd) => Some((usd * 1_000_000.0).round() as u64),
            None => None,
        };
        let active_ms = match self.extend_active_secs {
            Some(s) => Some(
                s.checked_mul(1000)
                    .context("--extend-active-secs is too large")?,
            ),
            None => None,
        };
        let limits = BudgetLimits {
            max_turns: self.extend_turns,
            max_tool_calls: self.extend_tool_calls,
            max_active_ms: active_ms,
            max_input_tokens: self.extend_input_tokens,
            max_output_tokens: self.extend_output_tokens,
            max_cache_write_tokens: self.extend_cache_write_tokens,
            max_cache_read_tokens: self.extend_cache_read_tokens,
            max_cost_usd_micros: cost,
        };
        Ok((limits != BudgetLimits::default()).then_some(limits))
    }
}

/// `glia runs` (with `list` and `get`, [`crate::runs_view::RunsCommand`]).
#[derive(Subcommand)]
pub enum RunsCommand {
    /// Print a run's events, one line each: time (UTC), seq, kind and a
    /// short summary (tool names and cut arguments, tokens and cost of
    /// model calls, errors). With --follow, keep printing as the run moves
    /// until it ends.
    Events {
        #[command(flatten)]
        server: Server,
        /// Run id.
        run_id: String,
        /// Only events after this sequence number.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Follow the run live (server-sent events, resumed after the last
        /// printed seq when the connection drops) until it is done; parks
        /// are printed and followed through.
        #[arg(long, short = 'f')]
        follow: bool,
        /// One event per line as JSON (the API's event objects).
        #[arg(long)]
        json: bool,
    },
    /// Pause a run at its next step boundary (an operator pause; `POST
    /// /v1/runs/{id}/pause`).
    Pause {
        #[command(flatten)]
        server: Server,
        /// Run id.
        run_id: String,
        /// Why (default: `paused by NAME`).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume a paused run, or withdraw a pause not yet in effect (`POST
    /// /v1/runs/{id}/resume`); with `--extend-…`, raise its budget limits
    /// first (a run paused by its budget resumes with the extension).
    Resume {
        #[command(flatten)]
        server: Server,
        /// Run id.
        run_id: String,
        #[command(flatten)]
        extend: ExtendArgs,
    },
    /// Erase a finished run's content (`DELETE /v1/runs/{id}`; the token
    /// needs the `erase` scope): goal, messages, tool arguments and
    /// results become tombstones, counts and costs stay. Repeating it is
    /// harmless.
    Delete {
        #[command(flatten)]
        server: Server,
        /// Run id.
        run_id: String,
    },
    /// Cancel a run (`POST /v1/runs/{id}/cancel`).
    Cancel {
        #[command(flatten)]
        server: Server,
        /// Run id.
        run_id: String,
        /// Why (default: `cancelled by NAME`).
        #[arg(long)]
        reason: Option<String>,
    },
}

/// Run a `glia runs` command.
pub async fn runs(cmd: RunsCommand) -> Result<()> {
    let client = http_client()?;
    match cmd {
        RunsCommand::Events {
            server,
            run_id,
            after,
            follow: true,
            json,
        } => {
            follow(&stream_client()?, &server, &run_id, after, json, true)
                .await
                .with_context(|| format!("following run {run_id}"))?;
        }
        RunsCommand::Events {
            server,
            run_id,
            mut after,
            follow: false,
            json,
        } => loop {
            let page = server
                .get(
                    &client,
                    &format!("/v1/runs/{run_id}/events?after={after}&limit=1000"),
                )
                .await?;
            let events = page["events"].as_array().cloned().unwrap_or_default();
            for e in &events {
                if json {
                    outln!("{e}");
                } else {
                    let event: Event = serde_json::from_value(e.clone()).with_context(|| {
                        format!("the dispatcher sent an event glia cannot read: {e}")
                    })?;
                    outln!("{}", event_line(&event));
                }
            }
            let next = page["next_after"].as_u64().unwrap_or(after);
            if events.is_empty() || next <= after {
                break;
            }
            after = next;
        },
        // Repeats are harmless (a second pause or resume answers 409), so
        // these go through the outage retry.
        RunsCommand::Pause {
            server,
            run_id,
            reason,
        } => {
            let body = reason.map_or_else(|| json!({}), |r| json!({ "reason": r }));
            let answer = server
                .call(
                    &client,
                    Method::POST,
                    &format!("/v1/runs/{run_id}/pause"),
                    Some(&body),
                    &[],
                )
                .await?
                .checked()?;
            outln!("{}", serde_json::to_string_pretty(&answer)?);
        }
        RunsCommand::Resume {
            server,
            run_id,
            extend,
        } => {
            let body = match extend.limits()? {
                Some(limits) => json!({ "extend": limits }),
                None => json!({}),
            };
            let answer = server
                .call(
                    &client,
                    Method::POST,
                    &format!("/v1/runs/{run_id}/resume"),
                    Some(&body),
                    &[],
                )
                .await?
                .checked()?;
            outln!("{}", serde_json::to_string_pretty(&answer)?);
        }
        // Erasure is idempotent, so it goes through the outage retry too.
        RunsCommand::Delete { server, run_id } => {
            let answer = server
                .call(
                    &client,
                    Method::DELETE,
                    &format!("/v1/runs/{run_id}"),
                    None,
                    &[],
                )
                .await?
                .checked()?;
            println!("{}", serde_json::to_string_pretty(&answer)?);
        }
        RunsCommand::Cancel {
            server,
            run_id,
            reason,
        } => {
            let body = reason.map_or_else(|| json!({}), |r| json!({ "reason": r }));
            let answer = server
                .call(
                    &client,
                    Method::POST,
                    &format!("/v1/runs/{run_id}/cancel"),
                    Some(&body),
                    &[],
                )
                .await?
                .checked()?;
            outln!("{}", serde_json::to_string_pretty(&answer)?);
        }
    }
    Ok(())
}

/// `glia approvals`.
#[derive(Subcommand)]
pub enum ApprovalsCommand {
    /// Pending approvals, oldest first.
    List {
        #[command(flatten)]
        server: Server,
        /// Only this tool's.
        #[arg(long)]
        tool: Option<String>,
        /// Print the API's answer (JSON) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Decided, expired and escalated approvals, newest first, from the
    /// run logs: resolution, decider, decision time, wait, edits.
    History {
        #[command(flatten)]
        server: Server,
        /// Only this tool's.
        #[arg(long)]
        tool: Option<String>,
        /// Only this resolution: approved, edited, rejected, expired,
        /// abandoned, pending, or escalated.
        #[arg(long)]
        resolution: Option<String>,
        /// At most this many (1 to 1,000).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Print CSV (one header row) instead of a table.
        #[arg(long, conflicts_with = "json")]
        csv: bool,
        /// Print the API's answer (JSON) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Approve a call.
    Approve {
        #[command(flatten)]
        server: Server,
        /// Run id.
        run_id: String,
        /// Call id.
        call_id: String,
    },
    /// Reject a call with a reason the model sees.
    Reject {
        #[command(flatten)]
        server: Server,
        /// Run id.
        run_id: String,
        /// Call id.
        call_id: String,
        /// Why.
        #[arg(long)]
        reason: String,
    },
}

/// Run a `glia approvals` command.
pub async fn approvals(cmd: ApprovalsCommand) -> Result<()> {
    let client = http_client()?;
    match cmd {
        ApprovalsCommand::List { server, tool, json } => {
            let mut query = vec![("status", "pending".to_owned())];
            query.extend(tool.map(|t| ("tool", t)));
            let body = server
                .get(&client, &with_query("/v1/approvals", &query)?)
                .await?;
            if json {
                return print_json(&body);
            }
            let rows = body["approvals"]
                .as_array()
                .or(body.as_array())
                .cloned()
                .unwrap_or_default();
            let now = chrono::Utc::now();
            for a in rows {
                outln!(
                    "{}  {}  {}  {}{}{}",
                    a["run_id"].as_str().unwrap_or("?"),
                    a["call_id"].as_str().unwrap_or("?"),
                    a["tool"].as_str().unwrap_or("?"),
                    a["input"],
                    deadline_mark(&a, now),
                    // An interrupted call may already have taken effect: say so.
                    if a["interrupted"].as_bool() == Some(true) {
                        "  [interrupted: may already have run; check before running it again]"
                    } else {
                        ""
                    },
                );
            }
        }
        ApprovalsCommand::History {
            server,
            tool,
            resolution,
            limit,
            csv,
            json,
        } => {
            let mut query = vec![("limit", limit.to_string())];
            query.extend(tool.map(|t| ("tool", t)));
            query.extend(resolution.map(|r| ("resolution", r)));
            if csv {
                query.push(("format", "csv".into()));
                let resp = server
                    .request(&client, Method::GET, "/v1/approvals/history")
                    .query(&query)
                    .send()
                    .await?;
                let status = resp.status();
                let text = resp.text().await?;
                anyhow::ensure!(status.is_success(), "dispatcher answered {status}: {text}");
                out!("{text}");
                return Ok(());
            }
            let body = checked(
                server
                    .request(&client, Method::GET, "/v1/approvals/history")
                    .query(&query)
                    .send()
                    .await?,
            )
            .await?;
            if json {
                return print_json(&body);
            }
            outln!(
                "{:<20}  {:<36}  {:<10}  {:<16}  {:<9}  {:<12}  {:>8}  DETAIL",
                "REQUESTED",
                "RUN",
                "CALL",
                "TOOL",
                "RESULT",
                "BY",
                "WAIT"
            );
            for r in body["approvals"].as_array().cloned().unwrap_or_default() {
                let wait = r["wait_ms"].as_i64().map_or_else(|| "?".into(), human_ms);
                let mut detail = Vec::new();
                if r["escalated_at"].is_string() {
                    detail.push("escalated".to_owned());
                }
                if r["interrupted"].as_bool() == Some(true) {
                    detail.push("interrupted".to_owned());
                }
                match r["decision"]["kind"].as_str() {
                    Some("reject") => detail.push(format!(
                        "reason: {}",
                        r["decision"]["reason"].as_str().unwrap_or("")
                    )),
                    Some("edit") => detail.push(format!(
                        "edited: {} -> {}",
                        r["input"], r["decision"]["input"]
                    )),
                    _ => {}
                }
                outln!(
                    "{:<20}  {:<36}  {:<10}  {:<16}  {:<9}  {:<12}  {:>8}  {}",
                    r["requested_at"]
                        .as_str()
                        .unwrap_or("?")
                        .chars()
                        .take(19)
                        .collect::<String>(),
                    r["run_id"].as_str().unwrap_or("?"),
                    r["call_id"].as_str().unwrap_or("?"),
                    r["tool"].as_str().unwrap_or("?"),
                    r["resolution"].as_str().unwrap_or("?"),
                    r["decided_by"].as_str().unwrap_or("-"),
                    wait,
                    detail.join("; "),
                );
            }
        }
        ApprovalsCommand::Approve {
            server,
            run_id,
            call_id,
        } => {
            decide(
                &client,
                &server,
                &run_id,
                &call_id,
                json!({ "decision": "approve" }),
            )
            .await?
        }
        ApprovalsCommand::Reject {
            server,
            run_id,
            call_id,
            reason,
        } => {
            decide(
                &client,
                &server,
                &run_id,
                &call_id,
                json!({ "decision": "reject", "reason": reason }),
            )
            .await?
        }
    }
    Ok(())
}

/// `path?k=v&…`, each value URL-encoded.
fn with_query(path: &str, query: &[(&str, String)]) -> Result<String> {
    let url = reqwest::Url::parse_with_params(&format!("http://glia{path}"), query)?;
    Ok(match url.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    })
}

/// Print an API answer as indented JSON (the `--json` of read commands).
pub fn print_json(body: &Value) -> Result<()> {
    outln!("{}", serde_json::to_string_pretty(body)?);
    Ok(())
}

/// `  [due in 4m 10s]`, `  [OVERDUE by 12s]`, `  [escalated]` or nothing
/// (no deadline), for an approval row of `GET /v1/approvals`.
fn deadline_mark(row: &Value, now: chrono::DateTime<chrono::Utc>) -> String {
    let escalated = if row["escalated"].as_bool() == Some(true) {
        "  [escalated]"
    } else {
        ""
    };
    let Some(at) = row["expires_at"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
    else {
        return escalated.to_owned();
    };
    let left = (at.with_timezone(&chrono::Utc) - now).num_milliseconds();
    if left > 0 {
        format!("  [due in {}]{escalated}", human_ms(left))
    } else {
        format!("  [OVERDUE by {}]{escalated}", human_ms(-left))
    }
}

/// `950ms`, `12s`, `4m 10s`, `2h 05m`.
fn human_ms(ms: i64) -> String {
    match ms {
        ..1000 => format!("{ms}ms"),
        1000..60_000 => format!("{}s", ms / 1000),
        60_000..3_600_000 => format!("{}m {:02}s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{}h {:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

async fn decide(
    client: &Client,
    server: &Server,
    run_id: &str,
    call_id: &str,
    body: Value,
) -> Result<()> {
    let answer = server
        .call(
            client,
            Method::POST,
            &format!("/v1/runs/{run_id}/approvals/{call_id}"),
            Some(&body),
            &[],
        )
        .await?;
    // A retry whose earlier attempt landed (its answer lost) finds the call decided.
    if answer.attempts > 1
        && answer.status == StatusCode::CONFLICT
        && answer.code() == "already_decided"
    {
        errln!(
            "decision posted (the approval is decided; an earlier attempt's answer was lost, so check `glia runs events {run_id}` for whose decision it was)"
        );
        return Ok(());
    }
    answer.checked()?;
    errln!("decision posted");
    Ok(())
}

/// `glia webhooks`.
#[derive(Subcommand)]
pub enum WebhooksCommand {
    /// Subscribe a URL; prints the subscription and its signing secret (shown once).
    Create {
        #[command(flatten)]
        server: Server,
        /// Receiver URL.
        url: String,
        /// An event type (repeatable; default all): approval.requested,
        /// approval.escalated, approval.expired, approval.resolved,
        /// run.completed, run.failed.
        #[arg(long = "event")]
        events: Vec<String>,
        /// Post Slack messages (incoming-webhook format) linking to the inbox.
        #[arg(long)]
        slack: bool,
    },
    /// The tenant's subscriptions.
    List {
        #[command(flatten)]
        server: Server,
        /// Print the API's answer (JSON) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove a subscription.
    Delete {
        #[command(flatten)]
        server: Server,
        /// Subscription id.
        id: String,
    },
    /// A subscription's delivery log, newest first.
    Deliveries {
        #[command(flatten)]
        server: Server,
        /// Subscription id.
        id: String,
        /// Print the API's answer (JSON) instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Run a `glia webhooks` command.
pub async fn webhooks(cmd: WebhooksCommand) -> Result<()> {
    let client = http_client()?;
    match cmd {
        WebhooksCommand::Create {
            server,
            url,
            events,
            slack,
        } => {
            let mut body =
                json!({ "url": url, "format": if slack { "slack" } else { "standard" } });
            if !events.is_empty() {
                body["events"] = json!(events);
            }
            let created = checked(
                server
                    .request(&client, Method::POST, "/v1/webhooks")
                    .json(&body)
                    .send()
                    .await?,
            )
            .await?;
            outln!("{}", serde_json::to_string_pretty(&created)?);
            errln!("keep the secret: it is not shown again");
        }
        WebhooksCommand::List { server, json } => {
            let body = checked(
                server
                    .request(&client, Method::GET, "/v1/webhooks")
                    .send()
                    .await?,
            )
            .await?;
            if json {
                return print_json(&body);
            }
            for w in body["webhooks"].as_array().cloned().unwrap_or_default() {
                outln!(
                    "{}  {:<8}  {}  {}",
                    w["id"].as_str().unwrap_or("?"),
                    w["format"].as_str().unwrap_or("?"),
                    w["url"].as_str().unwrap_or("?"),
                    w["events"]
                );
            }
        }
        WebhooksCommand::Delete { server, id } => {
            let resp = server
                .request(&client, Method::DELETE, &format!("/v1/webhooks/{id}"))
                .send()
                .await?;
            if !resp.status().is_success() {
                checked(resp).await?;
            }
            errln!("deleted");
        }
        WebhooksCommand::Deliveries { server, id, json } => {
            let body = checked(
                server
                    .request(
                        &client,
                        Method::GET,
                        &format!("/v1/webhooks/{id}/deliveries"),
                    )
                    .send()
                    .await?,
            )
            .await?;
            if json {
                return print_json(&body);
            }
            for d in body["deliveries"].as_array().cloned().unwrap_or_default() {
                outln!(
                    "{}  {:<18}  {:<9}  attempts {:<3}  {}  {}",
                    d["created_at"]
                        .as_str()
                        .unwrap_or("?")
                        .chars()
                        .take(19)
                        .collect::<String>(),
                    d["event_type"].as_str().unwrap_or("?"),
                    d["status"].as_str().unwrap_or("?"),
                    d["attempts"],
                    d["last_status"]
                        .as_u64()
                        .map_or_else(|| "-".to_owned(), |s| s.to_string()),
                    d["last_error"].as_str().unwrap_or(""),
                );
            }
        }
    }
    Ok(())
}

/// One line about an event, for people: its time (UTC, to the ms), seq,
/// kind and [`describe`].
pub fn event_line(event: &Event) -> String {
    format!(
        "{}  {:>4}  {:<18} {}",
        event.at.format("%H:%M:%S%.3f"),
        event.seq,
        event.kind.name(),
        describe(&event.kind)
    )
}

/// The wire name of a value that serialises as a string (an enum's
/// `snake_case` name: `outcome_unknown`, `tool_use`), else its compact
/// JSON: never Rust's debug text.
fn wire<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(s)) => s,
        Ok(v) => v.to_string(),
        Err(_) => "?".into(),
    }
}

/// `$0.0012` for USD micros.
fn usd(micros: u64) -> String {
    format!("${:.4}", micros as f64 / 1e6)
}

/// A set of budget limits for people: `11 turns, 10 tool calls, $2.0000`
/// (the unset ones, unlimited, left out).
fn limits_text(l: &BudgetLimits) -> String {
    let mut parts = Vec::new();
    let counts = [
        (l.max_turns, "turns"),
        (l.max_tool_calls, "tool calls"),
        (l.max_input_tokens, "input tokens"),
        (l.max_output_tokens, "output tokens"),
        (l.max_cache_write_tokens, "cache-write tokens"),
        (l.max_cache_read_tokens, "cache-read tokens"),
    ];
    for (n, what) in counts {
        if let Some(n) = n {
            parts.push(format!("{n} {what}"));
        }
    }
    if let Some(ms) = l.max_active_ms {
        parts.push(format!(
            "{} active",
            human_ms(i64::try_from(ms).unwrap_or(i64::MAX))
        ));
    }
    if let Some(c) = l.max_cost_usd_micros {
        parts.push(usd(c));
    }
    if parts.is_empty() {
        "no limit".into()
    } else {
        parts.join(", ")
    }
}

/// One line about an event, for people: no content beyond cut text, never
/// Rust's debug text.
pub fn describe(kind: &EventKind) -> String {
    fn clip(s: &str) -> String {
        let one_line = s.replace('\n', " ");
        if one_line.chars().count() > 100 {
            format!("{}…", one_line.chars().take(100).collect::<String>())
        } else {
            one_line
        }
    }
    match kind {
        EventKind::SessionStart { goal, config, .. } => {
            format!("goal: {} (model {})", clip(goal), config.model)
        }
        EventKind::PlanDraft { steps, .. } | EventKind::PlanCommit { steps } => {
            format!("{} step(s): {}", steps.len(), clip(&steps.join(" | ")))
        }
        EventKind::StepStart {
            index,
            description,
            tools,
        } => format!("#{index} {} ({} tools)", clip(description), tools.len()),
        EventKind::StepEnd {
            index,
            answer,
            skipped,
        } => format!(
            "#{index}{} {}",
            if *skipped { " skipped" } else { "" },
            clip(answer)
        ),
        EventKind::ModelCall {
            model,
            messages,
            wrap_up,
            ..
        } => format!(
            "{model}, {messages} messages{}",
            if *wrap_up { ", wrap-up" } else { "" }
        ),
        EventKind::ModelRetry(r) => format!(
            "attempt {} failed ({}), retrying in {} ms: {}",
            r.attempt,
            r.cause,
            r.delay_ms,
            clip(&r.message)
        ),
        EventKind::MessageElided { index, reason } => format!("message {index}: {}", clip(reason)),
        EventKind::ModelResponse {
            message,
            usage,
            stop_reason,
            rejected,
            duration_ms,
            cost_usd_micros,
            ..
        } => {
            let calls: Vec<String> = message
                .tool_uses()
                .map(|(id, name, _)| format!("{name}#{id}"))
                .collect();
            let text = clip(&message.text());
            let rejected = rejected.as_ref().map_or(String::new(), |r| {
                let turn = r.refused_turn.map_or(String::new(), |t| {
                    format!(", {} (message {})", t.turn.describe(), t.index)
                });
                format!(
                    " rejected ({}: {}{turn})",
                    r.class.label(),
                    r.action.label()
                )
            });
            let estimated = if usage.estimated { ", estimated" } else { "" };
            let cached = if usage.cache_read_tokens + usage.cache_write_tokens > 0 {
                format!(
                    " / cache read {} write {}",
                    usage.cache_read_tokens, usage.cache_write_tokens
                )
            } else {
                String::new()
            };
            format!(
                "[{stop_reason}]{rejected} {}{} (in {} / out {}{cached} tokens{estimated}, {}, {})",
                text,
                if calls.is_empty() {
                    String::new()
                } else {
                    format!(" calls {}", calls.join(", "))
                },
                usage.input_tokens,
                usage.output_tokens,
                usd(*cost_usd_micros),
                human_ms(i64::try_from(*duration_ms).unwrap_or(i64::MAX))
            )
        }
        EventKind::ToolCall(c) => {
            let next = match &c.disposition {
                glia_proto::Disposition::Run { .. } => "run".to_owned(),
                glia_proto::Disposition::External => "external".to_owned(),
                glia_proto::Disposition::Approval => "approval".to_owned(),
                // issue 32: waits
                glia_proto::Disposition::Wait { wait } => match wait {
                    glia_proto::Wait::Timer { wake_at_ms, .. } => {
                        format!("sleep until {}", glia_proto::wait::rfc3339_ms(*wake_at_ms))
                    }
                    glia_proto::Wait::Event {
                        key, timeout_at_ms, ..
                    } => format!(
                        "wait for event {key} until {}",
                        glia_proto::wait::rfc3339_ms(*timeout_at_ms)
                    ),
                },
                glia_proto::Disposition::Child => "child run".to_owned(),
                glia_proto::Disposition::Refused { error, message } => {
                    format!("refused ({}): {}", wire(error), clip(message))
                }
            };
            format!(
                "{}#{} {} → {next}",
                c.name,
                c.call_id,
                clip(&c.input.to_string())
            )
        }
        EventKind::ToolResult {
            call_id,
            content,
            duration_ms,
            ..
        } => format!(
            "#{call_id} {} ({})",
            clip(&content.to_text()),
            human_ms(i64::try_from(*duration_ms).unwrap_or(i64::MAX))
        ),
        EventKind::ToolError {
            call_id,
            error,
            message,
            ..
        } => format!("#{call_id} {}: {}", wire(error), clip(message)),
        EventKind::ToolRecovered {
            call_id,
            idempotency_key,
        } => format!(
            "#{call_id} result held by the worker that ran it, recovered ({idempotency_key})"
        ),
        EventKind::ToolSourceUnavailable {
            server,
            reason,
            attempt,
            retry_in_ms,
        } => match retry_in_ms {
            Some(ms) => format!(
                "{server}: attempt {attempt}, again in {ms} ms: {}",
                clip(reason)
            ),
            None => format!("{server}: attempt {attempt}, the last: {}", clip(reason)),
        },
        EventKind::ToolsChanged {
            added,
            removed,
            changed,
        } => format!(
            "added: {}; removed: {}; changed: {}",
            clip(&added.join(", ")),
            clip(&removed.join(", ")),
            clip(&changed.join(", "))
        ),
        EventKind::ApprovalRequested {
            call_id,
            tool,
            input,
            ..
        } => format!("{tool}#{call_id} {}", clip(&input.to_string())),
        EventKind::ApprovalResolved {
            call_id,
            decision,
            by,
            ..
        } => {
            let decision = match decision {
                glia_proto::Decision::Approve => "approved".to_owned(),
                glia_proto::Decision::Reject { reason } => format!("rejected ({})", clip(reason)),
                glia_proto::Decision::Edit { .. } => "approved with edits".to_owned(),
                glia_proto::Decision::Expire => "expired".to_owned(),
            };
            format!("#{call_id} {decision} by {}", by.as_deref().unwrap_or("?"))
        }
        EventKind::ApprovalEscalated {
            call_id,
            expires_at,
        } => format!(
            "#{call_id} deadline {} passed: escalated",
            expires_at.map_or_else(|| "?".into(), |t| t.to_rfc3339())
        ),
        EventKind::ApprovalContested {
            call_id,
            by,
            chose,
            attempted_at,
        } => format!(
            "#{call_id} {} by {} at {} lost: already decided",
            chose.as_str(),
            by.as_deref().unwrap_or("?"),
            attempted_at.to_rfc3339()
        ),
        EventKind::InputReceived { text, .. } => clip(text),
        EventKind::GuardrailTripped {
            stage,
            guardrail,
            reason,
            ..
        } => format!("{} {guardrail}: {}", wire(stage), clip(reason)),
        EventKind::ContextCompacted {
            strategy, removed, ..
        } => format!("{strategy}: removed {removed} messages"),
        EventKind::BudgetWarn { limit, .. } => format!("limit {limit} reached"),
        EventKind::BudgetExtended { limits } => format!("limits now {}", limits_text(limits)),
        EventKind::SessionPause { pull_point } => {
            let v = serde_json::to_value(pull_point).unwrap_or(Value::Null);
            let mut text = pull_point.name().to_owned();
            if let Some(ids) = v["call_ids"].as_array() {
                let ids: Vec<String> = ids
                    .iter()
                    .filter_map(Value::as_str)
                    .map(|id| format!("#{id}"))
                    .collect();
                text = format!("{text} {}", ids.join(", "));
            }
            if let Some(reason) = v["reason"]["kind"].as_str() {
                text = format!("{text} ({reason})");
            }
            text
        }
        EventKind::SessionPauseRequested { reason, by } => {
            format!("{} (by {})", clip(reason), by.as_deref().unwrap_or("?"))
        }
        EventKind::SessionResume { by } => format!("by {}", by.as_deref().unwrap_or("?")),
        EventKind::SessionCancel { reason } => clip(reason),
        EventKind::SessionComplete { outcome } => match outcome {
            Outcome::Succeeded { answer, .. } => format!("succeeded: {}", clip(answer)),
            Outcome::Failed { error } => format!("failed: {}", clip(error)),
            Outcome::Cancelled { reason } => format!("cancelled: {}", clip(reason)),
        },
        EventKind::Error { message, fatal } => {
            format!("{}{}", if *fatal { "fatal: " } else { "" }, clip(message))
        }
        EventKind::HookApplied {
            topic,
            hook,
            effect,
            call,
        } => format!(
            "{} {hook}: {}{}",
            wire(topic),
            clip(&serde_json::to_string(effect).unwrap_or_default()),
            call.as_ref()
                .filter(|c| c.outcome != glia_proto::HookOutcome::Answered)
                .map(|c| format!(" (hook {}, failure mode applied)", c.outcome.name()))
                .unwrap_or_default()
        ),
        // Issue 32, child runs.
        EventKind::ChildEnded {
            call_id,
            child_run_id,
            agent,
            outcome,
            usage,
            cost_usd_micros,
        } => {
            let child = child_run_id.map_or_else(|| "not started".to_owned(), |id| id.to_string());
            let how = match outcome {
                Outcome::Succeeded { answer, .. } => format!("succeeded: {}", clip(answer)),
                Outcome::Failed { error } => format!("failed: {}", clip(error)),
                Outcome::Cancelled { reason } => format!("cancelled: {}", clip(reason)),
            };
            format!(
                "{agent}#{call_id} child {child} {how} ({} in / {} out tokens, {})",
                usage.input_tokens,
                usage.output_tokens,
                usd(*cost_usd_micros)
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use axum::Router;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::post;

    use super::*;

    #[test]
    fn a_start_time_is_rfc3339_with_an_offset() {
        let at = parse_start_at("2026-12-08T09:00:00+01:00").unwrap();
        assert_eq!(at.timestamp(), 1_796_716_800, "08:00 UTC");
        for bad in ["tomorrow", "2026-12-08T09:00:00", "2026-12-08"] {
            let e = parse_start_at(bad).unwrap_err();
            assert!(e.contains("RFC 3339") && e.contains(bad), "{e}");
        }
    }

    /// A dispatcher stand-in on a loopback port whose `POST /v1/runs` fails
    /// with `failing` for the first `failures` requests, then answers 201
    /// echoing the `Idempotency-Key`; returns its URL and the request count.
    async fn flaky(failures: u32, failing: StatusCode) -> (String, Arc<AtomicU32>) {
        let seen = Arc::new(AtomicU32::new(0));
        let count = seen.clone();
        let app = Router::new().route(
            "/v1/runs",
            post(move |headers: HeaderMap| {
                let n = count.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < failures {
                        let body = json!({"error": {"code": "not_ready", "message": "starting"}});
                        return (
                            failing,
                            [(reqwest::header::RETRY_AFTER, "0")],
                            axum::Json(body),
                        );
                    }
                    let key = headers
                        .get("idempotency-key")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    (
                        StatusCode::CREATED,
                        [(reqwest::header::RETRY_AFTER, "0")],
                        axum::Json(json!({"run_id": key})),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (url, seen)
    }

    fn server(url: &str, max_outage_secs: u64) -> Server {
        Server {
            server: url.to_owned(),
            token: None,
            max_outage_secs,
        }
    }

    #[tokio::test]
    async fn transient_answers_are_retried_with_the_same_idempotency_key() {
        for status in [
            StatusCode::BAD_GATEWAY,
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::GATEWAY_TIMEOUT,
        ] {
            let (url, seen) = flaky(2, status).await;
            let answer = server(&url, 30)
                .call(
                    &http_client().unwrap(),
                    Method::POST,
                    "/v1/runs",
                    Some(&json!({})),
                    &[("Idempotency-Key", "k1")],
                )
                .await
                .unwrap();
            assert_eq!(
                (answer.status, answer.attempts, seen.load(Ordering::SeqCst)),
                (StatusCode::CREATED, 3, 3),
                "{status}"
            );
            assert_eq!(answer.body["run_id"], "k1", "every attempt carried the key");
        }
    }

    #[tokio::test]
    async fn a_refusal_is_not_retried() {
        let (url, seen) = flaky(1, StatusCode::CONFLICT).await;
        let answer = server(&url, 30)
            .call(
                &http_client().unwrap(),
                Method::POST,
                "/v1/runs",
                Some(&json!({})),
                &[],
            )
            .await
            .unwrap();
        assert_eq!(
            (answer.status, answer.attempts, seen.load(Ordering::SeqCst)),
            (StatusCode::CONFLICT, 1, 1)
        );
        assert!(
            answer
                .checked()
                .unwrap_err()
                .to_string()
                .contains("409 Conflict: not_ready: starting")
        );
    }

    /// A decision whose first attempt landed but whose answer was lost: the
    /// retry finds the call decided (409 `already_decided`), which is the
    /// decision having been posted; without a retry the same 409 is an error.
    #[tokio::test]
    async fn a_decision_repeated_after_a_lost_answer_is_done() {
        let seen = Arc::new(AtomicU32::new(0));
        let count = seen.clone();
        let app = Router::new().route(
            "/v1/runs/{run}/approvals/{call}",
            post(move || {
                let n = count.fetch_add(1, Ordering::SeqCst);
                async move {
                    let (status, code) = if n == 0 {
                        (StatusCode::BAD_GATEWAY, "upstream")
                    } else {
                        (StatusCode::CONFLICT, "already_decided")
                    };
                    (
                        status,
                        axum::Json(json!({"error": {"code": code, "message": "…"}})),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let client = http_client().unwrap();
        decide(
            &client,
            &server(&url, 30),
            "r1",
            "c1",
            json!({"decision": "approve"}),
        )
        .await
        .expect("a repeat after a lost answer is done");
        assert_eq!(seen.load(Ordering::SeqCst), 2);
        let err = decide(
            &client,
            &server(&url, 30),
            "r1",
            "c1",
            json!({"decision": "approve"}),
        )
        .await
        .expect_err("decided by someone else");
        assert!(err.to_string().contains("already_decided"), "{err}");
    }

    #[tokio::test]
    async fn past_the_bound_the_error_names_the_server_and_the_last_error() {
        let (url, _) = flaky(u32::MAX, StatusCode::SERVICE_UNAVAILABLE).await;
        let err = server(&url, 1)
            .call(
                &http_client().unwrap(),
                Method::POST,
                "/v1/runs",
                Some(&json!({})),
                &[],
            )
            .await
            .unwrap_err();
        let unreachable = err
            .downcast_ref::<Unreachable>()
            .expect("an Unreachable error");
        assert!(
            unreachable.attempts > 1 && unreachable.waited >= Duration::from_secs(1),
            "{unreachable:?}"
        );
        assert_eq!(unreachable.last, "503 Service Unavailable: starting");
        assert!(
            err.to_string()
                .starts_with(&format!("the dispatcher at {url} did not answer for ")),
            "{err}"
        );

        // Nobody listening: the connection error, with its cause.
        let closed = format!(
            "http://127.0.0.1:{}",
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        );
        let err = server(&closed, 0)
            .get(&http_client().unwrap(), "/v1/runs")
            .await
            .unwrap_err();
        let unreachable = err
            .downcast_ref::<Unreachable>()
            .expect("an Unreachable error");
        assert_eq!(unreachable.attempts, 1, "a bound of 0 tries once");
        assert!(
            unreachable.last.contains("onnection refused"),
            "{unreachable:?}"
        );
    }

    #[test]
    fn deadline_marks() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-01-01T12:00:00Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        assert_eq!(deadline_mark(&json!({}), now), "");
        assert_eq!(
            deadline_mark(&json!({"expires_at": "2026-01-01T12:04:10Z"}), now),
            "  [due in 4m 10s]"
        );
        assert_eq!(
            deadline_mark(
                &json!({"expires_at": "2026-01-01T11:59:48Z", "escalated": true}),
                now
            ),
            "  [OVERDUE by 12s]  [escalated]"
        );
        assert_eq!(human_ms(950), "950ms");
        assert_eq!(human_ms(7_500_000), "2h 05m");
    }
}
