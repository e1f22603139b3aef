//! The expansion still compiles when the user's scope shadows prelude names (serde's
//! `test_gen.rs`).
#![allow(dead_code, non_camel_case_types)]
use axum::{Json, http::StatusCode};
use serde::Deserialize;

struct Result;
struct Option;
struct Ok;
struct Err;
struct Some;
struct None;
struct Send;
struct Sync;
struct Box;
struct Vec;
struct String;
struct Cow;
struct Future;
struct Clone;
struct Copy;
struct Debug;

#[derive(Deserialize)]
struct CreateOrder {
    customer_id: ::std::string::String,
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
    deadline = ("30s", per_attempt = "5s"),
    max_attempts = 4,
    retryable = [429, 503, timeout],
    concurrency = conflict,
    status_lookup = order_status(path = "/orders/operations/{key}"),
    recovery = reconcile,
)]
async fn create_order(Json(order): Json<CreateOrder>) -> StatusCode {
    let _ = (order.customer_id, order.amount);
    StatusCode::CREATED
}

fn main() {
    let _ = axum::Router::<()>::new().route("/orders", axum::routing::post(create_order));
    let _ = &create_order::CONTRACT;
}
