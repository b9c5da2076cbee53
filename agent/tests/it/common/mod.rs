//! Shared fixtures for the loop tests: a few tools, an agent builder, log helpers.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::FutureExt;
use futures::future::BoxFuture;
use glia_agent::provider::{ScriptedProvider, ScriptedTurn};
use glia_agent::tool::{DynTool, Tool, ToolContext, ToolFailure, ToolRegistry};
use glia_agent::{Agent, FixedClock};
use glia_proto::{Event, EventKind, Policy, PolicyAction, RunConfig, RunState, ToolSpec};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

pub fn epoch() -> DateTime<Utc> {
    DateTime::UNIX_EPOCH
}

pub fn run_id() -> Uuid {
    Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001)
}

#[allow(unused_imports)]
pub use glia_testkit::tools::{Add, AddArgs};

#[derive(Deserialize, JsonSchema)]
pub struct RefundArgs {
    pub order: String,
    pub amount: u64,
}

/// Issues a refund; not idempotent; counts its executions.
pub struct Refund(pub Arc<AtomicUsize>);
impl Tool for Refund {
    type Args = RefundArgs;
    type Output = Value;
    fn name(&self) -> &str {
        "refund"
    }
    fn description(&self) -> &str {
        "Refund an order."
    }
    async fn call(&self, args: RefundArgs, ctx: ToolContext) -> Result<Value, ToolFailure> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(json!({ "refunded": args.amount, "order": args.order, "key": ctx.idempotency_key }))
    }
}

#[derive(Deserialize, JsonSchema)]
pub struct Empty {}

/// Sleeps longer than its timeout.
pub struct Slow;
impl Tool for Slow {
    type Args = Empty;
    type Output = String;
    fn name(&self) -> &str {
        "slow"
    }
    fn description(&self) -> &str {
        "Never finishes in time."
    }
    fn timeout(&self) -> Duration {
        Duration::from_millis(50)
    }
    async fn call(&self, _args: Empty, _ctx: ToolContext) -> Result<String, ToolFailure> {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok("late".into())
    }
}

/// Panics.
pub struct Crashy;
impl Tool for Crashy {
    type Args = Empty;
    type Output = String;
    fn name(&self) -> &str {
        "crashy"
    }
    fn description(&self) -> &str {
        "Panics."
    }
    async fn call(&self, _args: Empty, _ctx: ToolContext) -> Result<String, ToolFailure> {
        panic!("index out of bounds in crashy")
    }
}

/// Returns an error.
pub struct Failing;
impl Tool for Failing {
    type Args = Empty;
    type Output = String;
    fn name(&self) -> &str {
        "failing"
    }
    fn description(&self) -> &str {
        "Fails."
    }
    async fn call(&self, _args: Empty, _ctx: ToolContext) -> Result<String, ToolFailure> {
        Err(ToolFailure::failed("database unavailable"))
    }
}

/// A run-time tool that returns text which claims to be JSON but is not.
pub struct Garbage;
impl DynTool for Garbage {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "garbage".into(),
            description: "Returns broken JSON.".into(),
            input_schema: json!({"type": "object"}),
            idempotent: false,
            timeout_ms: 1000,
            external: false,
            return_direct: false,
            cancel_grace_ms: glia_proto::DEFAULT_CANCEL_GRACE_MS,
            source: None,
            policy: None,
            max_result_bytes: None,
            output_schema: None,
        }
    }
    fn call_raw(
        &self,
        _input: Value,
        _ctx: ToolContext,
    ) -> BoxFuture<'static, Result<String, ToolFailure>> {
        async { Ok("{\"flights\": [1, 2,".to_owned()) }.boxed()
    }
}

/// All the fixture tools; `refunds` counts refund executions.
pub fn tools(refunds: Arc<AtomicUsize>) -> ToolRegistry {
    let mut t = ToolRegistry::default();
    t.register(Add)
        .register(Refund(refunds))
        .register(Slow)
        .register(Crashy)
        .register(Failing);
    t.register_dyn(Arc::new(Garbage)).unwrap();
    t
}

/// An agent over `script` with the fixture tools and a fixed clock.
pub fn agent(script: Vec<ScriptedTurn>) -> (Agent, Arc<ScriptedProvider>) {
    agent_at(script, 0)
}

/// Like [`agent`] but the provider resumes after `served` turns, as a fresh process would.
pub fn agent_at(script: Vec<ScriptedTurn>, served: usize) -> (Agent, Arc<ScriptedProvider>) {
    let provider = Arc::new(ScriptedProvider::new(script).starting_at(served));
    let agent = Agent::new(provider.clone())
        .with_tools(tools(Arc::default()))
        .with_clock(FixedClock(epoch()));
    (agent, provider)
}

/// A config where `refund` needs approval and `ask_customer` is external.
pub fn approval_config() -> RunConfig {
    RunConfig {
        policies: vec![Policy {
            tool: "refund".into(),
            args: None,
            action: PolicyAction::RequireApproval,
        }],
        external_tools: vec![ToolSpec {
            name: "ask_customer".into(),
            description: "Ask the customer a question; answered by the client.".into(),
            input_schema: json!({"type": "object", "properties": {"question": {"type": "string"}}, "required": ["question"]}),
            idempotent: false,
            timeout_ms: 0,
            external: true,
            return_direct: false,
            cancel_grace_ms: glia_proto::DEFAULT_CANCEL_GRACE_MS,
            source: None,
            policy: None,
            max_result_bytes: None,
            output_schema: None,
        }],
        ..RunConfig::default()
    }
}

/// Dotted names of `log`, in order.
pub fn names(log: &[Event]) -> Vec<&'static str> {
    log.iter().map(|e| e.kind.name()).collect()
}

/// Model responses recorded in `log` (how many scripted turns were served).
pub fn served(log: &[Event]) -> usize {
    log.iter()
        .filter(|e| matches!(e.kind, EventKind::ModelResponse { .. }))
        .count()
}

/// Replay `log` and check it equals `state`.
pub fn assert_replays(log: &[Event], state: &RunState) {
    let replayed = RunState::replay(state.run_id, log).expect("log replays");
    assert_eq!(
        &replayed, state,
        "replaying the log must give the live state"
    );
}

/// Serialise to JSON and back, as a checkpoint would.
pub fn through_json(state: &RunState) -> RunState {
    serde_json::from_str(&serde_json::to_string(state).unwrap()).unwrap()
}

/// Keeps the events and the live events.
#[derive(Default)]
pub struct LiveSink {
    pub log: Vec<Event>,
    pub live: std::sync::Mutex<Vec<glia_proto::LiveEvent>>,
}

#[glia_agent::async_trait]
impl glia_agent::agent::EventSink for LiveSink {
    async fn record(&mut self, event: &Event) -> Result<(), glia_agent::agent::SinkError> {
        self.log.push(event.clone());
        Ok(())
    }

    fn live(&self, event: &glia_proto::LiveEvent) {
        self.live.lock().unwrap().push(event.clone());
    }
}

/// The tool result of call `call_id` in `request` and whether it is an
/// error. Panics when the request carries none.
pub fn result_in(
    request: &glia_proto::ModelRequest,
    call_id: &str,
) -> (glia_proto::ToolContent, bool) {
    request
        .messages
        .iter()
        .flat_map(|m| &m.content)
        .find_map(|b| match b {
            glia_proto::ContentBlock::ToolResult {
                tool_use_id,
                content,
                is_error,
            } if tool_use_id == call_id => Some((content.clone(), *is_error)),
            _ => None,
        })
        .expect("the call's result is in the request")
}
