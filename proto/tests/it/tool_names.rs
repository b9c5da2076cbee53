//! Provider-safe tool names at admission (`RunConfig::validate`): an MCP
//! tool may be named by its own name (`calendar.read`) or its provider-safe
//! form in `mcp[i].allow`, `tool_policy` and `policies`; every other
//! tool's name still matches `^[a-zA-Z0-9_-]{1,64}$`.

use glia_proto::tool_names::provider_tool_name;
use glia_proto::{HttpTool, McpToolSource, Policy, PolicyAction, RunConfig, ToolPolicy, ToolSpec};
use serde_json::json;

fn mcp_config(allow: &[&str]) -> RunConfig {
    RunConfig {
        tools: Some(Vec::new()),
        mcp: vec![McpToolSource {
            server: "cal".into(),
            allow: allow.iter().map(|s| (*s).to_owned()).collect(),
        }],
        ..RunConfig::default()
    }
}

fn approval() -> ToolPolicy {
    ToolPolicy {
        requires_approval: Some(true),
        ..ToolPolicy::default()
    }
}

#[test]
fn an_mcp_tools_own_name_is_admitted_in_either_form() {
    let long = "x".repeat(70);
    let mut config = mcp_config(&["calendar.read", "drive/search", "météo", &long]);
    config.validate().unwrap();
    // tool_policy and policies may name it by its own name or the mapped one.
    config
        .tool_policy
        .insert("calendar.read".into(), approval());
    config
        .tool_policy
        .insert(provider_tool_name("drive/search").into_owned(), approval());
    config.policies.push(Policy {
        tool: provider_tool_name("météo").into_owned(),
        args: None,
        action: PolicyAction::RequireApproval,
    });
    config.policies.push(Policy {
        tool: long.clone(),
        args: None,
        action: PolicyAction::RequireApproval,
    });
    config.validate().unwrap();
    // An allow list may write the mapped form, and a policy the original.
    let mut config = mcp_config(&[&provider_tool_name("calendar.read")]);
    config
        .tool_policy
        .insert("calendar.read".into(), approval());
    config.validate().unwrap();
}

#[test]
fn both_forms_of_one_name_are_one_tool() {
    let mapped = provider_tool_name("calendar.read").into_owned();
    let config = mcp_config(&["calendar.read", &mapped]);
    let e = config.validate().unwrap_err();
    assert_eq!(e.field, "mcp[0].allow[1]");
    assert!(e.reason.contains("same tool as mcp[0].allow[0]"), "{e}");

    let mut config = mcp_config(&["calendar.read"]);
    config
        .tool_policy
        .insert("calendar.read".into(), approval());
    config
        .tool_policy
        .insert(mapped.clone(), ToolPolicy::default());
    let e = config.validate().unwrap_err();
    assert!(e.field.starts_with("tool_policy."), "{e}");
    assert!(e.reason.contains("names the same tool"), "{e}");
    // One entry, whichever form, is found from the offered name.
    config.tool_policy.remove(&mapped);
    assert_eq!(
        config
            .tool_policy_for(&mapped)
            .and_then(|p| p.requires_approval),
        Some(true)
    );
}

#[test]
fn a_name_outside_the_grammar_must_be_an_allowed_mcp_tool() {
    // tool_policy: not an allowed MCP tool, so it names nothing.
    let mut config = mcp_config(&["calendar.read"]);
    config.tool_policy.insert("drive/search".into(), approval());
    let e = config.validate().unwrap_err();
    assert_eq!(e.field, "tool_policy.drive/search");
    // The same without `tools` (the worker's tools unknown here): a worker
    // tool's name is in the grammar, so this still names nothing.
    config.tools = None;
    let e = config.validate().unwrap_err();
    assert_eq!(e.field, "tool_policy.drive/search");
    // policies: refused with the nearest name even when `tools` is unset.
    let mut config = mcp_config(&["calendar.read"]);
    config.tools = None;
    config.policies.push(Policy {
        tool: "calendar.reed".into(),
        args: None,
        action: PolicyAction::RequireApproval,
    });
    let e = config.validate().unwrap_err();
    assert_eq!(e.field, "policies[0].tool");
    assert!(e.reason.contains("did you mean \"calendar.read\"?"), "{e}");
    // Empty, oversized and control-character names are refused, named.
    for bad in ["", "a\nb"] {
        let e = mcp_config(&[bad]).validate().unwrap_err();
        assert_eq!(e.field, "mcp[0].allow[0]", "{bad:?}");
    }
    let e = mcp_config(&[&"y".repeat(300)]).validate().unwrap_err();
    assert!(e.reason.contains("max_tool_name_bytes"), "{e}");
}

#[test]
fn other_tools_names_are_not_loosened() {
    let schema = json!({"type": "object"});
    let config = RunConfig {
        external_tools: vec![ToolSpec::new("calendar.read", "", schema.clone())],
        ..RunConfig::default()
    };
    assert_eq!(
        config.validate().unwrap_err().field,
        "external_tools[0].name"
    );
    let config = RunConfig {
        http_tools: vec![HttpTool {
            name: "drive/search".into(),
            description: String::new(),
            input_schema: schema,
            url: "https://a.example/x".into(),
            idempotent: false,
            timeout_ms: 1,
            max_response_bytes: 1,
        }],
        ..RunConfig::default()
    };
    assert_eq!(config.validate().unwrap_err().field, "http_tools[0].name");
    // A valid name still matches only byte for byte: no `-`/`_` folding.
    let mut config = mcp_config(&["issue_credit"]);
    config.tool_policy.insert("issue-credit".into(), approval());
    let e = config.validate().unwrap_err();
    assert_eq!(e.field, "tool_policy.issue-credit");
}

/// A step offering two tools under one name is refused, naming both by
/// their own names.
#[test]
fn a_clash_names_both_tools() {
    let mapped = provider_tool_name("a.b").into_owned();
    let mcp = |tool: &str| ToolSpec {
        source: Some(glia_proto::ToolSource::Mcp {
            server: "s".into(),
            tool: tool.into(),
            schema_hash: String::new(),
            requires_approval: false,
            max_total_ms: None,
            hints: None,
        }),
        ..ToolSpec::new(provider_tool_name(tool).into_owned(), "", json!({}))
    };
    let tools = [mcp("a.b"), mcp("a_b"), mcp(&mapped)];
    let e = ToolSpec::check_distinct(&tools).unwrap_err();
    assert_eq!(e.name, mapped);
    assert_eq!(e.first, r#"MCP server "s" tool "a.b""#);
    assert_eq!(e.second, format!("MCP server \"s\" tool {mapped:?}"));
    assert!(
        e.to_string()
            .starts_with("two tools of the run would be offered as"),
        "{e}"
    );
    ToolSpec::check_distinct(&tools[..2]).unwrap();
}
