//! Handlers of the transactional mode (`idem::PgTx`; `idem::SqliteTx` is the same
//! `idem::transaction::Tx<DB>` on SQLite) that also take `idem::Attempt`, each with one
//! mistake in its contract, routed: one error each. (The package builds idem without
//! SQLite, so that trybuild does not compile SQLite's C code again.)
#![allow(unused)]
use axum::{Json, Router, http::StatusCode, routing::post};
use serde::Deserialize;

#[derive(Deserialize)]
struct CreatePayment {
    amount: u64,
}

async fn payment_status() -> StatusCode {
    StatusCode::OK
}

async fn reconcile(_: idem::UnknownOperation) -> idem::Decision {
    idem::Decision::NotApplied
}

#[idem::contract(
    key_scope = client, fingerprint = [amount], ttl = "24h", deadline = "30s",
    max_attempts = 4, retryable = [503, 404], concurrency = conflict, status_lookup = payment_status,
    recovery = reconcile,
)]
async fn generic(attempt: idem::Attempt, tx: idem::transaction::Tx<sqlx::Postgres>, Json(p): Json<CreatePayment>) -> StatusCode {
    let _conn = tx.conn().await;
    StatusCode::CREATED
}

#[idem::contract(
    key_scope = client, fingerprint = [amount], ttl = "24h", deadline = "30s",
    max_attempts = 4, retryable = [503], concurrency = conflict, status_lookup = payment_status,
)]
async fn on_postgres(attempt: idem::Attempt, tx: idem::PgTx, Json(p): Json<CreatePayment>) -> StatusCode {
    let _conn = tx.conn().await;
    StatusCode::CREATED
}

fn main() {
    let _app: Router = Router::new()
        .route("/a", post(generic))
        .route("/b", post(on_postgres));
}
