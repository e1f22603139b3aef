//! The transactional mode: the handler's business writes and the key's final state
//! commit in one transaction.
//!
//! Where the business data and idem's records share a database (SQLite, PostgreSQL), a
//! contracted handler takes the transaction its writes use, [`Tx`], and idem writes the
//! key's final state in that same transaction and commits it: the commit is the moment
//! the operation completes. An effect without its record, or a record without its effect,
//! cannot happen.
//!
//! Written by hand, without the macro:
//!
//! ```
//! use axum::{Json, http::StatusCode};
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! struct CreateOrder { customer_id: String, amount_minor: i64 }
//!
//! # #[derive(Debug)] struct ApiError;
//! # impl From<sqlx::Error> for ApiError { fn from(_: sqlx::Error) -> Self { ApiError } }
//! # impl axum::response::IntoResponse for ApiError {
//! #     fn into_response(self) -> axum::response::Response { StatusCode::INTERNAL_SERVER_ERROR.into_response() }
//! # }
//! # use idem_runtime::{enforce::{Contracted, Enforced}, recovery::{Recover, Recoverer}};
//! # pub struct CreateOrderOp;
//! # impl Contracted for CreateOrderOp { const CONTRACT: &'static idem_contract::Contract = &idem_contract::Contract::PLACEHOLDER; }
//! # impl<S> Recover<S> for CreateOrderOp { fn recoverer(_: &S) -> Recoverer { Recoverer::manual() } }
//! // With the macro: `#[idem::contract(..)] async fn create_order(tx: idem::SqliteTx, Json(order): Json<CreateOrder>)`.
//! async fn create_order(
//!     tx: idem_runtime::transaction::SqliteTx,
//!     enforced: Enforced<Json<CreateOrder>, CreateOrderOp>,
//! ) -> axum::response::Response {
//!     let (Json(order), guard) = enforced.into_parts();
//!     let operation_id = guard.operation_id().to_string();
//!     guard
//!         .run(async move {
//!             let mut conn = tx.conn().await?;
//!             sqlx::query("INSERT INTO orders (operation_id, customer_id, amount_minor) VALUES (?, ?, ?)")
//!                 .bind(&operation_id)
//!                 .bind(&order.customer_id)
//!                 .bind(order.amount_minor)
//!                 .execute(&mut *conn)
//!                 .await?;
//!             // No commit here: idem commits, with the key's final state.
//!             Ok::<_, ApiError>(StatusCode::CREATED)
//!         })
//!         .await
//! }
//! # let _: axum::Router = axum::Router::new().route("/orders", axum::routing::post(create_order));
//! ```
//!
//! The guide (what each answer does to the transaction, the rules for the handler, an
//! example with `#[idem::contract]`) is the `transaction` module of the `idem` crate,
//! `docs/transaction.md` in the repository.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use sqlx::Database;
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};
use tokio::time::Instant;

use crate::Idem;
use crate::answer;
use crate::fault;
use crate::operation::{HandlerMode, ModeOf};
use crate::store::{
    BeginInTx, InFlight, KeyMark, NewRecord, OpenTransaction, OwnerToken, RecordKey, Registered,
    Reservation, StoreError, StoredResponse, TransactionalStore, UnixMillis,
};

/// The transaction of a contracted handler's attempt: the business writes go through
/// [`Tx::conn`], and idem commits them together with the key's final state (see the
/// [module docs](self)).
///
/// An axum extractor, taken anywhere before the body extractor:
/// `tx: idem::SqliteTx` or `tx: idem::PgTx`. It is cheap to clone; every clone is the
/// same transaction. The transaction begins as the key is registered, and the key's
/// record is written in it, just before the handler runs: the record, the handler's
/// writes and the result commit once, together. Under a step journal (`recovery =
/// resume`) the record is committed first and the transaction begins after it (on
/// SQLite at the handler's first [`Tx::conn`], so that the steps before it are recorded
/// while the one write lock is free). It ends when the handler's answer is settled;
/// after that [`Tx::conn`] fails.
///
/// Rejections: 500 `not-configured` when the router has no idem layer, or its handle
/// was not made with `Idem::transactional` over a store of this database.
pub struct Tx<DB: Database> {
    cell: Arc<Cell<DB>>,
}

/// The transaction of a handler whose records live in SQLite ([`crate::SqliteStore`]).
#[cfg(feature = "sqlite")]
pub type SqliteTx = Tx<sqlx::Sqlite>;

/// The transaction of a handler whose records live in PostgreSQL
/// ([`crate::store::PostgresStore`]).
#[cfg(feature = "postgres")]
pub type PgTx = Tx<sqlx::Postgres>;

impl<DB: Database> Clone for Tx<DB> {
    fn clone(&self) -> Self {
        Tx {
            cell: Arc::clone(&self.cell),
        }
    }
}

impl<DB: Database> fmt::Debug for Tx<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tx").finish_non_exhaustive()
    }
}

struct Cell<DB: Database> {
    store: Arc<dyn TransactionalStore<Database = DB>>,
    state: Mutex<State<DB>>,
}

/// What a deferred transaction calls once it has begun.
pub(crate) type OnOpen = Box<dyn FnOnce() + Send + Sync>;

enum State<DB: Database> {
    /// The key is not registered yet (or the handler is not contracted).
    NotBegun,
    /// The right to begin is held; the key is being registered.
    Reserved(Reservation),
    /// Held, and to begin at the handler's first [`Tx::conn`] (or at the settlement),
    /// for an attempt whose time ends at `until` ([`TxControl::defer`]).
    Deferred {
        reservation: Reservation,
        until: Instant,
        on_open: OnOpen,
    },
    /// The attempt's transaction.
    Open(OpenTransaction<DB>),
    /// Committed or rolled back.
    Ended,
}

impl<DB: Database> State<DB> {
    /// The reservation held (none when not [`State::Reserved`]), leaving the state
    /// [`State::Ended`] until the caller sets the next one.
    fn take_reservation(&mut self) -> Reservation {
        match std::mem::replace(self, State::Ended) {
            State::Reserved(reservation) => reservation,
            _ => Reservation::default(),
        }
    }
}

impl<DB: Database> Tx<DB> {
    /// The connection of the attempt's transaction, for the handler's business reads and
    /// writes: `sqlx::query(..).execute(&mut *tx.conn().await?)`. Holding it keeps other
    /// clones of this `Tx` waiting; idem settles the attempt only once the handler has let
    /// go of it (or its time is over). Read through it too: each running attempt holds
    /// one connection of the store's pool, so a handler that also reads through the pool
    /// can wait for a connection that only its own answer frees.
    ///
    /// # Errors
    ///
    /// An `sqlx::Error::Io` of kind `NotConnected` when there is no transaction: the
    /// handler is not contracted, or its attempt has ended (the answer was settled, or
    /// the attempt ran out of its time). Nothing is written then.
    pub async fn conn(&self) -> Result<MappedMutexGuard<'_, DB::Connection>, sqlx::Error> {
        let mut state = self.cell.state.lock().await;
        if let Err(error) = self.cell.open_deferred(&mut state).await {
            let why = format!("idem: the attempt's transaction could not begin: {error}");
            return Err(sqlx::Error::Io(std::io::Error::other(why)));
        }
        MutexGuard::try_map(state, |state| match state {
            State::Open(open) => Some(&mut *open.tx),
            State::NotBegun | State::Reserved(_) | State::Deferred { .. } | State::Ended => None,
        })
        .map_err(|state| {
            let why = match &*state {
                State::NotBegun | State::Reserved(_) | State::Deferred { .. } => {
                    "idem: this transaction has not begun: `Tx` is only for handlers under `#[idem::contract]`"
                }
                _ => {
                    "idem: this attempt's transaction has ended (its answer was settled, or it ran out of time); nothing more can be written in it"
                }
            };
            sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::NotConnected, why))
        })
    }
}

impl<DB: Database> ModeOf<Tx<DB>> {
    /// The mode of a handler that takes `Tx<DB>`: transactional over `DB` (found before
    /// the fallback [`PlainArgument::MODE`](crate::operation::PlainArgument) of other
    /// arguments).
    pub const MODE: HandlerMode = HandlerMode::Transactional { database: DB::NAME };
}

impl<S, DB> FromRequestParts<S> for Tx<DB>
where
    DB: Database,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Response> {
        if let Some(tx) = parts.extensions.get::<Tx<DB>>() {
            return Ok(tx.clone());
        }
        let Some(idem) = parts.extensions.get::<Idem>() else {
            return Err(answer::not_configured(parts).into_response());
        };
        let Some(store) = idem.transactional_store::<DB>() else {
            return Err(answer::no_transactional_store(parts, DB::NAME).into_response());
        };
        let tx = Tx {
            cell: Arc::new(Cell {
                store,
                state: Mutex::new(State::NotBegun),
            }),
        };
        parts.extensions.insert(tx.clone());
        parts.extensions.insert(AttemptTx(tx.cell.clone()));
        Ok(tx)
    }
}

/// The transaction of one attempt, as the enforcement drives it: [`Tx`]'s extraction
/// puts it in the request's extensions, with its database erased (the transactional arm
/// of [`crate::mode::Mode`]).
#[derive(Clone)]
pub(crate) struct AttemptTx(Arc<dyn TxControl>);

impl AttemptTx {
    /// The transaction a handler took, from the request's extensions.
    pub(crate) fn find(extensions: &http::Extensions) -> Option<AttemptTx> {
        extensions.get::<AttemptTx>().cloned()
    }

    /// Takes the right to begin if it is free now; whether it was.
    pub(crate) async fn try_reserve(&self) -> bool {
        self.0.try_reserve().await
    }

    /// Takes the right to begin, waiting for it (a store with one writer).
    pub(crate) async fn reserve(&self) -> Result<(), StoreError> {
        self.0.reserve().await
    }

    /// Marks `key` in flight for `attempt` in this process ([`TransactionalStore::mark`]),
    /// if the store keeps such marks.
    pub(crate) fn mark(
        &self,
        key: &RecordKey,
        attempt: InFlight,
    ) -> Option<Result<KeyMark, InFlight>> {
        self.0.mark(key, attempt)
    }

    /// Takes the right to begin, waiting for it, with `mark`: the key's mark, under which
    /// its record was read and found missing ([`Reservation::marked`]).
    pub(crate) async fn reserve_marked(&self, mark: KeyMark) -> Result<(), StoreError> {
        self.0.reserve_marked(mark).await
    }

    /// Begins the transaction (once the key is registered), for an attempt whose time
    /// ends at `until`.
    pub(crate) async fn begin(&self, until: Instant) -> Result<(), StoreError> {
        self.0.begin(until).await
    }

    /// Begins the transaction with the key registered inside it ([`TxControl::register`]).
    pub(crate) async fn register(
        &self,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
        until: Instant,
    ) -> Result<BeginInTx, StoreError> {
        self.0.register(key, new, now, until).await
    }

    /// The attempt holding `key` in a registered transaction not ended yet, if one does.
    pub(crate) async fn in_flight(&self, key: &RecordKey) -> Result<Option<InFlight>, StoreError> {
        self.0.in_flight(key).await
    }

    /// Whether the right to begin is held ([`AttemptTx::reserve`] or
    /// [`AttemptTx::try_reserve`] took it).
    pub(crate) async fn is_reserved(&self) -> bool {
        self.0.is_reserved().await
    }

    /// Defers the beginning to the handler's first `Tx::conn` ([`TxControl::defer`]).
    pub(crate) async fn defer(&self, until: Instant, on_open: OnOpen) {
        self.0.defer(until, on_open).await;
    }

    /// Whether the open transaction holds the database's only write lock (SQLite).
    pub(crate) fn fences_by_lock(&self) -> bool {
        self.0.fences_by_lock()
    }

    /// The transaction, to commit or roll back.
    pub(crate) fn control(&self) -> Arc<dyn TxControl> {
        Arc::clone(&self.0)
    }
}

/// Why a transaction could not be committed with the record.
pub(crate) enum CommitError {
    /// Nothing was committed: the write of the record failed (the lease was lost, the
    /// result is too large, the transaction had ended, the store failed), or the handler
    /// still held the connection. The right to write is given back, to keep until the
    /// key's state is settled.
    RolledBack(StoreError, Reservation),
    /// The commit itself failed: nothing was committed, unless the commit's answer was
    /// lost on the way back.
    Commit(StoreError),
}

/// What [`TxControl::roll_back`] did.
pub(crate) enum RolledBack {
    /// Rolled back, and the key released with it (committed).
    Released,
    /// Rolled back; the key is for the caller to release, with the right to write that
    /// the transaction held (with SQLite's one writer, another attempt would otherwise
    /// take the lock first).
    Rolled(Reservation),
    /// Rolled back, and the release refused: the owner token no longer owns the record.
    LeaseLost,
    /// The rollback is still waiting (for a statement of the handler that is running)
    /// when the time is over: it ends on its own, and nothing was committed.
    Pending,
}

/// The transaction, as the enforcement drives it.
#[async_trait]
pub(crate) trait TxControl: Send + Sync {
    /// Takes the right to begin (before the key is registered; a store with one writer
    /// makes this wait).
    async fn reserve(&self) -> Result<(), StoreError>;

    /// Takes the right to begin if it is free now; whether it was.
    async fn try_reserve(&self) -> bool;

    /// [`TransactionalStore::mark`] of the store.
    fn mark(&self, key: &RecordKey, attempt: InFlight) -> Option<Result<KeyMark, InFlight>>;

    /// [`TxControl::reserve`], the reservation holding `mark` ([`Reservation::marked`]).
    async fn reserve_marked(&self, mark: KeyMark) -> Result<(), StoreError>;

    /// [`TransactionalStore::fences_by_lock`] of the store.
    fn fences_by_lock(&self) -> bool;

    /// Begins the transaction (once the key is registered), for an attempt whose time
    /// ends at `until`: the store bounds it on its server by the time left
    /// ([`TransactionalStore::begin_transaction`]).
    async fn begin(&self, until: Instant) -> Result<(), StoreError>;

    /// Begins the transaction with `key` registered inside it as `new`
    /// ([`TransactionalStore::begin_registered`]), for an attempt whose time ends at
    /// `until`; with the right to begin taken before, which is kept when the key is not
    /// registered.
    async fn register(
        &self,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
        until: Instant,
    ) -> Result<BeginInTx, StoreError>;

    /// [`TransactionalStore::in_flight`] of the store.
    async fn in_flight(&self, key: &RecordKey) -> Result<Option<InFlight>, StoreError>;

    /// Whether the right to begin is held.
    async fn is_reserved(&self) -> bool;

    /// Defers the beginning to the handler's first [`Tx::conn`] (or to the settlement),
    /// keeping the right to begin meanwhile; `on_open` is called once it has begun. For
    /// a store whose transaction holds the only write lock (SQLite) under a step
    /// journal: the journal's steps before the first business write are recorded while
    /// the lock is free.
    async fn defer(&self, until: Instant, on_open: OnOpen);

    /// Writes `response` as the result of `key` in the transaction, fenced by `token`,
    /// and commits, all by `until` (the attempt's deadline), so that a statement blocked
    /// or a server gone silent does not hold the attempt past it: waits for the handler's
    /// hold on the connection, the write of the record and the commit until then. A write
    /// cut off is rolled back in the background (nothing was committed); a commit cut off
    /// is [`CommitError::Commit`] with an outcome unknown.
    async fn commit_completed(
        self: Arc<Self>,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        until: Instant,
        now: UnixMillis,
    ) -> Result<(), CommitError>;

    /// Rolls the transaction back, waiting for the handler's hold on the connection and
    /// for the rollback itself until `until`; past that, the rollback goes on by itself
    /// (as soon as the handler lets go, or a statement still running ends), and nothing
    /// can be written in the transaction meanwhile. Since idem never commits it, it can
    /// take no effect: the key may be released at once. With a store whose transaction
    /// fences by its lock (SQLite), what the handler wrote is undone and the key released
    /// in that same transaction, which then commits.
    async fn roll_back(
        self: Arc<Self>,
        key: &RecordKey,
        token: OwnerToken,
        until: Instant,
    ) -> RolledBack;
}

impl<DB: Database> Cell<DB> {
    /// The open transaction, taken out of the cell (which is left ended), or `None` when
    /// there is none or the handler's hold outlasts `until` (then it is rolled back once
    /// released).
    async fn take(self: &Arc<Self>, until: Instant) -> Option<OpenTransaction<DB>> {
        match tokio::time::timeout_at(until, self.state.lock()).await {
            Ok(mut state) => {
                if let Err(error) = self.open_deferred(&mut state).await {
                    tracing::warn!(error = %error, "idem: the attempt's deferred transaction could not begin");
                }
                match std::mem::replace(&mut *state, State::Ended) {
                    State::Open(open) => Some(open),
                    State::NotBegun
                    | State::Reserved(_)
                    | State::Deferred { .. }
                    | State::Ended => None,
                }
            }
            Err(_elapsed) => {
                tracing::error!(
                    "idem: the handler still holds its transaction's connection after its answer (a task it left behind?); the transaction is rolled back once it lets go"
                );
                let cell = Arc::clone(self);
                tokio::spawn(async move {
                    let mut state = cell.state.lock().await;
                    if let State::Open(open) = std::mem::replace(&mut *state, State::Ended) {
                        cell.rollback(open).await;
                    }
                });
                None
            }
        }
    }
}

impl<DB: Database> Cell<DB> {
    /// Begins a deferred transaction (`state`, under the cell's lock), and calls its
    /// `on_open`; any other state is left as it is.
    async fn open_deferred(&self, state: &mut State<DB>) -> Result<(), StoreError> {
        if !matches!(state, State::Deferred { .. }) {
            return Ok(());
        }
        let State::Deferred {
            reservation,
            until,
            on_open,
        } = std::mem::replace(state, State::Ended)
        else {
            return Ok(());
        };
        let within = until.saturating_duration_since(Instant::now());
        *state = State::Open(self.store.begin_transaction(reservation, within).await?);
        on_open();
        Ok(())
    }

    /// Writes `response` as the result of `key` in `open`
    /// ([`TransactionalStore::complete_in`]); a result larger than the store keeps is
    /// written as [`StoredResponse::body_not_kept`] says.
    async fn complete_in(
        &self,
        open: &mut OpenTransaction<DB>,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        match self
            .store
            .complete_in(open, key, token, response, now)
            .await
        {
            // Refused before anything was written: what is kept of it fits.
            Err(StoreError::TooLarge { limit, .. }) => {
                let kept = response.body_not_kept(limit);
                self.store.complete_in(open, key, token, &kept, now).await
            }
            other => other,
        }
    }

    /// [`Cell::rollback`], waited for until `until`: past it, the transaction rolls back
    /// in the background, and its reservation is let go.
    async fn rollback_by(&self, open: OpenTransaction<DB>, until: Instant) -> Reservation {
        tokio::time::timeout_at(until, self.rollback(open))
            .await
            .unwrap_or_default()
    }

    /// Rolls `open` back, and gives back its reservation, holding the key's mark in this
    /// process (SQLite's) if the transaction held one: the caller writes the key's release
    /// before it lets both go, so that no duplicate registers the key in between as if
    /// it had no record. A rollback that fails leaves the connection suspect, and the
    /// store replaces it.
    async fn rollback(&self, open: OpenTransaction<DB>) -> Reservation {
        let OpenTransaction {
            tx,
            reservation,
            claim,
            ..
        } = open;
        if let Err(error) = tx.rollback().await {
            let error = self.store.rollback_failed(error);
            tracing::warn!(error = %error, "idem: rolling back the attempt's transaction failed");
        }
        match claim {
            Some(claim) => reservation.keeping(KeyMark::new(claim)),
            None => reservation,
        }
    }
}

#[async_trait]
impl<DB: Database> TxControl for Cell<DB> {
    async fn reserve(&self) -> Result<(), StoreError> {
        let reservation = self.store.reserve().await?;
        *self.state.lock().await = State::Reserved(reservation);
        Ok(())
    }

    fn fences_by_lock(&self) -> bool {
        self.store.fences_by_lock()
    }

    fn mark(&self, key: &RecordKey, attempt: InFlight) -> Option<Result<KeyMark, InFlight>> {
        self.store.mark(key, attempt)
    }

    async fn reserve_marked(&self, mark: KeyMark) -> Result<(), StoreError> {
        let reservation = self.store.reserve().await?.marked(mark);
        *self.state.lock().await = State::Reserved(reservation);
        Ok(())
    }

    async fn try_reserve(&self) -> bool {
        match self.store.try_reserve() {
            Some(reservation) => {
                *self.state.lock().await = State::Reserved(reservation);
                true
            }
            None => false,
        }
    }

    async fn begin(&self, until: Instant) -> Result<(), StoreError> {
        let mut state = self.state.lock().await;
        let reservation = state.take_reservation();
        let within = until.saturating_duration_since(Instant::now());
        *state = State::Open(self.store.begin_transaction(reservation, within).await?);
        Ok(())
    }

    async fn register(
        &self,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
        until: Instant,
    ) -> Result<BeginInTx, StoreError> {
        let mut state = self.state.lock().await;
        let reservation = state.take_reservation();
        let within = until.saturating_duration_since(Instant::now());
        let registered = self
            .store
            .begin_registered(reservation, key, new, now, within)
            .await;
        let (next, answer) = match registered? {
            Registered::Started(record, open) => (State::Open(open), BeginInTx::Started(record)),
            Registered::Exists(record, kept) => (State::Reserved(kept), BeginInTx::Exists(record)),
            Registered::InFlight(holder, kept) => {
                (State::Reserved(kept), BeginInTx::InFlight(holder))
            }
            Registered::OverBudget(over, kept) => {
                (State::Reserved(kept), BeginInTx::OverBudget(over))
            }
        };
        *state = next;
        Ok(answer)
    }

    async fn in_flight(&self, key: &RecordKey) -> Result<Option<InFlight>, StoreError> {
        self.store.in_flight(key).await
    }

    async fn is_reserved(&self) -> bool {
        matches!(*self.state.lock().await, State::Reserved(_))
    }

    async fn defer(&self, until: Instant, on_open: OnOpen) {
        let mut state = self.state.lock().await;
        let reservation = state.take_reservation();
        *state = State::Deferred {
            reservation,
            until,
            on_open,
        };
    }

    async fn commit_completed(
        self: Arc<Self>,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        until: Instant,
        now: UnixMillis,
    ) -> Result<(), CommitError> {
        let Some(mut open) = self.take(until).await else {
            return Err(CommitError::RolledBack(
                StoreError::TransactionEnded(
                    "the handler kept its connection past its answer (a task it left behind?)"
                        .into(),
                ),
                Reservation::default(),
            ));
        };
        fault::point("before_commit");
        let completed = self.complete_in(&mut open, key, token, response, now);
        match tokio::time::timeout_at(until, completed).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                let writer = self.rollback_by(open, until).await;
                return Err(CommitError::RolledBack(error, writer));
            }
            // A completion that commits too may have committed meanwhile.
            Err(_elapsed) if open.commits_at_completion => {
                self.store.completion_abandoned();
                return Err(CommitError::Commit(StoreError::outcome_unknown(
                    "the database did not answer the write of the record and its commit within the attempt's time",
                )));
            }
            // Dropped, the transaction rolls back in the background (sqlx's
            // `Transaction`), once the connection hears from the server again.
            Err(_elapsed) => {
                return Err(CommitError::RolledBack(
                    StoreError::unavailable(
                        "the database did not answer the write of the record within the attempt's time",
                    ),
                    Reservation::default(),
                ));
            }
        }
        if open.committed {
            // The completion committed: what is left open is a transaction of nothing,
            // which sqlx rolls back in the background as it is dropped.
            drop(open);
        } else {
            match tokio::time::timeout_at(until, open.tx.commit()).await {
                Ok(Ok(())) => {}
                // sqlx counts a transaction whose commit failed as still open.
                Ok(Err(error)) => {
                    return Err(CommitError::Commit(self.store.rollback_failed(error)));
                }
                Err(_elapsed) => {
                    return Err(CommitError::Commit(StoreError::outcome_unknown(
                        "the database did not answer the commit within the attempt's time",
                    )));
                }
            }
        }
        fault::point("after_commit");
        Ok(())
    }

    async fn roll_back(
        self: Arc<Self>,
        key: &RecordKey,
        token: OwnerToken,
        until: Instant,
    ) -> RolledBack {
        let Some(mut open) = self.take(until).await else {
            return RolledBack::Rolled(Reservation::default());
        };
        if open.registered {
            // The record was written in the transaction: rolled back, nothing of the
            // attempt is left, and its mark on the key goes with the transaction. The
            // caller records the release.
            return match tokio::time::timeout_at(until, self.rollback(open)).await {
                Ok(writer) => RolledBack::Rolled(writer),
                Err(_elapsed) => RolledBack::Pending,
            };
        }
        // A rollback queued behind a statement that is still running ends when that
        // statement does: wait for it at most until `until`.
        let cell = Arc::clone(&self);
        let (key, token) = (key.clone(), token);
        let rollback = tokio::spawn(async move {
            match cell.store.release_in(&mut open, &key, token).await {
                Ok(true) => match open.tx.commit().await {
                    Ok(()) => RolledBack::Released,
                    Err(error) => {
                        let error = cell.store.rollback_failed(error);
                        tracing::warn!(error = %error, "idem: committing the release failed");
                        RolledBack::Rolled(Reservation::default())
                    }
                },
                Ok(false) | Err(StoreError::TransactionEnded(_) | StoreError::Unavailable(_)) => {
                    RolledBack::Rolled(cell.rollback(open).await)
                }
                Err(_) => {
                    let _ = cell.rollback(open).await;
                    RolledBack::LeaseLost
                }
            }
        });
        match tokio::time::timeout_at(until, rollback).await {
            Ok(Ok(rolled)) => rolled,
            Ok(Err(_)) => RolledBack::Rolled(Reservation::default()),
            Err(_elapsed) => {
                tracing::warn!(
                    "idem: the rollback waits for a statement of the handler that is still running"
                );
                RolledBack::Pending
            }
        }
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::OperationId;
    use crate::store::{Lease, SqliteStore, unix_now};

    /// SQLite's one commit, rolled back: the key's mark in this process outlives the
    /// transaction, held with the right to write that the rollback gives back, so that a
    /// duplicate finds the key in flight until the caller has written its release (and
    /// is not registered in between as if the key had no record).
    #[tokio::test]
    async fn a_rolled_back_attempt_keeps_its_mark_until_its_release_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SqliteStore::open(dir.path().join("t.db")).await.unwrap());
        let cell = Cell::<sqlx::Sqlite> {
            store: store.clone(),
            state: Mutex::new(State::NotBegun),
        };
        let key = RecordKey::new("op", "client", "k");
        let now = unix_now();
        let new = NewRecord {
            operation_id: OperationId::new(),
            fingerprint: "sha256:f".into(),
            lease: Lease {
                token: OwnerToken::random(),
                until: now + 60_000,
            },
            expires_at: now + 3_600_000,
            transactional: true,
            holds_until: now + 60_000,
            budget: None,
        };
        let attempt = InFlight {
            operation_id: new.operation_id,
            attempt: 1,
            until: new.holds_until,
        };
        let mark = cell
            .mark(&key, attempt)
            .expect("SQLite marks keys")
            .unwrap();
        cell.reserve_marked(mark).await.unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        let begun = cell.register(&key, &new, now, until).await.unwrap();
        assert!(matches!(begun, BeginInTx::Started(_)));
        let RolledBack::Rolled(writer) =
            Arc::new(cell).roll_back(&key, new.lease.token, until).await
        else {
            panic!("rolled back, the key left for the caller to release");
        };
        assert!(
            store.in_flight(&key).await.unwrap().is_some(),
            "the mark outlives the transaction"
        );
        drop(writer);
        assert!(store.in_flight(&key).await.unwrap().is_none());
    }
}
