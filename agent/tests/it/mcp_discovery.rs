//! Bounded discovery and live tool lists (issue 29, items 1 and 2): a
//! server that cannot list its tools is recorded attempt by attempt and the
//! run pauses or fails per its policy; against the misbehaving fixture
//! server `odd-mcp` (both transports) a looping cursor is bounded, and list
//! changes reach the next step.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use glia_agent::AgentError;
use glia_agent::agent::{Agent, EventSink, SinkError};
use glia_agent::catalogue::Catalogue;
use glia_agent::provider::{ScriptedProvider, ScriptedTurn};
use glia_agent::tool_sources::{OfferError, ToolSources};
use glia_proto::tool_sources::{ToolSourceUnavailable, UnavailableAction};
use glia_proto::{
    Event, EventKind, McpToolSource, Outcome, PauseReason, Payload, PullPoint, RunConfig, RunState,
    Status, ToolErrorKind,
};
use glia_testkit::odd_mcp::{self, ListMode};
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

// ----- against the misbehaving fixture server, over both transports -----

#[derive(Debug, Clone, Copy)]
enum Transport {
    Stdio,
    Http,
}

const TRANSPORTS: [Transport; 2] = [Transport::Stdio, Transport::Http];

/// A fresh state directory for one `odd-mcp`.
fn state_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("glia-odd-{}", Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A catalogue with `odd-mcp` as server `odd` over `transport`, listing
/// per `list` (`normal`, `looping-cursor`, `never`), keeping its files in
/// `state`; `extra` is appended to its table (e.g. `trust = "trusted"`).
async fn odd(transport: Transport, list: &str, state: &Path, extra: &str) -> String {
    match transport {
        Transport::Stdio => format!(
            "[mcp_servers.odd]\ntransport = \"stdio\"\ncommand = {:?}\nargs = [\"stdio\", {:?}, \"--list\", {list:?}]\n{extra}\n",
            odd_mcp::odd_mcp_bin().display().to_string(),
            state.display().to_string(),
        ),
        Transport::Http => {
            let url = odd_mcp::spawn_http(state, ListMode::parse(list).expect("a list mode")).await;
            format!("[mcp_servers.odd]\ntransport = \"streamable_http\"\nurl = {url:?}\n{extra}\n")
        }
    }
}

fn start(toml: &str) -> ToolSources {
    let catalogue = Catalogue::parse(toml, "<test>").expect("valid catalogue");
    ToolSources::start(catalogue).with_connect_wait(Duration::from_secs(60))
}

/// How many `tools/list` requests the server saw.
fn lists(state: &Path) -> usize {
    odd_mcp::requests(state)
        .iter()
        .filter(|l| l.starts_with("list "))
        .count()
}

/// A server whose `nextCursor` never advances is listed twice (the first
/// page, then the cursor seen again) and its first page is used; a tool
/// the run allows beyond it is a named unavailability, never "no such
/// tool".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_cursor_is_bounded_and_never_hides_an_allowed_tool() {
    for transport in TRANSPORTS {
        let state = state_dir();
        let sources = start(&odd(transport, "looping-cursor", &state, "").await);
        let mut config = RunConfig {
            mcp: vec![allow("odd", &["echo"])],
            ..RunConfig::default()
        };
        let specs = sources
            .offered(&config)
            .await
            .unwrap_or_else(|e| panic!("{transport:?}: echo is on the first page: {e}"));
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["echo"], "{transport:?}");
        assert_eq!(
            odd_mcp::requests(&state)
                .iter()
                .filter(|l| l.starts_with("list "))
                .collect::<Vec<_>>(),
            ["list -", "list again"],
            "{transport:?}: the first page, then the repeated cursor, then stop"
        );
        config.mcp = vec![allow("odd", &["hang"])];
        match sources.offered(&config).await {
            Err(OfferError::Unavailable { server, reason }) => {
                assert_eq!(server, "odd");
                assert!(
                    reason.starts_with(r#"mcp[0].allow[0]: MCP server "odd" offers no tool "hang""#)
                        && reason.contains("its tool list was cut short (tools/list page 2 gave cursor \"again\" again)"),
                    "{transport:?}: {reason}"
                );
            }
            other => panic!("{transport:?}: expected a named unavailability, got {other:?}"),
        }
        assert_eq!(lists(&state), 4, "{transport:?}: two pages per listing");
        sources.shutdown().await;
        std::fs::remove_dir_all(&state).ok();
    }
}

/// A server that never answers `tools/list`: each attempt is recorded with
/// the deadline as its cause, and the run pauses at its last attempt,
/// naming the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_lists_is_recorded_and_the_run_pauses() {
    for transport in TRANSPORTS {
        let state = state_dir();
        // The server never answers: the deadline sets how long this takes,
        // not what it shows.
        let sources = Arc::new(
            start(&odd(transport, "never", &state, "").await)
                .with_list_timeout(Duration::from_millis(500)),
        );
        let config = RunConfig {
            mcp: vec![allow("odd", &["echo"])],
            on_tool_source_unavailable: ToolSourceUnavailable {
                attempts: 2,
                backoff_ms: 10,
                then: UnavailableAction::Pause,
            },
            ..RunConfig::default()
        };
        let agent = agent(&sources, vec![]);
        let run_id = Uuid::now_v7();
        let mut sink = Recorder::default();
        let err = agent
            .run(run_id, "go", config, &mut sink)
            .await
            .expect_err("the listing never ends");
        assert!(
            matches!(&err, AgentError::ToolSource { reason, .. } if reason == "MCP server odd: tools/list took more than 500 ms"),
            "{transport:?}: {err:?}"
        );
        let mut state_ = RunState::replay(run_id, &sink.events).unwrap();
        let status = agent.advance(&mut state_, None, &mut sink).await.unwrap();
        assert!(
            matches!(&status, Status::Parked(PullPoint::Paused { reason: PauseReason::ToolSource { server, reason } }) if server == "odd" && reason.contains("tools/list took more than")),
            "{transport:?}: {status:?}"
        );
        assert_eq!(
            attempts(&sink.events),
            [(1, Some(10), "odd".to_owned()), (2, None, "odd".to_owned())],
            "{transport:?}"
        );
        assert_eq!(
            lists(&state),
            2,
            "{transport:?}: one tools/list per attempt"
        );
        sources.shutdown().await;
        std::fs::remove_dir_all(&state).ok();
    }
}

/// A run allowing a tool the server does not list yet waits for it: once
/// the tool is added (the fixture's tools file; the server sends
/// `notifications/tools/list_changed`), the step starts with it and the
/// model's call of it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_allowing_a_tool_not_listed_yet_runs_once_it_appears() {
    for transport in TRANSPORTS {
        let state = state_dir();
        let sources = Arc::new(
            start(&odd(transport, "normal", &state, "").await)
                .with_tool_wait(Duration::from_secs(60)),
        );
        let config = RunConfig {
            mcp: vec![allow("odd", &["echo", "fresh"])],
            ..RunConfig::default()
        };
        let agent = agent(
            &sources,
            vec![
                ScriptedTurn::call("fresh", serde_json::json!({})),
                ScriptedTurn::text("done"),
            ],
        );
        let run = tokio::spawn(async move {
            let mut sink = Recorder::default();
            let result = agent.run(Uuid::now_v7(), "go", config, &mut sink).await;
            (result, sink.events)
        });
        // Once the server has been asked for its list at least once, add
        // the tool (added earlier, it would simply be listed at once).
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while lists(&state) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "{transport:?}: never listed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        std::fs::write(state.join("tools"), "fresh\n").unwrap();
        let (result, events) = tokio::time::timeout(Duration::from_secs(120), run)
            .await
            .expect("the run ends within the bound")
            .unwrap();
        let (_, status) = result.unwrap_or_else(|e| panic!("{transport:?}: {e}"));
        assert!(
            matches!(&status, Status::Done(Outcome::Succeeded { answer, .. }) if answer == "done"),
            "{transport:?}: {status:?}"
        );
        let result = events.iter().find_map(|e| match &e.kind {
            EventKind::ToolResult { content, .. } => Some(content.to_string()),
            _ => None,
        });
        assert_eq!(result.as_deref(), Some("called as fresh"), "{transport:?}");
        assert!(
            odd_mcp::requests(&state)
                .iter()
                .any(|l| l.starts_with("call fresh ")),
            "{transport:?}: the server ran it"
        );
        sources.shutdown().await;
        std::fs::remove_dir_all(&state).ok();
    }
}

/// A sink that runs `on_record` on each event and, once a step has ended,
/// says an operator pause is flagged (the loop then stops between steps,
/// as a worker letting the run go).
struct Hooked {
    events: Vec<Event>,
    on_record: Box<dyn Fn(&Event) + Send + Sync>,
    stop_between_steps: bool,
}

#[glia_agent::async_trait]
impl EventSink for Hooked {
    async fn record(&mut self, event: &Event) -> Result<(), SinkError> {
        (self.on_record)(event);
        self.events.push(event.clone());
        Ok(())
    }
    fn pause_flagged(&self) -> bool {
        self.stop_between_steps
            && self
                .events
                .iter()
                .any(|e| matches!(e.kind, EventKind::StepEnd { .. }))
    }
}

/// A tool removed while its step runs: the model's call of it is an
/// `unavailable` tool error saying it was removed. The run then continues
/// on "another worker" (other tool sources, whose catalogue trusts the
/// server): its next step lists afresh and records `tools.changed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_tool_is_an_honest_error_and_the_next_worker_records_the_difference() {
    for transport in TRANSPORTS {
        let state = state_dir();
        std::fs::write(state.join("tools"), "fresh\n").unwrap();
        let first = Arc::new(start(&odd(transport, "normal", &state, "").await));
        let second = Arc::new(start(
            &odd(transport, "normal", &state, "trust = \"trusted\"").await,
        ));
        let config = RunConfig {
            planner: glia_proto::PlannerKind::Model,
            mcp: vec![allow("odd", &["echo", "fresh"])],
            ..RunConfig::default()
        };
        let plan = |steps: &[&str]| {
            ScriptedTurn::call("submit_plan", serde_json::json!({ "steps": steps }))
        };
        let tools_file = state.join("tools");
        let mut sink = Hooked {
            events: Vec::new(),
            on_record: Box::new(move |e| {
                if matches!(e.kind, EventKind::StepStart { .. }) {
                    std::fs::write(&tools_file, "").unwrap();
                }
            }),
            stop_between_steps: true,
        };
        let run_id = Uuid::now_v7();
        let err = agent(
            &first,
            vec![
                plan(&["one", "two"]),
                ScriptedTurn::call("fresh", serde_json::json!({})),
                ScriptedTurn::text("one done"),
            ],
        )
        .run(run_id, "go", config, &mut sink)
        .await
        .expect_err("stops between steps");
        assert!(matches!(err, AgentError::PauseFlagged), "{err:?}");
        let failure = sink.events.iter().find_map(|e| match &e.kind {
            EventKind::ToolError { error, message, .. } => Some((*error, message.clone())),
            _ => None,
        });
        let Some((kind, message)) = failure else {
            panic!("{transport:?}: the removed tool's call is a tool error");
        };
        assert_eq!(kind, ToolErrorKind::Unavailable, "{transport:?}: {message}");
        assert!(
            message.starts_with("MCP server odd no longer offers the tool fresh: it was removed after this step's tools were listed"),
            "{transport:?}: {message}"
        );
        // The tool is back; the run goes on elsewhere.
        std::fs::write(state.join("tools"), "fresh\n").unwrap();
        let mut state_ = RunState::replay(run_id, &sink.events).unwrap();
        sink.stop_between_steps = false;
        sink.on_record = Box::new(|_| {});
        let status = agent(
            &second,
            vec![plan(&["two"]), ScriptedTurn::text("two done"), plan(&[])],
        )
        .advance(&mut state_, None, &mut sink)
        .await
        .unwrap();
        assert!(
            matches!(&status, Status::Done(Outcome::Succeeded { .. })),
            "{transport:?}: {status:?}"
        );
        let changes: Vec<(Vec<String>, Vec<String>, Vec<String>)> = sink
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::ToolsChanged {
                    added,
                    removed,
                    changed,
                } => Some((added.clone(), removed.clone(), changed.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(
            changes,
            [(vec![], vec![], vec!["echo".to_owned(), "fresh".to_owned()])],
            "{transport:?}: the trusted server's tools resolve another policy"
        );
        assert_eq!(RunState::replay(run_id, &sink.events).unwrap(), state_);
        first.shutdown().await;
        second.shutdown().await;
        std::fs::remove_dir_all(&state).ok();
    }
}

/// server-everything registers `simulate-research-query` after
/// `initialize` and announces it with `notifications/tools/list_changed`:
/// the list generation moves past the connection's (stdio), and a run
/// allowing the tool is offered it (listed at once, or waited for), over
/// stdio and streamable HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_announces_a_tool_added_after_initialize() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../.ci/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let Some(everything) = glia_testkit::require(
        path.exists().then(|| path.display().to_string()),
        format!("the MCP server {}", path.display()),
        "npm ci --prefix .ci/mcp; scripts/test does",
    ) else {
        return;
    };
    for transport in TRANSPORTS {
        let mut child = None;
        let toml = match transport {
            Transport::Stdio => format!(
                "[mcp_servers.everything]\ntransport = \"stdio\"\ncommand = \"node\"\nargs = [{everything:?}, \"stdio\"]\n"
            ),
            Transport::Http => {
                let port = std::net::TcpListener::bind("127.0.0.1:0")
                    .unwrap()
                    .local_addr()
                    .unwrap()
                    .port();
                child = Some(
                    tokio::process::Command::new("node")
                        .args([everything.as_str(), "streamableHttp"])
                        .env("PORT", port.to_string())
                        .stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null())
                        .kill_on_drop(true)
                        .spawn()
                        .expect("node"),
                );
                format!(
                    "[mcp_servers.everything]\ntransport = \"streamable_http\"\nurl = \"http://127.0.0.1:{port}/mcp\"\n"
                )
            }
        };
        let sources = start(&toml).with_tool_wait(Duration::from_secs(60));
        let config = RunConfig {
            mcp: vec![allow("everything", &["echo", "simulate-research-query"])],
            ..RunConfig::default()
        };
        let specs = sources
            .offered(&config)
            .await
            .unwrap_or_else(|e| panic!("{transport:?}: {e}"));
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["echo", "simulate-research-query"], "{transport:?}");
        // One bump for the connection, one for the announcement. (Over
        // streamable HTTP this announcement is not seen here: the server
        // sends it while handling `notifications/initialized`, likely
        // before the client has opened the session's GET stream. odd-mcp's
        // later announcements do arrive over HTTP, see above.)
        if let Transport::Stdio = transport {
            assert!(
                sources
                    .mcp()
                    .list_changed("everything", 1, Duration::from_secs(60))
                    .await,
                "{transport:?}: the list_changed notification arrived"
            );
        }
        sources.shutdown().await;
        drop(child);
    }
}
