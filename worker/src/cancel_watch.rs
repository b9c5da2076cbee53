//! One watch of the cancel flags for every run a worker advances.
//!
//! Without it, each run in flight reads its own flag every
//! [`crate::consumer::CANCEL_POLL`] while a model call or a tool runs:
//! 10,000 runs waiting on a slow model are 10,000 reads a second. With a
//! ledger that announces cancellations ([`Ledger::watch_cancellations`]:
//! Redis pub/sub), a worker holds one subscription: a cancel reaches the
//! run it names at once; after the subscription was lost and made again,
//! and every [`SAFETY_POLL`] besides, the flags of all watched runs are
//! read in one round trip ([`Ledger::cancelled_among`]), so a cancel missed
//! meanwhile is found. A ledger that announces nothing (in memory, SQLite:
//! local reads) is polled per run as before.
//!
//! A run is watched from when its lease is taken until it is let go
//! ([`CancelWatch::watch`] answers a [`Watched`] that stops on drop); its
//! flag is read once when it is watched (a cancel flagged before), and at
//! each commit ([`Ledger::signal`]). When the subscription cannot be made
//! (Redis down as the worker starts) it is tried again every
//! [`RESUBSCRIBE_EVERY`], with the catch-up read once it is made; runs
//! still end on their flags read at commits meanwhile.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use glia_backends::Ledger;
use tokio::sync::watch;
use tracing::{debug, warn};
use uuid::Uuid;

/// How often every watched run's flag is read anyway (one round trip per
/// worker), in case an announcement was lost without the subscription
/// noticing.
pub const SAFETY_POLL: Duration = Duration::from_secs(30);

/// How often a subscription that could not be made is tried again.
pub const RESUBSCRIBE_EVERY: Duration = Duration::from_secs(5);

/// The runs a worker watches, each with the sender of its flag.
pub struct CancelWatch {
    runs: Mutex<HashMap<Uuid, (u64, watch::Sender<bool>)>>,
    next: std::sync::atomic::AtomicU64,
    /// The task serving it, stopped when the watch is dropped.
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for CancelWatch {
    fn drop(&mut self) {
        if let Some(task) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            task.abort();
        }
    }
}

/// A watched run: its flag (true once cancelled); unwatched on drop.
pub struct Watched {
    run: Uuid,
    id: u64,
    watch: Arc<CancelWatch>,
    /// Becomes true when the run is flagged as cancelled.
    pub cancelled: watch::Receiver<bool>,
}

impl Watched {
    /// The run watched.
    pub fn run_id(&self) -> Uuid {
        self.run
    }

    /// Flag the run as cancelled (its flag was read set).
    pub fn flag(&self) {
        self.watch.flag(self.run);
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let mut runs = self.watch.lock();
        if runs.get(&self.run).is_some_and(|(id, _)| *id == self.id) {
            runs.remove(&self.run);
        }
    }
}

impl CancelWatch {
    /// Subscribe to `ledger`'s cancellations and serve them to watched
    /// runs on a task of its own (ending when the watch is dropped).
    /// `None` when the ledger announces nothing: runs then poll their
    /// flags. A subscription that cannot be made now is tried again in the
    /// background (logged).
    pub async fn start(ledger: Arc<dyn Ledger>) -> Option<Arc<CancelWatch>> {
        let stream = match ledger.watch_cancellations().await {
            Ok(Some(stream)) => Some(stream),
            Ok(None) => return None,
            Err(e) => {
                warn!(error = %e, "cannot watch cancellations yet; trying again every {} s", RESUBSCRIBE_EVERY.as_secs());
                None
            }
        };
        let watch = Arc::new(CancelWatch {
            runs: Mutex::new(HashMap::new()),
            next: std::sync::atomic::AtomicU64::new(0),
            task: Mutex::new(None),
        });
        let task = tokio::spawn(serve(Arc::downgrade(&watch), ledger, stream));
        *watch.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        Some(watch)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, (u64, watch::Sender<bool>)>> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Watch `run` until the answer is dropped.
    pub fn watch(self: &Arc<Self>, run: Uuid) -> Watched {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = watch::channel(false);
        self.lock().insert(run, (id, tx));
        Watched {
            run,
            id,
            watch: self.clone(),
            cancelled: rx,
        }
    }

    /// How many runs are watched now.
    pub fn watched(&self) -> usize {
        self.lock().len()
    }

    fn flag(&self, run: Uuid) {
        if let Some((_, tx)) = self.lock().get(&run) {
            tx.send_replace(true);
        }
    }

    fn runs(&self) -> Vec<Uuid> {
        self.lock().keys().copied().collect()
    }
}

/// Serve announcements and catch-up reads until the watch is dropped;
/// without a subscription (`stream` `None`), make one first.
async fn serve(
    watch: Weak<CancelWatch>,
    ledger: Arc<dyn Ledger>,
    stream: Option<futures::stream::BoxStream<'static, Option<Uuid>>>,
) {
    let mut stream = match stream {
        Some(stream) => stream,
        None => loop {
            tokio::time::sleep(RESUBSCRIBE_EVERY).await;
            if watch.strong_count() == 0 {
                return;
            }
            match ledger.watch_cancellations().await {
                // Subscribed at last: read what was flagged meanwhile.
                Ok(Some(stream)) => {
                    break futures::stream::once(async { None }).chain(stream).boxed();
                }
                Ok(None) => return,
                Err(e) => debug!(error = %e, "cancellations not watched yet"),
            }
        },
    };
    let mut poll = tokio::time::interval(SAFETY_POLL);
    poll.tick().await;
    loop {
        let catch_up = tokio::select! {
            next = stream.next() => match next {
                Some(Some(run)) => {
                    let Some(watch) = watch.upgrade() else { return };
                    watch.flag(run);
                    false
                }
                // Resubscribed: what was announced meanwhile is lost.
                Some(None) => true,
                None => {
                    warn!("the cancellation watch ended; watched runs are read every {} s", SAFETY_POLL.as_secs());
                    stream = futures::stream::pending().boxed();
                    true
                }
            },
            _ = poll.tick() => true,
        };
        if catch_up {
            let Some(watch) = watch.upgrade() else { return };
            let runs = watch.runs();
            if runs.is_empty() {
                continue;
            }
            match ledger.cancelled_among(&runs).await {
                Ok(flagged) => {
                    debug!(
                        watched = runs.len(),
                        flagged = flagged.len(),
                        "cancel flags read"
                    );
                    for run in flagged {
                        watch.flag(run);
                    }
                }
                Err(e) => {
                    warn!(error = %e, "cancel flags not read; trying again in {} s", SAFETY_POLL.as_secs())
                }
            }
        }
    }
}
