//! The tau-bench airline recording (Sierra's tau-bench, MIT licence): 200
//! conversations of a customer-service agent (gpt-4o) with simulated
//! customers and 14 tools, in OpenAI Chat Completions message format.
//!
//! Files (as vendored in `examples/tau-bench-airline/`):
//! - [`TRAJECTORIES`]: a JSON array of `{"task_id", "trial", "reward",
//!   "info", "traj"}`, where `traj` is the message list: a `system` message,
//!   then `user`, `assistant` (`content` and/or `tool_calls` with `id` and
//!   `function: {name, arguments}`, arguments a JSON string) and `tool`
//!   (`tool_call_id`, `name`, `content`) messages.
//! - [`TOOLS`]: a JSON array of `{"type": "function", "function": {"name",
//!   "description", "parameters"}}`.
//!
//! Replay settings carried over from the original harness: the tools in
//! [`CONSEQUENTIAL`] change the airline's database, so they need a person's
//! approval and are not idempotent; [`TERMINATE`] tools hand the customer
//! to a human and end the conversation (`return_direct`); the agent had at
//! most [`MAX_TURNS`] model turns.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use glia_proto::{ContentBlock, Message, Role, ToolSpec, canonical_json};
use serde::Deserialize;
use serde_json::Value;

use crate::recording::{Conversation, Recording, RecordingError};
use crate::tools::CallKey;

/// File name of the trajectories in a recording directory.
pub const TRAJECTORIES: &str = "gpt-4o-airline.json";
/// File name of the tool list in a recording directory.
pub const TOOLS: &str = "tools.json";
/// Tools that write to the airline's database: approval required, not
/// idempotent.
pub const CONSEQUENTIAL: [&str; 6] = [
    "book_reservation",
    "cancel_reservation",
    "update_reservation_flights",
    "update_reservation_baggages",
    "update_reservation_passengers",
    "send_certificate",
];
/// Tools that end the conversation (a hand-off to a human agent).
pub const TERMINATE: [&str; 1] = ["transfer_to_human_agents"];
/// Model turns the original harness allowed per conversation.
pub const MAX_TURNS: u64 = 30;

#[derive(Deserialize)]
struct Entry {
    task_id: u64,
    trial: u64,
    traj: Vec<RawMessage>,
}

#[derive(Deserialize)]
struct RawMessage {
    role: String,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<RawCall>>,
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct RawCall {
    id: String,
    function: RawFunction,
}

#[derive(Deserialize)]
struct RawFunction {
    name: String,
    arguments: String,
}

#[derive(Deserialize)]
struct RawTool {
    function: RawToolFunction,
}

#[derive(Deserialize)]
struct RawToolFunction {
    name: String,
    #[serde(default)]
    description: String,
    parameters: Value,
}

/// Load `dir`'s [`TRAJECTORIES`] and [`TOOLS`].
pub fn load_dir(dir: &Path) -> Result<Recording, RecordingError> {
    load(&dir.join(TRAJECTORIES), &dir.join(TOOLS))
}

/// Load a trajectories file and a tools file. Errors name the file, or the
/// conversation and message that break the format.
pub fn load(trajectories: &Path, tools: &Path) -> Result<Recording, RecordingError> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|source| RecordingError::Io {
            path: path.to_owned(),
            source,
        })
    };
    let entries: Vec<Entry> =
        serde_json::from_str(&read(trajectories)?).map_err(|source| RecordingError::Json {
            path: trajectories.to_owned(),
            source,
        })?;
    let tools: Vec<RawTool> =
        serde_json::from_str(&read(tools)?).map_err(|source| RecordingError::Json {
            path: tools.to_owned(),
            source,
        })?;
    build(entries, tools)
}

/// Parse trajectories and tools from JSON text (see the module docs).
pub fn parse(trajectories: &str, tools: &str) -> Result<Recording, RecordingError> {
    let json = |source| RecordingError::Json {
        path: "<text>".into(),
        source,
    };
    build(
        serde_json::from_str(trajectories).map_err(json)?,
        serde_json::from_str(tools).map_err(json)?,
    )
}

fn build(entries: Vec<Entry>, tools: Vec<RawTool>) -> Result<Recording, RecordingError> {
    let tools: Vec<ToolSpec> = tools
        .into_iter()
        .map(|t| {
            let name = t.function.name;
            ToolSpec {
                idempotent: !CONSEQUENTIAL.contains(&name.as_str()),
                return_direct: TERMINATE.contains(&name.as_str()),
                cancel_grace_ms: glia_proto::DEFAULT_CANCEL_GRACE_MS,
                description: t.function.description,
                input_schema: t.function.parameters,
                timeout_ms: 30_000,
                external: false,
                source: None,
                policy: None,
                max_result_bytes: None,
                output_schema: None,
                name,
            }
        })
        .collect();
    let mut outputs: HashMap<CallKey, (String, String)> = HashMap::new();
    let mut conversations = Vec::with_capacity(entries.len());
    for entry in entries {
        let id = format!("{}-{}", entry.task_id, entry.trial);
        let (conversation, calls) = conversation(id.clone(), entry.traj)?;
        for (key, output) in calls {
            match outputs.get(&key) {
                Some((known, first)) if *known != output => {
                    return Err(RecordingError::Ambiguous {
                        call: format!("{}#{}", key.1, key.0),
                        first: first.clone(),
                        second: id,
                    });
                }
                Some(_) => {}
                None => {
                    outputs.insert(key, (output, id.clone()));
                }
            }
        }
        conversations.push(Arc::new(conversation));
    }
    let outputs = outputs
        .into_iter()
        .map(|(k, (output, _))| (k, output))
        .collect();
    Ok(Recording {
        conversations,
        tools,
        outputs: Arc::new(outputs),
        require_approval: CONSEQUENTIAL.iter().map(|s| (*s).to_owned()).collect(),
        max_turns: Some(MAX_TURNS),
    })
}

/// One trajectory in glia's shapes, and its calls' outputs.
fn conversation(
    id: String,
    traj: Vec<RawMessage>,
) -> Result<(Conversation, Vec<(CallKey, String)>), RecordingError> {
    let bad = |index: usize, reason: &str| RecordingError::Format {
        conversation: id.clone(),
        index,
        reason: reason.to_owned(),
    };
    let mut traj = traj.into_iter().enumerate();
    let system = match traj.next() {
        Some((_, m)) if m.role == "system" => m.content.unwrap_or_default(),
        _ => return Err(bad(0, "the first message is not the system prompt")),
    };
    let mut messages: Vec<Message> = Vec::new();
    let mut source = Vec::new();
    let mut calls = Vec::new();
    // The calls of the last assistant turn: id → (tool, canonical arguments).
    let mut open: HashMap<String, (String, String)> = HashMap::new();
    for (i, m) in traj {
        let text = m.content.clone().filter(|t| !t.is_empty());
        match m.role.as_str() {
            "user" => {
                let text = text.ok_or_else(|| bad(i, "a user message without text"))?;
                if messages.is_empty() && i != 1 {
                    return Err(bad(i, "the goal must follow the system prompt"));
                }
                push(
                    &mut messages,
                    &mut source,
                    Role::User,
                    ContentBlock::Text { text },
                    i,
                );
            }
            "assistant" => {
                if messages.last().is_none_or(|m| m.role == Role::Assistant) {
                    return Err(bad(i, "an assistant turn must follow a user turn"));
                }
                let mut content: Vec<ContentBlock> = text
                    .into_iter()
                    .map(|text| ContentBlock::Text { text })
                    .collect();
                open.clear();
                for call in m.tool_calls.unwrap_or_default() {
                    let input: Value =
                        serde_json::from_str(&call.function.arguments).map_err(|e| {
                            bad(i, &format!("arguments of {} are not JSON: {e}", call.id))
                        })?;
                    if open
                        .insert(
                            call.id.clone(),
                            (call.function.name.clone(), canonical_json(&input)),
                        )
                        .is_some()
                    {
                        return Err(bad(
                            i,
                            &format!("call id {} repeats within the turn", call.id),
                        ));
                    }
                    content.push(ContentBlock::ToolUse {
                        id: call.id,
                        name: call.function.name,
                        input,
                    });
                }
                if content.is_empty() {
                    return Err(bad(i, "an empty assistant turn"));
                }
                messages.push(Message {
                    role: Role::Assistant,
                    content,
                });
                source.push(i);
            }
            "tool" => {
                let call_id = m
                    .tool_call_id
                    .ok_or_else(|| bad(i, "a tool message without tool_call_id"))?;
                let (name, args) = open.remove(&call_id).ok_or_else(|| bad(i, &format!("a result for {call_id}, which the last assistant turn did not call or already has a result")))?;
                if m.name.as_ref().is_some_and(|n| *n != name) {
                    return Err(bad(
                        i,
                        &format!(
                            "the result of {call_id} names tool {:?}, the call named {name:?}",
                            m.name.unwrap_or_default()
                        ),
                    ));
                }
                let content = m.content.unwrap_or_default();
                calls.push(((call_id.clone(), name, args), content.clone()));
                let block = ContentBlock::ToolResult {
                    tool_use_id: call_id,
                    content: content.into(),
                    is_error: false,
                };
                push(&mut messages, &mut source, Role::User, block, i);
            }
            other => return Err(bad(i, &format!("unknown role {other:?}"))),
        }
    }
    if messages.is_empty() {
        return Err(bad(1, "no goal"));
    }
    Ok((
        Conversation {
            id,
            system,
            messages,
            source,
        },
        calls,
    ))
}

/// Append `block` as a new message, or to the last message when it has the
/// same role (glia keeps roles alternating: a customer's words after tool
/// results share their user turn).
fn push(
    messages: &mut Vec<Message>,
    source: &mut Vec<usize>,
    role: Role,
    block: ContentBlock,
    index: usize,
) {
    match messages.last_mut() {
        Some(m) if m.role == role => m.content.push(block),
        _ => {
            messages.push(Message {
                role,
                content: vec![block],
            });
            source.push(index);
        }
    }
}
