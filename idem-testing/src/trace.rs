//! Proof 4 from the service's own telemetry: [`TraceCapture`], a `tracing` layer that keeps
//! idem's attempt spans and final-outcome events, and the check built from it.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use crate::report::{Scenario, Verdict};
use crate::seen::Evidence;
use idem_runtime::telemetry::{
    EVENT_OPERATION_END, FIELD_ATTEMPT, FIELD_OPERATION_ID, FIELD_OPERATION_OUTCOME, FIELD_OUTCOME,
    FIELD_RESEND_COUNT, FIELD_STATUS_CODE, SPAN_ATTEMPT,
};

/// How long the check waits for the spans of a scenario's last answers to end.
const SETTLE: Duration = Duration::from_secs(2);

/// One `idem.attempt` span as the capture saw it (its fields as text).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttemptSpan {
    /// Its fields, by name (`idem.operation_id`, `idem.attempt`, `idem.outcome`, …).
    pub fields: BTreeMap<String, String>,
    /// Whether the span has closed.
    pub closed: bool,
}

impl AttemptSpan {
    fn number(&self, field: &str) -> Option<u64> {
        self.fields.get(field)?.parse().ok()
    }

    /// `idem.attempt`: the attempt's number.
    pub fn attempt(&self) -> Option<u64> {
        self.number(FIELD_ATTEMPT)
    }

    /// `http.request.resend_count`.
    pub fn resend_count(&self) -> Option<u64> {
        self.number(FIELD_RESEND_COUNT)
    }

    /// `idem.outcome`, once the attempt has ended.
    pub fn outcome(&self) -> Option<&str> {
        self.fields.get(FIELD_OUTCOME).map(String::as_str)
    }

    fn describe(&self) -> String {
        format!(
            "#{} {}{}",
            self.attempt().map_or_else(|| "?".into(), |n| n.to_string()),
            self.outcome().unwrap_or("(not ended)"),
            self.fields
                .get(FIELD_STATUS_CODE)
                .map(|s| format!(" {s}"))
                .unwrap_or_default()
        )
    }
}

#[derive(Default)]
struct Captured {
    spans: Vec<AttemptSpan>,
    /// `idem.operation.end` events: their fields.
    ends: Vec<BTreeMap<String, String>>,
}

/// The index of an attempt span in [`Captured::spans`] (span ids are reused once closed).
struct Index(usize);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// A `tracing_subscriber::Layer` that keeps idem's `idem.attempt` spans and
/// `idem.operation.end` events (nothing else), so that the Monday test can read the
/// trace of each scenario's operation: proof 4 ([`TraceCapture::check`]).
///
/// The service under test runs on other tasks and threads than the test, so a
/// thread-local default subscriber would miss most of its spans: install the capture
/// for the whole process, either as a layer of your own subscriber (its per-layer
/// filters stay yours) or alone, with [`TraceCapture::install_global`]. It keeps what
/// it sees until dropped (or [`TraceCapture::clear`]): a tool for tests, not for a
/// service's own build. Cloning it shares what it captured.
///
/// ```no_run
/// use tracing_subscriber::prelude::*;
/// # fn demo() -> idem_testing::TraceCapture {
/// let capture = idem_testing::TraceCapture::new();
/// tracing_subscriber::registry()
///     .with(tracing_subscriber::fmt::layer().with_filter(tracing_subscriber::EnvFilter::new("warn")))
///     .with(capture.clone())
///     .init();
/// // Harness::for_router(app) … .check_trace(capture.check()) …
/// # capture }
/// ```
#[derive(Clone, Default)]
pub struct TraceCapture {
    captured: Arc<Mutex<Captured>>,
}

impl fmt::Debug for TraceCapture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let captured = self.lock();
        f.debug_struct("TraceCapture")
            .field("attempt_spans", &captured.spans.len())
            .field("operation_ends", &captured.ends.len())
            .finish()
    }
}

impl TraceCapture {
    /// A capture that has seen nothing yet.
    pub fn new() -> TraceCapture {
        TraceCapture::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Captured> {
        self.captured.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Installs a subscriber made of this capture alone (a `tracing_subscriber`
    /// registry with it as its only layer) as the process's global default.
    ///
    /// # Errors
    ///
    /// When the process already has a global default subscriber: add the capture to
    /// that one as a layer instead.
    pub fn install_global(&self) -> Result<(), String> {
        use tracing_subscriber::layer::SubscriberExt;
        let subscriber = tracing_subscriber::registry().with(self.clone());
        tracing::subscriber::set_global_default(subscriber).map_err(|_| {
            "the process already has a global tracing subscriber: add the capture to it as a layer (`.with(capture.clone())`)".to_owned()
        })
    }

    /// The attempt spans of the operation `operation_id`, in the order they began.
    pub fn attempts(&self, operation_id: &str) -> Vec<AttemptSpan> {
        self.lock()
            .spans
            .iter()
            .filter(|s| {
                s.fields
                    .get(FIELD_OPERATION_ID)
                    .is_some_and(|id| id == operation_id)
            })
            .cloned()
            .collect()
    }

    /// The `idem.final_outcome` of each `idem.operation.end` event of the operation
    /// `operation_id` (one, once it reached its final state).
    pub fn final_outcomes(&self, operation_id: &str) -> Vec<String> {
        self.lock()
            .ends
            .iter()
            .filter(|e| {
                e.get(FIELD_OPERATION_ID)
                    .is_some_and(|id| id == operation_id)
            })
            .map(|e| e.get(FIELD_OPERATION_OUTCOME).cloned().unwrap_or_default())
            .collect()
    }

    /// Forgets everything captured so far.
    pub fn clear(&self) {
        let mut captured = self.lock();
        captured.spans.clear();
        captured.ends.clear();
    }

    /// The check of proof 4, for [`Harness::check_trace`](crate::Harness::check_trace):
    /// for the scenario's operation id, the capture must hold an `idem.attempt` span for
    /// every request the harness saw answered (at least), each ended with an
    /// `idem.outcome`; exactly one of them attempt 1, every other a resend (`idem.attempt`
    /// above 1 and `http.request.resend_count` one less, absent on attempt 1); and, when
    /// the operation reached a final state (completed, or parked for an operator),
    /// exactly one `idem.operation.end` event. It waits up to 2 s for the last spans to
    /// end. A scenario whose answers carry no `Operation-Id` fails: its trace cannot be
    /// found.
    pub fn check(
        &self,
    ) -> impl Fn(Evidence) -> Pin<Box<dyn Future<Output = Verdict> + Send>> + Send + Sync + 'static
    {
        let capture = self.clone();
        move |evidence: Evidence| -> Pin<Box<dyn Future<Output = Verdict> + Send>> {
            let capture = capture.clone();
            Box::pin(async move {
                let Some(id) = evidence.operation_id() else {
                    return Verdict::Fail(
                        "no answer carries an Operation-Id, and no status lookup names one: the operation's trace cannot be found".into(),
                    );
                };
                let until = tokio::time::Instant::now() + SETTLE;
                loop {
                    let verdict = judge(
                        &evidence,
                        &id,
                        &capture.attempts(&id),
                        &capture.final_outcomes(&id),
                    );
                    if verdict.is_pass() || tokio::time::Instant::now() >= until {
                        return verdict;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        }
    }
}

/// Whether the scenario's operation reached a final state, as HTTP showed it: the status
/// lookup says completed or unknown, or (without a lookup) the last answer is a result,
/// the replayed permanent 400, or a parked operation's 409.
fn reached_final(evidence: &Evidence) -> bool {
    if let Some(state) = evidence
        .lookup
        .as_ref()
        .and_then(|l| l.get("state"))
        .and_then(|s| s.as_str())
    {
        return matches!(state, "completed" | "unknown");
    }
    evidence.answers.last().is_some_and(|last| {
        last.success()
            || last.is_parked()
            || (evidence.scenario == Scenario::Permanent400 && last.status == Some(400))
    })
}

fn judge(evidence: &Evidence, id: &str, spans: &[AttemptSpan], ends: &[String]) -> Verdict {
    // A crashed attempt that left nothing ran under an operation that was never kept.
    let attempts = spans.iter().filter_map(AttemptSpan::attempt).max();
    let requests = evidence.answers.len() - usize::from(evidence.crash_left_nothing(attempts));
    let shown = runs(spans.iter().map(AttemptSpan::describe));
    if spans.len() < requests {
        return Verdict::Fail(format!(
            "{} idem.attempt span(s) under {id} for {requests} request(s) the service answered{}",
            spans.len(),
            if shown.is_empty() {
                String::new()
            } else {
                format!(": {shown}")
            }
        ));
    }
    if let Some(open) = spans.iter().find(|s| s.outcome().is_none()) {
        return Verdict::Fail(format!(
            "an attempt span under {id} has no idem.outcome (the attempt never ended): {}",
            open.describe()
        ));
    }
    let firsts = spans.iter().filter(|s| s.attempt() == Some(1)).count();
    if firsts != 1 {
        return Verdict::Fail(format!(
            "{firsts} span(s) under {id} are attempt 1, expected exactly one: {shown}"
        ));
    }
    for span in spans {
        let ok = match span.attempt() {
            Some(1) => span.resend_count().is_none(),
            Some(n) if n > 1 => span.resend_count() == Some(n - 1),
            _ => false,
        };
        if !ok {
            return Verdict::Fail(format!(
                "span {} under {id}: idem.attempt {} with http.request.resend_count {} (a resend counts idem.attempt − 1; the first attempt has none)",
                span.describe(),
                span.attempt()
                    .map_or_else(|| "missing".into(), |n| n.to_string()),
                span.resend_count()
                    .map_or_else(|| "absent".into(), |n| n.to_string()),
            ));
        }
    }
    let resends = spans.len() - 1;
    let final_expected = reached_final(evidence);
    let ends_shown = if ends.is_empty() {
        "no idem.operation.end".to_owned()
    } else {
        format!("idem.operation.end: {}", ends.join(", "))
    };
    if final_expected && ends.len() != 1 {
        return Verdict::Fail(format!(
            "{} idem.operation.end event(s) under {id} for an operation that reached its final state, expected exactly one ({shown})",
            ends.len()
        ));
    }
    if !final_expected && ends.len() > 1 {
        return Verdict::Fail(format!(
            "{} idem.operation.end events under {id}, expected at most one",
            ends.len()
        ));
    }
    Verdict::Pass(format!(
        "{} attempt span(s) for {requests} request(s), 1 first and {resends} resend(s): {shown}; {ends_shown}",
        spans.len()
    ))
}

/// The spans' descriptions, a run of equal ones as one with its count (`#2 conflict 409 ×9`).
fn runs(descriptions: impl Iterator<Item = String>) -> String {
    let mut out: Vec<(String, usize)> = Vec::new();
    for d in descriptions {
        match out.last_mut() {
            Some((last, n)) if *last == d => *n += 1,
            _ => out.push((d, 1)),
        }
    }
    out.into_iter()
        .map(|(d, n)| if n == 1 { d } else { format!("{d} ×{n}") })
        .collect::<Vec<_>>()
        .join(", ")
}

impl<S> Layer<S> for TraceCapture
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != SPAN_ATTEMPT {
            return;
        }
        let Some(span) = ctx.span(id) else { return };
        let mut data = AttemptSpan::default();
        attrs.record(&mut Fields(&mut data.fields));
        let mut captured = self.lock();
        span.extensions_mut().insert(Index(captured.spans.len()));
        captured.spans.push(data);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let Some(index) = span.extensions().get::<Index>().map(|i| i.0) else {
            return;
        };
        if let Some(data) = self.lock().spans.get_mut(index) {
            values.record(&mut Fields(&mut data.fields));
        }
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().name() != EVENT_OPERATION_END {
            return;
        }
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.lock().ends.push(fields);
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(index) = span.extensions().get::<Index>().map(|i| i.0) else {
            return;
        };
        if let Some(data) = self.lock().spans.get_mut(index) {
            data.closed = true;
        }
    }
}
