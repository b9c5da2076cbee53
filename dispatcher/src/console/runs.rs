//! The console's Runs pages: the list of runs, one run's page (header,
//! actions, timeline), one event in full, and the run's live timeline.
//!
//! The timeline folds the run's events with [`RunState::apply`] as it reads
//! them, page by page, so each entry shows the run as it stood at that
//! event: a model call's request is the conversation and tools the state
//! held just before the call. A page shows at most [`PAGE_EVENTS`] events
//! (the newest, with links to earlier ones) and cuts long text
//! ([`Cuts`]); `/console/runs/{id}/events/{seq}` shows one event with the
//! larger cuts of [`Cuts::ONE`] and its stored JSON.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use glia_backends::{LogError, OutcomeKind, RunStatus, RunSummary};
use glia_proto::{
    BudgetLimits, ContentBlock, Decision, Disposition, Event, EventKind, HookEffect, Message,
    Outcome, PauseReason, PullPoint, RunState, ToolSource, ToolSpec,
};
use minijinja::context;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::app::App;
use crate::auth::Scope;
use crate::control::visible_run;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, OptJson};
use crate::handlers::payloads;
use crate::inbox::{
    Session, TEMPLATES, api_error_page, checked_post, diff, error_page, field, form, html, human,
    log_error_page, policy_origin_text, redacted, session, to_login, tokio_stream_from,
};
use crate::model::{
    CancelBody, ListRunsQuery, MessageBody, PauseBody, ResumeBody, ToolResultBody, run_cursor,
};

/// The most events one run page shows.
pub const PAGE_EVENTS: u64 = 100;

/// Events read from the log at a time while folding.
const READ_PAGE: usize = 500;

/// How often the live timeline looks for new events, at least.
const LIVE_POLL_MIN: Duration = Duration::from_millis(200);

/// The console's run routes.
pub fn routes() -> Router<App> {
    Router::new()
        .route("/console/runs", get(list_page))
        .route("/console/runs/{run}", get(run_page))
        .route("/console/runs/{run}/events/{seq}", get(event_page))
        .route("/console/runs/{run}/live", get(live))
        .route("/console/runs/{run}/{action}", post(act))
        .route("/console/runs/{run}/tool-results/{call}", post(tool_result))
        .route(
            "/console/static/console.js",
            get(|| async {
                (
                    [
                        (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
                        (header::CACHE_CONTROL, "max-age=300"),
                    ],
                    include_str!("../../templates/console.js"),
                )
            }),
        )
}

// ----- formatting ------------------------------------------------------------------------

/// USD micros as dollars: `$0.000007`, `$1.50`, `$12.345678`.
pub fn usd(micros: u64) -> String {
    let cents_and_more = format!("{:06}", micros % 1_000_000);
    let trimmed = cents_and_more.trim_end_matches('0');
    let frac = if trimmed.len() < 2 {
        &cents_and_more[..2]
    } else {
        trimmed
    };
    format!("${}.{frac}", micros / 1_000_000)
}

/// A count with thousands separators: `12,345`.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// How long text may get where.
#[derive(Debug, Clone, Copy)]
pub struct Cuts {
    /// The one-line preview of a text, in characters.
    pub preview: usize,
    /// An expanded text, in characters.
    pub text: usize,
    /// The newest messages of a model call's request shown.
    pub messages: usize,
    /// One message of a request, in characters.
    pub message: usize,
}

impl Cuts {
    /// On a run page (up to [`PAGE_EVENTS`] entries).
    pub const PAGE: Cuts = Cuts {
        preview: 240,
        text: 8_000,
        messages: 12,
        message: 2_000,
    };
    /// On the page of one event.
    pub const ONE: Cuts = Cuts {
        preview: 240,
        text: 200_000,
        messages: 500,
        message: 50_000,
    };
}

/// `text` cut to `max` characters, and how many were left out.
fn cut(text: &str, max: usize) -> (String, usize) {
    match text.char_indices().nth(max) {
        None => (text.to_owned(), 0),
        Some((at, _)) => (text[..at].to_owned(), text[at..].chars().count()),
    }
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

fn snake<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

// ----- the timeline ----------------------------------------------------------------------

/// A labelled fact of an entry (`tokens`: `120 in · 40 out`).
#[derive(Debug, Clone, Serialize)]
pub struct Fact {
    label: &'static str,
    value: String,
}

/// A labelled text of an entry: a preview, and the whole (cut) text when
/// the preview does not hold it.
#[derive(Debug, Clone, Serialize)]
pub struct Text {
    label: String,
    preview: String,
    full: Option<String>,
    omitted: usize,
    /// Open by default (short texts).
    open: bool,
}

impl Text {
    fn new(label: impl Into<String>, text: &str, cuts: Cuts) -> Text {
        let (preview, rest) = cut(text, cuts.preview);
        let (full, omitted) = if rest == 0 {
            (None, 0)
        } else {
            let (full, omitted) = cut(text, cuts.text);
            (Some(full), omitted)
        };
        Text {
            label: label.into(),
            open: full.is_none(),
            preview: preview.replace('\n', " ⏎ "),
            full: full.or(Some(preview)),
            omitted,
        }
    }
}

/// A model call's request: the newest messages and the tools offered.
#[derive(Debug, Clone, Serialize)]
pub struct Request {
    messages: Vec<Text>,
    /// Messages before the first shown.
    earlier: usize,
    tools: Vec<Fact>,
    /// `3 messages, 2 tools: a, b`.
    summary: String,
}

/// One entry of the timeline: one event, as the templates see it.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    seq: u64,
    at: String,
    when: DateTime<Utc>,
    kind: &'static str,
    /// `model`, `tool`, `approval`, `input`, `plan`, `guard`, `budget`, `session`, `error`.
    group: &'static str,
    title: String,
    failed: bool,
    facts: Vec<Fact>,
    texts: Vec<Text>,
    diff: Vec<(String, String)>,
    request: Option<Request>,
    /// The inbox page of an approval.
    link: Option<String>,
}

/// The fold: the state before the next event, and what the timeline
/// remembers between events.
pub struct Fold {
    state: RunState,
    /// Failed attempts of the model call in flight.
    retries: u32,
    /// The seq of the last `model.call`.
    last_call: Option<u64>,
    /// Tool names by call id (a result names its tool).
    tools: HashMap<String, String>,
    broken: bool,
}

impl Fold {
    /// Before the first event of run `run_id`.
    pub fn new(run_id: Uuid) -> Fold {
        Fold {
            state: RunState::new(run_id),
            retries: 0,
            last_call: None,
            tools: HashMap::new(),
            broken: false,
        }
    }

    /// Apply `e` to the fold; with `cuts`, the entry of `e` first (as the
    /// run stood before it).
    pub fn step(&mut self, e: &Event, cuts: Option<Cuts>) -> Option<Entry> {
        let entry = cuts.map(|c| entry(e, self, c));
        match &e.kind {
            EventKind::ModelCall { .. } => {
                self.retries = 0;
                self.last_call = Some(e.seq);
            }
            EventKind::ModelRetry(_) => self.retries += 1,
            EventKind::ToolCall(c) => {
                self.tools.insert(c.call_id.clone(), c.name.clone());
            }
            _ => {}
        }
        if !self.broken
            && let Err(err) = self.state.apply(e)
        {
            // The log is the truth; a state that cannot follow it only
            // makes later requests less exact. Say so once.
            tracing::warn!(run_id = %e.run_id, seq = e.seq, "console timeline: event does not apply: {err}");
            self.broken = true;
        }
        entry
    }
}

fn fact(label: &'static str, value: impl Into<String>) -> Fact {
    Fact {
        label,
        value: value.into(),
    }
}

fn tokens_fact(u: &glia_proto::Usage) -> Fact {
    let mut s = format!(
        "{} in · {} out",
        count(u.input_tokens),
        count(u.output_tokens)
    );
    if u.cache_write_tokens > 0 || u.cache_read_tokens > 0 {
        s.push_str(&format!(
            " · cache {} written, {} read",
            count(u.cache_write_tokens),
            count(u.cache_read_tokens)
        ));
    }
    if u.estimated {
        s.push_str(" (estimated)");
    }
    fact("tokens", s)
}

/// Where a tool runs, from its step's tool list.
fn source_text(spec: Option<&ToolSpec>) -> String {
    match spec {
        None => "not in the step's tool list".into(),
        Some(s) if s.external => "external: the caller runs it".into(),
        Some(s) => match &s.source {
            Some(ToolSource::Mcp { server, tool, .. }) => {
                format!("MCP server {server:?}, tool {tool:?}")
            }
            Some(ToolSource::Http { url, .. }) => format!("HTTP {url}"),
            Some(ToolSource::Agent { agent, .. }) => {
                format!("agent {agent}: a child run answers it")
            }
            Some(ToolSource::Recorded { .. }) => "the run's recording answers it".into(),
            None => "worker (a registered tool)".into(),
        },
    }
}

fn policy_text(spec: &ToolSpec) -> Option<String> {
    let p = spec.policy.as_ref()?;
    Some(format!(
        "{} · approval decided by the {} ({})",
        p.describe(),
        p.approval_by.as_str(),
        policy_origin_text(p.approval_by)
    ))
}

fn pause_text(reason: &PauseReason) -> String {
    match reason {
        PauseReason::Budget { limit } => format!("budget limit reached: {limit}"),
        PauseReason::TurnLimit => "the turn used all its model calls".into(),
        PauseReason::Hook { hook, reason } => format!("hook {hook}: {reason}"),
        PauseReason::Provider { reason } => format!("the provider refuses calls: {reason}"),
        PauseReason::ModelStop { stop_reason } => {
            format!("the model's answer stopped with {stop_reason}")
        }
        PauseReason::ToolSource { server, reason } => {
            format!("tool source {server} unavailable: {reason}")
        }
        PauseReason::Operator { reason } => format!("operator: {reason}"),
    }
}

fn pull_text(p: &PullPoint) -> String {
    match p {
        PullPoint::AwaitingTool { call_ids } => {
            format!("awaiting tool results ({})", call_ids.join(", "))
        }
        PullPoint::AwaitingApproval { call_ids } => {
            format!("awaiting approval ({})", call_ids.join(", "))
        }
        PullPoint::AwaitingInput => "awaiting the user's message".into(),
        PullPoint::Paused { reason } => format!("paused: {}", pause_text(reason)),
        // issue 32: waits
        PullPoint::AwaitingTimer {
            call_ids,
            wake_at_ms,
        } if call_ids.is_empty() => format!(
            "starts at {} (start_at)",
            glia_proto::wait::rfc3339_ms(*wake_at_ms)
        ),
        PullPoint::AwaitingTimer {
            call_ids,
            wake_at_ms,
        } => format!(
            "sleeping until {} ({})",
            glia_proto::wait::rfc3339_ms(*wake_at_ms),
            call_ids.join(", ")
        ),
        PullPoint::AwaitingEvent {
            call_ids,
            keys,
            timeout_at_ms,
        } => format!(
            "awaiting an event {} ({}){}",
            keys.join(", "),
            call_ids.join(", "),
            timeout_at_ms.map_or(String::new(), |t| format!(
                ", until {}",
                glia_proto::wait::rfc3339_ms(t)
            ))
        ),
        PullPoint::AwaitingChildren { call_ids } => {
            format!("awaiting child runs ({})", call_ids.join(", "))
        }
    }
}

/// The parts of a message as labelled texts (`assistant · text`).
fn message_texts(m: &Message, cuts: Cuts, limit: usize) -> Vec<Text> {
    let role = snake(&m.role);
    m.content
        .iter()
        .map(|b| {
            let (kind, text) = match b {
                ContentBlock::Text { text } => ("text", text.clone()),
                ContentBlock::ToolUse { id, name, input } => {
                    ("tool_use", format!("{name} ({id}) {input}"))
                }
                ContentBlock::ToolResult {
                    tool_use_id,
                    content,
                    is_error,
                } => (
                    if *is_error {
                        "tool_error"
                    } else {
                        "tool_result"
                    },
                    format!("{tool_use_id}: {content}"),
                ),
                ContentBlock::Thinking { thinking, .. } => ("thinking", thinking.clone()),
                ContentBlock::RedactedThinking { .. } => {
                    ("redacted_thinking", "(redacted by the provider)".into())
                }
            };
            Text::new(
                format!("{role} · {kind}"),
                &text,
                Cuts {
                    text: limit,
                    ..cuts
                },
            )
        })
        .collect()
}

fn request(state: &RunState, cuts: Cuts) -> Request {
    let n = state.messages.len();
    let shown = n.min(cuts.messages);
    let messages = state.messages[n - shown..]
        .iter()
        .flat_map(|m| message_texts(m, cuts, cuts.message))
        .collect();
    let names: Vec<String> = state.step_tools.iter().map(|t| t.name.clone()).collect();
    let summary = format!(
        "{}, {}{}",
        plural(n, "message"),
        plural(names.len(), "tool"),
        if names.is_empty() {
            String::new()
        } else {
            format!(": {}", names.join(", "))
        }
    );
    Request {
        summary,
        messages,
        earlier: n - shown,
        tools: state
            .step_tools
            .iter()
            .map(|t| Fact {
                label: "tool",
                value: format!(
                    "{} — {} — {}",
                    t.name,
                    source_text(Some(t)),
                    cut(&t.description, 200).0
                ),
            })
            .collect(),
    }
}

/// The entry of event `e`, the fold standing just before it.
fn entry(e: &Event, fold: &Fold, cuts: Cuts) -> Entry {
    let st = &fold.state;
    let mut x = Entry {
        seq: e.seq,
        at: e.at.format("%H:%M:%S%.3f").to_string(),
        when: e.at,
        kind: e.kind.name(),
        group: "session",
        title: String::new(),
        failed: false,
        facts: Vec::new(),
        texts: Vec::new(),
        diff: Vec::new(),
        request: None,
        link: None,
    };
    let tool_name = |call_id: &str| {
        fold.tools
            .get(call_id)
            .cloned()
            .unwrap_or_else(|| call_id.to_owned())
    };
    match &e.kind {
        EventKind::SessionStart {
            goal,
            config,
            redactions,
        } => {
            x.title = "Run admitted".into();
            if let Some(a) = &config.agent {
                x.facts
                    .push(fact("agent", format!("{}@{}", a.name, a.version)));
            }
            x.facts.push(fact("model", config.model.clone()));
            x.texts.push(Text::new(
                "goal",
                &format!("{}{goal}", redacted(redactions)),
                cuts,
            ));
        }
        EventKind::PlanDraft {
            steps,
            usage,
            cost_usd_micros,
        } => {
            x.group = "plan";
            x.title = format!("Plan drafted: {}", plural(steps.len(), "step"));
            if *cost_usd_micros > 0 || usage.input_tokens > 0 {
                x.facts.push(tokens_fact(usage));
                x.facts.push(fact("cost", usd(*cost_usd_micros)));
            }
            x.texts.push(Text::new("steps", &numbered(steps), cuts));
        }
        EventKind::PlanCommit { steps } => {
            x.group = "plan";
            x.title = format!("Plan committed: {}", plural(steps.len(), "step"));
            x.texts.push(Text::new("steps", &numbered(steps), cuts));
        }
        EventKind::StepStart {
            index,
            description,
            tools,
        } => {
            x.group = "plan";
            x.title = format!("Step {} started", index + 1);
            x.texts.push(Text::new("step", description, cuts));
            let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
            x.facts.push(fact(
                "tools",
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                },
            ));
        }
        EventKind::StepEnd {
            index,
            answer,
            skipped,
        } => {
            x.group = "plan";
            x.title = if *skipped {
                format!("Step {} skipped", index + 1)
            } else {
                format!("Step {} ended", index + 1)
            };
            if !answer.is_empty() {
                x.texts.push(Text::new("answer", answer, cuts));
            }
        }
        EventKind::ModelCall {
            model,
            messages,
            wrap_up,
            forced_tool,
        } => {
            x.group = "model";
            x.title = format!("Model call to {model}");
            x.facts.push(fact(
                "request",
                format!(
                    "{} · {}",
                    plural(*messages, "message"),
                    plural(st.step_tools.len(), "tool")
                ),
            ));
            if *wrap_up {
                x.facts.push(fact("wrap-up", "the turn's last call"));
            }
            if let Some(t) = forced_tool {
                x.facts.push(fact("forced tool", t.clone()));
            }
            x.request = Some(request(st, cuts));
        }
        EventKind::ModelRetry(r) => {
            x.group = "model";
            x.failed = true;
            x.title = format!(
                "Attempt {} failed ({}), retried in {}",
                r.attempt,
                r.cause,
                human(r.delay_ms as i64)
            );
            x.texts.push(Text::new("error", &r.message, cuts));
        }
        EventKind::MessageElided { index, reason } => {
            x.group = "model";
            x.title = format!("Message {index} elided: {reason}");
            if let Some(m) = st.messages.get(*index) {
                x.texts.extend(message_texts(m, cuts, cuts.text));
            }
        }
        EventKind::ModelResponse {
            message,
            usage,
            stop_reason,
            duration_ms,
            cost_usd_micros,
            rejected,
            redactions,
        } => {
            x.group = "model";
            x.title = format!("Model answered ({stop_reason})");
            x.facts.push(fact("stop reason", stop_reason.clone()));
            x.facts.push(tokens_fact(usage));
            x.facts.push(fact("cost", usd(*cost_usd_micros)));
            x.facts.push(fact("latency", human(*duration_ms as i64)));
            x.facts.push(fact("retries", fold.retries.to_string()));
            if let Some(r) = rejected {
                x.failed = true;
                x.facts.push(fact(
                    "not accepted",
                    format!("{} → {}", r.class.describe(), r.action.label()),
                ));
            }
            if !redactions.is_empty() {
                x.facts.push(fact("guardrails", redacted(redactions)));
            }
            x.texts.extend(message_texts(message, cuts, cuts.text));
        }
        EventKind::ToolCall(c) => {
            x.group = "tool";
            x.title = format!("Tool call {}", c.name);
            let spec = st.step_tools.iter().find(|t| t.name == c.name);
            x.facts.push(fact("call", c.call_id.clone()));
            x.facts.push(fact("source", source_text(spec)));
            let next = match &c.disposition {
                Disposition::Run { reminder } => match reminder {
                    Some(r) => format!("runs now (reminder: {r})"),
                    None => "runs now".into(),
                },
                Disposition::External => "the caller runs it (the run waits for its result)".into(),
                Disposition::Approval => "waits for a person's approval".into(),
                // issue 32: waits
                Disposition::Wait { wait } => wait_text(wait),
                Disposition::Child => "starts a child run (the run waits for it to end)".into(),
                Disposition::Refused { error, message } => {
                    x.failed = true;
                    format!("refused ({}): {message}", snake(error))
                }
            };
            x.facts.push(fact("decision", next));
            if let Some(p) = spec.and_then(policy_text) {
                x.facts.push(fact("policy", p));
            }
            x.texts
                .push(Text::new("arguments", &pretty(&c.input), cuts));
        }
        EventKind::ToolResult {
            call_id,
            content,
            reminder,
            duration_ms,
            redactions,
        } => {
            x.group = "tool";
            x.title = format!("Tool result of {}", tool_name(call_id));
            x.facts.push(fact("call", call_id.clone()));
            x.facts.push(fact("duration", human(*duration_ms as i64)));
            x.texts.push(Text::new(
                "result",
                &format!("{}{content}", redacted(redactions)),
                cuts,
            ));
            if let Some(r) = reminder {
                x.texts.push(Text::new("reminder", r, cuts));
            }
        }
        EventKind::ToolError {
            call_id,
            error,
            message,
            duration_ms,
        } => {
            x.group = "tool";
            x.failed = true;
            x.title = format!("Tool {} failed: {}", tool_name(call_id), snake(error));
            x.facts.push(fact("call", call_id.clone()));
            x.facts.push(fact("duration", human(*duration_ms as i64)));
            x.texts.push(Text::new("error", message, cuts));
        }
        EventKind::ToolRecovered {
            call_id,
            idempotency_key,
        } => {
            x.group = "tool";
            x.title = format!(
                "Result of {} recovered from the worker that ran it",
                tool_name(call_id)
            );
            x.facts
                .push(fact("idempotency key", idempotency_key.clone()));
        }
        EventKind::ToolSourceUnavailable {
            server,
            reason,
            attempt,
            retry_in_ms,
        } => {
            x.group = "tool";
            x.failed = true;
            x.title = format!("Tool source {server} unavailable (attempt {attempt})");
            if let Some(ms) = retry_in_ms {
                x.facts.push(fact("retry in", human(*ms as i64)));
            }
            x.texts.push(Text::new("reason", reason, cuts));
        }
        EventKind::ToolsChanged {
            added,
            removed,
            changed,
        } => {
            x.group = "tool";
            x.title = "The tools offered changed".into();
            for (label, names) in [("added", added), ("removed", removed), ("changed", changed)] {
                if !names.is_empty() {
                    x.facts.push(fact(label, names.join(", ")));
                }
            }
        }
        EventKind::ApprovalRequested {
            call_id,
            tool,
            input,
            expires_at,
            interrupted,
            ..
        } => {
            x.group = "approval";
            x.title = format!("Approval requested for {tool}");
            x.facts.push(fact("call", call_id.clone()));
            if let Some(t) = expires_at {
                let left = (*t - Utc::now()).num_milliseconds();
                x.facts.push(fact(
                    "deadline",
                    format!(
                        "{} ({})",
                        t.format("%Y-%m-%d %H:%M:%S UTC"),
                        if left > 0 {
                            format!("in {}", human(left))
                        } else {
                            format!("passed {} ago", human(-left))
                        }
                    ),
                ));
            }
            if *interrupted {
                x.facts.push(fact(
                    "interrupted",
                    "the call started once and its worker died: it may already have run",
                ));
            }
            if let Some(p) = st
                .step_tools
                .iter()
                .find(|t| t.name == *tool)
                .and_then(policy_text)
            {
                x.facts.push(fact("why", p));
            }
            x.texts.push(Text::new("arguments", &pretty(input), cuts));
            x.link = Some(format!("/inbox/runs/{}/calls/{call_id}", e.run_id));
        }
        EventKind::ApprovalResolved {
            call_id,
            decision,
            by,
            ..
        } => {
            x.group = "approval";
            let who = by.as_deref().unwrap_or("someone unnamed");
            x.title = match decision {
                Decision::Approve => format!("Approved by {who}"),
                Decision::Reject { .. } => format!("Rejected by {who}"),
                Decision::Edit { .. } => format!("Edited and approved by {who}"),
                Decision::Expire => "Expired: nobody decided before the deadline".into(),
            };
            x.facts.push(fact("call", call_id.clone()));
            x.facts.push(fact("decider", who.to_owned()));
            match decision {
                Decision::Reject { reason } => {
                    x.texts.push(Text::new("reason", reason, cuts));
                }
                Decision::Edit { input } => {
                    let before = st.call(call_id).map_or(Value::Null, |c| c.input.clone());
                    x.diff = diff(&before, input);
                }
                Decision::Approve | Decision::Expire => {}
            }
        }
        EventKind::ApprovalEscalated {
            call_id,
            expires_at,
        } => {
            x.group = "approval";
            x.title = format!("Approval of {} escalated", tool_name(call_id));
            if let Some(t) = expires_at {
                x.facts.push(fact(
                    "deadline",
                    t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
                ));
            }
        }
        EventKind::ApprovalContested {
            call_id,
            by,
            chose,
            attempted_at,
        } => {
            x.group = "approval";
            x.title = format!(
                "A late decision on {} lost the race (the first stands)",
                tool_name(call_id)
            );
            x.facts
                .push(fact("by", by.clone().unwrap_or_else(|| "unknown".into())));
            x.facts.push(fact("chose", chose.as_str().to_owned()));
            x.facts.push(fact(
                "attempted",
                attempted_at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
            ));
        }
        EventKind::InputReceived { text, redactions } => {
            x.group = "input";
            x.title = "User message".into();
            x.texts.push(Text::new(
                "message",
                &format!("{}{text}", redacted(redactions)),
                cuts,
            ));
        }
        EventKind::GuardrailTripped {
            stage,
            guardrail,
            reason,
            reask,
        } => {
            x.group = "guard";
            x.failed = true;
            x.title = format!("Guardrail {guardrail} tripped ({})", snake(stage));
            x.texts.push(Text::new("reason", reason, cuts));
            if let Some(r) = reask {
                x.texts.push(Text::new("re-ask", r, cuts));
            }
        }
        EventKind::ContextCompacted {
            strategy,
            removed,
            messages,
            usage,
            cost_usd_micros,
        } => {
            x.group = "model";
            x.title = format!(
                "Context compacted ({strategy}): {removed} messages removed, {} remain",
                messages.len()
            );
            if *cost_usd_micros > 0 || usage.input_tokens > 0 {
                x.facts.push(tokens_fact(usage));
                x.facts.push(fact("cost", usd(*cost_usd_micros)));
            }
        }
        EventKind::BudgetWarn { limit, usage, .. } => {
            x.group = "budget";
            x.failed = true;
            x.title = format!("Budget limit reached: {limit}");
            x.facts.push(tokens_fact(&usage.tokens));
            x.facts.push(fact("cost", usd(usage.cost_usd_micros)));
        }
        EventKind::BudgetExtended { limits } => {
            x.group = "budget";
            x.title = "Budget extended".into();
            x.facts.push(fact("limits now", limits_text(limits)));
        }
        EventKind::SessionPause { pull_point } => {
            x.title = format!("Parked: {}", pull_text(pull_point));
        }
        EventKind::SessionPauseRequested { reason, by } => {
            x.title = format!(
                "Pause requested by {}",
                by.as_deref().unwrap_or("someone unnamed")
            );
            x.texts.push(Text::new("reason", reason, cuts));
        }
        EventKind::SessionResume { by } => {
            x.title = format!("Resumed by {}", by.as_deref().unwrap_or("someone unnamed"));
        }
        EventKind::SessionCancel { reason } => {
            x.failed = true;
            x.title = "Cancelled".into();
            x.texts.push(Text::new("reason", reason, cuts));
        }
        EventKind::SessionComplete { outcome } => match outcome {
            Outcome::Succeeded { answer, output } => {
                x.title = "Succeeded".into();
                x.texts.push(Text::new("answer", answer, cuts));
                if let Some(o) = output {
                    x.texts.push(Text::new("output", &pretty(o), cuts));
                }
            }
            Outcome::Failed { error } => {
                x.failed = true;
                x.title = "Failed".into();
                x.texts.push(Text::new("reason", error, cuts));
                if let Some(seq) = fold.last_call {
                    x.facts.push(fact("last model call", format!("#{seq}")));
                }
            }
            Outcome::Cancelled { reason } => {
                x.failed = true;
                x.title = "Cancelled".into();
                x.texts.push(Text::new("reason", reason, cuts));
            }
        },
        EventKind::Error { message, fatal } => {
            x.group = "error";
            x.failed = true;
            x.title = if *fatal {
                "Error (fatal: the run ends)".into()
            } else {
                "Error".into()
            };
            x.texts.push(Text::new("error", message, cuts));
        }
        EventKind::HookApplied {
            topic,
            hook,
            effect,
            call,
        } => {
            x.group = "plan";
            let (what, text) = match effect {
                HookEffect::Continued => ("let it go on", None),
                HookEffect::Modified { payload } => ("modified", Some(pretty(payload))),
                HookEffect::Cancelled { reason } => ("cancelled", Some(reason.clone())),
                HookEffect::Skipped => ("skipped", None),
                HookEffect::Paused { reason } => ("paused", Some(reason.clone())),
            };
            x.title = format!("Hook {hook} ({}) {what}", snake(topic));
            if let Some(c) = call
                .as_ref()
                .filter(|c| c.outcome != glia_proto::HookOutcome::Answered)
            {
                x.title.push_str(&format!(
                    " (no answer: {}; its on_failure decided)",
                    c.outcome.name()
                ));
            }
            if let Some(t) = text {
                x.texts.push(Text::new("detail", &t, cuts));
            }
        }
        // Issue 32, child runs.
        EventKind::ChildEnded {
            call_id,
            child_run_id,
            agent,
            outcome,
            usage,
            cost_usd_micros,
        } => {
            x.group = "tool";
            x.facts.push(fact("call", call_id.clone()));
            x.facts.push(fact(
                "child run",
                child_run_id.map_or_else(|| "not started".to_owned(), |id| id.to_string()),
            ));
            x.facts.push(fact(
                "tokens",
                format!("{} in · {} out", usage.input_tokens, usage.output_tokens),
            ));
            x.facts.push(fact("cost", usd(*cost_usd_micros)));
            match outcome {
                Outcome::Succeeded { answer, output } => {
                    x.title = format!("Child run of {agent} succeeded");
                    match output {
                        Some(o) => x.texts.push(Text::new("output", &pretty(o), cuts)),
                        None => x.texts.push(Text::new("answer", answer, cuts)),
                    }
                }
                Outcome::Failed { error } => {
                    x.failed = true;
                    x.title = format!("Child run of {agent} failed");
                    x.texts.push(Text::new("error", error, cuts));
                }
                Outcome::Cancelled { reason } => {
                    x.failed = true;
                    x.title = format!("Child run of {agent} was cancelled");
                    x.texts.push(Text::new("reason", reason, cuts));
                }
            }
        }
    }
    x
}

/// `1 step`, `2 steps`.
fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

fn numbered(steps: &[String]) -> String {
    steps
        .iter()
        .enumerate()
        .map(|(i, s)| format!("{}. {s}", i + 1))
        .collect::<Vec<_>>()
        .join("\n")
}

fn limits_text(l: &BudgetLimits) -> String {
    let mut parts = Vec::new();
    let mut add = |name: &str, v: Option<u64>, f: fn(u64) -> String| {
        if let Some(v) = v {
            parts.push(format!("{name} {}", f(v)));
        }
    };
    add("turns", l.max_turns, count);
    add("tool calls", l.max_tool_calls, count);
    add("active time", l.max_active_ms, |ms| human(ms as i64));
    add("input tokens", l.max_input_tokens, count);
    add("output tokens", l.max_output_tokens, count);
    add("cache write tokens", l.max_cache_write_tokens, count);
    add("cache read tokens", l.max_cache_read_tokens, count);
    add("cost", l.max_cost_usd_micros, usd);
    if parts.is_empty() {
        "no limits".into()
    } else {
        parts.join(" · ")
    }
}

/// Fold run `run_id`'s events up to seq `to`, with the entries of those
/// from seq `from` on.
async fn fold_to(
    app: &App,
    run_id: Uuid,
    from: u64,
    to: u64,
    cuts: Cuts,
) -> Result<(Fold, Vec<Entry>), LogError> {
    let mut fold = Fold::new(run_id);
    let mut entries = Vec::new();
    let mut after = 0;
    while after < to {
        let page = app.log.events(run_id, after, READ_PAGE).await?;
        let n = page.len();
        for e in page.iter().take_while(|e| e.seq <= to) {
            if let Some(x) = fold.step(e, (e.seq >= from).then_some(cuts)) {
                entries.push(x);
            }
            after = e.seq;
        }
        if n < READ_PAGE || page.last().is_some_and(|e| e.seq > to) {
            break;
        }
    }
    Ok((fold, entries))
}

// ----- the header ------------------------------------------------------------------------

/// What a run's header shows.
#[derive(Debug, Clone, Serialize)]
struct Head {
    run_id: Uuid,
    goal: (String, usize),
    status: String,
    /// `succeeded`, `failed`, `cancelled` when done.
    outcome: Option<String>,
    /// The failure or cancellation reason.
    error: Option<String>,
    where_: Option<String>,
    agent: Option<(String, u32)>,
    model: String,
    batch_id: Option<Uuid>,
    custom_id: Option<String>,
    tags: Vec<String>,
    metadata: Vec<(String, String)>,
    cost: String,
    tokens: Vec<Fact>,
    turns: u64,
    tool_calls: u64,
    active: String,
    steps: String,
    duration: String,
    created_at: DateTime<Utc>,
    trace_id: String,
    head_seq: u64,
    done: bool,
    /// Actions the session may take now.
    can_cancel: bool,
    can_pause: bool,
    can_resume: bool,
    can_message: bool,
    /// External calls waiting for a result the session may post.
    awaiting: Vec<(String, String)>,
    /// Approvals waiting (the inbox decides them).
    approvals: Vec<(String, String)>,
}

fn head(s: &Session, run: &RunSummary, st: &RunState) -> Head {
    let done = run.status == RunStatus::Done;
    let (outcome, error) = match &st.outcome {
        Some(Outcome::Succeeded { .. }) => (Some("succeeded"), None),
        Some(Outcome::Failed { error }) => (Some("failed"), Some(error.clone())),
        Some(Outcome::Cancelled { reason }) => (Some("cancelled"), Some(reason.clone())),
        None => (None, None),
    };
    let submit = s.principal.has(Scope::Submit);
    let resume = submit || s.principal.has(Scope::Approve);
    let paused = matches!(run.pull_point, Some(PullPoint::Paused { .. }));
    let u = &st.usage;
    let end = run.ended_at.unwrap_or_else(Utc::now);
    let calls = |pred: &dyn Fn(&glia_proto::PendingCall) -> bool| {
        st.pending_calls
            .iter()
            .filter(|c| pred(c))
            .map(|c| (c.call_id.clone(), c.name.clone()))
            .collect::<Vec<_>>()
    };
    Head {
        run_id: run.run_id,
        goal: cut(&run.goal, 400),
        status: snake(&run.status),
        outcome: outcome.map(str::to_owned),
        error,
        where_: run.pull_point.as_ref().map(pull_text),
        agent: st
            .config
            .agent
            .as_ref()
            .map(|a| (a.name.clone(), a.version)),
        model: st.config.model.clone(),
        batch_id: run.batch_id,
        custom_id: run.custom_id.clone(),
        tags: run.tags.clone(),
        metadata: run
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        cost: usd(u.cost_usd_micros),
        tokens: vec![
            fact("input", count(u.tokens.input_tokens)),
            fact("output", count(u.tokens.output_tokens)),
            fact("cache write", count(u.tokens.cache_write_tokens)),
            fact("cache read", count(u.tokens.cache_read_tokens)),
        ],
        turns: u.turns,
        tool_calls: u.tool_calls,
        active: human(u.active_ms as i64),
        steps: match st.step {
            Some(i) => format!("{} of {}", i + 1, st.plan.len()),
            None => format!("0 of {}", st.plan.len()),
        },
        duration: human((end - run.created_at).num_milliseconds()),
        created_at: run.created_at,
        trace_id: run.trace_id.clone(),
        head_seq: run.head_seq,
        done,
        can_cancel: !done && submit,
        can_pause: !done && submit && !paused && st.pause_due.is_none(),
        can_resume: !done && resume && (paused || st.pause_due.is_some()),
        can_message: !done && submit && run.pull_point == Some(PullPoint::AwaitingInput),
        awaiting: if !done && submit {
            calls(&|c| c.awaits_caller())
        } else {
            Vec::new()
        },
        approvals: if done {
            Vec::new()
        } else {
            calls(&|c| c.approval == glia_proto::ApprovalStatus::Requested)
        },
    }
}

// ----- pages -----------------------------------------------------------------------------

/// Query of a run page: the first event shown (default: the newest page).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RunPageQuery {
    /// Show events from this seq on.
    pub from: Option<u64>,
}

async fn run_page(
    State(app): State<App>,
    headers: HeaderMap,
    Path(run_id): Path<Uuid>,
    Query(q): Query<RunPageQuery>,
) -> Response {
    let Some(s) = session(&app, &headers) else {
        return to_login();
    };
    let run = match visible_run(&app, &s.principal, run_id).await {
        Ok(r) => r,
        Err(e) => return api_error_page(&s, e),
    };
    let last = run.head_seq;
    let tail = q.from.is_none_or(|f| f + PAGE_EVENTS > last);
    let from = match q.from {
        Some(f) if !tail => f.max(1),
        _ => last.saturating_sub(PAGE_EVENTS - 1).max(1),
    };
    let to = if tail { last } else { from + PAGE_EVENTS - 1 };
    let (fold, entries) = match fold_to(&app, run_id, from, to, Cuts::PAGE).await {
        Ok(x) => x,
        Err(e) => return log_error_page(&s, e),
    };
    let state = if tail {
        fold.state
    } else {
        match app.log.load(run_id).await {
            Ok(st) => st,
            Err(e) => return log_error_page(&s, e),
        }
    };
    let shown_to = entries.last().map_or(from.saturating_sub(1), |x| x.seq);
    let h = head(&s, &run, &state);
    let earlier = (from > 1).then(|| from.saturating_sub(PAGE_EVENTS).max(1));
    let later = (!tail).then_some(to + 1);
    let live = (tail && !h.done).then(|| format!("/console/runs/{run_id}/live?after={shown_to}"));
    // Issue 32, child runs: the parent's link and the children's list.
    let parent = run.parent_run_id.map(|id| {
        serde_json::json!({"id": id.to_string(), "call": run.parent_call_id.clone().unwrap_or_default(), "depth": run.depth})
    });
    let children = match crate::control::children_of(&app, run_id).await {
        Ok(children) => children
            .iter()
            .rev()
            .map(|c| {
                serde_json::json!({
                    "id": c.run_id.to_string(),
                    "call": c.parent_call_id.clone().unwrap_or_default(),
                    "agent": c.agent.as_ref().map(|a| format!("{a}@{}", c.agent_version.unwrap_or(0))),
                    "status": c.outcome.as_ref().map_or_else(
                        || c.pull_point.as_ref().map_or_else(|| c.status.as_str().to_owned(), |p| p.name().to_owned()),
                        |o| glia_backends::OutcomeKind::of(o).as_str().to_owned(),
                    ),
                })
            })
            .collect::<Vec<_>>(),
        Err(e) => return log_error_page(&s, e),
    };
    html(
        StatusCode::OK,
        "console_run.html",
        context! { who => s.principal.by(), csrf => s.csrf, h, entries, run_id, earlier, later, live, from, to => shown_to, parent, children },
    )
}

async fn event_page(
    State(app): State<App>,
    headers: HeaderMap,
    Path((run_id, seq)): Path<(Uuid, u64)>,
) -> Response {
    let Some(s) = session(&app, &headers) else {
        return to_login();
    };
    if let Err(e) = visible_run(&app, &s.principal, run_id).await {
        return api_error_page(&s, e);
    }
    let (_, entries) = match fold_to(&app, run_id, seq, seq, Cuts::ONE).await {
        Ok(x) => x,
        Err(e) => return log_error_page(&s, e),
    };
    let Some(entry) = entries.into_iter().next() else {
        return error_page(Some(&s), StatusCode::NOT_FOUND, "the run has no such event");
    };
    let raw = match app.log.events(run_id, seq.saturating_sub(1), 1).await {
        Ok(mut v) => v.pop().map(|e| {
            cut(
                &serde_json::to_string_pretty(&e).unwrap_or_default(),
                Cuts::ONE.text,
            )
        }),
        Err(e) => return log_error_page(&s, e),
    };
    html(
        StatusCode::OK,
        "console_one.html",
        context! { who => s.principal.by(), csrf => s.csrf, run_id, e => entry, raw },
    )
}

// ----- live ------------------------------------------------------------------------------

/// Query of the live timeline: where to start when no `Last-Event-ID` is sent.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct LiveQuery {
    /// Start after this seq.
    pub after: Option<u64>,
}

fn render(template: &str, ctx: minijinja::Value) -> String {
    TEMPLATES
        .get_template(template)
        .and_then(|t| t.render(ctx))
        .unwrap_or_else(|e| {
            tracing::error!("console template {template}: {e:#}");
            String::new()
        })
}

/// Server-sent events of a run's timeline, after `Last-Event-ID` (or
/// `?after=`): `event: event` with `id: <seq>` and the entry's HTML, then
/// `event: head` with the header's HTML; `event: end` once the run is done.
async fn live(
    State(app): State<App>,
    headers: HeaderMap,
    Path(run_id): Path<Uuid>,
    Query(q): Query<LiveQuery>,
) -> Response {
    let Some(s) = session(&app, &headers) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    if let Err(e) = visible_run(&app, &s.principal, run_id).await {
        return e.into_response();
    }
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let after = last.or(q.after).unwrap_or(0);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<SseEvent, Infallible>>(16);
    tokio::spawn(follow(app, s, run_id, after, tx));
    Sse::new(tokio_stream_from(rx))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

async fn follow(
    app: App,
    s: Session,
    run_id: Uuid,
    mut after: u64,
    tx: tokio::sync::mpsc::Sender<Result<SseEvent, Infallible>>,
) {
    let mut fold = match fold_to(&app, run_id, u64::MAX, after, Cuts::PAGE).await {
        Ok((f, _)) => f,
        Err(e) => {
            tracing::warn!(%run_id, "console live: {e}");
            return;
        }
    };
    let poll = app.limits.stream_poll.max(LIVE_POLL_MIN);
    loop {
        let page = match app.log.events(run_id, after, READ_PAGE).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(%run_id, "console live: {e}");
                tokio::time::sleep(poll).await;
                continue;
            }
        };
        for e in &page {
            let Some(x) = fold.step(e, Some(Cuts::PAGE)) else {
                continue;
            };
            let body = render("console_event.html", context! { e => x, run_id });
            let frame = SseEvent::default()
                .id(e.seq.to_string())
                .event("event")
                .data(body);
            if tx.send(Ok(frame)).await.is_err() {
                return;
            }
            after = e.seq;
        }
        let run = match visible_run(&app, &s.principal, run_id).await {
            Ok(r) => r,
            Err(_) => return,
        };
        if !page.is_empty() || run.status == RunStatus::Done {
            let h = head(&s, &run, &fold.state);
            let body = render(
                "console_head.html",
                context! { h, csrf => s.csrf.clone(), run_id },
            );
            if tx
                .send(Ok(SseEvent::default().event("head").data(body)))
                .await
                .is_err()
            {
                return;
            }
        }
        if run.status == RunStatus::Done && after >= run.head_seq {
            let _ = tx
                .send(Ok(SseEvent::default().event("end").data("done")))
                .await;
            return;
        }
        if page.len() == READ_PAGE {
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(poll) => {}
            _ = tx.closed() => return,
        }
    }
}

// ----- actions ---------------------------------------------------------------------------

fn done_or_error<T>(s: &Session, run_id: Uuid, r: Result<T, ApiError>) -> Response {
    match r {
        Ok(_) => Redirect::to(&format!("/console/runs/{run_id}")).into_response(),
        Err(e) => api_error_page(s, e),
    }
}

fn reason(f: &[(String, String)]) -> Option<String> {
    field(f, "reason")
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(str::to_owned)
}

/// `POST /console/runs/{run}/{action}`: `cancel` and `pause` (an optional
/// `reason`), `resume` (the budget extension of [`extension`]), `messages`
/// (`text`, `head_seq`). Each calls the JSON API's handler with the
/// session's principal.
async fn act(
    State(app): State<App>,
    headers: HeaderMap,
    Path((run_id, action)): Path<(Uuid, String)>,
    body: Bytes,
) -> Response {
    let f = form(&body);
    let s = match checked_post(&app, &headers, &f) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let (p, id) = (s.principal.clone(), ApiPath(run_id));
    let r = match action.as_str() {
        "cancel" => {
            let body = CancelBody { reason: reason(&f) };
            payloads::cancel(State(app), p, id, OptJson(body))
                .await
                .map(drop)
        }
        "pause" => {
            let body = PauseBody { reason: reason(&f) };
            payloads::pause(State(app), p, id, OptJson(body))
                .await
                .map(drop)
        }
        "resume" => {
            let extend = match extension(&f) {
                Ok(l) => (l != BudgetLimits::default()).then_some(l),
                Err((name, why)) => {
                    return error_page(
                        Some(&s),
                        StatusCode::UNPROCESSABLE_ENTITY,
                        &format!("{name}: {why}"),
                    );
                }
            };
            let body = ResumeBody { extend };
            payloads::resume(State(app), p, id, OptJson(body))
                .await
                .map(drop)
        }
        "messages" => {
            let head_seq = match field(&f, "head_seq")
                .map(str::trim)
                .filter(|v| !v.is_empty())
            {
                None => None,
                Some(v) => match v.parse() {
                    Ok(n) => Some(n),
                    Err(_) => {
                        return error_page(
                            Some(&s),
                            StatusCode::BAD_REQUEST,
                            "head_seq: not an event seq",
                        );
                    }
                },
            };
            let body = MessageBody {
                text: field(&f, "text").unwrap_or("").to_owned(),
                head_seq,
            };
            payloads::post_message(State(app), p, id, ApiJson(body))
                .await
                .map(drop)
        }
        _ => return error_page(Some(&s), StatusCode::NOT_FOUND, "no such action"),
    };
    done_or_error(&s, run_id, r)
}

/// The budget extension of a resume form: each field adds to a limit
/// (blank: unchanged). `cost_usd` is dollars (`1.50`), the rest counts.
pub fn extension(f: &[(String, String)]) -> Result<BudgetLimits, (String, String)> {
    let num = |name: &str| -> Result<Option<u64>, (String, String)> {
        match field(f, name).map(str::trim).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => v.parse::<u64>().map(Some).map_err(|_| {
                (
                    name.to_owned(),
                    format!("{v:?} is not a whole number of 0 or more"),
                )
            }),
        }
    };
    let seconds = num("extend_active_s")?;
    let cost = match field(f, "extend_cost_usd")
        .map(|v| v.trim().trim_start_matches('$'))
        .filter(|v| !v.is_empty())
    {
        None => None,
        Some(v) => Some(usd_micros(v).ok_or_else(|| {
            (
                "extend_cost_usd".to_owned(),
                format!("{v:?} is not an amount of US dollars (like 1.50)"),
            )
        })?),
    };
    Ok(BudgetLimits {
        max_turns: num("extend_turns")?,
        max_tool_calls: num("extend_tool_calls")?,
        max_active_ms: seconds.map(|s| s.saturating_mul(1000)),
        max_input_tokens: num("extend_input_tokens")?,
        max_output_tokens: num("extend_output_tokens")?,
        max_cost_usd_micros: cost,
        ..BudgetLimits::default()
    })
}

/// `1.5` → 1,500,000 micros; at most six decimals; no sign, no exponent.
fn usd_micros(v: &str) -> Option<u64> {
    let (whole, frac) = v.split_once('.').unwrap_or((v, ""));
    if (whole.is_empty() && frac.is_empty())
        || frac.len() > 6
        || !whole
            .chars()
            .chain(frac.chars())
            .all(|c| c.is_ascii_digit())
    {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let frac: u64 = format!("{frac:0<6}").parse().ok()?;
    whole.checked_mul(1_000_000)?.checked_add(frac)
}

async fn tool_result(
    State(app): State<App>,
    headers: HeaderMap,
    Path((run_id, call_id)): Path<(Uuid, String)>,
    body: Bytes,
) -> Response {
    let f = form(&body);
    let s = match checked_post(&app, &headers, &f) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let body = ToolResultBody {
        content: field(&f, "content").unwrap_or("").to_owned(),
        is_error: field(&f, "is_error").is_some(),
    };
    let r = payloads::post_tool_result(
        State(app),
        s.principal.clone(),
        ApiPath((run_id, call_id)),
        ApiJson(body),
    )
    .await;
    done_or_error(&s, run_id, r)
}

// ----- the list --------------------------------------------------------------------------

/// Runs on one page of the list.
pub const LIST_PAGE: usize = 50;

/// The list's query as the API reads it (`GET /v1/runs`'s names): the GET
/// form's fields without the blank ones, and `tag` and `meta` fields split
/// at white space (each part one tag, one `key=value`).
fn list_query(raw: Option<&str>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (k, v) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        let v = v.trim();
        if v.is_empty() {
            continue;
        }
        if k == "tag" || k == "meta" {
            out.extend(
                v.split_whitespace()
                    .map(|part| (k.to_string(), part.to_owned())),
            );
        } else {
            out.push((k.into_owned(), v.to_owned()));
        }
    }
    out
}

fn encode(pairs: &[(String, String)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

/// One row of the list.
#[derive(Debug, Clone, Serialize)]
struct Row {
    run_id: Uuid,
    goal: String,
    goal_title: String,
    tags: Vec<String>,
    agent: Option<String>,
    agent_version: Option<u32>,
    status: String,
    outcome: Option<&'static str>,
    where_: Option<&'static str>,
    error: Option<String>,
    steps: u32,
    tokens: String,
    tokens_title: String,
    cost: String,
    duration: String,
    created_at: DateTime<Utc>,
    started: String,
}

fn row(run: RunSummary, now: DateTime<Utc>) -> Row {
    let t = &run.usage.tokens;
    let (goal, rest) = cut(&run.goal, 120);
    Row {
        goal: if rest > 0 { format!("{goal}…") } else { goal },
        goal_title: cut(&run.goal, 1_000).0,
        tokens: count(t.input_tokens + t.output_tokens),
        tokens_title: format!(
            "input {} · output {} · cache write {} · cache read {}",
            count(t.input_tokens),
            count(t.output_tokens),
            count(t.cache_write_tokens),
            count(t.cache_read_tokens)
        ),
        cost: usd(run.usage.cost_usd_micros),
        duration: human((run.ended_at.unwrap_or(now) - run.created_at).num_milliseconds()),
        started: run.created_at.format("%Y-%m-%d %H:%M:%S").to_string(),
        status: snake(&run.status),
        outcome: run.outcome.as_ref().map(|o| OutcomeKind::of(o).as_str()),
        where_: run.pull_point.as_ref().map(PullPoint::name),
        error: run.error.as_deref().map(|e| cut(e, 160).0),
        steps: run.steps,
        created_at: run.created_at,
        run_id: run.run_id,
        tags: run.tags,
        agent: run.agent,
        agent_version: run.agent_version,
    }
}

/// The form's fields as the page shows them again.
#[derive(Debug, Clone, Default, Serialize)]
struct Echo {
    fields: HashMap<String, String>,
    tag: Vec<String>,
    meta: Vec<String>,
}

async fn list_page(
    State(app): State<App>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let Some(s) = session(&app, &headers) else {
        return to_login();
    };
    let pairs = list_query(raw.as_deref());
    let mut echo = Echo::default();
    for (k, v) in &pairs {
        match k.as_str() {
            "tag" => echo.tag.push(v.clone()),
            "meta" => echo.meta.push(v.clone()),
            _ => {
                echo.fields.insert(k.clone(), v.clone());
            }
        }
    }
    let filter = ListRunsQuery::parse(Some(&encode(&pairs))).and_then(|q| {
        let tenant = if s.principal.is_admin() {
            q.tenant.clone()
        } else {
            Some(s.principal.tenant.clone())
        };
        q.filter(tenant, LIST_PAGE)
    });
    let (status, rows, next, error) = match filter {
        Err(e) => (e.status(), Vec::new(), None, Some(e.body().error.message)),
        Ok(f) => match app.log.list_runs(&f).await {
            Err(e) => return log_error_page(&s, e),
            Ok(runs) => {
                let next = (runs.len() == LIST_PAGE)
                    .then(|| runs.last().map(|r| r.run_id))
                    .flatten()
                    .map(|last| {
                        let mut p: Vec<(String, String)> = pairs
                            .iter()
                            .filter(|(k, _)| k != "cursor")
                            .cloned()
                            .collect();
                        p.push(("cursor".into(), run_cursor::encode(last)));
                        encode(&p)
                    });
                let now = Utc::now();
                (
                    StatusCode::OK,
                    runs.into_iter().map(|r| row(r, now)).collect(),
                    next,
                    None,
                )
            }
        },
    };
    html(
        status,
        "console_runs.html",
        context! { who => s.principal.by(), csrf => s.csrf, rows, next, error, q => echo.fields, tags => echo.tag, metas => echo.meta },
    )
}

// --- issue 32: waits ---
/// What a built-in wait waits for, in words.
fn wait_text(wait: &glia_proto::Wait) -> String {
    match wait {
        glia_proto::Wait::Timer { wake_at_ms, .. } => format!(
            "the run sleeps until {}",
            glia_proto::wait::rfc3339_ms(*wake_at_ms)
        ),
        glia_proto::Wait::Event {
            key, timeout_at_ms, ..
        } => format!(
            "the run waits for an event {key} until {}",
            glia_proto::wait::rfc3339_ms(*timeout_at_ms)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn money_and_counts() {
        assert_eq!(usd(0), "$0.00");
        assert_eq!(usd(7), "$0.000007");
        assert_eq!(usd(1_500_000), "$1.50");
        assert_eq!(usd(12_345_678), "$12.345678");
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(usd_micros("1.5"), Some(1_500_000));
        assert_eq!(usd_micros("0.000001"), Some(1));
        assert_eq!(usd_micros("3"), Some(3_000_000));
        for bad in ["", ".", "1.0000001", "-1", "1e3", "abc"] {
            assert_eq!(usd_micros(bad), None, "{bad}");
        }
    }

    #[test]
    fn cuts_count_characters() {
        assert_eq!(cut("héllo", 2), ("hé".to_owned(), 3));
        assert_eq!(cut("hi", 5), ("hi".to_owned(), 0));
    }
}
