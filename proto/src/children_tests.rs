//! Issue 32, child runs: the transitions of agent-tool calls, applied and
//! checked, and the illegal ones refused leaving the state unchanged.

use serde_json::json;

use crate::testing::EventLog as Log;
use crate::*;

fn agent(name: &str) -> ChildAgent {
    ChildAgent {
        name: name.into(),
        version: 1,
        content_hash: format!("sha256:{}", "a".repeat(64)),
        description: String::new(),
    }
}

/// A run whose step offers agents `a` and `b` and a plain tool `t`, parked
/// after a model turn that called `a` (c1), `b` (c2) and `t` (c3).
fn parked_with_children(budget: BudgetLimits) -> Log {
    let config = RunConfig {
        agents: vec!["a@1".into(), "b@1".into()],
        child_agents: vec![agent("a"), agent("b")],
        budget,
        ..RunConfig::default()
    };
    let mut log = Log::new();
    log.ok(EventKind::SessionStart {
        redactions: Vec::new(),
        goal: "g".into(),
        config,
    })
    .ok(EventKind::PlanCommit {
        steps: vec!["s".into()],
    })
    .ok(EventKind::StepStart {
        index: 0,
        description: "s".into(),
        tools: vec![
            ToolSpec::of_agent(&agent("a")),
            ToolSpec::of_agent(&agent("b")),
            ToolSpec::new("t", "t", json!({"type": "object"})),
        ],
    })
    .ok(EventKind::ModelCall {
        model: "m".into(),
        messages: 1,
        wrap_up: false,
        forced_tool: None,
    })
    .ok(EventKind::ModelResponse {
        redactions: Vec::new(),
        message: Message {
            role: Role::Assistant,
            content: vec![
                use_of("c1", "a", json!({"goal": "one"})),
                use_of("c2", "b", json!({"goal": "two"})),
                use_of("c3", "t", json!({})),
            ],
        },
        usage: Usage::default(),
        stop_reason: "tool_use".into(),
        duration_ms: 0,
        cost_usd_micros: 0,
        rejected: None,
    });
    log
}

fn use_of(id: &str, name: &str, input: serde_json::Value) -> ContentBlock {
    ContentBlock::ToolUse {
        id: id.into(),
        name: name.into(),
        input,
    }
}

fn call(id: &str, name: &str, input: serde_json::Value, disposition: Disposition) -> EventKind {
    EventKind::ToolCall(ToolCallRecord {
        call_id: id.into(),
        name: name.into(),
        args_hash: args_hash(&input),
        input,
        idempotency_key: format!("r:1:{id}"),
        disposition,
    })
}

fn ended(id: &str, agent: &str, outcome: Outcome, cost: u64) -> EventKind {
    EventKind::ChildEnded {
        call_id: id.into(),
        child_run_id: Some(uuid::Uuid::from_u128(7)),
        agent: agent.into(),
        outcome,
        usage: Usage {
            input_tokens: 10,
            output_tokens: 1,
            ..Usage::default()
        },
        cost_usd_micros: cost,
    }
}

fn answered(text: &str) -> Outcome {
    Outcome::Succeeded {
        answer: text.into(),
        output: None,
    }
}

#[test]
fn agent_calls_park_at_awaiting_children_after_the_callers_results() {
    let mut log = parked_with_children(BudgetLimits::default());
    // Only an agent tool starts a child.
    let err = log.refused(call("c3", "t", json!({}), Disposition::Child));
    assert!(err.to_string().contains("only an agent tool"), "{err}");
    log.ok(call("c1", "a", json!({"goal": "one"}), Disposition::Child))
        .ok(call("c2", "b", json!({"goal": "two"}), Disposition::Child))
        .ok(call("c3", "t", json!({}), Disposition::External));
    let child = log.state.call("c1").unwrap().child.clone().unwrap();
    assert_eq!((child.agent.as_str(), child.goal.as_str()), ("a@1", "one"));
    assert_eq!(child.key, "r:1:c1");
    // A caller's result is due first, then the children.
    assert_eq!(
        log.state.tool_park(),
        Some(PullPoint::AwaitingTool {
            call_ids: vec!["c3".into()]
        })
    );
    log.refused(EventKind::SessionPause {
        pull_point: PullPoint::AwaitingChildren {
            call_ids: vec!["c1".into(), "c2".into()],
        },
    });
    log.ok(EventKind::SessionPause {
        pull_point: PullPoint::AwaitingTool {
            call_ids: vec!["c3".into()],
        },
    });
    // A child may end while the caller's result is still due.
    log.ok(ended("c2", "b@1", answered("two done"), 5));
    log.ok(EventKind::ToolResult {
        call_id: "c3".into(),
        content: "ok".into(),
        reminder: None,
        duration_ms: 0,
        redactions: Vec::new(),
    });
    assert_eq!(
        log.state.parked,
        Some(PullPoint::AwaitingChildren {
            call_ids: vec!["c1".into()]
        })
    );
    // The wrong agent, an unknown call, a call without a child: refused.
    log.refused(ended("c1", "b@1", answered("x"), 0));
    log.refused(ended("c9", "a@1", answered("x"), 0));
    log.refused(ended("c3", "a@1", answered("x"), 0));
    // A child that never ran cannot have succeeded.
    let mut never = ended("c1", "a@1", answered("x"), 0);
    if let EventKind::ChildEnded { child_run_id, .. } = &mut never {
        *child_run_id = None;
    }
    log.refused(never);
    log.ok(ended(
        "c1",
        "a@1",
        Outcome::Failed { error: "no".into() },
        7,
    ));
    // All results in: one user turn in call order, executing again.
    assert_eq!(log.phase(), Phase::Executing);
    assert_eq!(log.state.parked, None);
    let turn = log.state.messages.last().unwrap();
    let ids: Vec<(&str, bool)> = turn
        .content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::ToolResult {
                tool_use_id,
                is_error,
                ..
            } => Some((tool_use_id.as_str(), *is_error)),
            _ => None,
        })
        .collect();
    assert_eq!(ids, [("c1", true), ("c2", false), ("c3", false)]);
    assert_eq!(log.state.usage.cost_usd_micros, 12);
    assert_eq!(log.state.usage.tokens.input_tokens, 20);
    assert_eq!(log.state.usage.tool_calls, 3);
    assert_eq!(
        RunState::replay(uuid::Uuid::nil(), &log.events).unwrap(),
        log.state
    );
}

#[test]
fn a_childs_structured_output_is_the_result_and_a_second_end_is_refused() {
    let mut log = parked_with_children(BudgetLimits::default());
    log.ok(call("c1", "a", json!({"goal": "one"}), Disposition::Child))
        .ok(call("c2", "b", json!({"goal": "two"}), Disposition::Child))
        .ok(call(
            "c3",
            "t",
            json!({}),
            Disposition::Refused {
                error: ToolErrorKind::Denied,
                message: "no".into(),
            },
        ))
        .ok(EventKind::ToolError {
            call_id: "c3".into(),
            error: ToolErrorKind::Denied,
            message: "no".into(),
            duration_ms: 0,
        })
        .ok(EventKind::SessionPause {
            pull_point: PullPoint::AwaitingChildren {
                call_ids: vec!["c1".into(), "c2".into()],
            },
        });
    log.ok(ended(
        "c1",
        "a@1",
        Outcome::Succeeded {
            answer: "ignored".into(),
            output: Some(json!({"refund": 30})),
        },
        0,
    ));
    log.refused(ended("c1", "a@1", answered("again"), 0));
    let (content, is_error) = log.state.call("c1").unwrap().result.clone().unwrap();
    assert_eq!(content.to_text(), r#"{"refund":30}"#);
    assert!(!is_error);
    assert_eq!(
        log.state
            .call("c1")
            .unwrap()
            .child
            .as_ref()
            .unwrap()
            .child_run_id,
        Some(uuid::Uuid::from_u128(7))
    );
}

#[test]
fn erased_agent_calls_still_replay() {
    let mut log = parked_with_children(BudgetLimits::default());
    log.ok(call("c1", "a", json!({"goal": "one"}), Disposition::Child))
        .ok(call("c2", "b", json!({"goal": "two"}), Disposition::Child))
        .ok(call(
            "c3",
            "t",
            json!({}),
            Disposition::Run { reminder: None },
        ))
        .ok(EventKind::ToolResult {
            call_id: "c3".into(),
            content: "ok".into(),
            reminder: None,
            duration_ms: 0,
            redactions: Vec::new(),
        })
        .ok(EventKind::SessionPause {
            pull_point: PullPoint::AwaitingChildren {
                call_ids: vec!["c1".into(), "c2".into()],
            },
        })
        .ok(ended("c1", "a@1", answered("secret answer"), 1))
        .ok(ended("c2", "b@1", answered("another"), 2));
    let erased: Vec<Event> = log.events.iter().map(Event::erased).collect();
    let text = serde_json::to_string(&erased).unwrap();
    assert!(!text.contains("secret answer"));
    let replayed = RunState::replay(uuid::Uuid::nil(), &erased).unwrap();
    assert_eq!(replayed.usage, log.state.usage);
}
