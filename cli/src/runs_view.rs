//! `glia runs list` and `glia runs get`: the filters of `GET /v1/runs` as
//! flags, pages followed by cursor, and what a person reads of a run (a
//! table of runs; one run's fields) or, with `--json`, what a script reads.
//!
//! Tenant text (goals, errors, tags, metadata) is printed with control
//! characters replaced, so a run cannot write terminal escape sequences.

use anyhow::{Context, Result, bail};
use chrono::{DateTime, NaiveDate, Utc};
use clap::{Args, Subcommand};
use comfy_table::{Cell, CellAlignment, Table, presets};
use glia_backends::{OutcomeKind, RunStatus, RunSummary};
use reqwest::Client;
use serde::Deserialize;
use std::io::Write;

use crate::client::{self, Server};

/// `glia runs`: `list` and `get` here, the rest in [`client::RunsCommand`].
#[derive(Subcommand)]
pub enum RunsCommand {
    /// List runs, newest first: a table (goal, agent@version, status,
    /// steps, tokens, cost, duration, start), or JSON Lines with --json.
    List {
        #[command(flatten)]
        server: Server,
        #[command(flatten)]
        args: ListArgs,
    },
    /// Show one run: status, agent@version, tags and metadata, error, steps,
    /// tokens by kind, cost in USD, times, trace id.
    Get {
        #[command(flatten)]
        server: Server,
        /// Run id.
        run_id: String,
        /// Print the API's run view (JSON) instead.
        #[arg(long)]
        json: bool,
    },
    #[command(flatten)]
    Other(client::RunsCommand),
}

/// Run a `glia runs` command.
pub async fn runs(cmd: RunsCommand) -> Result<()> {
    match cmd {
        RunsCommand::List { server, args } => list(&client::http_client()?, &server, &args).await,
        RunsCommand::Get {
            server,
            run_id,
            json,
        } => get(&client::http_client()?, &server, &run_id, json).await,
        RunsCommand::Other(cmd) => client::runs(cmd).await,
    }
}

/// Flags of `glia runs list`: the query of `GET /v1/runs` (every filter
/// given must match).
#[derive(Args, Debug, Clone, Default)]
pub struct ListArgs {
    /// Only runs with this status: runnable, parked or done.
    #[arg(long, value_parser = parse_status)]
    pub status: Option<RunStatus>,
    /// Only finished runs that ended so: succeeded, failed or cancelled.
    #[arg(long, value_parser = parse_outcome)]
    pub outcome: Option<OutcomeKind>,
    /// Only runs of this registered agent.
    #[arg(long)]
    pub agent: Option<String>,
    /// Only runs of this agent version (from 1).
    #[arg(long = "version", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub agent_version: Option<u32>,
    /// Only runs of this batch (its id).
    #[arg(long = "batch", value_name = "BATCH_ID")]
    pub batch_id: Option<uuid::Uuid>,
    /// Only the child runs of this run (issue 32, `docs/child-runs.md`).
    #[arg(long = "parent", value_name = "RUN_ID")]
    pub parent: Option<uuid::Uuid>,
    /// Only runs carrying this tag; repeat for several (all must match).
    #[arg(long = "tag", value_name = "TAG")]
    pub tags: Vec<String>,
    /// Only runs whose metadata has this pair; repeat for several.
    #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = parse_pair)]
    pub meta: Vec<String>,
    /// Only runs admitted at or after this time: RFC 3339
    /// (`2026-12-01T08:00:00Z`) or a UTC date (`2026-12-01`).
    #[arg(long, value_parser = parse_time)]
    pub since: Option<DateTime<Utc>>,
    /// Only runs admitted before this time (as `--since`).
    #[arg(long, value_parser = parse_time)]
    pub until: Option<DateTime<Utc>>,
    /// Only failed or cancelled runs whose error contains this text (any
    /// case).
    #[arg(long, value_name = "TEXT")]
    pub error: Option<String>,
    /// Runs per page (1 to 1,000).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub limit: u64,
    /// Start at this page: a `next_cursor` printed before.
    #[arg(long)]
    pub cursor: Option<String>,
    /// Follow the cursors to the last page (every matching run).
    #[arg(long)]
    pub all: bool,
    /// One JSON object per run per line (the API's run view), instead of
    /// a table.
    #[arg(long)]
    pub json: bool,
}

fn parse_status(s: &str) -> Result<RunStatus, String> {
    s.parse()
}

fn parse_outcome(s: &str) -> Result<OutcomeKind, String> {
    s.parse()
}

fn parse_pair(s: &str) -> Result<String, String> {
    match s.split_once('=') {
        Some((k, _)) if !k.is_empty() => Ok(s.to_owned()),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .map(|d| d.and_time(chrono::NaiveTime::MIN).and_utc())
        .map_err(|_| format!("{s:?} is neither an RFC 3339 time nor a YYYY-MM-DD date"))
}

impl ListArgs {
    /// The query string of `GET /v1/runs` for these flags (without cursor).
    pub fn query(&self) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("limit", &self.limit.to_string());
        if let Some(s) = self.status {
            q.append_pair("status", s.as_str());
        }
        if let Some(o) = self.outcome {
            q.append_pair("outcome", o.as_str());
        }
        if let Some(a) = &self.agent {
            q.append_pair("agent", a);
        }
        if let Some(v) = self.agent_version {
            q.append_pair("version", &v.to_string());
        }
        if let Some(p) = self.parent {
            q.append_pair("parent", &p.to_string());
        }
        if let Some(b) = self.batch_id {
            q.append_pair("batch_id", &b.to_string());
        }
        for t in &self.tags {
            q.append_pair("tag", t);
        }
        for m in &self.meta {
            q.append_pair("meta", m);
        }
        if let Some(t) = self.since {
            q.append_pair("since", &t.to_rfc3339());
        }
        if let Some(t) = self.until {
            q.append_pair("until", &t.to_rfc3339());
        }
        if let Some(e) = &self.error {
            q.append_pair("error", e);
        }
        q.finish()
    }
}

/// A page of `GET /v1/runs`.
#[derive(Deserialize)]
struct Page {
    runs: Vec<RunSummary>,
    next_cursor: Option<String>,
}

/// `glia runs list`: one page (from `--cursor`), or with `--all` every page.
/// The table (or JSON Lines) goes to stdout; the cursor of the next page,
/// when there is one and `--all` is not given, to stderr.
pub async fn list(client: &Client, server: &Server, args: &ListArgs) -> Result<()> {
    let base = args.query();
    let mut cursor = args.cursor.clone();
    let now = Utc::now();
    let mut table = runs_table();
    let mut stdout = std::io::stdout().lock();
    loop {
        let mut path = format!("/v1/runs?{base}");
        if let Some(c) = &cursor {
            path.push('&');
            path.push_str(
                &form_urlencoded::Serializer::new(String::new())
                    .append_pair("cursor", c)
                    .finish(),
            );
        }
        let body = server.get(client, &path).await?;
        let page: Page = serde_json::from_value(body).context("the dispatcher's page of runs")?;
        for run in &page.runs {
            if args.json {
                writeln!(stdout, "{}", serde_json::to_string(run)?)?;
            } else {
                table.add_row(row(run, now));
            }
        }
        match page.next_cursor {
            Some(next) if args.all => cursor = Some(next),
            Some(next) => {
                if !args.json {
                    writeln!(stdout, "{table}")?;
                }
                errln!("more runs: --cursor {next}");
                return Ok(());
            }
            None => break,
        }
    }
    if !args.json {
        if table.row_count() == 0 {
            errln!("no runs");
        } else {
            writeln!(stdout, "{table}")?;
        }
    }
    Ok(())
}

fn runs_table() -> Table {
    let mut table = Table::new();
    table.load_preset(presets::NOTHING).set_header(vec![
        "RUN", "STATUS", "AGENT", "STEPS", "TOKENS", "COST", "DURATION", "STARTED", "GOAL",
    ]);
    for column in [3, 4, 5, 6] {
        if let Some(c) = table.column_mut(column) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    table
}

fn row(run: &RunSummary, now: DateTime<Utc>) -> Vec<Cell> {
    vec![
        Cell::new(run.run_id),
        Cell::new(status_of(run)),
        Cell::new(agent_of(run)),
        Cell::new(run.steps),
        Cell::new(count(total_tokens(run))),
        Cell::new(usd(run.usage.cost_usd_micros)),
        Cell::new(duration(run, now)),
        Cell::new(run.created_at.format("%Y-%m-%d %H:%M:%S")),
        Cell::new(cut(&run.goal, 48)),
    ]
}

/// `succeeded`, `failed`, `cancelled`; `parked (awaiting_approval)`;
/// `runnable`.
fn status_of(run: &RunSummary) -> String {
    match (&run.outcome, run.status, &run.pull_point) {
        (Some(o), _, _) => OutcomeKind::of(o).as_str().to_owned(),
        (None, RunStatus::Parked, Some(p)) => format!("parked ({})", p.name()),
        (None, status, _) => status.as_str().to_owned(),
    }
}

fn agent_of(run: &RunSummary) -> String {
    match (&run.agent, run.agent_version) {
        (Some(name), Some(v)) => format!("{}@{v}", printable(name)),
        (Some(name), None) => printable(name),
        _ => "-".into(),
    }
}

fn total_tokens(run: &RunSummary) -> u64 {
    let t = &run.usage.tokens;
    t.input_tokens
        .saturating_add(t.output_tokens)
        .saturating_add(t.cache_write_tokens)
        .saturating_add(t.cache_read_tokens)
}

/// `950`, `12.3k`, `4.1M`.
fn count(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1}k", n as f64 / 1e3),
        _ => format!("{:.1}M", n as f64 / 1e6),
    }
}

/// USD micros as dollars: `$0.0123`, `$12.50`.
pub fn usd(micros: u64) -> String {
    let dollars = micros as f64 / 1e6;
    if micros != 0 && dollars < 1.0 {
        format!("${dollars:.4}")
    } else {
        format!("${dollars:.2}")
    }
}

/// From admission to the end (or to now, for a run not done): `45s`,
/// `3m07s`, `2h05m`.
fn duration(run: &RunSummary, now: DateTime<Utc>) -> String {
    let end = run.ended_at.unwrap_or(now);
    let secs = (end - run.created_at).num_seconds().max(0);
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
    }
}

/// `text` on one line without control characters, at most `max` characters
/// (`…` marks a cut).
fn cut(text: &str, max: usize) -> String {
    let line = printable(text);
    if line.chars().count() <= max {
        return line;
    }
    let mut out: String = line.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Tenant text with control characters (newlines, escapes) as spaces.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// `glia runs get`: the run's fields, one per line, or with `json` the
/// API's run view.
pub async fn get(client: &Client, server: &Server, run_id: &str, json: bool) -> Result<()> {
    if uuid::Uuid::parse_str(run_id).is_err() {
        bail!("{run_id:?} is not a run id (a UUID)");
    }
    let body = server.get(client, &format!("/v1/runs/{run_id}")).await?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&body)?);
        return Ok(());
    }
    let run: RunSummary = serde_json::from_value(body).context("the dispatcher's run")?;
    out!("{}", describe(&run, Utc::now()));
    // Issue 32: the run's children, one line each.
    let page = server
        .get(client, &format!("/v1/runs?parent={run_id}&limit=1000"))
        .await?;
    let children: Vec<RunSummary> = serde_json::from_value(page["runs"].clone())
        .context("the dispatcher's list of child runs")?;
    for child in children.iter().rev() {
        outln!("{}", child_line(child));
    }
    Ok(())
}

/// Issue 32: what `glia runs get` prints of one child run of the run.
pub fn child_line(child: &RunSummary) -> String {
    format!(
        "{:<11} {} {} ({}, call {})",
        "child",
        child.run_id,
        agent_of(child),
        status_of(child),
        printable(child.parent_call_id.as_deref().unwrap_or("?"))
    )
}

/// What `glia runs get` prints of `run`.
pub fn describe(run: &RunSummary, now: DateTime<Utc>) -> String {
    let t = &run.usage.tokens;
    let mut lines = vec![
        ("run", run.run_id.to_string()),
        ("tenant", printable(&run.tenant)),
        ("status", status_of(run)),
        (
            "phase",
            serde_json::to_value(run.phase)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
        ),
        ("agent", agent_of(run)),
        ("goal", cut(&run.goal, 200)),
    ];
    // Issue 32: a child run names its parent.
    if let Some(parent) = run.parent_run_id {
        lines.push((
            "parent",
            format!(
                "{parent} (call {}, depth {})",
                printable(run.parent_call_id.as_deref().unwrap_or("?")),
                run.depth
            ),
        ));
    }
    if let Some(b) = run.batch_id {
        let item = run
            .custom_id
            .as_deref()
            .map(|c| format!(" (item {})", printable(c)))
            .unwrap_or_default();
        lines.push(("batch", format!("{b}{item}")));
    }
    if !run.tags.is_empty() {
        lines.push(("tags", printable(&run.tags.join(", "))));
    }
    for (k, v) in &run.metadata {
        lines.push(("metadata", format!("{}={}", printable(k), printable(v))));
    }
    if let Some(e) = &run.error {
        lines.push(("error", cut(e, 500)));
    }
    lines.extend([
        ("steps", run.steps.to_string()),
        ("turns", run.usage.turns.to_string()),
        ("tool calls", run.usage.tool_calls.to_string()),
        (
            "tokens",
            format!(
                "{} input, {} output, {} cache write, {} cache read{}",
                t.input_tokens,
                t.output_tokens,
                t.cache_write_tokens,
                t.cache_read_tokens,
                if t.estimated { " (some estimated)" } else { "" }
            ),
        ),
        ("cost", usd(run.usage.cost_usd_micros)),
        (
            "active",
            format!("{:.1}s", run.usage.active_ms as f64 / 1000.0),
        ),
        ("duration", duration(run, now)),
        ("created", run.created_at.to_rfc3339()),
        ("updated", run.updated_at.to_rfc3339()),
    ]);
    if let Some(end) = run.ended_at {
        lines.push(("ended", end.to_rfc3339()));
    }
    lines.push(("events", run.head_seq.to_string()));
    lines.push(("trace id", run.trace_id.clone()));
    lines
        .into_iter()
        .map(|(k, v)| format!("{k:<11} {v}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_counts_and_cuts_read_well() {
        assert_eq!(usd(0), "$0.00");
        assert_eq!(usd(12_300), "$0.0123");
        assert_eq!(usd(12_500_000), "$12.50");
        assert_eq!(count(950), "950");
        assert_eq!(count(12_345), "12.3k");
        assert_eq!(count(4_100_000), "4.1M");
        assert_eq!(cut("a\u{1b}[31mb\nc", 80), "a [31mb c");
        assert_eq!(cut("abcdef", 4), "abc…");
    }

    #[test]
    fn flags_become_the_listing_query() {
        let args = ListArgs {
            status: Some(RunStatus::Done),
            outcome: Some(OutcomeKind::Failed),
            tags: vec!["a b".into(), "c".into()],
            meta: vec!["k=v=w".into()],
            since: parse_time("2026-12-01").ok(),
            limit: 10,
            ..ListArgs::default()
        };
        assert_eq!(
            args.query(),
            "limit=10&status=done&outcome=failed&tag=a+b&tag=c&meta=k%3Dv%3Dw&since=2026-12-01T00%3A00%3A00%2B00%3A00"
        );
        assert!(parse_pair("novalue").is_err());
        assert!(parse_time("yesterday").is_err());
    }
}
