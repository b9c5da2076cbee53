//! Declarative guardrails and compaction: a run's config (resolved from an
//! agent definition, as a tenant writes it in TOML) makes the shipped loop
//! check inputs and answers and compact the context, with no Rust hooks on
//! the worker; trips and compactions are recorded as usual.

mod common;

use chrono::Utc;
use common::*;
use glia_proto::{AgentDefinition, Event, EventKind, GuardrailStage, Outcome, PullPoint, Resume, RunConfig, RunState, Status};
use glia_worker::AgentError;
use glia_worker::provider::ScriptedTurn;
use serde_json::json;

const AGENT: &str = r#"
name = "careful"
model = "scripted"
tools = ["add"]
conversational = true
[guardrails]
max_output_chars = 60
[[guardrails.input]]
name = "no-card-numbers"
deny = '\b(?:\d[ -]?){15}\d\b'
reason = "card numbers are not accepted"
[[guardrails.output]]
name = "no-internal-ids"
deny = 'INT-\d+'
"#;

fn config() -> RunConfig {
    let def: AgentDefinition = glia_proto::strict::from_toml_str(AGENT).unwrap();
    def.validate().unwrap();
    def.resolve(None)
}

fn trips(log: &[Event]) -> Vec<(GuardrailStage, String)> {
    log.iter()
        .filter_map(|e| match &e.kind {
            EventKind::GuardrailTripped { stage, guardrail, .. } => Some((*stage, guardrail.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn declared_output_rules_and_length_reask_then_pass() {
    let script = vec![
        ScriptedTurn::text("Your ticket is INT-4411."),
        ScriptedTurn::text("This answer is far too long for the limit the definition sets on answers, by a lot."),
        ScriptedTurn::text("Your ticket is open."),
    ];
    let (agent, provider) = agent(script);
    let mut log = Vec::new();
    let config = RunConfig { conversational: false, max_reasks: 3, ..config() };
    let (state, status) = agent.run(run_id(), "status of my ticket?", config, &mut log).await.unwrap();
    assert_eq!(status, Status::Done(Outcome::Succeeded { answer: "Your ticket is open.".into(), output: None }));
    assert_eq!(trips(&log), vec![(GuardrailStage::Output, "no-internal-ids".into()), (GuardrailStage::Output, "max_output_chars".into())]);
    assert!(provider.requests()[1].messages.last().unwrap().text().contains("matches no-internal-ids"));
    assert_replays(&log, &state);
}

#[tokio::test]
async fn declared_input_rules_refuse_a_user_message_and_keep_the_run_waiting() {
    let (agent, provider) = agent(vec![ScriptedTurn::text("Hello."), ScriptedTurn::text("Noted.")]);
    let mut log = Vec::new();
    let (mut state, status) = agent.run(run_id(), "hi", config(), &mut log).await.unwrap();
    assert_eq!(status, Status::Parked(PullPoint::AwaitingInput));
    let status = agent.advance(&mut state, Some(Resume::Input { text: "my card is 4111 1111 1111 1111".into() }), &mut log).await.unwrap();
    assert_eq!(status, Status::Parked(PullPoint::AwaitingInput), "a refused message leaves the run waiting");
    assert_eq!(trips(&log), vec![(GuardrailStage::Input, "no-card-numbers".into())]);
    assert_eq!(provider.served(), 1, "the refused message never reached the model");
    let status = agent.advance(&mut state, Some(Resume::Input { text: "thanks".into() }), &mut log).await.unwrap();
    assert_eq!(status, Status::Parked(PullPoint::AwaitingInput));
    assert_eq!(provider.served(), 2);
    assert_replays(&log, &state);
}

#[tokio::test]
async fn a_goal_admitted_elsewhere_meets_the_declared_input_rules() {
    // The dispatcher records session.start; the worker's first advance checks the goal.
    let (agent, provider) = agent(vec![ScriptedTurn::text("never")]);
    let id = run_id();
    let start = Event { run_id: id, seq: 1, at: Utc::now(), kind: EventKind::SessionStart { goal: "refund 4111-1111-1111-1111".into(), config: config() } };
    let mut state = RunState::new(id);
    state.apply(&start).unwrap();
    let mut log = vec![start];
    let status = agent.advance(&mut state, None, &mut log).await.unwrap();
    assert!(matches!(status, Status::Done(Outcome::Failed { ref error }) if error.contains("card numbers are not accepted")), "{status:?}");
    assert_eq!(trips(&log), vec![(GuardrailStage::Input, "no-card-numbers".into())]);
    assert_eq!(provider.served(), 0);
    assert_replays(&log, &state);
}

#[tokio::test]
async fn declared_compaction_drops_the_oldest_turns() {
    let mut script: Vec<ScriptedTurn> = (0..6).map(|i| ScriptedTurn::call("add", json!({"a": i, "b": 1000 + i}))).collect();
    script.push(ScriptedTurn::text("All sums done."));
    let (agent, provider) = agent(script);
    let config: RunConfig =
        glia_proto::strict::from_json_value(json!({"tools": ["add"], "compaction": {"strategy": "drop_oldest", "max_tokens": 150, "keep_recent": 1}})).unwrap();
    let mut log = Vec::new();
    let (state, status) = agent.run(run_id(), "sum things", config, &mut log).await.unwrap();
    assert!(matches!(status, Status::Done(Outcome::Succeeded { .. })), "{status:?}");
    let strategies: Vec<String> = log
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ContextCompacted { strategy, .. } => Some(strategy.clone()),
            _ => None,
        })
        .collect();
    assert!(!strategies.is_empty() && strategies.iter().all(|s| s == "drop_oldest"), "{strategies:?}");
    assert!(provider.requests().last().unwrap().messages.len() < 13, "the context shrank");
    assert_replays(&log, &state);
}

#[tokio::test]
async fn a_config_with_a_bad_rule_is_refused_before_session_start() {
    let (agent, _) = agent(vec![]);
    let mut config = config();
    config.guardrails.output[0].deny = "(".into();
    let mut log = Vec::new();
    let err = agent.start(run_id(), "hi", config, &mut log).await.unwrap_err();
    assert!(matches!(err, AgentError::Config(ref m) if m.contains("guardrails.output[0].deny")), "{err}");
    assert!(log.is_empty(), "nothing recorded");
}
