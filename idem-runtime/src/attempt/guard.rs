//! The guard of an attempt: what a contracted handler's code receives to run under the
//! key's lease.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use super::Held;
use super::current::Attempt;
use super::journal::Journal;
use super::run::{Handler, detached, run_and_settle};
use crate::OperationId;
use crate::answer;
use crate::fault::TestFault;
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
    attempt_number: u32,
    /// The attempt's span and metrics, from the extraction on (`crate::telemetry`).
    telemetry: Option<AttemptTelemetry>,
    /// The fault a request of the test-fault protocol asked for (always `None` without
    /// the feature `testing`).
    fault: Option<TestFault>,
}

impl Guard {
    /// The guard of `attempt`, which runs `fault` in the handler's place when the
    /// request asked for one.
    pub(crate) fn new(attempt: Held, fault: Option<TestFault>) -> Guard {
        Guard {
            operation_id: attempt.operation_id,
            attempt_number: attempt.attempt,
            attempt: Some(attempt),
            telemetry: None,
            fault,
        }
    }

    /// Carries the attempt's telemetry into the handler's run.
    pub(crate) fn observe(&mut self, telemetry: AttemptTelemetry) {
        self.telemetry = Some(telemetry);
    }

    /// The operation's id.
    pub fn operation_id(&self) -> OperationId {
        self.operation_id
    }

    /// This attempt's number (1 for the first): the operation's attempt counter.
    pub fn attempt(&self) -> u32 {
        self.attempt_number
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
            attempt: self.attempt_number,
        }
    }

    /// The attempt's step journal (the `idem::Journal` argument): each call the handler
    /// makes to another system goes through [`Journal::step`]. Every journal of one
    /// attempt shares its state: a step interrupted in one interrupts the attempt.
    pub fn journal(&self) -> Journal {
        match &self.attempt {
            Some(held) => held.journal(),
            // `run` consumes the guard, so a guard always holds its attempt.
            None => unreachable!("a guard holds its attempt until it runs"),
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
    ///   key; a body larger than [`IdemBuilder::max_stored_body`](crate::IdemBuilder::max_stored_body)
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
    ///
    /// The future is boxed as a trait object, and its type says so (not `impl Future`):
    /// axum proves each handler's future `Send`, and through an `impl Future` it proved it
    /// again for every handler, down the whole attempt's state machine (a fifth of the
    /// compile of a crate of 100 contracted handlers).
    pub fn run<F>(self, handler: F) -> Pin<Box<dyn Future<Output = Response> + Send + 'static>>
    where
        F: Future + Send + 'static,
        F::Output: IntoResponse + Send,
    {
        // The one part that depends on the handler's types. The rest is compiled once for
        // every handler, and boxed: a handler's future that held it by value would make
        // every handler compile its layout and drop glue again.
        let handler: Handler = Box::pin(async move { handler.await.into_response() });
        self.run_boxed(handler)
    }

    /// [`Guard::run`] once the handler's answer is a [`Response`]. Not an `async fn`: the
    /// attempt's future is boxed once, where [`detached`] keeps it, and what is returned
    /// only waits for it (a future that held it by value would be boxed, and copied,
    /// again).
    fn run_boxed(mut self, handler: Handler) -> Pin<Box<dyn Future<Output = Response> + Send>> {
        let Some(attempt) = self.attempt.take() else {
            let answer = answer::attempt_failed(self.operation_id, "had already run", 1);
            return Box::pin(std::future::ready(answer));
        };
        // The attempt's span covers the handler and the settlement, and its telemetry ends
        // with the settlement (detached with it when the client hangs up first).
        let telemetry = self.telemetry.take();
        let span = telemetry
            .as_ref()
            .map_or_else(tracing::Span::none, |t| t.span().clone());
        let until = attempt.handler_deadline();
        let settled =
            run_and_settle(attempt, handler, self.fault, telemetry).instrument(span.clone());
        detached(settled, self.operation_id, until, span)
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
            .field("attempt", &self.attempt_number)
            .finish_non_exhaustive()
    }
}
