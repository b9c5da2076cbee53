//! Admission: what makes a request a run. The config a run admits (its own
//! or a registered agent's, [`resolve`]d), the checks it passes (validation,
//! the operator's catalogue, input guardrails), idempotency, and
//! `admit_run`, the one function that creates a run: `POST /v1/runs` and
//! each batch item go through it.

use std::collections::BTreeMap;

use axum::http::HeaderMap;
use chrono::Utc;
use glia_backends::{NewRun, RunSummary};
use glia_proto::{Event, EventKind, RunConfig, RunState};
use uuid::Uuid;

use crate::app::App;
use crate::error::ApiError;

use glia_proto::{AgentDefinition, AgentRef};

use crate::model::CreateRun;

pub(crate) fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let bad = |reason: &str| ApiError::InvalidHeader {
        name: "Idempotency-Key",
        reason: reason.to_owned(),
    };
    let s = v.to_str().map_err(|_| bad("not visible ASCII"))?.trim();
    if s.is_empty() || s.len() > 255 {
        return Err(bad("must be 1 to 255 characters"));
    }
    if !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad("must be visible ASCII without spaces"));
    }
    Ok(Some(s.to_owned()))
}

/// Most tags a run carries.
pub const MAX_TAGS: usize = 20;
/// Longest tag, and longest metadata key, in bytes.
pub const MAX_LABEL_BYTES: usize = 64;
/// Most metadata keys of a run.
pub const MAX_METADATA_KEYS: usize = 20;
/// Longest metadata value, in bytes.
pub const MAX_METADATA_VALUE_BYTES: usize = 256;

/// True for a tag or metadata key: 1 to [`MAX_LABEL_BYTES`] bytes of ASCII
/// letters, digits and `_ - . : / @` (safe in URLs, shells and file names
/// once quoted, and one meaning per byte).
fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_LABEL_BYTES
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:/@".contains(&b))
}

/// A run's `tags` and `metadata` checked against the limits of
/// `docs/limits.md`; answers the tags with repeats dropped (first kept).
/// `at` prefixes the field names (`""`, or `items[3].` for a batch item).
/// Errors: 422 naming the field (`tags`, `tags[2]`, `metadata`,
/// `metadata.KEY`).
pub(crate) fn check_labels(
    at: &str,
    tags: &[String],
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<String>, ApiError> {
    let invalid = |field: String, reason: String| ApiError::InvalidField {
        field: format!("{at}{field}"),
        reason,
    };
    let mut kept: Vec<String> = Vec::with_capacity(tags.len());
    for (i, tag) in tags.iter().enumerate() {
        if !is_label(tag) {
            return Err(invalid(
                format!("tags[{i}]"),
                format!(
                    "must be 1 to {MAX_LABEL_BYTES} bytes of ASCII letters, digits and _ - . : / @"
                ),
            ));
        }
        if !kept.contains(tag) {
            kept.push(tag.clone());
        }
    }
    if kept.len() > MAX_TAGS {
        return Err(invalid(
            "tags".into(),
            format!("{} tags; at most {MAX_TAGS}", kept.len()),
        ));
    }
    if metadata.len() > MAX_METADATA_KEYS {
        return Err(invalid(
            "metadata".into(),
            format!("{} keys; at most {MAX_METADATA_KEYS}", metadata.len()),
        ));
    }
    for (key, value) in metadata {
        if !is_label(key) {
            return Err(invalid(
                "metadata".into(),
                format!(
                    "key {key:?}: keys are 1 to {MAX_LABEL_BYTES} bytes of ASCII letters, digits and _ - . : / @"
                ),
            ));
        }
        if value.len() > MAX_METADATA_VALUE_BYTES {
            return Err(invalid(
                format!("metadata.{key}"),
                format!("{} bytes; at most {MAX_METADATA_VALUE_BYTES}", value.len()),
            ));
        }
        if value.chars().any(char::is_control) {
            return Err(invalid(
                format!("metadata.{key}"),
                "contains a control character".into(),
            ));
        }
    }
    Ok(kept)
}

/// Checks a worker would otherwise fail on late: the dispatcher refuses them
/// at admission, naming the field ([`RunConfig::validate`]: tool and output
/// schemas are compiled as JSON Schema).
pub(crate) fn validate_run(req: &CreateRun) -> Result<(), ApiError> {
    if req.goal.trim().is_empty() {
        return Err(ApiError::InvalidField {
            field: "goal".into(),
            reason: "is blank".into(),
        });
    }
    check_labels("", &req.tags, &req.metadata)?;
    if req.config.agent.is_some() {
        return Err(ApiError::InvalidField {
            field: "config.agent".into(),
            reason: "is set by the dispatcher: name the agent in `agent`".into(),
        });
    }
    if !req.config.child_agents.is_empty() {
        return Err(ApiError::InvalidField {
            field: "config.child_agents".into(),
            reason: "is set by the dispatcher from `agents`".into(),
        });
    }
    if req.config.start_at_ms.is_some() {
        return Err(ApiError::InvalidField {
            field: "config.start_at_ms".into(),
            reason: "is set by the dispatcher: give the start time in `start_at`".into(),
        });
    }
    if req.config.recorded_tools.is_some() {
        return Err(ApiError::InvalidField {
            field: "config.recorded_tools".into(),
            reason: "is set by the dispatcher: give the recording in `recorded_tools`".into(),
        });
    }
    if let Some(recorded) = &req.recorded_tools {
        recorded.validate().map_err(|e| ApiError::InvalidField {
            field: e.field,
            reason: e.reason,
        })?;
    }
    if let Some(at) = req.start_at {
        let ahead = at.timestamp_millis() - Utc::now().timestamp_millis();
        if ahead > glia_proto::wait::MAX_WAIT_MS {
            return Err(ApiError::InvalidField {
                field: "start_at".into(),
                reason: format!(
                    "{} is more than 366 days ahead, the longest wait",
                    at.to_rfc3339()
                ),
            });
        }
    }
    req.config.validate().map_err(|e| ApiError::InvalidField {
        field: format!("config.{}", e.field),
        reason: e.reason,
    })
}

/// The operator's catalogue check of a config (MCP servers, HTTP tool
/// origins, providers; see [`crate::App::admission`]). Errors: 422 naming
/// `config.{field}`.
pub(crate) fn catalogue_check(app: &App, config: &RunConfig) -> Result<(), ApiError> {
    match &app.admission {
        Some(admit) => admit(config).map_err(|e| ApiError::InvalidField {
            field: format!("config.{}", e.field),
            reason: e.reason,
        }),
        None => Ok(()),
    }
}

/// The config a run request admits: its `config`, or, with `agent`, the
/// resolved definition of the tenant's agent ([`resolve`]).
/// The one place a run's config is decided; every way of creating a run
/// goes through it. Errors: 422 `config` when both are given, 404 for an
/// unknown agent.
pub(crate) async fn run_config(
    app: &App,
    tenant: &str,
    req: &CreateRun,
) -> Result<RunConfig, ApiError> {
    let mut config = resolved_config(app, tenant, req).await?;
    // Issue 32: a delayed start rides in the frozen config (`session.start`
    // parks the run until then).
    config.start_at_ms = req.start_at.map(|at| at.timestamp_millis());
    // A replay's recording rides in it too: the worker answers from it.
    config.recorded_tools = req.recorded_tools.clone();
    Ok(config)
}

/// [`run_config`] before the start time: the request's config or agent.
async fn resolved_config(app: &App, tenant: &str, req: &CreateRun) -> Result<RunConfig, ApiError> {
    validate_run(req)?;
    let Some(agent) = &req.agent else {
        catalogue_check(app, &req.config)?;
        let mut config = req.config.clone();
        resolve_children(app, tenant, &mut config, "config.").await?;
        return Ok(config);
    };
    if req.config != RunConfig::default() {
        return Err(ApiError::InvalidField {
            field: "config".into(),
            reason: "cannot be combined with `agent` (the definition is the config)".into(),
        });
    }
    let mut config = resolve(app, tenant, agent).await?;
    config.validate().map_err(|e| ApiError::InvalidField {
        field: format!("agent ({agent}).{}", e.field),
        reason: e.reason,
    })?;
    resolve_children(app, tenant, &mut config, &format!("agent ({agent}).")).await?;
    if let Some(admit) = &app.admission {
        admit(&config).map_err(|e| ApiError::InvalidField {
            field: format!("agent ({agent}).{}", e.field),
            reason: e.reason,
        })?;
    }
    Ok(config)
}

/// 404 `batch_not_found` unless `batch` is a batch of `tenant`'s (one
/// submitted with `POST /v1/batches`): another tenant's batch and one that
/// does not exist answer the same, so the answer tells nothing of other
/// tenants (the run is never created in another tenant's batch, nor in a
/// batch nobody made).
pub(crate) async fn own_batch(app: &App, tenant: &str, batch: Uuid) -> Result<(), ApiError> {
    let found = match &app.batches.store {
        Some(store) => store.batch(Some(tenant), batch).await?.is_some(),
        None => false,
    };
    if found {
        Ok(())
    } else {
        Err(ApiError::BatchNotFound(batch))
    }
}

/// Admit `req` as a run of `tenant`: what `POST /v1/runs` does after
/// authentication, and what a batch's admission loop does for each item
/// (so a batch accepts exactly what a single submit accepts). Answers the
/// run and whether it was created (false: the idempotency key found an
/// earlier run with the same goal, config, batch, tags and metadata).
/// `custom_id`: the batch item's, recorded on its run. Errors: 422 for a
/// bad goal, config, tags or metadata, 409 `idempotency_conflict`, 503 when
/// the log fails.
pub(crate) async fn admit_run(
    app: &App,
    tenant: &str,
    key: Option<String>,
    req: &CreateRun,
    custom_id: Option<&str>,
) -> Result<(RunSummary, bool), ApiError> {
    let config = run_config(app, tenant, req).await?;
    let tags = check_labels("", &req.tags, &req.metadata)?;
    let run_id = Uuid::now_v7();
    // The goal is stored as the input redact rules leave it (so an
    // idempotent repeat is compared as redacted: goals that differ only in
    // what the rules remove are the same request).
    // A goal an input deny rule refuses is answered 422 and stored nowhere.
    let (goal, redactions) = screen_input(&config, "goal", &req.goal)?;
    let start = Event {
        run_id,
        seq: 1,
        at: Utc::now(),
        kind: EventKind::SessionStart {
            goal: goal.clone(),
            config: config.clone(),
            redactions,
        },
    };
    RunState::new(run_id)
        .apply(&start)
        .map_err(|e| ApiError::Invalid(e.to_string()))?;
    let new = NewRun {
        tenant: tenant.to_owned(),
        idempotency_key: key.clone(),
        batch_id: req.batch_id,
        start,
        tags,
        metadata: req.metadata.clone(),
        custom_id: custom_id.map(str::to_owned),
        parent_run_id: None,
        parent_call_id: None,
        depth: 0,
    };
    let tags = new.tags.clone();
    let (run, created) = app.log.create_run(new).await?;
    if !created {
        let first = app.log.events(run.run_id, 0, 1).await?;
        let same = match first.first().map(|e| &e.kind) {
            Some(EventKind::SessionStart {
                goal: first_goal,
                config: first,
                ..
            }) => {
                *first_goal == goal
                    && *first == config
                    && run.batch_id == req.batch_id
                    && run.tags == tags
                    && run.metadata == req.metadata
            }
            _ => false,
        };
        if !same {
            return Err(ApiError::IdempotencyConflict(key.unwrap_or_default()));
        }
        return Ok((run, false));
    }
    app.metrics().runs_admitted.inc();
    app.wake_relay();
    Ok((run, true))
}

/// `text` (a user's message for run `id`, in the body's `field`) screened
/// by the run's input guardrails (`Guardrails`, from its `session.start`;
/// see [`screen_input`]): the inbox never stores what the redact rules
/// remove, and `input.received` lists the rules. Errors: 422
/// `screened_input` when a deny rule refuses it, 503 when the log fails.
pub(crate) async fn redacted_input(
    app: &App,
    id: Uuid,
    field: &str,
    text: String,
) -> Result<(String, Vec<glia_proto::Redaction>), ApiError> {
    let first = app.log.events(id, 0, 1).await?;
    let Some(EventKind::SessionStart { config, .. }) = first.first().map(|e| &e.kind) else {
        return Ok((text, Vec::new()));
    };
    screen_input(config, field, &text)
}

/// `text` (a goal or user message, in the body's `field`) as the input
/// guardrails of `config` admit it: with the redact rules applied and what
/// matched, after the deny rules and `max_input_chars` passed the redacted
/// text (as the worker checks it). Errors: 422 `screened_input` naming the
/// field, the rule and the length, never the text (so a refused goal is
/// stored nowhere: not in the log, a run list or this answer).
pub(crate) fn screen_input(
    config: &RunConfig,
    field: &str,
    text: &str,
) -> Result<(String, Vec<glia_proto::Redaction>), ApiError> {
    let g = &config.guardrails;
    if g.input.is_empty() && g.max_input_chars.is_none() {
        return Ok((text.to_owned(), Vec::new()));
    }
    let compiled = g.compile().map_err(|e| ApiError::InvalidField {
        field: format!("config.guardrails.{}", e.field),
        reason: e.reason,
    })?;
    screen_compiled(&compiled, field, text)
}

/// [`screen_input`] with the guardrails compiled already.
pub(crate) fn screen_compiled(
    compiled: &glia_proto::guardrails::CompiledGuardrails,
    field: &str,
    text: &str,
) -> Result<(String, Vec<glia_proto::Redaction>), ApiError> {
    let (text, redactions) = compiled.redact_input(text);
    match compiled.check_input(&text) {
        Ok(()) => Ok((text, redactions)),
        Err((guardrail, reason)) => Err(ApiError::ScreenedInput {
            field: field.to_owned(),
            guardrail,
            reason,
            chars: text.chars().count(),
        }),
    }
}

/// The config of a run started from `agent` (`name`: the latest version;
/// `name@3`: version 3) of `tenant`, stamped with the version and its hash.
/// Errors: 422 naming `agent` for a malformed reference, 404
/// `agent_not_found` when the tenant has no such agent or version.
pub async fn resolve(app: &App, tenant: &str, agent: &str) -> Result<RunConfig, ApiError> {
    let bad = |reason: &str| ApiError::InvalidField {
        field: "agent".into(),
        reason: reason.to_owned(),
    };
    let (name, version) = match agent.split_once('@') {
        None => (agent, None),
        Some((name, v)) => (
            name,
            Some(
                v.parse::<u32>()
                    .ok()
                    .filter(|v| *v >= 1)
                    .ok_or_else(|| bad("the version after `@` must be a whole number from 1"))?,
            ),
        ),
    };
    if name.is_empty() {
        return Err(bad("names no agent (use `name` or `name@VERSION`)"));
    }
    let found = app
        .log
        .get_agent(tenant, name, version)
        .await?
        .ok_or_else(|| ApiError::AgentNotFound(agent.to_owned()))?;
    let def: AgentDefinition =
        glia_proto::strict::from_json_str(&found.definition).map_err(|e| {
            ApiError::Internal(format!(
                "agent {agent}: stored definition does not parse: {e}"
            ))
        })?;
    Ok(def.resolve(Some(AgentRef {
        name: found.name,
        version: found.version,
        content_hash: found.content_hash,
    })))
}

// ----- issue 32, child runs -----

/// Resolve `config.agents` for `tenant` and freeze them in
/// `config.child_agents` (name, version, content hash, description), so the
/// run never depends on the registry later (`docs/child-runs.md`). `at`
/// prefixes the field (`config.`, or `agent (NAME@N).`). Errors: 422
/// naming `{at}agents[i]` for a malformed name or an agent the tenant has
/// not registered (another tenant's answers the same), 503 when the
/// registry fails.
pub(crate) async fn resolve_children(
    app: &App,
    tenant: &str,
    config: &mut RunConfig,
    at: &str,
) -> Result<(), ApiError> {
    let mut frozen = Vec::with_capacity(config.agents.len());
    for (i, reference) in config.agents.iter().enumerate() {
        let field = format!("{at}agents[{i}]");
        let (name, version) =
            glia_proto::children::parse_agent_ref(reference).map_err(|reason| {
                ApiError::InvalidField {
                    field: field.clone(),
                    reason,
                }
            })?;
        let found = app
            .log
            .get_agent(tenant, name, version)
            .await?
            .ok_or_else(|| ApiError::InvalidField {
                field: field.clone(),
                reason: format!(
                    "no agent {reference:?} is registered for this tenant (glia agents list)"
                ),
            })?;
        let def: AgentDefinition =
            glia_proto::strict::from_json_str(&found.definition).map_err(|e| {
                ApiError::Internal(format!(
                    "agent {reference}: stored definition does not parse: {e}"
                ))
            })?;
        frozen.push(glia_proto::ChildAgent {
            name: found.name,
            version: found.version,
            content_hash: found.content_hash,
            description: def.description,
        });
    }
    config.child_agents = frozen;
    Ok(())
}
