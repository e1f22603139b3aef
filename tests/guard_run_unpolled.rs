//! `Guard::run` makes the attempt's future when it is called (248962b): a future it
//! returned and the caller dropped before its first poll still runs the attempt to its
//! end on the runtime, once, and its answer is stored and replayed; a future made where
//! there is no runtime and awaited on one is the same attempt as one made there.

mod common;

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idem::enforce::Enforced;
use idem::identity;
use idem::store::{RecordKey, RecordState, RecordStore, unix_now};
use idem::{Idem, MemoryStore};
use serde_json::{Value, json};

use common::answer::send;
use common::counter::Counter;
use common::process::wait_until;
use common::server::TestServer;

/// Defines the operation the hand-written handlers below run under.
#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1h",
    deadline = "10s",
    max_attempts = 3,
    retryable = [503],
    concurrency = conflict,
    status_lookup = made_status,
    recovery = manual("https://runbooks.example.com/made"),
)]
async fn made(State(runs): State<Counter>, Json(_body): Json<Value>) -> impl IntoResponse {
    runs.bump();
    StatusCode::CREATED
}

async fn made_status(
    lookup: idem::Lookup<made::Operation>,
    axum::extract::Path(key): axum::extract::Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

/// Makes the attempt's future, drops it unpolled, and answers 202 itself.
async fn dropped_unpolled(
    State(runs): State<Counter>,
    enforced: Enforced<Json<Value>, made::Operation>,
) -> Response {
    let (_, guard) = enforced.into_parts();
    let attempt = guard.run(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let n = runs.bump();
        (StatusCode::CREATED, Json(json!({ "run": n })))
    });
    drop(attempt);
    StatusCode::ACCEPTED.into_response()
}

/// Makes the attempt's future on a thread outside the runtime, then awaits it here.
async fn made_off_the_runtime(
    State(runs): State<Counter>,
    enforced: Enforced<Json<Value>, made::Operation>,
) -> Response {
    let (_, guard) = enforced.into_parts();
    let attempt = std::thread::spawn(move || {
        guard.run(async move {
            let n = runs.bump();
            (StatusCode::CREATED, Json(json!({ "run": n })))
        })
    })
    .join()
    .unwrap();
    attempt.await
}

async fn serve(store: std::sync::Arc<MemoryStore>, runs: Counter) -> TestServer {
    let idem = Idem::builder(store, identity::header("x-client-id")).build();
    let router = Router::new()
        .route("/unpolled", post(dropped_unpolled))
        .route("/off", post(made_off_the_runtime))
        .with_state(runs)
        .layer(idem.layer());
    TestServer::start(router).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_future_dropped_unpolled_runs_its_attempt_once_and_stores_it() {
    let store = std::sync::Arc::new(MemoryStore::new());
    let runs = Counter::default();
    let server = serve(store.clone(), runs.clone()).await;
    let first = send(server.post("/unpolled", "k1").json(&json!({ "a": 1 }))).await;
    assert_eq!(first.status, 202, "the caller's own answer");
    let counted = runs.clone();
    tokio::time::timeout(
        Duration::from_secs(5),
        wait_until(move || counted.get() == 1),
    )
    .await
    .unwrap();
    assert_eq!(runs.get(), 1, "the attempt ran on the runtime");
    let key = RecordKey::new("made", "client-a", "k1");
    let mut state = None;
    for _ in 0..100 {
        state = store.get(&key, unix_now()).await.unwrap().map(|r| r.state);
        if matches!(state, Some(RecordState::Completed { .. })) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        matches!(&state, Some(RecordState::Completed { response }) if response.status == 201),
        "{state:?}"
    );
    let retry = send(server.post("/unpolled", "k1").json(&json!({ "a": 1 }))).await;
    assert_eq!(retry.status, 201, "the stored answer replayed");
    assert!(retry.replayed());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(runs.get(), 1, "the handler ran once");
    server.stop().await;
}

/// Before 248962b the attempt's future was made at its first poll, on the runtime: a
/// future made off it and awaited on it ran the handler. Now `Guard::run` looks for the
/// runtime when called, and answers 503 `attempt-failed` without running anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_future_made_off_the_runtime_and_awaited_on_it_runs_the_handler() {
    let store = std::sync::Arc::new(MemoryStore::new());
    let runs = Counter::default();
    let server = serve(store, runs.clone()).await;
    let answer = send(server.post("/off", "k2").json(&json!({ "a": 2 }))).await;
    assert_eq!(
        (answer.status, runs.get()),
        (201, 1),
        "{:?}",
        String::from_utf8_lossy(&answer.body)
    );
    server.stop().await;
}
