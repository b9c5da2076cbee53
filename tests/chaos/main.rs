//! The chaos suite: a mixed workload on a dispatcher and three workers over
//! PRIVATE Postgres, RabbitMQ and Redis instances, while a seeded schedule
//! injects faults, then the fleet's guarantees checked against the event
//! logs and the refund tool's own ledger, and printed as figures.
//!
//! Workload (client threads, each submitting and driving runs until the
//! faults are over): scripted runs with a consequential refund behind an
//! approval (the demo refund takes `GLIA_DEMO_TOOL_DELAY_MS` = 800 ms, so
//! kills land mid-call), external tools answered by the client,
//! conversational turns, budget pauses resumed, and cancels of parked runs.
//! Two tenants (bearer tokens): half the clients submit as `acme`, half as
//! `globex`, which has a daily token cap (`glia worker --tenant-caps`) sized
//! to be reached within the round; a run paused at the cap is left parked.
//!
//! Faults, drawn from the seed: `kill -9` of a worker (aimed, when one is
//! executing a refund, at that worker: the figures count how many kills
//! landed mid-call) or of the dispatcher, SIGSTOP of a worker past its
//! lease then SIGCONT, a network partition of a worker past its lease (each
//! worker reaches Postgres, RabbitMQ and Redis through proxies of its own,
//! `glia_testkit::proxy`, which stop forwarding and later resume on the
//! same connections: the process runs on, cut off), RabbitMQ stopped and
//! started, Postgres stopped with `-m fast` and with `-m immediate` (a
//! crash) and started 500–2500 ms later (aimed, like the kills, at a
//! refund in flight: its result must be committed through the outage or
//! recovered from the worker's held copy), Redis FLUSHALL. After each fault, recovery is the
//! time until a fresh probe run completes.
//!
//! Checked at the end (figures printed first, then asserted): no run lost
//! (every submitted run is in the fleet), none stuck (every run done within
//! the deadline), none failed (each ends as its kind must: cancelled runs
//! cancelled, the rest succeeded or parked at the tenant cap), no duplicate
//! or missing sequence number,
//! every log replays; no model call past the run's turn budget (replayed
//! from the log); the capped tenant's spend per UTC day, summed from its
//! runs' logs, past its cap by no more than the calls in flight at each
//! Redis flush ([`tenant_cap_allowance`]), and its runs paused at the cap
//! still parked there at the end (the uncapped tenant's never); per refund
//! call, executions in the tool's ledger
//! versus results in the log: never two executions, a second delivery of a
//! call's idempotency key only where a person approved re-running it (the
//! refund tool answers it from the first, as a payments API does), and
//! every call without a recorded result surfaced as outcome-unknown; and
//! no refund in flight at a Postgres stop that executed is put to a person
//! again (`approval.requested` with `interrupted: true`) or given up as
//! outcome-unknown. And that the faults landed: a round with worker kills
//! or Postgres stops must have had one land while a refund was in flight
//! and an interrupted call in some log (outcome-unknown, re-approved or
//! recovered from the held copy); a round with partitions must have cut off
//! a worker holding runs (partitions are aimed, like kills, and last until
//! one of its runs is taken over, 30 s at most) and seen one taken over.
//!
//! `cargo test -p glia-e2e --test chaos` runs the short round: a fixed seed
//! and a random one (printed), `GLIA_CHAOS_FAULTS` faults each (default 8:
//! the schedule draws the kinds in a seeded order, each once per block of
//! eight, so the short round has every kind).
//! The long round: `GLIA_CHAOS_FAULTS=200 cargo test -p glia-e2e --test
//! chaos -- --ignored --nocapture` (see RELIABILITY.md). Replay a seed with
//! `GLIA_CHAOS_SEED=<seed>`.

use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use glia_proto::{Event, EventKind, Limit, PauseReason, PullPoint, RunState, ToolErrorKind};
use glia_testkit::fleet::{Fleet, check_log, mixed_config, mixed_scripts};
use glia_testkit::postgres::StopMode;
use glia_testkit::proxy::Partition;
use glia_testkit::{PrivatePostgres, PrivateRabbit, PrivateRedis};
use serde_json::{Value, json};

/// Worker leases in the chaos fleet (SIGSTOP holds a worker past this).
const LEASE_MS: u64 = 2_000;
/// How long the demo refund takes (the window for mid-call kills).
const REFUND_MS: u64 = 800;
/// Client threads driving runs: the first half for tenant [`ACME`], the
/// rest for [`GLOBEX`].
const CLIENTS: usize = 4;
/// The uncapped tenant (and the probes'): `(token, tenant)`.
const ACME: (&str, &str) = ("chaos-acme", "acme");
/// The tenant with a daily token cap: `(token, tenant)`.
const GLOBEX: (&str, &str) = ("chaos-globex", "globex");
/// The suite's own token (scope admin: it reads every tenant's runs).
const OPS: &str = "chaos-ops";
/// [`GLOBEX`]'s daily token cap per fault of the round (so it is reached
/// within the round, long or short, and the round goes on past it).
const CAP_TOKENS_PER_FAULT: u64 = 500;
/// `max_tokens` of [`GLOBEX`]'s runs: what the gate reserves for a call's
/// output (small, so the cap is approached closely).
const GLOBEX_MAX_TOKENS: u64 = 300;
/// The kinds of run, cycled through by the clients.
const KINDS: [&str; 7] = [
    "plain",
    "approval",
    "external",
    "chat",
    "budget",
    "cancel",
    "reapprove",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    KillWorker,
    KillDispatcher,
    PauseWorker,
    RabbitRestart,
    PostgresFast,
    PostgresImmediate,
    RedisFlush,
    /// A worker cut off from Postgres, RabbitMQ and Redis past its lease
    /// (its process keeps running), then let through again.
    PartitionWorker,
}

const FAULTS: [Fault; 8] = [
    Fault::KillWorker,
    Fault::KillDispatcher,
    Fault::PauseWorker,
    Fault::RabbitRestart,
    Fault::PostgresFast,
    Fault::PostgresImmediate,
    Fault::RedisFlush,
    Fault::PartitionWorker,
];

/// The private services of a round.
struct Services {
    pg: PrivatePostgres,
    rabbit: PrivateRabbit,
    redis: PrivateRedis,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

impl Services {
    /// Start all three, or `None` when one is not installed (a failure
    /// under `GLIA_TEST_STRICT=1`: see `glia_testkit::require`).
    fn start() -> Option<Services> {
        let pg = glia_testkit::require(
            PrivatePostgres::start_new(),
            "PostgreSQL's server binaries (initdb, pg_ctl)",
            "apt-get install postgresql; scripts/test does",
        )?;
        let mut rabbit = glia_testkit::require(
            PrivateRabbit::new(),
            "the rabbitmq-server script",
            "apt-get install rabbitmq-server; scripts/test does",
        )?;
        let mut redis = PrivateRedis::new();
        rabbit.start().expect("spawn rabbitmq-server");
        redis.start().expect("spawn redis-server");
        let rt = runtime();
        rt.block_on(rabbit.wait_ready(Duration::from_secs(120)));
        rt.block_on(redis.wait_ready(Duration::from_secs(30)));
        Some(Services { pg, rabbit, redis })
    }
}

/// One HTTP call as `token` that may fail while the dispatcher is down.
fn call(
    token: &str,
    method: &str,
    url: &str,
    body: Option<&Value>,
    key: Option<&str>,
) -> Option<(u16, Value)> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .ok()?;
    let mut req = client
        .request(method.parse().unwrap(), url)
        .bearer_auth(token);
    if let Some(b) = body {
        req = req.json(b);
    }
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let resp = req.send().ok()?;
    let status = resp.status().as_u16();
    let text = resp.text().ok()?;
    Some((
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

/// Retry `call` through outages (connection errors and 5xx) until `deadline`.
fn call_through(
    token: &str,
    method: &str,
    url: &str,
    body: Option<&Value>,
    key: Option<&str>,
    deadline: Instant,
) -> Option<(u16, Value)> {
    loop {
        match call(token, method, url, body, key) {
            Some((s, v)) if s < 500 => return Some((s, v)),
            _ if Instant::now() > deadline => return None,
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// What the clients did.
#[derive(Default)]
struct Submitted {
    /// `(kind, run_id)` of every run the dispatcher admitted.
    runs: Vec<(String, String)>,
}

/// Submit a run of `kind` as `tenant` (idempotently, so a retry after an
/// outage creates it once); `None` past the deadline.
fn submit(
    server: &str,
    tenant: (&str, &str),
    kind: &str,
    n: usize,
    seed: u64,
    deadline: Instant,
) -> Option<String> {
    let mut config = match kind {
        "cancel" => mixed_config("external"),
        "reapprove" => mixed_config("approval"),
        _ => mixed_config(kind),
    };
    if kind == "reapprove" {
        config["on_interrupted_call"] = json!("require_approval");
    }
    if tenant == GLOBEX {
        config["max_tokens"] = json!(GLOBEX_MAX_TOKENS);
    }
    let body = json!({"goal": format!("{kind} #{n}"), "config": config});
    let key = format!("chaos-{seed}-{n}");
    let (status, run) = call_through(
        tenant.0,
        "POST",
        &format!("{server}/v1/runs"),
        Some(&body),
        Some(&key),
        deadline,
    )?;
    assert!(
        status == 201 || status == 200,
        "submit {kind}: {status} {run}"
    );
    Some(run["run_id"].as_str()?.to_owned())
}

/// Whether the approval pending for `call_id` is an interrupted call's
/// re-approval (`approval.requested` with `interrupted: true`).
fn interrupted(
    server: &str,
    token: &str,
    run_id: &str,
    call_id: &str,
    deadline: Instant,
) -> Option<bool> {
    let (_, body) = call_through(
        token,
        "GET",
        &format!("{server}/v1/runs/{run_id}/events?after=0&limit=1000"),
        None,
        None,
        deadline,
    )?;
    let events = body["events"].as_array().or(body.as_array())?.clone();
    let last = events
        .iter()
        .rev()
        .find(|e| e["type"] == "approval.requested" && e["data"]["call_id"] == call_id)?;
    Some(last["data"]["interrupted"] == true)
}

/// Whether `run` (as the API shows it) is parked paused at its tenant's
/// daily cap.
fn at_tenant_cap(run: &Value) -> bool {
    run["status"] == "parked"
        && run["pull_point"]["kind"] == "paused"
        && run["pull_point"].to_string().contains("tenant_daily")
}

/// Drive a run to its end through outages as `token`; returns the final run
/// (or the run parked at its tenant's cap, which only the next day or an
/// operator lets go on), or `None` when it is not done by `deadline`
/// (stuck). An interrupted call's
/// re-approval is decided the way an operator would: the refund's ledger
/// (`effects`) is checked, and the call approved to run again only when its
/// effect is not there, rejected (outcome unknown to the model) when it is.
fn drive(
    server: &str,
    token: &str,
    kind: &str,
    run_id: &str,
    effects: &std::path::Path,
    deadline: Instant,
) -> Option<Value> {
    let mut replies = 0;
    let mut posted: HashMap<String, Instant> = HashMap::new();
    loop {
        let (status, run) = call_through(
            token,
            "GET",
            &format!("{server}/v1/runs/{run_id}"),
            None,
            None,
            deadline,
        )?;
        assert_eq!(status, 200, "{run}");
        if run["status"] == "done" || at_tenant_cap(&run) {
            return Some(run);
        }
        if Instant::now() > deadline {
            return None;
        }
        let pp = &run["pull_point"];
        let key = format!("{}:{}", run["head_seq"], pp);
        if run["status"] != "parked"
            || posted
                .get(&key)
                .is_some_and(|t| t.elapsed() < Duration::from_secs(3))
        {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        let (path, body) = match (pp["kind"].as_str().unwrap_or(""), kind) {
            ("awaiting_tool", "cancel") => (
                format!("/v1/runs/{run_id}/cancel"),
                json!({"reason": "chaos cancel"}),
            ),
            ("awaiting_approval", _) => {
                let call_id = pp["call_ids"][0].as_str().unwrap();
                let took_effect = std::fs::read_to_string(effects)
                    .unwrap_or_default()
                    .lines()
                    .any(|l| l.contains(run_id) && l.contains(call_id));
                let decision =
                    if interrupted(server, token, run_id, call_id, deadline)? && took_effect {
                        "reject"
                    } else {
                        "approve"
                    };
                (
                    format!("/v1/runs/{run_id}/approvals/{call_id}"),
                    json!({"decision": decision}),
                )
            }
            ("awaiting_tool", _) => (
                format!(
                    "/v1/runs/{run_id}/tool-results/{}",
                    pp["call_ids"][0].as_str().unwrap()
                ),
                json!({"content": "Order A1."}),
            ),
            ("awaiting_input", _) if replies == 0 => {
                replies += 1;
                (
                    format!("/v1/runs/{run_id}/messages"),
                    json!({"text": "Refund A1, please."}),
                )
            }
            ("awaiting_input", _) => (format!("/v1/runs/{run_id}/close"), json!({})),
            ("paused", _) => (
                format!("/v1/runs/{run_id}/resume"),
                json!({"extend": {"max_turns": 5}}),
            ),
            (other, _) => panic!("run {run_id}: unknown pull point {other}"),
        };
        // A post that failed on the way (a connection error or a 5xx in an
        // outage) may have landed all the same: it is posted again only
        // while the run is still parked where it was, or a message that
        // landed and was answered would be taken for the next one.
        let landed = loop {
            match call(token, "POST", &format!("{server}{path}"), Some(&body), None) {
                Some((s, v)) if s < 500 => break Some((s, v)),
                _ if Instant::now() > deadline => return None,
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
            let (_, now) = call_through(
                token,
                "GET",
                &format!("{server}/v1/runs/{run_id}"),
                None,
                None,
                deadline,
            )?;
            if now["head_seq"] != run["head_seq"] || now["status"] != "parked" {
                break None;
            }
        };
        let Some((status, answer)) = landed else {
            posted.insert(key, Instant::now());
            continue;
        };
        // A post retried through an outage may have landed the first time
        // and been applied since: the run moved on and the call it answered
        // is no longer pending (404). Only a run still parked where it was
        // makes a 404 a failure.
        let moved_on = || {
            call_through(
                token,
                "GET",
                &format!("{server}/v1/runs/{run_id}"),
                None,
                None,
                deadline,
            )
            .is_some_and(|(_, now)| now["head_seq"] != run["head_seq"])
        };
        assert!(
            status < 300 || status == 409 || (status == 404 && moved_on()),
            "{path}: {status} {answer}"
        );
        posted.insert(key, Instant::now());
    }
}

/// Budgets exact against the log: replaying it event by event, no model
/// call starts once the run's turns (calls re-made after a crash included)
/// have reached `max_turns`, with the limit as extended so far. The state
/// machine itself does not refuse such an event, so this checks the worker.
fn budget_overruns(run_id: &str, events: &[Event]) -> Vec<String> {
    let mut state = RunState::new(events[0].run_id);
    let mut out = Vec::new();
    for e in events {
        if let (EventKind::ModelCall { .. }, Some(max)) = (&e.kind, state.limits.max_turns)
            && state.usage.turns >= max
        {
            out.push(format!(
                "{run_id}: model call at seq {} with {} of {max} turns used",
                e.seq, state.usage.turns
            ));
        }
        state
            .apply(e)
            .unwrap_or_else(|err| panic!("run {run_id} seq {}: {err}", e.seq));
    }
    out
}

/// `psql -qAtc SQL` on `url`; `None` while the database is down.
fn sql(url: &str, query: &str) -> Option<String> {
    let out = Command::new("psql")
        .args([url, "-qAtc", query])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Lease owners of runs executing a refund now: the run's newest event is
/// the approval of a call (the refund runs between it and its result).
fn refunding_workers(db_url: &str) -> Vec<String> {
    let q = "SELECT r.lease_owner FROM runs r WHERE r.status <> 'done' AND r.lease_owner IS NOT NULL \
             AND (SELECT e.kind FROM events e WHERE e.run_id = r.id ORDER BY e.seq DESC LIMIT 1) = 'approval.resolved'";
    sql(db_url, q)
        .map(|s| s.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Runs executing a refund now under a live lease, as `(run id, call id)`:
/// the run's newest event is the approval of that call (see
/// [`refunding_workers`]), approved after `since` (so no earlier fault, a
/// kill or a Redis flush, can have interrupted the call).
fn refunding_calls(db_url: &str, since: chrono::DateTime<chrono::Utc>) -> Vec<(String, String)> {
    let q = format!(
        "SELECT r.id, e.payload->'data'->>'call_id' FROM runs r JOIN LATERAL \
         (SELECT kind, at, payload FROM events WHERE run_id = r.id ORDER BY seq DESC LIMIT 1) e ON true \
         WHERE r.status <> 'done' AND r.lease_owner IS NOT NULL AND r.lease_expires_at > now() \
         AND e.kind = 'approval.resolved' AND e.at > '{}'::timestamptz \
         AND coalesce(e.payload->'data'->'decision'->>'kind', '') NOT IN ('reject', 'expire')",
        since.to_rfc3339()
    );
    let rows = sql(db_url, &q).unwrap_or_default();
    rows.lines()
        .filter_map(|l| l.split_once('|'))
        .map(|(r, c)| (r.to_owned(), c.to_owned()))
        .collect()
}

/// Whether `call_id` of `run_id` has an outcome in the log (a result or an
/// error) or waits for a person again; `false` also while Postgres is down.
fn call_settled(db_url: &str, run_id: &str, call_id: &str) -> bool {
    let q = format!(
        "SELECT count(*) FROM events WHERE run_id = '{run_id}' AND payload->'data'->>'call_id' = '{call_id}' \
         AND (kind IN ('tool.result', 'tool.error') OR (kind = 'approval.requested' AND (payload->'data'->>'interrupted')::boolean))"
    );
    sql(db_url, &q).is_some_and(|n| n != "0")
}

/// The worker slot of a lease owner id (`w3` or `w3-<uuid>`).
fn slot(owner: &str) -> Option<usize> {
    owner.strip_prefix('w')?.split('-').next()?.parse().ok()
}

/// Every run now: id → `(head seq, lease owner while the lease is live)`.
fn heads(db_url: &str) -> HashMap<String, (String, Option<String>)> {
    let q = "SELECT id, head_seq, CASE WHEN lease_expires_at > now() THEN lease_owner ELSE '' END FROM runs";
    let rows = sql(db_url, q).unwrap_or_default();
    rows.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, '|');
            let (id, head, owner) = (f.next()?, f.next()?, f.next()?);
            Some((
                id.to_owned(),
                (
                    head.to_owned(),
                    Some(owner.to_owned()).filter(|o| !o.is_empty()),
                ),
            ))
        })
        .collect()
}

/// Lines of `path` past byte `from` that contain every one of `needles`.
fn lines_since(path: &std::path::Path, from: u64, needles: &[&str]) -> usize {
    let text = std::fs::read(path).unwrap_or_default();
    let from = (from as usize).min(text.len());
    String::from_utf8_lossy(&text[from..])
        .lines()
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .count()
}

/// Figures of a round.
#[derive(Default, Debug)]
struct Figures {
    seed: u64,
    faults: BTreeMap<String, usize>,
    recovery_ms: BTreeMap<String, Vec<u64>>,
    worker_kills: usize,
    mid_call_kills: usize,
    runs: usize,
    steps: usize,
    lost: Vec<String>,
    stuck: Vec<String>,
    failed: Vec<String>,
    seq_errors: Vec<String>,
    refund_calls: usize,
    executions: usize,
    replays: usize,
    double_executions: Vec<String>,
    budget_overruns: Vec<String>,
    results_without_execution: Vec<String>,
    outcome_unknown: usize,
    reapprovals: usize,
    unsurfaced: Vec<String>,
    /// Processes that exited without being killed by the schedule.
    exits: Vec<String>,
    /// Runs of each tenant.
    tenant_runs: BTreeMap<&'static str, usize>,
    /// [`GLOBEX`]'s daily token cap.
    cap_tokens: u64,
    /// [`GLOBEX`]'s tokens by UTC day, summed from its runs' logs.
    capped_spend: BTreeMap<chrono::NaiveDate, u64>,
    /// The most tokens one model call of [`GLOBEX`] used (from the log).
    max_call_tokens: u64,
    /// How far past the cap the log may go (see [`tenant_cap_allowance`]).
    cap_allowance: u64,
    /// [`GLOBEX`]'s runs parked at its cap (and still parked at the end).
    parked_at_cap: usize,
    /// Days whose spend passed the cap by more than the allowance.
    cap_overruns: Vec<String>,
    /// Runs parked at a tenant cap that should not be (an uncapped tenant's),
    /// or were parked at it and then are not parked there, or whose log does
    /// not end in the cap's pause.
    cap_misparked: Vec<String>,
    /// Postgres restarts (fast and immediate).
    pg_restarts: usize,
    /// ... of which stopped Postgres while a run was executing a refund.
    pg_mid_call: usize,
    /// `(run id, call id)` of every refund in flight at a Postgres stop.
    pg_in_flight: Vec<(String, String)>,
    /// ... of those that executed (in the ledger), how many had their result
    /// recovered from the held copy by the next worker (`tool.recovered`).
    pg_recovered: usize,
    /// ... that executed and were nonetheless put to a person again
    /// (`approval.requested` with `interrupted: true`), or given up as
    /// outcome-unknown: a finished effect thrown away. Must be none.
    pg_finished_abandoned: Vec<String>,
    /// ... that executed and were put to a person again (part of the above).
    pg_finished_reapprovals: usize,
    /// Partitions: runs the partitioned worker held when it was cut off.
    partition_held: usize,
    /// ... of which, when it healed, another worker held or had moved on.
    partition_taken_over: usize,
    /// Work the partitioned worker abandoned after a heal because its commit
    /// was refused (`lease lost`), from its log.
    partition_refused: usize,
    /// Interrupted calls' results recovered from the held copy by the next
    /// worker (`tool.recovered`), all runs.
    tool_recovered: usize,
}

impl Figures {
    /// How many faults of `kind` the round injected.
    fn count(&self, kind: Fault) -> usize {
        self.faults.get(&format!("{kind:?}")).copied().unwrap_or(0)
    }

    /// Interrupted calls the log shows the fleet handled: surfaced as
    /// outcome-unknown, put to a person again, or recovered from the held
    /// copy.
    fn interrupted_calls(&self) -> usize {
        self.outcome_unknown + self.reapprovals + self.tool_recovered
    }
}

fn percentile(v: &[u64], p: f64) -> u64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    s.get(((s.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(0)
}

/// How far one tenant's spend in the log may pass its daily cap. The gate
/// reserves, before every model call, at least what the call can use (its
/// request at four characters a token plus `max_tokens`: more than the
/// scripted provider reports), so the counter never lets the log pass the
/// cap. Only a flushed counter does (`LedgerGate`, worker/src/consumer.rs): it
/// is rebuilt from the log, which does not hold the calls in flight at the
/// flush, so each of them may be let past once more. A run has at most one
/// model call in flight, and a tenant's clients drive one run each at a
/// time: per flush, `clients` calls of at most `max_call` tokens.
fn tenant_cap_allowance(flushes: usize, clients: usize, max_call: u64) -> u64 {
    (flushes * clients) as u64 * max_call
}

impl Figures {
    fn print(&self) {
        eprintln!(
            "==== chaos round, seed {} (replay: GLIA_CHAOS_SEED={}) ====",
            self.seed, self.seed
        );
        eprintln!("faults: {:?}", self.faults);
        eprintln!(
            "worker kills: {}, landed mid-refund: {}",
            self.worker_kills, self.mid_call_kills
        );
        eprintln!(
            "partitions: runs the partitioned worker held: {}, taken over by another worker before the heal: {}, its commits refused by the fence (lease lost) after the heal: {}",
            self.partition_held, self.partition_taken_over, self.partition_refused
        );
        eprintln!(
            "postgres restarts: {}, with a refund in flight: {} ({} calls); of those executed: results recovered from the held copy: {}, re-approved: {}, re-approved or outcome-unknown: {}",
            self.pg_restarts,
            self.pg_mid_call,
            self.pg_in_flight.len(),
            self.pg_recovered,
            self.pg_finished_reapprovals,
            self.pg_finished_abandoned.len()
        );
        eprintln!(
            "runs: {} {:?}, events: {}",
            self.runs, self.tenant_runs, self.steps
        );
        eprintln!(
            "lost: {}, stuck: {}, failed: {}, duplicate/missing seqs: {}",
            self.lost.len(),
            self.stuck.len(),
            self.failed.len(),
            self.seq_errors.len()
        );
        eprintln!(
            "refund calls: {}, executions in the ledger: {}, late deliveries answered by the idempotency key: {}, double executions: {}, results without execution: {}, outcome-unknown: {}, re-approvals: {}, recovered from the held copy: {}, interrupted and not surfaced: {}",
            self.refund_calls,
            self.executions,
            self.replays,
            self.double_executions.len(),
            self.results_without_execution.len(),
            self.outcome_unknown,
            self.reapprovals,
            self.tool_recovered,
            self.unsurfaced.len()
        );
        eprintln!(
            "model calls past the run's turn budget: {}",
            self.budget_overruns.len()
        );
        eprintln!(
            "tenant cap ({}): {} tokens a day; spent by day (log): {:?}; allowance {} tokens (Redis flushes × {} clients × largest call {} tokens); days over cap + allowance: {}; runs parked at the cap: {}; misparked: {}",
            GLOBEX.1,
            self.cap_tokens,
            self.capped_spend,
            self.cap_allowance,
            CLIENTS - CLIENTS / 2,
            self.max_call_tokens,
            self.cap_overruns.len(),
            self.parked_at_cap,
            self.cap_misparked.len()
        );
        eprintln!(
            "processes that exited on their own: {} {:?}",
            self.exits.len(),
            self.exits
        );
        for (kind, v) in &self.recovery_ms {
            eprintln!(
                "recovery {kind}: n={} p50={} ms p90={} ms max={} ms",
                v.len(),
                percentile(v, 0.5),
                percentile(v, 0.9),
                percentile(v, 1.0)
            );
        }
    }

    fn assert_clean(&self) {
        let seed = self.seed;
        assert!(
            self.lost.is_empty(),
            "seed {seed}: runs lost: {:?}",
            self.lost
        );
        assert!(
            self.stuck.is_empty(),
            "seed {seed}: runs stuck: {:?}",
            self.stuck
        );
        assert!(
            self.failed.is_empty(),
            "seed {seed}: runs failed: {:?}",
            self.failed
        );
        assert!(
            self.seq_errors.is_empty(),
            "seed {seed}: logs: {:?}",
            self.seq_errors
        );
        assert!(
            self.double_executions.is_empty(),
            "seed {seed}: refunds executed twice: {:?}",
            self.double_executions
        );
        assert!(
            self.budget_overruns.is_empty(),
            "seed {seed}: budgets overrun: {:?}",
            self.budget_overruns
        );
        assert!(
            self.results_without_execution.is_empty(),
            "seed {seed}: results for refunds that never ran: {:?}",
            self.results_without_execution
        );
        assert!(
            self.exits.is_empty(),
            "seed {seed}: processes exited on their own: {:?}",
            self.exits
        );
        assert!(
            self.pg_finished_abandoned.is_empty(),
            "seed {seed}: refunds that finished during a Postgres restart re-approved or outcome-unknown: {:?}",
            self.pg_finished_abandoned
        );
        assert!(
            self.unsurfaced.is_empty(),
            "seed {seed}: interrupted refunds neither recorded nor outcome-unknown: {:?}",
            self.unsurfaced
        );
        assert!(
            self.cap_overruns.is_empty(),
            "seed {seed}: tenant cap passed beyond the allowance: {:?}",
            self.cap_overruns
        );
        assert!(
            self.cap_misparked.is_empty(),
            "seed {seed}: runs wrongly parked (or not parked) at a tenant cap: {:?}",
            self.cap_misparked
        );
        // The faults must have landed: a round whose kills and Postgres stops
        // (each aimed at a refund in flight) interrupted no call, or whose
        // partitions cut off a worker that held nothing, or took nothing
        // from it, checked none of the guarantees about interrupted calls
        // and fencing it prints.
        let aimed = self.count(Fault::KillWorker)
            + self.count(Fault::PostgresFast)
            + self.count(Fault::PostgresImmediate);
        if aimed > 0 {
            assert!(
                self.mid_call_kills + self.pg_mid_call > 0,
                "seed {seed}: none of {aimed} worker kills and Postgres stops landed while a refund was in flight: no interrupted call was exercised"
            );
            assert!(
                self.interrupted_calls() > 0,
                "seed {seed}: {} kills and {} Postgres stops landed mid-refund, yet no call in any log was interrupted (outcome-unknown, re-approved or recovered from the held copy)",
                self.mid_call_kills,
                self.pg_mid_call
            );
        }
        let partitions = self.count(Fault::PartitionWorker);
        if partitions > 0 {
            assert!(
                self.partition_held > 0,
                "seed {seed}: {partitions} partitions cut off workers that held no run: the fence was not exercised"
            );
            assert!(
                self.partition_taken_over > 0,
                "seed {seed}: {partitions} partitions: of the {} runs the partitioned workers held, none was taken over by another worker",
                self.partition_held
            );
        }
        // The cap is a few runs' worth per fault and the capped tenant's
        // clients run far more: a round in which none of its runs met the
        // cap did not check it.
        assert!(
            self.runs == 0 || self.parked_at_cap > 0,
            "seed {seed}: no run of {} was parked at its {} token cap (spent {:?}): the cap was not checked",
            GLOBEX.1,
            self.cap_tokens,
            self.capped_spend
        );
    }
}

/// Wait until a fresh probe run completes; returns how long it took.
fn probe(
    server: &str,
    effects: &std::path::Path,
    seed: u64,
    n: usize,
) -> (Duration, Option<(String, String)>) {
    let start = Instant::now();
    let deadline = start + Duration::from_secs(180);
    let Some(id) = submit(server, ACME, "plain", 1_000_000 + n, seed, deadline) else {
        return (start.elapsed(), None);
    };
    drive(server, ACME.0, "plain", &id, effects, deadline);
    (start.elapsed(), Some(("plain".to_owned(), id)))
}

/// One round: `faults` faults drawn from `seed`.
fn round(seed: u64, faults: usize) -> Figures {
    let Some(services) = Services::start() else {
        return Figures {
            seed,
            ..Figures::default()
        };
    };
    let Services {
        pg,
        mut rabbit,
        redis,
    } = services;
    let mut fleet = Fleet::on(&pg.admin_url(), &mixed_scripts());
    fleet.amqp_url = rabbit.url();
    fleet.redis_url = redis.url();
    fleet
        .extra_env
        .push(("GLIA_DEMO_TOOL_DELAY_MS".into(), REFUND_MS.to_string()));
    // Two tenants, and the suite's own admin token.
    fleet.extra_env.push((
        "GLIA_TOKENS".into(),
        format!(
            "{}:{}:submit,approve {}:{}:submit,approve {OPS}:ops:admin",
            ACME.0, ACME.1, GLOBEX.0, GLOBEX.1
        ),
    ));
    fleet.api.token = Some(OPS.to_owned());
    let cap_tokens = CAP_TOKENS_PER_FAULT * faults.max(1) as u64;
    let caps = fleet.dir.join("tenant-caps.json");
    std::fs::write(
        &caps,
        json!({ GLOBEX.1: {"daily_tokens": cap_tokens} }).to_string(),
    )
    .expect("write the caps file");
    fleet.worker_args = vec!["--tenant-caps".into(), caps.to_str().unwrap().into()];
    // Every worker reaches the services through a partition of its own.
    let partitions: Vec<Partition> = (0..3)
        .map(|w| {
            let (partition, urls) =
                Partition::new(&[&fleet.db_url, &fleet.amqp_url, &fleet.redis_url]);
            let names = ["GLIA_DATABASE_URL", "GLIA_AMQP_URL", "GLIA_REDIS_URL"];
            fleet
                .worker_env
                .insert(w, names.iter().map(|n| n.to_string()).zip(urls).collect());
            partition
        })
        .collect();
    fleet.start_dispatcher();
    for _ in 0..3 {
        fleet.start_worker(LEASE_MS);
    }
    let server = fleet.server.clone();
    let db_url = fleet.db_url.clone();
    let effects = fleet.effects_file();
    let effects = effects.as_path();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut figures = Figures {
        seed,
        cap_tokens,
        ..Figures::default()
    };

    let stop = AtomicBool::new(false);
    let counter = AtomicUsize::new(0);
    let submitted = Mutex::new(Submitted::default());
    let capped: Mutex<std::collections::HashSet<String>> = Mutex::new(Default::default());
    let finals: Mutex<HashMap<String, Option<Value>>> = Mutex::new(HashMap::new());
    let probes = Mutex::new(Vec::new());
    let fleet = Arc::new(Mutex::new(fleet));
    std::thread::scope(|s| {
        for client in 0..CLIENTS {
            let tenant = if client < CLIENTS / 2 { ACME } else { GLOBEX };
            let (stop, counter, submitted, capped, finals, server) =
                (&stop, &counter, &submitted, &capped, &finals, &server);
            s.spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let n = counter.fetch_add(1, Ordering::SeqCst);
                    let kind = KINDS[n % KINDS.len()];
                    let deadline = Instant::now() + Duration::from_secs(600);
                    let Some(id) = submit(server, tenant, kind, n, seed, deadline) else {
                        continue;
                    };
                    submitted
                        .lock()
                        .unwrap()
                        .runs
                        .push((kind.to_owned(), id.clone()));
                    if tenant == GLOBEX {
                        capped.lock().unwrap().insert(id.clone());
                    }
                    let last = drive(server, tenant.0, kind, &id, effects, deadline);
                    // Past its cap a tenant's runs park at once: its client
                    // keeps asking, at a slower pace.
                    if last.as_ref().is_some_and(at_tenant_cap) {
                        std::thread::sleep(Duration::from_secs(1));
                    }
                    finals.lock().unwrap().insert(id, last);
                }
            });
        }
        // The schedule: the kinds in a seeded order, every kind once per
        // block of `FAULTS.len()` faults.
        let mut block = Vec::new();
        // When the previous fault and its recovery were over.
        let mut previous_fault_over = chrono::Utc::now();
        for i in 0..faults {
            std::thread::sleep(Duration::from_millis(rng.u64(500..2_500)));
            if block.is_empty() {
                block = FAULTS.to_vec();
                rng.shuffle(&mut block);
            }
            let fault = block.pop().expect("a fault");
            *figures.faults.entry(format!("{fault:?}")).or_default() += 1;
            let mut f = fleet.lock().unwrap();
            let mut healed: Option<(usize, u64)> = None;
            // Refunds in flight at a Postgres stop: `(run id, call id)`.
            let mut pg_in_flight: Vec<(String, String)> = Vec::new();
            match fault {
                Fault::KillWorker => {
                    // Aim: wait up to 3 s for a worker executing a refund.
                    let aim_until = Instant::now() + Duration::from_secs(3);
                    let target = loop {
                        if let Some(w) = refunding_workers(&db_url)
                            .iter()
                            .filter_map(|o| slot(o))
                            .find(|w| *w < 3)
                        {
                            break Some(w);
                        }
                        if Instant::now() > aim_until {
                            break None;
                        }
                        std::thread::sleep(Duration::from_millis(30));
                    };
                    let w = target.unwrap_or_else(|| rng.usize(..3));
                    // Landed mid-call when, right at the kill, that worker still holds a refunding run.
                    let mid = refunding_workers(&db_url)
                        .iter()
                        .any(|o| slot(o) == Some(w));
                    f.kill_worker(w);
                    figures.worker_kills += 1;
                    figures.mid_call_kills += usize::from(mid);
                    f.replace_worker(w, LEASE_MS);
                }
                Fault::KillDispatcher => f.restart_dispatcher(),
                Fault::PauseWorker => {
                    let w = rng.usize(..3);
                    f.signal_worker(w, "STOP");
                    std::thread::sleep(Duration::from_millis(LEASE_MS + 1_000));
                    f.signal_worker(w, "CONT");
                }
                Fault::PartitionWorker => {
                    // The worker keeps running, cut off past its lease: its
                    // runs go to the others; when it heals, whatever it
                    // still commits for them must be refused by the fence.
                    // Aim: wait up to 3 s for a worker executing a refund,
                    // else take one holding a live lease, else any. A
                    // worker can let its run go between the aim and the
                    // cut (runs park within milliseconds), so a partition
                    // that caught no run is healed and aimed again, up to
                    // five times: the fault is meant to land, not to be
                    // lucky.
                    let mut attempt = 0;
                    loop {
                        attempt += 1;
                        let fallback = rng.usize(..3);
                        let aim_until = Instant::now() + Duration::from_secs(3);
                        let w = loop {
                            if let Some(w) = refunding_workers(&db_url)
                                .iter()
                                .filter_map(|o| slot(o))
                                .find(|w| *w < 3)
                            {
                                break w;
                            }
                            if Instant::now() > aim_until {
                                break heads(&db_url)
                                    .values()
                                    .filter_map(|(_, o)| o.as_deref().and_then(slot))
                                    .find(|w| *w < 3)
                                    .unwrap_or(fallback);
                            }
                            std::thread::sleep(Duration::from_millis(30));
                        };
                        let before = heads(&db_url);
                        partitions[w].start();
                        std::thread::sleep(Duration::from_millis(LEASE_MS + 1_000));
                        let held: Vec<(&String, &String)> = before
                            .iter()
                            .filter(|(_, (_, o))| o.as_deref().and_then(slot) == Some(w))
                            .map(|(id, (head, _))| (id, head))
                            .collect();
                        if held.is_empty() && attempt < 5 {
                            partitions[w].heal();
                            continue;
                        }
                        // Taken over: another worker holds it now, or its log
                        // moved on while its worker was cut off. The partition
                        // lasts until one of the runs it held is taken over (the
                        // reconciler hands an expired lease's run to another
                        // worker within seconds), 30 s at most: a refund the
                        // cut-off worker was running keeps its running mark
                        // (`RUNNING_MARK_TTL`, 15 s) and the next worker waits
                        // for the mark to lapse before it acts, so 15 s alone
                        // was a race a busy machine could lose.
                        let takeover_until =
                            Instant::now() + glia_proto::RUNNING_MARK_TTL + Duration::from_secs(15);
                        let taken = loop {
                            let after = heads(&db_url);
                            let taken = held
                                .iter()
                                .filter(|(id, head)| {
                                    after.get(*id).is_some_and(|(h, o)| {
                                        h != *head
                                            || o.as_deref().is_some_and(|o| slot(o) != Some(w))
                                    })
                                })
                                .count();
                            if taken > 0 || held.is_empty() || Instant::now() > takeover_until {
                                break taken;
                            }
                            std::thread::sleep(Duration::from_millis(100));
                        };
                        figures.partition_held += held.len();
                        figures.partition_taken_over += taken;
                        let log = f.log_file(&format!("w{w}"));
                        healed = Some((w, std::fs::metadata(&log).map_or(0, |m| m.len())));
                        partitions[w].heal();
                        break;
                    }
                }
                Fault::RabbitRestart => {
                    let rt = runtime();
                    rt.block_on(rabbit.stop());
                    std::thread::sleep(Duration::from_millis(rng.u64(500..3_000)));
                    rabbit.start().expect("spawn rabbitmq-server again");
                    rt.block_on(rabbit.wait_ready(Duration::from_secs(120)));
                }
                Fault::PostgresFast | Fault::PostgresImmediate => {
                    // Aim: wait up to 3 s for a run executing a refund, so
                    // the database goes away while the call is in flight
                    // and its result has to be committed through (or after)
                    // the outage.
                    let aim_until = Instant::now() + Duration::from_secs(3);
                    let in_flight = loop {
                        let calls = refunding_calls(&db_url, previous_fault_over);
                        if !calls.is_empty() || Instant::now() > aim_until {
                            break calls;
                        }
                        std::thread::sleep(Duration::from_millis(30));
                    };
                    pg.stop(if fault == Fault::PostgresFast {
                        StopMode::Fast
                    } else {
                        StopMode::Immediate
                    });
                    std::thread::sleep(Duration::from_millis(rng.u64(500..2_500)));
                    pg.start();
                    figures.pg_restarts += 1;
                    figures.pg_mid_call += usize::from(!in_flight.is_empty());
                    pg_in_flight = in_flight;
                }
                Fault::RedisFlush => {
                    let ok = Command::new("redis-cli")
                        .args(["-p", &redis.port().to_string(), "FLUSHALL"])
                        .output()
                        .is_ok_and(|o| o.status.success());
                    assert!(ok, "redis-cli FLUSHALL");
                }
            }
            drop(f);
            let (took, run) = probe(&server, effects, seed, i);
            eprintln!("seed {seed}: fault {i} {fault:?}: recovered in {took:?}");
            figures
                .recovery_ms
                .entry(format!("{fault:?}"))
                .or_default()
                .push(took.as_millis() as u64);
            probes.lock().unwrap().extend(run);
            // Wait until each refund in flight at a Postgres stop has an
            // outcome in the log (or a person is asked again), so that what
            // happens to it is this fault's doing, not a later one's.
            let settle_until = Instant::now() + Duration::from_secs(120);
            while pg_in_flight
                .iter()
                .any(|(r, c)| !call_settled(&db_url, r, c))
                && Instant::now() < settle_until
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            figures.pg_in_flight.extend(pg_in_flight);
            previous_fault_over = chrono::Utc::now();
            let mut f = fleet.lock().unwrap();
            if let Some((w, from)) = healed {
                figures.partition_refused += lines_since(
                    &f.log_file(&format!("w{w}")),
                    from,
                    &["abandoning the run's current work", "lease lost"],
                );
            }
            // A process the schedule did not kill must still be running (a
            // worker that gives up on an outage is a finding); it is
            // replaced so the round goes on.
            for w in 0..f.workers.len() {
                if let Ok(Some(status)) = f.workers[w].try_wait() {
                    figures.exits.push(format!(
                        "after fault {i} ({fault:?}): worker w{w} exited ({status}); log: {}",
                        f.log_tails(20)
                    ));
                    f.replace_worker(w, LEASE_MS);
                }
            }
            if let Some(Ok(Some(status))) = f.dispatcher.as_mut().map(|d| d.try_wait()) {
                figures.exits.push(format!(
                    "after fault {i} ({fault:?}): the dispatcher exited ({status}); log: {}",
                    f.log_tails(20)
                ));
                f.dispatcher = None;
                f.start_dispatcher();
            }
            drop(f);
        }
        stop.store(true, Ordering::SeqCst);
    });

    // Checks, against the database of runs, the logs and the refund ledger.
    let fleet = Arc::try_unwrap(fleet)
        .ok()
        .expect("no client holds the fleet")
        .into_inner()
        .unwrap();
    let mut all = submitted.into_inner().unwrap().runs;
    let capped = capped.into_inner().unwrap();
    let probes = probes.into_inner().unwrap();
    let finals = finals.into_inner().unwrap();
    for (_, id) in &probes {
        let deadline = Instant::now() + Duration::from_secs(60);
        let run = drive(&server, ACME.0, "plain", id, effects, deadline);
        if run.is_none() {
            figures.stuck.push(id.clone());
        }
    }
    all.extend(probes);
    let in_db: Vec<String> = sql(&db_url, "SELECT id FROM runs")
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    figures.runs = all.len();
    // The ledger: `refund KEY` when the tool applied a refund, `replay KEY`
    // when a later delivery of an applied key was answered from the first.
    let mut ledger: HashMap<String, usize> = HashMap::new();
    let mut replays: HashMap<String, usize> = HashMap::new();
    for line in fleet.effects() {
        match line.split_once(' ') {
            Some(("refund", key)) => *ledger.entry(key.to_owned()).or_default() += 1,
            Some(("replay", key)) => *replays.entry(key.to_owned()).or_default() += 1,
            _ => panic!("ledger line {line:?}"),
        }
    }
    figures.executions = ledger.values().sum();
    figures.replays = replays.values().sum();
    figures.double_executions = ledger
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, n)| format!("{k} ×{n}"))
        .collect();
    for (kind, id) in &all {
        let tenant = if capped.contains(id) {
            GLOBEX.1
        } else {
            ACME.1
        };
        *figures.tenant_runs.entry(tenant).or_default() += 1;
        if !in_db.contains(id) {
            figures.lost.push(id.clone());
            continue;
        }
        let final_run = finals.get(id).cloned().flatten().or_else(|| {
            call(OPS, "GET", &format!("{server}/v1/runs/{id}"), None, None)
                .map(|(_, v)| v)
                .filter(|v| v["status"] == "done")
        });
        let Some(run) = final_run else {
            figures.stuck.push(format!("{kind} {id}"));
            continue;
        };
        let events = match std::panic::catch_unwind(|| check_log(&fleet, id)) {
            Ok(events) => events,
            Err(_) => {
                figures.seq_errors.push(id.clone());
                continue;
            }
        };
        figures.steps += events.len();
        figures.budget_overruns.extend(budget_overruns(id, &events));
        if tenant == GLOBEX.1 {
            for e in &events {
                if let Some(spend) = glia_backends::Spend::of_event(&e.kind) {
                    *figures.capped_spend.entry(e.at.date_naive()).or_default() += spend.tokens;
                    figures.max_call_tokens = figures.max_call_tokens.max(spend.tokens);
                }
            }
        }
        if at_tenant_cap(&run) {
            // Parked at the cap: still parked there now (not failed, not
            // moved on), its log ending in the cap's pause, and only for
            // the capped tenant.
            let now = call(OPS, "GET", &format!("{server}/v1/runs/{id}"), None, None)
                .map(|(_, v)| v)
                .unwrap_or_default();
            let paused_at_cap = events.last().is_some_and(|e| {
                matches!(
                    &e.kind,
                    EventKind::SessionPause {
                        pull_point: PullPoint::Paused {
                            reason: PauseReason::Budget {
                                limit: Limit::TenantDailyTokens
                            }
                        }
                    }
                )
            });
            if tenant != GLOBEX.1 || !at_tenant_cap(&now) || !paused_at_cap {
                figures.cap_misparked.push(format!(
                    "{tenant} {kind} {id}: now {}, last event {:?}",
                    now["pull_point"],
                    events.last().map(|e| e.kind.name())
                ));
            } else {
                figures.parked_at_cap += 1;
            }
        } else {
            let expected = if kind == "cancel" {
                "cancelled"
            } else {
                "succeeded"
            };
            if run["outcome"]["kind"] != expected {
                figures
                    .failed
                    .push(format!("{kind} {id}: {}", run["outcome"]));
            }
        }
        // Per refund call: executions in the ledger versus results in the log.
        let mut calls: BTreeMap<String, (usize, usize)> = BTreeMap::new(); // call id → (results, outcome-unknown)
        let mut requested = 0usize;
        let mut reapproved: std::collections::HashSet<String> = Default::default();
        for e in &events {
            match &e.kind {
                EventKind::ToolResult {
                    call_id, content, ..
                } => {
                    let Ok(v) = serde_json::from_str::<Value>(&content.to_text()) else {
                        continue;
                    };
                    if v["refunded"] != true {
                        continue;
                    }
                    calls.entry(call_id.clone()).or_default().0 += 1;
                    let key = v["idempotency_key"].as_str().unwrap_or_default();
                    if !ledger.contains_key(key) {
                        figures
                            .results_without_execution
                            .push(format!("{id}: {key}"));
                    }
                }
                EventKind::ToolError {
                    call_id,
                    error: ToolErrorKind::OutcomeUnknown,
                    ..
                } => calls.entry(call_id.clone()).or_default().1 += 1,
                EventKind::ApprovalRequested {
                    interrupted: true,
                    call_id,
                    ..
                } => {
                    requested += 1;
                    reapproved.insert(call_id.clone());
                }
                _ => {}
            }
        }
        figures.reapprovals += requested;
        figures.tool_recovered += events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::ToolRecovered { .. }))
            .count();
        // Refunds in flight at a Postgres stop that executed: their result
        // must reach the log, committed through the outage or recovered from
        // the held copy; never a person asked again, never outcome-unknown.
        let pg_calls: Vec<String> = figures
            .pg_in_flight
            .iter()
            .filter(|(r, _)| r == id)
            .map(|(_, c)| c.clone())
            .collect();
        for call_id in &pg_calls {
            if !ledger
                .keys()
                .any(|k| k.starts_with(id.as_str()) && k.ends_with(&format!(":{call_id}")))
            {
                continue;
            }
            let mut recovered = false;
            for e in &events {
                match &e.kind {
                    EventKind::ToolRecovered { call_id: c, .. } if c == call_id => recovered = true,
                    EventKind::ApprovalRequested {
                        interrupted: true,
                        call_id: c,
                        ..
                    } if c == call_id => {
                        figures.pg_finished_reapprovals += 1;
                        figures.pg_finished_abandoned.push(format!(
                            "{id} {call_id}: re-approval at seq {}; log: {}",
                            e.seq,
                            story(&events)
                        ));
                    }
                    EventKind::ToolError {
                        call_id: c,
                        error: ToolErrorKind::OutcomeUnknown,
                        ..
                    } if c == call_id => {
                        figures.pg_finished_abandoned.push(format!(
                            "{id} {call_id}: outcome-unknown at seq {}; log: {}",
                            e.seq,
                            story(&events)
                        ));
                    }
                    _ => {}
                }
            }
            figures.pg_recovered += usize::from(recovered);
        }
        // A second delivery of a key is allowed only where a person approved
        // running an interrupted call again (a worker frozen past its lease
        // can still deliver the call it started); anywhere else it means
        // the fleet ran a consequential call twice.
        for key in replays.keys().filter(|k| k.starts_with(id.as_str())) {
            let call = key.splitn(3, ':').nth(2).unwrap_or_default();
            if !reapproved.contains(call) {
                figures
                    .double_executions
                    .push(format!("{key}: delivered again without a re-approval"));
            }
        }
        let executed_here = ledger.keys().filter(|k| k.contains(id.as_str())).count();
        for (call_id, (results, unknown)) in &calls {
            figures.refund_calls += 1;
            figures.outcome_unknown += unknown;
            if results + unknown != 1 {
                figures.unsurfaced.push(format!("{id} {call_id}: {results} results, {unknown} outcome-unknown, {executed_here} executions"));
            }
        }
        if executed_here > calls.len() {
            figures.unsurfaced.push(format!(
                "{id}: {executed_here} refund executions, {} calls with an outcome in the log",
                calls.len()
            ));
        }
    }
    // Tenant caps exact against the log: per UTC day, the capped tenant's
    // spend in its runs' logs passes the cap by no more than the calls in
    // flight at each Redis flush (`tenant_cap_allowance`).
    let flushes = figures
        .faults
        .get(&format!("{:?}", Fault::RedisFlush))
        .copied()
        .unwrap_or(0);
    figures.cap_allowance =
        tenant_cap_allowance(flushes, CLIENTS - CLIENTS / 2, figures.max_call_tokens);
    for (day, spent) in &figures.capped_spend {
        if *spent > cap_tokens + figures.cap_allowance {
            figures.cap_overruns.push(format!(
                "{} on {day}: {spent} tokens, cap {cap_tokens} + allowance {}",
                GLOBEX.1, figures.cap_allowance
            ));
        }
    }
    drop(fleet);
    drop(partitions);
    drop(pg);
    drop(redis);
    rabbit.kill();
    figures
}

fn faults_from_env(default: usize) -> usize {
    std::env::var("GLIA_CHAOS_FAULTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn seeds() -> Vec<u64> {
    match std::env::var("GLIA_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(seed) => vec![seed],
        None => vec![1, fastrand::u64(..)],
    }
}

/// A log as one line, `seq:type@ms`, for failure messages.
fn story(events: &[Event]) -> String {
    events
        .iter()
        .map(|e| {
            format!(
                "{}:{}@{}",
                e.seq,
                e.kind.name(),
                e.at.format("%H:%M:%S%.3f")
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The short round (CI): a fixed seed and a random one, one fault of each
/// kind each.
#[test]
fn chaos_short_round() {
    for seed in seeds() {
        eprintln!("chaos: seed {seed} (replay with GLIA_CHAOS_SEED={seed})");
        let figures = round(seed, faults_from_env(FAULTS.len()));
        figures.print();
        figures.assert_clean();
    }
}

/// The long round (RELIABILITY.md): `GLIA_CHAOS_FAULTS` faults (default 200).
#[test]
#[ignore = "long: GLIA_CHAOS_FAULTS=200 cargo test -p glia-e2e --test chaos -- --ignored --nocapture"]
fn chaos_long_round() {
    let seed = std::env::var("GLIA_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("chaos: seed {seed} (replay with GLIA_CHAOS_SEED={seed})");
    let figures = round(seed, faults_from_env(200));
    figures.print();
    figures.assert_clean();
}
