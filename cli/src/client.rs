//! The HTTP client side of the CLI: `glia submit`, `glia runs`, `glia approvals`.
//! It speaks the dispatcher's JSON API and nothing else.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use glia_proto::{Event, RunConfig};
use reqwest::{Client, Method, RequestBuilder, Response};
use serde_json::{Value, json};

/// Where the dispatcher is and who we are.
#[derive(Args, Clone)]
pub struct Server {
    /// Dispatcher base URL.
    #[arg(long, env = "GLIA_SERVER", default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// Bearer token.
    #[arg(long, env = "GLIA_TOKEN")]
    pub token: Option<String>,
}

impl Server {
    /// A request to `path` on the dispatcher, with the bearer token.
    pub fn request(&self, client: &Client, method: Method, path: &str) -> RequestBuilder {
        let req = client.request(method, format!("{}{}", self.server.trim_end_matches('/'), path));
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }
}

/// An HTTP client for the dispatcher: a dispatcher that does not answer is
/// an error after 10 s (connect) or 60 s (a whole request), never a hang.
/// Streams (`events/stream`) are read without the request timeout.
pub fn http_client() -> Result<Client> {
    Ok(Client::builder().connect_timeout(std::time::Duration::from_secs(10)).timeout(std::time::Duration::from_secs(60)).pool_max_idle_per_host(64).build()?)
}

/// A client for long-lived streams: connect timeout only.
fn stream_client() -> Result<Client> {
    Ok(Client::builder().connect_timeout(std::time::Duration::from_secs(10)).build()?)
}

/// Turn a non-2xx answer into an error carrying the dispatcher's JSON error.
pub async fn checked(resp: Response) -> Result<Value> {
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        let code = body["error"]["code"].as_str().unwrap_or("unknown");
        let message = body["error"]["message"].as_str().unwrap_or("");
        bail!("dispatcher answered {status}: {code}: {message}");
    }
    Ok(body)
}

/// `glia submit`.
#[derive(Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    server: Server,
    /// Run configuration (JSON RunConfig).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Idempotency key: submitting the same key twice gives the same run.
    #[arg(long)]
    idempotency_key: Option<String>,
    /// Print events as JSON lines.
    #[arg(long)]
    json: bool,
    /// Do not follow the run's events; print its id and return.
    #[arg(long)]
    detach: bool,
    /// The goal.
    goal: String,
}

/// Create a run and stream its events until it parks or ends.
pub async fn submit(args: SubmitArgs) -> Result<()> {
    let config: RunConfig = match &args.config {
        Some(p) => serde_json::from_str(&std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
            .with_context(|| format!("parsing config {}", p.display()))?,
        None => RunConfig::default(),
    };
    let client = http_client()?;
    let mut req = args.server.request(&client, Method::POST, "/v1/runs").json(&json!({ "goal": args.goal, "config": config }));
    if let Some(key) = &args.idempotency_key {
        req = req.header("Idempotency-Key", key);
    }
    let run = checked(req.send().await.context("connecting to the dispatcher")?).await?;
    let run_id = run["run_id"].as_str().context("the dispatcher's answer has no run_id")?.to_owned();
    if args.detach {
        println!("{run_id}");
        return Ok(());
    }
    eprintln!("run {run_id}");
    follow(&stream_client()?, &args.server, &run_id, args.json).await
}

/// Print a run's events from the SSE stream until it parks or ends.
async fn follow(client: &Client, server: &Server, run_id: &str, json: bool) -> Result<()> {
    let resp = server.request(client, Method::GET, &format!("/v1/runs/{run_id}/events/stream")).send().await?;
    if !resp.status().is_success() {
        checked(resp).await?;
        return Ok(());
    }
    let mut stream = resp.bytes_stream().eventsource();
    while let Some(msg) = stream.next().await {
        let msg = msg.context("reading the event stream")?;
        if msg.event == "live" || msg.data.is_empty() {
            continue;
        }
        let Ok(event) = serde_json::from_str::<Event>(&msg.data) else { continue };
        if json {
            println!("{}", msg.data);
        } else {
            println!("{:>4}  {:<18} {}", event.seq, event.kind.name(), crate::describe(&event.kind));
        }
        if let glia_proto::EventKind::SessionPause { pull_point } = &event.kind {
            eprintln!("parked at {}", pull_point.name());
            return Ok(());
        }
        if matches!(event.kind, glia_proto::EventKind::SessionComplete { .. } | glia_proto::EventKind::SessionCancel { .. }) {
            return Ok(());
        }
    }
    Ok(())
}

/// `glia runs`.
#[derive(Subcommand)]
pub enum RunsCommand {
    /// List runs, newest last.
    List {
        #[command(flatten)]
        server: Server,
        /// Only runs with this status (runnable, parked, done).
        #[arg(long)]
        status: Option<String>,
        /// Page size.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Show one run.
    Get {
        #[command(flatten)]
        server: Server,
        /// Run id.
        run_id: String,
    },
    /// Print a run's events.
    Events {
        #[command(flatten)]
        server: Server,
        /// Run id.
        run_id: String,
        /// Only events after this sequence number.
        #[arg(long, default_value_t = 0)]
        after: u64,
    },
}

/// Run a `glia runs` command.
pub async fn runs(cmd: RunsCommand) -> Result<()> {
    let client = http_client()?;
    match cmd {
        RunsCommand::List { server, status, limit } => {
            let mut path = format!("/v1/runs?limit={limit}");
            if let Some(s) = status {
                path.push_str(&format!("&status={s}"));
            }
            let body = checked(server.request(&client, Method::GET, &path).send().await?).await?;
            let runs = body["runs"].as_array().or(body.as_array()).cloned().unwrap_or_default();
            for r in runs {
                println!("{}  {:<9} head {:>4}  {}", r["run_id"].as_str().unwrap_or("?"), r["status"].as_str().unwrap_or("?"), r["head_seq"], r["goal"].as_str().unwrap_or(""));
            }
        }
        RunsCommand::Get { server, run_id } => {
            let body = checked(server.request(&client, Method::GET, &format!("/v1/runs/{run_id}")).send().await?).await?;
            println!("{}", serde_json::to_string_pretty(&body)?);
        }
        RunsCommand::Events { server, run_id, after } => {
            let body = checked(server.request(&client, Method::GET, &format!("/v1/runs/{run_id}/events?after={after}&limit=1000")).send().await?).await?;
            let events = body["events"].as_array().or(body.as_array()).cloned().unwrap_or_default();
            for e in events {
                println!("{e}");
            }
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
        #[arg(long)]
        csv: bool,
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
        ApprovalsCommand::List { server, tool } => {
            let mut query = vec![("status", "pending".to_owned())];
            query.extend(tool.map(|t| ("tool", t)));
            let body = checked(server.request(&client, Method::GET, "/v1/approvals").query(&query).send().await?).await?;
            let rows = body["approvals"].as_array().or(body.as_array()).cloned().unwrap_or_default();
            let now = chrono::Utc::now();
            for a in rows {
                println!(
                    "{}  {}  {}  {}{}{}",
                    a["run_id"].as_str().unwrap_or("?"),
                    a["call_id"].as_str().unwrap_or("?"),
                    a["tool"].as_str().unwrap_or("?"),
                    a["input"],
                    deadline_mark(&a, now),
                    // An interrupted call may already have taken effect: say so.
                    if a["interrupted"].as_bool() == Some(true) { "  [interrupted: may already have run; check before running it again]" } else { "" },
                );
            }
        }
        ApprovalsCommand::History { server, tool, resolution, limit, csv } => {
            let mut query = vec![("limit", limit.to_string())];
            query.extend(tool.map(|t| ("tool", t)));
            query.extend(resolution.map(|r| ("resolution", r)));
            if csv {
                query.push(("format", "csv".into()));
                let resp = server.request(&client, Method::GET, "/v1/approvals/history").query(&query).send().await?;
                let status = resp.status();
                let text = resp.text().await?;
                anyhow::ensure!(status.is_success(), "dispatcher answered {status}: {text}");
                print!("{text}");
                return Ok(());
            }
            let body = checked(server.request(&client, Method::GET, "/v1/approvals/history").query(&query).send().await?).await?;
            println!("{:<20}  {:<36}  {:<10}  {:<16}  {:<9}  {:<12}  {:>8}  DETAIL", "REQUESTED", "RUN", "CALL", "TOOL", "RESULT", "BY", "WAIT");
            for r in body["approvals"].as_array().cloned().unwrap_or_default() {
                let wait = r["wait_ms"].as_i64().map_or_else(|| "?".into(), |ms| human_ms(ms));
                let mut detail = Vec::new();
                if r["escalated_at"].is_string() {
                    detail.push("escalated".to_owned());
                }
                if r["interrupted"].as_bool() == Some(true) {
                    detail.push("interrupted".to_owned());
                }
                match r["decision"]["kind"].as_str() {
                    Some("reject") => detail.push(format!("reason: {}", r["decision"]["reason"].as_str().unwrap_or(""))),
                    Some("edit") => detail.push(format!("edited: {} -> {}", r["input"], r["decision"]["input"])),
                    _ => {}
                }
                println!(
                    "{:<20}  {:<36}  {:<10}  {:<16}  {:<9}  {:<12}  {:>8}  {}",
                    r["requested_at"].as_str().unwrap_or("?").chars().take(19).collect::<String>(),
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
        ApprovalsCommand::Approve { server, run_id, call_id } => decide(&client, &server, &run_id, &call_id, json!({ "decision": "approve" })).await?,
        ApprovalsCommand::Reject { server, run_id, call_id, reason } => {
            decide(&client, &server, &run_id, &call_id, json!({ "decision": "reject", "reason": reason })).await?
        }
    }
    Ok(())
}

/// `  [due in 4m 10s]`, `  [OVERDUE by 12s]`, `  [escalated]` or nothing
/// (no deadline), for an approval row of `GET /v1/approvals`.
fn deadline_mark(row: &Value, now: chrono::DateTime<chrono::Utc>) -> String {
    let escalated = if row["escalated"].as_bool() == Some(true) { "  [escalated]" } else { "" };
    let Some(at) = row["expires_at"].as_str().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()) else { return escalated.to_owned() };
    let left = (at.with_timezone(&chrono::Utc) - now).num_milliseconds();
    if left > 0 { format!("  [due in {}]{escalated}", human_ms(left)) } else { format!("  [OVERDUE by {}]{escalated}", human_ms(-left)) }
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

async fn decide(client: &Client, server: &Server, run_id: &str, call_id: &str, body: Value) -> Result<()> {
    checked(server.request(client, Method::POST, &format!("/v1/runs/{run_id}/approvals/{call_id}")).json(&body).send().await?).await?;
    eprintln!("decision posted");
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
    },
}

/// Run a `glia webhooks` command.
pub async fn webhooks(cmd: WebhooksCommand) -> Result<()> {
    let client = http_client()?;
    match cmd {
        WebhooksCommand::Create { server, url, events, slack } => {
            let mut body = json!({ "url": url, "format": if slack { "slack" } else { "standard" } });
            if !events.is_empty() {
                body["events"] = json!(events);
            }
            let created = checked(server.request(&client, Method::POST, "/v1/webhooks").json(&body).send().await?).await?;
            println!("{}", serde_json::to_string_pretty(&created)?);
            eprintln!("keep the secret: it is not shown again");
        }
        WebhooksCommand::List { server } => {
            let body = checked(server.request(&client, Method::GET, "/v1/webhooks").send().await?).await?;
            for w in body["webhooks"].as_array().cloned().unwrap_or_default() {
                println!("{}  {:<8}  {}  {}", w["id"].as_str().unwrap_or("?"), w["format"].as_str().unwrap_or("?"), w["url"].as_str().unwrap_or("?"), w["events"]);
            }
        }
        WebhooksCommand::Delete { server, id } => {
            let resp = server.request(&client, Method::DELETE, &format!("/v1/webhooks/{id}")).send().await?;
            if !resp.status().is_success() {
                checked(resp).await?;
            }
            eprintln!("deleted");
        }
        WebhooksCommand::Deliveries { server, id } => {
            let body = checked(server.request(&client, Method::GET, &format!("/v1/webhooks/{id}/deliveries")).send().await?).await?;
            for d in body["deliveries"].as_array().cloned().unwrap_or_default() {
                println!(
                    "{}  {:<18}  {:<9}  attempts {:<3}  {}  {}",
                    d["created_at"].as_str().unwrap_or("?").chars().take(19).collect::<String>(),
                    d["event_type"].as_str().unwrap_or("?"),
                    d["status"].as_str().unwrap_or("?"),
                    d["attempts"],
                    d["last_status"].as_u64().map_or_else(|| "-".to_owned(), |s| s.to_string()),
                    d["last_error"].as_str().unwrap_or(""),
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_marks() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-01-01T12:00:00Z").unwrap().with_timezone(&chrono::Utc);
        assert_eq!(deadline_mark(&json!({}), now), "");
        assert_eq!(deadline_mark(&json!({"expires_at": "2026-01-01T12:04:10Z"}), now), "  [due in 4m 10s]");
        assert_eq!(deadline_mark(&json!({"expires_at": "2026-01-01T11:59:48Z", "escalated": true}), now), "  [OVERDUE by 12s]  [escalated]");
        assert_eq!(human_ms(950), "950ms");
        assert_eq!(human_ms(7_500_000), "2h 05m");
    }
}
