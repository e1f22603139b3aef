//! The cost of the per-client store budget on a new key, per store (issue 23, item 1):
//! `cargo bench -p idem-bench --bench budget` (needs `wrk` on the PATH: `apt-get install wrk`).
//!
//! One handler (`POST /orders`: a small JSON body, one order written, 201 with `Location`)
//! is served under the contract of the `stores` benchmark on each store, through handles that
//! differ only in their client budget:
//!
//! | store | idem | business write |
//! |---|---|---|
//! | memory | `Idem::new(MemoryStore)` | a `DashMap` insert |
//! | sqlite | `SqliteStore`, transactional (`SqliteTx`) | an insert in the record's transaction |
//! | pg | `PostgresStore`, transactional (`PgTx`) | an insert in the record's transaction (scratch schema) |
//! | redis | `Idem::new(RedisStore)` (scratch prefix) | `PSETEX` of the order on Redis itself |
//!
//! **off** is a store whose handle has `without_client_budget()`; **on** is a second store
//! of the same kind, with two handles: one at `ClientBudget::DEFAULT` (10,000 records,
//! 16 MiB) and one at [`LARGE`] (a million records: no run reaches it). Every handle has
//! a heartbeat lease of [`LEASE`] (10 s), so that a starved attempt does not stop the run.
//! Every request carries a new `Idempotency-Key`. The patterns:
//!
//! | pattern | driver | clients | on's budget |
//! |---|---|---|---|
//! | `many` | wrk, timed | `X-Client-Id` cycles over 1000 ids, new ids in every run | `DEFAULT` |
//! | `one` | wrk, timed | one id for the whole run, new in every run (it ends the run holding every key the run sent) | [`LARGE`] |
//! | `one-default` | burst of [`UNDER_DEFAULT`] requests | one new id per run, which stays under the default budget | `DEFAULT` |
//! | `one@1k`, `one@10k` | burst of [`FILLED_BURST`] requests | one new id per run, first given 1,000 or 10,000 live records by an unmeasured burst | [`LARGE`] |
//!
//! The timed runs are `wrk -t2 -c32 -d5s` (`idem_bench::wrk`, which stops the
//! benchmark on a non-2xx answer; the scripts print each such answer with its body
//! first). A run that must stay
//! under a number of requests cannot be timed by wrk, whose rate divides by the whole
//! duration: those use [`burst`], which sends exactly `n` requests over 32 connections
//! from a client runtime of 2 threads and divides by the time they took. Its client costs
//! more CPU per request than wrk, so its rates are lower; compare on with off of the same
//! driver only.
//!
//! Rounds are interleaved (each round runs every variant once; off and on of one pattern
//! run back to back, in alternating order), and the table gives medians of requests per
//! second and of p99 latency, with `on / off`. The load generator shares the machine's
//! cores with the server, so the figures are ratios, not capacity. `IDEM_BENCH_ROUNDS`
//! (default 3) and `IDEM_BENCH_SECONDS` (default 5) change them; `IDEM_BENCH_ONLY` (run
//! names as printed, comma-separated: `"pg one off,pg one on"`) keeps only some runs.
//!
//! PostgreSQL (`IDEM_TEST_DATABASE_URL`, by default the local server) and Redis
//! (`IDEM_TEST_REDIS_URL`, likewise) are used through the conformance suite's scratch
//! helpers: new schemas, a new key prefix, never anyone's data. A store whose server does
//! not answer is left out, with the reason printed. The Redis keys written are deleted at
//! the end; the orders also carry a one-hour expiry in case the run is interrupted.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use idem::store::ClientBudget;
use redis::aio::ConnectionManager;

use idem_bench::stores::handlers::*;
use idem_bench::wrk::{self, median, wrk};

/// The key of a request in the budget's wrk scripts: new within the run's client.
const KEY: &str = r#""k-" .. tid .. "-" .. counter"#;

/// The on handle of the one-client patterns that must never refuse: a million records
/// and a TiB of results, more than any run sends.
const LARGE: ClientBudget = ClientBudget::new(1_000_000, 1 << 40);

/// The requests of a `one-default` run: with the at most 32 in flight, under the
/// default budget's 10,000 records.
const UNDER_DEFAULT: usize = 8_000;

/// The measured requests of a `one@1k` or `one@10k` run, after the client was filled.
const FILLED_BURST: usize = 2_000;

/// The lease of every handle, longer than the default 2 s: the machine is shared with the
/// load generator (and often with builds), and an attempt starved past its lease answers
/// 503, which would stop the run. Off and on have the same.
const LEASE: Duration = Duration::from_secs(10);

/// The connections of every run, wrk's and [`burst`]'s.
const CONNECTIONS: usize = 32;

// ---- the servers --------------------------------------------------------------------

/// One store kind, served three times: budget off (its own store), and on at
/// `ClientBudget::DEFAULT` and at [`LARGE`] (both on a second store).
struct Served {
    store: &'static str,
    off: String,
    default: String,
    large: String,
}

/// Serves `app` under the three handles `handles` makes: `None` (no budget),
/// `Some(DEFAULT)`, `Some(LARGE)`; the first on the off store, the other two on the on
/// store.
async fn served(
    store: &'static str,
    app: impl Fn() -> Router,
    handles: impl Fn(Option<ClientBudget>) -> idem::Idem,
) -> Served {
    let mut urls = Vec::new();
    for budget in [None, Some(ClientBudget::DEFAULT), Some(LARGE)] {
        urls.push(serve(app().layer(handles(budget).layer())).await);
    }
    let large = urls.pop().unwrap();
    let default = urls.pop().unwrap();
    let off = urls.pop().unwrap();
    Served {
        store,
        off,
        default,
        large,
    }
}

/// `builder` with `budget`, or without a budget; every handle with a heartbeat lease of
/// [`LEASE`].
fn budgeted(builder: idem::IdemBuilder, budget: Option<ClientBudget>) -> idem::Idem {
    let builder = builder.heartbeat(LEASE);
    match budget {
        Some(budget) => builder.client_budget(budget),
        None => builder.without_client_budget(),
    }
    .build()
}

/// A SQLite file opened as `SqliteStore::open` opens it, with the orders table.
async fn sqlite_file(dir: &Path, name: &str) -> idem::SqliteStore {
    let store = idem::SqliteStore::open(dir.join(format!("{name}.db")))
        .await
        .unwrap();
    sqlx::query(ORDERS).execute(store.pool()).await.unwrap();
    store
}

async fn pg_schema() -> Option<sqlx::PgPool> {
    let pool =
        idem_runtime::store::conformance::postgres::scratch_pool("the pg budget variants").await?;
    sqlx::query(ORDERS).execute(&pool).await.unwrap();
    Some(pool)
}

// ---- the drivers --------------------------------------------------------------------

/// Sends exactly `total` `POST /orders` to `url`, all from `client`, with the new keys
/// `<keys>-0` … over [`CONNECTIONS`] connections at once, from a client runtime of 2
/// threads (as `wrk -t2`): requests per second (over the time they took) and the p99
/// latency in milliseconds.
///
/// # Panics
///
/// When an answer is not 201 (a refusal would make the figures meaningless).
fn burst(url: &str, client: &str, keys: &str, total: usize) -> (f64, f64) {
    let driver = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(CONNECTIONS)
        .build()
        .unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut latencies: Vec<Duration> = driver.block_on(async {
        let tasks: Vec<_> = (0..CONNECTIONS)
            .map(|_| {
                let (http, next) = (http.clone(), Arc::clone(&next));
                let (url, client, keys) =
                    (format!("{url}/orders"), client.to_owned(), keys.to_owned());
                tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= total {
                            return latencies;
                        }
                        let sent = Instant::now();
                        let answer = http
                            .post(&url)
                            .header("content-type", "application/json")
                            .header("x-client-id", &client)
                            .header("idempotency-key", format!("{keys}-{i}"))
                            .body(BODY)
                            .send()
                            .await
                            .unwrap();
                        let status = answer.status();
                        let body = answer.text().await.unwrap_or_default();
                        assert_eq!(status, 201, "{url} answered {status} under load: {body}");
                        latencies.push(sent.elapsed());
                    }
                })
            })
            .collect();
        let mut all = Vec::with_capacity(total);
        for task in tasks {
            all.extend(task.await.unwrap());
        }
        all
    });
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort();
    let p99 = latencies
        .get(latencies.len() * 99 / 100)
        .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0);
    #[allow(clippy::cast_precision_loss, reason = "a count of requests")]
    let rate = total as f64 / elapsed;
    (rate, p99)
}

// ---- the runs -----------------------------------------------------------------------

/// A load pattern (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pattern {
    Many,
    One,
    OneDefault,
    /// One client given this many live records before the measured burst.
    Filled(usize),
}

impl Pattern {
    const ALL: [Pattern; 5] = [
        Pattern::Many,
        Pattern::One,
        Pattern::OneDefault,
        Pattern::Filled(1_000),
        Pattern::Filled(10_000),
    ];

    fn name(self) -> String {
        match self {
            Pattern::Many => "many".to_owned(),
            Pattern::One => "one".to_owned(),
            Pattern::OneDefault => "one-default".to_owned(),
            Pattern::Filled(n) => format!("one@{}k", n / 1000),
        }
    }

    /// What the run's driver is, for the table.
    fn driver(self, seconds: u64) -> String {
        match self {
            Pattern::Many | Pattern::One => format!("wrk {seconds} s"),
            Pattern::OneDefault => format!("burst {UNDER_DEFAULT}"),
            Pattern::Filled(_) => format!("burst {FILLED_BURST}"),
        }
    }

    /// The on handle's URL of `served` for this pattern.
    fn on_url(self, served: &Served) -> &str {
        match self {
            Pattern::Many | Pattern::OneDefault => &served.default,
            Pattern::One | Pattern::Filled(_) => &served.large,
        }
    }
}

/// One measured variant: a store, a pattern, budget off or on; its rounds' figures.
struct Run {
    store: usize,
    pattern: Pattern,
    on: bool,
    rps: Vec<f64>,
    p99: Vec<f64>,
}

impl Run {
    fn name(&self, served: &[Served]) -> String {
        let on = if self.on { "on" } else { "off" };
        format!("{} {} {on}", served[self.store].store, self.pattern.name())
    }
}

/// The stores, each served three times (see [`Served`]), and the Redis scratch prefix to
/// clean at the end.
async fn stores(dir: &Path) -> (Vec<Served>, Option<(ConnectionManager, String)>) {
    let mut out = vec![memory_served().await, sqlite_served(dir).await];
    match pg_schema().await {
        Some(off) => out.push(pg_served(off).await),
        None => eprintln!("PostgreSQL is not reachable: the pg variants are left out"),
    }
    let url = idem_runtime::store::conformance::redis::url_or_skip("the redis budget variants");
    let Some(url) = url.await else {
        eprintln!("Redis is not reachable: the redis variants are left out");
        return (out, None);
    };
    let (redis, scratch) = redis_served(&url).await;
    out.push(redis);
    (out, Some(scratch))
}

fn identity() -> impl idem::identity::ClientIdentity {
    idem::identity::header("x-client-id")
}

async fn memory_served() -> Served {
    let off = Arc::new(idem::MemoryStore::new());
    let on = Arc::new(idem::MemoryStore::new());
    let orders: Orders = Arc::default();
    served(
        "memory",
        || {
            Router::new()
                .route("/orders", post(memory_idem))
                .route("/o/{key}", axum::routing::get(lookup))
                .with_state(Arc::clone(&orders))
        },
        |budget| {
            let store = if budget.is_some() { &on } else { &off };
            budgeted(idem::Idem::builder(Arc::clone(store), identity()), budget)
        },
    )
    .await
}

async fn sqlite_served(dir: &Path) -> Served {
    let off = sqlite_file(dir, "off").await;
    let on = sqlite_file(dir, "on").await;
    served(
        "sqlite",
        || Router::new().route("/orders", post(sqlite_idem)),
        |budget| {
            let store = if budget.is_some() { &on } else { &off };
            budgeted(
                idem::Idem::transactional_builder(store.clone(), identity()),
                budget,
            )
        },
    )
    .await
}

/// PostgreSQL on the scratch schema `off` and a second one.
async fn pg_served(off: sqlx::PgPool) -> Served {
    let on = pg_schema().await.unwrap();
    let off = idem::PostgresStore::from_pool(off).await.unwrap();
    let on = idem::PostgresStore::from_pool(on).await.unwrap();
    served(
        "pg",
        || Router::new().route("/orders", post(pg_idem)),
        |budget| {
            let store = if budget.is_some() { &on } else { &off };
            budgeted(
                idem::Idem::transactional_builder(store.clone(), identity()),
                budget,
            )
        },
    )
    .await
}

/// Redis at `url` under a scratch prefix, and that prefix with a connection to clean it.
async fn redis_served(url: &str) -> (Served, (ConnectionManager, String)) {
    let prefix = idem_runtime::store::conformance::redis::scratch_prefix();
    let store = |name: &str| {
        let url = url.to_owned();
        let prefix = format!("{prefix}:{name}");
        async move {
            idem::RedisStore::connect(&url)
                .await
                .unwrap()
                .with_prefix(prefix)
        }
    };
    let off = store("off").await;
    let on = store("on").await;
    let conn = redis::Client::open(url)
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let business = RedisState {
        conn: idem::store::RedisConnection::Server(conn.clone()),
        prefix: Arc::from(prefix.as_str()),
    };
    let scratch = (conn, prefix.clone());
    let served = served(
        "redis",
        || {
            Router::new()
                .route("/orders", post(redis_idem))
                .with_state(business.clone())
        },
        |budget| {
            let store = if budget.is_some() { &on } else { &off };
            budgeted(idem::Idem::builder(store.clone(), identity()), budget)
        },
    )
    .await;
    (served, scratch)
}

/// Every run of every store and pattern, off and on side by side; only those
/// `IDEM_BENCH_ONLY` names (`"pg one off,pg one on"`) when it is set.
fn runs(served: &[Served]) -> Vec<Run> {
    let mut runs: Vec<Run> = (0..served.len())
        .flat_map(|store| {
            Pattern::ALL.into_iter().flat_map(move |pattern| {
                [false, true].map(|on| Run {
                    store,
                    pattern,
                    on,
                    rps: Vec::new(),
                    p99: Vec::new(),
                })
            })
        })
        .collect();
    if let Ok(only) = std::env::var("IDEM_BENCH_ONLY") {
        let keep: Vec<&str> = only.split(',').map(str::trim).collect();
        runs.retain(|run| keep.contains(&run.name(served).as_str()));
    }
    runs
}

/// The Lua scripts of the timed patterns, written into `dir`.
struct Scripts {
    many: std::path::PathBuf,
    one: std::path::PathBuf,
}

/// Requests per second and p99 of one run, `id` making its keys and clients new.
fn measure(run: &Run, served: &[Served], scripts: &Scripts, seconds: u64, id: usize) -> (f64, f64) {
    let url = if run.on {
        run.pattern.on_url(&served[run.store])
    } else {
        served[run.store].off.as_str()
    };
    match run.pattern {
        Pattern::Many => wrk(url, &scripts.many, seconds, CONNECTIONS, id),
        Pattern::One => wrk(url, &scripts.one, seconds, CONNECTIONS, id),
        Pattern::OneDefault => burst(url, &format!("default-{id}"), "k", UNDER_DEFAULT),
        Pattern::Filled(n) => {
            let client = format!("filled-{id}");
            burst(url, &client, "fill", n);
            burst(url, &client, "k", FILLED_BURST)
        }
    }
}

/// The table of medians, off against on.
fn print_table(runs: &mut [Run], served: &[Served], rounds: usize, seconds: u64) {
    println!(
        "\nPOST /orders with a new key per request, {CONNECTIONS} connections, {rounds} interleaved rounds, medians\n"
    );
    println!(
        "| store | pattern | driver | budget off req/s | budget on req/s | on / off | p99 off | p99 on |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let medians: Vec<(f64, f64)> = runs
        .iter_mut()
        .map(|run| (median(&mut run.rps), median(&mut run.p99)))
        .collect();
    for (i, run) in runs.iter().enumerate() {
        if run.on {
            continue;
        }
        let Some(j) = runs
            .iter()
            .position(|r| r.on && r.store == run.store && r.pattern == run.pattern)
        else {
            continue;
        };
        let ((off, p99_off), (on, p99_on)) = (medians[i], medians[j]);
        println!(
            "| {} | {} | {} | {off:.0} | {on:.0} | **{:.2}** | {p99_off:.2} ms | {p99_on:.2} ms |",
            served[run.store].store,
            run.pattern.name(),
            run.pattern.driver(seconds),
            on / off
        );
    }
}

fn main() {
    let (rounds, seconds) = wrk::wrk_rounds();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (served, redis_scratch) = runtime.block_on(stores(dir.path()));
    let scripts = Scripts {
        many: dir.path().join("many.lua"),
        one: dir.path().join("one.lua"),
    };
    std::fs::write(
        &scripts.many,
        wrk::orders_script(r#""many-" .. run .. "-" .. (counter % 1000)"#, KEY),
    )
    .unwrap();
    // One client for the run, new in every run.
    std::fs::write(&scripts.one, wrk::orders_script(r#""one-" .. run"#, KEY)).unwrap();
    let mut runs = runs(&served);
    for round in 0..rounds {
        // Off and on of a pattern run back to back; which goes first alternates.
        let mut order: Vec<usize> = (0..runs.len()).collect();
        if round % 2 == 1 {
            order.chunks_mut(2).for_each(<[usize]>::reverse);
        }
        for i in order {
            let (rps, p99) = measure(&runs[i], &served, &scripts, seconds, round * 100 + i);
            let run = &mut runs[i];
            eprintln!(
                "round {} {}: {rps:.0} req/s, p99 {p99:.2} ms",
                round + 1,
                run.name(&served)
            );
            run.rps.push(rps);
            run.p99.push(p99);
        }
    }
    print_table(&mut runs, &served, rounds, seconds);
    if let Some((mut conn, prefix)) = redis_scratch {
        let deleted = runtime.block_on(redis_clean(&mut conn, &prefix));
        eprintln!("deleted the run's {deleted} Redis keys under {prefix}");
    }
    drop(runtime);
}
