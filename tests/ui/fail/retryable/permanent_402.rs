//! A declined payment (402) is declined again on every try: permanent, not retryable.
#![allow(unused)]
use axum::{Json, http::StatusCode};
use serde::Deserialize;

#[derive(Deserialize)]
struct CreateCharge {
    customer_id: String,
    amount: u64,
}

async fn charge_status() -> StatusCode {
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
    retryable = [402, 503],
    concurrency = conflict,
    status_lookup = charge_status,
    recovery = reconcile,
)]
async fn create_charge(Json(charge): Json<CreateCharge>) -> StatusCode {
    StatusCode::CREATED
}

fn main() {}
