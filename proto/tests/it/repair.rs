//! Request repair over arbitrary histories: random user and assistant turns
//! with random text (empty strings included), thinking, tool uses whose ids
//! come from a small pool (so duplicates happen), tool results from the same
//! pool (so orphans happen), blocks in roles that cannot carry them, shuffled
//! and truncated at random points.
//!
//! What repair keeps, read off `repair::repair`:
//! - every non-empty text block of either role, in order (only empty text is
//!   dropped, and the only text added is a marked filler turn);
//! - the first tool use of each non-empty id, from assistant turns only;
//! - the thinking blocks of the last assistant turn and of no other;
//! - for each kept tool use, the first result for it in the user turn right
//!   after its assistant turn; any other call gets a marked synthetic result.

use std::collections::HashSet;

use glia_proto::marker::{Insert, is_machine_text};
use glia_proto::repair::InvalidRequest;
use glia_proto::repair::{repair, synthetic_result_text, validate};
use glia_proto::{ContentBlock, ImageSource, Message, ResultBlock, Role, ToolContent};
use proptest::prelude::*;
use serde_json::json;

// ----- strategies ------------------------------------------------------------

/// Text with plenty of empty strings; never glia's own marked text.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => Just(String::new()),
        2 => prop::sample::select(vec!["ok", "hello", "héllo ✓", "🦀", " ", "\n", "Done."]).prop_map(str::to_owned),
        2 => "[a-z ]{1,8}",
        1 => "\\PC{1,6}".prop_filter("not a glia marker", |s| !is_machine_text(s)),
    ]
}

fn non_empty_text() -> impl Strategy<Value = String> {
    text().prop_filter("non-empty", |t| !t.is_empty())
}

/// Ids from a small pool, the empty id included.
fn id() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["t1", "t2", "t3", "t4", ""]).prop_map(str::to_owned)
}

fn block() -> impl Strategy<Value = ContentBlock> {
    prop_oneof![
        4 => text().prop_map(|text| ContentBlock::Text { text }),
        1 => (text(), prop::sample::select(vec!["", "sig"]))
            .prop_map(|(thinking, signature)| ContentBlock::Thinking { thinking, signature: signature.into() }),
        3 => (id(), 0..3i64).prop_map(|(id, n)| ContentBlock::ToolUse { id, name: "lookup".into(), input: json!({ "n": n }) }),
        3 => (id(), text(), any::<bool>())
            .prop_map(|(tool_use_id, content, is_error)| ContentBlock::ToolResult { tool_use_id, content: content.into(), is_error }),
        1 => (id(), prop::collection::vec(result_block(), 0..3), any::<bool>())
            .prop_map(|(tool_use_id, blocks, is_error)| ContentBlock::ToolResult { tool_use_id, content: ToolContent::Blocks(blocks), is_error }),
    ]
}

/// The signature of a PNG file, and of a JPEG one, as base64.
const PNG: &str = "iVBORw0KGgo=";
const JPEG: &str = "/9j/4AAQ";

/// Result blocks: text (empty too), images the APIs take, and images they
/// refuse (wrong media type for the bytes, a type no API takes, bytes that
/// are no image, data that is not base64, data over the size limit).
fn result_block() -> impl Strategy<Value = ResultBlock> {
    let image = |media_type: &str, data: &str| ResultBlock::Image {
        source: ImageSource::base64(media_type, data),
    };
    prop_oneof![
        2 => text().prop_map(|text| ResultBlock::Text { text }),
        2 => Just(image("image/png", PNG)),
        1 => Just(image("image/jpeg", JPEG)),
        1 => Just(image("image/jpeg", PNG)),
        1 => Just(image("image/svg+xml", "PHN2Zy8+")),
        1 => Just(image("image/png", "aGVsbG8=")),
        1 => Just(image("image/png", "not base64!")),
        1 => Just(image("image/png", &"A".repeat(glia_proto::MAX_IMAGE_BASE64_LEN + 4))),
    ]
}

fn message() -> impl Strategy<Value = Message> {
    let role = prop_oneof![Just(Role::User), Just(Role::Assistant)];
    (role, prop::collection::vec(block(), 0..4))
        .prop_map(|(role, content)| Message { role, content })
}

/// A random history, shuffled, then cut at a random point.
fn history() -> impl Strategy<Value = Vec<Message>> {
    (
        prop::collection::vec(message(), 0..10).prop_shuffle(),
        any::<prop::sample::Index>(),
    )
        .prop_map(|(mut h, cut)| {
            h.truncate(cut.index(h.len() + 1));
            h
        })
}

/// One round of a valid history: an assistant turn and the user turn after it.
#[derive(Debug, Clone)]
struct Round {
    texts: Vec<String>,
    thinking: Option<String>,
    calls: usize,
    results_order: Vec<usize>,
    user_texts: Vec<String>,
}

fn round() -> impl Strategy<Value = Round> {
    (
        prop::collection::vec(non_empty_text(), 0..3),
        prop::option::of(text()),
        0..4usize,
        prop::collection::vec(non_empty_text(), 0..3),
    )
        .prop_flat_map(|(texts, thinking, calls, user_texts)| {
            let order = Just((0..calls).collect::<Vec<_>>()).prop_shuffle();
            (
                Just(texts),
                Just(thinking),
                Just(calls),
                order,
                Just(user_texts),
            )
        })
        .prop_map(
            |(texts, thinking, calls, results_order, user_texts)| Round {
                texts,
                thinking,
                calls,
                results_order,
                user_texts,
            },
        )
}

/// A valid history built from rounds: results in call order (`canonical`)
/// and the same history with each results turn in a random order (`shuffled`).
#[derive(Debug, Clone)]
struct ValidHistory {
    canonical: Vec<Message>,
    shuffled: Vec<Message>,
}

fn valid_history() -> impl Strategy<Value = ValidHistory> {
    (
        prop::collection::vec(non_empty_text(), 1..3),
        prop::collection::vec(round(), 0..5),
    )
        .prop_map(|(goal, rounds)| {
            let first = Message {
                role: Role::User,
                content: goal.into_iter().map(ContentBlock::text).collect(),
            };
            let mut canonical = vec![first.clone()];
            let mut shuffled = vec![first];
            let mut next_id = 0;
            let last = rounds.len().saturating_sub(1);
            for (r, round) in rounds.into_iter().enumerate() {
                let mut assistant: Vec<ContentBlock> = Vec::new();
                if r == last
                    && let Some(thinking) = round.thinking
                {
                    assistant.push(ContentBlock::Thinking {
                        thinking,
                        signature: "sig".into(),
                    });
                }
                assistant.extend(round.texts.into_iter().map(ContentBlock::text));
                let mut results = Vec::new();
                for i in 0..round.calls {
                    next_id += 1;
                    let id = format!("toolu_{next_id}");
                    assistant.push(ContentBlock::ToolUse {
                        id: id.clone(),
                        name: "lookup".into(),
                        input: json!({ "i": i }),
                    });
                    results.push(ContentBlock::ToolResult {
                        tool_use_id: id,
                        content: format!("result {i}").into(),
                        is_error: i % 2 == 1,
                    });
                }
                if assistant.is_empty() {
                    assistant.push(ContentBlock::text("…"));
                }
                let mut user_texts: Vec<ContentBlock> = round
                    .user_texts
                    .into_iter()
                    .map(ContentBlock::text)
                    .collect();
                if results.is_empty() && user_texts.is_empty() {
                    user_texts.push(ContentBlock::text("go on"));
                }
                let reordered: Vec<ContentBlock> = round
                    .results_order
                    .iter()
                    .map(|&i| results[i].clone())
                    .collect();
                for (list, results) in [(&mut canonical, results), (&mut shuffled, reordered)] {
                    list.push(Message {
                        role: Role::Assistant,
                        content: assistant.clone(),
                    });
                    list.push(Message {
                        role: Role::User,
                        content: results
                            .into_iter()
                            .chain(user_texts.iter().cloned())
                            .collect(),
                    });
                }
            }
            ValidHistory {
                canonical,
                shuffled,
            }
        })
}

// ----- helpers ---------------------------------------------------------------

fn texts<'a>(messages: impl IntoIterator<Item = &'a Message>) -> Vec<&'a str> {
    messages
        .into_iter()
        .flat_map(|m| &m.content)
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn thinking(message: &Message) -> Vec<&ContentBlock> {
    message
        .content
        .iter()
        .filter(|b| matches!(b, ContentBlock::Thinking { .. }))
        .collect()
}

fn tool_uses(messages: &[Message]) -> Vec<&ContentBlock> {
    messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .flat_map(|m| &m.content)
        .filter(|b| matches!(b, ContentBlock::ToolUse { .. }))
        .collect()
}

fn first_result_for<'a>(message: &'a Message, id: &str) -> Option<&'a ContentBlock> {
    message
        .content
        .iter()
        .find(|b| matches!(b, ContentBlock::ToolResult { tool_use_id, .. } if tool_use_id == id))
}

// ----- properties ------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn repaired_histories_are_valid(h in history()) {
        let fixed = repair(&h);
        prop_assert_eq!(validate(&fixed), Ok(()), "history: {:#?}\nrepaired: {:#?}", h, fixed);
    }

    #[test]
    fn repair_is_idempotent(h in history()) {
        let once = repair(&h);
        prop_assert_eq!(repair(&once), once);
    }

    /// A valid history with non-empty ids and results in call order is left
    /// exactly as it is.
    #[test]
    fn repair_leaves_a_valid_history_alone(h in valid_history()) {
        prop_assert_eq!(validate(&h.canonical), Ok(()));
        prop_assert_eq!(repair(&h.canonical), h.canonical);
    }

    /// Providers accept results in any order; repair puts them in call order
    /// and changes nothing else.
    #[test]
    fn repair_only_reorders_results_of_a_valid_history(h in valid_history()) {
        prop_assert_eq!(validate(&h.shuffled), Ok(()));
        prop_assert_eq!(repair(&h.shuffled), h.canonical);
    }

    #[test]
    fn every_tool_use_is_answered_in_the_next_turn(h in history()) {
        let fixed = repair(&h);
        for (i, m) in fixed.iter().enumerate().filter(|(_, m)| m.role == Role::Assistant) {
            let next = &fixed[i + 1];
            prop_assert_eq!(next.role, Role::User);
            let ids: Vec<&str> = m.tool_uses().map(|(id, _, _)| id).collect();
            let answers: Vec<&str> = next
                .content
                .iter()
                .filter_map(|b| match b {
                    ContentBlock::ToolResult { tool_use_id, .. } => Some(tool_use_id.as_str()),
                    _ => None,
                })
                .collect();
            prop_assert_eq!(answers, ids, "answers come first, in call order");
        }
    }

    /// Every result in the output is one from the input or a marked synthetic
    /// error, and a result that directly follows its call is the one kept.
    #[test]
    fn results_are_kept_or_synthetic(h in history()) {
        let fixed = repair(&h);
        let input_results: Vec<&ContentBlock> =
            h.iter().flat_map(|m| &m.content).filter(|b| matches!(b, ContentBlock::ToolResult { .. })).collect();
        for block in fixed.iter().flat_map(|m| &m.content) {
            // A result with blocks may come out with its images made usable
            // (`images_the_apis_refuse_become_text_notes` checks how).
            if let ContentBlock::ToolResult { tool_use_id, content, is_error } = block
                && !input_results.contains(&block)
                && !input_results.iter().any(|r| matches!(r, ContentBlock::ToolResult { tool_use_id: t, content: ToolContent::Blocks(_), is_error: e } if t == tool_use_id && e == is_error))
            {
                prop_assert!(*is_error);
                prop_assert!(is_machine_text(&content.to_text()), "{content:?}");
                prop_assert_eq!(content, &ToolContent::Text(synthetic_result_text()));
            }
        }
        let mut seen = HashSet::new();
        for (i, m) in h.iter().enumerate().filter(|(_, m)| m.role == Role::Assistant) {
            for (id, _, _) in m.tool_uses() {
                if id.is_empty() || !seen.insert(id) {
                    continue;
                }
                let Some(given) = h.get(i + 1).filter(|n| n.role == Role::User).and_then(|n| first_result_for(n, id)) else {
                    continue;
                };
                let kept = fixed.iter().find_map(|n| first_result_for(n, id));
                prop_assert_eq!(kept.map(without_images), Some(without_images(given)), "result for {}", id);
            }
        }
    }

    /// No non-empty text is lost and none is made up: the output's text
    /// blocks, leaving out glia's marked filler, are the input's non-empty
    /// text blocks (either role), in order.
    #[test]
    fn non_empty_text_is_kept_in_order(h in history()) {
        let fixed = repair(&h);
        let kept: Vec<&str> = texts(&fixed).into_iter().filter(|t| !is_machine_text(t)).collect();
        let given: Vec<&str> = texts(&h).into_iter().filter(|t| !t.is_empty()).collect();
        prop_assert_eq!(kept, given);
        for t in texts(&fixed).into_iter().filter(|t| is_machine_text(t)) {
            prop_assert!(t.starts_with(Insert::Filler.marker()), "{t:?}");
        }
    }

    /// Only the last assistant turn's thinking survives, all of it.
    #[test]
    fn only_the_last_thinking_is_kept(h in history()) {
        let fixed = repair(&h);
        let expected: Vec<&ContentBlock> =
            h.iter().rposition(|m| m.role == Role::Assistant).map(|i| thinking(&h[i])).unwrap_or_default();
        let kept: Vec<&ContentBlock> = fixed.iter().flat_map(thinking).collect();
        prop_assert_eq!(kept, expected);
    }

    /// Tool uses: kept in order, ids unique within each assistant turn, and
    /// every tool use whose id appears once in the history is kept.
    #[test]
    fn tool_uses_are_deduplicated_per_turn(h in history()) {
        let fixed = repair(&h);
        let original = tool_uses(&h);
        let kept = tool_uses(&fixed);
        let mut rest = original.iter();
        for k in &kept {
            prop_assert!(rest.any(|o| o == k), "kept tool uses are a subsequence of the history's");
        }
        for m in fixed.iter().filter(|m| m.role == Role::Assistant) {
            let ids: Vec<&str> = m.tool_uses().map(|(id, _, _)| id).collect();
            prop_assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len(), "ids repeat within a turn");
        }
        let id_of = |b: &ContentBlock| match b { ContentBlock::ToolUse { id, .. } => id.clone(), _ => String::new() };
        for o in &original {
            let id = id_of(o);
            if !id.is_empty() && original.iter().filter(|b| id_of(b) == id).count() == 1 {
                prop_assert!(kept.contains(o), "a tool use with a unique id is kept");
            }
        }
    }
}

#[test]
fn an_id_may_come_back_in_a_later_turn() {
    // Some providers number call ids per response (`call_0`).
    let call = |input: i64| Message {
        role: Role::Assistant,
        content: vec![ContentBlock::ToolUse {
            id: "call_0".into(),
            name: "add".into(),
            input: serde_json::json!({ "a": input }),
        }],
    };
    let result = |text: &str| Message {
        role: Role::User,
        content: vec![ContentBlock::ToolResult {
            tool_use_id: "call_0".into(),
            content: text.into(),
            is_error: false,
        }],
    };
    let history = vec![
        Message::user("go"),
        call(1),
        result("1"),
        call(2),
        result("2"),
    ];
    assert_eq!(repair(&history), history);
    assert_eq!(validate(&history), Ok(()));
    let mut twice = call(1);
    twice.content.push(twice.content[0].clone());
    assert!(
        validate(&[Message::user("go"), twice, result("1")]).is_err(),
        "within a turn, ids stay unique"
    );
}

#[test]
fn an_empty_history_becomes_one_filler_turn() {
    let fixed = repair(&[]);
    assert_eq!(
        fixed,
        vec![Message::user(
            Insert::Filler.wrap("(earlier conversation omitted)")
        )]
    );
    assert_eq!(validate(&fixed), Ok(()));
}

/// A result with the parts repair may change taken out: its images and
/// the notes that replace them, and empty text blocks (an empty result
/// becomes empty text). What is left must come through unchanged.
fn without_images(block: &ContentBlock) -> ContentBlock {
    let ContentBlock::ToolResult {
        tool_use_id,
        content,
        is_error,
    } = block
    else {
        return block.clone();
    };
    let content = match content {
        ToolContent::Text(text) => ToolContent::Text(text.clone()),
        ToolContent::Blocks(blocks) => ToolContent::Text(
            blocks
                .iter()
                .filter_map(|b| match b {
                    ResultBlock::Text { text }
                        if !text.is_empty() && !text.starts_with("[image left out: ") =>
                    {
                        Some(text.as_str())
                    }
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
        ),
    };
    ContentBlock::ToolResult {
        tool_use_id: tool_use_id.clone(),
        content,
        is_error: *is_error,
    }
}

/// An image the APIs take is kept; one whose bytes contradict its media
/// type gets the type of its bytes; any other becomes a text note naming
/// its type and size; empty text blocks go. `validate` refuses each
/// refused image the way the APIs do, and passes the repaired request.
#[test]
fn images_the_apis_refuse_become_text_notes() {
    let image = |media_type: &str, data: &str| ResultBlock::Image {
        source: ImageSource::base64(media_type, data),
    };
    let call = Message {
        role: Role::Assistant,
        content: vec![ContentBlock::ToolUse {
            id: "t1".into(),
            name: "shot".into(),
            input: json!({}),
        }],
    };
    let with = |blocks: Vec<ResultBlock>| {
        vec![
            Message::user("look"),
            call.clone(),
            Message {
                role: Role::User,
                content: vec![ContentBlock::ToolResult {
                    tool_use_id: "t1".into(),
                    content: ToolContent::Blocks(blocks),
                    is_error: false,
                }],
            },
        ]
    };
    let refused = [
        (
            image("image/jpeg", PNG),
            "the data is image/png, not image/jpeg",
        ),
        (
            image("image/svg+xml", "PHN2Zy8+"),
            "image/svg+xml is not a type a model accepts",
        ),
        (
            image("image/png", "aGVsbG8="),
            "its data is not a PNG, JPEG, GIF or WebP image",
        ),
        (
            image("image/png", "not base64!"),
            "its data is not valid base64",
        ),
        (
            image(
                "image/png",
                &"A".repeat(glia_proto::MAX_IMAGE_BASE64_LEN + 4),
            ),
            "over the 5242880 bytes",
        ),
    ];
    for (bad, why) in &refused {
        match validate(&with(vec![bad.clone()])) {
            Err(InvalidRequest::BadImage(2, reason)) => assert!(reason.contains(why), "{reason}"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert_eq!(
        validate(&with(vec![ResultBlock::text("")])),
        Err(InvalidRequest::EmptyContent(2))
    );
    assert_eq!(
        validate(&with(vec![])),
        Err(InvalidRequest::EmptyContent(2))
    );
    assert_eq!(validate(&with(vec![image("image/png", PNG)])), Ok(()));

    let mut blocks = vec![ResultBlock::text(""), image("image/png", PNG)];
    blocks.extend(refused.iter().map(|(b, _)| b.clone()));
    let fixed = repair(&with(blocks));
    validate(&fixed).expect("repaired");
    let ContentBlock::ToolResult {
        content: ToolContent::Blocks(out),
        ..
    } = &fixed[2].content[0]
    else {
        panic!("{:?}", fixed[2])
    };
    assert_eq!(out[0], image("image/png", PNG));
    assert_eq!(
        out[1],
        image("image/png", PNG),
        "the media type of its bytes"
    );
    let notes: Vec<String> = out[2..]
        .iter()
        .map(|b| match b {
            ResultBlock::Text { text } => text.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(notes.len(), 4);
    assert_eq!(
        notes[0],
        "[image left out: image/svg+xml, 6 bytes; image/svg+xml is not a type a model accepts (PNG, JPEG, GIF or WebP)]"
    );
    assert!(
        notes[1].starts_with("[image left out: image/png, 5 bytes; its data is not a PNG"),
        "{}",
        notes[1]
    );
    assert!(
        notes[3].starts_with(
            "[image left out: image/png, 3932163 bytes; its base64 data is 5242884 bytes"
        ),
        "{}",
        notes[3]
    );
    assert!(!notes.iter().any(|n| n.contains("AAAA")), "never the data");
    // All blocks empty text: an empty text result.
    let fixed = repair(&with(vec![ResultBlock::text("")]));
    assert!(
        matches!(&fixed[2].content[0], ContentBlock::ToolResult { content: ToolContent::Text(t), .. } if t.is_empty())
    );
}
