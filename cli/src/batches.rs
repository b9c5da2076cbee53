//! `glia batch submit|status|results|cancel|pause|resume|list`: batches on
//! a dispatcher (`POST /v1/batches` and friends; see `docs/batches.md`).
//! `glia batch FILE` without a subcommand is the tau-bench replay driver
//! (`crate::batch`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use futures::StreamExt;
use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use crate::client::{Server, checked, http_client};

/// `glia batch`: a subcommand, or a recording to replay.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BatchCli {
    /// Batches on a dispatcher.
    #[command(subcommand)]
    pub command: Option<BatchCommand>,
    /// Replay a recording (no subcommand).
    #[command(flatten)]
    pub replay: crate::tau_driver::BatchArgs,
}

/// Spend cap options.
#[derive(Args, Clone, Default)]
pub struct CapArgs {
    /// Spend cap of the whole batch in tokens (every kind).
    #[arg(long)]
    pub cap_tokens: Option<u64>,
    /// Spend cap of the whole batch in USD (e.g. 12.50).
    #[arg(long)]
    pub cap_usd: Option<f64>,
}

impl CapArgs {
    fn body(&self) -> Result<Option<Value>> {
        if self.cap_tokens.is_none() && self.cap_usd.is_none() {
            return Ok(None);
        }
        let usd_micros = match self.cap_usd {
            Some(usd) if !usd.is_finite() || usd < 0.0 => {
                bail!("--cap-usd must be a non-negative amount")
            }
            Some(usd) => Some((usd * 1_000_000.0).round() as u64),
            None => None,
        };
        Ok(Some(
            json!({"tokens": self.cap_tokens, "usd_micros": usd_micros}),
        ))
    }
}

/// `glia batch …` subcommands.
#[derive(Subcommand)]
pub enum BatchCommand {
    /// Submit ITEMS (JSON Lines: `{"custom_id", "goal", "inputs"?, "metadata"?}`
    /// per line) with a run configuration; prints the batch id.
    Submit {
        #[command(flatten)]
        server: Server,
        /// The run configuration of every item (a JSON file, as `config` of POST /v1/runs).
        #[arg(long, conflicts_with = "agent", required_unless_present = "agent")]
        config: Option<PathBuf>,
        /// An agent definition, `NAME` or `NAME@VERSION`.
        #[arg(long)]
        agent: Option<String>,
        /// The items file (JSON Lines); streamed to the dispatcher.
        items: PathBuf,
        /// Most runs of this batch at once.
        #[arg(long)]
        max_in_flight: Option<u32>,
        #[command(flatten)]
        cap: CapArgs,
        /// Seconds after which items not yet started expire.
        #[arg(long)]
        completion_window_secs: Option<u64>,
        /// Idempotency key (default: a fresh one); submitting again with the
        /// same key returns the same batch.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Then show progress until the batch is done; exit non-zero unless
        /// every item succeeded (an item failed, expired or was cancelled, or
        /// the batch stopped at its spend cap or paused with items not finished).
        #[arg(long)]
        wait: bool,
    },
    /// Show a batch: counts, spend, state. With --wait, a progress bar until it is done.
    Status {
        #[command(flatten)]
        server: Server,
        /// Batch id.
        id: String,
        /// Show progress until the batch is done; exit as `submit --wait` does.
        #[arg(long)]
        wait: bool,
    },
    /// Print the results (JSON Lines, one per item, submission order).
    Results {
        #[command(flatten)]
        server: Server,
        /// Batch id.
        id: String,
    },
    /// Cancel: nothing more starts, unfinished runs are cancelled.
    Cancel {
        #[command(flatten)]
        server: Server,
        /// Batch id.
        id: String,
    },
    /// Pause: nothing more starts; started runs go on.
    Pause {
        #[command(flatten)]
        server: Server,
        /// Batch id.
        id: String,
    },
    /// Resume, optionally with a new spend cap (replacing the old one).
    Resume {
        #[command(flatten)]
        server: Server,
        /// Batch id.
        id: String,
        #[command(flatten)]
        cap: CapArgs,
    },
    /// The tenant's batches.
    List {
        #[command(flatten)]
        server: Server,
        /// Print the API's answer (JSON) instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Run `glia batch`: a subcommand, or the replay driver.
pub async fn batch(cli: BatchCli) -> Result<()> {
    match cli.command {
        None => crate::tau_driver::batch(cli.replay).await,
        Some(cmd) => command(cmd).await,
    }
}

async fn command(cmd: BatchCommand) -> Result<()> {
    let client = http_client()?;
    match cmd {
        BatchCommand::Submit {
            server,
            config,
            agent,
            items,
            max_in_flight,
            cap,
            completion_window_secs,
            idempotency_key,
            wait,
        } => {
            let mut spec = json!({"options": {}});
            if let Some(path) = &config {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                spec["config"] = serde_json::from_str(&text)
                    .with_context(|| format!("{} is not JSON", path.display()))?;
            }
            if let Some(agent) = agent {
                spec["agent"] = json!(agent);
            }
            if let Some(n) = max_in_flight {
                spec["options"]["max_in_flight"] = json!(n);
            }
            if let Some(c) = cap.body()? {
                spec["options"]["spend_cap"] = c;
            }
            if let Some(s) = completion_window_secs {
                spec["options"]["completion_window_secs"] = json!(s);
            }
            let file = tokio::fs::File::open(&items)
                .await
                .with_context(|| format!("opening {}", items.display()))?;
            let key = idempotency_key.unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
            let body = reqwest::Body::wrap_stream(upload(format!("{spec}\n"), file));
            let resp = server
                .request(&client, Method::POST, "/v1/batches")
                .header("content-type", "application/jsonl")
                .header("idempotency-key", &key)
                .timeout(Duration::from_secs(3600))
                .body(body)
                .send()
                .await
                .context("submitting the batch")?;
            let status = resp.status();
            let created: Value = resp
                .json()
                .await
                .context("reading the dispatcher's answer")?;
            if !status.is_success() {
                let e = &created["error"];
                let at = match (e["line"].as_u64(), e["field"].as_str()) {
                    // Line 1 of the upload is the spec this command sent; the file's lines follow.
                    (Some(1), _) => "the batch options: ".to_owned(),
                    (Some(line), Some(field)) => {
                        format!("{} line {}, {field}: ", items.display(), line - 1)
                    }
                    (Some(line), None) => format!("{} line {}: ", items.display(), line - 1),
                    (None, _) => String::new(),
                };
                bail!(
                    "{status}: {at}{} ({})",
                    e["message"].as_str().unwrap_or("?"),
                    e["code"].as_str().unwrap_or("?")
                );
            }
            let id = created["id"]
                .as_str()
                .context("the answer has no batch id")?
                .to_owned();
            outln!("{id}");
            if wait {
                watch(&server, &client, &id).await?;
            }
        }
        BatchCommand::Status { server, id, wait } => {
            if wait {
                watch(&server, &client, &id).await?;
            } else {
                let view = server.get(&client, &format!("/v1/batches/{id}")).await?;
                outln!("{}", serde_json::to_string_pretty(&view)?);
            }
        }
        BatchCommand::Results { server, id } => {
            let resp = server
                .request(&client, Method::GET, &format!("/v1/batches/{id}/results"))
                .timeout(Duration::from_secs(3600))
                .send()
                .await?;
            if !resp.status().is_success() {
                checked(resp).await?;
                return Ok(());
            }
            let mut body = resp.bytes_stream();
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            while let Some(chunk) = body.next().await {
                out.write_all(&chunk.context("reading the results")?)?;
            }
        }
        BatchCommand::Cancel { server, id } => {
            print_view(
                &server,
                &client,
                &format!("/v1/batches/{id}/cancel"),
                json!({}),
            )
            .await?
        }
        BatchCommand::Pause { server, id } => {
            print_view(
                &server,
                &client,
                &format!("/v1/batches/{id}/pause"),
                json!({}),
            )
            .await?
        }
        BatchCommand::Resume { server, id, cap } => {
            let body = match cap.body()? {
                Some(c) => json!({"spend_cap": c}),
                None => json!({}),
            };
            print_view(&server, &client, &format!("/v1/batches/{id}/resume"), body).await?
        }
        BatchCommand::List { server, json } => {
            let page = server.get(&client, "/v1/batches?limit=1000").await?;
            if json {
                return crate::client::print_json(&page);
            }
            for b in page["batches"].as_array().cloned().unwrap_or_default() {
                outln!(
                    "{}  {:<9}  {:>7} items  {}",
                    b["id"].as_str().unwrap_or("?"),
                    b["status"].as_str().unwrap_or("?"),
                    b["total"],
                    b["created_at"].as_str().unwrap_or("")
                );
            }
        }
    }
    Ok(())
}

/// The spec line, then the file's bytes as they are read.
fn upload(
    first: String,
    file: tokio::fs::File,
) -> impl futures::Stream<Item = std::io::Result<Vec<u8>>> {
    let head = futures::stream::once(async move { Ok(first.into_bytes()) });
    let rest = futures::stream::unfold(Some(file), |file| async move {
        let mut file = file?;
        let mut buf = vec![0u8; 256 * 1024];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(buf), Some(file)))
            }
            Err(e) => Some((Err(e), None)),
        }
    });
    head.chain(rest)
}

async fn print_view(
    server: &Server,
    client: &reqwest::Client,
    path: &str,
    body: Value,
) -> Result<()> {
    let view = checked(
        server
            .request(client, Method::POST, path)
            .json(&body)
            .send()
            .await?,
    )
    .await?;
    outln!("{}", serde_json::to_string_pretty(&view)?);
    Ok(())
}

/// A progress bar (finished items of the total) with counts and spend, until
/// the batch ended or stopped (paused, or at its spend cap, with no run
/// going); then the final status. Answers an error (a non-zero exit) unless
/// the batch completed with every item succeeded: items failed, expired or
/// cancelled, or a batch stopped with items not finished, are reported and
/// the bar is left where it is (it says "done" only for finished items).
async fn watch(server: &Server, client: &reqwest::Client, id: &str) -> Result<()> {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} done, ETA {eta}  {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    loop {
        let v = server.get(client, &format!("/v1/batches/{id}")).await?;
        let c = &v["counts"];
        let n = |k: &str| c[k].as_u64().unwrap_or(0);
        let parked: u64 = c["parked"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum());
        bar.set_length(v["total"].as_u64().unwrap_or(0));
        bar.set_position(n("succeeded") + n("failed") + n("cancelled") + n("expired"));
        let usd = v["spend"]["usd_micros"].as_u64().unwrap_or(0) as f64 / 1e6;
        bar.set_message(format!(
            "queued {} running {} parked {} ok {} failed {} expired {} | {} tokens ${usd:.4}{}",
            n("queued"),
            n("running"),
            parked,
            n("succeeded"),
            n("failed"),
            n("expired"),
            v["spend"]["tokens"].as_u64().unwrap_or(0),
            if v["cap_reached"] == true {
                " (cap reached)"
            } else {
                ""
            }
        ));
        let status = v["status"].as_str().unwrap_or("?");
        let open = n("queued") + n("running") + parked;
        let stalled = (status == "paused" || v["cap_reached"] == true) && n("running") == 0;
        if open == 0 || stalled {
            let verdict = verdict(&v);
            match &verdict {
                Ok(()) => bar.finish(),
                Err(_) => bar.abandon(),
            }
            errln!("batch {id}: {status}");
            return verdict;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Whether a batch view (`GET /v1/batches/{id}`) is a success: completed,
/// every item succeeded. Otherwise an error saying what did not.
pub fn verdict(v: &Value) -> Result<()> {
    let c = &v["counts"];
    let n = |k: &str| c[k].as_u64().unwrap_or(0);
    let parked: u64 = c["parked"]
        .as_object()
        .map_or(0, |m| m.values().filter_map(Value::as_u64).sum());
    let open = n("queued") + n("running") + parked;
    let mut why = Vec::new();
    for (k, what) in [
        ("failed", "failed"),
        ("expired", "expired"),
        ("cancelled", "were cancelled"),
    ] {
        if n(k) > 0 {
            why.push(format!("{} item(s) {what}", n(k)));
        }
    }
    if open > 0 {
        let stop = if v["cap_reached"] == true {
            "stopped at its spend cap"
        } else {
            "stopped"
        };
        why.push(format!(
            "{stop} ({}) with {open} item(s) not finished",
            v["status"].as_str().unwrap_or("?")
        ));
    }
    if why.is_empty() && v["status"] == "completed" {
        return Ok(());
    }
    if why.is_empty() {
        why.push(format!("it is {}", v["status"].as_str().unwrap_or("?")));
    }
    bail!(
        "batch {}: {}",
        v["id"].as_str().unwrap_or("?"),
        why.join(", ")
    )
}
