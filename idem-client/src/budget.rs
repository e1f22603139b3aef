//! A retry budget per client: gRPC's retry throttling (gRFC A6, "gRPC Retry Design",
//! section "Throttling Retry Attempts and Hedged RPCs",
//! <https://github.com/grpc/proposal/blob/master/A6-client-retries.md>).
//!
//! Backoff spaces the retries of one request; a budget stops retries altogether when
//! most requests to a server fail, so that a client does not multiply the load of a
//! server that is already down. The bucket holds `max_tokens` tokens and starts full:
//!
//! - every failed attempt (a failure the client could retry) takes 1 token,
//! - every successful attempt gives back `token_ratio` tokens,
//! - the count stays between 0 and `max_tokens`,
//! - a retry may start only while the count is above `max_tokens / 2`.
//!
//! The first attempt of a request is never throttled: ask [`RetryBudget::allows_retry`]
//! before retries only.
//!
//! ```
//! use idem_client::budget::RetryBudget;
//!
//! let budget = RetryBudget::default(); // 10 tokens, 0.1 per success
//! assert!(budget.allows_retry());
//! for _ in 0..5 {
//!     budget.record_failure();
//! }
//! assert_eq!(budget.tokens(), 5.0);
//! assert!(!budget.allows_retry()); // 5 is not above 10 / 2
//! budget.record_success();
//! assert_eq!(budget.tokens(), 5.1);
//! assert!(budget.allows_retry());
//! ```

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// Thousandths of a token in one token.
const MILLI: u32 = 1000;

/// The largest `max_tokens`, as in gRPC (gRPC-Go refuses a `maxTokens` outside
/// `(0, 1000]`).
const MAX_TOKENS_LIMIT: u32 = 1000;

/// The retry budget of one client, shared by all its requests.
///
/// A clone shares the bucket: record on any clone, and every clone sees it.
///
/// Tokens are counted in thousandths, in one atomic integer: gRPC's precision (gRFC A6
/// supports "up to 3 decimal places" of `tokenRatio`), without the drift of adding
/// floating-point ratios (ten successes at 0.1 are exactly one token), and without a lock.
///
/// The default is gRFC A6's example, `max_tokens` 10 and `token_ratio` 0.1: five
/// failures in a row stop retries, and every failure takes ten successes to repay, so
/// that in the long run retries go on only while failures stay under about a tenth of
/// successes.
#[derive(Clone, Debug)]
pub struct RetryBudget {
    /// `None` for [`RetryBudget::unlimited`].
    bucket: Option<Arc<Bucket>>,
}

/// The token bucket, in thousandths of a token.
#[derive(Debug)]
struct Bucket {
    max: u32,
    ratio: u32,
    tokens: AtomicU32,
}

impl RetryBudget {
    /// A budget of `max_tokens` tokens (starting full) that gains `token_ratio` tokens
    /// per success.
    ///
    /// `max_tokens` must be in `(0, 1000]` (gRPC's bound) and `token_ratio` a number in
    /// `(0, 1]` (gRFC A6 requires more than zero; above one, a success would repay more
    /// than a failure costs). The ratio is kept to the nearest thousandth of a token, and
    /// a ratio below half a thousandth counts as one thousandth, so that successes always
    /// refill the bucket.
    ///
    /// ```
    /// use idem_client::budget::RetryBudget;
    ///
    /// let budget = RetryBudget::new(100, 0.5)?;
    /// assert_eq!(budget.tokens(), 100.0);
    /// assert!(RetryBudget::new(0, 0.5).is_err());
    /// assert!(RetryBudget::new(100, f64::NAN).is_err());
    /// # Ok::<(), idem_client::budget::BudgetError>(())
    /// ```
    pub fn new(max_tokens: u32, token_ratio: f64) -> Result<RetryBudget, BudgetError> {
        if max_tokens == 0 || max_tokens > MAX_TOKENS_LIMIT {
            return Err(BudgetError::MaxTokens(max_tokens));
        }
        // Written so that NaN fails too.
        if !(token_ratio > 0.0 && token_ratio <= 1.0) {
            return Err(BudgetError::TokenRatio(token_ratio));
        }
        // In (0, 1000] after rounding: the cast cannot truncate.
        let ratio = ((token_ratio * f64::from(MILLI)).round() as u32).max(1);
        Ok(RetryBudget::full(max_tokens * MILLI, ratio))
    }

    /// A full budget of `max` thousandths of a token, gaining `ratio` thousandths per
    /// success.
    fn full(max: u32, ratio: u32) -> RetryBudget {
        RetryBudget {
            bucket: Some(Arc::new(Bucket {
                max,
                ratio,
                tokens: AtomicU32::new(max),
            })),
        }
    }

    /// A budget that never throttles: it allows every retry and records nothing.
    pub fn unlimited() -> RetryBudget {
        RetryBudget { bucket: None }
    }

    /// Records a successful attempt: gives back `token_ratio` tokens, up to `max_tokens`.
    pub fn record_success(&self) {
        if let Some(bucket) = &self.bucket {
            bucket.update(|tokens| tokens.saturating_add(bucket.ratio).min(bucket.max));
        }
    }

    /// Records a failed attempt, one the client could retry (a retryable status, a
    /// transport failure, a server asking it to wait): takes one token, down to zero.
    ///
    /// Failures the client cannot retry (a request the server refuses as malformed, say)
    /// say nothing about the server's health and are not recorded, as in gRFC A6.
    pub fn record_failure(&self) {
        if let Some(bucket) = &self.bucket {
            bucket.update(|tokens| tokens.saturating_sub(MILLI));
        }
    }

    /// Whether a retry may start now: while the tokens are above `max_tokens / 2`.
    ///
    /// Asking takes nothing: the retry's own outcome is recorded when it ends.
    pub fn allows_retry(&self) -> bool {
        match &self.bucket {
            Some(bucket) => bucket.tokens.load(Ordering::Relaxed) > bucket.max / 2,
            None => true,
        }
    }

    /// The tokens now, for telemetry and tests: between 0 and `max_tokens`, to the
    /// thousandth; infinite for an [unlimited](RetryBudget::unlimited) budget.
    pub fn tokens(&self) -> f64 {
        match &self.bucket {
            Some(bucket) => f64::from(bucket.tokens.load(Ordering::Relaxed)) / f64::from(MILLI),
            None => f64::INFINITY,
        }
    }
}

impl Default for RetryBudget {
    /// gRFC A6's example: `max_tokens` 10, `token_ratio` 0.1 (see [`RetryBudget`]).
    fn default() -> RetryBudget {
        RetryBudget::full(10 * MILLI, MILLI / 10)
    }
}

impl Bucket {
    /// Applies `change` to the tokens atomically.
    fn update(&self, change: impl Fn(u32) -> u32) {
        // Relaxed is enough: the count is the only data, and every change to it is one
        // atomic read-modify-write, so none is lost. The closure always returns `Some`,
        // so the result is always `Ok`.
        let _ = self
            .tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tokens| {
                Some(change(tokens))
            });
    }
}

/// Why [`RetryBudget::new`] refused its parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BudgetError {
    /// `max_tokens` is not in `(0, 1000]`.
    MaxTokens(u32),
    /// `token_ratio` is not a number in `(0, 1]`.
    TokenRatio(f64),
}

impl fmt::Display for BudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BudgetError::MaxTokens(max_tokens) => write!(
                f,
                "a retry budget's max_tokens must be in (0, {MAX_TOKENS_LIMIT}], not {max_tokens}"
            ),
            BudgetError::TokenRatio(token_ratio) => write!(
                f,
                "a retry budget's token_ratio must be a number in (0, 1], not {token_ratio}"
            ),
        }
    }
}

impl std::error::Error for BudgetError {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    #[test]
    fn a_fresh_budget_is_full_and_allows() {
        let budget = RetryBudget::default();
        assert_eq!(budget.tokens(), 10.0);
        assert!(budget.allows_retry());
        let bucket = budget.bucket.as_deref().expect("limited");
        let same = RetryBudget::new(10, 0.1).expect("valid");
        let expected = same.bucket.as_deref().expect("limited");
        assert_eq!((bucket.max, bucket.ratio), (expected.max, expected.ratio));
    }

    #[test]
    fn half_the_tokens_in_failures_stop_retries() {
        let budget = RetryBudget::default();
        for failures in 1..=4 {
            budget.record_failure();
            assert!(budget.allows_retry(), "after {failures} failures");
        }
        budget.record_failure();
        assert_eq!(budget.tokens(), 5.0);
        assert!(!budget.allows_retry());

        let odd = RetryBudget::new(7, 0.5).expect("valid");
        for _ in 0..3 {
            odd.record_failure();
        }
        assert!(odd.allows_retry()); // 4 > 3.5
        odd.record_failure();
        assert!(!odd.allows_retry()); // 3 <= 3.5
    }

    #[test]
    fn successes_restore_the_budget() {
        let budget = RetryBudget::default();
        for _ in 0..6 {
            budget.record_failure();
        }
        assert_eq!(budget.tokens(), 4.0);
        // Ten successes at 0.1 are one token: back to 5.0, still not above 5.
        for successes in 0..10 {
            assert!(!budget.allows_retry(), "after {successes} successes");
            budget.record_success();
        }
        assert_eq!(budget.tokens(), 5.0);
        assert!(!budget.allows_retry());
        budget.record_success();
        assert_eq!(budget.tokens(), 5.1);
        assert!(budget.allows_retry());
    }

    #[test]
    fn ratios_add_without_drift() {
        let budget = RetryBudget::new(1000, 0.3).expect("valid");
        for _ in 0..1000 {
            budget.record_failure();
        }
        for _ in 0..10 {
            budget.record_success();
        }
        assert_eq!(budget.tokens(), 3.0);
    }

    #[test]
    fn tokens_stay_between_zero_and_max() {
        let budget = RetryBudget::new(3, 1.0).expect("valid");
        for _ in 0..10 {
            budget.record_success();
            assert_eq!(budget.tokens(), 3.0);
        }
        for _ in 0..10 {
            budget.record_failure();
            assert!(budget.tokens() >= 0.0);
        }
        assert_eq!(budget.tokens(), 0.0);
        budget.record_success();
        assert_eq!(budget.tokens(), 1.0);
    }

    #[test]
    fn a_tiny_ratio_still_refills() {
        let budget = RetryBudget::new(1, f64::MIN_POSITIVE).expect("valid");
        budget.record_failure();
        assert_eq!(budget.tokens(), 0.0);
        for _ in 0..1000 {
            budget.record_success();
        }
        assert_eq!(budget.tokens(), 1.0);
    }

    #[test]
    fn parameters_out_of_range_are_refused() {
        for max_tokens in [0, 1001, u32::MAX] {
            let error = RetryBudget::new(max_tokens, 0.1).expect_err("invalid");
            assert_eq!(error, BudgetError::MaxTokens(max_tokens));
            let message = error.to_string();
            assert!(
                message.contains("max_tokens must be in (0, 1000]"),
                "{message}"
            );
            assert!(message.contains(&max_tokens.to_string()), "{message}");
        }
        for token_ratio in [
            0.0,
            -0.0,
            -0.1,
            1.5,
            1.0001,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ] {
            let error = RetryBudget::new(10, token_ratio).expect_err("invalid");
            assert!(matches!(error, BudgetError::TokenRatio(_)), "{token_ratio}");
            let message = error.to_string();
            assert!(
                message.contains("token_ratio must be a number in (0, 1]"),
                "{message}"
            );
        }
        assert!(RetryBudget::new(1, 1.0).is_ok());
        assert!(RetryBudget::new(1000, 0.001).is_ok());
    }

    #[test]
    fn an_unlimited_budget_never_throttles() {
        let budget = RetryBudget::unlimited();
        for _ in 0..1000 {
            budget.record_failure();
        }
        assert!(budget.allows_retry());
        assert_eq!(budget.tokens(), f64::INFINITY);
    }

    #[test]
    fn a_clone_shares_the_bucket() {
        let budget = RetryBudget::default();
        let clone = budget.clone();
        for _ in 0..5 {
            clone.record_failure();
        }
        assert_eq!(budget.tokens(), 5.0);
        assert!(!budget.allows_retry());
        budget.record_success();
        assert_eq!(clone.tokens(), 5.1);
    }

    #[test]
    fn concurrent_use_stays_within_bounds() {
        let budget = RetryBudget::new(10, 0.1).expect("valid");
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let budget = budget.clone();
                thread::spawn(move || {
                    for op in 0..1000 {
                        if (op + t) % 3 == 0 {
                            budget.record_success();
                        } else {
                            budget.record_failure();
                        }
                        let _ = budget.allows_retry();
                        let tokens = budget.tokens();
                        assert!((0.0..=10.0).contains(&tokens), "{tokens}");
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no thread panicked");
        }
        let tokens = budget.tokens();
        assert!((0.0..=10.0).contains(&tokens), "{tokens}");
    }

    #[test]
    fn concurrent_changes_are_not_lost() {
        // 8 threads take 400 tokens of 1000 and give back 8 * 500 * 0.001 = 4: no clamping
        // happens, so the count is exact if no update was lost.
        let budget = RetryBudget::new(1000, 0.001).expect("valid");
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let budget = budget.clone();
                thread::spawn(move || {
                    for op in 0..550 {
                        if op < 50 {
                            budget.record_failure();
                        } else {
                            budget.record_success();
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no thread panicked");
        }
        assert_eq!(budget.tokens(), 604.0);
    }
}
