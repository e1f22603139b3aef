//! The retry policy of one operation, read from its contract wherever the caller is: the
//! const the macro emits (same workspace), a contracts file (`idem export`), the
//! `x-idempotency` extension of a published OpenAPI document, or built by hand for an
//! API not written with idem, checked by the rules the macro applies.
//!
//! ```
//! use std::time::Duration;
//! use idem_client::RetryPolicy;
//! use idem_contract::{Retryable, StatusCode, TransportFailure};
//!
//! // A payments API not written with idem: its documentation gives these.
//! let policy = RetryPolicy::builder("create_charge")
//!     .key_header("Idempotency-Key")
//!     .max_attempts(4)
//!     .deadline(Duration::from_secs(30))
//!     .per_attempt(Duration::from_secs(10))
//!     .retryable([
//!         Retryable::Status(StatusCode(429)),
//!         Retryable::Status(StatusCode(503)),
//!         Retryable::Transport(TransportFailure::Timeout),
//!     ])
//!     .build()?;
//! assert_eq!(policy.max_attempts(), 4);
//!
//! // A permanent status is refused, as `#[idem::contract]` refuses it.
//! let wrong = RetryPolicy::builder("create_charge")
//!     .max_attempts(3)
//!     .deadline(Duration::from_secs(30))
//!     .retryable([Retryable::Status(StatusCode(404))])
//!     .build();
//! assert!(wrong.unwrap_err().to_string().contains("permanent"));
//! # Ok::<(), idem_client::PolicyError>(())
//! ```

use std::fmt;
use std::time::Duration;

use idem_contract::extension::{ClientIdentity, Extension};
use idem_contract::{
    Concurrency, Contract, ContractsFile, Deadline, KeyFormat, KeyScope, KeySource, Property,
    Retryable, StatusCode, TransportFailure,
};
use serde_json::Value;

use crate::backoff::Backoff;

/// How a client retries one operation: what its contract says (where the key goes, the
/// attempts, the deadline, what may be retried, the status lookup) and how the client
/// spaces its attempts (the backoff, whether `Retry-After` is obeyed).
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    operation: String,
    key: KeySource,
    key_format: KeyFormat,
    max_attempts: u32,
    deadline: Duration,
    per_attempt: Option<Duration>,
    retryable: Vec<Retryable>,
    concurrency: Concurrency,
    status_lookup: Option<String>,
    client_identity: Option<ClientIdentity>,
    backoff: Backoff,
    obey_retry_after: bool,
}

/// Why a policy could not be read or built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError(String);

impl PolicyError {
    fn new(message: impl Into<String>) -> PolicyError {
        PolicyError(message.into())
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PolicyError {}

impl RetryPolicy {
    /// The policy of `contract`, the const `#[idem::contract]` emits next to the handler
    /// (`&create_order::CONTRACT`), for a caller in the same workspace.
    pub fn from_contract(contract: &Contract) -> RetryPolicy {
        RetryPolicy::from_extension(&Extension::new(
            contract,
            contract.operation.to_string(),
            None,
        ))
    }

    /// The policy an `x-idempotency` extension publishes.
    pub fn from_extension(extension: &Extension) -> RetryPolicy {
        RetryPolicy {
            operation: extension.operation.clone(),
            key: extension.key_scope.source.clone(),
            key_format: extension.key_scope.format,
            max_attempts: extension.max_attempts,
            deadline: extension.deadline.total.to_std(),
            per_attempt: extension.deadline.per_attempt.map(|d| d.to_std()),
            retryable: extension.retryable.clone(),
            concurrency: extension.concurrency,
            status_lookup: extension.status_lookup.path.clone(),
            client_identity: extension.client_identity.clone(),
            backoff: Backoff::default(),
            obey_retry_after: true,
        }
    }

    /// The policy of the operation named `operation` in a contracts file (the JSON that
    /// `idem export` writes), for a caller in another repository.
    ///
    /// # Errors
    ///
    /// The text is not a contracts file, or has no contract named `operation` (the
    /// message lists the names it has).
    pub fn from_contracts_file(text: &str, operation: &str) -> Result<RetryPolicy, PolicyError> {
        let file: ContractsFile = serde_json::from_str(text)
            .map_err(|e| PolicyError::new(format!("not a contracts file: {e}")))?;
        let names: Vec<String> = file
            .contracts
            .iter()
            .map(|entry| entry.contract.operation.to_string())
            .collect();
        file.contracts
            .iter()
            .find(|entry| entry.contract.operation == operation)
            .map(|entry| RetryPolicy::from_contract(&entry.contract))
            .ok_or_else(|| {
                PolicyError::new(format!(
                    "the contracts file has no contract `{operation}`; it has {}",
                    list(&names)
                ))
            })
    }

    /// The policy of one operation of a published OpenAPI 3.0 or 3.1 document (JSON or
    /// YAML) with idem's `x-idempotency` extension, named by its `operationId` or by its
    /// method and path (`POST /orders`).
    ///
    /// # Errors
    ///
    /// The text is neither JSON nor YAML, no operation has that name, or its
    /// `x-idempotency` is missing or not a valid extension (the message says which).
    pub fn from_openapi(text: &str, operation: &str) -> Result<RetryPolicy, PolicyError> {
        let root: Value = if text.trim_start().starts_with('{') {
            serde_json::from_str(text)
                .map_err(|e| PolicyError::new(format!("invalid JSON: {e}")))?
        } else {
            yaml_serde::from_str(text)
                .map_err(|e| PolicyError::new(format!("invalid YAML: {e}")))?
        };
        let mut contracted = Vec::new();
        for section in ["paths", "webhooks"] {
            let Some(items) = root.get(section).and_then(Value::as_object) else {
                continue;
            };
            for (route, item) in items {
                let Some(item) = item.as_object() else {
                    continue;
                };
                for (method, op) in item {
                    let label = match section {
                        "paths" => format!("{} {route}", method.to_ascii_uppercase()),
                        _ => format!("{} webhook {route}", method.to_ascii_uppercase()),
                    };
                    let id = op.get("operationId").and_then(Value::as_str);
                    let Some(extension) = op.get("x-idempotency") else {
                        if id == Some(operation) || same_route(&label, operation) {
                            return Err(PolicyError::new(format!(
                                "`{operation}` has no `x-idempotency` extension: its API publishes no idempotency contract"
                            )));
                        }
                        continue;
                    };
                    if id == Some(operation) || same_route(&label, operation) {
                        let extension: Extension = serde_json::from_value(extension.clone())
                            .map_err(|e| {
                                PolicyError::new(format!(
                                    "the `x-idempotency` of `{operation}` is not valid: {e}"
                                ))
                            })?;
                        return Ok(RetryPolicy::from_extension(&extension));
                    }
                    contracted.push(id.map_or(label, str::to_owned));
                }
            }
        }
        Err(PolicyError::new(format!(
            "the document has no operation `{operation}`; those with a contract are {}",
            list(&contracted)
        )))
    }

    /// A policy built by hand, for an API not written with idem.
    pub fn builder(operation: impl Into<String>) -> PolicyBuilder {
        PolicyBuilder {
            operation: operation.into(),
            key: KeySource::Header {
                name: idem_contract::headers::IDEMPOTENCY_KEY.into(),
            },
            key_format: KeyFormat::Any,
            max_attempts: None,
            deadline: None,
            per_attempt: None,
            retryable: Vec::new(),
            status_lookup: None,
            client_identity: None,
        }
    }

    /// The same policy, naming the header the server tells clients apart by (a contract
    /// read from source does not know it; a published document may).
    pub fn with_client_identity(mut self, identity: ClientIdentity) -> RetryPolicy {
        self.client_identity = Some(identity);
        self
    }

    /// The same policy with another backoff (the default is [`Backoff::default`]).
    pub fn with_backoff(mut self, backoff: Backoff) -> RetryPolicy {
        self.backoff = backoff;
        self
    }

    /// The same policy, ignoring `Retry-After` on every attempt when `obey` is false
    /// (the computed backoff alone spaces them). By default it is obeyed.
    pub fn obey_retry_after(mut self, obey: bool) -> RetryPolicy {
        self.obey_retry_after = obey;
        self
    }

    /// The operation's name, as its contract or document names it.
    pub fn operation(&self) -> &str {
        &self.operation
    }

    /// Where the key goes: a header, or a member of the JSON body.
    pub fn key(&self) -> &KeySource {
        &self.key
    }

    /// What a key must look like.
    pub fn key_format(&self) -> KeyFormat {
        self.key_format
    }

    /// The contract's key scope, as far as a client knows it: where the key goes and
    /// what it looks like (the server's own rules read keys with it).
    pub(crate) fn key_scope(&self) -> KeyScope {
        KeyScope {
            source: self.key.clone(),
            format: self.key_format,
            ..KeyScope::CLIENT
        }
    }

    /// The requests one business operation may cost, the first included.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The time budget of all attempts together, from the first send.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// The time one attempt may take; `None`: what is left of the deadline.
    pub fn per_attempt(&self) -> Option<Duration> {
        self.per_attempt
    }

    /// The outcomes after which the same request may be sent again with the same key.
    pub fn retryable(&self) -> &[Retryable] {
        &self.retryable
    }

    /// Whether an answer with `status` may be retried with the same key.
    pub fn retries_status(&self, status: u16) -> bool {
        self.retryable
            .contains(&Retryable::Status(StatusCode(status)))
    }

    /// Whether a transport failure of this kind may be retried with the same key.
    pub fn retries_transport(&self, failure: TransportFailure) -> bool {
        self.retryable.contains(&Retryable::Transport(failure))
    }

    /// What the server answers a duplicate while the first attempt runs.
    pub fn concurrency(&self) -> Concurrency {
        self.concurrency
    }

    /// The status lookup's path, with `{key}` where the key goes.
    pub fn status_lookup(&self) -> Option<&str> {
        self.status_lookup.as_deref()
    }

    /// How the server tells clients apart, when published.
    pub fn client_identity(&self) -> Option<&ClientIdentity> {
        self.client_identity.as_ref()
    }

    /// The request header that names the client, when the contract publishes one
    /// (`client_identity` in `x-idempotency`, such as `X-Client-Id`), or the policy was
    /// given one ([`RetryPolicy::with_client_identity`],
    /// [`PolicyBuilder::client_identity_header`]). Every call under the policy must
    /// carry it, or [`crate::Client::execute`] sends nothing
    /// ([`crate::Refusal::ClientIdentity`]). `None`: the server knows the client some
    /// other way (its credentials), and nothing is checked. A policy read from the
    /// contract const ([`RetryPolicy::from_contract`]) or a contracts file has none:
    /// identity is the service's configuration, not the contract's.
    pub fn client_identity_header(&self) -> Option<&str> {
        self.client_identity
            .as_ref()
            .and_then(ClientIdentity::header_name)
    }

    /// The backoff between attempts.
    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// Whether a server's `Retry-After` is obeyed.
    pub fn obeys_retry_after(&self) -> bool {
        self.obey_retry_after
    }
}

/// Builds a [`RetryPolicy`] by hand; see [`RetryPolicy::builder`].
#[derive(Clone, Debug)]
pub struct PolicyBuilder {
    operation: String,
    key: KeySource,
    key_format: KeyFormat,
    max_attempts: Option<u32>,
    deadline: Option<Duration>,
    per_attempt: Option<Duration>,
    retryable: Vec<Retryable>,
    status_lookup: Option<String>,
    client_identity: Option<ClientIdentity>,
}

impl PolicyBuilder {
    /// The key goes in the request header `name` (by default `Idempotency-Key`).
    pub fn key_header(mut self, name: impl Into<String>) -> PolicyBuilder {
        self.key = KeySource::Header {
            name: name.into().into(),
        };
        self
    }

    /// Keys are UUIDs (by default any visible ASCII; the client makes UUIDv7 keys either
    /// way).
    pub fn uuid_keys(mut self) -> PolicyBuilder {
        self.key_format = KeyFormat::Uuid;
        self
    }

    /// Required: the requests one business operation may cost, the first included.
    pub fn max_attempts(mut self, n: u32) -> PolicyBuilder {
        self.max_attempts = Some(n);
        self
    }

    /// Required: the time budget of all attempts together.
    pub fn deadline(mut self, total: Duration) -> PolicyBuilder {
        self.deadline = Some(total);
        self
    }

    /// The time one attempt may take (by default, what is left of the deadline).
    pub fn per_attempt(mut self, timeout: Duration) -> PolicyBuilder {
        self.per_attempt = Some(timeout);
        self
    }

    /// The statuses and transport failures that may be retried with the same key.
    pub fn retryable(mut self, outcomes: impl IntoIterator<Item = Retryable>) -> PolicyBuilder {
        self.retryable = outcomes.into_iter().collect();
        self
    }

    /// The status lookup's path, with `{key}` where the key goes.
    pub fn status_lookup(mut self, path: impl Into<String>) -> PolicyBuilder {
        self.status_lookup = Some(path.into());
        self
    }

    /// The request header that names the client (checked by [`PolicyBuilder::build`]);
    /// every call under the policy must carry it.
    pub fn client_identity_header(mut self, name: impl Into<String>) -> PolicyBuilder {
        self.client_identity = Some(ClientIdentity::header(name.into()));
        self
    }

    /// The policy, checked by the rules of `#[idem::contract]` that read what was given
    /// (a ttl, a fingerprint and a recovery are not a client's to know, so the rules that
    /// read them do not run).
    ///
    /// # Errors
    ///
    /// `max_attempts` or `deadline` is missing, the key header is not a header name, or
    /// a rule is broken (`max_attempts` of 0 or above the ceiling, a per-attempt timeout
    /// longer than the deadline, a permanent status in `retryable`, a status lookup path
    /// without `{key}`), or the client identity header is not a header name: every
    /// problem in one message, one per line.
    pub fn build(self) -> Result<RetryPolicy, PolicyError> {
        let mut problems = Vec::new();
        if self.max_attempts.is_none() {
            problems.push("`max_attempts` is required: the requests one operation may cost, the first included".to_owned());
        }
        if self.deadline.is_none() {
            problems.push(
                "`deadline` is required: the time budget of all attempts together".to_owned(),
            );
        }
        let to_contract = |d: Duration| {
            idem_contract::Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        };
        let mut contract = Contract::PLACEHOLDER;
        contract.operation = self.operation.clone().into();
        contract.key_scope = KeyScope {
            source: self.key.clone(),
            format: self.key_format,
            ..KeyScope::CLIENT
        };
        contract.max_attempts = self.max_attempts.unwrap_or(1);
        contract.deadline = Deadline {
            total: to_contract(self.deadline.unwrap_or(Duration::from_secs(30))),
            per_attempt: self.per_attempt.map(to_contract),
        };
        contract.retryable = self.retryable.clone().into();
        contract.status_lookup.path = self.status_lookup.clone().map(Into::into);
        let given = [
            Property::KeyScope,
            Property::Deadline,
            Property::MaxAttempts,
            Property::Retryable,
            Property::StatusLookup,
        ];
        for violation in idem_contract::check(&contract) {
            if violation.involves.iter().all(|p| given.contains(p)) {
                problems.push(violation.message.to_string());
            }
        }
        if let Some(path) = &self.status_lookup
            && !idem_contract::lookup::is_lookup_path(path)
        {
            problems.push(format!(
                "the status lookup path `{path}` must start with `/` and hold `{{key}}` once"
            ));
        }
        if let Some(name) = self
            .client_identity
            .as_ref()
            .and_then(ClientIdentity::header_name)
            && !idem_contract::extension::is_header_name(name)
        {
            problems.push(format!(
                "the client identity header `{name}` is not a header name"
            ));
        }
        if !problems.is_empty() {
            return Err(PolicyError::new(problems.join("\n")));
        }
        let extension = Extension::new(&contract, self.operation, self.client_identity);
        Ok(RetryPolicy::from_extension(&extension))
    }
}

/// Whether `POST /orders` names `label`: the method in any case (HTTP methods are
/// case-sensitive, but OpenAPI's are lowercase keys), the route exactly.
fn same_route(label: &str, operation: &str) -> bool {
    match (label.split_once(' '), operation.split_once(' ')) {
        (Some((m1, r1)), Some((m2, r2))) => m1.eq_ignore_ascii_case(m2) && r1 == r2,
        _ => false,
    }
}

/// `` `a`, `b` `` or "none".
fn list(names: &[String]) -> String {
    if names.is_empty() {
        return "none".to_owned();
    }
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}
