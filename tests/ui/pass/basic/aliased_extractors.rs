//! Body extractors under other names (`use axum::Json as J`, `use axum::Form as F`): the
//! fingerprint fields and a body key are checked against the body type all the same, and
//! serde's wire names are followed.
use axum::{Form as F, Json as J, Router, http::StatusCode, routing::post};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateTransfer {
    request_id: String,
    amount_minor: u64,
}

async fn transfer_status() -> StatusCode {
    StatusCode::OK
}

#[idem::contract(
    key_scope = client(body = request_id),
    fingerprint = [amount_minor],
    ttl = "24h",
    deadline = "30s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = transfer_status,
    recovery = manual("https://runbooks.example.com/transfers"),
)]
async fn create_transfer(attempt: idem::Attempt, J(t): J<CreateTransfer>) -> StatusCode {
    let _ = (attempt.key, t.request_id, t.amount_minor);
    StatusCode::CREATED
}

#[idem::contract(
    key_scope = client,
    fingerprint = [amount_minor],
    ttl = "24h",
    deadline = "30s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = transfer_status,
    recovery = manual("https://runbooks.example.com/transfers"),
)]
async fn create_transfer_form(F(t): F<CreateTransfer>) -> StatusCode {
    let _ = t.amount_minor;
    StatusCode::CREATED
}

fn main() {
    use idem::__private::Contracted;
    assert_eq!(
        <create_transfer::Operation as Contracted>::body_fields(),
        Some(&["requestId", "amountMinor"][..])
    );
    let _app: Router = Router::new()
        .route("/transfers", post(create_transfer))
        .route("/transfers/form", post(create_transfer_form));
}
