//! Each pull point: park, serialise the state to JSON, drop every object,
//! resume in a fresh context from the JSON alone; the log must be identical to
//! an uninterrupted run's.

use crate::common;

use common::*;
use glia_agent::provider::ScriptedTurn;
use glia_proto::{
    BudgetLimits, Decision, Limit, Outcome, PauseReason, Payload, PullPoint, RunConfig, RunState,
    Status,
};
use serde_json::json;

/// What to post at each park: a function of the parked state.
type PayloadFn = fn(&RunState) -> Payload;

/// The whole run in one process: park, post, continue.
async fn uninterrupted(
    script: &[ScriptedTurn],
    config: &RunConfig,
    payloads: &[PayloadFn],
) -> (Vec<glia_proto::Event>, RunState) {
    let (agent, _) = agent(script.to_vec());
    let mut log = Vec::new();
    let (mut state, _) = agent
        .run(run_id(), "help me", config.clone(), &mut log)
        .await
        .unwrap();
    for payload in payloads {
        let input = payload(&state);
        agent
            .advance(&mut state, Some(input), &mut log)
            .await
            .unwrap();
    }
    (log, state)
}

/// The same run, but at every park the state goes through JSON and every
/// object (agent, provider, tools, state) is dropped and built anew.
async fn interrupted(
    script: &[ScriptedTurn],
    config: &RunConfig,
    payloads: &[PayloadFn],
) -> (Vec<glia_proto::Event>, RunState) {
    let mut log = Vec::new();
    let mut checkpoint = {
        let (agent, _) = agent(script.to_vec());
        let (state, status) = agent
            .run(run_id(), "help me", config.clone(), &mut log)
            .await
            .unwrap();
        assert!(
            matches!(status, Status::Parked(_)),
            "expected a park, got {status:?}"
        );
        serde_json::to_string(&state).unwrap()
    };
    for payload in payloads {
        let mut state: RunState = serde_json::from_str(&checkpoint).unwrap();
        let (agent, _) = agent_at(script.to_vec(), served(&log));
        let input = payload(&state);
        agent
            .advance(&mut state, Some(input), &mut log)
            .await
            .unwrap();
        checkpoint = serde_json::to_string(&state).unwrap();
    }
    (log, serde_json::from_str(&checkpoint).unwrap())
}

async fn same_log_either_way(
    script: Vec<ScriptedTurn>,
    config: RunConfig,
    payloads: &[PayloadFn],
) -> (Vec<glia_proto::Event>, RunState) {
    let (log_a, state_a) = uninterrupted(&script, &config, payloads).await;
    let (log_b, state_b) = interrupted(&script, &config, payloads).await;
    assert_eq!(log_a, log_b, "resuming from JSON must give the same log");
    assert_eq!(state_a, state_b);
    assert_replays(&log_a, &state_a);
    (log_a, state_a)
}

fn approve(state: &RunState) -> Payload {
    let call = &state.pending_calls[0];
    Payload::Approval {
        call_id: call.call_id.clone(),
        args_hash: call.args_hash.clone(),
        decision: Decision::Approve,
        by: Some("ana".into()),
        request_seq: None,
    }
}

#[tokio::test]
async fn awaiting_approval() {
    let script = vec![
        ScriptedTurn::call("refund", json!({"order": "A1", "amount": 30})),
        ScriptedTurn::text("Refunded 30."),
    ];
    let (log, state) = same_log_either_way(script, approval_config(), &[approve]).await;
    let names = names(&log);
    let parked_at = names.iter().position(|n| *n == "session.pause").unwrap();
    assert_eq!(
        &names[parked_at - 2..parked_at + 3],
        [
            "tool.call",
            "approval.requested",
            "session.pause",
            "approval.resolved",
            "tool.result"
        ]
    );
    assert!(
        matches!(state.outcome, Some(Outcome::Succeeded { ref answer, .. }) if answer == "Refunded 30.")
    );
}

#[tokio::test]
async fn awaiting_approval_edit_and_reject() {
    fn edit(state: &RunState) -> Payload {
        let call = &state.pending_calls[0];
        Payload::Approval {
            call_id: call.call_id.clone(),
            args_hash: call.args_hash.clone(),
            decision: Decision::Edit {
                input: json!({"order": "A1", "amount": 10}),
            },
            by: None,
            request_seq: None,
        }
    }
    fn reject(state: &RunState) -> Payload {
        let call = &state.pending_calls[0];
        Payload::Approval {
            call_id: call.call_id.clone(),
            args_hash: call.args_hash.clone(),
            decision: Decision::Reject {
                reason: "too much".into(),
            },
            by: None,
            request_seq: None,
        }
    }
    let script = vec![
        ScriptedTurn::call("refund", json!({"order": "A1", "amount": 30})),
        ScriptedTurn::call("refund", json!({"order": "A1", "amount": 3000})),
        ScriptedTurn::text("Refunded 10; the second refund was refused."),
    ];
    let (log, _) = same_log_either_way(script, approval_config(), &[edit, reject]).await;
    let results: Vec<_> = log
        .iter()
        .filter_map(|e| match &e.kind {
            glia_proto::EventKind::ToolResult { content, .. } => Some(content.to_string()),
            glia_proto::EventKind::ToolError { message, error, .. } => {
                Some(format!("{error:?}: {message}"))
            }
            _ => None,
        })
        .collect();
    assert!(
        results[0].contains("\"refunded\":10"),
        "the edited arguments ran: {results:?}"
    );
    assert_eq!(
        results[1],
        "Rejected: A person rejected this call: too much"
    );
}

/// A deadline that passed: an escalation is recorded and leaves the run
/// parked; an expiry is told to the model as an expiry (no decision before
/// the deadline), not as a person's rejection.
#[tokio::test]
async fn awaiting_approval_escalated_then_expired() {
    fn escalate(state: &RunState) -> Payload {
        let call = &state.pending_calls[0];
        Payload::Escalate {
            call_id: call.call_id.clone(),
            request_seq: call.requested_seq,
            expires_at: None,
        }
    }
    fn expire(state: &RunState) -> Payload {
        let call = &state.pending_calls[0];
        Payload::Approval {
            call_id: call.call_id.clone(),
            args_hash: call.args_hash.clone(),
            decision: Decision::Expire,
            by: Some("reconciler".into()),
            request_seq: call.requested_seq,
        }
    }
    let script = vec![
        ScriptedTurn::call("refund", json!({"order": "A1", "amount": 30})),
        ScriptedTurn::text("Nobody approved the refund in time."),
    ];
    let (log, state) = same_log_either_way(script, approval_config(), &[escalate, expire]).await;
    let names = names(&log);
    let escalated = names
        .iter()
        .position(|n| *n == "approval.escalated")
        .expect("approval.escalated recorded");
    assert_eq!(
        names[escalated + 1],
        "approval.resolved",
        "the escalation moved nothing: the run stayed parked until the expiry"
    );
    let error = log.iter().find_map(|e| match &e.kind {
        glia_proto::EventKind::ToolError { error, message, .. } => Some((*error, message.clone())),
        _ => None,
    });
    let (kind, message) = error.expect("the call got an error result");
    assert_eq!(kind, glia_proto::ToolErrorKind::Expired);
    assert!(
        message.starts_with("No decision before the deadline") && !message.contains("rejected"),
        "{message}"
    );
    assert!(matches!(state.outcome, Some(Outcome::Succeeded { .. })));
}

#[tokio::test]
async fn awaiting_tool() {
    fn answer(state: &RunState) -> Payload {
        Payload::ToolResult {
            call_id: state.pending_calls[0].call_id.clone(),
            content: "Order A1, please.".into(),
            is_error: false,
        }
    }
    let script = vec![
        ScriptedTurn::call("ask_customer", json!({"question": "Which order?"})),
        ScriptedTurn::text("Thanks, looking at A1."),
    ];
    let (log, state) = same_log_either_way(script, approval_config(), &[answer]).await;
    assert!(names(&log).contains(&"session.pause"));
    let pause = log.iter().find_map(|e| match &e.kind {
        glia_proto::EventKind::SessionPause { pull_point } => Some(pull_point.clone()),
        _ => None,
    });
    assert_eq!(
        pause,
        Some(PullPoint::AwaitingTool {
            call_ids: vec!["call_1".into()]
        })
    );
    assert_eq!(
        state.status(),
        Status::Done(Outcome::Succeeded {
            answer: "Thanks, looking at A1.".into(),
            output: None
        })
    );
}

#[tokio::test]
async fn awaiting_input() {
    fn say(_: &RunState) -> Payload {
        Payload::Input {
            text: "I want a refund for A1.".into(),
            redactions: Vec::new(),
        }
    }
    let script = vec![
        ScriptedTurn::text("How can I help?"),
        ScriptedTurn::text("Sure, A1 it is."),
    ];
    let config = RunConfig {
        conversational: true,
        ..RunConfig::default()
    };
    let (log, state) = same_log_either_way(script, config, &[say]).await;
    assert_eq!(state.parked, Some(PullPoint::AwaitingInput));
    assert_eq!(
        names(&log)
            .iter()
            .filter(|n| **n == "input.received")
            .count(),
        1
    );
    assert_eq!(state.messages.len(), 4);
}

#[tokio::test]
async fn paused_by_budget() {
    fn extend(_: &RunState) -> Payload {
        Payload::ExtendBudget {
            extra: BudgetLimits {
                max_turns: Some(1),
                ..BudgetLimits::default()
            },
        }
    }
    let script = vec![
        ScriptedTurn::call("add", json!({"a": 2, "b": 3})),
        ScriptedTurn::text("5"),
    ];
    let config = RunConfig {
        budget: BudgetLimits {
            max_turns: Some(1),
            ..BudgetLimits::default()
        },
        ..RunConfig::default()
    };
    let (log, state) = same_log_either_way(script, config, &[extend]).await;
    let names = names(&log);
    let warn = names.iter().position(|n| *n == "budget.warn").unwrap();
    assert_eq!(
        &names[warn..warn + 4],
        [
            "budget.warn",
            "session.pause",
            "budget.extended",
            "session.resume"
        ]
    );
    assert!(log.iter().any(|e| matches!(
        &e.kind,
        glia_proto::EventKind::SessionPause {
            pull_point: PullPoint::Paused {
                reason: PauseReason::Budget {
                    limit: Limit::Turns
                }
            }
        }
    )));
    assert_eq!(state.usage.turns, 2);
    assert!(matches!(state.outcome, Some(Outcome::Succeeded { .. })));
}

#[tokio::test]
async fn paused_at_turn_limit_then_resumed() {
    fn resume(_: &RunState) -> Payload {
        Payload::Resume {
            by: Some("ops".into()),
        }
    }
    let script = vec![
        ScriptedTurn::call("add", json!({"a": 1, "b": 1})),
        ScriptedTurn::call("add", json!({"a": 2, "b": 2})),
        ScriptedTurn::text("done"),
    ];
    let config = RunConfig {
        max_model_calls_per_turn: 2,
        ..RunConfig::default()
    };
    let (log, state) = same_log_either_way(script, config, &[resume]).await;
    assert!(log.iter().any(|e| matches!(
        &e.kind,
        glia_proto::EventKind::SessionPause {
            pull_point: PullPoint::Paused {
                reason: PauseReason::TurnLimit
            }
        }
    )));
    assert!(matches!(state.outcome, Some(Outcome::Succeeded { .. })));
}

#[tokio::test]
async fn an_approved_external_call_goes_back_to_the_caller() {
    fn answer(state: &RunState) -> Payload {
        Payload::ToolResult {
            call_id: state.pending_calls[0].call_id.clone(),
            content: "Order A1, please.".into(),
            is_error: false,
        }
    }
    let mut config = approval_config();
    config.policies.push(glia_proto::Policy {
        tool: "ask_customer".into(),
        args: None,
        action: glia_proto::PolicyAction::RequireApproval,
    });
    let script = vec![
        ScriptedTurn::call("ask_customer", json!({"question": "Which order?"})),
        ScriptedTurn::text("Thanks."),
    ];
    let (log, state) = same_log_either_way(script, config, &[approve, answer]).await;
    // After the approval the run stays parked, now at awaiting_tool, and the
    // posted result (not a worker) answers the call.
    let names = names(&log);
    let resolved = names
        .iter()
        .position(|n| *n == "approval.resolved")
        .unwrap();
    assert_eq!(
        &names[resolved..resolved + 2],
        ["approval.resolved", "tool.result"]
    );
    assert!(
        !log.iter()
            .any(|e| matches!(e.kind, glia_proto::EventKind::ToolError { .. }))
    );
    assert!(matches!(state.outcome, Some(Outcome::Succeeded { .. })));
}

#[tokio::test]
async fn closing_words_end_a_conversation_without_a_model_call() {
    fn bye(_: &RunState) -> Payload {
        Payload::Close {
            text: Some("Thanks, that's all!".into()),
            redactions: Vec::new(),
        }
    }
    let script = vec![ScriptedTurn::text("How can I help?")];
    let config = RunConfig {
        conversational: true,
        ..RunConfig::default()
    };
    let (log, state) = same_log_either_way(script, config, &[bye]).await;
    assert_eq!(
        names(&log)[names(&log).len() - 2..],
        ["input.received", "session.complete"]
    );
    assert_eq!(served(&log), 1, "no model call after the closing words");
    assert_eq!(state.messages.last().unwrap().text(), "Thanks, that's all!");
    assert_eq!(
        state.outcome,
        Some(Outcome::Succeeded {
            answer: "How can I help?".into(),
            output: None
        })
    );
}

#[tokio::test]
async fn a_run_paused_by_its_budget_can_be_closed_but_takes_no_closing_words() {
    fn close(_: &RunState) -> Payload {
        Payload::Close {
            text: None,
            redactions: Vec::new(),
        }
    }
    let script = vec![
        ScriptedTurn::call("add", json!({"a": 2, "b": 3})),
        ScriptedTurn::text("5"),
    ];
    let config = RunConfig {
        budget: BudgetLimits {
            max_turns: Some(1),
            ..BudgetLimits::default()
        },
        ..RunConfig::default()
    };
    let (agent, _) = agent(script.clone());
    let mut log = Vec::new();
    let (mut state, status) = agent
        .run(run_id(), "help me", config.clone(), &mut log)
        .await
        .unwrap();
    assert!(matches!(
        status,
        Status::Parked(PullPoint::Paused {
            reason: PauseReason::Budget { .. }
        })
    ));
    let words = agent
        .advance(
            &mut state,
            Some(Payload::Close {
                text: Some("bye".into()),
                redactions: Vec::new(),
            }),
            &mut log,
        )
        .await;
    assert!(
        matches!(words, Err(glia_agent::AgentError::InvalidResume(_))),
        "{words:?}"
    );
    let (log, state) = same_log_either_way(script, config, &[close]).await;
    assert_eq!(names(&log).last(), Some(&"session.complete"));
    assert!(matches!(state.outcome, Some(Outcome::Succeeded { .. })));
    assert_eq!(state.usage.turns, 1);
}

/// A tool that hands the conversation to a person: `return_direct`.
struct Handoff;
impl glia_agent::tool::DynTool for Handoff {
    fn spec(&self) -> glia_proto::ToolSpec {
        glia_proto::ToolSpec {
            name: "handoff".into(),
            description: "Transfer to a human agent.".into(),
            input_schema: json!({"type": "object"}),
            idempotent: true,
            timeout_ms: 1000,
            external: false,
            return_direct: true,
            cancel_grace_ms: glia_proto::DEFAULT_CANCEL_GRACE_MS,
            source: None,
            policy: None,
            max_result_bytes: None,
            output_schema: None,
        }
    }
    fn returns_json(&self) -> bool {
        false
    }
    fn call_raw(
        &self,
        _input: serde_json::Value,
        _ctx: glia_agent::tool::ToolContext,
    ) -> futures::future::BoxFuture<'static, Result<String, glia_agent::tool::ToolFailure>> {
        Box::pin(async { Ok("Transfer successful".to_owned()) })
    }
}

#[tokio::test]
async fn a_return_direct_tool_ends_the_run_with_its_result() {
    let script = vec![
        ScriptedTurn::call("add", json!({"a": 1, "b": 1})),
        ScriptedTurn::call("handoff", json!({})),
        ScriptedTurn::text("never asked"),
    ];
    let mut tools = glia_agent::tool::ToolRegistry::default();
    tools.register(Add);
    tools.register_dyn(std::sync::Arc::new(Handoff)).unwrap();
    let provider = std::sync::Arc::new(glia_agent::provider::ScriptedProvider::new(script));
    let agent = glia_agent::Agent::new(provider.clone())
        .with_tools(tools)
        .with_clock(glia_agent::FixedClock(epoch()));
    let mut log = Vec::new();
    let (state, status) = agent
        .run(
            run_id(),
            "help me",
            RunConfig {
                conversational: true,
                ..RunConfig::default()
            },
            &mut log,
        )
        .await
        .unwrap();
    assert!(matches!(status, Status::Done(_)), "{status:?}");
    assert_eq!(
        provider.served(),
        2,
        "the model is not called after the hand-off"
    );
    assert_eq!(
        state.outcome,
        Some(Outcome::Succeeded {
            answer: "Transfer successful".into(),
            output: None
        })
    );
    assert_eq!(
        names(&log)[names(&log).len() - 3..],
        ["tool.call", "tool.result", "session.complete"]
    );
    assert_replays(&log, &state);
}

#[tokio::test]
async fn a_call_id_reused_in_a_later_turn_gets_its_own_idempotency_key() {
    let call = |a: i64| ScriptedTurn {
        tool_calls: vec![glia_agent::provider::ScriptedCall {
            id: Some("call_0".into()),
            name: "add".into(),
            input: json!({"a": a, "b": 1}),
        }],
        ..ScriptedTurn::default()
    };
    let (agent, _) = agent(vec![call(1), call(2), ScriptedTurn::text("3")]);
    let mut log = Vec::new();
    let (state, _) = agent
        .run(run_id(), "add twice", RunConfig::default(), &mut log)
        .await
        .unwrap();
    let keys: Vec<String> = log
        .iter()
        .filter_map(|e| match &e.kind {
            glia_proto::EventKind::ToolCall(c) => Some(c.idempotency_key.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        keys,
        [
            format!("{}:1:call_0", state.run_id),
            format!("{}:2:call_0", state.run_id)
        ]
    );
    assert!(matches!(state.outcome, Some(Outcome::Succeeded { .. })));
    assert_replays(&log, &state);
}
