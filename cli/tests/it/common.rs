//! What the CLI's tests share: a dispatcher on a loopback port, and the
//! `glia` binary run against it.

use std::process::{Command, Output};
use std::sync::Arc;

use glia_backends::memory::{MemoryLedger, MemoryLog, MemoryQueue};
use glia_backends::schedules::MemorySchedules;
use glia_dispatcher::{App, Auth};

/// A dispatcher on the in-memory stores, open auth, serving on a loopback
/// port: its log and its URL.
pub async fn dispatcher() -> (Arc<MemoryLog>, String) {
    let log = Arc::new(MemoryLog::default());
    let app = App::new(
        log.clone(),
        Arc::new(MemoryQueue::default()),
        Arc::new(MemoryLedger::default()),
        Auth::open(),
    )
    .with_schedules(Arc::new(MemorySchedules::default()));
    (log, serve(app).await)
}

/// Serve `app` on a loopback port until the test ends; its URL.
pub async fn serve(app: App) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(glia_dispatcher::serve(
        app,
        listener,
        std::future::pending(),
    ));
    server
}

/// `glia ARGS --server SERVER`, run to its end.
pub async fn glia(args: &[&str], server: &str) -> Output {
    let args: Vec<String> = args
        .iter()
        .map(|s| (*s).to_owned())
        .chain(["--server".to_owned(), server.to_owned()])
        .collect();
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_glia"))
            .args(&args)
            .env_remove("GLIA_TOKEN")
            .env("GLIA_MAX_OUTAGE_SECS", "0")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// Its stdout; panics, showing both streams, unless it succeeded.
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
