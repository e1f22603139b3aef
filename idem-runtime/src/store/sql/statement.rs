//! One statement and its values, run on a connection: the sqlx code of the SQL stores,
//! written once for every database they speak.
//!
//! Every statement numbers its parameters `$1`, `$2`, …: PostgreSQL's form, which sqlx's
//! SQLite driver binds by number as well, so that a statement whose SQL is the same in
//! both databases is written once. A [`Statement`] binds its values in that order.

use std::future::Future;

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, Type};

use super::rows::sql_ms;
use crate::store::{OwnerToken, RecordKey, StoreError, UnixMillis};

/// A statement with the values bound to it so far, as sqlx holds it.
pub type Query<DB> = sqlx::query::Query<'static, DB, <DB as Database>::Arguments>;

/// How many rows a statement changed, from a driver's result.
pub trait RowsAffected {
    /// The number of rows the statement inserted, updated or deleted.
    fn rows_affected(&self) -> u64;
}

#[cfg(feature = "sqlite")]
impl RowsAffected for sqlx::sqlite::SqliteQueryResult {
    fn rows_affected(&self) -> u64 {
        sqlx::sqlite::SqliteQueryResult::rows_affected(self)
    }
}

#[cfg(feature = "postgres")]
impl RowsAffected for sqlx::postgres::PgQueryResult {
    fn rows_affected(&self) -> u64 {
        sqlx::postgres::PgQueryResult::rows_affected(self)
    }
}

/// A row's columns by name, as the values a record is made of: what decoding a row
/// ([`super::rows`]) needs of a driver's row type. A value the driver cannot read as the
/// type asked for is [`StoreError::Corrupt`].
pub trait Columns {
    /// A text column that is never NULL.
    fn text(&self, name: &str) -> Result<String, StoreError>;
    /// A text column.
    fn maybe_text(&self, name: &str) -> Result<Option<String>, StoreError>;
    /// An integer column that is never NULL.
    fn int(&self, name: &str) -> Result<i64, StoreError>;
    /// An integer column.
    fn maybe_int(&self, name: &str) -> Result<Option<i64>, StoreError>;
    /// A bytes column.
    fn maybe_bytes(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// A boolean column that is never NULL.
    fn flag(&self, name: &str) -> Result<bool, StoreError>;
}

impl<R> Columns for R
where
    R: Row,
    for<'a> &'a str: ColumnIndex<R>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
{
    fn text(&self, name: &str) -> Result<String, StoreError> {
        self.try_get(name).map_err(corrupt)
    }

    fn maybe_text(&self, name: &str) -> Result<Option<String>, StoreError> {
        self.try_get(name).map_err(corrupt)
    }

    fn int(&self, name: &str) -> Result<i64, StoreError> {
        self.try_get(name).map_err(corrupt)
    }

    fn maybe_int(&self, name: &str) -> Result<Option<i64>, StoreError> {
        self.try_get(name).map_err(corrupt)
    }

    fn maybe_bytes(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.try_get(name).map_err(corrupt)
    }

    fn flag(&self, name: &str) -> Result<bool, StoreError> {
        self.try_get(name).map_err(corrupt)
    }
}

fn corrupt(error: sqlx::Error) -> StoreError {
    StoreError::Corrupt(error.to_string())
}

/// A database the SQL stores run statements on: the four kinds of value they bind, and a
/// statement executed or fetched on a connection. Implemented for every sqlx database
/// that has them (SQLite and PostgreSQL), so that code generic over the database names no
/// driver type.
pub trait Run: Database<Row: Columns, QueryResult: RowsAffected> {
    /// `query` with a text value (or NULL) bound to its next parameter.
    fn bind_text(query: Query<Self>, value: Option<&str>) -> Query<Self>;

    /// `query` with an integer (or NULL) bound to its next parameter.
    fn bind_int(query: Query<Self>, value: Option<i64>) -> Query<Self>;

    /// `query` with a boolean bound to its next parameter.
    fn bind_bool(query: Query<Self>, value: bool) -> Query<Self>;

    /// `query` with bytes (or NULL) bound to its next parameter.
    fn bind_bytes(query: Query<Self>, value: Option<&[u8]>) -> Query<Self>;

    /// Runs `query` on `conn`; how many rows it changed.
    fn execute(
        conn: &mut Self::Connection,
        query: Query<Self>,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

    /// Runs `query` on `conn`; its one row, or `None`.
    fn fetch_optional(
        conn: &mut Self::Connection,
        query: Query<Self>,
    ) -> impl Future<Output = Result<Option<Self::Row>, sqlx::Error>> + Send;

    /// Runs `query` on `conn`; its rows.
    fn fetch_all(
        conn: &mut Self::Connection,
        query: Query<Self>,
    ) -> impl Future<Output = Result<Vec<Self::Row>, sqlx::Error>> + Send;
}

impl<DB> Run for DB
where
    DB: Database<Row: Columns, QueryResult: RowsAffected>,
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'e> Option<&'e str>: Encode<'e, DB> + Type<DB>,
    for<'e> Option<i64>: Encode<'e, DB> + Type<DB>,
    for<'e> bool: Encode<'e, DB> + Type<DB>,
    for<'e> Option<&'e [u8]>: Encode<'e, DB> + Type<DB>,
{
    fn bind_text(query: Query<DB>, value: Option<&str>) -> Query<DB> {
        query.bind(value)
    }

    fn bind_int(query: Query<DB>, value: Option<i64>) -> Query<DB> {
        query.bind(value)
    }

    fn bind_bool(query: Query<DB>, value: bool) -> Query<DB> {
        query.bind(value)
    }

    fn bind_bytes(query: Query<DB>, value: Option<&[u8]>) -> Query<DB> {
        query.bind(value)
    }

    async fn execute(conn: &mut DB::Connection, query: Query<DB>) -> Result<u64, sqlx::Error> {
        Ok(query.execute(conn).await?.rows_affected())
    }

    async fn fetch_optional(
        conn: &mut DB::Connection,
        query: Query<DB>,
    ) -> Result<Option<DB::Row>, sqlx::Error> {
        query.fetch_optional(conn).await
    }

    async fn fetch_all(
        conn: &mut DB::Connection,
        query: Query<DB>,
    ) -> Result<Vec<DB::Row>, sqlx::Error> {
        query.fetch_all(conn).await
    }
}

/// A statement and the values bound to it so far, in the order of its parameters.
pub struct Statement<DB: Run> {
    query: Query<DB>,
}

impl<DB: Run> Statement<DB> {
    /// `sql` with no value bound yet.
    pub fn new(sql: &'static str) -> Statement<DB> {
        Statement {
            query: sqlx::query(sql),
        }
    }

    /// `sql` with `key` bound to `$1`..`$3`: its operation, client and key.
    pub fn keyed(sql: &'static str, key: &RecordKey) -> Statement<DB> {
        Statement::new(sql)
            .text(&key.operation)
            .text(&key.client)
            .text(&key.key)
    }

    /// The next value is `value`.
    pub fn text(self, value: &str) -> Statement<DB> {
        self.maybe_text(Some(value))
    }

    /// The next value is `value`, or NULL.
    pub fn maybe_text(self, value: Option<&str>) -> Statement<DB> {
        Statement {
            query: DB::bind_text(self.query, value),
        }
    }

    /// The next value is the token, as text ([`OwnerToken`]'s `Display`).
    pub fn token(self, token: OwnerToken) -> Statement<DB> {
        self.text(&token.to_string())
    }

    /// The next value is `value`.
    pub fn int(self, value: i64) -> Statement<DB> {
        self.maybe_int(Some(value))
    }

    /// The next value is `value`, or NULL.
    pub fn maybe_int(self, value: Option<i64>) -> Statement<DB> {
        Statement {
            query: DB::bind_int(self.query, value),
        }
    }

    /// The next value is the time `ms`, unix milliseconds as an integer.
    pub fn ms(self, ms: UnixMillis) -> Statement<DB> {
        self.int(sql_ms(ms))
    }

    /// The next value is `value`.
    pub fn flag(self, value: bool) -> Statement<DB> {
        Statement {
            query: DB::bind_bool(self.query, value),
        }
    }

    /// The next value is `value`, or NULL.
    pub fn maybe_bytes(self, value: Option<&[u8]>) -> Statement<DB> {
        Statement {
            query: DB::bind_bytes(self.query, value),
        }
    }

    /// Runs the statement on `conn`; how many rows it changed.
    pub async fn execute(self, conn: &mut DB::Connection) -> Result<u64, sqlx::Error> {
        DB::execute(conn, self.query).await
    }

    /// Runs the statement on `conn`; its one row, or `None`.
    pub async fn fetch_optional(
        self,
        conn: &mut DB::Connection,
    ) -> Result<Option<DB::Row>, sqlx::Error> {
        DB::fetch_optional(conn, self.query).await
    }

    /// Runs the statement on `conn`; its rows.
    pub async fn fetch_all(self, conn: &mut DB::Connection) -> Result<Vec<DB::Row>, sqlx::Error> {
        DB::fetch_all(conn, self.query).await
    }
}
