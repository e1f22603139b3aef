//! Stage 11 in the transactional mode: the handler's writes and the key's final state
//! commit in the attempt's transaction, or everything rolls back and the key is released
//! ([`crate::transaction`]).

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::response::Parts;
use tokio::time::Instant;

use super::{Ended, Held};
use crate::answer::{self, with_operation_id};
use crate::mode::AttemptTx;
use crate::replay::Captured;
use crate::store::{Begin, Lease, NewRecord, OperationState, StoreError, StoredResponse};
use crate::telemetry::Outcome;
use crate::transaction::{CommitError, RolledBack};

impl Held {
    /// Settles the handler's answer in its transaction: a retryable status or another 5xx
    /// rolls back and releases the key; any other answer is committed with its record.
    pub(super) async fn settle_in_transaction(
        &self,
        tx: &AttemptTx,
        response: Response,
    ) -> Response {
        let status = response.status().as_u16();
        if self.contract.is_retryable_status(status) || (500..600).contains(&status) {
            // A status the contract declares retryable is `released`, as without a
            // transaction; another 5xx is `rolled_back`.
            let outcome = if self.contract.is_retryable_status(status) {
                Outcome::Released
            } else {
                Outcome::RolledBack
            };
            self.log_outcome(outcome, status);
            let answer = with_operation_id(response, self.operation_id);
            return self.roll_back_and_release(tx, |_| answer).await;
        }
        let (parts, body) = match self.capture(response).await {
            Ok(Captured::Buffered { parts, body }) => (parts, body),
            Ok(Captured::Failed(error)) => {
                tracing::error!(error = %error, "idem: the handler's response body failed");
                return self.settle_ended(Ended::BodyFailed).await;
            }
            Err(ended) => return self.settle_ended(ended).await,
        };
        let stored = self.stored(status, &parts.headers, body.clone());
        let now = self.idem.now().await;
        let committed = tx
            .control()
            .commit_completed(&self.key, self.token, &stored, self.deadline, now)
            .await;
        match committed {
            Ok(()) => {
                self.log_outcome(Outcome::Executed, status);
                self.answer(parts, body)
            }
            Err(CommitError::RolledBack(error, _writer)) => {
                self.not_committed(error, &stored, parts, body).await
            }
            Err(CommitError::Commit(error)) => self.commit_failed(&error).await,
        }
    }

    /// An attempt that ended without an answer (a panic, its time): rolled back, the key
    /// released, 503 `attempt-rolled-back`.
    pub(super) async fn roll_back_ended(&self, tx: &AttemptTx, ended: Ended) -> Response {
        let why = ended.describe();
        self.log_ended(ended);
        let answer =
            |state| answer::attempt_rolled_back(self.contract, self.operation_id, &why, state, 1);
        self.roll_back_and_release(tx, answer).await
    }

    /// An attempt whose journal was interrupted: rolled back, the key released for the
    /// same operation (its journal kept), answered with `unknown` (503
    /// `step-outcome-unknown`).
    pub(super) async fn roll_back_interrupted(
        &self,
        tx: &AttemptTx,
        unknown: crate::problem::Problem,
    ) -> Response {
        let answer = with_operation_id(unknown.into_response(), self.operation_id);
        self.roll_back_and_release(tx, |_| answer).await
    }

    /// The record could not be written in the transaction, so nothing was committed.
    async fn not_committed(
        &self,
        error: StoreError,
        stored: &StoredResponse,
        parts: Parts,
        body: Bytes,
    ) -> Response {
        let id = self.operation_id;
        match error {
            // The record was in the transaction: nothing of it is left.
            StoreError::LeaseLost if self.registered_as.is_some() => {
                self.log_lease_lost("commit");
                if let Some(replayed) = self.winners_answer().await {
                    return replayed;
                }
                let why = "lost its record before it could commit";
                let answer = |state| answer::attempt_rolled_back(self.contract, id, why, state, 1);
                self.release_after_rollback(answer).await
            }
            StoreError::LeaseLost => {
                self.log_lease_lost("commit");
                answer::attempt_rolled_back(
                    self.contract,
                    id,
                    "lost its lease before it could commit (the lease ran out, or recovery took the record over)",
                    OperationState::Processing,
                    1,
                )
            }
            StoreError::TransactionEnded(why) => {
                self.transaction_ended(&why, stored, parts, body).await
            }
            error => {
                self.log_store_failure("complete", &error);
                let retry_after = self.idem.unavailable_retry_after_secs();
                let why = "could not record its answer (the store failed)";
                let answer =
                    |state| answer::attempt_rolled_back(self.contract, id, why, state, retry_after);
                self.release_after_rollback(answer).await
            }
        }
    }

    /// The answer of the attempt that won the key, when this one lost its record at the
    /// commit (on PostgreSQL: a record committed behind the snapshot of the statement that
    /// took the key's lock, `store::postgres`): that record completed, for this request's
    /// fingerprint, is the operation's answer, replayed now as a retry would get it.
    /// `None` otherwise (another fingerprint, not completed, or not readable): the caller
    /// answers as for any attempt that lost its record.
    async fn winners_answer(&self) -> Option<Response> {
        let new = self.registered_as.as_deref()?;
        let now = self.idem.now().await;
        let record = self.idem.store().get(&self.key, now).await.ok()??;
        match &record.state {
            crate::store::RecordState::Completed { response }
                if record.fingerprint == new.fingerprint =>
            {
                crate::telemetry::answered_for(record.operation_id, record.attempt);
                Some(crate::replay::replay(response, record.operation_id))
            }
            _ => None,
        }
    }

    /// The database ended the transaction before idem could commit it (the handler's
    /// statement failed, or it ended it): what the handler wrote is rolled back. A
    /// permanent refusal (4xx) is final even without its writes, so it is recorded alone
    /// and replayed; anything else releases the key.
    async fn transaction_ended(
        &self,
        why: &str,
        stored: &StoredResponse,
        parts: Parts,
        body: Bytes,
    ) -> Response {
        let status = stored.status;
        tracing::warn!(
            operation = %self.contract.operation,
            operation_id = %self.operation_id,
            attempt = self.attempt,
            status,
            why = %why,
            "idem: the attempt's transaction ended before idem could commit it; what the handler wrote is rolled back"
        );
        if (400..500).contains(&status) {
            if let Some(new) = &self.registered_as {
                return self.record_alone(new, stored, parts, body).await;
            }
            return match self.store_complete(stored).await {
                Ok(()) => {
                    self.log_outcome(Outcome::Executed, status);
                    self.answer(parts, body)
                }
                Err(error) => self.write_failed("complete", &error),
            };
        }
        let why = format!("ended without its commit: its transaction has ended ({why})");
        let answer =
            |state| answer::attempt_rolled_back(self.contract, self.operation_id, &why, state, 1);
        self.release_after_rollback(answer).await
    }

    /// The commit itself failed. Nothing was committed, unless the commit's answer was
    /// lost on the way back: then the record is completed, the fenced release below
    /// changes nothing, and the answer cannot say which, so it is 503.
    async fn commit_failed(&self, error: &StoreError) -> Response {
        self.log_store_failure("commit", error);
        if self.registered_as.is_some() {
            // The record was in the transaction: committed with the answer, or nothing
            // is left. A retry finds the one or runs again.
            return answer::store_unavailable(
                &self.idem,
                self.contract,
                Some(self.operation_id),
                error,
            )
            .into_response();
        }
        match self.store_release().await {
            Ok(()) => answer::attempt_rolled_back(
                self.contract,
                self.operation_id,
                "could not commit (the store failed)",
                OperationState::Released,
                self.idem.unavailable_retry_after_secs(),
            ),
            Err(_) => {
                answer::store_unavailable(&self.idem, self.contract, Some(self.operation_id), error)
                    .into_response()
            }
        }
    }

    /// Rolls `tx` back, then releases the key; answers with `answer(state)` when that is
    /// recorded (`released`, or `processing` when another attempt took the record over),
    /// else 503 `store-unavailable`.
    async fn roll_back_and_release(
        &self,
        tx: &AttemptTx,
        answer: impl FnOnce(OperationState) -> Response,
    ) -> Response {
        // Half of what is left of the lease may go to the rollback (it waits for a
        // statement of the handler that is still running), the rest to the release.
        let now = Instant::now();
        let halfway = now + self.deadline.saturating_duration_since(now) / 2;
        let _writer = match tx.control().roll_back(&self.key, self.token, halfway).await {
            RolledBack::Released => {
                self.log_outcome(Outcome::Released, 0);
                return answer(OperationState::Released);
            }
            RolledBack::LeaseLost => {
                self.log_lease_lost("release");
                return answer(OperationState::Processing);
            }
            // The key's record is in the transaction whose rollback waits: the key is
            // held until it ends, then free (a retry is then a new operation).
            RolledBack::Pending if self.registered_as.is_some() => {
                return answer(OperationState::Processing);
            }
            // Nothing can commit; the release goes on beside the unfinished rollback
            // (on PostgreSQL, on another connection; with SQLite it waits for the lock
            // the rollback holds, within the lease).
            RolledBack::Pending => crate::store::Reservation::default(),
            // The writer's turn (SQLite) is kept until the key is released.
            RolledBack::Rolled(writer) => writer,
        };
        match tokio::time::timeout_at(self.deadline, self.release_after_rollback(answer)).await {
            Ok(answered) => answered,
            // The release waits for a lock the unfinished rollback holds (SQLite's one
            // writer). Nothing was committed, so nothing took effect; the record stays
            // processing until its lease ends, and then recovery finds it not applied.
            Err(_elapsed) => {
                tracing::warn!(
                    operation = %self.contract.operation,
                    operation_id = %self.operation_id,
                    "idem: the key could not be released within the lease (a statement of the handler still holds the database); recovery releases it"
                );
                answer::attempt_rolled_back(
                    self.contract,
                    self.operation_id,
                    "did not finish within its time",
                    OperationState::Processing,
                    1,
                )
            }
        }
    }

    /// Releases the key of an attempt whose transaction has rolled back; a lapsed lease
    /// that its token still owns is revived once first.
    async fn release_after_rollback(
        &self,
        answer: impl FnOnce(OperationState) -> Response,
    ) -> Response {
        if let Some(new) = &self.registered_as {
            return self.release_registered(new, answer).await;
        }
        let released = match self.store_release().await {
            Err(StoreError::LeaseLost) => match self.revive().await {
                Ok(()) => self.store_release().await,
                Err(error) => Err(error),
            },
            other => other,
        };
        match released {
            Ok(()) => answer(OperationState::Released),
            Err(StoreError::LeaseLost) => {
                self.log_lease_lost("release");
                answer(OperationState::Processing)
            }
            Err(error) => self.write_failed("release", &error),
        }
    }

    /// A permanent refusal (4xx) of an attempt whose record was registered in its
    /// transaction, which the database ended: the key is registered again as `new` was,
    /// under the same token, and completed with the refusal (two writes, on this rare
    /// path). Another attempt that took the key meanwhile keeps it: 503
    /// `attempt-rolled-back`, processing.
    async fn record_alone(
        &self,
        new: &NewRecord,
        stored: &StoredResponse,
        parts: Parts,
        body: Bytes,
    ) -> Response {
        match self.register_again(new).await {
            Ok(true) => match self.store_complete(stored).await {
                Ok(()) => {
                    self.log_outcome(Outcome::Executed, stored.status);
                    self.answer(parts, body)
                }
                Err(error) => self.write_failed("complete", &error),
            },
            Ok(false) => answer::attempt_rolled_back(
                self.contract,
                self.operation_id,
                "ended without its commit (its transaction has ended), and another attempt holds the key now",
                OperationState::Processing,
                1,
            ),
            Err(error) => self.write_failed("begin", &error),
        }
    }

    /// Records the release of an attempt whose record rolled back with its transaction:
    /// the key registered again as `new` was and released at once, so that the retry
    /// goes on with the same operation (its id, its count of attempts). Two writes, on
    /// this path only. Answers with `answer(state)`: `released`, or `processing` when
    /// another attempt took the key meanwhile.
    async fn release_registered(
        &self,
        new: &NewRecord,
        answer: impl FnOnce(OperationState) -> Response,
    ) -> Response {
        match self.register_again(new).await {
            Ok(true) => {}
            Ok(false) => return answer(OperationState::Processing),
            Err(error) => return self.write_failed("begin", &error),
        }
        match self.store_release().await {
            Ok(()) => answer(OperationState::Released),
            Err(StoreError::LeaseLost) => answer(OperationState::Processing),
            Err(error) => self.write_failed("release", &error),
        }
    }

    /// Registers the key again as `new` was registered in the attempt's transaction
    /// (the same operation id and owner token, no budget: the key was admitted), after
    /// that transaction rolled back; whether it is this attempt's now (`false`: another
    /// attempt holds it, or finished it).
    async fn register_again(&self, new: &NewRecord) -> Result<bool, StoreError> {
        let now = self.idem.now().await;
        let lease_ms = u64::try_from(self.idem.lease_for(self.contract).as_millis());
        let new = NewRecord {
            lease: Lease {
                token: self.token,
                until: now.saturating_add(lease_ms.unwrap_or(u64::MAX)),
            },
            budget: None,
            ..new.clone()
        };
        let begun = self.idem.store().begin(&self.key, &new, now).await?;
        Ok(matches!(begun, Begin::Started(_)))
    }
}
