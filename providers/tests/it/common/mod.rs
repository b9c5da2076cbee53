//! Shared test fixtures: a local HTTP server replaying recorded answers,
//! fixture files, chunk splitting, test clocks and requests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use glia_agent::provider::{ModelRequest, ToolChoice};
use glia_proto::{LiveEvent, Message, ToolSpec};
use glia_providers::Clock;
use glia_providers::error::CallError;
use glia_providers::http::ByteStream;
use serde_json::{Value, json};

/// `bytes` as a chunk stream cut at `cuts` (sorted byte offsets).
pub fn chunked(bytes: &[u8], cuts: &[usize]) -> ByteStream<'static> {
    let mut chunks = Vec::new();
    let mut at = 0;
    for &c in cuts.iter().chain(std::iter::once(&bytes.len())) {
        if c > at {
            chunks.push(Ok::<Bytes, CallError>(Bytes::copy_from_slice(
                &bytes[at..c],
            )));
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

    /// The deltas of `channel`, one by one.
    pub fn of(&self, channel: &str) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(c, _)| c == channel)
            .map(|(_, d)| d.clone())
            .collect()
    }

    /// The first delta, of any channel.
    pub fn first(&self) -> Option<(String, String)> {
        self.0.lock().unwrap().first().cloned()
    }

    /// The concatenated deltas of `channel`.
    pub fn joined(&self, channel: &str) -> String {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(c, _)| c == channel)
            .map(|(_, d)| d.as_str())
            .collect()
    }
}

#[allow(unused_imports)]
pub use glia_testkit::http::{Reply, Seen, Server, fixture, fixture_json};

/// A clock whose sleeps return at once, recording the duration and moving
/// "now" forward by it.
pub struct StepClock {
    pub now: AtomicU64,
    pub sleeps: Mutex<Vec<Duration>>,
}

impl StepClock {
    pub fn at(now_ms: u64) -> Arc<Self> {
        Arc::new(StepClock {
            now: AtomicU64::new(now_ms),
            sleeps: Mutex::new(Vec::new()),
        })
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
        self.now
            .fetch_add(u64::try_from(d.as_millis()).unwrap(), Ordering::SeqCst);
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
        Arc::new(ScaledClock {
            start: Instant::now(),
            start_ms,
            factor,
        })
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
    ToolSpec {
        name: name.into(),
        description: format!("The {name} tool."),
        input_schema: schema,
        idempotent: false,
        timeout_ms: 30_000,
        external: false,
        return_direct: false,
        cancel_grace_ms: glia_proto::DEFAULT_CANCEL_GRACE_MS,
        source: None,
        policy: None,
        max_result_bytes: None,
        output_schema: None,
    }
}

/// A plain request: system prompt, one user message, one tool.
pub fn request(model: &str) -> ModelRequest {
    ModelRequest {
        model: model.into(),
        system: "You are a support agent.".into(),
        messages: vec![Message::user("Where is order A1?")],
        tools: vec![tool(
            "lookup_order",
            json!({"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}),
        )],
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
