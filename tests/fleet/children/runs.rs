//! The stories of [`super`], each on a fleet of its own.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use glia_testkit::fleet::{Fleet, check_log, http_as};
use serde_json::{Value, json};

/// Generous: a story takes seconds; the deadline only stops a hang.
const DEADLINE: Duration = Duration::from_secs(180);
const LEASE_MS: u64 = 2_000;

/// The parent calls the `refunder` agent three times in one turn (and,
/// with `own_refund`, the `refund_order` tool itself beside them).
fn parent_script(own_refund: bool) -> Value {
    let mut calls = vec![
        json!({"name": "refunder", "input": {"goal": "refund order A1, first"}}),
        json!({"name": "refunder", "input": {"goal": "refund order A1, second"}}),
        json!({"name": "refunder", "input": {"goal": "refund order A1, third"}}),
    ];
    if own_refund {
        calls.push(json!({"name": "refund_order", "input": {"order_id": "A1"}}));
    }
    json!([{"tool_calls": calls}, {"text": "All three refunded."}])
}

/// A fleet of one dispatcher and one worker (so the worker holding a run
/// is known), the scripts, and the agents `refunder` (one refund, then an
/// answer) and `looper` (calculator, three times, then an answer).
fn fleet(own_refund: bool, tool_delay_ms: u64) -> Fleet {
    let mut f = Fleet::new(&[
        ("parent", parent_script(own_refund)),
        (
            "child",
            json!([{"tool_calls": [{"name": "refund_order", "input": {"order_id": "A1"}}]}, {"text": "Refunded A1."}]),
        ),
        (
            "budgeted",
            json!([{"tool_calls": [{"name": "looper", "input": {"goal": "add forever"}}]}, {"text": "The looper stopped."}]),
        ),
        (
            "loop",
            json!([
                {"tool_calls": [{"name": "calculator", "input": {"op": "add", "a": 1, "b": 2}}]},
                {"tool_calls": [{"name": "calculator", "input": {"op": "add", "a": 3, "b": 4}}]},
                {"tool_calls": [{"name": "calculator", "input": {"op": "add", "a": 5, "b": 6}}]},
                {"text": "11"}
            ]),
        ),
    ]);
    f.extra_env
        .push(("GLIA_DEMO_TOOL_DELAY_MS".into(), tool_delay_ms.to_string()));
    f.start_dispatcher();
    f.start_worker(LEASE_MS);
    for def in [
        json!({"name": "refunder", "description": "Refunds one order.", "model": "script:child", "tools": ["refund_order"]}),
        json!({"name": "looper", "description": "Adds numbers.", "model": "script:loop", "tools": ["calculator"]}),
    ] {
        let name = def["name"].as_str().unwrap().to_owned();
        let (status, body) = http_as(
            "PUT",
            &format!("{}/v1/agents/{name}", f.server),
            Some(def),
            None,
        )
        .unwrap();
        assert!(
            status == 200 || status == 201,
            "register {name}: {status} {body}"
        );
    }
    f
}

fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(t) = probe() {
            return t;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn run(f: &Fleet, id: &str) -> Value {
    let (status, body) = f.api.get(&format!("/v1/runs/{id}"));
    assert_eq!(status, 200, "{body}");
    body
}

fn children(f: &Fleet, parent: &str) -> Vec<Value> {
    let (status, body) = f.api.get(&format!("/v1/runs?parent={parent}&limit=1000"));
    assert_eq!(status, 200, "{body}");
    body["runs"].as_array().cloned().unwrap_or_default()
}

fn done(f: &Fleet, id: &str) -> Value {
    wait_for(&format!("run {id} to end"), || {
        let r = run(f, id);
        (r["status"] == "done").then_some(r)
    })
}

/// The `refund <key>` lines of the effects file by the run whose id
/// starts the key (`{run_id}:{turn}:{call_id}`).
fn refunds_by_run(f: &Fleet) -> HashMap<String, usize> {
    let mut by = HashMap::new();
    for line in f.api.effects() {
        if let Some(key) = line.strip_prefix("refund ") {
            let run = key.split(':').next().unwrap_or_default().to_owned();
            *by.entry(run).or_default() += 1;
        }
    }
    by
}

fn submit_parent(f: &Fleet, model: &str, agents: &[&str], budget: Value) -> String {
    f.api.submit(
        "refund three orders",
        json!({"model": format!("script:{model}"), "agents": agents, "budget": budget}),
    )
}

/// Has run `id` recorded a `tool.call` of `tool`?
fn called(f: &Fleet, id: &str, tool: &str) -> bool {
    f.api
        .events(id)
        .iter()
        .any(|e| e["type"] == "tool.call" && e["data"]["name"] == tool)
}

/// The common end of the stories where the parent completes: three
/// children, each once, each linked to its own call, each log whole; the
/// parent's three `child.ended`.
fn three_children_once(f: &Fleet, parent: &str) -> Vec<Value> {
    let end = done(f, parent);
    assert_eq!(end["outcome"]["kind"], "succeeded", "{end}");
    assert_eq!(end["outcome"]["answer"], "All three refunded.");
    let kids = children(f, parent);
    assert_eq!(kids.len(), 3, "one child per call: {kids:#?}");
    let mut calls: Vec<&str> = kids
        .iter()
        .map(|k| k["parent_call_id"].as_str().unwrap())
        .collect();
    calls.sort_unstable();
    calls.dedup();
    assert_eq!(calls.len(), 3, "each call its own child");
    for k in &kids {
        assert_eq!(k["status"], "done");
        assert_eq!(k["depth"], 1);
        assert_eq!(k["parent_run_id"], parent);
        check_log(&f.api, k["run_id"].as_str().unwrap());
    }
    let events = check_log(&f.api, parent);
    let ended = events
        .iter()
        .filter(|e| e.kind.name() == "child.ended")
        .count();
    assert_eq!(ended, 3);
    // Every run of the fleet is the parent or one of its children.
    let (_, all) = f.api.get("/v1/runs?limit=1000");
    assert_eq!(all["runs"].as_array().unwrap().len(), 4, "{all}");
    kids
}

#[test]
fn three_parallel_children_complete_the_parent() {
    let f = fleet(false, 0);
    let parent = submit_parent(&f, "parent", &["refunder@1"], json!({}));
    let kids = three_children_once(&f, &parent);
    for k in &kids {
        assert_eq!(k["outcome"]["kind"], "succeeded", "{k}");
        assert_eq!(k["agent"], "refunder");
    }
    // Each child refunded once, nobody else did.
    let refunds = refunds_by_run(&f);
    assert_eq!(refunds.len(), 3, "{refunds:?}");
    for k in &kids {
        assert_eq!(refunds.get(k["run_id"].as_str().unwrap()), Some(&1));
    }
    // The parent's usage holds the children's tokens.
    let parent_tokens = run(&f, &parent)["usage"]["tokens"]["input_tokens"]
        .as_u64()
        .unwrap();
    let child_tokens: u64 = kids
        .iter()
        .map(|k| k["usage"]["tokens"]["input_tokens"].as_u64().unwrap())
        .sum();
    assert!(
        parent_tokens >= child_tokens,
        "{parent_tokens} < {child_tokens}"
    );
}

#[test]
fn killing_the_worker_holding_the_parent_starts_no_child_twice() {
    // The parent's own refund holds it on the worker for 1.5 s.
    let mut f = fleet(true, 1_500);
    let parent = submit_parent(&f, "parent", &["refunder@1"], json!({}));
    wait_for("the parent's own refund to start", || {
        called(&f, &parent, "refund_order").then_some(())
    });
    f.kill_and_replace_worker(0, LEASE_MS);
    let kids = three_children_once(&f, &parent);
    let refunds = refunds_by_run(&f);
    for k in &kids {
        assert_eq!(
            refunds.get(k["run_id"].as_str().unwrap()),
            Some(&1),
            "each child refunded once: {refunds:?}"
        );
    }
    assert!(refunds.get(&parent).copied().unwrap_or(0) <= 1);
}

#[test]
fn killing_a_childs_worker_and_the_dispatcher_starts_no_child_twice() {
    let mut f = fleet(false, 3_000);
    let parent = submit_parent(&f, "parent", &["refunder@1"], json!({}));
    // A child is inside its refund on the only worker: kill it, and the
    // dispatcher too, then bring both back.
    let child = wait_for("a child's refund to start", || {
        children(&f, &parent)
            .into_iter()
            .find(|k| called(&f, k["run_id"].as_str().unwrap(), "refund_order"))
    });
    f.restart_dispatcher();
    f.kill_and_replace_worker(0, LEASE_MS);
    let kids = three_children_once(&f, &parent);
    assert!(kids.iter().any(|k| k["run_id"] == child["run_id"]));
    // An interrupted refund is never run again (it is not idempotent):
    // at most once per child.
    for (run, n) in refunds_by_run(&f) {
        assert_eq!(n, 1, "run {run} refunded {n} times");
    }
}

#[test]
fn cancelling_the_parent_cancels_its_running_children() {
    let f = fleet(false, 20_000);
    let parent = submit_parent(&f, "parent", &["refunder@1"], json!({}));
    wait_for("three children, one in its refund", || {
        let kids = children(&f, &parent);
        (kids.len() == 3
            && kids
                .iter()
                .any(|k| called(&f, k["run_id"].as_str().unwrap(), "refund_order")))
        .then_some(())
    });
    let (status, body) = f.api.post(
        &format!("/v1/runs/{parent}/cancel"),
        json!({"reason": "not needed"}),
    );
    assert_eq!(status, 202, "{body}");
    let end = done(&f, &parent);
    assert_eq!(end["outcome"]["kind"], "cancelled", "{end}");
    for k in children(&f, &parent) {
        let end = done(&f, k["run_id"].as_str().unwrap());
        assert_eq!(end["outcome"]["kind"], "cancelled", "{end}");
        assert!(
            end["outcome"]["reason"].as_str().unwrap().contains(&parent),
            "{end}"
        );
    }
    assert_eq!(children(&f, &parent).len(), 3);
}

#[test]
fn the_parents_budget_stops_a_child_that_would_exceed_it() {
    let f = fleet(false, 0);
    // Three model calls for the parent; the looper would take four.
    let parent = submit_parent(&f, "budgeted", &["looper@1"], json!({"max_turns": 3}));
    let end = done(&f, &parent);
    assert_eq!(end["outcome"]["kind"], "succeeded", "{end}");
    assert_eq!(end["outcome"]["answer"], "The looper stopped.");
    let kids = children(&f, &parent);
    assert_eq!(kids.len(), 1);
    let child = &kids[0];
    assert_eq!(child["outcome"]["kind"], "cancelled", "{child}");
    assert!(
        child["outcome"]["reason"]
            .as_str()
            .unwrap()
            .contains("budget"),
        "{child}"
    );
    assert_eq!(child["usage"]["turns"], 2, "bounded by the parent's 3 - 1");
    let events = check_log(&f.api, &parent);
    let told = events.iter().any(|e| {
        matches!(
            &e.kind,
            glia_proto::EventKind::ChildEnded {
                outcome: glia_proto::Outcome::Cancelled { .. },
                ..
            }
        )
    });
    assert!(told, "the parent's model was told the child was stopped");
}
