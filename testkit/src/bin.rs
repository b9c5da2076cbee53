//! The `glia` binary for process-level tests.
//!
//! `CARGO_BIN_EXE_glia` exists only for tests of the `glia-cli` package; the
//! other crates find the binary here: `GLIA_BIN` when set (any path), else
//! `glia` in the profile directory of the running test executable
//! (`target/debug/deps/test-… → target/debug/glia`), which
//! `cargo test --workspace` builds anyway. When that binary is missing or
//! older than any source file of the crates it is built from, it runs
//! `cargo build -p glia-cli --bin glia` first (once per test process), so
//! `cargo test -p glia-e2e` alone never runs a stale or missing binary. (It
//! does not rebuild a current binary: `cargo build -p glia-cli` resolves
//! features differently from `cargo test --workspace` and would rebuild
//! dependencies for nothing.)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The path of the `glia` binary (see the module docs). Panics with the
/// cargo output when it cannot be built.
pub fn glia_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(bin) = std::env::var("GLIA_BIN") {
            return PathBuf::from(bin);
        }
        let profile_dir = profile_dir();
        let bin = profile_dir.join(format!("glia{}", std::env::consts::EXE_SUFFIX));
        if bin.exists() && !stale(&bin) {
            return bin;
        }
        cargo_build("glia-cli", "glia", &profile_dir);
        assert!(bin.exists(), "{} missing after cargo build", bin.display());
        bin
    })
    .clone()
}

/// Whether a file of the crates `glia` is built from (tests excepted) is newer than `bin`.
fn stale(bin: &Path) -> bool {
    let Ok(built) = std::fs::metadata(bin).and_then(|m| m.modified()) else {
        return true;
    };
    let root = crate::workspace_root();
    // Everything of those crates but their tests (sources, migrations and assets compiled in).
    let mut dirs: Vec<PathBuf> = [
        "cli",
        "worker",
        "dispatcher",
        "backends",
        "providers",
        "proto",
        "replay",
    ]
    .iter()
    .map(|c| root.join(c))
    .collect();
    dirs.push(root.join("Cargo.lock"));
    while let Some(p) = dirs.pop() {
        let Ok(meta) = std::fs::metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            dirs.extend(
                std::fs::read_dir(&p)
                    .into_iter()
                    .flatten()
                    .filter_map(|e| Some(e.ok()?.path()))
                    .filter(|c| !c.ends_with("tests")),
            );
        } else if meta.modified().is_ok_and(|m| m > built) {
            return true;
        }
    }
    false
}

/// The path of the glia-testkit binary `name` (`lying-mcp`, `odd-mcp`)
/// next to the running test, built first (cargo does nothing when it is
/// current). Panics with cargo's output when the build fails.
pub fn testkit_bin(name: &str) -> PathBuf {
    let profile_dir = profile_dir();
    cargo_build("glia-testkit", name, &profile_dir);
    profile_dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

/// The profile directory of the running test: `target/<profile>/deps/<test>`
/// → `target/<profile>`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("the test runs from target/<profile>/deps")
        .to_path_buf()
}

/// `cargo build -p PACKAGE --bin BIN` into the target directory and
/// profile of `profile_dir` (`target/<profile>`). Panics with cargo's
/// output when it fails.
fn cargo_build(package: &str, bin: &str, profile_dir: &Path) {
    let target_dir = profile_dir.parent().expect("target/<profile> has a parent");
    let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    build
        .args(["build", "--quiet", "-p", package, "--bin", bin])
        .current_dir(crate::workspace_root())
        .env("CARGO_TARGET_DIR", target_dir);
    if profile_dir.file_name().is_some_and(|p| p == "release") {
        build.arg("--release");
    }
    let out = build.output().expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo build -p {package} --bin {bin} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
