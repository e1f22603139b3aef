//! The operator's calls: listing, the history of attempts, resolution of parked
//! records ([`crate::store::ops`]).

use std::sync::Arc;

use super::{LEASE, T0, TTL, created, get, key, new_record, started};
use crate::store::{
    AttemptEnd, Lease, ListQuery, OperationState, OwnerToken, RecordKey, RecordState, Resolution,
    ResolutionOutcome, Store, StoreError, ops::HISTORY_LIMIT,
};

/// A record parked as unknown at attempt 1 with the reason `lost`.
async fn parked(store: &dyn Store, k: &RecordKey) {
    let new = new_record("sha256:a", T0);
    started(store, k, &new, T0).await;
    store
        .park_unknown(k, new.lease.token, "lost", T0 + 1)
        .await
        .expect("the owner parks");
}

fn resolution(attempt: u32, outcome: ResolutionOutcome) -> Resolution {
    Resolution {
        expected_attempt: attempt,
        outcome,
        by: "ana".into(),
        reason: "checked the ledger".into(),
    }
}

fn keys(listed: &[crate::store::Listed]) -> Vec<String> {
    listed
        .iter()
        .map(|l| format!("{}/{}/{}", l.key.operation, l.key.client, l.key.key))
        .collect()
}

/// `list` filters by operation and state, orders by operation, client and key, pages
/// with a limit and the last key, and leaves out expired records.
pub async fn list_filters_orders_and_pages(store: Arc<dyn Store>) {
    let now = T0 + 10;
    for (op, client, name) in [
        ("b_op", "c1", "k2"),
        ("a_op", "c2", "k1"),
        ("a_op", "c1", "k9"),
        ("a_op", "c1", "k10"),
    ] {
        let k = RecordKey::new(op, client, name);
        started(&*store, &k, &new_record("sha256:a", T0), T0).await;
    }
    let done = RecordKey::new("a_op", "c3", "k1");
    let new = new_record("sha256:a", T0);
    started(&*store, &done, &new, T0).await;
    store
        .complete(&done, new.lease.token, &created(), T0 + 1)
        .await
        .unwrap();
    // One that expires before `now`.
    let mut short = new_record("sha256:a", T0);
    short.expires_at = T0 + 5;
    short.lease.until = T0 + 5;
    started(&*store, &RecordKey::new("a_op", "c0", "gone"), &short, T0).await;

    let all = store
        .list(
            &ListQuery {
                limit: 100,
                ..ListQuery::default()
            },
            now,
        )
        .await
        .unwrap();
    assert_eq!(
        keys(&all),
        [
            "a_op/c1/k10",
            "a_op/c1/k9",
            "a_op/c2/k1",
            "a_op/c3/k1",
            "b_op/c1/k2"
        ],
        "every record whose TTL has not passed, in bytewise order"
    );
    let processing = store
        .list(
            &ListQuery {
                operation: Some("a_op".into()),
                state: Some(OperationState::Processing),
                limit: 100,
                ..ListQuery::default()
            },
            now,
        )
        .await
        .unwrap();
    assert_eq!(
        keys(&processing),
        ["a_op/c1/k10", "a_op/c1/k9", "a_op/c2/k1"]
    );
    let completed = store
        .list(
            &ListQuery {
                state: Some(OperationState::Completed),
                limit: 100,
                ..ListQuery::default()
            },
            now,
        )
        .await
        .unwrap();
    assert_eq!(keys(&completed), ["a_op/c3/k1"]);
    assert_eq!(completed[0].record, get(&*store, &done, now).await);

    let mut pages = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list(
                &ListQuery {
                    limit: 2,
                    after: after.clone(),
                    ..ListQuery::default()
                },
                now,
            )
            .await
            .unwrap();
        assert!(page.len() <= 2, "a page holds at most `limit` records");
        let Some(last) = page.last() else { break };
        after = Some(last.key.clone());
        pages.extend(keys(&page));
    }
    assert_eq!(
        pages,
        keys(&all),
        "the pages together are the whole listing, once each"
    );
}

/// `list` with `lease_ended` finds the processing records whose lease has ended at
/// `now`, not live ones nor finished ones.
pub async fn list_finds_ended_leases(store: Arc<dyn Store>) {
    let ended = key("ended");
    let live = key("live");
    started(&*store, &ended, &new_record("sha256:a", T0), T0).await;
    started(&*store, &live, &new_record("sha256:a", T0 + 20), T0 + 20).await;
    let k3 = key("parked");
    parked(&*store, &k3).await;
    let query = ListQuery {
        lease_ended: true,
        limit: 10,
        ..ListQuery::default()
    };
    let found = store.list(&query, T0 + LEASE).await.unwrap();
    assert_eq!(keys(&found), ["create_order/client-a/ended"]);
    assert!(
        store.list(&query, T0 + LEASE - 1).await.unwrap().is_empty(),
        "a live lease is not listed"
    );
}

/// `inspect` shows every attempt: when it began and how it ended, from the reclaims and
/// takeovers the record went through.
pub async fn inspect_shows_every_attempt(store: Arc<dyn Store>) {
    let k = key("k1");
    assert!(
        store.inspect(&k, T0).await.unwrap().is_none(),
        "no record, nothing to show"
    );
    let first = new_record("sha256:a", T0);
    started(&*store, &k, &first, T0).await;
    store.release(&k, first.lease.token, T0 + 5).await.unwrap();
    let second = new_record("sha256:a", T0 + 10);
    started(&*store, &k, &second, T0 + 10).await;
    let now = T0 + 10 + LEASE;
    let lease = Lease {
        token: OwnerToken::random(),
        until: now + LEASE,
    };
    store
        .take_over(&k, second.lease.token, lease, now)
        .await
        .unwrap();

    let shown = store.inspect(&k, now).await.unwrap().expect("the record");
    assert_eq!(shown.record, get(&*store, &k, now).await);
    let attempts: Vec<_> = shown
        .attempts
        .iter()
        .map(|a| (a.attempt, a.began_at, a.ended.clone()))
        .collect();
    assert_eq!(
        attempts,
        [
            (1, Some(T0), AttemptEnd::Released),
            (
                2,
                Some(T0 + 10),
                AttemptEnd::LeaseEnded {
                    at: T0 + 10 + LEASE
                }
            ),
            (
                3,
                Some(now),
                AttemptEnd::Running {
                    lease_until: now + LEASE
                }
            ),
        ]
    );
    assert!(shown.resolutions.is_empty());

    // A new operation under the key (after the TTL) starts a history of its own.
    let later = T0 + TTL + 10 * LEASE;
    started(&*store, &k, &new_record("sha256:b", later), later).await;
    let shown = store.inspect(&k, later).await.unwrap().unwrap();
    assert_eq!(shown.attempts.len(), 1);
    assert_eq!(shown.attempts[0].began_at, Some(later));
}

/// The history keeps the last events only: a record reclaimed many times shows every
/// attempt, the oldest without their times.
pub async fn the_history_is_bounded(store: Arc<dyn Store>) {
    let k = key("k1");
    let rounds = u64::try_from(HISTORY_LIMIT).unwrap() + 4;
    let mut now = T0;
    for _ in 0..=rounds {
        let new = new_record("sha256:a", now);
        started(&*store, &k, &new, now).await;
        store.release(&k, new.lease.token, now + 1).await.unwrap();
        now += 2;
    }
    let shown = store.inspect(&k, now).await.unwrap().unwrap();
    assert_eq!(u64::from(shown.record.attempt), rounds + 1);
    let timed = shown
        .attempts
        .iter()
        .filter(|a| a.began_at.is_some())
        .count();
    assert_eq!(
        timed,
        HISTORY_LIMIT + 1,
        "the first attempt and the last events"
    );
    assert_eq!(shown.attempts[1].ended, AttemptEnd::NotRecorded);
    assert_eq!(shown.attempts.last().unwrap().ended, AttemptEnd::Released);
}

/// A parked record resolved as completed replays the operator's result, and the
/// resolution (who, when, why, the parked reason) is in its history.
pub async fn resolve_as_completed_stores_the_result(store: Arc<dyn Store>) {
    let k = key("k1");
    parked(&*store, &k).await;
    let written = store
        .resolve(
            &k,
            &resolution(1, ResolutionOutcome::Completed(created())),
            T0 + 100,
        )
        .await
        .expect("a parked record is resolved");
    assert_eq!(
        written.state,
        RecordState::Completed {
            response: created()
        }
    );
    assert_eq!(get(&*store, &k, T0 + 100).await, written);
    let shown = store.inspect(&k, T0 + 100).await.unwrap().unwrap();
    assert_eq!(shown.resolutions.len(), 1);
    let r = &shown.resolutions[0];
    assert_eq!(
        (
            r.attempt,
            r.at,
            r.by.as_str(),
            r.reason.as_str(),
            r.parked.as_str(),
            r.completed_status
        ),
        (1, T0 + 100, "ana", "checked the ledger", "lost", Some(201))
    );
    let again = store
        .resolve(&k, &resolution(1, ResolutionOutcome::NotApplied), T0 + 101)
        .await;
    assert!(
        matches!(&again, Err(StoreError::Changed(m)) if m.contains("completed")),
        "a second resolution is refused and says the record is completed: {again:?}"
    );
    assert_eq!(get(&*store, &k, T0 + 101).await, written, "nothing changed");
}

/// A parked record resolved as not applied is released: the client's retry with the same
/// content runs as the next attempt.
pub async fn resolve_as_not_applied_releases_the_key(store: Arc<dyn Store>) {
    let k = key("k1");
    parked(&*store, &k).await;
    let written = store
        .resolve(&k, &resolution(1, ResolutionOutcome::NotApplied), T0 + 100)
        .await
        .unwrap();
    assert_eq!(written.state, RecordState::Released);
    let retry = started(&*store, &k, &new_record("sha256:a", T0 + 200), T0 + 200).await;
    assert_eq!(retry.attempt, 2);
    let shown = store.inspect(&k, T0 + 200).await.unwrap().unwrap();
    assert_eq!(shown.resolutions[0].completed_status, None);
    assert_eq!(shown.attempts[0].ended, AttemptEnd::Released);
}

/// A resolution changes nothing when there is no record, the record is not parked, or it
/// is parked at another attempt than the operator saw; each says which.
pub async fn resolve_refuses_what_is_not_parked(store: Arc<dyn Store>) {
    let none = store
        .resolve(
            &key("nobody"),
            &resolution(1, ResolutionOutcome::NotApplied),
            T0,
        )
        .await;
    assert!(matches!(none, Err(StoreError::NotFound)), "{none:?}");

    let k = key("running");
    started(&*store, &k, &new_record("sha256:a", T0), T0).await;
    let before = get(&*store, &k, T0 + 1).await;
    let running = store
        .resolve(&k, &resolution(1, ResolutionOutcome::NotApplied), T0 + 1)
        .await;
    assert!(
        matches!(&running, Err(StoreError::Changed(m)) if m.contains("processing")),
        "{running:?}"
    );
    assert_eq!(get(&*store, &k, T0 + 1).await, before);

    let p = key("parked");
    parked(&*store, &p).await;
    let stale = store
        .resolve(
            &p,
            &resolution(2, ResolutionOutcome::Completed(created())),
            T0 + 2,
        )
        .await;
    assert!(
        matches!(&stale, Err(StoreError::Changed(m)) if m.contains("attempt 1")),
        "{stale:?}"
    );
    assert!(matches!(
        get(&*store, &p, T0 + 2).await.state,
        RecordState::Unknown { .. }
    ));
    let expired = store
        .resolve(
            &p,
            &resolution(1, ResolutionOutcome::NotApplied),
            T0 + TTL + 1,
        )
        .await;
    assert!(matches!(expired, Err(StoreError::NotFound)), "{expired:?}");
}

/// Of many operators resolving one parked record at once, exactly one succeeds.
pub async fn resolve_has_exactly_one_winner(store: Arc<dyn Store>) {
    let k = key("k1");
    parked(&*store, &k).await;
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let store = Arc::clone(&store);
            let k = k.clone();
            let outcome = if i % 2 == 0 {
                ResolutionOutcome::NotApplied
            } else {
                ResolutionOutcome::Completed(created())
            };
            tokio::spawn(async move { store.resolve(&k, &resolution(1, outcome), T0 + 9).await })
        })
        .collect();
    let mut won = 0;
    for task in tasks {
        match task.await.expect("no panic") {
            Ok(_) => won += 1,
            Err(StoreError::Changed(_)) => {}
            Err(e) => panic!("resolve must win or be refused, not fail: {e}"),
        }
    }
    assert_eq!(won, 1, "exactly one resolution wins");
    let shown = store.inspect(&k, T0 + 9).await.unwrap().unwrap();
    assert_eq!(shown.resolutions.len(), 1, "one resolution is recorded");
}
