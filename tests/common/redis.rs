//! A Redis server of the test's own (a free port of 127.0.0.1, killed when dropped,
//! never the shared one on 6379), and an orders service on the Redis store whose handler
//! counts its effects per key and runs hooks between the effect and the answer.

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::PathBuf;
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

use super::answer::{Answer, send};
use super::server::TestServer;

/// `redis-server` on the PATH or where Debian puts it; `None` (after saying so) when it is
/// not installed, a failure under `CI=true`.
pub fn redis_server() -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
        .map(|dir| dir.join("redis-server"))
        .find(|path| path.is_file());
    if found.is_none() {
        assert!(
            !idem_runtime::store::conformance::skips_fail(),
            "redis-server is not installed; under CI=true a skipped store test is a failure"
        );
        eprintln!("skipped: redis-server is not installed (apt-get install redis-server)");
    }
    found
}

/// A Redis server of the test's own, without persistence unless `args` say otherwise;
/// killed (SIGKILL) when dropped.
pub struct OwnRedis {
    binary: PathBuf,
    pub port: u16,
    args: Vec<String>,
    _dir: tempfile::TempDir,
    child: Option<Child>,
}

impl OwnRedis {
    pub fn start(binary: &std::path::Path, args: &[&str]) -> OwnRedis {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let mut redis = OwnRedis {
            binary: binary.to_path_buf(),
            port,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            _dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        redis.restart();
        redis
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts the server again on its port and files, and waits until it accepts
    /// connections.
    pub fn restart(&mut self) {
        let child = Command::new(&self.binary)
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(self._dir.path())
            .args(&self.args)
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
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A connection of the test's own (not the store's), with `auth` as the password.
    pub async fn admin(&self, auth: Option<&str>) -> redis::aio::MultiplexedConnection {
        let url = match auth {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => self.url(),
        };
        redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("an admin connection")
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What a hook does inside the handler, after the effect and before the answer.
pub type Hook = Arc<dyn Fn() -> futures_util::future::BoxFuture<'static, ()> + Send + Sync>;

#[derive(Clone, Default)]
pub struct Books {
    pub effects: Arc<Mutex<HashMap<String, u32>>>,
    pub orders: Arc<Mutex<HashMap<String, u64>>>,
    hooks: Arc<Mutex<HashMap<String, Hook>>>,
}

impl Books {
    pub fn effects(&self, key: &str) -> u32 {
        self.effects.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    pub fn hook(&self, key: &str, hook: Hook) {
        self.hooks.lock().unwrap().insert(key.to_owned(), hook);
    }
}

#[derive(Deserialize)]
pub struct CreateOrder {
    pub amount: u64,
}

pub fn created(amount: u64) -> Response {
    (StatusCode::CREATED, Json(json!({ "amount": amount }))).into_response()
}

#[idem::contract(
    key_scope = client,
    fingerprint = [amount],
    ttl = "1h",
    deadline = ("20s", per_attempt = "5s"),
    max_attempts = 10,
    retryable = [503, timeout],
    concurrency = conflict,
    status_lookup = order_status(path = "/orders/operations/{key}"),
    recovery = reconcile_order,
)]
pub async fn create_order(
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
    let hook = books.hooks.lock().unwrap().remove(&attempt.key);
    if let Some(hook) = hook {
        hook().await;
    }
    created(order.amount)
}

pub async fn order_status(
    lookup: idem::Lookup<create_order::Operation>,
    UrlPath(key): UrlPath<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

pub async fn reconcile_order(books: Books, op: idem::UnknownOperation) -> idem::Decision {
    let order = books
        .orders
        .lock()
        .unwrap()
        .get(&op.operation_id.to_string())
        .copied();
    match order {
        Some(amount) => idem::Decision::applied(created(amount)),
        None => idem::Decision::NotApplied,
    }
}

pub async fn service(store: idem::RedisStore) -> (TestServer, Books) {
    let idem = idem::Idem::builder(store, idem::identity::header("x-client-id"))
        .unavailable_retry_after(Duration::from_secs(1))
        .build();
    let books = Books::default();
    let router = Router::new()
        .route("/orders", post(create_order))
        .route("/orders/operations/{key}", get(order_status))
        .with_state(books.clone())
        .layer(idem.layer());
    (TestServer::start(router).await, books)
}

pub async fn order(server: &TestServer, key: &str, amount: u64) -> Answer {
    send(
        server
            .post("/orders", key)
            .json(&json!({ "amount": amount })),
    )
    .await
}

/// 503 `store-full` with `Retry-After`, whose detail does not claim the store cannot be
/// reached.
pub fn assert_store_full(answer: &Answer, what: &str) {
    assert_eq!(answer.status, 503, "{what}: {answer:?}");
    assert_eq!(answer.slug(), "store-full", "{what}");
    assert!(
        answer.header("retry-after").is_some(),
        "{what}: Retry-After"
    );
    let detail = answer.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!detail.contains("cannot be reached"), "{what}: {detail}");
}

pub fn assert_store_unavailable(answer: &Answer, what: &str) {
    assert_eq!(answer.status, 503, "{what}: {answer:?}");
    assert_eq!(answer.slug(), "store-unavailable", "{what}");
    assert!(
        answer.header("retry-after").is_some(),
        "{what}: Retry-After"
    );
}

/// Retries `key` as a client would until a 201 (at most `within`); the answers before it
/// may only be the concurrency answer or a retryable 503.
pub async fn until_created(
    server: &TestServer,
    key: &str,
    amount: u64,
    within: Duration,
) -> Answer {
    let deadline = Instant::now() + within;
    loop {
        let answer = order(server, key, amount).await;
        if answer.status == 201 {
            return answer;
        }
        assert!(
            matches!(answer.status, 409 | 503),
            "{key}: only 409 or a retryable 503 before the result: {answer:?}"
        );
        assert!(Instant::now() < deadline, "{key} was never decided");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
