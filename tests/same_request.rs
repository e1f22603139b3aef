//! What counts as the same request (docs/contract.md, `key_scope` and `fingerprint`), over
//! real sockets: the key as the client meant it (bare or an RFC 8941 string), the
//! request's path parameters, form bodies, and the client identity's rules.

mod common;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use common::answer::{Answer, send};
use common::counter::Counter;
use common::server::{CLIENT, TestServer};
use idem::{Idem, MemoryStore, identity};
use reqwest::Method;
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
struct CreateOrder {
    amount: i64,
}

#[idem::contract(
    key_scope = client,
    fingerprint = [amount],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status(path = "/orders/operations/{key}"),
    recovery = manual("https://runbooks.example.com/orders"),
)]
async fn create_order(
    State(runs): State<Counter>,
    Json(order): Json<CreateOrder>,
) -> impl IntoResponse {
    let run = runs.bump();
    (
        StatusCode::CREATED,
        Json(json!({ "run": run, "amount": order.amount })),
    )
}

async fn order_status(
    lookup: idem::Lookup<create_order::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

#[derive(Deserialize)]
struct AddSource {
    token: String,
}

#[idem::contract(
    key_scope = client,
    fingerprint = [token],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = manual("https://runbooks.example.com/sources"),
)]
async fn add_source(
    State(runs): State<Counter>,
    Path(customer): Path<String>,
    Json(source): Json<AddSource>,
) -> impl IntoResponse {
    runs.bump();
    (
        StatusCode::CREATED,
        Json(json!({ "customer": customer, "token": source.token })),
    )
}

#[derive(Deserialize)]
struct CreateCharge {
    amount: i64,
    currency: String,
    #[serde(default)]
    #[allow(dead_code)]
    note: String,
}

/// A Stripe-style form body, with the key in a header.
#[idem::contract(
    key_scope = client,
    fingerprint = [amount, currency],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = manual("https://runbooks.example.com/charges"),
)]
async fn create_charge(
    State(runs): State<Counter>,
    axum::Form(charge): axum::Form<CreateCharge>,
) -> impl IntoResponse {
    let run = runs.bump();
    (
        StatusCode::CREATED,
        Json(json!({ "run": run, "amount": charge.amount, "currency": charge.currency })),
    )
}

/// Repeated `tag` members are ignored by serde here, but they are significant content.
#[derive(Deserialize)]
struct Tagged {
    #[allow(dead_code)]
    reference: String,
}

/// A form body whose key is a form field, and whose whole body is significant.
#[idem::contract(
    key_scope = client(body = reference),
    fingerprint = body,
    ttl = "1h",
    deadline = "10s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = manual("https://runbooks.example.com/tags"),
)]
async fn tag(
    State(runs): State<Counter>,
    axum::Form(_tagged): axum::Form<Tagged>,
) -> impl IntoResponse {
    let run = runs.bump();
    (StatusCode::CREATED, Json(json!({ "run": run })))
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct ListOptions {
    expand: Option<String>,
    #[serde(rename = "pageSize")]
    page_size: Option<u32>,
}

/// A command whose `expand` query parameter is significant (and `trace`, not named, is
/// not).
#[idem::contract(
    key_scope = client,
    fingerprint = ([amount], query = [expand]),
    ttl = "1h",
    deadline = "10s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = manual("https://runbooks.example.com/exports"),
)]
async fn export(
    State(runs): State<Counter>,
    axum::extract::Query(_options): axum::extract::Query<ListOptions>,
    Json(order): Json<CreateOrder>,
) -> impl IntoResponse {
    let run = runs.bump();
    (
        StatusCode::CREATED,
        Json(json!({ "run": run, "amount": order.amount })),
    )
}

/// A renewal whose coupon and billing details are optional: serde reads a member that
/// is absent and one that is `null` into the same `None`.
#[derive(Deserialize)]
#[allow(dead_code)]
struct Renew {
    plan: String,
    coupon: Option<String>,
    billing: Option<Billing>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct Billing {
    country: String,
    vat_id: Option<String>,
}

#[idem::contract(
    key_scope = client,
    fingerprint = [plan, coupon, billing],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = manual("https://runbooks.example.com/renewals"),
)]
async fn renew(State(runs): State<Counter>, Json(_renew): Json<Renew>) -> impl IntoResponse {
    let run = runs.bump();
    (StatusCode::CREATED, Json(json!({ "run": run })))
}

/// The same, with the whole body significant.
#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1h",
    deadline = "10s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = manual("https://runbooks.example.com/renewals"),
)]
async fn renew_whole(State(runs): State<Counter>, Json(_renew): Json<Renew>) -> impl IntoResponse {
    let run = runs.bump();
    (StatusCode::CREATED, Json(json!({ "run": run })))
}

async fn server() -> (TestServer, Counter) {
    serve(Idem::new(
        MemoryStore::new(),
        identity::header("x-client-id"),
    ))
    .await
}

async fn serve(idem: Idem) -> (TestServer, Counter) {
    let runs = Counter::default();
    let router = Router::new()
        .route("/orders", post(create_order))
        .route("/orders/operations/{key}", get(order_status))
        .route("/customers/{customer}/sources", post(add_source))
        .route("/charges", post(create_charge))
        .route("/tags", post(tag))
        .route("/exports", post(export))
        .route("/renewals", post(renew))
        .route("/renewals/whole", post(renew_whole))
        .with_state(runs.clone())
        .layer(idem.layer());
    (TestServer::start(router).await, runs)
}

async fn post_with_key(server: &TestServer, key: &str) -> Answer {
    send(server.post("/orders", key).json(&json!({ "amount": 100 }))).await
}

/// `abc` and `"abc"` (the IETF draft's RFC 8941 sf-string) name one key, in either
/// order, escapes included; the status lookup finds it under either spelling.
#[tokio::test]
async fn a_quoted_key_is_the_same_key_as_the_bare_one() {
    let (server, runs) = server().await;
    let first = post_with_key(&server, "abc").await;
    assert_eq!(first.status, 201);
    let quoted = post_with_key(&server, "\"abc\"").await;
    assert_eq!(quoted.status, 201);
    assert!(quoted.replayed(), "the quoted key is the bare one");
    assert_eq!(quoted.body, first.body);

    let quoted_first = post_with_key(&server, "\"8e03978e-40d5-43e8-bc93-6894a57f9324\"").await;
    assert!(!quoted_first.replayed());
    let bare_then = post_with_key(&server, "8e03978e-40d5-43e8-bc93-6894a57f9324").await;
    assert!(bare_then.replayed());

    let escaped = post_with_key(&server, r#""a\"b\\c""#).await;
    assert!(!escaped.replayed());
    assert!(
        post_with_key(&server, r#"a"b\c"#).await.replayed(),
        "escapes are read"
    );
    assert_eq!(runs.get(), 3, "three keys, three runs");

    for path in ["/orders/operations/abc", "/orders/operations/%22abc%22"] {
        let report = send(server.get(path)).await;
        assert_eq!(report.status, 200, "{path}");
        assert_eq!(report.json()["key"], "abc");
    }
}

/// A value that starts with `"` must be one valid sf-string without parameters: each
/// broken form is 400 `key-malformed` with a detail that says what is wrong, and nothing
/// runs.
#[tokio::test]
async fn a_malformed_quoted_key_is_refused_with_what_is_wrong() {
    let (server, runs) = server().await;
    for (value, says) in [
        ("\"abc", "unterminated"),
        (r#""a\bc""#, "escape"),
        ("\"abc\";v=1", "parameters"),
        ("\"abc\"junk", "trailing"),
        ("\"a b\"", "not visible ASCII"),
        ("\"\"", "empty"),
        ("\"abc\",\"def\"", "trailing"),
    ] {
        let answer = post_with_key(&server, value).await;
        let problem = answer.problem(400, "key-malformed");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(says), "{value}: {detail}");
    }
    assert_eq!(runs.get(), 0);
}

/// The client identity is visible ASCII, as its docs say: a space or a tab inside it is
/// refused with 401 (around it, they are not part of the value).
#[tokio::test]
async fn an_identity_with_a_space_or_a_tab_is_refused() {
    let (server, runs) = server().await;
    for identity in ["acme corp", "acme\tcorp"] {
        let answer = send(
            server
                .request(Method::POST, "/orders", identity, Some("k-identity"))
                .json(&json!({ "amount": 100 })),
        )
        .await;
        let problem = answer.problem(401, "client-identity-missing");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("space or a tab"),
            "{problem}"
        );
    }
    assert_eq!(runs.get(), 0);
}

/// The path parameters are significant content: on `POST /customers/{customer}/sources`
/// the same key and body sent for `cus_2` after `cus_1` is another request (422), never
/// `cus_1`'s result; for the same customer it is the replay. Percent-encoding does not
/// make another value.
#[tokio::test]
async fn the_same_key_and_body_on_another_resource_is_refused() {
    let (server, runs) = server().await;
    let add = |customer: &str| {
        send(
            server
                .post(&format!("/customers/{customer}/sources"), "k-source")
                .json(&json!({ "token": "tok_visa" })),
        )
    };
    let first = add("cus_1").await;
    assert_eq!(first.status, 201);
    assert_eq!(first.json()["customer"], "cus_1");
    let other = add("cus_2").await;
    let problem = other.problem(422, "fingerprint-mismatch");
    assert_eq!(problem["operation_id"], first.operation_id());
    let again = add("cus_1").await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    let encoded = add("cus%5F1").await;
    assert!(encoded.replayed(), "`%5F` is `_`: the same customer");
    assert_eq!(runs.get(), 1);
}

async fn post_form(
    server: &TestServer,
    path: &str,
    key: Option<&str>,
    body: &'static [u8],
) -> Answer {
    let request = server
        .request(Method::POST, path, CLIENT, key)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body);
    send(request).await
}

/// A form body gets the same enforcement as JSON: its fields are the fingerprint's
/// fields, member order does not matter, another value is 422, a field outside the
/// fingerprint may differ, and a body that is not UTF-8 once decoded is 400.
#[tokio::test]
async fn a_form_body_is_fingerprinted_by_its_fields() {
    let (server, runs) = server().await;
    let first = post_form(
        &server,
        "/charges",
        Some("k-charge"),
        b"amount=100&currency=EUR",
    )
    .await;
    assert_eq!(first.status, 201, "{first:?}");
    let reordered = post_form(
        &server,
        "/charges",
        Some("k-charge"),
        b"currency=EUR&note=again&amount=100",
    )
    .await;
    assert!(
        reordered.replayed(),
        "member order and other fields do not matter"
    );
    post_form(
        &server,
        "/charges",
        Some("k-charge"),
        b"amount=999&currency=EUR",
    )
    .await
    .problem(422, "fingerprint-mismatch");
    post_form(
        &server,
        "/charges",
        Some("k-bad"),
        b"amount=100&currency=%FF",
    )
    .await
    .problem(400, "body-malformed");
    assert_eq!(runs.get(), 1);
}

/// With the key in a form field and the whole body significant: repeated names keep
/// their order (`tag=a&tag=b` is not `tag=b&tag=a`), other members may come in any order,
/// and a key sent twice is refused.
#[tokio::test]
async fn a_form_body_key_and_repeated_names() {
    let (server, runs) = server().await;
    let first = post_form(&server, "/tags", None, b"reference=r-1&tag=a&tag=b").await;
    assert_eq!(first.status, 201, "{first:?}");
    assert!(
        post_form(&server, "/tags", None, b"tag=a&reference=r-1&tag=b")
            .await
            .replayed()
    );
    post_form(&server, "/tags", None, b"reference=r-1&tag=b&tag=a")
        .await
        .problem(422, "fingerprint-mismatch");
    post_form(&server, "/tags", None, b"tag=a")
        .await
        .problem(400, "key-missing");
    let twice = post_form(&server, "/tags", None, b"reference=r-2&reference=r-3").await;
    let problem = twice.problem(400, "key-malformed");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("more than once"),
        "{problem}"
    );
    assert_eq!(runs.get(), 1);
}

/// Query parameters the contract names are significant (`expand`), in any order with
/// others; one it does not name (`trace`) may differ.
#[tokio::test]
async fn named_query_parameters_are_significant() {
    let (server, runs) = server().await;
    let export = |query: &str| {
        send(
            server
                .post(&format!("/exports{query}"), "k-export")
                .json(&json!({ "amount": 100 })),
        )
    };
    let first = export("?expand=customer&trace=1").await;
    assert_eq!(first.status, 201, "{first:?}");
    assert!(export("?trace=2&expand=customer").await.replayed());
    export("?expand=items")
        .await
        .problem(422, "fingerprint-mismatch");
    export("").await.problem(422, "fingerprint-mismatch");
    assert_eq!(runs.get(), 1);
}

async fn post_json(server: &TestServer, path: &str, key: &str, body: &str) -> Answer {
    send(
        server
            .post(path, key)
            .header("content-type", "application/json")
            .body(body.to_owned()),
    )
    .await
}

/// A member sent as `null` is the same content as one left out, at any depth, with listed
/// fields and with the whole body; `null` elements of an array and an empty object are
/// not.
#[tokio::test]
async fn a_null_member_is_the_same_request_as_an_absent_one() {
    let (server, runs) = server().await;
    for path in ["/renewals", "/renewals/whole"] {
        let key = format!("k-null{path}");
        let first = post_json(
            &server,
            path,
            &key,
            r#"{"plan":"pro","coupon":null,"billing":{"country":"FR","vat_id":null}}"#,
        )
        .await;
        assert_eq!(first.status, 201, "{path}");
        let same = [
            r#"{"plan":"pro","billing":{"country":"FR"}}"#,
            r#"{"billing":{"vat_id":null,"country":"FR"},"plan":"pro","coupon":null}"#,
        ];
        for body in same {
            let retry = post_json(&server, path, &key, body).await;
            assert_eq!(retry.status, 201, "{path} {body}: {:?}", retry.json());
            assert!(retry.replayed(), "{path} {body}");
            assert_eq!(retry.json(), first.json());
        }
        let other = [
            r#"{"plan":"pro","coupon":"WELCOME","billing":{"country":"FR"}}"#,
            r#"{"plan":"pro","billing":{"country":"FR","vat_id":"FR1"}}"#,
            r#"{"plan":"pro"}"#,
        ];
        for body in other {
            post_json(&server, path, &key, body)
                .await
                .problem(422, "fingerprint-mismatch");
        }
    }
    assert_eq!(runs.get(), 2, "one run per key");
}

/// A record written by a release that hashed `null` members (its fingerprint is the
/// SHA-256 of `{"coupon":null,"plan":"pro"}`) in a durable store: a retry of the same
/// bytes is still that request: a completed record is replayed, a released one is run
/// again under its operation id. A retry that leaves the `null` out did not match such a
/// record before, and does not now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_of_the_earlier_rule_matches_a_retry_of_the_same_bytes() {
    use idem::store::{Lease, NewRecord, OwnerToken, RecordKey, RecordStore, StoredResponse};
    const EARLIER: &str = "sha256:a01efea5c60597457e1db1ca8512a2dae48aadaf5f2141e1c7b8c5b21b5bb298";
    let body = r#"{"plan":"pro","coupon":null}"#;
    let dir = tempfile::tempdir().unwrap();
    let store = idem::SqliteStore::open(dir.path().join("records.db"))
        .await
        .unwrap();
    let now = idem::store::unix_now();
    let new = |id: idem::OperationId| NewRecord {
        operation_id: id,
        fingerprint: EARLIER.to_owned(),
        lease: Lease {
            token: OwnerToken::random(),
            until: now + 60_000,
        },
        expires_at: now + 3_600_000,
        transactional: false,
        holds_until: now + 10_000,
        budget: None,
    };
    let done = RecordKey::new("renew", common::server::CLIENT, "k-earlier-done");
    let record = new(idem::OperationId::new());
    store.begin(&done, &record, now).await.unwrap();
    let stored = StoredResponse {
        status: 201,
        headers: vec![],
        body: "written by the earlier release".into(),
    };
    store
        .complete(&done, record.lease.token, &stored, now)
        .await
        .unwrap();
    let released = RecordKey::new("renew", common::server::CLIENT, "k-earlier-released");
    let released_id = idem::OperationId::new();
    let record = new(released_id);
    store.begin(&released, &record, now).await.unwrap();
    store
        .release(&released, record.lease.token, now)
        .await
        .unwrap();

    let (server, runs) = serve(Idem::new(store, identity::header("x-client-id"))).await;
    let replay = post_json(&server, "/renewals", "k-earlier-done", body).await;
    assert_eq!(replay.status, 201);
    assert!(replay.replayed());
    assert_eq!(replay.body, b"written by the earlier release");
    post_json(&server, "/renewals", "k-earlier-done", r#"{"plan":"pro"}"#)
        .await
        .problem(422, "fingerprint-mismatch");

    let run = post_json(&server, "/renewals", "k-earlier-released", body).await;
    assert_eq!(run.status, 201, "{:?}", run.json());
    assert!(!run.replayed());
    assert_eq!(
        run.operation_id(),
        released_id.to_string(),
        "the same operation"
    );
    let again = post_json(&server, "/renewals", "k-earlier-released", body).await;
    assert!(again.replayed());
    assert_eq!(runs.get(), 1);
}
