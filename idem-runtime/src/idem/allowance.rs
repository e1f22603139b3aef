//! Each client's allowance of new keys in this process, under the per-client budget
//! ([`crate::store::budget`]).
//!
//! Counting what a client holds costs the store a read that grows with it (an index scan
//! of its live records on PostgreSQL, the same inside SQLite's one write transaction), so
//! the handle does not count for every new key. It counts once
//! ([`RecordStore::client_usage`](crate::store::RecordStore::client_usage)) and grants the
//! client an allowance of new keys and of bytes that certainly fit, registered counting
//! only ([`ClientBudget::COUNT_ONLY`]).
//!
//! It counts again before the allowance is spent: when an eighth to three eighths of the
//! keys granted are left, or the allowance is half to three quarters of [`KEEP_MS`] old
//! (the point spread by the allowance's number, so that clients counted together are not
//! counted again together), a task counts in the background ([`Allowances::due`]) while
//! the client's requests spend what is left, and what they spend meanwhile is taken off
//! the new allowance. A client is counted once at
//! a time ([`Count`]): requests that find the allowance spent (or none yet) while a count
//! is in flight wait for that count and share its outcome instead of counting
//! themselves, so that a client with many requests in flight does not have its records
//! scanned once for each of them.
//!
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
//! holds the most one result can add. Within one process the allowances alone never
//! pass the budget; near it, where each key is registered under the budget itself (the
//! store counts and decides), the store's check does not see the keys of the last
//! allowance still in flight, and those may pass it (1 or 2 records over a budget of 20,
//! 200 new keys at once on SQLite), besides the store's own overshoot by the requests
//! in flight ([`crate::store::budget`]).
//! Instances do not see each other's allowances: each grants at most half the headroom it
//! counted and at most a sixteenth of the budget, so `n` instances counting at the same
//! moment overshoot by at most `(n − 2) / 2` times the headroom and never more than
//! `n × budget.records / 16` records (and the bytes of as many results), plus the
//! requests in flight.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::sync::OnceCell;

use crate::store::{ClientBudget, ClientUsage, OverBudget, StoreError, UnixMillis};

/// The share of a budget one count may grant at most: a sixteenth.
const MOST_OF_BUDGET: u64 = 16;

/// How long a refusal is remembered at most, in milliseconds: a client at its budget is
/// counted again after this, or when its oldest record expires if that is sooner.
const OVER_FOR_MS: UnixMillis = 1000;

/// How many clients are remembered before the ones whose allowance is old are dropped.
const MAX_CLIENTS: usize = 100_000;

/// How long an allowance is kept before it is counted again, in milliseconds.
const KEEP_MS: UnixMillis = 60_000;

/// The steps of the spread of the point where a client is counted ahead ([`ahead`]).
const SPREAD: u64 = 1024;

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
    /// Count first ([`Allowances::join`], then [`Allowances::after_count`]).
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
    /// The counts in flight, one a client at most.
    counts: DashMap<Box<str>, Arc<Count>>,
    /// The last allowance granted, numbered across clients.
    generations: AtomicU64,
}

#[derive(Clone, Copy, Debug)]
enum Allowance {
    /// `left` more new keys fit, and `bytes` more bytes of results; counted at `at`; to
    /// be counted again ahead of its end from `ahead` on ([`ahead`]), or, when it granted
    /// nothing, by the next key.
    Keys {
        left: u64,
        bytes: u64,
        at: UnixMillis,
        generation: u64,
        ahead: Option<Ahead>,
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
                ahead,
            } if left > 0 && bytes >= per_key && now < at.saturating_add(KEEP_MS) => {
                *entry = Allowance::Keys {
                    left: left - 1,
                    bytes: bytes - per_key,
                    at,
                    generation,
                    ahead,
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
                ahead,
            } = *entry
            && current == generation
        {
            *entry = Allowance::Keys {
                left: left.saturating_add(keys),
                bytes: left_bytes.saturating_add(bytes),
                at,
                generation,
                ahead,
            };
        }
    }

    /// A count of `client` to begin ahead of its allowance's end, if one is due at `now`
    /// ([`ahead`]) and none is in flight. The caller runs it ([`Count::run`]) in the
    /// background.
    pub(crate) fn due(&self, client: &str, now: UnixMillis) -> Option<Arc<Count>> {
        let due = match self.clients.get(client).as_deref() {
            Some(Allowance::Keys {
                left,
                ahead: Some(ahead),
                ..
            }) => *left <= ahead.left || now >= ahead.at,
            _ => false,
        };
        if !due {
            return None;
        }
        let count = Arc::new(self.count_from(client));
        match self.counts.entry(client.into()) {
            Entry::Occupied(flying) if !abandoned(flying.get()) => None,
            Entry::Occupied(mut stale) => {
                stale.insert(Arc::clone(&count));
                Some(count)
            }
            Entry::Vacant(vacant) => Some(Arc::clone(vacant.insert(count).value())),
        }
    }

    /// The count of `client` in flight, or a new one: a request that found no allowance
    /// to take a key from waits for it ([`Count::run`]) instead of counting itself.
    ///
    /// A count whose every caller was dropped before it ended (cancelled midway, with no
    /// one waiting) is replaced by a new one, begun from the allowance as it now stands.
    pub(crate) fn join(&self, client: &str) -> Arc<Count> {
        if let Some(flying) = self.counts.get(client)
            && !abandoned(flying.value())
        {
            return Arc::clone(flying.value());
        }
        let count = Arc::new(self.count_from(client));
        match self.counts.entry(client.into()) {
            Entry::Occupied(flying) if !abandoned(flying.get()) => Arc::clone(flying.get()),
            Entry::Occupied(mut stale) => {
                stale.insert(Arc::clone(&count));
                count
            }
            Entry::Vacant(vacant) => Arc::clone(vacant.insert(count).value()),
        }
    }

    /// A count that replaces `client`'s allowance as it stands now.
    fn count_from(&self, client: &str) -> Count {
        let from = match self.clients.get(client).as_deref() {
            Some(&Allowance::Keys {
                left,
                bytes,
                generation,
                ..
            }) => Some(Spent {
                generation,
                left,
                bytes,
            }),
            _ => None,
        };
        Count {
            from,
            done: OnceCell::new(),
        }
    }

    /// What a key of `client` may do at `now` once a count is in: a key of the new
    /// allowance; the refusal the count found; or, when the requests that waited with it
    /// have spent the allowance already, registration under the budget itself.
    pub(crate) fn after_count(&self, client: &str, per_key: u64, now: UnixMillis) -> Admission {
        if let Some(&Allowance::Over { over, .. }) = self.clients.get(client).as_deref() {
            return Admission::Over(over);
        }
        match self.take(client, per_key, now) {
            Admission::Count(reservation) => Admission::Count(reservation),
            Admission::Over(over) => Admission::Over(over),
            Admission::Check | Admission::Unknown => Admission::Check,
        }
    }

    /// Records what a count of `client` begun from `from` found at `now`, under
    /// `budget`: a refusal, or an allowance less what the requests spent of the one it
    /// replaces while it counted (those keys may be missing from the count). A refusal
    /// remembered meanwhile stands.
    fn install(
        &self,
        client: &str,
        budget: &ClientBudget,
        counted: &ClientUsage,
        from: Option<Spent>,
        now: UnixMillis,
    ) {
        if !budget.admits(&counted.usage) {
            let over = OverBudget {
                usage: counted.usage,
                retry_at: counted.oldest_expiry.unwrap_or(now),
            };
            self.refused(client, &over, now);
            return;
        }
        let spent = match (self.clients.get(client).as_deref(), from) {
            (Some(&Allowance::Over { until, .. }), _) if now < until => return,
            (
                Some(&Allowance::Keys {
                    left,
                    bytes,
                    generation,
                    ..
                }),
                Some(from),
            ) if generation == from.generation => (
                from.left.saturating_sub(left),
                from.bytes.saturating_sub(bytes),
            ),
            _ => (0, 0),
        };
        let (granted, bytes) = grant(budget, counted);
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let allowance = Allowance::Keys {
            left: granted.saturating_sub(spent.0),
            bytes: bytes.saturating_sub(spent.1),
            at: now,
            generation,
            ahead: ahead(granted, now, generation),
        };
        self.remember(client, allowance, now);
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

/// When an allowance is counted again ahead of its end: with `left` keys or fewer left,
/// or from `at` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ahead {
    left: u64,
    at: UnixMillis,
}

/// When the allowance numbered `generation`, `granted` keys counted at `at`, is counted
/// again ahead of its end: with an eighth to three eighths of its keys left, or half to
/// three quarters of [`KEEP_MS`] after `at`, the point within each range spread by the
/// generation (a multiplicative hash of it, in [`SPREAD`] steps). `None` for an
/// allowance of no keys: each key near the budget is registered under the budget
/// itself and counts first, and a count ahead would only come on top.
fn ahead(granted: u64, at: UnixMillis, generation: u64) -> Option<Ahead> {
    if granted == 0 {
        return None;
    }
    let spread = generation.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54;
    let share = |whole: u64| {
        let part = u128::from(whole / 4) * u128::from(spread) / u128::from(SPREAD);
        u64::try_from(part).unwrap_or(u64::MAX)
    };
    Some(Ahead {
        left: granted / 8 + share(granted),
        at: at.saturating_add(KEEP_MS / 2 + share(KEEP_MS)),
    })
}

/// The allowance a count replaces, as it stood when the count began.
#[derive(Clone, Copy, Debug)]
struct Spent {
    generation: u64,
    left: u64,
    bytes: u64,
}

/// One count of a client's usage in flight: the request or the task that runs it first
/// counts; every other that [joins](Allowances::join) it waits and shares the outcome.
/// If the one counting is dropped midway, the next waiter counts instead; with no one
/// waiting, the next to join or to count ahead begins a new count ([`abandoned`]).
#[derive(Debug)]
pub(crate) struct Count {
    from: Option<Spent>,
    done: OnceCell<Result<(), Arc<StoreError>>>,
}

impl Count {
    /// Counts `client` with `count` (the store's
    /// [`client_usage`](crate::store::RecordStore::client_usage) at `now`) unless it is
    /// counted or being counted already, and records what it found in `allowances`
    /// under `budget`; the count is then no longer in flight. `count` is not polled when
    /// another caller counts.
    ///
    /// # Errors
    ///
    /// The store's error, shared by every caller that waited for the count.
    pub(crate) async fn run(
        self: &Arc<Self>,
        allowances: &Allowances,
        client: &str,
        budget: &ClientBudget,
        now: UnixMillis,
        count: impl Future<Output = Result<ClientUsage, StoreError>>,
    ) -> Result<(), Arc<StoreError>> {
        let outcome = self
            .done
            .get_or_init(|| async {
                let outcome = match count.await {
                    Ok(counted) => {
                        allowances.install(client, budget, &counted, self.from, now);
                        Ok(())
                    }
                    Err(error) => Err(Arc::new(error)),
                };
                allowances
                    .counts
                    .remove_if(client, |_, flying| Arc::ptr_eq(flying, self));
                outcome
            })
            .await;
        outcome.clone()
    }
}

/// Whether `count`, in [`Allowances::counts`], is held there only: whoever counted was
/// dropped midway (a request cancelled, a task dropped with its runtime) and no one waits
/// for it, so no one will ever end it. It cannot be joined meanwhile: joining takes the
/// map's lock, which the caller holds.
fn abandoned(count: &Arc<Count>) -> bool {
    Arc::strong_count(count) == 1
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

    impl Allowances {
        /// What a key that waited for a count finding `counted` at `now` may do.
        fn counted(
            &self,
            client: &str,
            budget: &ClientBudget,
            counted: &ClientUsage,
            per_key: u64,
            now: UnixMillis,
        ) -> Admission {
            let from = self.count_from(client).from;
            self.install(client, budget, counted, from, now);
            self.after_count(client, per_key, now)
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
        assert!(
            allowances.due("a", 4).is_none(),
            "nothing granted: no count ahead"
        );
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

    #[test]
    fn the_point_of_a_count_ahead_is_spread() {
        let points: Vec<Ahead> = (1..=64)
            .flat_map(|generation| ahead(625, 0, generation))
            .collect();
        assert_eq!(points.len(), 64);
        for point in &points {
            assert!((78..=78 + 156).contains(&point.left), "{point:?}");
            assert!(
                (KEEP_MS / 2..=KEEP_MS / 4 * 3).contains(&point.at),
                "{point:?}"
            );
        }
        let lefts: std::collections::BTreeSet<u64> = points.iter().map(|p| p.left).collect();
        assert!(lefts.len() > 32, "64 allowances, spread: {lefts:?}");
        assert_eq!(
            ahead(u64::MAX, u64::MAX, 3).unwrap().at,
            u64::MAX,
            "no overflow"
        );
        assert_eq!(ahead(0, 0, 3), None, "nothing granted: the next key counts");
    }

    #[test]
    fn a_count_is_due_ahead_of_the_allowances_end() {
        let allowances = Allowances::default();
        let budget = ClientBudget::new(10_000, 1 << 30);
        reserved(allowances.counted("a", &budget, &usage(0, 0), 1, 0));
        let point = ahead(625, 0, 1).expect("keys granted");
        // 625 granted, one taken.
        for _ in 0..(624 - point.left - 1) {
            reserved(allowances.take("a", 1, 1));
            assert!(allowances.due("a", 1).is_none(), "more left than its point");
        }
        reserved(allowances.take("a", 1, 1));
        let ahead = allowances.due("a", 1).expect("at its point: due");
        assert!(
            allowances.due("a", 1).is_none(),
            "one count a client in flight"
        );
        assert!(
            Arc::ptr_eq(&allowances.join("a"), &ahead),
            "a waiter joins it"
        );
        assert!(
            allowances.due("b", 1).is_none(),
            "no allowance: nothing ahead"
        );

        let fresh = Allowances::default();
        reserved(fresh.counted("a", &budget, &usage(0, 0), 1, 0));
        assert!(fresh.due("a", point.at - 1).is_none());
        assert!(fresh.due("a", point.at).is_some(), "old: due");
    }

    #[tokio::test]
    async fn keys_spent_while_counting_come_off_the_new_allowance() {
        let allowances = Allowances::default();
        let budget = ClientBudget::new(10_000, 1 << 30);
        reserved(allowances.counted("a", &budget, &usage(0, 0), 1, 0));
        while allowances.due("a", 1).is_none() {
            reserved(allowances.take("a", 1, 1));
        }
        let ahead = allowances.join("a");
        for _ in 0..50 {
            reserved(allowances.take("a", 1, 2));
        }
        let counted = async { Ok(usage(100, 0)) };
        ahead
            .run(&allowances, "a", &budget, 3, counted)
            .await
            .unwrap();
        assert!(allowances.counts.is_empty(), "no longer in flight");
        let mut left = 0;
        while let Admission::Count(_) = allowances.take("a", 1, 4) {
            left += 1;
        }
        assert_eq!(
            left,
            625 - 50,
            "the new grant less the 50 keys spent meanwhile"
        );
    }

    /// Polls `run` once (it is pending: its count has not answered) and drops it: the
    /// request counting is cancelled midway (its client disconnected).
    async fn cancel_midway(run: impl Future<Output = Result<(), Arc<StoreError>>>) {
        let mut run = std::pin::pin!(run);
        tokio::select! {
            biased;
            outcome = &mut run => panic!("the count has not answered: {outcome:?}"),
            () = async {} => {}
        }
    }

    #[tokio::test]
    async fn a_waiter_counts_when_the_one_counting_is_cancelled() {
        let allowances = Allowances::default();
        let budget = ClientBudget::new(10_000, 1 << 30);
        let (first, second) = (allowances.join("a"), allowances.join("a"));
        let mut waiting =
            std::pin::pin!(second.run(&allowances, "a", &budget, 1, async { Ok(usage(0, 0)) }));
        // The waiter is polled while the other one counts, then that one is cancelled.
        let mut counting =
            Box::pin(first.run(&allowances, "a", &budget, 1, std::future::pending()));
        tokio::select! {
            biased;
            _ = &mut counting => panic!("the count never answers"),
            _ = &mut waiting => panic!("a waiter does not count while another does"),
            () = async {} => {}
        }
        drop(counting);
        waiting.await.expect("the waiter counts instead");
        assert!(allowances.counts.is_empty(), "no longer in flight");
        reserved(allowances.after_count("a", 1, 2));
    }

    /// A request that counts and is cancelled (its client disconnected) with no other
    /// waiting leaves no count in flight behind: the client is still counted ahead of its
    /// allowance's end, and the count after it starts from the allowance as it then is.
    #[tokio::test]
    async fn a_count_cancelled_with_no_waiter_is_not_left_in_flight() {
        let allowances = Allowances::default();
        let budget = ClientBudget::new(10_000, 1 << 30);
        reserved(allowances.counted("a", &budget, &usage(0, 0), 1, 0));
        let counting = allowances.join("a");
        cancel_midway(counting.run(&allowances, "a", &budget, 1, std::future::pending())).await;
        drop(counting);
        let mut spent = 1;
        while allowances.due("a", 1).is_none() {
            reserved(allowances.take("a", 1, 1));
            spent += 1;
            assert!(spent < 625, "spent without a count ahead: none was due");
        }
        // Spent to its end, then counted: the keys spent before the count began are in
        // what it counts, and do not come off the new allowance again.
        while let Admission::Count(_) = allowances.take("a", 1, 2) {
            spent += 1;
        }
        let counted = async { Ok(usage(625, 0)) };
        (allowances.join("a"))
            .run(&allowances, "a", &budget, 3, counted)
            .await
            .unwrap();
        let mut left = 0;
        while let Admission::Count(_) = allowances.take("a", 1, 4) {
            left += 1;
        }
        assert_eq!((spent, left), (625, 625), "a whole new allowance");
    }

    #[tokio::test]
    async fn waiters_share_one_count_and_its_error() {
        let allowances = Allowances::default();
        let budget = ClientBudget::new(10_000, 1 << 30);
        let (first, second) = (allowances.join("a"), allowances.join("a"));
        assert!(Arc::ptr_eq(&first, &second));
        let (gate, opened) = tokio::sync::oneshot::channel::<()>();
        let failing = async {
            opened.await.ok();
            Err(StoreError::Unavailable("down".into()))
        };
        let counting = first.run(&allowances, "a", &budget, 0, failing);
        let waiting = second.run(&allowances, "a", &budget, 0, async {
            panic!("a waiter does not count while another does")
        });
        let ((), outcomes) = tokio::join!(async { gate.send(()).unwrap() }, async {
            tokio::join!(counting, waiting)
        });
        assert!(outcomes.0.is_err() && outcomes.1.is_err(), "{outcomes:?}");
        assert!(allowances.counts.is_empty(), "a failed count is not kept");
        assert!(
            !Arc::ptr_eq(&allowances.join("a"), &first),
            "the next one counts anew"
        );
        assert_eq!(allowances.take("a", 1, 1), Admission::Unknown);
    }
}
