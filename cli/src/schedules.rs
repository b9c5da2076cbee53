//! `glia schedules create|list|get|pause|unpause|backfill|delete`: runs
//! started on a cron expression or an interval (`/v1/schedules`; see
//! `docs/schedules.md`). Every request goes through the client's outage
//! retries ([`Server::call`]): creating twice is refused by name (409
//! `schedule_exists`), a backfill's runs are keyed by fire time, and the
//! rest are reads or idempotent.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{Map, Value, json};

use crate::client::{Server, http_client, print_json};

/// The definition of `glia schedules create`: a file, or flags (the flags
/// given replace the file's fields).
#[derive(Args, Clone, Default)]
pub struct Definition {
    /// A JSON file: the body of `POST /v1/schedules`.
    pub file: Option<PathBuf>,
    /// The schedule's name (unique in the tenant).
    #[arg(long)]
    pub name: Option<String>,
    /// A cron expression: 5 fields, or 6 with seconds first.
    #[arg(long, conflicts_with = "every_ms")]
    pub cron: Option<String>,
    /// The IANA time zone of --cron (default UTC).
    #[arg(long)]
    pub time_zone: Option<String>,
    /// Instead of --cron: fire every this many milliseconds (at least 1000).
    #[arg(long)]
    pub every_ms: Option<u64>,
    /// A registered agent, `NAME` or `NAME@VERSION`.
    #[arg(long)]
    pub agent: Option<String>,
    /// Instead of --agent: a run configuration (JSON file, as `config` of POST /v1/runs).
    #[arg(long, conflicts_with = "agent")]
    pub config: Option<PathBuf>,
    /// The goal template (`{{ fire_time }}`, `{{ fire_time_local }}`,
    /// `{{ schedule }}`, `{{ schedule_id }}`).
    #[arg(long)]
    pub goal: Option<String>,
    /// A tag of every run; repeat for several.
    #[arg(long = "tag")]
    pub tags: Vec<String>,
    /// `skip`, `buffer_one`, `allow_all` or `cancel_previous`.
    #[arg(long)]
    pub overlap: Option<String>,
    /// Catch-up window after downtime, ms.
    #[arg(long)]
    pub catch_up_window_ms: Option<u64>,
    /// Jitter, ms.
    #[arg(long)]
    pub jitter_ms: Option<u64>,
    /// Create it paused.
    #[arg(long)]
    pub paused: bool,
}

impl Definition {
    /// The request body: the file's object with the flags laid over it.
    fn body(&self) -> Result<Value> {
        let mut body: Map<String, Value> = match &self.file {
            None => Map::new(),
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                match serde_json::from_str(&text)
                    .with_context(|| format!("{} is not JSON", path.display()))?
                {
                    Value::Object(m) => m,
                    _ => bail!("{} must hold a JSON object", path.display()),
                }
            }
        };
        let mut set = |k: &str, v: Value| {
            body.insert(k.to_owned(), v);
        };
        if let Some(v) = &self.name {
            set("name", json!(v));
        }
        if let Some(v) = &self.cron {
            set("cron", json!(v));
        }
        if let Some(v) = &self.time_zone {
            set("time_zone", json!(v));
        }
        if let Some(v) = self.every_ms {
            set("interval_ms", json!(v));
        }
        if let Some(agent) = &self.agent {
            match agent.split_once('@') {
                Some((name, v)) => {
                    let v: u32 = v
                        .parse()
                        .with_context(|| format!("--agent {agent}: the version is a number"))?;
                    set("agent", json!(name));
                    set("agent_version", json!(v));
                }
                None => set("agent", json!(agent)),
            }
        }
        if let Some(path) = &self.config {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let config: Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", path.display()))?;
            set("config", config);
        }
        if let Some(v) = &self.goal {
            set("goal", json!(v));
        }
        if !self.tags.is_empty() {
            set("tags", json!(self.tags));
        }
        if let Some(v) = &self.overlap {
            set("overlap", json!(v));
        }
        if let Some(v) = self.catch_up_window_ms {
            set("catch_up_window_ms", json!(v));
        }
        if let Some(v) = self.jitter_ms {
            set("jitter_ms", json!(v));
        }
        if self.paused {
            set("paused", json!(true));
        }
        Ok(Value::Object(body))
    }
}

/// `glia schedules …` subcommands.
#[derive(Subcommand)]
pub enum SchedulesCommand {
    /// Create a schedule from a JSON file and/or flags; prints it with its
    /// next fire times.
    Create {
        #[command(flatten)]
        server: Server,
        #[command(flatten)]
        definition: Definition,
        /// Print the API's answer (JSON).
        #[arg(long)]
        json: bool,
    },
    /// The tenant's schedules (an admin's: every tenant's).
    List {
        #[command(flatten)]
        server: Server,
        /// Print the API's answer (JSON) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One schedule with its next five fire times (UTC and in its zone).
    Get {
        #[command(flatten)]
        server: Server,
        /// Schedule id.
        id: String,
        /// Print the API's answer (JSON).
        #[arg(long)]
        json: bool,
    },
    /// Pause: it fires nothing until unpaused.
    Pause {
        #[command(flatten)]
        server: Server,
        /// Schedule id.
        id: String,
    },
    /// Unpause: fire times count from now.
    Unpause {
        #[command(flatten)]
        server: Server,
        /// Schedule id.
        id: String,
    },
    /// Start one run per fire time in [FROM, TO] (RFC 3339; at most 100).
    Backfill {
        #[command(flatten)]
        server: Server,
        /// Schedule id.
        id: String,
        /// Start of the range (RFC 3339), inclusive.
        #[arg(long)]
        from: String,
        /// End of the range (RFC 3339), inclusive; not in the future.
        #[arg(long)]
        to: String,
        /// Print the API's answer (JSON).
        #[arg(long)]
        json: bool,
    },
    /// Delete a schedule (its runs stay).
    Delete {
        #[command(flatten)]
        server: Server,
        /// Schedule id.
        id: String,
    },
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("-")
}

/// The rule of a schedule's view in a few words.
fn rule(s: &Value) -> String {
    let d = &s["definition"];
    match (d["cron"].as_str(), d["interval_ms"].as_u64()) {
        (Some(cron), _) => format!("cron {cron:?} {}", d["time_zone"].as_str().unwrap_or("UTC")),
        (None, Some(ms)) => format!("every {ms} ms"),
        _ => "?".into(),
    }
}

fn print_schedule(s: &Value) {
    let d = &s["definition"];
    outln!("id          {}", text(s, "id"));
    outln!("name        {}", text(s, "name"));
    outln!("tenant      {}", text(s, "tenant"));
    outln!("rule        {}", rule(s));
    let start = match (d["agent"].as_str(), d["agent_version"].as_u64()) {
        (Some(a), Some(v)) => format!("agent {a}@{v}"),
        (Some(a), None) => format!("agent {a} (latest version)"),
        _ => "config".into(),
    };
    outln!("starts      {start}");
    outln!("goal        {}", text(d, "goal"));
    outln!(
        "overlap     {}   catch-up window {} ms   jitter {} ms",
        text(d, "overlap"),
        d["catch_up_window_ms"],
        d["jitter_ms"].as_u64().unwrap_or(0)
    );
    outln!("paused      {}", s["paused"].as_bool().unwrap_or(false));
    outln!("last fire   {}", text(s, "last_fire_time"));
    outln!("last run    {}", text(s, "last_run_id"));
    if let Some(b) = s["buffered_fire_time"].as_str() {
        outln!("buffered    {b}");
    }
    if let Some(e) = s["last_error"].as_str() {
        outln!("last error  {e}");
    }
    let next = s["next_fire_times"].as_array().cloned().unwrap_or_default();
    if !next.is_empty() {
        outln!("next fire times (UTC | local | due with jitter):");
        for f in next {
            outln!(
                "  {}  {}  {}",
                text(&f, "utc"),
                text(&f, "local"),
                text(&f, "due_at")
            );
        }
    }
}

/// Run a `glia schedules` command.
pub async fn schedules(cmd: SchedulesCommand) -> Result<()> {
    let client = http_client()?;
    match cmd {
        SchedulesCommand::Create {
            server,
            definition,
            json,
        } => {
            let body = definition.body()?;
            let created = server
                .call(&client, Method::POST, "/v1/schedules", Some(&body), &[])
                .await?
                .checked()?;
            if json {
                return print_json(&created);
            }
            print_schedule(&created);
        }
        SchedulesCommand::List { server, json } => {
            let mut all = Vec::new();
            let mut after: Option<String> = None;
            loop {
                let path = match &after {
                    Some(a) => format!("/v1/schedules?limit=1000&after={a}"),
                    None => "/v1/schedules?limit=1000".to_owned(),
                };
                let page = server.get(&client, &path).await?;
                all.extend(page["schedules"].as_array().cloned().unwrap_or_default());
                match page["next"].as_str() {
                    Some(next) => after = Some(next.to_owned()),
                    None => break,
                }
            }
            if json {
                return print_json(&json!({ "schedules": all }));
            }
            outln!(
                "{:<36}  {:<24}  {:<6}  {:<15}  rule",
                "id",
                "name",
                "paused",
                "overlap"
            );
            for s in &all {
                outln!(
                    "{:<36}  {:<24}  {:<6}  {:<15}  {}",
                    text(s, "id"),
                    text(s, "name"),
                    s["paused"].as_bool().unwrap_or(false),
                    text(&s["definition"], "overlap"),
                    rule(s)
                );
            }
        }
        SchedulesCommand::Get { server, id, json } => {
            let s = server.get(&client, &format!("/v1/schedules/{id}")).await?;
            if json {
                return print_json(&s);
            }
            print_schedule(&s);
        }
        SchedulesCommand::Pause { server, id } => {
            let s = server
                .call(
                    &client,
                    Method::POST,
                    &format!("/v1/schedules/{id}/pause"),
                    None,
                    &[],
                )
                .await?
                .checked()?;
            errln!("paused {}", text(&s, "name"));
        }
        SchedulesCommand::Unpause { server, id } => {
            let s = server
                .call(
                    &client,
                    Method::POST,
                    &format!("/v1/schedules/{id}/unpause"),
                    None,
                    &[],
                )
                .await?
                .checked()?;
            errln!("unpaused {}: fire times count from now", text(&s, "name"));
        }
        SchedulesCommand::Backfill {
            server,
            id,
            from,
            to,
            json,
        } => {
            let body = json!({"from": from, "to": to});
            let answer = server
                .call(
                    &client,
                    Method::POST,
                    &format!("/v1/schedules/{id}/backfill"),
                    Some(&body),
                    &[],
                )
                .await?
                .checked()?;
            if json {
                return print_json(&answer);
            }
            let runs = answer["runs"].as_array().cloned().unwrap_or_default();
            for r in &runs {
                outln!(
                    "{}  {}  {}",
                    text(r, "fire_time"),
                    text(r, "run_id"),
                    if r["created"].as_bool().unwrap_or(false) {
                        "started"
                    } else {
                        "existed"
                    }
                );
            }
            errln!("{} fire time(s)", runs.len());
        }
        SchedulesCommand::Delete { server, id } => {
            let answer = server
                .call(
                    &client,
                    Method::DELETE,
                    &format!("/v1/schedules/{id}"),
                    None,
                    &[],
                )
                .await?;
            if !answer.status.is_success() {
                answer.checked()?;
            }
            errln!("deleted");
        }
    }
    Ok(())
}
