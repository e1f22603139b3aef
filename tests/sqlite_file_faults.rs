//! The SQLite file breaks while the service serves, without the transactional mode (the
//! business write on the pool, the record on the store): the file moved away, made
//! immutable (read-only even for root), or its folder moved away, each then repaired,
//! under a stream of requests with fresh keys over real sockets (docs/answers.md:
//! "the SQLite file is moved, removed or replaced, or turns read-only").
//!
//! Whatever the fault: no 5xx is ever stored as a final result, no answer claims an
//! operation parked that was not, every answer is the handler's success or one of idem's
//! answers for an unfinished operation, at most one order exists per key, every key that
//! was refused or left unfinished completes on a retry after the repair, and new keys
//! succeed within seconds of the repair, without a restart.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use common::answer::{Answer, send};
use common::server::TestServer;
use idem::{Decision, Idem, SqliteStore, UnknownOperation, identity};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Mutex;

#[derive(Clone)]
struct App {
    pool: sqlx::SqlitePool,
}

#[derive(Deserialize)]
struct CreateOrder {
    amount: i64,
}

#[idem::contract(
    key_scope = client,
    fingerprint = [amount],
    ttl = "1h",
    deadline = ("5s", per_attempt = "1s"),
    max_attempts = 4,
    retryable = [503, timeout],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = reconcile,
)]
async fn create_order(
    State(app): State<App>,
    attempt: idem::Attempt,
    Json(order): Json<CreateOrder>,
) -> Response {
    let operation_id = attempt.operation_id.to_string();
    let written = sqlx::query("INSERT INTO orders (operation_id, key, amount) VALUES (?, ?, ?)")
        .bind(&operation_id)
        .bind(&attempt.key)
        .bind(order.amount)
        .execute(&app.pool)
        .await;
    if written.is_err() {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the order could not be written",
        )
            .into_response();
    }
    // The read-back that failed in the field: the order exists, the answer is a 500.
    let read: Result<i64, _> =
        sqlx::query_scalar("SELECT amount FROM orders WHERE operation_id = ?")
            .bind(&operation_id)
            .fetch_one(&app.pool)
            .await;
    match read {
        Ok(amount) => (
            StatusCode::CREATED,
            Json(json!({ "key": attempt.key, "amount": amount })),
        )
            .into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "read-back failed").into_response(),
    }
}

async fn reconcile(app: App, op: UnknownOperation) -> Decision {
    let found: Result<Option<i64>, _> =
        sqlx::query_scalar("SELECT amount FROM orders WHERE operation_id = ?")
            .bind(op.operation_id.to_string())
            .fetch_optional(&app.pool)
            .await;
    match found {
        Ok(Some(amount)) => Decision::applied((
            StatusCode::CREATED,
            Json(json!({ "key": op.key, "amount": amount })),
        )),
        Ok(None) => Decision::NotApplied,
        Err(error) => Decision::cannot_decide_now(format!("the orders table: {error}")),
    }
}

async fn order_status(
    lookup: idem::Lookup<create_order::Operation>,
    UrlPath(key): UrlPath<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

/// The answers a client may see while the file is broken: the handler's success, or idem's
/// answers for an operation that did not finish. Never the handler's own 500, never a
/// parked operation.
const ALLOWED: &[&str] = &[
    "store-unavailable",
    "attempt-failed",
    "attempt-timed-out",
    "recovery-pending",
    "operation-in-progress",
];

async fn start(path: &Path) -> (TestServer, SqliteStore) {
    let store = SqliteStore::open(path).await.unwrap();
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS orders (operation_id TEXT PRIMARY KEY, key TEXT NOT NULL, amount INTEGER NOT NULL)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let app = App {
        pool: store.pool().clone(),
    };
    let idem = Idem::new(store.clone(), identity::header("x-client-id"));
    let router = Router::new()
        .route("/orders", post(create_order))
        .route("/orders/operations/{key}", get(order_status))
        .with_state(app)
        .layer(idem.layer());
    (TestServer::start(router).await, store)
}

async fn post_order(server: &TestServer, key: &str) -> Answer {
    send(server.post("/orders", key).json(&json!({ "amount": 100 }))).await
}

/// A fault of the file, and its repair.
trait Fault: Send + Sync {
    fn break_it(&self);
    fn repair(&self);
}

struct MovedFile(PathBuf);

impl Fault for MovedFile {
    fn break_it(&self) {
        std::fs::rename(&self.0, self.0.with_extension("db.away")).unwrap();
    }
    fn repair(&self) {
        std::fs::rename(self.0.with_extension("db.away"), &self.0).unwrap();
    }
}

/// `chattr +i` on the database and its write-ahead log: no process, root included, may
/// write to them, through a new descriptor or one already open.
struct ImmutableFile(PathBuf);

impl ImmutableFile {
    fn chattr(&self, flag: &str) -> bool {
        let wal = PathBuf::from(format!("{}-wal", self.0.display()));
        [&self.0, &wal].iter().filter(|p| p.exists()).all(|path| {
            std::process::Command::new("chattr")
                .arg(flag)
                .arg(path)
                .status()
                .is_ok_and(|s| s.success())
        })
    }
}

impl Fault for ImmutableFile {
    fn break_it(&self) {
        assert!(self.chattr("+i"), "chattr +i failed");
    }
    fn repair(&self) {
        assert!(self.chattr("-i"), "chattr -i failed");
    }
}

impl Drop for ImmutableFile {
    fn drop(&mut self) {
        // A failed test must not leave an immutable file behind in /tmp.
        let _ = self.chattr("-i");
    }
}

struct MovedFolder(PathBuf);

impl Fault for MovedFolder {
    fn break_it(&self) {
        std::fs::rename(&self.0, self.0.with_extension("away")).unwrap();
    }
    fn repair(&self) {
        std::fs::rename(self.0.with_extension("away"), &self.0).unwrap();
    }
}

/// Runs the stream of requests through `fault` and checks every rule of the module docs.
async fn survive(name: &str, dir: &Path, path: &Path, fault: &dyn Fault) {
    let (server, store) = start(path).await;
    let server = Arc::new(server);
    let answers: Arc<Mutex<Vec<(String, Instant, Answer)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (server, answers, stop) = (server.clone(), answers.clone(), stop.clone());
            let name = name.to_owned();
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(SeqCst) {
                    let key = format!("{name}-{w}-{i}");
                    let answer = post_order(&server, &key).await;
                    answers.lock().await.push((key, Instant::now(), answer));
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(15)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(400)).await;
    fault.break_it();
    tokio::time::sleep(Duration::from_millis(700)).await;
    fault.repair();
    let repaired = Instant::now();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    stop.store(true, SeqCst);
    for worker in workers {
        worker.await.unwrap();
    }
    let answers = answers.lock().await.clone();

    let mut tally = std::collections::BTreeMap::<String, usize>::new();
    for (_, _, answer) in &answers {
        let what = match answer.status {
            201 => "201".to_owned(),
            status => format!("{status} {}", answer.slug()),
        };
        *tally.entry(what).or_default() += 1;
    }
    eprintln!("{name}: {} requests: {tally:?}", answers.len());
    let mut unfinished = Vec::new();
    let mut first_success_after_repair = None;
    for (key, at, answer) in &answers {
        match answer.status {
            201 => {
                if *at > repaired && first_success_after_repair.is_none() {
                    first_success_after_repair = Some(at.duration_since(repaired));
                }
            }
            _ => {
                let slug = answer.slug();
                assert!(
                    ALLOWED.contains(&slug.as_str()),
                    "{name}: {key} was answered {} {:?}: not an answer for an unfinished operation",
                    answer.status,
                    String::from_utf8_lossy(&answer.body)
                );
                unfinished.push(key.clone());
            }
        }
    }
    assert!(
        !unfinished.is_empty(),
        "{name}: the fault was felt by no request (the test did not test anything)"
    );
    let after = first_success_after_repair
        .unwrap_or_else(|| panic!("{name}: no new key succeeded after the repair"));
    assert!(
        after < Duration::from_secs(2),
        "{name}: new keys succeeded only {after:?} after the repair"
    );

    // Every key left unfinished completes on a retry once its lease is over.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for key in &unfinished {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let retry = post_order(&server, key).await;
            if retry.status == 201 {
                break;
            }
            assert!(
                ALLOWED.contains(&retry.slug().as_str()),
                "{name}: the retry of {key} got {:?}",
                String::from_utf8_lossy(&retry.body)
            );
            assert!(
                Instant::now() < until,
                "{name}: {key} never completed: {retry:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    let duplicated: Vec<(String, i64)> =
        sqlx::query_as("SELECT key, COUNT(*) FROM orders GROUP BY key HAVING COUNT(*) > 1")
            .fetch_all(store.pool())
            .await
            .unwrap();
    assert_eq!(duplicated, [], "{name}: one order per key");
    let stored_5xx: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM idem_records WHERE state = 'completed' AND status >= 500",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(stored_5xx, 0, "{name}: a 5xx was stored as a final result");
    let parked: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM idem_records WHERE state = 'unknown'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(parked, 0, "{name}: nothing should be parked");
    let keys: std::collections::BTreeSet<&str> =
        answers.iter().map(|(k, _, _)| k.as_str()).collect();
    let orders: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(
        usize::try_from(orders).unwrap(),
        keys.len(),
        "{name}: every key has its one order in the file at the path ({dir:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_moved_away_then_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.db");
    survive("moved", dir.path(), &path, &MovedFile(path.clone())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_made_read_only_then_writable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("orders.db");
    let probe = dir.path().join("probe");
    std::fs::write(&probe, "x").unwrap();
    let probe = ImmutableFile(probe);
    if !probe.chattr("+i") {
        let why = "`chattr +i` is not available here (it needs root and a file system with the immutable flag)";
        assert!(
            !idem_runtime::store::conformance::postgres::skips_fail(),
            "{why}; under CI=true a skipped fault test is a failure"
        );
        eprintln!("skipped: {why}");
        return;
    }
    drop(probe);
    survive("read-only", dir.path(), &path, &ImmutableFile(path.clone())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_folder_moved_away_then_back() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("orders.db");
    survive("folder", &dir, &path, &MovedFolder(dir.clone())).await;
}
