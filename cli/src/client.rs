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
    // What the dispatcher would refuse (422) is refused here, before anything is sent.
    config.validate().map_err(|e| anyhow::anyhow!("invalid run config: {e}"))?;
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
            let mut path = "/v1/approvals?status=pending".to_owned();
            if let Some(t) = tool {
                path.push_str(&format!("&tool={t}"));
            }
            let body = checked(server.request(&client, Method::GET, &path).send().await?).await?;
            let rows = body["approvals"].as_array().or(body.as_array()).cloned().unwrap_or_default();
            for a in rows {
                // An interrupted call may already have taken effect: say so.
                let again = if a["interrupted"].as_bool() == Some(true) { "  (ran once, interrupted: check before running it again)" } else { "" };
                println!("{}  {}  {}  {}{again}", a["run_id"].as_str().unwrap_or("?"), a["call_id"].as_str().unwrap_or("?"), a["tool"].as_str().unwrap_or("?"), a["input"]);
            }
        }
        ApprovalsCommand::Approve { server, run_id, call_id } => decide(&client, &server, &run_id, &call_id, json!({ "decision": "approve" })).await?,
        ApprovalsCommand::Reject { server, run_id, call_id, reason } => {
            decide(&client, &server, &run_id, &call_id, json!({ "decision": "reject", "reason": reason })).await?
        }
    }
    Ok(())
}

async fn decide(client: &Client, server: &Server, run_id: &str, call_id: &str, body: Value) -> Result<()> {
    checked(server.request(client, Method::POST, &format!("/v1/runs/{run_id}/approvals/{call_id}")).json(&body).send().await?).await?;
    eprintln!("decision posted");
    Ok(())
}
