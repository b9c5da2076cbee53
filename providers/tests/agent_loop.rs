//! The glia loop (`glia_worker::Agent`) running a two-turn tool conversation
//! end to end against each adapter's local server, with the exact request
//! bodies checked: the tool_use / tool_result pairing, the cache breakpoints
//! on the stable prefix, and cost from the price table.

mod common;

use std::sync::Arc;

use common::{Reply, Server, fixture, fixture_json};
use glia_proto::{Event, EventKind, Outcome, RunConfig, Status, ToolErrorKind, Usage};
use glia_providers::http::{HttpProvider, http_client};
use glia_providers::{Anthropic, ApiKey, OpenAi, PriceTable, RefusalIsolator, Wire};
use glia_worker::provider::Provider;
use glia_worker::tool::{Tool, ToolContext, ToolFailure, ToolRegistry};
use glia_worker::{Agent, FixedClock};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

#[derive(Deserialize, JsonSchema)]
struct AddArgs {
    a: i64,
    b: i64,
}

/// Adds two integers.
struct Add;

impl Tool for Add {
    type Args = AddArgs;
    type Output = Value;
    fn name(&self) -> &str {
        "add"
    }
    fn description(&self) -> &str {
        "Add two integers."
    }
    async fn call(&self, args: AddArgs, _ctx: ToolContext) -> Result<Value, ToolFailure> {
        Ok(json!({ "sum": args.a + args.b }))
    }
}

fn agent(provider: Arc<dyn Provider>) -> Agent {
    let mut tools = ToolRegistry::default();
    tools.register(Add);
    Agent::new(provider).with_tools(tools).with_clock(FixedClock(chrono::DateTime::UNIX_EPOCH))
}

fn config(provider: &str, model: &str) -> RunConfig {
    let prices = PriceTable::from_file(concat!(env!("CARGO_MANIFEST_DIR"), "/prices.example.json")).unwrap();
    RunConfig {
        model: model.into(),
        system: "You are a careful calculator. Use the add tool for sums.".into(),
        pricing: prices.pricing(provider, model),
        max_tokens: 1024,
        ..RunConfig::default()
    }
}

/// The model.response events: (usage, cost).
fn responses(log: &[Event]) -> Vec<(Usage, u64)> {
    log.iter()
        .filter_map(|e| match &e.kind {
            EventKind::ModelResponse { usage, cost_usd_micros, .. } => Some((*usage, *cost_usd_micros)),
            _ => None,
        })
        .collect()
}

async fn two_turns<W: Wire>(wire: W, provider_name: &str, model: &str, base_suffix: &str) -> (Vec<common::Seen>, Vec<Event>, Status) {
    let dir = provider_name;
    let server = Server::replay(vec![Reply::sse(fixture(&format!("{dir}/loop_turn1.sse"))), Reply::sse(fixture(&format!("{dir}/loop_turn2.sse")))]).await;
    let http = HttpProvider::new(wire, http_client().unwrap(), &format!("{}{base_suffix}", server.base), Some(ApiKey::new("sk-loop-test-key")));
    let provider: Arc<dyn Provider> = Arc::new(RefusalIsolator::new(Arc::new(http)));
    let mut log: Vec<Event> = Vec::new();
    let run_id = Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0042);
    let (_, status) = agent(provider).run(run_id, "What is 2 + 40?", config(provider_name, model), &mut log).await.unwrap();
    (server.seen(), log, status)
}

fn assert_succeeded(status: &Status) {
    assert!(matches!(status, Status::Done(Outcome::Succeeded { answer, .. }) if answer == "2 + 40 = 42."), "{status:?}");
}

#[tokio::test]
async fn anthropic_two_turn_tool_conversation() {
    let (seen, log, status) = two_turns(Anthropic::default(), "anthropic", "claude-sonnet-4-5", "").await;
    assert_succeeded(&status);
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].body, fixture_json("anthropic/loop_request1.json"), "first request:\n{}", serde_json::to_string_pretty(&seen[0].body).unwrap());
    assert_eq!(seen[1].body, fixture_json("anthropic/loop_request2.json"), "second request:\n{}", serde_json::to_string_pretty(&seen[1].body).unwrap());
    // The stable prefix carries the breakpoints in both requests, unchanged.
    for s in &seen {
        assert_eq!(s.body["system"][0]["cache_control"], json!({"type": "ephemeral"}));
        assert_eq!(s.body["tools"][0]["cache_control"], json!({"type": "ephemeral"}));
    }
    // Usage with cache tokens, and cost from the price table ($3 / $15 / $3.75 / $0.30 per MTok).
    let r = responses(&log);
    assert_eq!(r[0].0, Usage { input_tokens: 380, output_tokens: 48, cache_write_tokens: 1200, cache_read_tokens: 0 });
    // 380×3 + 48×15 + 1200×3.75 = 1140 + 720 + 4500 micros.
    assert_eq!(r[0].1, 6360);
    assert_eq!(r[1].0, Usage { input_tokens: 40, output_tokens: 9, cache_write_tokens: 0, cache_read_tokens: 1580 });
    // 40×3 + 9×15 + 1580×0.3 = 120 + 135 + 474.
    assert_eq!(r[1].1, 729);
}

#[tokio::test]
async fn openai_two_turn_tool_conversation() {
    let (seen, log, status) = two_turns(OpenAi::default(), "openai", "gpt-4o", "/v1").await;
    assert_succeeded(&status);
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].body, fixture_json("openai/loop_request1.json"), "first request:\n{}", serde_json::to_string_pretty(&seen[0].body).unwrap());
    assert_eq!(seen[1].body, fixture_json("openai/loop_request2.json"), "second request:\n{}", serde_json::to_string_pretty(&seen[1].body).unwrap());
    let r = responses(&log);
    assert_eq!(r[0].0, Usage { input_tokens: 380, output_tokens: 48, cache_write_tokens: 0, cache_read_tokens: 0 });
    // 380×2.5 + 48×10 = 950 + 480.
    assert_eq!(r[0].1, 1430);
    assert_eq!(r[1].0, Usage { input_tokens: 164, output_tokens: 9, cache_write_tokens: 0, cache_read_tokens: 256 });
    // 164×2.5 + 9×10 + 256×1.25 = 410 + 90 + 320.
    assert_eq!(r[1].1, 820);
}

#[tokio::test]
async fn arguments_that_are_not_json_give_the_model_an_error_result() {
    // The invalid_args fixture, calling the registered `add` tool.
    let stream = String::from_utf8(fixture("openai/invalid_args.sse")).unwrap().replace("get_weather", "add");
    let server = Server::replay(vec![Reply::sse(stream.into_bytes()), Reply::sse(fixture("openai/loop_turn2.sse"))]).await;
    let http = HttpProvider::new(OpenAi::default(), http_client().unwrap(), &server.base, None);
    let mut log: Vec<Event> = Vec::new();
    let (_, status) = agent(Arc::new(http)).run(Uuid::now_v7(), "What is 2 + 40?", config("openai", "gpt-4o"), &mut log).await.unwrap();
    assert_succeeded(&status);
    let (kind, message) = log
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::ToolError { error, message, .. } => Some((*error, message.clone())),
            _ => None,
        })
        .expect("the broken call got an error result");
    assert_eq!(kind, ToolErrorKind::InvalidArguments, "{message}");
    assert!(message.contains("not valid JSON"), "{message}");
    // The second request sends the raw arguments back, paired with the error result.
    let second = &server.seen()[1].body;
    let messages = second["messages"].as_array().unwrap();
    let call = messages.iter().find(|m| m["role"] == "assistant").unwrap();
    assert_eq!(call["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Paris\", unit: celsius}");
    let result = messages.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(result["tool_call_id"], "call_Bad1");
    assert!(result["content"].as_str().unwrap().starts_with("Error: "));
}

#[tokio::test]
async fn invalid_arguments_to_a_registered_tool_are_an_invalid_arguments_error() {
    let mut tools = ToolRegistry::default();
    tools.register(Add);
    let ctx = ToolContext { run_id: Uuid::now_v7(), call_id: "c1".into(), idempotency_key: "k".into() };
    let e = tools.execute("add", Value::String("{\"a\": 2, b: 40}".into()), ctx).await.unwrap_err();
    assert_eq!(e.kind, ToolErrorKind::InvalidArguments);
    assert!(e.message.contains("not valid JSON"), "{}", e.message);
}
