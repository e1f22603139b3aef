//! Concurrency against a running server, on the memory and the SQLite stores: a hundred
//! identical requests on one key, racing fingerprints, racing clients, many retries at
//! the end of a lease, retries racing the completion, and a lease that outlives the TTL.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use axum::extract::{FromRef, Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use common::answer::{Answer, send};
use common::counter::Counter;
use common::orders::{create_order, order_status};
use common::server::TestServer;
use futures_util::future::join_all;
use idem::store::{MemoryStore, RecordKey, RecordState, Store, unix_now};
use idem::{Decision, Idem, SqliteStore, UnknownOperation, identity};
use reqwest::Method;
use serde_json::{Value, json};

#[derive(Clone, Default)]
struct App {
    /// The runs of every handler, `common::orders::create_order`'s included.
    runs: Counter,
    /// Handlers running right now, and the most ever seen at once (`create_order` aside).
    running: Arc<AtomicUsize>,
    most_at_once: Arc<AtomicUsize>,
    reconciles: Counter,
}

/// `common::orders::create_order` counts its runs in the app's.
impl FromRef<App> for Counter {
    fn from_ref(app: &App) -> Counter {
        app.runs.clone()
    }
}

impl App {
    /// Counts a run for as long as `work` takes.
    async fn run<T>(&self, work: impl Future<Output = T>) -> (usize, T) {
        let n = self.runs.bump();
        let now = self.running.fetch_add(1, SeqCst) + 1;
        self.most_at_once.fetch_max(now, SeqCst);
        let out = work.await;
        self.running.fetch_sub(1, SeqCst);
        (n, out)
    }
}

/// The first run outlasts its 300 ms lease; later runs answer at once.
#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1h",
    deadline = ("5s", per_attempt = "300ms"),
    max_attempts = 4,
    retryable = [503, timeout],
    concurrency = conflict,
    status_lookup = slow_first_status,
    recovery = reconcile_not_applied,
)]
async fn slow_first(State(app): State<App>, Json(_body): Json<Value>) -> impl IntoResponse {
    let runs = app.runs.get();
    let (n, ()) = app
        .run(async move {
            if runs == 0 {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        })
        .await;
    (StatusCode::CREATED, Json(json!({ "run": n })))
}

/// `concurrency = wait("2s")`: duplicates wait for the 300 ms attempt.
#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1h",
    deadline = "10s",
    max_attempts = 4,
    retryable = [503],
    concurrency = wait("2s"),
    status_lookup = order_status,
    recovery = manual("https://runbooks.example.com/wait"),
)]
async fn waited(State(app): State<App>, Json(_body): Json<Value>) -> impl IntoResponse {
    let (n, ()) = app
        .run(tokio::time::sleep(Duration::from_millis(300)))
        .await;
    (StatusCode::CREATED, Json(json!({ "run": n })))
}

async fn reconcile_not_applied(app: App, _op: UnknownOperation) -> Decision {
    app.reconciles.bump();
    tokio::time::sleep(Duration::from_millis(50)).await;
    Decision::NotApplied
}

/// TTL equal to the deadline, as the contract rules allow. The first run answers 503
/// (released); later runs take 1.5 s.
#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "2s",
    deadline = "2s",
    max_attempts = 3,
    retryable = [503],
    concurrency = conflict(retry_after = "250ms"),
    status_lookup = ttl_status,
    recovery = manual("https://runbooks.example.com/ttl"),
)]
async fn ttl_equals_deadline(State(app): State<App>) -> impl IntoResponse {
    let first = app.runs.get() == 0;
    let (n, ()) = app
        .run(async move {
            if !first {
                tokio::time::sleep(Duration::from_millis(1500)).await;
            }
        })
        .await;
    if first {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "run": n })))
    } else {
        (StatusCode::CREATED, Json(json!({ "run": n })))
    }
}

async fn slow_first_status(
    lookup: idem::Lookup<slow_first::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

async fn ttl_status(
    lookup: idem::Lookup<ttl_equals_deadline::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

struct Fixture {
    server: TestServer,
    app: App,
    idem: Idem,
    _dir: Option<tempfile::TempDir>,
}

impl Fixture {
    async fn memory() -> Fixture {
        Fixture::with_store(MemoryStore::new(), None).await
    }

    async fn sqlite() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
        Fixture::with_store(store, Some(dir)).await
    }

    async fn with_store(store: impl Store, dir: Option<tempfile::TempDir>) -> Fixture {
        let idem = Idem::new(store, identity::header("x-client-id"));
        let app = App::default();
        let router = Router::new()
            .route("/orders", post(create_order))
            .route("/orders/operations/{key}", get(order_status))
            .route("/slow-first", post(slow_first))
            .route("/slow-first/operations/{key}", get(slow_first_status))
            .route("/wait", post(waited))
            .route("/ttl", post(ttl_equals_deadline))
            .route("/ttl/operations/{key}", get(ttl_status))
            .with_state(app.clone())
            .layer(idem.layer());
        Fixture {
            server: TestServer::start(router).await,
            app,
            idem,
            _dir: dir,
        }
    }

    async fn order(&self, client_id: &str, key: &str, body: &Value) -> Answer {
        let request = self
            .server
            .request(Method::POST, "/orders", client_id, Some(key));
        send(request.json(body)).await
    }

    async fn post(&self, path: &str, key: &str) -> Answer {
        send(self.server.post(path, key).json(&json!({ "amount": 1 }))).await
    }

    async fn record(&self, operation: &str, key: &str) -> Option<idem::store::Record> {
        let key = RecordKey::new(operation, "client-a", key);
        self.idem.store().get(&key, unix_now()).await.unwrap()
    }
}

/// One run, and every other answer is the conflict (with `Retry-After` and the same
/// operation id) or the replay of the one run, byte for byte.
fn assert_one_run(answers: &[Answer]) -> &Answer {
    let fresh: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == 201 && !a.replayed())
        .collect();
    assert_eq!(fresh.len(), 1, "exactly one fresh answer: {answers:?}");
    let first = fresh[0];
    for answer in answers {
        assert_eq!(answer.operation_id(), first.operation_id());
        match answer.status {
            201 => assert_eq!(answer.body, first.body),
            409 => {
                answer.problem(409, "operation-in-progress");
                assert!(answer.header("retry-after").is_some());
            }
            other => panic!("unexpected {other}: {answer:?}"),
        }
    }
    first
}

async fn hundred_identical_requests(f: &Fixture) {
    let body = json!({ "customer_id": "c", "amount": 100, "delay_ms": 300 });
    let answers = join_all((0..100).map(|_| f.order("client-a", "k-100", &body))).await;
    let first = assert_one_run(&answers);
    assert_eq!(f.app.runs.get(), 1);
    let replay = f.order("client-a", "k-100", &body).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    let record = f.record("create_order", "k-100").await.unwrap();
    assert_eq!(record.attempt, 1);
    assert!(matches!(record.state, RecordState::Completed { .. }));
}

/// A hundred identical requests at once on one key, memory store: one run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_identical_requests_run_once_on_memory() {
    hundred_identical_requests(&Fixture::memory().await).await;
}

/// A hundred identical requests at once on one key, SQLite store: one run, and the busy
/// database never answers 503 (every answer is the run, its replay or the conflict).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_identical_requests_run_once_on_sqlite() {
    hundred_identical_requests(&Fixture::sqlite().await).await;
}

async fn racing_fingerprints(f: &Fixture) {
    let body = |amount: i64| json!({ "customer_id": "c", "amount": amount, "delay_ms": 200 });
    let answers = join_all((0..50).map(|i| {
        let body = body(i);
        async move { f.order("client-a", "k-race", &body).await }
    }))
    .await;
    let winners: Vec<(usize, &Answer)> = answers
        .iter()
        .enumerate()
        .filter(|(_, a)| a.status == 201)
        .collect();
    assert_eq!(winners.len(), 1, "{answers:?}");
    let (amount, winner) = winners[0];
    assert_eq!(winner.json()["amount"], amount);
    for (i, answer) in answers.iter().enumerate() {
        if i == amount {
            continue;
        }
        let problem = answer.problem(422, "fingerprint-mismatch");
        assert_eq!(problem["operation_id"], winner.operation_id());
    }
    assert_eq!(f.app.runs.get(), 1);
    let replay = f.order("client-a", "k-race", &body(amount as i64)).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, winner.body);
}

/// Fifty requests at once on one key, each with another amount: one runs; every other
/// one is 422 at once (it does not wait, and is not told "in progress"); the record
/// holds the winner's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_fingerprints_on_one_key_memory() {
    racing_fingerprints(&Fixture::memory().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_fingerprints_on_one_key_sqlite() {
    racing_fingerprints(&Fixture::sqlite().await).await;
}

/// Two clients racing with the same key string: two operations, each client sees only
/// its own result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_racing_on_one_key_string() {
    let f = Fixture::sqlite().await;
    let f = &f;
    let body = |client: &str| json!({ "customer_id": client, "amount": 1, "delay_ms": 200 });
    let requests = (0..40).map(|i| {
        let client_id = if i % 2 == 0 { "client-a" } else { "client-b" };
        let body = body(client_id);
        async move { (client_id, f.order(client_id, "shared", &body).await) }
    });
    let answers = join_all(requests).await;
    assert_eq!(f.app.runs.get(), 2, "one run per client");
    for client_id in ["client-a", "client-b"] {
        let own: Vec<Answer> = answers
            .iter()
            .filter(|(c, _)| *c == client_id)
            .map(|(_, a)| a.clone())
            .collect();
        let first = assert_one_run(&own);
        assert_eq!(first.json()["customer_id"], client_id);
    }
    let (a, b): (Vec<_>, Vec<_>) = answers.iter().partition(|(c, _)| *c == "client-a");
    assert_ne!(a[0].1.operation_id(), b[0].1.operation_id());
}

async fn many_retries_at_the_end_of_a_lease(f: &Fixture) {
    let first = f.post("/slow-first", "k-expiry").await;
    first.problem(503, "attempt-timed-out");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let answers = join_all((0..20).map(|_| f.post("/slow-first", "k-expiry"))).await;
    assert_eq!(f.app.reconciles.get(), 1, "one recovery: {answers:?}");
    let second = assert_one_run(&answers);
    assert_eq!(second.json()["run"], 2);
    assert_eq!(second.operation_id(), first.operation_id());
    assert_eq!(f.app.runs.get(), 2, "the first attempt and one re-run");
}

/// Twenty retries at once after a lease ended: exactly one recovery, exactly one re-run;
/// the others get the conflict or the replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_retries_at_the_end_of_a_lease_recover_once_memory() {
    many_retries_at_the_end_of_a_lease(&Fixture::memory().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_retries_at_the_end_of_a_lease_recover_once_sqlite() {
    many_retries_at_the_end_of_a_lease(&Fixture::sqlite().await).await;
}

/// Status lookups and retries racing at the end of a lease: whoever takes the lease
/// over, recovery runs once and the handler runs once more (a lookup that wins releases
/// the key, and a retry then runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_and_retries_racing_at_the_end_of_a_lease() {
    for f in [Fixture::memory().await, Fixture::sqlite().await] {
        let first = f.post("/slow-first", "k-mixed").await;
        first.problem(503, "attempt-timed-out");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let lookups = (0..10).map(|_| send(f.server.get("/slow-first/operations/k-mixed")));
        let retries = (0..10).map(|i| {
            let f = &f;
            async move {
                // Stagger a little, so that some retries come after a lookup's release.
                tokio::time::sleep(Duration::from_millis(5 * i)).await;
                f.post("/slow-first", "k-mixed").await
            }
        });
        let (reports, answers) = tokio::join!(join_all(lookups), join_all(retries));
        for report in &reports {
            assert_eq!(report.status, 200, "{report:?}");
            assert_eq!(report.json()["operation_id"], first.operation_id());
        }
        assert_eq!(f.app.reconciles.get(), 1, "one recovery");
        for answer in &answers {
            assert!(answer.status == 201 || answer.status == 409, "{answer:?}");
            assert_eq!(answer.operation_id(), first.operation_id());
        }
        // Once the dust settles (a lookup's release may leave the re-run to this one).
        let done = f.post("/slow-first", "k-mixed").await;
        assert_eq!(done.status, 201);
        assert_eq!(done.json()["run"], 2);
        let fresh = answers
            .iter()
            .chain([&done])
            .filter(|a| a.status == 201 && !a.replayed());
        assert_eq!(fresh.count(), 1, "one fresh answer: {answers:?}");
        assert_eq!(f.app.runs.get(), 2, "one re-run");
        assert!(f.post("/slow-first", "k-mixed").await.replayed());
    }
}

/// Twenty duplicates waiting (`concurrency = wait`) for one attempt: all get its result,
/// byte for byte; one run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waiters_get_the_one_result() {
    for f in [Fixture::memory().await, Fixture::sqlite().await] {
        let answers = join_all((0..20).map(|_| f.post("/wait", "k-wait"))).await;
        let fresh: Vec<&Answer> = answers.iter().filter(|a| !a.replayed()).collect();
        assert_eq!(fresh.len(), 1, "{answers:?}");
        for answer in &answers {
            assert_eq!(answer.status, 201, "{answer:?}");
            assert_eq!(answer.body, fresh[0].body);
            assert_eq!(answer.operation_id(), fresh[0].operation_id());
        }
        assert_eq!(f.app.runs.get(), 1);
    }
}

/// Retries every 10 ms across the moment the first attempt completes: each is the
/// conflict or the replay, never a second run, never an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_racing_the_completion() {
    let f = Fixture::sqlite().await;
    let body = json!({ "customer_id": "c", "amount": 5, "delay_ms": 200 });
    let retries = (0..40).map(|i| {
        let body = body.clone();
        let f = &f;
        async move {
            tokio::time::sleep(Duration::from_millis(10 * i)).await;
            f.order("client-a", "k-complete", &body).await
        }
    });
    let (first, retries) =
        tokio::join!(f.order("client-a", "k-complete", &body), join_all(retries));
    let mut all = retries;
    all.push(first);
    let fresh = assert_one_run(&all);
    assert!(
        all.iter().any(|a| a.status == 409) && all.iter().any(|a| a.replayed()),
        "the retries straddle the completion"
    );
    assert_eq!(fresh.json()["order"], 1);
    assert_eq!(f.app.runs.get(), 1);
}

/// With `ttl` equal to `deadline` (allowed by the rules), a retry near the end of the
/// TTL holds a lease past the TTL. While that attempt runs, the key must not count as
/// forgotten: a duplicate gets the conflict (not a second run, in parallel), the status
/// lookup reports it (not "not found, a new key is safe"), and its result is replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_outliving_the_ttl_keeps_the_key() {
    for f in [Fixture::memory().await, Fixture::sqlite().await] {
        let first = f.post("/ttl", "k-ttl").await;
        assert_eq!(first.status, 503, "released");
        tokio::time::sleep(Duration::from_millis(1200)).await;
        // The retry, within the deadline: runs from 1.2 s to 2.7 s, lease to 3.2 s.
        let retry = tokio::spawn(send(
            f.server.post("/ttl", "k-ttl").json(&json!({ "amount": 1 })),
        ));
        tokio::time::sleep(Duration::from_millis(1100)).await;
        // 2.3 s: past the TTL (2 s), the retry still running.
        let lookup = send(f.server.get("/ttl/operations/k-ttl")).await;
        let duplicate = f.post("/ttl", "k-ttl").await;
        let retry = retry.await.unwrap();
        assert_eq!(retry.status, 201);
        assert_eq!(lookup.status, 200, "the lookup finds the running attempt");
        assert_eq!(lookup.json()["state"], "processing");
        duplicate.problem(409, "operation-in-progress");
        assert_eq!(f.app.most_at_once.load(SeqCst), 1, "never two runs at once");
        let replay = f.post("/ttl", "k-ttl").await;
        assert!(replay.replayed(), "the retry's result is kept: {replay:?}");
        assert_eq!(replay.body, retry.body);
        assert_eq!(f.app.runs.get(), 2);
    }
}
