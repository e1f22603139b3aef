//! The heartbeat: a running attempt renews its short lease, so that an instance that
//! died is noticed within one lease, whatever the attempt's own time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::Idem;
use crate::store::{OwnerToken, RecordKey, StoreError, unix_now};

/// The renewals of one attempt's lease, on a task of their own, until it is dropped.
///
/// Every third of the lease the lease is moved to a full lease from now
/// ([`Store::renew`](crate::store::Store::renew)). A renewal that fails because the
/// store is down is logged and tried again at the next tick (the lease may end meanwhile:
/// then recovery may take the record over, and this attempt's record is fenced out); one
/// that finds the lease lost stops the heartbeat.
pub(crate) struct Heartbeat {
    task: tokio::task::JoinHandle<()>,
    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres")),
        allow(dead_code, reason = "paused only in the transactional mode")
    )]
    paused: Arc<AtomicBool>,
}

impl Heartbeat {
    /// Starts renewing `token`'s lease of `key` for `lease` at a time.
    pub(crate) fn start(
        idem: &Idem,
        key: Arc<RecordKey>,
        token: OwnerToken,
        lease: Duration,
    ) -> Self {
        let paused = Arc::new(AtomicBool::new(false));
        let idem = idem.clone();
        let pause = Arc::clone(&paused);
        let every = (lease / 3).max(Duration::from_millis(10));
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                if pause.load(Ordering::SeqCst) {
                    continue;
                }
                let now = unix_now();
                let until =
                    now.saturating_add(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX));
                match idem.store().renew(&key, token, until, now).await {
                    Ok(()) => {}
                    Err(StoreError::LeaseLost) => return,
                    Err(error) => tracing::warn!(
                        operation = %key.operation,
                        error = %error,
                        "idem: renewing an attempt's lease failed; trying again"
                    ),
                }
            }
        });
        Heartbeat { task, paused }
    }

    /// Stops renewing without ending the heartbeat: for an attempt whose transaction holds
    /// the database's only write lock (SQLite), which fences out every other writer until
    /// it ends, and which the renewal would wait for.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}
