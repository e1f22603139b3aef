//! A service wired wrongly is told so: at start-up by `Idem::check_handlers`, which reads
//! what each contracted handler needs (`Contracted::MODE`, from the macro); and at the
//! first request, over a real socket, by an error in the service's log that names the
//! fix, once per process for each cause (this binary's own process: no other test here
//! makes those requests).

mod common;

use std::sync::{Arc, Mutex, OnceLock};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use common::answer::send;
use common::server::TestServer;
use idem::enforce::{Contracted, HandlerMode};
use idem::{Idem, MemoryStore, identity};
use serde::Deserialize;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

#[derive(Deserialize)]
struct Renew {
    plan: String,
}

#[derive(Clone)]
struct App;

type Transaction = idem::PgTx;

async fn status() -> StatusCode {
    StatusCode::OK
}

/// Takes no transaction.
#[idem::contract(
    key_scope = client, fingerprint = [plan], ttl = "1h", deadline = "10s",
    max_attempts = 3, retryable = [503], concurrency = conflict, status_lookup = status,
    recovery = manual("https://runbooks.example.com/renewals"),
)]
async fn plain(State(_): State<App>, Json(r): Json<Renew>) -> StatusCode {
    let _ = r.plan;
    StatusCode::CREATED
}

/// Takes PostgreSQL's transaction, as `idem::PgTx`.
#[idem::contract(
    key_scope = client, fingerprint = [plan], ttl = "1h", deadline = "10s",
    max_attempts = 3, retryable = [503], concurrency = conflict, status_lookup = status,
    recovery = manual("https://runbooks.example.com/renewals"),
)]
async fn on_postgres(attempt: idem::Attempt, tx: idem::PgTx, Json(r): Json<Renew>) -> StatusCode {
    let _ = (attempt, tx, r.plan);
    StatusCode::CREATED
}

/// Takes it through the generic type, after a path parameter.
#[idem::contract(
    key_scope = client, fingerprint = [plan], ttl = "1h", deadline = "10s",
    max_attempts = 3, retryable = [503], concurrency = conflict, status_lookup = status,
    recovery = manual("https://runbooks.example.com/renewals"),
)]
async fn generic(
    Path(_): Path<String>,
    tx: idem::transaction::Tx<idem::sqlx::Postgres>,
    Json(r): Json<Renew>,
) -> StatusCode {
    let _ = (tx, r.plan);
    StatusCode::CREATED
}

/// Takes it under an alias, which no reading by name would recognise.
#[idem::contract(
    key_scope = client, fingerprint = [plan], ttl = "1h", deadline = "10s",
    max_attempts = 3, retryable = [503], concurrency = conflict, status_lookup = status,
    recovery = manual("https://runbooks.example.com/renewals"),
)]
async fn aliased(tx: Transaction, Json(r): Json<Renew>) -> StatusCode {
    let _ = (tx, r.plan);
    StatusCode::CREATED
}

/// Takes SQLite's transaction.
#[idem::contract(
    key_scope = client, fingerprint = [plan], ttl = "1h", deadline = "10s",
    max_attempts = 3, retryable = [503], concurrency = conflict, status_lookup = status,
    recovery = manual("https://runbooks.example.com/renewals"),
)]
async fn on_sqlite(tx: idem::SqliteTx, Json(r): Json<Renew>) -> StatusCode {
    let _ = (tx, r.plan);
    StatusCode::CREATED
}

/// Takes SQLite's transaction and the step journal.
#[idem::contract(
    key_scope = client, fingerprint = [plan], ttl = "1h", deadline = "10s",
    max_attempts = 3, retryable = [503], concurrency = conflict, status_lookup = status,
    recovery = resume,
)]
async fn journal_on_sqlite(
    journal: idem::Journal,
    tx: idem::SqliteTx,
    Json(r): Json<Renew>,
) -> StatusCode {
    let _ = (journal, tx, r.plan);
    StatusCode::CREATED
}

mod other {
    use super::{Json, Renew, StatusCode, status};

    /// The same name as `super::plain`: the two would share every key.
    #[idem::contract(
        key_scope = client, fingerprint = [plan], ttl = "1h", deadline = "10s",
        max_attempts = 3, retryable = [503], concurrency = conflict, status_lookup = status,
        recovery = manual("https://runbooks.example.com/renewals"),
    )]
    pub(super) async fn plain(Json(r): Json<Renew>) -> StatusCode {
        let _ = r.plan;
        StatusCode::CREATED
    }
}

const POSTGRES: HandlerMode = HandlerMode::Transactional {
    database: "PostgreSQL",
};

#[test]
fn the_macro_reads_the_transaction_from_the_arguments_by_type() {
    assert_eq!(plain::Operation::MODE, HandlerMode::Plain);
    assert_eq!(on_postgres::Operation::MODE, POSTGRES);
    assert_eq!(generic::Operation::MODE, POSTGRES);
    assert_eq!(aliased::Operation::MODE, POSTGRES);
    assert_eq!(
        on_sqlite::Operation::MODE,
        HandlerMode::Transactional { database: "SQLite" }
    );
}

#[tokio::test]
async fn the_start_up_check_says_what_each_handler_needs_of_the_handle() {
    let plain_handle = Idem::new(MemoryStore::new(), identity::header("x-client-id"));
    assert!(plain_handle.check_handlers::<plain::Operation>().is_ok());
    let error = plain_handle
        .check_handlers::<(plain::Operation, on_postgres::Operation, aliased::Operation)>()
        .unwrap_err();
    assert_eq!(error.problems().len(), 2, "{error}");
    assert_eq!(
        error.problems()[0],
        "`on_postgres` takes the transaction of PostgreSQL, but this handle was made without a transactional store (`Idem::new`): build it with `Idem::transactional(store, ..)` over the PostgreSQL `idem::PostgresStore` that holds the business data"
    );
    assert!(error.problems()[1].starts_with("`aliased` takes the transaction of PostgreSQL"));
    // What `main` returning it prints.
    assert!(
        format!("{error:?}").starts_with(
            "idem cannot serve these contracted handlers as configured:\n- `on_postgres` takes"
        ),
        "{error:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let sqlite = idem::SqliteStore::open(dir.path().join("r.db"))
        .await
        .unwrap();
    let on_sqlite_handle = Idem::transactional(sqlite, identity::header("x-client-id"));
    assert!(
        on_sqlite_handle
            .check_handlers::<on_sqlite::Operation>()
            .is_ok()
    );
    let error = on_sqlite_handle
        .check_handlers::<(
            generic::Operation,
            other::plain::Operation,
            plain::Operation,
        )>()
        .unwrap_err();
    assert_eq!(
        error.problems(),
        [
            "`generic` takes the transaction of PostgreSQL, but this handle is transactional over a SQLite store: build it with `Idem::transactional(store, ..)` over the PostgreSQL `idem::PostgresStore` that holds the business data",
            "two contracted handlers are named `plain` (the other is `configuration::other::plain::Operation`): they would share every idempotency key; rename one of them",
        ]
    );
    // A step journal on SQLite's transaction: its transaction begins at the handler's
    // first write, so the steps before it are recorded while the lock is free.
    assert!(
        on_sqlite_handle
            .check_handlers::<journal_on_sqlite::Operation>()
            .is_ok()
    );
}

/// `PgTx` under a handle made with `Idem::transactional` over PostgreSQL passes.
#[tokio::test]
async fn a_postgres_handler_under_a_postgres_handle_passes() {
    let what = "the start-up check over PostgreSQL";
    let Some(pool) = idem_runtime::store::conformance::postgres::scratch_pool(what).await else {
        return;
    };
    let store = idem::PostgresStore::from_pool(pool).await.unwrap();
    let idem = Idem::transactional(store, identity::header("x-client-id"));
    idem.check_handlers::<(on_postgres::Operation, generic::Operation, plain::Operation)>()
        .unwrap();
}

/// The error events of the whole process, as their messages.
fn errors() -> Arc<Mutex<Vec<String>>> {
    static ERRORS: OnceLock<Arc<Mutex<Vec<String>>>> = OnceLock::new();
    ERRORS
        .get_or_init(|| {
            let errors = Arc::new(Mutex::new(Vec::new()));
            tracing_subscriber::registry()
                .with(Errors(errors.clone()))
                .init();
            errors
        })
        .clone()
}

struct Errors(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Errors {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        struct Message(String);
        impl Visit for Message {
            fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        if *event.metadata().level() == tracing::Level::ERROR {
            let mut message = Message(String::new());
            event.record(&mut message);
            self.0.lock().unwrap().push(message.0);
        }
    }
}

/// How many error events so far hold `text`.
fn logged(text: &str) -> usize {
    errors()
        .lock()
        .unwrap()
        .iter()
        .filter(|m| m.contains(text))
        .count()
}

async fn post_renewal(server: &TestServer, path: &str, key: &str) -> u16 {
    send(
        server
            .post(path, key)
            .json(&serde_json::json!({ "plan": "pro" })),
    )
    .await
    .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_without_the_layer_logs_the_fix_once() {
    let _ = errors();
    let fix = "add `.layer(idem.layer())` to the router that serves it";
    let server = TestServer::start(
        Router::new()
            .route("/a", post(plain))
            .route("/b", post(on_sqlite))
            .with_state(App),
    )
    .await;
    assert_eq!(post_renewal(&server, "/a", "k1").await, 500);
    assert_eq!(logged(fix), 1, "{:?}", errors());
    assert_eq!(post_renewal(&server, "/a", "k2").await, 500);
    assert_eq!(post_renewal(&server, "/b", "k3").await, 500);
    assert_eq!(logged(fix), 1, "once per process: {:?}", errors());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_without_its_store_logs_the_fix_once() {
    let _ = errors();
    let fix = "build the handle with `Idem::transactional(store, ..)` over the SQLite store";
    let idem = Idem::new(MemoryStore::new(), identity::header("x-client-id"));
    let server = TestServer::start(
        Router::new()
            .route("/b", post(on_sqlite))
            .layer(idem.layer()),
    )
    .await;
    assert_eq!(post_renewal(&server, "/b", "k1").await, 500);
    assert_eq!(logged(fix), 1, "{:?}", errors());
    assert_eq!(post_renewal(&server, "/b", "k2").await, 500);
    assert_eq!(logged(fix), 1, "once per process: {:?}", errors());
}
