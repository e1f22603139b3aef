//! The client against real servers on 127.0.0.1, through reqwest: an idem service behind
//! a proxy that loses answers, an upstream that always answers 429, and connections cut
//! after the request was read.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use idem_client::{
    Backoff, Call, Client, IdempotencyKey, Intent, LastAttempt, Outcome, Refusal, RetryPolicy,
    StopReason, TransportError,
};
use idem_contract::{Retryable, StatusCode as Status, TransportFailure};

/// How many times the handler ran, by `amount_minor` (each test that counts effects
/// sends its own amount: the tests of this file run at once, against one handler).
static EFFECTS: std::sync::Mutex<BTreeMap<u64, usize>> = std::sync::Mutex::new(BTreeMap::new());

fn effects(amount_minor: u64) -> usize {
    EFFECTS
        .lock()
        .unwrap()
        .get(&amount_minor)
        .copied()
        .unwrap_or(0)
}

#[derive(Deserialize)]
struct Transfer {
    amount_minor: u64,
}

async fn transfer_status(
    lookup: idem::Lookup<create_transfer::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

#[idem::contract(
    key_scope = client,
    fingerprint = [amount_minor],
    ttl = "1h",
    deadline = ("10s", per_attempt = "2s"),
    max_attempts = 3,
    retryable = [503, timeout, connection_reset],
    concurrency = conflict,
    status_lookup = transfer_status(path = "/transfers/operations/{key}"),
    recovery = manual("https://runbooks.example.com/transfers"),
)]
async fn create_transfer(Json(body): Json<Transfer>) -> (StatusCode, Json<Value>) {
    *EFFECTS
        .lock()
        .unwrap()
        .entry(body.amount_minor)
        .or_default() += 1;
    (
        StatusCode::CREATED,
        Json(json!({"amount_minor": body.amount_minor})),
    )
}

/// Serves `app` on a free port of 127.0.0.1; returns its address.
async fn serve(app: Router) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("127.0.0.1:{}", addr.port())
}

async fn idem_service() -> String {
    let idem = idem::Idem::new(
        idem::MemoryStore::new(),
        idem::identity::header("x-client-id"),
    );
    serve(
        Router::new()
            .route("/transfers", post(create_transfer))
            .route("/transfers/operations/{key}", get(transfer_status))
            .layer(idem.layer()),
    )
    .await
}

/// Reads one HTTP/1.1 message (headers, then `Content-Length` bytes), at most 1 MiB.
async fn read_message(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                return Some(buf);
            }
        }
        if buf.len() > 1 << 20 {
            return None;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A proxy to `upstream` that forwards every request, and drops the answer of each
/// `POST` for which `drop(n)` is true (`n` counts them from 0): the server has done
/// its work, the client never hears of it.
async fn lossy_proxy(upstream: String, drop: fn(usize) -> bool) -> String {
    counting_proxy(upstream, drop).await.0
}

/// [`lossy_proxy`], and the number of `POST`s it forwarded.
async fn counting_proxy(upstream: String, drop: fn(usize) -> bool) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let posts = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&posts);
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            let posts = Arc::clone(&posts);
            tokio::spawn(async move {
                let Some(request) = read_message(&mut client).await else {
                    return;
                };
                let mut server = TcpStream::connect(&upstream).await.unwrap();
                server.write_all(&request).await.unwrap();
                let Some(answer) = read_message(&mut server).await else {
                    return;
                };
                if request.starts_with(b"POST") && drop(posts.fetch_add(1, Ordering::SeqCst)) {
                    return; // closed without a word
                }
                let _ = client.write_all(&answer).await;
            });
        }
    });
    (format!("http://127.0.0.1:{}", addr.port()), counted)
}

fn transfer_call(base: &str) -> Call {
    transfer_of(base, 500)
}

fn transfer_of(base: &str, amount_minor: u64) -> Call {
    Call::post_json(
        &format!("{base}/transfers"),
        &json!({"amount_minor": amount_minor}),
    )
    .unwrap()
    .header("x-client-id", "acme")
    .unwrap()
}

fn fast(policy: RetryPolicy) -> RetryPolicy {
    policy.with_backoff(Backoff::new(
        Duration::from_millis(5),
        Duration::from_millis(20),
    ))
}

#[tokio::test]
async fn a_lost_answer_after_the_commit_is_replayed_and_the_effect_happens_once() {
    let base = lossy_proxy(idem_service().await, |n| n == 0).await;
    let policy = fast(RetryPolicy::from_contract(&create_transfer::CONTRACT));
    let client = Client::new().unwrap();
    let outcome = client
        .execute(Intent::new(policy), &transfer_of(&base, 7001))
        .await
        .unwrap();
    let Outcome::Completed(done) = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(done.attempts, 2);
    assert!(done.replayed, "the second attempt got the stored answer");
    assert!(!done.from_lookup);
    assert_eq!(done.status, 201);
    assert_eq!(
        serde_json::from_slice::<Value>(&done.body).unwrap()["amount_minor"],
        7001
    );
    assert!(done.operation_id.is_some());
    assert_eq!(effects(7001), 1, "one effect");
}

#[tokio::test]
async fn when_every_answer_is_lost_the_status_lookup_gives_the_outcome() {
    let base = lossy_proxy(idem_service().await, |_| true).await;
    let policy = fast(RetryPolicy::from_contract(&create_transfer::CONTRACT));
    let outcome = Client::new()
        .unwrap()
        .execute(Intent::new(policy), &transfer_call(&base))
        .await
        .unwrap();
    let Outcome::Completed(done) = outcome else {
        panic!("{outcome:?}");
    };
    assert!(done.from_lookup && done.replayed);
    assert_eq!(done.attempts, 3, "max_attempts, every answer lost");
    assert_eq!(done.status, 201);
    assert_eq!(
        serde_json::from_slice::<Value>(&done.body).unwrap()["amount_minor"],
        500
    );
}

#[tokio::test]
async fn an_upstream_that_always_answers_429_gets_exactly_max_attempts_requests() {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&hits);
    let addr = serve(Router::new().route(
        "/charges",
        post(move || {
            let counter = Arc::clone(&counter);
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    [("retry-after", "0")],
                    "slow down",
                )
            }
        }),
    ))
    .await;
    let policy = fast(
        RetryPolicy::builder("create_charge")
            .max_attempts(4)
            .deadline(Duration::from_secs(10))
            .retryable([Retryable::Status(Status(429))])
            .build()
            .unwrap(),
    );
    let call = Call::post_json(&format!("http://{addr}/charges"), &json!({})).unwrap();
    let client = Client::new()
        .unwrap()
        .with_budget(idem_client::RetryBudget::unlimited());
    let outcome = client.execute(Intent::new(policy), &call).await.unwrap();
    let Outcome::Unknown(unknown) = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(unknown.reason, StopReason::AttemptsExhausted);
    assert_eq!(
        hits.load(Ordering::SeqCst),
        4,
        "4 requests, not 4 × reqwest's own retries"
    );
}

/// A server that reads each request and, for the first `cut` connections, closes the
/// connection instead of answering; then answers 201.
async fn cutting_server(cut: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((mut stream, _)) = listener.accept().await {
            let first = n < cut;
            n += 1;
            tokio::spawn(async move {
                if read_message(&mut stream).await.is_none() || first {
                    return;
                }
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
                    )
                    .await;
            });
        }
    });
    format!("http://127.0.0.1:{}", addr.port())
}

fn cut_policy(retryable: &[Retryable]) -> RetryPolicy {
    fast(
        RetryPolicy::builder("create_charge")
            .max_attempts(3)
            .deadline(Duration::from_secs(10))
            .per_attempt(Duration::from_secs(2))
            .retryable(retryable.iter().copied())
            .build()
            .unwrap(),
    )
}

#[tokio::test]
async fn a_connection_cut_after_the_request_is_retried_only_when_declared() {
    let base = cutting_server(1).await;
    let call = Call::post_json(&format!("{base}/charges"), &json!({})).unwrap();
    let reset = [Retryable::Transport(TransportFailure::ConnectionReset)];
    let outcome = Client::new()
        .unwrap()
        .execute(Intent::new(cut_policy(&reset)), &call)
        .await
        .unwrap();
    assert!(
        matches!(outcome, Outcome::Completed(ref c) if c.attempts == 2),
        "{outcome:?}"
    );

    let base = cutting_server(1).await;
    let call = Call::post_json(&format!("{base}/charges"), &json!({})).unwrap();
    let outcome = Client::new()
        .unwrap()
        .execute(
            Intent::new(cut_policy(&[Retryable::Status(Status(503))])),
            &call,
        )
        .await
        .unwrap();
    let Outcome::Unknown(unknown) = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(unknown.reason, StopReason::NotRetryable);
    assert!(
        matches!(
            unknown.last,
            Some(LastAttempt::Transport(TransportError::Reset(_)))
        ),
        "{:?}",
        unknown.last
    );
}

#[tokio::test]
async fn a_refused_connection_and_a_slow_server_are_told_apart() {
    // A port nothing listens on: nothing was sent.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let call = Call::post_json(&format!("http://127.0.0.1:{port}/charges"), &json!({})).unwrap();
    let outcome = Client::new()
        .unwrap()
        .execute(Intent::new(cut_policy(&[])), &call)
        .await
        .unwrap();
    let Outcome::Unknown(unknown) = outcome else {
        panic!("{outcome:?}");
    };
    let Some(LastAttempt::Transport(error)) = &unknown.last else {
        panic!("{:?}", unknown.last);
    };
    assert!(error.nothing_sent(), "{error:?}");

    // A server slower than the per-attempt timeout.
    let addr = serve(Router::new().route(
        "/charges",
        post(|| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            StatusCode::CREATED
        }),
    ))
    .await;
    let policy = fast(
        RetryPolicy::builder("create_charge")
            .max_attempts(2)
            .deadline(Duration::from_secs(10))
            .per_attempt(Duration::from_millis(200))
            .retryable([Retryable::Transport(TransportFailure::Timeout)])
            .build()
            .unwrap(),
    );
    let call = Call::post_json(&format!("http://{addr}/charges"), &json!({})).unwrap();
    let started = std::time::Instant::now();
    let outcome = Client::new()
        .unwrap()
        .execute(Intent::new(policy), &call)
        .await
        .unwrap();
    let Outcome::Unknown(unknown) = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(unknown.attempts, 2);
    assert!(matches!(
        unknown.last,
        Some(LastAttempt::Transport(TransportError::Timeout))
    ));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "bounded by the per-attempt timeout"
    );
}

/// Hostile answers: a body over the limit, a `Retry-After` that is garbage, a status
/// lookup that answers garbage. None panics, none is taken for a definite answer.
#[tokio::test]
async fn hostile_answers_never_pass_for_definite_ones() {
    let huge = "x".repeat(idem_client::transport::MAX_ANSWER_BYTES + 1);
    let addr = serve(
        Router::new()
            .route(
                "/big",
                post(move || async move { (StatusCode::CREATED, huge.clone()) }),
            )
            .route(
                "/garbage",
                post(|| async {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [("retry-after", "soon, maybe -1")],
                        "",
                    )
                }),
            )
            .route(
                "/ops/{key}",
                get(|| async { (StatusCode::OK, "{not json") }),
            ),
    )
    .await;
    let policy = |retryable: &[Retryable]| {
        fast(
            RetryPolicy::builder("create_charge")
                .max_attempts(2)
                .deadline(Duration::from_secs(10))
                .retryable(retryable.iter().copied())
                .status_lookup("/ops/{key}")
                .build()
                .unwrap(),
        )
    };
    let client = Client::new().unwrap();

    let call = Call::post_json(&format!("http://{addr}/big"), &json!({})).unwrap();
    let reset = [Retryable::Transport(TransportFailure::ConnectionReset)];
    let outcome = client
        .execute(Intent::new(policy(&reset)), &call)
        .await
        .unwrap();
    let Outcome::Unknown(unknown) = outcome else {
        panic!("{outcome:?}");
    };
    assert!(
        matches!(
            unknown.last,
            Some(LastAttempt::Transport(TransportError::TooLarge))
        ),
        "{:?}",
        unknown.last
    );
    assert!(
        matches!(unknown.lookup, Some(idem_client::LookupAnswer::Other(s)) if s == 200),
        "a lookup body that is not JSON is not a status: {:?}",
        unknown.lookup
    );

    let call = Call::post_json(&format!("http://{addr}/garbage"), &json!({})).unwrap();
    let started = std::time::Instant::now();
    let outcome = client
        .execute(
            Intent::new(policy(&[Retryable::Status(Status(503))])),
            &call,
        )
        .await
        .unwrap();
    let Outcome::Unknown(unknown) = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(
        unknown.attempts, 2,
        "a garbage Retry-After falls back to the backoff"
    );
    assert_eq!(unknown.reason, StopReason::AttemptsExhausted);
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn calls_refuse_what_is_not_http() {
    for url in [
        "",
        "orders",
        "/orders",
        "http://",
        "ht tp://x/orders",
        "http://[::1/x",
    ] {
        assert!(Call::new(http::Method::POST, url).is_err(), "{url:?}");
    }
    let call = Call::new(http::Method::POST, "http://127.0.0.1:1/orders").unwrap();
    assert!(call.clone().header("bad header", "v").is_err());
    assert!(call.clone().header("x-ok", "line\nbreak").is_err());
    assert!(call.clone().header("x-client-id", "a\u{0}b").is_err());
    assert!(call.clone().header("", "v").is_err());
    assert!(call.header("x-ok", "fine").is_ok());
}

/// What a plain upstream received: each request's headers and body.
type Seen = Arc<std::sync::Mutex<Vec<(axum::http::HeaderMap, axum::body::Bytes)>>>;

/// A plain upstream (no idem) on `/charges` that answers `status` to every request and
/// records it: a request it saw is one the client sent.
async fn recording_upstream(status: StatusCode) -> (String, Seen) {
    let seen = Seen::default();
    let record = Arc::clone(&seen);
    let addr = serve(Router::new().route(
        "/charges",
        post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let record = Arc::clone(&record);
                async move {
                    record.lock().unwrap().push((headers, body));
                    status
                }
            },
        ),
    ))
    .await;
    (format!("http://{addr}/charges"), seen)
}

/// The policy of a contract that puts the key in the body member `field`.
fn body_key_policy(field: &str) -> RetryPolicy {
    let extension: idem_contract::extension::Extension = serde_json::from_value(json!({
        "operation": "create_charge",
        "key_scope": {"per": "client", "source": {"in": "body", "field": field}},
        "fingerprint": "body", "ttl": "1d", "deadline": {"total": "10s"}, "max_attempts": 3,
        "retryable": [503], "concurrency": {"response": "conflict", "retry_after": "1s"},
        "status_lookup": {}, "recovery": {"kind": "reconcile"}
    }))
    .unwrap();
    fast(RetryPolicy::from_extension(&extension))
}

#[tokio::test]
async fn a_body_key_that_cannot_be_placed_sends_nothing_and_says_why() {
    let (url, seen) = recording_upstream(StatusCode::SERVICE_UNAVAILABLE).await;
    let client = Client::new()
        .unwrap()
        .with_budget(idem_client::RetryBudget::unlimited());
    let json_call = |body: Value| Call::post_json(&url, &body).unwrap();
    let cases: Vec<(&str, Call, Refusal)> = vec![
        (
            "[]",
            json_call(json!([])),
            Refusal::BodyNotObject {
                field: "request.key".into(),
                found: "an array",
            },
        ),
        (
            "null",
            json_call(json!(null)),
            Refusal::BodyNotObject {
                field: "request.key".into(),
                found: "null",
            },
        ),
        (
            "\"\"",
            json_call(json!("")),
            Refusal::BodyNotObject {
                field: "request.key".into(),
                found: "a string",
            },
        ),
        (
            "5",
            json_call(json!(5)),
            Refusal::BodyNotObject {
                field: "request.key".into(),
                found: "a number",
            },
        ),
        (
            "no body",
            Call::new(http::Method::POST, &url).unwrap(),
            Refusal::EmptyBody {
                field: "request.key".into(),
            },
        ),
        (
            "a member in the way",
            json_call(json!({"request": "r-1"})),
            Refusal::PathBlocked {
                field: "request.key".into(),
                at: "request".into(),
                found: "a string",
            },
        ),
        (
            "a form",
            Call::new(http::Method::POST, &url)
                .unwrap()
                .header("content-type", "application/x-www-form-urlencoded")
                .unwrap(),
            Refusal::FormBody {
                field: "request.key".into(),
            },
        ),
    ];
    for (name, call, expected) in cases {
        let intent = Intent::new(body_key_policy("request.key"));
        let key = intent.key().clone();
        let error = match client.execute(intent, &call).await {
            Err(error) => error,
            Ok(outcome) => panic!("{name}: sent anyway: {outcome:?}"),
        };
        assert_eq!(error.reason, expected, "{name}");
        assert_eq!(error.intent.key(), &key, "{name}: the intent comes back");
        assert_eq!(error.intent.attempts(), 0, "{name}");
        let message = error.to_string();
        assert!(
            message.starts_with("nothing was sent for `create_charge`: ")
                && message.contains("`request.key`"),
            "{name}: {message}"
        );
    }
    assert_eq!(seen.lock().unwrap().len(), 0, "nothing reached the server");

    // Where the key can go, it goes: `null` and absent members are made objects.
    for body in [json!({}), json!({"request": null}), json!({"request": {}})] {
        let outcome = client
            .execute(
                Intent::new(body_key_policy("request.key")),
                &json_call(body.clone()),
            )
            .await
            .unwrap_or_else(|e| panic!("{body}: {e}"));
        assert!(matches!(outcome, Outcome::Unknown(_)), "{outcome:?}");
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 9, "3 bodies × 3 attempts");
    for (_, body) in seen.iter() {
        let body: Value = serde_json::from_slice(body).unwrap();
        assert!(body["request"]["key"].is_string(), "{body}");
    }
}

#[tokio::test]
async fn a_key_the_caller_set_is_never_replaced() {
    let (url, seen) = recording_upstream(StatusCode::CREATED).await;
    let client = Client::new().unwrap();
    let policy = || cut_policy(&[]);

    // Another key in the key header, under any case of its name: refused, nothing sent.
    for name in ["Idempotency-Key", "idempotency-key", "IDEMPOTENCY-KEY"] {
        let call = Call::post_json(&url, &json!({}))
            .unwrap()
            .header(name, "mine")
            .unwrap();
        let error = client
            .execute(Intent::new(policy()), &call)
            .await
            .unwrap_err();
        assert_eq!(
            error.reason,
            Refusal::KeyConflict {
                at: "Idempotency-Key".into()
            },
            "{name}"
        );
        assert!(
            error.to_string().contains("its own idempotency key"),
            "{error}"
        );
    }
    // Twice, once with the intent's key: still another key.
    let intent = Intent::new(policy());
    let call = Call::post_json(&url, &json!({}))
        .unwrap()
        .header("idempotency-key", intent.key().as_str())
        .unwrap()
        .header("idempotency-key", "mine")
        .unwrap();
    assert!(client.execute(intent, &call).await.is_err());
    // A header name the contract does not use is the caller's business.
    let policy_x = || {
        fast(
            RetryPolicy::builder("create_charge")
                .key_header("X-Request-Key")
                .max_attempts(1)
                .deadline(Duration::from_secs(10))
                .build()
                .unwrap(),
        )
    };
    let call = Call::post_json(&url, &json!({}))
        .unwrap()
        .header("x-request-key", "mine")
        .unwrap();
    let error = client
        .execute(Intent::new(policy_x()), &call)
        .await
        .unwrap_err();
    assert_eq!(
        error.reason,
        Refusal::KeyConflict {
            at: "X-Request-Key".into()
        }
    );
    assert!(seen.lock().unwrap().is_empty(), "nothing was sent");

    // The intent's own key, bare or as an RFC 8941 string: sent once, as the intent's.
    for quoted in [false, true] {
        let intent = Intent::new(policy());
        let key = intent.key().clone();
        let value = if quoted {
            format!("\"{key}\"")
        } else {
            key.to_string()
        };
        let call = Call::post_json(&url, &json!({}))
            .unwrap()
            .header("Idempotency-Key", &value)
            .unwrap();
        let outcome = client.execute(intent, &call).await.unwrap();
        assert!(matches!(outcome, Outcome::Completed(_)), "{outcome:?}");
        let seen = seen.lock().unwrap();
        let (headers, _) = seen.last().unwrap();
        let values: Vec<_> = headers.get_all("idempotency-key").iter().collect();
        assert_eq!(values, [key.as_str()], "one key header, the intent's");
    }

    // In the body: another key, or a member that is not a string, is refused.
    let body_policy = || body_key_policy("request.key");
    for body in [
        json!({"request": {"key": "mine"}}),
        json!({"request": {"key": 5}}),
        json!({"request": {"key": ""}}),
    ] {
        let call = Call::post_json(&url, &body).unwrap();
        let error = client
            .execute(Intent::new(body_policy()), &call)
            .await
            .unwrap_err();
        assert_eq!(
            error.reason,
            Refusal::KeyConflict {
                at: "request.key".into()
            },
            "{body}"
        );
    }
    let intent = Intent::new(body_policy());
    let body = json!({"request": {"key": intent.key().as_str(), "note": "n"}});
    let outcome = client
        .execute(intent, &Call::post_json(&url, &body).unwrap())
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Completed(_)), "{outcome:?}");
    let sent: Value = serde_json::from_slice(&seen.lock().unwrap().last().unwrap().1).unwrap();
    assert_eq!(sent, body, "the body as the caller wrote it");
}

#[tokio::test]
async fn a_call_without_the_published_client_identity_sends_nothing() {
    let (url, seen) = recording_upstream(StatusCode::CREATED).await;
    let client = Client::new().unwrap();
    let policy = || {
        fast(
            RetryPolicy::builder("create_charge")
                .max_attempts(1)
                .deadline(Duration::from_secs(10))
                .client_identity_header("X-Client-Id")
                .build()
                .unwrap(),
        )
    };
    assert_eq!(policy().client_identity_header(), Some("X-Client-Id"));
    let long = "a".repeat(256);
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (vec![], "the call has none"),
        (vec![("authorization", "Bearer t")], "the call has none"),
        (vec![("x-client-id", "")], "the call's value is empty"),
        (vec![("x-client-id", "  \t ")], "the call's value is empty"),
        (vec![("x-client-id", "ac me")], "a space or a tab inside"),
        // obs-text: HTTP lets it through, the server's identity rules do not.
        (vec![("x-client-id", "café")], "not visible ASCII"),
        (vec![("x-client-id", &long)], "longer than 255 bytes"),
        (
            vec![("x-client-id", "acme"), ("X-Client-Id", "acme")],
            "more than once",
        ),
    ];
    for (headers, why) in cases {
        let mut call = Call::post_json(&url, &json!({})).unwrap();
        for (name, value) in &headers {
            call = call.header(name, value).unwrap();
        }
        let error = client
            .execute(Intent::new(policy()), &call)
            .await
            .unwrap_err();
        let message = error.to_string();
        assert!(
            matches!(&error.reason, Refusal::ClientIdentity { header, why: w }
                if header == "X-Client-Id" && w.contains(why)),
            "{headers:?}: {message}"
        );
        assert!(message.contains("`X-Client-Id`"), "{message}");
    }
    assert!(seen.lock().unwrap().is_empty(), "nothing was sent");

    // Any case of the name; spaces around the value do not count, as on the server.
    for (name, value) in [("x-client-id", "acme"), ("X-CLIENT-ID", " acme ")] {
        let call = Call::post_json(&url, &json!({}))
            .unwrap()
            .header(name, value)
            .unwrap();
        let outcome = client.execute(Intent::new(policy()), &call).await.unwrap();
        assert!(matches!(outcome, Outcome::Completed(_)), "{outcome:?}");
    }
    // Without a published identity nothing is checked.
    let call = Call::post_json(&url, &json!({})).unwrap();
    let outcome = client
        .execute(Intent::new(cut_policy(&[])), &call)
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Completed(_)), "{outcome:?}");
    assert_eq!(seen.lock().unwrap().len(), 3);

    // A builder refuses an identity header that is not a header name.
    let error = RetryPolicy::builder("create_charge")
        .max_attempts(1)
        .deadline(Duration::from_secs(10))
        .client_identity_header("x client")
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("`x client`"), "{error}");
}

#[tokio::test]
async fn a_job_that_restarts_resumes_with_its_saved_key() {
    let service = idem_service().await;

    // Before the restart: the order is placed, every answer is lost, and the job has no
    // lookup to ask; all it keeps is the key.
    let (lossy, _) = counting_proxy(service.clone(), |_| true).await;
    let blind = fast(
        RetryPolicy::builder("create_transfer")
            .max_attempts(2)
            .deadline(Duration::from_secs(10))
            .per_attempt(Duration::from_secs(2))
            .retryable([Retryable::Transport(TransportFailure::ConnectionReset)])
            .build()
            .unwrap(),
    );
    let outcome = Client::new()
        .unwrap()
        .execute(Intent::new(blind), &transfer_of(&lossy, 7002))
        .await
        .unwrap();
    let Outcome::Unknown(unknown) = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(unknown.attempts, 2);
    let saved: String = unknown.key().as_str().to_owned();
    drop(unknown);

    // After: the intent made again from the saved key asks the lookup first, and the
    // order it finds is the outcome; the command is not sent again.
    let (base, posts) = counting_proxy(service.clone(), |_| false).await;
    let policy = fast(RetryPolicy::from_contract(&create_transfer::CONTRACT));
    let intent = Intent::resume(policy.clone(), IdempotencyKey::parse(&saved).unwrap()).unwrap();
    let outcome = Client::new()
        .unwrap()
        .execute(intent, &transfer_of(&base, 7002))
        .await
        .unwrap();
    let Outcome::Completed(done) = outcome else {
        panic!("{outcome:?}");
    };
    assert!(done.from_lookup && done.replayed);
    assert_eq!((done.attempts, done.status.as_u16()), (0, 201));
    assert_eq!(done.key.as_str(), saved);
    #[derive(Deserialize)]
    struct Transferred {
        amount_minor: u64,
    }
    assert_eq!(done.json::<Transferred>().unwrap().amount_minor, 7002);
    assert!(done.json::<Vec<u8>>().is_err());
    let line = done.to_string();
    assert!(
        line.starts_with(
            "outcome=completed operation=create_transfer status=201 attempts=0 replayed=true from_lookup=true operation_id="
        ) && !line.contains(&saved)
            && !line.contains('\n'),
        "{line}"
    );
    assert_eq!(
        posts.load(Ordering::SeqCst),
        0,
        "the command was not sent again"
    );
    assert_eq!(effects(7002), 1, "one transfer, across the restart");

    // A saved key the server never saw: the lookup says 404, and the command is sent.
    let fresh = IdempotencyKey::parse("job-42:transfer-1").unwrap();
    let outcome = Client::new()
        .unwrap()
        .execute(
            Intent::resume(policy, fresh).unwrap(),
            &transfer_of(&base, 7003),
        )
        .await
        .unwrap();
    assert!(
        matches!(&outcome, Outcome::Completed(d) if d.attempts == 1 && !d.from_lookup && !d.replayed),
        "{outcome:?}"
    );
    assert_eq!(posts.load(Ordering::SeqCst), 1);
    assert_eq!(effects(7003), 1);
}

/// A key that starts with `"` is sent as the RFC 8941 string that quotes it, in the
/// header and in the lookup's path, so the server reads back the same key.
#[tokio::test]
async fn a_saved_key_with_quotes_reaches_the_server_as_it_is() {
    let base = idem_service().await;
    let base = format!("http://{base}");
    let policy = fast(RetryPolicy::from_contract(&create_transfer::CONTRACT));
    let key = r#""quoted\key""#;
    let client = Client::new().unwrap();
    for round in 0..2 {
        let intent = Intent::resume(policy.clone(), IdempotencyKey::parse(key).unwrap()).unwrap();
        let outcome = client
            .execute(intent, &transfer_of(&base, 7004))
            .await
            .unwrap();
        let Outcome::Completed(done) = outcome else {
            panic!("round {round}: {outcome:?}");
        };
        assert_eq!(done.key.as_str(), key);
        // The first round: not found, sent, 201; the second: found by the lookup.
        assert_eq!(done.from_lookup, round == 1, "round {round}");
        assert_eq!(done.status, 201);
    }
    assert_eq!(effects(7004), 1);
}
