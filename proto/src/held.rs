//! A tool call's outcome held between its end and its commit: the value the
//! loop hands its sink and the worker keeps in the ledger.

use serde::{Deserialize, Serialize};

use crate::{ToolContent, ToolErrorKind};

/// A tool call's outcome, held in the ledger (`glia_backends::Ledger`) by the worker that ran the
/// call from the moment it exists until it is committed to the event log
/// (see `glia_backends::Ledger::hold_results`). JSON: `{"call_id": "c1", "content": …,
/// "error": "failed", "duration_ms": 12}` (`error` absent for a result).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldResult {
    /// The call's id in the run.
    pub call_id: String,
    /// The result as the tool returned it (before `after_tool_call` hooks),
    /// or the error text of a failure.
    pub content: ToolContent,
    /// `None` for a result; why the call failed otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ToolErrorKind>,
    /// Active time of the call in ms.
    pub duration_ms: u64,
}

/// What the ledger knows of a call, by its idempotency key, when the next
/// worker finds the call cleared and without a result in the log.
#[derive(Debug, Clone, PartialEq)]
pub enum Held {
    /// The call may still be running: the worker that started it marked it
    /// (`glia_backends::Ledger::mark_running`) and has refreshed the mark
    /// within [`RUNNING_MARK_TTL`], though it no longer holds the run's
    /// lease (the database was away longer than the lease). Its outcome
    /// will be held when the call returns; until the mark lapses, nobody
    /// may call it interrupted.
    Running,
    /// The call returned and its outcome was held but not committed.
    Finished(HeldResult),
}

/// How long a worker's mark on a running call lasts without a refresh
/// (15 s): the longest a call whose worker died (or lost the ledger) keeps
/// the next worker from calling it interrupted.
pub const RUNNING_MARK_TTL: std::time::Duration = std::time::Duration::from_secs(15);

/// How often the worker running a tool call refreshes its mark (3 s), each
/// refresh given at most as long: while the ledger answers, a mark is
/// renewed at least every 6 s, and [`RUNNING_MARK_TTL`] also covers the
/// screening and the hold after the calls return (the hold removes the
/// mark).
pub const RUNNING_MARK_REFRESH: std::time::Duration = std::time::Duration::from_secs(3);
