//! A run whose MCP server cannot list its tools, through a worker over the
//! in-memory ports: every attempt is a recorded `tool_source.unavailable`,
//! the worker retries with the run's backoff, and past the run's bound the
//! run pauses or fails naming the server. No run stays at its first event.

use std::sync::Arc;
use std::time::Duration;

use glia_agent::Agent;
use glia_agent::catalogue::Catalogue;
use glia_agent::provider::{ScriptedProvider, ScriptedTurn};
use glia_agent::tool_sources::ToolSources;
use glia_backends::memory::{MemoryLedger, MemoryLog, MemoryQueue};
use glia_backends::{JobQueue, NewRun, Outbox, RunLog};
use glia_proto::tool_sources::{ToolSourceUnavailable, UnavailableAction};
use glia_proto::{
    Event, EventKind, McpToolSource, Outcome, PauseReason, PullPoint, RunConfig, RunState,
};
use glia_worker::consumer::{Worker, WorkerOptions};
use tokio::sync::watch;
use uuid::Uuid;

/// A catalogue server whose command does not exist: it never connects.
const BROKEN: &str =
    "[mcp_servers.broken]\ntransport = \"stdio\"\ncommand = \"/nonexistent/mcp-server\"\n";

fn config(then: UnavailableAction) -> RunConfig {
    RunConfig {
        mcp: vec![McpToolSource {
            server: "broken".into(),
            allow: vec!["x".into()],
        }],
        on_tool_source_unavailable: ToolSourceUnavailable {
            attempts: 3,
            backoff_ms: 10,
            then,
        },
        ..RunConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_run_stays_at_its_first_event_when_its_server_cannot_list_tools() {
    let log = Arc::new(MemoryLog::default());
    let queue = Arc::new(MemoryQueue::default());
    let ledger = Arc::new(MemoryLedger::default());
    let (stop, rx) = watch::channel(false);
    let catalogue = Catalogue::parse(BROKEN, "<test>").expect("valid catalogue");
    // The server never comes up: how long a listing waits for it changes
    // how long the test takes, not what it asserts.
    let sources =
        Arc::new(ToolSources::start(catalogue).with_connect_wait(Duration::from_millis(100)));
    let provider = Arc::new(ScriptedProvider::new(vec![ScriptedTurn::text("never")]));
    let agent = Arc::new(Agent::new(provider).with_tool_sources(sources.clone()));
    let (l, q, mut r) = (log.clone(), queue.clone(), rx.clone());
    tokio::spawn(async move {
        while !*r.borrow_and_update() {
            for (id, job) in l.outbox(100).await.unwrap() {
                q.publish(&job).await.unwrap();
                l.outbox_done(&[id]).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let worker = Arc::new(Worker::new(
        agent,
        log.clone(),
        queue.clone(),
        ledger,
        WorkerOptions {
            id: "w".into(),
            concurrency: 4,
            lease_ttl: Duration::from_secs(30),
        },
    ));
    tokio::spawn(worker.run(rx.clone()));

    let mut runs = Vec::new();
    for then in [
        UnavailableAction::Pause,
        UnavailableAction::Pause,
        UnavailableAction::Fail,
    ] {
        let run_id = Uuid::now_v7();
        let start = Event {
            run_id,
            seq: 1,
            at: chrono::Utc::now(),
            kind: EventKind::SessionStart {
                redactions: Vec::new(),
                goal: "use the tool".into(),
                config: config(then),
            },
        };
        log.create_run(NewRun {
            tenant: "t".into(),
            idempotency_key: None,
            batch_id: None,
            start,
            tags: Vec::new(),
            metadata: Default::default(),
            custom_id: None,
            parent_run_id: None,
            parent_call_id: None,
            depth: 0,
        })
        .await
        .unwrap();
        runs.push((run_id, then));
    }

    // Within a generous bound every run leaves runnable: paused or failed.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for (run_id, then) in &runs {
        let state: RunState = loop {
            let state = log.load(*run_id).await.unwrap();
            if state.status() != glia_proto::Status::Runnable {
                break state;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "run {run_id} still runnable after 60 s: {} events",
                state.head_seq
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let events = log.events(*run_id, 0, 1000).await.unwrap();
        assert!(events.len() > 1, "the run is past its first event");
        RunState::replay(*run_id, &events).expect("the log replays");
        let attempts: Vec<(u32, Option<u64>, &str, &str)> = events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::ToolSourceUnavailable {
                    server,
                    reason,
                    attempt,
                    retry_in_ms,
                } => Some((*attempt, *retry_in_ms, server.as_str(), reason.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(
            attempts
                .iter()
                .map(|(a, retry, server, _)| (*a, *retry, *server))
                .collect::<Vec<_>>(),
            [
                (1, Some(10), "broken"),
                (2, Some(20), "broken"),
                (3, None, "broken")
            ],
            "three recorded attempts with the run's backoff, the last without a retry"
        );
        for (.., reason) in &attempts {
            assert!(
                reason.contains("MCP server broken is not available")
                    && reason.contains("could not start"),
                "the reason names the server and the cause: {reason}"
            );
        }
        assert!(
            !events
                .iter()
                .any(|e| matches!(e.kind, EventKind::StepStart { .. })),
            "no step started without its tools"
        );
        match then {
            UnavailableAction::Pause => match &state.parked {
                Some(PullPoint::Paused {
                    reason: PauseReason::ToolSource { server, reason },
                }) => {
                    assert_eq!(server, "broken");
                    assert!(reason.contains("could not start"), "{reason}");
                }
                other => panic!("expected a tool-source pause, got {other:?}"),
            },
            UnavailableAction::Fail => match &state.outcome {
                Some(Outcome::Failed { error }) => assert!(
                    error.contains("the run's tools cannot be listed (3 attempts)")
                        && error.contains("MCP server broken"),
                    "{error}"
                ),
                other => panic!("expected a failed run, got {other:?}"),
            },
        }
    }
    let _ = stop.send(true);
    sources.shutdown().await;
}
