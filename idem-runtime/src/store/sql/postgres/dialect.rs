//! PostgreSQL's [`Dialect`]: its statements, and registration as an insert that wins a
//! free key, then a compare-and-set on a key that may be taken again. Its connections are
//! the pool's as they are: the pool checks them before handing them out, so a driver
//! error needs no noting.

use sqlx::Postgres;
use sqlx::postgres::PgConnection;

use super::transactional::PostgresState;
use crate::store::sql::SqlStore;
use crate::store::sql::dialect::Dialect;
use crate::store::sql::records::{Counted, Registration};
use crate::store::sql::rows;
use crate::store::sql::statement::Columns;
use crate::store::{Begin, OverBudget, Record, StoreError};

/// Registration, step one, with the values of `Registration::statement`: the insert that
/// wins a free key. `ON CONFLICT DO NOTHING` neither waits for nor locks an existing row.
const INSERT: &str = "INSERT INTO idem_records
        (operation, client, key, operation_id, fingerprint, state, attempt, token,
         lease_until, created_at, expires_at, transactional)
    VALUES ($1, $2, $3, $4, $5, 'processing', 1, $6, $7, $8, GREATEST($9, $7, $11), $10)
    ON CONFLICT (operation, client, key) DO NOTHING
    RETURNING operation_id, fingerprint, state, attempt, token, lease_until,
              created_at, expires_at, status, headers, body, reason, transactional";

/// Registration, step one under a client budget ([`crate::store::budget`]): [`INSERT`],
/// only if the client's count admits it, `$12` the budget's records and `$13` its bytes,
/// in the same statement (one round trip, no row locked for the count). Returns one row:
/// the record's columns (NULL when nothing was inserted) and the count's
/// (`records::USAGE`).
const INSERT_WITHIN_BUDGET: &str = "WITH live AS (
        SELECT stored_bytes, expires_at FROM idem_records
        WHERE client = $2 AND expires_at > $8 AND stored_bytes >= 0
        ORDER BY expires_at LIMIT $12
    ), usage AS (
        SELECT count(*) AS used_records,
               CAST(COALESCE(sum(stored_bytes), 0) AS BIGINT) AS used_bytes,
               COALESCE(min(expires_at), 0) AS oldest
        FROM live
    ), inserted AS (
        INSERT INTO idem_records
            (operation, client, key, operation_id, fingerprint, state, attempt, token,
             lease_until, created_at, expires_at, transactional)
        SELECT $1, $2, $3, $4, $5, 'processing', 1, $6, $7, $8, GREATEST($9, $7, $11), $10
        FROM usage WHERE used_records < $12 AND used_bytes < $13
        ON CONFLICT (operation, client, key) DO NOTHING
        RETURNING operation_id, fingerprint, state, attempt, token, lease_until,
                  created_at, expires_at, status, headers, body, reason, transactional
    )
    SELECT inserted.*, usage.used_records, usage.used_bytes, usage.oldest
    FROM usage LEFT JOIN inserted ON TRUE";

/// Registration, step two, with the values of `Registration::statement`, when the key
/// exists and may be taken (`Record::begin_over`): a new operation when the TTL has passed,
/// the next attempt when released with the same fingerprint; the `WHERE` makes it a
/// compare-and-set. `$8` is `now`, `$7` the lease's end. PostgreSQL evaluates every SET
/// expression against the old row.
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
        status = NULL, headers = NULL, body = NULL, reason = NULL, stored_bytes = 0,
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

impl Dialect for Postgres {
    type State = PostgresState;

    const TAKE_OVER: &'static str = "UPDATE idem_records
    SET token = $6, lease_until = $7, attempt = attempt + 1, expires_at = GREATEST(expires_at, $7),
        history = CASE WHEN jsonb_array_length(COALESCE(history, '[]'::jsonb)) >= 32
                       THEN history - 0 ELSE COALESCE(history, '[]'::jsonb) END
            || jsonb_build_array(jsonb_build_object('attempt', attempt + 1,
                 'began_at', $5::bigint, 'after', 'lease-ended', 'lease_until', lease_until))
    WHERE operation = $1 AND client = $2 AND key = $3
      AND state = 'processing' AND token = $4 AND lease_until <= $5 AND expires_at > $5
    RETURNING operation_id, fingerprint, state, attempt, token, lease_until,
              created_at, expires_at, status, headers, body, reason, transactional";

    /// Text compares bytewise (`COLLATE "C"`), whatever the database's collation. Two
    /// branches, one of which `$4` turns off before it runs: only ended leases reads the
    /// partial index `idem_records_lease_ended` (migration 5), the processing records'
    /// lease ends, in a plan of its own even when the statement's plan is generic (the
    /// filters of the other branch cannot use an index).
    const LIST: &'static str = r#"SELECT * FROM (
        SELECT operation, client, key, operation_id, fingerprint, state, attempt, token,
            lease_until, created_at, expires_at, status, headers, body, reason, transactional
        FROM idem_records
        WHERE $4::boolean AND state = 'processing' AND lease_until <= $1 AND expires_at > $1
          AND ($2::text IS NULL OR operation = $2::text)
          AND ($3::text IS NULL OR state = $3::text)
          AND ($5::text IS NULL OR (operation COLLATE "C", client COLLATE "C", key COLLATE "C")
               > ($5::text COLLATE "C", $6::text COLLATE "C", $7::text COLLATE "C"))
        UNION ALL
        SELECT operation, client, key, operation_id, fingerprint, state, attempt, token,
            lease_until, created_at, expires_at, status, headers, body, reason, transactional
        FROM idem_records
        WHERE NOT $4::boolean AND expires_at > $1
          AND ($2::text IS NULL OR operation = $2::text)
          AND ($3::text IS NULL OR state = $3::text)
          AND ($5::text IS NULL OR (operation COLLATE "C", client COLLATE "C", key COLLATE "C")
               > ($5::text COLLATE "C", $6::text COLLATE "C", $7::text COLLATE "C"))
    ) AS listed
    ORDER BY operation COLLATE "C", client COLLATE "C", key COLLATE "C"
    LIMIT $8"#;

    const RESOLVE: &'static str = "UPDATE idem_records
    SET state = $5, status = $6, headers = $7, body = $8, reason = NULL,
        history = CASE WHEN jsonb_array_length(COALESCE(history, '[]'::jsonb)) >= 32
                       THEN history - 0 ELSE COALESCE(history, '[]'::jsonb) END
            || jsonb_build_array(jsonb_set($9::jsonb, '{parked}', to_jsonb(COALESCE(reason, ''))))
    WHERE operation = $1 AND client = $2 AND key = $3
      AND state = 'unknown' AND attempt = $4 AND expires_at > $10
    RETURNING operation_id, fingerprint, state, attempt, token, lease_until,
              created_at, expires_at, status, headers, body, reason, transactional";

    /// In batches, so that a large purge never holds many row locks at once: the oldest
    /// expired records first, read from the index on `expires_at` (the order keeps the
    /// planner on it, and away from a scan past the dead rows of earlier batches), locked
    /// (`SKIP LOCKED`: a record being taken again is left to its taker) and deleted by
    /// their row address, which the lock keeps valid.
    const PURGE: &'static str = "DELETE FROM idem_records WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM idem_records WHERE expires_at <= $1
        ORDER BY expires_at LIMIT 5000 FOR UPDATE SKIP LOCKED
    ))";

    const PURGE_BATCH: Option<u64> = Some(5000);

    /// `clock_timestamp()`, the server's clock when the statement runs (`now()` would be
    /// the start of the transaction).
    const CLOCK: Option<&'static str> =
        Some("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8 AS now_ms");

    /// [`INSERT`] (or [`INSERT_WITHIN_BUDGET`]); only a key that exists and may be taken again (its TTL passed, or
    /// released with the same fingerprint) gets a second statement, [`RECLAIM`].
    async fn register(
        store: &SqlStore<Postgres>,
        conn: &mut PgConnection,
        registration: Registration<'_>,
    ) -> Result<Begin, StoreError> {
        let key = registration.key;
        // A record purged between the insert and the read makes the key free again; two
        // rounds cover that, a third would mean the database is being emptied meanwhile.
        for _ in 0..3 {
            let (inserted, over) = insert(store, conn, &registration).await?;
            if let Some(record) = inserted {
                return Ok(Begin::Started(record));
            }
            let Some(existing) = store.select(conn, key).await? else {
                match over {
                    Some(over) => return Ok(Begin::OverBudget(over)),
                    None => continue,
                }
            };
            if !registration.may_take(&existing) {
                return Ok(Begin::Exists(existing));
            }
            if let Some(over) = over.filter(|_| registration.is_new_over(&existing)) {
                return Ok(Begin::OverBudget(over));
            }
            if let Some(record) = store.record(conn, registration.statement(RECLAIM)).await? {
                return Ok(Begin::Started(record));
            }
            // Someone else changed the record first: report it as it stands now.
            if let Some(current) = store.select(conn, key).await? {
                return Ok(Begin::Exists(current));
            }
        }
        Err(StoreError::unavailable(
            "the record kept vanishing while it was registered (a purge running against live keys?)",
        ))
    }
}

/// Registration's first step: [`INSERT`], or [`INSERT_WITHIN_BUDGET`] when the
/// registration has a budget. The record if it was inserted, and the refusal if the
/// client is at its budget.
async fn insert(
    store: &SqlStore<Postgres>,
    conn: &mut PgConnection,
    registration: &Registration<'_>,
) -> Result<(Option<Record>, Option<OverBudget>), StoreError> {
    let Some(budget) = registration.counted_budget() else {
        let record = store.record(conn, registration.statement(INSERT)).await?;
        return Ok((record, None));
    };
    let statement = registration
        .statement::<Postgres>(INSERT_WITHIN_BUDGET)
        .int(i64::try_from(budget.records).unwrap_or(i64::MAX))
        .int(i64::try_from(budget.bytes).unwrap_or(i64::MAX));
    let row: Option<sqlx::postgres::PgRow> = store.run(statement.fetch_optional(conn)).await?;
    let Some(row) = row else {
        return Err(StoreError::Corrupt(
            "the registration answered without its count".into(),
        ));
    };
    let over = registration.over(&Counted::read(&row)?);
    let record = match row.maybe_text("operation_id")? {
        Some(_) => Some(rows::decode(&row)?),
        None => None,
    };
    Ok((record, over))
}
