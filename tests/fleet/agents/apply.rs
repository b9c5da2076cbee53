//! `glia agents apply|list|show` and `glia submit --agent` against a real
//! `glia dev --demo` process: applying the example directory is idempotent
//! (created, then unchanged), a bad file is refused naming the file and the
//! field before anything is sent, and a run started from the agent records
//! its version and hash and runs with exactly the agent's tools and rules.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use glia_testkit::bin::glia_bin;
use glia_testkit::fleet::{Dev, http};
use serde_json::Value;

fn glia(dev: &Dev, args: &[&str]) -> Output {
    Command::new(glia_bin())
        .current_dir(repo())
        .args(args)
        .env("GLIA_SERVER", &dev.server)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

fn repo() -> PathBuf {
    glia_testkit::workspace_root()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn apply_is_idempotent_and_runs_record_the_agent() {
    // The example catalogue: `files.toml` names its MCP server, and apply
    // runs the admission a run gets (a server the fleet lacks is refused).
    let dev = Dev::start(&[
        "--demo",
        "--workers",
        "1",
        "--catalogue",
        "examples/catalogue.toml",
    ]);
    let first = ok(&glia(&dev, &["agents", "apply", "examples/agents"]));
    assert!(
        first.contains("agent support created (version 1, sha256:"),
        "{first}"
    );
    let again = ok(&glia(
        &dev,
        &["agents", "apply", "examples/agents/support.toml"],
    ));
    assert!(
        again.contains("agent support unchanged (version 1, sha256:"),
        "{again}"
    );

    // A changed copy is the next version; a bad one is refused before anything is sent.
    let dir = std::env::temp_dir().join(format!("glia-agents-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(repo().join("examples/agents/support.toml")).unwrap();
    std::fs::write(
        dir.join("a.toml"),
        text.replace("max_turns = 10", "max_turns = 8"),
    )
    .unwrap();
    std::fs::write(
        dir.join("b.toml"),
        text.replace(
            "name = \"support\"",
            "name = \"tenant-shell\"\ncommand = \"/bin/sh\"",
        ),
    )
    .unwrap();
    let refused = glia(&dev, &["agents", "apply", dir.to_str().unwrap()]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("b.toml: invalid agent definition: command: unknown field"),
        "{stderr}"
    );
    assert!(
        refused.stdout.is_empty(),
        "nothing applied: {}",
        String::from_utf8_lossy(&refused.stdout)
    );
    std::fs::remove_file(dir.join("b.toml")).unwrap();
    std::fs::write(
        dir.join("c.toml"),
        text.replace("deny = '(?i)internal note'", "deny = '(unclosed'")
            .replace("name = \"support\"", "name = \"other\""),
    )
    .unwrap();
    let refused = glia(&dev, &["agents", "apply", dir.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains(
            "c.toml: invalid agent definition: guardrails.output[0].deny: not a valid regex"
        ),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    std::fs::remove_file(dir.join("c.toml")).unwrap();
    let v2 = ok(&glia(&dev, &["agents", "apply", dir.to_str().unwrap()]));
    assert!(v2.contains("agent support created (version 2"), "{v2}");
    let _ = std::fs::remove_dir_all(&dir);

    let list = ok(&glia(&dev, &["agents", "list"]));
    assert!(
        list.lines()
            .any(|l| l.starts_with("support") && l.contains(" 2 ") && l.contains("script:support")),
        "{list}"
    );
    let shown: Value =
        serde_json::from_str(&ok(&glia(&dev, &["agents", "show", "support@1"]))).unwrap();
    assert_eq!(shown["definition"]["budget"]["max_turns"], 10);

    // A run from version 1: parks for the refund's approval, with the agent recorded.
    let run_id = ok(&glia(
        &dev,
        &[
            "submit",
            "--agent",
            "support@1",
            "--detach",
            "Refund order A1",
        ],
    ))
    .trim()
    .to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    let events = loop {
        let (_, body) = http(
            "GET",
            &format!("{}/v1/runs/{run_id}/events", dev.server),
            None,
        )
        .unwrap();
        let events = body["events"].as_array().cloned().unwrap_or_default();
        if events.iter().any(|e| e["type"] == "approval.requested") {
            break events;
        }
        assert!(
            Instant::now() < deadline,
            "the run did not reach its approval: {body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let agent = &events[0]["data"]["config"]["agent"];
    assert_eq!(
        (agent["name"].as_str(), agent["version"].as_u64()),
        (Some("support"), Some(1)),
        "{}",
        events[0]
    );
    assert_eq!(agent["content_hash"], shown["content_hash"]);
    let step = events.iter().find(|e| e["type"] == "step.start").unwrap();
    let mut offered: Vec<&str> = step["data"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    offered.sort_unstable();
    assert_eq!(
        offered,
        vec!["get_order", "refund_order"],
        "exactly the agent's tools, not every demo tool"
    );
}

/// `glia dev` (and `glia serve`) without `--catalogue`: its workers, in its
/// own process, have no MCP server, HTTP origin or provider to offer, so a
/// run naming one is refused at admission, naming the field, and nothing is
/// stored (before: admitted, then failed by the worker).
#[test]
fn without_a_catalogue_a_run_naming_catalogue_entries_is_refused_at_admission() {
    let dev = Dev::start(&["--demo", "--workers", "1"]);
    let runs = |dev: &Dev| {
        http("GET", &format!("{}/v1/runs?limit=100", dev.server), None)
            .unwrap()
            .1["runs"]
            .as_array()
            .map_or(0, Vec::len)
    };
    let before = runs(&dev);
    for (config, field) in [
        (
            serde_json::json!({"model": "script:refund", "mcp": [{"server": "files", "allow": ["read_text_file"]}]}),
            "config.mcp[0].server",
        ),
        (
            serde_json::json!({"model": "script:refund", "provider": "anthropic"}),
            "config.provider",
        ),
    ] {
        let (status, body) = http(
            "POST",
            &format!("{}/v1/runs", dev.server),
            Some(serde_json::json!({"goal": "g", "config": config})),
        )
        .unwrap();
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"]["field"], field, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("catalogue"),
            "{body}"
        );
    }
    assert_eq!(runs(&dev), before, "nothing stored");
}
