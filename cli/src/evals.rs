//! `glia eval`: run an eval file as an experiment and gate on it; show,
//! list and compare experiments; upload datasets, or build one from a
//! tau-bench recording (`docs/evals.md`).
//!
//! `glia eval run FILE` uploads the eval's `dataset_file` (if it names
//! one) as a dataset, starts the experiment (`POST /v1/experiments`),
//! follows it to its end, prints each version's pass rate (95% interval),
//! cost and latency and the cases whose verdict changed, writes JUnit XML
//! and Markdown when asked, and fails (exit 1) when the gate fails:
//! `--min-pass-rate` not met, or a case that passes under `--baseline`
//! fails under another version. Without `--server` it runs on an embedded
//! single node (SQLite in a temporary directory, or `--data FILE`, where
//! a second invocation finds the experiment of the first and continues
//! it), with scripted models (`--scripts`), the demo tools (`--demo`) or a
//! tau-bench recording (`--replay`), and the agent definitions of
//! `--agents` registered first.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use glia_agent::agent::Agent;
use glia_agent::provider::ScriptLibrary;
use glia_evals::dataset;
use glia_evals::stats::{Cell, Summary};
use glia_proto::{AgentDefinition, Event};
use reqwest::{Client, Method};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::client::{DEFAULT_MAX_OUTAGE_SECS, Server, http_client};
use crate::config_file::read_strict;

/// `glia eval …`.
#[derive(Subcommand)]
pub enum EvalCommand {
    /// Run an eval file (TOML or JSON) as an experiment, follow it to its
    /// end, print the results and apply the gate (exit 1 when it fails).
    Run(RunArgs),
    /// An experiment's results.
    Show {
        #[command(flatten)]
        server: Server,
        /// The experiment's id.
        id: uuid::Uuid,
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// The tenant's experiments, newest first.
    List {
        #[command(flatten)]
        server: Server,
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Case by case, the verdicts that changed from experiment A to B (the
    /// first version of each, or --version-a/--version-b); exit 1 when a
    /// case passing in A fails in B.
    Compare {
        #[command(flatten)]
        server: Server,
        /// The base experiment.
        a: uuid::Uuid,
        /// The experiment compared with it.
        b: uuid::Uuid,
        /// The version of A compared (default its first).
        #[arg(long)]
        version_a: Option<String>,
        /// The version of B compared (default its first).
        #[arg(long)]
        version_b: Option<String>,
    },
    /// Datasets: upload a JSON Lines file, list them, or build one from a
    /// tau-bench recording.
    #[command(subcommand)]
    Dataset(DatasetCommand),
}

/// `glia eval dataset …`.
#[derive(Subcommand)]
pub enum DatasetCommand {
    /// Store FILE (JSON Lines, one case a line) as the next version of
    /// dataset NAME (unchanged when it is the latest version's content).
    Push {
        #[command(flatten)]
        server: Server,
        /// The dataset's name.
        name: String,
        /// The cases.
        file: PathBuf,
    },
    /// Every version of the tenant's datasets.
    List {
        #[command(flatten)]
        server: Server,
    },
    /// Make a replay dataset from recorded runs that succeeded: a case per
    /// run (its goal, the messages it received, its answer and tool calls
    /// expected), its tools answered from the run's recorded results, so
    /// a version compared on it touches nothing the runs reached. Writes
    /// JSON Lines to `--out`, and stores them as dataset `--push NAME`.
    /// Runs that did not succeed are skipped, each named.
    FromRuns {
        #[command(flatten)]
        server: Server,
        /// A run (repeat for several).
        #[arg(long = "run", value_name = "RUN_ID")]
        runs: Vec<String>,
        /// The runs of this batch.
        #[arg(long)]
        batch: Option<String>,
        /// The runs of this registered agent, `name` or `name@VERSION`.
        #[arg(long)]
        agent: Option<String>,
        /// Only runs with this tag (repeat: all must match).
        #[arg(long = "tag")]
        tags: Vec<String>,
        /// At most this many runs from a listing, newest first.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        /// Where to write the cases.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Store the cases as the next version of this dataset.
        #[arg(long, value_name = "NAME")]
        push: Option<String>,
    },
    /// Write a replay eval of a tau-bench recording into DIR:
    /// `tau-airline.jsonl`, a case per conversation (its customer turns and
    /// farewell scripted, the recorded tool calls expected in
    /// `expected.tools`, its model `replay:{id}` and system prompt as the
    /// config patch), and `tau-airline.json`, the eval: one inline version
    /// with the recording's run config, approvals approved, a trajectory
    /// grader. Run it with `glia eval run DIR/tau-airline.json --replay
    /// FILE` (or on workers started with `--replay`).
    Tau {
        /// The recording's trajectories (`gpt-4o-airline.json`).
        file: PathBuf,
        /// The tool list, when not `tools.json` beside FILE.
        #[arg(long)]
        tools: Option<PathBuf>,
        /// Where to write the dataset and the eval.
        #[arg(long, value_name = "DIR")]
        out_dir: PathBuf,
    },
}

/// `glia eval run`.
#[derive(Args)]
pub struct RunArgs {
    /// The eval file (`.toml`, or JSON).
    pub file: PathBuf,
    /// A dispatcher to run it on; without it, an embedded single node.
    #[arg(long, env = "GLIA_SERVER")]
    pub server: Option<String>,
    /// Bearer token (with --server).
    #[arg(long, env = "GLIA_TOKEN", requires = "server")]
    pub token: Option<String>,
    /// Keep retrying a dispatcher that does not answer for this many seconds.
    #[arg(long, default_value_t = DEFAULT_MAX_OUTAGE_SECS)]
    pub max_outage_secs: u64,
    /// Embedded: keep the runs in this SQLite file. Killed and run again
    /// with the same file and eval, it continues the same experiment.
    #[arg(long, value_name = "FILE", conflicts_with = "server")]
    pub data: Option<PathBuf>,
    /// Embedded: scripts served to models named `script:NAME`.
    #[arg(long, default_value = "examples/scripts", conflicts_with = "server")]
    pub scripts: PathBuf,
    /// Embedded: offer the demo tools (get_order, refund_order, calculator).
    #[arg(long, conflicts_with = "server")]
    pub demo: bool,
    /// Embedded: replay a tau-bench recording (models `replay:{id}`, its
    /// recorded tools) instead of scripts.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["server", "demo"])]
    pub replay: Option<PathBuf>,
    /// Embedded: workers (each advancing 16 runs at once).
    #[arg(long, default_value_t = 2, conflicts_with = "server")]
    pub workers: usize,
    /// Agent definitions (a file or a directory of `.toml`/`.json`) to
    /// register first, in file-name order: two files defining one agent
    /// become its versions 1 and 2. A definition already registered (by
    /// content) is left as it is.
    #[arg(long, value_name = "PATH")]
    pub agents: Option<PathBuf>,
    /// Fail when a version's pass rate (other than the baseline's) is below
    /// this, 0 to 1.
    #[arg(long, value_name = "RATE")]
    pub min_pass_rate: Option<f64>,
    /// Fail when a case that passes under this version fails under another.
    #[arg(long, value_name = "VERSION")]
    pub baseline: Option<String>,
    /// Write the results as JUnit XML here.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Write a Markdown summary here.
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
    /// Print the experiment's JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Start the experiment, print its id and return.
    #[arg(long)]
    pub detach: bool,
}

/// Run a `glia eval` command.
pub async fn eval(cmd: EvalCommand) -> Result<()> {
    let client = http_client()?;
    match cmd {
        EvalCommand::Run(args) => run(&client, args).await,
        EvalCommand::Show { server, id, json } => {
            let exp = server
                .get(&client, &format!("/v1/experiments/{id}"))
                .await?;
            if json {
                return crate::client::print_json(&exp);
            }
            print_results(&exp)?;
            Ok(())
        }
        EvalCommand::List { server, json } => {
            let page = server.get(&client, "/v1/experiments?limit=100").await?;
            if json {
                return crate::client::print_json(&page);
            }
            outln!(
                "{:<36}  {:<24} {:<10} {:>9}  DATASET / VERSIONS",
                "ID",
                "NAME",
                "STATE",
                "GRADED"
            );
            for e in page["experiments"].as_array().into_iter().flatten() {
                let versions: Vec<&str> = e["versions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v["label"].as_str())
                    .collect();
                outln!(
                    "{:<36}  {:<24} {:<10} {:>9}  {} / {}",
                    text(&e["id"]),
                    text(&e["name"]),
                    text(&e["state"]),
                    format!("{}/{}", e["progress"]["graded"], e["progress"]["cells"]),
                    text(&e["dataset"]),
                    versions.join(", ")
                );
            }
            Ok(())
        }
        EvalCommand::Compare {
            server,
            a,
            b,
            version_a,
            version_b,
        } => {
            let ea = server.get(&client, &format!("/v1/experiments/{a}")).await?;
            let eb = server.get(&client, &format!("/v1/experiments/{b}")).await?;
            compare(&ea, &eb, version_a.as_deref(), version_b.as_deref())
        }
        EvalCommand::Dataset(DatasetCommand::Push { server, name, file }) => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let v = push_dataset(&client, &server, &name, &text, &file).await?;
            outln!(
                "dataset {name}@{} ({} cases, {})",
                v["version"],
                v["cases"],
                text_of(&v["content_hash"])
            );
            Ok(())
        }
        EvalCommand::Dataset(DatasetCommand::List { server }) => {
            let list = server.get(&client, "/v1/datasets").await?;
            outln!("{:<32} {:>7} {:>7}  CREATED", "NAME", "VERSION", "CASES");
            for d in list["datasets"].as_array().into_iter().flatten() {
                outln!(
                    "{:<32} {:>7} {:>7}  {}",
                    text(&d["name"]),
                    d["version"],
                    d["cases"],
                    text(&d["created_at"])
                );
            }
            Ok(())
        }
        EvalCommand::Dataset(DatasetCommand::FromRuns {
            server,
            runs,
            batch,
            agent,
            tags,
            limit,
            out,
            push,
        }) => {
            if out.is_none() && push.is_none() {
                bail!("give --out FILE, --push NAME, or both");
            }
            let listed = batch.is_some() || agent.is_some() || !tags.is_empty();
            if runs.is_empty() && !listed {
                bail!("name the runs: --run ID, --batch ID, --agent NAME or --tag TAG");
            }
            let mut ids = runs;
            if listed {
                ids.extend(succeeded_runs(&client, &server, batch, agent, &tags, limit).await?);
            }
            let mut cases = Vec::new();
            for id in &ids {
                let events = run_events(&client, &server, id).await?;
                match glia_evals::case_from_run(id, &events) {
                    Ok(case) => {
                        // One case is one line, at most a line's bytes.
                        let bytes = glia_evals::to_jsonl(std::slice::from_ref(&case)).len();
                        if bytes > dataset::MAX_LINE_BYTES {
                            errln!(
                                "skipped run {id}: its case takes {bytes} bytes, more than a dataset line's {}",
                                dataset::MAX_LINE_BYTES
                            );
                        } else {
                            cases.push(case);
                        }
                    }
                    Err(why) => errln!("skipped run {id}: {why}"),
                }
            }
            if cases.is_empty() {
                bail!("none of the {} run(s) makes a case", ids.len());
            }
            let text = glia_evals::to_jsonl(&cases);
            // What is written reads back as a dataset (a line over 1 MiB
            // is named here, before anything is written).
            dataset::parse_jsonl(&text).map_err(|e| anyhow::anyhow!("the cases: {e}"))?;
            if let Some(path) = &out {
                std::fs::write(path, &text)
                    .with_context(|| format!("writing {}", path.display()))?;
                outln!("{} ({} cases)", path.display(), cases.len());
            }
            if let Some(name) = &push {
                let from = out.clone().unwrap_or_else(|| PathBuf::from("(from runs)"));
                let v = push_dataset(&client, &server, name, &text, &from).await?;
                outln!("dataset {name}@{} ({} cases)", v["version"], v["cases"]);
            }
            Ok(())
        }
        EvalCommand::Dataset(DatasetCommand::Tau {
            file,
            tools,
            out_dir,
        }) => {
            let tools = tools.unwrap_or_else(|| file.with_file_name(glia_replay::tau::TOOLS));
            let recording = glia_replay::tau::load(&file, &tools)?;
            std::fs::create_dir_all(&out_dir)
                .with_context(|| format!("creating {}", out_dir.display()))?;
            let cases = out_dir.join("tau-airline.jsonl");
            std::fs::write(&cases, tau_dataset(&recording)?)
                .with_context(|| format!("writing {}", cases.display()))?;
            let eval = out_dir.join("tau-airline.json");
            let text = serde_json::to_string_pretty(&tau_eval(&recording)?)?;
            std::fs::write(&eval, text + "\n")
                .with_context(|| format!("writing {}", eval.display()))?;
            outln!(
                "{} ({} cases), {}",
                cases.display(),
                recording.conversations().len(),
                eval.display()
            );
            Ok(())
        }
    }
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

fn text_of(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

/// The ids of the runs that succeeded and match the filters, newest first,
/// at most `limit`.
async fn succeeded_runs(
    client: &Client,
    server: &Server,
    batch: Option<String>,
    agent: Option<String>,
    tags: &[String],
    limit: usize,
) -> Result<Vec<String>> {
    let mut query = vec![("outcome".to_owned(), "succeeded".to_owned())];
    if let Some(batch) = batch {
        query.push(("batch_id".into(), batch));
    }
    if let Some(agent) = agent {
        match agent.split_once('@') {
            Some((name, version)) => {
                query.push(("agent".into(), name.into()));
                query.push(("version".into(), version.into()));
            }
            None => query.push(("agent".into(), agent)),
        }
    }
    query.extend(tags.iter().map(|t| ("tag".to_owned(), t.clone())));
    let mut ids = Vec::new();
    let mut cursor = String::new();
    while ids.len() < limit {
        let mut page_query = query.clone();
        page_query.push(("limit".into(), (limit - ids.len()).min(1000).to_string()));
        page_query.push(("cursor".into(), cursor.clone()));
        let qs = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&page_query)
            .finish();
        let page = server.get(client, &format!("/v1/runs?{qs}")).await?;
        for run in page["runs"].as_array().into_iter().flatten() {
            ids.push(text(&run["run_id"]).to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(next) if !next.is_empty() => cursor = next.to_owned(),
            _ => break,
        }
    }
    ids.truncate(limit);
    Ok(ids)
}

/// Every event of run `id`, in order.
async fn run_events(client: &Client, server: &Server, id: &str) -> Result<Vec<Event>> {
    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let page = server
            .get(
                client,
                &format!("/v1/runs/{id}/events?after={after}&limit=1000"),
            )
            .await
            .with_context(|| format!("reading run {id}"))?;
        let got = page["events"].as_array().cloned().unwrap_or_default();
        for e in &got {
            let event: Event = serde_json::from_value(e.clone())
                .with_context(|| format!("run {id}: an event glia cannot read: {e}"))?;
            events.push(event);
        }
        let next = page["next_after"].as_u64().unwrap_or(after);
        if got.is_empty() || next <= after {
            return Ok(events);
        }
        after = next;
    }
}

/// PUT `text` as the next version of dataset `name`; answers the version.
async fn push_dataset(
    client: &Client,
    server: &Server,
    name: &str,
    text: &str,
    file: &Path,
) -> Result<Value> {
    // Checked here first, so a bad file fails naming the file and line
    // before anything is sent.
    dataset::parse_jsonl(text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    server
        .retrying(std::time::Instant::now(), || async {
            let resp = server
                .request(client, Method::PUT, &format!("/v1/datasets/{name}"))
                .header(reqwest::header::CONTENT_TYPE, "application/jsonl")
                .body(text.to_owned())
                .send()
                .await
                .map_err(crate::client::Attempt::from_reqwest)?;
            Ok(resp)
        })
        .await
        .map(crate::client::checked)?
        .await
        .with_context(|| format!("uploading {}", file.display()))
}

/// The eval file as JSON (TOML or JSON by its extension), checked strictly
/// here first: an error names the file and the field.
fn read_eval(path: &Path) -> Result<Value> {
    let value: Value = read_strict(path, "eval")?;
    glia_evals::spec::EvalSpec::from_value(value.clone())
        .map_err(|e| anyhow::anyhow!("{}: invalid eval: {e}", path.display()))?;
    Ok(value)
}

/// Register the definitions under `path` in file-name order, each unless a
/// version of its agent already has its content.
async fn apply_agents(client: &Client, server: &Server, path: &Path) -> Result<()> {
    let mut files: Vec<PathBuf> = if path.is_dir() {
        std::fs::read_dir(path)
            .with_context(|| format!("reading {}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension().is_some_and(|x| {
                    x.eq_ignore_ascii_case("toml") || x.eq_ignore_ascii_case("json")
                })
            })
            .collect()
    } else {
        vec![path.to_owned()]
    };
    files.sort();
    if files.is_empty() {
        bail!("{}: no .toml or .json definitions", path.display());
    }
    for file in files {
        let def: AgentDefinition = read_strict(&file, "agent definition")?;
        def.validate()
            .map_err(|e| anyhow::anyhow!("{}: invalid agent definition: {e}", file.display()))?;
        let hash = def.content_hash();
        let latest = server
            .call(
                client,
                Method::GET,
                &format!("/v1/agents/{}", def.name),
                None,
                &[],
            )
            .await?;
        let mut known = false;
        if latest.status.is_success() {
            let newest = latest.body["version"].as_u64().unwrap_or(0);
            for v in 1..=newest {
                let version = server
                    .get(client, &format!("/v1/agents/{}/versions/{v}", def.name))
                    .await?;
                if version["content_hash"].as_str() == Some(hash.as_str()) {
                    known = true;
                    break;
                }
            }
        }
        if known {
            continue;
        }
        let v = server
            .call(
                client,
                Method::PUT,
                &format!("/v1/agents/{}", def.name),
                Some(&serde_json::to_value(&def)?),
                &[],
            )
            .await?
            .checked()
            .with_context(|| format!("applying {}", file.display()))?;
        errln!("{}: agent {}@{}", file.display(), def.name, v["version"]);
    }
    Ok(())
}

/// The embedded node's agent: a recording's replay, or the scripts (with
/// the demo tools when asked).
fn embedded_agent(args: &RunArgs) -> Result<Arc<Agent>> {
    if let Some(file) = &args.replay {
        let recording =
            glia_replay::tau::load(file, &file.with_file_name(glia_replay::tau::TOOLS))?;
        return Ok(Arc::new(crate::serve::replay_agent(&recording)?));
    }
    let scripts = ScriptLibrary::from_dir(&args.scripts).map_err(anyhow::Error::msg)?;
    let agent = Agent::new(Arc::new(scripts));
    Ok(Arc::new(if args.demo {
        agent.with_tools(crate::demo::tools())
    } else {
        agent
    }))
}

async fn run(client: &Client, args: RunArgs) -> Result<()> {
    if let Some(rate) = args.min_pass_rate
        && !(0.0..=1.0).contains(&rate)
    {
        bail!("--min-pass-rate must be 0 to 1, not {rate}");
    }
    let mut eval = read_eval(&args.file)?;
    // A bad dataset file fails here, naming its line, before anything starts.
    let dataset_file = match eval.get("dataset_file").and_then(Value::as_str) {
        Some(file) => {
            let path = args.file.parent().unwrap_or(Path::new(".")).join(file);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading the eval's dataset_file {}", path.display()))?;
            dataset::parse_jsonl(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            Some((path, text))
        }
        None => None,
    };
    let (server, _node) = match &args.server {
        Some(url) => (
            Server {
                server: url.clone(),
                token: args.token.clone(),
                max_outage_secs: args.max_outage_secs,
            },
            None,
        ),
        None => {
            let node = crate::serve::Embedded::start_agent(
                embedded_agent(&args)?,
                args.workers,
                16,
                args.data.as_deref(),
            )
            .await?;
            (
                Server {
                    server: node.url.clone(),
                    token: None,
                    max_outage_secs: args.max_outage_secs,
                },
                Some(node),
            )
        }
    };
    if let Some(path) = &args.agents {
        apply_agents(client, &server, path).await?;
    }
    // A dataset file is uploaded as the dataset named after the eval.
    if let Some((path, text)) = dataset_file {
        let name = eval["name"].as_str().unwrap_or("eval").to_owned();
        let v = push_dataset(client, &server, &name, &text, &path).await?;
        let object = eval.as_object_mut().expect("an eval is an object");
        object.remove("dataset_file");
        object.insert("dataset".into(), json!(format!("{name}@{}", v["version"])));
    }
    let body = json!({ "eval": eval });
    // The same eval on the same data file is the same experiment: a second
    // invocation after a crash continues it.
    let key = match &args.data {
        Some(_) => format!(
            "glia-eval:{}",
            hex(&Sha256::digest(serde_json::to_vec(&body)?))
        ),
        None => format!("glia-eval:{}", uuid::Uuid::now_v7()),
    };
    let created = server
        .call(
            client,
            Method::POST,
            "/v1/experiments",
            Some(&body),
            &[("Idempotency-Key", &key)],
        )
        .await?
        .checked()
        .with_context(|| format!("starting {}", args.file.display()))?;
    let id = text_of(&created["id"]);
    if args.detach {
        outln!("{id}");
        return Ok(());
    }
    let exp = follow(client, &server, &id).await?;
    let summary: Summary = serde_json::from_value(exp["summary"].clone())
        .context("reading the experiment's summary")?;
    let cells: Vec<Cell> =
        serde_json::from_value(exp["cells"].clone()).context("reading the experiment's cells")?;
    let name = text(&exp["name"]).to_owned();
    if let Some(path) = &args.junit {
        std::fs::write(path, glia_evals::report::junit(&name, &cells))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.markdown {
        std::fs::write(path, glia_evals::report::markdown(&name, &summary))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        crate::client::print_json(&exp)?;
    } else {
        print_results(&exp)?;
    }
    if exp["state"] != "completed" {
        bail!("experiment {id} ended {}", text(&exp["state"]));
    }
    let failures = glia_evals::stats::gate(&summary, args.min_pass_rate, args.baseline.as_deref());
    if !failures.is_empty() {
        for f in &failures {
            errln!("gate: {f}");
        }
        bail!("the gate failed ({} finding(s))", failures.len());
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Poll the experiment until it is no longer running, with a progress bar
/// on stderr; answers its final view (with results).
async fn follow(client: &Client, server: &Server, id: &str) -> Result<Value> {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} cells graded  {msg}")
            .expect("a valid template"),
    );
    loop {
        let exp = server.get(client, &format!("/v1/experiments/{id}")).await?;
        bar.set_length(exp["progress"]["cells"].as_u64().unwrap_or(0));
        bar.set_position(exp["progress"]["graded"].as_u64().unwrap_or(0));
        if exp["state"] != "running" {
            bar.finish_and_clear();
            return Ok(exp);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The results table: per version the pass rate with its interval, errors,
/// cost and latency; then the verdict changes.
fn print_results(exp: &Value) -> Result<()> {
    let summary: Summary = serde_json::from_value(exp["summary"].clone())
        .context("reading the experiment's summary")?;
    outln!(
        "experiment {} ({}) on {}: {}",
        text(&exp["id"]),
        text(&exp["name"]),
        text(&exp["dataset"]),
        text(&exp["state"])
    );
    outln!(
        "{:<28} {:>7} {:>9} {:>17} {:>6} {:>12} {:>12}",
        "VERSION",
        "GRADED",
        "PASS",
        "95% CI",
        "ERRORS",
        "COST p50 $",
        "LATENCY p50"
    );
    for v in &summary.versions {
        outln!(
            "{:<28} {:>7} {:>8.1}% {:>7.1}%–{:>6.1}% {:>6} {:>12.6} {:>10}ms",
            v.version,
            format!("{}/{}", v.graded, v.cells),
            v.pass_rate * 100.0,
            v.ci95.0 * 100.0,
            v.ci95.1 * 100.0,
            v.errors,
            v.cost_usd_micros_p50 as f64 / 1e6,
            v.latency_ms_p50
        );
    }
    if !summary.changes.is_empty() {
        outln!("verdict changes:");
        for c in &summary.changes {
            outln!(
                "  {:<32} {} {} → {} {}",
                c.case_id,
                c.from_version,
                verdict(c.from_pass),
                c.to_version,
                verdict(c.to_pass)
            );
        }
    }
    Ok(())
}

fn verdict(pass: bool) -> &'static str {
    if pass { "pass" } else { "FAIL" }
}

/// The cells of `exp` for version `label` (its first when `None`),
/// relabelled `to`.
fn cells_of(exp: &Value, label: Option<&str>, to: &str) -> Result<Vec<Cell>> {
    let cells: Vec<Cell> =
        serde_json::from_value(exp["cells"].clone()).context("reading an experiment's cells")?;
    let label = match label {
        Some(l) => l.to_owned(),
        None => text(&exp["versions"][0]["label"]).to_owned(),
    };
    let picked: Vec<Cell> = cells
        .into_iter()
        .filter(|c| c.version == label)
        .map(|c| Cell {
            version: to.to_owned(),
            ..c
        })
        .collect();
    if picked.is_empty() {
        bail!(
            "experiment {} has no cells of version {label}",
            text(&exp["id"])
        );
    }
    Ok(picked)
}

/// `glia eval compare`: the two versions' cells side by side.
fn compare(a: &Value, b: &Value, version_a: Option<&str>, version_b: Option<&str>) -> Result<()> {
    let (la, lb) = ("A".to_owned(), "B".to_owned());
    let mut cells = cells_of(a, version_a, &la)?;
    cells.extend(cells_of(b, version_b, &lb)?);
    let summary = glia_evals::stats::summarize(&[la.clone(), lb.clone()], &cells);
    for (tag, exp, v) in [
        ("A", a, &summary.versions[0]),
        ("B", b, &summary.versions[1]),
    ] {
        outln!(
            "{tag}: experiment {} ({}) {}: {:.1}% of {} (95% CI {:.1}%–{:.1}%)",
            text(&exp["id"]),
            text(&exp["name"]),
            text(&exp["state"]),
            v.pass_rate * 100.0,
            v.graded,
            v.ci95.0 * 100.0,
            v.ci95.1 * 100.0
        );
    }
    let changes = glia_evals::stats::changes_between(&la, &lb, &cells);
    let regressions: Vec<_> = changes.iter().filter(|c| c.is_regression()).collect();
    for c in &changes {
        outln!(
            "  {:<32} A {} → B {}",
            c.case_id,
            verdict(c.from_pass),
            verdict(c.to_pass)
        );
    }
    if changes.is_empty() {
        outln!("no verdict changed");
    }
    if !regressions.is_empty() {
        bail!("{} case(s) pass in A and fail in B", regressions.len());
    }
    Ok(())
}

/// The replay eval of a tau-bench recording (see [`DatasetCommand::Tau`]):
/// one inline version, the recording's run config without the model and
/// system prompt (each case's patch gives them).
fn tau_eval(recording: &glia_replay::Recording) -> Result<Value> {
    let first = recording
        .conversations()
        .first()
        .context("the recording holds no conversation")?;
    let mut config = serde_json::to_value(recording.run_config(first))?;
    let object = config.as_object_mut().expect("a config is an object");
    object.remove("model");
    object.remove("system");
    let eval = json!({
        "name": "tau-airline",
        "dataset_file": "tau-airline.jsonl",
        "agents": [{"label": "recorded", "config": config}],
        // Recorded tools are safe to run twice: a call a crash
        // interrupted is run again, as the recording has it.
        "approvals": "approve_all",
        "options": {"max_in_flight": 64},
        "graders": [{"kind": "trajectory", "expected": "tools", "order": "exact", "args": "exact"}],
    });
    glia_evals::spec::EvalSpec::from_value(eval.clone())
        .map_err(|e| anyhow::anyhow!("the recording's eval: {e}"))?;
    Ok(eval)
}

/// The replay dataset of a tau-bench recording (see
/// [`DatasetCommand::Tau`]), as JSON Lines.
pub fn tau_dataset(recording: &glia_replay::Recording) -> Result<String> {
    let mut cases = Vec::new();
    for c in recording.conversations() {
        // The customer's messages after the goal; the last one is the
        // farewell when the recording ends with it.
        let mut turns: Vec<String> = Vec::new();
        for m in c.messages.iter().skip(1) {
            let is_text = m.role == glia_proto::Role::User
                && !m.content.is_empty()
                && m.content
                    .iter()
                    .all(|b| matches!(b, glia_proto::ContentBlock::Text { .. }));
            if is_text {
                turns.push(m.text());
            }
        }
        let ends_with_customer = c
            .messages
            .last()
            .is_some_and(|m| m.role == glia_proto::Role::User && c.messages.len() > 1)
            && c.messages.last().is_some_and(|m| {
                m.content
                    .iter()
                    .all(|b| matches!(b, glia_proto::ContentBlock::Text { .. }))
            });
        let farewell = if ends_with_customer {
            turns.pop()
        } else {
            None
        };
        let tools: Vec<Value> = c
            .messages
            .iter()
            .flat_map(|m| m.tool_uses())
            .map(|(_, name, input)| json!({"name": name, "input": input}))
            .collect();
        let mut case = json!({
            "id": c.id,
            "goal": c.goal(),
            "expected": {"tools": tools},
            "config": {"model": format!("replay:{}", c.id), "system": c.system},
        });
        if !turns.is_empty() {
            case["turns"] = json!(turns);
        }
        if let Some(f) = farewell {
            case["farewell"] = json!(f);
        }
        cases.push(serde_json::to_string(&case)?);
    }
    let text = cases.join("\n") + "\n";
    dataset::parse_jsonl(&text).map_err(|e| anyhow::anyhow!("the recording's dataset: {e}"))?;
    Ok(text)
}
