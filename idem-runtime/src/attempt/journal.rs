//! The step journal as a handler uses it: [`Journal::step`] runs one call to another
//! system (a payment provider, a mail service) under a downstream key derived from the
//! operation, recording its intent before the call and its outcome after it, so that a
//! later attempt of the same operation replays what is done and re-sends what is unknown
//! with the same key. See the guide "Calling another system" (`docs/steps.md`).

use std::fmt;
use std::future::Future;
use std::sync::{Arc, OnceLock};

use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use crate::problem::{Problem, ProblemType};
use crate::store::{OperationState, OwnerToken, RecordKey, Step, StepState, StepWrite, StoreError};
use crate::telemetry::{
    FIELD_ATTEMPT, FIELD_OPERATION_ID, FIELD_STEP_CALL, FIELD_STEP_INDEX, FIELD_STEP_NAME,
    SPAN_STEP,
};
use crate::{Idem, OperationId};

/// The key a step sends to the other system, for it to deduplicate on (its
/// `Idempotency-Key`): `<operation id>:<step name>`, with `:<n>` for the n-th step of the
/// same name in one handler (n ≥ 2), such as
/// `0193a5c4-7d2e-7c41-9f3a-5b8e2d1c0a77:charge`.
///
/// It is the same on every attempt of the operation, on every instance and after every
/// takeover, and different for every other operation (a key reused after its TTL is a new
/// operation, with new downstream keys). At most 36 + 1 + 64 + 11 visible ASCII
/// characters: within the 255 that providers accept.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DownstreamKey(String);

impl DownstreamKey {
    /// The key of the `occurrence`-th step named `name` (from 1) of `operation_id`.
    pub fn derive(operation_id: OperationId, name: &str, occurrence: u32) -> DownstreamKey {
        if occurrence <= 1 {
            DownstreamKey(format!("{operation_id}:{name}"))
        } else {
            DownstreamKey(format!("{operation_id}:{name}:{occurrence}"))
        }
    }

    /// The key as text, to put in a header.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DownstreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for DownstreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// How a call to another system failed, as the closure given to [`Journal::step`] says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallError<E> {
    /// The other system answered that it did not do it and will not do it under this key
    /// (a card declined): recorded, and returned to every later attempt without calling
    /// again.
    Definite(E),
    /// The outcome is not known (a timeout, a reset connection, a 5xx, a 409 or 429 while
    /// the key is in flight there): nothing is recorded but the intent; the attempt ends
    /// with 503 and the next one sends the call again with the same downstream key. The
    /// text says what happened, for the logs (never a secret).
    Unknown(String),
}

/// What [`Journal::step`] returns instead of the step's value.
#[derive(Debug)]
pub enum StepError<E> {
    /// The step failed definitely, now or in an earlier attempt (see
    /// [`CallError::Definite`]): answer it as the final answer of the operation (a 402, a
    /// 422), which is stored and replayed.
    Definite(E),
    /// The step could not finish in this attempt: its outcome is unknown, or the journal
    /// could not be written or read, or the handler's steps changed between attempts.
    /// Return it (it is an answer: 503 `step-outcome-unknown` with `Retry-After`); whatever
    /// the handler answers, idem keeps the key for this operation and answers so.
    Interrupted(Interrupted),
}

impl<E> From<Interrupted> for StepError<E> {
    fn from(interrupted: Interrupted) -> StepError<E> {
        StepError::Interrupted(interrupted)
    }
}

/// A step that could not finish in this attempt ([`StepError::Interrupted`]); an answer
/// (`IntoResponse`): 503 `step-outcome-unknown`, the key kept for the operation.
#[derive(Clone, Debug)]
pub struct Interrupted {
    operation_id: OperationId,
    step: String,
    reason: String,
}

impl Interrupted {
    /// The step that could not finish.
    pub fn step(&self) -> &str {
        &self.step
    }

    /// Why, for the logs.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step `{}` could not finish: {}", self.step, self.reason)
    }
}

impl std::error::Error for Interrupted {}

impl IntoResponse for Interrupted {
    fn into_response(self) -> Response {
        step_outcome_unknown(self.operation_id, &self.step).into_response()
    }
}

/// 503 `step-outcome-unknown` for the step `step`.
pub(crate) fn step_outcome_unknown(id: OperationId, step: &str) -> Problem {
    Problem::new(
        ProblemType::StepOutcomeUnknown,
        format!(
            "the attempt called another system (step `{step}`) and could not learn or record the outcome; \
             retry with the same key after `Retry-After`: the operation resumes, and the call is sent again with the same downstream key"
        ),
    )
    .with_operation_id(id)
    .with_state(OperationState::Processing)
    .with_retry_after_secs(1)
}

/// Why an attempt that used its journal cannot settle as its handler answered.
#[derive(Clone, Debug)]
pub(crate) enum Interruption {
    /// A step's outcome is unknown, or the journal failed: the operation stays with this
    /// key, to resume on the next retry.
    Unknown(Interrupted),
    /// The handler's steps do not match the journal, or a step broke a bound: a defect
    /// the next attempt would meet again; parked for an operator.
    Broken(Interrupted),
}

/// What an attempt's journal shares with the attempt that settles it.
pub(crate) struct Shared {
    pub(crate) idem: Idem,
    pub(crate) key: Arc<RecordKey>,
    pub(crate) token: OwnerToken,
    pub(crate) operation_id: OperationId,
    pub(crate) attempt: u32,
    /// The first interruption, if any.
    pub(crate) interrupted: OnceLock<Interruption>,
    /// Why no step may run in this attempt, if so: the journal cannot be written while
    /// the attempt's transaction holds the database's only write lock (SQLite).
    pub(crate) refused: Option<&'static str>,
    /// For a transaction deferred to the handler's first write (SQLite): whether it has
    /// begun, after which no step may run (its lock is held).
    pub(crate) tx_opened: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Shared {
    /// Why no step may run now, if so.
    fn refusal(&self) -> Option<&'static str> {
        let opened = self
            .tx_opened
            .as_ref()
            .is_some_and(|o| o.load(std::sync::atomic::Ordering::SeqCst));
        self.refused.or(opened.then_some(
            "it comes after the handler's first write through the transaction, which holds SQLite's only write lock, so it could not be recorded before its call: run the steps (and stage the deliveries) before the first `tx.conn()`",
        ))
    }
}

impl Shared {
    /// The attempt's interruption, if a step had one.
    pub(crate) fn interruption(&self) -> Option<&Interruption> {
        self.interrupted.get()
    }
}

/// The step journal of the attempt a contracted handler runs in: each call to another
/// system goes through [`Journal::step`], which makes it safe to retry, to resume after a
/// crash or takeover, and to answer once.
///
/// Take it as an argument of a handler whose contract says `recovery = resume`
/// (`mut journal: idem::Journal`); `#[idem::contract]` passes it in (it is not an axum
/// extractor):
///
/// ```
/// use idem_runtime::journal::{CallError, Journal, StepError};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Charge { id: String }
/// #[derive(Debug, serde::Serialize, serde::Deserialize)]
/// struct Decline { code: String }
///
/// // The provider's client: `key` goes in its `Idempotency-Key` header.
/// async fn charge(amount_minor: i64, key: &str) -> Result<Charge, CallError<Decline>> {
///     # let _ = (amount_minor, key);
///     Ok(Charge { id: "ch_1".into() })
/// }
///
/// async fn pay(journal: &mut Journal) -> Result<String, StepError<Decline>> {
///     let charge = journal
///         .step("charge", |key| async move { charge(1250, key.as_str()).await })
///         .await?;
///     Ok(charge.id)
/// }
/// ```
///
/// Steps run one after another, in an order that depends only on the request (the
/// journal matches them by position and name on a later attempt). A step's value and
/// error are stored as JSON (at most [`Step::MAX_VALUE`] bytes each), at most
/// [`Step::MAX_STEPS`] steps an operation.
pub struct Journal {
    shared: Arc<Shared>,
    /// The next step's position.
    next: u32,
    /// The names of the steps run so far in this attempt, in order.
    names: Vec<String>,
    /// The steps the journal held when this attempt first needed them (`None` until then;
    /// an operation's first attempt has none to read).
    recorded: Option<Vec<Step>>,
}

impl Journal {
    /// The journal of the attempt that `shared` describes.
    pub(crate) fn new(shared: Arc<Shared>) -> Journal {
        let recorded = (shared.attempt <= 1).then(Vec::new);
        Journal {
            shared,
            next: 0,
            names: Vec::new(),
            recorded,
        }
    }

    /// The operation's id: the part of every downstream key that names the operation.
    pub fn operation_id(&self) -> OperationId {
        self.shared.operation_id
    }

    /// Runs the step `name` (1 to 64 ASCII letters, digits, `_`, `-`, `.`): calls `call`
    /// with the step's [`DownstreamKey`] unless an earlier attempt of this operation
    /// finished it.
    ///
    /// - done before: its recorded value, without calling;
    /// - failed definitely before: `Err(StepError::Definite)` with the recorded error,
    ///   without calling;
    /// - never sent, or sent with an unknown outcome: the intent is recorded (committed on
    ///   its own, outside any transaction of the handler), `call` runs, and its outcome is
    ///   recorded: `Ok(value)`, or `Err(StepError::Definite)` for
    ///   [`CallError::Definite`].
    ///
    /// # Errors
    ///
    /// - [`StepError::Definite`]: the call's definite failure, now or recorded;
    /// - [`StepError::Interrupted`] when the call's outcome is unknown
    ///   ([`CallError::Unknown`]), the journal cannot be read or written (the store failed,
    ///   or the attempt lost its lease), the step's value or error does not serialise or
    ///   is larger than [`Step::MAX_VALUE`], `name` is not a valid step name, or the
    ///   journal holds another step at this position (the handler's steps changed
    ///   between attempts). Every later step of the attempt is interrupted too, and the
    ///   attempt answers 503 `step-outcome-unknown` (the key kept for the operation, to
    ///   resume on the next retry) or, for a defect the next attempt would meet again,
    ///   parks the operation for an operator.
    pub async fn step<T, E, F, Fut>(&mut self, name: &str, call: F) -> Result<T, StepError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Serialize + DeserializeOwned,
        F: FnOnce(DownstreamKey) -> Fut,
        Fut: Future<Output = Result<T, CallError<E>>>,
    {
        let (index, occurrence, recorded) = self.next_position(name, false).await?;
        match recorded.map(|step| step.state) {
            Some(StepState::Staged(_) | StepState::Delivered(_) | StepState::GivenUp(_)) => {
                Err(self.broken(name, "a delivery is recorded at this step".into()))
            }
            Some(StepState::Done(value)) => {
                self.decoded(name, &value).map_err(StepError::Interrupted)
            }
            Some(StepState::Failed(error)) => Err(self
                .decoded(name, &error)
                .map_or_else(StepError::Interrupted, StepError::Definite)),
            Some(StepState::Pending) | None => self.send(index, name, occurrence, call).await,
        }
    }

    /// Stages the step `name` (as for [`Journal::step`]) for delivery after the operation
    /// completes, with `payload` (serialised as JSON, at most [`Step::MAX_VALUE`] bytes):
    /// the outbox's worker sends it, under the step's [`DownstreamKey`], once the
    /// operation's record is completed with a success (2xx) — in the transactional mode,
    /// once the business writes committed — with the deliverer registered for it
    /// ([`IdemBuilder::deliver`](crate::IdemBuilder::deliver); see [`crate::outbox`]).
    /// Staged by an earlier attempt of the operation: nothing more is staged.
    ///
    /// # Errors
    ///
    /// [`Interrupted`] as for [`Journal::step`]: the journal cannot be written or read,
    /// the payload does not serialise or is too large, `name` is not a valid step name,
    /// or the journal holds another step at this position.
    pub async fn after_commit<P: Serialize>(
        &mut self,
        name: &str,
        payload: &P,
    ) -> Result<(), Interrupted> {
        let (index, _, recorded) = self.next_position(name, true).await?;
        if recorded.is_some() {
            // Staged by an earlier attempt of the operation.
            return Ok(());
        }
        let json = match serde_json::to_string(payload) {
            Ok(json) => json,
            Err(error) => {
                return Err(self.broken_as(
                    name,
                    format!("its payload does not serialise as JSON: {error}"),
                ));
            }
        };
        self.record(self.write(index, name, StepState::Staged(json)))
            .await
            .map(|_| ())
    }

    /// Takes the next position for the step `name` (a delivery after the commit when
    /// `delivery`, else a call): its position, its occurrence among the steps of its name
    /// (from 1) and what the journal held there. Refuses, as [`Journal::step`] says, when
    /// the attempt was interrupted, steps are refused here, the name is invalid, the
    /// journal cannot be read, or it holds another step (name or kind) at the position.
    async fn next_position(
        &mut self,
        name: &str,
        delivery: bool,
    ) -> Result<(u32, u32, Option<Step>), Interrupted> {
        if let Some(earlier) = self.shared.interruption() {
            let (Interruption::Unknown(earlier) | Interruption::Broken(earlier)) = earlier;
            return Err(earlier.clone());
        }
        let index = self.next;
        self.next += 1;
        if let Some(why) = self.shared.refusal() {
            return Err(self.broken_as(name, why.to_owned()));
        }
        if let Err(why) = Step::check_name(name) {
            return Err(self.broken_as(name, why));
        }
        let earlier = self.names.iter().filter(|n| *n == name).count();
        let occurrence = u32::try_from(earlier + 1).unwrap_or(u32::MAX);
        self.names.push(name.to_owned());
        let recorded = match self.recorded().await {
            Ok(recorded) => recorded.get(index as usize).cloned(),
            Err(error) => {
                let why = format!("the journal could not be read: {error}");
                return Err(self.unknown_as(name, why));
            }
        };
        if let Some(step) = &recorded
            && (step.name != name || step.state.is_delivery() != delivery)
        {
            let kind = if delivery {
                StepState::Staged(String::new())
            } else {
                StepState::Pending
            };
            let why = crate::store::step_changed(step, &self.write(index, name, kind));
            return Err(self.broken_as(name, why.to_string()));
        }
        Ok((index, occurrence, recorded))
    }

    /// Records the intent of step `index`, sends the call and records its outcome.
    async fn send<T, E, F, Fut>(
        &mut self,
        index: u32,
        name: &str,
        occurrence: u32,
        call: F,
    ) -> Result<T, StepError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Serialize + DeserializeOwned,
        F: FnOnce(DownstreamKey) -> Fut,
        Fut: Future<Output = Result<T, CallError<E>>>,
    {
        let intent = match self
            .record(self.write(index, name, StepState::Pending))
            .await
        {
            Ok(step) => step,
            Err(interrupted) => return Err(StepError::Interrupted(interrupted)),
        };
        // Another attempt of the operation (one that lost its lease) settled it meanwhile.
        match intent.state {
            StepState::Done(value) => {
                return self.decoded(name, &value).map_err(StepError::Interrupted);
            }
            StepState::Failed(error) => {
                return Err(self
                    .decoded(name, &error)
                    .map_or_else(StepError::Interrupted, StepError::Definite));
            }
            StepState::Staged(_) | StepState::Delivered(_) | StepState::GivenUp(_) => {
                return Err(self.broken(name, "a delivery is recorded at this step".into()));
            }
            StepState::Pending => {}
        }
        let key = DownstreamKey::derive(self.shared.operation_id, name, occurrence);
        let span = tracing::info_span!(
            SPAN_STEP,
            { FIELD_STEP_NAME } = name,
            { FIELD_STEP_INDEX } = index,
            { FIELD_STEP_CALL } = intent.calls,
            { FIELD_OPERATION_ID } = %self.shared.operation_id,
            { FIELD_ATTEMPT } = self.shared.attempt,
        );
        match call(key).instrument(span).await {
            Ok(value) => {
                let json = self.encoded(name, &value)?;
                self.record(self.write(index, name, StepState::Done(json)))
                    .await?;
                Ok(value)
            }
            Err(CallError::Definite(error)) => {
                let json = self.encoded(name, &error)?;
                self.record(self.write(index, name, StepState::Failed(json)))
                    .await?;
                Err(StepError::Definite(error))
            }
            Err(CallError::Unknown(why)) => {
                Err(self.unknown(name, format!("its outcome is unknown: {why}")))
            }
        }
    }

    /// The steps the journal held when this attempt first asked.
    async fn recorded(&mut self) -> Result<&[Step], StoreError> {
        if self.recorded.is_none() {
            let shared = &self.shared;
            let now = shared.idem.now().await;
            let steps = shared
                .idem
                .store()
                .steps(&shared.key, shared.operation_id, now)
                .await?;
            self.recorded = Some(steps);
        }
        Ok(self.recorded.as_deref().unwrap_or_default())
    }

    /// A write of step `index` in `state`.
    fn write(&self, index: u32, name: &str, state: StepState) -> StepWrite {
        StepWrite {
            operation_id: self.shared.operation_id,
            index,
            name: name.to_owned(),
            state,
        }
    }

    /// Writes `write` to the journal under the attempt's lease; the step as it stands.
    async fn record(&self, write: StepWrite) -> Result<Step, Interrupted> {
        let shared = &self.shared;
        let now = shared.idem.now().await;
        let written = shared
            .idem
            .store()
            .write_step(&shared.key, shared.token, &write, now)
            .await;
        match written {
            Ok(step) => Ok(step),
            Err(error @ (StoreError::Changed(_) | StoreError::TooLarge { .. })) => {
                Err(self.broken_as(&write.name, error.to_string()))
            }
            Err(StoreError::LeaseLost) => Err(self.unknown_as(
                &write.name,
                "the attempt lost its lease (another attempt holds the operation now)".into(),
            )),
            Err(error) => Err(self.unknown_as(
                &write.name,
                format!("the journal could not be written: {error}"),
            )),
        }
    }

    /// `value` as JSON, within [`Step::MAX_VALUE`].
    fn encoded<V: Serialize, E>(&self, name: &str, value: &V) -> Result<String, StepError<E>> {
        match serde_json::to_string(value) {
            Ok(json) => Ok(json),
            Err(error) => Err(self.broken(
                name,
                format!("its value does not serialise as JSON: {error}"),
            )),
        }
    }

    /// The recorded JSON `json` of step `name` as a `V`.
    fn decoded<V: DeserializeOwned>(&self, name: &str, json: &str) -> Result<V, Interrupted> {
        serde_json::from_str(json).map_err(|error| {
            self.broken_as(
                name,
                format!("its recorded value no longer reads as the handler's type: {error}"),
            )
        })
    }

    /// Interrupts the attempt: step `name`'s outcome is unknown (see [`Interruption`]).
    fn unknown<E>(&self, name: &str, reason: String) -> StepError<E> {
        StepError::Interrupted(self.unknown_as(name, reason))
    }

    fn unknown_as(&self, name: &str, reason: String) -> Interrupted {
        self.interrupt(name, reason, Interruption::Unknown)
    }

    /// Interrupts the attempt for a defect (see [`Interruption`]).
    fn broken<E>(&self, name: &str, reason: String) -> StepError<E> {
        StepError::Interrupted(self.broken_as(name, reason))
    }

    fn broken_as(&self, name: &str, reason: String) -> Interrupted {
        self.interrupt(name, reason, Interruption::Broken)
    }

    fn interrupt(
        &self,
        name: &str,
        reason: String,
        kind: fn(Interrupted) -> Interruption,
    ) -> Interrupted {
        let interrupted = Interrupted {
            operation_id: self.shared.operation_id,
            step: name.to_owned(),
            reason,
        };
        tracing::warn!(
            operation = %self.shared.key.operation,
            operation_id = %self.shared.operation_id,
            attempt = self.shared.attempt,
            step = name,
            reason = %interrupted.reason,
            "idem: a step could not finish; the operation keeps its key and resumes on the next retry"
        );
        let _ = self.shared.interrupted.set(kind(interrupted.clone()));
        interrupted
    }
}

impl fmt::Debug for Journal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Journal")
            .field("operation_id", &self.shared.operation_id)
            .field("attempt", &self.shared.attempt)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downstream_keys_name_the_operation_and_the_step() {
        let id = OperationId::new();
        let first = DownstreamKey::derive(id, "charge", 1);
        assert_eq!(first.as_str(), format!("{id}:charge"));
        assert_eq!(
            DownstreamKey::derive(id, "charge", 2).as_str(),
            format!("{id}:charge:2")
        );
        assert_ne!(
            DownstreamKey::derive(OperationId::new(), "charge", 1),
            first
        );
        let longest = DownstreamKey::derive(id, &"a".repeat(Step::MAX_NAME), u32::MAX);
        assert!(longest.as_str().len() <= 255);
        assert!(longest.as_str().bytes().all(|b| b.is_ascii_graphic()));
    }
}
