//! The replay provider: a recording's model turns, served after checking
//! the request against the recording.

use std::collections::HashMap;
use std::sync::Arc;

use glia_proto::provider::async_trait;
use glia_proto::provider::{
    ModelRequest, ModelResponse, Provider, ProviderError, validate_request,
};
use glia_proto::{ContentBlock, LiveEvent, Usage};

use crate::{Conversation, Recording};

/// Serves recorded conversations to runs whose model is `replay:{id}`.
///
/// Stateless: the turn served is the recording's model turn after as many
/// turns as the request already holds, so any worker answers the same way.
/// Before answering it checks the request: the system prompt, the tools
/// offered (by name) and every message against the recording; a difference
/// fails the call with [`ProviderError::Diverged`] naming the first differing
/// message. A request a real provider would reject, or for a model that is
/// not `replay:{id}` of a known conversation, fails with
/// [`ProviderError::InvalidRequest`].
///
/// Usage is estimated (4 characters a token), since recordings carry none.
#[derive(Debug, Clone)]
pub struct ReplayProvider {
    conversations: HashMap<String, Arc<Conversation>>,
    tools: Vec<String>,
}

impl ReplayProvider {
    /// A provider for `conversations`, whose runs are offered `tools`.
    pub fn new(
        conversations: impl IntoIterator<Item = Arc<Conversation>>,
        mut tools: Vec<String>,
    ) -> Self {
        tools.sort();
        ReplayProvider {
            conversations: conversations
                .into_iter()
                .map(|c| (c.id.clone(), c))
                .collect(),
            tools,
        }
    }
}

// Here rather than with the rest of `Recording`'s methods, so that the
// recording module does not depend on the provider (which uses
// `Conversation`).
impl Recording {
    /// The provider that serves every conversation of this recording.
    pub fn provider(&self) -> ReplayProvider {
        ReplayProvider::new(
            self.conversations.iter().cloned(),
            self.tools.iter().map(|t| t.name.clone()).collect(),
        )
    }
}

fn estimate_tokens(chars: usize) -> u64 {
    (chars as u64).div_ceil(4)
}

#[async_trait]
impl Provider for ReplayProvider {
    async fn generate(
        &self,
        request: &ModelRequest,
        live: &(dyn Fn(LiveEvent) + Send + Sync),
    ) -> Result<ModelResponse, ProviderError> {
        validate_request(request).map_err(ProviderError::InvalidRequest)?;
        let Some(id) = request.model.strip_prefix("replay:") else {
            return Err(ProviderError::InvalidRequest(format!(
                "model {:?} is not replay:ID",
                request.model
            )));
        };
        let conversation = self.conversations.get(id).ok_or_else(|| {
            ProviderError::InvalidRequest(format!("no recorded conversation {id:?}"))
        })?;
        if request.system != conversation.system {
            return Err(ProviderError::Diverged(format!(
                "conversation {id}: the system prompt differs from the recording"
            )));
        }
        let mut offered: Vec<String> = request.tools.iter().map(|t| t.name.clone()).collect();
        offered.sort();
        if offered != self.tools {
            return Err(ProviderError::Diverged(format!(
                "conversation {id}: tools offered {offered:?}, recorded {:?}",
                self.tools
            )));
        }
        let answer = conversation
            .answer(&request.messages)
            .map_err(|why| ProviderError::Diverged(format!("conversation {id}: {why}")))?;
        let text = answer.text();
        if !text.is_empty() {
            live(LiveEvent::ModelDelta {
                channel: "text".into(),
                delta: text.clone(),
            });
        }
        let calls = answer.tool_uses().count();
        let request_chars = request.system.len()
            + request
                .messages
                .iter()
                .map(|m| m.content.iter().map(block_chars).sum::<usize>())
                .sum::<usize>();
        let usage = Usage {
            input_tokens: estimate_tokens(request_chars),
            output_tokens: estimate_tokens(answer.content.iter().map(block_chars).sum()),
            estimated: true,
            ..Usage::default()
        };
        Ok(ModelResponse::new(
            answer.clone(),
            usage,
            if calls > 0 { "tool_use" } else { "end_turn" },
        ))
    }
}

fn block_chars(b: &ContentBlock) -> usize {
    match b {
        ContentBlock::Text { text } => text.len(),
        ContentBlock::ToolUse { name, input, .. } => name.len() + input.to_string().len(),
        ContentBlock::ToolResult { content, .. } => content.to_text().len(),
        ContentBlock::Thinking { thinking, .. } => thinking.len(),
        ContentBlock::RedactedThinking { data } => data.len(),
    }
}
