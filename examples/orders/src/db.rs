//! The orders table, in the same SQLite database as idem's records.

use sqlx::{Row, SqlitePool};

use crate::model::{CreateOrder, LineItem, Order};

/// Creates the orders table if it is missing.
///
/// `(client_id, idempotency_key)` is unique: the reconcile function finds an order by the
/// key it was created under, and a second write under one key cannot happen.
///
/// # Errors
///
/// The database's error.
pub async fn migrate(pool: &SqlitePool) -> Result<(), sqlx::Error> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS orders (
            id TEXT PRIMARY KEY,
            client_id TEXT NOT NULL,
            idempotency_key TEXT NOT NULL,
            customer_id TEXT NOT NULL,
            currency TEXT NOT NULL,
            amount_minor INTEGER NOT NULL,
            items TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            UNIQUE (client_id, idempotency_key)
        )",
    )
    .execute(pool)
    .await?;
    Ok(())
}

fn order_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<Order, sqlx::Error> {
    let items: String = row.try_get("items")?;
    let items: Vec<LineItem> =
        serde_json::from_str(&items).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
    Ok(Order {
        id: row.try_get("id")?,
        customer_id: row.try_get("customer_id")?,
        currency: row.try_get("currency")?,
        amount_minor: row.try_get("amount_minor")?,
        items,
        created_at: row.try_get("created_at")?,
    })
}

/// Writes a new order for `client` under `key`; if one exists under that key already,
/// returns it instead (the unique constraint is the last line of defence).
///
/// # Errors
///
/// The database's error.
pub async fn insert(
    pool: &SqlitePool,
    client: &str,
    key: &str,
    order: &CreateOrder,
    now: i64,
) -> Result<Order, sqlx::Error> {
    let id = format!("ord_{}", uuid::Uuid::now_v7().simple());
    let items =
        serde_json::to_string(&order.items).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    let inserted = sqlx::query(
        "INSERT INTO orders (id, client_id, idempotency_key, customer_id, currency, amount_minor, items, created_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT (client_id, idempotency_key) DO NOTHING",
    )
    .bind(&id)
    .bind(client)
    .bind(key)
    .bind(&order.customer_id)
    .bind(&order.currency)
    .bind(order.amount_minor)
    .bind(&items)
    .bind(now)
    .execute(pool)
    .await?;
    if inserted.rows_affected() == 0 {
        tracing::warn!("orders: an order under this key exists already; answering it");
    }
    by_key(pool, client, key)
        .await?
        .ok_or(sqlx::Error::RowNotFound)
}

/// The order `client` created under `key`, if any.
///
/// # Errors
///
/// The database's error.
pub async fn by_key(
    pool: &SqlitePool,
    client: &str,
    key: &str,
) -> Result<Option<Order>, sqlx::Error> {
    sqlx::query("SELECT * FROM orders WHERE client_id = ? AND idempotency_key = ?")
        .bind(client)
        .bind(key)
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
