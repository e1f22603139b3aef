#![allow(unused)]
use axum::{Json, http::StatusCode};
use serde::Deserialize;

#[derive(Deserialize)]
struct CreatePayment {
    source: String,
    amount_minor: i64,
}

async fn payment_status() -> StatusCode {
    StatusCode::OK
}

#[idem::contract(
    key_scope = client,
    fingerprint = [source, amount_minor],
    ttl = "24h",
    deadline = "30s",
    max_attempts = 4,
    retryable = [429, 503, timeout],
    concurrency = conflict,
    status_lookup = payment_status,
    recovery = resume,
)]
async fn create_payment(Json(payment): Json<CreatePayment>) -> StatusCode {
    StatusCode::CREATED
}

fn main() {}
