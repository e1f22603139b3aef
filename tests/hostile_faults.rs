//! Faults during an attempt: the store failing at each step, response bodies that fail,
//! hang, panic or outgrow the stored-body limit, a handler that answers a retryable
//! status after its effect, and the SQLite store closed, deleted, or crashed with an
//! attempt in flight. (A read-only database is a unit test of the SQLite store: this
//! crate does not depend on sqlx, and root ignores file modes.)
//!
//! The reconcile function here does what a real one does: it looks for the business
//! record written under the idempotency key.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use common::answer::{Answer, send};
use common::counter::Counter;
use common::faults::{Call, FaultyStore};
use common::process;
use common::server::TestServer;
use futures_util::stream;
use idem::store::{RecordKey, RecordState, Store, unix_now};
use idem::{Decision, Idem, SqliteStore, UnknownOperation, identity};
use serde::Deserialize;
use serde_json::{Value, json};

/// The business data: orders by idempotency key, and counters.
#[derive(Clone, Default)]
struct App {
    orders: Arc<Mutex<HashMap<String, Value>>>,
    runs: Counter,
    reconciles: Counter,
    /// Every write of an order, even one that overwrites the same key.
    writes: Counter,
}

impl App {
    fn effects(&self) -> usize {
        self.orders.lock().unwrap().len()
    }
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct CreateOrder {
    customer_id: String,
    amount: i64,
    /// How the attempt behaves; not part of the fingerprint, so a retry may differ.
    #[serde(default)]
    mode: String,
    #[serde(default)]
    delay_ms: u64,
}

/// The handler behind every route: waits `delay_ms`, writes the order (the effect) unless
/// `mode` says it fails first, then answers as `mode` says.
async fn handle(app: App, headers: HeaderMap, order: CreateOrder) -> Response {
    app.runs.bump();
    tokio::time::sleep(Duration::from_millis(order.delay_ms)).await;
    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
    let json = json!({ "customer_id": order.customer_id, "amount": order.amount, "key": key });
    if order.mode == "503-before-effect" {
        return (StatusCode::SERVICE_UNAVAILABLE, "busy").into_response();
    }
    if order.mode == "blocking" {
        // Blocking work (a synchronous driver, heavy computation) that no timeout can
        // interrupt: it runs past the lease before the effect.
        tokio::task::block_in_place(|| std::thread::sleep(Duration::from_millis(800)));
    }
    if order.mode == "detached" {
        // The effect runs on a blocking thread; the handler awaits it. When the attempt
        // is stopped at its lease's end, the handler's future is dropped but the thread
        // goes on and writes.
        let (app, key, json) = (app.clone(), key.clone(), json.clone());
        let _ = tokio::task::spawn_blocking(move || {
            std::thread::sleep(Duration::from_millis(800));
            app.writes.bump();
            app.orders.lock().unwrap().insert(key, json);
        })
        .await;
        return (StatusCode::CREATED, "written").into_response();
    }
    app.writes.bump();
    app.orders.lock().unwrap().insert(key, json.clone());
    let chunk = |s: &'static str| Ok::<_, std::io::Error>(Bytes::from_static(s.as_bytes()));
    let streamed = |body: Body| {
        Response::builder()
            .status(StatusCode::CREATED)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body)
            .unwrap()
    };
    match order.mode.as_str() {
        "503-after-effect" => (StatusCode::SERVICE_UNAVAILABLE, "busy").into_response(),
        "panic-after-effect" => panic!("the handler fails after its effect"),
        "stream-error" => streamed(Body::from_stream(stream::iter([
            chunk("{\"partial\":"),
            Err(std::io::Error::other("the database cursor broke")),
        ]))),
        "stream-hang" => streamed(Body::from_stream(futures_util::StreamExt::chain(
            stream::iter([chunk("{\"partial\":")]),
            stream::pending(),
        ))),
        "stream-panic" => streamed(Body::from_stream(futures_util::StreamExt::map(
            stream::iter([chunk("{")]),
            |_| -> Result<Bytes, std::io::Error> { panic!("the body stream fails") },
        ))),
        "encoded" => Response::builder()
            .status(StatusCode::CREATED)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CONTENT_ENCODING, "gzip")
            // The gzip of `{}` (the bytes only mean something with their encoding).
            .body(Body::from(&b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\xab\xae\x05\x00C\xbf\xa6\xa3\x02\x00\x00\x00"[..]))
            .unwrap(),
        "big-stream" => streamed(Body::from_stream(stream::iter(
            (0..16).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b' '; 256]))),
        ))),
        _ => (StatusCode::CREATED, Json(json)).into_response(),
    }
}

/// Finds the order written under the key: applied with it, or not applied.
async fn reconcile(app: App, op: UnknownOperation) -> Decision {
    app.reconciles.bump();
    let order = app.orders.lock().unwrap().get(&op.key).cloned();
    match order {
        Some(order) => Decision::applied((StatusCode::CREATED, Json(order))),
        None => Decision::NotApplied,
    }
}

// rustfmt re-indents attributes inside `macro_rules!` on every run.
#[rustfmt::skip]
macro_rules! order_handler {
    ($name:ident, $recovery:expr) => {
        #[idem::contract(
            key_scope = client,
            fingerprint = [customer_id, amount],
            ttl = "1h",
            deadline = ("5s", per_attempt = "400ms"),
            max_attempts = 4,
            retryable = [503, timeout],
            concurrency = conflict,
            status_lookup = order_status,
            recovery = $recovery,
        )]
        async fn $name(
            State(app): State<App>,
            headers: HeaderMap,
            Json(order): Json<CreateOrder>,
        ) -> Response {
            handle(app, headers, order).await
        }
    };
}

order_handler!(reconciled, reconcile);
order_handler!(manual, manual("https://runbooks.example.com/orders"));

async fn order_status(
    lookup: idem::Lookup<reconciled::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

const LEASE: Duration = Duration::from_millis(400);

fn router(app: App, idem: &Idem) -> Router {
    Router::new()
        .route("/orders", post(reconciled))
        .route("/orders/operations/{key}", get(order_status))
        .route("/manual", post(manual))
        .with_state(app)
        .layer(idem.layer())
}

struct Fixture {
    server: TestServer,
    app: App,
    idem: Idem,
}

impl Fixture {
    async fn new(store: impl Store) -> Fixture {
        Fixture::with_idem(Idem::new(store, identity::header("x-client-id"))).await
    }

    async fn with_idem(idem: Idem) -> Fixture {
        Fixture::serve(idem, App::default()).await
    }

    async fn serve(idem: Idem, app: App) -> Fixture {
        Fixture {
            server: TestServer::start(router(app.clone(), &idem)).await,
            app,
            idem,
        }
    }

    fn request(&self, path: &str, key: &str, mode: &str) -> reqwest::RequestBuilder {
        let order = json!({ "customer_id": "c-1", "amount": 100, "mode": mode });
        self.server.post(path, key).json(&order)
    }

    async fn post(&self, path: &str, key: &str, mode: &str) -> Answer {
        send(self.request(path, key, mode)).await
    }

    async fn state(&self, operation: &str, key: &str) -> RecordState {
        let key = RecordKey::new(operation, "client-a", key);
        let record = self.idem.store().get(&key, unix_now()).await.unwrap();
        record.expect("a record").state
    }
}

/// Waits until the lease of an attempt that started now has ended.
async fn past_the_lease() {
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
}

/// The answer is the reconciled order, replayed, linked to `first`'s operation.
fn assert_recovered(answer: &Answer, key: &str, operation_id: &str) {
    assert_eq!(answer.status, 201, "{answer:?}");
    assert!(
        answer.replayed(),
        "recovery's answer is stored and replayed"
    );
    assert_eq!(
        answer.json(),
        json!({ "customer_id": "c-1", "amount": 100, "key": key })
    );
    assert_eq!(answer.operation_id(), operation_id);
}

/// The store fails on `complete`, after the effect: the client gets 503
/// `store-unavailable` (its 201 was not recorded, so it is not claimed); the record stays
/// processing, so a retry within the lease is told "in progress", and after it recovery
/// finds the order and replays it. One run.
#[tokio::test]
async fn complete_failing_after_the_effect_is_recovered() {
    let store = FaultyStore::memory();
    let f = Fixture::new(store.clone()).await;
    store.fail(Call::Complete);
    let first = f.post("/orders", "k-complete", "ok").await;
    first.problem(503, "store-unavailable");
    assert!(first.header("retry-after").is_some());
    assert!(matches!(
        f.state("reconciled", "k-complete").await,
        RecordState::Processing { .. }
    ));
    f.post("/orders", "k-complete", "ok")
        .await
        .problem(409, "operation-in-progress");
    store.heal(Call::Complete);
    past_the_lease().await;
    let retry = f.post("/orders", "k-complete", "ok").await;
    assert_recovered(&retry, "k-complete", first.operation_id());
    assert_eq!((f.app.runs.get(), f.app.reconciles.get()), (1, 1));
    assert!(f.post("/orders", "k-complete", "ok").await.replayed());
}

/// The same with `recovery = manual(..)`: parked as unknown for an operator, never run
/// again.
#[tokio::test]
async fn complete_failing_with_manual_recovery_parks() {
    let store = FaultyStore::memory();
    let f = Fixture::new(store.clone()).await;
    store.fail(Call::Complete);
    f.post("/manual", "k-manual", "ok")
        .await
        .problem(503, "store-unavailable");
    store.heal(Call::Complete);
    past_the_lease().await;
    for _ in 0..2 {
        f.post("/manual", "k-manual", "ok")
            .await
            .problem(409, "operation-outcome-unknown");
    }
    assert_eq!(f.app.runs.get(), 1);
}

/// The store fails on `get`: the status lookup answers 503 `store-unavailable` with
/// `Retry-After` and an `Operation-Id`.
#[tokio::test]
async fn get_failing_makes_the_lookup_unavailable() {
    let store = FaultyStore::memory();
    let f = Fixture::new(store.clone()).await;
    assert_eq!(f.post("/orders", "k-get", "ok").await.status, 201);
    store.fail(Call::Get);
    let answer = send(f.server.get("/orders/operations/k-get")).await;
    answer.problem(503, "store-unavailable");
    assert!(answer.header("retry-after").is_some());
    answer.operation_id();
    store.heal(Call::Get);
    let report = send(f.server.get("/orders/operations/k-get")).await;
    assert_eq!(report.json()["state"], "completed");
}

/// The store fails on `take_over` when a retry finds an ended lease: 503
/// `store-unavailable` with the operation's id; neither recovery nor the handler runs.
/// Once the store is back, recovery happens once.
#[tokio::test]
async fn take_over_failing_fails_closed() {
    let store = FaultyStore::memory();
    let f = Fixture::new(store.clone()).await;
    store.fail(Call::Complete);
    let first = f.post("/orders", "k-take", "ok").await;
    store.heal(Call::Complete);
    past_the_lease().await;
    store.fail(Call::TakeOver);
    let refused = f.post("/orders", "k-take", "ok").await;
    let problem = refused.problem(503, "store-unavailable");
    assert_eq!(problem["operation_id"], first.operation_id());
    assert!(refused.header("retry-after").is_some());
    assert_eq!((f.app.runs.get(), f.app.reconciles.get()), (1, 0));
    store.heal(Call::TakeOver);
    let retry = f.post("/orders", "k-take", "ok").await;
    assert_recovered(&retry, "k-take", first.operation_id());
    assert_eq!((f.app.runs.get(), f.app.reconciles.get()), (1, 1));
}

/// The store fails on `release` after a retryable answer given before the effect: the
/// client gets 503 `store-unavailable`, not the handler's answer (whose "retry and it
/// runs again" was not recorded); the key stays held until the lease ends; then recovery
/// finds nothing written and the retry runs.
#[tokio::test]
async fn release_failing_holds_the_key_until_recovery() {
    let store = FaultyStore::memory();
    let f = Fixture::new(store.clone()).await;
    store.fail(Call::Release);
    let first = f.post("/orders", "k-release", "503-before-effect").await;
    first.problem(503, "store-unavailable");
    store.heal(Call::Release);
    f.post("/orders", "k-release", "ok")
        .await
        .problem(409, "operation-in-progress");
    past_the_lease().await;
    let retry = f.post("/orders", "k-release", "ok").await;
    assert_eq!(retry.status, 201);
    assert!(!retry.replayed(), "not applied: the retry ran");
    assert_eq!(retry.operation_id(), first.operation_id());
    assert_eq!(
        (f.app.runs.get(), f.app.reconciles.get(), f.app.effects()),
        (2, 1, 1)
    );
}

/// A handler that writes its effect and then answers a retryable status: the key is
/// released and the retry runs the handler again, so the effect happens twice. This is
/// the documented contract of `retryable` ("only sound when the effect did not commit"),
/// pinned here so that a change is noticed.
#[tokio::test]
async fn a_retryable_answer_after_the_effect_runs_again() {
    let f = Fixture::new(idem::MemoryStore::new()).await;
    assert_eq!(
        f.post("/orders", "k-503", "503-after-effect").await.status,
        503
    );
    let retry = f.post("/orders", "k-503", "ok").await;
    assert_eq!(retry.status, 201);
    assert!(!retry.replayed());
    assert_eq!(f.app.runs.get(), 2, "the handler ran twice for one key");
    assert_eq!(
        f.app.reconciles.get(),
        0,
        "no recovery: the key was released"
    );
}

/// A handler that panics after its effect: 503 `attempt-failed` with `Retry-After`;
/// after the lease, recovery finds the order and replays it. One run.
#[tokio::test]
async fn a_panic_after_the_effect_is_recovered() {
    let f = Fixture::new(idem::MemoryStore::new()).await;
    let first = f.post("/orders", "k-panic", "panic-after-effect").await;
    let problem = first.problem(503, "attempt-failed");
    assert_eq!(problem["state"], "processing");
    assert!(first.header("retry-after").is_some());
    past_the_lease().await;
    let retry = f.post("/orders", "k-panic", "ok").await;
    assert_recovered(&retry, "k-panic", first.operation_id());
    assert_eq!((f.app.runs.get(), f.app.reconciles.get()), (1, 1));
}

/// A response body that fails while it is read, after the effect: the outcome is
/// unknown, like a panic. The client gets 503 `attempt-failed` (not a 201 with a broken
/// body), the record stays processing, and after the lease the contract's reconcile
/// function decides (it is not skipped by parking the operation for an operator).
#[tokio::test]
async fn a_failing_response_body_is_recovered() {
    let f = Fixture::new(idem::MemoryStore::new()).await;
    let first = f.post("/orders", "k-stream", "stream-error").await;
    let problem = first.problem(503, "attempt-failed");
    assert_eq!(problem["state"], "processing");
    assert!(first.header("retry-after").is_some());
    assert!(matches!(
        f.state("reconciled", "k-stream").await,
        RecordState::Processing { .. }
    ));
    past_the_lease().await;
    let retry = f.post("/orders", "k-stream", "ok").await;
    assert_recovered(&retry, "k-stream", first.operation_id());
    assert_eq!((f.app.runs.get(), f.app.reconciles.get()), (1, 1));
}

/// A response body that panics while it is read: 503 `attempt-failed`, then recovery.
#[tokio::test]
async fn a_panicking_response_body_is_recovered() {
    let f = Fixture::new(idem::MemoryStore::new()).await;
    let first = f.post("/orders", "k-body-panic", "stream-panic").await;
    first.problem(503, "attempt-failed");
    past_the_lease().await;
    let retry = f.post("/orders", "k-body-panic", "ok").await;
    assert_recovered(&retry, "k-body-panic", first.operation_id());
}

/// A response body that never ends: the attempt is bounded by its lease like the handler
/// itself. The client gets 503 `attempt-timed-out` at the lease's end, not a hang, and
/// recovery decides after it.
#[tokio::test]
async fn a_hanging_response_body_is_stopped_at_the_lease() {
    let f = Fixture::new(idem::MemoryStore::new()).await;
    // The body never ends, so only the lease can produce this answer before the client's
    // own 3 s timeout.
    let first = send(
        f.request("/orders", "k-hang", "stream-hang")
            .timeout(Duration::from_secs(3)),
    )
    .await;
    first.problem(503, "attempt-timed-out");
    past_the_lease().await;
    let retry = f.post("/orders", "k-hang", "ok").await;
    assert_recovered(&retry, "k-hang", first.operation_id());
    assert_eq!((f.app.runs.get(), f.app.reconciles.get()), (1, 1));
}

/// A streamed result (no size known in advance) past the stored-body limit: the client
/// gets all of it, its outcome is recorded (the retry gets the status and a problem body
/// with the original's length and SHA-256), and it never runs again.
#[tokio::test]
async fn a_streamed_result_past_the_stored_limit_is_sent_and_recorded() {
    let idem = Idem::builder(idem::MemoryStore::new(), identity::header("x-client-id"))
        .max_stored_body(1024)
        .build();
    let f = Fixture::with_idem(idem).await;
    let first = f.post("/orders", "k-big", "big-stream").await;
    assert_eq!(first.status, 201);
    assert_eq!(first.body.len(), 16 * 256, "the whole body");
    assert!(matches!(
        f.state("reconciled", "k-big").await,
        RecordState::Completed { .. }
    ));
    let retry = f.post("/orders", "k-big", "big-stream").await;
    retry.body_not_kept(201, &first.body);
    assert_eq!(f.app.runs.get(), 1);
}

/// A handler that blocks its thread past its time (400 ms), before its effect. The
/// server cannot stop it then; a retry that took the record over would find no effect
/// yet, and run the operation a second time alongside the first. While the first attempt
/// still runs in this process its lease is held (the heartbeat renews it, and the
/// attempt counts as running), so the retry is told "in progress"; once the handler
/// returns, its answer is recorded, and a retry gets the replay. One write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_blocking_past_its_lease_is_not_run_twice() {
    let f = Fixture::new(idem::MemoryStore::new()).await;
    let first = tokio::spawn(send(f.request("/orders", "k-block", "blocking")));
    tokio::time::sleep(LEASE + Duration::from_millis(50)).await;
    // The attempt's time is over; the first attempt is still blocked in its handler.
    let during = f.post("/orders", "k-block", "ok").await;
    during.problem(409, "operation-in-progress");
    let first = first.await.unwrap();
    assert_eq!(first.status, 201, "its own answer, recorded: {first:?}");
    let after = f.post("/orders", "k-block", "ok").await;
    assert!(after.replayed());
    assert_eq!(after.body, first.body);
    assert_eq!(f.app.writes.get(), 1, "one write");
    assert_eq!((f.app.runs.get(), f.app.reconciles.get()), (1, 0));
}

/// A handler whose effect runs on a detached blocking task: at the lease's end the
/// attempt is stopped (503 `attempt-timed-out`) and its future dropped, but the blocking
/// task goes on. A retry then recovers, finds no effect yet, and runs the operation
/// again: two writes. No lease can fence work it cannot see; this needs the
/// transactional mode (`idem::transaction`, docs/transaction.md), or a fencing token the
/// effect checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "design limit: work detached from the handler's future outlives its lease; see this test's doc comment"]
async fn detached_work_past_the_lease_is_not_run_twice() {
    let f = Fixture::new(idem::MemoryStore::new()).await;
    let first = f.post("/orders", "k-detached", "detached").await;
    first.problem(503, "attempt-timed-out");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let retry = f.post("/orders", "k-detached", "ok").await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(retry.status, 201);
    assert_eq!(f.app.writes.get(), 1, "one write");
}

/// A handler that answers with an encoded body (`Content-Encoding: gzip`): the replay
/// carries the encoding with the bytes, or the bytes mean nothing.
#[tokio::test]
async fn an_encoded_body_is_replayed_with_its_encoding() {
    let f = Fixture::new(idem::MemoryStore::new()).await;
    let first = f.post("/orders", "k-gzip", "encoded").await;
    assert_eq!(first.status, 201);
    assert_eq!(first.header("content-encoding"), Some("gzip"));
    let replay = f.post("/orders", "k-gzip", "encoded").await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.header("content-encoding"), Some("gzip"));
    assert_eq!(f.app.runs.get(), 1);
}

async fn sqlite_fixture(path: &std::path::Path, app: App) -> (Fixture, SqliteStore) {
    let store = SqliteStore::open(path).await.unwrap();
    let idem = Idem::new(store.clone(), identity::header("x-client-id"));
    (Fixture::serve(idem, app).await, store)
}

fn slow_order(f: &Fixture, key: &str) -> reqwest::RequestBuilder {
    let order = json!({ "customer_id": "c-1", "amount": 100, "delay_ms": 200 });
    f.server.post("/orders", key).json(&order)
}

/// The SQLite store is closed while an attempt runs: the client gets 503 (its answer
/// could not be recorded); new requests fail closed with 503; the service restarts on
/// the same file and recovery replays the order. One run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_closed_mid_attempt_is_recovered_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.db");
    let app = App::default();
    let (f, store) = sqlite_fixture(&path, app.clone()).await;
    let in_flight = tokio::spawn(send(slow_order(&f, "k-closed")));
    tokio::time::sleep(Duration::from_millis(50)).await;
    store.close().await;
    let first = in_flight.await.unwrap();
    first.problem(503, "store-unavailable");
    f.post("/orders", "k-closed", "ok")
        .await
        .problem(503, "store-unavailable");
    f.post("/orders", "k-other", "ok")
        .await
        .problem(503, "store-unavailable");
    assert_eq!(app.runs.get(), 1, "nothing runs while the store is down");
    f.server.stop().await;

    past_the_lease().await;
    let (f, _store) = sqlite_fixture(&path, app.clone()).await;
    let retry = f.post("/orders", "k-closed", "ok").await;
    assert_recovered(&retry, "k-closed", first.operation_id());
    assert_eq!((app.runs.get(), app.reconciles.get()), (1, 1));
    f.server.stop().await;
}

/// The database file is deleted while the service runs. Connections already open keep
/// the deleted file, so answers stay correct (a replay, or 503 from a connection that
/// opened the new empty file), and nothing runs twice; after a restart the records are
/// gone with the file and the key runs again. idem cannot tell a deleted database from
/// a new one: this pins the operator hazard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_file_deleted_mid_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gone.db");
    let app = App::default();
    let (f, store) = sqlite_fixture(&path, app.clone()).await;
    let first = f.post("/orders", "k-gone", "ok").await;
    assert_eq!(first.status, 201);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    for _ in 0..5 {
        let answer = f.post("/orders", "k-gone", "ok").await;
        match answer.status {
            201 => {
                assert!(answer.replayed());
                assert_eq!(answer.body, first.body);
            }
            _ => {
                answer.problem(503, "store-unavailable");
            }
        }
    }
    assert_eq!(app.runs.get(), 1, "no second run while the service runs");
    f.server.stop().await;
    store.close().await;

    let (f, _store) = sqlite_fixture(&path, app.clone()).await;
    let after = f.post("/orders", "k-gone", "ok").await;
    assert_eq!(after.status, 201);
    assert!(!after.replayed(), "the record went with the file");
    assert_eq!(app.runs.get(), 2);
    f.server.stop().await;
}

/// The process dies with an attempt in flight (its runtime is dropped, so the handler
/// stops before its effect), and restarts on the same SQLite file: a retry within the
/// lease is told "in progress"; after it, recovery finds nothing written and the retry
/// runs as the next attempt of the same operation. One effect.
#[test]
fn sqlite_crash_with_an_attempt_in_flight_then_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.db");
    let app = App::default();

    let doomed = process::runtime();
    let started_at = doomed.block_on(async {
        let (f, _store) = sqlite_fixture(&path, app.clone()).await;
        let request = slow_order(&f, "k-crash");
        tokio::spawn(async move { request.send().await });
        process::wait_until(|| app.runs.get() > 0).await;
        assert_eq!(app.runs.get(), 1, "the attempt is in flight");
        std::mem::forget(f); // the process dies: no graceful shutdown
        Instant::now()
    });
    doomed.shutdown_background();
    assert_eq!(app.effects(), 0, "the crash came before the effect");

    let restarted = process::runtime();
    restarted.block_on(async {
        let (f, _store) = sqlite_fixture(&path, app.clone()).await;
        let early = f.post("/orders", "k-crash", "ok").await;
        if started_at.elapsed() < LEASE {
            early.problem(409, "operation-in-progress");
        }
        tokio::time::sleep(LEASE.saturating_sub(started_at.elapsed()) + Duration::from_millis(100))
            .await;
        let retry = f.post("/orders", "k-crash", "ok").await;
        assert_eq!(retry.status, 201, "{retry:?}");
        assert!(!retry.replayed(), "not applied: the retry ran");
        let key = RecordKey::new("reconciled", "client-a", "k-crash");
        let record = f.idem.store().get(&key, unix_now()).await.unwrap().unwrap();
        assert_eq!(retry.operation_id(), record.operation_id.to_string());
        assert_eq!(record.attempt, 2, "the crashed attempt and its recovery");
        assert!(f.post("/orders", "k-crash", "ok").await.replayed());
        f.server.stop().await;
    });
    assert_eq!(
        (app.runs.get(), app.reconciles.get(), app.effects()),
        (2, 1, 1)
    );
}

/// The process dies with an attempt in flight and restarts on the same SQLite file with
/// the reconciler running: without any request, once the lease has ended, the reconciler
/// takes the record over, asks the reconcile function once (nothing was written: not
/// applied) and releases the key; the client's retry then runs as the next attempt. One
/// effect, and `inspect` shows every attempt.
#[test]
fn sqlite_crash_then_the_reconciler_recovers_without_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.db");
    let app = App::default();

    let doomed = process::runtime();
    doomed.block_on(async {
        let (f, _store) = sqlite_fixture(&path, app.clone()).await;
        let request = slow_order(&f, "k-crash");
        tokio::spawn(async move { request.send().await });
        process::wait_until(|| app.runs.get() > 0).await;
        std::mem::forget(f); // the process dies: no graceful shutdown
    });
    doomed.shutdown_background();
    assert_eq!(app.effects(), 0, "the crash came before the effect");

    let restarted = process::runtime();
    restarted.block_on(async {
        let store = SqliteStore::open(&path).await.unwrap();
        let idem = Idem::builder(store, identity::header("x-client-id"))
            .recover_with::<reconciled::Operation, _>(&app)
            .build();
        let reconciler = idem.spawn_reconciler(Duration::from_millis(50));
        let f = Fixture::serve(idem, app.clone()).await;
        let released = async {
            while f.state("reconciled", "k-crash").await != RecordState::Released {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(LEASE * 10, released)
            .await
            .expect("the reconciler releases the key without a request");
        assert_eq!(app.reconciles.get(), 1, "one recovery call");
        let retry = f.post("/orders", "k-crash", "ok").await;
        assert_eq!(retry.status, 201, "{retry:?}");
        assert!(!retry.replayed(), "not applied: the retry ran");
        reconciler.abort();
        let key = RecordKey::new("reconciled", "client-a", "k-crash");
        let shown = f
            .idem
            .store()
            .inspect(&key, unix_now())
            .await
            .unwrap()
            .unwrap();
        let ends: Vec<_> = shown.attempts.iter().map(|a| a.ended.clone()).collect();
        assert!(
            matches!(
                ends.as_slice(),
                [
                    idem::store::AttemptEnd::LeaseEnded { .. },
                    idem::store::AttemptEnd::Released,
                    idem::store::AttemptEnd::Completed { status: 201 },
                ]
            ),
            "{ends:?}"
        );
        f.server.stop().await;
    });
    assert_eq!(
        (app.runs.get(), app.reconciles.get(), app.effects()),
        (2, 1, 1)
    );
}
