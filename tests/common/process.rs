//! A process of its own, for the tests that kill one: a runtime that is dropped with an
//! attempt in flight, as a process that dies stops every task at once, with no graceful
//! shutdown.

use std::time::{Duration, Instant};

/// A multi-threaded runtime (two workers) with time and I/O.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Waits until `done` holds, for 5 s at the most (the caller asserts what it waited for).
pub async fn wait_until(done: impl Fn() -> bool) {
    let waited = Instant::now();
    while !done() && waited.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
