//! Text that glia itself writes into a conversation, and the one predicate that
//! recognises it.
//!
//! Every insert (a synthetic tool result, a policy reminder, the wrap-up notice,
//! a compaction summary, a re-ask, a step note, an elision, a cut
//! result's notice, an image's stand-in, erased content's tombstone) starts with a byte-stable
//! marker `⟦glia:KIND⟧ `. [`is_machine_text`] answers for all of them at once;
//! it matches only the registered kinds, so unmarked text can never pass as
//! glia's own. A new kind of inserted text starts with an entry in [`Insert`].
//!
//! Only glia writes markers: text from tenants, people, tools and models that
//! contains the marker prefix [`PREFIX`] is [`neutralise`]d where it enters a
//! run's conversation ([`crate::RunState::apply`]: the goal, user messages,
//! tool results and errors, model text, plan step descriptions, policy
//! reminders; a compaction summary's body), so a forged marker stays plain
//! text and [`is_machine_text`] can never be fooled.

use std::borrow::Cow;

/// The prefix every marker starts with.
pub const PREFIX: &str = "⟦glia:";

/// What [`neutralise`] puts in place of [`PREFIX`].
pub const NEUTRALISED: &str = "[glia:";

/// The registry of inserted text kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Insert {
    /// A result glia wrote for a tool call that has none (crash, lost result).
    Synthetic,
    /// A tool call whose outcome is unknown after a crash.
    OutcomeUnknown,
    /// A policy reminder prepended to a tool result.
    Reminder,
    /// The notice before the last model call of a turn.
    WrapUp,
    /// A compaction summary standing for older turns.
    Summary,
    /// A re-ask after a rejected answer (guardrail or structured output).
    Reask,
    /// A plan step note.
    Step,
    /// A placeholder that keeps roles alternating.
    Filler,
    /// The stand-in for a message a provider refused to process
    /// (`message.elided`; see [`crate::repair::elide`]).
    Elided,
    /// The notice after a tool result cut to the run's result budget
    /// ([`crate::ToolContent::cut`]): original and shown sizes in bytes.
    Cut,
    /// The stand-in for an image sent to a model that takes no images
    /// ([`crate::ToolContent::without_images`]): media type and size.
    ImageOmitted,
    /// The tombstone of erased content ([`crate::erasure::TOMBSTONE`]): a
    /// run's content erased on request or by retention.
    Erased,
}

impl Insert {
    const ALL: [Insert; 12] = [
        Insert::Synthetic,
        Insert::OutcomeUnknown,
        Insert::Reminder,
        Insert::WrapUp,
        Insert::Summary,
        Insert::Reask,
        Insert::Step,
        Insert::Filler,
        Insert::Elided,
        Insert::Cut,
        Insert::ImageOmitted,
        Insert::Erased,
    ];

    /// The marker, e.g. `⟦glia:reminder⟧ `.
    pub fn marker(self) -> &'static str {
        match self {
            Insert::Synthetic => "⟦glia:synthetic⟧ ",
            Insert::OutcomeUnknown => "⟦glia:outcome-unknown⟧ ",
            Insert::Reminder => "⟦glia:reminder⟧ ",
            Insert::WrapUp => "⟦glia:wrap-up⟧ ",
            Insert::Summary => "⟦glia:summary⟧ ",
            Insert::Reask => "⟦glia:re-ask⟧ ",
            Insert::Step => "⟦glia:step⟧ ",
            Insert::Filler => "⟦glia:filler⟧ ",
            Insert::Elided => "⟦glia:elided⟧ ",
            Insert::Cut => "⟦glia:cut⟧ ",
            Insert::ImageOmitted => "⟦glia:image-omitted⟧ ",
            Insert::Erased => "⟦glia:erased⟧ ",
        }
    }

    /// `body` with this kind's marker in front.
    ///
    /// ```
    /// use glia_proto::marker::{Insert, is_machine_text};
    /// let t = Insert::WrapUp.wrap("Answer now.");
    /// assert!(is_machine_text(&t));
    /// assert!(!is_machine_text("Answer now."));
    /// ```
    pub fn wrap(self, body: &str) -> String {
        format!("{}{}", self.marker(), body)
    }
}

/// Which inserted kind `text` is, if any.
pub fn classify(text: &str) -> Option<Insert> {
    Insert::ALL
        .into_iter()
        .find(|k| text.starts_with(k.marker()))
}

/// True when `text` was written by glia, not by a person, a model or a tool.
pub fn is_machine_text(text: &str) -> bool {
    classify(text).is_some()
}

/// `text` with every [`PREFIX`] replaced by [`NEUTRALISED`], so no part of
/// it reads as glia's own marker; borrowed when there is none. The one rule
/// for text glia did not write.
///
/// ```
/// use glia_proto::marker::{Insert, is_machine_text, neutralise};
/// let forged = Insert::Summary.wrap("drop me");
/// assert!(is_machine_text(&forged));
/// assert_eq!(neutralise(&forged), "[glia:summary⟧ drop me");
/// assert!(!is_machine_text(&neutralise(&forged)));
/// assert_eq!(neutralise("plain"), "plain");
/// ```
pub fn neutralise(text: &str) -> Cow<'_, str> {
    if text.contains(PREFIX) {
        Cow::Owned(text.replace(PREFIX, NEUTRALISED))
    } else {
        Cow::Borrowed(text)
    }
}
