//! The Monday test (DESIGN §8): a conformance harness pointed at one contracted
//! operation (feature `testing`; never on in a service's own build).
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
//! | crash | `Idem-Test-Fault: crash-after-effect`: the attempt dies after the effect; the same request is sent again until recovery decides (or the time is over) |
//!
//! and checks, for each, the five proofs of DESIGN §8 ([`Proof`]): each is
//! [`Verdict::Pass`], [`Verdict::Fail`] or [`Verdict::NotChecked`], with its evidence.
//! Proofs 4 (the trace) and 5 (an operator can restore the state) are checked only by a
//! check the caller plugs in ([`Harness::check_trace`], [`Harness::check_operator`]);
//! without one they are *not checked*, never passed.
//!
//! ```no_run
//! # async fn demo(app: axum::Router, orders: std::sync::Arc<std::sync::atomic::AtomicU64>) -> Result<(), idem_runtime::testing::HarnessError> {
//! use std::sync::atomic::Ordering;
//! use idem_runtime::testing::{Harness, Request};
//!
//! // `app`: the service's router, its `Idem` handle made with `.with_test_faults()`.
//! let report = Harness::for_router(app)
//!     .request(Request::post_json("/orders", r#"{"customer_id":"cus_42","amount_minor":1250}"#))
//!     .client_header("x-client-id", "cus_42")
//!     .status_lookup("/orders/operations/{key}")
//!     .count_effects(move || {
//!         let orders = orders.clone();
//!         async move { Ok::<u64, std::convert::Infallible>(orders.load(Ordering::SeqCst)) }
//!     })
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
//! test: idem's runtime when its handle was made with `Idem::with_test_faults` (this
//! feature only). A hand-written or non-Rust service under the harness implements the
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

mod harness;
pub mod proxy;
mod report;
mod scenarios;
mod seen;

pub use self::harness::{Harness, HarnessError, Request};
pub use self::report::{Proof, Report, Scenario, ScenarioReport, Verdict};
pub use self::seen::{Evidence, Seen};
pub use crate::fault::{TEST_FAULT_HEADER, TestFault};
