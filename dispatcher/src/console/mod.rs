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

use axum::Router;
use axum::response::Redirect;
use axum::routing::get;

use crate::app::App;

mod agents;
mod batches;
mod paging;
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
