//! A contracted handler that takes `idem::Lookup` (of another operation) and
//! `idem::Attempt`, and the status lookup of its own broken contract: the contract's one
//! error, and nothing from the routes.
#![allow(unused)]
use axum::{Json, Router, extract::Path, http::StatusCode, routing::{get, post}};
use serde::Deserialize;

#[derive(Deserialize)]
struct CreateRefund {
    amount: u64,
}

async fn refund_status(lookup: idem::Lookup<create_refund::Operation>, Path(key): Path<String>) -> idem::OperationStatus {
    lookup.status(&key).await
}

async fn reconcile(_: idem::UnknownOperation) -> idem::Decision {
    idem::Decision::NotApplied
}

#[idem::contract(
    key_scope = client, fingerprint = [amount], ttl = "24h", deadline = ("30s", per_attempt = "1m"),
    max_attempts = 4, retryable = [503], concurrency = conflict, status_lookup = refund_status,
    recovery = reconcile,
)]
async fn create_refund(
    attempt: idem::Attempt,
    earlier: idem::Lookup<create_refund::Operation>,
    Json(r): Json<CreateRefund>,
) -> StatusCode {
    let _ = earlier.status("other-key").await;
    StatusCode::CREATED
}

fn main() {
    let _app: Router = Router::new()
        .route("/refunds", post(create_refund))
        .route("/refunds/operations/{key}", get(refund_status));
}
