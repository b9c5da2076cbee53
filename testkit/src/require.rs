//! One rule for every test that needs something this machine may lack (a
//! server binary, a service it starts, an npm or PyPI tool): the switch
//! [`STRICT`] (`GLIA_TEST_STRICT`). Set to `1` (as `scripts/test`, and so
//! CI, sets it), a test that cannot find or start what it needs FAILS,
//! naming it and how to install it; unset or `0`, it prints a loud
//! `SKIPPED` line and passes having checked nothing. Any other value is a
//! mistake and fails the test.
//!
//! ```ignore
//! let Some(pg) = require(PrivatePostgres::start_new(), "PostgreSQL server binaries (initdb, pg_ctl)", "apt-get install postgresql") else {
//!     return;
//! };
//! ```

use std::fmt::Display;

/// The switch's name.
pub const STRICT: &str = "GLIA_TEST_STRICT";

/// Whether [`STRICT`] is on (`1`). Off when unset, empty or `0`; panics on
/// any other value, so a misspelt `true` cannot quietly mean "skip".
pub fn strict() -> bool {
    match std::env::var(STRICT) {
        Err(std::env::VarError::NotPresent) => false,
        Ok(v) if v == "1" => true,
        Ok(v) if v.is_empty() || v == "0" => false,
        other => panic!(
            "{STRICT}={other:?}: set it to 1 (fail when something is missing) or 0 / unset (skip)"
        ),
    }
}

/// The running test cannot find or start `what` (`install` says how to get
/// it): under [`STRICT`] this panics; otherwise it prints a loud `SKIPPED`
/// line, and the caller returns without checking anything.
pub fn missing(what: impl Display, install: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("this test")
        .to_owned();
    if strict() {
        panic!("{test}: {what} not available ({install}); {STRICT}=1 makes this a failure");
    }
    eprintln!(
        "\n!!!!!!!!\n!!! SKIPPED {test}: {what} not available ({install}).\n!!! Nothing was checked; scripts/test sets {STRICT}=1, which makes this a failure.\n!!!!!!!!\n"
    );
}

/// `found`, or [`missing`] for `what` when it is `None` (then `None`: the
/// caller returns).
pub fn require<T>(found: Option<T>, what: impl Display, install: &str) -> Option<T> {
    if found.is_none() {
        missing(what, install);
    }
    found
}

/// `found`'s value, or [`missing`] for `what` with the error when it is an
/// `Err` (then `None`: the caller returns).
pub fn require_ok<T, E: Display>(
    found: Result<T, E>,
    what: impl Display,
    install: &str,
) -> Option<T> {
    match found {
        Ok(v) => Some(v),
        Err(e) => {
            missing(format!("{what} ({e})"), install);
            None
        }
    }
}
