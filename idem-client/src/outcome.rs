//! What became of an intent: completed, failed for good, or unknown. Never "error,
//! nothing happened" when something may have happened.

use std::fmt;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::intent::{IdempotencyKey, Intent};

/// The outcome of [`crate::Client::execute`].
///
/// Each outcome prints as one log line (`Display`), `key=value` pairs separated
/// by spaces, in this order, a pair left out when it has no value:
///
/// ```text
/// outcome=completed operation=create_order status=201 attempts=2 replayed=true from_lookup=false operation_id=0191f6a4-…
/// outcome=failed operation=create_order status=422 attempts=1 problem=fingerprint-mismatch operation_id=0191f6a4-…
/// outcome=unknown operation=create_order reason=attempts_exhausted attempts=4 last=503 lookup=not_found operation_id=0191f6a4-…
/// ```
///
/// `problem` is idem's problem type (its slug), or the answer's problem type URI;
/// `reason` is the [`StopReason`] in snake case (with `retry_after_ms` for
/// `retry_after_beyond_deadline`); `last` the last attempt's status, or its transport
/// failure (`timeout`, `connection_reset`, `connection_refused`, `body_too_large`);
/// `lookup` the status lookup's answer (`not_found`, its state, or `status_NNN`) when
/// it was asked and answered. A value that is not all visible ASCII, or holds `"`,
/// `=` or `\`, is written quoted, with Rust's escapes: a line never breaks.
///
/// [`Completed`], [`Failed`] and [`Unknown`] print the same line on their own.
///
/// The key is not printed. It is not a secret (it travels in the clear), but a key may
/// be a business reference the caller chose, and this crate records no key in its
/// telemetry either; the operation id is what the server knows an operation by. The
/// alternate form (`{:#}`) adds `key=…` at the end, for a caller who wants it in the
/// line.
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
    /// The operation's name, as its policy gives it ([`crate::RetryPolicy::operation`]).
    pub operation: String,
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

impl Completed {
    /// The answer's body, read as JSON into `T` (whatever its `Content-Type` says).
    ///
    /// ```
    /// # fn check(done: idem_client::Completed) -> Result<(), idem_client::BodyError> {
    /// #[derive(serde::Deserialize)]
    /// struct Order { id: String }
    /// let order: Order = done.json()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`BodyError::Empty`] when the body is empty (a 204, or a lookup's stored answer
    /// whose body was not JSON); [`BodyError::Json`] when it is not JSON, or not JSON of
    /// the shape of `T` (serde_json's error says where).
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, BodyError> {
        if self.body.is_empty() {
            return Err(BodyError::Empty {
                status: self.status,
            });
        }
        serde_json::from_slice(&self.body).map_err(|source| BodyError::Json {
            status: self.status,
            content_type: self
                .headers
                .get(http::header::CONTENT_TYPE)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
            source,
        })
    }
}

/// Why [`Completed::json`] could not read the body.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BodyError {
    /// The answer has no body.
    #[error("the answer ({status}) has no body to read as JSON")]
    Empty {
        /// The answer's status.
        status: StatusCode,
    },
    /// The body is not JSON, or not JSON of the type asked for.
    #[error(
        "the answer's body ({status}, content-type {}) is not the JSON expected: {source}",
        .content_type.as_deref().unwrap_or("none")
    )]
    Json {
        /// The answer's status.
        status: StatusCode,
        /// Its `Content-Type`, if it has one.
        content_type: Option<String>,
        /// serde_json's error: what, and at which line and column.
        #[source]
        source: serde_json::Error,
    },
}

/// A permanent answer (a 4xx the contract does not declare retryable).
#[derive(Debug)]
pub struct Failed {
    /// The operation's name, as its policy gives it ([`crate::RetryPolicy::operation`]).
    pub operation: String,
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

impl fmt::Display for Outcome {
    /// One log line: see [`Outcome`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Completed(done) => fmt::Display::fmt(done, f),
            Outcome::Failed(failed) => fmt::Display::fmt(failed, f),
            Outcome::Unknown(unknown) => fmt::Display::fmt(unknown, f),
        }
    }
}

impl fmt::Display for Completed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("outcome=completed")?;
        pair(f, "operation", &self.operation)?;
        write!(
            f,
            " status={} attempts={} replayed={} from_lookup={}",
            self.status.as_u16(),
            self.attempts,
            self.replayed,
            self.from_lookup
        )?;
        if let Some(id) = &self.operation_id {
            pair(f, "operation_id", id)?;
        }
        key_if_asked(f, &self.key)
    }
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("outcome=failed")?;
        pair(f, "operation", &self.operation)?;
        write!(
            f,
            " status={} attempts={}",
            self.status.as_u16(),
            self.attempts
        )?;
        if let Some(problem) = &self.problem {
            match problem.idem_type() {
                Some(kind) => pair(f, "problem", kind.slug())?,
                None => {
                    if let Some(uri) = &problem.type_uri {
                        pair(f, "problem", uri)?;
                    }
                }
            }
        }
        if let Some(id) = &self.operation_id {
            pair(f, "operation_id", id)?;
        }
        key_if_asked(f, &self.key)
    }
}

impl fmt::Display for Unknown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("outcome=unknown")?;
        pair(f, "operation", self.intent.policy.operation())?;
        let reason = match &self.reason {
            StopReason::AttemptsExhausted => "attempts_exhausted",
            StopReason::DeadlineReached => "deadline_reached",
            StopReason::RetryAfterBeyondDeadline { .. } => "retry_after_beyond_deadline",
            StopReason::BudgetExhausted => "budget_exhausted",
            StopReason::NotRetryable => "not_retryable",
            StopReason::OutcomeUnknownOnServer => "outcome_unknown_on_server",
        };
        write!(f, " reason={reason}")?;
        if let StopReason::RetryAfterBeyondDeadline { retry_after } = &self.reason {
            write!(f, " retry_after_ms={}", retry_after.as_millis())?;
        }
        write!(f, " attempts={}", self.attempts)?;
        match &self.last {
            Some(LastAttempt::Answer { status, .. }) => write!(f, " last={}", status.as_u16())?,
            Some(LastAttempt::Transport(crate::transport::TransportError::TooLarge)) => {
                f.write_str(" last=body_too_large")?;
            }
            Some(LastAttempt::Transport(error)) => write!(f, " last={}", error.failure().name())?,
            None => {}
        }
        match &self.lookup {
            Some(LookupAnswer::Status(status)) => pair(f, "lookup", &status.state)?,
            Some(LookupAnswer::NotFound) => f.write_str(" lookup=not_found")?,
            Some(LookupAnswer::Other(status)) => write!(f, " lookup=status_{}", status.as_u16())?,
            None => {}
        }
        if let Some(id) = &self.operation_id {
            pair(f, "operation_id", id)?;
        }
        key_if_asked(f, &self.intent.key)
    }
}

/// ` name=value`, the value quoted (with Rust's escapes) unless it is all visible ASCII
/// without `"`, `=` or `\`.
fn pair(f: &mut fmt::Formatter<'_>, name: &str, value: &str) -> fmt::Result {
    let bare = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'=' | b'\\'));
    if bare {
        write!(f, " {name}={value}")
    } else {
        write!(f, " {name}=\"{}\"", value.escape_debug())
    }
}

/// ` key=…` in the alternate form (`{:#}`) only.
fn key_if_asked(f: &mut fmt::Formatter<'_>, key: &IdempotencyKey) -> fmt::Result {
    if f.alternate() {
        pair(f, "key", key.as_str())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Intent, RetryPolicy, TransportError};

    fn completed(body: &'static [u8]) -> Completed {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        Completed {
            operation: "create_order".into(),
            key: IdempotencyKey::parse("order-7").unwrap(),
            operation_id: Some("op-1".into()),
            status: StatusCode::CREATED,
            headers,
            body: Bytes::from_static(body),
            replayed: true,
            from_lookup: false,
            attempts: 2,
        }
    }

    #[test]
    fn each_outcome_is_one_line_without_the_key() {
        let done = Outcome::Completed(completed(b"{}"));
        assert_eq!(
            done.to_string(),
            "outcome=completed operation=create_order status=201 attempts=2 replayed=true from_lookup=false operation_id=op-1"
        );
        assert!(format!("{done:#}").ends_with(" operation_id=op-1 key=order-7"));

        let failed = Outcome::Failed(Failed {
            operation: "POST /orders".into(),
            key: IdempotencyKey::parse("order-7").unwrap(),
            operation_id: None,
            status: StatusCode::UNPROCESSABLE_ENTITY,
            problem: Some(Problem {
                type_uri: Some("tag:idem.rs,2026:problem:fingerprint-mismatch".into()),
                title: None,
                status: Some(422),
                detail: Some("line one\nline two".into()),
                operation_id: None,
                state: None,
                new_key_safe: None,
            }),
            body: Bytes::new(),
            attempts: 1,
        });
        assert_eq!(
            failed.to_string(),
            "outcome=failed operation=\"POST /orders\" status=422 attempts=1 problem=fingerprint-mismatch"
        );

        let policy = RetryPolicy::builder("create_order")
            .max_attempts(4)
            .deadline(Duration::from_secs(30))
            .build()
            .unwrap();
        let unknown = |reason, last, lookup, operation_id: Option<&str>| {
            Outcome::Unknown(Box::new(Unknown {
                intent: Intent::new(policy.clone()),
                operation_id: operation_id.map(str::to_owned),
                reason,
                last,
                lookup,
                attempts: 4,
            }))
        };
        let line = unknown(
            StopReason::AttemptsExhausted,
            Some(LastAttempt::Answer {
                status: StatusCode::SERVICE_UNAVAILABLE,
                problem: None,
            }),
            Some(LookupAnswer::NotFound),
            Some("op\n\"2\""),
        );
        assert_eq!(
            line.to_string(),
            r#"outcome=unknown operation=create_order reason=attempts_exhausted attempts=4 last=503 lookup=not_found operation_id="op\n\"2\"""#
        );
        let Outcome::Unknown(inner) = &line else {
            unreachable!()
        };
        assert!(!line.to_string().contains(inner.key().as_str()));
        assert!(format!("{line:#}").contains(&format!(" key={}", inner.key())));
        let line = unknown(
            StopReason::RetryAfterBeyondDeadline {
                retry_after: Duration::from_secs(60),
            },
            Some(LastAttempt::Transport(TransportError::Timeout)),
            Some(LookupAnswer::Other(StatusCode::BAD_GATEWAY)),
            None,
        );
        assert_eq!(
            line.to_string(),
            "outcome=unknown operation=create_order reason=retry_after_beyond_deadline retry_after_ms=60000 attempts=4 last=timeout lookup=status_502"
        );
        let line = unknown(
            StopReason::NotRetryable,
            Some(LastAttempt::Transport(TransportError::TooLarge)),
            None,
            None,
        );
        assert!(line.to_string().ends_with(" last=body_too_large"), "{line}");
    }

    #[test]
    fn the_completed_body_reads_as_json_or_says_why_not() {
        #[derive(Debug, Deserialize, PartialEq)]
        struct Order {
            id: String,
        }
        let order: Order = completed(br#"{"id":"ord_7"}"#).json().unwrap();
        assert_eq!(order.id, "ord_7");
        let value: Value = completed(b"[1]").json().unwrap();
        assert_eq!(value, serde_json::json!([1]));

        let empty = completed(b"").json::<Value>().unwrap_err();
        assert!(matches!(empty, BodyError::Empty { status } if status == 201));
        assert_eq!(
            empty.to_string(),
            "the answer (201 Created) has no body to read as JSON"
        );
        let wrong = completed(br#"{"id":7}"#).json::<Order>().unwrap_err();
        let BodyError::Json { content_type, .. } = &wrong else {
            panic!("{wrong:?}");
        };
        assert_eq!(content_type.as_deref(), Some("application/json"));
        assert!(
            wrong.to_string().contains("content-type application/json")
                && wrong.to_string().contains("line 1 column"),
            "{wrong}"
        );
        assert!(std::error::Error::source(&wrong).is_some());
        let mut not_json = completed(b"<html>");
        not_json.headers.clear();
        let error = not_json.json::<Value>().unwrap_err();
        assert!(error.to_string().contains("content-type none"), "{error}");
    }
}
