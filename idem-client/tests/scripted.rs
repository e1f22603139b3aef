//! The retry loop against a scripted transport, on tokio's paused clock: every delay is
//! exact and no test sleeps for real.

mod common;

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use tokio::time::Instant;

use idem_client::{
    Backoff, Intent, LookupAnswer, Outcome, RetryBudget, RetryPolicy, StopReason, TransportError,
};
use idem_contract::{Retryable, TransportFailure};

use common::{Script, Step, call, client, policy, problem, report, status, with_retry_after};

#[tokio::test(start_paused = true)]
async fn a_429_is_retried_after_its_retry_after_with_the_same_key() {
    let script = Script::new([with_retry_after(429, "2"), status(201)]);
    let t0 = Instant::now();
    let Outcome::Completed(done) = client(&script)
        .execute(Intent::new(policy()), &call())
        .await
        .unwrap()
    else {
        panic!("completed");
    };
    assert_eq!(done.attempts, 2);
    assert!(!done.replayed);
    let sent = script.posts();
    assert_eq!(sent.len(), 2);
    assert!(
        sent[1].0 - t0 >= Duration::from_secs(2),
        "not before Retry-After"
    );
    assert!(
        sent[1].0 - t0 < Duration::from_secs(3),
        "the delay is Retry-After, not more"
    );
    let key = |r: &Request<Bytes>| r.headers()["idempotency-key"].clone();
    assert_eq!(key(&sent[0].1), key(&sent[1].1), "one key per intent");
    assert_eq!(key(&sent[0].1), done.key.as_str());
    assert_eq!(sent[1].1.headers()["x-client-id"], "acme");
}

#[tokio::test(start_paused = true)]
async fn attempts_never_exceed_max_attempts_and_the_lookup_is_asked() {
    let script = Script::new(std::iter::repeat_n(status(503), 10));
    let Outcome::Unknown(unknown) = client(&script)
        .execute(Intent::new(policy()), &call())
        .await
        .unwrap()
    else {
        panic!("unknown");
    };
    assert_eq!(script.posts().len(), 4, "max_attempts, the first included");
    assert_eq!(unknown.attempts, 4);
    assert_eq!(unknown.reason, StopReason::AttemptsExhausted);
    assert!(matches!(unknown.lookup, Some(LookupAnswer::NotFound)));
    let lookup = script
        .sent()
        .into_iter()
        .find(|(_, r)| r.method() == http::Method::GET)
        .unwrap()
        .1;
    assert_eq!(
        lookup.uri().to_string(),
        format!("http://127.0.0.1:1/orders/operations/{}", unknown.key())
    );
    assert_eq!(
        lookup.headers()["x-client-id"],
        "acme",
        "the lookup is the client's"
    );
    assert!(lookup.body().is_empty());
    assert!(!unknown.new_key_safe());
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_longer_than_the_deadline_stops_at_once() {
    let script = Script::new([with_retry_after(503, "60"), status(201)]);
    let t0 = Instant::now();
    let Outcome::Unknown(unknown) = client(&script)
        .execute(Intent::new(policy()), &call())
        .await
        .unwrap()
    else {
        panic!("unknown");
    };
    assert_eq!(
        unknown.reason,
        StopReason::RetryAfterBeyondDeadline {
            retry_after: Duration::from_secs(60)
        }
    );
    assert_eq!(script.posts().len(), 1);
    assert!(
        Instant::now() - t0 < Duration::from_secs(1),
        "no sleep past the deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn ignoring_retry_after_ignores_it_on_every_attempt() {
    let script = Script::new([
        with_retry_after(503, "20"),
        with_retry_after(503, "20"),
        status(201),
    ]);
    let policy = policy().obey_retry_after(false);
    let t0 = Instant::now();
    let outcome = client(&script)
        .execute(Intent::new(policy), &call())
        .await
        .unwrap();
    assert!(
        matches!(outcome, Outcome::Completed(ref c) if c.attempts == 3),
        "{outcome:?}"
    );
    assert!(
        Instant::now() - t0 <= Duration::from_secs(2),
        "the backoff alone: ≤ 1 s each"
    );
}

#[tokio::test(start_paused = true)]
async fn permanent_answers_stop_at_once() {
    for code in [400, 401, 403, 404, 409, 413, 422] {
        let script = Script::new([status(code), status(201)]);
        let outcome = client(&script)
            .execute(Intent::new(policy()), &call())
            .await
            .unwrap();
        let Outcome::Failed(failed) = outcome else {
            panic!("{code}: {outcome:?}");
        };
        assert_eq!(failed.status.as_u16(), code);
        assert_eq!(script.posts().len(), 1, "{code}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_still_processing_409_is_retried_after_its_retry_after() {
    let script = Script::new([problem(409, "operation-in-progress", "3"), status(201)]);
    let t0 = Instant::now();
    let outcome = client(&script)
        .execute(Intent::new(policy()), &call())
        .await
        .unwrap();
    assert!(
        matches!(outcome, Outcome::Completed(ref c) if c.attempts == 2),
        "{outcome:?}"
    );
    assert!(script.posts()[1].0 - t0 >= Duration::from_secs(3));
}

/// idem's 408 `request-timeout` registered nothing: the same key is sent again. A bare
/// 408 of another server is a 4xx like any other, and final.
#[tokio::test(start_paused = true)]
async fn idems_request_timeout_is_retried_with_the_same_key() {
    let script = Script::new([problem(408, "request-timeout", "0"), status(201)]);
    let outcome = client(&script)
        .execute(Intent::new(policy()), &call())
        .await
        .unwrap();
    assert!(
        matches!(outcome, Outcome::Completed(ref c) if c.attempts == 2),
        "{outcome:?}"
    );
    let posts = script.posts();
    let key = |i: usize| posts[i].1.headers()["idempotency-key"].clone();
    assert_eq!(key(0), key(1), "one key");
    let script = Script::new([status(408), status(201)]);
    let outcome = client(&script)
        .execute(Intent::new(policy()), &call())
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Failed(_)), "{outcome:?}");
}

/// idem's 503 `step-outcome-unknown` is retried with the same key after its
/// `Retry-After`, even when the contract does not list 503: the server resumes.
#[tokio::test(start_paused = true)]
async fn a_step_outcome_unknown_is_resumed_with_the_same_key() {
    let script = Script::new([problem(503, "step-outcome-unknown", "2"), status(201)]);
    let policy = RetryPolicy::builder("create_payment")
        .max_attempts(4)
        .deadline(Duration::from_secs(30))
        .retryable([Retryable::Status(idem_contract::StatusCode(429))])
        .build()
        .unwrap();
    let t0 = Instant::now();
    let outcome = client(&script)
        .execute(Intent::new(policy), &call())
        .await
        .unwrap();
    assert!(
        matches!(outcome, Outcome::Completed(ref c) if c.attempts == 2),
        "{outcome:?}"
    );
    let posts = script.posts();
    let key = |i: usize| posts[i].1.headers()["idempotency-key"].clone();
    assert_eq!(key(0), key(1), "one key");
    assert!(
        posts[1].0 - t0 >= Duration::from_secs(2),
        "after Retry-After"
    );
}

#[tokio::test(start_paused = true)]
async fn an_outcome_the_server_does_not_know_stops_and_says_so() {
    let script = Script::new([problem(409, "operation-outcome-unknown", "1"), status(201)]);
    let Outcome::Unknown(unknown) = client(&script)
        .execute(Intent::new(policy()), &call())
        .await
        .unwrap()
    else {
        panic!("unknown");
    };
    assert_eq!(unknown.reason, StopReason::OutcomeUnknownOnServer);
    assert_eq!(script.posts().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn timeouts_are_bounded_and_no_attempt_starts_after_the_deadline() {
    let script = Script::new(std::iter::repeat_n(Step::Hang, 10));
    let policy = RetryPolicy::builder("create_order")
        .max_attempts(10)
        .deadline(Duration::from_secs(12))
        .per_attempt(Duration::from_secs(5))
        .retryable([Retryable::Transport(TransportFailure::Timeout)])
        .build()
        .unwrap()
        .with_backoff(Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(10),
        ));
    let t0 = Instant::now();
    let Outcome::Unknown(unknown) = client(&script)
        .execute(Intent::new(policy), &call())
        .await
        .unwrap()
    else {
        panic!("unknown");
    };
    let sent = script.posts();
    assert_eq!(sent.len(), 3, "5 s + 5 s + the 2 s left");
    assert!(
        sent.iter()
            .all(|(at, _)| *at - t0 < Duration::from_secs(12))
    );
    assert!(Instant::now() - t0 <= Duration::from_secs(12) + Duration::from_millis(1));
    assert!(matches!(
        unknown.last,
        Some(idem_client::LastAttempt::Transport(TransportError::Timeout))
    ));
    assert_eq!(unknown.reason, StopReason::DeadlineReached);
}

#[tokio::test(start_paused = true)]
async fn a_failure_the_contract_does_not_declare_stops_as_unknown() {
    for step in [
        status(500),
        Step::Fail(TransportError::Refused("refused".into())),
    ] {
        let script = Script::new([step, status(201)]);
        let outcome = client(&script)
            .execute(Intent::new(policy()), &call())
            .await
            .unwrap();
        let Outcome::Unknown(unknown) = outcome else {
            panic!("{outcome:?}");
        };
        assert_eq!(unknown.reason, StopReason::NotRetryable);
        assert_eq!(script.posts().len(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_spent_retry_budget_stops_retries_and_the_outcome_says_so() {
    let script = Script::new(std::iter::repeat_n(status(503), 10));
    // gRPC's rule: retries while tokens > max_tokens / 2; 4 tokens allow 1 failure.
    let client = client(&script).with_budget(RetryBudget::new(4, 0.1).unwrap());
    let Outcome::Unknown(first) = client
        .execute(Intent::new(policy()), &call())
        .await
        .unwrap()
    else {
        panic!("unknown");
    };
    assert_eq!(first.reason, StopReason::BudgetExhausted);
    assert_eq!(script.posts().len(), 2);
    // The budget is the client's: the next intent gets no retry either.
    let Outcome::Unknown(second) = client
        .execute(Intent::new(policy()), &call())
        .await
        .unwrap()
    else {
        panic!("unknown");
    };
    assert_eq!(second.attempts, 1);
    assert_ne!(first.key(), second.key(), "a new intent is a new key");
}

#[tokio::test(start_paused = true)]
async fn the_status_lookups_completed_answer_is_the_outcome() {
    let stored = r#"{"operation_id":"op-1","key":"k","state":"completed","attempt":1,"created_at":"x","expires_at":"y","new_key_safe":false,"response":{"status":201,"headers":{"location":"/orders/ord_7","content-type":"application/json"},"body":{"id":"ord_7"}}}"#;
    let script = Script::new(std::iter::repeat_n(status(503), 4)).with_lookup(Step::Answer(
        200,
        vec![("content-type", "application/json")],
        stored,
    ));
    let Outcome::Completed(done) = client(&script)
        .execute(Intent::new(policy()), &call())
        .await
        .unwrap()
    else {
        panic!("completed from the lookup");
    };
    assert!(done.from_lookup && done.replayed);
    assert_eq!(done.status, 201);
    assert_eq!(done.headers["location"], "/orders/ord_7");
    assert_eq!(done.body, Bytes::from_static(br#"{"id":"ord_7"}"#));
    assert_eq!(done.operation_id.as_deref(), Some("op-1"));
}

#[tokio::test(start_paused = true)]
async fn an_unknown_intent_resumes_in_a_new_window_under_its_key() {
    // Window 1: four 503s, then the lookup (404). Window 2: the lookup first (404), then
    // one request, answered.
    let script = Script::new([
        status(503),
        status(503),
        status(503),
        status(503),
        Step::Answer(201, vec![("idempotent-replayed", "true")], "{}"),
    ]);
    let client = client(&script);
    let Outcome::Unknown(unknown) = client
        .execute(Intent::new(policy()), &call())
        .await
        .unwrap()
    else {
        panic!("unknown");
    };
    assert_eq!(unknown.reason, StopReason::AttemptsExhausted);
    assert_eq!(unknown.intent.attempts(), 4);
    let first_get = script.sent().iter().position(|(_, r)| r.method() == "GET");
    assert_eq!(first_get, Some(4), "a new key's window does not ask first");
    let key = unknown.key().clone();
    // Long past the first window's deadline (30 s): the next one has its own.
    tokio::time::sleep(Duration::from_secs(120)).await;
    let t1 = Instant::now();
    let outcome = client.execute(unknown.intent, &call()).await.unwrap();
    let Outcome::Completed(done) = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(done.key, key);
    assert_eq!(done.attempts, 1, "a fresh attempt count");
    assert!(done.replayed && !done.from_lookup);
    let sent = script.sent();
    assert_eq!(sent.len(), 7, "4 POST, GET, then GET, POST");
    assert_eq!(sent[5].1.method(), "GET", "the lookup first");
    assert!(sent[5].0 >= t1);
    assert_eq!(sent[5].1.uri().path(), format!("/orders/operations/{key}"));
    assert_eq!(sent[6].1.method(), "POST");
    assert_eq!(sent[6].1.headers()["idempotency-key"], key.as_str());
}

#[tokio::test(start_paused = true)]
async fn a_resume_whose_lookup_says_completed_does_not_send_again() {
    // The first window's lookup finds nothing; the resume's finds the order.
    let script = Script::new(std::iter::repeat_n(status(503), 4))
        .with_lookup(status(404))
        .with_lookup(report("completed", 0));
    let client = client(&script);
    let Outcome::Unknown(unknown) = client
        .execute(Intent::new(policy()), &call())
        .await
        .unwrap()
    else {
        panic!("unknown");
    };
    let t1 = Instant::now();
    let outcome = client.execute(unknown.intent, &call()).await.unwrap();
    let Outcome::Completed(done) = outcome else {
        panic!("{outcome:?}");
    };
    assert!(done.from_lookup && done.replayed);
    assert_eq!(done.attempts, 0, "nothing sent in this window");
    assert_eq!(done.status, 201);
    assert_eq!(done.body, Bytes::from_static(br#"{"id":"ord_7"}"#));
    assert_eq!(done.operation_id.as_deref(), Some("op-1"));
    assert_eq!(script.posts().len(), 4, "the command was not sent again");
    assert_eq!(script.lookups().len(), 2);
    assert_eq!(Instant::now(), t1, "no wait");
}

#[tokio::test(start_paused = true)]
async fn a_saved_key_resumes_after_a_restart() {
    use idem_client::IdempotencyKey;
    let saved = "0191f6a4-6c1e-7c3a-9d5e-1b2c3d4e5f60";

    // Another attempt holds the key for 3 s more: the first request waits for it.
    let script = Script::new([status(201)]).with_lookup(report("processing", 3));
    let t0 = Instant::now();
    let intent = Intent::resume(policy(), IdempotencyKey::parse(saved).unwrap()).unwrap();
    let outcome = client(&script).execute(intent, &call()).await.unwrap();
    assert!(
        matches!(&outcome, Outcome::Completed(done) if done.attempts == 1 && done.key.as_str() == saved),
        "{outcome:?}"
    );
    let sent = script.sent();
    assert_eq!(sent[0].1.method(), "GET");
    assert_eq!(sent[1].1.headers()["idempotency-key"], saved);
    assert!(
        sent[1].0 - t0 >= Duration::from_secs(3),
        "not before the lease ends"
    );
    assert!(sent[1].0 - t0 < Duration::from_secs(4));

    // Longer than the window (30 s): nothing is sent.
    let script = Script::new([status(201)]).with_lookup(report("processing", 60));
    let intent = Intent::resume(policy(), IdempotencyKey::parse(saved).unwrap()).unwrap();
    let outcome = client(&script).execute(intent, &call()).await.unwrap();
    let Outcome::Unknown(unknown) = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(
        unknown.reason,
        StopReason::RetryAfterBeyondDeadline {
            retry_after: Duration::from_secs(60)
        }
    );
    assert_eq!(unknown.attempts, 0);
    assert!(script.posts().is_empty());
    assert_eq!(
        script.lookups().len(),
        1,
        "its answer stands: not asked twice"
    );

    // The server does not know: a request would be answered 409; none is sent.
    let script = Script::new([status(201)]).with_lookup(report("unknown", 0));
    let intent = Intent::resume(policy(), IdempotencyKey::parse(saved).unwrap()).unwrap();
    let outcome = client(&script).execute(intent, &call()).await.unwrap();
    let Outcome::Unknown(unknown) = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(unknown.reason, StopReason::OutcomeUnknownOnServer);
    assert_eq!((unknown.attempts, unknown.intent.attempts()), (0, 0));
    assert_eq!(unknown.operation_id.as_deref(), Some("op-1"));
    assert!(script.posts().is_empty());

    // Released, or a lookup that fails: sent.
    for lookup in [report("released", 0), status(500)] {
        let script = Script::new([status(201)]).with_lookup(lookup);
        let intent = Intent::resume(policy(), IdempotencyKey::parse(saved).unwrap()).unwrap();
        let outcome = client(&script).execute(intent, &call()).await.unwrap();
        assert!(matches!(outcome, Outcome::Completed(_)), "{outcome:?}");
        assert_eq!(script.posts().len(), 1);
    }

    // Without a status lookup: sent at once.
    let no_lookup = RetryPolicy::builder("create_order")
        .max_attempts(2)
        .deadline(Duration::from_secs(30))
        .build()
        .unwrap();
    let script = Script::new([status(201)]);
    let intent = Intent::resume(no_lookup, IdempotencyKey::parse(saved).unwrap()).unwrap();
    let outcome = client(&script).execute(intent, &call()).await.unwrap();
    assert!(matches!(outcome, Outcome::Completed(_)), "{outcome:?}");
    assert_eq!(script.sent().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_replay_is_flagged_and_the_key_can_go_in_the_body() {
    let script = Script::new([Step::Answer(
        201,
        vec![("idempotent-replayed", "true"), ("operation-id", "op-9")],
        "{}",
    )]);
    let policy: RetryPolicy = serde_json::from_str::<idem_contract::extension::Extension>(
        r#"{"operation": "create_order",
           "key_scope": {"per": "client", "source": {"in": "body", "field": "request.key"}},
           "fingerprint": "body", "ttl": "1d", "deadline": {"total": "30s"}, "max_attempts": 2,
           "retryable": [503], "concurrency": {"response": "conflict", "retry_after": "1s"},
           "status_lookup": {}, "recovery": {"kind": "reconcile"}}"#,
    )
    .map(|e| RetryPolicy::from_extension(&e))
    .unwrap();
    let Outcome::Completed(done) = client(&script)
        .execute(Intent::new(policy), &call())
        .await
        .unwrap()
    else {
        panic!("completed");
    };
    assert!(done.replayed && !done.from_lookup);
    assert_eq!(done.operation_id.as_deref(), Some("op-9"));
    let body: serde_json::Value = serde_json::from_slice(script.posts()[0].1.body()).unwrap();
    assert_eq!(body["request"]["key"], done.key.as_str());
    assert_eq!(body["amount"], 1, "the rest of the body is kept");
    assert!(
        script.posts()[0]
            .1
            .headers()
            .get("idempotency-key")
            .is_none()
    );
}

/// A contract whose retry list lacks 429.
fn policy_without_429() -> RetryPolicy {
    RetryPolicy::builder("create_order")
        .max_attempts(4)
        .deadline(Duration::from_secs(30))
        .per_attempt(Duration::from_secs(5))
        .retryable([Retryable::Status(idem_contract::StatusCode(503))])
        .status_lookup("/orders/operations/{key}")
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_client_budget_429_is_retried_after_its_retry_after_whatever_the_list() {
    let script = Script::new([problem(429, "client-budget-exhausted", "4"), status(201)]);
    let t0 = Instant::now();
    let outcome = client(&script)
        .execute(Intent::new(policy_without_429()), &call())
        .await
        .unwrap();
    assert!(
        matches!(outcome, Outcome::Completed(ref c) if c.attempts == 2),
        "{outcome:?}"
    );
    assert!(script.posts()[1].0 - t0 >= Duration::from_secs(4));
    let key = |i: usize| {
        script.posts()[i]
            .1
            .headers()
            .get("idempotency-key")
            .cloned()
    };
    assert_eq!(key(0), key(1), "the same key");
    assert!(key(0).is_some());
}

#[tokio::test(start_paused = true)]
async fn a_client_budget_429_beyond_the_deadline_stops_at_once() {
    let script = Script::new([problem(429, "client-budget-exhausted", "3600"), status(201)]);
    let Outcome::Unknown(unknown) = client(&script)
        .execute(Intent::new(policy_without_429()), &call())
        .await
        .unwrap()
    else {
        panic!("unknown");
    };
    assert_eq!(
        unknown.reason,
        StopReason::RetryAfterBeyondDeadline {
            retry_after: Duration::from_secs(3600)
        }
    );
    assert_eq!(script.posts().len(), 1);
}
