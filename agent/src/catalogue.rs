//! The operator's catalogue: the one file that says what a worker may start
//! and reach on a tenant's behalf (`glia worker --catalogue fleet.toml`, also
//! `glia dev`, `glia serve`, and `glia dispatcher` for admission checks).
//!
//! The trust boundary: a run (the tenant's side, [`glia_proto::tool_sources`])
//! only names things: a provider, an MCP server, an HTTP tool URL. The
//! catalogue (the operator's side) defines them: the command a stdio server
//! is started with, the URL of a streamable HTTP server, the origins HTTP
//! tools may post to, and the *names* of the environment variables that hold
//! secrets (API keys, child environment, header values). Secret values are
//! read from the worker's environment when a server is started or a request
//! is sent; they are never stored in the catalogue value, an event, a log
//! line or an API answer.
//!
//! Format (TOML; every table rejects unknown keys, errors name the path):
//!
//! ```toml
//! [providers.claude]
//! kind = "anthropic"                  # or "openai" (any OpenAI-compatible API)
//! base_url = "https://api.anthropic.com"
//! api_key_env = "ANTHROPIC_API_KEY"   # name of the variable, never the key
//! requests_per_minute = 50            # optional; the limits are this
//! input_tokens_per_minute = 100000    # provider's own buckets, shared by
//! output_tokens_per_minute = 20000    # every worker through Redis
//! images = true                       # default; false for a text-only model
//!
//! [mcp_servers.files]
//! transport = "stdio"
//! command = "npx"
//! args = ["@modelcontextprotocol/server-filesystem", "/srv/data"]
//! env = { API_TOKEN = "FILES_TOKEN" } # child's API_TOKEN = the worker's $FILES_TOKEN
//!
//! [mcp_servers.search]
//! transport = "streamable_http"
//! url = "https://mcp.example.com/mcp"
//! headers = { Authorization = "SEARCH_AUTH" } # header value = the worker's $SEARCH_AUTH
//! trust = "untrusted"                 # default; "trusted" believes the server's annotations
//! tools_allow = ["search", "fetch"]   # optional: the only tools tenants may allow
//! tools_deny = ["get_env"]            # tools no tenant may allow
//! policy = { fetch = "require_approval" } # the operator's per-tool policy
//!
//! [http]
//! allowed_origins = ["https://orders.example.com"]
//!
//! [hooks.audit]                       # an HTTP hook (docs/hooks.md)
//! url = "https://hooks.example.com/glia"
//! topics = ["before_tool_call", "after_tool_call"]
//! secret_env = "AUDIT_HOOK_SECRET"    # holds whsec_…; never the secret itself
//! timeout_ms = 2000                   # default 5000
//! on_failure = "closed"               # or "open"
//! tenants = ["acme"]                  # optional: only these tenants' runs
//! agents = ["support"]                # optional, beside tenants: only runs of these agents
//! apply = "always"                    # default; "when_named": only runs naming it in `hooks`
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use glia_proto::tool_names::same_tool;
use glia_proto::{ConfigError, ProviderKind, RunConfig};
use serde::{Deserialize, Serialize};

/// The operator's catalogue. Holds names of environment variables, never
/// their values.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Catalogue {
    /// Model providers by name (`RunConfig::provider`).
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderEntry>,
    /// MCP servers by name (`RunConfig::mcp[].server`).
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, McpServerEntry>,
    /// What HTTP tools may reach.
    #[serde(default)]
    pub http: HttpAllow,
    /// HTTP hooks by name (`RunConfig::hooks`, `docs/hooks.md`).
    #[serde(default)]
    pub hooks: BTreeMap<String, HookEntry>,
}

/// An HTTP hook: an endpoint the worker calls, signed, on some of the ten
/// topics of the runs it applies to (`glia_agent::http_hooks`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HookEntry {
    /// Where the worker POSTs the signed JSON request: `http(s)://…`, no
    /// credentials in it. Redirects are not followed.
    pub url: String,
    /// The topics it is called on, at least one, each once.
    pub topics: Vec<glia_proto::HookTopic>,
    /// Name of the environment variable holding its signing secret
    /// (`whsec_` + base64, Standard Webhooks), never the secret itself.
    pub secret_env: String,
    /// How long a call may take, in ms (1 to 60000; default 5000).
    #[serde(default = "hook_timeout_default")]
    pub timeout_ms: u64,
    /// What a call that does not answer in time, cannot connect, answers
    /// other than 2xx or answers garbage means: `open` (go on as if it
    /// allowed; logged and counted) or `closed` (per topic, `docs/hooks.md`:
    /// a tool call is refused, a plan or step pauses the run, a tool result
    /// is withheld).
    pub on_failure: HookFailure,
    /// The tenants whose runs it applies to and may be named by; `None`
    /// (left out) = every tenant. A run of another tenant naming it is
    /// failed by the worker.
    #[serde(default)]
    pub tenants: Option<Vec<String>>,
    /// Only runs of these agents (by registry name); `None` = every run.
    /// For `apply = "always"` only, and only beside `tenants` (agent names
    /// are unique within a tenant, so the hook applies to runs of these
    /// agents of the tenants listed).
    #[serde(default)]
    pub agents: Option<Vec<String>>,
    /// `always` (default): every run `tenants` and `agents` admit, whatever
    /// the run says. `when_named`: only runs whose config or agent
    /// definition names it in `hooks`.
    #[serde(default)]
    pub apply: HookApply,
}

impl HookEntry {
    /// The signing secret of the hook `name`, read now from the variable
    /// `secret_env` names. Errors: (`hooks.NAME.secret_env`, reason) for an
    /// unset variable or a value that is not `whsec_` + base64; the reason
    /// names the variable, never the value.
    pub fn secret(&self, name: &str) -> Result<String, (String, String)> {
        self.secret_from(name, &|var| std::env::var(var).ok())
    }

    /// Like [`HookEntry::secret`], reading the variable through `lookup`
    /// (the process environment in a worker; tests give their own, since
    /// setting a process variable while other threads run is unsound).
    pub fn secret_from(
        &self,
        name: &str,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<String, (String, String)> {
        let at = || format!("hooks.{name}.secret_env");
        let value = lookup(&self.secret_env).ok_or_else(|| {
            (
                at(),
                format!("the environment variable {} is not set", self.secret_env),
            )
        })?;
        glia_proto::webhook_signature::check_secret(&value).map_err(|e| {
            (
                at(),
                format!("the environment variable {}: {e}", self.secret_env),
            )
        })?;
        Ok(value)
    }
}

fn hook_timeout_default() -> u64 {
    5_000
}

/// The longest `timeout_ms` of a hook, in ms.
pub const MAX_HOOK_TIMEOUT_MS: u64 = 60_000;

/// What a failed hook call means ([`HookEntry::on_failure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HookFailure {
    /// Go on as if the hook allowed (logged and counted).
    Open,
    /// Do not go on (per topic; see `docs/hooks.md`).
    Closed,
}

/// Which runs a hook is applied to ([`HookEntry::apply`]).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum HookApply {
    /// Every run its `tenants` and `agents` admit; a run cannot opt out.
    #[default]
    Always,
    /// Only runs that name it (`hooks`), of its `tenants`.
    WhenNamed,
}

/// A model provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderEntry {
    /// Wire format.
    pub kind: ProviderKind,
    /// API base URL, e.g. `https://api.anthropic.com`.
    pub base_url: String,
    /// Name of the environment variable holding the API key.
    pub api_key_env: String,
    /// Requests a minute the fleet may send it, if limited (counted in
    /// Redis across workers, like `glia worker --rpm`).
    #[serde(default)]
    pub requests_per_minute: Option<u32>,
    /// Input tokens a minute (uncached input plus cache writes), if limited.
    #[serde(default)]
    pub input_tokens_per_minute: Option<u32>,
    /// Output tokens a minute, if limited.
    #[serde(default)]
    pub output_tokens_per_minute: Option<u32>,
    /// Whether the models served here take images in a request. Default
    /// true (Anthropic's and OpenAI's current models do); `false` for a
    /// text-only model (e.g. an OpenAI-compatible server of a text model):
    /// its requests carry a marked text placeholder with each image's media
    /// type and size instead ([`glia_proto::Provider::takes_images`]).
    #[serde(default = "takes_images_default")]
    pub images: bool,
}

fn takes_images_default() -> bool {
    true
}

/// How an MCP server is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum McpTransport {
    /// A child process the worker starts, speaking JSON-RPC on stdin/stdout.
    Stdio,
    /// A server at a URL (MCP streamable HTTP transport).
    StreamableHttp,
}

/// An MCP server. `stdio` needs `command` (and may set `args`, `env`, `cwd`);
/// `streamable_http` needs `url` (and may set `headers`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServerEntry {
    /// How it is reached.
    pub transport: McpTransport,
    /// Program to start (stdio), looked up on `PATH` when not a path.
    #[serde(default)]
    pub command: Option<String>,
    /// Its arguments (stdio).
    #[serde(default)]
    pub args: Vec<String>,
    /// Child environment (stdio): variable name in the child → name of the
    /// worker's environment variable whose value it gets. The child
    /// inherits nothing else but `PATH` and `HOME`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory of the child (stdio).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Server URL (streamable HTTP).
    #[serde(default)]
    pub url: Option<String>,
    /// Request headers (streamable HTTP): header name → name of the worker's
    /// environment variable whose value it gets.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Whether the server's own tool annotations are believed. Untrusted
    /// (the default): `destructiveHint: true` makes a tool require approval,
    /// and `readOnlyHint` / `idempotentHint` waive nothing (no approval is
    /// skipped, no interrupted call runs again on their word). Trusted: they
    /// are believed (read-only or idempotent tools may run again after a
    /// crash; `destructiveHint` still asks for approval).
    #[serde(default)]
    pub trust: Trust,
    /// The server's tools tenants may allow (`mcp[].allow`), by exact name
    /// (the server's own, or its provider-safe form); `None` = any. A tenant naming another is refused at admission, and a
    /// tool removed from here later fails the runs that still allow it at
    /// their next step.
    #[serde(default)]
    pub tools_allow: Option<Vec<String>>,
    /// The server's tools no tenant may allow, by exact name (checked like
    /// `tools_allow`; wins over it).
    #[serde(default)]
    pub tools_deny: Vec<String>,
    /// The operator's policy per tool name (the server's own, or its
    /// provider-safe form; one key per tool). It only makes a tool stricter:
    /// a tenant's `tool_policy` or `policies` cannot undo it.
    #[serde(default)]
    pub policy: BTreeMap<String, OperatorPolicy>,
}

/// Whether an MCP server's annotations are believed.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Trust {
    /// Annotations can only make a tool stricter (the default).
    #[default]
    Untrusted,
    /// Annotations are believed.
    Trusted,
}

/// The operator's word on one tool of a catalogue MCP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OperatorPolicy {
    /// Every call needs a person's approval, whatever the tenant says.
    RequireApproval,
    /// Every call needs a person's approval, and a call a crash interrupted
    /// never runs again without one (not idempotent, whatever anyone says).
    RequireApprovalNoRetry,
}

impl McpServerEntry {
    /// Whether tenants may allow the server's tool `tool` (its own name or
    /// its provider-safe form, [`same_tool`]): named in `tools_allow` (when
    /// set) and not in `tools_deny`, either form.
    pub fn permits(&self, tool: &str) -> bool {
        self.tools_allow
            .as_ref()
            .is_none_or(|allow| allow.iter().any(|t| same_tool(t, tool)))
            && !self.tools_deny.iter().any(|t| same_tool(t, tool))
    }

    /// The operator's policy for the server's tool `tool` (either form of
    /// its name, [`same_tool`]). Two keys naming one tool are refused when
    /// the catalogue is checked.
    pub fn policy_for(&self, tool: &str) -> Option<OperatorPolicy> {
        self.policy
            .iter()
            .find(|(k, _)| same_tool(k, tool))
            .map(|(_, p)| *p)
    }

    /// Why `tool` is not permitted ([`McpServerEntry::permits`]), for the tenant's error.
    pub fn refusal(&self, server: &str, tool: &str) -> String {
        if self.tools_deny.iter().any(|t| same_tool(t, tool)) {
            format!(
                "tool {tool:?} of MCP server {server:?} is denied by the operator's catalogue (tools_deny)"
            )
        } else {
            format!(
                "tool {tool:?} of MCP server {server:?} is not in the operator's catalogue allow list (tools_allow)"
            )
        }
    }
}

/// What HTTP tools may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpAllow {
    /// Origins (`scheme://host[:port]`) an HTTP tool's URL may have.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
}

/// A catalogue that cannot be used: where (file), which key (a dotted path,
/// `mcp_servers.files.comand`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {path}: {reason}")]
pub struct CatalogueError {
    /// The file (or `<text>`).
    pub origin: String,
    /// Dotted path of the offending key; empty for the whole file.
    pub path: String,
    /// What is wrong.
    pub reason: String,
}

static NAME: std::sync::LazyLock<regex::Regex> =
    std::sync::LazyLock::new(|| regex::Regex::new("^[a-zA-Z0-9_-]{1,64}$").expect("valid regex"));
static ENV_NAME: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
    regex::Regex::new("^[A-Za-z_][A-Za-z0-9_]*$").expect("valid regex")
});

impl Catalogue {
    /// Read and check a catalogue file ([`Catalogue::parse`]).
    pub fn load(path: &Path) -> Result<Catalogue, CatalogueError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| CatalogueError {
            origin: origin.clone(),
            path: String::new(),
            reason: e.to_string(),
        })?;
        Catalogue::parse(&text, &origin)
    }

    /// Parse TOML and check it ([`Catalogue::check`]). Unknown keys and
    /// wrong types are errors naming the key's path. `origin` names the
    /// source in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Catalogue, CatalogueError> {
        let error = |path: String, reason: String| CatalogueError {
            origin: origin.to_owned(),
            path,
            reason,
        };
        let deserializer = toml::Deserializer::parse(text)
            .map_err(|e| error(String::new(), e.message().to_owned()))?;
        let catalogue: Catalogue = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            let reason = match e.inner().message() {
                "" => e.inner().to_string(),
                m => m.to_owned(),
            };
            error(if path == "." { String::new() } else { path }, reason)
        })?;
        catalogue
            .check()
            .map_err(|(path, reason)| error(path, reason))?;
        Ok(catalogue)
    }

    /// The checks past the format: provider and server names are
    /// `^[a-zA-Z0-9_-]{1,64}$`; tool names are not empty, at most 256
    /// bytes, without control characters, one `policy` key per tool; each
    /// MCP server has what its transport needs and nothing of the other's;
    /// URLs are `http(s)`; environment variable names are valid; allowed
    /// origins are origins. Errors: (dotted path, reason).
    pub fn check(&self) -> Result<(), (String, String)> {
        for (name, p) in &self.providers {
            let at = |k: &str| format!("providers.{name}.{k}");
            if !NAME.is_match(name) {
                return Err((
                    format!("providers.{name}"),
                    "names are ^[a-zA-Z0-9_-]{1,64}$".into(),
                ));
            }
            glia_proto::tool_sources::url_origin(&p.base_url).map_err(|r| (at("base_url"), r))?;
            check_env_name(&p.api_key_env).map_err(|r| (at("api_key_env"), r))?;
            for (key, limit) in [
                ("requests_per_minute", p.requests_per_minute),
                ("input_tokens_per_minute", p.input_tokens_per_minute),
                ("output_tokens_per_minute", p.output_tokens_per_minute),
            ] {
                if limit == Some(0) {
                    return Err((
                        at(key),
                        "rate limits must be at least 1 (leave them out for no limit)".into(),
                    ));
                }
            }
        }
        for (name, s) in &self.mcp_servers {
            let at = |k: &str| format!("mcp_servers.{name}.{k}");
            if !NAME.is_match(name) {
                return Err((
                    format!("mcp_servers.{name}"),
                    "names are ^[a-zA-Z0-9_-]{1,64}$".into(),
                ));
            }
            match s.transport {
                McpTransport::Stdio => {
                    match &s.command {
                        Some(c) if !c.trim().is_empty() => {}
                        _ => return Err((at("command"), "a stdio server needs a command".into())),
                    }
                    if s.url.is_some() {
                        return Err((
                            at("url"),
                            "is for streamable_http servers; a stdio server has a command".into(),
                        ));
                    }
                    if !s.headers.is_empty() {
                        return Err((at("headers"), "are for streamable_http servers".into()));
                    }
                    for (var, source) in &s.env {
                        check_env_name(var).map_err(|r| (at(&format!("env.{var}")), r))?;
                        check_env_name(source).map_err(|r| (at(&format!("env.{var}")), r))?;
                    }
                }
                McpTransport::StreamableHttp => {
                    let Some(url) = &s.url else {
                        return Err((at("url"), "a streamable_http server needs a url".into()));
                    };
                    glia_proto::tool_sources::url_origin(url).map_err(|r| (at("url"), r))?;
                    if s.command.is_some()
                        || !s.args.is_empty()
                        || !s.env.is_empty()
                        || s.cwd.is_some()
                    {
                        return Err((
                            at("command"),
                            "command, args, env and cwd are for stdio servers".into(),
                        ));
                    }
                    for (header, source) in &s.headers {
                        if reqwest::header::HeaderName::from_bytes(header.as_bytes()).is_err() {
                            return Err((
                                at(&format!("headers.{header}")),
                                "is not a valid header name".into(),
                            ));
                        }
                        check_env_name(source)
                            .map_err(|r| (at(&format!("headers.{header}")), r))?;
                    }
                }
            }
            // Tool names are the server's own (any text, `calendar.read`)
            // or their provider-safe form ([`glia_proto::tool_names`]).
            for (i, tool) in s.tools_allow.iter().flatten().enumerate() {
                check_tool_name(tool).map_err(|r| (at(&format!("tools_allow[{i}]")), r))?;
            }
            for (i, tool) in s.tools_deny.iter().enumerate() {
                check_tool_name(tool).map_err(|r| (at(&format!("tools_deny[{i}]")), r))?;
            }
            for tool in s.policy.keys() {
                check_tool_name(tool).map_err(|r| (at(&format!("policy.{tool}")), r))?;
                if let Some(other) = s.policy.keys().find(|k| *k < tool && same_tool(k, tool)) {
                    return Err((
                        at(&format!("policy.{tool}")),
                        format!(
                            "names the same tool as policy.{other} (one is the other's provider-safe form); keep one"
                        ),
                    ));
                }
                if !s.permits(tool) {
                    return Err((
                        at(&format!("policy.{tool}")),
                        format!(
                            "{tool:?} is not a tool tenants may allow (tools_allow / tools_deny), so a policy for it does nothing"
                        ),
                    ));
                }
            }
        }
        for (name, h) in &self.hooks {
            let at = |k: &str| format!("hooks.{name}.{k}");
            if !NAME.is_match(name) {
                return Err((
                    format!("hooks.{name}"),
                    "names are ^[a-zA-Z0-9_-]{1,64}$".into(),
                ));
            }
            check_hook_url(&h.url).map_err(|r| (at("url"), r))?;
            if h.topics.is_empty() {
                return Err((at("topics"), "name at least one topic".into()));
            }
            for (i, t) in h.topics.iter().enumerate() {
                if h.topics[..i].contains(t) {
                    return Err((
                        at(&format!("topics[{i}]")),
                        format!("{:?} is listed twice", t.name()),
                    ));
                }
            }
            check_env_name(&h.secret_env).map_err(|r| (at("secret_env"), r))?;
            if !(1..=MAX_HOOK_TIMEOUT_MS).contains(&h.timeout_ms) {
                return Err((
                    at("timeout_ms"),
                    format!(
                        "{} ms; a hook's timeout is 1 to {MAX_HOOK_TIMEOUT_MS} ms",
                        h.timeout_ms
                    ),
                ));
            }
            for (key, list) in [("tenants", &h.tenants), ("agents", &h.agents)] {
                if let Some(list) = list {
                    if list.is_empty() {
                        return Err((
                            at(key),
                            "is empty, so the hook would apply to no run; leave it out for every run"
                                .into(),
                        ));
                    }
                    for (i, v) in list.iter().enumerate() {
                        if v.trim().is_empty() || v.chars().any(char::is_control) {
                            return Err((
                                at(&format!("{key}[{i}]")),
                                "is blank or holds control characters".into(),
                            ));
                        }
                    }
                }
            }
            // Agent names are unique within a tenant only: an `agents`
            // list alone would reach another tenant's agent of that name.
            if h.agents.is_some() && h.tenants.is_none() {
                return Err((
                    at("agents"),
                    "needs `tenants` beside it: agent names are unique within a tenant only, so `agents` alone would reach other tenants' agents of those names"
                        .into(),
                ));
            }
            if h.apply == HookApply::WhenNamed && h.agents.is_some() {
                return Err((
                    at("agents"),
                    "is for apply = \"always\"; a when_named hook applies to exactly the runs naming it"
                        .into(),
                ));
            }
        }
        for (i, origin) in self.http.allowed_origins.iter().enumerate() {
            let at = format!("http.allowed_origins[{i}]");
            let normal =
                glia_proto::tool_sources::url_origin(origin).map_err(|r| (at.clone(), r))?;
            if normal != origin.trim_end_matches('/').to_ascii_lowercase()
                && format!("{normal}/") != origin.to_ascii_lowercase()
            {
                return Err((
                    at,
                    format!(
                        "{origin:?} is not an origin (scheme://host[:port], no path); did you mean {normal:?}?"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Every environment variable the catalogue names is set in this
    /// process (checked at worker start, so a missing secret is a startup
    /// error naming the key, not a failed call later). Errors: (dotted
    /// path, reason); the reason names the variable, never a value.
    pub fn check_environment(&self) -> Result<(), (String, String)> {
        let set = |var: &str| std::env::var_os(var).is_some();
        for (name, p) in &self.providers {
            if !set(&p.api_key_env) {
                return Err((
                    format!("providers.{name}.api_key_env"),
                    format!("the environment variable {} is not set", p.api_key_env),
                ));
            }
        }
        for (name, h) in &self.hooks {
            h.secret(name)?;
        }
        for (name, s) in &self.mcp_servers {
            for (var, source) in &s.env {
                if !set(source) {
                    return Err((
                        format!("mcp_servers.{name}.env.{var}"),
                        format!("the environment variable {source} is not set"),
                    ));
                }
            }
            for (header, source) in &s.headers {
                if !set(source) {
                    return Err((
                        format!("mcp_servers.{name}.headers.{header}"),
                        format!("the environment variable {source} is not set"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether a run's tool sources and provider are all in the catalogue:
    /// each `mcp[i].server` names a server whose operator lists permit
    /// every tool of `mcp[i].allow` ([`McpServerEntry::permits`]), each `http_tools[i].url` has an
    /// allowed origin, `provider` names a provider. The dispatcher refuses
    /// such a run at admission (422 naming the field); the worker checks
    /// again before `session.start`.
    ///
    /// ```
    /// let catalogue = glia_agent::catalogue::Catalogue::parse("[http]\nallowed_origins = [\"https://a.example\"]", "<text>").unwrap();
    /// let mut config = glia_proto::RunConfig::default();
    /// config.mcp.push(glia_proto::McpToolSource { server: "files".into(), allow: vec!["read".into()] });
    /// assert_eq!(catalogue.admit(&config).unwrap_err().field, "mcp[0].server");
    /// ```
    pub fn admit(&self, config: &RunConfig) -> Result<(), ConfigError> {
        for (i, source) in config.mcp.iter().enumerate() {
            let Some(entry) = self.mcp_servers.get(&source.server) else {
                return Err(ConfigError {
                    field: format!("mcp[{i}].server"),
                    reason: format!(
                        "{:?} is not an MCP server in this fleet's catalogue",
                        source.server
                    ),
                });
            };
            if let Some((j, tool)) = source
                .allow
                .iter()
                .enumerate()
                .find(|(_, t)| !entry.permits(t))
            {
                return Err(ConfigError {
                    field: format!("mcp[{i}].allow[{j}]"),
                    reason: entry.refusal(&source.server, tool),
                });
            }
        }
        for (i, tool) in config.http_tools.iter().enumerate() {
            let field = format!("http_tools[{i}].url");
            let origin =
                glia_proto::tool_sources::url_origin(&tool.url).map_err(|reason| ConfigError {
                    field: field.clone(),
                    reason,
                })?;
            if !self.origin_allowed(&origin) {
                return Err(ConfigError {
                    field,
                    reason: format!(
                        "{origin} is not an origin this fleet's catalogue allows HTTP tools to call"
                    ),
                });
            }
        }
        for (i, hook) in config.hooks.iter().enumerate() {
            if !self.hooks.contains_key(hook) {
                return Err(ConfigError {
                    field: format!("hooks[{i}]"),
                    reason: format!("{hook:?} is not a hook available to this run"),
                });
            }
        }
        if let Some(provider) = &config.provider
            && !self.providers.contains_key(provider)
        {
            return Err(ConfigError {
                field: "provider".into(),
                reason: format!("{provider:?} is not a provider in this fleet's catalogue"),
            });
        }
        Ok(())
    }

    /// The JSON Schema of the catalogue file (TOML read as JSON), as
    /// written to `schemas/catalogue.schema.json` for editors (keys
    /// sorted, so the file does not depend on the generator's order).
    pub fn json_schema() -> serde_json::Value {
        glia_proto::json::sort_keys(&schemars::schema_for!(Catalogue).to_value())
    }

    /// Whether HTTP tools may call `origin` (as [`glia_proto::tool_sources::url_origin`] gives it).
    pub fn origin_allowed(&self, origin: &str) -> bool {
        self.http
            .allowed_origins
            .iter()
            .any(|o| glia_proto::tool_sources::url_origin(o).is_ok_and(|o| o == origin))
    }
}

/// A tool name the operator writes: not empty, at most
/// [`glia_proto::limits::MAX_TOOL_NAME_BYTES`] bytes, no control characters.
fn check_tool_name(tool: &str) -> Result<(), String> {
    if tool.is_empty() || tool.chars().any(char::is_control) {
        return Err(format!(
            "{tool:?}: a tool name is not empty and holds no control characters"
        ));
    }
    if tool.len() > glia_proto::limits::MAX_TOOL_NAME_BYTES {
        return Err(format!(
            "a {}-byte tool name; at most {} bytes (max_tool_name_bytes)",
            tool.len(),
            glia_proto::limits::MAX_TOOL_NAME_BYTES
        ));
    }
    Ok(())
}

/// A hook's URL: `http` or `https`, a host, no user or password.
fn check_hook_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("scheme {:?} is not http or https", parsed.scheme()));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("the URL has no host".into());
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("credentials in the URL are not accepted; the request is signed".into());
    }
    Ok(())
}

fn check_env_name(name: &str) -> Result<(), String> {
    if ENV_NAME.is_match(name) {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
        ))
    }
}
