//! What the loopback benchmarks over the stores share (`stores`, `flat`, `budget`,
//! `cluster`): the order a `POST /orders` carries, its answer, the orders table and its
//! inserts, the contracted handler on each store, serving a router on 127.0.0.1, and
//! cleaning Redis.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use dashmap::DashMap;
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use serde::Deserialize;
use serde_json::json;

/// The body of `POST /orders`: `{"customer_id": "...", "amount_minor": n}`.
#[derive(Deserialize)]
pub struct CreateOrder {
    /// Who orders.
    pub customer_id: String,
    /// How much, in minor units.
    pub amount_minor: i64,
}

/// An order as the memory variants keep it.
#[allow(dead_code, reason = "written, never read back")]
pub struct Order {
    /// The operation that wrote it (the order's own id for the bare and minimum forms).
    pub operation_id: String,
    /// Who ordered.
    pub customer_id: String,
    /// How much, in minor units.
    pub amount_minor: i64,
}

/// The memory variants' orders, by id.
pub type Orders = Arc<DashMap<String, Order>>;

/// Now, in milliseconds since the Unix epoch (0 before it).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(0))
}

/// The order's JSON, as the 201 carries it and Redis keeps it.
pub fn order_json(id: &str, order: &CreateOrder) -> serde_json::Value {
    json!({ "id": id, "customer_id": order.customer_id, "amount_minor": order.amount_minor })
}

/// 201 with the order's JSON and `Location: /orders/<id>`.
pub fn created(id: &str, order: &CreateOrder) -> Response {
    let mut response = (StatusCode::CREATED, Json(order_json(id, order))).into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/orders/{id}")) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

/// A new order id: `ord_` and a UUID v7.
pub fn new_id() -> String {
    format!("ord_{}", uuid::Uuid::now_v7().simple())
}

/// 500, when a business write fails.
pub fn error() -> Response {
    StatusCode::INTERNAL_SERVER_ERROR.into_response()
}

/// The orders table, on SQLite and PostgreSQL.
pub const ORDERS: &str = "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, operation_id TEXT NOT NULL UNIQUE, customer_id TEXT NOT NULL, amount_minor BIGINT NOT NULL, created_at BIGINT NOT NULL)";

/// An order's insert on SQLite (id, operation id, customer, amount, creation time).
pub const SQLITE_INSERT: &str = "INSERT INTO orders (id, operation_id, customer_id, amount_minor, created_at) VALUES (?, ?, ?, ?, ?)";

/// An order's insert on PostgreSQL, likewise.
pub const PG_INSERT: &str = "INSERT INTO orders (id, operation_id, customer_id, amount_minor, created_at) VALUES ($1, $2, $3, $4, $5)";

/// One of the `*_INSERT` statements with the order's columns bound.
macro_rules! insert_order {
    ($sql:expr, $id:expr, $operation_id:expr, $order:expr) => {
        sqlx::query($sql)
            .bind($id)
            .bind($operation_id)
            .bind($order.customer_id.as_str())
            .bind($order.amount_minor)
            .bind(now_ms())
    };
}

/// How long a Redis order lives: a safety net should the run stop before its clean-up.
pub const ORDER_TTL_MS: u64 = 3_600_000;

/// The body every request carries (45 bytes).
pub const BODY: &str = crate::wrk::ORDER;

/// Serves `router` on a new port of 127.0.0.1 on this runtime: its base URL.
///
/// # Panics
///
/// When no port can be bound.
pub async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{addr}")
}

/// Deletes every key whose name starts with `prefix` (the run's scratch namespace): the
/// orders (`<prefix>:order:…`), and the records and budget names of stores whose own
/// prefix extends it (`<prefix>:on` is written `<prefix>%3Aon:…` by the store).
pub async fn redis_clean(conn: &mut ConnectionManager, prefix: &str) -> usize {
    let mut cursor: u64 = 0;
    let mut deleted = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(5000)
            .query_async(conn)
            .await
            .unwrap_or((0, Vec::new()));
        if !keys.is_empty() {
            let _: redis::RedisResult<usize> =
                redis::cmd("UNLINK").arg(&keys).query_async(conn).await;
            deleted += keys.len();
        }
        if next == 0 {
            return deleted;
        }
        cursor = next;
    }
}

/// The variable `name` parsed, or `default` when it is unset or does not parse.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---- the contracted handler on each store (the same in every benchmark) -------------

/// The status lookup the contracts name (routed by `idem-bench/benches/budget.rs` only).
pub async fn lookup(
    lookup: idem::Lookup<memory_idem::Operation>,
    axum::extract::Path(key): axum::extract::Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

#[idem::contract(
    key_scope = client, fingerprint = [customer_id, amount_minor], ttl = "24h",
    deadline = ("30s", per_attempt = "10s"), max_attempts = 4, retryable = [503, timeout],
    concurrency = conflict, status_lookup = lookup, recovery = manual("https://runbooks.example.com/bench"),
)]
pub async fn memory_idem(
    State(orders): State<Orders>,
    attempt: idem::Attempt,
    Json(order): Json<CreateOrder>,
) -> Response {
    let id = new_id();
    orders.insert(
        id.clone(),
        Order {
            operation_id: attempt.operation_id.to_string(),
            customer_id: order.customer_id.clone(),
            amount_minor: order.amount_minor,
        },
    );
    created(&id, &order)
}

#[idem::contract(
    key_scope = client, fingerprint = [customer_id, amount_minor], ttl = "24h",
    deadline = ("30s", per_attempt = "10s"), max_attempts = 4, retryable = [503, timeout],
    concurrency = conflict, status_lookup = lookup, recovery = manual("https://runbooks.example.com/bench"),
)]
pub async fn sqlite_idem(
    attempt: idem::Attempt,
    tx: idem::SqliteTx,
    Json(order): Json<CreateOrder>,
) -> Response {
    let id = new_id();
    let Ok(mut conn) = tx.conn().await else {
        return error();
    };
    match insert_order!(SQLITE_INSERT, &id, attempt.operation_id.to_string(), &order)
        .execute(&mut *conn)
        .await
    {
        Ok(_) => created(&id, &order),
        Err(_) => error(),
    }
}

#[idem::contract(
    key_scope = client, fingerprint = [customer_id, amount_minor], ttl = "24h",
    deadline = ("30s", per_attempt = "10s"), max_attempts = 4, retryable = [503, timeout],
    concurrency = conflict, status_lookup = lookup, recovery = manual("https://runbooks.example.com/bench"),
)]
pub async fn pg_idem(
    attempt: idem::Attempt,
    tx: idem::PgTx,
    Json(order): Json<CreateOrder>,
) -> Response {
    let id = new_id();
    let Ok(mut conn) = tx.conn().await else {
        return error();
    };
    match insert_order!(PG_INSERT, &id, attempt.operation_id.to_string(), &order)
        .execute(&mut *conn)
        .await
    {
        Ok(_) => created(&id, &order),
        Err(_) => error(),
    }
}

/// The Redis handler's business state: a connection and the run's scratch prefix.
#[derive(Clone)]
pub struct RedisState {
    /// The connection: one server's, or a cluster's.
    pub conn: idem::store::RedisConnection,
    /// The run's scratch prefix.
    pub prefix: Arc<str>,
}

impl RedisState {
    /// Writes the order `id` under the prefix, for [`ORDER_TTL_MS`].
    pub async fn write_order(&self, id: &str, order: &CreateOrder) -> redis::RedisResult<()> {
        let mut conn = self.conn.clone();
        conn.pset_ex(
            format!("{}:order:{id}", self.prefix),
            order_json(id, order).to_string(),
            ORDER_TTL_MS,
        )
        .await
    }
}

#[idem::contract(
    key_scope = client, fingerprint = [customer_id, amount_minor], ttl = "24h",
    deadline = ("30s", per_attempt = "10s"), max_attempts = 4, retryable = [503, timeout],
    concurrency = conflict, status_lookup = lookup, recovery = manual("https://runbooks.example.com/bench"),
)]
pub async fn redis_idem(
    State(redis): State<RedisState>,
    _attempt: idem::Attempt,
    Json(order): Json<CreateOrder>,
) -> Response {
    let id = new_id();
    match redis.write_order(&id, &order).await {
        Ok(()) => created(&id, &order),
        Err(_) => error(),
    }
}
