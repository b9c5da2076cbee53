//! Provider-safe tool names against the project's misbehaving MCP server
//! (`odd-mcp`, [`glia_testkit::odd_mcp`]), over real stdio and streamable
//! HTTP: tools named `calendar.read`, `drive/search`, `überprüfen`, a
//! 70-character name and the pair `a.b`/`a_b` are allowed by their own
//! names, offered to the model under names the provider grammar takes
//! (the [`ScriptedProvider`] panics on any request a real API would
//! refuse), called by the model under those names, and received by the
//! server under their own (it logs and answers the name it was called by).
//! Policies name either form.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use glia_agent::agent::{Agent, EventSink, SinkError};
use glia_agent::catalogue::Catalogue;
use glia_agent::provider::{ScriptedProvider, ScriptedTurn};
use glia_agent::tool_sources::{OfferError, ToolSources};
use glia_proto::tool_names::{is_provider_tool_name, provider_tool_name};
use glia_proto::{
    Decision, Event, EventKind, McpToolSource, Outcome, Payload, Policy, PolicyAction,
    PolicyOrigin, PullPoint, RunConfig, RunState, Status, ToolPolicy, ToolSource, ToolSpec,
};
use glia_testkit::odd_mcp::{LONG_NAME, ListMode, ODD_NAMES, odd_mcp_bin, requests, spawn_http};
use serde_json::json;
use uuid::Uuid;

#[derive(Default)]
struct Log(Vec<Event>);

#[glia_agent::async_trait]
impl EventSink for Log {
    async fn record(&mut self, event: &Event) -> Result<(), SinkError> {
        self.0.push(event.clone());
        Ok(())
    }
}

/// A catalogue with the odd server over stdio as `odd`, plus `extra` lines
/// of its table.
fn stdio_catalogue(state: &Path, extra: &str) -> Catalogue {
    let toml = format!(
        "[mcp_servers.odd]\ntransport = \"stdio\"\ncommand = {:?}\nargs = [\"stdio\", {:?}]\n{extra}",
        odd_mcp_bin().display().to_string(),
        state.display().to_string(),
    );
    Catalogue::parse(&toml, "<test>").expect("valid catalogue")
}

fn sources(catalogue: Catalogue) -> Arc<ToolSources> {
    Arc::new(ToolSources::start(catalogue).with_connect_wait(Duration::from_secs(60)))
}

fn odd_config(allow: &[&str]) -> RunConfig {
    RunConfig {
        tools: Some(Vec::new()),
        mcp: vec![McpToolSource {
            server: "odd".into(),
            allow: allow.iter().map(|s| (*s).to_owned()).collect(),
        }],
        ..RunConfig::default()
    }
}

fn step_tools(events: &[Event]) -> Vec<ToolSpec> {
    events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::StepStart { tools, .. } => Some(tools.clone()),
            _ => None,
        })
        .expect("step.start")
}

/// The server's own name of an offered MCP tool.
fn original(spec: &ToolSpec) -> &str {
    match &spec.source {
        Some(ToolSource::Mcp { tool, .. }) => tool,
        other => panic!("{} has no MCP source: {other:?}", spec.name),
    }
}

/// The tools the server was called with, from its own log.
fn calls_seen(state: &Path) -> Vec<String> {
    requests(state)
        .iter()
        .filter_map(|l| l.strip_prefix("call "))
        .map(|l| l.rsplit_once(' ').map_or(l, |(name, _key)| name).to_owned())
        .collect()
}

/// Every odd name is allowed by its own name; the model is offered the
/// provider-safe forms (the scripted provider validates each request as a
/// real API would), calls them, and the server is called by its own names.
/// `a.b` and `a_b` stay two tools. The snapshot records both names, and
/// replay gives the same state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_names_are_offered_provider_safe_and_called_by_their_own() {
    let dir = glia_testkit::TempDir::new();
    let state = dir.path().to_owned();
    let sources = sources(stdio_catalogue(&state, ""));
    let config = odd_config(&ODD_NAMES);
    let mapped: Vec<String> = ODD_NAMES
        .iter()
        .map(|n| provider_tool_name(n).into_owned())
        .collect();
    let calls: Vec<(&str, serde_json::Value)> =
        mapped.iter().map(|n| (n.as_str(), json!({}))).collect();
    let provider = Arc::new(ScriptedProvider::new(vec![
        ScriptedTurn::calls(&calls),
        ScriptedTurn::text("done"),
    ]));
    let agent = Agent::new(provider.clone()).with_tool_sources(sources.clone());
    let mut log = Log::default();
    let (_, status) = agent
        .run(Uuid::now_v7(), "use every tool", config, &mut log)
        .await
        .expect("run");
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { ref answer, .. }) if answer == "done"),
        "{status:?}"
    );

    // The snapshot: provider-safe names, each with the server's own name.
    let tools = step_tools(&log.0);
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, mapped, "allow-list order, mapped names");
    let originals: Vec<&str> = tools.iter().map(original).collect();
    assert_eq!(originals, ODD_NAMES);
    assert!(names.iter().all(|n| is_provider_tool_name(n)), "{names:?}");
    assert_eq!(names[5], "a_b", "a valid name is kept");
    assert_ne!(names[4], names[5], "a.b and a_b stay two tools");
    assert!(names[3].len() <= 64 && LONG_NAME.len() > 64);
    // What the model was sent: exactly these names.
    let first = &provider.requests()[0];
    let sent: Vec<&str> = first.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(sent, names);
    for request in provider.requests() {
        glia_proto::validate_request(&request).expect("a request a real API takes");
    }

    // The server was called by its own names, and answered with them.
    // (The calls of one turn run at once: the server sees them in any order.)
    let mut seen = calls_seen(&state);
    seen.sort();
    let mut want = ODD_NAMES.map(str::to_owned);
    want.sort();
    assert_eq!(seen, want);
    // Each call's result is the server's answer to the tool's own name.
    let called_as: BTreeMap<&str, &str> = log
        .0
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCall(c) => Some((c.call_id.as_str(), c.name.as_str())),
            _ => None,
        })
        .collect();
    let mut answered = 0;
    for e in &log.0 {
        match &e.kind {
            EventKind::ToolResult {
                call_id, content, ..
            } => {
                let name = called_as[call_id.as_str()];
                let spec = tools.iter().find(|t| t.name == name).expect("offered");
                assert_eq!(content.to_string(), format!("called as {}", original(spec)));
                answered += 1;
            }
            EventKind::ToolError { message, .. } => panic!("tool error: {message}"),
            _ => {}
        }
    }
    assert_eq!(answered, ODD_NAMES.len());
    // The calls carry the name the model used.
    let called: Vec<&str> = log
        .0
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCall(c) => Some(c.name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(called, names);

    let replayed = RunState::replay(log.0[0].run_id, &log.0).expect("replay");
    assert_eq!(replayed.status(), status);
    sources.shutdown().await;
}

/// `tool_policy` keyed by a tool's own name and by its provider-safe form,
/// `policies` naming one by its own name, and the operator's `policy` keyed
/// by a tool's own name all apply: those calls wait for approval (and the
/// server sees none of them), the others run; after the approvals the
/// server is called by the own names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_naming_either_form_apply() {
    let dir = glia_testkit::TempDir::new();
    let state = dir.path().to_owned();
    let catalogue = stdio_catalogue(
        &state,
        &format!("policy = {{ {LONG_NAME:?} = \"require_approval\" }}\n"),
    );
    let sources = sources(catalogue);
    let mut config = odd_config(&[
        "calendar.read",
        "drive/search",
        "überprüfen",
        LONG_NAME,
        "a.b",
    ]);
    let approval = ToolPolicy {
        requires_approval: Some(true),
        ..ToolPolicy::default()
    };
    config.tool_policy = BTreeMap::from([
        ("calendar.read".to_owned(), approval.clone()),
        (provider_tool_name("drive/search").into_owned(), approval),
    ]);
    config.policies.push(Policy {
        tool: "überprüfen".into(),
        args: None,
        action: PolicyAction::RequireApproval,
    });
    config
        .validate()
        .expect("admitted: original names in tool_policy and policies");
    sources
        .admit(&config)
        .expect("the catalogue admits the original names");

    let gated = ["calendar.read", "drive/search", "überprüfen", LONG_NAME];
    let mapped = |n: &str| provider_tool_name(n).into_owned();
    let calls: Vec<(String, serde_json::Value)> = gated
        .iter()
        .chain(&["a.b"])
        .map(|n| (mapped(n), json!({})))
        .collect();
    let calls: Vec<(&str, serde_json::Value)> =
        calls.iter().map(|(n, i)| (n.as_str(), i.clone())).collect();
    let agent = Agent::new(Arc::new(ScriptedProvider::new(vec![
        ScriptedTurn::calls(&calls),
        ScriptedTurn::text("done"),
    ])))
    .with_tool_sources(sources.clone());
    let mut log = Log::default();
    let (mut run, status) = agent
        .run(Uuid::now_v7(), "gated", config, &mut log)
        .await
        .expect("run");
    assert!(
        matches!(status, Status::Parked(PullPoint::AwaitingApproval { .. })),
        "{status:?}"
    );
    // The resolved policies recorded in the snapshot, and who decided.
    let tools = step_tools(&log.0);
    let by = |n: &str| {
        let spec = tools.iter().find(|t| original(t) == n).expect(n);
        let p = spec.policy.as_ref().expect("resolved policy");
        (p.requires_approval, p.approval_by)
    };
    assert_eq!(by("calendar.read"), (true, PolicyOrigin::Run));
    assert_eq!(by("drive/search"), (true, PolicyOrigin::Run));
    assert_eq!(by("überprüfen"), (true, PolicyOrigin::Run));
    assert_eq!(by(LONG_NAME), (true, PolicyOrigin::Operator));
    assert_eq!(by("a.b"), (false, PolicyOrigin::Default));
    // Approvals asked for the four gated calls, under the names the model used.
    let asked: Vec<(String, String, String)> = log
        .0
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ApprovalRequested {
                call_id,
                tool,
                args_hash,
                ..
            } => Some((call_id.clone(), tool.clone(), args_hash.clone())),
            _ => None,
        })
        .collect();
    let asked_tools: Vec<&str> = asked.iter().map(|(_, t, _)| t.as_str()).collect();
    let gated_mapped: Vec<String> = gated.iter().map(|n| mapped(n)).collect();
    assert_eq!(asked_tools, gated_mapped);
    assert_eq!(calls_seen(&state), ["a.b"], "gated calls wait");

    let mut status = status;
    for (call_id, _, args_hash) in asked {
        status = agent
            .advance(
                &mut run,
                Some(Payload::Approval {
                    call_id,
                    args_hash,
                    decision: Decision::Approve,
                    by: None,
                    request_seq: None,
                }),
                &mut log,
            )
            .await
            .expect("approved");
    }
    assert!(
        matches!(status, Status::Done(Outcome::Succeeded { .. })),
        "{status:?}"
    );
    let mut seen = calls_seen(&state);
    seen.sort();
    let mut want: Vec<String> = gated
        .iter()
        .chain(&["a.b"])
        .map(|s| (*s).to_owned())
        .collect();
    want.sort();
    assert_eq!(seen, want, "the server is called by its own names");
    sources.shutdown().await;
}

/// Over streamable HTTP: the same names, and the operator's lists name
/// either form: `tools_deny` written in the provider-safe form denies the
/// tool a run allows by its own name, at admission and at the step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_and_the_operators_lists_name_either_form() {
    let dir = glia_testkit::TempDir::new();
    let state = dir.path().to_owned();
    let url = spawn_http(&state, ListMode::Normal).await;
    let deny = provider_tool_name("drive/search").into_owned();
    let toml = format!(
        "[mcp_servers.odd]\ntransport = \"streamable_http\"\nurl = {url:?}\ntools_deny = [{deny:?}]\n"
    );
    let sources = sources(Catalogue::parse(&toml, "<test>").expect("valid catalogue"));
    let config = odd_config(&["calendar.read", "drive/search"]);
    let e = sources
        .admit(&config)
        .expect_err("denied by its mapped name");
    assert_eq!(e.field, "mcp[0].allow[1]");
    assert!(e.reason.contains("tools_deny"), "{e}");
    match sources.offered(&config).await {
        Err(OfferError::Invalid(why)) => assert!(why.contains("tools_deny"), "{why}"),
        other => panic!("a denied tool is the run's error, got {other:?}"),
    }
    // The allowed ones: mapped names, own names in the source.
    let config = odd_config(&["calendar.read", "überprüfen", "a.b", "a_b"]);
    let specs = sources.offered(&config).await.expect("listed");
    for spec in &specs {
        assert!(is_provider_tool_name(&spec.name), "{}", spec.name);
        assert_eq!(spec.name, provider_tool_name(original(spec)));
    }
    let quiet = |_: String| {};
    let ctx = glia_agent::tool::ToolContext {
        run_id: Uuid::now_v7(),
        call_id: "c1".into(),
        idempotency_key: "k1".into(),
    };
    let out = sources
        .execute(&specs[1], json!({}), &ctx, &quiet)
        .await
        .expect("called");
    assert_eq!(out.to_text(), "called as überprüfen");
    sources.shutdown().await;
}

/// A server listing both `a.b` and a tool literally named by `a.b`'s
/// provider-safe form: an allow entry that could mean either is never
/// resolved by list order; the run's tools cannot be offered, naming both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allow_entry_two_listed_tools_could_mean_is_refused() {
    let dir = glia_testkit::TempDir::new();
    let state = dir.path().join("odd");
    std::fs::create_dir_all(&state).unwrap();
    let literal = provider_tool_name("a.b").into_owned();
    std::fs::write(state.join("tools"), format!("{literal}\n")).unwrap();
    let sources = sources(stdio_catalogue(&state, ""));
    for allow in ["a.b", literal.as_str()] {
        let e = sources.offered(&odd_config(&[allow])).await.unwrap_err();
        let OfferError::Invalid(reason) = e else {
            panic!("{allow}: {e:?}");
        };
        assert!(
            reason.contains("mcp[0].allow[0]")
                && reason.contains("\"a.b\"")
                && reason.contains(&format!("{literal:?}")),
            "{reason}"
        );
    }
    sources
        .offered(&odd_config(&["a_b"]))
        .await
        .expect("an unambiguous name is offered");
    sources.shutdown().await;
}
