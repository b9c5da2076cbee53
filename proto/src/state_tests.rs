//! The harness contract's transitions, each one applied and checked, and the
//! illegal ones refused with a typed error that leaves the state unchanged.

use serde_json::json;

use crate::testing::EventLog as Log;
use crate::*;

fn start(conversational: bool) -> EventKind {
    EventKind::SessionStart {
        redactions: Vec::new(),
        goal: "g".into(),
        config: RunConfig {
            conversational,
            ..RunConfig::default()
        },
    }
}

fn commit(steps: &[&str]) -> EventKind {
    EventKind::PlanCommit {
        steps: steps.iter().map(|s| (*s).to_owned()).collect(),
    }
}

fn step(index: usize) -> EventKind {
    EventKind::StepStart {
        index,
        description: "s".into(),
        tools: vec![],
    }
}

fn respond(message: Message) -> [EventKind; 2] {
    [
        EventKind::ModelCall {
            model: "m".into(),
            messages: 1,
            wrap_up: false,
            forced_tool: None,
        },
        EventKind::ModelResponse {
            redactions: Vec::new(),
            message,
            usage: Usage::default(),
            stop_reason: "end_turn".into(),
            duration_ms: 0,
            cost_usd_micros: 0,
            rejected: None,
        },
    ]
}

fn tool_use(id: &str) -> Message {
    Message {
        role: Role::Assistant,
        content: vec![ContentBlock::ToolUse {
            id: id.into(),
            name: "t".into(),
            input: json!({}),
        }],
    }
}

fn call(id: &str, disposition: Disposition) -> EventKind {
    EventKind::ToolCall(ToolCallRecord {
        call_id: id.into(),
        name: "t".into(),
        input: json!({}),
        args_hash: args_hash(&json!({})),
        idempotency_key: format!("k:{id}"),
        disposition,
    })
}

fn result(id: &str) -> EventKind {
    EventKind::ToolResult {
        call_id: id.into(),
        content: "ok".into(),
        reminder: None,
        duration_ms: 0,
        redactions: Vec::new(),
    }
}

#[test]
fn idle_planning_executing_awaiting_tool_reflecting_done() {
    let mut log = Log::new();
    assert_eq!(log.phase(), Phase::Idle);
    log.ok(start(false));
    assert_eq!(log.phase(), Phase::Planning);
    log.ok(EventKind::PlanDraft {
        steps: vec!["a".into()],
        usage: Usage::default(),
        cost_usd_micros: 0,
    });
    log.ok(commit(&["a"]));
    assert_eq!(log.phase(), Phase::Executing);
    log.ok(step(0));
    let [c, r] = respond(tool_use("t1"));
    log.ok(c).ok(r);
    assert_eq!(log.phase(), Phase::AwaitingTool);
    log.ok(call("t1", Disposition::Run { reminder: None }))
        .ok(result("t1"));
    assert_eq!(
        log.phase(),
        Phase::Executing,
        "AWAITING_TOOL → EXECUTING once every result is in"
    );
    let [c, r] = respond(Message::assistant("done"));
    log.ok(c).ok(r);
    log.ok(EventKind::StepEnd {
        index: 0,
        answer: "done".into(),
        skipped: false,
    });
    assert_eq!(log.phase(), Phase::Reflecting);
    log.ok(EventKind::SessionComplete {
        outcome: Outcome::Succeeded {
            answer: "done".into(),
            output: None,
        },
    });
    assert_eq!(log.phase(), Phase::Done);
    assert!(
        matches!(log.refused(step(1)), TransitionError::Finished { .. }),
        "DONE is terminal"
    );
}

#[test]
fn reflecting_to_next_step_and_to_replanning() {
    let mut log = Log::new();
    log.ok(start(false)).ok(commit(&["a", "b"])).ok(step(0));
    let [c, r] = respond(Message::assistant("a done"));
    log.ok(c).ok(r).ok(EventKind::StepEnd {
        index: 0,
        answer: "a done".into(),
        skipped: false,
    });
    assert!(
        matches!(log.refused(step(0)), TransitionError::Illegal { .. }),
        "steps go in order"
    );
    log.ok(step(1));
    assert_eq!(log.phase(), Phase::Executing, "REFLECTING → EXECUTING");
    let [c, r] = respond(Message::assistant("b done"));
    log.ok(c).ok(r).ok(EventKind::StepEnd {
        index: 1,
        answer: "b done".into(),
        skipped: false,
    });
    log.ok(EventKind::PlanDraft {
        steps: vec!["c".into()],
        usage: Usage::default(),
        cost_usd_micros: 0,
    });
    assert_eq!(log.phase(), Phase::Planning, "REFLECTING → PLANNING");
    log.ok(commit(&["c"])).ok(step(0));
    assert_eq!(log.state.plan, ["c"]);
}

#[test]
fn planning_to_done_without_a_plan() {
    let mut log = Log::new();
    log.ok(start(false));
    assert!(matches!(
        log.refused(commit(&[])),
        TransitionError::Illegal { .. }
    ));
    log.ok(EventKind::SessionComplete {
        outcome: Outcome::Succeeded {
            answer: String::new(),
            output: None,
        },
    });
    assert_eq!(log.phase(), Phase::Done);
}

#[test]
fn approval_pull_point_binds_to_the_argument_hash() {
    let mut log = Log::new();
    log.ok(start(false)).ok(commit(&["a"])).ok(step(0));
    let [c, r] = respond(tool_use("t1"));
    log.ok(c).ok(r).ok(call("t1", Disposition::Approval));
    let hash = args_hash(&json!({}));
    log.ok(EventKind::ApprovalRequested {
        call_id: "t1".into(),
        tool: "t".into(),
        input: json!({}),
        args_hash: hash.clone(),
        expires_at: None,
        interrupted: false,
    });
    let park = log.state.tool_park().unwrap();
    assert_eq!(
        park,
        PullPoint::AwaitingApproval {
            call_ids: vec!["t1".into()]
        }
    );
    log.ok(EventKind::SessionPause { pull_point: park });
    assert!(
        matches!(log.refused(result("t1")), TransitionError::Illegal { .. }),
        "no result before approval"
    );
    let wrong = EventKind::ApprovalResolved {
        call_id: "t1".into(),
        args_hash: args_hash(&json!({"x": 1})),
        decision: Decision::Approve,
        by: None,
    };
    assert!(matches!(
        log.refused(wrong),
        TransitionError::ArgsMismatch { .. }
    ));
    log.ok(EventKind::ApprovalResolved {
        call_id: "t1".into(),
        args_hash: hash.clone(),
        decision: Decision::Approve,
        by: None,
    });
    assert_eq!(log.state.parked, None, "approved: the loop can run it");
    let again = EventKind::ApprovalResolved {
        call_id: "t1".into(),
        args_hash: hash,
        decision: Decision::Approve,
        by: None,
    };
    assert!(
        matches!(log.refused(again), TransitionError::Illegal { .. }),
        "the first decision wins"
    );
    log.ok(result("t1"));
    assert_eq!(log.phase(), Phase::Executing);
}

#[test]
fn external_results_arrive_while_parked_and_results_keep_call_order() {
    let mut log = Log::new();
    log.ok(start(false)).ok(commit(&["a"])).ok(step(0));
    let two = Message {
        role: Role::Assistant,
        content: vec![
            ContentBlock::ToolUse {
                id: "t1".into(),
                name: "t".into(),
                input: json!({}),
            },
            ContentBlock::ToolUse {
                id: "t2".into(),
                name: "t".into(),
                input: json!({}),
            },
        ],
    };
    let [c, r] = respond(two);
    log.ok(c)
        .ok(r)
        .ok(call("t1", Disposition::External))
        .ok(call("t2", Disposition::External));
    log.ok(EventKind::SessionPause {
        pull_point: PullPoint::AwaitingTool {
            call_ids: vec!["t1".into(), "t2".into()],
        },
    });
    log.ok(result("t2"));
    assert_eq!(
        log.state.parked,
        Some(PullPoint::AwaitingTool {
            call_ids: vec!["t1".into()]
        })
    );
    log.ok(result("t1"));
    assert_eq!(log.state.parked, None);
    let last = log.state.messages.last().unwrap();
    let ids: Vec<&str> = last
        .content
        .iter()
        .map(|b| match b {
            ContentBlock::ToolResult { tool_use_id, .. } => tool_use_id.as_str(),
            _ => "?",
        })
        .collect();
    assert_eq!(ids, ["t1", "t2"]);
}

#[test]
fn awaiting_input_and_paused() {
    let mut log = Log::new();
    log.ok(start(true)).ok(commit(&["chat"])).ok(step(0));
    let [c, r] = respond(Message::assistant("hi"));
    log.ok(c).ok(r).ok(EventKind::StepEnd {
        index: 0,
        answer: "hi".into(),
        skipped: false,
    });
    log.ok(EventKind::SessionPause {
        pull_point: PullPoint::AwaitingInput,
    });
    assert!(matches!(
        log.refused(EventKind::SessionResume { by: None }),
        TransitionError::Illegal { .. }
    ));
    log.ok(EventKind::InputReceived {
        redactions: Vec::new(),
        text: "more".into(),
    });
    assert_eq!(log.phase(), Phase::Executing);
    let [c, r] = respond(Message::assistant("sure"));
    log.ok(c).ok(r);
    let operator = EventKind::SessionPause {
        pull_point: PullPoint::Paused {
            reason: PauseReason::Operator {
                reason: "lunch".into(),
            },
        },
    };
    assert!(
        matches!(
            log.refused(operator.clone()),
            TransitionError::Illegal { .. }
        ),
        "an operator pause is requested first"
    );
    // A request not yet in effect is withdrawn by a resume.
    log.ok(EventKind::SessionPauseRequested {
        reason: "lunch".into(),
        by: Some("ops".into()),
    });
    assert_eq!(log.state.pause_due.as_deref(), Some("lunch"));
    assert!(matches!(
        log.refused(EventKind::SessionPauseRequested {
            reason: "again".into(),
            by: None
        }),
        TransitionError::Illegal { .. }
    ));
    log.ok(EventKind::SessionResume { by: None });
    assert_eq!(log.state.pause_due, None);
    log.ok(EventKind::SessionPauseRequested {
        reason: "lunch".into(),
        by: None,
    });
    log.ok(operator);
    assert_eq!(log.state.pause_due, None, "the pause took effect");
    assert!(
        matches!(
            log.refused(EventKind::SessionPauseRequested {
                reason: "again".into(),
                by: None
            }),
            TransitionError::Illegal { .. }
        ),
        "already paused"
    );
    let [c, _] = respond(Message::assistant("x"));
    assert!(
        matches!(log.refused(c), TransitionError::Illegal { .. }),
        "a parked run makes no model calls"
    );
    assert!(matches!(
        log.refused(EventKind::InputReceived {
            redactions: Vec::new(),
            text: "x".into()
        }),
        TransitionError::Illegal { .. }
    ));
    log.ok(EventKind::SessionResume { by: None });
    assert_eq!(log.state.parked, None);
    // Paused for another reason with a pause requested: a resume withdraws
    // the request only; a second resumes the run.
    let budget = PullPoint::Paused {
        reason: PauseReason::TurnLimit,
    };
    log.ok(EventKind::SessionPause {
        pull_point: budget.clone(),
    });
    log.ok(EventKind::SessionPauseRequested {
        reason: "audit".into(),
        by: None,
    });
    log.ok(EventKind::SessionResume { by: None });
    assert_eq!(
        (log.state.parked.as_ref(), log.state.pause_due.as_deref()),
        (Some(&budget), None)
    );
    log.ok(EventKind::SessionResume { by: None });
    assert_eq!(log.state.parked, None);
    log.ok(EventKind::SessionCancel {
        reason: "bye".into(),
    });
    assert_eq!(
        log.state.outcome,
        Some(Outcome::Cancelled {
            reason: "bye".into()
        })
    );
}

#[test]
fn budget_limits_report_which_limit() {
    let limits = BudgetLimits {
        max_output_tokens: Some(100),
        max_tool_calls: Some(2),
        ..BudgetLimits::default()
    };
    let mut used = BudgetUsage {
        tool_calls: 2,
        ..BudgetUsage::default()
    };
    assert_eq!(limits.exhausted(&used), Some(Limit::ToolCalls));
    assert_eq!(
        limits.exhausted_for_model(&used),
        None,
        "a model out of tool calls may still answer"
    );
    assert_eq!(limits.exhausted_for_tool(&used), Some(Limit::ToolCalls));
    used.tokens.output_tokens = 100;
    assert_eq!(limits.exhausted_for_model(&used), Some(Limit::OutputTokens));
    let more = limits.extended_by(&BudgetLimits {
        max_output_tokens: Some(50),
        max_turns: Some(9),
        ..BudgetLimits::default()
    });
    assert_eq!(more.max_output_tokens, Some(150));
    assert_eq!(more.max_turns, None, "an unlimited limit stays unlimited");
}

#[test]
fn a_rejected_answer_counts_but_never_joins_the_conversation_or_runs_its_calls() {
    let rejected = |action, reask: Option<&str>| EventKind::ModelResponse {
        redactions: Vec::new(),
        message: tool_use("t1"),
        usage: Usage {
            output_tokens: 7,
            estimated: true,
            ..Usage::default()
        },
        stop_reason: "max_tokens".into(),
        duration_ms: 3,
        cost_usd_micros: 11,
        rejected: Some(RejectedAnswer {
            class: StopClass::Truncated,
            action,
            reask: reask.map(str::to_owned),
            refused_turn: None,
        }),
    };
    let mut log = Log::new();
    log.ok(start(false)).ok(commit(&["s"])).ok(step(0));
    log.ok(EventKind::ModelCall {
        model: "m".into(),
        messages: 1,
        wrap_up: false,
        forced_tool: None,
    });
    // A re-ask must carry its notice, and only a re-ask may.
    log.refused(rejected(StopAction::Reask, None));
    log.refused(rejected(StopAction::Fail, Some("x")));
    log.ok(rejected(StopAction::Reask, Some("⟦glia:reask⟧ cut off")));
    assert_eq!(
        log.phase(),
        Phase::Executing,
        "no batch: the cut call is not run"
    );
    assert!(log.state.pending_calls.is_empty());
    assert_eq!(
        log.state.messages.len(),
        1,
        "the notice joins the goal's user turn"
    );
    assert_eq!(log.state.messages[0].text(), "g\n⟦glia:reask⟧ cut off");
    assert_eq!(
        (
            log.state.reasks,
            log.state.usage.tokens.output_tokens,
            log.state.usage.cost_usd_micros
        ),
        (1, 7, 11)
    );
    assert!(
        log.state.usage.tokens.estimated,
        "estimated usage stays marked in the run's totals"
    );
    // A pause: parked at paused for the model stop; a resume calls the model again.
    log.ok(EventKind::ModelCall {
        model: "m".into(),
        messages: 1,
        wrap_up: false,
        forced_tool: None,
    });
    log.ok(rejected(StopAction::Pause, None));
    log.ok(EventKind::SessionPause {
        pull_point: PullPoint::Paused {
            reason: PauseReason::ModelStop {
                stop_reason: "max_tokens".into(),
            },
        },
    });
    log.ok(EventKind::SessionResume { by: None });
    log.ok(EventKind::ModelCall {
        model: "m".into(),
        messages: 1,
        wrap_up: false,
        forced_tool: None,
    });
    assert_eq!(log.state.usage.turns, 3);
}

fn unavailable(attempt: u32, retry_in_ms: Option<u64>) -> EventKind {
    EventKind::ToolSourceUnavailable {
        server: "files".into(),
        reason: "down".into(),
        attempt,
        retry_in_ms,
    }
}

/// `tool_source.unavailable` counts attempts in order, only before a step
/// starts; a `step.start` or the resume of a tool-source pause starts the
/// count again.
#[test]
fn tool_source_attempts_count_in_order_and_restart() {
    let mut log = Log::new();
    log.ok(start(false)).ok(commit(&["a", "b"]));
    log.ok(unavailable(1, Some(1000)))
        .ok(unavailable(2, Some(2000)));
    assert_eq!(log.state.tool_source_attempts, 2);
    assert!(matches!(
        log.refused(unavailable(2, None)),
        TransitionError::Illegal { .. }
    ));
    assert!(matches!(
        log.refused(unavailable(4, None)),
        TransitionError::Illegal { .. }
    ));
    log.ok(unavailable(3, None)).ok(EventKind::SessionPause {
        pull_point: PullPoint::Paused {
            reason: PauseReason::ToolSource {
                server: "files".into(),
                reason: "down".into(),
            },
        },
    });
    assert!(
        matches!(
            log.refused(unavailable(4, None)),
            TransitionError::Illegal { .. }
        ),
        "not while paused"
    );
    log.ok(EventKind::SessionResume { by: None });
    assert_eq!(
        log.state.tool_source_attempts, 0,
        "a resume restarts the count"
    );
    log.ok(unavailable(1, Some(1000))).ok(step(0));
    assert_eq!(
        log.state.tool_source_attempts, 0,
        "a step start restarts it"
    );
    assert!(
        matches!(
            log.refused(unavailable(1, None)),
            TransitionError::Illegal { .. }
        ),
        "not during a step"
    );
    let [c, r] = respond(Message::assistant("done a"));
    log.ok(c).ok(r).ok(EventKind::StepEnd {
        index: 0,
        answer: "done a".into(),
        skipped: false,
    });
    log.ok(unavailable(1, Some(1000)))
        .ok(EventKind::ToolsChanged {
            added: vec!["x".into()],
            removed: vec![],
            changed: vec![],
        })
        .ok(step(1));
    assert_eq!(log.state.step, Some(1));
    let replayed = RunState::replay(uuid::Uuid::nil(), &log.events).unwrap();
    assert_eq!(replayed, log.state);
}
