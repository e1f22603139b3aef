//! What counts as the same request, at its edges (found by trying to break it): body keys
//! and quoted keys in the status lookup, forms on GET, renamed query fields, tiny
//! heartbeats, a transactional retry past the TTL, lapsed leases. Real servers on
//! 127.0.0.1.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Form, Json, Router};
use common::answer::{Answer, send};
use common::counter::Counter;
use common::faults::{Call, FaultyStore};
use common::server::{CLIENT, TestServer};
use idem::{Idem, MemoryStore, SqliteStore, identity};
use reqwest::Method;
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
struct Amount {
    amount: i64,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Referenced {
    reference: String,
    amount: i64,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Opts {
    #[serde(rename = "limit")]
    max_items: Option<u32>,
}

#[derive(Clone, Default)]
struct App {
    runs: Counter,
    db: Option<SqliteStore>,
}

// body key + status lookup.
#[idem::contract(key_scope = client(body = reference), fingerprint = [amount], ttl = "1h",
    deadline = "10s", max_attempts = 4, retryable = [503], concurrency = conflict,
    status_lookup = b1_status(path = "/b1/operations/{key}"), recovery = manual("rb"))]
async fn b1(Json(_t): Json<Referenced>) -> StatusCode {
    StatusCode::CREATED
}
async fn b1_status(
    lookup: idem::Lookup<b1::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

// `accepted` and its Location.
#[idem::contract(key_scope = client, fingerprint = [amount], ttl = "1h", deadline = "10s",
    max_attempts = 4, retryable = [503], concurrency = accepted,
    status_lookup = b2_status(path = "/b2/operations/{key}"), recovery = manual("rb"))]
async fn b2(Json(_a): Json<Amount>) -> StatusCode {
    tokio::time::sleep(Duration::from_millis(500)).await;
    StatusCode::CREATED
}
async fn b2_status(
    lookup: idem::Lookup<b2::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

// a form handler routed on GET.
#[idem::contract(key_scope = client, fingerprint = body, ttl = "1h", deadline = "10s",
    max_attempts = 4, retryable = [503], concurrency = conflict, status_lookup = none,
    recovery = manual("rb"))]
async fn b3(Form(fields): Form<HashMap<String, String>>) -> Response {
    (StatusCode::CREATED, Json(json!(fields))).into_response()
}

// a significant query field under `#[serde(rename)]`.
#[idem::contract(key_scope = client, fingerprint = ([amount], query = [max_items]), ttl = "1h",
    deadline = "10s", max_attempts = 4, retryable = [503], concurrency = conflict,
    status_lookup = none, recovery = manual("rb"))]
async fn b4(Query(o): Query<Opts>, Json(_a): Json<Amount>) -> Response {
    (StatusCode::CREATED, Json(json!({ "limit": o.max_items }))).into_response()
}

// a plain handler that sleeps.
#[idem::contract(key_scope = client, fingerprint = [amount], ttl = "1h",
    deadline = ("30s", per_attempt = "10s"), max_attempts = 4, retryable = [503],
    concurrency = conflict, status_lookup = none, recovery = manual("rb"))]
async fn slow(Query(q): Query<HashMap<String, u64>>, Json(_a): Json<Amount>) -> StatusCode {
    tokio::time::sleep(Duration::from_millis(q.get("ms").copied().unwrap_or(0))).await;
    StatusCode::CREATED
}

// SQLite transactional, TTL = deadline; run 1 answers 503, run 2 takes 2 s.
#[idem::contract(key_scope = client, fingerprint = [amount], ttl = "3s",
    deadline = ("3s", per_attempt = "3s"), max_attempts = 4, retryable = [503],
    concurrency = conflict, status_lookup = b6_status, recovery = manual("rb"))]
async fn b6(State(app): State<App>, tx: idem::SqliteTx, Json(a): Json<Amount>) -> Response {
    let run = app.runs.bump();
    if run == 1 {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    if run == 2 {
        tokio::time::sleep(Duration::from_millis(2000)).await;
    }
    sqlx::query("INSERT INTO orders (amount) VALUES (?)")
        .bind(a.amount)
        .execute(&mut *tx.conn().await.unwrap())
        .await
        .unwrap();
    StatusCode::CREATED.into_response()
}
async fn b6_status(
    lookup: idem::Lookup<b6::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

// SQLite transactional; after 1 s, `INSERT OR ROLLBACK` ends the transaction; 409.
#[idem::contract(key_scope = client, fingerprint = [amount], ttl = "1h",
    deadline = ("10s", per_attempt = "5s"), max_attempts = 4, retryable = [503],
    concurrency = conflict, status_lookup = none, recovery = manual("rb"))]
async fn b7(tx: idem::SqliteTx, Json(_a): Json<Amount>) -> Response {
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let refused = sqlx::query("INSERT OR ROLLBACK INTO uniq (id) VALUES ('taken')")
        .execute(&mut *tx.conn().await.unwrap())
        .await;
    assert!(refused.is_err());
    (StatusCode::CONFLICT, "already taken").into_response()
}

async fn none() -> StatusCode {
    StatusCode::OK
}

async fn serve(idem: Idem, app: App) -> TestServer {
    let router = Router::new()
        .route("/b1", post(b1))
        .route("/b1/operations/{key}", get(b1_status))
        .route("/b2", post(b2))
        .route("/b2/operations/{key}", get(b2_status))
        .route("/b3", get(b3).post(b3))
        .route("/b4", post(b4))
        .route("/slow", post(slow))
        .route("/b6", post(b6))
        .route("/b6/operations/{key}", get(b6_status))
        .route("/b7", post(b7))
        .with_state(app)
        .layer(idem.layer());
    TestServer::start(router).await
}

async fn memory() -> TestServer {
    serve(
        Idem::new(MemoryStore::new(), identity::header("x-client-id")),
        App::default(),
    )
    .await
}

async fn sqlite_tx() -> (TestServer, App, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("m.db")).await.unwrap();
    for ddl in [
        "CREATE TABLE orders (amount BIGINT NOT NULL)",
        "CREATE TABLE uniq (id TEXT PRIMARY KEY)",
        "INSERT INTO uniq (id) VALUES ('taken')",
    ] {
        sqlx::query(ddl).execute(store.pool()).await.unwrap();
    }
    let app = App {
        runs: Counter::default(),
        db: Some(store.clone()),
    };
    let idem = Idem::transactional_builder(store, identity::header("x-client-id"))
        .heartbeat(Duration::from_millis(300))
        .build();
    (serve(idem, app.clone()).await, app, dir)
}

/// A body key is never unquoted: the status lookup finds `"abc"` (quotes included) as
/// written, not as 404 ("a new key is safe").
#[tokio::test]
async fn a_body_key_is_looked_up_as_written() {
    let server = memory().await;
    let made = send(
        server
            .request(Method::POST, "/b1", CLIENT, None)
            .json(&json!({ "reference": "\"abc\"", "amount": 1 })),
    )
    .await;
    assert_eq!(made.status, 201);
    let report = send(server.get("/b1/operations/%22abc%22")).await;
    assert_eq!(
        report.status,
        200,
        "{}",
        String::from_utf8_lossy(&report.body)
    );
}

/// The header key `"abc"` (sent as `"\"abc\""`): the `accepted` answer's Location
/// quotes it, so that the lookup reads the same key back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_accepted_location_of_a_key_that_starts_with_a_quote_finds_it() {
    let server = Arc::new(memory().await);
    let key = r#""\"abc\"""#;
    let s = server.clone();
    let first =
        tokio::spawn(async move { send(s.post("/b2", key).json(&json!({ "amount": 1 }))).await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let dup = send(server.post("/b2", key).json(&json!({ "amount": 1 }))).await;
    assert_eq!(dup.status, 202);
    let location = dup.header("location").unwrap().to_owned();
    let report = send(server.get(&location)).await;
    first.await.unwrap();
    assert_eq!(
        report.status,
        200,
        "{location}: {}",
        String::from_utf8_lossy(&report.body)
    );
}

/// axum's `Form` reads a GET's form from the query string, and so does the fingerprint:
/// `q=cars` is not a repeat of `q=books`.
#[tokio::test]
async fn a_form_on_get_is_fingerprinted_by_its_query() {
    let server = memory().await;
    let first = send(server.request(Method::GET, "/b3?q=books", CLIENT, Some("k"))).await;
    assert_eq!(first.status, 201);
    let other = send(server.request(Method::GET, "/b3?q=cars", CLIENT, Some("k"))).await;
    assert_eq!(
        other.status,
        422,
        "replayed={} {}",
        other.replayed(),
        String::from_utf8_lossy(&other.body)
    );
}

/// `query = [max_items]` with `#[serde(rename = "limit")]`: a rename the contract cannot
/// follow is a configuration error (500 `not-configured` naming the parameter), never a
/// parameter silently left out of the fingerprint.
#[tokio::test]
async fn a_renamed_query_field_is_a_configuration_error() {
    let server = memory().await;
    let first = send(
        server
            .post("/b4?limit=1", "k")
            .json(&json!({ "amount": 1 })),
    )
    .await;
    let problem = first.problem(500, "not-configured");
    assert!(
        problem["detail"].as_str().unwrap().contains("`max_items`"),
        "{problem}"
    );
}

/// A heartbeat lease of 1 ms is taken as the 30 ms minimum: a live 100 ms attempt keeps
/// its lease and its answer is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_heartbeat_still_keeps_a_live_attempt() {
    let idem = Idem::builder(MemoryStore::new(), identity::header("x-client-id"))
        .heartbeat(Duration::from_millis(1))
        .build();
    let server = serve(idem, App::default()).await;
    let answer = send(
        server
            .post("/slow?ms=100", "k")
            .json(&json!({ "amount": 1 })),
    )
    .await;
    assert_eq!(
        answer.status,
        201,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
}

/// SQLite transactional mode, a retry near the end of the TTL that runs past it (its
/// renewals pause while the transaction holds the lock): the record is kept for the
/// attempt's time, so the lookup finds it and a duplicate never runs the order again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_retry_past_the_ttl_keeps_its_record() {
    let (server, app, _dir) = sqlite_tx().await;
    let server = Arc::new(server);
    let t0 = std::time::Instant::now();
    let post = |s: Arc<TestServer>| async move {
        send(s.post("/b6", "k").json(&json!({ "amount": 1 }))).await
    };
    assert_eq!(post(server.clone()).await.status, 503); // released
    tokio::time::sleep(Duration::from_millis(1800).saturating_sub(t0.elapsed())).await;
    let retry = tokio::spawn(post(server.clone())); // runs until ~3.8 s, past the 3 s TTL
    tokio::time::sleep(Duration::from_millis(3300).saturating_sub(t0.elapsed())).await;
    let report = send(server.get("/b6/operations/k")).await;
    let dup = post(server.clone()).await;
    assert_eq!(retry.await.unwrap().status, 201);
    let orders: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders")
        .fetch_one(app.db.as_ref().unwrap().pool())
        .await
        .unwrap();
    assert_eq!(
        (report.status, orders),
        (200, 1),
        "duplicate: {} replayed={}",
        dup.status,
        dup.replayed()
    );
}

/// SQLite ended the transaction (`INSERT OR ROLLBACK`) of a handler longer than the
/// heartbeat lease, which answers a permanent 409: it is recorded (the lapsed lease is
/// revived by its owner) and answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_refusal_after_sqlite_ended_the_transaction_is_recorded() {
    let (server, _app, _dir) = sqlite_tx().await;
    let answer = send(server.post("/b7", "k").json(&json!({ "amount": 1 }))).await;
    assert_eq!(
        answer.status,
        409,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
}

/// Renewals fail for longer than the lease, then heal; nobody took the record over, so
/// the lease is revived and the handler's 201 is recorded and answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_that_heal_after_the_lease_lapsed_keep_the_answer() {
    let store = FaultyStore::memory();
    let idem = Idem::builder(store.clone(), identity::header("x-client-id"))
        .heartbeat(Duration::from_millis(300))
        .build();
    let server = Arc::new(serve(idem, App::default()).await);
    let s = server.clone();
    let first: tokio::task::JoinHandle<Answer> = tokio::spawn(async move {
        send(s.post("/slow?ms=1500", "k").json(&json!({ "amount": 1 }))).await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    store.fail(Call::Renew);
    tokio::time::sleep(Duration::from_millis(500)).await;
    store.heal(Call::Renew);
    let answer = first.await.unwrap();
    assert_eq!(store.calls(Call::TakeOver), 0);
    assert_eq!(
        answer.status,
        201,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
}
