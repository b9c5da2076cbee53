//! The recorded-traffic HTTP server: a local server on 127.0.0.1 (ephemeral
//! port) that answers with recorded provider traffic (the fixtures of
//! `providers/tests/fixtures`, or bytes a test builds) and records every
//! request it received. Used in-process by the provider tests
//! ([`Server::start`], [`Server::replay`] on the test's runtime) and by
//! process-level tests, whose `glia` processes call it
//! ([`Server::background`], [`Server::streams`]: on a thread and runtime of
//! its own, for synchronous tests).

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::Value;

/// The bytes of `providers/tests/fixtures/{path}` (panics naming the file
/// when it cannot be read).
pub fn fixture(path: &str) -> Vec<u8> {
    let p = crate::workspace_root()
        .join("providers/tests/fixtures")
        .join(path);
    std::fs::read(&p).unwrap_or_else(|e| panic!("fixture {}: {e}", p.display()))
}

/// [`fixture`] parsed as JSON.
pub fn fixture_json(path: &str) -> Value {
    serde_json::from_slice(&fixture(path)).unwrap_or_else(|e| panic!("fixture {path}: {e}"))
}

/// The fixtures directory, `providers/tests/fixtures`.
pub fn fixtures_dir() -> PathBuf {
    crate::workspace_root().join("providers/tests/fixtures")
}

/// One scripted HTTP answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status code.
    pub status: u16,
    /// Headers (content-length is added by the server).
    pub headers: Vec<(String, String)>,
    /// The body, written chunk by chunk.
    pub chunks: Vec<Vec<u8>>,
    /// A pause before each chunk.
    pub delay: Duration,
}

impl Reply {
    /// A 200 event stream, written in chunks of 7 bytes 200 µs apart (so
    /// network reads split events, lines and characters).
    pub fn sse(bytes: Vec<u8>) -> Self {
        Reply {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            chunks: bytes.chunks(7).map(<[u8]>::to_vec).collect(),
            delay: Duration::from_micros(200),
        }
    }

    /// A JSON body with `status`, in one chunk.
    pub fn json(status: u16, body: Vec<u8>) -> Self {
        Reply {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            chunks: vec![body],
            delay: Duration::ZERO,
        }
    }

    /// Add a header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// HTTP 500 with an OpenAI-style error body: what the server answers
    /// once its replies are used up.
    pub fn exhausted() -> Self {
        Reply::json(
            500,
            br#"{"error":{"message":"no more replies","type":"server_error"}}"#.to_vec(),
        )
    }
}

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The request path (no query).
    pub path: String,
    /// Headers, names lowercase.
    pub headers: Vec<(String, String)>,
    /// The body as JSON (`Null` when it is not JSON).
    pub body: Value,
    /// The server's clock when it arrived, in ms (0 without a clock).
    pub at_ms: u64,
}

impl Seen {
    /// The value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

type Handler = Arc<dyn Fn(usize, &Seen) -> Reply + Send + Sync>;

/// A clock stamping requests, in ms.
pub type Stamp = Arc<dyn Fn() -> u64 + Send + Sync>;

#[derive(Clone)]
struct Shared {
    handler: Handler,
    seen: Arc<Mutex<Vec<Seen>>>,
    clock: Option<Stamp>,
}

/// The server; it stops when dropped.
pub struct Server {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: Option<tokio::task::JoinHandle<()>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn handle(State(st): State<Shared>, req: Request) -> Response {
    let path = req.uri().path().to_owned();
    let headers = req
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let bytes = axum::body::to_bytes(req.into_body(), usize::MAX)
        .await
        .unwrap_or_default();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let at_ms = st.clock.as_ref().map_or(0, |c| c());
    let seen = Seen {
        path,
        headers,
        body,
        at_ms,
    };
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

async fn bind(
    handler: Handler,
    clock: Option<Stamp>,
) -> (
    String,
    Arc<Mutex<Vec<Seen>>>,
    axum::Router,
    tokio::net::TcpListener,
) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let shared = Shared {
        handler,
        seen: seen.clone(),
        clock,
    };
    let app = axum::Router::new().fallback(handle).with_state(shared);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    (base, seen, app, listener)
}

impl Server {
    /// Serve on the current tokio runtime with `handler(n, request)` (n
    /// counts requests from 0), stamping requests with `clock`.
    pub async fn start(
        handler: impl Fn(usize, &Seen) -> Reply + Send + Sync + 'static,
        clock: Option<Stamp>,
    ) -> Server {
        let (base, seen, app, listener) = bind(Arc::new(handler), clock).await;
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Server {
            base,
            seen,
            task: Some(task),
            stop: None,
        }
    }

    /// Serve `replies` in order on the current runtime; after the last,
    /// [`Reply::exhausted`].
    pub async fn replay(replies: Vec<Reply>) -> Server {
        Server::start(
            move |n, _| replies.get(n).cloned().unwrap_or_else(Reply::exhausted),
            None,
        )
        .await
    }

    /// Serve `replies` in order (then [`Reply::exhausted`]) from a thread
    /// and runtime of its own, for synchronous tests.
    pub fn background(replies: Vec<Reply>) -> Server {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let handler: Handler = Arc::new(move |n, _: &Seen| {
                    replies.get(n).cloned().unwrap_or_else(Reply::exhausted)
                });
                let (base, seen, app, listener) = bind(handler, None).await;
                ready_tx.send((base, seen)).unwrap();
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(async move { drop(stopped.await) })
                    .await;
            });
        });
        let (base, seen) = ready_rx.recv().expect("the server starts");
        Server {
            base,
            seen,
            task: None,
            stop: Some(stop),
        }
    }

    /// [`Server::background`] answering with these event-stream fixtures
    /// (paths under `providers/tests/fixtures`), in order.
    pub fn streams(paths: &[&str]) -> Server {
        Server::background(paths.iter().map(|p| Reply::sse(fixture(p))).collect())
    }

    /// The requests so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}
