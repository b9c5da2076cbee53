//! The worker's MCP client (rmcp): one connection per catalogue server,
//! kept for the worker's life.
//!
//! - A `stdio` server is a child process the worker starts with the
//!   catalogue's command, arguments and environment (secret values read
//!   from the worker's environment at start; the child inherits only `PATH`
//!   and `HOME` besides). Its stderr is logged at debug level with every
//!   secret value replaced by `[redacted]`. A `streamable_http` server is
//!   reached at its URL with the catalogue's headers.
//! - A supervisor task per server connects (MCP `initialize`), and when the
//!   connection ends (the child died, the session closed) connects again
//!   with exponential backoff (100 ms doubling to 30 s, reset after a
//!   connection). [`McpHub::shutdown`] stops every server (stdin closed,
//!   then `SIGTERM`, then kill).
//! - [`McpHub::list_tools`] is `tools/list` with every page followed.
//! - [`McpHub::call`] is `tools/call` with the call's timeout (on expiry
//!   rmcp sends `notifications/cancelled`); dropping the call's future (the
//!   loop abandons a call after a cancel's grace period) also sends
//!   `notifications/cancelled`. The call's idempotency key travels in
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
//!   model sees it, and the run goes on.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use glia_proto::content::base64_decoded_len;
use glia_proto::{
    ImageSource, OutputSchemaCheck, ResultBlock, ToolContent, ToolErrorKind, ToolSpec,
};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotification,
    CancelledNotificationParam, ClientRequest, ContentBlock, ProgressNotificationParam, RequestId,
    RequestMetaObject, ResourceContents, ServerResult, Tool,
};
use rmcp::service::{NotificationContext, Peer, PeerRequestOptions, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::catalogue::{Catalogue, McpServerEntry, McpTransport};
use crate::tool::ToolFailure;

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
/// How long `tools/list` (all pages) may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(30);

type ProgressRoutes = Arc<Mutex<HashMap<String, mpsc::UnboundedSender<String>>>>;

/// The client side of one connection: routes `notifications/progress` to
/// the call that asked for them (by progress token).
#[derive(Clone)]
struct Handler {
    progress: ProgressRoutes,
}

impl ClientHandler for Handler {
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
}

struct Slot {
    connected: watch::Sender<Option<Connected>>,
    last_error: Mutex<String>,
    progress: ProgressRoutes,
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

    /// `tools/list`, following every `nextCursor`. Waits up to `wait` for
    /// the server to be connected. Errors: why, as text.
    pub async fn list_tools(&self, server: &str, wait: Duration) -> Result<Vec<Tool>, String> {
        let conn = self.connection(server, wait).await?;
        match tokio::time::timeout(LIST_TIMEOUT, conn.peer.list_all_tools()).await {
            Ok(Ok(tools)) => Ok(tools),
            Ok(Err(e)) => Err(format!("MCP server {server}: tools/list failed: {e}")),
            Err(_) => Err(format!(
                "MCP server {server}: tools/list took more than {} s",
                LIST_TIMEOUT.as_secs()
            )),
        }
    }

    /// `tools/call` of `tool` on `server` with `arguments` (a JSON object),
    /// within `timeout` (waiting for a connection included), sending
    /// `idempotency_key` in `_meta` and handing each progress notification's
    /// text (`3/5: message`) to `progress`. Dropping the future sends
    /// `notifications/cancelled`. The result is the server's, as it sent it:
    /// [`render`] or [`render_for`] make it what the model sees (see the
    /// module doc). Errors: a [`ToolFailure`] the model sees.
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: Value,
        idempotency_key: &str,
        timeout: Duration,
        progress: &(dyn Fn(String) + Send + Sync),
    ) -> Result<CallToolResult, ToolFailure> {
        let started = tokio::time::Instant::now();
        let conn = self
            .connection(server, timeout)
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
        let left = timeout
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(1));
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments),
        ));
        let handle = conn
            .peer
            .send_request_with_option(
                request,
                PeerRequestOptions::with_timeout(left).with_meta(meta),
            )
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
        let lost = |why: String| ToolFailure {
            kind: ToolErrorKind::OutcomeUnknown,
            message: format!(
                "MCP server {server} {why} during the call of {tool}; whether the call took effect is unknown."
            ),
        };
        match answer {
            Ok(ServerResult::CallToolResult(result)) => Ok(result),
            Ok(other) => Err(ToolFailure {
                kind: ToolErrorKind::InvalidOutput,
                message: format!(
                    "MCP server {server} answered tools/call of {tool} with something that is not a tool result: {}",
                    clip(&format!("{other:?}"), 300)
                ),
            }),
            Err(rmcp::ServiceError::Timeout { .. }) => Err(ToolFailure {
                kind: ToolErrorKind::Timeout,
                message: format!(
                    "MCP tool {tool} ({server}) timed out after {} ms",
                    timeout.as_millis()
                ),
            }),
            Err(rmcp::ServiceError::TransportClosed) => Err(lost("stopped".into())),
            Err(rmcp::ServiceError::McpError(e)) => Err(ToolFailure {
                kind: ToolErrorKind::Failed,
                message: format!(
                    "MCP server {server} refused the call of {tool}: {}",
                    e.message
                ),
            }),
            Err(e) => Err(lost(format!("failed ({e})"))),
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
            Ok((service, pid)) => {
                info!(server = %name, pid, "MCP server connected");
                backoff = MIN_BACKOFF;
                slot.connected.send_replace(Some(Connected {
                    peer: service.peer().clone(),
                    pid,
                }));
                let token = service.cancellation_token();
                let waiting = service.waiting();
                tokio::pin!(waiting);
                tokio::select! {
                    quit = &mut waiting => {
                        slot.connected.send_replace(None);
                        *slot.last_error.lock().expect("last error") = format!("the server stopped ({quit:?})");
                        warn!(server = %name, "MCP server stopped; starting it again");
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

/// Start (stdio) or reach (HTTP) a server and run `initialize`.
async fn connect(
    name: &str,
    entry: &McpServerEntry,
    slot: &Slot,
) -> Result<(RunningService<RoleClient, Handler>, Option<u32>), String> {
    let handler = Handler {
        progress: slot.progress.clone(),
    };
    let var = |source: &str| {
        std::env::var(source).map_err(|_| format!("the environment variable {source} is not set"))
    };
    match entry.transport {
        McpTransport::Stdio => {
            let command = entry.command.as_deref().unwrap_or_default();
            let mut cmd = tokio::process::Command::new(command);
            cmd.args(&entry.args).env_clear().kill_on_drop(true);
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
            let (transport, stderr) = rmcp::transport::TokioChildProcess::builder(cmd)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("could not start {command:?}: {e}"))?;
            let pid = transport.id();
            if let Some(stderr) = stderr {
                tokio::spawn(forward_stderr(name.to_owned(), stderr, secrets));
            }
            let service = handler
                .serve(transport)
                .await
                .map_err(|e| format!("initialize failed: {e}"))?;
            Ok((service, pid))
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
            Ok((service, None))
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

/// Log a stdio server's stderr at debug level, secret values redacted.
async fn forward_stderr(server: String, stderr: tokio::process::ChildStderr, secrets: Vec<String>) {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let line = secrets
            .iter()
            .filter(|s| !s.is_empty())
            .fold(line, |line, s| line.replace(s.as_str(), "[redacted]"));
        debug!(target: "glia_agent::mcp::stderr", server = %server, "{line}");
    }
}
