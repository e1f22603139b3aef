//! What differs between the databases the SQL stores speak: the statements whose SQL is
//! not the same in both, what a store keeps beside its pool, how a connection is had and a
//! driver error classified, how a key is registered, and the transactional mode.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use sqlx::pool::PoolConnection;

use super::SqlStore;
use super::records::Registration;
use super::statement::{Run, Statement};
use crate::store::{
    Begin, InFlight, KeyMark, OpenTransaction, OwnerToken, RecordKey, Registered, Reservation,
    StoreError,
};

/// A database [`SqlStore`] speaks: implemented for `sqlx::Sqlite` and `sqlx::Postgres`.
///
/// Every statement numbers its parameters `$1`, `$2`, … and is bound in that order
/// ([`super::statement`]); the parameters of each statement are listed on the
/// statement's constant.
pub trait Dialect: Run {
    /// What a store keeps beside its pool (SQLite: its file's health and its one writer).
    type State: Clone + fmt::Debug + Send + Sync + 'static;

    /// `take_over`: `$1`..`$3` the key, `$4` the expected token, `$5` now, `$6` the new
    /// token, `$7` the new lease's end ([`crate::store::Record::leased`]); appends the
    /// takeover to the history (`store::ops`, at most 32 events) and returns the record's
    /// columns, on the condition that the record is processing under `$4`, its lease
    /// ended and its TTL not passed at `$5`.
    const TAKE_OVER: &'static str;

    /// `list`: `$1` now, `$2` the operation or NULL, `$3` the state or NULL, `$4` only
    /// ended leases, `$5`..`$7` the cursor (operation, client, key) or NULLs, `$8` the
    /// page; returns `operation`, `client`, `key` and the record's columns, ordered by
    /// operation, client and key, comparing text bytewise.
    const LIST: &'static str;

    /// `resolve`: `$1`..`$3` the key, `$4` the attempt seen parked, `$5` the new state,
    /// `$6`..`$8` the result's status, headers and body or NULLs, `$9` the resolution's
    /// event as JSON (its `parked` taken from the row's reason), `$10` now; returns the
    /// record's columns, on the condition that the record is parked at `$4` and its TTL
    /// not passed at `$10`.
    const RESOLVE: &'static str;

    /// `purge_expired`: `$1` now; deletes records whose TTL has passed, at most
    /// [`Dialect::PURGE_BATCH`] of them.
    const PURGE: &'static str;

    /// [`RecordStore::clock`](crate::store::RecordStore::clock): no parameter; returns
    /// the database's clock as `now_ms`, unix milliseconds; `None` for a database that
    /// lives on this machine and judges by its clock.
    const CLOCK: Option<&'static str>;

    /// How many records one [`Dialect::PURGE`] deletes at most (it runs again until it
    /// deletes fewer), or `None` when it deletes all of them at once.
    const PURGE_BATCH: Option<u64>;

    /// A connection of `store`'s pool for one call; a failure is [`Dialect::fault`]'s
    /// unless said otherwise.
    fn acquire(
        store: &SqlStore<Self>,
    ) -> impl Future<Output = Result<PoolConnection<Self>, StoreError>> + Send {
        async {
            store
                .pool
                .acquire()
                .await
                .map_err(|e| Self::fault(store, e))
        }
    }

    /// The [`StoreError`] of a driver error on one of `store`'s connections, after noting
    /// any fault it shows (so that broken connections are replaced, not handed out
    /// again): [`StoreError::Unavailable`] (marked [`StoreError::full`] when the database
    /// is full), and nothing noted, unless said otherwise.
    fn fault(store: &SqlStore<Self>, error: sqlx::Error) -> StoreError {
        let _ = store;
        super::unavailable(error)
    }

    /// [`RecordStore::begin`](crate::store::RecordStore::begin) on `conn`, atomically.
    fn register(
        store: &SqlStore<Self>,
        conn: &mut Self::Connection,
        registration: Registration<'_>,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send;
}

/// What [`TransactionalStore`](crate::store::TransactionalStore) for [`SqlStore`] asks of a
/// database besides its [`Dialect`]: implemented for `sqlx::Sqlite` and `sqlx::Postgres`.
/// Each method is the `TransactionalStore` method of the same name, for a store of this
/// database.
pub trait TxDialect: Dialect {
    /// The completion inside an attempt's transaction, with the values of
    /// `SqlStore::completion` (`records::completion_sql!` and the condition that fences
    /// there), and perhaps more ([`TxDialect::complete_in`] binds them).
    const COMPLETE_IN_TX: &'static str;

    /// The completion inside a transaction that registered the key itself
    /// ([`TxDialect::begin_registered`]), bound as [`TxDialect::COMPLETE_IN_TX`]: the
    /// transaction's mark on the key fences, so the lease is not compared; the same
    /// statement unless said otherwise.
    const COMPLETE_REGISTERED_IN_TX: &'static str = Self::COMPLETE_IN_TX;

    /// The completion of a record registration did not write
    /// ([`OpenTransaction::written_at_completion`]): an `INSERT` of the record in its
    /// final state, with the values of `SqlStore::completion` (`$1`..`$9`), then the
    /// record's operation id, fingerprint, creation, expiry and mode (`$10`..`$14`), and
    /// perhaps more ([`TxDialect::complete_in`] binds them); it inserts nothing if the key
    /// has a row. `None` (the default) for a database that always writes at
    /// registration.
    const INSERT_COMPLETED_IN_TX: Option<&'static str> = None;

    /// Whether an open transaction holds the database's only write lock; `false` unless
    /// said otherwise.
    const FENCES_BY_LOCK: bool = false;

    /// Once the result fits: runs `completion` ([`TxDialect::COMPLETE_IN_TX`], or
    /// [`TxDialect::INSERT_COMPLETED_IN_TX`], with the completion's values) inside `tx`,
    /// and makes sure `tx` is still the transaction that began.
    fn complete_in(
        store: &SqlStore<Self>,
        tx: &mut OpenTransaction<Self>,
        completion: Statement<Self>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Nothing to wait for unless said otherwise (a database of many writers).
    fn reserve(
        store: &SqlStore<Self>,
    ) -> impl Future<Output = Result<Reservation, StoreError>> + Send {
        let _ = store;
        async { Ok(Reservation::default()) }
    }

    /// [`TransactionalStore::mark`](crate::store::TransactionalStore::mark): no marks
    /// outside a transaction unless said otherwise.
    fn mark(
        store: &SqlStore<Self>,
        key: &RecordKey,
        attempt: InFlight,
    ) -> Option<Result<KeyMark, InFlight>> {
        let _ = (store, key, attempt);
        None
    }

    /// Free unless said otherwise.
    fn try_reserve(store: &SqlStore<Self>) -> Option<Reservation> {
        let _ = store;
        Some(Reservation::default())
    }

    /// A transaction begun on a connection of the pool, and its marker, for an attempt
    /// whose time ends `within` from now.
    fn begin_transaction(
        store: &SqlStore<Self>,
        reservation: Reservation,
        within: Duration,
    ) -> impl Future<Output = Result<OpenTransaction<Self>, StoreError>> + Send;

    /// A transaction begun on a connection of the pool with the key registered inside
    /// it, for an attempt whose time ends `within` from now.
    fn begin_registered(
        store: &SqlStore<Self>,
        reservation: Reservation,
        registration: Registration<'_>,
        within: Duration,
    ) -> impl Future<Output = Result<Registered<Self>, StoreError>> + Send;

    /// The attempt holding `key` in a transaction of [`TxDialect::begin_registered`].
    fn in_flight(
        store: &SqlStore<Self>,
        key: &RecordKey,
    ) -> impl Future<Output = Result<Option<InFlight>, StoreError>> + Send;

    /// `Ok(false)` unless said otherwise.
    fn release_in(
        store: &SqlStore<Self>,
        tx: &mut OpenTransaction<Self>,
        key: &RecordKey,
        token: OwnerToken,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        let _ = (store, tx, key, token);
        async { Ok(false) }
    }

    /// [`Dialect::fault`] unless said otherwise.
    fn rollback_failed(store: &SqlStore<Self>, error: sqlx::Error) -> StoreError {
        Self::fault(store, error)
    }

    /// Nothing unless said otherwise (a completion that does not commit).
    fn completion_abandoned(_store: &SqlStore<Self>) {}
}
