//! The console: server-rendered pages of the dispatcher beside the
//! approvals inbox ([`crate::inbox`]), for the people who operate agents
//! and their runs.
//!
//! | page | what |
//! |---|---|
//! | `GET /console` | redirects to `/console/runs` |
//! | `GET /console/runs` | the runs, newest first, filtered by a GET form (the URL is the saved query), cursor paging ([`runs`]) |
//! | `GET /console/runs/{id}` | a run: header, failure reason first, actions, the timeline of its events (paged) |
//! | `GET /console/runs/{id}/events/{seq}` | one event in full (a model call's whole request) |
//! | `GET /console/runs/{id}/live` | server-sent events: each new event's rendered timeline entry, and the header |
//! | `POST /console/runs/{id}/{cancel,pause,resume,messages}`, `POST /console/runs/{id}/tool-results/{call}` | the run's actions |
//! | `GET /console/batches` | the tenant's batches: status, progress, spend |
//! | `GET /console/batches/{id}` | one batch: items by state, spend, failures with their runs, results download |
//! | `GET /console/schedules` | the tenant's schedules: rule, next and last fire time, last run |
//! | `GET /console/experiments` | the tenant's experiments: state, dataset, versions, progress |
//! | `GET /console/experiments/{id}` | one experiment: per version the pass rate (95% interval), errors, cost, latency, tokens; cases × versions, verdict changes first, each cell linking to its runs |
//! | `GET /console/batches/{id}/results` | the batch's results as JSON Lines (as `GET /v1/batches/{id}/results`) |
//! | `GET /console/agents` | the tenant's agents, each with its versions |
//! | `GET /console/agents/{name}` | an agent's versions, each definition readable |
//! | `GET /console/agents/{name}/diff?from=N&to=M` | a line diff of two versions' definitions |
//!
//! One sign-in with the inbox: the same session cookie (`glia_inbox`,
//! `Path=/`), CSRF tokens, origin checks, templates (minijinja, HTML
//! auto-escaped; no tenant text is marked safe) and Content-Security-Policy
//! (this server's own script and style only; no inline script). Every
//! action goes through the JSON API's handler
//! ([`crate::handlers::payloads`]), so its scope, tenant and state checks
//! are the API's: a page hides what the session's scopes do not allow, and
//! the server checks again. Another tenant's run, batch, agent or
//! experiment answers 404, like a missing one.

use std::collections::HashMap;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Redirect, Response};
use axum::routing::get;
use uuid::Uuid;

use crate::app::App;
use crate::inbox::{Session, error_page, session, to_login};

mod agents;
mod batches;
pub mod runs;
// Issue 31, evals.
mod experiments;
// Issue 32, schedules.
mod schedules;

/// The console's routes (merged into [`crate::server::router`]).
pub fn routes() -> Router<App> {
    Router::new()
        .route("/console", get(|| async { Redirect::to("/console/runs") }))
        .route("/console/", get(|| async { Redirect::to("/console/runs") }))
        .merge(runs::routes())
        .merge(batches::routes())
        .merge(agents::routes())
        .merge(schedules::routes())
        .merge(experiments::routes())
}

/// A list page's session and its cursor, `?{param}=ID` (the page's Next
/// link), or the answer: to sign in, or a 400 page naming `param` (`what`:
/// the kind of id, `a batch`).
// The error is the page to answer with, as `inbox::checked_post`'s.
#[allow(clippy::result_large_err)]
fn list_start(
    app: &App,
    headers: &HeaderMap,
    q: &HashMap<String, String>,
    param: &str,
    what: &str,
) -> Result<(Session, Option<Uuid>), Response> {
    let s = session(app, headers).ok_or_else(to_login)?;
    match q.get(param).map(|a| a.trim()).filter(|a| !a.is_empty()) {
        None => Ok((s, None)),
        Some(a) => match a.parse::<Uuid>() {
            Ok(id) => Ok((s, Some(id))),
            Err(_) => Err(error_page(
                Some(&s),
                StatusCode::BAD_REQUEST,
                &format!("{param}: not {what} id (use the page's Next link)"),
            )),
        },
    }
}

/// The Next link's cursor: the id of a full page's last entry.
fn next_cursor<T>(found: &[T], page: usize, id: impl Fn(&T) -> Uuid) -> Option<Uuid> {
    (found.len() == page)
        .then(|| found.last().map(id))
        .flatten()
}
