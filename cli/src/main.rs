//! `glia`: the command line. Parsing, wiring the library crates into
//! processes, and printing; besides, three programs of its own: the HTTP
//! client with outage retries (`client.rs`), the tau-bench replay driver
//! (`tau_driver.rs`) and the benchmarks (`bench.rs`).

/// `println!` that ends the process quietly (status 0) on a closed pipe
/// ([`out::line`]).
macro_rules! outln {
    () => { $crate::out::line(format_args!("")) };
    ($($arg:tt)*) => { $crate::out::line(format_args!($($arg)*)) };
}

/// `print!` that ends the process quietly (status 0) on a closed pipe
/// ([`out::text`]).
macro_rules! out {
    ($($arg:tt)*) => { $crate::out::text(format_args!($($arg)*)) };
}

/// `eprintln!` that never panics ([`out::err_line`]).
macro_rules! errln {
    () => { $crate::out::err_line(format_args!("")) };
    ($($arg:tt)*) => { $crate::out::err_line(format_args!($($arg)*)) };
}

mod out;

mod agents;
mod archive;
mod batches;
mod bench;
mod client;
mod config_file;
mod demo;
mod evals;
mod events;
mod observe;
mod ports;
mod provider;
mod runs_view;
mod schedules;
mod serve;
mod tau_driver;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use glia_agent::agent::{EventSink, SinkError};
use glia_agent::provider::{Provider, ScriptedProvider};
use glia_agent::{Agent, async_trait};
use glia_proto::{Decision, Event, Payload, PullPoint, RunConfig, RunState, Status};

#[derive(Parser)]
#[command(name = "glia", version, about = "Durable, resumable LLM agent runs")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format on stderr: `text` or `json` (one object per line, with the run id and seq).
    #[arg(
        long,
        global = true,
        value_enum,
        env = "GLIA_LOG_FORMAT",
        default_value = "text"
    )]
    log_format: observe::LogFormat,
}

#[derive(Subcommand)]
enum Command {
    /// Run one run in this process, on a script or a real provider, and
    /// print its events as they happen.
    Run(RunArgs),
    /// Serve the HTTP API, relay the outbox and reconcile lost runs.
    Dispatcher {
        #[command(flatten)]
        urls: ports::Urls,
        #[command(flatten)]
        args: serve::DispatcherArgs,
        #[command(flatten)]
        catalogue: serve::CatalogueArgs,
    },
    /// Take run jobs from the queue and advance runs.
    Worker {
        #[command(flatten)]
        urls: ports::Urls,
        #[command(flatten)]
        args: serve::WorkerArgs,
    },
    /// Dispatcher and workers in one process, on in-memory ports (or on a
    /// SQLite file with --data, or the services with --services).
    Dev {
        #[command(flatten)]
        urls: ports::Urls,
        /// Use the real services at the URLs instead of in-memory ports.
        #[arg(long, conflicts_with = "data")]
        services: bool,
        /// Keep everything in this SQLite file (created if missing): durable,
        /// like `glia serve`.
        #[arg(long, value_name = "FILE")]
        data: Option<PathBuf>,
        #[command(flatten)]
        node: serve::NodeArgs,
    },
    /// The single node: dispatcher and workers in one process on one SQLite
    /// file. Durable: killed at any moment and started again, every run
    /// continues from where its log ends.
    Serve {
        /// The data file (created if missing; one process at a time).
        #[arg(long, value_name = "FILE", env = "GLIA_DATA")]
        data: PathBuf,
        #[command(flatten)]
        node: serve::NodeArgs,
    },
    /// Write runs to a file (JSON Lines, format glia-runs version 1), from a
    /// single node's file (--data) or a fleet's Postgres (--database-url).
    Export(archive::ExportArgs),
    /// Read runs written by `glia export` into a single node's file (--data)
    /// or a fleet's Postgres (--database-url); the runs continue there.
    Import(archive::ImportArgs),
    /// Create a run on a dispatcher and stream its events.
    Submit(client::SubmitArgs),
    /// List and inspect runs on a dispatcher.
    #[command(subcommand)]
    Runs(runs_view::RunsCommand),
    /// List and decide pending approvals on a dispatcher.
    #[command(subcommand)]
    Approvals(client::ApprovalsCommand),
    /// Manage the tenant's webhook subscriptions and read their delivery log.
    #[command(subcommand)]
    Webhooks(client::WebhooksCommand),
    /// Post an event to the runs of the tenant waiting on its key
    /// (`wait_for_event`).
    #[command(subcommand)]
    Events(events::EventsCommand),
    /// Runs started on a cron expression or an interval: create, list, get
    /// (next fire times), pause, unpause, backfill, delete.
    #[command(subcommand)]
    Schedules(schedules::SchedulesCommand),
    /// Replay a recording's conversations through a fleet (embedded, or a
    /// dispatcher at --server), as their customers and approvers; print a
    /// summary. Fails when a run diverged from its recording or failed.
    /// With a subcommand: batches on a dispatcher (submit, status, results,
    /// cancel, pause, resume, list).
    Batch(batches::BatchCli),
    /// Evals: run an eval file as an experiment (agent versions over a
    /// dataset, graded) and gate on it; show, list and compare experiments;
    /// datasets.
    #[command(subcommand)]
    Eval(evals::EvalCommand),
    /// Measure the fleet on the real services (see BENCHMARKS.md); prints
    /// JSON.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Register and inspect agent definitions on a dispatcher.
    #[command(subcommand)]
    Agents(agents::AgentsCommand),
    /// Write the JSON Schemas of the configuration files (run config, agent
    /// definition) to a directory, for editors.
    Schemas(agents::SchemasArgs),
    /// Serve a recording's tools as an MCP server on stdin/stdout (a
    /// catalogue's stdio server): each call answers its recorded output.
    /// For `glia batch --mcp-server` and `glia worker --replay --catalogue`.
    ReplayTools {
        /// The recording: tau-bench trajectories (`gpt-4o-airline.json`).
        file: PathBuf,
        /// The tool list, when not `tools.json` beside FILE.
        #[arg(long)]
        tools: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("model_source").required(true).args(["script", "provider"])))]
struct RunArgs {
    /// Script of model responses (JSON array; see ScriptedTurn). Exactly one
    /// of --script and --provider.
    #[arg(long)]
    script: Option<PathBuf>,
    #[command(flatten)]
    provider: provider::ProviderArgs,
    /// Run configuration (a RunConfig, `.toml` or JSON, parsed strictly);
    /// default: no policies, no budget.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Offer the demo tools (calculator, get_order, refund_order) to the run.
    #[arg(long)]
    demo: bool,
    /// Model name, instead of the config's.
    #[arg(long)]
    model: Option<String>,
    /// Print events as JSON lines instead of text.
    #[arg(long)]
    json: bool,
    /// Approve every approval request (default: stop at the first one).
    #[arg(long, conflicts_with = "reject")]
    approve: bool,
    /// Reject every approval request with this reason.
    #[arg(long, value_name = "REASON")]
    reject: Option<String>,
    /// User messages for a conversational run, posted in order at each
    /// awaiting_input; when they run out the run is closed.
    #[arg(long = "reply", value_name = "TEXT")]
    replies: Vec<String>,
    /// Results for external tool calls, posted in order at each awaiting_tool.
    #[arg(long = "tool-result", value_name = "TEXT")]
    tool_results: Vec<String>,
    /// Write the run's state (its checkpoint) here when it stops parked.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// The goal.
    goal: String,
}

/// The process's allocator: mimalloc. A step allocates and frees many small
/// buffers (events, JSON, protocol messages) across the runtime's threads;
/// glibc's malloc spent about a third of the workers' CPU on them in
/// `glia bench steps` (BENCHMARKS.md 1e).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Run the command; an error is printed as one line with its causes
/// (`glia: what failed: why`) and exits with status 1, except a closed
/// stdout (`| head`), which ends quietly with status 0 ([`out`]).
fn main() {
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(command(Cli::parse())));
    if let Err(e) = result {
        if out::broken_pipe(&e) {
            std::process::exit(0);
        }
        errln!("glia: {e:#}");
        std::process::exit(1);
    }
}

async fn command(cli: Cli) -> Result<()> {
    // A batch draws a progress bar on stderr: only warnings go there too.
    // A benchmark prints JSON; the pools it tears down would only warn.
    let default_level = match cli.command {
        // (The embedded dispatcher's "no tokens, loopback only" is expected.)
        Command::Batch(_) | Command::Eval(_) => "warn,glia_dispatcher=error",
        Command::Bench(_) => "error",
        // Its stdout is the MCP stream; logs go to stderr, which the worker logs.
        Command::ReplayTools { .. } => "warn",
        _ => "info",
    };
    let _telemetry = observe::init_logging(cli.log_format, default_level);
    match cli.command {
        Command::Run(args) => run(args).await,
        Command::Dispatcher {
            urls,
            args,
            catalogue,
        } => serve::dispatcher(urls, args, catalogue).await,
        Command::Worker { urls, args } => serve::worker(urls, args).await,
        Command::Dev {
            urls,
            services,
            data,
            node,
        } => {
            let store = match (data, services) {
                (Some(path), _) => serve::Store::Sqlite(path),
                (None, true) => serve::Store::Services(urls),
                (None, false) => serve::Store::Memory,
            };
            serve::dev(store, node).await
        }
        Command::Serve { data, node } => serve::dev(serve::Store::Sqlite(data), node).await,
        Command::Export(args) => archive::export(args).await,
        Command::Import(args) => archive::import(args).await,
        Command::Submit(args) => client::submit(args).await,
        Command::Runs(cmd) => runs_view::runs(cmd).await,
        Command::Approvals(cmd) => client::approvals(cmd).await,
        Command::Webhooks(cmd) => client::webhooks(cmd).await,
        Command::Schedules(cmd) => schedules::schedules(cmd).await,
        Command::Events(cmd) => events::events(cmd).await,
        Command::Batch(cli) => batches::batch(cli).await,
        Command::Bench(cmd) => bench::bench(cmd).await,
        Command::Eval(cmd) => evals::eval(cmd).await,
        Command::Agents(cmd) => agents::agents(cmd).await,
        Command::Schemas(args) => agents::schemas(args),
        Command::ReplayTools { file, tools } => {
            let tools = tools.unwrap_or_else(|| file.with_file_name(glia_replay::tau::TOOLS));
            let recording = glia_replay::tau::load(&file, &tools)?;
            glia_replay::mcp::serve_stdio(&recording)
                .await
                .map_err(|e| anyhow::anyhow!("serving the recorded tools over MCP: {e}"))
        }
    }
}

/// Prints each event when the loop records it.
struct Printer {
    json: bool,
}

#[async_trait]
impl EventSink for Printer {
    async fn record(&mut self, event: &Event) -> Result<(), SinkError> {
        if self.json {
            outln!(
                "{}",
                serde_json::to_string(event).map_err(|e| SinkError(e.to_string()))?
            );
        } else {
            outln!("{}", client::event_line(event));
        }
        Ok(())
    }
}

async fn run(args: RunArgs) -> Result<()> {
    let mut config: RunConfig = match &args.config {
        Some(path) => config_file::read_strict(path, "run config")?,
        None => RunConfig::default(),
    };
    if let Some(model) = &args.model {
        config.model.clone_from(model);
    }
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid run config: {e}"))?;
    args.provider.check(false)?;
    let provider: Arc<dyn Provider> = match (&args.script, args.provider.provider) {
        (Some(path), _) => {
            let script = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            Arc::new(
                ScriptedProvider::from_json(&script)
                    .with_context(|| format!("parsing script {}", path.display()))?,
            )
        }
        (None, Some(kind)) => {
            if config.model == RunConfig::default().model {
                bail!(
                    "name the {} model to call: --model NAME, or \"model\" in --config",
                    kind.name()
                );
            }
            let provider = glia_providers::from_config(&args.provider.config(kind))?;
            if let Some(path) = &args.provider.prices {
                let table = glia_providers::PriceTable::from_file(path)?;
                let pricing = table.pricing(kind.name(), &config.model);
                config.pricing = Some(pricing.with_context(|| {
                    format!(
                        "{} has no price for {}/{}",
                        path.display(),
                        kind.name(),
                        config.model
                    )
                })?);
            }
            provider
        }
        (None, None) => unreachable!("clap requires --script or --provider"),
    };
    let agent = if args.demo {
        Agent::new(provider).with_tools(demo::tools())
    } else {
        Agent::new(provider)
    };
    let mut sink = Printer { json: args.json };
    let (mut state, mut status) = agent
        .run(uuid::Uuid::now_v7(), &args.goal, config, &mut sink)
        .await?;
    let mut replies = args.replies.into_iter();
    let mut tool_results = args.tool_results.into_iter();
    while let Status::Parked(pull_point) = &status {
        let input = match pull_point {
            PullPoint::AwaitingApproval { call_ids } if args.approve || args.reject.is_some() => {
                let call = state
                    .call(&call_ids[0])
                    .context("approval for an unknown call")?;
                let decision = match &args.reject {
                    Some(reason) => Decision::Reject {
                        reason: reason.clone(),
                    },
                    None => Decision::Approve,
                };
                Payload::Approval {
                    call_id: call.call_id.clone(),
                    args_hash: call.args_hash.clone(),
                    decision,
                    by: Some("cli".into()),
                    request_seq: None,
                }
            }
            PullPoint::AwaitingTool { call_ids } => match tool_results.next() {
                Some(content) => Payload::ToolResult {
                    call_id: call_ids[0].clone(),
                    content,
                    is_error: false,
                },
                None => break,
            },
            PullPoint::AwaitingInput => match replies.next() {
                Some(text) => Payload::Input {
                    text,
                    redactions: Vec::new(),
                },
                None => {
                    status = agent.close(&mut state, &mut sink).await?;
                    break;
                }
            },
            _ => break,
        };
        status = agent.advance(&mut state, Some(input), &mut sink).await?;
    }
    finish(&state, &status, args.checkpoint.as_deref(), args.json)
}

fn finish(
    state: &RunState,
    status: &Status,
    checkpoint: Option<&std::path::Path>,
    json: bool,
) -> Result<()> {
    if let Status::Parked(pull_point) = status {
        if let Some(path) = checkpoint {
            std::fs::write(path, serde_json::to_vec_pretty(state)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        if !json {
            errln!(
                "parked at {} (run {}){}",
                pull_point.name(),
                state.run_id,
                checkpoint.map_or(String::new(), |p| format!(
                    "; checkpoint in {}",
                    p.display()
                ))
            );
        }
        return Ok(());
    }
    match &state.outcome {
        Some(glia_proto::Outcome::Failed { error }) => bail!("run failed: {error}"),
        _ => Ok(()),
    }
}
