//! Issue 31: the console's experiment pages, over HTTP with a session
//! cookie: the list, and an experiment's versions (pass rates with their
//! intervals) and cases × versions table (changed cases first, each cell
//! linking to its runs, failures saying why), escaped; another tenant's
//! experiment is 404. Experiments are made and driven with the evals
//! helpers of `common`.

use crate::common;
use crate::inbox::{page, sign_in};

use axum::http::StatusCode;
use serde_json::{Value, json};

use common::*;

/// A case id with markup, as a dataset may have.
const MARKUP: &str = "<b>x</b>";
/// [`MARKUP`] as the pages escape it.
const ESCAPED: &str = "&lt;b&gt;x&lt;&#x2f;b&gt;";

fn eval() -> Value {
    json!({"name": "refunds", "dataset": "cases", "agents": ["support@1", "support@2"],
        "repetitions": 2, "graders": [{"kind": "contains", "expected": "answer"}]})
}

/// Where `needle` is in `text` (panics naming it when it is not).
fn at(text: &str, needle: &str) -> usize {
    text.find(needle)
        .unwrap_or_else(|| panic!("{needle:?} is not on the page: {text}"))
}

#[tokio::test]
async fn console_experiment_pages_show_versions_and_changed_cases_first_escaped() {
    let h = evals_harness();
    // Three cases; version 2 regresses on the middle one, whose id is markup.
    let agent = two_versions_over(&h, &["A1", MARKUP, "A3"], &[MARKUP]).await;
    let id = start(&h, eval()).await;
    let (cookie, _) = sign_in(&h, APP_A).await;
    let uri = format!("/console/experiments/{id}");

    // Before anything ran: the cells show their items' status.
    let early = send(&h.router, page(&uri, &cookie)).await;
    assert_eq!(early.status, StatusCode::OK, "{}", early.text);
    assert!(early.text.contains("queued"), "{}", early.text);
    assert!(early.text.contains("0</strong> of 12 cells graded"));

    let (view, _) = drive(&h, &agent, &id).await;

    // The list: the experiment, linking to its page; in the nav.
    let list = send(&h.router, page("/console/experiments", &cookie)).await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.text);
    assert!(
        list.text.contains(&format!("href=\"{uri}\"")),
        "{}",
        list.text
    );
    assert!(list.text.contains(">refunds</a>"));
    assert!(list.text.contains("cases@1"));
    assert!(list.text.contains("support@1") && list.text.contains("support@2"));
    assert!(list.text.contains("12 / 12"), "progress: {}", list.text);
    assert!(list.text.contains("href=\"/console/experiments\""), "nav");
    let bad = send(&h.router, page("/console/experiments?before=x", &cookie)).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);

    // The page: both versions' pass rates and intervals, batch links.
    let one = send(&h.router, page(&uri, &cookie)).await;
    assert_eq!(one.status, StatusCode::OK, "{}", one.text);
    let t = &one.text;
    assert!(t.contains("completed"));
    assert!(
        t.contains("<strong>100.0%</strong>"),
        "support@1 passes all: {t}"
    );
    assert!(
        t.contains("<strong>66.7%</strong>"),
        "support@2: 4 of 6: {t}"
    );
    assert!(t.contains("[61.0%, 100.0%]"), "Wilson 6/6: {t}");
    for v in view["versions"].as_array().unwrap() {
        let batch = v["batch_id"].as_str().unwrap();
        assert!(t.contains(&format!("href=\"/console/batches/{batch}\"")));
    }
    assert!(t.contains("1 regressed, 0 fixed"), "{t}");

    // Cases: the changed one first though it is second in the dataset,
    // escaped everywhere (no markup of the tenant's gets through).
    let changed = at(t, &format!("data-case=\"{ESCAPED}\""));
    assert!(changed < at(t, "data-case=\"A1\""));
    assert!(changed < at(t, "data-case=\"A3\""));
    assert!(!t.contains(MARKUP), "the case id is escaped: {t}");
    assert!(t.contains("regressed") && t.contains("FAIL"));
    assert!(
        t.contains(&format!("order {ESCAPED} is refunded")),
        "the failing verdict's reason, escaped: {t}"
    );

    // Each cell links to the run of each repetition, and the run page is there.
    let cells = view["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 12);
    for c in cells {
        let run = c["run_id"].as_str().unwrap();
        assert!(t.contains(&format!("href=\"/console/runs/{run}\"")), "{c}");
    }
    assert!(t.contains(">#0</a>") && t.contains(">#1</a>"));
    let run = cells[0]["run_id"].as_str().unwrap();
    let run_page = send(&h.router, page(&format!("/console/runs/{run}"), &cookie)).await;
    assert_eq!(run_page.status, StatusCode::OK);

    // Another tenant's experiment is not found, like a missing one; an
    // admin sees it.
    let (theirs, _) = sign_in(&h, SUB_B).await;
    let foreign = send(&h.router, page(&uri, &theirs)).await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND, "{}", foreign.text);
    assert!(!foreign.text.contains("refunds"));
    let listed = send(&h.router, page("/console/experiments", &theirs)).await;
    assert!(!listed.text.contains(&id), "not in tenant b's list");
    for missing in [
        format!("/console/experiments/{}", uuid::Uuid::now_v7()),
        "/console/experiments/not-an-id".into(),
    ] {
        let r = send(&h.router, page(&missing, &cookie)).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{missing}");
    }
    let (admin, _) = sign_in(&h, ADMIN).await;
    let seen = send(&h.router, page(&uri, &admin)).await;
    assert_eq!(seen.status, StatusCode::OK, "{}", seen.text);
}
