//! `/v1/schedules`: create, list, get (with the next fire times), patch,
//! delete, pause, unpause, backfill. See [`crate::schedules`].

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use glia_backends::schedules::{Saved, Schedule};
use uuid::Uuid;

use crate::app::App;
use crate::auth::{Principal, Scope};
use crate::batches::tenant_of;
use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::handlers::page;
use crate::schedules::*;

/// The schedule `id` if `p` sees it; another tenant's is 404 like a missing one.
async fn visible(app: &App, p: &Principal, id: Uuid) -> Result<Schedule, ApiError> {
    store(app)?
        .schedule(tenant_of(p), id)
        .await?
        .ok_or(ApiError::ScheduleNotFound(id))
}

/// True when the fire times of `a` and `b` are the same rule.
fn same_timing(a: &CreateSchedule, b: &CreateSchedule) -> bool {
    (&a.cron, &a.time_zone, a.interval_ms, a.anchor)
        == (&b.cron, &b.time_zone, b.interval_ms, b.anchor)
}

/// Write `next` (read at its revision) and answer its view; a concurrent
/// writer makes it [`Saved::Stale`] (`None`: read and try again).
async fn save(app: &App, next: &Schedule) -> Result<Option<ScheduleView>, ApiError> {
    match store(app)?.save(next).await? {
        Saved::Saved(s) => Ok(Some(view(&s, 0, Utc::now())?)),
        Saved::Stale => Ok(None),
        Saved::NameTaken => Err(ApiError::ScheduleExists(next.name.clone())),
    }
}

/// Create a schedule of the caller's tenant. The definition is checked as
/// `POST /v1/runs` checks a run (the goal rendered for the next fire time,
/// the config or the tenant's agent, tags, metadata) besides the cron
/// expression, zone or interval and the bounds; nothing is stored when a
/// check fails (422 naming the field). Fire times count from now.
#[utoipa::path(post, path = "/v1/schedules", tag = "schedules", request_body = CreateSchedule,
    responses((status = 201, description = "Created", body = ScheduleView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "`schedule_exists`: the tenant has a schedule of this name", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(app): State<App>,
    p: Principal,
    ApiJson(mut def): ApiJson<CreateSchedule>,
) -> Result<Response, ApiError> {
    p.require(Scope::Submit)?;
    let store = store(&app)?;
    let id = Uuid::now_v7();
    let timing = check(&app, &p.tenant, id, &mut def).await?;
    let now = Utc::now();
    let s = Schedule {
        id,
        tenant: p.tenant.clone(),
        name: def.name.clone(),
        spec: serde_json::to_string(&def)
            .map_err(|e| ApiError::Internal(format!("a schedule serialises: {e}")))?,
        paused: def.paused,
        cursor: now,
        next_due_at: next_due(&timing, id, &def, now),
        last_run_id: None,
        buffered: None,
        last_error: None,
        revision: 0,
        created_at: now,
        updated_at: now,
    };
    let created = match store.create(&s).await? {
        Saved::Saved(s) => s,
        Saved::NameTaken => return Err(ApiError::ScheduleExists(s.name)),
        Saved::Stale => return Err(ApiError::Internal(format!("schedule id {id} taken"))),
    };
    tracing::info!(schedule_id = %id, tenant = %p.tenant, name = %created.name, "schedule created");
    let location = HeaderValue::from_str(&format!("/v1/schedules/{id}"))
        .expect("a uuid path is a valid header");
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(view(&created, NEXT_FIRE_TIMES, now)?),
    )
        .into_response())
}

/// The caller's schedules (an admin's: every tenant's), by id.
#[utoipa::path(get, path = "/v1/schedules", tag = "schedules", params(ListSchedulesQuery),
    responses((status = 200, body = SchedulePage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(app): State<App>,
    p: Principal,
    ApiQuery(q): ApiQuery<ListSchedulesQuery>,
) -> Result<Json<SchedulePage>, ApiError> {
    let limit = page(q.limit, &app)?;
    let found = store(&app)?
        .schedules(tenant_of(&p), q.after, limit)
        .await?;
    let next = (found.len() == limit)
        .then(|| found.last().map(|s| s.id))
        .flatten();
    let now = Utc::now();
    Ok(Json(SchedulePage {
        schedules: found
            .iter()
            .map(|s| view(s, 0, now))
            .collect::<Result<_, _>>()?,
        next,
    }))
}

/// One schedule, with its next five fire times (UTC, in its zone, and when
/// each is due with its jitter).
#[utoipa::path(get, path = "/v1/schedules/{id}", tag = "schedules", params(("id" = Uuid, Path, description = "Schedule id")),
    responses((status = 200, body = ScheduleView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<ScheduleView>, ApiError> {
    let s = visible(&app, &p, id).await?;
    Ok(Json(view(&s, NEXT_FIRE_TIMES, Utc::now())?))
}

/// Change a schedule: the fields given replace the definition's (see
/// [`PatchSchedule`]); the result is checked as a new one is. A change of
/// the timing counts fire times from now on.
#[utoipa::path(patch, path = "/v1/schedules/{id}", tag = "schedules", params(("id" = Uuid, Path, description = "Schedule id")), request_body = PatchSchedule,
    responses((status = 200, body = ScheduleView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "`schedule_exists`: the new name is another schedule's", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn patch(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
    ApiJson(patch): ApiJson<PatchSchedule>,
) -> Result<Json<ScheduleView>, ApiError> {
    p.require(Scope::Submit)?;
    for _ in 0..5 {
        let s = visible(&app, &p, id).await?;
        let (old, _) = definition(&s)?;
        let mut def = old.clone();
        apply(&mut def, patch.clone());
        def.paused = s.paused;
        let timing = check(&app, &s.tenant, id, &mut def).await?;
        let now = Utc::now();
        let cursor = if same_timing(&old, &def) {
            s.cursor
        } else {
            s.cursor.max(now)
        };
        let next = Schedule {
            name: def.name.clone(),
            spec: serde_json::to_string(&def)
                .map_err(|e| ApiError::Internal(format!("a schedule serialises: {e}")))?,
            cursor,
            next_due_at: next_due(&timing, id, &def, cursor),
            buffered: s.buffered.filter(|_| def.overlap == Overlap::BufferOne),
            updated_at: now,
            ..s.clone()
        };
        if let Some(view) = save(&app, &next).await? {
            return Ok(Json(view));
        }
    }
    Err(ApiError::LogUnavailable(
        "the schedule kept changing while it was patched; ask again".into(),
    ))
}

/// `patch` applied to `def` (see [`PatchSchedule`]).
fn apply(def: &mut CreateSchedule, patch: PatchSchedule) {
    if let Some(v) = patch.name {
        def.name = v;
    }
    if let Some(v) = patch.cron {
        def.cron = Some(v);
        def.interval_ms = None;
        def.anchor = None;
    }
    if let Some(v) = patch.time_zone {
        def.time_zone = Some(v);
    }
    if let Some(v) = patch.interval_ms {
        def.interval_ms = Some(v);
        def.cron = None;
        def.time_zone = None;
    }
    if let Some(v) = patch.anchor {
        def.anchor = Some(v);
    }
    if let Some(v) = patch.agent {
        def.agent = Some(v);
        def.config = None;
        def.agent_version = None;
    }
    if let Some(v) = patch.agent_version {
        def.agent_version = Some(v);
    }
    if let Some(v) = patch.config {
        def.config = Some(v);
        def.agent = None;
        def.agent_version = None;
    }
    if let Some(v) = patch.goal {
        def.goal = v;
    }
    if let Some(v) = patch.tags {
        def.tags = v;
    }
    if let Some(v) = patch.metadata {
        def.metadata = v;
    }
    if let Some(v) = patch.overlap {
        def.overlap = v;
    }
    if let Some(v) = patch.catch_up_window_ms {
        def.catch_up_window_ms = Some(v);
    }
    if let Some(v) = patch.jitter_ms {
        def.jitter_ms = v;
    }
}

/// Delete a schedule: it fires nothing more; the runs it started stay.
#[utoipa::path(delete, path = "/v1/schedules/{id}", tag = "schedules", params(("id" = Uuid, Path, description = "Schedule id")),
    responses((status = 204, description = "Deleted"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<StatusCode, ApiError> {
    p.require(Scope::Submit)?;
    if store(&app)?.delete(tenant_of(&p), id).await? {
        tracing::info!(schedule_id = %id, by = %p.by(), "schedule deleted");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::ScheduleNotFound(id))
    }
}

/// Set or clear the paused flag; unpausing counts fire times from now.
async fn set_paused(
    app: &App,
    p: &Principal,
    id: Uuid,
    paused: bool,
) -> Result<Json<ScheduleView>, ApiError> {
    p.require(Scope::Submit)?;
    for _ in 0..5 {
        let s = visible(app, p, id).await?;
        if s.paused == paused {
            return Ok(Json(view(&s, 0, Utc::now())?));
        }
        let (def, timing) = definition(&s)?;
        let now = Utc::now();
        let cursor = if paused { s.cursor } else { s.cursor.max(now) };
        let next = Schedule {
            paused,
            cursor,
            next_due_at: next_due(&timing, id, &def, cursor),
            updated_at: now,
            ..s
        };
        if let Some(view) = save(app, &next).await? {
            tracing::info!(schedule_id = %id, paused, by = %p.by(), "schedule paused or unpaused");
            return Ok(Json(view));
        }
    }
    Err(ApiError::LogUnavailable(
        "the schedule kept changing; ask again".into(),
    ))
}

/// Pause a schedule: it fires nothing until unpaused (its runs go on).
#[utoipa::path(post, path = "/v1/schedules/{id}/pause", tag = "schedules", params(("id" = Uuid, Path, description = "Schedule id")),
    responses((status = 200, body = ScheduleView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn pause(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<ScheduleView>, ApiError> {
    set_paused(&app, &p, id, true).await
}

/// Unpause a schedule: fire times count from now (those that fell in the
/// pause are not caught up; backfill them if wanted).
#[utoipa::path(post, path = "/v1/schedules/{id}/unpause", tag = "schedules", params(("id" = Uuid, Path, description = "Schedule id")),
    responses((status = 200, body = ScheduleView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn unpause(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<ScheduleView>, ApiError> {
    set_paused(&app, &p, id, false).await
}

/// Start one run per nominal fire time in `[from, to]` (at most 100; `to`
/// not in the future), with the scheduler's idempotency keys: a fire time
/// that fired (or was backfilled) already answers its existing run. The
/// overlap policy does not apply; the schedule's cursor does not move.
#[utoipa::path(post, path = "/v1/schedules/{id}/backfill", tag = "schedules", params(("id" = Uuid, Path, description = "Schedule id")), request_body = BackfillBody,
    responses((status = 200, body = Backfilled),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn backfill(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
    ApiJson(body): ApiJson<BackfillBody>,
) -> Result<Json<Backfilled>, ApiError> {
    p.require(Scope::Submit)?;
    let s = visible(&app, &p, id).await?;
    let runs = crate::schedules::backfill(&app, &s, body.from, body.to, Utc::now()).await?;
    tracing::info!(schedule_id = %id, runs = runs.len(), by = %p.by(), "schedule backfilled");
    Ok(Json(Backfilled { runs }))
}
