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
//!
//! One sign-in with the inbox: the same session cookie (`glia_inbox`,
//! `Path=/`), CSRF tokens, origin checks, templates (minijinja, HTML
//! auto-escaped; no tenant text is marked safe) and Content-Security-Policy
//! (this server's own script and style only; no inline script). Every
//! action goes through the JSON API's handler
//! ([`crate::handlers::payloads`]), so its scope, tenant and state checks
//! are the API's: a page hides what the session's scopes do not allow, and
//! the server checks again.

use axum::Router;
use axum::response::Redirect;
use axum::routing::get;

use crate::app::App;

pub mod runs;

/// The console's routes (merged into [`crate::server::router`]).
pub fn routes() -> Router<App> {
    Router::new()
        .route("/console", get(|| async { Redirect::to("/console/runs") }))
        .route("/console/", get(|| async { Redirect::to("/console/runs") }))
        .merge(runs::routes())
}
