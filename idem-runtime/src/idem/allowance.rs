//! Each client's allowance of new keys in this process, under the per-client budget
//! ([`crate::store::budget`]).
//!
//! Counting what a client holds costs the store a read that grows with it (an index scan
//! of its live records on PostgreSQL, the same inside SQLite's one write transaction), so
//! the handle does not count for every new key. It counts once
//! ([`RecordStore::client_usage`](crate::store::RecordStore::client_usage)) and grants the
//! client an allowance of new keys and of bytes that certainly fit, registered counting
//! only ([`ClientBudget::COUNT_ONLY`]); it counts again when the allowance is spent.
//! Near the budget the allowance is zero and each new key is registered under the budget
//! itself, so the store decides exactly; at the budget, the refusal is remembered for a
//! second (or until the oldest record expires), and a key is then refused without a count
//! unless the client holds it.
//!
//! # Keys and bytes
//!
//! A result's size is known only when the handler has answered, so each new key
//! [reserves](Reservation) the most bytes one result can add (the handle's
//! `max_stored_body` plus 1 KiB of headers) and gives back what its result did not use
//! once that result is built ([`Allowances::settle`]): the bytes that bind are the ones
//! results really take, not the largest result for every key. A registration that
//! registers nothing new (a replay, a duplicate in flight) gives its key and its bytes
//! back ([`Allowances::refund`]); one that reclaims a released record, in either mode,
//! keeps the bytes for its own result and gives the key back ([`Allowances::return_key`]). An attempt that ends without a result built
//! (released, unknown, rolled back) keeps its reservation until the next count.
//!
//! # The allowance, and how far it may overshoot
//!
//! With `r` records and `b` bytes of headroom at the count, the allowance is the least of
//! `r / 2` and `budget.records / 16` keys, and `b / 2` bytes, of which every key in flight
//! holds the most one result can add. Within one process it never passes the budget.
//! Instances do not see each other's allowances: each grants at most half the headroom it
//! counted and at most a sixteenth of the budget, so `n` instances counting at the same
//! moment overshoot by at most `(n − 2) / 2` times the headroom and never more than
//! `n × budget.records / 16` records (and the bytes of as many results), plus the
//! requests in flight.

use std::sync::atomic::{AtomicU64, Ordering};

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
    /// Register counting only: the allowance covers this key, and holds its result's
    /// bytes in the reservation until the result is known.
    Count(Reservation),
    /// Register under the budget: the store counts and decides, exactly.
    Check,
    /// The client is at its budget: only a key it already holds may go on.
    Over(OverBudget),
    /// Count first ([`Allowances::counted`]).
    Unknown,
}

/// What one new key took of its client's allowance: a key, and the most bytes its
/// result can add. Given back, whole or in part, only to the allowance it was taken
/// from (a count in between starts a new one, which counted what the key holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reservation {
    /// The allowance it was taken from.
    generation: u64,
    /// The bytes held for the key's result.
    bytes: u64,
}

/// The allowances of every client of one handle.
#[derive(Debug, Default)]
pub(crate) struct Allowances {
    clients: DashMap<Box<str>, Allowance>,
    /// The last allowance granted, numbered across clients.
    generations: AtomicU64,
}

#[derive(Clone, Copy, Debug)]
enum Allowance {
    /// `left` more new keys fit, and `bytes` more bytes of results; counted at `at`.
    Keys {
        left: u64,
        bytes: u64,
        at: UnixMillis,
        generation: u64,
    },
    /// At the budget until `until`.
    Over { over: OverBudget, until: UnixMillis },
}

impl Allowances {
    /// What `client`'s next new key may do at `now`, from what was counted: spends one
    /// key of its allowance and reserves `per_key` bytes (the most one result can add)
    /// when it has both.
    pub(crate) fn take(&self, client: &str, per_key: u64, now: UnixMillis) -> Admission {
        let Some(mut entry) = self.clients.get_mut(client) else {
            return Admission::Unknown;
        };
        match *entry {
            Allowance::Keys {
                left,
                bytes,
                at,
                generation,
            } if left > 0 && bytes >= per_key && now < at.saturating_add(KEEP_MS) => {
                *entry = Allowance::Keys {
                    left: left - 1,
                    bytes: bytes - per_key,
                    at,
                    generation,
                };
                Admission::Count(Reservation {
                    generation,
                    bytes: per_key,
                })
            }
            Allowance::Over { over, until } if now < until => Admission::Over(over),
            _ => Admission::Unknown,
        }
    }

    /// Gives `client` back the key and the bytes of `reservation`, taken for a
    /// registration that counted nothing (the key had a record: a replay, a duplicate in
    /// flight). Nothing when its allowance has since been counted again or turned into a
    /// refusal.
    pub(crate) fn refund(&self, client: &str, reservation: Reservation) {
        self.give_back(client, reservation.generation, 1, reservation.bytes);
    }

    /// Gives `client` back the key of `reservation`, not its bytes: the registration
    /// reclaimed a released record (counted already), and its result will still take
    /// bytes ([`Allowances::settle`]).
    pub(crate) fn return_key(&self, client: &str, reservation: Reservation) {
        self.give_back(client, reservation.generation, 1, 0);
    }

    /// Gives `client` back what of `reservation` its result does not take: the result
    /// stores `size` bytes ([`StoredResponse::size`](crate::store::StoredResponse::size))
    /// at most.
    pub(crate) fn settle(&self, client: &str, reservation: Reservation, size: u64) {
        let unused = reservation.bytes.saturating_sub(size);
        if unused > 0 {
            self.give_back(client, reservation.generation, 0, unused);
        }
    }

    /// Adds `keys` and `bytes` to `client`'s allowance if it is still the one numbered
    /// `generation`. A count taken between the two gets nothing back: it counted what
    /// the key holds (and may grant one key more than it would have, at most one per
    /// request in flight, within the overshoot the module docs allow).
    fn give_back(&self, client: &str, generation: u64, keys: u64, bytes: u64) {
        if let Some(mut entry) = self.clients.get_mut(client)
            && let Allowance::Keys {
                left,
                bytes: left_bytes,
                at,
                generation: current,
            } = *entry
            && current == generation
        {
            *entry = Allowance::Keys {
                left: left.saturating_add(keys),
                bytes: left_bytes.saturating_add(bytes),
                at,
                generation,
            };
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
        let (left, bytes) = grant(budget, counted);
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let allowance = Allowance::Keys {
            left,
            bytes,
            at: now,
            generation,
        };
        self.remember(client, allowance, now);
        match self.take(client, per_key, now) {
            Admission::Count(reservation) => Admission::Count(reservation),
            _ => Admission::Check,
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

/// The new keys and the bytes of results that certainly fit `budget` after `counted`
/// (see the module docs).
fn grant(budget: &ClientBudget, counted: &ClientUsage) -> (u64, u64) {
    let records = budget.records.saturating_sub(counted.usage.records) / 2;
    let bytes = budget.bytes.saturating_sub(counted.usage.bytes) / 2;
    (records.min(budget.records / MOST_OF_BUDGET), bytes)
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

    /// The reservation `admission` carries.
    fn reserved(admission: Admission) -> Reservation {
        match admission {
            Admission::Count(reservation) => reservation,
            other => panic!("expected a key of the allowance, got {other:?}"),
        }
    }

    #[test]
    fn an_allowance_is_half_the_headroom_and_at_most_a_sixteenth() {
        let budget = ClientBudget::new(10_000, 1 << 30);
        assert_eq!(grant(&budget, &usage(0, 0)), (625, 1 << 29), "a sixteenth");
        assert_eq!(grant(&budget, &usage(9_000, 0)).0, 500, "half the headroom");
        assert_eq!(grant(&budget, &usage(9_999, 0)).0, 0, "at the edge: check");
        assert_eq!(
            grant(&budget, &usage(0, 1 << 29)).1,
            1 << 28,
            "half the bytes"
        );
    }

    #[test]
    fn keys_are_spent_then_counted_again() {
        let allowances = Allowances::default();
        let budget = ClientBudget::new(64, 1 << 30);
        assert_eq!(allowances.take("a", 1, 0), Admission::Unknown);
        reserved(allowances.counted("a", &budget, &usage(0, 0), 1, 0));
        for _ in 0..3 {
            reserved(allowances.take("a", 1, 1));
        }
        assert_eq!(
            allowances.take("a", 1, 1),
            Admission::Unknown,
            "4 of 64 / 16 spent"
        );
        assert_eq!(allowances.take("b", 1, 1), Admission::Unknown, "per client");
        assert_eq!(
            allowances.take("a", 1, KEEP_MS),
            Admission::Unknown,
            "an old allowance is counted again"
        );
    }

    #[test]
    fn each_key_in_flight_holds_the_largest_result_until_its_own_is_known() {
        let allowances = Allowances::default();
        // 10 MiB of headroom: 5 MiB granted, five keys of 1 MiB at most each.
        let budget = ClientBudget::new(10_000, 10 << 20);
        let per_key = 1 << 20;
        let first = reserved(allowances.counted("a", &budget, &usage(0, 0), per_key, 0));
        let mut held = vec![first];
        for _ in 0..4 {
            held.push(reserved(allowances.take("a", per_key, 1)));
        }
        assert_eq!(
            allowances.take("a", per_key, 1),
            Admission::Unknown,
            "five results of the largest size fill the bytes granted"
        );
        // Each result takes 200 bytes: what is left of its reservation comes back.
        for reservation in held {
            allowances.settle("a", reservation, 200);
        }
        let mut more = 0;
        while let Admission::Count(reservation) = allowances.take("a", per_key, 2) {
            allowances.settle("a", reservation, 200);
            more += 1;
            if more == 600 {
                break;
            }
        }
        assert_eq!(more, 600, "small results: the keys bind, not the bytes");
        // A result as large as its reservation gives nothing back.
        let mut large = 0;
        while let Admission::Count(reservation) = allowances.take("a", per_key, 3) {
            allowances.settle("a", reservation, per_key);
            large += 1;
        }
        assert_eq!(
            large, 4,
            "what 5 MiB less 605 small results leaves for 1 MiB ones"
        );
    }

    #[test]
    fn a_key_spent_on_a_registration_that_counted_nothing_is_given_back() {
        let allowances = Allowances::default();
        let budget = ClientBudget::new(32, 1 << 30);
        reserved(allowances.counted("a", &budget, &usage(0, 0), 1, 0));
        let last = reserved(allowances.take("a", 1, 1));
        allowances.refund("a", last);
        let again = reserved(allowances.take("a", 1, 3));
        assert_eq!(allowances.take("a", 1, 3), Admission::Unknown, "spent");
        // A reclaimed record: the key comes back, its bytes stay held for the result.
        allowances.return_key("a", again);
        reserved(allowances.take("a", 1, 3));
        // Nothing to give back to: an unknown client, an allowance counted again, a
        // refusal.
        allowances.refund("b", last);
        assert_eq!(allowances.take("b", 1, 3), Admission::Unknown);
        let counted_again = allowances.counted("a", &budget, &usage(31, 0), 1, 4);
        assert_eq!(counted_again, Admission::Check, "no key to grant: check");
        allowances.refund("a", last);
        assert_eq!(
            allowances.take("a", 1, 4),
            Admission::Unknown,
            "the earlier allowance's key does not go to the new one"
        );
        let at_budget = ClientBudget::new(2, 1 << 30);
        let over = allowances.counted("c", &at_budget, &usage(2, 0), 1, 100);
        allowances.refund("c", last);
        assert_eq!(allowances.take("c", 1, 101), over, "still refused");
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
        assert_eq!(allowances.take("a", 1, 1_099), Admission::Over(over));
        assert_eq!(allowances.take("a", 1, 1_100), Admission::Unknown);
        assert_eq!(
            allowances.counted("a", &budget, &usage(1, 0), 1, 2_000),
            Admission::Check
        );
    }
}
