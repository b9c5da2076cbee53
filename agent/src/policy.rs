//! Declarative tool-call policies and text guardrails.
//!
//! A [`Policy`] matches a tool name (or `*`) and, optionally, a regex over the
//! canonical JSON of the arguments; the first match decides, no match allows.
//! A [`Guardrail`] is a named function over text that may reject it with a
//! reason: input guardrails see the goal and user messages, output guardrails
//! the model's answer.

use glia_proto::{Policy, PolicyAction, canonical_json};
use regex::Regex;
use serde_json::Value;

/// A policy whose regex does not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("policy {index} (tool {tool}): invalid regex: {reason}")]
pub struct PolicyError {
    /// Position in the list.
    pub index: usize,
    /// Its tool.
    pub tool: String,
    /// The regex error.
    pub reason: String,
}

/// Policies with their regexes compiled.
#[derive(Debug, Clone, Default)]
pub struct CompiledPolicies {
    rules: Vec<(Policy, Option<Regex>)>,
}

impl CompiledPolicies {
    /// Compile `policies`; fails on the first bad regex.
    pub fn new(policies: &[Policy]) -> Result<Self, PolicyError> {
        let rules = policies
            .iter()
            .enumerate()
            .map(|(index, p)| {
                let re = p
                    .args
                    .as_deref()
                    .map(|re| glia_proto::limits::compile_regex(re, policies.len()))
                    .transpose()
                    .map_err(|e| PolicyError {
                        index,
                        tool: p.tool.clone(),
                        reason: e.to_string(),
                    })?;
                Ok((p.clone(), re))
            })
            .collect::<Result<_, _>>()?;
        Ok(CompiledPolicies { rules })
    }

    /// The action for a call of `tool` (the name the model called: a
    /// policy naming an MCP tool by its own name applies too,
    /// [`Policy::applies_to`]) with `input`.
    ///
    /// ```
    /// use glia_proto::{Policy, PolicyAction};
    /// use glia_agent::policy::CompiledPolicies;
    /// let p = CompiledPolicies::new(&[Policy { tool: "refund".into(), args: Some(r#""amount":\d{4,}"#.into()),
    ///     action: PolicyAction::RequireApproval }]).unwrap();
    /// assert_eq!(p.decide("refund", &serde_json::json!({"amount": 5000})), PolicyAction::RequireApproval);
    /// assert_eq!(p.decide("refund", &serde_json::json!({"amount": 50})), PolicyAction::Allow);
    /// ```
    pub fn decide(&self, tool: &str, input: &Value) -> PolicyAction {
        let args = canonical_json(input);
        self.rules
            .iter()
            .find(|(p, re)| p.applies_to(tool) && re.as_ref().is_none_or(|re| re.is_match(&args)))
            .map_or(PolicyAction::Allow, |(p, _)| p.action.clone())
    }
}

type Check = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// A named check over text: `Err(reason)` rejects it.
pub struct Guardrail {
    /// Name recorded in `guardrail.tripped`.
    pub name: String,
    check: Check,
}

impl Guardrail {
    /// A guardrail named `name`.
    ///
    /// ```
    /// use glia_agent::policy::Guardrail;
    /// let no_ssn = Guardrail::new("no-ssn", |t| if t.contains("SSN") { Err("mentions an SSN".into()) } else { Ok(()) });
    /// assert!(no_ssn.check("my SSN is …").is_err());
    /// ```
    pub fn new(
        name: &str,
        check: impl Fn(&str) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        Guardrail {
            name: name.to_owned(),
            check: Box::new(check),
        }
    }

    /// Run the check.
    pub fn check(&self, text: &str) -> Result<(), String> {
        (self.check)(text)
    }
}
