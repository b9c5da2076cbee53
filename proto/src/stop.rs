//! Stop reasons are outcomes: how the loop reads why a model stopped.
//!
//! The provider adapters normalise each API's stop / finish reason to one
//! word (`model.response`'s `stop_reason`); [`StopClass::of`] sorts that word
//! and the answer into a class, and the run's [`StopPolicy`]
//! (`RunConfig::stop_reasons`) says what the loop does with it. Only a
//! finished answer or a turn that calls tools proceeds; every other class is
//! recorded as a rejected answer (`model.response` with `rejected`) and the
//! loop re-asks, pauses or fails the run — it never completes as succeeded.
//!
//! | Anthropic `stop_reason` | OpenAI `finish_reason` | `stop_reason` recorded | class | default |
//! |---|---|---|---|---|
//! | `end_turn` | `stop`, or none before `[DONE]` | `end_turn` | answer (empty: `empty`) | proceed (`empty`: reask) |
//! | `stop_sequence` | — | `stop_sequence` | answer (empty: `empty`) | proceed (`empty`: reask) |
//! | `tool_use` | `tool_calls`, `function_call`, `stop` with calls | `tool_use` | tool_use | proceed |
//! | `max_tokens` | `length` | `max_tokens` | truncated | reask |
//! | `pause_turn` | — | `pause_turn` | truncated | reask |
//! | `refusal` | `delta.refusal` text | `refusal` | refusal | fail |
//! | — | `content_filter` | `content_filter` | content_filter | fail |
//! | `model_context_window_exceeded` | — | `model_context_window_exceeded` | context_window | fail |
//! | anything else | anything else | as sent | unknown | fail |
//! | — | `error` (gateways) | — (a provider error, retried) | — | — |
//!
//! A `finish_reason: "error"` is not a stop: the OpenAI adapter turns it into
//! a retryable provider error, so an errored stream is retried and, if it
//! keeps failing, leaves the run runnable for a later attempt.
//!
//! A re-ask appends a marked notice (`⟦glia:re-ask⟧`) to the conversation's
//! last user turn and calls the model again; it shares `max_reasks` with the
//! output guardrails, and once they are used up the answer fails the run.
//! A pause parks the run at `paused` ([`crate::PauseReason::ModelStop`]); a
//! resume calls the model again.

use serde::{Deserialize, Serialize};

use crate::Message;

/// What a stop reason means for the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopClass {
    /// A finished answer with text (`end_turn`, `stop_sequence`).
    Answer,
    /// The model called tools (`tool_use`, or any finished turn with calls).
    ToolUse,
    /// The output cap or a server pause cut the answer off (`max_tokens`,
    /// `pause_turn`): any tool call in it may be incomplete.
    Truncated,
    /// A finished turn with no text and no tool call.
    Empty,
    /// The model refused (`refusal`).
    Refusal,
    /// The provider's content filter removed the answer (`content_filter`).
    ContentFilter,
    /// The conversation no longer fits the model's context window
    /// (`model_context_window_exceeded`).
    ContextWindow,
    /// A stop reason glia does not know.
    Unknown,
}

impl StopClass {
    /// The class of an answer `message` that stopped for `stop_reason`
    /// (normalised by the adapter; see the module table).
    ///
    /// ```
    /// use glia_proto::{Message, stop::StopClass};
    /// assert_eq!(StopClass::of("end_turn", &Message::assistant("4")), StopClass::Answer);
    /// assert_eq!(StopClass::of("end_turn", &Message::assistant(" ")), StopClass::Empty);
    /// assert_eq!(StopClass::of("max_tokens", &Message::assistant("The answer is par")), StopClass::Truncated);
    /// assert_eq!(StopClass::of("eos", &Message::assistant("4")), StopClass::Unknown);
    /// ```
    pub fn of(stop_reason: &str, message: &Message) -> StopClass {
        let calls = message.tool_uses().next().is_some();
        let text = !message.text().trim().is_empty();
        match stop_reason {
            "end_turn" | "stop_sequence" | "tool_use" if calls => StopClass::ToolUse,
            "end_turn" | "stop_sequence" | "tool_use" if text => StopClass::Answer,
            "end_turn" | "stop_sequence" | "tool_use" => StopClass::Empty,
            "max_tokens" | "pause_turn" => StopClass::Truncated,
            "refusal" => StopClass::Refusal,
            "content_filter" => StopClass::ContentFilter,
            "model_context_window_exceeded" => StopClass::ContextWindow,
            _ => StopClass::Unknown,
        }
    }

    /// The class as a short stable label (`answer`, `tool_use`, `truncated`,
    /// `empty`, `refusal`, `content_filter`, `context_window`, `unknown`):
    /// a bounded metrics label.
    pub fn label(self) -> &'static str {
        match self {
            StopClass::Answer => "answer",
            StopClass::ToolUse => "tool_use",
            StopClass::Truncated => "truncated",
            StopClass::Empty => "empty",
            StopClass::Refusal => "refusal",
            StopClass::ContentFilter => "content_filter",
            StopClass::ContextWindow => "context_window",
            StopClass::Unknown => "unknown",
        }
    }

    /// Why an answer of this class was not accepted, in words for the run's
    /// error, the re-ask and the operator.
    pub fn describe(self) -> &'static str {
        match self {
            StopClass::Answer | StopClass::ToolUse => "the answer was accepted",
            StopClass::Truncated => {
                "the answer was cut off by the output limit before it was complete"
            }
            StopClass::Empty => "the answer was empty",
            StopClass::Refusal => "the model refused to answer",
            StopClass::ContentFilter => "the provider's content filter withheld the answer",
            StopClass::ContextWindow => {
                "the conversation no longer fits the model's context window"
            }
            StopClass::Unknown => "the model stopped for a reason glia does not know",
        }
    }
}

/// What the loop does with an answer that is not a finished turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum StopAction {
    /// Tell the model why (a marked notice in the last user turn) and call it
    /// again, while the run has re-asks left (`max_reasks`); then fail.
    Reask,
    /// Park the run at `paused` ([`crate::PauseReason::ModelStop`]) for an
    /// operator; a resume calls the model again.
    Pause,
    /// Fail the run with the reason.
    Fail,
}

impl StopAction {
    /// `reask`, `pause` or `fail`.
    pub fn label(self) -> &'static str {
        match self {
            StopAction::Reask => "reask",
            StopAction::Pause => "pause",
            StopAction::Fail => "fail",
        }
    }
}

/// The run's policy for answers that are not a finished turn
/// (`RunConfig::stop_reasons`). Each field has a safe default; no class can
/// be made to proceed.
///
/// JSON example: `{"truncated": "pause", "refusal": "fail"}` (missing fields
/// keep their defaults; unknown fields are refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct StopPolicy {
    /// `max_tokens` / `length` / `pause_turn`. Default: re-ask.
    pub truncated: StopAction,
    /// A finished turn with no text and no tool call. Default: re-ask.
    pub empty: StopAction,
    /// `refusal`. Default: fail.
    pub refusal: StopAction,
    /// `content_filter`. Default: fail.
    pub content_filter: StopAction,
    /// `model_context_window_exceeded`. Default: fail.
    pub context_window: StopAction,
    /// Any stop reason glia does not know. Default: fail.
    pub unknown: StopAction,
}

impl Default for StopPolicy {
    fn default() -> Self {
        StopPolicy {
            truncated: StopAction::Reask,
            empty: StopAction::Reask,
            refusal: StopAction::Fail,
            content_filter: StopAction::Fail,
            context_window: StopAction::Fail,
            unknown: StopAction::Fail,
        }
    }
}

impl StopPolicy {
    /// What to do with an answer of `class`: `None` proceeds (an answer or
    /// tool use).
    ///
    /// ```
    /// use glia_proto::stop::{StopAction, StopClass, StopPolicy};
    /// let p = StopPolicy::default();
    /// assert_eq!(p.action(StopClass::ToolUse), None);
    /// assert_eq!(p.action(StopClass::Truncated), Some(StopAction::Reask));
    /// assert_eq!(p.action(StopClass::Unknown), Some(StopAction::Fail));
    /// ```
    pub fn action(&self, class: StopClass) -> Option<StopAction> {
        match class {
            StopClass::Answer | StopClass::ToolUse => None,
            StopClass::Truncated => Some(self.truncated),
            StopClass::Empty => Some(self.empty),
            StopClass::Refusal => Some(self.refusal),
            StopClass::ContentFilter => Some(self.content_filter),
            StopClass::ContextWindow => Some(self.context_window),
            StopClass::Unknown => Some(self.unknown),
        }
    }
}

/// An answer the loop did not accept (`model.response`'s `rejected`): its
/// message stays in the event but is not added to the conversation, and its
/// tool calls are not run; its usage and cost count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectedAnswer {
    /// Why (from the stop reason and the answer).
    pub class: StopClass,
    /// What the loop does about it.
    pub action: StopAction,
    /// For [`StopAction::Reask`]: the marked notice appended to the last user
    /// turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reask: Option<String>,
    /// For a refusal: the provider refused a message refusal isolation
    /// never elides (the goal, the latest human turn), so the run fails with
    /// this as its reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_turn: Option<RefusedTurn>,
}

/// A message of the conversation the provider refused to process and that
/// glia never elides ([`crate::repair::protected_turns`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedTurn {
    /// Index of the message in the run's conversation
    /// ([`crate::RunState::messages`]).
    pub index: usize,
    /// Which protected message it is.
    pub turn: ProtectedTurn,
}

/// A message refusal isolation never elides: eliding it would answer a
/// request other than the one the run was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProtectedTurn {
    /// The goal: the conversation's first message.
    Goal,
    /// The latest user turn that holds a person's text (not glia's marked
    /// text, not only tool results).
    LatestHumanTurn,
}

impl ProtectedTurn {
    /// `the goal` / `the latest human turn`.
    pub fn describe(self) -> &'static str {
        match self {
            ProtectedTurn::Goal => "the goal",
            ProtectedTurn::LatestHumanTurn => "the latest human turn",
        }
    }
}
