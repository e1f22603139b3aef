//! Telemetry: one span per physical attempt, one event when an operation reaches its
//! final state, and counters of both, under names defined once, here.
//!
//! The guide (what a span can honestly mean when a business operation is several HTTP
//! requests, every name with its value, the attempt number, the cost, what is never
//! recorded, and how to export it all over OTLP) is the `telemetry` module of the `idem`
//! crate, `docs/telemetry.md` in the repository.

use std::sync::Arc;
use std::time::Instant;

use crate::header::{IDEMPOTENT_REPLAYED, OPERATION_ID};
use axum::extract::MatchedPath;
use axum::response::Response;
use http::Request;
use idem_contract::Contract;
use idem_contract::problem::ProblemType;
use metrics::{Key, Label, Metadata};
use tracing::Span;
use tracing::field::Empty;

use crate::operation_id::OperationId;
use crate::problem::Problem;

/// The span of one physical attempt.
pub const SPAN_ATTEMPT: &str = "idem.attempt";
/// The event at the end of each attempt, in its span.
pub const EVENT_ATTEMPT_END: &str = "idem.attempt.end";
/// The span of one call of a journal step ([`crate::Journal::step`]), inside its
/// attempt's span: the step's name, position and call number, never its value.
pub const SPAN_STEP: &str = "idem.step";
/// A step's name, as the handler gave it.
pub const FIELD_STEP_NAME: &str = "idem.step.name";
/// A step's position in the handler's sequence, from 0.
pub const FIELD_STEP_INDEX: &str = "idem.step.index";
/// How many times the step's call has been sent, this one included (1 for the first).
pub const FIELD_STEP_CALL: &str = "idem.step.call";
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
/// OpenTelemetry's error class (its values: the guide, `idem::telemetry`).
pub const FIELD_ERROR_TYPE: &str = "error.type";
/// The attempt's duration in seconds (on [`EVENT_ATTEMPT_END`]).
pub const FIELD_DURATION: &str = "idem.duration_s";
/// The operation's [`FinalOutcome`] (on [`EVENT_OPERATION_END`]).
pub const FIELD_OPERATION_OUTCOME: &str = "idem.final_outcome";
/// How far this instance's clock is ahead of the store's, in milliseconds (negative:
/// behind), on the warning that it is off by more than a quarter of the lease.
pub const FIELD_CLOCK_SKEW: &str = "idem.clock_skew_ms";

/// Counter: attempts, by [`LABEL_OPERATION`] and [`LABEL_OUTCOME`] ([`Outcome`]).
pub const METRIC_ATTEMPTS: &str = "idem_attempts_total";
/// Histogram: attempt durations in seconds, by [`LABEL_OPERATION`] and [`LABEL_OUTCOME`].
pub const METRIC_ATTEMPT_DURATION: &str = "idem_attempt_duration_seconds";
/// Counter: operations that reached a final state, by [`LABEL_OPERATION`] and
/// [`LABEL_OUTCOME`] ([`FinalOutcome`]).
pub const METRIC_OPERATIONS: &str = "idem_operations_total";
/// Gauge: how far this instance's clock is ahead of the store's, in milliseconds
/// (negative: behind), at the last reading of the store's clock; set only for a store
/// with a clock of its own (PostgreSQL, Redis).
pub const METRIC_CLOCK_SKEW: &str = "idem_clock_skew_ms";
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
    /// contract does not declare retryable, a panic, its time ran out): nothing took
    /// effect.
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
    /// `store_full`: 503 `store-full`, the store answered that it is full (fail closed).
    StoreFull,
    /// `over_budget`: 429 `client-budget-exhausted`, a new key from a client at its
    /// budget in the store (`store::budget`): nothing was registered.
    OverBudget,
    /// `rejected`: refused before the key was registered (400, 401, 413, an
    /// extractor's rejection, 500 `not-configured`): nothing was recorded.
    Rejected,
}

impl Outcome {
    /// Every outcome, in the order of the enum.
    pub const ALL: [Outcome; 16] = [
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
        Outcome::StoreFull,
        Outcome::OverBudget,
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
            Outcome::StoreFull => "store_full",
            Outcome::OverBudget => "over_budget",
            Outcome::Rejected => "rejected",
        }
    }

    /// The outcome of an answer that is idem's problem `kind`.
    pub const fn of_problem(kind: ProblemType) -> Outcome {
        match kind {
            ProblemType::FingerprintMismatch => Outcome::Mismatch,
            ProblemType::OperationInProgress => Outcome::Conflict,
            ProblemType::OperationOutcomeUnknown => Outcome::AwaitingOperator,
            ProblemType::AttemptTimedOut
            | ProblemType::AttemptFailed
            | ProblemType::StepOutcomeUnknown => Outcome::Unknown,
            ProblemType::AttemptRolledBack => Outcome::RolledBack,
            ProblemType::RecoveryPending => Outcome::RecoveryPending,
            ProblemType::StoreUnavailable => Outcome::StoreUnavailable,
            ProblemType::StoreFull => Outcome::StoreFull,
            ProblemType::ClientBudgetExhausted => Outcome::OverBudget,
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
    metrics::describe_gauge!(
        METRIC_CLOCK_SKEW,
        metrics::Unit::Milliseconds,
        "How far this instance's clock is ahead of the store's (negative: behind), at the last reading of the store's clock."
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

/// Records on the current span (the attempt's) that it answers as a resend of operation
/// `operation_id`, whose record of `attempts` attempts another attempt committed first:
/// this one registered the key under an operation id of its own, which was never kept
/// (its transaction rolled back when it lost its record), and its answer is that
/// operation's, replayed.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn answered_for(operation_id: OperationId, attempts: u32) {
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    span.record(FIELD_OPERATION_ID, tracing::field::display(operation_id));
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
                    .contains_key(IDEMPOTENT_REPLAYED)
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
            .get(OPERATION_ID)
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
                "attempt-timed-out" | "attempt-failed" | "step-outcome-unknown" => Outcome::Unknown,
                "attempt-rolled-back" => Outcome::RolledBack,
                "recovery-pending" => Outcome::RecoveryPending,
                "store-unavailable" => Outcome::StoreUnavailable,
                "store-full" => Outcome::StoreFull,
                "client-budget-exhausted" => Outcome::OverBudget,
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
