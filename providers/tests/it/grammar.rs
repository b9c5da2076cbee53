//! The stream grammar of both adapters (the tables in `src/anthropic.rs` and
//! `src/openai.rs`): every shape either maps exactly or is a typed
//! `CallError::Malformed` — never dropped, merged or overwritten content.
//! Over HTTP, a malformed answer is retried like a transient failure and,
//! when it persists, becomes `ProviderError::Malformed`.

use glia_agent::provider::{ModelResponse, Provider, ProviderError};
use glia_providers::error::CallError;
use glia_providers::http::{HttpProvider, RetryPolicy, http_client};
use glia_providers::{Anthropic, OpenAi, anthropic, estimate, openai};
use serde_json::{Value, json};
use std::time::Duration;

use crate::common::{Reply, Server, fixture, request};

fn openai(path: &str) -> Result<ModelResponse, CallError> {
    crate::decode_fixture(&format!("openai/{path}"), |s, live| {
        Box::pin(openai::decode_stream(s, live))
    })
    .0
}

fn anthropic(path: &str) -> Result<ModelResponse, CallError> {
    crate::decode_fixture(&format!("anthropic/{path}"), |s, live| {
        Box::pin(anthropic::decode_stream(s, live))
    })
    .0
}

fn calls(r: &ModelResponse) -> Vec<(String, String, Value)> {
    r.message
        .tool_uses()
        .map(|(id, name, input)| (id.to_owned(), name.to_owned(), input.clone()))
        .collect()
}

fn malformed(r: Result<ModelResponse, CallError>, says: &str) {
    match r {
        Err(CallError::Malformed { message }) => {
            assert!(message.contains(says), "{message:?} should say {says:?}")
        }
        other => panic!("expected a malformed answer saying {says:?}, got {other:?}"),
    }
}

// ----- OpenAI-compatible ---------------------------------------------------

#[test]
fn openai_two_calls_sharing_an_index_stay_two_calls() {
    let r = openai("shared_index.sse").unwrap();
    assert_eq!(
        calls(&r),
        vec![
            (
                "call_a".into(),
                "get_order".into(),
                json!({"order_id": "A1"})
            ),
            (
                "call_b".into(),
                "calculator".into(),
                json!({"op": "add", "a": 1, "b": 2})
            ),
        ]
    );
    assert_eq!(r.stop_reason, "tool_use");
}

#[test]
fn openai_out_of_order_indexes_are_routed_and_ordered_by_index() {
    let r = openai("out_of_order.sse").unwrap();
    assert_eq!(
        calls(&r),
        vec![
            (
                "call_W1".into(),
                "get_weather".into(),
                json!({"city": "Paris"})
            ),
            (
                "call_T2".into(),
                "get_time".into(),
                json!({"timezone": "UTC"})
            )
        ]
    );
}

#[test]
fn openai_calls_without_an_index_are_told_apart_by_id() {
    let r = openai("no_index.sse").unwrap();
    assert_eq!(
        calls(&r),
        vec![
            (
                "call_N1".into(),
                "get_weather".into(),
                json!({"city": "Oslo"})
            ),
            (
                "call_N2".into(),
                "get_time".into(),
                json!({"timezone": "CET"})
            )
        ]
    );
}

#[test]
fn openai_legacy_function_call_is_one_call() {
    let stream = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null,\"function_call\":{\"name\":\"get_weather\",\"arguments\":\"\"}}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"function_call\":{\"arguments\":\"{\\\"city\\\": \\\"Rome\\\"}\"}}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"function_call\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let r = futures::executor::block_on(openai::decode_stream(
        crate::common::chunked(stream.as_bytes(), &[]),
        &|_| {},
    ))
    .unwrap();
    let (id, name, input) = calls(&r).remove(0);
    assert!(id.starts_with("call_"), "an id is made up: {id}");
    assert_eq!(
        (name.as_str(), input),
        ("get_weather", json!({"city": "Rome"}))
    );
    assert_eq!(r.stop_reason, "tool_use");
}

#[test]
fn openai_a_length_stop_keeps_the_cut_call_raw_and_says_max_tokens() {
    let r = openai("length_mid_tool.sse").unwrap();
    assert_eq!(r.stop_reason, "max_tokens");
    assert_eq!(
        calls(&r),
        vec![(
            "call_L1".into(),
            "get_order".into(),
            Value::String("{\"order_id\": \"A".into())
        )]
    );
}

#[test]
fn openai_stop_reasons_are_normalised_or_kept_verbatim() {
    assert_eq!(
        openai("content_filter.sse").unwrap().stop_reason,
        "content_filter"
    );
    assert_eq!(openai("refusal.sse").unwrap().stop_reason, "refusal");
    assert_eq!(openai("tools.sse").unwrap().stop_reason, "tool_use");
}

#[test]
fn openai_finish_reason_error_is_a_retryable_failure_not_an_answer() {
    let e = openai("finish_error.sse").unwrap_err();
    assert!(
        matches!(&e, CallError::Server { status: 200, message, .. } if message.contains("finish_reason \"error\"")),
        "{e:?}"
    );
    assert!(e.is_retryable());
}

#[test]
fn openai_shapes_that_cannot_be_mapped_are_malformed() {
    malformed(openai("malformed_orphan_delta.sse"), "no call started");
    malformed(
        openai("malformed_renamed.sse"),
        "renamed from \"get_weather\" to \"get_time\"",
    );
    malformed(
        openai("malformed_id_two_indexes.sse"),
        "\"call_D1\" given at index 1 and at index 0",
    );
    malformed(openai("malformed_two_choices.sse"), "choice 1");
    malformed(
        openai("malformed_tool_calls_without_calls.sse"),
        "no tool call arrived",
    );
}

#[test]
fn openai_usage_that_arrives_late_is_used_not_estimated() {
    let r = openai("usage_late.sse").unwrap();
    assert_eq!(
        (
            r.usage.input_tokens,
            r.usage.cache_read_tokens,
            r.usage.output_tokens,
            r.usage.estimated
        ),
        (239, 15872, 2, false)
    );
}

// ----- Anthropic -----------------------------------------------------------

#[test]
fn anthropic_tool_input_given_whole_at_block_start_is_kept() {
    let r = anthropic("input_in_block_start.sse").unwrap();
    assert_eq!(
        calls(&r),
        vec![(
            "toolu_S1".into(),
            "get_order".into(),
            json!({"order_id": "A1"})
        )]
    );
    // Start input and deltas that agree are one input, not two.
    let r = anthropic("input_at_start_and_same_deltas.sse").unwrap();
    assert_eq!(
        calls(&r),
        vec![(
            "toolu_S2".into(),
            "get_order".into(),
            json!({"order_id": "A1"})
        )]
    );
}

#[test]
fn anthropic_blocks_out_of_order_are_ordered_by_index() {
    let r = anthropic("out_of_order_blocks.sse").unwrap();
    assert_eq!(r.message.text(), "Two lookups.");
    assert!(
        matches!(r.message.content[1], glia_proto::ContentBlock::ToolUse { ref id, .. } if id == "toolu_O1")
    );
}

#[test]
fn anthropic_stop_reasons_are_kept_verbatim() {
    assert_eq!(
        anthropic("pause_turn.sse").unwrap().stop_reason,
        "pause_turn"
    );
    assert_eq!(
        anthropic("context_window.sse").unwrap().stop_reason,
        "model_context_window_exceeded"
    );
}

#[test]
fn anthropic_shapes_that_cannot_be_mapped_are_malformed() {
    malformed(
        anthropic("malformed_repeated_start.sse"),
        "content block 0 started twice",
    );
    malformed(anthropic("malformed_orphan_delta.sse"), "never started");
    malformed(
        anthropic("malformed_delta_kind.sse"),
        "a text_delta for tool_use block",
    );
    malformed(
        anthropic("malformed_start_and_deltas_differ.sse"),
        "at its start and",
    );
    malformed(
        anthropic("malformed_unsupported_block.sse"),
        "server_tool_use",
    );
    malformed(
        anthropic("malformed_no_stop_reason.sse"),
        "without a stop_reason",
    );
    malformed(
        anthropic("malformed_delta_after_stop.sse"),
        "after its content_block_stop",
    );
    let body = json!({"type": "message", "role": "assistant", "content": [{"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}],
        "stop_reason": "end_turn", "usage": {"input_tokens": 5, "output_tokens": 2}});
    malformed(
        anthropic::decode_message(body.to_string().as_bytes()),
        "server_tool_use",
    );
    let body = json!({"type": "message", "role": "assistant", "content": [{"type": "text", "text": "Let me check."}],
        "stop_reason": "tool_use", "usage": {"input_tokens": 5, "output_tokens": 2}});
    malformed(
        anthropic::decode_message(body.to_string().as_bytes()),
        "no tool_use block",
    );
    let call = json!({"type": "tool_use", "id": "toolu_1", "name": "add", "input": {}});
    let body = json!({"type": "message", "role": "assistant", "content": [call, call],
        "stop_reason": "tool_use", "usage": {"input_tokens": 5, "output_tokens": 2}});
    malformed(
        anthropic::decode_message(body.to_string().as_bytes()),
        "share the id",
    );
}

// ----- over HTTP: retried, then typed; usage estimated ---------------------

fn quick() -> RetryPolicy {
    RetryPolicy {
        max_retries: 2,
        min_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(2),
        ..RetryPolicy::default()
    }
}

#[tokio::test]
async fn a_malformed_answer_is_retried_then_fails_typed_for_both_adapters() {
    // Once malformed, then clean: the answer, with the failed attempt listed.
    let server = Server::replay(vec![
        Reply::sse(fixture("openai/malformed_renamed.sse")),
        Reply::sse(fixture("openai/shared_index.sse")),
    ])
    .await;
    let p = HttpProvider::new(
        OpenAi::default(),
        http_client().unwrap(),
        &server.base,
        None,
    )
    .with_retry(quick());
    let r = p.generate(&request("gpt-4o"), &|_| {}).await.unwrap();
    assert_eq!(r.message.tool_uses().count(), 2);
    assert_eq!(
        r.retries
            .iter()
            .map(|x| x.cause.as_str())
            .collect::<Vec<_>>(),
        ["malformed_answer"]
    );
    // Always malformed: a typed error once the retries run out, never an answer.
    let server = Server::start(
        |_, _| Reply::sse(fixture("anthropic/malformed_orphan_delta.sse")),
        None,
    )
    .await;
    let p = HttpProvider::new(
        Anthropic::default(),
        http_client().unwrap(),
        &server.base,
        None,
    )
    .with_retry(quick());
    let e = p
        .generate(&request("claude-sonnet-4-5"), &|_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ProviderError::Malformed(m) if m.contains("never started")),
        "{e:?}"
    );
    assert!(
        !e.is_transient(),
        "the run fails with the reason instead of retrying forever"
    );
    assert_eq!(server.seen().len(), 3, "the first attempt and two retries");
}

#[tokio::test]
async fn usage_is_requested_and_estimated_when_none_arrives() {
    let server = Server::replay(vec![
        Reply::sse(fixture("openai/no_usage_tools.sse")),
        Reply::sse(fixture("anthropic/no_usage.sse")),
    ])
    .await;
    let mut req = request("llama3");
    let r = HttpProvider::new(
        OpenAi::default(),
        http_client().unwrap(),
        &server.base,
        None,
    )
    .generate(&req, &|_| {})
    .await
    .unwrap();
    assert_eq!(
        server.seen()[0].body["stream_options"],
        json!({"include_usage": true})
    );
    assert!(r.usage.estimated);
    // "word " × 400 and the call, at a conservative 3 bytes a token for a model with no known tokenizer.
    assert!(r.usage.output_tokens >= 2000 / 3, "{:?}", r.usage);
    assert_eq!(
        r.usage.output_tokens,
        estimate::output_tokens("llama3", &r.message)
    );
    assert_eq!(r.usage.input_tokens, estimate::input_tokens(&req));
    req.model = "claude-sonnet-4-5".into();
    let r = HttpProvider::new(
        Anthropic::default(),
        http_client().unwrap(),
        &server.base,
        None,
    )
    .generate(&req, &|_| {})
    .await
    .unwrap();
    assert!(
        r.usage.estimated && r.usage.output_tokens >= 1500 / 3 && r.usage.input_tokens > 0,
        "{:?}",
        r.usage
    );
}

#[test]
fn openai_models_are_counted_with_their_tokenizer() {
    assert_eq!(estimate::method("gpt-4o"), "tiktoken:o200k_base");
    assert_eq!(estimate::method("gpt-4-0613"), "tiktoken:cl100k_base");
    assert_eq!(estimate::method("llama3"), "bytes/3");
    // "word " × 400 is about 400 tokens for o200k_base, 667 at bytes/3.
    let text = "word ".repeat(400);
    let real = estimate::tokens("gpt-4o", &text);
    assert!((380..=420).contains(&real), "{real}");
    assert_eq!(estimate::tokens("llama3", &text), 667);
}

/// An image in a tool result counts as `IMAGE_TOKENS`, not as its base64
/// text: a 1 MiB image would otherwise count about 350,000 tokens.
#[test]
fn an_image_counts_as_image_tokens_not_as_its_base64() {
    use glia_proto::{ContentBlock, ImageSource, Message, ResultBlock, Role, ToolContent};
    let result = |content: ToolContent| {
        let mut req = request("llama3");
        req.messages.push(Message {
            role: Role::Assistant,
            content: vec![ContentBlock::ToolUse {
                id: "t1".into(),
                name: "shot".into(),
                input: json!({}),
            }],
        });
        req.messages.push(Message {
            role: Role::User,
            content: vec![ContentBlock::ToolResult {
                tool_use_id: "t1".into(),
                content,
                is_error: false,
            }],
        });
        estimate::input_tokens(&req)
    };
    let text = result(ToolContent::Text("The page:".into()));
    let big = format!("iVBORw0KGgoA{}", "AAAA".repeat(256 * 1024));
    let with_image = result(ToolContent::Blocks(vec![
        ResultBlock::text("The page:"),
        ResultBlock::Image {
            source: ImageSource::base64("image/png", big),
        },
    ]));
    assert_eq!(with_image, text + estimate::IMAGE_TOKENS);
}
