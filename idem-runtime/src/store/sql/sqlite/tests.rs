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
