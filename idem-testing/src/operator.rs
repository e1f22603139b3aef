//! Proof 5 through the operator's tools: [`OperatorCheck`], which reads a scenario's
//! operation from the service's store as `idem ops show` does, and resolves a parked one
//! as `idem ops resolve` does.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, HeaderValue};

use crate::report::{Scenario, Verdict};
use crate::seen::{Evidence, Seen};
use idem_runtime::Idem;
use idem_runtime::store::{
    AttemptEnd, Inspection, RecordKey, RecordState, Resolution, ResolutionOutcome, Store,
    StoredResponse, UnixMillis, store_now, unix_now,
};

/// Where the check finds the store.
#[derive(Clone)]
enum Source {
    Store(Arc<dyn Store>),
    Idem(Idem),
}

impl Source {
    fn store(&self) -> &dyn Store {
        match self {
            Source::Store(store) => &**store,
            Source::Idem(idem) => idem.store(),
        }
    }

    /// The store's time, by which the service judges records (this process's clock if
    /// the store's cannot be read: the store call that follows then fails alike).
    async fn now(&self) -> UnixMillis {
        match self {
            Source::Store(store) => store_now(&**store).await.unwrap_or_else(|_| unix_now()),
            Source::Idem(idem) => idem.now().await,
        }
    }
}

/// The check of proof 5 (an operator can restore the state without editing the database
/// by hand), through the store's operator calls:
/// [`OperatorStore::inspect`](idem_runtime::store::OperatorStore::inspect) (what `idem ops show`
/// prints) and [`OperatorStore::resolve`](idem_runtime::store::OperatorStore::resolve) (what
/// `idem ops resolve` writes), never SQL.
///
/// For each scenario it finds the operation's record under the scenario's key and
/// checks that an operator sees it as HTTP showed it: the same operation id, the state
/// the last answer (and the status lookup) showed, and every attempt, each before the
/// last with how it ended, at least as many as the scenario made (two after a 429, a
/// 503 or a crash). A completed operation has nothing to restore, and the check says so.
/// A parked one (the crash, when recovery could not decide) is resolved: as *completed*
/// with [`OperatorCheck::completed_answer`] when the scenario counted its effect, as
/// *not applied* when it did not; then the scenario's request is sent again, and must get
/// the operator's answer (or, not applied, a result under the same operation id), and
/// the resolution must be in the record's history.
///
/// ```no_run
/// # fn demo(idem: idem_runtime::Idem, app: axum::Router) {
/// use idem_testing::{Harness, OperatorCheck};
/// let operator = OperatorCheck::for_idem(&idem, "create_order"); // the contract's operation name
/// let harness = Harness::for_router(app)
///     .client_header("x-client-id", "cus_42")  // the store's client is this value by default
///     .check_operator(operator.check());
/// # }
/// ```
///
/// # Default
///
/// - the client identity: the value of the harness's client header
///   ([`Harness::client_header`](crate::Harness::client_header));
/// - the answer of a parked operation resolved as completed: `200`,
///   `content-type: application/json`, `{"resolved_by":"idem::testing"}`.
#[derive(Clone)]
pub struct OperatorCheck {
    source: Source,
    operation: String,
    client: Option<String>,
    answer: StoredResponse,
}

impl fmt::Debug for OperatorCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OperatorCheck")
            .field("operation", &self.operation)
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl OperatorCheck {
    /// The check over `store` (the service's own: the same records), for the contract's
    /// operation named `operation` (`create_order`).
    pub fn new(store: Arc<dyn Store>, operation: impl Into<String>) -> OperatorCheck {
        OperatorCheck::with_source(Source::Store(store), operation.into())
    }

    /// The check over the store of the service's `Idem` handle.
    pub fn for_idem(idem: &Idem, operation: impl Into<String>) -> OperatorCheck {
        OperatorCheck::with_source(Source::Idem(idem.clone()), operation.into())
    }

    fn with_source(source: Source, operation: String) -> OperatorCheck {
        OperatorCheck {
            source,
            operation,
            client: None,
            answer: StoredResponse {
                status: 200,
                headers: vec![(
                    HeaderName::from_static("content-type"),
                    HeaderValue::from_static("application/json"),
                )],
                body: Bytes::from_static(br#"{"resolved_by":"idem::testing"}"#),
            },
        }
    }

    /// The client's identity as the store records it, when it is not the client
    /// header's value (an identity derived from a token, say).
    pub fn client(mut self, identity: impl Into<String>) -> OperatorCheck {
        self.client = Some(identity.into());
        self
    }

    /// The answer an operator stores when resolving a parked operation as completed.
    pub fn completed_answer(mut self, answer: StoredResponse) -> OperatorCheck {
        self.answer = answer;
        self
    }

    /// The check, for [`Harness::check_operator`](crate::Harness::check_operator).
    pub fn check(
        &self,
    ) -> impl Fn(Evidence) -> Pin<Box<dyn Future<Output = Verdict> + Send>> + Send + Sync + 'static
    {
        let this = self.clone();
        move |evidence: Evidence| -> Pin<Box<dyn Future<Output = Verdict> + Send>> {
            let this = this.clone();
            Box::pin(async move { this.judge(&evidence).await })
        }
    }

    async fn judge(&self, evidence: &Evidence) -> Verdict {
        let Some(client) = self.client.clone().or_else(|| evidence.client.clone()) else {
            return Verdict::Fail(
                "no client identity to find the record under: give the harness a client header, or `OperatorCheck::client`".into(),
            );
        };
        let key = RecordKey::new(self.operation.clone(), client, evidence.key.clone());
        let inspection = match self.inspect(&key).await {
            Ok(found) => found,
            Err(why) => return Verdict::Fail(why),
        };
        if let Err(why) = consistent(evidence, &inspection) {
            return Verdict::Fail(why);
        }
        let seen = describe(&inspection);
        match &inspection.record.state {
            RecordState::Unknown { reason } => {
                self.restore(evidence, &key, &inspection, reason).await
            }
            RecordState::Completed { .. } => Verdict::Pass(format!(
                "Store::inspect (idem ops show) shows it as HTTP did: {seen}; nothing to restore"
            )),
            RecordState::Released | RecordState::Processing { .. } => Verdict::Pass(format!(
                "Store::inspect (idem ops show) shows it as HTTP did: {seen}; a retry with the key decides it"
            )),
        }
    }

    async fn inspect(&self, key: &RecordKey) -> Result<Inspection, String> {
        let now = self.source.now().await;
        match self.source.store().inspect(key, now).await {
            Ok(Some(found)) => Ok(found),
            Ok(None) => Err(format!(
                "Store::inspect finds no record for operation `{}`, client `{}`, key `{}`: an operator cannot see what HTTP showed",
                key.operation, key.client, key.key
            )),
            Err(e) => Err(format!("Store::inspect failed: {e}")),
        }
    }

    /// Resolves the parked operation as an operator would, then sends the request again.
    async fn restore(
        &self,
        evidence: &Evidence,
        key: &RecordKey,
        parked: &Inspection,
        reason: &str,
    ) -> Verdict {
        let attempt = parked.record.attempt;
        let completed = evidence.effects > 0;
        let resolve = Resolution {
            expected_attempt: attempt,
            outcome: if completed {
                ResolutionOutcome::Completed(self.answer.clone())
            } else {
                ResolutionOutcome::NotApplied
            },
            by: "idem::testing".into(),
            reason: format!(
                "the Monday test: the scenario counted {} effect(s)",
                evidence.effects
            ),
        };
        let how = if completed {
            "completed"
        } else {
            "not applied"
        };
        let now = self.source.now().await;
        if let Err(e) = self.source.store().resolve(key, &resolve, now).await {
            return Verdict::Fail(format!(
                "parked at attempt {attempt} ({reason}); Store::resolve (idem ops resolve --as {}) refused: {e}",
                if completed {
                    "completed"
                } else {
                    "not-applied"
                }
            ));
        }
        let retry = evidence.resend().await;
        let got = if completed {
            retry.complete()
                && retry.status == Some(self.answer.status)
                && retry.body == self.answer.body
        } else {
            retry.success()
                && retry.operation_id.as_deref()
                    == Some(parked.record.operation_id.to_string().as_str())
        };
        if !got {
            return Verdict::Fail(format!(
                "parked at attempt {attempt}, resolved as {how} through Store::resolve, but the retry got {}{}",
                retry.describe(),
                if completed {
                    format!(", not the operator's {}", self.answer.status)
                } else {
                    ", not a result of the same operation".into()
                }
            ));
        }
        let recorded = match self.inspect(key).await {
            Ok(after) => after.resolutions.iter().any(|r| r.attempt == attempt),
            Err(why) => return Verdict::Fail(format!("after the resolution, {why}")),
        };
        if !recorded {
            return Verdict::Fail(format!(
                "parked at attempt {attempt}, resolved as {how}; the retry got {}, but the record's history does not show the resolution",
                retry.describe()
            ));
        }
        Verdict::Pass(format!(
            "parked at attempt {attempt} ({reason}); resolved as {how} through Store::resolve (what idem ops resolve does): the retry got {}; the resolution is in the history",
            retry.describe()
        ))
    }
}

/// The fewest attempts the scenario makes that register the key (a refusal that
/// releases it and its retry; a crashed attempt and recovery's, or only the retry's
/// when the crashed attempt left nothing, [`Evidence::crash_left_nothing`], the record
/// counting `counted`).
fn fewest_attempts(evidence: &Evidence, counted: u32) -> u32 {
    if evidence.crash_left_nothing(Some(u64::from(counted))) {
        return 1;
    }
    match evidence.scenario {
        Scenario::TooManyRequests | Scenario::Transient503 | Scenario::Crash => 2,
        Scenario::LostAnswer | Scenario::Permanent400 | Scenario::Concurrent => 1,
    }
}

/// The record as an operator sees it agrees with what HTTP showed.
fn consistent(evidence: &Evidence, inspection: &Inspection) -> Result<(), String> {
    let record = &inspection.record;
    let seen = describe(inspection);
    let id = record.operation_id.to_string();
    if let Some(http) = evidence.operation_id()
        && http != id
    {
        return Err(format!(
            "the answers carry Operation-Id {http}, the store's record {id}"
        ));
    }
    let listed = u32::try_from(inspection.attempts.len()).unwrap_or(u32::MAX);
    if listed != record.attempt {
        return Err(format!(
            "the record counts {} attempt(s), Store::inspect lists {listed}: {seen}",
            record.attempt
        ));
    }
    let fewest = fewest_attempts(evidence, record.attempt);
    if record.attempt < fewest {
        return Err(format!(
            "Store::inspect shows {} attempt(s), the scenario made at least {fewest} that registered the key: {seen}",
            record.attempt
        ));
    }
    if let Some(lost) = inspection
        .attempts
        .iter()
        .take(inspection.attempts.len().saturating_sub(1))
        .find(|a| a.ended == AttemptEnd::NotRecorded)
    {
        return Err(format!(
            "how attempt {} ended is not recorded: {seen}",
            lost.attempt
        ));
    }
    if let Some(lookup) = &evidence.lookup {
        let state = lookup.get("state").and_then(|s| s.as_str());
        if state.is_some_and(|s| s != record.state.kind().as_str()) {
            return Err(format!(
                "the status lookup says {}, Store::inspect {seen}",
                state.unwrap_or("?")
            ));
        }
        let attempt = lookup.get("attempt").and_then(serde_json::Value::as_u64);
        if attempt.is_some_and(|n| n != u64::from(record.attempt)) {
            return Err(format!(
                "the status lookup counts {} attempt(s), Store::inspect {seen}",
                attempt.unwrap_or(0)
            ));
        }
    }
    if let Some(last) = evidence.answers.iter().rev().find(|a| a.complete()) {
        let stored = match &record.state {
            RecordState::Completed { response } => Some(response.status),
            _ => None,
        };
        if is_result(last) && stored != last.status {
            return Err(match stored {
                Some(status) => format!(
                    "the last answer was {}, the stored result {status}: {seen}",
                    last.describe()
                ),
                None => format!(
                    "the last answer was {}, but Store::inspect shows {seen}",
                    last.describe()
                ),
            });
        }
        if last.is_parked() && !matches!(record.state, RecordState::Unknown { .. }) {
            return Err(format!(
                "the last answer was {}, but Store::inspect shows {seen}",
                last.describe()
            ));
        }
    }
    Ok(())
}

/// An answer that is the operation's result: a success, or a replayed (final) answer.
fn is_result(seen: &Seen) -> bool {
    seen.success() || (seen.replayed && seen.complete())
}

/// What the operator sees, in a line: state and every attempt.
fn describe(inspection: &Inspection) -> String {
    let record = &inspection.record;
    let state = match &record.state {
        RecordState::Completed { response } => format!("completed {}", response.status),
        other => other.kind().as_str().to_owned(),
    };
    let attempts: Vec<String> = inspection
        .attempts
        .iter()
        .map(|a| {
            let end = match &a.ended {
                AttemptEnd::Running { .. } => "running".to_owned(),
                AttemptEnd::LeaseEnded { .. } => "lease ended".to_owned(),
                AttemptEnd::Released => "released".to_owned(),
                AttemptEnd::Completed { status } => format!("completed {status}"),
                AttemptEnd::Parked { .. } => "parked".to_owned(),
                AttemptEnd::NotRecorded => "not recorded".to_owned(),
                // `AttemptEnd` is non-exhaustive outside the runtime.
                _ => "ended another way".to_owned(),
            };
            format!("#{} {end}", a.attempt)
        })
        .collect();
    format!(
        "{state} at attempt {} ({})",
        record.attempt,
        attempts.join(", ")
    )
}
