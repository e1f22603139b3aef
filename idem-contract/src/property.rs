//! The nine properties: their attribute keys and what each one answers, defined once.
//!
//! Every list of properties that idem prints (the "missing properties" error, the
//! "expected one of" list, the "did you mean" suggestion, the consumer docs) comes from
//! [`Property::ALL`], so none of them can go stale. They are the properties of the idempotency contract; their names are fixed.

use std::fmt;

/// One of the nine properties of a contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Property {
    /// `key_scope`: where the key comes from and which namespace it lives in.
    KeyScope,
    /// `fingerprint`: which request fields are significant.
    Fingerprint,
    /// `ttl`: how long the server remembers a key and its result.
    Ttl,
    /// `deadline`: the total time budget of the operation over all attempts.
    Deadline,
    /// `max_attempts`: how many physical requests one business operation may cost.
    MaxAttempts,
    /// `retryable`: which outcomes let the client try again with the same key.
    Retryable,
    /// `concurrency`: what a duplicate gets while the first attempt is still running.
    Concurrency,
    /// `status_lookup`: the handler that tells the outcome of an operation by its key.
    StatusLookup,
    /// `recovery`: what happens to an operation whose outcome is unknown.
    Recovery,
}

impl Property {
    /// The nine properties, in their documented order.
    pub const ALL: [Property; 9] = [
        Property::KeyScope,
        Property::Fingerprint,
        Property::Ttl,
        Property::Deadline,
        Property::MaxAttempts,
        Property::Retryable,
        Property::Concurrency,
        Property::StatusLookup,
        Property::Recovery,
    ];

    /// The attribute key, exactly as written in `#[idem::contract(..)]`.
    pub const fn key(self) -> &'static str {
        match self {
            Property::KeyScope => "key_scope",
            Property::Fingerprint => "fingerprint",
            Property::Ttl => "ttl",
            Property::Deadline => "deadline",
            Property::MaxAttempts => "max_attempts",
            Property::Retryable => "retryable",
            Property::Concurrency => "concurrency",
            Property::StatusLookup => "status_lookup",
            Property::Recovery => "recovery",
        }
    }

    /// The question the property answers, in one line.
    pub const fn answers(self) -> &'static str {
        match self {
            Property::KeyScope => {
                "where the client puts its idempotency key and whose namespace it lives in"
            }
            Property::Fingerprint => {
                "which request fields are significant, so that one key with other content is refused"
            }
            Property::Ttl => {
                "how long the server remembers a key and its result; it must cover every retry"
            }
            Property::Deadline => "the total time budget of the operation over all attempts",
            Property::MaxAttempts => {
                "how many physical requests one business operation may cost, the first included"
            }
            Property::Retryable => {
                "which statuses and transport failures let the client try again with the same key"
            }
            Property::Concurrency => {
                "what a duplicate gets while the first attempt is still running"
            }
            Property::StatusLookup => {
                "the handler a client calls to learn the outcome by its key after an answer was lost"
            }
            Property::Recovery => {
                "what decides an operation whose outcome is unknown: a reconcile function or a manual runbook"
            }
        }
    }

    /// A value to copy, shown in the "missing property" error.
    pub const fn example(self) -> &'static str {
        match self {
            Property::KeyScope => "key_scope = client",
            Property::Fingerprint => "fingerprint = [customer_id, amount]",
            Property::Ttl => "ttl = \"24h\"",
            Property::Deadline => "deadline = \"30s\"",
            Property::MaxAttempts => "max_attempts = 4",
            Property::Retryable => "retryable = [429, 503, timeout]",
            Property::Concurrency => "concurrency = conflict",
            Property::StatusLookup => "status_lookup = operation_status",
            Property::Recovery => "recovery = reconcile",
        }
    }

    /// The options written inside this property's value, each with what to write:
    /// `(option, example)`. For the error when one is written as a property of its own.
    pub const fn options(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Property::KeyScope => &[
                ("header", "key_scope = client(header = \"Idempotency-Key\")"),
                ("format", "key_scope = client(format = uuid)"),
            ],
            Property::Deadline => &[("per_attempt", "deadline = (\"30s\", per_attempt = \"5s\")")],
            Property::Concurrency => &[(
                "retry_after",
                "concurrency = conflict(retry_after = \"2s\")",
            )],
            Property::StatusLookup => &[(
                "path",
                "status_lookup = operation_status(path = \"/operations/{key}\")",
            )],
            Property::Recovery => &[(
                "runbook",
                "recovery = manual(\"https://runbooks.example.com/orders\")",
            )],
            Property::Fingerprint | Property::Ttl | Property::MaxAttempts | Property::Retryable => {
                &[]
            }
        }
    }

    /// The position of the property in [`Property::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The property whose attribute key is `key`, if any.
    pub fn from_key(key: &str) -> Option<Property> {
        Property::ALL.into_iter().find(|p| p.key() == key)
    }
}

impl fmt::Display for Property {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_are_unique() {
        for p in Property::ALL {
            assert_eq!(Property::from_key(p.key()), Some(p));
        }
        let mut keys: Vec<_> = Property::ALL.iter().map(|p| p.key()).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), 9);
        assert_eq!(Property::from_key("retryble"), None);
    }

    #[test]
    fn index_is_the_position_in_all() {
        for (index, p) in Property::ALL.into_iter().enumerate() {
            assert_eq!(p.index(), index);
        }
    }
}
