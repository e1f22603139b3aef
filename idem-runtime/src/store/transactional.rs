//! Stores that can write a record inside the business transaction (the transactional
//! mode, [`crate::transaction`]).

use std::time::Duration;

use async_trait::async_trait;
use sqlx::{Database, Transaction};
use tokio::sync::OwnedSemaphorePermit;

use super::{
    InFlight, NewRecord, OverBudget, OwnerToken, Record, RecordKey, Store, StoreError,
    StoredResponse, UnixMillis,
};

/// The right to begin one transaction, taken before the key is registered: with a store
/// that admits one writer at a time, waiting for it happens before anything is
/// registered, so that a client that gives up meanwhile leaves nothing behind, and the
/// wait is not charged to the attempt's lease.
#[derive(Debug, Default)]
pub struct Reservation {
    _writer: Option<OwnedSemaphorePermit>,
    /// The key's in-flight mark, taken before its record was read and found missing
    /// ([`TransactionalStore::mark`]): the key is registered without a read of its own.
    mark: Option<KeyMark>,
    /// The key's mark kept after its transaction rolled back, until the key's release is
    /// written and this reservation dropped.
    _kept: Option<KeyMark>,
}

impl Reservation {
    /// A reservation that holds `writer` (the one-writer permit of the store), or
    /// nothing for a store that admits many writers.
    pub fn new(writer: Option<OwnedSemaphorePermit>) -> Reservation {
        Reservation {
            _writer: writer,
            mark: None,
            _kept: None,
        }
    }

    /// The same reservation, holding `mark` until the key is registered: the key's
    /// mark in flight, taken before its record was read and found missing.
    pub(crate) fn marked(mut self, mark: KeyMark) -> Reservation {
        self.mark = Some(mark);
        self
    }

    /// The key's mark this reservation holds ([`Reservation::marked`]), taken out (SQLite's
    /// one commit: PostgreSQL's key has no mark in this process).
    #[cfg(feature = "sqlite")]
    pub(crate) fn take_mark(&mut self) -> Option<KeyMark> {
        self.mark.take()
    }

    /// The same reservation, keeping `mark` alive until it is dropped: the key's mark of
    /// a transaction that rolled back, held while its release is written.
    pub(crate) fn keeping(mut self, mark: KeyMark) -> Reservation {
        self._kept = Some(mark);
        self
    }
}

/// A key marked in flight in this process by [`TransactionalStore::mark`], until
/// dropped: a duplicate is answered from the mark at once, and a status lookup finds the
/// attempt in flight.
pub struct KeyMark(Box<dyn Send + Sync>);

impl KeyMark {
    /// A mark that holds `guard`, whose drop lets the key go.
    pub fn new(guard: Box<dyn Send + Sync>) -> KeyMark {
        KeyMark(guard)
    }

    /// What the mark holds, for the transaction to keep until it ends.
    pub fn into_guard(self) -> Box<dyn Send + Sync> {
        self.0
    }
}

impl std::fmt::Debug for KeyMark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyMark").finish_non_exhaustive()
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
    /// Whether the key's record was written inside this transaction
    /// ([`TransactionalStore::begin_registered`]): it commits with the result, or a
    /// rollback leaves nothing of it.
    pub(crate) registered: bool,
    /// What marks the key in flight in this process while the transaction is open
    /// (SQLite's in-flight keys), let go when it ends.
    pub(crate) claim: Option<Box<dyn Send + Sync>>,
    /// The key's record when registration wrote nothing yet
    /// ([`OpenTransaction::written_at_completion`]): the completion inserts it, in its
    /// final state, rather than updating a row written at registration.
    pub(crate) unwritten: Option<Record>,
    /// Whether the completion commits too ([`OpenTransaction::committed_by_completion`]).
    pub(crate) commits_at_completion: bool,
    /// Whether the completion has committed the attempt's writes: what is left open is a
    /// transaction of nothing, dropped rather than committed.
    pub(crate) committed: bool,
}

impl<DB: Database> OpenTransaction<DB> {
    /// A transaction begun on a connection of the store's pool, with the store's
    /// `marker` of it, holding `reservation` until it ends.
    pub fn new(tx: Transaction<'static, DB>, marker: i64, reservation: Reservation) -> Self {
        OpenTransaction {
            tx,
            marker,
            reservation,
            registered: false,
            claim: None,
            unwritten: None,
            commits_at_completion: false,
            committed: false,
        }
    }

    /// The same transaction, with the key's record written inside it, marked in flight
    /// by `claim` (if the store keeps such marks) until it ends.
    pub fn registered(mut self, claim: Option<Box<dyn Send + Sync>>) -> Self {
        self.registered = true;
        self.claim = claim;
        self
    }

    /// The same transaction, registered, with the key's `record` not written yet: the
    /// key is marked in flight (PostgreSQL's advisory lock) and had no record, so the
    /// completion writes `record` once, completed, in one `INSERT` — no row written at
    /// registration, no second version of it at completion.
    pub fn written_at_completion(mut self, record: Record) -> Self {
        self.registered = true;
        self.unwritten = Some(record);
        self
    }

    /// The same transaction, committed by its completion's own call (SQLite's
    /// [`OpenTransaction::written_at_completion`]): a completion that does not answer in
    /// time may have committed, and its outcome is unknown, not rolled back.
    pub fn committed_by_completion(mut self) -> Self {
        self.commits_at_completion = true;
        self
    }
}

/// What [`TransactionalStore::begin_registered`] came to.
pub enum Registered<DB: Database> {
    /// The key is registered inside the open transaction: the record as written, not
    /// committed (or, on PostgreSQL for a key that had none, as the completion will
    /// write it: [`OpenTransaction::written_at_completion`]).
    Started(Record, OpenTransaction<DB>),
    /// The key has a committed record that this attempt may not take: answer from it.
    /// Nothing is open; the reservation is given back.
    Exists(Record, Reservation),
    /// Another attempt holds the key in a transaction that has not ended.
    InFlight(InFlight, Reservation),
    /// The key is new to the client, and the client is at its budget.
    OverBudget(OverBudget, Reservation),
}

impl<DB: Database> std::fmt::Debug for Registered<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Registered::Started(record, _) => f.debug_tuple("Started").field(record).finish(),
            Registered::Exists(record, _) => f.debug_tuple("Exists").field(record).finish(),
            Registered::InFlight(in_flight, _) => {
                f.debug_tuple("InFlight").field(in_flight).finish()
            }
            Registered::OverBudget(over, _) => f.debug_tuple("OverBudget").field(over).finish(),
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

    /// Begins a transaction and registers `key` inside it, one commit for the key and the
    /// business writes: `new` is written as [`RecordStore::begin`](super::RecordStore::begin)
    /// would write it, but not committed, and the key is marked in flight for as long as
    /// the transaction is open, so that a duplicate is answered at once rather than
    /// waiting for the uncommitted row, and so that nothing of the attempt outlives a
    /// crash: its session ends, the transaction rolls back, the mark goes with it.
    ///
    /// `PostgresStore` marks the key with a transaction-scoped advisory lock on a 64-bit
    /// hash of it (`pg_try_advisory_xact_lock`), and publishes the attempt's operation id
    /// and end in the session's `application_name` for the transaction, which
    /// [`TransactionalStore::in_flight`] reads back; `SqliteStore` (one process) keeps a
    /// map of its keys in flight, where a key whose mark comes with `reservation`
    /// ([`TransactionalStore::mark`]) is marked already.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when no connection can be had, the transaction cannot
    /// begin, or a statement fails (nothing is then left open).
    async fn begin_registered(
        &self,
        reservation: Reservation,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
        within: Duration,
    ) -> Result<Registered<Self::Database>, StoreError>;

    /// Marks `key` in flight for `attempt` in this process, before its record is read,
    /// for a store that keeps its marks in the process (`SqliteStore`, whose one writer
    /// is shared by one process): `Some(Ok(mark))`, held until dropped; `Some(Err(holder))`
    /// when the attempt `holder` marked it already; `None` for a store that marks keys
    /// only inside a transaction (the default: `PostgresStore`'s advisory lock).
    ///
    /// A mark taken before the read makes the read's answer hold until the mark is
    /// dropped: no other attempt of this process can register the key meanwhile, and
    /// one that registered it before has committed its record (it keeps its mark until
    /// its transaction ends). A key read and found missing under a mark is registered
    /// with the mark in its [`Reservation`], without a read or a write of its own before
    /// the handler runs ([`TransactionalStore::begin_registered`] takes it from there).
    fn mark(&self, key: &RecordKey, attempt: InFlight) -> Option<Result<KeyMark, InFlight>> {
        let _ = (key, attempt);
        None
    }

    /// The attempt that holds `key` in a transaction begun by
    /// [`TransactionalStore::begin_registered`] and not ended yet, if one does.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the store cannot be asked.
    async fn in_flight(&self, key: &RecordKey) -> Result<Option<InFlight>, StoreError>;

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

    /// A completion that commits too ([`OpenTransaction::committed_by_completion`]) was
    /// given up while it ran (the attempt's time ended): the driver may have stopped
    /// between its statements, with the connection outside the transaction it still
    /// counts as open, so no connection of that time may be handed out again. Nothing by
    /// default.
    fn completion_abandoned(&self) {}
}

#[async_trait]
impl<T: TransactionalStore> super::InFlightProbe for T {
    async fn in_flight(&self, key: &RecordKey) -> Result<Option<InFlight>, StoreError> {
        TransactionalStore::in_flight(self, key).await
    }
}
