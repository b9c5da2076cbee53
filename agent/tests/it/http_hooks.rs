//! HTTP hooks of the operator's catalogue against a real hook server (axum
//! on 127.0.0.1:0) through the real loop: allow, deny and changed
//! arguments (schema-checked); a hook that times out or answers garbage,
//! failing open and closed; a worker that dies after a hook answered goes
//! on from the recorded answer without calling it again; the signing secret
//! reaches no event; every request is signed (Standard Webhooks).

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use common::*;
use glia_agent::agent::{EventSink, SinkError};
use glia_agent::catalogue::Catalogue;
use glia_agent::http_hooks::HttpHooks;
use glia_agent::provider::ScriptedTurn;
use glia_proto::{
    Event, EventKind, HookEffect, HookOutcome, PauseReason, PullPoint, RunConfig, RunState, Status,
    ToolErrorKind,
};
use serde_json::{Value, json};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// What the hook server answers one request.
#[derive(Clone)]
enum Reply {
    Json(Value),
    Garbage,
    /// Never answers (the worker's timeout ends the call).
    Hang,
    /// Answers with this status and an allowing body.
    Status(u16),
    /// A 2xx whose body is over the 1 MiB the worker reads.
    Huge,
    /// A redirect to an allowing answer (which the worker must not follow).
    Redirect,
}

/// A hook server: every request's signature is checked against
/// [`SECRET`]; requests are kept (id, body).
struct HookServer {
    url: String,
    calls: Arc<Mutex<Vec<(String, Value)>>>,
    bad_signatures: Arc<AtomicUsize>,
}

async fn hook_server(answer: impl Fn(&Value) -> Reply + Send + Sync + 'static) -> HookServer {
    let calls: Arc<Mutex<Vec<(String, Value)>>> = Arc::default();
    let bad = Arc::new(AtomicUsize::new(0));
    let answer = Arc::new(answer);
    let (c, b) = (calls.clone(), bad.clone());
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let (calls, bad, answer) = (c.clone(), b.clone(), answer.clone());
            async move {
                let Some(id) = glia_testkit::signed::verified(SECRET, &headers, &body) else {
                    bad.fetch_add(1, Ordering::SeqCst);
                    return StatusCode::UNAUTHORIZED.into_response();
                };
                let body: Value = serde_json::from_slice(&body).unwrap();
                calls.lock().unwrap().push((id, body.clone()));
                match answer(&body) {
                    Reply::Json(v) => axum::Json(v).into_response(),
                    Reply::Garbage => (StatusCode::OK, "<html>not a verdict").into_response(),
                    Reply::Hang => {
                        std::future::pending::<()>().await;
                        unreachable!()
                    }
                    Reply::Status(code) => (
                        StatusCode::from_u16(code).unwrap(),
                        axum::Json(json!({"verdict": "allow"})),
                    )
                        .into_response(),
                    Reply::Huge => {
                        let pad = "x".repeat(glia_agent::http_hooks::MAX_ANSWER_BYTES);
                        axum::Json(json!({"verdict": "allow", "reason": pad})).into_response()
                    }
                    Reply::Redirect => {
                        (StatusCode::TEMPORARY_REDIRECT, [("location", "/hook")]).into_response()
                    }
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    HookServer {
        url,
        calls,
        bad_signatures: bad,
    }
}

/// The catalogue's hooks from TOML `hooks` (each `url = "URL"` replaced by
/// the server's), their secret in variable `var`, read through an injected
/// lookup (no process variable is set: other tests run on other threads).
fn http_hooks(var: &str, toml: &str, url: &str) -> HttpHooks {
    let catalogue = Catalogue::parse(&toml.replace("URL", url).replace("VAR", var), "<test>")
        .expect("the catalogue parses");
    let var = var.to_owned();
    HttpHooks::from_catalogue_with(&catalogue, &move |v| (v == var).then(|| SECRET.to_owned()))
        .expect("the secret is set")
}

/// Every run's tenant is the one given.
struct OneTenant(&'static str);

#[async_trait::async_trait]
impl glia_agent::http_hooks::RunTenants for OneTenant {
    async fn tenant(&self, _run_id: uuid::Uuid) -> Result<String, String> {
        Ok(self.0.to_owned())
    }
}

fn tool_calls(log: &[Event]) -> Vec<&glia_proto::ToolCallRecord> {
    log.iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCall(c) => Some(c),
            _ => None,
        })
        .collect()
}

/// The result text (and whether it is an error) of call `call_id`.
fn outcome_of(log: &[Event], call_id: &str) -> (String, Option<ToolErrorKind>) {
    log.iter()
        .find_map(|e| match &e.kind {
            EventKind::ToolResult {
                call_id: c,
                content,
                ..
            } if c == call_id => Some((content.to_text().into_owned(), None)),
            EventKind::ToolError {
                call_id: c,
                error,
                message,
                ..
            } if c == call_id => Some((message.clone(), Some(*error))),
            _ => None,
        })
        .expect("the call has an outcome")
}

fn hook_calls(log: &[Event]) -> Vec<(&str, &HookEffect, HookOutcome)> {
    log.iter()
        .filter_map(|e| match &e.kind {
            EventKind::HookApplied {
                hook,
                effect,
                call: Some(call),
                ..
            } => Some((hook.as_str(), effect, call.outcome)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn allow_deny_and_changed_arguments_through_the_loop() {
    let server = hook_server(|body| {
        let input = &body["payload"]["input"];
        match input["a"].as_i64() {
            Some(2) => Reply::Json(json!({"verdict": "deny", "reason": "no twos here"})),
            Some(3) => Reply::Json(json!({"verdict": "allow", "input": {"a": 30, "b": 1}})),
            Some(4) => Reply::Json(json!({"verdict": "allow", "input": {"a": "four", "b": 1}})),
            _ => Reply::Json(json!({"verdict": "allow"})),
        }
    })
    .await;
    let hooks = http_hooks(
        "GLIA_TEST_HOOK_SECRET_GATE",
        "[hooks.gate]\nurl = \"URL\"\ntopics = [\"before_tool_call\"]\nsecret_env = \"VAR\"\ntimeout_ms = 30000\non_failure = \"closed\"\n",
        &server.url,
    );
    let (a, _) = common::agent(vec![
        ScriptedTurn::calls(&[
            ("add", json!({"a": 1, "b": 1})),
            ("add", json!({"a": 2, "b": 1})),
            ("add", json!({"a": 3, "b": 1})),
            ("add", json!({"a": 4, "b": 1})),
        ]),
        ScriptedTurn::text("done"),
    ]);
    let agent = a.with_http_hooks(hooks);
    let mut log = Vec::new();
    let (state, status) = agent
        .run(run_id(), "add", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert!(
        matches!(status, Status::Done(glia_proto::Outcome::Succeeded { .. })),
        "{status:?}"
    );
    assert_replays(&log, &state);
    let calls = tool_calls(&log);
    assert_eq!(calls.len(), 4);
    // Allowed: runs as the model asked.
    assert_eq!(
        outcome_of(&log, &calls[0].call_id),
        (r#"{"sum":2}"#.into(), None)
    );
    // Denied: refused with the reason, which the model sees.
    let (text, kind) = outcome_of(&log, &calls[1].call_id);
    assert_eq!(kind, Some(ToolErrorKind::Cancelled));
    assert!(text.contains("no twos here"), "{text}");
    // Changed (valid): runs with the hook's arguments.
    assert_eq!(calls[2].input, json!({"a": 30, "b": 1}));
    assert_eq!(
        outcome_of(&log, &calls[2].call_id),
        (r#"{"sum":31}"#.into(), None)
    );
    // Changed (the schema refuses it): never runs; the model is told why.
    let (text, kind) = outcome_of(&log, &calls[3].call_id);
    assert_eq!(kind, Some(ToolErrorKind::Cancelled));
    assert!(
        text.contains("A hook changed this call's arguments"),
        "{text}"
    );
    // Each answer recorded before its effect, one call each, all signed.
    let recorded = hook_calls(&log);
    assert!(
        recorded
            .iter()
            .all(|(h, _, o)| *h == "gate" && *o == HookOutcome::Answered)
    );
    assert_eq!(
        recorded
            .iter()
            .filter(|(_, e, _)| !matches!(e, HookEffect::Modified { .. }))
            .count(),
        4
    );
    let first_hook = log
        .iter()
        .position(|e| matches!(e.kind, EventKind::HookApplied { .. }))
        .unwrap();
    let first_call = log
        .iter()
        .position(|e| matches!(e.kind, EventKind::ToolCall(_)))
        .unwrap();
    assert!(
        first_hook < first_call,
        "the answer is recorded before it takes effect"
    );
    let requests = server.calls.lock().unwrap().clone();
    assert_eq!(requests.len(), 4);
    assert_eq!(server.bad_signatures.load(Ordering::SeqCst), 0);
    assert_eq!(requests[0].1["topic"], "before_tool_call");
    assert_eq!(requests[0].1["hook"], "gate");
    assert_eq!(requests[0].1["payload"]["name"], "add");
    let ids: std::collections::HashSet<_> = requests.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(ids.len(), 4, "each logical call has its own webhook-id");
    // The secret is in no event.
    let text = serde_json::to_string(&log).unwrap();
    assert!(!text.contains("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"));
}

/// Hooks on `before_tool_call`, each the only one of its run: one that
/// never answers and one that answers garbage, each failing open and
/// closed; a 503, an answer over 1 MiB, a redirect (not followed: the
/// redirect's target would allow) and a refused connection.
#[tokio::test]
async fn timeouts_and_garbage_fail_open_and_closed() {
    let hang = hook_server(|_| Reply::Hang).await;
    let junk = hook_server(|_| Reply::Garbage).await;
    let down = hook_server(|_| Reply::Status(503)).await;
    let huge = hook_server(|_| Reply::Huge).await;
    let moved = hook_server(|_| Reply::Redirect).await;
    // A port nothing listens on: bound, its address kept, then closed.
    let refused = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        drop(listener);
        HookServer {
            url,
            calls: Arc::default(),
            bad_signatures: Arc::default(),
        }
    };
    for (name, server, timeout, failure, outcome) in [
        ("hang-open", &hang, 300, "open", HookOutcome::TimedOut),
        ("hang-closed", &hang, 300, "closed", HookOutcome::TimedOut),
        ("junk-open", &junk, 30_000, "open", HookOutcome::BadAnswer),
        (
            "down-closed",
            &down,
            30_000,
            "closed",
            HookOutcome::BadStatus,
        ),
        (
            "huge-closed",
            &huge,
            30_000,
            "closed",
            HookOutcome::BadAnswer,
        ),
        (
            "moved-closed",
            &moved,
            30_000,
            "closed",
            HookOutcome::BadStatus,
        ),
        (
            "refused-closed",
            &refused,
            30_000,
            "closed",
            HookOutcome::Unreachable,
        ),
        (
            "refused-open",
            &refused,
            30_000,
            "open",
            HookOutcome::Unreachable,
        ),
        (
            "junk-closed",
            &junk,
            30_000,
            "closed",
            HookOutcome::BadAnswer,
        ),
    ] {
        let var = format!(
            "GLIA_TEST_HOOK_SECRET_{}",
            name.replace('-', "_").to_uppercase()
        );
        let hooks = http_hooks(
            &var,
            &format!(
                "[hooks.{name}]\nurl = \"URL\"\ntopics = [\"before_tool_call\"]\nsecret_env = \"VAR\"\ntimeout_ms = {timeout}\non_failure = \"{failure}\"\n"
            ),
            &server.url,
        );
        let (a, _) = common::agent(vec![
            ScriptedTurn::call("add", json!({"a": 1, "b": 2})),
            ScriptedTurn::text("done"),
        ]);
        let agent = a.with_http_hooks(hooks);
        let mut log = Vec::new();
        let (state, _) = agent
            .run(run_id(), "add", RunConfig::default(), &mut log)
            .await
            .unwrap();
        assert_replays(&log, &state);
        let call = tool_calls(&log)[0].call_id.clone();
        let recorded = hook_calls(&log);
        assert_eq!(recorded.len(), 1, "{name}");
        assert_eq!(recorded[0].2, outcome, "{name}");
        let (text, kind) = outcome_of(&log, &call);
        if failure == "open" {
            assert_eq!(recorded[0].1, &HookEffect::Continued, "{name}");
            assert_eq!(
                (text, kind),
                (r#"{"sum":3}"#.to_owned(), None),
                "{name}: failing open, the call runs"
            );
        } else {
            assert!(
                matches!(recorded[0].1, HookEffect::Cancelled { .. }),
                "{name}"
            );
            assert_eq!(kind, Some(ToolErrorKind::Cancelled), "{name}");
            assert!(text.contains("fails closed"), "{name}: {text}");
            assert!(text.contains(outcome.name()), "{name}: {text}");
        }
    }
    // The redirect was not followed: its target was never asked.
    assert_eq!(moved.calls.lock().unwrap().len(), 1);
}

/// Failing closed elsewhere: a `before_step` hook that answers garbage
/// pauses the run (a resume asks it again); an `after_tool_call` hook that
/// never answers withholds the result.
#[tokio::test]
async fn failing_closed_pauses_a_step_and_withholds_a_result() {
    let junk = hook_server(|_| Reply::Garbage).await;
    let hooks = http_hooks(
        "GLIA_TEST_HOOK_SECRET_STEP",
        "[hooks.steps]\nurl = \"URL\"\ntopics = [\"before_step\"]\nsecret_env = \"VAR\"\ntimeout_ms = 30000\non_failure = \"closed\"\n",
        &junk.url,
    );
    let (a, _) = common::agent(vec![ScriptedTurn::text("done")]);
    let agent = a.with_http_hooks(hooks);
    let mut log = Vec::new();
    let (mut state, status) = agent
        .run(run_id(), "x", RunConfig::default(), &mut log)
        .await
        .unwrap();
    assert!(
        matches!(&status, Status::Parked(PullPoint::Paused { reason: PauseReason::Hook { hook, .. } }) if hook == "steps"),
        "{status:?}"
    );
    assert_eq!(junk.calls.lock().unwrap().len(), 1);
    let status = agent
        .advance(
            &mut state,
            Some(glia_proto::Payload::Resume { by: None }),
            &mut log,
        )
        .await
        .unwrap();
    assert!(matches!(status, Status::Parked(PullPoint::Paused { .. })));
    assert_eq!(
        junk.calls.lock().unwrap().len(),
        2,
        "a resume asks the hook again"
    );
    assert_replays(&log, &state);

    let hang = hook_server(|_| Reply::Hang).await;
    let hooks = http_hooks(
        "GLIA_TEST_HOOK_SECRET_RESULT",
        "[hooks.results]\nurl = \"URL\"\ntopics = [\"after_tool_call\"]\nsecret_env = \"VAR\"\ntimeout_ms = 300\non_failure = \"closed\"\n",
        &hang.url,
    );
    let (a, provider) = common::agent(vec![
        ScriptedTurn::call("add", json!({"a": 1, "b": 2})),
        ScriptedTurn::text("done"),
    ]);
    let agent = a.with_http_hooks(hooks);
    let mut log = Vec::new();
    agent
        .run(run_id(), "add", RunConfig::default(), &mut log)
        .await
        .unwrap();
    let call = tool_calls(&log)[0].call_id.clone();
    let (text, kind) = outcome_of(&log, &call);
    assert_eq!(kind, None);
    assert!(
        text.starts_with("[result withheld: the hook results did not answer (timed_out)"),
        "{text}"
    );
    let (seen, _) = result_in(&provider.requests()[1], &call);
    assert!(
        !seen.to_text().contains('3'),
        "the model never sees the result"
    );
}

/// A sink that keeps what is committed, and fails (a worker killed) at the
/// first record after a commit that made a hook's answer durable.
#[derive(Default)]
struct Crashing {
    committed: Vec<Event>,
    pending: Vec<Event>,
    armed: bool,
}

#[glia_agent::async_trait]
impl EventSink for Crashing {
    async fn record(&mut self, event: &Event) -> Result<(), SinkError> {
        if self.armed {
            return Err(SinkError("the worker was killed".into()));
        }
        self.pending.push(event.clone());
        Ok(())
    }

    async fn commit(&mut self, _: &RunState) -> Result<(), SinkError> {
        self.armed |= self
            .pending
            .iter()
            .any(|e| matches!(e.kind, EventKind::HookApplied { call: Some(_), .. }));
        self.committed.append(&mut self.pending);
        Ok(())
    }
}

#[tokio::test]
async fn a_worker_killed_after_the_answer_goes_on_from_it() {
    let server =
        hook_server(|_| Reply::Json(json!({"verdict": "allow", "input": {"a": 40, "b": 2}}))).await;
    let toml = "[hooks.gate]\nurl = \"URL\"\ntopics = [\"before_tool_call\"]\nsecret_env = \"VAR\"\ntimeout_ms = 30000\non_failure = \"closed\"\n";
    let script = vec![
        ScriptedTurn::call("add", json!({"a": 1, "b": 2})),
        ScriptedTurn::text("done"),
    ];
    let (agent1, _) = common::agent(script.clone());
    let agent1 =
        agent1.with_http_hooks(http_hooks("GLIA_TEST_HOOK_SECRET_CRASH", toml, &server.url));
    let mut sink = Crashing::default();
    let err = agent1
        .run(run_id(), "add", RunConfig::default(), &mut sink)
        .await
        .unwrap_err();
    assert!(
        matches!(err, glia_agent::agent::AgentError::Sink(_)),
        "{err:?}"
    );
    assert_eq!(server.calls.lock().unwrap().len(), 1);
    assert!(
        !sink
            .committed
            .iter()
            .any(|e| matches!(e.kind, EventKind::ToolCall(_))),
        "killed after the answer, before the call was decided"
    );
    // Another worker: the state from what was committed, a fresh agent.
    let mut log = sink.committed;
    let mut state = RunState::replay(run_id(), &log).unwrap();
    let (agent2, _) = agent_at(script, served(&log));
    let agent2 =
        agent2.with_http_hooks(http_hooks("GLIA_TEST_HOOK_SECRET_CRASH", toml, &server.url));
    let status = agent2.advance(&mut state, None, &mut log).await.unwrap();
    assert!(
        matches!(status, Status::Done(glia_proto::Outcome::Succeeded { .. })),
        "{status:?}"
    );
    assert_eq!(
        server.calls.lock().unwrap().len(),
        1,
        "the hook is not called again"
    );
    let call = tool_calls(&log)[0];
    assert_eq!(
        call.input,
        json!({"a": 40, "b": 2}),
        "the recorded answer takes effect"
    );
    assert_eq!(
        outcome_of(&log, &call.call_id),
        (r#"{"sum":42}"#.into(), None)
    );
    assert_replays(&log, &state);
}

/// Which runs a hook applies to: `apply = "always"` with `agents`; a
/// `when_named` hook only for runs naming it; a name the catalogue lacks
/// fails the run.
#[tokio::test]
async fn scope_always_named_and_unknown() {
    let server = hook_server(|_| Reply::Json(json!({"verdict": "allow"}))).await;
    let toml = "[hooks.always-support]\nurl = \"URL\"\ntopics = [\"before_step\"]\nsecret_env = \"VAR\"\non_failure = \"closed\"\nagents = [\"support\"]\ntenants = [\"acme\"]\n\n[hooks.opt-in]\nurl = \"URL\"\ntopics = [\"before_step\"]\nsecret_env = \"VAR\"\non_failure = \"open\"\napply = \"when_named\"\n";
    let run_of = |tenant: &'static str, config: RunConfig| {
        let server_url = server.url.clone();
        async move {
            let (a, _) = common::agent(vec![ScriptedTurn::text("done")]);
            let agent = a.with_http_hooks(
                http_hooks("GLIA_TEST_HOOK_SECRET_SCOPE", toml, &server_url)
                    .with_tenants(Arc::new(OneTenant(tenant))),
            );
            let mut log = Vec::new();
            let (_, status) = agent.run(run_id(), "x", config, &mut log).await.unwrap();
            let hooks: Vec<String> = hook_calls(&log)
                .iter()
                .map(|(h, ..)| h.to_string())
                .collect();
            (status, hooks)
        }
    };
    let run = |config: RunConfig| run_of("acme", config);
    let (_, hooks) = run(RunConfig::default()).await;
    assert!(hooks.is_empty(), "{hooks:?}");
    let support = RunConfig {
        agent: Some(glia_proto::AgentRef {
            name: "support".into(),
            version: 1,
            content_hash: format!("sha256:{}", "0".repeat(64)),
        }),
        ..RunConfig::default()
    };
    let (_, hooks) = run(support.clone()).await;
    assert_eq!(hooks, ["always-support"]);
    // Another tenant's agent of the same name is not reached.
    let (_, hooks) = run_of("globex", support.clone()).await;
    assert!(hooks.is_empty(), "{hooks:?}");
    let named = RunConfig {
        hooks: vec!["opt-in".into()],
        ..support
    };
    let (_, hooks) = run(named).await;
    assert_eq!(
        hooks,
        ["always-support", "opt-in"],
        "named hooks add to the operator's"
    );
    let unknown = RunConfig {
        hooks: vec!["nope".into()],
        ..RunConfig::default()
    };
    let (a, _) = common::agent(vec![ScriptedTurn::text("done")]);
    let agent = a.with_http_hooks(http_hooks("GLIA_TEST_HOOK_SECRET_SCOPE", toml, &server.url));
    // Started here: refused before anything is recorded.
    let mut log = Vec::new();
    let err = agent
        .start(run_id(), "x", unknown.clone(), &mut log)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("hooks[0]"), "{err}");
    assert!(log.is_empty());
    // Admitted elsewhere (another catalogue): failed at its first advance.
    let start = Event {
        run_id: run_id(),
        seq: 1,
        at: epoch(),
        kind: EventKind::SessionStart {
            goal: "x".into(),
            config: unknown,
            redactions: Vec::new(),
        },
    };
    let mut log = vec![start];
    let mut state = RunState::replay(run_id(), &log).unwrap();
    let status = agent.advance(&mut state, None, &mut log).await.unwrap();
    assert!(
        matches!(&status, Status::Done(glia_proto::Outcome::Failed { error }) if error.contains("hooks[0]")),
        "{status:?}"
    );
}

#[test]
fn the_catalogue_checks_hooks_strictly() {
    let bad = |toml: &str| Catalogue::parse(toml, "<t>").unwrap_err().path;
    let ok = "[hooks.h]\nurl = \"https://h.example/x\"\ntopics = [\"before_tool_call\"]\nsecret_env = \"H\"\non_failure = \"open\"\n";
    Catalogue::parse(ok, "<t>").unwrap();
    assert_eq!(bad(&format!("{ok}urls = 1\n")), "hooks.h.urls");
    assert_eq!(
        bad(&ok.replace("https://h.example/x", "ftp://h.example/")),
        "hooks.h.url"
    );
    assert_eq!(
        bad(&ok.replace("https://h.example/x", "https://u:p@h.example/")),
        "hooks.h.url"
    );
    assert_eq!(
        bad(&ok.replace("before_tool_call", "before_lunch")),
        "hooks.h.topics[0]"
    );
    assert_eq!(
        bad(&ok.replace("\"before_tool_call\"", "\"on_error\", \"on_error\"")),
        "hooks.h.topics[1]"
    );
    assert_eq!(bad(&ok.replace("\"H\"", "\"1H\"")), "hooks.h.secret_env");
    assert_eq!(bad(&format!("{ok}timeout_ms = 0\n")), "hooks.h.timeout_ms");
    assert_eq!(
        bad(&ok.replace("\"open\"", "\"ajar\"")),
        "hooks.h.on_failure"
    );
    assert_eq!(bad(&format!("{ok}tenants = []\n")), "hooks.h.tenants");
    assert_eq!(
        bad(&format!("{ok}apply = \"when_named\"\nagents = [\"a\"]\n")),
        "hooks.h.agents"
    );
    // A missing variable and a value that is not a secret name the key, never a value.
    let c = Catalogue::parse(&ok.replace("\"H\"", "\"GLIA_TEST_HOOK_UNSET\""), "<t>").unwrap();
    assert_eq!(c.check_environment().unwrap_err().0, "hooks.h.secret_env");
    let c = Catalogue::parse(ok, "<t>").unwrap();
    let (key, reason) = c.hooks["h"]
        .secret_from("h", &|_| Some("hunter2 !".to_owned()))
        .unwrap_err();
    assert_eq!(key, "hooks.h.secret_env");
    assert!(!reason.contains("hunter2"), "{reason}");
    let Err((key, _)) = HttpHooks::from_catalogue_with(&c, &|_| Some("hunter2 !".to_owned()))
    else {
        panic!("a value that is not a secret is refused");
    };
    assert_eq!(key, "hooks.h.secret_env");
    // `agents` alone would reach other tenants' agents of those names.
    assert_eq!(
        bad(&format!("{ok}agents = [\"support\"]\n")),
        "hooks.h.agents"
    );
    Catalogue::parse(
        &format!("{ok}agents = [\"support\"]\ntenants = [\"acme\"]\n"),
        "<t>",
    )
    .unwrap();
    // A run naming a hook the catalogue lacks is refused at admission.
    let c = Catalogue::parse(ok, "<t>").unwrap();
    let config = RunConfig {
        hooks: vec!["h".into(), "other".into()],
        ..RunConfig::default()
    };
    assert_eq!(c.admit(&config).unwrap_err().field, "hooks[1]");
}

/// An approver's edit does not undo a `before_tool_call` hook: the edited
/// arguments go to the hook (under their own key) and to the policies
/// before the call runs; refused, the tool never runs and the model reads
/// why. An edit the hook allows runs.
#[tokio::test]
async fn an_approvers_edit_is_asked_about_again() {
    let server = hook_server(|body| {
        let amount = body["payload"]["input"]["amount"].as_u64().unwrap_or(0);
        if amount > 100 {
            Reply::Json(json!({"verdict": "deny", "reason": "refunds over 100 need finance"}))
        } else {
            Reply::Json(json!({"verdict": "allow"}))
        }
    })
    .await;
    let toml = "[hooks.limit]\nurl = \"URL\"\ntopics = [\"before_tool_call\"]\nsecret_env = \"VAR\"\ntimeout_ms = 30000\non_failure = \"closed\"\n";
    let run = |edited: u64| {
        let url = server.url.clone();
        async move {
            let refunds = Arc::new(AtomicUsize::new(0));
            let provider = Arc::new(glia_agent::provider::ScriptedProvider::new(vec![
                ScriptedTurn::call("refund", json!({"order": "A1", "amount": 50})),
                ScriptedTurn::text("done"),
            ]));
            let agent = glia_agent::Agent::new(provider)
                .with_tools(common::tools(refunds.clone()))
                .with_clock(glia_agent::FixedClock(epoch()))
                .with_http_hooks(http_hooks("GLIA_TEST_HOOK_SECRET_EDIT", toml, &url));
            let mut log = Vec::new();
            let (mut state, status) = agent
                .run(run_id(), "refund", approval_config(), &mut log)
                .await
                .unwrap();
            assert!(matches!(status, Status::Parked(_)), "{status:?}");
            let call = state.pending_calls[0].clone();
            let edit = glia_proto::Payload::Approval {
                call_id: call.call_id.clone(),
                args_hash: call.args_hash.clone(),
                decision: glia_proto::Decision::Edit {
                    input: json!({"order": "A1", "amount": edited}),
                },
                by: Some("ana".into()),
                request_seq: None,
            };
            let status = agent
                .advance(&mut state, Some(edit), &mut log)
                .await
                .unwrap();
            assert!(
                matches!(status, Status::Done(glia_proto::Outcome::Succeeded { .. })),
                "{status:?}"
            );
            assert_replays(&log, &state);
            (log, call.call_id, refunds.load(Ordering::SeqCst))
        }
    };
    // Edited over the hook's limit: refused, never run.
    let before = server.calls.lock().unwrap().len();
    let (log, call_id, refunds) = run(10_000).await;
    assert_eq!(refunds, 0, "the edited call must not run");
    let (text, kind) = outcome_of(&log, &call_id);
    assert_eq!(kind, Some(ToolErrorKind::Cancelled));
    assert!(text.contains("refunds over 100 need finance"), "{text}");
    let requests: Vec<Value> = server.calls.lock().unwrap()[before..]
        .iter()
        .map(|(_, b)| b["payload"]["input"]["amount"].clone())
        .collect();
    assert_eq!(
        requests,
        [json!(50), json!(10_000)],
        "asked again about the edit"
    );
    let keys: Vec<&str> = log
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::HookApplied { call: Some(c), .. } => Some(c.key.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(keys.len(), 2);
    assert_ne!(keys[0], keys[1], "the edited payload has its own key");
    // Edited within it: runs with the edited arguments.
    let (log, call_id, refunds) = run(70).await;
    assert_eq!(refunds, 1);
    let (text, kind) = outcome_of(&log, &call_id);
    assert_eq!(kind, None);
    assert!(text.contains("\"refunded\":70"), "{text}");
}

/// A plan or step a hook gives is bounded: an empty plan, a blank step, too
/// many steps or an overlong description is a bad answer (the hook's
/// failure mode), never a run that ends with no answer.
#[test]
fn plan_and_step_changes_are_checked() {
    use glia_agent::http_hooks::{Answer, MAX_PLAN_STEPS, MAX_STEP_CHARS};
    use glia_proto::HookTopic::{AfterPlan, BeforeStep};
    let read = |topic, v: Value| Answer::read(topic, &serde_json::to_vec(&v).unwrap());
    let bad = |topic, v: Value| {
        let (outcome, why) = read(topic, v).unwrap_err();
        assert_eq!(outcome, HookOutcome::BadAnswer);
        why
    };
    let ok = read(
        AfterPlan,
        json!({"verdict": "allow", "steps": ["look", "act"]}),
    )
    .unwrap();
    assert_eq!(ok.0, Some(("steps", json!(["look", "act"]))));
    assert!(bad(AfterPlan, json!({"verdict": "allow", "steps": []})).contains("`steps` is empty"));
    assert!(bad(AfterPlan, json!({"verdict": "allow", "steps": ["a", "  "]})).contains("steps[1]"));
    let many: Vec<String> = (0..=MAX_PLAN_STEPS).map(|i| format!("step {i}")).collect();
    assert!(bad(AfterPlan, json!({"verdict": "allow", "steps": many})).contains("more than"));
    let long = "x".repeat(MAX_STEP_CHARS + 1);
    assert!(
        bad(
            AfterPlan,
            json!({"verdict": "allow", "steps": [long.clone()]})
        )
        .contains("steps[0]")
    );
    assert!(
        bad(BeforeStep, json!({"verdict": "allow", "description": long})).contains("description")
    );
    assert!(bad(BeforeStep, json!({"verdict": "allow", "description": ""})).contains("blank"));
    read(
        BeforeStep,
        json!({"verdict": "allow", "description": "look first"}),
    )
    .unwrap();
}
