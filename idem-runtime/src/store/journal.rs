//! The step journal as a store keeps it: each call to another system that a handler
//! makes through [`crate::Journal`], by operation and position, with its outcome once
//! known.
//!
//! A step is written twice: its intent ([`StepState::Pending`]) before the call, committed
//! on its own, and its outcome ([`StepState::Done`] or [`StepState::Failed`]) after it. A
//! step still pending when a later attempt of the operation reaches it was sent and its
//! outcome is unknown: the call is sent again with the same downstream key, which the
//! other system deduplicates on.
//!
//! A step can also be *staged* for delivery after the operation completes
//! ([`StepState::Staged`], the transactional outbox): a worker delivers it once the
//! operation's record is completed with a success (2xx), claiming it first
//! ([`Step::claimed`]) so that one worker at a time sends it, and settles it
//! ([`Step::settled`]): delivered, given up, or due again later (backoff).
//!
//! The journal lives as long as the operation's record and is purged with it. Losing it
//! costs a call at most, never a second effect: a step that is not in the journal is sent
//! again with the same downstream key.

use crate::OperationId;

use super::{RecordKey, StoreError, UnixMillis};

/// Where a step stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepState {
    /// Its intent is recorded: the call was (or is being) sent and its outcome is not
    /// known.
    Pending,
    /// The call succeeded with this value (JSON text, as the handler's type serialises).
    Done(String),
    /// The call failed definitely (a decline) with this error (JSON text): the same error
    /// is returned to every later attempt, without calling again.
    Failed(String),
    /// Staged for delivery after the operation completes, with this payload (JSON text):
    /// due at [`Step::next_at`], once the record is completed with a 2xx status.
    Staged(String),
    /// Delivered after the operation completed (the payload kept).
    Delivered(String),
    /// Given up: its deliveries failed definitely, or too many times (the payload kept,
    /// for an operator).
    GivenUp(String),
}

impl StepState {
    /// The state's name as the SQL stores keep it: `pending`, `done`, `failed`, `staged`,
    /// `delivered` or `given_up`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            StepState::Pending => "pending",
            StepState::Done(_) => "done",
            StepState::Failed(_) => "failed",
            StepState::Staged(_) => "staged",
            StepState::Delivered(_) => "delivered",
            StepState::GivenUp(_) => "given_up",
        }
    }

    /// The JSON value of a step (its value, error or payload); `None` for a pending one.
    pub fn value(&self) -> Option<&str> {
        match self {
            StepState::Pending => None,
            StepState::Done(value)
            | StepState::Failed(value)
            | StepState::Staged(value)
            | StepState::Delivered(value)
            | StepState::GivenUp(value) => Some(value),
        }
    }

    /// Whether the step is a delivery after the commit (staged, delivered or given up)
    /// rather than a call made during the attempt.
    pub const fn is_delivery(&self) -> bool {
        matches!(
            self,
            StepState::Staged(_) | StepState::Delivered(_) | StepState::GivenUp(_)
        )
    }

    /// The state named `name` ([`StepState::as_str`]) with `value`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Corrupt`] for another name, or a `done` or `failed` step without a
    /// value.
    pub fn from_parts(name: &str, value: Option<String>) -> Result<StepState, StoreError> {
        match (name, value) {
            ("pending", _) => Ok(StepState::Pending),
            ("done", Some(value)) => Ok(StepState::Done(value)),
            ("failed", Some(value)) => Ok(StepState::Failed(value)),
            ("staged", Some(value)) => Ok(StepState::Staged(value)),
            ("delivered", Some(value)) => Ok(StepState::Delivered(value)),
            ("given_up", Some(value)) => Ok(StepState::GivenUp(value)),
            (other, _) => Err(StoreError::Corrupt(format!(
                "a journal step in the state `{other}` without its value, or in no known state"
            ))),
        }
    }
}

/// One step of an operation's journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Its position in the handler's sequence of steps, from 0.
    pub index: u32,
    /// Its name, as the handler gave it ([`Step::check_name`]).
    pub name: String,
    /// Where it stands.
    pub state: StepState,
    /// How many times its intent was recorded: the number of times the call was sent, as
    /// far as the journal knows (1 for a call sent once). For a delivery: how many times
    /// it was claimed for delivery (0 while none was tried).
    pub calls: u32,
    /// For a staged delivery: when it is next due, in unix milliseconds (0: at once);
    /// while a worker holds its claim, the claim's end. 0 for other steps.
    pub next_at: UnixMillis,
}

impl Step {
    /// The most steps one operation's journal holds.
    pub const MAX_STEPS: u32 = 64;

    /// The largest value (or error) one step keeps, in bytes of JSON: 64 KiB.
    pub const MAX_VALUE: usize = 64 * 1024;

    /// The longest step name, in bytes.
    pub const MAX_NAME: usize = 64;

    /// Checks a step's name: 1 to [`Step::MAX_NAME`] ASCII letters, digits, `_`, `-` and
    /// `.`, so that it reads well in a downstream key, a log line and the status lookup.
    ///
    /// # Errors
    ///
    /// A sentence saying what is wrong with it.
    pub fn check_name(name: &str) -> Result<(), String> {
        if name.is_empty() || name.len() > Step::MAX_NAME {
            return Err(format!(
                "a step's name has 1 to {} characters; `{}` has {}",
                Step::MAX_NAME,
                name.escape_debug(),
                name.len()
            ));
        }
        if let Some(bad) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
        {
            return Err(format!(
                "a step's name holds ASCII letters, digits, `_`, `-` and `.`; `{}` holds `{}`",
                name.escape_debug(),
                bad.escape_debug()
            ));
        }
        Ok(())
    }

    /// What writing `write` over `existing` (the step at the same position, if any) makes
    /// of it, as every store applies it ([`crate::store::RecordStore::write_step`]):
    /// `Ok(Some(step))` to write `step`, `Ok(None)` to leave `existing` as it stands.
    ///
    /// - nothing there: the step as written, sent once;
    /// - a pending step of the same name: an intent counts one more call, an outcome
    ///   settles it;
    /// - a done or failed step of the same name: unchanged (the first outcome stands);
    /// - a step of another name: [`StoreError::Changed`], nothing written.
    ///
    /// # Errors
    ///
    /// [`StoreError::Changed`] when `existing` has another name.
    pub fn apply(existing: Option<&Step>, write: &StepWrite) -> Result<Option<Step>, StoreError> {
        let Some(existing) = existing else {
            return Ok(Some(Step {
                index: write.index,
                name: write.name.clone(),
                state: write.state.clone(),
                calls: u32::from(!write.state.is_delivery()),
                next_at: 0,
            }));
        };
        if existing.name != write.name || existing.state.is_delivery() != write.state.is_delivery()
        {
            return Err(step_changed(existing, write));
        }
        match (&existing.state, &write.state) {
            (StepState::Pending, StepState::Pending) => Ok(Some(Step {
                calls: existing.calls.saturating_add(1),
                ..existing.clone()
            })),
            (StepState::Pending, outcome) => Ok(Some(Step {
                state: outcome.clone(),
                ..existing.clone()
            })),
            _ => Ok(None),
        }
    }
}

impl Step {
    /// The step claimed for a delivery until `until` (unix milliseconds), if it is staged
    /// and due at `now`: one more delivery counted, and not due again before `until`, so
    /// that one worker at a time sends it. `None` when it is not staged, or not due.
    pub fn claimed(&self, until: UnixMillis, now: UnixMillis) -> Option<Step> {
        (matches!(self.state, StepState::Staged(_)) && self.next_at <= now).then(|| Step {
            calls: self.calls.saturating_add(1),
            next_at: until,
            ..self.clone()
        })
    }

    /// The step as `delivery` settles the claim numbered `claim` ([`Step::calls`] after
    /// the claim), if it is still staged under that claim; `None` otherwise (another
    /// worker claimed it since, or it was settled).
    pub fn settled(&self, claim: u32, delivery: Delivery) -> Option<Step> {
        let StepState::Staged(payload) = &self.state else {
            return None;
        };
        if self.calls != claim {
            return None;
        }
        let (state, next_at) = match delivery {
            Delivery::Delivered => (StepState::Delivered(payload.clone()), 0),
            Delivery::GiveUp => (StepState::GivenUp(payload.clone()), 0),
            Delivery::RetryAt(at) => (StepState::Staged(payload.clone()), at),
        };
        Some(Step {
            state,
            next_at,
            ..self.clone()
        })
    }
}

/// How a claimed delivery ended ([`crate::store::OperatorStore::settle_delivery`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// The other system took it: delivered, never sent again.
    Delivered,
    /// It failed with an unknown outcome: due again at this time (unix milliseconds),
    /// under the same downstream key.
    RetryAt(UnixMillis),
    /// It failed definitely, or too many times: given up, left for an operator.
    GiveUp,
}

impl Delivery {
    /// The state's name ([`StepState::as_str`]) and the next due time (unix
    /// milliseconds, 0 for none) that a staged step settled this way takes: what the
    /// stores write.
    pub const fn settles_as(self) -> (&'static str, UnixMillis) {
        match self {
            Delivery::Delivered => ("delivered", 0),
            Delivery::GiveUp => ("given_up", 0),
            Delivery::RetryAt(at) => ("staged", at),
        }
    }
}

/// A staged delivery that is due ([`crate::store::OperatorStore::due_deliveries`]): its
/// operation's key and id, and the step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Due {
    /// The operation's record key.
    pub key: RecordKey,
    /// The operation's id.
    pub operation_id: OperationId,
    /// The staged step.
    pub step: Step,
}

/// The error of a write whose position holds a step of another name (or a call where a
/// delivery was staged, or the reverse).
pub fn step_changed(existing: &Step, write: &StepWrite) -> StoreError {
    StoreError::Changed(format!(
        "step {} of the operation is `{}` ({}) in its journal, and this attempt's step {} is `{}` ({}): the handler's steps changed between attempts",
        existing.index + 1,
        existing.name,
        kind(&existing.state),
        write.index + 1,
        write.name,
        kind(&write.state),
    ))
}

fn kind(state: &StepState) -> &'static str {
    if state.is_delivery() {
        "a delivery after the commit"
    } else {
        "a call"
    }
}

/// A write to the journal: a step's intent ([`StepState::Pending`]) or its outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepWrite {
    /// The operation whose journal it is: the record must be this operation's.
    pub operation_id: OperationId,
    /// The step's position, from 0, below [`Step::MAX_STEPS`].
    pub index: u32,
    /// The step's name ([`Step::check_name`]).
    pub name: String,
    /// Its intent (`Pending`) or its outcome.
    pub state: StepState,
}

impl StepWrite {
    /// Checks the write's bounds, as every store does before it writes.
    ///
    /// # Errors
    ///
    /// [`StoreError::TooLarge`] for a value larger than [`Step::MAX_VALUE`];
    /// [`StoreError::Changed`] for a position past [`Step::MAX_STEPS`] or a name that
    /// [`Step::check_name`] refuses.
    pub fn check(&self) -> Result<(), StoreError> {
        if self.index >= Step::MAX_STEPS {
            return Err(StoreError::Changed(format!(
                "an operation's journal holds at most {} steps",
                Step::MAX_STEPS
            )));
        }
        Step::check_name(&self.name).map_err(StoreError::Changed)?;
        match self.state.value() {
            Some(value) if value.len() > Step::MAX_VALUE => Err(StoreError::TooLarge {
                size: value.len(),
                limit: Step::MAX_VALUE,
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, state: StepState) -> StepWrite {
        StepWrite {
            operation_id: OperationId::new(),
            index: 0,
            name: name.into(),
            state,
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(Step::check_name("charge").is_ok());
        assert!(Step::check_name("charge.card-2_x").is_ok());
        assert!(Step::check_name("").unwrap_err().contains("1 to 64"));
        assert!(Step::check_name(&"a".repeat(65)).is_err());
        assert!(Step::check_name("charge card").unwrap_err().contains("` `"));
        assert!(Step::check_name("chärge").is_err());
        assert!(Step::check_name("a\0b").unwrap_err().contains("\\0"));
    }

    #[test]
    fn a_write_applies_as_the_rules_say() {
        let intent = write("charge", StepState::Pending);
        let first = Step::apply(None, &intent).unwrap().unwrap();
        assert_eq!((first.calls, &first.state), (1, &StepState::Pending));
        let again = Step::apply(Some(&first), &intent).unwrap().unwrap();
        assert_eq!(again.calls, 2);
        let done = write("charge", StepState::Done("{\"id\":1}".into()));
        let settled = Step::apply(Some(&again), &done).unwrap().unwrap();
        assert_eq!(settled.state, StepState::Done("{\"id\":1}".into()));
        assert_eq!(settled.calls, 2);
        // The first outcome stands; an intent does not reopen it.
        let other = write("charge", StepState::Failed("{}".into()));
        assert_eq!(Step::apply(Some(&settled), &other).unwrap(), None);
        assert_eq!(Step::apply(Some(&settled), &intent).unwrap(), None);
        // Another name at the same position is refused.
        let refund = write("refund", StepState::Pending);
        let error = Step::apply(Some(&settled), &refund).unwrap_err();
        assert!(error.to_string().contains("`charge`"), "{error}");
    }

    #[test]
    fn writes_are_bounded() {
        let mut big = write("charge", StepState::Done("x".repeat(Step::MAX_VALUE + 1)));
        assert!(matches!(big.check(), Err(StoreError::TooLarge { .. })));
        big.state = StepState::Pending;
        big.index = Step::MAX_STEPS;
        assert!(matches!(big.check(), Err(StoreError::Changed(_))));
        big.index = 0;
        big.name = "no spaces".into();
        assert!(matches!(big.check(), Err(StoreError::Changed(_))));
    }
}
