//! The in-memory twin passes the event log contract.

use glia_backends::conformance;
use glia_backends::memory::{MemoryLog, MemoryQueue};

#[tokio::test]
async fn memory_log_conformance() {
    conformance::all(|| async { MemoryLog::default() }).await;
}

#[tokio::test]
async fn memory_batches_conformance() {
    let log = std::sync::Arc::new(MemoryLog::default());
    let store = glia_backends::batches::MemoryBatches::new(log.clone());
    conformance::batch_store(&*log, &store).await;
}

#[tokio::test]
async fn memory_queue_resumes_before_starts() {
    conformance::resumes_before_starts(&MemoryQueue::default(), 50).await;
}

#[tokio::test]
async fn memory_holds_tool_results() {
    let ledger = glia_backends::memory::MemoryLedger::default();
    conformance::holds_tool_results(&ledger).await;
}
