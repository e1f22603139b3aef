//! idem's schema in PostgreSQL: its migrations, applied under an advisory lock.

use sqlx::Postgres;
use sqlx::postgres::PgPool;

use crate::store::StoreError;
use crate::store::sql::SqlStore;

/// One step of idem's schema in PostgreSQL, as plain SQL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Migration {
    /// Applied in increasing order; recorded in `idem_schema_migrations`.
    pub version: i64,
    /// A short name, such as `idem_records`.
    pub name: &'static str,
    /// The SQL, one or more statements. Each is safe to run again (`IF NOT EXISTS`).
    pub sql: &'static str,
}

/// idem's schema, in order: the files of `idem-runtime/migrations/postgres/`, for teams
/// that apply them with their own migration tool (then open the store with
/// [`PostgresStore::without_migrations`](super::PostgresStore::without_migrations)).
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "idem_records",
        sql: include_str!("../../../../migrations/postgres/0001_idem_records.sql"),
    },
    Migration {
        version: 2,
        name: "idem_history",
        sql: include_str!("../../../../migrations/postgres/0002_idem_history.sql"),
    },
    Migration {
        version: 3,
        name: "idem_client_budget",
        sql: include_str!("../../../../migrations/postgres/0003_idem_client_budget.sql"),
    },
    Migration {
        version: 4,
        name: "idem_steps",
        sql: include_str!("../../../../migrations/postgres/0004_idem_steps.sql"),
    },
    Migration {
        version: 5,
        name: "idem_lease_ended",
        sql: include_str!("../../../../migrations/postgres/0005_idem_lease_ended.sql"),
    },
    Migration {
        version: 6,
        name: "idem_client_live",
        sql: include_str!("../../../../migrations/postgres/0006_idem_client_live.sql"),
    },
];

/// The advisory lock key that serialises idem's migrations across instances (the bytes
/// of `idem` as a number).
const MIGRATION_LOCK: i64 = 0x6964_656d;

const MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS idem_schema_migrations (
        version    BIGINT      PRIMARY KEY,
        name       TEXT        NOT NULL,
        applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )";

impl SqlStore<Postgres> {
    /// Applies the [`MIGRATIONS`] that `pool`'s database lacks, in one transaction under
    /// an advisory lock, and records them in `idem_schema_migrations`. Safe to call from
    /// several instances at once, and again.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the server fails or refuses a statement.
    pub async fn migrate(pool: &PgPool) -> Result<(), StoreError> {
        let mut tx = pool.begin().await.map_err(StoreError::unavailable)?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::unavailable)?;
        sqlx::query(MIGRATIONS_TABLE)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::unavailable)?;
        let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM idem_schema_migrations")
            .fetch_all(&mut *tx)
            .await
            .map_err(StoreError::unavailable)?;
        for migration in MIGRATIONS {
            if applied.contains(&migration.version) {
                continue;
            }
            sqlx::raw_sql(migration.sql)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::unavailable)?;
            sqlx::query("INSERT INTO idem_schema_migrations (version, name) VALUES ($1, $2)")
                .bind(migration.version)
                .bind(migration.name)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::unavailable)?;
        }
        tx.commit().await.map_err(StoreError::unavailable)
    }
}
