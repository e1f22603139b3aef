//! The compile-time rules that tie values together, as one pass that reports every
//! violation.
//!
//! The attribute parser ([`crate::parse`]) reports what is wrong with the syntax and with
//! single values (an unknown key, a malformed duration). Everything that can be judged on
//! the model alone lives here, so that a contract from the attribute and a contract from a
//! contracts file are held to the same rules.

use std::collections::HashSet;

use crate::{
    Concurrency, Contract, Fingerprint, KeySource, MAX_ATTEMPTS_CEILING, Property, Recovery,
    Retryable, key::is_field_name, lookup::is_lookup_path, status::PERMANENT_CLIENT_ERRORS,
};

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The tokens to blame.
    pub at: Location,
    /// The properties the rule reads: a parser that could not read one of them (it is
    /// missing, or its value was refused) leaves this violation out rather than report it
    /// against a stand-in value.
    pub involves: &'static [Property],
    /// What is wrong and what to write instead, in rustc's style (lowercase, no final
    /// period).
    pub message: String,
}

/// The part of a contract a [`Violation`] points at: the narrowest one the rule knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    /// The value of a property.
    Property(Property),
    /// The `index`th entry of `retryable`.
    Retryable(usize),
    /// The `index`th field of `fingerprint`.
    FingerprintField(usize),
    /// The per-attempt timeout of `deadline`.
    PerAttempt,
    /// The operation's name (the handler's name).
    Operation,
}

/// Checks every rule of the compile-time rules that can be judged on the model, and returns all the
/// violations, in the order of the properties.
pub fn check(contract: &Contract) -> Vec<Violation> {
    let mut out = Vec::new();
    check_operation(contract, &mut out);
    check_key_scope(contract, &mut out);
    check_fingerprint(contract, &mut out);
    check_ttl_covers_deadline(contract, &mut out);
    check_per_attempt_within_deadline(contract, &mut out);
    check_max_attempts(contract, &mut out);
    check_retryable(contract, &mut out);
    check_concurrency(contract, &mut out);
    check_status_lookup(contract, &mut out);
    check_recovery(contract, &mut out);
    out
}

fn push(out: &mut Vec<Violation>, at: Location, involves: &'static [Property], message: String) {
    out.push(Violation {
        at,
        involves,
        message,
    });
}

/// The operation name is the key's namespace and the default `operationId`.
fn check_operation(c: &Contract, out: &mut Vec<Violation>) {
    if c.operation.trim().is_empty() {
        push(
            out,
            Location::Operation,
            &[],
            "the operation name is empty: name the handler's operation".into(),
        );
    }
}

/// A header that carries the key must be a valid field name (RFC 9110 §5.1), or no client
/// can send it.
fn check_key_scope(c: &Contract, out: &mut Vec<Violation>) {
    if let KeySource::Header { name } = &c.key_scope.source
        && !is_field_name(name)
    {
        push(
            out,
            Location::Property(Property::KeyScope),
            &[Property::KeyScope],
            format!(
                "`{name}` is not a valid header name: use letters, digits and `-`, such as `Idempotency-Key`"
            ),
        );
    }
}

/// An empty fingerprint makes every request with one key look the same, so a client bug
/// (one key reused for another order) would be answered with the first order's result.
fn check_fingerprint(c: &Contract, out: &mut Vec<Violation>) {
    let Fingerprint::Fields(fields) = &c.fingerprint else {
        return;
    };
    if fields.is_empty() {
        push(out, Location::Property(Property::Fingerprint), &[Property::Fingerprint], "`fingerprint` is empty, so a reused key with other content would get another request's result: list the significant fields, such as `[customer_id, amount]`, or write `fingerprint = body`".into(),
        );
    }
    let mut seen = HashSet::new();
    for (index, field) in fields.iter().enumerate() {
        if !seen.insert(field.as_str()) {
            push(
                out,
                Location::FingerprintField(index),
                &[Property::Fingerprint],
                format!("`{field}` is listed twice in `fingerprint`: remove one"),
            );
        }
    }
}

/// The key must be remembered for as long as the client may retry; otherwise a retry
/// after the TTL runs the operation again.
fn check_ttl_covers_deadline(c: &Contract, out: &mut Vec<Violation>) {
    if c.ttl < c.deadline.total {
        push(
            out,
            Location::Property(Property::Ttl),
            &[Property::Ttl, Property::Deadline],
            format!(
                "`ttl` ({}) is shorter than `deadline` ({}): the key would be forgotten while the client may still retry, and that retry would run the operation again; write `ttl = \"{}\"` or longer (a day, `\"24h\"`, is common)",
                c.ttl, c.deadline.total, c.deadline.total
            ),
        );
    }
}

/// One attempt cannot outlast the whole operation.
fn check_per_attempt_within_deadline(c: &Contract, out: &mut Vec<Violation>) {
    if let Some(per_attempt) = c.deadline.per_attempt
        && per_attempt > c.deadline.total
    {
        push(
            out,
            Location::PerAttempt,
            &[Property::Deadline],
            format!(
                "the per-attempt timeout ({per_attempt}) is longer than the deadline ({}): one attempt cannot outlast the operation; write `per_attempt = \"{}\"` or less",
                c.deadline.total, c.deadline.total
            ),
        );
    }
}

/// At least the first attempt, and a ceiling that stops retry storms.
fn check_max_attempts(c: &Contract, out: &mut Vec<Violation>) {
    if c.max_attempts == 0 {
        push(out, Location::Property(Property::MaxAttempts), &[Property::MaxAttempts], "`max_attempts` counts the first attempt too, so it is at least 1: write `max_attempts = 1` for no retries".into(),
        );
    } else if c.max_attempts > MAX_ATTEMPTS_CEILING {
        push(
            out,
            Location::Property(Property::MaxAttempts),
            &[Property::MaxAttempts],
            format!(
                "`max_attempts = {}` is above the ceiling of {MAX_ATTEMPTS_CEILING}: that many retries turn one client's recovery into a retry storm; write {MAX_ATTEMPTS_CEILING} or fewer and ask the status lookup after the last one",
                c.max_attempts
            ),
        );
    }
}

/// Only outcomes that may change on a second try are retryable: never a 1xx (not an
/// outcome), a 2xx or 3xx (a success or a redirect), or a permanent client error
///.
fn check_retryable(c: &Contract, out: &mut Vec<Violation>) {
    let mut seen = HashSet::new();
    for (index, entry) in c.retryable.iter().enumerate() {
        let at = Location::Retryable(index);
        if !seen.insert(*entry) {
            push(
                out,
                at,
                &[Property::Retryable],
                format!("`{entry}` is listed twice in `retryable`: remove one"),
            );
            continue;
        }
        let Retryable::Status(status) = entry else {
            continue;
        };
        let code = status.as_u16();
        let reason = match status.reason() {
            "" => String::new(),
            reason => format!(" ({reason})"),
        };
        let message = if !status.is_valid() {
            format!("`{code}` is not an HTTP status code: statuses run from 100 to 599")
        } else if code < 200 {
            format!("`{code}`{reason} is an informational status, not an outcome: remove it")
        } else if code < 300 {
            format!(
                "`{code}`{reason} is a success: the operation is done and must not run again; remove it"
            )
        } else if code < 400 {
            format!("`{code}`{reason} is a redirect, a permanent answer: remove it")
        } else if PERMANENT_CLIENT_ERRORS.contains(&code) {
            format!(
                "`{code}`{reason} is a permanent answer: the same request gets the same answer, so retrying it cannot help; remove it (retryable statuses are such as 408, 409, 425, 429, 500, 502, 503 and 504)"
            )
        } else {
            continue;
        };
        push(out, at, &[Property::Retryable], message);
    }
}

/// A wait longer than the deadline, or a `Retry-After` past it, outlives the client's
/// budget; `accepted` points at the status lookup's route, so it needs one.
fn check_concurrency(c: &Contract, out: &mut Vec<Violation>) {
    let at = Location::Property(Property::Concurrency);
    let total = c.deadline.total;
    match c.concurrency {
        Concurrency::Wait { limit } if limit > total => push(
            out,
            at,
            &[Property::Concurrency, Property::Deadline],
            format!(
                "the wait of `concurrency = wait(\"{limit}\")` is longer than the deadline ({total}): the client would have given up; write `wait(\"{total}\")` or less"
            ),
        ),
        Concurrency::Conflict { retry_after } if retry_after >= total => push(
            out,
            at,
            &[Property::Concurrency, Property::Deadline],
            format!(
                "`retry_after` ({retry_after}) is not shorter than the deadline ({total}): the client could not retry in time; write a shorter `retry_after`"
            ),
        ),
        Concurrency::Accepted if c.status_lookup.path.is_none() => push(
            out,
            at,
            &[Property::Concurrency, Property::StatusLookup],
            format!(
                "`concurrency = accepted` answers 202 with a `Location` at the status lookup, but `status_lookup` gives no route: write `status_lookup = {}(path = \"/operations/{{key}}\")`",
                c.status_lookup.handler
            ),
        ),
        _ => {}
    }
}

/// A route the client can call, with the key in it.
fn check_status_lookup(c: &Contract, out: &mut Vec<Violation>) {
    let at = Location::Property(Property::StatusLookup);
    if c.status_lookup.handler.trim().is_empty() {
        push(
            out,
            at,
            &[Property::StatusLookup],
            "`status_lookup` names no handler: name the handler that answers by key".into(),
        );
    }
    if let Some(path) = &c.status_lookup.path
        && !is_lookup_path(path)
    {
        push(
            out,
            at,
            &[Property::StatusLookup],
            format!(
                "`{path}` is not a status lookup route: it starts with `/` and holds `{{key}}` once, such as `/orders/operations/{{key}}`"
            ),
        );
    }
}

/// A reconcile function needs a name, and a manual path needs a runbook.
fn check_recovery(c: &Contract, out: &mut Vec<Violation>) {
    let at = Location::Property(Property::Recovery);
    match &c.recovery {
        Recovery::Reconcile { function } if function.trim().is_empty() => {
            push(out, at, &[Property::Recovery], "`recovery` names no function: name a reconcile function, or write `manual(\"runbook URL\")`".into())
        }
        Recovery::Manual { runbook } if runbook.trim().is_empty() => push(out, at, &[Property::Recovery], "`manual(..)` needs the runbook an operator follows: write `manual(\"https://runbooks.example.com/orders\")`".into(),
        ),
        _ => {}
    }
}
