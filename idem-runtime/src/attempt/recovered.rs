//! What recovery's decisions record through the attempt that took the ended lease over
//! ([`crate::recovery`]): the result it found applied, an operation parked for an
//! operator, or a decision put off.

use axum::response::{IntoResponse, Response};

use super::Held;
use crate::answer;
use crate::replay::{Captured, replay};
use crate::telemetry::{self, FinalOutcome, Outcome};

impl Held {
    /// Stores `response` as the result whatever its status (recovery found the operation
    /// applied), and answers with its replay.
    pub(crate) async fn complete_applied(&self, response: Response) -> Response {
        let status = response.status().as_u16();
        let (parts, body) = match self.capture(response).await {
            Ok(Captured::Buffered { parts, body }) => (parts, body),
            Ok(Captured::Failed(_)) | Err(_) => {
                return self
                    .park("the reconcile function's answer could not be read")
                    .await;
            }
        };
        let stored = self.stored(status, &parts.headers, body);
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
                telemetry::tagged(answer.into_response(), Outcome::Parked)
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
        let answer = answer::recovery_pending(&self.idem, self.operation_id, reason);
        self.end_lease_with(answer).await
    }
}
