//! The store's clock under one [`Idem`](crate::Idem) handle: read at start and every
//! [`REFRESH`] (sooner for a short lease), handed to every store call as `now`, and its distance from this
//! instance's clock warned about and reported (`idem_clock_skew_ms`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::store::{ClockSample, Store, StoreClock, StoreError, UnixMillis, unix_now};
use crate::telemetry;

/// How often the store's clock is read again at most: the monotonic clock the time is
/// carried on between readings drifts from the store's by at most NTP's 500 ppm, 15 ms
/// in 30 s. A short lease has it read more often ([`refresh_every`]).
pub(crate) const REFRESH: Duration = Duration::from_secs(30);

/// How often the clock of a handle whose lease is `lease` is read again: [`REFRESH`], or
/// sooner for a short lease, so that 500 ppm of drift stays under a twentieth of it
/// (every `lease` × 100; 3 s for the shortest lease, 30 ms).
pub(crate) fn refresh_every(lease: Duration) -> Duration {
    (lease * 100).min(REFRESH)
}

/// How often a skew that persists is warned about again.
const WARN_EVERY: Duration = Duration::from_secs(300);

/// The store's clock of one handle, and the task that reads it again.
pub(crate) struct Clock {
    store: Arc<dyn Store>,
    time: StoreClock,
    /// Held while the clock is read; a caller that finds it unread waits here for the
    /// first reading instead of judging by this instance's clock.
    reading: tokio::sync::Mutex<()>,
    /// Whether the task that reads the clock again runs.
    refreshing: AtomicBool,
    /// A skew beyond which the instance warns: a quarter of the handle's lease.
    warn_over: Duration,
    /// How often the clock is read again ([`refresh_every`]).
    every: Duration,
    /// When the skew was last warned about.
    warned: Mutex<Option<Instant>>,
}

impl Clock {
    /// The clock of `store`, not read yet, warning about a skew beyond a quarter of
    /// `lease`.
    pub(crate) fn new(store: Arc<dyn Store>, lease: Duration) -> Clock {
        Clock {
            store,
            time: StoreClock::new(),
            reading: tokio::sync::Mutex::new(()),
            refreshing: AtomicBool::new(false),
            warn_over: lease / 4,
            every: refresh_every(lease),
            warned: Mutex::new(None),
        }
    }

    /// The store's time now. Before the first reading, waits for it; if the store
    /// cannot be read, this instance's clock (logged; the store call that follows fails
    /// alike, most likely).
    pub(crate) async fn now(self: &Arc<Self>) -> UnixMillis {
        if let Some(now) = self.time.now() {
            if !self.refreshing.load(Ordering::Relaxed) && !self.time.is_local() {
                self.start();
            }
            return now;
        }
        self.start();
        let _reading = self.reading.lock().await;
        if let Some(now) = self.time.now() {
            return now;
        }
        if let Err(error) = self.read().await {
            tracing::warn!(
                error = %error,
                "idem: the store's clock cannot be read; judging by this instance's clock meanwhile"
            );
        }
        self.time.now().unwrap_or_else(unix_now)
    }

    /// Starts the task that reads the clock at once and every [`Clock::every`], unless it
    /// runs or there is no tokio runtime here (the first [`Clock::now`] starts it then).
    pub(crate) fn start(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        // A task that ends with its runtime lets the next call start another.
        struct Refreshing(Weak<Clock>);
        impl Drop for Refreshing {
            fn drop(&mut self) {
                if let Some(clock) = self.0.upgrade()
                    && !clock.time.is_local()
                {
                    clock.refreshing.store(false, Ordering::Release);
                }
            }
        }
        let guard = Refreshing(Arc::downgrade(self));
        runtime.spawn(async move {
            let clock = guard.0.clone();
            refresh(clock).await;
            drop(guard);
        });
    }

    /// Reads the store's clock, takes the reading, and reports the skew.
    async fn read(&self) -> Result<(), StoreError> {
        let store: &dyn Store = &*self.store;
        if let Some(sample) = self.time.sync(store).await? {
            self.report(&sample);
        }
        Ok(())
    }

    /// The gauge, a debug line per reading, and a warning at the first reading beyond
    /// [`Clock::warn_over`] and every [`WARN_EVERY`] while it lasts.
    fn report(&self, sample: &ClockSample) {
        let skew = sample.skew_ms();
        #[allow(clippy::cast_precision_loss, reason = "a gauge of milliseconds")]
        metrics::gauge!(telemetry::METRIC_CLOCK_SKEW).set(skew as f64);
        let bound = u64::try_from(sample.error_bound().as_millis()).unwrap_or(u64::MAX);
        tracing::debug!(
            { telemetry::FIELD_CLOCK_SKEW } = skew,
            error_bound_ms = bound,
            "idem: read the store's clock"
        );
        if skew.unsigned_abs() <= u64::try_from(self.warn_over.as_millis()).unwrap_or(u64::MAX) {
            return;
        }
        let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
        if warned.is_some_and(|at| at.elapsed() < WARN_EVERY) {
            return;
        }
        *warned = Some(Instant::now());
        tracing::warn!(
            { telemetry::FIELD_CLOCK_SKEW } = skew,
            warn_over_ms = u64::try_from(self.warn_over.as_millis()).unwrap_or(u64::MAX),
            "idem: this instance's clock is {} ms {} the store's; idem judges leases by the \
             store's clock, but whatever else compares this clock with another instance's is \
             off by as much: check its time synchronisation (NTP)",
            skew.unsigned_abs(),
            if skew > 0 { "ahead of" } else { "behind" },
        );
    }
}

/// Reads the clock at once, then every [`Clock::every`], until the handle is gone; stops
/// after the first reading for a store that judges by this instance's clock.
async fn refresh(clock: Weak<Clock>) {
    loop {
        let Some(strong) = clock.upgrade() else {
            return;
        };
        {
            let _reading = strong.reading.lock().await;
            if let Err(error) = strong.read().await {
                tracing::warn!(error = %error, "idem: reading the store's clock failed; trying again");
            }
        }
        if strong.time.is_local() {
            return;
        }
        let every = strong.every;
        drop(strong);
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Idem;

    #[test]
    fn a_short_lease_has_the_clock_read_sooner() {
        assert_eq!(refresh_every(Idem::DEFAULT_HEARTBEAT_LEASE), REFRESH);
        assert_eq!(
            refresh_every(Idem::MIN_HEARTBEAT_LEASE),
            Duration::from_secs(3)
        );
    }

    #[tokio::test]
    async fn a_memory_store_is_judged_by_this_clock_and_never_read_again() {
        let clock = Arc::new(Clock::new(
            Arc::new(crate::store::MemoryStore::new()),
            Idem::DEFAULT_HEARTBEAT_LEASE,
        ));
        assert!(clock.now().await.abs_diff(unix_now()) <= 1);
        assert!(clock.time.is_local());
    }
}
