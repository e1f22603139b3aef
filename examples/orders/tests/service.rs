//! The orders service as a new user runs it: the real binary, on 127.0.0.1, with its
//! SQLite file, answering every row of the answer table (docs/answers.md).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Service, client, order, post, temp_db};
use reqwest::StatusCode;
use serde_json::{Value, json};

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

/// An order of many bad line items: the 422 lists 20 broken rules and counts the rest,
/// so it stays small enough to be kept and replayed whole, whatever the order's size.
#[tokio::test]
async fn a_huge_invalid_order_gets_a_small_422_replayed_whole() {
    let (_dir, db) = temp_db();
    let http = client();
    let service = Service::start(&db, &[]);
    let items: Vec<Value> = (0..20_000)
        .map(|_| json!({ "sku": "", "qty": 0 }))
        .collect();
    let huge =
        json!({ "customer_id": "cus_42", "currency": "EUR", "amount_minor": 100, "items": items });
    let refused = post(&http, &service, Some("k-huge-invalid"), &huge).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(refused.json()["errors"].as_array().map(Vec::len), Some(20));
    assert_eq!(refused.json()["more_errors"], 1 + 2 * 20_000 - 20);
    assert!(
        refused.body.len() < 3 * 1024,
        "{} bytes",
        refused.body.len()
    );
    let replayed = post(&http, &service, Some("k-huge-invalid"), &huge).await;
    assert!(replayed.replayed());
    assert_eq!(replayed.body, refused.body, "kept whole");
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

/// The order is written, then the answer takes longer than the attempt's time (9 s of
/// the 10 s per-attempt timeout): the attempt is stopped and everything it wrote is
/// rolled back, so the key is released and no order exists.
#[tokio::test]
async fn a_slow_attempt_is_rolled_back_and_its_key_released() {
    let (_dir, db) = temp_db();
    let http = client();
    let service = Service::start(&db, &["--delay", "12s"]);
    let first = post(&http, &service, Some("k-slow"), &order(700)).await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(first.problem_type().ends_with(":attempt-rolled-back"));
    assert_eq!(first.json()["state"], "released");
    let lookup: Value = http
        .get(format!("{}/orders/operations/k-slow", service.url))
        .header("x-client-id", "acme")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(lookup["state"], "released");
    assert_eq!(orders_in(&db).await, 0, "the order was rolled back");
}

/// How many orders the file holds, read directly (the service may be dead).
async fn orders_in(db: &Path) -> i64 {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(db)
        .read_only(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    let count = orders::db::sqlite::count(&pool).await.unwrap();
    pool.close().await;
    count
}

/// SIGKILL between the business write and the commit (the fault point
/// `before_commit`): after a restart no order exists; the record is still processing
/// under the dead attempt's lease, so a retry is told to wait; once the lease ends,
/// recovery finds no order and the retry writes the one order.
#[cfg(feature = "fault-points")]
#[tokio::test]
async fn killed_before_the_commit_nothing_happened_and_the_retry_runs() {
    let (_dir, db) = temp_db();
    let http = client();
    let doomed = Service::start_with(&db, &[], &[("IDEM_FAULT_POINT", "before_commit")]);
    let sent = Instant::now();
    let request = http
        .post(format!("{}/orders", doomed.url))
        .header("x-client-id", "acme")
        .header("idempotency-key", "k-crash-before")
        .json(&order(1234))
        .send();
    let in_flight = tokio::spawn(request);
    tokio::task::spawn_blocking(move || {
        doomed.wait_for_stderr("fault point before_commit reached");
        doomed.crash();
    })
    .await
    .unwrap();
    let killed = Instant::now();
    let _ = sent;
    assert!(
        in_flight.await.unwrap().is_err(),
        "the answer was lost with the process"
    );
    assert_eq!(orders_in(&db).await, 0, "nothing was committed");

    // The dead attempt's lease is the 2 s heartbeat lease, not the contract's 10 s
    // per-attempt timeout: until it ends a retry is told to wait, then recovery finds no
    // order and the retry writes the one order.
    let service = Service::start(&db, &[]);
    let until = killed + Duration::from_secs(6);
    let (retry, waited) = loop {
        let answer = post(&http, &service, Some("k-crash-before"), &order(1234)).await;
        if answer.status != StatusCode::CONFLICT {
            break (answer, killed.elapsed());
        }
        assert!(answer.problem_type().ends_with(":operation-in-progress"));
        assert!(Instant::now() < until, "never decided: {:?}", answer.json());
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        waited < Duration::from_millis(3500),
        "decided {waited:?} after the crash"
    );
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.json());
    assert!(!retry.replayed(), "not applied: the retry ran");
    let again = post(&http, &service, Some("k-crash-before"), &order(1234)).await;
    assert!(again.replayed());
    assert_eq!(orders_in(&db).await, 1);
}

/// SIGKILL after the commit, before the answer (the fault point `after_commit`): after a
/// restart the one order exists and the retry is its stored answer, replayed at once.
#[cfg(feature = "fault-points")]
#[tokio::test]
async fn killed_after_the_commit_the_retry_is_the_replay() {
    let (_dir, db) = temp_db();
    let http = client();
    let doomed = Service::start_with(&db, &[], &[("IDEM_FAULT_POINT", "after_commit")]);
    let request = http
        .post(format!("{}/orders", doomed.url))
        .header("x-client-id", "acme")
        .header("idempotency-key", "k-crash-after")
        .json(&order(4321))
        .send();
    let in_flight = tokio::spawn(request);
    tokio::task::spawn_blocking(move || {
        doomed.wait_for_stderr("fault point after_commit reached");
        doomed.crash();
    })
    .await
    .unwrap();
    assert!(
        in_flight.await.unwrap().is_err(),
        "the answer was lost with the process"
    );
    assert_eq!(orders_in(&db).await, 1);

    let service = Service::start(&db, &[]);
    let retry = post(&http, &service, Some("k-crash-after"), &order(4321)).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.json());
    assert!(retry.replayed());
    assert_eq!(retry.json()["amount_minor"], 4321);
    assert_eq!(orders_in(&db).await, 1, "no second order");
}

/// A key reused after its TTL is a new operation: it must not answer the older order.
/// (The TTL is a day, so the test ages the record in the file, as a day would.)
#[tokio::test]
async fn a_key_after_its_ttl_makes_a_new_order_not_the_old_one() {
    let (_dir, db) = temp_db();
    let http = client();
    let service = Service::start(&db, &[]);
    let first = post(&http, &service, Some("k-reused"), &order(100)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    service.crash();
    let options = sqlx::sqlite::SqliteConnectOptions::new().filename(&db);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    sqlx::query("UPDATE idem_records SET expires_at = 1 WHERE key = 'k-reused'")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;

    let service = Service::start(&db, &[]);
    let second = post(&http, &service, Some("k-reused"), &order(100)).await;
    assert_eq!(second.status, StatusCode::CREATED);
    assert!(!second.replayed());
    assert_ne!(second.header("operation-id"), first.header("operation-id"));
    assert_ne!(second.json()["id"], first.json()["id"], "a new order");
    assert_eq!(orders_in(&db).await, 2);
}

/// A database made by an older version of the example is refused with a message that
/// says what to do, not used with the wrong schema.
#[test]
fn an_old_database_is_refused_with_a_clear_message() {
    let (_dir, db) = temp_db();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&db)
            .create_if_missing(true);
        let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
        sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY, client_id TEXT NOT NULL, idempotency_key TEXT NOT NULL, UNIQUE (client_id, idempotency_key))")
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    });
    let out = Command::new(env!("CARGO_BIN_EXE_orders"))
        .args(["--addr", "127.0.0.1:0", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("older version of this example"), "{stderr}");
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
    // The client identity the server enforces is published, and documented.
    let document = std::fs::read_to_string(&spec).unwrap();
    assert!(
        document.contains("client_identity:") && document.contains("name: x-client-id"),
        "{document}"
    );
    assert!(
        html.contains("x-client-id"),
        "the docs name the identity header"
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
