//! A configuration glia cannot run: the offending field, as a path from
//! the document's root, and why. Shared by run configs, agent definitions,
//! guardrails, compaction and the bounds of [`crate::limits`].

/// A run configuration glia cannot run: the offending field, as a path from
/// the config (`external_tools[1].input_schema`, `output_schema`,
/// `policies[0].args`), and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ConfigError {
    /// Path of the field from the config's root, e.g. `external_tools[1].input_schema`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

pub(crate) fn config_error(field: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Tool names both provider APIs accept, as a regex ([`TOOL_NAME`]).
pub const TOOL_NAME_PATTERN: &str = "^[a-zA-Z0-9_-]{1,64}$";

/// Tool names both provider APIs accept.
pub(crate) static TOOL_NAME: std::sync::LazyLock<regex::Regex> =
    std::sync::LazyLock::new(|| regex::Regex::new(TOOL_NAME_PATTERN).expect("valid regex"));

/// A JSON Schema `pattern` for a string that is not blank (the checks'
/// `trim().is_empty()`): it holds a character other than Unicode
/// White_Space (what Rust's `str::trim` removes), spelled out so every
/// regex dialect reads it the same way.
pub const NOT_BLANK: &str = "[^\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]";
