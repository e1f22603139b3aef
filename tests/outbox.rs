//! The outbox (`idem::outbox`, docs/steps.md): a contracted handler stages a receipt with
//! `journal.after_commit`, and a worker delivers it to a mail service of the test's own
//! under the step's downstream key, once the operation completed with a success; never
//! after a refusal or a rolled-back attempt; retried with backoff while the mail service
//! fails, given up when it refuses, and sent once by two workers racing.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use common::answer::send;
use common::server::TestServer;
use idem::journal::{CallError, DownstreamKey};
use idem::outbox::DeliveryPolicy;
use idem::store::{MemoryStore, RecordKey, StepState, Store};
use idem::{Idem, identity};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The receipt a handler stages: its payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Receipt {
    to: String,
    amount: i64,
}

/// What the mail service answers one call.
type Answer = Result<(), CallError<String>>;

/// The mail service: what it was sent (receipt and key), and how it fails.
#[derive(Clone, Default)]
struct Mailer {
    sent: Arc<Mutex<Vec<(Receipt, String)>>>,
    /// Each call pops the next answer; once empty, it succeeds.
    script: Arc<Mutex<Vec<Answer>>>,
}

impl Mailer {
    async fn send(&self, receipt: Receipt, key: DownstreamKey) -> Result<(), CallError<String>> {
        let next = self.script.lock().unwrap().pop();
        if let Some(Err(error)) = next {
            return Err(error);
        }
        self.sent
            .lock()
            .unwrap()
            .push((receipt, key.as_str().to_owned()));
        Ok(())
    }

    fn sent(&self) -> Vec<(Receipt, String)> {
        self.sent.lock().unwrap().clone()
    }
}

/// Whether the order with a negative amount has failed once already.
static RETRIED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[derive(Deserialize)]
struct Order {
    to: String,
    amount: i64,
}

#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1h",
    deadline = ("20s", per_attempt = "2s"),
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status,
    recovery = resume,
)]
async fn create_order(mut journal: idem::Journal, Json(order): Json<Order>) -> Response {
    let receipt = Receipt {
        to: order.to.clone(),
        amount: order.amount,
    };
    if let Err(interrupted) = journal.after_commit("receipt", &receipt).await {
        return interrupted.into_response();
    }
    match order.amount {
        // A refusal after the staging: the receipt must never go.
        0 => (StatusCode::UNPROCESSABLE_ENTITY, "no amount").into_response(),
        // A retryable failure after the staging, the first time: released; the retry
        // (the same operation) completes.
        amount if amount < 0 && !RETRIED.swap(true, std::sync::atomic::Ordering::SeqCst) => {
            (StatusCode::SERVICE_UNAVAILABLE, "try again").into_response()
        }
        amount => (StatusCode::CREATED, Json(json!({ "amount": amount }))).into_response(),
    }
}

async fn order_status(
    lookup: idem::Lookup<create_order::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

fn handle(store: Arc<dyn Store>, mailer: &Mailer) -> Idem {
    let mailer = mailer.clone();
    Idem::builder(store, identity::header("x-client-id"))
        .deliver::<create_order::Operation, _, _, _, _>("receipt", move |receipt, key| {
            let mailer = mailer.clone();
            async move { mailer.send(receipt, key).await }
        })
        .delivery_policy(
            DeliveryPolicy::default()
                .max_deliveries(3)
                .backoff(Duration::from_millis(20), Duration::from_millis(40))
                .timeout(Duration::from_secs(2)),
        )
        .build()
}

async fn serve(idem: &Idem) -> TestServer {
    TestServer::start(
        Router::new()
            .route("/orders", post(create_order))
            .route("/orders/operations/{key}", get(order_status))
            .layer(idem.layer()),
    )
    .await
}

async fn order(server: &TestServer, key: &str, amount: i64) -> u16 {
    let body = json!({ "to": "ana@example.com", "amount": amount });
    send(server.post("/orders", key).json(&body)).await.status
}

fn state_of(steps: &[idem::store::Step]) -> Vec<&'static str> {
    steps.iter().map(|s| s.state.as_str()).collect()
}

async fn journal_of(
    store: &Arc<dyn Store>,
    key: &str,
    id: idem::OperationId,
) -> Vec<idem::store::Step> {
    let key = RecordKey::new("create_order", common::server::CLIENT, key);
    store
        .steps(&key, id, idem::store::unix_now())
        .await
        .unwrap()
}

/// Delivered once the order completed, under `<operation id>:receipt`; a refused order's
/// receipt never goes; a released attempt's receipt goes once its retry completes.
#[tokio::test]
async fn a_receipt_goes_once_the_order_succeeded() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mailer = Mailer::default();
    let idem = handle(Arc::clone(&store), &mailer);
    let server = serve(&idem).await;

    let created = send(
        server
            .post("/orders", "ok")
            .json(&json!({ "to": "ana@example.com", "amount": 12 })),
    )
    .await;
    assert_eq!(created.status, 201);
    assert_eq!(order(&server, "refused", 0).await, 422);
    assert_eq!(order(&server, "later", -5).await, 503);
    let pass = idem.deliver_due().await.unwrap();
    assert_eq!((pass.due, pass.delivered), (1, 1), "{pass:?}");
    let sent = mailer.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].0,
        Receipt {
            to: "ana@example.com".into(),
            amount: 12
        }
    );
    assert_eq!(sent[0].1, format!("{}:receipt", created.operation_id()));
    let id = created.operation_id().parse().unwrap();
    assert_eq!(state_of(&journal_of(&store, "ok", id).await), ["delivered"]);

    assert_eq!(
        order(&server, "ok", 12).await,
        201,
        "a replay stages nothing"
    );
    assert_eq!(idem.deliver_due().await.unwrap().due, 0);
    assert_eq!(
        mailer.sent().len(),
        1,
        "the refused and the released sent nothing"
    );

    // The released order's retry (same fingerprint, same operation) completes it: the
    // receipt its first attempt staged goes then, once.
    let later = send(
        server
            .post("/orders", "later")
            .json(&json!({ "to": "ana@example.com", "amount": -5 })),
    )
    .await;
    assert_eq!(later.status, 201);
    assert_eq!(idem.deliver_due().await.unwrap().delivered, 1);
    let sent = mailer.sent();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[1].1, format!("{}:receipt", later.operation_id()));
    assert_eq!(idem.deliver_due().await.unwrap().due, 0);
    server.stop().await;
}

/// The mail service fails twice with an unknown outcome, then takes it: three deliveries
/// under one key, with a backoff between them. A refusal gives up at once, kept in the
/// journal for an operator.
#[tokio::test]
async fn failed_deliveries_are_retried_then_given_up() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mailer = Mailer::default();
    mailer.script.lock().unwrap().extend([
        Err(CallError::Unknown("timeout".into())),
        Err(CallError::Unknown("reset".into())),
    ]);
    let idem = handle(Arc::clone(&store), &mailer);
    let server = serve(&idem).await;
    assert_eq!(order(&server, "flaky", 7).await, 201);
    let mut passes = Vec::new();
    for _ in 0..50 {
        let pass = idem.deliver_due().await.unwrap();
        passes.push(pass);
        if pass.delivered == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let retried: u64 = passes.iter().map(|p| p.retried).sum();
    assert_eq!(retried, 2, "{passes:?}");
    assert_eq!(passes.last().unwrap().delivered, 1, "{passes:?}");
    assert_eq!(mailer.sent().len(), 1);

    mailer
        .script
        .lock()
        .unwrap()
        .push(Err(CallError::Definite("mailbox does not exist".into())));
    let created = send(
        server
            .post("/orders", "refused-mail")
            .json(&json!({ "to": "ana@example.com", "amount": 8 })),
    )
    .await;
    let pass = idem.deliver_due().await.unwrap();
    assert_eq!(pass.given_up, 1, "{pass:?}");
    let id = created.operation_id().parse().unwrap();
    let steps = journal_of(&store, "refused-mail", id).await;
    assert_eq!(
        steps[0].state,
        StepState::GivenUp(r#"{"to":"ana@example.com","amount":8}"#.into())
    );
    assert_eq!(idem.deliver_due().await.unwrap().due, 0, "never sent again");
    server.stop().await;
}

/// Two instances' workers race over one store: each receipt is sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_send_each_receipt_once() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let mailer = Mailer::default();
    let (one, two) = (
        handle(Arc::clone(&store), &mailer),
        handle(Arc::clone(&store), &mailer),
    );
    let server = serve(&one).await;
    for n in 0..20 {
        assert_eq!(order(&server, &format!("k{n}"), n + 1).await, 201);
    }
    let (a, b) = tokio::join!(one.deliver_due(), two.deliver_due());
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.delivered + b.delivered, 20, "{a:?} {b:?}");
    let mut keys: Vec<String> = mailer.sent().into_iter().map(|(_, key)| key).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 20, "one delivery per receipt");
    server.stop().await;
}

/// In the transactional mode on PostgreSQL: a receipt staged by an attempt that rolled
/// back (the handler's retryable 503) does not go; once the retry commits the order, it
/// goes once, and the order exists once.
#[tokio::test]
async fn on_postgres_a_receipt_goes_only_with_the_commit() {
    let what = "the outbox in the transactional mode";
    let Some(pool) = idem_runtime::store::conformance::postgres::scratch_pool(what).await else {
        return;
    };
    sqlx::query("CREATE TABLE orders (operation_id TEXT PRIMARY KEY, amount BIGINT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let store = idem::PostgresStore::from_pool(pool.clone()).await.unwrap();
    let mailer = Mailer::default();
    let sender = mailer.clone();
    let idem = Idem::transactional_builder(store.clone(), identity::header("x-client-id"))
        .deliver::<pg_order::Operation, _, _, _, _>("receipt", move |receipt, key| {
            let sender = sender.clone();
            async move { sender.send(receipt, key).await }
        })
        .build();
    let server = TestServer::start(
        Router::new()
            .route("/orders", post(pg_order))
            .route("/orders/operations/{key}", get(pg_order_status))
            .layer(idem.layer()),
    )
    .await;
    let body = json!({ "to": "ana@example.com", "amount": 30 });
    let first = send(server.post("/orders", "pg-1").json(&body)).await;
    assert_eq!(first.status, 503, "the first attempt rolls back");
    assert_eq!(
        idem.deliver_due().await.unwrap().due,
        0,
        "nothing committed, nothing due"
    );
    let second = send(server.post("/orders", "pg-1").json(&body)).await;
    assert_eq!(second.status, 201);
    assert_eq!(second.operation_id(), first.operation_id());
    assert_eq!(idem.deliver_due().await.unwrap().delivered, 1);
    assert_eq!(idem.deliver_due().await.unwrap().due, 0);
    let sent = mailer.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].1, format!("{}:receipt", second.operation_id()));
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(orders, 1);
    server.stop().await;
}

/// Whether `pg_order` has rolled back once.
static PG_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[idem::contract(
    key_scope = client,
    fingerprint = body,
    ttl = "1h",
    deadline = ("20s", per_attempt = "5s"),
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = pg_order_status,
    recovery = resume,
)]
async fn pg_order(
    mut journal: idem::Journal,
    attempt: idem::Attempt,
    tx: idem::PgTx,
    Json(order): Json<Order>,
) -> Response {
    let receipt = Receipt {
        to: order.to.clone(),
        amount: order.amount,
    };
    if let Err(interrupted) = journal.after_commit("receipt", &receipt).await {
        return interrupted.into_response();
    }
    let mut conn = tx.conn().await.unwrap();
    sqlx::query("INSERT INTO orders (operation_id, amount) VALUES ($1, $2)")
        .bind(attempt.operation_id.to_string())
        .bind(order.amount)
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);
    if !PG_FAILED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        // Written, then a retryable failure: the order rolls back with the record.
        return (StatusCode::SERVICE_UNAVAILABLE, "try again").into_response();
    }
    (StatusCode::CREATED, Json(json!({ "amount": order.amount }))).into_response()
}

async fn pg_order_status(
    lookup: idem::Lookup<pg_order::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}
