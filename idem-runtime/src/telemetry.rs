//! Telemetry: one span per physical attempt, one event when an operation reaches its
//! final state, and counters of both, under names defined once, here.
//!
//! # What a span can honestly mean here
//!
//! A business operation is one idempotency key of one client (DESIGN §9: "spans and logs
//! separate the business operation from its physical attempts"). The server sees its
//! attempts as separate HTTP requests, minutes apart, possibly on other instances: there
//! is no moment at which an "operation" span could be opened before the first attempt and
//! closed after the last. So idem does not fake one. Instead:
//!
//! - **every request to a contracted handler is one `idem.attempt` span**, whether the
//!   handler runs or the answer comes from the record (a replay, 409, 422, 503, a
//!   rejection). It is a child of whatever span the request already has (an HTTP server
//!   span of `tower-http`'s `TraceLayer` or of an OpenTelemetry middleware), and the
//!   handler's own spans and logs are its children;
//! - **the operation is identified across attempts by `idem.operation_id`**, the
//!   server-assigned, time-ordered id that every answer carries in `Operation-Id` and the
//!   status lookup reports: every attempt span of one operation carries the same value,
//!   so a query on it gathers the operation's attempts in any backend;
//! - **one `idem.operation.end` event marks the operation's final state**, emitted once,
//!   by the attempt (or the status lookup, or the reconciler) that records it: `completed` (the handler's
//!   answer was stored), `recovered` (recovery found an earlier attempt applied and
//!   stored its answer) or `parked` (the outcome is unknown and waits for an operator).
//!   The store's fencing makes each of these transitions happen once per operation, so
//!   the event does too. An attempt that releases the key, or ends with its outcome
//!   unknown, is not final: a later attempt (or recovery) finishes the operation.
//!
//! # Names
//!
//! OpenTelemetry's names where a semantic convention exists, `idem.*` otherwise.
//!
//! | name | kind | source | value |
//! |---|---|---|---|
//! | `idem.attempt` ([`SPAN_ATTEMPT`]) | span (INFO) | idem | one physical attempt: every request to a contracted handler |
//! | `idem.operation` ([`FIELD_OPERATION`]) | span field | idem | the contract's operation name, such as `create_order` |
//! | `idem.operation_id` ([`FIELD_OPERATION_ID`]) | span field | idem | the operation's id, the same for all its attempts (`Operation-Id`) |
//! | `idem.attempt` ([`FIELD_ATTEMPT`]) | span field | idem | the attempt's number, 1 for the first (see below) |
//! | `http.request.resend_count` ([`FIELD_RESEND_COUNT`]) | span field | OTel HTTP | `idem.attempt − 1`, set only when above 0 |
//! | `http.route` ([`FIELD_ROUTE`]) | span field | OTel HTTP | the matched route template (axum's `MatchedPath`), such as `/orders/{id}` |
//! | `http.request.method` ([`FIELD_METHOD`]) | span field | OTel HTTP | `POST`, `PUT`, … |
//! | `http.response.status_code` ([`FIELD_STATUS_CODE`]) | span field | OTel HTTP | the status of the answer |
//! | `idem.outcome` ([`FIELD_OUTCOME`]) | span field | idem | the attempt's [`Outcome`] |
//! | `error.type` ([`FIELD_ERROR_TYPE`]) | span field | OTel | the failure's class: the slug of the problem idem answered with (`fingerprint-mismatch`, `store-unavailable`, …), `result-too-large`, `cancelled` (the request was dropped before its answer), or the status code of a 4xx/5xx that is no problem of idem's (an extractor's rejection, a handler's 5xx) |
//! | `idem.duration_s` ([`FIELD_DURATION`]) | event field | idem | the attempt's duration in seconds, on `idem.attempt.end` |
//! | `idem.final_outcome` ([`FIELD_OPERATION_OUTCOME`]) | event field | idem | the operation's [`FinalOutcome`], on `idem.operation.end` |
//! | `idem.attempt.end` ([`EVENT_ATTEMPT_END`]) | event (INFO) | idem | the attempt's outcome, once per attempt, inside its span |
//! | `idem.operation.end` ([`EVENT_OPERATION_END`]) | event (INFO) | idem | the operation's final outcome, once per operation |
//! | `idem_attempts_total` ([`METRIC_ATTEMPTS`]) | counter | idem | attempts, by `operation` and `outcome` |
//! | `idem_attempt_duration_seconds` ([`METRIC_ATTEMPT_DURATION`]) | histogram | idem | attempt durations, by `operation` and `outcome` |
//! | `idem_operations_total` ([`METRIC_OPERATIONS`]) | counter | idem | operations that reached a final state, by `operation` and `outcome` ([`FinalOutcome`]) |
//!
//! The metrics' labels are [`LABEL_OPERATION`] and [`LABEL_OUTCOME`]: the contract's name
//! and a value of a closed set, so their cardinality is the number of contracted
//! operations times 14. Keys, clients and operation ids are never labels.
//!
//! **The attempt number.** An attempt that registers the key (the handler runs, or
//! recovery runs for it) has the number the store counted: 1 for the first, one more
//! after each release or "not applied" recovery. A request answered from the record (a
//! replay, 409, 422) is a resend of an operation the server knows, and carries the
//! record's count plus one. The store does not write on such answers, so this is a lower
//! bound: two replays in a row both say 2. `http.request.resend_count` follows it, and is
//! absent on a first attempt (OpenTelemetry: "MUST NOT be set for the first request").
//!
//! `idem.attempt` names both the span and the attempt number's attribute: a span's name
//! is no attribute, and no attribute name is also a namespace of others (OpenTelemetry's
//! naming rule), hence `idem.duration_s` and `idem.final_outcome` rather than
//! `idem.attempt.duration` or `idem.operation.outcome`.
//!
//! Spans are recorded through [`tracing`]; export them to OpenTelemetry with
//! `tracing-opentelemetry` (the span's fields become its attributes; an event becomes a
//! span event named by its message, its fields its attributes: find the final outcome
//! by `idem.final_outcome`). Metrics go through the [`metrics`] facade: install any
//! recorder (Prometheus, OpenTelemetry, …) and call [`describe_metrics`] once for their
//! help texts. The repository's `examples/telemetry` exports both over OTLP.
//!
//! Besides these, idem logs a warning or an error at each step that goes wrong (a store
//! failure, a panic, a lost lease, recovery), with fields of their own (`operation`,
//! `operation_id`, `step`, …); inside an attempt they are events of its span.
//!
//! **Cost.** With no subscriber and no recorder installed, a request pays a clock read,
//! a few disabled-callsite checks and calls to the no-op recorder; a new key and a
//! replay allocate nothing for telemetry (the metric keys are made once per operation).
//! A problem answer carries its case in the response's extensions, for the span: one
//! small allocation, on answers that are not the common path.
//!
//! # What is never recorded
//!
//! No span, event or metric of idem's holds a request or response body, the idempotency
//! key (it is client-chosen and may carry what the client put in it), the client's
//! identity (the value of the identity header, or what the application's
//! `ClientIdentity` returned), an owner token, the fingerprint, or the value of any
//! header (`Authorization`, `Cookie` and the rest). Idem records the operation's name,
//! its id (server-assigned, random and time-ordered: it names no one), the route
//! template (not the path, whose parameters may be personal), the method, statuses and
//! the closed sets of outcomes and error classes. Two things come from the application
//! and are logged as given: the reason a reconcile function returns, and store errors'
//! messages. The integration test `tests/telemetry.rs` of the `idem` package checks every
//! captured span, event and metric for bodies, keys, tokens, the client identity and
//! header values.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::MatchedPath;
use axum::response::Response;
use http::Request;
use idem_contract::Contract;
use idem_contract::headers::IDEMPOTENT_REPLAYED_HEADER;
use idem_contract::problem::ProblemType;
use metrics::{Key, Label, Metadata};
use tracing::Span;
use tracing::field::Empty;

use crate::operation_id::{OPERATION_ID_HEADER, OperationId};
use crate::problem::Problem;

/// The span of one physical attempt.
pub const SPAN_ATTEMPT: &str = "idem.attempt";
/// The event at the end of each attempt, in its span.
pub const EVENT_ATTEMPT_END: &str = "idem.attempt.end";
/// The event when an operation reaches its final state.
pub const EVENT_OPERATION_END: &str = "idem.operation.end";

/// The contract's operation name.
pub const FIELD_OPERATION: &str = "idem.operation";
/// The operation's id, the same for all its attempts.
pub const FIELD_OPERATION_ID: &str = "idem.operation_id";
/// The attempt's number, 1 for the first.
pub const FIELD_ATTEMPT: &str = "idem.attempt";
/// OpenTelemetry's resend count: the attempt's number less one, set only when above 0.
pub const FIELD_RESEND_COUNT: &str = "http.request.resend_count";
/// OpenTelemetry's route: the matched route template.
pub const FIELD_ROUTE: &str = "http.route";
/// OpenTelemetry's request method.
pub const FIELD_METHOD: &str = "http.request.method";
/// OpenTelemetry's response status code.
pub const FIELD_STATUS_CODE: &str = "http.response.status_code";
/// The attempt's [`Outcome`].
pub const FIELD_OUTCOME: &str = "idem.outcome";
/// OpenTelemetry's error class (see the module docs for its values).
pub const FIELD_ERROR_TYPE: &str = "error.type";
/// The attempt's duration in seconds (on [`EVENT_ATTEMPT_END`]).
pub const FIELD_DURATION: &str = "idem.duration_s";
/// The operation's [`FinalOutcome`] (on [`EVENT_OPERATION_END`]).
pub const FIELD_OPERATION_OUTCOME: &str = "idem.final_outcome";

/// Counter: attempts, by [`LABEL_OPERATION`] and [`LABEL_OUTCOME`] ([`Outcome`]).
pub const METRIC_ATTEMPTS: &str = "idem_attempts_total";
/// Histogram: attempt durations in seconds, by [`LABEL_OPERATION`] and [`LABEL_OUTCOME`].
pub const METRIC_ATTEMPT_DURATION: &str = "idem_attempt_duration_seconds";
/// Counter: operations that reached a final state, by [`LABEL_OPERATION`] and
/// [`LABEL_OUTCOME`] ([`FinalOutcome`]).
pub const METRIC_OPERATIONS: &str = "idem_operations_total";
/// The metrics' label of the contract's operation name.
pub const LABEL_OPERATION: &str = "operation";
/// The metrics' label of the outcome.
pub const LABEL_OUTCOME: &str = "outcome";

/// What one attempt came to: the value of `idem.outcome` and of the metrics' `outcome`
/// label. A closed set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// `executed`: the handler ran and its answer was recorded (stored, or committed
    /// with the transaction). The operation is completed.
    Executed,
    /// `replayed`: the stored result was sent again.
    Replayed,
    /// `recovered`: an earlier attempt's lease had ended without an outcome, recovery
    /// found it applied, and its answer was stored and sent.
    Recovered,
    /// `accepted`: 202 with the status lookup's `Location` (`concurrency = accepted`)
    /// while another attempt holds the key.
    Accepted,
    /// `conflict`: 409 `operation-in-progress` while another attempt holds the key.
    Conflict,
    /// `mismatch`: 422 `fingerprint-mismatch`, the key with other significant content.
    Mismatch,
    /// `released`: the handler answered a status the contract declares retryable; the
    /// key was released (in the transactional mode, after the rollback) so that a retry
    /// runs again.
    Released,
    /// `rolled_back`: the transactional mode rolled the attempt back (a 5xx the
    /// contract does not declare retryable, a panic, its time ran out, a result too
    /// large): nothing took effect.
    RolledBack,
    /// `unknown`: the attempt ended without a recorded outcome (its time ran out, it
    /// panicked or answered a 5xx, its lease was lost, the request was dropped): the
    /// record stays processing and recovery decides.
    Unknown,
    /// `parked`: this request parked the operation as unknown, for an operator.
    Parked,
    /// `awaiting_operator`: 409 `operation-outcome-unknown`, parked earlier.
    AwaitingOperator,
    /// `recovery_pending`: 503 `recovery-pending`, recovery could not decide now.
    RecoveryPending,
    /// `store_unavailable`: 503 `store-unavailable` (fail closed).
    StoreUnavailable,
    /// `rejected`: refused before the key was registered (400, 401, 413, an
    /// extractor's rejection, 500 `not-configured`): nothing was recorded.
    Rejected,
}

impl Outcome {
    /// Every outcome, in the order of the enum.
    pub const ALL: [Outcome; 14] = [
        Outcome::Executed,
        Outcome::Replayed,
        Outcome::Recovered,
        Outcome::Accepted,
        Outcome::Conflict,
        Outcome::Mismatch,
        Outcome::Released,
        Outcome::RolledBack,
        Outcome::Unknown,
        Outcome::Parked,
        Outcome::AwaitingOperator,
        Outcome::RecoveryPending,
        Outcome::StoreUnavailable,
        Outcome::Rejected,
    ];

    /// The value, such as `executed`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Executed => "executed",
            Outcome::Replayed => "replayed",
            Outcome::Recovered => "recovered",
            Outcome::Accepted => "accepted",
            Outcome::Conflict => "conflict",
            Outcome::Mismatch => "mismatch",
            Outcome::Released => "released",
            Outcome::RolledBack => "rolled_back",
            Outcome::Unknown => "unknown",
            Outcome::Parked => "parked",
            Outcome::AwaitingOperator => "awaiting_operator",
            Outcome::RecoveryPending => "recovery_pending",
            Outcome::StoreUnavailable => "store_unavailable",
            Outcome::Rejected => "rejected",
        }
    }

    /// The outcome of an answer that is idem's problem `kind`.
    pub const fn of_problem(kind: ProblemType) -> Outcome {
        match kind {
            ProblemType::FingerprintMismatch => Outcome::Mismatch,
            ProblemType::OperationInProgress => Outcome::Conflict,
            ProblemType::OperationOutcomeUnknown => Outcome::AwaitingOperator,
            ProblemType::AttemptTimedOut | ProblemType::AttemptFailed => Outcome::Unknown,
            ProblemType::AttemptRolledBack | ProblemType::ResultTooLarge => Outcome::RolledBack,
            ProblemType::RecoveryPending => Outcome::RecoveryPending,
            ProblemType::StoreUnavailable => Outcome::StoreUnavailable,
            _ => Outcome::Rejected,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The final state an operation reached: the value of `idem.final_outcome` and of
/// `idem_operations_total`'s `outcome` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FinalOutcome {
    /// `completed`: an attempt's answer was recorded (a success or a permanent error).
    Completed,
    /// `recovered`: recovery found an ended attempt applied and recorded its answer.
    Recovered,
    /// `parked`: the outcome is unknown; an operator resolves it.
    Parked,
}

impl FinalOutcome {
    /// Every final outcome, in the order of the enum.
    pub const ALL: [FinalOutcome; 3] = [
        FinalOutcome::Completed,
        FinalOutcome::Recovered,
        FinalOutcome::Parked,
    ];

    /// The value, such as `completed`.
    pub const fn as_str(self) -> &'static str {
        match self {
            FinalOutcome::Completed => "completed",
            FinalOutcome::Recovered => "recovered",
            FinalOutcome::Parked => "parked",
        }
    }
}

impl std::fmt::Display for FinalOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Registers the help texts and units of idem's metrics with the installed recorder.
/// Call it once, after installing the recorder.
pub fn describe_metrics() {
    metrics::describe_counter!(
        METRIC_ATTEMPTS,
        metrics::Unit::Count,
        "Physical attempts of contracted operations (every request to a contracted handler), by operation and outcome."
    );
    metrics::describe_histogram!(
        METRIC_ATTEMPT_DURATION,
        metrics::Unit::Seconds,
        "Duration of the attempts of contracted operations, by operation and outcome."
    );
    metrics::describe_counter!(
        METRIC_OPERATIONS,
        metrics::Unit::Count,
        "Contracted operations that reached a final state (completed, recovered, parked), by operation and outcome."
    );
}

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// The metric keys of one operation, made once (when its name is claimed in an `Idem`
/// handle), so that counting an attempt allocates nothing.
pub(crate) struct OperationMetrics {
    attempts: Vec<Key>,
    durations: Vec<Key>,
    finals: Vec<Key>,
}

impl OperationMetrics {
    pub(crate) fn new(operation: &'static str) -> OperationMetrics {
        let keys = |name: &'static str, outcomes: &[&'static str]| -> Vec<Key> {
            outcomes
                .iter()
                .map(|&outcome| {
                    let labels = vec![
                        Label::new(LABEL_OPERATION, operation),
                        Label::new(LABEL_OUTCOME, outcome),
                    ];
                    Key::from_parts(name, labels)
                })
                .collect()
        };
        let outcomes = Outcome::ALL.map(Outcome::as_str);
        let finals = FinalOutcome::ALL.map(FinalOutcome::as_str);
        OperationMetrics {
            attempts: keys(METRIC_ATTEMPTS, &outcomes),
            durations: keys(METRIC_ATTEMPT_DURATION, &outcomes),
            finals: keys(METRIC_OPERATIONS, &finals),
        }
    }
}

/// Marks `response` with the outcome it stands for, where its status and headers alone
/// would say otherwise (a recovered result is sent as a replay).
pub(crate) fn tagged(mut response: Response, outcome: Outcome) -> Response {
    response.extensions_mut().insert(outcome);
    response
}

/// Records on the current span (the attempt's, during registration) that the request
/// found a record of `attempts` attempts: it is a resend, at least the next one. (Its
/// operation id is recorded with the answer, which carries it.)
pub(crate) fn found_record(attempts: u32) {
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    record_number(&span, attempts.saturating_add(1));
}

fn record_number(span: &Span, number: u32) {
    span.record(FIELD_ATTEMPT, number);
    if number > 1 {
        span.record(FIELD_RESEND_COUNT, number - 1);
    }
}

/// The operation reached its final state: one event, one count.
pub(crate) fn operation_ended(
    metrics: Option<&OperationMetrics>,
    operation: &'static str,
    outcome: FinalOutcome,
    operation_id: OperationId,
    attempt: u32,
    status: u16,
) {
    tracing::event!(
        name: EVENT_OPERATION_END,
        tracing::Level::INFO,
        { FIELD_OPERATION } = operation,
        { FIELD_OPERATION_ID } = tracing::field::display(operation_id),
        { FIELD_OPERATION_OUTCOME } = outcome.as_str(),
        { FIELD_ATTEMPT } = attempt,
        { FIELD_STATUS_CODE } = status,
        "idem: the operation is {}",
        outcome.as_str()
    );
    match metrics {
        Some(keys) => metrics::with_recorder(|recorder| {
            recorder
                .register_counter(&keys.finals[outcome as usize], &METADATA)
                .increment(1);
        }),
        None => metrics::counter!(
            METRIC_OPERATIONS,
            LABEL_OPERATION => operation,
            LABEL_OUTCOME => outcome.as_str()
        )
        .increment(1),
    }
}

/// The telemetry of one physical attempt: its span, its start, and its operation's
/// metric keys. Finished once, with the answer; dropped unfinished (the request was
/// dropped before its answer), it ends as `unknown`, `cancelled`.
pub(crate) struct AttemptTelemetry {
    span: Span,
    started: Instant,
    operation: &'static str,
    metrics: Option<Arc<OperationMetrics>>,
    /// Whether the span has its operation id (recorded once: a log shows every record).
    has_id: bool,
    finished: bool,
}

impl AttemptTelemetry {
    /// Opens the attempt's span for `request` to the handler of `contract`.
    pub(crate) fn start<B>(contract: &'static Contract, request: &Request<B>) -> AttemptTelemetry {
        let operation: &'static str = &contract.operation;
        let span = tracing::info_span!(
            SPAN_ATTEMPT,
            { FIELD_OPERATION } = operation,
            { FIELD_OPERATION_ID } = Empty,
            { FIELD_ATTEMPT } = Empty,
            { FIELD_RESEND_COUNT } = Empty,
            { FIELD_ROUTE } = request
                .extensions()
                .get::<MatchedPath>()
                .map(MatchedPath::as_str),
            { FIELD_METHOD } = request.method().as_str(),
            { FIELD_STATUS_CODE } = Empty,
            { FIELD_OUTCOME } = Empty,
            { FIELD_ERROR_TYPE } = Empty,
        );
        AttemptTelemetry {
            span,
            started: Instant::now(),
            operation,
            metrics: None,
            has_id: false,
            finished: false,
        }
    }

    /// The attempt's span.
    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    /// The operation's metric keys, once its name is claimed.
    pub(crate) fn set_metrics(&mut self, metrics: &Arc<OperationMetrics>) {
        self.metrics = Some(Arc::clone(metrics));
    }

    /// The attempt registered the key (as attempt `number` of `operation_id`).
    pub(crate) fn registered(&mut self, operation_id: OperationId, number: u32) {
        if self.span.is_disabled() {
            return;
        }
        self.has_id = true;
        self.span
            .record(FIELD_OPERATION_ID, tracing::field::display(operation_id));
        record_number(&self.span, number);
    }

    /// The attempt was answered without running the handler: a replay, a problem, the
    /// concurrency answer, a recovery, an extractor's rejection.
    pub(crate) fn answered(mut self, response: &Response) {
        let outcome = response
            .extensions()
            .get::<Outcome>()
            .copied()
            .or_else(|| {
                response
                    .headers()
                    .contains_key(IDEMPOTENT_REPLAYED_HEADER)
                    .then_some(Outcome::Replayed)
            })
            .or_else(|| problem_of(response).map(Outcome::of_problem))
            .unwrap_or(Outcome::Rejected);
        self.finish(outcome, response);
    }

    /// The attempt `number` of `operation_id` ran the handler and settled its answer;
    /// `settled` is what the settlement recorded, if anything.
    pub(crate) fn settled(
        mut self,
        response: &Response,
        settled: Option<Outcome>,
        operation_id: OperationId,
        number: u32,
    ) {
        // The handler's own answer, stored: whatever it is (it may be a problem the
        // handler built), the operation is completed.
        if settled == Some(Outcome::Executed) {
            let status = response.status().as_u16();
            self.finish(Outcome::Executed, response);
            operation_ended(
                self.metrics.as_deref(),
                self.operation,
                FinalOutcome::Completed,
                operation_id,
                number,
                status,
            );
            return;
        }
        // Else: the answer says what it stands for (a result too large to store went
        // out as it is), or idem answered with a problem of its own (the attempt failed,
        // timed out, was rolled back, the store failed), or the handler's answer went
        // out as it is (released, rolled back).
        let outcome = response
            .extensions()
            .get::<Outcome>()
            .copied()
            .or_else(|| problem_of(response).map(Outcome::of_problem))
            .or(settled)
            .unwrap_or(Outcome::Unknown);
        self.finish(outcome, response);
    }

    /// The attempt was answered with one of idem's own problems before it ran.
    pub(crate) fn answered_problem(mut self, problem: &Problem) {
        let kind = problem.kind();
        let id = problem.operation_id().map(|id| id.to_string());
        self.finish_with(
            Outcome::of_problem(kind),
            kind.status(),
            Some(kind),
            id.as_deref(),
        );
    }

    fn finish(&mut self, outcome: Outcome, response: &Response) {
        let id = response
            .headers()
            .get(OPERATION_ID_HEADER)
            .and_then(|v| v.to_str().ok());
        let status = response.status().as_u16();
        self.finish_with(outcome, status, problem_of(response), id);
    }

    fn finish_with(
        &mut self,
        outcome: Outcome,
        status: u16,
        problem: Option<ProblemType>,
        operation_id: Option<&str>,
    ) {
        self.finished = true;
        let seconds = self.started.elapsed().as_secs_f64();
        let error = problem
            .map(ProblemType::slug)
            .or_else(|| (outcome == Outcome::Parked).then_some("result-too-large"))
            .or_else(|| failed_status(outcome, status));
        if !self.span.is_disabled() {
            if !self.has_id
                && let Some(id) = operation_id
            {
                self.span.record(FIELD_OPERATION_ID, id);
            }
            self.span.record(FIELD_STATUS_CODE, status);
            self.span.record(FIELD_OUTCOME, outcome.as_str());
            if let Some(error) = error {
                self.span.record(FIELD_ERROR_TYPE, error);
            }
        }
        self.end(outcome, status, error, seconds);
    }

    fn end(&self, outcome: Outcome, status: u16, error: Option<&str>, seconds: f64) {
        tracing::event!(
            name: EVENT_ATTEMPT_END,
            parent: &self.span,
            tracing::Level::INFO,
            { FIELD_OUTCOME } = outcome.as_str(),
            { FIELD_STATUS_CODE } = status,
            { FIELD_ERROR_TYPE } = error,
            { FIELD_DURATION } = seconds,
            "idem: attempt {}",
            outcome.as_str()
        );
        match &self.metrics {
            Some(keys) => metrics::with_recorder(|recorder| {
                recorder
                    .register_counter(&keys.attempts[outcome.index()], &METADATA)
                    .increment(1);
                recorder
                    .register_histogram(&keys.durations[outcome.index()], &METADATA)
                    .record(seconds);
            }),
            // Refused before the operation's name was claimed (500 `not-configured`).
            None => {
                let labels = [
                    (LABEL_OPERATION, self.operation),
                    (LABEL_OUTCOME, outcome.as_str()),
                ];
                metrics::counter!(METRIC_ATTEMPTS, &labels).increment(1);
                metrics::histogram!(METRIC_ATTEMPT_DURATION, &labels).record(seconds);
            }
        }
    }
}

impl Drop for AttemptTelemetry {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        let seconds = self.started.elapsed().as_secs_f64();
        self.span.record(FIELD_OUTCOME, Outcome::Unknown.as_str());
        self.span.record(FIELD_ERROR_TYPE, "cancelled");
        self.end(Outcome::Unknown, 0, Some("cancelled"), seconds);
    }
}

/// The problem idem answered with, if `response` is one.
fn problem_of(response: &Response) -> Option<ProblemType> {
    response.extensions().get::<ProblemType>().copied()
}

/// The status code as the error class of a failed answer that is no problem of idem's.
fn failed_status(outcome: Outcome, status: u16) -> Option<&'static str> {
    if matches!(
        outcome,
        Outcome::Executed | Outcome::Replayed | Outcome::Recovered | Outcome::Accepted
    ) || status < 400
    {
        return None;
    }
    Some(status_str(status))
}

/// The status code as a `&'static str` (a label's value must be one to cost nothing).
fn status_str(status: u16) -> &'static str {
    match status {
        400 => "400",
        401 => "401",
        403 => "403",
        404 => "404",
        405 => "405",
        406 => "406",
        408 => "408",
        409 => "409",
        410 => "410",
        411 => "411",
        412 => "412",
        413 => "413",
        415 => "415",
        422 => "422",
        428 => "428",
        429 => "429",
        431 => "431",
        500 => "500",
        501 => "501",
        502 => "502",
        503 => "503",
        504 => "504",
        s if s < 500 => "4xx",
        _ => "5xx",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use axum::response::IntoResponse;

    use super::*;
    use crate::problem::Problem;

    #[test]
    fn outcomes_are_a_closed_set_of_distinct_snake_case_values() {
        let values: HashSet<_> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(values.len(), Outcome::ALL.len());
        for (i, outcome) in Outcome::ALL.iter().enumerate() {
            assert_eq!(outcome.index(), i, "ALL is in the order of the enum");
            assert!(
                outcome
                    .as_str()
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_')
            );
        }
        let finals: HashSet<_> = FinalOutcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(finals.len(), FinalOutcome::ALL.len());
    }

    #[test]
    fn every_problem_has_an_outcome() {
        for kind in ProblemType::ALL {
            let expected = match kind.slug() {
                "fingerprint-mismatch" => Outcome::Mismatch,
                "operation-in-progress" => Outcome::Conflict,
                "operation-outcome-unknown" => Outcome::AwaitingOperator,
                "attempt-timed-out" | "attempt-failed" => Outcome::Unknown,
                "attempt-rolled-back" | "result-too-large" => Outcome::RolledBack,
                "recovery-pending" => Outcome::RecoveryPending,
                "store-unavailable" => Outcome::StoreUnavailable,
                _ => Outcome::Rejected,
            };
            assert_eq!(Outcome::of_problem(*kind), expected, "{}", kind.slug());
        }
    }

    #[test]
    fn problems_carry_their_case_and_answers_their_class() {
        let response = Problem::new(ProblemType::StoreUnavailable, "down").into_response();
        assert_eq!(problem_of(&response), Some(ProblemType::StoreUnavailable));
        assert_eq!(failed_status(Outcome::Released, 429), Some("429"));
        assert_eq!(failed_status(Outcome::RolledBack, 599), Some("5xx"));
        assert_eq!(failed_status(Outcome::Replayed, 404), None);
        assert_eq!(failed_status(Outcome::Executed, 500), None);
        let tagged = tagged(().into_response(), Outcome::Accepted);
        assert_eq!(
            tagged.extensions().get::<Outcome>(),
            Some(&Outcome::Accepted)
        );
    }

    #[test]
    fn metric_keys_name_the_operation_and_each_outcome() {
        let keys = OperationMetrics::new("create_order");
        assert_eq!(keys.attempts.len(), Outcome::ALL.len());
        assert_eq!(keys.durations.len(), Outcome::ALL.len());
        assert_eq!(keys.finals.len(), FinalOutcome::ALL.len());
        let key = &keys.attempts[Outcome::Mismatch.index()];
        assert_eq!(key.name(), METRIC_ATTEMPTS);
        let labels: Vec<_> = key.labels().map(|l| (l.key(), l.value())).collect();
        assert_eq!(
            labels,
            [
                (LABEL_OPERATION, "create_order"),
                (LABEL_OUTCOME, "mismatch")
            ]
        );
    }
}
