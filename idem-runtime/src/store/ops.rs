//! What an operator (the `idem ops` command) and the reconciler ask of a store: records
//! listed by state, one record with the history of its attempts, and the resolution of a
//! parked record.
//!
//! # The history
//!
//! A record keeps a short history of what happened to it, as a JSON array of events in
//! the record itself (a column of the SQL table, a field of the Redis hash, a side table
//! of the memory store), written by the same statement or script that changes the record:
//!
//! - `{"attempt": n, "began_at": t, "after": "released"}`: a retry reclaimed the released
//!   key (`begin`), so attempt `n - 1` had been released;
//! - `{"attempt": n, "began_at": t, "after": "lease-ended", "lease_until": t}`: recovery
//!   took the record over (`take_over`), so attempt `n - 1` ended without an outcome when
//!   its lease ran out;
//! - `{"resolved": "completed" | "not-applied", "attempt": n, "at": t, "by": …, "reason":
//!   …, "parked": …, "status": …}`: an operator resolved the parked attempt `n`
//!   ([`OperatorStore::resolve`](super::OperatorStore::resolve)).
//!
//! The first attempt of an operation writes nothing (it began at `created_at`), so the
//! request path of a new key writes no history at all. The array keeps the last
//! [`HISTORY_LIMIT`] events; a new operation under the key (after the TTL) starts it
//! afresh.

use serde::{Deserialize, Serialize};

use super::{
    OperationState, Record, RecordKey, RecordState, StoreError, StoredResponse, UnixMillis,
};

/// How many events a record's history keeps (the latest).
pub const HISTORY_LIMIT: usize = 32;

/// The largest page [`OperatorStore::list`](super::OperatorStore::list) returns.
pub const MAX_LIST_LIMIT: u32 = 1000;

/// Which records [`OperatorStore::list`](super::OperatorStore::list) returns: records whose
/// TTL has not passed, ordered by operation, client and key (byte order), after the cursor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// Only this operation's records.
    pub operation: Option<String>,
    /// Only records in this state.
    pub state: Option<OperationState>,
    /// Only processing records whose lease has ended at `now` (what the reconciler
    /// recovers); implies `state = processing`.
    pub lease_ended: bool,
    /// Only records after this key in the order (the last key of the previous page).
    pub after: Option<RecordKey>,
    /// At most this many records (at most [`MAX_LIST_LIMIT`]; 0 is taken as 1).
    pub limit: u32,
}

impl ListQuery {
    /// The page size to use: `limit` within 1 ..= [`MAX_LIST_LIMIT`].
    pub fn page(&self) -> u32 {
        self.limit.clamp(1, MAX_LIST_LIMIT)
    }

    /// Whether `key` and `record` are among the records asked for, at `now` (the
    /// filter the memory and Redis stores apply; the SQL stores say it in SQL).
    pub fn matches(&self, key: &RecordKey, record: &Record, now: UnixMillis) -> bool {
        if record.is_expired(now) {
            return false;
        }
        if self
            .operation
            .as_deref()
            .is_some_and(|op| op != key.operation)
        {
            return false;
        }
        if self.state.is_some_and(|s| s != record.state.kind()) {
            return false;
        }
        if self.lease_ended && record.lease().is_none_or(|l| l.is_live(now)) {
            return false;
        }
        self.after
            .as_ref()
            .is_none_or(|after| order(key) > order(after))
    }
}

/// The order of [`OperatorStore::list`](super::OperatorStore::list): operation, client,
/// key, bytewise.
pub fn order(key: &RecordKey) -> (&[u8], &[u8], &[u8]) {
    (
        key.operation.as_bytes(),
        key.client.as_bytes(),
        key.key.as_bytes(),
    )
}

/// One record of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// Its key.
    pub key: RecordKey,
    /// The record.
    pub record: Record,
}

/// What an operator decided about a parked operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResolutionOutcome {
    /// The effect happened: this is the result, stored and replayed from now on.
    Completed(StoredResponse),
    /// The effect did not happen: the key is released, and the client's next retry with
    /// the same content runs the handler.
    NotApplied,
}

/// An operator's resolution of a parked operation, for
/// [`OperatorStore::resolve`](super::OperatorStore::resolve).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolution {
    /// The attempt the operator saw parked: the resolution applies only if the record is
    /// still parked at this attempt.
    pub expected_attempt: u32,
    /// The decision.
    pub outcome: ResolutionOutcome,
    /// Who decided (a user name).
    pub by: String,
    /// Why, in the operator's words.
    pub reason: String,
}

/// A recorded operator resolution, as the history keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolutionRecord {
    /// The attempt that was parked.
    pub attempt: u32,
    /// When it was resolved, in unix milliseconds.
    pub at: UnixMillis,
    /// Who resolved it.
    pub by: String,
    /// Why.
    pub reason: String,
    /// The reason it had been parked with.
    pub parked: String,
    /// `Some(status)` when resolved as completed with a result of that status; `None`
    /// when resolved as not applied.
    pub completed_status: Option<u16>,
}

/// How one attempt ended, as far as the record tells.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttemptEnd {
    /// It holds the key under a lease that ends (or ended) at this time.
    Running {
        /// The lease's end, in unix milliseconds.
        lease_until: UnixMillis,
    },
    /// Its lease ended at this time without an outcome, and recovery took the record over.
    LeaseEnded {
        /// The lease's end, in unix milliseconds.
        at: UnixMillis,
    },
    /// It answered a retryable status (or was found not applied) and the key was released.
    Released,
    /// The operation completed with a result of this status.
    Completed {
        /// The result's status.
        status: u16,
    },
    /// Parked as unknown with this reason.
    Parked {
        /// Why.
        reason: String,
    },
    /// The history no longer says (it keeps the last [`HISTORY_LIMIT`] events).
    NotRecorded,
}

/// One attempt of an operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptSummary {
    /// Its number, 1 for the first.
    pub attempt: u32,
    /// When it began, in unix milliseconds, if the history still says.
    pub began_at: Option<UnixMillis>,
    /// How it ended.
    pub ended: AttemptEnd,
}

/// One record with its history: what `idem ops show` prints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inspection {
    /// Its key.
    pub key: RecordKey,
    /// The record.
    pub record: Record,
    /// Every attempt, the first first.
    pub attempts: Vec<AttemptSummary>,
    /// Every recorded operator resolution, the oldest first.
    pub resolutions: Vec<ResolutionRecord>,
}

/// One event of the history, as JSON.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The attempt the event is about.
    pub attempt: u32,
    /// A new attempt began then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub began_at: Option<UnixMillis>,
    /// How the attempt before it ended: `released` or `lease-ended`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// With `lease-ended`: when the lease of the attempt before ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<UnixMillis>,
    /// An operator resolution: `completed` or `not-applied`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<String>,
    /// When it was resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<UnixMillis>,
    /// Who resolved it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The reason it had been parked with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parked: Option<String>,
    /// With `completed`: the result's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

impl Event {
    /// Attempt `attempt` began at `at` after the key was released.
    pub fn reclaimed(attempt: u32, at: UnixMillis) -> Event {
        Event {
            attempt,
            began_at: Some(at),
            after: Some("released".into()),
            ..Event::default()
        }
    }

    /// Attempt `attempt` began at `at` by taking over a lease that ended at
    /// `lease_until`.
    pub fn taken_over(attempt: u32, at: UnixMillis, lease_until: UnixMillis) -> Event {
        Event {
            attempt,
            began_at: Some(at),
            after: Some("lease-ended".into()),
            lease_until: Some(lease_until),
            ..Event::default()
        }
    }

    /// The resolution by `resolve` at `now` of attempt `attempt`, parked with `parked`.
    pub fn resolved(attempt: u32, parked: &str, resolve: &Resolution, now: UnixMillis) -> Event {
        let (resolved, status) = match &resolve.outcome {
            ResolutionOutcome::Completed(response) => ("completed", Some(response.status)),
            ResolutionOutcome::NotApplied => ("not-applied", None),
        };
        Event {
            attempt,
            resolved: Some(resolved.into()),
            at: Some(now),
            by: Some(resolve.by.clone()),
            reason: Some(resolve.reason.clone()),
            parked: Some(parked.into()),
            status,
            ..Event::default()
        }
    }

    /// The event as one JSON object.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".into())
    }
}

/// `history` (a JSON array, or nothing) with `event` appended, keeping the last
/// [`HISTORY_LIMIT`] events: what the memory and Redis stores write (the SQL stores say
/// the same in SQL).
pub fn append(history: &mut Vec<Event>, event: Event) {
    history.push(event);
    if history.len() > HISTORY_LIMIT {
        let extra = history.len() - HISTORY_LIMIT;
        history.drain(..extra);
    }
}

/// The events of a history as a store keeps it (a JSON array; `None` or empty for none).
///
/// # Errors
///
/// [`StoreError::Corrupt`] when it is not such an array.
pub fn parse_history(text: Option<&str>) -> Result<Vec<Event>, StoreError> {
    match text {
        None => Ok(Vec::new()),
        Some(t) if t.trim().is_empty() => Ok(Vec::new()),
        Some(t) => serde_json::from_str(t)
            .map_err(|e| StoreError::Corrupt(format!("the record's history: {e}"))),
    }
}

impl Inspection {
    /// The attempts and resolutions that `record` and its `history` tell.
    pub fn new(key: RecordKey, record: Record, history: &[Event]) -> Inspection {
        let began = |n: u32| {
            if n == 1 {
                return Some(record.created_at);
            }
            history
                .iter()
                .rev()
                .find(|e| e.attempt == n && e.began_at.is_some())
                .and_then(|e| e.began_at)
        };
        let ended_before = |n: u32| {
            history
                .iter()
                .rev()
                .find(|e| e.attempt == n + 1 && e.after.is_some())
                .map_or(AttemptEnd::NotRecorded, |e| match e.after.as_deref() {
                    Some("lease-ended") => AttemptEnd::LeaseEnded {
                        at: e.lease_until.unwrap_or_default(),
                    },
                    _ => AttemptEnd::Released,
                })
        };
        let attempts = (1..=record.attempt)
            .map(|n| AttemptSummary {
                attempt: n,
                began_at: began(n),
                ended: if n < record.attempt {
                    ended_before(n)
                } else {
                    match &record.state {
                        RecordState::Processing { lease } => AttemptEnd::Running {
                            lease_until: lease.until,
                        },
                        RecordState::Completed { response } => AttemptEnd::Completed {
                            status: response.status,
                        },
                        RecordState::Released => AttemptEnd::Released,
                        RecordState::Unknown { reason } => AttemptEnd::Parked {
                            reason: reason.clone(),
                        },
                    }
                },
            })
            .collect();
        let resolutions = history
            .iter()
            .filter(|e| e.resolved.is_some())
            .map(|e| ResolutionRecord {
                attempt: e.attempt,
                at: e.at.unwrap_or_default(),
                by: e.by.clone().unwrap_or_default(),
                reason: e.reason.clone().unwrap_or_default(),
                parked: e.parked.clone().unwrap_or_default(),
                completed_status: e
                    .status
                    .filter(|_| e.resolved.as_deref() == Some("completed")),
            })
            .collect();
        Inspection {
            key,
            record,
            attempts,
            resolutions,
        }
    }
}

/// Why a resolution's compare-and-set changed nothing, from the record as it stands now
/// (read after the failed write, for the message only).
pub fn refused(current: Option<&Record>, expected_attempt: u32) -> StoreError {
    match current {
        None => StoreError::NotFound,
        Some(record) => match &record.state {
            RecordState::Unknown { .. } if record.attempt != expected_attempt => {
                StoreError::Changed(format!(
                    "the operation is parked at attempt {}, not attempt {expected_attempt}: it ran again since it was looked at; look again with `idem ops show`",
                    record.attempt
                ))
            }
            RecordState::Unknown { .. } => StoreError::Changed(
                "the record changed while it was resolved; look again with `idem ops show`".into(),
            ),
            other => StoreError::Changed(format!(
                "the operation is {} (attempt {}), not parked as unknown: only a parked operation can be resolved",
                other.kind(),
                record.attempt
            )),
        },
    }
}

/// Notes a value where a record should be that is not one (another program's key under
/// the store's prefix, a manual `SET`, an SQL row that does not parse): the operator's
/// calls skip it with this warning, which names it, and go on with the rest, so that one
/// foreign value never stops `idem ops` or the reconciler. `what` names the value as the
/// store knows it (a Redis name, an SQL row's key).
pub fn skip_foreign(what: &str, error: &StoreError) {
    tracing::warn!(
        value = what,
        error = %error,
        "idem: skipped a value in the store that is not a record"
    );
}
