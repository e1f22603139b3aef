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
mod journal;
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
use std::future::Future;
use std::time::Duration;

use sqlx::Pool;
use sqlx::pool::PoolConnection;

use self::dialect::Dialect;
use self::rows::changed_one;
use self::statement::Statement;
use crate::store::{DEFAULT_MAX_RESULT, Record, StoreError, StoredResponse};

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
    /// How long the client waits for one statement's answer; `None`: as long as the
    /// driver does (SQLite's default; PostgreSQL's is `postgres::DEFAULT_CALL_TIMEOUT`).
    call_timeout: Option<Duration>,
}

impl<DB: Dialect> SqlStore<DB> {
    /// A store over `pool` and what `DB` keeps beside it, keeping results of up to
    /// [`DEFAULT_MAX_RESULT`] bytes.
    fn new(pool: Pool<DB>, state: DB::State) -> SqlStore<DB> {
        SqlStore {
            pool,
            state,
            max_result: DEFAULT_MAX_RESULT,
            call_timeout: None,
        }
    }

    /// The same store, waiting at most `limit` for the answer to each statement of its
    /// calls, so that no call hangs on a server or a network gone silent: a statement
    /// that was sent and got no answer within it fails with
    /// [`StoreError::outcome_unknown`] (the server may still carry it out). Beginning an
    /// attempt's transaction (the connection, `BEGIN` and its first statement) is bounded
    /// by it too, and fails with a plain [`StoreError::Unavailable`].
    ///
    /// PostgreSQL's stores wait `postgres::DEFAULT_CALL_TIMEOUT` (5 s) unless this says
    /// otherwise, SQLite's as long as the driver does; `store::OpenOptions::timeout` sets
    /// it for the store it opens. The statements of a handler inside its transaction are
    /// bounded by the attempt's time instead.
    #[must_use]
    pub fn with_call_timeout(mut self, limit: Duration) -> SqlStore<DB> {
        self.call_timeout = Some(limit);
        self
    }

    /// The same store, keeping results of up to `bytes` bytes
    /// ([`StoredResponse::size`];
    /// [`DEFAULT_MAX_RESULT`] unless set): a larger one is refused with
    /// [`StoreError::TooLarge`] before anything is written.
    /// At least [`StoredResponse::MAX_NOT_KEPT_SIZE`] bytes are kept whatever `bytes`
    /// says, so that what is kept of a result too large always fits.
    #[must_use]
    pub fn with_max_result(mut self, bytes: usize) -> SqlStore<DB> {
        self.max_result = bytes.max(StoredResponse::MAX_NOT_KEPT_SIZE);
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

    /// Awaits `sent`, a statement run on a connection, within the call timeout if the
    /// store has one. The statement has been sent once it runs: a timeout, or a
    /// connection that broke before its answer came, is [`StoreError::outcome_unknown`];
    /// an error the database answered with is [`Dialect::fault`]'s.
    async fn run<T>(
        &self,
        sent: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, StoreError> {
        let answer = self
            .timed(sent)
            .await
            .map_err(|limit| StoreError::outcome_unknown(no_answer(limit)))?;
        answer.map_err(|error| {
            let lost = answer_lost(&error);
            match DB::fault(self, error) {
                StoreError::Unavailable(source) if lost => StoreError::outcome_unknown(source),
                other => other,
            }
        })
    }

    /// Awaits `step`, whose statements take no effect unless a later commit makes them
    /// (beginning a transaction), within the call timeout if the store has one: running
    /// out of it, or a driver error, is a plain [`StoreError::Unavailable`]
    /// ([`Dialect::fault`]'s).
    async fn bounded<T>(
        &self,
        step: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, StoreError> {
        let answer = self
            .timed(step)
            .await
            .map_err(|limit| StoreError::unavailable(no_answer(limit)))?;
        answer.map_err(|error| DB::fault(self, error))
    }

    /// Awaits `sent` within the call timeout, if the store has one; `Err` with the
    /// timeout when it ran out first.
    async fn timed<T>(&self, sent: impl Future<Output = T>) -> Result<T, Duration> {
        match self.call_timeout {
            Some(limit) => tokio::time::timeout(limit, sent).await.map_err(|_| limit),
            None => Ok(sent.await),
        }
    }

    /// Runs `statement` on `conn`; how many rows it changed.
    async fn execute(
        &self,
        conn: &mut DB::Connection,
        statement: Statement<DB>,
    ) -> Result<u64, StoreError> {
        self.run(statement.execute(conn)).await
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
        let row = self.run(statement.fetch_optional(conn)).await?;
        row.as_ref().map(rows::decode).transpose()
    }
}

/// Why a call failed when the database did not answer within `limit`.
fn no_answer(limit: Duration) -> String {
    format!(
        "the database did not answer within {} ms",
        limit.as_millis()
    )
}

/// A driver error as a [`StoreError::Unavailable`], marked [`StoreError::full`] when the
/// database answered that it is full: PostgreSQL's `disk_full` (SQLSTATE 53100) or
/// SQLite's `SQLITE_FULL` (13, or an extended code of it).
pub(crate) fn unavailable(error: sqlx::Error) -> StoreError {
    if is_full(&error) {
        StoreError::full(error)
    } else {
        StoreError::unavailable(error)
    }
}

fn is_full(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = error else {
        return false;
    };
    match db.code().as_deref() {
        Some("53100") => true,
        Some(code) => code.parse::<i32>().is_ok_and(|code| code & 0xff == 13),
        None => false,
    }
}

/// Whether a driver error on a statement that was sent means its answer was lost: the
/// connection broke, closed or spoke nonsense before the answer was read. An error the
/// database answered with (`Database`), or one raised before anything was sent (a
/// value that cannot be encoded), is not.
fn answer_lost(error: &sqlx::Error) -> bool {
    matches!(
        error,
        sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::WorkerCrashed
    )
}

impl<DB: Dialect> Clone for SqlStore<DB> {
    fn clone(&self) -> Self {
        SqlStore {
            pool: self.pool.clone(),
            state: self.state.clone(),
            max_result: self.max_result,
            call_timeout: self.call_timeout,
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
            .field("call_timeout", &self.call_timeout)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::answer_lost;

    #[test]
    fn a_broken_connection_loses_the_answer_and_a_refusal_before_sending_does_not() {
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(answer_lost(&io));
        assert!(answer_lost(&sqlx::Error::Protocol("garbled".into())));
        assert!(answer_lost(&sqlx::Error::WorkerCrashed));
        assert!(!answer_lost(&sqlx::Error::PoolTimedOut));
        assert!(!answer_lost(&sqlx::Error::Encode("too big".into())));
        assert!(!answer_lost(&sqlx::Error::RowNotFound));
    }
}
