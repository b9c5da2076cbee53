//! glia as an MCP server: `/mcp`, streamable HTTP (rmcp's server), with the
//! API's bearer tokens. Each agent of the token's tenant is a tool; a call
//! starts a run through the normal admission ([`crate::admission`]) and
//! answers when it ends, or with where it waits and how to continue.
//! glia's own tools list and decide approvals ([`crate::control`]), wait
//! for a run and cancel one. Progress notifications carry the run's events;
//! a client's `notifications/cancelled` cancels the call's run. The whole
//! contract: `docs/mcp.md`, "glia as an MCP server".
//!
//! Auth: every HTTP request to `/mcp` is authenticated like `/v1` (no token
//! or an unknown one: 401 with the API's error body) and carries its
//! [`Principal`] to the handler. A session is bound at the HTTP layer to
//! the principal whose `initialize` opened it ([`sessions::gate`]): a POST,
//! GET (also a `Last-Event-ID` resume) or DELETE naming another
//! principal's session answers 404 as for an unknown session. "Not yours"
//! answers like "not there" (a run of another tenant is an unknown run).
//! Sessions are capped per principal and in total ([`sessions`]).
//!
//! Sessions live in the memory of the dispatcher that opened them (rmcp's
//! `LocalSessionManager`); behind several dispatchers a client's requests
//! must reach the same one (sticky routing), else it opens a new session.

mod runs;
mod sessions;
pub mod tools;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::middleware;
use glia_backends::{ApprovalFilter, RunStatus};
use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam,
    ContentBlock, ErrorData, Extensions, Implementation, ListToolsResult, PaginatedRequestParams,
    RequestId, ServerCapabilities, ServerConfig,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, SessionConfig};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use sessions::{GatedSessions, Sessions};
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use uuid::Uuid;

use crate::app::App;
use crate::auth::{Principal, Scope};
use crate::error::ApiError;
use crate::model::{CreateRun, DecisionBody};
use runs::{Progress, Stop};
use tools::{AgentArgs, CancelArgs, DecideArgs, ListArgs, WaitArgs};

/// The `_meta` key a client may send with a `tools/call` to name the call
/// for idempotency across sessions (the key glia's own MCP client sends).
pub const IDEMPOTENCY_META_KEY: &str = "glia/idempotency_key";
/// The `_meta` key a client may send with a `tools/call` of an agent to
/// choose how long the call waits, in ms (at most
/// [`crate::Limits::mcp_max_wait`]).
pub const WAIT_META_KEY: &str = "glia/wait_ms";

/// The `/mcp` route: rmcp's streamable HTTP service behind the API's
/// authentication. Host header check: with no tokens configured (loopback
/// only) rmcp's loopback host list guards against DNS rebinding; with
/// tokens, the bearer token is the guard and any host is served.
pub fn routes(app: &App) -> Router<App> {
    let mut config = StreamableHttpServerConfig::default()
        .with_max_request_body_bytes(app.limits.max_body_bytes);
    if !app.auth.is_open() {
        config = config.disable_allowed_hosts();
    }
    let mut sessions = LocalSessionManager::default();
    // Longer than the longest call, so a waiting call keeps its session.
    sessions.session_config.keep_alive =
        Some(app.limits.mcp_max_wait + SessionConfig::DEFAULT_KEEP_ALIVE);
    let owners = Sessions::new(
        app.limits.mcp_sessions_per_principal,
        app.limits.mcp_sessions,
        app.metrics.mcp_sessions.clone(),
    );
    let factory_app = app.clone();
    let service = StreamableHttpService::new(
        move || Ok(GliaMcp::new(factory_app.clone())),
        Arc::new(GatedSessions::new(sessions, owners.clone())),
        config,
    );
    // 401 without a valid token (like `/v1`: the `Principal` extractor);
    // then the session check and caps.
    Router::new()
        .route_service("/mcp", service)
        .route_layer(middleware::from_fn_with_state(
            app.clone(),
            move |p: Principal, req, next| sessions::gate(owners.clone(), p, req, next),
        ))
}

/// One MCP session's server (a fresh one per session; per request for
/// clients without sessions).
#[derive(Clone)]
struct GliaMcp {
    app: App,
    session: Arc<Session>,
}

/// What a session keeps: a random nonce (its idempotency keys: a retried
/// request of the session finds its run; a fresh one per request without
/// sessions), and its calls in flight (for `notifications/cancelled`).
struct Session {
    nonce: String,
    calls: Mutex<HashMap<RequestId, Call>>,
}

impl Default for Session {
    fn default() -> Session {
        let mut bytes = [0u8; 16];
        // No randomness: a nonce from the clock still differs per session
        // (the keys only need to be unguessable across sessions).
        if getrandom::fill(&mut bytes).is_err() {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos();
            bytes = nanos.to_le_bytes();
        }
        Session {
            nonce: bytes.iter().map(|b| format!("{b:02x}")).collect(),
            calls: Mutex::default(),
        }
    }
}

/// A call of an agent tool: its run once admitted, and a cancel that came
/// before (applied once the run exists; one that came before the call
/// itself keeps it from starting a run). `active` once the call runs (a
/// cancel's marker for a call not yet seen is not).
#[derive(Default)]
struct Call {
    run: Option<Uuid>,
    cancel: Option<(Principal, String)>,
    active: bool,
}

/// How long a cancelled call stays known to its session: rmcp cancels the
/// call before it hands the `notifications/cancelled` to
/// [`GliaMcp::on_cancelled`], which must still find the call's run.
const CANCELLED_CALL_LINGER: Duration = Duration::from_secs(30);

/// Removes a call from its session when the call ends, however it ends (a
/// cancelled one after [`CANCELLED_CALL_LINGER`]).
struct CallGuard {
    session: Arc<Session>,
    id: RequestId,
    cancelled: tokio_util::sync::CancellationToken,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let (session, id) = (self.session.clone(), self.id.clone());
        let remove = move || {
            if let Ok(mut calls) = session.calls.lock() {
                calls.remove(&id);
            }
        };
        if self.cancelled.is_cancelled() {
            tokio::spawn(async move {
                tokio::time::sleep(CANCELLED_CALL_LINGER).await;
                remove();
            });
        } else {
            remove();
        }
    }
}

fn principal(extensions: &Extensions) -> Result<Principal, ErrorData> {
    extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Principal>())
        .cloned()
        .ok_or_else(|| {
            ErrorData::internal_error("the request carries no authenticated principal", None)
        })
}

/// An API error as MCP answers it: 5xx as an internal error (retrying may
/// help), the rest as an error result the caller (and its model) reads,
/// with the API's code.
fn refused(e: ApiError) -> Result<CallToolResult, ErrorData> {
    let status = e.status();
    let detail = e.body().error;
    let data = json!({"code": detail.code, "status": status.as_u16()});
    if status.is_server_error() {
        return Err(ErrorData::internal_error(detail.message, Some(data)));
    }
    Ok(CallToolResult::error(vec![ContentBlock::text(format!(
        "refused ({}): {}",
        detail.code, detail.message
    ))]))
}

fn bad_args(e: tools::ArgError) -> ErrorData {
    ErrorData::invalid_params(
        e.to_string(),
        Some(json!({"field": e.field, "reason": e.reason})),
    )
}

fn forbidden(scope: Scope) -> ErrorData {
    ErrorData::invalid_request(
        format!("this token lacks the `{}` scope", scope.as_str()),
        Some(json!({"code": "forbidden", "scope": scope.as_str()})),
    )
}

impl GliaMcp {
    fn new(app: App) -> GliaMcp {
        GliaMcp {
            app,
            session: Arc::default(),
        }
    }

    /// The request's principal. The session is the principal's: the HTTP
    /// layer ([`sessions::gate`]) lets no other principal's request reach it.
    fn caller(&self, extensions: &Extensions) -> Result<Principal, ErrorData> {
        principal(extensions)
    }

    /// The wait of a call: `requested` ms (none: [`crate::Limits::mcp_wait`]),
    /// at most [`crate::Limits::mcp_max_wait`]. Errors: why `requested` is
    /// too long.
    fn wait(&self, requested: Option<u64>) -> Result<Duration, String> {
        let max = self.app.limits.mcp_max_wait;
        match requested {
            None => Ok(self.app.limits.mcp_wait.min(max)),
            Some(ms) if u128::from(ms) <= max.as_millis() => Ok(Duration::from_millis(ms)),
            Some(ms) => Err(format!(
                "{ms} is more than the longest wait, {} ms",
                max.as_millis()
            )),
        }
    }

    /// The session's record of call `id`, made active; `None` when a
    /// cancel for it came already (the call must not start a run).
    fn register(&self, id: &RequestId) -> Result<Option<()>, ErrorData> {
        let mut calls = self.calls()?;
        let call = calls.entry(id.clone()).or_default();
        call.active = true;
        Ok(call.cancel.is_none().then_some(()))
    }

    fn calls(&self) -> Result<std::sync::MutexGuard<'_, HashMap<RequestId, Call>>, ErrorData> {
        self.session
            .calls
            .lock()
            .map_err(|_| ErrorData::internal_error("the session's calls are poisoned", None))
    }

    async fn call_agent(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let p = self.caller(&context.extensions)?;
        let name = request.name.to_string();
        // The call is known to its session from here on: a cancel that
        // comes at any later point finds it (and one that came before it
        // keeps it from starting a run).
        let _guard = CallGuard {
            session: self.session.clone(),
            id: context.id.clone(),
            cancelled: context.ct.clone(),
        };
        if self.register(&context.id)?.is_none() || context.ct.is_cancelled() {
            return Err(call_cancelled());
        }
        if !p.has(Scope::Submit) {
            return Err(forbidden(Scope::Submit));
        }
        // The tool names the agent (agent names are provider-safe already);
        // an agent of another tenant, or none, is an unknown tool.
        let agent = self
            .app
            .log
            .get_agent(&p.tenant, &name, None)
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        if agent.is_none() || glia_proto::tool_names::provider_tool_name(&name) != name {
            return Err(ErrorData::invalid_params(
                format!("no tool {name:?}"),
                Some(json!({"field": "name"})),
            ));
        }
        let args: AgentArgs = tools::parse(&name, request.arguments.as_ref()).map_err(bad_args)?;
        let meta = &context.meta.0.0;
        let wait_ms = match meta.get(WAIT_META_KEY) {
            None => None,
            Some(v) => Some(
                whole_ms(v)
                    .ok_or_else(|| bad_meta(WAIT_META_KEY, "must be a whole number of ms"))?,
            ),
        };
        let wait = self
            .wait(wait_ms)
            .map_err(|reason| bad_meta(WAIT_META_KEY, &reason))?;
        let key = self.idempotency_key(&context)?;
        crate::admission::check_labels("", &args.tags, &args.metadata).map_err(|e| match e {
            ApiError::InvalidField { field, reason } => bad_args(tools::ArgError { field, reason }),
            other => ErrorData::invalid_params(other.to_string(), None),
        })?;
        let req = CreateRun {
            goal: args.goal,
            config: Default::default(),
            batch_id: None,
            agent: Some(name.clone()),
            tags: args.tags,
            metadata: args.metadata,
            start_at: None,
            recorded_tools: None,
        };
        // A cancel that came while the call was read: no run.
        let cancelled_early = self
            .calls()?
            .get(&context.id)
            .is_some_and(|c| c.cancel.is_some());
        if cancelled_early || context.ct.is_cancelled() {
            return Err(call_cancelled());
        }
        let (run, created) =
            match crate::admission::admit_run(&self.app, &p.tenant, key, &req, None).await {
                Ok(admitted) => admitted,
                Err(e) => return refused(e),
            };
        tracing::info!(run_id = %run.run_id, agent = %name, created, tenant = %p.tenant, "run admitted over MCP");
        // A cancel that came while the run was admitted applies now.
        let early = {
            let mut calls = self.calls()?;
            let call = calls.entry(context.id.clone()).or_default();
            call.run = Some(run.run_id);
            call.cancel.take()
        };
        if let Some((by, reason)) = early {
            cancel(&self.app, &by, run.run_id, &reason).await;
        }
        self.answer(run, 0, wait, &context).await
    }

    /// Follow `run` from event `after` for at most `wait`, then answer.
    async fn answer(
        &self,
        run: glia_backends::RunSummary,
        after: u64,
        wait: Duration,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let progress = context.meta.get_progress_token().map(|token| Progress {
            peer: context.peer.clone(),
            token,
        });
        let deadline = Instant::now() + wait;
        let stop = runs::follow(
            &self.app,
            run,
            after,
            progress.as_ref(),
            deadline,
            context.ct.cancelled(),
        )
        .await;
        match stop {
            // The run exists: a store that fails now still answers its id
            // and how to wait for it again.
            Stop::Answer(run) => match runs::result(&self.app, &run, wait).await {
                Ok(result) => Ok(result),
                Err(e) => {
                    tracing::warn!(run_id = %run.run_id, "MCP call: reading where the run stands failed: {e}");
                    Ok(runs::running(&run, wait, true))
                }
            },
            Stop::Abandoned => Err(call_cancelled()),
        }
    }

    /// The call's idempotency key: from the client's `_meta`
    /// [`IDEMPOTENCY_META_KEY`] when given (the same key names the same run
    /// in any session), else from the session's nonce and the request id (a
    /// retried request of the session finds its run; without sessions each
    /// request has its own nonce, so only the `_meta` key makes a retry
    /// find its run). Hashed, prefixed `mcp:`.
    fn idempotency_key(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<Option<String>, ErrorData> {
        let hash = |s: &str| format!("mcp:{:x}", Sha256::digest(s.as_bytes()));
        if let Some(v) = context.meta.0.0.get(IDEMPOTENCY_META_KEY) {
            let key = v.as_str().filter(|k| !k.is_empty() && k.len() <= 1024);
            return match key {
                Some(k) => Ok(Some(hash(&format!("key\u{0}{k}")))),
                None => Err(bad_meta(
                    IDEMPOTENCY_META_KEY,
                    "must be a string of 1 to 1024 bytes",
                )),
            };
        }
        Ok(Some(hash(&format!(
            "session\u{0}{}\u{0}{}",
            self.session.nonce,
            request_id_text(&context.id)
        ))))
    }

    async fn list_approvals(
        &self,
        p: &Principal,
        args: ListArgs,
    ) -> Result<CallToolResult, ErrorData> {
        if !p.has(Scope::Approve) {
            return Err(forbidden(Scope::Approve));
        }
        let limit = match args.limit {
            None => self.app.limits.default_page,
            Some(n) if (1..=self.app.limits.max_page).contains(&n) => n,
            Some(n) => {
                return Err(bad_args(tools::ArgError {
                    field: "limit".into(),
                    reason: format!("{n} is outside 1..={}", self.app.limits.max_page),
                }));
            }
        };
        let filter = ApprovalFilter {
            tenant: p.tenant_filter(),
            tool: args.tool,
            run_id: args.run_id,
            pending_only: true,
            expired_by: None,
            limit,
        };
        let rows = match self.app.log.approvals(&filter).await {
            Ok(rows) => rows,
            Err(e) => return refused(e.into()),
        };
        let approvals: Vec<Value> = rows.iter().map(runs::approval_json).collect();
        let text = if rows.is_empty() {
            "No approvals wait for a decision.".to_owned()
        } else {
            rows.iter()
                .map(|a| {
                    format!(
                        "run {} call {}: {} {}",
                        a.run_id, a.call_id, a.tool, a.input
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        let mut result = CallToolResult::structured(json!({"approvals": approvals}));
        result.content.insert(0, ContentBlock::text(text));
        Ok(result)
    }

    async fn decide(&self, p: &Principal, args: DecideArgs) -> Result<CallToolResult, ErrorData> {
        if !p.has(Scope::Approve) {
            return Err(forbidden(Scope::Approve));
        }
        let body = DecisionBody {
            decision: args.decision,
            reason: args.reason,
            input: args.input,
            args_hash: args.args_hash,
        };
        if let Err(e) = body.to_decision() {
            return Err(bad_args(tools::ArgError {
                field: "input".into(),
                reason: e.to_string(),
            }));
        }
        match crate::control::decide_one(&self.app, p, args.run_id, args.call_id, &body).await {
            Ok(accepted) => {
                let text = format!(
                    "Decided: {} of call {} in run {}. Call {} with {{\"run_id\": \"{}\"}} for the run's answer.",
                    json!(accepted.decision),
                    accepted.call_id.as_deref().unwrap_or_default(),
                    accepted.run_id,
                    tools::WAIT_RUN,
                    accepted.run_id
                );
                let mut result = CallToolResult::structured(json!({
                    "run_id": accepted.run_id,
                    "call_id": accepted.call_id,
                    "decision": accepted.decision,
                    "inbox_ids": accepted.inbox_ids,
                }));
                result.content.insert(0, ContentBlock::text(text));
                Ok(result)
            }
            Err(ApiError::InvalidField { field, reason }) => {
                Err(bad_args(tools::ArgError { field, reason }))
            }
            Err(e) => refused(e),
        }
    }

    async fn wait_run(
        &self,
        p: &Principal,
        args: WaitArgs,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let wait = self.wait(args.wait_ms).map_err(|reason| {
            bad_args(tools::ArgError {
                field: "wait_ms".into(),
                reason,
            })
        })?;
        let run = match crate::control::visible_run(&self.app, p, args.run_id).await {
            Ok(run) => run,
            Err(e) => return refused(e),
        };
        let after = run.head_seq;
        self.answer(run, after, wait, context).await
    }

    async fn cancel_run(
        &self,
        p: &Principal,
        args: CancelArgs,
    ) -> Result<CallToolResult, ErrorData> {
        if !p.has(Scope::Submit) {
            return Err(forbidden(Scope::Submit));
        }
        let run = match crate::control::visible_run(&self.app, p, args.run_id).await {
            Ok(run) => run,
            Err(e) => return refused(e),
        };
        let status = if run.status == RunStatus::Done {
            "done"
        } else {
            let reason = args
                .reason
                .map(|r| r.trim().to_owned())
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| "cancelled over MCP".into());
            if let Err(e) =
                crate::control::cancel_run(&self.app, run.run_id, &reason, &p.by()).await
            {
                return refused(e);
            }
            "cancelling"
        };
        let mut result =
            CallToolResult::structured(json!({"run_id": run.run_id, "status": status}));
        result.content.insert(
            0,
            ContentBlock::text(match status {
                "done" => format!("The run {} is already done.", run.run_id),
                _ => format!("The run {} is being cancelled.", run.run_id),
            }),
        );
        Ok(result)
    }
}

/// The error of a call cancelled by its client (or its session's end).
fn call_cancelled() -> ErrorData {
    ErrorData::internal_error("the call was cancelled", Some(json!({"code": "cancelled"})))
}

/// Invalid params for `_meta` key `key` (not an argument of the tool).
fn bad_meta(key: &str, reason: &str) -> ErrorData {
    let field = format!("_meta.{key}");
    ErrorData::invalid_params(
        format!("{field}: {reason}"),
        Some(json!({"field": field, "reason": reason})),
    )
}

/// A JSON whole number of ms (`5` or `5.0`, as the tools' integer
/// arguments take it).
fn whole_ms(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f <= u64::MAX as f64)
            .map(|f| f as u64)
    })
}

fn request_id_text(id: &RequestId) -> String {
    match id {
        rmcp::model::NumberOrString::Number(n) => format!("n:{n}"),
        rmcp::model::NumberOrString::String(s) => format!("s:{s}"),
    }
}

/// Cancel run `id` for `p` (scope `submit`, its tenant's run, not done);
/// what a client's `notifications/cancelled` for a call does. Failures are
/// logged: a notification has no answer.
async fn cancel(app: &App, p: &Principal, id: Uuid, reason: &str) {
    if !p.has(Scope::Submit) {
        tracing::warn!(run_id = %id, "MCP cancel ignored: the token lacks the `submit` scope");
        return;
    }
    match crate::control::visible_run(app, p, id).await {
        Ok(run) if run.status == RunStatus::Done => {}
        Ok(_) => {
            if let Err(e) = crate::control::cancel_run(app, id, reason, &p.by()).await {
                tracing::warn!(run_id = %id, "MCP cancel failed: {e}");
            }
        }
        Err(e) => tracing::warn!(run_id = %id, "MCP cancel refused: {e}"),
    }
}

impl ServerHandler for GliaMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("glia", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Each tool not starting with _glia_ is a glia agent: calling it starts a run on `goal` and answers the run's answer, or, when the run must wait (an approval, an external tool result, a message), its run id and how to continue. _glia_list_approvals and _glia_decide_approval decide what waits; _glia_wait_run waits for a run again; _glia_cancel_run cancels one.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let p = self.caller(&context.extensions)?;
        let mut tools = Vec::new();
        if p.has(Scope::Submit) {
            let agents = self.app.log.list_agents(&p.tenant).await.map_err(|e| {
                ErrorData::internal_error(e.to_string(), Some(json!({"code": "log_unavailable"})))
            })?;
            tools.extend(agents.iter().map(tools::agent_tool));
        }
        tools.extend(tools::own_tools(
            p.has(Scope::Approve),
            p.has(Scope::Submit),
        ));
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let args = request.arguments.as_ref();
        let result = match name.as_str() {
            tools::LIST_APPROVALS => {
                let p = self.caller(&context.extensions)?;
                self.list_approvals(&p, tools::parse(&name, args).map_err(bad_args)?)
                    .await
            }
            tools::DECIDE_APPROVAL => {
                let p = self.caller(&context.extensions)?;
                self.decide(&p, tools::parse(&name, args).map_err(bad_args)?)
                    .await
            }
            tools::WAIT_RUN => {
                let p = self.caller(&context.extensions)?;
                let parsed = tools::parse(&name, args).map_err(bad_args)?;
                self.wait_run(&p, parsed, &context).await
            }
            tools::CANCEL_RUN => {
                let p = self.caller(&context.extensions)?;
                self.cancel_run(&p, tools::parse(&name, args).map_err(bad_args)?)
                    .await
            }
            _ => self.call_agent(request, context).await,
        }?;
        Ok(result.into())
    }

    async fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        context: NotificationContext<RoleServer>,
    ) {
        let Some(request) = notification.request_id else {
            return;
        };
        let Ok(p) = self.caller(&context.extensions) else {
            tracing::warn!("MCP cancel ignored: no principal");
            return;
        };
        let reason = notification
            .reason
            .filter(|r| !r.trim().is_empty())
            .map_or_else(
                || "the MCP client cancelled the call".to_owned(),
                |r| format!("the MCP client cancelled the call: {r}"),
            );
        let run = {
            let Ok(mut calls) = self.session.calls.lock() else {
                return;
            };
            let Some(call) = calls.get_mut(&request) else {
                // The call is not here yet (rmcp runs the request and this
                // notification as separate tasks) or is over: a marker
                // keeps a call that comes later from starting a run, and
                // goes after a while.
                calls.insert(
                    request.clone(),
                    Call {
                        cancel: Some((p, reason)),
                        ..Call::default()
                    },
                );
                let session = self.session.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(CANCELLED_CALL_LINGER).await;
                    if let Ok(mut calls) = session.calls.lock()
                        && calls.get(&request).is_some_and(|c| !c.active)
                    {
                        calls.remove(&request);
                    }
                });
                return;
            };
            match call.run {
                Some(run) => run,
                None => {
                    call.cancel = Some((p, reason));
                    return;
                }
            }
        };
        cancel(&self.app, &p, run, &reason).await;
    }
}
