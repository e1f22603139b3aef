//! The attempt: run the handler under its lease, then record its answer, release the
//! key, or hand the operation to recovery.
//!
//! | the handler | without a transaction | in the transactional mode |
//! |---|---|---|
//! | answers a success or a permanent 4xx | stored, then answered | stored in the transaction, committed, then answered |
//! | answers a status the contract declares retryable | the key is released; answered as is | rolled back, released; answered as is |
//! | answers another 5xx | its outcome is unknown: the lease ends now and recovery decides on the next retry; 503 `attempt-failed` | rolled back, released; answered as is |
//! | panics | as a 5xx; 503 `attempt-failed` | rolled back, released; 503 `attempt-rolled-back` |
//! | outlasts its time | its outcome is unknown; 503 `attempt-timed-out` | rolled back, released; 503 `attempt-rolled-back` |
//!
//! Whenever the store write that an answer depends on fails (complete, release, the end
//! of the lease, park), the answer is 503 `store-unavailable`: an answer never claims a
//! state that was not recorded. When the lease was lost (recovery took the record over),
//! the answer is 503 `attempt-timed-out`, or `attempt-rolled-back` in the transactional
//! mode: the attempt that holds the record now decides.

mod current;
mod detach;
mod guard;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::response::Response;
use idem_contract::Contract;
use tokio::time::Instant;

pub use self::current::Attempt;
pub use self::guard::Guard;
use crate::answer::{self, with_operation_id};
use crate::idem::running::Alive;
use crate::replay::{Captured, capture, replay, select_headers};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::store::OperationState;
use crate::store::{OwnerToken, RecordKey, StoreError, StoredResponse, unix_now};
use crate::telemetry::{self, FinalOutcome, Outcome};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::transaction::{CommitError, RolledBack, TxControl};
use crate::{Idem, OperationId, fault};

/// The longest share of a lease kept back from the handler to record its outcome: the
/// handler (and the reading of its answer's body) must end this much before the lease,
/// so that the store write that settles the attempt is made while the lease is still
/// live. A tenth of the lease, at most one second.
const SETTLE_MARGIN: Duration = Duration::from_secs(1);

/// How an attempt ended without an answer to record.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ended {
    /// The handler panicked (or its answer could not be made).
    Panicked,
    /// The handler, or the reading of its answer's body, ran out of its time.
    TimedOut,
    /// The handler's answer's body failed while it was read.
    BodyFailed,
    /// The handler answered a server error that the contract does not declare
    /// retryable.
    ServerError(u16),
}

impl Ended {
    fn describe(self) -> String {
        match self {
            Ended::Panicked => "failed before it answered".into(),
            Ended::TimedOut => "did not finish within its time".into(),
            Ended::BodyFailed => "failed while its answer was read".into(),
            Ended::ServerError(status) => format!(
                "answered {status}, a server error that the contract does not declare retryable"
            ),
        }
    }
}

/// The transaction of an attempt in the transactional mode.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) type AttemptTx = Arc<dyn TxControl>;
/// Without a SQL store there is no transactional mode.
#[cfg(not(any(feature = "sqlite", feature = "postgres")))]
pub(crate) type AttemptTx = std::convert::Infallible;

/// One attempt that holds the key's lease.
pub(crate) struct Held {
    pub(crate) idem: Idem,
    pub(crate) contract: &'static Contract,
    pub(crate) key: Arc<RecordKey>,
    pub(crate) token: OwnerToken,
    /// When the attempt's time ends (the contract's lease: its per-attempt timeout, or
    /// else its deadline), on the monotonic clock. The lease in the store is shorter and
    /// renewed meanwhile ([`crate::idem::running::Running`]).
    pub(crate) deadline: Instant,
    pub(crate) operation_id: OperationId,
    pub(crate) attempt: u32,
    /// The attempt's transaction, in the transactional mode.
    pub(crate) tx: Option<AttemptTx>,
    /// How the settlement ended, first recorded first ([`Held::settled`]).
    settled: OnceLock<Outcome>,
    /// Holds the lease, even past its end, and renews it in the store, for as long as
    /// this attempt is alive ([`crate::idem::running::Running`]).
    _alive: Alive,
}

impl Held {
    /// The attempt that holds `key` under `token`, from `started` (on the monotonic
    /// clock): it counts as running in this process and renews its lease until dropped.
    #[allow(clippy::too_many_arguments, reason = "the fields of one attempt")]
    pub(crate) fn start(
        idem: &Idem,
        contract: &'static Contract,
        key: &Arc<RecordKey>,
        token: OwnerToken,
        started: Instant,
        operation_id: OperationId,
        attempt: u32,
    ) -> Held {
        Held {
            idem: idem.clone(),
            contract,
            key: Arc::clone(key),
            token,
            deadline: started + contract.lease().to_std(),
            operation_id,
            attempt,
            tx: None,
            settled: OnceLock::new(),
            _alive: idem
                .running()
                .enter(idem, key, token, idem.lease_for(contract), started),
        }
    }

    /// Attaches the attempt's transaction. With a store whose transaction holds the only
    /// write lock (SQLite), the heartbeat pauses: no other writer can act on the record
    /// until the transaction ends, and the renewal would wait for that lock.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn attach(&mut self, tx: AttemptTx) {
        if tx.fences_by_lock() {
            self.idem.running().pause(self.token);
        }
        self.tx = Some(tx);
    }

    /// When the handler, and the reading of its answer, must be done: the end of the
    /// lease less [`SETTLE_MARGIN`] (a tenth of the lease when that is less).
    pub(crate) fn handler_deadline(&self) -> Instant {
        let lease = self.contract.lease().to_std();
        self.deadline - SETTLE_MARGIN.min(lease / 10)
    }

    /// Settles the handler's answer (see the module docs).
    pub(crate) async fn settle(&self, response: Response) -> Response {
        #[cfg(any(feature = "sqlite", feature = "postgres"))]
        if let Some(tx) = &self.tx {
            return self.settle_in_transaction(tx, response).await;
        }
        self.settle_alone(response).await
    }

    /// Settles an attempt that ended without an answer to record.
    pub(crate) async fn settle_ended(&self, ended: Ended) -> Response {
        #[cfg(any(feature = "sqlite", feature = "postgres"))]
        if let Some(tx) = &self.tx {
            let why = ended.describe();
            self.log_ended(ended);
            return self
                .roll_back_and_release(tx, |state| {
                    answer::attempt_rolled_back(self.operation_id, &why, state, 1)
                })
                .await;
        }
        self.hand_to_recovery(ended).await
    }

    async fn settle_alone(&self, response: Response) -> Response {
        let status = response.status().as_u16();
        if self.contract.is_retryable_status(status) {
            // Releasing is only sound when the effect did not commit: the transactional
            // mode guarantees it; here the handler must answer a retryable status only
            // before its effect.
            return match self.store_release().await {
                Ok(()) => {
                    self.log_outcome(Outcome::Released, status);
                    with_operation_id(response, self.operation_id)
                }
                Err(error) => self.write_failed("release", &error),
            };
        }
        if (500..600).contains(&status) {
            return self.hand_to_recovery(Ended::ServerError(status)).await;
        }
        let limit = self.idem.max_stored_body();
        let (parts, body) = match self.capture(response).await {
            Ok(Captured::Buffered { parts, body }) => (parts, body),
            Ok(Captured::TooLarge(response)) => {
                let reason = format!(
                    "the result (status {status}) has a body larger than the {limit} bytes idem stores, \
                     so it cannot be replayed; raise `Idem::with_max_stored_body` or make the answer smaller"
                );
                return self.too_large(response, &reason).await;
            }
            Ok(Captured::Failed(error)) => {
                tracing::error!(error = %error, "idem: the handler's response body failed");
                return self.hand_to_recovery(Ended::BodyFailed).await;
            }
            Err(ended) => return self.hand_to_recovery(ended).await,
        };
        let stored = StoredResponse {
            status,
            headers: select_headers(&parts.headers, self.idem.replayed_headers()),
            body: body.clone(),
        };
        let response = Response::from_parts(parts, axum::body::Body::from(body));
        fault::point("before_complete");
        match self.store_complete(&stored).await {
            Ok(()) => {
                fault::point("after_complete");
                self.log_outcome(Outcome::Executed, status);
                with_operation_id(response, self.operation_id)
            }
            Err(StoreError::TooLarge { size, limit }) => {
                let reason = format!(
                    "the result is {size} bytes and the store keeps at most {limit}, so it cannot be replayed"
                );
                self.too_large(response, &reason).await
            }
            Err(error) => self.write_failed("complete", &error),
        }
    }

    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    async fn settle_in_transaction(&self, tx: &AttemptTx, response: Response) -> Response {
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
            return self
                .roll_back_and_release(tx, |_| with_operation_id(response, self.operation_id))
                .await;
        }
        let limit = self.idem.max_stored_body();
        let (parts, body) = match self.capture(response).await {
            Ok(Captured::Buffered { parts, body }) => (parts, body),
            Ok(Captured::TooLarge(_)) => {
                let why = format!(
                    "the answer (status {status}) has a body larger than the {limit} bytes idem stores, so it cannot be replayed"
                );
                tracing::error!(
                    operation = %self.contract.operation,
                    operation_id = %self.operation_id,
                    limit,
                    outcome = "too_large",
                    "idem: the result is too large to store; the attempt is rolled back"
                );
                return self
                    .roll_back_and_release(tx, |_| {
                        answer::result_too_large(self.operation_id, &why)
                    })
                    .await;
            }
            Ok(Captured::Failed(error)) => {
                tracing::error!(error = %error, "idem: the handler's response body failed");
                return self.settle_ended(Ended::BodyFailed).await;
            }
            Err(ended) => return self.settle_ended(ended).await,
        };
        let stored = StoredResponse {
            status,
            headers: select_headers(&parts.headers, self.idem.replayed_headers()),
            body: body.clone(),
        };
        match Arc::clone(tx)
            .commit_completed(&self.key, self.token, &stored, self.deadline)
            .await
        {
            Ok(()) => {
                self.log_outcome(Outcome::Executed, status);
                let response = Response::from_parts(parts, axum::body::Body::from(body));
                with_operation_id(response, self.operation_id)
            }
            Err(CommitError::RolledBack(StoreError::LeaseLost, _writer)) => {
                self.log_lease_lost("commit");
                answer::attempt_rolled_back(
                    self.operation_id,
                    "lost its lease before it could commit (the lease ran out, or recovery took the record over)",
                    OperationState::Processing,
                    1,
                )
            }
            Err(CommitError::RolledBack(StoreError::TransactionEnded(why), _writer)) => {
                tracing::warn!(
                    operation = %self.contract.operation,
                    operation_id = %self.operation_id,
                    attempt = self.attempt,
                    status,
                    why = %why,
                    "idem: the attempt's transaction ended before idem could commit it; what the handler wrote is rolled back"
                );
                if (400..500).contains(&status) {
                    // A permanent refusal is final even without its writes (the database
                    // rolled them back): it is recorded alone, and replayed.
                    return match self.store_complete(&stored).await {
                        Ok(()) => {
                            self.log_outcome(Outcome::Executed, status);
                            let response =
                                Response::from_parts(parts, axum::body::Body::from(body));
                            with_operation_id(response, self.operation_id)
                        }
                        Err(error) => self.write_failed("complete", &error),
                    };
                }
                let why = format!("ended without its commit: its transaction has ended ({why})");
                self.release_after_rollback(|state| {
                    answer::attempt_rolled_back(self.operation_id, &why, state, 1)
                })
                .await
            }
            Err(CommitError::RolledBack(StoreError::TooLarge { size, limit }, _writer)) => {
                let why = format!(
                    "the result is {size} bytes and the store keeps at most {limit}, so it cannot be replayed"
                );
                self.release_after_rollback(|_| answer::result_too_large(self.operation_id, &why))
                    .await
            }
            Err(CommitError::RolledBack(error, _writer)) => {
                self.log_store_failure("complete", &error);
                self.release_after_rollback(|state| {
                    answer::attempt_rolled_back(
                        self.operation_id,
                        "could not record its answer (the store failed)",
                        state,
                        self.idem.unavailable_retry_after_secs(),
                    )
                })
                .await
            }
            Err(CommitError::Commit(error)) => {
                // Nothing was committed, unless the commit's answer was lost on the way
                // back: then the record is completed, the fenced release below changes
                // nothing, and the answer cannot say which, so it is 503.
                self.log_store_failure("commit", &error);
                match self.store_release().await {
                    Ok(()) => answer::attempt_rolled_back(
                        self.operation_id,
                        "could not commit (the store failed)",
                        OperationState::Released,
                        self.idem.unavailable_retry_after_secs(),
                    ),
                    Err(_) => answer::store_unavailable(
                        &self.idem,
                        self.contract,
                        Some(self.operation_id),
                        &error,
                    ),
                }
            }
        }
    }

    /// Rolls `tx` back, then releases the key; answers with `answer(state)` when that is
    /// recorded (`released`, or `processing` when another attempt took the record over),
    /// else 503 `store-unavailable`.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    async fn roll_back_and_release(
        &self,
        tx: &AttemptTx,
        answer: impl FnOnce(OperationState) -> Response,
    ) -> Response {
        // Half of what is left of the lease may go to the rollback (it waits for a
        // statement of the handler that is still running), the rest to the release.
        let now = Instant::now();
        let halfway = now + self.deadline.saturating_duration_since(now) / 2;
        let _writer = match Arc::clone(tx)
            .roll_back(&self.key, self.token, halfway)
            .await
        {
            RolledBack::Released => {
                self.log_outcome(Outcome::Released, 0);
                return answer(OperationState::Released);
            }
            RolledBack::LeaseLost => {
                self.log_lease_lost("release");
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
                    self.operation_id,
                    "did not finish within its time",
                    OperationState::Processing,
                    1,
                )
            }
        }
    }

    /// Releases the key of an attempt whose transaction has rolled back.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    async fn release_after_rollback(
        &self,
        answer: impl FnOnce(OperationState) -> Response,
    ) -> Response {
        match self.store_release().await {
            Ok(()) => answer(OperationState::Released),
            Err(StoreError::LeaseLost) => match self.revive().await {
                Ok(()) => match self.store_release().await {
                    Ok(()) => answer(OperationState::Released),
                    Err(StoreError::LeaseLost) => {
                        self.log_lease_lost("release");
                        answer(OperationState::Processing)
                    }
                    Err(error) => self.write_failed("release", &error),
                },
                Err(StoreError::LeaseLost) => {
                    self.log_lease_lost("release");
                    answer(OperationState::Processing)
                }
                Err(error) => self.write_failed("release", &error),
            },
            Err(error) => self.write_failed("release", &error),
        }
    }

    /// Renews this attempt's lease, lapsed or not (its renewals came late, or paused
    /// while a transaction held SQLite's write lock): the owner token still owning the
    /// record means nobody took it over, so the attempt may still record its outcome.
    async fn revive(&self) -> Result<(), StoreError> {
        let now = unix_now();
        let until = now.saturating_add(
            u64::try_from(self.idem.lease_for(self.contract).as_millis()).unwrap_or(u64::MAX),
        );
        self.idem
            .store()
            .renew(&self.key, self.token, until, now)
            .await
    }

    /// Stores `stored` as the result; a lapsed lease is revived once first.
    async fn store_complete(&self, stored: &StoredResponse) -> Result<(), StoreError> {
        let completed = self
            .idem
            .store()
            .complete(&self.key, self.token, stored, unix_now())
            .await;
        match completed {
            Err(StoreError::LeaseLost) => {
                self.revive().await?;
                self.idem
                    .store()
                    .complete(&self.key, self.token, stored, unix_now())
                    .await
            }
            other => other,
        }
    }

    /// The outcome of an attempt without a transaction is unknown: its lease ends now,
    /// so that the next retry (or status lookup) has recovery decide, exactly as after a
    /// crash. The answer says so: 503 `attempt-failed` or `attempt-timed-out`.
    async fn hand_to_recovery(&self, ended: Ended) -> Response {
        self.log_ended(ended);
        let answer = match ended {
            Ended::TimedOut => answer::attempt_timed_out(self.contract, self.operation_id),
            other => answer::attempt_failed(self.operation_id, &other.describe(), 1),
        };
        let now = unix_now();
        match self
            .idem
            .store()
            .renew(&self.key, self.token, now, now)
            .await
        {
            Ok(()) => answer,
            // Ended already (the time ran out), or taken over: recovery decides either way.
            Err(StoreError::LeaseLost) => answer,
            Err(error) => self.write_failed("end the lease", &error),
        }
    }

    /// Reads the body of `response` within the handler's time.
    async fn capture(&self, response: Response) -> Result<Captured, Ended> {
        let limit = self.idem.max_stored_body();
        tokio::time::timeout_at(self.handler_deadline(), capture(response, limit))
            .await
            .map_err(|_elapsed| Ended::TimedOut)
    }

    /// A result too large to store, without a transaction: the effect happened, so the
    /// answer goes to this client, and the operation is parked as unknown (a later
    /// request cannot be answered with it).
    async fn too_large(&self, response: Response, reason: &str) -> Response {
        tracing::error!(
            operation = %self.contract.operation,
            operation_id = %self.operation_id,
            attempt = self.attempt,
            outcome = "too_large",
            "idem: the result is too large to store; the operation is parked as unknown"
        );
        let outcome = match self.store_park(reason).await {
            Ok(()) => {
                self.parked(response.status().as_u16());
                Outcome::Parked
            }
            Err(error) => {
                self.log_store_failure("park", &error);
                Outcome::Unknown
            }
        };
        // (The answer is the result itself, which says neither.)
        telemetry::tagged(with_operation_id(response, self.operation_id), outcome)
    }

    /// Stores `response` as the result whatever its status (recovery found the operation
    /// applied), and answers with its replay.
    pub(crate) async fn complete_applied(&self, response: Response) -> Response {
        let status = response.status().as_u16();
        let limit = self.idem.max_stored_body();
        let (parts, body) = match self.capture(response).await {
            Ok(Captured::Buffered { parts, body }) => (parts, body),
            Ok(Captured::TooLarge(response)) => {
                let reason = format!(
                    "recovery's result (status {status}) has a body larger than the {limit} bytes idem stores"
                );
                return self.too_large(response, &reason).await;
            }
            Ok(Captured::Failed(_)) | Err(_) => {
                return self
                    .park("the reconcile function's answer could not be read")
                    .await;
            }
        };
        let stored = StoredResponse {
            status,
            headers: select_headers(&parts.headers, self.idem.replayed_headers()),
            body,
        };
        match self.store_complete(&stored).await {
            Ok(()) => {
                self.log_outcome(Outcome::Recovered, status);
                telemetry::operation_ended(
                    None,
                    &self.contract.operation,
                    FinalOutcome::Recovered,
                    self.operation_id,
                    self.attempt,
                    status,
                );
                telemetry::tagged(replay(&stored, self.operation_id), Outcome::Recovered)
            }
            Err(StoreError::TooLarge { size, limit }) => {
                let reason = format!(
                    "recovery's result is {size} bytes and the store keeps at most {limit}"
                );
                let response = Response::from_parts(parts, axum::body::Body::from(stored.body));
                self.too_large(response, &reason).await
            }
            Err(error) => self.write_failed("complete", &error),
        }
    }

    /// Parks the operation as unknown and answers 409 `operation-outcome-unknown`, or
    /// 503 `store-unavailable` when that cannot be recorded.
    pub(crate) async fn park(&self, reason: &str) -> Response {
        match self.store_park(reason).await {
            Ok(()) => {
                tracing::warn!(
                    operation = %self.contract.operation,
                    operation_id = %self.operation_id,
                    attempt = self.attempt,
                    outcome = "unknown",
                    "idem: the operation is parked as unknown for an operator"
                );
                self.parked(409);
                let answer = answer::outcome_unknown(self.operation_id, reason);
                telemetry::tagged(answer, Outcome::Parked)
            }
            Err(error) => self.write_failed("park", &error),
        }
    }

    /// Recovery could not decide now: the lease ends at once, so that the next retry or
    /// status lookup asks again, and the answer is 503 `recovery-pending`.
    pub(crate) async fn postpone(&self, reason: &str) -> Response {
        tracing::warn!(
            operation = %self.contract.operation,
            operation_id = %self.operation_id,
            attempt = self.attempt,
            reason,
            outcome = "recovery_pending",
            "idem: recovery could not decide now; the next retry asks again"
        );
        let now = unix_now();
        match self
            .idem
            .store()
            .renew(&self.key, self.token, now, now)
            .await
        {
            Ok(()) | Err(StoreError::LeaseLost) => {
                answer::recovery_pending(&self.idem, self.operation_id, reason)
            }
            Err(error) => self.write_failed("end the lease", &error),
        }
    }

    /// Releases the key (a status lookup found the operation not applied).
    pub(crate) async fn release(&self) -> Result<(), StoreError> {
        let released = self.store_release().await;
        match &released {
            Ok(()) => self.log_outcome(Outcome::Released, 0),
            Err(error) => self.log_store_failure("release", error),
        }
        released
    }

    async fn store_release(&self) -> Result<(), StoreError> {
        self.idem
            .store()
            .release(&self.key, self.token, unix_now())
            .await
    }

    async fn store_park(&self, reason: &str) -> Result<(), StoreError> {
        self.idem
            .store()
            .park_unknown(&self.key, self.token, reason, unix_now())
            .await
    }

    /// The answer when the store write of `step` failed: 503 `attempt-timed-out` when
    /// the lease was lost (recovery holds the record now), else 503 `store-unavailable`.
    fn write_failed(&self, step: &'static str, error: &StoreError) -> Response {
        self.log_store_failure(step, error);
        match error {
            StoreError::LeaseLost => answer::attempt_timed_out(self.contract, self.operation_id),
            other => {
                answer::store_unavailable(&self.idem, self.contract, Some(self.operation_id), other)
            }
        }
    }

    /// Records how the attempt settled: the first outcome recorded is the attempt's
    /// ([`Held::settled`]); the event says each step.
    fn log_outcome(&self, outcome: Outcome, status: u16) {
        let _ = self.settled.set(outcome);
        tracing::debug!(
            operation = %self.contract.operation,
            operation_id = %self.operation_id,
            attempt = self.attempt,
            status,
            outcome = outcome.as_str(),
            "idem: attempt settled"
        );
    }

    /// The operation is parked as unknown (its final state until an operator acts):
    /// `status` is what the client got.
    fn parked(&self, status: u16) {
        let _ = self.settled.set(Outcome::Parked);
        telemetry::operation_ended(
            None,
            &self.contract.operation,
            FinalOutcome::Parked,
            self.operation_id,
            self.attempt,
            status,
        );
    }

    /// How the settlement ended, as far as it recorded one (`crate::telemetry`): the
    /// handler's answer stored (`executed`), a released key, a rollback, a parked
    /// operation. `None` when idem answered with a problem of its own.
    pub(crate) fn settled(&self) -> Option<Outcome> {
        self.settled.get().copied()
    }

    fn log_ended(&self, ended: Ended) {
        let transactional = self.tx.is_some();
        tracing::warn!(
            operation = %self.contract.operation,
            operation_id = %self.operation_id,
            attempt = self.attempt,
            transactional,
            outcome = match ended {
                Ended::Panicked => "panicked",
                Ended::TimedOut => "timed_out",
                Ended::BodyFailed => "body_failed",
                Ended::ServerError(_) => "server_error",
            },
            "idem: the attempt {}; {}",
            ended.describe(),
            if transactional {
                "its transaction is rolled back and the key released"
            } else {
                "its outcome is unknown until recovery decides"
            }
        );
    }

    fn log_lease_lost(&self, step: &'static str) {
        tracing::warn!(
            operation = %self.contract.operation,
            operation_id = %self.operation_id,
            attempt = self.attempt,
            step,
            outcome = "lease_lost",
            "idem: the lease was lost (it ran out, or recovery took the record over); this attempt's result is not recorded"
        );
    }

    fn log_store_failure(&self, step: &'static str, error: &StoreError) {
        if matches!(error, StoreError::LeaseLost) {
            self.log_lease_lost(step);
        } else {
            tracing::error!(
                operation = %self.contract.operation,
                operation_id = %self.operation_id,
                attempt = self.attempt,
                step,
                error = %error,
                "idem: the store failed; the record stays as it was until its lease ends, then recovery decides"
            );
        }
    }
}
