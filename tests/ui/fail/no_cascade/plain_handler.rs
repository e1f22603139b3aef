//! A contract with two real problems, on a handler that is routed and whose companion
//! items are used: the compile shows those two problems and nothing else.
#![allow(unused)]
use axum::{
    Json, Router,
    extract::Path,
    http::StatusCode,
    routing::{get, post},
};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct CreateOrder {
    customer_id: String,
    amount: u64,
}

#[derive(Serialize)]
struct Order {
    id: u64,
}

async fn order_status(lookup: idem::Lookup<create_order::Operation>, Path(key): Path<String>) -> idem::OperationStatus {
    lookup.status(&key).await
}

async fn reconcile(_: idem::UnknownOperation) -> idem::Decision {
    idem::Decision::NotApplied
}

#[idem::contract(
    key_scope = client,
    fingerprint = [customer_id, amount],
    ttl = "10s",
    deadline = "30s",
    max_attempts = 4,
    retryable = [404, 503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = reconcile,
)]
async fn create_order(Json(order): Json<CreateOrder>) -> Result<(StatusCode, Json<Order>), StatusCode> {
    Ok((StatusCode::CREATED, Json(Order { id: order.amount })))
}

fn main() {
    let _app: Router = Router::new()
        .route("/orders", post(create_order))
        .route("/orders/operations/{key}", get(order_status));
    let _ttl = create_order::CONTRACT.ttl;
}
