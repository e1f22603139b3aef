//! One business intent and its idempotency key.
//!
//! A key is made when the intent is (before the first send), sent unchanged on every
//! attempt of that intent, and never used for another: [`Intent`] is not `Clone`, and
//! [`crate::Client::execute`] takes it by value. An [`crate::Unknown`] outcome hands it
//! back, so that the same intent can be resumed under the same key; a key saved earlier
//! (by a job that restarted) makes the intent again with [`Intent::resume`]. A new intent
//! is a new value, with a new key.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use http::HeaderValue;
use idem_contract::{KeyError, KeyScope};
use uuid::Uuid;

use crate::policy::RetryPolicy;

/// An idempotency key: 1 to 255 visible ASCII characters (`!` to `~`), the rules the
/// server reads keys by. [`IdempotencyKey::generate`] makes a UUIDv7 (RFC 9562 §5.7) in
/// its hyphenated form, which every key format of a contract accepts (`any` and `uuid`);
/// [`IdempotencyKey::parse`] reads one saved earlier.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// A new key, unique to this intent.
    pub fn generate() -> IdempotencyKey {
        IdempotencyKey(Uuid::now_v7().to_string())
    }

    /// The key `key`, as [`IdempotencyKey::as_str`] gave it (a key saved before a
    /// restart, a client reference the caller picked), checked by the rules every key
    /// follows on the server (`idem_contract::KeyScope::validate_key`): 1 to 255 bytes,
    /// every one visible ASCII (`!` to `~`; no space, tab, control or non-ASCII
    /// character). Nothing is trimmed. A contract's own key format (`uuid`) is checked
    /// when the key meets its policy, by [`Intent::resume`].
    ///
    /// The text is the key itself: `"abc"` with its quotes is a five-character key
    /// (sent as the RFC 8941 string `"\"abc\""` in a header, so that the server reads
    /// the same five characters), not the key `abc`.
    ///
    /// ```
    /// use idem_client::IdempotencyKey;
    ///
    /// let key = IdempotencyKey::parse("order-7")?;
    /// assert_eq!(key.as_str(), "order-7");
    /// assert!(IdempotencyKey::parse("").is_err());
    /// assert!(IdempotencyKey::parse("order 7").is_err());
    /// assert!(IdempotencyKey::parse(&"k".repeat(256)).is_err());
    /// # Ok::<(), idem_client::KeyError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// The first rule `key` breaks, in this order: [`KeyError::Empty`],
    /// [`KeyError::TooLong`] (over 255 bytes), [`KeyError::NotVisibleAscii`] (with the
    /// byte offset).
    pub fn parse(key: &str) -> Result<IdempotencyKey, KeyError> {
        KeyScope::CLIENT.validate_key(key.as_bytes())?;
        Ok(IdempotencyKey(key.to_owned()))
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

impl FromStr for IdempotencyKey {
    type Err = KeyError;

    /// [`IdempotencyKey::parse`].
    fn from_str(key: &str) -> Result<IdempotencyKey, KeyError> {
        IdempotencyKey::parse(key)
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
    /// The requests sent under this value, every window included.
    pub(crate) attempts: u32,
    /// Whether the key may have reached the server already: the next window asks the
    /// status lookup before it sends.
    pub(crate) resumed: bool,
    /// The server's operation id, once an answer carried one.
    pub(crate) operation_id: Option<String>,
}

impl Intent {
    /// A new intent under `policy`, with a new key ([`IdempotencyKey::generate`]).
    pub fn new(policy: impl Into<Arc<RetryPolicy>>) -> Intent {
        Intent {
            policy: policy.into(),
            key: IdempotencyKey::generate(),
            attempts: 0,
            resumed: false,
            operation_id: None,
        }
    }

    /// The intent under `key`, a key that may have been sent before: one saved by a job
    /// before it restarted, or a client reference the caller picked. Executing it
    /// resumes the operation under that key, exactly as executing the intent an
    /// [`crate::Unknown`] gave back does:
    ///
    /// - **A new window.** [`crate::Client::execute`] sends at most the policy's
    ///   `max_attempts` requests, within its deadline counted from the start of that
    ///   `execute` (whatever earlier windows spent); the first request needs no retry
    ///   budget, the later ones do, as in any window.
    /// - **The status lookup first**, when the policy has one (one `GET`, with the
    ///   call's headers, within the window and [`crate::LOOKUP_TIMEOUT`]):
    ///   - `completed` with its stored answer: that answer is the outcome
    ///     ([`crate::Outcome::Completed`] with `from_lookup`, `replayed`, `attempts`
    ///     0), and the command is **not** sent again;
    ///   - `unknown`: the server itself does not know; nothing is sent, and the outcome
    ///     is [`crate::Outcome::Unknown`] with
    ///     [`crate::StopReason::OutcomeUnknownOnServer`] and `attempts` 0;
    ///   - `processing` (another attempt holds the key): the first request waits for
    ///     the lookup's `retry_after` when the policy obeys `Retry-After`, or the
    ///     window stops at once with [`crate::StopReason::RetryAfterBeyondDeadline`]
    ///     if that is longer than the window;
    ///   - `released`, not found (404), another answer or none: the request is sent.
    /// - **The same key** on every request, where the contract puts it.
    ///
    /// What it guarantees: no window sends the operation under another key, so the
    /// server runs it at most once while it remembers the key (the contract's `ttl`,
    /// from the first request), and a resume of a completed operation returns its
    /// stored answer. What it does not: after the `ttl` the server has forgotten the key,
    /// and a resumed request is a new operation; the call must be the same request (a
    /// different body under the same key is the server's fingerprint mismatch, a
    /// [`crate::Outcome::Failed`]); and an answer read from the lookup has the headers
    /// and JSON body the lookup shows, not necessarily every byte of the original.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_client::{IdempotencyKey, Intent, RetryPolicy};
    ///
    /// let policy = RetryPolicy::builder("create_order")
    ///     .max_attempts(3)
    ///     .deadline(Duration::from_secs(30))
    ///     .status_lookup("/orders/operations/{key}")
    ///     .build()?;
    /// // What `intent.key().as_str()` gave before the restart.
    /// let saved = "0191f6a4-6c1e-7c3a-9d5e-1b2c3d4e5f60";
    /// let intent = Intent::resume(policy, IdempotencyKey::parse(saved)?)?;
    /// assert_eq!(intent.key().as_str(), saved);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`KeyError::Format`] when the contract declares a key format (`uuid`) and `key`
    /// is not in it: the server would refuse it (400 `key-malformed`).
    pub fn resume(
        policy: impl Into<Arc<RetryPolicy>>,
        key: IdempotencyKey,
    ) -> Result<Intent, KeyError> {
        let policy = policy.into();
        policy.key_scope().validate_key(key.as_str().as_bytes())?;
        Ok(Intent {
            policy,
            key,
            attempts: 0,
            resumed: true,
            operation_id: None,
        })
    }

    /// The key every attempt of this intent sends.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// The requests sent under this intent so far, every window included (an intent
    /// made by [`Intent::resume`] starts at 0: what was sent before the restart is not
    /// known here).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The server's operation id, once an answer (or the status lookup) carried one.
    pub fn operation_id(&self) -> Option<&str> {
        self.operation_id.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn every_visible_ascii_key_up_to_255_bytes_parses_as_it_is(key in "[!-~]{1,255}") {
            let parsed = IdempotencyKey::parse(&key).unwrap();
            prop_assert_eq!(parsed.as_str(), key.as_str());
        }

        #[test]
        fn any_other_character_is_refused(
            prefix in "[!-~]{0,10}",
            bad in "[ \t\r\n\u{0}\u{7f}\u{80}-\u{10ffff}]",
            suffix in "[!-~]{0,10}",
        ) {
            let key = format!("{prefix}{bad}{suffix}");
            prop_assert_eq!(
                IdempotencyKey::parse(&key),
                Err(KeyError::NotVisibleAscii { at: prefix.len() })
            );
        }
    }

    #[test]
    fn bad_keys_say_which_rule_they_break() {
        assert_eq!(IdempotencyKey::parse(""), Err(KeyError::Empty));
        assert_eq!(
            IdempotencyKey::parse(&"k".repeat(256)),
            Err(KeyError::TooLong { len: 256 })
        );
        assert!(IdempotencyKey::parse(&"k".repeat(255)).is_ok());
        assert_eq!(
            IdempotencyKey::parse("café"),
            Err(KeyError::NotVisibleAscii { at: 3 })
        );
        assert_eq!(
            IdempotencyKey::parse(" order-7"),
            Err(KeyError::NotVisibleAscii { at: 0 }),
            "nothing is trimmed"
        );
        assert_eq!(
            "order-7".parse::<IdempotencyKey>().unwrap().as_str(),
            "order-7"
        );
        let generated = IdempotencyKey::generate();
        assert_eq!(IdempotencyKey::parse(generated.as_str()), Ok(generated));
    }

    #[test]
    fn resume_checks_the_contracts_key_format() {
        let uuid = RetryPolicy::builder("create_order")
            .uuid_keys()
            .max_attempts(2)
            .deadline(Duration::from_secs(10))
            .build()
            .unwrap();
        let key = IdempotencyKey::parse("order-7").unwrap();
        assert_eq!(
            Intent::resume(uuid.clone(), key.clone()).unwrap_err(),
            KeyError::Format {
                expected: idem_contract::KeyFormat::Uuid
            }
        );
        let saved = IdempotencyKey::parse("0191f6a4-6c1e-7c3a-9d5e-1b2c3d4e5f60").unwrap();
        let intent = Intent::resume(uuid, saved.clone()).unwrap();
        assert_eq!(intent.key(), &saved);
        assert_eq!(intent.attempts(), 0);
        assert!(intent.resumed, "the next window asks the lookup first");
        assert!(!Intent::new(intent.policy().clone()).resumed);
    }
}
