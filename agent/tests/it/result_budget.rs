//! The result budget through the loop, with the scripted provider (which
//! checks every request like the API): a worker tool's 5 MiB result is cut
//! in the next request and in every later one, while its `tool.result`
//! event holds all of it; a `tool_policy` cap wins over the run's.

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use glia_agent::Agent;
use glia_agent::provider::{ScriptedProvider, ScriptedTurn};
use glia_agent::tool::{DynTool, ToolContext, ToolFailure, ToolRegistry};
use glia_proto::content::cut_notice;
use glia_proto::{
    DEFAULT_MAX_RESULT_BYTES, EventKind, ModelRequest, RunConfig, ToolContent, ToolPolicy, ToolSpec,
};
use serde_json::{Value, json};

use crate::common::{Add, LiveSink, assert_replays, run_id, through_json};

/// 5 MiB of one line.
const BIG: usize = 5 << 20;

/// Answers 5 MiB of text on one line: a JSON string (`"0123456789…"`),
/// which is what the model is shown.
struct Big;
impl DynTool for Big {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("big", "A large export.", json!({"type": "object"}))
    }
    fn call_raw(
        &self,
        _input: Value,
        _ctx: ToolContext,
    ) -> BoxFuture<'static, Result<String, ToolFailure>> {
        async { Ok(big_text()) }.boxed()
    }
}

fn big_text() -> String {
    let digits = "0123456789".repeat(BIG / 10 + 1);
    serde_json::to_string(&digits[..BIG - 2]).unwrap()
}

fn agent(turns: Vec<ScriptedTurn>) -> (Agent, Arc<ScriptedProvider>) {
    let mut tools = ToolRegistry::default();
    tools.register(Add);
    tools.register_dyn(Arc::new(Big)).unwrap();
    let provider = Arc::new(ScriptedProvider::new(turns));
    (Agent::new(provider.clone()).with_tools(tools), provider)
}

/// The content of `big`'s result (call id `call_1`) in `request`.
fn big_result(request: &ModelRequest) -> ToolContent {
    crate::common::result_in(request, "call_1").0
}

#[tokio::test]
async fn a_5_mib_worker_tool_result_is_cut_in_this_and_every_later_request() {
    let (agent, provider) = agent(vec![
        ScriptedTurn::call("big", json!({})),
        ScriptedTurn::call("add", json!({"a": 1, "b": 2})),
        ScriptedTurn::text("done"),
    ]);
    let mut sink = LiveSink::default();
    let (state, _) = agent
        .run(run_id(), "export", RunConfig::default(), &mut sink)
        .await
        .unwrap();

    let budget = DEFAULT_MAX_RESULT_BYTES as usize;
    let cut = ToolContent::Text(format!(
        "{}\n\n{}",
        &big_text()[..budget],
        cut_notice(BIG, budget)
    ));
    let requests = provider.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(big_result(&requests[1]), cut, "the next request is cut");
    assert_eq!(big_result(&requests[2]), cut, "a later request too");
    assert!(cut.text_len() <= budget + cut_notice(BIG, budget).len() + 2);

    let whole = sink
        .log
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::ToolResult { content, .. } => Some(content.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(whole.text_len(), BIG, "the event holds the whole result");
    assert_eq!(whole, big_text());
    let frozen = sink
        .log
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::StepStart { tools, .. } => Some(tools.clone()),
            _ => None,
        })
        .unwrap();
    assert!(
        frozen
            .iter()
            .all(|t| t.max_result_bytes == Some(DEFAULT_MAX_RESULT_BYTES)),
        "the budget is frozen with each tool"
    );
    assert_replays(&sink.log, &state);
    assert_eq!(through_json(&state), state);
}

#[tokio::test]
async fn a_tools_own_budget_wins_over_the_runs() {
    let (agent, provider) = agent(vec![
        ScriptedTurn::call("big", json!({})),
        ScriptedTurn::text("done"),
    ]);
    let config = RunConfig {
        max_result_bytes: 100_000,
        tool_policy: [(
            "big".to_owned(),
            ToolPolicy {
                max_result_bytes: Some(1000),
                ..ToolPolicy::default()
            },
        )]
        .into(),
        ..RunConfig::default()
    };
    let mut sink = LiveSink::default();
    agent
        .run(run_id(), "export", config, &mut sink)
        .await
        .unwrap();
    assert_eq!(
        big_result(&provider.requests()[1]),
        format!("{}\n\n{}", &big_text()[..1000], cut_notice(BIG, 1000))
    );
}
