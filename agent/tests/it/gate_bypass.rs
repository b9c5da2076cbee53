//! The gate-bypass suite (issue 28, "Must show"): a generated product of
//! tool source (the worker's own tool, an HTTP tool, an external tool, MCP
//! tools from a trusted and an untrusted server over stdio and over
//! streamable HTTP), every combination of the four MCP annotation hints
//! (true / false / absent), who writes the approval policy (the operator's
//! catalogue, the agent definition, the run's config, nobody) and how the
//! policy names the tool (exactly, with a typo, in another case, a name no
//! tool has, or a tool that was allowed and then removed).
//!
//! The MCP tools come from glia's own lying server (`glia_testkit::lying_mcp`,
//! the `lying-mcp` binary over stdio and the same server over streamable
//! HTTP): every tool writes to an effects file whatever its annotations
//! claim, so the suite counts real executions, not what glia reported. The
//! HTTP tool is a real HTTP endpoint that does the same; the worker's tool
//! writes the same file; an external tool's execution is the caller's,
//! which this test plays.
//!
//! For each case: a name that does not resolve exactly is refused at
//! admission (`RunConfig::validate`, `Catalogue::admit`) or fails the run
//! at step start naming the field, with no execution; a tool that needed
//! approval never ran before one (and ran exactly once after it); a call a
//! crash interrupted after it finished runs again only when someone the
//! operator trusts said it is idempotent.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use glia_agent::agent::Agent;
use glia_agent::catalogue::Catalogue;
use glia_agent::provider::{ScriptedProvider, ScriptedTurn};
use glia_agent::tool::{Tool, ToolContext, ToolFailure, ToolRegistry};
use glia_agent::tool_sources::ToolSources;
use glia_proto::{
    AgentRef, Decision, Event, EventKind, McpToolSource, Outcome, Payload, Policy, PolicyAction,
    PullPoint, RunConfig, RunState, Status, ToolPolicy, ToolSpec,
};
use glia_testkit::lying_mcp::{self, GET_ENV};
use serde_json::{Value, json};
use uuid::Uuid;

/// The worker's own consequential tool: appends `wt_refund KEY` to the effects file.
struct WorkerRefund(PathBuf);

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct NoArgs {}

impl Tool for WorkerRefund {
    type Args = NoArgs;
    type Output = Value;
    fn name(&self) -> &str {
        "wt_refund"
    }
    fn description(&self) -> &str {
        "Refund (the worker's own tool)."
    }
    async fn call(&self, _: NoArgs, ctx: ToolContext) -> Result<Value, ToolFailure> {
        append(&self.0, "wt_refund", &ctx.idempotency_key);
        Ok(json!("refunded"))
    }
}

fn append(path: &Path, tool: &str, key: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("effects file");
    writeln!(f, "{tool} {key}").expect("effects written");
}

/// A real HTTP endpoint for the HTTP tool: `POST /refund` appends
/// `http_refund KEY` (the `Idempotency-Key` header) to the effects file.
async fn http_endpoint(effects: PathBuf) -> String {
    let app = axum::Router::new().route(
        "/refund",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let effects = effects.clone();
            async move {
                let key = headers
                    .get("idempotency-key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_owned();
                append(&effects, "http_refund", &key);
                axum::Json(json!({"refunded": true}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    origin
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Worker,
    Http,
    External,
    /// (streamable HTTP, trusted)
    Mcp(bool, bool),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Writer {
    Nobody,
    Operator,
    Agent,
    Run,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Name {
    Exact,
    Typo,
    Case,
    Unknown,
    Removed,
}

impl Name {
    fn of(self, exact: &str) -> String {
        match self {
            Name::Exact | Name::Removed => exact.to_owned(),
            Name::Typo => exact.replace('_', "-"),
            Name::Case => exact.to_ascii_uppercase(),
            Name::Unknown => "no_such_tool".to_owned(),
        }
    }
}

/// Everything the cases share: one catalogue (MCP servers for every
/// transport × trust × operator policy), one set of running servers, the
/// HTTP endpoint, the effects and hide files.
struct World {
    sources: Arc<ToolSources>,
    catalogue: Catalogue,
    effects: PathBuf,
    hide: PathBuf,
    origin: String,
    _dir: glia_testkit::TempDir,
}

/// The catalogue name of the server for (transport, trust, operator policy naming).
fn server_name(http: bool, trusted: bool, operator: Option<Name>) -> String {
    let op = match operator {
        None => "plain".to_owned(),
        Some(n) => format!("op_{n:?}").to_ascii_lowercase(),
    };
    format!(
        "{}_{}_{op}",
        if http { "http" } else { "stdio" },
        if trusted { "trusted" } else { "untrusted" }
    )
}

const OPERATOR_NAMES: [Name; 4] = [Name::Exact, Name::Typo, Name::Case, Name::Unknown];

impl World {
    async fn start() -> World {
        let dir = glia_testkit::TempDir::new();
        let effects = dir.path().join("effects");
        let hide = dir.path().join("hide");
        std::fs::write(&hide, "").unwrap();
        let bin = lying_mcp::lying_mcp_bin();
        let mcp_url = lying_mcp::spawn_http(&effects, Some(hide.clone())).await;
        let origin = http_endpoint(effects.clone()).await;
        let tools: Vec<String> = lying_mcp::combinations()
            .into_iter()
            .map(lying_mcp::tool_name)
            .chain([GET_ENV.to_owned()])
            .collect();
        let mut toml = format!("[http]\nallowed_origins = [{origin:?}]\n\n");
        for http in [false, true] {
            for trusted in [false, true] {
                for operator in std::iter::once(None).chain(OPERATOR_NAMES.map(Some)) {
                    toml.push_str(&format!(
                        "[mcp_servers.{}]\n",
                        server_name(http, trusted, operator)
                    ));
                    if http {
                        toml.push_str(&format!(
                            "transport = \"streamable_http\"\nurl = {mcp_url:?}\n"
                        ));
                    } else {
                        toml.push_str(&format!(
                            "transport = \"stdio\"\ncommand = {:?}\nargs = [\"stdio\", {:?}, {:?}]\n",
                            bin.display().to_string(),
                            effects.display().to_string(),
                            hide.display().to_string()
                        ));
                    }
                    toml.push_str(&format!(
                        "trust = \"{}\"\n",
                        if trusted { "trusted" } else { "untrusted" }
                    ));
                    if let Some(name) = operator {
                        let entries: Vec<String> = tools
                            .iter()
                            .map(|t| format!("{:?} = \"require_approval\"", name.of(t)))
                            .collect();
                        let mut entries = entries;
                        entries.dedup();
                        toml.push_str(&format!("policy = {{ {} }}\n", entries.join(", ")));
                    }
                    toml.push('\n');
                }
            }
        }
        let catalogue = Catalogue::parse(&toml, "<gate-bypass>").expect("valid catalogue");
        let sources = Arc::new(
            ToolSources::start(catalogue.clone()).with_connect_wait(Duration::from_secs(120)),
        );
        World {
            sources,
            catalogue,
            effects,
            hide,
            origin,
            _dir: dir,
        }
    }

    /// Executions recorded for `run_id` (keys start with it).
    fn executions(&self, run_id: Uuid) -> usize {
        let prefix = run_id.to_string();
        lying_mcp::effects(&self.effects)
            .iter()
            .filter(|(_, key)| key.starts_with(&prefix))
            .count()
    }

    fn agent(&self, turns: Vec<ScriptedTurn>) -> Agent {
        let mut tools = ToolRegistry::default();
        tools.register(WorkerRefund(self.effects.clone()));
        Agent::new(Arc::new(ScriptedProvider::new(turns)))
            .with_tools(tools)
            .with_tool_sources(self.sources.clone())
    }

    fn resumed_agent(&self, turns: Vec<ScriptedTurn>, served: usize) -> Agent {
        let mut tools = ToolRegistry::default();
        tools.register(WorkerRefund(self.effects.clone()));
        Agent::new(Arc::new(ScriptedProvider::new(turns).starting_at(served)))
            .with_tools(tools)
            .with_tool_sources(self.sources.clone())
    }
}

struct Case {
    source: Source,
    /// The MCP tool's hints (readOnly, destructive, idempotent, openWorld); `None` for other sources.
    hints: Option<[Option<bool>; 4]>,
    tool: String,
    writer: Writer,
    name: Name,
}

impl Case {
    fn label(&self) -> String {
        format!(
            "{:?} {} writer={:?} name={:?}",
            self.source, self.tool, self.writer, self.name
        )
    }

    /// Whether a call of the tool must wait for a person (the oracle, from
    /// the rules, independent of the worker's code).
    fn needs_approval(&self) -> bool {
        if self.writer != Writer::Nobody {
            return true;
        }
        match (self.source, self.hints) {
            (Source::Mcp(_, trusted), Some([r, d, ..])) => {
                d == Some(true) && !(trusted && r == Some(true))
            }
            _ => false,
        }
    }

    /// Whether a call a crash interrupted may run again (idempotent by the
    /// word of someone trusted: a trusted server's hints).
    fn may_rerun(&self) -> bool {
        match (self.source, self.hints) {
            (Source::Mcp(_, trusted), Some([r, _, i, _])) => {
                trusted && (r == Some(true) || i == Some(true))
            }
            _ => false,
        }
    }

    fn config(&self) -> RunConfig {
        let mut config = RunConfig::default();
        let written = self.name.of(&self.tool);
        match self.source {
            Source::Worker => {
                // Removed: the worker's tool is no longer in the run's allow list.
                config.tools = Some(if self.name == Name::Removed {
                    vec![]
                } else {
                    vec![self.tool.clone()]
                });
            }
            Source::Http => {
                if self.name != Name::Removed {
                    config.http_tools.push(glia_proto::HttpTool {
                        name: self.tool.clone(),
                        description: "Refund over HTTP.".into(),
                        input_schema: json!({"type": "object"}),
                        url: String::new(),
                        idempotent: false,
                        timeout_ms: 30_000,
                        max_response_bytes: 1 << 20,
                    });
                }
            }
            Source::External => {
                if self.name != Name::Removed {
                    config.external_tools.push(ToolSpec {
                        external: true,
                        ..ToolSpec::new(
                            self.tool.clone(),
                            "Refund (the caller's).",
                            json!({"type": "object"}),
                        )
                    });
                }
            }
            Source::Mcp(http, trusted) => {
                let operator =
                    (self.writer == Writer::Operator).then_some(if self.name == Name::Removed {
                        Name::Exact
                    } else {
                        self.name
                    });
                config.mcp.push(McpToolSource {
                    server: server_name(http, trusted, operator),
                    allow: vec![self.tool.clone()],
                });
            }
        }
        match self.writer {
            Writer::Nobody | Writer::Operator => {}
            Writer::Agent => {
                config.agent = Some(AgentRef {
                    name: "support".into(),
                    version: 1,
                    content_hash: format!("sha256:{}", "0".repeat(64)),
                });
                config.tool_policy.insert(
                    written,
                    ToolPolicy {
                        requires_approval: Some(true),
                        ..ToolPolicy::default()
                    },
                );
            }
            Writer::Run => config.policies.push(Policy {
                tool: written,
                args: None,
                action: PolicyAction::RequireApproval,
            }),
        }
        config
    }
}

/// What happened to one case.
#[derive(Debug)]
enum Verdict {
    /// Refused at admission: the field.
    Refused(String),
    /// The run failed (its error).
    Failed(String),
    /// The run succeeded after `approvals` approvals.
    Ran { approvals: usize },
}

async fn admit(world: &World, config: &RunConfig) -> Result<(), String> {
    config.validate().map_err(|e| e.field)?;
    world.catalogue.admit(config).map_err(|e| e.field)
}

/// Run the case to its end, approving what waits, playing the caller of
/// external tools; checks on the way that nothing ran before its approval.
async fn drive(world: &World, case: &Case, mut config: RunConfig) -> (Verdict, Uuid, Vec<Event>) {
    let run_id = Uuid::now_v7();
    if let Source::Http = case.source {
        for t in &mut config.http_tools {
            t.url = format!("{}/refund", world.origin);
        }
    }
    if let Err(field) = admit(world, &config).await {
        return (Verdict::Refused(field), run_id, Vec::new());
    }
    if case.name == Name::Removed && matches!(case.source, Source::Mcp(..)) {
        // Allowed at admission; the server then stops offering it.
        std::fs::write(&world.hide, format!("{}\n", case.tool)).unwrap();
    }
    let turns = vec![
        ScriptedTurn::call(&case.tool, json!({})),
        ScriptedTurn::text("done"),
    ];
    let agent = world.agent(turns);
    let mut log = Vec::new();
    let (mut state, mut status) = agent
        .run(run_id, "refund the order", config, &mut log)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", case.label()));
    let mut approvals = 0;
    let verdict = loop {
        match status {
            Status::Parked(PullPoint::AwaitingApproval { .. }) => {
                approvals += 1;
                assert_eq!(
                    world.executions(run_id),
                    0,
                    "{}: ran before its approval",
                    case.label()
                );
                let call = state
                    .pending_calls
                    .iter()
                    .find(|c| c.result.is_none())
                    .expect("a pending call")
                    .clone();
                let approve = Payload::Approval {
                    call_id: call.call_id,
                    args_hash: call.args_hash,
                    decision: Decision::Approve,
                    by: Some("tester".into()),
                    request_seq: None,
                };
                status = agent
                    .advance(&mut state, Some(approve), &mut log)
                    .await
                    .unwrap();
            }
            Status::Parked(PullPoint::AwaitingTool { .. }) => {
                let call = state
                    .pending_calls
                    .iter()
                    .find(|c| c.result.is_none())
                    .expect("a pending call")
                    .clone();
                append(
                    &world.effects,
                    &case.tool,
                    &format!("{run_id}:{}", call.call_id),
                );
                let result = Payload::ToolResult {
                    call_id: call.call_id,
                    content: "refunded".into(),
                    is_error: false,
                };
                status = agent
                    .advance(&mut state, Some(result), &mut log)
                    .await
                    .unwrap();
            }
            Status::Done(Outcome::Succeeded { .. }) => break Verdict::Ran { approvals },
            Status::Done(Outcome::Failed { error }) => break Verdict::Failed(error),
            other => panic!("{}: unexpected status {other:?}", case.label()),
        }
    };
    std::fs::write(&world.hide, "").unwrap();
    (verdict, run_id, log)
}

/// A crash right after the call finished (its result lost): replay the log
/// up to the event before the first result and advance in a fresh agent.
/// Answers the executions of the run afterwards.
async fn crash_after_call(world: &World, case: &Case, run_id: Uuid, log: &[Event]) -> usize {
    let cut = log
        .iter()
        .position(|e| matches!(e.kind, EventKind::ToolResult { .. }))
        .expect("the call has a result");
    let mut state = RunState::replay(run_id, &log[..cut]).expect("a prefix replays");
    let turns = vec![
        ScriptedTurn::call(&case.tool, json!({})),
        ScriptedTurn::text("done"),
    ];
    let agent = world.resumed_agent(turns, 1);
    let mut tail = log[..cut].to_vec();
    let status = agent
        .advance(&mut state, None, &mut tail)
        .await
        .unwrap_or_else(|e| panic!("{}: resume: {e}", case.label()));
    assert!(
        matches!(status, Status::Done(_)),
        "{}: {status:?}",
        case.label()
    );
    world.executions(run_id)
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let names = [
        Name::Exact,
        Name::Typo,
        Name::Case,
        Name::Unknown,
        Name::Removed,
    ];
    for (source, tool) in [
        (Source::Worker, "wt_refund"),
        (Source::Http, "http_refund"),
        (Source::External, "ext_refund"),
    ] {
        for writer in [Writer::Nobody, Writer::Agent, Writer::Run] {
            for name in names {
                if writer == Writer::Nobody && name != Name::Exact {
                    continue;
                }
                cases.push(Case {
                    source,
                    hints: None,
                    tool: tool.into(),
                    writer,
                    name,
                });
            }
        }
    }
    for http in [false, true] {
        for trusted in [false, true] {
            for hints in lying_mcp::combinations() {
                for writer in [Writer::Nobody, Writer::Operator, Writer::Agent, Writer::Run] {
                    for name in names {
                        if writer == Writer::Nobody && name != Name::Exact && name != Name::Removed
                        {
                            continue;
                        }
                        cases.push(Case {
                            source: Source::Mcp(http, trusted),
                            hints: Some(hints),
                            tool: lying_mcp::tool_name(hints),
                            writer,
                            name,
                        });
                    }
                }
            }
        }
    }
    cases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_gate_bypass_over_sources_annotations_writers_and_names() {
    let world = World::start().await;
    let cases = cases();
    let (mut refused, mut failed, mut gated, mut ungated, mut reruns) = (0, 0, 0, 0, 0);
    for case in &cases {
        let config = case.config();
        let (verdict, run_id, log) = drive(&world, case, config).await;
        let label = case.label();
        match (case.name, verdict) {
            (Name::Exact, Verdict::Ran { approvals }) => {
                let needs = case.needs_approval();
                assert_eq!(approvals, usize::from(needs), "{label}: approvals");
                assert_eq!(
                    world.executions(run_id),
                    1,
                    "{label}: exactly one execution"
                );
                if needs {
                    gated += 1
                } else {
                    ungated += 1
                }
                // The resolved policy recorded for the tool agrees.
                let spec = log.iter().find_map(|e| match &e.kind {
                    EventKind::StepStart { tools, .. } => {
                        tools.iter().find(|t| t.name == case.tool).cloned()
                    }
                    _ => None,
                });
                let policy = spec
                    .and_then(|s| s.policy)
                    .unwrap_or_else(|| panic!("{label}: no resolved policy in step.start"));
                assert_eq!(
                    policy.requires_approval,
                    needs,
                    "{label}: {}",
                    policy.describe()
                );
                // A crash after the call finished: run again only on a trusted word.
                if case.source != Source::External {
                    let after = crash_after_call(&world, case, run_id, &log).await;
                    let expected = if case.may_rerun() { 2 } else { 1 };
                    assert_eq!(
                        after,
                        expected,
                        "{label}: executions after a crash that lost the result ({})",
                        policy.describe()
                    );
                    reruns += usize::from(expected == 2);
                }
            }
            (Name::Exact, other) => panic!("{label}: an exact name must run, got {other:?}"),
            (_, Verdict::Refused(field)) => {
                assert_eq!(world.executions(run_id), 0, "{label}");
                let expected = [
                    "policies[0].tool",
                    "tool_policy.",
                    "tools[0]",
                    "mcp[0].allow[0]",
                ];
                assert!(
                    expected.iter().any(|f| field.starts_with(f)),
                    "{label}: refused naming {field}"
                );
                refused += 1;
            }
            (_, Verdict::Failed(error)) => {
                assert_eq!(
                    world.executions(run_id),
                    0,
                    "{label}: the failed run executed the tool"
                );
                let expected = [
                    "policies[0].tool",
                    "tool_policy.",
                    "mcp[0].allow[0]",
                    "mcp_servers.",
                ];
                assert!(
                    expected.iter().any(|f| error.contains(f)),
                    "{label}: the failure names no field: {error}"
                );
                failed += 1;
            }
            (_, Verdict::Ran { approvals }) => {
                panic!(
                    "{label}: a name that does not resolve exactly ran ({approvals} approvals, {} executions)",
                    world.executions(run_id)
                )
            }
        }
    }
    eprintln!(
        "{} cases: {gated} gated, {ungated} ungated, {refused} refused at admission, {failed} failed at step start, {reruns} trusted re-runs",
        cases.len()
    );
    assert!(
        gated > 0 && ungated > 0 && refused > 0 && failed > 0 && reruns > 0,
        "every branch is exercised"
    );
    world.sources.shutdown().await;
}

/// The operator keeps the env-dumping tool from tenants: a tenant allowing
/// it is refused at admission, and a worker whose catalogue denies it
/// after admission fails the run at step start; it never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_deny_and_allow_lists_keep_get_env_from_tenants() {
    let dir = glia_testkit::TempDir::new();
    let effects = dir.path().join("effects");
    let url = lying_mcp::spawn_http(&effects, None).await;
    let toml = format!(
        "[mcp_servers.denied]\ntransport = \"streamable_http\"\nurl = {url:?}\ntools_deny = [\"get_env\"]\n\n\
         [mcp_servers.listed]\ntransport = \"streamable_http\"\nurl = {url:?}\ntools_allow = [\"rt_df_it_oa\"]\n\n\
         [mcp_servers.open]\ntransport = \"streamable_http\"\nurl = {url:?}\n"
    );
    let catalogue = Catalogue::parse(&toml, "<env>").unwrap();
    for server in ["denied", "listed"] {
        let mut config = RunConfig::default();
        config.mcp.push(McpToolSource {
            server: server.into(),
            allow: vec!["rt_df_it_oa".into(), GET_ENV.into()],
        });
        let e = catalogue
            .admit(&config)
            .expect_err("get_env is not the tenant's to allow");
        assert_eq!(e.field, "mcp[0].allow[1]", "{server}: {e}");
        assert!(
            e.reason.contains(if server == "denied" {
                "tools_deny"
            } else {
                "tools_allow"
            }),
            "{e}"
        );
    }
    // A policy naming a tool differently from the operator's list is no way around it either.
    let mut config = RunConfig::default();
    config.mcp.push(McpToolSource {
        server: "denied".into(),
        allow: vec!["GET_ENV".into()],
    });
    config.validate().expect("well-formed");
    // Admitted by a dispatcher whose catalogue did not deny it yet: the
    // worker's catalogue does, and the run fails before any tool runs.
    let mut config = RunConfig::default();
    config.mcp.push(McpToolSource {
        server: "denied".into(),
        allow: vec![GET_ENV.into()],
    });
    let sources =
        Arc::new(ToolSources::start(catalogue).with_connect_wait(Duration::from_secs(60)));
    let agent = Agent::new(Arc::new(ScriptedProvider::new(vec![
        ScriptedTurn::call(GET_ENV, json!({})),
        ScriptedTurn::text("env"),
    ])))
    .with_tool_sources(sources.clone());
    let mut log = Vec::new();
    // The worker refuses it before `session.start` (its catalogue check),
    // or, for a run already started, fails it at its next step's tools.
    match agent.run(Uuid::now_v7(), "dump it", config, &mut log).await {
        Err(glia_agent::agent::AgentError::Config(error))
        | Ok((_, Status::Done(Outcome::Failed { error }))) => {
            assert!(
                error.contains("mcp[0].allow[0]") && error.contains("tools_deny"),
                "{error}"
            )
        }
        Ok((_, other)) => panic!("expected a refused or failed run, got {other:?}"),
        Err(e) => panic!("expected a refused or failed run, got {e}"),
    }
    assert!(lying_mcp::effects(&effects).is_empty(), "get_env never ran");
    sources.shutdown().await;
}
