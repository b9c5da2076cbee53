//! Canonical JSON: the form arguments are hashed and matched in.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// `value` as JSON with object keys sorted at every level and no whitespace:
/// the form hashed by [`args_hash`] and matched by policy regexes.
///
/// ```
/// let v = serde_json::json!({"b": 1, "a": {"d": [2], "c": null}});
/// assert_eq!(glia_proto::canonical_json(&v), r#"{"a":{"c":null,"d":[2]},"b":1}"#);
/// ```
pub fn canonical_json(value: &Value) -> String {
    sort_keys(value).to_string()
}

/// `value` with object keys sorted at every level (serde_json keeps the
/// order keys were inserted or parsed in: the workspace builds it with
/// `preserve_order`, so a tool's `structuredContent` keeps the server's
/// order). For output that must not depend on insertion order: hashes,
/// generated schema files.
///
/// ```
/// let v = serde_json::json!({"b": 1, "a": 2});
/// assert_eq!(glia_proto::json::sort_keys(&v).to_string(), r#"{"a":2,"b":1}"#);
/// assert_eq!(v.to_string(), r#"{"b":1,"a":2}"#);
/// ```
pub fn sort_keys(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.clone(), sort_keys(v)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sort_keys).collect()),
        other => other.clone(),
    }
}

/// SHA-256 of [`canonical_json`] of `input`, lowercase hex (64 chars). An
/// approval binds to this hash.
pub fn args_hash(input: &Value) -> String {
    let digest = Sha256::digest(canonical_json(input).as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The JSON type name of `value`: `null`, `boolean`, `number`, `string`, `array`, `object`.
pub fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Rewrite every number with a zero fraction that fits an `i64` or `u64`
/// as an integer, everywhere in `value` (the same number, in JSON terms).
/// JSON Schema counts `5.0` as an `integer` and serde's integer fields do
/// not: the dispatcher rewrites request bodies so, so that what its
/// OpenAPI document allows is what it accepts; recorded tool arguments are
/// compared so ([`crate::recorded`]).
pub fn integral_numbers(value: &mut Value) {
    // 2^64 and -2^63, exactly representable as f64.
    const U64_END: f64 = 18_446_744_073_709_551_616.0;
    const I64_MIN: f64 = -9_223_372_036_854_775_808.0;
    match value {
        Value::Number(n) if n.is_f64() => {
            let Some(f) = n.as_f64() else { return };
            if f.fract() != 0.0 {
                return;
            }
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            if (0.0..U64_END).contains(&f) {
                *n = serde_json::Number::from(f as u64);
            } else if (I64_MIN..0.0).contains(&f) {
                *n = serde_json::Number::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_numbers),
        Value::Object(map) => map.values_mut().for_each(integral_numbers),
        _ => {}
    }
}
