//! PostgreSQL's [`TxDialect`]: many writers, and a transaction marked by its id.

use sqlx::Postgres;

use crate::store::sql::SqlStore;
use crate::store::sql::dialect::TxDialect;
use crate::store::sql::records::completion_sql;
use crate::store::sql::statement::Statement;
use crate::store::{OpenTransaction, Reservation, StoreError};

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

    /// `BEGIN` (READ COMMITTED, the server's default) on a connection of the pool; its
    /// marker is its transaction id (`txid_current()`).
    async fn begin_transaction(
        store: &SqlStore<Postgres>,
        reservation: Reservation,
    ) -> Result<OpenTransaction<Postgres>, StoreError> {
        let mut tx = store.pool.begin().await.map_err(StoreError::unavailable)?;
        let marker: i64 = sqlx::query_scalar("SELECT txid_current()")
            .fetch_one(&mut *tx)
            .await
            .map_err(StoreError::unavailable)?;
        Ok(OpenTransaction::new(tx, marker, reservation))
    }
}
