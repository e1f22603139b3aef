//! PostgreSQL's [`TxDialect`]: many writers, as many transactions at once as the pool
//! leaves room for, and a transaction marked by its id.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Postgres;
use sqlx::postgres::PgPool;
use tokio::sync::Semaphore;

use crate::OperationId;
use crate::store::sql::SqlStore;
use crate::store::sql::dialect::{Dialect, TxDialect};
use crate::store::sql::records::{Registration, completion_sql, insert_completed_sql};
use crate::store::sql::statement::{Columns, Statement};
use crate::store::{
    Begin, InFlight, OpenTransaction, RecordKey, Registered, Reservation, StoreError, UnixMillis,
};

/// What a PostgreSQL store keeps beside its pool: the right to hold an attempt's
/// transaction open.
///
/// An attempt's transaction holds a connection of the pool for the attempt's whole time,
/// while the attempt's own statements outside it (its journal's steps, its lease's
/// renewals) and the registration of other keys each need another one for a moment. As
/// many attempts as the pool has connections would each hold one and wait for a second
/// one that only their own ends free: nothing would move until the pool's wait is over
/// (3 s by default, longer than a lease), their leases would end, other instances would
/// take them over while they are alive, and their clients would get 503. So at most the
/// pool's size less a quarter of it (less one at least; one at least) are open at once,
/// and an attempt waits for its turn before its key is registered, as with SQLite's one
/// writer. An attempt that registers its key inside its transaction (every one but those
/// under a step journal) makes no statement beside it while it is open, and takes no
/// turn (`enforce/begin.rs`).
#[derive(Clone, Debug)]
pub struct PostgresState {
    /// One permit for each transaction that may be open at once.
    transactions: Arc<Semaphore>,
    /// How long an attempt waits for its turn: the pool's own wait for a connection.
    wait: Duration,
}

impl PostgresState {
    /// The state of a store over `pool`, sized to it.
    pub(super) fn for_pool(pool: &PgPool) -> PostgresState {
        let size = pool.options().get_max_connections();
        let kept = (size / 4).max(1);
        let permits = usize::try_from(size.saturating_sub(kept).max(1)).unwrap_or(1);
        PostgresState {
            transactions: Arc::new(Semaphore::new(permits)),
            wait: pool.options().get_acquire_timeout(),
        }
    }
}

impl TxDialect for Postgres {
    /// The completion inside the attempt's transaction, with the values of
    /// `SqlStore::completion`: the owner of a live lease (`$5` now), on the condition that
    /// it is still the transaction that began (`$10`, its id), or that this transaction
    /// has committed (`txid_status`): a handler that ended it with a `COMMIT` of its own
    /// (which the docs tell it not to do) has committed its effect, and the record is
    /// then written beside it, on its own (no longer atomic with it: a crash in between
    /// leaves the effect without its record, as in the plain mode), so that the retry
    /// replays it rather than running the effect again. A transaction the database or the
    /// handler rolled back (`aborted`) writes nothing.
    const COMPLETE_IN_TX: &'static str = completion_sql!(
        " AND lease_until > $5 AND (txid_current_if_assigned() = $10 OR txid_status($10) = 'committed')"
    );

    /// The completion in a transaction that registered the key under its advisory lock:
    /// no other session can take the key while the lock is held, so the owner token and
    /// the transaction's id fence (`$5`, now, is bound and not compared), as in
    /// [`TxDialect::COMPLETE_IN_TX`].
    const COMPLETE_REGISTERED_IN_TX: &'static str = completion_sql!(
        " AND (txid_current_if_assigned() = $10 OR txid_status($10) = 'committed')"
    );

    /// The record of a new key, written once, completed, in the transaction that holds
    /// the key's advisory lock ([`LOCKED`] found no row), on the condition that it
    /// is still the transaction that began (`$15`, its id; `$4` the token and `$5` now
    /// are bound and not used), or that this transaction has committed (as in
    /// [`TxDialect::COMPLETE_IN_TX`]).
    /// A row of the key inserts nothing: one committed by the
    /// lock's previous holder after [`LOCKED`]'s snapshot was taken and before the
    /// lock was, which the primary key finds here; the attempt then loses its record,
    /// and everything it wrote rolls back.
    const INSERT_COMPLETED_IN_TX: Option<&'static str> = Some(insert_completed_sql!(
        "WHERE txid_current_if_assigned() = $15 OR txid_status($15) = 'committed'
        ON CONFLICT (operation, client, key) DO NOTHING"
    ));

    /// One round trip: the completion's compare-and-set, on the condition that this is
    /// still the transaction that began (its id, bound last); only a refusal is looked
    /// into.
    async fn complete_in(
        _: &SqlStore<Postgres>,
        tx: &mut OpenTransaction<Postgres>,
        completion: Statement<Postgres>,
    ) -> Result<(), StoreError> {
        let result = completion.int(tx.marker).execute(&mut tx.tx).await;
        let aborted = || {
            StoreError::TransactionEnded(
                "a statement failed, and PostgreSQL aborts the whole transaction then (wrap a statement that may fail in a savepoint, `conn.begin()`)".into(),
            )
        };
        match result {
            Ok(1) => return Ok(()),
            Ok(_) => {}
            // 25P02, in_failed_sql_transaction.
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("25P02") => {
                return Err(aborted());
            }
            Err(error) => return Err(crate::store::sql::unavailable(error)),
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

    /// The attempt's transaction with the key registered inside it: `BEGIN`, then
    /// [`LOCKED`]: the key's advisory lock, taken without waiting, the bounds of
    /// [`Postgres::begin_transaction`], the attempt published in `application_name`, and
    /// the key's record as it stands. This is the key's only read: a lock held by
    /// another session is an attempt in flight; a record no registration may take
    /// ([`Record::is_reclaimable`](crate::store::Record::is_reclaimable): a replay, a
    /// fingerprint mismatch, an attempt of the plain mode) is answered from, and the
    /// transaction rolled back, having written nothing (no transaction id is taken for
    /// it). A key without a record, when no budget needs counting (none, or
    /// [`ClientBudget::COUNT_ONLY`](crate::store::ClientBudget::COUNT_ONLY)), is
    /// registered by the lock alone: nothing is written until the completion inserts the
    /// record, completed ([`OpenTransaction::written_at_completion`]). Otherwise the key
    /// is registered as [`Dialect::register`] makes it, on the transaction's connection,
    /// and a record this attempt may not take ends the transaction. Two round trips for a
    /// new key or a replay, within the store's call timeout.
    async fn begin_registered(
        store: &SqlStore<Postgres>,
        reservation: Reservation,
        registration: Registration<'_>,
        within: Duration,
    ) -> Result<Registered<Postgres>, StoreError> {
        let limit = server_limit(within).as_millis().to_string();
        let key = registration.key;
        let published = format!(
            "idem {} {}",
            registration.new.operation_id, registration.new.holds_until
        );
        let (mut tx, taken) = lock(store, key, &published, &limit).await?;
        if !taken.locked {
            roll_back(store, tx).await;
            return holder(store, key, registration.now)
                .await
                .map(|found| match found {
                    Ok(in_flight) => Registered::InFlight(in_flight, reservation),
                    Err(record) => Registered::Exists(record, reservation),
                });
        }
        match (taken.record, taken.marker) {
            (None, Some(marker)) if registration.counted_budget().is_none() => {
                let record = crate::store::Record::started(registration.new, registration.now);
                let open = OpenTransaction::new(tx, marker, reservation)
                    .written_at_completion(record.clone());
                return Ok(Registered::Started(record, open));
            }
            (Some(record), _) if !record.is_reclaimable(registration.now) => {
                roll_back(store, tx).await;
                return Ok(Registered::Exists(record, reservation));
            }
            _ => {}
        }
        let marker = match taken.marker {
            Some(marker) => marker,
            None => {
                store
                    .run(sqlx::query_scalar(MARKER).fetch_one(&mut *tx))
                    .await?
            }
        };
        register_in(store, tx, marker, reservation, registration).await
    }

    /// [`TxDialect::in_flight`]: the holder of the key's advisory lock, as it published
    /// itself; a lock whose holder published nothing of ours (another program's lock with
    /// the same number) is not an attempt.
    async fn in_flight(
        store: &SqlStore<Postgres>,
        key: &RecordKey,
    ) -> Result<Option<InFlight>, StoreError> {
        let mut conn = store.conn().await?;
        let names: Vec<(Option<String>,)> = store
            .run(
                sqlx::query_as(IN_FLIGHT)
                    .bind(&key.operation)
                    .bind(&key.client)
                    .bind(&key.key)
                    .fetch_all(&mut *conn),
            )
            .await?;
        Ok(names
            .iter()
            .find_map(|(name,)| parse_published(name.as_deref()?)))
    }

    /// The turn to hold a transaction open ([`PostgresState`]), waited for at most as
    /// long as the pool waits for a connection: the wait holds no connection and happens
    /// before the key is registered.
    async fn reserve(store: &SqlStore<Postgres>) -> Result<Reservation, StoreError> {
        let state = &store.state;
        let permit = tokio::time::timeout(
            state.wait,
            Arc::clone(&state.transactions).acquire_owned(),
        )
        .await
        .map_err(|_| {
            StoreError::unavailable(format!(
                "other attempts' transactions held this instance's connections to PostgreSQL for {:?}",
                state.wait
            ))
        })?
        .map_err(StoreError::unavailable)?;
        Ok(Reservation::new(Some(permit)))
    }

    fn try_reserve(store: &SqlStore<Postgres>) -> Option<Reservation> {
        let permit = Arc::clone(&store.state.transactions)
            .try_acquire_owned()
            .ok()?;
        Some(Reservation::new(Some(permit)))
    }

    /// `BEGIN` (READ COMMITTED, the server's default) on a connection of the pool, then
    /// [`BEGUN`] in the same transaction: its marker, its transaction id
    /// (`txid_current()`), read in the statement that bounds it on the server by
    /// [`server_limit`]`(within)`, the attempt's time left and a grace. Two round trips,
    /// as many as the marker alone takes, together within the store's call timeout.
    async fn begin_transaction(
        store: &SqlStore<Postgres>,
        reservation: Reservation,
        within: Duration,
    ) -> Result<OpenTransaction<Postgres>, StoreError> {
        let limit = server_limit(within).as_millis().to_string();
        let begun = async {
            let mut tx = store.pool.begin().await?;
            let marker: i64 = sqlx::query_scalar(BEGUN)
                .bind(&limit)
                .fetch_one(&mut *tx)
                .await?;
            Ok((tx, marker))
        };
        let (tx, marker) = store.bounded(begun).await?;
        Ok(OpenTransaction::new(tx, marker, reservation))
    }
}

/// What [`LOCKED`] found.
struct Taken {
    /// Whether this transaction holds the key's advisory lock.
    locked: bool,
    /// The transaction's id, taken when the lock is held and the key has no record (the
    /// record will be written); none otherwise, when [`MARKER`] takes it if needed.
    marker: Option<i64>,
    /// The key's record in the statement's snapshot, if it has one.
    record: Option<crate::store::Record>,
}

/// `BEGIN`, then [`LOCKED`] for `key`, publishing `published` and bounding the
/// transaction by `limit` (milliseconds, as text).
///
/// The statement's snapshot is taken before the lock is: a record committed by the
/// lock's previous holder between the two is not seen, and the key is taken for new.
/// The primary key still finds that row when the completion inserts the record
/// ([`TxDialect::INSERT_COMPLETED_IN_TX`] inserts nothing then), and the attempt's writes
/// roll back with its transaction: at most one commit per key holds, and the loser
/// answers with the winner's answer when it is completed for the same request, as an
/// attempt that lost its record otherwise (a window of microseconds, within one
/// statement).
async fn lock(
    store: &SqlStore<Postgres>,
    key: &RecordKey,
    published: &str,
    limit: &str,
) -> Result<(sqlx::Transaction<'static, Postgres>, Taken), StoreError> {
    let statement = Statement::<Postgres>::new(LOCKED)
        .text(limit)
        .text(published)
        .text(&key.operation)
        .text(&key.client)
        .text(&key.key);
    let begun = async {
        let mut tx = store.pool.begin().await?;
        let row = statement.fetch_optional(&mut *tx).await?;
        Ok((tx, row))
    };
    let (tx, row) = store.bounded(begun).await?;
    let row = row.ok_or_else(|| StoreError::Corrupt("the key's lock answered no row".into()))?;
    let record = match row.maybe_text("state")? {
        Some(_) => Some(crate::store::sql::rows::decode(&row)?),
        None => None,
    };
    let taken = Taken {
        locked: row.flag("locked")?,
        marker: row.maybe_int("marker")?,
        record,
    };
    Ok((tx, taken))
}

/// The key registered as [`Dialect::register`] makes it, in the transaction `tx`
/// (marked `marker`) that holds its advisory lock: a record to take over (its TTL has
/// passed, or it is released), or a budget to count. A record this attempt may not take,
/// or a budget that refuses, ends the transaction.
async fn register_in(
    store: &SqlStore<Postgres>,
    mut tx: sqlx::Transaction<'static, Postgres>,
    marker: i64,
    reservation: Reservation,
    registration: Registration<'_>,
) -> Result<Registered<Postgres>, StoreError> {
    let operation_id = registration.new.operation_id;
    let holds_until = registration.new.holds_until;
    Ok(
        match Postgres::register(store, &mut tx, registration).await? {
            Begin::Started(record)
                if record.operation_id != operation_id || record.attempt != 1 =>
            {
                // A reclaim: the operation and attempt are the record's.
                let published = format!(
                    "idem {} {holds_until} {}",
                    record.operation_id, record.attempt
                );
                store
                    .run(
                        sqlx::query("SELECT set_config('application_name', $1, true)")
                            .bind(&published)
                            .execute(&mut *tx),
                    )
                    .await?;
                let open = OpenTransaction::new(tx, marker, reservation).registered(None);
                Registered::Started(record, open)
            }
            Begin::Started(record) => {
                let open = OpenTransaction::new(tx, marker, reservation).registered(None);
                Registered::Started(record, open)
            }
            // Rolled back at once: the lock goes with the transaction.
            Begin::Exists(record) => {
                roll_back(store, tx).await;
                Registered::Exists(record, reservation)
            }
            Begin::OverBudget(over) => {
                roll_back(store, tx).await;
                Registered::OverBudget(over, reservation)
            }
        },
    )
}

/// Rolls back `tx`, which registered nothing, so that its lock is let go now; a failed
/// rollback leaves the connection suspect, and the store replaces it.
async fn roll_back(store: &SqlStore<Postgres>, tx: sqlx::Transaction<'static, Postgres>) {
    if let Err(error) = tx.rollback().await {
        let _ = Postgres::rollback_failed(store, error);
    }
}

/// The attempt that holds `key`'s advisory lock, as it published itself, read a few
/// times a few milliseconds apart (it publishes itself as it takes the lock); or the
/// key's record, committed by an attempt that ended meanwhile, read after the lock's
/// holder: a holder that finds such a record answers from it and lets the lock go, so
/// the operation it published never ran, and the record is the answer. A lock whose
/// holder never published itself (a session of another role, whose `application_name`
/// this role cannot read, or another program's lock with the same number) is an
/// attempt of an unknown operation (a fresh id), ending now.
async fn holder(
    store: &SqlStore<Postgres>,
    key: &RecordKey,
    now: UnixMillis,
) -> Result<Result<InFlight, crate::store::Record>, StoreError> {
    for pause_ms in [0, 2, 10] {
        tokio::time::sleep(std::time::Duration::from_millis(pause_ms)).await;
        let in_flight = Postgres::in_flight(store, key).await?;
        match store.select(&mut *store.conn().await?, key).await? {
            Some(record) if in_flight.is_none() || !record.is_reclaimable(now) => {
                return Ok(Err(record));
            }
            _ => {}
        }
        if let Some(in_flight) = in_flight {
            return Ok(Ok(in_flight));
        }
    }
    Ok(Ok(InFlight {
        operation_id: OperationId::new(),
        attempt: 1,
        until: now,
    }))
}

/// The key's 64-bit advisory lock number, from `$1`..`$3` (operation, client, key) and
/// the schema the store's tables are in, each part's length before it so that no two
/// keys share the text hashed. `hashtextextended` is the hash of PostgreSQL's hash
/// partitioning, the same on every server and version since 11. Two keys whose numbers
/// collide (one chance in 2^64 for a pair) only answer each other's duplicates while
/// both are in flight.
macro_rules! lock_number {
    ($op:literal, $client:literal, $key:literal) => {
        concat!(
            "hashtextextended(concat_ws('/', length(current_schema()), current_schema(), length(",
            $op,
            "), ",
            $op,
            ", length(",
            $client,
            "), ",
            $client,
            ", ",
            $key,
            "), 0)"
        )
    };
}

/// The registered transaction's first statement: `$2` (`idem <operation id> <end of
/// its time>`) as the session's `application_name` for this transaction, which
/// [`IN_FLIGHT`] reads (set first, so that the lock is never seen without it: the
/// lateral subquery that takes the lock refers to it, which orders the two), the
/// key's advisory lock (`pg_try_advisory_xact_lock`: taken now or not at all, let go
/// when the transaction ends, however it ends, a lost session included), the bounds of
/// [`BEGUN`] (`$1`), the key's record (`$3`..`$5`) in the statement's snapshot (its
/// columns null when it has none), and the marker (`txid_current()`) when the lock is
/// held and the key has no record: a transaction that only reads a record and rolls
/// back takes no transaction id.
pub(super) const LOCKED: &str = concat!(
    "SELECT taken.locked,
        CASE WHEN taken.locked AND r.state IS NULL THEN txid_current() END AS marker,
        r.operation_id, r.fingerprint, r.state, r.attempt, r.token, r.lease_until,
        r.created_at, r.expires_at, r.status, r.headers, r.body, r.reason, r.transactional
    FROM (SELECT set_config('application_name', $2, true) AS name) AS published
    CROSS JOIN LATERAL (SELECT pg_try_advisory_xact_lock(",
    lock_number!("$3", "$4", "$5"),
    ") AS locked,
        set_config('statement_timeout', $1, true),
        set_config('idle_in_transaction_session_timeout', $1, true)
        WHERE published.name IS NOT NULL) AS taken
    LEFT JOIN idem_records r ON r.operation = $3 AND r.client = $4 AND r.key = $5"
);

/// The transaction's id, taken now: the marker of a registered transaction whose
/// [`LOCKED`] found a record it goes on to take over.
const MARKER: &str = "SELECT txid_current()";

/// The `application_name` of the session holding the advisory lock of `$1`..`$3` in
/// this database, if one does: a bigint advisory lock is listed in `pg_locks` with its
/// high 32 bits as `classid`, its low ones as `objid`, and `objsubid` 1.
const IN_FLIGHT: &str = concat!(
    "WITH k AS (SELECT ",
    lock_number!("$1", "$2", "$3"),
    " AS n)
    SELECT a.application_name
    FROM k, pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = ((k.n >> 32) & 4294967295)::oid
      AND l.objid = (k.n & 4294967295)::oid"
);

/// The attempt an `application_name` of [`LOCKED`] publishes: `idem <operation id>
/// <end of its time>`, and ` <attempt>` after a reclaim (1 without).
fn parse_published(name: &str) -> Option<InFlight> {
    let mut parts = name.strip_prefix("idem ")?.split(' ');
    let operation_id = parts.next()?.parse().ok()?;
    let until = parts.next()?.parse().ok()?;
    let attempt = parts.next().map_or(Some(1), |n| n.parse().ok())?;
    Some(InFlight {
        operation_id,
        attempt,
        until,
    })
}

/// The transaction's first statement: its marker (`txid_current()`), and `$1` (in
/// milliseconds) as its `statement_timeout` and `idle_in_transaction_session_timeout`,
/// set as `SET LOCAL` sets them (`set_config(.., true)`: for this transaction only, so
/// that a connection handed back to the pool keeps the session's own settings). They
/// take effect from the next statement on.
const BEGUN: &str = "SELECT txid_current(),
    set_config('statement_timeout', $1, true),
    set_config('idle_in_transaction_session_timeout', $1, true)";

/// The server's bound on an attempt's transaction that has `within` left: `within` and
/// a grace, a quarter of it at most 1 s ([`TX_GRACE`]), so that the client, which ends
/// the transaction by the attempt's deadline, is heard first, and the server ends only a
/// transaction whose client went silent. At least 1 ms (0 would mean no limit), at most
/// 24 h (the settings are 32-bit counts of milliseconds).
///
/// Each statement of the transaction is cancelled past it (`statement_timeout`), and
/// the session is ended when the transaction sits idle that long
/// (`idle_in_transaction_session_timeout`): its locks, such as the unique index entry of
/// a row it inserted, are let go, and another instance that took the key over goes on.
pub(crate) fn server_limit(within: Duration) -> Duration {
    let grace = (within / 4).min(TX_GRACE);
    (within + grace).clamp(Duration::from_millis(1), Duration::from_secs(24 * 60 * 60))
}

/// The longest grace [`server_limit`] adds to an attempt's time left.
pub(crate) const TX_GRACE: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::parse_published;

    /// A publication names an attempt only as `LOCKED` writes it; anything else in
    /// `application_name` (the pool's own name, another program's, a truncated or hostile
    /// value) names none.
    #[test]
    fn only_idem_publications_name_an_attempt() {
        let id = "01a242fe-ebb4-745d-a58d-8442da8d42cf";
        let first = parse_published(&format!("idem {id} 1796420332577")).unwrap();
        assert_eq!(
            (first.operation_id.to_string(), first.until, first.attempt),
            (id.to_owned(), 1_796_420_332_577, 1)
        );
        let reclaimed = parse_published(&format!("idem {id} 17 3")).unwrap();
        assert_eq!(reclaimed.attempt, 3);
        for foreign in [
            String::new(),
            "psql".to_owned(),
            "idem".to_owned(),
            "idem ".to_owned(),
            format!("idem {id}"),
            format!("idem {}", &id[..20]),
            "idem not-a-uuid 17".to_owned(),
            format!("idem {id} -17"),
            format!("idem {id} 17 x"),
            format!("idem {id} 99999999999999999999999"),
            format!("IDEM {id} 17"),
            format!("idem  {id} 17"),
            "idem \u{0}\u{ffff} 1".to_owned(),
        ] {
            assert!(parse_published(&foreign).is_none(), "{foreign:?}");
        }
    }
}
