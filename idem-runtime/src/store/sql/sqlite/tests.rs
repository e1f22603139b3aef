//! The SQLite store's own tests: the conformance suite on a file and in memory, a
//! record that survives a reopen, and the file's faults.

use super::SqliteStore;
use crate::store::conformance::{self, T0, created, key, new_record};
use crate::store::{Begin, OperatorStore, RecordState, RecordStore, StoreError};

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
    assert_eq!(tables, ["idem_records", "idem_steps", "orders"]);
}

/// A table made by an older version, before the transactional mode and the history: its
/// records read back once the store has added the columns it lacks, and the new columns
/// are written as they are in a new table.
#[tokio::test]
async fn an_older_table_gets_the_columns_it_lacks() {
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE idem_records (
            operation TEXT NOT NULL, client TEXT NOT NULL, key TEXT NOT NULL,
            operation_id TEXT NOT NULL, fingerprint TEXT NOT NULL, state TEXT NOT NULL,
            attempt INTEGER NOT NULL, token TEXT, lease_until INTEGER,
            created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,
            status INTEGER, headers TEXT, body BLOB, reason TEXT,
            PRIMARY KEY (operation, client, key)
        )",
    )
    .execute(&pool)
    .await
    .unwrap();
    let old = key("old");
    sqlx::query(
        "INSERT INTO idem_records (operation, client, key, operation_id, fingerprint, state,
             attempt, created_at, expires_at)
         VALUES ($1, $2, $3, '0190a5e2-7b3c-7def-8000-000000000001', 'sha256:a', 'released',
             1, $4, $5)",
    )
    .bind(&old.operation)
    .bind(&old.client)
    .bind(&old.key)
    .bind(i64::try_from(T0).unwrap())
    .bind(i64::try_from(T0 + conformance::TTL).unwrap())
    .execute(&pool)
    .await
    .unwrap();

    let store = SqliteStore::from_pool(pool).await.unwrap();
    let columns: Vec<String> =
        sqlx::query_scalar("SELECT name FROM pragma_table_info('idem_records') ORDER BY cid")
            .fetch_all(store.pool())
            .await
            .unwrap();
    assert_eq!(
        columns[columns.len() - 3..],
        ["transactional", "history", "stored_bytes"]
    );
    let record = store.get(&old, T0).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Released);
    assert!(!record.transactional);

    // The released key is taken again (an event in the new history column).
    let again = new_record("sha256:a", T0 + 1);
    assert!(matches!(
        store.begin(&old, &again, T0 + 1).await.unwrap(),
        Begin::Started(record) if record.attempt == 2
    ));
    let inspection = store.inspect(&old, T0 + 1).await.unwrap().unwrap();
    assert_eq!(inspection.attempts.len(), 2);
}

/// 20,000 records of `create_order` over 100 clients, `$1` now: the first 1,000 expired
/// (the rest expire over the next 21 hours), every 100th processing, and every 200th of
/// those with its lease ended.
const TWENTY_THOUSAND: &str = "WITH RECURSIVE n(i) AS (
        SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000
    )
    INSERT INTO idem_records
        (operation, client, key, operation_id, fingerprint, state, attempt, token,
         lease_until, created_at, expires_at, status, headers, body, stored_bytes)
    SELECT 'create_order', 'client-' || (i % 100), 'key-' || i,
        '01900000-0000-7000-8000-' || printf('%012d', i), 'sha256:0',
        CASE WHEN i % 100 = 0 THEN 'processing' ELSE 'completed' END, 1,
        CASE WHEN i % 100 = 0 THEN 'ab' END,
        CASE WHEN i % 200 = 0 THEN $1 - 1000 WHEN i % 100 = 0 THEN $1 + 60000 END,
        $1 - 1000, $1 + (i - 1000) * 4000,
        CASE WHEN i % 100 = 0 THEN NULL ELSE 201 END, '[]', x'7b7d', 2
    FROM n";

/// The plan of `sql` on `conn` with `now` as `$1` and the other values bound in order:
/// the `detail` of each row of `EXPLAIN QUERY PLAN`.
async fn query_plan(
    conn: &mut sqlx::SqliteConnection,
    sql: &str,
    now: i64,
    rest: &[Option<&str>],
) -> Vec<String> {
    let sql = format!("EXPLAIN QUERY PLAN {sql}");
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now);
    for value in rest {
        query = query.bind(*value);
    }
    let rows = query.fetch_all(conn).await.unwrap();
    rows.iter()
        .map(|row| sqlx::Row::get::<String, _>(row, "detail"))
        .collect()
}

/// On a file of 20,000 records, not analyzed (as the store keeps its files) and then
/// analyzed, the reconciler's listing of ended leases searches the partial index on lease
/// ends and the purge the index on `expires_at`, never a scan of the records; and both
/// still find what they should.
#[tokio::test]
async fn the_listing_of_ended_leases_and_the_purge_read_indexes() {
    use crate::store::sql::dialect::Dialect;
    use crate::store::{ListQuery, Listed};
    use sqlx::Sqlite;

    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("plans.db"))
        .await
        .unwrap();
    let now: u64 = 1_800_000_000_000;
    let at = i64::try_from(now).unwrap();
    let loaded = sqlx::query(TWENTY_THOUSAND).bind(at).execute(store.pool());
    assert_eq!(loaded.await.unwrap().rows_affected(), 20_000);
    // Statistics that ANALYZE gathers reach the planner of the connection that ran it,
    // not the pool's other connections (until they read the schema again): the plans
    // are asked on that same connection, before and after.
    let mut conn = store.pool().acquire().await.unwrap();
    for analyzed in [false, true] {
        if analyzed {
            sqlx::query("ANALYZE").execute(&mut *conn).await.unwrap();
        }
        let (op, one) = (Some("create_order"), Some("1"));
        let cursors = [[None, None, None], [op, Some("client-0"), Some("key-5000")]];
        for [a, b, c] in cursors {
            let rest = [op, None, one, a, b, c, Some("100")];
            let plan = query_plan(&mut conn, <Sqlite as Dialect>::LIST, at, &rest).await;
            let searched = plan
                .iter()
                .any(|d| d.starts_with("SEARCH idem_records USING INDEX idem_records_lease_ended"));
            assert!(searched, "analyzed: {analyzed}, {plan:#?}");
        }
        let plan = query_plan(&mut conn, <Sqlite as Dialect>::PURGE, at, &[]).await;
        assert_eq!(
            plan,
            ["SEARCH idem_records USING INDEX idem_records_expires_at (expires_at<?)"],
            "analyzed: {analyzed}"
        );
    }
    let query = ListQuery {
        operation: Some("create_order".into()),
        lease_ended: true,
        limit: 1000,
        ..ListQuery::default()
    };
    let listed = store.list(&query, now).await.unwrap();
    // Every 200th of 1,200 ..= 20,000: the ended leases of records not expired.
    assert_eq!(listed.len(), 95);
    let order = |l: &Listed| {
        (
            l.key.operation.clone(),
            l.key.client.clone(),
            l.key.key.clone(),
        )
    };
    assert!(
        listed.windows(2).all(|w| order(&w[0]) < order(&w[1])),
        "in byte order"
    );
    assert_eq!(store.purge_expired(now).await.unwrap(), 1000);
}
