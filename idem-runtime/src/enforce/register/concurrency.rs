//! The contract's `concurrency`: what a duplicate gets while the key's attempt runs.

use std::time::Duration;

use idem_contract::Concurrency;
use tokio::time::Instant;

use super::Registration;
use super::existing::Next;
use crate::enforce::Rejection;
use crate::store::{Lease, OwnerToken, StoreError, UnixMillis};
use crate::{OperationId, answer};

/// The first and the longest pause between two reads while waiting
/// (`concurrency = wait(..)`).
const WAIT_BACKOFF: (Duration, Duration) = (Duration::from_millis(20), Duration::from_millis(200));

impl<F> Registration<'_, F> {
    /// The answer to a duplicate of the attempt holding `lease` (operation `id`) at `now`:
    /// 409 `operation-in-progress` with `Retry-After`, 202 with the status lookup's
    /// `Location`, or a bounded wait for the record to change, then a look again (or 409
    /// when the wait is over).
    pub(super) async fn concurrency(
        &mut self,
        id: OperationId,
        lease: &Lease,
        now: UnixMillis,
    ) -> Result<Next, Rejection> {
        match self.contract.concurrency {
            Concurrency::Conflict { retry_after } => {
                Err(answer::in_progress(id, retry_after.as_secs_ceil()).into())
            }
            Concurrency::Accepted => {
                let accepted = answer::accepted(self.contract, self.key, id);
                Err(Rejection::Accepted(Box::new(accepted)))
            }
            Concurrency::Wait { limit } => {
                let until = *self
                    .wait_until
                    .get_or_insert_with(|| Instant::now() + limit.to_std());
                match self.wait_for_change(lease.token, until).await {
                    Ok(true) => Ok(Next::LookAgain),
                    Ok(false) => {
                        let remaining_secs = lease.until.saturating_sub(now).div_ceil(1000);
                        Err(answer::in_progress(id, remaining_secs).into())
                    }
                    Err(error) => Err(self.unavailable(Some(id), &error)),
                }
            }
        }
    }

    /// Polls the record until it is no longer processing under `token` with a held lease
    /// (finished, released, parked, taken over, ended and its attempt gone, or the record
    /// gone), or until `until`. Returns whether it changed.
    async fn wait_for_change(&self, token: OwnerToken, until: Instant) -> Result<bool, StoreError> {
        let mut pause = WAIT_BACKOFF.0;
        loop {
            let now = self.idem.now().await;
            let held = self
                .idem
                .store()
                .get(self.key, now)
                .await?
                .and_then(|r| r.lease().copied())
                .is_some_and(|l| l.token == token && self.idem.running().holds(&l, now));
            if !held {
                return Ok(true);
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(WAIT_BACKOFF.1);
        }
    }
}
