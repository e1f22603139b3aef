//! The attempts that are still alive under one `Idem` handle.

use std::sync::Arc;

use dashmap::DashSet;

use crate::store::{Lease, OwnerToken, UnixMillis};

/// The lease tokens of the attempts that are alive under one [`crate::Idem`] handle and
/// its clones (in practice: in this process): registered (or taken over by recovery) and
/// not yet ended, whatever their lease says.
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
#[derive(Debug, Default)]
pub(crate) struct Running(DashSet<OwnerToken>);

impl Running {
    /// Marks the attempt of `token` as alive until the returned guard is dropped.
    pub(crate) fn enter(self: &Arc<Self>, token: OwnerToken) -> Alive {
        self.0.insert(token);
        Alive {
            running: Arc::clone(self),
            token,
        }
    }

    /// Whether the attempt holding `lease` may still be at work at `now`: its lease is
    /// live, or the attempt is alive in this process.
    pub(crate) fn holds(&self, lease: &Lease, now: UnixMillis) -> bool {
        lease.is_live(now) || self.0.contains(&lease.token)
    }
}

/// An attempt alive in this process; dropping it (the attempt ended, panicked, was
/// cancelled or abandoned) lets recovery take its lease over once the lease has ended.
pub(crate) struct Alive {
    running: Arc<Running>,
    token: OwnerToken,
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.running.0.remove(&self.token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alive_attempt_holds_its_ended_lease_until_it_ends() {
        let running = Arc::new(Running::default());
        let lease = Lease {
            token: OwnerToken::random(),
            until: 100,
        };
        assert!(running.holds(&lease, 99), "a live lease is held");
        assert!(!running.holds(&lease, 100), "an ended lease is not");
        let alive = running.enter(lease.token);
        assert!(
            running.holds(&lease, 1_000),
            "unless its attempt is alive here"
        );
        drop(alive);
        assert!(!running.holds(&lease, 1_000));
    }
}
