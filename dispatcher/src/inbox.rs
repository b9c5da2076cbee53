//! The approvals inbox: server-rendered HTML pages under `/inbox` for the
//! people who decide approvals.
//!
//! | page | what |
//! |---|---|
//! | `GET /inbox/login`, `POST /inbox/login` | sign in with an API token (scope `approve` or `admin`); with no tokens configured, no sign-in |
//! | `GET /inbox` | the queue: pending approvals oldest first, filters, bulk decisions; live (SSE at `/inbox/stream`) |
//! | `GET /inbox/runs/{run}/calls/{call}` | one approval: why it waits, the tool (description, source, trust, server-supplied hints), the run's context, the arguments, approve / reject / edit |
//! | `POST /inbox/runs/{run}/calls/{call}/edit` | an edit's preview: validated against the tool's schema, shown as a diff |
//! | `POST /inbox/runs/{run}/calls/{call}/decide` | post a decision (then the next pending approval, else the queue) |
//! | `POST /inbox/decide` | approve or reject the selected approvals |
//! | `GET /inbox/runs/{run}` | redirects to the console's run page, `/console/runs/{run}` ([`crate::console`]) |
//! | `GET /inbox/history` | decided and expired approvals from the event log, with the attempts that lost a race; `?format=csv` |
//! | `POST /inbox/logout` | sign out |
//!
//! Invariants:
//!
//! - **Sessions** are stateless signed cookies (`glia_inbox`): the SHA-256
//!   digest of the token (never the token), an expiry and a random nonce,
//!   HMAC-SHA256-signed with [`InboxConfig::session_key`]. Each request looks
//!   the digest up in the configured tokens again, so removing a token ends
//!   its sessions. The cookie is `HttpOnly`, `SameSite=Strict`, `Path=/`
//!   (one sign-in for `/inbox` and the console's `/console` pages; and
//!   `Secure` with [`InboxConfig::secure_cookies`]). Dispatcher replicas
//!   behind one address must share the key (`GLIA_SESSION_KEY`).
//! - **No sign-in** when no tokens are configured (`glia dev`, a loopback
//!   dispatcher without tokens): every page acts as the open admin, as the
//!   API does ([`crate::Auth::open_principal`], the one rule). Forms still
//!   carry a CSRF token and are origin-checked.
//! - **CSRF**: every form carries a token (HMAC of the session nonce); every
//!   POST must carry it and, when the browser sends `Origin` or
//!   `Sec-Fetch-Site`, come from the same origin. Sign-in (no session yet)
//!   is checked by origin.
//! - **Tenants**: a session acts as its token's principal: it sees and
//!   decides only its tenant's runs (another tenant's run is a 404), and
//!   decisions record its name as the decider (`approval.resolved.by`).
//! - **Decisions** go through the same path as `POST
//!   /v1/runs/{id}/approvals/{call_id}` (`control::decide_one`): first
//!   decision wins, bound to the arguments hash the page showed.
//! - **Untrusted text** (goals, model text, tool arguments and results) is
//!   only ever rendered by minijinja with HTML auto-escaping; no template
//!   marks such text safe. Pages send a `Content-Security-Policy` allowing
//!   only this server's own script and style (no inline script).
//!
//! Templates are `dispatcher/templates/*.html` (compiled in); the script is
//! `dispatcher/templates/inbox.js`, plain JavaScript with no build step.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::LazyLock;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use chrono::{DateTime, Utc};
use glia_backends::{ApprovalFilter, ApprovalRow, LogError};
use glia_proto::{ContentBlock, Message, RunState, ToolSpec, args_hash};
use minijinja::{Environment, context};
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::app::App;
use crate::auth::{Principal, Scope};
pub use crate::config::InboxConfig;
use crate::control::{decide_many, decide_one, visible_run};
use crate::error::ApiError;
use crate::history::{self, HistoryQuery};
use crate::model::{DecisionBody, DecisionKind};

/// What a path segment may not hold unencoded (RFC 3986 `pchar`): call ids
/// are the provider's and may hold anything.
const PATH_SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}');

/// The session cookie's name.
pub const COOKIE: &str = "glia_inbox";

/// What a session cookie carries (signed, not encrypted: nothing secret).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Claims {
    /// SHA-256 of the token, hex.
    d: String,
    /// Expiry, Unix seconds.
    e: i64,
    /// Random nonce (CSRF tokens derive from it).
    n: String,
}

/// A signed-in approver (or, with no tokens configured, the open admin:
/// see [`crate::Auth::open_principal`]).
#[derive(Debug, Clone)]
pub struct Session {
    /// Who.
    pub principal: Principal,
    /// The form token of this session.
    pub csrf: String,
    /// No sign-in: no tokens are configured (loopback only, `glia dev`).
    pub open: bool,
}

impl Session {
    /// What every page's frame shows: who, the form token, whether it is the
    /// open (no sign-in) session, and the tenant. Merge it into a page's
    /// context with `context! { …, ..s.frame() }`.
    pub(crate) fn frame(&self) -> minijinja::Value {
        context! { who => self.principal.by(), csrf => self.csrf.clone(), open => self.open, tenant => self.principal.tenant.clone() }
    }
}

/// The nonce CSRF tokens derive from when no tokens are configured (there
/// is no cookie): the token is still an HMAC under the session key, which a
/// page of another site cannot read or compute.
const OPEN_NONCE: &str = "open";

fn sign_cookie(cfg: &InboxConfig, claims: &Claims) -> String {
    let body = B64.encode(serde_json::to_vec(claims).expect("claims serialise"));
    let sig = B64.encode(cfg.mac(&[b"session", body.as_bytes()]));
    format!("{body}.{sig}")
}

fn csrf_of(cfg: &InboxConfig, nonce: &str) -> String {
    B64.encode(cfg.mac(&[b"csrf", nonce.as_bytes()]))
}

/// Constant-time comparison of two byte strings.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn cookie_value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The session of a request: with no tokens configured, the open admin's
/// (no sign-in, [`crate::Auth::open_principal`], the API's rule); else the
/// cookie's, if it is valid, unexpired, and its token still configured with
/// scope `approve`.
pub(crate) fn session(app: &App, headers: &HeaderMap) -> Option<Session> {
    if let Some(principal) = app.auth.open_principal() {
        return Some(Session {
            principal,
            csrf: csrf_of(&app.inbox, OPEN_NONCE),
            open: true,
        });
    }
    let raw = cookie_value(headers, COOKIE)?;
    let (body, sig) = raw.split_once('.')?;
    let want = app.inbox.mac(&[b"session", body.as_bytes()]);
    if !same(&B64.decode(sig).ok()?, &want) {
        return None;
    }
    let claims: Claims = serde_json::from_slice(&B64.decode(body).ok()?).ok()?;
    if claims.e <= Utc::now().timestamp() {
        return None;
    }
    let digest: [u8; 32] = hex_decode(&claims.d)?.try_into().ok()?;
    let principal = app.auth.by_digest(&digest)?;
    principal.has(Scope::Approve).then(|| Session {
        principal,
        csrf: csrf_of(&app.inbox, &claims.n),
        open: false,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    s.len().is_multiple_of(2).then_some(())?;
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Refuse a POST another site made: `Sec-Fetch-Site` other than
/// `same-origin`/`none`, or an `Origin` whose host is not this request's `Host`.
fn same_origin(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
        && site != "same-origin"
        && site != "none"
    {
        return false;
    }
    match (
        headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()),
        headers.get(header::HOST).and_then(|v| v.to_str().ok()),
    ) {
        (Some("null"), _) => false,
        (Some(origin), Some(host)) => origin.split_once("://").map(|(_, h)| h) == Some(host),
        (Some(_), None) => false,
        (None, _) => true,
    }
}

// ----- templates -------------------------------------------------------------------------

pub(crate) static TEMPLATES: LazyLock<Environment<'static>> = LazyLock::new(|| {
    let mut env = Environment::new();
    for (name, source) in [
        ("base.html", include_str!("../templates/base.html")),
        ("login.html", include_str!("../templates/login.html")),
        ("queue.html", include_str!("../templates/queue.html")),
        ("rows.html", include_str!("../templates/rows.html")),
        ("detail.html", include_str!("../templates/detail.html")),
        ("edit.html", include_str!("../templates/edit.html")),
        (
            "console_runs.html",
            include_str!("../templates/console_runs.html"),
        ),
        (
            "console_run.html",
            include_str!("../templates/console_run.html"),
        ),
        (
            "console_head.html",
            include_str!("../templates/console_head.html"),
        ),
        (
            "console_event.html",
            include_str!("../templates/console_event.html"),
        ),
        (
            "console_one.html",
            include_str!("../templates/console_one.html"),
        ),
        ("history.html", include_str!("../templates/history.html")),
        ("error.html", include_str!("../templates/error.html")),
        (
            "console_batches.html",
            include_str!("../templates/console_batches.html"),
        ),
        (
            "console_schedules.html",
            include_str!("../templates/console_schedules.html"),
        ),
        (
            "console_experiments.html",
            include_str!("../templates/console_experiments.html"),
        ),
        (
            "console_experiment.html",
            include_str!("../templates/console_experiment.html"),
        ),
        (
            "console_batch.html",
            include_str!("../templates/console_batch.html"),
        ),
        (
            "console_agents.html",
            include_str!("../templates/console_agents.html"),
        ),
        (
            "console_agent.html",
            include_str!("../templates/console_agent.html"),
        ),
        (
            "console_diff.html",
            include_str!("../templates/console_diff.html"),
        ),
    ] {
        env.add_template(name, source)
            .expect("the inbox templates parse");
    }
    // `.html` names are auto-escaped (minijinja's default); say so explicitly.
    env.set_auto_escape_callback(|name| {
        if name.ends_with(".html") {
            minijinja::AutoEscape::Html
        } else {
            minijinja::AutoEscape::None
        }
    });
    env.add_filter("pretty", |v: minijinja::Value| -> String {
        serde_json::to_value(&v)
            .ok()
            .and_then(|j| serde_json::to_string_pretty(&j).ok())
            .unwrap_or_default()
    });
    env
});

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

pub(crate) fn html(status: StatusCode, template: &str, ctx: minijinja::Value) -> Response {
    match TEMPLATES.get_template(template).and_then(|t| t.render(ctx)) {
        Ok(body) => {
            let mut r = (status, body).into_response();
            let h = r.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            );
            h.insert(
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CSP),
            );
            h.insert(
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            );
            h.insert(
                header::REFERRER_POLICY,
                HeaderValue::from_static("same-origin"),
            );
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
        Err(e) => {
            tracing::error!("inbox template {template}: {e:#}");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the page could not be rendered",
            )
                .into_response()
        }
    }
}

pub(crate) fn error_page(s: Option<&Session>, status: StatusCode, message: &str) -> Response {
    html(
        status,
        "error.html",
        context! { status => status.as_u16(), message, ..s.map(Session::frame).unwrap_or_default() },
    )
}

pub(crate) fn api_error_page(s: &Session, e: ApiError) -> Response {
    error_page(Some(s), e.status(), &e.body().error.message)
}

pub(crate) fn log_error_page(s: &Session, e: LogError) -> Response {
    api_error_page(s, ApiError::from(e))
}

/// To the sign-in page (a request without a session).
pub(crate) fn to_login() -> Response {
    Redirect::to("/inbox/login").into_response()
}

// ----- routes ----------------------------------------------------------------------------

/// The inbox's routes (merged into [`crate::server::router`]).
pub fn routes() -> Router<App> {
    Router::new()
        .route("/inbox", get(queue))
        .route("/inbox/", get(|| async { Redirect::to("/inbox") }))
        .route("/inbox/login", get(login_page).post(login))
        .route("/inbox/logout", post(logout))
        .route("/inbox/rows", get(rows))
        .route("/inbox/stream", get(stream))
        .route("/inbox/decide", post(decide_bulk))
        .route("/inbox/history", get(history_page))
        .route("/inbox/runs/{run}", get(run_page))
        .route("/inbox/runs/{run}/calls/{call}", get(detail))
        .route("/inbox/runs/{run}/calls/{call}/edit", post(edit_preview))
        .route("/inbox/runs/{run}/calls/{call}/decide", post(decide))
        .route(
            "/inbox/static/inbox.js",
            get(|| async {
                static_file(
                    "text/javascript; charset=utf-8",
                    include_str!("../templates/inbox.js"),
                )
            }),
        )
        .route(
            "/inbox/static/inbox.css",
            get(|| async {
                static_file(
                    "text/css; charset=utf-8",
                    include_str!("../templates/inbox.css"),
                )
            }),
        )
}

fn static_file(kind: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        body,
    )
        .into_response()
}

/// The fields of a URL-encoded form body, in order (repeated names kept).
pub(crate) fn form(body: &Bytes) -> Vec<(String, String)> {
    form_urlencoded::parse(body).into_owned().collect()
}

pub(crate) fn field<'a>(f: &'a [(String, String)], name: &str) -> Option<&'a str> {
    f.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// The session of a POST with a valid CSRF token from the same origin.
// The error is the page to answer with (an axum `Response`), built once per
// refused request; boxing it would buy nothing.
#[allow(clippy::result_large_err)]
pub(crate) fn checked_post(
    app: &App,
    headers: &HeaderMap,
    f: &[(String, String)],
) -> Result<Session, Response> {
    if !same_origin(headers) {
        return Err(error_page(
            None,
            StatusCode::FORBIDDEN,
            "cross-site request refused",
        ));
    }
    let s = session(app, headers).ok_or_else(to_login)?;
    match field(f, "csrf") {
        Some(t) if same(t.as_bytes(), s.csrf.as_bytes()) => Ok(s),
        _ => Err(error_page(
            Some(&s),
            StatusCode::FORBIDDEN,
            "missing or wrong form token (CSRF): reload the page and try again",
        )),
    }
}

// ----- sign-in ---------------------------------------------------------------------------

async fn login_page(State(app): State<App>, headers: HeaderMap) -> Response {
    // Signed in, or no sign-in needed (no tokens configured).
    if session(&app, &headers).is_some() {
        return Redirect::to("/inbox").into_response();
    }
    html(
        StatusCode::OK,
        "login.html",
        context! { error => None::<String> },
    )
}

async fn login(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    if !same_origin(&headers) {
        return error_page(None, StatusCode::FORBIDDEN, "cross-site request refused");
    }
    let f = form(&body);
    let token = field(&f, "token").unwrap_or("").trim();
    let fail = |m: &str| {
        html(
            StatusCode::UNAUTHORIZED,
            "login.html",
            context! { error => m },
        )
    };
    if app.auth.is_open() {
        // Nothing to sign in to: every page acts as the open admin.
        return Redirect::to("/inbox").into_response();
    }
    let Some((digest, principal)) = app.auth.lookup(token) else {
        return fail("unknown token");
    };
    if !principal.has(Scope::Approve) {
        return fail("this token may not decide approvals (it needs scope approve or admin)");
    }
    let mut nonce = [0u8; 16];
    if getrandom::fill(&mut nonce).is_err() {
        return error_page(None, StatusCode::SERVICE_UNAVAILABLE, "no random source");
    }
    let ttl = app.inbox.session_ttl;
    let claims = Claims {
        d: hex(&digest),
        e: Utc::now().timestamp() + ttl.as_secs() as i64,
        n: hex(&nonce),
    };
    let secure = if app.inbox.secure_cookies {
        "; Secure"
    } else {
        ""
    };
    let cookie = format!(
        "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        sign_cookie(&app.inbox, &claims),
        ttl.as_secs()
    );
    tracing::info!(tenant = %principal.tenant, who = %principal.by(), "inbox sign-in");
    let mut r = Redirect::to("/inbox").into_response();
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).expect("cookie is ASCII"),
    );
    r
}

async fn logout(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    match checked_post(&app, &headers, &form(&body)) {
        Err(r) => return r,
        Ok(s) if s.open => return Redirect::to("/inbox").into_response(),
        Ok(_) => {}
    }
    let mut r = Redirect::to("/inbox/login").into_response();
    let cookie = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    r.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).expect("cookie is ASCII"),
    );
    r
}

// ----- the queue -------------------------------------------------------------------------

/// Filters of the queue (query string).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct QueueFilter {
    /// Only this tool's.
    #[serde(default)]
    pub tool: Option<String>,
    /// Only runs of this agent: its name, `name@version`, or (runs not
    /// started from an agent definition) the model.
    #[serde(default)]
    pub agent: Option<String>,
    /// Only this batch's runs.
    #[serde(default)]
    pub batch: Option<String>,
    /// Only those waiting at least this many minutes.
    #[serde(default)]
    pub min_age: Option<String>,
}

/// One queue row as the templates see it.
#[derive(Debug, Clone, Serialize)]
struct Item {
    run_id: Uuid,
    call_id: String,
    tool: String,
    args_hash: String,
    summary: String,
    goal: String,
    /// `name@version` of the agent definition the run was started from.
    agent: Option<String>,
    /// The run's model (shown when it has no agent definition).
    model: String,
    batch_id: Option<Uuid>,
    /// The batch item's `custom_id`, for a batch run.
    custom_id: Option<String>,
    requested_at: DateTime<Utc>,
    age: String,
    deadline: Option<String>,
    overdue: bool,
    expires_at: Option<DateTime<Utc>>,
    escalated: bool,
    interrupted: bool,
}

/// A short one-line summary of tool arguments: `k: v` pairs, cut at 120 characters.
fn summarize(input: &Value) -> String {
    let s = match input {
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| {
                format!(
                    "{k}: {}",
                    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
                )
            })
            .collect::<Vec<_>>()
            .join(", "),
        other => other.to_string(),
    };
    if s.chars().count() > 120 {
        format!("{}…", s.chars().take(119).collect::<String>())
    } else {
        s
    }
}

/// `950ms`, `12s`, `4m 10s`, `2h 05m`, `3d 04h`.
pub fn human(ms: i64) -> String {
    let ms = ms.max(0);
    match ms {
        ..1000 => format!("{ms}ms"),
        1000..60_000 => format!("{}s", ms / 1000),
        60_000..3_600_000 => format!("{}m {:02}s", ms / 60_000, ms % 60_000 / 1000),
        3_600_000..86_400_000 => format!("{}h {:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
        _ => format!("{}d {:02}h", ms / 86_400_000, ms % 86_400_000 / 3_600_000),
    }
}

/// The pending approvals `s` may see that pass `f`, oldest first.
async fn pending(app: &App, s: &Session, f: &QueueFilter) -> Result<Vec<Item>, LogError> {
    let filter = ApprovalFilter {
        tenant: s.principal.tenant_filter(),
        tool: f.tool.clone().filter(|t| !t.is_empty()),
        pending_only: true,
        limit: 1000,
        ..ApprovalFilter::default()
    };
    let rows = app.log.approvals(&filter).await?;
    let now = Utc::now();
    let mut runs: HashMap<Uuid, Option<RunInfo>> = HashMap::new();
    let mut items = Vec::new();
    let min_age_ms = f
        .min_age
        .as_deref()
        .and_then(|m| m.trim().parse::<i64>().ok())
        .map(|m| m * 60_000);
    let batch = f.batch.as_deref().map(str::trim).filter(|b| !b.is_empty());
    for row in rows {
        if let std::collections::hash_map::Entry::Vacant(e) = runs.entry(row.run_id) {
            let info = match (
                app.log.get_run(row.run_id).await,
                app.log.load(row.run_id).await,
            ) {
                (Ok(run), Ok(state)) => Some(RunInfo::of(&run, &state)),
                (Err(LogError::NotFound(_)), _) | (_, Err(LogError::NotFound(_))) => None,
                (Err(e), _) | (_, Err(e)) => return Err(e),
            };
            e.insert(info);
        }
        let Some(info) = runs[&row.run_id].clone() else {
            continue;
        };
        let age_ms = (now - row.requested_at).num_milliseconds();
        if f.agent
            .as_deref()
            .map(str::trim)
            .is_some_and(|a| !a.is_empty() && !info.is_agent(a))
            || batch.is_some_and(|b| info.batch_id.map(|id| id.to_string()).as_deref() != Some(b))
            || min_age_ms.is_some_and(|m| age_ms < m)
        {
            continue;
        }
        items.push(item(row, info, now));
    }
    Ok(items)
}

/// What the queue and the card show of an approval's run.
#[derive(Debug, Clone)]
struct RunInfo {
    goal: String,
    agent: Option<String>,
    model: String,
    agent_name: Option<String>,
    batch_id: Option<Uuid>,
    custom_id: Option<String>,
}

impl RunInfo {
    fn of(run: &glia_backends::RunSummary, state: &RunState) -> RunInfo {
        RunInfo {
            goal: run.goal.clone(),
            agent: state
                .config
                .agent
                .as_ref()
                .map(|a| format!("{}@{}", a.name, a.version)),
            agent_name: state.config.agent.as_ref().map(|a| a.name.clone()),
            model: state.config.model.clone(),
            batch_id: run.batch_id,
            custom_id: run.custom_id.clone(),
        }
    }

    /// Whether the queue's agent filter `a` names this run's agent (its
    /// name or `name@version`) or, for a run without one, its model.
    fn is_agent(&self, a: &str) -> bool {
        self.agent.as_deref() == Some(a) || self.agent_name.as_deref() == Some(a) || self.model == a
    }
}

fn item(row: ApprovalRow, info: RunInfo, now: DateTime<Utc>) -> Item {
    let left = row.expires_at.map(|t| (t - now).num_milliseconds());
    Item {
        summary: summarize(&row.input),
        age: human((now - row.requested_at).num_milliseconds()),
        deadline: left.map(|l| {
            if l > 0 {
                format!("in {}", human(l))
            } else {
                format!("overdue by {}", human(-l))
            }
        }),
        overdue: left.is_some_and(|l| l <= 0),
        run_id: row.run_id,
        call_id: row.call_id,
        tool: row.tool,
        args_hash: row.args_hash,
        goal: info.goal,
        agent: info.agent,
        model: info.model,
        batch_id: info.batch_id,
        custom_id: info.custom_id,
        requested_at: row.requested_at,
        expires_at: row.expires_at,
        escalated: row.escalated,
        interrupted: row.interrupted,
    }
}

async fn queue(
    State(app): State<App>,
    headers: HeaderMap,
    Query(f): Query<QueueFilter>,
) -> Response {
    let Some(s) = session(&app, &headers) else {
        return to_login();
    };
    let items = match pending(&app, &s, &f).await {
        Ok(items) => items,
        Err(e) => return log_error_page(&s, e),
    };
    let query = serde_urlencoded_query(&f);
    html(
        StatusCode::OK,
        "queue.html",
        context! { items, filter => f, query, ..s.frame() },
    )
}

fn serde_urlencoded_query(f: &QueueFilter) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    for (k, v) in [
        ("tool", &f.tool),
        ("agent", &f.agent),
        ("batch", &f.batch),
        ("min_age", &f.min_age),
    ] {
        if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
            q.append_pair(k, v);
        }
    }
    q.finish()
}

/// The queue's rows alone (what the page swaps in when the stream says the queue changed).
async fn rows(
    State(app): State<App>,
    headers: HeaderMap,
    Query(f): Query<QueueFilter>,
) -> Response {
    let Some(s) = session(&app, &headers) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    match pending(&app, &s, &f).await {
        Ok(items) => html(StatusCode::OK, "rows.html", context! { items }),
        Err(e) => log_error_page(&s, e),
    }
}

/// Server-sent events: `event: queue` when the stream opens and whenever the
/// set of pending approvals the session sees changes (checked every 500 ms),
/// with the count as data; keep-alive comments every 15 s.
async fn stream(State(app): State<App>, headers: HeaderMap) -> Response {
    let Some(s) = session(&app, &headers) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<SseEvent, Infallible>>(4);
    tokio::spawn(async move {
        let mut last: Option<Vec<(Uuid, String)>> = None;
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
            let filter = ApprovalFilter {
                tenant: s.principal.tenant_filter(),
                pending_only: true,
                limit: 1000,
                ..ApprovalFilter::default()
            };
            let Ok(rows) = app.log.approvals(&filter).await else {
                continue;
            };
            let now: Vec<(Uuid, String)> =
                rows.into_iter().map(|r| (r.run_id, r.call_id)).collect();
            // The first snapshot is sent too: the page was rendered before
            // the stream opened, and approvals that arrived in between must
            // not wait for the next change.
            if last.as_ref() != Some(&now) {
                let n = now.len();
                last = Some(now);
                if tx
                    .send(Ok(SseEvent::default().event("queue").data(n.to_string())))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            if tx.is_closed() {
                return;
            }
        }
    });
    Sse::new(tokio_stream_from(rx))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

pub(crate) fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

async fn decide_bulk(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    let f = form(&body);
    let s = match checked_post(&app, &headers, &f) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let decision = match field(&f, "decision") {
        Some("approve") => DecisionKind::Approve,
        Some("reject") => DecisionKind::Reject,
        _ => {
            return error_page(
                Some(&s),
                StatusCode::BAD_REQUEST,
                "choose approve or reject",
            );
        }
    };
    let reason = field(&f, "reason")
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(str::to_owned);
    if decision == DecisionKind::Reject && reason.is_none() {
        return error_page(
            Some(&s),
            StatusCode::BAD_REQUEST,
            "a rejection needs a reason (the model sees it)",
        );
    }
    let items: Vec<&str> = f
        .iter()
        .filter(|(k, _)| k == "item")
        .map(|(_, v)| v.as_str())
        .collect();
    if items.is_empty() {
        return error_page(
            Some(&s),
            StatusCode::BAD_REQUEST,
            "select at least one approval",
        );
    }
    if items.len() > app.limits.max_bulk {
        return error_page(
            Some(&s),
            StatusCode::BAD_REQUEST,
            &format!("at most {} approvals at once", app.limits.max_bulk),
        );
    }
    let mut failed = Vec::new();
    let mut decisions = Vec::with_capacity(items.len());
    for it in items {
        // `RUN_ID CALL_ID ARGS_HASH`: call ids may hold anything but spaces are
        // not produced by providers; the hash binds the decision to what was shown.
        let mut parts = it.splitn(3, ' ');
        let (Some(run), Some(call), Some(hash)) = (parts.next(), parts.next(), parts.next()) else {
            failed.push(format!("{it}: malformed selection"));
            continue;
        };
        let Ok(run_id) = run.parse::<Uuid>() else {
            failed.push(format!("{run}: not a run id"));
            continue;
        };
        decisions.push((
            run_id,
            call.to_owned(),
            DecisionBody {
                decision,
                reason: reason.clone(),
                input: None,
                args_hash: Some(hash.to_owned()),
            },
        ));
    }
    for ((run_id, call_id, _), answer) in decisions
        .iter()
        .zip(decide_many(&app, &s.principal, &decisions).await)
    {
        if let Err(e) = answer {
            failed.push(format!("{run_id} {call_id}: {}", e.body().error.message));
        }
    }
    if failed.is_empty() {
        Redirect::to("/inbox").into_response()
    } else {
        error_page(
            Some(&s),
            StatusCode::CONFLICT,
            &format!("some decisions were not posted:\n{}", failed.join("\n")),
        )
    }
}

// ----- one approval ----------------------------------------------------------------------

/// A message of the conversation as the templates see it.
#[derive(Debug, Clone, Serialize)]
struct Line {
    role: String,
    kind: String,
    text: String,
}

fn lines(messages: &[Message]) -> Vec<Line> {
    let mut out = Vec::new();
    for m in messages {
        let role = serde_json::to_value(m.role)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        for b in &m.content {
            let (kind, text) = match b {
                ContentBlock::Text { text, .. } => ("text", text.clone()),
                ContentBlock::ToolUse { name, input, .. } => {
                    ("tool_use", format!("{name}({input})"))
                }
                ContentBlock::ToolResult {
                    content, is_error, ..
                } => (
                    if *is_error {
                        "tool_error"
                    } else {
                        "tool_result"
                    },
                    content.to_string(),
                ),
                _ => continue,
            };
            out.push(Line {
                role: role.clone(),
                kind: kind.into(),
                text,
            });
        }
    }
    out
}

/// The tool's JSON Schema as the run knows it (step tools, then external tools).
fn tool_schema(state: &RunState, tool: &str) -> Option<Value> {
    let find = |specs: &[ToolSpec]| {
        specs
            .iter()
            .find(|t| t.name == tool)
            .map(|t| t.input_schema.clone())
    };
    find(&state.step_tools).or_else(|| find(&state.config.external_tools))
}

/// Why a call of `tool` waits for a person, in plain words, for the card's
/// "Why approval is needed" line: a crash interrupted it; or the tool's
/// resolved policy as its step recorded it, and who decided it (the
/// operator, the agent definition, the run, the MCP server's annotation);
/// or a rule of the run's `policies`, which looked at these arguments.
/// `None` when the log does not say (a tool the step did not record).
fn why_approval(state: &RunState, tool: &str, interrupted: bool) -> Option<String> {
    if interrupted {
        return Some(
            "This call started once and its worker stopped before a result came back; the run asks before running it again (its on_interrupted_call setting).".into(),
        );
    }
    let spec = state.step_tools.iter().find(|t| t.name == tool)?;
    let policy = spec.policy.as_ref()?;
    let tenant = if state.config.agent.is_some() {
        "the agent definition"
    } else {
        "the run's config"
    };
    Some(if !policy.requires_approval {
        format!(
            "The tool itself needs no approval, but a rule in the `policies` of {tenant} matched these arguments."
        )
    } else {
        match policy.approval_by {
            glia_proto::PolicyOrigin::Operator => {
                "The operator's catalogue requires approval for every call of this tool.".into()
            }
            glia_proto::PolicyOrigin::Agent => {
                "The agent definition requires approval for every call of this tool (its tool_policy, or a rule of its policies naming the tool).".into()
            }
            glia_proto::PolicyOrigin::Run => {
                "The run's config requires approval for every call of this tool (its tool_policy, or a rule of its policies naming the tool).".into()
            }
            glia_proto::PolicyOrigin::Annotation => {
                "The MCP server marks this tool destructive (destructiveHint), so every call needs approval.".into()
            }
            glia_proto::PolicyOrigin::Default => {
                "Every call of this tool needs approval.".into()
            }
        }
    })
}

pub(crate) fn policy_origin_text(origin: glia_proto::PolicyOrigin) -> &'static str {
    match origin {
        glia_proto::PolicyOrigin::Operator => "the operator's catalogue",
        glia_proto::PolicyOrigin::Agent => "the agent definition's tool_policy or policies",
        glia_proto::PolicyOrigin::Run => "the run config's tool_policy or policies",
        glia_proto::PolicyOrigin::Annotation => "the MCP server's destructiveHint",
        glia_proto::PolicyOrigin::Default => "default",
    }
}

/// What the card says about the tool: what it does (its description, as
/// the model was shown it), where it runs, how far its server is trusted,
/// the annotations its MCP server listed (claims, not verified), and its
/// resolved policy in the log's terms.
#[derive(Debug, Clone, Default, Serialize)]
struct ToolCard {
    description: Option<String>,
    source: String,
    trust: Option<String>,
    hints: Vec<(String, String)>,
    policy: Option<String>,
}

fn tool_card(state: &RunState, tool: &str) -> ToolCard {
    let step = state.step_tools.iter().find(|t| t.name == tool);
    let external = state.config.external_tools.iter().find(|t| t.name == tool);
    let Some(spec) = step.or(external) else {
        return ToolCard {
            source: format!("tool {tool:?} (not among the tools the run recorded)"),
            ..ToolCard::default()
        };
    };
    let (source, hints) = match &spec.source {
        Some(glia_proto::ToolSource::Mcp {
            server,
            tool: original,
            hints,
            ..
        }) => {
            let offered = if original != tool {
                format!(" (offered to the model as {tool:?})")
            } else {
                String::new()
            };
            (
                format!("MCP server {server:?}, tool {original:?}{offered}"),
                hints
                    .as_ref()
                    .map(|h| {
                        h.listed()
                            .into_iter()
                            .map(|(k, v)| (k.to_owned(), v))
                            .collect()
                    })
                    .unwrap_or_default(),
            )
        }
        Some(glia_proto::ToolSource::Http { url, .. }) => {
            (format!("HTTP tool: posts to {url}"), Vec::new())
        }
        Some(glia_proto::ToolSource::Agent { agent, .. }) => (
            format!("the agent {agent}: a child run answers the call"),
            Vec::new(),
        ),
        Some(glia_proto::ToolSource::Recorded { .. }) => (
            "a recorded tool: the run's recording answers the call; nothing runs".to_owned(),
            Vec::new(),
        ),
        None if spec.external => (
            "external tool: the application that started the run executes it".to_owned(),
            Vec::new(),
        ),
        None => ("a tool of the worker".to_owned(), Vec::new()),
    };
    let policy = spec.policy.as_ref();
    let trust = policy.and_then(|p| p.trusted_server).map(|trusted| {
        if trusted {
            "trusted server: the operator's catalogue believes its annotations".to_owned()
        } else {
            "untrusted server: its annotations can only make a call stricter, never waive approval"
                .to_owned()
        }
    });
    ToolCard {
        description: Some(spec.description.clone()).filter(|d| !d.trim().is_empty()),
        source,
        trust,
        hints,
        policy: policy.map(|p| p.describe()),
    }
}

struct Loaded {
    run: glia_backends::RunSummary,
    state: RunState,
    row: ApprovalRow,
}

async fn load_call(
    app: &App,
    s: &Session,
    run_id: Uuid,
    call_id: &str,
) -> Result<Loaded, Response> {
    let run = visible_run(app, &s.principal, run_id)
        .await
        .map_err(|e| api_error_page(s, e))?;
    let filter = ApprovalFilter {
        run_id: Some(run.run_id),
        limit: 1000,
        ..ApprovalFilter::default()
    };
    let rows = app
        .log
        .approvals(&filter)
        .await
        .map_err(|e| log_error_page(s, e))?;
    let row = rows
        .into_iter()
        .rev()
        .find(|r| r.call_id == call_id)
        .ok_or_else(|| error_page(Some(s), StatusCode::NOT_FOUND, "no such approval"))?;
    let state = app
        .log
        .load(run_id)
        .await
        .map_err(|e| log_error_page(s, e))?;
    Ok(Loaded { run, state, row })
}

async fn detail(
    State(app): State<App>,
    headers: HeaderMap,
    Path((run_id, call_id)): Path<(Uuid, String)>,
) -> Response {
    let Some(s) = session(&app, &headers) else {
        return to_login();
    };
    let Loaded { run, state, row } = match load_call(&app, &s, run_id, &call_id).await {
        Ok(l) => l,
        Err(r) => return r,
    };
    let record = match history::run_records(&*app.log, &run).await {
        Ok(records) => records.into_iter().rev().find(|r| r.call_id == call_id),
        Err(e) => return log_error_page(&s, e),
    };
    let conversation = lines(&state.messages);
    let recent: Vec<Line> = conversation.iter().rev().take(12).rev().cloned().collect();
    let earlier_results: Vec<Line> = conversation
        .iter()
        .filter(|l| l.kind != "text")
        .cloned()
        .collect();
    let pending = row.status == glia_backends::ApprovalStatus::Pending;
    let schema = tool_schema(&state, &row.tool);
    let why = why_approval(&state, &row.tool, row.interrupted);
    let tool = tool_card(&state, &row.tool);
    // The pending call's arguments; once decided, those the approver was shown.
    let shown_input = state
        .call(&call_id)
        .map_or_else(|| row.input.clone(), |c| c.input.clone());
    let item = item(row, RunInfo::of(&run, &state), Utc::now());
    html(
        StatusCode::OK,
        "detail.html",
        context! { item, pending, record, goal => state.goal, recent, earlier_results,
        input => serde_json::to_string_pretty(&shown_input).unwrap_or_default(), schema, why, tool, ..s.frame() },
    )
}

/// The arguments of the call as the run holds them (the pending call's).
fn record_input(state: &RunState, call_id: &str) -> Value {
    state
        .call(call_id)
        .map(|c| c.input.clone())
        .unwrap_or(Value::Null)
}

/// Parse and check edited arguments: a JSON object valid against the tool's schema.
fn check_edit(text: &str, schema: Option<&Value>) -> Result<Value, String> {
    let input: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    if !input.is_object() {
        return Err("the arguments must be a JSON object".into());
    }
    if let Some(schema) = schema {
        let validator = jsonschema::validator_for(schema)
            .map_err(|e| format!("the tool's schema is unusable: {e}"))?;
        let errors: Vec<String> = validator
            .iter_errors(&input)
            .map(|e| format!("{}: {}", e.instance_path(), e))
            .collect();
        if !errors.is_empty() {
            return Err(format!(
                "the arguments do not match the tool's schema: {}",
                errors.join("; ")
            ));
        }
    }
    Ok(input)
}

/// A line diff of two pretty-printed JSON values: (`+`, `-` or ` `, line).
pub(crate) fn diff(old: &Value, new: &Value) -> Vec<(String, String)> {
    let a = serde_json::to_string_pretty(old).unwrap_or_default();
    let b = serde_json::to_string_pretty(new).unwrap_or_default();
    similar::TextDiff::from_lines(&a, &b)
        .iter_all_changes()
        .map(|c| {
            let tag = match c.tag() {
                similar::ChangeTag::Delete => "-",
                similar::ChangeTag::Insert => "+",
                similar::ChangeTag::Equal => " ",
            };
            (tag.to_owned(), c.value().trim_end_matches('\n').to_owned())
        })
        .collect()
}

async fn edit_preview(
    State(app): State<App>,
    headers: HeaderMap,
    Path((run_id, call_id)): Path<(Uuid, String)>,
    body: Bytes,
) -> Response {
    let f = form(&body);
    let s = match checked_post(&app, &headers, &f) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let Loaded { run, state, row } = match load_call(&app, &s, run_id, &call_id).await {
        Ok(l) => l,
        Err(r) => return r,
    };
    let schema = tool_schema(&state, &row.tool);
    let text = field(&f, "input").unwrap_or("");
    match check_edit(text, schema.as_ref()) {
        Ok(input) => {
            let old = record_input(&state, &call_id);
            let lines = diff(&old, &input);
            let item = item(row, RunInfo::of(&run, &state), Utc::now());
            html(
                StatusCode::OK,
                "edit.html",
                context! { item, lines, input => serde_json::to_string(&input).unwrap_or_default(), new_hash => args_hash(&input), ..s.frame() },
            )
        }
        Err(message) => error_page(Some(&s), StatusCode::UNPROCESSABLE_ENTITY, &message),
    }
}

async fn decide(
    State(app): State<App>,
    headers: HeaderMap,
    Path((run_id, call_id)): Path<(Uuid, String)>,
    body: Bytes,
) -> Response {
    let f = form(&body);
    let s = match checked_post(&app, &headers, &f) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let args_hash = field(&f, "args_hash").map(str::to_owned);
    let body = match field(&f, "decision") {
        Some("approve") => DecisionBody {
            decision: DecisionKind::Approve,
            reason: None,
            input: None,
            args_hash,
        },
        Some("reject") => {
            let reason = field(&f, "reason").map(str::trim).unwrap_or("");
            if reason.is_empty() {
                return error_page(
                    Some(&s),
                    StatusCode::BAD_REQUEST,
                    "a rejection needs a reason (the model sees it)",
                );
            }
            DecisionBody {
                decision: DecisionKind::Reject,
                reason: Some(reason.to_owned()),
                input: None,
                args_hash,
            }
        }
        Some("edit") => {
            let Ok(input) = serde_json::from_str::<Value>(field(&f, "input").unwrap_or("")) else {
                return error_page(
                    Some(&s),
                    StatusCode::BAD_REQUEST,
                    "the edited arguments are not valid JSON",
                );
            };
            // Bound to the arguments the preview showed.
            if field(&f, "new_args_hash") != Some(glia_proto::args_hash(&input).as_str()) {
                return error_page(
                    Some(&s),
                    StatusCode::CONFLICT,
                    "the edited arguments differ from the previewed ones: preview again",
                );
            }
            let schema = match load_call(&app, &s, run_id, &call_id).await {
                Ok(l) => tool_schema(&l.state, &l.row.tool),
                Err(r) => return r,
            };
            if let Err(m) = check_edit(&input.to_string(), schema.as_ref()) {
                return error_page(Some(&s), StatusCode::UNPROCESSABLE_ENTITY, &m);
            }
            DecisionBody {
                decision: DecisionKind::Edit,
                reason: None,
                input: Some(input),
                args_hash,
            }
        }
        _ => {
            return error_page(
                Some(&s),
                StatusCode::BAD_REQUEST,
                "choose approve, reject or edit",
            );
        }
    };
    match decide_one(&app, &s.principal, run_id, call_id.clone(), &body).await {
        Ok(_) => Redirect::to(&next_item(&app, &s, run_id, &call_id).await).into_response(),
        Err(e) => api_error_page(&s, e),
    }
}

/// Where an approver goes after deciding `call_id` of `run_id`: the next
/// approval waiting for them (the oldest pending one they may see, other
/// than the one just decided), else the queue (which then says nothing
/// waits). A store that fails to answer sends them to the queue too.
async fn next_item(app: &App, s: &Session, run_id: Uuid, call_id: &str) -> String {
    match pending(app, s, &QueueFilter::default()).await {
        Ok(items) => items
            .into_iter()
            .find(|i| !(i.run_id == run_id && i.call_id == call_id))
            .map_or_else(
                || "/inbox".to_owned(),
                |i| {
                    format!(
                        "/inbox/runs/{}/calls/{}",
                        i.run_id,
                        utf8_percent_encode(&i.call_id, PATH_SEGMENT)
                    )
                },
            ),
        Err(e) => {
            tracing::warn!("the next approval could not be read: {e}");
            "/inbox".to_owned()
        }
    }
}

// ----- a run -----------------------------------------------------------------------------

/// What the guardrails redacted from an event's text, as the pages say it
/// before the text (`redacted: email ×2 · `): the rules and counts, never
/// what they removed.
pub(crate) fn redacted(redactions: &[glia_proto::Redaction]) -> String {
    if redactions.is_empty() {
        return String::new();
    }
    let rules: Vec<String> = redactions
        .iter()
        .map(|r| format!("{} ×{}", r.guardrail, r.count))
        .collect();
    format!("redacted: {} · ", rules.join(", "))
}

/// The old run page: the console's run page replaced it.
async fn run_page(Path(run_id): Path<Uuid>) -> Redirect {
    Redirect::to(&format!("/console/runs/{run_id}"))
}

// ----- history ---------------------------------------------------------------------------

async fn history_page(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<HistoryQuery>,
) -> Response {
    let Some(s) = session(&app, &headers) else {
        return to_login();
    };
    let mut records = match history::history(&*app.log, s.principal.tenant_filter(), &q).await {
        Ok(r) => r,
        Err(e) => return log_error_page(&s, e),
    };
    // Decided items only: what still waits is the queue's.
    records.retain(|r| r.resolution != history::Resolution::Pending);
    if q.format == Some(history::HistoryFormat::Csv) {
        return (
            [
                (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"approvals.csv\"",
                ),
            ],
            history::to_csv(&records),
        )
            .into_response();
    }
    let mut csv_query = form_urlencoded::Serializer::new(String::new());
    for (k, v) in [
        ("tool", &q.tool),
        ("agent", &q.agent),
        ("resolution", &q.resolution),
        ("decided_by", &q.decided_by),
    ] {
        if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
            csv_query.append_pair(k, v);
        }
    }
    csv_query.append_pair("format", "csv");
    let rows: Vec<_> = records
        .iter()
        .map(|r| {
            let reason = match &r.decision {
                Some(glia_proto::Decision::Reject { reason }) => Some(reason.clone()),
                _ => None,
            };
            context! { r => r, wait => human(r.wait_ms), reason, edited => r.edited_input().map(|v| diff(&r.input, v)) }
        })
        .collect();
    html(
        StatusCode::OK,
        "history.html",
        context! { rows, q => q, csv_query => csv_query.finish(), ..s.frame() },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins() {
        let mut h = HeaderMap::new();
        assert!(
            same_origin(&h),
            "no Origin (non-browser client): allowed; the CSRF token still applies"
        );
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:9999"),
        );
        assert!(!same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        h.insert("sec-fetch-site", HeaderValue::from_static("same-site"));
        assert!(!same_origin(&h));
    }

    #[test]
    fn templates_escape_untrusted_text() {
        let out = TEMPLATES
            .get_template("rows.html")
            .unwrap()
            .render(context! { items => vec![Item {
                run_id: Uuid::nil(),
                call_id: "c1".into(),
                tool: "<b>t</b>".into(),
                args_hash: "h".into(),
                summary: "<script>alert(1)</script><img src=x onerror=alert(2)>".into(),
                goal: "\"goal\"".into(),
                agent: Some("a@1".into()),
                model: "m".into(),
                batch_id: None,
                custom_id: Some("<i>item</i>".into()),
                requested_at: Utc::now(),
                age: "1s".into(),
                deadline: None,
                overdue: false,
                expires_at: None,
                escalated: false,
                interrupted: true,
            }] })
            .unwrap();
        assert!(
            !out.contains("<script>")
                && !out.contains("<img")
                && !out.contains("<b>")
                && !out.contains("<i>"),
            "{out}"
        );
        assert!(
            out.contains("&lt;script&gt;") && out.contains("&lt;img"),
            "{out}"
        );
    }

    #[test]
    fn edits_are_checked_against_the_schema() {
        let schema = serde_json::json!({"type": "object", "properties": {"amount": {"type": "integer", "maximum": 100}}, "required": ["amount"]});
        assert!(check_edit(r#"{"amount": 5}"#, Some(&schema)).is_ok());
        assert!(
            check_edit(r#"{"amount": 500}"#, Some(&schema))
                .unwrap_err()
                .contains("schema")
        );
        assert!(check_edit("[1]", None).unwrap_err().contains("object"));
        assert!(check_edit("{", None).unwrap_err().contains("JSON"));
        let d = diff(
            &serde_json::json!({"amount": 5}),
            &serde_json::json!({"amount": 6}),
        );
        assert!(
            d.contains(&("-".into(), "  \"amount\": 5".into()))
                && d.contains(&("+".into(), "  \"amount\": 6".into())),
            "{d:?}"
        );
    }

    #[test]
    fn cookies_are_signed() {
        let cfg = InboxConfig::with_secret("k");
        let claims = Claims {
            d: "00".repeat(32),
            e: i64::MAX,
            n: "n".into(),
        };
        let c = sign_cookie(&cfg, &claims);
        let (body, sig) = c.split_once('.').unwrap();
        assert!(same(
            &B64.decode(sig).unwrap(),
            &cfg.mac(&[b"session", body.as_bytes()])
        ));
        assert!(!same(
            &B64.decode(sig).unwrap(),
            &InboxConfig::with_secret("other").mac(&[b"session", body.as_bytes()])
        ));
    }
}
