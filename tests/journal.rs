//! The step journal (`idem::Journal`, docs/steps.md) over real sockets: a contracted
//! handler charges a provider of the test's own on 127.0.0.1 through `journal.step`, and
//! whatever fails (the provider's answer, the attempt's time, the journal's store) the
//! provider makes one charge per client intent, every retry gets the same answer, and
//! nothing is parked for an operator but a handler whose steps changed.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use common::answer::{Answer, send};
use common::counter::Counter;
use common::faults::{Call, FaultyStore};
use common::server::TestServer;
use idem::journal::{CallError, StepError};
use idem::store::{MemoryStore, RecordStore, Store};
use idem::{Idem, identity};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A charge, as the provider answers it and the journal keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Charge {
    id: String,
    amount: i64,
}

/// A decline, as the provider answers it and the journal keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Decline {
    code: String,
}

/// The provider: deduplicates on `Idempotency-Key`, counts the charges it makes, and
/// answers 503 after charging while `lose` is above zero (the answer is lost for its
/// client: the outcome is unknown).
#[derive(Clone, Default)]
struct Provider {
    answers: Arc<Mutex<HashMap<String, (u16, Value)>>>,
    charges: Counter,
    requests: Counter,
    keys: Arc<Mutex<Vec<String>>>,
    lose: Arc<AtomicUsize>,
}

async fn provider_charge(
    State(provider): State<Provider>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    provider.requests.bump();
    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
    provider.keys.lock().unwrap().push(key.clone());
    let (status, answer) = {
        let mut answers = provider.answers.lock().unwrap();
        answers
            .entry(key)
            .or_insert_with(|| {
                let n = provider.charges.bump();
                if body["amount"] == 0 {
                    (402, json!({ "code": "card_declined" }))
                } else {
                    (
                        201,
                        json!({ "id": format!("ch_{n}"), "amount": body["amount"] }),
                    )
                }
            })
            .clone()
    };
    if provider
        .lose
        .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    (StatusCode::from_u16(status).unwrap(), Json(answer)).into_response()
}

#[derive(Clone)]
struct App {
    provider_url: String,
    http: reqwest::Client,
    runs: Counter,
    /// The first run sleeps this long after its charge, before it answers.
    stall_first: Duration,
    /// Each run names its step `charge-<run>`: the steps change between attempts.
    renames: bool,
}

impl App {
    /// `POST /charges` at the provider with `key`, classified as the journal needs.
    async fn charge(&self, amount: i64, key: &str) -> Result<Charge, CallError<Decline>> {
        let sent = self
            .http
            .post(format!("{}/charges", self.provider_url))
            .header("idempotency-key", key)
            .json(&json!({ "amount": amount }))
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(error) => return Err(CallError::Unknown(error.to_string())),
        };
        match response.status().as_u16() {
            200 | 201 => response
                .json()
                .await
                .map_err(|e| CallError::Unknown(e.to_string())),
            402 => Err(CallError::Definite(response.json().await.unwrap())),
            status => Err(CallError::Unknown(format!(
                "the provider answered {status}"
            ))),
        }
    }
}

#[derive(Deserialize)]
struct Pay {
    amount: i64,
}

#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1h",
    deadline = ("20s", per_attempt = "500ms"),
    max_attempts = 6,
    retryable = [503, timeout],
    concurrency = conflict,
    status_lookup = pay_status,
    recovery = resume,
)]
async fn pay(State(app): State<App>, journal: idem::Journal, Json(req): Json<Pay>) -> Response {
    charge_and_answer(app, journal, req).await
}

/// The same, under a short deadline: its client gives up within 2 s.
#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1h",
    deadline = ("2s", per_attempt = "300ms"),
    max_attempts = 3,
    retryable = [503, timeout],
    concurrency = conflict,
    status_lookup = pay_status,
    recovery = resume,
)]
async fn pay_briefly(
    State(app): State<App>,
    journal: idem::Journal,
    Json(req): Json<Pay>,
) -> Response {
    charge_and_answer(app, journal, req).await
}

async fn charge_and_answer(app: App, mut journal: idem::Journal, req: Pay) -> Response {
    let run = app.runs.bump();
    let name = if app.renames {
        format!("charge-{run}")
    } else {
        "charge".into()
    };
    let app_ref = &app;
    let charged = journal
        .step(&name, |key| async move {
            app_ref.charge(req.amount, key.as_str()).await
        })
        .await;
    match charged {
        Ok(charge) => {
            if run == 1 && !app.stall_first.is_zero() {
                tokio::time::sleep(app.stall_first).await;
            }
            (StatusCode::CREATED, Json(charge)).into_response()
        }
        Err(StepError::Definite(decline)) => {
            (StatusCode::PAYMENT_REQUIRED, Json(decline)).into_response()
        }
        Err(StepError::Interrupted(interrupted)) => interrupted.into_response(),
    }
}

async fn pay_status(
    lookup: idem::Lookup<pay::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

struct Setup {
    provider: Provider,
    provider_server: TestServer,
    service: TestServer,
    app: App,
    idem: Idem,
}

async fn start(store: impl Store, stall_first: Duration, renames: bool) -> Setup {
    let provider = Provider::default();
    let provider_server = TestServer::start(
        Router::new()
            .route("/charges", post(provider_charge))
            .with_state(provider.clone()),
    )
    .await;
    let app = App {
        provider_url: provider_server.url(""),
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap(),
        runs: Counter::default(),
        stall_first,
        renames,
    };
    let idem = Idem::builder(store, identity::header("x-client-id"))
        .recover_with::<pay::Operation, _>(&app)
        .recover_with::<pay_briefly::Operation, _>(&app)
        .build();
    let service = TestServer::start(
        Router::new()
            .route("/payments", post(pay))
            .route("/brief-payments", post(pay_briefly))
            .route("/payments/operations/{key}", get(pay_status))
            .with_state(app.clone())
            .layer(idem.layer()),
    )
    .await;
    Setup {
        provider,
        provider_server,
        service,
        app,
        idem,
    }
}

async fn pay_with(setup: &Setup, key: &str, amount: i64) -> Answer {
    send(
        setup
            .service
            .post("/payments", key)
            .json(&json!({ "amount": amount })),
    )
    .await
}

#[tokio::test]
async fn a_charge_is_made_once_and_replayed() {
    let setup = start(MemoryStore::new(), Duration::ZERO, false).await;
    let first = pay_with(&setup, "k1", 1250).await;
    assert_eq!(first.status, 201, "{first:?}");
    let again = pay_with(&setup, "k1", 1250).await;
    assert!(again.replayed());
    assert_eq!((again.status, again.json()), (201, first.json()));
    assert_eq!(setup.provider.charges.get(), 1);
    let keys = setup.provider.keys.lock().unwrap().clone();
    assert_eq!(
        keys,
        [format!("{}:charge", first.operation_id())],
        "the downstream key names the operation and the step"
    );
    setup.service.stop().await;
    setup.provider_server.stop().await;
}

/// The provider charges and its answer is lost: 503 `step-outcome-unknown`, the key kept;
/// the retry resumes, sends the same downstream key, and gets the one charge.
#[tokio::test]
async fn a_lost_answer_resumes_with_the_same_downstream_key() {
    let setup = start(MemoryStore::new(), Duration::ZERO, false).await;
    setup.provider.lose.store(2, SeqCst);
    let first = pay_with(&setup, "k1", 1250).await;
    let body = first.problem(503, "step-outcome-unknown");
    assert_eq!(body["state"], "processing");
    assert_eq!(body["new_key_safe"], false);
    assert!(first.header("retry-after").is_some());
    let second = pay_with(&setup, "k1", 1250).await;
    second.problem(503, "step-outcome-unknown");
    assert_eq!(
        second.operation_id(),
        first.operation_id(),
        "the same operation"
    );
    let third = pay_with(&setup, "k1", 1250).await;
    assert_eq!(third.status, 201, "{third:?}");
    assert_eq!(third.json(), json!({ "id": "ch_1", "amount": 1250 }));
    assert_eq!(third.operation_id(), first.operation_id());
    assert_eq!(setup.provider.charges.get(), 1, "one charge for one intent");
    let keys = setup.provider.keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 3);
    assert!(
        keys.iter().all(|k| *k == keys[0]),
        "every call sent the same key: {keys:?}"
    );
    let replay = pay_with(&setup, "k1", 1250).await;
    assert!(replay.replayed());
    assert_eq!(setup.provider.requests.get(), 3, "a replay calls nobody");
    setup.service.stop().await;
    setup.provider_server.stop().await;
}

/// The status lookup of a resumable operation reports its journal (names, states and
/// calls, never values) and does not recover it: only the retry can run the handler.
#[tokio::test]
async fn the_status_lookup_shows_the_journal() {
    let setup = start(MemoryStore::new(), Duration::ZERO, false).await;
    setup.provider.lose.store(1, SeqCst);
    pay_with(&setup, "k1", 1250)
        .await
        .problem(503, "step-outcome-unknown");
    let status = send(setup.service.get("/payments/operations/k1")).await;
    assert_eq!(status.status, 200, "{status:?}");
    let report = status.json();
    assert_eq!(report["state"], "processing");
    assert_eq!(report["new_key_safe"], false);
    assert_eq!(
        report["steps"],
        json!([{ "name": "charge", "state": "pending", "calls": 1 }])
    );
    // Asked again: still not recovered behind the client's back.
    let again = send(setup.service.get("/payments/operations/k1"))
        .await
        .json();
    assert_eq!(again["state"], "processing");
    assert_eq!(setup.provider.requests.get(), 1);
    assert_eq!(pay_with(&setup, "k1", 1250).await.status, 201);
    let done = send(setup.service.get("/payments/operations/k1"))
        .await
        .json();
    assert_eq!(done["state"], "completed");
    assert_eq!(
        done["steps"],
        json!([{ "name": "charge", "state": "done", "calls": 2 }])
    );
    assert!(
        done["steps"][0].get("value").is_none(),
        "no step value: {done}"
    );
    setup.service.stop().await;
    setup.provider_server.stop().await;
}

/// The attempt runs out of its time after the charge: the retry resumes, the charge is
/// replayed from the journal without a call, and the handler answers.
#[tokio::test]
async fn a_timed_out_attempt_resumes_without_calling_again() {
    let setup = start(MemoryStore::new(), Duration::from_secs(2), false).await;
    let first = pay_with(&setup, "k1", 700).await;
    first.problem(503, "attempt-timed-out");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let second = pay_with(&setup, "k1", 700).await;
    assert_eq!(second.status, 201, "{second:?}");
    assert_eq!(second.json(), json!({ "id": "ch_1", "amount": 700 }));
    assert_eq!(setup.app.runs.get(), 2, "the handler ran again");
    assert_eq!(
        setup.provider.requests.get(),
        1,
        "the done step was not sent again"
    );
    assert_eq!(setup.provider.charges.get(), 1);
    setup.service.stop().await;
    setup.provider_server.stop().await;
}

/// A decline is definite: 402, stored and replayed, one call.
#[tokio::test]
async fn a_decline_is_the_final_answer() {
    let setup = start(MemoryStore::new(), Duration::ZERO, false).await;
    let first = pay_with(&setup, "k1", 0).await;
    assert_eq!(
        (first.status, first.json()),
        (402, json!({ "code": "card_declined" }))
    );
    let again = pay_with(&setup, "k1", 0).await;
    assert!(again.replayed());
    assert_eq!(again.status, 402);
    assert_eq!(setup.provider.requests.get(), 1);
    setup.service.stop().await;
    setup.provider_server.stop().await;
}

/// The journal cannot be written: the call is never sent, the answer is 503
/// `step-outcome-unknown`; once the store heals, the retry charges once.
#[tokio::test]
async fn a_journal_that_cannot_be_written_sends_nothing() {
    let store = FaultyStore::memory();
    store.fail(Call::WriteStep);
    let setup = start(store.clone(), Duration::ZERO, false).await;
    let first = pay_with(&setup, "k1", 300).await;
    first.problem(503, "step-outcome-unknown");
    assert_eq!(
        setup.provider.requests.get(),
        0,
        "no intent recorded, no call sent"
    );
    store.heal(Call::WriteStep);
    let second = pay_with(&setup, "k1", 300).await;
    assert_eq!(second.status, 201, "{second:?}");
    assert_eq!(second.operation_id(), first.operation_id());
    assert_eq!(setup.provider.charges.get(), 1);
    setup.service.stop().await;
    setup.provider_server.stop().await;
}

/// A handler whose steps change between attempts is parked for an operator, with a
/// reason that names both steps, rather than sending a call the journal does not know.
#[tokio::test]
async fn changed_steps_are_parked_not_sent() {
    let setup = start(MemoryStore::new(), Duration::ZERO, true).await;
    setup.provider.lose.store(1, SeqCst);
    pay_with(&setup, "k1", 500)
        .await
        .problem(503, "step-outcome-unknown");
    let second = pay_with(&setup, "k1", 500).await;
    let body = second.problem(409, "operation-outcome-unknown");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("`charge-1`") && detail.contains("`charge-2`"),
        "{detail}"
    );
    assert_eq!(
        setup.provider.requests.get(),
        1,
        "the changed step was not sent"
    );
    pay_with(&setup, "k1", 500)
        .await
        .problem(409, "operation-outcome-unknown");
    setup.service.stop().await;
    setup.provider_server.stop().await;
}

/// Many retries of one key at once while the provider loses answers: one charge, and
/// every final answer is the same.
#[tokio::test]
async fn concurrent_retries_charge_once() {
    let setup = Arc::new(start(MemoryStore::new(), Duration::ZERO, false).await);
    setup.provider.lose.store(3, SeqCst);
    let mut finals = Vec::new();
    for _round in 0..20 {
        let tasks: Vec<_> = (0..5)
            .map(|_| {
                let setup = Arc::clone(&setup);
                tokio::spawn(async move { pay_with(&setup, "k1", 999).await })
            })
            .collect();
        for task in tasks {
            let answer = task.await.unwrap();
            if answer.status == 201 {
                finals.push(answer.json());
            }
        }
        if !finals.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!finals.is_empty(), "the operation finished");
    assert!(
        finals
            .iter()
            .all(|f| *f == json!({ "id": "ch_1", "amount": 999 })),
        "{finals:?}"
    );
    assert_eq!(setup.provider.charges.get(), 1);
}

/// The reconciler leaves a resumable operation to its client's retry within the
/// contract's deadline; after it, an operation whose journal holds a step that may have
/// taken effect is parked for an operator (its steps named), and one whose journal is
/// empty is released (nothing happened outside the database).
#[tokio::test]
async fn the_reconciler_settles_operations_their_client_abandoned() {
    let store = FaultyStore::memory();
    let setup = start(store.clone(), Duration::ZERO, false).await;
    setup.provider.lose.store(1, SeqCst);
    let brief = |key: &'static str| {
        send(
            setup
                .service
                .post("/brief-payments", key)
                .json(&json!({ "amount": 10 })),
        )
    };
    brief("charged").await.problem(503, "step-outcome-unknown");
    store.fail(Call::WriteStep);
    brief("nothing-sent")
        .await
        .problem(503, "step-outcome-unknown");
    store.heal(Call::WriteStep);
    assert_eq!(setup.provider.requests.get(), 1);

    let pass = setup.idem.reconcile().await.unwrap();
    assert_eq!((pass.waiting, pass.recovered), (2, 0), "{pass:?}");
    tokio::time::sleep(Duration::from_millis(2400)).await;
    let pass = setup.idem.reconcile().await.unwrap();
    assert_eq!((pass.waiting, pass.recovered), (0, 2), "{pass:?}");

    let record = |key: &str| {
        let key = idem::store::RecordKey::new("pay_briefly", common::server::CLIENT, key);
        let store = store.clone();
        async move {
            store
                .get(&key, idem::store::unix_now())
                .await
                .unwrap()
                .unwrap()
        }
    };
    match record("charged").await.state {
        idem::store::RecordState::Unknown { reason } => {
            assert!(reason.contains("`charge` pending"), "{reason}");
        }
        other => panic!("parked for an operator, got {other:?}"),
    }
    assert_eq!(
        record("nothing-sent").await.state,
        idem::store::RecordState::Released
    );
    assert_eq!(
        setup.provider.requests.get(),
        1,
        "the reconciler sends nothing"
    );
    setup.service.stop().await;
    setup.provider_server.stop().await;
}

/// What `pay_on_sqlite` writes, and when its second step comes.
#[derive(Clone)]
struct SqliteApp {
    charges: App,
    pool: idem::sqlx::SqlitePool,
    /// Runs the step `receipt` after the payment's write (which the journal refuses).
    step_after_write: bool,
}

#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1h",
    deadline = ("20s", per_attempt = "2s"),
    max_attempts = 6,
    retryable = [503, timeout],
    concurrency = conflict,
    status_lookup = sqlite_pay_status,
    recovery = resume,
)]
async fn pay_on_sqlite(
    State(app): State<SqliteApp>,
    mut journal: idem::Journal,
    attempt: idem::Attempt,
    tx: idem::SqliteTx,
    Json(req): Json<Pay>,
) -> Response {
    let charges = &app.charges;
    let charged = journal
        .step("charge", |key| async move {
            charges.charge(req.amount, key.as_str()).await
        })
        .await;
    let charge = match charged {
        Ok(charge) => charge,
        Err(StepError::Definite(decline)) => {
            return (StatusCode::PAYMENT_REQUIRED, Json(decline)).into_response();
        }
        Err(StepError::Interrupted(interrupted)) => return interrupted.into_response(),
    };
    let mut conn = tx.conn().await.unwrap();
    idem::sqlx::query("INSERT INTO payments (operation_id, charge) VALUES (?, ?)")
        .bind(attempt.operation_id.to_string())
        .bind(&charge.id)
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);
    if app.step_after_write {
        let later = journal
            .step("receipt", |_key| async { Ok::<_, CallError<Decline>>(()) })
            .await;
        if let Err(StepError::Interrupted(interrupted)) = later {
            return interrupted.into_response();
        }
    }
    (StatusCode::CREATED, Json(charge)).into_response()
}

async fn sqlite_pay_status(
    lookup: idem::Lookup<pay_on_sqlite::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

async fn start_on_sqlite(step_after_write: bool) -> (Setup, SqliteApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = idem::SqliteStore::open(dir.path().join("payments.db"))
        .await
        .unwrap();
    let pool = store.pool().clone();
    idem::sqlx::query("CREATE TABLE payments (operation_id TEXT PRIMARY KEY, charge TEXT)")
        .execute(&pool)
        .await
        .unwrap();
    let setup = start(MemoryStore::new(), Duration::ZERO, false).await;
    let app = SqliteApp {
        charges: setup.app.clone(),
        pool,
        step_after_write,
    };
    let idem = Idem::transactional(store, identity::header("x-client-id"));
    let service = TestServer::start(
        Router::new()
            .route("/sqlite-payments", post(pay_on_sqlite))
            .route("/sqlite-payments/operations/{key}", get(sqlite_pay_status))
            .with_state(app.clone())
            .layer(idem.layer()),
    )
    .await;
    let setup = Setup { service, ..setup };
    (setup, app, dir)
}

async fn payments_on_sqlite(app: &SqliteApp) -> i64 {
    idem::sqlx::query_scalar("SELECT count(*) FROM payments")
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

/// In SQLite's transactional mode the transaction begins at the handler's first write,
/// so the charge's step before it is journaled while the one write lock is free: a lost
/// answer resumes with the same downstream key, one charge, one payment row.
#[tokio::test]
async fn on_sqlites_transaction_a_lost_answer_resumes_with_one_charge() {
    let (setup, app, _dir) = start_on_sqlite(false).await;
    setup.provider.lose.store(1, SeqCst);
    let pay = || {
        send(
            setup
                .service
                .post("/sqlite-payments", "k1")
                .json(&json!({ "amount": 40 })),
        )
    };
    let first = pay().await;
    first.problem(503, "step-outcome-unknown");
    assert_eq!(payments_on_sqlite(&app).await, 0);
    let second = pay().await;
    assert_eq!(second.status, 201, "{second:?}");
    assert_eq!(second.operation_id(), first.operation_id());
    assert_eq!(setup.provider.charges.get(), 1);
    assert_eq!(
        setup.provider.requests.get(),
        2,
        "sent again under the same key"
    );
    assert_eq!(payments_on_sqlite(&app).await, 1);
    assert!(pay().await.replayed());
    // A decline never writes through the transaction: it begins at the settlement, and
    // the 402 commits with the record.
    let decline = || {
        send(
            setup
                .service
                .post("/sqlite-payments", "declined")
                .json(&json!({ "amount": 0 })),
        )
    };
    assert_eq!(decline().await.status, 402);
    let again = decline().await;
    assert_eq!(again.status, 402);
    assert!(again.replayed());
    assert_eq!(payments_on_sqlite(&app).await, 1);
    setup.service.stop().await;
    setup.provider_server.stop().await;
}

/// A step after the handler's first write through SQLite's transaction could not be
/// recorded before its call (the lock is held): refused, nothing sent, the attempt rolled
/// back (no payment row).
#[tokio::test]
async fn on_sqlites_transaction_a_step_after_the_first_write_is_refused() {
    let (setup, app, _dir) = start_on_sqlite(true).await;
    let refused = send(
        setup
            .service
            .post("/sqlite-payments", "k2")
            .json(&json!({ "amount": 40 })),
    )
    .await;
    let body = refused.problem(503, "step-outcome-unknown");
    assert_eq!(body["new_key_safe"], false);
    assert_eq!(payments_on_sqlite(&app).await, 0, "rolled back");
    assert_eq!(
        setup.provider.charges.get(),
        1,
        "the charge before the write went"
    );
    setup.service.stop().await;
    setup.provider_server.stop().await;
}
