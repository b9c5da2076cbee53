use glia_agent::provider::{ModelResponse, ProviderError, ToolChoice};
use glia_proto::{ContentBlock, Message, Role};
use glia_providers::error::CallError;
use glia_providers::http::{HttpProvider, RetryPolicy, Wire, http_client};
use glia_providers::openai::{self, MaxTokensField};
use glia_providers::{ApiKey, OpenAi};
use serde_json::{Value, json};

use crate::common::{Deltas, Reply, Server, fixture, request};

fn decode(path: &str) -> (Result<ModelResponse, CallError>, Deltas) {
    crate::decode_fixture(&format!("openai/{path}"), |s, live| {
        Box::pin(openai::decode_stream(s, live))
    })
}

fn usage(i: u64, o: u64, w: u64, r: u64) -> glia_proto::Usage {
    glia_proto::Usage {
        input_tokens: i,
        output_tokens: o,
        cache_write_tokens: w,
        cache_read_tokens: r,
        estimated: false,
    }
}

fn calls(r: &ModelResponse) -> Vec<(String, String, Value)> {
    r.message
        .tool_uses()
        .map(|(id, name, input)| (id.to_owned(), name.to_owned(), input.clone()))
        .collect()
}

#[test]
fn text_then_tool_call_with_usage_from_the_final_chunk() {
    let (r, deltas) = decode("tools.sse");
    let r = r.unwrap();
    assert_eq!(r.message.text(), "Let me look up that order.");
    assert_eq!(
        calls(&r),
        vec![(
            "call_Lk1".into(),
            "lookup_order".into(),
            json!({"order_id": "A1", "include_items": true})
        )]
    );
    assert_eq!(r.stop_reason, "tool_use");
    // prompt_tokens 2302 of which 1792 cached: cached tokens are cache reads, not input.
    assert_eq!(r.usage, usage(510, 61, 0, 1792));
    assert_eq!(deltas.joined("text"), "Let me look up that order.");
    assert_eq!(deltas.of("tool_call"), ["lookup_order"]);
}

#[test]
fn parallel_calls_are_assembled_by_index() {
    let (r, deltas) = decode("parallel_tools.sse");
    let r = r.unwrap();
    // An answer of tool calls only streams too: each call's name as it
    // begins, the first of them its first delta (time to first token).
    assert_eq!(
        deltas.first(),
        Some(("tool_call".into(), "get_weather".into()))
    );
    assert_eq!(deltas.of("tool_call"), ["get_weather", "get_time"]);
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
                json!({"timezone": "Europe/Paris"})
            ),
        ]
    );
    assert_eq!(
        r.message.content.len(),
        2,
        "no text block: content was null"
    );
}

#[test]
fn multibyte_text_and_arguments_decode_exactly() {
    let r = decode("multibyte.sse").0.unwrap();
    assert_eq!(r.message.text(), "東京の天気は晴れ ☀️ — 気温 21°C 🎉");
    assert_eq!(calls(&r)[0].2, json!({"text": "東京 🗼 café ✓"}));
}

#[test]
fn quirk_arguments_in_the_same_chunk_as_id_and_name() {
    let r = decode("quirk_same_chunk.sse").0.unwrap();
    assert_eq!(
        calls(&r),
        vec![(
            "call_Same1".into(),
            "get_weather".into(),
            json!({"city": "Paris"})
        )]
    );
    assert_eq!(
        r.stop_reason, "tool_use",
        "finish_reason stop with tool calls is a tool turn"
    );
}

#[test]
fn quirk_placeholder_object_then_the_real_one() {
    let r = decode("quirk_placeholder.sse").0.unwrap();
    assert_eq!(
        calls(&r),
        vec![(
            "call_Ph1".into(),
            "get_weather".into(),
            json!({"city": "Paris", "unit": "celsius"})
        )]
    );
}

#[test]
fn quirk_cumulative_arguments() {
    let r = decode("quirk_cumulative.sse").0.unwrap();
    assert_eq!(
        calls(&r),
        vec![(
            "call_Cu1".into(),
            "get_weather".into(),
            json!({"city": "Paris"})
        )]
    );
}

#[test]
fn quirk_empty_string_id_and_name_on_continuations() {
    let r = decode("quirk_empty_id.sse").0.unwrap();
    assert_eq!(
        calls(&r),
        vec![
            (
                "call_Em1".into(),
                "get_weather".into(),
                json!({"city": "Paris"})
            ),
            (
                "call_Em2".into(),
                "get_time".into(),
                json!({"timezone": "UTC"})
            )
        ]
    );
}

#[test]
fn arguments_that_are_not_json_stay_raw_never_empty_object() {
    let r = decode("invalid_args.sse").0.unwrap();
    let (id, name, input) = calls(&r).remove(0);
    assert_eq!((id.as_str(), name.as_str()), ("call_Bad1", "get_weather"));
    assert_eq!(
        input,
        Value::String("{\"city\": \"Paris\", unit: celsius}".into())
    );
    assert_ne!(input, json!({}));
}

#[test]
fn error_objects_inside_the_stream() {
    let e = decode("error_in_stream.sse").0.unwrap_err();
    assert!(matches!(e, CallError::Server { status: 200, .. }), "{e:?}");
    assert!(e.is_retryable());
    let e = decode("error_in_stream_vllm.sse").0.unwrap_err();
    assert!(
        matches!(e, CallError::InvalidRequest { status: 400, .. }),
        "{e:?}"
    );
}

#[test]
fn reasoning_content_is_thinking() {
    let (r, deltas) = decode("reasoning.sse");
    let r = r.unwrap();
    assert_eq!(
        r.message.content[0],
        ContentBlock::Thinking {
            thinking: "27*453: 27*400=10800, 27*53=1431, sum 12231.".into(),
            signature: String::new()
        }
    );
    assert_eq!(r.message.text(), "27 × 453 = 12,231.");
    assert_eq!(
        deltas.joined("thinking"),
        "27*453: 27*400=10800, 27*53=1431, sum 12231."
    );
}

#[test]
fn cut_refusal_and_missing_usage() {
    assert!(matches!(
        decode("cut.sse").0.unwrap_err(),
        CallError::StreamCut { .. }
    ));
    let r = decode("refusal.sse").0.unwrap();
    assert_eq!(
        (r.stop_reason.as_str(), r.message.text().as_str()),
        ("refusal", "I'm sorry, I can't help with that.")
    );
    let r = decode("no_usage.sse").0.unwrap();
    // No usage in the stream: marked estimated with its counts left for the engine to fill.
    assert_eq!(
        (r.stop_reason.as_str(), r.usage),
        (
            "max_tokens",
            glia_proto::Usage {
                estimated: true,
                ..usage(0, 0, 0, 0)
            }
        )
    );
}

#[test]
fn non_streaming_completion_decodes() {
    let r = openai::decode_completion(&fixture("openai/completion.json")).unwrap();
    assert_eq!(r.message.text(), "Checking.");
    assert_eq!(
        calls(&r),
        vec![(
            "call_B1".into(),
            "lookup_order".into(),
            json!({"order_id": "A1"})
        )]
    );
    assert_eq!(r.usage, usage(120, 30, 0, 2048));
}

#[test]
fn request_body_maps_tool_results_to_tool_messages() {
    let mut req = request("gpt-4o");
    req.messages = vec![
        Message::user("Where is order A1?"),
        Message {
            role: Role::Assistant,
            content: vec![
                ContentBlock::Thinking {
                    thinking: "hidden".into(),
                    signature: String::new(),
                },
                ContentBlock::text("Looking."),
                ContentBlock::ToolUse {
                    id: "call_1".into(),
                    name: "lookup_order".into(),
                    input: json!({"order_id": "A1"}),
                },
                ContentBlock::ToolUse {
                    id: "call_2".into(),
                    name: "lookup_order".into(),
                    input: Value::String("{bad".into()),
                },
            ],
        },
        Message {
            role: Role::User,
            content: vec![
                ContentBlock::ToolResult {
                    tool_use_id: "call_1".into(),
                    content: "{\"status\":\"shipped\"}".into(),
                    is_error: false,
                },
                ContentBlock::ToolResult {
                    tool_use_id: "call_2".into(),
                    content: "invalid arguments".into(),
                    is_error: true,
                },
                ContentBlock::text("Thanks"),
            ],
        },
    ];
    req.tool_choice = ToolChoice::Tool {
        name: "lookup_order".into(),
    };
    let wire = OpenAi {
        max_tokens_field: MaxTokensField::MaxCompletionTokens,
        include_usage: true,
    };
    assert_eq!(
        wire.body(&req, true),
        json!({
            "model": "gpt-4o",
            "messages": [
                {"role": "system", "content": "You are a support agent."},
                {"role": "user", "content": "Where is order A1?"},
                {"role": "assistant", "content": "Looking.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "lookup_order", "arguments": "{\"order_id\":\"A1\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "lookup_order", "arguments": "{bad"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"status\":\"shipped\"}"},
                {"role": "tool", "tool_call_id": "call_2", "content": "Error: invalid arguments"},
                {"role": "user", "content": "Thanks"}
            ],
            "max_completion_tokens": 1024,
            "tools": [{"type": "function", "function": {"name": "lookup_order", "description": "The lookup_order tool.",
                       "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}],
            "tool_choice": {"type": "function", "function": {"name": "lookup_order"}},
            "stream": true,
            "stream_options": {"include_usage": true}
        })
    );
}

fn provider(server: &Server, key: Option<ApiKey>) -> HttpProvider<OpenAi> {
    HttpProvider::new(
        OpenAi::default(),
        http_client().unwrap(),
        &format!("{}/v1", server.base),
        key,
    )
    .with_retry(RetryPolicy {
        max_retries: 0,
        ..RetryPolicy::default()
    })
}

#[tokio::test]
async fn streams_over_http_with_bearer_auth_or_none() {
    let server = Server::replay(vec![
        Reply::sse(fixture("openai/parallel_tools.sse")),
        Reply::sse(fixture("openai/tools.sse")),
    ])
    .await;
    let r = provider(&server, Some(ApiKey::new("sk-proj-test-123456")))
        .call(&request("gpt-4o"), &|_| {})
        .await
        .unwrap();
    assert_eq!(calls(&r).len(), 2);
    let r = provider(&server, None)
        .call(&request("gpt-4o"), &|_| {})
        .await
        .unwrap();
    assert_eq!(calls(&r).len(), 1);
    let seen = server.seen();
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(
        seen[0].header("authorization"),
        Some("Bearer sk-proj-test-123456")
    );
    assert_eq!(
        seen[1].header("authorization"),
        None,
        "a keyless local server gets no auth header"
    );
}

#[tokio::test]
async fn a_json_answer_to_a_stream_request_is_still_read() {
    // Some compatible servers ignore "stream": true.
    let server = Server::replay(vec![Reply::json(200, fixture("openai/completion.json"))]).await;
    let r = provider(&server, None)
        .call(&request("gpt-4o"), &|_| {})
        .await
        .unwrap();
    assert_eq!(r.message.text(), "Checking.");
}

#[tokio::test]
async fn each_http_error_kind_is_classified() {
    let cases: Vec<(&str, u16, &str)> = vec![
        ("error_400.json", 400, "invalid_request"),
        ("error_401.json", 401, "auth"),
        ("error_403.json", 403, "auth"),
        ("error_404.json", 404, "invalid_request"),
        ("error_429.json", 429, "rate_limited"),
        ("error_429_quota.json", 429, "spend_cap"),
        ("error_500.json", 500, "server"),
        ("error_503.json", 503, "overloaded"),
    ];
    for (file, status, kind) in cases {
        let server = Server::replay(vec![Reply::json(
            status,
            fixture(&format!("openai/{file}")),
        )])
        .await;
        let e = provider(&server, None)
            .call(&request("gpt-4o"), &|_| {})
            .await
            .unwrap_err();
        assert_eq!(e.kind(), kind, "{file}: {e:?}");
        if kind == "spend_cap" {
            assert!(
                matches!(ProviderError::from(e), ProviderError::SpendCap(m) if m.contains("quota"))
            );
        }
    }
}

/// A tool message takes text only: the images of a turn's results go in
/// the user message after its tool messages, as `image_url` parts with
/// `data:` URLs, before the turn's own text. Checked on the body the local
/// server received.
#[tokio::test]
async fn tool_result_images_follow_in_a_user_message_as_data_urls() {
    use glia_proto::{ImageSource, ResultBlock, ToolContent};
    let server = Server::replay(vec![Reply::json(200, fixture("openai/completion.json"))]).await;
    let mut req = request("gpt-4o");
    req.messages.push(Message {
        role: Role::Assistant,
        content: vec![
            ContentBlock::ToolUse {
                id: "call_1".into(),
                name: "screenshot".into(),
                input: json!({}),
            },
            ContentBlock::ToolUse {
                id: "call_2".into(),
                name: "lookup_order".into(),
                input: json!({"order_id": "A1"}),
            },
        ],
    });
    let png = || ResultBlock::Image {
        source: ImageSource::base64("image/png", "iVBORw0KGgo="),
    };
    let jpeg = ResultBlock::Image {
        source: ImageSource::base64("image/jpeg", "/9j/4AAQ"),
    };
    req.messages.push(Message {
        role: Role::User,
        content: vec![
            ContentBlock::ToolResult {
                tool_use_id: "call_1".into(),
                content: ToolContent::Blocks(vec![ResultBlock::text("Two pages:"), png(), jpeg]),
                is_error: false,
            },
            ContentBlock::ToolResult {
                tool_use_id: "call_2".into(),
                content: ToolContent::Blocks(vec![png()]),
                is_error: true,
            },
            ContentBlock::text("Which one?"),
        ],
    });
    glia_proto::repair::validate(&req.messages).expect("a valid request");
    provider(&server, None).call(&req, &|_| {}).await.unwrap();
    let messages = server.seen()[0].body["messages"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(
        messages[3..],
        [
            json!({"role": "tool", "tool_call_id": "call_1", "content": "Two pages:\n[image: image/png, 8 bytes]\n[image: image/jpeg, 6 bytes]"}),
            json!({"role": "tool", "tool_call_id": "call_2", "content": "Error: [image: image/png, 8 bytes]"}),
            json!({"role": "user", "content": [
                {"type": "text", "text": "Images returned by tool call call_1:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQ"}},
                {"type": "text", "text": "Images returned by tool call call_2:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "text", "text": "Which one?"}
            ]}),
        ]
    );
}
