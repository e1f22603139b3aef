//! Stage 11, settle: record the handler's answer, release the key, or hand the operation
//! to recovery (the table of [`super`]); the transactional mode's side is
//! `transactional.rs`.

use axum::response::{IntoResponse, Response};

use super::journal::{Interruption, step_outcome_unknown};
use super::{Ended, Held};
use crate::answer::{self, with_operation_id};
use crate::fault;
use crate::mode::Mode;
use crate::replay::{Captured, capture};
use crate::store::StoreError;
use crate::telemetry::Outcome;

impl Held {
    /// Settles the handler's answer (see the module docs of [`super`]); an attempt whose
    /// journal was interrupted settles as [`Held::settle_interrupted`] says, whatever
    /// its handler answered.
    pub(crate) async fn settle(&self, response: Response) -> Response {
        if let Some(interruption) = self.interruption() {
            return self.settle_interrupted(interruption).await;
        }
        match &self.mode {
            Mode::Plain => self.settle_alone(response).await,
            Mode::Transactional(tx) => self.settle_in_transaction(tx, response).await,
        }
    }

    /// Settles an attempt whose journal was interrupted ([`Interruption`]): a step's
    /// outcome is unknown, so the operation keeps its key and resumes on the next retry
    /// (the lease ends now; 503 `step-outcome-unknown`), or its steps broke a rule the
    /// next attempt would break again, so it is parked for an operator. In the
    /// transactional mode everything the handler wrote rolls back first, and the key is
    /// released for the same operation (its id, and so its journal, is kept).
    async fn settle_interrupted(&self, interruption: Interruption) -> Response {
        let (Interruption::Unknown(interrupted) | Interruption::Broken(interrupted)) =
            &interruption;
        let unknown = step_outcome_unknown(self.operation_id, interrupted.step());
        match (&self.mode, &interruption) {
            (Mode::Transactional(tx), _) => {
                if let Interruption::Broken(broken) = &interruption {
                    tracing::error!(
                        operation = %self.contract.operation,
                        operation_id = %self.operation_id,
                        step = broken.step(),
                        reason = broken.reason(),
                        "idem: the handler's steps broke a rule of the journal; the attempt is rolled back"
                    );
                }
                self.roll_back_interrupted(tx, unknown).await
            }
            (Mode::Plain, Interruption::Broken(broken)) => {
                let reason = format!(
                    "the step journal refused step `{}`: {}",
                    broken.step(),
                    broken.reason()
                );
                self.park(&reason).await
            }
            (Mode::Plain, Interruption::Unknown(_)) => {
                self.log_outcome(Outcome::Unknown, 503);
                let answer = with_operation_id(unknown.into_response(), self.operation_id);
                self.end_lease_with(answer).await
            }
        }
    }

    /// Settles an attempt that ended without an answer to record.
    pub(crate) async fn settle_ended(&self, ended: Ended) -> Response {
        match &self.mode {
            Mode::Plain => self.hand_to_recovery(ended).await,
            Mode::Transactional(tx) => self.roll_back_ended(tx, ended).await,
        }
    }

    pub(super) async fn settle_alone(&self, response: Response) -> Response {
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
        let (parts, body) = match self.capture(response).await {
            Ok(Captured::Buffered { parts, body }) => (parts, body),
            Ok(Captured::Failed(error)) => {
                tracing::error!(error = %error, "idem: the handler's response body failed");
                return self.hand_to_recovery(Ended::BodyFailed).await;
            }
            Err(ended) => return self.hand_to_recovery(ended).await,
        };
        let stored = self.stored(status, &parts.headers, body.clone());
        let response = self.answer(parts, body);
        fault::point("before_complete");
        match self.store_complete(&stored).await {
            Ok(()) => {
                fault::point("after_complete");
                self.log_outcome(Outcome::Executed, status);
                response
            }
            Err(error) => self.write_failed("complete", &error),
        }
    }

    /// The outcome of an attempt without a transaction is unknown: its lease ends now,
    /// so that the next retry (or status lookup) has recovery decide, exactly as after a
    /// crash. The answer says so: 503 `attempt-failed` or `attempt-timed-out`.
    pub(super) async fn hand_to_recovery(&self, ended: Ended) -> Response {
        self.log_ended(ended);
        let answer = match ended {
            Ended::TimedOut => answer::attempt_timed_out(self.contract, self.operation_id),
            other => answer::attempt_failed(self.operation_id, &other.describe(), 1),
        };
        self.end_lease_with(answer).await
    }

    /// Ends the attempt's lease now, so that recovery (or the resuming retry) may take
    /// the record over at once, and answers `answer`; 503 `store-unavailable` when the
    /// store fails. A lease that had ended already (the time ran out), or was taken over,
    /// counts as ended: the attempt that holds the record now decides.
    pub(crate) async fn end_lease_with(&self, answer: Response) -> Response {
        let now = self.idem.now().await;
        match self
            .idem
            .store()
            .renew(&self.key, self.token, now, now)
            .await
        {
            Ok(()) | Err(StoreError::LeaseLost) => answer,
            Err(error) => self.write_failed("end the lease", &error),
        }
    }

    /// Reads the body of `response` within the handler's time.
    pub(super) async fn capture(&self, response: Response) -> Result<Captured, Ended> {
        tokio::time::timeout_at(self.handler_deadline(), capture(response))
            .await
            .map_err(|_elapsed| Ended::TimedOut)
    }
}
