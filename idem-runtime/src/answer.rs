//! The answers idem gives instead of the handler's (see [`crate::problem`]).

use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::{HeaderValue, StatusCode, header};
use idem_contract::{Contract, KeyError};

use crate::header::OPERATION_ID;
use crate::problem::{Problem, ProblemType};
use crate::store::{OperationState, OverBudget, Record, RecordKey, StoreError, UnixMillis};
use crate::telemetry::{self, Outcome};
use crate::{Idem, OperationId};

/// Sets the `Operation-Id` header.
pub(crate) fn with_operation_id(mut response: Response, id: OperationId) -> Response {
    response
        .headers_mut()
        .insert(OPERATION_ID, id.header_value());
    response
}

/// Sets a fresh `Operation-Id` (for answers that register nothing), unless one is set.
pub(crate) fn with_fresh_id(response: Response) -> Response {
    if response.headers().contains_key(OPERATION_ID) {
        return response;
    }
    with_operation_id(response, OperationId::new())
}

/// Whether the first request without an idem handle has been logged (once per process:
/// every request to the route has the same cause).
static NO_HANDLE_LOGGED: AtomicBool = AtomicBool::new(false);

/// Whether the first `Tx` without a transactional store has been logged (once per process).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
static NO_TRANSACTIONAL_STORE_LOGGED: AtomicBool = AtomicBool::new(false);

/// 500 `not-configured`: the request has no idem handle (the router has no idem layer).
/// The first one in the process logs an error that names the fix: nothing else would tell
/// the service's operator.
pub(crate) fn not_configured(parts: &Parts) -> Problem {
    if !NO_HANDLE_LOGGED.swap(true, Ordering::Relaxed) {
        tracing::error!(
            method = %parts.method,
            path = parts.uri.path(),
            "idem: a contracted handler or status lookup was called without an idem handle, and answers 500 `not-configured`: add `.layer(idem.layer())` to the router that serves it (logged once)"
        );
    }
    Problem::new(
        ProblemType::NotConfigured,
        "the request has no idem handle: add `.layer(idem.layer())` to the router that serves this route",
    )
    .with_operation_id(OperationId::new())
}

/// 500 `not-configured`: the handler takes the transaction of `database`, and the handle
/// has no transactional store of it (it was made with `Idem::new`, or over another
/// database). The first one in the process logs an error that names the fix.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn no_transactional_store(parts: &Parts, database: &str) -> Problem {
    let fix = format!(
        "build the handle with `Idem::transactional(store, ..)` over the {database} store that holds the business data (`Idem::check_handlers` finds this at start-up)"
    );
    if !NO_TRANSACTIONAL_STORE_LOGGED.swap(true, Ordering::Relaxed) {
        tracing::error!(
            method = %parts.method,
            path = parts.uri.path(),
            "idem: a handler takes the transaction of {database}, but the idem handle has no transactional store of it, and answers 500 `not-configured`: {fix} (logged once)"
        );
    }
    Problem::new(
        ProblemType::NotConfigured,
        format!(
            "the handler takes the transaction of {database}, but the idem handle has no transactional store of that database: {fix}"
        ),
    )
    .with_operation_id(OperationId::new())
}

/// 500 `not-configured`: another contracted handler has the same operation name, so the
/// two would share every key.
pub(crate) fn operation_name_taken(contract: &Contract, other: &str) -> Problem {
    tracing::error!(
        operation = %contract.operation,
        other,
        "idem: two contracted handlers have one operation name; rename one of them"
    );
    Problem::new(
        ProblemType::NotConfigured,
        format!(
            "two contracted handlers are named `{}` (the other is `{other}`): they would share every idempotency key, so this one is refused; rename one of the handlers",
            contract.operation
        ),
    )
    .with_operation_id(OperationId::new())
}

/// 500 `not-configured`: the contract names body fields that the body type does not have
/// under any spelling serde reads (see `crate::serde_names`).
pub(crate) fn misconfigured(operation: &str, why: &str) -> Problem {
    tracing::error!(
        operation,
        why,
        "idem: the contract does not fit the body type"
    );
    Problem::new(ProblemType::NotConfigured, why).with_operation_id(OperationId::new())
}

/// 400 `key-missing`.
pub(crate) fn key_missing(contract: &Contract) -> Problem {
    let place = match contract.key_scope.header() {
        Some(name) => format!("the `{name}` header"),
        None => "the key member of the JSON body".to_owned(),
    };
    Problem::new(
        ProblemType::KeyMissing,
        format!(
            "`{}` needs an idempotency key in {place}: make one key per business intent and send it unchanged on every retry",
            contract.operation
        ),
    )
    .with_operation_id(OperationId::new())
}

/// 400 `key-malformed`.
pub(crate) fn key_malformed(error: &KeyError) -> Problem {
    Problem::new(ProblemType::KeyMalformed, error.to_string()).with_operation_id(OperationId::new())
}

/// 400 `key-malformed` for a key sent in two headers, or a body key that is not a string.
pub(crate) fn key_malformed_because(why: &str) -> Problem {
    Problem::new(ProblemType::KeyMalformed, why).with_operation_id(OperationId::new())
}

/// 400 `body-malformed`.
pub(crate) fn body_malformed(why: impl std::fmt::Display) -> Problem {
    Problem::new(ProblemType::BodyMalformed, why.to_string()).with_operation_id(OperationId::new())
}

/// The body could not be read: 413 `body-too-large` past axum's `DefaultBodyLimit`, else
/// 400 `body-malformed` (a body cut short, a broken chunked encoding).
pub(crate) fn body_unreadable(error: &axum::Error) -> Problem {
    let first: &(dyn std::error::Error + 'static) = error;
    let too_large = std::iter::successors(Some(first), |e| e.source())
        .any(|e| e.is::<http_body_util::LengthLimitError>());
    if too_large {
        return Problem::new(
            ProblemType::BodyTooLarge,
            "the request body is larger than this server accepts (axum's `DefaultBodyLimit`); nothing was done",
        )
        .with_operation_id(OperationId::new());
    }
    body_malformed(format_args!("the request body could not be read: {error}"))
}

/// 408 `request-timeout`: the body did not arrive within `limit`, the attempt's time.
pub(crate) fn body_timed_out(limit: std::time::Duration) -> Problem {
    Problem::new(
        ProblemType::RequestTimeout,
        format!(
            "the request body did not arrive within {} ms, this operation's time for one attempt; nothing was done, and the connection is closed",
            limit.as_millis()
        ),
    )
    .with_operation_id(OperationId::new())
}

/// 422 `fingerprint-mismatch`: the record is left as it is.
///
/// A new key is safe only for a released record whose operation made no call to another
/// system: never under `recovery = resume`, whose journaled steps outlive the release.
pub(crate) fn fingerprint_mismatch(contract: &Contract, record: &Record) -> Problem {
    let state = record.state.kind();
    let resumes = matches!(contract.recovery, idem_contract::Recovery::Resume);
    Problem::new(
        ProblemType::FingerprintMismatch,
        "this idempotency key was used for a request with different significant content; \
         nothing was run: send the original content with this key, or use a new key for a new operation",
    )
    .with_operation_id(record.operation_id)
    .with_state(state)
    .with_new_key_safe(state == OperationState::Released && !resumes)
}

/// 409 `operation-in-progress`.
pub(crate) fn in_progress(id: OperationId, retry_after_secs: u64) -> Problem {
    Problem::new(
        ProblemType::OperationInProgress,
        format!(
            "an earlier attempt with this key holds it until its lease ends (it may still be running, or its process may have died); retry with the same key after {} s, or ask the status lookup",
            retry_after_secs.max(1)
        ),
    )
    .with_operation_id(id)
    .with_state(OperationState::Processing)
    .with_retry_after_secs(retry_after_secs)
}

/// 409 `operation-outcome-unknown` (no `Retry-After`: retrying does not help).
pub(crate) fn outcome_unknown(id: OperationId, reason: &str) -> Problem {
    Problem::new(
        ProblemType::OperationOutcomeUnknown,
        format!(
            "the outcome of this operation is unknown and an operator must resolve it ({reason}); \
             do not start it again with a new key before then"
        ),
    )
    .with_operation_id(id)
    .with_state(OperationState::Unknown)
}

/// 503 `attempt-timed-out`: the record stays processing; recovery decides.
pub(crate) fn attempt_timed_out(contract: &Contract, id: OperationId) -> Response {
    Problem::new(
        ProblemType::AttemptTimedOut,
        format!(
            "the attempt did not finish within its {} lease, so its outcome is unknown; \
             retry with the same key: recovery decides what happened before anything runs again",
            contract.lease()
        ),
    )
    .with_operation_id(id)
    .with_state(OperationState::Processing)
    .with_retry_after_secs(1)
    .into_response()
}

/// 503 `attempt-failed`: the handler panicked, or answered a server error the contract
/// does not declare retryable, so its outcome is unknown; the record stays processing
/// and recovery decides once its lease has ended (`retry_after_secs` away).
pub(crate) fn attempt_failed(id: OperationId, why: &str, retry_after_secs: u64) -> Response {
    Problem::new(
        ProblemType::AttemptFailed,
        format!(
            "the attempt {why}, so its outcome is unknown; \
             retry with the same key after `Retry-After`: recovery decides what happened before anything runs again"
        ),
    )
    .with_operation_id(id)
    .with_state(OperationState::Processing)
    .with_retry_after_secs(retry_after_secs)
    .into_response()
}

/// 503 `attempt-rolled-back` (the transactional mode): nothing the attempt wrote was
/// committed. `state` is the record's: `released` when this attempt gave the key back,
/// `processing` when another attempt holds it now. A new key is safe only for a released
/// key whose operation made no call to another system: never under `recovery = resume`,
/// whose journaled steps outlive the rollback.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn attempt_rolled_back(
    contract: &Contract,
    id: OperationId,
    why: &str,
    state: OperationState,
    retry_after_secs: u64,
) -> Response {
    Problem::new(
        ProblemType::AttemptRolledBack,
        format!(
            "the attempt {why}, and everything it wrote was rolled back, so it took no effect; \
             retry with the same key after `Retry-After` and it runs again"
        ),
    )
    .with_operation_id(id)
    .with_state(state)
    .with_new_key_safe(
        state == OperationState::Released
            && !matches!(contract.recovery, idem_contract::Recovery::Resume),
    )
    .with_retry_after_secs(retry_after_secs)
    .into_response()
}

/// 503 `recovery-pending`: the reconcile function could not decide now; the operation
/// stays recoverable and the next retry or status lookup asks again.
pub(crate) fn recovery_pending(idem: &Idem, id: OperationId, reason: &str) -> Response {
    Problem::new(
        ProblemType::RecoveryPending,
        format!(
            "an earlier attempt with this key ended without an outcome, and recovery could not decide yet ({reason}); \
             retry with the same key after `Retry-After`: recovery asks again before anything runs"
        ),
    )
    .with_operation_id(id)
    .with_state(OperationState::Processing)
    .with_retry_after_secs(idem.unavailable_retry_after_secs())
    .into_response()
}

/// 503 `store-unavailable`: the store failed, so the operation's state could not be
/// read (the handler did not run: fail closed) or the state an answer depends on could
/// not be recorded (the answer would claim what is not so).
pub(crate) fn store_unavailable(
    idem: &Idem,
    contract: &Contract,
    id: Option<OperationId>,
    error: &StoreError,
) -> Problem {
    let id = id.unwrap_or_default();
    if error.is_full() {
        return store_full(idem, contract, id, error);
    }
    tracing::error!(
        operation = %contract.operation,
        operation_id = %id,
        error = %error,
        outcome = "store_unavailable",
        "idem: the store failed; answering 503 store-unavailable"
    );
    Problem::new(
        ProblemType::StoreUnavailable,
        "the idempotency store cannot be reached, so the state of this operation could not be read or recorded; retry with the same key",
    )
    .with_operation_id(id)
    .with_retry_after_secs(idem.unavailable_retry_after_secs())
}

/// 503 `store-full`: the store answered that it is full ([`StoreError::is_full`]).
fn store_full(idem: &Idem, contract: &Contract, id: OperationId, error: &StoreError) -> Problem {
    tracing::error!(
        operation = %contract.operation,
        operation_id = %id,
        error = %error,
        outcome = "store_full",
        "idem: the store is full; answering 503 store-full (make room in the store, or lower the client budgets)"
    );
    Problem::new(
        ProblemType::StoreFull,
        "the idempotency store is full and refused to record this operation's state (it did not run, or it ran and its outcome is not recorded yet); retry with the same key later: the server finds out which",
    )
    .with_operation_id(id)
    .with_retry_after_secs(idem.unavailable_retry_after_secs())
}

/// 429 `client-budget-exhausted`: the client is at its budget in the store
/// ([`crate::store::budget`]) and the key is new to it; nothing was registered.
pub(crate) fn budget_exhausted(contract: &Contract, over: &OverBudget, now: UnixMillis) -> Problem {
    let retry_after = over.retry_after_secs(now);
    tracing::warn!(
        operation = %contract.operation,
        records = over.usage.records,
        bytes = over.usage.bytes,
        retry_after_secs = retry_after,
        outcome = "client_budget_exhausted",
        "idem: a client at its budget sent a new key; answering 429 client-budget-exhausted"
    );
    Problem::new(
        ProblemType::ClientBudgetExhausted,
        format!(
            "you hold {} live keys and {} bytes of stored answers, as many as this server keeps for one client, so this new key was not registered and nothing ran; retry with the same key after {retry_after} s, when your oldest key expires, and do not make new keys for retries",
            over.usage.records, over.usage.bytes
        ),
    )
    .with_operation_id(OperationId::new())
    .with_new_key_safe(true)
    .with_retry_after_secs(retry_after)
}

/// The status lookup path of `key`, percent-encoded, if the contract declares one.
pub(crate) fn lookup_location(contract: &Contract, key: &str) -> Option<String> {
    let key = contract.key_scope.key_for_lookup(key);
    contract
        .status_lookup
        .path_for(&idem_contract::lookup::encode_key(&key))
}

/// 202 for `concurrency = accepted`: `Location` is the status lookup of the key.
pub(crate) fn accepted(contract: &Contract, key: &RecordKey, id: OperationId) -> Response {
    let location = lookup_location(contract, &key.key);
    let body = serde_json::json!({
        "operation": contract.operation,
        "operation_id": id,
        "state": OperationState::Processing.as_str(),
        "status_lookup": location,
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = StatusCode::ACCEPTED;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(location) = location.and_then(|l| HeaderValue::try_from(l).ok()) {
        headers.insert(header::LOCATION, location);
    }
    telemetry::tagged(with_operation_id(response, id), Outcome::Accepted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    #[test]
    fn lookup_paths_encode_the_key_as_one_segment() {
        let mut contract = Contract::PLACEHOLDER;
        contract.status_lookup.path = Some(Cow::Borrowed("/orders/operations/{key}"));
        assert_eq!(
            lookup_location(&contract, "a/b?c#d%e f~g.h-i_j").as_deref(),
            Some("/orders/operations/a%2Fb%3Fc%23d%25e%20f~g.h-i_j")
        );
        contract.status_lookup.path = None;
        assert_eq!(lookup_location(&contract, "k"), None);
    }
}
