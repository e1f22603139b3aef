//! SQLite's [`Dialect`]: its statements, its connections (after the file's check) and
//! how it classifies a driver error, and registration inside `BEGIN IMMEDIATE`.

use std::sync::Arc;

use sqlx::pool::PoolConnection;
use sqlx::sqlite::SqliteConnection;
use sqlx::{Connection, Sqlite};
use tokio::sync::Semaphore;

use super::health::Health;
use crate::store::sql::SqlStore;
use crate::store::sql::dialect::Dialect;
use crate::store::sql::records::Registration;
use crate::store::{Begin, StoreError};

/// What an SQLite store keeps beside its pool.
#[derive(Clone, Debug)]
pub struct SqliteState {
    /// Its file and its connections' fitness.
    pub(super) health: Arc<Health>,
    /// One transaction at a time: waiting here holds no connection of the pool.
    pub(super) writer: Arc<Semaphore>,
    /// The keys registered inside an attempt's transaction that has not ended.
    pub(super) in_flight: super::transactional::InFlightKeys,
}

impl SqliteState {
    /// The state of a store over `health`, with its one writer free.
    pub(super) fn new(health: Arc<Health>) -> SqliteState {
        SqliteState {
            health,
            writer: Arc::new(Semaphore::new(1)),
            in_flight: super::transactional::InFlightKeys::default(),
        }
    }
}

/// `begin` as one statement, with the values of `Registration::statement`: insert, or on
/// conflict take the row only when its TTL has passed (a new operation) or it is released
/// with the same fingerprint (attempt + 1). `$7` is the lease's end, `$8` is `now`, `$11`
/// the end of the attempt's time; `expires_at` is never before the lease's end nor the
/// attempt's (`Record::begin_over`). SQLite evaluates every SET expression against the
/// old row.
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
        status = NULL, headers = NULL, body = NULL, reason = NULL, stored_bytes = 0,
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

/// SQLite's primary result codes that mean a connection can no longer be trusted with
/// writes: `SQLITE_READONLY` (8: opened while the file was read-only, or the file moved),
/// `SQLITE_IOERR` (10), `SQLITE_CORRUPT` (11), `SQLITE_FULL` (13), `SQLITE_CANTOPEN` (14)
/// and `SQLITE_NOTADB` (26). `SQLITE_BUSY` (5) is not among them: waiting for the lock
/// ran out, the connection is fine.
const FATAL_CODES: [i32; 6] = [8, 10, 11, 13, 14, 26];

impl Dialect for Sqlite {
    type State = SqliteState;

    const TAKE_OVER: &'static str = "UPDATE idem_records
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

    /// Text compares bytewise (BINARY); `$4` is 0 or 1. Two branches, one of which `$4`
    /// turns off before it runs: only ended leases reads the partial index
    /// `idem_records_lease_ended` (a condition under `OR` could not use it), named with
    /// `INDEXED BY`: the store never analyzes its file, and without statistics SQLite
    /// would rather scan the primary key in the listing's order.
    const LIST: &'static str = "SELECT operation, client, key, operation_id, fingerprint, state,
        attempt, token, lease_until, created_at, expires_at, status, headers, body, reason,
        transactional
    FROM idem_records INDEXED BY idem_records_lease_ended
    WHERE $4 <> 0 AND state = 'processing' AND lease_until <= $1 AND expires_at > $1
      AND ($2 IS NULL OR operation = $2)
      AND ($3 IS NULL OR state = $3)
      AND ($5 IS NULL OR (operation, client, key) > ($5, $6, $7))
    UNION ALL
    SELECT operation, client, key, operation_id, fingerprint, state, attempt, token,
        lease_until, created_at, expires_at, status, headers, body, reason, transactional
    FROM idem_records
    WHERE $4 = 0 AND expires_at > $1
      AND ($2 IS NULL OR operation = $2)
      AND ($3 IS NULL OR state = $3)
      AND ($5 IS NULL OR (operation, client, key) > ($5, $6, $7))
    ORDER BY operation, client, key
    LIMIT $8";

    const RESOLVE: &'static str = "UPDATE idem_records
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

    const PURGE: &'static str = "DELETE FROM idem_records WHERE expires_at <= $1";

    const PURGE_BATCH: Option<u64> = None;

    /// An embedded database: this process's clock.
    const CLOCK: Option<&'static str> = None;

    /// A connection, after checking that the file at the store's path is the one it
    /// opened.
    async fn acquire(store: &SqlStore<Sqlite>) -> Result<PoolConnection<Sqlite>, StoreError> {
        store.state.health.check_file()?;
        store
            .pool
            .acquire()
            .await
            .map_err(|e| Sqlite::fault(store, e))
    }

    /// A fault that leaves a connection unfit for writes ([`FATAL_CODES`], or the
    /// connection itself broke) makes the pool replace every connection opened before it.
    fn fault(store: &SqlStore<Sqlite>, error: sqlx::Error) -> StoreError {
        if is_fatal(&error) {
            tracing::warn!(error = %error, "idem: an SQLite connection failed; the pool replaces its connections");
            store.state.health.recycle();
        }
        crate::store::sql::unavailable(error)
    }

    /// Reads the record first and answers from it when it is held or finished (no write
    /// lock is taken, so a duplicate is answered at once even while another attempt's
    /// transaction holds the lock); otherwise, inside a `BEGIN IMMEDIATE` transaction,
    /// the client budget's count when the key starts a new operation, then [`BEGIN`].
    /// The one writer makes the count exact: no other registration runs meanwhile.
    async fn register(
        store: &SqlStore<Sqlite>,
        conn: &mut SqliteConnection,
        registration: Registration<'_>,
    ) -> Result<Begin, StoreError> {
        let existing = store.select(conn, registration.key).await?;
        if let Some(record) = existing {
            if !registration.may_take(&record) {
                return Ok(Begin::Exists(record));
            }
            if !registration.is_new_over(&record) {
                return begin_immediate(store, conn, &registration, false).await;
            }
        }
        begin_immediate(store, conn, &registration, true).await
    }
}

/// [`BEGIN`] inside a `BEGIN IMMEDIATE` transaction, after the client budget's count when
/// `counted` (a new operation); refused, the transaction writes nothing.
async fn begin_immediate(
    store: &SqlStore<Sqlite>,
    conn: &mut SqliteConnection,
    registration: &Registration<'_>,
    counted: bool,
) -> Result<Begin, StoreError> {
    let mut tx = conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(|e| Sqlite::fault(store, e))?;
    let outcome = write_registration(store, &mut tx, registration, counted).await?;
    tx.commit().await.map_err(|e| Sqlite::fault(store, e))?;
    Ok(outcome)
}

/// The registration on `conn`, which holds the write lock already (an attempt's
/// transaction): when no budget needs counting (none, or
/// [`ClientBudget::COUNT_ONLY`](crate::store::ClientBudget::COUNT_ONLY)), [`BEGIN`] at
/// once, which encodes the rules of a registration, and the record read only when it
/// refused; otherwise the record read under the lock, then as [`Dialect::register`]
/// after its first read. Nothing is committed.
pub(super) async fn register_locked(
    store: &SqlStore<Sqlite>,
    conn: &mut SqliteConnection,
    registration: &Registration<'_>,
) -> Result<Begin, StoreError> {
    if registration.counted_budget().is_none() {
        return write_registration(store, conn, registration, false).await;
    }
    let existing = store.select(conn, registration.key).await?;
    let counted = match &existing {
        Some(record) if !registration.may_take(record) => return Ok(Begin::Exists(record.clone())),
        Some(record) => registration.is_new_over(record),
        None => true,
    };
    write_registration(store, conn, registration, counted).await
}

/// The client budget's count when `counted` (a new operation), then [`BEGIN`], on `conn`
/// under the write lock; refused, nothing is written.
async fn write_registration(
    store: &SqlStore<Sqlite>,
    conn: &mut SqliteConnection,
    registration: &Registration<'_>,
    counted: bool,
) -> Result<Begin, StoreError> {
    if counted && let Some(over) = store.over_budget(conn, registration).await? {
        // Under the write lock: the key may have been registered since the first read.
        return Ok(match store.select(conn, registration.key).await? {
            Some(record) if !registration.may_take(&record) => Begin::Exists(record),
            _ => Begin::OverBudget(over),
        });
    }
    let written = store.record(conn, registration.statement(BEGIN)).await?;
    Ok(match written {
        Some(record) => Begin::Started(record),
        None => match store.select(conn, registration.key).await? {
            Some(record) => Begin::Exists(record),
            None => {
                return Err(StoreError::Corrupt(
                    "the record vanished inside its own transaction".into(),
                ));
            }
        },
    })
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
