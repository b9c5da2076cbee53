//! What a provider reports about a call becomes part of the run's log:
//! retried attempts (`model.retry`), elided messages (`message.elided`), a
//! rejected key (a pause, not a failure), and prices from the provider's
//! table when the run names none.

use crate::common;

use std::sync::Arc;

use common::{Add, LiveSink as Sink, epoch, run_id};
use glia_agent::provider::{
    ModelRequest, ModelResponse, Provider, ProviderError, ScriptedProvider, ScriptedTurn,
};
use glia_agent::tool::ToolRegistry;
use glia_agent::{Agent, FixedClock, async_trait};
use glia_proto::repair::elision_text;
use glia_proto::{
    ContentBlock, Event, EventKind, LiveEvent, Outcome, PauseReason, Payload, Pricing, PullPoint,
    Retry, RunConfig, RunState, Status,
};
use serde_json::json;

fn agent(provider: Arc<dyn Provider>) -> Agent {
    let mut tools = ToolRegistry::default();
    tools.register(Add);
    Agent::new(provider)
        .with_tools(tools)
        .with_clock(FixedClock(epoch()))
}

fn names(log: &[Event]) -> Vec<&'static str> {
    log.iter().map(|e| e.kind.name()).collect()
}

fn retry(attempt: u32, cause: &str) -> Retry {
    Retry {
        attempt,
        cause: cause.into(),
        message: format!("{cause} (scripted)"),
        delay_ms: 250 * u64::from(attempt),
    }
}

#[tokio::test]
async fn retries_are_recorded_between_the_call_and_its_response() {
    let turn = ScriptedTurn {
        retries: vec![retry(1, "overloaded"), retry(2, "stream_cut")],
        ..ScriptedTurn::text("4")
    };
    let provider = Arc::new(ScriptedProvider::new(vec![turn]));
    let mut sink = Sink::default();
    let (state, status) = agent(provider)
        .run(run_id(), "2+2?", RunConfig::default(), &mut sink)
        .await
        .unwrap();
    assert!(matches!(status, Status::Done(Outcome::Succeeded { ref answer, .. }) if answer == "4"));
    let names = names(&sink.log);
    let call = names.iter().position(|n| *n == "model.call").unwrap();
    assert_eq!(
        &names[call..call + 4],
        ["model.call", "model.retry", "model.retry", "model.response"]
    );
    assert_eq!(
        sink.log[call + 1].kind,
        EventKind::ModelRetry(retry(1, "overloaded"))
    );
    assert_eq!(
        sink.log[call + 2].kind,
        EventKind::ModelRetry(retry(2, "stream_cut"))
    );
    // Retries change nothing else: one turn, the answer's usage only.
    assert_eq!(state.usage.turns, 1);
    assert_eq!(RunState::replay(run_id(), &sink.log).unwrap(), state);
    // Live listeners were told to drop each failed attempt's text.
    let live = sink.live.lock().unwrap();
    let discards: Vec<&LiveEvent> = live
        .iter()
        .filter(|e| matches!(e, LiveEvent::ModelDiscard { .. }))
        .collect();
    assert_eq!(
        discards,
        vec![
            &LiveEvent::ModelDiscard {
                attempt: 1,
                cause: "overloaded".into()
            },
            &LiveEvent::ModelDiscard {
                attempt: 2,
                cause: "stream_cut".into()
            }
        ]
    );
    let last_discard = live
        .iter()
        .rposition(|e| matches!(e, LiveEvent::ModelDiscard { .. }))
        .unwrap();
    let text_after: String = live[last_discard..]
        .iter()
        .filter_map(|e| match e {
            LiveEvent::ModelDelta { delta, .. } => Some(delta.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(text_after, "4");
}

#[tokio::test]
async fn an_elided_message_is_recorded_and_stays_elided_after_a_resume() {
    // Turn 1 calls add; turn 2 answers, reporting that the tool result
    // (request message 2) had to be elided; turn 3 follows a user message.
    let turns = vec![
        ScriptedTurn::call("add", json!({"a": 2, "b": 2})),
        ScriptedTurn {
            elided: vec![2],
            ..ScriptedTurn::text("The sum is hidden.")
        },
        ScriptedTurn::text("Still here."),
    ];
    let provider = Arc::new(ScriptedProvider::new(turns.clone()));
    let config = RunConfig {
        conversational: true,
        ..RunConfig::default()
    };
    let mut sink = Sink::default();
    let agent1 = agent(provider.clone());
    let (state, status) = agent1
        .run(run_id(), "Add 2 and 2.", config, &mut sink)
        .await
        .unwrap();
    assert_eq!(status, Status::Parked(PullPoint::AwaitingInput));
    let elided = sink
        .log
        .iter()
        .position(|e| matches!(e.kind, EventKind::MessageElided { .. }))
        .expect("recorded");
    assert_eq!(
        sink.log[elided].kind,
        EventKind::MessageElided {
            index: 2,
            reason: "the model provider refused to process it".into()
        }
    );
    assert_eq!(sink.log[elided - 1].kind.name(), "model.call");
    assert_eq!(sink.log[elided + 1].kind.name(), "model.response");
    assert_eq!(
        state.messages[2].content,
        vec![ContentBlock::ToolResult {
            tool_use_id: "call_1".into(),
            content: elision_text().into(),
            is_error: false
        }]
    );

    // A fresh process rebuilds the run from its log and sends the elided
    // history on the next call.
    let mut resumed = RunState::replay(run_id(), &sink.log).unwrap();
    assert_eq!(resumed, state);
    let provider2 = Arc::new(ScriptedProvider::new(turns).starting_at(2));
    let mut log2 = Vec::new();
    let status = agent(provider2.clone())
        .advance(
            &mut resumed,
            Some(Payload::Input {
                text: "And now?".into(),
                redactions: Vec::new(),
            }),
            &mut log2,
        )
        .await
        .unwrap();
    assert_eq!(status, Status::Parked(PullPoint::AwaitingInput));
    let sent = &provider2.requests()[0].messages;
    assert_eq!(
        sent[2].content,
        vec![ContentBlock::ToolResult {
            tool_use_id: "call_1".into(),
            content: elision_text().into(),
            is_error: false
        }]
    );
    assert!(!serde_json::to_string(sent).unwrap().contains("\"sum\""));
}

#[tokio::test]
async fn a_rejected_key_pauses_the_run_until_resumed() {
    let turns = vec![
        ScriptedTurn {
            error: Some("auth".into()),
            ..ScriptedTurn::default()
        },
        ScriptedTurn::text("done"),
    ];
    let provider = Arc::new(ScriptedProvider::new(turns));
    let agent = agent(provider);
    let mut log = Vec::new();
    let (mut state, status) = agent
        .run(run_id(), "hi", RunConfig::default(), &mut log)
        .await
        .unwrap();
    let Status::Parked(PullPoint::Paused {
        reason: PauseReason::Provider { reason },
    }) = status
    else {
        panic!("{status:?}")
    };
    assert!(reason.starts_with("authentication failed"), "{reason}");
    assert!(
        !log.iter()
            .any(|e| matches!(e.kind, EventKind::SessionComplete { .. })),
        "not failed"
    );
    // An operator fixes the key and resumes.
    let status = agent
        .advance(
            &mut state,
            Some(Payload::Resume {
                by: Some("ops".into()),
            }),
            &mut log,
        )
        .await
        .unwrap();
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { ref answer, .. }) if answer == "done")
    );
    assert_eq!(RunState::replay(run_id(), &log).unwrap(), state);
}

#[test]
fn provider_errors_say_whether_to_retry_and_when() {
    let t = ProviderError::Transient {
        message: "overloaded".into(),
        retry_after_ms: Some(2000),
    };
    assert!(t.is_transient());
    assert_eq!(t.retry_after_ms(), Some(2000));
    assert_eq!(ProviderError::transient("x").retry_after_ms(), None);
    assert_eq!(
        ProviderError::RateLimited { retry_after_ms: 5 }.retry_after_ms(),
        Some(5)
    );
    let auth = ProviderError::Auth("HTTP 401: invalid x-api-key".into());
    assert!(!auth.is_transient());
    assert_eq!(
        auth.to_string(),
        "authentication failed: HTTP 401: invalid x-api-key"
    );
}

/// A scripted provider with a price table.
struct Priced(ScriptedProvider);

#[async_trait]
impl Provider for Priced {
    async fn generate(
        &self,
        request: &ModelRequest,
        live: &(dyn Fn(LiveEvent) + Send + Sync),
    ) -> Result<ModelResponse, ProviderError> {
        self.0.generate(request, live).await
    }

    fn pricing(&self, model: &str) -> Option<Pricing> {
        (model == "priced").then_some(Pricing {
            input: 1_000_000,
            output: 2_000_000,
            cache_write: 0,
            cache_read: 0,
        })
    }
}

#[tokio::test]
async fn the_providers_prices_apply_when_the_run_names_none() {
    let usage = glia_proto::Usage {
        input_tokens: 1000,
        output_tokens: 500,
        ..Default::default()
    };
    let turn = ScriptedTurn {
        usage: Some(usage),
        ..ScriptedTurn::text("ok")
    };
    let cost = |log: &[Event]| {
        log.iter()
            .find_map(|e| match e.kind {
                EventKind::ModelResponse {
                    cost_usd_micros, ..
                } => Some(cost_usd_micros),
                _ => None,
            })
            .unwrap()
    };
    let config = RunConfig {
        model: "priced".into(),
        ..RunConfig::default()
    };
    let mut log = Vec::new();
    agent(Arc::new(Priced(ScriptedProvider::new(vec![turn.clone()]))))
        .run(run_id(), "hi", config.clone(), &mut log)
        .await
        .unwrap();
    // 1000 input tokens at $1/M + 500 output at $2/M = $0.002.
    assert_eq!(cost(&log), 2000);
    // The run's own prices win.
    let own = RunConfig {
        pricing: Some(Pricing {
            input: 0,
            output: 0,
            cache_write: 0,
            cache_read: 0,
        }),
        ..config
    };
    let mut log = Vec::new();
    agent(Arc::new(Priced(ScriptedProvider::new(vec![turn]))))
        .run(run_id(), "hi", own, &mut log)
        .await
        .unwrap();
    assert_eq!(cost(&log), 0);
}

#[tokio::test]
async fn a_run_naming_a_provider_calls_that_one_and_one_this_worker_lacks_pauses() {
    let usage = glia_proto::Usage {
        input_tokens: 1000,
        output_tokens: 500,
        ..Default::default()
    };
    let named = || {
        agent(Arc::new(ScriptedProvider::new(vec![ScriptedTurn::text(
            "from the default",
        )])))
        .with_named_provider(
            "priced",
            Arc::new(Priced(ScriptedProvider::new(vec![ScriptedTurn {
                usage: Some(usage),
                ..ScriptedTurn::text("from priced")
            }]))),
        )
    };
    // `provider = "priced"`: its answer, its prices; the default is never called.
    let config = RunConfig {
        model: "priced".into(),
        provider: Some("priced".into()),
        ..RunConfig::default()
    };
    let mut log = Vec::new();
    let (_, status) = named()
        .run(run_id(), "hi", config.clone(), &mut log)
        .await
        .unwrap();
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { ref answer, .. }) if answer == "from priced"),
        "{status:?}"
    );
    assert!(
        log.iter().any(|e| matches!(
            e.kind,
            EventKind::ModelResponse {
                cost_usd_micros: 2000,
                ..
            }
        )),
        "{:?}",
        names(&log)
    );
    // No provider named: the default.
    let mut log = Vec::new();
    let (_, status) = named()
        .run(run_id(), "hi", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { ref answer, .. }) if answer == "from the default"),
        "{status:?}"
    );

    // A name the worker lacks is refused before the run starts...
    let lacking = || {
        agent(Arc::new(ScriptedProvider::new(vec![ScriptedTurn::text(
            "never",
        )])))
    };
    let err = lacking()
        .run(run_id(), "hi", config.clone(), &mut Vec::new())
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("provider: \"priced\" is not a provider of this worker"),
        "{err}"
    );
    // ...and a run started elsewhere (the fleet's dispatcher records
    // `session.start`) pauses at its first model call, never calling the
    // default provider in its place; a worker that has it goes on.
    let mut log = Vec::new();
    let mut state = named()
        .start(run_id(), "hi", config, &mut log)
        .await
        .unwrap();
    let status = lacking().advance(&mut state, None, &mut log).await.unwrap();
    let Status::Parked(PullPoint::Paused {
        reason: PauseReason::Provider { reason },
    }) = &status
    else {
        panic!("{status:?}")
    };
    assert!(reason.contains("no provider \"priced\""), "{reason}");
    assert!(
        !log.iter()
            .any(|e| matches!(e.kind, EventKind::ModelResponse { .. })),
        "{:?}",
        names(&log)
    );
    let status = named()
        .advance(&mut state, Some(Payload::Resume { by: None }), &mut log)
        .await
        .unwrap();
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { ref answer, .. }) if answer == "from priced"),
        "{status:?}"
    );
    assert_eq!(RunState::replay(run_id(), &log).unwrap(), state);
}
