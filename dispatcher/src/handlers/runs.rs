//! `/v1/runs`: admit, list, read a run and its events.

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use glia_backends::RunSummary;
use uuid::Uuid;

use crate::app::App;
use crate::auth::{Principal, Scope};
use crate::docs::RunSummaryDoc;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiPath, ApiQuery};

use crate::handlers::page;
use crate::model::*;

use crate::admission::{admit_run, idempotency_key, own_batch};
use crate::control::visible_run;

/// Admit a run.
///
/// Builds its `session.start` (run id: a new UUIDv7), validates it, and
/// writes the run, the event and its job atomically; answers only after the
/// commit. With an `Idempotency-Key` already used by the tenant: 200 with
/// that run (409 `idempotency_conflict` when goal, config or batch differ).
#[utoipa::path(post, path = "/v1/runs", tag = "runs", request_body = CreateRun,
    params(("Idempotency-Key" = Option<String>, Header, description = "Per-tenant idempotency key, 1 to 255 visible ASCII characters")),
    responses(
        (status = 201, description = "Admitted", body = RunSummaryDoc),
        (status = 200, description = "Idempotent repeat: the existing run", body = RunSummaryDoc),
        (status = 404, description = "`agent_not_found`: the tenant has no such agent or version; `batch_not_found`: `batch_id` names no batch of the tenant's", body = ErrorBody),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create_run(
    State(app): State<App>,
    p: Principal,
    headers: HeaderMap,
    ApiJson(req): ApiJson<CreateRun>,
) -> Result<Response, ApiError> {
    p.require(Scope::Submit)?;
    let key = idempotency_key(&headers)?;
    if let Some(batch) = req.batch_id {
        own_batch(&app, &p.tenant, batch).await?;
    }
    let (run, created) = admit_run(&app, &p.tenant, key, &req, None).await?;
    if !created {
        return Ok((StatusCode::OK, Json(run)).into_response());
    }
    let location = HeaderValue::from_str(&format!("/v1/runs/{}", run.run_id))
        .expect("a uuid path is a valid header");
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(run),
    )
        .into_response())
}

/// List runs visible to the caller, newest first, with filters and a cursor.
///
/// Every filter given must match (`tag` and `meta` repeat). A page holds
/// at most `limit` runs; `next_cursor`, passed as `cursor` with the same
/// filters, gives the next (older) runs; it is null on the last page.
/// Runs admitted meanwhile never shift later pages (they are newer).
#[utoipa::path(get, path = "/v1/runs", tag = "runs", params(ListRunsQuery),
    responses((status = 200, body = RunPage), (status = 400, description = "`invalid_query`: a parameter of the wrong shape, unknown, repeated, or a cursor this API did not issue; `field` names it", body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_runs(
    State(app): State<App>,
    p: Principal,
    RawQuery(query): RawQuery,
) -> Result<Json<RunPage>, ApiError> {
    let q = ListRunsQuery::parse(query.as_deref())?;
    let limit = page(q.limit, &app)?;
    let tenant = if p.is_admin() {
        q.tenant.clone()
    } else {
        Some(p.tenant.clone())
    };
    let filter = q.filter(tenant, limit)?;
    let runs = app.log.list_runs(&filter).await?;
    let next_cursor = (runs.len() == limit)
        .then(|| runs.last().map(|r| run_cursor::encode(r.run_id)))
        .flatten();
    Ok(Json(RunPage { runs, next_cursor }))
}

/// One run's summary.
#[utoipa::path(get, path = "/v1/runs/{id}", tag = "runs", params(("id" = Uuid, Path, description = "Run id")),
    responses((status = 200, body = RunSummaryDoc), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_run(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<RunSummary>, ApiError> {
    Ok(Json(visible_run(&app, &p, id).await?))
}

/// A page of a run's events with `seq > after`.
#[utoipa::path(get, path = "/v1/runs/{id}/events", tag = "runs", params(("id" = Uuid, Path, description = "Run id"), EventsQuery),
    responses((status = 200, body = EventPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_events(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
    ApiQuery(q): ApiQuery<EventsQuery>,
) -> Result<Json<EventPage>, ApiError> {
    let limit = page(q.limit, &app)?;
    let run = visible_run(&app, &p, id).await?;
    let after = q.after.unwrap_or(0);
    let events = app.log.events(id, after, limit).await?;
    let next_after = events.last().map_or(after, |e| e.seq);
    Ok(Json(EventPage {
        head_seq: run.head_seq.max(next_after),
        events,
        next_after,
    }))
}
