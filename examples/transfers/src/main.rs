use axum::{
    Json, Router,
    extract::Path,
    http::StatusCode,
    routing::{get, post},
};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct CreateTransfer {
    from: String,
    to: String,
    amount_minor: u64,
}

#[derive(Serialize)]
struct Transfer {
    id: String,
    from: String,
    to: String,
    amount_minor: u64,
}

/// `POST /transfers`: moves money at most once per idempotency key.
#[idem::contract(
    key_scope     = client,                       // the Idempotency-Key header, per client
    fingerprint   = [from, to, amount_minor],     // a retry must carry the same values
    ttl           = "24h",
    deadline      = ("30s", per_attempt = "10s"),
    max_attempts  = 3,
    retryable     = [429, 503, timeout],
    concurrency   = conflict,                     // a duplicate in flight gets 409 + Retry-After
    status_lookup = transfer_status(path = "/transfers/operations/{key}"),
    recovery      = manual("https://runbooks.example.com/transfers"),
)]
async fn create_transfer(
    attempt: idem::Attempt,
    Json(body): Json<CreateTransfer>,
) -> (StatusCode, Json<Transfer>) {
    // Move the money here, and record `attempt.operation_id` with it.
    let transfer = Transfer {
        id: format!("tr_{}", attempt.operation_id),
        from: body.from,
        to: body.to,
        amount_minor: body.amount_minor,
    };
    (StatusCode::CREATED, Json(transfer))
}

/// `GET /transfers/operations/{key}`: what became of the client's transfer under `key`.
async fn transfer_status(
    lookup: idem::Lookup<create_transfer::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let store = idem::MemoryStore::new(); // or idem::SqliteStore / idem::PostgresStore
    let idem = idem::Idem::new(store, idem::identity::header("x-client-id"));
    let app = Router::new()
        .route("/transfers", post(create_transfer))
        .route("/transfers/operations/{key}", get(transfer_status))
        .layer(idem.layer());
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3002".into());
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    // `idem::serve` closes a connection whose request head has not come within 10 s.
    idem::serve(listener, app).await
}
