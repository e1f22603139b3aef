//! The heartbeat (`IdemBuilder::heartbeat`; docs/contract.md, `deadline`): a running
//! attempt renews a short lease, so that an instance that died is noticed within one
//! lease, not after the whole per-attempt timeout; a live attempt keeps its key however
//! long it runs within its time.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use common::answer::{Answer, send};
use common::process;
use common::server::TestServer;
use idem::store::{RecordKey, RecordState, RecordStore, unix_now};
use idem::{Decision, Idem, SqliteStore, UnknownOperation, identity};
use serde::Deserialize;
use serde_json::json;

/// The heartbeat lease of these tests; the contracts' per-attempt timeout is 10 s.
const HEARTBEAT: Duration = Duration::from_millis(600);

static RUNS: AtomicUsize = AtomicUsize::new(0);
static RECONCILES: AtomicUsize = AtomicUsize::new(0);

#[derive(Deserialize)]
struct Work {
    amount: i64,
    #[serde(default)]
    sleep_ms: u64,
}

#[idem::contract(
    key_scope = client,
    fingerprint = [amount],
    ttl = "1h",
    deadline = ("30s", per_attempt = "10s"),
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = status,
    recovery = reconcile,
)]
async fn work(State(()): State<()>, Json(work): Json<Work>) -> impl IntoResponse {
    RUNS.fetch_add(1, SeqCst);
    tokio::time::sleep(Duration::from_millis(work.sleep_ms)).await;
    (StatusCode::CREATED, Json(json!({ "amount": work.amount })))
}

async fn reconcile((): (), _op: UnknownOperation) -> Decision {
    RECONCILES.fetch_add(1, SeqCst);
    Decision::NotApplied
}

async fn status(
    lookup: idem::Lookup<work::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

async fn start(store: SqliteStore) -> TestServer {
    let idem = Idem::builder(store, identity::header("x-client-id"))
        .heartbeat(HEARTBEAT)
        .build();
    let router = Router::new()
        .route("/work", post(work))
        .route("/work/operations/{key}", get(status))
        .with_state(())
        .layer(idem.layer());
    TestServer::start(router).await
}

async fn post_work(server: &TestServer, key: &str, sleep_ms: u64) -> Answer {
    let work = json!({ "amount": 1, "sleep_ms": sleep_ms });
    send(server.post("/work", key).json(&work)).await
}

/// A live attempt that runs for several heartbeat leases keeps its key: its lease in the
/// store is renewed (it never reaches the 10 s of the per-attempt timeout, and never
/// ends either), a duplicate gets 409 throughout, and the attempt's answer is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_attempt_keeps_renewing_its_short_lease() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("hb.db")).await.unwrap();
    let server = std::sync::Arc::new(start(store.clone()).await);
    let first = {
        let server = server.clone();
        tokio::spawn(async move { post_work(&server, "k-live", 2500).await })
    };
    let key = RecordKey::new("work", "client-a", "k-live");
    let mut seen = Vec::new();
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = unix_now();
        match store.get(&key, now).await.unwrap().unwrap().state {
            RecordState::Processing { lease } => {
                assert!(
                    lease.is_live(now),
                    "the lease is renewed while the attempt runs"
                );
                assert!(
                    lease.until <= now + HEARTBEAT.as_millis() as u64,
                    "a short lease, not the 10 s per-attempt timeout"
                );
                seen.push(lease.until);
            }
            other => panic!("still running: {other:?}"),
        }
        post_work(&server, "k-live", 0)
            .await
            .problem(409, "operation-in-progress");
    }
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "renewed: {seen:?}");
    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    assert!(post_work(&server, "k-live", 0).await.replayed());
}

/// The process dies with an attempt in flight: after a restart on the same file, the
/// retry is answered by recovery within one heartbeat lease, not after the 10 s
/// per-attempt timeout.
#[test]
fn a_dead_attempt_is_recovered_within_one_heartbeat_lease() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.db");
    let before = RUNS.load(SeqCst);
    let doomed = process::runtime();
    doomed.block_on(async {
        let server = start(SqliteStore::open(&path).await.unwrap()).await;
        let request = server
            .post("/work", "k-dead")
            .json(&json!({ "amount": 1, "sleep_ms": 60_000 }));
        tokio::spawn(async move {
            let _ = request.send().await;
        });
        process::wait_until(|| RUNS.load(SeqCst) != before).await;
        // Long enough for a few renewals.
        tokio::time::sleep(HEARTBEAT * 2).await;
        std::mem::forget(server); // the process dies: no graceful shutdown
    });
    doomed.shutdown_background();
    let died = Instant::now();

    process::runtime().block_on(async {
        let server = start(SqliteStore::open(&path).await.unwrap()).await;
        let reconciles = RECONCILES.load(SeqCst);
        let until = Instant::now() + Duration::from_secs(5);
        let decided = loop {
            let retry = post_work(&server, "k-dead", 0).await;
            if retry.status == 201 {
                break died.elapsed();
            }
            retry.problem(409, "operation-in-progress");
            assert!(Instant::now() < until, "never decided: {retry:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            decided < HEARTBEAT + Duration::from_millis(900),
            "decided {decided:?} after the crash (heartbeat lease {HEARTBEAT:?})"
        );
        assert_eq!(RECONCILES.load(SeqCst), reconciles + 1, "recovery decided");
    });
}
