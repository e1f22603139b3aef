//! The retry loop against a scripted transport, on tokio's paused clock: every delay is
//! exact and no test sleeps for real.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use tokio::time::Instant;

use idem_client::transport::SendFuture;
use idem_client::{
    Answer, Backoff, Call, Client, Intent, Jitter, LookupAnswer, Outcome, RetryBudget, RetryPolicy,
    StopReason, Transport, TransportError,
};
use idem_contract::{Retryable, StatusCode as Status, TransportFailure};

/// One scripted step.
#[derive(Clone)]
enum Step {
    Answer(u16, Vec<(&'static str, &'static str)>, &'static str),
    Fail(TransportError),
    Hang,
}

fn status(code: u16) -> Step {
    Step::Answer(code, vec![], "")
}

fn with_retry_after(code: u16, seconds: &'static str) -> Step {
    Step::Answer(code, vec![("retry-after", seconds)], "")
}

fn problem(code: u16, slug: &'static str, retry_after: &'static str) -> Step {
    let body: &'static str = Box::leak(
        format!(
            r#"{{"type":"tag:idem.rs,2026:problem:{slug}","status":{code},"new_key_safe":false}}"#
        )
        .into_boxed_str(),
    );
    Step::Answer(
        code,
        vec![
            ("content-type", "application/problem+json"),
            ("retry-after", retry_after),
        ],
        body,
    )
}

/// A request as sent, and when.
type Sent = (Instant, Request<Bytes>);

/// Answers from a script, and records what was sent and when.
#[derive(Clone, Default)]
struct Script {
    steps: Arc<Mutex<VecDeque<Step>>>,
    lookup: Arc<Mutex<Option<Step>>>,
    sent: Arc<Mutex<Vec<Sent>>>,
}

impl Script {
    fn new(steps: impl IntoIterator<Item = Step>) -> Script {
        let script = Script::default();
        script.steps.lock().unwrap().extend(steps);
        script
    }

    fn with_lookup(self, step: Step) -> Script {
        *self.lookup.lock().unwrap() = Some(step);
        self
    }

    fn sent(&self) -> Vec<Sent> {
        self.sent.lock().unwrap().clone()
    }

    /// The business requests sent (the status lookup's `GET` left out).
    fn posts(&self) -> Vec<Sent> {
        self.sent()
            .into_iter()
            .filter(|(_, r)| r.method() == http::Method::POST)
            .collect()
    }
}

impl Transport for Script {
    fn send(&self, request: Request<Bytes>) -> SendFuture<'_> {
        let lookup = request.method() == http::Method::GET;
        self.sent.lock().unwrap().push((Instant::now(), request));
        let step = if lookup {
            self.lookup.lock().unwrap().clone().unwrap_or(status(404))
        } else {
            self.steps
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(status(500))
        };
        Box::pin(async move {
            match step {
                Step::Answer(code, headers, body) => {
                    let mut map = HeaderMap::new();
                    for (name, value) in headers {
                        map.insert(name, HeaderValue::from_static(value));
                    }
                    Ok(Answer {
                        status: StatusCode::from_u16(code).unwrap(),
                        headers: map,
                        body: Bytes::from_static(body.as_bytes()),
                    })
                }
                Step::Fail(error) => Err(error),
                Step::Hang => std::future::pending().await,
            }
        })
    }
}

fn policy() -> RetryPolicy {
    RetryPolicy::builder("create_order")
        .max_attempts(4)
        .deadline(Duration::from_secs(30))
        .per_attempt(Duration::from_secs(5))
        .retryable([
            Retryable::Status(Status(429)),
            Retryable::Status(Status(503)),
            Retryable::Transport(TransportFailure::Timeout),
            Retryable::Transport(TransportFailure::ConnectionReset),
        ])
        .status_lookup("/orders/operations/{key}")
        .build()
        .unwrap()
        .with_backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_secs(1),
        ))
}

fn call() -> Call {
    Call::post_json(
        "http://127.0.0.1:1/orders",
        &serde_json::json!({"amount": 1}),
    )
    .unwrap()
    .header("x-client-id", "acme")
    .unwrap()
}

fn client(script: &Script) -> Client<Script> {
    Client::with_transport(script.clone())
        .with_budget(RetryBudget::unlimited())
        .with_jitter(Jitter::seeded(7))
}

#[tokio::test(start_paused = true)]
async fn a_429_is_retried_after_its_retry_after_with_the_same_key() {
    let script = Script::new([with_retry_after(429, "2"), status(201)]);
    let t0 = Instant::now();
    let Outcome::Completed(done) = client(&script)
        .execute(Intent::new(policy()), &call())
        .await
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
    let outcome = client(&script).execute(Intent::new(policy), &call()).await;
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
            .await;
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
        .await;
    assert!(
        matches!(outcome, Outcome::Completed(ref c) if c.attempts == 2),
        "{outcome:?}"
    );
    assert!(script.posts()[1].0 - t0 >= Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn an_outcome_the_server_does_not_know_stops_and_says_so() {
    let script = Script::new([problem(409, "operation-outcome-unknown", "1"), status(201)]);
    let Outcome::Unknown(unknown) = client(&script)
        .execute(Intent::new(policy()), &call())
        .await
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
    let Outcome::Unknown(unknown) = client(&script).execute(Intent::new(policy), &call()).await
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
            .await;
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
    let Outcome::Unknown(first) = client.execute(Intent::new(policy()), &call()).await else {
        panic!("unknown");
    };
    assert_eq!(first.reason, StopReason::BudgetExhausted);
    assert_eq!(script.posts().len(), 2);
    // The budget is the client's: the next intent gets no retry either.
    let Outcome::Unknown(second) = client.execute(Intent::new(policy()), &call()).await else {
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
async fn an_unknown_intent_resumes_with_its_key_and_its_deadline() {
    let script = Script::new([
        status(503),
        status(503),
        status(503),
        status(503),
        Step::Answer(201, vec![("idempotent-replayed", "true")], "{}"),
    ]);
    let client = client(&script);
    let Outcome::Unknown(unknown) = client.execute(Intent::new(policy()), &call()).await else {
        panic!("unknown");
    };
    let key = unknown.key().clone();
    // All attempts are spent: resuming asks nothing more of the server's operation.
    let again = client.execute(unknown.intent, &call()).await;
    let Outcome::Unknown(again) = again else {
        panic!("{again:?}");
    };
    assert_eq!(again.key(), &key);
    assert_eq!(again.reason, StopReason::AttemptsExhausted);
    assert_eq!(script.posts().len(), 4);
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
    let Outcome::Completed(done) = client(&script).execute(Intent::new(policy), &call()).await
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

/// A span's fields, by name, as text.
type FieldList = Vec<(String, String)>;

/// The spans a test saw: name and fields.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<(String, FieldList)>>>);

struct Fields<'a>(&'a mut Vec<(String, String)>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
}

impl<S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>>
    tracing_subscriber::Layer<S> for Spans
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = Vec::new();
        attrs.record(&mut Fields(&mut fields));
        let mut spans = self.0.lock().unwrap();
        spans.push((
            format!("{}#{}", attrs.metadata().name(), id.into_u64()),
            fields,
        ));
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut spans = self.0.lock().unwrap();
        let suffix = format!("#{}", id.into_u64());
        if let Some((_, fields)) = spans
            .iter_mut()
            .rev()
            .find(|(name, _)| name.ends_with(&suffix))
        {
            values.record(&mut Fields(fields));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn spans_tell_the_operation_from_its_attempts_and_hold_no_secrets() {
    use tracing_subscriber::layer::SubscriberExt;
    let spans = Spans::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let script = Script::new([
        status(503),
        Step::Answer(
            201,
            vec![("operation-id", "op-5")],
            r#"{"card":"4242424242424242"}"#,
        ),
    ]);
    let call = Call::post_json(
        "http://127.0.0.1:1/orders",
        &serde_json::json!({"card": "4242424242424242"}),
    )
    .unwrap()
    .header("authorization", "Bearer s3cret-token")
    .unwrap()
    .header("cookie", "session=c00kie")
    .unwrap();
    let outcome = client(&script).execute(Intent::new(policy()), &call).await;
    assert!(matches!(outcome, Outcome::Completed(_)));
    let spans = spans.0.lock().unwrap().clone();
    let named = |name: &str| -> Vec<FieldList> {
        spans
            .iter()
            .filter(|(n, _)| n.starts_with(&format!("{name}#")))
            .map(|(_, f)| f.clone())
            .collect()
    };
    let field = |fields: &[(String, String)], name: &str| {
        fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let operations = named("idem.operation");
    assert_eq!(operations.len(), 1, "one span for the business operation");
    assert_eq!(
        field(&operations[0], "idem.outcome").as_deref(),
        Some("\"completed\"")
    );
    assert_eq!(field(&operations[0], "idem.attempts").as_deref(), Some("2"));
    assert_eq!(
        field(&operations[0], "idem.operation_id").as_deref(),
        Some("\"op-5\"")
    );
    let attempts = named("idem.attempt");
    assert_eq!(attempts.len(), 2, "one span per attempt");
    assert_eq!(
        field(&attempts[0], "http.request.resend_count"),
        None,
        "absent on the first"
    );
    assert_eq!(
        field(&attempts[1], "http.request.resend_count").as_deref(),
        Some("1")
    );
    assert_eq!(
        field(&attempts[0], "http.response.status_code").as_deref(),
        Some("503")
    );
    let everything = format!("{spans:?}");
    for secret in ["4242424242424242", "s3cret-token", "c00kie"] {
        assert!(
            !everything.contains(secret),
            "{secret} leaked into spans: {everything}"
        );
    }
}
