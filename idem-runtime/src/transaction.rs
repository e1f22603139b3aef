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
//! # use idem_runtime::{Contracted, Recover, Recoverer, enforce::Enforced};
//! # pub struct CreateOrderOp;
//! # impl Contracted for CreateOrderOp { const CONTRACT: &'static idem_contract::Contract = &idem_runtime::__private::PLACEHOLDER_CONTRACT; }
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
use crate::problem::{Problem, ProblemType};
use crate::store::{
    OpenTransaction, OwnerToken, RecordKey, StoreError, StoredResponse, TransactionalStore,
    unix_now,
};
use crate::{OperationId, fault};

/// The transaction of a contracted handler's attempt: the business writes go through
/// [`Tx::conn`], and idem commits them together with the key's final state (see the
/// [module docs](self)).
///
/// An axum extractor, taken anywhere before the body extractor:
/// `tx: idem::SqliteTx` or `tx: idem::PgTx`. It is cheap to clone; every clone is the
/// same transaction. The transaction begins once the key is registered, just before the
/// handler runs, and ends when the handler's answer is settled; after that
/// [`Tx::conn`] fails.
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

enum State<DB: Database> {
    /// The key is not registered yet (or the handler is not contracted).
    NotBegun,
    /// The attempt's transaction.
    Open(OpenTransaction<DB>),
    /// Committed or rolled back.
    Ended,
}

impl<DB: Database> Tx<DB> {
    /// The connection of the attempt's transaction, for the handler's business reads and
    /// writes: `sqlx::query(..).execute(&mut *tx.conn().await?)`. Holding it keeps other
    /// clones of this `Tx` waiting.
    ///
    /// # Errors
    ///
    /// An `sqlx::Error::Io` of kind `NotConnected` when there is no transaction: the
    /// handler is not contracted, or its attempt has ended (the answer was settled, or
    /// the attempt ran out of its time). Nothing is written then.
    pub async fn conn(&self) -> Result<MappedMutexGuard<'_, DB::Connection>, sqlx::Error> {
        let state = self.cell.state.lock().await;
        MutexGuard::try_map(state, |state| match state {
            State::Open(open) => Some(&mut *open.tx),
            State::NotBegun | State::Ended => None,
        })
        .map_err(|state| {
            let why = match &*state {
                State::NotBegun => {
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
            return Err(answer::not_configured());
        };
        let Some(store) = idem.transactional_store::<DB>() else {
            return Err(Problem::new(
                ProblemType::NotConfigured,
                format!(
                    "the handler takes the transaction `idem::Tx<{}>`, but the idem handle has no transactional store of that database: build it with `Idem::transactional(store, ..)` over a store of the same database",
                    DB::NAME
                ),
            )
            .with_operation_id(OperationId::new())
            .into_response());
        };
        let tx = Tx {
            cell: Arc::new(Cell {
                store,
                state: Mutex::new(State::NotBegun),
            }),
        };
        parts.extensions.insert(tx.clone());
        let control: Arc<dyn TxControl> = tx.cell.clone();
        parts.extensions.insert(TxSlot(control));
        Ok(tx)
    }
}

/// How the enforcement finds the transaction of a request: [`Tx`]'s extraction puts it
/// in the request's extensions, with its database erased.
#[derive(Clone)]
pub(crate) struct TxSlot(pub(crate) Arc<dyn TxControl>);

/// Why a transaction could not be committed with the record.
pub(crate) enum CommitError {
    /// Nothing was committed: the write of the record failed (the lease was lost, the
    /// result is too large, the store failed), or the handler still held the
    /// connection.
    RolledBack(StoreError),
    /// The commit itself failed: nothing was committed, unless the commit's answer was
    /// lost on the way back.
    Commit(StoreError),
}

/// The transaction, as the enforcement drives it.
#[async_trait]
pub(crate) trait TxControl: Send + Sync {
    /// Begins the transaction (once the key is registered).
    async fn begin(&self) -> Result<(), StoreError>;

    /// Writes `response` as the result of `key` in the transaction, fenced by `token`,
    /// and commits; waits for the handler's hold on the connection until `until`.
    async fn commit_completed(
        self: Arc<Self>,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        until: Instant,
    ) -> Result<(), CommitError>;

    /// Rolls the transaction back, waiting for the handler's hold on the connection
    /// until `until`; past that, it is rolled back as soon as the handler lets go, and
    /// nothing can be written in it meanwhile.
    async fn roll_back(self: Arc<Self>, until: Instant);
}

impl<DB: Database> Cell<DB> {
    /// The open transaction, taken out of the cell (which is left ended), or `None` when
    /// there is none or the handler's hold outlasts `until` (then it is rolled back once
    /// released).
    async fn take(self: &Arc<Self>, until: Instant) -> Option<OpenTransaction<DB>> {
        match tokio::time::timeout_at(until, self.state.lock()).await {
            Ok(mut state) => match std::mem::replace(&mut *state, State::Ended) {
                State::Open(open) => Some(open),
                State::NotBegun | State::Ended => None,
            },
            Err(_elapsed) => {
                tracing::error!(
                    "idem: the handler still holds its transaction's connection after its answer (a task it left behind?); the transaction is rolled back once it lets go"
                );
                let cell = Arc::clone(self);
                tokio::spawn(async move {
                    let mut state = cell.state.lock().await;
                    if let State::Open(open) = std::mem::replace(&mut *state, State::Ended) {
                        let _ = open.tx.rollback().await;
                    }
                });
                None
            }
        }
    }
}

#[async_trait]
impl<DB: Database> TxControl for Cell<DB> {
    async fn begin(&self) -> Result<(), StoreError> {
        let open = self.store.begin_transaction().await?;
        *self.state.lock().await = State::Open(open);
        Ok(())
    }

    async fn commit_completed(
        self: Arc<Self>,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        until: Instant,
    ) -> Result<(), CommitError> {
        let Some(OpenTransaction { mut tx, .. }) = self.take(until).await else {
            return Err(CommitError::RolledBack(StoreError::unavailable(
                "the transaction was not available to commit (the handler kept its connection past its answer)",
            )));
        };
        fault::point("before_commit");
        if let Err(error) = self
            .store
            .complete_in(&mut tx, key, token, response, unix_now())
            .await
        {
            if let Err(rollback) = tx.rollback().await {
                let _ = self.store.fault(rollback);
            }
            return Err(CommitError::RolledBack(error));
        }
        tx.commit()
            .await
            .map_err(|e| CommitError::Commit(self.store.fault(e)))?;
        fault::point("after_commit");
        Ok(())
    }

    async fn roll_back(self: Arc<Self>, until: Instant) {
        if let Some(open) = self.take(until).await
            && let Err(error) = open.tx.rollback().await
        {
            // The transaction is gone either way: the server rolls back a transaction
            // whose connection failed.
            let error = self.store.fault(error);
            tracing::warn!(error = %error, "idem: rolling back the attempt's transaction failed");
        }
    }
}
