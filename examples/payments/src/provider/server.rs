//! The in-process provider: an axum router that speaks the provider's protocol and
//! deduplicates on the idempotency key, so that the service runs with nothing else.
//!
//! The first request with a key decides: a source that starts with
//! [`DECLINED_SOURCE_PREFIX`] is declined (402), any other is charged (201, `ch_<uuid>`).
//! The answer is stored under the key for the process's life (in memory, with no expiry:
//! a demo, not a ledger) and a later request with the key gets it again: 200 with the same
//! id (402 for a decline), with `Idempotent-Replayed: true`. The same key with a different
//! request is 422 `idempotency_key_reused`; the same key while its first request is still
//! running is 409 `request_in_progress`. A key that is not 1 to 255 visible ASCII
//! characters is 400 `invalid_idempotency_key`; a body that is not a [`ChargeRequest`]
//! (or has an amount below 1, a currency that is not three capital letters, or an empty
//! source) is 400 `invalid_request`. Bodies are bounded by axum's default limit (2 MB).
//!
//! A decided charge is completed and stored even when its client has gone: the charge is
//! made in a task of its own, as a real provider's would be.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Json, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem::headers::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use reqwest::Url;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::{CHARGES_PATH, Charge, ChargeRequest, Decline, MAX_KEY_LEN, is_valid_key};

/// A `source` that starts with this is declined (402 `card_declined`), such as
/// `card_declined` or `card_declined_insufficient_funds`: the way to see a decline.
pub const DECLINED_SOURCE_PREFIX: &str = "card_declined";

/// What the provider holds under one key.
enum Entry {
    /// The first request is being decided.
    InFlight(ChargeRequest),
    /// Decided: the request and its answer (status and JSON body).
    Done(ChargeRequest, StatusCode, Bytes),
}

/// The provider's state: the answers by key, and how long a charge takes.
struct Ledger {
    keys: Mutex<HashMap<String, Entry>>,
    latency: Duration,
}

/// What a request with a known key gets.
enum Claim {
    /// The key is new: this request decides.
    New,
    /// The stored answer.
    Replay(StatusCode, Bytes),
    /// The key's first request is still running.
    InFlight,
    /// The key was used with another request.
    Reused,
}

impl Ledger {
    fn claim(&self, key: &str, request: &ChargeRequest) -> Claim {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        match keys.get(key) {
            None => {
                keys.insert(key.to_owned(), Entry::InFlight(request.clone()));
                Claim::New
            }
            Some(Entry::InFlight(first) | Entry::Done(first, ..)) if first != request => {
                Claim::Reused
            }
            Some(Entry::InFlight(_)) => Claim::InFlight,
            Some(Entry::Done(_, status, body)) => Claim::Replay(*status, body.clone()),
        }
    }

    fn settle(&self, key: String, request: ChargeRequest, status: StatusCode, body: Bytes) {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.insert(key, Entry::Done(request, status, body));
    }
}

/// The provider's routes: `POST /charges`. Each new charge takes `latency` before it is
/// decided and answered (zero for the service; a test holds a key in flight with it).
pub fn router(latency: Duration) -> Router {
    let ledger = Arc::new(Ledger {
        keys: Mutex::new(HashMap::new()),
        latency,
    });
    Router::new()
        .route(&format!("/{CHARGES_PATH}"), post(create_charge))
        .with_state(ledger)
}

/// Serves [`router`] on `listener` until the task is dropped or aborted.
///
/// # Errors
///
/// The listener's error.
pub async fn serve(listener: TcpListener, latency: Duration) -> io::Result<()> {
    axum::serve(listener, router(latency)).await
}

/// Starts the in-process provider on a free port of 127.0.0.1, with no latency, in a task
/// of its own, and returns its base URL (`http://127.0.0.1:<port>/`) and the task (abort it
/// to stop the provider).
///
/// # Errors
///
/// When no port of 127.0.0.1 can be bound.
pub async fn spawn_in_process() -> io::Result<(Url, JoinHandle<io::Result<()>>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let url = Url::parse(&format!("http://{addr}")).map_err(io::Error::other)?;
    Ok((url, tokio::spawn(serve(listener, Duration::ZERO))))
}

/// `POST /charges`.
async fn create_charge(
    State(ledger): State<Arc<Ledger>>,
    headers: HeaderMap,
    body: Result<Json<ChargeRequest>, JsonRejection>,
) -> Response {
    let Some(key) = headers
        .get(IDEMPOTENCY_KEY)
        .and_then(|v| v.to_str().ok())
        .filter(|key| is_valid_key(key))
    else {
        let message = format!(
            "The {IDEMPOTENCY_KEY} header must be 1 to {MAX_KEY_LEN} visible ASCII characters."
        );
        return problem(StatusCode::BAD_REQUEST, "invalid_idempotency_key", &message);
    };
    let request = match body {
        Ok(Json(request)) => request,
        Err(rejection) => {
            let message = rejection.body_text();
            return problem(StatusCode::BAD_REQUEST, "invalid_request", &message);
        }
    };
    if let Some(message) = invalid(&request) {
        return problem(StatusCode::BAD_REQUEST, "invalid_request", message);
    }
    match ledger.claim(key, &request) {
        Claim::New => {}
        Claim::Replay(status, body) => return answer(status, body, true),
        Claim::InFlight => {
            let message = "A request with this key is still running; retry later.";
            return problem(StatusCode::CONFLICT, "request_in_progress", message);
        }
        Claim::Reused => {
            let message = "This key was used with another request.";
            return problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                message,
            );
        }
    }
    // Decided and stored in a task of its own: a client that goes meanwhile loses the
    // answer, not the charge.
    let key = key.to_owned();
    let decided = tokio::spawn(async move {
        tokio::time::sleep(ledger.latency).await;
        let (status, body) = decide(&request);
        ledger.settle(key, request, status, body.clone());
        (status, body)
    });
    match decided.await {
        Ok((status, body)) => answer(status, body, false),
        Err(_) => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "The charge could not be decided.",
        ),
    }
}

/// What is wrong with `request`, if anything.
fn invalid(request: &ChargeRequest) -> Option<&'static str> {
    if request.amount_minor < 1 {
        Some("amount_minor must be at least 1.")
    } else if request.currency.len() != 3
        || !request.currency.bytes().all(|b| b.is_ascii_uppercase())
    {
        Some("currency must be an ISO 4217 code such as EUR.")
    } else if request.source.is_empty() {
        Some("source must not be empty.")
    } else {
        None
    }
}

/// The new key's answer: a decline for a source that asks for one, else a new charge.
fn decide(request: &ChargeRequest) -> (StatusCode, Bytes) {
    if request.source.starts_with(DECLINED_SOURCE_PREFIX) {
        let decline = Decline {
            code: "card_declined".to_owned(),
            message: "The card was declined.".to_owned(),
        };
        (StatusCode::PAYMENT_REQUIRED, to_body(&decline))
    } else {
        let charge = Charge {
            id: format!("ch_{}", uuid::Uuid::now_v7().simple()),
        };
        (StatusCode::CREATED, to_body(&charge))
    }
}

fn to_body(value: &impl serde::Serialize) -> Bytes {
    // Two string fields always serialise.
    Bytes::from(serde_json::to_vec(value).unwrap_or_default())
}

/// A stored answer: a charge is 201 the first time and 200 when replayed.
fn answer(status: StatusCode, body: Bytes, replayed: bool) -> Response {
    let status = if replayed && status == StatusCode::CREATED {
        StatusCode::OK
    } else {
        status
    };
    let mut response = (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response();
    if replayed {
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

/// An answer that is not a charge: `{"code": …, "message": …}`.
fn problem(status: StatusCode, code: &str, message: &str) -> Response {
    (status, Json(json!({ "code": code, "message": message }))).into_response()
}
