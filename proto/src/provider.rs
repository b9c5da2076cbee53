//! The provider boundary: one request in, one response out, deltas streamed
//! to a callback on the way. Tiny on purpose: a new provider is one file.
//!
//! The loop (`glia-agent`) calls a [`Provider`]; the real providers
//! (`glia-providers`) and the replay provider (`glia-replay`) implement it.
//! Every one of them depends on this module only, so building a provider
//! links no loop, no storage, no broker and no cache. [`ProviderKind`] names
//! a real provider's wire format, for the operator's catalogue and the
//! providers' configuration alike.

use std::collections::HashSet;

pub use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::repair::validate;
use crate::{LiveEvent, Message, Pricing, RefusedTurn, Retry, ToolSpec, Usage};

/// Which tool the model must (or may) call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// The model must call this tool.
    Tool {
        /// Tool name; must be in the request's tool list.
        name: String,
    },
}

/// One model call. `messages` are already repaired.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRequest {
    /// Model name.
    pub model: String,
    /// System prompt, the stable prefix.
    pub system: String,
    /// Conversation, starting and ending with a user turn.
    pub messages: Vec<Message>,
    /// Tools offered (frozen for the step).
    pub tools: Vec<ToolSpec>,
    /// Tool choice.
    pub tool_choice: ToolChoice,
    /// Output token cap.
    pub max_tokens: u32,
}

/// The model's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// Assistant message.
    pub message: Message,
    /// Tokens used by the call (every attempt and probe it took).
    pub usage: Usage,
    /// Provider stop reason: `end_turn`, `tool_use`, `max_tokens`, `refusal`, …
    pub stop_reason: String,
    /// Attempts that failed and were retried before this answer, in order.
    /// The loop records each as `model.retry` before `model.response`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retries: Vec<Retry>,
    /// Indices into the request's `messages` of messages the provider
    /// refused to process and that were replaced by an elision
    /// ([`crate::repair::elide`]) to get this answer. The loop records
    /// `message.elided` for the conversation messages they came from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub elided: Vec<usize>,
    /// Set on a refusal when the message the provider refused is one glia
    /// never elides ([`crate::repair::protected_turns`]): its index in
    /// the request's `messages` and which it is. The loop fails the run
    /// with it ([`crate::RejectedAnswer::refused_turn`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_turn: Option<RefusedTurn>,
}

impl ModelResponse {
    /// An answer with no retries and no elisions.
    pub fn new(message: Message, usage: Usage, stop_reason: impl Into<String>) -> Self {
        ModelResponse {
            message,
            usage,
            stop_reason: stop_reason.into(),
            retries: Vec::new(),
            elided: Vec::new(),
            refused_turn: None,
        }
    }
}

/// Why a model call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// The provider rejected the request as malformed (HTTP 400). Not retried.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// Network error, 5xx, overload: retrying later may succeed.
    #[error("transient provider failure: {message}")]
    Transient {
        /// What failed.
        message: String,
        /// The provider's wait hint (`retry-after`), in ms, when it gave one.
        retry_after_ms: Option<u64>,
    },
    /// The API key is missing, wrong or lacks permission (HTTP 401 / 403).
    /// Not retried: the run pauses until an operator fixes the key and
    /// resumes it.
    #[error("authentication failed: {0}")]
    Auth(String),
    /// Rate limited (429); retry after `retry_after_ms`.
    #[error("rate limited; retry after {retry_after_ms} ms")]
    RateLimited {
        /// Wait before the next call, ms.
        retry_after_ms: u64,
    },
    /// The account's spending cap is reached; retrying will not help.
    #[error("spending cap reached: {0}")]
    SpendCap(String),
    /// The provider's answer could not be mapped exactly (a stream that
    /// breaks its own grammar: a tool call's identity or arguments that are
    /// ambiguous, a delta for a block that never started, a repeated start).
    /// The provider retried it a bounded number of times; the run fails with
    /// this reason rather than act on a guess.
    #[error("malformed answer from the provider: {0}")]
    Malformed(String),
    /// The run names a provider (`RunConfig::provider`) this worker does not
    /// have: its catalogue has no such `[providers]` entry. Not retried: the
    /// run pauses until an operator adds it and resumes the run.
    #[error("this worker has no provider {0:?} (the catalogue's [providers] lacks it)")]
    NotConfigured(String),
    /// The script has no more responses (scripted provider only).
    #[error("script exhausted after {0} responses")]
    ScriptExhausted(usize),
    /// A replayed recording disagrees with the request (replay provider
    /// only): the text names the first differing message. Not retried; the
    /// run fails with it.
    #[error("replay diverged: {0}")]
    Diverged(String),
}

impl ProviderError {
    /// A transient failure with no wait hint.
    pub fn transient(message: impl Into<String>) -> Self {
        ProviderError::Transient {
            message: message.into(),
            retry_after_ms: None,
        }
    }

    /// True when the same call may succeed later.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ProviderError::Transient { .. } | ProviderError::RateLimited { .. }
        )
    }

    /// How long the provider asked us to wait before the next call, in ms.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            ProviderError::Transient { retry_after_ms, .. } => *retry_after_ms,
            ProviderError::RateLimited { retry_after_ms } => Some(*retry_after_ms),
            _ => None,
        }
    }
}

/// A model provider.
///
/// A provider that retries failed attempts itself reports each one in
/// [`ModelResponse::retries`] and tells live listeners to drop what the
/// failed attempt streamed with [`LiveEvent::ModelDiscard`].
///
/// The offline provider of tests and `glia dev` is `glia_agent`'s
/// `ScriptedProvider`; a minimal one:
///
/// ```
/// use glia_proto::provider::{ModelRequest, ModelResponse, Provider, ProviderError, async_trait};
/// use glia_proto::{LiveEvent, Message, Usage};
///
/// struct Echo;
///
/// #[async_trait]
/// impl Provider for Echo {
///     async fn generate(
///         &self,
///         request: &ModelRequest,
///         _live: &(dyn Fn(LiveEvent) + Send + Sync),
///     ) -> Result<ModelResponse, ProviderError> {
///         let last = request.messages.last().map(Message::text).unwrap_or_default();
///         Ok(ModelResponse::new(Message::assistant(last), Usage::default(), "end_turn"))
///     }
/// }
/// ```
#[async_trait]
pub trait Provider: Send + Sync {
    /// Send `request`; call `live` with each streamed delta as it arrives.
    async fn generate(
        &self,
        request: &ModelRequest,
        live: &(dyn Fn(LiveEvent) + Send + Sync),
    ) -> Result<ModelResponse, ProviderError>;

    /// The prices of calls to `model`, for runs whose config names none (an
    /// operator's price table). Default: none, so such calls cost nothing.
    fn pricing(&self, model: &str) -> Option<Pricing> {
        let _ = model;
        None
    }

    /// Whether `model` takes images in a request (a tool result's image
    /// blocks). When not, the loop's request carries a marked text
    /// placeholder naming each image's media type and size instead
    /// ([`crate::ToolContent::without_images`]); the log keeps the image.
    /// Default true (Anthropic and OpenAI models take images); an operator
    /// marks a text-only provider in the catalogue (`images = false`).
    fn takes_images(&self, model: &str) -> bool {
        let _ = model;
        true
    }
}

/// Check a request the way the provider APIs do. The message rules are
/// [`crate::repair::validate`]'s; on top: tool names match
/// `^[a-zA-Z0-9_-]{1,64}$` and are unique, a forced tool is in the list, the
/// output cap is positive.
pub fn validate_request(request: &ModelRequest) -> Result<(), String> {
    validate(&request.messages).map_err(|e| e.to_string())?;
    let mut names = HashSet::new();
    for t in &request.tools {
        let ok = !t.name.is_empty()
            && t.name.len() <= 64
            && t.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !ok {
            return Err(format!("tools: invalid tool name {:?}", t.name));
        }
        if !names.insert(t.name.as_str()) {
            return Err(format!("tools: tool names must be unique ({})", t.name));
        }
        if !t.input_schema.is_object() {
            return Err(format!("tools.{}: input_schema must be an object", t.name));
        }
    }
    if let ToolChoice::Tool { name } = &request.tool_choice
        && !names.contains(name.as_str())
    {
        return Err(format!(
            "tool_choice: tool {name:?} is not in the tool list"
        ));
    }
    if request.max_tokens == 0 {
        return Err("max_tokens: must be at least 1".into());
    }
    Ok(())
}

/// Which wire format a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// Anthropic Messages API (`POST {base}/v1/messages`).
    Anthropic,
    /// OpenAI Chat Completions and compatible servers: OpenAI, vLLM, Ollama,
    /// llama.cpp server, OpenRouter (`POST {base}/chat/completions`).
    Openai,
}

impl ProviderKind {
    /// `anthropic` or `openai`: the name used in price tables, metrics and
    /// rate-limit keys.
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Openai => "openai",
        }
    }

    /// The public endpoint used when the config names no base URL.
    pub fn default_base_url(self) -> &'static str {
        match self {
            ProviderKind::Anthropic => "https://api.anthropic.com",
            ProviderKind::Openai => "https://api.openai.com/v1",
        }
    }

    /// The environment variable read when the config names none:
    /// `ANTHROPIC_API_KEY` or `OPENAI_API_KEY`.
    pub fn default_key_env(self) -> &'static str {
        match self {
            ProviderKind::Anthropic => "ANTHROPIC_API_KEY",
            ProviderKind::Openai => "OPENAI_API_KEY",
        }
    }
}

/// A provider kind [`ProviderKind::from_str`](std::str::FromStr) does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown provider kind {0:?}: expected anthropic or openai")]
pub struct UnknownProviderKind(pub String);

impl std::str::FromStr for ProviderKind {
    type Err = UnknownProviderKind;

    /// `anthropic`, or `openai` (also `openai-compatible`, `vllm`, `ollama`,
    /// `llamacpp`, `openrouter`, which speak the same wire format).
    fn from_str(s: &str) -> Result<Self, UnknownProviderKind> {
        match s.to_ascii_lowercase().as_str() {
            "anthropic" => Ok(ProviderKind::Anthropic),
            "openai" | "openai-compatible" | "vllm" | "ollama" | "llamacpp" | "llama.cpp"
            | "openrouter" => Ok(ProviderKind::Openai),
            other => Err(UnknownProviderKind(other.to_owned())),
        }
    }
}
