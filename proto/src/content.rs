//! Content blocks, messages and token usage: the conversation's vocabulary.
//!
//! The shapes follow the Anthropic Messages API (tool results travel in a user
//! turn), so the wire format and the stored format need no translation. Every
//! type here is a plain value: cloning is the only way to "change" one, and a
//! JSON round trip is exact (property-tested in `tests/roundtrip.rs`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who said a message. Tool results are sent as a `user` turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The person (or the harness speaking for them: goals, tool results, notices).
    User,
    /// The model.
    Assistant,
}

/// One block of a message. A closed set: match on it, there are no others.
///
/// JSON: `{"type": "text", "text": "…"}`, `{"type": "tool_use", "id": "…",
/// "name": "…", "input": {…}}`, `{"type": "tool_result", "tool_use_id": "…",
/// "content": "…", "is_error": false}`, `{"type": "thinking", "thinking": "…",
/// "signature": "…"}`, `{"type": "redacted_thinking", "data": "…"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// Plain text.
    Text {
        /// The text; providers reject empty text blocks.
        text: String,
    },
    /// The model asks for a tool call.
    ToolUse {
        /// Call id, unique within the run (the provider's `toolu_…` / `call_…`).
        id: String,
        /// Tool name as listed in the request.
        name: String,
        /// Arguments, a JSON object.
        input: Value,
    },
    /// The answer to a [`ContentBlock::ToolUse`], in the next user turn.
    ToolResult {
        /// The `id` of the tool use it answers.
        tool_use_id: String,
        /// Result text (JSON results are serialised).
        content: String,
        /// True when the call failed; the model sees the text as an error.
        #[serde(default)]
        is_error: bool,
    },
    /// Model reasoning with the provider's signature. Kept in the log, never
    /// sent back for earlier turns (see [`crate::repair`]).
    Thinking {
        /// The reasoning text.
        thinking: String,
        /// Opaque provider signature; empty when the provider gives none.
        #[serde(default)]
        signature: String,
    },
    /// Model reasoning the provider encrypted (Anthropic's
    /// `redacted_thinking`): opaque, never shown, but sent back unchanged
    /// with the last assistant turn like [`ContentBlock::Thinking`].
    RedactedThinking {
        /// The provider's encrypted payload.
        data: String,
    },
}

impl ContentBlock {
    /// A text block.
    pub fn text(text: impl Into<String>) -> Self {
        ContentBlock::Text { text: text.into() }
    }
}

/// One turn of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Speaker.
    pub role: Role,
    /// Blocks in order; never empty in a valid request.
    pub content: Vec<ContentBlock>,
}

impl Message {
    /// A user message with one text block.
    ///
    /// ```
    /// use glia_proto::{Message, Role};
    /// let m = Message::user("Where is my refund?");
    /// assert_eq!(m.role, Role::User);
    /// assert_eq!(m.text(), "Where is my refund?");
    /// ```
    pub fn user(text: impl Into<String>) -> Self {
        Message { role: Role::User, content: vec![ContentBlock::text(text)] }
    }

    /// An assistant message with one text block.
    pub fn assistant(text: impl Into<String>) -> Self {
        Message { role: Role::Assistant, content: vec![ContentBlock::text(text)] }
    }

    /// The concatenated text blocks (thinking excluded), joined by `\n`.
    pub fn text(&self) -> String {
        let parts: Vec<&str> = self
            .content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        parts.join("\n")
    }

    /// The tool uses in this message, in order: `(id, name, input)`.
    pub fn tool_uses(&self) -> impl Iterator<Item = (&str, &str, &Value)> {
        self.content.iter().filter_map(|b| match b {
            ContentBlock::ToolUse { id, name, input } => Some((id.as_str(), name.as_str(), input)),
            _ => None,
        })
    }
}

/// Tokens one model call consumed, by kind. Counts are tokens, never negative.
///
/// `input_tokens` excludes cached tokens; `cache_write_tokens` and
/// `cache_read_tokens` are the prompt-caching parts of the input (Anthropic's
/// `cache_creation_input_tokens` / `cache_read_input_tokens`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Usage {
    /// Uncached input tokens.
    pub input_tokens: u64,
    /// Generated tokens (thinking included).
    pub output_tokens: u64,
    /// Input tokens written to the prompt cache.
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// Input tokens read from the prompt cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// True when some of these counts are glia's estimate, not the
    /// provider's report (a server that sent no usage; see
    /// `glia_providers::estimate`). Budgets and tenant caps count estimated
    /// tokens like reported ones. A sum is estimated when any part is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
}

impl Usage {
    /// Sum of every kind.
    pub fn total(&self) -> u64 {
        self.input_tokens + self.output_tokens + self.cache_write_tokens + self.cache_read_tokens
    }
}

impl std::ops::Add for Usage {
    type Output = Usage;
    fn add(self, o: Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens.saturating_add(o.input_tokens),
            output_tokens: self.output_tokens.saturating_add(o.output_tokens),
            cache_write_tokens: self.cache_write_tokens.saturating_add(o.cache_write_tokens),
            cache_read_tokens: self.cache_read_tokens.saturating_add(o.cache_read_tokens),
            estimated: self.estimated || o.estimated,
        }
    }
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, o: Usage) {
        *self = *self + o;
    }
}
