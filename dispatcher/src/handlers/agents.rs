//! The agent registry over HTTP: `PUT /v1/agents/{name}` registers a
//! definition as an immutable version (scope `agents` or `admin`), `GET
//! /v1/agents`, `GET /v1/agents/{name}` (the latest version) and `GET
//! /v1/agents/{name}/versions/{version}`. ([`crate::admission::resolve`] turns a
//! run request's `agent: "name"` or `"name@3"` into the run's config.)
//!
//! Definitions belong to the caller's tenant. A definition is checked
//! whole before anything is stored: unknown fields (a `command`, an `url`)
//! and wrong types are refused by the document's schema and by serde
//! (`deny_unknown_fields`), regexes and JSON Schemas are compiled
//! ([`AgentDefinition::validate`]), and the run config it resolves to gets
//! the admission a run gets (every tool name it writes resolves to a tool
//! it offers, exactly; the operator's catalogue has its MCP servers,
//! permits their tools and allows its HTTP tools' origins); each refusal is
//! a 422 naming the field.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use glia_backends::AgentVersion;
use glia_proto::{AgentDefinition, canonical_json};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::app::App;
use crate::auth::{Principal, Scope};
use crate::docs::AgentDefinitionDoc;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiPath};
use crate::model::Documented;

impl Documented for AgentDefinition {
    const SCHEMA: &'static str = "AgentDefinition";
}

/// One registered version of an agent.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentBody {
    /// Agent name.
    pub name: String,
    /// Version, from 1.
    pub version: u32,
    /// `sha256:` and the hex SHA-256 of the definition's canonical JSON.
    pub content_hash: String,
    /// When this version was registered.
    pub created_at: DateTime<Utc>,
    /// The definition, with defaults written out.
    #[schema(value_type = AgentDefinitionDoc)]
    pub definition: Value,
}

/// The tenant's agents, the latest version of each, by name.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AgentList {
    /// The agents.
    pub agents: Vec<AgentBody>,
}

fn body(v: AgentVersion) -> Result<AgentBody, ApiError> {
    let definition = serde_json::from_str(&v.definition).map_err(|e| {
        ApiError::Internal(format!(
            "agent {}@{}: stored definition: {e}",
            v.name, v.version
        ))
    })?;
    Ok(AgentBody {
        name: v.name,
        version: v.version,
        content_hash: v.content_hash,
        created_at: v.created_at,
        definition,
    })
}

fn read_scope(p: &Principal) -> Result<(), ApiError> {
    p.require_any(&[Scope::Submit, Scope::Approve, Scope::Agents])
}

/// Register a version of an agent definition.
///
/// The body is the definition (the name in it must equal the path's). The
/// same content as the latest version answers 200 with that version and
/// writes nothing; other content becomes the next version (201).
#[utoipa::path(put, path = "/v1/agents/{name}", tag = "agents", request_body = AgentDefinitionDoc,
    params(("name" = String, Path, description = "Agent name, `^[a-z0-9][a-z0-9_-]{0,63}$`")),
    responses(
        (status = 201, description = "A new version", body = AgentBody),
        (status = 200, description = "Unchanged: the latest version has this content", body = AgentBody),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put_agent(
    State(app): State<App>,
    p: Principal,
    ApiPath(name): ApiPath<String>,
    ApiJson(def): ApiJson<AgentDefinition>,
) -> Result<Response, ApiError> {
    p.require(Scope::Agents)?;
    if def.name != name {
        return Err(ApiError::InvalidField {
            field: "name".into(),
            reason: format!("{:?} differs from the path's {name:?}", def.name),
        });
    }
    def.validate().map_err(|e| ApiError::InvalidField {
        field: e.field,
        reason: e.reason,
    })?;
    // The same admission a run started from it gets (tool names resolve,
    // the catalogue has its servers, allows its tools and HTTP origins):
    // a definition no run could start from is refused now, not at submit.
    let config = def.resolve(None);
    let invalid = |e: glia_proto::ConfigError| ApiError::InvalidField {
        field: e.field,
        reason: e.reason,
    };
    config.validate().map_err(invalid)?;
    if let Some(admit) = &app.admission {
        admit(&config).map_err(invalid)?;
    }
    let canonical =
        canonical_json(&serde_json::to_value(&def).map_err(|e| ApiError::Internal(e.to_string()))?);
    let (version, created) = app
        .log
        .put_agent(&p.tenant, &name, &canonical, &def.content_hash())
        .await?;
    if created {
        tracing::info!(tenant = %p.tenant, agent = %name, version = version.version, "agent version registered");
    }
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(body(version)?)).into_response())
}

/// The tenant's agents: the latest version of each, by name.
#[utoipa::path(get, path = "/v1/agents", tag = "agents",
    responses((status = 200, body = AgentList), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_agents(
    State(app): State<App>,
    p: Principal,
) -> Result<Json<AgentList>, ApiError> {
    read_scope(&p)?;
    let agents = app
        .log
        .list_agents(&p.tenant)
        .await?
        .into_iter()
        .map(body)
        .collect::<Result<_, _>>()?;
    Ok(Json(AgentList { agents }))
}

/// The latest version of an agent.
#[utoipa::path(get, path = "/v1/agents/{name}", tag = "agents", params(("name" = String, Path, description = "Agent name")),
    responses((status = 200, body = AgentBody), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_agent(
    State(app): State<App>,
    p: Principal,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<AgentBody>, ApiError> {
    read_scope(&p)?;
    let v = app
        .log
        .get_agent(&p.tenant, &name, None)
        .await?
        .ok_or_else(|| ApiError::AgentNotFound(name.clone()))?;
    Ok(Json(body(v)?))
}

/// One version of an agent.
#[utoipa::path(get, path = "/v1/agents/{name}/versions/{version}", tag = "agents",
    params(("name" = String, Path, description = "Agent name"), ("version" = u32, Path, description = "Version, from 1")),
    responses((status = 200, body = AgentBody), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_version(
    State(app): State<App>,
    p: Principal,
    ApiPath((name, version)): ApiPath<(String, u32)>,
) -> Result<Json<AgentBody>, ApiError> {
    read_scope(&p)?;
    let v = app
        .log
        .get_agent(&p.tenant, &name, Some(version))
        .await?
        .ok_or_else(|| ApiError::AgentNotFound(format!("{name}@{version}")))?;
    Ok(Json(body(v)?))
}
