//! Strict parsing of configuration: every configuration type (a
//! [`crate::RunConfig`] and everything under it, an
//! [`crate::AgentDefinition`]) refuses unknown fields (`deny_unknown_fields`)
//! and wrong types, and these functions say where: the path from the
//! document's root (`tools[2].timeout_ms`, `guardrails.input[0].deny`), by
//! serde_path_to_error.
//!
//! ```
//! let e = glia_proto::strict::from_json_str::<glia_proto::RunConfig>(r#"{"compactor": {}}"#).unwrap_err();
//! assert_eq!(e.to_string(), "compactor: unknown field");
//! let e = glia_proto::strict::from_json_str::<glia_proto::RunConfig>(r#"{"budget": {"max_turns": "9"}}"#).unwrap_err();
//! assert_eq!(e.path, "budget.max_turns");
//! ```

use serde::de::DeserializeOwned;
use serde_json::Value;

/// A document that does not parse as the configuration type: where (`path`,
/// from the root; empty for the root itself or a syntax error) and why.
/// Displays as `path: reason` (`compactor: unknown field`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", if path.is_empty() { reason.clone() } else { format!("{path}: {reason}") })]
pub struct ParseError {
    /// Path of the offending field, e.g. `external_tools[1].timeout_ms`.
    pub path: String,
    /// What is wrong with it, e.g. `unknown field`, `invalid type: string "9", expected u64`.
    pub reason: String,
}

impl ParseError {
    /// The same error with `root` in front of its path (`config` →
    /// `config.budget.max_turns`).
    pub fn under(self, root: &str) -> ParseError {
        let path = match (root.is_empty(), self.path.is_empty()) {
            (true, _) => self.path,
            (false, true) => root.to_owned(),
            (false, false) if self.path.starts_with('[') => format!("{root}{}", self.path),
            (false, false) => format!("{root}.{}", self.path),
        };
        ParseError {
            path,
            reason: self.reason,
        }
    }
}

fn convert<E: std::fmt::Display>(e: serde_path_to_error::Error<E>) -> ParseError {
    let mut path = e.path().to_string();
    if path == "." {
        path.clear();
    }
    let message = e.inner().to_string();
    // serde: "unknown field `compactor`, expected one of `model`, …". The
    // path ends at the unknown key, except inside an internally tagged enum
    // (it stops at the map there).
    if let Some(rest) = message.strip_prefix("unknown field `")
        && let Some((field, _)) = rest.split_once('`')
    {
        if !(path == field || path.ends_with(&format!(".{field}"))) {
            path = if path.is_empty() {
                field.to_owned()
            } else {
                format!("{path}.{field}")
            };
        }
        return ParseError {
            path,
            reason: "unknown field".into(),
        };
    }
    let reason = match message.rfind(" at line ") {
        Some(i) if message[i..].contains(" column ") => message[..i].to_owned(),
        _ => message,
    };
    ParseError { path, reason }
}

/// Parse JSON text as `T`, strictly. Errors: a syntax error (no path), or the
/// first unknown field or wrong type with its path.
pub fn from_json_str<T: DeserializeOwned>(text: &str) -> Result<T, ParseError> {
    let value: Value = serde_json::from_str(text).map_err(|e| ParseError {
        path: String::new(),
        reason: format!("not valid JSON: {e}"),
    })?;
    from_json_value(value)
}

/// Convert a JSON value to `T`, strictly (errors as [`from_json_str`]).
pub fn from_json_value<T: DeserializeOwned>(value: Value) -> Result<T, ParseError> {
    serde_path_to_error::deserialize(value).map_err(convert)
}

/// Parse TOML text as `T`, strictly: the document is read as TOML (syntax
/// errors carry its line and column), then converted like JSON, so a TOML
/// file and its JSON twin give the same value and the same errors.
pub fn from_toml_str<T: DeserializeOwned>(text: &str) -> Result<T, ParseError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| ParseError {
        path: String::new(),
        reason: format!("not valid TOML: {}", e.message()),
    })?;
    let value = serde_json::to_value(table).map_err(|e| ParseError {
        path: String::new(),
        reason: e.to_string(),
    })?;
    from_json_value(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RunConfig;

    #[test]
    fn unknown_fields_and_wrong_types_name_their_path() {
        let e = from_json_str::<RunConfig>(r#"{"external_tools": [{"name": "a", "description": "", "input_schema": {}, "timeout": 5}]}"#).unwrap_err();
        assert_eq!(e.to_string(), "external_tools[0].timeout: unknown field");
        let e = from_json_str::<RunConfig>(r#"{"external_tools": [{"name": "a", "description": "", "input_schema": {}, "timeout_ms": "5"}]}"#).unwrap_err();
        assert_eq!(e.path, "external_tools[0].timeout_ms");
        assert!(e.reason.contains("invalid type"), "{e}");
        let e = from_json_str::<RunConfig>(
            r#"{"policies": [{"tool": "x", "action": {"kind": "deny", "reason": "r", "why": 1}}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.path, "policies[0].action.why", "{e}");
        let e = from_toml_str::<RunConfig>("model = \"m\"\n[budget]\nmax_turn = 3\n").unwrap_err();
        assert_eq!(e.to_string(), "budget.max_turn: unknown field");
        assert_eq!(e.clone().under("config").path, "config.budget.max_turn");
        let ok: RunConfig = from_toml_str("model = \"m\"\n[budget]\nmax_turns = 3\n").unwrap();
        assert_eq!(ok.budget.max_turns, Some(3));
        assert!(
            from_json_str::<RunConfig>("{")
                .unwrap_err()
                .reason
                .starts_with("not valid JSON")
        );
    }
}
