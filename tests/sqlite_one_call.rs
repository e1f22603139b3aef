//! SQLite's one-call completion under attack: the record's insert, the check that it
//! wrote (the marker row's `written`), `COMMIT` and an empty `BEGIN` in one call, and the
//! deferred path's one-call open and marker-checked completion (docs/transaction.md, "One
//! commit"). Handlers that misbehave (their own `COMMIT`, `BEGIN`, savepoints and nested
//! sqlx transactions after SQLite rolled theirs back, a deleted marker row, a deferred
//! foreign key that fails the commit), commits slowed past the attempt's deadline (a
//! commit hook that sleeps, as a slow `fsync`), clients that hang up during the
//! completion, and two stores on one file (two processes).
//!
//! Checked each time: at most one business effect per key; never a completed record
//! without its effect; a retry replays or runs once; the pool stays healthy (later
//! requests succeed).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use common::answer::{Answer, send};
use common::server::TestServer;
use idem::journal::{CallError, StepError};
use idem::store::{RecordKey, RecordState, RecordStore, unix_now};
use idem::{Idem, SqliteStore, identity};
use serde::Deserialize;
use serde_json::json;
use sqlx::Connection;

#[derive(Deserialize)]
struct Order {
    amount: i64,
    mode: String,
}

#[derive(Clone)]
struct Adv;

fn created() -> Response {
    (StatusCode::CREATED, "created").into_response()
}

async fn effect(conn: &mut sqlx::SqliteConnection, id: &str, key: &str) {
    sqlx::query("INSERT INTO orders (operation_id, key, ref) VALUES (?, ?, NULL)")
        .bind(id)
        .bind(key)
        .execute(conn)
        .await
        .unwrap();
}

/// Makes the next COMMIT on `conn` take `ms` (a slow fsync, on the connection's thread).
async fn slow_next_commit(conn: &mut sqlx::SqliteConnection, ms: u64) {
    let armed = Arc::new(AtomicBool::new(true));
    let mut handle = conn.lock_handle().await.unwrap();
    handle.set_commit_hook(move || {
        if armed.swap(false, Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(ms));
        }
        true
    });
}

#[idem::contract(
    key_scope = client, fingerprint = [amount], ttl = "1h",
    deadline = ("5s", per_attempt = "1s"), max_attempts = 4, retryable = [503, timeout],
    concurrency = conflict, status_lookup = adv_status,
    recovery = manual("https://runbooks.example.com/orders"),
)]
async fn adv_order(
    State(_app): State<Adv>,
    attempt: idem::Attempt,
    tx: idem::SqliteTx,
    Json(order): Json<Order>,
) -> Response {
    let op = attempt.operation_id.to_string();
    let mut conn = tx.conn().await.unwrap();
    act(&mut conn, &op, &attempt.key, &order.mode).await
}

#[idem::contract(
    key_scope = client, fingerprint = [amount], ttl = "1h",
    deadline = ("5s", per_attempt = "1s"), max_attempts = 4, retryable = [503, timeout],
    concurrency = conflict, status_lookup = adv_journal_status,
    recovery = resume,
)]
async fn adv_journal(
    State(_app): State<Adv>,
    mut journal: idem::Journal,
    attempt: idem::Attempt,
    tx: idem::SqliteTx,
    Json(order): Json<Order>,
) -> Response {
    let stepped = journal
        .step("noop", |_key| async { Ok::<u32, CallError<String>>(1) })
        .await;
    match stepped {
        Ok(_) => {}
        Err(StepError::Interrupted(interrupted)) => return interrupted.into_response(),
        Err(_) => return (StatusCode::INTERNAL_SERVER_ERROR, "step").into_response(),
    }
    let op = attempt.operation_id.to_string();
    let mut conn = tx.conn().await.unwrap();
    act(&mut conn, &op, &attempt.key, &order.mode).await
}

async fn adv_journal_status(
    lookup: idem::Lookup<adv_journal::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

/// What the handlers do in their transaction, by `mode`, after writing their effect.
async fn act(conn: &mut sqlx::SqliteConnection, op: &str, key: &str, mode: &str) -> Response {
    effect(&mut *conn, op, key).await;
    match mode {
        "ok" => created(),
        "sleep-50" => {
            tokio::time::sleep(Duration::from_millis(50)).await;
            created()
        }
        // The completion's COMMIT (the one call) takes 1.5 s: the attempt's deadline
        // (1 s) passes while it runs.
        "slow-commit-1500" => {
            slow_next_commit(&mut *conn, 1500).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            created()
        }
        // The completion's COMMIT takes 600 ms, within the attempt's time.
        "slow-commit-600" => {
            slow_next_commit(&mut *conn, 600).await;
            created()
        }
        // SQLite rolls the transaction back by itself, and the handler goes on in a new
        // one: a raw `SAVEPOINT`, or sqlx's nested transaction (`rollback_then`).
        "rollback-then-savepoint" => rollback_then(conn, op, key, false).await,
        "rollback-then-nested" => rollback_then(conn, op, key, true).await,
        // sqlx's nested transaction, committed, in a healthy transaction: no misuse.
        "nested-commit" => {
            let mut inner = conn.begin().await.unwrap();
            sqlx::query("INSERT INTO audit (what) VALUES ('nested')")
                .execute(&mut *inner)
                .await
                .unwrap();
            inner.commit().await.unwrap();
            created()
        }
        // Commits itself, then begins again (the docs forbid it).
        "commit-begin" => {
            exec(conn, "COMMIT; BEGIN").await;
            created()
        }
        // A deferred foreign key that fails at the COMMIT: SQLite keeps the transaction
        // open then.
        "deferred-fk" => {
            exec(conn, "INSERT INTO children (id, parent) VALUES (NULL, 999)").await;
            created()
        }
        // Overwrites idem's marker row (pure sabotage).
        "clobber-marker" => {
            exec(conn, "DELETE FROM temp.idem_open").await;
            created()
        }
        other => panic!("unknown mode {other}"),
    }
}

/// Runs `sql` on the handler's connection; it must succeed.
async fn exec(conn: &mut sqlx::SqliteConnection, sql: &'static str) {
    sqlx::query(sql).execute(&mut *conn).await.unwrap();
}

/// SQLite rolls the attempt's transaction back by itself (`OR ROLLBACK` over a taken
/// row), and the handler goes on: a raw `SAVEPOINT` (a library's sub-step), or with
/// `nested` sqlx's nested transaction (`begin()` on the handler's connection is a
/// `SAVEPOINT`, which after SQLite's rollback begins a transaction, and its `rollback()`
/// a `ROLLBACK TO SAVEPOINT`, which leaves that transaction open), opens a new
/// transaction, in which it writes its effect again.
async fn rollback_then(
    conn: &mut sqlx::SqliteConnection,
    op: &str,
    key: &str,
    nested: bool,
) -> Response {
    let r = sqlx::query(
        "INSERT OR ROLLBACK INTO orders (operation_id, key, ref) VALUES ('x', 'x', 'taken')",
    )
    .execute(&mut *conn)
    .await;
    assert!(r.is_err(), "the unique violation");
    if nested {
        let mut inner = conn.begin().await.unwrap();
        sqlx::query("INSERT INTO audit (what) VALUES ('tried')")
            .execute(&mut *inner)
            .await
            .unwrap();
        inner.rollback().await.unwrap();
    } else {
        exec(conn, "SAVEPOINT sub").await;
    }
    effect(&mut *conn, &format!("{op}-again"), key).await;
    created()
}

async fn adv_status(
    lookup: idem::Lookup<adv_order::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

const SCHEMA: &str =
    "CREATE TABLE IF NOT EXISTS orders (operation_id TEXT PRIMARY KEY, key TEXT, ref TEXT UNIQUE);
     INSERT OR IGNORE INTO orders VALUES ('pre-existing', NULL, 'taken');
     CREATE TABLE IF NOT EXISTS audit (what TEXT);
     CREATE TABLE IF NOT EXISTS parents (id INTEGER PRIMARY KEY);
     CREATE TABLE IF NOT EXISTS children (id INTEGER PRIMARY KEY,
        parent INTEGER REFERENCES parents(id) DEFERRABLE INITIALLY DEFERRED);";

async fn serve(store: &SqliteStore) -> TestServer {
    let idem = Idem::transactional(store.clone(), identity::header("x-client-id"));
    let router = Router::new()
        .route("/orders", post(adv_order))
        .route("/orders/operations/{key}", get(adv_status))
        .route("/journal", post(adv_journal))
        .route("/journal/operations/{key}", get(adv_journal_status))
        .with_state(Adv)
        .layer(idem.layer());
    TestServer::start(router).await
}

async fn lite() -> (TestServer, SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("orders.db"))
        .await
        .unwrap();
    sqlx::raw_sql(SCHEMA).execute(store.pool()).await.unwrap();
    (serve(&store).await, store, dir)
}

async fn effects(store: &SqliteStore, key: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE key = ?")
        .bind(key)
        .fetch_one(store.pool())
        .await
        .unwrap()
}

async fn state(store: &SqliteStore, key: &str) -> Option<RecordState> {
    state_of(store, "adv_order", key).await
}

async fn state_of(store: &SqliteStore, operation: &str, key: &str) -> Option<RecordState> {
    store
        .get(&RecordKey::new(operation, "client-a", key), unix_now())
        .await
        .unwrap()
        .map(|r| r.state)
}

fn completed(state: &Option<RecordState>) -> bool {
    matches!(state, Some(RecordState::Completed { .. }))
}

async fn post_order(server: &TestServer, key: &str, mode: &str) -> Answer {
    post_to(server, "/orders", key, mode).await
}

async fn post_to(server: &TestServer, path: &str, key: &str, mode: &str) -> Answer {
    send(
        server
            .post(path, key)
            .json(&json!({ "amount": 100, "mode": mode })),
    )
    .await
}

/// Sends `mode` for `key` to `path` (the handler of `operation`), then retries until
/// settled; fails when the first attempt left an effect committed without its completed
/// record, or when the effect ran more than once in all.
async fn runs_at_most_once(
    server: &TestServer,
    store: &SqliteStore,
    (path, operation): (&str, &str),
    key: &str,
    mode: &str,
) {
    let first = post_to(server, path, key, mode).await;
    let effects_first = effects(store, key).await;
    let record_first = state_of(store, operation, key).await;
    let retry = retry_on(server, path, key).await;
    let total = effects(store, key).await;
    assert!(
        (effects_first == 0 || completed(&record_first)) && total <= 1,
        "first answer {} (replayed={}) {:?}; after it {effects_first} effect(s) committed, \
         record {record_first:?}; retry {} (replayed={}); {total} effect(s) in all",
        first.status,
        first.replayed(),
        String::from_utf8_lossy(&first.body),
        retry.status,
        retry.replayed(),
    );
}

/// `n` new keys, one after the other: how many did not answer 201 (with the answers).
async fn later_failures(server: &TestServer, prefix: &str, n: usize) -> Vec<String> {
    let mut failed = Vec::new();
    for i in 0..n {
        let a = post_order(server, &format!("{prefix}-{i}"), "ok").await;
        if a.status != 201 {
            failed.push(format!(
                "{i}: {} {}",
                a.status,
                String::from_utf8_lossy(&a.body)
            ));
        }
    }
    failed
}

/// `n` new keys after the test's misbehaviour all answer 201: the pool was left healthy.
async fn pool_serves(server: &TestServer, prefix: &str, n: usize) {
    let failed = later_failures(server, prefix, n).await;
    assert!(failed.is_empty(), "later requests failed: {failed:?}");
}

/// Retries `key` with "ok" until it is not a 409/503, at most 20 times.
async fn retry_until_settled(server: &TestServer, key: &str) -> Answer {
    retry_on(server, "/orders", key).await
}

async fn retry_on(server: &TestServer, path: &str, key: &str) -> Answer {
    let mut last = None;
    for _ in 0..20 {
        let a = post_to(server, path, key, "ok").await;
        if a.status != 409 && a.status != 503 {
            return a;
        }
        last = Some(a);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    last.unwrap()
}

// ---- 1. handlers that misbehave -------------------------------------------------------

/// SQLite rolls the attempt's transaction back by itself (`INSERT OR ROLLBACK`), then the
/// handler's raw `SAVEPOINT` opens a new transaction and writes its effect there. The
/// completion's check finds the marker row not the attempt's and refuses before the call's
/// `COMMIT`, which would commit that effect without its record: everything rolls back,
/// and the retry runs the effect once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_by_itself_then_raw_savepoint_is_not_run_twice() {
    let (server, store, _dir) = lite().await;
    let orders = ("/orders", "adv_order");
    runs_at_most_once(
        &server,
        &store,
        orders,
        "k-rb-savepoint",
        "rollback-then-savepoint",
    )
    .await;
}

/// The same with sqlx's nested transaction (`begin()` then `rollback()`, which leaves
/// the transaction the `SAVEPOINT` began open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_by_itself_then_nested_sqlx_transaction_is_not_run_twice() {
    let (server, store, _dir) = lite().await;
    let orders = ("/orders", "adv_order");
    runs_at_most_once(
        &server,
        &store,
        orders,
        "k-rb-nested",
        "rollback-then-nested",
    )
    .await;
    pool_serves(&server, "k-rb-nested-later", 12).await;
}

/// sqlx's nested transaction committed inside a healthy attempt: one effect, a record,
/// a replay, and a healthy pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_sqlx_transaction_commits_once() {
    let (server, store, _dir) = lite().await;
    let first = post_order(&server, "k-nested", "nested-commit").await;
    assert_eq!(first.status, 201, "{first:?}");
    assert!(completed(&state(&store, "k-nested").await));
    let retry = post_order(&server, "k-nested", "ok").await;
    assert_eq!((retry.status, retry.replayed()), (201, true));
    assert_eq!(effects(&store, "k-nested").await, 1);
    pool_serves(&server, "k-nested-later", 12).await;
}

/// A handler that commits itself and begins again (misuse): the effect and the record
/// commit together; the retry replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_then_begin_in_the_handler_is_not_run_twice() {
    let (server, store, _dir) = lite().await;
    let key = "k-commit-begin";
    let first = post_order(&server, key, "commit-begin").await;
    let retry = retry_until_settled(&server, key).await;
    assert_eq!(effects(&store, key).await, 1, "{first:?} then {retry:?}");
    assert!(completed(&state(&store, key).await));
    assert!(retry.replayed(), "{first:?} then {retry:?}");
    pool_serves(&server, "k-commit-begin-later", 12).await;
}

/// A deferred foreign key fails the completion's COMMIT, and SQLite keeps the
/// transaction open (the marker row says `written`): nothing may be left committed, the
/// retry (with a valid request) runs once, and the pool stays healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_foreign_key_failing_the_commit_leaves_nothing() {
    let (server, store, _dir) = lite().await;
    let key = "k-fk";
    let first = post_order(&server, key, "deferred-fk").await;
    assert_ne!(first.status, 201, "{first:?}");
    let children: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM children")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(
        (
            effects(&store, key).await,
            children,
            completed(&state(&store, key).await)
        ),
        (0, 0, false),
        "{first:?}"
    );
    let retry = retry_until_settled(&server, key).await;
    assert_eq!(retry.status, 201, "{first:?} then {retry:?}");
    assert_eq!(effects(&store, key).await, 1);
    pool_serves(&server, "k-fk-later", 12).await;
}

/// Sabotage (the handler deletes idem's marker row): the check refuses a missing row as
/// it refuses another transaction's, and nothing is committed without its record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_deleting_the_marker_row() {
    let (server, store, _dir) = lite().await;
    let orders = ("/orders", "adv_order");
    runs_at_most_once(&server, &store, orders, "k-clobber", "clobber-marker").await;
}

// ---- 2. the completion cut off by the deadline; clients that hang up ------------------

/// The completion's COMMIT (in the one call) outlasts the attempt's deadline: the answer
/// is "outcome unknown", the record and the effect are committed together, the retry
/// replays; and the connection, on which sqlx's drop-time ROLLBACK finds no transaction
/// (the call's trailing `BEGIN` never ran), must not poison later requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_cut_off_by_the_deadline_during_commit() {
    let (server, store, _dir) = lite().await;
    let key = "k-slow-commit";
    let first = post_order(&server, key, "slow-commit-1500").await;
    assert_ne!(first.status, 201, "{first:?}");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let st = state(&store, key).await;
    let n = effects(&store, key).await;
    assert!(
        (n == 1 && completed(&st)) || (n == 0 && !completed(&st)),
        "{n} effects, record {st:?}"
    );
    let retry = retry_until_settled(&server, key).await;
    assert_eq!(effects(&store, key).await, 1, "{first:?} then {retry:?}");
    let failed = later_failures(&server, "k-slow-later", 20).await;
    assert!(
        failed.is_empty(),
        "first {} {}; later requests failed: {failed:?}",
        first.status,
        String::from_utf8_lossy(&first.body)
    );
}

/// The client hangs up while the completion's COMMIT runs (600 ms, within the attempt's
/// 1 s): the completion runs to its end, one effect, a completed record, the retry
/// replays, and the pool stays healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_hangs_up_during_the_completion() {
    let (server, store, _dir) = lite().await;
    let key = "k-hangup";
    let hung = server
        .post("/orders", key)
        .json(&json!({ "amount": 100, "mode": "slow-commit-600" }))
        .timeout(Duration::from_millis(250))
        .send()
        .await;
    assert!(hung.is_err(), "the client gave up");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(effects(&store, key).await, 1);
    assert!(completed(&state(&store, key).await));
    let retry = post_order(&server, key, "ok").await;
    assert_eq!((retry.status, retry.replayed()), (201, true), "{retry:?}");
    pool_serves(&server, "k-hangup-later", 12).await;
}

// ---- 3. two stores (two processes) on one file ----------------------------------------

async fn two_processes() -> (
    TestServer,
    TestServer,
    SqliteStore,
    SqliteStore,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.db");
    let a = SqliteStore::open(&path).await.unwrap();
    sqlx::raw_sql(SCHEMA).execute(a.pool()).await.unwrap();
    let b = SqliteStore::open(&path).await.unwrap();
    (serve(&a).await, serve(&b).await, a, b, dir)
}

/// Duplicates of one key sent at once to two stores on one file (each with its own map of
/// keys in flight): one effect per key; every answer a 201 (executed once, the others
/// replayed) or a retryable 409/503; then every retry replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_racing_on_the_same_keys_run_each_once() {
    let (sa, sb, a, _b, _dir) = two_processes().await;
    let (sa, sb) = (Arc::new(sa), Arc::new(sb));
    let mut bad = Vec::new();
    for round in 0..15 {
        let key = format!("k-race-{round}");
        let mut tasks = Vec::new();
        for i in 0..6 {
            let server = if i % 2 == 0 {
                Arc::clone(&sa)
            } else {
                Arc::clone(&sb)
            };
            let key = key.clone();
            tasks.push(tokio::spawn(async move {
                post_order(&server, &key, "sleep-50").await
            }));
        }
        let mut executed = 0;
        for t in tasks {
            let a = t.await.unwrap();
            match a.status {
                201 if !a.replayed() => executed += 1,
                201 | 409 | 503 => {}
                _ => bad.push(format!(
                    "{key}: {} {}",
                    a.status,
                    String::from_utf8_lossy(&a.body)
                )),
            }
        }
        let n = effects(&a, &key).await;
        if n != 1 || executed > 1 {
            bad.push(format!("{key}: {n} effects, {executed} executed answers"));
        }
        let ra = retry_until_settled(&sa, &key).await;
        let rb = retry_until_settled(&sb, &key).await;
        if !(ra.replayed() && rb.replayed()) {
            bad.push(format!("{key}: retries {ra:?} / {rb:?}"));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// The same on keys past their TTL: each race makes exactly one new effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_racing_on_expired_keys_run_each_once_more() {
    let (sa, sb, a, _b, _dir) = two_processes().await;
    let (sa, sb) = (Arc::new(sa), Arc::new(sb));
    let mut bad = Vec::new();
    for round in 0..10 {
        let key = format!("k-aged-{round}");
        assert_eq!(post_order(&sa, &key, "ok").await.status, 201);
        sqlx::query("UPDATE idem_records SET expires_at = 1 WHERE key = ?")
            .bind(&key)
            .execute(a.pool())
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for i in 0..6 {
            let server = if i % 2 == 0 {
                Arc::clone(&sa)
            } else {
                Arc::clone(&sb)
            };
            let key = key.clone();
            tasks.push(tokio::spawn(async move {
                post_order(&server, &key, "sleep-50").await
            }));
        }
        for t in tasks {
            let a = t.await.unwrap();
            if !matches!(a.status, 201 | 409 | 503) {
                bad.push(format!(
                    "{key}: {} {}",
                    a.status,
                    String::from_utf8_lossy(&a.body)
                ));
            }
        }
        let n = effects(&a, &key).await;
        if n != 2 {
            bad.push(format!(
                "{key}: {n} effects (1 before the TTL, 1 after expected)"
            ));
        }
        let st = state(&a, &key).await;
        if !completed(&st) {
            bad.push(format!("{key}: record {st:?}"));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

// ---- 4. the deferred path (a step journal: the key registered outside the transaction) -

/// The deferred path after SQLite's own rollback and a nested sqlx transaction that
/// leaves a new transaction open: the completion requires the marker row, so it refuses,
/// and everything rolls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_rollback_by_itself_then_nested_sqlx_transaction_is_not_run_twice() {
    let (server, store, _dir) = lite().await;
    let journal = ("/journal", "adv_journal");
    runs_at_most_once(
        &server,
        &store,
        journal,
        "j-rb-nested",
        "rollback-then-nested",
    )
    .await;
    pool_serves(&server, "j-rb-nested-later", 12).await;
}

/// The deferred path's commit (sqlx's own `commit()`) outlasting the deadline: sqlx
/// knows that commit, so the pool stays healthy. The contrast to
/// `completion_cut_off_by_the_deadline_during_commit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_commit_cut_off_by_the_deadline() {
    let (server, store, _dir) = lite().await;
    let key = "j-slow-commit";
    let first = post_to(&server, "/journal", key, "slow-commit-1500").await;
    assert_ne!(first.status, 201, "{first:?}");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let st = state_of(&store, "adv_journal", key).await;
    let n = effects(&store, key).await;
    assert!(
        (n == 1 && completed(&st)) || (n == 0 && !completed(&st)),
        "{n} effects, record {st:?}"
    );
    let retry = retry_on(&server, "/journal", key).await;
    assert_eq!(effects(&store, key).await, 1, "{first:?} then {retry:?}");
    pool_serves(&server, "j-slow-later", 20).await;
}

/// The deferred path with a deferred foreign key failing the commit: nothing committed,
/// the retry runs once, the pool healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journal_deferred_foreign_key_leaves_nothing() {
    let (server, store, _dir) = lite().await;
    let key = "j-fk";
    let first = post_to(&server, "/journal", key, "deferred-fk").await;
    assert_ne!(first.status, 201, "{first:?}");
    assert_eq!(effects(&store, key).await, 0, "{first:?}");
    let retry = retry_on(&server, "/journal", key).await;
    assert_eq!(retry.status, 201, "{first:?} then {retry:?}");
    assert_eq!(effects(&store, key).await, 1);
    pool_serves(&server, "j-fk-later", 12).await;
}

/// Many misbehaving attempts, then many healthy ones on the one-commit path: a pool of 8
/// connections cycled several times, no failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_healthy_after_many_misbehaving_attempts() {
    let (server, _store, _dir) = lite().await;
    for (i, mode) in [
        "commit-begin",
        "deferred-fk",
        "nested-commit",
        "rollback-then-nested",
    ]
    .iter()
    .cycle()
    .take(16)
    .enumerate()
    {
        post_order(&server, &format!("k-mis-{i}"), mode).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    pool_serves(&server, "k-mis-later", 40).await;
}

// ---- another process's write lock (2e68c78) ---------------------------------------------

/// Another process holds SQLite's write lock (`BEGIN IMMEDIATE` on a connection of its
/// own) past the busy timeout: the one-commit path and the deferred path (a step journal,
/// `; SAVEPOINT idem_business`) answer 503 with nothing committed and nothing run twice;
/// once the lock is let go, new keys and the retries are served at once (no connection
/// of the pool is left holding the lock, no 503 after it), each effect once beside its
/// completed record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_holding_the_lock_is_503_then_the_pool_serves_at_once() {
    let (server, store, dir) = lite().await;
    // Warm the pool: its connections were opened before the lock is taken.
    assert!(later_failures(&server, "warm", 3).await.is_empty());
    let url = format!("sqlite://{}", dir.path().join("orders.db").display());
    let mut other = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::raw_sql("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap();
    let (order, journal) = tokio::join!(
        post_order(&server, "locked", "ok"),
        post_to(&server, "/journal", "locked-j", "ok"),
    );
    assert_eq!(
        order.status,
        503,
        "{}",
        String::from_utf8_lossy(&order.body)
    );
    assert!(
        journal.status >= 500,
        "{} {}",
        journal.status,
        String::from_utf8_lossy(&journal.body)
    );
    assert_eq!(effects(&store, "locked").await, 0);
    assert_eq!(effects(&store, "locked-j").await, 0);
    sqlx::raw_sql("ROLLBACK").execute(&mut other).await.unwrap();

    // A connection of the pool left holding the lock would make these wait out the busy
    // timeout and answer 503.
    assert_eq!(
        later_failures(&server, "after", 8).await,
        Vec::<String>::new()
    );
    let retry = retry_until_settled(&server, "locked").await;
    assert_eq!(
        retry.status,
        201,
        "{}",
        String::from_utf8_lossy(&retry.body)
    );
    assert_eq!(effects(&store, "locked").await, 1);
    assert!(completed(&state(&store, "locked").await));
    let retry = retry_on(&server, "/journal", "locked-j").await;
    assert!(
        retry.status == 201 || retry.status == 409,
        "{} {}",
        retry.status,
        String::from_utf8_lossy(&retry.body)
    );
    let effects_j = effects(&store, "locked-j").await;
    let record_j = state_of(&store, "adv_journal", "locked-j").await;
    assert!(
        effects_j <= 1 && (effects_j == 0 || completed(&record_j)),
        "{effects_j} effect(s), record {record_j:?}"
    );
    server.stop().await;
}
