//! One business intent and its idempotency key.
//!
//! A key is made when the intent is (before the first send), sent unchanged on every
//! attempt of that intent, and never used for another: [`Intent`] is not `Clone`, and
//! [`crate::Client::execute`] takes it by value. An [`crate::Unknown`] outcome hands it
//! back, so that the same intent can be resumed (a later retry, or the status lookup)
//! with the same key; a new intent is a new value, with a new key.

use std::fmt;
use std::sync::Arc;

use http::HeaderValue;
use idem_contract::KeyScope;
use tokio::time::Instant;
use uuid::Uuid;

use crate::policy::RetryPolicy;

/// An idempotency key: a UUIDv7 (RFC 9562 §5.7) in its hyphenated form, which every key
/// format of a contract accepts (`any` and `uuid`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// A new key, unique to this intent.
    pub fn generate() -> IdempotencyKey {
        IdempotencyKey(Uuid::now_v7().to_string())
    }

    /// The key as sent (bare, without RFC 8941 quotes).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key header's value that the server reads back as this key
    /// (`KeyScope::header_key`): the key itself, or, for a key that starts with `"`, the
    /// RFC 8941 string that quotes it.
    pub(crate) fn header_value(&self, scope: &KeyScope) -> HeaderValue {
        // A key is visible ASCII, and quoting adds only `"` and `\`: always a valid value.
        HeaderValue::from_str(&scope.key_for_lookup(&self.0))
            .unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One business intent ("place this order"): its policy, its key, and what its attempts
/// so far have learnt.
#[derive(Debug)]
pub struct Intent {
    pub(crate) policy: Arc<RetryPolicy>,
    pub(crate) key: IdempotencyKey,
    /// When the first attempt was sent: the deadline counts from here.
    pub(crate) started: Option<Instant>,
    /// The attempts sent so far.
    pub(crate) attempts: u32,
    /// The server's operation id, once an answer carried one.
    pub(crate) operation_id: Option<String>,
}

impl Intent {
    /// A new intent under `policy`, with a new key.
    pub fn new(policy: impl Into<Arc<RetryPolicy>>) -> Intent {
        Intent {
            policy: policy.into(),
            key: IdempotencyKey::generate(),
            started: None,
            attempts: 0,
            operation_id: None,
        }
    }

    /// The key every attempt of this intent sends.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// The attempts sent so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The server's operation id, once an answer carried one.
    pub fn operation_id(&self) -> Option<&str> {
        self.operation_id.as_deref()
    }
}
