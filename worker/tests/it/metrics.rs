//! A worker's metrics follow the events the loop records: a run driven by
//! the real loop through a sink that hands every event and live delta to a
//! `RunObserver` leaves exactly the counts its log implies.

use crate::common;
use crate::observed;

use std::sync::Arc;

use common::run_id;
use glia_agent::provider::ScriptedTurn;
use glia_proto::{BudgetLimits, Retry, RunConfig, RunState, Status};
use glia_worker::metrics::{RunObserver, WorkerMetrics};
use observed::Observed;
use serde_json::json;

/// The value of the sample `series` (name and labels, exactly as encoded).
fn sample(metrics: &WorkerMetrics, series: &str) -> Option<f64> {
    metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn model_tool_and_run_metrics_follow_the_log() {
    let metrics = Arc::new(WorkerMetrics::new("scripted"));
    let rate_limited = Retry {
        attempt: 1,
        cause: "rate_limited".into(),
        message: "429 Too Many Requests".into(),
        delay_ms: 1500,
    };
    let turns = vec![
        ScriptedTurn {
            retries: vec![rate_limited],
            ..ScriptedTurn::call("add", json!({"a": 2, "b": 3}))
        },
        ScriptedTurn::call("add", json!({"a": "two", "b": 3})),
        ScriptedTurn::text("The sum is 5."),
    ];
    let (agent, _) = common::agent(turns);
    let id = run_id();
    let mut sink = Observed(RunObserver::new(Some(metrics.clone()), &RunState::new(id)));
    let config = RunConfig {
        model: "m1".into(),
        ..RunConfig::default()
    };
    let (_, status) = agent
        .run(id, "add 2 and 3", config, &mut sink)
        .await
        .unwrap();
    assert!(matches!(status, Status::Done(_)), "{status:?}");

    let m = &*metrics;
    assert_eq!(
        sample(
            m,
            r#"glia_worker_model_calls_total{provider="scripted",model="m1",outcome="ok"}"#
        ),
        Some(3.0)
    );
    assert_eq!(
        sample(
            m,
            r#"glia_worker_model_retries_total{provider="scripted",model="m1",cause="rate_limited"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            m,
            r#"glia_worker_rate_limit_wait_seconds_total{provider="scripted",model="m1"}"#
        ),
        Some(1.5)
    );
    assert_eq!(
        sample(
            m,
            r#"glia_worker_model_duration_seconds_count{provider="scripted",model="m1"}"#
        ),
        Some(3.0)
    );
    // Every answer streams a first delta: the tool calls theirs too.
    assert_eq!(
        sample(
            m,
            r#"glia_worker_model_time_to_first_token_seconds_count{provider="scripted",model="m1"}"#
        ),
        Some(3.0)
    );
    assert!(
        sample(
            m,
            r#"glia_worker_model_tokens_total{provider="scripted",model="m1",kind="output"}"#
        )
        .is_some_and(|n| n > 0.0)
    );
    assert_eq!(
        sample(
            m,
            r#"glia_worker_tool_calls_total{tool="add",outcome="ok"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            m,
            r#"glia_worker_tool_calls_total{tool="add",outcome="invalid_arguments"}"#
        ),
        Some(1.0)
    );
    assert_eq!(sample(m, "glia_worker_runs_started_total"), Some(1.0));
    assert_eq!(sample(m, "glia_worker_steps_total"), Some(1.0));
    assert_eq!(
        sample(
            m,
            r#"glia_worker_runs_completed_total{outcome="succeeded"}"#
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn budget_pauses_and_a_spend_cap_are_counted_by_limit_and_outcome() {
    let metrics = Arc::new(WorkerMetrics::new("scripted"));
    let (agent, _) = common::agent(vec![
        ScriptedTurn::call("add", json!({"a": 1, "b": 1})),
        ScriptedTurn::text("2"),
    ]);
    let id = run_id();
    let mut sink = Observed(RunObserver::new(Some(metrics.clone()), &RunState::new(id)));
    let config = RunConfig {
        model: "m1".into(),
        budget: BudgetLimits {
            max_turns: Some(1),
            ..BudgetLimits::default()
        },
        ..RunConfig::default()
    };
    let (_, status) = agent.run(id, "add", config, &mut sink).await.unwrap();
    assert!(matches!(status, Status::Parked(_)), "{status:?}");
    assert_eq!(
        sample(
            &metrics,
            r#"glia_worker_budget_pauses_total{limit="turns"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&metrics, r#"glia_worker_pauses_total{pull_point="paused"}"#),
        Some(1.0)
    );

    let (agent, _) = common::agent(vec![ScriptedTurn {
        error: Some("spend_cap".into()),
        ..ScriptedTurn::default()
    }]);
    let id = run_id();
    let mut sink = Observed(RunObserver::new(Some(metrics.clone()), &RunState::new(id)));
    let (_, status) = agent
        .run(
            id,
            "add",
            RunConfig {
                model: "m2".into(),
                ..RunConfig::default()
            },
            &mut sink,
        )
        .await
        .unwrap();
    assert!(matches!(status, Status::Parked(_)), "{status:?}");
    assert_eq!(
        sample(
            &metrics,
            r#"glia_worker_model_calls_total{provider="scripted",model="m2",outcome="paused"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&metrics, r#"glia_worker_pauses_total{pull_point="paused"}"#),
        Some(2.0)
    );
}

/// HTTP hook calls are counted by hook, topic and outcome, with their
/// latency: a `before_tool_call` hook whose address refuses connections
/// (failing open, so the run goes on) is counted `unreachable` once per call.
#[tokio::test]
async fn http_hook_calls_are_counted_by_hook_topic_and_outcome() {
    let metrics = Arc::new(WorkerMetrics::new("scripted"));
    // An address nothing listens on: bound, then let go.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    // SAFETY: a variable only this test reads, set before anything reads it.
    unsafe {
        std::env::set_var(
            "GLIA_TEST_WORKER_HOOK_SECRET",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        )
    };
    let catalogue = glia_agent::catalogue::Catalogue::parse(
        &format!("[hooks.gone]\nurl = \"http://{addr}/hook\"\ntopics = [\"before_tool_call\"]\nsecret_env = \"GLIA_TEST_WORKER_HOOK_SECRET\"\non_failure = \"open\"\n"),
        "<test>",
    )
    .unwrap();
    let hooks = glia_agent::http_hooks::HttpHooks::from_catalogue(&catalogue)
        .unwrap()
        .with_observer(metrics.clone());
    let (agent, _) = common::agent(vec![
        ScriptedTurn::call("add", json!({"a": 2, "b": 3})),
        ScriptedTurn::call("add", json!({"a": 4, "b": 5})),
        ScriptedTurn::text("done"),
    ]);
    let agent = agent.with_http_hooks(hooks);
    let mut log = Vec::new();
    let (_, status) = agent
        .run(run_id(), "add", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert!(matches!(status, Status::Done(_)), "{status:?}");
    let m = &*metrics;
    assert_eq!(
        sample(
            m,
            r#"glia_worker_hook_calls_total{hook="gone",topic="before_tool_call",outcome="unreachable"}"#
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            m,
            r#"glia_worker_hook_duration_seconds_count{hook="gone",topic="before_tool_call"}"#
        ),
        Some(2.0)
    );
}
