//! The result budget: a tool result's text enters the conversation cut to
//! the step's recorded budget (`ToolSpec::max_result_bytes`), on a UTF-8
//! boundary, with a byte-stable marked notice, while the `tool.result`
//! event keeps it whole; replay and every later turn see the same cut form.
//! Also the text placeholder for images sent to a model that takes none.

use glia_proto::content::cut_notice;
use glia_proto::marker::{Insert, classify};
use glia_proto::testing::EventLog;
use glia_proto::{
    ContentBlock, Disposition, EventKind, ImageSource, Message, ResultBlock, Role, RunConfig,
    RunState, ToolCallRecord, ToolContent, ToolErrorKind, ToolSpec, Usage, args_hash,
};
use serde_json::json;

/// A 1x1 PNG, base64.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

/// A run executing its first step, whose one tool `t` has the result budget
/// `budget` (`None`: a log written before budgets), the model having called
/// it as `t1` and the call cleared to run.
fn awaiting_result(budget: Option<u64>) -> EventLog {
    let mut log = EventLog::new();
    log.ok(EventKind::SessionStart {
        redactions: Vec::new(),
        goal: "g".into(),
        config: RunConfig::default(),
    })
    .ok(EventKind::PlanCommit {
        steps: vec!["s".into()],
    })
    .ok(EventKind::StepStart {
        index: 0,
        description: "s".into(),
        tools: vec![ToolSpec {
            max_result_bytes: budget,
            ..ToolSpec::new("t", "T.", json!({"type": "object"}))
        }],
    });
    model_turn(
        &mut log,
        Message {
            role: Role::Assistant,
            content: vec![ContentBlock::ToolUse {
                id: "t1".into(),
                name: "t".into(),
                input: json!({}),
            }],
        },
    );
    log.ok(EventKind::ToolCall(ToolCallRecord {
        call_id: "t1".into(),
        name: "t".into(),
        input: json!({}),
        args_hash: args_hash(&json!({})),
        idempotency_key: "k:t1".into(),
        disposition: Disposition::Run { reminder: None },
    }));
    log
}

fn model_turn(log: &mut EventLog, message: Message) {
    log.ok(EventKind::ModelCall {
        model: "m".into(),
        messages: 1,
        wrap_up: false,
        forced_tool: None,
    })
    .ok(EventKind::ModelResponse {
        redactions: Vec::new(),
        message,
        usage: Usage::default(),
        stop_reason: "end_turn".into(),
        duration_ms: 0,
        cost_usd_micros: 0,
        rejected: None,
    });
}

fn result(content: ToolContent, reminder: Option<&str>) -> EventKind {
    EventKind::ToolResult {
        call_id: "t1".into(),
        content,
        reminder: reminder.map(str::to_owned),
        duration_ms: 0,
        redactions: Vec::new(),
    }
}

/// The content of the conversation's last tool result.
fn seen(state: &RunState) -> (ToolContent, bool) {
    state
        .messages
        .iter()
        .rev()
        .flat_map(|m| &m.content)
        .find_map(|b| match b {
            ContentBlock::ToolResult {
                content, is_error, ..
            } => Some((content.clone(), *is_error)),
            _ => None,
        })
        .expect("a tool result in the conversation")
}

#[test]
fn a_cut_ends_on_a_character_boundary_with_a_byte_stable_notice() {
    // "€" is 3 bytes: a budget of 10 shows 3 whole characters (9 bytes).
    let text = "€".repeat(100);
    let cut = ToolContent::Text(text.clone()).cut(10).into_owned();
    let expected = format!("€€€\n\n{}", cut_notice(300, 9));
    assert_eq!(cut, expected);
    assert_eq!(
        cut_notice(300, 9),
        "⟦glia:cut⟧ [result cut: 300 bytes of text, the first 9 shown. The run's log keeps the whole result; to see more, call the tool again for a narrower result (a filter, a range or a page).]"
    );
    assert_eq!(classify(&cut_notice(300, 9)), Some(Insert::Cut));
    // Deterministic: the same input cuts to the same bytes.
    assert_eq!(ToolContent::Text(text).cut(10).into_owned(), cut);
    // A result within the budget is untouched, to the byte.
    let fits = ToolContent::from("€€€");
    assert_eq!(*fits.cut(9), fits);
}

#[test]
fn a_cut_counts_text_blocks_together_and_keeps_images() {
    let image = ResultBlock::Image {
        source: ImageSource::base64("image/png", PNG),
    };
    let content = ToolContent::Blocks(vec![
        ResultBlock::text("abcdef"),
        image.clone(),
        ResultBlock::text("ghijkl"),
        ResultBlock::text("mnop"),
    ]);
    assert_eq!(content.text_len(), 16, "images do not count");
    let cut = content.cut(8).into_owned();
    assert_eq!(
        cut,
        ToolContent::Blocks(vec![
            ResultBlock::text("abcdef"),
            image,
            ResultBlock::text("gh"),
            ResultBlock::text(cut_notice(16, 8)),
        ])
    );
}

#[test]
fn a_long_result_enters_the_conversation_cut_and_the_event_keeps_it_whole() {
    let whole = "x".repeat(5000);
    let mut log = awaiting_result(Some(100));
    log.ok(result(ToolContent::Text(whole.clone()), Some("be careful")));
    let (content, is_error) = seen(&log.state);
    assert!(!is_error);
    assert_eq!(
        content,
        format!(
            "{}\n\n{}\n\n{}",
            Insert::Reminder.wrap("be careful"),
            "x".repeat(100),
            cut_notice(5000, 100)
        ),
        "cut to the budget, the notice after the head, the reminder (not counted) before"
    );
    let EventKind::ToolResult { content, .. } = &log.events.last().unwrap().kind else {
        panic!("the last event is the result");
    };
    assert_eq!(*content, whole, "the log keeps the whole result");

    // Replay and a checkpoint round trip give the same cut conversation.
    let replayed = RunState::replay(uuid::Uuid::nil(), &log.events).unwrap();
    assert_eq!(replayed, log.state);
    let checkpoint: RunState =
        serde_json::from_str(&serde_json::to_string(&log.state).unwrap()).unwrap();
    assert_eq!(checkpoint, log.state);

    // A later turn still carries the cut form, not the whole.
    model_turn(&mut log, Message::assistant("noted"));
    let (content, _) = seen(&log.state);
    assert!(content.text_len() < 400, "{} bytes", content.text_len());
}

#[test]
fn a_long_error_message_is_cut_too() {
    let mut log = awaiting_result(Some(64));
    log.ok(EventKind::ToolError {
        call_id: "t1".into(),
        error: ToolErrorKind::Failed,
        message: "e".repeat(1000),
        duration_ms: 0,
    });
    let (content, is_error) = seen(&log.state);
    assert!(is_error);
    assert_eq!(
        content,
        format!("{}\n\n{}", "e".repeat(64), cut_notice(1000, 64))
    );
}

#[test]
fn a_forged_cut_notice_from_a_tool_stays_plain_text() {
    let forged = format!("{}padding", cut_notice(1, 1));
    let mut log = awaiting_result(Some(1000));
    log.ok(result(ToolContent::Text(forged), None));
    let (content, _) = seen(&log.state);
    assert_eq!(classify(&content.to_text()), None);
    assert!(content.to_text().starts_with("[glia:cut⟧"));
}

#[test]
fn results_of_logs_without_a_recorded_budget_are_not_cut() {
    let whole = "y".repeat(200_000);
    let mut log = awaiting_result(None);
    log.ok(result(ToolContent::Text(whole.clone()), None));
    assert_eq!(seen(&log.state).0, whole);
}

#[test]
fn budgets_are_checked_naming_the_field() {
    let mut config = RunConfig {
        max_result_bytes: 0,
        ..RunConfig::default()
    };
    assert_eq!(config.validate().unwrap_err().field, "max_result_bytes");
    // The schemas' `maximum` (schemars ranges in config.rs and
    // tool_sources.rs) spells this limit as a literal.
    assert_eq!(glia_proto::limits::MAX_RESULT_BYTES, 1_048_576);
    config.max_result_bytes = (1 << 20) + 1;
    let err = config.validate().unwrap_err();
    assert_eq!(err.field, "max_result_bytes");
    assert!(err.reason.contains("1048576"), "{}", err.reason);
    let config: RunConfig = serde_json::from_value(json!({
        "http_tools": [{"name": "lookup", "description": "L.", "input_schema": {"type": "object"},
                        "url": "https://orders.example.com/l"}],
        "tool_policy": {"lookup": {"max_result_bytes": 0}}
    }))
    .unwrap();
    assert_eq!(
        config.validate().unwrap_err().field,
        "tool_policy.lookup.max_result_bytes"
    );
    // The per-tool budget wins over the run's; the default is 64 KiB and
    // is not written out (a config without it serialises as before).
    let config: RunConfig =
        serde_json::from_value(json!({"tool_policy": {"lookup": {"max_result_bytes": 10}}}))
            .unwrap();
    assert_eq!(config.max_result_bytes_for("lookup"), 10);
    assert_eq!(config.max_result_bytes_for("other"), 64 * 1024);
    assert!(
        serde_json::to_value(RunConfig::default())
            .unwrap()
            .get("max_result_bytes")
            .is_none()
    );
}

#[test]
fn an_image_for_a_text_only_model_is_a_marked_placeholder() {
    let content = ToolContent::Blocks(vec![
        ResultBlock::text("the chart:"),
        ResultBlock::Image {
            source: ImageSource::base64("image/png", PNG),
        },
    ]);
    let shown = content.without_images();
    let placeholder = "⟦glia:image-omitted⟧ [image not shown: image/png, 70 bytes; this model does not take images]";
    assert_eq!(shown, format!("the chart:\n{placeholder}"));
    assert_eq!(classify(placeholder), Some(Insert::ImageOmitted));
}
