//! Approval records: one per approval a run asked for, read by operators
//! and by the deadline sweep.
//!
//! # Contract
//!
//! - Records are written by [`RunLog::commit`](crate::RunLog::commit) only:
//!   requested when a run parks for approval, resolved when it applies a
//!   decision, closed when it ends. This port reads them
//!   ([`Approvals::approvals`]) and marks them escalated
//!   ([`Approvals::escalate`]); a decision itself is a payload
//!   ([`Inbox::post`](crate::Inbox::post)).

use async_trait::async_trait;
use uuid::Uuid;

use crate::{ApprovalFilter, ApprovalRow, LogError};

/// Approval records. See the [module](self) for the contract.
#[async_trait]
pub trait Approvals: Send + Sync {
    /// Approvals, oldest first.
    async fn approvals(&self, filter: &ApprovalFilter) -> Result<Vec<ApprovalRow>, LogError>;

    /// Mark a pending approval escalated (idempotent). Errors:
    /// [`LogError::NotFound`] when the run has no such approval.
    async fn escalate(&self, run_id: Uuid, call_id: &str) -> Result<(), LogError>;
}
