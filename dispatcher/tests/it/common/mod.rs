//! Shared test harness: the dispatcher over the in-memory twins, a request
//! helper, and hand-built worker commits that park runs at pull points.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use chrono::Utc;
use glia_backends::memory::{MemoryLedger, MemoryLog, MemoryQueue};
use glia_backends::{AgentRegistry, Inbox, JobQueue, Outbox, RunFilter, RunLog};
use glia_dispatcher::{App, Auth, Principal, Scope};
use glia_proto::Payload;
use glia_proto::{
    ContentBlock, Disposition, Event, EventKind, Limit, Message, Outcome, PauseReason, PullPoint,
    Role, RunState, ToolCallRecord, Usage, args_hash,
};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;
use uuid::Uuid;

mod experiments;
pub use experiments::*;

/// Tokens: tenant `a` has a submitter, an approver; tenant `b` a submitter
/// with both scopes; `admin` sees everything.
pub const SUB_A: &str = "tok-sub-a";
pub const APP_A: &str = "tok-app-a";
pub const SUB_B: &str = "tok-sub-b";
pub const ADMIN: &str = "tok-admin";
/// Tenant a's token that may submit and approve (an eval that decides its
/// runs' approvals needs both).
pub const SUB_APP_A: &str = "tok-sub-app-a";

pub struct H {
    pub app: App,
    pub router: Router,
    pub log: Arc<MemoryLog>,
    pub queue: Arc<MemoryQueue>,
    pub ledger: Arc<MemoryLedger>,
}

pub fn auth() -> Auth {
    let p = |t: &str, s: &[Scope]| Principal {
        tenant: t.into(),
        scopes: s.to_vec(),
        name: None,
    };
    Auth::from_tokens([
        (SUB_A.to_owned(), p("a", &[Scope::Submit])),
        (
            APP_A.to_owned(),
            Principal {
                name: Some("ana".into()),
                ..p("a", &[Scope::Approve])
            },
        ),
        (SUB_B.to_owned(), p("b", &[Scope::Submit, Scope::Approve])),
        (ADMIN.to_owned(), p("ops", &[Scope::Admin])),
        (
            SUB_APP_A.to_owned(),
            p("a", &[Scope::Submit, Scope::Approve]),
        ),
    ])
    .unwrap()
}

pub fn harness() -> H {
    harness_with(auth())
}

pub fn harness_with(auth: Auth) -> H {
    let log = Arc::new(MemoryLog::default());
    let queue = Arc::new(MemoryQueue::default());
    let ledger = Arc::new(MemoryLedger::default());
    let batches = glia_backends::batches::MemoryBatches::new(log.clone());
    let app = App::new(log.clone(), queue.clone(), ledger.clone(), auth)
        .with_batches(glia_dispatcher::batches::BatchConfig {
            store: Some(Arc::new(batches)),
            admission: Default::default(),
        })
        .with_schedules(Arc::new(
            glia_backends::schedules::MemorySchedules::default(),
        ));
    let router = glia_dispatcher::router(app.clone());
    H {
        app,
        router,
        log,
        queue,
        ledger,
    }
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: Value,
    pub text: String,
}

impl Reply {
    /// The error code of a JSON error body (panics when the body is not one).
    pub fn code(&self) -> &str {
        self.body["error"]["code"]
            .as_str()
            .unwrap_or_else(|| panic!("not a JSON error body ({}): {}", self.status, self.text))
    }
}

pub async fn send(router: &Router, req: Request<Body>) -> Reply {
    let res = router.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Reply {
        status,
        headers,
        body,
        text,
    }
}

pub fn request(
    method: Method,
    uri: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Request<Body> {
    let mut b = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    match body {
        Some(v) => b
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(v.to_string()))
            .unwrap(),
        None => b.body(Body::empty()).unwrap(),
    }
}

pub async fn get(h: &H, uri: &str, token: &str) -> Reply {
    send(&h.router, request(Method::GET, uri, Some(token), None)).await
}

pub async fn post(h: &H, uri: &str, token: &str, body: Value) -> Reply {
    send(
        &h.router,
        request(Method::POST, uri, Some(token), Some(&body)),
    )
    .await
}

/// The payloads waiting in run `run`'s inbox, oldest first.
pub async fn inbox_of(h: &H, run: Uuid) -> Vec<glia_proto::Payload> {
    h.log
        .inbox(run)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.payload)
        .collect()
}

/// Admit a run through the API; returns its id.
pub async fn create(h: &H, token: &str, body: Value) -> Uuid {
    let r = post(h, "/v1/runs", token, body).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    r.body["run_id"].as_str().unwrap().parse().unwrap()
}

/// Submit a one-item batch through the API; returns its id.
pub async fn create_batch(router: &Router, token: &str) -> Uuid {
    let body = json!({"config": {}, "items": [{"custom_id": "x", "goal": "g"}]});
    let r = send(
        router,
        request(Method::POST, "/v1/batches", Some(token), Some(&body)),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    r.body["id"].as_str().unwrap().parse().unwrap()
}

pub fn conversational() -> Value {
    json!({"goal": "chat", "config": {"conversational": true}})
}

/// Append `kinds` to the run as a worker would: lease, commit, release.
pub async fn commit(log: &dyn RunLog, run_id: Uuid, kinds: Vec<EventKind>) {
    commit_consuming(log, run_id, kinds, &[]).await
}

pub async fn commit_consuming(
    log: &dyn RunLog,
    run_id: Uuid,
    kinds: Vec<EventKind>,
    consumed: &[i64],
) {
    let mut state = log.load(run_id).await.unwrap();
    let lease = log
        .acquire(run_id, "test-worker", Duration::from_secs(30))
        .await
        .unwrap();
    let mut events = Vec::new();
    for kind in kinds {
        let e = Event {
            run_id,
            seq: state.head_seq + 1,
            at: Utc::now(),
            kind,
        };
        state
            .apply(&e)
            .unwrap_or_else(|err| panic!("test log does not apply: {err}"));
        events.push(e);
    }
    log.commit(&lease, &events, &state, consumed).await.unwrap();
    log.release(&lease).await.unwrap();
}

/// Planning to the first model call of a single-step plan.
pub fn to_model_call() -> Vec<EventKind> {
    to_model_call_with(vec![])
}

/// Planning to the first model call of a single-step plan offering `tools`.
pub fn to_model_call_with(tools: Vec<glia_proto::ToolSpec>) -> Vec<EventKind> {
    vec![
        EventKind::PlanDraft {
            steps: vec!["Reach the goal.".into()],
            usage: Usage::default(),
            cost_usd_micros: 0,
        },
        EventKind::PlanCommit {
            steps: vec!["Reach the goal.".into()],
        },
        EventKind::StepStart {
            index: 0,
            description: "Reach the goal.".into(),
            tools,
        },
        EventKind::ModelCall {
            model: "m".into(),
            messages: 1,
            wrap_up: false,
            forced_tool: None,
        },
    ]
}

fn tool_use_response(calls: &[(&str, &str, Value)]) -> EventKind {
    let content = calls
        .iter()
        .map(|(id, name, input)| ContentBlock::ToolUse {
            id: (*id).into(),
            name: (*name).into(),
            input: input.clone(),
        })
        .collect();
    EventKind::ModelResponse {
        redactions: Vec::new(),
        message: Message {
            role: Role::Assistant,
            content,
        },
        usage: Usage {
            input_tokens: 10,
            output_tokens: 5,
            ..Usage::default()
        },
        stop_reason: "tool_use".into(),
        duration_ms: 3,
        cost_usd_micros: 7,
        rejected: None,
    }
}

fn tool_call(
    run_id: Uuid,
    id: &str,
    name: &str,
    input: &Value,
    disposition: Disposition,
) -> EventKind {
    EventKind::ToolCall(ToolCallRecord {
        call_id: id.into(),
        name: name.into(),
        input: input.clone(),
        args_hash: args_hash(input),
        idempotency_key: format!("{run_id}:{id}"),
        disposition,
    })
}

/// Park the run at awaiting_approval for `calls` (id, tool, input).
pub async fn park_for_approval(log: &dyn RunLog, run_id: Uuid, calls: &[(&str, &str, Value)]) {
    park_for_approval_with_tools(log, run_id, calls, vec![]).await
}

/// Park the run at awaiting_approval for `calls`, its step offering `tools`.
pub async fn park_for_approval_with_tools(
    log: &dyn RunLog,
    run_id: Uuid,
    calls: &[(&str, &str, Value)],
    tools: Vec<glia_proto::ToolSpec>,
) {
    let mut kinds = to_model_call_with(tools);
    kinds.push(tool_use_response(calls));
    for (id, name, input) in calls {
        kinds.push(tool_call(run_id, id, name, input, Disposition::Approval));
        kinds.push(EventKind::ApprovalRequested {
            call_id: (*id).into(),
            tool: (*name).into(),
            input: input.clone(),
            args_hash: args_hash(input),
            expires_at: None,
            interrupted: false,
        });
    }
    let ids = calls.iter().map(|(id, _, _)| (*id).to_owned()).collect();
    kinds.push(EventKind::SessionPause {
        pull_point: PullPoint::AwaitingApproval { call_ids: ids },
    });
    commit(log, run_id, kinds).await
}

/// Park the run at awaiting_tool: `external` are external calls, `ran` a call a worker ran.
pub async fn park_for_tool(log: &dyn RunLog, run_id: Uuid) {
    let input = json!({"q": "weather"});
    let mut kinds = to_model_call();
    kinds.push(tool_use_response(&[
        ("ext1", "lookup", input.clone()),
        ("run1", "calc", json!({"x": 1})),
    ]));
    kinds.push(tool_call(
        run_id,
        "ext1",
        "lookup",
        &input,
        Disposition::External,
    ));
    kinds.push(tool_call(
        run_id,
        "run1",
        "calc",
        &json!({"x": 1}),
        Disposition::Run { reminder: None },
    ));
    kinds.push(EventKind::ToolResult {
        call_id: "run1".into(),
        content: "1".into(),
        reminder: None,
        duration_ms: 1,
        redactions: Vec::new(),
    });
    kinds.push(EventKind::SessionPause {
        pull_point: PullPoint::AwaitingTool {
            call_ids: vec!["ext1".into()],
        },
    });
    commit(log, run_id, kinds).await
}

/// Park a conversational run at awaiting_input.
pub async fn park_for_input(log: &dyn RunLog, run_id: Uuid) {
    let mut kinds = to_model_call();
    kinds.push(EventKind::ModelResponse {
        redactions: Vec::new(),
        message: Message::assistant("Hello."),
        usage: Usage::default(),
        stop_reason: "end_turn".into(),
        duration_ms: 1,
        cost_usd_micros: 0,
        rejected: None,
    });
    kinds.push(EventKind::StepEnd {
        index: 0,
        answer: "Hello.".into(),
        skipped: false,
    });
    kinds.push(EventKind::SessionPause {
        pull_point: PullPoint::AwaitingInput,
    });
    commit(log, run_id, kinds).await
}

/// Pause the run (budget or operator).
pub async fn park_paused(log: &dyn RunLog, run_id: Uuid, budget: bool) {
    let mut kinds = Vec::new();
    let reason = if budget {
        PauseReason::Budget {
            limit: Limit::Turns,
        }
    } else {
        kinds.push(EventKind::SessionPauseRequested {
            reason: "look".into(),
            by: None,
        });
        PauseReason::Operator {
            reason: "look".into(),
        }
    };
    kinds.push(EventKind::SessionPause {
        pull_point: PullPoint::Paused { reason },
    });
    commit(log, run_id, kinds).await
}

/// Finish a run from planning.
pub async fn finish(log: &dyn RunLog, run_id: Uuid) {
    let outcome = Outcome::Failed {
        error: "test".into(),
    };
    commit(log, run_id, vec![EventKind::SessionComplete { outcome }]).await
}

/// Everything the dispatcher could have written, to compare before/after.
#[derive(Debug, PartialEq)]
pub struct Snapshot {
    pub runs: Vec<(Uuid, u64)>,
    pub inboxes: Vec<(Uuid, usize)>,
    pub outbox: usize,
    pub queued: u64,
    pub cancelled: Vec<Uuid>,
}

pub async fn snapshot(h: &H) -> Snapshot {
    use glia_backends::Ledger;
    let runs = h
        .log
        .list_runs(&RunFilter {
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut inboxes = Vec::new();
    let mut cancelled = Vec::new();
    for r in &runs {
        inboxes.push((r.run_id, h.log.inbox(r.run_id).await.unwrap().len()));
        if h.ledger.is_cancelled(r.run_id).await.unwrap() {
            cancelled.push(r.run_id);
        }
    }
    Snapshot {
        runs: runs.iter().map(|r| (r.run_id, r.head_seq)).collect(),
        inboxes,
        outbox: h.log.outbox(100_000).await.unwrap().len(),
        queued: h.queue.depth().await.unwrap(),
        cancelled,
    }
}

pub fn state_of(events: &[Event]) -> RunState {
    RunState::replay(events[0].run_id, events).unwrap()
}

/// The dispatcher over the real adapters: Postgres (a database of its own),
/// RabbitMQ (a queue of its own, deleted by [`Real::cleanup`]) and Redis (a key prefix of
/// its own, deleted on drop), with the tokens of [`auth`].
pub struct Real {
    pub app: App,
    pub router: Router,
    pub log: Arc<glia_backends::postgres::PgLog>,
    pub queue: Arc<glia_backends::rabbitmq::RabbitQueue>,
    pub ledger: Arc<glia_backends::redis_ledger::RedisLedger>,
    _keys: glia_backends::testkit::RedisKeys,
    _db: glia_backends::testkit::TestDb,
}

impl Real {
    /// Connect to the machine's services (`GLIA_DATABASE_URL`,
    /// `GLIA_AMQP_URL`, `GLIA_REDIS_URL`, or their local defaults).
    pub async fn start() -> Real {
        let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
        let name = format!("glia_dt_{}", Uuid::now_v7().simple());
        let db = glia_backends::testkit::TestDb::new().await;
        let options = glia_backends::postgres::PgOptions {
            max_connections: 4,
            ..Default::default()
        };
        let log = Arc::new(db.log_with(options).await);
        let amqp = env("GLIA_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f");
        let queue = Arc::new(
            glia_backends::rabbitmq::RabbitQueue::connect(
                &amqp,
                glia_backends::rabbitmq::QueueOptions::new(&name),
            )
            .await
            .expect("RabbitMQ"),
        );
        let redis = env("GLIA_REDIS_URL", "redis://127.0.0.1:6379");
        let ledger = Arc::new(
            glia_backends::redis_ledger::RedisLedger::connect(&redis, &name)
                .await
                .expect("Redis"),
        );
        let batches = glia_dispatcher::batches::BatchConfig {
            store: Some(log.clone()),
            admission: Default::default(),
        };
        let app = App::new(log.clone(), queue.clone(), ledger.clone(), auth())
            .with_batches(batches)
            .with_schedules(log.clone())
            .with_evals(log.clone());
        let router = glia_dispatcher::router(app.clone());
        Real {
            app,
            router,
            log,
            queue,
            ledger,
            _keys: glia_backends::testkit::RedisKeys {
                url: redis,
                prefix: name,
            },
            _db: db,
        }
    }

    pub async fn post(&self, uri: &str, token: &str, body: Value) -> Reply {
        send(
            &self.router,
            request(Method::POST, uri, Some(token), Some(&body)),
        )
        .await
    }

    pub async fn get(&self, uri: &str, token: &str) -> Reply {
        send(&self.router, request(Method::GET, uri, Some(token), None)).await
    }

    /// Delete the test's queues (the database and Redis keys go on drop).
    pub async fn cleanup(self) {
        let _ = self.queue.delete_topology().await;
    }

    /// Admit a run through the API; returns its id.
    pub async fn create(&self, token: &str, body: Value) -> Uuid {
        let r = self.post("/v1/runs", token, body).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
        r.body["run_id"].as_str().unwrap().parse().unwrap()
    }
}

/// Register `def` (a definition's JSON) for tenant `tenant`.
pub async fn register(h: &H, tenant: &str, def: Value) {
    let def: glia_proto::AgentDefinition = glia_proto::strict::from_json_value(def).unwrap();
    def.validate().unwrap();
    let text = serde_json::to_string(&def).unwrap();
    h.log
        .put_agent(tenant, &def.name, &text, &def.content_hash())
        .await
        .unwrap();
}

pub fn scripts(
    named: &[(&str, Vec<glia_agent::provider::ScriptedTurn>)],
) -> glia_agent::agent::Agent {
    let mut lib = glia_agent::provider::ScriptLibrary::default();
    for (name, turns) in named {
        lib.insert(name, turns.clone());
    }
    glia_agent::agent::Agent::new(Arc::new(lib))
}

/// What a worker does with one job of run `id`: open it under a lease,
/// apply what waits in its inbox (or go on when it is runnable), commit
/// the events and consume the items, let go. Answers the status.
pub async fn work(h: &H, agent: &glia_agent::agent::Agent, id: Uuid) -> glia_proto::Status {
    let mut state = h.log.load(id).await.unwrap();
    let inbox = h.log.inbox(id).await.unwrap();
    let lease = h
        .log
        .acquire(id, "test-worker", Duration::from_secs(30))
        .await
        .unwrap();
    let mut events = Vec::new();
    let mut consumed = Vec::new();
    if inbox.is_empty() {
        agent.advance(&mut state, None, &mut events).await.unwrap();
    }
    // A cancel waiting wins over everything before it, as the worker's
    // cancel flag makes it.
    let cancel = inbox.iter().find_map(|i| match &i.payload {
        Payload::Cancel { reason } => Some(reason.clone()),
        _ => None,
    });
    if let Some(reason) = cancel {
        agent
            .cancel(&mut state, &reason, &mut events)
            .await
            .unwrap();
    }
    for item in inbox {
        consumed.push(item.id);
        if state.outcome.is_some() {
            continue;
        }
        let payload = match item.payload {
            Payload::Cancel { reason } => {
                agent
                    .cancel(&mut state, &reason, &mut events)
                    .await
                    .unwrap();
                continue;
            }
            p => p,
        };
        agent
            .advance(&mut state, Some(payload), &mut events)
            .await
            .unwrap();
    }
    h.log
        .commit(&lease, &events, &state, &consumed)
        .await
        .unwrap();
    h.log.release(&lease).await.unwrap();
    state.status()
}

/// Every run (up to 1000), newest first.
pub async fn all_runs(h: &H) -> Vec<glia_backends::RunSummary> {
    h.log
        .list_runs(&RunFilter {
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
}

/// A worker job ([`work`]) for every run that can go on: runnable, or not
/// done with something waiting in its inbox.
pub async fn work_all(h: &H, agent: &glia_agent::agent::Agent) {
    for r in all_runs(h).await {
        let runnable = r.status == glia_backends::RunStatus::Runnable
            || (r.status != glia_backends::RunStatus::Done
                && !h.log.inbox(r.run_id).await.unwrap().is_empty());
        if runnable {
            work(h, agent, r.run_id).await;
        }
    }
}

/// `calculator`: adds (answers `{"result": 3}` whatever it is given).
pub struct Calculator;

impl glia_agent::tool::DynTool for Calculator {
    fn spec(&self) -> glia_proto::ToolSpec {
        glia_proto::ToolSpec {
            idempotent: true,
            ..glia_proto::ToolSpec::new(
                "calculator",
                "Add.",
                json!({"type": "object", "properties": {"op": {"type": "string"}, "a": {"type": "number"}, "b": {"type": "number"}}}),
            )
        }
    }

    fn call_raw(
        &self,
        _input: Value,
        _ctx: glia_agent::tool::ToolContext,
    ) -> futures::future::BoxFuture<'static, Result<String, glia_agent::tool::ToolFailure>> {
        Box::pin(async { Ok(json!({"result": 3}).to_string()) })
    }
}
