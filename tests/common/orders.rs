//! The orders service that several test binaries serve: `create_order` (`POST /orders`)
//! and its status lookup `order_status` (`GET /orders/operations/{key}`), and two more
//! operations served beside them, `echo` (the whole body is significant) and `pay` (the
//! key is a member of the body).
//!
//! Their state is a [`Counter`] of their runs, all handlers together; an app state with
//! more in it lends its counter through `FromRef`.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};

use super::counter::Counter;

#[derive(Deserialize)]
pub struct CreateOrder {
    pub customer_id: String,
    pub amount: i64,
    /// How long the handler waits before it answers (not part of the fingerprint).
    #[serde(default)]
    pub delay_ms: u64,
}

/// Counts its run, waits `delay_ms`, and answers 201 with the run's number.
#[idem::contract(
    key_scope = client,
    fingerprint = [customer_id, amount],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 3,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status(path = "/orders/operations/{key}"),
    recovery = manual("https://runbooks.example.com/orders"),
)]
pub async fn create_order(
    State(runs): State<Counter>,
    Json(order): Json<CreateOrder>,
) -> impl IntoResponse {
    let n = runs.bump();
    tokio::time::sleep(Duration::from_millis(order.delay_ms)).await;
    (
        StatusCode::CREATED,
        Json(json!({ "order": n, "customer_id": order.customer_id, "amount": order.amount })),
    )
}

pub async fn order_status(
    lookup: idem::Lookup<create_order::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

/// Any JSON body, all of it significant.
#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1h",
    deadline = "10s",
    max_attempts = 3,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = manual("https://runbooks.example.com/echo"),
)]
pub async fn echo(State(runs): State<Counter>, Json(_body): Json<Value>) -> impl IntoResponse {
    (StatusCode::CREATED, Json(json!({ "run": runs.bump() })))
}

#[derive(Deserialize)]
pub struct Payment {
    pub client_reference: String,
    pub amount: i64,
}

/// The key is a member of the body: `key_scope = client(body = client_reference)`.
#[idem::contract(
    key_scope = client(body = client_reference),
    fingerprint = [amount],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 3,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = manual("https://runbooks.example.com/payments"),
)]
pub async fn pay(State(runs): State<Counter>, Json(payment): Json<Payment>) -> impl IntoResponse {
    let n = runs.bump();
    (
        StatusCode::CREATED,
        Json(
            json!({ "payment": n, "reference": payment.client_reference, "amount": payment.amount }),
        ),
    )
}
