//! A payment provider of the tests' own: the provider's protocol (`POST /charges`,
//! deduplicated on the idempotency key, a source starting with `card_declined` declined)
//! on a free port of 127.0.0.1 in the test process. It counts the charges it makes and the
//! requests it gets per key, and misbehaves when told to ([`Fault`]).
//!
//! It is not the service's in-process provider (`payments::provider::router`), so that a
//! test of the client against it does not test one implementation against itself. Each
//! connection is served by hyper directly, so that a connection can be closed without an
//! answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use payments::provider::{Charge, ChargeRequest, DECLINED_SOURCE_PREFIX, Decline};
use reqwest::Url;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};

/// The longest a [`Fault::Hang`] holds a request (its client gives up long before).
pub const HANG_AT_MOST: Duration = Duration::from_secs(60);

/// A way to misbehave, for the next requests or for a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Decide as usual (charge a new key, or find the key's answer), then close the
    /// connection without answering: the answer is lost, the charge is not.
    LoseAnswer,
    /// Answer 503 `unavailable` without charging or reading the body.
    Unavailable,
    /// Hold the request without answering and without charging until the client gives
    /// up (at most [`HANG_AT_MOST`], then 503).
    Hang,
    /// Decline a new key (402 `card_declined`, stored under the key and replayed like any
    /// decline). A key that has an answer gets it again.
    Decline,
}

/// How long a fault lasts.
#[derive(Clone, Copy, Debug)]
enum Span {
    /// For this many more requests (at least 1).
    Next(u32),
    /// For requests that come before this instant.
    Until(Instant),
}

/// What the provider knows of one key.
#[derive(Default)]
struct Key {
    requests: u32,
    charges: u32,
    answer: Option<(ChargeRequest, StatusCode, Bytes)>,
}

/// The provider's books: the keys, the charges made, the fault in force.
#[derive(Default)]
struct Books {
    keys: HashMap<String, Key>,
    total_charges: u32,
    fault: Option<(Fault, Span)>,
}

impl Books {
    /// The fault for the request that just came, if any, counting it down.
    fn take_fault(&mut self) -> Option<Fault> {
        let (fault, span) = self.fault.take()?;
        match span {
            Span::Next(n) => {
                if n > 1 {
                    self.fault = Some((fault, Span::Next(n - 1)));
                }
                Some(fault)
            }
            Span::Until(until) if Instant::now() < until => {
                self.fault = Some((fault, span));
                Some(fault)
            }
            Span::Until(_) => None,
        }
    }

    /// The answer to `request` under `key`: the stored one, 422 for another request, or a
    /// new decision (a decline when `decline` or the source asks for one, else a charge).
    fn decide(&mut self, key: &str, request: ChargeRequest, decline: bool) -> (StatusCode, Bytes) {
        let entry = self.keys.entry(key.to_owned()).or_default();
        match &entry.answer {
            Some((first, ..)) if *first != request => {
                return (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    error_body("idempotency_key_reused"),
                );
            }
            Some((_, StatusCode::CREATED, body)) => return (StatusCode::OK, body.clone()),
            Some((_, status, body)) => return (*status, body.clone()),
            None => {}
        }
        let (status, body) = if decline || request.source.starts_with(DECLINED_SOURCE_PREFIX) {
            let decline = Decline {
                code: "card_declined".into(),
                message: "The card was declined.".into(),
            };
            (StatusCode::PAYMENT_REQUIRED, to_body(&decline))
        } else {
            entry.charges += 1;
            self.total_charges += 1;
            let charge = Charge {
                id: format!("ch_test_{}", self.total_charges),
            };
            (StatusCode::CREATED, to_body(&charge))
        };
        entry.answer = Some((request, status, body.clone()));
        (status, body)
    }
}

/// The provider's state, shared by its connections and the test.
type Shared = Arc<Mutex<Books>>;

/// What a handler knows of its connection: how to close it without answering.
#[derive(Clone)]
struct Connection {
    lose: Arc<Notify>,
}

/// The running provider; it stops, and closes its connections, when dropped.
pub struct TestProvider {
    url: Url,
    books: Shared,
    task: JoinHandle<()>,
}

impl TestProvider {
    /// Listens on a free port of 127.0.0.1.
    pub async fn start() -> TestProvider {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let addr = listener.local_addr().expect("a bound address");
        let books = Shared::default();
        let router = Router::new()
            .route("/charges", post(create_charge))
            .with_state(Arc::clone(&books));
        TestProvider {
            url: Url::parse(&format!("http://{addr}")).expect("a URL"),
            books,
            task: tokio::spawn(accept(listener, router)),
        }
    }

    /// The base URL, `http://127.0.0.1:<port>`.
    pub fn url(&self) -> Url {
        self.url.clone()
    }

    /// Misbehave with `fault` for the next `n` requests (of any key).
    pub fn fail_next(&self, fault: Fault, n: u32) {
        self.books().fault = (n > 0).then_some((fault, Span::Next(n)));
    }

    /// Misbehave with `fault` for every request that comes within `duration` from now.
    pub fn fail_for(&self, fault: Fault, duration: Duration) {
        self.books().fault = Some((fault, Span::Until(Instant::now() + duration)));
    }

    /// How many charges `key` made (0 or 1, unless deduplication is broken).
    pub fn charges(&self, key: &str) -> u32 {
        self.books().keys.get(key).map_or(0, |k| k.charges)
    }

    /// How many charges all keys made.
    pub fn total_charges(&self) -> u32 {
        self.books().total_charges
    }

    /// How many requests came with `key`, whatever their answer.
    pub fn requests(&self, key: &str) -> u32 {
        self.books().keys.get(key).map_or(0, |k| k.requests)
    }

    fn books(&self) -> MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for TestProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves each connection with hyper; a handler that loses its answer closes it.
async fn accept(listener: TcpListener, router: Router) {
    // Dropped with this task: the connections close with the provider.
    let mut connections = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        while connections.try_join_next().is_some() {}
        let lose = Arc::new(Notify::new());
        let connection = Connection {
            lose: Arc::clone(&lose),
        };
        let service = TowerToHyperService::new(router.clone().layer(Extension(connection)));
        connections.spawn(async move {
            let served = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = served => {}
                () = lose.notified() => {}
            }
        });
    }
}

/// `POST /charges`.
async fn create_charge(
    State(books): State<Shared>,
    Extension(connection): Extension<Connection>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| (1..=255).contains(&k.len()) && k.bytes().all(|b| b.is_ascii_graphic()))
    else {
        return answer(
            StatusCode::BAD_REQUEST,
            error_body("invalid_idempotency_key"),
        );
    };
    let fault = {
        let mut books = books.lock().unwrap_or_else(PoisonError::into_inner);
        books.keys.entry(key.to_owned()).or_default().requests += 1;
        books.take_fault()
    };
    match fault {
        Some(Fault::Unavailable) => {
            return answer(StatusCode::SERVICE_UNAVAILABLE, error_body("unavailable"));
        }
        Some(Fault::Hang) => {
            tokio::time::sleep(HANG_AT_MOST).await;
            return answer(StatusCode::SERVICE_UNAVAILABLE, error_body("unavailable"));
        }
        _ => {}
    }
    let Ok(request) = serde_json::from_slice::<ChargeRequest>(&body) else {
        return answer(StatusCode::BAD_REQUEST, error_body("invalid_request"));
    };
    let (status, body) = books.lock().unwrap_or_else(PoisonError::into_inner).decide(
        key,
        request,
        fault == Some(Fault::Decline),
    );
    if fault == Some(Fault::LoseAnswer) {
        connection.lose.notify_one();
        std::future::pending::<()>().await;
    }
    answer(status, body)
}

fn answer(status: StatusCode, body: Bytes) -> Response {
    let json = HeaderValue::from_static("application/json");
    (status, [(header::CONTENT_TYPE, json)], body).into_response()
}

fn error_body(code: &str) -> Bytes {
    to_body(&json!({ "code": code, "message": format!("The test provider says {code}.") }))
}

fn to_body(value: &impl serde::Serialize) -> Bytes {
    Bytes::from(serde_json::to_vec(value).expect("JSON"))
}
