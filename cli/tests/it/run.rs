//! `glia run` end to end: the binary, a script file, a config file.

use std::process::Command;

use glia_proto::{Event, Outcome, PullPoint, RunState, Status};

fn glia(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_glia"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("glia runs")
}

const SCRIPT: &str = "../examples/scripts/refund.json";
const CONFIG: &str = "../examples/refund.config.json";

#[test]
fn prints_events_as_text() {
    let out = glia(&[
        "run",
        "--demo",
        "--script",
        SCRIPT,
        "--config",
        CONFIG,
        "--approve",
        "Refund order A1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let names: Vec<&str> = text
        .lines()
        .map(|l| l.split_whitespace().nth(2).unwrap())
        .collect();
    assert_eq!(names.first(), Some(&"session.start"));
    assert_eq!(names.last(), Some(&"session.complete"));
    assert!(names.contains(&"approval.requested") && names.contains(&"approval.resolved"));
    assert!(text.contains("Order A1 (headphones, $59) is refunded."));
}

#[test]
fn json_lines_replay_to_the_final_state() {
    let out = glia(&[
        "run",
        "--demo",
        "--json",
        "--script",
        SCRIPT,
        "--config",
        CONFIG,
        "--approve",
        "Refund order A1",
    ]);
    assert!(out.status.success());
    let events: Vec<Event> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let state = RunState::replay(events[0].run_id, &events).unwrap();
    assert!(matches!(
        state.status(),
        Status::Done(Outcome::Succeeded { .. })
    ));
}

#[test]
fn stops_parked_and_writes_a_checkpoint() {
    let dir = std::env::temp_dir().join(format!("glia-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let checkpoint = dir.join("state.json");
    let out = glia(&[
        "run",
        "--demo",
        "--script",
        SCRIPT,
        "--config",
        CONFIG,
        "--checkpoint",
        checkpoint.to_str().unwrap(),
        "Refund order A1",
    ]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("parked at awaiting_approval"));
    let state: RunState = serde_json::from_slice(&std::fs::read(&checkpoint).unwrap()).unwrap();
    assert!(matches!(
        state.status(),
        Status::Parked(PullPoint::AwaitingApproval { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn rejection_reaches_the_model() {
    let out = glia(&[
        "run",
        "--demo",
        "--json",
        "--script",
        SCRIPT,
        "--config",
        CONFIG,
        "--reject",
        "not eligible",
        "Refund order A1",
    ]);
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("A person rejected this call: not eligible")
    );
}

#[test]
fn bad_files_give_clear_errors() {
    let out = glia(&["run", "--script", "no/such/file.json", "goal"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("reading no/such/file.json"));
    let out = glia(&["run", "--script", CONFIG, "goal"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("parsing script"));
}

/// A config whose schemas do not compile is refused before anything runs or
/// is sent, by `glia run` and by `glia submit` (no dispatcher listens on the
/// port given: the refusal comes first), naming the field.
#[test]
fn invalid_schemas_are_refused_before_anything_runs() {
    let dir = std::env::temp_dir().join(format!("glia-cli-schema-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        (
            r#"{"external_tools": [{"name": "ext", "description": "d", "input_schema": {"type": "notatype", "properties": 5}}]}"#,
            "external_tools[0].input_schema",
        ),
        (
            r##"{"output_schema": {"type": "bogus", "$ref": "#/nope"}}"##,
            "output_schema",
        ),
        (r#"{"compactor": {"max_tokens": 5}}"#, "compactor"),
        (r#"{"budget": {"max_turns": "five"}}"#, "budget.max_turns"),
        (
            r#"{"guardrails": {"output": [{"name": "n", "deny": "("}]}}"#,
            "guardrails.output[0].deny",
        ),
    ];
    for (i, (config, field)) in cases.iter().enumerate() {
        let path = dir.join(format!("config{i}.json"));
        std::fs::write(&path, config).unwrap();
        let path = path.to_str().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let server = format!("http://127.0.0.1:{port}");
        for args in [
            vec!["run", "--script", SCRIPT, "--config", path, "goal"],
            vec!["submit", "--server", &server, "--config", path, "goal"],
        ] {
            let out = glia(&args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{args:?}");
            assert!(
                stderr.contains(&format!("invalid run config: {field}: ")),
                "{args:?}: {stderr}"
            );
            assert!(
                out.stdout.is_empty(),
                "{args:?}: nothing ran: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
