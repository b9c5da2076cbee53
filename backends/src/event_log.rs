//! The run store's port, by concern. Each concern is a trait of its own,
//! with its contract in its module:
//!
//! - [`RunLog`] ([`runs`]): runs, their append-only events, leases and
//!   checkpoints.
//! - [`Inbox`] ([`inbox`]): payloads posted to runs, and a worker's open and
//!   release around them.
//! - [`Approvals`] ([`approvals`]): approval records.
//! - [`Outbox`] ([`outbox`]): jobs awaiting relay and runs awaiting a job.
//! - [`AgentRegistry`] ([`agents`]): agent definitions.
//! - [`Reports`] ([`reports`]): tenant usage, readiness, gauges.
//! - [`Waits`] ([`waits`]): due timers and event waits, kept events.
//!
//! [`model`] holds the records they take and answer, and [`crate::LogError`].
//!
//! [`EventLog`] is all of them: what an adapter is and what a process that
//! needs the whole store holds (`Arc<dyn EventLog>`). Code that needs one
//! concern takes the narrow trait; a `&dyn EventLog` coerces to any of them.
//!
//! Every adapter implements the six traits in this order, one `impl` block
//! each: [`crate::memory::MemoryLog`], [`crate::postgres::PgLog`],
//! [`crate::sqlite::SqliteLog`].

pub mod agents;
pub mod approvals;
pub mod inbox;
pub mod model;
pub mod outbox;
pub mod reports;
pub mod runs;
pub mod waits;

pub use agents::AgentRegistry;
pub use approvals::Approvals;
pub use inbox::Inbox;
pub use outbox::Outbox;
pub use reports::Reports;
pub use runs::RunLog;
pub use waits::{DueWait, Waits};

/// The run store. Postgres in the fleet, [`crate::memory::MemoryLog`] in
/// `glia dev`.
///
/// Every write that causes work writes a [`Job`](crate::Job) to the outbox
/// in the same transaction; a relay publishes outbox jobs after commit.
///
/// Implemented for every type that implements the six concerns; there is
/// nothing else to implement.
pub trait EventLog: RunLog + Inbox + Approvals + Outbox + AgentRegistry + Reports + Waits {}

impl<T> EventLog for T where T: RunLog + Inbox + Approvals + Outbox + AgentRegistry + Reports + Waits
{}
