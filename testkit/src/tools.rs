//! Tools for tests of the agent loop: [`Add`] adds two integers; idempotent.
//! Process-level tests use the `glia` binary's demo tools instead: its
//! `refund_order` is the slow (`GLIA_DEMO_TOOL_DELAY_MS`), consequential
//! tool that records each execution in its own ledger (`GLIA_DEMO_EFFECTS`,
//! see `cli/src/demo.rs`).

use glia_agent::tool::{Tool, ToolContext, ToolFailure};
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
