//! Bounded discovery and live tool lists (issue 29, items 1 and 2): a
//! server that cannot list its tools is recorded attempt by attempt and the
//! run pauses or fails per its policy; against the misbehaving fixture
//! server `odd-mcp` (both transports) a looping cursor is bounded, and list
//! changes reach the next step.

use std::sync::Arc;
use std::time::Duration;

use glia_agent::AgentError;
use glia_agent::agent::{Agent, EventSink, SinkError};
use glia_agent::catalogue::Catalogue;
use glia_agent::provider::{ScriptedProvider, ScriptedTurn};
use glia_agent::tool_sources::ToolSources;
use glia_proto::tool_sources::{ToolSourceUnavailable, UnavailableAction};
use glia_proto::{
    Event, EventKind, McpToolSource, Outcome, PauseReason, Payload, PullPoint, RunConfig, RunState,
    Status,
};
use uuid::Uuid;

/// Keeps the events.
#[derive(Default)]
struct Recorder {
    events: Vec<Event>,
}

#[glia_agent::async_trait]
impl EventSink for Recorder {
    async fn record(&mut self, event: &Event) -> Result<(), SinkError> {
        self.events.push(event.clone());
        Ok(())
    }
}

fn allow(server: &str, tools: &[&str]) -> McpToolSource {
    McpToolSource {
        server: server.into(),
        allow: tools.iter().map(|t| (*t).to_owned()).collect(),
    }
}

fn agent(sources: &Arc<ToolSources>, turns: Vec<ScriptedTurn>) -> Agent {
    Agent::new(Arc::new(ScriptedProvider::new(turns))).with_tool_sources(sources.clone())
}

/// `(attempt, retry_in_ms, server)` of each `tool_source.unavailable`.
fn attempts(events: &[Event]) -> Vec<(u32, Option<u64>, String)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolSourceUnavailable {
                server,
                attempt,
                retry_in_ms,
                ..
            } => Some((*attempt, *retry_in_ms, server.clone())),
            _ => None,
        })
        .collect()
}

const BROKEN: &str =
    "[mcp_servers.broken]\ntransport = \"stdio\"\ncommand = \"/nonexistent/mcp-server\"\n";

/// A server that never starts: each advance records one attempt and
/// returns [`AgentError::ToolSource`] with the backoff; the last attempt
/// pauses the run naming the server and the cause; a resume gives it as
/// many attempts again; with `then = "fail"` the run fails instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_list_is_recorded_then_pauses_or_fails() {
    let catalogue = Catalogue::parse(BROKEN, "<test>").unwrap();
    let sources =
        Arc::new(ToolSources::start(catalogue).with_connect_wait(Duration::from_millis(100)));
    for then in [UnavailableAction::Pause, UnavailableAction::Fail] {
        let config = RunConfig {
            mcp: vec![allow("broken", &["x"])],
            on_tool_source_unavailable: ToolSourceUnavailable {
                attempts: 3,
                backoff_ms: 250,
                then,
            },
            ..RunConfig::default()
        };
        let agent = agent(&sources, vec![ScriptedTurn::text("never")]);
        let run_id = Uuid::now_v7();
        let mut sink = Recorder::default();
        let err = agent
            .run(run_id, "go", config, &mut sink)
            .await
            .expect_err("the first listing fails");
        assert!(
            matches!(&err, AgentError::ToolSource { retry_in_ms: 250, reason } if reason.contains("MCP server broken is not available")),
            "{err:?}"
        );
        let mut state = RunState::replay(run_id, &sink.events).unwrap();
        let err = agent
            .advance(&mut state, None, &mut sink)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                AgentError::ToolSource {
                    retry_in_ms: 500,
                    ..
                }
            ),
            "{err:?}"
        );
        let status = agent.advance(&mut state, None, &mut sink).await.unwrap();
        assert_eq!(
            attempts(&sink.events),
            [
                (1, Some(250), "broken".to_owned()),
                (2, Some(500), "broken".to_owned()),
                (3, None, "broken".to_owned())
            ]
        );
        assert_eq!(RunState::replay(run_id, &sink.events).unwrap(), state);
        match then {
            UnavailableAction::Pause => {
                let Status::Parked(PullPoint::Paused {
                    reason: PauseReason::ToolSource { server, reason },
                }) = status
                else {
                    panic!("expected a tool-source pause, got {status:?}");
                };
                assert_eq!(server, "broken");
                assert!(reason.contains("could not start"), "{reason}");
                // An operator's resume: the count starts again.
                let err = agent
                    .advance(&mut state, Some(Payload::Resume { by: None }), &mut sink)
                    .await
                    .unwrap_err();
                assert!(matches!(err, AgentError::ToolSource { .. }), "{err:?}");
                assert_eq!(
                    attempts(&sink.events).last(),
                    Some(&(1, Some(250), "broken".to_owned()))
                );
            }
            UnavailableAction::Fail => {
                let Status::Done(Outcome::Failed { error }) = status else {
                    panic!("expected a failed run, got {status:?}");
                };
                assert!(
                    error.starts_with("the run's tools cannot be listed (3 attempts): MCP server broken is not available"),
                    "{error}"
                );
            }
        }
    }
    sources.shutdown().await;
}
