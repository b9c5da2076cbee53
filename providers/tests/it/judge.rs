//! An eval's LLM-as-judge grader (issue 31, `docs/evals.md`) against
//! recorded provider traffic, as the adapters are tested: the judge run
//! `glia_evals::grade` asks for (its goal and config) driven by the real
//! loop through the OpenAI adapter to a local server replaying recorded
//! streams, and its verdict read from the run's log
//! (`glia_evals::grade::judge_verdict`). A judge that answers a verdict
//! passes or fails by it; a judge that answers prose, or a verdict of the
//! wrong shape, is a grading error, never a pass.

use crate::common;

use std::sync::Arc;

use common::{Reply, Server, fixture};
use glia_agent::Agent;
use glia_agent::provider::Provider;
use glia_evals::dataset::Case;
use glia_evals::grade::{self, Graded, JudgeTask, RunFacts, ToolCallFact, Verdict};
use glia_evals::spec::{EvalSpec, GraderSpec};
use glia_proto::{Event, RunConfig};
use glia_providers::OpenAi;
use glia_providers::http::{HttpProvider, http_client};
use serde_json::{Value, json};
use uuid::Uuid;

/// The judge grader of an eval, parsed as an eval file's is.
fn judge_grader() -> GraderSpec {
    let spec = EvalSpec::from_value(json!({
        "name": "refunds",
        "dataset": "cases",
        "agents": ["support@1"],
        "graders": [{
            "kind": "judge",
            "model": "gpt-4o-2024-08-06",
            "rubric": "The agent must look the order up before refunding it.",
            "pass_threshold": 0.7
        }]
    }))
    .unwrap();
    spec.graders[0].clone()
}

/// The judge run the grader asks for, for a run that refunded order A1.
fn judge_task() -> JudgeTask {
    let case: Case = serde_json::from_value(json!({
        "id": "refund-a1",
        "goal": "Please refund order A1.",
        "expected": {"answer": "refunded"}
    }))
    .unwrap();
    let facts = RunFacts {
        outcome: "succeeded".into(),
        error: None,
        answer: "Order A1 is refunded.".into(),
        output: None,
        tool_calls: vec![
            ToolCallFact {
                name: "get_order".into(),
                input: json!({"order_id": "A1"}),
            },
            ToolCallFact {
                name: "refund_order".into(),
                input: json!({"order_id": "A1"}),
            },
        ],
        turns: 3,
        tool_call_count: 2,
        tokens: 900,
        cost_usd_micros: 1200,
        latency_ms: 2400,
    };
    match grade::grade(&judge_grader(), &case, &facts) {
        Graded::Judge(task) => task,
        other => panic!("a judge grader asks for a judge run, got {other:?}"),
    }
}

/// Run the judge task through the OpenAI adapter against `replies`; the
/// verdict, the requests the server saw, and the judge run's log.
async fn judge(replies: Vec<Reply>) -> (Verdict, Vec<common::Seen>, Vec<Event>) {
    let task = judge_task();
    let server = Server::replay(replies).await;
    let http = HttpProvider::new(
        OpenAi::default(),
        http_client().unwrap(),
        &format!("{}/v1", server.base),
        Some(glia_providers::ApiKey::new("sk-judge-test-key")),
    );
    let provider: Arc<dyn Provider> = Arc::new(http);
    let config: RunConfig = glia_proto::strict::from_json_value(task.config.clone()).unwrap();
    let mut log: Vec<Event> = Vec::new();
    let run_id = Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0031);
    Agent::new(provider)
        .run(run_id, &task.goal, config, &mut log)
        .await
        .unwrap();
    let facts = RunFacts::from_events(&log);
    let verdict = grade::judge_verdict(&task.grader, task.required, task.pass_threshold, &facts);
    (verdict, server.seen(), log)
}

fn kinds(log: &[Event]) -> Vec<&'static str> {
    log.iter().map(|e| e.kind.name()).collect()
}

#[tokio::test]
async fn a_judge_that_answers_a_verdict_grades_by_it() {
    let (verdict, seen, log) = judge(vec![Reply::sse(fixture("openai/judge_verdict.sse"))]).await;
    assert_eq!(seen.len(), 1, "one model call");
    let body = &seen[0].body;
    // The judge's system prompt, the rubric and the material in the goal,
    // and the verdict's shape offered as the output tool.
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "system");
    assert_eq!(messages[0]["content"], grade::JUDGE_SYSTEM);
    let goal = messages[1]["content"].to_string();
    assert!(
        goal.contains("The agent must look the order up before refunding it.")
            && goal.contains("Order A1 is refunded.")
            && goal.contains("get_order"),
        "{goal}"
    );
    let tools: Vec<&Value> = body["tools"].as_array().unwrap().iter().collect();
    assert_eq!(tools.len(), 1, "the judge has no tools but its verdict");
    assert_eq!(tools[0]["function"]["name"], "final_output");
    let schema = &tools[0]["function"]["parameters"];
    assert_eq!(
        schema["required"],
        json!(["score", "pass", "reasoning"]),
        "{schema}"
    );
    assert_eq!(
        (verdict.pass, verdict.score, verdict.error.as_deref()),
        (true, 0.8, None),
        "{verdict:?}"
    );
    assert!(
        verdict
            .reason
            .contains("looked order A1 up before refunding it"),
        "{verdict:?}"
    );
    assert!(
        kinds(&log).contains(&"session.complete"),
        "{:?}",
        kinds(&log)
    );
}

/// Prose where a verdict is due, again and again: the run never gives a
/// verdict, and the grade is an error, not a pass.
#[tokio::test]
async fn a_judge_that_answers_prose_is_a_grading_error() {
    let prose = || Reply::sse(fixture("openai/judge_prose.sse"));
    let (verdict, seen, log) = judge(vec![prose(), prose(), prose(), prose()]).await;
    assert!(seen.len() >= 2, "the loop asked again for the verdict");
    assert!(!verdict.pass, "{verdict:?}");
    assert_eq!(verdict.score, 0.0);
    assert_eq!(
        verdict.error.as_deref(),
        Some(
            "the judge run failed: answer rejected by output_schema: the answer must be given by calling final_output"
        ),
        "{verdict:?}"
    );
    assert_eq!(RunFacts::from_events(&log).output, None);
}

/// A verdict of the wrong shape (`"score": "high"`): the loop's output
/// check refuses it, and the grade is an error.
#[tokio::test]
async fn a_judge_whose_verdict_has_the_wrong_shape_is_a_grading_error() {
    let bad = || Reply::sse(fixture("openai/judge_bad_score.sse"));
    let (verdict, _, log) = judge(vec![bad(), bad(), bad(), bad()]).await;
    assert!(!verdict.pass, "{verdict:?}");
    assert_eq!(
        verdict.error.as_deref(),
        Some(
            "the judge run failed: structured output rejected: \"high\" is not of type \"number\" at '/score'"
        ),
        "{verdict:?}"
    );
    assert!(
        kinds(&log).contains(&"guardrail.tripped"),
        "the output check refused the verdict: {:?}",
        kinds(&log)
    );
}
