//! The payment provider's client over real sockets on 127.0.0.1: against the tests' own
//! provider (which counts charges and misbehaves when told to), against servers that
//! answer badly or not at all, and the service's in-process provider.

mod support;

use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use payments::provider::{self, Charge, ChargeError, ChargeRequest, Decline, Provider, SetupError};
use reqwest::Url;
use serde_json::{Value, json};
use support::provider::{Fault, TestProvider};
use tokio::net::TcpListener;

/// The card source of every request: no unknown outcome's sentence may contain it.
const SOURCE: &str = "card_visa_4242_secret";

/// A bound on any one test's wait: a hang must end well before.
const TEST_BOUND: Duration = Duration::from_secs(10);

fn request(amount_minor: i64) -> ChargeRequest {
    ChargeRequest {
        amount_minor,
        currency: "EUR".into(),
        source: SOURCE.into(),
    }
}

fn declined_request() -> ChargeRequest {
    ChargeRequest {
        source: "card_declined_insufficient_funds".into(),
        ..request(100)
    }
}

fn client(url: Url, timeout: Duration) -> Provider {
    Provider::new(url, timeout).expect("an http URL")
}

/// The sentence of an unknown outcome, which must not contain the card source.
fn unknown(result: Result<Charge, ChargeError>) -> String {
    match result {
        Err(ChargeError::Unknown(sentence)) => {
            assert!(!sentence.contains(SOURCE), "{sentence}");
            sentence
        }
        other => panic!("expected an unknown outcome, got {other:?}"),
    }
}

fn declined(result: Result<Charge, ChargeError>) -> Decline {
    match result {
        Err(ChargeError::Declined(decline)) => decline,
        other => panic!("expected a decline, got {other:?}"),
    }
}

/// A server on 127.0.0.1 that answers every `POST /charges` with `status` and `body`.
async fn answering(status: StatusCode, body: &'static str) -> Url {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
    let router = Router::new().route("/charges", post(move || async move { (status, body) }));
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

#[tokio::test]
async fn a_charge_is_made_and_counted() {
    let tp = TestProvider::start().await;
    let provider = client(tp.url(), TEST_BOUND);
    let charge = provider.charge(&request(2500), "k-1").await.unwrap();
    assert_eq!(charge.id, "ch_test_1");
    assert_eq!((tp.charges("k-1"), tp.requests("k-1")), (1, 1));
    assert_eq!(tp.total_charges(), 1);
}

#[tokio::test]
async fn the_same_key_twice_is_the_same_charge_made_once() {
    let tp = TestProvider::start().await;
    let provider = client(tp.url(), TEST_BOUND);
    let first = provider.charge(&request(2500), "k-twice").await.unwrap();
    let again = provider.charge(&request(2500), "k-twice").await.unwrap();
    assert_eq!(first, again);
    assert_eq!((tp.charges("k-twice"), tp.requests("k-twice")), (1, 2));
    let other = provider.charge(&request(2500), "k-other").await.unwrap();
    assert_ne!(other, first, "another key is another charge");
    assert_eq!(tp.total_charges(), 2);
}

#[tokio::test]
async fn a_decline_is_declined_with_its_code_and_declined_again() {
    let tp = TestProvider::start().await;
    let provider = client(tp.url(), TEST_BOUND);
    let decline = declined(provider.charge(&declined_request(), "k-no").await);
    assert_eq!(decline.code, "card_declined");
    assert!(!decline.message.is_empty());
    assert_eq!(
        declined(provider.charge(&declined_request(), "k-no").await),
        decline
    );
    // Told to decline: a card that would be charged is declined, and stays declined.
    tp.fail_next(Fault::Decline, 1);
    assert_eq!(
        declined(provider.charge(&request(100), "k-told").await).code,
        "card_declined"
    );
    assert!(matches!(
        provider.charge(&request(100), "k-told").await,
        Err(ChargeError::Declined(_))
    ));
    assert_eq!(tp.total_charges(), 0);
}

#[tokio::test]
async fn a_lost_answer_is_unknown_and_the_same_key_finds_the_one_charge() {
    let tp = TestProvider::start().await;
    let provider = client(tp.url(), TEST_BOUND);
    tp.fail_next(Fault::LoseAnswer, 1);
    let sentence = unknown(provider.charge(&request(700), "k-lost").await);
    assert!(sentence.contains("failed before an answer"), "{sentence}");
    assert_eq!(
        tp.charges("k-lost"),
        1,
        "charged, though the answer was lost"
    );
    let charge = provider.charge(&request(700), "k-lost").await.unwrap();
    assert_eq!(charge.id, "ch_test_1");
    assert_eq!((tp.charges("k-lost"), tp.requests("k-lost")), (1, 2));
}

#[tokio::test]
async fn unavailable_is_unknown_and_charges_nothing() {
    let tp = TestProvider::start().await;
    let provider = client(tp.url(), TEST_BOUND);
    tp.fail_next(Fault::Unavailable, 2);
    for _ in 0..2 {
        let sentence = unknown(provider.charge(&request(300), "k-503").await);
        assert!(sentence.contains("503"), "{sentence}");
        assert!(
            sentence.contains("(unavailable)"),
            "the provider's code: {sentence}"
        );
    }
    assert_eq!(tp.total_charges(), 0);
    provider.charge(&request(300), "k-503").await.unwrap();
    assert_eq!((tp.charges("k-503"), tp.requests("k-503")), (1, 3));

    // For a time: unknown until it has passed, then the charge.
    tp.fail_for(Fault::Unavailable, Duration::from_millis(300));
    unknown(provider.charge(&request(300), "k-window").await);
    tokio::time::sleep(Duration::from_millis(350)).await;
    provider.charge(&request(300), "k-window").await.unwrap();
    assert_eq!(tp.charges("k-window"), 1);
}

#[tokio::test]
async fn a_hang_is_unknown_within_the_clients_timeout() {
    let tp = TestProvider::start().await;
    let timeout = Duration::from_millis(400);
    let provider = client(tp.url(), timeout);
    tp.fail_next(Fault::Hang, 1);
    let started = Instant::now();
    let result = tokio::time::timeout(TEST_BOUND, provider.charge(&request(900), "k-hang"))
        .await
        .expect("the client gives up on its own");
    let waited = started.elapsed();
    let sentence = unknown(result);
    assert!(
        sentence.contains("did not answer within 400ms"),
        "{sentence}"
    );
    assert!(
        waited >= timeout && waited < timeout + Duration::from_secs(2),
        "{waited:?}"
    );
    assert_eq!(tp.total_charges(), 0);
    // The provider answers again: the key's first charge.
    provider.charge(&request(900), "k-hang").await.unwrap();
    assert_eq!(tp.charges("k-hang"), 1);
}

#[tokio::test]
async fn a_2xx_that_is_not_the_expected_json_is_unknown() {
    for (status, body) in [
        (StatusCode::OK, "charged!"),
        (StatusCode::CREATED, r#"{"charge": "ch_1"}"#),
        (StatusCode::CREATED, r#"{"id": ""}"#),
        (StatusCode::ACCEPTED, r#"{"id": "ch_1"}"#),
    ] {
        let provider = client(answering(status, body).await, TEST_BOUND);
        let sentence = unknown(provider.charge(&request(100), "k-odd").await);
        assert!(sentence.contains(status.as_str()), "{sentence}");
    }
    // Extra fields are the provider's business.
    let provider = client(
        answering(StatusCode::CREATED, r#"{"id": "ch_9", "livemode": false}"#).await,
        TEST_BOUND,
    );
    let charge = provider.charge(&request(100), "k-extra").await.unwrap();
    assert_eq!(charge.id, "ch_9");
}

#[tokio::test]
async fn a_402_whose_body_does_not_parse_is_still_a_decline() {
    let provider = client(
        answering(StatusCode::PAYMENT_REQUIRED, "<html>declined</html>").await,
        TEST_BOUND,
    );
    let decline = declined(provider.charge(&request(100), "k-402").await);
    assert_eq!(decline.code, Decline::UNREADABLE);
    // A code without a message is read.
    let provider = client(
        answering(StatusCode::PAYMENT_REQUIRED, r#"{"code": "expired_card"}"#).await,
        TEST_BOUND,
    );
    let decline = declined(provider.charge(&request(100), "k-402").await);
    assert_eq!(
        (decline.code.as_str(), decline.message.as_str()),
        ("expired_card", "")
    );
}

#[tokio::test]
async fn conflicts_and_rate_limits_are_unknown() {
    for status in [
        StatusCode::CONFLICT,
        StatusCode::TOO_MANY_REQUESTS,
        StatusCode::BAD_GATEWAY,
    ] {
        let provider = client(answering(status, r#"{"code": "busy"}"#).await, TEST_BOUND);
        let sentence = unknown(provider.charge(&request(100), "k-busy").await);
        assert!(sentence.contains(status.as_str()), "{sentence}");
        assert!(sentence.contains("(busy)"), "{sentence}");
    }
}

#[tokio::test]
async fn a_connection_closed_without_an_answer_is_unknown() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            drop(stream);
        }
    });
    let provider = client(url, TEST_BOUND);
    let sentence = unknown(provider.charge(&request(100), "k-reset").await);
    assert!(sentence.contains("failed before an answer"), "{sentence}");
}

#[tokio::test]
async fn a_provider_that_cannot_be_reached_is_unknown() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
    drop(listener);
    let provider = client(url, TEST_BOUND);
    let sentence = unknown(provider.charge(&request(100), "k-refused").await);
    assert!(sentence.contains("could not be reached"), "{sentence}");
}

#[tokio::test]
async fn a_key_that_breaks_the_rules_is_not_sent() {
    let tp = TestProvider::start().await;
    let provider = client(tp.url(), TEST_BOUND);
    let long = "k".repeat(256);
    for key in ["", "has space", "clé", long.as_str()] {
        let sentence = unknown(provider.charge(&request(100), key).await);
        assert!(sentence.contains("nothing was sent"), "{sentence}");
        assert_eq!(tp.requests(key), 0);
    }
    let longest = "k".repeat(255);
    provider.charge(&request(100), &longest).await.unwrap();
}

#[test]
fn the_charges_url_is_under_the_base_url() {
    let charges = |base: &str| {
        let provider = client(Url::parse(base).unwrap(), TEST_BOUND);
        provider.charges_url().as_str().to_owned()
    };
    assert_eq!(
        charges("http://127.0.0.1:4000"),
        "http://127.0.0.1:4000/charges"
    );
    assert_eq!(
        charges("https://api.example/v1/?x=1#top"),
        "https://api.example/v1/charges"
    );
    assert_eq!(
        charges("https://api.example/v1"),
        "https://api.example/v1/charges"
    );
    let refused = Provider::new(Url::parse("ftp://files.example/").unwrap(), TEST_BOUND);
    assert!(matches!(refused, Err(SetupError::NotHttp(scheme)) if scheme == "ftp"));
}

#[test]
fn a_charge_requests_debug_form_leaves_the_source_out() {
    let debug = format!("{:?}", request(100));
    assert!(!debug.contains(SOURCE), "{debug}");
    assert!(debug.contains("EUR"), "{debug}");
}

// The service's in-process provider.

/// The in-process provider on a free port, each new charge taking `latency`.
async fn in_process(latency: Duration) -> Url {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = Url::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
    tokio::spawn(provider::serve(listener, latency));
    url
}

/// `POST {url}/charges` with `key` (when given) and `body`, as raw as reqwest lets it be.
async fn raw(url: &Url, key: Option<&[u8]>, body: &Value) -> (StatusCode, bool, Value) {
    let mut request = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("{url}charges"))
        .json(body);
    if let Some(key) = key {
        let value = reqwest::header::HeaderValue::from_bytes(key).unwrap();
        request = request.header("idempotency-key", value);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let replayed = response.headers().get("idempotent-replayed").is_some();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, replayed, body)
}

fn body(amount_minor: i64, source: &str) -> Value {
    json!({ "amount_minor": amount_minor, "currency": "EUR", "source": source })
}

#[tokio::test]
async fn the_in_process_provider_deduplicates_on_the_key() {
    let (url, task) = provider::spawn_in_process().await.unwrap();
    assert_eq!(url.host_str(), Some("127.0.0.1"));
    let (first, replayed, charge) = raw(&url, Some(b"k-1"), &body(100, SOURCE)).await;
    assert_eq!((first, replayed), (StatusCode::CREATED, false));
    let id = charge["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("ch_"), "{id}");
    let (again, replayed, same) = raw(&url, Some(b"k-1"), &body(100, SOURCE)).await;
    assert_eq!((again, replayed), (StatusCode::OK, true));
    assert_eq!(same["id"], id.as_str());
    // Through the client: the same charge.
    let provider = client(url.clone(), TEST_BOUND);
    assert_eq!(provider.charge(&request(100), "k-1").await.unwrap().id, id);
    let other = provider.charge(&request(100), "k-2").await.unwrap();
    assert_ne!(other.id, id);
    task.abort();
}

#[tokio::test]
async fn the_in_process_provider_answers_another_request_under_a_key_with_422() {
    let url = in_process(Duration::ZERO).await;
    let (status, ..) = raw(&url, Some(b"k-reuse"), &body(100, SOURCE)).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _, problem) = raw(&url, Some(b"k-reuse"), &body(101, SOURCE)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem["code"], "idempotency_key_reused");
    let sentence = unknown(
        client(url, TEST_BOUND)
            .charge(&request(999), "k-reuse")
            .await,
    );
    assert!(sentence.contains("422"), "{sentence}");
}

#[tokio::test]
async fn the_in_process_provider_refuses_a_bad_key_or_body_with_400() {
    let url = in_process(Duration::ZERO).await;
    let long = vec![b'k'; 256];
    let keys: [Option<&[u8]>; 5] = [
        None,
        Some(b""),
        Some(b"a b"),
        Some(&long),
        Some(b"cl\xc3\xa9"),
    ];
    for key in keys {
        let (status, _, problem) = raw(&url, key, &body(100, SOURCE)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{key:?}");
        assert_eq!(problem["code"], "invalid_idempotency_key");
    }
    let (status, ..) = raw(&url, Some(&[b'k'; 255][..]), &body(100, SOURCE)).await;
    assert_eq!(status, StatusCode::CREATED, "255 characters is a key");
    for bad in [
        body(0, SOURCE),
        body(100, ""),
        json!({ "amount_minor": 1, "currency": "eur", "source": SOURCE }),
        json!({ "amount_minor": 1, "currency": "EUR" }),
        json!("not a charge"),
    ] {
        let (status, _, problem) = raw(&url, Some(b"k-body"), &bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(problem["code"], "invalid_request");
    }
}

#[tokio::test]
async fn the_in_process_provider_replays_a_decline() {
    let url = in_process(Duration::ZERO).await;
    let declined_body = body(100, "card_declined");
    let (status, replayed, decline) = raw(&url, Some(b"k-no"), &declined_body).await;
    assert_eq!((status, replayed), (StatusCode::PAYMENT_REQUIRED, false));
    assert_eq!(decline["code"], "card_declined");
    let (status, replayed, again) = raw(&url, Some(b"k-no"), &declined_body).await;
    assert_eq!((status, replayed), (StatusCode::PAYMENT_REQUIRED, true));
    assert_eq!(again, decline);
    let provider = client(url, TEST_BOUND);
    let decline = declined(provider.charge(&declined_request(), "k-no-2").await);
    assert_eq!(decline.code, "card_declined");
    assert_eq!(
        declined(provider.charge(&declined_request(), "k-no-2").await),
        decline
    );
}

#[tokio::test]
async fn the_in_process_provider_answers_a_key_in_flight_with_409() {
    // The first request holds its key for 1.5 s; the others come while it does.
    let url = in_process(Duration::from_millis(1500)).await;
    let provider = client(url.clone(), TEST_BOUND);
    let first = tokio::spawn({
        let provider = provider.clone();
        async move { provider.charge(&request(100), "k-busy").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _, problem) = raw(&url, Some(b"k-busy"), &body(100, SOURCE)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(problem["code"], "request_in_progress");
    let sentence = unknown(provider.charge(&request(100), "k-busy").await);
    assert!(sentence.contains("409"), "{sentence}");
    let charge = first.await.unwrap().unwrap();
    assert_eq!(
        provider.charge(&request(100), "k-busy").await.unwrap(),
        charge
    );
}

#[tokio::test]
async fn the_in_process_provider_keeps_a_charge_whose_client_gave_up() {
    // The charge takes 1 s; its client gives up after 300 ms.
    let url = in_process(Duration::from_secs(1)).await;
    let impatient = client(url.clone(), Duration::from_millis(300));
    let sentence = unknown(impatient.charge(&request(100), "k-gone").await);
    assert!(sentence.contains("did not answer within"), "{sentence}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (status, replayed, charge) = raw(&url, Some(b"k-gone"), &body(100, SOURCE)).await;
    assert_eq!((status, replayed), (StatusCode::OK, true), "{charge}");
}
