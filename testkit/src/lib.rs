//! Test support for glia, shared by every crate's tests and by the
//! end-to-end suite in `tests/` (`glia-e2e`). One home for each helper:
//!
//! - [`isolation`] (re-exported from `glia_backends::testkit`): a private
//!   database ([`TestDb`]), Redis key prefix ([`RedisKeys`]), temporary
//!   directory ([`TempDir`]), private RabbitMQ and Redis servers
//!   ([`PrivateRabbit`], [`PrivateRedis`]), [`free_port`];
//! - [`postgres`]: a private PostgreSQL cluster ([`PrivatePostgres`]) that a
//!   test may stop fast, crash (`-m immediate`) and start again;
//! - [`http`]: the recorded-traffic HTTP server (replays recorded provider
//!   answers, records what it received);
//! - [`EventLog`] (from `glia_proto::testing`): an event log built one
//!   checked transition at a time;
//! - [`tools`]: the `add` tool, a slow tool, and a side-effecting tool that
//!   appends each execution to a ledger file;
//! - [`bin`]: the `glia` binary cargo built for this workspace;
//! - [`lying_mcp`]: an MCP server whose annotations lie and whose tools
//!   count their executions in a file (stdio and streamable HTTP);
//! - [`proxy`]: a userspace TCP proxy with a switch, and a network
//!   partition of one process built from one proxy per service;
//! - [`require`](mod@require): the one rule for a test that cannot find or start what it
//!   needs (`GLIA_TEST_STRICT=1`: fail; otherwise a loud SKIPPED);
//! - [`fleet`]: dispatcher and worker processes on an isolated database,
//!   queue and prefix, with their logs captured, and the client side
//!   (submit, drive every pull point, check logs and effects).
//!
//! The machine's services are found through `GLIA_DATABASE_URL` (admin
//! database), `GLIA_AMQP_URL` and `GLIA_REDIS_URL`, defaulting to the
//! local Postgres, RabbitMQ and Redis on their standard ports.

pub mod bin;
pub mod fleet;
pub mod http;
pub mod isolation;
pub mod lying_mcp;
pub mod mcp_serve;
pub mod odd_mcp;
pub mod postgres;
pub mod proxy;
pub mod require;
pub mod signed;
pub mod tools;

pub use glia_backends::testkit::{
    PrivateRabbit, PrivateRedis, RedisKeys, TempDir, TestDb, free_port,
};
pub use glia_proto::testing::EventLog;
pub use postgres::PrivatePostgres;
pub use require::{require, require_ok};

/// The workspace's root directory (where `Cargo.toml`, `examples/` and
/// `providers/tests/fixtures/` are).
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit/ has a parent")
        .to_path_buf()
}
