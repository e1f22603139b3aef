//! Throughput of `POST /orders` in each of idem's modes against the same handler without
//! idem, on loopback: `cargo bench -p orders --bench modes` (needs `wrk` on the PATH:
//! `apt-get install wrk`).
//!
//! Every variant writes one order per request into a SQLite file (WAL, `synchronous =
//! FULL`, as `SqliteStore::open` sets it) and answers 201 with a `Location`; each request
//! carries a new idempotency key. The variants:
//!
//! | variant | the handler | idem's records |
//! |---|---|---|
//! | `bare` | the insert, without idem | – |
//! | `memory` | the insert on the pool | `MemoryStore` |
//! | `sqlite` | the insert on the pool | `SqliteStore` in the same file, without the transactional mode |
//! | `sqlite-tx` | the insert through `idem::SqliteTx` | `SqliteStore`, the transactional mode |
//!
//! and, when PostgreSQL answers at `IDEM_TEST_DATABASE_URL` (by default the local
//! server), `pg-bare` and `pg-tx`: the same insert into PostgreSQL, without idem and in the
//! transactional mode with `PostgresStore`.
//!
//! Rounds are interleaved (each round runs every variant once, `wrk -t2 -c32 -d5s`), and
//! the table gives each variant's median requests per second, its median p99 latency, and
//! its ratio to the bare handler on the same database. The load generator shares the
//! machine's cores with the server, so the figures are ratios, not capacity. Set
//! `IDEM_BENCH_ROUNDS` (default 3) and `IDEM_BENCH_SECONDS` (default 5) to change them.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

#[allow(
    dead_code,
    reason = "idem-bench's driver: this benchmark uses a part of it"
)]
#[path = "../../../idem-bench/src/wrk.rs"]
mod wrk;
use wrk::{median, wrk};

#[derive(Deserialize)]
struct CreateOrder {
    customer_id: String,
    amount_minor: i64,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(0))
}

fn created(id: &str, order: &CreateOrder) -> Response {
    let mut response = (
        StatusCode::CREATED,
        Json(json!({ "id": id, "customer_id": order.customer_id, "amount_minor": order.amount_minor })),
    )
        .into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("/orders/{id}")) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

fn new_id() -> String {
    format!("ord_{}", uuid::Uuid::now_v7().simple())
}

const SQLITE_INSERT: &str = "INSERT INTO orders (id, operation_id, customer_id, amount_minor, created_at) VALUES (?, ?, ?, ?, ?)";
const PG_INSERT: &str = "INSERT INTO orders (id, operation_id, customer_id, amount_minor, created_at) VALUES ($1, $2, $3, $4, $5)";
const TABLE: &str = "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, operation_id TEXT NOT NULL UNIQUE, customer_id TEXT NOT NULL, amount_minor BIGINT NOT NULL, created_at BIGINT NOT NULL)";

async fn bare_sqlite(
    State(pool): State<sqlx::SqlitePool>,
    Json(order): Json<CreateOrder>,
) -> Response {
    let id = new_id();
    let written = sqlx::query(SQLITE_INSERT)
        .bind(&id)
        .bind(&id)
        .bind(&order.customer_id)
        .bind(order.amount_minor)
        .bind(now_ms())
        .execute(&pool)
        .await;
    match written {
        Ok(_) => created(&id, &order),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn bare_pg(State(pool): State<sqlx::PgPool>, Json(order): Json<CreateOrder>) -> Response {
    let id = new_id();
    let written = sqlx::query(PG_INSERT)
        .bind(&id)
        .bind(&id)
        .bind(&order.customer_id)
        .bind(order.amount_minor)
        .bind(now_ms())
        .execute(&pool)
        .await;
    match written {
        Ok(_) => created(&id, &order),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn lookup(
    lookup: idem::Lookup<on_pool::Operation>,
    axum::extract::Path(key): axum::extract::Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

#[idem::contract(
    key_scope = client, fingerprint = [customer_id, amount_minor], ttl = "24h",
    deadline = ("30s", per_attempt = "10s"), max_attempts = 4, retryable = [503, timeout],
    concurrency = conflict, status_lookup = lookup, recovery = manual("https://runbooks.example.com/bench"),
)]
async fn on_pool(
    State(pool): State<sqlx::SqlitePool>,
    attempt: idem::Attempt,
    Json(order): Json<CreateOrder>,
) -> Response {
    let id = new_id();
    let written = sqlx::query(SQLITE_INSERT)
        .bind(&id)
        .bind(attempt.operation_id.to_string())
        .bind(&order.customer_id)
        .bind(order.amount_minor)
        .bind(now_ms())
        .execute(&pool)
        .await;
    match written {
        Ok(_) => created(&id, &order),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[idem::contract(
    key_scope = client, fingerprint = [customer_id, amount_minor], ttl = "24h",
    deadline = ("30s", per_attempt = "10s"), max_attempts = 4, retryable = [503, timeout],
    concurrency = conflict, status_lookup = lookup, recovery = manual("https://runbooks.example.com/bench"),
)]
async fn in_sqlite_tx(
    attempt: idem::Attempt,
    tx: idem::SqliteTx,
    Json(order): Json<CreateOrder>,
) -> Response {
    let id = new_id();
    let Ok(mut conn) = tx.conn().await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let written = sqlx::query(SQLITE_INSERT)
        .bind(&id)
        .bind(attempt.operation_id.to_string())
        .bind(&order.customer_id)
        .bind(order.amount_minor)
        .bind(now_ms())
        .execute(&mut *conn)
        .await;
    match written {
        Ok(_) => created(&id, &order),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[idem::contract(
    key_scope = client, fingerprint = [customer_id, amount_minor], ttl = "24h",
    deadline = ("30s", per_attempt = "10s"), max_attempts = 4, retryable = [503, timeout],
    concurrency = conflict, status_lookup = lookup, recovery = manual("https://runbooks.example.com/bench"),
)]
async fn in_pg_tx(
    attempt: idem::Attempt,
    tx: idem::PgTx,
    Json(order): Json<CreateOrder>,
) -> Response {
    let id = new_id();
    let Ok(mut conn) = tx.conn().await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let written = sqlx::query(PG_INSERT)
        .bind(&id)
        .bind(attempt.operation_id.to_string())
        .bind(&order.customer_id)
        .bind(order.amount_minor)
        .bind(now_ms())
        .execute(&mut *conn)
        .await;
    match written {
        Ok(_) => created(&id, &order),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// A SQLite file with the orders table, opened as `SqliteStore::open` opens it.
async fn sqlite_file(dir: &Path, name: &str) -> idem::SqliteStore {
    let store = idem::SqliteStore::open(dir.join(format!("{name}.db")))
        .await
        .unwrap();
    sqlx::query(TABLE).execute(store.pool()).await.unwrap();
    store
}

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{addr}")
}

fn main() {
    let (rounds, seconds) = wrk::wrk_rounds();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let identity = || idem::identity::header("x-client-id");
    let variants: Vec<(&str, &str, String)> = runtime.block_on(async {
        let mut out = Vec::new();
        let bare = sqlite_file(dir.path(), "bare").await;
        out.push((
            "bare",
            "bare",
            serve(
                Router::new()
                    .route("/orders", post(bare_sqlite))
                    .with_state(bare.pool().clone()),
            )
            .await,
        ));

        let memory_orders = sqlite_file(dir.path(), "memory").await;
        let idem = idem::Idem::new(idem::MemoryStore::new(), identity());
        out.push((
            "memory",
            "bare",
            serve(
                Router::new()
                    .route("/orders", post(on_pool))
                    .route("/o/{key}", get(lookup))
                    .with_state(memory_orders.pool().clone())
                    .layer(idem.layer()),
            )
            .await,
        ));

        let store = sqlite_file(dir.path(), "sqlite").await;
        let idem = idem::Idem::new(store.clone(), identity());
        out.push((
            "sqlite",
            "bare",
            serve(
                Router::new()
                    .route("/orders", post(on_pool))
                    .route("/o/{key}", get(lookup))
                    .with_state(store.pool().clone())
                    .layer(idem.layer()),
            )
            .await,
        ));

        let store = sqlite_file(dir.path(), "sqlite-tx").await;
        let idem = idem::Idem::transactional(store.clone(), identity());
        out.push((
            "sqlite-tx",
            "bare",
            serve(
                Router::new()
                    .route("/orders", post(in_sqlite_tx))
                    .route("/o/{key}", get(lookup))
                    .with_state(store.pool().clone())
                    .layer(idem.layer()),
            )
            .await,
        ));

        // A scratch schema of the test server, never the application's tables.
        match idem_runtime::store::conformance::postgres::scratch_pool("the pg variants").await {
            Some(pool) => {
                sqlx::query(TABLE).execute(&pool).await.unwrap();
                out.push((
                    "pg-bare",
                    "pg-bare",
                    serve(
                        Router::new()
                            .route("/orders", post(bare_pg))
                            .with_state(pool.clone()),
                    )
                    .await,
                ));
                let store = idem::PostgresStore::from_pool(pool.clone()).await.unwrap();
                let idem = idem::Idem::transactional(store, identity());
                out.push((
                    "pg-tx",
                    "pg-bare",
                    serve(
                        Router::new()
                            .route("/orders", post(in_pg_tx))
                            .route("/o/{key}", get(lookup))
                            .with_state(pool)
                            .layer(idem.layer()),
                    )
                    .await,
                ));
            }
            None => eprintln!("PostgreSQL is not reachable: its variants are left out"),
        }
        out
    });
    let script = dir.path().join("post.lua");
    // Every request a new key, from one client.
    let lua = wrk::orders_script(
        r#""bench""#,
        r#""k-" .. run .. "-" .. tid .. "-" .. counter"#,
    );
    std::fs::write(&script, lua).unwrap();
    let mut results: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); variants.len()];
    for round in 0..rounds {
        for (i, (name, _, url)) in variants.iter().enumerate() {
            let (rps, p99) = wrk(url, &script, seconds, 32, round * 100 + i);
            eprintln!(
                "round {} {name}: {rps:.0} req/s, p99 {p99:.2} ms",
                round + 1
            );
            results[i].0.push(rps);
            results[i].1.push(p99);
        }
    }
    let medians: Vec<(f64, f64)> = results
        .iter_mut()
        .map(|(r, p)| (median(r), median(p)))
        .collect();
    println!(
        "\nPOST /orders, a new key per request, wrk -t2 -c32 -d{seconds}s, {rounds} interleaved rounds, medians\n"
    );
    println!("| variant | requests/s | p99 | ratio to its bare handler |");
    println!("|---|---|---|---|");
    for (i, (name, baseline, _)) in variants.iter().enumerate() {
        let base = variants.iter().position(|(n, _, _)| n == baseline).unwrap();
        println!(
            "| {name} | {:.0} | {:.2} ms | {:.2} |",
            medians[i].0,
            medians[i].1,
            medians[i].0 / medians[base].0
        );
    }
    drop(runtime);
}
