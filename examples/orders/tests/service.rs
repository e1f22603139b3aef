//! The orders service as a new user runs it: the real binary, on 127.0.0.1, with its
//! SQLite file, answering every row of idem's table (DESIGN §4).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

/// The service binary, started on a free port of 127.0.0.1; killed when dropped.
struct Service {
    child: Child,
    url: String,
}

impl Service {
    fn start(db: &Path, extra: &[&str]) -> Service {
        let mut child = Command::new(env!("CARGO_BIN_EXE_orders"))
            .args(["--addr", "127.0.0.1:0", "--db"])
            .arg(db)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the orders binary starts");
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the service prints its address");
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned();
        Service { child, url }
    }

    /// Kills the process at once, as a crash would.
    fn crash(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

fn order(amount: i64) -> Value {
    json!({
        "customer_id": "cus_42",
        "currency": "EUR",
        "amount_minor": amount,
        "items": [{ "sku": "book-1", "qty": 2 }]
    })
}

struct Reply {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: bytes::Bytes,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    fn problem_type(&self) -> String {
        self.json()["type"].as_str().unwrap_or_default().to_owned()
    }
}

async fn post(http: &reqwest::Client, service: &Service, key: Option<&str>, body: &Value) -> Reply {
    let mut request = http
        .post(format!("{}/orders", service.url))
        .header("x-client-id", "acme")
        .json(body);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = request.send().await.expect("the service answers");
    Reply {
        status: response.status(),
        headers: response.headers().clone(),
        body: response.bytes().await.unwrap(),
    }
}

fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("orders.db");
    (dir, db)
}

#[tokio::test]
async fn a_completed_order_is_replayed_after_the_service_restarts() {
    let (_dir, db) = temp_db();
    let http = client();
    let first_service = Service::start(&db, &[]);
    let first = post(&http, &first_service, Some("order-2026-0001"), &order(1999)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let location = first.header("location").unwrap().to_owned();
    first_service.crash();

    let service = Service::start(&db, &[]);
    let again = post(&http, &service, Some("order-2026-0001"), &order(1999)).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(again.body, first.body, "the stored body, byte for byte");
    assert_eq!(again.header("location"), Some(location.as_str()));
    assert_eq!(again.header("operation-id"), first.header("operation-id"));

    let read = http
        .get(format!("{}{location}", service.url))
        .header("x-client-id", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), StatusCode::OK);
    let read: Value = read.json().await.unwrap();
    assert_eq!(read, first.json());
}

#[tokio::test]
async fn the_answers_of_the_table() {
    let (_dir, db) = temp_db();
    let http = client();
    let service = Service::start(&db, &["--outage", "1"]);

    let missing = post(&http, &service, None, &order(100)).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert!(missing.problem_type().ends_with(":key-missing"));

    let emoji = post(&http, &service, Some("🦀🦀🦀"), &order(100)).await;
    assert_eq!(emoji.status, StatusCode::BAD_REQUEST);
    assert!(emoji.problem_type().ends_with(":key-malformed"));

    // The payment provider is down for one request: 503 (retryable) releases the key.
    let outage = post(&http, &service, Some("k-outage"), &order(100)).await;
    assert_eq!(outage.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(outage.header("retry-after"), Some("1"));
    let retried = post(&http, &service, Some("k-outage"), &order(100)).await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed());
    assert_eq!(
        retried.header("operation-id"),
        outage.header("operation-id"),
        "one operation, two attempts"
    );

    let mismatch = post(&http, &service, Some("k-outage"), &order(900)).await;
    assert_eq!(mismatch.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(mismatch.problem_type().ends_with(":fingerprint-mismatch"));

    // A business-rule failure is final: stored and replayed like a success.
    let invalid =
        json!({ "customer_id": "cus_42", "currency": "XXX1", "amount_minor": 0, "items": [] });
    let refused = post(&http, &service, Some("k-invalid"), &invalid).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        refused.problem_type(),
        "https://orders.example.com/problems/invalid-order"
    );
    assert_eq!(refused.json()["errors"].as_array().map(Vec::len), Some(3));
    let replayed = post(&http, &service, Some("k-invalid"), &invalid).await;
    assert!(replayed.replayed());
    assert_eq!(replayed.body, refused.body);

    let lookup = http
        .get(format!("{}/orders/operations/k-outage", service.url))
        .header("x-client-id", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(lookup.status(), StatusCode::OK);
    let lookup: Value = lookup.json().await.unwrap();
    assert_eq!(lookup["state"], "completed");
    assert_eq!(lookup["attempt"], 2);
    assert_eq!(lookup["response"]["status"], 201);

    let other_client = http
        .get(format!("{}/orders/operations/k-outage", service.url))
        .header("x-client-id", "someone-else")
        .send()
        .await
        .unwrap();
    assert_eq!(other_client.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_concurrent_duplicate_gets_409_while_the_first_runs() {
    let (_dir, db) = temp_db();
    let http = client();
    let service = Service::start(&db, &["--delay", "1s"]);
    let body = order(500);
    let (a, b) = tokio::join!(post(&http, &service, Some("k-dup"), &body), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        post(&http, &service, Some("k-dup"), &body).await
    });
    assert_eq!(a.status, StatusCode::CREATED);
    assert_eq!(b.status, StatusCode::CONFLICT);
    assert!(b.problem_type().ends_with(":operation-in-progress"));
    assert_eq!(b.header("retry-after"), Some("1"));
    let after = post(&http, &service, Some("k-dup"), &body).await;
    assert!(after.replayed());
    assert_eq!(after.body, a.body);
}

/// The order is written, then the answer takes longer than the attempt's 10 s lease: the
/// attempt is stopped and its outcome is unknown. The retry after the lease runs the
/// reconcile function, which finds the order: the order is answered, not created again.
#[tokio::test]
async fn an_unknown_outcome_is_reconciled_from_the_orders_table() {
    let (_dir, db) = temp_db();
    let http = client();
    let service = Service::start(&db, &["--delay", "12s"]);
    let first = post(&http, &service, Some("k-slow"), &order(700)).await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(first.problem_type().ends_with(":attempt-timed-out"));
    let retry = post(&http, &service, Some("k-slow"), &order(700)).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.json());
    assert!(retry.replayed());
    assert_eq!(retry.json()["amount_minor"], 700);
    let again = post(&http, &service, Some("k-slow"), &order(700)).await;
    assert_eq!(again.body, retry.body);
}

#[test]
fn the_published_contract_passes_an_independent_validator() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("openapi.yaml");
    let docs = dir.path().join("docs");
    let status = Command::new(env!("CARGO_BIN_EXE_orders"))
        .arg("--emit-openapi")
        .arg(&spec)
        .arg("--emit-docs")
        .arg(&docs)
        .status()
        .unwrap();
    assert!(status.success());
    assert!(docs.join("operations.md").is_file());
    let html = std::fs::read_to_string(docs.join("operations.html")).unwrap();
    assert!(
        html.contains("<h2>POST &#x2f;orders</h2>"),
        "one section for POST /orders"
    );

    let validator = Command::new("python3")
        .args(["-m", "openapi_spec_validator"])
        .arg(&spec)
        .output();
    match validator {
        Ok(out) if out.status.success() => {}
        Ok(out) if String::from_utf8_lossy(&out.stderr).contains("No module named") => {
            assert!(
                std::env::var_os("IDEM_REQUIRE_VALIDATOR").is_none(),
                "IDEM_REQUIRE_VALIDATOR is set but openapi-spec-validator is not installed"
            );
            eprintln!(
                "NOTICE: openapi-spec-validator is not installed; skipping the independent validation"
            );
        }
        Ok(out) => panic!(
            "the emitted document is invalid:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(error) => {
            assert!(
                std::env::var_os("IDEM_REQUIRE_VALIDATOR").is_none(),
                "python3 cannot run: {error}"
            );
            eprintln!(
                "NOTICE: python3 is not available ({error}); skipping the independent validation"
            );
        }
    }
}
