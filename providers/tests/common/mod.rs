//! Shared test fixtures: a local HTTP server replaying recorded answers,
//! fixture files, chunk splitting, test clocks and requests.
#![allow(dead_code)]

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use glia_proto::{LiveEvent, Message, ToolSpec};
use glia_providers::Clock;
use glia_providers::error::CallError;
use glia_providers::http::ByteStream;
use glia_worker::provider::{ModelRequest, ToolChoice};
use serde_json::{Value, json};

/// The bytes of `tests/fixtures/{path}`.
pub fn fixture(path: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(path);
    std::fs::read(&p).unwrap_or_else(|e| panic!("fixture {}: {e}", p.display()))
}

/// A fixture parsed as JSON.
pub fn fixture_json(path: &str) -> Value {
    serde_json::from_slice(&fixture(path)).unwrap_or_else(|e| panic!("fixture {path}: {e}"))
}

/// `bytes` as a chunk stream cut at `cuts` (sorted byte offsets).
pub fn chunked(bytes: &[u8], cuts: &[usize]) -> ByteStream<'static> {
    let mut chunks = Vec::new();
    let mut at = 0;
    for &c in cuts.iter().chain(std::iter::once(&bytes.len())) {
        if c > at {
            chunks.push(Ok::<Bytes, CallError>(Bytes::copy_from_slice(&bytes[at..c])));
            at = c;
        }
    }
    futures::stream::iter(chunks).boxed()
}

/// Collects live deltas.
#[derive(Default)]
pub struct Deltas(pub Mutex<Vec<(String, String)>>);

impl Deltas {
    pub fn push(&self, e: LiveEvent) {
        if let LiveEvent::ModelDelta { channel, delta } = e {
            self.0.lock().unwrap().push((channel, delta));
        }
    }

    /// The concatenated deltas of `channel`.
    pub fn joined(&self, channel: &str) -> String {
        self.0.lock().unwrap().iter().filter(|(c, _)| c == channel).map(|(_, d)| d.as_str()).collect()
    }
}

/// One scripted HTTP answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub chunks: Vec<Vec<u8>>,
    pub delay: Duration,
}

impl Reply {
    /// An event stream, written in chunks of 7 bytes (so network reads split
    /// events, lines and characters).
    pub fn sse(bytes: Vec<u8>) -> Self {
        Reply { status: 200, headers: vec![("content-type".into(), "text/event-stream".into())], chunks: bytes.chunks(7).map(<[u8]>::to_vec).collect(), delay: Duration::from_micros(200) }
    }

    /// A JSON body with `status`.
    pub fn json(status: u16, body: Vec<u8>) -> Self {
        Reply { status, headers: vec![("content-type".into(), "application/json".into())], chunks: vec![body], delay: Duration::ZERO }
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
    /// The test clock's time when it arrived (0 without a clock).
    pub at_ms: u64,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

type Handler = Arc<dyn Fn(usize, &Seen) -> Reply + Send + Sync>;

#[derive(Clone)]
struct Shared {
    handler: Handler,
    seen: Arc<Mutex<Vec<Seen>>>,
    clock: Option<Arc<dyn Clock>>,
}

/// A local HTTP server on 127.0.0.1 (ephemeral port).
pub struct Server {
    pub base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(State(st): State<Shared>, req: Request) -> Response {
    let path = req.uri().path().to_owned();
    let headers = req.headers().iter().map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned())).collect();
    let bytes = axum::body::to_bytes(req.into_body(), usize::MAX).await.unwrap_or_default();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let at_ms = st.clock.as_ref().map_or(0, |c| c.now_ms());
    let seen = Seen { path, headers, body, at_ms };
    let n = {
        let mut all = st.seen.lock().unwrap();
        all.push(seen.clone());
        all.len() - 1
    };
    let reply = (st.handler)(n, &seen);
    let mut builder = Response::builder().status(reply.status);
    for (k, v) in &reply.headers {
        builder = builder.header(k, v);
    }
    let delay = reply.delay;
    let stream = futures::stream::iter(reply.chunks).then(move |c| async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Ok::<Bytes, Infallible>(Bytes::from(c))
    });
    builder.body(Body::from_stream(stream)).unwrap()
}

impl Server {
    /// Serve with `handler(n, request)` (n counts from 0), stamping
    /// requests with `clock`.
    pub async fn start(handler: impl Fn(usize, &Seen) -> Reply + Send + Sync + 'static, clock: Option<Arc<dyn Clock>>) -> Server {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let shared = Shared { handler: Arc::new(handler), seen: seen.clone(), clock };
        let app = axum::Router::new().fallback(handle).with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Server { base, seen, task }
    }

    /// Serve `replies` in order; after the last, HTTP 500.
    pub async fn replay(replies: Vec<Reply>) -> Server {
        Server::start(move |n, _| replies.get(n).cloned().unwrap_or_else(|| Reply::json(500, br#"{"error":{"message":"no more replies","type":"server_error"}}"#.to_vec())), None).await
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// A clock whose sleeps return at once, recording the duration and moving
/// "now" forward by it.
pub struct StepClock {
    pub now: AtomicU64,
    pub sleeps: Mutex<Vec<Duration>>,
}

impl StepClock {
    pub fn at(now_ms: u64) -> Arc<Self> {
        Arc::new(StepClock { now: AtomicU64::new(now_ms), sleeps: Mutex::new(Vec::new()) })
    }

    pub fn sleeps(&self) -> Vec<Duration> {
        self.sleeps.lock().unwrap().clone()
    }
}

impl Clock for StepClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()> {
        self.sleeps.lock().unwrap().push(d);
        self.now.fetch_add(u64::try_from(d.as_millis()).unwrap(), Ordering::SeqCst);
        Box::pin(async {})
    }
}

/// A clock running `factor` times faster than real time, from `start_ms`.
pub struct ScaledClock {
    start: Instant,
    start_ms: u64,
    factor: u32,
}

impl ScaledClock {
    pub fn new(start_ms: u64, factor: u32) -> Arc<Self> {
        Arc::new(ScaledClock { start: Instant::now(), start_ms, factor })
    }
}

impl Clock for ScaledClock {
    fn now_ms(&self) -> u64 {
        self.start_ms + u64::try_from((self.start.elapsed() * self.factor).as_millis()).unwrap()
    }

    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(d / self.factor))
    }
}

/// A tool spec with an object schema.
pub fn tool(name: &str, schema: Value) -> ToolSpec {
    ToolSpec { name: name.into(), description: format!("The {name} tool."), input_schema: schema, idempotent: false, timeout_ms: 30_000, external: false, return_direct: false, cancel_grace_ms: glia_proto::DEFAULT_CANCEL_GRACE_MS, source: None }
}

/// A plain request: system prompt, one user message, one tool.
pub fn request(model: &str) -> ModelRequest {
    ModelRequest {
        model: model.into(),
        system: "You are a support agent.".into(),
        messages: vec![Message::user("Where is order A1?")],
        tools: vec![tool("lookup_order", json!({"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}))],
        tool_choice: ToolChoice::Auto,
        max_tokens: 1024,
    }
}

impl ScaledClock {
    /// Now, for tests that hold the concrete type.
    pub fn now_ms_for_test(&self) -> u64 {
        Clock::now_ms(self)
    }
}
