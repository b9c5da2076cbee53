//! HTTP hooks: the operator's catalogue hooks (`[hooks.NAME]`,
//! [`crate::catalogue::HookEntry`]), called by the worker with a signed
//! JSON request on the topics they subscribe to. The narrative, the wire
//! shapes and each topic's failure mode: `docs/hooks.md`.
//!
//! Which hooks a run gets ([`HttpHooks::scope`]): every `apply = "always"`
//! hook whose `tenants` and `agents` admit the run, plus the hooks its config
//! (or agent definition) names in `hooks` — a union, so a run can add a hook
//! and never remove one the operator applied. A named hook the catalogue
//! lacks, or whose `tenants` leave the run's tenant out, fails the run.
//!
//! The request (`POST`, `content-type: application/json`), signed with the
//! hook's secret by [`glia_proto::webhook_signature`] (Standard Webhooks,
//! <https://www.standardwebhooks.com/>; `webhook-id` is the same for the
//! same logical call, see [`webhook_id`]):
//!
//! ```json
//! {"topic": "before_tool_call", "hook": "audit", "run_id": "0190…", "tenant": "acme",
//!  "agent": {"name": "support", "version": 3, "content_hash": "sha256:…"}, "seq": 7,
//!  "payload": {"call_id": "c1", "name": "refund", "input": {"order": "A1"}}}
//! ```
//!
//! The answer of an intercepting topic (2xx, a JSON object, unknown fields
//! refused): `{"verdict": "allow" | "deny" | "skip" | "pause", "reason":
//! "…", "input" | "steps" | "description" | "content": …}` — which verdict
//! and which change each topic takes is [`Answer::read`]'s table. The
//! answer of an `on_*` topic (a notification) is not read: any 2xx will do.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::BoxFuture;
use glia_proto::{HookOutcome, HookTopic, RunState, ToolContent};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::catalogue::{Catalogue, HookApply, HookEntry, HookFailure};
use crate::hooks::Verdict;

/// The most bytes of an answer read; a longer one is `bad_answer`.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;
/// The most characters of a `reason` (the model may read it).
pub const MAX_REASON_CHARS: usize = 2_000;
/// The most steps an `after_plan` answer's `steps` may hold.
pub const MAX_PLAN_STEPS: usize = 64;
/// The most characters of one step's description (`after_plan`'s
/// `steps[i]`, `before_step`'s `description`).
pub const MAX_STEP_CHARS: usize = 4_000;

/// A step description a hook gave, checked: not blank, at most
/// [`MAX_STEP_CHARS`] characters. `field` names it in the error.
fn step_text(field: &str, text: &str) -> Result<(), Failure> {
    if text.trim().is_empty() {
        return Err((HookOutcome::BadAnswer, format!("`{field}` is blank")));
    }
    if text.chars().count() > MAX_STEP_CHARS {
        return Err((
            HookOutcome::BadAnswer,
            format!("`{field}` is over {MAX_STEP_CHARS} characters"),
        ));
    }
    Ok(())
}

/// Where a worker reads the tenant of a run (the fleet's event log: the
/// run's summary). Only asked when a catalogue hook has `tenants`, or to
/// put the tenant in requests; implementations should remember answers.
#[async_trait]
pub trait RunTenants: Send + Sync {
    /// The tenant of `run_id`. Errors: the store did not answer (the run
    /// is then retried later, never advanced without its hooks).
    async fn tenant(&self, run_id: Uuid) -> Result<String, String>;
}

/// Where a worker counts hook calls (its metrics,
/// `glia_worker::metrics::WorkerMetrics`).
pub trait HookObserver: Send + Sync {
    /// One call of `hook` on `topic` ended with `outcome` after `elapsed`.
    fn observed(&self, hook: &str, topic: HookTopic, outcome: HookOutcome, elapsed: Duration);
}

/// A signing secret: never printed.
struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[secret]")
    }
}

/// One catalogue hook with its secret read from the environment. Its
/// `Debug` shows its name only (a URL's query may hold a token).
pub struct HttpHook {
    name: String,
    entry: HookEntry,
    secret: Secret,
}

impl std::fmt::Debug for HttpHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpHook")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl HttpHook {
    /// Its catalogue name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether it is called on `topic`.
    pub fn subscribes(&self, topic: HookTopic) -> bool {
        self.entry.topics.contains(&topic)
    }

    /// Its failure mode.
    pub fn on_failure(&self) -> HookFailure {
        self.entry.on_failure
    }
}

/// The catalogue's hooks, the HTTP client that calls them, and the ports
/// the worker gives them (run tenants, metrics). One per worker.
pub struct HttpHooks {
    hooks: Vec<Arc<HttpHook>>,
    client: reqwest::Client,
    tenants: Option<Arc<dyn RunTenants>>,
    observer: Option<Arc<dyn HookObserver>>,
}

/// Why a run's hooks cannot be decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopeError {
    /// The run names a hook it may not have: the run fails, naming the
    /// field (`hooks[0]`).
    Refused {
        /// `hooks[i]`.
        field: String,
        /// Why.
        reason: String,
    },
    /// The run's tenant could not be read; try again later.
    Unavailable(String),
}

/// The hooks that apply to one run, and its tenant when known.
#[derive(Debug, Clone, Default)]
pub struct RunHooks {
    /// In catalogue (name) order.
    pub hooks: Vec<Arc<HttpHook>>,
    /// The run's tenant, when read.
    pub tenant: Option<String>,
}

impl RunHooks {
    /// The hooks subscribed to `topic`.
    pub fn on(&self, topic: HookTopic) -> impl Iterator<Item = &Arc<HttpHook>> {
        self.hooks.iter().filter(move |h| h.subscribes(topic))
    }
}

impl HttpHooks {
    /// The catalogue's hooks, each with its secret read from the variable
    /// its `secret_env` names. Errors: (dotted key, reason) for a variable
    /// that is unset or not a `whsec_` secret; the reason never holds a
    /// value.
    pub fn from_catalogue(catalogue: &Catalogue) -> Result<HttpHooks, (String, String)> {
        Self::from_catalogue_with(catalogue, &|var| std::env::var(var).ok())
    }

    /// Like [`HttpHooks::from_catalogue`], each secret read through
    /// `lookup` (variable name to value) instead of the process
    /// environment.
    pub fn from_catalogue_with(
        catalogue: &Catalogue,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<HttpHooks, (String, String)> {
        let mut hooks = Vec::new();
        for (name, entry) in &catalogue.hooks {
            let secret = entry.secret_from(name, lookup)?;
            hooks.push(Arc::new(HttpHook {
                name: name.clone(),
                entry: entry.clone(),
                secret: Secret(secret),
            }));
        }
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent("glia-hooks/1")
            .build()
            .map_err(|e| (String::from("hooks"), e.to_string()))?;
        Ok(HttpHooks {
            hooks,
            client,
            tenants: None,
            observer: None,
        })
    }

    /// Read runs' tenants from `tenants` (needed for `tenants` filters).
    pub fn with_tenants(mut self, tenants: Arc<dyn RunTenants>) -> Self {
        self.tenants = Some(tenants);
        self
    }

    /// Count calls with `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn HookObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// True when the catalogue has no hooks.
    pub fn is_empty(&self) -> bool {
        self.hooks.is_empty()
    }

    /// Whether `name` is a hook of the catalogue.
    pub fn has(&self, name: &str) -> bool {
        self.hooks.iter().any(|h| h.name == name)
    }

    /// The hooks that apply to the run of `state` (see the module docs).
    pub async fn scope(&self, state: &RunState) -> Result<RunHooks, ScopeError> {
        let named = &state.config.hooks;
        if self.hooks.is_empty() && named.is_empty() {
            return Ok(RunHooks::default());
        }
        let tenant = match &self.tenants {
            Some(t) => Some(
                t.tenant(state.run_id)
                    .await
                    .map_err(ScopeError::Unavailable)?,
            ),
            None => None,
        };
        let admits_tenant = |h: &HttpHook| -> Result<bool, ScopeError> {
            match (&h.entry.tenants, &tenant) {
                (None, _) => Ok(true),
                (Some(list), Some(t)) => Ok(list.contains(t)),
                (Some(_), None) => Err(ScopeError::Unavailable(format!(
                    "hook {} applies to some tenants only, and this worker cannot read a run's tenant",
                    h.name
                ))),
            }
        };
        for (i, name) in named.iter().enumerate() {
            let field = format!("hooks[{i}]");
            // One answer whether the catalogue lacks the hook or keeps it
            // from this tenant: a tenant learns nothing of other tenants'
            // hooks.
            let available = match self.hooks.iter().find(|h| &h.name == name) {
                Some(h) => admits_tenant(h)?,
                None => false,
            };
            if !available {
                return Err(ScopeError::Refused {
                    field,
                    reason: format!("{name:?} is not a hook available to this run"),
                });
            }
        }
        let agent = state.config.agent.as_ref().map(|a| a.name.as_str());
        let mut hooks = Vec::new();
        for h in &self.hooks {
            let applied = named.contains(&h.name)
                || (h.entry.apply == HookApply::Always
                    && admits_tenant(h)?
                    && h.entry
                        .agents
                        .as_ref()
                        .is_none_or(|list| agent.is_some_and(|a| list.iter().any(|x| x == a))));
            if applied {
                hooks.push(h.clone());
            }
        }
        Ok(RunHooks { hooks, tenant })
    }

    /// Ask `hook` about `payload` on the intercepting `topic`: call it
    /// (signed, `webhook-id` = `id`), read its answer, and apply its failure
    /// mode to a call that failed. Logged when it failed; counted.
    pub async fn ask(&self, hook: &HttpHook, topic: HookTopic, body: &Value, id: &str) -> Asked {
        let started = Instant::now();
        let reply = self.post(hook, body, id).await;
        let answer = reply.and_then(|bytes| Answer::read(topic, &bytes));
        let elapsed = started.elapsed();
        let duration_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        let asked = match answer {
            Ok((payload, verdict)) => Asked {
                outcome: HookOutcome::Answered,
                change: payload,
                verdict,
                duration_ms,
            },
            Err((outcome, why)) => {
                tracing::warn!(hook = %hook.name, topic = topic.name(), outcome = outcome.name(), failure = ?hook.entry.on_failure, %why, "hook call failed");
                let (change, verdict) = failed(hook, topic, outcome);
                Asked {
                    outcome,
                    change,
                    verdict,
                    duration_ms,
                }
            }
        };
        if let Some(o) = &self.observer {
            o.observed(&hook.name, topic, asked.outcome, elapsed);
        }
        asked
    }

    /// Notify `hook` on the notifying `topic`: a future that calls it once
    /// (its answer is not read; a failure is logged and counted).
    pub fn notify(
        self: &Arc<Self>,
        hook: Arc<HttpHook>,
        topic: HookTopic,
        body: Value,
        id: String,
    ) -> BoxFuture<'static, ()> {
        let this = self.clone();
        Box::pin(async move {
            let started = Instant::now();
            let outcome = match this.post(&hook, &body, &id).await {
                Ok(_) => HookOutcome::Answered,
                Err((outcome, why)) => {
                    tracing::warn!(hook = %hook.name, topic = topic.name(), outcome = outcome.name(), %why, "hook notification failed");
                    outcome
                }
            };
            if let Some(o) = &this.observer {
                o.observed(&hook.name, topic, outcome, started.elapsed());
            }
        })
    }

    /// One signed POST within the hook's timeout: the 2xx body, or how it
    /// failed (never naming the URL or the secret).
    async fn post(&self, hook: &HttpHook, body: &Value, id: &str) -> Result<Vec<u8>, Failure> {
        let bytes =
            serde_json::to_vec(body).map_err(|e| (HookOutcome::BadAnswer, e.to_string()))?;
        let timestamp = chrono::Utc::now().timestamp();
        let signature = glia_proto::webhook_signature::sign(&hook.secret.0, id, timestamp, &bytes)
            .map_err(|e| (HookOutcome::Unreachable, e.to_string()))?;
        let timeout = Duration::from_millis(hook.entry.timeout_ms);
        let call = async {
            let mut resp = self
                .client
                .post(&hook.entry.url)
                .header("content-type", "application/json")
                .header(glia_proto::webhook_signature::ID_HEADER, id)
                .header(
                    glia_proto::webhook_signature::TIMESTAMP_HEADER,
                    timestamp.to_string(),
                )
                .header(glia_proto::webhook_signature::SIGNATURE_HEADER, signature)
                .body(bytes)
                .send()
                .await
                .map_err(|e| (HookOutcome::Unreachable, failure(&e)))?;
            let status = resp.status();
            if !status.is_success() {
                return Err((
                    HookOutcome::BadStatus,
                    format!("the hook answered {}", status.as_u16()),
                ));
            }
            let mut answer = Vec::new();
            while let Some(chunk) = resp
                .chunk()
                .await
                .map_err(|e| (HookOutcome::Unreachable, failure(&e)))?
            {
                if answer.len() + chunk.len() > MAX_ANSWER_BYTES {
                    return Err((
                        HookOutcome::BadAnswer,
                        format!("the answer is over {MAX_ANSWER_BYTES} bytes"),
                    ));
                }
                answer.extend_from_slice(&chunk);
            }
            Ok(answer)
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(result) => result,
            Err(_) => Err((
                HookOutcome::TimedOut,
                format!("no answer within {} ms", hook.entry.timeout_ms),
            )),
        }
    }
}

/// A reqwest error's kind, without the URL.
fn failure(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_body() || e.is_decode() {
        "the answer was cut off"
    } else {
        "the request failed"
    }
    .to_owned()
}

/// A change an answer makes: the payload's field (`input`, `steps`,
/// `description`, `content`) and its new value.
pub type Change = (&'static str, Value);

/// A call's failure: its outcome and why (never the URL or the secret).
pub type Failure = (HookOutcome, String);

/// What asking a hook led to: the change to the payload's field the topic
/// lets it change (`input`, `steps`, `description`, `content`), and the
/// verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Asked {
    /// How the call went.
    pub outcome: HookOutcome,
    /// `(field, value)` the hook set, if any.
    pub change: Option<Change>,
    /// What the loop does next.
    pub verdict: Verdict,
    /// How long the call took, in ms.
    pub duration_ms: u64,
}

/// What a failed call of `hook` on `topic` means (its `on_failure`).
fn failed(hook: &HttpHook, topic: HookTopic, outcome: HookOutcome) -> (Option<Change>, Verdict) {
    if hook.entry.on_failure == HookFailure::Open {
        return (None, Verdict::Continue);
    }
    let why = format!(
        "the hook {} did not answer ({}) and fails closed",
        hook.name,
        outcome.name()
    );
    match topic {
        HookTopic::BeforeToolCall => (
            None,
            Verdict::Cancel(format!("{why}, so this call was not run")),
        ),
        HookTopic::AfterToolCall => (
            Some((
                "content",
                Value::String(format!("[result withheld: {why}]")),
            )),
            Verdict::Continue,
        ),
        HookTopic::BeforePlan
        | HookTopic::AfterPlan
        | HookTopic::BeforeStep
        | HookTopic::AfterStep => (None, Verdict::Pause(why)),
        // Notifications are never asked.
        _ => (None, Verdict::Continue),
    }
}

/// An intercepting topic's answer, as the hook sends it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    /// `allow`, `deny`, `skip` or `pause`.
    pub verdict: WireVerdict,
    /// Why (required for `deny` and `pause`; the model reads a tool call's).
    #[serde(default)]
    pub reason: Option<String>,
    /// `before_tool_call`: the arguments to run with instead (an object;
    /// checked against the tool's input schema).
    #[serde(default)]
    pub input: Option<Value>,
    /// `after_plan`: the steps to commit instead.
    #[serde(default)]
    pub steps: Option<Vec<String>>,
    /// `before_step`: the step's description instead.
    #[serde(default)]
    pub description: Option<String>,
    /// `after_tool_call`: the result the model sees instead (a string, or
    /// content blocks).
    #[serde(default)]
    pub content: Option<Value>,
}

/// A verdict on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireVerdict {
    /// Go on (with the change, if any).
    Allow,
    /// Refuse: a tool call is refused with the reason (the model sees it);
    /// a plan or step topic cancels the run.
    Deny,
    /// Skip: the tool call is refused as skipped; `before_step` skips the
    /// step; `before_plan` uses the single implicit step.
    Skip,
    /// Park the run as paused for a person (plan and step topics).
    Pause,
}

impl Answer {
    /// Read a 2xx body for `topic`. What each topic takes:
    ///
    /// | topic | verdicts | change |
    /// |---|---|---|
    /// | before_plan | allow, deny, skip, pause | – |
    /// | after_plan | allow, deny, pause | `steps` |
    /// | before_step | allow, deny, skip, pause | `description` |
    /// | after_step | allow, deny, pause | – |
    /// | before_tool_call | allow, deny, skip | `input` (an object) |
    /// | after_tool_call | allow | `content` |
    ///
    /// A change comes with `allow` only; `deny` and `pause` need a
    /// non-blank `reason` of at most [`MAX_REASON_CHARS`]. `steps` holds 1
    /// to [`MAX_PLAN_STEPS`] steps; each step and a `description` are
    /// non-blank, at most [`MAX_STEP_CHARS`] characters. Anything else is
    /// `bad_answer`.
    pub fn read(topic: HookTopic, bytes: &[u8]) -> Result<(Option<Change>, Verdict), Failure> {
        let bad = |why: String| (HookOutcome::BadAnswer, why);
        let a: Answer = serde_json::from_slice(bytes)
            .map_err(|e| bad(format!("the answer is not a verdict: {e}")))?;
        use HookTopic::*;
        let allowed = match a.verdict {
            WireVerdict::Allow => true,
            WireVerdict::Deny => matches!(
                topic,
                BeforePlan | AfterPlan | BeforeStep | AfterStep | BeforeToolCall
            ),
            WireVerdict::Skip => matches!(topic, BeforePlan | BeforeStep | BeforeToolCall),
            WireVerdict::Pause => matches!(topic, BeforePlan | AfterPlan | BeforeStep | AfterStep),
        };
        if !allowed {
            return Err(bad(format!(
                "{:?} is not a verdict {} takes",
                a.verdict,
                topic.name()
            )));
        }
        let mut changes: Vec<Change> = Vec::new();
        if let Some(input) = a.input {
            if topic != BeforeToolCall {
                return Err(bad(format!("{} takes no `input`", topic.name())));
            }
            if !input.is_object() {
                return Err(bad("`input` is not a JSON object".into()));
            }
            changes.push(("input", input));
        }
        if let Some(steps) = a.steps {
            if topic != AfterPlan {
                return Err(bad(format!("{} takes no `steps`", topic.name())));
            }
            if steps.is_empty() {
                return Err(bad(
                    "`steps` is empty; a plan has at least one step (deny to stop the run)".into(),
                ));
            }
            if steps.len() > MAX_PLAN_STEPS {
                return Err(bad(format!(
                    "`steps` holds {} steps, more than {MAX_PLAN_STEPS}",
                    steps.len()
                )));
            }
            for (i, step) in steps.iter().enumerate() {
                step_text(&format!("steps[{i}]"), step)?;
            }
            changes.push(("steps", json!(steps)));
        }
        if let Some(description) = a.description {
            if topic != BeforeStep {
                return Err(bad(format!("{} takes no `description`", topic.name())));
            }
            step_text("description", &description)?;
            changes.push(("description", Value::String(description)));
        }
        if let Some(content) = a.content {
            if topic != AfterToolCall {
                return Err(bad(format!("{} takes no `content`", topic.name())));
            }
            ToolContent::deserialize(&content)
                .map_err(|e| bad(format!("`content` is not a tool result: {e}")))?;
            changes.push(("content", content));
        }
        if changes.len() > 1 {
            return Err(bad("more than one change".into()));
        }
        let change = changes.pop();
        if change.is_some() && a.verdict != WireVerdict::Allow {
            return Err(bad("a change comes with the verdict allow only".into()));
        }
        let reason = || -> Result<String, Failure> {
            match a.reason.as_deref().map(str::trim) {
                Some(r) if !r.is_empty() && r.chars().count() <= MAX_REASON_CHARS => {
                    Ok(r.to_owned())
                }
                Some(r) if !r.is_empty() => Err(bad(format!(
                    "the reason is over {MAX_REASON_CHARS} characters"
                ))),
                _ => Err(bad("deny and pause need a reason".into())),
            }
        };
        let verdict = match a.verdict {
            WireVerdict::Allow => Verdict::Continue,
            WireVerdict::Deny => Verdict::Cancel(reason()?),
            WireVerdict::Skip => Verdict::Skip,
            WireVerdict::Pause => Verdict::Pause(reason()?),
        };
        Ok((change, verdict))
    }
}

/// The logical call of a hook point: `{topic}:{model calls so far}:{subject}:{payload hash}`,
/// the subject being the call id (tool topics), the step index (step
/// topics) or `plan`; the hash is of the payload's canonical JSON as the
/// hooks before this one left it. The same at the same point after a crash
/// or a retry; different for another call, step, turn or payload.
pub fn hook_key(state: &RunState, topic: HookTopic, payload: &Value) -> String {
    let subject = match topic {
        HookTopic::BeforeToolCall | HookTopic::AfterToolCall => {
            payload["call_id"].as_str().unwrap_or_default().to_owned()
        }
        HookTopic::BeforeStep | HookTopic::AfterStep => payload["index"].to_string(),
        _ => "plan".to_owned(),
    };
    let hash = Sha256::digest(glia_proto::canonical_json(payload).as_bytes());
    format!(
        "{}:{}:{subject}:{}",
        topic.name(),
        state.usage.turns,
        &format!("{hash:x}")[..16]
    )
}

/// `webhook-id` of one logical call of `hook` in `run_id` (`key`: a
/// [`hook_key`], or for a notification its topic and the seq of the event
/// it follows): `msg_` + 32 hex digits of a SHA-256. The same on every
/// attempt of the same call, so a hook can dedupe a retry after a crash.
pub fn webhook_id(run_id: Uuid, hook: &str, key: &str) -> String {
    let hash = Sha256::digest(format!("{run_id} {hook} {key}").as_bytes());
    format!("msg_{}", &format!("{hash:x}")[..32])
}

/// The `webhook-id` ([`webhook_id`] of `key`) and the body (module docs)
/// of a call of `hook` on `topic`.
pub fn request(
    hook: &HttpHook,
    topic: HookTopic,
    state: &RunState,
    tenant: Option<&str>,
    key: &str,
    payload: &Value,
) -> (String, Value) {
    let body = json!({
        "topic": topic.name(),
        "hook": hook.name,
        "run_id": state.run_id,
        "tenant": tenant,
        "agent": state.config.agent,
        "seq": state.head_seq,
        "payload": payload,
    });
    (webhook_id(state.run_id, &hook.name, key), body)
}
