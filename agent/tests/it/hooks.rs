//! Hook firing order, payload mutation, cancel, skip and pause, checked event
//! by event in the style of the harness contract's own tests.

use crate::common;

use std::sync::{Arc, Mutex};

use common::*;
use glia_agent::hooks::{Hooks, Verdict};
use glia_agent::provider::ScriptedTurn;
use glia_proto::{
    EventKind, HookEffect, HookTopic, Outcome, PauseReason, Payload, PullPoint, RunConfig, Status,
    ToolErrorKind,
};
use serde_json::json;

/// Hooks that record every topic they see.
fn tracing_hooks(seen: &Arc<Mutex<Vec<HookTopic>>>) -> Hooks {
    let mut hooks = Hooks::default();
    for topic in HookTopic::ALL {
        let seen = seen.clone();
        hooks.on(topic, "trace", move |_| {
            seen.lock().unwrap().push(topic);
            Verdict::Continue
        });
    }
    hooks
}

#[tokio::test]
async fn topics_fire_in_loop_order() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (agent, _) = agent(vec![
        ScriptedTurn::call("add", json!({"a": 1, "b": 2})),
        ScriptedTurn::text("3"),
    ]);
    let agent = agent.with_hooks(tracing_hooks(&seen));
    let mut log = Vec::new();
    agent
        .run(run_id(), "add", RunConfig::default(), &mut log)
        .await
        .unwrap();
    use HookTopic::*;
    assert_eq!(
        *seen.lock().unwrap(),
        [
            BeforePlan,
            AfterPlan,
            BeforeStep,
            BeforeToolCall,
            AfterToolCall,
            AfterStep,
            OnComplete
        ]
    );
    assert!(
        !names(&log).contains(&"hook.applied"),
        "hooks that change nothing leave no trace"
    );
}

#[tokio::test]
async fn pause_budget_and_error_topics_fire() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let script = vec![
        ScriptedTurn::call("add", json!({"a": 1, "b": 2})),
        ScriptedTurn {
            error: Some("transient".into()),
            ..Default::default()
        },
    ];
    let (agent, _) = agent(script);
    let agent = agent.with_hooks(tracing_hooks(&seen));
    let config = RunConfig {
        budget: glia_proto::BudgetLimits {
            max_turns: Some(1),
            ..Default::default()
        },
        ..RunConfig::default()
    };
    let mut log = Vec::new();
    let (mut state, _) = agent.run(run_id(), "add", config, &mut log).await.unwrap();
    let extend = Payload::ExtendBudget {
        extra: glia_proto::BudgetLimits {
            max_turns: Some(5),
            ..Default::default()
        },
    };
    assert!(
        agent
            .advance(&mut state, Some(extend), &mut log)
            .await
            .is_err()
    );
    let seen = seen.lock().unwrap();
    let tail: Vec<HookTopic> = seen
        .iter()
        .copied()
        .skip_while(|t| *t != HookTopic::OnBudgetExceeded)
        .collect();
    assert_eq!(
        tail,
        [
            HookTopic::OnBudgetExceeded,
            HookTopic::OnPause,
            HookTopic::OnError
        ]
    );
}

#[tokio::test]
async fn subscribers_run_in_registration_order_and_see_each_others_changes() {
    let seen_by_second = Arc::new(Mutex::new(None));
    let mut hooks = Hooks::default();
    hooks.on(HookTopic::BeforeToolCall, "double-a", |p| {
        let a = p["input"]["a"].as_i64().unwrap();
        p["input"]["a"] = json!(a * 2);
        Verdict::Continue
    });
    let s = seen_by_second.clone();
    hooks.on(HookTopic::BeforeToolCall, "observer", move |p| {
        *s.lock().unwrap() = Some(p["input"].clone());
        Verdict::Continue
    });
    hooks.on(HookTopic::AfterToolCall, "redact", |p| {
        p["content"] = json!("[redacted]");
        Verdict::Continue
    });
    let (agent, provider) = agent(vec![
        ScriptedTurn::call("add", json!({"a": 5, "b": 1})),
        ScriptedTurn::text("11"),
    ]);
    let agent = agent.with_hooks(hooks);
    let mut log = Vec::new();
    let (state, _) = agent
        .run(run_id(), "add", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert_eq!(
        *seen_by_second.lock().unwrap(),
        Some(json!({"a": 10, "b": 1}))
    );

    let interesting: Vec<&EventKind> = log
        .iter()
        .map(|e| &e.kind)
        .skip_while(|k| !matches!(k, EventKind::HookApplied { .. }))
        .take(4)
        .collect();
    assert!(
        matches!(interesting[0], EventKind::HookApplied { topic: HookTopic::BeforeToolCall, hook, effect: HookEffect::Modified { payload }, .. }
        if hook == "double-a" && payload["input"] == json!({"a": 10, "b": 1}))
    );
    assert!(
        matches!(interesting[1], EventKind::ToolCall(c) if c.input == json!({"a": 10, "b": 1})),
        "the modified arguments are what runs"
    );
    assert!(
        matches!(interesting[2], EventKind::HookApplied { topic: HookTopic::AfterToolCall, hook, .. } if hook == "redact")
    );
    assert!(
        matches!(interesting[3], EventKind::ToolResult { content, .. } if content == "[redacted]")
    );
    // The model saw the redacted result; the tool really got a=10.
    let last = provider
        .requests()
        .last()
        .unwrap()
        .messages
        .last()
        .unwrap()
        .clone();
    assert!(
        matches!(&last.content[0], glia_proto::ContentBlock::ToolResult { content, .. } if content == "[redacted]")
    );
    assert_replays(&log, &state);
}

#[tokio::test]
async fn cancel_on_before_tool_call_refuses_the_call_and_stops_the_chain() {
    let later_ran = Arc::new(Mutex::new(false));
    let mut hooks = Hooks::default();
    hooks.on(HookTopic::BeforeToolCall, "guard", |p| {
        if p["name"] == "refund" {
            Verdict::Cancel("refunds are frozen".into())
        } else {
            Verdict::Continue
        }
    });
    let l = later_ran.clone();
    hooks.on(HookTopic::BeforeToolCall, "later", move |_| {
        *l.lock().unwrap() = true;
        Verdict::Continue
    });
    let (agent, _) = agent(vec![
        ScriptedTurn::call("refund", json!({"order": "A1", "amount": 1})),
        ScriptedTurn::text("cannot"),
    ]);
    let agent = agent.with_hooks(hooks);
    let mut log = Vec::new();
    let (state, status) = agent
        .run(run_id(), "refund", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert!(!*later_ran.lock().unwrap(), "a cancel ends the chain");
    assert!(matches!(status, Status::Done(Outcome::Succeeded { .. })));
    let names = names(&log);
    let i = names.iter().position(|n| *n == "hook.applied").unwrap();
    assert_eq!(
        &names[i..i + 3],
        ["hook.applied", "tool.call", "tool.error"]
    );
    assert!(
        matches!(&log[i + 2].kind, EventKind::ToolError { error: ToolErrorKind::Cancelled, message, .. } if message.contains("refunds are frozen"))
    );
    assert_replays(&log, &state);
}

#[tokio::test]
async fn skip_on_before_step_skips_the_step() {
    let mut hooks = Hooks::default();
    hooks.on(HookTopic::BeforeStep, "skipper", |_| Verdict::Skip);
    let (agent, provider) = agent(vec![ScriptedTurn::text("never asked")]);
    let agent = agent.with_hooks(hooks);
    let mut log = Vec::new();
    let (_, status) = agent
        .run(run_id(), "go", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert_eq!(
        names(&log),
        [
            "session.start",
            "plan.draft",
            "plan.commit",
            "hook.applied",
            "step.start",
            "step.end",
            "session.complete"
        ]
    );
    assert!(matches!(
        &log[5].kind,
        EventKind::StepEnd { skipped: true, .. }
    ));
    assert!(matches!(status, Status::Done(Outcome::Succeeded { .. })));
    assert_eq!(provider.served(), 0);
}

#[tokio::test]
async fn cancel_on_before_plan_cancels_the_run() {
    let mut hooks = Hooks::default();
    hooks.on(HookTopic::BeforePlan, "closed", |_| {
        Verdict::Cancel("outside business hours".into())
    });
    let (agent, _) = agent(vec![]);
    let agent = agent.with_hooks(hooks);
    let mut log = Vec::new();
    let (_, status) = agent
        .run(run_id(), "go", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert_eq!(
        names(&log),
        ["session.start", "hook.applied", "session.cancel"]
    );
    assert_eq!(
        status,
        Status::Done(Outcome::Cancelled {
            reason: "outside business hours".into()
        })
    );
}

#[tokio::test]
async fn after_plan_may_rewrite_the_plan() {
    let mut hooks = Hooks::default();
    hooks.on(HookTopic::AfterPlan, "two-steps", |p| {
        p["steps"] = json!(["Look it up.", "Answer."]);
        Verdict::Continue
    });
    let (agent, _) = agent(vec![
        ScriptedTurn::text("found"),
        ScriptedTurn::text("answered"),
    ]);
    let agent = agent.with_hooks(hooks);
    let mut log = Vec::new();
    let (state, status) = agent
        .run(run_id(), "go", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert_eq!(state.plan, ["Look it up.", "Answer."]);
    assert_eq!(
        status,
        Status::Done(Outcome::Succeeded {
            answer: "answered".into(),
            output: None
        })
    );
    assert_eq!(
        names(&log).iter().filter(|n| **n == "step.start").count(),
        2
    );
    assert_replays(&log, &state);
}

#[tokio::test]
async fn pause_on_after_step_parks_for_review() {
    let mut hooks = Hooks::default();
    hooks.on(HookTopic::AfterStep, "review", |p| {
        if p["answer"].as_str().unwrap().contains("refund") {
            Verdict::Pause("mentions a refund".into())
        } else {
            Verdict::Continue
        }
    });
    let (agent, _) = agent(vec![ScriptedTurn::text("I will refund you.")]);
    let agent = agent.with_hooks(hooks);
    let mut log = Vec::new();
    let (mut state, status) = agent
        .run(run_id(), "go", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert_eq!(
        status,
        Status::Parked(PullPoint::Paused {
            reason: PauseReason::Hook {
                hook: "review".into(),
                reason: "mentions a refund".into()
            }
        })
    );
    let status = agent
        .advance(
            &mut state,
            Some(Payload::Resume {
                by: Some("lead".into()),
            }),
            &mut log,
        )
        .await
        .unwrap();
    assert!(matches!(status, Status::Done(Outcome::Succeeded { .. })));
    assert_replays(&log, &state);
}

#[tokio::test]
async fn verdicts_a_topic_does_not_honour_are_ignored() {
    let mut hooks = Hooks::default();
    hooks.on(HookTopic::OnComplete, "noisy", |p| {
        p["outcome"] = json!("changed");
        Verdict::Cancel("too late".into())
    });
    let (agent, _) = agent(vec![ScriptedTurn::text("done")]);
    let agent = agent.with_hooks(hooks);
    let mut log = Vec::new();
    let (_, status) = agent
        .run(run_id(), "go", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert!(matches!(status, Status::Done(Outcome::Succeeded { .. })));
    assert!(!names(&log).contains(&"hook.applied"));
}
