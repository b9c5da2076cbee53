//! Child runs: other agents offered to a run as tools (`agents =
//! ["refund@2"]`, `docs/child-runs.md`).
//!
//! A run config or agent definition names registered agents in
//! [`crate::RunConfig::agents`]. At admission the dispatcher resolves each
//! name for the run's tenant and freezes it ([`ChildAgent`], in
//! [`crate::RunConfig::child_agents`]: name, version, content hash), so a
//! run never depends on the registry later. The worker offers each as a
//! tool ([`ChildAgent::tool_spec`]); a call of one is decided
//! [`crate::Disposition::Child`] and the run parks at
//! `awaiting_children`; the dispatcher starts the child run under a
//! per-tenant idempotency key ([`child_key`]) and, when the child ends,
//! posts [`crate::Payload::ChildEnded`] which the worker records as
//! `child.ended`: the tool result (or error) and the child's spend, which
//! the parent's budget counts.
//!
//! Pure helpers only: no I/O.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::budget::{BudgetLimits, BudgetUsage};

/// The deepest a child run may be: a run admitted by a client has depth 0,
/// its children 1, theirs 2 … A call that would start a child deeper than
/// this is a tool error the model sees and starts nothing, which also ends
/// a cycle of agents calling each other (`a → b → a → …`).
pub const MAX_CHILD_DEPTH: u32 = 4;

/// Most agents one config offers as tools ([`crate::RunConfig::agents`]).
pub const MAX_AGENTS: usize = 16;

/// The longest a child's goal may be, in bytes (the `goal` argument).
pub const MAX_CHILD_GOAL_BYTES: usize = 64 * 1024;

/// A child agent as resolved and frozen at the parent's admission.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ChildAgent {
    /// Registry name; also the tool name the model sees.
    pub name: String,
    /// Registry version, from 1.
    pub version: u32,
    /// The definition's content hash (`sha256:…`), checked again when a
    /// child is started (versions are immutable).
    pub content_hash: String,
    /// The definition's description, shown to the model.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

impl ChildAgent {
    /// `name@version`.
    pub fn reference(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }
}

/// The input schema of an agent tool: `{"goal": string}` (required, not empty).
pub fn child_input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "goal": {"type": "string", "minLength": 1, "description": "What the agent is to do: its goal, in full."}
        },
        "required": ["goal"],
        "additionalProperties": false
    })
}

/// What a pending call of an agent tool is about (set by its `tool.call`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildCall {
    /// The agent, `name@version`.
    pub agent: String,
    /// Its content hash as frozen at admission.
    pub content_hash: String,
    /// The child's goal (the call's `goal` argument).
    pub goal: String,
    /// The call's idempotency key (`{run_id}:{turn}:{call_id}`), from which
    /// the child's run idempotency key is made ([`child_key`]).
    pub key: String,
    /// The child run, once known (set by `child.ended`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_run_id: Option<Uuid>,
}

/// The per-tenant idempotency key of the child run a call starts:
/// `child:` and the hex SHA-256 of the call's idempotency key
/// ([`ChildCall::key`]). Deterministic, so a replay, a resumed parent, a
/// second dispatcher or a retried admission finds the child already
/// created instead of starting another.
pub fn child_key(call_key: &str) -> String {
    format!("child:{:x}", Sha256::digest(call_key.as_bytes()))
}

/// `name` or `name@version` split; errors say what is wrong with it.
pub fn parse_agent_ref(s: &str) -> Result<(&str, Option<u32>), String> {
    let (name, version) = match s.split_once('@') {
        None => (s, None),
        Some((name, v)) => (
            name,
            Some(
                v.parse::<u32>()
                    .ok()
                    .filter(|v| *v >= 1)
                    .ok_or("the version after `@` must be a whole number from 1")?,
            ),
        ),
    };
    if name.is_empty() {
        return Err("names no agent (use `name` or `name@VERSION`)".into());
    }
    if !is_agent_name(name) {
        return Err(format!("{name:?} must match ^[a-z0-9][a-z0-9_-]{{0,63}}$"));
    }
    Ok((name, version))
}

/// True for a registry name: `^[a-z0-9][a-z0-9_-]{0,63}$` (the agent
/// definition's rule, here without a regex).
pub fn is_agent_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-')
}

/// What is left of `limits` after `usage`, per limit (an unlimited limit
/// stays unlimited; a spent one is 0).
pub fn remaining(limits: &BudgetLimits, usage: &BudgetUsage) -> BudgetLimits {
    let left = |max: Option<u64>, used: u64| max.map(|m| m.saturating_sub(used));
    BudgetLimits {
        max_turns: left(limits.max_turns, usage.turns),
        max_tool_calls: left(limits.max_tool_calls, usage.tool_calls),
        max_active_ms: left(limits.max_active_ms, usage.active_ms),
        max_input_tokens: left(limits.max_input_tokens, usage.tokens.input_tokens),
        max_output_tokens: left(limits.max_output_tokens, usage.tokens.output_tokens),
        max_cache_write_tokens: left(
            limits.max_cache_write_tokens,
            usage.tokens.cache_write_tokens,
        ),
        max_cache_read_tokens: left(limits.max_cache_read_tokens, usage.tokens.cache_read_tokens),
        max_cost_usd_micros: left(limits.max_cost_usd_micros, usage.cost_usd_micros),
    }
}

/// The smaller of two limits, per limit (unlimited is the largest).
pub fn bounded(own: &BudgetLimits, by: &BudgetLimits) -> BudgetLimits {
    let min = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    };
    BudgetLimits {
        max_turns: min(own.max_turns, by.max_turns),
        max_tool_calls: min(own.max_tool_calls, by.max_tool_calls),
        max_active_ms: min(own.max_active_ms, by.max_active_ms),
        max_input_tokens: min(own.max_input_tokens, by.max_input_tokens),
        max_output_tokens: min(own.max_output_tokens, by.max_output_tokens),
        max_cache_write_tokens: min(own.max_cache_write_tokens, by.max_cache_write_tokens),
        max_cache_read_tokens: min(own.max_cache_read_tokens, by.max_cache_read_tokens),
        max_cost_usd_micros: min(own.max_cost_usd_micros, by.max_cost_usd_micros),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_deterministic_and_differ_per_call() {
        assert_eq!(child_key("r:1:a"), child_key("r:1:a"));
        assert_ne!(child_key("r:1:a"), child_key("r:1:b"));
        assert!(child_key("r:1:a").len() < 80);
    }

    #[test]
    fn refs_parse_and_name_what_is_wrong() {
        assert_eq!(parse_agent_ref("refund@2").unwrap(), ("refund", Some(2)));
        assert_eq!(parse_agent_ref("refund").unwrap(), ("refund", None));
        assert!(parse_agent_ref("refund@0").is_err());
        assert!(parse_agent_ref("@2").is_err());
        assert!(parse_agent_ref("Bad Name").is_err());
    }

    #[test]
    fn budgets_bound_by_the_parents_remainder() {
        let limits = BudgetLimits {
            max_cost_usd_micros: Some(100),
            max_turns: Some(10),
            ..Default::default()
        };
        let usage = BudgetUsage {
            cost_usd_micros: 70,
            turns: 12,
            ..Default::default()
        };
        let left = remaining(&limits, &usage);
        assert_eq!(left.max_cost_usd_micros, Some(30));
        assert_eq!(left.max_turns, Some(0));
        assert_eq!(left.max_tool_calls, None);
        let own = BudgetLimits {
            max_cost_usd_micros: Some(50),
            max_tool_calls: Some(3),
            ..Default::default()
        };
        let b = bounded(&own, &left);
        assert_eq!(b.max_cost_usd_micros, Some(30));
        assert_eq!(b.max_tool_calls, Some(3));
        assert_eq!(b.max_turns, Some(0));
    }
}
