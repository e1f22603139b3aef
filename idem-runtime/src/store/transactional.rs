//! Stores that can write a record inside the business transaction (the transactional
//! mode, [`crate::transaction`]).

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{Database, Transaction};
use tokio::sync::OwnedSemaphorePermit;

use super::{OwnerToken, RecordKey, Store, StoreError, StoredResponse, UnixMillis};

/// The right to begin one transaction, taken before the key is registered: with a store
/// that admits one writer at a time, waiting for it happens before anything is
/// registered, so that a client that gives up meanwhile leaves nothing behind, and the
/// wait is not charged to the attempt's lease.
#[derive(Debug, Default)]
pub struct Reservation {
    _writer: Option<OwnedSemaphorePermit>,
}

impl Reservation {
    /// A reservation that holds `writer` (the one-writer permit of the store), or
    /// nothing for a store that admits many writers.
    pub fn new(writer: Option<OwnedSemaphorePermit>) -> Reservation {
        Reservation { _writer: writer }
    }
}

/// A connection of a store's pool with a transaction begun on it, as
/// [`TransactionalStore::begin_transaction`] gives it out.
///
/// The runtime commits or rolls it back; dropped while still open, it is rolled back
/// (sqlx's `Transaction`).
pub struct OpenTransaction<DB: Database> {
    pub(crate) tx: Transaction<'static, DB>,
    /// What proves, when the record is written, that this is still the transaction that
    /// began (see [`TransactionalStore::complete_in`]).
    pub(crate) marker: i64,
    /// Held for the whole transaction by stores that admit one writer at a time.
    pub(crate) reservation: Reservation,
}

impl<DB: Database> OpenTransaction<DB> {
    /// A transaction begun on a connection of the store's pool, with the store's
    /// `marker` of it, holding `reservation` until it ends.
    pub fn new(tx: Transaction<'static, DB>, marker: i64, reservation: Reservation) -> Self {
        OpenTransaction {
            tx,
            marker,
            reservation,
        }
    }
}

impl<DB: Database> std::fmt::Debug for OpenTransaction<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenTransaction").finish_non_exhaustive()
    }
}

/// A [`Store`] whose records live in a SQL database beside the business data, so that a
/// handler's business writes and the key's final state commit in one transaction: an
/// effect without its record, or a record without its effect, cannot happen
/// (`Idem::transactional`, [`crate::transaction::Tx`]).
///
/// Implemented by [`SqliteStore`](super::SqliteStore) and `PostgresStore`.
#[async_trait]
pub trait TransactionalStore: Store {
    /// The sqlx database: `sqlx::Sqlite` or `sqlx::Postgres`.
    type Database: Database;

    /// The right to begin one transaction, waited for before the key is registered (a
    /// store with many writers gives it at once).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the wait is over before the right is free.
    async fn reserve(&self) -> Result<Reservation, StoreError>;

    /// The right to begin one transaction if it is free now, without waiting.
    fn try_reserve(&self) -> Option<Reservation>;

    /// A connection of the store's pool with a transaction begun on it, for one attempt
    /// whose time ends `within` from now, and a marker of that transaction.
    ///
    /// A store on a server bounds the transaction there by `within` (and a grace), so
    /// that a session whose client went silent, a partition, holds no lock for much
    /// longer than the attempt could have used it: `PostgresStore` sets the
    /// transaction's `statement_timeout` and `idle_in_transaction_session_timeout`
    /// (`store::postgres`). SQLite, a file on this machine, has no use for it.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when no connection can be had or the transaction
    /// cannot begin (in time).
    async fn begin_transaction(
        &self,
        reservation: Reservation,
        within: Duration,
    ) -> Result<OpenTransaction<Self::Database>, StoreError>;

    /// Writes `response` as the operation's result inside `tx`, if `token` owns a lease
    /// that is live at `now` (the same compare-and-set as
    /// [`RecordStore::complete`](super::RecordStore::complete)), after checking that `tx`
    /// is still the transaction that began: not aborted by the database (a failed
    /// statement on PostgreSQL, a conflict clause that rolls back on SQLite), nor ended by
    /// the handler. Nothing is committed here.
    ///
    /// # Errors
    ///
    /// [`StoreError::TransactionEnded`] when the transaction is no longer the one that
    /// began; [`StoreError::LeaseLost`] when `token` does not own a live lease (the caller
    /// must roll the whole transaction back); [`StoreError::TooLarge`], or
    /// [`StoreError::Unavailable`].
    async fn complete_in(
        &self,
        tx: &mut OpenTransaction<Self::Database>,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError>;

    /// The [`StoreError`] for a driver error on one of this store's connections (such as
    /// a failed commit), after noting any fault it shows so that broken connections are
    /// replaced rather than handed out again.
    fn fault(&self, error: sqlx::Error) -> StoreError;

    /// Rolls back what the handler wrote inside `tx` and releases the key in the same
    /// transaction (the caller then commits it), for a store whose open transaction
    /// fences out every other writer ([`TransactionalStore::fences_by_lock`]): the release
    /// then needs neither a live lease nor a wait for the lock. Returns `Ok(false)` when
    /// the store does not do this (the default); the caller rolls back and releases the
    /// key on its own.
    ///
    /// # Errors
    ///
    /// [`StoreError::TransactionEnded`] when the database ended the transaction by
    /// itself; [`StoreError::LeaseLost`] when `token` no longer owns the record;
    /// [`StoreError::Unavailable`].
    async fn release_in(
        &self,
        tx: &mut OpenTransaction<Self::Database>,
        key: &RecordKey,
        token: OwnerToken,
    ) -> Result<bool, StoreError> {
        let _ = (tx, key, token);
        Ok(false)
    }

    /// Whether an open transaction holds the database's only write lock (SQLite), so
    /// that no other writer can act on a record until it ends: then an attempt's lease
    /// is not renewed while its transaction is open (the renewal would wait for that
    /// lock), and [`TransactionalStore::complete_in`] fences by the owner token alone.
    /// `false` by default.
    fn fences_by_lock(&self) -> bool {
        false
    }

    /// A rollback failed: the connection may still count as inside a transaction, so it
    /// must not be handed out again. The default notes the error with
    /// [`TransactionalStore::fault`].
    fn rollback_failed(&self, error: sqlx::Error) -> StoreError {
        self.fault(error)
    }
}
