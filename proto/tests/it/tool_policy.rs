//! `tool_policy.NAME.max_total_ms`: strictly parsed, at least the tool's
//! timeout, for MCP tools only.

/// The bound of a call that reports progress is checked naming the field.
#[test]
fn max_total_ms_is_at_least_the_timeout_and_for_mcp_tools_only() {
    let config = |policy: serde_json::Value| -> glia_proto::RunConfig {
        glia_proto::strict::from_json_str(
            &serde_json::json!({
                "tool_policy": {"slow": policy},
                "http_tools": [{"name": "web", "description": "", "input_schema": {"type": "object"}, "url": "https://example.com/t"}],
            })
            .to_string(),
        )
        .expect("parses")
    };
    assert!(
        config(serde_json::json!({"timeout_ms": 1000, "max_total_ms": 1000}))
            .validate()
            .is_ok()
    );
    assert!(
        config(serde_json::json!({"max_total_ms": 5}))
            .validate()
            .is_ok()
    );
    let e = config(serde_json::json!({"timeout_ms": 1000, "max_total_ms": 999}))
        .validate()
        .unwrap_err();
    assert_eq!(e.field, "tool_policy.slow.max_total_ms");
    assert!(
        e.reason.contains("below the tool's timeout_ms of 1000 ms"),
        "{e}"
    );
    let e = config(serde_json::json!({"max_total_ms": 0}))
        .validate()
        .unwrap_err();
    assert_eq!(
        (e.field.as_str(), e.reason.as_str()),
        ("tool_policy.slow.max_total_ms", "must be at least 1")
    );
    let mut http = config(serde_json::json!({}));
    http.tool_policy.insert(
        "web".into(),
        glia_proto::ToolPolicy {
            max_total_ms: Some(60_000),
            ..Default::default()
        },
    );
    let e = http.validate().unwrap_err();
    assert_eq!(e.field, "tool_policy.web.max_total_ms");
    assert!(e.reason.contains("MCP tools only"), "{e}");
    let mut worker = config(serde_json::json!({"max_total_ms": 60_000}));
    assert!(worker.validate().is_ok(), "slow may be an MCP tool");
    worker.tools = Some(vec!["slow".into()]);
    let e = worker.validate().unwrap_err();
    assert_eq!(e.field, "tool_policy.slow.max_total_ms");
    let e = glia_proto::strict::from_json_str::<glia_proto::RunConfig>(
        r#"{"tool_policy": {"slow": {"max_total": 5}}}"#,
    )
    .unwrap_err();
    assert_eq!(e.path, "tool_policy.slow.max_total");
    assert_eq!(
        glia_proto::tool_sources::resolve_max_total_ms(30_000, None),
        Ok(300_000)
    );
    assert_eq!(
        glia_proto::tool_sources::resolve_max_total_ms(u64::MAX, None),
        Ok(u64::MAX)
    );
}

/// A per-tool result budget keyed by an MCP tool's own name applies to the
/// name the model sees.
#[test]
fn a_result_budget_under_the_tools_own_name_applies() {
    let config: glia_proto::RunConfig = glia_proto::strict::from_json_str(
        r#"{"mcp": [{"server": "cal", "allow": ["calendar.read"]}],
            "tool_policy": {"calendar.read": {"max_result_bytes": 100}}}"#,
    )
    .expect("parses");
    config.validate().expect("valid");
    let offered = glia_proto::tool_names::provider_tool_name("calendar.read");
    assert_ne!(offered, "calendar.read");
    assert_eq!(config.max_result_bytes_for(&offered), 100);
    assert_eq!(config.max_result_bytes_for("calendar.read"), 100);
    assert_eq!(
        config.max_result_bytes_for("other"),
        config.max_result_bytes
    );
}
