//! Issue 32, child runs: agents offered as tools. One model turn calls three
//! agent tools; the run parks at `awaiting_children`; `child_ended`
//! payloads (in any order) resume it with the results in call order; the
//! children's spend counts toward the parent's budget; the same log
//! replays to the same state and resumes from JSON alike.

use crate::common;

use common::*;
use glia_agent::agent::AgentError;
use glia_agent::provider::ScriptedTurn;
use glia_proto::{
    BudgetLimits, ChildAgent, Disposition, EventKind, Limit, Outcome, PauseReason, Payload,
    PullPoint, RunConfig, RunState, Status, ToolSource, Usage,
};
use serde_json::json;
use uuid::Uuid;

fn child(name: &str) -> ChildAgent {
    ChildAgent {
        name: name.into(),
        version: 2,
        content_hash: format!("sha256:{}", "0".repeat(64)),
        description: format!("The {name} desk."),
    }
}

/// A config offering three agents, as admission freezes them.
fn config(budget: BudgetLimits) -> RunConfig {
    RunConfig {
        agents: vec!["payouts@2".into(), "billing@2".into(), "search@2".into()],
        child_agents: vec![child("payouts"), child("billing"), child("search")],
        budget,
        ..RunConfig::default()
    }
}

fn three_calls() -> Vec<ScriptedTurn> {
    vec![
        ScriptedTurn::calls(&[
            ("payouts", json!({"goal": "refund order A1"})),
            ("billing", json!({"goal": "check invoice 7"})),
            ("search", json!({"goal": "find the policy"})),
        ]),
        ScriptedTurn::text("All three done."),
    ]
}

fn ended(call_id: &str, outcome: Outcome, cost_usd_micros: u64) -> Payload {
    Payload::ChildEnded {
        call_id: call_id.into(),
        child_run_id: Some(Uuid::from_u128(call_id.len() as u128 + 7)),
        outcome,
        usage: Usage {
            input_tokens: 100,
            output_tokens: 10,
            ..Usage::default()
        },
        cost_usd_micros,
    }
}

fn ok(answer: &str) -> Outcome {
    Outcome::Succeeded {
        answer: answer.into(),
        output: None,
    }
}

#[tokio::test]
async fn three_agent_calls_park_and_resume_with_results_in_call_order() {
    let (agent, provider) = agent(three_calls());
    let mut log = Vec::new();
    let (mut state, status) = agent
        .run(
            run_id(),
            "triage ticket 9",
            config(BudgetLimits::default()),
            &mut log,
        )
        .await
        .unwrap();
    let ids = vec!["call_1".to_owned(), "call_2".into(), "call_3".into()];
    assert_eq!(
        status,
        Status::Parked(PullPoint::AwaitingChildren {
            call_ids: ids.clone()
        })
    );
    // The three tools were offered as agents, with the goal schema.
    let offered = &provider.requests()[0].tools;
    for name in ["payouts", "billing", "search"] {
        let spec = offered.iter().find(|t| t.name == name).expect("offered");
        assert_eq!(spec.input_schema["required"], json!(["goal"]));
    }
    assert!(matches!(
        state.step_tools.iter().find(|t| t.name == "payouts").unwrap().source,
        Some(ToolSource::Agent { ref agent, .. }) if agent == "payouts@2"
    ));
    // Each call is a child call with its goal and key.
    for c in &state.pending_calls {
        assert_eq!(c.disposition, Some(Disposition::Child));
        let child = c.child.as_ref().unwrap();
        assert!(child.key.ends_with(&c.call_id));
    }
    assert_eq!(
        state.pending_calls[0].child.as_ref().unwrap().goal,
        "refund order A1"
    );
    assert_eq!(state.usage.tool_calls, 3);

    // Children end out of order; the run stays parked until the last.
    let mut cost = 0;
    for (call, answer, micros) in [("call_3", "policy P-4", 300), ("call_1", "refunded", 100)] {
        let s = agent
            .advance(&mut state, Some(ended(call, ok(answer), micros)), &mut log)
            .await
            .unwrap();
        cost += micros;
        assert!(
            matches!(s, Status::Parked(PullPoint::AwaitingChildren { .. })),
            "{s:?}"
        );
        assert_eq!(state.usage.cost_usd_micros, cost);
    }
    assert_eq!(
        state.parked,
        Some(PullPoint::AwaitingChildren {
            call_ids: vec!["call_2".into()]
        })
    );
    // A second end of the same call is refused, nothing recorded.
    let before = log.len();
    let again = agent
        .advance(&mut state, Some(ended("call_1", ok("again"), 1)), &mut log)
        .await;
    assert!(
        matches!(again, Err(AgentError::InvalidResume(_))),
        "{again:?}"
    );
    assert_eq!(log.len(), before);

    let failed = Outcome::Failed {
        error: "the billing system is down".into(),
    };
    let s = agent
        .advance(&mut state, Some(ended("call_2", failed, 50)), &mut log)
        .await
        .unwrap();
    assert!(
        matches!(s, Status::Done(Outcome::Succeeded { ref answer, .. }) if answer == "All three done."),
        "{s:?}"
    );
    // The next request holds the three results in call order; the failure
    // is an error result naming the agent.
    let request = &provider.requests()[1];
    let results = &request.messages.last().unwrap().content;
    let order: Vec<&str> = results
        .iter()
        .filter_map(|b| match b {
            glia_proto::ContentBlock::ToolResult { tool_use_id, .. } => Some(tool_use_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(order, ["call_1", "call_2", "call_3"]);
    assert_eq!(result_in(request, "call_1"), ("refunded".into(), false));
    let (billing, is_error) = result_in(request, "call_2");
    assert!(is_error);
    assert!(
        billing
            .to_text()
            .contains("billing@2 failed: the billing system is down")
    );
    // Spend: the children's tokens and cost count toward the parent's usage.
    assert_eq!(state.usage.cost_usd_micros, 450);
    assert!(state.usage.tokens.input_tokens >= 300);
    let ends: Vec<_> = log
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ChildEnded { .. }))
        .collect();
    assert_eq!(ends.len(), 3);
    assert!(
        !ends[0].kind.carries_spend(),
        "tenant caps count the child's own events"
    );
    assert_replays(&log, &state);
}

#[tokio::test]
async fn resumed_from_json_at_each_end_gives_the_same_log() {
    let payloads = [
        ended("call_2", ok("invoice paid"), 10),
        ended("call_1", ok("refunded"), 20),
        ended(
            "call_3",
            Outcome::Cancelled {
                reason: "stop".into(),
            },
            30,
        ),
    ];
    // Uninterrupted.
    let (agent_a, _) = agent(three_calls());
    let mut log_a = Vec::new();
    let (mut state_a, _) = agent_a
        .run(
            run_id(),
            "triage",
            config(BudgetLimits::default()),
            &mut log_a,
        )
        .await
        .unwrap();
    for p in payloads.clone() {
        agent_a
            .advance(&mut state_a, Some(p), &mut log_a)
            .await
            .unwrap();
    }
    // Through JSON, with a fresh agent at every payload.
    let mut log_b = Vec::new();
    let mut checkpoint = {
        let (agent_b, _) = agent(three_calls());
        let (state, _) = agent_b
            .run(
                run_id(),
                "triage",
                config(BudgetLimits::default()),
                &mut log_b,
            )
            .await
            .unwrap();
        serde_json::to_string(&state).unwrap()
    };
    for p in payloads {
        let mut state: RunState = serde_json::from_str(&checkpoint).unwrap();
        let (agent_b, _) = agent_at(three_calls(), served(&log_b));
        agent_b
            .advance(&mut state, Some(p), &mut log_b)
            .await
            .unwrap();
        checkpoint = serde_json::to_string(&state).unwrap();
    }
    let state_b: RunState = serde_json::from_str(&checkpoint).unwrap();
    assert_eq!(log_a, log_b);
    assert_eq!(state_a, state_b);
    assert_replays(&log_a, &state_a);
    assert!(matches!(state_a.outcome, Some(Outcome::Succeeded { .. })));
}

#[tokio::test]
async fn the_childrens_cost_counts_toward_the_parents_budget() {
    let budget = BudgetLimits {
        max_cost_usd_micros: Some(1_000),
        ..BudgetLimits::default()
    };
    let (agent, provider) = agent(three_calls());
    let mut log = Vec::new();
    let (mut state, _) = agent
        .run(run_id(), "triage", config(budget), &mut log)
        .await
        .unwrap();
    for (call, micros) in [("call_1", 400), ("call_2", 400), ("call_3", 400)] {
        agent
            .advance(&mut state, Some(ended(call, ok("done"), micros)), &mut log)
            .await
            .unwrap();
    }
    // 1,200 of 1,000 spent by the children: no further model call.
    assert_eq!(state.usage.cost_usd_micros, 1_200);
    assert_eq!(
        state.parked,
        Some(PullPoint::Paused {
            reason: PauseReason::Budget { limit: Limit::Cost }
        })
    );
    assert_eq!(provider.requests().len(), 1);
    assert_replays(&log, &state);
}

#[tokio::test]
async fn an_agent_tool_that_clashes_with_a_registered_tool_is_refused() {
    // `add` is one of the worker's fixture tools.
    let mut config = config(BudgetLimits::default());
    config.agents.push("add@2".into());
    config.child_agents.push(child("add"));
    let (agent, _) = agent(three_calls());
    let mut log = Vec::new();
    let (state, status) = agent
        .run(run_id(), "triage", config, &mut log)
        .await
        .unwrap();
    assert!(
        matches!(status, Status::Done(Outcome::Failed { ref error }) if error.contains("add")),
        "{status:?}"
    );
    assert!(state.pending_calls.is_empty());
}
