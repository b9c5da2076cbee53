//! The agent loop. Read this file top to bottom to know what a run does.
//!
//! [`Agent::advance`] takes a run's state (fresh, or rebuilt from its log or
//! checkpoint), applies an optional resume payload, and drives the run until
//! it parks at a pull point or finishes. Every step is an event: the loop
//! builds it, applies it to the state through the one transition function
//! ([`RunState::apply`]) and hands it to an [`EventSink`]. The loop never
//! changes the state any other way, so replaying the sink's log gives the same
//! state, and a run parked here can be resumed anywhere from its JSON alone.
//!
//! One iteration, by phase:
//! - `planning`: `before_plan` hooks, the planner drafts, `after_plan` hooks,
//!   commit (or finish when there is nothing to do);
//! - `executing`: start the step (`before_step` hooks, tool list frozen);
//!   check the budget and the turn's model-call cap; compact if the compactor
//!   says so; reserve the call with the budget gate (tenant caps, see
//!   [`crate::budget_gate`]); call the model and settle; judge why it
//!   stopped (an answer that is not a finished turn — cut off, empty,
//!   refused, filtered, an unknown reason — is rejected and re-asked, paused
//!   or failed per the run's stop policy, [`glia_proto::stop`]); or, once the model
//!   answered without tools, check the answer (structured output, output
//!   guardrails) and end the step;
//! - `awaiting_tool`: settle calls a crash interrupted; decide each new call
//!   (`before_tool_call` hooks, policies, budget); request approvals; run the
//!   runnable calls concurrently and record their results in call order
//!   (`after_tool_call` hooks); park for approvals and external results;
//! - `reflecting`: a conversational run waits for input; otherwise the
//!   planner picks the next step, replans, or the run completes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::FutureExt;
use futures::future::BoxFuture;
use glia_proto::marker::Insert;
use glia_proto::repair::{repair, repair_traced};
use glia_proto::{
    ApprovalStatus, ContentBlock, Decision, Disposition, Event, EventKind, GuardrailStage,
    HookEffect, HookTopic, InterruptedCall, LiveEvent, OUTPUT_TOOL, Outcome, PauseReason, Payload,
    Phase, PlannerKind, PolicyAction, PolicyOrigin, PullPoint, Redaction, RefusedTurn,
    RejectedAnswer, ResolvedPolicy, Role, RunConfig, RunState, Status, StopAction, StopClass,
    ToolCallRecord, ToolContent, ToolErrorKind, ToolSpec, TransitionError, args_hash,
    canonical_json,
};
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::budget_gate::{self, BudgetGate, GateDecision, GateError, Spend};
use crate::compact::Compactor;
use crate::hooks::{Fired, Hooks, Verdict};
use crate::http_hooks::{HttpHook, HttpHooks, RunHooks, ScopeError, hook_key, request};
use crate::planner::{Draft, ModelPlanner, PlanError, Planner, Reflection, SinglePlanner};
use crate::policy::{CompiledPolicies, Guardrail};
use crate::provider::{ModelRequest, Provider, ProviderError, ToolChoice};
use crate::tool::{ToolContext, ToolFailure, ToolRegistry};
use crate::tool_sources::{OfferError, ToolSources};
use glia_proto::guardrails::CompiledGuardrails;
use glia_proto::tool_sources::UnavailableAction;
use glia_proto::{Held, HeldResult};

/// How the tools `now` differ from `before`, by name: `(added, removed,
/// changed)`, each sorted; changed are in both with a different spec.
fn tools_diff(before: &[ToolSpec], now: &[ToolSpec]) -> (Vec<String>, Vec<String>, Vec<String>) {
    let by_name = |tools: &[ToolSpec]| -> BTreeMap<String, ToolSpec> {
        tools.iter().map(|t| (t.name.clone(), t.clone())).collect()
    };
    let (before, now) = (by_name(before), by_name(now));
    let added = now
        .keys()
        .filter(|n| !before.contains_key(*n))
        .cloned()
        .collect();
    let removed = before
        .keys()
        .filter(|n| !now.contains_key(*n))
        .cloned()
        .collect();
    let changed = now
        .iter()
        .filter(|(n, spec)| before.get(*n).is_some_and(|b| b != *spec))
        .map(|(n, _)| n.clone())
        .collect();
    (added, removed, changed)
}

/// Where the loop's events go: a Vec in tests, Postgres in the fleet.
///
/// `record` is called once per event, in order, after the event has been
/// applied to the state; a sink may buffer. `commit` is a durability barrier:
/// the loop calls it before anything with an outside effect (a model call, a
/// tool execution) and before `advance` returns, with the state as of the last
/// recorded event. If either fails, the in-memory state is ahead of the log:
/// drop it and rebuild from the log.
#[async_trait]
pub trait EventSink: Send + Sync {
    /// Accept one event (persist it now, or buffer it until `commit`).
    async fn record(&mut self, event: &Event) -> Result<(), SinkError>;
    /// Make every event recorded so far durable. `state` is the run's state
    /// after the last of them. Default: nothing to do.
    async fn commit(&mut self, _state: &RunState) -> Result<(), SinkError> {
        Ok(())
    }
    /// Push a live-only event (a model delta). Default: drop it.
    fn live(&self, _event: &LiveEvent) {}
    /// Resolves once the run has been cancelled from outside (the fleet's
    /// ledger flag). The loop then aborts a model call in flight at once,
    /// lets running tool calls finish within their grace period
    /// ([`ToolSpec::cancel_grace_ms`]), records what they returned, and stops
    /// with [`AgentError::Cancelled`]. Default: never.
    fn cancelled(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::pending())
    }
    /// True when, as of the last `commit`, the run is flagged for an
    /// operator pause that is not applied yet (the fleet's ledger flag; the
    /// pause itself waits in the run's inbox). The loop then stops between
    /// steps with [`AgentError::PauseFlagged`]. Default: never.
    fn pause_flagged(&self) -> bool {
        false
    }
    /// Keep tool results, each under its call's idempotency key, in a store
    /// that outlives this worker (the fleet's ledger,
    /// `glia_backends::Ledger::hold_results`), until a `commit` has made
    /// them durable. The loop calls it as soon as a model turn's calls have
    /// returned, before it records their results. Errors are the loop's to
    /// log, not to stop on: the results are still recorded and committed.
    /// Default: nothing is kept.
    async fn hold(&mut self, _held: &[(String, HeldResult)]) -> Result<(), SinkError> {
        Ok(())
    }
    /// Mark the calls under `keys` (idempotency keys) as running, in the
    /// store that keeps held results, for [`glia_proto::RUNNING_MARK_TTL`]
    /// (the fleet's ledger, `glia_backends::Ledger::mark_running`). The
    /// loop calls it before the commit that clears a model turn's calls to
    /// run, and every [`glia_proto::RUNNING_MARK_REFRESH`] while they run;
    /// [`EventSink::hold`] ends the marks. Errors are the loop's to log, not
    /// to stop on. Default: nothing is marked.
    async fn mark_running(&self, _keys: &[String]) -> Result<(), SinkError> {
        Ok(())
    }
    /// What the store knows of the call under the idempotency key `key`,
    /// cleared and without a result in the log: its result, held and maybe
    /// not committed ([`EventSink::hold`]); still running under a worker
    /// that lost the lease ([`EventSink::mark_running`]); or nothing.
    /// Errors: the store did not answer, so which is unknown. Default:
    /// nothing.
    async fn held(&mut self, _key: &str) -> Result<Option<Held>, SinkError> {
        Ok(None)
    }
}

/// A sink that could not persist an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("event sink failed: {0}")]
pub struct SinkError(pub String);

#[async_trait]
impl EventSink for Vec<Event> {
    async fn record(&mut self, event: &Event) -> Result<(), SinkError> {
        self.push(event.clone());
        Ok(())
    }
}

/// Source of event timestamps and of durations (active time).
pub trait Clock: Send + Sync {
    /// Now, UTC.
    fn now(&self) -> DateTime<Utc>;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that never moves: deterministic logs for tests and replays.
#[derive(Debug, Clone, Copy)]
pub struct FixedClock(pub DateTime<Utc>);

impl Clock for FixedClock {
    fn now(&self) -> DateTime<Utc> {
        self.0
    }
}

/// Why the loop stopped without reaching a pull point or the end.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentError {
    /// An event could not be applied: a resume payload that does not fit the
    /// run's state (wrong pull point, unknown call, stale approval). Nothing
    /// was recorded for it.
    #[error(transparent)]
    Transition(#[from] TransitionError),
    /// A resume payload was refused before it became an event.
    #[error("invalid resume: {0}")]
    InvalidResume(String),
    /// The run configuration is invalid; the run was not started.
    #[error("invalid run config: {0}")]
    Config(String),
    /// The sink failed; rebuild the state from the log before going on.
    #[error(transparent)]
    Sink(#[from] SinkError),
    /// A transient provider failure; the run stays runnable, retry later.
    #[error("provider unavailable: {0}")]
    Provider(ProviderError),
    /// `advance` was called on a run that has not started.
    #[error("the run has not started")]
    NotStarted,
    /// The budget gate could not decide before a model call; the run stays
    /// runnable, retry later.
    #[error(transparent)]
    Budget(#[from] GateError),
    /// A tool source (an MCP server) could not list the step's tools: the
    /// attempt is recorded (`tool_source.unavailable`) and committed, the
    /// run stays runnable; try again after `retry_in_ms`
    /// (`RunConfig::on_tool_source_unavailable`). The attempt that reaches
    /// the policy's bound pauses or fails the run instead of returning this.
    #[error("tool source unavailable: {reason} (retry in {retry_in_ms} ms)")]
    ToolSource {
        /// Why, naming the server.
        reason: String,
        /// When to try again, in ms.
        retry_in_ms: u64,
    },
    /// A call a crash interrupted may have a held result
    /// ([`EventSink::held`]), and the store that holds them did not answer:
    /// neither its result nor a person's word on running it again is
    /// recorded, and nothing of this advance is committed. The run stays
    /// runnable, retry later.
    #[error("held tool results unavailable: {0}")]
    HeldResults(String),
    /// A call cleared and without a result is marked running
    /// ([`Held::Running`]): the worker that started it lost the lease but
    /// the call has not returned yet. Nothing of this advance is committed
    /// (a payload it accepted stays in the inbox); the run stays runnable,
    /// check again shortly (the mark lapses within
    /// [`glia_proto::RUNNING_MARK_TTL`] of its worker's last refresh).
    #[error("call {0} is still running under a worker that lost the lease")]
    CallRunning(String),
    /// Which HTTP hooks apply to the run could not be decided (its tenant
    /// could not be read): nothing was recorded; retry later.
    #[error("the run's hooks cannot be decided: {0}")]
    Hooks(String),
    /// The run was cancelled while it advanced ([`EventSink::cancelled`]):
    /// everything recorded is committed (tool calls that finished within
    /// their grace period with their results, the others as
    /// `outcome_unknown`); the caller applies the cancel.
    #[error("the run was cancelled")]
    Cancelled,
    /// The run is flagged for an operator pause ([`EventSink::pause_flagged`])
    /// and stopped between steps: everything recorded is committed; the
    /// caller applies the posted pause.
    #[error("an operator pause was requested")]
    PauseFlagged,
}

/// The loop and everything it calls: provider, tools, hooks, guardrails,
/// compactor, clock. Shared by every run a worker drives.
///
/// ```
/// # async fn demo() {
/// use std::sync::Arc;
/// use glia_agent::agent::Agent;
/// use glia_agent::provider::{ScriptedProvider, ScriptedTurn};
/// use glia_proto::{RunConfig, Status, Outcome};
/// let agent = Agent::new(Arc::new(ScriptedProvider::new(vec![ScriptedTurn::text("4")])));
/// let mut log = Vec::new();
/// let (state, status) = agent.run(uuid::Uuid::now_v7(), "2+2?", RunConfig::default(), &mut log).await.unwrap();
/// assert!(matches!(status, Status::Done(Outcome::Succeeded { ref answer, .. }) if answer == "4"));
/// assert_eq!(state.head_seq as usize, log.len());
/// # }
/// ```
pub struct Agent {
    provider: Arc<dyn Provider>,
    named: BTreeMap<String, Arc<dyn Provider>>,
    tools: ToolRegistry,
    hooks: Hooks,
    input_guardrails: Vec<Guardrail>,
    output_guardrails: Vec<Guardrail>,
    compactor: Option<Box<dyn Compactor>>,
    clock: Arc<dyn Clock>,
    budget_gate: Option<Arc<dyn BudgetGate>>,
    sources: Option<Arc<ToolSources>>,
    /// The catalogue's HTTP hooks ([`crate::http_hooks`]), if any.
    http_hooks: Option<Arc<HttpHooks>>,
    /// Compiled JSON Schemas (tool inputs, output schemas) by their JSON
    /// text: a step's tools are checked at every call, and compiling a
    /// schema costs far more than checking arguments against it. A plain
    /// map, emptied when it holds [`VALIDATORS_KEPT`]: a worker sees few
    /// distinct schemas, and a caching library's own structures (`moka`)
    /// measured ~2 MiB more resident memory in `glia bench memory`.
    validators: Mutex<HashMap<String, Arc<jsonschema::Validator>>>,
}

/// Most compiled schemas an [`Agent`] keeps before starting afresh.
const VALIDATORS_KEPT: usize = 1024;

/// The state being advanced, the sink, and the clock: every event goes
/// through [`Run::record`].
struct Run<'a> {
    state: &'a mut RunState,
    sink: &'a mut dyn EventSink,
    clock: &'a dyn Clock,
    /// The HTTP hooks that apply to this run (decided at each advance).
    hooks: RunHooks,
    /// Notifications of `on_*` HTTP hooks, sent after the next commit (in
    /// a mutex: a run is shared across awaits, and a future is not `Sync`).
    notices: Mutex<Vec<BoxFuture<'static, ()>>>,
}

impl Run<'_> {
    /// Stamp, apply, persist.
    async fn record(&mut self, kind: EventKind) -> Result<(), AgentError> {
        let event = Event {
            run_id: self.state.run_id,
            seq: self.state.head_seq + 1,
            at: self.clock.now(),
            kind,
        };
        self.state.apply(&event)?;
        self.sink.record(&event).await?;
        Ok(())
    }

    /// Durability barrier: see [`EventSink::commit`]. Then the `on_*`
    /// HTTP hooks' notifications of what it made durable are sent.
    async fn commit(&mut self) -> Result<(), AgentError> {
        self.sink.commit(self.state).await?;
        let notices = std::mem::take(self.notices.get_mut().unwrap_or_else(|e| e.into_inner()));
        if !notices.is_empty() {
            futures::future::join_all(notices).await;
        }
        Ok(())
    }

    /// `work`, unless the run is cancelled first ([`EventSink::cancelled`]):
    /// then `work` is dropped (a model stream is aborted at once) and the
    /// answer is [`AgentError::Cancelled`].
    async fn unless_cancelled<T>(&self, work: impl Future<Output = T>) -> Result<T, AgentError> {
        tokio::select! {
            done = work => Ok(done),
            () = self.sink.cancelled() => Err(AgentError::Cancelled),
        }
    }

    /// The `webhook-id` and body of a call of `hook` on `topic` for this
    /// run ([`crate::http_hooks::request`]).
    fn hook_request(
        &self,
        hook: &HttpHook,
        topic: HookTopic,
        key: &str,
        payload: &Value,
    ) -> (String, Value) {
        request(
            hook,
            topic,
            self.state,
            self.hooks.tenant.as_deref(),
            key,
            payload,
        )
    }

    fn elapsed_ms(&self, since: DateTime<Utc>) -> u64 {
        u64::try_from((self.clock.now() - since).num_milliseconds()).unwrap_or(0)
    }
}

/// What deciding one tool call led to.
enum Decided {
    Recorded,
    BudgetBlocked(glia_proto::Limit),
}

/// A tool call's outcome after the `tool_results` guardrails: the result as
/// it may be stored (redacted, or withheld behind a note) and the redact
/// rules that changed it.
type Screened = (Result<ToolContent, ToolFailure>, Vec<Redaction>);

impl Agent {
    /// An agent with no tools, hooks, guardrails or compactor, on the system clock.
    pub fn new(provider: Arc<dyn Provider>) -> Self {
        Agent {
            provider,
            named: BTreeMap::new(),
            tools: ToolRegistry::default(),
            hooks: Hooks::default(),
            input_guardrails: Vec::new(),
            output_guardrails: Vec::new(),
            compactor: None,
            clock: Arc::new(SystemClock),
            budget_gate: None,
            sources: None,
            http_hooks: None,
            validators: Mutex::default(),
        }
    }

    /// Serve runs whose config names `provider = name` with `provider` (the
    /// operator catalogue's `[providers.NAME]`); runs naming none use the
    /// provider given to [`Agent::new`]. A run naming a provider the agent
    /// lacks pauses at its first model call ([`ProviderError::NotConfigured`]).
    pub fn with_named_provider(
        mut self,
        name: impl Into<String>,
        provider: Arc<dyn Provider>,
    ) -> Self {
        self.named.insert(name.into(), provider);
        self
    }

    /// Use these tools.
    pub fn with_tools(mut self, tools: ToolRegistry) -> Self {
        self.tools = tools;
        self
    }

    /// Use these hooks.
    pub fn with_hooks(mut self, hooks: Hooks) -> Self {
        self.hooks = hooks;
        self
    }

    /// Call the operator catalogue's HTTP hooks ([`crate::http_hooks`]) on
    /// the runs they apply to, after the in-process hooks of each topic.
    pub fn with_http_hooks(mut self, hooks: HttpHooks) -> Self {
        self.http_hooks = Some(Arc::new(hooks));
        self
    }

    /// Take the HTTP hooks back (to give them the worker's ports, then set
    /// them again); `None` when there are none.
    pub fn take_http_hooks(&mut self) -> Option<HttpHooks> {
        Arc::try_unwrap(self.http_hooks.take()?).ok()
    }

    /// Add a guardrail over the goal and user messages.
    pub fn with_input_guardrail(mut self, g: Guardrail) -> Self {
        self.input_guardrails.push(g);
        self
    }

    /// Add a guardrail over the model's answers.
    pub fn with_output_guardrail(mut self, g: Guardrail) -> Self {
        self.output_guardrails.push(g);
        self
    }

    /// Compact the context with `c`.
    pub fn with_compactor(mut self, c: impl Compactor + 'static) -> Self {
        self.compactor = Some(Box::new(c));
        self
    }

    /// Take timestamps and durations from `clock`.
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Count model spend across runs with `gate` (see
    /// [`crate::budget_gate`]): each model call is reserved before it is made
    /// and settled after; a refusal pauses the run like its own budget does.
    pub fn with_budget_gate(mut self, gate: Arc<dyn BudgetGate>) -> Self {
        self.budget_gate = Some(gate);
        self
    }

    /// Offer the MCP and HTTP tools runs name, under the operator's
    /// catalogue ([`crate::tool_sources`]).
    pub fn with_tool_sources(mut self, sources: Arc<ToolSources>) -> Self {
        self.sources = Some(sources);
        self
    }

    /// The MCP and HTTP tool sources, if any (to stop their servers at shutdown).
    pub fn tool_sources(&self) -> Option<&Arc<ToolSources>> {
        self.sources.as_ref()
    }

    /// The registered tools.
    pub fn tools(&self) -> &ToolRegistry {
        &self.tools
    }

    /// Start a run and drive it to its first pull point or its end.
    pub async fn run(
        &self,
        run_id: Uuid,
        goal: &str,
        config: RunConfig,
        sink: &mut dyn EventSink,
    ) -> Result<(RunState, Status), AgentError> {
        let mut state = self.start(run_id, goal, config, sink).await?;
        let status = self.advance(&mut state, None, sink).await?;
        Ok((state, status))
    }

    /// Validate `config` and record `session.start` (and, if an input
    /// guardrail rejects the goal, a `session.start` whose goal is a
    /// placeholder naming the rule and the length, `guardrail.tripped` and a
    /// failed `session.complete`: the refused text is recorded nowhere). Errors: [`AgentError::Config`] before anything is
    /// recorded.
    pub async fn start(
        &self,
        run_id: Uuid,
        goal: &str,
        config: RunConfig,
        sink: &mut dyn EventSink,
    ) -> Result<RunState, AgentError> {
        self.check_config(&config)?;
        let mut state = RunState::new(run_id);
        let mut run = Run {
            state: &mut state,
            sink,
            clock: &*self.clock,
            hooks: RunHooks::default(),
            notices: Mutex::default(),
        };
        let declared = self.declared_guardrails(&config)?;
        let (goal, redactions) = declared.redact_input(goal);
        // A refused goal is never recorded: `session.start` holds a
        // placeholder naming the rule and the length.
        match self.check_input(&declared, &goal) {
            None => {
                run.record(EventKind::SessionStart {
                    goal,
                    config,
                    redactions,
                })
                .await?
            }
            Some((guardrail, reason)) => {
                let placeholder = format!(
                    "[goal withheld: refused by the input guardrail {guardrail}, {} characters]",
                    goal.chars().count()
                );
                run.record(EventKind::SessionStart {
                    goal: placeholder,
                    config,
                    redactions,
                })
                .await?;
                run.record(EventKind::GuardrailTripped {
                    stage: GuardrailStage::Input,
                    guardrail,
                    reason: reason.clone(),
                    reask: None,
                })
                .await?;
                self.fail(&mut run, format!("goal rejected: {reason}"))
                    .await?;
            }
        }
        run.commit().await?;
        Ok(state)
    }

    /// Drive the run from its current state until it parks or ends.
    ///
    /// `input` is the payload for the pull point the run is parked at (an
    /// approval decision, an external tool result, the user's message, a
    /// budget extension or a resume). A payload that does not fit is refused
    /// with a typed error and nothing is recorded.
    pub async fn advance(
        &self,
        state: &mut RunState,
        input: Option<Payload>,
        sink: &mut dyn EventSink,
    ) -> Result<Status, AgentError> {
        if state.phase == Phase::Idle {
            return Err(AgentError::NotStarted);
        }
        // Calls that were cleared to run before this advance but have no
        // result: a worker died while they ran. (A call waiting for a
        // person's word on running it again, or refused it, is not cleared.)
        let interrupted: Vec<String> = state
            .pending_calls
            .iter()
            .filter(|c| c.cleared_without_result())
            .map(|c| c.call_id.clone())
            .collect();
        let mut run = Run {
            state,
            sink,
            clock: &*self.clock,
            hooks: RunHooks::default(),
            notices: Mutex::default(),
        };
        // The HTTP hooks that apply to the run: decided before anything it
        // does, so nothing goes ungated (a hook the run names and may not
        // have fails it; an unreadable tenant leaves it to a later try).
        if let Some(http) = &self.http_hooks
            && run.state.phase != Phase::Done
        {
            match http.scope(run.state).await {
                Ok(hooks) => run.hooks = hooks,
                Err(ScopeError::Unavailable(why)) => return Err(AgentError::Hooks(why)),
                Err(ScopeError::Refused { field, reason }) => {
                    self.fail(&mut run, format!("{field}: {reason}")).await?;
                    run.commit().await?;
                    return Ok(run.state.status());
                }
            }
        } else if !run.state.config.hooks.is_empty() && run.state.phase != Phase::Done {
            self.fail(
                &mut run,
                "hooks: this worker has no catalogue hooks (glia worker --catalogue FILE)".into(),
            )
            .await?;
            run.commit().await?;
            return Ok(run.state.status());
        }
        if let Some(input) = input {
            self.accept(&mut run, input).await?;
        }
        while run.state.status() == Status::Runnable {
            let before = run.state.head_seq;
            // An operator pause requested meanwhile (`session.pause_requested`)
            // takes effect here, before any further effect, unless calls are
            // cleared to run: then after their results.
            if run.state.pausable() {
                if let Some(reason) = run.state.pause_due.clone() {
                    self.pause(&mut run, PauseReason::Operator { reason })
                        .await?;
                    continue;
                }
                if run.sink.pause_flagged() {
                    run.commit().await?;
                    return Err(AgentError::PauseFlagged);
                }
            }
            match run.state.phase {
                Phase::Idle | Phase::Done => break,
                Phase::Planning => self.plan(&mut run).await?,
                Phase::Executing => {
                    let answered = run
                        .state
                        .messages
                        .last()
                        .is_some_and(|m| m.role == Role::Assistant);
                    let returned = returned_directly(run.state);
                    match run.state.step {
                        None => self.start_step(&mut run, 0).await?,
                        Some(_) if answered || run.state.output.is_some() => {
                            self.conclude(&mut run).await?
                        }
                        Some(_) if returned.is_some() => self.complete(&mut run, returned).await?,
                        Some(_) => self.model_turn(&mut run).await?,
                    }
                }
                Phase::AwaitingTool => self.tool_calls(&mut run, &interrupted).await?,
                Phase::Reflecting => self.reflect(&mut run).await?,
            }
            assert!(
                run.state.head_seq > before,
                "the loop made no progress in phase {:?}",
                run.state.phase
            );
        }
        run.commit().await?;
        Ok(run.state.status())
    }

    /// Cancel the run (terminal). A run that is already done is left as is.
    pub async fn cancel(
        &self,
        state: &mut RunState,
        reason: &str,
        sink: &mut dyn EventSink,
    ) -> Result<Status, AgentError> {
        if state.phase != Phase::Done {
            let mut run = Run {
                state,
                sink,
                clock: &*self.clock,
                hooks: RunHooks::default(),
                notices: Mutex::default(),
            };
            run.record(EventKind::SessionCancel {
                reason: reason.to_owned(),
            })
            .await?;
            run.commit().await?;
        }
        Ok(state.status())
    }

    /// Close a conversational run waiting at `awaiting_input`: it completes
    /// with its last answer.
    pub async fn close(
        &self,
        state: &mut RunState,
        sink: &mut dyn EventSink,
    ) -> Result<Status, AgentError> {
        self.advance(
            state,
            Some(Payload::Close {
                text: None,
                redactions: Vec::new(),
            }),
            sink,
        )
        .await
    }

    // ----- resume payloads -------------------------------------------------

    async fn accept(&self, run: &mut Run<'_>, input: Payload) -> Result<(), AgentError> {
        match input {
            Payload::Approval {
                call_id,
                args_hash,
                decision,
                by,
                request_seq,
            } => {
                let call = run.state.call(&call_id);
                if let (Some(seq), Some(call)) = (request_seq, call)
                    && call.requested_seq != Some(seq)
                {
                    return Err(AgentError::InvalidResume(format!(
                        "the decision answers approval request {seq} of {call_id}, not the pending one"
                    )));
                }
                let interrupted = call.is_some_and(|c| c.interrupted);
                let reason = match &decision {
                    Decision::Reject { reason } => Some(reason.clone()),
                    Decision::Expire => Some(String::new()),
                    _ => None,
                };
                let expired = decision == Decision::Expire;
                run.record(EventKind::ApprovalResolved {
                    call_id: call_id.clone(),
                    args_hash,
                    decision,
                    by,
                })
                .await?;
                if let Some(reason) = reason {
                    let kind = if expired {
                        let also = if interrupted {
                            " The worker had stopped while this call was running, so whether its first attempt took effect is unknown."
                        } else {
                            ""
                        };
                        let message = format!(
                            "No decision before the deadline: this call needed a person's approval, nobody decided in time, and it was not run.{also}"
                        );
                        let error = if interrupted {
                            ToolErrorKind::OutcomeUnknown
                        } else {
                            ToolErrorKind::Expired
                        };
                        EventKind::ToolError {
                            call_id,
                            error,
                            message,
                            duration_ms: 0,
                        }
                    } else if interrupted {
                        let message = Insert::OutcomeUnknown.wrap(&format!(
                            "The worker stopped while this call was running, and a person chose not to run it again: {reason}. Whether it took effect is unknown."
                        ));
                        EventKind::ToolError {
                            call_id,
                            error: ToolErrorKind::OutcomeUnknown,
                            message,
                            duration_ms: 0,
                        }
                    } else {
                        EventKind::ToolError {
                            call_id,
                            error: ToolErrorKind::Rejected,
                            message: format!("A person rejected this call: {reason}"),
                            duration_ms: 0,
                        }
                    };
                    run.record(kind).await?;
                }
            }
            Payload::ToolResult {
                call_id,
                content,
                is_error,
            } => {
                let external = run.state.call(&call_id).is_some_and(|c| c.awaits_caller());
                if !external {
                    return Err(AgentError::InvalidResume(format!(
                        "{call_id} is not an external tool call awaiting a result"
                    )));
                }
                let result = if is_error {
                    Err(ToolFailure {
                        kind: ToolErrorKind::Failed,
                        message: content,
                    })
                } else {
                    Ok(content.into())
                };
                let kind = match self.screen_result(run, &call_id, result).await? {
                    (Err(f), _) => EventKind::ToolError {
                        call_id,
                        error: f.kind,
                        message: f.message,
                        duration_ms: 0,
                    },
                    (Ok(content), redactions) => EventKind::ToolResult {
                        call_id,
                        content,
                        reminder: None,
                        duration_ms: 0,
                        redactions,
                    },
                };
                run.record(kind).await?;
            }
            Payload::Input { text, redactions } => {
                if run.state.parked != Some(PullPoint::AwaitingInput) {
                    return Err(AgentError::InvalidResume(
                        "the run is not waiting for input".into(),
                    ));
                }
                self.user_message(run, text, redactions).await?;
            }
            Payload::ExtendBudget { extra } => {
                let limits = run.state.limits.extended_by(&extra);
                run.record(EventKind::BudgetExtended { limits }).await?;
                if matches!(
                    run.state.parked,
                    Some(PullPoint::Paused {
                        reason: PauseReason::Budget { .. }
                    })
                ) {
                    run.record(EventKind::SessionResume { by: None }).await?;
                }
            }
            Payload::Pause { reason, by } => {
                run.record(EventKind::SessionPauseRequested { reason, by })
                    .await?
            }
            Payload::Resume { by } => run.record(EventKind::SessionResume { by }).await?,
            Payload::Close { text, redactions } => {
                let at_input = run.state.parked == Some(PullPoint::AwaitingInput);
                let budget_paused = matches!(
                    run.state.parked,
                    Some(PullPoint::Paused {
                        reason: PauseReason::Budget { .. }
                    })
                );
                if !at_input && !budget_paused {
                    return Err(AgentError::InvalidResume(
                        "only a run waiting at awaiting_input or paused by its budget is closed"
                            .into(),
                    ));
                }
                if let Some(text) = text {
                    if !at_input {
                        return Err(AgentError::InvalidResume(
                            "a closing message is taken at awaiting_input only".into(),
                        ));
                    }
                    self.user_message(run, text, redactions).await?;
                }
                self.complete(run, None).await?;
            }
            Payload::Cancel { reason } => run.record(EventKind::SessionCancel { reason }).await?,
            // --- issue 32: waits ---
            Payload::Wake { due_at_ms, event } => self.wake(run, due_at_ms, event).await?,
            // --- end waits ---
            // Issue 32: a child run ended (or could not start).
            Payload::ChildEnded {
                call_id,
                child_run_id,
                outcome,
                usage,
                cost_usd_micros,
            } => {
                let agent = run
                    .state
                    .call(&call_id)
                    .filter(|c| c.result.is_none())
                    .and_then(|c| c.child.as_ref())
                    .map(|c| c.agent.clone());
                let Some(agent) = agent else {
                    return Err(AgentError::InvalidResume(format!(
                        "{call_id} is not an agent call waiting for its child"
                    )));
                };
                run.record(EventKind::ChildEnded {
                    call_id,
                    child_run_id,
                    agent,
                    outcome,
                    usage,
                    cost_usd_micros,
                })
                .await?
            }
            Payload::ApprovalContested {
                call_id,
                by,
                chose,
                attempted_at,
            } => {
                run.record(EventKind::ApprovalContested {
                    call_id,
                    by,
                    chose,
                    attempted_at,
                })
                .await?
            }
            Payload::Escalate {
                call_id,
                request_seq,
                expires_at,
            } => {
                let call = run
                    .state
                    .call(&call_id)
                    .filter(|c| c.approval == ApprovalStatus::Requested);
                match call {
                    Some(c) if request_seq.is_none_or(|seq| c.requested_seq == Some(seq)) => {
                        run.record(EventKind::ApprovalEscalated {
                            call_id,
                            expires_at,
                        })
                        .await?
                    }
                    _ => {
                        return Err(AgentError::InvalidResume(format!(
                            "the approval of {call_id} is no longer pending"
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    // --- issue 32: waits ---
    /// A [`Payload::Wake`]: each waiting call it ends gets its result, in
    /// call order (a timer due at or before `due_at_ms`: when it woke; an
    /// event wait: the event, or at its timeout a `timed_out` result). A
    /// wake that ends nothing (a duplicate, a wait already over) is refused
    /// as an invalid resume, and the worker drops it. A run parked for its
    /// start time (`start_at`, no calls) is started: `session.resume`.
    async fn wake(
        &self,
        run: &mut Run<'_>,
        due_at_ms: i64,
        event: Option<glia_proto::ArrivedEvent>,
    ) -> Result<(), AgentError> {
        use glia_proto::wait::{Wait, event_result, timeout_result, timer_result};
        // A delayed start (`start_at`): parked on a timer with no calls; its
        // wake starts the run.
        if let Some(PullPoint::AwaitingTimer {
            call_ids,
            wake_at_ms,
        }) = &run.state.parked
            && call_ids.is_empty()
        {
            if event.is_some() || *wake_at_ms > due_at_ms {
                return Err(AgentError::InvalidResume(
                    "the run waits for its start time; this wake is not it".into(),
                ));
            }
            return run.record(EventKind::SessionResume { by: None }).await;
        }
        let now_ms = run.clock.now().timestamp_millis();
        let ended: Vec<(String, String)> = run
            .state
            .pending_calls
            .iter()
            .filter(|c| c.result.is_none())
            .filter_map(|c| {
                let text = match (c.wait.as_ref()?, &event) {
                    (Wait::Event { key, .. }, Some(e)) if *key == e.key => event_result(e),
                    (_, Some(_)) => return None,
                    (Wait::Timer { wake_at_ms, .. }, None) if *wake_at_ms <= due_at_ms => {
                        timer_result(*wake_at_ms, now_ms.max(*wake_at_ms))
                    }
                    (
                        Wait::Event {
                            key, timeout_at_ms, ..
                        },
                        None,
                    ) if *timeout_at_ms <= due_at_ms => timeout_result(key, *timeout_at_ms),
                    _ => return None,
                };
                Some((c.call_id.clone(), text))
            })
            .collect();
        if ended.is_empty() {
            return Err(AgentError::InvalidResume(
                "the wake ends no waiting call (a duplicate, or the wait is over)".into(),
            ));
        }
        for (call_id, text) in ended {
            // An event's payload is the tenant's text: screened like any
            // tool result (a timer's or timeout's text is glia's own).
            let (result, redactions) = if event.is_some() {
                self.screen_result(run, &call_id, Ok(text.into())).await?
            } else {
                (Ok(text.into()), Vec::new())
            };
            let kind = match result {
                Ok(content) => EventKind::ToolResult {
                    call_id,
                    content,
                    reminder: None,
                    duration_ms: 0,
                    redactions,
                },
                Err(f) => EventKind::ToolError {
                    call_id,
                    error: f.kind,
                    message: f.message,
                    duration_ms: 0,
                },
            };
            run.record(kind).await?;
        }
        Ok(())
    }
    // --- end waits ---

    /// The user's message at `awaiting_input`: refused when blank, recorded
    /// as `input.received`, or as `guardrail.tripped` when an input
    /// guardrail rejects it (the run stays at `awaiting_input`).
    async fn user_message(
        &self,
        run: &mut Run<'_>,
        text: String,
        posted: Vec<Redaction>,
    ) -> Result<(), AgentError> {
        if text.trim().is_empty() {
            return Err(AgentError::InvalidResume("the message is empty".into()));
        }
        // The dispatcher redacted it before posting (`posted`: what
        // matched); redacting again covers payloads that reach the loop
        // another way, and finds nothing in text already redacted.
        let declared = self.declared_guardrails(&run.state.config)?;
        let (text, mut redactions) = declared.redact_input(&text);
        posted.into_iter().for_each(|r| r.add_to(&mut redactions));
        match self.check_input(&declared, &text) {
            Some((guardrail, reason)) => {
                run.record(EventKind::GuardrailTripped {
                    stage: GuardrailStage::Input,
                    guardrail,
                    reason,
                    reask: None,
                })
                .await
            }
            None => {
                run.record(EventKind::InputReceived { text, redactions })
                    .await
            }
        }
    }

    // ----- planning --------------------------------------------------------

    async fn plan(&self, run: &mut Run<'_>) -> Result<(), AgentError> {
        // A run admitted elsewhere (the dispatcher records its session.start):
        // its goal meets the input guardrails here, before anything else —
        // before its first plan, whatever came between (a delayed start's
        // resume, a pause before the first pickup).
        if run.state.plan.is_empty() {
            let declared = self.declared_guardrails(&run.state.config)?;
            if let Some((guardrail, reason)) = self.check_input(&declared, &run.state.goal.clone())
            {
                run.record(EventKind::GuardrailTripped {
                    stage: GuardrailStage::Input,
                    guardrail,
                    reason: reason.clone(),
                    reask: None,
                })
                .await?;
                return self.fail(run, format!("goal rejected: {reason}")).await;
            }
        }
        let fired = self
            .fire(
                run,
                HookTopic::BeforePlan,
                json!({ "goal": run.state.goal }),
            )
            .await?;
        if self.stopped_by_hook(run, &fired).await? {
            return Ok(());
        }
        let draft = match fired.verdict {
            Verdict::Skip => {
                SinglePlanner
                    .draft(run.state, &*self.provider_for(run.state))
                    .await
            }
            _ => {
                run.unless_cancelled(
                    self.planner(run.state)
                        .draft(run.state, &*self.provider_for(run.state)),
                )
                .await?
            }
        };
        match draft {
            Ok(draft) => self.commit_plan(run, draft).await,
            Err(e) => self.planning_failed(run, e).await,
        }
    }

    async fn commit_plan(&self, run: &mut Run<'_>, draft: Draft) -> Result<(), AgentError> {
        let cost_usd_micros = self.cost(run.state, &draft.usage);
        run.record(EventKind::PlanDraft {
            steps: draft.steps.clone(),
            usage: draft.usage,
            cost_usd_micros,
        })
        .await?;
        self.settle_unreserved(run, Spend::of(&draft.usage, cost_usd_micros))
            .await;
        let fired = self
            .fire(run, HookTopic::AfterPlan, json!({ "steps": draft.steps }))
            .await?;
        if self.stopped_by_hook(run, &fired).await? {
            return Ok(());
        }
        let steps: Vec<String> =
            serde_json::from_value(fired.payload["steps"].clone()).unwrap_or(draft.steps);
        if steps.is_empty() {
            return self.complete(run, None).await;
        }
        run.record(EventKind::PlanCommit { steps }).await
    }

    async fn planning_failed(&self, run: &mut Run<'_>, e: PlanError) -> Result<(), AgentError> {
        match e {
            PlanError::Provider(e) => self.provider_failed(run, e).await,
            PlanError::Invalid(why) => self.fail(run, why).await,
        }
    }

    fn planner(&self, state: &RunState) -> &dyn Planner {
        match state.config.planner {
            PlannerKind::Single => &SinglePlanner,
            PlannerKind::Model => &ModelPlanner,
        }
    }

    // ----- executing a step ------------------------------------------------

    async fn start_step(&self, run: &mut Run<'_>, index: usize) -> Result<(), AgentError> {
        let tools = match self.step_tools(&run.state.config).await {
            Ok(tools) => tools,
            Err(OfferError::Unavailable { server, reason }) => {
                return self.tool_source_unavailable(run, server, reason).await;
            }
            Err(OfferError::Invalid(why)) => {
                return self
                    .fail(run, format!("the run's tools cannot be offered: {why}"))
                    .await;
            }
        };
        // Every name the config writes must be a tool offered now, exactly
        // (an MCP tool by its own name or the name the model sees): a
        // policy for a tool that is not there would gate nothing.
        let offered: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        if let Err(e) = run.state.config.validate_tool_names(&offered, true) {
            return self
                .fail(
                    run,
                    format!(
                        "the run's config names a tool it is not offered: {}: {}",
                        e.field, e.reason
                    ),
                )
                .await;
        }
        let description = run.state.plan[index].clone();
        let fired = self
            .fire(
                run,
                HookTopic::BeforeStep,
                json!({ "index": index, "description": description }),
            )
            .await?;
        if self.stopped_by_hook(run, &fired).await? {
            return Ok(());
        }
        let description = fired.payload["description"]
            .as_str()
            .map_or(description, str::to_owned);
        // The servers' lists may have changed since the last step (a list
        // change, a restart, another worker): say how, by name.
        if run.state.step.is_some() || !run.state.step_tools.is_empty() {
            let (added, removed, changed) = tools_diff(&run.state.step_tools, &tools);
            if !(added.is_empty() && removed.is_empty() && changed.is_empty()) {
                run.record(EventKind::ToolsChanged {
                    added,
                    removed,
                    changed,
                })
                .await?;
            }
        }
        run.record(EventKind::StepStart {
            index,
            description,
            tools,
        })
        .await?;
        if fired.verdict == Verdict::Skip {
            run.record(EventKind::StepEnd {
                index,
                answer: String::new(),
                skipped: true,
            })
            .await?;
        }
        Ok(())
    }

    /// A tool source could not list the step's tools: record the attempt
    /// (`tool_source.unavailable`), then, per
    /// `RunConfig::on_tool_source_unavailable`, commit and leave the run
    /// runnable ([`AgentError::ToolSource`], try again after the backoff)
    /// or, at the last attempt, pause it ([`PauseReason::ToolSource`]) or
    /// fail it naming the server and the cause. The recorded attempts
    /// decide, not the clock: a replay reaches the same end.
    async fn tool_source_unavailable(
        &self,
        run: &mut Run<'_>,
        server: String,
        reason: String,
    ) -> Result<(), AgentError> {
        let policy = run.state.config.on_tool_source_unavailable;
        let attempt = run.state.tool_source_attempts + 1;
        let retry_in_ms = (!policy.exhausted(attempt)).then(|| policy.retry_in_ms(attempt));
        run.record(EventKind::ToolSourceUnavailable {
            server: server.clone(),
            reason: reason.clone(),
            attempt,
            retry_in_ms,
        })
        .await?;
        if let Some(retry_in_ms) = retry_in_ms {
            run.commit().await?;
            return Err(AgentError::ToolSource {
                reason,
                retry_in_ms,
            });
        }
        match policy.then {
            UnavailableAction::Pause => {
                self.pause(run, PauseReason::ToolSource { server, reason })
                    .await
            }
            UnavailableAction::Fail => {
                self.fail(
                    run,
                    format!("the run's tools cannot be listed ({attempt} attempts): {reason}"),
                )
                .await
            }
        }
    }

    /// The tools offered for a step, frozen in `step.start`: the worker's
    /// registered tools the config allows, the external tools, the MCP and
    /// HTTP tools the config names (listed from their servers now, each
    /// with its source and schema hash) — or, for a run answered from a
    /// recording, the recording's tools instead of all those — then the
    /// built-in waits it enables, and the output tool when the run has an
    /// output schema.
    async fn step_tools(&self, config: &RunConfig) -> Result<Vec<ToolSpec>, OfferError> {
        let mut tools = match &config.recorded_tools {
            // A run answered from a recording is offered its tools only,
            // and contacts no tool source.
            Some(recorded) => recorded
                .tools
                .iter()
                .map(|t| recorded_spec(config, t))
                .collect(),
            None => self.configured_tools(config).await?,
        };
        // --- issue 32: waits --- glia's built-in tools the run enabled.
        if !config.builtin_tools.is_empty() {
            tools.extend(
                config
                    .builtin_tools
                    .iter()
                    .filter_map(|name| glia_proto::config::builtin_tool_spec(name))
                    .map(|t| with_tenant_policy(config, t)),
            );
            glia_proto::ToolSpec::check_distinct(&tools)
                .map_err(|clash| OfferError::Invalid(clash.to_string()))?;
        }
        // --- end waits ---
        if let Some(schema) = &config.output_schema {
            tools.push(ToolSpec {
                name: OUTPUT_TOOL.into(),
                description: "Give your final answer by calling this tool with arguments matching its schema.".into(),
                input_schema: schema.clone(),
                idempotent: true,
                timeout_ms: 0,
                external: false,
                return_direct: false,
                cancel_grace_ms: glia_proto::DEFAULT_CANCEL_GRACE_MS,
                source: None,
                policy: None,
                max_result_bytes: None,
                output_schema: None,
            });
        }
        for tool in tools.iter_mut().filter(|t| t.name != OUTPUT_TOOL) {
            gate_by_policies(config, tool);
            tool.max_result_bytes = Some(config.max_result_bytes_for(&tool.name));
        }
        Ok(tools)
    }

    /// The tools the config names: the worker's registered tools it allows,
    /// its external tools, its agents, and its MCP and HTTP tools (listed
    /// from their servers now).
    async fn configured_tools(&self, config: &RunConfig) -> Result<Vec<ToolSpec>, OfferError> {
        let mut tools: Vec<ToolSpec> = self
            .tools
            .specs()
            .into_iter()
            .filter(|t| {
                config
                    .tools
                    .as_ref()
                    .is_none_or(|allowed| allowed.contains(&t.name))
            })
            .chain(config.external_tools.iter().cloned().map(|t| ToolSpec {
                external: true,
                ..t
            }))
            .map(|t| with_tenant_policy(config, t))
            .collect();
        // Issue 32: the agents frozen at admission, offered as tools.
        tools.extend(config.child_agents.iter().map(ToolSpec::of_agent));
        if !config.child_agents.is_empty() {
            glia_proto::ToolSpec::check_distinct(&tools)
                .map_err(|clash| OfferError::Invalid(clash.to_string()))?;
        }
        if !config.mcp.is_empty() || !config.http_tools.is_empty() {
            let sources = self.sources.as_ref().ok_or_else(|| {
                OfferError::Invalid("this worker has no catalogue for MCP and HTTP tools".into())
            })?;
            tools.extend(sources.offered(config).await?);
            glia_proto::ToolSpec::check_distinct(&tools)
                .map_err(|clash| OfferError::Invalid(clash.to_string()))?;
        }
        Ok(tools)
    }

    async fn model_turn(&self, run: &mut Run<'_>) -> Result<(), AgentError> {
        let config = run.state.config.clone();
        if let Some(limit) = run.state.limits.exhausted_for_model(&run.state.usage) {
            return self.budget_pause(run, limit).await;
        }
        if run.state.turn_calls >= config.max_model_calls_per_turn {
            return self.pause(run, PauseReason::TurnLimit).await;
        }
        // The run's declarative compaction, else the worker's compactor.
        let declared = config.compaction.as_ref().map(crate::compact::from_spec);
        if let Some(compactor) = declared.as_deref().or(self.compactor.as_deref())
            && compactor.should_compact(&run.state.messages)
        {
            match run
                .unless_cancelled(compactor.compact(
                    &run.state.messages,
                    &*self.provider_for(run.state),
                    &config.model,
                ))
                .await?
            {
                Ok(c) => {
                    let cost_usd_micros = self.cost(run.state, &c.usage);
                    let strategy = compactor.name().to_owned();
                    let kind = EventKind::ContextCompacted {
                        strategy,
                        removed: c.removed,
                        messages: c.messages,
                        usage: c.usage,
                        cost_usd_micros,
                    };
                    run.record(kind).await?;
                    self.settle_unreserved(run, Spend::of(&c.usage, cost_usd_micros))
                        .await;
                    return Ok(());
                }
                Err(e) => return self.provider_failed(run, e).await,
            }
        }
        let wrap_up = run.state.turn_calls + 1 == config.max_model_calls_per_turn;
        let forced = (config.output_schema.is_some() && run.state.reasks > 0)
            .then(|| OUTPUT_TOOL.to_owned());
        let images = self
            .provider_for(run.state)
            .takes_images(&run.state.config.model);
        let request = build_request(run.state, wrap_up, forced.clone(), images);
        // Same id for every retry of this call: the seq its model.call gets.
        let request_id = format!("{}:{}", run.state.run_id, run.state.head_seq + 1);
        if let Some(limit) = self.reserve(run, &request_id, &request).await? {
            return self.budget_pause(run, limit).await;
        }
        run.record(EventKind::ModelCall {
            model: config.model.clone(),
            messages: request.messages.len(),
            wrap_up,
            forced_tool: forced,
        })
        .await?;
        run.commit().await?;
        let started = run.clock.now();
        let sink: &dyn EventSink = &*run.sink;
        // Output redactions apply to the answer before it is recorded; its
        // raw text must not stream out live meanwhile.
        let redactor = if config.guardrails.redacts_output() {
            Some(self.declared_guardrails(&config)?)
        } else {
            None
        };
        let redacting = redactor.is_some();
        let live = |delta: LiveEvent| {
            if !(redacting
                && matches!(delta, LiveEvent::ModelDelta { ref channel, .. } if channel == "text"))
            {
                sink.live(&delta);
            }
        };
        // A cancel aborts the stream at once; `model.call` is durable, the
        // reservation stands for what the aborted call may have cost.
        let response = run
            .unless_cancelled(self.provider_for(run.state).generate(&request, &live))
            .await?;
        let duration_ms = run.elapsed_ms(started);
        match response {
            Ok(r) => {
                // What happened inside the call, in order: failed attempts,
                // then messages elided to get past a refusal (request indices
                // mapped back to the conversation messages they came from).
                for retry in r.retries {
                    run.record(EventKind::ModelRetry(retry)).await?;
                }
                if !r.elided.is_empty() {
                    let (_, origins) = repair_traced(&run.state.messages);
                    let mut elided: Vec<usize> = r
                        .elided
                        .iter()
                        .filter_map(|k| origins.get(*k))
                        .flatten()
                        .copied()
                        .collect();
                    elided.sort_unstable();
                    elided.dedup();
                    for index in elided {
                        run.record(EventKind::MessageElided {
                            index,
                            reason: "the model provider refused to process it".into(),
                        })
                        .await?;
                    }
                }
                // Why the model stopped decides whether this is an answer:
                // anything but a finished turn or a tool call is rejected
                // (kept in the event, not in the conversation) and the run's
                // stop policy re-asks, pauses or fails it.
                let mut rejected = judge_stop(run.state, &r.stop_reason, &r.message);
                // A refusal of the goal or the latest human turn is never
                // elided: it is the run's outcome, recorded with which turn.
                let refused_turn = r.refused_turn.map(|t| {
                    let (_, origins) = repair_traced(&run.state.messages);
                    let index = origins
                        .get(t.index)
                        .and_then(|o| o.first().copied())
                        .unwrap_or(t.index);
                    RefusedTurn {
                        index,
                        turn: t.turn,
                    }
                });
                if let Some(turn) = refused_turn {
                    rejected = Some(RejectedAnswer {
                        class: StopClass::Refusal,
                        action: StopAction::Fail,
                        reask: None,
                        refused_turn: Some(turn),
                    });
                }
                let action = rejected.as_ref().map(|j| (j.action, j.class));
                let cost_usd_micros = self.cost(run.state, &r.usage);
                let spent = Spend::of(&r.usage, cost_usd_micros);
                let stop_reason = r.stop_reason.clone();
                let mut redactions = Vec::new();
                let mut message = r.message;
                if let Some(redactor) = &redactor {
                    for block in &mut message.content {
                        if let ContentBlock::Text { text } = block {
                            *text = redactor.redact_output(text, &mut redactions);
                        }
                    }
                }
                run.record(EventKind::ModelResponse {
                    message,
                    usage: r.usage,
                    stop_reason: r.stop_reason,
                    duration_ms,
                    cost_usd_micros,
                    rejected,
                    redactions,
                })
                .await?;
                self.settle(run, &request_id, spent).await;
                match action {
                    None | Some((StopAction::Reask, _)) => Ok(()),
                    Some((StopAction::Pause, _)) => {
                        self.pause(run, PauseReason::ModelStop { stop_reason })
                            .await
                    }
                    Some((StopAction::Fail, class)) => {
                        let error = match refused_turn {
                            Some(t) => format!(
                                "the model provider refused to process {} (message {}; stop reason {stop_reason:?})",
                                t.turn.describe(),
                                t.index
                            ),
                            None => format!("{} (stop reason {stop_reason:?})", class.describe()),
                        };
                        self.fail(run, error).await
                    }
                }
            }
            Err(e) => {
                self.settle(run, &request_id, Spend::ZERO).await;
                self.provider_failed(run, e).await
            }
        }
    }

    /// The model answered without calling tools (or its structured output was
    /// accepted): check the answer and end the step, or re-ask.
    async fn conclude(&self, run: &mut Run<'_>) -> Result<(), AgentError> {
        let index = run.state.step.expect("a step is running");
        if let Some(output) = &run.state.output {
            let answer = canonical_json(output);
            return self.end_step(run, index, answer).await;
        }
        let answer = run
            .state
            .messages
            .last()
            .map(|m| m.text())
            .unwrap_or_default();
        if run.state.config.output_schema.is_some() {
            let reason = format!("the answer must be given by calling {OUTPUT_TOOL}");
            return self.reject_answer(run, "output_schema", reason).await;
        }
        let declared = self.declared_guardrails(&run.state.config)?;
        let tripped = declared.check_output(&answer).err();
        if let Some((name, reason)) = tripped.or_else(|| {
            self.output_guardrails
                .iter()
                .find_map(|g| g.check(&answer).err().map(|r| (g.name.clone(), r)))
        }) {
            return self.reject_answer(run, &name, reason).await;
        }
        self.end_step(run, index, answer).await
    }

    async fn reject_answer(
        &self,
        run: &mut Run<'_>,
        guardrail: &str,
        reason: String,
    ) -> Result<(), AgentError> {
        let out_of_reasks = run.state.reasks >= run.state.config.max_reasks;
        let reask = (!out_of_reasks).then(|| {
            Insert::Reask.wrap(&format!(
                "Your answer was rejected ({reason}). Answer again."
            ))
        });
        run.record(EventKind::GuardrailTripped {
            stage: GuardrailStage::Output,
            guardrail: guardrail.to_owned(),
            reason: reason.clone(),
            reask,
        })
        .await?;
        if out_of_reasks {
            return self
                .fail(run, format!("answer rejected by {guardrail}: {reason}"))
                .await;
        }
        Ok(())
    }

    async fn end_step(
        &self,
        run: &mut Run<'_>,
        index: usize,
        answer: String,
    ) -> Result<(), AgentError> {
        run.record(EventKind::StepEnd {
            index,
            answer: answer.clone(),
            skipped: false,
        })
        .await?;
        let fired = self
            .fire(
                run,
                HookTopic::AfterStep,
                json!({ "index": index, "answer": answer }),
            )
            .await?;
        self.stopped_by_hook(run, &fired).await.map(|_| ())
    }

    // ----- tool calls ------------------------------------------------------

    async fn tool_calls(
        &self,
        run: &mut Run<'_>,
        interrupted: &[String],
    ) -> Result<(), AgentError> {
        // 1. Calls a crash interrupted: re-run idempotent ones; for the
        //    others, by the run's policy, an "outcome unknown" result or a
        //    person's word on running them again.
        //    First, a result its worker held but did not commit (the
        //    database was away longer than its lease) is committed now: the
        //    call ran, nobody is asked again. A call a person has just
        //    approved running again is looked up too: its first run may
        //    have returned and been held since the person was asked; then
        //    it is recovered, not run a second time.
        let reapproved: Vec<String> = run
            .state
            .pending_calls
            .iter()
            .filter(|c| {
                c.interrupted && c.cleared_without_result() && !interrupted.contains(&c.call_id)
            })
            .map(|c| c.call_id.clone())
            .collect();
        for call_id in interrupted.iter().chain(&reapproved) {
            let Some(call) = run
                .state
                .call(call_id)
                .filter(|c| c.cleared_without_result())
                .cloned()
            else {
                continue;
            };
            let key = idempotency_key(run.state, call_id);
            let held = match run.sink.held(&key).await {
                Ok(Some(Held::Finished(held))) if held.call_id == *call_id => held,
                // Nothing of this advance is committed: a payload it accepted
                // (an approval of another call of the turn) stays in the
                // inbox, so that the next try sees that call as cleared by
                // the payload, not as interrupted.
                Ok(Some(Held::Running)) => return Err(AgentError::CallRunning(call_id.clone())),
                Ok(_) => continue,
                Err(e) => {
                    return Err(AgentError::HeldResults(e.0));
                }
            };
            let reminder = match &call.disposition {
                Some(Disposition::Run { reminder }) => reminder.clone(),
                _ => None,
            };
            run.record(EventKind::ToolRecovered {
                call_id: call_id.clone(),
                idempotency_key: key,
            })
            .await?;
            let outcome = match held.error {
                None => Ok(held.content),
                Some(kind) => Err(ToolFailure {
                    kind,
                    message: held.content.to_text().into_owned(),
                }),
            };
            // Held results were screened before they were held.
            self.record_outcome(
                run,
                call_id.clone(),
                &call.name,
                reminder,
                (outcome, Vec::new()),
                held.duration_ms,
            )
            .await?;
        }
        for call_id in interrupted {
            let Some(call) = run
                .state
                .call(call_id)
                .filter(|c| c.result.is_none())
                .cloned()
            else {
                continue;
            };
            let idempotent = run
                .state
                .step_tools
                .iter()
                .any(|t| t.name == call.name && t.idempotent);
            if idempotent {
                continue;
            }
            let kind = match run.state.config.on_interrupted_call {
                InterruptedCall::OutcomeUnknown => {
                    let message = Insert::OutcomeUnknown
                        .wrap("The worker stopped while this call was running; whether it took effect is unknown. Check before repeating it.");
                    EventKind::ToolError {
                        call_id: call_id.clone(),
                        error: ToolErrorKind::OutcomeUnknown,
                        message,
                        duration_ms: 0,
                    }
                }
                InterruptedCall::RequireApproval => {
                    let expires_at = approval_deadline(run);
                    EventKind::ApprovalRequested {
                        call_id: call.call_id,
                        tool: call.name,
                        input: call.input,
                        args_hash: call.args_hash,
                        expires_at,
                        interrupted: true,
                    }
                }
            };
            run.record(kind).await?;
        }
        // 2. Decide each new call, in call order.
        let mut blocked = None;
        let undecided: Vec<String> = run
            .state
            .pending_calls
            .iter()
            .filter(|c| c.disposition.is_none())
            .map(|c| c.call_id.clone())
            .collect();
        for call_id in undecided {
            if let Decided::BudgetBlocked(limit) = self.decide(run, &call_id).await? {
                blocked = Some(limit);
                break;
            }
            if run.state.phase == Phase::Done {
                return Ok(());
            }
        }
        // 3. Refusals, approvals requests and rejections a crash cut short
        //    (decided, but their follow-up event was not recorded).
        let refused: Vec<(String, ToolErrorKind, String)> = run
            .state
            .pending_calls
            .iter()
            .filter(|c| c.result.is_none())
            .filter_map(|c| match &c.disposition {
                Some(Disposition::Refused { error, message }) => {
                    Some((c.call_id.clone(), *error, message.clone()))
                }
                _ => None,
            })
            .collect();
        for (call_id, error, message) in refused {
            run.record(EventKind::ToolError {
                call_id,
                error,
                message,
                duration_ms: 0,
            })
            .await?;
        }
        let due: Vec<(String, String, Value, String)> = run
            .state
            .pending_calls
            .iter()
            .filter(|c| c.approval == ApprovalStatus::Due)
            .map(|c| {
                (
                    c.call_id.clone(),
                    c.name.clone(),
                    c.input.clone(),
                    c.args_hash.clone(),
                )
            })
            .collect();
        for (call_id, tool, input, args_hash) in due {
            let expires_at = approval_deadline(run);
            run.record(EventKind::ApprovalRequested {
                call_id,
                tool,
                input,
                args_hash,
                expires_at,
                interrupted: false,
            })
            .await?;
        }
        let rejected: Vec<(String, bool)> = run
            .state
            .pending_calls
            .iter()
            .filter(|c| c.result.is_none() && c.approval == ApprovalStatus::Rejected)
            .map(|c| (c.call_id.clone(), c.interrupted))
            .collect();
        for (call_id, interrupted) in rejected {
            let kind = if interrupted {
                let message = Insert::OutcomeUnknown
                    .wrap("The worker stopped while this call was running, and a person chose not to run it again. Whether it took effect is unknown.");
                EventKind::ToolError {
                    call_id,
                    error: ToolErrorKind::OutcomeUnknown,
                    message,
                    duration_ms: 0,
                }
            } else {
                EventKind::ToolError {
                    call_id,
                    error: ToolErrorKind::Rejected,
                    message: "A person rejected this call.".to_owned(),
                    duration_ms: 0,
                }
            };
            run.record(kind).await?;
        }
        // 3b. Arguments an approver edited are asked about again, like the
        //     model's: no hook or policy is undone by an edit.
        self.recheck_edited(run).await?;
        // 4. Run what may run, concurrently; record results in call order.
        self.execute(run).await?;
        // 5. Park on what is still due.
        if let Some(limit) = blocked {
            return self.budget_pause(run, limit).await;
        }
        if run.state.phase == Phase::AwaitingTool
            && let Some(pull_point) = run.state.tool_park()
        {
            run.record(EventKind::SessionPause {
                pull_point: pull_point.clone(),
            })
            .await?;
            self.observe(run, HookTopic::OnPause, json!({ "pull_point": pull_point }));
        }
        Ok(())
    }

    /// Hooks, then policies, then the budget decide one call; records
    /// `tool.call` and, for a refused call, its `tool.error`, for an approval
    /// its `approval.requested`.
    async fn decide(&self, run: &mut Run<'_>, call_id: &str) -> Result<Decided, AgentError> {
        let call = run
            .state
            .call(call_id)
            .expect("undecided call is in the batch")
            .clone();
        let fired = self
            .fire(
                run,
                HookTopic::BeforeToolCall,
                json!({ "call_id": call.call_id, "name": call.name, "input": call.input }),
            )
            .await?;
        let input = fired
            .payload
            .get("input")
            .cloned()
            .unwrap_or(call.input.clone());
        let spec = run.state.step_tools.iter().find(|t| t.name == call.name);
        let refusal = |error, message: String| Disposition::Refused { error, message };
        // Every tool's arguments, external ones included, are checked against
        // its schema before anyone acts on them: malformed JSON or a schema
        // violation is an error result the model sees and can correct, never
        // a payload for a client or an approver. (The output tool is checked
        // as structured output below.)
        let invalid = spec
            .filter(|t| t.name != OUTPUT_TOOL)
            .and_then(|t| self.invalid_arguments(t, &input));
        // What the decision needs of the spec: whether its source asks for
        // an approval, whether the caller runs it.
        let spec = spec.map(|t| {
            (
                t.requires_approval(),
                t.external,
                matches!(t.source, Some(glia_proto::ToolSource::Agent { .. })),
            )
        });
        let disposition = match (&fired.verdict, &spec) {
            (Verdict::Cancel(reason), _) => refusal(
                ToolErrorKind::Cancelled,
                format!("A hook cancelled this call: {reason}"),
            ),
            (Verdict::Skip, _) => {
                refusal(ToolErrorKind::Cancelled, "A hook skipped this call.".into())
            }
            (_, None) => {
                let names: Vec<&str> = run
                    .state
                    .step_tools
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect();
                refusal(
                    ToolErrorKind::UnknownTool,
                    format!(
                        "Unknown tool {:?}. Available tools: {}.",
                        call.name,
                        names.join(", ")
                    ),
                )
            }
            (_, Some(_)) if call.name == OUTPUT_TOOL => {
                match self.check_output(&run.state.config, &input) {
                    Ok(()) => Disposition::Run { reminder: None },
                    Err(reason) => {
                        let out_of_reasks = run.state.reasks >= run.state.config.max_reasks;
                        let kind = EventKind::GuardrailTripped {
                            stage: GuardrailStage::Output,
                            guardrail: "output_schema".into(),
                            reason: reason.clone(),
                            reask: None,
                        };
                        run.record(kind).await?;
                        if out_of_reasks {
                            self.fail(run, format!("structured output rejected: {reason}"))
                                .await?;
                            return Ok(Decided::Recorded);
                        }
                        let text = Insert::Reask.wrap(&format!("The arguments do not match the output schema: {reason}. Call {OUTPUT_TOOL} again."));
                        refusal(ToolErrorKind::InvalidArguments, text)
                    }
                }
            }
            // Arguments a hook changed are checked like the model's; a
            // change the schema refuses is never run (fail closed), and the
            // model is told it was the hook's, not its own.
            (_, Some(_)) if invalid.is_some() && input != call.input => refusal(
                ToolErrorKind::Cancelled,
                format!(
                    "A hook changed this call's arguments to ones the tool's schema refuses, so it was not run: {}",
                    invalid.clone().unwrap_or_default()
                ),
            ),
            (_, Some(_)) if invalid.is_some() => refusal(
                ToolErrorKind::InvalidArguments,
                invalid.clone().unwrap_or_default(),
            ),
            (_, Some((source_requires_approval, external, agent))) => {
                match CompiledPolicies::new(&run.state.config.policies)
                    .map(|p| p.decide(&call.name, &input))
                {
                    Err(e) => refusal(ToolErrorKind::Denied, format!("Denied: {e}")),
                    Ok(PolicyAction::Deny { reason }) => {
                        refusal(ToolErrorKind::Denied, format!("Denied by policy: {reason}"))
                    }
                    // --- issue 32: waits --- a built-in wait is never run
                    // by a worker nor approved: it parks the run.
                    Ok(_) if run.state.config.builtin_tools.contains(&call.name) => {
                        let now_ms = run.clock.now().timestamp_millis();
                        match glia_proto::wait::parse_wait(&call.name, &input, now_ms) {
                            Ok(wait) => Disposition::Wait { wait },
                            Err(message) => refusal(ToolErrorKind::InvalidArguments, message),
                        }
                    }
                    // --- end waits ---
                    // Issue 32: an agent tool starts a child run (a policy
                    // may deny it; approvals gate the child's own calls).
                    Ok(_) if *agent => Disposition::Child,
                    Ok(PolicyAction::RequireApproval) => Disposition::Approval,
                    Ok(_) if *source_requires_approval => Disposition::Approval,
                    Ok(_) if *external => Disposition::External,
                    Ok(PolicyAction::Remind { text }) => Disposition::Run {
                        reminder: Some(text),
                    },
                    Ok(PolicyAction::Allow) => Disposition::Run { reminder: None },
                }
            }
        };
        if !matches!(disposition, Disposition::Refused { .. })
            && let Some(limit) = run.state.limits.exhausted_for_tool(&run.state.usage)
        {
            return Ok(Decided::BudgetBlocked(limit));
        }
        let hash = args_hash(&input);
        let idempotency_key = idempotency_key(run.state, &call.call_id);
        let record = ToolCallRecord {
            call_id: call.call_id.clone(),
            name: call.name.clone(),
            input: input.clone(),
            args_hash: hash.clone(),
            idempotency_key,
            disposition: disposition.clone(),
        };
        run.record(EventKind::ToolCall(record)).await?;
        if let Disposition::Refused { error, message } = disposition {
            run.record(EventKind::ToolError {
                call_id: call.call_id,
                error,
                message,
                duration_ms: 0,
            })
            .await?;
        } else if disposition == Disposition::Approval {
            let expires_at = approval_deadline(run);
            run.record(EventKind::ApprovalRequested {
                call_id: call.call_id,
                tool: call.name,
                input,
                args_hash: hash,
                expires_at,
                interrupted: false,
            })
            .await?;
        }
        Ok(Decided::Recorded)
    }

    /// Calls a worker is about to run with arguments an approver edited
    /// ([`glia_proto::PendingCall::edited`]): the `before_tool_call` hooks
    /// (in-process, then HTTP; their answers recorded under the edited
    /// payload's key, so a resume does not ask again) and the policies see
    /// the edited arguments first. A hook's cancel or skip, a hook's change
    /// (the person approved these arguments, not the changed ones), a
    /// failure under `fail_closed`, or a policy's deny refuses the call
    /// (`tool.error`, the model reads why); it never runs. Calls the caller
    /// runs (external tools) are the caller's: it was given the edited
    /// arguments with the approval.
    async fn recheck_edited(&self, run: &mut Run<'_>) -> Result<(), AgentError> {
        let edited: Vec<(String, String, Value)> = run
            .state
            .pending_calls
            .iter()
            .filter(|c| c.edited && c.result.is_none() && !c.external)
            .filter(|c| c.approval == ApprovalStatus::Approved)
            .map(|c| (c.call_id.clone(), c.name.clone(), c.input.clone()))
            .collect();
        for (call_id, name, input) in edited {
            let fired = self
                .fire(
                    run,
                    HookTopic::BeforeToolCall,
                    json!({ "call_id": call_id, "name": name, "input": input }),
                )
                .await?;
            let changed = fired.payload.get("input").is_some_and(|i| *i != input);
            let refused = match &fired.verdict {
                Verdict::Cancel(reason) => Some((
                    ToolErrorKind::Cancelled,
                    format!("A person edited this call's arguments, and a hook refused the edited ones: {reason}"),
                )),
                Verdict::Skip => Some((
                    ToolErrorKind::Cancelled,
                    "A person edited this call's arguments, and a hook skipped the edited call.".to_owned(),
                )),
                _ if changed => Some((
                    ToolErrorKind::Cancelled,
                    "A person edited this call's arguments, and a hook changed the edited ones; arguments no person approved are not run.".to_owned(),
                )),
                _ => match CompiledPolicies::new(&run.state.config.policies)
                    .map(|p| p.decide(&name, &input))
                {
                    Err(e) => Some((ToolErrorKind::Denied, format!("Denied: {e}"))),
                    Ok(PolicyAction::Deny { reason }) => Some((
                        ToolErrorKind::Denied,
                        format!("A person edited this call's arguments, and a policy denies the edited ones: {reason}"),
                    )),
                    Ok(_) => None,
                },
            };
            if let Some((error, message)) = refused {
                run.record(EventKind::ToolError {
                    call_id,
                    error,
                    message,
                    duration_ms: 0,
                })
                .await?;
            }
        }
        Ok(())
    }

    /// Run every call that is cleared and has no result, concurrently, then
    /// record the results in call order.
    async fn execute(&self, run: &mut Run<'_>) -> Result<(), AgentError> {
        let ready: Vec<(String, String, Value, Option<String>)> = run
            .state
            .pending_calls
            .iter()
            .filter(|c| c.result.is_none())
            .filter_map(|c| match &c.disposition {
                Some(Disposition::Run { reminder }) if c.approval != ApprovalStatus::Requested => {
                    Some((
                        c.call_id.clone(),
                        c.name.clone(),
                        c.input.clone(),
                        reminder.clone(),
                    ))
                }
                Some(Disposition::Approval)
                    if c.approval == ApprovalStatus::Approved && !c.external =>
                {
                    Some((c.call_id.clone(), c.name.clone(), c.input.clone(), None))
                }
                _ => None,
            })
            .collect();
        if ready.is_empty() {
            return Ok(());
        }
        let run_id = run.state.run_id;
        let clock = run.clock;
        let keys: Vec<String> = ready
            .iter()
            .map(|(call_id, ..)| idempotency_key(run.state, call_id))
            .collect();
        // Marked running before the commit that clears them lands, and
        // while they run, so that a worker that takes the run over (this
        // one lost the lease) waits for their results instead of calling
        // them interrupted. A commit fenced by the lease thus proves the
        // marks were there while the lease was held.
        if let Err(e) = run.sink.mark_running(&keys).await {
            tracing::warn!(run_id = %run_id, error = %e, "tool calls not marked running; running them all the same");
        }
        run.commit().await?;
        // Each call's grace period after a cancel, from the step's frozen tool list.
        let grace = |name: &str| {
            let ms = run
                .state
                .step_tools
                .iter()
                .find(|t| t.name == name)
                .map_or(glia_proto::DEFAULT_CANCEL_GRACE_MS, |t| t.cancel_grace_ms);
            std::time::Duration::from_millis(ms)
        };
        // A cancel while the calls run does not stop them: each may finish
        // within its grace period and its result is recorded; a call still
        // running then is abandoned (its task aborted) as `outcome_unknown`.
        let cancel = run.sink.cancelled().shared();
        let (sink, step_tools) = (&*run.sink, &run.state.step_tools);
        let (recorded, messages) = (
            run.state.config.recorded_tools.as_ref(),
            &run.state.messages,
        );
        // The marks refreshed while the calls run, each refresh bounded.
        let marks = async {
            loop {
                tokio::time::sleep(glia_proto::RUNNING_MARK_REFRESH).await;
                match tokio::time::timeout(
                    glia_proto::RUNNING_MARK_REFRESH,
                    sink.mark_running(&keys),
                )
                .await
                {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(run_id = %run_id, error = %e, "running tool calls' marks not refreshed")
                    }
                    Err(_) => {
                        tracing::warn!(run_id = %run_id, "running tool calls' marks not refreshed in time")
                    }
                }
            }
        };
        let calls = futures::future::join_all(ready.iter().zip(keys.iter().cloned()).map(|((call_id, name, input, _), idempotency_key)| {
            let ctx = ToolContext { run_id, call_id: call_id.clone(), idempotency_key };
            let (cancel, grace) = (cancel.clone(), grace(name));
            // MCP and HTTP tools run through the worker's tool sources;
            // an MCP tool's progress notifications become live `tool.progress`.
            let sourced = step_tools.iter().find(|t| t.name == *name && t.source.is_some()).zip(self.sources.as_deref());
            async move {
                let started = clock.now();
                let progress = |message: String| sink.live(&LiveEvent::ToolProgress { call_id: ctx.call_id.clone(), message });
                let work = async {
                    match (recorded, sourced) {
                        _ if name == OUTPUT_TOOL => Ok("Output accepted.".into()),
                        // A run answered from a recording runs no tool.
                        (Some(recorded), _) => recorded_answer(recorded, messages, &ctx.call_id, name, input),
                        (None, Some((spec, sources))) => sources.execute(spec, input.clone(), &ctx, &progress).await,
                        (None, None) => self.tools.execute(name, input.clone(), ctx.clone()).await.map(ToolContent::from),
                    }
                };
                let result = tokio::select! {
                    result = work => result,
                    () = async { cancel.await; tokio::time::sleep(grace).await } => Err(ToolFailure {
                        kind: ToolErrorKind::OutcomeUnknown,
                        message: Insert::OutcomeUnknown.wrap(&format!(
                            "The run was cancelled while this call was running, and it did not finish within its grace period of {} ms; whether it took effect is unknown.",
                            grace.as_millis()
                        )),
                    }),
                };
                (result, u64::try_from((clock.now() - started).num_milliseconds()).unwrap_or(0))
            }
        }));
        let outcomes = tokio::select! {
            outcomes = calls => outcomes,
            never = marks => match never {},
        };
        let cancelled = cancel.peek().is_some();
        drop(cancel);
        // The results exist. Screen them first (a withheld or redacted result
        // is never stored as it came, not even in the ledger), then hold them
        // where the next worker finds them, before anything else can fail,
        // so that a commit that never lands throws nothing away (see
        // `tool_calls`, step 1).
        let mut screened = Vec::with_capacity(outcomes.len());
        for ((call_id, ..), (result, duration_ms)) in ready.iter().zip(outcomes) {
            let (result, redactions) = self.screen_result(run, call_id, result).await?;
            screened.push((result, redactions, duration_ms));
        }
        let held: Vec<(String, HeldResult)> = ready
            .iter()
            .zip(&screened)
            .map(|((call_id, ..), (result, _, duration_ms))| {
                let (content, error) = match result {
                    Ok(content) => (content.clone(), None),
                    Err(f) => (ToolContent::Text(f.message.clone()), Some(f.kind)),
                };
                (
                    idempotency_key(run.state, call_id),
                    HeldResult {
                        call_id: call_id.clone(),
                        content,
                        error,
                        duration_ms: *duration_ms,
                    },
                )
            })
            .collect();
        if let Err(e) = run.sink.hold(&held).await {
            tracing::warn!(run_id = %run_id, error = %e, "tool results not held; committing them to the log all the same");
        }
        for ((call_id, name, _, reminder), (result, redactions, duration_ms)) in
            ready.into_iter().zip(screened)
        {
            self.record_outcome(
                run,
                call_id,
                &name,
                reminder,
                (result, redactions),
                duration_ms,
            )
            .await?;
        }
        if cancelled {
            run.commit().await?;
            return Err(AgentError::Cancelled);
        }
        Ok(())
    }

    /// Record what a call returned (`after_tool_call` hooks, then its
    /// `tool.result` or `tool.error`): as it returns, or recovered from a
    /// held result.
    async fn record_outcome(
        &self,
        run: &mut Run<'_>,
        call_id: String,
        name: &str,
        reminder: Option<String>,
        (result, redactions): Screened,
        duration_ms: u64,
    ) -> Result<(), AgentError> {
        let (content, is_error) = match &result {
            Ok(content) => (content.clone(), false),
            Err(f) => (ToolContent::Text(f.message.clone()), true),
        };
        // The hook sees `content` as stored: a string, or (with images)
        // the list of blocks; what it puts back is read the same way.
        let fired = self.fire(run, HookTopic::AfterToolCall, json!({ "call_id": call_id, "name": name, "content": content, "is_error": is_error })).await?;
        let content = ToolContent::deserialize(&fired.payload["content"]).unwrap_or(content);
        let kind = match result {
            Ok(_) => EventKind::ToolResult {
                call_id,
                content,
                reminder,
                duration_ms,
                redactions,
            },
            Err(ToolFailure { kind, .. }) => EventKind::ToolError {
                call_id,
                error: kind,
                message: content.to_text().into_owned(),
                duration_ms,
            },
        };
        run.record(kind).await
    }

    // ----- reflecting ------------------------------------------------------

    async fn reflect(&self, run: &mut Run<'_>) -> Result<(), AgentError> {
        if run.state.config.conversational {
            run.record(EventKind::SessionPause {
                pull_point: PullPoint::AwaitingInput,
            })
            .await?;
            self.observe(
                run,
                HookTopic::OnPause,
                json!({ "pull_point": PullPoint::AwaitingInput }),
            );
            return Ok(());
        }
        match run
            .unless_cancelled(
                self.planner(run.state)
                    .reflect(run.state, &*self.provider_for(run.state)),
            )
            .await?
        {
            Ok(Reflection::Next) => {
                let next = run.state.step.map_or(0, |s| s + 1);
                self.start_step(run, next).await
            }
            Ok(Reflection::Replan(draft)) => self.commit_plan(run, draft).await,
            Ok(Reflection::Done) => self.complete(run, None).await,
            Err(e) => self.planning_failed(run, e).await,
        }
    }

    // ----- endings and pauses ----------------------------------------------

    /// Complete the run with `answer`, or with the last step's answer.
    async fn complete(&self, run: &mut Run<'_>, answer: Option<String>) -> Result<(), AgentError> {
        let answer = answer.unwrap_or_else(|| run.state.answer.clone());
        let outcome = Outcome::Succeeded {
            answer,
            output: run.state.output.clone(),
        };
        run.record(EventKind::SessionComplete {
            outcome: outcome.clone(),
        })
        .await?;
        self.observe(run, HookTopic::OnComplete, json!({ "outcome": outcome }));
        Ok(())
    }

    async fn fail(&self, run: &mut Run<'_>, error: String) -> Result<(), AgentError> {
        run.record(EventKind::Error {
            message: error.clone(),
            fatal: true,
        })
        .await?;
        self.observe(run, HookTopic::OnError, json!({ "message": error }));
        let outcome = Outcome::Failed { error };
        run.record(EventKind::SessionComplete {
            outcome: outcome.clone(),
        })
        .await?;
        self.observe(run, HookTopic::OnComplete, json!({ "outcome": outcome }));
        Ok(())
    }

    /// Transient failures leave the run runnable (the caller retries); a
    /// spending cap or a rejected API key pauses it (an operator resumes it
    /// once fixed); anything else fails it.
    async fn provider_failed(&self, run: &mut Run<'_>, e: ProviderError) -> Result<(), AgentError> {
        match e {
            e if e.is_transient() => {
                run.record(EventKind::Error {
                    message: e.to_string(),
                    fatal: false,
                })
                .await?;
                self.observe(run, HookTopic::OnError, json!({ "message": e.to_string() }));
                run.commit().await?;
                Err(AgentError::Provider(e))
            }
            ProviderError::SpendCap(reason) => {
                self.pause(run, PauseReason::Provider { reason }).await
            }
            e @ (ProviderError::Auth(_) | ProviderError::NotConfigured(_)) => {
                self.pause(
                    run,
                    PauseReason::Provider {
                        reason: e.to_string(),
                    },
                )
                .await
            }
            e => self.fail(run, format!("model call failed: {e}")).await,
        }
    }

    async fn budget_pause(
        &self,
        run: &mut Run<'_>,
        limit: glia_proto::Limit,
    ) -> Result<(), AgentError> {
        self.observe(
            run,
            HookTopic::OnBudgetExceeded,
            json!({ "limit": limit, "usage": run.state.usage, "limits": run.state.limits }),
        );
        run.record(EventKind::BudgetWarn {
            limit,
            usage: run.state.usage,
            limits: run.state.limits,
        })
        .await?;
        self.pause(run, PauseReason::Budget { limit }).await
    }

    async fn pause(&self, run: &mut Run<'_>, reason: PauseReason) -> Result<(), AgentError> {
        let pull_point = PullPoint::Paused { reason };
        run.record(EventKind::SessionPause {
            pull_point: pull_point.clone(),
        })
        .await?;
        self.observe(run, HookTopic::OnPause, json!({ "pull_point": pull_point }));
        Ok(())
    }

    // ----- the budget gate (spend counted across runs) ---------------------

    /// Reserve room for `request` with the budget gate, if there is one:
    /// `Some(limit)` when refused. A gate that cannot decide leaves the run
    /// runnable: what is recorded is committed and the error returned.
    async fn reserve(
        &self,
        run: &mut Run<'_>,
        request_id: &str,
        request: &ModelRequest,
    ) -> Result<Option<glia_proto::Limit>, AgentError> {
        let Some(gate) = &self.budget_gate else {
            return Ok(None);
        };
        let usage = budget_gate::estimate_usage(request);
        let estimate = Spend::of(&usage, self.cost(run.state, &usage));
        match gate.reserve(run.state, request_id, estimate).await {
            Ok(GateDecision::Granted) => Ok(None),
            Ok(GateDecision::Exceeded(limit)) => Ok(Some(limit)),
            Err(e) => {
                run.commit().await?;
                Err(e.into())
            }
        }
    }

    /// Settle `request_id` at `actual` with the budget gate, if there is one.
    /// A failure is logged, not fatal: the reservation, if the counter holds
    /// one, stands for the actual amount.
    async fn settle(&self, run: &Run<'_>, request_id: &str, actual: Spend) {
        if let Some(gate) = &self.budget_gate
            && let Err(e) = gate.settle(run.state, request_id, actual).await
        {
            tracing::warn!(run_id = %run.state.run_id, request_id, error = %e, "budget not settled");
        }
    }

    /// Count spend nothing was reserved for (a plan draft, a compaction),
    /// under the id of the event just recorded.
    async fn settle_unreserved(&self, run: &Run<'_>, spent: Spend) {
        if spent != Spend::ZERO {
            self.settle(
                run,
                &format!("{}:{}", run.state.run_id, run.state.head_seq),
                spent,
            )
            .await;
        }
    }

    // ----- hooks, guardrails, helpers --------------------------------------

    /// Fire an intercepting topic: the in-process hooks, then, unless one
    /// ended the chain, the run's HTTP hooks of the topic; record the
    /// effects it honours.
    async fn fire(
        &self,
        run: &mut Run<'_>,
        topic: HookTopic,
        payload: Value,
    ) -> Result<Fired, AgentError> {
        let mut fired = self.hooks.fire(topic, payload.clone());
        if !honours(topic, &fired.verdict) {
            fired.verdict = Verdict::Continue;
        }
        for (hook, effect) in fired.effects.clone() {
            if honours_effect(topic, &effect) {
                run.record(EventKind::HookApplied {
                    topic,
                    hook,
                    effect,
                    call: None,
                })
                .await?;
            }
        }
        if fired.verdict == Verdict::Continue {
            self.fire_http(run, topic, &mut fired).await?;
        }
        if !matches!(
            topic,
            HookTopic::AfterPlan
                | HookTopic::BeforeStep
                | HookTopic::BeforeToolCall
                | HookTopic::AfterToolCall
        ) {
            fired.payload = payload;
        }
        Ok(fired)
    }

    /// The run's HTTP hooks of the intercepting `topic`, in order, over
    /// `fired` (the payload as the in-process hooks left it): each answer
    /// is taken from the state when it is recorded there (a resume, a
    /// retry: the hook is not called again), else the hook is asked and
    /// its answer recorded as `hook.applied` with its `call` (a change as
    /// `modified`, then the verdict, `continued` included) and committed
    /// before it takes effect. The first verdict other than `continue`
    /// ends the chain.
    async fn fire_http(
        &self,
        run: &mut Run<'_>,
        topic: HookTopic,
        fired: &mut Fired,
    ) -> Result<(), AgentError> {
        let Some(http) = &self.http_hooks else {
            return Ok(());
        };
        let hooks: Vec<_> = run.hooks.on(topic).cloned().collect();
        let mut asked_any = false;
        // Commits around a hook call: not while calls of this turn are
        // cleared to run (a commit would show the next worker calls that
        // never started as interrupted); then the answers are committed
        // with them, at the commit before they run.
        let may_commit = !run
            .state
            .pending_calls
            .iter()
            .any(glia_proto::PendingCall::cleared_without_result);
        for hook in hooks {
            let key = hook_key(run.state, topic, &fired.payload);
            let (payload, effect) = match run.state.hook_answer(hook.name(), &key) {
                Some((payload, effect)) => (payload.cloned(), effect.clone()),
                None => {
                    // A hook call is an outside effect: what led to it is
                    // durable first, so a worker that dies during the call
                    // leaves the same point (the same key and `webhook-id`)
                    // to the next.
                    if !asked_any && may_commit {
                        run.commit().await?;
                    }
                    let (id, body) = run.hook_request(&hook, topic, &key, &fired.payload);
                    let asked = http.ask(&hook, topic, &body, &id).await;
                    let call = glia_proto::HookCall {
                        key,
                        outcome: asked.outcome,
                        duration_ms: asked.duration_ms,
                    };
                    let payload = asked.change.map(|(field, value)| {
                        let mut p = fired.payload.clone();
                        p[field] = value;
                        p
                    });
                    if let Some(payload) = &payload {
                        run.record(EventKind::HookApplied {
                            topic,
                            hook: hook.name().to_owned(),
                            effect: HookEffect::Modified {
                                payload: payload.clone(),
                            },
                            call: Some(call.clone()),
                        })
                        .await?;
                    }
                    let effect = match asked.verdict {
                        Verdict::Continue => HookEffect::Continued,
                        Verdict::Cancel(reason) => HookEffect::Cancelled { reason },
                        Verdict::Skip => HookEffect::Skipped,
                        Verdict::Pause(reason) => HookEffect::Paused { reason },
                    };
                    run.record(EventKind::HookApplied {
                        topic,
                        hook: hook.name().to_owned(),
                        effect: effect.clone(),
                        call: Some(call),
                    })
                    .await?;
                    asked_any = true;
                    (payload, effect)
                }
            };
            if let Some(payload) = payload {
                fired.effects.push((
                    hook.name().to_owned(),
                    HookEffect::Modified {
                        payload: payload.clone(),
                    },
                ));
                fired.payload = payload;
            }
            let verdict = match &effect {
                HookEffect::Continued | HookEffect::Modified { .. } => Verdict::Continue,
                HookEffect::Cancelled { reason } => Verdict::Cancel(reason.clone()),
                HookEffect::Skipped => Verdict::Skip,
                HookEffect::Paused { reason } => Verdict::Pause(reason.clone()),
            };
            if verdict != Verdict::Continue {
                fired.effects.push((hook.name().to_owned(), effect));
                fired.verdict = verdict;
                break;
            }
        }
        // Durable before they take effect. An answer a crash loses before
        // its commit is asked again under the same `webhook-id`.
        if asked_any && may_commit {
            run.commit().await?;
        }
        Ok(())
    }

    /// Act on a plan or step topic's verdict that stops the run here:
    /// `cancel` cancels it, `pause` parks it as paused naming the hook.
    /// True when it did.
    async fn stopped_by_hook(&self, run: &mut Run<'_>, fired: &Fired) -> Result<bool, AgentError> {
        match &fired.verdict {
            Verdict::Cancel(reason) => {
                let reason = reason.clone();
                run.record(EventKind::SessionCancel { reason }).await?;
            }
            Verdict::Pause(reason) => {
                let (hook, reason) = (last_hook(fired), reason.clone());
                self.pause(run, PauseReason::Hook { hook, reason }).await?;
            }
            Verdict::Continue | Verdict::Skip => return Ok(false),
        }
        Ok(true)
    }

    /// Fire an observing topic: subscribers see the payload; nothing they do
    /// changes the run. The run's HTTP hooks of the topic are notified
    /// after the next commit (the event is durable then), once each; their
    /// answers are not read.
    fn observe(&self, run: &mut Run<'_>, topic: HookTopic, payload: Value) {
        let _ = self.hooks.fire(topic, payload.clone());
        let Some(http) = &self.http_hooks else {
            return;
        };
        let hooks: Vec<_> = run.hooks.on(topic).cloned().collect();
        for hook in hooks {
            let key = format!("{}:{}", topic.name(), run.state.head_seq);
            let (id, body) = run.hook_request(&hook, topic, &key, &payload);
            run.notices
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .push(http.notify(hook, topic, body, id));
        }
    }

    /// The run's declarative guardrails (`RunConfig::guardrails`), compiled;
    /// they were checked before `session.start`.
    fn declared_guardrails(&self, config: &RunConfig) -> Result<CompiledGuardrails, AgentError> {
        config
            .guardrails
            .compile()
            .map_err(|e| AgentError::Config(format!("guardrails.{e}")))
    }

    /// A tool's result (or failure message) as the run's `tool_results`
    /// guardrails leave it, before anything stores, shows or sends it: the
    /// redacted text and the rules that matched, or, when a deny rule
    /// matches, a marked note in its place after a `guardrail.tripped`
    /// (stage `tool_result`) that names the rule, the call and the length,
    /// never the text. A failure's redactions are visible in its text only.
    async fn screen_result(
        &self,
        run: &mut Run<'_>,
        call_id: &str,
        result: Result<ToolContent, ToolFailure>,
    ) -> Result<Screened, AgentError> {
        if !run.state.config.guardrails.screens_tool_results() {
            return Ok((result, Vec::new()));
        }
        let declared = self.declared_guardrails(&run.state.config)?;
        let content = match &result {
            Ok(content) => content.clone(),
            Err(f) => ToolContent::Text(f.message.clone()),
        };
        let (screened, redactions) = match declared.screen_tool_result(&content) {
            Ok(screened) => screened,
            Err(withheld) => {
                let reason = format!(
                    "the result of call {call_id} was withheld ({} characters)",
                    withheld.chars
                );
                run.record(EventKind::GuardrailTripped {
                    stage: GuardrailStage::ToolResult,
                    guardrail: withheld.guardrail.clone(),
                    reason,
                    reask: None,
                })
                .await?;
                (ToolContent::Text(withheld.note()), Vec::new())
            }
        };
        Ok(match result {
            Ok(_) => (Ok(screened), redactions),
            Err(f) => (
                Err(ToolFailure {
                    kind: f.kind,
                    message: screened.to_text().into_owned(),
                }),
                Vec::new(),
            ),
        })
    }

    /// The first input guardrail that rejects `text`: the run's declared
    /// ones, then the worker's.
    fn check_input(&self, declared: &CompiledGuardrails, text: &str) -> Option<(String, String)> {
        declared.check_input(text).err().or_else(|| {
            self.input_guardrails
                .iter()
                .find_map(|g| g.check(text).err().map(|r| (g.name.clone(), r)))
        })
    }

    /// `schema` compiled, from [`Agent::validators`] (compiled once per
    /// distinct schema; two first uses at once may both compile it).
    /// Errors: why the schema does not compile (not kept: it is compiled
    /// again at the next use).
    fn validator(&self, schema: &Value) -> Result<Arc<jsonschema::Validator>, String> {
        let key = schema.to_string();
        if let Some(v) = self
            .validators
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(v.clone());
        }
        let compiled = Arc::new(jsonschema::validator_for(schema).map_err(|e| e.to_string())?);
        let mut kept = self.validators.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() >= VALIDATORS_KEPT {
            kept.clear();
        }
        kept.insert(key, compiled.clone());
        Ok(compiled)
    }

    /// Why `input` is not acceptable as arguments of `spec`, as the model will
    /// read it (see [`crate::tool::check_arguments`]); `None` when it is.
    fn invalid_arguments(&self, spec: &ToolSpec, input: &Value) -> Option<String> {
        match self.validator(&spec.input_schema) {
            Ok(validator) => crate::tool::check_arguments(&spec.name, &validator, input).err(),
            Err(e) => Some(format!(
                "Tool {} cannot be called: its input schema does not compile ({e}).",
                spec.name
            )),
        }
    }

    fn check_output(&self, config: &RunConfig, output: &Value) -> Result<(), String> {
        let schema = config
            .output_schema
            .as_ref()
            .ok_or("the run has no output schema")?;
        let validator = self.validator(schema)?;
        let problems: Vec<String> = validator
            .iter_errors(output)
            .map(|e| format!("{} at '{}'", e, e.instance_path()))
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    /// The run's prices, else the provider's (an operator's price table).
    fn cost(&self, state: &RunState, usage: &glia_proto::Usage) -> u64 {
        state
            .config
            .pricing
            .or_else(|| self.provider_for(state).pricing(&state.config.model))
            .map_or(0, |p| p.cost_usd_micros(usage))
    }

    /// The provider `state`'s run calls: the one its config names
    /// (`RunConfig::provider`), else the default. A name this agent lacks
    /// gives a provider whose every call is [`ProviderError::NotConfigured`].
    fn provider_for(&self, state: &RunState) -> Arc<dyn Provider> {
        match &state.config.provider {
            None => self.provider.clone(),
            Some(name) => self
                .named
                .get(name)
                .cloned()
                .unwrap_or_else(|| Arc::new(NotConfigured(name.clone()))),
        }
    }

    fn check_config(&self, config: &RunConfig) -> Result<(), AgentError> {
        config
            .validate()
            .map_err(|e| AgentError::Config(e.to_string()))?;
        CompiledPolicies::new(&config.policies).map_err(|e| AgentError::Config(e.to_string()))?;
        // A run answered from a recording needs none of the worker's tools.
        if let Some(allowed) = config
            .tools
            .as_ref()
            .filter(|_| config.recorded_tools.is_none())
            && let Some((i, missing)) = allowed
                .iter()
                .enumerate()
                .find(|(_, n)| self.tools.spec(n).is_none())
        {
            return Err(AgentError::Config(format!(
                "tools[{i}]: tool {missing} is not registered on this worker"
            )));
        }
        for (i, hook) in config.hooks.iter().enumerate() {
            match &self.http_hooks {
                Some(h) if h.has(hook) => {}
                Some(_) => {
                    return Err(AgentError::Config(format!(
                        "hooks[{i}]: {hook:?} is not a hook available to this run"
                    )));
                }
                None => {
                    return Err(AgentError::Config(format!(
                        "hooks[{i}]: this worker has no catalogue hooks (glia worker --catalogue FILE)"
                    )));
                }
            }
        }
        if let Some(name) = &config.provider
            && !self.named.contains_key(name)
        {
            return Err(AgentError::Config(format!(
                "provider: {name:?} is not a provider of this worker (the catalogue's [providers])"
            )));
        }
        if !config.mcp.is_empty() || !config.http_tools.is_empty() {
            match &self.sources {
                Some(sources) => sources
                    .admit(config)
                    .map_err(|e| AgentError::Config(e.to_string()))?,
                None => return Err(AgentError::Config(
                    "mcp, http_tools: this worker has no catalogue (glia worker --catalogue FILE)"
                        .into(),
                )),
            }
        }
        for t in &config.external_tools {
            if self.tools.spec(&t.name).is_some() {
                return Err(AgentError::Config(format!(
                    "external tool {} clashes with a registered tool",
                    t.name
                )));
            }
        }
        Ok(())
    }
}

/// What a recording answers a call ([`glia_proto::recorded::RecordedTools::answer`]):
/// a call it does not have fails, and nothing runs.
fn recorded_answer(
    recorded: &glia_proto::recorded::RecordedTools,
    messages: &[glia_proto::Message],
    call_id: &str,
    name: &str,
    input: &Value,
) -> Result<ToolContent, ToolFailure> {
    match recorded.answer(messages, call_id, name, input) {
        Ok(Ok(content)) => Ok(content),
        // The recorded tool's error, or a call the recording lacks.
        Ok(Err(message)) | Err(message) => Err(ToolFailure::failed(message)),
    }
}

/// A recording's tool as a step offers it ([`glia_proto::recorded`]): its
/// source [`glia_proto::ToolSource::Recorded`], the tenant's `tool_policy`
/// applied, and an approval whenever the recorded tool required one.
fn recorded_spec(config: &RunConfig, t: &glia_proto::recorded::RecordedToolSpec) -> ToolSpec {
    let spec = ToolSpec {
        name: t.name.clone(),
        description: t.description.clone(),
        input_schema: t.input_schema.clone(),
        // Answering from a recording has no effect: a call a crash
        // interrupted is answered again, never `outcome_unknown`.
        idempotent: true,
        timeout_ms: 30_000,
        external: false,
        return_direct: false,
        cancel_grace_ms: glia_proto::DEFAULT_CANCEL_GRACE_MS,
        source: Some(glia_proto::ToolSource::Recorded {
            requires_approval: t.requires_approval,
        }),
        policy: None,
        max_result_bytes: None,
        output_schema: None,
    };
    // The tenant's `tool_policy` may not make it otherwise.
    let mut spec = with_tenant_policy(config, spec);
    spec.idempotent = true;
    if let Some(policy) = spec.policy.as_mut() {
        policy.idempotent = true;
        if t.requires_approval && !policy.requires_approval {
            policy.requires_approval = true;
            policy.approval_by = crate::tool_sources::tenant_origin(config);
        }
    }
    spec
}

/// A worker's registered tool or an external tool with the tenant's
/// `tool_policy` for its name applied (approval, idempotency, timeout,
/// hand-off) and its [`ResolvedPolicy`] recorded.
fn with_tenant_policy(config: &RunConfig, mut tool: ToolSpec) -> ToolSpec {
    let tenant = config
        .tool_policy_for(&tool.name)
        .cloned()
        .unwrap_or_default();
    let by = crate::tool_sources::tenant_origin(config);
    let origin = |set: bool| if set { by } else { PolicyOrigin::Default };
    let idempotent = tenant.idempotent.unwrap_or(tool.idempotent);
    tool.policy = Some(ResolvedPolicy {
        requires_approval: tenant.requires_approval.unwrap_or(false),
        approval_by: origin(tenant.requires_approval.is_some()),
        idempotent,
        // An external tool's idempotency is the tenant's word; a registered
        // tool's is its code's (the default).
        idempotent_by: origin(tenant.idempotent.is_some() || (tool.external && tool.idempotent)),
        trusted_server: None,
    });
    tool.idempotent = idempotent;
    tool.timeout_ms = tenant.timeout_ms.unwrap_or(tool.timeout_ms);
    tool.return_direct = tenant.return_direct.unwrap_or(tool.return_direct);
    tool
}

/// When the first of the run's `policies` that matches `tool` by name (or
/// `*`) looks at no arguments and requires approval, every call needs one:
/// record it in the tool's resolved policy (the decision itself is taken
/// per call by the policies).
fn gate_by_policies(config: &RunConfig, tool: &mut ToolSpec) {
    let first = config.policies.iter().find(|p| p.applies_to(&tool.name));
    let always =
        first.is_some_and(|p| p.args.is_none() && p.action == PolicyAction::RequireApproval);
    if let Some(policy) = tool.policy.as_mut()
        && always
        && !policy.requires_approval
    {
        (policy.requires_approval, policy.approval_by) =
            (true, crate::tool_sources::tenant_origin(config));
    }
}

/// The provider of a run naming one this worker lacks.
struct NotConfigured(String);

#[async_trait]
impl Provider for NotConfigured {
    async fn generate(
        &self,
        _: &ModelRequest,
        _: &(dyn Fn(LiveEvent) + Send + Sync),
    ) -> Result<crate::provider::ModelResponse, ProviderError> {
        Err(ProviderError::NotConfigured(self.0.clone()))
    }
}

/// Whether an answer that stopped for `stop_reason` is accepted: `None` for
/// a finished answer or a tool call; otherwise the rejection the run's stop
/// policy ([`RunConfig::stop_reasons`], see [`glia_proto::stop`]) gives it.
/// A re-ask with no re-asks left (`max_reasks`) fails instead.
fn judge_stop(
    state: &RunState,
    stop_reason: &str,
    message: &glia_proto::Message,
) -> Option<RejectedAnswer> {
    let class = StopClass::of(stop_reason, message);
    let action = match state.config.stop_reasons.action(class)? {
        StopAction::Reask if state.reasks >= state.config.max_reasks => StopAction::Fail,
        action => action,
    };
    let reask = (action == StopAction::Reask).then(|| {
        let hint = match class {
            StopClass::Truncated => " Give a shorter answer, or fewer and smaller tool calls at once.",
            _ => "",
        };
        Insert::Reask.wrap(&format!("Your previous answer was not accepted: {} (stop reason {stop_reason:?}).{hint} Answer again.", class.describe()))
    });
    Some(RejectedAnswer {
        class,
        action,
        reask,
        refused_turn: None,
    })
}

/// When an approval requested now expires, per the run's config.
/// `{run_id}:{turn}:{call_id}`, where `turn` counts the run's model calls so
/// far: the same when a crash makes a worker run the call again, different for
/// a later call that reuses the id (some providers number call ids per
/// response, e.g. `call_0`).
fn idempotency_key(state: &RunState, call_id: &str) -> String {
    format!("{}:{}:{call_id}", state.run_id, state.usage.turns)
}

/// The result of the last model turn's first successful call of a tool that
/// returns directly ([`ToolSpec::return_direct`]), when the conversation ends
/// with that batch: the run completes with it instead of calling the model.
fn returned_directly(state: &RunState) -> Option<String> {
    let [.., asked, results] = state.messages.as_slice() else {
        return None;
    };
    if asked.role != Role::Assistant || results.role != Role::User {
        return None;
    }
    let direct = |id: &str| {
        asked.tool_uses().any(|(use_id, name, _)| {
            use_id == id
                && state
                    .step_tools
                    .iter()
                    .any(|t| t.name == name && t.return_direct)
        })
    };
    results.content.iter().find_map(|block| match block {
        ContentBlock::ToolResult {
            tool_use_id,
            content,
            is_error: false,
        } if direct(tool_use_id) => Some(content.to_text().into_owned()),
        _ => None,
    })
}

fn approval_deadline(run: &Run<'_>) -> Option<DateTime<Utc>> {
    let ms = run.state.config.approval_timeout_ms?;
    Some(
        run.clock.now() + chrono::Duration::milliseconds(i64::try_from(ms).unwrap_or(i64::MAX / 2)),
    )
}

/// The hook whose effect came last (the one that ended the chain).
fn last_hook(fired: &Fired) -> String {
    fired
        .effects
        .last()
        .map(|(h, _)| h.clone())
        .unwrap_or_default()
}

/// Which verdicts take effect on a topic (see the table in [`crate::hooks`]).
fn honours(topic: HookTopic, verdict: &Verdict) -> bool {
    use HookTopic::*;
    match verdict {
        Verdict::Continue => true,
        Verdict::Cancel(_) => matches!(
            topic,
            BeforePlan | AfterPlan | BeforeStep | AfterStep | BeforeToolCall
        ),
        Verdict::Skip => matches!(topic, BeforePlan | BeforeStep | BeforeToolCall),
        Verdict::Pause(_) => matches!(topic, BeforePlan | AfterPlan | BeforeStep | AfterStep),
    }
}

fn honours_effect(topic: HookTopic, effect: &HookEffect) -> bool {
    use HookTopic::*;
    match effect {
        HookEffect::Continued => true,
        HookEffect::Modified { .. } => matches!(
            topic,
            AfterPlan | BeforeStep | BeforeToolCall | AfterToolCall
        ),
        HookEffect::Cancelled { reason } => honours(topic, &Verdict::Cancel(reason.clone())),
        HookEffect::Skipped => honours(topic, &Verdict::Skip),
        HookEffect::Paused { reason } => honours(topic, &Verdict::Pause(reason.clone())),
    }
}

/// The request for the next model call: a pure function of the state, so a
/// resumed run sends byte-identical requests. History is repaired; the step's
/// frozen tools are offered; on the turn's last call a wrap-up notice is added;
/// when the model takes no images (`images` false: [`Provider::takes_images`]),
/// each image of a tool result is a marked text placeholder naming its media
/// type and size ([`ToolContent::without_images`]; the state and the log keep
/// the image).
pub fn build_request(
    state: &RunState,
    wrap_up: bool,
    forced_tool: Option<String>,
    images: bool,
) -> ModelRequest {
    let mut messages = repair(&state.messages);
    if !images {
        for block in messages.iter_mut().flat_map(|m| &mut m.content) {
            if let ContentBlock::ToolResult { content, .. } = block
                && content.images().next().is_some()
            {
                *content =
                    std::mem::replace(content, ToolContent::Text(String::new())).without_images();
            }
        }
    }
    if wrap_up && let Some(last) = messages.last_mut() {
        let notice = Insert::WrapUp.wrap("This is your last model call for this turn. Finish now: give your answer without calling tools.");
        last.content.push(ContentBlock::Text { text: notice });
    }
    ModelRequest {
        model: state.config.model.clone(),
        system: state.config.system.clone(),
        messages,
        tools: state.step_tools.clone(),
        tool_choice: forced_tool.map_or(ToolChoice::Auto, |name| ToolChoice::Tool { name }),
        max_tokens: state.config.max_tokens,
    }
}
