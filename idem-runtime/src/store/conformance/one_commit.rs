//! A new key through a transactional store's one-commit path as the runtime takes it,
//! without the service around it: what a benchmark compares with the hand-written
//! minimum's statements, to tell the store's cost from the service's.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::store::{
    InFlight, NewRecord, RecordKey, Registered, Reservation, StoreError, StoredResponse,
    TransactionalStore, UnixMillis,
};

/// A business write for [`one_commit_new_key`]: given the attempt's transaction and its
/// operation id, it writes on that transaction (a `fn` item, so that it can borrow both).
pub type Effect<DB> =
    for<'t> fn(
        &'t mut sqlx::Transaction<'static, DB>,
        &'t str,
    ) -> Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send + 't>>;

/// One new key through `store`'s one-commit path, as the runtime takes it for a
/// transactional handler whose key has no record: on a store that marks keys in this
/// process (SQLite's one writer) the key marked in flight, its record read under the mark
/// and found missing, then the writer's turn waited for with the mark; on one that does
/// not (PostgreSQL) no turn. Then the key registered inside a transaction
/// ([`TransactionalStore::begin_registered`]: PostgreSQL's statement that takes the key's
/// advisory lock and reads its record; SQLite's one call that begins and marks the
/// transaction), `effect` run on that transaction with the operation id (the business
/// write), the record written completed with `response`
/// ([`TransactionalStore::complete_in`]) and the transaction committed (by the
/// completion itself on SQLite). No budget is counted: `new.budget` is expected `None`.
///
/// # Errors
///
/// [`StoreError::Corrupt`], naming what was found, when the key is not new (a record, an
/// attempt in flight, a budget that refuses); [`StoreError::Unavailable`] when `effect`
/// or the commit fails; the store's own errors as they come.
pub async fn one_commit_new_key<S: TransactionalStore>(
    store: &S,
    key: &RecordKey,
    new: &NewRecord,
    response: &StoredResponse,
    now: UnixMillis,
    effect: Effect<S::Database>,
) -> Result<(), StoreError> {
    let not_new = |what: String| StoreError::Corrupt(format!("the key was not new: {what}"));
    let attempt = InFlight {
        operation_id: new.operation_id,
        attempt: 1,
        until: new.lease.until,
    };
    let reservation = match store.mark(key, attempt) {
        None => Reservation::default(),
        Some(Err(holder)) => return Err(not_new(format!("{holder:?} holds it"))),
        Some(Ok(mark)) => {
            if let Some(record) = store.get(key, now).await? {
                return Err(not_new(format!("{record:?}")));
            }
            store.reserve().await?.marked(mark)
        }
    };
    let within = Duration::from_secs(30);
    let mut open = match store
        .begin_registered(reservation, key, new, now, within)
        .await?
    {
        Registered::Started(_, open) => open,
        other => return Err(not_new(format!("{other:?}"))),
    };
    let id = new.operation_id.to_string();
    effect(&mut open.tx, &id)
        .await
        .map_err(StoreError::unavailable)?;
    store
        .complete_in(&mut open, key, new.lease.token, response, now)
        .await?;
    if open.committed {
        return Ok(());
    }
    open.tx.commit().await.map_err(StoreError::unavailable)
}
