//! Stage 10, run: the handler to its end, detached from the connection, its panics
//! caught, in the attempt's span, within the attempt's time; then its answer settled.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;

use axum::response::Response;
use futures_util::FutureExt;
use tokio::time::Instant;
use tracing::Span;

use super::detach::Detach;
use super::{Ended, Held};
use crate::fault::{TestFault, run_test_fault};
use crate::telemetry::AttemptTelemetry;
use crate::{OperationId, answer};

/// The handler's future, its answer made a [`Response`]: boxed, so that what runs and
/// settles it is compiled once for every handler.
pub(super) type Handler = Pin<Box<dyn Future<Output = Response> + Send>>;

/// Runs `handler` (or the test `fault` in its place) under `held`, settles its answer, and
/// ends the attempt's telemetry with the settlement.
pub(super) async fn run_and_settle(
    held: Held,
    handler: Handler,
    fault: Option<TestFault>,
    telemetry: Option<AttemptTelemetry>,
) -> Response {
    let response = match fault {
        Some(fault) => match run_test_fault(fault, handler).await {
            // As if the handler had answered it.
            Ok(response) => held.settle(response).await,
            // The attempt dies as its process would: its lease is no longer renewed
            // (dropped), nothing is recorded, the connection breaks (its telemetry,
            // dropped unfinished, ends as `unknown`, `cancelled`).
            Err(broken) => return broken,
        },
        None => run(&held, handler).await,
    };
    if let Some(telemetry) = telemetry {
        telemetry.settled(&response, held.settled(), held.operation_id, held.attempt);
    }
    response
}

/// Runs `handler` within the handler's time, panics caught (in the handler or in the
/// making of its response), and settles what it came to.
async fn run(held: &Held, handler: Handler) -> Response {
    let ran = tokio::time::timeout_at(
        held.handler_deadline(),
        AssertUnwindSafe(handler).catch_unwind(),
    )
    .await;
    match ran {
        Ok(Ok(response)) => held.settle(response).await,
        Ok(Err(_panic)) => held.settle_ended(Ended::Panicked).await,
        Err(_elapsed) => held.settle_ended(Ended::TimedOut).await,
    }
}

/// Polls `settled` in place, and runs it to its end on the runtime if the connection
/// closes first ([`Detach`]): the handler is never cancelled by a client that hangs up.
/// A panic while settling is answered 503 `attempt-failed`, with a `Retry-After` past
/// `until` (the attempt's time), after which recovery decides. `settled` is boxed once,
/// by the [`Detach`], and the future returned holds that box, not the future itself.
/// Called off the runtime (on a thread of the handler's own, the future then awaited on
/// the runtime), it looks for the runtime when first polled, as an `async fn` would.
pub(super) fn detached(
    settled: impl Future<Output = Response> + Send + 'static,
    operation_id: OperationId,
    until: Instant,
    span: Span,
) -> Pin<Box<dyn Future<Output = Response> + Send>> {
    let settled = AssertUnwindSafe(settled).catch_unwind();
    match Detach::new(settled) {
        Ok(detached) => Box::pin(awaited(detached, operation_id, until, span)),
        Err(settled) => Box::pin(async move {
            match Detach::new(settled) {
                Ok(detached) => awaited(detached, operation_id, until, span).await,
                Err(_) => {
                    answer::attempt_failed(operation_id, "could not run: no tokio runtime", 1)
                }
            }
        }),
    }
}

/// The answer of a [`detached`] attempt: its response, or 503 `attempt-failed` when
/// settling it panicked.
async fn awaited(
    detached: Detach<std::thread::Result<Response>>,
    operation_id: OperationId,
    until: Instant,
    span: Span,
) -> Response {
    match detached.await {
        Ok(response) => response,
        Err(_panic) => {
            tracing::error!(
                parent: &span,
                outcome = "panicked",
                "idem: settling the attempt failed; the outcome is unknown until the lease ends and recovery decides"
            );
            let left = until.saturating_duration_since(Instant::now());
            answer::attempt_failed(
                operation_id,
                "failed while its answer was settled",
                left.as_secs().saturating_add(1),
            )
        }
    }
}
