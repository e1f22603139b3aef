//! The problem answers (RFC 9457) that idem gives of its own, defined once.
//!
//! The runtime answers with these, and the published contract (the OpenAPI responses and
//! the consumer docs) describes them from the same table, so the two cannot drift apart.
//!
//! Each case has a stable `type` URI, `tag:idem.rs,2026:problem:<slug>`: a `tag:` URI
//! (RFC 4151), a stable name that needs no web server behind it (RFC 9457 §3.1.1 allows
//! non-dereferenceable type URIs). Bodies are `application/problem+json` with `type`,
//! `title`, `status` and `detail` (RFC 9457 §3.1) and, where the operation is known, the
//! extension members `operation_id`, `state` and `new_key_safe`: whether the
//! client may safely start a new operation with a new key, true only when this key cannot
//! have had an effect. Every answer carries the `Operation-Id` header.
//!
//! | slug | status | `state` | `new_key_safe` | `Retry-After` |
//! |---|---|---|---|---|
//! | `key-missing` | 400 | – | true | – |
//! | `key-malformed` | 400 | – | true | – |
//! | `body-malformed` | 400 | – | true | – |
//! | `body-too-large` | 413 | – | true | – |
//! | `request-timeout` | 408 | – | true | – |
//! | `client-identity-missing` | 401 | – | true | – |
//! | `fingerprint-mismatch` | 422 | the record's | true only when the record is `released` | – |
//! | `operation-in-progress` | 409 | `processing` | false | yes |
//! | `operation-outcome-unknown` | 409 | `unknown` | false | – |
//! | `attempt-timed-out` | 503 | `processing` | false | yes |
//! | `attempt-failed` | 503 | `processing` | false | yes |
//! | `attempt-rolled-back` | 503 | the record's | true only when the record is `released` | yes |
//! | `recovery-pending` | 503 | `processing` | false | yes |
//! | `step-outcome-unknown` | 503 | `processing` | false | yes |
//! | `store-unavailable` | 503 | – | false | yes |
//! | `store-full` | 503 | – | false | yes |
//! | `client-budget-exhausted` | 429 | – | true | yes |
//! | `operation-not-found` | 404 | – | true | – |
//! | `not-configured` | 500 | – | true | – |
//!
//! One more problem body is not an answer of idem's but stands in for the handler's: the
//! replay of a result whose body was larger than the server keeps
//! ([`RESULT_BODY_NOT_KEPT`]). It has the status and the replayed headers of the
//! original answer, `Idempotent-Replayed: true`, and a problem body of type
//! `tag:idem.rs,2026:problem:result-body-not-kept` that gives the original body's
//! length (`original_body_length`, bytes) and SHA-256 (`original_body_sha256`, lowercase
//! hex), so that a client that kept the first answer can tell it is the same.

/// The media type of problem bodies (RFC 9457 §3).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The prefix of every `type` URI.
pub const TYPE_PREFIX: &str = "tag:idem.rs,2026:problem:";

/// The `type` of the body that stands in for a replayed result's body when that body was
/// larger than the server keeps (see the [module docs](self)). The answer's status is the
/// original answer's, whatever it was.
pub const RESULT_BODY_NOT_KEPT: &str = "tag:idem.rs,2026:problem:result-body-not-kept";

macro_rules! problem_types {
    ($(
        $(#[$doc:meta])*
        $variant:ident => $slug:literal, $status:literal, $title:literal,
            state: $state:expr, new_key_safe: $safe:expr, retry_after: $retry:literal,
            meaning: $meaning:literal, action: $action:literal;
    )*) => {
        /// One case of the table in the [module docs](self).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum ProblemType {
            $($(#[$doc])* $variant,)*
        }

        impl ProblemType {
            /// Every case, in the order of the table.
            pub const ALL: &'static [ProblemType] = &[$(ProblemType::$variant,)*];

            /// The case's slug, such as `key-missing`.
            pub const fn slug(self) -> &'static str {
                match self { $(ProblemType::$variant => $slug,)* }
            }

            /// The stable `type` URI, such as `tag:idem.rs,2026:problem:key-missing`.
            pub const fn type_uri(self) -> &'static str {
                match self { $(ProblemType::$variant => concat!("tag:idem.rs,2026:problem:", $slug),)* }
            }

            /// The HTTP status code of the answer.
            pub const fn status(self) -> u16 {
                match self { $(ProblemType::$variant => $status,)* }
            }

            /// The `title`: a short summary that does not change from occurrence to
            /// occurrence (RFC 9457 §3.1.3).
            pub const fn title(self) -> &'static str {
                match self { $(ProblemType::$variant => $title,)* }
            }

            /// The `state` member the answer carries, when it is always the same.
            /// `fingerprint-mismatch` carries the record's state, whatever it is.
            pub const fn state(self) -> Option<&'static str> {
                match self { $(ProblemType::$variant => $state,)* }
            }

            /// The `new_key_safe` member, when it is always the same; `None` when it
            /// depends on the record (`fingerprint-mismatch`).
            pub const fn new_key_safe(self) -> Option<bool> {
                match self { $(ProblemType::$variant => $safe,)* }
            }

            /// Whether the answer carries `Retry-After`.
            pub const fn has_retry_after(self) -> bool {
                match self { $(ProblemType::$variant => $retry,)* }
            }

            /// What happened, in a client developer's words.
            pub const fn meaning(self) -> &'static str {
                match self { $(ProblemType::$variant => $meaning,)* }
            }

            /// What the client does next.
            pub const fn action(self) -> &'static str {
                match self { $(ProblemType::$variant => $action,)* }
            }
        }
    };
}

problem_types! {
    /// 400: the key is absent.
    KeyMissing => "key-missing", 400, "Idempotency key missing",
        state: None, new_key_safe: Some(true), retry_after: false,
        meaning: "the request has no idempotency key, and this operation requires one; nothing was done",
        action: "create one key for this business intent, keep it, and send the request with it";
    /// 400: the key breaks the key rules.
    KeyMalformed => "key-malformed", 400, "Idempotency key malformed",
        state: None, new_key_safe: Some(true), retry_after: false,
        meaning: "the key is empty, longer than 255 characters, has a character outside visible ASCII, was sent twice, or is not in the declared format; nothing was done",
        action: "fix how keys are made (a UUID always fits) and send the request with a valid key";
    /// 400: the body is not the JSON the contract needs.
    BodyMalformed => "body-malformed", 400, "Request body malformed",
        state: None, new_key_safe: Some(true), retry_after: false,
        meaning: "the body is not the JSON object the operation needs to read its significant fields or its key (not JSON, a member name given twice, or not an object); nothing was done",
        action: "fix the body; sending it again unchanged gets the same answer";
    /// 413: the body is larger than the server takes.
    BodyTooLarge => "body-too-large", 413, "Request body too large",
        state: None, new_key_safe: Some(true), retry_after: false,
        meaning: "the body is larger than the server accepts for this operation; nothing was done",
        action: "make the body smaller; sending it again unchanged gets the same answer";
    /// 408: the body did not arrive within the attempt's time.
    RequestTimeout => "request-timeout", 408, "Request body timed out",
        state: None, new_key_safe: Some(true), retry_after: false,
        meaning: "the request's body did not arrive within the operation's time for one attempt, so the server stopped reading it and closed the connection; nothing was done",
        action: "send the request again with the same key, over a connection that carries it in time";
    /// 401: no client identity.
    ClientIdentityMissing => "client-identity-missing", 401, "Client identity missing",
        state: None, new_key_safe: Some(true), retry_after: false,
        meaning: "the server could not tell which client is calling, and keys are kept per client; nothing was done",
        action: "send the request with the credentials that identify you";
    /// 422: same key, different significant content.
    FingerprintMismatch => "fingerprint-mismatch", 422, "Idempotency key reused with different content",
        state: None, new_key_safe: None, retry_after: false,
        meaning: "this key was already used for a request with different significant fields; this request was not run",
        action: "do not retry it: a retry sends exactly the first request's content, and a new business intent needs a new key";
    /// 409: another attempt with this key is running.
    OperationInProgress => "operation-in-progress", 409, "Operation in progress",
        state: Some("processing"), new_key_safe: Some(false), retry_after: true,
        meaning: "an earlier attempt with this key is still running",
        action: "wait for `Retry-After`, then send the same request with the same key";
    /// 409: the outcome is unknown and waits for an operator.
    OperationOutcomeUnknown => "operation-outcome-unknown", 409, "Operation outcome unknown",
        state: Some("unknown"), new_key_safe: Some(false), retry_after: false,
        meaning: "an earlier attempt stopped between its effect and the record of its outcome, and recovery could not decide; an operator resolves it (`detail` names the reason or the runbook)",
        action: "do not start it again with a new key; contact the API's provider with the operation id, or ask the status lookup later";
    /// 503: the attempt ran past its lease.
    AttemptTimedOut => "attempt-timed-out", 503, "Attempt timed out",
        state: Some("processing"), new_key_safe: Some(false), retry_after: true,
        meaning: "this attempt ran out of its time on the server and was stopped; it may or may not have taken effect",
        action: "wait for `Retry-After`, then retry with the same key: the server finds out what happened and answers with the outcome or the operation's state";
    /// 503: the attempt failed before its answer was recorded.
    AttemptFailed => "attempt-failed", 503, "Attempt failed",
        state: Some("processing"), new_key_safe: Some(false), retry_after: true,
        meaning: "this attempt failed on the server before its answer was recorded (it crashed, or answered with a server error); it may or may not have taken effect",
        action: "wait for `Retry-After`, then retry with the same key: the server finds out what happened before anything runs again";
    /// 503: the attempt failed and everything it wrote was rolled back (the
    /// transactional mode).
    AttemptRolledBack => "attempt-rolled-back", 503, "Attempt rolled back",
        state: None, new_key_safe: None, retry_after: true,
        meaning: "this attempt did not finish (it failed, ran out of time, or lost its lease to another attempt), and everything it wrote was rolled back: it took no effect",
        action: "wait for `Retry-After`, then retry with the same key: the operation runs again";
    /// 503: recovery could not decide yet.
    RecoveryPending => "recovery-pending", 503, "Recovery pending",
        state: Some("processing"), new_key_safe: Some(false), retry_after: true,
        meaning: "an earlier attempt with this key ended without an outcome, and the server could not find out yet whether it took effect (its business data could not be read)",
        action: "wait for `Retry-After`, then retry with the same key or ask the status lookup: the server asks again";
    /// 503: a call to another system (a step of the journal) has an unknown outcome; the
    /// operation keeps its key and resumes on the next retry.
    StepOutcomeUnknown => "step-outcome-unknown", 503, "Step outcome unknown",
        state: Some("processing"), new_key_safe: Some(false), retry_after: true,
        meaning: "this attempt called another system (such as a payment provider) and could not learn or record the outcome of that call; the operation keeps this key, and the call is sent again under the same downstream key, which the other system deduplicates",
        action: "wait for `Retry-After`, then retry with the same key: the operation resumes where it stopped, and does not repeat what is done";
    /// 503: the store failed; nothing ran.
    StoreUnavailable => "store-unavailable", 503, "Idempotency store unavailable",
        state: None, new_key_safe: Some(false), retry_after: true,
        meaning: "the server cannot reach the store that remembers keys, so it did not run this request (an earlier attempt may have run)",
        action: "wait for `Retry-After`, then retry with the same key";
    /// 503: the store is full; nothing ran.
    StoreFull => "store-full", 503, "Idempotency store full",
        state: None, new_key_safe: Some(false), retry_after: true,
        meaning: "the store that remembers keys answered, but it is full and refused to record this request's state: it did not run, or it ran and its outcome is not recorded yet (an earlier attempt may have run too)",
        action: "wait for `Retry-After`, then retry with the same key; the API's provider must make room in the store";
    /// 429: the client holds as many keys, or stored bytes, as the server keeps for one
    /// client.
    ClientBudgetExhausted => "client-budget-exhausted", 429, "Client budget exhausted",
        state: None, new_key_safe: Some(true), retry_after: true,
        meaning: "you hold as many live keys, or as many bytes of stored answers, as the server keeps for one client, so this new key was refused before anything ran; retries of keys you already hold are still answered",
        action: "wait for `Retry-After` (when your oldest key expires), then send the same request with the same key; send fewer new keys (do not make a new key for a retry), or ask the API's provider for a larger budget";
    /// 404: the status lookup does not know the key.
    OperationNotFound => "operation-not-found", 404, "Operation not found",
        state: None, new_key_safe: Some(true), retry_after: false,
        meaning: "the status lookup knows no operation with this key: no attempt arrived, or the key's time to live has passed",
        action: "within the deadline, send the request again with the same key";
    /// 500: the router lacks the idem layer.
    NotConfigured => "not-configured", 500, "Idempotency not configured",
        state: None, new_key_safe: Some(true), retry_after: false,
        meaning: "the server is not set up to enforce this operation's contract, so it refused to run it",
        action: "stop, and report it to the API's provider";
}

impl ProblemType {
    /// The case whose slug is `slug`.
    pub fn from_slug(slug: &str) -> Option<ProblemType> {
        ProblemType::ALL.iter().copied().find(|p| p.slug() == slug)
    }

    /// The cases answered with `status`.
    pub fn with_status(status: u16) -> impl Iterator<Item = ProblemType> {
        ProblemType::ALL
            .iter()
            .copied()
            .filter(move |p| p.status() == status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_and_uris_are_stable_and_distinct() {
        let mut slugs: Vec<_> = ProblemType::ALL.iter().map(|p| p.slug()).collect();
        slugs.sort_unstable();
        slugs.dedup();
        assert_eq!(slugs.len(), ProblemType::ALL.len());
        for p in ProblemType::ALL {
            assert_eq!(p.type_uri(), format!("{TYPE_PREFIX}{}", p.slug()));
            assert_eq!(ProblemType::from_slug(p.slug()), Some(*p));
        }
        assert_eq!(
            ProblemType::KeyMissing.type_uri(),
            "tag:idem.rs,2026:problem:key-missing"
        );
        let not_kept = RESULT_BODY_NOT_KEPT.strip_prefix(TYPE_PREFIX).unwrap();
        assert_eq!(ProblemType::from_slug(not_kept), None, "a slug of its own");
    }
}
