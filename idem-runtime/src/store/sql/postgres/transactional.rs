//! PostgreSQL's [`TxDialect`]: many writers, as many transactions at once as the pool
//! leaves room for, and a transaction marked by its id.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Postgres;
use sqlx::postgres::PgPool;
use tokio::sync::Semaphore;

use crate::store::sql::SqlStore;
use crate::store::sql::dialect::TxDialect;
use crate::store::sql::records::completion_sql;
use crate::store::sql::statement::Statement;
use crate::store::{OpenTransaction, Reservation, StoreError};

/// What a PostgreSQL store keeps beside its pool: the right to hold an attempt's
/// transaction open.
///
/// An attempt's transaction holds a connection of the pool for the attempt's whole time,
/// while the attempt's own statements outside it (its journal's steps, its lease's
/// renewals) and the registration of other keys each need another one for a moment. As
/// many attempts as the pool has connections would each hold one and wait for a second
/// one that only their own ends free: nothing would move until the pool's wait is over
/// (3 s by default, longer than a lease), their leases would end, other instances would
/// take them over while they are alive, and their clients would get 503. So at most the
/// pool's size less a quarter of it (less one at least; one at least) are open at once,
/// and an attempt waits for its turn before its key is registered, as with SQLite's one
/// writer.
#[derive(Clone, Debug)]
pub struct PostgresState {
    /// One permit for each transaction that may be open at once.
    transactions: Arc<Semaphore>,
    /// How long an attempt waits for its turn: the pool's own wait for a connection.
    wait: Duration,
}

impl PostgresState {
    /// The state of a store over `pool`, sized to it.
    pub(super) fn for_pool(pool: &PgPool) -> PostgresState {
        let size = pool.options().get_max_connections();
        let kept = (size / 4).max(1);
        let permits = usize::try_from(size.saturating_sub(kept).max(1)).unwrap_or(1);
        PostgresState {
            transactions: Arc::new(Semaphore::new(permits)),
            wait: pool.options().get_acquire_timeout(),
        }
    }
}

impl TxDialect for Postgres {
    /// The completion inside the attempt's transaction, with the values of
    /// `SqlStore::completion`: the owner of a live lease (`$5` now), on the condition that
    /// it is still the transaction that began (`$10`, its id).
    const COMPLETE_IN_TX: &'static str =
        completion_sql!(" AND lease_until > $5 AND txid_current_if_assigned() = $10");

    /// One round trip: the completion's compare-and-set, on the condition that this is
    /// still the transaction that began (its id, bound last); only a refusal is looked
    /// into.
    async fn complete_in(
        _: &SqlStore<Postgres>,
        tx: &mut OpenTransaction<Postgres>,
        completion: Statement<Postgres>,
    ) -> Result<(), StoreError> {
        let result = completion.int(tx.marker).execute(&mut tx.tx).await;
        let aborted = || {
            StoreError::TransactionEnded(
                "a statement failed, and PostgreSQL aborts the whole transaction then (wrap a statement that may fail in a savepoint, `conn.begin()`)".into(),
            )
        };
        match result {
            Ok(1) => return Ok(()),
            Ok(_) => {}
            // 25P02, in_failed_sql_transaction.
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("25P02") => {
                return Err(aborted());
            }
            Err(error) => return Err(crate::store::sql::unavailable(error)),
        }
        let current: Option<i64> = sqlx::query_scalar("SELECT txid_current_if_assigned()")
            .fetch_one(&mut *tx.tx)
            .await
            .map_err(StoreError::unavailable)?;
        if current == Some(tx.marker) {
            Err(StoreError::LeaseLost)
        } else {
            Err(StoreError::TransactionEnded(
                "the handler ended it (a `COMMIT` or `ROLLBACK` of its own)".into(),
            ))
        }
    }

    /// The turn to hold a transaction open ([`PostgresState`]), waited for at most as
    /// long as the pool waits for a connection: the wait holds no connection and happens
    /// before the key is registered.
    async fn reserve(store: &SqlStore<Postgres>) -> Result<Reservation, StoreError> {
        let state = &store.state;
        let permit = tokio::time::timeout(
            state.wait,
            Arc::clone(&state.transactions).acquire_owned(),
        )
        .await
        .map_err(|_| {
            StoreError::unavailable(format!(
                "other attempts' transactions held this instance's connections to PostgreSQL for {:?}",
                state.wait
            ))
        })?
        .map_err(StoreError::unavailable)?;
        Ok(Reservation::new(Some(permit)))
    }

    fn try_reserve(store: &SqlStore<Postgres>) -> Option<Reservation> {
        let permit = Arc::clone(&store.state.transactions)
            .try_acquire_owned()
            .ok()?;
        Some(Reservation::new(Some(permit)))
    }

    /// `BEGIN` (READ COMMITTED, the server's default) on a connection of the pool, then
    /// [`BEGUN`] in the same transaction: its marker, its transaction id
    /// (`txid_current()`), read in the statement that bounds it on the server by
    /// [`server_limit`]`(within)`, the attempt's time left and a grace. Two round trips,
    /// as many as the marker alone takes, together within the store's call timeout.
    async fn begin_transaction(
        store: &SqlStore<Postgres>,
        reservation: Reservation,
        within: Duration,
    ) -> Result<OpenTransaction<Postgres>, StoreError> {
        let limit = server_limit(within).as_millis().to_string();
        let begun = async {
            let mut tx = store.pool.begin().await?;
            let marker: i64 = sqlx::query_scalar(BEGUN)
                .bind(&limit)
                .fetch_one(&mut *tx)
                .await?;
            Ok((tx, marker))
        };
        let (tx, marker) = store.bounded(begun).await?;
        Ok(OpenTransaction::new(tx, marker, reservation))
    }
}

/// The transaction's first statement: its marker (`txid_current()`), and `$1` (in
/// milliseconds) as its `statement_timeout` and `idle_in_transaction_session_timeout`,
/// set as `SET LOCAL` sets them (`set_config(.., true)`: for this transaction only, so
/// that a connection handed back to the pool keeps the session's own settings). They
/// take effect from the next statement on.
const BEGUN: &str = "SELECT txid_current(),
    set_config('statement_timeout', $1, true),
    set_config('idle_in_transaction_session_timeout', $1, true)";

/// The server's bound on an attempt's transaction that has `within` left: `within` and
/// a grace, a quarter of it at most 1 s ([`TX_GRACE`]), so that the client, which ends
/// the transaction by the attempt's deadline, is heard first, and the server ends only a
/// transaction whose client went silent. At least 1 ms (0 would mean no limit), at most
/// 24 h (the settings are 32-bit counts of milliseconds).
///
/// Each statement of the transaction is cancelled past it (`statement_timeout`), and
/// the session is ended when the transaction sits idle that long
/// (`idle_in_transaction_session_timeout`): its locks, such as the unique index entry of
/// a row it inserted, are let go, and another instance that took the key over goes on.
pub(crate) fn server_limit(within: Duration) -> Duration {
    let grace = (within / 4).min(TX_GRACE);
    (within + grace).clamp(Duration::from_millis(1), Duration::from_secs(24 * 60 * 60))
}

/// The longest grace [`server_limit`] adds to an attempt's time left.
pub(crate) const TX_GRACE: Duration = Duration::from_secs(1);
