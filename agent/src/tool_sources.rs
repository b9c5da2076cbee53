//! The tools a run's config names from outside the worker's registry: MCP
//! server tools ([`crate::mcp`]) and HTTP tools ([`crate::http_tool`]),
//! under the operator's [`Catalogue`]. [`ToolSources::offered`] turns a
//! config's sources into the [`ToolSpec`]s a step offers (each with its
//! [`ToolSource`], so the step's frozen tool list says where every call
//! goes); [`ToolSources::execute`] runs a call of one.
//!
//! Defaults and policy ([`mcp_policy`]): an MCP tool needs approval when
//! annotated `destructiveHint: true`; from a server the catalogue marks
//! `trust = "trusted"` it is idempotent when annotated `readOnlyHint` or
//! `idempotentHint` (and a read-only one is not destructive), from an
//! untrusted one (the default) never on its own word; it has a 30 s
//! idle timeout (each progress report starts it again) and a total bound
//! of [`DEFAULT_MAX_TOTAL_FACTOR`](glia_proto::tool_sources::DEFAULT_MAX_TOTAL_FACTOR)
//! × that (`tool_policy.NAME.max_total_ms`). An HTTP tool takes its own fields. `RunConfig::tool_policy`
//! overrides any of these per tool name; the catalogue's per-tool
//! `policy` then overrides the tenant, only towards stricter. Each offered
//! tool carries its [`ResolvedPolicy`] and who decided it.

use std::time::Duration;

use glia_proto::tool_names::{provider_tool_name, same_tool};
use glia_proto::{
    ConfigError, McpToolHints, PolicyOrigin, ResolvedPolicy, RunConfig, ToolContent, ToolErrorKind,
    ToolOutputSchema, ToolSource, ToolSpec, args_hash, tool_sources::resolve_max_total_ms,
};
use rmcp::model::ToolAnnotations;
use serde_json::Value;

use crate::catalogue::{Catalogue, McpServerEntry, OperatorPolicy, Trust};
use crate::http_tool::{HttpCall, HttpTools};
use crate::mcp::{CallLimits, McpHub};
use crate::tool::{ToolContext, ToolFailure};

/// Default timeout of an MCP tool call, in ms.
pub const DEFAULT_MCP_TIMEOUT_MS: u64 = 30_000;

/// Default of [`ToolSources::with_tool_wait`]: how long a step waits for a
/// tool the run allows and its server does not list yet, 10 s.
pub const DEFAULT_TOOL_WAIT: Duration = Duration::from_secs(10);

/// Why a step's tools could not be assembled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OfferError {
    /// A server could not list its tools (down, slow, broken), or cut its
    /// list short before a tool the run allows: the run records
    /// `tool_source.unavailable` and is tried again later
    /// (`RunConfig::on_tool_source_unavailable`).
    #[error("{reason}")]
    Unavailable {
        /// The catalogue name of the server.
        server: String,
        /// Why, naming the server.
        reason: String,
    },
    /// The config cannot work on this fleet (two tools with one name, a
    /// server the catalogue lacks, an allowed tool its server does not
    /// offer or offers with an unusable schema): the run fails with this
    /// reason.
    #[error("{0}")]
    Invalid(String),
}

/// Who speaks for the tenant in `config`: the agent definition it was
/// resolved from, or the run's own config.
pub fn tenant_origin(config: &RunConfig) -> PolicyOrigin {
    if config.agent.is_some() {
        PolicyOrigin::Agent
    } else {
        PolicyOrigin::Run
    }
}

/// The resolved policy of MCP tool `name` (the server's own name, or its
/// provider-safe form: either names it) of the server `entry`, listed
/// with `hints`: annotations (believed only from a trusted server, except
/// `destructiveHint: true`, which always asks for approval), then the
/// tenant's `tool_policy`, then the operator's `policy`, which only makes
/// it stricter.
pub fn mcp_policy(
    config: &RunConfig,
    entry: &McpServerEntry,
    name: &str,
    hints: Option<&ToolAnnotations>,
) -> ResolvedPolicy {
    let trusted = entry.trust == Trust::Trusted;
    let hint = |h: Option<bool>| h == Some(true);
    let read_only = hint(hints.and_then(|a| a.read_only_hint));
    // A trusted read-only tool is not destructive whatever it says; from an
    // untrusted server `destructiveHint: true` counts whatever else it says.
    let destructive = hint(hints.and_then(|a| a.destructive_hint)) && !(trusted && read_only);
    let idempotent = trusted && (read_only || hint(hints.and_then(|a| a.idempotent_hint)));
    let annotated = |yes: bool| {
        if yes {
            PolicyOrigin::Annotation
        } else {
            PolicyOrigin::Default
        }
    };
    let mut p = ResolvedPolicy {
        requires_approval: destructive,
        approval_by: annotated(destructive),
        idempotent,
        idempotent_by: annotated(idempotent),
        trusted_server: Some(trusted),
    };
    let tenant = config
        .tool_policy_for(&provider_tool_name(name))
        .cloned()
        .unwrap_or_default();
    if let Some(requires_approval) = tenant.requires_approval {
        (p.requires_approval, p.approval_by) = (requires_approval, tenant_origin(config));
    }
    if let Some(idempotent) = tenant.idempotent {
        (p.idempotent, p.idempotent_by) = (idempotent, tenant_origin(config));
    }
    match entry.policy_for(name) {
        Some(OperatorPolicy::RequireApproval) => {
            (p.requires_approval, p.approval_by) = (true, PolicyOrigin::Operator)
        }
        Some(OperatorPolicy::RequireApprovalNoRetry) => {
            (p.requires_approval, p.approval_by) = (true, PolicyOrigin::Operator);
            (p.idempotent, p.idempotent_by) = (false, PolicyOrigin::Operator);
        }
        None => {}
    }
    p
}

/// The operator's per-tool names of server `server` resolve against the
/// tools it lists now, exactly (a tool's own name or its provider-safe
/// form, [`same_tool`]): a `policy` entry for a tool the server does
/// not list would gate nothing (a typo, or a renamed tool), and a
/// `tools_deny` entry that differs from a listed tool only in case or
/// `-`/`_` would deny nothing. Either is [`OfferError::Invalid`] naming the
/// catalogue key: runs using the server fail rather than run ungated.
fn check_operator_names(
    server: &str,
    entry: &McpServerEntry,
    listed: &[rmcp::model::Tool],
) -> Result<(), OfferError> {
    let names: Vec<&str> = listed.iter().map(|t| t.name.as_ref()).collect();
    if let Some(tool) = entry
        .policy
        .keys()
        .find(|t| !names.iter().any(|n| same_tool(n, t)))
    {
        let hint = glia_proto::config::nearest(tool, &names)
            .map(|n| format!("; did you mean {n:?}?"))
            .unwrap_or_default();
        return Err(OfferError::Invalid(format!(
            "mcp_servers.{server}.policy.{tool}: the operator's catalogue sets a policy for a tool MCP server {server:?} does not offer (names match exactly){hint}"
        )));
    }
    if let Some((tool, near)) = entry
        .tools_deny
        .iter()
        .filter(|t| !names.iter().any(|n| same_tool(n, t)))
        .find_map(|t| glia_proto::config::near_miss(t, &names).map(|n| (t, n)))
    {
        return Err(OfferError::Invalid(format!(
            "mcp_servers.{server}.tools_deny: {tool:?} differs from the server's tool {near:?} only in case or `-`/`_`, so it denies nothing (names match exactly)"
        )));
    }
    Ok(())
}

/// The catalogue, its MCP servers and the HTTP tools' client: one per worker.
pub struct ToolSources {
    catalogue: Catalogue,
    mcp: McpHub,
    http: HttpTools,
    connect_wait: Duration,
    tool_wait: Duration,
    list_timeout: Duration,
}

impl ToolSources {
    /// Start the catalogue's MCP servers ([`McpHub::start`]). Needs a Tokio runtime.
    pub fn start(catalogue: Catalogue) -> ToolSources {
        let mcp = McpHub::start(&catalogue);
        ToolSources {
            catalogue,
            mcp,
            http: HttpTools::new(),
            connect_wait: Duration::from_secs(10),
            tool_wait: DEFAULT_TOOL_WAIT,
            list_timeout: crate::mcp::LIST_TIMEOUT,
        }
    }

    /// The deadline of one server's listing (every `tools/list` page of
    /// it), past which the step's tools are unavailable. Default
    /// [`crate::mcp::LIST_TIMEOUT`] (30 s).
    pub fn with_list_timeout(mut self, deadline: Duration) -> Self {
        self.list_timeout = deadline;
        self
    }

    /// How long assembling a step's tools waits for a tool the run allows
    /// that its server does not list yet: it lists again on each
    /// `notifications/tools/list_changed` until the tool is there or the
    /// wait ends (then the run fails naming `mcp[i].allow[j]`). Only for a
    /// server that announces list changes (`capabilities.tools.listChanged`);
    /// another fails at once. Default [`DEFAULT_TOOL_WAIT`].
    pub fn with_tool_wait(mut self, wait: Duration) -> Self {
        self.tool_wait = wait;
        self
    }

    /// How long assembling a step's tools waits for a server that is not
    /// connected (starting, or restarting after it died). Default 10 s.
    pub fn with_connect_wait(mut self, wait: Duration) -> Self {
        self.connect_wait = wait;
        self
    }

    /// The catalogue.
    pub fn catalogue(&self) -> &Catalogue {
        &self.catalogue
    }

    /// The MCP servers.
    pub fn mcp(&self) -> &McpHub {
        &self.mcp
    }

    /// [`Catalogue::admit`].
    pub fn admit(&self, config: &RunConfig) -> Result<(), ConfigError> {
        self.catalogue.admit(config)
    }

    /// Stop the MCP servers.
    pub async fn shutdown(&self) {
        self.mcp.shutdown().await;
    }

    /// The specs of every MCP tool (`tools/list` now, filtered by each
    /// source's allow list, in allow-list order; an allowed tool the server
    /// does not list is an [`OfferError::Invalid`] naming `mcp[i].allow[j]`) and HTTP tool `config` names, with
    /// annotations and `tool_policy` applied. An MCP tool is offered under
    /// its provider-safe name ([`provider_tool_name`]) and keeps its own in
    /// [`ToolSource::Mcp`]'s `tool`, which is what the server is called
    /// with; an allow entry may name it either way. Two tools offered under
    /// one name are an [`OfferError::Invalid`] naming both
    /// ([`glia_proto::tool_names::ToolNameClash`]).
    pub async fn offered(&self, config: &RunConfig) -> Result<Vec<ToolSpec>, OfferError> {
        let mut specs = Vec::new();
        for (i, source) in config.mcp.iter().enumerate() {
            if !self.mcp.has(&source.server) {
                return Err(OfferError::Invalid(format!(
                    "MCP server {:?} is not in this worker's catalogue",
                    source.server
                )));
            }
            let entry = self
                .catalogue
                .mcp_servers
                .get(&source.server)
                .ok_or_else(|| {
                    OfferError::Invalid(format!(
                        "mcp[{i}].server: MCP server {:?} is not in this worker's catalogue",
                        source.server
                    ))
                })?;
            let listed = self.list_allowed(i, source, entry).await?;
            for (j, name) in source.allow.iter().enumerate() {
                let tool = listed
                    .iter()
                    .find(|t| same_tool(&t.name, name))
                    .expect("list_allowed found every allowed tool");
                let input_schema = Value::Object((*tool.input_schema).clone());
                if let Err(reason) = glia_proto::compile_tool_schema(&input_schema) {
                    return Err(OfferError::Invalid(format!(
                        "mcp[{i}].allow[{j}]: the input schema MCP server {:?} gives tool {name:?} is not usable: {reason}",
                        source.server
                    )));
                }
                let original: &str = &tool.name;
                if !entry.permits(original) {
                    return Err(OfferError::Invalid(format!(
                        "mcp[{i}].allow[{j}]: {}",
                        entry.refusal(&source.server, original)
                    )));
                }
                let offered_name = provider_tool_name(original).into_owned();
                let policy = mcp_policy(config, entry, original, tool.annotations.as_ref());
                let output_schema = match &tool.output_schema {
                    None => None,
                    Some(schema) => {
                        let schema = Value::Object((**schema).clone());
                        if let Err(e) = jsonschema::validator_for(&schema) {
                            return Err(OfferError::Invalid(format!(
                                "mcp[{i}].allow[{j}]: the outputSchema MCP server {:?} gives tool {name:?} is not usable: {e}",
                                source.server
                            )));
                        }
                        Some(ToolOutputSchema {
                            schema,
                            check: config
                                .tool_policy_for(&offered_name)
                                .and_then(|p| p.output_schema)
                                .unwrap_or_default(),
                        })
                    }
                };
                let tenant = config
                    .tool_policy_for(&offered_name)
                    .cloned()
                    .unwrap_or_default();
                let description = tool
                    .description
                    .as_deref()
                    .map(str::to_owned)
                    .or_else(|| tool.title.clone())
                    .unwrap_or_default();
                let timeout_ms = tenant.timeout_ms.unwrap_or(DEFAULT_MCP_TIMEOUT_MS);
                let max_total_ms =
                    resolve_max_total_ms(timeout_ms, tenant.max_total_ms).map_err(|reason| {
                        OfferError::Invalid(format!("tool_policy.{name}.max_total_ms: {reason}"))
                    })?;
                specs.push(ToolSpec {
                    idempotent: policy.idempotent,
                    timeout_ms,
                    return_direct: tenant.return_direct.unwrap_or(false),
                    source: Some(ToolSource::Mcp {
                        server: source.server.clone(),
                        tool: original.to_owned(),
                        schema_hash: args_hash(&input_schema),
                        requires_approval: policy.requires_approval,
                        max_total_ms: Some(max_total_ms),
                        hints: tool.annotations.as_ref().map(|a| McpToolHints {
                            title: a.title.clone(),
                            read_only_hint: a.read_only_hint,
                            destructive_hint: a.destructive_hint,
                            idempotent_hint: a.idempotent_hint,
                            open_world_hint: a.open_world_hint,
                        }),
                    }),
                    policy: Some(policy),
                    output_schema,
                    ..ToolSpec::new(offered_name, description, input_schema)
                });
            }
        }
        for tool in &config.http_tools {
            let policy = config
                .tool_policy_for(&tool.name)
                .cloned()
                .unwrap_or_default();
            let tenant = tenant_origin(config);
            let resolved = ResolvedPolicy {
                requires_approval: policy.requires_approval.unwrap_or(false),
                approval_by: if policy.requires_approval.is_some() {
                    tenant
                } else {
                    PolicyOrigin::Default
                },
                idempotent: policy.idempotent.unwrap_or(tool.idempotent),
                idempotent_by: if policy.idempotent.is_some() || tool.idempotent {
                    tenant
                } else {
                    PolicyOrigin::Default
                },
                trusted_server: None,
            };
            specs.push(ToolSpec {
                idempotent: resolved.idempotent,
                timeout_ms: policy.timeout_ms.unwrap_or(tool.timeout_ms),
                return_direct: policy.return_direct.unwrap_or(false),
                source: Some(ToolSource::Http {
                    url: tool.url.clone(),
                    max_response_bytes: tool.max_response_bytes,
                    requires_approval: resolved.requires_approval,
                }),
                policy: Some(resolved),
                ..ToolSpec::new(
                    tool.name.clone(),
                    tool.description.clone(),
                    tool.input_schema.clone(),
                )
            });
        }
        glia_proto::ToolSpec::check_distinct(&specs)
            .map_err(|clash| OfferError::Invalid(clash.to_string()))?;
        if let Some(output) = specs.iter().find(|s| s.name == glia_proto::OUTPUT_TOOL) {
            return Err(OfferError::Invalid(format!(
                "{} would be offered as {:?}, the name of the output schema's tool",
                output.describe(),
                glia_proto::OUTPUT_TOOL
            )));
        }
        Ok(specs)
    }

    /// The tools server `source.server` lists, holding every tool
    /// `source.allow` names (it is `mcp[i]`). A tool not listed yet is
    /// waited for ([`Self::with_tool_wait`]). Errors:
    /// [`OfferError::Unavailable`] when the server cannot list, or cut its
    /// list short before an allowed tool or a tool the operator's policy
    /// names; [`OfferError::Invalid`] naming `mcp[i].allow[j]` for a tool a
    /// whole list lacks after the wait, or the catalogue key a whole list
    /// contradicts ([`check_operator_names`]).
    async fn list_allowed(
        &self,
        i: usize,
        source: &glia_proto::McpToolSource,
        entry: &McpServerEntry,
    ) -> Result<Vec<rmcp::model::Tool>, OfferError> {
        let server = &source.server;
        let started = tokio::time::Instant::now();
        loop {
            let since = self.mcp.list_generation(server);
            let listing = self
                .mcp
                .list_tools_within(server, self.connect_wait, self.list_timeout)
                .await
                .map_err(|reason| OfferError::Unavailable {
                    server: server.clone(),
                    reason,
                })?;
            let cut_short = |e: OfferError, why: &str| match e {
                OfferError::Invalid(reason) => OfferError::Unavailable {
                    server: server.clone(),
                    reason: format!(
                        "{reason}; but its tool list was cut short ({why}), so the tool may exist"
                    ),
                },
                other => other,
            };
            let missing = source
                .allow
                .iter()
                .position(|name| !listing.tools.iter().any(|t| same_tool(&t.name, name)));
            let left = self.tool_wait.saturating_sub(started.elapsed());
            if missing.is_some()
                && listing.cut.is_none()
                && listing.announces_changes
                && !left.is_zero()
                && self.mcp.list_changed(server, since, left).await
            {
                continue;
            }
            if let Err(e) = check_operator_names(server, entry, &listing.tools) {
                return Err(match &listing.cut {
                    Some(why) => cut_short(e, why),
                    None => e,
                });
            }
            // Two listed tools one allow entry could name (a name and a tool
            // literally called by its provider-safe form) are never resolved
            // by list order: the run is refused, naming both.
            for (j, name) in source.allow.iter().enumerate() {
                let first = listing.tools.iter().find(|t| same_tool(&t.name, name));
                let other = first.and_then(|a| {
                    listing
                        .tools
                        .iter()
                        .find(|t| t.name != a.name && same_tool(&t.name, name))
                });
                if let (Some(a), Some(b)) = (first, other) {
                    return Err(OfferError::Invalid(format!(
                        "mcp[{i}].allow[{j}]: MCP server {server:?} lists two tools the name {name:?} could mean, {:?} and {:?} (both offered to the model as {:?}); rename one at the server",
                        a.name,
                        b.name,
                        provider_tool_name(name)
                    )));
                }
            }
            let Some(j) = missing else {
                return Ok(listing.tools);
            };
            // A tool the run allows but cannot be offered is the run's
            // error, named: left out, the model would go on without it
            // and the run could "succeed" at a goal it never reached.
            let name = &source.allow[j];
            let offered: Vec<&str> = listing.tools.iter().map(|t| t.name.as_ref()).collect();
            let waited = if listing.announces_changes && listing.cut.is_none() {
                format!(
                    "; waited {} ms for its list to change",
                    started.elapsed().as_millis()
                )
            } else {
                String::new()
            };
            let e = OfferError::Invalid(format!(
                "mcp[{i}].allow[{j}]: MCP server {server:?} offers no tool {name:?} (it offers: {}){waited}",
                offered.join(", ")
            ));
            return Err(match &listing.cut {
                Some(why) => cut_short(e, why),
                None => e,
            });
        }
    }

    /// Run one call of `spec` (which has a [`ToolSource`]) within its
    /// timeout (for an MCP tool with a recorded `max_total_ms`, an idle
    /// timeout that each progress report starts again, up to that total);
    /// `progress` gets each progress report's text. Errors: the
    /// [`ToolFailure`] the model sees.
    pub async fn execute(
        &self,
        spec: &ToolSpec,
        input: Value,
        ctx: &ToolContext,
        progress: &(dyn Fn(String) + Send + Sync),
    ) -> Result<ToolContent, ToolFailure> {
        let timeout = Duration::from_millis(spec.timeout_ms.max(1));
        match &spec.source {
            Some(ToolSource::Mcp {
                server,
                tool,
                max_total_ms,
                ..
            }) => {
                let limits = CallLimits {
                    idle: timeout,
                    total: max_total_ms.map(|ms| Duration::from_millis(ms.max(spec.timeout_ms))),
                };
                let result = self
                    .mcp
                    .call(server, tool, input, &ctx.idempotency_key, limits, progress)
                    .await?;
                crate::mcp::render_for(spec, result)
            }
            Some(ToolSource::Http {
                url,
                max_response_bytes,
                ..
            }) => {
                let allowed = glia_proto::tool_sources::url_origin(url)
                    .is_ok_and(|o| self.catalogue.origin_allowed(&o));
                if !allowed {
                    return Err(ToolFailure {
                        kind: ToolErrorKind::Denied,
                        message: format!(
                            "HTTP tool {}: {url} is not at an origin the catalogue allows",
                            spec.name
                        ),
                    });
                }
                let call = HttpCall {
                    tool: &spec.name,
                    url,
                    input: &input,
                    idempotency_key: &ctx.idempotency_key,
                    idempotent: spec.idempotent,
                    timeout,
                    max_response_bytes: *max_response_bytes,
                };
                self.http.call(call).await.map(ToolContent::from)
            }
            None => Err(ToolFailure {
                kind: ToolErrorKind::Unavailable,
                message: format!("tool {} has no source on this worker", spec.name),
            }),
            // A recording answers its tools in the loop; nothing runs them.
            Some(ToolSource::Recorded { .. }) => Err(ToolFailure {
                kind: ToolErrorKind::Unavailable,
                message: format!("tool {} is answered from the run's recording", spec.name),
            }),
            // Issue 32: an agent tool starts a child run; no worker runs it.
            Some(ToolSource::Agent { agent, .. }) => Err(ToolFailure {
                kind: ToolErrorKind::Unavailable,
                message: format!(
                    "tool {} is the agent {agent}: a child run answers it",
                    spec.name
                ),
            }),
        }
    }
}
