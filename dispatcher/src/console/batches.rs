//! `/console/batches`: the tenant's batches, and one batch's progress
//! (items by state), spend, failures (each with its error and a link to its
//! run) and results download.

use std::collections::HashMap;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use chrono::{DateTime, Utc};
use minijinja::context;
use serde::Serialize;
use uuid::Uuid;

use crate::app::App;
use crate::batches::{full_view, results_response, store, tenant_of, visible_batch};
use crate::inbox::{Session, api_error_page, error_page, html, session, to_login};
use crate::model::batches::BatchView;

/// Batches per page of the list.
const LIST_PAGE: usize = 50;
/// Items a batch page reads looking for failures: the first this many (the
/// results download has them all).
const SCAN_ITEMS: u64 = 10_000;
/// Failures a batch page lists.
const SHOW_FAILURES: usize = 100;
/// Items the store answers per read.
const ITEMS_PAGE: usize = 1000;

pub(super) fn routes() -> Router<App> {
    Router::new()
        .route("/console/batches", get(list))
        .route("/console/batches/{id}", get(one))
        .route("/console/batches/{id}/results", get(results))
}

/// US dollars from USD micros, to the micro but without trailing zeros
/// past the cents: `$0.00`, `$0.0123`, `$12.345678`.
pub(super) fn usd(micros: u64) -> String {
    let cents = format!("{:06}", micros % 1_000_000);
    let fraction = cents.trim_end_matches('0');
    let fraction = if fraction.len() < 2 {
        &cents[..2]
    } else {
        fraction
    };
    format!("${}.{fraction}", micros / 1_000_000)
}

/// A batch as the pages show it.
#[derive(Debug, Serialize)]
struct Row {
    id: Uuid,
    status: &'static str,
    agent: Option<String>,
    /// `name` of `agent` (for its link).
    agent_name: Option<String>,
    total: u64,
    /// Items finished one way or another.
    finished: u64,
    succeeded: u64,
    failed: u64,
    open: u64,
    cost: String,
    tokens: u64,
    cap_reached: bool,
    created_at: DateTime<Utc>,
    expires_at: Option<DateTime<Utc>>,
}

fn row(v: &BatchView) -> Row {
    let c = &v.counts;
    let open = c.open();
    Row {
        id: v.id,
        status: v.status.as_str(),
        agent_name: v
            .agent
            .as_deref()
            .map(|a| a.split('@').next().unwrap_or(a).to_owned()),
        agent: v.agent.clone(),
        total: v.total,
        finished: v.total.saturating_sub(open),
        succeeded: c.succeeded,
        failed: c.failed + c.expired + c.cancelled,
        open,
        cost: usd(v.spend.usd_micros),
        tokens: v.spend.tokens,
        cap_reached: v.cap_reached,
        created_at: v.created_at,
        expires_at: v.expires_at,
    }
}

async fn list(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let (s, after) = match super::paging::list_start(&app, &headers, &q, "after", "a batch") {
        Ok(found) => found,
        Err(r) => return r,
    };
    let store = match store(&app) {
        Ok(st) => st,
        Err(e) => return api_error_page(&s, e),
    };
    let batches = match store
        .batches(tenant_of(&s.principal), after, LIST_PAGE)
        .await
    {
        Ok(b) => b,
        Err(e) => return api_error_page(&s, e.into()),
    };
    let next = super::paging::next_cursor(&batches, LIST_PAGE, |x| x.id);
    let mut rows = Vec::with_capacity(batches.len());
    for b in &batches {
        match full_view(&app, b).await {
            Ok(v) => rows.push(row(&v)),
            Err(e) => return api_error_page(&s, e),
        }
    }
    html(
        StatusCode::OK,
        "console_batches.html",
        context! { rows, next, ..s.frame() },
    )
}

/// An item that did not succeed, as the batch page lists it.
#[derive(Debug, Serialize)]
struct Failure {
    n: u64,
    custom_id: String,
    status: String,
    error: Option<String>,
    run_id: Option<Uuid>,
}

/// The request's session and the batch `id` names, when the session may
/// see it; otherwise the answer: to sign in, or a 404 page (not an id,
/// missing, another tenant's).
async fn session_batch(
    app: &App,
    headers: &HeaderMap,
    id: &str,
) -> Result<(Session, glia_backends::batches::Batch), Response> {
    let s = session(app, headers).ok_or_else(to_login)?;
    let Ok(id) = id.parse::<Uuid>() else {
        return Err(error_page(Some(&s), StatusCode::NOT_FOUND, "no such batch"));
    };
    match visible_batch(app, &s.principal, id).await {
        Ok(b) => Ok((s, b)),
        Err(e) => Err(api_error_page(&s, e)),
    }
}

async fn one(State(app): State<App>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let (s, batch) = match session_batch(&app, &headers, &id).await {
        Ok(found) => found,
        Err(r) => return r,
    };
    let id = batch.id;
    let view = match full_view(&app, &batch).await {
        Ok(v) => v,
        Err(e) => return api_error_page(&s, e),
    };
    let (failures, scanned) = match failures(&app, &s, id, view.total).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    let c = &view.counts;
    let mut states: Vec<(String, u64)> =
        vec![("queued".into(), c.queued), ("running".into(), c.running)];
    states.extend(c.parked.iter().map(|(p, n)| (format!("parked: {p}"), *n)));
    states.extend([
        ("succeeded".into(), c.succeeded),
        ("failed".into(), c.failed),
        ("cancelled".into(), c.cancelled),
        ("expired".into(), c.expired),
    ]);
    let cap = view.options.spend_cap.as_ref();
    let cap_usd = cap.and_then(|c| c.usd_micros).map(usd);
    let cap_tokens = cap.and_then(|c| c.tokens);
    html(
        StatusCode::OK,
        "console_batch.html",
        context! { b => row(&view), states, failures, scanned, scan_limit => SCAN_ITEMS, show => SHOW_FAILURES,
        cap_usd, cap_tokens, updated_at => view.updated_at, ..s.frame() },
    )
}

/// The items of batch `id` that did not succeed (failed, cancelled,
/// expired), in submission order: at most [`SHOW_FAILURES`] of the first
/// [`SCAN_ITEMS`] items, and how many items were read.
async fn failures(
    app: &App,
    s: &Session,
    id: Uuid,
    total: u64,
) -> Result<(Vec<Failure>, u64), Response> {
    let store = store(app).map_err(|e| api_error_page(s, e))?;
    let mut out = Vec::new();
    let mut from = 0u64;
    while from < total.min(SCAN_ITEMS) && out.len() < SHOW_FAILURES {
        let items = store
            .items(id, from, ITEMS_PAGE)
            .await
            .map_err(|e| api_error_page(s, e.into()))?;
        let Some(last) = items.last().map(|i| i.n) else {
            break;
        };
        for item in items {
            if !matches!(item.status.as_str(), "failed" | "cancelled" | "expired") {
                continue;
            }
            let result = crate::model::batches::ItemResult::of(item.clone());
            out.push(Failure {
                n: item.n,
                custom_id: item.custom_id,
                status: item.status,
                error: result.error,
                run_id: item.run_id,
            });
            if out.len() == SHOW_FAILURES {
                break;
            }
        }
        from = last + 1;
    }
    Ok((out, from.min(total)))
}

/// The batch's results as a JSON Lines download: the body of `GET
/// /v1/batches/{id}/results`, with the session's rights.
async fn results(State(app): State<App>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let (s, batch) = match session_batch(&app, &headers, &id).await {
        Ok(found) => found,
        Err(r) => return r,
    };
    let id = batch.id;
    match results_response(&app, &batch) {
        Ok(mut r) => {
            let disposition = format!("attachment; filename=\"batch-{id}-results.jsonl\"");
            if let Ok(v) = HeaderValue::from_str(&disposition) {
                r.headers_mut().insert(header::CONTENT_DISPOSITION, v);
            }
            r.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r.into_response()
        }
        Err(e) => api_error_page(&s, e),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn dollars_from_micros() {
        assert_eq!(super::usd(0), "$0.00");
        assert_eq!(super::usd(12_300), "$0.0123");
        assert_eq!(super::usd(12_345_678), "$12.345678");
        assert_eq!(super::usd(1_500_000), "$1.50");
    }
}
