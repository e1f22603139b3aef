//! A misspelt fingerprint field on a body extractor under another name: rustc's own error
//! at the field, once.
#![allow(unused)]
use axum::{Json as J, http::StatusCode};
use serde::Deserialize;

#[derive(Deserialize)]
struct CreateTransfer {
    amount: u64,
}

async fn transfer_status() -> StatusCode {
    StatusCode::OK
}

#[idem::contract(
    key_scope = client,
    fingerprint = [amout],
    ttl = "24h",
    deadline = "30s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = transfer_status,
    recovery = manual("https://runbooks.example.com/transfers"),
)]
async fn create_transfer(attempt: idem::Attempt, J(t): J<CreateTransfer>) -> StatusCode {
    StatusCode::CREATED
}

fn main() {}
