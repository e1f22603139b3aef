//! The SQL stores: one implementation of the store traits, [`SqlStore`], over the database
//! it speaks (`Dialect`, implemented for SQLite and PostgreSQL).
//!
//! Both keep one row per key in the table `idem_records`, with these columns:
//!
//! | column | type | holds |
//! |---|---|---|
//! | `operation`, `client`, `key` | text | the [`RecordKey`](crate::store::RecordKey); the primary key |
//! | `operation_id` | text | the operation id (a UUIDv7) |
//! | `fingerprint` | text | `sha256:<hex>` |
//! | `state` | text | `processing`, `completed`, `released`, `unknown` |
//! | `attempt` | integer | 1 and up |
//! | `token`, `lease_until` | text, integer | the lease, while processing |
//! | `created_at`, `expires_at` | integer | unix milliseconds |
//! | `status`, `headers`, `body` | integer, text, bytes | the stored result, once completed |
//! | `reason` | text | why it is parked, once unknown |
//! | `transactional` | boolean | whether the operation runs in the transactional mode |
//! | `history` | text | the record's history, a JSON array of events ([`crate::store::ops`]) |
//!
//! Headers are written as `store::headers` says.
//!
//! | module | holds |
//! |---|---|
//! | `statement` | a statement and its values, run on a connection (the sqlx code, generic) |
//! | `rows` | a row read as a record |
//! | `dialect` | what differs between the databases (`Dialect`, `TxDialect`) |
//! | `records`, `operator`, `transactional` | the store traits, once for both databases |
//! | `sqlite`, `postgres` | each database: its statements, constructors and transactions |

mod dialect;
mod operator;
#[cfg(feature = "postgres")]
pub mod postgres;
mod records;
mod rows;
#[cfg(feature = "sqlite")]
pub mod sqlite;
mod statement;
mod transactional;

use std::fmt;

use sqlx::Pool;
use sqlx::pool::PoolConnection;

use self::dialect::Dialect;
use self::rows::changed_one;
use self::statement::Statement;
use crate::store::{DEFAULT_MAX_RESULT, Record, StoreError};

/// A [`Store`](crate::store::Store) in a SQL database, through sqlx: `SqliteStore`
/// (`SqlStore<sqlx::Sqlite>`, feature `sqlite`) and `PostgresStore`
/// (`SqlStore<sqlx::Postgres>`, feature `postgres`), whose docs say what each database
/// does. Also a [`TransactionalStore`](crate::store::TransactionalStore), so that a
/// handler's business writes and its record commit in one transaction.
///
/// Every change of a record is one statement whose `WHERE` clause holds the condition
/// (the owner's token, the lease, the state), and whose result says whether it applied.
pub struct SqlStore<DB: Dialect> {
    pool: Pool<DB>,
    state: DB::State,
    max_result: usize,
}

impl<DB: Dialect> SqlStore<DB> {
    /// A store over `pool` and what `DB` keeps beside it, keeping results of up to
    /// [`DEFAULT_MAX_RESULT`] bytes.
    fn new(pool: Pool<DB>, state: DB::State) -> SqlStore<DB> {
        SqlStore {
            pool,
            state,
            max_result: DEFAULT_MAX_RESULT,
        }
    }

    /// The same store, keeping results of up to `bytes` bytes
    /// ([`StoredResponse::size`](crate::store::StoredResponse::size);
    /// [`DEFAULT_MAX_RESULT`] unless set): a larger one is refused with
    /// [`StoreError::TooLarge`] before anything is written.
    #[must_use]
    pub fn with_max_result(mut self, bytes: usize) -> SqlStore<DB> {
        self.max_result = bytes;
        self
    }

    /// The pool, to share it with the application: create the business tables through
    /// it, and read. A contracted handler's business writes go through its transaction
    /// ([`crate::transaction::Tx`]), so that they commit with the record.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// Closes every connection, waiting for them to finish; later calls fail with
    /// [`StoreError::Unavailable`].
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// A connection for one call.
    async fn conn(&self) -> Result<PoolConnection<DB>, StoreError> {
        DB::acquire(self).await
    }

    /// Runs `statement` on `conn`; how many rows it changed.
    async fn execute(
        &self,
        conn: &mut DB::Connection,
        statement: Statement<DB>,
    ) -> Result<u64, StoreError> {
        statement
            .execute(conn)
            .await
            .map_err(|e| DB::fault(self, e))
    }

    /// Runs `statement`, one `UPDATE` of a record, on a connection of its own: the lease
    /// is lost unless it changed exactly one row.
    async fn change_one(&self, statement: Statement<DB>) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        changed_one(self.execute(&mut conn, statement).await?)
    }

    /// Runs `statement` on `conn`; its one row, if any, as a record.
    async fn record(
        &self,
        conn: &mut DB::Connection,
        statement: Statement<DB>,
    ) -> Result<Option<Record>, StoreError> {
        let row = statement
            .fetch_optional(conn)
            .await
            .map_err(|e| DB::fault(self, e))?;
        row.as_ref().map(rows::decode).transpose()
    }
}

impl<DB: Dialect> Clone for SqlStore<DB> {
    fn clone(&self) -> Self {
        SqlStore {
            pool: self.pool.clone(),
            state: self.state.clone(),
            max_result: self.max_result,
        }
    }
}

impl<DB: Dialect> fmt::Debug for SqlStore<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlStore")
            .field("database", &DB::NAME)
            .field("pool", &self.pool)
            .field("state", &self.state)
            .field("max_result", &self.max_result)
            .finish()
    }
}
