//! Agent definitions: an agent as reviewed, versioned configuration.
//!
//! An [`AgentDefinition`] is a TOML file (or the same shape as JSON over the
//! API) that resolves to a [`RunConfig`]. The registry (`PUT
//! /v1/agents/{name}`) keeps immutable versions keyed by the definition's
//! [`AgentDefinition::content_hash`]; a run started from one records an
//! [`AgentRef`] (name, version, hash) in its config, so it never depends on
//! what the registry holds later.
//!
//! Trust boundary: a definition is tenant input. It names tools, models and
//! rules; it can never name a command, an address or a secret (unknown
//! fields are refused, `command` included). Those live in the operator's
//! catalogue on the workers.
//!
//! ```toml
//! name = "support"
//! description = "Answers order questions"
//! model = "claude-sonnet-4-5"
//! system = "You are a support agent."
//! tools = ["get_order"]
//! conversational = true
//! [budget]
//! max_turns = 20
//! [[guardrails.input]]
//! name = "no-card-numbers"
//! deny = '\b\d{4}[ -]?\d{4}[ -]?\d{4}[ -]?\d{4}\b'
//! [[guardrails.input]]
//! name = "email"
//! redact = '[\w.+-]+@[\w-]+\.[\w.]+'      # replaced by [redacted:email]
//! [compaction]
//! strategy = "drop_oldest"
//! max_tokens = 50000
//! ```

use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::{AgentRef, RunConfig, run_fields};
use crate::config_error::{ConfigError, TOOL_NAME, config_error};

/// Agent names: `^[a-z0-9][a-z0-9_-]{0,63}$`.
static AGENT_NAME: LazyLock<Regex> =
    LazyLock::new(|| Regex::new("^[a-z0-9][a-z0-9_-]{0,63}$").expect("valid regex"));

run_fields! {
    /// One agent, as a tenant writes it. Resolves to a [`RunConfig`] with
    /// [`AgentDefinition::resolve`]; fields not given take the run defaults.
    /// The fields it shares with a run config mean the same there. Unknown
    /// fields are refused (422 naming the field).
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
    #[serde(deny_unknown_fields)]
    pub struct AgentDefinition {
        /// Registry name, `^[a-z0-9][a-z0-9_-]{0,63}$`.
        #[cfg_attr(feature = "schemars", schemars(pattern("^[a-z0-9][a-z0-9_-]{0,63}$")))]
        pub name: String,
        /// What the agent is for, for people.
        #[serde(default)]
        pub description: String,
        common provider,
        common model,
        common system,
        /// Names of the worker's tools the agent may call; exactly these are offered.
        #[serde(default)]
        #[cfg_attr(
            feature = "schemars",
            schemars(
                length(max = crate::limits::MAX_TOOLS),
                inner(pattern(crate::config_error::TOOL_NAME_PATTERN))
            )
        )]
        pub tools: Vec<String>,
        common external_tools,
        common mcp,
        common http_tools,
        common tool_policy,
        common policies,
        common builtin_tools,
        common guardrails,
        common compaction,
        common budget,
        common planner,
        common output_schema #[serde(skip_serializing_if = "Option::is_none")],
        common conversational,
        /// Output token cap per model call; `None` = the run default.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
        pub max_tokens: Option<u32>,
        common approval_timeout_ms #[serde(skip_serializing_if = "Option::is_none")],
        common max_result_bytes,
        // Issue 32, child runs.
        common agents,
        // Issue 33: catalogue hooks by name.
        common hooks,
    }
}

impl AgentDefinition {
    /// `sha256:` and the hex SHA-256 of the definition's canonical JSON (keys
    /// sorted, defaults written out): the same content, however written (TOML
    /// or JSON, defaults spelled or omitted), has the same hash.
    pub fn content_hash(&self) -> String {
        let value = serde_json::to_value(self).expect("a definition serialises");
        format!(
            "sha256:{:x}",
            Sha256::digest(crate::json::canonical_json(&value).as_bytes())
        )
    }

    /// The run configuration this definition describes, stamped with
    /// `agent` when given. Tools are exactly [`AgentDefinition::tools`]
    /// (an empty list offers no worker tools).
    pub fn resolve(&self, agent: Option<AgentRef>) -> RunConfig {
        let defaults = RunConfig::default();
        RunConfig {
            model: self.model.clone(),
            system: self.system.clone(),
            tools: Some(self.tools.clone()),
            external_tools: self.external_tools.clone(),
            mcp: self.mcp.clone(),
            http_tools: self.http_tools.clone(),
            builtin_tools: self.builtin_tools.clone(),
            tool_policy: self.tool_policy.clone(),
            max_result_bytes: self.max_result_bytes,
            provider: self.provider.clone(),
            policies: self.policies.clone(),
            budget: self.budget,
            conversational: self.conversational,
            planner: self.planner,
            output_schema: self.output_schema.clone(),
            max_tokens: self.max_tokens.unwrap_or(defaults.max_tokens),
            approval_timeout_ms: self.approval_timeout_ms,
            guardrails: self.guardrails.clone(),
            compaction: self.compaction.clone(),
            agent,
            agents: self.agents.clone(),
            hooks: self.hooks.clone(),
            ..defaults
        }
    }

    /// Every check that needs no worker: the name, the model, tool names
    /// (valid, distinct), and everything [`RunConfig::validate`] checks
    /// (schemas compile, guardrail and policy regexes compile). Errors name
    /// the field as written in the definition (`guardrails.input[0].deny`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !AGENT_NAME.is_match(&self.name) {
            return Err(config_error(
                "name",
                format!("{:?} must match ^[a-z0-9][a-z0-9_-]{{0,63}}$", self.name),
            ));
        }
        if let Some(p) = &self.provider
            && p.trim().is_empty()
        {
            return Err(config_error("provider", "is blank"));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, t) in self.tools.iter().enumerate() {
            if !TOOL_NAME.is_match(t) {
                return Err(config_error(
                    format!("tools[{i}]"),
                    format!("{t:?} must match ^[a-zA-Z0-9_-]{{1,64}}$"),
                ));
            }
            if !seen.insert(t.as_str()) {
                return Err(config_error(
                    format!("tools[{i}]"),
                    format!("{t:?} is listed twice"),
                ));
            }
        }
        self.resolve(None).validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guardrails::TextRule;
    use crate::strict::{from_json_value, from_toml_str};

    const TOML: &str = r#"
name = "support"
model = "m"
tools = ["get_order"]
[budget]
max_turns = 5
[[guardrails.input]]
name = "no-cards"
deny = '\d{16}'
[compaction]
strategy = "drop_oldest"
max_tokens = 100
"#;

    #[test]
    fn toml_and_json_twins_resolve_and_hash_alike() {
        let def: AgentDefinition = from_toml_str(TOML).unwrap();
        def.validate().unwrap();
        let json = serde_json::json!({"name": "support", "model": "m", "tools": ["get_order"], "budget": {"max_turns": 5},
            "guardrails": {"input": [{"name": "no-cards", "deny": "\\d{16}"}]}, "compaction": {"strategy": "drop_oldest", "max_tokens": 100, "keep_recent": 2},
            "conversational": false});
        let twin: AgentDefinition = from_json_value(json).unwrap();
        assert_eq!(def.content_hash(), twin.content_hash());
        let r = AgentRef {
            name: "support".into(),
            version: 1,
            content_hash: def.content_hash(),
        };
        let config = def.resolve(Some(r.clone()));
        assert_eq!(config.tools, Some(vec!["get_order".to_owned()]));
        assert_eq!(config.agent, Some(r));
        let g = config.guardrails.compile().unwrap();
        assert_eq!(
            g.check_input("card 1234567812345678"),
            Err(("no-cards".into(), "matches no-cards".into()))
        );
        assert!(g.check_input("hello").is_ok());
        let mut other = def.clone();
        other.system = "x".into();
        assert_ne!(other.content_hash(), def.content_hash());
    }

    #[test]
    fn hooks_are_names_each_once_at_most_sixteen() {
        let def: AgentDefinition =
            from_toml_str(&format!("hooks = [\"audit\", \"pii\"]\n{TOML}")).unwrap();
        def.validate().unwrap();
        assert_eq!(def.resolve(None).hooks, ["audit", "pii"]);
        let mut bad = def.clone();
        bad.hooks = vec!["audit".into(), "https://evil.example/".into()];
        assert_eq!(bad.validate().unwrap_err().field, "hooks[1]");
        bad.hooks = vec!["audit".into(), "audit".into()];
        assert_eq!(bad.validate().unwrap_err().field, "hooks[1]");
        bad.hooks = (0..17).map(|i| format!("h{i}")).collect();
        assert_eq!(bad.validate().unwrap_err().field, "hooks");
        assert_ne!(
            def.content_hash(),
            AgentDefinition {
                hooks: Vec::new(),
                ..def.clone()
            }
            .content_hash()
        );
    }

    #[test]
    fn bad_definitions_name_the_field() {
        let e = from_toml_str::<AgentDefinition>(&format!("command = \"rm -rf /\"\n{TOML}"))
            .unwrap_err();
        assert_eq!(e.to_string(), "command: unknown field");
        let e = from_toml_str::<AgentDefinition>(
            &TOML.replace("max_tokens = 100", "max_tokens = 100\nthreshold = 3"),
        )
        .unwrap_err();
        assert_eq!(e.path, "compaction.threshold");
        let mut def: AgentDefinition = from_toml_str(TOML).unwrap();
        def.guardrails.output.push(TextRule {
            name: "bad".into(),
            deny: Some("(".into()),
            ..TextRule::default()
        });
        assert_eq!(
            def.validate().unwrap_err().field,
            "guardrails.output[0].deny"
        );
        def.guardrails.output.clear();
        def.output_schema =
            Some(serde_json::json!({"type": "object", "properties": {"a": {"type": "nope"}}}));
        assert_eq!(def.validate().unwrap_err().field, "output_schema");
        def.output_schema = None;
        def.name = "Bad Name".into();
        assert_eq!(def.validate().unwrap_err().field, "name");
    }
}
