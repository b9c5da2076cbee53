//! On a real fleet (`glia dispatcher` and `glia worker --demo` on the real
//! Postgres, RabbitMQ and Redis): what a deny rule refuses is in no answer
//! and nowhere in the fleet's database; a tool result is redacted, or
//! withheld behind a marked note, before the log holds it.

use std::process::Command;
use std::time::{Duration, Instant};

use glia_testkit::fleet::*;
use serde_json::{Value, json};

const CARD: &str = "4111 1111 1111 1111";

/// Every row of the fleet's database, as text.
fn database_text(fleet: &Fleet) -> String {
    let out = Command::new("pg_dump")
        .args(["--data-only", &fleet.db_url])
        .output()
        .expect("pg_dump runs");
    assert!(
        out.status.success(),
        "pg_dump: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn cards() -> Value {
    json!({"input": [{"name": "no-cards", "deny": "\\b(?:\\d[ -]?){15}\\d\\b", "reason": "card numbers are not accepted"}]})
}

#[test]
fn a_denied_goal_is_refused_and_stored_nowhere() {
    let mut fleet = Fleet::new(&[]);
    fleet.start_dispatcher();
    let (status, body) = fleet.post(
        "/v1/runs",
        json!({"goal": format!("refund card {CARD}"), "config": {"guardrails": cards()}}),
    );
    assert_eq!(status, 422, "{body}");
    assert_eq!(
        (
            body["error"]["code"].as_str(),
            body["error"]["field"].as_str()
        ),
        (Some("screened_input"), Some("goal")),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no-cards"),
        "{body}"
    );
    // A batch item: the whole submission is refused naming the item.
    let (status, batch) = fleet.post("/v1/batches", json!({"config": {"guardrails": cards()}, "items": [
        {"custom_id": "a", "goal": "hello"}, {"custom_id": "b", "goal": format!("pay with {CARD}")}]}));
    assert_eq!(status, 422, "{batch}");
    for answer in [&body, &batch] {
        assert!(
            !answer.to_string().contains("4111"),
            "the answer holds the card: {answer}"
        );
    }
    let (status, runs) = fleet.get("/v1/runs");
    assert_eq!(status, 200, "{runs}");
    assert_eq!(runs["runs"], json!([]), "no run was created");
    // The card's digit groups, with or without separators (a bare "4111"
    // also occurs by chance in ids and timestamps of an unrelated row).
    let db = database_text(&fleet);
    for part in ["4111 1111", "41111111", "1111 1111", "11111111"] {
        assert!(!db.contains(part), "the card number is in the database");
    }
}

#[test]
fn tool_results_are_redacted_or_withheld_before_the_log_holds_them() {
    let call = json!({"tool_calls": [{"name": "get_order", "input": {"order_id": "A1"}}]});
    let mut fleet = Fleet::new(&[("lookup", json!([call, {"text": "done"}]))]);
    fleet.start_dispatcher();
    fleet.start_worker(5_000);
    let redact = json!({"model": "script:lookup", "tools": ["get_order"], "guardrails": {"tool_results": [{"name": "item", "redact": "head[a-z]+s"}, {"name": "state", "redact": "deliv[a-z]+"}]}});
    let deny = json!({"model": "script:lookup", "tools": ["get_order"], "guardrails": {"tool_results": [{"name": "delivery", "deny": "deliver(ed)"}]}});
    let (redacted, withheld) = (
        fleet.submit("look up A1", redact),
        fleet.submit("look up A1 again", deny),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    for run in [&redacted, &withheld] {
        drive(&fleet, run, deadline);
        let log = check_log(&fleet, run);
        let state = glia_proto::RunState::replay(log[0].run_id, &log).unwrap();
        assert!(
            matches!(
                state.status(),
                glia_proto::Status::Done(glia_proto::Outcome::Succeeded { .. })
            ),
            "{:?}",
            state.status()
        );
    }
    let result = |run: &str| -> glia_proto::EventKind {
        check_log(&fleet, run)
            .into_iter()
            .find(|e| matches!(e.kind, glia_proto::EventKind::ToolResult { .. }))
            .expect("a tool.result")
            .kind
    };
    let glia_proto::EventKind::ToolResult {
        content,
        redactions,
        ..
    } = result(&redacted)
    else {
        unreachable!()
    };
    assert!(
        content.to_text().contains("[redacted:item]") && !content.to_text().contains("headphones"),
        "{content}"
    );
    let rules = |names: &[&str]| {
        names
            .iter()
            .map(|n| glia_proto::Redaction {
                guardrail: (*n).into(),
                count: 1,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(redactions, rules(&["item", "state"]));
    let glia_proto::EventKind::ToolResult { content, .. } = result(&withheld) else {
        unreachable!()
    };
    assert!(
        glia_proto::marker::is_machine_text(&content.to_text())
            && content.to_text().contains("withheld"),
        "{content}"
    );
    let trips: Vec<(glia_proto::GuardrailStage, String)> = check_log(&fleet, &withheld)
        .into_iter()
        .filter_map(|e| match e.kind {
            glia_proto::EventKind::GuardrailTripped {
                stage, guardrail, ..
            } => Some((stage, guardrail)),
            _ => None,
        })
        .collect();
    assert_eq!(
        trips,
        vec![(
            glia_proto::GuardrailStage::ToolResult,
            "delivery".to_owned()
        )]
    );
    // The raw result is nowhere: not in the log, not in any table.
    let db = database_text(&fleet);
    assert!(
        !db.contains("headphones"),
        "the redacted text is in the database"
    );
    assert!(
        !db.contains("\"delivered\""),
        "the withheld result is in the database"
    );
}
