//! The SQLite store: embedded and durable (feature `sqlite`).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sqlx::Sqlite;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use tokio::sync::Semaphore;

use crate::store::headers::encode_headers;
use crate::store::ops::{self, Event};
use crate::store::sql::rows::{
    changed_one, decode, decode_inspected, decode_listed, resolution_columns, sql_ms,
};
use crate::store::{
    Begin, DEFAULT_MAX_RESULT, Inspection, Lease, ListQuery, Listed, NewRecord, OpenTransaction,
    OperatorStore, OwnerToken, Record, RecordKey, RecordStore, Reservation, Resolve, StoreError,
    StoredResponse, TransactionalStore, UnixMillis, check_size,
};

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
        PRIMARY KEY (operation, client, key)
    )",
    "CREATE INDEX IF NOT EXISTS idem_records_expires_at ON idem_records (expires_at)",
];

/// `begin` as one statement: insert, or on conflict take the row only when its TTL has
/// passed (a new operation) or it is released with the same fingerprint (attempt + 1).
/// `$7` is the lease's end, `$8` is `now`, `$11` the end of the attempt's time;
/// `expires_at` is never before the lease's end nor the attempt's
/// (`Record::begin_over`). SQLite evaluates every SET expression against the old row.
const BEGIN: &str = "INSERT INTO idem_records
        (operation, client, key, operation_id, fingerprint, state, attempt, token,
         lease_until, created_at, expires_at, transactional)
    VALUES ($1, $2, $3, $4, $5, 'processing', 1, $6, $7, $8, MAX($9, $7, $11), $10)
    ON CONFLICT (operation, client, key) DO UPDATE SET
        operation_id = CASE WHEN idem_records.expires_at <= $8 THEN excluded.operation_id
                            ELSE idem_records.operation_id END,
        attempt      = CASE WHEN idem_records.expires_at <= $8 THEN 1
                            ELSE idem_records.attempt + 1 END,
        created_at   = CASE WHEN idem_records.expires_at <= $8 THEN excluded.created_at
                            ELSE idem_records.created_at END,
        expires_at   = CASE WHEN idem_records.expires_at <= $8 THEN excluded.expires_at
                            ELSE MAX(idem_records.expires_at, excluded.lease_until, $11) END,
        fingerprint  = excluded.fingerprint,
        state        = 'processing',
        token        = excluded.token,
        lease_until  = excluded.lease_until,
        transactional = excluded.transactional,
        status = NULL, headers = NULL, body = NULL, reason = NULL,
        history      = CASE WHEN idem_records.expires_at <= $8 THEN NULL ELSE
            CASE WHEN json_array_length(COALESCE(idem_records.history, '[]')) >= 32
                 THEN json_insert(json_remove(idem_records.history, '$[0]'), '$[#]',
                      json_object('attempt', idem_records.attempt + 1, 'began_at', $8, 'after', 'released'))
                 ELSE json_insert(COALESCE(idem_records.history, '[]'), '$[#]',
                      json_object('attempt', idem_records.attempt + 1, 'began_at', $8, 'after', 'released'))
            END END
    WHERE idem_records.expires_at <= $8
       OR (idem_records.state = 'released' AND idem_records.fingerprint = excluded.fingerprint)
    RETURNING operation_id, fingerprint, state, attempt, token, lease_until,
              created_at, expires_at, status, headers, body, reason, transactional";

/// The record as it stands, expired or not (`begin` decides).
const SELECT: &str = "SELECT operation_id, fingerprint, state, attempt, token, lease_until,
        created_at, expires_at, status, headers, body, reason, transactional
    FROM idem_records WHERE operation = $1 AND client = $2 AND key = $3";

const GET: &str = "SELECT operation_id, fingerprint, state, attempt, token, lease_until,
        created_at, expires_at, status, headers, body, reason, transactional
    FROM idem_records WHERE operation = $1 AND client = $2 AND key = $3 AND expires_at > $4";

/// `$4` token, `$5` now: the owner of a live lease.
const COMPLETE: &str = "UPDATE idem_records
    SET state = 'completed', token = NULL, lease_until = NULL,
        status = $6, headers = $7, body = $8, reason = NULL
    WHERE operation = $1 AND client = $2 AND key = $3
      AND state = 'processing' AND token = $4 AND lease_until > $5";

/// [`COMPLETE`] inside an attempt's transaction, which holds the write lock: the owner
/// token alone (`$4`) fences.
const COMPLETE_LOCKED: &str = "UPDATE idem_records
    SET state = 'completed', token = NULL, lease_until = NULL,
        status = $5, headers = $6, body = $7, reason = NULL
    WHERE operation = $1 AND client = $2 AND key = $3
      AND state = 'processing' AND token = $4";

/// [`RELEASE`] inside an attempt's transaction, which holds the write lock: the owner
/// token alone (`$4`) fences.
const RELEASE_LOCKED: &str = "UPDATE idem_records
    SET state = 'released', token = NULL, lease_until = NULL
    WHERE operation = $1 AND client = $2 AND key = $3
      AND state = 'processing' AND token = $4";

const RELEASE: &str = "UPDATE idem_records
    SET state = 'released', token = NULL, lease_until = NULL
    WHERE operation = $1 AND client = $2 AND key = $3
      AND state = 'processing' AND token = $4 AND lease_until > $5";

/// `$4` token, `$5` the lease's new end (`Record::renewed`): the owner, live lease or
/// ended.
const RENEW: &str = "UPDATE idem_records
    SET lease_until = $5,
        expires_at = CASE WHEN expires_at < $5 THEN $5 ELSE expires_at END
    WHERE operation = $1 AND client = $2 AND key = $3
      AND state = 'processing' AND token = $4";

/// `$4` token: the current owner, live lease or ended.
const PARK: &str = "UPDATE idem_records
    SET state = 'unknown', token = NULL, lease_until = NULL, reason = $5
    WHERE operation = $1 AND client = $2 AND key = $3
      AND state = 'processing' AND token = $4";

/// `$4` expected token, `$5` now, `$6` new token, `$7` new lease end (`Record::leased`);
/// the takeover is appended to the history (`store::ops`, at most 32 events).
const TAKE_OVER: &str = "UPDATE idem_records
    SET token = $6, lease_until = $7, attempt = attempt + 1, expires_at = MAX(expires_at, $7),
        history = CASE WHEN json_array_length(COALESCE(history, '[]')) >= 32
            THEN json_insert(json_remove(history, '$[0]'), '$[#]', json_object('attempt',
                 attempt + 1, 'began_at', $5, 'after', 'lease-ended', 'lease_until', lease_until))
            ELSE json_insert(COALESCE(history, '[]'), '$[#]', json_object('attempt',
                 attempt + 1, 'began_at', $5, 'after', 'lease-ended', 'lease_until', lease_until))
        END
    WHERE operation = $1 AND client = $2 AND key = $3
      AND state = 'processing' AND token = $4 AND lease_until <= $5 AND expires_at > $5
    RETURNING operation_id, fingerprint, state, attempt, token, lease_until,
              created_at, expires_at, status, headers, body, reason, transactional";

const PURGE: &str = "DELETE FROM idem_records WHERE expires_at <= $1";

/// `$1` now, `$2` operation or NULL, `$3` state or NULL, `$4` only ended leases (0 or 1),
/// `$5`..`$7` the cursor or NULLs, `$8` the page. Text compares bytewise (BINARY).
const LIST: &str = "SELECT operation, client, key, operation_id, fingerprint, state, attempt,
        token, lease_until, created_at, expires_at, status, headers, body, reason, transactional
    FROM idem_records
    WHERE expires_at > $1
      AND ($2 IS NULL OR operation = $2)
      AND ($3 IS NULL OR state = $3)
      AND ($4 = 0 OR (state = 'processing' AND lease_until <= $1))
      AND ($5 IS NULL OR (operation, client, key) > ($5, $6, $7))
    ORDER BY operation, client, key
    LIMIT $8";

const INSPECT: &str = "SELECT operation_id, fingerprint, state, attempt, token, lease_until,
        created_at, expires_at, status, headers, body, reason, transactional,
        CAST(history AS TEXT) AS history
    FROM idem_records WHERE operation = $1 AND client = $2 AND key = $3 AND expires_at > $4";

/// An operator's resolution: `$4` the attempt seen parked, `$5` the new state, `$6`..`$8`
/// the result or NULLs, `$9` the resolution's event (its `parked` taken from the row),
/// `$10` now.
const RESOLVE: &str = "UPDATE idem_records
    SET state = $5, status = $6, headers = $7, body = $8, reason = NULL,
        history = CASE WHEN json_array_length(COALESCE(history, '[]')) >= 32
            THEN json_insert(json_remove(history, '$[0]'), '$[#]',
                 json_set(json($9), '$.parked', COALESCE(reason, '')))
            ELSE json_insert(COALESCE(history, '[]'), '$[#]',
                 json_set(json($9), '$.parked', COALESCE(reason, '')))
        END
    WHERE operation = $1 AND client = $2 AND key = $3
      AND state = 'unknown' AND attempt = $4 AND expires_at > $10
    RETURNING operation_id, fingerprint, state, attempt, token, lease_until,
              created_at, expires_at, status, headers, body, reason, transactional";

/// SQLite's primary result codes that mean a connection can no longer be trusted with
/// writes: `SQLITE_READONLY` (8: opened while the file was read-only, or the file moved),
/// `SQLITE_IOERR` (10), `SQLITE_CORRUPT` (11), `SQLITE_FULL` (13), `SQLITE_CANTOPEN` (14)
/// and `SQLITE_NOTADB` (26). `SQLITE_BUSY` (5) is not among them: waiting for the lock
/// ran out, the connection is fine.
const FATAL_CODES: [i32; 6] = [8, 10, 11, 13, 14, 26];

/// A durable [`Store`](crate::store::Store) in an SQLite database, through sqlx; also a
/// [`TransactionalStore`], so that a handler's business writes and its record commit in
/// one transaction.
///
/// Records live in the table `idem_records`, primary key `(operation, client, key)`, with
/// an index on `expires_at` for purging; [`SqliteStore::open`] creates both if missing
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
#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    health: Arc<Health>,
    /// One transaction at a time: waiting here holds no connection of the pool.
    writer: Arc<Semaphore>,
    max_result: usize,
}

/// What the store knows of its file and its connections' fitness.
#[derive(Debug)]
struct Health {
    /// The file the store was opened on and its identity (device, inode) when last
    /// seen; `None` for an in-memory database or an application's pool.
    file: Option<(PathBuf, Mutex<Option<FileIdentity>>)>,
    /// The time `reset_after` counts from.
    epoch: Instant,
    /// Connections opened before this many nanoseconds after `epoch` are closed
    /// instead of handed out (0: none).
    reset_after: AtomicU64,
}

impl Health {
    fn new(file: Option<PathBuf>) -> Arc<Health> {
        Arc::new(Health {
            file: file.map(|path| (path, Mutex::new(None))),
            epoch: Instant::now(),
            reset_after: AtomicU64::new(0),
        })
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// From now on, every connection opened before now is replaced.
    fn recycle(&self) {
        self.reset_after
            .store(self.nanos(Instant::now()).max(1), Ordering::SeqCst);
    }

    /// Whether a connection that is `age` old may be handed out.
    fn is_fresh(&self, age: Duration) -> bool {
        let reset_after = self.reset_after.load(Ordering::SeqCst);
        match Instant::now().checked_sub(age) {
            Some(opened) => self.nanos(opened) >= reset_after,
            None => reset_after == 0,
        }
    }

    /// Checks that the file at the store's path is there and is the one last seen.
    fn check_file(&self) -> Result<(), StoreError> {
        let Some((path, seen)) = &self.file else {
            return Ok(());
        };
        let identity = match std::fs::metadata(path) {
            Ok(meta) => file_identity(&meta),
            Err(error) => {
                self.recycle();
                return Err(StoreError::unavailable(format!(
                    "the database file {} cannot be found ({error}): it was moved or removed while the service was running",
                    path.display()
                )));
            }
        };
        let mut seen = seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.is_some_and(|known| known != identity) {
            tracing::warn!(
                path = %path.display(),
                "idem: the SQLite file was replaced while the service was running; reopening its connections"
            );
            self.recycle();
        }
        *seen = Some(identity);
        Ok(())
    }
}

/// A file's device and inode number: what stays the same when a file is renamed back
/// into place, and changes when it is replaced by a copy.
type FileIdentity = (u64, u64);

#[cfg(unix)]
fn file_identity(meta: &std::fs::Metadata) -> FileIdentity {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

#[cfg(not(unix))]
fn file_identity(_: &std::fs::Metadata) -> FileIdentity {
    (0, 0)
}

impl SqliteStore {
    /// Opens (creating if missing) the database file at `path` and its schema.
    ///
    /// # Default
    ///
    /// - journal mode WAL, so readers do not block the writer;
    /// - `synchronous = FULL`: a completed record survives a power loss, not only a
    ///   process crash (a lost record could let a retry run the operation again);
    /// - busy timeout 5 s: a writer waits that long for the lock before the call fails
    ///   with [`StoreError::Unavailable`] (answered with 503, fail closed);
    /// - a pool of at most 8 connections, with the checks listed under "Faults" above.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the file cannot be opened or created, or the
    /// schema cannot be created.
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        let health = Health::new(Some(path));
        let hook = Arc::clone(&health);
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .before_acquire(move |_, meta| {
                let fresh = hook.is_fresh(meta.age);
                Box::pin(async move { Ok(fresh) })
            })
            .connect_with(options.clone())
            .await
            .map_err(StoreError::unavailable)?;
        create_schema(&pool).await?;
        // Only `open` creates the file: a connection opened later, after the file was
        // moved or removed, must fail rather than start an empty database in its place.
        pool.set_connect_options(options.create_if_missing(false));
        let store = SqliteStore::with_health(pool, health);
        store.health.check_file()?;
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
        let path = path.as_ref();
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(false)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
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
        SqliteStore::open(path).await
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
        Ok(SqliteStore::with_health(pool, Health::new(None)))
    }

    fn with_health(pool: SqlitePool, health: Arc<Health>) -> SqliteStore {
        SqliteStore {
            pool,
            health,
            writer: Arc::new(Semaphore::new(1)),
            max_result: DEFAULT_MAX_RESULT,
        }
    }

    /// The same store, keeping results of up to `bytes` bytes
    /// ([`StoredResponse::size`]; [`DEFAULT_MAX_RESULT`] unless set): a larger one is
    /// refused with [`StoreError::TooLarge`] before anything is written.
    #[must_use]
    pub fn with_max_result(mut self, bytes: usize) -> SqliteStore {
        self.max_result = bytes;
        self
    }

    /// The pool, to share it with the application: create the business tables through
    /// it, and read. A contracted handler's business writes go through its transaction
    /// (`SqliteTx`), so that they commit with the record.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Closes every connection, waiting for them to finish; later calls fail with
    /// [`StoreError::Unavailable`].
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// A connection for one call, after checking the file.
    async fn conn(&self) -> Result<PoolConnection<Sqlite>, StoreError> {
        self.health.check_file()?;
        self.pool.acquire().await.map_err(|e| self.fault(e))
    }

    async fn read(
        &self,
        conn: &mut SqliteConnection,
        key: &RecordKey,
    ) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(SELECT)
            .bind(&key.operation)
            .bind(&key.client)
            .bind(&key.key)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| self.fault(e))?;
        row.as_ref().map(decode).transpose()
    }

    async fn begin_locked(
        &self,
        conn: &mut SqliteConnection,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
    ) -> Result<Begin, StoreError> {
        let written = sqlx::query(BEGIN)
            .bind(&key.operation)
            .bind(&key.client)
            .bind(&key.key)
            .bind(new.operation_id.to_string())
            .bind(&new.fingerprint)
            .bind(new.lease.token.to_string())
            .bind(sql_ms(new.lease.until))
            .bind(sql_ms(now))
            .bind(sql_ms(new.expires_at))
            .bind(new.transactional)
            .bind(sql_ms(new.holds_until))
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| self.fault(e))?;
        match written {
            Some(row) => Ok(Begin::Started(decode(&row)?)),
            None => match self.read(conn, key).await? {
                Some(record) => Ok(Begin::Exists(record)),
                None => Err(StoreError::Corrupt(
                    "the record vanished inside its own transaction".into(),
                )),
            },
        }
    }

    /// The completion's compare-and-set, on `conn` (in a transaction or not).
    async fn complete_on(
        &self,
        conn: &mut SqliteConnection,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        check_size(response, self.max_result)?;
        let result = sqlx::query(COMPLETE)
            .bind(&key.operation)
            .bind(&key.client)
            .bind(&key.key)
            .bind(token.to_string())
            .bind(sql_ms(now))
            .bind(i64::from(response.status))
            .bind(encode_headers(&response.headers))
            .bind(response.body.as_ref())
            .execute(&mut *conn)
            .await
            .map_err(|e| self.fault(e))?;
        changed_one(result.rows_affected())
    }

    /// One `UPDATE` of a record; the lease is lost unless it changed exactly one row.
    async fn update(
        &self,
        query: sqlx::query::Query<'_, Sqlite, sqlx::sqlite::SqliteArguments>,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        let result = query.execute(&mut *conn).await.map_err(|e| self.fault(e))?;
        changed_one(result.rows_affected())
    }
}

async fn create_schema(pool: &SqlitePool) -> Result<(), StoreError> {
    for statement in SCHEMA {
        sqlx::query(*statement)
            .execute(pool)
            .await
            .map_err(StoreError::unavailable)?;
    }
    // Files made by idem 0.1.0 before the transactional mode lack the column.
    let has_mode: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pragma_table_info('idem_records') WHERE name = 'transactional'",
    )
    .fetch_one(pool)
    .await
    .map_err(StoreError::unavailable)?;
    if has_mode == 0 {
        sqlx::query("ALTER TABLE idem_records ADD COLUMN transactional INTEGER NOT NULL DEFAULT 0")
            .execute(pool)
            .await
            .map_err(StoreError::unavailable)?;
    }
    // Files made before the history of attempts (`store::ops`) lack its column.
    let has_history: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pragma_table_info('idem_records') WHERE name = 'history'",
    )
    .fetch_one(pool)
    .await
    .map_err(StoreError::unavailable)?;
    if has_history == 0 {
        sqlx::query("ALTER TABLE idem_records ADD COLUMN history TEXT")
            .execute(pool)
            .await
            .map_err(StoreError::unavailable)?;
    }
    Ok(())
}

/// Whether `error` leaves the connection unfit for further writes ([`FATAL_CODES`], or
/// the connection itself broke).
fn is_fatal(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            .is_some_and(|code| FATAL_CODES.contains(&(code & 0xff))),
        sqlx::Error::Io(_) | sqlx::Error::WorkerCrashed | sqlx::Error::Protocol(_) => true,
        _ => false,
    }
}

#[async_trait]
impl RecordStore for SqliteStore {
    async fn begin(
        &self,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
    ) -> Result<Begin, StoreError> {
        let mut conn = self.conn().await?;
        // A held or finished key is answered from a plain read, without the write lock.
        if let Some(record) = self.read(&mut conn, key).await?
            && record.begin_over(new, now).is_none()
        {
            return Ok(Begin::Exists(record));
        }
        let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE")
            .await
            .map_err(|e| self.fault(e))?;
        let outcome = self.begin_locked(&mut tx, key, new, now).await?;
        tx.commit().await.map_err(|e| self.fault(e))?;
        Ok(outcome)
    }

    async fn get(&self, key: &RecordKey, now: UnixMillis) -> Result<Option<Record>, StoreError> {
        let mut conn = self.conn().await?;
        let row = sqlx::query(GET)
            .bind(&key.operation)
            .bind(&key.client)
            .bind(&key.key)
            .bind(sql_ms(now))
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| self.fault(e))?;
        row.as_ref().map(decode).transpose()
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        self.complete_on(&mut conn, key, token, response, now).await
    }

    async fn release(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.update(
            sqlx::query(RELEASE)
                .bind(&key.operation)
                .bind(&key.client)
                .bind(&key.key)
                .bind(token.to_string())
                .bind(sql_ms(now)),
        )
        .await
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        until: UnixMillis,
        _now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.update(
            sqlx::query(RENEW)
                .bind(&key.operation)
                .bind(&key.client)
                .bind(&key.key)
                .bind(token.to_string())
                .bind(sql_ms(until)),
        )
        .await
    }

    async fn park_unknown(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        reason: &str,
        _now: UnixMillis,
    ) -> Result<(), StoreError> {
        self.update(
            sqlx::query(PARK)
                .bind(&key.operation)
                .bind(&key.client)
                .bind(&key.key)
                .bind(token.to_string())
                .bind(reason),
        )
        .await
    }

    async fn take_over(
        &self,
        key: &RecordKey,
        expected: OwnerToken,
        new_lease: Lease,
        now: UnixMillis,
    ) -> Result<Record, StoreError> {
        let mut conn = self.conn().await?;
        let row = sqlx::query(TAKE_OVER)
            .bind(&key.operation)
            .bind(&key.client)
            .bind(&key.key)
            .bind(expected.to_string())
            .bind(sql_ms(now))
            .bind(new_lease.token.to_string())
            .bind(sql_ms(new_lease.until))
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| self.fault(e))?;
        match row {
            Some(row) => decode(&row),
            None => Err(StoreError::LeaseLost),
        }
    }
}

#[async_trait]
impl OperatorStore for SqliteStore {
    async fn purge_expired(&self, now: UnixMillis) -> Result<u64, StoreError> {
        let mut conn = self.conn().await?;
        let result = sqlx::query(PURGE)
            .bind(sql_ms(now))
            .execute(&mut *conn)
            .await
            .map_err(|e| self.fault(e))?;
        Ok(result.rows_affected())
    }

    async fn list(&self, query: &ListQuery, now: UnixMillis) -> Result<Vec<Listed>, StoreError> {
        let mut conn = self.conn().await?;
        let after = query.after.as_ref();
        let rows = sqlx::query(LIST)
            .bind(sql_ms(now))
            .bind(query.operation.as_deref())
            .bind(query.state.map(|s| s.as_str()))
            .bind(query.lease_ended)
            .bind(after.map(|k| k.operation.as_str()))
            .bind(after.map(|k| k.client.as_str()))
            .bind(after.map(|k| k.key.as_str()))
            .bind(i64::from(query.page()))
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| self.fault(e))?;
        rows.iter().map(decode_listed).collect()
    }

    async fn inspect(
        &self,
        key: &RecordKey,
        now: UnixMillis,
    ) -> Result<Option<Inspection>, StoreError> {
        let mut conn = self.conn().await?;
        let row = sqlx::query(INSPECT)
            .bind(&key.operation)
            .bind(&key.client)
            .bind(&key.key)
            .bind(sql_ms(now))
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| self.fault(e))?;
        row.as_ref()
            .map(|row| decode_inspected(key, row))
            .transpose()
    }

    async fn resolve(
        &self,
        key: &RecordKey,
        resolve: &Resolve,
        now: UnixMillis,
    ) -> Result<Record, StoreError> {
        let (state, status, headers, body) = resolution_columns(resolve, self.max_result)?;
        let mut conn = self.conn().await?;
        let row = sqlx::query(RESOLVE)
            .bind(&key.operation)
            .bind(&key.client)
            .bind(&key.key)
            .bind(i64::from(resolve.expected_attempt))
            .bind(state)
            .bind(status)
            .bind(headers)
            .bind(body)
            .bind(Event::resolved(resolve.expected_attempt, "", resolve, now).to_json())
            .bind(sql_ms(now))
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| self.fault(e))?;
        if let Some(row) = row {
            return decode(&row);
        }
        drop(conn);
        let current = self.get(key, now).await?;
        Err(ops::refused(current.as_ref(), resolve.expected_attempt))
    }
}

/// How long an attempt waits for the one writer's turn before it is answered with 503:
/// the busy timeout of the connections.
const WRITER_WAIT: Duration = Duration::from_secs(5);

#[async_trait]
impl TransactionalStore for SqliteStore {
    type Database = Sqlite;

    /// This store's one writer permit (transactions run one at a time), waited for at
    /// most 5 s (the busy timeout): the wait holds no connection of the pool and happens
    /// before the key is registered.
    async fn reserve(&self) -> Result<Reservation, StoreError> {
        let permit = tokio::time::timeout(WRITER_WAIT, Arc::clone(&self.writer).acquire_owned())
            .await
            .map_err(|_| {
                StoreError::unavailable(
                    "another attempt's transaction held SQLite's one writer for 5 s",
                )
            })?
            .map_err(StoreError::unavailable)?;
        Ok(Reservation::new(Some(permit)))
    }

    fn try_reserve(&self) -> Option<Reservation> {
        let permit = Arc::clone(&self.writer).try_acquire_owned().ok()?;
        Some(Reservation::new(Some(permit)))
    }

    /// `BEGIN IMMEDIATE` on a connection of the pool: the write lock is taken at the
    /// start, so that the transaction never fails halfway because another connection
    /// wrote first. Its marker is a random number written in a temporary table inside
    /// the transaction: gone if SQLite rolls the transaction back by itself.
    async fn begin_transaction(
        &self,
        reservation: Reservation,
    ) -> Result<OpenTransaction<Sqlite>, StoreError> {
        self.health.check_file()?;
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| self.fault(e))?;
        let marker = i64::from_ne_bytes(
            uuid::Uuid::new_v4().as_bytes()[..8]
                .try_into()
                .unwrap_or([0; 8]),
        );
        sqlx::query("CREATE TEMP TABLE IF NOT EXISTS idem_tx_marker (marker INTEGER NOT NULL)")
            .execute(&mut *tx)
            .await
            .map_err(|e| self.fault(e))?;
        sqlx::query("INSERT INTO temp.idem_tx_marker (marker) VALUES (?)")
            .bind(marker)
            .execute(&mut *tx)
            .await
            .map_err(|e| self.fault(e))?;
        // What the handler writes comes after this savepoint, so that it can be undone
        // while the key is released in the same transaction (`release_in`).
        sqlx::query("SAVEPOINT idem_business")
            .execute(&mut *tx)
            .await
            .map_err(|e| self.fault(e))?;
        Ok(OpenTransaction::new(tx, marker, reservation))
    }

    async fn complete_in(
        &self,
        tx: &mut OpenTransaction<Sqlite>,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        check_size(response, self.max_result)?;
        let ended = || {
            StoreError::TransactionEnded(
                "SQLite rolled it back before idem could commit (a conflict clause such as `OR ROLLBACK`, or a trigger's `RAISE(ROLLBACK)`)"
                    .into(),
            )
        };
        let found = sqlx::query("DELETE FROM temp.idem_tx_marker WHERE marker = ?")
            .bind(tx.marker)
            .execute(&mut *tx.tx)
            .await;
        match found {
            Ok(result) if result.rows_affected() == 1 => {}
            Ok(_) => return Err(ended()),
            Err(sqlx::Error::Database(db)) if db.message().contains("no such table") => {
                return Err(ended());
            }
            Err(error) => return Err(self.fault(error)),
        }
        // The transaction holds the only write lock since its `BEGIN IMMEDIATE`, after
        // the key was registered: no other writer can have taken the record over
        // meanwhile, so the owner token is the whole fence (the lease is not renewed
        // while the lock is held, and may have run out on the clock).
        let _ = now;
        let result = sqlx::query(COMPLETE_LOCKED)
            .bind(&key.operation)
            .bind(&key.client)
            .bind(&key.key)
            .bind(token.to_string())
            .bind(i64::from(response.status))
            .bind(encode_headers(&response.headers))
            .bind(response.body.as_ref())
            .execute(&mut *tx.tx)
            .await
            .map_err(|e| self.fault(e))?;
        changed_one(result.rows_affected())
    }

    /// `ROLLBACK TO SAVEPOINT idem_business` (what the handler wrote is undone, the lock
    /// is kept), then the release by the owner token alone, in the same transaction.
    async fn release_in(
        &self,
        tx: &mut OpenTransaction<Sqlite>,
        key: &RecordKey,
        token: OwnerToken,
    ) -> Result<bool, StoreError> {
        match sqlx::query("ROLLBACK TO SAVEPOINT idem_business")
            .execute(&mut *tx.tx)
            .await
        {
            Ok(_) => {}
            Err(sqlx::Error::Database(db)) if db.message().contains("no such savepoint") => {
                return Err(StoreError::TransactionEnded(
                    "SQLite rolled it back by itself, or the handler ended it".into(),
                ));
            }
            Err(error) => return Err(self.fault(error)),
        }
        let result = sqlx::query(RELEASE_LOCKED)
            .bind(&key.operation)
            .bind(&key.client)
            .bind(&key.key)
            .bind(token.to_string())
            .execute(&mut *tx.tx)
            .await
            .map_err(|e| self.fault(e))?;
        changed_one(result.rows_affected()).map(|()| true)
    }

    fn fences_by_lock(&self) -> bool {
        true
    }

    fn fault(&self, error: sqlx::Error) -> StoreError {
        if is_fatal(&error) {
            tracing::warn!(error = %error, "idem: an SQLite connection failed; the pool replaces its connections");
            self.health.recycle();
        }
        StoreError::unavailable(error)
    }

    /// sqlx still counts the connection as inside a transaction: the pool replaces every
    /// connection opened before now, that one included.
    fn rollback_failed(&self, error: sqlx::Error) -> StoreError {
        tracing::warn!(error = %error, "idem: a rollback failed; the pool replaces its connections");
        self.health.recycle();
        StoreError::unavailable(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RecordState;
    use crate::store::conformance::{self, T0, created, key, new_record};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn in_memory_passes_the_conformance_suite() {
        conformance::run(|| async { SqliteStore::in_memory().await.unwrap() }).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn file_passes_the_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let counter = std::sync::atomic::AtomicUsize::new(0);
        conformance::run(|| {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = dir.path().join(format!("idem-{n}.db"));
            async move { SqliteStore::open(path).await.unwrap() }
        })
        .await;
    }

    /// A completed record survives closing the pool and opening the file again, byte for
    /// byte.
    #[tokio::test]
    async fn completed_records_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idem.db");
        let store = SqliteStore::open(&path).await.unwrap();
        let k = key("durable");
        let new = new_record("sha256:a", T0);
        store.begin(&k, &new, T0).await.unwrap();
        let mut response = created();
        response.body = bytes::Bytes::from_static(b"{\"id\":1}\n\x00\xff");
        store
            .complete(&k, new.lease.token, &response, T0)
            .await
            .unwrap();
        let before = store.get(&k, T0).await.unwrap().unwrap();
        store.close().await;
        assert!(
            store.get(&k, T0).await.is_err(),
            "a closed store is unavailable"
        );

        let reopened = SqliteStore::open(&path).await.unwrap();
        let after = reopened.get(&k, T0).await.unwrap().unwrap();
        assert_eq!(after, before);
        assert_eq!(after.state, RecordState::Completed { response });
    }

    fn unavailable<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) {
        assert!(
            matches!(result, Err(StoreError::Unavailable(_))),
            "{what}: {result:?}"
        );
    }

    /// Connections that turned read-only (here `PRAGMA query_only` on every connection of
    /// the pool; on disk, connections opened while the file was read-only): the first
    /// write fails as `Unavailable` (503, fail closed), never as `LeaseLost` or a panic,
    /// the record is left as it was, and the pool replaces those connections, so the next
    /// write succeeds without a restart.
    #[tokio::test]
    async fn read_only_connections_fail_closed_and_are_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("ro.db")).await.unwrap();
        let k = key("read-only");
        let new = new_record("sha256:a", T0);
        store.begin(&k, &new, T0).await.unwrap();
        let before = store.get(&k, T0).await.unwrap().unwrap();

        let mut all = Vec::new();
        for _ in 0..8 {
            let mut conn = store.pool().acquire().await.unwrap();
            sqlx::query("PRAGMA query_only = ON")
                .execute(&mut *conn)
                .await
                .unwrap();
            all.push(conn);
        }
        drop(all);
        unavailable(
            store.complete(&k, new.lease.token, &created(), T0).await,
            "complete on a read-only connection",
        );
        assert_eq!(
            store.get(&k, T0).await.unwrap().unwrap(),
            before,
            "the record is unchanged"
        );
        store
            .complete(&k, new.lease.token, &created(), T0 + 1)
            .await
            .expect("fresh connections: the owner completes without a restart");
        let fresh = key("after");
        store
            .begin(&fresh, &new_record("sha256:a", T0), T0)
            .await
            .expect("new keys register again");
    }

    /// The file moved away while the service runs: every call fails closed, no empty
    /// database appears at the path, and once the file is back the store works again,
    /// with the records it had.
    #[tokio::test]
    async fn a_moved_file_fails_closed_until_it_is_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orders.db");
        let store = SqliteStore::open(&path).await.unwrap();
        let k = key("moved");
        let new = new_record("sha256:a", T0);
        store.begin(&k, &new, T0).await.unwrap();

        let away = dir.path().join("orders.db.moved");
        std::fs::rename(&path, &away).unwrap();
        unavailable(
            store
                .begin(&key("new"), &new_record("sha256:a", T0), T0)
                .await,
            "begin while the file is away",
        );
        unavailable(
            store.complete(&k, new.lease.token, &created(), T0).await,
            "complete while the file is away",
        );
        unavailable(store.get(&k, T0).await, "get while the file is away");
        assert!(!path.exists(), "no new database is created in its place");

        std::fs::rename(&away, &path).unwrap();
        store
            .complete(&k, new.lease.token, &created(), T0 + 1)
            .await
            .expect("the file is back: the owner completes");
        assert!(matches!(
            store.get(&k, T0 + 1).await.unwrap().unwrap().state,
            RecordState::Completed { .. }
        ));
    }

    /// The folder removed: calls fail closed and nothing is recreated. The file replaced
    /// by another one (a restored copy): the store serves the copy through fresh
    /// connections, never the file that is gone.
    #[tokio::test]
    async fn a_removed_or_replaced_file_is_never_written_blindly() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("orders.db");
        let store = SqliteStore::open(&path).await.unwrap();
        let kept = key("kept");
        let first = new_record("sha256:a", T0);
        store.begin(&kept, &first, T0).await.unwrap();
        store
            .complete(&kept, first.lease.token, &created(), T0)
            .await
            .unwrap();
        // A copy made while the service runs: WAL content is checkpointed first.
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(store.pool())
            .await
            .unwrap();
        let backup = root.path().join("backup.db");
        std::fs::copy(&path, &backup).unwrap();

        std::fs::remove_dir_all(&dir).unwrap();
        unavailable(
            store
                .begin(&key("new"), &new_record("sha256:a", T0), T0)
                .await,
            "begin after the folder was removed",
        );
        assert!(!dir.exists(), "nothing is recreated");

        std::fs::create_dir(&dir).unwrap();
        std::fs::copy(&backup, &path).unwrap();
        let lost = key("written-to-the-copy");
        let new = new_record("sha256:b", T0);
        assert!(matches!(
            store.begin(&lost, &new, T0).await.unwrap(),
            Begin::Started(_)
        ));
        assert!(
            store.get(&kept, T0).await.unwrap().is_some(),
            "the restored copy is served"
        );
        drop(store);
        let reopened = SqliteStore::open(&path).await.unwrap();
        assert!(
            reopened.get(&lost, T0).await.unwrap().is_some(),
            "what was written after the restore is in the file at the path"
        );
    }

    #[tokio::test]
    async fn shares_a_database_with_other_tables() {
        let store = SqliteStore::in_memory().await.unwrap();
        sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
            .execute(store.pool())
            .await
            .unwrap();
        // Opening the schema again is harmless.
        let again = SqliteStore::from_pool(store.pool().clone()).await.unwrap();
        let tables: Vec<String> =
            sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
                .fetch_all(again.pool())
                .await
                .unwrap();
        assert_eq!(tables, ["idem_records", "orders"]);
    }
}
