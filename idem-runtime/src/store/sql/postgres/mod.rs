//! The PostgreSQL store: shared by many instances (feature `postgres`).

use std::time::Duration;

use async_trait::async_trait;
use sqlx::Postgres;
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions};

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
/// [`PostgresStore::without_migrations`]).
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
];

/// The advisory lock key that serialises idem's migrations across instances (the bytes
/// of `idem` as a number).
const MIGRATION_LOCK: i64 = 0x6964_656d;

const MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS idem_schema_migrations (
        version    BIGINT      PRIMARY KEY,
        name       TEXT        NOT NULL,
        applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )";

/// Registration, step one: the insert that wins a free key. `ON CONFLICT DO NOTHING`
/// neither waits for nor locks an existing row.
const INSERT: &str = "INSERT INTO idem_records
        (operation, client, key, operation_id, fingerprint, state, attempt, token,
         lease_until, created_at, expires_at, transactional)
    VALUES ($1, $2, $3, $4, $5, 'processing', 1, $6, $7, $8, GREATEST($9, $7, $11), $10)
    ON CONFLICT (operation, client, key) DO NOTHING
    RETURNING operation_id, fingerprint, state, attempt, token, lease_until,
              created_at, expires_at, status, headers, body, reason, transactional";

/// Registration, step two, when the key exists and may be taken (`Record::begin_over`):
/// a new operation when the TTL has passed, the next attempt when released with the
/// same fingerprint; the `WHERE` makes it a compare-and-set. `$8` is `now`, `$7` the
/// lease's end. PostgreSQL evaluates every SET expression against the old row.
const RECLAIM: &str = "UPDATE idem_records SET
        operation_id = CASE WHEN expires_at <= $8 THEN $4 ELSE operation_id END,
        attempt      = CASE WHEN expires_at <= $8 THEN 1 ELSE attempt + 1 END,
        created_at   = CASE WHEN expires_at <= $8 THEN $8 ELSE created_at END,
        expires_at   = CASE WHEN expires_at <= $8 THEN GREATEST($9, $7, $11)
                            ELSE GREATEST(expires_at, $7, $11) END,
        fingerprint  = $5,
        state        = 'processing',
        token        = $6,
        lease_until  = $7,
        transactional = $10,
        status = NULL, headers = NULL, body = NULL, reason = NULL,
        history      = CASE WHEN expires_at <= $8 THEN NULL ELSE
            CASE WHEN jsonb_array_length(COALESCE(history, '[]'::jsonb)) >= 32
                 THEN history - 0 ELSE COALESCE(history, '[]'::jsonb) END
            || jsonb_build_array(jsonb_build_object(
                 'attempt', attempt + 1, 'began_at', $8::bigint, 'after', 'released'))
            END
    WHERE operation = $1 AND client = $2 AND key = $3
      AND (expires_at <= $8 OR (state = 'released' AND fingerprint = $5))
    RETURNING operation_id, fingerprint, state, attempt, token, lease_until,
              created_at, expires_at, status, headers, body, reason, transactional";

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

/// [`COMPLETE`] inside the attempt's transaction, on the condition that it is still the
/// transaction that began (`$9`, its id).
const COMPLETE_IN_TX: &str = "UPDATE idem_records
    SET state = 'completed', token = NULL, lease_until = NULL,
        status = $6, headers = $7, body = $8, reason = NULL
    WHERE operation = $1 AND client = $2 AND key = $3
      AND state = 'processing' AND token = $4 AND lease_until > $5
      AND txid_current_if_assigned() = $9";

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
    SET token = $6, lease_until = $7, attempt = attempt + 1, expires_at = GREATEST(expires_at, $7),
        history = CASE WHEN jsonb_array_length(COALESCE(history, '[]'::jsonb)) >= 32
                       THEN history - 0 ELSE COALESCE(history, '[]'::jsonb) END
            || jsonb_build_array(jsonb_build_object('attempt', attempt + 1,
                 'began_at', $5::bigint, 'after', 'lease-ended', 'lease_until', lease_until))
    WHERE operation = $1 AND client = $2 AND key = $3
      AND state = 'processing' AND token = $4 AND lease_until <= $5 AND expires_at > $5
    RETURNING operation_id, fingerprint, state, attempt, token, lease_until,
              created_at, expires_at, status, headers, body, reason, transactional";

/// Purging in batches, so that a large purge never holds many row locks at once.
const PURGE: &str = "DELETE FROM idem_records WHERE (operation, client, key) IN (
        SELECT operation, client, key FROM idem_records WHERE expires_at <= $1 LIMIT 5000
    )";
const PURGE_BATCH: u64 = 5000;

/// `$1` now, `$2` operation or NULL, `$3` state or NULL, `$4` only ended leases, `$5`..`$7`
/// the cursor or NULLs, `$8` the page. Text compares bytewise (`COLLATE "C"`), whatever
/// the database's collation.
const LIST: &str = r#"SELECT operation, client, key, operation_id, fingerprint, state, attempt,
        token, lease_until, created_at, expires_at, status, headers, body, reason, transactional
    FROM idem_records
    WHERE expires_at > $1
      AND ($2::text IS NULL OR operation = $2::text)
      AND ($3::text IS NULL OR state = $3::text)
      AND (NOT $4::boolean OR (state = 'processing' AND lease_until <= $1))
      AND ($5::text IS NULL OR (operation COLLATE "C", client COLLATE "C", key COLLATE "C")
           > ($5::text COLLATE "C", $6::text COLLATE "C", $7::text COLLATE "C"))
    ORDER BY operation COLLATE "C", client COLLATE "C", key COLLATE "C"
    LIMIT $8"#;

const INSPECT: &str = "SELECT operation_id, fingerprint, state, attempt, token, lease_until,
        created_at, expires_at, status, headers, body, reason, transactional,
        CAST(history AS TEXT) AS history
    FROM idem_records WHERE operation = $1 AND client = $2 AND key = $3 AND expires_at > $4";

/// An operator's resolution: `$4` the attempt seen parked, `$5` the new state, `$6`..`$8`
/// the result or NULLs, `$9` the resolution's event (its `parked` taken from the row),
/// `$10` now.
const RESOLVE: &str = "UPDATE idem_records
    SET state = $5, status = $6, headers = $7, body = $8, reason = NULL,
        history = CASE WHEN jsonb_array_length(COALESCE(history, '[]'::jsonb)) >= 32
                       THEN history - 0 ELSE COALESCE(history, '[]'::jsonb) END
            || jsonb_build_array(jsonb_set($9::jsonb, '{parked}', to_jsonb(COALESCE(reason, ''))))
    WHERE operation = $1 AND client = $2 AND key = $3
      AND state = 'unknown' AND attempt = $4 AND expires_at > $10
    RETURNING operation_id, fingerprint, state, attempt, token, lease_until,
              created_at, expires_at, status, headers, body, reason, transactional";

/// A [`Store`](crate::store::Store) in PostgreSQL, through sqlx (rustls, no OpenSSL): shared by
/// every instance of a service, and a [`TransactionalStore`], so that a handler's business
/// writes and its record commit in one transaction.
///
/// ```no_run
/// # async fn run() -> Result<(), idem_runtime::StoreError> {
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
#[derive(Clone, Debug)]
pub struct PostgresStore {
    pool: PgPool,
    max_result: usize,
}

impl PostgresStore {
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
        PostgresStore {
            pool,
            max_result: DEFAULT_MAX_RESULT,
        }
    }

    /// The same store, keeping results of up to `bytes` bytes
    /// ([`StoredResponse::size`]; [`DEFAULT_MAX_RESULT`] unless set): a larger one is
    /// refused with [`StoreError::TooLarge`] before anything is written.
    #[must_use]
    pub fn with_max_result(mut self, bytes: usize) -> PostgresStore {
        self.max_result = bytes;
        self
    }

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

    /// The pool, to share it with the application.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Closes every connection; later calls fail with [`StoreError::Unavailable`].
    pub async fn close(&self) {
        self.pool.close().await;
    }

    async fn select(
        &self,
        conn: &mut PgConnection,
        key: &RecordKey,
    ) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(SELECT)
            .bind(&key.operation)
            .bind(&key.client)
            .bind(&key.key)
            .fetch_optional(&mut *conn)
            .await
            .map_err(StoreError::unavailable)?;
        row.as_ref().map(decode).transpose()
    }

    /// The completion's compare-and-set, on `conn` (in a transaction or not).
    async fn complete_on(
        &self,
        conn: &mut PgConnection,
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
            .map_err(StoreError::unavailable)?;
        changed_one(result.rows_affected())
    }

    /// One `UPDATE` of a record; the lease is lost unless it changed exactly one row.
    async fn update(
        &self,
        query: sqlx::query::Query<'_, Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<(), StoreError> {
        let result = query
            .execute(&self.pool)
            .await
            .map_err(StoreError::unavailable)?;
        changed_one(result.rows_affected())
    }
}

#[async_trait]
impl RecordStore for PostgresStore {
    async fn begin(
        &self,
        key: &RecordKey,
        new: &NewRecord,
        now: UnixMillis,
    ) -> Result<Begin, StoreError> {
        let mut conn = self.pool.acquire().await.map_err(StoreError::unavailable)?;
        // A record purged between the insert and the read makes the key free again; two
        // rounds cover that, a third would mean the database is being emptied meanwhile.
        for _ in 0..3 {
            let inserted = sqlx::query(INSERT)
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
                .map_err(StoreError::unavailable)?;
            if let Some(row) = inserted {
                return Ok(Begin::Started(decode(&row)?));
            }
            let Some(existing) = self.select(&mut conn, key).await? else {
                continue;
            };
            if existing.begin_over(new, now).is_none() {
                return Ok(Begin::Exists(existing));
            }
            let reclaimed = sqlx::query(RECLAIM)
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
                .map_err(StoreError::unavailable)?;
            if let Some(row) = reclaimed {
                return Ok(Begin::Started(decode(&row)?));
            }
            // Someone else changed the record first: report it as it stands now.
            if let Some(current) = self.select(&mut conn, key).await? {
                return Ok(Begin::Exists(current));
            }
        }
        Err(StoreError::unavailable(
            "the record kept vanishing while it was registered (a purge running against live keys?)",
        ))
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
        let mut conn = self.pool.acquire().await.map_err(StoreError::unavailable)?;
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
}

#[async_trait]
impl OperatorStore for PostgresStore {
    async fn purge_expired(&self, now: UnixMillis) -> Result<u64, StoreError> {
        let mut purged = 0;
        loop {
            let batch = sqlx::query(PURGE)
                .bind(sql_ms(now))
                .execute(&self.pool)
                .await
                .map_err(StoreError::unavailable)?
                .rows_affected();
            purged += batch;
            if batch < PURGE_BATCH {
                return Ok(purged);
            }
        }
    }

    async fn list(&self, query: &ListQuery, now: UnixMillis) -> Result<Vec<Listed>, StoreError> {
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
            .fetch_all(&self.pool)
            .await
            .map_err(StoreError::unavailable)?;
        rows.iter().map(decode_listed).collect()
    }

    async fn inspect(
        &self,
        key: &RecordKey,
        now: UnixMillis,
    ) -> Result<Option<Inspection>, StoreError> {
        let row = sqlx::query(INSPECT)
            .bind(&key.operation)
            .bind(&key.client)
            .bind(&key.key)
            .bind(sql_ms(now))
            .fetch_optional(&self.pool)
            .await
            .map_err(StoreError::unavailable)?;
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
            .fetch_optional(&self.pool)
            .await
            .map_err(StoreError::unavailable)?;
        match row {
            Some(row) => decode(&row),
            None => {
                let current = self.get(key, now).await?;
                Err(ops::refused(current.as_ref(), resolve.expected_attempt))
            }
        }
    }
}

#[async_trait]
impl TransactionalStore for PostgresStore {
    type Database = Postgres;

    /// Nothing to wait for: PostgreSQL has many writers.
    async fn reserve(&self) -> Result<Reservation, StoreError> {
        Ok(Reservation::default())
    }

    fn try_reserve(&self) -> Option<Reservation> {
        Some(Reservation::default())
    }

    /// `BEGIN` (READ COMMITTED, the server's default) on a connection of the pool; its
    /// marker is its transaction id (`txid_current()`).
    async fn begin_transaction(
        &self,
        reservation: Reservation,
    ) -> Result<OpenTransaction<Postgres>, StoreError> {
        let mut tx = self.pool.begin().await.map_err(StoreError::unavailable)?;
        let marker: i64 = sqlx::query_scalar("SELECT txid_current()")
            .fetch_one(&mut *tx)
            .await
            .map_err(StoreError::unavailable)?;
        Ok(OpenTransaction::new(tx, marker, reservation))
    }

    async fn complete_in(
        &self,
        tx: &mut OpenTransaction<Postgres>,
        key: &RecordKey,
        token: OwnerToken,
        response: &StoredResponse,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        check_size(response, self.max_result)?;
        // One round trip: the completion's compare-and-set, on the condition that this is
        // still the transaction that began; only a refusal is looked into.
        let result = sqlx::query(COMPLETE_IN_TX)
            .bind(&key.operation)
            .bind(&key.client)
            .bind(&key.key)
            .bind(token.to_string())
            .bind(sql_ms(now))
            .bind(i64::from(response.status))
            .bind(encode_headers(&response.headers))
            .bind(response.body.as_ref())
            .bind(tx.marker)
            .execute(&mut *tx.tx)
            .await;
        let aborted = || {
            StoreError::TransactionEnded(
                "a statement failed, and PostgreSQL aborts the whole transaction then (wrap a statement that may fail in a savepoint, `conn.begin()`)".into(),
            )
        };
        match result {
            Ok(result) if result.rows_affected() == 1 => return Ok(()),
            Ok(_) => {}
            // 25P02, in_failed_sql_transaction.
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("25P02") => {
                return Err(aborted());
            }
            Err(error) => return Err(StoreError::unavailable(error)),
        }
        let current: Option<i64> = sqlx::query_scalar("SELECT txid_current_if_assigned()")
            .fetch_one(&mut *tx.tx)
            .await
            .map_err(StoreError::unavailable)?;
        if current == Some(tx.marker) {
            Err(StoreError::LeaseLost)
        } else {
            Err(StoreError::TransactionEnded(
                "the handler ended it (a `COMMIT` or `ROLLBACK` of its own)".into(),
            ))
        }
    }

    /// The pool checks connections before handing them out, so nothing needs noting.
    fn fault(&self, error: sqlx::Error) -> StoreError {
        StoreError::unavailable(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::conformance::{self, T0, created, key, new_record, postgres::scratch_pool};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn passes_the_conformance_suite() {
        let Some(_) = scratch_pool("postgres conformance").await else {
            return;
        };
        conformance::run(|| async {
            let pool = scratch_pool("postgres conformance").await.unwrap();
            PostgresStore::from_pool(pool).await.unwrap()
        })
        .await;
    }

    /// Migrations run once, record themselves, and are safe to run from many instances at
    /// once and again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn migrations_are_idempotent_and_concurrent() {
        let Some(pool) = scratch_pool("postgres migrations").await else {
            return;
        };
        let runs: Vec<_> = (0..4)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move { PostgresStore::migrate(&pool).await })
            })
            .collect();
        for run in runs {
            run.await.unwrap().expect("concurrent migrations succeed");
        }
        PostgresStore::migrate(&pool).await.expect("and again");
        let versions: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM idem_schema_migrations ORDER BY version")
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(versions, [1, 2]);
        let store = PostgresStore::without_migrations(pool);
        let k = key("after-migrations");
        let new = new_record("sha256:a", T0);
        assert!(matches!(
            store.begin(&k, &new, T0).await.unwrap(),
            Begin::Started(_)
        ));
    }

    /// The schema itself refuses a record that breaks the state rules, so that no bug
    /// elsewhere can write one.
    #[tokio::test]
    async fn the_schema_refuses_inconsistent_records() {
        let Some(pool) = scratch_pool("postgres schema").await else {
            return;
        };
        let store = PostgresStore::from_pool(pool).await.unwrap();
        let refused = sqlx::query(
            "INSERT INTO idem_records (operation, client, key, operation_id, fingerprint, state,
                 attempt, token, lease_until, created_at, expires_at)
             VALUES ('op', 'c', 'k', 'x', 'f', 'processing', 1, NULL, NULL, 0, 1)",
        )
        .execute(store.pool())
        .await;
        assert!(refused.is_err(), "a processing record needs a lease");
        let refused = sqlx::query(
            "INSERT INTO idem_records (operation, client, key, operation_id, fingerprint, state,
                 attempt, created_at, expires_at)
             VALUES ('op', 'c', 'k', 'x', 'f', 'done', 1, 0, 1)",
        )
        .execute(store.pool())
        .await;
        assert!(refused.is_err(), "an unknown state is refused");
    }

    /// A server that cannot be reached fails as `Unavailable` within the acquire
    /// timeout, never a panic.
    #[tokio::test]
    async fn an_unreachable_server_is_unavailable() {
        let started = std::time::Instant::now();
        // Port 9 (discard) on loopback: nothing listens there.
        let result =
            PostgresStore::connect("postgres://idem@127.0.0.1:9/idem?sslmode=disable").await;
        assert!(matches!(result, Err(StoreError::Unavailable(_))));
        assert!(started.elapsed() < std::time::Duration::from_secs(30));
        assert!(matches!(
            PostgresStore::connect("not a url").await,
            Err(StoreError::Unavailable(_))
        ));
    }

    /// A result completed inside a transaction is visible only once the transaction
    /// commits, and a rolled-back one leaves the record processing.
    #[tokio::test]
    async fn complete_in_commits_with_the_transaction() {
        let Some(pool) = scratch_pool("postgres complete_in").await else {
            return;
        };
        let store = PostgresStore::from_pool(pool).await.unwrap();
        for commit in [false, true] {
            let k = key(&format!("tx-{commit}"));
            let new = new_record("sha256:a", T0);
            store.begin(&k, &new, T0).await.unwrap();
            let mut open = store
                .begin_transaction(Reservation::default())
                .await
                .unwrap();
            store
                .complete_in(&mut open, &k, new.lease.token, &created(), T0)
                .await
                .unwrap();
            assert!(
                store.get(&k, T0).await.unwrap().unwrap().lease().is_some(),
                "not visible before the commit"
            );
            if commit {
                open.tx.commit().await.unwrap();
                assert!(store.get(&k, T0).await.unwrap().unwrap().lease().is_none());
            } else {
                drop(open);
                assert!(store.get(&k, T0).await.unwrap().unwrap().lease().is_some());
            }
        }
    }
}
