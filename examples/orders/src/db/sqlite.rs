//! The orders table in a SQLite file: beside idem's records (`--store sqlite`, the
//! transactional mode) or on its own (`--store memory`).

use std::path::Path;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqliteConnection, SqlitePool};

use super::{MigrateError, items_from_text, items_to_text, new_id};
use crate::model::{CreateOrder, Order};

/// Opens the SQLite file `path` for orders only (created if missing), with the settings
/// of idem's SQLite store: WAL, `synchronous = FULL`, a 5 s busy timeout.
///
/// # Errors
///
/// When the file cannot be opened.
pub async fn open(path: &Path) -> Result<SqlitePool, sqlx::Error> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(5));
    SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
}

/// Creates the orders table if it is missing.
///
/// `operation_id` is unique: the reconcile function finds an order by the operation that
/// made it, and a second order for one operation cannot be written. The client and the
/// key are kept for people reading the table.
///
/// # Errors
///
/// The database's error, or [`MigrateError::OldSchema`].
pub async fn migrate(pool: &SqlitePool) -> Result<(), MigrateError> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS orders (
            id TEXT PRIMARY KEY,
            operation_id TEXT NOT NULL UNIQUE,
            client_id TEXT NOT NULL,
            idempotency_key TEXT NOT NULL,
            customer_id TEXT NOT NULL,
            currency TEXT NOT NULL,
            amount_minor INTEGER NOT NULL,
            items TEXT NOT NULL,
            created_at INTEGER NOT NULL
        )",
    )
    .execute(pool)
    .await?;
    let linked: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pragma_table_info('orders') WHERE name = 'operation_id'",
    )
    .fetch_one(pool)
    .await?;
    if linked == 0 {
        return Err(MigrateError::OldSchema);
    }
    Ok(())
}

fn order_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<Order, sqlx::Error> {
    let items: String = row.try_get("items")?;
    let items = items_from_text(&items)?;
    Ok(Order {
        id: row.try_get("id")?,
        customer_id: row.try_get("customer_id")?,
        currency: row.try_get("currency")?,
        amount_minor: row.try_get("amount_minor")?,
        items,
        created_at: row.try_get("created_at")?,
    })
}

/// Writes a new order made by `attempt` (linked to its operation; the client and the key
/// kept for people reading the table), on `conn` (the attempt's transaction, or a
/// connection of the pool), and returns it.
///
/// # Errors
///
/// The database's error; a second order for one operation breaks the unique constraint
/// (the last line of defence).
pub async fn insert(
    conn: &mut SqliteConnection,
    attempt: &idem::Attempt,
    order: &CreateOrder,
    now: i64,
) -> Result<Order, sqlx::Error> {
    let id = new_id();
    let items = items_to_text(order)?;
    let row = sqlx::query(
        "INSERT INTO orders (id, operation_id, client_id, idempotency_key, customer_id, currency, amount_minor, items, created_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
         RETURNING *",
    )
    .bind(&id)
    .bind(attempt.operation_id.to_string())
    .bind(&attempt.client)
    .bind(&attempt.key)
    .bind(&order.customer_id)
    .bind(&order.currency)
    .bind(order.amount_minor)
    .bind(&items)
    .bind(now)
    .fetch_one(&mut *conn)
    .await?;
    order_from_row(&row)
}

/// The order made by the operation `operation_id`, if any.
///
/// # Errors
///
/// The database's error.
pub async fn by_operation(
    pool: &SqlitePool,
    operation_id: &str,
) -> Result<Option<Order>, sqlx::Error> {
    sqlx::query("SELECT * FROM orders WHERE operation_id = ?")
        .bind(operation_id)
        .fetch_optional(pool)
        .await?
        .as_ref()
        .map(order_from_row)
        .transpose()
}

/// The order `id` of `client`, if any (other clients' orders are not found).
///
/// # Errors
///
/// The database's error.
pub async fn by_id(
    pool: &SqlitePool,
    client: &str,
    id: &str,
) -> Result<Option<Order>, sqlx::Error> {
    sqlx::query("SELECT * FROM orders WHERE client_id = ? AND id = ?")
        .bind(client)
        .bind(id)
        .fetch_optional(pool)
        .await?
        .as_ref()
        .map(order_from_row)
        .transpose()
}

/// How many orders there are, for tests and demos.
///
/// # Errors
///
/// The database's error.
pub async fn count(pool: &SqlitePool) -> Result<i64, sqlx::Error> {
    sqlx::query("SELECT COUNT(*) FROM orders")
        .fetch_one(pool)
        .await?
        .try_get(0)
}
