//! The client budget's checks ([`crate::store::budget`]): what `begin` refuses, what it
//! never refuses, what it counts and when room comes back.

use std::sync::Arc;

use bytes::Bytes;

use super::{T0, TTL, key, new_record, started};
use crate::store::budget::COUNT_SLACK_MS;
use crate::store::{
    Begin, ClientBudget, NewRecord, OverBudget, RecordKey, Store, StoredResponse, UnixMillis,
};

/// A registration at `now` under `budget`.
fn budgeted(fingerprint: &str, now: UnixMillis, budget: ClientBudget) -> NewRecord {
    NewRecord {
        budget: Some(budget),
        ..new_record(fingerprint, now)
    }
}

/// The key `name` of `client` on `operation`.
fn key_of(operation: &str, client: &str, name: &str) -> RecordKey {
    RecordKey::new(operation, client, name)
}

async fn over_budget(
    store: &dyn Store,
    key: &RecordKey,
    new: &NewRecord,
    now: UnixMillis,
    what: &str,
) -> OverBudget {
    match store.begin(key, new, now).await {
        Ok(Begin::OverBudget(over)) => over,
        other => panic!("{what}: begin must refuse a new key over the budget, got {other:?}"),
    }
}

/// A result whose size ([`StoredResponse::size`]) is `bytes`: a body, no headers.
fn result_of(bytes: usize) -> StoredResponse {
    StoredResponse {
        status: 422,
        headers: Vec::new(),
        body: Bytes::from(vec![b'x'; bytes]),
    }
}

/// A client with as many live records as its budget allows gets `OverBudget` for a new
/// key, with nothing written and `retry_at` at its oldest record's expiry; its records
/// are counted across operations; another client is untouched; once the oldest record
/// expires, a new key fits again.
pub async fn the_budget_refuses_a_new_key_at_its_record_limit(store: Arc<dyn Store>) {
    let budget = ClientBudget::new(2, u64::MAX);
    let first = started(&*store, &key("b1"), &budgeted("sha256:a", T0, budget), T0).await;
    let other_operation = key_of("refund_order", "client-a", "b2");
    started(
        &*store,
        &other_operation,
        &budgeted("sha256:a", T0 + 10, budget),
        T0 + 10,
    )
    .await;
    let over = over_budget(
        &*store,
        &key("b3"),
        &budgeted("sha256:a", T0 + 20, budget),
        T0 + 20,
        "a third record of a client with a budget of two",
    )
    .await;
    assert_eq!(
        over.usage.records, 2,
        "both records, across operations, are counted"
    );
    assert!(
        (first.expires_at..=first.expires_at + COUNT_SLACK_MS).contains(&over.retry_at),
        "room comes back when the oldest expires: {over:?}, expiry {}",
        first.expires_at
    );
    assert!(
        store.get(&key("b3"), T0 + 20).await.expect("get").is_none(),
        "a refused key must not be written"
    );
    let b = key_of("create_order", "client-b", "b3");
    started(&*store, &b, &budgeted("sha256:a", T0 + 20, budget), T0 + 20).await;
    let later = over.retry_at;
    started(
        &*store,
        &key("b3"),
        &budgeted("sha256:a", later, budget),
        later,
    )
    .await;
}

/// A client at its budget still gets its own keys answered: a duplicate of a held key,
/// a completed key, a released key retried with the same fingerprint, and a key reused
/// with other content are all answered as without a budget.
pub async fn the_budget_never_refuses_a_key_the_client_holds(store: Arc<dyn Store>) {
    let budget = ClientBudget::new(2, u64::MAX);
    let held = started(&*store, &key("h1"), &budgeted("sha256:a", T0, budget), T0).await;
    let released = started(&*store, &key("h2"), &budgeted("sha256:a", T0, budget), T0).await;
    let token = |r: &crate::store::Record| r.lease().expect("processing").token;
    store
        .release(&key("h2"), token(&released), T0 + 1)
        .await
        .expect("release");
    let now = T0 + 2;
    over_budget(
        &*store,
        &key("h3"),
        &budgeted("sha256:a", now, budget),
        now,
        "at the budget",
    )
    .await;
    match store
        .begin(&key("h1"), &budgeted("sha256:a", now, budget), now)
        .await
    {
        Ok(Begin::Exists(record)) => assert_eq!(record.operation_id, held.operation_id),
        other => panic!("a duplicate of a held key must see its record, got {other:?}"),
    }
    match store
        .begin(&key("h1"), &budgeted("sha256:b", now, budget), now)
        .await
    {
        Ok(Begin::Exists(_)) => {}
        other => panic!("a held key with other content must see its record, got {other:?}"),
    }
    match store
        .begin(&key("h2"), &budgeted("sha256:a", now, budget), now)
        .await
    {
        Ok(Begin::Started(record)) => assert_eq!(record.attempt, 2),
        other => panic!("a released key's retry must be reclaimed at the budget, got {other:?}"),
    }
    store
        .complete(&key("h1"), token(&held), &result_of(10), now + 1)
        .await
        .expect("complete");
    match store
        .begin(&key("h1"), &budgeted("sha256:a", now + 2, budget), now + 2)
        .await
    {
        Ok(Begin::Exists(record)) => assert!(record.state.kind().as_str() == "completed"),
        other => panic!("a completed key must be replayed at the budget, got {other:?}"),
    }
}

/// The bytes of stored results count: a client whose results reach its byte budget gets
/// `OverBudget` for a new key until they expire; a registration without a budget is never
/// refused.
pub async fn the_budget_counts_stored_bytes(store: Arc<dyn Store>) {
    let budget = ClientBudget::new(1_000, 100);
    let first = started(&*store, &key("s1"), &budgeted("sha256:a", T0, budget), T0).await;
    let token = first.lease().expect("processing").token;
    store
        .complete(&key("s1"), token, &result_of(150), T0 + 1)
        .await
        .expect("complete");
    let over = over_budget(
        &*store,
        &key("s2"),
        &budgeted("sha256:a", T0 + 2, budget),
        T0 + 2,
        "a client whose results hold 150 bytes of a budget of 100",
    )
    .await;
    assert!(
        over.usage.bytes >= 150,
        "the stored result's bytes are counted: {over:?}"
    );
    assert_eq!(over.usage.records, 1);
    started(&*store, &key("s2"), &new_record("sha256:a", T0 + 2), T0 + 2).await;
    let later = first.expires_at.max(T0 + TTL) + COUNT_SLACK_MS;
    started(
        &*store,
        &key("s3"),
        &budgeted("sha256:a", later, budget),
        later,
    )
    .await;
}

/// A result stored after its lease was renewed, or after its key was released and
/// reclaimed, counts its bytes as the first attempt's would: the record is counted once,
/// where it was registered, and keeps its count through every later lease.
pub async fn a_reclaimed_or_renewed_record_counts_its_result(store: Arc<dyn Store>) {
    let client = "kept-count";
    let k = key_of("op", client, "r1");
    let count_only = |now| budgeted("sha256:a", now, ClientBudget::COUNT_ONLY);
    let first = started(&*store, &k, &count_only(T0), T0).await;
    let token = |r: &crate::store::Record| r.lease().expect("processing").token;
    store
        .renew(&k, token(&first), T0 + 60_000, T0 + 1)
        .await
        .expect("renew");
    store
        .release(&k, token(&first), T0 + 2)
        .await
        .expect("release");
    let second = started(&*store, &k, &count_only(T0 + 3), T0 + 3).await;
    assert_eq!(second.attempt, 2);
    store
        .renew(&k, token(&second), T0 + 70_000, T0 + 4)
        .await
        .expect("renew");
    store
        .complete(&k, token(&second), &result_of(150), T0 + 5)
        .await
        .expect("complete");
    let usage = store
        .client_usage(client, 100, T0 + 6)
        .await
        .expect("usage");
    assert_eq!(usage.usage.records, 1, "counted once: {usage:?}");
    assert!(
        usage.usage.bytes >= 150,
        "the reclaimed record's result counts: {usage:?}"
    );
}

/// `client_usage` counts what `begin` and `complete` counted: the client's live records
/// registered under any budget — [`ClientBudget::COUNT_ONLY`] included, which refuses
/// nothing — their results' bytes, and the oldest one's expiry; another client's are not
/// its, and an expired record no longer counts.
pub async fn client_usage_counts_what_the_budget_counts(store: Arc<dyn Store>) {
    let client = "client-usage";
    let none = store.client_usage(client, 100, T0).await.expect("usage");
    assert_eq!((none.usage.records, none.usage.bytes), (0, 0), "{none:?}");
    assert_eq!(none.oldest_expiry, None);
    let count_only = |now| budgeted("sha256:a", now, ClientBudget::COUNT_ONLY);
    let first = started(&*store, &key_of("op", client, "u1"), &count_only(T0), T0).await;
    let token = first.lease().expect("processing").token;
    store
        .complete(&key_of("op", client, "u1"), token, &result_of(150), T0 + 1)
        .await
        .expect("complete");
    let second = budgeted("sha256:a", T0 + 5, ClientBudget::new(100, u64::MAX));
    started(&*store, &key_of("other_op", client, "u2"), &second, T0 + 5).await;
    started(
        &*store,
        &key_of("op", "someone-else", "u1"),
        &count_only(T0),
        T0,
    )
    .await;
    let usage = store
        .client_usage(client, 100, T0 + 10)
        .await
        .expect("usage");
    assert_eq!(usage.usage.records, 2, "{usage:?}");
    assert!(
        usage.usage.bytes >= 150,
        "the stored result's bytes: {usage:?}"
    );
    let oldest = usage.oldest_expiry.expect("an oldest record");
    assert!(
        (first.expires_at..=first.expires_at + COUNT_SLACK_MS).contains(&oldest),
        "{usage:?}, expiry {}",
        first.expires_at
    );
    let later = first.expires_at.max(T0 + 5 + TTL) + COUNT_SLACK_MS + 1;
    let gone = store.client_usage(client, 100, later).await.expect("usage");
    assert_eq!(
        gone.usage.records, 0,
        "expired records no longer count: {gone:?}"
    );
}
