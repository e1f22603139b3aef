//! The payments table, in the same PostgreSQL database as idem's records.
//!
//! A payment is written in the attempt's transaction ([`idem::PgTx`]) and linked to the
//! operation that made it (`operation_id`, unique): a key reused after its TTL names a
//! new operation and never finds an older payment. `charge_id` is the provider's id of
//! the charge behind the payment (nullable: payments made before the provider was called
//! have none).

use serde::Serialize;
use sqlx::{PgConnection, PgPool, Row};

/// The advisory lock that serialises this table's creation across instances.
const MIGRATION_LOCK: i64 = 0x7061_796d;

/// Creates the payments table if it is missing (safe from several instances at once).
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
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS payments (
            id              TEXT   PRIMARY KEY,
            operation_id    TEXT   NOT NULL UNIQUE,
            client_id       TEXT   NOT NULL,
            idempotency_key TEXT   NOT NULL,
            source          TEXT   NOT NULL,
            currency        TEXT   NOT NULL,
            amount_minor    BIGINT NOT NULL CHECK (amount_minor > 0),
            created_at      BIGINT NOT NULL,
            charge_id       TEXT
        )",
    )
    .execute(&mut *tx)
    .await?;
    // A table made before the column existed gets it.
    sqlx::query("ALTER TABLE payments ADD COLUMN IF NOT EXISTS charge_id TEXT")
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

/// A payment, as the service answers it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct Payment {
    /// The payment's id, such as `pay_0192…`.
    pub id: String,
    /// The card or account charged.
    pub source: String,
    /// The ISO 4217 currency code.
    pub currency: String,
    /// The amount in minor units.
    pub amount_minor: i64,
    /// Always `captured`: this example captures at once.
    pub status: &'static str,
    /// When the payment was made, in unix milliseconds.
    pub created_at: i64,
    /// The provider's id of the charge, such as `ch_0192…`; absent when none is recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub charge_id: Option<String>,
}

fn payment_from_row(row: &sqlx::postgres::PgRow) -> Result<Payment, sqlx::Error> {
    Ok(Payment {
        id: row.try_get("id")?,
        source: row.try_get("source")?,
        currency: row.try_get("currency")?,
        amount_minor: row.try_get("amount_minor")?,
        status: "captured",
        created_at: row.try_get("created_at")?,
        charge_id: row.try_get("charge_id")?,
    })
}

/// What a new payment is made of.
#[derive(Clone, Copy, Debug)]
pub struct NewPayment<'a> {
    /// The operation's id ([`idem::Attempt::operation_id`]).
    pub operation_id: &'a str,
    /// The client's identity.
    pub client: &'a str,
    /// The idempotency key.
    pub key: &'a str,
    /// The card or account charged.
    pub source: &'a str,
    /// The ISO 4217 currency code.
    pub currency: &'a str,
    /// The amount in minor units.
    pub amount_minor: i64,
    /// The provider's id of the charge ([`crate::provider::Charge::id`]), if any.
    pub charge_id: Option<&'a str>,
    /// Unix milliseconds.
    pub now: i64,
}

/// Writes a payment on `conn` (the attempt's transaction) and returns it.
///
/// # Errors
///
/// The database's error; a second payment for one operation breaks the unique constraint.
pub async fn insert(conn: &mut PgConnection, new: NewPayment<'_>) -> Result<Payment, sqlx::Error> {
    let id = format!("pay_{}", uuid::Uuid::now_v7().simple());
    let row = sqlx::query(
        "INSERT INTO payments (id, operation_id, client_id, idempotency_key, source, currency, amount_minor, created_at, charge_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
         RETURNING *",
    )
    .bind(&id)
    .bind(new.operation_id)
    .bind(new.client)
    .bind(new.key)
    .bind(new.source)
    .bind(new.currency)
    .bind(new.amount_minor)
    .bind(new.now)
    .bind(new.charge_id)
    .fetch_one(&mut *conn)
    .await?;
    payment_from_row(&row)
}

/// The payment made by the operation `operation_id`, if any.
///
/// # Errors
///
/// The database's error.
pub async fn by_operation(
    pool: &PgPool,
    operation_id: &str,
) -> Result<Option<Payment>, sqlx::Error> {
    sqlx::query("SELECT * FROM payments WHERE operation_id = $1")
        .bind(operation_id)
        .fetch_optional(pool)
        .await?
        .as_ref()
        .map(payment_from_row)
        .transpose()
}

/// The payment `id` of `client`, if any (other clients' payments are not found).
///
/// # Errors
///
/// The database's error.
pub async fn by_id(pool: &PgPool, client: &str, id: &str) -> Result<Option<Payment>, sqlx::Error> {
    sqlx::query("SELECT * FROM payments WHERE client_id = $1 AND id = $2")
        .bind(client)
        .bind(id)
        .fetch_optional(pool)
        .await?
        .as_ref()
        .map(payment_from_row)
        .transpose()
}

/// How many payments there are, for tests and demos.
///
/// # Errors
///
/// The database's error.
pub async fn count(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT COUNT(*) FROM payments")
        .fetch_one(pool)
        .await
}
