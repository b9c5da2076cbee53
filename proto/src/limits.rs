//! Bounds on tenant input: how many guardrail rules, policies and tools a
//! run config (or an agent definition) may carry, how large its regexes and
//! tool schemas may be, in one place. The table is `docs/limits.md`.
//!
//! Every bound is checked by [`crate::RunConfig::validate`] first (so at admission, at `PUT /v1/agents`, at
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

use crate::config_error::{ConfigError, config_error};

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
/// Catalogue hooks one config may name (`hooks`).
pub const MAX_HOOKS: usize = 16;
/// Tools one config may name: worker tools, external tools, HTTP tools and
/// MCP allow-list entries together; also the most `tool_policy` entries.
pub const MAX_TOOLS: usize = 128;
/// The largest result budget a config may set (`max_result_bytes`,
/// `tool_policy.NAME.max_result_bytes`), in bytes of result text: 1 MiB
/// (about 250,000 tokens, more than a model's whole context), so a run's
/// messages, which every later turn re-sends and every checkpoint holds,
/// stay bounded.
pub const MAX_RESULT_BYTES: u64 = 1 << 20;

/// Bytes of one MCP tool name a config or the operator's catalogue writes
/// (`mcp[i].allow[j]`, a `tool_policy` key, `policies[i].tool`): a
/// server's own name may be any text, so it is bounded here rather than by
/// the provider grammar (`docs/mcp.md`, names).
pub const MAX_TOOL_NAME_BYTES: usize = 256;
/// Bytes of one tool's input schema (or the output schema) as compact JSON.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// Nesting depth of one schema (objects and arrays; `{}` is depth 1).
pub const MAX_SCHEMA_DEPTH: usize = 32;

pub(crate) fn over(field: &str, what: String, max: usize, limit: &str) -> ConfigError {
    config_error(
        field,
        format!("{what}, more than the {max} allowed ({limit})"),
    )
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

/// Compile `schema` as the JSON Schema of a tool's arguments (or of a run's
/// final output, which the model gives as the arguments of a forced tool).
///
/// Tool arguments are a JSON object in both provider APIs (Anthropic
/// `tools[].input_schema`, OpenAI `tools[].function.parameters`), so the
/// schema must be an object that passes its meta-schema (the draft its
/// `$schema` names, default 2020-12), compiles, and has `"type": "object"`. References are resolved within the schema only: a `$ref`
/// to another document (`https://…`, `file:…`) is an error, never fetched
/// or read. Errors: the reason, as text.
pub fn compile_tool_schema(schema: &Value) -> Result<jsonschema::Validator, String> {
    let Some(object) = schema.as_object() else {
        return Err(format!(
            "must be a JSON Schema object, not {}",
            crate::json::json_type(schema)
        ));
    };
    let validator =
        jsonschema::validator_for(schema).map_err(|e| format!("not a valid JSON Schema: {e}"))?;
    if object.get("type") != Some(&Value::String("object".into())) {
        return Err(
            "must describe a JSON object: tool arguments are one (set \"type\": \"object\")".into(),
        );
    }
    Ok(validator)
}
