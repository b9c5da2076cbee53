//! The crate map's invariants (ARCHITECTURE.md, "Crates"), kept by
//! `cargo tree` on the normal (non-dev) dependency graph:
//!
//! - the dispatcher does not link the loop: no `glia-agent`, `glia-worker`,
//!   `glia-providers` or `glia-replay` under `glia-dispatcher`;
//! - the provider boundary has no I/O dependency: `glia-providers` links no
//!   storage, broker or cache crate, and neither the loop nor the job
//!   consumer (it depends on `glia-proto` alone among glia crates);
//! - the loop has no storage: `glia-agent` links no storage, broker or cache
//!   crate and no `glia-backends`;
//! - replay depends on the boundary and the loop, never on storage;
//! - the contract is pure: `glia-proto` links no other glia crate and no
//!   async runtime;
//! - what an eval is, is pure: `glia-evals` links no glia crate but
//!   `glia-proto`, and no storage, broker, cache or async runtime.
//!
//! A `cargo tree` that fails fails the test (it never passes vacuously).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Crates that talk to a store, a broker or a cache.
const IO_CRATES: &[&str] = &[
    "tokio-postgres",
    "postgres-protocol",
    "deadpool-postgres",
    "deadpool",
    "refinery",
    "rusqlite",
    "libsqlite3-sys",
    "lapin",
    "redis",
];

/// The names of every crate `package` links (normal edges only; features
/// resolved for `package` alone).
fn linked(package: &str) -> BTreeSet<String> {
    let out = Command::new(env!("CARGO"))
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .args([
            "tree",
            "--locked",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-p",
            package,
        ])
        .output()
        .expect("running cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: BTreeSet<String> = String::from_utf8(out.stdout)
        .expect("cargo tree prints UTF-8")
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    assert!(
        names.contains(package),
        "cargo tree -p {package} did not list {package}: {names:?}"
    );
    names
}

fn assert_links_none(package: &str, forbidden: &[&str]) {
    let names = linked(package);
    let found: Vec<&&str> = forbidden.iter().filter(|f| names.contains(**f)).collect();
    assert!(found.is_empty(), "{package} must not link {found:?}");
}

#[test]
fn the_dispatcher_does_not_link_the_loop() {
    assert_links_none(
        "glia-dispatcher",
        &["glia-agent", "glia-worker", "glia-providers", "glia-replay"],
    );
}

#[test]
fn providers_link_no_storage_broker_or_cache() {
    let mut forbidden = IO_CRATES.to_vec();
    forbidden.extend(["glia-backends", "glia-agent", "glia-worker"]);
    assert_links_none("glia-providers", &forbidden);
}

#[test]
fn the_loop_links_no_storage_broker_or_cache() {
    let mut forbidden = IO_CRATES.to_vec();
    forbidden.extend(["glia-backends", "glia-worker", "glia-providers"]);
    assert_links_none("glia-agent", &forbidden);
}

#[test]
fn replay_links_no_storage() {
    let mut forbidden = IO_CRATES.to_vec();
    forbidden.extend(["glia-backends", "glia-worker", "glia-providers"]);
    assert_links_none("glia-replay", &forbidden);
}

#[test]
fn evals_are_pure() {
    let mut forbidden = IO_CRATES.to_vec();
    forbidden.extend([
        "tokio",
        "glia-agent",
        "glia-backends",
        "glia-worker",
        "glia-providers",
        "glia-replay",
        "glia-dispatcher",
    ]);
    assert_links_none("glia-evals", &forbidden);
}

#[test]
fn the_contract_is_pure() {
    assert_links_none(
        "glia-proto",
        &[
            "tokio",
            "glia-agent",
            "glia-backends",
            "glia-worker",
            "glia-providers",
        ],
    );
}
