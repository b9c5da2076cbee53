//! The glia loop (`glia_agent::Agent`) running a two-turn tool conversation
//! end to end against each adapter's local server, with the exact request
//! bodies checked: the tool_use / tool_result pairing, the cache breakpoints
//! on the stable prefix, and cost from the price table.

use crate::common;

use std::sync::Arc;

use common::{Reply, Server, fixture, fixture_json};
use glia_agent::provider::Provider;
use glia_agent::tool::{ToolContext, ToolRegistry};
use glia_agent::{Agent, FixedClock};
use glia_proto::{Event, EventKind, Outcome, RunConfig, Status, ToolErrorKind, Usage};
use glia_providers::http::{HttpProvider, http_client};
use glia_providers::{Anthropic, ApiKey, OpenAi, PriceTable, RefusalIsolator, Wire};
use glia_testkit::tools::Add;
use serde_json::{Value, json};
use uuid::Uuid;

fn agent(provider: Arc<dyn Provider>) -> Agent {
    let mut tools = ToolRegistry::default();
    tools.register(Add);
    Agent::new(provider)
        .with_tools(tools)
        .with_clock(FixedClock(chrono::DateTime::UNIX_EPOCH))
}

fn config(provider: &str, model: &str) -> RunConfig {
    let prices =
        PriceTable::from_file(concat!(env!("CARGO_MANIFEST_DIR"), "/prices.example.json")).unwrap();
    RunConfig {
        model: model.into(),
        system: "You are a careful calculator. Use the add tool for sums.".into(),
        pricing: prices.pricing(provider, model),
        max_tokens: 1024,
        ..RunConfig::default()
    }
}

/// The model.response events: (usage, cost).
fn responses(log: &[Event]) -> Vec<(Usage, u64)> {
    log.iter()
        .filter_map(|e| match &e.kind {
            EventKind::ModelResponse {
                usage,
                cost_usd_micros,
                ..
            } => Some((*usage, *cost_usd_micros)),
            _ => None,
        })
        .collect()
}

async fn two_turns<W: Wire>(
    wire: W,
    provider_name: &str,
    model: &str,
    base_suffix: &str,
) -> (Vec<common::Seen>, Vec<Event>, Status) {
    let dir = provider_name;
    let server = Server::replay(vec![
        Reply::sse(fixture(&format!("{dir}/loop_turn1.sse"))),
        Reply::sse(fixture(&format!("{dir}/loop_turn2.sse"))),
    ])
    .await;
    let http = HttpProvider::new(
        wire,
        http_client().unwrap(),
        &format!("{}{base_suffix}", server.base),
        Some(ApiKey::new("sk-loop-test-key")),
    );
    let provider: Arc<dyn Provider> = Arc::new(RefusalIsolator::new(Arc::new(http)));
    let mut log: Vec<Event> = Vec::new();
    let run_id = Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0042);
    let (_, status) = agent(provider)
        .run(
            run_id,
            "What is 2 + 40?",
            config(provider_name, model),
            &mut log,
        )
        .await
        .unwrap();
    (server.seen(), log, status)
}

fn assert_succeeded(status: &Status) {
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { answer, .. }) if answer == "2 + 40 = 42."),
        "{status:?}"
    );
}

#[tokio::test]
async fn anthropic_two_turn_tool_conversation() {
    let (seen, log, status) =
        two_turns(Anthropic::default(), "anthropic", "claude-sonnet-4-5", "").await;
    assert_succeeded(&status);
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[0].body,
        fixture_json("anthropic/loop_request1.json"),
        "first request:\n{}",
        serde_json::to_string_pretty(&seen[0].body).unwrap()
    );
    assert_eq!(
        seen[1].body,
        fixture_json("anthropic/loop_request2.json"),
        "second request:\n{}",
        serde_json::to_string_pretty(&seen[1].body).unwrap()
    );
    // The stable prefix carries the breakpoints in both requests, unchanged.
    for s in &seen {
        assert_eq!(
            s.body["system"][0]["cache_control"],
            json!({"type": "ephemeral"})
        );
        assert_eq!(
            s.body["tools"][0]["cache_control"],
            json!({"type": "ephemeral"})
        );
    }
    // Usage with cache tokens, and cost from the price table ($3 / $15 / $3.75 / $0.30 per MTok).
    let r = responses(&log);
    assert_eq!(
        r[0].0,
        Usage {
            input_tokens: 380,
            output_tokens: 48,
            cache_write_tokens: 1200,
            cache_read_tokens: 0,
            estimated: false
        }
    );
    // 380×3 + 48×15 + 1200×3.75 = 1140 + 720 + 4500 micros.
    assert_eq!(r[0].1, 6360);
    assert_eq!(
        r[1].0,
        Usage {
            input_tokens: 40,
            output_tokens: 9,
            cache_write_tokens: 0,
            cache_read_tokens: 1580,
            estimated: false
        }
    );
    // 40×3 + 9×15 + 1580×0.3 = 120 + 135 + 474.
    assert_eq!(r[1].1, 729);
}

#[tokio::test]
async fn openai_two_turn_tool_conversation() {
    let (seen, log, status) = two_turns(OpenAi::default(), "openai", "gpt-4o", "/v1").await;
    assert_succeeded(&status);
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[0].body,
        fixture_json("openai/loop_request1.json"),
        "first request:\n{}",
        serde_json::to_string_pretty(&seen[0].body).unwrap()
    );
    assert_eq!(
        seen[1].body,
        fixture_json("openai/loop_request2.json"),
        "second request:\n{}",
        serde_json::to_string_pretty(&seen[1].body).unwrap()
    );
    let r = responses(&log);
    assert_eq!(
        r[0].0,
        Usage {
            input_tokens: 380,
            output_tokens: 48,
            cache_write_tokens: 0,
            cache_read_tokens: 0,
            estimated: false
        }
    );
    // 380×2.5 + 48×10 = 950 + 480.
    assert_eq!(r[0].1, 1430);
    assert_eq!(
        r[1].0,
        Usage {
            input_tokens: 164,
            output_tokens: 9,
            cache_write_tokens: 0,
            cache_read_tokens: 256,
            estimated: false
        }
    );
    // 164×2.5 + 9×10 + 256×1.25 = 410 + 90 + 320.
    assert_eq!(r[1].1, 820);
}

#[tokio::test]
async fn arguments_that_are_not_json_give_the_model_an_error_result() {
    // The invalid_args fixture, calling the registered `add` tool.
    let stream = String::from_utf8(fixture("openai/invalid_args.sse"))
        .unwrap()
        .replace("get_weather", "add");
    let server = Server::replay(vec![
        Reply::sse(stream.into_bytes()),
        Reply::sse(fixture("openai/loop_turn2.sse")),
    ])
    .await;
    let http = HttpProvider::new(
        OpenAi::default(),
        http_client().unwrap(),
        &server.base,
        None,
    );
    let mut log: Vec<Event> = Vec::new();
    let (_, status) = agent(Arc::new(http))
        .run(
            Uuid::now_v7(),
            "What is 2 + 40?",
            config("openai", "gpt-4o"),
            &mut log,
        )
        .await
        .unwrap();
    assert_succeeded(&status);
    let (kind, message) = log
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::ToolError { error, message, .. } => Some((*error, message.clone())),
            _ => None,
        })
        .expect("the broken call got an error result");
    assert_eq!(kind, ToolErrorKind::InvalidArguments, "{message}");
    assert!(message.contains("not valid JSON"), "{message}");
    // The second request sends the raw arguments back, paired with the error result.
    let second = &server.seen()[1].body;
    let messages = second["messages"].as_array().unwrap();
    let call = messages.iter().find(|m| m["role"] == "assistant").unwrap();
    assert_eq!(
        call["tool_calls"][0]["function"]["arguments"],
        "{\"city\": \"Paris\", unit: celsius}"
    );
    let result = messages.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(result["tool_call_id"], "call_Bad1");
    assert!(result["content"].as_str().unwrap().starts_with("Error: "));
}

#[tokio::test]
async fn invalid_arguments_to_a_registered_tool_are_an_invalid_arguments_error() {
    let mut tools = ToolRegistry::default();
    tools.register(Add);
    let ctx = ToolContext {
        run_id: Uuid::now_v7(),
        call_id: "c1".into(),
        idempotency_key: "k".into(),
    };
    let e = tools
        .execute("add", Value::String("{\"a\": 2, b: 40}".into()), ctx)
        .await
        .unwrap_err();
    assert_eq!(e.kind, ToolErrorKind::InvalidArguments);
    assert!(e.message.contains("not valid JSON"), "{}", e.message);
}

// ----- honest outcomes over HTTP: the loop and each adapter together -----

/// Run `goal` against a local server answering with `replies` in order (the last repeated).
async fn run_against<W: Wire>(
    wire: W,
    base_suffix: &str,
    model: &str,
    replies: Vec<Reply>,
    config: RunConfig,
) -> (Vec<common::Seen>, Vec<Event>, Status) {
    let last = replies.len() - 1;
    let server = Server::start(move |n, _| replies[n.min(last)].clone(), None).await;
    let quick = glia_providers::RetryPolicy {
        max_retries: 2,
        min_delay: std::time::Duration::from_millis(1),
        max_delay: std::time::Duration::from_millis(2),
        ..glia_providers::RetryPolicy::default()
    };
    let http = HttpProvider::new(
        wire,
        http_client().unwrap(),
        &format!("{}{base_suffix}", server.base),
        None,
    )
    .with_retry(quick);
    let mut log: Vec<Event> = Vec::new();
    let config = RunConfig {
        model: model.into(),
        ..config
    };
    let (state, status) = agent(Arc::new(http))
        .run(Uuid::now_v7(), "What is 2 + 40?", config, &mut log)
        .await
        .unwrap();
    assert_eq!(
        glia_proto::RunState::replay(state.run_id, &log).unwrap(),
        state,
        "the log replays to the live state"
    );
    (server.seen(), log, status)
}

fn tool_calls(log: &[Event]) -> Vec<(String, String, Value)> {
    log.iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCall(c) => Some((c.call_id.clone(), c.name.clone(), c.input.clone())),
            _ => None,
        })
        .collect()
}

/// An OpenAI stream whose two calls share index 0 (Ollama), calling `add` twice.
fn shared_index_adds() -> Vec<u8> {
    String::from_utf8(fixture("openai/shared_index.sse"))
        .unwrap()
        .replace("get_order", "add")
        .replace("calculator", "add")
        .replace(r#"{\"order_id\": \"A1\"}"#, r#"{\"a\": 2, \"b\": 40}"#)
        .replace(
            r#"{\"op\": \"add\", \"a\": 1, \"b\": 2}"#,
            r#"{\"a\": 1, \"b\": 2}"#,
        )
        .into_bytes()
}

#[tokio::test]
async fn openai_two_calls_sharing_an_index_both_run() {
    let replies = vec![
        Reply::sse(shared_index_adds()),
        Reply::sse(fixture("openai/loop_turn2.sse")),
    ];
    let (seen, log, status) = run_against(
        OpenAi::default(),
        "/v1",
        "gpt-4o",
        replies,
        RunConfig::default(),
    )
    .await;
    assert_succeeded(&status);
    assert_eq!(
        tool_calls(&log),
        vec![
            ("call_a".into(), "add".into(), json!({"a": 2, "b": 40})),
            ("call_b".into(), "add".into(), json!({"a": 1, "b": 2}))
        ]
    );
    // Both results go back, each paired with its own call.
    let tool_messages: Vec<&Value> = seen[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(
        tool_messages
            .iter()
            .map(|m| m["tool_call_id"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["call_a", "call_b"]
    );
}

#[tokio::test]
async fn anthropic_tool_input_given_at_block_start_reaches_the_tool() {
    let first = String::from_utf8(fixture("anthropic/input_in_block_start.sse"))
        .unwrap()
        .replace("get_order", "add")
        .replace(r#"{"order_id": "A1"}"#, r#"{"a": 2, "b": 40}"#);
    let replies = vec![
        Reply::sse(first.into_bytes()),
        Reply::sse(fixture("anthropic/loop_turn2.sse")),
    ];
    let (_, log, status) = run_against(
        Anthropic::default(),
        "",
        "claude-sonnet-4-5",
        replies,
        RunConfig::default(),
    )
    .await;
    assert_succeeded(&status);
    assert_eq!(
        tool_calls(&log),
        vec![("toolu_S1".into(), "add".into(), json!({"a": 2, "b": 40}))]
    );
    assert!(log.iter().any(|e| matches!(&e.kind, EventKind::ToolResult { content, .. } if content.to_text().contains("42"))));
}

/// The output cap cut a tool call: by default the answer is rejected and
/// re-asked (the cut call never runs); with `fail` the run fails; it never
/// completes as succeeded on the cut answer. Both adapters.
#[tokio::test]
async fn a_tool_call_cut_by_the_output_cap_never_runs_and_never_succeeds() {
    let cut_openai = String::from_utf8(fixture("openai/length_mid_tool.sse"))
        .unwrap()
        .replace("get_order", "add")
        .into_bytes();
    let cut_anthropic = fixture("anthropic/max_tokens_mid_tool.sse");
    let cases: Vec<(&str, Vec<u8>, Vec<u8>)> = vec![
        ("openai", cut_openai, fixture("openai/loop_turn2.sse")),
        (
            "anthropic",
            cut_anthropic,
            fixture("anthropic/loop_turn2.sse"),
        ),
    ];
    for (provider, cut, answer) in cases {
        let run = |replies: Vec<Reply>, config: RunConfig| async move {
            match provider {
                "openai" => run_against(OpenAi::default(), "/v1", "gpt-4o", replies, config).await,
                _ => {
                    run_against(
                        Anthropic::default(),
                        "",
                        "claude-sonnet-4-5",
                        replies,
                        config,
                    )
                    .await
                }
            }
        };
        // Default policy: re-ask; the model's next, finished answer completes the run.
        let (seen, log, status) = run(
            vec![Reply::sse(cut.clone()), Reply::sse(answer.clone())],
            RunConfig::default(),
        )
        .await;
        assert_succeeded(&status);
        assert!(
            tool_calls(&log).is_empty(),
            "{provider}: the cut call never ran"
        );
        let rejected: Vec<_> = log
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::ModelResponse {
                    rejected: Some(r),
                    stop_reason,
                    ..
                } => Some((r.class, r.action, stop_reason.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(
            rejected,
            vec![(
                glia_proto::StopClass::Truncated,
                glia_proto::StopAction::Reask,
                "max_tokens".to_owned()
            )],
            "{provider}"
        );
        assert!(
            seen[1]
                .body
                .to_string()
                .contains("cut off by the output limit"),
            "{provider}: the model is told why"
        );
        // The model keeps being cut off: the run fails with the reason, never succeeds.
        let (_, _, status) = run(vec![Reply::sse(cut.clone())], RunConfig::default()).await;
        assert!(
            matches!(&status, Status::Done(Outcome::Failed { error }) if error.contains("cut off by the output limit")),
            "{provider}: {status:?}"
        );
        let fail_at_once = RunConfig {
            stop_reasons: glia_proto::StopPolicy {
                truncated: glia_proto::StopAction::Fail,
                ..Default::default()
            },
            ..RunConfig::default()
        };
        let (seen, _, status) = run(vec![Reply::sse(cut.clone())], fail_at_once).await;
        assert!(
            matches!(&status, Status::Done(Outcome::Failed { .. })),
            "{provider}: {status:?}"
        );
        assert_eq!(seen.len(), 1, "{provider}");
    }
}

#[tokio::test]
async fn finish_reason_error_is_retried_and_never_the_answer() {
    let replies = vec![
        Reply::sse(fixture("openai/finish_error.sse")),
        Reply::sse(fixture("openai/loop_turn2.sse")),
    ];
    let (_, log, status) = run_against(
        OpenAi::default(),
        "/v1",
        "gpt-4o",
        replies,
        RunConfig::default(),
    )
    .await;
    assert_succeeded(&status);
    let retries: Vec<_> = log
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ModelRetry(r) => Some(r.cause.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(retries, ["server"]);
    assert!(!log.iter().any(|e| matches!(&e.kind, EventKind::ModelResponse { message, .. } if message.text().contains("par"))), "the partial text is never an answer");
}

#[tokio::test]
async fn a_persistently_malformed_answer_fails_the_run_with_the_reason() {
    for (provider, stream) in [
        ("openai", fixture("openai/malformed_renamed.sse")),
        (
            "anthropic",
            fixture("anthropic/malformed_repeated_start.sse"),
        ),
    ] {
        let (seen, log, status) = match provider {
            "openai" => {
                run_against(
                    OpenAi::default(),
                    "/v1",
                    "gpt-4o",
                    vec![Reply::sse(stream)],
                    RunConfig::default(),
                )
                .await
            }
            _ => {
                run_against(
                    Anthropic::default(),
                    "",
                    "claude-sonnet-4-5",
                    vec![Reply::sse(stream)],
                    RunConfig::default(),
                )
                .await
            }
        };
        assert!(
            matches!(&status, Status::Done(Outcome::Failed { error }) if error.contains("malformed answer") && error.contains("after 3 attempts")),
            "{provider}: {status:?}"
        );
        assert_eq!(
            seen.len(),
            3,
            "{provider}: retried a bounded number of times"
        );
        assert!(
            !log.iter().any(|e| matches!(
                e.kind,
                EventKind::ModelResponse { .. } | EventKind::ToolCall(_)
            )),
            "{provider}: nothing of it was acted on"
        );
    }
}

/// A server that reports no usage: the estimate is marked, counted, and trips
/// the run's token budget after the first call. Both adapters.
#[tokio::test]
async fn estimated_usage_trips_a_token_budget() {
    let budget = glia_proto::BudgetLimits {
        max_turns: Some(6),
        max_output_tokens: Some(50),
        max_input_tokens: Some(50),
        ..Default::default()
    };
    let config = RunConfig {
        budget,
        ..RunConfig::default()
    };
    for provider in ["openai", "anthropic"] {
        let (seen, log, status) = match provider {
            "openai" => {
                run_against(
                    OpenAi::default(),
                    "/v1",
                    "llama3",
                    vec![Reply::sse(fixture("openai/no_usage_tools.sse"))],
                    config.clone(),
                )
                .await
            }
            _ => {
                run_against(
                    Anthropic::default(),
                    "",
                    "claude-sonnet-4-5",
                    vec![Reply::sse(fixture("anthropic/no_usage.sse"))],
                    config.clone(),
                )
                .await
            }
        };
        let Status::Parked(glia_proto::PullPoint::Paused {
            reason: glia_proto::PauseReason::Budget { limit },
        }) = status
        else {
            panic!("{provider}: {status:?}")
        };
        assert!(
            matches!(
                limit,
                glia_proto::Limit::InputTokens | glia_proto::Limit::OutputTokens
            ),
            "{provider}: {limit:?}"
        );
        assert_eq!(
            seen.len(),
            1,
            "{provider}: the budget stops the run after the first call"
        );
        let r = responses(&log);
        assert!(
            r[0].0.estimated && r[0].0.output_tokens > 50,
            "{provider}: {:?}",
            r[0].0
        );
        assert!(
            log.iter()
                .any(|e| matches!(e.kind, EventKind::BudgetWarn { .. })),
            "{provider}"
        );
    }
}

/// Tenant caps count estimated usage too: a run against a server that
/// reports none spends its estimate in the tenant's daily token counter, so
/// its next call is refused once the estimate passes the cap.
#[tokio::test]
async fn estimated_usage_counts_against_the_tenant_daily_cap() {
    use glia_agent::budget_gate::{TenantCap, TenantCaps};
    use glia_backends::memory::{MemoryLedger, MemoryLog};
    use glia_backends::{NewRun, RunLog};
    use glia_worker::consumer::LedgerGate;

    let server = Server::replay(vec![
        Reply::sse(fixture("openai/no_usage_tools.sse")),
        Reply::sse(fixture("openai/loop_turn2.sse")),
    ])
    .await;
    let http = HttpProvider::new(
        OpenAi::default(),
        http_client().unwrap(),
        &server.base,
        None,
    );
    let log = Arc::new(MemoryLog::default());
    let caps = TenantCaps(
        [(
            "t".to_owned(),
            TenantCap {
                daily_cost_usd_micros: None,
                daily_tokens: Some(300),
            },
        )]
        .into(),
    );
    let gate = Arc::new(
        LedgerGate::new(Arc::new(MemoryLedger::default()), log.clone(), caps)
            .with_clock(FixedClock(chrono::DateTime::UNIX_EPOCH)),
    );
    let agent = agent(Arc::new(http)).with_budget_gate(gate);
    // Each call reserves about 150 tokens (its request, and a 10-token output cap): the first fits the cap of 300.
    let config = RunConfig {
        model: "llama3".into(),
        max_tokens: 10,
        ..RunConfig::default()
    };
    let run_id = Uuid::now_v7();
    let start = Event {
        run_id,
        seq: 1,
        at: chrono::DateTime::UNIX_EPOCH,
        kind: EventKind::SessionStart {
            redactions: Vec::new(),
            goal: "What is 2 + 40?".into(),
            config: config.clone(),
        },
    };
    log.create_run(NewRun {
        tenant: "t".into(),
        idempotency_key: None,
        batch_id: None,
        start,
        tags: Vec::new(),
        metadata: Default::default(),
        custom_id: None,
        parent_run_id: None,
        parent_call_id: None,
        depth: 0,
    })
    .await
    .unwrap();
    let mut events: Vec<Event> = Vec::new();
    let (_, status) = agent
        .run(run_id, "What is 2 + 40?", config, &mut events)
        .await
        .unwrap();
    let r = responses(&events);
    assert!(r[0].0.estimated && r[0].0.total() > 300, "{:?}", r[0].0);
    assert_eq!(
        status,
        Status::Parked(glia_proto::PullPoint::Paused {
            reason: glia_proto::PauseReason::Budget {
                limit: glia_proto::Limit::TenantDailyTokens
            }
        })
    );
    assert_eq!(
        server.seen().len(),
        1,
        "the second call was refused before it was made"
    );
}
