//! Bounds on tenant input: how many guardrail rules, policies and tools a
//! run config (or an agent definition) may carry, how large its regexes and
//! tool schemas may be, in one place. The table is `docs/limits.md`.
//!
//! Every bound is checked by [`check_config`] (called first by
//! [`crate::RunConfig::validate`], so at admission, at `PUT /v1/agents`, at
//! `glia agents apply` and again at the worker) by COUNTING and MEASURING
//! what was given, before any regex or schema is compiled. Regexes are then
//! compiled with [`compile_regex`], which gives each regex of a set an equal
//! share of one budget, so a whole set compiles to at most
//! [`REGEX_SIZE_BUDGET`] bytes of program and [`REGEX_DFA_BUDGET`] bytes of
//! lazy-DFA cache, however it is split. A bound that is exceeded is an error
//! naming the field and the limit (`guardrails.input: 500 rules in the set,
//! more than the 64 allowed (max_guardrail_rules)`).

use regex::{Regex, RegexBuilder};
use serde_json::Value;

use crate::agent::Guardrails;
use crate::config::{ConfigError, RunConfig, config_error};

/// Rules in one guardrail set (`input`, `output` and `tool_results` together).
pub const MAX_GUARDRAIL_RULES: usize = 64;
/// Bytes of all regex patterns of one set together (guardrail `deny` and
/// `redact` patterns; policy `args` patterns form a set of their own).
pub const MAX_PATTERN_BYTES: usize = 32 * 1024;
/// Compiled program bytes of one set of regexes together (the `regex`
/// crate's `size_limit`, shared out equally: each regex of `n` may use
/// `REGEX_SIZE_BUDGET / n`, and at most [`MAX_REGEX_SIZE`]). For scale: a
/// Unicode e-mail pattern `[\w.+-]+@[\w-]+\.[\w.]+` takes ~150 KB, so 64 of
/// them fit; `x{19999}` takes ~640 KB, so 16 of them fit and 64 do not.
pub const REGEX_SIZE_BUDGET: usize = 16 << 20;
/// Compiled program bytes of any one regex.
pub const MAX_REGEX_SIZE: usize = 1 << 20;
/// Lazy-DFA cache bytes of one set of regexes together (the `regex` crate's
/// `dfa_size_limit`, shared out like [`REGEX_SIZE_BUDGET`]; at most 2 MiB each).
pub const REGEX_DFA_BUDGET: usize = 16 << 20;
/// Tool-call policies in one config.
pub const MAX_POLICIES: usize = 64;
/// Tools one config may name: worker tools, external tools, HTTP tools and
/// MCP allow-list entries together; also the most `tool_policy` entries.
pub const MAX_TOOLS: usize = 128;
/// Bytes of one tool's input schema (or the output schema) as compact JSON.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// Nesting depth of one schema (objects and arrays; `{}` is depth 1).
pub const MAX_SCHEMA_DEPTH: usize = 32;

fn over(field: &str, what: String, max: usize, limit: &str) -> ConfigError {
    config_error(
        field,
        format!("{what}, more than the {max} allowed ({limit})"),
    )
}

/// Check every bound of this module on `config`, counting and measuring
/// only (nothing is compiled). Errors name the field (`guardrails`,
/// `policies`, `external_tools[2].input_schema`) and the limit.
pub fn check_config(config: &RunConfig) -> Result<(), ConfigError> {
    check_guardrails(&config.guardrails)
        .map_err(|e| config_error(format!("guardrails.{}", e.field), e.reason))?;
    if config.policies.len() > MAX_POLICIES {
        return Err(over(
            "policies",
            format!("{} policies", config.policies.len()),
            MAX_POLICIES,
            "max_policies",
        ));
    }
    let policy_bytes: usize = config
        .policies
        .iter()
        .filter_map(|p| p.args.as_ref())
        .map(String::len)
        .sum();
    if policy_bytes > MAX_PATTERN_BYTES {
        return Err(over(
            "policies",
            format!("{policy_bytes} bytes of args patterns"),
            MAX_PATTERN_BYTES,
            "max_pattern_bytes",
        ));
    }
    let tools = config.tools.as_ref().map_or(0, Vec::len)
        + config.external_tools.len()
        + config.http_tools.len()
        + config.mcp.iter().map(|m| m.allow.len()).sum::<usize>();
    if tools > MAX_TOOLS {
        return Err(over(
            "tools",
            format!(
                "{tools} tools (tools, external_tools, http_tools and mcp allow lists together)"
            ),
            MAX_TOOLS,
            "max_tools",
        ));
    }
    if config.tool_policy.len() > MAX_TOOLS {
        return Err(over(
            "tool_policy",
            format!("{} entries", config.tool_policy.len()),
            MAX_TOOLS,
            "max_tools",
        ));
    }
    let schemas = config
        .external_tools
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("external_tools[{i}].input_schema"), &t.input_schema))
        .chain(
            config
                .http_tools
                .iter()
                .enumerate()
                .map(|(i, t)| (format!("http_tools[{i}].input_schema"), &t.input_schema)),
        )
        .chain(
            config
                .output_schema
                .iter()
                .map(|s| ("output_schema".to_owned(), s)),
        );
    for (field, schema) in schemas {
        check_schema(&field, schema)?;
    }
    Ok(())
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

/// Check one JSON Schema against [`MAX_SCHEMA_DEPTH`] and [`MAX_SCHEMA_BYTES`]
/// (depth first, without recursion; size by serialising into a counter).
pub fn check_schema(field: &str, schema: &Value) -> Result<(), ConfigError> {
    let depth = depth(schema);
    if depth > MAX_SCHEMA_DEPTH {
        return Err(over(
            field,
            format!("nested {depth} deep"),
            MAX_SCHEMA_DEPTH,
            "max_schema_depth",
        ));
    }
    let bytes = json_len(schema);
    if bytes > MAX_SCHEMA_BYTES {
        return Err(over(
            field,
            format!("{bytes} bytes as JSON"),
            MAX_SCHEMA_BYTES,
            "max_schema_bytes",
        ));
    }
    Ok(())
}

/// Nesting depth of `value`: 0 for a scalar, 1 for a flat object or array.
fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((v, d)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(a) => Box::new(a.iter()),
            Value::Object(o) => Box::new(o.values()),
            _ => continue,
        };
        deepest = deepest.max(d + 1);
        stack.extend(children.map(|c| (c, d + 1)));
    }
    deepest
}

/// Length of `value` as compact JSON, in bytes, without building the text.
fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).expect("a JSON value serialises");
    count.0
}

/// Compile `pattern` as one of `set_size` regexes sharing the set's budget
/// ([`REGEX_SIZE_BUDGET`], [`REGEX_DFA_BUDGET`]). A pattern whose program
/// does not fit its share fails like an invalid one ("exceeds size limit").
pub fn compile_regex(pattern: &str, set_size: usize) -> Result<Regex, regex::Error> {
    let n = set_size.max(1);
    RegexBuilder::new(pattern)
        .size_limit((REGEX_SIZE_BUDGET / n).min(MAX_REGEX_SIZE))
        .dfa_size_limit((REGEX_DFA_BUDGET / n).min(2 << 20))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::TextRule;

    fn rule(i: usize, pattern: &str) -> TextRule {
        TextRule {
            name: format!("r{i}"),
            deny: Some(pattern.into()),
            ..TextRule::default()
        }
    }

    #[test]
    fn counts_are_checked_before_anything_compiles() {
        let mut config = RunConfig::default();
        config.guardrails.input = (0..500).map(|i| rule(i, "x{19999}")).collect();
        let e = config.validate().unwrap_err();
        assert_eq!(e.field, "guardrails.input");
        assert!(
            e.reason.contains("500 rules") && e.reason.contains("max_guardrail_rules"),
            "{e}"
        );
        // 64 rules pass the count, but each one's share of the budget is too small for x{19999}.
        config.guardrails.input.truncate(64);
        let e = config.validate().unwrap_err();
        assert_eq!(e.field, "guardrails.input[0].deny");
        assert!(e.reason.contains("size limit"), "{e}");
        config.guardrails.input = vec![
            rule(0, r"\b\d{4}[ -]?\d{4}[ -]?\d{4}[ -]?\d{4}\b"),
            TextRule {
                name: "email".into(),
                redact: Some(r"[\w.+-]+@[\w-]+\.[\w.]+".into()),
                ..TextRule::default()
            },
        ];
        config.validate().unwrap();
        config.guardrails.input = (0..64)
            .map(|i| rule(i, r"[\w.+-]+@[\w-]+\.[\w.]+"))
            .collect();
        config.validate().unwrap();
    }

    #[test]
    fn schemas_are_bounded_in_depth_and_size() {
        let mut deep = serde_json::json!({"type": "object"});
        for _ in 0..40 {
            deep = serde_json::json!({"type": "object", "properties": {"a": deep}});
        }
        let e = check_schema("output_schema", &deep).unwrap_err();
        assert!(e.reason.contains("max_schema_depth"), "{e}");
        let big =
            serde_json::json!({"type": "object", "description": "x".repeat(MAX_SCHEMA_BYTES)});
        let e = check_schema("output_schema", &big).unwrap_err();
        assert!(e.reason.contains("max_schema_bytes"), "{e}");
        let mut config = RunConfig {
            tools: Some((0..129).map(|i| format!("t{i}")).collect()),
            ..RunConfig::default()
        };
        assert_eq!(config.validate().unwrap_err().field, "tools");
        config.tools = None;
        config.output_schema = Some(deep);
        assert_eq!(config.validate().unwrap_err().field, "output_schema");
    }
}
