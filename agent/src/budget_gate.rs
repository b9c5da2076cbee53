//! The budget gate: spend counted across runs (per-tenant daily caps),
//! checked before every model call and settled after it.
//!
//! A run's own budget is enforced by the loop from the run's log
//! ([`glia_proto::BudgetLimits`]). What one run cannot see — how much its
//! tenant's other runs spent today, on any worker — is asked of a
//! [`BudgetGate`]. The loop ([`crate::agent::Agent::with_budget_gate`]):
//!
//! 1. before a model call, after the run's own checks, reserves an
//!    estimate of the call ([`estimate_usage`], priced) under a request id `{run_id}:{seq}`, where
//!    `seq` is the sequence the call's `model.call` event gets — the same for
//!    every retry of the same call, so a crash between the reservation and
//!    the event never counts it twice;
//! 2. on [`GateDecision::Exceeded`] records `budget.warn` and parks the run
//!    `paused`, exactly as for its own limits; the caller resumes it later
//!    (a new day, or raised caps);
//! 3. after the call, settles the reservation with the actual usage and cost
//!    (zero when the call failed); spend it did not reserve for (a plan
//!    draft, a compaction) is settled after the fact under its event's
//!    `{run_id}:{seq}`, so the counter and the log agree.
//!
//! The fleet's gate is `glia_worker::consumer::LedgerGate`: counters in the
//! `glia_backends::Ledger` (Redis), rebuilt from the event log when missing.

use std::collections::HashMap;

use async_trait::async_trait;
pub use glia_proto::Spend;
use glia_proto::SpendCap;
use glia_proto::{Limit, RunState, Usage};
use serde::{Deserialize, Serialize};

use crate::provider::ModelRequest;

/// What the gate says about one model call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateDecision {
    /// Make the call; its estimate is reserved.
    Granted,
    /// Do not: this limit is reached. The run pauses with it.
    Exceeded(Limit),
}

/// The gate could not decide (its store did not answer). The run is left
/// runnable; the worker retries later.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("budget gate unavailable: {0}")]
pub struct GateError(pub String);

/// Spend counted across runs. Implementations must make `reserve` and
/// `settle` idempotent per request id: the loop repeats both, with the same
/// id, when a step is retried.
#[async_trait]
pub trait BudgetGate: Send + Sync {
    /// Reserve `estimate` for the model call `request_id` of the run in
    /// `state`. A request id already reserved or settled is granted again
    /// without counting twice.
    async fn reserve(
        &self,
        state: &RunState,
        request_id: &str,
        estimate: Spend,
    ) -> Result<GateDecision, GateError>;

    /// The call `request_id` cost `actual`: replace its reservation (or, for
    /// spend nothing was reserved for, add it). A repeated settle changes
    /// nothing.
    async fn settle(
        &self,
        state: &RunState,
        request_id: &str,
        actual: Spend,
    ) -> Result<(), GateError>;
}

/// The usage the loop reserves for before a model call (priced with the
/// run's prices): about the most `request` can use. Input tokens are
/// estimated at four characters a token of the request's JSON (system
/// prompt, messages, tools), all uncached; output tokens at the request's
/// `max_tokens`. A call is refused when this does not fit, even if its actual
/// cost would have; the reservation is replaced by the actual usage as soon
/// as the call returns.
///
/// ```
/// use glia_agent::budget_gate::estimate_usage;
/// use glia_agent::provider::{ModelRequest, ToolChoice};
/// let request = ModelRequest { model: "m".into(), system: "x".repeat(400), messages: vec![], tools: vec![],
///     tool_choice: ToolChoice::Auto, max_tokens: 1000 };
/// let usage = estimate_usage(&request);
/// assert_eq!((usage.input_tokens, usage.output_tokens), (101, 1000)); // 400 + "[]" + "[]"
/// ```
pub fn estimate_usage(request: &ModelRequest) -> Usage {
    let chars = request.system.len()
        + serde_json::to_string(&request.messages).map_or(0, |s| s.len())
        + serde_json::to_string(&request.tools).map_or(0, |s| s.len());
    Usage {
        input_tokens: (chars as u64).div_ceil(4),
        output_tokens: u64::from(request.max_tokens),
        ..Usage::default()
    }
}

/// One tenant's daily caps. JSON: `{"daily_cost_usd_micros": 5000000,
/// "daily_tokens": 2000000}`; an absent field is uncapped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantCap {
    /// Most USD micros its runs may spend per UTC day.
    pub daily_cost_usd_micros: Option<u64>,
    /// Most tokens (every kind) its runs may use per UTC day.
    pub daily_tokens: Option<u64>,
}

impl TenantCap {
    /// As the ledger's caps.
    pub fn spend_cap(&self) -> SpendCap {
        SpendCap {
            tokens: self.daily_tokens,
            cost_usd_micros: self.daily_cost_usd_micros,
        }
    }

    /// True when nothing is capped.
    pub fn is_unlimited(&self) -> bool {
        self.daily_cost_usd_micros.is_none() && self.daily_tokens.is_none()
    }
}

/// Daily caps by tenant. A tenant not listed is uncapped. JSON (the file
/// `glia worker --tenant-caps` reads): `{"acme": {"daily_cost_usd_micros":
/// 5000000}, "globex": {"daily_tokens": 2000000}}`.
///
/// ```
/// use glia_agent::budget_gate::TenantCaps;
/// let caps = TenantCaps::from_json(r#"{"acme": {"daily_cost_usd_micros": 5000000}}"#).unwrap();
/// assert_eq!(caps.get("acme").unwrap().daily_cost_usd_micros, Some(5_000_000));
/// assert!(caps.get("globex").is_none());
/// let e = TenantCaps::from_json(r#"{"acme": {"daily_tokenz": 5}}"#).unwrap_err();
/// assert_eq!(e.to_string(), "acme.daily_tokenz: unknown field");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TenantCaps(pub HashMap<String, TenantCap>);

impl TenantCaps {
    /// Parse the JSON form, strictly ([`glia_proto::strict`]). Errors:
    /// malformed JSON, an unknown field, a negative or fractional amount,
    /// naming the path (`acme.daily_tokenz: unknown field`).
    pub fn from_json(text: &str) -> Result<TenantCaps, glia_proto::strict::ParseError> {
        glia_proto::strict::from_json_str(text)
    }

    /// The tenant's caps, when it has any.
    pub fn get(&self, tenant: &str) -> Option<&TenantCap> {
        self.0.get(tenant).filter(|c| !c.is_unlimited())
    }

    /// True when no tenant is capped.
    pub fn is_empty(&self) -> bool {
        self.0.values().all(TenantCap::is_unlimited)
    }
}
