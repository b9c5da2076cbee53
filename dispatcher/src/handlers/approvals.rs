//! `/v1/approvals` and `/v1/runs/{id}/approvals/{call_id}`: the queue, the
//! history, single and bulk decisions.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use glia_backends::ApprovalFilter;
use uuid::Uuid;

use crate::app::App;
use crate::auth::{Principal, Scope};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiPath, ApiQuery};

use crate::handlers::page;
use crate::model::*;

use crate::control::{decide_many, decide_one};

/// The approval queue, oldest first.
#[utoipa::path(get, path = "/v1/approvals", tag = "approvals", params(ApprovalsQuery),
    responses((status = 200, body = ApprovalPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list_approvals(
    State(app): State<App>,
    p: Principal,
    ApiQuery(q): ApiQuery<ApprovalsQuery>,
) -> Result<Json<ApprovalPage>, ApiError> {
    p.require(Scope::Approve)?;
    let limit = page(q.limit, &app)?;
    let filter = ApprovalFilter {
        tenant: p.tenant_filter(),
        tool: q.tool,
        run_id: q.run_id,
        pending_only: q.status.unwrap_or_default() == ApprovalStatusFilter::Pending,
        expired_by: None,
        limit,
    };
    let rows = app.log.approvals(&filter).await?;
    Ok(Json(ApprovalPage {
        approvals: crate::history::views(&*app.log, rows).await?,
    }))
}

/// The approval history, read from the event log: every request with what
/// became of it (approved, edited, rejected, expired, abandoned, pending),
/// who decided and when, the wait, and escalation; newest first. With
/// `format=csv`: the same as `text/csv` (see `history::to_csv`).
#[utoipa::path(get, path = "/v1/approvals/history", tag = "approvals", params(crate::history::HistoryQuery),
    responses((status = 200, description = "The records: JSON, or CSV with `format=csv`", content((ApprovalHistory = "application/json"), (String = "text/csv"))), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn approval_history(
    State(app): State<App>,
    p: Principal,
    ApiQuery(q): ApiQuery<crate::history::HistoryQuery>,
) -> Result<Response, ApiError> {
    p.require(Scope::Approve)?;
    let records = crate::history::history(&*app.log, p.tenant_filter(), &q).await?;
    match q.format {
        None | Some(crate::history::HistoryFormat::Json) => {
            Ok(Json(ApprovalHistory { approvals: records }).into_response())
        }
        Some(crate::history::HistoryFormat::Csv) => Ok((
            [(header::CONTENT_TYPE, "text/csv; charset=utf-8")],
            crate::history::to_csv(&records),
        )
            .into_response()),
    }
}

/// Decide one approval: approve, reject (with a reason the model sees) or
/// edit (replacement arguments). The first decision wins; a second answers
/// 409 `already_decided`. The decision binds to the pending call's
/// `args_hash` (quote it as `args_hash` to refuse a stale view: 409 `stale_args`).
#[utoipa::path(post, path = "/v1/runs/{id}/approvals/{call_id}", tag = "approvals", request_body = crate::docs::DecisionBodyDoc,
    params(("id" = Uuid, Path, description = "Run id"), ("call_id" = String, Path, description = "Tool call id")),
    responses((status = 202, body = Accepted), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn decide(
    State(app): State<App>,
    p: Principal,
    ApiPath((id, call_id)): ApiPath<(Uuid, String)>,
    ApiJson(body): ApiJson<DecisionBody>,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    p.require(Scope::Approve)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(decide_one(&app, &p, id, call_id, &body).await?),
    ))
}

/// Decide many approvals; each is validated and posted on its own, and its
/// result carries the status the single endpoint would have answered.
#[utoipa::path(post, path = "/v1/approvals", tag = "approvals", request_body = BulkDecisions,
    responses((status = 200, body = BulkResults), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn decide_bulk(
    State(app): State<App>,
    p: Principal,
    ApiJson(body): ApiJson<BulkDecisions>,
) -> Result<Json<BulkResults>, ApiError> {
    p.require(Scope::Approve)?;
    if body.decisions.len() > app.limits.max_bulk {
        return Err(ApiError::Invalid(format!(
            "at most {} decisions per request",
            app.limits.max_bulk
        )));
    }
    // The shape of every decision first: a malformed one refuses the whole request.
    let singles: Vec<DecisionBody> = body
        .decisions
        .iter()
        .map(|d| DecisionBody {
            decision: d.decision,
            reason: d.reason.clone(),
            input: d.input.clone(),
            args_hash: d.args_hash.clone(),
        })
        .collect();
    for (i, single) in singles.iter().enumerate() {
        single.to_decision().map_err(|e| ApiError::InvalidField {
            field: format!("decisions[{i}].input"),
            reason: e.to_string(),
        })?;
    }
    let items: Vec<(Uuid, String, DecisionBody)> = body
        .decisions
        .into_iter()
        .zip(singles)
        .map(|(d, single)| (d.run_id, d.call_id, single))
        .collect();
    let answers = decide_many(&app, &p, &items).await;
    let results = items
        .into_iter()
        .zip(answers)
        .map(|((run_id, call_id, _), answer)| match answer {
            Ok(accepted) => BulkItemResult {
                run_id,
                call_id,
                status: 202,
                accepted: Some(accepted),
                error: None,
            },
            Err(e) => BulkItemResult {
                run_id,
                call_id,
                status: e.status().as_u16(),
                accepted: None,
                error: Some(e.body().error),
            },
        })
        .collect();
    Ok(Json(BulkResults { results }))
}
