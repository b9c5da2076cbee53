//! Anthropic Messages API adapter (`POST /v1/messages`), written from the
//! public API reference: "Messages", "Streaming Messages", "Prompt caching",
//! "Extended thinking", "Tool use" and "Errors".
//!
//! Request: the system prompt is one text block carrying a cache breakpoint
//! (`cache_control: {"type": "ephemeral"}`), the last tool definition carries
//! one (tools come before the system prompt in the cached prefix), and the
//! last block of the conversation carries one so the next turn reads the
//! whole history from the cache — three of the four breakpoints allowed.
//! A tool result's content is a string, or, when it has an image, the list
//! of `text` and `image` blocks the API takes in a `tool_result` ("Tool
//! use": content "can also be a list of nested content blocks such as text
//! or image"), each image `{"type": "image", "source": {"type": "base64",
//! "media_type": …, "data": …}}` ([`glia_proto::ToolContent`] serialises
//! to exactly that).
//!
//! # Stream grammar
//!
//! `message_start`, then per content block `content_block_start` /
//! `content_block_delta`… / `content_block_stop`, then `message_delta`
//! (stop reason, cumulative usage) and `message_stop`. Every shape, and
//! what glia does with it — what it cannot map exactly is
//! [`CallError::Malformed`] (retried, then the run fails with the reason),
//! never dropped, merged or overwritten content:
//!
//! | shape | glia |
//! |---|---|
//! | `message_start` | usage: input and cache tokens |
//! | a second `message_start` | malformed |
//! | `content_block_start` at a new `index` (`text`, `tool_use`, `thinking`, `redacted_thinking`) | a block at that position; a `redacted_thinking` block arrives whole |
//! | … at an index already started | malformed (never overwritten) |
//! | … without an index | malformed |
//! | … of another type (`server_tool_use`, `document`, …) | malformed: glia cannot represent it, and dropping it would lose content |
//! | … `tool_use` without a name | malformed; without an id, one is made up (`toolu_glia_…`) |
//! | indexes out of order (1 before 0), or with gaps | blocks ordered by index |
//! | `tool_use` input given whole in `content_block_start` (`"input": {…}`), no deltas | that input (some compatible servers do this) |
//! | … `"input": {}` then `input_json_delta` pieces | the pieces, appended and parsed |
//! | … a non-empty start input and deltas that parse to the same object | that object |
//! | … a non-empty start input and different or unreadable deltas | malformed |
//! | … deltas that do not parse (cut off by `max_tokens`, or not JSON) | kept raw as a JSON string; a `max_tokens` stop makes the loop reject the whole answer ([`glia_proto::stop`]) |
//! | `text_delta` / `thinking_delta` / `signature_delta` / `input_json_delta` for a block of its kind | appended |
//! | a delta of the wrong kind for its block, or of an unknown kind (`citations_delta`, …) | malformed |
//! | a delta for an index that never started, or after its `content_block_stop` | malformed |
//! | `content_block_stop` for a block never started, or twice | malformed; a block never stopped before `message_stop` is kept |
//! | `message_delta` | stop reason (verbatim: `end_turn`, `max_tokens`, `stop_sequence`, `tool_use`, `pause_turn`, `refusal`, `model_context_window_exceeded`, …; see [`glia_proto::stop`]) and usage; later counts replace earlier ones (they are cumulative), so nothing is counted twice |
//! | no stop reason by `message_stop` | malformed |
//! | stop reason `tool_use` with no `tool_use` block, or two `tool_use` blocks with one id | malformed |
//! | no usage in any event (compatible servers) | estimated and marked `estimated` ([`crate::estimate`]) |
//! | `ping`, unknown event types | ignored (the API's versioning policy adds event types) |
//! | `error` event after the 200 | classified like an HTTP error |
//! | the stream ends before `message_stop` | [`CallError::StreamCut`] (retried) |

use std::collections::{BTreeMap, HashMap};

use futures::StreamExt;
use futures::future::BoxFuture;
use glia_proto::provider::{ModelRequest, ModelResponse, ToolChoice};
use glia_proto::{ContentBlock, LiveEvent, Message, Role, Usage};
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{Map, Value, json};

use crate::config::ApiKey;
use crate::error::{CallError, Failure};
#[cfg(test)]
use crate::http::usage;
use crate::http::{ByteStream, LiveFn, Wire, cut, error_object, json_event, malformed, sse};

/// The `anthropic-version` header value sent.
pub const API_VERSION: &str = "2023-06-01";

/// Where cache breakpoints go. All on by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachePolicy {
    /// Breakpoint on the last tool definition.
    pub tools: bool,
    /// Breakpoint on the system prompt.
    pub system: bool,
    /// Breakpoint on the last block of the last message.
    pub conversation: bool,
}

impl Default for CachePolicy {
    fn default() -> Self {
        CachePolicy {
            tools: true,
            system: true,
            conversation: true,
        }
    }
}

/// The Anthropic Messages wire format.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Anthropic {
    /// Cache breakpoints.
    pub cache: CachePolicy,
    /// Extended thinking budget in tokens (at least 1024); `None` = off.
    /// Not sent when the request forces a tool (the API refuses forced tool
    /// use with thinking) or when `max_tokens` leaves no room for it.
    pub thinking_budget: Option<u32>,
}

fn ephemeral() -> Value {
    json!({ "type": "ephemeral" })
}

impl Anthropic {
    /// The request body's `messages`. Thinking blocks go back only with
    /// their signature, redacted thinking with its data as received; a tool input that is not an object (arguments a
    /// model sent as invalid JSON) goes back as `{"invalid_arguments": raw}`.
    ///
    /// The API wants tool use ids unique across the request; glia only keeps
    /// them unique per turn, so a repeated id goes out as `{id}_{n}` (its
    /// `n`-th repeat), in its tool use and in the result that answers it.
    fn messages(&self, messages: &[Message]) -> Vec<Value> {
        let mut repeats: HashMap<&str, usize> = HashMap::new();
        let mut wire_ids: HashMap<&str, String> = HashMap::new();
        let mut out: Vec<Value> = messages
            .iter()
            .map(|m| {
                if m.role == Role::Assistant {
                    wire_ids.clear();
                    for (id, _, _) in m.tool_uses() {
                        let n = repeats.entry(id).or_insert(0);
                        wire_ids.insert(id, if *n == 0 { id.to_owned() } else { format!("{id}_{n}") });
                        *n += 1;
                    }
                }
                let wire = |id: &str| wire_ids.get(id).cloned().unwrap_or_else(|| id.to_owned());
                let content: Vec<Value> = m
                    .content
                    .iter()
                    .filter_map(|b| match b {
                        ContentBlock::Text { text } => Some(json!({ "type": "text", "text": text })),
                        ContentBlock::ToolUse { id, name, input } => {
                            let input = if input.is_object() { input.clone() } else { json!({ "invalid_arguments": input }) };
                            Some(json!({ "type": "tool_use", "id": wire(id), "name": name, "input": input }))
                        }
                        ContentBlock::ToolResult { tool_use_id, content, is_error } => {
                            let mut v = json!({ "type": "tool_result", "tool_use_id": wire(tool_use_id), "content": content });
                            if *is_error {
                                v["is_error"] = json!(true);
                            }
                            Some(v)
                        }
                        ContentBlock::Thinking { thinking, signature } if !signature.is_empty() => {
                            Some(json!({ "type": "thinking", "thinking": thinking, "signature": signature }))
                        }
                        ContentBlock::Thinking { .. } => None,
                        ContentBlock::RedactedThinking { data } => Some(json!({ "type": "redacted_thinking", "data": data })),
                    })
                    .collect();
                let role = match m.role {
                    Role::User => "user",
                    Role::Assistant => "assistant",
                };
                json!({ "role": role, "content": content })
            })
            .collect();
        if self.cache.conversation
            && let Some(last) = out
                .last_mut()
                .and_then(|m| m["content"].as_array_mut())
                .and_then(|c| c.last_mut())
            && last["type"] != "thinking"
            && last["type"] != "redacted_thinking"
        {
            last["cache_control"] = ephemeral();
        }
        out
    }
}

impl Wire for Anthropic {
    fn provider(&self) -> &'static str {
        "anthropic"
    }

    fn url(&self, base: &str) -> String {
        format!("{base}/v1/messages")
    }

    fn headers(&self, key: Option<&ApiKey>) -> Vec<(HeaderName, HeaderValue)> {
        let mut h = vec![(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(API_VERSION),
        )];
        if let Some(value) = key.and_then(|k| HeaderValue::from_str(k.expose()).ok()) {
            let mut value = value;
            value.set_sensitive(true);
            h.push((HeaderName::from_static("x-api-key"), value));
        }
        h
    }

    fn body(&self, request: &ModelRequest, stream: bool) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), json!(request.model));
        body.insert("max_tokens".into(), json!(request.max_tokens));
        if !request.system.is_empty() {
            let mut block = json!({ "type": "text", "text": request.system });
            if self.cache.system {
                block["cache_control"] = ephemeral();
            }
            body.insert("system".into(), json!([block]));
        }
        body.insert("messages".into(), json!(self.messages(&request.messages)));
        if !request.tools.is_empty() {
            let mut tools: Vec<Value> =
                request.tools.iter().map(|t| json!({ "name": t.name, "description": t.description, "input_schema": t.input_schema })).collect();
            if self.cache.tools
                && let Some(last) = tools.last_mut()
            {
                last["cache_control"] = ephemeral();
            }
            body.insert("tools".into(), json!(tools));
            let choice = match &request.tool_choice {
                ToolChoice::Auto => json!({ "type": "auto" }),
                ToolChoice::Tool { name } => json!({ "type": "tool", "name": name }),
            };
            body.insert("tool_choice".into(), choice);
        }
        if let Some(budget) = self.thinking_budget {
            let forced =
                matches!(request.tool_choice, ToolChoice::Tool { .. }) && !request.tools.is_empty();
            let budget = budget.max(1024).min(request.max_tokens.saturating_sub(1));
            if !forced && budget >= 1024 {
                body.insert(
                    "thinking".into(),
                    json!({ "type": "enabled", "budget_tokens": budget }),
                );
            }
        }
        if stream {
            body.insert("stream".into(), json!(true));
        }
        Value::Object(body)
    }

    fn decode_body(&self, body: &[u8]) -> Result<ModelResponse, CallError> {
        decode_message(body)
    }

    fn decode_stream<'a>(
        &'a self,
        chunks: ByteStream<'a>,
        live: &'a LiveFn<'a>,
    ) -> BoxFuture<'a, Result<ModelResponse, CallError>> {
        Box::pin(decode_stream(chunks, live))
    }
}

/// Usage from a `usage` object. Fields absent or null are left as they
/// are, so a later event only replaces what it carries. Returns which of
/// input (any of the three input counts) and output it carried.
fn read_usage(u: &Value, into: &mut Usage) -> (bool, bool) {
    let field = |name: &str| u.get(name).and_then(Value::as_u64);
    let mut input = false;
    if let Some(n) = field("input_tokens") {
        into.input_tokens = n;
        input = true;
    }
    let output = field("output_tokens")
        .inspect(|n| into.output_tokens = *n)
        .is_some();
    if let Some(n) = field("cache_creation_input_tokens") {
        into.cache_write_tokens = n;
        input = true;
    }
    if let Some(n) = field("cache_read_input_tokens") {
        into.cache_read_tokens = n;
        input = true;
    }
    (input, output)
}

/// Decode a non-streaming Messages answer (or an error body with status 200).
///
/// Errors: [`CallError::InvalidResponse`] for a body that is not a message,
/// [`CallError::Malformed`] for a block type glia does not support, a
/// `tool_use` block without a name, or a missing `stop_reason`.
pub fn decode_message(body: &[u8]) -> Result<ModelResponse, CallError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| CallError::InvalidResponse {
        message: format!("answer is not JSON: {e}"),
    })?;
    if v["type"] == "error" {
        return Err(stream_failure(body));
    }
    let mut blocks = Vec::new();
    for (i, b) in v["content"]
        .as_array()
        .ok_or_else(|| CallError::InvalidResponse {
            message: "answer has no content array".into(),
        })?
        .iter()
        .enumerate()
    {
        let kind = start_block(i as u64, b)?;
        blocks.push(Block { kind, closed: true });
    }
    let mut u = Usage::default();
    let (input, output) = read_usage(&v["usage"], &mut u);
    u.estimated = !(input && output);
    let stop_reason = v["stop_reason"]
        .as_str()
        .ok_or_else(|| malformed("the answer has no stop_reason"))?
        .to_owned();
    response(blocks, u, stop_reason)
}

/// The assistant message of the assembled blocks (in index order). Empty
/// text blocks are left out; nothing else is.
fn response(
    blocks: Vec<Block>,
    usage: Usage,
    stop_reason: String,
) -> Result<ModelResponse, CallError> {
    let mut content = Vec::new();
    for (index, block) in blocks.into_iter().enumerate() {
        match block.kind {
            Kind::Text(text) if text.is_empty() => {}
            Kind::Text(text) => content.push(ContentBlock::Text { text }),
            Kind::Thinking {
                thinking,
                signature,
            } => content.push(ContentBlock::Thinking {
                thinking,
                signature,
            }),
            Kind::Redacted(data) => content.push(ContentBlock::RedactedThinking { data }),
            Kind::Tool {
                id,
                name,
                start_input,
                json,
            } => {
                let input = tool_input(index, &name, start_input, &json)?;
                let id = if id.is_empty() {
                    format!(
                        "toolu_glia_{:016x}{:08x}",
                        fastrand::u64(..),
                        fastrand::u32(..)
                    )
                } else {
                    id
                };
                content.push(ContentBlock::ToolUse { id, name, input });
            }
        }
    }
    let message = Message {
        role: Role::Assistant,
        content,
    };
    let mut ids: Vec<&str> = message.tool_uses().map(|(id, _, _)| id).collect();
    ids.sort_unstable();
    if let Some(pair) = ids.windows(2).find(|w| w[0] == w[1]) {
        return Err(malformed(format!(
            "two tool_use blocks share the id {:?}",
            pair[0]
        )));
    }
    if stop_reason == "tool_use" && ids.is_empty() {
        return Err(malformed("stop_reason tool_use but no tool_use block"));
    }
    Ok(ModelResponse::new(message, usage, stop_reason))
}

/// A tool's input: given whole at `content_block_start`, or by
/// `input_json_delta` pieces — not both unless they agree. Pieces that do
/// not parse (cut off by the output cap, or not JSON) are kept raw as a JSON
/// string.
fn tool_input(
    index: usize,
    name: &str,
    start_input: Value,
    json: &str,
) -> Result<Value, CallError> {
    let given_at_start = start_input.as_object().is_some_and(|m| !m.is_empty());
    if json.trim().is_empty() {
        return match start_input {
            Value::Null => Ok(json!({})),
            v @ Value::Object(_) => Ok(v),
            other => Err(malformed(format!(
                "tool_use block {index} ({name}) starts with input {other}, not an object"
            ))),
        };
    }
    match serde_json::from_str::<Value>(json) {
        Ok(v) if given_at_start && v != start_input => Err(malformed(format!(
            "tool_use block {index} ({name}) has input {start_input} at its start and {v} from its deltas"
        ))),
        Ok(v) => Ok(v),
        Err(_) if given_at_start => Err(malformed(format!(
            "tool_use block {index} ({name}) has input at its start and unreadable deltas"
        ))),
        Err(_) => Ok(Value::String(json.to_owned())),
    }
}

/// An `error` event (or error body) classified like an HTTP failure.
fn stream_failure(data: &[u8]) -> CallError {
    let mut f: Failure = error_object(data);
    f.status = 200;
    f.classify()
}

/// The content of one block being assembled.
#[derive(Debug)]
enum Kind {
    Text(String),
    Tool {
        id: String,
        name: String,
        start_input: Value,
        json: String,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
    Redacted(String),
}

impl Kind {
    fn name(&self) -> &'static str {
        match self {
            Kind::Text(_) => "text",
            Kind::Tool { .. } => "tool_use",
            Kind::Thinking { .. } => "thinking",
            Kind::Redacted(_) => "redacted_thinking",
        }
    }
}

/// One content block: its content and whether `content_block_stop` came.
#[derive(Debug)]
struct Block {
    kind: Kind,
    closed: bool,
}

/// A block as `content_block_start` (or a non-streamed answer) gives it.
fn start_block(index: u64, b: &Value) -> Result<Kind, CallError> {
    let text = |field: &str| b[field].as_str().unwrap_or_default().to_owned();
    Ok(match b["type"].as_str() {
        Some("text") => Kind::Text(text("text")),
        Some("tool_use") => {
            if text("name").is_empty() {
                return Err(malformed(format!("tool_use block {index} has no name")));
            }
            Kind::Tool {
                id: text("id"),
                name: text("name"),
                start_input: b.get("input").cloned().unwrap_or(Value::Null),
                json: String::new(),
            }
        }
        Some("thinking") => Kind::Thinking {
            thinking: text("thinking"),
            signature: text("signature"),
        },
        Some("redacted_thinking") => Kind::Redacted(text("data")),
        other => {
            return Err(malformed(format!(
                "content block {index} has type {}, which glia does not support",
                other.unwrap_or("(none)")
            )));
        }
    })
}

/// The stream state: blocks by index, usage so far, stop reason.
#[derive(Debug, Default)]
struct Assembly {
    blocks: BTreeMap<u64, Block>,
    usage: Usage,
    /// Whether any event carried input / output counts.
    usage_seen: (bool, bool),
    stop_reason: Option<String>,
    started: bool,
    stopped: bool,
}

impl Assembly {
    fn handle(&mut self, event: &str, data: &str, live: &LiveFn<'_>) -> Result<(), CallError> {
        if event == "ping" {
            return Ok(());
        }
        let v = json_event(data)?;
        let kind = v["type"].as_str().unwrap_or(event);
        let index = v["index"].as_u64();
        match kind {
            "message_start" => {
                if self.started {
                    return Err(malformed("a second message_start"));
                }
                self.started = true;
                self.note_usage(&v["message"]["usage"]);
            }
            "content_block_start" => {
                let index =
                    index.ok_or_else(|| malformed("content_block_start without an index"))?;
                if self.blocks.contains_key(&index) {
                    return Err(malformed(format!("content block {index} started twice")));
                }
                let block = start_block(index, &v["content_block"])?;
                match &block {
                    Kind::Text(text) if !text.is_empty() => live(LiveEvent::ModelDelta {
                        channel: "text".into(),
                        delta: text.clone(),
                    }),
                    // The model has begun a tool call: its name.
                    Kind::Tool { name, .. } => live(LiveEvent::ModelDelta {
                        channel: "tool_call".into(),
                        delta: name.clone(),
                    }),
                    _ => {}
                }
                self.blocks.insert(
                    index,
                    Block {
                        kind: block,
                        closed: false,
                    },
                );
            }
            "content_block_delta" => {
                let d = &v["delta"];
                let delta_type = d["type"].as_str().unwrap_or("(none)");
                let Some(block) = index.and_then(|i| self.blocks.get_mut(&i)) else {
                    return Err(malformed(format!(
                        "a {delta_type} for content block {index:?}, which never started"
                    )));
                };
                if block.closed {
                    return Err(malformed(format!(
                        "a {delta_type} for content block {index:?} after its content_block_stop"
                    )));
                }
                let piece = |field: &str| {
                    d[field]
                        .as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| malformed(format!("a {delta_type} without {field}")))
                };
                match (&mut block.kind, delta_type) {
                    (Kind::Text(text), "text_delta") => {
                        let p = piece("text")?;
                        text.push_str(&p);
                        live(LiveEvent::ModelDelta {
                            channel: "text".into(),
                            delta: p,
                        });
                    }
                    (Kind::Tool { json, .. }, "input_json_delta") => {
                        json.push_str(&piece("partial_json")?)
                    }
                    (Kind::Thinking { thinking, .. }, "thinking_delta") => {
                        let p = piece("thinking")?;
                        thinking.push_str(&p);
                        live(LiveEvent::ModelDelta {
                            channel: "thinking".into(),
                            delta: p,
                        });
                    }
                    (Kind::Thinking { signature, .. }, "signature_delta") => {
                        signature.push_str(&piece("signature")?)
                    }
                    (kind, _) => {
                        return Err(malformed(format!(
                            "a {delta_type} for {} block {index:?}",
                            kind.name()
                        )));
                    }
                }
            }
            "content_block_stop" => {
                let Some(block) = index.and_then(|i| self.blocks.get_mut(&i)) else {
                    return Err(malformed(format!(
                        "content_block_stop for block {index:?}, which never started"
                    )));
                };
                if block.closed {
                    return Err(malformed(format!("content block {index:?} stopped twice")));
                }
                block.closed = true;
            }
            "message_delta" => {
                if let Some(reason) = v["delta"]["stop_reason"].as_str() {
                    self.stop_reason = Some(reason.to_owned());
                }
                self.note_usage(&v["usage"]);
            }
            "message_stop" => self.stopped = true,
            "error" => return Err(stream_failure(data.as_bytes())),
            // Anthropic's versioning policy: new event types may appear; they carry no content glia knows.
            _ => tracing::debug!(event = kind, "ignored stream event"),
        }
        Ok(())
    }

    fn note_usage(&mut self, u: &Value) {
        let (input, output) = read_usage(u, &mut self.usage);
        self.usage_seen.0 |= input;
        self.usage_seen.1 |= output;
    }

    fn finish(self) -> Result<ModelResponse, CallError> {
        if !self.stopped {
            return Err(cut(if self.started {
                "no message_stop event"
            } else {
                "no message_start event"
            }));
        }
        let stop_reason = self
            .stop_reason
            .ok_or_else(|| malformed("the stream ended without a stop_reason"))?;
        let usage = Usage {
            estimated: !(self.usage_seen.0 && self.usage_seen.1),
            ..self.usage
        };
        response(self.blocks.into_values().collect(), usage, stop_reason)
    }
}

/// Decode a Messages event stream, calling `live` with text and thinking
/// deltas as they arrive.
pub async fn decode_stream(
    chunks: ByteStream<'_>,
    live: &LiveFn<'_>,
) -> Result<ModelResponse, CallError> {
    let mut events = sse(chunks);
    let mut assembly = Assembly::default();
    while let Some(event) = events.next().await {
        let event = event?;
        assembly.handle(&event.event, &event.data, live)?;
        if assembly.stopped {
            break;
        }
    }
    assembly.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_fields_replace_not_add() {
        let mut u = Usage::default();
        read_usage(
            &json!({"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 1}),
            &mut u,
        );
        read_usage(
            &json!({"output_tokens": 7, "cache_read_input_tokens": null}),
            &mut u,
        );
        assert_eq!(u, usage(10, 7, 0, 5));
    }

    #[test]
    fn a_repeated_tool_use_id_is_renamed_on_the_wire() {
        let call = || Message {
            role: Role::Assistant,
            content: vec![ContentBlock::ToolUse {
                id: "call_0".into(),
                name: "add".into(),
                input: json!({}),
            }],
        };
        let result = || Message {
            role: Role::User,
            content: vec![ContentBlock::ToolResult {
                tool_use_id: "call_0".into(),
                content: "1".into(),
                is_error: false,
            }],
        };
        let wire = Anthropic {
            cache: CachePolicy {
                tools: false,
                system: false,
                conversation: false,
            },
            ..Anthropic::default()
        }
        .messages(&[Message::user("go"), call(), result(), call(), result()]);
        let ids: Vec<&str> = wire
            .iter()
            .skip(1)
            .map(|m| {
                m["content"][0]["id"]
                    .as_str()
                    .or(m["content"][0]["tool_use_id"].as_str())
                    .unwrap()
            })
            .collect();
        assert_eq!(ids, ["call_0", "call_0", "call_0_1", "call_0_1"]);
    }
}
