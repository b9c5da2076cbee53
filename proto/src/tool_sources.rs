//! Tool sources a tenant's run may name: tools of MCP servers and HTTP tools,
//! and per-tool policy. The tenant side of the trust boundary: a run names a
//! server or a URL; the worker's operator catalogue (`glia worker
//! --catalogue FILE`, `glia_agent::catalogue`) says which servers exist, how
//! they are started or reached, which secrets they get, and which origins
//! HTTP tools may call. Nothing here can carry a command, an environment
//! variable, a header value or a secret: every type rejects unknown fields.
//!
//! JSON example (fields of [`crate::RunConfig`]):
//! `{"mcp": [{"server": "files", "allow": ["read_text_file", "list_directory"]}],
//!   "http_tools": [{"name": "lookup", "description": "Look an order up.",
//!     "input_schema": {"type": "object"}, "url": "https://orders.example.com/lookup", "idempotent": true}],
//!   "tool_policy": {"write_file": {"requires_approval": true}}}`

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The tools of one catalogue MCP server that a run may use.
///
/// `allow` is an explicit list of the server's tool names (no wildcard): a
/// server that adds a tool later does not widen what a reviewed run offers.
/// It must not be empty. A listed tool the server does not offer fails the
/// run at step start. Each entry is the tool's own MCP name (any text, at
/// most 256 bytes: `calendar.read`) or its provider-safe form; the model is
/// offered the provider-safe form ([`crate::tool_names::provider_tool_name`]:
/// the name itself when it matches `^[a-zA-Z0-9_-]{1,64}$`), so two sources
/// offering the same name are an error at step start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct McpToolSource {
    /// Name of an MCP server in the operator's catalogue (`[mcp_servers.NAME]`).
    #[cfg_attr(
        feature = "schemars",
        schemars(pattern(crate::config_error::NOT_BLANK))
    )]
    pub server: String,
    /// Tool names of that server the model is offered, at least one.
    #[cfg_attr(
        feature = "schemars",
        schemars(
            length(min = 1),
            inner(length(min = 1, max = crate::limits::MAX_TOOL_NAME_BYTES))
        )
    )]
    pub allow: Vec<String>,
}

/// A tool the worker runs as a JSON POST to a URL: the body is the call's
/// arguments object; the answer must be a 2xx with a JSON body (at most
/// `max_response_bytes`), which is the result the model sees. The request
/// carries `Idempotency-Key: {run_id}:{turn}:{call_id}`. Transport failures
/// and 5xx/429 answers are retried (with backoff, within `timeout_ms`) only
/// when `idempotent`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct HttpTool {
    /// Name the model calls it by, `^[a-zA-Z0-9_-]{1,64}$`, not `final_output`.
    #[cfg_attr(
        feature = "schemars",
        schemars(
            pattern(crate::config_error::TOOL_NAME_PATTERN),
            // The output tool's name (`OUTPUT_TOOL` of the config module,
            // spelled out: this module is below config).
            extend("not" = {"const": "final_output"})
        )
    )]
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of the arguments object (`"type": "object"`).
    #[cfg_attr(
        feature = "schemars",
        schemars(with = "crate::tool_schema::ToolInputSchema")
    )]
    pub input_schema: Value,
    /// `http://` or `https://` URL; its origin (scheme, host, port) must be
    /// one the catalogue allows (`[http] allowed_origins`).
    #[cfg_attr(
        feature = "schemars",
        schemars(pattern(r"^[hH][tT][tT][pP][sS]?://[^/?#@\s]+([/?#]\S*)?$"))
    )]
    pub url: String,
    /// Safe to send twice with the same idempotency key (enables retries and
    /// re-running after a crash). Default false.
    #[serde(default)]
    pub idempotent: bool,
    /// Time for the whole call, retries included, in ms. Default 30 000.
    #[serde(default = "default_http_timeout_ms")]
    #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
    pub timeout_ms: u64,
    /// Largest response body accepted, in bytes; a larger one is a tool
    /// error. Default 1 MiB.
    #[serde(default = "default_max_response_bytes")]
    #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
    pub max_response_bytes: u64,
}

fn default_http_timeout_ms() -> u64 {
    30_000
}

fn default_max_response_bytes() -> u64 {
    1 << 20
}

/// Default [`ToolPolicy::max_total_ms`] of an MCP tool, as a multiple of its
/// `timeout_ms`: a call that keeps reporting progress runs up to 10 × its
/// idle timeout (5 min for the default 30 s).
pub const DEFAULT_MAX_TOTAL_FACTOR: u64 = 10;

/// The `max_total_ms` of an MCP tool with idle timeout `timeout_ms` (ms) and
/// the tenant's `max_total_ms`, if set: that, else
/// [`DEFAULT_MAX_TOTAL_FACTOR`] × `timeout_ms` (saturating). Errors: the
/// tenant's value is below `timeout_ms` (it would cut every call before
/// the idle timeout could).
pub fn resolve_max_total_ms(timeout_ms: u64, max_total_ms: Option<u64>) -> Result<u64, String> {
    match max_total_ms {
        Some(total) if total < timeout_ms => Err(format!(
            "{total} ms is below the tool's timeout_ms of {timeout_ms} ms; it must be at least that"
        )),
        Some(total) => Ok(total),
        None => Ok(timeout_ms.saturating_mul(DEFAULT_MAX_TOTAL_FACTOR)),
    }
}

/// How a tool is run, overriding its defaults (an MCP tool's annotations:
/// `readOnlyHint` or `idempotentHint` make it idempotent, `destructiveHint`
/// makes it require approval; an HTTP tool's own fields). Unset fields keep
/// the default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ToolPolicy {
    /// A person approves each call before it runs (`awaiting_approval`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires_approval: Option<bool>,
    /// Safe to run again with the same idempotency key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    /// Per-call timeout in ms; at least 1. For an MCP tool it is an idle
    /// timeout: each `notifications/progress` the server sends for the
    /// call starts it again, up to `max_total_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
    pub timeout_ms: Option<u64>,
    /// The longest an MCP tool's call may run however often it reports
    /// progress, in ms; at least the tool's `timeout_ms`. Default
    /// [`DEFAULT_MAX_TOTAL_FACTOR`] × `timeout_ms`. MCP tools only (set
    /// for a run's HTTP, external or worker tool it is refused: their
    /// `timeout_ms` bounds the whole call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
    pub max_total_ms: Option<u64>,
    /// A successful call ends the run with its result as the answer
    /// ([`crate::ToolSpec::return_direct`]: a hand-off tool); default false.
    /// That answer is not the model's: output guardrails, the output schema
    /// and `after_step` hooks do not see it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_direct: Option<bool>,
    /// The most bytes of this tool's result text that enter the
    /// conversation (the rest is cut, with a marked notice; the log keeps
    /// the whole); default the run's `max_result_bytes`. 1 to 1 MiB. Applies
    /// to every tool: the worker's, external, HTTP and MCP tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(range(min = 1, max = 1_048_576)))]
    pub max_result_bytes: Option<u64>,
    /// What a result of this MCP tool that does not match its
    /// `outputSchema` becomes: `enforce` (default; a tool error the model
    /// sees) or `warn` (the result passes; the worker logs a warning).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<OutputSchemaCheck>,
}

/// An MCP tool's declared `outputSchema` and what glia does with a result
/// that does not match it, frozen in the step's [`crate::ToolSpec`].
///
/// JSON: `{"schema": {"type": "object", …}, "check": "enforce"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ToolOutputSchema {
    /// The schema, as the server listed it.
    pub schema: Value,
    /// Enforce (default) or warn.
    #[serde(default)]
    pub check: OutputSchemaCheck,
}

/// What a result that does not match its tool's `outputSchema` (or has no
/// `structuredContent` though the tool declares one: MCP 2025-06-18,
/// "Tools" › "Output Schema", servers MUST provide structured results that
/// conform) becomes. Set per tool by `tool_policy.NAME.output_schema`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum OutputSchemaCheck {
    /// A tool error the model sees (`invalid_output`), naming each
    /// violation's path and rule.
    #[default]
    Enforce,
    /// The result passes unchanged; the worker logs a warning naming the
    /// violations.
    Warn,
}

/// Who decided one part of an offered tool's [`ResolvedPolicy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyOrigin {
    /// The operator's catalogue (`[mcp_servers.NAME] policy`, `trust`).
    Operator,
    /// The tenant, through the agent definition the run was started from.
    Agent,
    /// The tenant, in the run's own config.
    Run,
    /// The MCP server's annotations (`destructiveHint`, and from a trusted
    /// server `readOnlyHint` / `idempotentHint`).
    Annotation,
    /// Nobody: the default (no approval; not idempotent, or the tool's own
    /// declaration for the worker's compiled-in tools).
    Default,
}

impl PolicyOrigin {
    /// `operator`, `agent`, `run`, `annotation`, `default`.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyOrigin::Operator => "operator",
            PolicyOrigin::Agent => "agent",
            PolicyOrigin::Run => "run",
            PolicyOrigin::Annotation => "annotation",
            PolicyOrigin::Default => "default",
        }
    }
}

/// The policy a step applies to every call of one offered tool, and who
/// decided each part: frozen with the tool in `step.start`
/// ([`crate::ToolSpec::policy`]), shown on the approval card. A call may
/// still need an approval its tool does not by a matching entry of the
/// run's `policies` (which look at arguments).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolvedPolicy {
    /// Every call needs a person's approval before it runs.
    pub requires_approval: bool,
    /// Who decided `requires_approval`.
    pub approval_by: PolicyOrigin,
    /// A call a crash interrupted may run again (same idempotency key).
    pub idempotent: bool,
    /// Who decided `idempotent`.
    pub idempotent_by: PolicyOrigin,
    /// For an MCP tool: whether the operator's catalogue marks its server
    /// `trusted` (its annotations believed) or not (they can only make it
    /// stricter); `None` for other tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_server: Option<bool>,
}

impl ResolvedPolicy {
    /// One line for people: `requires approval (operator); not idempotent (default)`.
    pub fn describe(&self) -> String {
        let approval = if self.requires_approval {
            "requires approval"
        } else {
            "no approval"
        };
        let idempotent = if self.idempotent {
            "idempotent"
        } else {
            "not idempotent"
        };
        let mut text = format!(
            "{approval} ({}); {idempotent} ({})",
            self.approval_by.as_str(),
            self.idempotent_by.as_str()
        );
        match self.trusted_server {
            Some(true) => text.push_str("; trusted server"),
            Some(false) => text.push_str("; untrusted server"),
            None => {}
        }
        text
    }
}

/// The annotations an MCP server lists for a tool (`tools/list`, MCP
/// 2025-06-18 "Tools" › `ToolAnnotations`), as it listed them. They are
/// claims of the server, not verified: glia believes them only as far as
/// the catalogue's `trust` says ([`ResolvedPolicy`]), and the approval card
/// shows them as "server-supplied hints". JSON uses MCP's own names:
/// `{"title": "…", "readOnlyHint": true, "destructiveHint": false,
/// "idempotentHint": true, "openWorldHint": false}` (each optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpToolHints {
    /// A human-readable title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The tool does not change its environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_hint: Option<bool>,
    /// The tool may make destructive updates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive_hint: Option<bool>,
    /// Calling it twice with the same arguments has no further effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent_hint: Option<bool>,
    /// The tool reaches an open world of outside entities (the web…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world_hint: Option<bool>,
}

impl McpToolHints {
    /// The hints the server set, as `(MCP name, value)` pairs in MCP's
    /// order (`title` first); empty when it set none.
    pub fn listed(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(t) = &self.title {
            out.push(("title", t.clone()));
        }
        for (name, v) in [
            ("readOnlyHint", self.read_only_hint),
            ("destructiveHint", self.destructive_hint),
            ("idempotentHint", self.idempotent_hint),
            ("openWorldHint", self.open_world_hint),
        ] {
            if let Some(v) = v {
                out.push((name, v.to_string()));
            }
        }
        out
    }
}

/// Where a tool offered in a step comes from, frozen with it in `step.start`
/// ([`crate::ToolSpec::source`]): the worker routes each call by it, and a
/// reader sees which server version of the schema the model was shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToolSource {
    /// A tool of a catalogue MCP server.
    Mcp {
        /// Catalogue server name.
        server: String,
        /// The tool's name on that server.
        tool: String,
        /// [`crate::args_hash`] of the input schema the server listed.
        schema_hash: String,
        /// Calls need a person's approval (annotation or policy).
        #[serde(default)]
        requires_approval: bool,
        /// The longest a call may run while it reports progress, in ms
        /// ([`ToolPolicy::max_total_ms`], resolved when the step froze its
        /// tools); the tool's `timeout_ms` is then an idle timeout that each
        /// progress report starts again. `None` (logs written before it was
        /// recorded): `timeout_ms` bounds the whole call.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_total_ms: Option<u64>,
        /// The annotations the server listed for the tool: its claims,
        /// shown to approvers as such; `None` when it listed none (and in
        /// logs written before they were recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hints: Option<McpToolHints>,
    },
    /// An HTTP tool of the run's config.
    Http {
        /// The URL it posts to.
        url: String,
        /// Largest response body accepted, in bytes.
        max_response_bytes: u64,
        /// Calls need a person's approval (policy).
        #[serde(default)]
        requires_approval: bool,
    },
    /// Issue 32, child runs: a registered agent offered as a tool
    /// ([`crate::ChildAgent`]); a call starts a child run.
    Agent {
        /// `name@version`.
        agent: String,
        /// Its definition's content hash, frozen at admission.
        content_hash: String,
    },
    /// A tool of a recording ([`crate::recorded::RecordedTools`]): a call
    /// is answered from the recording and runs nothing.
    Recorded {
        /// Calls need a person's approval (the recorded tool required it).
        #[serde(default)]
        requires_approval: bool,
    },
}

impl ToolSource {
    /// Whether calls of the tool need a person's approval.
    pub fn requires_approval(&self) -> bool {
        match self {
            ToolSource::Mcp {
                requires_approval, ..
            }
            | ToolSource::Http {
                requires_approval, ..
            }
            | ToolSource::Recorded { requires_approval } => *requires_approval,
            ToolSource::Agent { .. } => false,
        }
    }
}

/// The origin of an `http://` or `https://` URL: `scheme://host[:port]`,
/// lowercased, the default port left out. Errors: why the URL is not one.
///
/// ```
/// assert_eq!(glia_proto::tool_sources::url_origin("https://API.example.com/v1/x?y").unwrap(), "https://api.example.com");
/// assert_eq!(glia_proto::tool_sources::url_origin("http://127.0.0.1:8080/t").unwrap(), "http://127.0.0.1:8080");
/// assert!(glia_proto::tool_sources::url_origin("https://user:pw@host/").is_err());
/// ```
pub fn url_origin(url: &str) -> Result<String, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("{url:?} is not an absolute URL"))?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return Err(format!("{url:?}: only http and https URLs are allowed"));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.is_empty() {
        return Err(format!("{url:?} has no host"));
    }
    if authority.contains('@') {
        return Err(format!(
            "{url:?}: credentials in the URL are not allowed (the catalogue holds secrets)"
        ));
    }
    if authority
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(format!("{url:?} has an invalid host"));
    }
    let authority = authority.to_ascii_lowercase();
    let default_port = if scheme == "https" { ":443" } else { ":80" };
    let authority = authority.strip_suffix(default_port).unwrap_or(&authority);
    Ok(format!("{scheme}://{authority}"))
}

/// What a run does when a tool source it names cannot list its tools
/// (an MCP server down, not answering `tools/list`, or past the listing's
/// deadline): `RunConfig::on_tool_source_unavailable`.
///
/// Each failed attempt is recorded as `tool_source.unavailable` (server,
/// reason, attempt); the run is then tried again after `backoff_ms`
/// doubling per attempt (capped at [`MAX_TOOL_SOURCE_BACKOFF_MS`]). The
/// recorded attempt that reaches `attempts` parks the run at `paused`
/// ([`crate::PauseReason::ToolSource`], an operator resumes it once the
/// server is back: it gets `attempts` more) or fails it with the reason,
/// per `then`. With the defaults the run gives up after 5 attempts, about
/// 1 + 2 + 4 + 8 s of backoff plus each attempt's own wait.
///
/// JSON example: `{"attempts": 3, "backoff_ms": 500, "then": "fail"}`
/// (missing fields keep their defaults; unknown fields are refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct ToolSourceUnavailable {
    /// Failed listings before `then`, from 1 to
    /// [`MAX_TOOL_SOURCE_ATTEMPTS`]. Default 5.
    #[cfg_attr(feature = "schemars", schemars(range(min = 1, max = 20)))]
    pub attempts: u32,
    /// Wait before the second attempt, in ms; doubles for each next one,
    /// at most [`MAX_TOOL_SOURCE_BACKOFF_MS`]. Default 1000.
    #[cfg_attr(feature = "schemars", schemars(range(max = 60_000)))]
    pub backoff_ms: u64,
    /// What happens at the last attempt. Default `pause`.
    pub then: UnavailableAction,
}

/// Most attempts [`ToolSourceUnavailable::attempts`] allows.
pub const MAX_TOOL_SOURCE_ATTEMPTS: u32 = 20;
/// Longest wait between two attempts to list a run's tools, in ms.
pub const MAX_TOOL_SOURCE_BACKOFF_MS: u64 = 60_000;

impl Default for ToolSourceUnavailable {
    fn default() -> Self {
        ToolSourceUnavailable {
            attempts: 5,
            backoff_ms: 1_000,
            then: UnavailableAction::Pause,
        }
    }
}

impl ToolSourceUnavailable {
    /// The wait after failed attempt `attempt` (from 1), in ms:
    /// `backoff_ms · 2^(attempt-1)`, at most [`MAX_TOOL_SOURCE_BACKOFF_MS`].
    ///
    /// ```
    /// use glia_proto::tool_sources::ToolSourceUnavailable;
    /// let p = ToolSourceUnavailable::default();
    /// assert_eq!(p.retry_in_ms(1), 1_000);
    /// assert_eq!(p.retry_in_ms(3), 4_000);
    /// assert_eq!(p.retry_in_ms(40), 60_000);
    /// ```
    pub fn retry_in_ms(&self, attempt: u32) -> u64 {
        let doubled = self
            .backoff_ms
            .saturating_mul(1u64 << attempt.saturating_sub(1).min(32));
        doubled.min(MAX_TOOL_SOURCE_BACKOFF_MS)
    }

    /// Whether failed attempt `attempt` (from 1) is the last: the run
    /// pauses or fails instead of being tried again.
    pub fn exhausted(&self, attempt: u32) -> bool {
        attempt >= self.attempts.clamp(1, MAX_TOOL_SOURCE_ATTEMPTS)
    }

    /// The field's bounds: `attempts` in 1..=[`MAX_TOOL_SOURCE_ATTEMPTS`],
    /// `backoff_ms` at most [`MAX_TOOL_SOURCE_BACKOFF_MS`]. Errors: the
    /// field (under `on_tool_source_unavailable`) and why.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !(1..=MAX_TOOL_SOURCE_ATTEMPTS).contains(&self.attempts) {
            return Err((
                "attempts",
                format!("must be from 1 to {MAX_TOOL_SOURCE_ATTEMPTS}"),
            ));
        }
        if self.backoff_ms > MAX_TOOL_SOURCE_BACKOFF_MS {
            return Err((
                "backoff_ms",
                format!("must be at most {MAX_TOOL_SOURCE_BACKOFF_MS} ms"),
            ));
        }
        Ok(())
    }
}

/// What a run does once its tool source stayed unavailable for all its
/// attempts ([`ToolSourceUnavailable::then`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum UnavailableAction {
    /// Park at `paused` ([`crate::PauseReason::ToolSource`]) for an operator.
    #[default]
    Pause,
    /// Fail the run, naming the server and the cause.
    Fail,
}
