//! Issue 32, child runs, in one process: the dispatcher over the in-memory
//! twins, a hand-driven worker (the real loop, `glia_agent::Agent`, over
//! scripts by model name) and the children loop's passes
//! (`children::sweep_once`). Admission resolves and freezes `agents`;
//! three agent calls start three linked children, once however often the
//! loop passes; their ends resume the parent with the results in call
//! order; cancel, pause and resume cascade, and children a done parent
//! left behind (a cascade cut short) are cancelled once; the parent's remainder bounds a
//! child's budget and a child stopped by it is a tool error; a cycle of
//! agents ends at the depth limit; bad names are refused with nothing
//! started.

use crate::common;

use std::sync::Arc;

use axum::http::StatusCode;
use glia_agent::agent::Agent;
use glia_agent::provider::ScriptedTurn;
use glia_backends::{Inbox, RunFilter, RunLog, RunStatus, RunSummary};
use glia_dispatcher::children::{cancel_stranded, sweep_once};
use glia_proto::{EventKind, Outcome, Payload, PullPoint, Status};
use serde_json::{Value, json};
use uuid::Uuid;

use common::*;

async fn children_of(h: &H, parent: Uuid) -> Vec<RunSummary> {
    let mut runs = h
        .log
        .list_runs(&RunFilter {
            parent: Some(parent),
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    runs.reverse();
    runs
}

fn refunder() -> Value {
    json!({"name": "refunder", "description": "Refunds orders.", "model": "script:child", "tools": []})
}

fn three_calls() -> Vec<ScriptedTurn> {
    vec![
        ScriptedTurn::calls(&[
            ("refunder", json!({"goal": "refund A1"})),
            ("refunder", json!({"goal": "refund A2"})),
            ("refunder", json!({"goal": "refund A3"})),
        ]),
        ScriptedTurn::text("All three refunded."),
    ]
}

#[tokio::test]
async fn three_children_run_once_and_resume_the_parent_in_call_order() {
    let h = harness();
    register(&h, "a", refunder()).await;
    let agent = scripts(&[
        ("parent", three_calls()),
        ("child", vec![ScriptedTurn::text("Refund done.")]),
    ]);
    let parent = create(
        &h,
        SUB_A,
        json!({"goal": "refund three orders", "config": {"model": "script:parent", "agents": ["refunder"]}}),
    )
    .await;
    // Admission froze the agent's version and hash.
    let start = h.log.events(parent, 0, 1).await.unwrap();
    let EventKind::SessionStart { config, .. } = &start[0].kind else {
        panic!("session.start first")
    };
    assert_eq!(config.child_agents.len(), 1);
    assert_eq!(config.child_agents[0].reference(), "refunder@1");
    assert_eq!(config.child_agents[0].description, "Refunds orders.");

    let status = work(&h, &agent, parent).await;
    let Status::Parked(PullPoint::AwaitingChildren { call_ids }) = status else {
        panic!("parked at awaiting_children, not {status:?}")
    };
    assert_eq!(call_ids.len(), 3);

    // Passes of the loop (two dispatchers, a restart): three children, once.
    for _ in 0..3 {
        sweep_once(&h.app).await.unwrap();
    }
    let children = children_of(&h, parent).await;
    assert_eq!(children.len(), 3, "one child per call");
    for (child, call) in children.iter().zip(&call_ids) {
        assert_eq!(child.parent_run_id, Some(parent));
        assert_eq!(child.parent_call_id.as_deref(), Some(call.as_str()));
        assert_eq!(child.depth, 1);
        assert_eq!(child.tenant, "a");
        assert_eq!(child.agent.as_deref(), Some("refunder"));
    }
    // The API shows the link and lists the children.
    let got = get(&h, &format!("/v1/runs/{}", children[0].run_id), SUB_A).await;
    assert_eq!(got.body["parent_run_id"], json!(parent.to_string()));
    assert_eq!(got.body["depth"], json!(1));
    let listed = get(&h, &format!("/v1/runs?parent={parent}"), SUB_A).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text);
    assert_eq!(listed.body["runs"].as_array().unwrap().len(), 3);
    // Another tenant sees none of them.
    let foreign = get(&h, &format!("/v1/runs?parent={parent}"), SUB_B).await;
    assert_eq!(foreign.body["runs"].as_array().unwrap().len(), 0);

    // The children run (the last first); nothing is posted before they end.
    for child in children.iter().rev() {
        assert!(matches!(
            work(&h, &agent, child.run_id).await,
            Status::Done(_)
        ));
    }
    for _ in 0..3 {
        sweep_once(&h.app).await.unwrap();
    }
    let inbox = h.log.inbox(parent).await.unwrap();
    assert_eq!(
        inbox.len(),
        3,
        "one child_ended per child, however many passes"
    );
    let status = work(&h, &agent, parent).await;
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { ref answer, .. }) if answer == "All three refunded."),
        "{status:?}"
    );
    let events = h.log.events(parent, 0, 1000).await.unwrap();
    let ended: Vec<&str> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ChildEnded {
                call_id, outcome, ..
            } => {
                assert!(matches!(outcome, Outcome::Succeeded { .. }));
                Some(call_id.as_str())
            }
            _ => None,
        })
        .collect();
    assert_eq!(ended.len(), 3);
    let state = state_of(&events);
    assert_eq!(state, h.log.load(parent).await.unwrap());
    // The results joined the conversation in call order.
    let results: Vec<String> = state.messages[2]
        .content
        .iter()
        .filter_map(|b| match b {
            glia_proto::ContentBlock::ToolResult { tool_use_id, .. } => Some(tool_use_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(results, call_ids);
    // The children's tokens count in the parent's usage.
    let child_tokens: u64 = children_of(&h, parent)
        .await
        .iter()
        .map(|c| c.usage.tokens.input_tokens)
        .sum();
    assert!(child_tokens > 0);
    let parent_run = h.log.get_run(parent).await.unwrap();
    assert!(parent_run.usage.tokens.input_tokens >= child_tokens);
    // Passes after the end post nothing more.
    sweep_once(&h.app).await.unwrap();
    assert!(h.log.inbox(parent).await.unwrap().is_empty());

    // The console: the parent lists its children, a child links its parent,
    // the timeline shows the ends.
    let login = send(
        &h.router,
        crate::inbox::form(
            "/inbox/login",
            None,
            Some("http://glia.test"),
            &[("token", APP_A)],
        ),
    )
    .await;
    assert_eq!(login.status, StatusCode::SEE_OTHER, "{}", login.text);
    let cookie = login.headers[axum::http::header::SET_COOKIE]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let page = send(
        &h.router,
        crate::inbox::page(&format!("/console/runs/{parent}"), &cookie),
    )
    .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    assert!(page.text.contains("Child runs"), "{}", page.text);
    for child in &children {
        assert!(
            page.text
                .contains(&format!("/console/runs/{}", child.run_id))
        );
    }
    assert!(
        page.text.contains("Child run of refunder@1 succeeded"),
        "{}",
        page.text
    );
    let page = send(
        &h.router,
        crate::inbox::page(&format!("/console/runs/{}", children[0].run_id), &cookie),
    )
    .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    assert!(page.text.contains("Child run of"), "{}", page.text);
    assert!(page.text.contains(&format!("/console/runs/{parent}")));
}

/// A parent whose model called `refunder` three times, and its three
/// children started by one pass of the loop.
async fn parent_with_three_children() -> (H, Agent, Uuid, Vec<RunSummary>) {
    let h = harness();
    register(&h, "a", refunder()).await;
    let agent = scripts(&[("parent", three_calls())]);
    let parent = create(
        &h,
        SUB_A,
        json!({"goal": "g", "config": {"model": "script:parent", "agents": ["refunder@1"]}}),
    )
    .await;
    work(&h, &agent, parent).await;
    sweep_once(&h.app).await.unwrap();
    let children = children_of(&h, parent).await;
    assert_eq!(children.len(), 3);
    (h, agent, parent, children)
}

#[tokio::test]
async fn cancel_pause_and_resume_cascade_to_running_children() {
    let (h, agent, parent, children) = parent_with_three_children().await;

    let r = post(&h, &format!("/v1/runs/{parent}/pause"), SUB_A, json!({})).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    for c in &children {
        let inbox = h.log.inbox(c.run_id).await.unwrap();
        assert!(
            matches!(&inbox[..], [i] if matches!(&i.payload, Payload::Pause { reason, .. } if reason.starts_with("the parent run was paused"))),
            "{inbox:?}"
        );
    }
    let r = post(&h, &format!("/v1/runs/{parent}/resume"), SUB_A, json!({})).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    for c in &children {
        let inbox = h.log.inbox(c.run_id).await.unwrap();
        assert!(
            matches!(
                inbox.last().map(|i| &i.payload),
                Some(Payload::Resume { .. })
            ),
            "{inbox:?}"
        );
    }

    let r = post(
        &h,
        &format!("/v1/runs/{parent}/cancel"),
        SUB_A,
        json!({"reason": "not needed"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    for c in &children {
        let inbox = h.log.inbox(c.run_id).await.unwrap();
        assert!(
            inbox
                .iter()
                .any(|i| matches!(&i.payload, Payload::Cancel { reason } if reason.contains(&parent.to_string()))),
            "{inbox:?}"
        );
        assert!(matches!(
            work(&h, &agent, c.run_id).await,
            Status::Done(Outcome::Cancelled { .. })
        ));
    }
    assert!(matches!(
        work(&h, &agent, parent).await,
        Status::Done(Outcome::Cancelled { .. })
    ));
    // Nothing is posted to a finished parent.
    sweep_once(&h.app).await.unwrap();
    assert!(h.log.inbox(parent).await.unwrap().is_empty());
}

#[tokio::test]
async fn children_a_cancelled_parent_left_behind_are_cancelled_once() {
    let (h, agent, parent, children) = parent_with_three_children().await;
    assert_eq!(
        cancel_stranded(&h.app).await.unwrap(),
        0,
        "a parent not done strands nobody"
    );
    // The parent's cancel is applied but its cascade never ran (the
    // dispatcher died right after posting it).
    h.log
        .post(
            parent,
            Payload::Cancel {
                reason: "stop".into(),
            },
        )
        .await
        .unwrap();
    assert!(matches!(
        work(&h, &agent, parent).await,
        Status::Done(Outcome::Cancelled { .. })
    ));
    assert_eq!(cancel_stranded(&h.app).await.unwrap(), 3);
    assert_eq!(
        cancel_stranded(&h.app).await.unwrap(),
        0,
        "a cancel waiting is not posted again"
    );
    for c in &children {
        let inbox = h.log.inbox(c.run_id).await.unwrap();
        assert!(
            matches!(&inbox[..], [i] if matches!(&i.payload, Payload::Cancel { reason } if reason.contains(&parent.to_string()))),
            "{inbox:?}"
        );
        assert!(matches!(
            work(&h, &agent, c.run_id).await,
            Status::Done(Outcome::Cancelled { .. })
        ));
    }
    assert_eq!(cancel_stranded(&h.app).await.unwrap(), 0);
}

#[tokio::test]
async fn the_parents_remainder_bounds_a_childs_budget() {
    let h = harness();
    register(
        &h,
        "a",
        json!({"name": "thinker", "model": "script:child", "tools": [], "budget": {"max_turns": 10, "max_tool_calls": 4}}),
    )
    .await;
    let agent = scripts(&[
        (
            "parent",
            vec![
                ScriptedTurn::call("thinker", json!({"goal": "think"})),
                ScriptedTurn::text("Thought."),
            ],
        ),
        ("child", vec![ScriptedTurn::text("done")]),
    ]);
    let parent = create(
        &h,
        SUB_A,
        json!({"goal": "g", "config": {"model": "script:parent", "agents": ["thinker@1"], "budget": {"max_turns": 3, "max_cost_usd_micros": 500}}}),
    )
    .await;
    work(&h, &agent, parent).await;
    sweep_once(&h.app).await.unwrap();
    let child = children_of(&h, parent).await.remove(0);
    let start = h.log.events(child.run_id, 0, 1).await.unwrap();
    let EventKind::SessionStart { config, .. } = &start[0].kind else {
        panic!("session.start first")
    };
    // min(own, parent's limit - parent's use), per limit.
    assert_eq!(config.budget.max_turns, Some(2), "min(10, 3 - 1)");
    assert_eq!(config.budget.max_cost_usd_micros, Some(500));
    assert_eq!(
        config.budget.max_tool_calls,
        Some(4),
        "the parent has no such limit"
    );
    assert!(matches!(
        work(&h, &agent, child.run_id).await,
        Status::Done(_)
    ));
    sweep_once(&h.app).await.unwrap();
    let status = work(&h, &agent, parent).await;
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { .. })),
        "{status:?}"
    );
}

#[tokio::test]
async fn a_child_paused_by_its_budget_is_cancelled_and_the_parent_told() {
    let h = harness();
    register(
        &h,
        "a",
        json!({"name": "looper", "model": "script:loop", "tools": ["calculator"]}),
    )
    .await;
    let calc = ScriptedTurn::call("calculator", json!({"op": "add", "a": 1, "b": 2}));
    let mut tools = glia_agent::tool::ToolRegistry::default();
    tools.register_dyn(Arc::new(Calculator)).unwrap();
    let agent = scripts(&[
        (
            "parent",
            vec![
                ScriptedTurn::call("looper", json!({"goal": "add forever"})),
                ScriptedTurn::text("The looper ran out of budget."),
            ],
        ),
        ("loop", vec![calc.clone(), calc.clone(), calc.clone(), calc]),
    ])
    .with_tools(tools);
    let parent = create(
        &h,
        SUB_A,
        json!({"goal": "g", "config": {"model": "script:parent", "agents": ["looper@1"], "budget": {"max_turns": 3}}}),
    )
    .await;
    work(&h, &agent, parent).await;
    sweep_once(&h.app).await.unwrap();
    let child = children_of(&h, parent).await.remove(0);
    // Two model calls allowed (3 - 1): the child pauses at its budget.
    let status = work(&h, &agent, child.run_id).await;
    assert!(
        matches!(status, Status::Parked(PullPoint::Paused { .. })),
        "{status:?}"
    );
    // The loop cancels it; its end reaches the parent as a tool error.
    sweep_once(&h.app).await.unwrap();
    let status = work(&h, &agent, child.run_id).await;
    assert!(
        matches!(status, Status::Done(Outcome::Cancelled { ref reason }) if reason.contains("budget")),
        "{status:?}"
    );
    sweep_once(&h.app).await.unwrap();
    let status = work(&h, &agent, parent).await;
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { .. })),
        "{status:?}"
    );
    let state = h.log.load(parent).await.unwrap();
    let seen = serde_json::to_string(&state.messages).unwrap();
    assert!(seen.contains("was cancelled"), "{seen}");
    assert!(seen.contains("budget"), "{seen}");
}

#[tokio::test]
async fn a_cycle_of_agents_stops_at_the_depth_limit() {
    let h = harness();
    register(
        &h,
        "a",
        json!({"name": "ping", "model": "script:ping", "tools": [], "agents": ["pong"]}),
    )
    .await;
    register(
        &h,
        "a",
        json!({"name": "pong", "model": "script:pong", "tools": [], "agents": ["ping"]}),
    )
    .await;
    // `ping` calls `pong`, which calls `ping` … each answers what it heard.
    let agent = scripts(&[
        (
            "ping",
            vec![
                ScriptedTurn::call("pong", json!({"goal": "pong?"})),
                ScriptedTurn::text("ping done"),
            ],
        ),
        (
            "pong",
            vec![
                ScriptedTurn::call("ping", json!({"goal": "ping?"})),
                ScriptedTurn::text("pong done"),
            ],
        ),
    ]);
    let top = create(&h, SUB_A, json!({"goal": "start", "agent": "ping"})).await;
    // Drive everything until the top run is done.
    for _ in 0..40 {
        work_all(&h, &agent).await;
        sweep_once(&h.app).await.unwrap();
        if h.log.get_run(top).await.unwrap().status == RunStatus::Done {
            break;
        }
    }
    let runs = all_runs(&h).await;
    // Depths 0 … 4: five runs, the deepest call refused, nothing more started.
    let mut depths: Vec<u32> = runs.iter().map(|r| r.depth).collect();
    depths.sort_unstable();
    assert_eq!(depths, [0, 1, 2, 3, 4]);
    assert!(runs.iter().all(|r| r.status == RunStatus::Done));
    let deepest = runs.iter().find(|r| r.depth == 4).unwrap();
    let events = h.log.events(deepest.run_id, 0, 1000).await.unwrap();
    let refused = events.iter().find_map(|e| match &e.kind {
        EventKind::ChildEnded {
            child_run_id: None,
            outcome: Outcome::Failed { error },
            ..
        } => Some(error.clone()),
        _ => None,
    });
    assert!(
        refused
            .as_deref()
            .is_some_and(|e| e.contains("depth") && e.contains("limit")),
        "{refused:?}"
    );
    assert!(matches!(
        h.log.get_run(top).await.unwrap().outcome,
        Some(Outcome::Succeeded { .. })
    ));
}

#[tokio::test]
async fn bad_agent_names_are_refused_naming_the_field_with_nothing_started() {
    let h = harness();
    register(&h, "b", json!({"name": "bees", "model": "m", "tools": []})).await;
    register(
        &h,
        "a",
        json!({"name": "dangling", "model": "m", "tools": [], "agents": ["nobody@1"]}),
    )
    .await;
    let cases = [
        (
            json!({"goal": "g", "config": {"agents": ["nobody@1"]}}),
            "config.agents[0]",
            "is registered for this tenant",
        ),
        (
            json!({"goal": "g", "config": {"agents": ["refund@0"]}}),
            "config.agents[0]",
            "whole number",
        ),
        (
            json!({"goal": "g", "config": {"agents": ["Bad Name"]}}),
            "config.agents[0]",
            "must match",
        ),
        // Another tenant's agent answers like a missing one.
        (
            json!({"goal": "g", "config": {"agents": ["bees"]}}),
            "config.agents[0]",
            "is registered for this tenant",
        ),
        (
            json!({"goal": "g", "config": {"agents": ["bees", "bees"]}}),
            "config.agents[1]",
            "listed twice",
        ),
        (
            json!({"goal": "g", "config": {"agents": ["x"], "external_tools": [{"name": "x", "description": "d", "input_schema": {"type": "object"}}]}}),
            "config.agents[0]",
            "taken",
        ),
        (
            json!({"goal": "g", "config": {"child_agents": [{"name": "x", "version": 1, "content_hash": "sha256:00"}]}}),
            "config.child_agents",
            "unknown field",
        ),
        (
            json!({"goal": "g", "agent": "dangling"}),
            "agent (dangling).agents[0]",
            "is registered for this tenant",
        ),
    ];
    for (body, field, reason) in cases {
        let r = post(&h, "/v1/runs", SUB_A, body.clone()).await;
        assert!(r.status.is_client_error(), "{body}: {}", r.text);
        assert_eq!(r.body["error"]["field"], json!(field), "{body}: {}", r.text);
        assert!(
            r.body["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains(reason),
            "{body}: {}",
            r.text
        );
    }
    let runs = all_runs(&h).await;
    assert!(runs.is_empty(), "nothing started: {runs:?}");
}
