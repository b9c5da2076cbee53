//! Tool arguments are checked for every tool, external ones included, with
//! both adapters against a local server: arguments that are not JSON, and
//! JSON that breaks the tool's schema, become an `invalid_arguments` error
//! result the model sees (in the next request) and can correct; the run
//! never parks at `awaiting_tool` with them. The corrected call is handed to
//! the client.

use crate::common;

use std::sync::Arc;

use common::{Reply, Server};
use glia_agent::{Agent, FixedClock};
use glia_proto::{
    Disposition, Event, EventKind, PullPoint, RunConfig, Status, ToolErrorKind, ToolSpec,
};
use glia_providers::http::{HttpProvider, http_client};
use glia_providers::{Anthropic, ApiKey, OpenAi, Wire};
use serde_json::{Value, json};
use uuid::Uuid;

/// The three argument texts the model sends, in turn: not JSON (a stray
/// closing brace), JSON against the schema, then valid.
const MALFORMED: &str = r#"{"ticker": "MSFT"}}"#;
const AGAINST_SCHEMA: &str = r#"{"ticker": 5, "extra": true}"#;
const VALID: &str = r#"{"ticker": "MSFT"}"#;

fn config() -> RunConfig {
    let schema = json!({"type": "object", "properties": {"ticker": {"type": "string"}}, "required": ["ticker"], "additionalProperties": false});
    let spec = ToolSpec {
        external: true,
        ..ToolSpec::new("get_stock", "The stock price of a ticker.", schema)
    };
    RunConfig {
        model: "m".into(),
        external_tools: vec![spec],
        max_tokens: 256,
        ..RunConfig::default()
    }
}

/// An OpenAI Chat Completions stream calling `get_stock` with `arguments`, sent in two pieces.
fn openai_turn(n: usize, arguments: &str) -> Vec<u8> {
    let (head, tail) = arguments.split_at(arguments.len() / 2);
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": format!("c{n}"), "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let first = json!({"role": "assistant", "tool_calls": [{"index": 0, "id": format!("call_{n}"), "type": "function", "function": {"name": "get_stock", "arguments": head}}]});
    let rest = json!({"tool_calls": [{"index": 0, "function": {"arguments": tail}}]});
    let usage = json!({"id": format!("c{n}"), "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29}});
    format!(
        "{}{}{}data: {usage}\n\ndata: [DONE]\n\n",
        chunk(first, Value::Null),
        chunk(rest, Value::Null),
        chunk(json!({}), json!("tool_calls"))
    )
    .into_bytes()
}

/// An Anthropic Messages stream calling `get_stock` with `arguments`, sent in two `input_json_delta`s.
fn anthropic_turn(n: usize, arguments: &str) -> Vec<u8> {
    let (head, tail) = arguments.split_at(arguments.len() / 2);
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let delta = |piece: &str| {
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": piece}}),
        )
    };
    [
        event("message_start", json!({"type": "message_start", "message": {"id": format!("msg_{n}"), "type": "message", "role": "assistant", "model": "m", "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 20, "output_tokens": 1}}})),
        event("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": format!("toolu_{n}"), "name": "get_stock", "input": {}}})),
        delta(head),
        delta(tail),
        event("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
        event("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 9}})),
        event("message_stop", json!({"type": "message_stop"})),
    ]
    .concat()
    .into_bytes()
}

async fn run<W: Wire>(
    wire: W,
    suffix: &str,
    turn: fn(usize, &str) -> Vec<u8>,
) -> (Vec<common::Seen>, Vec<Event>, Status) {
    let replies = [MALFORMED, AGAINST_SCHEMA, VALID]
        .iter()
        .enumerate()
        .map(|(n, args)| Reply::sse(turn(n + 1, args)))
        .collect();
    let server = Server::replay(replies).await;
    let http = HttpProvider::new(
        wire,
        http_client().unwrap(),
        &format!("{}{suffix}", server.base),
        Some(ApiKey::new("sk-test")),
    );
    let agent = Agent::new(Arc::new(http)).with_clock(FixedClock(chrono::DateTime::UNIX_EPOCH));
    let mut log = Vec::new();
    let (_, status) = agent
        .run(
            Uuid::now_v7(),
            "What does MSFT trade at?",
            config(),
            &mut log,
        )
        .await
        .unwrap();
    (server.seen(), log, status)
}

fn check(seen: &[common::Seen], log: &[Event], status: &Status, ids: [&str; 3]) {
    // Two refusals, decided before anyone could act on them; the third call waits for the client.
    let calls: Vec<(&str, &Disposition, &Value)> = log
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCall(c) => Some((c.call_id.as_str(), &c.disposition, &c.input)),
            _ => None,
        })
        .collect();
    assert_eq!(calls.len(), 3, "{calls:?}");
    for (call_id, disposition, _) in &calls[..2] {
        assert!(
            matches!(
                disposition,
                Disposition::Refused {
                    error: ToolErrorKind::InvalidArguments,
                    ..
                }
            ),
            "{call_id}: {disposition:?}"
        );
    }
    assert_eq!(
        (calls[2].0, calls[2].1, calls[2].2),
        (ids[2], &Disposition::External, &json!({"ticker": "MSFT"}))
    );
    let errors: Vec<(&str, ToolErrorKind, &str)> = log
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolError {
                call_id,
                error,
                message,
                ..
            } => Some((call_id.as_str(), *error, message.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert_eq!(
        (errors[0].0, errors[0].1),
        (ids[0], ToolErrorKind::InvalidArguments)
    );
    assert!(
        errors[0].2.contains("not valid JSON") && errors[0].2.contains("Call get_stock again"),
        "{}",
        errors[0].2
    );
    assert_eq!(
        (errors[1].0, errors[1].1),
        (ids[1], ToolErrorKind::InvalidArguments)
    );
    assert!(
        errors[1].2.contains(r#"5 is not of type "string""#) && errors[1].2.contains("extra"),
        "{}",
        errors[1].2
    );
    // Parked once, for the valid call only.
    let pauses: Vec<&PullPoint> = log
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::SessionPause { pull_point } => Some(pull_point),
            _ => None,
        })
        .collect();
    assert_eq!(
        pauses,
        [&PullPoint::AwaitingTool {
            call_ids: vec![ids[2].to_owned()]
        }]
    );
    assert_eq!(
        *status,
        Status::Parked(PullPoint::AwaitingTool {
            call_ids: vec![ids[2].to_owned()]
        })
    );
    // The model saw each error in its next request.
    assert_eq!(seen.len(), 3);
    for (request, (_, _, message)) in seen[1..].iter().zip(&errors) {
        let body = request.body.to_string();
        let quoted = serde_json::to_string(message).unwrap();
        assert!(
            body.contains(&quoted[1..quoted.len() - 1]),
            "the error result is in the next request: {body}"
        );
    }
}

#[tokio::test]
async fn openai_invalid_arguments_to_an_external_tool_are_an_error_the_model_sees() {
    let (seen, log, status) = run(OpenAi::default(), "/v1", openai_turn).await;
    check(&seen, &log, &status, ["call_1", "call_2", "call_3"]);
}

#[tokio::test]
async fn anthropic_invalid_arguments_to_an_external_tool_are_an_error_the_model_sees() {
    let (seen, log, status) = run(Anthropic::default(), "", anthropic_turn).await;
    check(&seen, &log, &status, ["toolu_1", "toolu_2", "toolu_3"]);
}
