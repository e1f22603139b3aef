//! The retry loop: one intent, its attempts, and the typed outcome.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use tokio::time::Instant;
use tracing::Instrument;

use idem_contract::extension::MAX_IDENTITY_LEN;
use idem_contract::headers::{IDEMPOTENT_REPLAYED, OPERATION_ID};
use idem_contract::problem::ProblemType;
use idem_contract::{FieldPath, KeySource};
use serde_json::{Map, Value};

use crate::backoff::Jitter;
use crate::budget::RetryBudget;
use crate::intent::Intent;
use crate::outcome::{
    Completed, Failed, LastAttempt, LookupAnswer, OperationStatus, Outcome, Problem, StopReason,
    Unknown,
};
use crate::policy::RetryPolicy;
use crate::transport::{Answer, Reqwest, Transport, TransportError};

/// How long the status lookup may take: once the attempts have stopped without an answer,
/// and, on a resume, before the first request (there, no longer than what is left of the
/// window's deadline either).
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// One request of a business operation, sent unchanged on every attempt (the client adds
/// the key).
#[derive(Clone, Debug)]
pub struct Call {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
}

/// Why a [`Call`] could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The URL is not a valid absolute URI.
    #[error("invalid URL: {0}")]
    Url(String),
    /// The body does not serialise as JSON.
    #[error("the body does not serialise as JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A header name or value is invalid.
    #[error("invalid header: {0}")]
    Header(String),
}

/// Why [`Client::execute`] sent nothing: the call cannot carry the intent's key where
/// the contract puts it, or lacks what the contract requires of every request.
///
/// Nothing was sent (not the command, not the status lookup), so nothing can have taken
/// effect: this is neither a completed nor an unknown outcome, and it is not one of
/// [`Outcome`]'s variants. The intent comes back as it was, to be sent again once the
/// call is fixed (its key was not used).
#[derive(Debug)]
pub struct NotSent {
    /// The intent, as it was before the call.
    pub intent: Intent,
    /// What is wrong with the call.
    pub reason: Refusal,
}

impl fmt::Display for NotSent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "nothing was sent for `{}`: {}",
            self.intent.policy.operation(),
            self.reason
        )
    }
}

impl std::error::Error for NotSent {}

/// What is wrong with a call, found before anything is sent ([`NotSent`]).
///
/// A field path (`field`, `at`) is written with dots, as the contract writes it
/// (`request.key`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The contract puts the key in a member of the JSON body, and the call has no body
    /// ([`Call::new`] without [`Call::json`]).
    #[error(
        "the contract puts the key in the JSON body member `{field}`, and the call has no body"
    )]
    EmptyBody {
        /// The key's member.
        field: String,
    },
    /// The contract puts the key in a member of the JSON body, and the body is a form
    /// (`application/x-www-form-urlencoded`): this client writes keys into JSON bodies
    /// only.
    #[error(
        "the contract puts the key in the body member `{field}`, and the call's body is a form; this client places keys in JSON bodies only"
    )]
    FormBody {
        /// The key's member.
        field: String,
    },
    /// The contract puts the key in a member of the JSON body, and the body is not JSON.
    #[error(
        "the contract puts the key in the JSON body member `{field}`, and the call's body is not JSON"
    )]
    BodyNotJson {
        /// The key's member.
        field: String,
    },
    /// The body is JSON but not an object (an array, `null`, a string, a number, a
    /// boolean), so the key's member has nowhere to go.
    #[error(
        "the contract puts the key in the JSON body member `{field}`, and the call's body is {found}, not an object"
    )]
    BodyNotObject {
        /// The key's member.
        field: String,
        /// What the body is: `an array`, `null`, `a string`, `a number` or `a boolean`.
        found: &'static str,
    },
    /// A member on the way to the key's member is there and is not an object
    /// (`{"request": 5}` for the member `request.key`).
    #[error(
        "the contract puts the key in the JSON body member `{field}`, and the body's `{at}` is {found}, not an object"
    )]
    PathBlocked {
        /// The key's member.
        field: String,
        /// The member in the way.
        at: String,
        /// What it is: `an array`, `a string`, `a number` or `a boolean`.
        found: &'static str,
    },
    /// The call carries a key of its own, where the contract puts the key (the key
    /// header, under any case of its name, or the body member), and it is not the
    /// intent's key. The client never replaces a caller's key: make the intent with that
    /// key ([`Intent::resume`]), or leave it out of the call.
    #[error(
        "the call carries its own idempotency key in `{at}`, and it is not the intent's key; make the intent with that key (Intent::resume) or leave it out of the call"
    )]
    KeyConflict {
        /// The key header's name, or the key's member.
        at: String,
    },
    /// The contract names the client by a request header (its published
    /// `client_identity`, [`crate::RetryPolicy::client_identity_header`]), and the call
    /// has no valid one. The server would answer 401 `client-identity-missing`; the
    /// client checks the server's rules first: one value, 1 to 255 visible ASCII
    /// characters (spaces and tabs around it do not count).
    #[error("the contract names the client by the `{header}` header: {why}")]
    ClientIdentity {
        /// The header's name, as the contract publishes it.
        header: String,
        /// What is wrong, such as `the call has none`.
        why: String,
    },
    /// The key header cannot be written: the contract's header name is not a valid
    /// HTTP field name.
    #[error("the contract's key header `{name}` is not a valid header name")]
    KeyHeaderName {
        /// The name, as the contract gives it.
        name: String,
    },
}

impl Call {
    /// A call with `method` to `url` (absolute: `http://127.0.0.1:3000/orders`), no body.
    ///
    /// # Errors
    ///
    /// `url` is not an absolute URI.
    pub fn new(method: Method, url: &str) -> Result<Call, CallError> {
        let uri: Uri = url
            .parse()
            .map_err(|e| CallError::Url(format!("{url}: {e}")))?;
        if uri.scheme().is_none() || uri.authority().is_none() {
            return Err(CallError::Url(format!("{url}: not absolute")));
        }
        Ok(Call {
            method,
            uri,
            headers: HeaderMap::new(),
            body: Bytes::new(),
        })
    }

    /// A `POST` to `url` with `body` as JSON.
    ///
    /// # Errors
    ///
    /// `url` is not absolute, or `body` does not serialise.
    pub fn post_json(url: &str, body: &impl serde::Serialize) -> Result<Call, CallError> {
        Call::new(Method::POST, url)?.json(body)
    }

    /// The same call with `body` as JSON (`Content-Type: application/json`).
    ///
    /// # Errors
    ///
    /// `body` does not serialise.
    pub fn json(mut self, body: &impl serde::Serialize) -> Result<Call, CallError> {
        self.body = serde_json::to_vec(body)?.into();
        self.headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        Ok(self)
    }

    /// The same call with the header `name: value` (the client identity, credentials),
    /// added to those of the same name.
    ///
    /// The key is the intent's, and [`Client::execute`] writes it: a key header set here
    /// must name the intent's key (as the server reads it: `abc` and `"abc"` are one
    /// key), or the call is refused ([`Refusal::KeyConflict`]); it is never replaced.
    ///
    /// # Errors
    ///
    /// `name` or `value` is not valid in HTTP.
    pub fn header(mut self, name: &str, value: &str) -> Result<Call, CallError> {
        let name = HeaderName::try_from(name).map_err(|e| CallError::Header(e.to_string()))?;
        let value = HeaderValue::try_from(value).map_err(|e| CallError::Header(e.to_string()))?;
        self.headers.append(name, value);
        Ok(self)
    }

    /// The URL.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }
}

/// A client that sends each business intent under its contract's retry policy.
///
/// Exactly one layer retries: this one. The default transport is reqwest with its own
/// retries off ([`Reqwest::new`]); do not put it behind a retrying middleware
/// (reqwest-middleware's `RetryTransientMiddleware`), or both would retry.
pub struct Client<T = Reqwest> {
    transport: T,
    budget: RetryBudget,
    jitter: Arc<Mutex<Jitter>>,
}

impl Client<Reqwest> {
    /// A client on reqwest's defaults, with reqwest's own retries off.
    ///
    /// # Errors
    ///
    /// reqwest cannot build its client.
    pub fn new() -> Result<Client<Reqwest>, reqwest::Error> {
        Ok(Client::with_transport(Reqwest::new(
            reqwest::Client::builder(),
        )?))
    }
}

impl<T: Transport> Client<T> {
    /// A client on `transport`, with the default [`RetryBudget`] and jitter from entropy.
    pub fn with_transport(transport: T) -> Client<T> {
        Client {
            transport,
            budget: RetryBudget::default(),
            jitter: Arc::new(Mutex::new(Jitter::from_entropy())),
        }
    }

    /// The same client with another retry budget (shared by every intent it sends).
    pub fn with_budget(mut self, budget: RetryBudget) -> Client<T> {
        self.budget = budget;
        self
    }

    /// The same client with another jitter source ([`Jitter::seeded`] makes delays
    /// reproducible).
    pub fn with_jitter(mut self, jitter: Jitter) -> Client<T> {
        self.jitter = Arc::new(Mutex::new(jitter));
        self
    }

    /// The retry budget.
    pub fn budget(&self) -> &RetryBudget {
        &self.budget
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// Sends `call` for `intent` under its policy until a definite answer, and returns
    /// the outcome. One `execute` is one window of the intent:
    ///
    /// - each attempt carries the intent's key (a header, or the body member the policy
    ///   names), and is bounded by the per-attempt timeout and what is left of the
    ///   deadline, counted from the start of this `execute`; no attempt starts after the
    ///   deadline, and at most `max_attempts` are sent, the first included;
    /// - 2xx and 3xx complete it (a replay is flagged); a 4xx the contract does not
    ///   declare retryable fails it for good (400, 401, 403, 404, 422, ...);
    /// - a declared retryable status or transport failure, idem's 409
    ///   `operation-in-progress` (or 202 of `concurrency = accepted`), idem's 408
    ///   `request-timeout` (nothing was registered) and idem's 503
    ///   `step-outcome-unknown` (the server resumes the operation), are retried after
    ///   the backoff, never sooner than the server's `Retry-After`; a `Retry-After`
    ///   longer than what is left of the deadline stops at once;
    /// - a retry needs the client's retry budget; a spent budget stops the retries;
    /// - anything else (a 5xx not declared retryable, a timeout not declared, 409
    ///   `operation-outcome-unknown`) stops: the outcome is not known.
    ///
    /// Before an [`Outcome::Unknown`], the contract's status lookup is asked (once, within
    /// [`LOOKUP_TIMEOUT`], at the call's scheme and authority with the lookup's path and
    /// the call's headers but not its body); a completed operation found there is returned as
    /// [`Outcome::Completed`] with `from_lookup`.
    ///
    /// When the key may have been sent before (the intent came back in an
    /// [`Outcome::Unknown`], or was made by [`Intent::resume`]), the status lookup is
    /// asked first, before any request: see [`Intent::resume`] for what each of its
    /// answers does.
    ///
    /// # Errors
    ///
    /// [`NotSent`], before anything is sent, when the call cannot carry the key where the
    /// contract puts it ([`Refusal`] says why: a body key with no body, a body that is
    /// not a JSON object, a member in the way), already carries another key there
    /// ([`Refusal::KeyConflict`]: a caller's key is never replaced), or lacks the client
    /// identity header the contract publishes ([`Refusal::ClientIdentity`], with the
    /// header's name). The intent comes back unchanged.
    pub async fn execute(&self, intent: Intent, call: &Call) -> Result<Outcome, NotSent> {
        let request = keyed(call, &intent).and_then(|request| {
            identified(call, &intent.policy)?;
            Ok(request)
        });
        let request = match request {
            Ok(request) => request,
            Err(reason) => {
                tracing::warn!(
                    idem.operation = %intent.policy.operation(),
                    "idem: nothing sent: {reason}"
                );
                return Err(NotSent { intent, reason });
            }
        };
        let span = tracing::info_span!(
            "idem.operation",
            idem.operation = %intent.policy.operation(),
            idem.operation_id = tracing::field::Empty,
            idem.outcome = tracing::field::Empty,
            idem.attempts = tracing::field::Empty,
        );
        let outcome = async {
            let outcome = self.window(intent, call, &request).await;
            let span = tracing::Span::current();
            let (name, attempts, operation_id) = match &outcome {
                Outcome::Completed(c) => ("completed", c.attempts, c.operation_id.clone()),
                Outcome::Failed(f) => ("failed", f.attempts, f.operation_id.clone()),
                Outcome::Unknown(u) => ("unknown", u.attempts, u.operation_id.clone()),
            };
            span.record("idem.outcome", name);
            if let Outcome::Unknown(unknown) = &outcome {
                tracing::warn!(
                    reason = ?unknown.reason,
                    "idem: no definite answer; execute the same intent again to resume it under its key \
                     (a new window), or save the key and resume with Intent::resume"
                );
            }
            span.record("idem.attempts", attempts);
            if let Some(id) = operation_id {
                span.record("idem.operation_id", id.as_str());
            }
            outcome
        }
        .instrument(span)
        .await;
        Ok(outcome)
    }

    /// One window of `intent`: the status lookup first when the key may have been sent
    /// before, then the attempts, then the lookup again if they end without an answer.
    async fn window(&self, mut intent: Intent, call: &Call, request: &Request<Bytes>) -> Outcome {
        let policy = Arc::clone(&intent.policy);
        let mut window = Window {
            deadline: Instant::now() + policy.deadline(),
            attempts: 0,
            first_wait: None,
            first_lookup: None,
        };
        if intent.resumed && policy.status_lookup().is_some() {
            let left = window.deadline.saturating_duration_since(Instant::now());
            let lookup = self.lookup(&intent, call, LOOKUP_TIMEOUT.min(left)).await;
            tracing::info!(
                lookup = lookup_name(lookup.as_ref()),
                "idem: resuming under the same key; the status lookup answered first"
            );
            if let Some(LookupAnswer::Status(status)) = &lookup {
                intent.operation_id = Some(status.operation_id.clone());
                match status.state.as_str() {
                    "completed" => {
                        if let Some(done) = completed_from_lookup(&intent, status, 0) {
                            return Outcome::Completed(done);
                        }
                    }
                    "processing" => window.first_wait = status.retry_after.map(Duration::from_secs),
                    _ => {}
                }
            }
            let unknown_on_server =
                matches!(&lookup, Some(LookupAnswer::Status(s)) if s.state == "unknown");
            if unknown_on_server {
                // A request would be answered 409 `operation-outcome-unknown`: none is sent.
                return Outcome::Unknown(Box::new(Unknown {
                    operation_id: intent.operation_id.clone(),
                    intent,
                    reason: StopReason::OutcomeUnknownOnServer,
                    last: None,
                    lookup,
                    attempts: 0,
                }));
            }
            window.first_lookup = Some(lookup);
        }
        match self.run(&mut intent, request, &mut window).await {
            Ok(outcome) => outcome,
            Err((reason, last)) => self.unknown(intent, call, reason, last, window).await,
        }
    }

    /// The attempts of one window; `Err` when they stop without a definite answer.
    async fn run(
        &self,
        intent: &mut Intent,
        request: &Request<Bytes>,
        window: &mut Window,
    ) -> Result<Outcome, (StopReason, Option<LastAttempt>)> {
        let policy = Arc::clone(&intent.policy);
        let deadline = window.deadline;
        let mut last: Option<LastAttempt> = None;
        let mut retry_after: Option<Duration> = None;
        loop {
            if window.attempts >= policy.max_attempts() {
                return Err((StopReason::AttemptsExhausted, last));
            }
            if window.attempts == 0
                && let Some(wait) = window.first_wait.filter(|_| policy.obeys_retry_after())
            {
                // The status lookup said another attempt is running: not before its lease ends.
                if wait >= deadline.saturating_duration_since(Instant::now()) {
                    return Err((
                        StopReason::RetryAfterBeyondDeadline { retry_after: wait },
                        last,
                    ));
                }
                tokio::time::sleep(wait).await;
            }
            if window.attempts > 0 {
                let now = Instant::now();
                let left = deadline.saturating_duration_since(now);
                let asked = retry_after.filter(|_| policy.obeys_retry_after());
                if let Some(asked) = asked
                    && asked >= left
                {
                    return Err((
                        StopReason::RetryAfterBeyondDeadline { retry_after: asked },
                        last,
                    ));
                }
                if !self.budget.allows_retry() {
                    return Err((StopReason::BudgetExhausted, last));
                }
                let delay = {
                    let mut jitter = self.jitter.lock().unwrap_or_else(|e| e.into_inner());
                    policy
                        .backoff()
                        .delay(window.attempts - 1, asked, &mut jitter)
                };
                if delay >= left {
                    return Err((StopReason::DeadlineReached, last));
                }
                tokio::time::sleep(delay).await;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err((StopReason::DeadlineReached, last));
            }
            let left = deadline - now;
            let timeout = policy.per_attempt().map_or(left, |p| p.min(left));
            let resend = window.attempts;
            window.attempts += 1;
            intent.attempts += 1;
            intent.resumed = true;
            let span = tracing::info_span!(
                "idem.attempt",
                idem.attempt = window.attempts,
                http.request.resend_count = tracing::field::Empty,
                http.response.status_code = tracing::field::Empty,
                error.r#type = tracing::field::Empty,
            );
            if resend > 0 {
                span.record("http.request.resend_count", resend);
            }
            let sent = tokio::time::timeout(timeout, self.transport.send(request.clone()))
                .instrument(span.clone())
                .await
                .unwrap_or(Err(TransportError::Timeout));
            retry_after = None;
            match sent {
                Err(error) => {
                    span.record("error.type", failure_name(&error));
                    // An answer over the limit came, and would come again: not retried.
                    let retry = error != TransportError::TooLarge
                        && policy.retries_transport(error.failure());
                    tracing::info!(
                        parent: &span,
                        error.r#type = failure_name(&error),
                        retryable = retry,
                        "idem: attempt got no answer: {error}"
                    );
                    last = Some(LastAttempt::Transport(error));
                    if !retry {
                        return Err((StopReason::NotRetryable, last));
                    }
                    self.budget.record_failure();
                }
                Ok(answer) => {
                    span.record("http.response.status_code", answer.status.as_u16());
                    if let Some(id) = header_str(&answer.headers, OPERATION_ID) {
                        intent.operation_id = Some(id.to_owned());
                    }
                    let problem = Problem::parse(&answer.headers, &answer.body);
                    match self.classify(intent, &answer, problem, window.attempts) {
                        Verdict::Done(outcome) => return Ok(*outcome),
                        Verdict::Retry { failure, problem } => {
                            retry_after =
                                header_str(&answer.headers, "retry-after").and_then(|v| {
                                    crate::retry_after::parse(v.as_bytes(), SystemTime::now())
                                });
                            tracing::info!(
                                parent: &span,
                                http.response.status_code = answer.status.as_u16(),
                                retry_after_ms = retry_after.map(|d| d.as_millis() as u64),
                                "idem: attempt answered a retryable status"
                            );
                            if failure {
                                self.budget.record_failure();
                            }
                            last = Some(LastAttempt::Answer {
                                status: answer.status,
                                problem,
                            });
                        }
                        Verdict::Stop(reason, problem) => {
                            tracing::info!(
                                parent: &span,
                                http.response.status_code = answer.status.as_u16(),
                                "idem: attempt answered with no definite outcome: {reason:?}"
                            );
                            last = Some(LastAttempt::Answer {
                                status: answer.status,
                                problem,
                            });
                            return Err((reason, last));
                        }
                    }
                }
            }
        }
    }

    /// What to do after `answer`, whose problem details (if any) are `problem`.
    fn classify(
        &self,
        intent: &Intent,
        answer: &Answer,
        problem: Option<Problem>,
        attempts: u32,
    ) -> Verdict {
        let status = answer.status;
        let kind = problem.as_ref().and_then(Problem::idem_type);
        if let Some(failure) = retried_whatever_the_list(intent, answer, kind) {
            return Verdict::Retry { failure, problem };
        }
        if kind == Some(ProblemType::OperationOutcomeUnknown) {
            return Verdict::Stop(StopReason::OutcomeUnknownOnServer, problem);
        }
        if intent.policy.retries_status(status.as_u16()) {
            return Verdict::Retry {
                failure: true,
                problem,
            };
        }
        if status.is_success() || status.is_redirection() || status.is_informational() {
            self.budget.record_success();
            let replayed = header_str(&answer.headers, IDEMPOTENT_REPLAYED)
                .is_some_and(|v| v.eq_ignore_ascii_case("true"));
            return Verdict::Done(Box::new(Outcome::Completed(Completed {
                operation: intent.policy.operation().to_owned(),
                key: intent.key.clone(),
                operation_id: intent.operation_id.clone(),
                status,
                headers: answer.headers.clone(),
                body: answer.body.clone(),
                replayed,
                from_lookup: false,
                attempts,
            })));
        }
        if status.is_client_error() {
            // A definite refusal: the server answered, and the request is at fault.
            self.budget.record_success();
            return Verdict::Done(Box::new(Outcome::Failed(Failed {
                operation: intent.policy.operation().to_owned(),
                key: intent.key.clone(),
                operation_id: intent.operation_id.clone(),
                status,
                problem,
                body: answer.body.clone(),
                attempts,
            })));
        }
        // A 5xx the contract does not declare retryable: the server may have acted.
        Verdict::Stop(StopReason::NotRetryable, problem)
    }

    /// The outcome when the attempts stopped without a definite answer: the status
    /// lookup's, if it has one.
    async fn unknown(
        &self,
        intent: Intent,
        call: &Call,
        reason: StopReason,
        last: Option<LastAttempt>,
        window: Window,
    ) -> Outcome {
        // Nothing was sent since the lookup that opened the window: its answer stands.
        let lookup = match window.first_lookup {
            Some(lookup) if window.attempts == 0 => lookup,
            _ => self.lookup(&intent, call, LOOKUP_TIMEOUT).await,
        };
        if let Some(LookupAnswer::Status(status)) = &lookup
            && status.state == "completed"
            && let Some(done) = completed_from_lookup(&intent, status, window.attempts)
        {
            return Outcome::Completed(done);
        }
        let operation_id = match &lookup {
            Some(LookupAnswer::Status(status)) => Some(status.operation_id.clone()),
            _ => intent.operation_id.clone(),
        };
        Outcome::Unknown(Box::new(Unknown {
            intent,
            operation_id,
            reason,
            last,
            lookup,
            attempts: window.attempts,
        }))
    }

    /// Asks the status lookup about the intent's key, with the call's headers (the client
    /// identity, credentials) but not its body.
    async fn lookup(
        &self,
        intent: &Intent,
        call: &Call,
        timeout: Duration,
    ) -> Option<LookupAnswer> {
        let path = intent.policy.status_lookup()?;
        // Written as the server's lookup reads it back (`KeyScope::lookup_key`).
        let scope = intent.policy.key_scope();
        let key = idem_contract::lookup::encode_key(&scope.key_for_lookup(intent.key.as_str()));
        let path = path.replace(idem_contract::lookup::KEY_PLACEHOLDER, &key);
        let mut parts = call.uri.clone().into_parts();
        parts.path_and_query = Some(path.parse().ok()?);
        let uri = Uri::from_parts(parts).ok()?;
        let mut request = Request::get(uri).body(Bytes::new()).ok()?;
        let key_header = scope.header().map(str::to_ascii_lowercase);
        for (name, value) in &call.headers {
            if name != http::header::CONTENT_TYPE
                && name != http::header::CONTENT_LENGTH
                && key_header.as_deref() != Some(name.as_str())
            {
                request.headers_mut().append(name, value.clone());
            }
        }
        let span = tracing::info_span!("idem.status_lookup");
        let answer = tokio::time::timeout(timeout, self.transport.send(request))
            .instrument(span)
            .await
            .ok()?
            .ok()?;
        Some(match answer.status {
            StatusCode::OK => match serde_json::from_slice::<OperationStatus>(&answer.body) {
                Ok(status) => LookupAnswer::Status(Box::new(status)),
                Err(_) => LookupAnswer::Other(answer.status),
            },
            StatusCode::NOT_FOUND => LookupAnswer::NotFound,
            other => LookupAnswer::Other(other),
        })
    }
}

/// One window of an intent: at most `max_attempts` requests before `deadline`.
struct Window {
    /// When the window closes: its start (when `execute` began) plus the deadline.
    deadline: Instant,
    /// The requests sent in this window.
    attempts: u32,
    /// How long to wait before the first request (the status lookup's `processing`).
    first_wait: Option<Duration>,
    /// What the status lookup said when it opened the window, if it was asked.
    first_lookup: Option<Option<LookupAnswer>>,
}

/// The completed outcome a status lookup's `completed` report gives, with its stored
/// answer; `None` when it has none, or a status that is not one.
fn completed_from_lookup(
    intent: &Intent,
    status: &OperationStatus,
    attempts: u32,
) -> Option<Completed> {
    let stored = status.response.as_ref()?;
    let code = StatusCode::from_u16(stored.status).ok()?;
    let mut headers = HeaderMap::new();
    for (name, value) in &stored.headers {
        if let (Ok(name), Some(Ok(value))) = (
            HeaderName::try_from(name.as_str()),
            value.as_str().map(HeaderValue::try_from),
        ) {
            headers.insert(name, value);
        }
    }
    let body = stored
        .body
        .as_ref()
        .and_then(|b| serde_json::to_vec(b).ok())
        .unwrap_or_default();
    Some(Completed {
        operation: intent.policy.operation().to_owned(),
        key: intent.key.clone(),
        operation_id: Some(status.operation_id.clone()),
        status: code,
        headers,
        body: body.into(),
        replayed: true,
        from_lookup: true,
        attempts,
    })
}

/// A status lookup's answer in a word, for telemetry.
fn lookup_name(lookup: Option<&LookupAnswer>) -> &str {
    match lookup {
        None => "no_answer",
        Some(LookupAnswer::Status(status)) => status.state.as_str(),
        Some(LookupAnswer::NotFound) => "not_found",
        Some(LookupAnswer::Other(_)) => "other",
    }
}

/// What one answer decides; the answer's problem details travel with it.
enum Verdict {
    Done(Box<Outcome>),
    Retry {
        failure: bool,
        problem: Option<Problem>,
    },
    Stop(StopReason, Option<Problem>),
}

/// The request every attempt of `intent` sends: `call` with the key where the contract
/// puts it; or why it cannot be made.
fn keyed(call: &Call, intent: &Intent) -> Result<Request<Bytes>, Refusal> {
    let mut body = call.body.clone();
    let mut headers = call.headers.clone();
    match intent.policy.key() {
        KeySource::Header { name } => {
            let scope = intent.policy.key_scope();
            let header =
                HeaderName::try_from(name.as_ref()).map_err(|_| Refusal::KeyHeaderName {
                    name: name.to_string(),
                })?;
            // A key the caller set is compared as the server reads it (`"abc"` is `abc`).
            let conflict = headers.get_all(&header).iter().any(|value| {
                scope.header_key(value.as_bytes()).ok().as_deref() != Some(intent.key.as_str())
            });
            if conflict {
                return Err(Refusal::KeyConflict {
                    at: name.to_string(),
                });
            }
            headers.insert(header, intent.key.header_value(&scope));
        }
        KeySource::Body { field } => {
            body = with_body_key(call, field, intent.key.as_str())?.into();
        }
    }
    let mut request = Request::new(body);
    *request.method_mut() = call.method.clone();
    *request.uri_mut() = call.uri.clone();
    *request.headers_mut() = headers;
    Ok(request)
}

/// Whether `call` names the client as `policy`'s contract asks, by the rules of the
/// server's `idem::identity::header`.
fn identified(call: &Call, policy: &RetryPolicy) -> Result<(), Refusal> {
    let Some(name) = policy.client_identity_header() else {
        return Ok(());
    };
    let refuse = |why: &str| Refusal::ClientIdentity {
        header: name.to_owned(),
        why: why.to_owned(),
    };
    let header =
        HeaderName::try_from(name).map_err(|_| refuse("that is not a valid header name"))?;
    let mut values = call.headers.get_all(&header).iter();
    let value = values
        .next()
        .ok_or_else(|| refuse("the call has none; add it with Call::header"))?;
    if values.next().is_some() {
        return Err(refuse("the call sends it more than once"));
    }
    let value = value
        .to_str()
        .map_err(|_| refuse("the call's value is not visible ASCII"))?
        .trim_matches([' ', '\t']);
    if value.is_empty() {
        return Err(refuse("the call's value is empty"));
    }
    if value.bytes().any(|b| !b.is_ascii_graphic()) {
        return Err(refuse("the call's value has a space or a tab inside"));
    }
    if value.len() > MAX_IDENTITY_LEN {
        return Err(refuse(&format!(
            "the call's value is longer than {MAX_IDENTITY_LEN} bytes"
        )));
    }
    Ok(())
}

/// `call`'s JSON body with `key` at the member `field`: the objects on its way made when
/// absent (or `null`, which the server reads as absent), the rest of the body kept.
fn with_body_key(call: &Call, field: &FieldPath, key: &str) -> Result<Vec<u8>, Refusal> {
    let name = || field.to_string();
    let form = call
        .headers
        .get_all(http::header::CONTENT_TYPE)
        .iter()
        .any(|v| {
            v.to_str().is_ok_and(|ct| {
                ct.trim_start()
                    .to_ascii_lowercase()
                    .starts_with("application/x-www-form-urlencoded")
            })
        });
    if form {
        return Err(Refusal::FormBody { field: name() });
    }
    if call.body.is_empty() {
        return Err(Refusal::EmptyBody { field: name() });
    }
    let mut json: Value =
        serde_json::from_slice(&call.body).map_err(|_| Refusal::BodyNotJson { field: name() })?;
    let segments: Vec<&str> = field.segments().collect();
    let Some((last, parents)) = segments.split_last() else {
        return Err(Refusal::EmptyBody { field: name() });
    };
    let mut at = match &mut json {
        Value::Object(object) => object,
        other => {
            return Err(Refusal::BodyNotObject {
                field: name(),
                found: json_kind(other),
            });
        }
    };
    for (i, segment) in parents.iter().enumerate() {
        let next = at
            .entry((*segment).to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
        if next.is_null() {
            *next = Value::Object(Map::new());
        }
        at = match next {
            Value::Object(object) => object,
            other => {
                return Err(Refusal::PathBlocked {
                    field: name(),
                    at: segments[..=i].join("."),
                    found: json_kind(other),
                });
            }
        };
    }
    match at.get(*last) {
        None | Some(Value::Null) => {
            at.insert((*last).to_owned(), key.into());
        }
        Some(Value::String(own)) if own == key => {}
        Some(_) => return Err(Refusal::KeyConflict { at: name() }),
    }
    serde_json::to_vec(&json).map_err(|_| Refusal::BodyNotJson { field: name() })
}

/// What a JSON value is, for a message.
fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The `error.type` of a failure: the contract's name for it, or `body_too_large`.
fn failure_name(error: &TransportError) -> &'static str {
    match error {
        TransportError::TooLarge => "body_too_large",
        other => other.failure().name(),
    }
}

/// Whether `answer` (of idem problem `kind`, if any) is retried with the same key whatever
/// the contract's retry list says, and if so whether it counts as a failure for the retry
/// budget: `operation-in-progress` and `client-budget-exhausted` (nothing ran, nothing
/// was registered: safe after `Retry-After`), `request-timeout` (the body came too slowly;
/// nothing was registered), `step-outcome-unknown` (the server keeps the key and resumes
/// the operation on the retry, whose calls to other systems are deduplicated), and the 202 of `concurrency = accepted` (a `Location` to
/// poll and a `Retry-After`, not a replay).
fn retried_whatever_the_list(
    intent: &Intent,
    answer: &Answer,
    kind: Option<ProblemType>,
) -> Option<bool> {
    match kind {
        Some(ProblemType::OperationInProgress | ProblemType::ClientBudgetExhausted) => {
            return Some(false);
        }
        Some(ProblemType::RequestTimeout | ProblemType::StepOutcomeUnknown) => return Some(true),
        _ => {}
    }
    let accepted = answer.status == StatusCode::ACCEPTED
        && matches!(
            intent.policy.concurrency(),
            idem_contract::Concurrency::Accepted
        )
        && kind.is_none()
        && header_str(&answer.headers, IDEMPOTENT_REPLAYED).is_none()
        && answer.headers.contains_key(http::header::LOCATION)
        && answer.headers.contains_key(http::header::RETRY_AFTER);
    accepted.then_some(false)
}
