//! The MCP sessions of this dispatcher, bound to their principal at the
//! HTTP layer: [`gate`] runs before rmcp sees a request and answers 404
//! "session not found" to any request (POST, GET, resume, DELETE) naming a
//! session that is not the caller's, exactly as for an unknown session
//! ("not yours" reads as "not there"). The owner is the principal whose
//! `initialize` opened the session (recorded from the answer's
//! `Mcp-Session-Id`). [`GatedSessions`] wraps rmcp's
//! [`LocalSessionManager`]: it forgets a session when rmcp closes it (a
//! DELETE, the idle timeout), closes sessions that sent nothing after their
//! `initialize` within [`INIT_GRACE`], and keeps the gauge
//! `glia_dispatcher_mcp_sessions`. Sessions are capped per principal and
//! in total ([`crate::Limits::mcp_sessions_per_principal`],
//! [`crate::Limits::mcp_sessions`]): beyond, `initialize` is refused with
//! 429 `too_many_mcp_sessions` (the principal's) or 503 (the server's).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::Stream;
use prometheus_client::metrics::gauge::Gauge;
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{ServerSseMessage, SessionId};
use rmcp::transport::streamable_http_server::{RestoreOutcome, SessionManager};
use serde_json::json;

use crate::auth::Principal;

/// How long a session may stay without a message after its `initialize`
/// (an MCP client sends `notifications/initialized` right away) before it
/// is closed.
pub const INIT_GRACE: Duration = Duration::from_secs(60);

/// The MCP session id header (MCP streamable HTTP transport).
const SESSION_HEADER: &str = "mcp-session-id";

/// Who owns which session, and the counts the caps read.
pub struct Sessions {
    state: Mutex<State>,
    per_principal: usize,
    total: usize,
    gauge: Gauge,
}

#[derive(Default)]
struct State {
    /// Sessions rmcp holds: their owner once bound, and whether a message
    /// came after `initialize`.
    live: HashMap<SessionId, Entry>,
    /// Sessions per owner: bound ones plus `initialize`s in flight.
    counts: HashMap<String, usize>,
    /// Bound sessions plus `initialize`s in flight, over all owners.
    held: usize,
}

#[derive(Default)]
struct Entry {
    owner: Option<Principal>,
    used: bool,
}

/// A slot taken for an `initialize` in flight; released on drop unless
/// [`Slot::bind`] turned it into a session.
struct Slot {
    sessions: Arc<Sessions>,
    owner: Option<Principal>,
}

impl Slot {
    /// The `initialize` opened session `id`: it is the slot's owner's.
    fn bind(mut self, id: &str) {
        let Some(owner) = self.owner.take() else {
            return;
        };
        let mut state = self.sessions.lock();
        match state.live.get_mut(id) {
            Some(entry) if entry.owner.is_none() => entry.owner = Some(owner),
            // Closed already (or unknown): give the slot back.
            _ => release(&mut state, &owner),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            release(&mut self.sessions.lock(), &owner);
        }
    }
}

fn release(state: &mut State, owner: &Principal) {
    state.held = state.held.saturating_sub(1);
    let key = owner_key(owner);
    if let Some(n) = state.counts.get_mut(&key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            state.counts.remove(&key);
        }
    }
}

/// A principal as a map key (its tenant, scopes and name).
fn owner_key(p: &Principal) -> String {
    serde_json::to_string(p).unwrap_or_default()
}

/// Why an `initialize` was refused.
#[derive(Debug, PartialEq, Eq)]
enum Full {
    Principal(usize),
    Total(usize),
}

impl Sessions {
    /// Sessions capped at `per_principal` per principal and `total` in all;
    /// `gauge` shows how many are open.
    pub fn new(per_principal: usize, total: usize, gauge: Gauge) -> Arc<Sessions> {
        Arc::new(Sessions {
            state: Mutex::default(),
            per_principal,
            total,
            gauge,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent under a panic (counts only).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn reserve(self: &Arc<Self>, p: &Principal) -> Result<Slot, Full> {
        let mut state = self.lock();
        if state.held >= self.total {
            return Err(Full::Total(self.total));
        }
        let n = state.counts.entry(owner_key(p)).or_default();
        if *n >= self.per_principal {
            return Err(Full::Principal(self.per_principal));
        }
        *n += 1;
        state.held += 1;
        Ok(Slot {
            sessions: self.clone(),
            owner: Some(p.clone()),
        })
    }

    /// True when session `id` is open and `p`'s.
    fn owned_by(&self, id: &str, p: &Principal) -> bool {
        self.lock()
            .live
            .get(id)
            .is_some_and(|e| e.owner.as_ref() == Some(p))
    }

    fn opened(&self, id: &SessionId) {
        let mut state = self.lock();
        state.live.insert(id.clone(), Entry::default());
        self.gauge.set(state.live.len() as i64);
    }

    fn used(&self, id: &SessionId) {
        if let Some(e) = self.lock().live.get_mut(id) {
            e.used = true;
        }
    }

    fn is_used(&self, id: &SessionId) -> bool {
        self.lock().live.get(id).is_none_or(|e| e.used)
    }

    fn closed(&self, id: &SessionId) {
        let mut state = self.lock();
        if let Some(entry) = state.live.remove(id)
            && let Some(owner) = entry.owner
        {
            release(&mut state, &owner);
        }
        self.gauge.set(state.live.len() as i64);
    }
}

/// The plain 404 rmcp answers for an unknown session; a session of another
/// principal gets the same.
fn session_not_found() -> Response {
    (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response()
}

fn too_many(full: Full) -> Response {
    let (status, message) = match full {
        Full::Principal(n) => (
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "this token already holds {n} MCP sessions (the most per token); close one (DELETE /mcp) or wait until one idles out"
            ),
        ),
        Full::Total(n) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("this server already holds {n} MCP sessions (its most); retry later"),
        ),
    };
    let body = json!({"error": {"code": "too_many_mcp_sessions", "message": message}});
    (status, [(header::RETRY_AFTER, "30")], axum::Json(body)).into_response()
}

/// The HTTP layer's session check (after authentication): a request naming
/// a session must be its owner's, else 404 as for an unknown one; a POST
/// without a session (an `initialize`) takes a slot under the caps and
/// binds the session it opens to `p`. The request goes on with `p` in its
/// extensions (rmcp hands them to the handler).
pub async fn gate(sessions: Arc<Sessions>, p: Principal, mut req: Request, next: Next) -> Response {
    let named = req
        .headers()
        .get(SESSION_HEADER)
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    let slot = match named {
        Some(id) => {
            if !sessions.owned_by(&id, &p) {
                return session_not_found();
            }
            None
        }
        None if req.method() == Method::POST => match sessions.reserve(&p) {
            Ok(slot) => Some(slot),
            Err(full) => return too_many(full),
        },
        None => None,
    };
    req.extensions_mut().insert(p);
    let res = next.run(req).await;
    if let Some(slot) = slot
        && let Some(id) = res
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
    {
        slot.bind(id);
    }
    res
}

/// rmcp's [`LocalSessionManager`] that tells [`Sessions`] when sessions
/// open, are used and close, and closes one that sent nothing after its
/// `initialize` within [`INIT_GRACE`].
pub struct GatedSessions {
    inner: Arc<LocalSessionManager>,
    sessions: Arc<Sessions>,
    grace: Duration,
}

impl GatedSessions {
    /// `inner`, reporting to `sessions`.
    pub fn new(inner: LocalSessionManager, sessions: Arc<Sessions>) -> GatedSessions {
        GatedSessions {
            inner: Arc::new(inner),
            sessions,
            grace: INIT_GRACE,
        }
    }
}

type Error = <LocalSessionManager as SessionManager>::Error;

impl SessionManager for GatedSessions {
    type Error = Error;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let (id, transport) = self.inner.create_session().await?;
        self.sessions.opened(&id);
        let (inner, sessions, grace, sid) = (
            self.inner.clone(),
            self.sessions.clone(),
            self.grace,
            id.clone(),
        );
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            if !sessions.is_used(&sid) {
                tracing::debug!(session = %sid, "MCP session sent nothing after initialize; closed");
                if let Err(e) = inner.close_session(&sid).await {
                    tracing::warn!(session = %sid, "closing an unused MCP session failed: {e}");
                }
                sessions.closed(&sid);
            }
        });
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<rmcp::model::ServerJsonRpcMessage, Self::Error> {
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        let closed = self.inner.close_session(id).await;
        self.sessions.closed(id);
        closed
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.sessions.used(id);
        self.inner.create_stream(id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.sessions.used(id);
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.sessions.used(id);
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.sessions.used(id);
        self.inner.resume(id, last_event_id).await
    }

    async fn restore_session(
        &self,
        _id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        // No external store: an unknown session stays unknown (404).
        Ok(RestoreOutcome::NotSupported)
    }
}
