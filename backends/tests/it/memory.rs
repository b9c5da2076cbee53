//! The in-memory twin passes the event log contract.

use glia_backends::conformance;
use glia_backends::memory::{MemoryLog, MemoryQueue};

#[tokio::test]
async fn memory_log_conformance() {
    conformance::all(|| async { MemoryLog::default() }).await;
    conformance::listing::all(|| async { MemoryLog::default() }).await;
    conformance::children::all(|| async { MemoryLog::default() }).await;
}

#[tokio::test]
async fn memory_batches_conformance() {
    let log = std::sync::Arc::new(MemoryLog::default());
    let store = glia_backends::batches::MemoryBatches::new(log.clone());
    conformance::batch_store(&*log, &store).await;
}

#[tokio::test]
async fn memory_schedules_conformance() {
    conformance::schedules::all(&glia_backends::schedules::MemorySchedules::default()).await;
}

#[tokio::test]
async fn memory_evals_conformance() {
    conformance::evals::all(&glia_backends::evals::MemoryEvals::default()).await;
}

#[tokio::test]
async fn memory_queue_resumes_before_starts() {
    conformance::resumes_before_starts(&MemoryQueue::default(), 50).await;
}

#[tokio::test]
async fn memory_marks_running_calls() {
    conformance::marks_running_calls(&glia_backends::memory::MemoryLedger::default()).await;
}

#[tokio::test]
async fn memory_holds_tool_results() {
    let ledger = glia_backends::memory::MemoryLedger::default();
    conformance::holds_tool_results(&ledger).await;
}

/// A consumer waiting for a resume (a worker whose free slots are all kept
/// for resumes) does not hold back another consumer's start, and still gets
/// the next resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_queue_a_consumer_waiting_for_a_resume_does_not_hold_back_starts() {
    use glia_backends::{Job, JobQueue};
    use std::time::Duration;
    let queue = std::sync::Arc::new(MemoryQueue::default());
    let waiting = tokio::spawn({
        let queue = queue.clone();
        async move { queue.next_resume().await.map(|d| d.job) }
    });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let start = Job::start(uuid::Uuid::now_v7(), 1);
    queue.publish(&start).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(60), queue.next())
        .await
        .expect("the start is not held back by the consumer waiting for a resume")
        .unwrap();
    assert_eq!(got.job, start);
    let resume = Job {
        resume: true,
        ..Job::start(uuid::Uuid::now_v7(), 3)
    };
    queue.publish(&resume).await.unwrap();
    let waited = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("the waiting consumer gets the resume")
        .unwrap()
        .unwrap();
    assert_eq!(waited, resume);
}

// issue 32: waits
#[tokio::test]
async fn memory_waits_conformance() {
    conformance::waits::waits(&MemoryLog::default()).await;
}
