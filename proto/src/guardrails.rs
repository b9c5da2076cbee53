//! Declarative guardrails: rules over the goal and user messages, the
//! model's answers and tool results, compiled once and checked by the
//! dispatcher and the worker.

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::config_error::{ConfigError, config_error};
use crate::content::{ResultBlock, ToolContent};
use crate::limits::{MAX_GUARDRAIL_RULES, MAX_PATTERN_BYTES, over};

/// Largest regex program a guardrail or policy may compile to, in bytes
/// (a set of regexes shares a budget too: [`crate::limits`]).
pub const REGEX_SIZE_LIMIT: usize = crate::limits::MAX_REGEX_SIZE;

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
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct Guardrails {
    /// Rules over the goal and user messages.
    #[cfg_attr(feature = "schemars", schemars(length(max = crate::limits::MAX_GUARDRAIL_RULES)))]
    pub input: Vec<TextRule>,
    /// Rules over the model's answers.
    #[cfg_attr(feature = "schemars", schemars(length(max = crate::limits::MAX_GUARDRAIL_RULES)))]
    pub output: Vec<TextRule>,
    /// Rules over tool results (text blocks), applied before a result is
    /// stored, sent to a model or shown: `redact` rewrites the result
    /// (`tool.result` lists the rules in `redactions`), `deny` withholds it
    /// (the model, the log and the inbox see a marked note naming the rule,
    /// and `guardrail.tripped` with stage `tool_result` records the rule,
    /// the call and the result's length, never its text).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "schemars", schemars(length(max = crate::limits::MAX_GUARDRAIL_RULES)))]
    pub tool_results: Vec<TextRule>,
    /// Longest goal or user message, in characters (Unicode scalar values).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
    pub max_input_chars: Option<usize>,
    /// Longest answer, in characters.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
    pub max_output_chars: Option<usize>,
}

/// A rule over text: exactly one of `deny` and `redact`, a regex searched
/// anywhere in the text (Rust `regex` syntax, no look-around or
/// back-references).
///
/// Its schema says the same: one of `deny` and `redact` (a string, not
/// null); `reason` goes with `deny`, `replacement` with `redact`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "schemars",
    schemars(extend("oneOf" = [
        {"required": ["deny"], "properties": {"redact": false, "replacement": false}},
        {"required": ["redact"], "properties": {"deny": false, "reason": false}}
    ]))
)]
#[serde(deny_unknown_fields)]
pub struct TextRule {
    /// Recorded in `guardrail.tripped` and `redactions`, e.g. `no-card-numbers`.
    #[cfg_attr(
        feature = "schemars",
        schemars(pattern(crate::config_error::NOT_BLANK))
    )]
    pub name: String,
    /// A match rejects the text (Rust `regex` syntax; one that does not
    /// compile is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(extend("type" = "string", "format" = "regex")))]
    pub deny: Option<String>,
    /// Each match is replaced by `replacement` (Rust `regex` syntax; it must
    /// not match the empty string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(extend("type" = "string", "format" = "regex")))]
    pub redact: Option<String>,
    /// What a `redact` match becomes (literal text, not blank); default `[redacted:NAME]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schemars",
        schemars(pattern(crate::config_error::NOT_BLANK))
    )]
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
    /// ([`check_guardrails`]: rule count and pattern bytes,
    /// before anything compiles); each regex gets an equal share of the set's
    /// compiled-size budget ([`crate::limits::compile_regex`]). Errors name
    /// the field from the guardrails (`input[1].deny`, `output[0].name`,
    /// `input[2]` for a rule with both or neither of `deny` and `redact`).
    pub fn compile(&self) -> Result<CompiledGuardrails, ConfigError> {
        type Rules = (Vec<(TextRule, Regex)>, Vec<(String, String, Regex)>);
        check_guardrails(self)?;
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

/// Check the bounds of one guardrail set, counting only: at most
/// [`MAX_GUARDRAIL_RULES`] rules and [`MAX_PATTERN_BYTES`] bytes of patterns
/// over `input`, `output` and `tool_results` together. Errors name the
/// field from the set where the bound was crossed (`input` for a list that
/// takes the count over, `output[3].redact` for the pattern that takes the
/// bytes over).
pub fn check_guardrails(g: &Guardrails) -> Result<(), ConfigError> {
    let mut rules = 0;
    for (side, list) in [
        ("input", &g.input),
        ("output", &g.output),
        ("tool_results", &g.tool_results),
    ] {
        rules += list.len();
        if rules > MAX_GUARDRAIL_RULES {
            return Err(over(
                side,
                format!("{rules} rules in the set"),
                MAX_GUARDRAIL_RULES,
                "max_guardrail_rules",
            ));
        }
    }
    let mut bytes = 0;
    for (side, list) in [
        ("input", &g.input),
        ("output", &g.output),
        ("tool_results", &g.tool_results),
    ] {
        for (i, r) in list.iter().enumerate() {
            let (key, len) = match (&r.deny, &r.redact) {
                (Some(p), _) => ("deny", p.len()),
                (None, Some(p)) => ("redact", p.len()),
                (None, None) => continue,
            };
            bytes += len;
            if bytes > MAX_PATTERN_BYTES {
                return Err(over(
                    &format!("{side}[{i}].{key}"),
                    format!("{bytes} bytes of patterns in the set"),
                    MAX_PATTERN_BYTES,
                    "max_pattern_bytes",
                ));
            }
        }
    }
    Ok(())
}
