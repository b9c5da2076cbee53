//! `glia run` end to end: the binary, a script file, a config file.

use std::process::Command;

use glia_proto::{Event, Outcome, PullPoint, RunState, Status};

fn glia(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_glia")).args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().expect("glia runs")
}

const SCRIPT: &str = "../examples/scripts/refund.json";
const CONFIG: &str = "../examples/refund.config.json";

#[test]
fn prints_events_as_text() {
    let out = glia(&["run", "--script", SCRIPT, "--config", CONFIG, "--approve", "Refund order A1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let names: Vec<&str> = text.lines().map(|l| l.split_whitespace().nth(1).unwrap()).collect();
    assert_eq!(names.first(), Some(&"session.start"));
    assert_eq!(names.last(), Some(&"session.complete"));
    assert!(names.contains(&"approval.requested") && names.contains(&"approval.resolved"));
    assert!(text.contains("Order A1 (headphones, $59) is refunded."));
}

#[test]
fn json_lines_replay_to_the_final_state() {
    let out = glia(&["run", "--json", "--script", SCRIPT, "--config", CONFIG, "--approve", "Refund order A1"]);
    assert!(out.status.success());
    let events: Vec<Event> = String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let state = RunState::replay(events[0].run_id, &events).unwrap();
    assert!(matches!(state.status(), Status::Done(Outcome::Succeeded { .. })));
}

#[test]
fn stops_parked_and_writes_a_checkpoint() {
    let dir = std::env::temp_dir().join(format!("glia-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let checkpoint = dir.join("state.json");
    let out = glia(&["run", "--script", SCRIPT, "--config", CONFIG, "--checkpoint", checkpoint.to_str().unwrap(), "Refund order A1"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("parked at awaiting_approval"));
    let state: RunState = serde_json::from_slice(&std::fs::read(&checkpoint).unwrap()).unwrap();
    assert!(matches!(state.status(), Status::Parked(PullPoint::AwaitingApproval { .. })));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn rejection_reaches_the_model() {
    let out = glia(&["run", "--json", "--script", SCRIPT, "--config", CONFIG, "--reject", "not eligible", "Refund order A1"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("A person rejected this call: not eligible"));
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
