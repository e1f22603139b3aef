//! The transactional mode at its edges, found by trying to break it: a transaction the
//! database ends by itself, a failed statement before a permanent answer, a handler still
//! inside a statement at the end of its time, many attempts waiting for SQLite's one
//! writer, clients that hang up while they wait. Real SQLite files, a real PostgreSQL on
//! 127.0.0.1:5432 (a scratch schema), real sockets on 127.0.0.1.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use common::answer::{Answer, send};
use common::server::TestServer;
use idem::store::{RecordKey, RecordState, RecordStore, unix_now};
use idem::{Decision, Idem, PostgresStore, SqliteStore, UnknownOperation, identity};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
struct Order {
    amount: i64,
    mode: String,
}

/// Set when the SQLite handler's long statement returns: its length depends on the
/// machine's load, so the test's wait is counted from its end.
static LONG_STATEMENT_ENDED: AtomicBool = AtomicBool::new(false);

fn created() -> Response {
    (StatusCode::CREATED, "created").into_response()
}

// ---- SQLite ---------------------------------------------------------------------------

#[derive(Clone)]
struct Lite(#[allow(dead_code)] SqliteStore);

/// `mode`: what the handler does inside its transaction after writing its order.
#[idem::contract(
    key_scope = client, fingerprint = [amount], ttl = "1h",
    deadline = ("5s", per_attempt = "1s"), max_attempts = 4, retryable = [503, timeout],
    concurrency = conflict, status_lookup = lite_status,
    recovery = manual("https://runbooks.example.com/orders"),
)]
async fn lite_order(
    State(_app): State<Lite>,
    attempt: idem::Attempt,
    tx: idem::SqliteTx,
    Json(order): Json<Order>,
) -> Response {
    let mut conn = tx.conn().await.unwrap();
    sqlx::query("INSERT INTO orders (operation_id, ref) VALUES (?, NULL)")
        .bind(attempt.operation_id.to_string())
        .execute(&mut *conn)
        .await
        .unwrap();
    match order.mode.as_str() {
        // A conflict clause of SQLite's own (`OR ROLLBACK`; the same as a column's
        // `ON CONFLICT ROLLBACK` or a trigger's `RAISE(ROLLBACK, ..)`).
        "or-rollback-422" | "or-rollback-201" => {
            let r = sqlx::query(
                "INSERT OR ROLLBACK INTO orders (operation_id, ref) VALUES ('x', 'taken')",
            )
            .execute(&mut *conn)
            .await;
            assert!(r.is_err(), "the unique violation");
            if order.mode == "or-rollback-201" {
                created()
            } else {
                (StatusCode::UNPROCESSABLE_ENTITY, "reference already used").into_response()
            }
        }
        "long-statement" => {
            let _: i64 = sqlx::query_scalar(
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 30000000)
                 SELECT COUNT(*) FROM c",
            )
            .fetch_one(&mut *conn)
            .await
            .unwrap();
            LONG_STATEMENT_ENDED.store(true, Ordering::SeqCst);
            created()
        }
        "sleep-300" => {
            drop(conn);
            tokio::time::sleep(Duration::from_millis(300)).await;
            created()
        }
        _ => created(),
    }
}

async fn lite_status(
    lookup: idem::Lookup<lite_order::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

async fn lite() -> (TestServer, SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("orders.db"))
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE TABLE orders (operation_id TEXT PRIMARY KEY, ref TEXT UNIQUE);
         INSERT INTO orders VALUES ('pre-existing', 'taken');",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let idem = Idem::transactional(store.clone(), identity::header("x-client-id"));
    let router = Router::new()
        .route("/orders", post(lite_order))
        .route("/orders/operations/{key}", get(lite_status))
        .with_state(Lite(store.clone()))
        .layer(idem.layer());
    (TestServer::start(router).await, store, dir)
}

async fn post_order(server: &TestServer, key: &str, mode: &str) -> Answer {
    send(
        server
            .post("/orders", key)
            .json(&json!({ "amount": 100, "mode": mode })),
    )
    .await
}

/// "A record without its effect cannot happen": when SQLite ends the attempt's
/// transaction itself (`INSERT OR ROLLBACK`), idem must not write the record outside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_rolling_back_by_itself_leaves_no_record_without_its_effect() {
    let (server, store, _dir) = lite().await;
    post_order(&server, "k1", "or-rollback-201").await;
    let orders: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE operation_id <> 'pre-existing'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    let state = store
        .get(&RecordKey::new("lite_order", "client-a", "k1"), unix_now())
        .await
        .unwrap()
        .map(|record| record.state);
    let retry = post_order(&server, "k1", "ok").await;
    assert!(
        !(matches!(state, Some(RecordState::Completed { .. })) && orders == 0),
        "completed ({}, replayed={}) without its order",
        retry.status,
        retry.replayed()
    );
}

/// After such a transaction, no connection that sqlx still counts as inside a
/// transaction goes back to the pool: unrelated new keys succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_failed_commit_does_not_poison_the_pool() {
    let (server, _store, _dir) = lite().await;
    post_order(&server, "k-poison", "or-rollback-422").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut failed = 0;
    for i in 0..10 {
        failed += usize::from(
            post_order(&server, &format!("k-new-{i}"), "ok")
                .await
                .status
                != 201,
        );
    }
    assert_eq!(failed, 0, "{failed} of 10 unrelated new keys failed");
}

/// Inside a long statement at the end of its time (1 s), the attempt is answered at
/// once with 503 `attempt-rolled-back`. SQLite cannot stop the statement, which holds its
/// one writer until it ends, so the key may stay processing until the lease ends; then
/// the retry (under `manual(..)`) is not parked but runs, and writes one order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_timed_out_attempt_inside_a_statement() {
    let (server, store, _dir) = lite().await;
    let t = Instant::now();
    let first = post_order(&server, "k-long", "long-statement").await;
    let took = t.elapsed();
    let problem = first.problem(503, "attempt-rolled-back");
    assert!(
        took < Duration::from_millis(1500),
        "answered after {took:?}"
    );
    assert!(
        problem["state"] == "processing" || problem["state"] == "released",
        "{problem}"
    );
    // The statement holds SQLite's one writer until it ends (seconds, more on a loaded
    // machine); from then on, the lease (1 s) and one writer wait (5 s) bound the time
    // until a retry completes.
    let give_up = Instant::now() + Duration::from_secs(120);
    let mut until = None;
    loop {
        let retry = post_order(&server, "k-long", "ok").await;
        if retry.status == 201 {
            break;
        }
        assert_ne!(
            retry.slug(),
            "operation-outcome-unknown",
            "parked: {retry:?}"
        );
        if until.is_none() && LONG_STATEMENT_ENDED.load(Ordering::SeqCst) {
            until = Some(Instant::now() + Duration::from_secs(10));
        }
        let now = Instant::now();
        assert!(
            until.is_none_or(|until| now < until) && now < give_up,
            "never completed: {retry:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let orders: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE operation_id <> 'pre-existing'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(orders, 1);
}

/// Waiting for SQLite's one writer happens before registration and is not charged to the
/// attempt's lease; nothing is parked for an operator, although `recovery = manual(..)`.
/// Load: 16 keys at once, 300 ms each (4.8 s of writer time, under the 5 s wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_waiting_for_the_writer_parks_nothing() {
    let (server, _store, _dir) = lite().await;
    let server = Arc::new(server);
    futures_util::future::join_all((0..16).map(|i| {
        let s = server.clone();
        async move { post_order(&s, &format!("k-w-{i}"), "sleep-300").await }
    }))
    .await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut parked = Vec::new();
    for i in 0..16 {
        let key = format!("k-w-{i}");
        let until = Instant::now() + Duration::from_secs(4);
        loop {
            let r = post_order(&server, &key, "ok").await;
            if r.status == 201 {
                break;
            }
            if r.slug() == "operation-outcome-unknown" {
                parked.push(key);
                break;
            }
            assert!(Instant::now() < until, "{key}: {r:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert!(
        parked.is_empty(),
        "parked, although nothing committed: {parked:?}"
    );
}

/// The same with clients that hang up (400 ms timeout) while their attempts wait for the
/// writer: a request that gave up before it was registered left nothing behind, and
/// nothing is parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_hang_ups_while_waiting_for_the_writer_park_nothing() {
    let (server, _store, _dir) = lite().await;
    let server = Arc::new(server);
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(400))
        .build()
        .unwrap();
    futures_util::future::join_all((0..12).map(|i| {
        let (s, c) = (server.clone(), impatient.clone());
        async move {
            let _ = c
                .post(s.url("/orders"))
                .header("x-client-id", "client-a")
                .header("idempotency-key", format!("k-h-{i}"))
                .json(&json!({ "amount": 100, "mode": "sleep-300" }))
                .send()
                .await;
        }
    }))
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut parked = Vec::new();
    for i in 0..12 {
        let key = format!("k-h-{i}");
        let r = post_order(&server, &key, "ok").await;
        if r.slug() == "operation-outcome-unknown" {
            parked.push(key);
        }
    }
    assert!(
        parked.is_empty(),
        "parked, although nothing committed: {parked:?}"
    );
}

// ---- PostgreSQL -----------------------------------------------------------------------

#[derive(Clone)]
struct Pg(PostgresStore);

#[idem::contract(
    key_scope = client, fingerprint = [amount], ttl = "1h",
    deadline = ("5s", per_attempt = "1s"), max_attempts = 4, retryable = [503, timeout],
    concurrency = conflict, status_lookup = pg_status, recovery = pg_reconcile,
)]
async fn pg_order(
    State(_app): State<Pg>,
    attempt: idem::Attempt,
    tx: idem::PgTx,
    Json(order): Json<Order>,
) -> Response {
    let mut conn = tx.conn().await.unwrap();
    sqlx::query("INSERT INTO orders (operation_id, ref) VALUES ($1, NULL)")
        .bind(attempt.operation_id.to_string())
        .execute(&mut *conn)
        .await
        .unwrap();
    match order.mode.as_str() {
        "dup-422" => {
            let r = sqlx::query("INSERT INTO orders (operation_id, ref) VALUES ('x', 'taken')")
                .execute(&mut *conn)
                .await;
            assert!(r.is_err(), "the unique violation");
            (StatusCode::UNPROCESSABLE_ENTITY, "reference already used").into_response()
        }
        "long-statement" => {
            sqlx::query("SELECT pg_sleep(4)")
                .execute(&mut *conn)
                .await
                .unwrap();
            created()
        }
        "slow" => {
            drop(conn);
            tokio::time::sleep(Duration::from_millis(400)).await;
            created()
        }
        _ => created(),
    }
}

async fn pg_reconcile(app: Pg, op: UnknownOperation) -> Decision {
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE operation_id = $1")
        .bind(op.operation_id.to_string())
        .fetch_one(app.0.pool())
        .await
        .unwrap();
    if n == 0 {
        Decision::NotApplied
    } else {
        Decision::applied(StatusCode::CREATED)
    }
}

async fn pg_status(
    lookup: idem::Lookup<pg_order::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

async fn pg(what: &str) -> Option<TestServer> {
    pg_with(what, |store| store).await.map(|(server, _)| server)
}

/// [`pg`], its store made by `store` from the one over the scratch schema; and the store.
async fn pg_with(
    what: &str,
    store: impl FnOnce(PostgresStore) -> PostgresStore,
) -> Option<(TestServer, PostgresStore)> {
    let pool = idem_runtime::store::conformance::postgres::scratch_pool(what).await?;
    sqlx::raw_sql(
        "CREATE TABLE orders (operation_id TEXT PRIMARY KEY, ref TEXT UNIQUE);
         INSERT INTO orders VALUES ('pre-existing', 'taken');",
    )
    .execute(&pool)
    .await
    .unwrap();
    let store = store(PostgresStore::from_pool(pool).await.unwrap());
    let idem = Idem::transactional(store.clone(), identity::header("x-client-id"));
    let router = Router::new()
        .route("/orders", post(pg_order))
        .route("/orders/operations/{key}", get(pg_status))
        .with_state(Pg(store.clone()))
        .layer(idem.layer());
    Some((TestServer::start(router).await, store))
}

/// A permanent answer (422) after a failed statement (a unique violation), which makes
/// PostgreSQL abort the whole transaction: the 422 is final, stored alone and replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_a_permanent_error_after_a_failed_statement_is_final() {
    let Some(server) = pg("adv bug5").await else {
        return;
    };
    let first = post_order(&server, "k-dup", "dup-422").await;
    assert_eq!(
        first.status,
        422,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    assert!(post_order(&server, "k-dup", "dup-422").await.replayed());
}

/// Inside `pg_sleep(4)` at the end of its time (1 s): answered at once (503, the key
/// still `processing`: its record is in the transaction whose rollback waits for the
/// statement); the server cancels the statement at the transaction's bound (the
/// attempt's time and a grace), the transaction rolls back, and a retry then runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_a_timed_out_attempt_inside_a_statement_is_answered_at_its_time() {
    let Some(server) = pg("adv bug3").await else {
        return;
    };
    let t = Instant::now();
    let first = post_order(&server, "k-long", "long-statement").await;
    let took = t.elapsed();
    let problem = first.problem(503, "attempt-rolled-back");
    assert!(
        took < Duration::from_millis(1500) && problem["state"] == "processing",
        "answered after {took:?} with state {}",
        problem["state"]
    );
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let retry = post_order(&server, "k-long", "ok").await;
        if retry.status == 201 {
            break;
        }
        retry.problem(409, "operation-in-progress");
        assert!(Instant::now() < until, "the key is still held after 5 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
