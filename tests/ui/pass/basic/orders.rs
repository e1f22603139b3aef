//! The contract of the README on a handler with state, headers and a JSON body, routed
//! with its status lookup; the companion items are reachable from the handler's path.
use std::sync::Arc;

use axum::{
    Json, Router,
    extract::{Path, State},
    http::{HeaderMap, StatusCode, header},
    response::IntoResponse,
    routing::{get, post},
};
use serde::{Deserialize, Serialize};

#[derive(Clone, Default)]
struct AppState {
    orders: Arc<std::sync::Mutex<Vec<Order>>>,
}

#[derive(Deserialize)]
struct Item {
    sku: String,
    qty: u32,
}

#[derive(Deserialize)]
struct CreateOrder {
    customer_id: String,
    currency: String,
    amount_minor: i64,
    items: Vec<Item>,
}

#[derive(Clone, Serialize)]
struct Order {
    id: u64,
    customer_id: String,
}

#[derive(Debug)]
struct ApiError;

impl IntoResponse for ApiError {
    fn into_response(self) -> axum::response::Response {
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    }
}

async fn order_operation_status(
    lookup: idem::Lookup<create_order::Operation>,
    Path(key): Path<String>,
) -> impl IntoResponse {
    lookup.status(&key).await
}

async fn reconcile_create_order(state: AppState, op: idem::UnknownOperation) -> idem::Decision {
    let orders = state.orders.lock().unwrap();
    match orders.iter().find(|o| o.id.to_string() == op.key) {
        Some(order) => idem::Decision::applied((StatusCode::CREATED, Json(order.clone()))),
        None => idem::Decision::NotApplied,
    }
}

/// Creates an order.
#[idem::contract(
    key_scope     = client,
    fingerprint   = [customer_id, currency, amount_minor, items],
    ttl           = "24h",
    deadline      = ("30s", per_attempt = "10s"),
    max_attempts  = 4,
    retryable     = [429, 503, 504, timeout],
    concurrency   = conflict,
    status_lookup = order_operation_status(path = "/orders/operations/{key}"),
    recovery      = reconcile_create_order,
)]
async fn create_order(
    State(state): State<AppState>,
    _headers: HeaderMap,
    Json(body): Json<CreateOrder>,
) -> Result<(StatusCode, [(header::HeaderName, String); 1], Json<Order>), ApiError> {
    let mut orders = state.orders.lock().map_err(|_| ApiError)?;
    let order = Order {
        id: orders.len() as u64 + 1,
        customer_id: body.customer_id,
    };
    let _ = (
        &body.currency,
        body.amount_minor,
        body.items
            .iter()
            .map(|i| (&i.sku, i.qty))
            .collect::<Vec<_>>(),
    );
    orders.push(order.clone());
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, format!("/orders/{}", order.id))],
        Json(order),
    ))
}

fn main() {
    let idem = idem::Idem::new(
        idem::store::MemoryStore::new(),
        idem::identity::header("x-client-id"),
    );
    let _app: Router = Router::new()
        .route("/orders", post(create_order))
        .route("/orders/operations/{key}", get(order_operation_status))
        .layer(idem.layer())
        .with_state(AppState::default());

    let contract = &create_order::CONTRACT;
    assert_eq!(contract.operation, "create_order");
    assert_eq!(contract.ttl.to_string(), "1d");
    assert_eq!(contract.max_attempts, 4);
    assert!(contract.is_retryable_status(503));
    assert!(!contract.is_retryable_status(422));
    assert_eq!(
        contract.status_lookup.path.as_deref(),
        Some("/orders/operations/{key}")
    );
    assert!(idem::model::check(contract).is_empty());
}
