//! Tools for tests of the agent loop and the fleet.
//!
//! - [`Add`]: adds two integers; idempotent.
//! - [`SlowTool`]: takes a given time, then answers; not idempotent (a call
//!   interrupted by a crash is not re-run blindly).
//! - [`LedgerTool`]: a consequential, side-effecting tool that appends one
//!   line `<name> <idempotency key>` to a ledger file per execution, so a
//!   test can count executions independently of the event log.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use glia_worker::tool::{Tool, ToolContext, ToolFailure};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

// Arguments of `Add`: two integers. (Plain comments, not doc comments:
// schemars would put docs into the tool's JSON schema, which recorded
// provider requests pin.)
#[derive(Deserialize, JsonSchema)]
pub struct AddArgs {
    pub a: i64,
    pub b: i64,
}

/// `add`: `{"a": i64, "b": i64}` → `{"sum": a + b}` (wrapping); idempotent.
pub struct Add;

impl Tool for Add {
    type Args = AddArgs;
    type Output = Value;
    fn name(&self) -> &str {
        "add"
    }
    fn description(&self) -> &str {
        "Add two integers."
    }
    fn idempotent(&self) -> bool {
        true
    }
    async fn call(&self, args: AddArgs, _ctx: ToolContext) -> Result<Value, ToolFailure> {
        Ok(json!({ "sum": args.a.wrapping_add(args.b) }))
    }
}

// Arguments of `SlowTool` and `LedgerTool`: any object (see `AddArgs`).
#[derive(Deserialize, JsonSchema)]
pub struct AnyArgs {}

/// `slow`: sleeps for its duration, then answers `"done"`; not idempotent.
/// Its timeout is twice the duration plus a second.
pub struct SlowTool(pub Duration);

impl Tool for SlowTool {
    type Args = AnyArgs;
    type Output = String;
    fn name(&self) -> &str {
        "slow"
    }
    fn description(&self) -> &str {
        "Takes a while, then answers."
    }
    fn timeout(&self) -> Duration {
        self.0 * 2 + Duration::from_secs(1)
    }
    async fn call(&self, _args: AnyArgs, _ctx: ToolContext) -> Result<String, ToolFailure> {
        tokio::time::sleep(self.0).await;
        Ok("done".into())
    }
}

/// A consequential tool named `name` that appends `"<name> <idempotency
/// key>\n"` to `ledger` on each execution (after `delay`), then answers
/// `{"done": true, "idempotency_key": …}`. Not idempotent.
pub struct LedgerTool {
    /// The tool's name.
    pub name: String,
    /// The ledger file (created on first use).
    pub ledger: PathBuf,
    /// Time taken before the effect.
    pub delay: Duration,
}

impl LedgerTool {
    /// The executions recorded in `ledger` so far, one `(name, key)` per line.
    pub fn executions(ledger: &std::path::Path) -> Vec<(String, String)> {
        std::fs::read_to_string(ledger).unwrap_or_default().lines().filter_map(|l| l.split_once(' ')).map(|(n, k)| (n.to_owned(), k.to_owned())).collect()
    }
}

impl Tool for LedgerTool {
    type Args = AnyArgs;
    type Output = Value;
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        "Performs an effect once per execution, recorded in a ledger."
    }
    async fn call(&self, _args: AnyArgs, ctx: ToolContext) -> Result<Value, ToolFailure> {
        tokio::time::sleep(self.delay).await;
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&self.ledger).map_err(|e| ToolFailure::failed(format!("ledger: {e}")))?;
        writeln!(f, "{} {}", self.name, ctx.idempotency_key).map_err(|e| ToolFailure::failed(format!("ledger: {e}")))?;
        Ok(json!({ "done": true, "idempotency_key": ctx.idempotency_key }))
    }
}
