//! The Redis store under a load while its server dies and comes back: a Redis server of
//! the test's own (never the shared one on 6379), with `appendonly yes` and `appendfsync
//! always`, killed with SIGKILL in the middle of the load and started again on the same
//! port and files.
//!
//! While it is down every answer is 503 with `Retry-After` and no handler runs. Once it is
//! back, requests succeed again within seconds without restarting the service; every key
//! that got its result before the outage still replays it (nothing completed is lost); a
//! key whose attempt was cut by the outage is decided by recovery (the reconcile function
//! finds its effect by the operation id); and no key has more than one effect.

mod common;

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use common::answer::{Answer, send};
use common::server::TestServer;

/// The business data: the effect count of every idempotency key, and the order each
/// operation made (what the reconcile function reads).
#[derive(Clone, Default)]
struct Books {
    effects: Arc<Mutex<HashMap<String, u32>>>,
    orders: Arc<Mutex<HashMap<String, u64>>>,
}

#[derive(Deserialize)]
struct CreateOrder {
    amount: u64,
}

fn created(amount: u64) -> Response {
    (StatusCode::CREATED, Json(json!({ "amount": amount }))).into_response()
}

#[idem::contract(
    key_scope = client,
    fingerprint = [amount],
    ttl = "1h",
    deadline = ("20s", per_attempt = "2s"),
    max_attempts = 10,
    retryable = [503, timeout],
    concurrency = conflict,
    status_lookup = order_status(path = "/orders/operations/{key}"),
    recovery = reconcile_order,
)]
async fn create_order(
    State(books): State<Books>,
    attempt: idem::Attempt,
    Json(order): Json<CreateOrder>,
) -> Response {
    *books
        .effects
        .lock()
        .unwrap()
        .entry(attempt.key.clone())
        .or_default() += 1;
    books
        .orders
        .lock()
        .unwrap()
        .insert(attempt.operation_id.to_string(), order.amount);
    created(order.amount)
}

async fn order_status(
    lookup: idem::Lookup<create_order::Operation>,
    UrlPath(key): UrlPath<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

async fn reconcile_order(books: Books, op: idem::UnknownOperation) -> idem::Resolution {
    let order = books
        .orders
        .lock()
        .unwrap()
        .get(&op.operation_id.to_string())
        .copied();
    match order {
        Some(amount) => idem::Resolution::applied(created(amount)),
        None => idem::Resolution::NotApplied,
    }
}

/// `redis-server` on the PATH or where Debian puts it.
fn redis_server() -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
        .map(|dir| dir.join("redis-server"))
        .find(|path| path.is_file())
}

/// A Redis server of the test's own; killed (SIGKILL) when dropped.
struct OwnRedis {
    binary: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl OwnRedis {
    fn start(binary: PathBuf, dir: &Path) -> OwnRedis {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let mut redis = OwnRedis {
            binary,
            dir: dir.to_path_buf(),
            port,
            child: None,
        };
        redis.restart();
        redis
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts the server on its port and files, and waits until it accepts connections.
    fn restart(&mut self) {
        let child = Command::new(&self.binary)
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .args(["--maxmemory-policy", "noeviction", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < until, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, and waits for the process to be gone.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `POST /orders` with `key`, as client `client-a`.
async fn order(server: &TestServer, key: &str, amount: u64) -> Answer {
    send(
        server
            .post("/orders", key)
            .json(&json!({ "amount": amount })),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_of_redis_under_load_fails_closed_and_loses_nothing() {
    let Some(binary) = redis_server() else {
        assert!(
            !idem_runtime::store::conformance::skips_fail(),
            "redis-server is not installed; under CI=true a skipped store test is a failure"
        );
        eprintln!("skipped: redis-server is not installed (apt-get install redis-server)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut redis = OwnRedis::start(binary, dir.path());
    let store = idem::RedisStore::connect(&redis.url())
        .await
        .expect("connect to the test's own Redis")
        .with_call_timeout(Duration::from_millis(500));
    let idem = idem::Idem::new(store, idem::identity::header("x-client-id"))
        .with_unavailable_retry_after(Duration::from_secs(1));
    let books = Books::default();
    let router = Router::new()
        .route("/orders", post(create_order))
        .route("/orders/operations/{key}", get(order_status))
        .with_state(books.clone())
        .layer(idem.layer());
    let server = Arc::new(TestServer::start(router).await);

    // The load: 8 clients, each sending new keys one after another, until told to stop.
    let answers: Arc<Mutex<Vec<(String, Answer, Instant)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..8 {
        let (server, answers, stop) = (server.clone(), answers.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && n < 2_000 {
                let key = format!("k-{c}-{n}");
                let answer = order(&server, &key, n).await;
                answers.lock().unwrap().push((key, answer, Instant::now()));
                n += 1;
            }
        }));
    }

    tokio::time::sleep(Duration::from_millis(800)).await;
    redis.kill();
    let killed = Instant::now();
    // Requests in flight at the kill may still have run; from here on none may.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let effects_down = books.effects.lock().unwrap().values().sum::<u32>();
    let down_from = Instant::now();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let down_until = Instant::now();
    assert_eq!(
        books.effects.lock().unwrap().values().sum::<u32>(),
        effects_down,
        "no handler runs while the store is down"
    );
    redis.restart();
    let restarted = Instant::now();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for client in clients {
        client.await.unwrap();
    }

    let answers = answers.lock().unwrap().clone();
    let before: Vec<_> = answers.iter().filter(|(_, _, at)| *at < killed).collect();
    let during: Vec<_> = answers
        .iter()
        .filter(|(_, _, at)| *at > down_from && *at < down_until)
        .collect();
    assert!(
        before.iter().filter(|(_, a, _)| a.status == 201).count() >= 20,
        "the load ran before the outage"
    );
    assert!(during.len() >= 8, "the load ran during the outage");
    for (key, answer, _) in &during {
        assert_eq!(answer.status, 503, "{key} while Redis is down: {answer:?}");
        assert!(
            answer.header("retry-after").is_some(),
            "{key}: a 503 says when to retry"
        );
        assert_eq!(answer.slug(), "store-unavailable", "{key}");
    }
    eprintln!(
        "{} answers: {} before the kill ({} of them 201), {} while down, {} not final",
        answers.len(),
        before.len(),
        before.iter().filter(|(_, a, _)| a.status == 201).count(),
        during.len(),
        answers.iter().filter(|(_, a, _)| a.status != 201).count(),
    );
    // Back within seconds, without restarting the service.
    let first_after = answers
        .iter()
        .filter(|(_, a, at)| *at > restarted && a.status == 201)
        .map(|(_, _, at)| *at)
        .min()
        .expect("requests succeed again once Redis is back");
    assert!(
        first_after.duration_since(restarted) < Duration::from_secs(5),
        "traffic resumed {:?} after Redis came back",
        first_after.duration_since(restarted)
    );

    // Every key that got its result still replays it: nothing completed was lost.
    let completed: HashMap<&str, &Answer> = answers
        .iter()
        .filter(|(_, a, _)| a.status == 201)
        .map(|(k, a, _)| (k.as_str(), a))
        .collect();
    for (key, answer, _) in answers.iter().filter(|(_, a, _)| a.status == 201) {
        let n: u64 = key.rsplit('-').next().unwrap().parse().unwrap();
        let again = order(&server, key, n).await;
        assert_eq!(again.status, 201, "{key} after the outage: {again:?}");
        assert!(again.replayed(), "{key} is replayed, not run again");
        assert_eq!(again.body, answer.body, "{key}");
        assert_eq!(again.operation_id(), answer.operation_id(), "{key}");
    }
    // Every key cut by the outage ends with one answer, decided by recovery where its
    // effect was made: retried as a client would, until final.
    let deadline = Instant::now() + Duration::from_secs(30);
    for (key, _, _) in answers
        .iter()
        .filter(|(k, _, _)| !completed.contains_key(k.as_str()))
    {
        let n: u64 = key.rsplit('-').next().unwrap().parse().unwrap();
        loop {
            let answer = order(&server, key, n).await;
            if answer.status == 201 {
                break;
            }
            assert!(
                matches!(answer.status, 409 | 503),
                "{key}: only the concurrency answer or a retryable 503 before the result: {answer:?}"
            );
            assert!(Instant::now() < deadline, "{key} was never decided");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let effects = books.effects.lock().unwrap().clone();
    for (key, _, _) in &answers {
        assert_eq!(
            effects.get(key).copied().unwrap_or(0),
            1,
            "{key}: exactly one effect"
        );
    }
}
