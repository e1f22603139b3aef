//! A future that runs to its end even when its caller stops waiting for it.
//!
//! An attempt's handler and the store write that settles it must not be cancelled
//! halfway when the client hangs up (the typical lost answer: the effect commits, the
//! answer is stored, and the retry gets the replay). Spawning the attempt on a task of its
//! own gives that, at the cost of a task per request: a schedule, a wake-up of the
//! connection's task, and often a move to another worker's cache. [`Detach`] gives the
//! same guarantee without the task in the common case: the future is polled in place, on
//! the connection's own task, and only when it is dropped before its end (the connection
//! closed) is the rest of it spawned on the runtime it started on, where it runs to its
//! end as the spawned task would have.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::runtime::Handle;

/// The boxed future a [`Detach`] runs.
type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Polls a future in place; if dropped before the future's end, spawns the rest of it on
/// the runtime it was made on, whose result is then dropped. See the module docs.
pub(crate) struct Detach<T: Send + 'static> {
    /// `None` once the future has ended (or has been handed to the runtime).
    future: Option<Boxed<T>>,
    runtime: Handle,
}

impl<T: Send + 'static> Detach<T> {
    /// Wraps `future`, boxed. Must be called within a tokio runtime (as every request
    /// handler is); outside of one, gives `future` back, for the caller to run it as it
    /// sees fit.
    pub(crate) fn new<F>(future: F) -> Result<Detach<T>, F>
    where
        F: Future<Output = T> + Send + 'static,
    {
        match Handle::try_current() {
            Ok(runtime) => Ok(Detach {
                future: Some(Box::pin(future)),
                runtime,
            }),
            Err(_) => Err(future),
        }
    }
}

impl<T: Send + 'static> Future for Detach<T> {
    type Output = T;

    /// Polls the inner future. Polled again after it returned `Ready` (which an `.await`
    /// never does), it stays `Pending`.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let Some(future) = self.future.as_mut() else {
            return Poll::Pending;
        };
        let output = std::task::ready!(future.as_mut().poll(cx));
        self.future = None;
        Poll::Ready(output)
    }
}

impl<T: Send + 'static> Drop for Detach<T> {
    fn drop(&mut self) {
        if let Some(rest) = self.future.take() {
            // The caller stopped waiting: what is left runs on its own, to its end. A
            // runtime that is shutting down drops it, as it would drop a spawned task.
            drop(self.runtime.spawn(async move {
                let _ = rest.await;
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn polled_to_its_end_in_place() {
        let detach = Detach::new(async { 7 }).ok().unwrap();
        assert_eq!(detach.await, 7);
    }

    #[tokio::test]
    async fn dropped_midway_it_still_runs_to_its_end() {
        let finished = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&finished);
        let detach = Detach::new(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            flag.store(true, Ordering::SeqCst);
        })
        .ok()
        .unwrap();
        // The caller gives up after 5 ms, as a client that hangs up.
        let gave_up = tokio::time::timeout(Duration::from_millis(5), detach).await;
        assert!(gave_up.is_err());
        assert!(!finished.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            finished.load(Ordering::SeqCst),
            "the rest ran on the runtime"
        );
    }

    #[test]
    fn outside_a_runtime_there_is_none() {
        assert!(Detach::new(async {}).is_err());
    }
}
