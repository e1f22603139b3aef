//! Extractors after the request body (`Json(body)` must come last): one error at each
//! misplaced argument, saying where it goes, and nothing from axum's `Handler` bound on
//! the routes (`idem::Attempt`, which the macro passes in, may come anywhere).
#![allow(unused)]
use axum::{Json, Router, extract::State, http::StatusCode, routing::post};
use serde::Deserialize;

#[derive(Clone)]
struct App;

#[derive(Deserialize)]
struct RenewSubscription {
    plan: String,
}

async fn renewal_status() -> StatusCode {
    StatusCode::OK
}

async fn reconcile(_: idem::UnknownOperation) -> idem::Decision {
    idem::Decision::NotApplied
}

#[idem::contract(
    key_scope = client, fingerprint = [plan], ttl = "24h", deadline = "30s",
    max_attempts = 4, retryable = [503], concurrency = conflict, status_lookup = renewal_status,
    recovery = reconcile,
)]
async fn renew(attempt: idem::Attempt, Json(body): Json<RenewSubscription>, tx: idem::PgTx) -> StatusCode {
    StatusCode::CREATED
}

#[idem::contract(
    key_scope = client, fingerprint = [plan], ttl = "24h", deadline = "30s",
    max_attempts = 4, retryable = [503], concurrency = conflict, status_lookup = renewal_status,
    recovery = reconcile,
)]
async fn renew_with_state(
    Json(body): Json<RenewSubscription>,
    attempt: idem::Attempt,
    State(app): State<App>,
) -> StatusCode {
    StatusCode::CREATED
}

fn main() {
    let _app: Router = Router::new()
        .route("/a", post(renew))
        .route("/b", post(renew_with_state))
        .with_state(App);
}
