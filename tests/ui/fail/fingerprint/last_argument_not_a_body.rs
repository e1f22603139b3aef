//! Fingerprint fields, and the last argument is an extractor idem cannot read fields from
//! (a wrapper of the user's own): one error, at that argument, that says what to write.
#![allow(unused)]
use axum::{extract::{FromRequest, Request}, http::StatusCode};
use serde::Deserialize;

#[derive(Deserialize)]
struct CreateTransfer {
    amount: u64,
}

struct Validated<T>(T);

impl<S: Send + Sync, T: Send> FromRequest<S> for Validated<T> {
    type Rejection = StatusCode;
    async fn from_request(_: Request, _: &S) -> Result<Self, StatusCode> {
        Err(StatusCode::BAD_REQUEST)
    }
}

async fn transfer_status() -> StatusCode {
    StatusCode::OK
}

#[idem::contract(
    key_scope = client,
    fingerprint = [amount],
    ttl = "24h",
    deadline = "30s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = transfer_status,
    recovery = manual("https://runbooks.example.com/transfers"),
)]
async fn create_transfer(Validated(t): Validated<CreateTransfer>) -> StatusCode {
    StatusCode::CREATED
}

fn main() {}
