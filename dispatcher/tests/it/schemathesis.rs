//! The OpenAPI document is the contract, checked by a property-based API
//! test: schemathesis (pinned in `.ci/requirements-schemathesis.txt`;
//! `scripts/test` installs it into `.ci/venv`) generates requests from
//! `/openapi.json` of a real dispatcher (Postgres, RabbitMQ, Redis, relay
//! running) and checks every answer with all of its checks: no 5xx; status
//! codes, content types, headers and bodies as documented; what the document
//! allows is accepted and what it forbids refused; authentication is not
//! ignored. The number of examples per operation is bounded (a seed makes
//! runs repeatable); with some 50 operations the test takes about three minutes.
//!
//! Where schemathesis is: `GLIA_SCHEMATHESIS`, else `.ci/venv/bin/schemathesis`
//! under the workspace, else `schemathesis` on `PATH`. When none is there the
//! test fails under `GLIA_TEST_STRICT=1` (`scripts/test`, and so CI, sets
//! it) and is skipped with a loud message otherwise (`glia_testkit::require`).

use crate::common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use common::{Real, SUB_B};

fn schemathesis() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("GLIA_SCHEMATHESIS") {
        return Some(PathBuf::from(path));
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.ci/venv/bin/schemathesis");
    if venv.is_file() {
        return Some(venv);
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| PathBuf::from(dir).join("schemathesis"))
        .find(|p| p.is_file())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_server_error_and_no_conformance_failure() {
    let Some(st) = glia_testkit::require(
        schemathesis(),
        "schemathesis",
        "scripts/test installs it into .ci/venv; or set GLIA_SCHEMATHESIS",
    ) else {
        return;
    };
    let real = Real::start().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(glia_dispatcher::serve(
        real.app.clone(),
        listener,
        async move {
            let _ = stopped.await;
        },
    ));
    let relay = tokio::spawn(glia_dispatcher::relay(real.app.clone()));
    let report = std::env::temp_dir().join(format!(
        "glia-schemathesis-{}",
        uuid::Uuid::now_v7().simple()
    ));
    // Its caches and crash files go there too, not into the source tree.
    std::fs::create_dir_all(&report).unwrap();
    let started = Instant::now();
    let mut cmd = Command::new(&st);
    cmd.current_dir(&report);
    cmd.arg("--config-file")
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/schemathesis.toml"));
    cmd.arg("run")
        .arg(format!("{base}/openapi.json"))
        .args([
            "--checks",
            "all",
            "--max-examples",
            "40",
            "--seed",
            "20261130",
            "--workers",
            "1",
        ])
        .args([
            "--request-timeout",
            "10",
            "--max-response-time",
            "5",
            "--generation-database",
            "none",
        ])
        .args(["--header", &format!("Authorization: Bearer {SUB_B}")])
        .args(["--report", "junit", "--report-dir"])
        .arg(&report)
        .arg("--no-color")
        .env("SCHEMATHESIS_HOOKS", "")
        .env_remove("SCHEMATHESIS_CONFIG");
    let output = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .expect("schemathesis runs");
    let took = started.elapsed();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = stop.send(());
    let _ = server.await;
    relay.abort();
    real.cleanup().await;
    let _ = std::fs::remove_dir_all(&report);
    println!("{text}");
    assert!(
        output.status.success(),
        "schemathesis found failures (exit {:?}); its report is above",
        output.status.code()
    );
    // Its closing line counts failures and errors ("2 failures, 1 error, 1 warning in 12.3s"); warnings
    // (operations it could not reach past a 404) are not failures.
    let closing = text
        .lines()
        .rev()
        .find(|l| l.starts_with('=') && l.contains(" in "))
        .unwrap_or_default();
    assert!(
        !closing.is_empty() && !closing.contains("failure") && !closing.contains("error"),
        "schemathesis did not report a clean run: {closing}"
    );
    println!("schemathesis took {took:?}");
}
