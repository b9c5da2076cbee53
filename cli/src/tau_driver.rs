//! `glia batch FILE`: replay a recording's conversations through a fleet, as
//! its customers and approvers, over the dispatcher's HTTP API.
//!
//! Without `--server` it starts the embedded fleet (dispatcher and workers in
//! this process) on a SQLite file: a new one in a temporary directory, or the
//! one named by `--data`, where a batch that was interrupted (killed) goes on
//! from where each run's log ends; with `--server`, it drives a running dispatcher
//! whose workers were started with `--replay` on the same recording.
//!
//! The conversations go to the dispatcher as one batch (`POST /v1/batches`,
//! JSON Lines): the recording's run configuration is the batch's, and each
//! conversation is an item (`custom_id` = the conversation id) whose own
//! config patch names its replay model and system prompt. The dispatcher
//! admits the items progressively; the driver learns each item's run from
//! the batch's results, keeps each run's state by applying the run's events
//! (the same transition function the workers use), answers each pull point
//! from the recording as the customer and the approver, and checks every
//! finished run against the recording.
//!
//! A dispatcher that restarts or is briefly unreachable does not end the
//! batch: every request is retried through the outage
//! ([`Server::retrying`], bounded by `--max-outage-secs`), the submission
//! carries an idempotency key (stable for a `--data` file, so a second
//! invocation finds the first one's batch), payload posts are deduplicated
//! by the dispatcher, and the driver re-reads each run's events after the
//! last seq it applied, so it carries on where it was. Past the bound it
//! fails naming the server, the last error and the runs still unfinished.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chrono::{DateTime, Utc};
use clap::{Args, ValueEnum};
use glia_proto::{
    ApprovalStatus, Event, EventKind, Limit, Outcome, PauseReason, PullPoint, RunConfig, RunState,
};
use glia_replay::{Conversation, CustomerMove, Recording};
use indicatif::{ProgressBar, ProgressStyle};
use reqwest::{Client, Method};
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::client::{Answer, DEFAULT_MAX_OUTAGE_SECS, Server, Unreachable};

/// Who decides approvals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ApproveMode {
    /// The driver approves each call through the API after `--approve-delay-ms`.
    Auto,
    /// People decide, with `glia approvals` or the API; the driver waits.
    Manual,
}

/// `glia batch`.
#[derive(Args)]
pub struct BatchArgs {
    /// The recording: tau-bench trajectories (`gpt-4o-airline.json`), with
    /// `tools.json` beside it.
    #[arg(required = true)]
    pub file: Option<PathBuf>,
    /// The tool list, when not `tools.json` beside FILE.
    #[arg(long)]
    pub tools: Option<PathBuf>,
    /// How approvals are decided.
    #[arg(long, value_enum, default_value_t = ApproveMode::Auto)]
    pub approve: ApproveMode,
    /// With `--approve auto`: wait this long (ms) after an approval is
    /// requested before approving it.
    #[arg(long, default_value_t = 0)]
    pub approve_delay_ms: u64,
    /// Replay only the first N conversations.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Drive the dispatcher at this URL (its workers run `glia worker
    /// --replay` on the same recording) instead of the embedded fleet.
    #[arg(long, env = "GLIA_SERVER")]
    pub server: Option<String>,
    /// Bearer token for `--server` (scopes submit and approve).
    #[arg(long, env = "GLIA_TOKEN")]
    pub token: Option<String>,
    /// With `--server`: keep retrying (with backoff) a dispatcher that cannot
    /// be reached, times out or answers 502/503/504 for this many seconds
    /// before giving up; 0 gives up at the first failure.
    #[arg(long, env = "GLIA_MAX_OUTAGE_SECS", default_value_t = DEFAULT_MAX_OUTAGE_SECS)]
    pub max_outage_secs: u64,
    /// Embedded fleet: keep the runs in this SQLite file (default: a new
    /// file in a temporary directory, removed at the end). Run the batch
    /// again with the same file and it resumes: runs already admitted are
    /// not admitted again, each continues from its log.
    #[arg(long, value_name = "PATH", conflicts_with = "server")]
    pub data: Option<PathBuf>,
    /// Embedded fleet: workers to start.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Embedded fleet: runs each worker advances at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Print the summary as JSON on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Divergences and failures to print in full (the rest are counted).
    #[arg(long, default_value_t = 5)]
    pub show: usize,
    /// Take the recorded tools from this MCP server instead of the workers'
    /// own registry: a separate process (`glia replay-tools FILE`) the
    /// workers call through their MCP client. With `--server`, a server of
    /// the workers' catalogue serving this recording; on the embedded fleet,
    /// glia starts it under this name.
    #[arg(long, value_name = "NAME")]
    pub mcp_server: Option<String>,
}

/// How one run ended, as the driver judges it.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    Reproduced,
    Diverged(String),
    Failed(String),
}

/// One conversation being replayed.
struct Tracked {
    conversation: Arc<Conversation>,
    state: RunState,
    /// Head sequence at which the driver last posted something.
    acted_at: u64,
    /// Approvals first seen (for the delay) and posted (for the latency).
    seen: HashMap<String, Instant>,
    posted: HashMap<String, DateTime<Utc>>,
    verdict: Option<Verdict>,
    /// `model.call` events without a `model.response` after them: calls a
    /// crash interrupted and the worker made again. Each counts as a turn
    /// (`RunState::apply`), so a conversation the recording ends at the turn
    /// limit would reach it early.
    interrupted_model_calls: u64,
    /// Turns already added to the run's budget for those.
    turns_extended: u64,
}

impl Tracked {
    fn new(run_id: Uuid, conversation: Arc<Conversation>) -> Tracked {
        Tracked {
            conversation,
            state: RunState::new(run_id),
            acted_at: 0,
            seen: HashMap::new(),
            posted: HashMap::new(),
            verdict: None,
            interrupted_model_calls: 0,
            turns_extended: 0,
        }
    }
}

/// The conversations of the batch by what the driver knows of them.
#[derive(Default)]
struct Items {
    /// Items that became runs, by run id.
    runs: HashMap<Uuid, Tracked>,
    /// Items without a run yet, by custom id (the conversation id).
    waiting: HashMap<String, Arc<Conversation>>,
    /// Items the batch finished without a run (refused at admission,
    /// expired, cancelled), with why.
    not_run: Vec<(Arc<Conversation>, String)>,
}

/// The batch's counters.
#[derive(Debug, Default, serde::Serialize)]
pub struct Summary {
    /// Conversations replayed.
    pub runs: usize,
    /// Runs whose whole conversation equals the recording.
    pub reproduced: usize,
    /// Runs that parted from the recording.
    pub diverged: usize,
    /// Runs that failed or stopped for another reason.
    pub failed: usize,
    /// Model calls answered.
    pub model_calls: usize,
    /// Tool calls decided (`tool.call` events).
    pub tool_calls: usize,
    /// Tool results and errors recorded.
    pub tool_results: usize,
    /// Approvals resolved.
    pub approvals: usize,
    /// Of the approvals, those asked again because a worker died while the
    /// approved call ran (`approval.requested` with `interrupted`): the
    /// recording's own approvals are `approvals - interrupted_approvals`.
    pub interrupted_approvals: usize,
    /// Model turns given back to runs that reached their turn limit only
    /// because model calls a crash interrupted were made again.
    pub turns_given_back: usize,
    /// Customer messages the runs received (`input.received`, including
    /// closing words).
    pub customer_turns: usize,
    /// Approval posted → `approval.resolved` recorded, ms.
    pub approval_resume_p50_ms: Option<f64>,
    /// The same, 99th percentile.
    pub approval_resume_p99_ms: Option<f64>,
    /// Submit of the first run to the end of the last, seconds.
    pub wall_s: f64,
    /// Steps (model calls + tool results) per second of wall time.
    pub steps_per_s: f64,
}

#[derive(Deserialize)]
struct RunPage {
    runs: Vec<RunRow>,
    next: Option<Uuid>,
}

#[derive(Deserialize)]
struct RunRow {
    run_id: Uuid,
    head_seq: u64,
}

#[derive(Deserialize)]
struct EventPage {
    events: Vec<Event>,
}

/// A line of `GET /v1/batches/{id}/results`, the fields the driver reads.
#[derive(Deserialize)]
struct ItemRow {
    custom_id: String,
    run_id: Option<Uuid>,
    status: String,
    error: Option<String>,
}

/// `glia batch`: returns an error (non-zero exit) when a run diverged or
/// failed, an item ended without a run (refused, expired, cancelled), or the
/// batch stopped at its spend cap with conversations not started.
pub async fn batch(args: BatchArgs) -> Result<()> {
    let Some(file) = args.file.clone() else {
        bail!("give a recording to replay, or a subcommand (glia batch --help)")
    };
    let tools = args
        .tools
        .clone()
        .unwrap_or_else(|| file.with_file_name(glia_replay::tau::TOOLS));
    let recording = glia_replay::tau::load(&file, &tools)?;
    if recording.conversations().is_empty() || args.limit == Some(0) {
        bail!("{} holds no conversations to replay", file.display());
    }
    let (server, _fleet) = match &args.server {
        Some(url) => (
            Server {
                server: url.clone(),
                token: args.token.clone(),
                max_outage_secs: args.max_outage_secs,
            },
            None,
        ),
        None => {
            let mcp = args
                .mcp_server
                .as_deref()
                .map(|name| (name, file.as_path(), tools.as_path()));
            let fleet = crate::serve::Embedded::start(
                &recording,
                args.workers,
                args.concurrency,
                args.data.as_deref(),
                mcp,
            )
            .await?;
            (
                Server {
                    server: fleet.url.clone(),
                    token: None,
                    max_outage_secs: args.max_outage_secs,
                },
                Some(fleet),
            )
        }
    };
    // On a named data file the batch is the same batch every time, so a
    // second invocation finds the batch of the first (its idempotency key).
    let key = match &args.data {
        Some(_) => format!(
            "glia-tau:{}",
            stable_batch_id(&file, &tools, args.limit, args.mcp_server.as_deref())?
        ),
        None => format!("glia-tau:{}", Uuid::now_v7()),
    };
    let summary = drive(&server, &recording, &args, &key).await?;
    let (diverged, failed) = (summary.diverged, summary.failed);
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print_table(&summary);
    }
    if diverged + failed > 0 {
        bail!(
            "{diverged} run(s) diverged and {failed} failed of {}",
            summary.runs
        );
    }
    Ok(())
}

/// The stable id of a recording (trajectories, tools, limit): the first 16
/// bytes of their SHA-256, as a custom (version 8) UUID.
fn stable_batch_id(
    file: &std::path::Path,
    tools: &std::path::Path,
    limit: Option<usize>,
    mcp_server: Option<&str>,
) -> Result<Uuid> {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for path in [file, tools] {
        hash.update(std::fs::read(path).with_context(|| format!("reading {}", path.display()))?);
    }
    hash.update(format!("limit={limit:?}"));
    if let Some(name) = mcp_server {
        hash.update(format!("mcp_server={name}"));
    }
    let digest = hash.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    Ok(uuid::Builder::from_custom_bytes(bytes).into_uuid())
}

async fn drive(
    server: &Server,
    recording: &Recording,
    args: &BatchArgs,
    key: &str,
) -> Result<Summary> {
    let client = crate::client::http_client()?;
    let conversations: Vec<Arc<Conversation>> = recording
        .conversations()
        .iter()
        .take(args.limit.unwrap_or(usize::MAX))
        .cloned()
        .collect();
    let started = Instant::now();
    let bar = ProgressBar::new(conversations.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} runs done  {msg}")?
            .progress_chars("=> "),
    );
    let mut items = Items {
        waiting: conversations
            .iter()
            .map(|c| (c.id.clone(), c.clone()))
            .collect(),
        ..Items::default()
    };
    let batch_id = match submit(
        &client,
        server,
        recording,
        &conversations,
        key,
        args.mcp_server.as_deref(),
    )
    .await
    {
        Ok(id) => id,
        Err(e) => {
            bar.abandon();
            return Err(stranded(e, &items, true));
        }
    };
    match poll(&client, server, batch_id, &mut items, args, &bar, started).await {
        Ok(summary) => Ok(summary),
        Err(e) => {
            bar.abandon();
            Err(stranded(e, &items, false))
        }
    }
}

/// Submit `conversations` as one batch and answer its id: JSON Lines, line
/// 1 the recording's run configuration, then one item per conversation
/// whose config patch is its replay model and system prompt (the only
/// fields in which conversations' configurations differ). Retried through
/// an outage; the idempotency key `key` makes a repeat answer the batch
/// first stored.
async fn submit(
    client: &Client,
    server: &Server,
    recording: &Recording,
    conversations: &[Arc<Conversation>],
    key: &str,
    mcp_server: Option<&str>,
) -> Result<Uuid> {
    let config_of = |c: &Conversation| match mcp_server {
        Some(name) => recording.mcp_run_config(c, name),
        None => recording.run_config(c),
    };
    let base = config_of(&conversations[0]);
    let mut upload = serde_json::to_vec(&json!({ "config": base }))?;
    upload.push(b'\n');
    for c in conversations {
        let config = config_of(c);
        assert_eq!(
            RunConfig {
                model: base.model.clone(),
                system: base.system.clone(),
                ..config.clone()
            },
            base,
            "conversation {} differs from the batch's config in more than its model and system prompt",
            c.id
        );
        serde_json::to_writer(
            &mut upload,
            &json!({ "custom_id": c.id, "goal": c.goal(), "config": { "model": config.model, "system": config.system } }),
        )?;
        upload.push(b'\n');
    }
    let upload = bytes::Bytes::from(upload);
    let (status, body) = server
        .retrying(Instant::now(), || {
            let req = server
                .request(client, Method::POST, "/v1/batches")
                .header("content-type", "application/jsonl")
                .header("idempotency-key", key)
                .body(upload.clone());
            server.bytes_once(req)
        })
        .await
        .context("submitting the batch")?;
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let batch = Answer {
        status,
        body,
        attempts: 1,
    }
    .checked()
    .context("submitting the batch")?;
    serde_json::from_value(batch["id"].clone()).context("the dispatcher's answer has no batch id")
}

/// The batch's results (`GET /v1/batches/{id}/results`), one row per item.
async fn results(client: &Client, server: &Server, batch_id: Uuid) -> Result<Vec<ItemRow>> {
    let path = format!("/v1/batches/{batch_id}/results");
    let (status, body) = server
        .retrying(Instant::now(), || {
            server.bytes_once(server.request(client, Method::GET, &path))
        })
        .await?;
    if !status.is_success() {
        Answer {
            status,
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            attempts: 1,
        }
        .checked()
        .with_context(|| format!("reading {path}"))?;
    }
    body.split(|&b| b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| serde_json::from_slice(line).with_context(|| format!("a line of {path}")))
        .collect()
}

/// The error that ends a batch early, and, when the dispatcher could not be
/// reached, which runs are left unfinished (ids and conversations: they
/// carry on with the fleet, and a later `glia batch` on the same `--data`
/// file picks the batch up again) and how many conversations were not
/// submitted (`unsubmitted`: the submission itself failed) or not started.
fn stranded(e: anyhow::Error, items: &Items, unsubmitted: bool) -> anyhow::Error {
    if !e.chain().any(|c| c.is::<Unreachable>()) {
        return e;
    }
    let mut open: Vec<(&Uuid, &Tracked)> = items
        .runs
        .iter()
        .filter(|(_, t)| t.verdict.is_none())
        .collect();
    open.sort_by_key(|(id, _)| **id);
    let mut text = format!("{} run(s) still unfinished", open.len());
    match items.waiting.len() {
        0 => {}
        n if unsubmitted => text.push_str(&format!(" and {n} conversation(s) not submitted")),
        n => text.push_str(&format!(" and {n} conversation(s) not started yet")),
    }
    if !open.is_empty() {
        let list: Vec<String> = open
            .iter()
            .map(|(id, t)| format!("{id} (conversation {})", t.conversation.id))
            .collect();
        text.push_str(&format!(": {}", list.join(", ")));
    }
    e.context(text)
}

/// Learn each item's run, then catch up with, answer and judge every run,
/// until every item is judged.
async fn poll(
    client: &Client,
    server: &Server,
    batch_id: Uuid,
    items: &mut Items,
    args: &BatchArgs,
    bar: &ProgressBar,
    started: Instant,
) -> Result<Summary> {
    let mut summary = Summary {
        runs: items.waiting.len() + items.runs.len(),
        ..Summary::default()
    };
    let mut latencies_ms: Vec<f64> = Vec::new();
    let delay = Duration::from_millis(args.approve_delay_ms);
    let mut idle = Duration::from_millis(1);
    let mut results_read: Option<Instant> = None;
    loop {
        let mut progressed = false;
        let rows = list_batch(client, server, batch_id).await?;
        // 1. Items admitted since the last look: their runs, from the
        //    batch's results (read when an unknown run shows up, and each
        //    second while items wait, to see those finished without a run).
        let unknown = rows.iter().any(|r| !items.runs.contains_key(&r.run_id));
        if !items.waiting.is_empty()
            && (unknown || results_read.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)))
        {
            for row in results(client, server, batch_id).await? {
                let Some(conversation) = items.waiting.remove(&row.custom_id) else {
                    continue;
                };
                match row.run_id {
                    Some(run_id) => {
                        items
                            .runs
                            .insert(run_id, Tracked::new(run_id, conversation));
                        progressed = true;
                    }
                    None if matches!(row.status.as_str(), "failed" | "cancelled" | "expired") => {
                        items.not_run.push((
                            conversation,
                            format!("{}: {}", row.status, row.error.unwrap_or_default()),
                        ));
                        bar.inc(1);
                    }
                    None => {
                        items.waiting.insert(row.custom_id, conversation);
                    }
                }
            }
            results_read = Some(Instant::now());
            // Items wait: a batch stopped at its spend cap starts none of
            // them again by itself; the driver ends (non-zero) instead of
            // waiting, naming what was not started.
            if !items.waiting.is_empty() {
                let view = server
                    .get(client, &format!("/v1/batches/{batch_id}"))
                    .await?;
                if view["cap_reached"] == true && view["status"] != "active" {
                    bail!(
                        "batch {batch_id} stopped at its spend cap ({}) with {} conversation(s) not started",
                        view["status"].as_str().unwrap_or("?"),
                        items.waiting.len()
                    );
                }
            }
        }
        let runs = &mut items.runs;
        // 2. Catch up with every run that moved.
        for row in rows {
            let Some(t) = runs.get_mut(&row.run_id) else {
                continue;
            };
            if row.head_seq <= t.state.head_seq {
                continue;
            }
            progressed = true;
            for event in events_after(client, server, row.run_id, t.state.head_seq).await? {
                match &event.kind {
                    EventKind::ModelCall { .. } => t.interrupted_model_calls += 1,
                    EventKind::ModelResponse { .. } => {
                        summary.model_calls += 1;
                        t.interrupted_model_calls = t.interrupted_model_calls.saturating_sub(1);
                    }
                    EventKind::ToolCall(_) => summary.tool_calls += 1,
                    EventKind::ToolResult { .. } | EventKind::ToolError { .. } => {
                        summary.tool_results += 1
                    }
                    EventKind::ApprovalRequested {
                        interrupted: true, ..
                    } => summary.interrupted_approvals += 1,
                    EventKind::InputReceived { .. } => summary.customer_turns += 1,
                    EventKind::ApprovalResolved { call_id, .. } => {
                        summary.approvals += 1;
                        let request = t
                            .state
                            .call(call_id)
                            .and_then(|c| c.requested_seq)
                            .unwrap_or(0);
                        if let Some(posted) = t.posted.remove(&format!("{call_id}@{request}")) {
                            latencies_ms.push(
                                (event.at - posted).num_microseconds().unwrap_or(0) as f64 / 1000.0,
                            );
                        }
                    }
                    _ => {}
                }
                t.state.apply(&event).with_context(|| {
                    format!("run {}: event {} does not apply", row.run_id, event.seq)
                })?;
            }
        }
        // 3. Answer every run that waits for the driver.
        let mut pending_approvals = 0;
        let mut done = 0;
        for (id, t) in runs.iter_mut() {
            if t.verdict.is_none() {
                t.verdict = judge(t);
                if t.verdict.is_some() {
                    bar.inc(1);
                }
            }
            if t.verdict.is_some() {
                done += 1;
                continue;
            }
            pending_approvals += t
                .state
                .pending_calls
                .iter()
                .filter(|c| c.approval == ApprovalStatus::Requested)
                .count();
            if t.acted_at == t.state.head_seq {
                continue;
            }
            match t.state.parked.clone() {
                Some(PullPoint::AwaitingApproval { call_ids })
                    if args.approve == ApproveMode::Auto =>
                {
                    let mut all = true;
                    for call_id in call_ids {
                        let Some(call) = t.state.call(&call_id) else {
                            continue;
                        };
                        // One approval request of the call (a crash may ask again).
                        let key = format!("{call_id}@{}", call.requested_seq.unwrap_or(0));
                        let first_seen = *t.seen.entry(key.clone()).or_insert_with(Instant::now);
                        if first_seen.elapsed() < delay {
                            all = false;
                            continue;
                        }
                        if t.posted.contains_key(&key) {
                            continue;
                        }
                        t.posted.insert(key, Utc::now());
                        let body = json!({ "decision": "approve", "args_hash": call.args_hash });
                        let path = format!("/v1/runs/{id}/approvals/{call_id}");
                        post(client, server, *id, None, &path, &body)
                            .await
                            .with_context(|| format!("approving {call_id} of run {id}"))?;
                        progressed = true;
                    }
                    if all {
                        t.acted_at = t.state.head_seq;
                    }
                }
                // Out of turns only because crashed calls were made again:
                // give those turns back, as an operator would.
                Some(PullPoint::Paused {
                    reason:
                        PauseReason::Budget {
                            limit: Limit::Turns,
                        },
                }) if t.interrupted_model_calls > t.turns_extended => {
                    let extra = t.interrupted_model_calls - t.turns_extended;
                    let body = json!({ "extend": { "max_turns": extra } });
                    post(
                        client,
                        server,
                        *id,
                        Some(t.state.head_seq),
                        &format!("/v1/runs/{id}/resume"),
                        &body,
                    )
                    .await
                    .with_context(|| format!("extending run {id}"))?;
                    t.turns_extended += extra;
                    summary.turns_given_back += extra as usize;
                    t.acted_at = t.state.head_seq;
                    progressed = true;
                }
                Some(
                    PullPoint::AwaitingInput
                    | PullPoint::Paused {
                        reason: PauseReason::Budget { .. },
                    },
                ) => {
                    let (path, body) = match t.conversation.customer_move(&t.state.messages) {
                        // `head_seq`: a post whose earlier attempt (before a
                        // restart of this driver or of the node) landed and
                        // was taken is refused, never taken as the next message.
                        CustomerMove::Say(text) => (
                            "messages",
                            json!({ "text": text, "head_seq": t.state.head_seq }),
                        ),
                        CustomerMove::Close(Some(text)) => (
                            "close",
                            json!({ "text": text, "head_seq": t.state.head_seq }),
                        ),
                        CustomerMove::Close(None) => {
                            ("close", json!({ "head_seq": t.state.head_seq }))
                        }
                        CustomerMove::Diverged(why) => {
                            t.verdict = Some(Verdict::Diverged(why.clone()));
                            bar.inc(1);
                            let cancel = json!({ "reason": format!("replay diverged: {why}") });
                            post(
                                client,
                                server,
                                *id,
                                Some(t.state.head_seq),
                                &format!("/v1/runs/{id}/cancel"),
                                &cancel,
                            )
                            .await
                            .with_context(|| format!("cancelling run {id}"))?;
                            continue;
                        }
                    };
                    post(
                        client,
                        server,
                        *id,
                        Some(t.state.head_seq),
                        &format!("/v1/runs/{id}/{path}"),
                        &body,
                    )
                    .await
                    .with_context(|| format!("posting to run {id}"))?;
                    t.acted_at = t.state.head_seq;
                    progressed = true;
                }
                _ => {}
            }
        }
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        let steps = summary.model_calls + summary.tool_results;
        bar.set_message(format!(
            "{:.0} steps/s  approvals pending: {pending_approvals}",
            steps as f64 / secs
        ));
        if done == runs.len() && items.waiting.is_empty() {
            break;
        }
        // Poll fast while runs move, back off to 50 ms while they wait.
        idle = if progressed {
            Duration::from_millis(1)
        } else {
            (idle * 2).min(Duration::from_millis(50))
        };
        if !progressed {
            tokio::time::sleep(idle).await;
        }
    }
    bar.finish();
    summary.wall_s = started.elapsed().as_secs_f64();
    summary.steps_per_s =
        (summary.model_calls + summary.tool_results) as f64 / summary.wall_s.max(1e-9);
    latencies_ms.sort_by(f64::total_cmp);
    summary.approval_resume_p50_ms = percentile(&latencies_ms, 0.50);
    summary.approval_resume_p99_ms = percentile(&latencies_ms, 0.99);
    let mut shown = 0;
    let mut ids: Vec<&Uuid> = items.runs.keys().collect();
    ids.sort();
    for id in ids {
        let t = &items.runs[id];
        match t.verdict.as_ref().expect("every run is judged") {
            Verdict::Reproduced => summary.reproduced += 1,
            Verdict::Diverged(why) | Verdict::Failed(why) => {
                if matches!(t.verdict, Some(Verdict::Diverged(_))) {
                    summary.diverged += 1;
                } else {
                    summary.failed += 1;
                }
                if shown < args.show {
                    shown += 1;
                    errln!("run {id} (conversation {}): {why}", t.conversation.id);
                }
            }
        }
    }
    for (conversation, why) in &items.not_run {
        summary.failed += 1;
        if shown < args.show {
            shown += 1;
            errln!("conversation {} was not run: {why}", conversation.id);
        }
    }
    Ok(summary)
}

/// The verdict on a finished run, `None` while it goes on.
fn judge(t: &Tracked) -> Option<Verdict> {
    match t.state.outcome.as_ref()? {
        Outcome::Succeeded { .. } => Some(match t.conversation.check_complete(&t.state.messages) {
            Ok(()) => Verdict::Reproduced,
            Err(why) => Verdict::Diverged(why),
        }),
        Outcome::Failed { error } if error.contains("replay diverged") => {
            Some(Verdict::Diverged(error.clone()))
        }
        Outcome::Failed { error } => Some(Verdict::Failed(error.clone())),
        Outcome::Cancelled { reason } => Some(Verdict::Failed(format!("cancelled: {reason}"))),
    }
}

/// POST `body` (a payload for run `run_id`) to `path`, retried through an
/// outage. With `head` (the run's head when the driver decided to post; for
/// payloads the dispatcher does not deduplicate once consumed: messages,
/// closes, cancels) the run is read again before each retry: when its head
/// moved past `head`, the lost attempt landed and was consumed (or someone
/// else answered), and nothing is posted again (a message posted again
/// would be taken as the customer's next one). Decisions need no `head`:
/// the dispatcher accepts one per approval request. A 409
/// is not an error here: someone else (a person, the reconciler, a finished
/// run, or this post's own earlier attempt still pending) acted first, and
/// the run's events will tell the driver what happened.
async fn post(
    client: &Client,
    server: &Server,
    run_id: Uuid,
    head: Option<u64>,
    path: &str,
    body: &serde_json::Value,
) -> Result<()> {
    let attempts = std::sync::atomic::AtomicU32::new(0);
    let answer = server
        .retrying(Instant::now(), || async {
            if let Some(head) = head
                && attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed) > 0
            {
                let (status, run) = server
                    .send_once(
                        client,
                        Method::GET,
                        &format!("/v1/runs/{run_id}"),
                        None,
                        &[],
                    )
                    .await?;
                if status.is_success() && run["head_seq"].as_u64().is_some_and(|h| h != head) {
                    return Ok(None);
                }
            }
            server
                .send_once(client, Method::POST, path, Some(body), &[])
                .await
                .map(Some)
        })
        .await?;
    match answer {
        None => Ok(()),
        Some((status, _)) if status == reqwest::StatusCode::CONFLICT => Ok(()),
        Some((status, body)) => crate::client::Answer {
            status,
            body,
            attempts: 1,
        }
        .checked()
        .map(|_| ()),
    }
}

async fn list_batch(client: &Client, server: &Server, batch_id: Uuid) -> Result<Vec<RunRow>> {
    let mut rows = Vec::new();
    let mut after: Option<Uuid> = None;
    loop {
        let mut path = format!("/v1/runs?batch_id={batch_id}&limit=500");
        if let Some(a) = after {
            path.push_str(&format!("&after={a}"));
        }
        let page: RunPage = serde_json::from_value(server.get(client, &path).await?)?;
        rows.extend(page.runs);
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(rows),
        }
    }
}

async fn events_after(
    client: &Client,
    server: &Server,
    run_id: Uuid,
    after: u64,
) -> Result<Vec<Event>> {
    let mut events = Vec::new();
    let mut after = after;
    loop {
        let path = format!("/v1/runs/{run_id}/events?after={after}&limit=500");
        let page: EventPage =
            serde_json::from_value::<EventPage>(server.get(client, &path).await?)?;
        let Some(last) = page.events.last() else {
            return Ok(events);
        };
        after = last.seq;
        events.extend(page.events);
    }
}

/// The `q` quantile (nearest rank) of sorted values.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

fn print_table(s: &Summary) {
    let ms = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |v| format!("{v:.1} ms"));
    let rows: Vec<(&str, String)> = vec![
        ("runs", s.runs.to_string()),
        ("reproduced", s.reproduced.to_string()),
        ("diverged", s.diverged.to_string()),
        ("failed", s.failed.to_string()),
        ("model calls", s.model_calls.to_string()),
        ("tool calls", s.tool_calls.to_string()),
        ("approvals", s.approvals.to_string()),
        ("  after interruption", s.interrupted_approvals.to_string()),
        ("turns given back", s.turns_given_back.to_string()),
        ("customer turns", s.customer_turns.to_string()),
        ("approval→resume p50", ms(s.approval_resume_p50_ms)),
        ("approval→resume p99", ms(s.approval_resume_p99_ms)),
        ("wall time", format!("{:.2} s", s.wall_s)),
        ("steps/s", format!("{:.0}", s.steps_per_s)),
    ];
    for (k, v) in rows {
        outln!("{k:<22} {v:>12}");
    }
}
