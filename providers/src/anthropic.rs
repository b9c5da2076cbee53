//! Anthropic Messages API adapter (`POST /v1/messages`), written from the
//! public API reference: "Messages", "Streaming Messages", "Prompt caching",
//! "Extended thinking", "Tool use" and "Errors".
//!
//! Request: the system prompt is one text block carrying a cache breakpoint
//! (`cache_control: {"type": "ephemeral"}`), the last tool definition carries
//! one (tools come before the system prompt in the cached prefix), and the
//! last block of the conversation carries one so the next turn reads the
//! whole history from the cache — three of the four breakpoints allowed.
//!
//! Stream: `message_start` (usage: input and cache tokens), per block
//! `content_block_start` / `content_block_delta` (`text_delta`,
//! `input_json_delta`, `thinking_delta`, `signature_delta`; a
//! `redacted_thinking` block arrives whole in its start event) /
//! `content_block_stop`, `message_delta` (stop reason, cumulative usage),
//! `message_stop`; `ping` and unknown events are ignored; an `error` event
//! after the 200 is classified like an HTTP error. Usage fields in a later
//! event replace earlier ones (they are cumulative), so nothing is counted
//! twice. A stream that ends before `message_stop` is [`CallError::StreamCut`].

use std::collections::{BTreeMap, HashMap};

use futures::StreamExt;
use futures::future::BoxFuture;
use glia_proto::{ContentBlock, LiveEvent, Message, Role, Usage};
use glia_worker::provider::{ModelRequest, ModelResponse, ToolChoice};
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{Map, Value, json};

use crate::config::ApiKey;
use crate::error::{CallError, Failure};
use crate::http::{ByteStream, LiveFn, Wire, cut, error_object, json_event, sse};
#[cfg(test)]
use crate::http::usage;

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
        CachePolicy { tools: true, system: true, conversation: true }
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
            && let Some(last) = out.last_mut().and_then(|m| m["content"].as_array_mut()).and_then(|c| c.last_mut())
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
        let mut h = vec![(HeaderName::from_static("anthropic-version"), HeaderValue::from_static(API_VERSION))];
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
            let forced = matches!(request.tool_choice, ToolChoice::Tool { .. }) && !request.tools.is_empty();
            let budget = budget.max(1024).min(request.max_tokens.saturating_sub(1));
            if !forced && budget >= 1024 {
                body.insert("thinking".into(), json!({ "type": "enabled", "budget_tokens": budget }));
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

    fn decode_stream<'a>(&'a self, chunks: ByteStream<'a>, live: &'a LiveFn<'a>) -> BoxFuture<'a, Result<ModelResponse, CallError>> {
        Box::pin(decode_stream(chunks, live))
    }
}

/// Usage from a `usage` object. Fields absent or null are `None`, so a
/// later event only replaces what it carries.
fn read_usage(u: &Value, into: &mut Usage) {
    let field = |name: &str| u.get(name).and_then(Value::as_u64);
    if let Some(n) = field("input_tokens") {
        into.input_tokens = n;
    }
    if let Some(n) = field("output_tokens") {
        into.output_tokens = n;
    }
    if let Some(n) = field("cache_creation_input_tokens") {
        into.cache_write_tokens = n;
    }
    if let Some(n) = field("cache_read_input_tokens") {
        into.cache_read_tokens = n;
    }
}

/// Decode a non-streaming Messages answer (or an error body with status 200).
pub fn decode_message(body: &[u8]) -> Result<ModelResponse, CallError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| CallError::InvalidResponse { message: format!("answer is not JSON: {e}") })?;
    if v["type"] == "error" {
        return Err(stream_failure(body));
    }
    let mut blocks = Vec::new();
    for b in v["content"].as_array().ok_or_else(|| CallError::InvalidResponse { message: "answer has no content array".into() })? {
        match b["type"].as_str() {
            Some("text") => blocks.push(ContentBlock::text(b["text"].as_str().unwrap_or_default())),
            Some("tool_use") => blocks.push(ContentBlock::ToolUse {
                id: b["id"].as_str().unwrap_or_default().to_owned(),
                name: b["name"].as_str().unwrap_or_default().to_owned(),
                input: b.get("input").cloned().unwrap_or_else(|| json!({})),
            }),
            Some("thinking") => blocks.push(ContentBlock::Thinking {
                thinking: b["thinking"].as_str().unwrap_or_default().to_owned(),
                signature: b["signature"].as_str().unwrap_or_default().to_owned(),
            }),
            Some("redacted_thinking") => blocks.push(ContentBlock::RedactedThinking { data: b["data"].as_str().unwrap_or_default().to_owned() }),
            _ => {}
        }
    }
    let mut u = Usage::default();
    read_usage(&v["usage"], &mut u);
    let stop_reason = v["stop_reason"].as_str().unwrap_or("end_turn").to_owned();
    Ok(response(blocks, u, stop_reason))
}

fn response(mut content: Vec<ContentBlock>, usage: Usage, stop_reason: String) -> ModelResponse {
    content.retain(|b| !matches!(b, ContentBlock::Text { text } if text.is_empty()));
    if content.is_empty() {
        content.push(ContentBlock::text("(no answer)"));
    }
    ModelResponse::new(Message { role: Role::Assistant, content }, usage, stop_reason)
}

/// An `error` event (or error body) classified like an HTTP failure.
fn stream_failure(data: &[u8]) -> CallError {
    let mut f: Failure = error_object(data);
    f.status = 200;
    f.classify()
}

/// One content block being assembled.
#[derive(Debug)]
enum Block {
    Text(String),
    Tool { id: String, name: String, json: String },
    Thinking { thinking: String, signature: String },
    Redacted(String),
    Ignored,
}

/// The stream state: blocks by index, usage so far, stop reason.
#[derive(Debug, Default)]
struct Assembly {
    blocks: BTreeMap<u64, Block>,
    usage: Usage,
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
                self.started = true;
                read_usage(&v["message"]["usage"], &mut self.usage);
            }
            "content_block_start" => {
                let b = &v["content_block"];
                let block = match b["type"].as_str() {
                    Some("text") => {
                        let text = b["text"].as_str().unwrap_or_default().to_owned();
                        if !text.is_empty() {
                            live(LiveEvent::ModelDelta { channel: "text".into(), delta: text.clone() });
                        }
                        Block::Text(text)
                    }
                    Some("tool_use") => Block::Tool { id: b["id"].as_str().unwrap_or_default().to_owned(), name: b["name"].as_str().unwrap_or_default().to_owned(), json: String::new() },
                    Some("thinking") => Block::Thinking {
                        thinking: b["thinking"].as_str().unwrap_or_default().to_owned(),
                        signature: b["signature"].as_str().unwrap_or_default().to_owned(),
                    },
                    Some("redacted_thinking") => Block::Redacted(b["data"].as_str().unwrap_or_default().to_owned()),
                    _ => Block::Ignored,
                };
                self.blocks.insert(index.unwrap_or(self.blocks.len() as u64), block);
            }
            "content_block_delta" => {
                let d = &v["delta"];
                let piece = |field: &str| d[field].as_str().unwrap_or_default();
                match (index.and_then(|i| self.blocks.get_mut(&i)), d["type"].as_str()) {
                    (Some(Block::Text(text)), Some("text_delta")) => {
                        text.push_str(piece("text"));
                        live(LiveEvent::ModelDelta { channel: "text".into(), delta: piece("text").to_owned() });
                    }
                    (Some(Block::Tool { json, .. }), Some("input_json_delta")) => json.push_str(piece("partial_json")),
                    (Some(Block::Thinking { thinking, .. }), Some("thinking_delta")) => {
                        thinking.push_str(piece("thinking"));
                        live(LiveEvent::ModelDelta { channel: "thinking".into(), delta: piece("thinking").to_owned() });
                    }
                    (Some(Block::Thinking { signature, .. }), Some("signature_delta")) => signature.push_str(piece("signature")),
                    _ => tracing::debug!(data, "ignored content_block_delta"),
                }
            }
            "message_delta" => {
                if let Some(reason) = v["delta"]["stop_reason"].as_str() {
                    self.stop_reason = Some(reason.to_owned());
                }
                read_usage(&v["usage"], &mut self.usage);
            }
            "message_stop" => self.stopped = true,
            "error" => return Err(stream_failure(data.as_bytes())),
            _ => {}
        }
        Ok(())
    }

    fn finish(self) -> Result<ModelResponse, CallError> {
        if !self.stopped {
            return Err(cut(if self.started { "no message_stop event" } else { "no message_start event" }));
        }
        let stop_reason = self.stop_reason.unwrap_or_else(|| "end_turn".into());
        let mut content = Vec::new();
        for block in self.blocks.into_values() {
            match block {
                Block::Text(text) => content.push(ContentBlock::Text { text }),
                Block::Thinking { thinking, signature } => content.push(ContentBlock::Thinking { thinking, signature }),
                Block::Redacted(data) => content.push(ContentBlock::RedactedThinking { data }),
                Block::Tool { id, name, json } => {
                    let parsed = if json.trim().is_empty() { Ok(json!({})) } else { serde_json::from_str::<Value>(&json) };
                    match parsed {
                        Ok(input) => content.push(ContentBlock::ToolUse { id, name, input }),
                        // The output cap cut the tool input: the call is incomplete, drop it.
                        Err(_) if stop_reason == "max_tokens" => tracing::warn!(tool = %name, "tool input cut off by max_tokens; call dropped"),
                        Err(_) => content.push(ContentBlock::ToolUse { id, name, input: Value::String(json) }),
                    }
                }
                Block::Ignored => {}
            }
        }
        Ok(response(content, self.usage, stop_reason))
    }
}

/// Decode a Messages event stream, calling `live` with text and thinking
/// deltas as they arrive.
pub async fn decode_stream(chunks: ByteStream<'_>, live: &LiveFn<'_>) -> Result<ModelResponse, CallError> {
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
        read_usage(&json!({"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 1}), &mut u);
        read_usage(&json!({"output_tokens": 7, "cache_read_input_tokens": null}), &mut u);
        assert_eq!(u, usage(10, 7, 0, 5));
    }

    #[test]
    fn a_repeated_tool_use_id_is_renamed_on_the_wire() {
        let call = || Message { role: Role::Assistant, content: vec![ContentBlock::ToolUse { id: "call_0".into(), name: "add".into(), input: json!({}) }] };
        let result = || Message { role: Role::User, content: vec![ContentBlock::ToolResult { tool_use_id: "call_0".into(), content: "1".into(), is_error: false }] };
        let wire = Anthropic { cache: CachePolicy { tools: false, system: false, conversation: false }, ..Anthropic::default() }.messages(&[Message::user("go"), call(), result(), call(), result()]);
        let ids: Vec<&str> = wire.iter().skip(1).map(|m| m["content"][0]["id"].as_str().or(m["content"][0]["tool_use_id"].as_str()).unwrap()).collect();
        assert_eq!(ids, ["call_0", "call_0", "call_0_1", "call_0_1"]);
    }
}
