//! Leases, the server's deadline, recovery of unknown outcomes, and the concurrency
//! answers `wait` and `accepted`, over real sockets (docs/answers.md;
//! docs/contract.md, `deadline`, `concurrency` and `recovery`).

mod common;

use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use common::answer::{Answer, send};
use common::counter::Counter;
use common::server::TestServer;
use idem::store::{MemoryStore, RecordKey, RecordState, unix_now};
use idem::{Decision, Idem, UnknownOperation, identity};
use serde_json::{Value, json};

#[derive(Clone, Default)]
struct App {
    runs: Counter,
    finished: Counter,
    reconciles: Counter,
}

impl App {
    /// The first run outlasts its 300 ms lease (it would take 1 s); later runs answer at
    /// once.
    async fn slow_first(&self) -> impl IntoResponse + use<> {
        let n = self.runs.bump();
        if n == 1 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        self.finished.bump();
        (StatusCode::CREATED, Json(json!({ "run": n })))
    }
}

// rustfmt re-indents attributes inside `macro_rules!` on every run.
#[rustfmt::skip]
macro_rules! recovering_handler {
    ($name:ident, $recovery:expr) => {
        #[idem::contract(
            key_scope = client,
            fingerprint = body,
            ttl = "1h",
            deadline = ("5s", per_attempt = "300ms"),
            max_attempts = 4,
            retryable = [503, timeout],
            concurrency = conflict,
            status_lookup = not_applied_status,
            recovery = $recovery,
        )]
        async fn $name(State(app): State<App>, Json(_body): Json<Value>) -> impl IntoResponse {
            app.slow_first().await
        }
    };
}

recovering_handler!(applied, reconcile_applied);
recovering_handler!(not_applied, reconcile_not_applied);
recovering_handler!(undecided, reconcile_unknown);
recovering_handler!(panicking, reconcile_panics);
recovering_handler!(
    manual,
    manual("https://runbooks.example.com/orders#unknown")
);

async fn reconcile_applied(app: App, op: UnknownOperation) -> Decision {
    app.reconciles.bump();
    // Reconciliation takes a while: concurrent retries must not start a second one.
    tokio::time::sleep(Duration::from_millis(100)).await;
    Decision::applied((
        StatusCode::CREATED,
        Json(json!({ "run": 1, "recovered": true, "key": op.key })),
    ))
}

async fn reconcile_not_applied(app: App, _op: UnknownOperation) -> Decision {
    app.reconciles.bump();
    Decision::NotApplied
}

async fn reconcile_unknown(app: App, _op: UnknownOperation) -> Decision {
    app.reconciles.bump();
    Decision::unknown("the payment provider did not answer")
}

async fn reconcile_panics(app: App, _op: UnknownOperation) -> Decision {
    app.reconciles.bump();
    panic!("the reconcile function is broken");
}

async fn not_applied_status(
    lookup: idem::Lookup<not_applied::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

/// A handler that panics on its first run.
#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1h",
    deadline = ("5s", per_attempt = "300ms"),
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = not_applied_status,
    recovery = reconcile_not_applied,
)]
async fn panics_first(State(app): State<App>, Json(_body): Json<Value>) -> impl IntoResponse {
    let n = app.runs.bump();
    assert!(n > 1, "the handler fails halfway");
    (StatusCode::CREATED, Json(json!({ "run": n })))
}

#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1h",
    deadline = "10s",
    max_attempts = 4,
    retryable = [503],
    concurrency = wait("2s"),
    status_lookup = not_applied_status,
    recovery = manual("https://runbooks.example.com/wait"),
)]
async fn wait_long(State(app): State<App>, Json(_body): Json<Value>) -> impl IntoResponse {
    let n = app.runs.bump();
    tokio::time::sleep(Duration::from_millis(300)).await;
    (StatusCode::CREATED, Json(json!({ "run": n })))
}

#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1h",
    deadline = "10s",
    max_attempts = 4,
    retryable = [503],
    concurrency = wait("300ms"),
    status_lookup = not_applied_status,
    recovery = manual("https://runbooks.example.com/wait"),
)]
async fn wait_short(State(app): State<App>, Json(_body): Json<Value>) -> impl IntoResponse {
    let n = app.runs.bump();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    (StatusCode::CREATED, Json(json!({ "run": n })))
}

#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1h",
    deadline = "10s",
    max_attempts = 4,
    retryable = [503],
    concurrency = accepted,
    status_lookup = accepted_status(path = "/accepted/operations/{key}"),
    recovery = manual("https://runbooks.example.com/accepted"),
)]
async fn accepted(State(app): State<App>, Json(_body): Json<Value>) -> impl IntoResponse {
    let n = app.runs.bump();
    tokio::time::sleep(Duration::from_millis(500)).await;
    (StatusCode::CREATED, Json(json!({ "run": n })))
}

async fn accepted_status(
    lookup: idem::Lookup<accepted::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1s",
    deadline = "1s",
    max_attempts = 2,
    retryable = [503],
    concurrency = conflict(retry_after = "250ms"),
    status_lookup = not_applied_status,
    recovery = manual("https://runbooks.example.com/short"),
)]
async fn short_ttl(State(app): State<App>, Json(_body): Json<Value>) -> impl IntoResponse {
    let n = app.runs.bump();
    (StatusCode::CREATED, Json(json!({ "run": n })))
}

/// A handler that answers after 200 ms, well within its lease.
#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1h",
    deadline = "5s",
    max_attempts = 4,
    retryable = [503, timeout],
    concurrency = conflict,
    status_lookup = not_applied_status,
    recovery = reconcile_not_applied,
)]
async fn slow_answer(State(app): State<App>, Json(_body): Json<Value>) -> impl IntoResponse {
    let n = app.runs.bump();
    tokio::time::sleep(Duration::from_millis(200)).await;
    app.finished.bump();
    (StatusCode::CREATED, Json(json!({ "run": n })))
}

struct Fixture {
    server: TestServer,
    app: App,
    idem: Idem,
}

impl Fixture {
    async fn new() -> Fixture {
        let idem = Idem::new(MemoryStore::new(), identity::header("x-client-id"));
        let app = App::default();
        let router = Router::new()
            .route("/applied", post(applied))
            .route("/not-applied", post(not_applied))
            .route("/not-applied/operations/{key}", get(not_applied_status))
            .route("/undecided", post(undecided))
            .route("/panicking", post(panicking))
            .route("/manual", post(manual))
            .route("/panics-first", post(panics_first))
            .route("/wait-long", post(wait_long))
            .route("/wait-short", post(wait_short))
            .route("/accepted", post(accepted))
            .route("/accepted/operations/{key}", get(accepted_status))
            .route("/short-ttl", post(short_ttl))
            .route("/slow-answer", post(slow_answer))
            .with_state(app.clone())
            .layer(idem.layer());
        Fixture {
            server: TestServer::start(router).await,
            app,
            idem,
        }
    }

    fn request(&self, path: &str, key: &str) -> reqwest::RequestBuilder {
        self.server.post(path, key).json(&json!({ "amount": 100 }))
    }

    async fn post(&self, path: &str, key: &str) -> Answer {
        send(self.request(path, key)).await
    }

    async fn lookup(&self, path: &str) -> Answer {
        send(self.server.get(path)).await
    }

    /// The first attempt outlasts its lease: 503 `attempt-timed-out`, and the record stays
    /// processing.
    async fn time_out_first_attempt(&self, path: &str, key: &str) -> Answer {
        let answer = self.post(path, key).await;
        let problem = answer.problem(503, "attempt-timed-out");
        assert_eq!(problem["state"], "processing");
        assert_eq!(answer.header("retry-after"), Some("1"));
        // Let the lease's end pass on the wall clock too.
        tokio::time::sleep(Duration::from_millis(50)).await;
        answer
    }
}

/// The server's deadline: a handler past its per-attempt timeout is stopped, the answer
/// is 503 `attempt-timed-out`, and the record stays processing (never a blind re-run).
#[tokio::test]
async fn server_deadline_stops_the_attempt_and_keeps_the_record_processing() {
    let f = Fixture::new().await;
    // The 503 (not the handler's 201 after its 1 s sleep) proves the attempt was cut at
    // its 300 ms lease.
    let answer = f.time_out_first_attempt("/manual", "k-deadline").await;
    let key = RecordKey::new("manual", "client-a", "k-deadline");
    let record = f.idem.store().get(&key, unix_now()).await.unwrap().unwrap();
    assert!(
        matches!(record.state, RecordState::Processing { .. }),
        "{record:?}"
    );
    assert_eq!(record.operation_id.to_string(), answer.operation_id());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(f.app.finished.get(), 0, "the handler's future was dropped");
    assert_eq!(f.app.runs.get(), 1);
}

/// Lease ended, recovery finds the effect applied: its answer is stored and replayed; the
/// reconcile function runs once even under five concurrent retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_applied_is_stored_and_replayed_once() {
    let f = Fixture::new().await;
    let first = f.time_out_first_attempt("/applied", "k-applied").await;
    let answers =
        futures_util::future::join_all((0..5).map(|_| f.post("/applied", "k-applied"))).await;
    assert_eq!(
        f.app.reconciles.get(),
        1,
        "exactly one recovery: {answers:?}"
    );
    let recovered: Vec<&Answer> = answers.iter().filter(|a| a.status == 201).collect();
    assert!(!recovered.is_empty());
    for answer in &answers {
        assert_eq!(answer.operation_id(), first.operation_id(), "one operation");
        match answer.status {
            201 => {
                assert!(answer.replayed());
                assert_eq!(
                    answer.json(),
                    json!({ "run": 1, "recovered": true, "key": "k-applied" })
                );
            }
            409 => {
                answer.problem(409, "operation-in-progress");
            }
            other => panic!("unexpected {other}: {answer:?}"),
        }
    }
    let later = f.post("/applied", "k-applied").await;
    assert!(later.replayed());
    assert_eq!(later.body, recovered[0].body);
    assert_eq!(f.app.reconciles.get(), 1);
    assert_eq!(f.app.runs.get(), 1, "the handler never ran again");
}

/// Lease ended, recovery finds the effect not applied: the retry runs the handler as the
/// next attempt of the same operation.
#[tokio::test]
async fn recovery_not_applied_runs_the_next_attempt() {
    let f = Fixture::new().await;
    let first = f.time_out_first_attempt("/not-applied", "k-na").await;
    let retry = f.post("/not-applied", "k-na").await;
    assert_eq!(retry.status, 201);
    assert!(!retry.replayed());
    assert_eq!(retry.json()["run"], 2);
    assert_eq!(retry.operation_id(), first.operation_id());
    assert_eq!(f.app.reconciles.get(), 1);
    let replay = f.post("/not-applied", "k-na").await;
    assert!(replay.replayed());
    assert_eq!(replay.body, retry.body);
    assert_eq!(f.app.runs.get(), 2);
    assert_eq!(f.app.reconciles.get(), 1);
}

/// A handler that panics leaves the record processing: the client gets 503
/// `attempt-failed` with a `Retry-After` at the end of the lease; after the lease,
/// recovery decides.
#[tokio::test]
async fn a_panicking_handler_is_recovered_not_rerun_blindly() {
    let f = Fixture::new().await;
    let first = f.post("/panics-first", "k-panic").await;
    let problem = first.problem(503, "attempt-failed");
    assert_eq!(problem["state"], "processing");
    assert_eq!(problem["new_key_safe"], false);
    assert_eq!(
        first.header("retry-after"),
        Some("1"),
        "the attempt is over: its lease ended at once"
    );
    let key = RecordKey::new("panics_first", "client-a", "k-panic");
    let record = f.idem.store().get(&key, unix_now()).await.unwrap().unwrap();
    assert!(
        matches!(record.state, RecordState::Processing { lease } if !lease.is_live(unix_now())),
        "nothing is recorded as final, and the lease has ended: {record:?}"
    );
    assert_eq!(f.app.reconciles.get(), 0);
    let retry = f.post("/panics-first", "k-panic").await;
    assert_eq!(retry.status, 201);
    assert_eq!(
        f.app.reconciles.get(),
        1,
        "recovery decided before the re-run"
    );
    assert_eq!(f.app.runs.get(), 2);
    assert_eq!(retry.operation_id(), first.operation_id());
}

/// The typical lost answer: the client hangs up before the handler answers. The handler is
/// not cancelled with the connection: it finishes and its result is stored, so the retry
/// is a replay, with no recovery and no second run.
#[tokio::test]
async fn a_client_that_hangs_up_gets_the_stored_result_on_retry() {
    let f = Fixture::new().await;
    let lost = f
        .request("/slow-answer", "k-lost")
        .timeout(Duration::from_millis(50))
        .send()
        .await;
    assert!(lost.is_err(), "the client gave up before the answer");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(f.app.finished.get(), 1, "the handler ran to its end");
    let retry = f.post("/slow-answer", "k-lost").await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed());
    assert_eq!(retry.json()["run"], 1);
    assert_eq!(f.app.runs.get(), 1);
    assert_eq!(f.app.reconciles.get(), 0);
}

/// Recovery cannot decide: the operation is parked as unknown (409, no `Retry-After`) and
/// the reconcile function is not asked again.
#[tokio::test]
async fn recovery_unknown_parks_the_operation() {
    let f = Fixture::new().await;
    f.time_out_first_attempt("/undecided", "k-unknown").await;
    for _ in 0..2 {
        let answer = f.post("/undecided", "k-unknown").await;
        let problem = answer.problem(409, "operation-outcome-unknown");
        assert_eq!(problem["state"], "unknown");
        assert_eq!(problem["new_key_safe"], false);
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("the payment provider did not answer")
        );
        assert_eq!(answer.header("retry-after"), None);
    }
    assert_eq!(f.app.reconciles.get(), 1);
    assert_eq!(f.app.runs.get(), 1);
}

/// A panicking reconcile function could not decide: nothing is parked, and the next retry
/// asks again.
#[tokio::test]
async fn a_panicking_reconcile_is_asked_again() {
    let f = Fixture::new().await;
    f.time_out_first_attempt("/panicking", "k-rp").await;
    let answer = f.post("/panicking", "k-rp").await;
    let problem = answer.problem(503, "recovery-pending");
    assert!(problem["detail"].as_str().unwrap().contains("panicked"));
    assert_eq!(problem["state"], "processing");
    assert_eq!(answer.header("retry-after"), Some("2"));
    let again = f.post("/panicking", "k-rp").await;
    again.problem(503, "recovery-pending");
    assert_eq!(
        f.app.reconciles.get(),
        2,
        "nothing was parked: recovery asks again"
    );
    assert_eq!(f.app.runs.get(), 1, "the handler never re-ran blindly");
}

/// `recovery = manual(..)`: parked as unknown; the answer names the runbook.
#[tokio::test]
async fn manual_recovery_parks_with_the_runbook() {
    let f = Fixture::new().await;
    f.time_out_first_attempt("/manual", "k-manual").await;
    let answer = f.post("/manual", "k-manual").await;
    let problem = answer.problem(409, "operation-outcome-unknown");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("https://runbooks.example.com/orders#unknown"),
        "{problem}"
    );
    let key = RecordKey::new("manual", "client-a", "k-manual");
    let record = f.idem.store().get(&key, unix_now()).await.unwrap().unwrap();
    assert!(matches!(record.state, RecordState::Unknown { .. }));
    assert_eq!(f.app.runs.get(), 1);
}

/// The status lookup recovers an ended lease too; "not applied" releases the key, so the
/// client's next request runs.
#[tokio::test]
async fn status_lookup_recovers_and_releases() {
    let f = Fixture::new().await;
    let first = f.time_out_first_attempt("/not-applied", "k-look").await;
    let report = f.lookup("/not-applied/operations/k-look").await;
    assert_eq!(
        report.status,
        200,
        "{}",
        String::from_utf8_lossy(&report.body)
    );
    let json = report.json();
    assert_eq!(json["state"], "released");
    assert_eq!(json["new_key_safe"], true);
    assert_eq!(json["operation_id"], first.operation_id());
    assert_eq!(f.app.reconciles.get(), 1);

    let retry = f.post("/not-applied", "k-look").await;
    assert_eq!(retry.status, 201);
    assert!(!retry.replayed());
    let done = f.lookup("/not-applied/operations/k-look").await.json();
    assert_eq!(done["state"], "completed");
    assert_eq!(
        done["attempt"], 3,
        "first attempt, the lookup's takeover, the retry"
    );
    assert_eq!(done["response"]["body"], retry.json());
    assert_eq!(f.app.reconciles.get(), 1);
}

/// `concurrency = wait("2s")`: a duplicate waits for the first attempt and gets its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_returns_the_first_attempts_result() {
    let f = Fixture::new().await;
    let first = f.post("/wait-long", "k-wait");
    let second = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        f.post("/wait-long", "k-wait").await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(first.status, 201);
    assert_eq!(second.status, 201);
    assert!(second.replayed());
    assert_eq!(second.body, first.body);
    assert_eq!(f.app.runs.get(), 1);
}

/// `concurrency = wait("300ms")`: past the limit the duplicate gets 409 with `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_past_its_limit_answers_conflict() {
    let f = Fixture::new().await;
    let first = f.post("/wait-short", "k-wait");
    let second = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = Instant::now();
        (f.post("/wait-short", "k-wait").await, started.elapsed())
    };
    let (first, (second, waited)) = tokio::join!(first, second);
    assert_eq!(first.status, 201);
    second.problem(409, "operation-in-progress");
    assert!(second.header("retry-after").is_some());
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    assert_eq!(f.app.runs.get(), 1);
}

/// `concurrency = accepted`: 202 with `Location` at the status lookup of the
/// percent-encoded key, which reports the operation while it runs and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_points_at_the_status_lookup() {
    let f = Fixture::new().await;
    let key = "a/b:c?d";
    let first = f.post("/accepted", key);
    let second = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let answer = f.post("/accepted", key).await;
        let running = f
            .lookup(answer.header("location").unwrap_or("/missing"))
            .await;
        (answer, running)
    };
    let (first, (second, running)) = tokio::join!(first, second);
    assert_eq!(first.status, 201);
    assert_eq!(second.status, 202);
    assert_eq!(
        second.header("location"),
        Some("/accepted/operations/a%2Fb%3Ac%3Fd")
    );
    assert_eq!(second.operation_id(), first.operation_id());
    let body = second.json();
    assert_eq!(body["state"], "processing");
    assert_eq!(body["operation_id"], first.operation_id());
    assert_eq!(running.status, 200);
    assert_eq!(running.json()["state"], "processing");
    assert_eq!(running.json()["key"], key);

    let done = f.lookup("/accepted/operations/a%2Fb%3Ac%3Fd").await.json();
    assert_eq!(done["state"], "completed");
    assert_eq!(done["response"]["body"], first.json());
    assert_eq!(f.app.runs.get(), 1);
}

/// A key seen after its TTL names a new operation.
#[tokio::test]
async fn a_key_after_its_ttl_is_a_new_operation() {
    let f = Fixture::new().await;
    let first = f.post("/short-ttl", "k-ttl").await;
    assert_eq!(first.status, 201);
    assert!(f.post("/short-ttl", "k-ttl").await.replayed());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let later = f.post("/short-ttl", "k-ttl").await;
    assert_eq!(later.status, 201);
    assert!(!later.replayed());
    assert_ne!(later.operation_id(), first.operation_id());
    assert_eq!(f.app.runs.get(), 2);
    assert_eq!(
        f.idem.purge_expired().await.unwrap(),
        0,
        "the new record is live"
    );
}
