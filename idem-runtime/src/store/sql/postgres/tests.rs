//! The PostgreSQL store's own tests, on scratch schemas of a real server: the
//! conformance suite, the migrations, the schema's own checks, an unreachable server, a
//! completion inside a transaction, and the bounds that hold through a partition.

use std::time::{Duration, Instant};

use sqlx::postgres::PgPoolOptions;

use super::transactional::{LOCKED, server_limit};
use super::{DEFAULT_CALL_TIMEOUT, PostgresStore};
use crate::store::conformance::postgres::{scratch_pool, scratch_url};
use crate::store::conformance::{self, T0, created, key, new_record};
use crate::store::{Begin, RecordStore, Reservation, StoreError, TransactionalStore};

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

/// The store's clock is the server's `clock_timestamp()`, read in one round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clock_is_the_servers() {
    let Some(pool) = scratch_pool("the postgres clock").await else {
        return;
    };
    let store = PostgresStore::from_pool(pool).await.unwrap();
    conformance::the_clock_is_the_servers(std::sync::Arc::new(store), Duration::from_millis(250))
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
    assert_eq!(versions, [1, 2, 3, 4, 5, 6]);
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes
        WHERE tablename = 'idem_records' AND schemaname = current_schema() ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        indexes,
        [
            "idem_records_client_live",
            "idem_records_expires_at",
            "idem_records_lease_ended",
            "idem_records_pkey"
        ],
        "migration 6 replaced the budget's index"
    );
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
    let result = PostgresStore::connect("postgres://idem@127.0.0.1:9/idem?sslmode=disable").await;
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
            .begin_transaction(Reservation::default(), Duration::from_secs(10))
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

/// `new` registered for `k`, a key without a record, inside a transaction of `store`:
/// the record as the completion will write it, and the open transaction.
async fn registered_new(
    store: &PostgresStore,
    k: &crate::store::RecordKey,
    new: &crate::store::NewRecord,
) -> (
    crate::store::Record,
    crate::store::OpenTransaction<sqlx::Postgres>,
) {
    let within = Duration::from_secs(10);
    let registered = store
        .begin_registered(Reservation::default(), k, new, T0, within)
        .await
        .unwrap();
    match registered {
        crate::store::Registered::Started(record, open) => (record, open),
        other => panic!("a new key starts: {other:?}"),
    }
}

/// A new key registered in its transaction writes nothing until its completion, which
/// inserts the record once, completed: meanwhile the key reads as absent and in flight
/// from other sessions, and the transaction itself inserted one row and updated none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_key_is_written_once_at_its_completion() {
    use crate::store::RecordState;

    let Some(pool) = scratch_pool("postgres written once").await else {
        return;
    };
    let store = PostgresStore::from_pool(pool).await.unwrap();
    let k = key("once");
    let new = new_record("sha256:a", T0);
    let (record, mut open) = registered_new(&store, &k, &new).await;
    assert_eq!(record.operation_id, new.operation_id);
    assert!(open.unwritten.is_some(), "nothing written at registration");
    assert!(store.get(&k, T0).await.unwrap().is_none());
    let holder = store.in_flight(&k).await.unwrap().expect("in flight");
    assert_eq!(holder.operation_id, new.operation_id);
    store
        .complete_in(&mut open, &k, new.lease.token, &created(), T0)
        .await
        .unwrap();
    let (inserted, updated): (i64, i64) = sqlx::query_as(
        "SELECT n_tup_ins, n_tup_upd FROM pg_stat_xact_user_tables
        WHERE relid = 'idem_records'::regclass",
    )
    .fetch_one(&mut *open.tx)
    .await
    .unwrap();
    assert_eq!((inserted, updated), (1, 0), "one row version, written once");
    assert!(
        store.get(&k, T0).await.unwrap().is_none(),
        "not before the commit"
    );
    open.tx.commit().await.unwrap();
    let stored = store.get(&k, T0).await.unwrap().expect("committed");
    assert_eq!(stored.operation_id, new.operation_id);
    assert_eq!(stored.expires_at, record.expires_at);
    assert!(matches!(stored.state, RecordState::Completed { .. }));
    assert!(
        store.in_flight(&k).await.unwrap().is_none(),
        "the lock went with the commit"
    );
}

/// The statement that takes a key's lock is the key's only read in the transactional
/// mode: a completed key is answered from it (and its transaction rolled back) without
/// a transaction id taken, while a new key's statement takes one (its marker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_locks_statement_reads_the_record_and_a_replay_takes_no_transaction_id() {
    use crate::store::{RecordState, Registered};

    let Some(pool) = scratch_pool("postgres lock reads").await else {
        return;
    };
    let store = PostgresStore::from_pool(pool).await.unwrap();
    let k = key("replayed");
    let first = new_record("sha256:a", T0);
    assert!(matches!(
        store.begin(&k, &first, T0).await.unwrap(),
        Begin::Started(_)
    ));
    store
        .complete(&k, first.lease.token, &created(), T0)
        .await
        .unwrap();
    let retry = new_record("sha256:a", T0);
    let within = Duration::from_secs(10);
    match store
        .begin_registered(Reservation::default(), &k, &retry, T0, within)
        .await
        .unwrap()
    {
        Registered::Exists(record, _) => {
            assert_eq!(record.operation_id, first.operation_id);
            assert!(matches!(record.state, RecordState::Completed { .. }));
        }
        other => panic!("the completed record answers: {other:?}"),
    }
    assert!(
        store.in_flight(&k).await.unwrap().is_none(),
        "the lock was let go"
    );

    // The statement itself: what it takes of the transaction, with and without a record.
    for (name, has_record) in [("replayed", true), ("new", false)] {
        let mut tx = store.pool().begin().await.unwrap();
        let named = key(name);
        let row: (bool, Option<i64>, Option<String>) = sqlx::query(LOCKED)
            .bind("10000")
            .bind("idem test")
            .bind(&named.operation)
            .bind(&named.client)
            .bind(&named.key)
            .fetch_one(&mut *tx)
            .await
            .map(|row: sqlx::postgres::PgRow| {
                use sqlx::Row;
                (row.get("locked"), row.get("marker"), row.get("state"))
            })
            .unwrap();
        let assigned: Option<i64> = sqlx::query_scalar("SELECT txid_current_if_assigned()")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        assert!(row.0, "{name}: the lock is free");
        assert_eq!(row.2.is_some(), has_record, "{name}: the record read");
        assert_eq!(row.1.is_some(), !has_record, "{name}: the marker");
        assert_eq!(
            assigned, row.1,
            "{name}: a transaction id only with the marker"
        );
    }
}

/// A record committed for the key after the lock's statement took its snapshot (by the
/// lock's previous holder, an instant before it let go) is not overwritten: the
/// completion inserts nothing, the attempt loses its record, and its transaction rolls
/// back with what it wrote, leaving the other record as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_committed_behind_the_locks_snapshot_wins() {
    use crate::store::RecordState;

    let Some(pool) = scratch_pool("postgres behind the snapshot").await else {
        return;
    };
    let store = PostgresStore::from_pool(pool).await.unwrap();
    sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY)")
        .execute(store.pool())
        .await
        .unwrap();
    let k = key("behind");
    let new = new_record("sha256:a", T0);
    let (_, mut open) = registered_new(&store, &k, &new).await;
    sqlx::query("INSERT INTO orders VALUES ('o-1')")
        .execute(&mut *open.tx)
        .await
        .unwrap();
    // What the previous holder committed, seen by nobody's snapshot here: written by
    // another session, as the plain registration writes it.
    let other = new_record("sha256:a", T0);
    assert!(matches!(
        store.begin(&k, &other, T0).await.unwrap(),
        Begin::Started(_)
    ));
    store
        .complete(&k, other.lease.token, &created(), T0)
        .await
        .unwrap();
    let completed = store
        .complete_in(&mut open, &k, new.lease.token, &created(), T0)
        .await;
    assert!(
        matches!(completed, Err(StoreError::LeaseLost)),
        "{completed:?}"
    );
    open.tx.rollback().await.unwrap();
    let stored = store.get(&k, T0).await.unwrap().expect("the other record");
    assert_eq!(stored.operation_id, other.operation_id);
    assert!(matches!(stored.state, RecordState::Completed { .. }));
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(orders, 0, "the attempt's writes rolled back");
}

/// The server's bound on an attempt's transaction: its time left and a grace of a
/// quarter, at most 1 s; never 0 (no limit), never past what the settings hold.
#[test]
fn the_servers_bound_is_the_attempts_time_and_a_grace() {
    assert_eq!(
        server_limit(Duration::from_secs(10)),
        Duration::from_secs(11)
    );
    assert_eq!(
        server_limit(Duration::from_millis(200)),
        Duration::from_millis(250)
    );
    assert_eq!(server_limit(Duration::ZERO), Duration::from_millis(1));
    assert_eq!(
        server_limit(Duration::from_secs(40 * 24 * 60 * 60)),
        Duration::from_secs(24 * 60 * 60)
    );
}

/// Inside an attempt's transaction the server's `statement_timeout` and
/// `idle_in_transaction_session_timeout` are the attempt's bound; once it ends, the
/// session's own are back (they were set for the transaction only).
#[tokio::test]
async fn an_attempts_transaction_is_bounded_on_the_server() {
    let what = "the bounds of an attempt's transaction";
    let Some(url) = scratch_url(what).await else {
        return;
    };
    // One connection: the one the transaction ran on is the one asked afterwards.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap();
    let store = PostgresStore::from_pool(pool).await.unwrap();
    let settings = "SELECT string_agg(name || '=' || setting, ' ' ORDER BY name) FROM pg_settings
        WHERE name IN ('statement_timeout', 'idle_in_transaction_session_timeout')";
    let mut open = store
        .begin_transaction(Reservation::default(), Duration::from_secs(10))
        .await
        .unwrap();
    let inside: String = sqlx::query_scalar(settings)
        .fetch_one(&mut *open.tx)
        .await
        .unwrap();
    assert_eq!(
        inside,
        "idle_in_transaction_session_timeout=11000 statement_timeout=11000"
    );
    open.tx.rollback().await.unwrap();
    let after: String = sqlx::query_scalar(settings)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(
        after,
        "idle_in_transaction_session_timeout=0 statement_timeout=0"
    );
}

/// A transaction whose client went silent while it held a lock (an inserted row's
/// unique index entry) is ended by the server at its bound: another session's insert of
/// the same key waits until then, not for as long as the silence lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_ends_a_silent_transaction_at_its_bound() {
    let Some(pool) = scratch_pool("a silent transaction").await else {
        return;
    };
    sqlx::query("CREATE TABLE effects (id TEXT PRIMARY KEY)")
        .execute(&pool)
        .await
        .unwrap();
    let store = PostgresStore::from_pool(pool).await.unwrap();
    let within = Duration::from_millis(300);
    let mut open = store
        .begin_transaction(Reservation::default(), within)
        .await
        .unwrap();
    sqlx::query("INSERT INTO effects (id) VALUES ('one')")
        .execute(&mut *open.tx)
        .await
        .unwrap();
    // The client says nothing more; another session inserts the same key.
    let started = Instant::now();
    let mut other = store.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO effects (id) VALUES ('one')")
        .execute(&mut *other)
        .await
        .unwrap();
    other.commit().await.unwrap();
    let waited = started.elapsed();
    assert!(
        waited < server_limit(within) + Duration::from_secs(2),
        "the other insert waited {waited:?}"
    );
    // The silent transaction's session is gone: nothing more can be written in it.
    assert!(
        sqlx::query("SELECT 1")
            .execute(&mut *open.tx)
            .await
            .is_err()
    );
}

/// [`PostgresStore::connect`] asks the server to probe every connection and close one
/// gone silent ([`super::TCP_SETTINGS`]), unless the URL names a setting itself; its
/// calls, as those of a store over a pool of the application's, wait at most
/// [`DEFAULT_CALL_TIMEOUT`] for an answer.
#[tokio::test]
async fn connect_asks_the_server_to_probe_silent_connections() {
    let what = "the TCP settings of PostgresStore::connect";
    let Some(url) = scratch_url(what).await else {
        return;
    };
    let settings = "SELECT string_agg(name || '=' || setting, ' ' ORDER BY name) FROM pg_settings
        WHERE name LIKE 'tcp\\_%'";
    let store = PostgresStore::connect(&url).await.unwrap();
    assert_eq!(store.call_timeout, Some(DEFAULT_CALL_TIMEOUT));
    let asked: String = sqlx::query_scalar(settings)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(
        asked,
        "tcp_keepalives_count=3 tcp_keepalives_idle=5 tcp_keepalives_interval=5 tcp_user_timeout=20000"
    );
    store.close().await;
    let own = format!("{url}&options[tcp_keepalives_idle]=7");
    let store = PostgresStore::connect(&own).await.unwrap();
    let asked: String = sqlx::query_scalar(settings)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(asked.contains("tcp_keepalives_idle=7 "), "{asked}");
    assert!(asked.contains("tcp_user_timeout=20000"), "{asked}");
}

/// At most the pool's size less a quarter of it of attempts' transactions are open at
/// once, so that their own statements outside them always find a connection: a store
/// over 4 connections gives 3 turns, a fourth waits (as long as the pool waits for a
/// connection) and is refused, and a turn given back is taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_leave_connections_for_the_attempts_own_statements() {
    let Some(scratch) = scratch_pool("postgres transactions at once").await else {
        return;
    };
    let connect = (*scratch.connect_options()).clone();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_millis(300))
        .connect_with(connect)
        .await
        .unwrap();
    let store = PostgresStore::from_pool(pool).await.unwrap();
    let limit = Duration::from_secs(60);
    let mut open = Vec::new();
    for _ in 0..3 {
        let turn = store.try_reserve().expect("a turn");
        open.push(store.begin_transaction(turn, limit).await.unwrap());
    }
    assert!(
        store.try_reserve().is_none(),
        "three at once over four connections"
    );
    let started = std::time::Instant::now();
    assert!(matches!(
        store.reserve().await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(started.elapsed() >= Duration::from_millis(250));
    // The connection kept back serves the attempts' own statements meanwhile.
    let k = key("beside-the-transactions");
    assert!(matches!(
        store
            .begin(&k, &new_record("sha256:a", T0), T0)
            .await
            .unwrap(),
        Begin::Started(_)
    ));
    drop(open.pop());
    let turn = store.reserve().await.expect("a turn given back");
    open.push(store.begin_transaction(turn, limit).await.unwrap());
}

/// 20,000 records of `create_order` over 100 clients, `$1` now: the first 1,000 expired
/// (the rest expire over the next 21 hours), every 100th processing, and every 200th of
/// those with its lease ended.
const TWENTY_THOUSAND: &str = "INSERT INTO idem_records
        (operation, client, key, operation_id, fingerprint, state, attempt, token,
         lease_until, created_at, expires_at, status, headers, body, stored_bytes)
    SELECT 'create_order', 'client-' || (i % 100), 'key-' || i,
        '01900000-0000-7000-8000-' || lpad(i::text, 12, '0'), 'sha256:0',
        CASE WHEN i % 100 = 0 THEN 'processing' ELSE 'completed' END, 1,
        CASE WHEN i % 100 = 0 THEN 'ab' END,
        CASE WHEN i % 200 = 0 THEN $1 - 1000 WHEN i % 100 = 0 THEN $1 + 60000 END,
        $1 - 1000, $1 + (i - 1000) * 4000,
        CASE WHEN i % 100 = 0 THEN NULL ELSE 201 END, '[]', '\\x7b7d', 2
    FROM generate_series(1, 20000) AS i";

/// Every node of a plan of `EXPLAIN (FORMAT JSON)`, as `node type / relation / index`.
fn plan_nodes(plan: &serde_json::Value, nodes: &mut Vec<String>) {
    if let Some(node) = plan.get("Plan").or(Some(plan)).filter(|p| p.is_object()) {
        let field = |name: &str| node.get(name).and_then(|v| v.as_str()).unwrap_or("");
        if !field("Node Type").is_empty() {
            nodes.push(format!(
                "{} / {} / {}",
                field("Node Type"),
                field("Relation Name"),
                field("Index Name")
            ));
        }
        for child in node
            .get("Plans")
            .and_then(|p| p.as_array())
            .into_iter()
            .flatten()
        {
            plan_nodes(child, nodes);
        }
    }
}

/// The nodes of the plan of `execute` (an `EXECUTE` of a prepared statement) on `conn`.
async fn explain(conn: &mut sqlx::PgConnection, execute: &str) -> Vec<String> {
    let sql = format!("EXPLAIN (FORMAT JSON) {execute}");
    let row = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let text: String = sqlx::Row::try_get_unchecked(&row, 0).unwrap();
    let plans: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut nodes = Vec::new();
    plan_nodes(&plans[0], &mut nodes);
    nodes
}

/// A key's lookups (the record as it stands, the record unless expired, and the lock's
/// statement) read the primary key in generic plans made while the table is empty
/// and never analyzed, as a new table's first connections make them, and keep doing so
/// once the table holds 20,000 records; the budget's count reads its own partial index.
/// With the budget's index of migration 3 (not partial) those lookups read it instead.
#[tokio::test]
async fn key_lookups_read_the_primary_key_in_plans_made_for_an_empty_table() {
    use crate::store::sql::records::{GET, SELECT, USAGE};

    let Some(pool) = scratch_pool("postgres empty plans").await else {
        return;
    };
    let store = PostgresStore::from_pool(pool).await.unwrap();
    let mut conn = store.pool().acquire().await.unwrap();
    let prepare = format!(
        "ALTER TABLE idem_records SET (autovacuum_enabled = false);
        SET plan_cache_mode = force_generic_plan;
        PREPARE sel (text, text, text) AS {SELECT};
        PREPARE get (text, text, text, bigint) AS {GET};
        PREPARE locked (text, text, text, text, text) AS {LOCKED};
        PREPARE usage (text, bigint, bigint) AS {USAGE}"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(prepare))
        .execute(&mut *conn)
        .await
        .unwrap();
    let now: u64 = 1_800_000_000_000;
    let lookups = [
        "EXECUTE sel('create_order', 'client-7', 'key-107')".to_owned(),
        format!("EXECUTE get('create_order', 'client-7', 'key-107', {now})"),
        "EXECUTE locked('1000', 'idem x', 'create_order', 'client-7', 'key-107')".to_owned(),
    ];
    let usage = format!("EXECUTE usage('client-7', {now}, 1000)");
    for loaded in [false, true] {
        if loaded {
            let load = sqlx::query(TWENTY_THOUSAND).bind(now as i64);
            assert_eq!(
                load.execute(&mut *conn).await.unwrap().rows_affected(),
                20_000
            );
        }
        for lookup in &lookups {
            let nodes = explain(&mut conn, lookup).await;
            let scans: Vec<_> = nodes
                .iter()
                .filter(|n| n.contains("idem_records"))
                .collect();
            assert!(
                scans.len() == 1 && scans[0].ends_with("/ idem_records_pkey"),
                "loaded {loaded}, {lookup}: {nodes:#?}"
            );
        }
        let nodes = explain(&mut conn, &usage).await;
        assert!(
            nodes
                .iter()
                .any(|n| n.ends_with("idem_records_client_live")),
            "loaded {loaded}, the budget's count: {nodes:#?}"
        );
    }
}

/// On a table of 20,000 records (analyzed), the reconciler's listing of ended leases
/// reads the partial index on lease ends and the purge the index on `expires_at`, in a
/// plan made for the values as in a generic one, never a sequential scan of the records;
/// and both still find what they should.
#[tokio::test]
async fn the_listing_of_ended_leases_and_the_purge_read_indexes() {
    use crate::store::sql::dialect::Dialect;
    use crate::store::{ListQuery, OperatorStore};
    use sqlx::Postgres;

    let Some(pool) = scratch_pool("postgres plans").await else {
        return;
    };
    let store = PostgresStore::from_pool(pool).await.unwrap();
    let now: u64 = 1_800_000_000_000;
    let loaded = sqlx::query(TWENTY_THOUSAND)
        .bind(now as i64)
        .execute(store.pool());
    assert_eq!(loaded.await.unwrap().rows_affected(), 20_000);
    let mut conn = store.pool().acquire().await.unwrap();
    let prepare = format!(
        "ANALYZE idem_records;
        PREPARE list (bigint, text, text, boolean, text, text, text, bigint) AS {};
        PREPARE purge (bigint) AS {}",
        <Postgres as Dialect>::LIST,
        <Postgres as Dialect>::PURGE
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(prepare))
        .execute(&mut *conn)
        .await
        .unwrap();
    for mode in ["force_custom_plan", "force_generic_plan"] {
        let set = format!("SET plan_cache_mode = {mode}");
        sqlx::raw_sql(sqlx::AssertSqlSafe(set))
            .execute(&mut *conn)
            .await
            .unwrap();
        for cursor in ["NULL, NULL, NULL", "'create_order', 'client-0', 'key-5000'"] {
            let list = format!("EXECUTE list({now}, 'create_order', NULL, true, {cursor}, 100)");
            let nodes = explain(&mut conn, &list).await;
            let no_seq = nodes.iter().all(|n| !n.starts_with("Seq Scan"));
            let indexed = nodes
                .iter()
                .any(|n| n.ends_with("idem_records_lease_ended"));
            assert!(no_seq && indexed, "{mode}, {cursor}: {nodes:#?}");
        }
        let nodes = explain(&mut conn, &format!("EXECUTE purge({now})")).await;
        let no_seq = nodes.iter().all(|n| !n.starts_with("Seq Scan"));
        let indexed = nodes.iter().any(|n| n.ends_with("idem_records_expires_at"));
        assert!(no_seq && indexed, "{mode}, the purge: {nodes:#?}");
    }
    drop(conn);
    let query = ListQuery {
        operation: Some("create_order".into()),
        lease_ended: true,
        limit: 1000,
        ..ListQuery::default()
    };
    let listed = store.list(&query, now).await.unwrap();
    // Every 200th of 1,200 ..= 20,000: the ended leases of records not expired.
    assert_eq!(listed.len(), 95);
    let order = |l: &crate::store::Listed| {
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
