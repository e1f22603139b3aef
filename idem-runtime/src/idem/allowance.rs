//! Each client's allowance of new keys in this process, under the per-client budget
//! ([`crate::store::budget`]).
//!
//! Counting what a client holds costs the store a read that grows with it (an index scan
//! of its live records on PostgreSQL, the same inside SQLite's one write transaction), so
//! the handle does not count for every new key. It counts once
//! ([`RecordStore::client_usage`](crate::store::RecordStore::client_usage)) and grants the
//! client an allowance of new keys that certainly fit, registered counting only
//! ([`ClientBudget::COUNT_ONLY`]); it counts again when the allowance is spent. A
//! registration that registers nothing new (a replay, a duplicate in flight, a reclaimed
//! key) gives its key back ([`Allowances::refund`]). Near the
//! budget the allowance is zero and each new key is registered under the budget itself,
//! so the store decides exactly; at the budget, the refusal is remembered for a second
//! (or until the oldest record expires), and a key is then refused without a count
//! unless the client holds it.
//!
//! # The allowance, and how far it may overshoot
//!
//! With `r` records and `b` bytes of headroom at the count, the allowance is the least
//! of `r / 2`, `b / 2` over the largest result a key can add (the handle's
//! `max_stored_body` plus 1 KiB of headers), and `budget.records / 16`. Within one
//! process it never passes the budget. Instances do not see each other's allowances:
//! each grants at most half the headroom it counted and at most a sixteenth of the
//! budget, so `n` instances counting at the same moment overshoot by at most
//! `(n − 2) / 2` times the headroom and never more than `n × budget.records / 16`
//! records (and the bytes of as many results), plus the requests in flight.

use dashmap::DashMap;

use crate::store::{ClientBudget, ClientUsage, OverBudget, UnixMillis};

/// The share of a budget one count may grant at most: a sixteenth.
const MOST_OF_BUDGET: u64 = 16;

/// How long a refusal is remembered at most, in milliseconds: a client at its budget is
/// counted again after this, or when its oldest record expires if that is sooner.
const OVER_FOR_MS: UnixMillis = 1000;

/// How many clients are remembered before the ones whose allowance is old are dropped.
const MAX_CLIENTS: usize = 100_000;

/// How long an allowance is kept before it is counted again, in milliseconds.
const KEEP_MS: UnixMillis = 60_000;

/// What a new registration of a client may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Register counting only: the allowance covers this key.
    Count,
    /// Register under the budget: the store counts and decides, exactly.
    Check,
    /// The client is at its budget: only a key it already holds may go on.
    Over(OverBudget),
    /// Count first ([`Allowances::counted`]).
    Unknown,
}

/// The allowances of every client of one handle.
#[derive(Debug, Default)]
pub(crate) struct Allowances {
    clients: DashMap<Box<str>, Allowance>,
}

#[derive(Clone, Copy, Debug)]
enum Allowance {
    /// `left` more new keys fit; counted at `at`.
    Keys { left: u64, at: UnixMillis },
    /// At the budget until `until`.
    Over { over: OverBudget, until: UnixMillis },
}

impl Allowances {
    /// What `client`'s next new key may do at `now`, from what was counted: spends one
    /// key of its allowance when it has one.
    pub(crate) fn take(&self, client: &str, now: UnixMillis) -> Admission {
        let Some(mut entry) = self.clients.get_mut(client) else {
            return Admission::Unknown;
        };
        match *entry {
            Allowance::Keys { left, at } if left > 0 && now < at.saturating_add(KEEP_MS) => {
                *entry = Allowance::Keys { left: left - 1, at };
                Admission::Count
            }
            Allowance::Over { over, until } if now < until => Admission::Over(over),
            _ => Admission::Unknown,
        }
    }

    /// Gives `client` back the key [`take`](Allowances::take) spent at `now` on a
    /// registration that counted nothing (the key had a record: a replay, a duplicate in
    /// flight, another request under the key). Nothing when its allowance has since run
    /// out, expired or turned into a refusal. A count taken between the two may get the
    /// key it never lost: at most one per request in flight, within the overshoot the
    /// module docs allow.
    pub(crate) fn refund(&self, client: &str, now: UnixMillis) {
        if let Some(mut entry) = self.clients.get_mut(client)
            && let Allowance::Keys { left, at } = *entry
            && now < at.saturating_add(KEEP_MS)
        {
            *entry = Allowance::Keys { left: left + 1, at };
        }
    }

    /// Records what a count of `client` found, under `budget`, and says what its key may
    /// do. `per_key` is the most bytes one key's result can add.
    pub(crate) fn counted(
        &self,
        client: &str,
        budget: &ClientBudget,
        counted: &ClientUsage,
        per_key: u64,
        now: UnixMillis,
    ) -> Admission {
        if !budget.admits(&counted.usage) {
            let over = OverBudget {
                usage: counted.usage,
                retry_at: counted.oldest_expiry.unwrap_or(now),
            };
            self.refused(client, &over, now);
            return Admission::Over(over);
        }
        let left = grant(budget, counted, per_key);
        self.remember(client, Allowance::Keys { left, at: now }, now);
        match left {
            0 => Admission::Check,
            _ => {
                self.take(client, now);
                Admission::Count
            }
        }
    }

    /// Records that the store refused `client` a new key under its budget.
    pub(crate) fn refused(&self, client: &str, over: &OverBudget, now: UnixMillis) {
        let until = over.retry_at.clamp(now, now.saturating_add(OVER_FOR_MS));
        self.remember(client, Allowance::Over { over: *over, until }, now);
    }

    fn remember(&self, client: &str, allowance: Allowance, now: UnixMillis) {
        if self.clients.len() >= MAX_CLIENTS {
            self.clients.retain(|_, kept| match kept {
                Allowance::Keys { at, .. } => now < at.saturating_add(KEEP_MS),
                Allowance::Over { until, .. } => now < *until,
            });
        }
        self.clients.insert(client.into(), allowance);
    }
}

/// The new keys that certainly fit `budget` after `counted` (see the module docs).
fn grant(budget: &ClientBudget, counted: &ClientUsage, per_key: u64) -> u64 {
    let records = budget.records.saturating_sub(counted.usage.records) / 2;
    let bytes = budget.bytes.saturating_sub(counted.usage.bytes) / 2 / per_key.max(1);
    records.min(bytes).min(budget.records / MOST_OF_BUDGET)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Usage;

    fn usage(records: u64, bytes: u64) -> ClientUsage {
        ClientUsage {
            usage: Usage { records, bytes },
            oldest_expiry: Some(5_000),
        }
    }

    #[test]
    fn an_allowance_is_half_the_headroom_and_at_most_a_sixteenth() {
        let budget = ClientBudget::new(10_000, 1 << 30);
        assert_eq!(grant(&budget, &usage(0, 0), 1), 625, "a sixteenth");
        assert_eq!(
            grant(&budget, &usage(9_000, 0), 1),
            500,
            "half the headroom"
        );
        assert_eq!(grant(&budget, &usage(9_999, 0), 1), 0, "at the edge: check");
        let bytes = ClientBudget::new(10_000, 16 * 1024 * 1024);
        assert_eq!(
            grant(&bytes, &usage(0, 0), 65 * 1024),
            126,
            "bytes for the largest result"
        );
    }

    #[test]
    fn keys_are_spent_then_counted_again() {
        let allowances = Allowances::default();
        let budget = ClientBudget::new(64, 1 << 30);
        assert_eq!(allowances.take("a", 0), Admission::Unknown);
        assert_eq!(
            allowances.counted("a", &budget, &usage(0, 0), 1, 0),
            Admission::Count
        );
        for _ in 0..3 {
            assert_eq!(allowances.take("a", 1), Admission::Count);
        }
        assert_eq!(
            allowances.take("a", 1),
            Admission::Unknown,
            "4 of 64 / 16 spent"
        );
        assert_eq!(allowances.take("b", 1), Admission::Unknown, "per client");
        assert_eq!(
            allowances.take("a", KEEP_MS),
            Admission::Unknown,
            "an old allowance is counted again"
        );
    }

    #[test]
    fn a_key_spent_on_a_registration_that_counted_nothing_is_given_back() {
        let allowances = Allowances::default();
        let budget = ClientBudget::new(32, 1 << 30);
        assert_eq!(
            allowances.counted("a", &budget, &usage(0, 0), 1, 0),
            Admission::Count,
            "2 keys granted (32 / 16), one spent"
        );
        assert_eq!(allowances.take("a", 1), Admission::Count, "the last one");
        allowances.refund("a", 2);
        assert_eq!(allowances.take("a", 3), Admission::Count, "given back");
        assert_eq!(allowances.take("a", 3), Admission::Unknown, "spent");
        // Nothing to give back to: an unknown client, an expired allowance, a refusal.
        allowances.refund("b", 3);
        assert_eq!(allowances.take("b", 3), Admission::Unknown);
        allowances.refund("a", KEEP_MS);
        assert_eq!(allowances.take("a", KEEP_MS), Admission::Unknown);
        let at_budget = ClientBudget::new(2, 1 << 30);
        let over = allowances.counted("c", &at_budget, &usage(2, 0), 1, 100);
        allowances.refund("c", 101);
        assert_eq!(allowances.take("c", 101), over, "still refused");
    }

    #[test]
    fn a_refusal_is_remembered_for_a_second_at_most() {
        let allowances = Allowances::default();
        let budget = ClientBudget::new(2, 1 << 30);
        let at_budget = allowances.counted("a", &budget, &usage(2, 0), 1, 100);
        let Admission::Over(over) = at_budget else {
            panic!("{at_budget:?}");
        };
        assert_eq!(over.retry_at, 5_000);
        assert_eq!(allowances.take("a", 1_099), Admission::Over(over));
        assert_eq!(allowances.take("a", 1_100), Admission::Unknown);
        assert_eq!(
            allowances.counted("a", &budget, &usage(1, 0), 1, 2_000),
            Admission::Check
        );
    }
}
