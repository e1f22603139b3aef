//! The attempts that are still alive under one `Idem` handle, and the heartbeat that
//! renews their leases.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use dashmap::DashMap;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::Idem;
use crate::store::{Lease, OwnerToken, RecordKey, StoreError, UnixMillis};

/// The attempts that are alive under one [`crate::Idem`] handle and its clones (in
/// practice: in this process), registered (or taken over by recovery) and not yet ended,
/// whatever their lease says; and the heartbeat that renews their leases.
///
/// A lease ends on the clock, but the work under it does not always stop then: a handler
/// that blocks its thread (a synchronous driver, heavy computation) cannot be interrupted,
/// and even an async one is dropped only when its timer fires. Recovering such an attempt
/// would find no effect yet and run the operation a second time beside the first. So a
/// lease whose attempt is still alive here counts as held: a duplicate gets the
/// contract's concurrency answer, and recovery waits until the attempt has ended.
///
/// Other processes cannot see this set; across instances only a store that commits the
/// effect and the record in one transaction closes the gap. Work that a
/// handler detaches from its own future (`tokio::task::spawn_blocking` or `spawn` whose
/// result it awaits) outlives the attempt when the attempt is stopped at its lease's end,
/// and is not covered either.
///
/// **The heartbeat.** Every third of its lease, an alive attempt's lease is moved to a full
/// lease from then ([`RecordStore::renew`](crate::store::RecordStore::renew)), so that an
/// instance that died is noticed within one lease, whatever the attempt's own time. One
/// task per handle does this for every attempt (an attempt costs a map entry, not a task
/// and a timer of its own), on whichever worker thread is free: a handler that blocks its
/// thread does not stop its renewals. A renewal that fails because the store is down is
/// logged and tried again a third of a lease later (the lease may end meanwhile: then
/// recovery may take the record over, and the attempt is fenced out); one that finds the
/// lease lost stops renewing that attempt.
#[derive(Debug)]
pub(crate) struct Running {
    attempts: DashMap<OwnerToken, Renewal>,
    /// Wakes the heartbeat task when an attempt is due before the task's planned wake.
    wake: Arc<Notify>,
    /// When the heartbeat task plans to wake next, in milliseconds since `epoch`
    /// (`u64::MAX`: when woken).
    planned: Arc<AtomicU64>,
    /// Whether the heartbeat task runs (it ends with its runtime; the next attempt starts
    /// it again).
    beating: Arc<AtomicBool>,
    epoch: Instant,
}

/// The heartbeat's view of one alive attempt.
#[derive(Debug)]
struct Renewal {
    idem: Idem,
    key: Arc<RecordKey>,
    /// The lease held at a time.
    lease: Duration,
    /// How often the lease is renewed: a third of it, at least 10 ms.
    every: Duration,
    /// When the lease last started (its registration, or the start of the last renewal).
    renewed: Instant,
    /// A renewal of it is under way.
    in_flight: bool,
    /// No more renewals: the lease was lost, or the attempt's transaction holds the
    /// database's only write lock ([`Running::pause`]).
    stopped: bool,
}

impl Default for Running {
    fn default() -> Running {
        Running {
            attempts: DashMap::new(),
            wake: Arc::new(Notify::new()),
            planned: Arc::new(AtomicU64::new(u64::MAX)),
            beating: Arc::new(AtomicBool::new(false)),
            epoch: Instant::now(),
        }
    }
}

impl Running {
    /// Marks the attempt of `token` as alive until the returned guard is dropped, and
    /// renews its lease of `key` (`lease` at a time, the current one begun at `started`)
    /// meanwhile.
    pub(crate) fn enter(
        self: &Arc<Self>,
        idem: &Idem,
        key: &Arc<RecordKey>,
        token: OwnerToken,
        lease: Duration,
        started: Instant,
    ) -> Alive {
        let every = (lease / 3).max(Duration::from_millis(10));
        self.attempts.insert(
            token,
            Renewal {
                idem: idem.clone(),
                key: Arc::clone(key),
                lease,
                every,
                renewed: started,
                in_flight: false,
                stopped: false,
            },
        );
        self.start_heartbeat();
        self.schedule(started + every);
        Alive {
            running: Arc::clone(self),
            token,
        }
    }

    /// Whether the attempt holding `lease` may still be at work at `now`: its lease is
    /// live, or the attempt is alive in this process.
    pub(crate) fn holds(&self, lease: &Lease, now: UnixMillis) -> bool {
        lease.is_live(now) || self.attempts.contains_key(&lease.token)
    }

    /// Stops renewing `token`'s lease while the attempt stays alive: for an attempt whose
    /// transaction holds the database's only write lock (SQLite), which fences out every
    /// other writer until it ends, and which the renewal would wait for.
    pub(crate) fn pause(&self, token: OwnerToken) {
        if let Some(mut renewal) = self.attempts.get_mut(&token) {
            renewal.stopped = true;
        }
    }

    /// Makes sure the heartbeat task wakes by `due`.
    fn schedule(&self, due: Instant) {
        let at = self.millis(due);
        if self.planned.fetch_min(at, Ordering::SeqCst) > at {
            self.wake.notify_one();
        }
    }

    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    /// Starts the heartbeat task unless it runs.
    fn start_heartbeat(self: &Arc<Self>) {
        if self.beating.load(Ordering::Acquire)
            || self
                .beating
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        // A task that ends (its runtime shut down) lets the next attempt start another.
        struct Beating(Arc<AtomicBool>);
        impl Drop for Beating {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let beating = Beating(Arc::clone(&self.beating));
        let running = Arc::downgrade(self);
        // A fresh task plans nothing yet: every attempt is looked at on its first round.
        self.planned.store(0, Ordering::SeqCst);
        tokio::spawn(async move {
            let _beating = beating;
            heartbeat(running).await;
        });
    }

    /// Starts the renewals that are due, and says when the next one is.
    fn renew_due(self: &Arc<Self>, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for mut entry in self.attempts.iter_mut() {
            let token = *entry.key();
            let renewal = entry.value_mut();
            if renewal.stopped || renewal.in_flight {
                continue;
            }
            let due = renewal.renewed + renewal.every;
            if due > now {
                next = Some(next.map_or(due, |n| n.min(due)));
                continue;
            }
            renewal.in_flight = true;
            let idem = renewal.idem.clone();
            let key = Arc::clone(&renewal.key);
            let lease = renewal.lease;
            let running = Arc::downgrade(self);
            tokio::spawn(async move {
                let started = Instant::now();
                let now = idem.now().await;
                let until =
                    now.saturating_add(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX));
                let renewed = idem.store().renew(&key, token, until, now).await;
                if let Err(error) = &renewed
                    && !matches!(error, StoreError::LeaseLost)
                {
                    tracing::warn!(
                        operation = %key.operation,
                        error = %error,
                        "idem: renewing an attempt's lease failed; trying again"
                    );
                }
                let Some(running) = running.upgrade() else {
                    return;
                };
                let due = match running.attempts.get_mut(&token) {
                    Some(mut renewal) => {
                        renewal.in_flight = false;
                        // A failed renewal is tried again a third of a lease later.
                        renewal.renewed = started;
                        if matches!(renewed, Err(StoreError::LeaseLost)) {
                            renewal.stopped = true;
                            return;
                        }
                        started + renewal.every
                    }
                    None => return,
                };
                running.schedule(due);
            });
        }
        next
    }
}

/// The heartbeat task: renews what is due, sleeps until the next renewal or until an
/// attempt is due earlier, and ends when its handle is gone.
async fn heartbeat(running: Weak<Running>) {
    loop {
        let Some(strong) = running.upgrade() else {
            return;
        };
        let wake = Arc::clone(&strong.wake);
        // Planned before the scan: an attempt that enters during it notifies.
        strong.planned.store(u64::MAX, Ordering::SeqCst);
        let next = strong.renew_due(Instant::now());
        if let Some(next) = next {
            // Not `schedule`: that would notify this task, which would then never sleep.
            strong
                .planned
                .fetch_min(strong.millis(next), Ordering::SeqCst);
        }
        drop(strong);
        match next {
            Some(next) => {
                tokio::select! {
                    () = tokio::time::sleep_until(next) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

/// An attempt alive in this process; dropping it (the attempt ended, panicked, was
/// cancelled or abandoned) ends its renewals, and lets recovery take its lease over once
/// the lease has ended.
pub(crate) struct Alive {
    running: Arc<Running>,
    token: OwnerToken,
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.running.attempts.remove(&self.token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OperationId;
    use crate::identity;
    use crate::store::{Begin, MemoryStore, NewRecord, RecordStore, unix_now};

    fn idem(store: Arc<MemoryStore>) -> Idem {
        Idem::new(store, identity::header("x-client-id"))
    }

    #[tokio::test]
    async fn an_alive_attempt_holds_its_ended_lease_until_it_ends() {
        let store = Arc::new(MemoryStore::new());
        let idem = idem(store);
        let running = Arc::new(Running::default());
        let key = Arc::new(RecordKey::new("op", "c", "k"));
        let lease = Lease {
            token: OwnerToken::random(),
            until: 100,
        };
        assert!(running.holds(&lease, 99), "a live lease is held");
        assert!(!running.holds(&lease, 100), "an ended lease is not");
        let alive = running.enter(
            &idem,
            &key,
            lease.token,
            Duration::from_secs(1),
            Instant::now(),
        );
        assert!(
            running.holds(&lease, 1_000),
            "unless its attempt is alive here"
        );
        drop(alive);
        assert!(!running.holds(&lease, 1_000));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leases_are_renewed_while_alive_and_not_after() {
        let store = Arc::new(MemoryStore::new());
        let idem = idem(Arc::clone(&store));
        let key = Arc::new(RecordKey::new("op", "c", "k"));
        let lease = Duration::from_millis(90);
        let token = OwnerToken::random();
        let now = unix_now();
        let new = NewRecord {
            operation_id: OperationId::new(),
            fingerprint: "f".into(),
            lease: Lease {
                token,
                until: now + 90,
            },
            expires_at: now + 60_000,
            transactional: false,
            holds_until: now + 90,
            budget: None,
        };
        assert!(matches!(
            store.begin(&key, &new, now).await.unwrap(),
            Begin::Started(_)
        ));
        let until = || async {
            let record = store.get(&key, unix_now()).await.unwrap().unwrap();
            record.lease().unwrap().until
        };
        let alive = idem
            .running()
            .enter(&idem, &key, token, lease, Instant::now());
        tokio::time::sleep(Duration::from_millis(400)).await;
        let renewed = until().await;
        assert!(
            renewed > unix_now(),
            "four leases later the lease is still live"
        );
        drop(alive);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            until().await <= unix_now(),
            "an ended attempt is no longer renewed"
        );
    }
}
