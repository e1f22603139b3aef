//! What became of an intent: completed, failed for good, or unknown. Never "error,
//! nothing happened" when something may have happened.

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::Value;

use crate::intent::{IdempotencyKey, Intent};

/// The outcome of [`crate::Client::execute`].
#[derive(Debug)]
#[must_use = "an unknown outcome must be resolved, not dropped"]
pub enum Outcome {
    /// The operation ran, once: its answer (a replay included, and flagged).
    Completed(Completed),
    /// A permanent answer: the request was refused, and the same request would be
    /// refused again.
    Failed(Failed),
    /// No definite answer within the policy: the operation may or may not have taken
    /// effect. The status lookup was asked first, when the contract has one.
    Unknown(Box<Unknown>),
}

/// A definite, successful answer.
#[derive(Debug)]
pub struct Completed {
    /// The key the operation ran under.
    pub key: IdempotencyKey,
    /// The server's operation id (`Operation-Id`).
    pub operation_id: Option<String>,
    /// The answer's status.
    pub status: StatusCode,
    /// Its headers (for an answer read from the status lookup, those it stored).
    pub headers: HeaderMap,
    /// Its body.
    pub body: Bytes,
    /// Whether the server replayed a stored result (`Idempotent-Replayed: true`), or the
    /// answer came from the status lookup: an earlier attempt did the work.
    pub replayed: bool,
    /// Whether the answer was read from the status lookup: after the attempts stopped
    /// without one, or, on a resume, before any was sent.
    pub from_lookup: bool,
    /// The requests this window sent, the first included (one [`crate::Client::execute`]
    /// is one window): 0 when the status lookup, asked first on a resume, had the answer.
    pub attempts: u32,
}

/// A permanent answer (a 4xx the contract does not declare retryable).
#[derive(Debug)]
pub struct Failed {
    /// The key the request was sent under.
    pub key: IdempotencyKey,
    /// The server's operation id, if the answer carried one.
    pub operation_id: Option<String>,
    /// The status.
    pub status: StatusCode,
    /// The problem details (RFC 9457), when the body is one.
    pub problem: Option<Problem>,
    /// The body as received.
    pub body: Bytes,
    /// The requests this window sent, the first included.
    pub attempts: u32,
}

/// No definite answer. Keep the key: execute the same intent again ([`Unknown::intent`])
/// to resume it, now or later, or save the key ([`Unknown::key`]) and resume after a
/// restart ([`Intent::resume`]); never start the operation again with a new key unless
/// the server says it is safe ([`Unknown::new_key_safe`]).
///
/// Executing the intent again opens a new window under the same key: a fresh
/// `max_attempts` and deadline, after the status lookup is asked first (its completed
/// answer is returned without sending the command again); [`Intent::resume`] says
/// exactly what it guarantees.
#[derive(Debug)]
pub struct Unknown {
    /// The intent: executing it again resumes the operation under the same key, in a
    /// new window (see [`Intent::resume`]).
    pub intent: Intent,
    /// The server's operation id, if any answer carried one.
    pub operation_id: Option<String>,
    /// Why the client stopped.
    pub reason: StopReason,
    /// The last thing an attempt saw.
    pub last: Option<LastAttempt>,
    /// What the status lookup said, when the contract has one and it answered.
    pub lookup: Option<LookupAnswer>,
    /// The requests this window sent, the first included: 0 when the status lookup,
    /// asked first on a resume, answered that the server does not know, or that another
    /// attempt runs longer than the window.
    pub attempts: u32,
}

impl Unknown {
    /// The key, to resume or to report.
    pub fn key(&self) -> &IdempotencyKey {
        &self.intent.key
    }

    /// Whether the server said that nothing can have taken effect under the key (the
    /// status lookup's, or the last problem's, `new_key_safe`), so that a new intent
    /// cannot run the operation twice. `false` when it did not say.
    pub fn new_key_safe(&self) -> bool {
        let from_lookup = match &self.lookup {
            Some(LookupAnswer::Status(status)) => Some(status.new_key_safe),
            _ => None,
        };
        let from_problem = match &self.last {
            Some(LastAttempt::Answer { problem, .. }) => {
                problem.as_ref().and_then(|p| p.new_key_safe)
            }
            _ => None,
        };
        from_lookup.or(from_problem).unwrap_or(false)
    }
}

/// Why a client stopped without a definite answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// All `max_attempts` of the window were sent.
    AttemptsExhausted,
    /// The next attempt would start after the deadline.
    DeadlineReached,
    /// The server asked to wait longer (`Retry-After`, or, on a resume, the status
    /// lookup's `retry_after`) than the deadline leaves.
    RetryAfterBeyondDeadline {
        /// What the server asked for.
        retry_after: std::time::Duration,
    },
    /// The client's retry budget is spent: retries stop until requests succeed again.
    BudgetExhausted,
    /// An answer or failure the contract does not declare retryable, after which the
    /// outcome is not known (a 5xx, a timeout, a reset connection).
    NotRetryable,
    /// The server itself does not know (409 `operation-outcome-unknown`, or, on a
    /// resume, the status lookup's state `unknown`).
    OutcomeUnknownOnServer,
}

/// The last thing an attempt saw.
#[derive(Debug)]
pub enum LastAttempt {
    /// An answer.
    Answer {
        /// Its status.
        status: StatusCode,
        /// Its problem details, when the body is one.
        problem: Option<Problem>,
    },
    /// No answer.
    Transport(crate::transport::TransportError),
}

/// What the status lookup answered.
#[derive(Clone, Debug)]
pub enum LookupAnswer {
    /// 200: the server's record of the key.
    Status(Box<OperationStatus>),
    /// 404: the server has no record of the key (never registered, or past its TTL).
    NotFound,
    /// Another answer.
    Other(StatusCode),
}

/// The status lookup's 200 body (`IdemOperationStatus` in the published document).
#[derive(Clone, Debug, Deserialize)]
pub struct OperationStatus {
    /// The operation id.
    pub operation_id: String,
    /// `processing`, `completed`, `released` or `unknown`.
    pub state: String,
    /// The attempts run under the key.
    pub attempt: u32,
    /// Whether a new key is safe.
    pub new_key_safe: bool,
    /// In the state `completed`: the stored answer.
    #[serde(default)]
    pub response: Option<StoredAnswer>,
    /// In the state `unknown`: why.
    #[serde(default)]
    pub reason: Option<String>,
    /// In the state `processing`: whole seconds until the running attempt's lease ends.
    #[serde(default)]
    pub retry_after: Option<u64>,
}

/// A stored answer, as the status lookup shows it.
#[derive(Clone, Debug, Deserialize)]
pub struct StoredAnswer {
    /// Its status.
    pub status: u16,
    /// Its headers, by lowercase name.
    #[serde(default)]
    pub headers: serde_json::Map<String, Value>,
    /// Its body, when JSON.
    #[serde(default)]
    pub body: Option<Value>,
}

/// Problem details (RFC 9457), with idem's members.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Problem {
    /// The problem type URI.
    #[serde(rename = "type", default)]
    pub type_uri: Option<String>,
    /// Its title.
    #[serde(default)]
    pub title: Option<String>,
    /// The status.
    #[serde(default)]
    pub status: Option<u16>,
    /// What happened.
    #[serde(default)]
    pub detail: Option<String>,
    /// idem's operation id.
    #[serde(default)]
    pub operation_id: Option<String>,
    /// idem's state of the operation.
    #[serde(default)]
    pub state: Option<String>,
    /// idem's `new_key_safe`.
    #[serde(default)]
    pub new_key_safe: Option<bool>,
}

impl Problem {
    /// The problem of a body sent as `application/problem+json` (or JSON that reads as
    /// one), if it is one.
    pub fn parse(headers: &HeaderMap, body: &[u8]) -> Option<Problem> {
        let json = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.contains("json"));
        if !json {
            return None;
        }
        serde_json::from_slice(body).ok()
    }

    /// The idem problem type (`operation-in-progress`, ...), when the type URI is one of
    /// idem's catalogue, shared with the server.
    pub fn idem_type(&self) -> Option<idem_contract::problem::ProblemType> {
        self.type_uri
            .as_deref()
            .and_then(|t| t.strip_prefix(idem_contract::problem::TYPE_PREFIX))
            .and_then(idem_contract::problem::ProblemType::from_slug)
    }
}
