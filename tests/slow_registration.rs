//! A registration whose answer comes back after its lease has run out (a pool that was
//! slow to give a connection, a server that answers late: the lease was computed before
//! the wait). Two instances share one store; the second sees the first's lease ended and
//! takes the record over. The first must then not run its handler: the operation runs
//! once.

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use common::answer::send;
use common::counter::Counter;
use common::faults::FaultyStore;
use common::server::TestServer;
use idem::store::MemoryStore;
use idem::{Decision, Idem, UnknownOperation, identity};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
struct CreateOrder {
    amount: i64,
}

/// Counts its run, and takes 300 ms.
#[idem::contract(
    key_scope = client,
    fingerprint = [amount],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 3,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status(path = "/orders/operations/{key}"),
    recovery = nothing_happened,
)]
async fn create_order(
    State(runs): State<Counter>,
    Json(order): Json<CreateOrder>,
) -> impl IntoResponse {
    let n = runs.bump();
    tokio::time::sleep(Duration::from_millis(300)).await;
    (
        StatusCode::CREATED,
        Json(json!({ "run": n, "amount": order.amount })),
    )
}

async fn order_status(
    lookup: idem::Lookup<create_order::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

/// The handler writes nothing before it answers, so an attempt that did not answer did
/// nothing.
async fn nothing_happened(_runs: Counter, _op: UnknownOperation) -> Decision {
    Decision::NotApplied
}

fn instance(store: impl idem::store::Store, runs: &Counter) -> Router {
    let idem = Idem::builder(store, identity::header("x-client-id"))
        .heartbeat(Duration::from_millis(90))
        .build();
    Router::new()
        .route("/orders", post(create_order))
        .route("/orders/operations/{key}", get(order_status))
        .with_state(runs.clone())
        .layer(idem.layer())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_answered_after_its_lease_ended_does_not_run_beside_a_takeover() {
    let shared = Arc::new(MemoryStore::new());
    let slow = FaultyStore::over(Arc::clone(&shared));
    slow.delay_begin(Duration::from_millis(250));
    let runs = Counter::default();
    let a = TestServer::start(instance(slow, &runs)).await;
    let b = TestServer::start(instance(Arc::clone(&shared), &runs)).await;

    let body = json!({ "amount": 7 });
    let first = tokio::spawn({
        let request = a.post("/orders", "k-1").json(&body);
        async move { send(request).await }
    });
    // A's record is written at once with a 90 ms lease; its answer comes 250 ms later.
    // At 140 ms B sees the lease ended and takes the record over.
    tokio::time::sleep(Duration::from_millis(140)).await;
    let second = send(b.post("/orders", "k-1").json(&body)).await;
    let first = first.await.unwrap();

    assert_eq!(
        second.status,
        201,
        "B took over and ran: {}",
        String::from_utf8_lossy(&second.body)
    );
    assert_eq!(
        runs.get(),
        1,
        "the operation ran once: A ({}) must not run beside B's takeover",
        first.status
    );
    assert_ne!(
        first.status, 201,
        "A did not run, so it has no result of its own"
    );
    assert!(
        matches!(first.status, 409 | 503),
        "A answers what a duplicate of a running attempt gets: {} {}",
        first.status,
        String::from_utf8_lossy(&first.body)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_answered_after_its_lease_ended_still_runs_when_nobody_took_over() {
    let slow = FaultyStore::memory();
    slow.delay_begin(Duration::from_millis(250));
    let runs = Counter::default();
    let a = TestServer::start(instance(slow.clone(), &runs)).await;

    let answer = send(a.post("/orders", "k-1").json(&json!({ "amount": 7 }))).await;
    assert_eq!(
        answer.status,
        201,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(runs.get(), 1);
    let again = send(a.post("/orders", "k-1").json(&json!({ "amount": 7 }))).await;
    assert!(again.replayed());
    assert_eq!(runs.get(), 1);
}
