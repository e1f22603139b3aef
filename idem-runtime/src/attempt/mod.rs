//! The attempt: run the handler under its lease, then store or release its answer.

mod current;
mod guard;

pub use self::current::Attempt;
pub use self::guard::Guard;

use axum::response::Response;
use idem_contract::Contract;

use crate::answer::{self, with_operation_id};
use crate::idem::running::Alive;
use crate::replay::{Captured, capture, replay, select_headers};
use crate::store::{OwnerToken, RecordKey, StoreError, StoredResponse, unix_now};
use crate::{Idem, OperationId};

/// One attempt that holds the key's lease.
pub(crate) struct Held {
    pub(crate) idem: Idem,
    pub(crate) contract: &'static Contract,
    pub(crate) key: RecordKey,
    pub(crate) token: OwnerToken,
    /// When the lease ends, on the monotonic clock: the handler is stopped then.
    pub(crate) deadline: tokio::time::Instant,
    pub(crate) operation_id: OperationId,
    pub(crate) attempt: u32,
    /// Holds the lease, even past its end, for as long as this attempt is alive
    /// ([`super::running::Running`]).
    pub(crate) _alive: Alive,
}

impl Held {
    /// Settles the handler's answer: a retryable status releases the key,
    /// anything else is stored as the result. Returns the answer for this client.
    pub(crate) async fn settle(&self, response: Response) -> Response {
        let status = response.status().as_u16();
        if self.contract.is_retryable_status(status) {
            // Releasing is only sound when the effect did not commit: a transactional store
            // guarantees it; with other stores the handler must answer a retryable status
            // only before its effect.
            match self
                .idem
                .store()
                .release(&self.key, self.token, unix_now())
                .await
            {
                Ok(()) => self.log_outcome("released", status),
                Err(error) => self.log_store_failure("release", &error),
            }
            return with_operation_id(response, self.operation_id);
        }
        self.store(response).await.0
    }

    /// Stores `response` as the result whatever its status (recovery found the operation
    /// applied), and answers with its replay.
    pub(crate) async fn complete_applied(&self, response: Response) -> Response {
        match self.store(response).await {
            (_, Some(stored)) => replay(&stored, self.operation_id),
            (live, None) => live,
        }
    }

    /// Buffers, stores and returns `response`, and the stored result if it was stored.
    ///
    /// Reading the body is part of the attempt: it must end within the lease, like the
    /// handler. A body that fails, panics or outlasts the lease leaves the outcome unknown,
    /// exactly as a handler that does: the record stays processing, the client gets 503
    /// (`attempt-failed` or `attempt-timed-out`) and recovery decides once the lease has
    /// ended. Nothing of such an answer has been sent yet.
    async fn store(&self, response: Response) -> (Response, Option<StoredResponse>) {
        let status = response.status().as_u16();
        let limit = self.idem.max_stored_body();
        let captured = tokio::time::timeout_at(self.deadline, capture(response, limit)).await;
        let (parts, body) = match captured {
            Err(_elapsed) => {
                tracing::warn!(
                    operation = %self.contract.operation,
                    operation_id = %self.operation_id,
                    attempt = self.attempt,
                    status,
                    outcome = "timed_out",
                    "idem: the handler's response body outlasted the lease; its outcome is unknown until recovery decides"
                );
                let answer = answer::attempt_timed_out(self.contract, self.operation_id);
                return (answer, None);
            }
            Ok(Captured::Buffered { parts, body }) => (parts, body),
            Ok(Captured::TooLarge(response)) => {
                let reason = format!(
                    "the result (status {status}) has a body larger than the {limit} bytes idem stores, \
                     so it cannot be replayed; raise `Idem::with_max_stored_body` or make the answer smaller"
                );
                tracing::error!(
                    operation = %self.contract.operation,
                    operation_id = %self.operation_id,
                    attempt = self.attempt,
                    status,
                    limit,
                    outcome = "too_large",
                    "idem: the result is too large to store; the operation is parked as unknown"
                );
                self.park_quietly(&reason).await;
                return (with_operation_id(response, self.operation_id), None);
            }
            Ok(Captured::Failed(error)) => {
                tracing::error!(
                    operation = %self.contract.operation,
                    operation_id = %self.operation_id,
                    attempt = self.attempt,
                    status,
                    error = %error,
                    outcome = "body_failed",
                    "idem: the handler's response body failed; its outcome is unknown until the lease ends and recovery decides"
                );
                let answer = answer::attempt_failed(self.operation_id, self.lease_left_secs());
                return (answer, None);
            }
        };
        let stored = StoredResponse {
            status,
            headers: select_headers(&parts.headers, self.idem.replayed_headers()),
            body: body.clone(),
        };
        let response = Response::from_parts(parts, axum::body::Body::from(body));
        let response = with_operation_id(response, self.operation_id);
        match self
            .idem
            .store()
            .complete(&self.key, self.token, &stored, unix_now())
            .await
        {
            Ok(()) => {
                self.log_outcome("completed", status);
                (response, Some(stored))
            }
            Err(StoreError::TooLarge { size, limit }) => {
                self.park_quietly(&format!(
                    "the result is {size} bytes and the store keeps at most {limit}, so it cannot be replayed"
                ))
                .await;
                (response, None)
            }
            Err(error) => {
                self.log_store_failure("complete", &error);
                (response, None)
            }
        }
    }

    /// Whole seconds until the lease ends, rounded up: the `Retry-After` of an attempt
    /// whose outcome is unknown.
    fn lease_left_secs(&self) -> u64 {
        let left = self
            .deadline
            .saturating_duration_since(tokio::time::Instant::now());
        left.as_secs().saturating_add(1)
    }

    /// Parks the operation as unknown and answers 409 `operation-outcome-unknown`.
    pub(crate) async fn park(&self, reason: &str) -> Response {
        self.park_quietly(reason).await;
        answer::outcome_unknown(self.operation_id, reason)
    }

    async fn park_quietly(&self, reason: &str) {
        match self
            .idem
            .store()
            .park_unknown(&self.key, self.token, reason, unix_now())
            .await
        {
            Ok(()) => tracing::warn!(
                operation = %self.contract.operation,
                operation_id = %self.operation_id,
                attempt = self.attempt,
                outcome = "unknown",
                "idem: the operation is parked as unknown for an operator"
            ),
            Err(error) => self.log_store_failure("park", &error),
        }
    }

    /// Releases the key (a status lookup found the operation not applied).
    pub(crate) async fn release(&self) {
        match self
            .idem
            .store()
            .release(&self.key, self.token, unix_now())
            .await
        {
            Ok(()) => self.log_outcome("released", 0),
            Err(error) => self.log_store_failure("release", &error),
        }
    }

    fn log_outcome(&self, outcome: &'static str, status: u16) {
        tracing::info!(
            operation = %self.contract.operation,
            operation_id = %self.operation_id,
            attempt = self.attempt,
            status,
            outcome,
            "idem: attempt settled"
        );
    }

    fn log_store_failure(&self, step: &'static str, error: &StoreError) {
        if matches!(error, StoreError::LeaseLost) {
            tracing::warn!(
                operation = %self.contract.operation,
                operation_id = %self.operation_id,
                attempt = self.attempt,
                step,
                outcome = "lease_lost",
                "idem: the lease was lost (recovery took over); this attempt's result is not recorded"
            );
        } else {
            tracing::error!(
                operation = %self.contract.operation,
                operation_id = %self.operation_id,
                attempt = self.attempt,
                step,
                error = %error,
                "idem: the store failed; the record stays processing until its lease ends, then recovery decides"
            );
        }
    }
}

