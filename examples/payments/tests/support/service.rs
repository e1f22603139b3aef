//! The payments service as an operator runs it: the real binary (`CARGO_BIN_EXE_payments`)
//! on a free port of 127.0.0.1, against a PostgreSQL database, killed, paused and resumed
//! with signals; and the client's side: requests, answers, the database read directly.

use std::fmt;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

/// The service binary on a free port of 127.0.0.1; killed when dropped.
pub struct Service {
    child: Child,
    /// `http://127.0.0.1:<port>`, as the service printed it.
    pub url: String,
    /// The lines the service writes to standard error (also passed on to ours).
    pub stderr: mpsc::Receiver<String>,
}

impl Service {
    /// `payments --addr 127.0.0.1:0 <extra>` on `database_url`, with `env` (and no
    /// inherited `IDEM_FAULT_POINT`); returns once the service printed its address.
    pub fn start(database_url: &str, extra: &[&str], env: &[(&str, &str)]) -> Service {
        let mut child = Command::new(env!("CARGO_BIN_EXE_payments"))
            .args(["--addr", "127.0.0.1:0"])
            .args(extra)
            .env("DATABASE_URL", database_url)
            .env("RUST_LOG", "warn")
            .env_remove("IDEM_FAULT_POINT")
            .env_remove("PROVIDER_URL")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the payments binary starts");
        let (lines, stderr) = mpsc::channel();
        let pipe = child.stderr.take().expect("stderr is piped");
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                eprintln!("payments: {line}");
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout is piped"))
            .read_line(&mut line)
            .expect("the service prints its address");
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned();
        Service { child, url, stderr }
    }

    /// Waits (at most 20 s) for a line of standard error that contains `text`.
    pub fn wait_for_stderr(&self, text: &str) {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            match self
                .stderr
                .recv_timeout(until.saturating_duration_since(Instant::now()))
            {
                Ok(line) if line.contains(text) => return,
                Ok(_) => {}
                Err(_) => panic!("the service never wrote {text:?}"),
            }
        }
    }

    /// SIGKILL, as a crash would.
    pub fn crash(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGSTOP: the process stops where it is, its sockets open, as in a long pause of
    /// the machine or the runtime (a VM frozen, a stop-the-world pause).
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT: a paused process goes on where it stopped.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args([signal, pid.as_str()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill {signal} {pid} failed");
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // A stopped process dies of SIGKILL all the same.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An answer, read to the end.
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: reqwest::header::HeaderMap,
    /// The body.
    pub body: bytes::Bytes,
}

impl Reply {
    /// The body as JSON (`null` when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// A header, when it is text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Whether this is a replay (`Idempotent-Replayed: true`).
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// The problem's `type` (empty when there is none).
    pub fn problem_type(&self) -> String {
        self.json()["type"].as_str().unwrap_or_default().to_owned()
    }

    /// `Retry-After`, in seconds, when there is one.
    pub fn retry_after(&self) -> Option<u64> {
        self.header("retry-after").and_then(|v| v.parse().ok())
    }

    /// The `Operation-Id` header.
    pub fn operation_id(&self) -> Option<&str> {
        self.header("operation-id")
    }
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reply")
            .field("status", &self.status)
            .field("replayed", &self.replayed())
            .field("operation_id", &self.operation_id())
            .field("retry_after", &self.retry_after())
            .field("body", &String::from_utf8_lossy(&self.body))
            .finish()
    }
}

/// An HTTP client with a 20 s timeout, no proxy and without reqwest's own retries (the
/// tests decide every retry).
pub fn client() -> reqwest::Client {
    client_waiting(Duration::from_secs(20))
}

/// [`client`], waiting `timeout` for an answer: for a request to a process that a test
/// pauses.
pub fn client_waiting(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(timeout)
        .retry(reqwest::retry::never())
        .build()
        .unwrap()
}

/// A payment of `amount` minor units.
pub fn payment(amount: i64) -> Value {
    json!({ "source": "card_visa_4242", "currency": "EUR", "amount_minor": amount })
}

/// `POST /payments` to `service` under `key` as the client `acme`, not sent yet.
pub fn request(service: &Service, key: &str, body: &Value) -> reqwest::RequestBuilder {
    client()
        .post(format!("{}/payments", service.url))
        .header("x-client-id", "acme")
        .header("idempotency-key", key)
        .json(body)
}

/// `POST /payments` to `service` under `key`, answered.
///
/// # Panics
///
/// When no answer comes.
pub async fn post(service: &Service, key: &str, body: &Value) -> Reply {
    try_post(&client(), &service.url, key, body)
        .await
        .expect("an answer")
}

/// `POST {url}/payments` under `key` as the client `acme`; the error when no answer came
/// (the connection was refused or closed: the process died).
pub async fn try_post(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    body: &Value,
) -> Result<Reply, reqwest::Error> {
    let response = http
        .post(format!("{url}/payments"))
        .header("x-client-id", "acme")
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await?;
    Ok(Reply {
        status: response.status(),
        headers: response.headers().clone(),
        body: response.bytes().await?,
    })
}

/// `GET {url}/payments/operations/{key}` as the client `acme`: the operation's state and
/// its steps, as JSON (`null` when there is no such operation or no answer).
pub async fn lookup(http: &reqwest::Client, url: &str, key: &str) -> Value {
    let Ok(response) = http
        .get(format!("{url}/payments/operations/{key}"))
        .header("x-client-id", "acme")
        .send()
        .await
    else {
        return Value::Null;
    };
    response.json().await.unwrap_or(Value::Null)
}

/// How many payments the database holds, read directly.
pub async fn payments_in(database_url: &str) -> i64 {
    let pool = sqlx::PgPool::connect(database_url).await.unwrap();
    let count = payments::db::count(&pool).await.unwrap();
    pool.close().await;
    count
}
