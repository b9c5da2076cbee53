//! Request repair: turn any stored history into a message list a provider
//! accepts.
//!
//! Histories break: a worker dies between a tool call and its result, a result
//! arrives for a call that was compacted away, thinking from old turns piles
//! up. Repair happens when the prompt is built, never in the log, and is a
//! pure function, so the same history always gives byte-identical requests.
//!
//! The output satisfies the providers' rules (Anthropic Messages and OpenAI
//! Chat Completions alike): it starts and ends with a user turn, roles
//! alternate, no message or text block is empty, every tool use is answered in
//! the very next user turn (answers first, in call order), there are no orphan
//! results, tool use ids are unique within their turn, and only the last
//! assistant turn keeps its thinking blocks (plain and redacted). An id may
//! come back in a later turn: some providers number call ids per response
//! (`call_0`), and recorded conversations reuse them; an adapter whose API
//! wants ids unique across the request renames repeats on the wire.
//!
//! Images travel only inside tool results ([`ToolContent::Blocks`]). Repair
//! keeps an image the APIs take ([`ImageSource::check`]: PNG, JPEG, GIF or
//! WebP, base64 within [`crate::MAX_IMAGE_BASE64_LEN`]), fixes a media type
//! its bytes contradict, and replaces any other with a text block saying
//! what it was and why it is left out ([`ImageSource::usable`]); empty text
//! blocks inside a result are dropped.
//!
//! [`elide`] is the other text glia writes in place of history: the marked
//! stand-in for a message a provider refused to process.

use std::collections::HashSet;

use crate::marker::{Insert, is_machine_text};
use crate::{ContentBlock, ImageSource, Message, ProtectedTurn, ResultBlock, Role, ToolContent};

/// The text of the synthetic error result given to a tool use that has no
/// recorded result.
pub fn synthetic_result_text() -> String {
    Insert::Synthetic.wrap("No result was recorded for this tool call (the run was interrupted before it finished). Its outcome is unknown.")
}

/// Build a provider-valid message list from `history`. See the module docs for
/// the rules.
///
/// ```
/// use glia_proto::{ContentBlock, Message, Role, repair::repair};
/// let call = Message { role: Role::Assistant, content: vec![ContentBlock::ToolUse {
///     id: "t1".into(), name: "lookup".into(), input: serde_json::json!({}) }] };
/// // A crash left the call without a result:
/// let fixed = repair(&[Message::user("find it"), call]);
/// assert_eq!(fixed.len(), 3);
/// assert!(matches!(&fixed[2].content[0], ContentBlock::ToolResult { is_error: true, .. }));
/// ```
pub fn repair(history: &[Message]) -> Vec<Message> {
    repair_traced(history).0
}

/// [`repair`], also telling where each output message came from:
/// `origins[k]` lists, in order, the indices of the `history` messages whose
/// blocks make up output message `k` (several when turns were merged; empty
/// for a turn glia wrote: a filler, or synthetic results only).
///
/// ```
/// use glia_proto::{Message, repair::repair_traced};
/// let (messages, origins) = repair_traced(&[Message::assistant("hi"), Message::user("a"), Message::user("b")]);
/// assert_eq!(messages.len(), 3); // a filler user turn first
/// assert_eq!(origins, vec![vec![], vec![0], vec![1, 2]]);
/// ```
pub fn repair_traced(history: &[Message]) -> (Vec<Message>, Vec<Vec<usize>>) {
    let last_assistant = history.iter().rposition(|m| m.role == Role::Assistant);
    let mut out: Vec<Message> = Vec::with_capacity(history.len() + 2);
    let mut origins: Vec<Vec<usize>> = Vec::with_capacity(history.len() + 2);
    let mut seen_ids: HashSet<String> = HashSet::new();
    let mut open: Vec<String> = Vec::new();

    for (i, m) in history.iter().enumerate() {
        match m.role {
            Role::Assistant => {
                // Ids are unique per turn; this message starts a new turn
                // unless it merges into the assistant turn before it.
                if !open.is_empty() || out.last().is_none_or(|m| m.role == Role::User) {
                    seen_ids.clear();
                }
                let blocks: Vec<ContentBlock> =
                    m.content
                        .iter()
                        .filter(|b| match b {
                            ContentBlock::Text { text } => !text.is_empty(),
                            ContentBlock::Thinking { .. }
                            | ContentBlock::RedactedThinking { .. } => Some(i) == last_assistant,
                            ContentBlock::ToolUse { id, .. } => {
                                !id.is_empty() && seen_ids.insert(id.clone())
                            }
                            ContentBlock::ToolResult { .. } => false,
                        })
                        .cloned()
                        .collect();
                if blocks.is_empty() {
                    continue;
                }
                if !open.is_empty() {
                    out.push(results_turn(&mut open, Vec::new()));
                    origins.push(Vec::new());
                }
                append(&mut out, &mut origins, Role::Assistant, blocks, i);
                if let Some(prev) = out.last() {
                    open = prev.tool_uses().map(|(id, _, _)| id.to_owned()).collect();
                }
            }
            Role::User => {
                let mut answers: Vec<ContentBlock> = Vec::new();
                let mut others: Vec<ContentBlock> = Vec::new();
                for b in &m.content {
                    match b {
                        ContentBlock::ToolResult { tool_use_id, .. } => {
                            let answered = answers.iter().any(|a| matches!(a, ContentBlock::ToolResult { tool_use_id: t, .. } if t == tool_use_id));
                            if open.contains(tool_use_id) && !answered {
                                answers.push(usable_result(b));
                            }
                        }
                        ContentBlock::Text { text } if !text.is_empty() => others.push(b.clone()),
                        _ => {}
                    }
                }
                if !open.is_empty() {
                    let contributed = !answers.is_empty() || !others.is_empty();
                    out.push(results_turn(&mut open, answers));
                    origins.push(if contributed { vec![i] } else { Vec::new() });
                    if let Some(prev) = out.last_mut() {
                        prev.content.extend(others);
                    }
                    continue;
                }
                if others.is_empty() {
                    continue;
                }
                append(&mut out, &mut origins, Role::User, others, i);
            }
        }
    }
    if !open.is_empty() {
        out.push(results_turn(&mut open, Vec::new()));
        origins.push(Vec::new());
    }
    if out.first().is_none_or(|m| m.role != Role::User) {
        out.insert(
            0,
            Message::user(Insert::Filler.wrap("(earlier conversation omitted)")),
        );
        origins.insert(0, Vec::new());
    }
    if out.last().is_some_and(|m| m.role == Role::Assistant) {
        out.push(Message::user(Insert::Filler.wrap("Continue.")));
        origins.push(Vec::new());
    }
    (out, origins)
}

/// The text that stands for a message a provider refused to process.
pub fn elision_text() -> String {
    Insert::Elided
        .wrap("A message was elided here because the model provider refused to process it.")
}

/// `message` with its content replaced by the marked elision notice
/// ([`elision_text`]), keeping its role and its tool-use / tool-result ids so
/// pairing stays valid: the first text block becomes the notice, other text
/// and thinking are dropped, a tool use keeps its id and name with input
/// `{"elided": true}`, a tool result keeps its id and error flag with the
/// notice as content. A message left with no block gets the notice.
///
/// ```
/// use glia_proto::{Message, marker::{Insert, classify}, repair::elide};
/// let e = elide(&Message::user("something the provider refuses"));
/// assert_eq!(classify(&e.text()), Some(Insert::Elided));
/// assert_eq!(elide(&e), e); // eliding twice changes nothing
/// ```
pub fn elide(message: &Message) -> Message {
    let mut content = Vec::new();
    let mut has_text = false;
    for b in &message.content {
        match b {
            ContentBlock::Text { .. } if !has_text => {
                has_text = true;
                content.push(ContentBlock::text(elision_text()));
            }
            ContentBlock::Text { .. }
            | ContentBlock::Thinking { .. }
            | ContentBlock::RedactedThinking { .. } => {}
            ContentBlock::ToolUse { id, name, .. } => content.push(ContentBlock::ToolUse {
                id: id.clone(),
                name: name.clone(),
                input: serde_json::json!({ "elided": true }),
            }),
            ContentBlock::ToolResult {
                tool_use_id,
                is_error,
                ..
            } => content.push(ContentBlock::ToolResult {
                tool_use_id: tool_use_id.clone(),
                content: elision_text().into(),
                is_error: *is_error,
            }),
        }
    }
    if content.is_empty() {
        content.push(ContentBlock::text(elision_text()));
    }
    Message {
        role: message.role,
        content,
    }
}

/// The messages of `messages` that refusal isolation never elides, with
/// which they are: the first message (the goal), and the latest user turn
/// holding a person's text — a text block that is not glia's marked text
/// ([`crate::marker::is_machine_text`]; text from outside is neutralised, so
/// this cannot be forged). When the provider refuses one of these, the
/// refusal is the run's outcome, not an edit of its request.
///
/// ```
/// use glia_proto::{Message, ProtectedTurn, repair::protected_turns};
/// let m = [Message::user("goal"), Message::assistant("ok?"), Message::user("yes, go")];
/// assert_eq!(protected_turns(&m), vec![(0, ProtectedTurn::Goal), (2, ProtectedTurn::LatestHumanTurn)]);
/// assert_eq!(protected_turns(&m[..1]), vec![(0, ProtectedTurn::Goal)]);
/// ```
pub fn protected_turns(messages: &[Message]) -> Vec<(usize, ProtectedTurn)> {
    let mut out = Vec::new();
    if !messages.is_empty() {
        out.push((0, ProtectedTurn::Goal));
    }
    let human = |m: &Message| {
        m.role == Role::User
            && m.content
                .iter()
                .any(|b| matches!(b, ContentBlock::Text { text } if !is_machine_text(text)))
    };
    if let Some(i) = messages.iter().rposition(human).filter(|&i| i > 0) {
        out.push((i, ProtectedTurn::LatestHumanTurn));
    }
    out
}

/// A tool result block as a provider takes it: its images usable or
/// replaced by a text note, its empty text blocks dropped (a result left
/// with no block is empty text).
fn usable_result(block: &ContentBlock) -> ContentBlock {
    let ContentBlock::ToolResult {
        tool_use_id,
        content: ToolContent::Blocks(blocks),
        is_error,
    } = block
    else {
        return block.clone();
    };
    let blocks: Vec<ResultBlock> = blocks
        .iter()
        .filter(|b| !matches!(b, ResultBlock::Text { text } if text.is_empty()))
        .map(|b| match b {
            ResultBlock::Image { source } => match source.clone().usable() {
                Ok(source) => ResultBlock::Image { source },
                Err(note) => ResultBlock::text(note),
            },
            text => text.clone(),
        })
        .collect();
    let content = if blocks.is_empty() {
        ToolContent::Text(String::new())
    } else {
        ToolContent::Blocks(blocks)
    };
    ContentBlock::ToolResult {
        tool_use_id: tool_use_id.clone(),
        content,
        is_error: *is_error,
    }
}

/// Add `blocks` of history message `i` to the last output message when it has
/// `role` (roles must alternate), else as a new message; track the origin.
fn append(
    out: &mut Vec<Message>,
    origins: &mut Vec<Vec<usize>>,
    role: Role,
    blocks: Vec<ContentBlock>,
    i: usize,
) {
    match out.last_mut() {
        Some(prev) if prev.role == role => {
            prev.content.extend(blocks);
            origins
                .last_mut()
                .expect("one origin list per message")
                .push(i);
        }
        _ => {
            out.push(Message {
                role,
                content: blocks,
            });
            origins.push(vec![i]);
        }
    }
}

/// One user turn answering every id in `open` (call order): the given answer
/// where there is one, a synthetic error result otherwise. Clears `open`.
fn results_turn(open: &mut Vec<String>, answers: Vec<ContentBlock>) -> Message {
    let content = open
        .drain(..)
        .map(|id| {
            answers
                .iter()
                .find(|a| matches!(a, ContentBlock::ToolResult { tool_use_id, .. } if *tool_use_id == id))
                .cloned()
                .unwrap_or(ContentBlock::ToolResult { tool_use_id: id, content: synthetic_result_text().into(), is_error: true })
        })
        .collect();
    Message {
        role: Role::User,
        content,
    }
}

/// Why a request is not valid, as a provider would reject it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRequest {
    /// No messages at all.
    #[error("messages: at least one message is required")]
    Empty,
    /// The first message is not a user turn.
    #[error("messages.0: the first message must use the user role")]
    FirstNotUser,
    /// The last message is not a user turn.
    #[error("messages.{0}: the last message must use the user role")]
    LastNotUser(usize),
    /// Two consecutive messages have the same role.
    #[error("messages.{0}: roles must alternate between user and assistant")]
    NotAlternating(usize),
    /// A message has no content, or a text block is empty.
    #[error("messages.{0}: content must be non-empty (text blocks too)")]
    EmptyContent(usize),
    /// A tool use is not answered in the next user turn.
    #[error("messages.{0}: tool_use {1} has no tool_result in the next user turn")]
    Unanswered(usize, String),
    /// A tool result answers no tool use of the previous assistant turn.
    #[error("messages.{0}: tool_result {1} answers no tool_use in the previous assistant turn")]
    Orphan(usize, String),
    /// A tool use id appears twice.
    #[error("messages.{0}: tool_use id {1} is not unique within its turn")]
    DuplicateId(usize, String),
    /// A block appears in a role that cannot carry it.
    #[error("messages.{0}: {1} blocks are not allowed in this role")]
    WrongRole(usize, &'static str),
    /// Thinking in an assistant turn other than the last one.
    #[error("messages.{0}: thinking from earlier turns must be removed")]
    StaleThinking(usize),
    /// Tool results must come before other blocks in a user turn.
    #[error("messages.{0}: tool_result blocks must come first in the user turn")]
    ResultsNotFirst(usize),
    /// An image the APIs refuse (see [`ImageSource::check`]), with why.
    #[error("messages.{0}: image: {1}")]
    BadImage(usize, String),
}

/// Check `messages` the way the provider APIs do; the scripted provider runs
/// this on every request. See the module docs for the rules.
pub fn validate(messages: &[Message]) -> Result<(), InvalidRequest> {
    if messages.is_empty() {
        return Err(InvalidRequest::Empty);
    }
    if messages[0].role != Role::User {
        return Err(InvalidRequest::FirstNotUser);
    }
    let last = messages.len() - 1;
    if messages[last].role != Role::User {
        return Err(InvalidRequest::LastNotUser(last));
    }
    let last_assistant = messages.iter().rposition(|m| m.role == Role::Assistant);
    let mut open: Vec<&str> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        if i > 0 && messages[i - 1].role == m.role {
            return Err(InvalidRequest::NotAlternating(i));
        }
        if m.content.is_empty()
            || m.content
                .iter()
                .any(|b| matches!(b, ContentBlock::Text { text } if text.is_empty()))
        {
            return Err(InvalidRequest::EmptyContent(i));
        }
        match m.role {
            Role::Assistant => {
                let mut ids: HashSet<&str> = HashSet::new();
                for b in &m.content {
                    match b {
                        ContentBlock::ToolResult { .. } => {
                            return Err(InvalidRequest::WrongRole(i, "tool_result"));
                        }
                        ContentBlock::Thinking { .. } | ContentBlock::RedactedThinking { .. }
                            if Some(i) != last_assistant =>
                        {
                            return Err(InvalidRequest::StaleThinking(i));
                        }
                        ContentBlock::ToolUse { id, .. } => {
                            if id.is_empty() {
                                return Err(InvalidRequest::EmptyContent(i));
                            }
                            if !ids.insert(id) {
                                return Err(InvalidRequest::DuplicateId(i, id.clone()));
                            }
                            open.push(id);
                        }
                        _ => {}
                    }
                }
            }
            Role::User => {
                let mut seen_other = false;
                let mut answered: Vec<&str> = Vec::new();
                for b in &m.content {
                    match b {
                        ContentBlock::ToolResult {
                            tool_use_id,
                            content,
                            ..
                        } => {
                            if seen_other {
                                return Err(InvalidRequest::ResultsNotFirst(i));
                            }
                            if let ToolContent::Blocks(blocks) = content {
                                if blocks.is_empty() || blocks.iter().any(|b| matches!(b, ResultBlock::Text { text } if text.is_empty())) {
                                    return Err(InvalidRequest::EmptyContent(i));
                                }
                                content
                                    .images()
                                    .try_for_each(ImageSource::check)
                                    .map_err(|why| InvalidRequest::BadImage(i, why))?;
                            }
                            if !open.contains(&tool_use_id.as_str())
                                || answered.contains(&tool_use_id.as_str())
                            {
                                return Err(InvalidRequest::Orphan(i, tool_use_id.clone()));
                            }
                            answered.push(tool_use_id);
                        }
                        ContentBlock::ToolUse { .. } => {
                            return Err(InvalidRequest::WrongRole(i, "tool_use"));
                        }
                        ContentBlock::Thinking { .. } => {
                            return Err(InvalidRequest::WrongRole(i, "thinking"));
                        }
                        ContentBlock::RedactedThinking { .. } => {
                            return Err(InvalidRequest::WrongRole(i, "redacted_thinking"));
                        }
                        ContentBlock::Text { .. } => seen_other = true,
                    }
                }
                if let Some(missing) = open.iter().find(|id| !answered.contains(id)) {
                    return Err(InvalidRequest::Unanswered(i - 1, (*missing).to_owned()));
                }
                open.clear();
            }
        }
    }
    Ok(())
}
