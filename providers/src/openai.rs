//! OpenAI-compatible Chat Completions adapter (`POST {base}/chat/completions`)
//! for OpenAI, vLLM, Ollama, llama.cpp server and OpenRouter, written from
//! the public API reference ("Create chat completion", "The chat completion
//! chunk object", "Function calling", "Error codes").
//!
//! Request: the system prompt is a `system` message; a glia user turn with
//! tool results becomes one `tool` message per result (in call order), then
//! a `user` message with the remaining text; an assistant turn becomes one
//! message with `content` and `tool_calls` (arguments as a JSON string).
//! Thinking is never sent back.
//!
//! Images in tool results: a `tool` message's `content` takes text only
//! ("Create chat completion": the tool message's content is a string or
//! an array of text parts), so the `tool` message carries the result's text
//! with each image as `[image: image/png, 1234 bytes]`, and the images go
//! in the `user` message after the turn's `tool` messages, as
//! `{"type": "image_url", "image_url": {"url": "data:image/png;base64,…"}}`
//! parts, each result's images after a text part `Images returned by tool
//! call {id}:`; the turn's own text follows as a last text part. A turn
//! without images is sent exactly as before. Streaming asks for
//! `stream_options: {"include_usage": true}`, so the last chunk before
//! `[DONE]` carries usage (with empty `choices`); an answer with no usage
//! at all gets an estimate marked `estimated` ([`crate::estimate`]).
//!
//! # Stream grammar
//!
//! A stream is `data:` chunks ending with `data: [DONE]`. Every shape a
//! chunk may take, and what glia does with it — what it cannot map exactly
//! is [`CallError::Malformed`] (retried, then the run fails with the
//! reason), never dropped, merged or overwritten content:
//!
//! | shape | glia |
//! |---|---|
//! | `choices[i]` with `index` 0 (or none) | the answer |
//! | `choices[i]` with another `index` | malformed: glia asks for one choice |
//! | `delta.content` / `delta.reasoning_content` / `delta.reasoning` / `delta.refusal` | text / thinking / refusal text (stop reason `refusal`), appended |
//! | `delta.tool_calls[k]` with a non-empty `id` new at its `index` | starts a call at that index |
//! | … with a non-empty `id` different from the call open at its `index` | starts another call at the same index (Ollama sends parallel calls all at `index` 0): both kept, in order |
//! | … with the `id` of the call open at its `index`, or an empty / no `id` | continues the call open at that index |
//! | … with the `id` of a call at another index | malformed (one id, two calls) |
//! | … with no `index` | continues the last call; a new `id` starts the next one |
//! | … starting with a `function.name` and no `id` | starts a call; an id is made up (`call_…`, unique) |
//! | … continuing with no call open at its `index` and no id or name | malformed (a delta for a call that never started) |
//! | … repeating the call's `function.name`, or an empty name | nothing new |
//! | … with a different `function.name` | malformed (never renamed) |
//! | `function.arguments` as string pieces | appended |
//! | … sent whole in the first chunk (same chunk as id and name) | taken whole |
//! | … re-sent cumulatively (each piece repeats all before it) | the last piece |
//! | … a placeholder empty object (`{}`) then the real arguments | the real arguments (only an empty object is a placeholder) |
//! | … as a JSON object instead of a string | taken as that object's text |
//! | … a JSON string holding an object (double-encoded) | the object |
//! | … that more than one of the readings above turns into different objects | malformed (ambiguous) |
//! | … that no reading turns into an object | kept raw as a JSON string: the tool's argument check gives the model an error result, never `{}` |
//! | `delta.function_call` (legacy functions) | one call, like a tool call with no id |
//! | indexes out of order (1 before 0), interleaved pieces | routed by index; calls ordered by index, then by start |
//! | `finish_reason` | the stop reason: `stop` → `end_turn` (`tool_use` when calls arrived), `tool_calls` / `function_call` → `tool_use` (malformed if no call arrived), `length` → `max_tokens`, `content_filter` and any other as sent; see [`glia_proto::stop`] |
//! | `finish_reason: "error"` (gateways such as OpenRouter) | a retryable provider error ([`CallError::Server`]), never an answer |
//! | an `error` object (top level or in a chunk) | classified like an HTTP error |
//! | `usage` on any chunk | the last one wins (cached prompt tokens are cache reads) |
//! | `[DONE]` with no `finish_reason` (vLLM) | the answer ends normally: `end_turn` / `tool_use` |
//! | end of stream with neither `finish_reason` nor `[DONE]` | [`CallError::StreamCut`] (retried) |

use futures::StreamExt;
use futures::future::BoxFuture;
use glia_proto::provider::{ModelRequest, ModelResponse, ToolChoice};
use glia_proto::{ContentBlock, LiveEvent, Message, Role, Usage};
use reqwest::header::{AUTHORIZATION, HeaderName, HeaderValue};
use serde_json::{Map, Value, json};

use crate::config::ApiKey;
use crate::error::CallError;
use crate::http::{ByteStream, LiveFn, Wire, cut, error_object, json_event, malformed, sse, usage};

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
        OpenAi {
            max_tokens_field: MaxTokensField::MaxTokens,
            include_usage: true,
        }
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
            // Parts of the user message that carries the results' images.
            let mut images: Vec<Value> = Vec::new();
            for b in &m.content {
                match b {
                    ContentBlock::Text { text } => texts.push(text.as_str()),
                    ContentBlock::ToolUse { id, name, input } => {
                        calls.push(json!({ "id": id, "type": "function", "function": { "name": name, "arguments": arguments(input) } }))
                    }
                    ContentBlock::ToolResult { tool_use_id, content, is_error } => {
                        let text = content.to_text();
                        let text = if *is_error { format!("Error: {text}") } else { text.into_owned() };
                        out.push(json!({ "role": "tool", "tool_call_id": tool_use_id, "content": text }));
                        let mut sources = content.images().peekable();
                        if sources.peek().is_some() {
                            images.push(json!({ "type": "text", "text": format!("Images returned by tool call {tool_use_id}:") }));
                        }
                        for source in sources {
                            let url = format!("data:{};base64,{}", source.media_type(), source.data());
                            images.push(json!({ "type": "image_url", "image_url": { "url": url } }));
                        }
                    }
                    ContentBlock::Thinking { .. } | ContentBlock::RedactedThinking { .. } => {}
                }
            }
            let text = texts.join("\n");
            match m.role {
                Role::User if !images.is_empty() => {
                    if !text.is_empty() {
                        images.push(json!({ "type": "text", "text": text }));
                    }
                    out.push(json!({ "role": "user", "content": images }));
                }
                Role::User if !text.is_empty() => {
                    out.push(json!({ "role": "user", "content": text }))
                }
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
        body.insert(
            "messages".into(),
            json!(self.messages(&request.system, &request.messages)),
        );
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
                ToolChoice::Tool { name } => {
                    json!({ "type": "function", "function": { "name": name } })
                }
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

    fn decode_stream<'a>(
        &'a self,
        chunks: ByteStream<'a>,
        live: &'a LiveFn<'a>,
    ) -> BoxFuture<'a, Result<ModelResponse, CallError>> {
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
    let cached = u["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .or_else(|| u["prompt_cache_hit_tokens"].as_u64())
        .unwrap_or(0)
        .min(prompt);
    Some(usage(prompt - cached, output, 0, cached))
}

/// The usage to report: the provider's, or one marked `estimated` (all
/// counts zero, filled by [`crate::estimate::fill_missing`]).
fn reported_or_estimated(u: Option<Usage>) -> Usage {
    u.unwrap_or(Usage {
        estimated: true,
        ..Usage::default()
    })
}

/// The normalised stop reason (see the grammar table and
/// [`glia_proto::stop`]).
fn stop_reason(finish: Option<&str>, has_calls: bool, refused: bool) -> Result<String, CallError> {
    Ok(match finish {
        _ if refused => "refusal".into(),
        Some("tool_calls" | "function_call") if !has_calls => {
            return Err(malformed(format!(
                "finish_reason {:?} but no tool call arrived",
                finish.unwrap_or_default()
            )));
        }
        Some("tool_calls" | "function_call") => "tool_use".into(),
        Some("stop") | None if has_calls => "tool_use".into(),
        Some("stop") | None => "end_turn".into(),
        Some("length") => "max_tokens".into(),
        Some(other) => other.to_owned(),
    })
}

/// An error object inside a 200 answer, if `v` is one.
fn embedded_error(v: &Value, raw: &[u8]) -> Option<CallError> {
    let is_error = v.get("error").is_some_and(|e| !e.is_null()) || v["object"] == "error";
    is_error.then(|| {
        let mut f = error_object(raw);
        f.status = v["error"]["code"]
            .as_u64()
            .or_else(|| v["code"].as_u64())
            .and_then(|c| u16::try_from(c).ok())
            .filter(|c| *c >= 400)
            .unwrap_or(200);
        f.classify()
    })
}

/// A finish reason that is a failure, not a stop: OpenRouter and other
/// gateways end a 200 stream with `finish_reason: "error"` when the
/// upstream failed mid-answer.
fn error_finish(reason: &str) -> CallError {
    CallError::Server {
        status: 200,
        retry_after: None,
        message: format!("the provider ended the answer with finish_reason {reason:?}"),
    }
}

/// One tool call being assembled: where it sits (`index`), who it is (`id`,
/// `name`) and its `arguments` pieces as they arrived.
#[derive(Debug, Default, Clone)]
struct CallBuf {
    index: u64,
    id: String,
    name: String,
    pieces: Vec<String>,
}

/// The index given to a legacy `delta.function_call` (never a real index).
const FUNCTION_CALL_INDEX: u64 = u64::MAX;

/// A JSON object read from `text`: the object itself, or a JSON string
/// holding one (double-encoded).
fn as_object(text: &str) -> Option<Value> {
    match serde_json::from_str::<Value>(text.trim()).ok()? {
        v @ Value::Object(_) => Some(v),
        Value::String(inner) => serde_json::from_str::<Value>(&inner)
            .ok()
            .filter(Value::is_object),
        _ => None,
    }
}

/// The arguments of a call from its pieces, per the grammar: appended, sent
/// whole, cumulative, or after a placeholder object. `Ok(Ok(object))` when
/// every reading that gives an object gives the same one; `Ok(Err(raw))`
/// (the pieces appended) when none does; [`CallError::Malformed`] when two
/// readings give different objects.
fn assemble_args(call: &CallBuf) -> Result<Result<Value, String>, CallError> {
    let pieces: Vec<&str> = call
        .pieces
        .iter()
        .map(String::as_str)
        .filter(|p| !p.is_empty())
        .collect();
    let appended: String = pieces.concat();
    if pieces.iter().all(|p| p.trim().is_empty()) {
        return Ok(Ok(json!({})));
    }
    let readings = |ps: &[&str]| -> Vec<Value> {
        let mut out: Vec<Value> = as_object(&ps.concat()).into_iter().collect();
        let cumulative = ps.len() > 1 && ps.windows(2).all(|w| w[1].starts_with(w[0]));
        if cumulative && let Some(v) = ps.last().and_then(|last| as_object(last)) {
            out.push(v);
        }
        out
    };
    let mut found = readings(&pieces);
    if pieces.len() > 1
        && as_object(pieces[0])
            .is_some_and(|v| v.as_object().is_some_and(serde_json::Map::is_empty))
    {
        found.extend(readings(&pieces[1..]));
    }
    found.sort_by_key(Value::to_string);
    found.dedup();
    match found.len() {
        0 => Ok(Err(appended)),
        1 => Ok(Ok(found.remove(0))),
        n => Err(malformed(format!(
            "the arguments of tool call {:?} ({}) read {n} different ways: {:?}",
            call.id, call.name, pieces
        ))),
    }
}

/// A made-up call id for servers that send none; unique within a run.
fn fresh_id() -> String {
    format!("call_{:016x}{:08x}", fastrand::u64(..), fastrand::u32(..))
}

/// The stream state.
#[derive(Debug, Default)]
struct Assembly {
    text: String,
    thinking: String,
    /// Calls in the order they started.
    calls: Vec<CallBuf>,
    finish: Option<String>,
    refused: bool,
    usage: Option<Usage>,
    done: bool,
}

impl Assembly {
    /// One `delta.tool_calls[k]` entry (or a legacy `function_call`); a
    /// call's name, once known, is streamed (channel `tool_call`).
    fn tool_delta(&mut self, tc: &Value, live: &LiveFn<'_>) -> Result<(), CallError> {
        let id = tc["id"].as_str().filter(|s| !s.is_empty());
        let f = &tc["function"];
        let name = f["name"].as_str().filter(|s| !s.is_empty());
        let index = match tc["index"].as_u64() {
            Some(i) => i,
            // No index: a new id starts the next call, anything else continues the last.
            None => match (id, self.calls.last()) {
                (Some(id), Some(last)) if !last.id.is_empty() && last.id != id => last.index + 1,
                (_, Some(last)) => last.index,
                (_, None) => 0,
            },
        };
        if let Some(id) = id
            && let Some(other) = self.calls.iter().find(|c| c.id == id && c.index != index)
        {
            return Err(malformed(format!(
                "tool call id {id:?} given at index {index} and at index {}",
                other.index
            )));
        }
        let open = self.calls.iter().rposition(|c| c.index == index);
        let continues = match (open, id) {
            (Some(k), Some(id)) => self.calls[k].id.is_empty() || self.calls[k].id == id,
            (Some(_), None) => true,
            (None, _) => false,
        };
        let k = match open {
            Some(k) if continues => k,
            _ => {
                if id.is_none() && name.is_none() {
                    return Err(malformed(format!(
                        "a tool call delta for index {index}, where no call started (no id, no name)"
                    )));
                }
                self.calls.push(CallBuf {
                    index,
                    ..CallBuf::default()
                });
                self.calls.len() - 1
            }
        };
        let call = &mut self.calls[k];
        if let Some(id) = id
            && call.id.is_empty()
        {
            call.id = id.to_owned();
        }
        match name {
            Some(name) if call.name.is_empty() => {
                call.name = name.to_owned();
                live(LiveEvent::ModelDelta {
                    channel: "tool_call".into(),
                    delta: name.to_owned(),
                });
            }
            Some(name) if call.name != name => {
                return Err(malformed(format!(
                    "tool call {:?} at index {index} renamed from {:?} to {name:?}",
                    call.id, call.name
                )));
            }
            _ => {}
        }
        match &f["arguments"] {
            Value::String(s) => call.pieces.push(s.clone()),
            Value::Null => {}
            whole => call.pieces.push(whole.to_string()),
        }
        Ok(())
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
        for choice in v["choices"].as_array().into_iter().flatten() {
            let n = choice["index"].as_u64().unwrap_or(0);
            if n != 0 {
                return Err(malformed(format!(
                    "a chunk for choice {n}; glia asks for one choice"
                )));
            }
            let d = &choice["delta"];
            if let Some(t) = d["content"].as_str().filter(|t| !t.is_empty()) {
                self.text.push_str(t);
                live(LiveEvent::ModelDelta {
                    channel: "text".into(),
                    delta: t.to_owned(),
                });
            }
            if let Some(t) = d["reasoning_content"]
                .as_str()
                .or_else(|| d["reasoning"].as_str())
                .filter(|t| !t.is_empty())
            {
                self.thinking.push_str(t);
                live(LiveEvent::ModelDelta {
                    channel: "thinking".into(),
                    delta: t.to_owned(),
                });
            }
            if let Some(t) = d["refusal"].as_str().filter(|t| !t.is_empty()) {
                self.refused = true;
                self.text.push_str(t);
                live(LiveEvent::ModelDelta {
                    channel: "text".into(),
                    delta: t.to_owned(),
                });
            }
            for tc in d["tool_calls"].as_array().into_iter().flatten() {
                self.tool_delta(tc, live)?;
            }
            if d["function_call"].is_object() {
                self.tool_delta(
                    &json!({ "index": FUNCTION_CALL_INDEX, "function": d["function_call"] }),
                    live,
                )?;
            }
            match choice["finish_reason"].as_str() {
                Some(reason @ "error") => return Err(error_finish(reason)),
                Some(reason) => self.finish = Some(reason.to_owned()),
                None => {}
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<ModelResponse, CallError> {
        if !self.done && self.finish.is_none() {
            return Err(cut("no finish_reason and no [DONE]"));
        }
        build(
            self.text,
            self.thinking,
            self.calls,
            self.finish.as_deref(),
            self.refused,
            reported_or_estimated(self.usage),
        )
    }
}

/// Assemble the assistant message from its parts. Calls are ordered by
/// index, then by start; none is dropped.
fn build(
    text: String,
    thinking: String,
    mut calls: Vec<CallBuf>,
    finish: Option<&str>,
    refused: bool,
    usage: Usage,
) -> Result<ModelResponse, CallError> {
    let stop = stop_reason(finish, !calls.is_empty(), refused)?;
    let mut content = Vec::new();
    if !thinking.is_empty() {
        content.push(ContentBlock::Thinking {
            thinking,
            signature: String::new(),
        });
    }
    if !text.is_empty() {
        content.push(ContentBlock::Text { text });
    }
    calls.sort_by_key(|c| c.index);
    for call in calls {
        if call.name.is_empty() {
            return Err(malformed(format!(
                "tool call {:?} at index {} has no function name",
                call.id, call.index
            )));
        }
        let input = match assemble_args(&call)? {
            Ok(object) => object,
            Err(raw) => {
                tracing::warn!(tool = %call.name, stop = %stop, "tool arguments are not a JSON object; kept raw");
                Value::String(raw)
            }
        };
        let id = if call.id.is_empty() {
            fresh_id()
        } else {
            call.id
        };
        content.push(ContentBlock::ToolUse {
            id,
            name: call.name,
            input,
        });
    }
    Ok(ModelResponse::new(
        Message {
            role: Role::Assistant,
            content,
        },
        usage,
        stop,
    ))
}

/// Decode a non-streaming completion (or an error object with status 200).
pub fn decode_completion(body: &[u8]) -> Result<ModelResponse, CallError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| CallError::InvalidResponse {
        message: format!("answer is not JSON: {e}"),
    })?;
    if let Some(e) = embedded_error(&v, body) {
        return Err(e);
    }
    let choice = v["choices"]
        .get(0)
        .ok_or_else(|| CallError::InvalidResponse {
            message: "answer has no choices".into(),
        })?;
    if v["choices"].as_array().is_some_and(|c| c.len() > 1) {
        return Err(malformed(
            "an answer with several choices; glia asks for one",
        ));
    }
    let finish = choice["finish_reason"].as_str();
    if let Some(reason @ "error") = finish {
        return Err(error_finish(reason));
    }
    let m = &choice["message"];
    let refusal = m["refusal"].as_str().filter(|r| !r.is_empty());
    let text = m["content"]
        .as_str()
        .or(refusal)
        .unwrap_or_default()
        .to_owned();
    let thinking = m["reasoning_content"]
        .as_str()
        .or_else(|| m["reasoning"].as_str())
        .unwrap_or_default()
        .to_owned();
    let legacy = m["function_call"]
        .is_object()
        .then(|| json!({ "index": FUNCTION_CALL_INDEX, "function": m["function_call"] }));
    let calls = m["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(legacy.as_ref())
        .enumerate()
        .map(|(k, c)| {
            let args = match &c["function"]["arguments"] {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            CallBuf {
                index: c["index"].as_u64().unwrap_or(k as u64),
                id: c["id"].as_str().unwrap_or_default().to_owned(),
                name: c["function"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                pieces: vec![args],
            }
        })
        .collect();
    build(
        text,
        thinking,
        calls,
        finish,
        refusal.is_some(),
        reported_or_estimated(v.get("usage").and_then(read_usage)),
    )
}

/// Decode a Chat Completions event stream, calling `live` with text and
/// reasoning deltas as they arrive.
pub async fn decode_stream(
    chunks: ByteStream<'_>,
    live: &LiveFn<'_>,
) -> Result<ModelResponse, CallError> {
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

    fn args(pieces: &[&str]) -> Result<Result<Value, String>, CallError> {
        assemble_args(&CallBuf {
            index: 0,
            id: "c".into(),
            name: "f".into(),
            pieces: pieces.iter().map(|p| (*p).to_owned()).collect(),
        })
    }

    #[test]
    fn argument_readings() {
        assert_eq!(
            args(&["{\"a\"", ":1}"]).unwrap(),
            Ok(json!({"a": 1})),
            "appended"
        );
        assert_eq!(args(&["{\"a\":1}"]).unwrap(), Ok(json!({"a": 1})), "whole");
        assert_eq!(
            args(&["{}", "{\"a\":1}"]).unwrap(),
            Ok(json!({"a": 1})),
            "placeholder"
        );
        assert_eq!(
            args(&["{\"a", "{\"a\":", "{\"a\":1}"]).unwrap(),
            Ok(json!({"a": 1})),
            "cumulative"
        );
        assert_eq!(
            args(&["{}", "{\"a", "{\"a\":1}"]).unwrap(),
            Ok(json!({"a": 1})),
            "placeholder then cumulative"
        );
        assert_eq!(
            args(&["{\"a\":1}", "{\"a\":1}"]).unwrap(),
            Ok(json!({"a": 1})),
            "whole, re-sent"
        );
        assert_eq!(args(&[""]).unwrap(), Ok(json!({})), "no arguments");
        assert_eq!(
            args(&["\"{\\\"a\\\":1}\""]).unwrap(),
            Ok(json!({"a": 1})),
            "double-encoded"
        );
        assert_eq!(
            args(&["{\"a\":"]).unwrap(),
            Err("{\"a\":".into()),
            "cut: kept raw"
        );
        // Only an empty object is a placeholder: real arguments are never overwritten.
        assert_eq!(
            args(&["{\"a\":1}", "{\"b\":2}"]).unwrap(),
            Err("{\"a\":1}{\"b\":2}".into())
        );
    }

    #[test]
    fn cached_tokens_are_not_input() {
        let u = read_usage(&json!({"prompt_tokens": 100, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 64}})).unwrap();
        assert_eq!(u, usage(36, 7, 0, 64));
    }
}
