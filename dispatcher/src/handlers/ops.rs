//! `/healthz`, `/readyz`, `/metrics` (and the answers a starting dispatcher
//! and a worker serve too).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::app::App;
use crate::error::ApiError;

use crate::model::*;

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, body = Health)))]
pub async fn healthz() -> Json<Health> {
    healthz_answer()
}

/// The answer of `/healthz`: `{"status": "ok"}`.
pub fn healthz_answer() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        checks: BTreeMap::new(),
    })
}

/// Readiness: the event log, the job queue and the ledger answer within
/// [`crate::Limits::ready_timeout`]. 503 `not_ready` names the failures.
#[utoipa::path(get, path = "/readyz", tag = "ops", responses((status = 200, body = Health), (status = 503, body = NotReady)))]
pub async fn readyz(State(app): State<App>) -> Response {
    readiness_answer(
        glia_backends::readiness(
            app.log.as_ref(),
            app.queue.as_ref(),
            app.ledger.as_ref(),
            app.limits.ready_timeout,
        )
        .await,
    )
}

/// The answer of a readiness probe from its checks (dependency → `ok` or
/// why not): 200 [`Health`] `ready` when every check is `ok`, else 503
/// [`NotReady`] (`not_ready`, the message naming each failing dependency).
/// Served by the dispatcher's `/readyz`, while it starts, and by a worker's
/// `--metrics-listen`.
pub fn readiness_answer(checks: BTreeMap<String, String>) -> Response {
    let failed: Vec<String> = checks
        .iter()
        .filter(|(_, v)| *v != "ok")
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    if failed.is_empty() {
        return Json(Health {
            status: "ready".into(),
            checks,
        })
        .into_response();
    }
    let error = ApiError::NotReady(failed.join("; ")).body().error;
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(NotReady { error, checks }),
    )
        .into_response()
}

/// Prometheus metrics, OpenMetrics text format.
#[utoipa::path(get, path = "/metrics", tag = "ops", responses((status = 200, content_type = "application/openmetrics-text", body = String)))]
pub async fn metrics(State(app): State<App>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics().encode(),
    )
        .into_response()
}
