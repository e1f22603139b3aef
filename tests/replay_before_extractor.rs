//! Stage 5 of the request path (`enforce/look.rs`): on a store that reads in this
//! process, a completed key is answered from one read before the handler's extractor
//! runs; on any other store the extractor runs first, as it always did. Over real
//! sockets, with the extractor's runs and the handler's counted apart.

mod common;

use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRef, FromRequest, Request, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use common::answer::send;
use common::counter::Counter;
use common::faults::{Call, FaultyStore};
use common::server::TestServer;
use idem::store::{MemoryStore, Store};
use idem::{Idem, identity};
use reqwest::Method;
use serde_json::{Value, json};

/// The runs of the extractor and of the handler.
#[derive(Clone, Default)]
struct Counts {
    extracted: Counter,
    runs: Counter,
}

impl FromRef<Counts> for Counter {
    fn from_ref(counts: &Counts) -> Counter {
        counts.runs.clone()
    }
}

/// `Json<Value>`, counting each time it runs.
struct CountedJson(Value);

impl FromRequest<Counts> for CountedJson {
    type Rejection = axum::extract::rejection::JsonRejection;

    async fn from_request(request: Request, state: &Counts) -> Result<Self, Self::Rejection> {
        state.extracted.bump();
        let axum::Json(value) = axum::Json::<Value>::from_request(request, state).await?;
        Ok(CountedJson(value))
    }
}

#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1h",
    deadline = "10s",
    max_attempts = 3,
    retryable = [503],
    concurrency = conflict,
    status_lookup = status,
    recovery = manual("https://runbooks.example.com/counted"),
)]
async fn counted(State(runs): State<Counter>, CountedJson(body): CountedJson) -> impl IntoResponse {
    let n = runs.bump();
    (
        StatusCode::CREATED,
        axum::Json(json!({ "run": n, "body": body })),
    )
}

async fn status(
    lookup: idem::Lookup<counted::Operation>,
    axum::extract::Path(key): axum::extract::Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

/// A store that reads over a network, as far as the request path can tell: the memory
/// store with `reads_locally` written `false` (every other method forwarded).
struct Remote(MemoryStore);

idem_runtime::forward_store! {
    impl[] RecordStore for Remote {
        forward |this| &this.0;

        fn reads_locally(&self) -> bool {
            false
        }
    }
    impl[] OperatorStore for Remote {
        forward |this| &this.0;
    }
}

async fn serve(store: impl Store) -> (TestServer, Counts) {
    let counts = Counts::default();
    let idem = Idem::new(store, identity::header("x-client-id"));
    let app = Router::new()
        .route("/counted", post(counted))
        .with_state(counts.clone())
        .layer(idem.layer());
    (TestServer::start(app).await, counts)
}

async fn order(server: &TestServer, key: &str, body: Value) -> common::answer::Answer {
    send(
        server
            .request(Method::POST, "/counted", "client-a", Some(key))
            .json(&body),
    )
    .await
}

/// Through `Arc<MemoryStore>` (the wrapper forwards `reads_locally`): a new key runs the
/// extractor and the handler once; its replay runs neither; another body under the key
/// runs the extractor (which answers a malformed request first, as on every store), then
/// 422, and a request the extractor refuses gets the extractor's answer, not 422.
#[tokio::test]
async fn a_replay_on_the_memory_store_never_runs_the_extractor() {
    let (server, counts) = serve(Arc::new(MemoryStore::new())).await;
    let first = order(&server, "k-1", json!({ "amount": 100 })).await;
    assert_eq!(first.status, 201);
    assert_eq!((counts.extracted.get(), counts.runs.get()), (1, 1));

    let again = order(&server, "k-1", json!({ "amount": 100 })).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(again.operation_id(), first.operation_id());
    assert_eq!(
        (counts.extracted.get(), counts.runs.get()),
        (1, 1),
        "the replay ran neither the extractor nor the handler"
    );
    let other = order(&server, "k-1", json!({ "amount": 900 })).await;
    other.problem(422, "fingerprint-mismatch");
    assert_eq!((counts.extracted.get(), counts.runs.get()), (2, 1));
    let untyped = send(
        server
            .request(Method::POST, "/counted", "client-a", Some("k-1"))
            .body(r#"{"amount":900}"#),
    )
    .await;
    assert_eq!(untyped.status, 415, "the extractor's own answer, not 422");

    let second = order(&server, "k-2", json!({ "amount": 100 })).await;
    assert_eq!(second.status, 201, "a new key still runs");
    assert_eq!(counts.runs.get(), 2);
}

/// A store that does not read in this process: the extractor runs before the key is
/// registered, on every request (a read first would cost each new key a round trip);
/// the answers are the same.
#[tokio::test]
async fn a_store_over_a_network_runs_the_extractor_first() {
    let (server, counts) = serve(Remote(MemoryStore::new())).await;
    let first = order(&server, "k-1", json!({ "amount": 100 })).await;
    assert_eq!(first.status, 201);
    let again = order(&server, "k-1", json!({ "amount": 100 })).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    let other = order(&server, "k-1", json!({ "amount": 900 })).await;
    other.problem(422, "fingerprint-mismatch");
    assert_eq!((counts.extracted.get(), counts.runs.get()), (3, 1));
}

/// The read before the extractor fails (the store is down for reads): 503
/// `store-unavailable` for a new key and for a completed one, the extractor and the
/// handler not run, nothing registered; once reads work again the completed key replays
/// and the new key runs, once each.
#[tokio::test]
async fn a_failed_read_before_the_extractor_fails_closed() {
    let store = FaultyStore::memory();
    let (server, counts) = serve(store.clone()).await;
    let done = order(&server, "k-done", json!({ "amount": 100 })).await;
    assert_eq!(done.status, 201);
    assert_eq!((counts.extracted.get(), counts.runs.get()), (1, 1));

    store.fail(Call::Get);
    for key in ["k-done", "k-new"] {
        let answer = order(&server, key, json!({ "amount": 100 })).await;
        answer.problem(503, "store-unavailable");
    }
    assert_eq!(
        (counts.extracted.get(), counts.runs.get()),
        (1, 1),
        "neither the extractor nor the handler ran"
    );

    store.heal(Call::Get);
    let again = order(&server, "k-done", json!({ "amount": 100 })).await;
    assert!(again.replayed());
    assert_eq!(again.operation_id(), done.operation_id());
    let new = order(&server, "k-new", json!({ "amount": 100 })).await;
    assert_eq!(new.status, 201);
    assert_eq!((counts.extracted.get(), counts.runs.get()), (2, 2));
}
