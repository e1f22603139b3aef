//! The store's clock, kept in this process: one reading of it ([`ClockSample`], by
//! [`sample_clock`]) and the time on it since then ([`StoreClock`]).
//!
//! Leases are judged by the store's clock, not by the instance's (see "Time" in the
//! [`store`](super) docs for the reasoning): the runtime reads the store's time with
//! [`RecordStore::clock`] now and then, anchors the reading to this process's monotonic
//! clock, and passes every store call the store's time as it stands now, without a round
//! trip of its own.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use super::{RecordStore, StoreError, UnixMillis, unix_now};

/// One reading of a store's clock, with this process's clocks halfway through its round
/// trip.
#[derive(Clone, Copy, Debug)]
pub struct ClockSample {
    /// The store's time, unix milliseconds.
    pub store: UnixMillis,
    /// This process's system clock halfway through the round trip, unix milliseconds.
    pub local: UnixMillis,
    /// The monotonic instant halfway through the round trip.
    pub at: Instant,
    /// How long the reading took, from sending to answer.
    pub round_trip: Duration,
}

impl ClockSample {
    /// How far this process's system clock is ahead of the store's (negative: behind),
    /// in milliseconds.
    pub fn skew_ms(&self) -> i64 {
        let (local, store) = (as_i64(self.local), as_i64(self.store));
        local.saturating_sub(store)
    }

    /// How far the store's time taken for `at` may be from the store's true time then:
    /// half the round trip (the store read its clock somewhere within it) and one
    /// millisecond of the reading's resolution.
    pub fn error_bound(&self) -> Duration {
        self.round_trip / 2 + Duration::from_millis(1)
    }
}

/// Reads `store`'s clock `tries` times (at least once) and keeps the reading with the
/// shortest round trip: the one that says most precisely what the store's time was.
/// `None` when the store judges leases by this process's clock
/// ([`RecordStore::clock`]).
///
/// # Errors
///
/// The store's error when a reading fails.
pub async fn sample_clock(
    store: &dyn RecordStore,
    tries: usize,
) -> Result<Option<ClockSample>, StoreError> {
    let mut best: Option<ClockSample> = None;
    for _ in 0..tries.max(1) {
        let (wall, sent) = (unix_now(), Instant::now());
        let Some(store_now) = store.clock().await? else {
            return Ok(None);
        };
        let round_trip = sent.elapsed();
        let half = round_trip / 2;
        let sample = ClockSample {
            store: store_now,
            local: wall.saturating_add(u64::try_from(half.as_millis()).unwrap_or(u64::MAX)),
            at: sent + half,
            round_trip,
        };
        if best.is_none_or(|b| sample.round_trip < b.round_trip) {
            best = Some(sample);
        }
    }
    Ok(best)
}

/// The store's time now, read once (the best of three readings, [`sample_clock`]): for a
/// command that makes a few store calls and exits (`idem ops`), which then judges
/// records as the service's instances do. This process's clock for a store that judges
/// by it.
///
/// # Errors
///
/// The store's error when a reading fails.
pub async fn store_now(store: &dyn RecordStore) -> Result<UnixMillis, StoreError> {
    let clock = StoreClock::new();
    clock.sync(store).await?;
    Ok(clock.now().unwrap_or_else(unix_now))
}

/// The time on a store's clock, as this process keeps it between readings: the last
/// [`ClockSample`] plus the monotonic time since it was taken, so that a step of the
/// system clock (an NTP step, a `date -s`, `faketime`) changes nothing until the next
/// reading shows it. One atomic load and a monotonic clock read per [`StoreClock::now`].
///
/// ```
/// use idem_runtime::store::{MemoryStore, StoreClock, unix_now};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_runtime::store::StoreError> {
/// let clock = StoreClock::new();
/// assert_eq!(clock.now(), None, "not read yet");
/// clock.sync(&MemoryStore::new()).await?;   // a memory store judges by this process's clock
/// assert!(clock.now().unwrap().abs_diff(unix_now()) < 1_000);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct StoreClock {
    /// The origin of the monotonic microseconds below.
    epoch: Instant,
    /// The store's time in microseconds less the monotonic microseconds since `epoch`,
    /// [`UNREAD`] before the first reading, or [`LOCAL`] for a store that judges by this
    /// process's clock.
    offset_us: AtomicI64,
}

/// [`StoreClock::offset_us`] before the first reading.
const UNREAD: i64 = i64::MIN;
/// [`StoreClock::offset_us`] of a store that judges by this process's clock.
const LOCAL: i64 = i64::MIN + 1;

impl StoreClock {
    /// A clock not read yet.
    pub fn new() -> StoreClock {
        StoreClock {
            epoch: Instant::now(),
            offset_us: AtomicI64::new(UNREAD),
        }
    }

    /// The store's time now, unix milliseconds: the last reading plus the monotonic time
    /// since; this process's system clock for a store that judges by it; `None` before
    /// the first reading.
    pub fn now(&self) -> Option<UnixMillis> {
        match self.offset_us.load(Ordering::Acquire) {
            UNREAD => None,
            LOCAL => Some(unix_now()),
            offset => {
                let now_us = self.micros(Instant::now()).saturating_add(offset);
                Some(u64::try_from(now_us / 1000).unwrap_or(0))
            }
        }
    }

    /// Whether the clock has been read (or the store judges by this process's clock).
    pub fn is_read(&self) -> bool {
        self.offset_us.load(Ordering::Acquire) != UNREAD
    }

    /// Whether the store judges by this process's clock (its reading said so): there is
    /// nothing to read again.
    pub fn is_local(&self) -> bool {
        self.offset_us.load(Ordering::Acquire) == LOCAL
    }

    /// Takes `sample` as the store's time from now on; `None`: the store judges by this
    /// process's clock.
    pub fn set(&self, sample: Option<&ClockSample>) {
        let offset = match sample {
            Some(sample) => as_i64(sample.store)
                .saturating_mul(1000)
                .saturating_sub(self.micros(sample.at))
                .max(LOCAL + 1),
            None => LOCAL,
        };
        self.offset_us.store(offset, Ordering::Release);
    }

    /// Reads `store`'s clock (three times, keeping the best reading: [`sample_clock`])
    /// and takes it as the store's time from now on; returns the reading.
    ///
    /// # Errors
    ///
    /// The store's error when a reading fails; the clock is left as it was.
    pub async fn sync(&self, store: &dyn RecordStore) -> Result<Option<ClockSample>, StoreError> {
        let sample = sample_clock(store, 3).await?;
        self.set(sample.as_ref());
        Ok(sample)
    }

    /// Microseconds from `epoch` to `at` (negative before it).
    fn micros(&self, at: Instant) -> i64 {
        match at.checked_duration_since(self.epoch) {
            Some(after) => i64::try_from(after.as_micros()).unwrap_or(i64::MAX),
            None => -i64::try_from(self.epoch.duration_since(at).as_micros()).unwrap_or(i64::MAX),
        }
    }
}

impl Default for StoreClock {
    fn default() -> StoreClock {
        StoreClock::new()
    }
}

fn as_i64(ms: UnixMillis) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(store: UnixMillis, at: Instant) -> ClockSample {
        ClockSample {
            store,
            local: unix_now(),
            at,
            round_trip: Duration::from_millis(2),
        }
    }

    #[test]
    fn the_store_time_moves_on_with_the_monotonic_clock() {
        let clock = StoreClock::new();
        assert_eq!(clock.now(), None);
        let at = Instant::now();
        // A store 30 s behind this process's clock.
        let store = unix_now() - 30_000;
        clock.set(Some(&sample(store, at)));
        std::thread::sleep(Duration::from_millis(20));
        let now = clock.now().unwrap();
        let elapsed = u64::try_from(at.elapsed().as_millis()).unwrap();
        assert!(
            now >= store + 19 && now <= store + elapsed + 1,
            "{now} vs {store} + {elapsed}"
        );
    }

    #[test]
    fn a_reading_taken_before_the_clock_was_made_counts_from_then() {
        let at = Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        let clock = StoreClock::new();
        clock.set(Some(&sample(1_000_000, at)));
        let now = clock.now().unwrap();
        assert!((1_000_005..1_001_000).contains(&now), "{now}");
    }

    #[test]
    fn a_local_store_reads_the_system_clock() {
        let clock = StoreClock::new();
        clock.set(None);
        assert!(clock.is_read());
        assert!(clock.now().unwrap().abs_diff(unix_now()) <= 1);
    }

    #[test]
    fn skew_and_error_bound() {
        let s = ClockSample {
            store: 10_000,
            local: 40_000,
            at: Instant::now(),
            round_trip: Duration::from_millis(4),
        };
        assert_eq!(s.skew_ms(), 30_000);
        assert_eq!(s.error_bound(), Duration::from_millis(3));
        let behind = ClockSample { local: 0, ..s };
        assert_eq!(behind.skew_ms(), -10_000);
    }
}
