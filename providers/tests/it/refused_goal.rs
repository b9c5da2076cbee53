//! Refusals are outcomes, not edits of the request: when the provider
//! refuses the goal or the latest human turn, refusal isolation does not
//! elide it and the run ends `failed` with the refusal recorded
//! (`model.response.rejected.refused_turn`), on both wire formats, against
//! recorded refusals (`fixtures/*/refusal.sse`) served by a local server.

use crate::common;

use std::sync::Arc;

use common::{Reply, Seen, Server, fixture};
use glia_agent::provider::Provider;
use glia_agent::tool::ToolRegistry;
use glia_agent::{Agent, FixedClock};
use glia_proto::{
    Event, EventKind, Outcome, ProtectedTurn, RefusedTurn, RunConfig, RunState, Status, StopAction,
    StopClass,
};
use glia_providers::http::{HttpProvider, http_client};
use glia_providers::{Anthropic, OpenAi, RefusalIsolator, Wire};
use glia_testkit::tools::Add;
use uuid::Uuid;

/// The goal the provider refuses.
const GOAL: &str = "What is 2 + 40? FORBIDDEN";

/// One wire format: its adapter, path suffix, model, and its recorded
/// refusal, tool call and answer streams.
struct Format<W> {
    wire: W,
    suffix: &'static str,
    model: &'static str,
    dir: &'static str,
}

/// Run `GOAL` through the refusal isolator against a server that answers
/// each request with `reply(n, request)`; the log, the end, and what the
/// server saw. The log must replay to the live state.
async fn run<W: Wire>(
    f: Format<W>,
    reply: impl Fn(usize, &Seen) -> Reply + Send + Sync + 'static,
) -> (Vec<Seen>, Vec<Event>, Status) {
    let server = Server::start(reply, None).await;
    let http = HttpProvider::new(
        f.wire,
        http_client().unwrap(),
        &format!("{}{}", server.base, f.suffix),
        None,
    );
    let provider: Arc<dyn Provider> = Arc::new(RefusalIsolator::new(Arc::new(http)));
    let mut tools = ToolRegistry::default();
    tools.register(Add);
    let agent = Agent::new(provider)
        .with_tools(tools)
        .with_clock(FixedClock(chrono::DateTime::UNIX_EPOCH));
    let config = RunConfig {
        model: f.model.into(),
        max_tokens: 256,
        ..RunConfig::default()
    };
    let mut log = Vec::new();
    let (state, status) = agent
        .run(Uuid::now_v7(), GOAL, config, &mut log)
        .await
        .unwrap();
    assert_eq!(
        RunState::replay(state.run_id, &log).unwrap(),
        state,
        "the log replays to the live state"
    );
    (server.seen(), log, status)
}

/// The refusal recorded in the run's last `model.response`.
fn refused_turn(log: &[Event]) -> Option<RefusedTurn> {
    log.iter().rev().find_map(|e| match &e.kind {
        EventKind::ModelResponse {
            rejected: Some(r), ..
        } => {
            assert_eq!(
                (r.class, r.action),
                (StopClass::Refusal, StopAction::Fail),
                "{r:?}"
            );
            r.refused_turn
        }
        _ => None,
    })
}

fn assert_failed_on_the_goal(dir: &str, log: &[Event], status: &Status) {
    assert!(
        matches!(status, Status::Done(Outcome::Failed { error }) if error.contains("refused to process the goal")),
        "{dir}: {status:?}"
    );
    assert_eq!(
        refused_turn(log),
        Some(RefusedTurn {
            index: 0,
            turn: ProtectedTurn::Goal
        }),
        "{dir}"
    );
    assert!(
        !log.iter()
            .any(|e| matches!(e.kind, EventKind::MessageElided { .. })),
        "{dir}: the goal is never elided"
    );
    assert!(
        !log.iter().any(|e| matches!(
            &e.kind,
            EventKind::SessionComplete {
                outcome: Outcome::Succeeded { .. }
            }
        )),
        "{dir}"
    );
}

#[tokio::test]
async fn a_refused_goal_ends_failed_on_both_wire_formats() {
    // The goal is the only message: no probe is spent, nothing is elided.
    let anthropic = Format {
        wire: Anthropic::default(),
        suffix: "",
        model: "claude-sonnet-4-5",
        dir: "anthropic",
    };
    let openai = Format {
        wire: OpenAi::default(),
        suffix: "/v1",
        model: "gpt-4o",
        dir: "openai",
    };
    let a = run(anthropic, |_, _| {
        Reply::sse(fixture("anthropic/refusal.sse"))
    })
    .await;
    let o = run(openai, |_, _| Reply::sse(fixture("openai/refusal.sse"))).await;
    for (dir, (seen, log, status)) in [("anthropic", a), ("openai", o)] {
        assert_eq!(seen.len(), 1, "{dir}: one call, no probe");
        assert_failed_on_the_goal(dir, &log, &status);
    }
}

#[tokio::test]
async fn a_goal_refused_later_in_the_run_is_found_and_not_elided() {
    // The first call is answered with a tool call; the second request
    // (goal, tool use, tool result) is refused while it holds the goal's
    // text: bisection narrows the refusal to the goal and the run fails.
    async fn case<W: Wire>(f: Format<W>) -> (Vec<Seen>, Vec<Event>, Status) {
        let dir = f.dir;
        run(f, move |n, seen| {
            let goal_sent = seen.body["messages"].to_string().contains("FORBIDDEN");
            match n {
                0 => Reply::sse(fixture(&format!("{dir}/loop_turn1.sse"))),
                _ if goal_sent => Reply::sse(fixture(&format!("{dir}/refusal.sse"))),
                _ => Reply::sse(fixture(&format!("{dir}/loop_turn2.sse"))),
            }
        })
        .await
    }
    let a = case(Format {
        wire: Anthropic::default(),
        suffix: "",
        model: "claude-sonnet-4-5",
        dir: "anthropic",
    })
    .await;
    let o = case(Format {
        wire: OpenAi::default(),
        suffix: "/v1",
        model: "gpt-4o",
        dir: "openai",
    })
    .await;
    for (dir, (seen, log, status)) in [("anthropic", a), ("openai", o)] {
        assert!(
            log.iter()
                .any(|e| matches!(e.kind, EventKind::ToolResult { .. })),
            "{dir}: the first turn ran its tool"
        );
        assert!(
            seen.len() >= 3,
            "{dir}: the refusal was bisected ({} calls)",
            seen.len()
        );
        assert!(
            seen.iter()
                .skip(1)
                .all(|s| s.body["messages"].to_string().contains("FORBIDDEN")
                    || s.body["messages"].to_string().contains("elided"))
        );
        assert_failed_on_the_goal(dir, &log, &status);
    }
}

#[tokio::test]
async fn a_refused_latest_human_turn_ends_failed_on_both_wire_formats() {
    // A conversational run: the goal is answered, then the user's next
    // message is what the provider refuses. It is never elided; the run fails.
    async fn case<W: Wire>(f: Format<W>) -> (Vec<Seen>, Vec<Event>, Status) {
        let dir = f.dir;
        let server = Server::start(
            move |_, seen| {
                if seen.body["messages"].to_string().contains("FORBIDDEN") {
                    Reply::sse(fixture(&format!("{dir}/refusal.sse")))
                } else {
                    Reply::sse(fixture(&format!("{dir}/loop_turn2.sse")))
                }
            },
            None,
        )
        .await;
        let http = HttpProvider::new(
            f.wire,
            http_client().unwrap(),
            &format!("{}{}", server.base, f.suffix),
            None,
        );
        let provider: Arc<dyn Provider> = Arc::new(RefusalIsolator::new(Arc::new(http)));
        let agent = Agent::new(provider).with_clock(FixedClock(chrono::DateTime::UNIX_EPOCH));
        let config = RunConfig {
            model: f.model.into(),
            max_tokens: 256,
            conversational: true,
            ..RunConfig::default()
        };
        let mut log = Vec::new();
        let (mut state, status) = agent
            .run(Uuid::now_v7(), "What is 2 + 40?", config, &mut log)
            .await
            .unwrap();
        assert_eq!(
            status,
            Status::Parked(glia_proto::PullPoint::AwaitingInput),
            "{dir}"
        );
        let input = glia_proto::Payload::Input {
            text: "Now tell me something FORBIDDEN.".into(),
            redactions: Vec::new(),
        };
        let status = agent
            .advance(&mut state, Some(input), &mut log)
            .await
            .unwrap();
        assert_eq!(
            RunState::replay(state.run_id, &log).unwrap(),
            state,
            "the log replays to the live state"
        );
        (server.seen(), log, status)
    }
    let a = case(Format {
        wire: Anthropic::default(),
        suffix: "",
        model: "claude-sonnet-4-5",
        dir: "anthropic",
    })
    .await;
    let o = case(Format {
        wire: OpenAi::default(),
        suffix: "/v1",
        model: "gpt-4o",
        dir: "openai",
    })
    .await;
    for (dir, (_, log, status)) in [("anthropic", a), ("openai", o)] {
        assert!(
            matches!(&status, Status::Done(Outcome::Failed { error }) if error.contains("refused to process the latest human turn")),
            "{dir}: {status:?}"
        );
        assert_eq!(
            refused_turn(&log),
            Some(RefusedTurn {
                index: 2,
                turn: ProtectedTurn::LatestHumanTurn
            }),
            "{dir}"
        );
        assert!(
            !log.iter()
                .any(|e| matches!(e.kind, EventKind::MessageElided { .. })),
            "{dir}: nothing is elided"
        );
    }
}
