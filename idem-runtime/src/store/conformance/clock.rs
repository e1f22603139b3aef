//! The checks of [`RecordStore::clock`](crate::store::RecordStore::clock): the store's
//! own clock, read by the store.

use std::sync::Arc;
use std::time::Duration;

use crate::store::{Store, StoreClock, sample_clock, unix_now};

/// A store's clock goes on: two readings 50 ms apart (on this process's clock) differ by
/// 40 ms to 10 s, never backwards, and read as a time of this century, not a time the
/// caller gave. A store that judges by the caller's clock answers `None`, every time.
pub async fn the_clock_reads_the_stores_time(store: Arc<dyn Store>) {
    let first = store.clock().await.expect("the clock can be read");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = store.clock().await.expect("the clock can be read");
    match (first, second) {
        (None, None) => {}
        (Some(first), Some(second)) => {
            // 2020-01-01 to 2100-01-01.
            assert!(
                (1_577_836_800_000..4_102_444_800_000).contains(&first),
                "the store's clock reads {first}: not a time of this century"
            );
            assert!(
                (first + 40..first + 10_000).contains(&second),
                "the store's clock went from {first} to {second} in 50 ms"
            );
        }
        _ => panic!(
            "the store's clock is sometimes its own and sometimes not: {first:?}, {second:?}"
        ),
    }
}

/// A store with a clock of its own on this machine (the test servers): its reading is
/// within a second of this process's clock, a reading's round trip is under `max_rtt`,
/// and a [`StoreClock`] synchronised with it keeps within `max_rtt` of a later reading.
/// Prints the measured round trip and skew (`cargo test -- --nocapture`).
pub async fn the_clock_is_the_servers(store: Arc<dyn Store>, max_rtt: Duration) {
    let sample = sample_clock(&*store, 5)
        .await
        .expect("the clock can be read")
        .expect("a server's store has a clock of its own");
    assert!(
        sample.skew_ms().unsigned_abs() < 1_000,
        "a server on this machine is {} ms from its clock",
        sample.skew_ms()
    );
    assert!(
        sample.round_trip < max_rtt,
        "a reading took {:?}",
        sample.round_trip
    );
    let clock = StoreClock::new();
    clock.sync(&*store).await.expect("the clock can be read");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let later = sample_clock(&*store, 5).await.unwrap().unwrap();
    let kept = clock.now().expect("read");
    let bound = u64::try_from((later.error_bound() + max_rtt).as_millis()).unwrap();
    assert!(
        kept.abs_diff(later.store) <= bound,
        "kept {kept}, read {} (bound {bound} ms)",
        later.store
    );
    eprintln!(
        "store clock: best round trip {:?} (error bound {:?}), skew {} ms, kept vs read {} ms, local {}",
        sample.round_trip,
        sample.error_bound(),
        sample.skew_ms(),
        i128::from(kept) - i128::from(later.store),
        unix_now()
    );
}
