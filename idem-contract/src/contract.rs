//! The contract: nine properties on one operation.

use std::borrow::Cow;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    Concurrency, Deadline, Duration, FieldPath, Fingerprint, KeyScope, Recovery, Retryable,
    StatusLookup,
};

fn no_query(query: &[FieldPath]) -> bool {
    query.is_empty()
}

/// The most attempts a contract may allow: more turns one client's recovery into a retry
/// storm. Ten attempts with exponential backoff already span minutes.
pub const MAX_ATTEMPTS_CEILING: u32 = 10;

/// The failure contract of one critical command: the nine properties and the
/// name of the operation they belong to.
///
/// The macro turns `#[idem::contract(..)]` into a `const` of this type next to the handler
/// (`create_order::CONTRACT`); the `idem` command reads the same attribute from source
/// files, or contracts serialised with serde (the contracts file of `idem export`). It is
/// published as the OpenAPI extension `x-idempotency` in the form of
/// [`crate::extension::Extension`], which leaves out the names of the handler, the
/// status lookup and the reconcile function.
///
/// A value of this type is not necessarily valid: [`crate::check()`](fn@crate::check) reports every rule it
/// breaks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Contract {
    /// The operation's name: the handler function's name, such as `create_order`. Keys
    /// live in the namespace of one operation; the name is also the default OpenAPI
    /// `operationId` to merge into.
    pub operation: Cow<'static, str>,
    /// Property 1: where the key comes from and whose namespace it lives in.
    pub key_scope: KeyScope,
    /// Property 2: the significant content of a request's body (the request's path
    /// parameters are always significant too).
    pub fingerprint: Fingerprint,
    /// Property 2, continued: the query parameters that are significant too, by name
    /// (`fingerprint = ([amount], query = [expand])`); none by default. Left out of the
    /// serialised form when empty.
    #[serde(default, skip_serializing_if = "no_query")]
    pub fingerprint_query: Cow<'static, [FieldPath]>,
    /// Property 3: how long the server remembers a key and its result, counted from the
    /// first attempt. At least the deadline.
    pub ttl: Duration,
    /// Property 4: the time budget of the operation.
    pub deadline: Deadline,
    /// Property 5: the physical requests one business operation may cost, the first
    /// included; 1 to [`MAX_ATTEMPTS_CEILING`].
    pub max_attempts: u32,
    /// Property 6: the outcomes after which the client may try again with the same key.
    /// The server releases the key when the handler answers one of these statuses.
    pub retryable: Cow<'static, [Retryable]>,
    /// Property 7: the answer to a duplicate while the first attempt runs.
    pub concurrency: Concurrency,
    /// Property 8: how a client learns the outcome by its key.
    pub status_lookup: StatusLookup,
    /// Property 9: what decides an operation whose outcome is unknown.
    pub recovery: Recovery,
}

impl Contract {
    /// A complete, valid contract ([`crate::check()`](fn@crate::check) finds nothing) that
    /// stands in where a real one is missing: in the macro's expansion of an attribute
    /// with errors (the compile fails anyway, so it is never enforced), and in the parser,
    /// for the properties that are missing or were refused, so that the rules of the
    /// others still run.
    pub const PLACEHOLDER: Contract = Contract {
        operation: Cow::Borrowed("__idem_placeholder"),
        key_scope: KeyScope::CLIENT,
        fingerprint: Fingerprint::Body,
        fingerprint_query: Cow::Borrowed(&[]),
        ttl: Duration::from_millis(86_400_000),
        deadline: Deadline {
            total: Duration::from_millis(30_000),
            per_attempt: None,
        },
        max_attempts: 1,
        retryable: Cow::Borrowed(&[]),
        concurrency: Concurrency::Conflict {
            retry_after: crate::DEFAULT_CONFLICT_RETRY_AFTER,
        },
        status_lookup: StatusLookup {
            handler: Cow::Borrowed("__idem_placeholder"),
            path: None,
        },
        recovery: Recovery::Manual {
            runbook: Cow::Borrowed("__idem_placeholder"),
        },
    };

    /// Whether the handler's answer `status` releases the key so that a retry runs again:
    /// the status is declared in `retryable`.
    pub fn is_retryable_status(&self, status: u16) -> bool {
        self.retryable
            .iter()
            .any(|r| matches!(r, Retryable::Status(s) if s.as_u16() == status))
    }

    /// How long one attempt may hold the key before its outcome counts as unknown: the
    /// per-attempt timeout, or else the deadline.
    pub const fn lease(&self) -> Duration {
        self.deadline.attempt_timeout()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_placeholder_is_valid() {
        assert_eq!(crate::check(&Contract::PLACEHOLDER), []);
    }
}
