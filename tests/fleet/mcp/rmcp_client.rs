//! The `rmcp` client against glia's `/mcp` (see [`super`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use glia_testkit::fleet::{Fleet, http_as};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest, ErrorCode,
    ProgressNotificationParam, ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ServiceError, ServiceExt};
use serde_json::{Value, json};

/// Generous: a story takes seconds; the deadline only stops a hang.
const DEADLINE: Duration = Duration::from_secs(180);
/// The wait every agent call asks for (`_meta` `glia/wait_ms`; the
/// server's longest): on a loaded machine the default 50 s may pass before
/// a run ends, and the call would answer "running".
const LONG_WAIT_MS: u64 = 600_000;

/// A client that keeps every progress notification it receives.
#[derive(Clone, Default)]
struct Recorder {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
}

impl ClientHandler for Recorder {
    async fn on_progress(
        &self,
        mut params: ProgressNotificationParam,
        context: NotificationContext<RoleClient>,
    ) {
        // rmcp 3.11 moves a notification's `_meta` out of its params and
        // hands it over in the context's extensions.
        if params.meta.is_none() {
            params.meta = context
                .extensions
                .get::<rmcp::model::NotificationMetaObject>()
                .cloned();
        }
        self.progress.lock().unwrap().push(params);
    }
}

impl Recorder {
    /// The progress messages of the request with `token`'s progress token,
    /// in progress order (rmcp's client hands notifications to spawned
    /// tasks, so they may be recorded out of order).
    fn messages(&self, token: &rmcp::model::ProgressToken) -> Vec<String> {
        let mut seen: Vec<(f64, String)> = self
            .progress
            .lock()
            .unwrap()
            .iter()
            .filter(|p| &p.progress_token == token)
            .filter_map(|p| p.message.clone().map(|m| (p.progress, m)))
            .collect();
        seen.sort_by(|a, b| a.0.total_cmp(&b.0));
        seen.into_iter().map(|(_, m)| m).collect()
    }

    /// The progress messages of `token` once one contains `needle` (they
    /// may be recorded after the call's answer), or a panic after
    /// [`DEADLINE`].
    async fn messages_until(
        &self,
        token: &rmcp::model::ProgressToken,
        needle: &str,
    ) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let messages = self.messages(token);
            if messages.iter().any(|m| m.contains(needle)) {
                return messages;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no progress with {needle:?}: {messages:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The run id the progress of `token` names (`_meta` `glia/run_id`).
    fn run_id(&self, token: &rmcp::model::ProgressToken) -> Option<String> {
        self.progress
            .lock()
            .unwrap()
            .iter()
            .filter(|p| &p.progress_token == token)
            .find_map(|p| {
                p.meta
                    .as_ref()
                    .and_then(|m| m.0.0.get("glia/run_id"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
    }
}

fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// An MCP session with the fleet's `/mcp`, as `token` (none: no header).
async fn connect(
    fleet: &Fleet,
    token: Option<&str>,
) -> Result<(RunningService<RoleClient, Recorder>, Recorder), String> {
    install_crypto();
    let mut config = StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", fleet.server));
    if let Some(token) = token {
        config = config.auth_header(token);
    }
    let client = reqwest_mcp::Client::builder()
        .build()
        .map_err(|e| e.to_string())?;
    let transport = StreamableHttpClientTransport::with_client(client, config);
    let recorder = Recorder::default();
    let service = recorder
        .clone()
        .serve(transport)
        .await
        .map_err(|e| e.to_string())?;
    Ok((service, recorder))
}

/// A call of tool `name`; an agent's asks for [`LONG_WAIT_MS`].
fn call(name: &str, args: Value) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new(name.to_owned())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    if !name.starts_with("_glia_") {
        let mut meta = rmcp::model::RequestMetaObject::default();
        meta.0.0.insert("glia/wait_ms".into(), json!(LONG_WAIT_MS));
        params.meta = Some(meta);
    }
    params
}

/// Waits with `_glia_wait_run` until run `run_id` is no longer "running"
/// (each wait as long as the server allows), answering the last result.
async fn wait_run(service: &RunningService<RoleClient, Recorder>, run_id: &str) -> CallToolResult {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let result = call_tool(
            service,
            "_glia_wait_run",
            json!({"run_id": run_id, "wait_ms": LONG_WAIT_MS}),
        )
        .await
        .expect("_glia_wait_run answers");
        let still_running = result
            .structured_content
            .as_ref()
            .is_some_and(|b| b["status"] == "running");
        if !still_running || tokio::time::Instant::now() >= deadline {
            return result;
        }
    }
}

async fn call_tool(
    service: &RunningService<RoleClient, Recorder>,
    name: &str,
    args: Value,
) -> Result<CallToolResult, ServiceError> {
    service.peer().call_tool(call(name, args)).await
}

fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn structured(result: &CallToolResult) -> Value {
    result
        .structured_content
        .clone()
        .unwrap_or_else(|| panic!("structured content in {result:?}"))
}

/// A blocking HTTP call from async code.
async fn http(
    method: &'static str,
    url: String,
    body: Option<Value>,
    token: Option<&'static str>,
) -> (u16, Value) {
    tokio::task::spawn_blocking(move || {
        http_as(method, &url, body, token).expect("the dispatcher answers")
    })
    .await
    .unwrap()
}

/// Poll run `id` (as `tok-acme`) until `done`, answering it.
async fn until_done(fleet: &Fleet, id: &str) -> Value {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (status, run) = http(
            "GET",
            format!("{}/v1/runs/{id}", fleet.server),
            None,
            Some("tok-acme"),
        )
        .await;
        assert_eq!(status, 200, "{run}");
        if run["status"] == "done" {
            return run;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "run {id} did not end: {run}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Lists the agents; calls one that completes (answer, progress), one that
/// parks for approval (continue result; decided with the approval tool;
/// the run finishes, one refund); retries a call with the same key (one
/// run); refuses malformed arguments naming the field.
#[test]
fn agents_are_tools_that_answer_or_say_how_to_continue() {
    let fleet = super::mcp_fleet();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (service, recorder) = connect(&fleet, Some("tok-acme")).await.expect("connects");
        let tools = service.peer().list_all_tools().await.expect("tools/list");
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        for expected in ["answerer", "refunder", "sleeper", "_glia_list_approvals", "_glia_decide_approval", "_glia_wait_run", "_glia_cancel_run"] {
            assert!(names.contains(&expected), "{expected} listed in {names:?}");
        }
        let answerer = tools.iter().find(|t| t.name == "answerer").unwrap();
        assert!(answerer.description.as_deref().unwrap().starts_with("Answers at once."));
        assert_eq!(answerer.input_schema["required"], json!(["goal"]));
        assert!(answerer.output_schema.is_some());

        // A run that completes: its answer, and its events as progress.
        let handle = service
            .peer()
            .send_cancellable_request(
                ClientRequest::CallToolRequest(CallToolRequest::new(call("answerer", json!({"goal": "Say done.", "tags": ["mcp"]})))),
                PeerRequestOptions::no_options(),
            )
            .await
            .unwrap();
        let token = handle.progress_token.clone();
        let request_id = handle.id.clone();
        let ServerResult::CallToolResult(done) = handle.await_response().await.expect("the call answers") else {
            panic!("not a tool result")
        };
        assert_eq!(done.is_error, Some(false), "{done:?}");
        assert!(text(&done).starts_with("Done: the goal is met."), "{}", text(&done));
        let body = structured(&done);
        assert_eq!(body["status"], "succeeded");
        assert_eq!(body["answer"], "Done: the goal is met.");
        let run_id = body["run_id"].as_str().unwrap().to_owned();
        let messages = recorder.messages_until(&token, "session.complete").await;
        assert!(messages.first().is_some_and(|m| m.starts_with("1 session.start")), "{messages:?}");
        assert!(messages.iter().any(|m| m.contains("session.complete: succeeded")), "{messages:?}");
        assert_eq!(recorder.run_id(&token).as_deref(), Some(run_id.as_str()));
        let (_, run) = http("GET", format!("{}/v1/runs/{run_id}", fleet.server), None, Some("tok-acme")).await;
        assert_eq!((run["agent"].as_str(), run["tags"].clone()), (Some("answerer"), json!(["mcp"])));
        // A cancel for the call once it answered changes nothing: the run
        // stays succeeded and the session goes on.
        service
            .peer()
            .notify_cancelled(rmcp::model::CancelledNotificationParam::new(Some(request_id), Some("too late".into())))
            .await
            .expect("the notification is sent");
        assert!(service.peer().list_all_tools().await.is_ok(), "the session goes on");
        let (_, run) = http("GET", format!("{}/v1/runs/{run_id}", fleet.server), None, Some("tok-acme")).await;
        assert_eq!(run["outcome"]["kind"], "succeeded", "{run}");

        // A retried call (same idempotency key) finds the same run.
        let keyed = |goal: &str| {
            let mut params = call("answerer", json!({"goal": goal}));
            let meta = params.meta.get_or_insert_with(Default::default);
            meta.0.0.insert("glia/idempotency_key".into(), json!("retry-1"));
            params
        };
        let first = structured(&service.peer().call_tool(keyed("Once.")).await.unwrap());
        let again = structured(&service.peer().call_tool(keyed("Once.")).await.unwrap());
        assert_eq!(first["run_id"], again["run_id"], "one run for one key");
        let other = service.peer().call_tool(keyed("Another goal.")).await.unwrap();
        assert_eq!(other.is_error, Some(true), "another request under the key is refused: {other:?}");
        assert!(text(&other).contains("idempotency_conflict"), "{}", text(&other));

        // A run that parks for approval: where and how to continue.
        let parked = call_tool(&service, "refunder", json!({"goal": "Refund order A1."})).await.unwrap();
        assert_eq!(parked.is_error, Some(false), "{parked:?}");
        let body = structured(&parked);
        assert_eq!(body["status"], "waiting", "{body}");
        assert_eq!(body["pull_point"]["kind"], "awaiting_approval");
        let approval = body["approvals"][0].clone();
        assert_eq!((approval["tool"].clone(), approval["input"].clone()), (json!("refund_order"), json!({"order_id": "A1"})));
        assert!(body["next"].as_array().unwrap().iter().any(|n| n["tool"] == "_glia_decide_approval"));
        assert!(text(&parked).contains("_glia_decide_approval"));
        let run_id = body["run_id"].as_str().unwrap().to_owned();
        assert!(fleet.api.effects().iter().all(|l| !l.contains(&run_id)), "nothing refunded before the decision");

        // A token that may submit but not approve cannot decide it.
        let (submitter, _) = connect(&fleet, Some("tok-submit")).await.expect("connects");
        let seen = submitter.peer().list_all_tools().await.unwrap();
        assert!(seen.iter().all(|t| t.name != "_glia_decide_approval"), "{seen:?}");
        match call_tool(
            &submitter,
            "_glia_decide_approval",
            json!({"run_id": run_id, "call_id": approval["call_id"], "decision": "approve", "args_hash": approval["args_hash"]}),
        )
        .await
        {
            Err(ServiceError::McpError(e)) => assert!(e.message.contains("approve"), "{e:?}"),
            other => panic!("a submit-only token decided: {other:?}"),
        }
        submitter.cancel().await.unwrap();
        let listed = structured(&call_tool(&service, "_glia_list_approvals", json!({})).await.unwrap());
        assert!(listed["approvals"].as_array().unwrap().iter().any(|a| a["run_id"] == run_id.as_str() && a["call_id"] == approval["call_id"]), "{listed}");
        let decided = call_tool(
            &service,
            "_glia_decide_approval",
            json!({"run_id": run_id, "call_id": approval["call_id"], "decision": "approve", "args_hash": approval["args_hash"]}),
        )
        .await
        .unwrap();
        assert_eq!(decided.is_error, Some(false), "{decided:?}");
        let finished = wait_run(&service, &run_id).await;
        let body = structured(&finished);
        assert_eq!((body["status"].clone(), body["answer"].clone()), (json!("succeeded"), json!("Order A1 is refunded.")), "{body}");
        let again = call_tool(
            &service,
            "_glia_decide_approval",
            json!({"run_id": run_id, "call_id": approval["call_id"], "decision": "reject"}),
        )
        .await
        .unwrap();
        assert_eq!(again.is_error, Some(true), "a second decision is refused: {again:?}");
        let refunds = fleet.api.effects().iter().filter(|l| l.starts_with("refund ") && l.contains(&run_id)).count();
        assert_eq!(refunds, 1, "one refund: {:?}", fleet.api.effects());

        // Malformed arguments: an MCP error naming the field; nothing admitted.
        for (args, field) in [(json!({}), "goal"), (json!({"goal": 3}), "goal"), (json!({"goal": "x", "tags": ["no spaces allowed"]}), "tags[0]"), (json!({"goal": "x", "config": {}}), "config")] {
            match call_tool(&service, "answerer", args.clone()).await {
                Err(ServiceError::McpError(e)) => {
                    assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{args}: {e:?}");
                    assert_eq!(e.data.as_ref().and_then(|d| d.get("field")), Some(&json!(field)), "{args}: {e:?}");
                }
                other => panic!("{args}: expected an invalid-params error, got {other:?}"),
            }
        }
        match call_tool(&service, "nobody", json!({"goal": "x"})).await {
            Err(ServiceError::McpError(e)) => assert_eq!(e.code, ErrorCode::INVALID_PARAMS),
            other => panic!("an unknown tool: {other:?}"),
        }
        service.cancel().await.unwrap();
    });
}

/// A client's `notifications/cancelled` for a call cancels its run (parked
/// at its timer, mid-run).
#[test]
fn a_cancelled_call_cancels_its_run() {
    let fleet = super::mcp_fleet();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (service, recorder) = connect(&fleet, Some("tok-acme")).await.expect("connects");
        let handle = service
            .peer()
            .send_cancellable_request(
                ClientRequest::CallToolRequest(CallToolRequest::new(call(
                    "sleeper",
                    json!({"goal": "Sleep."}),
                ))),
                PeerRequestOptions::no_options(),
            )
            .await
            .unwrap();
        let token = handle.progress_token.clone();
        // Mid-run: the sleep is called (the run waits at its timer).
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while !recorder
            .messages(&token)
            .iter()
            .any(|m| m.contains("tool sleep called"))
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the sleep was not called: {:?}",
                recorder.messages(&token)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let run_id = recorder.run_id(&token).expect("the progress names the run");
        let (_, run) = http(
            "GET",
            format!("{}/v1/runs/{run_id}", fleet.server),
            None,
            Some("tok-acme"),
        )
        .await;
        assert_ne!(run["status"], "done", "{run}");
        handle.cancel(Some("changed my mind".into())).await.unwrap();
        let run = until_done(&fleet, &run_id).await;
        assert_eq!(run["outcome"]["kind"], "cancelled", "{run}");
        assert!(
            run["outcome"]["reason"]
                .as_str()
                .unwrap()
                .contains("changed my mind"),
            "{run}"
        );
        service.cancel().await.unwrap();
    });
}

/// No token: 401 like `/v1`, and the client cannot connect. Another
/// tenant's token sees none of `acme`'s agents, cannot call them and
/// cannot read their runs (answered like a run that does not exist).
#[test]
fn no_token_and_another_tenant_are_refused() {
    let fleet = super::mcp_fleet();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    let (status, body) = http_as(
        "POST",
        &format!("{}/mcp", fleet.server),
        Some(init.clone()),
        None,
    )
    .unwrap();
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (401, json!("missing_token")),
        "{body}"
    );
    let (status, body) = http_as(
        "POST",
        &format!("{}/mcp", fleet.server),
        Some(init),
        Some("nope"),
    )
    .unwrap();
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (401, json!("invalid_token")),
        "{body}"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        assert!(connect(&fleet, None).await.is_err(), "no token, no session");
        let (acme, _) = connect(&fleet, Some("tok-acme")).await.unwrap();
        let mine = structured(
            &call_tool(&acme, "answerer", json!({"goal": "Mine."}))
                .await
                .unwrap(),
        );
        let run_id = mine["run_id"].as_str().unwrap().to_owned();

        let (other, _) = connect(&fleet, Some("tok-other")).await.unwrap();
        let tools = other.peer().list_all_tools().await.unwrap();
        assert!(
            tools.iter().all(|t| t.name.starts_with("_glia_")),
            "no agent of acme: {tools:?}"
        );
        match call_tool(&other, "answerer", json!({"goal": "Theirs."})).await {
            Err(ServiceError::McpError(e)) => {
                assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{e:?}")
            }
            other => panic!("another tenant's agent: {other:?}"),
        }
        let theirs = call_tool(&other, "_glia_wait_run", json!({"run_id": run_id}))
            .await
            .unwrap();
        let missing = call_tool(
            &other,
            "_glia_wait_run",
            json!({"run_id": uuid::Uuid::now_v7()}),
        )
        .await
        .unwrap();
        assert_eq!(theirs.is_error, Some(true));
        assert_eq!(
            text(&theirs).replace(&run_id, "ID"),
            text(&missing).replace(&missing_id(&missing), "ID"),
            "not yours reads as not there"
        );
        let cancel = call_tool(&other, "_glia_cancel_run", json!({"run_id": run_id}))
            .await
            .unwrap();
        assert_eq!(cancel.is_error, Some(true), "{cancel:?}");
        let (agents_only, _) = connect(&fleet, Some("tok-agents")).await.unwrap();
        let tools = agents_only.peer().list_all_tools().await.unwrap();
        assert_eq!(
            tools.iter().map(|t| t.name.to_string()).collect::<Vec<_>>(),
            vec!["_glia_wait_run"],
            "a token without submit or approve gets no agent"
        );
        match call_tool(&agents_only, "answerer", json!({"goal": "x"})).await {
            Err(ServiceError::McpError(e)) => assert!(e.message.contains("submit"), "{e:?}"),
            other => panic!("without submit: {other:?}"),
        }
        for s in [acme, other, agents_only] {
            s.cancel().await.unwrap();
        }
    });
}

/// The run id a refusal names.
fn missing_id(result: &CallToolResult) -> String {
    let t = text(result);
    t.split_whitespace()
        .find(|w| {
            uuid::Uuid::parse_str(w.trim_matches(|c: char| !c.is_ascii_hexdigit() && c != '-'))
                .is_ok()
        })
        .map(|w| {
            w.trim_matches(|c: char| !c.is_ascii_hexdigit() && c != '-')
                .to_owned()
        })
        .unwrap_or_default()
}
