//! The endpoints. JSON in and out; every error is an [`crate::error::ApiError`].
//!
//! | endpoint | scope | success | errors besides auth (401/403) and bad input (400/413/415/422) |
//! |---|---|---|---|
//! | `POST /v1/runs` | submit | 201 run (200 on an idempotent repeat) | 409 `idempotency_conflict`, 422 `invalid_request` |
//! | `GET /v1/runs` | any | 200 page | – |
//! | `GET /v1/runs/{id}` | any | 200 run | 404 `run_not_found` |
//! | `GET /v1/runs/{id}/events` | any | 200 page | 404 `run_not_found` |
//! | `GET /v1/runs/{id}/events/stream` | any | 200 SSE | 404 `run_not_found`, 400 `invalid_header` |
//! | `GET /v1/approvals` | approve | 200 page | – |
//! | `POST /v1/approvals` | approve | 200 per-item results | – |
//! | `GET /v1/approvals/history` | approve | 200 records (JSON or CSV) | – |
//! | `POST`, `GET /v1/webhooks`, `DELETE /v1/webhooks/{id}`, `GET /v1/webhooks/{id}/deliveries` | submit or approve | see [`crate::webhooks`] | |
//! | `POST`, `GET /v1/schedules`, `GET`, `PATCH`, `DELETE /v1/schedules/{id}`, `POST /v1/schedules/{id}/pause`, `/unpause`, `/backfill` | submit to write, any to read | see [`crate::schedules`] | 404 `schedule_not_found`, 409 `schedule_exists` |
//! | `POST /v1/runs/{id}/approvals/{call_id}` | approve | 202 | 404 `run_not_found` / `call_not_found` / `approval_not_found`, 409 `already_decided` / `stale_args` / `run_finished` / `run_cancelled` |
//! | `POST /v1/runs/{id}/tool-results/{call_id}` | submit | 202 | 404 `run_not_found` / `call_not_found`, 409 `not_external` / `already_answered` / `run_finished` / `run_cancelled` |
//! | `POST /v1/runs/{id}/messages` | submit | 202 | 404, 409 `not_awaiting_input` / `already_posted` / `run_finished` / `run_cancelled` |
//! | `POST /v1/runs/{id}/pause` | submit | 202 | 404, 409 `already_paused` / `run_finished` / `run_cancelled` |
//! | `POST /v1/runs/{id}/resume` | submit or approve | 202 | 404, 409 `not_paused` / `already_posted` / `run_finished` / `run_cancelled` |
//! | `POST /v1/runs/{id}/close` | submit | 202 | 404, 409 `not_awaiting_input` / `already_posted` / `run_finished` / `run_cancelled` |
//! | `POST /v1/runs/{id}/cancel` | submit | 202 | 404, 409 `run_finished`, 503 `ledger_unavailable` |
//! | `PUT /v1/datasets/{name}`, `GET /v1/datasets`, `GET /v1/datasets/{name}`, `POST`, `GET /v1/experiments`, `GET /v1/experiments/{id}`, `POST /v1/experiments/{id}/cancel` | submit to write, any to read | see [`crate::evals`] | 404 `dataset_not_found` / `experiment_not_found`, 409 `experiment_ended` |
//! | `POST /v1/events` | submit | 202 `{id, delivered, duplicate}` | – (`docs/waits.md`) |
//! | `GET /healthz`, `/readyz`, `/metrics`, `/openapi.json` | none | 200 | 503 `not_ready` |
//! | `POST`, `GET`, `DELETE /mcp` (MCP, streamable HTTP; [`crate::mcp`], not in the OpenAPI document) | any; per tool as `/v1` | JSON-RPC | 401 without a token |
//!
//! Any handler may answer 503 `log_unavailable` / `queue_unavailable` when a
//! backing store fails, and every route but `/healthz` and `/readyz` answers
//! 503 `not_ready` (with `Retry-After: 1`) while the dispatcher is still
//! connecting to its services at start ([`crate::startup`]). A stored
//! record that does not decode answers 500 `corrupt_record` (asking again
//! does not help).
//!
//! The leaves: one module per resource of the JSON API, each a set of axum
//! handlers with their OpenAPI annotations. They call the middle
//! ([`crate::admission`], [`crate::control`], [`crate::batches`]) and the
//! types ([`crate::model`]); nothing but the router ([`crate::server`])
//! imports them.

pub mod agents;
pub mod approvals;
pub mod batches;
pub mod evals;
pub mod events;
pub mod ops;
pub mod payloads;
pub mod runs;
pub mod schedules;
pub mod stream;

use crate::app::App;
use crate::error::ApiError;

pub(crate) fn page(limit: Option<usize>, app: &App) -> Result<usize, ApiError> {
    match limit {
        None => Ok(app.limits.default_page),
        Some(n) if (1..=app.limits.max_page).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::InvalidParam {
            name: "limit".into(),
            reason: format!("{n} is outside 1..={}", app.limits.max_page),
        }),
    }
}
