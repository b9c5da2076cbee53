//! The in-memory twin passes the event log contract.

use glia_backends::conformance;
use glia_backends::memory::MemoryLog;

#[tokio::test]
async fn memory_log_conformance() {
    conformance::all(|| async { MemoryLog::default() }).await;
}
