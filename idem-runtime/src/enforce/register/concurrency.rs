//! The contract's `concurrency`: what a duplicate gets while the key's attempt runs.

use std::time::Duration;

use idem_contract::Concurrency;
use tokio::time::Instant;

use super::Registration;
use super::existing::Next;
use crate::enforce::Rejection;
use crate::store::{InFlight, Lease, OwnerToken, StoreError, UnixMillis};
use crate::{OperationId, answer};

/// The first and the longest pause between two reads while waiting
/// (`concurrency = wait(..)`).
const WAIT_BACKOFF: (Duration, Duration) = (Duration::from_millis(20), Duration::from_millis(200));

impl Registration<'_> {
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

    /// The answer to a duplicate of `holder`, an attempt whose record is in its
    /// transaction, not committed yet: the contract's `concurrency`, as for a record
    /// processing until the end of the attempt's time (a wait watches the transaction's
    /// mark on the key rather than a lease).
    pub(super) async fn in_flight(
        &mut self,
        holder: &InFlight,
        now: UnixMillis,
    ) -> Result<Next, Rejection> {
        let lease = Lease {
            token: OwnerToken::from_u128(0),
            until: holder.until,
        };
        self.concurrency(holder.operation_id, &lease, now).await
    }

    /// Whether the attempt `token` still holds the key at `now`: its record processing
    /// under `token` with a lease held; for an attempt in its transaction (`token` nil),
    /// its mark on the key.
    async fn still_held(&self, token: OwnerToken, now: UnixMillis) -> Result<bool, StoreError> {
        if token == OwnerToken::from_u128(0)
            && let Some(tx) = &self.in_tx
        {
            return Ok(tx.in_flight(self.key).await?.is_some());
        }
        Ok(self
            .idem
            .store()
            .get(self.key, now)
            .await?
            .and_then(|r| r.lease().copied())
            .is_some_and(|l| l.token == token && self.idem.running().holds(&l, now)))
    }

    /// Polls the key until the attempt `token` no longer holds it ([`Self::still_held`]:
    /// finished, released, parked, taken over, ended and its attempt gone, or the record
    /// gone), or until `until`. Returns whether it changed.
    async fn wait_for_change(&self, token: OwnerToken, until: Instant) -> Result<bool, StoreError> {
        let mut pause = WAIT_BACKOFF.0;
        loop {
            let now = self.idem.now().await;
            let held = self.still_held(token, now).await?;
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
