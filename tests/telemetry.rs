//! Telemetry (`idem::telemetry`, docs/telemetry.md), over real sockets: every request to
//! a contracted handler is one `idem.attempt` span with OpenTelemetry's and idem's
//! attributes, an operation's final state is one `idem.operation.end` event, the counters
//! follow the same outcomes, and no body, key, token, cookie or client identity reaches
//! any span, event or metric.
//!
//! The spans and events are captured by a `tracing_subscriber::Layer` of this file, the
//! metrics by a `metrics::Recorder` of this file, both installed once for the whole
//! binary; each test reads only what its own operation recorded.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use common::answer::{Answer, send};
use common::server::TestServer;
use idem::journal::CallError;
use idem::telemetry;
use idem::{Idem, MemoryStore};
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::{Notify, Semaphore};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};

// ---------------------------------------------------------------------------------------
// What the tests send: values that must never appear in telemetry.

/// In the body.
const BODY_SECRET: &str = "4111-1111-BODY-SECRET";
/// The bearer token the client identity is read from.
const BEARER: &str = "Bearer tok-AUTH-SECRET";
/// A cookie.
const COOKIE: &str = "session=COOKIE-SECRET";
/// The client identity the application derives from the bearer token.
const CLIENT_ID: &str = "customer-IDENTITY-SECRET";
/// A path parameter: the route template is recorded, never the path.
const REGION: &str = "region-PATH-SECRET";

// ---------------------------------------------------------------------------------------
// The captured spans and events.

#[derive(Clone, Debug, Default)]
struct SpanData {
    name: String,
    parent: Option<usize>,
    fields: BTreeMap<String, String>,
    closed: bool,
}

#[derive(Clone, Debug)]
struct EventData {
    name: String,
    span: Option<usize>,
    fields: BTreeMap<String, String>,
}

#[derive(Default)]
struct Captured {
    spans: Mutex<Vec<SpanData>>,
    events: Mutex<Vec<EventData>>,
}

/// The index of a span in [`Captured::spans`] (span ids are reused once closed).
struct Index(usize);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

struct CaptureLayer(Arc<Captured>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for CaptureLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut data = SpanData {
            name: attrs.metadata().name().to_owned(),
            ..SpanData::default()
        };
        attrs.record(&mut Fields(&mut data.fields));
        let span = ctx.span(id).expect("a new span is known");
        data.parent = span
            .parent()
            .and_then(|p| p.extensions().get::<Index>().map(|i| i.0));
        let mut spans = self.0.spans.lock().unwrap();
        span.extensions_mut().insert(Index(spans.len()));
        spans.push(data);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let Some(index) = span.extensions().get::<Index>().map(|i| i.0) else {
            return;
        };
        values.record(&mut Fields(&mut self.0.spans.lock().unwrap()[index].fields));
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let span = ctx
            .event_span(event)
            .and_then(|s| s.extensions().get::<Index>().map(|i| i.0));
        self.0.events.lock().unwrap().push(EventData {
            name: event.metadata().name().to_owned(),
            span,
            fields,
        });
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        if let Some(index) = span.extensions().get::<Index>().map(|i| i.0) {
            self.0.spans.lock().unwrap()[index].closed = true;
        }
    }
}

// ---------------------------------------------------------------------------------------
// The captured metrics.

#[derive(Default)]
struct Samples(Mutex<Vec<f64>>);

impl metrics::HistogramFn for Samples {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

/// A metric's name and labels, sorted: `name{a=1,b=2}`.
fn render(key: &Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

#[derive(Default)]
struct TestRecorder {
    counters: Mutex<HashMap<String, Arc<AtomicU64>>>,
    histograms: Mutex<HashMap<String, Arc<Samples>>>,
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut counters = self.counters.lock().unwrap();
        Counter::from_arc(Arc::clone(counters.entry(render(key)).or_default()))
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let mut histograms = self.histograms.lock().unwrap();
        Histogram::from_arc(Arc::clone(histograms.entry(render(key)).or_default()))
    }
}

struct Installed {
    captured: Arc<Captured>,
    recorder: &'static TestRecorder,
}

/// Installs the capture layer and the recorder, once for the binary.
fn installed() -> &'static Installed {
    static INSTALLED: OnceLock<Installed> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let captured = Arc::new(Captured::default());
        // idem's own spans and events, and this file's (the handlers' logs); not the
        // HTTP libraries' traces.
        let layer =
            CaptureLayer(Arc::clone(&captured)).with_filter(tracing_subscriber::filter::filter_fn(
                |meta| meta.target().starts_with("idem") || meta.target().starts_with("telemetry"),
            ));
        tracing::subscriber::set_global_default(Registry::default().with(layer))
            .expect("the only subscriber of this binary");
        let recorder: &'static TestRecorder = Box::leak(Box::default());
        metrics::set_global_recorder(recorder).expect("the only recorder of this binary");
        telemetry::describe_metrics();
        Installed { captured, recorder }
    })
}

impl Installed {
    /// The attempt spans of `operation`, in the order they opened.
    fn attempts(&self, operation: &str) -> Vec<(usize, SpanData)> {
        self.captured
            .spans
            .lock()
            .unwrap()
            .iter()
            .cloned()
            .enumerate()
            .filter(|(_, s)| {
                s.name == telemetry::SPAN_ATTEMPT
                    && s.fields.get(telemetry::FIELD_OPERATION).map(String::as_str)
                        == Some(operation)
            })
            .collect()
    }

    /// The events named `name` whose operation (their own field, or their span's) is
    /// `operation`.
    fn events(&self, name: &str, operation: &str) -> Vec<EventData> {
        let spans = self.captured.spans.lock().unwrap().clone();
        self.captured
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.name == name)
            .filter(|e| {
                let own = e.fields.get(telemetry::FIELD_OPERATION);
                let of_span = e
                    .span
                    .and_then(|i| spans[i].fields.get(telemetry::FIELD_OPERATION));
                own.or(of_span).map(String::as_str) == Some(operation)
            })
            .cloned()
            .collect()
    }

    fn counter(&self, name: &str, operation: &str, outcome: &str) -> u64 {
        let key = format!("{name}{{operation={operation},outcome={outcome}}}");
        self.recorder
            .counters
            .lock()
            .unwrap()
            .get(&key)
            .map_or(0, |c| c.load(Ordering::SeqCst))
    }

    fn durations(&self, operation: &str, outcome: &str) -> Vec<f64> {
        let key = format!(
            "{}{{operation={operation},outcome={outcome}}}",
            telemetry::METRIC_ATTEMPT_DURATION
        );
        self.recorder
            .histograms
            .lock()
            .unwrap()
            .get(&key)
            .map(|s| s.0.lock().unwrap().clone())
            .unwrap_or_default()
    }

    /// Every string of every captured span, event and metric.
    fn everything(&self) -> Vec<String> {
        let mut all = Vec::new();
        for span in self.captured.spans.lock().unwrap().iter() {
            all.push(span.name.clone());
            all.extend(span.fields.iter().map(|(k, v)| format!("{k}={v}")));
        }
        for event in self.captured.events.lock().unwrap().iter() {
            all.push(event.name.clone());
            all.extend(event.fields.iter().map(|(k, v)| format!("{k}={v}")));
        }
        all.extend(self.recorder.counters.lock().unwrap().keys().cloned());
        all.extend(self.recorder.histograms.lock().unwrap().keys().cloned());
        all
    }

    /// Asserts that no captured string holds a secret the tests sent, the key `key`, or
    /// a UUID other than an operation id (a UUIDv7; an owner token is a UUIDv4).
    fn assert_clean(&self, key: &str) {
        let secrets = [
            BODY_SECRET,
            "BODY-SECRET",
            BEARER,
            "AUTH-SECRET",
            COOKIE,
            "COOKIE-SECRET",
            CLIENT_ID,
            "IDENTITY-SECRET",
            REGION,
            "PATH-SECRET",
            "KEY-SECRET",
            key,
        ];
        for text in self.everything() {
            for secret in secrets {
                assert!(!text.contains(secret), "telemetry holds `{secret}`: {text}");
            }
            for uuid in uuids(&text) {
                assert!(
                    is_v7(&uuid),
                    "telemetry holds a UUID that is no operation id (an owner token?): {text}"
                );
            }
            assert!(
                !text
                    .split(|c: char| !c.is_ascii_digit())
                    .any(|run| run.len() >= 20),
                "telemetry holds a long number (a token as an integer?): {text}"
            );
        }
    }
}

/// The hyphenated UUIDs in `text`.
fn uuids(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i + 36 <= bytes.len() {
        let candidate = &text[i..i + 36];
        let shaped = candidate.char_indices().all(|(at, c)| match at {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        });
        if shaped {
            found.push(candidate.to_owned());
            i += 36;
        } else {
            i += 1;
        }
    }
    found
}

/// Whether a hyphenated UUID is a version 7 (an operation id is; an owner token is 4).
fn is_v7(uuid: &str) -> bool {
    uuid.as_bytes()[14] == b'7'
}

// ---------------------------------------------------------------------------------------
// The service.

/// The client's identity, from its bearer token (as an application would: the token
/// names the customer).
#[allow(
    clippy::result_large_err,
    reason = "the shape of a client identity: a response is what it refuses with"
)]
fn identity(parts: &Parts) -> Result<String, axum::response::Response> {
    match parts.headers.get("authorization").map(|v| v.to_str()) {
        Some(Ok(BEARER)) => Ok(CLIENT_ID.to_owned()),
        _ => Err(StatusCode::UNAUTHORIZED.into_response()),
    }
}

#[derive(Clone)]
struct App {
    /// Handlers of `create_slow_order` say they have begun, then wait for a permit.
    entered: Arc<Notify>,
    gate: Arc<Semaphore>,
    /// `create_flaky_order` answers 503 once, then 201.
    failed_once: Arc<AtomicBool>,
}

impl Default for App {
    fn default() -> App {
        App {
            entered: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
            failed_once: Arc::default(),
        }
    }
}

#[derive(Deserialize)]
struct CreateOrder {
    amount: i64,
    #[allow(dead_code, reason = "significant content that telemetry must not show")]
    card: String,
}

#[idem::contract(
    key_scope = client,
    fingerprint = [amount, card],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status(path = "/orders/operations/{key}"),
    recovery = manual("https://runbooks.example.com/orders"),
)]
async fn create_order(
    Path(region): Path<String>,
    Json(order): Json<CreateOrder>,
) -> impl IntoResponse {
    tracing::info!("creating an order");
    let _ = region;
    (
        StatusCode::CREATED,
        Json(json!({ "amount": order.amount, "card": BODY_SECRET })),
    )
}

#[idem::contract(
    key_scope = client,
    fingerprint = [amount, card],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status(path = "/orders/operations/{key}"),
    recovery = manual("https://runbooks.example.com/orders"),
)]
async fn create_slow_order(
    State(app): State<App>,
    Json(order): Json<CreateOrder>,
) -> impl IntoResponse {
    app.entered.notify_one();
    app.gate
        .acquire()
        .await
        .expect("the gate stays open")
        .forget();
    (StatusCode::CREATED, Json(json!({ "amount": order.amount })))
}

#[idem::contract(
    key_scope = client,
    fingerprint = [amount, card],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status(path = "/orders/operations/{key}"),
    recovery = manual("https://runbooks.example.com/orders"),
)]
async fn create_flaky_order(
    State(app): State<App>,
    Json(order): Json<CreateOrder>,
) -> impl IntoResponse {
    if !app.failed_once.swap(true, Ordering::SeqCst) {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    (StatusCode::CREATED, Json(json!({ "amount": order.amount }))).into_response()
}

#[idem::contract(
    key_scope = client,
    fingerprint = [amount, card],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status(path = "/orders/operations/{key}"),
    recovery = manual("https://runbooks.example.com/orders"),
)]
async fn create_crashing_order(Json(order): Json<CreateOrder>) -> StatusCode {
    if order.amount > 0 {
        panic!("the handler dies between its effect and its answer");
    }
    StatusCode::CREATED
}

async fn order_status(
    lookup: idem::Lookup<create_order::Operation>,
    Path(key): Path<String>,
) -> idem::OperationStatus {
    lookup.status(&key).await
}

async fn start(app: App) -> TestServer {
    let idem = Idem::new(MemoryStore::new(), identity);
    let router = Router::new()
        .route("/orders/{region}", post(create_order))
        .route("/slow-orders", post(create_slow_order))
        .route("/flaky-orders", post(create_flaky_order))
        .route("/crashing-orders", post(create_crashing_order))
        .route("/orders/operations/{key}", axum::routing::get(order_status))
        .with_state(app)
        .layer(idem.layer());
    TestServer::start(router).await
}

async fn post_order(server: &TestServer, path: &str, key: Option<&str>, amount: i64) -> Answer {
    let mut request = server
        .http
        .post(server.url(path))
        .header("authorization", BEARER)
        .header("cookie", COOKIE)
        .json(&json!({ "amount": amount, "card": BODY_SECRET }));
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    send(request).await
}

fn field<'a>(span: &'a SpanData, name: &str) -> Option<&'a str> {
    span.fields.get(name).map(String::as_str)
}

// ---------------------------------------------------------------------------------------

/// The Monday test's trace (proof 4, docs/conformance.md): the answer to the first attempt is lost, the
/// client sends the same request with the same key, and the trace shows both physical
/// attempts, linked by the operation id, and one final outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_attempts_and_one_final_outcome() {
    let telemetry = installed();
    let server = start(App::default()).await;
    let key = "key-KEY-SECRET-resend";
    let path = format!("/orders/{REGION}");

    let first = post_order(&server, &path, Some(key), 7).await;
    assert_eq!(first.status, 201);
    let second = post_order(&server, &path, Some(key), 7).await;
    assert_eq!(second.status, 201);
    assert!(second.replayed());
    let id = first.operation_id();
    assert_eq!(second.operation_id(), id);
    server.stop().await;

    let attempts = telemetry.attempts("create_order");
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    let (first_index, first_span) = &attempts[0];
    let (_, second_span) = &attempts[1];
    for span in [first_span, second_span] {
        assert!(span.closed, "{span:?}");
        assert_eq!(field(span, telemetry::FIELD_OPERATION_ID), Some(id));
        assert_eq!(
            field(span, telemetry::FIELD_ROUTE),
            Some("/orders/{region}")
        );
        assert_eq!(field(span, telemetry::FIELD_METHOD), Some("POST"));
        assert_eq!(field(span, telemetry::FIELD_STATUS_CODE), Some("201"));
        assert_eq!(field(span, telemetry::FIELD_ERROR_TYPE), None);
    }
    assert_eq!(field(first_span, telemetry::FIELD_ATTEMPT), Some("1"));
    assert_eq!(field(first_span, telemetry::FIELD_RESEND_COUNT), None);
    assert_eq!(
        field(first_span, telemetry::FIELD_OUTCOME),
        Some("executed")
    );
    assert_eq!(field(second_span, telemetry::FIELD_ATTEMPT), Some("2"));
    assert_eq!(field(second_span, telemetry::FIELD_RESEND_COUNT), Some("1"));
    assert_eq!(
        field(second_span, telemetry::FIELD_OUTCOME),
        Some("replayed")
    );

    // The handler's own log is a child of its attempt.
    let handler_logs: Vec<_> = telemetry
        .captured
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.fields.get("message").map(String::as_str) == Some("creating an order"))
        .cloned()
        .collect();
    assert_eq!(handler_logs.len(), 1, "the handler ran once");
    assert_eq!(handler_logs[0].span, Some(*first_index));

    // One end event per attempt, one final outcome.
    let ends = telemetry.events(telemetry::EVENT_ATTEMPT_END, "create_order");
    let outcomes: Vec<_> = ends
        .iter()
        .map(|e| e.fields[telemetry::FIELD_OUTCOME].as_str())
        .collect();
    assert_eq!(outcomes, ["executed", "replayed"]);
    let finals = telemetry.events(telemetry::EVENT_OPERATION_END, "create_order");
    assert_eq!(finals.len(), 1, "{finals:#?}");
    assert_eq!(
        finals[0].fields[telemetry::FIELD_OPERATION_OUTCOME],
        "completed"
    );
    assert_eq!(finals[0].fields[telemetry::FIELD_OPERATION_ID], id);
    assert_eq!(finals[0].fields[telemetry::FIELD_ATTEMPT], "1");

    // The counters.
    let count = |outcome| telemetry.counter(telemetry::METRIC_ATTEMPTS, "create_order", outcome);
    assert_eq!((count("executed"), count("replayed")), (1, 1));
    assert_eq!(
        telemetry.counter(telemetry::METRIC_OPERATIONS, "create_order", "completed"),
        1
    );
    assert_eq!(telemetry.durations("create_order", "executed").len(), 1);
    assert_eq!(telemetry.durations("create_order", "replayed").len(), 1);

    telemetry.assert_clean(key);
}

/// A duplicate while the first attempt runs is a `conflict`, the key with other content a
/// `mismatch`; each is its own attempt of the one operation, with its error class, and
/// the operation still has one final outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflict_and_mismatch_are_attempts_with_their_error_class() {
    let telemetry = installed();
    let app = App::default();
    let server = Arc::new(start(app.clone()).await);
    let key = "key-KEY-SECRET-conflict";

    let running = {
        let server = Arc::clone(&server);
        tokio::spawn(async move { post_order(&server, "/slow-orders", Some(key), 1).await })
    };
    // The first attempt holds the key once its handler runs.
    app.entered.notified().await;
    let conflict = post_order(&server, "/slow-orders", Some(key), 1).await;
    conflict.problem(409, "operation-in-progress");
    let mismatch = post_order(&server, "/slow-orders", Some(key), 2).await;
    mismatch.problem(422, "fingerprint-mismatch");
    app.gate.add_permits(1);
    let first = running.await.unwrap();
    assert_eq!(first.status, 201);
    let id = first.operation_id();
    assert_eq!(conflict.operation_id(), id);
    assert_eq!(mismatch.operation_id(), id);

    let count =
        |outcome| telemetry.counter(telemetry::METRIC_ATTEMPTS, "create_slow_order", outcome);
    assert_eq!(count("executed"), 1);
    assert_eq!(count("conflict"), 1);
    assert_eq!(count("mismatch"), 1);
    assert_eq!(
        telemetry.counter(
            telemetry::METRIC_OPERATIONS,
            "create_slow_order",
            "completed"
        ),
        1
    );

    let attempts = telemetry.attempts("create_slow_order");
    let by_outcome = |outcome: &str| {
        attempts
            .iter()
            .map(|(_, s)| s)
            .find(|s| field(s, telemetry::FIELD_OUTCOME) == Some(outcome))
            .unwrap_or_else(|| panic!("no `{outcome}` attempt: {attempts:#?}"))
            .clone()
    };
    let conflict_span = by_outcome("conflict");
    assert_eq!(
        field(&conflict_span, telemetry::FIELD_STATUS_CODE),
        Some("409")
    );
    assert_eq!(
        field(&conflict_span, telemetry::FIELD_ERROR_TYPE),
        Some("operation-in-progress")
    );
    assert_eq!(
        field(&conflict_span, telemetry::FIELD_OPERATION_ID),
        Some(id)
    );
    assert_eq!(
        field(&conflict_span, telemetry::FIELD_RESEND_COUNT),
        Some("1")
    );
    let mismatch_span = by_outcome("mismatch");
    assert_eq!(
        field(&mismatch_span, telemetry::FIELD_STATUS_CODE),
        Some("422")
    );
    assert_eq!(
        field(&mismatch_span, telemetry::FIELD_ERROR_TYPE),
        Some("fingerprint-mismatch")
    );
    assert_eq!(
        field(&mismatch_span, telemetry::FIELD_OPERATION_ID),
        Some(id)
    );
    let executed = by_outcome("executed");
    assert_eq!(field(&executed, telemetry::FIELD_ERROR_TYPE), None);
    assert_eq!(
        telemetry
            .events(telemetry::EVENT_OPERATION_END, "create_slow_order")
            .len(),
        1
    );

    Arc::into_inner(server)
        .expect("the requests are done")
        .stop()
        .await;
    telemetry.assert_clean(key);
}

/// A retryable status releases the key (`released`, not final); the retry is attempt 2
/// of the same operation and completes it. A request without a key is `rejected`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_attempt_then_the_retry_and_a_rejection() {
    let telemetry = installed();
    let server = start(App::default()).await;
    let key = "key-KEY-SECRET-released";

    let failed = post_order(&server, "/flaky-orders", Some(key), 3).await;
    assert_eq!(failed.status, 503);
    let retried = post_order(&server, "/flaky-orders", Some(key), 3).await;
    assert_eq!(retried.status, 201);
    let missing = post_order(&server, "/flaky-orders", None, 3).await;
    missing.problem(400, "key-missing");
    server.stop().await;

    let attempts = telemetry.attempts("create_flaky_order");
    assert_eq!(attempts.len(), 3, "{attempts:#?}");
    let [released, executed, rejected] = [&attempts[0].1, &attempts[1].1, &attempts[2].1];
    assert_eq!(field(released, telemetry::FIELD_OUTCOME), Some("released"));
    assert_eq!(field(released, telemetry::FIELD_ERROR_TYPE), Some("503"));
    assert_eq!(field(released, telemetry::FIELD_ATTEMPT), Some("1"));
    assert_eq!(field(executed, telemetry::FIELD_OUTCOME), Some("executed"));
    assert_eq!(field(executed, telemetry::FIELD_ATTEMPT), Some("2"));
    assert_eq!(field(executed, telemetry::FIELD_RESEND_COUNT), Some("1"));
    assert_eq!(
        field(released, telemetry::FIELD_OPERATION_ID),
        field(executed, telemetry::FIELD_OPERATION_ID)
    );
    assert_eq!(field(rejected, telemetry::FIELD_OUTCOME), Some("rejected"));
    assert_eq!(
        field(rejected, telemetry::FIELD_ERROR_TYPE),
        Some("key-missing")
    );
    assert_eq!(field(rejected, telemetry::FIELD_ATTEMPT), None);

    let count =
        |outcome| telemetry.counter(telemetry::METRIC_ATTEMPTS, "create_flaky_order", outcome);
    assert_eq!(
        (count("released"), count("executed"), count("rejected")),
        (1, 1, 1)
    );
    let finals = telemetry.events(telemetry::EVENT_OPERATION_END, "create_flaky_order");
    assert_eq!(
        finals.len(),
        1,
        "a released key is no final state: {finals:#?}"
    );
    assert_eq!(finals[0].fields[telemetry::FIELD_ATTEMPT], "2");

    telemetry.assert_clean(key);
}

/// An attempt that dies is `unknown` (not final); the retry recovers it, and manual
/// recovery parks it: `parked`, the operation's one final outcome; a later request is
/// `awaiting_operator`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_is_parked_once() {
    let telemetry = installed();
    let server = start(App::default()).await;
    let key = "key-KEY-SECRET-crash";

    let died = post_order(&server, "/crashing-orders", Some(key), 5).await;
    died.problem(503, "attempt-failed");
    let parked = post_order(&server, "/crashing-orders", Some(key), 5).await;
    parked.problem(409, "operation-outcome-unknown");
    let again = post_order(&server, "/crashing-orders", Some(key), 5).await;
    again.problem(409, "operation-outcome-unknown");
    server.stop().await;
    let id = died.operation_id();
    assert_eq!(parked.operation_id(), id);

    let attempts = telemetry.attempts("create_crashing_order");
    let outcomes: Vec<_> = attempts
        .iter()
        .map(|(_, s)| {
            (
                field(s, telemetry::FIELD_OUTCOME),
                field(s, telemetry::FIELD_ERROR_TYPE),
                field(s, telemetry::FIELD_ATTEMPT),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            (Some("unknown"), Some("attempt-failed"), Some("1")),
            (Some("parked"), Some("operation-outcome-unknown"), Some("2")),
            (
                Some("awaiting_operator"),
                Some("operation-outcome-unknown"),
                Some("3")
            ),
        ]
    );
    for (_, span) in &attempts {
        assert_eq!(field(span, telemetry::FIELD_OPERATION_ID), Some(id));
    }
    let finals = telemetry.events(telemetry::EVENT_OPERATION_END, "create_crashing_order");
    assert_eq!(finals.len(), 1, "{finals:#?}");
    assert_eq!(
        finals[0].fields[telemetry::FIELD_OPERATION_OUTCOME],
        "parked"
    );
    assert_eq!(finals[0].fields[telemetry::FIELD_OPERATION_ID], id);
    // Recovery ran within the retry's attempt, and said so there.
    assert_eq!(finals[0].span, Some(attempts[1].0));
    assert_eq!(
        telemetry.counter(
            telemetry::METRIC_OPERATIONS,
            "create_crashing_order",
            "parked"
        ),
        1
    );
    let count =
        |outcome| telemetry.counter(telemetry::METRIC_ATTEMPTS, "create_crashing_order", outcome);
    assert_eq!(
        (
            count("unknown"),
            count("parked"),
            count("awaiting_operator")
        ),
        (1, 1, 1)
    );
    telemetry.assert_clean(key);
}

#[derive(Deserialize)]
struct TxOrder {
    amount: i64,
    /// What the handler does after its write (not significant: a retry may differ).
    #[serde(default)]
    mode: String,
}

#[idem::contract(
    key_scope = client,
    fingerprint = [amount],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status(path = "/orders/operations/{key}"),
    recovery = manual("https://runbooks.example.com/orders"),
)]
async fn create_tx_order(
    attempt: idem::Attempt,
    tx: idem::SqliteTx,
    Json(order): Json<TxOrder>,
) -> axum::response::Response {
    {
        let mut conn = tx.conn().await.expect("the attempt's transaction");
        sqlx::query("INSERT INTO orders (operation_id, amount) VALUES (?, ?)")
            .bind(attempt.operation_id.to_string())
            .bind(order.amount)
            .execute(&mut *conn)
            .await
            .expect("the business write");
    }
    match order.mode.as_str() {
        "503" => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        "500" => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        "panic" => panic!("the handler fails after its write"),
        _ => StatusCode::CREATED.into_response(),
    }
}

/// The transactional mode: a retryable status is `released`, a 5xx or a panic
/// `rolled_back` (nothing took effect, no final state), the commit `executed`, once final.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transactional_mode_releases_rolls_back_and_commits() {
    let telemetry = installed();
    let dir = tempfile::tempdir().unwrap();
    let store = idem::SqliteStore::open(dir.path().join("orders.db"))
        .await
        .unwrap();
    sqlx::query("CREATE TABLE orders (operation_id TEXT PRIMARY KEY, amount BIGINT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let idem = Idem::transactional(store, identity);
    let router = Router::new()
        .route("/tx-orders", post(create_tx_order))
        .layer(idem.layer());
    let server = TestServer::start(router).await;
    let send_tx = |key: &'static str, mode: &'static str| {
        let request = server
            .http
            .post(server.url("/tx-orders"))
            .header("authorization", BEARER)
            .header("cookie", COOKIE)
            .header("idempotency-key", key)
            .json(&json!({ "amount": 9, "mode": mode }));
        send(request)
    };
    assert_eq!(send_tx("key-KEY-SECRET-tx-a", "503").await.status, 503);
    assert_eq!(send_tx("key-KEY-SECRET-tx-a", "ok").await.status, 201);
    assert_eq!(send_tx("key-KEY-SECRET-tx-b", "500").await.status, 500);
    send_tx("key-KEY-SECRET-tx-b", "panic")
        .await
        .problem(503, "attempt-rolled-back");
    server.stop().await;

    let attempts = telemetry.attempts("create_tx_order");
    let outcomes: Vec<_> = attempts
        .iter()
        .map(|(_, s)| {
            (
                field(s, telemetry::FIELD_OUTCOME),
                field(s, telemetry::FIELD_ERROR_TYPE),
                field(s, telemetry::FIELD_ATTEMPT),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            (Some("released"), Some("503"), Some("1")),
            (Some("executed"), None, Some("2")),
            (Some("rolled_back"), Some("500"), Some("1")),
            (Some("rolled_back"), Some("attempt-rolled-back"), Some("2")),
        ]
    );
    let finals = telemetry.events(telemetry::EVENT_OPERATION_END, "create_tx_order");
    assert_eq!(finals.len(), 1, "only the commit is final: {finals:#?}");
    assert_eq!(finals[0].fields[telemetry::FIELD_ATTEMPT], "2");
    let count = |outcome| telemetry.counter(telemetry::METRIC_ATTEMPTS, "create_tx_order", outcome);
    assert_eq!(
        (count("released"), count("executed"), count("rolled_back")),
        (1, 1, 2)
    );
    telemetry.assert_clean("key-KEY-SECRET-tx-a");
}

#[idem::contract(
    key_scope = client,
    fingerprint = [amount, card],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status(path = "/orders/operations/{key}"),
    recovery = manual("https://runbooks.example.com/orders"),
)]
async fn create_large_order(Json(order): Json<CreateOrder>) -> impl IntoResponse {
    (StatusCode::CREATED, "x".repeat(order.amount as usize))
}

/// A result too large to keep goes out as it is and is recorded: `executed`, no
/// `error.type`, the one final outcome `completed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_too_large_to_keep_is_recorded() {
    let telemetry = installed();
    let idem = Idem::builder(MemoryStore::new(), identity)
        .max_stored_body(16)
        .build();
    let router = Router::new()
        .route("/large-orders", post(create_large_order))
        .layer(idem.layer());
    let server = TestServer::start(router).await;
    let key = "key-KEY-SECRET-large";
    let sent = post_order(&server, "/large-orders", Some(key), 64).await;
    assert_eq!((sent.status, sent.body.len()), (201, 64));
    server.stop().await;

    let attempts = telemetry.attempts("create_large_order");
    assert_eq!(attempts.len(), 1, "{attempts:#?}");
    let span = &attempts[0].1;
    assert_eq!(field(span, telemetry::FIELD_OUTCOME), Some("executed"));
    assert_eq!(field(span, telemetry::FIELD_ERROR_TYPE), None);
    assert_eq!(field(span, telemetry::FIELD_STATUS_CODE), Some("201"));
    let finals = telemetry.events(telemetry::EVENT_OPERATION_END, "create_large_order");
    assert_eq!(finals.len(), 1, "{finals:#?}");
    assert_eq!(
        finals[0].fields[telemetry::FIELD_OPERATION_OUTCOME],
        "completed"
    );
    telemetry.assert_clean(key);
}

// ---------------------------------------------------------------------------------------

#[derive(Serialize, Deserialize)]
struct Charged {
    card: String,
}

#[idem::contract(
    key_scope = client,
    fingerprint = [amount, card],
    ttl = "1h",
    deadline = "10s",
    max_attempts = 4,
    retryable = [503],
    concurrency = conflict,
    status_lookup = order_status(path = "/orders/operations/{key}"),
    recovery = resume,
)]
async fn create_charged_order(
    mut journal: idem::Journal,
    Json(order): Json<CreateOrder>,
) -> impl IntoResponse {
    let card = order.card.clone();
    let charged = journal
        .step("charge", |_key| async move {
            Ok::<_, CallError<Charged>>(Charged { card })
        })
        .await;
    match charged {
        Ok(_) => (StatusCode::CREATED, Json(json!({ "amount": order.amount }))).into_response(),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// A journal step is one `idem.step` span inside its attempt's span, with the step's
/// name, position and call number, and never its value (here the card, a secret).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_is_a_span_without_its_value() {
    let telemetry = installed();
    let idem = Idem::new(MemoryStore::new(), identity);
    let router = Router::new()
        .route("/charged-orders", post(create_charged_order))
        .layer(idem.layer());
    let server = TestServer::start(router).await;
    let key = "key-KEY-SECRET-step";
    let sent = post_order(&server, "/charged-orders", Some(key), 5).await;
    assert_eq!(sent.status, 201);
    server.stop().await;

    let attempts = telemetry.attempts("create_charged_order");
    assert_eq!(attempts.len(), 1, "{attempts:#?}");
    let (attempt_index, _) = attempts[0];
    let steps: Vec<SpanData> = telemetry
        .captured
        .spans
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.name == telemetry::SPAN_STEP)
        .filter(|s| s.parent == Some(attempt_index))
        .cloned()
        .collect();
    assert_eq!(steps.len(), 1, "one step span inside the attempt's");
    let step = &steps[0];
    assert_eq!(field(step, telemetry::FIELD_STEP_NAME), Some("charge"));
    assert_eq!(field(step, telemetry::FIELD_STEP_INDEX), Some("0"));
    assert_eq!(field(step, telemetry::FIELD_STEP_CALL), Some("1"));
    assert_eq!(
        field(step, telemetry::FIELD_OPERATION_ID),
        sent.header("operation-id")
    );
    telemetry.assert_clean(key);
}
