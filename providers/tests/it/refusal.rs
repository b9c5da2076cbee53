use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use glia_agent::provider::{ModelRequest, ModelResponse, Provider, ProviderError, ToolChoice};
use glia_proto::marker::is_machine_text;
use glia_proto::{ContentBlock, LiveEvent, Message, ProtectedTurn, RefusedTurn, Role, Usage};
use glia_providers::refusal::{Elision, ElisionObserver, RefusalIsolator, elision_text};
use serde_json::json;

/// Refuses whenever any message still holds the word FORBIDDEN; each call
/// uses 10 input and 1 output token.
#[derive(Default)]
struct Filter {
    calls: AtomicUsize,
}

#[async_trait::async_trait]
impl Provider for Filter {
    async fn generate(
        &self,
        request: &ModelRequest,
        live: &(dyn Fn(LiveEvent) + Send + Sync),
    ) -> Result<ModelResponse, ProviderError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let bad = serde_json::to_string(&request.messages)
            .unwrap()
            .matches("FORBIDDEN")
            .count();
        let (text, stop) = if bad > 0 {
            ("I can't help with that.", "refusal")
        } else {
            ("Here is the answer.", "end_turn")
        };
        live(LiveEvent::ModelDelta {
            channel: "text".into(),
            delta: text.into(),
        });
        Ok(ModelResponse::new(
            Message::assistant(text),
            Usage {
                input_tokens: 10,
                output_tokens: 1,
                ..Usage::default()
            },
            stop,
        ))
    }
}

#[derive(Default)]
struct Seen(Mutex<Vec<Elision>>);

impl ElisionObserver for Seen {
    fn elided(&self, e: &Elision) {
        self.0.lock().unwrap().push(e.clone());
    }
}

/// A 9-message history: user / assistant (tool use) / user (tool result) …
fn history(culprits: &[usize]) -> Vec<Message> {
    let mut m = Vec::new();
    for i in 0..9 {
        let text = if culprits.contains(&i) {
            format!("message {i} FORBIDDEN")
        } else {
            format!("message {i}")
        };
        m.push(match i % 3 {
            0 => Message::user(text),
            1 => Message {
                role: Role::Assistant,
                content: vec![
                    ContentBlock::text(text),
                    ContentBlock::ToolUse {
                        id: format!("t{i}"),
                        name: "lookup".into(),
                        input: json!({"q": i}),
                    },
                ],
            },
            _ => Message {
                role: Role::User,
                content: vec![ContentBlock::ToolResult {
                    tool_use_id: format!("t{}", i - 1),
                    content: text.into(),
                    is_error: false,
                }],
            },
        });
    }
    m
}

fn request(messages: Vec<Message>) -> ModelRequest {
    ModelRequest {
        model: "m".into(),
        system: String::new(),
        messages,
        tools: vec![],
        tool_choice: ToolChoice::Auto,
        max_tokens: 100,
    }
}

#[tokio::test]
async fn the_refused_message_is_found_elided_and_reported() {
    let inner = Arc::new(Filter::default());
    let seen = Arc::new(Seen::default());
    let isolator = RefusalIsolator::new(inner.clone()).with_observer(seen.clone());
    let r = isolator
        .generate(&request(history(&[5])), &|_| {})
        .await
        .unwrap();
    assert_eq!(
        (r.stop_reason.as_str(), r.message.text().as_str()),
        ("end_turn", "Here is the answer.")
    );
    let calls = inner.calls.load(Ordering::SeqCst);
    // 1 refused call + at most ⌈log2 9⌉ + 1 = 5 extra calls.
    assert!(calls <= 6, "{calls} calls");
    let elisions = seen.0.lock().unwrap().clone();
    assert_eq!(elisions.len(), 1);
    let e = &elisions[0];
    assert_eq!(e.index, 5);
    assert_eq!(e.extra_calls, calls - 1);
    // The tool result keeps its id (pairing stays valid); its text is a marked elision.
    assert_eq!(
        e.replacement.content,
        vec![ContentBlock::ToolResult {
            tool_use_id: "t4".into(),
            content: elision_text().into(),
            is_error: false
        }]
    );
    assert!(is_machine_text(&elision_text()));
    // Every call is charged: the answer's usage includes the refusal and the probes.
    assert_eq!(r.usage.input_tokens, 10 * calls as u64);
    // The answer names the elided request message, for the loop to record.
    assert_eq!(r.elided, vec![5]);
    // The next turn sends the elided history directly: one call, and the
    // answer says which message it elided on the way.
    let before = inner.calls.load(Ordering::SeqCst);
    let mut next = history(&[5]);
    next.push(Message::assistant("Here is the answer."));
    next.push(Message::user("And now?"));
    let r = isolator.generate(&request(next), &|_| {}).await.unwrap();
    assert_eq!(r.stop_reason, "end_turn");
    assert_eq!(inner.calls.load(Ordering::SeqCst) - before, 1);
    assert_eq!(r.elided, vec![5]);
    // A history already elided (as the loop recorded it) needs nothing.
    let mut recorded = history(&[5]);
    recorded[5] = e.replacement.clone();
    let r = isolator
        .generate(&request(recorded), &|_| {})
        .await
        .unwrap();
    assert_eq!((r.stop_reason.as_str(), r.elided.len()), ("end_turn", 0));
}

#[tokio::test]
async fn the_culprit_can_be_an_assistant_tool_use_or_a_tool_result() {
    for culprit in [1, 5, 8] {
        let inner = Arc::new(Filter::default());
        let seen = Arc::new(Seen::default());
        let isolator = RefusalIsolator::new(inner.clone()).with_observer(seen.clone());
        let r = isolator
            .generate(&request(history(&[culprit])), &|_| {})
            .await
            .unwrap();
        assert_eq!(r.stop_reason, "end_turn", "culprit {culprit}");
        assert_eq!(seen.0.lock().unwrap()[0].index, culprit);
    }
}

#[tokio::test]
async fn two_culprits_give_up_within_the_bound() {
    let inner = Arc::new(Filter::default());
    let isolator = RefusalIsolator::new(inner.clone()).with_max_extra_calls(4);
    let r = isolator
        .generate(&request(history(&[2, 7])), &|_| {})
        .await
        .unwrap();
    assert_eq!(
        r.stop_reason, "refusal",
        "no single message explains it: the refusal stands"
    );
    assert!(inner.calls.load(Ordering::SeqCst) <= 5);
}

#[tokio::test]
async fn listeners_drop_the_streamed_refusal_and_see_the_answer() {
    let isolator = RefusalIsolator::new(Arc::new(Filter::default()));
    let live = Mutex::new(Vec::new());
    let r = isolator
        .generate(&request(history(&[3])), &|e| live.lock().unwrap().push(e))
        .await
        .unwrap();
    assert_eq!(r.elided, vec![3]);
    assert!(r.retries.is_empty());
    let live = live.into_inner().unwrap();
    assert_eq!(
        live,
        vec![
            LiveEvent::ModelDelta {
                channel: "text".into(),
                delta: "I can't help with that.".into()
            },
            LiveEvent::ModelDiscard {
                attempt: 1,
                cause: "refusal".into()
            },
            LiveEvent::ModelDelta {
                channel: "text".into(),
                delta: "Here is the answer.".into()
            },
        ],
        "the probes stream nothing"
    );
}

/// The goal (message 0) and the latest human turn (message 6: the last user
/// turn with a person's text; 7 and 8 are a tool use and its result) are
/// never elided: the refusal stands and the answer says which was refused.
/// An earlier human turn is elided like any other message.
#[tokio::test]
async fn the_goal_and_the_latest_human_turn_are_never_elided() {
    for (culprit, turn) in [
        (0, ProtectedTurn::Goal),
        (6, ProtectedTurn::LatestHumanTurn),
    ] {
        let inner = Arc::new(Filter::default());
        let seen = Arc::new(Seen::default());
        let isolator = RefusalIsolator::new(inner.clone()).with_observer(seen.clone());
        let r = isolator
            .generate(&request(history(&[culprit])), &|_| {})
            .await
            .unwrap();
        assert_eq!(
            r.stop_reason, "refusal",
            "culprit {culprit}: the refusal stands"
        );
        assert_eq!(
            r.refused_turn,
            Some(RefusedTurn {
                index: culprit,
                turn
            })
        );
        assert!(
            r.elided.is_empty() && seen.0.lock().unwrap().is_empty(),
            "culprit {culprit}: nothing elided"
        );
        // Every call is charged: the refusal and the probes.
        assert_eq!(
            r.usage.input_tokens,
            10 * inner.calls.load(Ordering::SeqCst) as u64
        );
    }
    let inner = Arc::new(Filter::default());
    let seen = Arc::new(Seen::default());
    let isolator = RefusalIsolator::new(inner.clone()).with_observer(seen.clone());
    let r = isolator
        .generate(&request(history(&[3])), &|_| {})
        .await
        .unwrap();
    assert_eq!(
        (r.stop_reason.as_str(), r.elided.as_slice(), r.refused_turn),
        ("end_turn", &[3][..], None),
        "an earlier human turn is elided"
    );
}
