//! The Monday test's own tests: the harness against a correct idem
//! service, against hand-written services (one that keeps the rules, three that break
//! one each, which must fail exactly the proofs they break), the ready-made checks of
//! proofs 4 (a trace capture) and 5 (the store's operator calls) passing and failing,
//! and its bad configurations. Services it must not blame: one that ignores the
//! test-fault header (or one of its values), one that correlates answers by another
//! header, one whose keys live in a cookie session; and one whose status lookup does not
//! answer where it is asked. Real sockets on 127.0.0.1.
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idem_contract::*;
use idem_runtime::enforce::{Contracted, Enforced};
use idem_runtime::recovery::{Decision, Recover, Recoverer, UnknownOperation};
use idem_runtime::store::{
    Inspection, MemoryStore, Record, RecordKey, Resolution, Store, StoreError, UnixMillis,
};
use idem_runtime::{Idem, identity};
use idem_testing::{
    Harness, HarnessError, OperatorCheck, Proof, Report, Request, Scenario, TraceCapture, Verdict,
};
use tokio::time::Instant;

/// How long the business effect takes: long enough for concurrent requests to overlap.
const EFFECT_TAKES: Duration = Duration::from_millis(150);

fn harness(router: Router, effects: Arc<AtomicU64>) -> Harness {
    Harness::for_router(router)
        .request(Request::post_json("/orders", r#"{"amount":1250}"#))
        .client_header("x-client-id", "cus_42")
        .recovery_within(Duration::from_secs(3))
        .count_effects(move || {
            let effects = Arc::clone(&effects);
            async move { Ok::<_, std::convert::Infallible>(effects.load(Ordering::SeqCst)) }
        })
}

fn failures(report: &Report) -> Vec<(Scenario, Proof)> {
    let mut failed = report.failures();
    failed.sort();
    failed
}

// ----- a correct idem service (memory store, reconcile by operation id) -----

const CONTRACT: Contract = Contract {
    operation: Cow::Borrowed("create_order"),
    key_scope: KeyScope::CLIENT,
    fingerprint: Fingerprint::Fields(Cow::Borrowed(&[FieldPath::from_static("amount")])),
    fingerprint_query: Cow::Borrowed(&[]),
    ttl: idem_contract::Duration::from_millis(86_400_000),
    deadline: Deadline {
        total: idem_contract::Duration::from_millis(30_000),
        per_attempt: Some(idem_contract::Duration::from_millis(10_000)),
    },
    max_attempts: 4,
    retryable: Cow::Borrowed(&[
        Retryable::Status(idem_contract::StatusCode(429)),
        Retryable::Status(idem_contract::StatusCode(503)),
    ]),
    concurrency: Concurrency::Conflict {
        retry_after: DEFAULT_CONFLICT_RETRY_AFTER,
    },
    status_lookup: StatusLookup {
        handler: Cow::Borrowed("order_status"),
        path: Some(Cow::Borrowed("/orders/operations/{key}")),
    },
    recovery: Recovery::Reconcile {
        function: Cow::Borrowed("reconcile_order"),
    },
};

#[derive(Clone, Default)]
struct Orders {
    /// The reconcile function cannot tell: an attempt that died is parked for an operator.
    undecidable: bool,
    count: Arc<AtomicU64>,
    /// The orders by the operation id that made them.
    by_operation: Arc<Mutex<HashMap<String, serde_json::Value>>>,
}

struct CreateOrder;
impl Contracted for CreateOrder {
    const CONTRACT: &'static Contract = &CONTRACT;
}
impl Recover<Orders> for CreateOrder {
    fn recoverer(state: &Orders) -> Recoverer {
        Recoverer::reconcile_with(state.clone(), reconcile_order)
    }
}

async fn reconcile_order(orders: Orders, op: UnknownOperation) -> Decision {
    if orders.undecidable {
        return Decision::unknown("the ledger cannot tell");
    }
    let found = orders
        .by_operation
        .lock()
        .unwrap()
        .get(&op.operation_id.to_string())
        .cloned();
    match found {
        Some(order) => Decision::applied((StatusCode::CREATED, Json(order))),
        None => Decision::NotApplied,
    }
}

async fn create_order(
    State(orders): State<Orders>,
    enforced: Enforced<Json<serde_json::Value>, CreateOrder>,
) -> Response {
    let (Json(body), guard) = enforced.into_parts();
    let operation_id = guard.operation_id().to_string();
    guard
        .run(async move {
            tokio::time::sleep(EFFECT_TAKES).await;
            let id = orders.count.fetch_add(1, Ordering::SeqCst) + 1;
            let order = serde_json::json!({ "id": id, "amount": body["amount"] });
            orders
                .by_operation
                .lock()
                .unwrap()
                .insert(operation_id, order.clone());
            (StatusCode::CREATED, Json(order))
        })
        .await
}

async fn order_status(
    lookup: idem_runtime::Lookup<CreateOrder>,
    axum::extract::Path(key): axum::extract::Path<String>,
) -> idem_runtime::OperationStatus {
    lookup.status(&key).await
}

fn idem_service() -> (Router, Arc<AtomicU64>) {
    let (router, _, count) = idem_service_over(MemoryStore::new(), Orders::default());
    (router, count)
}

/// The idem service over `store`, and its handle (for the operator check).
fn idem_service_over(store: impl Store, orders: Orders) -> (Router, Idem, Arc<AtomicU64>) {
    let count = Arc::clone(&orders.count);
    let idem = Idem::builder(store, identity::header("x-client-id"))
        .heartbeat(Duration::from_millis(300))
        .test_faults()
        .build();
    let router = idem_router(&idem, orders, "/orders/operations/{key}");
    (router, idem, count)
}

/// `POST /orders` and its status lookup at `lookup`, over `idem`.
fn idem_router(idem: &Idem, orders: Orders, lookup: &str) -> Router {
    Router::new()
        .route("/orders", post(create_order))
        .route(lookup, axum::routing::get(order_status))
        .with_state(orders)
        .layer(idem.layer())
}

/// The capture of this binary's spans, installed once as the global subscriber (the
/// services run on other threads than the tests).
fn capture() -> &'static TraceCapture {
    static CAPTURE: OnceLock<TraceCapture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let capture = TraceCapture::new();
        capture
            .install_global()
            .expect("the only global subscriber");
        capture
    })
}

/// The harness over an idem service with both ready-made checks plugged in.
fn fully_checked(store: impl Store, orders: Orders) -> Harness {
    let (router, idem, effects) = idem_service_over(store, orders);
    harness(router, effects)
        .status_lookup("/orders/operations/{key}")
        .check_trace(capture().check())
        .check_operator(OperatorCheck::for_idem(&idem, "create_order").check())
}

#[tokio::test]
async fn a_correct_idem_service_passes_every_checked_proof() {
    let (router, effects) = idem_service();
    let report = harness(router, effects)
        .status_lookup("/orders/operations/{key}")
        .run()
        .await
        .unwrap();
    println!("{report}");
    report.assert_passed();
    for scenario in Scenario::ALL {
        for proof in [Proof::OneEffect, Proof::Linked, Proof::ResultOrState] {
            assert!(
                report.verdict(scenario, proof).unwrap().is_pass(),
                "{scenario:?} {proof:?}"
            );
        }
        // Nothing plugged in: proofs 4 and 5 are not checked, and say so.
        for proof in [Proof::Trace, Proof::OperatorRestore] {
            let verdict = report.verdict(scenario, proof).unwrap();
            assert!(
                matches!(verdict, Verdict::NotChecked(why) if why.contains("plugged in")),
                "{verdict:?}"
            );
        }
    }
    assert!(
        report
            .to_string()
            .contains("passed: 18 of 30 proofs checked, 0 failed, 12 not checked")
    );
}

#[tokio::test]
async fn plugged_in_checks_decide_proofs_4_and_5() {
    let (router, effects) = idem_service();
    let report = harness(router, effects)
        .scenarios([Scenario::LostAnswer, Scenario::Permanent400])
        .check_trace(|evidence| async move {
            // A stand-in for spans: both answers of the lost-answer scenario carry one id.
            if evidence.operation_ids().len() == 1 {
                Verdict::Pass(format!("{} answers, one operation", evidence.answers.len()))
            } else {
                Verdict::Fail("several operations".into())
            }
        })
        .check_operator(|evidence| async move {
            Verdict::Fail(format!("no operator tool for {}", evidence.key))
        })
        .run()
        .await
        .unwrap();
    assert_eq!(
        failures(&report),
        [
            (Scenario::LostAnswer, Proof::OperatorRestore),
            (Scenario::Permanent400, Proof::OperatorRestore),
        ]
    );
    assert!(
        report
            .verdict(Scenario::LostAnswer, Proof::Trace)
            .unwrap()
            .is_pass()
    );
}

// ----- proofs 4 and 5 with the ready-made checks -----

#[tokio::test]
async fn the_ready_made_checks_prove_all_five_on_a_correct_idem_service() {
    let report = fully_checked(MemoryStore::new(), Orders::default())
        .run()
        .await
        .unwrap();
    println!("{report}");
    report.assert_passed();
    assert_eq!(report.passes().len(), 30, "{report}");
    let trace = |s| {
        report
            .verdict(s, Proof::Trace)
            .unwrap()
            .evidence()
            .to_owned()
    };
    let operator = |s| {
        report
            .verdict(s, Proof::OperatorRestore)
            .unwrap()
            .evidence()
            .to_owned()
    };
    // Both physical attempts of the lost answer, the second a resend; one final outcome.
    let lost = trace(Scenario::LostAnswer);
    assert!(lost.contains("1 first and 1 resend(s)"), "{lost}");
    assert!(lost.contains("#1 executed 201, #2 replayed 201"), "{lost}");
    assert!(lost.contains("idem.operation.end: completed"), "{lost}");
    // The crashed attempt ended unknown; recovery's decision is the one final outcome.
    let crash = trace(Scenario::Crash);
    assert!(crash.contains("#1 unknown"), "{crash}");
    assert!(crash.contains("idem.operation.end: recovered"), "{crash}");
    // The operator sees both attempts of the refusals and of the crash.
    assert!(
        operator(Scenario::TooManyRequests).contains("#1 released, #2 completed 201"),
        "{}",
        operator(Scenario::TooManyRequests)
    );
    assert!(
        operator(Scenario::Crash).contains("#1 lease ended, #2 completed 201"),
        "{}",
        operator(Scenario::Crash)
    );
    assert!(operator(Scenario::Permanent400).contains("completed 400"));
    let concurrent = report
        .verdict(Scenario::Concurrent, Proof::OneEffect)
        .unwrap()
        .evidence();
    assert_eq!(
        concurrent,
        "1 effect(s) for 10 requests with one key at once; none for the request after them"
    );
    for scenario in Scenario::ALL {
        assert!(
            operator(scenario).contains("nothing to restore"),
            "{scenario:?}"
        );
    }
}

#[tokio::test]
async fn a_crash_recovery_cannot_decide_is_parked_then_restored_through_store_resolve() {
    let orders = Orders {
        undecidable: true,
        ..Orders::default()
    };
    let report = fully_checked(MemoryStore::new(), orders)
        .scenarios([Scenario::Crash])
        .run()
        .await
        .unwrap();
    println!("{report}");
    report.assert_passed();
    assert_eq!(report.passes().len(), 5, "{report}");
    let verdict = |p| {
        report
            .verdict(Scenario::Crash, p)
            .unwrap()
            .evidence()
            .to_owned()
    };
    // The client gets the state: parked for an operator.
    assert!(
        verdict(Proof::ResultOrState)
            .contains("409 operation-outcome-unknown (parked for an operator)"),
        "{}",
        verdict(Proof::ResultOrState)
    );
    assert!(
        verdict(Proof::Trace).contains("idem.operation.end: parked"),
        "{}",
        verdict(Proof::Trace)
    );
    // The effect happened, so the operator resolves it as completed; the retry gets the
    // operator's answer.
    let restored = verdict(Proof::OperatorRestore);
    assert!(
        restored.contains("parked at attempt 2 (the ledger cannot tell); resolved as completed through Store::resolve"),
        "{restored}"
    );
    assert!(
        restored.contains("the retry got 200 (replayed)"),
        "{restored}"
    );
}

#[tokio::test]
async fn a_capture_fed_nothing_fails_proof_4_with_its_evidence() {
    let (router, effects) = idem_service();
    // Never installed: it sees no span.
    let deaf = TraceCapture::new();
    let report = harness(router, effects)
        .scenarios([Scenario::LostAnswer])
        .check_trace(deaf.check())
        .run()
        .await
        .unwrap();
    assert_eq!(failures(&report), [(Scenario::LostAnswer, Proof::Trace)]);
    let evidence = report
        .verdict(Scenario::LostAnswer, Proof::Trace)
        .unwrap()
        .evidence();
    assert!(
        evidence.starts_with("0 idem.attempt span(s) under ")
            && evidence.ends_with("for 2 request(s) the service answered"),
        "{evidence}"
    );
}

#[tokio::test]
async fn a_service_whose_trace_misses_the_second_attempt_fails_proof_4() {
    let service = HandWritten {
        breaks: Breaks {
            traces_only_the_first: true,
            ..Breaks::default()
        },
        ..HandWritten::default()
    };
    let effects = Arc::clone(&service.effects);
    let router = Router::new()
        .route("/orders", post(hand_written))
        .with_state(service);
    let report = harness(router, effects)
        .scenarios([Scenario::LostAnswer, Scenario::Permanent400])
        .check_trace(capture().check())
        .run()
        .await
        .unwrap();
    println!("{report}");
    assert_eq!(
        failures(&report),
        [
            (Scenario::LostAnswer, Proof::Trace),
            (Scenario::Permanent400, Proof::Trace)
        ]
    );
    let evidence = report
        .verdict(Scenario::LostAnswer, Proof::Trace)
        .unwrap()
        .evidence();
    assert!(
        evidence.starts_with("1 idem.attempt span(s) under ")
            && evidence.contains("for 2 request(s) the service answered: #1 executed 201"),
        "{evidence}"
    );
}

#[tokio::test]
async fn a_store_that_hides_attempts_from_the_operator_fails_proof_5() {
    let store = Hobbled {
        hides_attempts: true,
        ..Hobbled::default()
    };
    let report = fully_checked(store, Orders::default())
        .scenarios([Scenario::LostAnswer, Scenario::TooManyRequests])
        .run()
        .await
        .unwrap();
    println!("{report}");
    // One attempt: nothing hidden. Two: the first is missing.
    assert_eq!(
        failures(&report),
        [(Scenario::TooManyRequests, Proof::OperatorRestore)]
    );
    let evidence = report
        .verdict(Scenario::TooManyRequests, Proof::OperatorRestore)
        .unwrap()
        .evidence();
    assert!(
        evidence.starts_with("the record counts 2 attempt(s), Store::inspect lists 1"),
        "{evidence}"
    );
}

#[tokio::test]
async fn a_parked_operation_that_cannot_be_resolved_fails_proof_5() {
    let store = Hobbled {
        refuses_resolve: true,
        ..Hobbled::default()
    };
    let orders = Orders {
        undecidable: true,
        ..Orders::default()
    };
    let report = fully_checked(store, orders)
        .scenarios([Scenario::Crash])
        .run()
        .await
        .unwrap();
    println!("{report}");
    assert_eq!(
        failures(&report),
        [(Scenario::Crash, Proof::OperatorRestore)]
    );
    let evidence = report
        .verdict(Scenario::Crash, Proof::OperatorRestore)
        .unwrap()
        .evidence();
    assert!(
        evidence.contains("Store::resolve (idem ops resolve --as completed) refused: the store is unavailable: the operator's write failed"),
        "{evidence}"
    );
}

/// A memory store that hides all but the last attempt from `inspect`, or refuses every
/// resolution.
#[derive(Default)]
struct Hobbled {
    inner: MemoryStore,
    hides_attempts: bool,
    refuses_resolve: bool,
}

idem_runtime::forward_store! {
    impl[] RecordStore for Hobbled {
        forward |this| &this.inner;
    }
    impl[] OperatorStore for Hobbled {
        forward |this| &this.inner;

        async fn inspect(
            &self,
            key: &RecordKey,
            now: UnixMillis,
        ) -> Result<Option<Inspection>, StoreError> {
            let mut found = self.inner.inspect(key, now).await?;
            if self.hides_attempts
                && let Some(inspection) = &mut found
            {
                let last = inspection.attempts.len().saturating_sub(1);
                inspection.attempts.drain(..last);
            }
            Ok(found)
        }

        async fn resolve(
            &self,
            key: &RecordKey,
            resolve: &Resolution,
            now: UnixMillis,
        ) -> Result<Record, StoreError> {
            if self.refuses_resolve {
                return Err(StoreError::unavailable("the operator's write failed"));
            }
            self.inner.resolve(key, resolve, now).await
        }
    }
}

// ----- hand-written services, each breaking one rule -----

#[derive(Clone, Copy, Default)]
struct Breaks {
    /// Runs the effect, then forgets the key instead of storing the result.
    forgets_result: bool,
    /// Runs the effect first, and only then registers the key (with its result).
    registers_after_effect: bool,
    /// Registers the key as processing with no lease: a crash leaves it held forever.
    no_lease: bool,
    /// Emits an `idem.attempt` span for the attempt that registers a new key, none for
    /// the others: its trace misses every resend.
    traces_only_the_first: bool,
    /// Honours every value of the test-fault header but `crash-after-effect`.
    ignores_crash: bool,
}

#[derive(Clone)]
enum Entry {
    Processing {
        id: String,
        until: Option<Instant>,
    },
    Released {
        id: String,
    },
    Done {
        id: String,
        status: u16,
        body: String,
    },
}

#[derive(Clone, Default)]
struct HandWritten {
    breaks: Breaks,
    keys: Arc<Mutex<HashMap<String, Entry>>>,
    effects: Arc<AtomicU64>,
    /// The result of each key's effect, for recovery.
    made: Arc<Mutex<HashMap<String, String>>>,
}

fn answer(status: u16, id: &str, body: String, replayed: bool) -> Response {
    let mut response = (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", "application/json"), ("operation-id", id)],
        body,
    )
        .into_response();
    if replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", "true".parse().unwrap());
    }
    if matches!(status, 409 | 429 | 503) {
        response
            .headers_mut()
            .insert("retry-after", "1".parse().unwrap());
    }
    response
}

fn cut() -> Response {
    let body = futures_util::stream::once(async {
        Err::<axum::body::Bytes, _>(std::io::Error::other("crashed"))
    });
    Response::new(Body::from_stream(body))
}

impl HandWritten {
    async fn effect(&self, key: &str) -> String {
        tokio::time::sleep(EFFECT_TAKES).await;
        let n = self.effects.fetch_add(1, Ordering::SeqCst) + 1;
        let body = format!(r#"{{"id":{n}}}"#);
        self.made.lock().unwrap().insert(key.into(), body.clone());
        body
    }

    fn settle(&self, key: &str, id: &str, status: u16, body: &str) {
        let mut keys = self.keys.lock().unwrap();
        if self.breaks.forgets_result {
            keys.remove(key);
        } else {
            keys.insert(
                key.into(),
                Entry::Done {
                    id: id.into(),
                    status,
                    body: body.into(),
                },
            );
        }
    }
}

async fn hand_written(State(s): State<HandWritten>, headers: HeaderMap) -> Response {
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let fault = headers
        .get("idem-test-fault")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let fresh = || uuid::Uuid::now_v7().to_string();
    // Register the key, or answer from what it holds.
    let id = {
        let mut keys = s.keys.lock().unwrap();
        let id = match keys.get(&key).cloned() {
            Some(Entry::Done { id, status, body }) => return answer(status, &id, body, true),
            Some(Entry::Processing { id, until }) => {
                if until.is_none_or(|u| u > Instant::now()) {
                    return answer(409, &id, r#"{"state":"processing"}"#.into(), false);
                }
                // The lease has ended: recovery looks for the effect.
                if let Some(body) = s.made.lock().unwrap().get(&key).cloned() {
                    drop(keys);
                    s.settle(&key, &id, 201, &body);
                    return answer(201, &id, body, false);
                }
                id
            }
            Some(Entry::Released { id }) => id,
            None => {
                let id = fresh();
                if s.breaks.traces_only_the_first {
                    let span = tracing::info_span!(
                        "idem.attempt",
                        idem.operation_id = %id,
                        idem.attempt = 1u32,
                        idem.outcome = "executed",
                        http.response.status_code = 201u16,
                    );
                    drop(span);
                }
                id
            }
        };
        if !s.breaks.registers_after_effect {
            let until = (!s.breaks.no_lease).then(|| Instant::now() + Duration::from_millis(500));
            keys.insert(
                key.clone(),
                Entry::Processing {
                    id: id.clone(),
                    until,
                },
            );
        }
        id
    };
    match fault.as_deref() {
        Some(f @ ("answer-429" | "answer-503")) => {
            let status = if f == "answer-429" { 429 } else { 503 };
            s.keys
                .lock()
                .unwrap()
                .insert(key, Entry::Released { id: id.clone() });
            return answer(status, &id, r#"{"refused":true}"#.into(), false);
        }
        Some("answer-400") => {
            let body = r#"{"invalid":true}"#.to_owned();
            s.settle(&key, &id, 400, &body);
            return answer(400, &id, body, false);
        }
        _ => {}
    }
    let body = s.effect(&key).await;
    if fault.as_deref() == Some("crash-after-effect") && !s.breaks.ignores_crash {
        return cut();
    }
    s.settle(&key, &id, 201, &body);
    answer(201, &id, body, false)
}

async fn run_hand_written(breaks: Breaks) -> Report {
    let service = HandWritten {
        breaks,
        ..HandWritten::default()
    };
    let effects = Arc::clone(&service.effects);
    let router = Router::new()
        .route("/orders", post(hand_written))
        .with_state(service);
    let report = harness(router, effects)
        .recovery_within(Duration::from_secs(2))
        .run()
        .await
        .unwrap();
    println!("{report}");
    report
}

#[tokio::test]
async fn a_hand_written_service_that_keeps_the_rules_passes() {
    let report = run_hand_written(Breaks::default()).await;
    report.assert_passed();
    // Without a status lookup, nothing links the crashed attempt (which sent no answer)
    // to the retries: proof 2 of the crash is not checked, rather than passed.
    let verdict = report.verdict(Scenario::Crash, Proof::Linked).unwrap();
    assert!(
        matches!(verdict, Verdict::NotChecked(why) if why.contains("status lookup")),
        "{verdict:?}"
    );
    assert_eq!(report.passes().len(), 17, "{report}");
}

#[tokio::test]
async fn a_service_that_forgets_its_result_fails_the_lost_answer_the_400_and_the_repeat() {
    let report = run_hand_written(Breaks {
        forgets_result: true,
        ..Breaks::default()
    })
    .await;
    use Proof::*;
    use Scenario::*;
    assert_eq!(
        failures(&report),
        [
            (LostAnswer, OneEffect),
            (LostAnswer, Linked),
            (LostAnswer, ResultOrState),
            (Permanent400, OneEffect),
            (Permanent400, Linked),
            (Permanent400, ResultOrState),
            (Concurrent, OneEffect),
            (Concurrent, Linked),
            (Concurrent, ResultOrState),
        ]
    );
    let evidence = report.verdict(LostAnswer, OneEffect).unwrap().evidence();
    assert!(evidence.starts_with("2 effect(s)"), "{evidence}");
    // The concurrent requests made one effect; the request after them, the second.
    let evidence = report.verdict(Concurrent, OneEffect).unwrap().evidence();
    assert_eq!(
        evidence,
        "1 effect(s) for 10 requests with one key at once, then 1 more for the request after them (201): expected none"
    );
}

#[tokio::test]
async fn a_service_that_registers_the_key_after_the_effect_fails_concurrency_and_the_crash() {
    let report = run_hand_written(Breaks {
        registers_after_effect: true,
        ..Breaks::default()
    })
    .await;
    use Proof::*;
    use Scenario::*;
    assert_eq!(
        failures(&report),
        [
            (Concurrent, OneEffect),
            (Concurrent, Linked),
            (Concurrent, ResultOrState),
            (Crash, OneEffect),
        ]
    );
    // Every request that arrived before the first had finished ran the effect (all 10,
    // unless the machine is slow enough to spread them over 150 ms).
    let evidence = report.verdict(Concurrent, OneEffect).unwrap().evidence();
    let ran: u64 = evidence.split(' ').next().unwrap().parse().unwrap();
    assert!(ran >= 2, "{evidence}");
}

#[tokio::test]
async fn a_service_without_a_lease_fails_the_crash_its_key_blocked_for_good() {
    let report = run_hand_written(Breaks {
        no_lease: true,
        ..Breaks::default()
    })
    .await;
    assert_eq!(failures(&report), [(Scenario::Crash, Proof::ResultOrState)]);
    let evidence = report
        .verdict(Scenario::Crash, Proof::ResultOrState)
        .unwrap()
        .evidence();
    assert!(evidence.contains("the key is blocked"), "{evidence}");
}

// ----- the harness's own configuration -----

#[tokio::test]
async fn bad_configurations_get_precise_errors() {
    for (url, expected) in [
        ("not a url", "is not a URL"),
        ("", "is not a URL"),
        ("https://127.0.0.1:1", "the scheme must be `http`"),
        ("http://example.com", "is not on loopback"),
        ("http://10.0.0.1:3000", "is not on loopback"),
    ] {
        let error = Harness::for_url(url).unwrap_err().to_string();
        assert!(error.contains(expected), "{url}: {error}");
    }
    for url in [
        "http://127.0.0.1:3000",
        "http://[::1]:3000/",
        "http://localhost:3000",
    ] {
        assert!(Harness::for_url(url).is_ok(), "{url}");
    }

    // Nothing listens on the port of a listener just closed.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let count = || async { Ok::<u64, String>(0) };
    let error = Harness::for_url(&format!("http://127.0.0.1:{port}"))
        .unwrap()
        .request(Request::post_json("/orders", "{}"))
        .count_effects(count)
        .run()
        .await
        .unwrap_err();
    assert!(matches!(error, HarnessError::Unreachable { .. }), "{error}");

    let (router, _) = idem_service();
    let no_request = Harness::for_router(router.clone())
        .count_effects(count)
        .run()
        .await
        .unwrap_err();
    assert!(
        no_request.to_string().contains("no request"),
        "{no_request}"
    );
    let empty_path = Harness::for_router(router.clone())
        .request(Request::post_json("", "{}"))
        .count_effects(count)
        .run()
        .await
        .unwrap_err();
    assert!(
        empty_path.to_string().contains("must start with `/`"),
        "{empty_path}"
    );
    let bad_header = Harness::for_router(router.clone())
        .request(Request::post_json("/orders", "{}"))
        .client_header("x client", "cus_42")
        .count_effects(count)
        .run()
        .await
        .unwrap_err();
    assert!(
        bad_header.to_string().contains("is not a header name"),
        "{bad_header}"
    );
    for (harness, expected) in [
        (
            Harness::for_router(router.clone()).cookie("s id", "1"),
            "`s id` is not a cookie name",
        ),
        (
            Harness::for_router(router.clone()).cookie("sid", "a;b"),
            "the value of the cookie `sid` holds ';'",
        ),
        (
            Harness::for_router(router.clone()).client_header("Cookie", "sid=1"),
            "give cookies with `Harness::cookie`",
        ),
        (
            Harness::for_router(router.clone()).operation_id_header("request id"),
            "`request id` (the operation id header) is not a header name",
        ),
    ] {
        let error = harness
            .request(Request::post_json("/orders", "{}"))
            .count_effects(count)
            .run()
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains(expected), "{error}");
    }
    let no_counter = Harness::for_router(router.clone())
        .request(Request::post_json("/orders", "{}"))
        .run()
        .await
        .unwrap_err();
    assert!(
        matches!(no_counter, HarnessError::NoEffectCounter),
        "{no_counter}"
    );
    let failing_counter = Harness::for_router(router)
        .request(Request::post_json("/orders", "{}"))
        .count_effects(|| async { Err::<u64, _>("the database is gone") })
        .run()
        .await
        .unwrap_err();
    assert!(
        failing_counter.to_string().contains("the database is gone"),
        "{failing_counter}"
    );
}

#[tokio::test]
async fn a_service_that_ignores_the_fault_header_is_not_blamed_for_it() {
    let orders = Orders::default();
    let count = Arc::clone(&orders.count);
    // No `test_faults()`: the header is an ordinary header, the probe an ordinary request.
    let idem = Idem::new(MemoryStore::new(), identity::header("x-client-id"));
    let router = idem_router(&idem, orders, "/orders/operations/{key}");
    let report = harness(router, count)
        .status_lookup("/orders/operations/{key}")
        .run()
        .await
        .unwrap();
    println!("{report}");
    report.assert_passed();
    let probe = report.fault_probe.as_ref().unwrap();
    assert!(!probe.honoured());
    // The probe ran as any request: its one effect is its own, in no scenario.
    assert_eq!((probe.answer.status, probe.effects), (Some(201), 1));
    for scenario in Scenario::ALL {
        for proof in Proof::ALL {
            let verdict = report.verdict(scenario, proof).unwrap();
            match scenario.test_fault() {
                Some(_) => assert!(
                    matches!(verdict, Verdict::NotChecked(why)
                        if why.starts_with("not run: the service does not honour Idem-Test-Fault")
                            && why.contains("IdemBuilder::test_faults() (feature `testing`")),
                    "{scenario:?} {proof:?}: {verdict:?}"
                ),
                None if proof < Proof::Trace => {
                    assert!(verdict.is_pass(), "{scenario:?} {proof:?}: {verdict:?}");
                }
                None => {}
            }
        }
    }
    let lost = report
        .verdict(Scenario::LostAnswer, Proof::OneEffect)
        .unwrap();
    assert!(lost.evidence().starts_with("1 effect(s)"), "{lost:?}");
    let text = report.to_string();
    assert!(
        text.starts_with("test faults: NOT honoured (Idem-Test-Fault: answer-400 under a fresh key got 201 and 1 effect(s), counted here and in no scenario)"),
        "{text}"
    );
    assert!(
        text.ends_with("passed: 6 of 30 proofs checked, 0 failed, 24 not checked"),
        "{text}"
    );
    assert!(!text.contains("behind the"), "{text}");
}

#[tokio::test]
async fn a_fault_the_service_does_not_apply_leaves_its_scenario_not_checked() {
    let report = run_hand_written(Breaks {
        ignores_crash: true,
        ..Breaks::default()
    })
    .await;
    report.assert_passed();
    assert!(report.fault_probe.as_ref().unwrap().honoured());
    for proof in Proof::ALL {
        let verdict = report.verdict(Scenario::Crash, proof).unwrap();
        assert!(
            matches!(verdict, Verdict::NotChecked(why)
                if why.starts_with("Idem-Test-Fault: crash-after-effect was answered 201 (1 effect(s))")
                    && why.contains("honours answer-400 but not this value")),
            "{proof:?}: {verdict:?}"
        );
    }
    assert!(report.to_string().starts_with(
        "test faults: honoured (Idem-Test-Fault: answer-400 under a fresh key got 400, 0 effect(s))"
    ));
}

/// A router whose answers name their operation in `header` rather than `Operation-Id`.
fn correlated_by(router: Router, header: &'static str) -> Router {
    router.layer(axum::middleware::map_response(
        move |mut response: Response| async move {
            if let Some(id) = response.headers_mut().remove("operation-id") {
                response.headers_mut().insert(header, id);
            }
            response
        },
    ))
}

#[tokio::test]
async fn a_service_that_correlates_by_another_header_passes_once_it_is_named() {
    let service = HandWritten::default();
    let effects = Arc::clone(&service.effects);
    let router = correlated_by(
        Router::new()
            .route("/orders", post(hand_written))
            .with_state(service),
        "x-request-id",
    );
    let only = [Scenario::LostAnswer, Scenario::Permanent400];
    let report = harness(router.clone(), Arc::clone(&effects))
        .scenarios(only)
        .run()
        .await
        .unwrap();
    assert_eq!(
        failures(&report),
        [
            (Scenario::LostAnswer, Proof::Linked),
            (Scenario::Permanent400, Proof::Linked)
        ]
    );
    let evidence = report
        .verdict(Scenario::LostAnswer, Proof::Linked)
        .unwrap()
        .evidence();
    assert!(
        evidence.contains("has no Operation-Id header")
            && evidence
                .contains("Harness::operation_id_header, or idem monday's --operation-id-header"),
        "{evidence}"
    );
    let report = harness(router, effects)
        .scenarios(only)
        .operation_id_header("X-Request-Id")
        .run()
        .await
        .unwrap();
    report.assert_passed();
    let evidence = report
        .verdict(Scenario::LostAnswer, Proof::Linked)
        .unwrap()
        .evidence();
    assert!(
        evidence.starts_with("2 answers under one X-Request-Id "),
        "{evidence}"
    );
}

/// A service whose keys live in a session: the `sid` cookie names it (a request without
/// one starts a new session, set in its answer), for the client `x-client-id` names in
/// the tenant `x-tenant` names (both required).
#[derive(Clone, Default)]
struct Sessions {
    inner: HandWritten,
    started: Arc<AtomicU64>,
}

async fn session_scoped(State(s): State<Sessions>, mut headers: HeaderMap) -> Response {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(tenant), Some(client)) = (text("x-tenant"), text("x-client-id")) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let sid = text("cookie").and_then(|cookies| {
        cookies
            .split(';')
            .find_map(|c| c.trim().strip_prefix("sid="))
            .map(str::to_owned)
    });
    let (sid, started) = match sid {
        Some(sid) => (sid, false),
        None => (
            format!("s{}", s.started.fetch_add(1, Ordering::SeqCst) + 1),
            true,
        ),
    };
    let scope = format!("{tenant}/{client}/{sid}");
    if let Some(key) = text("idempotency-key") {
        let scoped = format!("{scope}/{key}").parse().unwrap();
        headers.insert("idempotency-key", scoped);
    }
    let mut response = hand_written(State(s.inner), headers).await;
    if started {
        let cookie = format!("sid={sid}; Path=/orders; HttpOnly")
            .parse()
            .unwrap();
        response.headers_mut().append("set-cookie", cookie);
    }
    response
}

fn session_service() -> (Router, Arc<AtomicU64>, Arc<AtomicU64>) {
    let sessions = Sessions::default();
    let (effects, started) = (
        Arc::clone(&sessions.inner.effects),
        Arc::clone(&sessions.started),
    );
    let router = Router::new()
        .route("/orders", post(session_scoped))
        .with_state(sessions);
    (router, effects, started)
}

#[tokio::test]
async fn a_session_scoped_service_sees_one_session_and_every_client_header() {
    // The session the service starts on the first answer (the probe's) is kept.
    let (router, effects, started) = session_service();
    let report = harness(router, effects)
        .client_header("x-tenant", "acme")
        .recovery_within(Duration::from_secs(2))
        .run()
        .await
        .unwrap();
    println!("{report}");
    report.assert_passed();
    assert_eq!(report.passes().len(), 17, "{report}");
    assert_eq!(started.load(Ordering::SeqCst), 1);
    // A session given as a cookie: the service never starts one.
    let (router, effects, started) = session_service();
    let report = harness(router, effects)
        .client_header("x-tenant", "acme")
        .cookie("sid", "given")
        .recovery_within(Duration::from_secs(2))
        .run()
        .await
        .unwrap();
    report.assert_passed();
    assert_eq!(started.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_status_lookup_that_does_not_answer_for_the_key_fails_proof_2() {
    let only = [Scenario::LostAnswer, Scenario::Concurrent];
    let orders = Orders::default();
    let count = Arc::clone(&orders.count);
    let idem = Idem::new(MemoryStore::new(), identity::header("x-client-id"));
    // Routed at another path than the one the harness is told.
    let router = idem_router(&idem, orders, "/operations/{key}");
    let report = harness(router.clone(), Arc::clone(&count))
        .scenarios(only)
        .status_lookup("/orders/operations/{key}")
        .run()
        .await
        .unwrap();
    println!("{report}");
    assert_eq!(
        failures(&report),
        [
            (Scenario::LostAnswer, Proof::Linked),
            (Scenario::Concurrent, Proof::Linked)
        ]
    );
    let evidence = report
        .verdict(Scenario::LostAnswer, Proof::Linked)
        .unwrap()
        .evidence();
    assert!(
        evidence
            .contains("but after the operation's outcome the status lookup GET http://127.0.0.1:")
            && evidence.contains("/orders/operations/monday-")
            && evidence.contains("answered 404: it does not answer for the operation's key"),
        "{evidence}"
    );
    // Asked where it is, it answers.
    let report = harness(router, count)
        .scenarios(only)
        .status_lookup("/operations/{key}")
        .run()
        .await
        .unwrap();
    report.assert_passed();
    let evidence = report
        .verdict(Scenario::LostAnswer, Proof::Linked)
        .unwrap()
        .evidence();
    assert!(
        evidence.ends_with("status lookup: state completed, attempt 1"),
        "{evidence}"
    );
}

#[tokio::test]
async fn a_service_at_a_base_url_is_tested_the_same_way() {
    let service = HandWritten::default();
    let effects = Arc::clone(&service.effects);
    let router = Router::new()
        .route("/orders", post(hand_written))
        .with_state(service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let report = Harness::for_url(&format!("http://localhost:{}", addr.port()))
        .unwrap()
        .request(Request::post_json("/orders", r#"{"amount":1250}"#))
        .scenarios([Scenario::LostAnswer, Scenario::Permanent400])
        .count_effects(move || {
            let effects = Arc::clone(&effects);
            async move { Ok::<_, String>(effects.load(Ordering::SeqCst)) }
        })
        .run()
        .await
        .unwrap();
    server.abort();
    report.assert_passed();
    assert_eq!(report.scenarios.len(), 2);
    assert_eq!(report.passes().len(), 6, "{report}");
}

#[tokio::test]
async fn a_fault_the_protocol_does_not_name_is_refused_before_anything_runs() {
    let (router, effects) = idem_service();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let response = reqwest::Client::new()
        .post(format!("http://{addr}/orders"))
        .header("content-type", "application/json")
        .header("idempotency-key", "k-1")
        .header("x-client-id", "cus_42")
        .header("idem-test-fault", "explode")
        .body(r#"{"amount":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body = response.text().await.unwrap();
    assert!(body.contains("names no fault: `explode`"), "{body}");
    assert!(
        body.contains("answer-429, answer-503, answer-400, crash-after-effect"),
        "{body}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 0);
    server.abort();
}
