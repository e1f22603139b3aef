//! A contracted handler in a crate that depends on `idem` under the name `contracts`.
//! The macro expands to paths through `::contracts`, found in this crate's Cargo.toml.

use axum::{
    Json, Router,
    extract::Path,
    http::StatusCode,
    routing::{get, post},
};
use serde::Deserialize;

/// The body of `POST /orders`.
#[derive(Deserialize)]
pub struct CreateOrder {
    /// Amount in minor units.
    pub amount: u64,
}

/// The status lookup of `create_order`.
pub async fn order_status(
    lookup: contracts::Lookup<create_order::Operation>,
    Path(key): Path<String>,
) -> contracts::OperationStatus {
    lookup.status(&key).await
}

/// Creates an order.
#[contracts::contract(
    key_scope = client,
    fingerprint = [amount],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 3,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status(path = "/orders/operations/{key}"),
    recovery = manual("https://runbooks.example.com/orders"),
)]
pub async fn create_order(Json(order): Json<CreateOrder>) -> (StatusCode, String) {
    (StatusCode::CREATED, format!("amount {}", order.amount))
}

/// The service: the contracted route, its status lookup and idem's layer.
pub fn app() -> Router {
    let idem = contracts::Idem::new(
        contracts::MemoryStore::new(),
        contracts::identity::header("x-client-id"),
    );
    Router::new()
        .route("/orders", post(create_order))
        .route("/orders/operations/{key}", get(order_status))
        .layer(idem.layer())
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    fn request() -> Request<Body> {
        Request::post("/orders")
            .header("content-type", "application/json")
            .header("x-client-id", "client-a")
            .header("idempotency-key", "k-1")
            .body(Body::from(r#"{"amount": 100}"#))
            .unwrap()
    }

    #[tokio::test]
    async fn the_renamed_crate_enforces_the_contract() {
        let app = super::app();
        let first = app.clone().oneshot(request()).await.unwrap();
        assert_eq!(first.status(), 201);
        assert!(first.headers().get("idempotent-replayed").is_none());
        let second = app.oneshot(request()).await.unwrap();
        assert_eq!(second.status(), 201);
        assert_eq!(second.headers()["idempotent-replayed"], "true");
        assert_eq!(
            second.into_body().collect().await.unwrap().to_bytes(),
            "amount 100"
        );
        assert_eq!(super::create_order::CONTRACT.operation, "create_order");
    }
}
