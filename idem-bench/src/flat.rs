//! Flat as the store grows: `cargo bench -p idem-bench --bench flat` (needs `wrk` on the
//! PATH: `apt-get install wrk`).
//!
//! **memory**: the contracted `POST /orders` handler of [`crate::stores::handlers`] with
//! `MemoryStore`, every request a new key of one client (one key scope), under a budget
//! it never reaches (so that the per-client accounting runs as in a service): a fresh
//! store (a new one each round) against one that already holds
//! `IDEM_BENCH_MEMORY_RECORDS` (4,000,000) completed records of that client, made
//! through the store's own calls.
//!
//! **pg**: the transactional handler (`PgTx` with `PostgresStore`, scratch schemas),
//! every request a new key from one of 1,000 clients: a fresh schema (a new one each
//! round) against one with `IDEM_BENCH_RECORDS` (10,000,000) records bulk-loaded by one
//! `INSERT … SELECT generate_series` (completed records of the same operation, their
//! expiries spread evenly over the day around now: half expired; the table's indexes
//! dropped for the load and built again after it; then `VACUUM ANALYZE` and a
//! `CHECKPOINT`, as a service's table would be, not right after a bulk load). Then,
//! for each purge of `IDEM_BENCH_PURGES` (`store`: the store's `purge_expired`, batches
//! of 5,000 with 250 ms between them; `<batch>:<ms>`: the same statement in batches of
//! `batch` with `ms` between them; by default `store,5000:0`), the same traffic in
//! windows while it deletes the next `IDEM_BENCH_PURGE` (1,000,000) expired records,
//! until it ends (the last window, partly after it, left out), against windows just
//! before it without a purge, medians of each.
//! The loaded schema is dropped at the end.
//!
//! Each window is `wrk -t2 -c32` for `IDEM_BENCH_SECONDS` (5); `IDEM_BENCH_ROUNDS` (3)
//! rounds, interleaved, alternating which goes first. The table gives medians of
//! requests per second and of p99, and each rate's ratio to the same run's baseline.
//! An answer that is not 2xx is printed and counted, not fatal. `IDEM_BENCH_ONLY=pg` or
//! `memory` runs one part.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use idem::store::{ClientBudget, OperatorStore, RecordKey, RecordStore, StoredResponse};

use crate::stores::handlers::*;
use crate::wrk;

/// New keys from 1,000 clients (`c-0` … `c-999`).
fn many_script() -> String {
    wrk::orders_script(
        r#""c-" .. (counter % 1000)"#,
        r#""f-" .. run .. "-" .. tid .. "-" .. counter"#,
    )
}

/// New keys, all of client `scope`.
fn scope_script() -> String {
    wrk::orders_script(
        r#""scope""#,
        r#""s-" .. run .. "-" .. tid .. "-" .. counter"#,
    )
}

/// A day, in milliseconds.
const DAY_MS: i64 = 86_400_000;

/// Completed records of `$3` (the operation) over 1,000 clients, `$2` of them, their
/// expiries spread evenly over the day around `$1` (now): the first half expired.
const LOAD: &str = "INSERT INTO idem_records
        (operation, client, key, operation_id, fingerprint, state, attempt, token,
         lease_until, created_at, expires_at, status, headers, body, stored_bytes)
    SELECT $3, 'load-' || (i % 1000), 'load-' || i,
        '01900000-0000-7000-8000-' || lpad(i::text, 12, '0'),
        'sha256:' || md5(i::text) || md5((i + 1)::text), 'completed', 1, NULL, NULL,
        $1 - 86400000 + i * 86400000 / $2, $1 - 43200000 + i * 86400000 / $2, 201,
        '[[\"content-type\",\"application/json\"],[\"location\",\"/orders/ord_' || i || '\"]]',
        convert_to('{\"id\":\"ord_' || i || '\",\"customer_id\":\"cus_42\",\"amount_minor\":1999}', 'UTF8'),
        120
    FROM generate_series(0::bigint, $2 - 1) AS i";

/// One purge: the store's own (`batch` `None`), or the store's statement in batches of
/// `batch` with `pause` between them.
#[derive(Clone, Copy, Debug)]
pub struct Purge {
    /// Records deleted a statement; `None` for the store's own `purge_expired`.
    pub batch: Option<u64>,
    /// The pause between two batches.
    pub pause: Duration,
}

impl Purge {
    /// The store's own `purge_expired`.
    pub const STORE: Purge = Purge {
        batch: None,
        pause: Duration::ZERO,
    };

    /// The purges `IDEM_BENCH_PURGES` names, comma-separated: `store` (the store's
    /// `purge_expired`) or `<batch>:<pause in ms>`; by default `store,5000:0`.
    ///
    /// # Panics
    ///
    /// When a batch or a pause is not a number.
    #[must_use]
    pub fn from_env() -> Vec<Purge> {
        let list = std::env::var("IDEM_BENCH_PURGES").unwrap_or_else(|_| "store,5000:0".into());
        list.split(',')
            .map(|p| match p.trim().split_once(':') {
                Some((batch, pause)) => Purge {
                    batch: Some(batch.parse().expect("a batch size")),
                    pause: Duration::from_millis(pause.parse().expect("a pause in ms")),
                },
                None => Purge {
                    batch: None,
                    pause: Duration::ZERO,
                },
            })
            .collect()
    }

    /// Its name in the table.
    #[must_use]
    pub fn name(self) -> String {
        match self.batch {
            None => "purge_expired (5000 a batch, 250 ms pause)".into(),
            Some(batch) if self.pause.is_zero() => format!("{batch} a batch"),
            Some(batch) => format!("{batch} a batch, {} ms pause", self.pause.as_millis()),
        }
    }
}

/// One line of the table.
#[derive(Clone, Debug)]
pub struct Line {
    /// What ran: the store, the traffic, and the purge if one ran beside it.
    pub variant: String,
    /// The records in the store the traffic ran on.
    pub records: u64,
    /// Requests per second, the median of the rounds (or of the purge's windows).
    pub rps: f64,
    /// The 99th percentile of latency in milliseconds, the median likewise.
    pub p99: f64,
    /// `rps` over the same run's baseline (the line before it, whose ratio is 1).
    pub ratio: f64,
    /// The expired records the purge beside the traffic was to delete; 0 when none ran.
    pub purged: u64,
    /// What the line is: a baseline, the traffic on a grown store, or during a purge.
    pub kind: LineKind,
}

/// What a [`Line`] measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineKind {
    /// The traffic on a fresh store, or without a purge: the next line's baseline.
    Baseline,
    /// The memory store's one scope, grown.
    MemoryGrown,
    /// PostgreSQL, grown.
    PgGrown,
    /// PostgreSQL while a purge runs.
    PgPurging,
}

/// How a run is shaped.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Interleaved rounds (the purge's baseline windows too).
    pub rounds: usize,
    /// The length of one `wrk` window, in seconds.
    pub seconds: u64,
    /// `memory`, `pg`, or both (`None`).
    pub only: Option<String>,
    /// Records of the one scope in the grown memory store.
    pub memory_records: u64,
    /// Records loaded into the grown PostgreSQL schema.
    pub records: i64,
    /// Expired records each purge deletes (at most a share of the expired half).
    pub purge: i64,
    /// The purges, one after the other.
    pub purges: Vec<Purge>,
}

impl Settings {
    /// `IDEM_BENCH_ROUNDS` (3), `IDEM_BENCH_SECONDS` (5), `IDEM_BENCH_ONLY`,
    /// `IDEM_BENCH_MEMORY_RECORDS` (4,000,000), `IDEM_BENCH_RECORDS` (10,000,000),
    /// `IDEM_BENCH_PURGE` (1,000,000) and `IDEM_BENCH_PURGES` ([`Purge::from_env`]).
    ///
    /// Exits with 2 when `wrk` is not on the `PATH`.
    #[must_use]
    pub fn from_env() -> Settings {
        let (rounds, seconds) = wrk::wrk_rounds();
        Settings {
            rounds,
            seconds,
            only: std::env::var("IDEM_BENCH_ONLY")
                .ok()
                .filter(|o| !o.is_empty()),
            memory_records: env_or("IDEM_BENCH_MEMORY_RECORDS", 4_000_000),
            records: env_or("IDEM_BENCH_RECORDS", 10_000_000),
            purge: env_or("IDEM_BENCH_PURGE", 1_000_000),
            purges: Purge::from_env(),
        }
    }

    fn runs(&self, part: &str) -> bool {
        self.only.as_deref().is_none_or(|only| only == part)
    }

    /// These settings for `part` alone (`memory` or `pg`), if they run it.
    #[must_use]
    pub fn part(&self, part: &str) -> Option<Settings> {
        self.runs(part).then(|| Settings {
            only: Some(part.to_owned()),
            ..self.clone()
        })
    }
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct Report {
    /// The table's lines, each baseline before what is measured against it.
    pub lines: Vec<Line>,
    /// Answers that were not 2xx, over the whole run.
    pub errors: u64,
}

impl Report {
    /// The lines of `self`, then those of `other`, and the errors of both.
    #[must_use]
    pub fn and(mut self, other: Report) -> Report {
        self.lines.extend(other.lines);
        self.errors += other.errors;
        self
    }

    /// The markdown table.
    pub fn print(&self) {
        println!("| variant | records in the store | requests/s | p99 | ratio |");
        println!("|---|---|---|---|---|");
        for l in &self.lines {
            println!(
                "| {} | {} | {:.0} | {:.2} ms | {:.2} |",
                l.variant, l.records, l.rps, l.p99, l.ratio
            );
        }
    }

    /// The first line of `kind`.
    #[must_use]
    pub fn find(&self, kind: LineKind) -> Option<&Line> {
        self.lines.iter().find(|l| l.kind == kind)
    }
}

/// The knobs and the place of the Lua scripts.
struct Bench {
    seconds: u64,
    rounds: usize,
    dir: tempfile::TempDir,
    runs: usize,
    /// Answers that were not 2xx, over the whole run.
    errors: u64,
}

impl Bench {
    /// One `wrk -t2 -c32` run of `script` against `url`: requests per second and p99 in
    /// milliseconds. An answer that is not 2xx is counted in [`Bench::errors`] and shown
    /// (the script prints it), not fatal: the transactional mode's rare unexplained
    /// `attempt-rolled-back` (BENCHMARKS.md, issue 23) must not end a long run.
    fn wrk(&mut self, url: &str, script: &str) -> (f64, f64) {
        self.runs += 1;
        let path = self.dir.path().join(format!("script.{}.lua", self.runs));
        std::fs::write(&path, format!("run = \"{}\"\n{script}", self.runs)).unwrap();
        let out = Command::new("wrk")
            .args([
                "-t2",
                "-c32",
                &format!("-d{}s", self.seconds),
                "--latency",
                "-s",
            ])
            .arg(&path)
            .arg(format!("{url}/orders"))
            .output()
            .expect("wrk runs (apt-get install wrk)");
        let text = String::from_utf8_lossy(&out.stdout);
        let field = |prefix: &str| {
            text.lines()
                .find_map(|l| l.trim().strip_prefix(prefix))
                .map(str::trim)
        };
        if let Some(errors) = field("Non-2xx or 3xx responses:") {
            self.errors += errors.parse::<u64>().unwrap_or(1);
            let answers = text.lines().filter(|l| l.starts_with("answered"));
            eprintln!(
                "{errors} answers not 2xx: {:?}",
                answers.take(3).collect::<Vec<_>>()
            );
        }
        let rps = field("Requests/sec:")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no Requests/sec in:\n{text}"));
        let p99 = field("99%").map_or(f64::NAN, wrk::latency_ms);
        (rps, p99)
    }
}

/// The server's load average, as `/proc/loadavg` gives it.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |_| "unknown".into(),
        |l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    )
}

/// Runs the parts `settings` keeps: the memory store's and PostgreSQL's (left out, with
/// the reason printed, when the server does not answer).
///
/// # Panics
///
/// When the temporary directory, the runtime, `wrk` or a store's setup fails.
#[must_use]
pub fn run(settings: &Settings) -> Report {
    let mut bench = Bench {
        seconds: settings.seconds,
        rounds: settings.rounds,
        dir: tempfile::tempdir().expect("a temporary directory"),
        runs: 0,
        errors: 0,
    };
    let runtime = crate::serve::runtime();
    eprintln!("load average at the start: {}", load());
    let mut lines = Vec::new();
    if settings.runs("memory") {
        lines.extend(memory(&runtime, &mut bench, settings.memory_records));
    }
    if settings.runs("pg") {
        lines.extend(pg(&runtime, &mut bench, settings));
    }
    eprintln!("load average at the end: {}", load());
    eprintln!("answers that were not 2xx: {}", bench.errors);
    Report {
        lines,
        errors: bench.errors,
    }
}

// ---- memory -------------------------------------------------------------------------

/// A handle on `store` whose budget the run never reaches, served.
async fn memory_served(store: Arc<idem::MemoryStore>) -> String {
    let idem = idem::Idem::builder(store, idem::identity::header("x-client-id"))
        .client_budget(ClientBudget::new(1 << 40, 1 << 50))
        .build();
    let router = Router::new()
        .route("/orders", post(memory_idem))
        .with_state(Orders::default())
        .layer(idem.layer());
    serve(router).await
}

/// Fills `store` with `n` completed records of client `scope` under `operation`, their
/// expiries spread over the coming day, counted for the client's budget as the handle's
/// registrations would be.
async fn memory_fill(store: &idem::MemoryStore, operation: &str, n: u64) {
    let response = StoredResponse {
        status: 201,
        headers: vec![(
            axum::http::header::LOCATION,
            axum::http::HeaderValue::from_static("/orders/ord_0190000000007000800000000000"),
        )],
        body: bytes_body(),
    };
    let now = u64::try_from(now_ms()).unwrap();
    for i in 0..n {
        let key = RecordKey::new(operation, "scope", format!("load-{i}"));
        let mut new = idem_runtime::store::conformance::new_record("sha256:0", now);
        new.expires_at = now + i * 86_400_000 / n.max(1);
        new.budget = Some(ClientBudget::COUNT_ONLY);
        store.begin(&key, &new, now).await.unwrap();
        store
            .complete(&key, new.lease.token, &response, now)
            .await
            .unwrap();
    }
}

/// The body the handler answers with, as stored.
fn bytes_body() -> axum::body::Bytes {
    axum::body::Bytes::from_static(
        br#"{"id":"ord_0190000000007000800000000000","customer_id":"cus_42","amount_minor":1999}"#,
    )
}

/// The operation of the only record kind in `store` (the handler's), after one request
/// to `url` made one.
async fn operation_of(store: &dyn OperatorStore, url: &str, client: &str) -> String {
    let answer = reqwest::Client::new()
        .post(format!("{url}/orders"))
        .header("content-type", "application/json")
        .header("x-client-id", client)
        .header("idempotency-key", format!("first-{}", new_id()))
        .body(BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 201);
    let query = idem::store::ListQuery {
        limit: 1,
        ..Default::default()
    };
    let now = u64::try_from(now_ms()).unwrap();
    let listed = store.list(&query, now).await.unwrap();
    listed[0].key.operation.clone()
}

/// The memory part: one scope's new keys on a fresh store (a new one each round)
/// against one that holds `IDEM_BENCH_MEMORY_RECORDS` records of that scope.
fn memory(runtime: &tokio::runtime::Runtime, bench: &mut Bench, n: u64) -> Vec<Line> {
    let full = Arc::new(idem::MemoryStore::new());
    let full_url = runtime.block_on(async {
        let full_url = memory_served(Arc::clone(&full)).await;
        let operation = operation_of(&*full, &full_url, "scope").await;
        let started = Instant::now();
        memory_fill(&full, &operation, n).await;
        eprintln!("memory: {n} records made in {:.1?}", started.elapsed());
        full_url
    });
    let (mut empty, mut filled) = (Vec::new(), Vec::new());
    for round in 0..bench.rounds {
        let fresh = Arc::new(idem::MemoryStore::new());
        let fresh_url = runtime.block_on(memory_served(Arc::clone(&fresh)));
        let urls = [(&fresh_url, &mut empty), (&full_url, &mut filled)];
        for (url, into) in alternate(urls, round) {
            into.push(bench.wrk(url, &scope_script()));
        }
        eprintln!(
            "memory round {}: fresh {:.0} req/s (it ended with {} records), full {:.0} req/s",
            round + 1,
            empty[round].0,
            fresh.len(),
            filled[round].0
        );
    }
    baseline_and(
        "memory, one scope, new keys",
        LineKind::MemoryGrown,
        &mut empty,
        &mut filled,
        n,
    )
}

/// `pair` in its order in even rounds, reversed in odd ones.
fn alternate<T>(pair: [T; 2], round: usize) -> Vec<T> {
    let mut pair = Vec::from(pair);
    if round % 2 == 1 {
        pair.reverse();
    }
    pair
}

/// The median of the rates and of the p99s of `runs`.
fn medians(runs: &mut [(f64, f64)]) -> (f64, f64) {
    let mut rps: Vec<f64> = runs.iter().map(|r| r.0).collect();
    let mut p99: Vec<f64> = runs.iter().map(|r| r.1).collect();
    (wrk::median(&mut rps), wrk::median(&mut p99))
}

/// The lines of `variant` at 0 records (`empty`) and at `n` (`filled`), medians of
/// their rounds.
fn baseline_and(
    variant: &str,
    kind: LineKind,
    empty: &mut [(f64, f64)],
    filled: &mut [(f64, f64)],
    n: u64,
) -> Vec<Line> {
    let (rps0, p0) = medians(empty);
    let (rps, p99) = medians(filled);
    vec![
        Line {
            variant: variant.into(),
            records: 0,
            rps: rps0,
            p99: p0,
            ratio: 1.0,
            purged: 0,
            kind: LineKind::Baseline,
        },
        Line {
            variant: variant.into(),
            records: n,
            rps,
            p99,
            ratio: rps / rps0,
            purged: 0,
            kind,
        },
    ]
}

// ---- PostgreSQL -----------------------------------------------------------------------

/// The PostgreSQL part: new keys on a fresh schema (a new one each round) against one
/// with `IDEM_BENCH_RECORDS` records, then during each purge of `IDEM_BENCH_PURGES`.
fn pg(runtime: &tokio::runtime::Runtime, bench: &mut Bench, settings: &Settings) -> Vec<Line> {
    let n = settings.records;
    let purges = &settings.purges;
    let purged = settings
        .purge
        .min(n / 2 / i64::try_from(purges.len().max(1)).unwrap_or(1));
    let Some((store, url)) = runtime.block_on(pg_served()) else {
        eprintln!("PostgreSQL is not reachable: the pg part is left out");
        return Vec::new();
    };
    let now = now_ms();
    runtime.block_on(pg_load(&store, &url, n, now));
    let (mut empty, mut filled) = (Vec::new(), Vec::new());
    for round in 0..bench.rounds {
        let (_, fresh_url) = runtime.block_on(pg_served()).unwrap();
        for (url, into) in alternate([(&fresh_url, &mut empty), (&url, &mut filled)], round) {
            into.push(bench.wrk(url, &many_script()));
        }
        eprintln!(
            "pg round {}: fresh {:.0} req/s, loaded {:.0} req/s",
            round + 1,
            empty[round].0,
            filled[round].0
        );
    }
    let records = u64::try_from(n).unwrap();
    let mut lines = baseline_and(
        "pg-tx, new keys",
        LineKind::PgGrown,
        &mut empty,
        &mut filled,
        records,
    );
    for (k, purge) in purges.iter().enumerate() {
        // The k-th slice of `purged` records of the expired half (oldest first).
        let upto = now - DAY_MS / 2 + (k as i64 + 1) * purged * DAY_MS / n;
        let mut without: Vec<_> = (0..bench.rounds)
            .map(|_| bench.wrk(&url, &many_script()))
            .collect();
        let (without, p_without) = medians(&mut without);
        let (during, p_during) = pg_purging(runtime, bench, &store, &url, *purge, upto);
        lines.push(Line {
            variant: format!("pg-tx, new keys, no purge (before: {})", purge.name()),
            records,
            rps: without,
            p99: p_without,
            ratio: 1.0,
            purged: 0,
            kind: LineKind::Baseline,
        });
        lines.push(Line {
            variant: format!("pg-tx, new keys, purging {purged}: {}", purge.name()),
            records,
            rps: during,
            p99: p_during,
            ratio: during / without,
            purged: u64::try_from(purged).unwrap_or(0),
            kind: LineKind::PgPurging,
        });
    }
    runtime.block_on(pg_drop(&store));
    lines
}

/// Drops the loaded scratch schema (gigabytes) and closes its pool.
async fn pg_drop(store: &idem::PostgresStore) {
    let schema: String = sqlx::query_scalar("SELECT current_schema()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    if schema.starts_with("idem_t_") {
        let drop = format!("DROP SCHEMA {schema} CASCADE");
        sqlx::query(sqlx::AssertSqlSafe(drop))
            .execute(store.pool())
            .await
            .unwrap();
    }
    store.pool().close().await;
}

/// A scratch schema with the orders table, its `PostgresStore` under the transactional
/// handle, served.
async fn pg_served() -> Option<(idem::PostgresStore, String)> {
    let pool =
        idem_runtime::store::conformance::postgres::scratch_pool("the flat benchmark").await?;
    sqlx::query(ORDERS).execute(&pool).await.unwrap();
    let store = idem::PostgresStore::from_pool(pool.clone()).await.unwrap();
    let idem = idem::Idem::transactional(store.clone(), idem::identity::header("x-client-id"));
    let router = Router::new()
        .route("/orders", post(pg_idem))
        .with_state(pool)
        .layer(idem.layer());
    Some((store, serve(router).await))
}

/// Loads `n` records of the handler's operation ([`LOAD`]) around `now`, then vacuums
/// and analyzes the table. The table's indexes and primary key are dropped for the load
/// and built again after it, as the store's migrations made them (their definitions read
/// back from the catalog): a sorted build of 10 M entries takes a fraction of 10 M
/// inserts into each B-tree. Built whole, the indexes are denser than ones grown key by
/// key; the traffic then measured inserts into them as a service's would.
async fn pg_load(store: &idem::PostgresStore, url: &str, n: i64, now: i64) {
    let operation = operation_of(store, url, "c-0").await;
    let started = Instant::now();
    let mut conn = store.pool().acquire().await.unwrap();
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT indexname, indexdef FROM pg_indexes
        WHERE schemaname = current_schema() AND tablename = 'idem_records'
          AND indexname <> 'idem_records_pkey'",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let key: (String, String) = sqlx::query_as(
        "SELECT conname::text, pg_get_constraintdef(oid) FROM pg_constraint
        WHERE conrelid = 'idem_records'::regclass AND contype = 'p'",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    let mut before = vec![format!(
        "ALTER TABLE idem_records DROP CONSTRAINT {}",
        key.0
    )];
    before.extend(indexes.iter().map(|(name, _)| format!("DROP INDEX {name}")));
    let mut after = vec![
        "SET maintenance_work_mem = '512MB'".to_owned(),
        format!(
            "ALTER TABLE idem_records ADD CONSTRAINT {} {}",
            key.0, key.1
        ),
    ];
    after.extend(indexes.into_iter().map(|(_, definition)| definition));
    for sql in before {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    sqlx::query(LOAD)
        .bind(now)
        .bind(n)
        .bind(&operation)
        .execute(&mut *conn)
        .await
        .unwrap();
    let loaded = started.elapsed();
    for sql in after {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    let indexed = started.elapsed() - loaded;
    // As autovacuum would after such an insert, and the checkpoint it forces: the traffic
    // measured is a service's with these records, not right after a bulk load.
    for settle in [
        "RESET maintenance_work_mem",
        "VACUUM (ANALYZE) idem_records",
        "CHECKPOINT",
    ] {
        sqlx::query(settle).execute(&mut *conn).await.unwrap();
    }
    let size: String =
        sqlx::query_scalar("SELECT pg_size_pretty(pg_total_relation_size('idem_records'))")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    eprintln!(
        "pg: {n} records loaded in {loaded:.1?}, indexed in {indexed:.1?}, vacuumed in {:.1?}; the table and its indexes: {size}",
        started.elapsed() - loaded - indexed
    );
}

/// New keys in windows of the bench's seconds while `purge` deletes the records expired
/// at `upto`, until it ends: the median rate and p99 of the windows it spanned.
fn pg_purging(
    runtime: &tokio::runtime::Runtime,
    bench: &mut Bench,
    store: &idem::PostgresStore,
    url: &str,
    purge: Purge,
    upto: i64,
) -> (f64, f64) {
    let store = store.clone();
    let task = runtime.spawn(async move {
        let started = Instant::now();
        (pg_purge(&store, purge, upto).await, started.elapsed())
    });
    let mut windows = Vec::new();
    while !task.is_finished() || windows.is_empty() {
        windows.push(bench.wrk(url, &many_script()));
    }
    let (deleted, took) = runtime.block_on(task).unwrap();
    eprintln!(
        "pg: {}: {deleted} records in {took:.1?} ({:.0}/s), {} windows: {:?}",
        purge.name(),
        deleted as f64 / took.as_secs_f64(),
        windows.len(),
        windows.iter().map(|w| w.0.round()).collect::<Vec<_>>()
    );
    // The last window may have run partly after the purge ended: left out if others ran.
    if windows.len() > 1 {
        windows.pop();
    }
    medians(&mut windows)
}

/// Deletes the records expired at `upto`: the store's `purge_expired`, or its statement
/// in batches of `purge.batch` with `purge.pause` between them. How many.
async fn pg_purge(store: &idem::PostgresStore, purge: Purge, upto: i64) -> u64 {
    let Some(batch) = purge.batch else {
        return store
            .purge_expired(u64::try_from(upto).unwrap())
            .await
            .unwrap();
    };
    let sql = format!(
        "DELETE FROM idem_records WHERE ctid = ANY (ARRAY(
            SELECT ctid FROM idem_records WHERE expires_at <= $1
            ORDER BY expires_at LIMIT {batch} FOR UPDATE SKIP LOCKED))"
    );
    let mut deleted = 0;
    loop {
        let done = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .bind(upto)
            .execute(store.pool())
            .await
            .unwrap()
            .rows_affected();
        deleted += done;
        if done < batch {
            return deleted;
        }
        tokio::time::sleep(purge.pause).await;
    }
}
