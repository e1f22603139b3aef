//! The HTTP API: `POST /orders` under its idempotency contract, `GET /orders/{id}`, and
//! the contract's status lookup `GET /orders/operations/{key}`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use sqlx::SqlitePool;

use crate::db;
use crate::model::{CreateOrder, Order};
use crate::problem::ApiError;

/// The header that says who the client is: a stand-in for real authentication. A real
/// service takes the identity from its authentication (a verified token's subject).
pub const CLIENT_ID_HEADER: &str = "x-client-id";

/// The service's state.
#[derive(Clone)]
pub struct App {
    /// The database of orders (and of idem's records), for reads: orders are written in
    /// the attempt's transaction.
    pub db: SqlitePool,
    /// Demo settings that make failures visible from curl.
    pub demo: Arc<Demo>,
}

/// Settings that make the failure cases visible from a terminal. All off by default.
#[derive(Debug, Default)]
pub struct Demo {
    /// Every `POST /orders` waits this long after writing the order (inside its
    /// transaction, not committed yet) and before answering. Past the attempt's time (9 s
    /// of the contract's 10 s per-attempt timeout; the rest is kept to record the outcome)
    /// the attempt is stopped and everything it wrote is rolled back.
    pub delay: Duration,
    /// The next N `POST /orders` answer 503 before writing anything, as if the payment
    /// provider were down; 503 is retryable, so the key is released and a retry runs.
    pub outage: AtomicU32,
}

fn unix_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn created(order: Order) -> Response {
    let location = HeaderValue::from_str(&format!("/orders/{}", order.id)).ok();
    let mut response = (StatusCode::CREATED, Json(order)).into_response();
    if let Some(location) = location {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

/// `POST /orders`: creates an order, at most once per idempotency key.
///
/// The order is written in `tx`, the attempt's transaction, and idem commits it together
/// with the key's final state: an order without its record, or a record without its
/// order, cannot happen. `attempt` carries the operation's id (written with the order, so
/// that the reconcile function finds it), the client and the key, as idem checked them.
#[idem::contract(
    key_scope     = client,
    fingerprint   = [customer_id, currency, amount_minor, items],
    ttl           = "24h",
    deadline      = ("30s", per_attempt = "10s"),
    max_attempts  = 4,
    retryable     = [429, 503, 504, timeout, connection_reset],
    concurrency   = conflict,
    status_lookup = order_operation_status(path = "/orders/operations/{key}"),
    recovery      = reconcile_create_order,
)]
pub async fn create_order(
    State(app): State<App>,
    attempt: idem::Attempt,
    tx: idem::SqliteTx,
    Json(body): Json<CreateOrder>,
) -> Result<Response, ApiError> {
    body.validate().map_err(ApiError::InvalidOrder)?;
    let outage = app
        .demo
        .outage
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    if outage.is_ok() {
        return Err(ApiError::ProviderUnavailable);
    }
    let order = db::insert(&mut *tx.conn().await?, &attempt, &body, unix_millis()).await?;
    if !app.demo.delay.is_zero() {
        tokio::time::sleep(app.demo.delay).await;
    }
    Ok(created(order))
}

/// `GET /orders/{id}`: one of the client's orders.
pub async fn get_order(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Order>, ApiError> {
    let client = headers
        .get(CLIENT_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or(ApiError::NotFound)?;
    db::by_id(&app.db, client, &id)
        .await?
        .map(Json)
        .ok_or(ApiError::NotFound)
}

/// `GET /orders/operations/{key}`: the state of the client's `create_order` operation
/// under `key`, for a client whose answer was lost.
pub async fn order_operation_status(
    lookup: idem::Lookup<create_order::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

/// Decides a `create_order` whose outcome is unknown (its process died while the attempt
/// ran): the operation's order exists, or it does not. In the transactional mode an order
/// is committed only with its record, so an attempt that died left none; the check still
/// reads the table rather than assume it.
pub async fn reconcile_create_order(app: App, op: idem::UnknownOperation) -> idem::Resolution {
    match db::by_operation(&app.db, &op.operation_id.to_string()).await {
        Ok(Some(order)) => idem::Resolution::applied(created(order)),
        Ok(None) => idem::Resolution::NotApplied,
        // The table could not be read now: the next retry asks again.
        Err(error) => idem::Resolution::cannot_decide_now(format!(
            "the orders table could not be read: {error}"
        )),
    }
}

/// The routes, with idem's layer; the caller supplies the state.
pub fn router(idem: &idem::Idem) -> Router<App> {
    Router::new()
        .route("/orders", post(create_order))
        .route("/orders/{id}", get(get_order))
        .route("/orders/operations/{key}", get(order_operation_status))
        .layer(idem.layer())
}
