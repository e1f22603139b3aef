//! The Monday test: a conformance harness pointed at one contracted operation, for a
//! service's tests and test commands (never a dependency of a service's own build).
//! Through the facade it is `idem::testing` (feature `testing`).
//!
//! [`Harness`] sends one request through six [`Scenario`]s (a lost answer, 429, 503,
//! 400, concurrent duplicates, a crash after the effect) and checks five [`Proof`]s for
//! each, into a [`Report`] of [`Verdict`]s with their [`Evidence`]. Proofs 1 to 3 are
//! read from HTTP; proof 4 (the trace) is checked by [`TraceCapture`], proof 5 (the
//! operator) by [`OperatorCheck`], or by checks of your own; without one they are *not
//! checked*, never passed. The service is made to fail through the test-fault protocol
//! ([`Idem-Test-Fault`](idem_runtime::headers::TEST_FAULT), [`TestFault`]), and the lost
//! answer through [`proxy`]. A service that does not honour the protocol is found out
//! first ([`FaultProbe`]): the scenarios that need it are then *not checked*, never
//! failed.
//!
//! The guide (the scenarios, what each proof passes on, the protocol's values, the
//! harness in a service's own tests, `orders monday` and `idem monday`) is the
//! `guide::conformance` module of the `idem` crate, `docs/conformance.md` in the
//! repository.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod harness;
mod jar;
mod lookup;
mod operator;
mod probe;
pub mod proxy;
mod report;
mod scenarios;
mod seen;
mod send;
mod trace;

pub use self::harness::{Harness, HarnessError, Request};
pub use self::operator::OperatorCheck;
pub use self::probe::FaultProbe;
pub use self::report::{Proof, Report, Scenario, ScenarioReport, Verdict};
pub use self::seen::{Evidence, Seen};
pub use self::trace::{AttemptSpan, TraceCapture};
pub use idem_runtime::TestFault;
