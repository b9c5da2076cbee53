//! Time as the providers see it: "now" for rate-limit buckets and HTTP-date
//! `retry-after` headers, and sleeping between retries and rate-limit waits.
//!
//! Production uses [`SystemClock`]. Tests inject their own clock, so a
//! 16-second `retry-after` is shown in milliseconds of real time.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;

/// A source of wall time and of sleeps.
pub trait Clock: Send + Sync + 'static {
    /// Now, as Unix milliseconds.
    fn now_ms(&self) -> u64;
    /// A future that completes after `duration` of this clock's time.
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()>;
}

/// The system clock and tokio's timer.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}
