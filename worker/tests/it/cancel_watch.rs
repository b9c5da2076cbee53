//! The worker's one watch of cancel flags (`glia_worker::cancel_watch`),
//! over a ledger that announces cancellations through a channel the test
//! drives and answers flag reads from a set, counting them: an
//! announcement reaches the run it names at once, a resubscription marker
//! reads every watched run's flag in one call, and nothing is read per run.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use glia_backends::{Ledger, LedgerError, Signal};
use glia_proto::LiveEvent;
use glia_worker::cancel_watch::CancelWatch;
use tokio::sync::mpsc;
use uuid::Uuid;

#[derive(Default)]
struct Announcing {
    flagged: Mutex<HashSet<Uuid>>,
    announce: Mutex<Option<mpsc::UnboundedReceiver<Option<Uuid>>>>,
    /// Per-run flag reads (`is_cancelled`, `signal`) and batch reads.
    reads: Mutex<(usize, usize)>,
    /// Subscriptions to refuse (the store is down) before one is made.
    refuse: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl Ledger for Announcing {
    async fn cancel(&self, run_id: Uuid) -> Result<(), LedgerError> {
        self.flagged.lock().unwrap().insert(run_id);
        Ok(())
    }
    async fn is_cancelled(&self, run_id: Uuid) -> Result<bool, LedgerError> {
        self.reads.lock().unwrap().0 += 1;
        Ok(self.flagged.lock().unwrap().contains(&run_id))
    }
    async fn cancelled_among(&self, runs: &[Uuid]) -> Result<Vec<Uuid>, LedgerError> {
        self.reads.lock().unwrap().1 += 1;
        let flagged = self.flagged.lock().unwrap();
        Ok(runs
            .iter()
            .filter(|r| flagged.contains(r))
            .copied()
            .collect())
    }
    async fn watch_cancellations(
        &self,
    ) -> Result<Option<BoxStream<'static, Option<Uuid>>>, LedgerError> {
        let refuse = &self.refuse;
        if refuse.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            refuse.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            return Err(LedgerError::Unavailable("down".into()));
        }
        let rx = self.announce.lock().unwrap().take().expect("watched once");
        Ok(Some(
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) })
                .boxed(),
        ))
    }
    async fn set_paused(&self, _: Uuid, _: bool) -> Result<(), LedgerError> {
        Ok(())
    }
    async fn signal(&self, run_id: Uuid) -> Result<Signal, LedgerError> {
        Ok(Signal {
            cancelled: self.is_cancelled(run_id).await?,
            paused: false,
        })
    }
    async fn publish_live(&self, _: Uuid, _: &LiveEvent) -> Result<(), LedgerError> {
        Ok(())
    }
    async fn subscribe_live(&self, _: Uuid) -> Result<BoxStream<'static, LiveEvent>, LedgerError> {
        Ok(futures::stream::pending().boxed())
    }
    async fn ready(&self) -> Result<(), LedgerError> {
        Ok(())
    }
}

async fn flagged(rx: &mut tokio::sync::watch::Receiver<bool>) {
    tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|c| *c))
        .await
        .expect("flagged in time")
        .expect("watched");
}

#[tokio::test]
async fn one_watch_serves_every_run_and_reads_them_all_after_a_resubscription() {
    let (tx, rx) = mpsc::unbounded_channel();
    let ledger = Arc::new(Announcing {
        announce: Mutex::new(Some(rx)),
        ..Default::default()
    });
    let watch = CancelWatch::start(ledger.clone())
        .await
        .expect("it announces");
    let runs: Vec<Uuid> = (0..100).map(|_| Uuid::now_v7()).collect();
    let mut watched: Vec<_> = runs.iter().map(|r| watch.watch(*r)).collect();
    assert_eq!(watch.watched(), 100);

    // An announcement reaches the run it names, and only it.
    ledger.cancel(runs[7]).await.unwrap();
    tx.send(Some(runs[7])).unwrap();
    flagged(&mut watched[7].cancelled).await;
    assert!(!*watched[8].cancelled.borrow());

    // Flagged while the subscription was away: found after it is back,
    // by one read of every watched run.
    ledger.cancel(runs[42]).await.unwrap();
    ledger.cancel(runs[99]).await.unwrap();
    tx.send(None).unwrap();
    flagged(&mut watched[42].cancelled).await;
    flagged(&mut watched[99].cancelled).await;
    assert!(!*watched[8].cancelled.borrow());
    assert_eq!(*ledger.reads.lock().unwrap(), (0, 1), "no read per run");

    // A run let go is no longer watched; an announcement for it is ignored.
    let gone = watched.remove(3);
    drop(gone);
    assert_eq!(watch.watched(), 99);
    tx.send(Some(runs[3])).unwrap();
    // Watching a run again (taken up later) starts from its flag unset.
    let mut again = watch.watch(runs[7]);
    assert!(!*again.cancelled.borrow());
    tx.send(Some(runs[7])).unwrap();
    flagged(&mut again.cancelled).await;
}

/// Hangs on every model call.
struct Hang;

#[glia_agent::async_trait]
impl glia_agent::provider::Provider for Hang {
    async fn generate(
        &self,
        _: &glia_agent::provider::ModelRequest,
        _: &(dyn Fn(LiveEvent) + Send + Sync),
    ) -> Result<glia_agent::provider::ModelResponse, glia_agent::provider::ProviderError> {
        futures::future::pending().await
    }
}

/// A real worker whose run hangs in a model call learns of the cancel from
/// the announcement alone: the flag reads (per run, and the commits'
/// signal) never say cancelled here, so no poll could have found it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_call_in_flight_is_cancelled_by_the_announcement() {
    use glia_backends::memory::{MemoryLog, MemoryQueue};
    use glia_backends::{Inbox, JobQueue, NewRun, Outbox, RunLog};
    use glia_proto::{Event, EventKind, Outcome, Payload, RunConfig};
    use glia_worker::consumer::{Worker, WorkerOptions};

    let (tx, rx) = mpsc::unbounded_channel();
    let ledger = Arc::new(Announcing {
        announce: Mutex::new(Some(rx)),
        ..Default::default()
    });
    let log = Arc::new(MemoryLog::default());
    let queue = Arc::new(MemoryQueue::default());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (l, q) = (log.clone(), queue.clone());
    let relay = tokio::spawn(async move {
        loop {
            for (id, job) in l.outbox(100).await.unwrap() {
                q.publish(&job).await.unwrap();
                l.outbox_done(&[id]).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let worker = Arc::new(Worker::new(
        Arc::new(glia_agent::Agent::new(Arc::new(Hang))),
        log.clone(),
        queue.clone(),
        ledger.clone(),
        WorkerOptions {
            id: "w-watch".into(),
            concurrency: 2,
            lease_ttl: Duration::from_secs(30),
        },
    ));
    tokio::spawn(worker.run(stopped));
    let run_id = Uuid::now_v7();
    log.create_run(NewRun {
        tenant: "t".into(),
        idempotency_key: None,
        batch_id: None,
        start: Event {
            run_id,
            seq: 1,
            at: chrono::Utc::now(),
            kind: EventKind::SessionStart {
                redactions: Vec::new(),
                goal: "go".into(),
                config: RunConfig::default(),
            },
        },
        tags: Vec::new(),
        metadata: Default::default(),
        custom_id: None,
        parent_run_id: None,
        parent_call_id: None,
        depth: 0,
    })
    .await
    .unwrap();
    let in_call = || async {
        log.events(run_id, 0, 100)
            .await
            .unwrap()
            .iter()
            .any(|e| matches!(e.kind, EventKind::ModelCall { .. }))
    };
    tokio::time::timeout(Duration::from_secs(60), async {
        while !in_call().await {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the model call starts");
    log.post(
        run_id,
        Payload::Cancel {
            reason: "stop".into(),
        },
    )
    .await
    .unwrap();
    tx.send(Some(run_id)).unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let state = log.load(run_id).await.unwrap();
            if let Some(outcome) = state.outcome {
                return outcome;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the run ends");
    assert_eq!(
        outcome,
        Outcome::Cancelled {
            reason: "stop".into()
        }
    );
    let _ = stop.send(true);
    relay.abort();
}

/// A store down when the worker starts: the watch is made anyway and
/// subscribes once the store answers, then reads what was flagged
/// meanwhile.
#[tokio::test(start_paused = true)]
async fn a_watch_made_while_the_store_is_down_subscribes_later() {
    let (tx, rx) = mpsc::unbounded_channel();
    let ledger = Arc::new(Announcing {
        announce: Mutex::new(Some(rx)),
        refuse: std::sync::atomic::AtomicUsize::new(2),
        ..Default::default()
    });
    let watch = CancelWatch::start(ledger.clone())
        .await
        .expect("made anyway");
    let run = Uuid::now_v7();
    let mut watched = watch.watch(run);
    ledger.cancel(run).await.unwrap();
    flagged(&mut watched.cancelled).await;
    assert_eq!(ledger.refuse.load(std::sync::atomic::Ordering::SeqCst), 0);
    // Subscribed now: announcements arrive.
    let other = watch.watch(Uuid::now_v7());
    let mut other_flag = other.cancelled.clone();
    tx.send(Some(other.run_id())).unwrap();
    flagged(&mut other_flag).await;
}
