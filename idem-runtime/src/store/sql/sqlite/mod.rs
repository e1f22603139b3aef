//! The SQLite store: embedded and durable (feature `sqlite`).

mod dialect;
mod health;
#[cfg(test)]
mod tests;
mod transactional;

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Sqlite;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use self::dialect::SqliteState;
use self::health::Health;
use super::SqlStore;
use crate::store::StoreError;
use crate::store::open::Bounds;

/// The busy timeout of a store opened without bounds of its own.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a call of a store opened without bounds of its own waits for a connection
/// of the pool: sqlx's default.
const POOL_WAIT: Duration = Duration::from_secs(30);

/// A durable [`Store`](crate::store::Store) in an SQLite database, through sqlx
/// ([`SqlStore`] over SQLite); also a
/// [`TransactionalStore`](crate::store::TransactionalStore), so that a handler's business
/// writes and its record commit in one transaction.
///
/// Records live in the table `idem_records`, primary key `(operation, client, key)`, with
/// an index on `expires_at` for purging and a partial one on the lease's end of
/// processing records for the reconciler's listing (as in PostgreSQL's migration 5), and
/// the step journal in `idem_steps` (as in PostgreSQL's migration 4); [`SqliteStore::open`] creates them if missing
/// (`CREATE … IF NOT EXISTS`, no migration table), so the store can share the
/// application's database. Times are unix milliseconds; results keep their body as a
/// BLOB, byte for byte, and their headers as JSON (a value that is not UTF-8 is written
/// as `{"hex": "…"}`).
///
/// `begin` reads the record first and answers from it when it is held or finished (no
/// write lock is taken, so a duplicate is answered at once even while another attempt's
/// transaction holds the lock); otherwise it is one `INSERT … ON CONFLICT DO UPDATE …
/// WHERE … RETURNING` inside a `BEGIN IMMEDIATE` transaction. Every other change is one
/// `UPDATE` with its ownership condition in the `WHERE` clause.
///
/// # Faults
///
/// A store opened with [`SqliteStore::open`] fails closed and heals without a restart:
///
/// - before every call it checks that the file at its path is the one it opened (device
///   and inode): a file moved away or removed answers [`StoreError::Unavailable`] (503),
///   and never creates a new empty database in its place (only `open` creates the file);
///   a file put back, or replaced, is used again through fresh connections;
/// - a call that fails in a way that leaves a connection unfit for writes (a read-only
///   file, an I/O error, a full disk, a corrupt or missing file) makes the pool replace
///   every connection opened before it, so that connections opened while the file was
///   read-only do not outlive the fault.
///
/// A store made with [`SqliteStore::from_pool`] uses the application's pool as it is
/// configured, without these checks.
///
/// # One writer
///
/// SQLite runs one writer at a time. In the transactional mode an attempt's transaction
/// (`BEGIN IMMEDIATE`) holds the write lock from the start of the handler to its commit,
/// so handlers that take the transaction run one after the other, and a registration of
/// another key waits for the lock up to the busy timeout (5 s) before it is answered with
/// 503. A file database serves one host; several instances need a shared store
/// (PostgreSQL).
pub type SqliteStore = SqlStore<Sqlite>;

/// The schema, created if missing. idem keeps its own table and does not use sqlx's
/// migration table, so it can share a database that has its own migrations.
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS idem_records (
        operation    TEXT    NOT NULL,
        client       TEXT    NOT NULL,
        key          TEXT    NOT NULL,
        operation_id TEXT    NOT NULL,
        fingerprint  TEXT    NOT NULL,
        state        TEXT    NOT NULL,
        attempt      INTEGER NOT NULL,
        token        TEXT,
        lease_until  INTEGER,
        created_at   INTEGER NOT NULL,
        expires_at   INTEGER NOT NULL,
        status       INTEGER,
        headers      TEXT,
        body         BLOB,
        reason       TEXT,
        transactional INTEGER NOT NULL DEFAULT 0,
        history      TEXT,
        stored_bytes INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (operation, client, key)
    )",
    "CREATE INDEX IF NOT EXISTS idem_records_expires_at ON idem_records (expires_at)",
    // The step journal (`crate::Journal`), as in PostgreSQL's migration 4.
    "CREATE TABLE IF NOT EXISTS idem_steps (
        operation_id TEXT    NOT NULL,
        idx          INTEGER NOT NULL,
        operation    TEXT    NOT NULL,
        client       TEXT    NOT NULL,
        key          TEXT    NOT NULL,
        name         TEXT    NOT NULL,
        state        TEXT    NOT NULL,
        value        TEXT,
        calls        INTEGER NOT NULL,
        next_at      INTEGER NOT NULL DEFAULT 0,
        expires_at   INTEGER NOT NULL,
        PRIMARY KEY (operation_id, idx)
    )",
    "CREATE INDEX IF NOT EXISTS idem_steps_expires_at ON idem_steps (expires_at)",
    "CREATE INDEX IF NOT EXISTS idem_steps_due ON idem_steps (next_at) WHERE state = 'staged'",
];

/// The columns that tables made by older versions lack, and the statement that adds each.
const ADDED_COLUMNS: [(&str, &str); 3] = [
    // Files made by idem 0.1.0 before the transactional mode.
    (
        "transactional",
        "ALTER TABLE idem_records ADD COLUMN transactional INTEGER NOT NULL DEFAULT 0",
    ),
    // Files made before the history of attempts (`store::ops`).
    (
        "history",
        "ALTER TABLE idem_records ADD COLUMN history TEXT",
    ),
    // Files made before the client budget (`store::budget`): their results are not
    // counted until they expire.
    (
        "stored_bytes",
        "ALTER TABLE idem_records ADD COLUMN stored_bytes INTEGER NOT NULL DEFAULT 0",
    ),
];

/// The indexes, made once every column is there: a client's live records, in the order
/// they expire, with their results' sizes (the client budget's count reads only this);
/// the lease's end of each processing record (the reconciler's listing of ended leases
/// reads it, as PostgreSQL's migration 5).
const INDEXES: &[&str] = &[
    "CREATE INDEX IF NOT EXISTS idem_records_client_budget
    ON idem_records (client, expires_at, stored_bytes)",
    "CREATE INDEX IF NOT EXISTS idem_records_lease_ended
    ON idem_records (lease_until) WHERE state = 'processing'",
];

impl SqlStore<Sqlite> {
    /// Opens (creating if missing) the database file at `path` and its schema.
    ///
    /// # Default
    ///
    /// - journal mode WAL, so readers do not block the writer;
    /// - `synchronous = FULL`: a completed record survives a power loss, not only a
    ///   process crash (a lost record could let a retry run the operation again);
    /// - busy timeout 5 s: a writer waits that long for the lock before the call fails
    ///   with [`StoreError::Unavailable`] (answered with 503, fail closed); a store
    ///   opened through [`crate::store::OpenOptions::timeout`] waits that timeout;
    /// - a pool of at most 8 connections, with the checks listed under "Faults" in
    ///   [`SqliteStore`]'s docs.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the file cannot be opened or created, or the
    /// schema cannot be created.
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_within(path.as_ref(), None).await
    }

    /// [`SqliteStore::open`], its waits bounded by `bounds` when given
    /// (`store::OpenOptions::timeout`): the busy timeout and the wait for a connection of
    /// the pool are `bounds.limit`, the client's wait for each statement's answer
    /// `bounds.call`.
    pub(crate) async fn open_within(
        path: &Path,
        bounds: Option<Bounds>,
    ) -> Result<SqliteStore, StoreError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(bounds.map_or(BUSY_TIMEOUT, |b| b.limit));
        let health = Health::new(Some(path.to_owned()));
        let (on_acquire, on_release) = (Arc::clone(&health), Arc::clone(&health));
        // No ping when a connection is taken (sqlx's default): a connection is a thread
        // of this process, and the ping a round trip to it on every call, inside the
        // one writer's turn for an attempt's transaction. A connection that broke fails
        // its next statement instead, and a fatal failure replaces every connection
        // (`Health`): one in use is closed when it is given back (`after_release`), not
        // left idle, where it may hold a transaction, and SQLite's write lock with it,
        // until the pool hands it out again; an idle one when it is next taken.
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(bounds.map_or(POOL_WAIT, |b| b.limit))
            .test_before_acquire(false)
            .before_acquire(move |_, meta| {
                let fresh = on_acquire.is_fresh(meta.age);
                Box::pin(async move { Ok(fresh) })
            })
            .after_release(move |_, meta| {
                let fresh = on_release.is_fresh(meta.age);
                Box::pin(async move { Ok(fresh) })
            })
            .connect_with(options.clone())
            .await
            .map_err(StoreError::unavailable)?;
        create_schema(&pool).await?;
        // Only `open` creates the file: a connection opened later, after the file was
        // moved or removed, must fail rather than start an empty database in its place.
        pool.set_connect_options(options.create_if_missing(false));
        let mut store = SqlStore::new(pool, SqliteState::new(health));
        if let Some(bounds) = bounds {
            store = store.with_call_timeout(bounds.call);
        }
        store.state.health.check_file()?;
        Ok(store)
    }

    /// Opens the database file at `path` of a service that already uses it (its table
    /// `idem_records` exists), as [`SqliteStore::open`] does but never creating the file
    /// or the table: what an operator's tool (`idem ops`) opens. A table made by an
    /// older version gets the columns it lacks, as `open` would add them.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the file is missing or cannot be opened, or holds
    /// no table `idem_records`.
    pub async fn open_existing(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        SqliteStore::open_existing_within(path.as_ref(), None).await
    }

    /// [`SqliteStore::open_existing`], its waits bounded as [`SqliteStore::open_within`]
    /// says.
    pub(crate) async fn open_existing_within(
        path: &Path,
        bounds: Option<Bounds>,
    ) -> Result<SqliteStore, StoreError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(false)
            .busy_timeout(bounds.map_or(BUSY_TIMEOUT, |b| b.limit));
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(bounds.map_or(POOL_WAIT, |b| b.limit))
            .connect_with(options)
            .await
            .map_err(|e| StoreError::unavailable(format!("cannot open {}: {e}", path.display())))?;
        let tables: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'idem_records'",
        )
        .fetch_one(&pool)
        .await
        .map_err(|e| StoreError::unavailable(format!("cannot read {}: {e}", path.display())))?;
        pool.close().await;
        if tables == 0 {
            return Err(StoreError::unavailable(format!(
                "{} holds no table `idem_records`: it is not the database of a service that uses idem's SQLite store",
                path.display()
            )));
        }
        SqliteStore::open_within(path, bounds).await
    }

    /// A private in-memory database, for tests: one connection that lives as long as the
    /// store, since every connection to `:memory:` is a database of its own. Not for the
    /// transactional mode, which needs a second connection while an attempt's
    /// transaction is open.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when SQLite cannot start.
    pub async fn in_memory() -> Result<SqliteStore, StoreError> {
        let options =
            SqliteConnectOptions::from_str("sqlite::memory:").map_err(StoreError::unavailable)?;
        let pool = SqlitePoolOptions::new()
            .min_connections(1)
            .max_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options)
            .await
            .map_err(StoreError::unavailable)?;
        SqliteStore::from_pool(pool).await
    }

    /// A store over a pool the application configured, creating the schema if missing.
    /// The pool is used as it is: the file and connection checks of [`SqliteStore::open`]
    /// are not installed.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the schema cannot be created.
    pub async fn from_pool(pool: SqlitePool) -> Result<SqliteStore, StoreError> {
        create_schema(&pool).await?;
        Ok(SqlStore::new(pool, SqliteState::new(Health::new(None))))
    }
}

/// Creates the schema if missing ([`SCHEMA`]), adds the [`ADDED_COLUMNS`] a table made
/// by an older version lacks, then the [`INDEXES`].
async fn create_schema(pool: &SqlitePool) -> Result<(), StoreError> {
    for statement in SCHEMA {
        sqlx::query(*statement)
            .execute(pool)
            .await
            .map_err(StoreError::unavailable)?;
    }
    for (column, add) in ADDED_COLUMNS {
        let has: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pragma_table_info('idem_records') WHERE name = $1",
        )
        .bind(column)
        .fetch_one(pool)
        .await
        .map_err(StoreError::unavailable)?;
        if has == 0 {
            sqlx::query(add)
                .execute(pool)
                .await
                .map_err(StoreError::unavailable)?;
        }
    }
    for statement in INDEXES {
        sqlx::query(*statement)
            .execute(pool)
            .await
            .map_err(StoreError::unavailable)?;
    }
    Ok(())
}
