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
//! the end of its first lease if later); a lease that later holds it past that time is
//! not counted for the extra time (at most one lease). A store may count it, and give it
//! as the oldest expiry, up to [`COUNT_SLACK_MS`] longer: the Redis store counts by
//! expiry bucket of that width, so that a new key costs it the same whatever the client
//! holds.

use std::collections::{BTreeSet, HashMap};

use dashmap::DashMap;

use super::UnixMillis;

/// How long past its registered expiry a store may still count a record, and report it as
/// the client's oldest, in milliseconds: the width of the Redis store's expiry buckets.
/// The memory and SQL stores count exactly.
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

/// One client's records, by the expiry each was registered with, and their results'
/// bytes. A record is named by a 64-bit hash of its operation and key ([`member_of`]): no
/// allocation per new key; two of one client's records that collide (about one chance
/// in 2^32 for 65,536 records) are counted as one.
#[derive(Debug, Default)]
struct Tally {
    by_expiry: BTreeSet<(UnixMillis, u64)>,
    members: HashMap<u64, (UnixMillis, u64)>,
    bytes: u64,
}

/// The name of `key`'s record among its client's records ([`Tallies`]): a hash of its
/// operation and key, the same in every call of a process.
pub(crate) fn member_of(key: &super::RecordKey) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let mut hasher = KEYS.get_or_init(Default::default).build_hasher();
    hasher.write(key.operation.as_bytes());
    hasher.write_u8(0xff);
    hasher.write(key.key.as_bytes());
    hasher.finish()
}

impl Tally {
    /// Forgets the records whose TTL has passed at `now`.
    fn trim(&mut self, now: UnixMillis) {
        while let Some(first) = self.by_expiry.first() {
            if first.0 > now {
                break;
            }
            let (_, member) = self.by_expiry.pop_first().unwrap_or_default();
            if let Some((_, bytes)) = self.members.remove(&member) {
                self.bytes = self.bytes.saturating_sub(bytes);
            }
        }
    }

    fn usage(&self) -> Usage {
        Usage {
            records: self.by_expiry.len() as u64,
            bytes: self.bytes,
        }
    }
}

impl Tallies {
    /// Counts a new record `member` of `client`, expiring at `expires_at`, if `budget`
    /// admits it at `now`; otherwise counts nothing and says why.
    pub(crate) fn admit(
        &self,
        client: &str,
        member: u64,
        expires_at: UnixMillis,
        budget: &ClientBudget,
        now: UnixMillis,
    ) -> Result<(), OverBudget> {
        // The client's name is copied only for its first record.
        let mut tally = match self.clients.get_mut(client) {
            Some(tally) => tally,
            None => self.clients.entry(client.into()).or_default(),
        };
        tally.trim(now);
        if !budget.admits(&tally.usage()) {
            let retry_at = tally.by_expiry.first().map_or(now, |first| first.0);
            return Err(OverBudget {
                usage: tally.usage(),
                retry_at,
            });
        }
        if let Some((old, bytes)) = tally.members.remove(&member) {
            tally.by_expiry.remove(&(old, member));
            tally.bytes = tally.bytes.saturating_sub(bytes);
        }
        tally.by_expiry.insert((expires_at, member));
        tally.members.insert(member, (expires_at, 0));
        Ok(())
    }

    /// The usage of `client` at `now`.
    pub(crate) fn usage(&self, client: &str, now: UnixMillis) -> ClientUsage {
        match self.clients.get_mut(client) {
            Some(mut tally) => {
                tally.trim(now);
                ClientUsage {
                    usage: tally.usage(),
                    oldest_expiry: tally.by_expiry.first().map(|first| first.0),
                }
            }
            None => ClientUsage::default(),
        }
    }

    /// Counts `bytes` of a stored result for `member` of `client`, if it is counted.
    pub(crate) fn stored(&self, client: &str, member: u64, bytes: u64) {
        if let Some(mut tally) = self.clients.get_mut(client) {
            let tally = &mut *tally;
            if let Some((_, counted)) = tally.members.get_mut(&member) {
                tally.bytes = tally.bytes.saturating_sub(*counted).saturating_add(bytes);
                *counted = bytes;
            }
        }
    }

    /// Forgets the clients whose every record has expired at `now`.
    pub(crate) fn purge(&self, now: UnixMillis) {
        self.clients.retain(|_, tally| {
            tally.trim(now);
            !tally.by_expiry.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::{ClientBudget, OverBudget, Usage};

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
