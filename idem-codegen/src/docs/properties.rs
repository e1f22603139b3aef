//! The nine properties in plain words, and how to retry, for one operation's section.

use idem_contract::{
    Concurrency, Contract, Fingerprint, Property, Recovery, Retryable, TransportFailure,
};

use super::content::{
    OperationInfo, PropertyText, header_or_field, identity_header, key_shape, lookup_path,
    retryable_words,
};
use super::rich::Rich;
use crate::words;

pub(super) fn properties(c: &Contract, info: &OperationInfo) -> Vec<PropertyText> {
    let (in_header, key) = header_or_field(c);
    let key_scope = if in_header {
        Rich::new("Send an idempotency key in the ").code(&key).text(" header: ")
    } else {
        Rich::new("Put the idempotency key in the body member ").code(&key).text(": ")
    }
    .text(key_shape(c))
    .text(". Create it once per business intent, before the first attempt. Keys are kept per client and per operation: another client's identical key never sees your result. ")
    .then(match identity_header(info) {
        Some(name) => Rich::new("The server knows which client you are from the ").code(name).text(" header: send the same value on every attempt and to the status lookup; a request without a valid one is answered `401` (`client-identity-missing`) and nothing runs."),
        None => Rich::new("The server knows which client you are from your credentials: send the same ones on every attempt and to the status lookup; a request it cannot tell apart is answered `401` (`client-identity-missing`) and nothing runs."),
    });
    let fingerprint = match &c.fingerprint {
        Fingerprint::Body => Rich::new(
            "The whole body is significant: a retry sends the same JSON content (member order, whitespace and number spelling do not matter, and a member sent as `null` is the same as one left out). The same key with a different body, or on another resource's path (the path parameters are significant too), is refused with 422 and nothing runs.",
        ),
        Fingerprint::Fields(fields) => {
            let mut r = Rich::new("The significant fields are ");
            for (i, f) in fields.iter().enumerate() {
                if i > 0 {
                    r = r.text(if i + 1 == fields.len() { " and " } else { ", " });
                }
                r = r.code(f.as_str());
            }
            r.text(". The same key with different values in any of them, or on another resource's path (the path parameters are significant too), is refused with 422 and nothing runs; a retry sends the same values (a field sent as `null` is the same as one left out).")
        }
    };
    let fingerprint = if c.fingerprint_query.is_empty() {
        fingerprint
    } else {
        let mut r = fingerprint.text(" The query parameters ");
        for (i, q) in c.fingerprint_query.iter().enumerate() {
            if i > 0 {
                r = r.text(if i + 1 == c.fingerprint_query.len() {
                    " and "
                } else {
                    ", "
                });
            }
            r = r.code(q.as_str());
        }
        r.text(" are significant too: a retry sends them unchanged.")
    };
    let ttl = Rich::new(&format!(
        "The server remembers a key and its result for {} from the first attempt. Within that time a retry gets the stored result; after it, the same key starts a new operation.",
        words::duration(c.ttl)
    ));
    let deadline = Rich::new(&match c.deadline.per_attempt {
        Some(p) => format!(
            "Give the whole operation at most {}, all attempts and waits included. The server gives each attempt {}, then stops it and answers `503` (`attempt-timed-out`); give each attempt a timeout of {} plus a margin for the network, so that this answer reaches you.",
            words::duration(c.deadline.total),
            words::duration(p),
            words::duration(p)
        ),
        None => format!(
            "Give the whole operation at most {}, all attempts and waits included.",
            words::duration(c.deadline.total)
        ),
    });
    let attempts = Rich::new(&match c.max_attempts {
        1 => {
            "One request only: do not retry. After a lost answer, ask the status lookup.".to_owned()
        }
        n => format!(
            "At most {} for one business operation, the first included ({}).",
            words::count(u64::from(n), "request"),
            if n == 2 {
                "1 retry".to_owned()
            } else {
                format!("{} retries", n - 1)
            }
        ),
    });
    let retryable = Rich::new(&if c.retryable.is_empty() {
        "Nothing: every answer is final, and after a lost answer the status lookup tells the outcome.".to_owned()
    } else {
        format!(
            "Retry with the same key after: {}. Every other answer is final.",
            words::list(&retryable_words(c), "or")
        )
    });
    let concurrency = match c.concurrency {
        Concurrency::Conflict { retry_after } => Rich::new("A retry that arrives while an earlier attempt is still running gets `409 Conflict` with ")
            .code(format!("Retry-After: {}", retry_after.as_secs_ceil()))
            .text(": wait that long, then retry with the same key."),
        Concurrency::Accepted => Rich::new("A retry that arrives while an earlier attempt is still running gets `202 Accepted` with a `Location` header: the status lookup of the key. Ask it for the outcome instead of retrying."),
        Concurrency::Wait { limit } => Rich::new(&format!(
            "A retry that arrives while an earlier attempt is still running waits up to {} for it on the server, then gets its result, or `409 Conflict` with `Retry-After` if it is still running.",
            words::duration(limit)
        )),
    };
    let lookup = match lookup_path(c) {
        Some(path) => Rich::new("")
            .code(format!("GET {path}"))
            .text(" (your key in place of `{key}`, percent-encoded) tells the state of the operation with that key (`processing`, `completed`, `released` or `unknown`) and, once it is completed, its stored answer. Ask it when the attempts or the deadline run out without a final answer; its answers are listed below."),
        None => Rich::new("The service has a status lookup for this operation, but its contract does not publish the route: ask the API's provider for it."),
    };
    let recovery = match &c.recovery {
        Recovery::Reconcile { .. } => Rich::new("If an attempt stops between doing the work and recording its result, the outcome is unknown for a while: until the attempt's time is up, retries get `409` and the status lookup says `processing`. The first retry or lookup after that makes the server check its own records and settle it: the stored answer if the work was done, a fresh run if it was not. If the records cannot tell, the operation is parked as `unknown` for an operator: do not start it again with a new key."),
        Recovery::Manual { runbook } => Rich::new("If an attempt stops between doing the work and recording its result, the outcome is unknown: once the attempt's time is up, the operation is parked as `unknown` until an operator settles it by a runbook (")
            .url(runbook)
            .text("). Until then, retries get `409` and the status lookup says `processing`, then `unknown`: do not start the operation again with a new key."),
        Recovery::Resume => Rich::new("If an attempt stops before it has a final answer (a crash, a timeout, another system that did not answer), the operation resumes on your next retry with the same key: what the server already did in other systems (a charge at a payment provider) is not repeated, and a call whose outcome it could not learn is sent again under the same downstream key, which that system deduplicates. Until then, retries get `409` or `503` with `Retry-After` and the status lookup says `processing`: do not start the operation again with a new key."),
    };
    let texts = [
        key_scope,
        fingerprint,
        ttl,
        deadline,
        attempts,
        retryable,
        concurrency,
        lookup,
        recovery,
    ];
    Property::ALL
        .into_iter()
        .zip(texts)
        .map(|(p, text)| PropertyText {
            title: title(p),
            key: p.key(),
            text,
        })
        .collect()
}

/// The property's name for people.
fn title(p: Property) -> &'static str {
    match p {
        Property::KeyScope => "Idempotency key",
        Property::Fingerprint => "Significant content",
        Property::Ttl => "Key lifetime",
        Property::Deadline => "Deadline",
        Property::MaxAttempts => "Attempts",
        Property::Retryable => "Retry after",
        Property::Concurrency => "While an attempt is running",
        Property::StatusLookup => "Status lookup",
        Property::Recovery => "Unknown outcomes",
    }
}

pub(super) fn retry(c: &Contract) -> Vec<Rich> {
    let (in_header, key) = header_or_field(c);
    let timeout_retryable = c
        .retryable
        .contains(&Retryable::Transport(TransportFailure::Timeout));
    // The client waits a little longer than the server's per-attempt limit, so that the
    // server's `503 attempt-timed-out` reaches it instead of a timeout of its own.
    let per_attempt = c.deadline.per_attempt.map_or_else(
        || {
            format!(
                "Give each attempt a timeout, well under the deadline of {}.",
                words::duration(c.deadline.total)
            )
        },
        |p| {
            let p = words::duration(p);
            format!(
                "Give each attempt a timeout a little longer than the server's limit per attempt: {p}, plus a margin for the network. The server stops an attempt after {p} and answers `503` (`attempt-timed-out`); a client that gives up at exactly {p} never sees that answer."
            )
        },
    );
    let mut steps = vec![
        Rich::new(
            "Create one idempotency key per business intent (a UUID, for example) before the first attempt, and keep it with the intent, so that a restart of your client does not lose it.",
        ),
        if in_header {
            Rich::new("Send every attempt with the same key in ").code(&key).text(" and the same content. Never make a new key for a retry: that is how one intent becomes two operations.")
        } else {
            Rich::new("Send every attempt with the same key in the body member ").code(&key).text(" and the same content. Never make a new key for a retry: that is how one intent becomes two operations.")
        },
        Rich::new(&format!(
            "{per_attempt} {}",
            if timeout_retryable {
                "A timeout is retryable: retry with the same key."
            } else {
                "A timeout is not declared retryable: ask the status lookup before anything else."
            }
        )),
        Rich::new(
            "Between attempts, wait with exponential backoff and full jitter: a random time between zero and a base (such as 250 milliseconds) doubled after each attempt, capped at a few seconds.",
        ),
        Rich::new(
            "When an answer carries `Retry-After` (seconds or an HTTP date), wait at least that long, but never past the deadline.",
        ),
        Rich::new(&if c.retryable.is_empty() {
            "Every answer is final: a success, or an error that retrying cannot change.".to_owned()
        } else {
            format!(
                "Stop at once on a final answer: a success, or anything not in the retry list ({}).",
                words::list(&retryable_words(c), "or")
            )
        }),
        Rich::new(&format!(
            "Stop after {} or {} in total, whichever comes first.",
            words::count(u64::from(c.max_attempts), "attempt"),
            words::duration(c.deadline.total)
        )),
    ];
    steps.push(match lookup_path(c) {
        Some(path) => Rich::new("If the outcome is still unknown then, ask the status lookup ").code(format!("GET {path}")).text(" with the same key, and act on its answer (below)."),
        None => Rich::new("If the outcome is still unknown then, ask the status lookup with the same key, and act on its answer (below)."),
    });
    steps
}

/// When a new key is safe: the one rule, tied to `new_key_safe`, that every answer's
/// advice follows.
pub(super) fn new_key(c: &Contract) -> Rich {
    Rich::new(&format!(
        "A new key is for a new business intent only. For the same intent, keep the key while the server remembers it ({}): a retry with it never runs the operation twice, whatever happened before. The problem answers and the status lookup say in `new_key_safe` whether anything can have taken effect under the key. `true` (a request refused before it ran, the lookup's `404`, the state `released`): nothing did, so the intent may be sent again, with the same key. `false`: it may have taken effect, or still may: keep the key, retry with it or ask the status lookup, and never start the operation again with a new key.",
        words::duration(c.ttl)
    ))
}
