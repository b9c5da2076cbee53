//! Compaction: shrinking the context before a model call.
//!
//! The conversation is `goal turn, (assistant, user) × n`. Compactors remove
//! whole `(assistant, user)` units from the oldest end, so a tool use always
//! leaves together with its results and the goal always stays. The loop
//! records the resulting message list in `context.compacted`, so a resumed run
//! sees exactly the same context without compacting again.

use async_trait::async_trait;
use glia_proto::marker::{Insert, classify, neutralise};
use glia_proto::{
    CompactionSpec, CompactionStrategy, ContentBlock, LiveEvent, Message, Role, Usage,
};

use crate::provider::{ModelRequest, Provider, ProviderError, ToolChoice};

/// The outcome of a compaction.
#[derive(Debug, Clone, PartialEq)]
pub struct Compaction {
    /// The new conversation; ends with the same user turn as before.
    pub messages: Vec<Message>,
    /// Messages removed.
    pub removed: usize,
    /// Tokens a summarising call used.
    pub usage: Usage,
}

/// A context strategy.
#[async_trait]
pub trait Compactor: Send + Sync {
    /// Name recorded in `context.compacted`.
    fn name(&self) -> &str;
    /// True when `messages` should be compacted before the next call.
    fn should_compact(&self, messages: &[Message]) -> bool;
    /// Compact `messages`; may call `provider` with `model`.
    async fn compact(
        &self,
        messages: &[Message],
        provider: &dyn Provider,
        model: &str,
    ) -> Result<Compaction, ProviderError>;
}

/// The compactor a run's declarative [`CompactionSpec`] (`RunConfig::compaction`) describes.
pub fn from_spec(spec: &CompactionSpec) -> Box<dyn Compactor> {
    match spec.strategy {
        CompactionStrategy::DropOldest => Box::new(DropOldest {
            max_tokens: spec.max_tokens,
            keep_recent: spec.keep_recent,
        }),
        CompactionStrategy::Summarize => Box::new(Summarize {
            max_tokens: spec.max_tokens,
            keep_recent: spec.keep_recent,
        }),
    }
}

/// Rough token estimate: serialised JSON length / 4.
pub fn estimate_tokens(messages: &[Message]) -> u64 {
    (serde_json::to_string(messages).map_or(0, |s| s.len()) as u64).div_ceil(4)
}

/// How many leading `(assistant, user)` units to remove so that at most
/// `max_tokens` remain, never fewer than `keep_recent` units.
fn units_to_drop(messages: &[Message], max_tokens: u64, keep_recent: usize) -> usize {
    let units = messages.len().saturating_sub(1) / 2;
    let mut drop = 0;
    while drop + keep_recent < units {
        let mut rest = vec![messages[0].clone()];
        rest.extend_from_slice(&messages[1 + 2 * drop..]);
        if estimate_tokens(&rest) <= max_tokens {
            break;
        }
        drop += 1;
    }
    drop
}

/// The goal turn with earlier summary notes removed and `note` added.
fn head_with(messages: &[Message], note: String) -> Message {
    let mut head = messages[0].clone();
    head.content.retain(
        |b| !matches!(b, ContentBlock::Text { text } if classify(text) == Some(Insert::Summary)),
    );
    head.content.push(ContentBlock::Text { text: note });
    head
}

fn well_formed(messages: &[Message]) -> bool {
    messages.len() >= 3
        && messages.len() % 2 == 1
        && messages.iter().enumerate().all(|(i, m)| {
            m.role
                == if i % 2 == 0 {
                    Role::User
                } else {
                    Role::Assistant
                }
        })
}

/// Drop the oldest turns, keeping the goal and tool pairs whole.
#[derive(Debug, Clone, Copy)]
pub struct DropOldest {
    /// Compact when the estimate exceeds this many tokens.
    pub max_tokens: u64,
    /// Units (assistant turn + following user turn) always kept.
    pub keep_recent: usize,
}

#[async_trait]
impl Compactor for DropOldest {
    fn name(&self) -> &str {
        "drop_oldest"
    }

    fn should_compact(&self, messages: &[Message]) -> bool {
        well_formed(messages)
            && estimate_tokens(messages) > self.max_tokens
            && units_to_drop(messages, self.max_tokens, self.keep_recent) > 0
    }

    async fn compact(
        &self,
        messages: &[Message],
        _provider: &dyn Provider,
        _model: &str,
    ) -> Result<Compaction, ProviderError> {
        let drop = units_to_drop(messages, self.max_tokens, self.keep_recent);
        let note = Insert::Summary.wrap(&format!(
            "{} earlier messages were removed to fit the context window.",
            2 * drop
        ));
        let mut out = vec![head_with(messages, note)];
        out.extend_from_slice(&messages[1 + 2 * drop..]);
        Ok(Compaction {
            messages: out,
            removed: 2 * drop,
            usage: Usage::default(),
        })
    }
}

/// Summarise the oldest turns through the provider.
#[derive(Debug, Clone, Copy)]
pub struct Summarize {
    /// Compact when the estimate exceeds this many tokens.
    pub max_tokens: u64,
    /// Units always kept verbatim.
    pub keep_recent: usize,
}

#[async_trait]
impl Compactor for Summarize {
    fn name(&self) -> &str {
        "summarize"
    }

    fn should_compact(&self, messages: &[Message]) -> bool {
        DropOldest {
            max_tokens: self.max_tokens,
            keep_recent: self.keep_recent,
        }
        .should_compact(messages)
    }

    async fn compact(
        &self,
        messages: &[Message],
        provider: &dyn Provider,
        model: &str,
    ) -> Result<Compaction, ProviderError> {
        let drop = units_to_drop(messages, self.max_tokens, self.keep_recent);
        let mut transcript = String::new();
        for m in &messages[1..1 + 2 * drop] {
            for b in &m.content {
                let line = match b {
                    ContentBlock::Text { text } => format!("{:?}: {text}", m.role),
                    ContentBlock::ToolUse { name, input, .. } => {
                        format!("tool call {name}({input})")
                    }
                    ContentBlock::ToolResult {
                        content, is_error, ..
                    } => format!(
                        "tool {}: {}",
                        if *is_error { "error" } else { "result" },
                        content.to_text()
                    ),
                    ContentBlock::Thinking { .. } | ContentBlock::RedactedThinking { .. } => {
                        continue;
                    }
                };
                transcript.push_str(&line);
                transcript.push('\n');
            }
        }
        let request = ModelRequest {
            model: model.to_owned(),
            system: "Summarise this part of an agent's conversation in a few sentences. Keep facts, decisions, ids and open questions.".into(),
            messages: vec![Message::user(transcript)],
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            max_tokens: 1024,
        };
        let ignore = |_: LiveEvent| {};
        let response = provider.generate(&request, &ignore).await?;
        // The summary is the model's text: neutralised like all of it.
        let summary = response.message.text();
        let mut out = vec![head_with(
            messages,
            Insert::Summary.wrap(&neutralise(&summary)),
        )];
        out.extend_from_slice(&messages[1 + 2 * drop..]);
        Ok(Compaction {
            messages: out,
            removed: 2 * drop,
            usage: response.usage,
        })
    }
}
