//! Stores that can write a record inside the business transaction (the transactional
//! mode, [`crate::transaction`]).

use async_trait::async_trait;
use sqlx::{Database, Transaction};
use tokio::sync::OwnedSemaphorePermit;

use super::{OwnerToken, RecordKey, Store, StoreError, StoredResponse, UnixMillis};

/// A connection of a store's pool with a transaction begun on it, as
/// [`TransactionalStore::begin_transaction`] gives it out.
///
/// The runtime commits or rolls it back; dropped while still open, it is rolled back
/// (sqlx's `Transaction`).
pub struct OpenTransaction<DB: Database> {
    pub(crate) tx: Transaction<'static, DB>,
    /// Held for the whole transaction by stores that admit one writer at a time.
    _writer: Option<OwnedSemaphorePermit>,
}

impl<DB: Database> OpenTransaction<DB> {
    /// A transaction begun on a connection of the store's pool, holding `writer` until
    /// it ends.
    pub fn new(tx: Transaction<'static, DB>, writer: Option<OwnedSemaphorePermit>) -> Self {
        OpenTransaction {
            tx,
            _writer: writer,
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

    /// A connection of the store's pool with a transaction begun on it, for one attempt.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when no connection can be had or the transaction
    /// cannot begin.
    async fn begin_transaction(&self) -> Result<OpenTransaction<Self::Database>, StoreError>;

    /// Writes `response` as the operation's result inside the transaction open on `conn`,
    /// if `token` owns a lease that is live at `now` (the same compare-and-set as
    /// [`Store::complete`]). Nothing is committed here.
    ///
    /// # Errors
    ///
    /// [`StoreError::LeaseLost`] when `token` does not own a live lease: the caller must
    /// roll the whole transaction back. [`StoreError::TooLarge`], or
    /// [`StoreError::Unavailable`].
    async fn complete_in(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError>;

    /// The [`StoreError`] for a driver error on one of this store's connections (such as
    /// a failed commit), after noting any fault it shows so that broken connections are
    /// replaced rather than handed out again.
    fn fault(&self, error: sqlx::Error) -> StoreError;
}
