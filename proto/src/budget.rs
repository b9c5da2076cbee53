//! Per-run budgets: limits, the usage counted against them, and the check.
//! (Per-tenant daily caps are counted across runs by the fleet; a run they
//! stop pauses with [`Limit::TenantDailyCost`] or [`Limit::TenantDailyTokens`].)
//!
//! Units: turns and tool calls are counts, active time is milliseconds a worker
//! spent on the run (model and tool time; parked time never counts), tokens are
//! tokens, cost is USD micros (1 USD = 1,000,000).

use serde::{Deserialize, Serialize};

use crate::content::Usage;

/// Limits of one run; `None` (null or absent) means unlimited. Units:
/// counts, milliseconds of active time, tokens, USD micros (1 USD =
/// 1,000,000).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct BudgetLimits {
    /// Model calls.
    pub max_turns: Option<u64>,
    /// Tool calls executed (external ones included).
    pub max_tool_calls: Option<u64>,
    /// Active milliseconds.
    pub max_active_ms: Option<u64>,
    /// Uncached input tokens.
    pub max_input_tokens: Option<u64>,
    /// Output tokens.
    pub max_output_tokens: Option<u64>,
    /// Cache-write tokens.
    pub max_cache_write_tokens: Option<u64>,
    /// Cache-read tokens.
    pub max_cache_read_tokens: Option<u64>,
    /// Cost in USD micros.
    pub max_cost_usd_micros: Option<u64>,
}

/// What a run has consumed so far; derived from its events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetUsage {
    /// Model calls made.
    pub turns: u64,
    /// Tool calls executed.
    pub tool_calls: u64,
    /// Active milliseconds.
    pub active_ms: u64,
    /// Tokens by kind.
    pub tokens: Usage,
    /// Cost in USD micros.
    pub cost_usd_micros: u64,
}

/// Which limit a check hit: one of the run's own ([`BudgetLimits`]) or one of
/// its tenant's daily caps, which the fleet counts across runs (the worker's
/// budget gate).
///
/// ```
/// use glia_proto::budget::Limit;
/// assert_eq!(serde_json::to_string(&Limit::TenantDailyCost).unwrap(), r#""tenant_daily_cost""#);
/// assert_eq!(Limit::TenantDailyTokens.to_string(), "tenant_daily_tokens");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// `max_turns`.
    Turns,
    /// `max_tool_calls`.
    ToolCalls,
    /// `max_active_ms`.
    ActiveTime,
    /// `max_input_tokens`.
    InputTokens,
    /// `max_output_tokens`.
    OutputTokens,
    /// `max_cache_write_tokens`.
    CacheWriteTokens,
    /// `max_cache_read_tokens`.
    CacheReadTokens,
    /// `max_cost_usd_micros`.
    Cost,
    /// The tenant's daily cost cap (USD micros, all its runs, per UTC day).
    TenantDailyCost,
    /// The tenant's daily token cap (tokens of every kind, all its runs, per
    /// UTC day).
    TenantDailyTokens,
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned));
        f.write_str(s.as_deref().unwrap_or("?"))
    }
}

impl BudgetLimits {
    /// The first limit `usage` has reached or passed, in declaration order.
    ///
    /// A limit is reached when usage is at least the limit: a run with
    /// `max_turns: Some(3)` and 3 turns used may not make a fourth call.
    ///
    /// ```
    /// use glia_proto::budget::{BudgetLimits, BudgetUsage, Limit};
    /// let limits = BudgetLimits { max_turns: Some(2), ..Default::default() };
    /// let mut used = BudgetUsage::default();
    /// assert_eq!(limits.exhausted(&used), None);
    /// used.turns = 2;
    /// assert_eq!(limits.exhausted(&used), Some(Limit::Turns));
    /// ```
    pub fn exhausted(&self, usage: &BudgetUsage) -> Option<Limit> {
        let checks = [
            (self.max_turns, usage.turns, Limit::Turns),
            (self.max_tool_calls, usage.tool_calls, Limit::ToolCalls),
            (self.max_active_ms, usage.active_ms, Limit::ActiveTime),
            (
                self.max_input_tokens,
                usage.tokens.input_tokens,
                Limit::InputTokens,
            ),
            (
                self.max_output_tokens,
                usage.tokens.output_tokens,
                Limit::OutputTokens,
            ),
            (
                self.max_cache_write_tokens,
                usage.tokens.cache_write_tokens,
                Limit::CacheWriteTokens,
            ),
            (
                self.max_cache_read_tokens,
                usage.tokens.cache_read_tokens,
                Limit::CacheReadTokens,
            ),
            (self.max_cost_usd_micros, usage.cost_usd_micros, Limit::Cost),
        ];
        checks
            .into_iter()
            .find(|(max, used, _)| max.is_some_and(|m| *used >= m))
            .map(|(_, _, l)| l)
    }

    /// The first limit that blocks one more model call: every limit but
    /// `max_tool_calls` (a model out of tool calls may still answer).
    pub fn exhausted_for_model(&self, usage: &BudgetUsage) -> Option<Limit> {
        let without_tools = BudgetLimits {
            max_tool_calls: None,
            ..*self
        };
        without_tools.exhausted(usage)
    }

    /// The first limit that blocks one more tool call: only `max_tool_calls`,
    /// `max_active_ms` and `max_cost_usd_micros` apply to tools.
    pub fn exhausted_for_tool(&self, usage: &BudgetUsage) -> Option<Limit> {
        let tool_limits = BudgetLimits {
            max_tool_calls: self.max_tool_calls,
            max_active_ms: self.max_active_ms,
            max_cost_usd_micros: self.max_cost_usd_micros,
            ..Default::default()
        };
        tool_limits.exhausted(usage)
    }

    /// These limits raised by `extra`: each field of `extra` that is `Some(n)`
    /// adds `n` to a finite limit (an unlimited one stays unlimited).
    pub fn extended_by(&self, extra: &BudgetLimits) -> BudgetLimits {
        fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.saturating_add(b)),
                (a, _) => a,
            }
        }
        BudgetLimits {
            max_turns: add(self.max_turns, extra.max_turns),
            max_tool_calls: add(self.max_tool_calls, extra.max_tool_calls),
            max_active_ms: add(self.max_active_ms, extra.max_active_ms),
            max_input_tokens: add(self.max_input_tokens, extra.max_input_tokens),
            max_output_tokens: add(self.max_output_tokens, extra.max_output_tokens),
            max_cache_write_tokens: add(self.max_cache_write_tokens, extra.max_cache_write_tokens),
            max_cache_read_tokens: add(self.max_cache_read_tokens, extra.max_cache_read_tokens),
            max_cost_usd_micros: add(self.max_cost_usd_micros, extra.max_cost_usd_micros),
        }
    }
}

/// Prices of one model in USD micros per million tokens, by token kind.
///
/// Example: Claude Sonnet at $3 / $15 per MTok input / output, cache write
/// $3.75, cache read $0.30 is `Pricing { input: 3_000_000, output: 15_000_000,
/// cache_write: 3_750_000, cache_read: 300_000 }`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Pricing {
    /// USD micros per million uncached input tokens.
    pub input: u64,
    /// USD micros per million output tokens.
    pub output: u64,
    /// USD micros per million cache-write tokens.
    pub cache_write: u64,
    /// USD micros per million cache-read tokens.
    pub cache_read: u64,
}

impl Pricing {
    /// Cost of `usage` in USD micros, rounded up to the next micro.
    ///
    /// ```
    /// use glia_proto::{Usage, budget::Pricing};
    /// let p = Pricing { input: 3_000_000, output: 15_000_000, cache_write: 0, cache_read: 0 };
    /// let u = Usage { input_tokens: 1000, output_tokens: 100, ..Default::default() };
    /// assert_eq!(p.cost_usd_micros(&u), 3_000 + 1_500);
    /// ```
    pub fn cost_usd_micros(&self, usage: &Usage) -> u64 {
        let micro_millionths = u128::from(usage.input_tokens) * u128::from(self.input)
            + u128::from(usage.output_tokens) * u128::from(self.output)
            + u128::from(usage.cache_write_tokens) * u128::from(self.cache_write)
            + u128::from(usage.cache_read_tokens) * u128::from(self.cache_read);
        u64::try_from(micro_millionths.div_ceil(1_000_000)).unwrap_or(u64::MAX)
    }
}

/// An amount of model spend: what a call is estimated to cost, what it did
/// cost, or what a budget scope has used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Spend {
    /// Tokens of every kind: uncached input, output, cache write and cache
    /// read ([`Usage::total`]).
    pub tokens: u64,
    /// Cost in USD micros (1 USD = 1,000,000).
    pub cost_usd_micros: u64,
}

impl Spend {
    /// Nothing spent.
    pub const ZERO: Spend = Spend {
        tokens: 0,
        cost_usd_micros: 0,
    };

    /// The spend of a call that used `usage` and cost `cost_usd_micros`.
    pub fn of(usage: &Usage, cost_usd_micros: u64) -> Spend {
        Spend {
            tokens: usage.total(),
            cost_usd_micros,
        }
    }

    /// Both amounts added, saturating.
    pub fn saturating_add(self, other: Spend) -> Spend {
        Spend {
            tokens: self.tokens.saturating_add(other.tokens),
            cost_usd_micros: self.cost_usd_micros.saturating_add(other.cost_usd_micros),
        }
    }
}

/// The caps of one budget scope; `None` is uncapped. Same units as [`Spend`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SpendCap {
    /// Most tokens (every kind).
    pub tokens: Option<u64>,
    /// Most USD micros.
    pub cost_usd_micros: Option<u64>,
}
