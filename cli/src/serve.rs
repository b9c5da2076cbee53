//! The server side of the CLI: `glia dispatcher`, `glia worker`, `glia dev`,
//! `glia serve`.
//! Each builds the three ports from URLs (or in memory) and runs the
//! library's services until SIGINT/SIGTERM.
//!
//! `glia dispatcher` and `glia worker` start while a service is down: each
//! port is connected in the background, retried with backoff and logged
//! ([`Ports::connect_waiting`]); meanwhile the dispatcher serves `/healthz`
//! and a `/readyz` that names what it waits for (every other request answers
//! 503 `not_ready`, see [`glia_dispatcher::startup`]), and a worker with
//! `--metrics-listen` does the same on its metrics address. Once connected,
//! `/readyz` checks the live ports on each call.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use glia_agent::Agent;
use glia_agent::budget_gate::TenantCaps;
use glia_agent::provider::{Provider, ScriptLibrary};
use glia_backends::{EVENT_LOG, EventLog, JOB_QUEUE, LEDGER};
use glia_dispatcher::{Gate, Startup};
use glia_providers::RateLimits;
use glia_worker::consumer::{LedgerGate, WorkerOptions};
use glia_worker::metrics::WorkerMetrics;
use tokio::sync::watch;
use tracing::info;

use crate::ports::{Ports, Urls};

/// Options of the worker side.
#[derive(Args, Clone)]
pub struct WorkerArgs {
    /// Directory of scripts (`NAME.json`) served to runs whose model is
    /// `script:NAME`; used unless --provider names a real provider.
    #[arg(long, default_value = "examples/scripts", conflicts_with = "provider")]
    pub scripts: PathBuf,
    #[command(flatten)]
    pub provider: crate::provider::ProviderArgs,
    /// A recording directory (tau-bench: `gpt-4o-airline.json` and
    /// `tools.json`): serve runs whose model is `replay:ID` from it, with its
    /// recorded tools (see `glia batch`). Instead of scripts and providers.
    #[arg(long, value_name = "DIR", conflicts_with = "provider")]
    pub replay: Option<PathBuf>,
    /// Fleet-wide requests per minute per provider, model and key (0 = no limit).
    #[arg(long, default_value_t = 0, requires = "provider")]
    pub rpm: u64,
    /// Fleet-wide input tokens per minute per provider, model and key (0 = no limit).
    #[arg(long, default_value_t = 0, requires = "provider")]
    pub input_tpm: u64,
    /// Fleet-wide output tokens per minute per provider, model and key (0 = no limit).
    #[arg(long, default_value_t = 0, requires = "provider")]
    pub output_tpm: u64,
    /// Offer runs the demo tools (calculator, get_order, refund_order; see
    /// `examples/`). Without it a worker offers only the tools a run's config
    /// or agent names from what the worker has (none but recorded ones).
    #[arg(long)]
    pub demo: bool,
    /// Runs advanced at once per worker.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Lease length in ms.
    #[arg(long, default_value_t = 30_000)]
    pub lease_ms: u64,
    /// Worker id (lease owner); default `HOST-PID`.
    #[arg(long)]
    pub id: Option<String>,
    /// Per-tenant daily caps, a JSON file: `{"TENANT": {"daily_cost_usd_micros":
    /// N, "daily_tokens": N}}` (either field may be left out; tenants not
    /// listed are uncapped), counted across the fleet in the ledger.
    #[arg(long, value_name = "FILE")]
    pub tenant_caps: Option<PathBuf>,
    /// Serve this worker's Prometheus metrics (`/metrics`) and `/healthz`
    /// on this address, e.g. `0.0.0.0:9464` (default: not served).
    #[arg(long, env = "GLIA_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub catalogue: CatalogueArgs,
}

/// The operator's catalogue (`glia_agent::catalogue`): providers, MCP
/// servers, HTTP tool origins.
#[derive(Args, Clone, Default)]
pub struct CatalogueArgs {
    /// The operator's catalogue, a TOML file: model providers, MCP servers
    /// (stdio commands or streamable HTTP URLs; secrets as environment
    /// variable names) and the origins HTTP tools may call. Checked at
    /// start (unknown keys, missing variables: an error naming the key);
    /// runs naming anything it lacks are refused.
    #[arg(long, env = "GLIA_CATALOGUE", value_name = "FILE")]
    pub catalogue: Option<PathBuf>,
}

impl CatalogueArgs {
    /// The catalogue, parsed and checked; `None` without `--catalogue`.
    pub fn load(&self) -> Result<Option<glia_agent::catalogue::Catalogue>> {
        let Some(path) = &self.catalogue else {
            return Ok(None);
        };
        Ok(Some(
            glia_agent::catalogue::Catalogue::load(path)
                .map_err(|e| anyhow::anyhow!("invalid catalogue: {e}"))?,
        ))
    }

    /// The catalogue, parsed and checked, with every environment variable
    /// it names set (what a worker needs); `None` without `--catalogue`.
    pub fn checked(&self) -> Result<Option<glia_agent::catalogue::Catalogue>> {
        let Some(catalogue) = self.load()? else {
            return Ok(None);
        };
        if let Err((key, reason)) = catalogue.check_environment() {
            bail!(
                "invalid catalogue: {}: {key}: {reason}",
                self.catalogue.as_deref().unwrap_or(Path::new("")).display()
            );
        }
        Ok(Some(catalogue))
    }

    /// The dispatcher's admission check against the catalogue, if any.
    /// Without `--catalogue`, a `glia dispatcher` admits what names
    /// catalogue entries (its workers' catalogues are theirs; each worker
    /// checks again before `session.start`).
    pub fn admission(&self) -> Result<Option<glia_dispatcher::Admission>> {
        Ok(self.load()?.map(Self::admit_with))
    }

    /// The admission check of a dispatcher whose workers run in its own
    /// process (`glia dev`, `glia serve`): they have exactly this
    /// catalogue, or none, so without `--catalogue` a run naming an MCP
    /// server, an HTTP tool or a provider is refused at once (422 naming
    /// `config.mcp[0].server`) instead of admitted to fail.
    pub fn in_process_admission(&self) -> Result<glia_dispatcher::Admission> {
        Ok(Self::admit_with(self.load()?.unwrap_or_default()))
    }

    fn admit_with(catalogue: glia_agent::catalogue::Catalogue) -> glia_dispatcher::Admission {
        Arc::new(move |config| catalogue.admit(config))
    }
}

/// `agent` offering `catalogue`'s MCP and HTTP tools (its MCP servers
/// started); unchanged without one.
fn equip(catalogue: Option<glia_agent::catalogue::Catalogue>, agent: Agent) -> Result<Agent> {
    let Some(catalogue) = catalogue else {
        return Ok(agent);
    };
    info!(
        providers = catalogue.providers.len(),
        mcp_servers = catalogue.mcp_servers.len(),
        http_origins = catalogue.http.allowed_origins.len(),
        hooks = catalogue.hooks.len(),
        "operator catalogue loaded"
    );
    // The hooks' secrets are read from the environment now (their
    // variables were checked with the catalogue).
    let hooks = glia_agent::http_hooks::HttpHooks::from_catalogue(&catalogue)
        .map_err(|(key, reason)| anyhow::anyhow!("invalid catalogue: {key}: {reason}"))?;
    let agent = if hooks.is_empty() {
        agent
    } else {
        agent.with_http_hooks(hooks)
    };
    Ok(
        agent.with_tool_sources(Arc::new(glia_agent::tool_sources::ToolSources::start(
            catalogue,
        ))),
    )
}

/// `agent`'s HTTP hooks given the worker's ports: runs' tenants from the
/// event log, calls counted in `metrics`. Unchanged without hooks.
fn with_hook_ports(
    agent: Arc<Agent>,
    ports: &Ports,
    metrics: Option<&Arc<WorkerMetrics>>,
) -> Result<Arc<Agent>> {
    let mut agent = Arc::try_unwrap(agent)
        .map_err(|_| anyhow::anyhow!("the agent is shared before its hooks are set"))?;
    if let Some(hooks) = agent.take_http_hooks() {
        let mut hooks = hooks.with_tenants(Arc::new(glia_worker::run_tenants::LogTenants::new(
            ports.log.clone(),
        )));
        if let Some(m) = metrics {
            hooks = hooks.with_observer(m.clone());
        }
        agent = agent.with_http_hooks(hooks);
    }
    Ok(Arc::new(agent))
}

impl WorkerArgs {
    /// The agent: scripts, or the real provider of `--provider` (with the
    /// fleet-wide rate limiter in Redis when `redis` is given: URL and key
    /// prefix; its connection is waited for and reported in `startup`), for
    /// runs that name no provider; the catalogue's `[providers.NAME]` for
    /// runs that name one. A missing API key fails before anything connects.
    async fn agent(
        &self,
        redis: Option<(&str, &str)>,
        metrics: Option<glia_providers::ProviderMetrics>,
        startup: &Startup,
    ) -> Result<Arc<Agent>> {
        // The operator's catalogue is checked first: a bad one stops the worker before anything else.
        let catalogue = self.catalogue.checked()?;
        if let Some(dir) = &self.replay {
            let recording = glia_replay::tau::load_dir(dir)?;
            info!(conversations = recording.conversations().len(), dir = %dir.display(), "replaying a recording");
            return Ok(Arc::new(equip(catalogue, replay_agent(&recording)?)?));
        }
        self.provider
            .check(catalogue.as_ref().is_some_and(|c| !c.providers.is_empty()))?;
        let named = match &catalogue {
            Some(c) => {
                self.provider
                    .catalogue_providers(
                        c,
                        redis.map(|(url, prefix)| (url, prefix, startup)),
                        metrics.clone(),
                    )
                    .await?
            }
            None => Vec::new(),
        };
        let provider: Arc<dyn Provider> = match self.provider.provider {
            None => Arc::new(ScriptLibrary::from_dir(&self.scripts).map_err(anyhow::Error::msg)?),
            Some(kind) => {
                let limits = RateLimits {
                    requests_per_minute: self.rpm,
                    input_tokens_per_minute: self.input_tpm,
                    output_tokens_per_minute: self.output_tpm,
                    resume_spacing_ms: None,
                };
                let prefix = redis.map(|(_, p)| format!("{p}:")).unwrap_or_default();
                let limiter = redis.map(|(url, _)| (url, prefix.as_str(), limits, startup));
                self.provider.fleet_provider(kind, limiter, metrics).await?
            }
        };
        let agent = named
            .into_iter()
            .fold(Agent::new(provider), |agent, (name, p)| {
                agent.with_named_provider(name, p)
            });
        Ok(Arc::new(equip(
            catalogue,
            if self.demo {
                agent.with_tools(crate::demo::tools())
            } else {
                agent
            },
        )?))
    }

    /// Metric handles labelled with this worker's provider, the provider
    /// adapter's own metrics registered alongside; `None` without
    /// `--metrics-listen`.
    fn metrics(&self) -> Option<(WorkerMetrics, glia_providers::ProviderMetrics)> {
        self.metrics_listen?;
        let mut m = WorkerMetrics::new(self.provider_label());
        let provider = glia_providers::ProviderMetrics::register(m.registry_mut());
        Some((m, provider))
    }

    /// The worker's provider as metrics and spans label it: `scripted`,
    /// `anthropic`, `openai`.
    fn provider_label(&self) -> &'static str {
        self.provider.provider.map_or("scripted", |k| k.name())
    }

    /// The `--tenant-caps` file, parsed (`None` without the flag).
    fn tenant_caps(&self) -> Result<Option<TenantCaps>> {
        let Some(path) = &self.tenant_caps else {
            return Ok(None);
        };
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let caps =
            TenantCaps::from_json(&text).with_context(|| format!("parsing {}", path.display()))?;
        Ok(Some(caps))
    }

    fn options(&self, n: usize) -> WorkerOptions {
        let base = self
            .id
            .clone()
            .unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id()));
        WorkerOptions {
            id: if n == 0 { base } else { format!("{base}-{n}") },
            concurrency: self.concurrency,
            lease_ttl: Duration::from_millis(self.lease_ms),
        }
    }
}

/// An agent that replays `recording`: its provider and its recorded tools.
pub fn replay_agent(recording: &glia_replay::Recording) -> Result<Agent> {
    Ok(Agent::new(Arc::new(recording.provider())).with_tools(recording.tools()?))
}

/// A catalogue with one stdio MCP server, `name`: this binary's `glia
/// replay-tools FILE --tools TOOLS` (the recording's tools as a separate
/// process).
fn replay_tools_catalogue(
    name: &str,
    file: &Path,
    tools: &Path,
) -> Result<glia_agent::catalogue::Catalogue> {
    use glia_agent::catalogue::{Catalogue, McpServerEntry, McpTransport, Trust};
    let exe = std::env::current_exe().context("locating the glia binary")?;
    let path = |p: &Path| {
        std::path::absolute(p)
            .map(|p| p.display().to_string())
            .with_context(|| format!("resolving {}", p.display()))
    };
    let entry = McpServerEntry {
        transport: McpTransport::Stdio,
        command: Some(exe.display().to_string()),
        args: vec![
            "replay-tools".into(),
            path(file)?,
            "--tools".into(),
            path(tools)?,
        ],
        env: Default::default(),
        cwd: None,
        url: None,
        headers: Default::default(),
        // glia's own server of the recording: its annotations (read-only
        // for the recording's non-consequential tools) are glia's word.
        trust: Trust::Trusted,
        tools_allow: None,
        tools_deny: Vec::new(),
        policy: Default::default(),
    };
    let catalogue = Catalogue {
        mcp_servers: [(name.to_owned(), entry)].into(),
        ..Catalogue::default()
    };
    catalogue
        .check()
        .map_err(|(key, reason)| anyhow::anyhow!("--mcp-server: {key}: {reason}"))?;
    Ok(catalogue)
}

/// A dispatcher and workers in this process on one SQLite file (the single
/// node), serving on an ephemeral loopback port; stopped when dropped.
pub struct Embedded {
    /// The dispatcher's base URL, `http://127.0.0.1:PORT`.
    pub url: String,
    stop: watch::Sender<bool>,
    /// The temporary directory of the data file, when none was named:
    /// removed when dropped.
    scratch: Option<PathBuf>,
}

impl Embedded {
    /// Start `workers` workers (each advancing `concurrency` runs at once)
    /// that replay `recording`, and a dispatcher for them, on the SQLite file
    /// `data` (runs already in it continue), or on a new file in a temporary
    /// directory of its own. With `mcp` (a server name, the recording's
    /// file and its tool list), the workers also have a catalogue naming
    /// that MCP server: this binary's `glia replay-tools` on the recording.
    pub async fn start(
        recording: &glia_replay::Recording,
        workers: usize,
        concurrency: usize,
        data: Option<&Path>,
        mcp: Option<(&str, &Path, &Path)>,
    ) -> Result<Embedded> {
        let agent = replay_agent(recording)?;
        let agent = Arc::new(match mcp {
            Some((name, file, tools)) => {
                equip(Some(replay_tools_catalogue(name, file, tools)?), agent)?
            }
            None => agent,
        });
        // A tool server that cannot start fails the batch here, not its runs later.
        if let (Some((name, ..)), Some(sources)) = (mcp, agent.tool_sources()) {
            sources
                .mcp()
                .list_tools(name, Duration::from_secs(30))
                .await
                .map_err(|e| anyhow::anyhow!("--mcp-server {name}: {e}"))?;
        }
        Embedded::start_agent(agent, workers, concurrency, data).await
    }

    /// Start `workers` workers (each advancing `concurrency` runs at once)
    /// running `agent`, and a dispatcher for them (with batches, schedules
    /// and evals), on the SQLite file `data` (runs already in it continue),
    /// or on a new file in a temporary directory of its own.
    pub async fn start_agent(
        agent: Arc<Agent>,
        workers: usize,
        concurrency: usize,
        data: Option<&Path>,
    ) -> Result<Embedded> {
        let (path, scratch) = match data {
            Some(path) => (path.to_owned(), None),
            None => {
                let dir = std::env::temp_dir()
                    .join(format!("glia-batch-{}", uuid::Uuid::now_v7().simple()));
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                (dir.join("glia.db"), Some(dir))
            }
        };
        let mut embedded = Embedded {
            url: String::new(),
            stop: watch::channel(false).0,
            scratch,
        };
        let ports = Ports::sqlite(&path).await?;
        let (stop, shutdown) = watch::channel(false);
        embedded.stop = stop;
        for n in 0..workers.max(1) {
            let options = WorkerOptions {
                id: format!("embedded-{n}"),
                concurrency: concurrency.max(1),
                lease_ttl: Duration::from_secs(30),
            };
            tokio::spawn(Arc::new(ports.worker(agent.clone(), options)).run(shutdown.clone()));
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding a loopback port")?;
        embedded.url = format!("http://{}", listener.local_addr()?);
        let app = glia_dispatcher::App::new(
            ports.log.clone(),
            ports.queue.clone(),
            ports.ledger.clone(),
            glia_dispatcher::Auth::from_tokens(Vec::new())?,
        );
        // One tenant on one machine: the tenant's cap is the fleet's.
        let admission = glia_dispatcher::batches::Admission {
            per_tenant: glia_dispatcher::batches::Admission::default().max_in_flight,
            ..Default::default()
        };
        let mut app = app.with_batches(glia_dispatcher::batches::BatchConfig {
            store: ports.batches.clone(),
            admission,
        });
        if let Some(store) = &ports.schedules {
            app = app.with_schedules(store.clone());
        }
        if let Some(store) = &ports.evals {
            app = app.with_evals(store.clone());
        }
        tokio::spawn(run_dispatcher(
            app,
            listener,
            Duration::from_secs(1),
            Duration::from_secs(5),
            shutdown,
        ));
        if data.is_some() {
            applied_what_was_posted(ports.log.as_ref()).await?;
        }
        Ok(embedded)
    }
}

/// Wait (up to a minute) until the workers have applied every payload a
/// previous process posted to the runs that are not done. A driver that
/// resumes answers each run from its log: an answer its previous
/// incarnation posted and the workers had not applied yet would otherwise
/// be posted again, and land at the run's next pull point.
async fn applied_what_was_posted(log: &dyn EventLog) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut waiting = 0;
        let mut filter = glia_backends::RunFilter {
            limit: 1000,
            ..Default::default()
        };
        loop {
            let page = log.list_runs(&filter).await.context("listing runs")?;
            for run in page
                .iter()
                .filter(|r| r.status != glia_backends::RunStatus::Done)
            {
                if !log
                    .inbox(run.run_id)
                    .await
                    .context("reading an inbox")?
                    .is_empty()
                {
                    waiting += 1;
                }
            }
            match page.last() {
                Some(last) if page.len() == filter.limit => filter.before = Some(last.run_id),
                _ => break,
            }
        }
        if waiting == 0 {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            tracing::warn!(
                runs = waiting,
                "payloads posted before the restart are still not applied; resuming anyway"
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(dir) = &self.scratch {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// `agent` gated by the tenants' daily caps over `ports` (a [`LedgerGate`]),
/// when `--tenant-caps` was given; unchanged otherwise.
fn with_caps(agent: Arc<Agent>, caps: Option<TenantCaps>, ports: &Ports) -> Result<Arc<Agent>> {
    let Some(caps) = caps else { return Ok(agent) };
    let agent = Arc::try_unwrap(agent)
        .map_err(|_| anyhow::anyhow!("the agent is shared before its budget gate is set"))?;
    info!(tenants = caps.0.len(), "tenant daily caps enforced");
    Ok(Arc::new(agent.with_budget_gate(Arc::new(LedgerGate::new(
        ports.ledger.clone(),
        ports.log.clone(),
        caps,
    )))))
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "glia".into())
}

/// Turns true on SIGINT or SIGTERM.
fn shutdown_signal() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        info!("shutting down");
        let _ = tx.send(true);
    });
    rx
}

/// Options of the dispatcher side.
#[derive(Args, Clone)]
pub struct DispatcherArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// A bearer token, `TOKEN:TENANT:SCOPE[,SCOPE…][:NAME]` (scopes: submit,
    /// approve, admin; NAME, the principal recorded as the decider of its
    /// approvals, defaults to the tenant); repeatable. With none the
    /// dispatcher serves loopback only and every request acts as admin.
    #[arg(long = "token", env = "GLIA_TOKENS", value_delimiter = ' ')]
    pub tokens: Vec<String>,
    /// A token file: `{"TOKEN": {"tenant": …, "scopes": […]}, …}`.
    #[arg(long)]
    pub tokens_file: Option<PathBuf>,
    /// Secret the inbox's session cookies are signed with; give every
    /// replica behind one address the same one. Default: random per process
    /// (sessions end when it restarts).
    #[arg(long, env = "GLIA_SESSION_KEY", hide_env_values = true)]
    pub session_key: Option<String>,
    /// Mark the inbox's session cookie `Secure` (when served over HTTPS).
    #[arg(long)]
    pub secure_cookies: bool,
    /// This dispatcher's address as approvers reach it (links to the inbox
    /// in Slack webhook messages), e.g. `https://glia.example.com`.
    #[arg(long, env = "GLIA_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// Let tenants' webhooks reach loopback and private addresses (refused by default).
    #[arg(long, env = "GLIA_WEBHOOK_ALLOW_PRIVATE")]
    pub webhook_allow_private: bool,
    /// A host tenants' webhooks may reach whatever it resolves to; repeatable.
    #[arg(long = "webhook-allow-host")]
    pub webhook_allow_hosts: Vec<String>,
    /// Seconds between reconciler passes.
    #[arg(long, default_value_t = 2)]
    pub reconcile_every: u64,
    /// How long an event posted to `POST /v1/events` is kept for waits that
    /// begin after it arrived, in seconds (docs/waits.md).
    #[arg(long, env = "GLIA_EVENT_RETENTION_SECS", default_value_t = 900)]
    pub event_retention_secs: u64,
    /// Most batch runs not done at once across all tenants; keep it below
    /// the fleet's worker slots so single runs always find one.
    #[arg(long, env = "GLIA_BATCH_MAX_IN_FLIGHT", default_value_t = 256)]
    pub batch_max_in_flight: u32,
    /// Most batch runs not done at once per tenant.
    #[arg(long, env = "GLIA_BATCH_PER_TENANT", default_value_t = 128)]
    pub batch_per_tenant: u32,
    /// A tenant's fair-share weight for batch admission, `TENANT=WEIGHT`
    /// (default 1); repeatable.
    #[arg(long = "batch-weight", value_parser = parse_weight)]
    pub batch_weights: Vec<(String, u32)>,
    /// Ms between samples of the gauges read from Postgres and RabbitMQ
    /// (runs by status, approvals, queue depth and consumers).
    #[arg(long, env = "GLIA_METRICS_SAMPLE_MS", default_value_t = 5000)]
    pub metrics_sample_ms: u64,
    /// Retention periods, a JSON file: `{"default_days": 90, "tenants":
    /// {"acme": {"days": 30}}}` (both parts optional). A finished run's
    /// content is erased that long after its last event, by a sweeper in
    /// every dispatcher (`docs/storage.md`, "Erasure and retention").
    /// Without it nothing is erased but on request (`DELETE /v1/runs/{id}`).
    #[arg(long, env = "GLIA_RETENTION", value_name = "FILE")]
    pub retention: Option<PathBuf>,
}

impl DispatcherArgs {
    fn auth(&self) -> Result<glia_dispatcher::Auth> {
        let mut specs = Vec::new();
        for spec in self.tokens.iter().filter(|s| !s.is_empty()) {
            specs.push(glia_dispatcher::Auth::parse_spec(spec).context("parsing --token")?);
        }
        if let Some(path) = &self.tokens_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            if !specs.is_empty() {
                bail!("give tokens either with --token or with --tokens-file, not both");
            }
            return glia_dispatcher::Auth::from_json(&text)
                .with_context(|| format!("parsing {}", path.display()));
        }
        Ok(glia_dispatcher::Auth::from_tokens(specs)?)
    }
}

impl DispatcherArgs {
    /// The retention settings of `--retention` (default: keep everything).
    fn retention(&self) -> Result<glia_dispatcher::retention::Retention> {
        let Some(path) = &self.retention else {
            return Ok(Default::default());
        };
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        glia_dispatcher::retention::Retention::from_json(&text)
            .map_err(|e| anyhow::anyhow!("invalid retention file {}: {e}", path.display()))
    }

    /// `app` with the inbox's session settings, the webhooks' store,
    /// receiver policy and public URL, and the batch store and admission
    /// caps and the retention periods from these options.
    fn configure(&self, app: glia_dispatcher::App, ports: &Ports) -> Result<glia_dispatcher::App> {
        let webhooks = ports.webhooks.clone();
        let mut inbox = match &self.session_key {
            Some(key) if !key.is_empty() => glia_dispatcher::inbox::InboxConfig::with_secret(key),
            _ => glia_dispatcher::inbox::InboxConfig::default(),
        };
        inbox.secure_cookies = self.secure_cookies;
        let webhooks = glia_dispatcher::webhooks::WebhookConfig {
            store: webhooks,
            policy: glia_dispatcher::webhooks::WebhookPolicy {
                allow_private: self.webhook_allow_private,
                allow_hosts: self.webhook_allow_hosts.clone(),
            },
            public_url: Some(
                self.public_url
                    .clone()
                    .unwrap_or_else(|| format!("http://{}", self.listen)),
            ),
        };
        let admission = glia_dispatcher::batches::Admission {
            max_in_flight: self.batch_max_in_flight.max(1),
            per_tenant: self.batch_per_tenant.max(1),
            weights: self.batch_weights.iter().cloned().collect(),
            ..Default::default()
        };
        // Issue 32, schedules: the store, when the ports have one.
        let app = match &ports.schedules {
            Some(store) => app.with_schedules(store.clone()),
            None => app,
        };
        // Issue 31, evals: datasets and experiments, when the ports have a store.
        let app = match &ports.evals {
            Some(store) => app.with_evals(store.clone()),
            None => app,
        };
        let limits = glia_dispatcher::Limits {
            event_retention: Duration::from_secs(self.event_retention_secs),
            ..app.limits.clone()
        };
        Ok(app
            .with_limits(limits)
            .with_inbox(inbox)
            .with_webhooks(webhooks)
            .with_batches(glia_dispatcher::batches::BatchConfig {
                store: ports.batches.clone(),
                admission,
            })
            .with_retention(self.retention()?))
    }
}

fn parse_weight(s: &str) -> Result<(String, u32), String> {
    let (tenant, weight) = s
        .split_once('=')
        .ok_or_else(|| format!("'{s}': expected TENANT=WEIGHT"))?;
    let weight: u32 = weight
        .parse()
        .map_err(|_| format!("'{s}': the weight must be a positive integer"))?;
    if tenant.is_empty() || weight == 0 {
        return Err(format!(
            "'{s}': expected TENANT=WEIGHT with a non-empty tenant and a weight of at least 1"
        ));
    }
    Ok((tenant.to_owned(), weight))
}

async fn serve_dispatcher(
    ports: &Ports,
    args: &DispatcherArgs,
    admission: Option<glia_dispatcher::Admission>,
    shutdown: watch::Receiver<bool>,
) -> Result<()> {
    let app = glia_dispatcher::App::new(
        ports.log.clone(),
        ports.queue.clone(),
        ports.ledger.clone(),
        args.auth()?,
    );
    let mut app = args.configure(app, ports)?;
    app.admission = admission;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let every = Duration::from_secs(args.reconcile_every.max(1));
    run_dispatcher(
        app,
        listener,
        every,
        Duration::from_millis(args.metrics_sample_ms.max(100)),
        shutdown,
    )
    .await
}

/// The dispatcher: the outbox relay, the reconciler (every `reconcile_every`)
/// and the metrics sampler (every `sample_every`) in the background, and the
/// HTTP API on `listener` until `shutdown` turns true.
pub async fn run_dispatcher(
    app: glia_dispatcher::App,
    listener: tokio::net::TcpListener,
    reconcile_every: Duration,
    sample_every: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> Result<()> {
    spawn_background(&app, reconcile_every, sample_every);
    glia_dispatcher::serve(app, listener, async move {
        let _ = shutdown.wait_for(|s| *s).await;
    })
    .await?;
    Ok(())
}

/// The dispatcher's background tasks: the outbox relay, the reconciler
/// (every `reconcile_every`), the metrics sampler (every `sample_every`),
/// and where configured the webhook deliverer, batch admission and the
/// retention sweeper.
fn spawn_background(app: &glia_dispatcher::App, reconcile_every: Duration, sample_every: Duration) {
    tokio::spawn(glia_dispatcher::relay(app.clone()));
    tokio::spawn(glia_dispatcher::reconcile(app.clone(), reconcile_every));
    tokio::spawn(glia_dispatcher::sample(app.clone(), sample_every));
    // issue 32: waits (due timers, timeouts, kept events, start_at)
    tokio::spawn(glia_dispatcher::waits::waits(app.clone()));
    if app.webhooks.store.is_some() {
        tokio::spawn(glia_dispatcher::webhooks::deliver(
            app.clone(),
            glia_dispatcher::webhooks::DeliveryOptions::default(),
        ));
    }
    if app.batches.store.is_some() {
        tokio::spawn(glia_dispatcher::batches::admit(app.clone()));
    }
    if app.retention.is_active() {
        tokio::spawn(glia_dispatcher::retention::retention(app.clone()));
    }
    // Issue 32, schedules: the scheduler, where there is a schedule store.
    if app.schedules.is_some() {
        tokio::spawn(glia_dispatcher::schedules::schedules(app.clone()));
    }
    // Issue 31, evals: drive and grade experiments.
    if app.evals.is_some() {
        tokio::spawn(glia_dispatcher::evals::evals(app.clone()));
    }
    // Issue 32, child runs: start children, deliver their ends.
    tokio::spawn(glia_dispatcher::children::children(app.clone()));
}

/// `glia dispatcher`: the HTTP API, the outbox relay and the reconciler.
/// It listens at once and connects to the services in the background
/// ([`Ports::connect_waiting`]), answering 503 `not_ready` (and `/readyz`
/// naming what it waits for) until they answer.
pub async fn dispatcher(urls: Urls, args: DispatcherArgs, catalogue: CatalogueArgs) -> Result<()> {
    urls.check()?;
    let auth = args.auth()?;
    args.retention()?;
    let admission = catalogue.admission()?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let shutdown = shutdown_signal();
    let gate = Gate::new(
        Startup::new(&[EVENT_LOG, JOB_QUEUE, LEDGER]),
        auth.is_open(),
    );
    let mut stop = shutdown.clone();
    let mut server = tokio::spawn(glia_dispatcher::serve_gate(
        gate.clone(),
        listener,
        async move {
            let _ = stop.wait_for(|s| *s).await;
        },
    ));
    let ports = tokio::select! {
        served = &mut server => return Ok(served.context("the HTTP server task")??),
        ports = Ports::connect_waiting(&urls, gate.startup(), shutdown.clone()) => ports?,
    };
    if let Some(ports) = ports {
        let mut app = args.configure(
            glia_dispatcher::App::new(
                ports.log.clone(),
                ports.queue.clone(),
                ports.ledger.clone(),
                auth,
            ),
            &ports,
        )?;
        app.admission = admission;
        spawn_background(
            &app,
            Duration::from_secs(args.reconcile_every.max(1)),
            Duration::from_millis(args.metrics_sample_ms.max(100)),
        );
        gate.open(app);
        info!("dispatcher ready: Postgres, RabbitMQ and Redis connected");
    }
    server.await.context("the HTTP server task")??;
    Ok(())
}

/// `glia worker`: consume run jobs until SIGTERM, then finish the current
/// steps, release leases and exit.
///
/// It connects to the services in the background ([`Ports::connect_waiting`]);
/// with `--metrics-listen`, `/healthz` answers from the start and `/readyz`
/// names what it waits for (then checks the live ports).
pub async fn worker(urls: Urls, args: WorkerArgs) -> Result<()> {
    let caps = args.tenant_caps()?;
    urls.check()?;
    let (metrics, provider_metrics) = args.metrics().unzip();
    let metrics = metrics.map(Arc::new);
    let shutdown = shutdown_signal();
    let readiness = crate::observe::Readiness::new(Startup::new(&[EVENT_LOG, JOB_QUEUE, LEDGER]));
    if let (Some(metrics), Some(addr)) = (&metrics, args.metrics_listen) {
        let listener = crate::observe::serve_metrics(
            addr,
            metrics.clone(),
            readiness.clone(),
            shutdown.clone(),
        );
        tokio::spawn(async move {
            if let Err(e) = listener.await {
                tracing::error!("metrics endpoint: {e:#}");
            }
        });
    }
    let mut stop = shutdown.clone();
    let agent = tokio::select! {
        agent = args.agent(Some((&urls.redis_url, &urls.redis_prefix)), provider_metrics, readiness.startup()) => agent?,
        _ = stop.wait_for(|s| *s) => return Ok(()),
    };
    let Some(ports) = Ports::connect_waiting(&urls, readiness.startup(), shutdown.clone()).await?
    else {
        return Ok(());
    };
    readiness.connected(&ports);
    info!("worker ready: Postgres, RabbitMQ and Redis connected");
    let agent = with_caps(agent, caps, &ports)?;
    let agent = with_hook_ports(agent, &ports, metrics.as_ref())?;
    let agent_sources = agent.tool_sources().cloned();
    let mut worker = ports
        .worker(agent, args.options(0))
        .with_provider_label(args.provider_label());
    if let Some(metrics) = metrics {
        worker = worker.with_metrics(metrics);
    }
    Arc::new(worker).run(shutdown).await;
    if let Some(sources) = agent_sources {
        sources.shutdown().await;
    }
    Ok(())
}

/// What `glia dev` and `glia serve` run in their one process.
#[derive(Args, Clone)]
pub struct NodeArgs {
    /// Workers to start.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    #[command(flatten)]
    pub worker: WorkerArgs,
    #[command(flatten)]
    pub dispatcher: DispatcherArgs,
}

/// Where `glia dev` / `glia serve` keep their runs.
pub enum Store {
    /// In-memory twins: nothing survives the process.
    Memory,
    /// The services at the URLs.
    Services(Urls),
    /// The single node: one SQLite file.
    Sqlite(PathBuf),
}

/// `glia dev` and `glia serve`: dispatcher and `workers` workers in one
/// process, on the in-memory ports, the services (`--services`; only then is
/// a real provider rate-limited through Redis), or one SQLite file (`--data`:
/// durable; killed and started again, every run continues from its log).
/// With `--metrics-listen`, the workers' metrics are served there (the
/// dispatcher's are at `/metrics` of the API).
pub async fn dev(store: Store, node: NodeArgs) -> Result<()> {
    let NodeArgs {
        workers,
        worker: worker_args,
        dispatcher: dispatcher_args,
    } = node;
    let caps = worker_args.tenant_caps()?;
    let (metrics, provider_metrics) = worker_args.metrics().unzip();
    let redis = match &store {
        Store::Services(urls) => Some((urls.redis_url.as_str(), urls.redis_prefix.as_str())),
        _ => None,
    };
    let shutdown = shutdown_signal();
    let readiness = crate::observe::Readiness::new(Startup::new(&[EVENT_LOG, JOB_QUEUE, LEDGER]));
    let startup = readiness.startup().clone();
    let agent = worker_args.agent(redis, provider_metrics, &startup).await?;
    let ports = match &store {
        Store::Memory => Ports::memory(),
        // Waits for the services (logging why), like `glia dispatcher` and `glia worker`.
        Store::Services(urls) => {
            match Ports::connect_waiting(urls, &startup, shutdown.clone()).await? {
                Some(ports) => ports,
                None => return Ok(()),
            }
        }
        Store::Sqlite(path) => {
            let ports = Ports::sqlite(path).await?;
            info!(data = %path.display(), "single node on a SQLite file");
            ports
        }
    };
    let agent = with_caps(agent, caps, &ports)?;
    readiness.connected(&ports);
    let metrics = metrics.map(Arc::new);
    let agent = with_hook_ports(agent, &ports, metrics.as_ref())?;
    if let (Some(metrics), Some(addr)) = (&metrics, worker_args.metrics_listen) {
        let listener = crate::observe::serve_metrics(
            addr,
            metrics.clone(),
            readiness.clone(),
            shutdown.clone(),
        );
        tokio::spawn(async move {
            if let Err(e) = listener.await {
                tracing::error!("metrics endpoint: {e:#}");
            }
        });
    }
    for n in 0..workers.max(1) {
        let mut w = ports
            .worker(agent.clone(), worker_args.options(n))
            .with_provider_label(worker_args.provider_label());
        if let Some(metrics) = &metrics {
            w = w.with_metrics(metrics.clone());
        }
        tokio::spawn(Arc::new(w).run(shutdown.clone()));
    }
    let sources = agent.tool_sources().cloned();
    let served = serve_dispatcher(
        &ports,
        &dispatcher_args,
        Some(worker_args.catalogue.in_process_admission()?),
        shutdown,
    )
    .await;
    if let Some(sources) = sources {
        sources.shutdown().await;
    }
    served
}
