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
//! ([`CancelWatch::watch`] answers a [`Watched`] that stops on drop). The
//! flag is also read at each commit ([`Ledger::signal`]), which covers a
//! cancel flagged before the run was watched.

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

/// The runs a worker watches, each with the sender of its flag.
pub struct CancelWatch {
    runs: Mutex<HashMap<Uuid, (u64, watch::Sender<bool>)>>,
    next: std::sync::atomic::AtomicU64,
}

/// A watched run: its flag (true once cancelled); unwatched on drop.
pub struct Watched {
    run: Uuid,
    id: u64,
    watch: Arc<CancelWatch>,
    /// Becomes true when the run is flagged as cancelled.
    pub cancelled: watch::Receiver<bool>,
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
    /// `None` when the ledger announces nothing, or its subscription
    /// cannot be made now (logged): runs then poll their flags.
    pub async fn start(ledger: Arc<dyn Ledger>) -> Option<Arc<CancelWatch>> {
        let stream = match ledger.watch_cancellations().await {
            Ok(Some(stream)) => stream,
            Ok(None) => return None,
            Err(e) => {
                warn!(error = %e, "cannot watch cancellations; each run polls its cancel flag");
                return None;
            }
        };
        let watch = Arc::new(CancelWatch {
            runs: Mutex::new(HashMap::new()),
            next: std::sync::atomic::AtomicU64::new(0),
        });
        tokio::spawn(serve(Arc::downgrade(&watch), ledger, stream));
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

/// Serve announcements and catch-up reads until the watch is dropped.
async fn serve(
    watch: Weak<CancelWatch>,
    ledger: Arc<dyn Ledger>,
    mut stream: futures::stream::BoxStream<'static, Option<Uuid>>,
) {
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
