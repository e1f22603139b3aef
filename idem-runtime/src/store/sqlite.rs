//! The SQLite store: embedded and durable (feature `sqlite`).

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};

use super::{
    Begin, Lease, NewRecord, OperationState, OwnerToken, Record, RecordKey, RecordState, Store,
    StoreError, StoredResponse, UnixMillis,
};
use crate::OperationId;

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
        PRIMARY KEY (operation, client, key)
    )",
    "CREATE INDEX IF NOT EXISTS idem_records_expires_at ON idem_records (expires_at)",
];

/// `begin` as one statement: insert, or on conflict take the row only when its TTL has
/// passed (a new operation) or it is released with the same fingerprint (attempt + 1).
/// `?7` is the lease's end, `?8` is `now`; `expires_at` is never before the lease's end
/// (`Record::begin_over`). SQLite evaluates every SET expression against the old row.
const BEGIN: &str = "INSERT INTO idem_records
        (operation, client, key, operation_id, fingerprint, state, attempt, token,
         lease_until, created_at, expires_at)
    VALUES (?1, ?2, ?3, ?4, ?5, 'processing', 1, ?6, ?7, ?8, MAX(?9, ?7))
    ON CONFLICT (operation, client, key) DO UPDATE SET
        operation_id = CASE WHEN idem_records.expires_at <= ?8 THEN excluded.operation_id
                            ELSE idem_records.operation_id END,
        attempt      = CASE WHEN idem_records.expires_at <= ?8 THEN 1
                            ELSE idem_records.attempt + 1 END,
        created_at   = CASE WHEN idem_records.expires_at <= ?8 THEN excluded.created_at
                            ELSE idem_records.created_at END,
        expires_at   = CASE WHEN idem_records.expires_at <= ?8 THEN excluded.expires_at
                            ELSE MAX(idem_records.expires_at, excluded.lease_until) END,
        fingerprint  = excluded.fingerprint,
        state        = 'processing',
        token        = excluded.token,
        lease_until  = excluded.lease_until,
        status = NULL, headers = NULL, body = NULL, reason = NULL
    WHERE idem_records.expires_at <= ?8
       OR (idem_records.state = 'released' AND idem_records.fingerprint = excluded.fingerprint)
    RETURNING operation_id, fingerprint, state, attempt, token, lease_until,
              created_at, expires_at, status, headers, body, reason";

const SELECT: &str = "SELECT operation_id, fingerprint, state, attempt, token, lease_until,
        created_at, expires_at, status, headers, body, reason
    FROM idem_records WHERE operation = ?1 AND client = ?2 AND key = ?3";

const GET: &str = "SELECT operation_id, fingerprint, state, attempt, token, lease_until,
        created_at, expires_at, status, headers, body, reason
    FROM idem_records WHERE operation = ?1 AND client = ?2 AND key = ?3 AND expires_at > ?4";

/// `?4` token, `?5` now: the owner of a live lease.
const COMPLETE: &str = "UPDATE idem_records
    SET state = 'completed', token = NULL, lease_until = NULL,
        status = ?6, headers = ?7, body = ?8, reason = NULL
    WHERE operation = ?1 AND client = ?2 AND key = ?3
      AND state = 'processing' AND token = ?4 AND lease_until > ?5";

const RELEASE: &str = "UPDATE idem_records
    SET state = 'released', token = NULL, lease_until = NULL
    WHERE operation = ?1 AND client = ?2 AND key = ?3
      AND state = 'processing' AND token = ?4 AND lease_until > ?5";

/// `?4` token: the current owner, live lease or ended.
const PARK: &str = "UPDATE idem_records
    SET state = 'unknown', token = NULL, lease_until = NULL, reason = ?5
    WHERE operation = ?1 AND client = ?2 AND key = ?3
      AND state = 'processing' AND token = ?4";

/// `?4` expected token, `?5` now, `?6` new token, `?7` new lease end (`Record::leased`).
const TAKE_OVER: &str = "UPDATE idem_records
    SET token = ?6, lease_until = ?7, attempt = attempt + 1, expires_at = MAX(expires_at, ?7)
    WHERE operation = ?1 AND client = ?2 AND key = ?3
      AND state = 'processing' AND token = ?4 AND lease_until <= ?5 AND expires_at > ?5
    RETURNING operation_id, fingerprint, state, attempt, token, lease_until,
              created_at, expires_at, status, headers, body, reason";

const PURGE: &str = "DELETE FROM idem_records WHERE expires_at <= ?1";

/// A durable [`Store`] in an SQLite database, through sqlx.
///
/// Records live in the table `idem_records`, primary key `(operation, client, key)`, with
/// an index on `expires_at` for purging; [`SqliteStore::open`] creates both if missing
/// (`CREATE … IF NOT EXISTS`, no migration table), so the store can share the
/// application's database. Times are unix milliseconds; results keep their body as a
/// BLOB, byte for byte, and their headers as JSON (a value that is not UTF-8 is written
/// as `{"hex": "…"}`).
///
/// `begin` is one `INSERT … ON CONFLICT DO UPDATE … WHERE … RETURNING` inside a
/// `BEGIN IMMEDIATE` transaction (the transaction only makes the read of an existing record
/// consistent with the failed insert); every other change is one `UPDATE` with its
/// ownership condition in the `WHERE` clause. SQLite runs one writer at a time, so a file
/// database serves one host; several instances need a shared store (PostgreSQL).
#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
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
    /// - a pool of at most 8 connections.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the file cannot be opened or created, or the
    /// schema cannot be created.
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .map_err(StoreError::unavailable)?;
        SqliteStore::from_pool(pool).await
    }

    /// A private in-memory database, for tests: one connection that lives as long as the
    /// store, since every connection to `:memory:` is a database of its own.
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
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the schema cannot be created.
    pub async fn from_pool(pool: SqlitePool) -> Result<SqliteStore, StoreError> {
        for statement in SCHEMA {
            sqlx::query(*statement)
                .execute(&pool)
                .await
                .map_err(StoreError::unavailable)?;
        }
        Ok(SqliteStore { pool })
    }

    /// The pool, to share it with the application.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Closes every connection, waiting for them to finish; later calls fail with
    /// [`StoreError::Unavailable`].
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// Unix milliseconds as SQLite's signed 64-bit integer (good until the year 292 million).
fn sql_ms(ms: UnixMillis) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

fn ms_from_sql(ms: i64, column: &str) -> Result<UnixMillis, StoreError> {
    u64::try_from(ms).map_err(|_| StoreError::Corrupt(format!("`{column}` is negative")))
}

fn encode_headers(headers: &[(HeaderName, HeaderValue)]) -> String {
    let list: Vec<serde_json::Value> = headers
        .iter()
        .map(|(name, value)| {
            let value = match value.to_str() {
                Ok(text) => serde_json::Value::from(text),
                Err(_) => serde_json::json!({ "hex": hex::encode(value.as_bytes()) }),
            };
            serde_json::json!([name.as_str(), value])
        })
        .collect();
    serde_json::Value::Array(list).to_string()
}

fn decode_headers(text: &str) -> Result<Vec<(HeaderName, HeaderValue)>, StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("stored headers: {what}"));
    let list: Vec<(String, serde_json::Value)> =
        serde_json::from_str(text).map_err(|e| corrupt(&e.to_string()))?;
    list.into_iter()
        .map(|(name, value)| {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| corrupt("a name"))?;
            let bytes = match &value {
                serde_json::Value::String(text) => text.as_bytes().to_vec(),
                serde_json::Value::Object(map) => map
                    .get("hex")
                    .and_then(serde_json::Value::as_str)
                    .and_then(|h| hex::decode(h).ok())
                    .ok_or_else(|| corrupt("a value"))?,
                _ => return Err(corrupt("a value")),
            };
            let value = HeaderValue::from_bytes(&bytes).map_err(|_| corrupt("a value"))?;
            Ok((name, value))
        })
        .collect()
}

fn decode(row: &SqliteRow) -> Result<Record, StoreError> {
    let corrupt = |e: sqlx::Error| StoreError::Corrupt(e.to_string());
    let operation_id: String = row.try_get("operation_id").map_err(corrupt)?;
    let operation_id = OperationId::from_str(&operation_id)
        .map_err(|e| StoreError::Corrupt(format!("`operation_id`: {e}")))?;
    let state: String = row.try_get("state").map_err(corrupt)?;
    let state = OperationState::from_str(&state).map_err(StoreError::Corrupt)?;
    let attempt: i64 = row.try_get("attempt").map_err(corrupt)?;
    let missing = |column: &str| StoreError::Corrupt(format!("`{column}` is missing"));
    let state = match state {
        OperationState::Processing => {
            let token: Option<String> = row.try_get("token").map_err(corrupt)?;
            let token = OwnerToken::from_str(&token.ok_or_else(|| missing("token"))?)
                .map_err(|e| StoreError::Corrupt(format!("`token`: {e}")))?;
            let until: Option<i64> = row.try_get("lease_until").map_err(corrupt)?;
            let until = ms_from_sql(until.ok_or_else(|| missing("lease_until"))?, "lease_until")?;
            RecordState::Processing {
                lease: Lease { token, until },
            }
        }
        OperationState::Completed => {
            let status: Option<i64> = row.try_get("status").map_err(corrupt)?;
            let status = status
                .and_then(|s| u16::try_from(s).ok())
                .ok_or_else(|| missing("status"))?;
            let headers: Option<String> = row.try_get("headers").map_err(corrupt)?;
            let body: Option<Vec<u8>> = row.try_get("body").map_err(corrupt)?;
            RecordState::Completed {
                response: StoredResponse {
                    status,
                    headers: decode_headers(&headers.ok_or_else(|| missing("headers"))?)?,
                    body: Bytes::from(body.unwrap_or_default()),
                },
            }
        }
        OperationState::Released => RecordState::Released,
        OperationState::Unknown => {
            let reason: Option<String> = row.try_get("reason").map_err(corrupt)?;
            RecordState::Unknown {
                reason: reason.unwrap_or_default(),
            }
        }
    };
    Ok(Record {
        operation_id,
        fingerprint: row.try_get("fingerprint").map_err(corrupt)?,
        attempt: u32::try_from(attempt).map_err(|_| missing("attempt"))?,
        created_at: ms_from_sql(row.try_get("created_at").map_err(corrupt)?, "created_at")?,
        expires_at: ms_from_sql(row.try_get("expires_at").map_err(corrupt)?, "expires_at")?,
        state,
    })
}

fn changed_one(result: sqlx::sqlite::SqliteQueryResult) -> Result<(), StoreError> {
    if result.rows_affected() == 1 {
        Ok(())
    } else {
        Err(StoreError::LeaseLost)
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn begin(
        &self,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
    ) -> Result<Begin, StoreError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(StoreError::unavailable)?;
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
            .fetch_optional(&mut *tx)
            .await
            .map_err(StoreError::unavailable)?;
        let outcome = match written {
            Some(row) => Begin::Started(decode(&row)?),
            None => {
                let row = sqlx::query(SELECT)
                    .bind(&key.operation)
                    .bind(&key.client)
                    .bind(&key.key)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(StoreError::unavailable)?;
                Begin::Exists(decode(&row)?)
            }
        };
        tx.commit().await.map_err(StoreError::unavailable)?;
        Ok(outcome)
    }

    async fn get(&self, key: &RecordKey, now: UnixMillis) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(GET)
            .bind(&key.operation)
            .bind(&key.client)
            .bind(&key.key)
            .bind(sql_ms(now))
            .fetch_optional(&self.pool)
            .await
            .map_err(StoreError::unavailable)?;
        row.as_ref().map(decode).transpose()
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let result = sqlx::query(COMPLETE)
            .bind(&key.operation)
            .bind(&key.client)
            .bind(&key.key)
            .bind(token.to_string())
            .bind(sql_ms(now))
            .bind(i64::from(response.status))
            .bind(encode_headers(&response.headers))
            .bind(response.body.as_ref())
            .execute(&self.pool)
            .await
            .map_err(StoreError::unavailable)?;
        changed_one(result)
    }

    async fn release(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let result = sqlx::query(RELEASE)
            .bind(&key.operation)
            .bind(&key.client)
            .bind(&key.key)
            .bind(token.to_string())
            .bind(sql_ms(now))
            .execute(&self.pool)
            .await
            .map_err(StoreError::unavailable)?;
        changed_one(result)
    }

    async fn park_unknown(
        &self,
        key: &RecordKey,
        token: OwnerToken,
        reason: &str,
        _now: UnixMillis,
    ) -> Result<(), StoreError> {
        let result = sqlx::query(PARK)
            .bind(&key.operation)
            .bind(&key.client)
            .bind(&key.key)
            .bind(token.to_string())
            .bind(reason)
            .execute(&self.pool)
            .await
            .map_err(StoreError::unavailable)?;
        changed_one(result)
    }

    async fn take_over(
        &self,
        key: &RecordKey,
        expected: OwnerToken,
        new_lease: Lease,
        now: UnixMillis,
    ) -> Result<Record, StoreError> {
        let row = sqlx::query(TAKE_OVER)
            .bind(&key.operation)
            .bind(&key.client)
            .bind(&key.key)
            .bind(expected.to_string())
            .bind(sql_ms(now))
            .bind(new_lease.token.to_string())
            .bind(sql_ms(new_lease.until))
            .fetch_optional(&self.pool)
            .await
            .map_err(StoreError::unavailable)?;
        match row {
            Some(row) => decode(&row),
            None => Err(StoreError::LeaseLost),
        }
    }

    async fn purge_expired(&self, now: UnixMillis) -> Result<u64, StoreError> {
        let result = sqlx::query(PURGE)
            .bind(sql_ms(now))
            .execute(&self.pool)
            .await
            .map_err(StoreError::unavailable)?;
        Ok(result.rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        response.body = Bytes::from_static(b"{\"id\":1}\n\x00\xff");
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

    /// A database that turns read-only mid-attempt (here `PRAGMA query_only` on the
    /// store's only connection; on disk, a read-only file or a full volume): every write
    /// fails as `Unavailable` (answered with 503, fail closed), never as `LeaseLost` or
    /// a panic, and the record is left as it was until the database is writable again.
    #[tokio::test]
    async fn a_read_only_database_fails_closed_and_keeps_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let options = SqliteConnectOptions::new()
            .filename(dir.path().join("ro.db"))
            .create_if_missing(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .unwrap();
        let store = SqliteStore::from_pool(pool).await.unwrap();
        let k = key("read-only");
        let new = new_record("sha256:a", T0);
        store.begin(&k, &new, T0).await.unwrap();
        let before = store.get(&k, T0).await.unwrap().unwrap();

        let query_only = |on: bool| {
            let statement = if on {
                "PRAGMA query_only = ON"
            } else {
                "PRAGMA query_only = OFF"
            };
            sqlx::query(statement).execute(store.pool())
        };
        query_only(true).await.unwrap();
        let unavailable = |result: Result<(), StoreError>, what: &str| {
            assert!(
                matches!(result, Err(StoreError::Unavailable(_))),
                "{what}: {result:?}"
            );
        };
        unavailable(
            store.complete(&k, new.lease.token, &created(), T0).await,
            "complete",
        );
        unavailable(store.release(&k, new.lease.token, T0).await, "release");
        unavailable(
            store
                .begin(&key("other"), &new_record("sha256:a", T0), T0)
                .await
                .map(drop),
            "begin",
        );
        assert_eq!(
            store.get(&k, T0).await.unwrap().unwrap(),
            before,
            "reads still work"
        );

        query_only(false).await.unwrap();
        store
            .complete(&k, new.lease.token, &created(), T0 + 1)
            .await
            .expect("writable again: the owner completes");
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

    #[test]
    fn headers_round_trip_through_json() {
        let headers = vec![
            (
                HeaderName::from_static("etag"),
                HeaderValue::from_bytes(b"\"\xe9\"").unwrap(),
            ),
            (
                HeaderName::from_static("location"),
                HeaderValue::from_static("/a"),
            ),
        ];
        let text = encode_headers(&headers);
        assert_eq!(text, r#"[["etag",{"hex":"22e922"}],["location","/a"]]"#);
        assert_eq!(decode_headers(&text).unwrap(), headers);
        assert!(decode_headers("[[\"bad name\",\"x\"]]").is_err());
    }
}
