//! The TypeScript client's suite (`clients/typescript`, package
//! `@glia/client`): `npm test` there (tsc builds the library and the tests
//! under `strict`, then `node --test` runs them) against a fleet of
//! [`client_fleet`]. Needs Node 20+, npm and the packages of
//! `clients/typescript/package-lock.json` (`npm ci --prefix
//! clients/typescript`; `scripts/test` does).

use std::process::Command;

use super::{client_fleet, root, run_suite};

/// `node --version`'s major version, when node runs.
fn node_major() -> Option<u32> {
    let out = Command::new("node").arg("--version").output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    text.trim()
        .trim_start_matches('v')
        .split('.')
        .next()?
        .parse()
        .ok()
}

#[test]
fn typescript_client_suite() {
    let Some(major) = glia_testkit::require(
        node_major(),
        "node (Node.js 20 or later)",
        "apt-get install nodejs npm",
    ) else {
        return;
    };
    assert!(
        major >= 20,
        "the TypeScript client needs Node.js 20 or later, found {major}"
    );
    let dir = root().join("clients/typescript");
    let installed = dir.join("node_modules/.bin/tsc");
    if glia_testkit::require(
        installed.exists().then_some(()),
        format!("the TypeScript client's packages ({})", installed.display()),
        "npm ci --prefix clients/typescript; scripts/test does",
    )
    .is_none()
    {
        return;
    }
    let fleet = client_fleet();
    let mut npm = Command::new("npm");
    npm.args(["test", "--silent"]);
    run_suite(&fleet, npm, &dir);
}
