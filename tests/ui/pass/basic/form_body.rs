//! A handler that takes a form body (`Form<T>`): its fingerprint fields are checked
//! against `T`, like those of a JSON body, and a body key may be a form field.
use axum::{Form, extract::Path, http::StatusCode};
use serde::Deserialize;

#[derive(Deserialize)]
struct CreateCharge {
    amount: u64,
    currency: String,
    reference: String,
}

async fn charge_status(
    lookup: idem::Lookup<create_charge::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

#[idem::contract(
    key_scope = client(body = reference),
    fingerprint = [amount, currency],
    ttl = "24h",
    deadline = "30s",
    max_attempts = 4,
    retryable = [429, 503, timeout],
    concurrency = conflict,
    status_lookup = charge_status,
    recovery = manual("https://runbooks.example.com/charges"),
)]
async fn create_charge(Form(charge): Form<CreateCharge>) -> StatusCode {
    let _ = (charge.amount, charge.currency, charge.reference);
    StatusCode::CREATED
}

fn main() {
    let _: axum::Router = axum::Router::new().route("/charges", axum::routing::post(create_charge));
}
