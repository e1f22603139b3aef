//! SQLite's [`TxDialect`]: one writer at a time, whose open transaction holds the
//! database's write lock, so that the owner's token alone fences.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sqlx::{AssertSqlSafe, Sqlite, Transaction};

use super::dialect::register_locked;
use crate::store::sql::dialect::{Dialect, TxDialect};
use crate::store::sql::records::{Registration, completion_sql, insert_completed_sql, release_sql};
use crate::store::sql::rows::changed_one;
use crate::store::sql::statement::Statement;
use crate::store::sql::{SqlStore, no_answer};
use crate::store::{
    Begin, InFlight, KeyMark, OpenTransaction, OwnerToken, RecordKey, Registered, Reservation,
    StoreError,
};

/// The keys of a store in flight: marked by attempts of the one-commit mode before they
/// read the key and wait for the writer, until their transactions end. SQLite serves one
/// process, so this map is the whole truth of what is in flight.
#[derive(Clone, Debug, Default)]
pub struct InFlightKeys(Arc<Mutex<HashMap<RecordKey, InFlight>>>);

impl InFlightKeys {
    /// Marks `key` in flight for `attempt` until the returned mark is dropped, or gives
    /// the attempt that holds it already.
    fn claim(&self, key: &RecordKey, attempt: InFlight) -> Result<InFlightMark, InFlight> {
        let mut keys = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(holder) = keys.get(key) {
            return Err(*holder);
        }
        keys.insert(key.clone(), attempt);
        Ok(InFlightMark {
            keys: self.clone(),
            key: key.clone(),
        })
    }

    /// Notes the operation and attempt number of `record`, registered under a key this
    /// process marked.
    fn started(&self, key: &RecordKey, record: &crate::store::Record) {
        let mut keys = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(attempt) = keys.get_mut(key) {
            attempt.operation_id = record.operation_id;
            attempt.attempt = record.attempt;
        }
    }

    /// The attempt that holds `key`, if one does.
    fn get(&self, key: &RecordKey) -> Option<InFlight> {
        let keys = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        keys.get(key).copied()
    }
}

/// A key marked in flight ([`InFlightKeys::claim`]), until dropped with the transaction.
struct InFlightMark {
    keys: InFlightKeys,
    key: RecordKey,
}

impl Drop for InFlightMark {
    fn drop(&mut self) {
        let mut keys = self.keys.0.lock().unwrap_or_else(PoisonError::into_inner);
        keys.remove(&self.key);
    }
}

/// A transaction begun on a connection of the pool in one call ([`open_sql`], with
/// `then`, more SQL to run in it), and its marker. A call that failed after `BEGIN
/// IMMEDIATE` took the lock leaves its connection inside that transaction while sqlx
/// hands it out again as if outside one: every connection opened before now is replaced
/// then. One that failed before (no connection to be had, or the lock still held by
/// another writer when the busy timeout ran out: `SQLITE_BUSY` can only come from the
/// `BEGIN`) began nothing, and the pool is kept.
async fn open(
    store: &SqlStore<Sqlite>,
    then: &str,
) -> Result<(Transaction<'static, Sqlite>, i64), StoreError> {
    let marker = random_marker();
    let sql = open_sql(marker, then);
    match store.timed(store.pool.begin_with(AssertSqlSafe(sql))).await {
        Ok(Ok(tx)) => Ok((tx, marker)),
        Ok(Err(error)) => {
            if !began_nothing(&error) {
                store.state.health.recycle();
            }
            Err(Sqlite::fault(store, error))
        }
        Err(limit) => {
            store.state.health.recycle();
            Err(StoreError::unavailable(no_answer(limit)))
        }
    }
}

/// Whether `error`, from the call of [`open`], says that no transaction was begun: no
/// connection of the pool was had in time, or `BEGIN IMMEDIATE` found the lock held
/// past the busy timeout (`SQLITE_BUSY`, 5, and its extended codes).
fn began_nothing(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::PoolTimedOut => true,
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|code| code.parse::<i32>().ok())
            .is_some_and(|code| code & 0xff == 5),
        _ => false,
    }
}

/// A key registered by its mark alone (read under the mark, no record): [`open_sql`] on
/// a connection of the pool, one call that begins the transaction and writes its marker,
/// and nothing of the key written: its record, as the completion will insert it
/// ([`TxDialect::INSERT_COMPLETED_IN_TX`]), and the mark, which goes with the transaction.
async fn registered_by_mark(
    store: &SqlStore<Sqlite>,
    reservation: Reservation,
    registration: &Registration<'_>,
    mark: Box<dyn Send + Sync>,
) -> Result<Registered<Sqlite>, StoreError> {
    let (tx, marker) = open(store, "").await?;
    let record = crate::store::Record::started(registration.new, registration.now);
    store.state.in_flight.started(registration.key, &record);
    let open = OpenTransaction::new(tx, marker, reservation)
        .registered(Some(mark))
        .written_at_completion(record.clone())
        .committed_by_completion();
    Ok(Registered::Started(record, open))
}

/// The completion of a key registered by its mark alone, and its commit: one call
/// ([`TxDialect::INSERT_COMPLETED_IN_TX`], the transaction's marker bound last) that
/// inserts the record, checks that it did, commits, and begins a transaction of nothing
/// (so that sqlx, which counts the transaction as open, ends one), which the caller
/// drops. Committed, the store's one writer and the key's mark are let go at once.
///
/// A call that fails is looked into by the connection's marker row (`idem_open`): gone
/// (another transaction's marker, or none), SQLite rolled the transaction back by itself
/// (or the handler did); still there with the record written (`written`), only the
/// commit failed, and the caller's commit tries again (or, after the handler's own
/// `COMMIT`, which kept the row and left the record written in autocommit, fails as it
/// did before); still there without it, either the check refused (the key has a row
/// committed by another process, and the attempt lost its record) or a statement failed.
async fn complete_unwritten(
    store: &SqlStore<Sqlite>,
    tx: &mut OpenTransaction<Sqlite>,
    completion: Statement<Sqlite>,
) -> Result<(), StoreError> {
    let error = match completion.int(tx.marker).execute(&mut tx.tx).await {
        Ok(_) => {
            tx.committed = true;
            drop(std::mem::take(&mut tx.reservation));
            tx.claim = None;
            return Ok(());
        }
        Err(error) => error,
    };
    match marker_row(store, tx).await? {
        Some((marker, Some(1))) if marker == tx.marker => Ok(()),
        Some((marker, _)) if marker == tx.marker && refused_by_check(&error) => {
            Err(StoreError::LeaseLost)
        }
        Some((marker, _)) if marker == tx.marker => Err(Sqlite::fault(store, error)),
        _ => Err(rolled_back_by_itself()),
    }
}

/// The connection's marker row ([`open_sql`]) as the transaction `tx` sees it: its
/// marker and whether the completion wrote the record; none when no transaction of the
/// connection wrote one.
async fn marker_row(
    store: &SqlStore<Sqlite>,
    tx: &mut OpenTransaction<Sqlite>,
) -> Result<Option<(i64, Option<i64>)>, StoreError> {
    sqlx::query_as("SELECT marker, written FROM temp.idem_open WHERE id = 1")
        .fetch_optional(&mut *tx.tx)
        .await
        .map_err(|error| Sqlite::fault(store, error))
}

/// Whether `error` is a `CHECK` constraint's refusal: the completion's check that its
/// record was written ([`TxDialect::INSERT_COMPLETED_IN_TX`]).
fn refused_by_check(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.kind() == sqlx::error::ErrorKind::CheckViolation)
}

/// The error of a transaction SQLite ended by itself before idem could commit it.
fn rolled_back_by_itself() -> StoreError {
    StoreError::TransactionEnded(
        "SQLite rolled it back before idem could commit (a conflict clause such as `OR ROLLBACK`, or a trigger's `RAISE(ROLLBACK)`)"
            .into(),
    )
}

/// A transaction's marker: random, so that no transaction of a connection has the marker
/// of one before it.
fn random_marker() -> i64 {
    i64::from_ne_bytes(
        uuid::Uuid::new_v4().as_bytes()[..8]
            .try_into()
            .unwrap_or([0; 8]),
    )
}

/// The one call that begins an attempt's transaction, with `marker` (a number, written
/// into the SQL as digits) and `then` (more SQL to run in the transaction, after the
/// marker): the connection's temporary table `idem_open` made if it has none (before the
/// transaction, so that no rollback takes it away), `BEGIN IMMEDIATE`, and the marker as
/// the table's one row (`written` null until the completion writes the record:
/// [`TxDialect::INSERT_COMPLETED_IN_TX`]). A rollback of the transaction, SQLite's own
/// included, puts the row back as it was; a commit, the handler's own included, keeps it.
/// One call to the connection's thread, where three statements would be three.
fn open_sql(marker: i64, then: &str) -> String {
    format!(
        "CREATE TEMP TABLE IF NOT EXISTS idem_open (id INTEGER PRIMARY KEY CHECK (id = 1), marker INTEGER NOT NULL, \
         written INTEGER CHECK (written IS NULL OR written = 1)); \
         BEGIN IMMEDIATE; \
         INSERT OR REPLACE INTO temp.idem_open (id, marker) VALUES (1, {marker}){then}"
    )
}

/// The release inside an attempt's transaction, which holds the write lock: the owner
/// token alone (`$4`) fences.
const RELEASE_LOCKED: &str = release_sql!("");

/// How long an attempt waits for the one writer's turn before it is answered with 503:
/// the busy timeout of the connections.
const WRITER_WAIT: Duration = Duration::from_secs(5);

impl TxDialect for Sqlite {
    /// The completion inside an attempt's transaction, with the values of
    /// `SqlStore::completion`, on the condition that the connection's marker row is still
    /// the transaction's (`$10`, [`open_sql`]): the transaction holds the only write lock
    /// since its `BEGIN IMMEDIATE`, after the key was registered, so no other writer can
    /// have taken the record over meanwhile, and the owner token (`$4`) is the fence. The
    /// lease is not renewed while the lock is held and may have run out on the clock:
    /// `$5` (now) is not compared. A transaction SQLite rolled back by itself took its
    /// marker with it: the connection is in autocommit then, where this writes nothing.
    const COMPLETE_IN_TX: &'static str =
        completion_sql!(" AND EXISTS (SELECT 1 FROM temp.idem_open WHERE id = 1 AND marker = $10)");

    /// The completion of a key registered inside the transaction: its processing row is
    /// the marker (only this transaction, which holds the write lock, can have changed
    /// it), so the owner token alone fences.
    const COMPLETE_REGISTERED_IN_TX: &'static str = completion_sql!("");

    const FENCES_BY_LOCK: bool = true;

    /// The record of a key registered by its mark alone, written once, completed, in the
    /// transaction that [`open_sql`] began, on the condition that the connection's marker
    /// is still that transaction's (`$15`; `$4` the token is bound and not used), then
    /// the check that it was written, the commit and an empty `BEGIN`, in one call
    /// ([`complete_unwritten`]): the write lock is held for one call less than with the
    /// commit on its own, and the caller drops a transaction of nothing.
    ///
    /// A transaction SQLite rolled back by itself (a conflict clause such as `OR
    /// ROLLBACK`) took its marker with it, and the connection is in autocommit then,
    /// where this writes nothing and the `COMMIT` fails; one the handler committed itself
    /// kept it, and the record is written beside the effect that was committed. A row of
    /// the key whose TTL has passed at `$5` (now) is replaced, as a new key's: the read
    /// under the mark does not see it (`get` leaves such records out). Any other row of
    /// the key is kept, and nothing written: one committed by another process after this
    /// one read the key (this process's attempts are held off by the mark).
    ///
    /// The check writes the marker row whatever it holds: `written` takes `changes()`
    /// when the row is this transaction's, 0 when it is another's, and a missing row is
    /// written with `changes()`, 0 then. Its `CHECK` refuses 0, which stops the call
    /// before the `COMMIT` whenever the record was not written: the key held by another
    /// process (the attempt loses its record, and everything it wrote rolls back), or a
    /// transaction that is no longer this one, such as one the handler began after SQLite
    /// rolled its own back (the `COMMIT` would commit its writes without their record).
    const INSERT_COMPLETED_IN_TX: Option<&'static str> = Some(insert_completed_sql!(
        "FROM temp.idem_open WHERE id = 1 AND marker = $15
        ON CONFLICT (operation, client, key) DO UPDATE SET
            operation_id = excluded.operation_id, fingerprint = excluded.fingerprint,
            state = excluded.state, attempt = excluded.attempt, token = NULL,
            lease_until = NULL, created_at = excluded.created_at,
            expires_at = excluded.expires_at, status = excluded.status,
            headers = excluded.headers, body = excluded.body, reason = NULL,
            stored_bytes = excluded.stored_bytes, transactional = excluded.transactional,
            history = NULL
        WHERE idem_records.expires_at <= $5;
        INSERT INTO temp.idem_open (id, marker, written) VALUES (1, $15, changes())
        ON CONFLICT (id) DO UPDATE SET
            written = CASE WHEN marker = excluded.marker THEN excluded.written ELSE 0 END;
        COMMIT;
        BEGIN"
    ));

    /// A key registered by its mark alone: [`complete_unwritten`]. A key registered under
    /// the lock: its processing row is the marker. Otherwise one statement
    /// ([`TxDialect::COMPLETE_IN_TX`]), and only a refusal is looked into: the marker row
    /// still the transaction's, the record is no longer this attempt's (taken over before
    /// the transaction began); gone, SQLite rolled the transaction back by itself.
    async fn complete_in(
        store: &SqlStore<Sqlite>,
        tx: &mut OpenTransaction<Sqlite>,
        completion: Statement<Sqlite>,
    ) -> Result<(), StoreError> {
        let ended = rolled_back_by_itself;
        if tx.unwritten.is_some() {
            return complete_unwritten(store, tx, completion).await;
        }
        if tx.registered {
            // The key's own processing row is the marker: only this transaction can
            // have changed it (it holds the write lock), so a completion that finds it
            // no more finds a transaction SQLite rolled back. In autocommit then, the
            // update matches nothing, so it writes nothing.
            return match store.execute(&mut tx.tx, completion).await? {
                1 => Ok(()),
                _ => Err(ended()),
            };
        }
        if store.execute(&mut tx.tx, completion.int(tx.marker)).await? == 1 {
            return Ok(());
        }
        match marker_row(store, tx).await? {
            Some((marker, _)) if marker == tx.marker => Err(StoreError::LeaseLost),
            _ => Err(ended()),
        }
    }

    /// This store's one writer permit (transactions run one at a time), waited for at
    /// most 5 s (the busy timeout): the wait holds no connection of the pool and happens
    /// before the key is registered.
    async fn reserve(store: &SqlStore<Sqlite>) -> Result<Reservation, StoreError> {
        let permit =
            tokio::time::timeout(WRITER_WAIT, Arc::clone(&store.state.writer).acquire_owned())
                .await
                .map_err(|_| {
                    StoreError::unavailable(
                        "another attempt's transaction held SQLite's one writer for 5 s",
                    )
                })?
                .map_err(StoreError::unavailable)?;
        Ok(Reservation::new(Some(permit)))
    }

    /// A mark in this process's [`InFlightKeys`].
    fn mark(
        store: &SqlStore<Sqlite>,
        key: &RecordKey,
        attempt: InFlight,
    ) -> Option<Result<KeyMark, InFlight>> {
        Some(
            store
                .state
                .in_flight
                .claim(key, attempt)
                .map(|mark| KeyMark::new(Box::new(mark))),
        )
    }

    fn try_reserve(store: &SqlStore<Sqlite>) -> Option<Reservation> {
        let permit = Arc::clone(&store.state.writer).try_acquire_owned().ok()?;
        Some(Reservation::new(Some(permit)))
    }

    /// `BEGIN IMMEDIATE` on a connection of the pool, in one call ([`open`]): the write
    /// lock is taken at the start, so that the transaction never fails halfway because
    /// another connection wrote first. Its marker is the connection's marker row
    /// ([`open_sql`]): gone if SQLite rolls the transaction back by itself. What the
    /// handler writes comes after the savepoint `idem_business`, so that it can be undone
    /// while the key is released in the same transaction (`release_in`). Within the
    /// store's call timeout, if it has one; the attempt's time (`_within`) bounds nothing
    /// here: the file is on this machine, and its busy timeout bounds the wait for a lock.
    async fn begin_transaction(
        store: &SqlStore<Sqlite>,
        reservation: Reservation,
        _within: Duration,
    ) -> Result<OpenTransaction<Sqlite>, StoreError> {
        store.state.health.check_file()?;
        let (tx, marker) = open(store, "; SAVEPOINT idem_business").await?;
        Ok(OpenTransaction::new(tx, marker, reservation))
    }

    /// The key marked in this process's [`InFlightKeys`] (a duplicate finds it there at
    /// once, without the write lock), then `BEGIN IMMEDIATE`. A key whose mark came with
    /// `reservation` ([`Reservation::marked`]) was read under it and had no record: it is
    /// registered by the mark alone ([`registered_by_mark`]), nothing written until the
    /// completion inserts the record, completed, when no budget needs counting. Any other
    /// key is marked here and its registration written under the lock
    /// ([`register_locked`]); a record this attempt may not take ends the transaction and
    /// the mark.
    async fn begin_registered(
        store: &SqlStore<Sqlite>,
        mut reservation: Reservation,
        registration: Registration<'_>,
        _within: Duration,
    ) -> Result<Registered<Sqlite>, StoreError> {
        let (mark, found_missing) = match reservation.take_mark() {
            Some(mark) => (mark.into_guard(), true),
            None => {
                // Its attempt number is known once registered; a duplicate that finds the
                // mark before then is told the first.
                let attempt = InFlight {
                    operation_id: registration.new.operation_id,
                    attempt: 1,
                    until: registration.new.holds_until,
                };
                match store.state.in_flight.claim(registration.key, attempt) {
                    Ok(mark) => (Box::new(mark) as Box<dyn Send + Sync>, false),
                    Err(holder) => return Ok(Registered::InFlight(holder, reservation)),
                }
            }
        };
        store.state.health.check_file()?;
        if found_missing && registration.counted_budget().is_none() {
            return registered_by_mark(store, reservation, &registration, mark).await;
        }
        // No marker and no savepoint: the key's row is the marker (`complete_in`), and a
        // rollback undoes everything at once.
        let mut tx = store
            .bounded(store.pool.begin_with("BEGIN IMMEDIATE"))
            .await?;
        let begun = register_locked(store, &mut tx, &registration).await;
        let refused = |tx: Transaction<'static, Sqlite>| async move {
            if let Err(error) = tx.rollback().await {
                let _ = Sqlite::rollback_failed(store, error);
            }
        };
        Ok(match begun {
            Ok(Begin::Started(record)) => {
                store.state.in_flight.started(registration.key, &record);
                let open = OpenTransaction::new(tx, 0, reservation);
                Registered::Started(record, open.registered(Some(mark)))
            }
            Ok(Begin::Exists(record)) => {
                refused(tx).await;
                Registered::Exists(record, reservation)
            }
            Ok(Begin::OverBudget(over)) => {
                refused(tx).await;
                Registered::OverBudget(over, reservation)
            }
            Err(error) => {
                refused(tx).await;
                return Err(error);
            }
        })
    }

    async fn in_flight(
        store: &SqlStore<Sqlite>,
        key: &RecordKey,
    ) -> Result<Option<InFlight>, StoreError> {
        Ok(store.state.in_flight.get(key))
    }

    /// `ROLLBACK TO SAVEPOINT idem_business` (what the handler wrote is undone, the lock
    /// is kept), then the release by the owner token alone, in the same transaction.
    async fn release_in(
        store: &SqlStore<Sqlite>,
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
            Err(error) => return Err(Sqlite::fault(store, error)),
        }
        let statement = Statement::keyed(RELEASE_LOCKED, key).token(token);
        let result = store.execute(&mut tx.tx, statement).await?;
        changed_one(result).map(|()| true)
    }

    /// sqlx still counts the connection as inside a transaction: the pool replaces every
    /// connection opened before now, that one included.
    fn rollback_failed(store: &SqlStore<Sqlite>, error: sqlx::Error) -> StoreError {
        tracing::warn!(error = %error, "idem: a rollback failed; the pool replaces its connections");
        store.state.health.recycle();
        StoreError::unavailable(error)
    }

    /// sqlx stops a call whose caller went away after the statement it runs: the one
    /// call of [`TxDialect::INSERT_COMPLETED_IN_TX`] may have committed without its
    /// `BEGIN`, on a connection sqlx still counts as inside a transaction. The pool
    /// replaces every connection opened before now.
    fn completion_abandoned(store: &SqlStore<Sqlite>) {
        tracing::warn!(
            "idem: a completion was given up while it ran; the pool replaces its connections"
        );
        store.state.health.recycle();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sqlx::{Connection, Executor, SqliteConnection};

    use super::open;
    use crate::store::StoreError;
    use crate::store::open::Bounds;
    use crate::store::sql::sqlite::SqliteStore;

    /// Another writer holds SQLite's lock past the busy timeout: the begin fails as
    /// unavailable and the pool's connections are kept, since nothing was begun on them.
    /// A begin that fails after `BEGIN IMMEDIATE` (here its next statement) replaces them,
    /// and the next begin on the pool goes through, on a connection outside any
    /// transaction.
    #[tokio::test]
    async fn a_busy_lock_keeps_the_pool_a_failed_begin_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("busy.db");
        let bounds = Bounds {
            limit: Duration::from_millis(200),
            call: Duration::from_secs(10),
        };
        let store = SqliteStore::open_within(&path, Some(bounds)).await.unwrap();
        let url = format!("sqlite://{}", path.display());
        let mut other = SqliteConnection::connect(&url).await.unwrap();
        other.execute("BEGIN IMMEDIATE").await.unwrap();

        let busy = open(&store, "").await;
        assert!(matches!(busy, Err(StoreError::Unavailable(_))), "{busy:?}");
        assert!(
            !store.state.health.recycled(),
            "a busy lock replaced the pool"
        );

        other.execute("ROLLBACK").await.unwrap();
        let (tx, _) = open(&store, "").await.unwrap();
        tx.rollback().await.unwrap();
        assert!(!store.state.health.recycled());

        let failed = open(&store, "; SELECT * FROM no_such_table").await;
        assert!(
            matches!(failed, Err(StoreError::Unavailable(_))),
            "{failed:?}"
        );
        assert!(
            store.state.health.recycled(),
            "a begun transaction was handed out"
        );
        for _ in 0..3 {
            let (tx, _) = open(&store, "").await.unwrap();
            tx.rollback().await.unwrap();
        }
    }
}
