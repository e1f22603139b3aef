//! A result too large to keep is a known outcome on every store: the first answer goes
//! out whole, the record is completed with its status, its replayed headers and the
//! body's length and SHA-256, and a retry gets that status, replayed, with a problem body
//! in place of the original's. Nothing is parked, nothing answers 5xx, nothing runs
//! twice. Both limits are tried: the handle's (`max_stored_body`) and the store's own
//! (`with_max_result`, which counts the headers too).

mod common;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use idem::identity;
use idem::store::{RecordKey, RecordState, Store, unix_now};
use idem::{Idem, MemoryStore};
use idem_runtime::store::conformance::postgres::scratch_url;
use idem_runtime::store::conformance::redis::{scratch_store, url_or_skip};
use idem_runtime::store::{DEFAULT_MAX_RESULT, PostgresStore, SqliteStore};
use serde::Deserialize;
use serde_json::json;

use common::answer::{Answer, send};
use common::counter::Counter;
use common::server::TestServer;

#[derive(Deserialize)]
struct Refused {
    customer_id: String,
    /// The size of the 422's body, in bytes.
    size: usize,
}

/// Answers 422 with a body of `size` bytes and a `Location`, counting its runs.
#[idem::contract(
    key_scope = client,
    fingerprint = [customer_id, size],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 3,
    retryable = [503],
    concurrency = conflict,
    status_lookup = refusal_status(path = "/refusals/operations/{key}"),
    recovery = manual("https://runbooks.example.com/refusals"),
)]
async fn refuse(State(runs): State<Counter>, Json(order): Json<Refused>) -> impl IntoResponse {
    runs.bump();
    let body = "e".repeat(order.size);
    let location = format!("/customers/{}/refusals/1", order.customer_id);
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        [("location", location)],
        body,
    )
}

async fn refusal_status(
    lookup: idem::Lookup<refuse::Operation>,
    axum::extract::Path(key): axum::extract::Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

async fn post_refusal(server: &TestServer, key: &str, size: usize) -> Answer {
    let body = json!({ "customer_id": "cus_1", "size": size });
    send(server.post("/refusals", key).json(&body)).await
}

/// Both limits on `store`: a body over the handle's 64 KiB default, and one that fits
/// a handle allowing 4 MiB but not the store's 1 MiB.
async fn both_limits(store: impl Store + Clone) {
    for (key, max_stored_body, size) in [
        ("k-handle", Idem::DEFAULT_MAX_STORED_BODY, 100 * 1024),
        ("k-store", 4 << 20, DEFAULT_MAX_RESULT + 1),
    ] {
        let idem = Idem::builder(store.clone(), identity::header("x-client-id"))
            .max_stored_body(max_stored_body)
            .build();
        let runs = Counter::default();
        let router = Router::new()
            .route("/refusals", post(refuse))
            .route("/refusals/operations/{key}", get(refusal_status))
            .with_state(runs.clone())
            .layer(idem.layer());
        let server = TestServer::start(router).await;
        let first = post_refusal(&server, key, size).await;
        assert_eq!((first.status, first.body.len()), (422, size), "{key}");
        assert!(!first.replayed());
        let record_key = RecordKey::new("refuse", "client-a", key);
        let record = store.get(&record_key, unix_now()).await.unwrap().unwrap();
        assert!(
            matches!(record.state, RecordState::Completed { .. }),
            "{key}: {:?}",
            record.state
        );
        for _ in 0..2 {
            let retry = post_refusal(&server, key, size).await;
            retry.body_not_kept(422, &first.body);
            assert_eq!(
                retry.header("location"),
                Some("/customers/cus_1/refusals/1")
            );
            assert_eq!(retry.operation_id(), first.operation_id());
        }
        assert_eq!(runs.get(), 1, "{key}: ran once");
        server.stop().await;
    }
}

#[tokio::test]
async fn memory() {
    both_limits(std::sync::Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
    both_limits(store).await;
}

#[tokio::test]
async fn postgres() {
    let Some(url) = scratch_url("a result too large to keep, on PostgreSQL").await else {
        return;
    };
    both_limits(PostgresStore::connect(&url).await.unwrap()).await;
}

#[tokio::test]
async fn redis() {
    let Some(url) = url_or_skip("a result too large to keep, on Redis").await else {
        return;
    };
    both_limits(scratch_store(&url).await).await;
}
