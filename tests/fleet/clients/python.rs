//! The Python client's suite (`clients/python`, package `glia-client`):
//! pytest on `clients/python/tests` in the test venv `.ci/clients-venv`
//! against a fleet of [`client_fleet`]. The venv holds the pinned
//! `clients/python/requirements-test.txt` and the client itself, editable;
//! `scripts/test` makes it:
//!
//! ```sh
//! python3 -m venv .ci/clients-venv
//! .ci/clients-venv/bin/pip install --require-hashes --no-deps -r clients/python/requirements-test.txt
//! .ci/clients-venv/bin/pip install --no-deps --no-build-isolation -e clients/python
//! ```
//!
//! `GLIA_PYTEST_ARGS` (split on spaces) replaces the default `tests`, e.g.
//! `tests/test_stream.py tests/test_batches.py` to run those files only.

use std::process::Command;

use super::{client_fleet, root, run_suite};

#[test]
fn python_client_suite() {
    let venv = root().join(".ci/clients-venv/bin/python");
    let ready = Command::new(&venv)
        .args(["-c", "import glia_client, pytest, datamodel_code_generator"])
        .status()
        .is_ok_and(|s| s.success());
    if glia_testkit::require(
        ready.then_some(()),
        format!(
            "the Python client's test venv ({}, with glia_client, pytest and datamodel-code-generator)",
            venv.display()
        ),
        "python3 -m venv .ci/clients-venv; .ci/clients-venv/bin/pip install --require-hashes --no-deps -r clients/python/requirements-test.txt; .ci/clients-venv/bin/pip install --no-deps --no-build-isolation -e clients/python; scripts/test does",
    )
    .is_none()
    {
        return;
    }
    let fleet = client_fleet();
    let mut pytest = Command::new(&venv);
    pytest.args(["-m", "pytest", "-q", "-p", "no:cacheprovider"]);
    match std::env::var("GLIA_PYTEST_ARGS") {
        Ok(args) if !args.trim().is_empty() => pytest.args(args.split_whitespace()),
        _ => pytest.arg("tests"),
    };
    run_suite(&fleet, pytest, &root().join("clients/python"));
}
