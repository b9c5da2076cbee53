use glia_agent::provider::{ModelResponse, Provider, ProviderError, ToolChoice};
use glia_proto::{ContentBlock, Role};
use glia_providers::error::CallError;
use glia_providers::http::{HttpProvider, RetryPolicy, Wire, http_client};
use glia_providers::{Anthropic, ApiKey, anthropic};
use serde_json::json;

use crate::common::{Deltas, Reply, Server, fixture, request};

fn decode(path: &str) -> (Result<ModelResponse, CallError>, Deltas) {
    crate::decode_fixture(&format!("anthropic/{path}"), |s, live| {
        Box::pin(anthropic::decode_stream(s, live))
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

#[test]
fn text_and_tool_use_assemble_from_partial_json() {
    let (r, deltas) = decode("tools.sse");
    let r = r.unwrap();
    assert_eq!(r.message.role, Role::Assistant);
    assert_eq!(
        r.message.content,
        vec![
            ContentBlock::text("Let me look up that order."),
            ContentBlock::ToolUse {
                id: "toolu_01Lookup".into(),
                name: "lookup_order".into(),
                input: json!({"order_id": "A1", "include_items": true})
            },
        ]
    );
    assert_eq!(r.stop_reason, "tool_use");
    // Input and cache tokens from message_start, output from message_delta.
    assert_eq!(r.usage, usage(472, 61, 1830, 0));
    assert_eq!(deltas.joined("text"), "Let me look up that order.");
    assert_eq!(deltas.of("tool_call"), ["lookup_order"]);
}

#[test]
fn parallel_tool_uses_keep_their_order() {
    let (r, deltas) = decode("parallel_tools.sse");
    let r = r.unwrap();
    // An answer of tool calls only streams too: each call's name as it
    // begins, the first of them its first delta (time to first token).
    assert_eq!(
        deltas.first(),
        Some(("tool_call".into(), "get_weather".into()))
    );
    assert_eq!(deltas.of("tool_call"), ["get_weather", "get_time"]);
    let calls: Vec<_> = r
        .message
        .tool_uses()
        .map(|(id, name, input)| (id.to_owned(), name.to_owned(), input.clone()))
        .collect();
    assert_eq!(
        calls,
        vec![
            (
                "toolu_01Weather".into(),
                "get_weather".into(),
                json!({"city": "Paris"})
            ),
            (
                "toolu_02Time".into(),
                "get_time".into(),
                json!({"timezone": "Europe/Paris"})
            ),
        ]
    );
    assert_eq!(r.usage, usage(610, 88, 0, 1830));
}

#[test]
fn thinking_with_signature_and_usage_counted_once() {
    let (r, deltas) = decode("thinking.sse");
    let r = r.unwrap();
    assert_eq!(
        r.message.content[0],
        ContentBlock::Thinking {
            thinking: "The user asks 27 * 453. 27*453 = 12231.".into(),
            signature: "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds".into()
        }
    );
    assert_eq!(r.message.text(), "27 × 453 = 12,231.");
    // message_delta repeats the input counts: replaced, not added.
    assert_eq!(r.usage, usage(90, 142, 0, 0));
    assert_eq!(
        deltas.joined("thinking"),
        "The user asks 27 * 453. 27*453 = 12231."
    );
}

#[test]
fn redacted_thinking_is_kept_whole() {
    let (r, deltas) = decode("redacted_thinking.sse");
    let r = r.unwrap();
    assert!(
        matches!(&r.message.content[0], ContentBlock::Thinking { thinking, .. } if thinking == "I should look the order up first.")
    );
    assert_eq!(
        r.message.content[1],
        ContentBlock::RedactedThinking { data: "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpPkNRj2YfWXGmKDxH4mPnZ5sQ7vB5URj2pWmRiRVvXyzETZA0gHmrCIkFtnXCg".into() }
    );
    assert_eq!(
        r.message.content[2],
        ContentBlock::ToolUse {
            id: "toolu_01Redacted".into(),
            name: "lookup_order".into(),
            input: json!({"order_id": "A1"})
        }
    );
    assert_eq!(r.usage, usage(210, 95, 0, 0));
    // Nothing of the redacted block is streamed.
    assert_eq!(
        deltas.joined("thinking"),
        "I should look the order up first."
    );
    // Non-streaming answers carry it too.
    let body = json!({"type": "message", "role": "assistant", "content": [{"type": "redacted_thinking", "data": "opaque=="}, {"type": "text", "text": "Hi."}],
        "stop_reason": "end_turn", "usage": {"input_tokens": 5, "output_tokens": 2}});
    let r = anthropic::decode_message(body.to_string().as_bytes()).unwrap();
    assert_eq!(
        r.message.content,
        vec![
            ContentBlock::RedactedThinking {
                data: "opaque==".into()
            },
            ContentBlock::text("Hi.")
        ]
    );
}

#[test]
fn redacted_thinking_is_sent_back_with_the_last_assistant_turn() {
    let turn = decode("redacted_thinking.sse").0.unwrap().message;
    let mut req = request("claude-sonnet-4-5");
    req.messages.push(turn);
    req.messages.push(glia_proto::Message {
        role: Role::User,
        content: vec![ContentBlock::ToolResult {
            tool_use_id: "toolu_01Redacted".into(),
            content: "{\"status\": \"shipped\"}".into(),
            is_error: false,
        }],
    });
    glia_proto::repair::validate(&req.messages).unwrap();
    let body = Anthropic::default().body(&req, true);
    let assistant = &body["messages"][1]["content"];
    assert_eq!(assistant[0]["type"], "thinking");
    assert_eq!(
        assistant[1],
        json!({"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpPkNRj2YfWXGmKDxH4mPnZ5sQ7vB5URj2pWmRiRVvXyzETZA0gHmrCIkFtnXCg"})
    );
    assert_eq!(assistant[2]["type"], "tool_use");
    // The cache breakpoint stays on the last block of the conversation.
    assert_eq!(
        body["messages"][2]["content"][0]["cache_control"],
        json!({"type": "ephemeral"})
    );
    // A redacted block is never the one that carries a breakpoint.
    let mut only = request("claude-sonnet-4-5");
    only.messages = vec![glia_proto::Message {
        role: Role::Assistant,
        content: vec![ContentBlock::RedactedThinking { data: "x".into() }],
    }];
    let body = Anthropic::default().body(&only, false);
    assert!(
        body["messages"][0]["content"][0]
            .get("cache_control")
            .is_none()
    );
}

#[test]
fn multibyte_text_and_tool_input_decode_exactly() {
    let r = decode("multibyte.sse").0.unwrap();
    assert_eq!(r.message.text(), "東京の天気は晴れ ☀️ — 気温 21°C 🎉");
    let (_, _, input) = r.message.tool_uses().next().unwrap();
    assert_eq!(input, &json!({"text": "東京 🗼 café ✓"}));
    assert!(!serde_json::to_string(&r).unwrap().contains('\u{FFFD}'));
}

#[test]
fn max_tokens_inside_a_tool_input_keeps_the_cut_call_raw() {
    // Nothing is dropped: the cut call stays, raw, and the stop reason tells
    // the loop to reject the whole answer (glia_proto::stop).
    let r = decode("max_tokens_mid_tool.sse").0.unwrap();
    assert_eq!(r.stop_reason, "max_tokens");
    assert_eq!(
        r.message.content[0],
        ContentBlock::text("I will write the file.")
    );
    let (id, name, input) = r.message.tool_uses().next().unwrap();
    assert_eq!((id, name), ("toolu_01Write", "write_file"));
    assert!(
        matches!(input, serde_json::Value::String(raw) if raw.starts_with("{\"path\": \"notes.txt\"")),
        "{input:?}"
    );
}

#[test]
fn refusal_is_a_stop_reason() {
    let r = decode("refusal.sse").0.unwrap();
    assert_eq!(r.stop_reason, "refusal");
    assert_eq!(r.message.text(), "I can't help with that.");
}

#[test]
fn error_event_after_200_is_retryable_overload() {
    let e = decode("error_after_200.sse").0.unwrap_err();
    assert!(
        matches!(e, CallError::Overloaded { status: 200, .. }),
        "{e:?}"
    );
    assert!(e.is_retryable());
}

#[test]
fn a_cut_stream_is_never_complete() {
    let e = decode("cut.sse").0.unwrap_err();
    assert!(matches!(e, CallError::StreamCut { .. }), "{e:?}");
}

#[test]
fn unknown_events_and_fields_and_crlf_are_fine() {
    // tools.sse carries a `future_event` and extra fields; crlf.sse uses CRLF line ends.
    assert!(decode("tools.sse").0.is_ok());
    assert_eq!(
        decode("crlf.sse").0.unwrap().message.text(),
        "Line endings are CRLF."
    );
}

#[test]
fn non_streaming_message_decodes() {
    let r = anthropic::decode_message(&fixture("anthropic/message.json")).unwrap();
    assert_eq!(
        r.message.content,
        vec![
            ContentBlock::Thinking {
                thinking: "Need the order.".into(),
                signature: "sig-abc".into()
            },
            ContentBlock::text("Checking."),
            ContentBlock::ToolUse {
                id: "toolu_01B".into(),
                name: "lookup_order".into(),
                input: json!({"order_id": "A1"})
            },
        ]
    );
    assert_eq!(r.usage, usage(120, 30, 0, 2048));
}

#[test]
fn request_body_has_cache_breakpoints_on_the_stable_prefix() {
    let wire = Anthropic {
        thinking_budget: Some(2048),
        ..Anthropic::default()
    };
    let body = wire.body(&request("claude-sonnet-4-5"), true);
    assert_eq!(
        body,
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "system": [{"type": "text", "text": "You are a support agent.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Where is order A1?", "cache_control": {"type": "ephemeral"}}]}],
            "tools": [{"name": "lookup_order", "description": "The lookup_order tool.",
                       "input_schema": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
                       "cache_control": {"type": "ephemeral"}}],
            "tool_choice": {"type": "auto"},
            "stream": true
        }),
        "thinking needs max_tokens above its budget; 1024 leaves no room"
    );
    let mut bigger = request("claude-sonnet-4-5");
    bigger.max_tokens = 8000;
    assert_eq!(
        wire.body(&bigger, false)["thinking"],
        json!({"type": "enabled", "budget_tokens": 2048})
    );
    bigger.tool_choice = ToolChoice::Tool {
        name: "lookup_order".into(),
    };
    let forced = wire.body(&bigger, false);
    assert_eq!(
        forced["tool_choice"],
        json!({"type": "tool", "name": "lookup_order"})
    );
    assert!(
        forced.get("thinking").is_none(),
        "forced tool use cannot think"
    );
    assert!(forced.get("stream").is_none());
}

fn provider(server: &Server) -> HttpProvider<Anthropic> {
    HttpProvider::new(
        Anthropic::default(),
        http_client().unwrap(),
        &server.base,
        Some(ApiKey::new("sk-ant-test-0123456789")),
    )
    .with_retry(RetryPolicy {
        max_retries: 0,
        ..RetryPolicy::default()
    })
}

#[tokio::test]
async fn streams_over_http_with_auth_and_version_headers() {
    let server = Server::replay(vec![Reply::sse(fixture("anthropic/multibyte.sse"))]).await;
    let deltas = Deltas::default();
    let r = provider(&server)
        .generate(&request("claude-sonnet-4-5"), &|e| deltas.push(e))
        .await
        .unwrap();
    assert_eq!(r.message.text(), "東京の天気は晴れ ☀️ — 気温 21°C 🎉");
    assert_eq!(deltas.joined("text"), "東京の天気は晴れ ☀️ — 気温 21°C 🎉");
    let seen = &server.seen()[0];
    assert_eq!(seen.path, "/v1/messages");
    assert_eq!(seen.header("x-api-key"), Some("sk-ant-test-0123456789"));
    assert_eq!(seen.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(seen.body["stream"], json!(true));
}

#[tokio::test]
async fn non_streaming_over_http() {
    let server = Server::replay(vec![Reply::json(200, fixture("anthropic/message.json"))]).await;
    let r = provider(&server)
        .streaming(false)
        .generate(&request("claude-sonnet-4-5"), &|_| {})
        .await
        .unwrap();
    assert_eq!(r.stop_reason, "tool_use");
    assert!(server.seen()[0].body.get("stream").is_none());
}

#[tokio::test]
async fn each_http_error_kind_is_classified() {
    type Case = (
        u16,
        &'static str,
        fn(&CallError) -> bool,
        fn(&ProviderError) -> bool,
    );
    let cases: Vec<Case> = vec![
        (
            400,
            "invalid_request",
            |e| matches!(e, CallError::InvalidRequest { status: 400, .. }),
            |p| matches!(p, ProviderError::InvalidRequest(_)),
        ),
        (
            401,
            "auth",
            |e| matches!(e, CallError::Auth { status: 401, .. }),
            |p| matches!(p, ProviderError::Auth(m) if m.starts_with("HTTP 401")),
        ),
        (
            402,
            "spend_cap",
            |e| matches!(e, CallError::SpendCap { .. }),
            |p| matches!(p, ProviderError::SpendCap(_)),
        ),
        (
            403,
            "auth",
            |e| matches!(e, CallError::Auth { status: 403, .. }),
            |p| matches!(p, ProviderError::Auth(_)),
        ),
        (
            404,
            "invalid_request",
            |e| matches!(e, CallError::InvalidRequest { status: 404, .. }),
            |p| matches!(p, ProviderError::InvalidRequest(_)),
        ),
        (
            413,
            "invalid_request",
            |e| matches!(e, CallError::InvalidRequest { status: 413, .. }),
            |p| matches!(p, ProviderError::InvalidRequest(_)),
        ),
        (
            429,
            "rate_limited",
            |e| {
                matches!(
                    e,
                    CallError::RateLimited {
                        retry_after: None,
                        ..
                    }
                )
            },
            |p| {
                matches!(
                    p,
                    ProviderError::RateLimited {
                        retry_after_ms: 1000
                    }
                )
            },
        ),
        (
            500,
            "server",
            |e| matches!(e, CallError::Server { status: 500, .. }),
            |p| {
                matches!(
                    p,
                    ProviderError::Transient {
                        retry_after_ms: None,
                        ..
                    }
                )
            },
        ),
        (
            529,
            "overloaded",
            |e| matches!(e, CallError::Overloaded { status: 529, .. }),
            |p| {
                matches!(
                    p,
                    ProviderError::Transient {
                        retry_after_ms: None,
                        ..
                    }
                )
            },
        ),
    ];
    for (status, kind, is_call, is_provider) in cases {
        let server = Server::replay(vec![Reply::json(
            status,
            fixture(&format!("anthropic/error_{status}.json")),
        )])
        .await;
        let e = provider(&server)
            .call(&request("claude-sonnet-4-5"), &|_| {})
            .await
            .unwrap_err();
        assert!(is_call(&e), "HTTP {status}: {e:?}");
        assert_eq!(e.kind(), kind);
        assert!(!e.to_string().is_empty());
        let p = ProviderError::from(e);
        assert!(is_provider(&p), "HTTP {status}: {p:?}");
    }
}

/// A tool result with an image goes out as the API's `tool_result` with a
/// list of `text` and `image` blocks (base64 source), checked on the body
/// the local server received; a text result stays a string.
#[tokio::test]
async fn a_tool_result_with_an_image_is_sent_as_text_and_image_blocks() {
    use glia_proto::{ImageSource, Message, ResultBlock, ToolContent};
    let server = Server::replay(vec![Reply::json(200, fixture("anthropic/message.json"))]).await;
    let mut req = request("claude-sonnet-4-5");
    req.messages.push(Message {
        role: Role::Assistant,
        content: vec![
            ContentBlock::ToolUse {
                id: "toolu_1".into(),
                name: "screenshot".into(),
                input: json!({}),
            },
            ContentBlock::ToolUse {
                id: "toolu_2".into(),
                name: "lookup_order".into(),
                input: json!({"order_id": "A1"}),
            },
        ],
    });
    let image = ToolContent::Blocks(vec![
        ResultBlock::text("The page:"),
        ResultBlock::Image {
            source: ImageSource::base64("image/png", "iVBORw0KGgo="),
        },
    ]);
    req.messages.push(Message {
        role: Role::User,
        content: vec![
            ContentBlock::ToolResult {
                tool_use_id: "toolu_1".into(),
                content: image,
                is_error: false,
            },
            ContentBlock::ToolResult {
                tool_use_id: "toolu_2".into(),
                content: "shipped".into(),
                is_error: false,
            },
        ],
    });
    glia_proto::repair::validate(&req.messages).expect("a valid request");
    provider(&server)
        .streaming(false)
        .generate(&req, &|_| {})
        .await
        .unwrap();
    let body = &server.seen()[0].body;
    assert_eq!(
        body["messages"][2],
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                {"type": "text", "text": "The page:"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
            ]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "shipped", "cache_control": {"type": "ephemeral"}}
        ]})
    );
}
