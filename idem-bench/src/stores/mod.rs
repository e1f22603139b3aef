//! Throughput of `POST /orders` under idem, per store, against the hand-written minimum:
//! `cargo bench -p idem-bench --bench stores` (needs `wrk` on the PATH: `apt-get install wrk`).
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
//! budget's own cost is the `budget` benchmark's) and
//! **replay** (every request repeats one of the keys a warm-up completed, 1000 unless
//! [`Settings::replay_keys`] says otherwise; idem answers each with the stored 201 and
//! `Idempotent-Replayed: true`). Rounds are
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
//! not answer is left out, with the reason printed. The PostgreSQL schemas are analyzed
//! after the warm-up, as autovacuum analyzes a table within a minute of its first
//! writes, so that the runs measure plans made for a table in use. The Redis keys written are deleted at
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
pub mod handlers;

use self::handlers::*;
use crate::cpu::{CpuTime, PerRequest, Server};
use crate::wrk::{median, wrk};

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
pub(crate) const SQLITE_KEY: &str = "INSERT OR IGNORE INTO idempotency_keys (client, key, order_id, created_at) VALUES (?, ?, ?, ?)";
pub(crate) const PG_KEY: &str = "INSERT INTO idempotency_keys (client, key, order_id, created_at) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING";

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
pub(crate) const KEY_TTL_MS: u64 = 86_400_000;

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

/// What a variant serves: the business write alone, the hand-written minimum, or idem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// The business write, without idem.
    Bare,
    /// The smallest hand-written idempotent version.
    Min,
    /// The business write under `#[idem::contract(..)]`.
    Idem,
}

/// One served variant: a store's form, at its URL.
struct Variant {
    store: &'static str,
    form: Form,
    url: String,
    /// The form's own PostgreSQL schema, whose writing transactions a run counts.
    pg: Option<sqlx::PgPool>,
}

/// The three forms of one store.
async fn forms(store: &'static str, bare: Router, min: Router, idem: Router) -> Vec<Variant> {
    vec![
        Variant {
            store,
            form: Form::Bare,
            url: serve(bare).await,
            pg: None,
        },
        Variant {
            store,
            form: Form::Min,
            url: serve(min).await,
            pg: None,
        },
        Variant {
            store,
            form: Form::Idem,
            url: serve(idem.route("/o/{key}", get(lookup))).await,
            pg: None,
        },
    ]
}

/// A SQLite file opened as `SqliteStore::open` opens it, with the business tables.
pub(crate) async fn sqlite_file(dir: &Path, name: &str) -> idem::SqliteStore {
    let store = idem::SqliteStore::open(dir.join(format!("{name}.db")))
        .await
        .unwrap();
    for table in [ORDERS, KEYS] {
        sqlx::query(table).execute(store.pool()).await.unwrap();
    }
    store
}

pub(crate) async fn pg_schema() -> Option<sqlx::PgPool> {
    let pool = idem_runtime::store::conformance::postgres::scratch_pool("the pg variants").await?;
    for table in [ORDERS, KEYS] {
        sqlx::query(table).execute(&pool).await.unwrap();
    }
    Some(pool)
}

/// Completes the replay path's `keys` keys, then checks that one of them replays.
async fn warm_up(client: &reqwest::Client, url: &str, keys: usize) {
    let post = |key: String| {
        client
            .post(format!("{url}/orders"))
            .header("content-type", "application/json")
            .header("x-client-id", "bench")
            .header("idempotency-key", key)
            .body(BODY)
            .send()
    };
    for i in 0..keys {
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

/// How a run is shaped.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Interleaved rounds (each runs every kept run once); the figures are their medians.
    pub rounds: usize,
    /// The length of one `wrk` run, in seconds.
    pub seconds: u64,
    /// The runs kept, by name (`"memory idem"`, `"pg idem replay"`, as [`Measured::name`]
    /// gives them); all when `None`.
    pub only: Option<Vec<String>>,
    /// The completed keys the replay path cycles through (the warm-up makes them).
    pub replay_keys: usize,
}

impl Settings {
    /// `IDEM_BENCH_ROUNDS` (3), `IDEM_BENCH_SECONDS` (5) and `IDEM_BENCH_ONLY`
    /// (comma-separated run names).
    ///
    /// Exits with 2 when `wrk` is not on the `PATH` ([`crate::wrk::wrk_rounds`]).
    #[must_use]
    pub fn from_env() -> Settings {
        let (rounds, seconds) = crate::wrk::wrk_rounds();
        let only = std::env::var("IDEM_BENCH_ONLY")
            .ok()
            .map(|only| only.split(',').map(|s| s.trim().to_owned()).collect());
        Settings {
            rounds,
            seconds,
            only,
            replay_keys: 1000,
        }
    }
}

/// One measured run: a store's form on one path, the medians of its rounds.
#[derive(Clone, Debug)]
pub struct Measured {
    /// `memory`, `sqlite`, `pg` or `redis`.
    pub store: &'static str,
    /// What was served.
    pub form: Form,
    /// Replays of completed keys (only for [`Form::Idem`]); new keys otherwise.
    pub replay: bool,
    /// Requests per second, the median of the rounds.
    pub rps: f64,
    /// The 99th percentile of latency, in milliseconds, the median of the rounds.
    pub p99_ms: f64,
    /// PostgreSQL's new keys: the server's writing transactions per order written (each
    /// new key writes one), the median of the rounds; `None` elsewhere.
    pub writes_per_request: Option<f64>,
    /// The CPU a request cost this process and the store's server ([`crate::cpu`]),
    /// the median of the rounds; `None` where `/proc` could not be read.
    pub cpu: Option<PerRequest>,
}

impl Measured {
    /// The run's name: the store, then `bare`, `min`, `idem` or `idem replay`.
    #[must_use]
    pub fn name(&self) -> String {
        name(self.store, self.form, self.replay)
    }
}

fn name(store: &str, form: Form, replay: bool) -> String {
    let form = match (form, replay) {
        (Form::Bare, _) => "bare",
        (Form::Min, _) => "min",
        (Form::Idem, false) => "idem",
        (Form::Idem, true) => "idem replay",
    };
    format!("{store} {form}")
}

/// What a run measured, and the size of the stores it left.
#[derive(Clone, Debug)]
pub struct Report {
    /// The kept runs, in the order they ran within a round.
    pub runs: Vec<Measured>,
    /// The settings it ran with.
    pub settings: Settings,
    /// The records the idem memory store held at the end.
    pub memory_records: usize,
}

impl Report {
    /// The requests per second of `store`'s `form` on the path, if it ran.
    #[must_use]
    pub fn find(&self, store: &str, form: Form, replay: bool) -> Option<&Measured> {
        self.runs
            .iter()
            .find(|r| r.store == store && r.form == form && r.replay == replay)
    }

    /// The markdown table: every run, its rate, p99 and ratio (idem's new keys to the
    /// minimum, replays to bare, the minimum to bare), and the CPU a request cost the
    /// service and the store's server, with the same ratio taken of the CPU (the
    /// baseline's over idem's: 0.5 when idem costs twice as much).
    pub fn print(&self) {
        let Settings {
            rounds, seconds, ..
        } = self.settings;
        println!(
            "\nPOST /orders, wrk -t2 -c32 -d{seconds}s, {rounds} interleaved rounds, medians\n"
        );
        println!(
            "| store | form | path | requests/s | p99 | ratio | writing transactions a request | CPU a request: service + server | CPU ratio |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        for run in &self.runs {
            let of = |form: Form, what: &str| {
                self.find(run.store, form, false).map_or_else(
                    || "–".to_owned(),
                    |base| format!("{:.2} of {what}", run.rps / base.rps),
                )
            };
            let (form, ratio) = match (run.form, run.replay) {
                (Form::Bare, _) => ("bare", "1 (a)".to_owned()),
                (Form::Min, _) => ("min", of(Form::Bare, "bare")),
                (Form::Idem, false) => ("idem", format!("**{}**", of(Form::Min, "min"))),
                (Form::Idem, true) => ("idem", format!("**{}**", of(Form::Bare, "bare"))),
            };
            let path = if run.replay { "replay" } else { "new keys" };
            let writes = run
                .writes_per_request
                .map_or_else(|| "–".to_owned(), |w| format!("{w:.2}"));
            let cpu = run.cpu.map_or_else(
                || "–".to_owned(),
                |c| format!("{:.1} + {:.1} µs", c.service_us, c.server_us),
            );
            let baseline = match (run.form, run.replay) {
                (Form::Bare, _) => None,
                (Form::Min, _) | (Form::Idem, true) => self.find(run.store, Form::Bare, false),
                (Form::Idem, false) => self.find(run.store, Form::Min, false),
            };
            let cpu_ratio = baseline
                .and_then(|base| cpu_ratio(base, run))
                .map_or_else(|| "–".to_owned(), |r| format!("{r:.2}"));
            println!(
                "| {} | {form} | {path} | {:.0} | {:.2} ms | {ratio} | {writes} | {cpu} | {cpu_ratio} |",
                run.store, run.rps, run.p99_ms
            );
        }
        println!(
            "\nafter the run: RSS {}, the MemoryStore holds {} records",
            rss(),
            self.memory_records
        );
    }
}

/// The CPU a request cost `base` over what it cost `run`, both sides together; `None`
/// where either was not measured.
#[must_use]
pub fn cpu_ratio(base: &Measured, run: &Measured) -> Option<f64> {
    let (base, run) = (base.cpu?, run.cpu?);
    (run.total_us() > 0.0).then(|| base.total_us() / run.total_us())
}

/// Serves every store's three forms (a store whose server does not answer is left out,
/// with the reason printed), warms the replay keys up, then runs the kept runs in
/// interleaved rounds.
///
/// # Panics
///
/// When a variant answers anything but 2xx under load, a replay runs the handler, or a
/// store cannot be set up (its server answered, then failed).
#[must_use]
pub fn run(settings: &Settings) -> Report {
    let runtime = crate::serve::runtime();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let served = runtime.block_on(Served::start(dir.path(), settings.replay_keys.max(1)));
    let report = served.measure(settings, dir.path(), &runtime);
    if let Some((mut conn, prefix)) = served.redis_scratch.clone() {
        let deleted = runtime.block_on(redis_clean(&mut conn, &prefix));
        eprintln!("deleted the run's {deleted} Redis keys under {prefix}");
    }
    drop(runtime);
    report
}

/// Every variant, served on this runtime, and what the run inspects or cleans after.
struct Served {
    variants: Vec<Variant>,
    memory_store: Arc<idem::MemoryStore>,
    /// The orders of idem's memory handler: a replay must not add one.
    memory_orders: Orders,
    redis_scratch: Option<(ConnectionManager, String)>,
}

impl Served {
    async fn start(dir: &Path, replay_keys: usize) -> Served {
        let memory_store = Arc::new(idem::MemoryStore::new());
        let memory_orders: Orders = Arc::default();
        let mut variants = memory(&memory_store, &memory_orders).await;
        variants.extend(sqlite(dir).await);
        variants.extend(pg().await);
        let (redis, redis_scratch) = redis_variants().await;
        variants.extend(redis);
        let client = reqwest::Client::new();
        for variant in variants.iter().filter(|v| v.form == Form::Idem) {
            warm_up(&client, &variant.url, replay_keys).await;
        }
        for pool in variants.iter().filter_map(|v| v.pg.as_ref()) {
            analyze(pool).await;
        }
        Served {
            variants,
            memory_store,
            memory_orders,
            redis_scratch,
        }
    }

    /// Every run there is: each variant's new keys, then each idem variant's replays.
    fn runs(&self) -> Vec<Run> {
        (0..self.variants.len())
            .map(|variant| (variant, false))
            .chain(
                self.variants
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.form == Form::Idem)
                    .map(|(i, _)| (i, true)),
            )
            .map(|(variant, replay)| Run {
                variant,
                replay,
                ..Run::default()
            })
            .collect()
    }

    /// The kept runs, `settings.rounds` interleaved rounds of each, on `runtime` (where
    /// the PostgreSQL forms' writing transactions are counted).
    fn measure(
        &self,
        settings: &Settings,
        dir: &Path,
        runtime: &tokio::runtime::Runtime,
    ) -> Report {
        let (new_keys, replays) = scripts(settings, dir);
        let mut runs = self.runs();
        let name_of = |run: &Run| {
            let v = &self.variants[run.variant];
            name(v.store, v.form, run.replay)
        };
        if let Some(keep) = &settings.only {
            runs.retain(|run| keep.contains(&name_of(run)));
        }
        for round in 0..settings.rounds {
            for (i, run) in runs.iter_mut().enumerate() {
                let script = if run.replay { &replays } else { &new_keys };
                let orders_before = self.memory_orders.len();
                let v = &self.variants[run.variant];
                let counted = v.pg.as_ref().filter(|_| !run.replay);
                let before = counted.map(|pool| runtime.block_on(Written::now(pool)));
                let server = Server::of_store(v.store);
                let (r, p, cpu) = costed(&v.url, script, settings.seconds, round * 100 + i, server);
                eprintln!(
                    "round {} {}: {r:.0} req/s, p99 {p:.2} ms{}",
                    round + 1,
                    name_of(run),
                    cpu.map_or_else(String::new, |c| format!(
                        ", CPU {:.1} + {:.1} µs a request",
                        c.service_us, c.server_us
                    ))
                );
                // A replay runs no handler: the memory handler's orders do not change.
                if run.replay && v.store == "memory" {
                    assert_eq!(
                        self.memory_orders.len(),
                        orders_before,
                        "a replay ran the handler"
                    );
                }
                if let (Some(pool), Some(before)) = (counted, before) {
                    let after = runtime.block_on(Written::now(pool));
                    run.writes.extend(after.per_order_since(&before));
                }
                run.rps.push(r);
                run.p99.push(p);
                run.cpu.extend(cpu);
            }
        }
        let runs = runs
            .into_iter()
            .map(|mut run| Measured {
                store: self.variants[run.variant].store,
                form: self.variants[run.variant].form,
                replay: run.replay,
                rps: median(&mut run.rps),
                p99_ms: median(&mut run.p99),
                writes_per_request: (!run.writes.is_empty()).then(|| median(&mut run.writes)),
                cpu: PerRequest::median(&run.cpu),
            })
            .collect();
        Report {
            runs,
            settings: settings.clone(),
            memory_records: self.memory_store.len(),
        }
    }
}

/// One wrk run of `script` on `url` ([`wrk`], 32 connections, its number `run`) and the
/// CPU a request cost this process and `server`'s processes meanwhile: requests per
/// second, p99 in milliseconds, and the CPU when `/proc` could be read.
fn costed(
    url: &str,
    script: &Path,
    seconds: u64,
    run: usize,
    server: Server,
) -> (f64, f64, Option<PerRequest>) {
    let before = CpuTime::now(server);
    let (rps, p99) = wrk(url, script, seconds, 32, run);
    #[allow(clippy::cast_precision_loss, reason = "a few seconds")]
    let requests = rps * seconds as f64;
    let cpu = before
        .zip(CpuTime::now(server))
        .and_then(|(before, after)| after.per_request_since(&before, requests));
    (rps, p99, cpu)
}

/// One kept run as its rounds go: the variant, the path, and each round's figures.
#[derive(Default)]
struct Run {
    variant: usize,
    replay: bool,
    rps: Vec<f64>,
    p99: Vec<f64>,
    /// Writing transactions per order, for a PostgreSQL form's new keys.
    writes: Vec<f64>,
    /// The CPU each round cost a request.
    cpu: Vec<PerRequest>,
}

/// The Lua scripts of the two paths, written in `dir`: new keys from 64 clients, and
/// replays of the warm-up's keys.
fn scripts(settings: &Settings, dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let new_keys = dir.join("new.lua");
    let script = crate::wrk::orders_script(
        r#""bench-" .. (counter % 64)"#,
        r#""k-" .. run .. "-" .. tid .. "-" .. counter"#,
    );
    std::fs::write(&new_keys, script).expect("the Lua script is written");
    let replays = dir.join("replay.lua");
    // One of the warmed-up keys, from the client that warmed them up.
    let keys = settings.replay_keys.max(1);
    let replay = crate::wrk::orders_script(
        r#""bench""#,
        &format!(r#""r-" .. ((counter + tid * {}) % {keys})"#, keys / 2),
    );
    std::fs::write(&replays, replay).expect("the Lua script is written");
    (new_keys, replays)
}

/// A PostgreSQL form's writes so far: the server's next transaction id (the first not
/// yet assigned: a transaction gets one when it first writes, and it is never given
/// back, whether it commits or rolls back) and its schema's orders.
struct Written {
    next_xid: i64,
    orders: i64,
}

impl Written {
    /// Read without taking a transaction id of its own.
    async fn now(pool: &sqlx::PgPool) -> Written {
        let (next_xid, orders) = sqlx::query_as(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
                (SELECT count(*) FROM orders)",
        )
        .fetch_one(pool)
        .await
        .expect("the transaction and order counts");
        Written { next_xid, orders }
    }

    /// The writing transactions of the whole server since `before`, per order written
    /// in this schema meanwhile; none when no order was. Nothing else writes to the
    /// server during a run: every new key writes one order, so a new key that commits
    /// once counts 1.
    fn per_order_since(&self, before: &Written) -> Option<f64> {
        let orders = self.orders - before.orders;
        #[allow(clippy::cast_precision_loss, reason = "counts far below 2^52")]
        (orders > 0).then(|| (self.next_xid - before.next_xid) as f64 / orders as f64)
    }
}

/// The memory store's three forms.
async fn memory(memory_store: &Arc<idem::MemoryStore>, memory_orders: &Orders) -> Vec<Variant> {
    let min = MemoryMin {
        orders: Arc::default(),
        keys: Arc::default(),
    };
    // The default budget (10,000 live keys a client) would be reached by the 64 clients
    // within a few seconds on this store: a budget the run never reaches, still counted,
    // as the `flat` benchmark does.
    let idem = idem::Idem::builder(Arc::clone(memory_store), identity())
        .client_budget(idem::store::ClientBudget::new(1 << 40, 1 << 50))
        .build();
    forms(
        "memory",
        Router::new()
            .route("/orders", post(memory_bare))
            .with_state(Orders::default()),
        Router::new()
            .route("/orders", post(memory_min))
            .with_state(min),
        Router::new()
            .route("/orders", post(memory_idem))
            .with_state(Arc::clone(memory_orders))
            .layer(idem.layer()),
    )
    .await
}

/// How every idem handle of the run knows a client: `X-Client-Id`.
fn identity() -> impl idem::identity::ClientIdentity {
    idem::identity::header("x-client-id")
}

/// SQLite's three forms, each on a file of its own in `dir`.
async fn sqlite(dir: &Path) -> Vec<Variant> {
    let bare = sqlite_file(dir, "bare").await;
    let min = sqlite_file(dir, "min").await;
    let store = sqlite_file(dir, "idem").await;
    let idem = idem::Idem::transactional(store.clone(), identity());
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
    .await
}

/// PostgreSQL's three forms, on scratch schemas of the test server (one per form, kept
/// in [`Variant::pg`]), never the application's tables; none when it does not answer.
async fn pg() -> Vec<Variant> {
    let Some(bare) = pg_schema().await else {
        eprintln!("PostgreSQL is not reachable: the pg variants are left out");
        return Vec::new();
    };
    let min = pg_schema().await.expect("a second scratch schema");
    let pool = pg_schema().await.expect("a third scratch schema");
    let pools = vec![bare.clone(), min.clone(), pool.clone()];
    let store = idem::PostgresStore::from_pool(pool.clone())
        .await
        .expect("the store's tables");
    let idem = idem::Idem::transactional(store, identity());
    let mut variants = forms(
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
    .await;
    for (variant, pool) in variants.iter_mut().zip(pools) {
        variant.pg = Some(pool);
    }
    variants
}

/// Analyzes every table of the scratch schema of `pool`, as autovacuum does within a
/// minute of a table's first writes: a statement prepared on a table never analyzed
/// keeps the generic plan made for an empty table (which may read the client budget's
/// index for a key's record) until the table is, and a run of a few seconds on a fresh
/// schema would measure that first minute rather than a store in use.
pub(crate) async fn analyze(pool: &sqlx::PgPool) {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT format('ANALYZE %I.%I', schemaname, tablename) FROM pg_tables
        WHERE schemaname = current_schema()",
    )
    .fetch_all(pool)
    .await
    .expect("the scratch schema's tables");
    for analyze in tables {
        sqlx::raw_sql(sqlx::AssertSqlSafe(analyze))
            .execute(pool)
            .await
            .expect("ANALYZE");
    }
}

/// Redis's three forms under one scratch prefix for the run (the idem store's hashes and
/// the hand-written keys and orders all live under it, and are deleted at the end), and
/// a connection and that prefix to delete them with; none when Redis does not answer.
async fn redis_variants() -> (Vec<Variant>, Option<(ConnectionManager, String)>) {
    let Some(url) =
        idem_runtime::store::conformance::redis::url_or_skip("the redis variants").await
    else {
        eprintln!("Redis is not reachable: the redis variants are left out");
        return (Vec::new(), None);
    };
    let prefix = idem_runtime::store::conformance::redis::scratch_prefix();
    let store = idem::RedisStore::connect(&url)
        .await
        .expect("Redis answers")
        .with_prefix(format!("{prefix}:idem"));
    let own = |conn: idem::store::RedisConnection| RedisState {
        conn,
        prefix: Arc::from(prefix.as_str()),
    };
    let client = redis::Client::open(url.as_str()).expect("a Redis URL");
    let bare = client
        .get_connection_manager()
        .await
        .expect("Redis answers");
    let min = client
        .get_connection_manager()
        .await
        .expect("Redis answers");
    let business = own(store.connection().clone());
    let scratch = Some((bare.clone(), prefix.clone()));
    let idem = idem::Idem::new(store, identity());
    let variants = forms(
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
    .await;
    (variants, scratch)
}
