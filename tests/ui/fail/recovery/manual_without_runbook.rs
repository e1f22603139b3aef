#![allow(unused)]
use axum::{Json, http::StatusCode};
use serde::Deserialize;

#[derive(Deserialize)]
struct CreateOrder {
    customer_id: String,
    amount: u64,
}

async fn order_status() -> StatusCode {
    StatusCode::OK
}

async fn reconcile(_: idem::UnknownOperation) -> idem::Decision {
    idem::Decision::NotApplied
}

#[idem::contract(
    key_scope = client,
    fingerprint = [customer_id, amount],
    ttl = "24h",
    deadline = "30s",
    max_attempts = 4,
    retryable = [429, 503, timeout],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = manual(""),
)]
async fn create_order(Json(order): Json<CreateOrder>) -> StatusCode {
    StatusCode::CREATED
}

fn main() {}
