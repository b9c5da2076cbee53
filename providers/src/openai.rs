//! OpenAI-compatible Chat Completions adapter (`POST {base}/chat/completions`)
//! for OpenAI, vLLM, Ollama, llama.cpp server and OpenRouter, written from
//! the public API reference ("Create chat completion", "The chat completion
//! chunk object", "Function calling", "Error codes").
//!
//! Request: the system prompt is a `system` message; a glia user turn with
//! tool results becomes one `tool` message per result (in call order), then
//! a `user` message with the remaining text; an assistant turn becomes one
//! message with `content` and `tool_calls` (arguments as a JSON string).
//! Thinking is never sent back. Streaming asks for
//! `stream_options: {"include_usage": true}`, so the last chunk before
//! `[DONE]` carries usage (with empty `choices`).
//!
//! Stream assembly: text from `delta.content`, reasoning from
//! `delta.reasoning_content` / `delta.reasoning` (vLLM, DeepSeek,
//! OpenRouter), refusals from `delta.refusal`, tool calls by `index`
//! (several in parallel, interleaved). Server quirks handled: arguments in
//! the same chunk as the id and name; a placeholder `{}` followed by the real
//! object; arguments re-sent cumulatively; an empty-string id or name on
//! continuation chunks; arguments as a JSON object instead of a string; a
//! missing id (one is made up, unique). Arguments that do not assemble into a
//! JSON object are kept as a JSON string, so the tool's argument check gives
//! the model an error result — never `{}`. An `error` object inside the
//! stream is classified like an HTTP error; a stream that ends without a
//! finish reason is [`CallError::StreamCut`].

use std::collections::BTreeMap;

use futures::StreamExt;
use futures::future::BoxFuture;
use glia_proto::{ContentBlock, LiveEvent, Message, Role, Usage};
use glia_worker::provider::{ModelRequest, ModelResponse, ToolChoice};
use reqwest::header::{AUTHORIZATION, HeaderName, HeaderValue};
use serde_json::{Map, Value, json};

use crate::config::ApiKey;
use crate::error::CallError;
use crate::http::{ByteStream, LiveFn, Wire, cut, error_object, json_event, sse, usage};

/// Which body field carries the output cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MaxTokensField {
    /// `max_tokens`: understood by every compatible server (vLLM, Ollama,
    /// llama.cpp, OpenRouter). Default.
    #[default]
    MaxTokens,
    /// `max_completion_tokens`: OpenAI's current name, required by its
    /// reasoning models.
    MaxCompletionTokens,
}

/// The Chat Completions wire format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenAi {
    /// Output cap field.
    pub max_tokens_field: MaxTokensField,
    /// Send `stream_options.include_usage` (default true; turn off for a
    /// server that rejects the field).
    pub include_usage: bool,
}

impl Default for OpenAi {
    fn default() -> Self {
        OpenAi { max_tokens_field: MaxTokensField::MaxTokens, include_usage: true }
    }
}

/// The `arguments` string sent back for a tool input.
fn arguments(input: &Value) -> String {
    match input {
        Value::String(raw) => raw.clone(),
        other => other.to_string(),
    }
}

impl OpenAi {
    fn messages(&self, system: &str, messages: &[Message]) -> Vec<Value> {
        let mut out = Vec::new();
        if !system.is_empty() {
            out.push(json!({ "role": "system", "content": system }));
        }
        for m in messages {
            let mut texts = Vec::new();
            let mut calls = Vec::new();
            for b in &m.content {
                match b {
                    ContentBlock::Text { text } => texts.push(text.as_str()),
                    ContentBlock::ToolUse { id, name, input } => {
                        calls.push(json!({ "id": id, "type": "function", "function": { "name": name, "arguments": arguments(input) } }))
                    }
                    ContentBlock::ToolResult { tool_use_id, content, is_error } => {
                        let content = if *is_error { format!("Error: {content}") } else { content.clone() };
                        out.push(json!({ "role": "tool", "tool_call_id": tool_use_id, "content": content }));
                    }
                    ContentBlock::Thinking { .. } | ContentBlock::RedactedThinking { .. } => {}
                }
            }
            let text = texts.join("\n");
            match m.role {
                Role::User if !text.is_empty() => out.push(json!({ "role": "user", "content": text })),
                Role::User => {}
                Role::Assistant => {
                    let mut msg = json!({ "role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text) } });
                    if !calls.is_empty() {
                        msg["tool_calls"] = json!(calls);
                    }
                    out.push(msg);
                }
            }
        }
        out
    }
}

impl Wire for OpenAi {
    fn provider(&self) -> &'static str {
        "openai"
    }

    fn url(&self, base: &str) -> String {
        format!("{base}/chat/completions")
    }

    fn headers(&self, key: Option<&ApiKey>) -> Vec<(HeaderName, HeaderValue)> {
        key.and_then(|k| HeaderValue::from_str(&format!("Bearer {}", k.expose())).ok())
            .map(|mut v| {
                v.set_sensitive(true);
                vec![(AUTHORIZATION, v)]
            })
            .unwrap_or_default()
    }

    fn body(&self, request: &ModelRequest, stream: bool) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), json!(request.model));
        body.insert("messages".into(), json!(self.messages(&request.system, &request.messages)));
        let cap = match self.max_tokens_field {
            MaxTokensField::MaxTokens => "max_tokens",
            MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
        };
        body.insert(cap.into(), json!(request.max_tokens));
        if !request.tools.is_empty() {
            let tools: Vec<Value> = request
                .tools
                .iter()
                .map(|t| json!({ "type": "function", "function": { "name": t.name, "description": t.description, "parameters": t.input_schema } }))
                .collect();
            body.insert("tools".into(), json!(tools));
            let choice = match &request.tool_choice {
                ToolChoice::Auto => json!("auto"),
                ToolChoice::Tool { name } => json!({ "type": "function", "function": { "name": name } }),
            };
            body.insert("tool_choice".into(), choice);
        }
        if stream {
            body.insert("stream".into(), json!(true));
            if self.include_usage {
                body.insert("stream_options".into(), json!({ "include_usage": true }));
            }
        }
        Value::Object(body)
    }

    fn decode_body(&self, body: &[u8]) -> Result<ModelResponse, CallError> {
        decode_completion(body)
    }

    fn decode_stream<'a>(&'a self, chunks: ByteStream<'a>, live: &'a LiveFn<'a>) -> BoxFuture<'a, Result<ModelResponse, CallError>> {
        Box::pin(decode_stream(chunks, live))
    }
}

/// Usage from a `usage` object: cached prompt tokens
/// (`prompt_tokens_details.cached_tokens`, or DeepSeek's
/// `prompt_cache_hit_tokens`) are cache reads and are not counted again as
/// input.
fn read_usage(u: &Value) -> Option<Usage> {
    let prompt = u.get("prompt_tokens")?.as_u64()?;
    let output = u["completion_tokens"].as_u64().unwrap_or(0);
    let cached = u["prompt_tokens_details"]["cached_tokens"].as_u64().or_else(|| u["prompt_cache_hit_tokens"].as_u64()).unwrap_or(0).min(prompt);
    Some(usage(prompt - cached, output, 0, cached))
}

fn stop_reason(finish: Option<&str>, has_calls: bool, refused: bool) -> String {
    match finish {
        _ if refused => "refusal".into(),
        Some("tool_calls" | "function_call") => "tool_use".into(),
        Some("stop") | None if has_calls => "tool_use".into(),
        Some("stop") | None => "end_turn".into(),
        Some("length") => "max_tokens".into(),
        Some("content_filter") => "refusal".into(),
        Some(other) => other.to_owned(),
    }
}

/// An error object inside a 200 answer, if `v` is one.
fn embedded_error(v: &Value, raw: &[u8]) -> Option<CallError> {
    let is_error = v.get("error").is_some_and(|e| !e.is_null()) || v["object"] == "error";
    is_error.then(|| {
        let mut f = error_object(raw);
        f.status = v["error"]["code"].as_u64().or_else(|| v["code"].as_u64()).and_then(|c| u16::try_from(c).ok()).filter(|c| *c >= 400).unwrap_or(200);
        f.classify()
    })
}

/// One tool call being assembled.
#[derive(Debug, Default)]
struct CallBuf {
    id: String,
    name: String,
    args: String,
}

/// Add an `arguments` fragment to `buf`, recognising the quirks: a
/// fragment that repeats everything so far (cumulative re-send) replaces
/// it, and so does an object arriving after a complete one (placeholder
/// `{}` first).
fn push_args(buf: &mut String, fragment: &str) {
    if fragment.is_empty() {
        return;
    }
    let replaces = (!buf.is_empty() && fragment.starts_with(buf.as_str()))
        || (fragment.trim_start().starts_with('{') && serde_json::from_str::<Value>(buf).is_ok_and(|v| v.is_object()));
    if replaces {
        buf.clear();
    }
    buf.push_str(fragment);
}

/// A made-up call id for servers that send none; unique within a run.
fn fresh_id() -> String {
    format!("call_{:016x}{:08x}", fastrand::u64(..), fastrand::u32(..))
}

/// Parse assembled arguments. Empty means no arguments; a JSON string
/// holding an object (double-encoded) is unwrapped; anything else that is
/// not an object is kept raw, as a JSON string.
fn parse_args(raw: &str) -> Result<Value, String> {
    let raw_trimmed = raw.trim();
    if raw_trimmed.is_empty() {
        return Ok(json!({}));
    }
    match serde_json::from_str::<Value>(raw_trimmed) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(Value::String(inner)) => match serde_json::from_str::<Value>(&inner) {
            Ok(v @ Value::Object(_)) => Ok(v),
            _ => Err(raw.to_owned()),
        },
        _ => Err(raw.to_owned()),
    }
}

/// The stream state.
#[derive(Debug, Default)]
struct Assembly {
    text: String,
    thinking: String,
    calls: BTreeMap<u64, CallBuf>,
    finish: Option<String>,
    refused: bool,
    usage: Option<Usage>,
    done: bool,
}

impl Assembly {
    fn tool_delta(&mut self, tc: &Value) {
        let id = tc["id"].as_str().filter(|s| !s.is_empty());
        let index = tc["index"].as_u64().unwrap_or_else(|| {
            // No index: a new id starts a call, anything else continues the last.
            let last = self.calls.keys().next_back().copied();
            match (id, last) {
                (Some(id), Some(i)) if self.calls[&i].id != id => i + 1,
                (_, Some(i)) => i,
                (_, None) => 0,
            }
        });
        let call = self.calls.entry(index).or_default();
        if let Some(id) = id
            && call.id.is_empty()
        {
            call.id = id.to_owned();
        }
        let f = &tc["function"];
        if let Some(name) = f["name"].as_str().filter(|s| !s.is_empty())
            && call.name.is_empty()
        {
            call.name = name.to_owned();
        }
        match &f["arguments"] {
            Value::String(s) => push_args(&mut call.args, s),
            Value::Null => {}
            object => call.args = object.to_string(),
        }
    }

    fn handle(&mut self, data: &str, live: &LiveFn<'_>) -> Result<(), CallError> {
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let v = json_event(data)?;
        if let Some(e) = embedded_error(&v, data.as_bytes()) {
            return Err(e);
        }
        if let Some(u) = v.get("usage").and_then(read_usage) {
            self.usage = Some(u);
        }
        for choice in v["choices"].as_array().into_iter().flatten().filter(|c| c["index"].as_u64().unwrap_or(0) == 0) {
            let d = &choice["delta"];
            if let Some(t) = d["content"].as_str().filter(|t| !t.is_empty()) {
                self.text.push_str(t);
                live(LiveEvent::ModelDelta { channel: "text".into(), delta: t.to_owned() });
            }
            if let Some(t) = d["reasoning_content"].as_str().or_else(|| d["reasoning"].as_str()).filter(|t| !t.is_empty()) {
                self.thinking.push_str(t);
                live(LiveEvent::ModelDelta { channel: "thinking".into(), delta: t.to_owned() });
            }
            if let Some(t) = d["refusal"].as_str().filter(|t| !t.is_empty()) {
                self.refused = true;
                self.text.push_str(t);
                live(LiveEvent::ModelDelta { channel: "text".into(), delta: t.to_owned() });
            }
            for tc in d["tool_calls"].as_array().into_iter().flatten() {
                self.tool_delta(tc);
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                self.finish = Some(reason.to_owned());
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<ModelResponse, CallError> {
        if !self.done && self.finish.is_none() {
            return Err(cut("no finish_reason and no [DONE]"));
        }
        let calls = self.calls.into_values().map(|c| (c.id, c.name, c.args)).collect();
        build(self.text, self.thinking, calls, self.finish.as_deref(), self.refused, self.usage.unwrap_or_default())
    }
}

/// Assemble the assistant message from its parts.
fn build(text: String, thinking: String, calls: Vec<(String, String, String)>, finish: Option<&str>, refused: bool, usage: Usage) -> Result<ModelResponse, CallError> {
    let stop = stop_reason(finish, !calls.is_empty(), refused);
    let mut content = Vec::new();
    if !thinking.is_empty() {
        content.push(ContentBlock::Thinking { thinking, signature: String::new() });
    }
    if !text.is_empty() {
        content.push(ContentBlock::Text { text });
    }
    for (id, name, args) in calls {
        if name.is_empty() {
            return Err(CallError::InvalidResponse { message: format!("tool call {id:?} has no function name") });
        }
        let id = if id.is_empty() { fresh_id() } else { id };
        match parse_args(&args) {
            Ok(input) => content.push(ContentBlock::ToolUse { id, name, input }),
            Err(_) if stop == "max_tokens" => tracing::warn!(tool = %name, "tool arguments cut off by the output cap; call dropped"),
            Err(raw) => {
                tracing::warn!(tool = %name, "tool arguments are not a JSON object; the call gets an error result");
                content.push(ContentBlock::ToolUse { id, name, input: Value::String(raw) });
            }
        }
    }
    let stop = if stop == "tool_use" && !content.iter().any(|b| matches!(b, ContentBlock::ToolUse { .. })) { "max_tokens".into() } else { stop };
    if !content.iter().any(|b| !matches!(b, ContentBlock::Thinking { .. })) {
        content.push(ContentBlock::text("(no answer)"));
    }
    Ok(ModelResponse::new(Message { role: Role::Assistant, content }, usage, stop))
}

/// Decode a non-streaming completion (or an error object with status 200).
pub fn decode_completion(body: &[u8]) -> Result<ModelResponse, CallError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| CallError::InvalidResponse { message: format!("answer is not JSON: {e}") })?;
    if let Some(e) = embedded_error(&v, body) {
        return Err(e);
    }
    let choice = v["choices"].get(0).ok_or_else(|| CallError::InvalidResponse { message: "answer has no choices".into() })?;
    let m = &choice["message"];
    let refusal = m["refusal"].as_str().filter(|r| !r.is_empty());
    let text = m["content"].as_str().or(refusal).unwrap_or_default().to_owned();
    let thinking = m["reasoning_content"].as_str().or_else(|| m["reasoning"].as_str()).unwrap_or_default().to_owned();
    let calls = m["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let args = match &c["function"]["arguments"] {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            (c["id"].as_str().unwrap_or_default().to_owned(), c["function"]["name"].as_str().unwrap_or_default().to_owned(), args)
        })
        .collect();
    build(text, thinking, calls, choice["finish_reason"].as_str(), refusal.is_some(), v.get("usage").and_then(read_usage).unwrap_or_default())
}

/// Decode a Chat Completions event stream, calling `live` with text and
/// reasoning deltas as they arrive.
pub async fn decode_stream(chunks: ByteStream<'_>, live: &LiveFn<'_>) -> Result<ModelResponse, CallError> {
    let mut events = sse(chunks);
    let mut assembly = Assembly::default();
    while let Some(event) = events.next().await {
        assembly.handle(&event?.data, live)?;
        if assembly.done {
            break;
        }
    }
    assembly.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_quirks() {
        let mut b = String::new();
        for f in ["{\"a\"", ":1}"] {
            push_args(&mut b, f);
        }
        assert_eq!(b, "{\"a\":1}");
        let mut b = String::new();
        for f in ["{}", "{\"a\":1}"] {
            push_args(&mut b, f);
        }
        assert_eq!(b, "{\"a\":1}");
        let mut b = String::new();
        for f in ["{\"a", "{\"a\":", "{\"a\":1}"] {
            push_args(&mut b, f);
        }
        assert_eq!(b, "{\"a\":1}");
        assert_eq!(parse_args(""), Ok(json!({})));
        assert_eq!(parse_args("\"{\\\"a\\\":1}\""), Ok(json!({"a": 1})));
        assert_eq!(parse_args("{\"a\":"), Err("{\"a\":".into()));
    }

    #[test]
    fn cached_tokens_are_not_input() {
        let u = read_usage(&json!({"prompt_tokens": 100, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 64}})).unwrap();
        assert_eq!(u, usage(36, 7, 0, 64));
    }
}
