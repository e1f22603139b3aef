//! The store conformance suite: the contract of [`Store`] (its two halves,
//! [`RecordStore`](super::RecordStore) and [`OperatorStore`](super::OperatorStore)),
//! written once as checks that every backend must pass.
//!
//! A backend runs the whole suite with [`run`], giving a function that makes a fresh,
//! empty store:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use idem_runtime::store::{MemoryStore, conformance};
//!
//! conformance::run(|| async { MemoryStore::new() }).await;
//! # }
//! ```
//!
//! Every check panics with a message naming the rule it found broken. Time is given to the
//! store, never read from a clock, so the suite runs in milliseconds; one check reads the
//! store's own clock ([`RecordStore::clock`](super::RecordStore::clock)), which a store
//! with a server of its own reads there. Concurrency checks
//! spawn tokio tasks: run the suite on a multi-threaded runtime to exercise real
//! parallelism.
//!
//! Available under `cfg(test)` and with the `conformance` feature; [`postgres`] (with the
//! `postgres` feature) makes scratch databases on a real server.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderName, HeaderValue};

use super::{
    Begin, DEFAULT_MAX_RESULT, Lease, NewRecord, OwnerToken, Record, RecordKey, RecordState, Store,
    StoreError, StoredResponse, UnixMillis,
};
use crate::OperationId;

mod budget;
mod clock;
pub mod journal;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub mod one_commit;
pub mod ops;

pub use budget::{
    a_reclaimed_or_renewed_record_counts_its_result, client_usage_counts_what_the_budget_counts,
    the_budget_counts_stored_bytes, the_budget_never_refuses_a_key_the_client_holds,
    the_budget_refuses_a_new_key_at_its_record_limit,
};
pub use clock::{the_clock_is_the_servers, the_clock_reads_the_stores_time};
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;

/// Whether a skipped store test must fail (`CI` is `true` or `1`): in CI every store
/// test runs against its real server.
pub fn skips_fail() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The time every check starts at (unix milliseconds, in 2027).
pub const T0: UnixMillis = 1_800_000_000_000;
/// The lease the checks register with, in milliseconds.
pub const LEASE: u64 = 30_000;
/// The TTL the checks register with, in milliseconds.
pub const TTL: u64 = 86_400_000;

/// One check: its name and the function that runs it against a fresh store.
pub type Check = (&'static str, fn(Arc<dyn Store>) -> BoxFuture<'static, ()>);

/// Every check of the suite.
pub const CHECKS: &[Check] = &[
    ("begin_registers_a_new_key", |s| {
        Box::pin(begin_registers_a_new_key(s))
    }),
    ("begin_leaves_a_held_key_unchanged", |s| {
        Box::pin(begin_leaves_a_held_key_unchanged(s))
    }),
    ("begin_is_atomic_under_concurrency", |s| {
        Box::pin(begin_is_atomic_under_concurrency(s))
    }),
    ("the_mode_is_recorded", |s| {
        Box::pin(the_mode_is_recorded(s))
    }),
    ("the_record_outlives_its_attempt", |s| {
        Box::pin(the_record_outlives_its_attempt(s))
    }),
    ("namespaces_are_independent", |s| {
        Box::pin(namespaces_are_independent(s))
    }),
    ("complete_needs_a_live_lease", |s| {
        Box::pin(complete_needs_a_live_lease(s))
    }),
    ("responses_round_trip_byte_for_byte", |s| {
        Box::pin(responses_round_trip_byte_for_byte(s))
    }),
    (
        "released_key_is_reclaimed_with_the_same_fingerprint_only",
        |s| Box::pin(released_key_is_reclaimed_with_the_same_fingerprint_only(s)),
    ),
    ("release_needs_a_live_lease", |s| {
        Box::pin(release_needs_a_live_lease(s))
    }),
    ("renew_moves_the_owners_lease", |s| {
        Box::pin(renew_moves_the_owners_lease(s))
    }),
    ("renew_to_now_ends_the_lease", |s| {
        Box::pin(renew_to_now_ends_the_lease(s))
    }),
    ("take_over_only_after_the_lease_ends", |s| {
        Box::pin(take_over_only_after_the_lease_ends(s))
    }),
    ("take_over_fences_out_the_old_owner", |s| {
        Box::pin(take_over_fences_out_the_old_owner(s))
    }),
    ("take_over_has_exactly_one_winner", |s| {
        Box::pin(take_over_has_exactly_one_winner(s))
    }),
    ("park_unknown_needs_the_current_owner", |s| {
        Box::pin(park_unknown_needs_the_current_owner(s))
    }),
    ("ttl_expiry_starts_a_new_operation", |s| {
        Box::pin(ttl_expiry_starts_a_new_operation(s))
    }),
    ("purge_removes_expired_records_only", |s| {
        Box::pin(purge_removes_expired_records_only(s))
    }),
    ("a_lease_never_outlives_its_record", |s| {
        Box::pin(a_lease_never_outlives_its_record(s))
    }),
    ("a_lease_of_zero_has_ended", |s| {
        Box::pin(a_lease_of_zero_has_ended(s))
    }),
    ("a_result_over_the_limit_is_refused", |s| {
        Box::pin(a_result_over_the_limit_is_refused(s))
    }),
    ("keys_are_compared_whole", |s| {
        Box::pin(keys_are_compared_whole(s))
    }),
    ("the_budget_refuses_a_new_key_at_its_record_limit", |s| {
        Box::pin(the_budget_refuses_a_new_key_at_its_record_limit(s))
    }),
    ("the_budget_never_refuses_a_key_the_client_holds", |s| {
        Box::pin(the_budget_never_refuses_a_key_the_client_holds(s))
    }),
    ("the_budget_counts_stored_bytes", |s| {
        Box::pin(the_budget_counts_stored_bytes(s))
    }),
    ("a_reclaimed_or_renewed_record_counts_its_result", |s| {
        Box::pin(a_reclaimed_or_renewed_record_counts_its_result(s))
    }),
    ("client_usage_counts_what_the_budget_counts", |s| {
        Box::pin(client_usage_counts_what_the_budget_counts(s))
    }),
    ("list_filters_orders_and_pages", |s| {
        Box::pin(ops::list_filters_orders_and_pages(s))
    }),
    ("list_finds_ended_leases", |s| {
        Box::pin(ops::list_finds_ended_leases(s))
    }),
    ("inspect_shows_every_attempt", |s| {
        Box::pin(ops::inspect_shows_every_attempt(s))
    }),
    ("the_history_is_bounded", |s| {
        Box::pin(ops::the_history_is_bounded(s))
    }),
    ("resolve_as_completed_stores_the_result", |s| {
        Box::pin(ops::resolve_as_completed_stores_the_result(s))
    }),
    ("resolve_as_not_applied_releases_the_key", |s| {
        Box::pin(ops::resolve_as_not_applied_releases_the_key(s))
    }),
    ("resolve_refuses_what_is_not_parked", |s| {
        Box::pin(ops::resolve_refuses_what_is_not_parked(s))
    }),
    ("resolve_has_exactly_one_winner", |s| {
        Box::pin(ops::resolve_has_exactly_one_winner(s))
    }),
    ("the_clock_reads_the_stores_time", |s| {
        Box::pin(clock::the_clock_reads_the_stores_time(s))
    }),
    ("steps_are_written_and_read_in_order", |s| {
        Box::pin(journal::steps_are_written_and_read_in_order(s))
    }),
    ("steps_are_written_under_the_lease", |s| {
        Box::pin(journal::steps_are_written_under_the_lease(s))
    }),
    ("a_changed_step_is_refused", |s| {
        Box::pin(journal::a_changed_step_is_refused(s))
    }),
    ("steps_expire_with_their_record", |s| {
        Box::pin(journal::steps_expire_with_their_record(s))
    }),
    ("staged_deliveries_wait_for_a_completed_success", |s| {
        Box::pin(journal::staged_deliveries_wait_for_a_completed_success(s))
    }),
    ("a_delivery_is_claimed_once_and_settled", |s| {
        Box::pin(journal::a_delivery_is_claimed_once_and_settled(s))
    }),
    ("a_given_up_delivery_stays_for_operators", |s| {
        Box::pin(journal::a_given_up_delivery_stays_for_operators(s))
    }),
];

/// Runs every check in [`CHECKS`], each against a fresh store from `new_store`.
///
/// # Panics
///
/// When the backend breaks a rule; the message names the check and the rule.
pub async fn run<S, F, Fut>(new_store: F)
where
    S: Store,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    for (name, check) in CHECKS {
        let store: Arc<dyn Store> = Arc::new(new_store().await);
        eprintln!("store conformance: {name}");
        check(store).await;
    }
}

/// A record key for the checks.
pub fn key(name: &str) -> RecordKey {
    RecordKey::new("create_order", "client-a", name)
}

/// A registration at `now` with a fresh token, the suite's lease and TTL.
pub fn new_record(fingerprint: &str, now: UnixMillis) -> NewRecord {
    NewRecord {
        operation_id: OperationId::new(),
        fingerprint: fingerprint.to_owned(),
        lease: Lease {
            token: OwnerToken::random(),
            until: now + LEASE,
        },
        expires_at: now + TTL,
        transactional: false,
        holds_until: now,
        budget: None,
    }
}

/// A small JSON result.
pub fn created() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![
            (
                HeaderName::from_static("content-type"),
                HeaderValue::from_static("application/json"),
            ),
            (
                HeaderName::from_static("location"),
                HeaderValue::from_static("/orders/1"),
            ),
        ],
        body: Bytes::from_static(br#"{"id":1}"#),
    }
}

async fn started(store: &dyn Store, key: &RecordKey, new: &NewRecord, now: UnixMillis) -> Record {
    match store.begin(key, new, now).await {
        Ok(Begin::Started(record)) => record,
        other => panic!("begin on a free key must start it, got {other:?}"),
    }
}

async fn exists(store: &dyn Store, key: &RecordKey, new: &NewRecord, now: UnixMillis) -> Record {
    match store.begin(key, new, now).await {
        Ok(Begin::Exists(record)) => record,
        other => panic!("begin on a held key must return it unchanged, got {other:?}"),
    }
}

async fn get(store: &dyn Store, key: &RecordKey, now: UnixMillis) -> Record {
    store
        .get(key, now)
        .await
        .expect("get must succeed")
        .expect("the record must be there")
}

fn lease_lost<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) {
    assert!(
        matches!(result, Err(StoreError::LeaseLost)),
        "{what} must fail with LeaseLost, got {result:?}"
    );
}

/// `begin` on an unknown key writes a processing record: attempt 1, the new operation id,
/// `created_at = now`, the given lease and expiry; `get` reads it back.
pub async fn begin_registers_a_new_key(store: Arc<dyn Store>) {
    let k = key("k1");
    assert_eq!(
        store.get(&k, T0).await.unwrap(),
        None,
        "a new key has no record"
    );
    let new = new_record("sha256:a", T0);
    let record = started(&*store, &k, &new, T0).await;
    let expected = Record {
        operation_id: new.operation_id,
        fingerprint: "sha256:a".into(),
        attempt: 1,
        created_at: T0,
        expires_at: T0 + TTL,
        state: RecordState::Processing { lease: new.lease },
        transactional: false,
    };
    assert_eq!(record, expected, "begin returns the record it wrote");
    assert_eq!(
        get(&*store, &k, T0 + 1).await,
        expected,
        "get reads it back"
    );
}

/// `begin` on a held key changes nothing and returns the record as it stands, whatever
/// the new fingerprint.
pub async fn begin_leaves_a_held_key_unchanged(store: Arc<dyn Store>) {
    let k = key("k1");
    let first = started(&*store, &k, &new_record("sha256:a", T0), T0).await;
    for fp in ["sha256:a", "sha256:b"] {
        let seen = exists(&*store, &k, &new_record(fp, T0 + 5), T0 + 5).await;
        assert_eq!(seen, first, "a second begin must not change the record");
    }
    // A live lease is not taken by begin, and neither is an ended one (that is take_over's
    // job, so that recovery runs).
    let seen = exists(
        &*store,
        &k,
        &new_record("sha256:a", T0 + LEASE + 1),
        T0 + LEASE + 1,
    )
    .await;
    assert_eq!(seen, first, "begin never takes over an ended lease");
}

/// 50 concurrent `begin`s on one key: exactly one starts; every other one sees the
/// winner's lease.
pub async fn begin_is_atomic_under_concurrency(store: Arc<dyn Store>) {
    let k = key("race");
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let store = Arc::clone(&store);
            let k = k.clone();
            tokio::spawn(async move {
                let new = new_record("sha256:a", T0);
                (new.lease.token, store.begin(&k, &new, T0).await)
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut seen_tokens = Vec::new();
    for task in tasks {
        let (token, outcome) = task.await.expect("the task must not panic");
        match outcome.expect("begin must succeed") {
            Begin::Started(_) => winners.push(token),
            Begin::Exists(record) => seen_tokens.push(record.lease().expect("processing").token),
            Begin::OverBudget(over) => panic!("begin without a budget was refused: {over:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one begin must start the key");
    assert!(
        seen_tokens.iter().all(|t| *t == winners[0]),
        "every loser must see the winner's lease"
    );
    assert_eq!(
        get(&*store, &k, T0).await.lease().map(|l| l.token),
        Some(winners[0])
    );
}

/// One key under another client or another operation is another record.
pub async fn namespaces_are_independent(store: Arc<dyn Store>) {
    let keys = [
        RecordKey::new("create_order", "client-a", "k"),
        RecordKey::new("create_order", "client-b", "k"),
        RecordKey::new("create_refund", "client-a", "k"),
    ];
    for k in &keys {
        started(&*store, k, &new_record("sha256:a", T0), T0).await;
    }
    store
        .complete(
            &keys[0],
            get(&*store, &keys[0], T0).await.lease().unwrap().token,
            &created(),
            T0,
        )
        .await
        .unwrap();
    for k in &keys[1..] {
        assert!(
            matches!(
                get(&*store, k, T0).await.state,
                RecordState::Processing { .. }
            ),
            "completing one namespace must not touch another"
        );
    }
}

/// Only the owner of a live lease completes; a completed key is replayed by `begin`.
pub async fn complete_needs_a_live_lease(store: Arc<dyn Store>) {
    let k = key("k1");
    let new = new_record("sha256:a", T0);
    started(&*store, &k, &new, T0).await;
    lease_lost(
        store
            .complete(&k, OwnerToken::random(), &created(), T0 + 1)
            .await,
        "complete with another token",
    );
    lease_lost(
        store
            .complete(&k, new.lease.token, &created(), T0 + LEASE)
            .await,
        "complete after the lease ended",
    );
    lease_lost(
        store
            .complete(&key("absent"), new.lease.token, &created(), T0)
            .await,
        "complete of a key that has no record",
    );
    store
        .complete(&k, new.lease.token, &created(), T0 + LEASE - 1)
        .await
        .expect("the owner of a live lease completes");
    let record = get(&*store, &k, T0 + LEASE).await;
    assert_eq!(
        record.state,
        RecordState::Completed {
            response: created()
        }
    );
    assert_eq!(record.attempt, 1);
    assert_eq!(
        exists(&*store, &k, &new_record("sha256:a", T0 + 2), T0 + 2).await,
        record
    );
    lease_lost(
        store
            .complete(&k, new.lease.token, &created(), T0 + 3)
            .await,
        "a second complete",
    );
}

/// Status, repeated headers, a header value that is not UTF-8, a binary body and an empty
/// body come back byte for byte.
pub async fn responses_round_trip_byte_for_byte(store: Arc<dyn Store>) {
    let responses = [
        StoredResponse {
            status: 204,
            headers: vec![],
            body: Bytes::new(),
        },
        StoredResponse {
            status: 422,
            headers: vec![
                (
                    HeaderName::from_static("link"),
                    HeaderValue::from_static("</a>; rel=\"a\""),
                ),
                (
                    HeaderName::from_static("link"),
                    HeaderValue::from_static("</b>; rel=\"b\""),
                ),
                (
                    HeaderName::from_static("etag"),
                    HeaderValue::from_bytes(b"\"caf\xe9\"").unwrap(),
                ),
            ],
            body: Bytes::from_static(b"\x00\xff\xfe binary \r\n"),
        },
        created(),
    ];
    for (i, response) in responses.iter().enumerate() {
        let k = key(&format!("bytes-{i}"));
        let new = new_record("sha256:a", T0);
        started(&*store, &k, &new, T0).await;
        store
            .complete(&k, new.lease.token, response, T0)
            .await
            .unwrap();
        assert_eq!(
            get(&*store, &k, T0).await.state,
            RecordState::Completed {
                response: response.clone()
            },
            "the stored response must come back byte for byte"
        );
    }
}

/// A released key is claimed again by `begin` with the same fingerprint (the same
/// operation, attempt + 1, a new lease) and refused with another.
pub async fn released_key_is_reclaimed_with_the_same_fingerprint_only(store: Arc<dyn Store>) {
    let k = key("k1");
    let first = new_record("sha256:a", T0);
    let original = started(&*store, &k, &first, T0).await;
    store.release(&k, first.lease.token, T0 + 10).await.unwrap();
    let released = get(&*store, &k, T0 + 10).await;
    assert_eq!(released.state, RecordState::Released);

    let other = exists(&*store, &k, &new_record("sha256:b", T0 + 20), T0 + 20).await;
    assert_eq!(
        other, released,
        "another fingerprint must not reclaim the key"
    );

    let retry = new_record("sha256:a", T0 + 30);
    let reclaimed = started(&*store, &k, &retry, T0 + 30).await;
    assert_eq!(
        reclaimed,
        Record {
            attempt: 2,
            state: RecordState::Processing { lease: retry.lease },
            ..original
        },
        "a reclaim keeps the operation id, created_at and expires_at, and counts an attempt"
    );
    exists(&*store, &k, &new_record("sha256:a", T0 + 31), T0 + 31).await;
}

/// Only the owner of a live lease releases.
pub async fn release_needs_a_live_lease(store: Arc<dyn Store>) {
    let k = key("k1");
    let new = new_record("sha256:a", T0);
    started(&*store, &k, &new, T0).await;
    lease_lost(
        store.release(&k, OwnerToken::random(), T0).await,
        "release with another token",
    );
    lease_lost(
        store.release(&k, new.lease.token, T0 + LEASE).await,
        "release after the lease ended",
    );
    store.release(&k, new.lease.token, T0).await.unwrap();
    lease_lost(
        store.release(&k, new.lease.token, T0).await,
        "a second release",
    );
}

/// `holds_until` keeps a new or reclaimed record at least until the attempt's time ends,
/// even when its lease is shorter and the TTL ends sooner.
pub async fn the_record_outlives_its_attempt(store: Arc<dyn Store>) {
    let late = T0 + TTL - 10;
    let k = key("fresh-late");
    let new = NewRecord {
        expires_at: T0 + 5,
        holds_until: T0 + 10 * LEASE,
        budget: None,
        ..new_record("sha256:a", T0)
    };
    assert_eq!(
        started(&*store, &k, &new, T0).await.expires_at,
        T0 + 10 * LEASE
    );

    let r = key("reclaimed-late");
    let first = new_record("sha256:a", T0);
    started(&*store, &r, &first, T0).await;
    store.release(&r, first.lease.token, T0).await.unwrap();
    let retry = NewRecord {
        holds_until: late + 10 * LEASE,
        budget: None,
        ..new_record("sha256:a", late)
    };
    let record = started(&*store, &r, &retry, late).await;
    assert_eq!(
        record.expires_at,
        late + 10 * LEASE,
        "a reclaim keeps the record for the attempt's time"
    );
    let after_ttl = T0 + TTL + LEASE + 1;
    assert!(
        exists(&*store, &r, &new_record("sha256:a", after_ttl), after_ttl)
            .await
            .lease()
            .is_some(),
        "a duplicate past the TTL is not a new operation while the attempt may run"
    );
}

/// Whether the attempt runs in the transactional mode is written by `begin`, read back by
/// `get`, kept by a takeover and set again by a reclaim.
pub async fn the_mode_is_recorded(store: Arc<dyn Store>) {
    let k = key("mode");
    let new = NewRecord {
        transactional: true,
        ..new_record("sha256:a", T0)
    };
    assert!(started(&*store, &k, &new, T0).await.transactional);
    assert!(
        get(&*store, &k, T0).await.transactional,
        "get reads the mode back"
    );
    let lease = Lease {
        token: OwnerToken::random(),
        until: T0 + 2 * LEASE,
    };
    let taken = store
        .take_over(&k, new.lease.token, lease, T0 + LEASE)
        .await
        .unwrap();
    assert!(taken.transactional, "a takeover keeps the mode");
    store.release(&k, lease.token, T0 + LEASE).await.unwrap();
    let reclaimed = started(&*store, &k, &new_record("sha256:a", T0 + LEASE), T0 + LEASE).await;
    assert!(
        !reclaimed.transactional,
        "a reclaim writes the new attempt's mode"
    );
}

/// `renew` moves the end of the lease for its owner, live or lapsed (and `expires_at`
/// with it when the lease would outlive the TTL), and nobody else's; after a takeover the
/// old owner cannot renew.
pub async fn renew_moves_the_owners_lease(store: Arc<dyn Store>) {
    let k = key("k1");
    let new = new_record("sha256:a", T0);
    let original = started(&*store, &k, &new, T0).await;
    lease_lost(
        store
            .renew(&k, OwnerToken::random(), T0 + 2 * LEASE, T0 + 1)
            .await,
        "renew with another token",
    );
    lease_lost(
        store
            .renew(&key("absent"), new.lease.token, T0 + 2 * LEASE, T0 + 1)
            .await,
        "renew of a key that has no record",
    );
    store
        .renew(&k, new.lease.token, T0 + 2 * LEASE, T0 + 1)
        .await
        .expect("the owner renews its live lease");
    let renewed = get(&*store, &k, T0 + 1).await;
    assert_eq!(
        renewed,
        Record {
            state: RecordState::Processing {
                lease: Lease {
                    token: new.lease.token,
                    until: T0 + 2 * LEASE,
                },
            },
            ..original.clone()
        },
        "renew moves the lease's end and nothing else"
    );
    lease_lost(
        store
            .take_over(&k, new.lease.token, new.lease, T0 + LEASE + 1)
            .await,
        "take_over of a renewed lease before its new end",
    );
    store
        .renew(&k, new.lease.token, T0 + 4 * LEASE, T0 + 2 * LEASE)
        .await
        .expect("the owner revives its lease that lapsed (nobody took it over)");
    assert!(
        get(&*store, &k, T0 + 3 * LEASE)
            .await
            .is_live_owner(new.lease.token, T0 + 3 * LEASE)
    );
    let taken = Lease {
        token: OwnerToken::random(),
        until: T0 + 6 * LEASE,
    };
    store
        .take_over(&k, new.lease.token, taken, T0 + 5 * LEASE)
        .await
        .unwrap();
    lease_lost(
        store
            .renew(&k, new.lease.token, T0 + 8 * LEASE, T0 + 5 * LEASE)
            .await,
        "renew by an owner whose lease was taken over",
    );

    // Near the end of the TTL, a renewal keeps the record until the lease ends.
    let late_key = key("late");
    let late = T0 + TTL - 10;
    let near = NewRecord {
        lease: Lease {
            token: OwnerToken::random(),
            until: late + 5,
        },
        ..new_record("sha256:a", T0)
    };
    started(&*store, &late_key, &near, T0).await;
    store
        .renew(&late_key, near.lease.token, late + LEASE, late)
        .await
        .unwrap();
    assert_eq!(
        get(&*store, &late_key, late).await.expires_at,
        late + LEASE,
        "a renewed lease never outlives its record"
    );
    let done = key("done");
    let finished = new_record("sha256:a", T0);
    started(&*store, &done, &finished, T0).await;
    store
        .complete(&done, finished.lease.token, &created(), T0)
        .await
        .unwrap();
    lease_lost(
        store
            .renew(&done, finished.lease.token, T0 + LEASE, T0 + 1)
            .await,
        "renew of a completed record",
    );
}

/// `renew` to `now` ends the lease at once: the owner can no longer complete or release,
/// and a takeover succeeds at that very time (an attempt that ended without an outcome
/// hands its operation to recovery without waiting for the lease to run out).
pub async fn renew_to_now_ends_the_lease(store: Arc<dyn Store>) {
    let k = key("k1");
    let new = new_record("sha256:a", T0);
    started(&*store, &k, &new, T0).await;
    let now = T0 + 100;
    store
        .renew(&k, new.lease.token, now, now)
        .await
        .expect("the owner ends its lease");
    lease_lost(
        store.complete(&k, new.lease.token, &created(), now).await,
        "complete after the lease was ended",
    );
    let lease = Lease {
        token: OwnerToken::random(),
        until: now + LEASE,
    };
    let taken = store
        .take_over(&k, new.lease.token, lease, now)
        .await
        .expect("an ended lease is taken over at once");
    assert_eq!(taken.attempt, 2);
}

/// `take_over` needs the current owner's token and an ended lease, and counts an
/// attempt.
pub async fn take_over_only_after_the_lease_ends(store: Arc<dyn Store>) {
    let k = key("k1");
    let new = new_record("sha256:a", T0);
    let original = started(&*store, &k, &new, T0).await;
    let fresh = |now| Lease {
        token: OwnerToken::random(),
        until: now + LEASE,
    };
    lease_lost(
        store
            .take_over(&k, new.lease.token, fresh(T0), T0 + LEASE - 1)
            .await,
        "take_over of a live lease",
    );
    lease_lost(
        store
            .take_over(&k, OwnerToken::random(), fresh(T0), T0 + LEASE)
            .await,
        "take_over naming another owner",
    );
    lease_lost(
        store
            .take_over(&key("absent"), new.lease.token, fresh(T0), T0 + LEASE)
            .await,
        "take_over of a key that has no record",
    );
    let lease = fresh(T0 + LEASE);
    let taken = store
        .take_over(&k, new.lease.token, lease, T0 + LEASE)
        .await
        .expect("an ended lease is taken over");
    assert_eq!(
        taken,
        Record {
            attempt: 2,
            state: RecordState::Processing { lease },
            ..original
        }
    );
    assert_eq!(get(&*store, &k, T0 + LEASE).await, taken);

    let done = key("done");
    let new = new_record("sha256:a", T0);
    started(&*store, &done, &new, T0).await;
    store
        .complete(&done, new.lease.token, &created(), T0)
        .await
        .unwrap();
    lease_lost(
        store
            .take_over(&done, new.lease.token, fresh(T0), T0 + LEASE)
            .await,
        "take_over of a completed record",
    );
}

/// After a takeover the old owner can neither complete, release nor park: fencing.
pub async fn take_over_fences_out_the_old_owner(store: Arc<dyn Store>) {
    let k = key("k1");
    let old = new_record("sha256:a", T0);
    started(&*store, &k, &old, T0).await;
    let now = T0 + LEASE + 5;
    let lease = Lease {
        token: OwnerToken::random(),
        until: now + LEASE,
    };
    store
        .take_over(&k, old.lease.token, lease, now)
        .await
        .unwrap();
    lease_lost(
        store.complete(&k, old.lease.token, &created(), now).await,
        "complete by the old owner",
    );
    lease_lost(
        store.release(&k, old.lease.token, now).await,
        "release by the old owner",
    );
    lease_lost(
        store.park_unknown(&k, old.lease.token, "late", now).await,
        "park_unknown by the old owner",
    );
    store
        .complete(&k, lease.token, &created(), now + 1)
        .await
        .unwrap();
    assert_eq!(
        get(&*store, &k, now + 1).await.state,
        RecordState::Completed {
            response: created()
        }
    );
}

/// Twenty concurrent takeovers of one ended lease: exactly one wins.
pub async fn take_over_has_exactly_one_winner(store: Arc<dyn Store>) {
    let k = key("k1");
    let old = new_record("sha256:a", T0);
    started(&*store, &k, &old, T0).await;
    let now = T0 + LEASE;
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let store = Arc::clone(&store);
            let k = k.clone();
            let lease = Lease {
                token: OwnerToken::random(),
                until: now + LEASE,
            };
            tokio::spawn(async move {
                (
                    lease,
                    store.take_over(&k, old.lease.token, lease, now).await,
                )
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        match task.await.expect("the task must not panic") {
            (lease, Ok(_)) => winners.push(lease),
            (_, Err(StoreError::LeaseLost)) => {}
            (_, Err(e)) => panic!("take_over must win or lose, not fail: {e}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one takeover must win");
    let record = get(&*store, &k, now).await;
    assert_eq!(record.lease(), Some(&winners[0]));
    assert_eq!(record.attempt, 2, "one takeover counts one attempt");
}

/// The current owner parks, live lease or ended; nobody else does.
pub async fn park_unknown_needs_the_current_owner(store: Arc<dyn Store>) {
    let k = key("k1");
    let new = new_record("sha256:a", T0);
    started(&*store, &k, &new, T0).await;
    lease_lost(
        store.park_unknown(&k, OwnerToken::random(), "no", T0).await,
        "park_unknown by another token",
    );
    store
        .park_unknown(&k, new.lease.token, "see the runbook", T0 + LEASE + 1)
        .await
        .expect("the owner parks even after its lease ended");
    let record = get(&*store, &k, T0 + LEASE + 1).await;
    assert_eq!(
        record.state,
        RecordState::Unknown {
            reason: "see the runbook".into()
        }
    );
    lease_lost(
        store
            .take_over(&k, new.lease.token, new.lease, T0 + LEASE + 2)
            .await,
        "take_over of a parked record",
    );
    assert_eq!(
        exists(&*store, &k, &new_record("sha256:a", T0 + 3), T0 + 3).await,
        record
    );
}

/// Once the TTL has passed, `get` finds nothing and `begin` starts a new operation (a
/// new id, attempt 1), whatever state the old record was in.
pub async fn ttl_expiry_starts_a_new_operation(store: Arc<dyn Store>) {
    for (i, finish) in ["complete", "processing", "release", "park"]
        .iter()
        .enumerate()
    {
        let k = key(&format!("ttl-{i}"));
        let first = new_record("sha256:a", T0);
        started(&*store, &k, &first, T0).await;
        match *finish {
            "complete" => store
                .complete(&k, first.lease.token, &created(), T0)
                .await
                .unwrap(),
            "release" => store.release(&k, first.lease.token, T0).await.unwrap(),
            "park" => store
                .park_unknown(&k, first.lease.token, "r", T0)
                .await
                .unwrap(),
            _ => {}
        }
        let expiry = T0 + TTL;
        assert!(store.get(&k, expiry - 1).await.unwrap().is_some());
        assert_eq!(
            store.get(&k, expiry).await.unwrap(),
            None,
            "a record whose TTL has passed is not found"
        );
        let later = new_record("sha256:b", expiry);
        let record = started(&*store, &k, &later, expiry).await;
        assert_eq!(
            record,
            Record::started(&later, expiry),
            "{finish}: a new operation starts"
        );
        assert_ne!(record.operation_id, first.operation_id);
    }
}

/// `purge_expired` deletes the records whose TTL has passed, and only those.
pub async fn purge_removes_expired_records_only(store: Arc<dyn Store>) {
    for (name, at) in [("old-1", T0), ("old-2", T0 + 1), ("young", T0 + 1000)] {
        let new = new_record("sha256:a", at);
        started(&*store, &key(name), &new, at).await;
    }
    let now = T0 + 1 + TTL;
    assert_eq!(store.purge_expired(now).await.unwrap(), 2);
    assert_eq!(
        store.purge_expired(now).await.unwrap(),
        0,
        "purge is idempotent"
    );
    assert!(store.get(&key("young"), now).await.unwrap().is_some());
    // A purged key is free again, even when read at an earlier time.
    assert!(store.get(&key("old-1"), T0).await.unwrap().is_none());
}

/// A reclaim or a takeover near the end of the TTL grants a lease that ends after it: the
/// record's `expires_at` moves to the lease's end, so that while the lease may be live
/// the key is neither forgotten, nor purged, nor taken for a new operation.
pub async fn a_lease_never_outlives_its_record(store: Arc<dyn Store>) {
    let late = T0 + TTL - 10;
    let after_ttl = T0 + TTL + 1;
    let lease = |now| Lease {
        token: OwnerToken::random(),
        until: now + LEASE,
    };

    let reclaimed = key("reclaimed");
    let first = new_record("sha256:a", T0);
    started(&*store, &reclaimed, &first, T0).await;
    store
        .release(&reclaimed, first.lease.token, T0)
        .await
        .unwrap();
    let retry = NewRecord {
        lease: lease(late),
        ..new_record("sha256:a", late)
    };
    let record = started(&*store, &reclaimed, &retry, late).await;
    assert_eq!(
        record.expires_at, retry.lease.until,
        "a reclaim moves expires_at to the end of its lease"
    );

    let taken = key("taken");
    let old = new_record("sha256:a", T0);
    started(&*store, &taken, &old, T0).await;
    let new_lease = lease(late);
    let record = store
        .take_over(&taken, old.lease.token, new_lease, late)
        .await
        .unwrap();
    assert_eq!(
        record.expires_at, new_lease.until,
        "a takeover moves expires_at to the end of its lease"
    );

    assert_eq!(store.purge_expired(after_ttl).await.unwrap(), 0);
    for k in [&reclaimed, &taken] {
        let held = get(&*store, k, after_ttl).await;
        assert!(
            matches!(held.state, RecordState::Processing { .. }),
            "a record under a live lease is found after the TTL"
        );
        let duplicate = exists(&*store, k, &new_record("sha256:a", after_ttl), after_ttl).await;
        assert_eq!(duplicate, held, "a duplicate is not a new operation");
    }
    store
        .complete(&reclaimed, retry.lease.token, &created(), after_ttl)
        .await
        .expect("the owner completes within its lease, past the TTL");
    assert!(
        store
            .get(&reclaimed, retry.lease.until)
            .await
            .unwrap()
            .is_none()
    );
}

/// A lease that ends when it is granted (`until == now`) has ended: nobody completes or
/// releases under it, and a takeover succeeds at once. Zero is a length of time, not "no
/// lease".
pub async fn a_lease_of_zero_has_ended(store: Arc<dyn Store>) {
    let k = key("zero");
    let mut new = new_record("sha256:a", T0);
    new.lease.until = T0;
    let record = started(&*store, &k, &new, T0).await;
    assert_eq!(
        record.state,
        RecordState::Processing { lease: new.lease },
        "the lease is read back as written, in milliseconds"
    );
    assert_eq!(
        record.expires_at,
        T0 + TTL,
        "the TTL is read back in milliseconds"
    );
    lease_lost(
        store.complete(&k, new.lease.token, &created(), T0).await,
        "complete under a lease of zero",
    );
    lease_lost(
        store.release(&k, new.lease.token, T0).await,
        "release under a lease of zero",
    );
    let lease = Lease {
        token: OwnerToken::random(),
        until: T0 + LEASE,
    };
    let taken = store
        .take_over(&k, new.lease.token, lease, T0)
        .await
        .expect("a lease of zero can be taken over at once");
    assert_eq!(taken.attempt, 2);
    assert_eq!(taken.state, RecordState::Processing { lease });
}

/// A result larger than the store keeps ([`DEFAULT_MAX_RESULT`] bytes by default, as
/// [`StoredResponse::size`] counts) is refused with [`StoreError::TooLarge`], naming the
/// size and the limit, never a driver's error; the record is left processing under its
/// owner, who can still park it (a terminal state for an operator). A result of exactly
/// the limit is kept.
pub async fn a_result_over_the_limit_is_refused(store: Arc<dyn Store>) {
    let response = |size: usize| StoredResponse {
        status: 201,
        headers: vec![(
            HeaderName::from_static("location"),
            HeaderValue::from_static("/a"),
        )],
        body: Bytes::from(vec![b'x'; size - "location/a".len()]),
    };
    let big = key("big");
    let new = new_record("sha256:a", T0);
    started(&*store, &big, &new, T0).await;
    let over = response(DEFAULT_MAX_RESULT + 1);
    match store.complete(&big, new.lease.token, &over, T0 + 1).await {
        Err(StoreError::TooLarge { size, limit }) => {
            assert_eq!(size, DEFAULT_MAX_RESULT + 1);
            assert_eq!(limit, DEFAULT_MAX_RESULT);
        }
        other => panic!("a result over the limit must be refused with TooLarge, got {other:?}"),
    }
    assert_eq!(
        get(&*store, &big, T0 + 2).await.state,
        RecordState::Processing { lease: new.lease },
        "a refused result leaves the record as it was"
    );
    store
        .park_unknown(&big, new.lease.token, "the result is too large", T0 + 2)
        .await
        .expect("the owner parks the operation whose result was refused");
    assert_eq!(
        get(&*store, &big, T0 + 3).await.state,
        RecordState::Unknown {
            reason: "the result is too large".into()
        }
    );

    let fits = key("fits");
    let new = new_record("sha256:a", T0);
    started(&*store, &fits, &new, T0).await;
    let exact = response(DEFAULT_MAX_RESULT);
    store
        .complete(&fits, new.lease.token, &exact, T0 + 1)
        .await
        .expect("a result of exactly the limit is kept");
    assert_eq!(
        get(&*store, &fits, T0 + 2).await.state,
        RecordState::Completed { response: exact }
    );
}

/// The parts of a record key are compared whole, whatever separators they contain: a
/// client `a:1` with the key `k` and a client `a` with the key `1:k` are two records.
pub async fn keys_are_compared_whole(store: Arc<dyn Store>) {
    let one = RecordKey::new("create_order", "a:1", "k");
    let two = RecordKey::new("create_order", "a", "1:k");
    let three = RecordKey::new("create_order", "a*", "[k]");
    for k in [&one, &two, &three] {
        started(&*store, k, &new_record("sha256:a", T0), T0).await;
    }
    for k in [&one, &two, &three] {
        assert_eq!(get(&*store, k, T0).await.attempt, 1);
    }
    assert_eq!(
        store.purge_expired(T0 + TTL).await.expect("purge"),
        3,
        "each key is its own record"
    );
}
