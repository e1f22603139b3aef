//! Throughput of `POST /orders` under idem, per store, against the hand-written minimum:
//! `cargo bench -p idem --bench stores` (needs `wrk` on the PATH: `apt-get install wrk`).
//!
//! One handler shape (a small JSON body, one order written, 201 with `Location`) is served
//! in three forms for each store:
//!
//! | form | what a request does |
//! |---|---|
//! | `bare` | the business write, without idem |
//! | `min` | the smallest hand-written idempotent version: the business write and the one key write that cannot be avoided (a taken key answers 409) |
//! | `idem` | the business write under `#[idem::contract(..)]` with the store's idem backend |
//!
//! | store | business write | `min`'s key write | `idem` |
//! |---|---|---|---|
//! | memory | a `DashMap` insert | one `DashMap` entry insert | `MemoryStore` |
//! | sqlite | an insert into a file opened as `SqliteStore::open` opens it | `INSERT OR IGNORE` of a key row, one transaction with the order | `SqliteStore`, transactional (`SqliteTx`) |
//! | pg | an insert into a scratch schema | `INSERT … ON CONFLICT DO NOTHING` of a key row, one transaction with the order | `PostgresStore`, transactional (`PgTx`) |
//! | redis | `SET <prefix>:order:<id> <json>` on Redis itself | `SET <prefix>:key:<client>:<key> <id> NX PX` before it | `RedisStore` under a scratch prefix, not transactional (`Idem::new`) |
//!
//! Two paths are measured: **new keys** (every request a fresh `Idempotency-Key`, from
//! one of 64 clients, `X-Client-Id`, so that none reaches its budget in a run: the
//! budget's own cost is `benches/budget.rs`'s) and
//! **replay** (every request repeats one of 1000 keys that a warm-up completed; idem
//! answers each with the stored 201 and `Idempotent-Replayed: true`). Rounds are
//! interleaved (each round runs every variant once, `wrk -t2 -c32 -d5s`); the table gives
//! medians of requests per second and of p99 latency, with `idem / min` on new keys and
//! `replay / bare`. The load generator shares the machine's cores with the server, so the
//! figures are ratios, not capacity. Set `IDEM_BENCH_ROUNDS` (default 3) and
//! `IDEM_BENCH_SECONDS` (default 5) to change them, and `IDEM_BENCH_ONLY` (run names as
//! printed, comma-separated: `"memory idem,memory idem replay"`) to keep only some runs,
//! for a profile.
//!
//! PostgreSQL (`IDEM_TEST_DATABASE_URL`, by default the local server) and Redis
//! (`IDEM_TEST_REDIS_URL`, likewise) are used through the conformance suite's scratch
//! helpers: a new schema, a new key prefix, never anyone's data. A store whose server does
//! not answer is left out, with the reason printed. The Redis keys written are deleted at
//! the end; the orders also carry a one-hour expiry in case the run is interrupted.

use std::path::Path;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use redis::aio::ConnectionManager;

#[macro_use]
#[path = "common/orders.rs"]
mod orders;
#[path = "common/wrk.rs"]
mod wrk;
use orders::*;
use wrk::{median, wrk};

/// The key the hand-written minimum claims: the client and its key, as idem scopes keys
/// (`key_scope = client`). `None` when either header is missing (400).
fn client_key(headers: &HeaderMap) -> Option<(String, String)> {
    let client = headers.get("x-client-id")?.to_str().ok()?;
    let key = headers.get("idempotency-key")?.to_str().ok()?;
    Some((client.to_owned(), key.to_owned()))
}

/// The answer of the hand-written minimum to a key already taken.
fn taken() -> Response {
    StatusCode::CONFLICT.into_response()
}

// ---- memory -------------------------------------------------------------------------

#[derive(Clone)]
struct MemoryMin {
    orders: Orders,
    keys: Arc<DashMap<(String, String), String>>,
}

async fn memory_bare(State(orders): State<Orders>, Json(order): Json<CreateOrder>) -> Response {
    let id = new_id();
    orders.insert(
        id.clone(),
        Order {
            operation_id: id.clone(),
            customer_id: order.customer_id.clone(),
            amount_minor: order.amount_minor,
        },
    );
    created(&id, &order)
}

async fn memory_min(
    State(state): State<MemoryMin>,
    headers: HeaderMap,
    Json(order): Json<CreateOrder>,
) -> Response {
    let Some(key) = client_key(&headers) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let id = new_id();
    match state.keys.entry(key) {
        Entry::Occupied(_) => return taken(),
        Entry::Vacant(slot) => {
            slot.insert(id.clone());
        }
    }
    state.orders.insert(
        id.clone(),
        Order {
            operation_id: id.clone(),
            customer_id: order.customer_id.clone(),
            amount_minor: order.amount_minor,
        },
    );
    created(&id, &order)
}

// ---- SQLite and PostgreSQL ----------------------------------------------------------

const KEYS: &str = "CREATE TABLE IF NOT EXISTS idempotency_keys (client TEXT NOT NULL, key TEXT NOT NULL, order_id TEXT NOT NULL, created_at BIGINT NOT NULL, PRIMARY KEY (client, key))";
const SQLITE_KEY: &str = "INSERT OR IGNORE INTO idempotency_keys (client, key, order_id, created_at) VALUES (?, ?, ?, ?)";
const PG_KEY: &str = "INSERT INTO idempotency_keys (client, key, order_id, created_at) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING";

async fn sqlite_bare(
    State(pool): State<sqlx::SqlitePool>,
    Json(order): Json<CreateOrder>,
) -> Response {
    let id = new_id();
    match insert_order!(SQLITE_INSERT, &id, id.clone(), &order)
        .execute(&pool)
        .await
    {
        Ok(_) => created(&id, &order),
        Err(_) => error(),
    }
}

async fn sqlite_min(
    State(pool): State<sqlx::SqlitePool>,
    headers: HeaderMap,
    Json(order): Json<CreateOrder>,
) -> Response {
    let Some((client, key)) = client_key(&headers) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let id = new_id();
    let Ok(mut tx) = pool.begin().await else {
        return error();
    };
    let claimed = sqlx::query(SQLITE_KEY)
        .bind(&client)
        .bind(&key)
        .bind(&id)
        .bind(now_ms())
        .execute(&mut *tx)
        .await;
    match claimed {
        Ok(done) if done.rows_affected() == 0 => return taken(),
        Ok(_) => {}
        Err(_) => return error(),
    }
    if insert_order!(SQLITE_INSERT, &id, id.clone(), &order)
        .execute(&mut *tx)
        .await
        .is_err()
    {
        return error();
    }
    match tx.commit().await {
        Ok(()) => created(&id, &order),
        Err(_) => error(),
    }
}

async fn pg_bare(State(pool): State<sqlx::PgPool>, Json(order): Json<CreateOrder>) -> Response {
    let id = new_id();
    match insert_order!(PG_INSERT, &id, id.clone(), &order)
        .execute(&pool)
        .await
    {
        Ok(_) => created(&id, &order),
        Err(_) => error(),
    }
}

async fn pg_min(
    State(pool): State<sqlx::PgPool>,
    headers: HeaderMap,
    Json(order): Json<CreateOrder>,
) -> Response {
    let Some((client, key)) = client_key(&headers) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let id = new_id();
    let Ok(mut tx) = pool.begin().await else {
        return error();
    };
    let claimed = sqlx::query(PG_KEY)
        .bind(&client)
        .bind(&key)
        .bind(&id)
        .bind(now_ms())
        .execute(&mut *tx)
        .await;
    match claimed {
        Ok(done) if done.rows_affected() == 0 => return taken(),
        Ok(_) => {}
        Err(_) => return error(),
    }
    if insert_order!(PG_INSERT, &id, id.clone(), &order)
        .execute(&mut *tx)
        .await
        .is_err()
    {
        return error();
    }
    match tx.commit().await {
        Ok(()) => created(&id, &order),
        Err(_) => error(),
    }
}

// ---- Redis --------------------------------------------------------------------------

/// How long the hand-written minimum keeps a key: the contracts' `ttl`.
const KEY_TTL_MS: u64 = 86_400_000;

async fn redis_bare(State(redis): State<RedisState>, Json(order): Json<CreateOrder>) -> Response {
    let id = new_id();
    match redis.write_order(&id, &order).await {
        Ok(()) => created(&id, &order),
        Err(_) => error(),
    }
}

async fn redis_min(
    State(redis): State<RedisState>,
    headers: HeaderMap,
    Json(order): Json<CreateOrder>,
) -> Response {
    let Some((client, key)) = client_key(&headers) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let id = new_id();
    let mut conn = redis.conn.clone();
    let claimed: redis::RedisResult<Option<String>> = redis::cmd("SET")
        .arg(format!(
            "{}:key:{}:{client}:{key}",
            redis.prefix,
            client.len()
        ))
        .arg(&id)
        .arg("NX")
        .arg("PX")
        .arg(KEY_TTL_MS)
        .query_async(&mut conn)
        .await;
    match claimed {
        Ok(None) => return taken(),
        Ok(Some(_)) => {}
        Err(_) => return error(),
    }
    match redis.write_order(&id, &order).await {
        Ok(()) => created(&id, &order),
        Err(_) => error(),
    }
}

// ---- the driver ---------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    Bare,
    Min,
    Idem,
}

struct Variant {
    store: &'static str,
    form: Form,
    url: String,
}

/// The three forms of one store.
async fn forms(store: &'static str, bare: Router, min: Router, idem: Router) -> Vec<Variant> {
    vec![
        Variant {
            store,
            form: Form::Bare,
            url: serve(bare).await,
        },
        Variant {
            store,
            form: Form::Min,
            url: serve(min).await,
        },
        Variant {
            store,
            form: Form::Idem,
            url: serve(idem.route("/o/{key}", get(lookup))).await,
        },
    ]
}

/// A SQLite file opened as `SqliteStore::open` opens it, with the business tables.
async fn sqlite_file(dir: &Path, name: &str) -> idem::SqliteStore {
    let store = idem::SqliteStore::open(dir.join(format!("{name}.db")))
        .await
        .unwrap();
    for table in [ORDERS, KEYS] {
        sqlx::query(table).execute(store.pool()).await.unwrap();
    }
    store
}

async fn pg_schema() -> Option<sqlx::PgPool> {
    let pool = idem_runtime::store::conformance::postgres::scratch_pool("the pg variants").await?;
    for table in [ORDERS, KEYS] {
        sqlx::query(table).execute(&pool).await.unwrap();
    }
    Some(pool)
}

/// How many keys the replay path cycles through.
const REPLAY_KEYS: usize = 1000;

/// Completes the replay path's keys, then checks that one of them replays.
async fn warm_up(client: &reqwest::Client, url: &str) {
    let post = |key: String| {
        client
            .post(format!("{url}/orders"))
            .header("content-type", "application/json")
            .header("x-client-id", "bench")
            .header("idempotency-key", key)
            .body(BODY)
            .send()
    };
    for i in 0..REPLAY_KEYS {
        let answer = post(format!("r-{i}")).await.unwrap();
        assert_eq!(answer.status(), 201, "warm-up of {url}");
    }
    let answer = post("r-0".to_owned()).await.unwrap();
    assert_eq!(answer.status(), 201);
    assert_eq!(
        answer
            .headers()
            .get(idem::headers::IDEMPOTENT_REPLAYED)
            .and_then(|v| v.to_str().ok()),
        Some("true"),
        "{url} replays its warm-up keys"
    );
}

/// The process's resident set size, as `/proc/self/status` gives it.
fn rss() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// One measured run: a variant on one path.
struct Run {
    variant: usize,
    replay: bool,
    rps: Vec<f64>,
    p99: Vec<f64>,
}

#[allow(clippy::too_many_lines, reason = "one store after the other, in order")]
fn main() {
    let (rounds, seconds) = wrk::wrk_rounds();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let identity = || idem::identity::header("x-client-id");
    let memory_store = Arc::new(idem::MemoryStore::new());
    let memory_orders: Orders = Arc::default();
    let mut redis_scratch: Option<(ConnectionManager, String)> = None;

    let variants: Vec<Variant> = runtime.block_on(async {
        let mut out = Vec::new();

        let orders: Orders = Arc::default();
        let min = MemoryMin {
            orders: Arc::default(),
            keys: Arc::default(),
        };
        // The default budget (10,000 live keys a client) would be reached by the 64
        // clients within a few seconds on this store: a budget the run never reaches,
        // still counted, as `benches/flat.rs` does.
        let idem = idem::Idem::builder(Arc::clone(&memory_store), identity())
            .client_budget(idem::store::ClientBudget::new(1 << 40, 1 << 50))
            .build();
        out.extend(
            forms(
                "memory",
                Router::new()
                    .route("/orders", post(memory_bare))
                    .with_state(orders),
                Router::new()
                    .route("/orders", post(memory_min))
                    .with_state(min),
                Router::new()
                    .route("/orders", post(memory_idem))
                    .with_state(Arc::clone(&memory_orders))
                    .layer(idem.layer()),
            )
            .await,
        );

        let bare = sqlite_file(dir.path(), "bare").await;
        let min = sqlite_file(dir.path(), "min").await;
        let store = sqlite_file(dir.path(), "idem").await;
        let idem = idem::Idem::transactional(store.clone(), identity());
        out.extend(
            forms(
                "sqlite",
                Router::new()
                    .route("/orders", post(sqlite_bare))
                    .with_state(bare.pool().clone()),
                Router::new()
                    .route("/orders", post(sqlite_min))
                    .with_state(min.pool().clone()),
                Router::new()
                    .route("/orders", post(sqlite_idem))
                    .with_state(store.pool().clone())
                    .layer(idem.layer()),
            )
            .await,
        );

        // Scratch schemas of the test server (one per form), never the application's tables.
        if let Some(bare) = pg_schema().await {
            let min = pg_schema().await.unwrap();
            let pool = pg_schema().await.unwrap();
            let store = idem::PostgresStore::from_pool(pool.clone()).await.unwrap();
            let idem = idem::Idem::transactional(store, identity());
            out.extend(
                forms(
                    "pg",
                    Router::new()
                        .route("/orders", post(pg_bare))
                        .with_state(bare),
                    Router::new().route("/orders", post(pg_min)).with_state(min),
                    Router::new()
                        .route("/orders", post(pg_idem))
                        .with_state(pool)
                        .layer(idem.layer()),
                )
                .await,
            );
        } else {
            eprintln!("PostgreSQL is not reachable: the pg variants are left out");
        }

        // One scratch prefix for the run: the idem store's hashes and the hand-written keys
        // and orders all live under it, and are deleted at the end.
        if let Some(url) =
            idem_runtime::store::conformance::redis::url_or_skip("the redis variants").await
        {
            let prefix = idem_runtime::store::conformance::redis::scratch_prefix();
            let store = idem::RedisStore::connect(&url)
                .await
                .unwrap()
                .with_prefix(format!("{prefix}:idem"));
            let own = |conn: idem::store::RedisConnection| RedisState {
                conn,
                prefix: Arc::from(prefix.as_str()),
            };
            let client = redis::Client::open(url.as_str()).unwrap();
            let bare = client.get_connection_manager().await.unwrap();
            let min = client.get_connection_manager().await.unwrap();
            let business = own(store.connection().clone());
            redis_scratch = Some((bare.clone(), prefix.clone()));
            let idem = idem::Idem::new(store, identity());
            out.extend(
                forms(
                    "redis",
                    Router::new()
                        .route("/orders", post(redis_bare))
                        .with_state(own(idem::store::RedisConnection::Server(bare))),
                    Router::new()
                        .route("/orders", post(redis_min))
                        .with_state(own(idem::store::RedisConnection::Server(min))),
                    Router::new()
                        .route("/orders", post(redis_idem))
                        .with_state(business)
                        .layer(idem.layer()),
                )
                .await,
            );
        } else {
            eprintln!("Redis is not reachable: the redis variants are left out");
        }

        let client = reqwest::Client::new();
        for variant in out.iter().filter(|v| v.form == Form::Idem) {
            warm_up(&client, &variant.url).await;
        }
        out
    });

    let new_keys = dir.path().join("new.lua");
    std::fs::write(
        &new_keys,
        wrk::orders_script(
            r#""bench-" .. (counter % 64)"#,
            r#""k-" .. run .. "-" .. tid .. "-" .. counter"#,
        ),
    )
    .unwrap();
    let replays = dir.path().join("replay.lua");
    // One of the warmed-up keys, from the client that warmed them up.
    let replay = wrk::orders_script(r#""bench""#, r#""r-" .. ((counter + tid * 500) % 1000)"#);
    std::fs::write(&replays, replay).unwrap();
    let mut runs: Vec<Run> = (0..variants.len())
        .map(|variant| (variant, false))
        .chain(
            variants
                .iter()
                .enumerate()
                .filter(|(_, v)| v.form == Form::Idem)
                .map(|(i, _)| (i, true)),
        )
        .map(|(variant, replay)| Run {
            variant,
            replay,
            rps: Vec::new(),
            p99: Vec::new(),
        })
        .collect();
    let name = |run: &Run| {
        let v = &variants[run.variant];
        let form = match (v.form, run.replay) {
            (Form::Bare, _) => "bare",
            (Form::Min, _) => "min",
            (Form::Idem, false) => "idem",
            (Form::Idem, true) => "idem replay",
        };
        format!("{} {form}", v.store)
    };
    // `IDEM_BENCH_ONLY="memory idem,memory min"` keeps those runs only (for a profile).
    if let Ok(only) = std::env::var("IDEM_BENCH_ONLY") {
        let keep: Vec<&str> = only.split(',').map(str::trim).collect();
        runs.retain(|run| keep.contains(&name(run).as_str()));
    }
    for round in 0..rounds {
        for (i, run) in runs.iter_mut().enumerate() {
            let script = if run.replay { &replays } else { &new_keys };
            let orders_before = memory_orders.len();
            let (rps, p99) = wrk(
                &variants[run.variant].url,
                script,
                seconds,
                32,
                round * 100 + i,
            );
            eprintln!(
                "round {} {}: {rps:.0} req/s, p99 {p99:.2} ms",
                round + 1,
                name(run)
            );
            // A replay runs no handler: the memory handler's orders do not change.
            if run.replay && variants[run.variant].store == "memory" {
                assert_eq!(
                    memory_orders.len(),
                    orders_before,
                    "a replay ran the handler"
                );
            }
            run.rps.push(rps);
            run.p99.push(p99);
        }
    }
    let medians: Vec<(f64, f64)> = runs
        .iter_mut()
        .map(|run| (median(&mut run.rps), median(&mut run.p99)))
        .collect();
    let rate = |store: &str, form: Form, replay: bool| {
        runs.iter()
            .position(|r| {
                variants[r.variant].store == store
                    && variants[r.variant].form == form
                    && r.replay == replay
            })
            .map(|i| medians[i].0)
    };
    println!("\nPOST /orders, wrk -t2 -c32 -d{seconds}s, {rounds} interleaved rounds, medians\n");
    println!("| store | form | path | requests/s | p99 | ratio |");
    println!("|---|---|---|---|---|---|");
    for (i, run) in runs.iter().enumerate() {
        let v = &variants[run.variant];
        let of = |form: Form, what: &str| {
            rate(v.store, form, false).map_or_else(
                || "–".to_owned(),
                |base| format!("{:.2} of {what}", medians[i].0 / base),
            )
        };
        let (form, ratio) = match (v.form, run.replay) {
            (Form::Bare, _) => ("bare", "1 (a)".to_owned()),
            (Form::Min, _) => ("min", of(Form::Bare, "bare")),
            (Form::Idem, false) => ("idem", format!("**{}**", of(Form::Min, "min"))),
            (Form::Idem, true) => ("idem", format!("**{}**", of(Form::Bare, "bare"))),
        };
        let path = if run.replay { "replay" } else { "new keys" };
        println!(
            "| {} | {form} | {path} | {:.0} | {:.2} ms | {ratio} |",
            v.store, medians[i].0, medians[i].1
        );
    }
    println!(
        "\nafter the run: RSS {}, the MemoryStore holds {} records",
        rss(),
        memory_store.len()
    );
    if let Some((mut conn, prefix)) = redis_scratch {
        let deleted = runtime.block_on(redis_clean(&mut conn, &prefix));
        eprintln!("deleted the run's {deleted} Redis keys under {prefix}");
    }
    drop(runtime);
}
