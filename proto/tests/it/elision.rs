//! `model.retry`, `message.elided`, redacted thinking, and repair's trace of
//! where each request message came from.

use glia_proto::marker::{Insert, classify, is_machine_text};
use glia_proto::repair::{InvalidRequest, elide, elision_text, repair, repair_traced, validate};
use glia_proto::testing::EventLog as Log;
use glia_proto::{
    ContentBlock, EventKind, Message, Phase, PullPoint, Retry, Role, RunConfig, RunState,
    TransitionError, Usage,
};
use proptest::prelude::*;
use serde_json::json;
use uuid::Uuid;

// ----- the transition function -----------------------------------------------

/// A run executing its one step, with a model call in flight.
fn in_flight() -> Log {
    let mut log = Log::new();
    log.ok(EventKind::SessionStart {
        redactions: Vec::new(),
        goal: "find the order".into(),
        config: RunConfig::default(),
    });
    log.ok(EventKind::PlanCommit {
        steps: vec!["reach the goal".into()],
    });
    log.ok(EventKind::StepStart {
        index: 0,
        description: "reach the goal".into(),
        tools: vec![],
    });
    log.ok(call());
    log
}

fn call() -> EventKind {
    EventKind::ModelCall {
        model: "m".into(),
        messages: 1,
        wrap_up: false,
        forced_tool: None,
    }
}

fn retry(attempt: u32) -> EventKind {
    EventKind::ModelRetry(Retry {
        attempt,
        cause: "overloaded".into(),
        message: "HTTP 529".into(),
        delay_ms: 500,
    })
}

fn answer(message: Message) -> EventKind {
    EventKind::ModelResponse {
        redactions: Vec::new(),
        message,
        usage: Usage::default(),
        stop_reason: "end_turn".into(),
        duration_ms: 0,
        cost_usd_micros: 0,
        rejected: None,
    }
}

#[test]
fn a_retry_changes_nothing_but_the_head() {
    let mut log = in_flight();
    let before = log.state.clone();
    log.ok(retry(1)).ok(retry(2));
    assert_eq!(log.state.head_seq, before.head_seq + 2);
    assert_eq!(
        RunState {
            head_seq: before.head_seq,
            ..log.state.clone()
        },
        before
    );
    log.ok(answer(Message::assistant("A1 is refunded.")));
    assert_eq!(log.state.phase, Phase::Executing);
    assert_eq!(
        RunState::replay(Uuid::nil(), &log.events).unwrap(),
        log.state
    );
}

#[test]
fn a_retry_needs_a_model_call_in_flight() {
    // Before any model call of the step.
    let mut log = Log {
        state: RunState::new(Uuid::nil()),
        events: Vec::new(),
    };
    log.ok(EventKind::SessionStart {
        redactions: Vec::new(),
        goal: "g".into(),
        config: RunConfig::default(),
    });
    assert!(matches!(
        log.refused(retry(1)),
        TransitionError::Illegal {
            event: "model.retry",
            ..
        }
    ));
    log.ok(EventKind::PlanCommit {
        steps: vec!["s".into()],
    });
    log.ok(EventKind::StepStart {
        index: 0,
        description: "s".into(),
        tools: vec![],
    });
    assert!(
        matches!(log.refused(retry(1)), TransitionError::Illegal { .. }),
        "no model.call yet"
    );
    // After the answer.
    log.ok(call()).ok(answer(Message::assistant("done")));
    assert!(
        matches!(log.refused(retry(1)), TransitionError::Illegal { .. }),
        "the call has its answer"
    );
    // While parked.
    let mut log = in_flight();
    log.ok(EventKind::SessionPause {
        pull_point: PullPoint::Paused {
            reason: glia_proto::PauseReason::TurnLimit,
        },
    });
    assert!(matches!(
        log.refused(retry(1)),
        TransitionError::Illegal { .. }
    ));
}

#[test]
fn an_elision_replaces_the_named_message_and_survives_replay() {
    let mut log = in_flight();
    log.ok(answer(Message {
        role: Role::Assistant,
        content: vec![
            ContentBlock::text("Looking it up."),
            ContentBlock::ToolUse {
                id: "t1".into(),
                name: "lookup".into(),
                input: json!({"q": "secret"}),
            },
        ],
    }));
    // Give the tool call a result through the batch, then call again.
    log.ok(EventKind::ToolCall(glia_proto::ToolCallRecord {
        call_id: "t1".into(),
        name: "lookup".into(),
        input: json!({"q": "secret"}),
        args_hash: glia_proto::args_hash(&json!({"q": "secret"})),
        idempotency_key: "run:t1".into(),
        disposition: glia_proto::Disposition::Run { reminder: None },
    }));
    log.ok(EventKind::ToolResult {
        call_id: "t1".into(),
        content: "FORBIDDEN text".into(),
        reminder: None,
        duration_ms: 1,
        redactions: Vec::new(),
    });
    log.ok(call());
    assert_eq!(log.state.messages.len(), 3);
    log.ok(EventKind::MessageElided {
        index: 2,
        reason: "provider refusal".into(),
    });
    let elided = &log.state.messages[2];
    assert_eq!(
        elided.content,
        vec![ContentBlock::ToolResult {
            tool_use_id: "t1".into(),
            content: elision_text().into(),
            is_error: false
        }]
    );
    log.ok(EventKind::MessageElided {
        index: 1,
        reason: "provider refusal".into(),
    });
    assert_eq!(
        log.state.messages[1].content[0],
        ContentBlock::text(elision_text())
    );
    assert!(
        matches!(&log.state.messages[1].content[1], ContentBlock::ToolUse { id, input, .. } if id == "t1" && *input == json!({"elided": true}))
    );
    // Pairing still holds, so the next request is valid.
    validate(&repair(&log.state.messages)).unwrap();
    log.ok(answer(Message::assistant("I found it.")));
    // A resumed run rebuilds the elided conversation from the log.
    let replayed = RunState::replay(Uuid::nil(), &log.events).unwrap();
    assert_eq!(replayed, log.state);
    assert!(
        !serde_json::to_string(&replayed.messages)
            .unwrap()
            .contains("FORBIDDEN")
    );
}

#[test]
fn an_elision_of_a_missing_message_or_outside_a_call_is_refused() {
    let mut log = in_flight();
    let err = log.refused(EventKind::MessageElided {
        index: 1,
        reason: "r".into(),
    });
    assert!(
        matches!(err, TransitionError::Illegal { ref reason, .. } if reason.contains("no message 1")),
        "{err}"
    );
    log.ok(answer(Message::assistant("ok")));
    assert!(matches!(
        log.refused(EventKind::MessageElided {
            index: 0,
            reason: "r".into()
        }),
        TransitionError::Illegal { .. }
    ));
}

// ----- elide -----------------------------------------------------------------

#[test]
fn elide_marks_text_keeps_ids_and_drops_thinking() {
    let m = Message {
        role: Role::Assistant,
        content: vec![
            ContentBlock::Thinking {
                thinking: "hmm".into(),
                signature: "sig".into(),
            },
            ContentBlock::RedactedThinking {
                data: "opaque".into(),
            },
            ContentBlock::text("one"),
            ContentBlock::text("two"),
            ContentBlock::ToolUse {
                id: "t9".into(),
                name: "refund".into(),
                input: json!({"order": "A1"}),
            },
        ],
    };
    let e = elide(&m);
    assert_eq!(e.role, Role::Assistant);
    assert_eq!(
        e.content,
        vec![
            ContentBlock::text(elision_text()),
            ContentBlock::ToolUse {
                id: "t9".into(),
                name: "refund".into(),
                input: json!({"elided": true})
            }
        ]
    );
    assert_eq!(classify(&elision_text()), Some(Insert::Elided));
    assert!(is_machine_text(&e.text()));
    // Nothing but thinking: the notice alone.
    let only = Message {
        role: Role::Assistant,
        content: vec![ContentBlock::RedactedThinking { data: "x".into() }],
    };
    assert_eq!(
        elide(&only).content,
        vec![ContentBlock::text(elision_text())]
    );
}

// ----- redacted thinking -----------------------------------------------------

#[test]
fn redacted_thinking_is_kept_in_the_last_assistant_turn_only() {
    let redacted = |d: &str| ContentBlock::RedactedThinking { data: d.into() };
    let history = vec![
        Message::user("q1"),
        Message {
            role: Role::Assistant,
            content: vec![redacted("old"), ContentBlock::text("a1")],
        },
        Message::user("q2"),
        Message {
            role: Role::Assistant,
            content: vec![
                redacted("new"),
                ContentBlock::ToolUse {
                    id: "t1".into(),
                    name: "f".into(),
                    input: json!({}),
                },
            ],
        },
        Message {
            role: Role::User,
            content: vec![ContentBlock::ToolResult {
                tool_use_id: "t1".into(),
                content: "r".into(),
                is_error: false,
            }],
        },
    ];
    let fixed = repair(&history);
    validate(&fixed).unwrap();
    assert_eq!(fixed[1].content, vec![ContentBlock::text("a1")]);
    assert_eq!(fixed[3].content[0], redacted("new"));
    // validate refuses it anywhere else.
    assert_eq!(validate(&history), Err(InvalidRequest::StaleThinking(1)));
    let wrong = vec![Message {
        role: Role::User,
        content: vec![redacted("x")],
    }];
    assert_eq!(
        validate(&wrong),
        Err(InvalidRequest::WrongRole(0, "redacted_thinking"))
    );
}

// ----- repair_traced -----------------------------------------------------------

fn id() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["t1", "t2", "t3", ""]).prop_map(str::to_owned)
}

fn block() -> impl Strategy<Value = ContentBlock> {
    prop_oneof![
        4 => prop::sample::select(vec!["", "ok", "hello", "🦀"]).prop_map(ContentBlock::text),
        1 => Just(ContentBlock::Thinking { thinking: "t".into(), signature: "sig".into() }),
        1 => Just(ContentBlock::RedactedThinking { data: "opaque".into() }),
        3 => id().prop_map(|id| ContentBlock::ToolUse { id, name: "lookup".into(), input: json!({}) }),
        3 => (id(), any::<bool>()).prop_map(|(tool_use_id, is_error)| ContentBlock::ToolResult { tool_use_id, content: "r".into(), is_error }),
    ]
}

fn history() -> impl Strategy<Value = Vec<Message>> {
    let role = prop_oneof![Just(Role::User), Just(Role::Assistant)];
    prop::collection::vec(
        (role, prop::collection::vec(block(), 0..4))
            .prop_map(|(role, content)| Message { role, content }),
        0..8,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    /// The trace is exact: the same messages as `repair`; origins ascending
    /// and in range; every block glia did not write comes from one of the
    /// message's origins; and eliding a request message's origins in the
    /// history still gives a valid request.
    #[test]
    fn origins_explain_every_block(history in history()) {
        let (messages, origins) = repair_traced(&history);
        prop_assert_eq!(&messages, &repair(&history));
        prop_assert_eq!(messages.len(), origins.len());
        for (k, (m, from)) in messages.iter().zip(&origins).enumerate() {
            prop_assert!(from.windows(2).all(|w| w[0] < w[1]), "origins of {} not ascending: {:?}", k, from);
            prop_assert!(from.iter().all(|&i| i < history.len() && history[i].role == m.role));
            for b in &m.content {
                let glia = match b {
                    ContentBlock::Text { text } => is_machine_text(text),
                    ContentBlock::ToolResult { content, .. } => is_machine_text(&content.to_text()) && !from.iter().any(|&i| history[i].content.contains(b)),
                    _ => false,
                };
                if !glia {
                    prop_assert!(from.iter().any(|&i| history[i].content.contains(b)), "block {:?} of message {} is in none of {:?}", b, k, from);
                }
            }
            let mut elided = history.clone();
            for &i in from {
                elided[i] = elide(&elided[i]);
            }
            prop_assert!(validate(&repair(&elided)).is_ok(), "eliding message {} ({:?}) broke the request", k, from);
        }
    }
}
