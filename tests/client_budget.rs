//! The per-client store budget over real sockets, on every store: a new key from a client
//! at its budget is refused before the handler runs with 429 `client-budget-exhausted`
//! and a `Retry-After` at its oldest record's expiry; keys it already holds are still
//! answered; another client is untouched. A client's usage is counted once at a time,
//! and ahead of its allowance's end in the background.

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::middleware::Next;
use axum::routing::{get, post};
use idem::store::{ClientBudget, Store};
use idem::{Idem, MemoryStore, identity};
use idem_runtime::store::conformance::postgres::scratch_url;
use idem_runtime::store::conformance::redis::{scratch_store, url_or_skip};
use idem_runtime::store::{ClientUsage, StoreError, UnixMillis};
use idem_runtime::store::{PostgresStore, SqliteStore};
use reqwest::Method;
use serde_json::json;

use common::answer::{Answer, send};
use common::counter::Counter;
use common::faults::{Call, FaultyStore};
use common::orders::{create_order, order_status};
use common::process::wait_until;
use common::server::TestServer;

async fn order(server: &TestServer, client: &str, key: &str) -> Answer {
    let body = json!({ "customer_id": "c-1", "amount": 100 });
    send(
        server
            .request(Method::POST, "/orders", client, Some(key))
            .json(&body),
    )
    .await
}

/// The orders service on `store` under `budget`, and the count of its handler's runs.
async fn serve(store: impl Store, budget: ClientBudget) -> (TestServer, Counter) {
    let idem = Idem::builder(store, identity::header("x-client-id"))
        .client_budget(budget)
        .build();
    serve_with(&idem).await
}

/// The orders service under `idem`, each request inside [`REQUEST`], and the count of its
/// handler's runs.
async fn serve_with(idem: &Idem) -> (TestServer, Counter) {
    let runs = Counter::default();
    let router = Router::new()
        .route("/orders", post(create_order))
        .route("/orders/operations/{key}", get(order_status))
        .with_state(runs.clone())
        .layer(idem.layer())
        .layer(axum::middleware::from_fn(in_request));
    (TestServer::start(router).await, runs)
}

/// A budget of 3 records on `store`: client-a's fourth new key is refused, its held keys
/// are replayed, and client-b gets all of its own.
async fn budget_of_three(store: impl Store) {
    let budget = ClientBudget {
        records: 3,
        bytes: 1 << 20,
    };
    let (server, runs) = serve(store, budget).await;
    for key in ["k-1", "k-2", "k-3"] {
        assert_eq!(order(&server, "client-a", key).await.status, 201, "{key}");
    }
    let refused = order(&server, "client-a", "k-4").await;
    let problem = refused.problem(429, "client-budget-exhausted");
    assert_eq!(problem["new_key_safe"], true);
    let retry_after: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    // The oldest key's expiry, 1 h away; the Redis store's, up to its bucket's end.
    let slack = idem::store::budget::COUNT_SLACK_MS / 1000;
    assert!(
        (3000..=3600 + slack).contains(&retry_after),
        "the oldest key's expiry, 1 h: {retry_after}"
    );
    assert_eq!(runs.get(), 3, "the refused key ran nothing");

    let replay = order(&server, "client-a", "k-1").await;
    assert!(replay.replayed() && replay.status == 201, "{replay:?}");
    for key in ["k-1", "k-2", "k-3"] {
        assert_eq!(
            order(&server, "client-b", key).await.status,
            201,
            "client-b {key}"
        );
    }
    assert_eq!(runs.get(), 6);
    server.stop().await;
}

#[tokio::test]
async fn memory() {
    budget_of_three(Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn sqlite() {
    let dir = tempfile::tempdir().unwrap();
    budget_of_three(SqliteStore::open(dir.path().join("idem.db")).await.unwrap()).await;
}

#[tokio::test]
async fn postgres() {
    let Some(url) = scratch_url("the client budget on PostgreSQL").await else {
        return;
    };
    budget_of_three(PostgresStore::connect(&url).await.unwrap()).await;
}

#[tokio::test]
async fn redis() {
    let Some(url) = url_or_skip("the client budget on Redis").await else {
        return;
    };
    budget_of_three(scratch_store(&url).await).await;
}

/// A store that counts the client counts ([`RecordStore::client_usage`]) asked of the
/// store it wraps: all of them, those asked by a request itself (inside [`REQUEST`]),
/// and those finished; each takes `delay` first.
struct CountsUsage<S> {
    inner: S,
    counts: Counter,
    by_requests: Counter,
    finished: Counter,
    delay: Duration,
}

impl<S> CountsUsage<S> {
    fn new(inner: S, counts: &Counter) -> CountsUsage<S> {
        CountsUsage {
            inner,
            counts: counts.clone(),
            by_requests: Counter::default(),
            finished: Counter::default(),
            delay: Duration::ZERO,
        }
    }
}

tokio::task_local! {
    /// Set around each request the test server answers: a count asked inside it is a
    /// request's own, one asked outside it a task's in the background.
    static REQUEST: ();
}

/// Runs each request inside [`REQUEST`].
async fn in_request(request: axum::extract::Request, next: Next) -> axum::response::Response {
    REQUEST.scope((), next.run(request)).await
}

idem_runtime::forward_store! {
    impl[S: Store] RecordStore for CountsUsage<S> {
        forward |this| &this.inner;

        async fn client_usage(
            &self,
            client: &str,
            cap: u64,
            now: UnixMillis,
        ) -> Result<ClientUsage, StoreError> {
            self.counts.bump();
            if REQUEST.try_with(|()| ()).is_ok() {
                self.by_requests.bump();
            }
            tokio::time::sleep(self.delay).await;
            let usage = self.inner.client_usage(client, cap, now).await;
            self.finished.bump();
            usage
        }
    }
    impl[S: Store] OperatorStore for CountsUsage<S> {
        forward |this| &this.inner;
    }
}

/// A replay spends no new key of the client's allowance: under a budget of 32 records
/// (an allowance of 2 keys a count), 20 replays of one key bring on no count; new keys
/// still do, every 2. On a store that answers replays at registration (SQLite, Redis),
/// where a replay used to spend a key like a new one.
async fn replays_spend_no_allowance(store: impl Store) {
    let counts = Counter::default();
    let store = CountsUsage::new(store, &counts);
    let (server, runs) = serve(store, ClientBudget::new(32, 1 << 30)).await;
    assert_eq!(order(&server, "client-a", "k-1").await.status, 201);
    assert_eq!(counts.get(), 1, "the first new key counts");
    for _ in 0..20 {
        let replay = order(&server, "client-a", "k-1").await;
        assert!(replay.replayed() && replay.status == 201, "{replay:?}");
    }
    assert_eq!(counts.get(), 1, "20 replays, no count");
    assert_eq!(order(&server, "client-a", "k-2").await.status, 201);
    // The allowance's last key: counted again, in the background (or by k-3, waiting).
    assert_eq!(order(&server, "client-a", "k-3").await.status, 201);
    assert_eq!(counts.get(), 2, "spent: counted again, once");
    assert_eq!(runs.get(), 3);
    server.stop().await;
}

#[tokio::test]
async fn sqlite_replays_spend_no_allowance() {
    let dir = tempfile::tempdir().unwrap();
    replays_spend_no_allowance(SqliteStore::open(dir.path().join("idem.db")).await.unwrap()).await;
}

#[tokio::test]
async fn redis_replays_spend_no_allowance() {
    let Some(url) = url_or_skip("replays and the client's allowance on Redis").await else {
        return;
    };
    replays_spend_no_allowance(scratch_store(&url).await).await;
}

/// Under the default budget (16 MiB of results) with results of up to 1 MiB kept, a
/// client's new keys whose results are small are counted once, not every 7: each key
/// holds the largest result's bytes of the allowance only until its own result is built,
/// and gives back what that result does not take.
async fn small_results_give_their_bytes_back(store: impl Store) {
    let counts = Counter::default();
    let store = CountsUsage::new(store, &counts);
    let idem = Idem::builder(store, identity::header("x-client-id"))
        .client_budget(ClientBudget::DEFAULT)
        .max_stored_body(1 << 20)
        .build();
    let (server, runs) = serve_with(&idem).await;
    for key in 0..60 {
        let answer = order(&server, "client-a", &format!("k-{key}")).await;
        assert_eq!(answer.status, 201, "{answer:?}");
    }
    assert_eq!(runs.get(), 60);
    assert_eq!(
        counts.get(),
        1,
        "60 small results under an allowance of 625 keys: one count (8 MiB of results \
         over 1 MiB a key used to grant 7 keys a count)"
    );
    server.stop().await;
}

#[tokio::test]
async fn memory_small_results_give_their_bytes_back() {
    small_results_give_their_bytes_back(MemoryStore::new()).await;
}

#[tokio::test]
async fn sqlite_small_results_give_their_bytes_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
    small_results_give_their_bytes_back(store).await;
}

#[tokio::test]
async fn redis_small_results_give_their_bytes_back() {
    let Some(url) = url_or_skip("the allowance's bytes on Redis").await else {
        return;
    };
    small_results_give_their_bytes_back(scratch_store(&url).await).await;
}

/// 16 new keys of one client at once, none counted before, under the default budget
/// (625 keys a count): the store counts the client once, and the other 15 wait for that
/// count instead of scanning the client's records each.
async fn a_client_is_counted_once_at_a_time(store: impl Store) {
    let counts = Counter::default();
    let store = Arc::new(CountsUsage {
        delay: Duration::from_millis(100),
        ..CountsUsage::new(store, &counts)
    });
    let server = serve(Arc::clone(&store), ClientBudget::DEFAULT).await.0;
    let serving = &server;
    let orders =
        (0..16).map(|key| async move { order(serving, "client-a", &format!("k-{key}")).await });
    for answer in futures_util::future::join_all(orders).await {
        assert_eq!(answer.status, 201, "{answer:?}");
    }
    assert_eq!(counts.get(), 1, "one count for 16 keys in flight");
    server.stop().await;
}

#[tokio::test]
async fn memory_a_client_is_counted_once_at_a_time() {
    a_client_is_counted_once_at_a_time(MemoryStore::new()).await;
}

#[tokio::test]
async fn postgres_a_client_is_counted_once_at_a_time() {
    let Some(url) = scratch_url("one count at a time on PostgreSQL").await else {
        return;
    };
    a_client_is_counted_once_at_a_time(PostgresStore::connect(&url).await.unwrap()).await;
}

/// 60 new keys of one client, one after another, under a budget of 256 records (16 keys
/// a count, counted again with 4 left): only the first request counts; every later count
/// runs in the background while the client's requests spend what is left.
async fn the_count_comes_ahead_of_the_allowances_end(store: impl Store) {
    let counts = Counter::default();
    let store = Arc::new(CountsUsage::new(store, &counts));
    let server = serve(Arc::clone(&store), ClientBudget::new(256, 1 << 30))
        .await
        .0;
    for key in 0..60 {
        let answer = order(&server, "client-a", &format!("k-{key}")).await;
        assert_eq!(answer.status, 201, "k-{key}: {answer:?}");
        // A count begun in the background ends before the next key is sent.
        tokio::time::timeout(Duration::from_secs(10), async {
            while store.finished.get() < store.counts.get() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the count in the background ends");
    }
    assert_eq!(
        store.by_requests.get(),
        1,
        "only the first key waited for a count"
    );
    assert!(
        counts.get() >= 4,
        "counted again as keys were spent: {}",
        counts.get()
    );
    server.stop().await;
}

#[tokio::test]
async fn memory_the_count_comes_ahead_of_the_allowances_end() {
    the_count_comes_ahead_of_the_allowances_end(MemoryStore::new()).await;
}

#[tokio::test]
async fn sqlite_the_count_comes_ahead_of_the_allowances_end() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
    the_count_comes_ahead_of_the_allowances_end(store).await;
}

/// While the store fails to count (`client_usage` only), a client's counts ahead fail in
/// the background and its requests still spend what is left of the allowance, and only
/// then are answered 503 `store-unavailable`, each time: a failed count is not kept, nor
/// shared with a later request. Once the store counts again, so does the client.
#[tokio::test]
async fn memory_a_failed_count_is_not_kept() {
    let store = FaultyStore::memory();
    // 16 keys a count, counted again ahead with 2 to 6 left.
    let (server, runs) = serve(store.clone(), ClientBudget::new(256, 1 << 30)).await;
    assert_eq!(order(&server, "client-a", "k-0").await.status, 201);
    store.fail(Call::ClientUsage);
    for key in 1..16 {
        let answer = order(&server, "client-a", &format!("k-{key}")).await;
        assert_eq!(answer.status, 201, "k-{key}, of the allowance: {answer:?}");
    }
    // The count ahead, begun at the allowance's point (2 to 6 keys left), has failed.
    wait_until(|| store.calls(Call::ClientUsage) > 1).await;
    assert!(store.calls(Call::ClientUsage) > 1, "counted ahead");
    for key in 16..19 {
        let answer = order(&server, "client-a", &format!("k-{key}")).await;
        answer.problem(503, "store-unavailable");
    }
    store.heal(Call::ClientUsage);
    for key in 16..19 {
        let answer = order(&server, "client-a", &format!("k-{key}")).await;
        assert_eq!(answer.status, 201, "k-{key}, counted again: {answer:?}");
    }
    assert_eq!(runs.get(), 19);
    server.stop().await;
}

/// 200 new keys of one client at once under a budget of 20 records (2 keys a count at
/// first): every request that found the allowance spent used to count the client itself
/// and install an allowance of its own, and 132 (PostgreSQL) to 168 (SQLite) records were
/// created. Counted once at a time, what passes the budget is the store's own overshoot by
/// the requests in flight and the last allowance's keys (1–8 seen): at most 40 here.
async fn many_keys_at_once_stay_near_the_budget(store: impl Store) {
    let (server, runs) = serve(store, ClientBudget::new(20, 1 << 30)).await;
    let serving = &server;
    let orders =
        (0..200).map(|key| async move { order(serving, "client-a", &format!("k-{key}")).await });
    let mut created = 0;
    for answer in futures_util::future::join_all(orders).await {
        match answer.status {
            201 => created += 1,
            _ => drop(answer.problem(429, "client-budget-exhausted")),
        }
    }
    assert!(
        (20..=40).contains(&created),
        "{created} records under a budget of 20"
    );
    assert_eq!(runs.get(), created);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_many_keys_at_once_stay_near_the_budget() {
    many_keys_at_once_stay_near_the_budget(MemoryStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_many_keys_at_once_stay_near_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
    many_keys_at_once_stay_near_the_budget(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_many_keys_at_once_stay_near_the_budget() {
    let Some(url) = scratch_url("many keys at once under a budget on PostgreSQL").await else {
        return;
    };
    many_keys_at_once_stay_near_the_budget(PostgresStore::connect(&url).await.unwrap()).await;
}
