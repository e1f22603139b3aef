//! The payments service as an operator runs it: the real binary on 127.0.0.1, against a
//! real PostgreSQL server (a scratch schema per test), killed with SIGKILL at the
//! moments that matter.
//!
//! Without a server these tests say they were skipped and why; under `CI=true` a skip is
//! a failure.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use idem_runtime::store::conformance::postgres::scratch_url;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::provider::{Fault, TestProvider};
use support::service::{Service, client, payment, payments_in, post, request};

#[tokio::test]
async fn a_payment_is_captured_once_and_replayed_after_a_restart() {
    let Some(url) = scratch_url("payments service").await else {
        return;
    };
    let service = Service::start(&url, &[], &[]);
    let first = post(&service, "pay-1", &payment(2500)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.json());
    assert_eq!(first.json()["status"], "captured");
    let location = first.header("location").unwrap().to_owned();
    service.crash();

    let service = Service::start(&url, &[], &[]);
    let again = post(&service, "pay-1", &payment(2500)).await;
    assert!(again.replayed());
    assert_eq!(again.body, first.body, "byte for byte");
    assert_eq!(again.header("location"), Some(location.as_str()));
    let mismatch = post(&service, "pay-1", &payment(9999)).await;
    assert_eq!(mismatch.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(mismatch.problem_type().ends_with(":fingerprint-mismatch"));
    let invalid = post(
        &service,
        "pay-bad",
        &json!({ "source": "", "currency": "euro", "amount_minor": 0 }),
    )
    .await;
    assert_eq!(invalid.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(invalid.json()["errors"].as_array().map(Vec::len), Some(3));
    assert_eq!(payments_in(&url).await, 1);
    // The document it serves carries the contract it enforces.
    let document: Value = client()
        .get(format!("{}/openapi.json", service.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        document["paths"]["/payments"]["post"]["x-idempotency"],
        payments::api::openapi().unwrap()["paths"]["/payments"]["post"]["x-idempotency"]
    );
}

/// The provider charges, and its answer is lost: 503 `step-outcome-unknown` with
/// `Retry-After`, nothing written; the retry resumes the same operation, sends the charge
/// again under the same downstream key, and captures the one payment with the one charge.
#[tokio::test]
async fn a_lost_answer_from_the_provider_resumes_with_one_charge() {
    let Some(url) = scratch_url("payments lost answer").await else {
        return;
    };
    let provider = TestProvider::start().await;
    provider.fail_next(Fault::LoseAnswer, 1);
    let service = Service::start(&url, &["--provider-url", provider.url().as_str()], &[]);
    let lost = post(&service, "pay-lost", &payment(700)).await;
    assert_eq!(
        lost.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        lost.json()
    );
    assert!(
        lost.problem_type().ends_with(":step-outcome-unknown"),
        "{:?}",
        lost.json()
    );
    assert_eq!(lost.header("retry-after"), Some("1"));
    assert_eq!(payments_in(&url).await, 0, "nothing committed");
    let key = format!("{}:charge", lost.header("operation-id").unwrap());
    assert_eq!(
        provider.charges(&key),
        1,
        "the provider charged under the derived key"
    );
    let retry = post(&service, "pay-lost", &payment(700)).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.json());
    assert_eq!(retry.header("operation-id"), lost.header("operation-id"));
    assert_eq!(provider.requests(&key), 2, "sent again under the same key");
    assert_eq!(provider.total_charges(), 1);
    assert_eq!(payments_in(&url).await, 1);
    assert!(
        retry.json()["charge_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("ch_"))
    );
}

/// A declined card is the final answer: 402, stored and replayed, one call.
#[tokio::test]
async fn a_declined_card_is_402_and_replayed() {
    let Some(url) = scratch_url("payments declined").await else {
        return;
    };
    let provider = TestProvider::start().await;
    provider.fail_next(Fault::Decline, 1);
    let service = Service::start(&url, &["--provider-url", provider.url().as_str()], &[]);
    let declined = post(&service, "pay-declined", &payment(900)).await;
    assert_eq!(
        declined.status,
        StatusCode::PAYMENT_REQUIRED,
        "{:?}",
        declined.json()
    );
    assert!(declined.problem_type().ends_with("card-declined"));
    let again = post(&service, "pay-declined", &payment(900)).await;
    assert_eq!(again.status, StatusCode::PAYMENT_REQUIRED);
    assert!(again.replayed());
    assert_eq!(provider.total_charges(), 0);
    assert_eq!(payments_in(&url).await, 0);
}

/// SIGKILL after the charge and the payment's write, before the commit: PostgreSQL rolls
/// the transaction back with the dead connection, and the journal keeps the charge. After
/// the lease, the retry on a new instance resumes: the charge comes from the journal (no
/// second call), and the one payment is captured.
#[cfg(feature = "fault-points")]
#[tokio::test]
async fn killed_before_the_commit_no_payment_exists_and_the_retry_runs() {
    let Some(url) = scratch_url("payments killed before commit").await else {
        return;
    };
    let provider = TestProvider::start().await;
    let provider_url = provider.url();
    let at_provider = ["--provider-url", provider_url.as_str()];
    let doomed = Service::start(&url, &at_provider, &[("IDEM_FAULT_POINT", "before_commit")]);
    let in_flight = tokio::spawn(request(&doomed, "pay-crash-before", &payment(1234)).send());
    tokio::task::spawn_blocking(move || {
        doomed.wait_for_stderr("fault point before_commit reached");
        doomed.crash();
    })
    .await
    .unwrap();
    assert!(
        in_flight.await.unwrap().is_err(),
        "the answer died with the process"
    );
    assert_eq!(payments_in(&url).await, 0);

    let killed = Instant::now();
    let service = Service::start(&url, &at_provider, &[]);
    // Told to wait until the dead attempt's 2 s heartbeat lease ends, then decided.
    let until = killed + Duration::from_secs(6);
    while post(&service, "pay-crash-before", &payment(1234))
        .await
        .status
        == StatusCode::CONFLICT
    {
        assert!(Instant::now() < until, "never decided");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(killed.elapsed() < Duration::from_millis(3500));
    let retry = post(&service, "pay-crash-before", &payment(1234)).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{:?}", retry.json());
    assert!(
        retry.replayed(),
        "the retry that was decided ran it; this one replays"
    );
    assert_eq!(payments_in(&url).await, 1);
    assert_eq!(provider.total_charges(), 1, "one charge for one intent");
}

/// SIGKILL after the commit, before the answer: the payment and its record exist, and
/// the retry is the stored answer at once.
#[cfg(feature = "fault-points")]
#[tokio::test]
async fn killed_after_the_commit_the_retry_is_the_replay() {
    let Some(url) = scratch_url("payments killed after commit").await else {
        return;
    };
    let doomed = Service::start(&url, &[], &[("IDEM_FAULT_POINT", "after_commit")]);
    let in_flight = tokio::spawn(request(&doomed, "pay-crash-after", &payment(4321)).send());
    tokio::task::spawn_blocking(move || {
        doomed.wait_for_stderr("fault point after_commit reached");
        doomed.crash();
    })
    .await
    .unwrap();
    assert!(in_flight.await.unwrap().is_err());
    assert_eq!(payments_in(&url).await, 1);
    let service = Service::start(&url, &[], &[]);
    let retry = post(&service, "pay-crash-after", &payment(4321)).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed());
    assert_eq!(payments_in(&url).await, 1, "no second payment");
}

/// Without `--provider-url` the service starts a provider of its own and logs its URL;
/// with one, it takes that provider and starts none: a provider that is not there is an
/// unknown outcome (503 `step-outcome-unknown`), never a payment without a charge.
#[tokio::test]
async fn the_provider_is_in_process_unless_a_url_is_given() {
    let Some(url) = scratch_url("payments provider").await else {
        return;
    };
    let service = Service::start(&url, &[], &[("RUST_LOG", "info")]);
    service.wait_for_stderr("an in-process provider listens url=http://127.0.0.1:");
    let first = post(&service, "pay-provider", &payment(100)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.json());
    drop(service);

    let service = Service::start(
        &url,
        &["--provider-url", "http://127.0.0.1:9/"],
        &[("RUST_LOG", "info")],
    );
    let second = post(&service, "pay-provider-2", &payment(100)).await;
    assert_eq!(
        second.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        second.json()
    );
    assert!(second.problem_type().ends_with(":step-outcome-unknown"));
    assert_eq!(payments_in(&url).await, 1, "only the first payment");
    let logged: Vec<String> = service.stderr.try_iter().collect();
    assert!(
        !logged
            .iter()
            .any(|line| line.contains("in-process provider")),
        "{logged:?}"
    );
}

/// A provider URL that is not http or https is refused before anything starts.
#[test]
fn a_provider_url_that_is_not_http_is_refused() {
    let refused = Command::new(env!("CARGO_BIN_EXE_payments"))
        .args(["--provider-url", "ftp://provider.example/"])
        .env(
            "DATABASE_URL",
            "postgres://idem@127.0.0.1:9/none?sslmode=disable",
        )
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--provider-url"), "{stderr}");
    assert!(stderr.contains("http:// or https://"), "{stderr}");
}

/// No `DATABASE_URL`, or a server that cannot be reached: a message that says so, and a
/// failing exit status, not a panic.
#[test]
fn a_missing_or_unreachable_database_is_a_clear_error() {
    let missing = Command::new(env!("CARGO_BIN_EXE_payments"))
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("--database-url"), "{stderr}");

    let unreachable = Command::new(env!("CARGO_BIN_EXE_payments"))
        .env(
            "DATABASE_URL",
            "postgres://idem@127.0.0.1:9/none?sslmode=disable",
        )
        .output()
        .unwrap();
    assert!(!unreachable.status.success());
    let stderr = String::from_utf8_lossy(&unreachable.stderr);
    assert!(
        stderr.contains("cannot use the database at DATABASE_URL"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
