//! A value in the store that idem did not write (another program's key under the Redis
//! prefix, a manual `SET`, an SQL row that does not parse) is skipped by the operator's
//! calls — `list` (which `idem ops list` and the reconciler use) and `inspect` (`idem ops
//! show`) — with a warning that names it, and the rest goes on.

use idem_runtime::store::conformance::postgres::scratch_url;
use idem_runtime::store::conformance::redis::{scratch_store, url_or_skip};
use idem_runtime::store::conformance::{T0, new_record};
use idem_runtime::store::{
    Begin, ListQuery, OperatorStore, PostgresStore, RecordKey, RecordStore, SqliteStore,
    StoredResponse,
};

fn key(name: &str) -> RecordKey {
    RecordKey::new("create_order", "client-a", name)
}

/// Registers and completes `name`, a record the listing must keep showing.
async fn completed(store: &impl RecordStore, name: &str) {
    let new = new_record("sha256:a", T0);
    let Begin::Started(_) = store.begin(&key(name), &new, T0).await.unwrap() else {
        panic!("a fresh key is started");
    };
    let response = StoredResponse {
        status: 201,
        headers: Vec::new(),
        body: "{}".into(),
    };
    store
        .complete(&key(name), new.lease.token, &response, T0 + 1)
        .await
        .unwrap();
}

/// The listing holds exactly the good records, in order.
async fn listed(store: &impl OperatorStore) -> Vec<String> {
    let query = ListQuery {
        limit: 100,
        ..ListQuery::default()
    };
    let all = store.list(&query, T0 + 2).await.unwrap();
    all.into_iter().map(|l| l.key.key).collect()
}

#[tokio::test]
async fn redis_skips_values_it_did_not_write() {
    let Some(url) = url_or_skip("foreign values under the Redis prefix").await else {
        return;
    };
    let store = scratch_store(&url).await;
    completed(&store, "good-1").await;
    completed(&store, "good-2").await;
    let mut conn = store.connection().clone();
    let prefix = store.hash_name(&key("x"));
    let prefix = &prefix[..prefix.find(':').unwrap()];
    // Another program's string, and a hash under a record's own name that is no record.
    let _: () = redis::cmd("SET")
        .arg(format!("{prefix}:someone-else"))
        .arg("not a record")
        .query_async(&mut conn)
        .await
        .unwrap();
    let broken = store.hash_name(&key("broken"));
    let _: () = redis::cmd("HSET")
        .arg(&broken)
        .arg("prefix")
        .arg(prefix)
        .arg("state")
        .arg("no such state")
        .query_async(&mut conn)
        .await
        .unwrap();
    let string = store.hash_name(&key("string"));
    let _: () = redis::cmd("SET")
        .arg(&string)
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(listed(&store).await, ["good-1", "good-2"]);
    for name in ["broken", "string"] {
        let shown = store.inspect(&key(name), T0 + 2).await.unwrap();
        assert!(shown.is_none(), "`{name}` is no record to show");
    }
    assert!(
        store
            .inspect(&key("good-1"), T0 + 2)
            .await
            .unwrap()
            .is_some()
    );
}

/// Turns the record `broken` into a row that does not parse (an operation id that is no
/// UUID; the schema's checks cover the state, not this).
const BREAK: &str = "UPDATE idem_records SET operation_id = 'not an id' WHERE key = 'broken'";

#[tokio::test]
async fn sqlite_skips_rows_that_do_not_parse() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
    for name in ["good-1", "broken", "good-2"] {
        completed(&store, name).await;
    }
    sqlx::query(BREAK).execute(store.pool()).await.unwrap();
    assert_eq!(listed(&store).await, ["good-1", "good-2"]);
    assert!(
        store
            .inspect(&key("broken"), T0 + 2)
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn postgres_skips_rows_that_do_not_parse() {
    let Some(url) = scratch_url("rows that do not parse on PostgreSQL").await else {
        return;
    };
    let store = PostgresStore::connect(&url).await.unwrap();
    for name in ["good-1", "broken", "good-2"] {
        completed(&store, name).await;
    }
    sqlx::query(BREAK).execute(store.pool()).await.unwrap();
    assert_eq!(listed(&store).await, ["good-1", "good-2"]);
    assert!(
        store
            .inspect(&key("broken"), T0 + 2)
            .await
            .unwrap()
            .is_none()
    );
}
