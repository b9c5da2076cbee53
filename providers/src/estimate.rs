//! Token usage when the provider reports none.
//!
//! glia asks for usage wherever the API allows it (Anthropic streams always
//! carry it; the OpenAI adapter sends `stream_options: {"include_usage":
//! true}`). Some compatible servers ignore the option or send no `usage` at
//! all; a run whose calls count zero tokens could never trip a token budget
//! or a tenant cap. So when an answer arrives without usage, the adapter
//! estimates it and marks it [`Usage::estimated`]; budgets and tenant caps
//! count it like a reported figure.
//!
//! - **OpenAI models** (every model name tiktoken-rs knows: `gpt-4o`,
//!   `gpt-4.1`, `o3`, `gpt-3.5-turbo`, fine-tunes `ft:…`): the model's own
//!   BPE (tiktoken-rs), plus the chat format's overhead (4 tokens per
//!   message, 3 to prime the reply: OpenAI's cookbook "How to count tokens
//!   with tiktoken").
//! - **Any other model** (Claude, Llama, Qwen, Mistral … behind a
//!   compatible server): no maintained Rust tokenizer ships their
//!   vocabularies, so the estimate is **one token per 3 bytes** of UTF-8
//!   text (rounded up), plus the same per-message overhead. Real tokenizers
//!   average about 4 bytes per token on English text and code, so this
//!   over-counts by about a third: conservative for budgets.
//!
//! What is counted: input = the system prompt, every message's text,
//! thinking, tool-use name and arguments (JSON) and tool-result text, each
//! image in a tool result as [`IMAGE_TOKENS`] (its bytes are not text), and
//! the tool definitions (JSON); output = the answer's text, thinking and
//! tool calls (name and JSON arguments).
//!
//! Reconciliation: the estimate is made once the stream has ended, from the
//! last usage the stream carried; a figure that arrives late in the stream
//! (a usage-only chunk after the finish reason, a `message_delta`) is used
//! as reported and nothing is estimated. A decoder that saw some counts but
//! not others (an Anthropic-compatible server with `message_start` usage but
//! no output count) returns usage marked `estimated` with the missing counts
//! at zero; [`fill_missing`] estimates exactly those.

use glia_proto::provider::ModelRequest;
use glia_proto::{ContentBlock, Message, ResultBlock, ToolContent, Usage};

/// Per-message overhead of the chat format, tokens.
const PER_MESSAGE: u64 = 4;
/// Tokens that prime the reply.
const REPLY_PRIMING: u64 = 3;

/// How tokens are counted for `model`: `tiktoken:{encoding}` for a model
/// tiktoken-rs knows, else `bytes/3`.
///
/// ```
/// use glia_providers::estimate::method;
/// assert_eq!(method("gpt-4o"), "tiktoken:o200k_base");
/// assert_eq!(method("llama3"), "bytes/3");
/// ```
pub fn method(model: &str) -> String {
    match tiktoken_rs::tokenizer::get_tokenizer(model) {
        Some(t) => format!("tiktoken:{}", encoding_name(t)),
        None => "bytes/3".into(),
    }
}

fn encoding_name(t: tiktoken_rs::tokenizer::Tokenizer) -> &'static str {
    use tiktoken_rs::tokenizer::Tokenizer::*;
    match t {
        O200kHarmony => "o200k_harmony",
        O200kBase => "o200k_base",
        Cl100kBase => "cl100k_base",
        P50kBase => "p50k_base",
        R50kBase => "r50k_base",
        P50kEdit => "p50k_edit",
        Gpt2 => "gpt2",
    }
}

/// Tokens in `text` for `model` (see the module doc).
///
/// ```
/// use glia_providers::estimate::tokens;
/// assert_eq!(tokens("llama3", "word word word"), 5); // 14 bytes / 3, rounded up
/// assert!(tokens("gpt-4o", "word word word") <= 4);
/// ```
pub fn tokens(model: &str, text: &str) -> u64 {
    if text.is_empty() {
        return 0;
    }
    match tiktoken_rs::bpe_for_model(model) {
        Ok(bpe) => bpe.encode_ordinary(text).len() as u64,
        Err(_) => (text.len() as u64).div_ceil(3),
    }
}

fn block_text(b: &ContentBlock) -> String {
    match b {
        ContentBlock::Text { text } => text.clone(),
        ContentBlock::ToolUse { name, input, .. } => format!("{name} {input}"),
        ContentBlock::ToolResult {
            content: ToolContent::Text(text),
            ..
        } => text.clone(),
        ContentBlock::ToolResult {
            content: ToolContent::Blocks(blocks),
            ..
        } => {
            let texts: Vec<&str> = blocks
                .iter()
                .filter_map(|b| match b {
                    ResultBlock::Text { text } => Some(text.as_str()),
                    ResultBlock::Image { .. } => None,
                })
                .collect();
            texts.join("\n")
        }
        ContentBlock::Thinking { thinking, .. } => thinking.clone(),
        ContentBlock::RedactedThinking { data } => data.clone(),
    }
}

/// Tokens counted for one image (its size in pixels is not read): about
/// Anthropic's upper bound ("Vision": about `width * height / 750` tokens
/// for an image scaled to at most about 1.15 megapixels, so about 1,600).
/// OpenAI prices images per 512-pixel tile and per model (85 + 170 a tile
/// for GPT-4o at high detail, at most 1,445), so this is in the right range
/// there, not an upper bound for every model.
pub const IMAGE_TOKENS: u64 = 1_600;

fn message_tokens(model: &str, m: &Message) -> u64 {
    let text: Vec<String> = m.content.iter().map(block_text).collect();
    let images = m
        .content
        .iter()
        .map(|b| match b {
            ContentBlock::ToolResult { content, .. } => content.images().count() as u64,
            _ => 0,
        })
        .sum::<u64>();
    PER_MESSAGE + tokens(model, &text.join("\n")) + images * IMAGE_TOKENS
}

/// Estimated input tokens of `request` (for its `model`).
pub fn input_tokens(request: &ModelRequest) -> u64 {
    let model = &request.model;
    let tools = if request.tools.is_empty() {
        0
    } else {
        let defs: Vec<String> = request
            .tools
            .iter()
            .map(|t| format!("{} {} {}", t.name, t.description, t.input_schema))
            .collect();
        tokens(model, &defs.join("\n"))
    };
    let system = if request.system.is_empty() {
        0
    } else {
        PER_MESSAGE + tokens(model, &request.system)
    };
    system
        + tools
        + request
            .messages
            .iter()
            .map(|m| message_tokens(model, m))
            .sum::<u64>()
        + REPLY_PRIMING
}

/// Estimated output tokens of the answer `message` from `model`.
pub fn output_tokens(model: &str, message: &Message) -> u64 {
    let text: Vec<String> = message.content.iter().map(block_text).collect();
    tokens(model, &text.join("\n"))
}

/// Fill the counts a decoder could not read. `usage` marked
/// [`Usage::estimated`] by a decoder has each count it did not see at zero:
/// input (when no input, cache-write or cache-read count was seen) and output
/// are estimated from `request` and `answer`. Usage not marked is left as
/// the provider reported it.
pub fn fill_missing(usage: &mut Usage, request: &ModelRequest, answer: &Message) {
    if !usage.estimated {
        return;
    }
    if usage.input_tokens == 0 && usage.cache_read_tokens == 0 && usage.cache_write_tokens == 0 {
        usage.input_tokens = input_tokens(request);
    }
    if usage.output_tokens == 0 {
        usage.output_tokens = output_tokens(&request.model, answer);
    }
}
