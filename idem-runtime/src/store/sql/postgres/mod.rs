//! The PostgreSQL store: shared by many instances (feature `postgres`).

mod dialect;
mod migrations;
#[cfg(test)]
mod tests;
mod transactional;

use std::time::Duration;

use sqlx::Postgres;
use sqlx::postgres::{PgPool, PgPoolOptions};

pub use self::migrations::{MIGRATIONS, Migration};
use super::SqlStore;
use crate::store::StoreError;

/// A [`Store`](crate::store::Store) in PostgreSQL, through sqlx (rustls, no OpenSSL;
/// [`SqlStore`] over PostgreSQL): shared by every instance of a service, and a
/// [`TransactionalStore`](crate::store::TransactionalStore), so that a handler's business
/// writes and its record commit in one transaction.
///
/// ```no_run
/// # async fn run() -> Result<(), idem_runtime::store::StoreError> {
/// use idem_runtime::{Idem, identity, store::PostgresStore};
///
/// let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://localhost/app".into());
/// let store = PostgresStore::connect(&url).await?;
/// let idem = Idem::transactional(store, identity::header("x-client-id"));
/// # Ok(()) }
/// ```
///
/// # Schema
///
/// One table, `idem_records`, whose primary key `(operation, client, key)` is the last
/// line of defence against races, and an index on `expires_at` for purging
/// ([`MIGRATIONS`], also in `idem-runtime/migrations/postgres/` as plain SQL).
/// [`PostgresStore::connect`] and [`PostgresStore::from_pool`] apply what is missing under
/// an advisory lock, so that instances starting together do not race, and record it in
/// `idem_schema_migrations`; both tables live in the connection's `search_path`.
///
/// # Atomicity
///
/// Registration is one `INSERT … ON CONFLICT DO NOTHING RETURNING`; only a key that
/// exists and may be taken again (its TTL passed, or released with the same
/// fingerprint) gets a second statement, a compare-and-set `UPDATE … WHERE … RETURNING`.
/// Every other change is one `UPDATE` whose `WHERE` names the lease's owner. PostgreSQL's
/// row locks order two updates of one record, and the second re-reads the row before it
/// applies its condition, so at most one of two racing owners wins.
pub type PostgresStore = SqlStore<Postgres>;

impl SqlStore<Postgres> {
    /// Connects to the server at `url` (`postgres://user@host/db?sslmode=…`, sqlx's
    /// form; TLS through rustls) and applies idem's migrations.
    ///
    /// # Default
    ///
    /// - at most 16 connections;
    /// - a call waits at most 3 s for a connection (then [`StoreError::Unavailable`],
    ///   answered with 503: a server that is down fails requests fast instead of holding
    ///   them);
    /// - connections are checked before use (sqlx's default), so that a restarted server
    ///   is reconnected to without restarting the service.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the URL is malformed, the server cannot be
    /// reached or refuses the login, or the schema cannot be created.
    pub async fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(3))
            .connect(url)
            .await
            .map_err(StoreError::unavailable)?;
        PostgresStore::from_pool(pool).await
    }

    /// A store over a pool the application configured, applying idem's migrations.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the schema cannot be created.
    pub async fn from_pool(pool: PgPool) -> Result<PostgresStore, StoreError> {
        PostgresStore::migrate(&pool).await?;
        Ok(PostgresStore::without_migrations(pool))
    }

    /// A store over a pool whose database already has idem's schema ([`MIGRATIONS`],
    /// applied by the team's own migration tool). Runs no statement.
    pub fn without_migrations(pool: PgPool) -> PostgresStore {
        SqlStore::new(pool, ())
    }
}
