//! The PostgreSQL store: shared by many instances (feature `postgres`).

mod dialect;
mod migrations;
#[cfg(test)]
mod tests;
mod transactional;

use std::str::FromStr;
use std::time::Duration;

use sqlx::Postgres;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

pub use self::migrations::{MIGRATIONS, Migration};
use self::transactional::PostgresState;
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
/// The table `idem_records`, whose primary key `(operation, client, key)` is the last
/// line of defence against races, with an index on `expires_at` for purging and a
/// partial one on the lease's end of processing records for the reconciler's listing; and
/// `idem_steps`, the step journal (`crate::Journal`) and the outbox's staged deliveries,
/// keyed by `(operation_id, idx)` ([`MIGRATIONS`], also in
/// `idem-runtime/migrations/postgres/` as plain SQL). [`PostgresStore::connect`] and
/// [`PostgresStore::from_pool`] apply what is missing under an advisory lock, so that
/// instances starting together do not race, and record it in `idem_schema_migrations`;
/// the tables live in the connection's `search_path`.
///
/// # Atomicity
///
/// Registration is one `INSERT … ON CONFLICT DO NOTHING RETURNING`; only a key that
/// exists and may be taken again (its TTL passed, or released with the same
/// fingerprint) gets a second statement, a compare-and-set `UPDATE … WHERE … RETURNING`.
/// Every other change is one `UPDATE` whose `WHERE` names the lease's owner. PostgreSQL's
/// row locks order two updates of one record, and the second re-reads the row before it
/// applies its condition, so at most one of two racing owners wins.
///
/// # Partitions
///
/// No key stays held for long by an instance whose network to the server went silent:
///
/// - every call waits at most its call timeout for the server's answer
///   ([`DEFAULT_CALL_TIMEOUT`], [`SqlStore::with_call_timeout`]), and for a connection
///   of the pool its acquire timeout;
/// - an attempt's transaction is bounded on the server by the attempt's time left when
///   it begins and a grace (a quarter of it, at most 1 s): its `statement_timeout` and
///   its `idle_in_transaction_session_timeout`, set for that transaction only, in the
///   statement that reads its marker (no round trip is added). A transaction whose
///   client went silent while it held a lock (a row it inserted, the record it
///   completed) is ended by the server then, and another instance that took the key
///   over goes on;
/// - on the client, the attempt writes its record and commits by its deadline, or
///   rolls back in the background and answers; its lease, no longer renewed, ends
///   meanwhile;
/// - [`PostgresStore::connect`] asks the server to probe its end of every connection
///   ([`TCP_SETTINGS`]), so that a connection to a client gone silent is closed within
///   20 s (sqlx sets no keepalive on the client's end).
///
/// A pool the application configured ([`PostgresStore::from_pool`]) keeps its own
/// connection settings; the call timeout and the transaction's bounds apply to it all the
/// same. The settings need PostgreSQL 12 or later (`tcp_user_timeout`).
pub type PostgresStore = SqlStore<Postgres>;

/// How long a call of a PostgreSQL store waits for the server's answer to one statement
/// unless [`SqlStore::with_call_timeout`] says otherwise: 5 s, beside the 3 s wait for a
/// connection of [`PostgresStore::connect`]'s pool. A statement of idem's takes
/// milliseconds; one that waits longer, for a lock another transaction holds or for a
/// server that does not answer, fails its request with 503 rather than hold it.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The server's TCP settings [`PostgresStore::connect`] asks for each connection (as
/// startup options, no round trip), unless its URL sets them: the server probes a
/// connection idle for 5 s every 5 s, three times (`tcp_keepalives_idle`,
/// `tcp_keepalives_interval`, `tcp_keepalives_count`, in seconds), and closes one whose
/// data stays unacknowledged for 20 s (`tcp_user_timeout`, in milliseconds): a session
/// whose client went silent ends within about 20 s, whatever it was doing, instead of the
/// operating system's default of two hours and more. `tcp_user_timeout` needs PostgreSQL
/// 12 or later.
pub const TCP_SETTINGS: [(&str, &str); 4] = [
    ("tcp_keepalives_idle", "5"),
    ("tcp_keepalives_interval", "5"),
    ("tcp_keepalives_count", "3"),
    ("tcp_user_timeout", "20000"),
];

impl SqlStore<Postgres> {
    /// Connects to the server at `url` (`postgres://user@host/db?sslmode=…`, sqlx's
    /// form; TLS through rustls) and applies idem's migrations.
    ///
    /// # Default
    ///
    /// - at most 16 connections;
    /// - a call waits at most 3 s for a connection (then [`StoreError::Unavailable`],
    ///   answered with 503: a server that is down fails requests fast instead of holding
    ///   them), and at most [`DEFAULT_CALL_TIMEOUT`] (5 s) for the answer to each of its
    ///   statements;
    /// - connections are checked before use (sqlx's default), so that a restarted server
    ///   is reconnected to without restarting the service;
    /// - the server probes each connection and closes one gone silent within 20 s
    ///   ([`TCP_SETTINGS`], sent as startup options: a connection pooler in between must
    ///   pass them on, or the store be made with [`PostgresStore::from_pool`]).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the URL is malformed, the server cannot be
    /// reached or refuses the login, or the schema cannot be created.
    pub async fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        let options = PgConnectOptions::from_str(url).map_err(StoreError::unavailable)?;
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(3))
            .connect_with(with_tcp_settings(options))
            .await
            .map_err(StoreError::unavailable)?;
        PostgresStore::from_pool(pool).await
    }

    /// A store over a pool the application configured, applying idem's migrations.
    /// Its calls wait at most [`DEFAULT_CALL_TIMEOUT`] for each answer unless
    /// [`SqlStore::with_call_timeout`] says otherwise; the pool's connections keep the
    /// settings the application gave them (the server's probes of a silent connection,
    /// [`TCP_SETTINGS`], are the application's to ask for).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the schema cannot be created.
    pub async fn from_pool(pool: PgPool) -> Result<PostgresStore, StoreError> {
        PostgresStore::migrate(&pool).await?;
        Ok(PostgresStore::without_migrations(pool))
    }

    /// A store over a pool whose database already has idem's schema ([`MIGRATIONS`],
    /// applied by the team's own migration tool), with the call timeout of
    /// [`PostgresStore::from_pool`]. Runs no statement.
    pub fn without_migrations(pool: PgPool) -> PostgresStore {
        let state = PostgresState::for_pool(&pool);
        SqlStore::new(pool, state).with_call_timeout(DEFAULT_CALL_TIMEOUT)
    }
}

/// `options` with each of [`TCP_SETTINGS`] the URL's own startup options do not name.
fn with_tcp_settings(options: PgConnectOptions) -> PgConnectOptions {
    let given = options.get_options().unwrap_or_default().to_owned();
    let missing: Vec<_> = TCP_SETTINGS
        .into_iter()
        .filter(|(name, _)| !given.contains(&format!("{name}=")))
        .collect();
    if missing.is_empty() {
        options
    } else {
        options.options(missing)
    }
}
