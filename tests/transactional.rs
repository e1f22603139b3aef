//! The transactional mode (`idem::transaction`, docs/transaction.md) over real sockets, against a real SQLite file and
//! a real PostgreSQL server: the business write and the key's final state commit in one
//! transaction, or not at all.
//!
//! Each case runs once per database; the handler writes an order through its `Tx`, then
//! behaves as the request's `mode` says (not part of the fingerprint, so a retry may
//! differ).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::answer::{Answer, send};
use common::counter::Counter;
use common::server::{TestServer, client};
use serde_json::{Value, json};

/// What the handler does after its write.
fn order(mode: &str) -> Value {
    json!({ "amount": 100, "mode": mode })
}

/// Sends `POST /orders` with `key` and `mode`.
async fn post(server: &TestServer, key: &str, mode: &str) -> Answer {
    send(server.post("/orders", key).json(&order(mode))).await
}

#[derive(Clone, Default)]
struct Hooks {
    runs: Counter,
    /// Signalled by `wait-for-takeover` once its write is done.
    written: Arc<tokio::sync::Notify>,
    /// Awaited by `wait-for-takeover` before it answers.
    resume: Arc<tokio::sync::Notify>,
}

// One module per database: the same handler and the same cases, with the database's
// transaction type, placeholders and store.
macro_rules! suite {
    (
        $m:ident,
        tx = $tx:ty,
        store = $store:ty,
        insert = $insert:literal,
        count = $count:literal,
        by_operation = $by_operation:literal,
        lose_lease_in_tx = $lose_in_tx:literal,
        lost_elsewhere = $lost_elsewhere:literal,
        lost_state = $lost_state:literal,
        open = $open:expr,
    ) => {
        mod $m {
            use super::*;

            use axum::extract::{Path, State};
            use axum::http::StatusCode;
            use axum::response::{IntoResponse, Response};
            use axum::routing::{get, post as route_post};
            use axum::{Json, Router};
            use idem::store::{RecordKey, RecordState, RecordStore, unix_now};
            use idem::{Idem, Decision, UnknownOperation, identity};
            use serde::Deserialize;

            #[derive(Clone)]
            pub(super) struct App {
                pub(super) store: $store,
                pub(super) hooks: Hooks,
            }

            #[derive(Deserialize)]
            struct CreateOrder {
                amount: i64,
                #[serde(default)]
                mode: String,
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
                tx: $tx,
                Json(order): Json<CreateOrder>,
            ) -> Response {
                app.hooks.runs.bump();
                {
                    let mut conn = tx.conn().await.expect("the attempt's transaction");
                    sqlx::query($insert)
                        .bind(attempt.operation_id.to_string())
                        .bind(&attempt.key)
                        .bind(order.amount)
                        .execute(&mut *conn)
                        .await
                        .expect("the business write");
                    if order.mode == "lose-to-completed" && $lost_elsewhere {
                        // The winner's completed record, for this key, committed by
                        // another session.
                        sqlx::query(COPY_WINNER)
                            .bind(&attempt.key)
                            .execute(app.store.pool())
                            .await
                            .unwrap();
                    } else if order.mode == "lose-lease-in-tx" && $lost_elsewhere {
                        // Another owner's record, committed by another session, as the
                        // completion's insert will find it.
                        sqlx::query($lose_in_tx)
                            .bind(&attempt.operation)
                            .bind(&attempt.client)
                            .bind(&attempt.key)
                            .execute(app.store.pool())
                            .await
                            .unwrap();
                    } else if order.mode == "lose-lease-in-tx" {
                        // Another owner's row of the key, as the completion's insert
                        // will find it: on SQLite, whose one writer is this
                        // transaction, written inside it (another process's commit
                        // after this one read the key would look the same).
                        sqlx::query($lose_in_tx)
                            .bind(&attempt.operation)
                            .bind(&attempt.client)
                            .bind(&attempt.key)
                            .execute(&mut *conn)
                            .await
                            .unwrap();
                    }
                }
                let created = (StatusCode::CREATED, Json(json!({ "key": attempt.key, "amount": order.amount })));
                match order.mode.as_str() {
                    "503-after-write" => (StatusCode::SERVICE_UNAVAILABLE, "busy").into_response(),
                    "500-after-write" => (StatusCode::INTERNAL_SERVER_ERROR, "read-back failed").into_response(),
                    "422-after-write" => (StatusCode::UNPROCESSABLE_ENTITY, "refused, but recorded").into_response(),
                    "panic-after-write" => panic!("the handler fails after its write"),
                    "slow" => {
                        tokio::time::sleep(Duration::from_secs(3)).await;
                        created.into_response()
                    }
                    "big" => (StatusCode::CREATED, [("location", "/orders/big")], "x".repeat(4096)).into_response(),
                    // Past the store's own limit (1 MiB, headers counted).
                    "huge" => (StatusCode::CREATED, "x".repeat(1 << 20)).into_response(),
                    "wait-for-takeover" => {
                        app.hooks.written.notify_one();
                        app.hooks.resume.notified().await;
                        created.into_response()
                    }
                    "sleep-200ms" => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        created.into_response()
                    }
                    "sleep-700ms" => {
                        tokio::time::sleep(Duration::from_millis(700)).await;
                        created.into_response()
                    }
                    "sleep-700ms-503" => {
                        tokio::time::sleep(Duration::from_millis(700)).await;
                        (StatusCode::SERVICE_UNAVAILABLE, "busy").into_response()
                    }
                    _ => created.into_response(),
                }
            }

            /// Finds the order of the operation: the transactional mode leaves none
            /// behind an attempt that did not commit.
            async fn reconcile(app: App, op: UnknownOperation) -> Decision {
                let found: i64 = sqlx::query_scalar($by_operation)
                    .bind(op.operation_id.to_string())
                    .fetch_one(app.store.pool())
                    .await
                    .unwrap();
                if found == 0 {
                    Decision::NotApplied
                } else {
                    Decision::applied(StatusCode::CREATED)
                }
            }

            async fn order_status(
                lookup: idem::Lookup<create_order::Operation>,
                Path(key): Path<String>,
            ) -> idem::OperationStatus {
                lookup.status(&key).await
            }

            pub(super) struct Fixture {
                pub(super) server: TestServer,
                pub(super) app: App,
                _dir: Option<tempfile::TempDir>,
            }

            impl Fixture {
                pub(super) async fn new(max_stored_body: usize) -> Option<Fixture> {
                    let (store, dir): ($store, Option<tempfile::TempDir>) = $open.await?;
                    Some(Fixture::with_store(store, dir, max_stored_body, true).await)
                }

                /// The fixture over `store` (`dir` kept until it is dropped), with the
                /// default client budget or without one.
                pub(super) async fn with_store(
                    store: $store,
                    dir: Option<tempfile::TempDir>,
                    max_stored_body: usize,
                    budget: bool,
                ) -> Fixture {
                    sqlx::query(
                        "CREATE TABLE orders (operation_id TEXT PRIMARY KEY, key TEXT NOT NULL, amount BIGINT NOT NULL)",
                    )
                    .execute(store.pool())
                    .await
                    .unwrap();
                    // A heartbeat lease shorter than the attempt's 1 s, as in production
                    // (2 s against a 10 s per-attempt timeout).
                    let idem = Idem::transactional_builder(store.clone(), identity::header("x-client-id"))
                        .max_stored_body(max_stored_body)
                        .heartbeat(Duration::from_millis(600));
                    let idem = if budget { idem.build() } else { idem.without_client_budget().build() };
                    let app = App { store, hooks: Hooks::default() };
                    let router = Router::new()
                        .route("/orders", route_post(create_order))
                        .route("/orders/operations/{key}", get(order_status))
                        .with_state(app.clone())
                        .layer(idem.layer());
                    Fixture { server: TestServer::start(router).await, app, _dir: dir }
                }

                pub(super) async fn orders(&self) -> i64 {
                    sqlx::query_scalar($count)
                        .fetch_one(self.app.store.pool())
                        .await
                        .unwrap()
                }

                pub(super) async fn state(&self, key: &str) -> RecordState {
                    self.record_state(key).await.expect("a record")
                }

                /// The key's committed record's state; `None` when nothing is
                /// committed (an attempt rolled back leaves nothing: its record was in
                /// its transaction).
                pub(super) async fn record_state(&self, key: &str) -> Option<RecordState> {
                    let key = RecordKey::new("create_order", "client-a", key);
                    self.app.store.get(&key, unix_now()).await.unwrap().map(|r| r.state)
                }

                pub(super) fn runs(&self) -> usize {
                    self.app.hooks.runs.get()
                }
            }

            /// The order and the completed record commit together; the retry is the
            /// replay, with no second write.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_effect_and_its_record_commit_together() {
                let Some(f) = Fixture::new(1 << 20).await else { return };
                let first = post(&f.server, "k-ok", "ok").await;
                assert_eq!(first.status, 201, "{first:?}");
                assert_eq!(f.orders().await, 1);
                assert!(matches!(f.state("k-ok").await, RecordState::Completed { .. }));
                let replay = post(&f.server, "k-ok", "ok").await;
                assert!(replay.replayed());
                assert_eq!(replay.body, first.body);
                assert_eq!(replay.operation_id(), first.operation_id());
                assert_eq!((f.runs(), f.orders().await), (1, 1));
            }

            /// A retryable 503 after the write: rolled back, the key released, the
            /// answer as it is; the retry writes the one order.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_retryable_answer_after_the_write_rolls_it_back() {
                let Some(f) = Fixture::new(1 << 20).await else { return };
                let first = post(&f.server, "k-503", "503-after-write").await;
                assert_eq!((first.status, first.body.as_slice()), (503, &b"busy"[..]));
                assert_eq!(f.orders().await, 0, "nothing committed");
                assert_eq!(f.state("k-503").await, RecordState::Released);
                let retry = post(&f.server, "k-503", "ok").await;
                assert_eq!(retry.status, 201);
                assert!(!retry.replayed());
                assert_eq!(retry.operation_id(), first.operation_id());
                assert_eq!((f.runs(), f.orders().await), (2, 1));
            }

            /// A 500 after the write (the read-back failed): never stored as final;
            /// rolled back, released, answered as it is.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_server_error_after_the_write_rolls_it_back() {
                let Some(f) = Fixture::new(1 << 20).await else { return };
                let first = post(&f.server, "k-500", "500-after-write").await;
                assert_eq!(first.status, 500);
                assert_eq!(first.body, b"read-back failed");
                first.operation_id();
                assert_eq!(f.orders().await, 0);
                assert_eq!(f.state("k-500").await, RecordState::Released);
                let retry = post(&f.server, "k-500", "ok").await;
                assert_eq!(retry.status, 201);
                assert_eq!(f.orders().await, 1);
            }

            /// A permanent error commits with what the handler wrote: it is the
            /// operation's final answer, stored and replayed.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_permanent_error_is_final_and_commits() {
                let Some(f) = Fixture::new(1 << 20).await else { return };
                let first = post(&f.server, "k-422", "422-after-write").await;
                assert_eq!(first.status, 422);
                assert_eq!(f.orders().await, 1);
                let replay = post(&f.server, "k-422", "ok").await;
                assert!(replay.replayed());
                assert_eq!((replay.status, f.runs()), (422, 1));
            }

            /// A panic after the write: 503 `attempt-rolled-back`, state released, and
            /// the retry runs.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_panic_after_the_write_rolls_it_back() {
                let Some(f) = Fixture::new(1 << 20).await else { return };
                let first = post(&f.server, "k-panic", "panic-after-write").await;
                let problem = first.problem(503, "attempt-rolled-back");
                assert_eq!(problem["state"], "released");
                assert_eq!(problem["new_key_safe"], true);
                assert!(first.header("retry-after").is_some());
                assert_eq!(f.orders().await, 0);
                let retry = post(&f.server, "k-panic", "ok").await;
                assert_eq!(retry.status, 201);
                assert_eq!((f.runs(), f.orders().await), (2, 1));
            }

            /// A handler that outlives its time: stopped, rolled back, released within
            /// the lease, so that the retry runs at once, with no recovery.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_timed_out_attempt_rolls_back_and_releases() {
                let Some(f) = Fixture::new(1 << 20).await else { return };
                let first = post(&f.server, "k-slow", "slow").await;
                let problem = first.problem(503, "attempt-rolled-back");
                assert_eq!(problem["state"], "released", "{problem}");
                assert_eq!(f.orders().await, 0);
                assert_eq!(f.state("k-slow").await, RecordState::Released);
                let retry = post(&f.server, "k-slow", "ok").await;
                assert_eq!(retry.status, 201);
                assert_eq!(f.orders().await, 1);
            }

            /// The record's write inside the transaction is fenced: when the record
            /// is no longer this attempt's, the whole transaction rolls back, business
            /// write and record included. On SQLite its token changed inside the
            /// transaction, and the key is then released, as for any rolled-back
            /// attempt. On PostgreSQL, where a new key's record is written once at its
            /// completion, another owner's record was committed by another session (as
            /// when the lock's previous holder commits behind the lock statement's
            /// snapshot): that record stays, processing, and the answer says so.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_lost_lease_refuses_the_commit() {
                let Some(f) = Fixture::new(1 << 20).await else { return };
                let first = post(&f.server, "k-lost", "lose-lease-in-tx").await;
                let problem = first.problem(503, "attempt-rolled-back");
                assert_eq!(problem["state"], $lost_state);
                assert_eq!(f.orders().await, 0, "the business write rolled back with it");
                let state = f.state("k-lost").await;
                if $lost_elsewhere {
                    assert!(matches!(state, RecordState::Processing { .. }), "{state:?}");
                } else {
                    assert_eq!(state, RecordState::Released);
                }
            }

            /// A result whose body is larger than idem keeps commits with its record:
            /// the first answer is whole; a retry gets its status, its `Location`, and a
            /// problem body with the original's length and SHA-256. Nothing is parked.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_result_too_large_to_keep_is_a_known_outcome() {
                let Some(f) = Fixture::new(1024).await else { return };
                let first = post(&f.server, "k-big", "big").await;
                assert_eq!((first.status, first.body.len()), (201, 4096), "{first:?}");
                assert!(!first.replayed());
                assert_eq!(f.orders().await, 1, "the effect committed with its record");
                assert!(matches!(f.state("k-big").await, RecordState::Completed { .. }));
                let retry = post(&f.server, "k-big", "big").await;
                retry.body_not_kept(201, "x".repeat(4096).as_bytes());
                assert_eq!(retry.header("location"), Some("/orders/big"));
                assert_eq!(retry.operation_id(), first.operation_id());
                assert_eq!(f.orders().await, 1, "the retry ran nothing");
            }

            /// The same when the body fits the handle's limit but not the store's: what
            /// is kept of it is written in the same transaction, which commits.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_result_past_the_stores_limit_is_a_known_outcome() {
                let Some(f) = Fixture::new(4 << 20).await else { return };
                let first = post(&f.server, "k-huge", "huge").await;
                assert_eq!((first.status, first.body.len()), (201, 1 << 20), "{:?}", first.status);
                assert_eq!(f.orders().await, 1, "the effect committed with its record");
                let retry = post(&f.server, "k-huge", "huge").await;
                retry.body_not_kept(201, &first.body);
                assert_eq!(f.orders().await, 1, "the retry ran nothing");
            }

            /// An attempt that runs for longer than its heartbeat lease (600 ms) but within
            /// its time (1 s) commits; one that answers 503 then is rolled back and its key
            /// released, so that the retry runs at once.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_attempt_longer_than_its_heartbeat_lease_settles_normally() {
                let Some(f) = Fixture::new(1 << 20).await else { return };
                let first = post(&f.server, "k-long-ok", "sleep-700ms").await;
                assert_eq!(first.status, 201, "{first:?}");
                assert_eq!(f.orders().await, 1);
                let busy = post(&f.server, "k-long-503", "sleep-700ms-503").await;
                assert_eq!(busy.status, 503);
                assert_eq!(f.state("k-long-503").await, RecordState::Released);
                assert_eq!(f.orders().await, 1, "the 503's write rolled back");
                let retry = post(&f.server, "k-long-503", "ok").await;
                assert_eq!(retry.status, 201);
                assert_eq!(f.orders().await, 2);
            }

            /// While an attempt runs, its record is in its transaction, not committed:
            /// a duplicate is answered at once by the contract's `concurrency` (409 with
            /// the attempt's `Operation-Id`; were it waiting for the uncommitted row, it
            /// would wait for the attempt, which waits for this test), and the status
            /// lookup says `processing` under the same id. Then one commit: the order
            /// and its record.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_duplicate_of_a_running_attempt_is_answered_at_once() {
                let Some(f) = Fixture::new(1 << 20).await else { return };
                let hooks = f.app.hooks.clone();
                let request = tokio::spawn(send(
                    f.server.post("/orders", "k-open").json(&order("wait-for-takeover")),
                ));
                hooks.written.notified().await;
                let duplicate = post(&f.server, "k-open", "ok").await;
                duplicate.problem(409, "operation-in-progress");
                let status = send(f.server.get("/orders/operations/k-open")).await;
                assert_eq!(status.status, 200, "{status:?}");
                let report: Value = serde_json::from_slice(&status.body).unwrap();
                assert_eq!(report["state"], "processing", "{report}");
                assert_eq!(report["operation_id"], duplicate.operation_id().to_string());
                assert!(report["retry_after"].as_u64().is_some_and(|s| s >= 1), "{report}");
                assert_eq!(f.record_state("k-open").await, None, "nothing committed yet");
                hooks.resume.notify_one();
                let answer = request.await.unwrap();
                assert_eq!(answer.status, 201, "{answer:?}");
                assert_eq!(answer.operation_id(), duplicate.operation_id());
                assert!(matches!(f.state("k-open").await, RecordState::Completed { .. }));
                assert_eq!((f.runs(), f.orders().await), (1, 1));
            }

            /// Twenty concurrent requests with one key: one order, and every other
            /// answer is the replay or the concurrency answer.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_duplicates_write_one_order() {
                let Some(f) = Fixture::new(1 << 20).await else { return };
                let answers = futures_util::future::join_all(
                    (0..20).map(|_| post(&f.server, "k-race", "sleep-200ms")),
                )
                .await;
                let created = answers.iter().filter(|a| a.status == 201 && !a.replayed()).count();
                assert_eq!(created, 1, "{answers:?}");
                for answer in &answers {
                    match answer.status {
                        201 => {}
                        409 => {
                            answer.problem(409, "operation-in-progress");
                        }
                        other => panic!("unexpected {other}: {answer:?}"),
                    }
                }
                assert_eq!((f.runs(), f.orders().await), (1, 1));
            }
        }
    };
}

/// PostgreSQL: the completed record of the key `k-winner` copied under the key `$1`, as
/// the winner of a race would have committed it (the suite's fingerprint is the amount's,
/// the same for both keys).
const COPY_WINNER: &str = "INSERT INTO idem_records
        (operation, client, key, operation_id, fingerprint, state, attempt, token,
         lease_until, created_at, expires_at, status, headers, body, reason,
         stored_bytes, transactional)
    SELECT operation, client, $1, operation_id, fingerprint, state, attempt, token,
           lease_until, created_at, expires_at, status, headers, body, reason,
           stored_bytes, transactional
    FROM idem_records WHERE key = 'k-winner'";

/// PostgreSQL: an attempt that loses its record at the commit to a record completed for
/// its request (the race of `instant_duplicates_racing_the_commit_write_one_order_a_key`,
/// made to happen) rolls back its order and answers with the winner's answer, replayed,
/// rather than with 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_loses_to_a_completed_record_replays_it() {
    let Some(f) = on_postgres::Fixture::new(1 << 20).await else {
        return;
    };
    let winner = post(&f.server, "k-winner", "ok").await;
    assert_eq!(winner.status, 201, "{winner:?}");
    let loser = post(&f.server, "k-loser", "lose-to-completed").await;
    assert_eq!(loser.status, 201, "{loser:?}");
    assert!(loser.replayed(), "{loser:?}");
    assert_eq!(loser.operation_id(), winner.operation_id());
    assert_eq!(loser.body, winner.body);
    assert_eq!(f.orders().await, 1, "the loser's order rolled back");
}

/// A fresh SQLite file in a temporary folder.
async fn sqlite() -> Option<(idem::SqliteStore, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().unwrap();
    let store = idem::SqliteStore::open(dir.path().join("orders.db"))
        .await
        .unwrap();
    Some((store, Some(dir)))
}

/// A fresh schema of the test server, or `None` when it cannot be reached (a failure
/// under `CI=true`).
async fn postgres() -> Option<(idem::PostgresStore, Option<tempfile::TempDir>)> {
    let pool =
        idem_runtime::store::conformance::postgres::scratch_pool("transactional mode").await?;
    Some((idem::PostgresStore::from_pool(pool).await.unwrap(), None))
}

suite!(
    on_sqlite,
    tx = idem::SqliteTx,
    store = idem::SqliteStore,
    insert = "INSERT INTO orders (operation_id, key, amount) VALUES (?, ?, ?)",
    count = "SELECT COUNT(*) FROM orders",
    by_operation = "SELECT COUNT(*) FROM orders WHERE operation_id = ?",
    lose_lease_in_tx = "INSERT INTO idem_records
            (operation, client, key, operation_id, fingerprint, state, attempt, token,
             lease_until, created_at, expires_at, transactional)
        VALUES (?, ?, ?, '01a242fe-ebb4-745d-a58d-8442da8d42cf', 'sha256:other',
                'processing', 1, '0000000000000000000000000000abcd',
                CAST(unixepoch('subsec') * 1000 AS INTEGER) + 60000,
                CAST(unixepoch('subsec') * 1000 AS INTEGER),
                CAST(unixepoch('subsec') * 1000 AS INTEGER) + 3600000, 1)",
    lost_elsewhere = false,
    lost_state = "released",
    open = sqlite(),
);

suite!(
    on_postgres,
    tx = idem::PgTx,
    store = idem::PostgresStore,
    insert = "INSERT INTO orders (operation_id, key, amount) VALUES ($1, $2, $3)",
    count = "SELECT COUNT(*) FROM orders",
    by_operation = "SELECT COUNT(*) FROM orders WHERE operation_id = $1",
    lose_lease_in_tx = "INSERT INTO idem_records
            (operation, client, key, operation_id, fingerprint, state, attempt, token,
             lease_until, created_at, expires_at, transactional)
        VALUES ($1, $2, $3, '01a242fe-ebb4-745d-a58d-8442da8d42cf', 'sha256:other',
                'processing', 1, '0000000000000000000000000000abcd',
                (extract(epoch FROM now()) * 1000)::bigint + 60000,
                (extract(epoch FROM now()) * 1000)::bigint,
                (extract(epoch FROM now()) * 1000)::bigint + 3600000, true)",
    lost_elsewhere = true,
    lost_state = "processing",
    open = postgres(),
);

/// PostgreSQL, many instances: while an attempt's transaction is open, its record is
/// not committed (a new key's is not even written before its completion), so no other
/// session can see it, let alone take it over; the
/// key's advisory lock answers a duplicate at once (409 with the attempt's
/// `Operation-Id`), and the status lookup says `processing`. The attempt then commits
/// its order and its record together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_session_cannot_take_over_an_open_attempt() {
    let Some(f) = on_postgres::Fixture::new(1 << 20).await else {
        return;
    };
    let hooks = f.app.hooks.clone();
    let request = tokio::spawn(send(
        f.server
            .post("/orders", "k-taken")
            .json(&order("wait-for-takeover")),
    ));
    hooks.written.notified().await;
    let taken = sqlx::query(
        "UPDATE idem_records SET token = '0000000000000000000000000000beef', attempt = attempt + 1
         WHERE key = 'k-taken'",
    )
    .execute(f.app.store.pool())
    .await
    .unwrap();
    assert_eq!(taken.rows_affected(), 0, "no other session sees the record");
    let duplicate = send(f.server.post("/orders", "k-taken").json(&order("ok"))).await;
    duplicate.problem(409, "operation-in-progress");
    hooks.resume.notify_one();
    let answer = request.await.unwrap();
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(duplicate.operation_id(), answer.operation_id());
    assert_eq!(f.orders().await, 1);
}

/// PostgreSQL, duplicates of instant attempts racing: 30 keys, each sent 6 times at once,
/// where the lock's holder commits while the others take the lock. The statement that
/// takes the lock reads the key in a snapshot taken an instant before it; a duplicate
/// that takes the lock just after the holder's commit, behind that snapshot, runs too,
/// and its record's insert finds the holder's row: it rolls back whole and replays the
/// holder's answer (503 `attempt-rolled-back` if it could not read it). Whatever the
/// timing, one order a key, one fresh 201 a key, and every other answer the replay, the
/// concurrency answer or that 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instant_duplicates_racing_the_commit_write_one_order_a_key() {
    const KEYS: usize = 30;
    let Some(f) = on_postgres::Fixture::new(1 << 20).await else {
        return;
    };
    let mut rolled_back = 0;
    for k in 0..KEYS {
        let key = format!("k-burst-{k}");
        let answers =
            futures_util::future::join_all((0..6).map(|_| post(&f.server, &key, "ok"))).await;
        let fresh = answers
            .iter()
            .filter(|a| a.status == 201 && !a.replayed())
            .count();
        assert_eq!(fresh, 1, "{key}: {answers:?}");
        for answer in answers.iter().filter(|a| a.status != 201) {
            match answer.status {
                409 => {
                    answer.problem(409, "operation-in-progress");
                }
                503 => {
                    answer.problem(503, "attempt-rolled-back");
                    rolled_back += 1;
                }
                other => panic!("{key}: unexpected {other}: {answer:?}"),
            }
        }
    }
    assert_eq!(
        f.orders().await,
        i64::try_from(KEYS).unwrap(),
        "one order a key"
    );
    eprintln!(
        "{} handler runs for {KEYS} keys (each run past one a key lost the race and rolled back); {rolled_back} answered 503",
        f.runs()
    );
}

/// A handler that takes `Tx` behind a handle made with `Idem::new` (no transactional
/// store): 500 `not-configured` that says how to build it, and nothing is registered.
#[tokio::test]
async fn a_transaction_without_a_transactional_store_is_not_configured() {
    use axum::routing::post as route_post;
    let dir = tempfile::tempdir().unwrap();
    let store = idem::SqliteStore::open(dir.path().join("o.db"))
        .await
        .unwrap();
    let idem = idem::Idem::new(store.clone(), idem::identity::header("x-client-id"));
    let router = axum::Router::new()
        .route("/orders", route_post(|_tx: idem::SqliteTx| async { "ran" }))
        .layer(idem.layer());
    let server = TestServer::start(router).await;
    let answer = post(&server, "k", "ok").await;
    let problem = answer.problem(500, "not-configured");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("Idem::transactional"),
        "{problem}"
    );
}

/// `Tx` in a handler without a contract: there is no transaction, and writing fails
/// rather than writing outside one.
#[tokio::test]
async fn a_transaction_outside_a_contract_cannot_be_written() {
    use axum::routing::post as route_post;
    let dir = tempfile::tempdir().unwrap();
    let store = idem::SqliteStore::open(dir.path().join("o.db"))
        .await
        .unwrap();
    let idem = idem::Idem::transactional(store, idem::identity::header("x-client-id"));
    let router = axum::Router::new()
        .route(
            "/plain",
            route_post(|tx: idem::SqliteTx| async move {
                match tx.conn().await {
                    Ok(_) => "a connection".to_owned(),
                    Err(error) => error.to_string(),
                }
            }),
        )
        .layer(idem.layer());
    let server = TestServer::start(router).await;
    let answer = send(client().post(server.url("/plain"))).await;
    assert_eq!(answer.status, 200);
    assert!(
        String::from_utf8_lossy(&answer.body)
            .contains("only for handlers under `#[idem::contract]`"),
        "{answer:?}"
    );
}

/// `recovery = manual(..)` in the transactional mode: the process dies mid-attempt (its
/// runtime is dropped, so nothing commits); on restart, once the lease is over, the
/// operation is not parked for an operator (nothing it wrote was committed) but runs
/// again, and writes the one order.
mod manual_recovery {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::time::{Duration, Instant};

    use axum::extract::{Path, State};
    use axum::http::StatusCode;
    use axum::routing::{get, post};
    use axum::{Json, Router};

    use super::common::process;
    use super::{TestServer, post as post_order};

    static RUNS: AtomicUsize = AtomicUsize::new(0);

    #[derive(serde::Deserialize)]
    struct CreateOrder {
        amount: i64,
        #[serde(default)]
        mode: String,
    }

    #[idem::contract(
        key_scope = client,
        fingerprint = [amount],
        ttl = "1h",
        deadline = ("30s", per_attempt = "1s"),
        max_attempts = 4,
        retryable = [503],
        concurrency = conflict,
        status_lookup = status,
        recovery = manual("https://runbooks.example.com/orders"),
    )]
    async fn create(
        attempt: idem::Attempt,
        tx: idem::SqliteTx,
        State(()): State<()>,
        Json(order): Json<CreateOrder>,
    ) -> StatusCode {
        RUNS.fetch_add(1, SeqCst);
        let mut conn = tx.conn().await.unwrap();
        sqlx::query("INSERT INTO orders (operation_id, key, amount) VALUES (?, ?, ?)")
            .bind(attempt.operation_id.to_string())
            .bind(&attempt.key)
            .bind(order.amount)
            .execute(&mut *conn)
            .await
            .unwrap();
        drop(conn);
        if order.mode == "hang" {
            // The process dies here, with the order written and not committed.
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        StatusCode::CREATED
    }

    async fn status(
        lookup: idem::Lookup<create::Operation>,
        Path(key): Path<String>,
    ) -> idem::OperationStatus {
        lookup.status(&key).await
    }

    async fn start(path: &std::path::Path) -> (TestServer, idem::SqliteStore) {
        let store = idem::SqliteStore::open(path).await.unwrap();
        sqlx::query("CREATE TABLE IF NOT EXISTS orders (operation_id TEXT PRIMARY KEY, key TEXT NOT NULL, amount BIGINT NOT NULL)")
            .execute(store.pool())
            .await
            .unwrap();
        let idem = idem::Idem::transactional(store.clone(), idem::identity::header("x-client-id"));
        let router = Router::new()
            .route("/orders", post(create))
            .route("/orders/operations/{key}", get(status))
            .with_state(())
            .layer(idem.layer());
        (TestServer::start(router).await, store)
    }

    #[test]
    fn a_dead_transactional_attempt_is_not_parked_but_run_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orders.db");
        let doomed = process::runtime();
        let started = doomed.block_on(async {
            let (server, _store) = start(&path).await;
            let request = server
                .post("/orders", "k-dead")
                .json(&serde_json::json!({ "amount": 100, "mode": "hang" }));
            tokio::spawn(async move {
                let _ = request.send().await;
            });
            process::wait_until(|| RUNS.load(SeqCst) > 0).await;
            assert_eq!(RUNS.load(SeqCst), 1, "the attempt is in flight");
            std::mem::forget(server); // the process dies: no graceful shutdown
            Instant::now()
        });
        doomed.shutdown_background();

        process::runtime().block_on(async {
            let (server, store) = start(&path).await;
            tokio::time::sleep(Duration::from_millis(1100).saturating_sub(started.elapsed())).await;
            let retry = post_order(&server, "k-dead", "ok").await;
            assert_eq!(retry.status, 201, "{retry:?}");
            assert!(!retry.replayed(), "not applied: the retry ran");
            let orders: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders")
                .fetch_one(store.pool())
                .await
                .unwrap();
            assert_eq!(orders, 1, "the dead attempt's order was rolled back");
        });
        assert_eq!(RUNS.load(SeqCst), 2);
    }
}

/// One commit per new key on PostgreSQL, counted by the server: `pg_stat_database`'s
/// `xact_commit` of a database only this test uses. Every transaction counts there, a
/// lone read included: a new key is one transaction, which reads the key's record with
/// its lock, registers the key, writes the order and completes the record, where there
/// used to be a read and two commits, then a read and one commit. A session reports its counts when idle for a
/// while or when it ends, so each phase closes its pool before the count. Two phases in
/// two fresh schemas: the setup alone (the schema, the store's migrations, the orders
/// table, the server), then the same setup and 200 new keys sent one after another; the
/// difference is the requests' own transactions, and the one read of the orders at the
/// end. Without a client budget: its count of what a client holds is a read of its own,
/// once per allowance (every 8 new keys of a client with the default budget and
/// stored-body limit), which `pg_stat_database` counts as a transaction too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_commits_once_per_new_key() {
    use std::str::FromStr;

    use idem_runtime::store::conformance::postgres;
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

    const REQUESTS: usize = 200;
    if postgres::scratch_pool("commits per request")
        .await
        .is_none()
    {
        return;
    }
    let admin = sqlx::PgPool::connect(&postgres::url()).await.unwrap();
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    let name = format!("idem_commits_{}_{micros}", std::process::id());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin)
        .await
        .unwrap();
    let options = PgConnectOptions::from_str(&postgres::url())
        .unwrap()
        .database(&name);
    let commits = || async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let n: i64 =
            sqlx::query_scalar("SELECT xact_commit FROM pg_stat_database WHERE datname = $1")
                .bind(&name)
                .fetch_one(&admin)
                .await
                .unwrap();
        n
    };
    let phase = |requests: usize, schema: &'static str| {
        let options = options.clone().options([("search_path", schema)]);
        async move {
            let pool = PgPoolOptions::new()
                .max_connections(8)
                .connect_with(options)
                .await
                .unwrap();
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
                .execute(&pool)
                .await
                .unwrap();
            let store = idem::PostgresStore::from_pool(pool.clone()).await.unwrap();
            let f = on_postgres::Fixture::with_store(store, None, 1 << 20, false).await;
            for i in 0..requests {
                let answer = post(&f.server, &format!("k-commit-{i}"), "ok").await;
                assert_eq!(answer.status, 201, "{answer:?}");
            }
            assert_eq!(f.orders().await, i64::try_from(requests).unwrap());
            drop(f);
            pool.close().await;
        }
    };
    let start = commits().await;
    phase(0, "setup_only").await;
    let setup = commits().await - start;
    phase(REQUESTS, "with_requests").await;
    let with_requests = commits().await - start - setup;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {name} WITH (FORCE)"
    )))
    .execute(&admin)
    .await
    .unwrap();
    #[allow(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    let per_request = (with_requests - setup) as f64 / REQUESTS as f64;
    assert!(
        (0.98..=1.05).contains(&per_request),
        "{per_request:.3} transactions per new key, expected the one commit ({with_requests} with the requests, {setup} for the setup alone)"
    );
}
