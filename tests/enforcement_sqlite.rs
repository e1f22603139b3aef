//! The SQLite store behind a real server: a completed key is replayed after the service
//! restarts (the store is durable: `idem::SqliteStore`).

mod common;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use common::answer::send;
use common::counter::Counter;
use common::server::TestServer;
use idem::{Idem, SqliteStore, identity};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
struct CreateOrder {
    customer_id: String,
    amount_minor: i64,
}

#[idem::contract(
    key_scope = client,
    fingerprint = [customer_id, amount_minor],
    ttl = "24h",
    deadline = "30s",
    max_attempts = 4,
    retryable = [429, 503, timeout],
    concurrency = conflict,
    status_lookup = order_status(path = "/orders/operations/{key}"),
    recovery = manual("https://runbooks.example.com/orders"),
)]
async fn create_order(
    State(runs): State<Counter>,
    Json(order): Json<CreateOrder>,
) -> impl IntoResponse {
    let n = runs.bump();
    let mut headers = HeaderMap::new();
    headers.insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/orders/{n}")).unwrap(),
    );
    headers.insert(header::ETAG, HeaderValue::from_static("\"1\""));
    let body =
        json!({ "id": n, "customer_id": order.customer_id, "amount_minor": order.amount_minor });
    (StatusCode::CREATED, headers, Json(body))
}

async fn order_status(
    lookup: idem::Lookup<create_order::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

async fn start(path: &std::path::Path, runs: Counter) -> (TestServer, SqliteStore) {
    let store = SqliteStore::open(path).await.expect("open the SQLite file");
    let idem = Idem::new(store.clone(), identity::header("x-client-id"));
    let router = Router::new()
        .route("/orders", post(create_order))
        .route("/orders/operations/{key}", get(order_status))
        .with_state(runs)
        .layer(idem.layer());
    (TestServer::start(router).await, store)
}

#[tokio::test]
async fn a_completed_key_is_replayed_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.db");
    let runs = Counter::default();
    let body = json!({ "customer_id": "c-9", "amount_minor": 1250 });
    let post = |server: &TestServer| send(server.post("/orders", "order-2026-0001").json(&body));

    let (server, store) = start(&path, runs.clone()).await;
    let first = post(&server).await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    server.stop().await;
    store.close().await;

    let (server, _store) = start(&path, runs.clone()).await;
    let replay = post(&server).await;
    assert_eq!(replay.status, 201);
    assert!(
        replay.replayed(),
        "replayed from the file after the restart"
    );
    assert_eq!(replay.body, first.body, "byte for byte");
    assert_eq!(replay.header("location"), Some("/orders/1"));
    assert_eq!(replay.header("etag"), Some("\"1\""));
    assert_eq!(replay.header("content-type"), Some("application/json"));
    assert_eq!(replay.operation_id(), first.operation_id());
    assert_eq!(runs.get(), 1, "the handler ran once across both processes");

    let report = send(server.get("/orders/operations/order-2026-0001")).await;
    assert_eq!(report.status, 200);
    assert_eq!(report.json()["state"], "completed");
    assert_eq!(report.json()["response"]["body"], first.json());

    let other = send(
        server
            .post("/orders", "order-2026-0001")
            .json(&json!({ "customer_id": "c-9", "amount_minor": 9999 })),
    )
    .await;
    other.problem(422, "fingerprint-mismatch");
    server.stop().await;
}

/// Concurrent duplicates against the SQLite store: one run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_run_once_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let runs = Counter::default();
    let (server, _store) = start(&dir.path().join("race.db"), runs.clone()).await;
    let answers = futures_util::future::join_all((0..10).map(|_| {
        send(
            server
                .post("/orders", "race")
                .json(&json!({ "customer_id": "c", "amount_minor": 1 })),
        )
    }))
    .await;
    let fresh = answers
        .iter()
        .filter(|a| a.status == 201 && !a.replayed())
        .count();
    assert_eq!(fresh, 1, "{answers:?}");
    assert!(answers.iter().all(|a| a.status == 201 || a.status == 409));
    assert_eq!(runs.get(), 1);
    server.stop().await;
}
