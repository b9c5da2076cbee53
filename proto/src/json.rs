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
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                Value::Object(
                    entries
                        .into_iter()
                        .map(|(k, v)| (k.clone(), sorted(v)))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(value).to_string()
}

/// SHA-256 of [`canonical_json`] of `input`, lowercase hex (64 chars). An
/// approval binds to this hash.
pub fn args_hash(input: &Value) -> String {
    let digest = Sha256::digest(canonical_json(input).as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}
