//! `/v1/datasets` and `/v1/experiments`. See [`crate::evals`].

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use uuid::Uuid;

use crate::admission::idempotency_key;
use crate::app::App;
use crate::auth::{Principal, Scope};
use crate::batches::tenant_of;
use crate::error::{ApiError, ErrorBody};
use crate::evals::{
    MAX_DATASET_BYTES, cancel as cancel_experiment, create_experiment, dataset_cases, put_dataset,
    store, view,
};
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::handlers::page;
use crate::model::evals::*;

/// Store a new version of the caller's dataset `name`: the body is JSON
/// Lines (`Content-Type: application/jsonl` or `application/x-ndjson`), one
/// case per line, or JSON `{"cases": [{…}, …]}` (a case's line is then its
/// index + 1) (`{"id", "goal" | "messages", "turns"?, "expected"?,
/// "metadata"?, "config"?}`; `docs/evals.md`). The same content as the
/// latest version answers 200 with it and stores nothing. A bad line refuses
/// the whole upload (422 `invalid_request` with `line` and `field`: an
/// unknown key, a repeated `id`, a bad `messages` role). At most 64 MiB.
#[utoipa::path(put, path = "/v1/datasets/{name}", tag = "evals",
    params(("name" = String, Path, description = "Dataset name, 1 to 100 characters of `A-Z a-z 0-9 _ . -`")),
    request_body(content((PutDataset = "application/json"), (String = "application/jsonl")), description = "JSON `{\"cases\": […]}`, or JSON Lines: one case per line"),
    responses((status = 201, description = "A new version", body = DatasetView),
        (status = 200, description = "Unchanged: the latest version has this content", body = DatasetView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put(
    State(app): State<App>,
    p: Principal,
    ApiPath(name): ApiPath<String>,
    request: Request,
) -> Result<Response, ApiError> {
    p.require(Scope::Submit)?;
    store(&app)?;
    let jsonl = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "application/jsonl" | "application/x-ndjson" | "application/json-lines"
            )
        });
    let json = crate::extract::is_json(request.headers());
    if !jsonl && !json {
        return Err(ApiError::UnsupportedMediaType);
    }
    let headers = request.headers().clone();
    let bytes = axum::body::to_bytes(request.into_body(), MAX_DATASET_BYTES)
        .await
        .map_err(|_| ApiError::BodyTooLarge(MAX_DATASET_BYTES))?;
    let text = if jsonl {
        std::str::from_utf8(&bytes)
            .map_err(|e| ApiError::MalformedJson(format!("the body is not UTF-8: {e}")))?
            .to_owned()
    } else {
        // The JSON form: each case becomes a line of the JSON Lines form.
        let body: PutDataset = crate::extract::parse(&headers, &bytes)?;
        body.cases
            .iter()
            .map(|c| serde_json::to_string(c).expect("JSON serialises"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (info, created) = put_dataset(&app, &p.tenant, &name, &text).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(DatasetView::from(info))).into_response())
}

/// Every version of the caller's datasets, by name then version.
#[utoipa::path(get, path = "/v1/datasets", tag = "evals",
    responses((status = 200, body = DatasetList), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_datasets(
    State(app): State<App>,
    p: Principal,
) -> Result<Json<DatasetList>, ApiError> {
    let found = store(&app)?.datasets(Some(&p.tenant)).await?;
    Ok(Json(DatasetList {
        datasets: found.into_iter().map(DatasetView::from).collect(),
    }))
}

/// One version of a dataset (the latest unless `?version=N`) with its cases.
#[utoipa::path(get, path = "/v1/datasets/{name}", tag = "evals",
    params(("name" = String, Path, description = "Dataset name"), DatasetQuery),
    responses((status = 200, body = DatasetCases), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, description = "`dataset_not_found`", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get_dataset(
    State(app): State<App>,
    p: Principal,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<DatasetQuery>,
) -> Result<Json<DatasetCases>, ApiError> {
    let (info, cases) = dataset_cases(&app, &p.tenant, &name, q.version).await?;
    Ok(Json(DatasetCases {
        dataset: info.into(),
        cases: cases
            .iter()
            .map(|c| serde_json::to_value(c).expect("a case serialises"))
            .collect(),
    }))
}

/// Start an experiment: every agent version of the eval over every case of
/// its dataset (pinned to its latest version when unversioned),
/// `repetitions` times, as one managed batch per version; graded as runs
/// end. Nothing is stored when a check fails: 422 naming `eval.…` (an
/// unknown key, a grader naming a provider or an HTTP origin the catalogue
/// does not have, an agent version the tenant does not have), 404
/// `dataset_not_found`. `Idempotency-Key`: a repeat answers 200 with the
/// first experiment; another body with the key is 409.
#[utoipa::path(post, path = "/v1/experiments", tag = "evals", request_body = CreateExperiment,
    responses((status = 201, description = "Created; its batches are admitted progressively", body = ExperimentView),
        (status = 200, description = "Idempotent repeat: the existing experiment", body = ExperimentView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "`dataset_not_found`", body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(app): State<App>,
    p: Principal,
    headers: axum::http::HeaderMap,
    ApiJson(body): ApiJson<CreateExperiment>,
) -> Result<Response, ApiError> {
    p.require(Scope::Submit)?;
    let key = idempotency_key(&headers)?;
    let (exp, created) = create_experiment(&app, &p, key, body.eval).await?;
    let v = view(&app, &exp, false).await?;
    if !created {
        return Ok((StatusCode::OK, Json(v)).into_response());
    }
    let location = HeaderValue::from_str(&format!("/v1/experiments/{}", exp.id))
        .expect("a uuid path is a valid header");
    Ok((StatusCode::CREATED, [(header::LOCATION, location)], Json(v)).into_response())
}

/// The caller's experiments (an admin's: every tenant's), newest first,
/// without results.
#[utoipa::path(get, path = "/v1/experiments", tag = "evals", params(ListExperimentsQuery),
    responses((status = 200, body = ExperimentPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(app): State<App>,
    p: Principal,
    ApiQuery(q): ApiQuery<ListExperimentsQuery>,
) -> Result<Json<ExperimentPage>, ApiError> {
    let limit = page(q.limit, &app)?;
    let found = store(&app)?
        .experiments(tenant_of(&p), q.before, limit)
        .await?;
    let next = (found.len() == limit)
        .then(|| found.last().map(|e| e.id))
        .flatten();
    let mut experiments = Vec::with_capacity(found.len());
    for exp in &found {
        experiments.push(view(&app, exp, false).await?);
    }
    Ok(Json(ExperimentPage { experiments, next }))
}

/// One experiment with its results: every cell (version, case, repetition,
/// run, verdicts) and the summary (pass rates with 95% intervals, cost and
/// latency, verdict changes against the first version).
#[utoipa::path(get, path = "/v1/experiments/{id}", tag = "evals", params(("id" = Uuid, Path, description = "Experiment id")),
    responses((status = 200, body = ExperimentView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, description = "`experiment_not_found`", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<ExperimentView>, ApiError> {
    let exp = store(&app)?
        .experiment(tenant_of(&p), id)
        .await?
        .ok_or(ApiError::ExperimentNotFound(id))?;
    Ok(Json(view(&app, &exp, true).await?))
}

/// Cancel a running experiment: its batches and their runs are cancelled;
/// cells graded stay graded. 409 `experiment_ended` when it completed or
/// was cancelled.
#[utoipa::path(post, path = "/v1/experiments/{id}/cancel", tag = "evals", params(("id" = Uuid, Path, description = "Experiment id")),
    responses((status = 200, body = ExperimentView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "`experiment_not_found`", body = ErrorBody),
        (status = 409, description = "`experiment_ended`", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<ExperimentView>, ApiError> {
    p.require(Scope::Submit)?;
    let exp = cancel_experiment(&app, &p, id).await?;
    Ok(Json(view(&app, &exp, false).await?))
}
