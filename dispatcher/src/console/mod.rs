//! The console: server-rendered pages of the dispatcher beside the
//! approvals inbox (`/inbox`), with its sessions (one sign-in), CSRF
//! checks, escaping and Content-Security-Policy ([`crate::inbox`]).
//!
//! | page | what |
//! |---|---|
//! | `GET /console/batches` | the tenant's batches: status, progress, spend |
//! | `GET /console/batches/{id}` | one batch: items by state, spend, failures with their runs, results download |
//! | `GET /console/batches/{id}/results` | the batch's results as JSON Lines (as `GET /v1/batches/{id}/results`) |
//! | `GET /console/agents` | the tenant's agents, each with its versions |
//! | `GET /console/agents/{name}` | an agent's versions, each definition readable |
//! | `GET /console/agents/{name}/diff?from=N&to=M` | a line diff of two versions' definitions |
//!
//! Another tenant's batch or agent answers 404, like a missing one.

use axum::Router;

use crate::app::App;

mod agents;
mod batches;

/// The console's routes (merged into [`crate::server::router`]).
pub fn routes() -> Router<App> {
    Router::new()
        .merge(batches::routes())
        .merge(agents::routes())
}
