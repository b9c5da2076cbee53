//! The client libraries' own test suites (`clients/python`: pytest;
//! `clients/typescript`: node's test runner), each run against a real
//! fleet this module starts: `glia dispatcher` and `glia worker` processes
//! on the machine's Postgres, RabbitMQ and Redis, isolated like every
//! fleet test. The suites read where the fleet is from the environment:
//!
//! | variable | what |
//! |---|---|
//! | `GLIA_URL` | the dispatcher's base URL |
//! | `GLIA_TOKEN` | a token of tenant `acme` with every scope (`admin`) |
//! | `GLIA_TOKEN_OTHER` | a token of tenant `other` (`submit,approve`) |
//! | `GLIA_EFFECTS_FILE` | the demo tools' effects file (one line per refund) |
//!
//! The fleet's scripts (a run's `config.model` is `script:NAME`):
//! `answer` answers at once; `refund` looks order A1 up, refunds it and
//! answers (with `"policies": [{"tool": "refund_order", "action": {"kind":
//! "require_approval"}}]` in the run's config the refund waits for a
//! decision, as in `examples/refund.config.json`); `lookup` calls
//! `lookup_order` twice, for A1 and then B2 (declare it in the run's
//! `external_tools`: the caller posts each result), and answers; `chat`
//! answers twice (a conversational run's first answer and its answer to one
//! message); `slow` calls `sleep`
//! (a built-in wait; the run's config must allow it:
//! `"builtin_tools": ["sleep"]`) before it answers. Webhooks may reach loopback
//! (`GLIA_WEBHOOK_ALLOW_PRIVATE`).

use std::path::{Path, PathBuf};
use std::process::Command;

use glia_testkit::fleet::Fleet;
use serde_json::{Value, json};

mod python;
mod typescript;

/// The scripts every client suite uses.
fn scripts() -> Vec<(&'static str, Value)> {
    vec![
        ("answer", json!([{"text": "Done: the goal is met."}])),
        (
            "refund",
            json!([
                {"text": "Looking up A1.", "tool_calls": [{"name": "get_order", "input": {"order_id": "A1"}}]},
                {"text": "Refunding it.", "tool_calls": [{"name": "refund_order", "input": {"order_id": "A1"}}]},
                {"text": "Order A1 is refunded."}
            ]),
        ),
        (
            "lookup",
            json!([
                {"text": "Looking A1 up.", "tool_calls": [{"name": "lookup_order", "input": {"order_id": "A1"}}]},
                {"text": "Now B2.", "tool_calls": [{"name": "lookup_order", "input": {"order_id": "B2"}}]},
                {"text": "Looked up."}
            ]),
        ),
        (
            "chat",
            json!([{"text": "Hello; what else?"}, {"text": "Noted."}]),
        ),
        (
            "slow",
            json!([
                {"text": "Waiting a little.", "tool_calls": [{"name": "sleep", "input": {"seconds": 2}}]},
                {"text": "Waited."}
            ]),
        ),
    ]
}

/// A fleet for a client suite: the dispatcher (two tenants' tokens,
/// webhooks to loopback allowed) and one worker, started.
fn client_fleet() -> Fleet {
    let mut fleet = Fleet::new(&scripts());
    fleet.extra_env.push((
        "GLIA_TOKENS".into(),
        "tok-acme:acme:admin tok-other:other:submit,approve".into(),
    ));
    fleet
        .extra_env
        .push(("GLIA_WEBHOOK_ALLOW_PRIVATE".into(), "true".into()));
    fleet.start_dispatcher();
    fleet.start_worker(5000);
    fleet
}

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Run `cmd` (a suite) in `dir` against `fleet`, inheriting its output;
/// panic with the fleet's log tails when it fails.
fn run_suite(fleet: &Fleet, mut cmd: Command, dir: &Path) {
    let status = cmd
        .current_dir(dir)
        .env("GLIA_URL", &fleet.server)
        .env("GLIA_TOKEN", "tok-acme")
        .env("GLIA_TOKEN_OTHER", "tok-other")
        .env("GLIA_EFFECTS_FILE", fleet.effects_file())
        .status()
        .unwrap_or_else(|e| panic!("the suite {cmd:?} starts: {e}"));
    assert!(
        status.success(),
        "the suite {cmd:?} failed ({status}); the fleet's logs:\n{}",
        fleet.log_tails(40)
    );
}
