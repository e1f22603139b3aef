//! Hostile input against a running server: malformed keys (raw bytes on the socket),
//! malformed and oversized bodies, body keys of the wrong type, and status lookups with
//! hostile keys. Every refusal happens before any store call, and nothing runs.

mod common;

use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use common::answer::{Answer, send};
use common::counter::Counter;
use common::faults::FaultyStore;
use common::orders::{create_order, echo, order_status, pay};
use common::raw;
use common::server::{CLIENT, TestServer};
use idem::{Idem, identity};
use reqwest::Method;
use serde::Deserialize;
use serde_json::{Value, json};

#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1s",
    deadline = "1s",
    max_attempts = 2,
    retryable = [503],
    concurrency = conflict(retry_after = "250ms"),
    status_lookup = short_status,
    recovery = manual("https://runbooks.example.com/short"),
)]
async fn short_ttl(State(runs): State<Counter>) -> impl IntoResponse {
    (StatusCode::CREATED, Json(json!({ "run": runs.bump() })))
}

/// A body type in the common camelCase wire style.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
struct CamelOrder {
    customer_id: String,
    amount_minor: i64,
}

#[idem::contract(
    key_scope = client,
    fingerprint = [customer_id, amount_minor],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 3,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = manual("https://runbooks.example.com/camel"),
)]
async fn camel(State(runs): State<Counter>, Json(order): Json<CamelOrder>) -> impl IntoResponse {
    (
        StatusCode::CREATED,
        Json(json!({ "run": runs.bump(), "amountMinor": order.amount_minor })),
    )
}

/// A body type whose member is renamed to a name no `rename_all` rule makes.
#[derive(Deserialize)]
#[allow(dead_code)]
struct RenamedOrder {
    customer_id: String,
    #[serde(rename = "amt")]
    amount_minor: i64,
}

#[idem::contract(
    key_scope = client,
    fingerprint = [customer_id, amount_minor],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 3,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = manual("https://runbooks.example.com/renamed"),
)]
async fn renamed(
    State(runs): State<Counter>,
    Json(order): Json<RenamedOrder>,
) -> impl IntoResponse {
    (
        StatusCode::CREATED,
        Json(json!({ "run": runs.bump(), "amt": order.amount_minor })),
    )
}

async fn short_status(
    lookup: idem::Lookup<short_ttl::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

struct Fixture {
    server: TestServer,
    runs: Counter,
    store: FaultyStore,
}

impl Fixture {
    async fn new() -> Fixture {
        Fixture::with_body_limit(None).await
    }

    async fn with_body_limit(limit: Option<usize>) -> Fixture {
        let store = FaultyStore::memory();
        let idem = Idem::new(store.clone(), identity::header("x-client-id"));
        let runs = Counter::default();
        let mut router = Router::new()
            .route("/orders", post(create_order))
            .route("/echo", post(echo))
            .route("/payments", post(pay))
            .route("/short", post(short_ttl))
            .route("/camel", post(camel))
            .route("/renamed", post(renamed))
            .route("/orders/operations/{key}", get(order_status))
            .route("/short/operations/{key}", get(short_status))
            .with_state(runs.clone());
        if let Some(limit) = limit {
            router = router.layer(DefaultBodyLimit::max(limit));
        }
        let server = TestServer::start(router.layer(idem.layer())).await;
        Fixture {
            server,
            runs,
            store,
        }
    }

    /// A raw POST with the client header, a JSON content type, and `extra` header lines.
    async fn raw_post(&self, path: &str, extra: &[&[u8]], body: &[u8]) -> raw::RawAnswer {
        let mut headers: Vec<&[u8]> =
            vec![b"X-Client-Id: client-a", b"Content-Type: application/json"];
        headers.extend_from_slice(extra);
        raw::send(self.server.addr, &raw::post(path, &headers, body)).await
    }

    fn post(&self, path: &str, key: Option<&str>) -> reqwest::RequestBuilder {
        self.server.request(Method::POST, path, CLIENT, key)
    }

    async fn lookup(&self, path: &str) -> Answer {
        send(self.server.get(path)).await
    }

    /// Nothing reached the store and nothing ran.
    fn assert_untouched(&self, what: &str) {
        assert_eq!(self.store.total(), 0, "{what}: no store call");
        assert_eq!(self.runs.get(), 0, "{what}: the handler did not run");
    }
}

const ORDER: &[u8] = br#"{"customer_id":"c-1","amount":100}"#;

fn assert_problem(answer: &raw::RawAnswer, status: u16, slug: &str, what: &str) {
    assert_eq!(
        answer.status,
        status,
        "{what}: {}\n{}",
        answer.head,
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(
        answer.header("content-type").as_deref(),
        Some("application/problem+json"),
        "{what}"
    );
    assert_eq!(
        answer.problem_type(),
        format!("tag:idem.rs,2026:problem:{slug}"),
        "{what}"
    );
    assert!(
        answer.header("operation-id").is_some(),
        "{what}: Operation-Id"
    );
}

/// Keys that break the rules, written byte for byte on the socket: every one is a 400
/// `key-malformed` with an `Operation-Id`, before any store call.
#[tokio::test]
async fn malformed_header_keys_are_refused_before_the_store() {
    let f = Fixture::new().await;
    let long = format!("Idempotency-Key: {}", "k".repeat(256));
    let cases: [(&str, &[u8]); 6] = [
        ("an empty value", b"Idempotency-Key:"),
        ("only whitespace", b"Idempotency-Key:    \t "),
        ("256 characters", long.as_bytes()),
        ("bytes that are not UTF-8", b"Idempotency-Key: k\xff\xfe"),
        (
            "UTF-8 that is not ASCII",
            "Idempotency-Key: k\u{e9}".as_bytes(),
        ),
        ("an inner space", b"Idempotency-Key: two words"),
    ];
    for (what, line) in cases {
        let answer = f.raw_post("/orders", &[line], ORDER).await;
        assert_problem(&answer, 400, "key-malformed", what);
    }
    // The header twice, even with the same value.
    for (what, lines) in [
        (
            "the header twice",
            [&b"Idempotency-Key: a"[..], b"Idempotency-Key: b"],
        ),
        (
            "the same key twice",
            [&b"Idempotency-Key: a"[..], b"idempotency-key: a"],
        ),
    ] {
        let answer = f.raw_post("/orders", &lines, ORDER).await;
        assert_problem(&answer, 400, "key-malformed", what);
    }
    f.assert_untouched("malformed keys");
}

/// Optional whitespace around a header value is not part of it (RFC 9110 §5.5): the key
/// ` k-ows ` is the key `k-ows`, one record.
#[tokio::test]
async fn whitespace_around_the_key_is_not_part_of_it() {
    let f = Fixture::new().await;
    let first = f
        .raw_post("/orders", &[b"Idempotency-Key: \t k-ows \t"], ORDER)
        .await;
    assert_eq!(first.status, 201, "{}", first.head);
    let second = f
        .raw_post("/orders", &[b"Idempotency-Key:k-ows"], ORDER)
        .await;
    assert_eq!(second.status, 201);
    assert_eq!(
        second.header("idempotent-replayed").as_deref(),
        Some("true")
    );
    assert_eq!(second.body, first.body);
    assert_eq!(f.runs.get(), 1);
}

/// What the HTTP parser itself refuses (obs-fold, a control character in the key, a
/// header line without a colon) never reaches idem: a 400 from the server, no store call,
/// no run, and the server goes on serving.
#[tokio::test]
async fn requests_the_http_parser_refuses_never_reach_the_store() {
    let f = Fixture::new().await;
    let cases: [(&str, &[&[u8]]); 3] = [
        ("obs-fold", &[b"Idempotency-Key: a", b" b"]),
        ("a control character", &[b"Idempotency-Key: a\x01b"]),
        ("no colon", &[b"Idempotency-Key a"]),
    ];
    for (what, lines) in cases {
        let answer = f.raw_post("/orders", lines, ORDER).await;
        assert!(
            answer.status == 400 || answer.status == 0,
            "{what}: {}",
            answer.head
        );
    }
    f.assert_untouched("unparsable requests");
    let ok = f
        .raw_post("/orders", &[b"Idempotency-Key: after"], ORDER)
        .await;
    assert_eq!(ok.status, 201, "the server still serves");
}

/// Bodies that are not the I-JSON the fingerprint needs: 400 `body-malformed` before any
/// store call, whatever the spelling of the trouble, and no stack overflow for 10 000
/// levels of nesting.
#[tokio::test]
async fn malformed_bodies_are_refused_before_the_store() {
    let f = Fixture::new().await;
    let deep = format!(
        r#"{{"customer_id":"c","amount":1,"x":{}{}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "duplicate members",
            br#"{"customer_id":"c","amount":1,"amount":2}"#.to_vec(),
        ),
        (
            "duplicate members, nested",
            br#"{"customer_id":"c","amount":1,"x":{"y":1,"y":1}}"#.to_vec(),
        ),
        (
            "a number beyond a double",
            br#"{"customer_id":"c","amount":1e400}"#.to_vec(),
        ),
        (
            "a lone surrogate",
            br#"{"customer_id":"\ud800","amount":1}"#.to_vec(),
        ),
        ("a byte order mark", [&b"\xef\xbb\xbf"[..], ORDER].concat()),
        ("trailing garbage", [ORDER, b" x"].concat()),
        ("two documents", [ORDER, ORDER].concat()),
        (
            "bytes that are not UTF-8 in a string",
            b"{\"customer_id\":\"c\xff\",\"amount\":1}".to_vec(),
        ),
        ("NaN", br#"{"customer_id":"c","amount":NaN}"#.to_vec()),
        ("an empty body", Vec::new()),
        ("not an object", b"[1,2]".to_vec()),
        ("10 000 levels of nesting", deep.into_bytes()),
    ];
    for (what, body) in cases {
        let answer = f
            .raw_post("/orders", &[b"Idempotency-Key: k-body"], &body)
            .await;
        assert_problem(&answer, 400, "body-malformed", what);
    }
    f.assert_untouched("malformed bodies");
}

/// Past axum's `DefaultBodyLimit` the answer is 413 `body-too-large` with an `Operation-Id`, with a
/// `Content-Length` or chunked, and nothing reaches the store.
#[tokio::test]
async fn bodies_past_the_limit_are_refused_before_the_store() {
    let f = Fixture::with_body_limit(Some(64 * 1024)).await;
    let mut big = br#"{"customer_id":"c","amount":1,"pad":""#.to_vec();
    big.extend(std::iter::repeat_n(b'x', 64 * 1024));
    big.extend_from_slice(b"\"}");
    let answer = send(
        f.post("/orders", Some("k-big"))
            .header("content-type", "application/json")
            .body(big.clone()),
    )
    .await;
    assert_eq!(answer.status, 413);
    answer.operation_id();
    assert_eq!(
        answer.json()["type"],
        "tag:idem.rs,2026:problem:body-too-large"
    );

    // Chunked, so the size is known only while reading.
    let mut request = b"POST /orders HTTP/1.1\r\nHost: idem.test\r\nX-Client-Id: client-a\r\n\
        Idempotency-Key: k-big\r\nContent-Type: application/json\r\n\
        Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        .to_vec();
    for chunk in big.chunks(4096) {
        request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        request.extend_from_slice(chunk);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    let chunked = raw::send(f.server.addr, &request).await;
    assert_eq!(chunked.status, 413, "{}", chunked.head);
    assert!(chunked.header("operation-id").is_some());
    f.assert_untouched("oversized bodies");
}

/// The default limit (2 MB) applies too: a 3 MB body is a 413 without a store call.
#[tokio::test]
async fn the_default_body_limit_applies() {
    let f = Fixture::new().await;
    let answer = send(
        f.post("/echo", Some("k-3mb"))
            .header("content-type", "application/json")
            .body(vec![b' '; 3 * 1024 * 1024]),
    )
    .await;
    assert_eq!(answer.status, 413);
    answer.operation_id();
    f.assert_untouched("a 3 MB body");
}

/// A `Content-Length` that promises more than the client sends: the body cannot be read,
/// the answer is 400, and nothing is registered.
#[tokio::test]
async fn a_body_shorter_than_its_length_registers_nothing() {
    let f = Fixture::new().await;
    let mut request = b"POST /orders HTTP/1.1\r\nHost: idem.test\r\nX-Client-Id: client-a\r\n\
        Idempotency-Key: k-short\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        .to_vec();
    request.extend_from_slice(ORDER);
    let mut stream = tokio::net::TcpStream::connect(f.server.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stream, &request)
        .await
        .unwrap();
    // Half-close: the body ends here.
    tokio::io::AsyncWriteExt::shutdown(&mut stream)
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut answer),
    )
    .await
    .expect("an answer within 5 s");
    let text = String::from_utf8_lossy(&answer);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 400"),
        "{text}"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    f.assert_untouched("a truncated body");
}

/// A body trickled in a byte every 100 ms, on a contract whose attempt has 1 s: 408
/// `request-timeout` once that second is up, the connection closed, and nothing reached
/// the store. Without the bound the connection stayed open for as long as the sender
/// liked.
#[tokio::test]
async fn a_body_that_trickles_in_gets_408_within_the_attempts_time() {
    let f = Fixture::new().await;
    let head = b"POST /short HTTP/1.1\r\nHost: idem.test\r\nX-Client-Id: client-a\r\n\
        Idempotency-Key: k-slow\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n";
    let stream = tokio::net::TcpStream::connect(f.server.addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let started = std::time::Instant::now();
    tokio::io::AsyncWriteExt::write_all(&mut writer, head)
        .await
        .unwrap();
    let trickle = tokio::spawn(async move {
        for _ in 0..100 {
            if tokio::io::AsyncWriteExt::write_all(&mut writer, b" ")
                .await
                .is_err()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut answer = Vec::new();
    tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read_to_end(&mut reader, &mut answer),
    )
    .await
    .expect("answered and closed within 5 s, not after the 10 s the trickle takes")
    .expect("read the answer");
    let elapsed = started.elapsed();
    trickle.abort();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(
        text.contains("tag:idem.rs,2026:problem:request-timeout"),
        "{text}"
    );
    assert!(
        elapsed >= Duration::from_millis(900),
        "not before the attempt's time: {elapsed:?}"
    );
    f.assert_untouched("a body that trickles in");
}

/// A key in the body that is not a non-empty string of visible ASCII: 400 before any
/// store call (`key-missing` for absent and `null`, `key-malformed` otherwise).
#[tokio::test]
async fn body_keys_of_the_wrong_type_are_refused_before_the_store() {
    let f = Fixture::new().await;
    let cases: [(&str, Value, &str); 9] = [
        ("absent", json!({ "amount": 1 }), "key-missing"),
        (
            "null",
            json!({ "client_reference": null, "amount": 1 }),
            "key-missing",
        ),
        (
            "a number",
            json!({ "client_reference": 7, "amount": 1 }),
            "key-malformed",
        ),
        (
            "a boolean",
            json!({ "client_reference": true, "amount": 1 }),
            "key-malformed",
        ),
        (
            "an object",
            json!({ "client_reference": { "id": "k" }, "amount": 1 }),
            "key-malformed",
        ),
        (
            "an array",
            json!({ "client_reference": ["k"], "amount": 1 }),
            "key-malformed",
        ),
        (
            "an empty string",
            json!({ "client_reference": "", "amount": 1 }),
            "key-malformed",
        ),
        (
            "256 characters",
            json!({ "client_reference": "r".repeat(256), "amount": 1 }),
            "key-malformed",
        ),
        (
            "unicode",
            json!({ "client_reference": "r\u{1f980}", "amount": 1 }),
            "key-malformed",
        ),
    ];
    for (what, body, slug) in cases {
        let answer = f
            .raw_post("/payments", &[], body.to_string().as_bytes())
            .await;
        assert_problem(&answer, 400, slug, what);
    }
    // A body that is not an object has no key member.
    let array = f.raw_post("/payments", &[], b"[\"ref\"]").await;
    assert_eq!(array.status, 400, "{}", array.head);
    f.assert_untouched("body keys of the wrong type");
}

/// A key sent in a header to a body-keyed operation is not the key: the body's member is.
#[tokio::test]
async fn a_header_key_does_not_replace_a_body_key() {
    let f = Fixture::new().await;
    let answer = f
        .raw_post(
            "/payments",
            &[b"Idempotency-Key: header-key"],
            br#"{"amount":1}"#,
        )
        .await;
    assert_problem(
        &answer,
        400,
        "key-missing",
        "a header key on a body-keyed route",
    );
    f.assert_untouched("a header key on a body-keyed route");
}

/// Hostile keys on the status lookup: decoded path traversal, NUL, unicode, a space, 256
/// characters, a key of 1 MB in the path. Valid keys get 404 of the client's own
/// namespace; invalid ones 400 `key-malformed`; nothing is found that is not the
/// client's, and the server survives.
#[tokio::test]
async fn status_lookup_with_hostile_keys() {
    let f = Fixture::new().await;
    let created = send(
        f.post("/orders", Some(".."))
            .json(&json!({ "customer_id": "c", "amount": 1 })),
    )
    .await;
    assert_eq!(created.status, 201);

    for (path, status, slug) in [
        (
            "/orders/operations/..%2F..%2Fetc%2Fpasswd",
            404,
            "operation-not-found",
        ),
        ("/orders/operations/%2e%2e%2f", 404, "operation-not-found"),
        ("/orders/operations/%00", 400, "key-malformed"),
        ("/orders/operations/%F0%9F%A6%80", 400, "key-malformed"),
        ("/orders/operations/a%20b", 400, "key-malformed"),
        ("/orders/operations/a%09b", 400, "key-malformed"),
    ] {
        let answer = f.lookup(path).await;
        let problem = answer.problem(status, slug);
        assert_eq!(
            answer.header("content-type"),
            Some("application/problem+json")
        );
        answer.operation_id();
        assert!(problem.get("operation_id").is_some(), "{path}");
    }
    let long = format!("/orders/operations/{}", "k".repeat(256));
    f.lookup(&long).await.problem(400, "key-malformed");

    // `..` is a key like any other: the client's own operation. (Sent raw: a URL
    // library would resolve the dot segment away.)
    let report = raw_get(&f, "/orders/operations/%2E%2E", "client-a").await;
    assert_eq!(report.status, 200, "{}", report.head);
    let json: Value = serde_json::from_slice(&report.body).unwrap();
    assert_eq!(json["key"], "..");
    assert_eq!(
        report.header("operation-id").as_deref(),
        Some(created.operation_id())
    );
    // Another client asking for it: not found, not forbidden (no hint that it exists).
    let other = raw_get(&f, "/orders/operations/..", "client-b").await;
    assert_eq!(other.status, 404, "{}", other.head);
    assert_eq!(
        other.problem_type(),
        "tag:idem.rs,2026:problem:operation-not-found"
    );

    // A 1 MB key in the path: refused by the HTTP server (414 or 431), and the server
    // keeps serving.
    let huge = format!("/orders/operations/{}", "k".repeat(1024 * 1024));
    let answer = raw_get(&f, &huge, "client-a").await;
    assert!(
        answer.status == 0 || (400..500).contains(&answer.status),
        "{}",
        answer.head
    );
    let alive = f.lookup("/orders/operations/k-none").await;
    alive.problem(404, "operation-not-found");
    assert_eq!(f.runs.get(), 1);
}

async fn raw_get(f: &Fixture, path: &str, client_id: &str) -> raw::RawAnswer {
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: idem.test\r\nX-Client-Id: {client_id}\r\nConnection: close\r\n\r\n"
    );
    raw::send(f.server.addr, request.as_bytes()).await
}

/// A path segment that is not UTF-8 once decoded is refused by the application's own
/// `Path<String>` extractor (axum's 400), before `Lookup::status` sees it.
#[tokio::test]
async fn status_lookup_with_a_key_that_is_not_utf8() {
    let f = Fixture::new().await;
    let answer = f.lookup("/orders/operations/%FF%FE").await;
    assert_eq!(answer.status, 400);
    assert_eq!(f.store.total(), 0);
}

/// A key whose TTL has passed is not found by the status lookup, and is a new operation.
#[tokio::test]
async fn status_lookup_of_an_expired_key() {
    let f = Fixture::new().await;
    let first = send(f.post("/short", Some("k-expire"))).await;
    assert_eq!(first.status, 201);
    assert_eq!(f.lookup("/short/operations/k-expire").await.status, 200);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    f.lookup("/short/operations/k-expire")
        .await
        .problem(404, "operation-not-found");
    let again = send(f.post("/short", Some("k-expire"))).await;
    assert_eq!(again.status, 201);
    assert!(!again.replayed());
    assert_ne!(again.operation_id(), first.operation_id());
}

/// `Json<T>` refuses a body without `Content-Type: application/json` (415); the
/// handler never runs, and the answer carries the operation id.
#[tokio::test]
async fn json_without_its_content_type_does_not_run() {
    let f = Fixture::new().await;
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let mut request = f.post("/orders", Some("k-ct")).body(ORDER);
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        let answer = send(request).await;
        assert_eq!(answer.status, 415, "{content_type:?}");
        answer.operation_id();
    }
    assert_eq!(f.runs.get(), 0);
}

/// The extractor's refusal is a property of the request's form, not of the operation: a
/// client that forgot `Content-Type` and sends the same request again, fixed, with the
/// same key has it run, since nothing ran the first time.
#[tokio::test]
async fn a_request_fixed_after_an_extractor_rejection_runs() {
    let f = Fixture::new().await;
    let forgot = send(f.post("/orders", Some("k-forgot")).body(ORDER)).await;
    assert_eq!(forgot.status, 415);
    let fixed = send(
        f.post("/orders", Some("k-forgot"))
            .header("content-type", "application/json")
            .body(ORDER),
    )
    .await;
    assert_eq!(fixed.status, 201, "the fixed request runs");
    assert_eq!(f.runs.get(), 1);
}

/// `fingerprint = body` hashes a body that is not JSON as bytes; `Json<Value>` then
/// refuses it. Deep nesting, `1e400` and a BOM never crash the server, the handler never
/// runs, and each answer is stable on repeat.
#[tokio::test]
async fn whole_body_fingerprints_survive_hostile_json() {
    let f = Fixture::new().await;
    let deep = "[".repeat(10_000) + &"]".repeat(10_000);
    let bodies: [(&str, Vec<u8>); 4] = [
        ("deep", deep.into_bytes()),
        ("1e400", b"1e400".to_vec()),
        ("bom", b"\xef\xbb\xbf{}".to_vec()),
        ("surrogate", br#""\udc00""#.to_vec()),
    ];
    for (key, body) in bodies {
        let first = send(
            f.post("/echo", Some(key))
                .header("content-type", "application/json")
                .body(body.clone()),
        )
        .await;
        assert!(
            (400..500).contains(&first.status),
            "{key}: {}",
            first.status
        );
        first.operation_id();
        let again = send(
            f.post("/echo", Some(key))
                .header("content-type", "application/json")
                .body(body),
        )
        .await;
        assert_eq!(again.status, first.status, "{key}");
        assert_eq!(again.body, first.body, "{key}");
    }
    assert_eq!(f.runs.get(), 0);
}

/// Integers beyond 2^53 would be one double in RFC 8785's model; idem keeps integer
/// literals exact, so `9007199254740993` and `9007199254740992` are two amounts and the
/// second is refused with 422, as `Json<i64>` sees two different amounts.
#[tokio::test]
async fn integers_beyond_2_pow_53_are_told_apart() {
    let f = Fixture::new().await;
    let first = f
        .raw_post(
            "/orders",
            &[b"Idempotency-Key: k-2p53"],
            br#"{"customer_id":"c","amount":9007199254740993}"#,
        )
        .await;
    assert_eq!(first.status, 201);
    let second = f
        .raw_post(
            "/orders",
            &[b"Idempotency-Key: k-2p53"],
            br#"{"customer_id":"c","amount":9007199254740992}"#,
        )
        .await;
    assert_problem(&second, 422, "fingerprint-mismatch", "another amount");
}

/// `fingerprint = [customer_id, amount_minor]` on a body type with
/// `#[serde(rename_all = "camelCase")]`: the wire names are `customerId` and
/// `amountMinor`, and the fingerprint follows them, so the same key with another amount
/// is 422, not the first order's replay.
#[tokio::test]
async fn fingerprint_fields_follow_serde_renames() {
    let f = Fixture::new().await;
    let first = f
        .raw_post(
            "/camel",
            &[b"Idempotency-Key: k-camel"],
            br#"{"customerId":"c","amountMinor":100}"#,
        )
        .await;
    assert_eq!(first.status, 201);
    let other = f
        .raw_post(
            "/camel",
            &[b"Idempotency-Key: k-camel"],
            br#"{"customerId":"c","amountMinor":900}"#,
        )
        .await;
    assert_problem(&other, 422, "fingerprint-mismatch", "another amount");
    let same = f
        .raw_post(
            "/camel",
            &[b"Idempotency-Key: k-camel"],
            br#"{"amountMinor":100, "customerId":"c"}"#,
        )
        .await;
    assert_eq!(same.status, 201);
    assert_eq!(same.header("idempotent-replayed").as_deref(), Some("true"));
}

/// A fingerprint field that serde reads under a name no `rename_all` rule makes
/// (`#[serde(rename = "amt")]`) cannot be found in the body: the operation refuses to run
/// with 500 `not-configured` naming the field, rather than fingerprint nothing.
#[tokio::test]
async fn an_unfollowable_rename_is_a_configuration_error() {
    let f = Fixture::new().await;
    let answer = f
        .raw_post(
            "/renamed",
            &[b"Idempotency-Key: k-renamed"],
            br#"{"customer_id":"c","amt":100}"#,
        )
        .await;
    assert_problem(&answer, 500, "not-configured", "an unfollowable rename");
    let problem: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
    let detail = problem["detail"].as_str().unwrap_or_default().to_owned();
    assert!(detail.contains("`amount_minor`"), "{detail}");
    assert!(detail.contains("`customer_id`, `amt`"), "{detail}");
    assert_eq!(f.runs.get(), 0);
}

/// Two identical requests pipelined on one keep-alive connection: answered in order, the
/// first runs, the second is its replay.
#[tokio::test]
async fn pipelined_duplicates_on_one_connection() {
    let f = Fixture::new().await;
    let one = |close: bool| {
        let mut headers: Vec<&[u8]> = vec![
            b"X-Client-Id: client-a",
            b"Content-Type: application/json",
            b"Idempotency-Key: k-pipe",
        ];
        if !close {
            headers.push(b"Connection: keep-alive");
        }
        let mut request = raw::post("/orders", &headers, ORDER);
        if !close {
            let text = String::from_utf8(request).unwrap();
            request = text.replace("Connection: close\r\n", "").into_bytes();
        }
        request
    };
    let pipelined = [one(false), one(true)].concat();
    let whole = raw::send(f.server.addr, &pipelined).await;
    let text = format!(
        "{}\r\n\r\n{}",
        whole.head,
        String::from_utf8_lossy(&whole.body)
    );
    let answers: Vec<&str> = text.split("HTTP/1.1 ").filter(|s| !s.is_empty()).collect();
    assert_eq!(answers.len(), 2, "{text}");
    assert!(answers[0].starts_with("201"), "{}", answers[0]);
    assert!(
        !answers[0]
            .to_ascii_lowercase()
            .contains("idempotent-replayed"),
        "{}",
        answers[0]
    );
    assert!(answers[1].starts_with("201"), "{}", answers[1]);
    assert!(
        answers[1]
            .to_ascii_lowercase()
            .contains("idempotent-replayed: true"),
        "{}",
        answers[1]
    );
    assert_eq!(f.runs.get(), 1);
}

/// Two contracted handlers with the same name in different modules.
mod orders {
    use super::*;

    #[idem::contract(
        key_scope = client,
        fingerprint = body,
        ttl = "1h",
        deadline = "10s",
        max_attempts = 3,
        retryable = [503],
        concurrency = conflict,
        status_lookup = super::order_status,
        recovery = manual("https://runbooks.example.com/orders"),
    )]
    pub async fn create(
        State(runs): State<Counter>,
        Json(_body): Json<Value>,
    ) -> impl IntoResponse {
        (StatusCode::CREATED, Json(json!({ "order": runs.bump() })))
    }
}

mod refunds {
    use super::*;

    #[idem::contract(
        key_scope = client,
        fingerprint = body,
        ttl = "1h",
        deadline = "10s",
        max_attempts = 3,
        retryable = [503],
        concurrency = conflict,
        status_lookup = super::order_status,
        recovery = manual("https://runbooks.example.com/refunds"),
    )]
    pub async fn create(
        State(runs): State<Counter>,
        Json(_body): Json<Value>,
    ) -> impl IntoResponse {
        (StatusCode::CREATED, Json(json!({ "refund": runs.bump() })))
    }
}

/// One client's key on two operations names two operations (keys live per client and per
/// operation: docs/contract.md, `key_scope`). An
/// operation is named by its handler, so `orders::create` and `refunds::create` would
/// share one namespace and answer each other's replays: the second handler to serve is
/// refused with 500 `not-configured`, naming the clash, and never runs or replays.
#[tokio::test]
async fn same_named_handlers_in_two_modules_are_refused() {
    let idem = Idem::new(idem::MemoryStore::new(), identity::header("x-client-id"));
    let router = Router::new()
        .route("/orders", post(orders::create))
        .route("/refunds", post(refunds::create))
        .with_state(Counter::default())
        .layer(idem.layer());
    let server = TestServer::start(router).await;
    let post = |path: &str| send(server.post(path, "k-shared").json(&json!({ "amount": 1 })));
    let order = post("/orders").await;
    assert_eq!(order.json(), json!({ "order": 1 }));
    let refund = post("/refunds").await;
    let problem = refund.problem(500, "not-configured");
    assert!(!refund.replayed(), "the refund is not the order's replay");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("two contracted handlers are named `create`"),
        "{detail}"
    );
    assert!(detail.contains("orders::create::Operation"), "{detail}");
    assert_eq!(
        post("/orders").await.json(),
        json!({ "order": 1 }),
        "the first keeps its name"
    );
}

/// Numbers with two million digits get a precise answer and never hang the server (the
/// 30 s bound is a hang guard, not a speed claim): 400 when they overflow a double, and
/// axum's 4xx when they round to one that `Json<CreateOrder>`'s `i64` refuses.
#[tokio::test]
async fn numbers_with_millions_of_digits_are_refused() {
    let f = Fixture::new().await;
    let digits = 1_900_000;
    let cases = [
        ("huge", format!("1{}", "0".repeat(digits)), Some(400)),
        ("tiny", format!("0.{}1", "0".repeat(digits)), None),
        ("long", format!("1.{}1", "0".repeat(digits)), None),
        ("exponent", format!("1e{}", "9".repeat(digits)), Some(400)),
    ];
    for (what, number, status) in cases {
        let body = format!(r#"{{"customer_id":"c","amount":{number}}}"#);
        let answer = tokio::time::timeout(
            Duration::from_secs(30),
            send(
                f.post("/orders", Some(&format!("k-{what}")))
                    .header("content-type", "application/json")
                    .body(body),
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within 30 s"));
        if let Some(status) = status {
            answer.problem(status, "body-malformed");
        } else {
            assert!((400..500).contains(&answer.status), "{what}: {answer:?}");
        }
    }
    assert_eq!(f.runs.get(), 0);
}
