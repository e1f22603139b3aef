//! The answers of docs/answers.md that need no recovery, over real sockets, with the
//! handler runs counted: keys, fingerprints and replays, concurrent duplicates, retryable
//! and permanent answers, a store that is down, answers given before the handler,
//! oversized results, the status lookup. Recovery is in `enforcement_recovery.rs`, the
//! transactional mode in `transactional.rs`.

mod common;

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use common::answer::{Answer, send};
use common::counter::Counter;
use common::faults::{Call, FaultyStore};
use common::orders::{CreateOrder, echo, pay};
use common::raw;
use common::server::{TestServer, client};
use idem::store::{MemoryStore, RecordKey, RecordState, Store, unix_now};
use idem::{Idem, identity};
use reqwest::Method;
use serde_json::{Value, json};

/// This file's own `POST /orders`: the handler of `common::orders::create_order`, under a
/// contract that also declares 429 and timeouts retryable.
#[idem::contract(
    key_scope = client,
    fingerprint = [customer_id, amount],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 3,
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
    tokio::time::sleep(Duration::from_millis(order.delay_ms)).await;
    (
        StatusCode::CREATED,
        Json(json!({ "order": n, "customer_id": order.customer_id, "amount": order.amount })),
    )
}

#[idem::contract(
    key_scope = client,
    fingerprint = [customer_id, amount],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 3,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = manual("https://runbooks.example.com/refunds"),
)]
async fn create_refund(
    State(runs): State<Counter>,
    Json(order): Json<CreateOrder>,
) -> impl IntoResponse {
    let n = runs.bump();
    (
        StatusCode::CREATED,
        Json(json!({ "refund": n, "amount": order.amount })),
    )
}

#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1h",
    deadline = "10s",
    max_attempts = 3,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = manual("https://runbooks.example.com/cancel"),
)]
async fn cancel(State(runs): State<Counter>) -> StatusCode {
    runs.bump();
    StatusCode::NO_CONTENT
}

/// 201 with `Location`, `ETag` and a body whose exact bytes matter (spacing, a
/// non-ASCII character, a trailing newline).
#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1h",
    deadline = "10s",
    max_attempts = 3,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = manual("https://runbooks.example.com/created"),
)]
async fn created(State(runs): State<Counter>) -> impl IntoResponse {
    let n = runs.bump();
    let mut headers = HeaderMap::new();
    headers.insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/orders/{n}")).unwrap(),
    );
    headers.insert(
        header::ETAG,
        HeaderValue::from_str(&format!("\"v{n}\"")).unwrap(),
    );
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    headers.insert("x-not-replayed", HeaderValue::from_static("1"));
    (
        StatusCode::CREATED,
        headers,
        format!("{{ \"id\" : {n},\n  \"name\": \"café\" }}\n"),
    )
}

/// 503 (declared retryable) on the first run, 201 after.
#[idem::contract(
    key_scope = client,
    fingerprint = [customer_id, amount],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 3,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = manual("https://runbooks.example.com/flaky"),
)]
async fn flaky(State(runs): State<Counter>, Json(order): Json<CreateOrder>) -> impl IntoResponse {
    match runs.bump() {
        1 => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "error": "busy" })),
        ),
        n => (
            StatusCode::CREATED,
            Json(json!({ "order": n, "amount": order.amount })),
        ),
    }
}

/// A permanent error: 422 from the business rules.
#[idem::contract(
    key_scope = client,
    fingerprint = [customer_id, amount],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 3,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = manual("https://runbooks.example.com/rejects"),
)]
async fn rejects(
    State(runs): State<Counter>,
    Json(_order): Json<CreateOrder>,
) -> impl IntoResponse {
    let n = runs.bump();
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        Json(json!({ "error": "amount over the limit", "run": n })),
    )
}

async fn order_status(
    lookup: idem::Lookup<create_order::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

fn routes(runs: Counter) -> Router {
    Router::new()
        .route("/orders", post(create_order))
        .route("/refunds", post(create_refund))
        .route("/echo", post(echo))
        .route("/cancel", post(cancel))
        .route("/created", post(created))
        .route("/flaky", post(flaky))
        .route("/rejects", post(rejects))
        .route("/payments", post(pay))
        .route("/orders/operations/{key}", get(order_status))
        .with_state(runs)
}

struct Fixture {
    server: TestServer,
    runs: Counter,
    idem: Idem,
}

impl Fixture {
    async fn with_store(store: impl Store) -> Fixture {
        let idem = Idem::new(store, identity::header("x-client-id"));
        Fixture::with_idem(idem).await
    }

    async fn with_idem(idem: Idem) -> Fixture {
        let runs = Counter::default();
        let server = TestServer::start(routes(runs.clone()).layer(idem.layer())).await;
        Fixture { server, runs, idem }
    }

    async fn new() -> Fixture {
        Fixture::with_store(MemoryStore::new()).await
    }

    fn post(&self, path: &str, client_id: &str, key: Option<&str>) -> reqwest::RequestBuilder {
        self.server.request(Method::POST, path, client_id, key)
    }

    async fn order(&self, key: &str, body: Value) -> Answer {
        send(self.post("/orders", "client-a", Some(key)).json(&body)).await
    }
}

fn order_body(amount: i64) -> Value {
    json!({ "customer_id": "c-1", "amount": amount })
}

/// 10 concurrent identical POSTs while the handler takes 200 ms: one run, nine 409 with
/// `Retry-After`; a repeat after completion replays the first answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_run_once_then_replay() {
    let f = Fixture::new().await;
    let body = json!({ "customer_id": "c-1", "amount": 100, "delay_ms": 200 });
    let answers =
        futures_util::future::join_all((0..10).map(|_| f.order("concurrent-1", body.clone())))
            .await;
    let created: Vec<&Answer> = answers.iter().filter(|a| a.status == 201).collect();
    assert_eq!(created.len(), 1, "exactly one request ran: {answers:?}");
    assert!(!created[0].replayed());
    for answer in answers.iter().filter(|a| a.status != 201) {
        let problem = answer.problem(409, "operation-in-progress");
        assert_eq!(answer.header("retry-after"), Some("1"));
        assert_eq!(problem["state"], "processing");
        assert_eq!(problem["new_key_safe"], false);
        assert_eq!(problem["operation_id"], created[0].operation_id());
        assert_eq!(answer.operation_id(), created[0].operation_id());
    }
    assert_eq!(f.runs.get(), 1, "the handler ran once");

    let repeat = f.order("concurrent-1", body).await;
    assert_eq!(repeat.status, 201);
    assert!(repeat.replayed(), "Idempotent-Replayed: true");
    assert_eq!(repeat.body, created[0].body, "the body byte for byte");
    assert_eq!(repeat.operation_id(), created[0].operation_id());
    assert_eq!(f.runs.get(), 1);
}

/// Same key, other significant content: 422, nothing runs, the record is unchanged.
#[tokio::test]
async fn fingerprint_mismatch_is_refused_and_changes_nothing() {
    let f = Fixture::new().await;
    let first = f.order("k-mismatch", order_body(100)).await;
    assert_eq!(first.status, 201);
    let key = RecordKey::new("create_order", "client-a", "k-mismatch");
    let before = f.idem.store().get(&key, unix_now()).await.unwrap().unwrap();

    let other = f.order("k-mismatch", order_body(900)).await;
    let problem = other.problem(422, "fingerprint-mismatch");
    assert_eq!(problem["state"], "completed");
    assert_eq!(problem["new_key_safe"], false);
    assert_eq!(problem["operation_id"], first.operation_id());
    assert_eq!(f.runs.get(), 1, "the handler did not run");
    let after = f.idem.store().get(&key, unix_now()).await.unwrap().unwrap();
    assert_eq!(after, before, "the stored record is unchanged");

    // A field outside the fingerprint does not matter.
    let same = f
        .order(
            "k-mismatch",
            json!({ "amount": 100, "customer_id": "c-1", "delay_ms": 0 }),
        )
        .await;
    assert!(same.replayed());
    assert_eq!(same.body, first.body);
}

/// RFC 8785: member order, whitespace and number spelling do not matter; array order
/// does.
#[tokio::test]
async fn fingerprints_are_canonical_json() {
    let f = Fixture::new().await;
    let raw = |key: &'static str, body: &'static str| {
        send(
            f.post("/echo", "client-a", Some(key))
                .header("content-type", "application/json")
                .body(body),
        )
    };
    let first = raw("k-objects", r#"{"a":1,"b":{"x":1,"y":2}}"#).await;
    assert_eq!(first.status, 201);
    let second = raw("k-objects", "{ \"b\" : {\"y\": 2,\n \"x\": 1},\t\"a\": 1 }").await;
    assert!(
        second.replayed(),
        "same members in another order and spacing: a replay"
    );
    assert_eq!(second.body, first.body);

    assert_eq!(raw("k-arrays", "[1,2]").await.status, 201);
    raw("k-arrays", "[2,1]")
        .await
        .problem(422, "fingerprint-mismatch");

    assert_eq!(raw("k-numbers", "1").await.status, 201);
    assert!(raw("k-numbers", "1.0").await.replayed());
    assert!(raw("k-numbers", "1e0").await.replayed());
    assert_eq!(f.runs.get(), 3);
}

/// Sends a raw HTTP/1.1 request, so that header names keep the spelling given.
async fn raw_request(addr: std::net::SocketAddr, key_header: &str, body: &str) -> raw::RawAnswer {
    let headers: [&[u8]; 3] = [
        b"X-Client-Id: client-a",
        key_header.as_bytes(),
        b"Content-Type: application/json",
    ];
    raw::send(addr, &raw::post("/orders", &headers, body.as_bytes())).await
}

/// The key's header name is matched case-insensitively: three spellings, one record.
#[tokio::test]
async fn key_header_is_case_insensitive() {
    let f = Fixture::new().await;
    let body = order_body(100).to_string();
    let mut answers = Vec::new();
    for name in ["Idempotency-Key", "idempotency-key", "IDEMPOTENCY-KEY"] {
        answers.push(raw_request(f.server.addr, &format!("{name}: k-case"), &body).await);
    }
    for answer in &answers {
        assert!(answer.head.starts_with("HTTP/1.1 201"), "{}", answer.head);
    }
    let replayed = |a: &raw::RawAnswer| {
        a.header("idempotent-replayed")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    };
    assert!(!replayed(&answers[0]));
    assert!(
        replayed(&answers[1]) && replayed(&answers[2]),
        "{answers:?}"
    );
    assert_eq!(f.runs.get(), 1, "one record");
}

/// Keys are checked before any store call: 128 emoji (512 bytes) and 256 characters are
/// refused, 255 visible ASCII characters are accepted.
#[tokio::test]
async fn key_rules_are_checked_before_the_store() {
    let store = FaultyStore::memory();
    let f = Fixture::with_store(store.clone()).await;
    let emoji = HeaderValue::from_bytes("🦀".repeat(128).as_bytes()).unwrap();
    let answer = send(
        f.server
            .http
            .post(f.server.url("/orders"))
            .header("x-client-id", "client-a")
            .header("idempotency-key", emoji)
            .json(&order_body(1)),
    )
    .await;
    let problem = answer.problem(400, "key-malformed");
    assert_eq!(problem["new_key_safe"], true);
    assert!(
        problem["detail"].as_str().unwrap().contains("512 bytes"),
        "{problem}"
    );
    answer.operation_id();
    assert_eq!(store.total(), 0, "no store call for a malformed key");

    f.order(&"k".repeat(256), order_body(1))
        .await
        .problem(400, "key-malformed");
    f.order("has space", order_body(1))
        .await
        .problem(400, "key-malformed");
    assert_eq!(store.total(), 0);
    assert_eq!(f.runs.get(), 0);

    assert_eq!(f.order(&"k".repeat(255), order_body(1)).await.status, 201);
    assert_eq!(f.runs.get(), 1);
}

/// A keyed operation without a key: 400 each time, a fresh operation id each time, and the
/// handler never runs.
#[tokio::test]
async fn missing_key_is_refused_without_running() {
    let store = FaultyStore::memory();
    let f = Fixture::with_store(store.clone()).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let answer = send(f.post("/orders", "client-a", None).json(&order_body(1))).await;
        let problem = answer.problem(400, "key-missing");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("Idempotency-Key")
        );
        ids.push(answer.operation_id().to_owned());
    }
    assert_ne!(ids[0], ids[1], "a fresh operation id per answer");
    assert_eq!(f.runs.get(), 0);
    assert_eq!(store.total(), 0);
}

/// Two clients with one key, and one client's key on two operations: independent
/// operations, never the other's result.
#[tokio::test]
async fn clients_and_operations_are_independent() {
    let f = Fixture::new().await;
    let a = send(
        f.post("/orders", "client-a", Some("shared"))
            .json(&order_body(5)),
    )
    .await;
    let b = send(
        f.post("/orders", "client-b", Some("shared"))
            .json(&order_body(5)),
    )
    .await;
    let refund = send(
        f.post("/refunds", "client-a", Some("shared"))
            .json(&order_body(5)),
    )
    .await;
    for answer in [&a, &b, &refund] {
        assert_eq!(answer.status, 201);
        assert!(!answer.replayed());
    }
    assert_eq!(a.json()["order"], 1);
    assert_eq!(b.json()["order"], 2);
    assert_eq!(refund.json()["refund"], 3);
    assert_ne!(a.operation_id(), b.operation_id());
    assert_ne!(a.operation_id(), refund.operation_id());

    let again_b = send(
        f.post("/orders", "client-b", Some("shared"))
            .json(&order_body(5)),
    )
    .await;
    assert!(again_b.replayed());
    assert_eq!(again_b.body, b.body, "client b gets its own result");
    // Another client's fingerprint does not clash either.
    let c = send(
        f.post("/orders", "client-c", Some("shared"))
            .json(&order_body(7)),
    )
    .await;
    assert_eq!(c.status, 201);
    assert_eq!(f.runs.get(), 4);
}

/// 204 with no body is replayed as 204 with no body.
#[tokio::test]
async fn no_content_is_replayed_empty() {
    let f = Fixture::new().await;
    let first = send(f.post("/cancel", "client-a", Some("k-204"))).await;
    assert_eq!(first.status, 204);
    assert!(first.body.is_empty());
    let replay = send(f.post("/cancel", "client-a", Some("k-204"))).await;
    assert_eq!(replay.status, 204);
    assert!(replay.replayed());
    assert!(replay.body.is_empty());
    assert_eq!(f.runs.get(), 1);
}

/// 201 with `Location` and `ETag`: the replay carries both, the content type, and the body
/// byte for byte; headers that are not selected are not replayed.
#[tokio::test]
async fn created_is_replayed_byte_for_byte() {
    let f = Fixture::new().await;
    let first = send(f.post("/created", "client-a", Some("k-201"))).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.header("location"), Some("/orders/1"));
    assert_eq!(first.header("x-not-replayed"), Some("1"));
    let replay = send(f.post("/created", "client-a", Some("k-201"))).await;
    assert_eq!(replay.status, 201);
    assert!(replay.replayed());
    assert_eq!(replay.header("location"), Some("/orders/1"));
    assert_eq!(replay.header("etag"), Some("\"v1\""));
    assert_eq!(
        replay.header("content-type"),
        Some("application/json; charset=utf-8")
    );
    assert_eq!(replay.header("x-not-replayed"), None);
    assert_eq!(replay.body, first.body);
    assert_eq!(
        replay.body,
        "{ \"id\" : 1,\n  \"name\": \"café\" }\n".as_bytes()
    );
    assert_eq!(f.runs.get(), 1);
}

/// A retryable answer releases the key: the retry runs, and its 201 is stored.
#[tokio::test]
async fn retryable_status_releases_the_key() {
    let f = Fixture::new().await;
    let post = || {
        send(
            f.post("/flaky", "client-a", Some("k-flaky"))
                .json(&order_body(3)),
        )
    };
    let first = post().await;
    assert_eq!(first.status, 503);
    assert!(!first.replayed());
    let second = post().await;
    assert_eq!(second.status, 201);
    assert!(!second.replayed(), "the retry ran");
    assert_eq!(
        second.operation_id(),
        first.operation_id(),
        "one operation, two attempts"
    );
    let third = post().await;
    assert_eq!(third.status, 201);
    assert!(third.replayed());
    assert_eq!(third.body, second.body);
    assert_eq!(f.runs.get(), 2);
    // The released key is not open to other content.
    let other = send(
        f.post("/flaky", "client-a", Some("k-flaky"))
            .json(&order_body(4)),
    )
    .await;
    other.problem(422, "fingerprint-mismatch");
}

/// A permanent error is stored and replayed like a success.
#[tokio::test]
async fn permanent_error_is_stored_and_replayed() {
    let f = Fixture::new().await;
    let post = || {
        send(
            f.post("/rejects", "client-a", Some("k-422"))
                .json(&order_body(3)),
        )
    };
    let first = post().await;
    assert_eq!(first.status, 422);
    let second = post().await;
    assert_eq!(second.status, 422);
    assert!(second.replayed());
    assert_eq!(second.body, first.body);
    assert_eq!(f.runs.get(), 1);
}

/// The store fails on insert: 503 with `Retry-After`, and the handler does not run.
#[tokio::test]
async fn store_failure_fails_closed() {
    let store = FaultyStore::memory();
    store.fail(Call::Begin);
    let f = Fixture::with_store(store.clone()).await;
    for _ in 0..2 {
        let answer = f.order("k-down", order_body(1)).await;
        let problem = answer.problem(503, "store-unavailable");
        assert_eq!(answer.header("retry-after"), Some("2"));
        assert_eq!(problem["new_key_safe"], false);
        assert!(
            !problem["detail"].as_str().unwrap().contains("injected"),
            "no internals leak"
        );
    }
    assert_eq!(f.runs.get(), 0);
    // Back up: the same key runs.
    store.heal(Call::Begin);
    assert_eq!(f.order("k-down", order_body(1)).await.status, 201);
    assert_eq!(f.runs.get(), 1);
}

/// The budget's count of the client fails (the store is down for it): 503 with
/// `Retry-After`, nothing registered and the handler not run; once the count works again,
/// the same key runs once.
#[tokio::test]
async fn a_failing_budget_count_fails_closed() {
    let store = FaultyStore::memory();
    store.fail(Call::ClientUsage);
    let f = Fixture::with_store(store.clone()).await;
    let answer = f.order("k-count", order_body(1)).await;
    answer.problem(503, "store-unavailable");
    assert!(answer.header("retry-after").is_some());
    assert_eq!(
        (store.calls(Call::Begin), f.runs.get()),
        (0, 0),
        "nothing registered"
    );
    store.heal(Call::ClientUsage);
    assert_eq!(f.order("k-count", order_body(1)).await.status, 201);
    assert_eq!(f.runs.get(), 1);
}

/// `IdemBuilder::unavailable_retry_after` sets the `Retry-After` of that 503.
#[tokio::test]
async fn unavailable_retry_after_is_configurable() {
    let store = FaultyStore::memory();
    store.fail(Call::Begin);
    let idem = Idem::builder(store, identity::header("x-client-id"))
        .unavailable_retry_after(Duration::from_millis(4500))
        .build();
    let f = Fixture::with_idem(idem).await;
    let answer = f.order("k", order_body(1)).await;
    answer.problem(503, "store-unavailable");
    assert_eq!(answer.header("retry-after"), Some("5"));
}

/// The answers idem gives before anything is registered: no layer, no client identity, a
/// body that is not the JSON the fingerprint needs, an inner extractor's rejection (which
/// leaves no record, so the fixed request runs under the same key).
#[tokio::test]
async fn answers_before_the_handler() {
    // No layer: 500 with the fix in the detail.
    let bare = TestServer::start(routes(Counter::default())).await;
    let answer = send(
        client()
            .post(bare.url("/orders"))
            .header("x-client-id", "a")
            .header("idempotency-key", "k")
            .json(&order_body(1)),
    )
    .await;
    let problem = answer.problem(500, "not-configured");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains(".layer(idem.layer())")
    );

    let f = Fixture::new().await;
    let anonymous = send(
        f.server
            .http
            .post(f.server.url("/orders"))
            .header("idempotency-key", "k")
            .json(&order_body(1)),
    )
    .await;
    anonymous.problem(401, "client-identity-missing");
    anonymous.operation_id();

    let not_json = send(
        f.post("/orders", "client-a", Some("k-bad"))
            .header("content-type", "application/json")
            .body("{\"amount\": 1,"),
    )
    .await;
    not_json.problem(400, "body-malformed");
    let duplicate = send(
        f.post("/orders", "client-a", Some("k-bad"))
            .header("content-type", "application/json")
            .body(r#"{"amount": 1, "amount": 2, "customer_id": "c"}"#),
    )
    .await;
    duplicate.problem(400, "body-malformed");
    assert_eq!(f.runs.get(), 0);

    // Valid JSON that `Json<CreateOrder>` rejects (a missing member): axum's 422 is
    // answered as it is, and nothing is registered, since nothing ran.
    let rejected = send(
        f.post("/orders", "client-a", Some("k-rejected"))
            .json(&json!({ "amount": 1 })),
    )
    .await;
    assert_eq!(rejected.status, 422);
    rejected.operation_id();
    assert!(!rejected.replayed());
    let key = RecordKey::new("create_order", "client-a", "k-rejected");
    assert!(
        f.idem
            .store()
            .get(&key, unix_now())
            .await
            .unwrap()
            .is_none(),
        "nothing registered"
    );
    // The same key with the request fixed runs.
    let fixed = f.order("k-rejected", order_body(1)).await;
    assert_eq!(fixed.status, 201);
    assert_eq!(f.runs.get(), 1);
}

/// A result larger than the stored-body limit reaches the client whole, and its
/// outcome is recorded: the retry gets the same status, replayed, with a problem body
/// that gives the original body's length and SHA-256. Nothing is parked or run again.
#[tokio::test]
async fn oversized_results_are_sent_and_recorded_without_their_body() {
    let idem = Idem::builder(MemoryStore::new(), identity::header("x-client-id"))
        .max_stored_body(16)
        .build();
    let f = Fixture::with_idem(idem).await;
    let first = f.order("k-big", order_body(1)).await;
    assert_eq!(first.status, 201);
    assert!(first.body.len() > 16);
    assert_eq!(first.json()["order"], 1);
    let key = RecordKey::new("create_order", "client-a", "k-big");
    let record = f.idem.store().get(&key, unix_now()).await.unwrap().unwrap();
    assert!(
        matches!(record.state, RecordState::Completed { .. }),
        "{:?}",
        record.state
    );
    let retry = f.order("k-big", order_body(1)).await;
    let problem = retry.body_not_kept(201, &first.body);
    assert!(
        problem["detail"].as_str().unwrap().contains("16 bytes"),
        "{problem}"
    );
    assert_eq!(retry.operation_id(), first.operation_id());
    assert_eq!(f.runs.get(), 1);
}

/// The status lookup: 404 for an unknown key, the stored result for a completed one,
/// and nothing of another client's.
#[tokio::test]
async fn status_lookup_reports_the_clients_own_operations() {
    let f = Fixture::new().await;
    let lookup = |client_id: &'static str, key: &'static str| {
        send(
            f.server
                .http
                .get(f.server.url(&format!("/orders/operations/{key}")))
                .header("x-client-id", client_id),
        )
    };
    lookup("client-a", "k-look")
        .await
        .problem(404, "operation-not-found");
    let created = f.order("k-look", order_body(42)).await;
    let report = lookup("client-a", "k-look").await;
    assert_eq!(report.status, 200);
    assert_eq!(report.operation_id(), created.operation_id());
    let json = report.json();
    assert_eq!(json["operation"], "create_order");
    assert_eq!(json["operation_id"], created.operation_id());
    assert_eq!(json["key"], "k-look");
    assert_eq!(json["state"], "completed");
    assert_eq!(json["attempt"], 1);
    assert_eq!(json["response"]["status"], 201);
    assert_eq!(
        json["response"]["headers"]["content-type"],
        "application/json"
    );
    assert_eq!(json["response"]["body"], created.json());
    assert!(json["created_at"].as_str().unwrap().ends_with('Z'));
    lookup("client-b", "k-look")
        .await
        .problem(404, "operation-not-found");
}

/// A key in a body member: read from the JSON, checked like a header key, and the
/// namespace still per client and operation.
#[tokio::test]
async fn body_keys_are_read_from_the_json() {
    let f = Fixture::new().await;
    let pay = |body: Value| send(f.post("/payments", "client-a", None).json(&body));
    let first = pay(json!({ "client_reference": "ref-1", "amount": 5 })).await;
    assert_eq!(first.status, 201);
    let again = pay(json!({ "amount": 5, "client_reference": "ref-1" })).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    pay(json!({ "client_reference": "ref-1", "amount": 6 }))
        .await
        .problem(422, "fingerprint-mismatch");
    pay(json!({ "amount": 5 }))
        .await
        .problem(400, "key-missing");
    pay(json!({ "client_reference": 7, "amount": 5 }))
        .await
        .problem(400, "key-malformed");
    pay(json!({ "client_reference": "two words", "amount": 5 }))
        .await
        .problem(400, "key-malformed");
    assert_eq!(f.runs.get(), 1);
}
