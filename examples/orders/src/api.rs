//! The HTTP API: `POST /orders` under its idempotency contract, `GET /orders/{id}`, and
//! the contract's status lookup `GET /orders/operations/{key}`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use crate::db::{self, Orders};
use crate::model::{CreateOrder, Order};
use crate::problem::ApiError;

/// The header that says who the client is: a stand-in for real authentication. A real
/// service takes the identity from its authentication (a verified token's subject).
pub const CLIENT_ID_HEADER: &str = "x-client-id";

/// The service's state.
#[derive(Clone)]
pub struct App {
    /// The database that holds the orders, for reads (and for writes when
    /// [`App::writes`] is [`Writes::ThroughPool`]).
    pub orders: Orders,
    /// How `POST /orders` writes its order.
    pub writes: Writes,
    /// Demo settings that make failures visible from curl.
    pub demo: Arc<Demo>,
}

/// How `POST /orders` writes its order: decided once, by where idem's records live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writes {
    /// In the attempt's transaction ([`idem::SqliteTx`] or [`idem::PgTx`], by the
    /// database of [`App::orders`]), committed by idem together with the key's final
    /// state: the records live in the same database as the orders, and the handle was
    /// made with `Idem::transactional`.
    InTransaction,
    /// Through the pool, committed on its own before idem records the answer: the records
    /// live elsewhere (in memory, in Redis). A crash between the two leaves the outcome
    /// unknown, and [`reconcile_create_order`] decides it from the orders table.
    ThroughPool,
}

/// Where `create_order` writes its order: the attempt's transaction or the pool, as
/// [`App::writes`] says. An axum extractor, taken before the body: in the transactional
/// mode it extracts [`idem::SqliteTx`] or [`idem::PgTx`], which registers the
/// transaction with idem for this request.
pub enum OrderWriter {
    /// The attempt's transaction in SQLite.
    SqliteTx(idem::SqliteTx),
    /// The attempt's transaction in PostgreSQL.
    PgTx(idem::PgTx),
    /// The pool of the orders database (not transactional).
    Pool(Orders),
}

impl FromRequestParts<App> for OrderWriter {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Self, Response> {
        match (app.writes, &app.orders) {
            (Writes::InTransaction, Orders::Sqlite(_)) => {
                idem::SqliteTx::from_request_parts(parts, app)
                    .await
                    .map(OrderWriter::SqliteTx)
            }
            (Writes::InTransaction, Orders::Postgres(_)) => {
                idem::PgTx::from_request_parts(parts, app)
                    .await
                    .map(OrderWriter::PgTx)
            }
            (Writes::ThroughPool, orders) => Ok(OrderWriter::Pool(orders.clone())),
        }
    }
}

impl OrderWriter {
    /// Writes the order made by `attempt` and returns it.
    ///
    /// # Errors
    ///
    /// The database's error (also when the attempt's transaction has ended).
    pub async fn insert(
        &self,
        attempt: &idem::Attempt,
        order: &CreateOrder,
        now: i64,
    ) -> Result<Order, sqlx::Error> {
        match self {
            OrderWriter::SqliteTx(tx) => {
                db::sqlite::insert(&mut *tx.conn().await?, attempt, order, now).await
            }
            OrderWriter::PgTx(tx) => {
                db::postgres::insert(&mut *tx.conn().await?, attempt, order, now).await
            }
            OrderWriter::Pool(orders) => orders.insert(attempt, order, now).await,
        }
    }
}

/// Settings that make the failure cases visible from a terminal. All off by default.
#[derive(Debug, Default)]
pub struct Demo {
    /// Every `POST /orders` waits this long after writing the order (in the
    /// transactional mode inside its transaction, not committed yet) and before
    /// answering. Past the attempt's time (9 s of the contract's 10 s per-attempt timeout;
    /// the rest is kept to record the outcome) the attempt is stopped: in the
    /// transactional mode everything it wrote is rolled back; otherwise the order stays
    /// written, the outcome is unknown, and recovery decides.
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
/// The order is written by `writer`: in the transactional mode (`--store sqlite`,
/// `--store postgres`) in the attempt's transaction, which idem commits together with the
/// key's final state, so that an order without its record, or a record without its order,
/// cannot happen; otherwise through the pool. `attempt` carries the operation's id (written with the order, so
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
    writer: OrderWriter,
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
    let order = writer.insert(&attempt, &body, unix_millis()).await?;
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
    app.orders
        .by_id(client, &id)
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
/// ran, or its answer could not be recorded): the operation's order exists, or it does
/// not. In the transactional mode an order is committed only with its record, so an
/// attempt that died left none; the check still reads the table rather than assume it.
/// Outside it (records in memory or in Redis) the order may have committed before the
/// process died, and this is what finds it.
pub async fn reconcile_create_order(app: App, op: idem::UnknownOperation) -> idem::Decision {
    match app.orders.by_operation(&op.operation_id.to_string()).await {
        Ok(Some(order)) => idem::Decision::applied(created(order)),
        Ok(None) => idem::Decision::NotApplied,
        // The table could not be read now: the next retry asks again.
        Err(error) => idem::Decision::cannot_decide_now(format!(
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
