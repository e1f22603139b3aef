//! The transactional mode at its edges, found by trying to break it: a transaction the
//! database ends by itself, a failed statement before a permanent answer, a handler still
//! inside a statement at the end of its time, many attempts waiting for SQLite's one
//! writer, clients that hang up while they wait. Real SQLite files, a real PostgreSQL on
//! 127.0.0.1:5432 (a scratch schema), real sockets on 127.0.0.1.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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

/// Set by the test to end the SQLite handler's `hold` (which holds the one writer).
static HOLD_RELEASED: AtomicBool = AtomicBool::new(false);

/// Set by the SQLite handler's `hold` once it runs, holding the one writer.
static HOLDING: AtomicBool = AtomicBool::new(false);

/// Runs of each handler for the key `k-self-commit`: SQLite's, PostgreSQL's.
static SELF_COMMIT_RUNS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

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
    if attempt.key == "k-self-commit" {
        SELF_COMMIT_RUNS[0].fetch_add(1, Ordering::SeqCst);
    }
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
        // Holds the one writer (its transaction is open) until the test lets go, 900 ms
        // at most (the attempt has 1 s).
        "hold" => {
            drop(conn);
            HOLDING.store(true, Ordering::SeqCst);
            let start = Instant::now();
            while !HOLD_RELEASED.load(Ordering::SeqCst)
                && start.elapsed() < Duration::from_millis(900)
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            created()
        }
        // A retryable answer after the write: rolled back, the key released.
        "503" => (StatusCode::SERVICE_UNAVAILABLE, "busy").into_response(),
        // Ends the attempt's transaction itself, its order committed (the docs say not
        // to; the record must not then say that nothing took effect).
        "commit" => {
            sqlx::query("COMMIT").execute(&mut *conn).await.unwrap();
            created()
        }
        // The key's rows in `idem_records` as the attempt's own transaction sees them.
        "peek" => {
            let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_records WHERE key = ?")
                .bind(&attempt.key)
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            (StatusCode::CREATED, rows.to_string()).into_response()
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

/// The orders the SQLite handler wrote (the one written by `lite` left out).
async fn lite_orders(store: &SqliteStore) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE operation_id <> 'pre-existing'")
        .fetch_one(store.pool())
        .await
        .unwrap()
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
    let orders = lite_orders(&store).await;
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

/// A new key's record is written once, completed, by the commit that writes its order:
/// the attempt's own transaction sees no row of the key while the handler runs (the key
/// is held by its mark in this process), and the record is completed after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_new_key_writes_its_record_once_at_the_commit() {
    let (server, store, _dir) = lite().await;
    let first = post_order(&server, "k-once", "peek").await;
    assert_eq!(first.status, 201, "{first:?}");
    assert_eq!(first.body, b"0", "no row of the key before the completion");
    let record = store
        .get(
            &RecordKey::new("lite_order", "client-a", "k-once"),
            unix_now(),
        )
        .await
        .unwrap()
        .expect("the record, committed with the order");
    assert!(
        matches!(record.state, RecordState::Completed { .. }),
        "{:?}",
        record.state
    );
    assert_eq!(record.operation_id.to_string(), first.operation_id());
    let replay = post_order(&server, "k-once", "peek").await;
    assert_eq!(
        (replay.status, replay.replayed()),
        (201, true),
        "{replay:?}"
    );
    assert_eq!(replay.body, b"0");
}

/// A handler that commits its transaction itself (which the docs forbid) has its effect
/// committed: the record is written beside it, whatever the first answer, so the retry
/// replays and the effect is not run twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_handler_that_commits_itself_is_not_run_twice() {
    let (server, store, _dir) = lite().await;
    let first = post_order(&server, "k-self-commit", "commit").await;
    assert_eq!(lite_orders(&store).await, 1, "{first:?}");
    let retry = post_order(&server, "k-self-commit", "ok").await;
    assert_eq!(
        (retry.status, retry.replayed()),
        (201, true),
        "{first:?} then {retry:?}"
    );
    assert_eq!(retry.operation_id(), first.operation_id());
    assert_eq!(lite_orders(&store).await, 1, "the effect ran once");
    assert_eq!(
        SELF_COMMIT_RUNS[0].load(Ordering::SeqCst),
        1,
        "the handler ran once"
    );
}

/// An attempt that rolls back (a retryable 503) keeps its key's mark until its release is
/// written: a duplicate racing it is answered from the mark, never registered in between
/// as if the key had no record (it would run the handler, then lose its record to the
/// release and answer 503 for nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_duplicates_of_a_rolled_back_attempt_do_not_run_for_nothing() {
    let (server, store, _dir) = lite().await;
    let server = Arc::new(server);
    for round in 0..4 {
        let key = format!("k-released-{round}");
        let requests: Vec<_> = (0..10)
            .map(|_| {
                let (server, key) = (Arc::clone(&server), key.clone());
                tokio::spawn(async move { post_order(&server, &key, "503").await })
            })
            .collect();
        for request in requests {
            let answer = request.await.unwrap();
            let body = String::from_utf8_lossy(&answer.body);
            assert!(
                matches!(answer.status, 409 | 503) && !body.contains("lost its record"),
                "{answer:?}: {body}"
            );
        }
    }
    assert_eq!(lite_orders(&store).await, 0, "every attempt rolled back");
}

/// A key whose record's TTL has passed is a new key: the read under the mark does not see
/// the old record, and the completion's insert replaces it, a new operation with its own
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_key_past_its_ttl_is_written_again_as_a_new_key() {
    let (server, store, _dir) = lite().await;
    let first = post_order(&server, "k-aged", "ok").await;
    assert_eq!(first.status, 201, "{first:?}");
    sqlx::query("UPDATE idem_records SET expires_at = 1 WHERE key = 'k-aged'")
        .execute(store.pool())
        .await
        .unwrap();
    let second = post_order(&server, "k-aged", "peek").await;
    assert_eq!(
        (second.status, second.replayed()),
        (201, false),
        "{second:?}"
    );
    assert_eq!(
        second.body, b"1",
        "the old row, until the completion replaces it"
    );
    assert_ne!(second.operation_id(), first.operation_id());
    let record = store
        .get(
            &RecordKey::new("lite_order", "client-a", "k-aged"),
            unix_now(),
        )
        .await
        .unwrap()
        .expect("the new record");
    assert_eq!(record.operation_id.to_string(), second.operation_id());
    let orders = lite_orders(&store).await;
    assert_eq!(orders, 2);
}

/// A duplicate of an attempt still waiting for SQLite's one writer is answered at once
/// (409 under `concurrency = conflict`, with the waiting attempt's `Operation-Id`), not
/// queued behind it: the key is marked in flight before it waits, and the status lookup
/// says `processing` meanwhile. The attempt then writes one order under that id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_duplicate_of_an_attempt_waiting_for_the_writer_is_answered_at_once() {
    let (server, store, _dir) = lite().await;
    HOLD_RELEASED.store(false, Ordering::SeqCst);
    HOLDING.store(false, Ordering::SeqCst);
    let server = Arc::new(server);
    let holder = {
        let server = Arc::clone(&server);
        tokio::spawn(async move { post_order(&server, "k-writer", "hold").await })
    };
    let processing = |key: &'static str| {
        let server = Arc::clone(&server);
        async move {
            for _ in 0..200 {
                let status = send(server.get(&format!("/orders/operations/{key}"))).await;
                if status.status == 200 {
                    let report: serde_json::Value = serde_json::from_slice(&status.body).unwrap();
                    if report["state"] == "processing" {
                        return report;
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            panic!("{key} never showed as processing");
        }
    };
    let holding = async {
        while !HOLDING.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), holding)
        .await
        .expect("the first attempt holds the writer");
    let waiting = {
        let server = Arc::clone(&server);
        tokio::spawn(async move { post_order(&server, "k-queued", "ok").await })
    };
    let report = processing("k-queued").await;
    let duplicate = post_order(&server, "k-queued", "ok").await;
    duplicate.problem(409, "operation-in-progress");
    assert!(
        !waiting.is_finished(),
        "the duplicate was answered while the attempt waited"
    );
    assert_eq!(report["operation_id"], duplicate.operation_id());
    HOLD_RELEASED.store(true, Ordering::SeqCst);
    assert_eq!(holder.await.unwrap().status, 201);
    let answer = waiting.await.unwrap();
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(answer.operation_id(), duplicate.operation_id());
    let orders: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE operation_id = ?")
        .bind(answer.operation_id())
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(orders, 1);
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
    let orders = lite_orders(&store).await;
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
    if attempt.key == "k-self-commit" {
        SELF_COMMIT_RUNS[1].fetch_add(1, Ordering::SeqCst);
    }
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
        // Ends the attempt's transaction itself, its order committed.
        "commit" => {
            sqlx::query("COMMIT").execute(&mut *conn).await.unwrap();
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

/// A handler that commits its transaction itself (which the docs forbid) has its effect
/// committed: the retry must not run it a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_a_handler_that_commits_itself_is_not_run_twice() {
    let Some((server, store)) = pg_with("adv self-commit", |store| store).await else {
        return;
    };
    let orders = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM orders WHERE operation_id <> 'pre-existing'",
        )
        .fetch_one(store.pool())
        .await
        .unwrap()
    };
    let first = post_order(&server, "k-self-commit", "commit").await;
    assert_eq!(orders().await, 1, "{first:?}");
    let retry = post_order(&server, "k-self-commit", "ok").await;
    assert_eq!(
        (retry.status, retry.replayed()),
        (201, true),
        "{first:?} then {retry:?}"
    );
    assert_eq!(
        orders().await,
        1,
        "the effect ran once: {first:?} then {retry:?}"
    );
    assert_eq!(
        SELF_COMMIT_RUNS[1].load(Ordering::SeqCst),
        1,
        "the handler ran once: {first:?} then {retry:?}"
    );
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
