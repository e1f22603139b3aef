//! Capped exponential backoff with full jitter.
//!
//! The delay before retry number `retry` (counted from 0 for the first retry) is drawn
//! uniformly from `[0, min(cap, base * 2^retry)]`:
//!
//! ```text
//! sleep = random_between(0, min(cap, base * 2 ** retry))
//! ```
//!
//! This is "full jitter" from Marc Brooker, *Exponential Backoff And Jitter*, AWS
//! Architecture Blog, 2015
//! (<https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/>). Of the
//! schemes compared there it spreads the retries of clients that failed together the
//! most, for the least work on the server. A server's `Retry-After` (see
//! [`crate::retry_after`]) is a floor under the jittered delay.
//!
//! ```
//! use std::time::Duration;
//! use idem_client::backoff::{Backoff, Jitter};
//!
//! let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(10));
//! assert_eq!(backoff.ceiling(0), Duration::from_millis(100));
//! assert_eq!(backoff.ceiling(3), Duration::from_millis(800));
//! assert_eq!(backoff.ceiling(10), Duration::from_secs(10));
//!
//! let mut jitter = Jitter::seeded(7);
//! assert!(backoff.delay(3, None, &mut jitter) <= Duration::from_millis(800));
//! let retry_after = Some(Duration::from_secs(3));
//! assert_eq!(backoff.delay(3, retry_after, &mut jitter), Duration::from_secs(3));
//! ```

use std::fmt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Capped exponential backoff: the ceiling of each retry's delay doubles from `base` up
/// to `cap`, and the delay itself is drawn below the ceiling with full jitter.
///
/// The default is a base of 100 ms and a cap of 10 s: the first retry waits at most
/// 100 ms (gRPC's example `initialBackoff` too), the cap is reached at retry 7
/// (12.8 s cut to 10 s), and the nine retries of the contract ceiling of ten attempts
/// wait about 16 s in all on average (half the sum of their ceilings, 32.7 s).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
}

impl Backoff {
    /// A backoff whose first retry waits at most `base` and whose delays never exceed
    /// `cap` (unless a server's `Retry-After` asks for more).
    ///
    /// A `cap` below `base` is allowed: every ceiling is then `cap`.
    pub const fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff { base, cap }
    }

    /// The ceiling of the first retry's delay.
    pub const fn base(&self) -> Duration {
        self.base
    }

    /// The longest delay the backoff itself chooses.
    pub const fn cap(&self) -> Duration {
        self.cap
    }

    /// The ceiling of the delay before retry number `retry` (0 for the first retry):
    /// `min(cap, base * 2^retry)`, computed without overflow for every `retry` and
    /// `base`, up to [`Duration::MAX`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_client::backoff::Backoff;
    ///
    /// let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
    /// assert_eq!(backoff.ceiling(0), Duration::from_secs(1));
    /// assert_eq!(backoff.ceiling(5), Duration::from_secs(32));
    /// assert_eq!(backoff.ceiling(u32::MAX), Duration::from_secs(60));
    /// ```
    pub fn ceiling(&self, retry: u32) -> Duration {
        let mut ceiling = self.base;
        // Stops once the cap is reached, after at most about 94 doublings (1 ns doubled
        // that often passes `Duration::MAX`), or at once for a zero base.
        for _ in 0..retry {
            if ceiling >= self.cap || ceiling.is_zero() {
                break;
            }
            ceiling = ceiling.saturating_mul(2);
        }
        ceiling.min(self.cap)
    }

    /// The delay before retry number `retry` (0 for the first retry).
    ///
    /// Drawn uniformly from `[0, ceiling(retry)]` (to the nanosecond) by `jitter`, so
    /// never above the cap; then raised to `retry_after` if that is longer: a server's
    /// `Retry-After` wins over jitter, even above the cap.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_client::backoff::{Backoff, Jitter};
    ///
    /// let backoff = Backoff::new(Duration::from_secs(1), Duration::from_millis(10));
    /// let mut jitter = Jitter::from_entropy();
    /// assert!(backoff.delay(0, None, &mut jitter) <= Duration::from_millis(10));
    /// let server = Some(Duration::from_secs(3));
    /// assert_eq!(backoff.delay(0, server, &mut jitter), Duration::from_secs(3));
    /// ```
    pub fn delay(
        &self,
        retry: u32,
        retry_after: Option<Duration>,
        jitter: &mut Jitter,
    ) -> Duration {
        let ceiling = self.ceiling(retry).as_nanos();
        let jittered = from_nanos(jitter.rng.random_range(0..=ceiling));
        jittered.max(retry_after.unwrap_or(Duration::ZERO))
    }
}

impl Default for Backoff {
    /// A base of 100 ms and a cap of 10 s (see [`Backoff`]).
    fn default() -> Backoff {
        Backoff::new(Duration::from_millis(100), Duration::from_secs(10))
    }
}

/// A duration of `nanos` nanoseconds, [`Duration::MAX`] if it is longer.
fn from_nanos(nanos: u128) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let Ok(secs) = u64::try_from(nanos / NANOS_PER_SEC) else {
        return Duration::MAX;
    };
    // Below a billion: always fits.
    let subsec = u32::try_from(nanos % NANOS_PER_SEC).unwrap_or(0);
    Duration::new(secs, subsec)
}

/// The random source of jitter: from the operating system's entropy, or seeded for
/// reproducible delays.
///
/// A seeded jitter gives the same delays for the same seed with the same version of
/// `rand` (its [`StdRng`] may change algorithm between `rand` releases).
pub struct Jitter {
    rng: StdRng,
}

impl Jitter {
    /// A jitter seeded from the operating system's random source.
    ///
    /// If that source fails (rare), the seed is taken from the clock instead: jitter needs
    /// spread between clients, not secrecy.
    pub fn from_entropy() -> Jitter {
        let rng = StdRng::try_from_os_rng().unwrap_or_else(|_| StdRng::seed_from_u64(clock_seed()));
        Jitter { rng }
    }

    /// A jitter that draws the same delays every time for the same `seed`.
    pub fn seeded(seed: u64) -> Jitter {
        Jitter {
            rng: StdRng::seed_from_u64(seed),
        }
    }
}

impl fmt::Debug for Jitter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Jitter").finish_non_exhaustive()
    }
}

/// A seed from the clock's nanoseconds, for when the operating system gives no entropy.
fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_cap_below_the_base_caps_every_delay() {
        // The issue's case: base 1 s, cap 10 ms, 100 attempts.
        let backoff = Backoff::new(Duration::from_secs(1), 10 * MS);
        let mut jitter = Jitter::from_entropy();
        for retry in 0..100 {
            assert_eq!(backoff.ceiling(retry), 10 * MS);
            let delay = backoff.delay(retry, None, &mut jitter);
            assert!(delay <= 10 * MS, "retry {retry}: {delay:?}");
        }
    }

    #[test]
    fn ceilings_double_up_to_the_cap() {
        let backoff = Backoff::default();
        assert_eq!(backoff.base(), 100 * MS);
        assert_eq!(backoff.cap(), Duration::from_secs(10));
        let ceilings: Vec<_> = (0..9).map(|retry| backoff.ceiling(retry)).collect();
        let expected = [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000].map(|ms| ms * MS);
        assert_eq!(ceilings, expected);
    }

    #[test]
    fn ceiling_never_overflows() {
        let huge = [
            Duration::MAX,
            Duration::from_secs(u64::MAX),
            Duration::new(u64::MAX / 2, 1),
        ];
        for base in huge
            .into_iter()
            .chain([Duration::from_nanos(1), Duration::ZERO])
        {
            for cap in [Duration::MAX, Duration::from_secs(1), Duration::ZERO] {
                let backoff = Backoff::new(base, cap);
                for retry in [0, 1, 2, 63, 64, 95, 96, 127, 128, u32::MAX - 1, u32::MAX] {
                    assert!(backoff.ceiling(retry) <= cap);
                    assert_eq!(backoff.ceiling(retry), reference_ceiling(base, cap, retry));
                }
            }
        }
        let uncapped = Backoff::new(Duration::from_nanos(1), Duration::MAX);
        assert_eq!(uncapped.ceiling(63), Duration::from_nanos(1 << 63));
        assert_eq!(uncapped.ceiling(u32::MAX), Duration::MAX);
        assert_eq!(
            Backoff::new(Duration::ZERO, Duration::MAX).ceiling(u32::MAX),
            Duration::ZERO
        );
        let mut jitter = Jitter::seeded(0);
        let delay = uncapped.delay(u32::MAX, Some(Duration::MAX), &mut jitter);
        assert_eq!(delay, Duration::MAX);
        let _ = uncapped.delay(u32::MAX, None, &mut jitter);
    }

    #[test]
    fn a_seed_gives_one_sequence() {
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let sequence = |seed| {
            let mut jitter = Jitter::seeded(seed);
            (0..20)
                .map(|retry| backoff.delay(retry, None, &mut jitter))
                .collect::<Vec<_>>()
        };
        assert_eq!(sequence(42), sequence(42));
        assert_ne!(sequence(42), sequence(43));
    }

    #[test]
    fn retry_after_wins_over_jitter_and_cap() {
        let backoff = Backoff::new(Duration::from_secs(1), 10 * MS);
        let mut jitter = Jitter::from_entropy();
        for retry in 0..100 {
            let delay = backoff.delay(retry, Some(Duration::from_secs(3)), &mut jitter);
            assert_eq!(delay, Duration::from_secs(3));
        }
    }

    #[test]
    fn a_shorter_retry_after_leaves_the_jittered_delay() {
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        for seed in 0..100 {
            let jittered = backoff.delay(5, None, &mut Jitter::seeded(seed));
            let below = jittered / 2;
            assert_eq!(
                backoff.delay(5, Some(below), &mut Jitter::seeded(seed)),
                jittered
            );
        }
    }

    #[test]
    fn delays_spread_over_the_whole_range() {
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        let mut jitter = Jitter::seeded(1);
        let ceiling = backoff.ceiling(2);
        let delays: Vec<_> = (0..10_000)
            .map(|_| backoff.delay(2, None, &mut jitter))
            .collect();
        let mean = delays.iter().sum::<Duration>() / 10_000;
        let half = ceiling / 2;
        assert!(
            mean > half.mul_f64(0.95) && mean < half.mul_f64(1.05),
            "mean {mean:?}"
        );
        assert!(delays.iter().any(|d| *d < ceiling / 20));
        assert!(delays.iter().any(|d| *d > ceiling - ceiling / 20));
        assert!(delays.iter().all(|d| *d <= ceiling));
    }

    #[test]
    fn jitter_debug_hides_the_state() {
        assert_eq!(format!("{:?}", Jitter::seeded(1)), "Jitter { .. }");
    }

    /// `min(cap, base * 2^retry)` in nanoseconds, the obvious way.
    fn reference_ceiling(base: Duration, cap: Duration, retry: u32) -> Duration {
        let factor = 1u128.checked_shl(retry);
        let nanos = match factor.and_then(|f| base.as_nanos().checked_mul(f)) {
            Some(nanos) => nanos,
            None if base.is_zero() => 0,
            None => u128::MAX,
        };
        from_nanos(nanos.min(cap.as_nanos()))
    }

    fn duration() -> impl Strategy<Value = Duration> {
        prop_oneof![
            (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
            (0u64..100_000_000_000).prop_map(Duration::from_nanos),
            Just(Duration::MAX),
            Just(Duration::ZERO),
        ]
    }

    fn retry() -> impl Strategy<Value = u32> {
        prop_oneof![0u32..200, any::<u32>()]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(5_000))]

        #[test]
        fn delay_stays_within_its_bounds(
            base in duration(),
            cap in duration(),
            retry in retry(),
            retry_after in proptest::option::of(duration()),
            seed in any::<u64>(),
        ) {
            let backoff = Backoff::new(base, cap);
            let ceiling = backoff.ceiling(retry);
            let floor = retry_after.unwrap_or(Duration::ZERO);
            let delay = backoff.delay(retry, retry_after, &mut Jitter::seeded(seed));
            prop_assert!(ceiling <= cap);
            prop_assert!(delay >= floor);
            prop_assert!(delay <= ceiling.max(floor));
        }

        #[test]
        fn ceiling_is_min_of_cap_and_doubled_base(base in duration(), cap in duration(), retry in retry()) {
            let backoff = Backoff::new(base, cap);
            prop_assert_eq!(backoff.ceiling(retry), reference_ceiling(base, cap, retry));
            prop_assert!(backoff.ceiling(retry) <= backoff.ceiling(retry.saturating_add(1)));
        }
    }
}
