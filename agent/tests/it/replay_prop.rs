//! The central property of the loop: its log is the run. For random scripted
//! conversations driven through random pull points, replaying any prefix of
//! the log succeeds, and wherever the live state can be observed (each return
//! of `advance`, each commit barrier) it equals the replay. The same scenario
//! always gives the same log; a run that goes through JSON whenever it stops
//! (and continues on a freshly built agent) writes exactly the log of an
//! uninterrupted run; and a worker that dies at any event is replaced by one
//! that rebuilds the state from the log and carries on.
//!
//! A scenario is a script of model turns (answers, single and parallel calls
//! to typed tools, an external tool, a tool under an approval policy, unknown
//! tools, invalid arguments, plans, structured answers, provider failures),
//! a run configuration (conversational or not, planner, output schema, small
//! budgets, a small per-turn model-call cap, a compactor) and a list of
//! choices the driver makes at each pull point (approve, reject or edit; post
//! an external result; send a message or close; extend the budget; resume;
//! cancel; and, before that, sometimes a payload that does not fit, which
//! must be refused without a trace). Every model request goes through
//! `ScriptedProvider`, which panics on a request a provider would reject.
//!
//! Two more properties check the loop's semantics on the same scenarios
//! (steps end on fresh answers, budgets hold), and the cases they found are
//! pinned as plain tests at the end.

use crate::common;

use std::future::Future;
use std::sync::Arc;

use chrono::DateTime;
use common::Add;
use glia_agent::compact::{DropOldest, Summarize};
use glia_agent::hooks::{Hooks, Verdict};
use glia_agent::policy::Guardrail;
use glia_agent::provider::{ScriptedProvider, ScriptedTurn};
use glia_agent::tool::{Tool, ToolContext, ToolFailure, ToolRegistry};
use glia_agent::{Agent, AgentError, EventSink, FixedClock, SinkError, async_trait};
use glia_proto::{
    ApprovalStatus, BudgetLimits, Decision, Disposition, Event, EventKind, HookTopic, Outcome,
    PauseReason, Payload, PlannerKind, Policy, PolicyAction, PullPoint, RunConfig, RunState,
    Status, StopAction, StopPolicy, ToolSpec,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

const RUN_ID: Uuid = Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_00aa);

/// Calls to `advance` (or `close` / `cancel`) before the driver gives up.
const MAX_STEPS: usize = 48;

/// Texts the scenario draws from; several trigger hooks, policies or
/// guardrails (see [`agent`] and [`config`]).
const WORDS: &[&str] = &[
    "ok",
    "42",
    "héllo ✓ 🦀",
    "please review",
    "BAD",
    "shout it",
    "cancel",
    "secret",
    "ask them",
    "",
];

// ----- tools -----------------------------------------------------------------

#[derive(Deserialize, JsonSchema)]
struct EchoArgs {
    text: String,
}

/// Returns its text.
struct Echo;

impl Tool for Echo {
    type Args = EchoArgs;
    type Output = String;
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "Repeat the text."
    }
    async fn call(&self, args: EchoArgs, _ctx: ToolContext) -> Result<String, ToolFailure> {
        Ok(args.text)
    }
}

#[derive(Deserialize, JsonSchema)]
struct RefundArgs {
    order: String,
    amount: u64,
}

/// Refunds up to 100; fails above. Runs only after approval (see [`config`]).
struct Refund;

impl Tool for Refund {
    type Args = RefundArgs;
    type Output = Value;
    fn name(&self) -> &str {
        "refund"
    }
    fn description(&self) -> &str {
        "Refund an order."
    }
    async fn call(&self, args: RefundArgs, ctx: ToolContext) -> Result<Value, ToolFailure> {
        if args.amount > 100 {
            return Err(ToolFailure::failed(format!(
                "refund of {} for {} needs a manager",
                args.amount, args.order
            )));
        }
        Ok(json!({ "refunded": args.amount, "order": args.order, "key": ctx.idempotency_key }))
    }
}

fn lookup_spec() -> ToolSpec {
    ToolSpec {
        name: "lookup".into(),
        description: "Look something up; the client answers.".into(),
        input_schema: json!({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}),
        idempotent: false,
        timeout_ms: 1000,
        external: true,
        return_direct: false,
        cancel_grace_ms: glia_proto::DEFAULT_CANCEL_GRACE_MS,
        source: None,
        policy: None,
        max_result_bytes: None,
        output_schema: None,
    }
}

fn output_schema() -> Value {
    json!({"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]})
}

// ----- scenarios -------------------------------------------------------------

#[derive(Debug, Clone)]
enum Call {
    Add(i64, i64),
    /// `add` with arguments that fail its schema.
    AddInvalid,
    Echo(&'static str),
    Refund(u64),
    /// The external tool.
    Lookup(&'static str),
    /// A tool nobody registered.
    Unknown,
    /// Issue 32: the agent tool `helper` (a child run answers it).
    Agent(&'static str),
}

impl Call {
    fn scripted(&self) -> (&'static str, Value) {
        match self {
            Call::Add(a, b) => ("add", json!({ "a": a, "b": b })),
            Call::AddInvalid => ("add", json!({ "a": "two" })),
            Call::Echo(text) => ("echo", json!({ "text": text })),
            Call::Refund(amount) => ("refund", json!({ "order": "A-1", "amount": amount })),
            Call::Lookup(q) => ("lookup", json!({ "q": q })),
            Call::Unknown => ("no_such_tool", json!({})),
            Call::Agent(goal) => ("helper", json!({ "goal": goal })),
        }
    }
}

#[derive(Debug, Clone)]
enum Turn {
    Answer {
        text: &'static str,
        thinking: bool,
    },
    Calls {
        calls: Vec<Call>,
        text: Option<&'static str>,
    },
    /// A `submit_plan` call: the model planner's answer.
    Plan(Vec<&'static str>),
    /// A `final_output` call, with arguments that match the schema or not.
    Final {
        valid: bool,
    },
    /// A provider failure: `transient`, `rate_limited` or `spend_cap`.
    Fail(&'static str),
    /// An answer that stopped for a reason that is not a finished turn
    /// (`max_tokens`, `refusal`, `content_filter`, an unknown one).
    BadStop(&'static str),
}

impl Turn {
    fn scripted(&self) -> ScriptedTurn {
        match self {
            Turn::Answer { text, thinking } => ScriptedTurn {
                thinking: thinking.then(|| "let me think".to_owned()),
                text: Some((*text).to_owned()),
                ..ScriptedTurn::default()
            },
            Turn::Calls { calls, text } => {
                let calls: Vec<(&str, Value)> = calls.iter().map(Call::scripted).collect();
                ScriptedTurn {
                    text: text.map(str::to_owned),
                    ..ScriptedTurn::calls(&calls)
                }
            }
            Turn::Plan(steps) => ScriptedTurn::call("submit_plan", json!({ "steps": steps })),
            Turn::Final { valid: true } => {
                ScriptedTurn::call("final_output", json!({ "answer": "forty-two" }))
            }
            Turn::Final { valid: false } => {
                ScriptedTurn::call("final_output", json!({ "answer": 42 }))
            }
            Turn::Fail(kind) => ScriptedTurn {
                error: Some((*kind).to_owned()),
                ..ScriptedTurn::default()
            },
            Turn::BadStop(reason) => ScriptedTurn {
                stop_reason: Some((*reason).to_owned()),
                ..ScriptedTurn::text("the answer is par")
            },
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Compaction {
    None,
    DropOldest,
    Summarize,
}

#[derive(Debug, Clone)]
struct Scenario {
    goal: &'static str,
    turns: Vec<Turn>,
    conversational: bool,
    planner: PlannerKind,
    structured: bool,
    max_turns: Option<u64>,
    max_tool_calls: Option<u64>,
    max_model_calls_per_turn: u32,
    compaction: Compaction,
    /// User messages a conversational run gets before it is closed.
    inputs: usize,
    /// The driver's decisions, used in turn and cyclically.
    choices: Vec<u8>,
}

fn word() -> impl Strategy<Value = &'static str> {
    prop::sample::select(WORDS)
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        3 => (-3..10i64, -3..10i64).prop_map(|(a, b)| Call::Add(a, b)),
        1 => Just(Call::AddInvalid),
        2 => word().prop_map(Call::Echo),
        2 => prop::sample::select(vec![5u64, 50, 500]).prop_map(Call::Refund),
        2 => word().prop_map(Call::Lookup),
        1 => Just(Call::Unknown),
        2 => word().prop_map(Call::Agent),
    ]
}

fn turn() -> impl Strategy<Value = Turn> {
    let steps = prop::collection::vec(
        prop::sample::select(vec!["look it up", "skip this", "answer", "please review"]),
        0..3,
    );
    prop_oneof![
        4 => (word(), any::<bool>()).prop_map(|(text, thinking)| Turn::Answer { text, thinking }),
        3 => (prop::collection::vec(call(), 1..2), prop::option::of(word())).prop_map(|(calls, text)| Turn::Calls { calls, text }),
        3 => (prop::collection::vec(call(), 2..4), prop::option::of(word())).prop_map(|(calls, text)| Turn::Calls { calls, text }),
        1 => steps.prop_map(Turn::Plan),
        1 => any::<bool>().prop_map(|valid| Turn::Final { valid }),
        1 => prop::sample::select(vec!["transient", "rate_limited", "spend_cap"]).prop_map(Turn::Fail),
        1 => prop::sample::select(vec!["max_tokens", "refusal", "content_filter", "eos"]).prop_map(Turn::BadStop),
    ]
}

fn scenario() -> impl Strategy<Value = Scenario> {
    let shape = (
        word(),
        prop::collection::vec(turn(), 1..10),
        any::<bool>(),
        prop_oneof![3 => Just(PlannerKind::Single), 1 => Just(PlannerKind::Model)],
        prop::bool::weighted(0.25),
    );
    let limits = (
        prop::option::of(1..5u64),
        prop::option::of(0..4u64),
        prop_oneof![Just(1u32), Just(2), Just(3), Just(16)],
        prop_oneof![2 => Just(Compaction::None), 1 => Just(Compaction::DropOldest), 1 => Just(Compaction::Summarize)],
        0..4usize,
        prop::collection::vec(any::<u8>(), 1..24),
    );
    (shape, limits).prop_map(
        |(
            (goal, mut turns, conversational, planner, structured),
            (max_turns, max_tool_calls, max_model_calls_per_turn, compaction, inputs, choices),
        )| {
            // The model planner's first request wants a plan.
            if planner == PlannerKind::Model
                && !matches!(turns.first(), Some(Turn::Plan(steps)) if !steps.is_empty())
            {
                turns.insert(0, Turn::Plan(vec!["look it up", "answer"]));
            }
            Scenario {
                goal,
                turns,
                conversational,
                planner,
                structured,
                max_turns,
                max_tool_calls,
                max_model_calls_per_turn,
                compaction,
                inputs,
                choices,
            }
        },
    )
}

/// `refund` needs approval, and so does `lookup` when asked to "ask"; `echo`
/// may not repeat secrets; `add` with `a = 7` gets a reminder.
fn config(s: &Scenario) -> RunConfig {
    RunConfig {
        external_tools: vec![lookup_spec()],
        // Issue 32: one agent offered as a tool.
        agents: vec!["helper@1".into()],
        child_agents: vec![glia_proto::ChildAgent {
            name: "helper".into(),
            version: 1,
            content_hash: format!("sha256:{}", "0".repeat(64)),
            description: "Helps.".into(),
        }],
        policies: vec![
            Policy {
                tool: "refund".into(),
                args: None,
                action: PolicyAction::RequireApproval,
            },
            Policy {
                tool: "lookup".into(),
                args: Some("ask".into()),
                action: PolicyAction::RequireApproval,
            },
            Policy {
                tool: "echo".into(),
                args: Some("secret".into()),
                action: PolicyAction::Deny {
                    reason: "no secrets".into(),
                },
            },
            Policy {
                tool: "add".into(),
                args: Some(r#""a":7\b"#.into()),
                action: PolicyAction::Remind {
                    text: "sevens are lucky".into(),
                },
            },
        ],
        budget: BudgetLimits {
            max_turns: s.max_turns,
            max_tool_calls: s.max_tool_calls,
            ..BudgetLimits::default()
        },
        max_model_calls_per_turn: s.max_model_calls_per_turn,
        conversational: s.conversational,
        planner: s.planner,
        output_schema: s.structured.then(output_schema),
        max_reasks: 1,
        // Cut-off answers re-asked or paused, refusals failed or paused, by the scenario's first choice.
        stop_reasons: StopPolicy {
            truncated: if s.choices[0].is_multiple_of(2) {
                StopAction::Reask
            } else {
                StopAction::Pause
            },
            refusal: if s.choices[0].is_multiple_of(3) {
                StopAction::Pause
            } else {
                StopAction::Fail
            },
            ..StopPolicy::default()
        },
        ..RunConfig::default()
    }
}

/// A worker: the tools, hooks that modify, cancel, skip and pause, guardrails
/// on "BAD", the scenario's compactor and a clock that never moves.
fn agent(provider: &Arc<ScriptedProvider>, compaction: Compaction) -> Agent {
    let mut tools = ToolRegistry::default();
    tools.register(Add).register(Echo).register(Refund);
    let mut hooks = Hooks::default();
    hooks
        .on(HookTopic::BeforeToolCall, "shouter", |p| {
            match p["input"]["text"].as_str() {
                Some("cancel") => return Verdict::Cancel("cancelled on request".into()),
                Some(t) if t.starts_with("shout") => {
                    p["input"]["text"] = Value::String(t.to_uppercase())
                }
                _ => {}
            }
            Verdict::Continue
        })
        .on(HookTopic::AfterToolCall, "tagger", |p| {
            if let Some(c) = p["content"].as_str().filter(|c| c.contains("42")) {
                p["content"] = Value::String(format!("{c} (checked)"));
            }
            Verdict::Continue
        })
        .on(HookTopic::BeforeStep, "skipper", |p| {
            if p["description"]
                .as_str()
                .is_some_and(|d| d.contains("skip"))
            {
                Verdict::Skip
            } else {
                Verdict::Continue
            }
        })
        .on(HookTopic::AfterStep, "reviewer", |p| {
            if p["answer"].as_str().is_some_and(|a| a.contains("review")) {
                Verdict::Pause("a person reviews this answer".into())
            } else {
                Verdict::Continue
            }
        });
    let no_bad = |t: &str| {
        if t.contains("BAD") {
            Err("says BAD".to_owned())
        } else {
            Ok(())
        }
    };
    let agent = Agent::new(provider.clone())
        .with_tools(tools)
        .with_hooks(hooks)
        .with_input_guardrail(Guardrail::new("no-bad-input", no_bad))
        .with_output_guardrail(Guardrail::new("no-bad-output", no_bad))
        .with_clock(FixedClock(DateTime::UNIX_EPOCH));
    match compaction {
        Compaction::None => agent,
        Compaction::DropOldest => agent.with_compactor(DropOldest {
            max_tokens: 150,
            keep_recent: 1,
        }),
        Compaction::Summarize => agent.with_compactor(Summarize {
            max_tokens: 150,
            keep_recent: 1,
        }),
    }
}

// ----- the sink ----------------------------------------------------------------

/// Keeps the log and, next to it, the state replay gives after each event:
/// `states[k]` is the state after `log[..k]`. An event replay refuses fails
/// the sink, so the loop stops right there. At each commit barrier it keeps
/// the live state the loop hands over, with the log length at that moment.
///
/// It can also play a dying worker: when the log is `crash_at` events long,
/// the next event is lost and the sink fails (once per entry).
struct Recorder {
    log: Vec<Event>,
    states: Vec<RunState>,
    commits: Vec<(usize, RunState)>,
    crash_at: Vec<usize>,
    crashed: bool,
}

impl Recorder {
    fn new() -> Self {
        Recorder {
            log: Vec::new(),
            states: vec![RunState::new(RUN_ID)],
            commits: Vec::new(),
            crash_at: Vec::new(),
            crashed: false,
        }
    }
}

#[async_trait]
impl EventSink for Recorder {
    async fn record(&mut self, event: &Event) -> Result<(), SinkError> {
        if let Some(i) = self.crash_at.iter().position(|&at| at == self.log.len()) {
            self.crash_at.swap_remove(i);
            self.crashed = true;
            return Err(SinkError(format!(
                "the worker died before event {} was stored",
                event.seq
            )));
        }
        let mut next = self.states.last().expect("the initial state").clone();
        next.apply(event).map_err(|e| {
            SinkError(format!(
                "replay refused event {} ({}): {e}",
                event.seq,
                event.kind.name()
            ))
        })?;
        self.log.push(event.clone());
        self.states.push(next);
        Ok(())
    }

    async fn commit(&mut self, state: &RunState) -> Result<(), SinkError> {
        self.commits.push((self.log.len(), state.clone()));
        Ok(())
    }
}

// ----- the driver --------------------------------------------------------------

/// The scenario's choices, in turn and cyclically.
struct Choices<'a> {
    all: &'a [u8],
    next: usize,
}

impl Choices<'_> {
    /// A number below `n`.
    fn pick(&mut self, n: usize) -> usize {
        let c = self.all[self.next % self.all.len()];
        self.next += 1;
        usize::from(c) % n
    }

    fn one_in(&mut self, n: usize) -> bool {
        self.pick(n) == 0
    }
}

/// What the driver does next.
#[derive(Debug, Clone)]
enum Action {
    Advance(Option<Payload>),
    Close,
    Cancel,
}

/// The right payload for where the run is parked.
fn respond(
    state: &RunState,
    pull_point: &PullPoint,
    choices: &mut Choices<'_>,
    inputs_left: &mut usize,
) -> Action {
    if choices.one_in(24) {
        return Action::Cancel;
    }
    let resume = match pull_point {
        PullPoint::AwaitingApproval { .. } | PullPoint::AwaitingTool { .. } => {
            // Anything due: approvals, and external results (due at either).
            let due: Vec<_> = state
                .pending_calls
                .iter()
                .filter(|c| c.approval == ApprovalStatus::Requested || c.awaits_caller())
                .collect();
            assert!(
                !due.is_empty(),
                "parked at {pull_point:?} with nothing due: {:#?}",
                state.pending_calls
            );
            let call = due[choices.pick(due.len())];
            if call.approval == ApprovalStatus::Requested {
                let decision = match choices.pick(3) {
                    0 => Decision::Approve,
                    1 => Decision::Reject {
                        reason: "not today".into(),
                    },
                    _ => Decision::Edit {
                        input: edited(&call.name, choices),
                    },
                };
                Payload::Approval {
                    call_id: call.call_id.clone(),
                    args_hash: call.args_hash.clone(),
                    decision,
                    by: Some("ana".into()),
                    request_seq: None,
                }
            } else {
                let content = WORDS[choices.pick(WORDS.len())].to_owned();
                Payload::ToolResult {
                    call_id: call.call_id.clone(),
                    content,
                    is_error: choices.one_in(3),
                }
            }
        }
        PullPoint::AwaitingInput => {
            if *inputs_left == 0 {
                return Action::Close;
            }
            *inputs_left -= 1;
            let text = ["and then?", "BAD idea", "thanks, 42", "please review"][choices.pick(4)];
            Payload::Input {
                text: text.into(),
                redactions: Vec::new(),
            }
        }
        PullPoint::Paused {
            reason: PauseReason::Budget { .. },
        } => {
            let extra = BudgetLimits {
                max_turns: Some(1 + choices.pick(2) as u64),
                max_tool_calls: Some(1 + choices.pick(2) as u64),
                ..BudgetLimits::default()
            };
            Payload::ExtendBudget { extra }
        }
        PullPoint::Paused { .. } => Payload::Resume {
            by: Some("operator".into()),
        },
        // issue 32: waits (a time wake at the due time).
        PullPoint::AwaitingTimer { wake_at_ms, .. } => Payload::Wake {
            due_at_ms: *wake_at_ms,
            event: None,
        },
        PullPoint::AwaitingEvent { timeout_at_ms, .. } => Payload::Wake {
            due_at_ms: timeout_at_ms.unwrap_or(i64::MAX),
            event: None,
        },
        // Issue 32: a child ends, succeeded or not, with some spend.
        PullPoint::AwaitingChildren { call_ids } => {
            let call_id = call_ids[choices.pick(call_ids.len())].clone();
            let outcome = match choices.pick(3) {
                0 => Outcome::Succeeded {
                    answer: WORDS[choices.pick(WORDS.len())].to_owned(),
                    output: None,
                },
                1 => Outcome::Failed {
                    error: "the child failed".into(),
                },
                _ => Outcome::Cancelled {
                    reason: "cancelled".into(),
                },
            };
            Payload::ChildEnded {
                call_id,
                child_run_id: Some(uuid::Uuid::from_u128(choices.pick(1000) as u128)),
                outcome,
                usage: glia_proto::Usage {
                    input_tokens: choices.pick(50) as u64,
                    output_tokens: choices.pick(50) as u64,
                    ..glia_proto::Usage::default()
                },
                cost_usd_micros: choices.pick(100) as u64,
            }
        }
    };
    Action::Advance(Some(resume))
}

/// New arguments from an approver: valid or not.
fn edited(tool: &str, choices: &mut Choices<'_>) -> Value {
    match (tool, choices.pick(3)) {
        ("refund", 0) => json!({ "order": "A-1", "amount": 7 }),
        ("refund", 1) => json!({ "order": "A-1", "amount": 700 }),
        (_, 2) => json!({ "order": 5 }),
        _ => json!({ "q": "edited" }),
    }
}

/// A payload that does not fit where the run is parked.
fn misfit(pull_point: &PullPoint) -> Payload {
    match pull_point {
        PullPoint::AwaitingApproval { call_ids } => Payload::Approval {
            call_id: call_ids[0].clone(),
            args_hash: "0".repeat(64),
            decision: Decision::Approve,
            by: None,
            request_seq: None,
        },
        PullPoint::AwaitingTool { .. } => Payload::ToolResult {
            call_id: "no_such_call".into(),
            content: "x".into(),
            is_error: false,
        },
        PullPoint::AwaitingInput => Payload::Input {
            text: "  \n ".into(),
            redactions: Vec::new(),
        },
        // A closing message is only taken at awaiting_input.
        PullPoint::Paused { .. } => Payload::Close {
            text: Some("bye".into()),
            redactions: Vec::new(),
        },
        // issue 32: waits. A wake before anything is due ends nothing.
        PullPoint::AwaitingTimer { .. } | PullPoint::AwaitingEvent { .. } => Payload::Wake {
            due_at_ms: i64::MIN,
            event: None,
        },
        // Issue 32: the end of a child for a call that started none.
        PullPoint::AwaitingChildren { .. } => Payload::ChildEnded {
            call_id: "no_such_call".into(),
            child_run_id: None,
            outcome: Outcome::Failed { error: "x".into() },
            usage: glia_proto::Usage::default(),
            cost_usd_micros: 0,
        },
    }
}

/// How a scenario is driven.
#[derive(Debug, Clone, Default)]
struct Mode {
    /// Take the state through JSON whenever the driver has it, and run every
    /// step on a freshly built agent (the provider, with its script position,
    /// is shared: it stands for the model).
    checkpoint: bool,
    /// Log lengths at which the worker dies once the run has started (see
    /// [`Recorder`]); a new worker rebuilds the state from the log and
    /// carries on.
    crashes: Vec<usize>,
}

/// A driven run: the log, the replayed state after each prefix, and the live
/// state (with the log length then) each time the driver got control back and
/// at each commit barrier inside the loop.
struct Driven {
    log: Vec<Event>,
    states: Vec<RunState>,
    snapshots: Vec<(usize, RunState)>,
    commits: Vec<(usize, RunState)>,
    state: RunState,
}

/// Drive `s` until it is done or [`MAX_STEPS`] calls were made. Panics on
/// anything but a transient provider error or a planned crash: an invalid
/// request, an illegal event, a refused right payload, an accepted wrong one.
async fn drive(s: &Scenario, mode: Mode) -> Driven {
    let provider = Arc::new(ScriptedProvider::new(
        s.turns.iter().map(Turn::scripted).collect(),
    ));
    let mut worker = agent(&provider, s.compaction);
    let mut sink = Recorder::new();
    let mut state = worker
        .start(RUN_ID, s.goal, config(s), &mut sink)
        .await
        .expect("the run starts");
    sink.crash_at = mode.crashes;
    let mut snapshots = vec![(sink.log.len(), state.clone())];
    let mut choices = Choices {
        all: &s.choices,
        next: 0,
    };
    let mut inputs_left = s.inputs;
    for _ in 0..MAX_STEPS {
        let action = match state.status() {
            Status::Done(_) => break,
            Status::Runnable => Action::Advance(None),
            Status::Parked(pull_point) => {
                if choices.one_in(4) {
                    let before = (sink.log.len(), state.clone());
                    let wrong = misfit(&pull_point);
                    let result = worker
                        .advance(&mut state, Some(wrong.clone()), &mut sink)
                        .await;
                    assert!(
                        result.is_err(),
                        "{wrong:?} at {pull_point:?} was accepted: {result:?}"
                    );
                    assert_eq!(
                        (sink.log.len(), &state),
                        (before.0, &before.1),
                        "a refused payload changes nothing"
                    );
                }
                respond(&state, &pull_point, &mut choices, &mut inputs_left)
            }
        };
        let result = match &action {
            Action::Advance(input) => worker
                .advance(&mut state, input.clone(), &mut sink)
                .await
                .map(drop),
            Action::Close => worker.close(&mut state, &mut sink).await.map(drop),
            Action::Cancel if choices.one_in(2) => worker
                .cancel(&mut state, "the caller gave up", &mut sink)
                .await
                .map(drop),
            Action::Cancel => {
                let cancel = Payload::Cancel {
                    reason: "the caller gave up".into(),
                };
                worker
                    .advance(&mut state, Some(cancel), &mut sink)
                    .await
                    .map(drop)
            }
        };
        match result {
            Ok(()) | Err(AgentError::Provider(_)) => {}
            Err(AgentError::Sink(_)) if sink.crashed => {
                // The worker died; a new one starts from the log alone.
                sink.crashed = false;
                state = RunState::replay(RUN_ID, &sink.log).expect("the log replays");
                worker = agent(&provider, s.compaction);
            }
            Err(e) => panic!("{action:?} failed: {e}"),
        }
        snapshots.push((sink.log.len(), state.clone()));
        if mode.checkpoint {
            let json = serde_json::to_string(&state).expect("the state serialises");
            let back: RunState = serde_json::from_str(&json).expect("the checkpoint parses");
            assert_eq!(back, state, "the checkpoint round-trips");
            state = back;
            worker = agent(&provider, s.compaction);
        }
    }
    Driven {
        log: sink.log,
        states: sink.states,
        snapshots,
        commits: sink.commits,
        state,
    }
}

fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(f)
}

// ----- properties --------------------------------------------------------------

/// Every prefix replays to the state the sink computed event by event; the
/// live state equals the replay wherever it was observed; the log is
/// gap-free and survives JSON lines.
fn check_replay(run: &Driven) -> Result<(), TestCaseError> {
    prop_assert_eq!(run.state.head_seq as usize, run.log.len());
    for (i, e) in run.log.iter().enumerate() {
        prop_assert_eq!(e.seq as usize, i + 1);
        prop_assert_eq!(e.run_id, RUN_ID);
    }
    for k in 0..=run.log.len() {
        let replayed = RunState::replay(RUN_ID, &run.log[..k]);
        prop_assert_eq!(replayed.as_ref(), Ok(&run.states[k]), "prefix {}", k);
    }
    for (len, live) in run.snapshots.iter().chain(&run.commits) {
        prop_assert_eq!(&run.states[*len], live, "live state after {} events", len);
    }
    let lines: Vec<String> = run
        .log
        .iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect();
    let parsed: Vec<Event> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    prop_assert_eq!(&parsed, &run.log);
    prop_assert_eq!(RunState::replay(RUN_ID, &parsed), Ok(run.state.clone()));
    // Erasure (`glia_proto::erasure`): the tombstones replay, to the same
    // phase, head, usage and kind of outcome; erasing twice changes nothing.
    let erased: Vec<Event> = run.log.iter().map(Event::erased).collect();
    let twice: Vec<Event> = erased.iter().map(Event::erased).collect();
    prop_assert_eq!(&twice, &erased);
    let tomb = RunState::replay(RUN_ID, &erased);
    prop_assert!(
        tomb.is_ok(),
        "the tombstones replay: {:?}",
        tomb.as_ref().err()
    );
    let tomb = tomb.unwrap_or_else(|_| unreachable!());
    prop_assert_eq!(
        (tomb.phase, tomb.head_seq, &tomb.usage),
        (run.state.phase, run.state.head_seq, &run.state.usage)
    );
    prop_assert_eq!(
        tomb.outcome.as_ref().map(glia_proto::Outcome::erased),
        run.state.outcome.as_ref().map(glia_proto::Outcome::erased)
    );
    Ok(())
}

/// A step never ends on an answer the model gave before the step started or
/// before the user's latest message: an accepted model response (not a
/// rejected one, see `glia_proto::stop`) lies in between.
fn check_fresh_answers(log: &[Event]) -> Result<(), TestCaseError> {
    let mut answered = false;
    for e in log {
        match &e.kind {
            EventKind::StepStart { .. } | EventKind::InputReceived { .. } => answered = false,
            // A rejected answer (a bad stop) is no answer: a step never ends on it.
            EventKind::ModelResponse { rejected, .. } => answered = rejected.is_none(),
            EventKind::StepEnd {
                index,
                skipped: false,
                answer,
            } => {
                prop_assert!(
                    answered,
                    "step {} ended at seq {} on {:?} without an accepted answer\nlog: {:#?}",
                    index,
                    e.seq,
                    answer,
                    names(log)
                );
            }
            _ => {}
        }
    }
    Ok(())
}

/// Usage never passes the turn or tool-call limit in force.
fn check_budgets(run: &Driven) -> Result<(), TestCaseError> {
    let within = |max: Option<u64>, used: u64| max.is_none_or(|m| used <= m);
    for (k, state) in run.states.iter().enumerate() {
        prop_assert!(
            within(state.limits.max_turns, state.usage.turns)
                && within(state.limits.max_tool_calls, state.usage.tool_calls),
            "after event {}: used {:?}, limits {:?}\nlog: {:#?}",
            k,
            state.usage,
            state.limits,
            names(&run.log[..k])
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Replaying any prefix of the log succeeds, and wherever the live state
    /// could be observed (each return of `advance`, each commit barrier) it
    /// equals the replay.
    #[test]
    fn replay_equals_the_live_state_at_every_prefix(s in scenario()) {
        check_replay(&block_on(drive(&s, Mode::default())))?;
    }

    /// The same scenario gives the same log, byte for byte.
    #[test]
    fn the_same_scenario_gives_the_same_log(s in scenario()) {
        let first = block_on(drive(&s, Mode::default()));
        let second = block_on(drive(&s, Mode::default()));
        prop_assert_eq!(serde_json::to_string(&first.log).unwrap(), serde_json::to_string(&second.log).unwrap());
        prop_assert_eq!(first.state, second.state);
    }

    /// Going through JSON whenever the driver has the state, on a fresh agent
    /// each time, writes the log of an uninterrupted run.
    #[test]
    fn a_checkpointed_run_writes_the_same_log(s in scenario()) {
        let straight = block_on(drive(&s, Mode::default()));
        let checkpointed = block_on(drive(&s, Mode { checkpoint: true, ..Mode::default() }));
        prop_assert_eq!(&checkpointed.log, &straight.log);
        prop_assert_eq!(checkpointed.state, straight.state);
    }

    /// A worker that dies before storing any event is replaced by one that
    /// rebuilds the state from the log: every request stays valid, every
    /// event legal, and replay still equals the live state.
    #[test]
    fn a_dead_worker_is_replaced_from_the_log(s in scenario(), crashes in prop::collection::vec(1..60usize, 1..4)) {
        check_replay(&block_on(drive(&s, Mode { crashes, ..Mode::default() })))?;
    }

    #[test]
    fn a_step_ends_on_a_fresh_answer(s in scenario()) {
        check_fresh_answers(&block_on(drive(&s, Mode::default())).log)?;
    }

    #[test]
    fn budgets_are_never_overrun(s in scenario()) {
        check_budgets(&block_on(drive(&s, Mode::default())))?;
    }
}

/// The event names of `log`, with the details that explain a failure.
fn names(log: &[Event]) -> Vec<String> {
    log.iter()
        .map(|e| match &e.kind {
            EventKind::ToolCall(r) => format!("tool.call {} {:?}", r.name, r.disposition),
            EventKind::SessionPause { pull_point } => format!("session.pause {pull_point:?}"),
            EventKind::ApprovalResolved {
                call_id, decision, ..
            } => format!("approval.resolved {call_id} {decision:?}"),
            other => other.name().to_owned(),
        })
        .collect()
}

// ----- the generator reaches the interesting places ----------------------------

/// Over a fixed sample of scenarios, the driver parks at every kind of pull
/// point and the log shows every kind of decision, so the properties above
/// are not vacuous.
#[test]
fn the_scenarios_reach_every_pull_point_and_disposition() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..96 {
        let s = scenario()
            .new_tree(&mut runner)
            .expect("a scenario")
            .current();
        for e in block_on(drive(&s, Mode::default())).log {
            let key = match &e.kind {
                EventKind::SessionPause {
                    pull_point: PullPoint::Paused { reason },
                } => {
                    format!(
                        "paused {}",
                        serde_json::to_value(reason).unwrap()["kind"]
                            .as_str()
                            .unwrap()
                    )
                }
                EventKind::SessionPause { pull_point } => pull_point.name().to_owned(),
                EventKind::ToolCall(r) => format!("{:?}", r.disposition)
                    .split([' ', '{'])
                    .next()
                    .unwrap()
                    .to_owned(),
                other => other.name().to_owned(),
            };
            seen.insert(key);
        }
    }
    let expected = [
        "awaiting_tool",
        "awaiting_approval",
        "awaiting_input",
        "paused budget",
        "paused turn_limit",
        "paused hook",
        "paused provider",
        "paused model_stop",
        "Run",
        "External",
        "Approval",
        "Refused",
        "approval.resolved",
        "tool.error",
        "context.compacted",
        "guardrail.tripped",
        "hook.applied",
        "input.received",
        "budget.extended",
        "session.cancel",
        "session.complete",
        "error",
        // Issue 32, child runs.
        "awaiting_children",
        "Child",
        "child.ended",
    ];
    let missing: Vec<&str> = expected
        .into_iter()
        .filter(|k| !seen.contains(*k))
        .collect();
    assert!(
        missing.is_empty(),
        "never reached: {missing:?}; seen: {seen:?}"
    );
}

// ----- what the properties found, pinned -----------------------------------------

/// Drive a one-off script through the public API (no scenario machinery).
async fn run_script(turns: Vec<ScriptedTurn>, config: RunConfig) -> (Agent, RunState, Vec<Event>) {
    let provider = Arc::new(ScriptedProvider::new(turns));
    let worker = agent(&provider, Compaction::None);
    let mut log = Vec::new();
    let (state, _) = worker
        .run(RUN_ID, "help me", config, &mut log)
        .await
        .expect("the run starts");
    (worker, state, log)
}

/// A conversational run with an output schema: after its first structured
/// answer, the user's next message must reach the model. (Found by
/// `a_step_ends_on_a_fresh_answer`.)
#[test]
fn a_structured_conversation_asks_the_model_about_the_next_message() {
    block_on(async {
        let turns = vec![
            ScriptedTurn::call("final_output", json!({ "answer": "first" })),
            ScriptedTurn::call("final_output", json!({ "answer": "second" })),
        ];
        let config = RunConfig {
            conversational: true,
            output_schema: Some(output_schema()),
            ..RunConfig::default()
        };
        let (worker, mut state, mut log) = run_script(turns, config).await;
        assert_eq!(state.parked, Some(PullPoint::AwaitingInput));
        worker
            .advance(
                &mut state,
                Some(Payload::Input {
                    text: "and the second?".into(),
                    redactions: Vec::new(),
                }),
                &mut log,
            )
            .await
            .unwrap();
        assert_eq!(
            state.answer,
            r#"{"answer":"second"}"#,
            "the step ended on the stale output\nlog: {:#?}",
            names(&log)
        );
        check_fresh_answers(&log).unwrap();
    });
}

/// `max_tool_calls: 1` and two calls, one needing approval: the approved call
/// must not become the second tool call the budget allows only once. (Found
/// by `budgets_are_never_overrun`.)
#[test]
fn approving_a_call_does_not_overrun_the_tool_budget() {
    block_on(async {
        let turns = vec![ScriptedTurn::calls(&[
            ("refund", json!({ "order": "A-1", "amount": 5 })),
            ("add", json!({ "a": 1, "b": 2 })),
        ])];
        let config = RunConfig {
            policies: vec![Policy {
                tool: "refund".into(),
                args: None,
                action: PolicyAction::RequireApproval,
            }],
            budget: BudgetLimits {
                max_tool_calls: Some(1),
                ..BudgetLimits::default()
            },
            ..RunConfig::default()
        };
        let (worker, mut state, mut log) = run_script(turns, config).await;
        let call = state.call("call_1").expect("the refund is pending").clone();
        let approve = Payload::Approval {
            call_id: call.call_id,
            args_hash: call.args_hash,
            decision: Decision::Approve,
            by: None,
            request_seq: None,
        };
        worker
            .advance(&mut state, Some(approve), &mut log)
            .await
            .unwrap();
        assert!(
            state.usage.tool_calls <= 1,
            "{} tool calls under max_tool_calls 1\nlog: {:#?}",
            state.usage.tool_calls,
            names(&log)
        );
    });
}

/// A worker dies after recording a refused call's `tool.call` but before its
/// `tool.error`; the worker that rebuilds the state from the log must record
/// the missing error instead of looping without progress. (Found by
/// `a_dead_worker_is_replaced_from_the_log`.)
#[test]
fn a_refusal_cut_short_by_a_crash_is_finished_on_recovery() {
    block_on(async {
        let provider = Arc::new(ScriptedProvider::new(vec![
            ScriptedTurn::call("no_such_tool", json!({})),
            ScriptedTurn::text("done"),
        ]));
        let mut sink = Recorder::new();
        let mut state = agent(&provider, Compaction::None)
            .start(RUN_ID, "help me", RunConfig::default(), &mut sink)
            .await
            .unwrap();
        // Events 1-7: session.start … model.response, tool.call (refused); event 8, its tool.error, is lost.
        sink.crash_at = vec![7];
        let died = agent(&provider, Compaction::None)
            .advance(&mut state, None, &mut sink)
            .await;
        assert!(matches!(died, Err(AgentError::Sink(_))), "{died:?}");
        assert!(
            matches!(&sink.log[6].kind, EventKind::ToolCall(r) if matches!(r.disposition, Disposition::Refused { .. }))
        );
        let mut state = RunState::replay(RUN_ID, &sink.log).unwrap();
        let status = agent(&provider, Compaction::None)
            .advance(&mut state, None, &mut sink)
            .await
            .unwrap();
        assert!(matches!(status, Status::Done(_)), "{status:?}");
        check_replay(&Driven {
            log: sink.log.clone(),
            states: sink.states,
            snapshots: Vec::new(),
            commits: sink.commits,
            state,
        })
        .unwrap();
    });
}
