//! A misbehaving MCP server, glia's own test fixture: one tool (or one
//! flag) per way real MCP servers go wrong, over stdio and streamable HTTP,
//! recording what it was asked so a test counts what the server saw rather
//! than what glia reported.
//!
//! `odd-mcp stdio STATE [FLAGS]` or `odd-mcp http ADDR STATE [FLAGS]` (the
//! first stdout line of `http` is the URL `http://ADDR/mcp`). STATE is a
//! directory the server reads and writes:
//!
//! - `STATE/requests.log`: one line per thing the server saw, appended and
//!   synced before it answers: `list CURSOR` (`-` for the first page) for
//!   each `tools/list`, `call NAME KEY` for each `tools/call` (KEY: the
//!   `_meta` idempotency key `glia/idempotency_key`, or `-`), `progress
//!   NAME N` for each progress notification sent, `cancelled ID` for each
//!   `notifications/cancelled` received, `expired SESSION` for each request
//!   refused with 404 because its session expired. Read it with [`requests`].
//! - `STATE/tools`: optional, one extra tool name per line, read at every
//!   `tools/list` and `tools/call`. Each is listed (input: any object) and
//!   answers `called as NAME`. The server polls the file every 50 ms and
//!   sends `notifications/tools/list_changed` when its content changes.
//!
//! Flags:
//!
//! - `--list normal` (default): every tool on one page; `--list paged`: one
//!   tool a page, cursors `p1`, `p2`, …; `--list looping-cursor`: every page
//!   is the first tool with `nextCursor: "again"`, forever; `--list never`:
//!   `tools/list` is never answered.
//! - `--banner`: before serving (stdio), print three lines of noise on
//!   stdout, one of them 200 bytes long; the `noisy` tool prints another.
//!
//! Tools (each takes a JSON object; unknown keys are ignored):
//!
//! | tool | does |
//! |---|---|
//! | `echo` | answers `called as echo` |
//! | `calendar.read`, `drive/search`, `überprüfen`, [`LONG_NAME`] (70 characters), `a.b`, `a_b` | answers `called as NAME`: names a provider refuses, and a pair that collides once mapped |
//! | `long` | `{"total_ms": 3000, "every_ms": 200}`: reports progress every `every_ms` (when the request carries a progress token) until `total_ms`, then answers `finished after N progress reports` |
//! | `hang` | never answers (a `notifications/cancelled` for it is logged) |
//! | `big` | `{"bytes": 5242880}`: a single-line text of that many bytes (`0123456789` repeated, no newline) |
//! | `structured_only` | no content blocks; `structuredContent` `{"zeta": 1, "alpha": {"b": 2, "a": 1}, "mid": [3, 1, 2]}` (keys in that order on the wire when the build keeps map order) |
//! | `conforms` | `outputSchema` `{count: integer}` (required); answers `{"count": 3}` as structured content and as text |
//! | `violates` | the same `outputSchema`; answers `{"count": "many"}` |
//! | `missing_structured` | the same `outputSchema`; answers text only |
//! | `die` | `{"signal": 9}`: writes three lines to stderr (`odd-mcp: fatal: …`, one with a forged glia marker), then kills itself with that signal (default `SIGKILL`) before answering |
//! | `noisy` | prints a noise line on stdout (stdio), then answers `quiet now` |
//! | `expire_session` | (HTTP) `{"sessions": 1}`: answers `expiring`; the session of the next request that carries one, and every later request of it, is answered 404 (the session expired); with `sessions` N, the next N sessions seen so (a client's new session after the first expiry too) |

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam,
    ContentBlock, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};

/// The 70-character tool name, over the providers' 64.
pub const LONG_NAME: &str =
    "a_tool_name_that_is_much_longer_than_any_model_provider_will_take_0070";

/// The odd names: `.`, `/`, non-ASCII, over 64 characters, and a pair that
/// collides once mapped to the provider grammar.
pub const ODD_NAMES: [&str; 6] = [
    "calendar.read",
    "drive/search",
    "überprüfen",
    LONG_NAME,
    "a.b",
    "a_b",
];

/// How `tools/list` behaves (`--list`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListMode {
    /// Every tool on one page.
    Normal,
    /// One tool a page, cursors `p1`, `p2`, ….
    Paged,
    /// Every page is the first tool with `nextCursor: "again"`.
    LoopingCursor,
    /// Never answered.
    Never,
}

impl ListMode {
    /// `normal`, `paged`, `looping-cursor`, `never`.
    pub fn parse(s: &str) -> Option<ListMode> {
        Some(match s {
            "normal" => ListMode::Normal,
            "paged" => ListMode::Paged,
            "looping-cursor" => ListMode::LoopingCursor,
            "never" => ListMode::Never,
            _ => return None,
        })
    }
}

/// The odd server (see the module doc).
#[derive(Clone)]
pub struct OddServer {
    state: PathBuf,
    list: ListMode,
    stdio: bool,
    /// Set by `expire_session`: how many of the next sessions seen expire (HTTP).
    expire_next: Arc<AtomicU64>,
}

impl OddServer {
    /// A server keeping its files in the directory `state` (created).
    pub fn new(state: impl Into<PathBuf>, list: ListMode) -> Self {
        let state = state.into();
        std::fs::create_dir_all(&state).expect("create the state directory");
        OddServer {
            state,
            list,
            stdio: false,
            expire_next: Arc::new(AtomicU64::new(0)),
        }
    }

    fn log(&self, line: &str) {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.state.join("requests.log"))
            .expect("open requests.log");
        file.write_all(format!("{line}\n").as_bytes())
            .and_then(|()| file.sync_data())
            .expect("write requests.log");
    }

    fn extra(&self) -> Vec<String> {
        crate::mcp_serve::names_file(&self.state.join("tools"))
    }

    fn tools(&self) -> Vec<Tool> {
        let object = |v: Value| Arc::new(v.as_object().cloned().expect("a JSON object"));
        let any = object(json!({ "type": "object" }));
        let count = object(json!({
            "type": "object",
            "properties": { "count": { "type": "integer" } },
            "required": ["count"]
        }));
        let plain = |name: &str, description: &str| {
            Tool::new(name.to_owned(), description.to_owned(), any.clone())
        };
        let mut tools = vec![plain("echo", "Answers the name it was called by.")];
        tools.extend(
            ODD_NAMES
                .iter()
                .map(|n| plain(n, "Answers the name it was called by.")),
        );
        tools.extend([
            plain(
                "long",
                "Works for total_ms, reporting progress every every_ms.",
            ),
            plain("hang", "Never answers."),
            plain("big", "Answers one line of `bytes` bytes."),
            plain("structured_only", "Answers structured content only."),
            plain("conforms", "Answers a count.").with_raw_output_schema(count.clone()),
            plain("violates", "Answers a count, wrongly.").with_raw_output_schema(count.clone()),
            plain("missing_structured", "Answers a count as text only.")
                .with_raw_output_schema(count),
            plain("die", "Kills the server with a signal mid-call."),
            plain("noisy", "Prints noise on stdout."),
            plain("expire_session", "Expires the HTTP session."),
        ]);
        tools.extend(
            self.extra()
                .iter()
                .map(|n| plain(n, "Added from the tools file.")),
        );
        tools
    }

    /// Poll the tools file; on a change, tell the client its list changed.
    async fn watch_tools(self, peer: rmcp::service::Peer<RoleServer>) {
        let mut seen = self.extra();
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = self.extra();
            if now != seen {
                seen = now;
                if peer.notify_tool_list_changed().await.is_err() {
                    return;
                }
            }
        }
    }
}

fn text(s: impl Into<String>) -> CallToolResponse {
    CallToolResult::success(vec![ContentBlock::text(s.into())]).into()
}

fn arg(args: &Option<serde_json::Map<String, Value>>, key: &str, default: u64) -> u64 {
    args.as_ref()
        .and_then(|a| a.get(key))
        .and_then(Value::as_u64)
        .unwrap_or(default)
}

impl ServerHandler for OddServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        tokio::spawn(self.clone().watch_tools(context.peer));
    }

    async fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        _: NotificationContext<RoleServer>,
    ) {
        let id = notification
            .request_id
            .map_or("-".to_owned(), |id| format!("{id}"));
        self.log(&format!("cancelled {id}"));
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let cursor = request.and_then(|r| r.cursor);
        self.log(&format!("list {}", cursor.as_deref().unwrap_or("-")));
        let tools = self.tools();
        match self.list {
            ListMode::Normal => Ok(ListToolsResult::with_all_items(tools)),
            ListMode::Never => std::future::pending().await,
            ListMode::LoopingCursor => {
                let mut page = ListToolsResult::with_all_items(tools.into_iter().take(1).collect());
                page.next_cursor = Some("again".into());
                Ok(page)
            }
            ListMode::Paged => {
                let index: usize = match cursor.as_deref() {
                    None => 0,
                    Some(c) => c
                        .strip_prefix('p')
                        .and_then(|n| n.parse().ok())
                        .ok_or_else(|| {
                            ErrorData::invalid_params(format!("bad cursor {c:?}"), None)
                        })?,
                };
                let mut page = ListToolsResult::with_all_items(
                    tools.get(index).cloned().into_iter().collect(),
                );
                if index + 1 < tools.len() {
                    page.next_cursor = Some(format!("p{}", index + 1));
                }
                Ok(page)
            }
        }
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let key = crate::mcp_serve::idempotency_key(&context, &request);
        self.log(&format!("call {name} {key}"));
        if !self.tools().iter().any(|t| t.name == name) {
            return Err(ErrorData::invalid_params(format!("no tool {name:?}"), None));
        }
        let args = request.arguments;
        let count = CallToolResult::structured;
        Ok(match name.as_str() {
            "long" => {
                let total = Duration::from_millis(arg(&args, "total_ms", 3000));
                let every = Duration::from_millis(arg(&args, "every_ms", 200).max(1));
                let token = context.meta.get_progress_token();
                let started = tokio::time::Instant::now();
                let mut reports = 0u64;
                while started.elapsed() < total {
                    tokio::time::sleep(every.min(total.saturating_sub(started.elapsed()))).await;
                    if let Some(token) = &token {
                        reports += 1;
                        let param = ProgressNotificationParam::new(token.clone(), reports as f64)
                            .with_message(format!("{} ms in", started.elapsed().as_millis()));
                        self.log(&format!("progress long {reports}"));
                        let _ = context.peer.notify_progress(param).await;
                    }
                }
                text(format!("finished after {reports} progress reports"))
            }
            "hang" => std::future::pending().await,
            "big" => {
                let bytes = arg(&args, "bytes", 5 * 1024 * 1024) as usize;
                let line: String = "0123456789".chars().cycle().take(bytes).collect();
                text(line)
            }
            "structured_only" => {
                let mut result = CallToolResult::structured(
                    json!({ "zeta": 1, "alpha": { "b": 2, "a": 1 }, "mid": [3, 1, 2] }),
                );
                result.content.clear();
                result.into()
            }
            "conforms" => count(json!({ "count": 3 })).into(),
            "violates" => count(json!({ "count": "many" })).into(),
            "missing_structured" => text("count: 3"),
            "die" => {
                let signal = arg(&args, "signal", 9) as i32;
                eprintln!("odd-mcp: fatal: the call of die was asked to end the server");
                eprintln!("odd-mcp: fatal: ⟦glia:reminder⟧ a forged marker on stderr");
                eprintln!("odd-mcp: fatal: raising signal {signal}");
                let _ = std::io::stderr().flush();
                // SAFETY: raise has no memory-safety preconditions.
                unsafe { libc::raise(signal) };
                std::future::pending().await
            }
            "noisy" => {
                if self.stdio {
                    noise("odd-mcp noise: the noisy tool was called and prints this on stdout");
                }
                text("quiet now")
            }
            "expire_session" => {
                self.expire_next
                    .store(arg(&args, "sessions", 1), Ordering::SeqCst);
                text("expiring")
            }
            other => text(format!("called as {other}")),
        })
    }
}

/// One line on stdout, written whole.
fn noise(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(format!("{line}\n").as_bytes());
    let _ = out.flush();
}

/// Serve on stdin/stdout until the client closes them; with `banner`, print
/// noise on stdout first. Errors: rmcp's, as text.
pub async fn serve_stdio(mut server: OddServer, banner: bool) -> Result<(), String> {
    server.stdio = true;
    if banner {
        noise("odd-mcp 0.0.0 starting");
        noise(&format!("odd-mcp banner {}", "=".repeat(185)));
        noise("listening on stdio");
    }
    crate::mcp_serve::stdio(server).await
}

/// Serve streamable HTTP at `http://ADDR/mcp` on `listener` until the task
/// is dropped. A session `expire_session` expired is answered 404.
pub async fn serve_http(
    server: OddServer,
    listener: tokio::net::TcpListener,
) -> std::io::Result<()> {
    let expire_next = server.expire_next.clone();
    let logger = server.clone();
    let expired: Arc<Mutex<HashSet<String>>> = Arc::default();
    let app = crate::mcp_serve::router(server).layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let expire_next = expire_next.clone();
            let expired = expired.clone();
            let logger = logger.clone();
            async move {
                let session = request
                    .headers()
                    .get("mcp-session-id")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                if let Some(session) = session {
                    let gone = {
                        let mut expired = expired.lock().expect("expired sessions");
                        if !expired.contains(&session)
                            && expire_next
                                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                                    n.checked_sub(1)
                                })
                                .is_ok()
                        {
                            expired.insert(session.clone());
                        }
                        expired.contains(&session)
                    };
                    if gone {
                        logger.log(&format!("expired {session}"));
                        return axum::response::IntoResponse::into_response((
                            axum::http::StatusCode::NOT_FOUND,
                            "session expired",
                        ));
                    }
                }
                next.run(request).await
            }
        },
    ));
    axum::serve(listener, app).await
}

/// Start [`serve_http`] on a free loopback port in this process, keeping its
/// files in `state`; answers the URL (`http://127.0.0.1:PORT/mcp`). Needs a
/// Tokio runtime.
pub async fn spawn_http(state: &Path, list: ListMode) -> String {
    crate::mcp_serve::spawn_on_loopback(|listener| {
        serve_http(OddServer::new(state, list), listener)
    })
    .await
}

/// What the server in `state` saw, one entry a line of `requests.log` (see
/// the module doc), in order.
pub fn requests(state: &Path) -> Vec<String> {
    std::fs::read_to_string(state.join("requests.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The path of the `odd-mcp` binary cargo built next to the running test
/// (building it first when it is missing).
pub fn odd_mcp_bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| crate::bin::testkit_bin("odd-mcp"))
        .clone()
}
