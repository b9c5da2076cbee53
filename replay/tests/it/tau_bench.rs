//! Every tau-bench airline conversation replays exactly through the agent
//! loop in this process (approvals approved, the customer's recorded messages
//! posted at awaiting_input), and a changed history fails the run naming the
//! first differing message.

use std::path::Path;
use std::sync::Arc;

use glia_agent::Agent;
use glia_proto::{
    Decision, Event, EventKind, Outcome, PauseReason, Payload, PullPoint, RunState, Status,
};
use glia_replay::{Conversation, CustomerMove, Recording};
use uuid::Uuid;

fn recording() -> Recording {
    glia_replay::tau::load_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/tau-bench-airline"),
    )
    .expect("the vendored recording loads")
}

fn agent(recording: &Recording) -> Agent {
    Agent::new(Arc::new(recording.provider())).with_tools(recording.tools().unwrap())
}

/// Drive one conversation to its end; `decide` answers each approval.
async fn drive(
    agent: &Agent,
    recording: &Recording,
    conversation: &Conversation,
    decide: &dyn Fn(&str) -> Decision,
) -> (RunState, Vec<Event>) {
    let mut log: Vec<Event> = Vec::new();
    let config = recording.run_config(conversation);
    let (mut state, mut status) = agent
        .run(Uuid::now_v7(), &conversation.goal(), config, &mut log)
        .await
        .unwrap();
    while let Status::Parked(pull_point) = status.clone() {
        let input = match pull_point {
            PullPoint::AwaitingApproval { call_ids } => {
                let call = state.call(&call_ids[0]).unwrap();
                Payload::Approval {
                    call_id: call.call_id.clone(),
                    args_hash: call.args_hash.clone(),
                    decision: decide(&call.name),
                    by: None,
                    request_seq: None,
                }
            }
            PullPoint::AwaitingInput
            | PullPoint::Paused {
                reason: PauseReason::Budget { .. },
            } => match conversation.customer_move(&state.messages) {
                CustomerMove::Say(text) => Payload::Input {
                    text,
                    redactions: Vec::new(),
                },
                CustomerMove::Close(text) => Payload::Close {
                    text,
                    redactions: Vec::new(),
                },
                CustomerMove::Diverged(why) => panic!("{}: {why}", conversation.id),
            },
            other => panic!("{}: parked at {other:?}", conversation.id),
        };
        status = agent
            .advance(&mut state, Some(input), &mut log)
            .await
            .unwrap();
    }
    (state, log)
}

#[tokio::test]
async fn all_200_conversations_reproduce_exactly() {
    let recording = recording();
    let agent = agent(&recording);
    assert_eq!(recording.conversations().len(), 200);
    let (mut model_calls, mut tool_calls, mut approvals, mut handoffs) = (0, 0, 0, 0);
    for conversation in recording.conversations() {
        let (state, log) = drive(&agent, &recording, conversation, &|_| Decision::Approve).await;
        assert!(
            matches!(state.outcome, Some(Outcome::Succeeded { .. })),
            "{}: {:?}",
            conversation.id,
            state.outcome
        );
        conversation
            .check_complete(&state.messages)
            .unwrap_or_else(|why| panic!("{}: {why}", conversation.id));
        // The log alone rebuilds the same state.
        let mut replayed = RunState::new(state.run_id);
        for e in &log {
            replayed.apply(e).unwrap();
        }
        assert_eq!(replayed, state);
        model_calls += log
            .iter()
            .filter(|e| matches!(e.kind, EventKind::ModelResponse { .. }))
            .count();
        tool_calls += log
            .iter()
            .filter(|e| matches!(e.kind, EventKind::ToolResult { .. }))
            .count();
        approvals += log
            .iter()
            .filter(|e| matches!(e.kind, EventKind::ApprovalResolved { .. }))
            .count();
        handoffs += usize::from(state.messages.last().unwrap().tool_uses().count() == 0 && conversation.messages.last().unwrap().content.iter().any(|b| matches!(b, glia_proto::ContentBlock::ToolResult { tool_use_id, .. } if conversation.messages.iter().any(|m| m.tool_uses().any(|(id, name, _)| id == tool_use_id && name == "transfer_to_human_agents")))));
    }
    assert_eq!(
        model_calls,
        recording
            .conversations()
            .iter()
            .map(|c| c.model_turns())
            .sum::<usize>()
    );
    assert_eq!(tool_calls, 1164);
    assert_eq!(
        approvals,
        recording
            .conversations()
            .iter()
            .map(|c| c
                .messages
                .iter()
                .flat_map(|m| m.tool_uses())
                .filter(|(_, n, _)| glia_replay::tau::CONSEQUENTIAL.contains(n))
                .count())
            .sum::<usize>()
    );
    assert_eq!(
        handoffs, 48,
        "conversations ending in a hand-off to a human"
    );
}

#[tokio::test]
async fn a_rejected_approval_diverges_at_the_tool_result() {
    let recording = recording();
    let agent = agent(&recording);
    let conversation = recording
        .conversations()
        .iter()
        .find(|c| {
            c.messages
                .iter()
                .flat_map(|m| m.tool_uses())
                .any(|(_, n, _)| n == "book_reservation")
        })
        .unwrap();
    let mut log: Vec<Event> = Vec::new();
    let (mut state, mut status) = agent
        .run(
            Uuid::now_v7(),
            &conversation.goal(),
            recording.run_config(conversation),
            &mut log,
        )
        .await
        .unwrap();
    while let Status::Parked(pull_point) = status.clone() {
        let input = match pull_point {
            PullPoint::AwaitingApproval { call_ids } => {
                let call = state.call(&call_ids[0]).unwrap();
                Payload::Approval {
                    call_id: call.call_id.clone(),
                    args_hash: call.args_hash.clone(),
                    decision: Decision::Reject {
                        reason: "no".into(),
                    },
                    by: None,
                    request_seq: None,
                }
            }
            _ => match conversation.customer_move(&state.messages) {
                CustomerMove::Say(text) => Payload::Input {
                    text,
                    redactions: Vec::new(),
                },
                other => panic!("{other:?}"),
            },
        };
        status = agent
            .advance(&mut state, Some(input), &mut log)
            .await
            .unwrap();
    }
    let Some(Outcome::Failed { error }) = &state.outcome else {
        panic!("{:?}", state.outcome)
    };
    assert!(error.contains("replay diverged"), "{error}");
    assert!(
        error.contains("expected user: result#") && error.contains("got user: error result#"),
        "{error}"
    );
    assert!(
        error.contains(&format!("conversation {}: message ", conversation.id)),
        "{error}"
    );
}

#[test]
fn customer_moves_follow_the_recording() {
    let recording = recording();
    let conversation = recording
        .conversations()
        .iter()
        .find(|c| {
            c.messages.last().unwrap().tool_uses().count() == 0
                && c.messages.last().unwrap().role == glia_proto::Role::User
                && c.messages.last().unwrap().content.len() == 1
                && matches!(
                    c.messages.last().unwrap().content[0],
                    glia_proto::ContentBlock::Text { .. }
                )
        })
        .unwrap();
    let n = conversation.messages.len();
    assert_eq!(
        conversation.customer_move(&conversation.messages[..n - 1]),
        CustomerMove::Close(Some(conversation.messages[n - 1].text()))
    );
    assert_eq!(
        conversation.customer_move(&conversation.messages),
        CustomerMove::Close(None)
    );
    assert_eq!(
        conversation.customer_move(&conversation.messages[..2]),
        CustomerMove::Say(conversation.messages[2].text())
    );
    let mut changed = conversation.messages[..2].to_vec();
    changed[1] = glia_proto::Message::assistant("something else");
    let CustomerMove::Diverged(why) = conversation.customer_move(&changed) else {
        panic!()
    };
    assert!(
        why.starts_with("message 1 (recording message 2): expected assistant:"),
        "{why}"
    );
}

#[test]
fn a_malformed_recording_is_refused_with_its_place() {
    let tools = r#"[{"type": "function", "function": {"name": "think", "description": "", "parameters": {"type": "object"}}}]"#;
    let traj = |messages: &str| {
        format!(
            r#"[{{"task_id": 7, "trial": 1, "reward": 1.0, "info": {{}}, "traj": [{{"role": "system", "content": "s"}}, {messages}]}}]"#
        )
    };
    let err = glia_replay::tau::parse(&traj(r#"{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "c1", "name": "think", "content": ""}"#), tools).unwrap_err();
    assert_eq!(
        err.to_string(),
        "conversation 7-1, message 2: a result for c1, which the last assistant turn did not call or already has a result"
    );
    let err = glia_replay::tau::parse(&traj(r#"{"role": "user", "content": "hi"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "think", "arguments": "{oops"}}]}"#), tools).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("conversation 7-1, message 2: arguments of c1 are not JSON"),
        "{err}"
    );
    assert!(
        glia_replay::tau::parse("{", tools)
            .unwrap_err()
            .to_string()
            .starts_with("parsing <text>:")
    );
}
