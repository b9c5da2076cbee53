//! Recorded conversations in glia's shapes, and what replaying one expects.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use glia_agent::tool::ToolRegistry;
use glia_proto::{
    BudgetLimits, ContentBlock, InterruptedCall, Message, Policy, PolicyAction, Role, RunConfig,
    ToolSpec,
};

use crate::tools::{CallKey, RecordedTool};

/// One recorded conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    /// Stable id, unique in its recording (tau-bench: `{task_id}-{trial}`).
    /// A run replays it when its model is `replay:{id}`.
    pub id: String,
    /// The system prompt.
    pub system: String,
    /// The conversation as a glia run holds it: the goal (a user message)
    /// first, roles alternating, tool results in user turns.
    pub messages: Vec<Message>,
    /// For each of `messages`, the index of the message it came from in the
    /// source recording (for error messages).
    pub source: Vec<usize>,
}

/// What the customer does when a replayed run waits for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CustomerMove {
    /// Post this message; the recording goes on after the model's answer.
    Say(String),
    /// Close the run, first recording these last words when given: the
    /// recording ends here.
    Close(Option<String>),
    /// The run waits where the recording has no customer move; the text says
    /// where they part.
    Diverged(String),
}

impl Conversation {
    /// The goal: the first user message.
    pub fn goal(&self) -> String {
        self.messages.first().map(Message::text).unwrap_or_default()
    }

    /// Model turns in the recording.
    pub fn model_turns(&self) -> usize {
        self.messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count()
    }

    /// Customer messages after the goal.
    pub fn customer_turns(&self) -> usize {
        self.messages
            .iter()
            .skip(1)
            .filter(|m| {
                m.role == Role::User
                    && m.content
                        .iter()
                        .any(|b| matches!(b, ContentBlock::Text { .. }))
            })
            .count()
    }

    /// Tool calls in the recording.
    pub fn tool_calls(&self) -> usize {
        self.messages.iter().map(|m| m.tool_uses().count()).sum()
    }

    /// The recorded model turn that answers `history` (a request's
    /// messages), after checking `history` is exactly the recording up to
    /// that turn. `Err` names the first difference.
    pub fn answer(&self, history: &[Message]) -> Result<&Message, String> {
        let k = history.iter().filter(|m| m.role == Role::Assistant).count();
        let Some(at) = self
            .messages
            .iter()
            .enumerate()
            .filter(|(_, m)| m.role == Role::Assistant)
            .nth(k)
            .map(|(i, _)| i)
        else {
            self.check_prefix(history)?;
            return Err(format!(
                "the recording has no model turn after its {k} turns (message {})",
                history.len()
            ));
        };
        self.check_prefix(history)?;
        if history.len() != at {
            return Err(format!(
                "the request ends at message {} but the recording's model turn {} comes at message {at}; recorded next: {}",
                history.len(),
                k + 1,
                self.messages
                    .get(history.len())
                    .map_or_else(|| "nothing".into(), describe)
            ));
        }
        Ok(&self.messages[at])
    }

    /// Check that `messages` (a run's whole conversation) is a prefix of
    /// the recording. `Err` names the first difference.
    pub fn check_prefix(&self, messages: &[Message]) -> Result<(), String> {
        for (i, got) in messages.iter().enumerate() {
            let Some(want) = self.messages.get(i) else {
                return Err(format!(
                    "message {i}: the recording has ended, got {}",
                    describe(got)
                ));
            };
            if want != got {
                let source = self
                    .source
                    .get(i)
                    .map_or(String::new(), |s| format!(" (recording message {s})"));
                return Err(format!(
                    "message {i}{source}: expected {}, got {}",
                    describe(want),
                    describe(got)
                ));
            }
        }
        Ok(())
    }

    /// Check that `messages` is the whole recording.
    pub fn check_complete(&self, messages: &[Message]) -> Result<(), String> {
        self.check_prefix(messages)?;
        match self.messages.get(messages.len()) {
            None => Ok(()),
            Some(next) => Err(format!(
                "the run ended after message {}, the recording goes on with {}",
                messages.len(),
                describe(next)
            )),
        }
    }

    /// What the customer does when the run, holding `messages`, waits for
    /// them (at `awaiting_input`, or paused by its budget).
    pub fn customer_move(&self, messages: &[Message]) -> CustomerMove {
        if let Err(why) = self.check_prefix(messages) {
            return CustomerMove::Diverged(why);
        }
        let Some(next) = self.messages.get(messages.len()) else {
            return CustomerMove::Close(None);
        };
        let is_text = next.role == Role::User
            && next
                .content
                .iter()
                .all(|b| matches!(b, ContentBlock::Text { .. }));
        if !is_text {
            return CustomerMove::Diverged(format!(
                "the run waits for the customer at message {}, the recording goes on with {}",
                messages.len(),
                describe(next)
            ));
        }
        if messages.len() + 1 == self.messages.len() {
            CustomerMove::Close(Some(next.text()))
        } else {
            CustomerMove::Say(next.text())
        }
    }
}

/// One line about a message, clipped, for divergence reports:
/// `assistant: "text" + get_user_details#call_1 {"user_id":"…"}`.
pub fn describe(m: &Message) -> String {
    fn clip(s: &str) -> String {
        const MAX: usize = 160;
        let s = s.replace('\n', "\\n");
        if s.chars().count() > MAX {
            format!("{}…", s.chars().take(MAX).collect::<String>())
        } else {
            s
        }
    }
    let role = match m.role {
        Role::User => "user",
        Role::Assistant => "assistant",
    };
    let blocks: Vec<String> = m
        .content
        .iter()
        .map(|b| match b {
            ContentBlock::Text { text } => format!("{:?}", clip(text)),
            ContentBlock::ToolUse { id, name, input } => {
                format!("{name}#{id} {}", clip(&input.to_string()))
            }
            ContentBlock::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => {
                format!(
                    "{}result#{tool_use_id} {:?}",
                    if *is_error { "error " } else { "" },
                    clip(&content.to_text())
                )
            }
            ContentBlock::Thinking { thinking, .. } => format!("thinking {:?}", clip(thinking)),
            ContentBlock::RedactedThinking { .. } => "redacted thinking".into(),
        })
        .collect();
    format!("{role}: {}", blocks.join(" + "))
}

/// A set of recorded conversations, the tools they called and the outputs
/// those calls returned, with the settings that replay them.
#[derive(Debug, Clone)]
pub struct Recording {
    pub(crate) conversations: Vec<Arc<Conversation>>,
    pub(crate) tools: Vec<ToolSpec>,
    pub(crate) outputs: Arc<HashMap<CallKey, String>>,
    pub(crate) require_approval: Vec<String>,
    pub(crate) max_turns: Option<u64>,
}

/// Why a recording could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file is not the expected JSON.
    #[error("parsing {path}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// A conversation breaks the format's rules.
    #[error("conversation {conversation}, message {index}: {reason}")]
    Format {
        /// Conversation id.
        conversation: String,
        /// Index of the offending message in the source.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// Two recorded calls with the same id, tool and arguments returned
    /// different outputs, so a replayed call could not tell which to return.
    #[error("ambiguous recording: {call} returned different outputs in {first} and {second}")]
    Ambiguous {
        /// The call, `tool#id`.
        call: String,
        /// One conversation.
        first: String,
        /// The other.
        second: String,
    },
    /// A tool spec is unusable (its schema does not compile).
    #[error("tool {0}")]
    Tool(String),
}

impl Recording {
    /// The conversations, in recording order.
    pub fn conversations(&self) -> &[Arc<Conversation>] {
        &self.conversations
    }

    /// The conversation `id`.
    pub fn get(&self, id: &str) -> Option<&Arc<Conversation>> {
        self.conversations.iter().find(|c| c.id == id)
    }

    /// The recorded tools' specs (name, description, schema, idempotency,
    /// `return_direct`), in recording order.
    pub fn tool_specs(&self) -> &[ToolSpec] {
        &self.tools
    }

    /// The configuration that replays `conversation`: model
    /// `replay:{id}`, its system prompt, the recorded tools only, approval
    /// for the consequential tools (and for running one again after a
    /// crash), the original harness's turn limit, and conversational (the
    /// customer answers at `awaiting_input`).
    pub fn run_config(&self, conversation: &Conversation) -> RunConfig {
        let policies = self
            .require_approval
            .iter()
            .map(|tool| Policy {
                tool: tool.clone(),
                args: None,
                action: PolicyAction::RequireApproval,
            })
            .collect();
        RunConfig {
            model: format!("replay:{}", conversation.id),
            system: conversation.system.clone(),
            tools: Some(self.tools.iter().map(|t| t.name.clone()).collect()),
            policies,
            budget: BudgetLimits {
                max_turns: self.max_turns,
                ..BudgetLimits::default()
            },
            // Above any recorded turn, so no wrap-up notice changes a request.
            max_model_calls_per_turn: u32::try_from(self.max_turns.unwrap_or(64))
                .unwrap_or(u32::MAX)
                .saturating_add(1)
                .max(64),
            conversational: true,
            // A consequential call a crash interrupted is retried only on
            // a person's word (recorded tools are safe to run again).
            on_interrupted_call: InterruptedCall::RequireApproval,
            ..RunConfig::default()
        }
    }

    /// A registry of the recorded tools, each returning recorded outputs.
    pub fn tools(&self) -> Result<ToolRegistry, RecordingError> {
        let mut registry = ToolRegistry::default();
        for spec in &self.tools {
            registry
                .register_dyn(Arc::new(RecordedTool::new(
                    spec.clone(),
                    self.outputs.clone(),
                )))
                .map_err(|e| RecordingError::Tool(e.to_string()))?;
        }
        Ok(registry)
    }
}
