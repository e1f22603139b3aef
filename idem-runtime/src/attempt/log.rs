//! What an attempt's settlement says in the log, and how it ended for telemetry.

use super::{Ended, Held};
use crate::store::StoreError;
use crate::telemetry::{self, FinalOutcome, Outcome};

impl Held {
    /// Records how the attempt settled: the first outcome recorded is the attempt's
    /// ([`Held::settled`]); the event says each step.
    pub(super) fn log_outcome(&self, outcome: Outcome, status: u16) {
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
    pub(super) fn parked(&self, status: u16) {
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

    pub(super) fn log_ended(&self, ended: Ended) {
        let transactional = self.mode.is_transactional();
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

    pub(super) fn log_lease_lost(&self, step: &'static str) {
        tracing::warn!(
            operation = %self.contract.operation,
            operation_id = %self.operation_id,
            attempt = self.attempt,
            step,
            outcome = "lease_lost",
            "idem: the lease was lost (it ran out, or recovery took the record over); this attempt's result is not recorded"
        );
    }

    pub(super) fn log_store_failure(&self, step: &'static str, error: &StoreError) {
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
