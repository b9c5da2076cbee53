//! `/console/schedules` (issue 32): the tenant's schedules (an admin's:
//! every tenant's): rule and zone, what each starts, overlap policy, paused,
//! the last fire time and run (linked), the last error, the next fire time.

use std::collections::HashMap;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use chrono::Utc;
use minijinja::context;
use serde::Serialize;
use uuid::Uuid;

use crate::app::App;
use crate::batches::tenant_of;
use crate::inbox::{api_error_page, html};
use crate::schedules::{store, view};

/// Schedules per page of the list.
const LIST_PAGE: usize = 50;

pub(super) fn routes() -> Router<App> {
    Router::new().route("/console/schedules", get(list))
}

/// A schedule as the list shows it.
#[derive(Debug, Serialize)]
struct Row {
    id: Uuid,
    tenant: String,
    name: String,
    rule: String,
    starts: String,
    overlap: &'static str,
    paused: bool,
    last_fire_time: String,
    last_run_id: Option<Uuid>,
    last_error: Option<String>,
    next: Option<String>,
}

async fn list(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let (s, after) = match super::paging::list_start(&app, &headers, &q, "after", "a schedule") {
        Ok(found) => found,
        Err(r) => return r,
    };
    let store = match store(&app) {
        Ok(st) => st,
        Err(e) => return api_error_page(&s, e),
    };
    let found = match store
        .schedules(tenant_of(&s.principal), after, LIST_PAGE)
        .await
    {
        Ok(found) => found,
        Err(e) => return api_error_page(&s, e.into()),
    };
    let next = super::paging::next_cursor(&found, LIST_PAGE, |x| x.id);
    let now = Utc::now();
    let mut rows = Vec::with_capacity(found.len());
    for sch in &found {
        let v = match view(sch, 1, now) {
            Ok(v) => v,
            Err(e) => return api_error_page(&s, e),
        };
        let d = &v.definition;
        let rule = match (&d.cron, d.interval_ms) {
            (Some(cron), _) => format!("{cron} ({})", d.time_zone.as_deref().unwrap_or("UTC")),
            (None, Some(ms)) => format!("every {ms} ms"),
            _ => "?".into(),
        };
        let starts = match (&d.agent, d.agent_version) {
            (Some(a), Some(n)) => format!("{a}@{n}"),
            (Some(a), None) => format!("{a} (latest)"),
            _ => "its own config".into(),
        };
        rows.push(Row {
            id: v.id,
            tenant: v.tenant.clone(),
            name: v.name.clone(),
            rule,
            starts,
            overlap: d.overlap.as_str(),
            paused: v.paused,
            last_fire_time: crate::schedules::rfc3339(v.last_fire_time),
            last_run_id: v.last_run_id,
            last_error: v.last_error.clone(),
            next: v.next_fire_times.first().map(|f| f.local.clone()),
        });
    }
    html(
        StatusCode::OK,
        "console_schedules.html",
        context! { rows, next, ..s.frame() },
    )
}
