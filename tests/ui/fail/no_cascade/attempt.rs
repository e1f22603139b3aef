//! Handlers that take `idem::Attempt` (the shape the README recommends), each with one
//! mistake in its contract, all routed: each mistake gives its one error, and `post(..)`
//! adds none (an `Attempt` is passed in by the macro, not extracted by axum).
#![allow(unused)]
use axum::{Json, Router, extract::State, http::StatusCode, routing::post};
use serde::Deserialize;

#[derive(Clone)]
struct App;

#[derive(Deserialize)]
struct CreateTransfer {
    amount: u64,
}

async fn transfer_status() -> StatusCode {
    StatusCode::OK
}

async fn reconcile(_: idem::UnknownOperation) -> idem::Decision {
    idem::Decision::NotApplied
}

/// A property missing (`recovery`).
#[idem::contract(
    key_scope = client, fingerprint = [amount], ttl = "24h", deadline = "30s",
    max_attempts = 4, retryable = [503], concurrency = conflict, status_lookup = transfer_status,
)]
async fn missing(State(_): State<App>, attempt: idem::Attempt, Json(t): Json<CreateTransfer>) -> StatusCode {
    StatusCode::CREATED
}

/// A property misspelt.
#[idem::contract(
    key_scope = client, fingerprint = [amount], ttl = "24h", deadline = "30s",
    max_attempt = 4, retryable = [503], concurrency = conflict, status_lookup = transfer_status,
    recovery = reconcile,
)]
async fn misspelt(State(_): State<App>, attempt: idem::Attempt, Json(t): Json<CreateTransfer>) -> StatusCode {
    StatusCode::CREATED
}

/// A permanent status declared retryable.
#[idem::contract(
    key_scope = client, fingerprint = [amount], ttl = "24h", deadline = "30s",
    max_attempts = 4, retryable = [404, 503], concurrency = conflict, status_lookup = transfer_status,
    recovery = reconcile,
)]
async fn permanent(State(_): State<App>, attempt: idem::Attempt, Json(t): Json<CreateTransfer>) -> StatusCode {
    StatusCode::CREATED
}

/// A TTL shorter than the deadline.
#[idem::contract(
    key_scope = client, fingerprint = [amount], ttl = "10s", deadline = "30s",
    max_attempts = 4, retryable = [503], concurrency = conflict, status_lookup = transfer_status,
    recovery = reconcile,
)]
async fn short_ttl(State(_): State<App>, attempt: idem::Attempt, Json(t): Json<CreateTransfer>) -> StatusCode {
    StatusCode::CREATED
}

/// A property given twice.
#[idem::contract(
    key_scope = client, fingerprint = [amount], ttl = "24h", ttl = "48h", deadline = "30s",
    max_attempts = 4, retryable = [503], concurrency = conflict, status_lookup = transfer_status,
    recovery = reconcile,
)]
async fn twice(State(_): State<App>, attempt: idem::Attempt, Json(t): Json<CreateTransfer>) -> StatusCode {
    StatusCode::CREATED
}

/// Not `async`.
#[idem::contract(
    key_scope = client, fingerprint = [amount], ttl = "24h", deadline = "30s",
    max_attempts = 4, retryable = [503], concurrency = conflict, status_lookup = transfer_status,
    recovery = reconcile,
)]
fn not_async(State(_): State<App>, attempt: idem::Attempt, Json(t): Json<CreateTransfer>) -> StatusCode {
    StatusCode::CREATED
}

/// `Attempt` last, after the body.
#[idem::contract(
    key_scope = client, fingerprint = [amount], ttl = "24h", deadline = "30s",
    max_attempts = 0, retryable = [503], concurrency = conflict, status_lookup = transfer_status,
    recovery = reconcile,
)]
async fn attempt_last(Json(t): Json<CreateTransfer>, attempt: idem::Attempt) -> StatusCode {
    StatusCode::CREATED
}

fn main() {
    let _app: Router = Router::new()
        .route("/a", post(missing))
        .route("/b", post(misspelt))
        .route("/c", post(permanent))
        .route("/d", post(short_ttl))
        .route("/e", post(twice))
        .route("/f", post(not_async))
        .route("/g", post(attempt_last))
        .with_state(App);
    let _ = (missing::CONTRACT.ttl, not_async::CONTRACT.ttl);
}
