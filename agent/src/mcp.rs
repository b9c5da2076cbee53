//! The worker's MCP client (rmcp): one connection per catalogue server,
//! kept for the worker's life.
//!
//! - A `stdio` server is a child process the worker starts with the
//!   catalogue's command, arguments and environment (secret values read
//!   from the worker's environment at start; the child inherits only `PATH`
//!   and `HOME` besides), owned by glia ([`stdio`]): its stderr is logged
//!   at debug level with every secret value replaced by `[redacted]` and
//!   its last lines kept; lines it writes to stdout that are not JSON-RPC
//!   are left out and logged at `warn`, rate-limited, first 80 bytes. A
//!   `streamable_http` server is reached at its URL with the catalogue's
//!   headers.
//! - A supervisor task per server connects (MCP `initialize`), and when the
//!   connection ends (the child died, the session closed) connects again
//!   with exponential backoff (100 ms doubling to 30 s, reset after a
//!   connection); a stdio server's end is logged at `warn` with its exit
//!   code or signal and the last lines of its stderr. [`McpHub::shutdown`]
//!   stops every server (stdin closed, then `SIGTERM`, then kill).
//! - [`McpHub::list_tools`] is `tools/list` page by page, bounded: it
//!   stops at a cursor it has seen before (a server whose `nextCursor`
//!   never advances) or after [`MAX_LIST_PAGES`] pages, with one warning
//!   naming the server and why, and keeps the tools gathered so far; the
//!   [`Listing`] says it was cut short, so a tool missing from it is never
//!   taken as absent ([`crate::tool_sources`]). The whole listing has a
//!   deadline ([`LIST_TIMEOUT`] unless the caller gives one).
//! - `notifications/tools/list_changed` from a server (and every new
//!   connection to it) bumps the server's list generation
//!   ([`McpHub::list_generation`], [`McpHub::list_changed`]): nothing is
//!   cached by glia, every step lists afresh, so the next step sees the
//!   new list, and a run waiting for a tool it allows re-lists on it.
//! - [`McpHub::call`] is `tools/call` within the call's [`CallLimits`]: the
//!   request carries a `progressToken`, each `notifications/progress` for
//!   it starts the idle timeout (the tool's `timeout_ms`) again, and
//!   `max_total_ms` bounds the call however often it reports progress. A
//!   call cut by either bound is a `timeout` error naming the bound, and
//!   rmcp sends `notifications/cancelled` for it; dropping the call's
//!   future (the loop abandons a call after a cancel's grace period) also
//!   sends `notifications/cancelled`. The call's idempotency key travels in
//!   `_meta` as [`IDEMPOTENCY_META_KEY`]. `notifications/progress` for the
//!   call are handed to the caller's `progress` function as they arrive,
//!   in order, until the result is in (rmcp handles each notification on a
//!   task of its own, so a report racing the result may be left out).
//! - Results ([`render`]): each block of a `CallToolResult`'s `content`
//!   (MCP specification 2025-06-18, "Tools" › "Tool Result": `text`,
//!   `image`, `audio`, `resource_link` and embedded `resource` content)
//!   becomes a block of the [`ToolContent`] the model sees:
//!
//!   | MCP block | model sees |
//!   |---|---|
//!   | `text` | a text block |
//!   | `image` (PNG, JPEG, GIF, WebP) | an image block, media type from the MCP `mimeType` (or from the bytes, when they contradict it) |
//!   | `image` of another type, not base64, not an image, or over [`MAX_IMAGE_BASE64_LEN`](glia_proto::MAX_IMAGE_BASE64_LEN) | a text note naming its type, its size and why (`[image left out: image/svg+xml, 512 bytes; …]`) |
//!   | `audio` | a text note naming its type and size: no provider here takes audio in a tool result |
//!   | `resource` with `text` | a text block `[resource: URI]` then the text |
//!   | `resource` with a `blob` of an image type | an image block (or a note, as for `image`) |
//!   | `resource` with another `blob` | a text note naming its URI, type and size |
//!   | `resource_link` | a text block naming its URI, name, type and description |
//!   | a kind this rmcp does not know | its JSON as text |
//!
//!   `structuredContent` is kept as a last text block `{"structuredContent":
//!   …}`, unless a text block already holds the same JSON (the spec asks
//!   servers to send that text for clients without structured output),
//!   with its keys in the server's order (the workspace builds serde_json
//!   with `preserve_order`; numbers are as parsed: integers exact, others
//!   the shortest text of the same `f64`). A tool that lists an
//!   `outputSchema` has its results checked against it ([`render_for`]). A
//!   result without images is one string (text blocks joined by newlines,
//!   as before images were kept); one with images is a list of blocks.
//!   `isError: true` is a [`ToolFailure`] whose message is that content as
//!   text (images as `[image: TYPE, N bytes]`).
//! - Size: an image is carried inline, base64, in the `tool.result` event
//!   and the run's messages. The Postgres log stores any event payload over
//!   `PgOptions::blob_threshold` (64 KiB) in `blobs` by content hash, so a
//!   large result is one blob, not a row of the events table, and it is
//!   written once (events are not rewritten; `model.call` records a message
//!   count, not the messages). An image whose base64 is over
//!   [`MAX_IMAGE_BASE64_LEN`](glia_proto::MAX_IMAGE_BASE64_LEN) (5 MiB, Anthropic's limit) never enters the
//!   log: it is the text note above.
//! - A server that is down (not connected within the call's timeout),
//!   dies during a call, times out or answers something that is not a
//!   `tools/call` result gives a [`ToolFailure`] whose message says so: the
//!   model sees it, and the run goes on. A stdio server that dies during a
//!   call is named with its exit code or signal and the last lines of its
//!   stderr (`outcome_unknown`: the call may have run). A call known not to
//!   have run — the HTTP server answered 404 for an expired session and
//!   rmcp's one re-initialisation did not get it through, or no connection
//!   to the server could be made — is `unavailable`, with the cause in
//!   plain words and that calling again is safe.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use glia_proto::content::base64_decoded_len;
use glia_proto::{
    ImageSource, OutputSchemaCheck, ResultBlock, ToolContent, ToolErrorKind, ToolSpec,
};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotification,
    CancelledNotificationParam, ClientRequest, ContentBlock, PaginatedRequestParams,
    ProgressNotificationParam, RequestId, RequestMetaObject, ResourceContents, ServerResult, Tool,
};
use rmcp::service::{NotificationContext, Peer, PeerRequestOptions, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::catalogue::{Catalogue, McpServerEntry, McpTransport};
use crate::tool::ToolFailure;

pub mod stdio;

/// The `_meta` key of a `tools/call` that carries the call's idempotency
/// key (`{run_id}:{turn}:{call_id}`, the same when a crashed call runs
/// again), so a server can recognise a repeat.
pub const IDEMPOTENCY_META_KEY: &str = "glia/idempotency_key";

/// First delay before a server is started again; doubles to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest delay between attempts to start a server.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long `initialize` may take.
const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the diagnosis of a stdio server whose connection ended waits
/// for its exit status and the end of its stderr.
const DEATH_WAIT: Duration = Duration::from_secs(5);

/// The time bounds of one `tools/call`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallLimits {
    /// The tool's `timeout_ms`. With `total`, an idle timeout: the longest
    /// the call may go without a `notifications/progress` (each report
    /// starts it again; the first period starts when the request is sent).
    /// Without, the bound on the whole call. Waiting for a connection to
    /// the server takes at most this long (without `total`, it counts
    /// against it).
    pub idle: Duration,
    /// The tool's `max_total_ms`: the longest the call may run however
    /// often it reports progress (the wait for a connection included), at
    /// least `idle`. `None` (a step frozen before it was recorded): `idle`
    /// bounds the whole call and progress does not extend it.
    pub total: Option<Duration>,
}

/// How long `tools/list` (all pages together) may take.
pub const LIST_TIMEOUT: Duration = Duration::from_secs(30);
/// Most `tools/list` pages read in one listing; a server that pages on
/// past it is cut short ([`Listing::cut`]). At the spec's usual page sizes
/// (tens of tools) that is thousands of tools, far more than a run may
/// allow ([`glia_proto::limits::MAX_TOOLS`]).
pub const MAX_LIST_PAGES: usize = 100;

/// A server's tool list as [`McpHub::list_tools`] read it.
#[derive(Debug, Clone)]
pub struct Listing {
    /// The tools of the pages read, in the server's order.
    pub tools: Vec<Tool>,
    /// Why the listing stopped before the server's last page, if it did: a
    /// repeated cursor or [`MAX_LIST_PAGES`]. A tool missing from a cut
    /// listing may exist.
    pub cut: Option<String>,
    /// Whether the server announces list changes
    /// (`capabilities.tools.listChanged`).
    pub announces_changes: bool,
}

type ProgressRoutes = Arc<Mutex<HashMap<String, mpsc::UnboundedSender<String>>>>;

/// The client side of one connection: routes `notifications/progress` to
/// the call that asked for them (by progress token) and counts
/// `notifications/tools/list_changed` in the server's list generation.
#[derive(Clone)]
struct Handler {
    progress: ProgressRoutes,
    generation: Arc<watch::Sender<u64>>,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.generation.send_modify(|g| *g += 1);
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let key = token_key(&params.progress_token);
        let text = progress_text(&params);
        if let Some(route) = self.progress.lock().expect("progress routes").get(&key) {
            let _ = route.send(text);
        }
    }
}

fn token_key(token: &rmcp::model::ProgressToken) -> String {
    serde_json::to_string(token).unwrap_or_default()
}

/// `3/5: message`, `3: message`, `3/5` or `3`.
fn progress_text(p: &ProgressNotificationParam) -> String {
    let amount = match p.total {
        Some(total) => format!("{}/{}", p.progress, total),
        None => p.progress.to_string(),
    };
    match &p.message {
        Some(m) => format!("{amount}: {m}"),
        None => amount,
    }
}

/// A live connection to a server.
#[derive(Clone)]
struct Connected {
    peer: Peer<RoleClient>,
    /// The child's process id (stdio).
    pid: Option<u32>,
    /// The child (stdio): how it ended, its last stderr lines.
    process: Option<Arc<stdio::Process>>,
}

struct Slot {
    connected: watch::Sender<Option<Connected>>,
    last_error: Mutex<String>,
    progress: ProgressRoutes,
    /// Bumped on every `notifications/tools/list_changed` and every new
    /// connection: a listing older than it may be stale.
    generation: Arc<watch::Sender<u64>>,
    /// The rate limit of the server's stdout noise log, across restarts.
    noise: Arc<Mutex<stdio::NoiseLog>>,
}

/// Every catalogue MCP server, connected and kept by a supervisor task each.
pub struct McpHub {
    slots: BTreeMap<String, Arc<Slot>>,
    shutdown: watch::Sender<bool>,
    tasks: tokio::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl McpHub {
    /// Start a supervisor for every MCP server of `catalogue` (stdio
    /// servers are started at once). Needs a Tokio runtime.
    pub fn start(catalogue: &Catalogue) -> McpHub {
        let (shutdown, _) = watch::channel(false);
        let mut slots = BTreeMap::new();
        let mut tasks = Vec::new();
        for (name, entry) in &catalogue.mcp_servers {
            let slot = Arc::new(Slot {
                connected: watch::channel(None).0,
                last_error: Mutex::new("not connected yet".into()),
                progress: ProgressRoutes::default(),
                generation: Arc::new(watch::channel(0).0),
                noise: Arc::default(),
            });
            slots.insert(name.clone(), slot.clone());
            tasks.push(tokio::spawn(supervise(
                name.clone(),
                entry.clone(),
                slot,
                shutdown.subscribe(),
            )));
        }
        McpHub {
            slots,
            shutdown,
            tasks: tokio::sync::Mutex::new(tasks),
        }
    }

    /// Whether the catalogue had a server of this name.
    pub fn has(&self, server: &str) -> bool {
        self.slots.contains_key(server)
    }

    /// The process id of a stdio server's current child, if it is connected.
    pub fn pid(&self, server: &str) -> Option<u32> {
        self.slots.get(server)?.connected.borrow().as_ref()?.pid
    }

    /// The connection, waiting up to `wait` for one. Errors: the text the
    /// model (or the log) sees, with the last connection error.
    async fn connection(&self, server: &str, wait: Duration) -> Result<Connected, String> {
        let slot = self
            .slots
            .get(server)
            .ok_or_else(|| format!("MCP server {server} is not in this worker's catalogue"))?;
        let mut rx = slot.connected.subscribe();
        let up = tokio::time::timeout(
            wait,
            rx.wait_for(|c| c.as_ref().is_some_and(|c| !c.peer.is_transport_closed())),
        )
        .await;
        match up {
            Ok(Ok(c)) => Ok(c.clone().expect("waited for a connection")),
            _ => Err(format!(
                "MCP server {server} is not available (not connected within {} ms; last error: {})",
                wait.as_millis(),
                slot.last_error.lock().expect("last error")
            )),
        }
    }

    /// `tools/list`, page by page (the module doc): stops at a repeated
    /// cursor or after [`MAX_LIST_PAGES`] pages with one warning, keeping
    /// the tools read ([`Listing::cut`]). Waits up to `wait` for the server
    /// to be connected; the pages together have [`LIST_TIMEOUT`]. Errors:
    /// why, as text naming the server (not connected and the last
    /// connection error; `tools/list` failed or took too long).
    pub async fn list_tools(&self, server: &str, wait: Duration) -> Result<Listing, String> {
        self.list_tools_within(server, wait, LIST_TIMEOUT).await
    }

    /// [`Self::list_tools`] with the pages' deadline `deadline` instead of
    /// [`LIST_TIMEOUT`].
    pub async fn list_tools_within(
        &self,
        server: &str,
        wait: Duration,
        deadline: Duration,
    ) -> Result<Listing, String> {
        let conn = self.connection(server, wait).await?;
        let announces_changes = conn
            .peer
            .peer_info()
            .and_then(|info| info.capabilities.tools.as_ref()?.list_changed)
            == Some(true);
        let pages = async {
            let mut tools = Vec::new();
            let mut seen = std::collections::HashSet::new();
            let mut cursor: Option<String> = None;
            for page in 0..MAX_LIST_PAGES {
                let params = (page > 0)
                    .then(|| PaginatedRequestParams::default().with_cursor(cursor.clone()));
                let listed = conn.peer.list_tools(params).await?;
                tools.extend(listed.tools);
                match listed.next_cursor {
                    None => return Ok((tools, None)),
                    Some(next) if !seen.insert(next.clone()) => {
                        let why = format!(
                            "tools/list page {} gave cursor {:?} again",
                            page + 1,
                            clip(&next, 80)
                        );
                        return Ok((tools, Some(why)));
                    }
                    Some(next) => cursor = Some(next),
                }
            }
            Ok::<_, rmcp::ServiceError>((
                tools,
                Some(format!(
                    "tools/list gave a next page after {MAX_LIST_PAGES} pages"
                )),
            ))
        };
        match tokio::time::timeout(deadline, pages).await {
            Ok(Ok((tools, cut))) => {
                if let Some(why) = &cut {
                    warn!(server, listed = tools.len(), reason = %why, "MCP server's tool list cut short: its pages do not end");
                }
                Ok(Listing {
                    tools,
                    cut,
                    announces_changes,
                })
            }
            Ok(Err(e)) => Err(format!("MCP server {server}: tools/list failed: {e}")),
            Err(_) => Err(format!(
                "MCP server {server}: tools/list took more than {} ms",
                deadline.as_millis()
            )),
        }
    }

    /// The server's list generation now: bumped by every
    /// `notifications/tools/list_changed` and every new connection. 0 for
    /// a server not in the catalogue.
    pub fn list_generation(&self, server: &str) -> u64 {
        self.slots
            .get(server)
            .map_or(0, |slot| *slot.generation.borrow())
    }

    /// Wait up to `wait` for the server's list generation to pass `since`
    /// ([`Self::list_generation`] read before a listing): true when it did
    /// (list again), false when the wait ended first.
    pub async fn list_changed(&self, server: &str, since: u64, wait: Duration) -> bool {
        let Some(slot) = self.slots.get(server) else {
            return false;
        };
        let mut rx = slot.generation.subscribe();
        tokio::time::timeout(wait, rx.wait_for(|g| *g > since))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// `tools/call` of `tool` on `server` with `arguments` (a JSON object),
    /// within `limits` (waiting for a connection included), sending
    /// `idempotency_key` in `_meta` and handing each progress notification's
    /// text (`3/5: message`) to `progress`. A call cut by a bound, or whose
    /// future is dropped, is cancelled (`notifications/cancelled`). The
    /// result is the server's, as it sent it: [`render`] or [`render_for`]
    /// make it what the model sees (see the module doc). Errors: a
    /// [`ToolFailure`] the model sees: `timeout` naming the bound that cut
    /// the call; `unavailable` for a call known not to have run;
    /// `outcome_unknown` when the server died or the connection broke
    /// during the call (a stdio server's exit and last stderr lines named).
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: Value,
        idempotency_key: &str,
        limits: CallLimits,
        progress: &(dyn Fn(String) + Send + Sync),
    ) -> Result<CallToolResult, ToolFailure> {
        let started = tokio::time::Instant::now();
        let conn = self
            .connection(server, limits.idle)
            .await
            .map_err(|message| ToolFailure {
                kind: ToolErrorKind::Unavailable,
                message,
            })?;
        let slot = self
            .slots
            .get(server)
            .expect("connected servers have a slot");
        let Value::Object(arguments) = arguments else {
            return Err(ToolFailure {
                kind: ToolErrorKind::InvalidArguments,
                message: "the arguments must be a JSON object".into(),
            });
        };
        let mut meta = RequestMetaObject::new();
        meta.0.0.insert(
            IDEMPOTENCY_META_KEY.into(),
            Value::String(idempotency_key.to_owned()),
        );
        let left = |bound: Duration| {
            bound
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(1))
        };
        // rmcp sets the request's `progressToken`, starts the idle timeout
        // again on each progress report for it, and sends
        // `notifications/cancelled` when either bound cuts the call.
        let options = match limits.total {
            Some(total) => PeerRequestOptions::with_timeout(limits.idle)
                .reset_timeout_on_progress()
                .with_max_total_timeout(left(total)),
            None => PeerRequestOptions::with_timeout(left(limits.idle)),
        };
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments),
        ));
        let handle = conn
            .peer
            .send_request_with_option(request, options.with_meta(meta))
            .await
            .map_err(|e| ToolFailure {
                kind: ToolErrorKind::Unavailable,
                message: format!("MCP server {server} is not available: {e}"),
            })?;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let key = token_key(&handle.progress_token);
        slot.progress
            .lock()
            .expect("progress routes")
            .insert(key.clone(), tx);
        let mut guard = InFlight {
            peer: conn.peer.clone(),
            id: Some(handle.id.clone()),
            routes: slot.progress.clone(),
            key,
        };
        let response = handle.await_response();
        tokio::pin!(response);
        let answer = loop {
            tokio::select! {
                answer = &mut response => break answer,
                Some(text) = rx.recv() => progress(text),
            }
        };
        guard.id = None;
        // rmcp hands each notification to the handler on a task of its own,
        // so the last progress report may be handled just after the result:
        // give those tasks a turn, then forward what arrived.
        tokio::task::yield_now().await;
        drop(guard);
        while let Ok(text) = rx.try_recv() {
            progress(text);
        }
        // An `outcome_unknown` message enters the conversation as glia's own
        // text (not neutralised there): `why` may hold the server's stderr
        // or transport text, so glia's markers in it are neutralised here.
        let lost = |why: String| {
            ToolFailure {
            kind: ToolErrorKind::OutcomeUnknown,
            message: glia_proto::marker::neutralise(&format!(
                "MCP server {server} {why} during the call of {tool}; whether the call took effect is unknown."
            ))
            .into_owned(),
        }
        };
        if let Err(e) = &answer
            && let Some(cause) = not_run(e)
        {
            return Err(ToolFailure {
                kind: ToolErrorKind::Unavailable,
                message: format!(
                    "MCP server {server} did not run the call of {tool}: {cause}. The call did not take effect; calling it again is safe."
                ),
            });
        }
        match answer {
            Ok(ServerResult::CallToolResult(result)) => Ok(result),
            Ok(other) => Err(ToolFailure {
                kind: ToolErrorKind::InvalidOutput,
                message: format!(
                    "MCP server {server} answered tools/call of {tool} with something that is not a tool result: {}",
                    clip(&format!("{other:?}"), 300)
                ),
            }),
            Err(rmcp::ServiceError::Timeout { timeout }) => Err(ToolFailure {
                kind: ToolErrorKind::Timeout,
                message: timeout_message(server, tool, limits, timeout),
            }),
            Err(rmcp::ServiceError::TransportClosed) => Err(lost(match &conn.process {
                Some(process) => format!("stopped ({})", process.death(DEATH_WAIT).await),
                None => "closed the connection".into(),
            })),
            // rmcp 3.11 answers a call whose response was still streaming
            // when it re-initialised an expired session with an error of
            // its own (streamable_http_client.rs): the server may have run
            // it.
            Err(rmcp::ServiceError::McpError(e))
                if e.message
                    .contains("re-initialized before the response arrived") =>
            {
                Err(lost(format!("lost its session ({})", e.message)))
            }
            Err(rmcp::ServiceError::McpError(e)) => Err(self.refused(server, tool, e).await),
            // The transport's error without rmcp's transport type name.
            Err(rmcp::ServiceError::TransportSend(e)) => Err(lost(format!("failed ({})", e.error))),
            Err(e) => Err(lost(format!("failed ({e})"))),
        }
    }

    /// The failure for a `tools/call` the server answered with a JSON-RPC
    /// error: when the server no longer lists `tool` (it was removed after
    /// the step's tools were listed, `notifications/tools/list_changed`),
    /// an [`ToolErrorKind::Unavailable`] failure saying so; otherwise a
    /// [`ToolErrorKind::Failed`] one with the server's message.
    async fn refused(&self, server: &str, tool: &str, e: rmcp::model::ErrorData) -> ToolFailure {
        let listing = self.list_tools(server, Duration::from_millis(1)).await;
        if let Ok(listing) = listing
            && listing.cut.is_none()
            && !listing.tools.iter().any(|t| t.name == tool)
        {
            return ToolFailure {
                kind: ToolErrorKind::Unavailable,
                message: format!(
                    "MCP server {server} no longer offers the tool {tool}: it was removed after this step's tools were listed, and the call did not run (the server said: {}). Do not call it again in this step.",
                    e.message
                ),
            };
        }
        ToolFailure {
            kind: ToolErrorKind::Failed,
            message: format!(
                "MCP server {server} refused the call of {tool}: {}",
                e.message
            ),
        }
    }

    /// Stop every server and wait for the supervisors to finish.
    pub async fn shutdown(&self) {
        self.shutdown.send_replace(true);
        for task in self.tasks.lock().await.drain(..) {
            let _ = task.await;
        }
    }
}

impl Drop for McpHub {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
    }
}

/// The message of a call cut by `timeout` (the value rmcp reports: the idle
/// timeout, or what was left of the total).
fn timeout_message(server: &str, tool: &str, limits: CallLimits, timeout: Duration) -> String {
    match limits.total {
        Some(total) if timeout != limits.idle => format!(
            "MCP tool {tool} ({server}) timed out: it reached its max_total_ms of {} ms, the bound on a call however often it reports progress; the call was cancelled",
            total.as_millis()
        ),
        Some(_) => format!(
            "MCP tool {tool} ({server}) timed out: no progress report for {} ms (its timeout_ms, an idle timeout); the call was cancelled",
            limits.idle.as_millis()
        ),
        None => format!(
            "MCP tool {tool} ({server}) timed out after {} ms; the call was cancelled",
            limits.idle.as_millis()
        ),
    }
}

/// Why a failed request is known not to have run on the server, in plain
/// words, or `None` when it may have: the streamable HTTP server answered
/// 404 for an expired session (rmcp re-initialises the session once and
/// sends the request again; this is the answer after that), starting a new
/// session failed, or no connection to the server could be made.
fn not_run(e: &rmcp::ServiceError) -> Option<String> {
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    let rmcp::ServiceError::TransportSend(e) = e else {
        return None;
    };
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e.error.as_ref());
    while let Some(error) = source {
        match error.downcast_ref::<StreamableHttpError<reqwest_mcp::Error>>() {
            Some(StreamableHttpError::SessionExpired) => {
                return Some("its HTTP session had expired (it answered 404 Not Found, also after a new session was started)".into());
            }
            Some(StreamableHttpError::ReinitializationFailed(data)) => {
                return Some(format!(
                    "its HTTP session had expired (it answered 404 Not Found) and starting a new session failed: {}",
                    data.message
                ));
            }
            _ => {}
        }
        if let Some(http) = error.downcast_ref::<reqwest_mcp::Error>()
            && http.is_connect()
        {
            return Some("glia could not connect to it".into());
        }
        source = error.source();
    }
    None
}

/// A `tools/call` in flight: dropped before its answer (abandoned), it
/// sends `notifications/cancelled`; either way its progress route goes.
struct InFlight {
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
    routes: ProgressRoutes,
    key: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.routes
            .lock()
            .expect("progress routes")
            .remove(&self.key);
        if let Some(id) = self.id.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let peer = self.peer.clone();
            runtime.spawn(async move {
                let param = CancelledNotificationParam::new(
                    Some(id),
                    Some("the call was abandoned (the run was cancelled)".into()),
                );
                let _ = peer
                    .send_notification(CancelledNotification::new(param).into())
                    .await;
            });
        }
    }
}

/// What the model sees of a `tools/call` result of the step's tool `spec`:
/// first, when the tool declares an `outputSchema`
/// ([`ToolSpec::output_schema`]) and the call succeeded, its
/// `structuredContent` is checked against it ([`check_output`]); a result
/// that has none or does not match is, per the spec's
/// [`OutputSchemaCheck`], an `invalid_output` [`ToolFailure`] naming each
/// violation's path and rule (`enforce`), or passes with a warning in the
/// worker's log (`warn`). Then [`render`].
pub fn render_for(spec: &ToolSpec, result: CallToolResult) -> Result<ToolContent, ToolFailure> {
    if let Some(output) = &spec.output_schema
        && result.is_error != Some(true)
        && let Err(why) = check_output(&output.schema, result.structured_content.as_ref())
    {
        let message = format!(
            "MCP tool {} answered a result that does not match its outputSchema: {why}",
            spec.name
        );
        match output.check {
            OutputSchemaCheck::Enforce => {
                return Err(ToolFailure {
                    kind: ToolErrorKind::InvalidOutput,
                    message,
                });
            }
            OutputSchemaCheck::Warn => warn!(tool = %spec.name, "{message}"),
        }
    }
    render(result)
}

/// Why `structured` (a result's `structuredContent`) does not satisfy the
/// tool's `outputSchema` `schema`, in words: `it has no structuredContent`,
/// or each violation as `at PATH: MESSAGE (rule SCHEMA_PATH)`, joined by
/// `; ` (paths are JSON Pointers, `/` for the root), or why the schema
/// cannot be used. `Ok` when it conforms.
///
/// ```
/// use serde_json::json;
/// let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
/// assert!(glia_agent::mcp::check_output(&schema, Some(&json!({"n": 1}))).is_ok());
/// let why = glia_agent::mcp::check_output(&schema, Some(&json!({"n": "x"}))).unwrap_err();
/// assert_eq!(why, r#"at /n: "x" is not of type "integer" (rule /properties/n/type)"#);
/// ```
pub fn check_output(schema: &Value, structured: Option<&Value>) -> Result<(), String> {
    let Some(structured) = structured else {
        return Err(
            "it has no structuredContent (a tool with an outputSchema must give one)".into(),
        );
    };
    let validator = jsonschema::validator_for(schema)
        .map_err(|e| format!("the outputSchema cannot be used ({e})"))?;
    let pointer = |p: String| if p.is_empty() { "/".to_owned() } else { p };
    let problems: Vec<String> = validator
        .iter_errors(structured)
        .map(|e| {
            format!(
                "at {}: {e} (rule {})",
                pointer(e.instance_path().to_string()),
                pointer(e.schema_path().to_string())
            )
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// What the model sees of a `tools/call` result: the module doc's table.
/// `isError: true` is a [`ToolFailure`] with the content as text.
/// `structuredContent` keeps its keys in the server's order and its
/// numbers as parsed (serde_json's `preserve_order` and `float_roundtrip`).
pub fn render(result: CallToolResult) -> Result<ToolContent, ToolFailure> {
    let mut blocks: Vec<ResultBlock> = result.content.into_iter().map(result_block).collect();
    if let Some(structured) = result.structured_content {
        let echoed = blocks.iter().any(|b| matches!(b, ResultBlock::Text { text } if serde_json::from_str::<Value>(text).is_ok_and(|v| v == structured)));
        if !echoed {
            blocks.push(ResultBlock::text(
                json!({ "structuredContent": structured }).to_string(),
            ));
        }
    }
    let content = ToolContent::from_blocks(blocks);
    if result.is_error == Some(true) {
        let message = content.to_text();
        return Err(ToolFailure::failed(if message.is_empty() {
            "the tool reported an error without a message".into()
        } else {
            message.into_owned()
        }));
    }
    Ok(content)
}

/// One MCP content block as a block the model sees (the module doc's table).
fn result_block(block: ContentBlock) -> ResultBlock {
    match block {
        ContentBlock::Text(t) => ResultBlock::text(t.text),
        ContentBlock::Image(i) => image_block(ImageSource::base64(i.mime_type, i.data), None),
        ContentBlock::Audio(a) => ResultBlock::text(format!(
            "[audio left out: {}, {} bytes; the model cannot take audio in a tool result]",
            a.mime_type,
            base64_decoded_len(&a.data)
        )),
        ContentBlock::Resource(r) => match r.resource {
            ResourceContents::TextResourceContents { uri, text, .. } => {
                ResultBlock::text(format!("[resource: {uri}]\n{text}"))
            }
            ResourceContents::BlobResourceContents {
                uri,
                mime_type: Some(mime_type),
                blob,
                ..
            } if mime_type.starts_with("image/") => {
                image_block(ImageSource::base64(mime_type, blob), Some(&uri))
            }
            ResourceContents::BlobResourceContents {
                uri,
                mime_type,
                blob,
                ..
            } => ResultBlock::text(format!(
                "[resource left out: {uri}, {}, {} bytes; binary content the model cannot take]",
                mime_type.as_deref().unwrap_or("no media type"),
                base64_decoded_len(&blob)
            )),
            other => unknown(&other),
        },
        ContentBlock::ResourceLink(link) => {
            let mut text = format!("[resource link: {} \"{}\"", link.uri, link.name);
            if let Some(mime_type) = &link.mime_type {
                text.push_str(&format!(", {mime_type}"));
            }
            if let Some(size) = link.size {
                text.push_str(&format!(", {size} bytes"));
            }
            if let Some(description) = link.description.as_deref().or(link.title.as_deref()) {
                text.push_str(&format!(": {description}"));
            }
            text.push(']');
            ResultBlock::text(text)
        }
        other => unknown(&other),
    }
}

/// Content of a kind this rmcp version adds and glia does not know: its
/// JSON as text, so nothing the server said is dropped.
fn unknown(content: &impl serde::Serialize) -> ResultBlock {
    ResultBlock::text(
        serde_json::to_string(content)
            .unwrap_or_else(|e| format!("[content glia cannot read: {e}]")),
    )
}

/// An image block when a model can take `source`, else the note saying
/// what it was (and from which resource `uri`) and why it is left out.
fn image_block(source: ImageSource, uri: Option<&str>) -> ResultBlock {
    match source.usable() {
        Ok(source) => ResultBlock::Image { source },
        Err(note) => match uri {
            Some(uri) => ResultBlock::text(format!("{note} (resource {uri})")),
            None => ResultBlock::text(note),
        },
    }
}

fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        format!("{}…", text.chars().take(max).collect::<String>())
    }
}

/// Keep one server connected until shutdown.
async fn supervise(
    name: String,
    entry: McpServerEntry,
    slot: Arc<Slot>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = MIN_BACKOFF;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let connecting = tokio::time::timeout(INITIALIZE_TIMEOUT, connect(&name, &entry, &slot));
        let attempt = tokio::select! {
            attempt = connecting => attempt.unwrap_or_else(|_| Err(format!("initialize took more than {} s", INITIALIZE_TIMEOUT.as_secs()))),
            _ = shutdown.changed() => return,
        };
        match attempt {
            Ok((service, pid, process)) => {
                info!(server = %name, pid, "MCP server connected");
                backoff = MIN_BACKOFF;
                slot.connected.send_replace(Some(Connected {
                    peer: service.peer().clone(),
                    pid,
                    process: process.clone(),
                }));
                // A new connection may list other tools than the last.
                slot.generation.send_modify(|g| *g += 1);
                let token = service.cancellation_token();
                let waiting = service.waiting();
                tokio::pin!(waiting);
                tokio::select! {
                    quit = &mut waiting => {
                        slot.connected.send_replace(None);
                        let cause = match &process {
                            Some(process) => process.death(DEATH_WAIT).await,
                            None => format!("the connection ended ({quit:?})"),
                        };
                        warn!(server = %name, pid, "MCP server stopped: {cause}; starting it again");
                        *slot.last_error.lock().expect("last error") = format!("the server stopped: {cause}");
                    }
                    _ = shutdown.changed() => {
                        slot.connected.send_replace(None);
                        token.cancel();
                        let _ = waiting.await;
                        info!(server = %name, "MCP server stopped (shutdown)");
                        return;
                    }
                }
            }
            Err(e) => {
                warn!(server = %name, error = %e, retry_ms = backoff.as_millis() as u64, "MCP server could not be started");
                *slot.last_error.lock().expect("last error") = e;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// A connected server: the service, and for stdio the child's pid and record.
type Started = (
    RunningService<RoleClient, Handler>,
    Option<u32>,
    Option<Arc<stdio::Process>>,
);

/// Start (stdio) or reach (HTTP) a server and run `initialize`.
async fn connect(name: &str, entry: &McpServerEntry, slot: &Slot) -> Result<Started, String> {
    let handler = Handler {
        progress: slot.progress.clone(),
        generation: slot.generation.clone(),
    };
    let var = |source: &str| {
        std::env::var(source).map_err(|_| format!("the environment variable {source} is not set"))
    };
    match entry.transport {
        McpTransport::Stdio => {
            let command = entry.command.as_deref().unwrap_or_default();
            let mut cmd = tokio::process::Command::new(command);
            cmd.args(&entry.args).env_clear();
            for inherited in ["PATH", "HOME"] {
                if let Some(v) = std::env::var_os(inherited) {
                    cmd.env(inherited, v);
                }
            }
            let mut secrets = Vec::new();
            for (child_var, source) in &entry.env {
                let value = var(source)?;
                secrets.push(value.clone());
                cmd.env(child_var, value);
            }
            if let Some(cwd) = &entry.cwd {
                cmd.current_dir(cwd);
            }
            let (transport, process, pid) = stdio::spawn(name, cmd, secrets, slot.noise.clone())
                .map_err(|e| format!("could not start {command:?}: {e}"))?;
            match handler.serve(transport).await {
                Ok(service) => Ok((service, pid, Some(process))),
                Err(e) => Err(format!(
                    "initialize failed: {e} ({})",
                    process.death(DEATH_WAIT).await
                )),
            }
        }
        McpTransport::StreamableHttp => {
            install_crypto();
            let url = entry.url.as_deref().unwrap_or_default();
            let mut config = rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(url).max_concurrent_requests(32);
            for (header, source) in &entry.headers {
                let name = reqwest_mcp::header::HeaderName::from_bytes(header.as_bytes())
                    .map_err(|e| format!("header {header}: {e}"))?;
                let mut value =
                    reqwest_mcp::header::HeaderValue::from_str(&var(source)?).map_err(|_| {
                        format!(
                            "header {header}: the value of {source} is not a valid header value"
                        )
                    })?;
                value.set_sensitive(true);
                config.custom_headers.insert(name, value);
            }
            let client = reqwest_mcp::Client::builder()
                .redirect(reqwest_mcp::redirect::Policy::none())
                .build()
                .map_err(|e| format!("HTTP client: {e}"))?;
            let transport =
                rmcp::transport::StreamableHttpClientTransport::with_client(client, config);
            let service = handler
                .serve(transport)
                .await
                .map_err(|e| format!("initialize failed: {e}"))?;
            Ok((service, None, None))
        }
    }
}

/// The process-wide rustls provider (ring) for the MCP HTTP client.
fn install_crypto() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
