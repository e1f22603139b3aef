//! A client's budget in a store: how many live records it may hold and how many bytes of
//! results, checked by [`RecordStore::begin`](super::RecordStore::begin) before a new key
//! is registered.
//!
//! # What is counted
//!
//! A client is the [`RecordKey::client`](super::RecordKey::client) of its records, across
//! every operation. Its usage is:
//!
//! - **records**: its records whose TTL has not passed (`expires_at > now`), in any state;
//! - **bytes**: the sizes of their stored results ([`StoredResponse::size`](super::StoredResponse::size):
//!   the body and the replayed headers), counted when the result is stored by
//!   `complete` (a result an operator stores with `resolve` is not counted).
//!
//! `begin` refuses a **new operation** (a key the client does not hold, or one whose TTL
//! has passed) with [`Begin::OverBudget`](super::Begin::OverBudget) when the client holds
//! `records` or more live records, or `bytes` or more bytes, and writes nothing. A key the
//! client already holds is never refused: a retry of a released key, a duplicate, a replay
//! of a completed one are answered as without a budget.
//!
//! # How far a count may overshoot
//!
//! The check and the registration are one atomic step for the one key, but not across a
//! client's keys: no lock on the client is taken, so two registrations of the same client
//! that run at the same time may both see room for one. And a result's bytes are known
//! only when it is stored, after the check. Hence, for a client with `n` requests in
//! flight at once (registered, not yet settled):
//!
//! - records: at most `budget.records + n - 1` (SQLite's one writer makes it exact:
//!   at most `budget.records`);
//! - bytes: at most `budget.bytes + n × max_result` (the store's largest result,
//!   [`DEFAULT_MAX_RESULT`](super::DEFAULT_MAX_RESULT) unless set), plus one result: the
//!   check lets a client below its budget register, and that result may take it over.
//!
//! A record is counted until the expiry it was registered with (`now` plus the TTL, or
//! the end of its first lease if later). Leases that later hold it past that time (an
//! attempt renewed by its heartbeat, a takeover) extend it: the SQL stores, which count
//! their rows by their expiry, count it for the extra time; the memory and Redis stores
//! do not. A store may count it, and give it as the oldest expiry, up to
//! [`COUNT_SLACK_MS`] longer: the memory and Redis stores count by expiry bucket of that
//! width, so that a new key costs them the same whatever the client holds; the SQL
//! stores count their rows exactly.

use std::collections::BTreeMap;

use dashmap::DashMap;

use super::UnixMillis;

/// How long past its registered expiry a store may still count a record, and report it as
/// the client's oldest, in milliseconds: the width of the memory and Redis stores' expiry
/// buckets. The SQL stores count exactly.
pub const COUNT_SLACK_MS: UnixMillis = 10_000;

/// How much one client may keep in a store: its live records and the bytes of their
/// results. Set on the handle ([`crate::IdemBuilder::client_budget`]); the defaults are
/// [`ClientBudget::DEFAULT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientBudget {
    /// The most live records a client may hold before a new key is refused.
    pub records: u64,
    /// The most bytes of stored results ([`StoredResponse::size`](super::StoredResponse::size))
    /// a client may hold before a new key is refused.
    pub bytes: u64,
}

impl ClientBudget {
    /// 10,000 records and 16 MiB of results per client.
    ///
    /// Why these sizes: a store has no size idem can read, so the defaults are chosen
    /// against the smallest store a service is likely to run, a 64 MiB Redis, which a
    /// client at its full budget fills to about a third (16 MiB of results, and about
    /// 5 MB for 10,000 records of a few hundred bytes each); 16 MiB is sixteen of the
    /// largest results a store keeps by default ([`super::DEFAULT_MAX_RESULT`]), and
    /// 10,000 live keys is a new key every 9 seconds for a whole day at a 24 h TTL.
    /// A store shared by many clients needs its own: see the guide on stores.
    pub const DEFAULT: ClientBudget = ClientBudget {
        records: 10_000,
        bytes: 16 * 1024 * 1024,
    };

    /// A budget that counts the record and refuses nothing: what the runtime registers
    /// with while a client's allowance lasts ([`crate::IdemBuilder::client_budget`]).
    /// A store that keeps its own accounting (memory, Redis) counts the record; one that
    /// counts from its rows (SQLite, PostgreSQL) does nothing extra.
    pub const COUNT_ONLY: ClientBudget = ClientBudget {
        records: u64::MAX,
        bytes: u64::MAX,
    };

    /// A budget of `records` live records and `bytes` bytes of results.
    pub const fn new(records: u64, bytes: u64) -> ClientBudget {
        ClientBudget { records, bytes }
    }

    /// Whether a client that holds `usage` may register one more new key.
    pub const fn admits(&self, usage: &Usage) -> bool {
        usage.records < self.records && usage.bytes < self.bytes
    }

    /// Whether this budget refuses nothing ([`ClientBudget::COUNT_ONLY`]), so that a
    /// store need not count for it.
    pub const fn refuses_nothing(&self) -> bool {
        self.records == u64::MAX && self.bytes == u64::MAX
    }
}

/// A client's usage as [`RecordStore::client_usage`](super::RecordStore::client_usage)
/// counted it, and when its oldest live record expires.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientUsage {
    /// Its live records (counted up to the cap asked for) and their results' bytes.
    pub usage: Usage,
    /// When its oldest live record expires, unix milliseconds; `None` when it has none.
    pub oldest_expiry: Option<UnixMillis>,
}

impl Default for ClientBudget {
    fn default() -> ClientBudget {
        ClientBudget::DEFAULT
    }
}

/// What a client holds in a store at a time: its live records and their results' bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Usage {
    /// Live records (TTL not passed).
    pub records: u64,
    /// Bytes of their stored results.
    pub bytes: u64,
}

/// Why [`RecordStore::begin`](super::RecordStore::begin) refused a new key: the client's
/// usage when it looked, and when its oldest live record expires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverBudget {
    /// The client's usage as the store counted it (the records may be counted only up
    /// to the budget: a store stops counting once it is reached).
    pub usage: Usage,
    /// When the client's oldest live record expires, unix milliseconds: the earliest
    /// time a new key may fit (it may not, if the client keeps others busy).
    pub retry_at: UnixMillis,
}

impl OverBudget {
    /// Whole seconds from `now` until [`OverBudget::retry_at`], at least 1: the
    /// `Retry-After` of the answer.
    pub fn retry_after_secs(&self, now: UnixMillis) -> u64 {
        self.retry_at.saturating_sub(now).div_ceil(1000).max(1)
    }
}

/// The usage of every client of a store that counts in memory (the memory store): one
/// [`Tally`] per client, each locked on its own.
#[derive(Debug, Default)]
pub(crate) struct Tallies {
    clients: DashMap<Box<str>, Tally>,
}

/// One client's records and their results' bytes, by **expiry bucket** as the Redis
/// store counts them: a record counts in the bucket of its registered expiry,
/// [`bucket_of`], until the bucket's end (at most [`COUNT_SLACK_MS`] after the record's
/// expiry). A new key costs the same whatever the client holds (one bucket's count, not
/// one entry per record in an ordered set and a map), and the tally takes memory by the
/// bucket: a day's TTL is at most 8,640 buckets however many records fill them.
#[derive(Debug, Default)]
struct Tally {
    /// Records and bytes by bucket number; only buckets that have not ended.
    buckets: BTreeMap<u32, Usage>,
    /// The sums over `buckets`.
    total: Usage,
}

/// The bucket of a record registered to expire at `expires_at` (unix milliseconds): its
/// number, `ceil(expires_at / COUNT_SLACK_MS)`, at least 1 (0 means "not counted" in a
/// record that keeps its bucket). 32 bits, so that a record keeps it in 4 bytes: every
/// expiry past the year 3331 counts in the last bucket, [`u32::MAX`], which never ends
/// (such a record is counted longer than it lives, never shorter).
pub(crate) fn bucket_of(expires_at: UnixMillis) -> u32 {
    u32::try_from(expires_at.div_ceil(COUNT_SLACK_MS))
        .unwrap_or(u32::MAX)
        .max(1)
}

/// When bucket `bucket` ends, unix milliseconds: its records stop counting then. The last
/// bucket never ends ([`bucket_of`]).
fn bucket_end(bucket: u32) -> UnixMillis {
    if bucket == u32::MAX {
        return UnixMillis::MAX;
    }
    u64::from(bucket) * COUNT_SLACK_MS
}

impl Tally {
    /// Forgets the buckets that have ended at `now`.
    fn trim(&mut self, now: UnixMillis) {
        while let Some(entry) = self.buckets.first_entry() {
            if bucket_end(*entry.key()) > now {
                break;
            }
            let gone = entry.remove();
            self.total.records = self.total.records.saturating_sub(gone.records);
            self.total.bytes = self.total.bytes.saturating_sub(gone.bytes);
        }
    }

    /// The end of the oldest bucket that has not ended.
    fn oldest_end(&self) -> Option<UnixMillis> {
        self.buckets.first_key_value().map(|(b, _)| bucket_end(*b))
    }
}

impl Tallies {
    /// Counts a new record of `client`, expiring at `expires_at`, if `budget` admits it
    /// at `now`: returns the bucket it is counted in, for [`Tallies::stored`]. Otherwise
    /// counts nothing and says why.
    pub(crate) fn admit(
        &self,
        client: &str,
        expires_at: UnixMillis,
        budget: &ClientBudget,
        now: UnixMillis,
    ) -> Result<u32, OverBudget> {
        // The client's name is copied only for its first record.
        let mut tally = match self.clients.get_mut(client) {
            Some(tally) => tally,
            None => self.clients.entry(client.into()).or_default(),
        };
        tally.trim(now);
        if !budget.admits(&tally.total) {
            return Err(OverBudget {
                usage: tally.total,
                retry_at: tally.oldest_end().unwrap_or(now),
            });
        }
        let bucket = bucket_of(expires_at);
        tally.buckets.entry(bucket).or_default().records += 1;
        tally.total.records += 1;
        Ok(bucket)
    }

    /// The usage of `client` at `now`.
    pub(crate) fn usage(&self, client: &str, now: UnixMillis) -> ClientUsage {
        match self.clients.get_mut(client) {
            Some(mut tally) => {
                tally.trim(now);
                ClientUsage {
                    usage: tally.total,
                    oldest_expiry: tally.oldest_end(),
                }
            }
            None => ClientUsage::default(),
        }
    }

    /// Counts `bytes` of a stored result of a record of `client` counted in `bucket`
    /// (what [`Tallies::admit`] returned; 0, a record not counted, counts nothing), unless
    /// the bucket has ended.
    pub(crate) fn stored(&self, client: &str, bucket: u32, bytes: u64) {
        if bucket == 0 {
            return;
        }
        if let Some(mut tally) = self.clients.get_mut(client) {
            let tally = &mut *tally;
            if let Some(counted) = tally.buckets.get_mut(&bucket) {
                counted.bytes = counted.bytes.saturating_add(bytes);
                tally.total.bytes = tally.total.bytes.saturating_add(bytes);
            }
        }
    }

    /// Forgets the clients whose every record has expired at `now`.
    pub(crate) fn purge(&self, now: UnixMillis) {
        self.clients.retain(|_, tally| {
            tally.trim(now);
            !tally.buckets.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::{COUNT_SLACK_MS, ClientBudget, OverBudget, Tallies, Usage, bucket_of};

    #[test]
    fn a_record_counts_until_the_end_of_its_expiry_bucket() {
        let tallies = Tallies::default();
        // Expiring at 25 s: bucket 3, which ends at 30 s.
        let bucket = tallies.admit("c", 25_000, &ClientBudget::COUNT_ONLY, 0);
        assert_eq!(bucket, Ok(3));
        for now in [0, 24_999, 25_000, 29_999] {
            let usage = tallies.usage("c", now);
            assert_eq!(usage.usage.records, 1, "at {now}");
            assert_eq!(usage.oldest_expiry, Some(30_000));
        }
        assert_eq!(tallies.usage("c", 30_000).usage, Usage::default());
        assert_eq!(tallies.usage("c", 30_000).oldest_expiry, None);
        assert_eq!(tallies.usage("another", 0).usage, Usage::default());
    }

    #[test]
    fn a_results_bytes_count_in_its_records_bucket_and_go_with_it() {
        let tallies = Tallies::default();
        let budget = ClientBudget::COUNT_ONLY;
        let early = tallies.admit("c", 5_000, &budget, 0).unwrap();
        let late = tallies.admit("c", 45_000, &budget, 0).unwrap();
        tallies.stored("c", early, 100);
        tallies.stored("c", late, 20);
        // Not counted (bucket 0), or another client's: nothing.
        tallies.stored("c", 0, 1_000);
        tallies.stored("d", late, 1_000);
        let usage = tallies.usage("c", 0).usage;
        assert_eq!((usage.records, usage.bytes), (2, 120));
        let usage = tallies.usage("c", 10_000);
        assert_eq!((usage.usage.records, usage.usage.bytes), (1, 20));
        assert_eq!(usage.oldest_expiry, Some(50_000));
        // An ended bucket takes no bytes.
        tallies.stored("c", early, 100);
        assert_eq!(tallies.usage("c", 10_000).usage.bytes, 20);
        tallies.purge(50_000);
        assert_eq!(tallies.usage("c", 0).usage, Usage::default());
    }

    #[test]
    fn a_full_budget_refuses_until_the_oldest_bucket_ends() {
        let tallies = Tallies::default();
        let budget = ClientBudget::new(2, u64::MAX);
        for expires_at in [12_000, 21_000] {
            assert!(tallies.admit("c", expires_at, &budget, 0).is_ok());
        }
        let refused = tallies.admit("c", 90_000, &budget, 1_000);
        assert_eq!(
            refused,
            Err(OverBudget {
                usage: Usage {
                    records: 2,
                    bytes: 0
                },
                retry_at: 20_000,
            })
        );
        // 20 s: the end of the oldest record's bucket, at most the slack (10 s) after
        // its own expiry (12 s).
        assert_eq!(tallies.admit("c", 90_000, &budget, 20_000), Ok(9));
    }

    /// An expiry past the last bucket's start (the year 3331) is counted until it passes,
    /// and a new key registered then is still counted: the last bucket never ends.
    #[test]
    fn the_last_bucket_never_ends() {
        let tallies = Tallies::default();
        let budget = ClientBudget::new(1, u64::MAX);
        let last_start = u64::from(u32::MAX - 1) * COUNT_SLACK_MS;
        assert_eq!(tallies.admit("c", u64::MAX, &budget, 0), Ok(u32::MAX));
        let usage = tallies.usage("c", last_start + 1);
        assert_eq!(usage.usage.records, 1);
        assert_eq!(usage.oldest_expiry, Some(u64::MAX));
        // Past where the last bucket would end were it like the others.
        let past = u64::from(u32::MAX) * COUNT_SLACK_MS + 1;
        let later = tallies.admit("d", past + 86_400_000, &budget, past);
        assert_eq!(later, Ok(u32::MAX));
        assert!(
            tallies
                .admit("d", past + 86_400_000, &budget, past + 1)
                .is_err(),
            "the budget still refuses past the year 3331"
        );
    }

    #[test]
    fn buckets_are_numbered_from_one_and_saturate() {
        assert_eq!(bucket_of(0), 1);
        assert_eq!(bucket_of(1), 1);
        assert_eq!(bucket_of(COUNT_SLACK_MS), 1);
        assert_eq!(bucket_of(COUNT_SLACK_MS + 1), 2);
        assert_eq!(bucket_of(u64::MAX), u32::MAX);
    }

    #[test]
    fn a_budget_admits_below_both_limits_only() {
        let budget = ClientBudget::new(2, 100);
        assert!(budget.admits(&Usage {
            records: 1,
            bytes: 99
        }));
        assert!(!budget.admits(&Usage {
            records: 2,
            bytes: 0
        }));
        assert!(!budget.admits(&Usage {
            records: 0,
            bytes: 100
        }));
    }

    #[test]
    fn retry_after_rounds_up_and_is_at_least_one_second() {
        let over = |retry_at| OverBudget {
            usage: Usage::default(),
            retry_at,
        };
        assert_eq!(over(10_001).retry_after_secs(10_000), 1);
        assert_eq!(over(9_000).retry_after_secs(10_000), 1);
        assert_eq!(over(12_001).retry_after_secs(10_000), 3);
    }
}
