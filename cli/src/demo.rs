//! The tools `glia run`, `glia worker` and `glia dev` offer scripts: small,
//! deterministic, offline.
//!
//! `refund_order` has a side effect a test can count: with
//! `GLIA_DEMO_EFFECTS=FILE` it appends `refund <idempotency key>` to FILE
//! (`replay <key>` for a key already applied: it honours the key like a
//! payments API), and with `GLIA_DEMO_TOOL_DELAY_MS=N` it takes N ms first
//! (a window for fault injection).

use glia_agent::tool::{Tool, ToolContext, ToolFailure, ToolRegistry};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

/// An arithmetic operation.
#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Op {
    Add,
    Sub,
    Mul,
    Div,
}

/// Arguments of `calculator`.
#[derive(Deserialize, JsonSchema)]
struct CalcArgs {
    op: Op,
    a: f64,
    b: f64,
}

struct Calculator;

impl Tool for Calculator {
    type Args = CalcArgs;
    type Output = Value;
    fn name(&self) -> &str {
        "calculator"
    }
    fn description(&self) -> &str {
        "Apply add, sub, mul or div to two numbers."
    }
    fn idempotent(&self) -> bool {
        true
    }
    async fn call(&self, args: CalcArgs, _ctx: ToolContext) -> Result<Value, ToolFailure> {
        let value = match args.op {
            Op::Add => args.a + args.b,
            Op::Sub => args.a - args.b,
            Op::Mul => args.a * args.b,
            Op::Div if args.b == 0.0 => return Err(ToolFailure::failed("division by zero")),
            Op::Div => args.a / args.b,
        };
        Ok(json!({ "result": value }))
    }
}

/// Arguments of `get_order` and `refund_order`.
#[derive(Deserialize, JsonSchema)]
struct OrderArgs {
    /// Order id, e.g. `A1`.
    order_id: String,
}

struct GetOrder;

impl Tool for GetOrder {
    type Args = OrderArgs;
    type Output = Value;
    fn name(&self) -> &str {
        "get_order"
    }
    fn description(&self) -> &str {
        "Look up an order by id."
    }
    fn idempotent(&self) -> bool {
        true
    }
    async fn call(&self, args: OrderArgs, _ctx: ToolContext) -> Result<Value, ToolFailure> {
        match args.order_id.as_str() {
            "A1" => Ok(
                json!({ "order_id": "A1", "item": "headphones", "amount_usd": 59.0, "status": "delivered" }),
            ),
            other => Err(ToolFailure::failed(format!("no order {other}"))),
        }
    }
}

struct RefundOrder;

impl Tool for RefundOrder {
    type Args = OrderArgs;
    type Output = Value;
    fn name(&self) -> &str {
        "refund_order"
    }
    fn description(&self) -> &str {
        "Refund an order in full."
    }
    async fn call(&self, args: OrderArgs, ctx: ToolContext) -> Result<Value, ToolFailure> {
        if let Some(ms) = std::env::var("GLIA_DEMO_TOOL_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
        if let Ok(path) = std::env::var("GLIA_DEMO_EFFECTS") {
            record_refund(std::path::Path::new(&path), &ctx.idempotency_key)
                .map_err(|e| ToolFailure::failed(format!("effects file {path}: {e}")))?;
        }
        Ok(
            json!({ "order_id": args.order_id, "refunded": true, "idempotency_key": ctx.idempotency_key }),
        )
    }
}

/// Record a refund in the effects file the way a payments API honours an
/// idempotency key: under an exclusive file lock (workers are separate
/// processes), the first delivery of `key` appends `refund <key>` (applied),
/// a later one `replay <key>` (answered from the first, nothing applied).
/// A worker frozen past its lease (SIGSTOP, a stalled VM) can still deliver
/// a call it started after another worker re-ran it on a re-approval; the
/// key is what keeps the refund single (see RELIABILITY.md).
fn record_refund(path: &std::path::Path, key: &str) -> std::io::Result<()> {
    use std::io::{Read, Write};
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(path)?;
    file.lock()?;
    let mut ledger = String::new();
    file.read_to_string(&mut ledger)?;
    let applied = ledger
        .lines()
        .any(|l| l.strip_prefix("refund ") == Some(key));
    // One write of the whole line: a process killed mid-call never leaves
    // half a line, and a reader never sees one.
    let line = format!("{} {key}\n", if applied { "replay" } else { "refund" });
    file.write_all(line.as_bytes())
}

/// `calculator`, `get_order`, `refund_order`.
pub fn tools() -> ToolRegistry {
    let mut tools = ToolRegistry::default();
    tools
        .register(Calculator)
        .register(GetOrder)
        .register(RefundOrder);
    tools
}
