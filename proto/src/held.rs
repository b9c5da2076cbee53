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
