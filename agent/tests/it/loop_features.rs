//! The loop's features, one test each: concurrent tool calls, the wrap-up
//! notice, policies, structured output, guardrails, compaction, planners, cost.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use glia_agent::compact::{DropOldest, Summarize};
use glia_agent::policy::Guardrail;
use glia_agent::provider::{ScriptedProvider, ScriptedTurn, ToolChoice};
use glia_agent::tool::{Tool, ToolContext, ToolFailure, ToolRegistry};
use glia_agent::{Agent, FixedClock};
use glia_proto::marker::{Insert, classify, is_machine_text};
use glia_proto::{
    BudgetLimits, ContentBlock, EventKind, Outcome, PlannerKind, Policy, PolicyAction, Pricing,
    RunConfig, Status, ToolErrorKind,
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Barrier;

#[derive(Deserialize, JsonSchema)]
struct Named {
    name: String,
}

/// Waits at a shared barrier: two calls only both finish if they run at once.
struct Rendezvous(Arc<Barrier>);
impl Tool for Rendezvous {
    type Args = Named;
    type Output = String;
    fn name(&self) -> &str {
        "rendezvous"
    }
    fn description(&self) -> &str {
        "Meet the other call."
    }
    fn timeout(&self) -> Duration {
        Duration::from_secs(10)
    }
    async fn call(&self, args: Named, _ctx: ToolContext) -> Result<String, ToolFailure> {
        self.0.wait().await;
        Ok(format!("\"{} met\"", args.name))
    }
}

#[tokio::test]
async fn tool_calls_of_one_turn_run_concurrently_and_results_keep_call_order() {
    let mut tools = ToolRegistry::default();
    tools.register(Rendezvous(Arc::new(Barrier::new(2))));
    let script = vec![
        ScriptedTurn::calls(&[
            ("rendezvous", json!({"name": "first"})),
            ("rendezvous", json!({"name": "second"})),
        ]),
        ScriptedTurn::text("both met"),
    ];
    let provider = Arc::new(ScriptedProvider::new(script));
    let agent = Agent::new(provider.clone())
        .with_tools(tools)
        .with_clock(FixedClock(epoch()));
    let mut log = Vec::new();
    let (_, status) = agent
        .run(run_id(), "meet", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { .. })),
        "sequential calls would have timed out: {status:?}"
    );
    let results = provider.requests()[1]
        .messages
        .last()
        .unwrap()
        .content
        .clone();
    assert!(
        matches!(&results[0], ContentBlock::ToolResult { tool_use_id, .. } if tool_use_id == "call_1")
    );
    assert!(
        matches!(&results[1], ContentBlock::ToolResult { tool_use_id, .. } if tool_use_id == "call_2")
    );
}

#[tokio::test]
async fn wrap_up_notice_precedes_the_last_call_of_a_turn() {
    let script = vec![
        ScriptedTurn::call("add", json!({"a": 1, "b": 1})),
        ScriptedTurn::call("add", json!({"a": 1, "b": 2})),
        ScriptedTurn::text("done"),
    ];
    let (agent, provider) = agent(script);
    let config = RunConfig {
        max_model_calls_per_turn: 3,
        ..RunConfig::default()
    };
    let mut log = Vec::new();
    agent.run(run_id(), "go", config, &mut log).await.unwrap();
    let notices: Vec<bool> = provider
        .requests()
        .iter()
        .map(|r| r.messages.last().unwrap().content.iter().any(|b| matches!(b, ContentBlock::Text { text } if classify(text) == Some(Insert::WrapUp))))
        .collect();
    assert_eq!(notices, [false, false, true]);
    let flags: Vec<bool> = log
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::ModelCall { wrap_up, .. } => Some(wrap_up),
            _ => None,
        })
        .collect();
    assert_eq!(flags, [false, false, true]);
}

#[tokio::test]
async fn policies_deny_and_remind() {
    let config = RunConfig {
        policies: vec![
            Policy {
                tool: "refund".into(),
                args: Some(r#""amount":\d{4,}"#.into()),
                action: PolicyAction::Deny {
                    reason: "over the limit".into(),
                },
            },
            Policy {
                tool: "*".into(),
                args: None,
                action: PolicyAction::Remind {
                    text: "Be brief.".into(),
                },
            },
        ],
        ..RunConfig::default()
    };
    let script = vec![
        ScriptedTurn::calls(&[
            ("refund", json!({"order": "A1", "amount": 5000})),
            ("add", json!({"a": 1, "b": 1})),
        ]),
        ScriptedTurn::text("ok"),
    ];
    let (agent, provider) = agent(script);
    let mut log = Vec::new();
    agent.run(run_id(), "go", config, &mut log).await.unwrap();
    let results = provider.requests()[1]
        .messages
        .last()
        .unwrap()
        .content
        .clone();
    assert!(
        matches!(&results[0], ContentBlock::ToolResult { content, is_error: true, .. } if content == "Denied by policy: over the limit")
    );
    let ContentBlock::ToolResult {
        content,
        is_error: false,
        ..
    } = &results[1]
    else {
        panic!("{results:?}")
    };
    assert!(
        content.to_text().starts_with(Insert::Reminder.marker())
            && content.to_text().ends_with("{\"sum\":2}"),
        "{content}"
    );
    // The log keeps the clean result and the reminder apart.
    assert!(log.iter().any(|e| matches!(&e.kind, EventKind::ToolResult { content, reminder: Some(r), .. } if content == "{\"sum\":2}" && r == "Be brief.")));
}

#[tokio::test]
async fn structured_output_is_validated_with_a_bounded_reask() {
    let schema = json!({"type": "object", "properties": {"refund_usd": {"type": "number"}}, "required": ["refund_usd"], "additionalProperties": false});
    let config = RunConfig {
        output_schema: Some(schema),
        ..RunConfig::default()
    };
    let script = vec![
        ScriptedTurn::text("The refund is 59 dollars."),
        ScriptedTurn::call("final_output", json!({"refund_usd": "59"})),
        ScriptedTurn::call("final_output", json!({"refund_usd": 59})),
    ];
    let (agent, provider) = agent(script);
    let mut log = Vec::new();
    let (state, status) = agent
        .run(run_id(), "how much?", config.clone(), &mut log)
        .await
        .unwrap();
    assert_eq!(
        status,
        Status::Done(Outcome::Succeeded {
            answer: "{\"refund_usd\":59}".into(),
            output: Some(json!({"refund_usd": 59}))
        })
    );
    let choices: Vec<ToolChoice> = provider
        .requests()
        .iter()
        .map(|r| r.tool_choice.clone())
        .collect();
    assert_eq!(choices[0], ToolChoice::Auto);
    assert_eq!(
        choices[1],
        ToolChoice::Tool {
            name: "final_output".into()
        },
        "a re-ask forces the output tool"
    );
    assert!(names(&log).contains(&"guardrail.tripped"));
    assert_replays(&log, &state);

    // With no re-asks left the run fails, clearly.
    let (agent, _) = common::agent(vec![ScriptedTurn::text("59"), ScriptedTurn::text("59!")]);
    let config = RunConfig {
        max_reasks: 1,
        ..config
    };
    let (_, status) = agent
        .run(run_id(), "how much?", config, &mut Vec::new())
        .await
        .unwrap();
    assert!(
        matches!(status, Status::Done(Outcome::Failed { ref error }) if error.contains("output_schema")),
        "{status:?}"
    );
}

#[tokio::test]
async fn guardrails_reject_input_and_reask_output() {
    let no_card = || {
        Guardrail::new("no-card-numbers", |t| {
            if t.chars().filter(|c| c.is_ascii_digit()).count() >= 12 {
                Err("contains a card number".into())
            } else {
                Ok(())
            }
        })
    };
    // Output: first answer leaks, re-ask, second is fine.
    let (agent, provider) = agent(vec![
        ScriptedTurn::text("Your card 4111111111111111 is charged."),
        ScriptedTurn::text("Your card is charged."),
    ]);
    let agent = agent.with_output_guardrail(no_card());
    let mut log = Vec::new();
    let (_, status) = agent
        .run(run_id(), "charge", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert_eq!(
        status,
        Status::Done(Outcome::Succeeded {
            answer: "Your card is charged.".into(),
            output: None
        })
    );
    let reask = provider.requests()[1].messages.last().unwrap().text();
    assert!(
        is_machine_text(&reask) && reask.contains("contains a card number"),
        "{reask}"
    );
    // Input: the goal is refused before any model call.
    let (agent, provider) = common::agent(vec![ScriptedTurn::text("never")]);
    let agent = agent.with_input_guardrail(no_card());
    let (_, status) = agent
        .run(
            run_id(),
            "my card is 4111 1111 1111 1111",
            RunConfig::default(),
            &mut Vec::new(),
        )
        .await
        .unwrap();
    assert!(matches!(status, Status::Done(Outcome::Failed { .. })));
    assert_eq!(provider.served(), 0);
}

fn long_chat() -> Vec<ScriptedTurn> {
    let mut script: Vec<ScriptedTurn> = (0..6)
        .map(|i| ScriptedTurn::call("add", json!({"a": i, "b": 1000 + i})))
        .collect();
    script.push(ScriptedTurn::text("All sums done."));
    script
}

#[tokio::test]
async fn drop_oldest_keeps_the_goal_and_whole_tool_pairs() {
    let (agent, provider) = agent(long_chat());
    let agent = agent.with_compactor(DropOldest {
        max_tokens: 150,
        keep_recent: 1,
    });
    let mut log = Vec::new();
    let (state, status) = agent
        .run(run_id(), "sum things", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert!(matches!(status, Status::Done(Outcome::Succeeded { .. })));
    assert!(names(&log).contains(&"context.compacted"));
    for r in provider.requests() {
        assert_eq!(
            r.messages[0].content[0],
            ContentBlock::text("sum things"),
            "the goal stays first"
        );
    }
    let last = provider.requests().last().unwrap().messages.len();
    assert!(last < 13, "the context shrank: {last} messages");
    assert_replays(&log, &state);
}

#[tokio::test]
async fn summarize_replaces_old_turns_with_a_marked_summary() {
    // The summary call is served from the script like any other call: find
    // when the first compaction happens (same threshold, no model call
    // needed) and put the summary there.
    let (probe, _) = agent(long_chat());
    let probe = probe.with_compactor(DropOldest {
        max_tokens: 200,
        keep_recent: 1,
    });
    let mut probe_log = Vec::new();
    probe
        .run(run_id(), "sum things", RunConfig::default(), &mut probe_log)
        .await
        .unwrap();
    let first = probe_log
        .iter()
        .position(|e| matches!(e.kind, EventKind::ContextCompacted { .. }))
        .expect("the threshold compacts");
    let mut script = long_chat();
    script.insert(
        served(&probe_log[..first]),
        ScriptedTurn::text("Added 0+1000, 1+1001 and 2+1002."),
    );
    let (agent, _) = agent(script);
    let agent = agent.with_compactor(Summarize {
        max_tokens: 200,
        keep_recent: 1,
    });
    let mut log = Vec::new();
    let (state, status) = agent
        .run(run_id(), "sum things", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { ref answer, .. }) if answer == "All sums done."),
        "{status:?}"
    );
    let compacted = log.iter().find_map(|e| match &e.kind {
        EventKind::ContextCompacted {
            messages, strategy, ..
        } => Some((strategy.clone(), messages.clone())),
        _ => None,
    });
    let (strategy, messages) = compacted.expect("compacted");
    assert_eq!(strategy, "summarize");
    let head = messages[0].text();
    assert!(
        head.contains(&Insert::Summary.wrap("Added 0+1000")),
        "{head}"
    );
    assert_replays(&log, &state);
}

#[tokio::test]
async fn model_planner_drafts_commits_and_replans() {
    let script = vec![
        ScriptedTurn::call(
            "submit_plan",
            json!({"steps": ["Find the order.", "Refund it."]}),
        ),
        ScriptedTurn::text("Order A1 found."),
        ScriptedTurn::call(
            "submit_plan",
            json!({"steps": ["Refund it.", "Tell the customer."]}),
        ),
        ScriptedTurn::text("Refunded."),
        ScriptedTurn::call("submit_plan", json!({"steps": ["Tell the customer."]})),
        ScriptedTurn::text("Customer told."),
        ScriptedTurn::call("submit_plan", json!({"steps": []})),
    ];
    let (agent, provider) = agent(script);
    let config = RunConfig {
        planner: PlannerKind::Model,
        ..RunConfig::default()
    };
    let mut log = Vec::new();
    let (state, status) = agent
        .run(run_id(), "refund A1", config, &mut log)
        .await
        .unwrap();
    assert_eq!(
        status,
        Status::Done(Outcome::Succeeded {
            answer: "Customer told.".into(),
            output: None
        })
    );
    assert_eq!(
        names(&log).iter().filter(|n| **n == "plan.commit").count(),
        3
    );
    let step_note = provider.requests()[1].messages[0].content[1].clone();
    assert!(
        matches!(step_note, ContentBlock::Text { ref text } if classify(text) == Some(Insert::Step)),
        "{step_note:?}"
    );
    assert_replays(&log, &state);
}

#[tokio::test]
async fn budget_counts_cost_in_usd_micros_and_pauses_on_it() {
    let pricing = Pricing {
        input: 3_000_000,
        output: 15_000_000,
        cache_write: 3_750_000,
        cache_read: 300_000,
    };
    let usage = glia_proto::Usage {
        input_tokens: 1000,
        output_tokens: 100,
        cache_write_tokens: 0,
        cache_read_tokens: 2000,
        ..Default::default()
    };
    let script = vec![
        ScriptedTurn {
            usage: Some(usage),
            ..ScriptedTurn::call("add", json!({"a": 1, "b": 1}))
        },
        ScriptedTurn {
            usage: Some(usage),
            ..ScriptedTurn::text("2")
        },
    ];
    let (agent, _) = agent(script);
    let config = RunConfig {
        pricing: Some(pricing),
        budget: BudgetLimits {
            max_cost_usd_micros: Some(5_000),
            ..BudgetLimits::default()
        },
        ..RunConfig::default()
    };
    let mut log = Vec::new();
    let (state, status) = agent.run(run_id(), "go", config, &mut log).await.unwrap();
    // 1000 × 3 + 100 × 15 + 2000 × 0.3 = 5,100 micros: over the 5,000 limit after the first call.
    assert_eq!(state.usage.cost_usd_micros, 5_100);
    assert!(
        matches!(status, Status::Parked(glia_proto::PullPoint::Paused { .. })),
        "{status:?}"
    );
    assert!(log.iter().any(|e| matches!(
        e.kind,
        EventKind::BudgetWarn {
            limit: glia_proto::Limit::Cost,
            ..
        }
    )));
}

#[tokio::test]
async fn tool_budget_blocks_the_next_call_but_keeps_the_ones_already_run() {
    let script = vec![
        ScriptedTurn::calls(&[
            ("add", json!({"a": 1, "b": 1})),
            ("add", json!({"a": 2, "b": 2})),
        ]),
        ScriptedTurn::text("4"),
    ];
    let (agent, _) = agent(script);
    let config = RunConfig {
        budget: BudgetLimits {
            max_tool_calls: Some(1),
            ..BudgetLimits::default()
        },
        ..RunConfig::default()
    };
    let mut log = Vec::new();
    let (mut state, status) = agent.run(run_id(), "go", config, &mut log).await.unwrap();
    assert!(matches!(status, Status::Parked(_)));
    assert_eq!(
        state.call("call_1").unwrap().result,
        Some(("{\"sum\":2}".into(), false)),
        "the first call ran before the pause"
    );
    let extend = glia_proto::Payload::ExtendBudget {
        extra: BudgetLimits {
            max_tool_calls: Some(1),
            ..BudgetLimits::default()
        },
    };
    let status = agent
        .advance(&mut state, Some(extend), &mut log)
        .await
        .unwrap();
    assert!(matches!(status, Status::Done(Outcome::Succeeded { .. })));
    assert!(!log.iter().any(|e| matches!(
        e.kind,
        EventKind::ToolError {
            error: ToolErrorKind::OutcomeUnknown,
            ..
        }
    )));
    assert_replays(&log, &state);
}

#[tokio::test]
async fn tool_list_is_frozen_per_step() {
    let (agent, provider) = agent(vec![ScriptedTurn::text("hi")]);
    // (Without approval_config's policy for `refund`: a policy naming a tool
    // the run is not offered is refused.)
    let config = RunConfig {
        tools: Some(vec!["add".into()]),
        policies: Vec::new(),
        ..approval_config()
    };
    let mut log = Vec::new();
    let (state, _) = agent.run(run_id(), "go", config, &mut log).await.unwrap();
    let offered: Vec<String> = provider.requests()[0]
        .tools
        .iter()
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(offered, ["add", "ask_customer"]);
    assert_eq!(state.step_tools.len(), 2);
    let frozen = log.iter().find_map(|e| match &e.kind {
        EventKind::StepStart { tools, .. } => Some(tools.len()),
        _ => None,
    });
    assert_eq!(frozen, Some(2));
}
