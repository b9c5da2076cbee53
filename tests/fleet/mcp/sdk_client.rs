//! The official TypeScript SDK client (`@modelcontextprotocol/sdk`, pinned
//! in `.ci/mcp/package-lock.json`) against glia's `/mcp`: the node script
//! `sdk_client.mjs` lists the agents and calls one with the bearer token;
//! this test starts the fleet, runs the script and checks what it saw.

use std::path::{Path, PathBuf};
use std::process::Command;

use glia_testkit::require::require;
use serde_json::{Value, json};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// `node_modules` of `.ci/mcp` when the SDK is installed there and node runs.
fn sdk() -> Option<PathBuf> {
    let modules = root().join(".ci/mcp/node_modules");
    let installed = modules
        .join("@modelcontextprotocol/sdk/package.json")
        .is_file();
    let node = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    (installed && node).then_some(modules)
}

#[test]
fn the_typescript_sdk_lists_and_calls_an_agent() {
    let Some(modules) = require(
        sdk(),
        "node and @modelcontextprotocol/sdk in .ci/mcp/node_modules",
        "npm ci --prefix .ci/mcp",
    ) else {
        return;
    };
    let fleet = super::mcp_fleet();
    // The script resolves the SDK from a node_modules beside it.
    let dir = fleet.dir.join("sdk-client");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fleet/mcp/sdk_client.mjs"),
        dir.join("sdk_client.mjs"),
    )
    .unwrap();
    std::os::unix::fs::symlink(&modules, dir.join("node_modules")).unwrap();
    let out = Command::new("node")
        .arg(dir.join("sdk_client.mjs"))
        .env("GLIA_MCP_URL", format!("{}/mcp", fleet.server))
        .env("GLIA_TOKEN", "tok-acme")
        .output()
        .expect("node runs");
    assert!(
        out.status.success(),
        "the SDK client failed ({}):\n{}\nthe fleet's logs:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        fleet.log_tails(40)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let seen: Value = serde_json::from_str(stdout.trim().lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("one JSON line from the script ({e}): {stdout}"));
    assert_eq!(seen["server"]["name"], "glia", "{seen}");
    let tools = seen["tools"].as_array().unwrap();
    let answerer = tools
        .iter()
        .find(|t| t["name"] == "answerer")
        .unwrap_or_else(|| panic!("answerer listed: {seen}"));
    assert!(
        answerer["description"]
            .as_str()
            .unwrap()
            .starts_with("Answers at once.")
    );
    assert_eq!(answerer["inputSchema"]["required"], json!(["goal"]));
    assert_eq!(answerer["hasOutputSchema"], true);
    assert!(tools.iter().any(|t| t["name"] == "refunder"));
    let result = &seen["result"];
    assert_ne!(result["isError"], true, "{seen}");
    assert_eq!(
        result["content"][0]["text"], "Done: the goal is met.",
        "{seen}"
    );
    assert_eq!(result["structuredContent"]["status"], "succeeded", "{seen}");
    let progress: Vec<&str> = seen["progress"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        progress.iter().any(|m| m.contains("session.complete")),
        "progress carries the run's events: {progress:?}"
    );
    assert_eq!(
        seen["refused"]["code"], -32602,
        "malformed arguments: {seen}"
    );
    assert!(
        seen["refused"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("goal"),
        "{seen}"
    );
    let run_id = result["structuredContent"]["run_id"].as_str().unwrap();
    let (status, run) = fleet.api.get(&format!("/v1/runs/{run_id}"));
    assert_eq!(
        (status, run["status"].clone()),
        (200, json!("done")),
        "{run}"
    );
}
