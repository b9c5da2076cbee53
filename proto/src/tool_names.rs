//! Provider-safe tool names: the one rule that turns any MCP server tool
//! name into a name both provider APIs accept (`^[a-zA-Z0-9_-]{1,64}$`,
//! [`crate::config_error::TOOL_NAME_PATTERN`]), and the one rule by which a
//! name a config or the catalogue writes refers to a tool.
//!
//! **The mapping** ([`provider_tool_name`]) depends only on the original
//! name, so every worker and every resume offers a tool under the same
//! name:
//!
//! - a name that already matches the grammar is kept as it is;
//! - any other name: each character (Unicode scalar value) outside
//!   `[a-zA-Z0-9_-]` becomes `_` (nothing is transliterated), the result is
//!   cut to its first [`MAPPED_PREFIX_CHARS`] (55) characters, and `_` plus
//!   the first [`NAME_HASH_HEX`] (8) lowercase hex digits of the SHA-256 of
//!   the original name's UTF-8 bytes are appended. So `calendar.read`
//!   becomes `calendar_read_` + 8 hex digits, `drive/search` becomes
//!   `drive_search_` + 8 hex digits, and `a.b` and `a/b` (both `a_b_…`) get
//!   different suffixes. A mapped name is 9 to 64 characters long.
//!
//! The model sees and calls the mapped name ([`crate::ToolSpec::name`]);
//! the server always receives its original name
//! ([`crate::ToolSource::Mcp`]'s `tool`); `step.start` records both.
//!
//! **Collisions.** Two different originals cannot map to one name unless a
//! server offers a valid name that equals another tool's mapped form (or
//! two names share a 32-bit suffix): the worker checks every step's tool
//! list ([`crate::ToolSpec::check_distinct`]) and fails the run with [`ToolNameClash`]
//! naming both tools, never offering one of them under the other's name.
//!
//! **Naming a tool in a config** ([`same_tool`]): a name written in
//! `mcp[i].allow`, `tool_policy`, `policies[].tool`, or the operator's
//! `tools_allow`, `tools_deny` and `policy` refers to a tool when its mapped
//! form equals the tool's mapped form. Both forms of an MCP tool's name
//! therefore name it; names that already match the grammar (every worker,
//! external and HTTP tool) still match only byte for byte.

use std::borrow::Cow;

use sha2::{Digest, Sha256};

use crate::config_error::TOOL_NAME;

/// Name of the forced tool through which a run with an output schema answers.
pub const OUTPUT_TOOL: &str = "final_output";

/// Characters of the original name (after replacing the disallowed ones)
/// kept in front of the hash suffix of a mapped name.
pub const MAPPED_PREFIX_CHARS: usize = 55;

/// Hex digits of the SHA-256 of the original name in a mapped name's suffix.
pub const NAME_HASH_HEX: usize = 8;

/// Whether `name` matches the provider grammar `^[a-zA-Z0-9_-]{1,64}$`.
pub fn is_provider_tool_name(name: &str) -> bool {
    TOOL_NAME.is_match(name)
}

/// The name the model is offered for a tool whose own name is `name` (any
/// string): `name` itself when it matches the provider grammar, else the
/// mapped form described in the [module docs](self).
///
/// ```
/// use glia_proto::tool_names::provider_tool_name;
/// assert_eq!(provider_tool_name("read_file"), "read_file");
/// let mapped = provider_tool_name("calendar.read");
/// assert!(mapped.starts_with("calendar_read_") && mapped.len() == 22, "{mapped}");
/// assert_ne!(provider_tool_name("a.b"), provider_tool_name("a/b"));
/// ```
pub fn provider_tool_name(name: &str) -> Cow<'_, str> {
    if is_provider_tool_name(name) {
        return Cow::Borrowed(name);
    }
    let mut mapped: String = name
        .chars()
        .take(MAPPED_PREFIX_CHARS)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let digest = Sha256::digest(name.as_bytes());
    mapped.push('_');
    for byte in &digest[..NAME_HASH_HEX / 2] {
        mapped.push_str(&format!("{byte:02x}"));
    }
    Cow::Owned(mapped)
}

/// Whether two written names refer to the same tool: their
/// [`provider_tool_name`]s are equal (a name and its mapped form, or two
/// equal names).
///
/// ```
/// use glia_proto::tool_names::{provider_tool_name, same_tool};
/// assert!(same_tool("calendar.read", &provider_tool_name("calendar.read")));
/// assert!(!same_tool("issue_credit", "issue-credit"));
/// ```
pub fn same_tool(a: &str, b: &str) -> bool {
    a == b || provider_tool_name(a) == provider_tool_name(b)
}

/// Two tools of one step that would be offered to the model under one name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("two tools of the run would be offered as {name:?}: {first} and {second}")]
pub struct ToolNameClash {
    /// The name both would have.
    pub name: String,
    /// The first tool, described (`MCP server "cal" tool "calendar.read"`,
    /// `tool "lookup"`).
    pub first: String,
    /// The second tool, described alike.
    pub second: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_names_stay_as_they_are() {
        for name in ["a", "read_file", "get-env", &"x".repeat(64), "final_output"] {
            assert!(matches!(provider_tool_name(name), Cow::Borrowed(n) if n == name));
        }
    }

    #[test]
    fn other_names_are_mapped_into_the_grammar() {
        let long = "l".repeat(70);
        let names = [
            "calendar.read",
            "drive/search",
            "météo",
            "日本語",
            "",
            " ",
            "a b",
            long.as_str(),
            "tools/list:🙂",
        ];
        for name in names {
            let mapped = provider_tool_name(name);
            assert!(is_provider_tool_name(&mapped), "{name:?} → {mapped:?}");
            assert_ne!(mapped, name);
            assert!(mapped.len() <= 64, "{mapped}");
            // Deterministic: the same name, the same answer.
            assert_eq!(provider_tool_name(name), mapped);
        }
        assert_eq!(&provider_tool_name("calendar.read")[..14], "calendar_read_");
        assert_eq!(&provider_tool_name("météo")[..6], "m_t_o_");
        let mapped = provider_tool_name(&long);
        assert_eq!(mapped.len(), 64);
        assert!(mapped.starts_with(&"l".repeat(55)), "{mapped}");
    }

    #[test]
    fn the_rule_is_the_documented_one() {
        // `_` and the first 8 hex digits of SHA-256("calendar.read").
        let hex = format!("{:x}", Sha256::digest(b"calendar.read"));
        assert_eq!(
            provider_tool_name("calendar.read"),
            format!("calendar_read_{}", &hex[..8])
        );
    }

    #[test]
    fn names_that_look_alike_stay_apart() {
        let forms = ["a.b", "a_b", "a/b", "a:b", "a b"];
        let mapped: std::collections::HashSet<_> =
            forms.iter().map(|n| provider_tool_name(n)).collect();
        assert_eq!(mapped.len(), forms.len(), "{mapped:?}");
        // Cut names that share their first 55 characters differ by their suffix.
        let a = format!("{}.a", "p".repeat(60));
        let b = format!("{}.b", "p".repeat(60));
        assert_ne!(provider_tool_name(&a), provider_tool_name(&b));
    }

    #[test]
    fn either_form_names_the_tool() {
        let mapped = provider_tool_name("drive/search").into_owned();
        assert!(same_tool("drive/search", &mapped));
        assert!(same_tool(&mapped, "drive/search"));
        assert!(same_tool("read_file", "read_file"));
        assert!(!same_tool("drive/search", "drive_search"));
        assert!(!same_tool("a.b", "a/b"));
    }
}
