//! The guard of an attempt: what a contracted handler's code receives to run under the
//! key's lease.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use tracing::Instrument;

use super::current::Attempt;
use super::detach::Detach;
use super::{Ended, Held};
use crate::OperationId;
use crate::answer;
use crate::telemetry::AttemptTelemetry;

/// The attempt that holds a contracted operation's key, handed to the handler's code by
/// [`Enforced::into_parts`](crate::enforce::Enforced::into_parts).
///
/// [`Guard::run`] runs the handler under the attempt's lease and settles its answer. A
/// guard dropped without running anything leaves the record *processing*: the outcome is
/// unknown and recovery decides once the lease has ended, never a blind re-run.
pub struct Guard {
    /// `None` once [`Guard::run`] took the attempt.
    attempt: Option<Held>,
    operation_id: OperationId,
    number: u32,
    /// The attempt's span and metrics, from the extraction on (`crate::telemetry`).
    telemetry: Option<AttemptTelemetry>,
    /// The fault a request of the test-fault protocol asked for.
    #[cfg(feature = "testing")]
    fault: Option<crate::fault::TestFault>,
}

impl Guard {
    pub(crate) fn new(attempt: Held) -> Guard {
        Guard {
            operation_id: attempt.operation_id,
            number: attempt.attempt,
            attempt: Some(attempt),
            telemetry: None,
            #[cfg(feature = "testing")]
            fault: None,
        }
    }

    /// Carries the attempt's telemetry into the handler's run.
    pub(crate) fn observe(&mut self, telemetry: AttemptTelemetry) {
        self.telemetry = Some(telemetry);
    }

    /// This guard, with the fault a request of the test-fault protocol asked for.
    #[cfg(feature = "testing")]
    pub(crate) fn with_fault(mut self, fault: Option<crate::fault::TestFault>) -> Guard {
        self.fault = fault;
        self
    }

    /// The operation's id.
    pub fn operation_id(&self) -> OperationId {
        self.operation_id
    }

    /// This attempt's number (1 for the first).
    pub fn attempt(&self) -> u32 {
        self.number
    }

    /// The attempt, as the handler sees it (the `idem::Attempt` argument).
    pub fn current(&self) -> Attempt {
        let (operation, client, key) = match &self.attempt {
            Some(held) => (
                held.key.operation.clone(),
                held.key.client.clone(),
                held.key.key.clone(),
            ),
            // `run` consumes the guard, so a guard always holds its attempt.
            None => Default::default(),
        };
        Attempt {
            operation,
            operation_id: self.operation_id,
            client,
            key,
            number: self.number,
        }
    }

    /// Runs `handler` to its end, detached from the connection, within
    /// the attempt's time (the contract's lease: its per-attempt timeout, or else its
    /// deadline, counted from registration, less a margin of a tenth of it, at most 1 s,
    /// kept to record the outcome), then settles its answer (the table of
    /// [`crate::transaction`] for a handler that takes the transaction):
    ///
    /// - a status in the contract's `retryable` releases the key, so that a retry with the
    ///   same key runs again; sound only when the effect did not commit;
    /// - another 5xx is not a finished answer: its outcome is unknown, so it is never
    ///   stored; the lease ends at once and the answer is 503 `attempt-failed`, so that
    ///   the retry has recovery decide;
    /// - any other status (a success, or a permanent error such as 422) is stored with
    ///   the selected headers and the body, and replayed to every later request with the
    ///   key; a body larger than [`Idem::with_max_stored_body`](crate::Idem::with_max_stored_body)
    ///   is sent but not stored, and the operation is parked as `unknown`;
    /// - past its time the handler's future is dropped and the answer is 503
    ///   `attempt-timed-out`: the record stays processing, and recovery decides; the
    ///   handler's response body is read within the same time;
    /// - a panic in the handler, or a response body that fails while it is read, is
    ///   answered as a 5xx: 503 `attempt-failed`, and recovery decides;
    /// - when the store write that settles the attempt fails, the answer is 503
    ///   `store-unavailable` (never an answer that claims what was not recorded);
    /// - a handler that blocks its thread cannot be stopped at the end of its time: until
    ///   it returns, its lease still counts as held in this process (duplicates get the
    ///   concurrency answer, recovery waits), so the operation never runs twice at once
    ///   here. Work the handler detaches (`spawn_blocking`, `spawn`) is not covered.
    ///
    /// The handler is polled on the request's own task, but a client that hangs up (the
    /// typical lost answer) does not cancel it: when the request's future is dropped first,
    /// the rest of the attempt is spawned on the runtime and still runs to its end, so its
    /// result is stored and the client's retry is answered with the replay. Every answer
    /// carries the `Operation-Id` header.
    pub async fn run<F>(mut self, handler: F) -> Response
    where
        F: Future + Send + 'static,
        F::Output: IntoResponse + Send,
    {
        let Some(attempt) = self.attempt.take() else {
            return answer::attempt_failed(self.operation_id, "had already run", 1);
        };
        // The attempt's span covers the handler and the settlement, and its telemetry ends
        // with the settlement (detached with it when the client hangs up first).
        let telemetry = self.telemetry.take();
        let span = telemetry
            .as_ref()
            .map_or_else(tracing::Span::none, |t| t.span().clone());
        let until = attempt.handler_deadline();
        #[cfg(feature = "testing")]
        let fault = self.fault;
        let settled = async move {
            #[cfg(feature = "testing")]
            if let Some(fault) = fault {
                return match crate::fault::run_test_fault(fault, handler).await {
                    // As if the handler had answered it.
                    Ok(response) => {
                        let response = attempt.settle(response).await;
                        if let Some(telemetry) = telemetry {
                            let (id, number) = (attempt.operation_id, attempt.attempt);
                            telemetry.settled(&response, attempt.settled(), id, number);
                        }
                        response
                    }
                    // The attempt dies as its process would: its lease is no longer
                    // renewed (dropped), nothing is recorded, the connection breaks (its
                    // telemetry, dropped unfinished, ends as `unknown`, `cancelled`).
                    Err(broken) => {
                        drop(attempt);
                        broken
                    }
                };
            }
            let response = async {
                let ran =
                    tokio::time::timeout_at(until, AssertUnwindSafe(handler).catch_unwind()).await;
                let response = match ran {
                    Ok(Ok(output)) => {
                        std::panic::catch_unwind(AssertUnwindSafe(|| output.into_response()))
                    }
                    Ok(Err(panic)) => Err(panic),
                    Err(_elapsed) => return attempt.settle_ended(Ended::TimedOut).await,
                };
                match response {
                    Ok(response) => attempt.settle(response).await,
                    Err(_panic) => attempt.settle_ended(Ended::Panicked).await,
                }
            }
            .await;
            if let Some(telemetry) = telemetry {
                let (id, number) = (attempt.operation_id, attempt.attempt);
                telemetry.settled(&response, attempt.settled(), id, number);
            }
            response
        }
        .instrument(span.clone());
        // Polled in place, and run to its end on the runtime if the connection closes
        // first (`Detach`): the handler is never cancelled by a client that hangs up.
        let settled = AssertUnwindSafe(settled).catch_unwind();
        let ran = match Detach::new(settled) {
            Some(detached) => detached.await,
            None => {
                return answer::attempt_failed(
                    self.operation_id,
                    "could not run: no tokio runtime",
                    1,
                );
            }
        };
        match ran {
            Ok(response) => response,
            Err(_panic) => {
                tracing::error!(
                    parent: &span,
                    outcome = "panicked",
                    "idem: settling the attempt failed; the outcome is unknown until the lease ends and recovery decides"
                );
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                answer::attempt_failed(
                    self.operation_id,
                    "failed while its answer was settled",
                    left.as_secs().saturating_add(1),
                )
            }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Some(a) = &self.attempt else { return };
        // (Its telemetry, dropped unfinished, ends as `unknown`, `cancelled`.)
        tracing::warn!(
            operation = %a.contract.operation,
            operation_id = %a.operation_id,
            attempt = a.attempt,
            outcome = "abandoned",
            "idem: the attempt ended before its handler ran; the outcome is unknown until the lease ends and recovery decides"
        );
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("operation_id", &self.operation_id)
            .field("attempt", &self.number)
            .finish_non_exhaustive()
    }
}
