//! A new key's store calls without the service: how much of a store's ratio to the
//! hand-written minimum is the store's own work, and how much the service's.
//!
//! ```sh
//! cargo bench -p idem-bench --bench alone
//! ```
//!
//! [`crate::stores`] measures `POST /orders` over loopback: HTTP, the enforcement's
//! stages, the store and its server together. This part drives the same writes from
//! tasks of one process, no HTTP and no enforcement, against the same servers:
//!
//! | store | min (the minimum's statements) | idem (the store's own calls, as the runtime makes them) |
//! |---|---|---|
//! | sqlite | `BEGIN`, the key row's `INSERT OR IGNORE`, the order's `INSERT`, `COMMIT` (`sqlite min`), on a file opened as `SqliteStore::open` opens one | the one-commit path of `SqliteStore` ([`one_commit_new_key`]): the key marked in this process and its record read, the writer's turn, the call that begins and marks the transaction, the order's `INSERT`, the call that writes the record and commits |
//! | pg | `BEGIN`, the key row's `INSERT … ON CONFLICT DO NOTHING`, the order's `INSERT`, `COMMIT` ([`crate::stores`]' `pg min`) | the one-commit path of `PostgresStore` ([`one_commit_new_key`]): `BEGIN` and the statement that takes the key's advisory lock and reads its record, the order's `INSERT`, the record's `INSERT`, completed, `COMMIT` |
//! | redis | `SET <key> <id> NX PX`, then the order's `PSETEX` (`redis min`) | `RedisStore`'s registration script, the order's `PSETEX`, the completion script |
//!
//! A store's ratio here is the ceiling of its ratio over loopback: what the store's
//! statements cost its server and the driver, with nothing of the service around them.
//! When the loopback ratio is close to it, the service adds little and the statements
//! are the gap; when it is well below, the service is.
//!
//! Each form runs on a file, a scratch schema or a key prefix of its own (the conformance
//! suite's), `tasks` tasks (32, as `wrk -c32`) over the store's pool or one multiplexed
//! Redis connection, on a 2-worker tokio runtime; `warm_up` keys each first (500; 50 in
//! the figures' quick form), then the PostgreSQL schemas analyzed (as autovacuum would be, [`crate::stores`]); then rounds
//! of `seconds`, the forms interleaved, and the median of each form's rates. Every key is
//! new: a call that finds one taken fails the run.
//!
//! | variable | default | what |
//! |---|---|---|
//! | `IDEM_BENCH_ROUNDS` | 3 | interleaved rounds |
//! | `IDEM_BENCH_SECONDS` | 3 | length of one form's run in a round |
//! | `IDEM_BENCH_TASKS` | 32 | tasks making calls at once |
//! | `IDEM_BENCH_ONLY` | all | comma-separated forms to run (`sqlite idem`, `pg min`, …), e.g. one for a profile (only their stores are set up; a name that is no form is reported); ratios need both of a store's |

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem::store::{
    Begin, NewRecord, OwnerToken, RecordKey, RecordStore, StoredResponse, UnixMillis,
};
use idem_runtime::OperationId;
use idem_runtime::store::Lease;
use idem_runtime::store::conformance::one_commit::one_commit_new_key;
use redis::aio::ConnectionManager;

use crate::stores::Form;
use crate::stores::handlers::{
    CreateOrder, PG_INSERT, RedisState, SQLITE_INSERT, env_or, new_id, now_ms, order_json,
    redis_clean,
};
use crate::wrk::median;

/// How a run of this part is sized.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Interleaved rounds.
    pub rounds: usize,
    /// Seconds each form runs in a round.
    pub seconds: u64,
    /// Tasks making calls at once.
    pub tasks: usize,
    /// Keys each form makes one after another before the rounds (and before the
    /// PostgreSQL schemas are analyzed).
    pub warm_up: u64,
    /// The forms to run (`"sqlite idem"`, `"pg min"`, …); all when `None`.
    pub only: Option<Vec<String>>,
}

impl Settings {
    /// The settings from `IDEM_BENCH_ROUNDS`, `IDEM_BENCH_SECONDS`, `IDEM_BENCH_TASKS`
    /// (3, 3, 32) and `IDEM_BENCH_ONLY` (comma-separated forms, all when unset).
    #[must_use]
    pub fn from_env() -> Settings {
        Settings {
            rounds: env_or("IDEM_BENCH_ROUNDS", 3),
            seconds: env_or("IDEM_BENCH_SECONDS", 3),
            tasks: env_or("IDEM_BENCH_TASKS", 32),
            warm_up: 500,
            only: std::env::var("IDEM_BENCH_ONLY")
                .ok()
                .map(|only| only.split(',').map(|s| s.trim().to_owned()).collect()),
        }
    }

    /// Whether the form `store`, `form` runs.
    fn runs(&self, store: &str, form: Form) -> bool {
        let name = format!("{store} {}", form_name(form));
        self.only.as_ref().is_none_or(|only| only.contains(&name))
    }

    /// What `only` names that is no form, each said so (a misspelt form would otherwise
    /// leave the run empty without a word).
    fn unknown_forms(&self) -> Vec<String> {
        let known = ["sqlite", "pg", "redis"]
            .into_iter()
            .flat_map(|store| [Form::Min, Form::Idem].map(|f| format!("{store} {}", form_name(f))))
            .collect::<Vec<_>>();
        self.only
            .iter()
            .flatten()
            .filter(|name| !known.contains(name))
            .map(|name| {
                format!(
                    "IDEM_BENCH_ONLY names {name:?}, which is no form (the forms: {})",
                    known.join(", ")
                )
            })
            .collect()
    }
}

/// One form's rates, a round each.
#[derive(Clone, Debug)]
pub struct Line {
    /// `sqlite`, `pg` or `redis`.
    pub store: &'static str,
    /// [`Form::Min`] or [`Form::Idem`].
    pub form: Form,
    /// New keys a second, one a round.
    pub rates: Vec<f64>,
}

impl Line {
    /// The median of the rounds' rates.
    #[must_use]
    pub fn rate(&self) -> f64 {
        median(&mut self.rates.clone())
    }
}

/// What a run measured, and what it left out.
#[derive(Clone, Debug)]
pub struct Report {
    /// The forms that ran.
    pub lines: Vec<Line>,
    /// The stores left out, and why (a server that did not answer).
    pub missing: Vec<String>,
}

impl Report {
    /// The median rate of `store`'s `form`, if it ran.
    #[must_use]
    pub fn rate(&self, store: &str, form: Form) -> Option<f64> {
        self.lines
            .iter()
            .find(|l| l.store == store && l.form == form)
            .map(Line::rate)
    }

    /// idem's rate over the minimum's on `store`, if both ran.
    #[must_use]
    pub fn ratio(&self, store: &str) -> Option<f64> {
        Some(self.rate(store, Form::Idem)? / self.rate(store, Form::Min)?)
    }

    /// The table: each form's rounds and median, and each store's ratio.
    pub fn print(&self) {
        println!("\n| store | form | new keys a second, each round | median | of the minimum |");
        println!("|---|---|---|---|---|");
        for line in &self.lines {
            let rounds: Vec<String> = line.rates.iter().map(|r| format!("{r:.0}")).collect();
            let ratio = match line.form {
                Form::Idem => self
                    .ratio(line.store)
                    .map_or_else(|| "–".to_owned(), |r| format!("**{r:.2}**")),
                _ => "1".to_owned(),
            };
            println!(
                "| {} | {} | {} | {:.0} | {ratio} |",
                line.store,
                form_name(line.form),
                rounds.join(", "),
                line.rate()
            );
        }
        for missing in &self.missing {
            println!("\nnot measured: {missing}");
        }
    }
}

/// `min` or `idem`.
fn form_name(form: Form) -> &'static str {
    match form {
        Form::Bare => "bare",
        Form::Min => "min",
        Form::Idem => "idem",
    }
}

/// One new key's calls: the key's number in the run, and what went wrong.
type Call =
    Arc<dyn Fn(u64) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// Runs every form at `settings`, on a runtime of its own.
///
/// # Panics
///
/// When a call fails (a store error, a key found taken) or a scratch schema cannot be
/// made; a server that does not answer is left out, not a panic.
#[must_use]
pub fn run(settings: &Settings) -> Report {
    let runtime = crate::serve::runtime();
    runtime.block_on(run_on(settings))
}

async fn run_on(settings: &Settings) -> Report {
    let mut forms: Vec<(&'static str, Form, Call)> = Vec::new();
    let mut missing = settings.unknown_forms();
    // A store is set up only when one of its forms runs.
    let wanted = |store| settings.runs(store, Form::Min) || settings.runs(store, Form::Idem);
    let dir = tempfile::tempdir().expect("a temporary directory");
    if wanted("sqlite") {
        forms.extend(sqlite(dir.path()).await);
    }
    let mut schemas = Vec::new();
    if wanted("pg") {
        match pg().await {
            Some((pg, pools)) => {
                forms.extend(pg);
                schemas.extend(pools);
            }
            None => missing.push("pg: PostgreSQL is not reachable".to_owned()),
        }
    }
    let redis = if wanted("redis") { redis().await } else { None };
    match &redis {
        Some((calls, _)) => forms.extend(calls.iter().cloned()),
        None if wanted("redis") => missing.push("redis: Redis is not reachable".to_owned()),
        None => {}
    }
    forms.retain(|(store, form, _)| settings.runs(store, *form));
    let counter = Arc::new(AtomicU64::new(0));
    for (store, form, call) in &forms {
        warm_up(call, &counter, settings.warm_up)
            .await
            .unwrap_or_else(|e| panic!("{store} {}: {e}", form_name(*form)));
    }
    for pool in &schemas {
        crate::stores::analyze(pool).await;
    }
    let mut lines: Vec<Line> = forms
        .iter()
        .map(|(store, form, _)| Line {
            store,
            form: *form,
            rates: Vec::new(),
        })
        .collect();
    for _ in 0..settings.rounds {
        for ((store, form, call), line) in forms.iter().zip(&mut lines) {
            let rate = drive(call, &counter, settings)
                .await
                .unwrap_or_else(|e| panic!("{store} {}: {e}", form_name(*form)));
            line.rates.push(rate);
        }
    }
    if let Some((_, (mut conn, prefix))) = redis {
        redis_clean(&mut conn, &prefix).await;
    }
    Report { lines, missing }
}

/// Makes `keys` calls one after another.
async fn warm_up(call: &Call, counter: &AtomicU64, keys: u64) -> Result<(), String> {
    for _ in 0..keys {
        call(counter.fetch_add(1, Ordering::Relaxed)).await?;
    }
    Ok(())
}

/// Calls from `settings.tasks` tasks for `settings.seconds`: the calls a second.
async fn drive(call: &Call, counter: &Arc<AtomicU64>, settings: &Settings) -> Result<f64, String> {
    let seconds = Duration::from_secs(settings.seconds);
    let started = Instant::now();
    let end = started + seconds;
    let done = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..settings.tasks)
        .map(|_| {
            let (call, counter, done) = (Arc::clone(call), Arc::clone(counter), Arc::clone(&done));
            tokio::spawn(async move {
                while Instant::now() < end {
                    call(counter.fetch_add(1, Ordering::Relaxed)).await?;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<(), String>(())
            })
        })
        .collect();
    for task in tasks {
        task.await.map_err(|e| e.to_string())??;
    }
    #[allow(clippy::cast_precision_loss, reason = "a count of calls")]
    let calls = done.load(Ordering::Relaxed) as f64;
    Ok(calls / started.elapsed().as_secs_f64())
}

/// The order every call writes.
fn order() -> CreateOrder {
    CreateOrder {
        customer_id: "cus_alone".to_owned(),
        amount_minor: 4200,
    }
}

/// Key `n` of one of 64 clients (as the stores part's new keys come from 64 clients).
fn key(n: u64) -> RecordKey {
    RecordKey::new(
        "create_order",
        format!("client-{}", n % 64),
        format!("alone-{n}"),
    )
}

/// A new record for a key at `now`, as the runtime registers one: the contract's lease
/// (30 s), TTL (24 h) and attempt time (10 s), no budget to count.
fn new_record(now: UnixMillis, transactional: bool) -> NewRecord {
    NewRecord {
        operation_id: OperationId::new(),
        fingerprint: format!("sha256:{}", "0123456789abcdef".repeat(4)),
        lease: Lease {
            token: OwnerToken::random(),
            until: now + 30_000,
        },
        expires_at: now + 86_400_000,
        transactional,
        holds_until: now + 10_000,
        budget: None,
    }
}

/// The 201 the handler would answer, as the record stores it.
fn response(id: &str) -> StoredResponse {
    let body = order_json(id, &order()).to_string();
    StoredResponse {
        status: 201,
        headers: vec![
            (
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            ),
            (
                axum::http::header::LOCATION,
                axum::http::HeaderValue::try_from(format!("/orders/{id}"))
                    .expect("an order id is a header value"),
            ),
        ],
        body: body.into(),
    }
}

fn unix_now() -> UnixMillis {
    UnixMillis::try_from(now_ms()).unwrap_or(0)
}

/// What the two SQL databases' forms differ in: the minimum's key row and the order's
/// insert, as the stores part writes them.
trait Sql: sqlx::Database {
    /// The minimum's key row (client, key, order id, creation time).
    const KEY: &'static str;
    /// The order's insert (id, operation id, customer, amount, creation time).
    const ORDER: &'static str;

    /// The rows a statement wrote.
    fn rows(done: &Self::QueryResult) -> u64;
}

impl Sql for sqlx::Sqlite {
    const KEY: &'static str = crate::stores::SQLITE_KEY;
    const ORDER: &'static str = SQLITE_INSERT;

    fn rows(done: &sqlx::sqlite::SqliteQueryResult) -> u64 {
        done.rows_affected()
    }
}

impl Sql for sqlx::Postgres {
    const KEY: &'static str = crate::stores::PG_KEY;
    const ORDER: &'static str = PG_INSERT;

    fn rows(done: &sqlx::postgres::PgQueryResult) -> u64 {
        done.rows_affected()
    }
}

/// The order's insert for operation `operation_id` on `conn` (a transaction's).
async fn write_order<DB: Sql>(
    conn: &mut DB::Connection,
    id: &str,
    operation_id: &str,
) -> Result<(), sqlx::Error>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let order = order();
    sqlx::query::<DB>(DB::ORDER)
        .bind(id.to_owned())
        .bind(operation_id.to_owned())
        .bind(order.customer_id)
        .bind(order.amount_minor)
        .bind(now_ms())
        .execute(conn)
        .await
        .map(drop)
}

/// The order's insert on the attempt's transaction: the business write of
/// [`one_commit_new_key`].
fn insert_order<'t, DB: Sql>(
    tx: &'t mut sqlx::Transaction<'static, DB>,
    operation_id: &'t str,
) -> Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send + 't>>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    Box::pin(async move { write_order::<DB>(&mut **tx, &new_id(), operation_id).await })
}

/// The minimum's new key: its key row and the order, one transaction.
async fn sql_min<DB: Sql>(pool: &sqlx::Pool<DB>, n: u64) -> Result<(), sqlx::Error>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let (key, id) = (key(n), new_id());
    let mut tx = pool.begin().await?;
    let claimed = sqlx::query::<DB>(DB::KEY)
        .bind(key.client)
        .bind(key.key)
        .bind(id.clone())
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
    if DB::rows(&claimed) != 1 {
        return Err(sqlx::Error::Protocol(format!("key {n} was taken")));
    }
    write_order::<DB>(&mut tx, &id, &id).await?;
    tx.commit().await
}

/// A SQL store's two forms: the minimum on `pool`, idem's one-commit path on `store`.
fn sql_forms<DB, S>(
    store: &'static str,
    pool: sqlx::Pool<DB>,
    idem: S,
) -> Vec<(&'static str, Form, Call)>
where
    DB: Sql,
    S: idem_runtime::store::TransactionalStore<Database = DB> + 'static,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'q> i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let min_call: Call = Arc::new(move |n| {
        let pool = pool.clone();
        Box::pin(async move { sql_min(&pool, n).await.map_err(|e| e.to_string()) })
    });
    let idem = Arc::new(idem);
    let idem_call: Call = Arc::new(move |n| {
        let store = Arc::clone(&idem);
        Box::pin(async move {
            let (key, now) = (key(n), unix_now());
            let new = new_record(now, true);
            let response = response(&new_id());
            one_commit_new_key(&*store, &key, &new, &response, now, insert_order::<DB>)
                .await
                .map_err(|e| e.to_string())
        })
    });
    vec![(store, Form::Min, min_call), (store, Form::Idem, idem_call)]
}

/// SQLite's two forms, each on a file of its own in `dir`, opened as `SqliteStore::open`
/// opens one (WAL, `synchronous = FULL`).
async fn sqlite(dir: &std::path::Path) -> Vec<(&'static str, Form, Call)> {
    let min = crate::stores::sqlite_file(dir, "alone-min").await;
    let store = crate::stores::sqlite_file(dir, "alone-idem").await;
    sql_forms("sqlite", min.pool().clone(), store)
}

/// PostgreSQL's two forms on scratch schemas of their own; none when it does not answer.
/// The two schemas' pools come with them, to be analyzed after the warm-up.
async fn pg() -> Option<(Vec<(&'static str, Form, Call)>, [sqlx::PgPool; 2])> {
    let min = crate::stores::pg_schema().await?;
    let pool = crate::stores::pg_schema().await?;
    let schemas = [min.clone(), pool.clone()];
    let store = idem::PostgresStore::from_pool(pool)
        .await
        .expect("the store's tables");
    Some((sql_forms("pg", min, store), schemas))
}

/// Redis's two forms under one scratch prefix, and a connection and the prefix to delete
/// it with; none when Redis does not answer.
async fn redis() -> Option<(Vec<(&'static str, Form, Call)>, (ConnectionManager, String))> {
    let url = idem_runtime::store::conformance::redis::url_or_skip("the alone part").await?;
    let prefix = idem_runtime::store::conformance::redis::scratch_prefix();
    let store = idem::RedisStore::connect(&url)
        .await
        .expect("Redis answers")
        .with_prefix(format!("{prefix}:idem"));
    let client = redis::Client::open(url.as_str()).expect("a Redis URL");
    let conn = client
        .get_connection_manager()
        .await
        .expect("Redis answers");
    let orders = RedisState {
        conn: idem::store::RedisConnection::Server(conn.clone()),
        prefix: Arc::from(prefix.as_str()),
    };
    let min_orders = orders.clone();
    let min_call: Call = Arc::new(move |n| {
        let orders = min_orders.clone();
        Box::pin(async move { redis_min(&orders, n).await.map_err(|e| e.to_string()) })
    });
    let store = Arc::new(store);
    let idem_call: Call = Arc::new(move |n| {
        let (store, orders) = (Arc::clone(&store), orders.clone());
        Box::pin(async move { redis_idem(&store, &orders, n).await })
    });
    let forms = vec![
        ("redis", Form::Min, min_call),
        ("redis", Form::Idem, idem_call),
    ];
    Some((forms, (conn, prefix)))
}

/// The minimum's new key on Redis: `SET NX PX` of its key, then the order.
async fn redis_min(orders: &RedisState, n: u64) -> redis::RedisResult<()> {
    let (key, id) = (key(n), new_id());
    let mut conn = orders.conn.clone();
    let claimed: Option<String> = redis::cmd("SET")
        .arg(format!(
            "{}:key:{}:{}:{}",
            orders.prefix,
            key.client.len(),
            key.client,
            key.key
        ))
        .arg(&id)
        .arg("NX")
        .arg("PX")
        .arg(crate::stores::KEY_TTL_MS)
        .query_async(&mut conn)
        .await?;
    if claimed.is_none() {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "a new key was taken",
        )));
    }
    orders.write_order(&id, &order()).await
}

/// idem's new key on Redis: the store's registration, the order, the store's completion.
async fn redis_idem(store: &idem::RedisStore, orders: &RedisState, n: u64) -> Result<(), String> {
    let (key, now) = (key(n), unix_now());
    let new = new_record(now, false);
    match store.begin(&key, &new, now).await {
        Ok(Begin::Started(_)) => {}
        Ok(other) => return Err(format!("key {n} was not new: {other:?}")),
        Err(error) => return Err(error.to_string()),
    }
    let id = new_id();
    orders
        .write_order(&id, &order())
        .await
        .map_err(|e| e.to_string())?;
    store
        .complete(&key, new.lease.token, &response(&id), now)
        .await
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::{Form, Settings};

    fn only(names: &[&str]) -> Settings {
        Settings {
            rounds: 1,
            seconds: 1,
            tasks: 1,
            warm_up: 1,
            only: Some(names.iter().map(|&n| n.to_owned()).collect()),
        }
    }

    #[test]
    fn only_keeps_the_forms_it_names() {
        let settings = only(&["sqlite idem", "pg min"]);
        assert!(settings.runs("sqlite", Form::Idem));
        assert!(settings.runs("pg", Form::Min));
        assert!(!settings.runs("sqlite", Form::Min));
        assert!(!settings.runs("redis", Form::Idem));
        assert!(settings.unknown_forms().is_empty());
        let all = Settings {
            only: None,
            ..settings
        };
        assert!(all.runs("redis", Form::Min));
    }

    #[test]
    fn a_name_that_is_no_form_is_said() {
        let unknown = only(&["sqlite idem", "postgres idem", "", "pg  min"]).unknown_forms();
        assert_eq!(unknown.len(), 3, "{unknown:?}");
        assert!(
            unknown[0].starts_with("IDEM_BENCH_ONLY names \"postgres idem\", which is no form")
        );
        assert!(
            unknown[0].contains("pg idem"),
            "the forms are listed: {}",
            unknown[0]
        );
    }
}
