//! A handler that takes `idem::Attempt` (anywhere in its arguments, passed in by the
//! macro) and a camelCase body: the fingerprint follows serde's wire names.
use axum::{Json, Router, extract::State, http::StatusCode, routing::post};
use serde::Deserialize;

#[derive(Clone, Default)]
struct App;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateOrder {
    customer_id: String,
    amount_minor: i64,
}

async fn order_status() -> StatusCode {
    StatusCode::OK
}

async fn reconcile(_app: App, op: idem::UnknownOperation) -> idem::Decision {
    let _ = (op.client, op.key);
    idem::Decision::NotApplied
}

#[idem::contract(
    key_scope = client,
    fingerprint = [customer_id, amount_minor],
    ttl = "24h",
    deadline = "30s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = reconcile,
)]
async fn create_order(
    attempt: idem::Attempt,
    State(_app): State<App>,
    Json(order): Json<CreateOrder>,
) -> (StatusCode, String) {
    let _ = (order.customer_id, order.amount_minor);
    (
        StatusCode::CREATED,
        format!("{} {} {}", attempt.client, attempt.key, attempt.attempt),
    )
}

/// The `Attempt` last, after the body.
#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "24h",
    deadline = "30s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = manual("https://runbooks.example.com/orders"),
)]
async fn attempt_last(body: String, attempt: idem::Attempt) -> String {
    format!("{body} {}", attempt.operation_id)
}

/// Only the `Attempt`.
#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "24h",
    deadline = "30s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = manual("https://runbooks.example.com/orders"),
)]
async fn attempt_only(attempt: idem::Attempt) -> String {
    attempt.operation
}

fn main() {
    let _app: Router = Router::new()
        .route("/orders", post(create_order))
        .route("/last", post(attempt_last))
        .route("/only", post(attempt_only))
        .with_state(App);
}
