//! The orders table, in whichever database holds the orders: one module per backend
//! ([`sqlite`], [`postgres`]), the same columns in both, and [`Orders`], the pool of the
//! one the service was started with.
//!
//! An order is linked to the operation that made it (`operation_id`, unique), not only to
//! its idempotency key: a key reused after its TTL names a new operation, and must never
//! find an older order. In the transactional mode the order is written in the attempt's
//! transaction ([`idem::SqliteTx`], [`idem::PgTx`]); otherwise through the pool
//! ([`Orders::insert`]).

pub mod postgres;
pub mod sqlite;

use std::path::Path;

use sqlx::{PgPool, SqlitePool};

use crate::model::{CreateOrder, LineItem, Order};

/// Why the orders database cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The database failed.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// The file has the orders table of an older version of this example.
    #[error(
        "its orders table was made by an older version of this example (orders keyed by client and idempotency key, not by operation); move the file away and start again"
    )]
    OldSchema,
}

/// The database that holds the orders, as a pool: for reads (`GET /orders/{id}`, the
/// reconcile function) and, outside the transactional mode, for the handler's write.
#[derive(Clone, Debug)]
pub enum Orders {
    /// The orders table of a SQLite file ([`sqlite`]).
    Sqlite(SqlitePool),
    /// The orders table of a PostgreSQL database ([`postgres`]).
    Postgres(PgPool),
}

impl Orders {
    /// Opens the SQLite file `path` (created if missing) as idem's SQLite store would
    /// (WAL, `synchronous = FULL`), and creates the orders table if it is missing.
    ///
    /// # Errors
    ///
    /// When the file cannot be opened or its table created; [`MigrateError::OldSchema`].
    pub async fn open_sqlite(path: &Path) -> Result<Orders, MigrateError> {
        let pool = sqlite::open(path).await?;
        sqlite::migrate(&pool).await?;
        Ok(Orders::Sqlite(pool))
    }

    /// Connects to the PostgreSQL server at `url` and creates the orders table if it is
    /// missing (safe from several instances at once).
    ///
    /// # Errors
    ///
    /// When the server cannot be reached or the table created.
    pub async fn connect_postgres(url: &str) -> Result<Orders, MigrateError> {
        let pool = postgres::connect(url).await?;
        postgres::migrate(&pool).await?;
        Ok(Orders::Postgres(pool))
    }

    /// Which database this is, for people: `SQLite` or `PostgreSQL`.
    pub fn name(&self) -> &'static str {
        match self {
            Orders::Sqlite(_) => "SQLite",
            Orders::Postgres(_) => "PostgreSQL",
        }
    }

    /// Writes a new order made by `attempt` through the pool (outside the transactional
    /// mode: the write commits on its own, before idem records the answer).
    ///
    /// # Errors
    ///
    /// The database's error; a second order for one operation breaks the unique
    /// constraint (the last line of defence).
    pub async fn insert(
        &self,
        attempt: &idem::Attempt,
        order: &CreateOrder,
        now: i64,
    ) -> Result<Order, sqlx::Error> {
        match self {
            Orders::Sqlite(pool) => {
                sqlite::insert(&mut *pool.acquire().await?, attempt, order, now).await
            }
            Orders::Postgres(pool) => {
                postgres::insert(&mut *pool.acquire().await?, attempt, order, now).await
            }
        }
    }

    /// The order made by the operation `operation_id`, if any.
    ///
    /// # Errors
    ///
    /// The database's error.
    pub async fn by_operation(&self, operation_id: &str) -> Result<Option<Order>, sqlx::Error> {
        match self {
            Orders::Sqlite(pool) => sqlite::by_operation(pool, operation_id).await,
            Orders::Postgres(pool) => postgres::by_operation(pool, operation_id).await,
        }
    }

    /// The order `id` of `client`, if any (other clients' orders are not found).
    ///
    /// # Errors
    ///
    /// The database's error.
    pub async fn by_id(&self, client: &str, id: &str) -> Result<Option<Order>, sqlx::Error> {
        match self {
            Orders::Sqlite(pool) => sqlite::by_id(pool, client, id).await,
            Orders::Postgres(pool) => postgres::by_id(pool, client, id).await,
        }
    }

    /// How many orders there are, for tests and demos.
    ///
    /// # Errors
    ///
    /// The database's error.
    pub async fn count(&self) -> Result<i64, sqlx::Error> {
        match self {
            Orders::Sqlite(pool) => sqlite::count(pool).await,
            Orders::Postgres(pool) => postgres::count(pool).await,
        }
    }

    /// Closes the pool.
    pub async fn close(&self) {
        match self {
            Orders::Sqlite(pool) => pool.close().await,
            Orders::Postgres(pool) => pool.close().await,
        }
    }
}

/// A new order's id, such as `ord_0192…` (time-ordered).
fn new_id() -> String {
    format!("ord_{}", uuid::Uuid::now_v7().simple())
}

/// The line items as the `items` column holds them (JSON text).
fn items_to_text(order: &CreateOrder) -> Result<String, sqlx::Error> {
    serde_json::to_string(&order.items).map_err(|e| sqlx::Error::Encode(Box::new(e)))
}

/// The line items from the `items` column.
fn items_from_text(text: &str) -> Result<Vec<LineItem>, sqlx::Error> {
    serde_json::from_str(text).map_err(|e| sqlx::Error::Decode(Box::new(e)))
}
