//! Serving a test MCP server ([`crate::lying_mcp`], [`crate::odd_mcp`]) over
//! rmcp's transports.

use std::sync::Arc;

use rmcp::{ServerHandler, ServiceExt};

/// Serve `server` on stdin/stdout until the client closes them. Errors:
/// rmcp's, as text.
pub async fn stdio<S: ServerHandler>(server: S) -> Result<(), String> {
    let service = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| e.to_string())?;
    service.waiting().await.map_err(|e| e.to_string())?;
    Ok(())
}

/// An axum router serving `server` as streamable HTTP at `/mcp`, a fresh
/// clone of it for each session.
pub fn router<S: ServerHandler + Clone>(server: S) -> axum::Router {
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    };
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    axum::Router::new().nest_service("/mcp", service)
}

/// The idempotency key a `tools/call` carries in `_meta`
/// (`glia_agent::mcp::IDEMPOTENCY_META_KEY`, in the request's or the
/// params' `_meta`), or `-`.
pub fn idempotency_key(
    context: &rmcp::service::RequestContext<rmcp::RoleServer>,
    request: &rmcp::model::CallToolRequestParams,
) -> String {
    let key = glia_agent::mcp::IDEMPOTENCY_META_KEY;
    context
        .meta
        .0
        .0
        .get(key)
        .or_else(|| request.meta.as_ref().and_then(|m| m.0.0.get(key)))
        .and_then(serde_json::Value::as_str)
        .unwrap_or("-")
        .to_owned()
}

/// Bind a free loopback port and serve `serve(listener)` on it in this
/// process; answers `http://127.0.0.1:PORT/mcp`. Needs a Tokio runtime.
pub async fn spawn_on_loopback<F>(serve: impl FnOnce(tokio::net::TcpListener) -> F) -> String
where
    F: std::future::Future<Output = std::io::Result<()>> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let url = format!(
        "http://{}/mcp",
        listener.local_addr().expect("bound address")
    );
    tokio::spawn(serve(listener));
    url
}

/// The names in the file at `path`, one a line, blank lines left out; none
/// when it does not exist.
pub fn names_file(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}
