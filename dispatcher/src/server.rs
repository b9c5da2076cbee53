//! The top: the router over every handler ([`routes()`], [`router`]), the
//! OpenAPI document built from them ([`openapi`], served at
//! `/openapi.json`), and serving ([`serve`]). Nothing below imports this
//! module.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::LazyLock;
use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::App;
use crate::auth::OPEN_TENANT;
use crate::error::ApiError;
use crate::handlers::{
    agents, approvals, batches, evals, events, ops, payloads, runs, schedules, stream,
};
use crate::{console, docs, extract, inbox, mcp, metrics, webhooks};

/// The document's header and security scheme; paths are added by the router.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "glia dispatcher",
        description = "Durable, resumable LLM agent runs: admit runs, read and stream their event logs, decide approvals, post external tool results and user messages, extend budgets, cancel. Every error is `{\"error\": {\"code\", \"message\"}}`.",
        license(name = "MIT")
    ),
    modifiers(&BearerAuth),
    components(schemas(crate::model::batches::BatchSpec, crate::model::batches::BatchItem, crate::model::batches::ItemResult)),
    tags(
        (name = "runs", description = "Admission, listing, event logs and streams"),
        (name = "approvals", description = "The approval queue and decisions"),
        (name = "payloads", description = "Tool results, messages, resume, cancel"),
        (name = "agents", description = "The agent registry: versioned agent definitions"),
        (name = "batches", description = "Many goals with one configuration: submit (JSON or JSON Lines), progress, results, cancel, pause, resume"),
        (name = "evals", description = "Datasets (versioned cases) and experiments (agent versions run over a dataset as batches, graded, compared)"),
        (name = "schedules", description = "Runs started on a cron expression or an interval: create, list, next fire times, change, pause, unpause, backfill, delete"),
        (name = "events", description = "Events for runs waiting in wait_for_event (docs/waits.md)"),
        (name = "ops", description = "Health, readiness, metrics, this document")
    )
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Every endpoint with its OpenAPI description.
pub fn routes() -> OpenApiRouter<App> {
    use utoipa::OpenApi;
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(runs::create_run, runs::list_runs))
        .routes(routes!(runs::get_run, runs::delete_run))
        .routes(routes!(runs::list_events))
        .routes(routes!(stream::stream_events))
        .routes(routes!(approvals::list_approvals, approvals::decide_bulk))
        .routes(routes!(approvals::approval_history))
        .routes(routes!(webhooks::create, webhooks::list))
        .routes(routes!(webhooks::delete))
        .routes(routes!(webhooks::deliveries))
        .routes(routes!(batches::create, batches::list))
        .routes(routes!(batches::get))
        .routes(routes!(batches::results))
        .routes(routes!(batches::stream))
        .routes(routes!(batches::cancel))
        .routes(routes!(batches::pause))
        .routes(routes!(batches::resume))
        // Issue 32, schedules.
        .routes(routes!(schedules::create, schedules::list))
        .routes(routes!(schedules::get, schedules::patch, schedules::delete))
        .routes(routes!(schedules::pause))
        .routes(routes!(schedules::unpause))
        .routes(routes!(schedules::backfill))
        // Issue 31, evals.
        .routes(routes!(evals::put, evals::get_dataset))
        .routes(routes!(evals::list_datasets))
        .routes(routes!(evals::create, evals::list))
        .routes(routes!(evals::get))
        .routes(routes!(evals::cancel))
        .routes(routes!(approvals::decide))
        .routes(routes!(payloads::post_tool_result))
        .routes(routes!(payloads::post_message))
        .routes(routes!(payloads::pause))
        .routes(routes!(payloads::resume))
        .routes(routes!(payloads::cancel))
        .routes(routes!(payloads::close))
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .routes(routes!(ops::metrics))
        .routes(routes!(openapi_json))
        .routes(routes!(agents::put_agent, agents::get_agent))
        .routes(routes!(agents::list_agents))
        .routes(routes!(agents::get_version))
        // issue 32: waits
        .routes(routes!(events::post_event))
}

/// The HTTP API over `app`: every endpoint of [`routes()`] (documented in
/// [`openapi`]), the MCP server at `/mcp` ([`mcp::routes`]), JSON errors for unknown routes (404 `route_not_found`) and
/// methods (405 `method_not_allowed`), panics (500 `internal`), a body limit
/// of [`crate::Limits::max_body_bytes`], and request metrics.
pub fn router(app: App) -> Router {
    extract::check_bodies_against(openapi);
    let (routes, _) = routes().split_for_parts();
    let limit = app.limits.max_body_bytes;
    routes
        .merge(inbox::routes())
        .merge(console::routes())
        .merge(mcp::routes(&app))
        .fallback(not_found)
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(middleware::from_fn_with_state(app.clone(), track))
        .layer(DefaultBodyLimit::max(limit))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(panicked))
        .with_state(app)
}

/// The OpenAPI 3.1 document of [`router`] as JSON (served at `/openapi.json`):
/// generated by utoipa from the handlers, with hand-written schemas for the
/// contract types of glia-proto and glia-backends ([`docs::foreign_schemas`]).
pub fn openapi() -> serde_json::Value {
    let doc = routes().split_for_parts().1;
    let mut json = serde_json::to_value(doc).expect("the OpenAPI document serialises");
    for (name, schema) in docs::foreign_schemas() {
        json["components"]["schemas"][name.as_str()] = schema;
    }
    docs::complete(&mut json);
    json
}

async fn not_found(req: Request) -> ApiError {
    ApiError::RouteNotFound(format!("{} {}", req.method(), req.uri().path()))
}

fn panicked(err: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let what = err
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    tracing::error!("handler panicked: {what}");
    ApiError::Internal("the handler panicked".into()).into_response()
}

async fn track(State(app): State<App>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = req.method().as_str().to_owned();
    let start = Instant::now();
    let response = next.run(req).await;
    let m = app.metrics();
    m.http_duration
        .get_or_create(&metrics::RouteLabels {
            route: route.clone(),
            method: method.clone(),
        })
        .observe(start.elapsed().as_secs_f64());
    m.http_requests
        .get_or_create(&metrics::HttpLabels {
            route,
            method,
            status: response.status().as_u16().to_string(),
        })
        .inc();
    response
}

/// Why [`serve`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// No tokens are configured and the listener is not on a loopback address.
    #[error(
        "no API tokens configured: refusing to serve on non-loopback address {0} (configure tokens or bind 127.0.0.1)"
    )]
    NotLoopback(SocketAddr),
    /// The listener failed.
    #[error("serving failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Serve [`router`] on `listener` until `shutdown` resolves (then finish
/// in-flight requests). With no tokens configured it refuses a non-loopback
/// listener ([`ServeError::NotLoopback`]) and logs a warning that it serves
/// loopback only. Does not start [`crate::relay()`] or [`crate::reconcile()`]: spawn those.
pub async fn serve(
    app: App,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let (open, tokens) = (app.requires_loopback(), app.auth.len());
    serve_router(router(app), open, tokens, listener, shutdown).await
}

/// Serve `router` with the loopback rule of [`serve`] (`requires_loopback`:
/// no tokens are configured).
pub(crate) async fn serve_router(
    router: Router,
    requires_loopback: bool,
    tokens: usize,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let addr = listener.local_addr()?;
    if requires_loopback {
        if !addr.ip().is_loopback() {
            return Err(ServeError::NotLoopback(addr));
        }
        tracing::warn!(%addr, "no API tokens configured: serving on loopback only; every request acts as admin of tenant `{OPEN_TENANT}`");
    }
    tracing::info!(%addr, tokens, "dispatcher listening");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

static OPENAPI: LazyLock<String> = LazyLock::new(|| crate::openapi().to_string());

/// This API's OpenAPI 3.1 document.
#[utoipa::path(get, path = "/openapi.json", tag = "ops", responses((status = 200, description = "OpenAPI 3.1 document", content_type = "application/json", body = serde_json::Value)))]
pub async fn openapi_json() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        OPENAPI.as_str(),
    )
        .into_response()
}
