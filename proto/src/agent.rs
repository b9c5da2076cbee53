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

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::budget::BudgetLimits;
use crate::config::{
    ConfigError, PlannerKind, Policy, RunConfig, TOOL_NAME, ToolSpec, config_error,
};
use crate::content::{ResultBlock, ToolContent};
use crate::tool_sources::{HttpTool, McpToolSource, ToolPolicy};

/// Agent names: `^[a-z0-9][a-z0-9_-]{0,63}$`.
static AGENT_NAME: LazyLock<Regex> =
    LazyLock::new(|| Regex::new("^[a-z0-9][a-z0-9_-]{0,63}$").expect("valid regex"));

/// Largest regex program a guardrail or policy may compile to, in bytes
/// (a set of regexes shares a budget too: [`crate::limits`]).
pub const REGEX_SIZE_LIMIT: usize = crate::limits::MAX_REGEX_SIZE;

/// One agent, as a tenant writes it. Resolves to a [`RunConfig`] with
/// [`AgentDefinition::resolve`]; fields not given take the run defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentDefinition {
    /// Registry name, `^[a-z0-9][a-z0-9_-]{0,63}$`.
    pub name: String,
    /// What the agent is for, for people.
    #[serde(default)]
    pub description: String,
    /// A provider named in the operator's catalogue (e.g. `anthropic`);
    /// `None` = the worker's provider. Recorded with the definition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Provider model name.
    pub model: String,
    /// System prompt.
    #[serde(default)]
    pub system: String,
    /// Names of the worker's tools the agent may call; exactly these are offered.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Tools the caller executes (the run parks at `awaiting_tool`).
    #[serde(default)]
    pub external_tools: Vec<ToolSpec>,
    /// Tools of the operator's MCP servers, by catalogue server name and an
    /// explicit allow list (as [`RunConfig::mcp`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp: Vec<McpToolSource>,
    /// Tools the worker runs as JSON POSTs to catalogue-allowed origins (as
    /// [`RunConfig::http_tools`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http_tools: Vec<HttpTool>,
    /// Per-tool approval, idempotency and timeout, by tool name (as
    /// [`RunConfig::tool_policy`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tool_policy: BTreeMap<String, ToolPolicy>,
    /// Tool-call policies, first match wins.
    #[serde(default)]
    pub policies: Vec<Policy>,
    /// Declarative guardrails.
    #[serde(default)]
    pub guardrails: Guardrails,
    /// Declarative compaction; `None` never compacts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<CompactionSpec>,
    /// Per-run budget.
    #[serde(default)]
    pub budget: BudgetLimits,
    /// Which planner drafts the plan.
    #[serde(default)]
    pub planner: PlannerKind,
    /// JSON Schema of the final answer (a JSON object), given through a forced tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// Parks for the next user message after each answer.
    #[serde(default)]
    pub conversational: bool,
    /// Output token cap per model call; `None` = the run default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// How long an approval may wait, in ms; `None` = forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_timeout_ms: Option<u64>,
}

/// The definition a run was resolved from, recorded in its config
/// (`session.start`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentRef {
    /// Agent name.
    pub name: String,
    /// Registry version, from 1.
    pub version: u32,
    /// [`AgentDefinition::content_hash`]: `sha256:` and 64 hex digits.
    pub content_hash: String,
}

impl AgentDefinition {
    /// `sha256:` and the hex SHA-256 of the definition's canonical JSON (keys
    /// sorted, defaults written out): the same content, however written (TOML
    /// or JSON, defaults spelled or omitted), has the same hash.
    pub fn content_hash(&self) -> String {
        let value = serde_json::to_value(self).expect("a definition serialises");
        format!(
            "sha256:{:x}",
            Sha256::digest(crate::canonical_json(&value).as_bytes())
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
            tool_policy: self.tool_policy.clone(),
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

/// Declarative guardrails. Input rules and `max_input_chars` see the goal
/// and each user message; output rules and `max_output_chars` see the
/// model's answer text. A rule either denies or redacts:
///
/// - `deny`: the goal or message is refused, the final answer rejected (and
///   re-asked like any rejected answer); recorded as `guardrail.tripped`
///   with the rule's name.
/// - `redact`: every match is replaced (`replacement`, default
///   `[redacted:NAME]`) before the text is stored, so the raw text never
///   enters the log: a goal before `session.start`, a user message before it
///   is posted and before `input.received`, the text blocks of each model
///   answer before `model.response` (a run with output redactions streams no
///   text deltas). The event carrying the text lists the rules that matched
///   and how often (`redactions`). Deny rules see the redacted text.
///   Output rules see the text blocks of answers only: not thinking blocks
///   (their signature binds their text), a `summarize` compaction's
///   summary, a model planner's steps or structured output.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Guardrails {
    /// Rules over the goal and user messages.
    pub input: Vec<TextRule>,
    /// Rules over the model's answers.
    pub output: Vec<TextRule>,
    /// Rules over tool results (text blocks), applied before a result is
    /// stored, sent to a model or shown: `redact` rewrites the result
    /// (`tool.result` lists the rules in `redactions`), `deny` withholds it
    /// (the model, the log and the inbox see a marked note naming the rule,
    /// and `guardrail.tripped` with stage `tool_result` records the rule,
    /// the call and the result's length, never its text).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_results: Vec<TextRule>,
    /// Longest goal or user message, in characters (Unicode scalar values).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_input_chars: Option<usize>,
    /// Longest answer, in characters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_output_chars: Option<usize>,
}

/// A rule over text: exactly one of `deny` and `redact`, a regex searched
/// anywhere in the text (Rust `regex` syntax, no look-around or
/// back-references).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextRule {
    /// Recorded in `guardrail.tripped` and `redactions`, e.g. `no-card-numbers`.
    pub name: String,
    /// A match rejects the text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny: Option<String>,
    /// Each match is replaced by `replacement`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redact: Option<String>,
    /// What a `redact` match becomes (literal text); default `[redacted:NAME]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<String>,
    /// Shown to the model (output) or the caller (input) when `deny`
    /// matches; default: "matches {name}".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A redaction rule that matched: recorded in the event that carries the
/// redacted text (`session.start`, `input.received`, `model.response`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Redaction {
    /// The rule's name.
    pub guardrail: String,
    /// Matches replaced.
    pub count: usize,
}

impl Redaction {
    /// Count this in `list`: added to the entry of the same rule, or appended.
    pub fn add_to(self, list: &mut Vec<Redaction>) {
        match list.iter_mut().find(|r| r.guardrail == self.guardrail) {
            Some(r) => r.count += self.count,
            None => list.push(self),
        }
    }
}

/// [`Guardrails`] compiled: what the dispatcher and the worker check.
#[derive(Debug, Clone, Default)]
pub struct CompiledGuardrails {
    input: Vec<(TextRule, Regex)>,
    output: Vec<(TextRule, Regex)>,
    tool_results: Vec<(TextRule, Regex)>,
    redact_input: Vec<(String, String, Regex)>,
    redact_output: Vec<(String, String, Regex)>,
    redact_tool_results: Vec<(String, String, Regex)>,
    max_input_chars: Option<usize>,
    max_output_chars: Option<usize>,
}

impl Guardrails {
    /// True when there is nothing to check.
    pub fn is_empty(&self) -> bool {
        self == &Guardrails::default()
    }

    /// Whether an input rule redacts (so goals and messages are rewritten).
    pub fn redacts_input(&self) -> bool {
        self.input.iter().any(|r| r.redact.is_some())
    }

    /// Whether an output rule redacts (so answers are rewritten, and no text
    /// deltas are streamed).
    pub fn redacts_output(&self) -> bool {
        self.output.iter().any(|r| r.redact.is_some())
    }

    /// Whether any rule looks at tool results.
    pub fn screens_tool_results(&self) -> bool {
        !self.tool_results.is_empty()
    }

    /// Compile every regex, after checking the set's bounds
    /// ([`crate::limits::check_guardrails`]: rule count and pattern bytes,
    /// before anything compiles); each regex gets an equal share of the set's
    /// compiled-size budget ([`crate::limits::compile_regex`]). Errors name
    /// the field from the guardrails (`input[1].deny`, `output[0].name`,
    /// `input[2]` for a rule with both or neither of `deny` and `redact`).
    pub fn compile(&self) -> Result<CompiledGuardrails, ConfigError> {
        type Rules = (Vec<(TextRule, Regex)>, Vec<(String, String, Regex)>);
        crate::limits::check_guardrails(self)?;
        let set_size = self.input.len() + self.output.len() + self.tool_results.len();
        let rules = |list: &[TextRule], side: &str| -> Result<Rules, ConfigError> {
            let (mut deny, mut redact) = (Vec::new(), Vec::new());
            for (i, r) in list.iter().enumerate() {
                if r.name.trim().is_empty() {
                    return Err(config_error(format!("{side}[{i}].name"), "is blank"));
                }
                let compile = |pattern: &str, key: &str| {
                    crate::limits::compile_regex(pattern, set_size).map_err(|e| {
                        config_error(
                            format!("{side}[{i}].{key}"),
                            format!("not a valid regex: {e}"),
                        )
                    })
                };
                match (&r.deny, &r.redact) {
                    (Some(pattern), None) => {
                        if r.replacement.is_some() {
                            return Err(config_error(
                                format!("{side}[{i}].replacement"),
                                "is for redact rules",
                            ));
                        }
                        deny.push((r.clone(), compile(pattern, "deny")?));
                    }
                    (None, Some(pattern)) => {
                        if r.reason.is_some() {
                            return Err(config_error(
                                format!("{side}[{i}].reason"),
                                "is for deny rules (a redaction lets the text through)",
                            ));
                        }
                        let re = compile(pattern, "redact")?;
                        if re.is_match("") {
                            return Err(config_error(
                                format!("{side}[{i}].redact"),
                                "matches the empty string",
                            ));
                        }
                        // A blank replacement could leave a goal or message blank.
                        if r.replacement.as_ref().is_some_and(|t| t.trim().is_empty()) {
                            return Err(config_error(
                                format!("{side}[{i}].replacement"),
                                "is blank (a goal or message could be left blank)",
                            ));
                        }
                        let replacement = r
                            .replacement
                            .clone()
                            .unwrap_or_else(|| format!("[redacted:{}]", r.name));
                        redact.push((r.name.clone(), replacement, re));
                    }
                    _ => {
                        return Err(config_error(
                            format!("{side}[{i}]"),
                            "give exactly one of deny and redact",
                        ));
                    }
                }
            }
            Ok((deny, redact))
        };
        for (field, max) in [
            ("max_input_chars", self.max_input_chars),
            ("max_output_chars", self.max_output_chars),
        ] {
            if max == Some(0) {
                return Err(config_error(field, "must be at least 1"));
            }
        }
        let (input, redact_input) = rules(&self.input, "input")?;
        let (output, redact_output) = rules(&self.output, "output")?;
        let (tool_results, redact_tool_results) = rules(&self.tool_results, "tool_results")?;
        Ok(CompiledGuardrails {
            input,
            output,
            tool_results,
            redact_input,
            redact_output,
            redact_tool_results,
            max_input_chars: self.max_input_chars,
            max_output_chars: self.max_output_chars,
        })
    }
}

impl CompiledGuardrails {
    fn check(
        rules: &[(TextRule, Regex)],
        max: Option<usize>,
        limit_name: &str,
        text: &str,
    ) -> Result<(), (String, String)> {
        if let Some(max) = max {
            let chars = text.chars().count();
            if chars > max {
                return Err((
                    limit_name.to_owned(),
                    format!("{chars} characters, more than the {max} allowed"),
                ));
            }
        }
        match rules.iter().find(|(_, re)| re.is_match(text)) {
            Some((rule, _)) => Err((
                rule.name.clone(),
                rule.reason
                    .clone()
                    .unwrap_or_else(|| format!("matches {}", rule.name)),
            )),
            None => Ok(()),
        }
    }

    fn redact(
        rules: &[(String, String, Regex)],
        text: &str,
        redactions: &mut Vec<Redaction>,
    ) -> String {
        let mut text = text.to_owned();
        for (name, replacement, re) in rules {
            let count = re.find_iter(&text).count();
            if count > 0 {
                text = re
                    .replace_all(&text, regex::NoExpand(replacement))
                    .into_owned();
                Redaction {
                    guardrail: name.clone(),
                    count,
                }
                .add_to(redactions);
            }
        }
        text
    }

    /// Check a goal or user message: `Err((guardrail name, reason))` on the
    /// first trip (the length limit is named `max_input_chars`).
    pub fn check_input(&self, text: &str) -> Result<(), (String, String)> {
        Self::check(&self.input, self.max_input_chars, "max_input_chars", text)
    }

    /// Check an answer, like [`CompiledGuardrails::check_input`].
    pub fn check_output(&self, text: &str) -> Result<(), (String, String)> {
        Self::check(
            &self.output,
            self.max_output_chars,
            "max_output_chars",
            text,
        )
    }

    /// A goal or user message with the input redact rules applied, in rule
    /// order, and what matched (empty when nothing did). Applying it again
    /// changes nothing unless a replacement matches a rule.
    pub fn redact_input(&self, text: &str) -> (String, Vec<Redaction>) {
        let mut redactions = Vec::new();
        (
            Self::redact(&self.redact_input, text, &mut redactions),
            redactions,
        )
    }

    /// Model text with the output redact rules applied, adding what matched
    /// to `redactions`.
    pub fn redact_output(&self, text: &str, redactions: &mut Vec<Redaction>) -> String {
        Self::redact(&self.redact_output, text, redactions)
    }

    /// Screen a tool's result with the `tool_results` rules: its text (each
    /// text block; images pass unchanged) with the redact rules applied and
    /// what matched, or, when a deny rule matches the redacted text,
    /// [`Withheld`]: the rule and the result's length, never its text.
    pub fn screen_tool_result(
        &self,
        content: &ToolContent,
    ) -> Result<(ToolContent, Vec<Redaction>), Withheld> {
        let mut redactions = Vec::new();
        let mut screen = |text: &str| -> Result<String, Withheld> {
            let text = Self::redact(&self.redact_tool_results, text, &mut redactions);
            match self.tool_results.iter().find(|(_, re)| re.is_match(&text)) {
                Some((rule, _)) => Err(Withheld {
                    guardrail: rule.name.clone(),
                    chars: content.to_text().chars().count(),
                }),
                None => Ok(text),
            }
        };
        let screened = match content {
            ToolContent::Text(text) => ToolContent::Text(screen(text)?),
            ToolContent::Blocks(blocks) => ToolContent::Blocks(
                blocks
                    .iter()
                    .map(|b| match b {
                        ResultBlock::Text { text } => {
                            screen(text).map(|text| ResultBlock::Text { text })
                        }
                        other => Ok(other.clone()),
                    })
                    .collect::<Result<_, _>>()?,
            ),
        };
        Ok((screened, redactions))
    }
}

/// A tool result a `tool_results` deny rule withheld: what may be recorded
/// about it (the rule and the length in characters of the text withheld).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Withheld {
    /// The deny rule's name.
    pub guardrail: String,
    /// Characters (Unicode scalar values) of the result as the tool gave it.
    pub chars: usize,
}

impl Withheld {
    /// The marked note that stands for the result in the log, the model's
    /// view and the inbox.
    pub fn note(&self) -> String {
        crate::marker::Insert::Synthetic.wrap(&format!(
            "This tool result was withheld: it matched the guardrail {:?} (tool_results). {} characters were not stored or shown.",
            self.guardrail, self.chars
        ))
    }
}

/// Declarative compaction: before a model call whose context is estimated
/// above `max_tokens` (serialised JSON bytes / 4), remove the oldest
/// (assistant, user) turns, keeping the goal and the `keep_recent` latest
/// turns; `summarize` replaces them with a summary the run's model writes.
/// Recorded as `context.compacted`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactionSpec {
    /// `drop_oldest` or `summarize`.
    pub strategy: CompactionStrategy,
    /// Token threshold (estimated).
    pub max_tokens: u64,
    /// Turns always kept; default 2.
    #[serde(default = "default_keep_recent")]
    pub keep_recent: usize,
}

fn default_keep_recent() -> usize {
    2
}

/// How [`CompactionSpec`] shrinks a context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompactionStrategy {
    /// Remove the oldest turns, leaving a marked note.
    DropOldest,
    /// Summarise the oldest turns through the model.
    Summarize,
}

impl CompactionSpec {
    /// `max_tokens` at least 1. Errors name the field (`max_tokens`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_tokens == 0 {
            return Err(config_error("max_tokens", "must be at least 1"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
