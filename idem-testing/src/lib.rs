//! The Monday test: a conformance harness pointed at one contracted operation, for a
//! service's tests and test commands (never a dependency of a service's own build).
//! Through the facade it is `idem::testing` (feature `testing`).
//!
//! Given the operation (an in-process router, or a base URL on loopback), one request to
//! send, and a way to count its business effects, [`Harness::run`] runs six scenarios,
//! each with fresh idempotency keys:
//!
//! | scenario | what happens |
//! |---|---|
//! | lost answer | the request goes through a loopback [`proxy`] that forwards it and drops the service's answer; then the same request, same key |
//! | 429 | `Idem-Test-Fault: answer-429`, then the same request without the fault, same key |
//! | 503 | the same with `answer-503` (a transient refusal) |
//! | 400 | the same with `answer-400` (a permanent refusal: the retry gets it replayed) |
//! | concurrent | 10 requests with one key at once, then one more once they have all answered |
//! | crash | `Idem-Test-Fault: crash-after-effect`: the attempt dies after the effect; the same request is sent again until recovery decides (a result), parks it for an operator (idem's 409 `operation-outcome-unknown`: the state of the operation, which proof 5 then restores), or the time is over |
//!
//! and checks, for each, five proofs ([`Proof`]): each is
//! [`Verdict::Pass`], [`Verdict::Fail`] or [`Verdict::NotChecked`], with its evidence.
//! Proofs 1 to 3 are checked from what HTTP shows (the answers, the effect counter, the
//! status lookup). Proofs 4 and 5 need the service's side: its trace and its store. They
//! are checked by the checks you plug in, ready-made ones or your own
//! ([`Harness::check_trace`], [`Harness::check_operator`]); without one they are *not
//! checked*, never passed.
//!
//! # Proof 4: the trace ([`TraceCapture`])
//!
//! A `tracing_subscriber::Layer` installed for the whole process (the service runs on
//! other threads than the test: a thread-local subscriber would miss it), and its
//! [`TraceCapture::check`]. For the scenario's operation id (the answers' `Operation-Id`,
//! or the status lookup's after a crash) it passes when the capture holds an
//! `idem.attempt` span for each request the harness saw answered (at least: the harness
//! may send more while it waits), every span ended with an `idem.outcome`, exactly one
//! of them attempt 1 and every other a resend (`idem.attempt` above 1,
//! `http.request.resend_count` one less), and exactly one `idem.operation.end` when the
//! operation reached a final state. In every scenario it does: completed (the lost
//! answer, the refusals and their retries, the concurrent requests, a recovered crash)
//! or parked (a crash recovery could not decide).
//!
//! # Proof 5: the operator ([`OperatorCheck`])
//!
//! Built from the service's store (or its `Idem` handle), it uses only the store's
//! operator calls, the ones `idem ops` makes, never SQL:
//!
//! | scenario ends | proof 5 checks |
//! |---|---|
//! | completed (every scenario of a correct service, a crash whose recovery decided included) | [`Store::inspect`](idem_runtime::Store::inspect) (`idem ops show`) finds the operation under the scenario's key and client, with the answers' operation id, the state and attempt count the status lookup gave, the stored status of the last answer, and every attempt (at least two after a 429, a 503 or a crash), each before the last with how it ended. There is nothing to restore: the pass says so |
//! | parked (a crash whose recovery could not decide: 409 `operation-outcome-unknown`) | the same, then the restore itself: [`Store::resolve`](idem_runtime::Store::resolve) (`idem ops resolve`) at the attempt seen, as *completed* with [`OperatorCheck::completed_answer`] when the scenario counted the effect, else *not applied*; the scenario's request sent again ([`Evidence::resend`]) must get the operator's answer (or a result of the same operation), and the record's history the resolution |
//!
//! What proof 5 does not show: that *your* runbook decides right. It shows that the
//! state is visible and restorable through the operator's tools, and that a restored
//! operation answers the client as the operator decided.
//!
//! ```no_run
//! # async fn demo(app: axum::Router, idem: idem_runtime::Idem, orders: std::sync::Arc<std::sync::atomic::AtomicU64>) -> Result<(), idem_testing::HarnessError> {
//! use std::sync::atomic::Ordering;
//! use idem_testing::{Harness, OperatorCheck, Request, TraceCapture};
//!
//! // Once per process, before the service starts (or `.with(capture.clone())` on your
//! // own `tracing_subscriber::registry()`).
//! let capture = TraceCapture::new();
//! capture.install_global().expect("no other global subscriber");
//!
//! // `app`: the service's router over `idem`, a handle made with `.with_test_faults()`.
//! let report = Harness::for_router(app)
//!     .request(Request::post_json("/orders", r#"{"customer_id":"cus_42","amount_minor":1250}"#))
//!     .client_header("x-client-id", "cus_42")
//!     .status_lookup("/orders/operations/{key}")
//!     .count_effects(move || {
//!         let orders = orders.clone();
//!         async move { Ok::<u64, std::convert::Infallible>(orders.load(Ordering::SeqCst)) }
//!     })
//!     .check_trace(capture.check())
//!     .check_operator(OperatorCheck::for_idem(&idem, "create_order").check())
//!     .run()
//!     .await?;
//! println!("{report}");   // scenario × proof, pass / FAIL / not checked, with the evidence
//! report.assert_passed(); // panics with the table if a proof failed
//! # Ok(()) }
//! ```
//!
//! Against a running service: `Harness::for_url("http://127.0.0.1:3000")?`; only
//! loopback addresses are accepted (the harness makes the service fail on purpose).
//!
//! # The test-fault protocol
//!
//! A request header, `Idem-Test-Fault`, that the service honours only when it is under
//! test: idem's runtime when its handle was made with `Idem::with_test_faults` (feature
//! `testing` of `idem-runtime`, which this crate turns on). A hand-written or non-Rust service under the harness implements the
//! same values:
//!
//! | `Idem-Test-Fault` | the service |
//! |---|---|
//! | `answer-429` | registers the key as usual, then answers 429 with `Retry-After` from the handler's position, without its effect (idem: as if the handler answered it: a retryable status releases the key) |
//! | `answer-503` | the same with 503, a transient refusal |
//! | `answer-400` | the same with 400, a permanent refusal: recorded and replayed |
//! | `crash-after-effect` | runs the handler (its effect happens, or is written in its uncommitted transaction), then the attempt dies as its process would: nothing recorded or committed, its lease no longer renewed, the connection cut without a complete answer |
//!
//! The fault applies to the attempt the request starts: a request answered from the
//! key's record (a replay, a concurrency answer, a recovery) ignores it. A value that
//! names no fault is refused with 400 before anything is registered.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod harness;
mod operator;
pub mod proxy;
mod report;
mod scenarios;
mod seen;
mod send;
mod trace;

pub use self::harness::{Harness, HarnessError, Request};
pub use self::operator::OperatorCheck;
pub use self::report::{Proof, Report, Scenario, ScenarioReport, Verdict};
pub use self::seen::{Evidence, Seen};
pub use self::trace::{AttemptSpan, TraceCapture};
pub use idem_runtime::{TEST_FAULT_HEADER, TestFault};
