//! Declarative guardrails and compaction: a run's config (resolved from an
//! agent definition, as a tenant writes it in TOML) makes the shipped loop
//! check inputs and answers and compact the context, with no Rust hooks on
//! the worker; trips and compactions are recorded as usual.

use crate::common;

use chrono::Utc;
use common::*;
use glia_agent::AgentError;
use glia_agent::provider::ScriptedTurn;
use glia_proto::{
    AgentDefinition, Event, EventKind, GuardrailStage, Outcome, Payload, PullPoint, RunConfig,
    RunState, Status,
};
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
            EventKind::GuardrailTripped {
                stage, guardrail, ..
            } => Some((*stage, guardrail.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn declared_output_rules_and_length_reask_then_pass() {
    let script = vec![
        ScriptedTurn::text("Your ticket is INT-4411."),
        ScriptedTurn::text(
            "This answer is far too long for the limit the definition sets on answers, by a lot.",
        ),
        ScriptedTurn::text("Your ticket is open."),
    ];
    let (agent, provider) = agent(script);
    let mut log = Vec::new();
    let config = RunConfig {
        conversational: false,
        max_reasks: 3,
        ..config()
    };
    let (state, status) = agent
        .run(run_id(), "status of my ticket?", config, &mut log)
        .await
        .unwrap();
    assert_eq!(
        status,
        Status::Done(Outcome::Succeeded {
            answer: "Your ticket is open.".into(),
            output: None
        })
    );
    assert_eq!(
        trips(&log),
        vec![
            (GuardrailStage::Output, "no-internal-ids".into()),
            (GuardrailStage::Output, "max_output_chars".into())
        ]
    );
    assert!(
        provider.requests()[1]
            .messages
            .last()
            .unwrap()
            .text()
            .contains("matches no-internal-ids")
    );
    assert_replays(&log, &state);
}

#[tokio::test]
async fn declared_input_rules_refuse_a_user_message_and_keep_the_run_waiting() {
    let (agent, provider) = agent(vec![
        ScriptedTurn::text("Hello."),
        ScriptedTurn::text("Noted."),
    ]);
    let mut log = Vec::new();
    let (mut state, status) = agent.run(run_id(), "hi", config(), &mut log).await.unwrap();
    assert_eq!(status, Status::Parked(PullPoint::AwaitingInput));
    let status = agent
        .advance(
            &mut state,
            Some(Payload::Input {
                text: "my card is 4111 1111 1111 1111".into(),
                redactions: Vec::new(),
            }),
            &mut log,
        )
        .await
        .unwrap();
    assert_eq!(
        status,
        Status::Parked(PullPoint::AwaitingInput),
        "a refused message leaves the run waiting"
    );
    assert_eq!(
        trips(&log),
        vec![(GuardrailStage::Input, "no-card-numbers".into())]
    );
    assert_eq!(
        provider.served(),
        1,
        "the refused message never reached the model"
    );
    let status = agent
        .advance(
            &mut state,
            Some(Payload::Input {
                text: "thanks".into(),
                redactions: Vec::new(),
            }),
            &mut log,
        )
        .await
        .unwrap();
    assert_eq!(status, Status::Parked(PullPoint::AwaitingInput));
    assert_eq!(provider.served(), 2);
    assert_replays(&log, &state);
}

/// A run as the dispatcher admits it: its `session.start` with `config`,
/// and the state after it.
fn admitted(goal: &str, config: RunConfig) -> (RunState, Vec<Event>) {
    let id = run_id();
    let start = Event {
        run_id: id,
        seq: 1,
        at: Utc::now(),
        kind: EventKind::SessionStart {
            redactions: Vec::new(),
            goal: goal.into(),
            config,
        },
    };
    let mut state = RunState::new(id);
    state.apply(&start).unwrap();
    (state, vec![start])
}

fn rejected_card(status: &Status) -> bool {
    matches!(status, Status::Done(Outcome::Failed { error }) if error.contains("card numbers are not accepted"))
}

#[tokio::test]
async fn a_goal_admitted_elsewhere_meets_the_declared_input_rules() {
    // The dispatcher records session.start; the worker's first advance checks the goal.
    let (agent, provider) = agent(vec![ScriptedTurn::text("never")]);
    let (mut state, mut log) = admitted("refund 4111-1111-1111-1111", config());
    let status = agent.advance(&mut state, None, &mut log).await.unwrap();
    assert!(rejected_card(&status), "{status:?}");
    assert_eq!(
        trips(&log),
        vec![(GuardrailStage::Input, "no-card-numbers".into())]
    );
    assert_eq!(provider.served(), 0);
    assert_replays(&log, &state);

    // The same goal with a delayed start: checked when the run starts.
    let delayed = RunConfig {
        start_at_ms: Some(Utc::now().timestamp_millis() + 60_000),
        ..config()
    };
    let (mut state, mut log) = admitted("refund 4111-1111-1111-1111", delayed);
    let Some(PullPoint::AwaitingTimer { wake_at_ms, .. }) = state.parked else {
        panic!("a delayed start parks: {:?}", state.parked)
    };
    let wake = Payload::Wake {
        due_at_ms: wake_at_ms,
        event: None,
    };
    let status = agent
        .advance(&mut state, Some(wake), &mut log)
        .await
        .unwrap();
    assert!(rejected_card(&status), "{status:?}");
    assert_eq!(provider.served(), 0);
    assert_replays(&log, &state);
}

#[tokio::test]
async fn declared_compaction_drops_the_oldest_turns() {
    let mut script: Vec<ScriptedTurn> = (0..6)
        .map(|i| ScriptedTurn::call("add", json!({"a": i, "b": 1000 + i})))
        .collect();
    script.push(ScriptedTurn::text("All sums done."));
    let (agent, provider) = agent(script);
    let config: RunConfig =
        glia_proto::strict::from_json_value(json!({"tools": ["add"], "compaction": {"strategy": "drop_oldest", "max_tokens": 150, "keep_recent": 1}})).unwrap();
    let mut log = Vec::new();
    let (state, status) = agent
        .run(run_id(), "sum things", config, &mut log)
        .await
        .unwrap();
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { .. })),
        "{status:?}"
    );
    let strategies: Vec<String> = log
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ContextCompacted { strategy, .. } => Some(strategy.clone()),
            _ => None,
        })
        .collect();
    assert!(
        !strategies.is_empty() && strategies.iter().all(|s| s == "drop_oldest"),
        "{strategies:?}"
    );
    assert!(
        provider.requests().last().unwrap().messages.len() < 13,
        "the context shrank"
    );
    assert_replays(&log, &state);
}

#[tokio::test]
async fn a_config_with_a_bad_rule_is_refused_before_session_start() {
    let (agent, _) = agent(vec![]);
    let mut config = config();
    config.guardrails.output[0].deny = Some("(".into());
    let mut log = Vec::new();
    let err = agent
        .start(run_id(), "hi", config, &mut log)
        .await
        .unwrap_err();
    assert!(
        matches!(err, AgentError::Config(ref m) if m.contains("guardrails.output[0].deny")),
        "{err}"
    );
    assert!(log.is_empty(), "nothing recorded");
}

const REDACTING: &str = r#"
name = "redacting"
model = "scripted"
conversational = true
[[guardrails.input]]
name = "email"
redact = '[\w.+-]+@[\w-]+\.[\w.]+'
[[guardrails.input]]
name = "no-card-numbers"
deny = '\b(?:\d[ -]?){15}\d\b'
[[guardrails.output]]
name = "phone"
redact = '\+?\d{2,3}[ -]\d{3}[ -]\d{4}'
replacement = "[phone]"
"#;

/// Redact rules: matches are replaced before the text is recorded (goal,
/// user message, the model's answer), the raw text reaches no event and no
/// request, each event lists what matched, and no raw text streams live.
#[tokio::test]
async fn declared_redact_rules_replace_matches_before_anything_is_recorded() {
    let def: AgentDefinition = glia_proto::strict::from_toml_str(REDACTING).unwrap();
    def.validate().unwrap();
    let (agent, provider) = agent(vec![
        ScriptedTurn::text("Call us on 44 207 1234 or +44 207 5678."),
        ScriptedTurn::text("Noted."),
        ScriptedTurn::text("Noted again."),
    ]);
    let mut sink = LiveSink::default();
    let (mut state, status) = agent
        .run(
            run_id(),
            "I am ann@example.com, a.b@x.org wrote too",
            def.resolve(None),
            &mut sink,
        )
        .await
        .unwrap();
    let live = sink.live.lock().unwrap().clone();
    assert!(
        !live.iter().any(
            |d| matches!(d, glia_proto::LiveEvent::ModelDelta { channel, .. } if channel == "text")
        ),
        "no text streams live: {live:?}"
    );
    let mut log = sink.log;
    assert_eq!(status, Status::Parked(PullPoint::AwaitingInput));
    let redactions = |e: &Event| match &e.kind {
        EventKind::SessionStart { redactions, .. }
        | EventKind::InputReceived { redactions, .. }
        | EventKind::ModelResponse { redactions, .. } => redactions
            .iter()
            .map(|r| (r.guardrail.clone(), r.count))
            .collect::<Vec<_>>(),
        _ => Vec::new(),
    };
    let EventKind::SessionStart { goal, .. } = &log[0].kind else {
        panic!()
    };
    assert_eq!(goal, "I am [redacted:email], [redacted:email] wrote too");
    assert_eq!(redactions(&log[0]), vec![("email".to_owned(), 2)]);
    let response = log
        .iter()
        .find(|e| matches!(e.kind, EventKind::ModelResponse { .. }))
        .unwrap();
    let EventKind::ModelResponse { message, .. } = &response.kind else {
        unreachable!()
    };
    assert_eq!(message.text(), "Call us on [phone] or [phone].");
    assert_eq!(redactions(response), vec![("phone".to_owned(), 2)]);

    // A user message: redacted, then the deny rules see what is left.
    agent
        .advance(
            &mut state,
            Some(Payload::Input {
                text: "mail me at bob@example.com".into(),
                redactions: Vec::new(),
            }),
            &mut log,
        )
        .await
        .unwrap();
    let input = log
        .iter()
        .find(|e| matches!(e.kind, EventKind::InputReceived { .. }))
        .unwrap();
    assert!(
        matches!(&input.kind, EventKind::InputReceived { text, .. } if text == "mail me at [redacted:email]"),
        "{:?}",
        input.kind
    );
    assert_eq!(redactions(input), vec![("email".to_owned(), 1)]);
    // One the dispatcher redacted before posting: the rules it applied are listed.
    let posted = vec![glia_proto::Redaction {
        guardrail: "email".into(),
        count: 2,
    }];
    agent
        .advance(
            &mut state,
            Some(Payload::Input {
                text: "[redacted:email] or [redacted:email]".into(),
                redactions: posted,
            }),
            &mut log,
        )
        .await
        .unwrap();
    let input = log
        .iter()
        .rev()
        .find(|e| matches!(e.kind, EventKind::InputReceived { .. }))
        .unwrap();
    assert_eq!(redactions(input), vec![("email".to_owned(), 2)]);

    let recorded = serde_json::to_string(&log).unwrap();
    let sent = format!("{:?}", provider.requests());
    for raw in [
        "ann@example.com",
        "a.b@x.org",
        "bob@example.com",
        "207 1234",
        "207 5678",
    ] {
        assert!(!recorded.contains(raw), "{raw} reached the log");
        assert!(!sent.contains(raw), "{raw} reached the model");
    }
    assert_eq!(state.answer, "Noted again.");
    assert_replays(&log, &state);
}

#[test]
fn a_rule_must_deny_or_redact_and_a_redaction_must_match_something() {
    let rule = |body: &str| -> String {
        let text =
            format!("name = \"r\"\nmodel = \"m\"\n[[guardrails.output]]\nname = \"x\"\n{body}\n");
        let def: AgentDefinition = glia_proto::strict::from_toml_str(&text).unwrap();
        def.validate()
            .map(|_| String::new())
            .unwrap_or_else(|e| e.to_string())
    };
    assert!(
        rule("deny = 'a'\nredact = 'b'")
            .contains("guardrails.output[0]: give exactly one of deny and redact"),
        "{}",
        rule("deny = 'a'\nredact = 'b'")
    );
    assert!(rule("").contains("guardrails.output[0]: give exactly one"));
    assert!(
        rule("redact = 'a*'").contains("guardrails.output[0].redact: matches the empty string")
    );
    assert!(rule("redact = '('").contains("guardrails.output[0].redact: not a valid regex"));
    assert!(rule("deny = 'a'\nreplacement = 'b'").contains("guardrails.output[0].replacement"));
    assert!(rule("redact = 'a'\nreason = 'b'").contains("guardrails.output[0].reason"));
    assert!(
        rule("redact = 'a'\nreplacement = ' '")
            .contains("guardrails.output[0].replacement: is blank")
    );
    assert_eq!(rule("redact = 'a'\nreplacement = 'b'"), "");
}

/// A goal an input deny rule refuses is recorded nowhere: `session.start`
/// holds a placeholder naming the rule and the length.
#[tokio::test]
async fn a_refused_goal_is_recorded_as_a_placeholder() {
    let (agent, provider) = agent(vec![ScriptedTurn::text("never")]);
    let mut log = Vec::new();
    let (state, status) = agent
        .run(run_id(), "refund 4111-1111-1111-1111", config(), &mut log)
        .await
        .unwrap();
    assert!(
        matches!(status, Status::Done(Outcome::Failed { .. })),
        "{status:?}"
    );
    assert_eq!(
        trips(&log),
        vec![(GuardrailStage::Input, "no-card-numbers".into())]
    );
    let EventKind::SessionStart { goal, .. } = &log[0].kind else {
        panic!()
    };
    assert_eq!(
        goal,
        "[goal withheld: refused by the input guardrail no-card-numbers, 26 characters]"
    );
    assert!(
        !serde_json::to_string(&log).unwrap().contains("4111"),
        "the card number reached the log"
    );
    assert_eq!(provider.served(), 0);
    assert_replays(&log, &state);
}

/// `tool_results` rules: a redact rule rewrites a result before it is
/// recorded or sent to the model (listed in `tool.result`'s redactions); a
/// deny rule withholds it behind a marked note, and `guardrail.tripped`
/// names the rule and the length, never the text.
#[tokio::test]
async fn tool_results_are_redacted_or_withheld_before_anything_sees_them() {
    let config: RunConfig = glia_proto::strict::from_json_value(json!({"tools": ["add"], "guardrails": {"tool_results": [
        {"name": "secret-sum", "deny": "\"sum\":5678"}, {"name": "four-digits", "redact": "\\b1234\\b"}]}})).unwrap();
    config.validate().unwrap();
    let script = vec![
        ScriptedTurn::call("add", json!({"a": 1000, "b": 234})),
        ScriptedTurn::call("add", json!({"a": 5000, "b": 678})),
        ScriptedTurn::text("done"),
    ];
    let (agent, provider) = agent(script);
    let mut log = Vec::new();
    let (state, status) = agent.run(run_id(), "sum", config, &mut log).await.unwrap();
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { .. })),
        "{status:?}"
    );
    let results: Vec<(String, Vec<glia_proto::Redaction>)> = log
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult {
                content,
                redactions,
                ..
            } => Some((content.to_text().into_owned(), redactions.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        results[0],
        (
            "{\"sum\":[redacted:four-digits]}".to_owned(),
            vec![glia_proto::Redaction {
                guardrail: "four-digits".into(),
                count: 1
            }]
        )
    );
    assert!(
        glia_proto::marker::is_machine_text(&results[1].0)
            && results[1].0.contains("secret-sum")
            && results[1].1.is_empty(),
        "{:?}",
        results[1]
    );
    assert_eq!(
        trips(&log),
        vec![(GuardrailStage::ToolResult, "secret-sum".into())]
    );
    // (The rules themselves, in session.start's config, name the numbers.)
    let recorded = serde_json::to_string(&log[1..]).unwrap();
    let sent = format!("{:?}", provider.requests());
    for raw in ["1234", "5678"] {
        assert!(!recorded.contains(raw), "{raw} reached the log");
        assert!(!sent.contains(raw), "{raw} reached the model");
    }
    assert_replays(&log, &state);
}
