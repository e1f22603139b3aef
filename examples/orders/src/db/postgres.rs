//! The orders table in PostgreSQL: beside idem's records (`--store postgres`, the
//! transactional mode, any number of instances on one database) or beside records kept
//! elsewhere (`--store redis`).
//!
//! The same columns as in SQLite; `operation_id` is unique, which is the last line of
//! defence against a second order for one operation, whichever instance writes it.

use std::time::Duration;

use sqlx::postgres::{PgPoolOptions, PgRow};
use sqlx::{PgConnection, PgPool, Row};

use super::{items_from_text, items_to_text, new_id};
use crate::model::{CreateOrder, Order};

/// The advisory lock that serialises this table's creation across instances (the bytes
/// of `ordr`): `CREATE TABLE IF NOT EXISTS` alone races when instances start together.
const MIGRATION_LOCK: i64 = 0x6f72_6472;

/// The orders table, version 1.
const MIGRATION: &str = "CREATE TABLE IF NOT EXISTS orders (
        id              TEXT   PRIMARY KEY,
        operation_id    TEXT   NOT NULL UNIQUE,
        client_id       TEXT   NOT NULL,
        idempotency_key TEXT   NOT NULL,
        customer_id     TEXT   NOT NULL,
        currency        TEXT   NOT NULL,
        amount_minor    BIGINT NOT NULL,
        items           TEXT   NOT NULL,
        created_at      BIGINT NOT NULL
    )";

/// A pool for orders only, with the settings of idem's PostgreSQL store: at most 16
/// connections, a call waits at most 3 s for one (a server that is down fails requests
/// fast), connections checked before use (a restarted server is reconnected to).
///
/// # Errors
///
/// When the URL is malformed or the server cannot be reached.
pub async fn connect(url: &str) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(3))
        .connect(url)
        .await
}

/// Creates the orders table if it is missing, in one transaction under an advisory
/// lock: safe from several instances at once, and again.
///
/// # Errors
///
/// The database's error.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *tx)
        .await?;
    sqlx::query(MIGRATION).execute(&mut *tx).await?;
    tx.commit().await
}

fn order_from_row(row: &PgRow) -> Result<Order, sqlx::Error> {
    let items: String = row.try_get("items")?;
    Ok(Order {
        id: row.try_get("id")?,
        customer_id: row.try_get("customer_id")?,
        currency: row.try_get("currency")?,
        amount_minor: row.try_get("amount_minor")?,
        items: items_from_text(&items)?,
        created_at: row.try_get("created_at")?,
    })
}

/// Writes a new order made by `attempt` on `conn` (the attempt's transaction, or a
/// connection of the pool), and returns it.
///
/// # Errors
///
/// The database's error; a second order for one operation breaks the unique constraint.
pub async fn insert(
    conn: &mut PgConnection,
    attempt: &idem::Attempt,
    order: &CreateOrder,
    now: i64,
) -> Result<Order, sqlx::Error> {
    let row = sqlx::query(
        "INSERT INTO orders (id, operation_id, client_id, idempotency_key, customer_id, currency, amount_minor, items, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
         RETURNING *",
    )
    .bind(new_id())
    .bind(attempt.operation_id.to_string())
    .bind(&attempt.client)
    .bind(&attempt.key)
    .bind(&order.customer_id)
    .bind(&order.currency)
    .bind(order.amount_minor)
    .bind(items_to_text(order)?)
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
pub async fn by_operation(pool: &PgPool, operation_id: &str) -> Result<Option<Order>, sqlx::Error> {
    sqlx::query("SELECT * FROM orders WHERE operation_id = $1")
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
pub async fn by_id(pool: &PgPool, client: &str, id: &str) -> Result<Option<Order>, sqlx::Error> {
    sqlx::query("SELECT * FROM orders WHERE client_id = $1 AND id = $2")
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
pub async fn count(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT COUNT(*) FROM orders")
        .fetch_one(pool)
        .await
}
