//! The client budget against a full-size flood: a real `redis-server` of the test's own
//! with `maxmemory 64mb` and `noeviction`, the orders service as a process on it
//! (`--store redis`, orders in PostgreSQL), one client flooding 422s under fresh keys
//! and another sending orders. The flooder gets 429 `client-budget-exhausted` (never a
//! 5xx), and every order of the other client gets 201.

mod common;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{Service, client};
use idem_runtime::store::conformance::postgres::scratch_url;

const BUDGET_EXHAUSTED: &str = "tag:idem.rs,2026:problem:client-budget-exhausted";

/// A `redis-server` on a free port of 127.0.0.1, 64 MB and no eviction, no persistence;
/// killed when dropped.
struct FullSizeRedis {
    port: u16,
    child: Child,
}

impl FullSizeRedis {
    fn start() -> Option<FullSizeRedis> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--maxmemory", "64mb", "--maxmemory-policy", "noeviction"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let Ok(child) = child else {
            assert!(
                !common::skips_fail(),
                "redis-server is not installed; under CI=true a skip is a failure"
            );
            eprintln!("skipped: redis-server is not installed");
            return None;
        };
        let until = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < until, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(FullSizeRedis { port, child })
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for FullSizeRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An order whose every line item is invalid: the largest 422 the example answers.
fn invalid_order() -> Value {
    let items: Vec<Value> = (0..100)
        .map(|i| json!({ "sku": format!("bad sku {i} {}", "x".repeat(40)), "qty": 0 }))
        .collect();
    json!({ "customer_id": "cus 42", "currency": "XXX!", "amount_minor": 0, "items": items })
}

/// POST /orders as `client` under `key`: the status and the problem type, if any.
async fn send(
    http: &reqwest::Client,
    url: &str,
    client: &str,
    key: &str,
    body: &Value,
) -> (u16, String, bool) {
    let response = http
        .post(format!("{url}/orders"))
        .header("x-client-id", client)
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .expect("an answer");
    let status = response.status().as_u16();
    let retry_after = response.headers().contains_key("retry-after");
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let kind = body["type"].as_str().unwrap_or_default().to_owned();
    (status, kind, retry_after)
}

/// One flooding worker: 400 invalid orders of the client `flooder` under fresh keys.
/// Returns how many it sent, how many got 429 (each checked: the budget's problem type
/// and `Retry-After`), and how many got anything but 422 or 429.
async fn flood(http: reqwest::Client, url: String, worker: usize) -> (usize, usize, usize) {
    let body = invalid_order();
    let (mut sent, mut refused, mut failed) = (0, 0, 0);
    for n in 1..=400 {
        let key = format!("flood-{worker}-{n}");
        let (status, kind, retry_after) = send(&http, &url, "flooder", &key, &body).await;
        sent += 1;
        match status {
            422 => {}
            429 => {
                assert_eq!(kind, BUDGET_EXHAUSTED);
                assert!(retry_after, "a 429 carries Retry-After");
                refused += 1;
            }
            other => {
                eprintln!("flooder got {other} {kind}");
                failed += 1;
            }
        }
    }
    (sent, refused, failed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_flooding_large_422s_gets_429s_and_another_client_all_201s() {
    let what = "the client budget on a 64 MB Redis";
    let Some(redis) = FullSizeRedis::start() else {
        return;
    };
    let Some(database_url) = scratch_url(what).await else {
        return;
    };
    // A budget below the default so that the flood reaches it within the test's time
    // whatever the size of a 422 (the default's 16 MiB also fits a 64 MB Redis).
    let service = Service::redis_with(
        &redis.url(),
        &database_url,
        &[
            ("ORDERS_CLIENT_BUDGET_RECORDS", "300"),
            ("ORDERS_CLIENT_BUDGET_BYTES", "4000000"),
        ],
    );
    let http = client();
    let started = Instant::now();
    let flooders: Vec<_> = (0..6)
        .map(|worker| tokio::spawn(flood(http.clone(), service.url.clone(), worker)))
        .collect();
    // The other client, meanwhile: every order is made.
    for n in 0..40 {
        let order = json!({ "customer_id": "cus_7", "currency": "EUR", "amount_minor": 100 + n,
            "items": [{ "sku": "book-1", "qty": 1 }] });
        let (status, kind, _) =
            send(&http, &service.url, "quiet", &format!("quiet-{n}"), &order).await;
        assert_eq!(status, 201, "the other client's order {n}: {status} {kind}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (mut sent, mut refused, mut failed) = (0, 0, 0);
    for flooder in flooders {
        let counts = flooder.await.expect("a flooder");
        (sent, refused, failed) = (sent + counts.0, refused + counts.1, failed + counts.2);
    }
    eprintln!(
        "flood: {sent} sent, {refused} refused with 429, in {:?}",
        started.elapsed()
    );
    assert_eq!(
        failed, 0,
        "the flooder never gets a 5xx (or anything but 422 and 429)"
    );
    assert!(refused > 0, "the flooder reached its budget and got 429s");
    // A key the flooder holds is still answered: replayed, not refused.
    let (status, _, _) = send(
        &http,
        &service.url,
        "flooder",
        "flood-0-1",
        &invalid_order(),
    )
    .await;
    assert_eq!(status, 422, "a held key is replayed at the budget");
}
