//! The status lookup: how a client learns the outcome of an operation by its key after an
//! answer was lost.

use std::marker::PhantomData;
use std::time::{Duration, UNIX_EPOCH};

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::{HeaderValue, StatusCode, header};
use idem_contract::{Contract, KeyError};

use crate::answer;
use crate::enforce::admit;
use crate::operation::{Contracted, OperationRef, Recover};
use crate::problem::{Problem, ProblemType};
use crate::reconcile::Recoverer;
use crate::recovery::{Recovered, recover};
use crate::store::{Record, RecordKey, RecordState, Step, UnixMillis};
use crate::{Idem, OperationId};

/// The extractor of a status lookup handler for the contracted operation `C`: the
/// [`Idem`] handle, the client's identity and the operation's recoverer.
///
/// A client only ever sees its own operations: the lookup reads the key in the namespace
/// of the client's identity, like the operation itself.
///
/// ```
/// use axum::extract::Path;
/// use idem_runtime::{Lookup, OperationStatus};
/// # use idem_runtime::{enforce::Contracted, recovery::{Recover, Recoverer}};
/// # pub struct CreateOrder;
/// # impl Contracted for CreateOrder { const CONTRACT: &'static idem_contract::Contract = &idem_contract::Contract::PLACEHOLDER; }
/// # impl<S> Recover<S> for CreateOrder { fn recoverer(_: &S) -> Recoverer { Recoverer::manual() } }
///
/// // GET /orders/operations/{key}
/// async fn order_operation_status(
///     lookup: Lookup<CreateOrder>,
///     Path(key): Path<String>,
/// ) -> OperationStatus {
///     lookup.status(&key).await
/// }
/// # let _: axum::Router = axum::Router::new()
/// #     .route("/orders/operations/{key}", axum::routing::get(order_operation_status));
/// ```
///
/// Rejections: 500 `not-configured` without the layer; the identity's own answer (401
/// `client-identity-missing` for [`crate::identity::header`]).
pub struct Lookup<C> {
    idem: Idem,
    client: String,
    recoverer: Recoverer,
    operation: PhantomData<fn() -> C>,
}

impl<C> std::fmt::Debug for Lookup<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lookup").finish_non_exhaustive()
    }
}

impl<S, C> FromRequestParts<S> for Lookup<C>
where
    C: Recover<S>,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        let admitted =
            admit(parts, &OperationRef::of::<C>()).map_err(IntoResponse::into_response)?;
        let client = admitted
            .identify(parts)
            .map_err(IntoResponse::into_response)?;
        Ok(Lookup {
            idem: admitted.idem,
            client,
            recoverer: C::recoverer(state),
            operation: PhantomData,
        })
    }
}

impl<C: Contracted> Lookup<C> {
    /// The state of the client's operation under `key`.
    ///
    /// An operation whose lease has ended without an outcome is recovered first, exactly
    /// as a retry would recover it (see [`crate::recovery`]), except that "not applied"
    /// releases the key instead of running the handler, so that the client's next request
    /// with the key runs it. An operation under `recovery = resume` is not recovered here
    /// (only a retry can run its handler again): it is reported `processing` until the
    /// retry resumes it, with its step journal ([`OperationReport::steps`]).
    pub async fn status(self, key: &str) -> OperationStatus {
        let contract = C::CONTRACT;
        // The key as the client meant it: bare, or quoted as in its header.
        let key = match contract.key_scope.lookup_key(key.as_bytes()) {
            Ok(key) => key,
            Err(error) => return OperationStatus::InvalidKey(error),
        };
        let key = std::sync::Arc::new(RecordKey::new(
            contract.operation.as_ref(),
            self.client,
            key,
        ));
        let mut recoverer = Some(move || self.recoverer);
        let unavailable = |error: &dyn std::fmt::Display| {
            tracing::error!(
                operation = %contract.operation,
                error = %error,
                "idem: the status lookup cannot read the store"
            );
            OperationStatus::Unavailable {
                retry_after_secs: self.idem.unavailable_retry_after_secs(),
            }
        };
        let mut last = None;
        for _ in 0..4 {
            let now = self.idem.now().await;
            let record = match self.idem.store().get(&key, now).await {
                Ok(Some(record)) => record,
                Ok(None) => {
                    // An attempt whose record is in its transaction, not committed yet
                    // (read again after the mark: one that finds the record committed
                    // meanwhile holds the mark for a moment, and answers from it).
                    let holder = match self.idem.in_flight(&key).await {
                        Ok(Some(holder)) => holder,
                        Ok(None) => return OperationStatus::NotFound,
                        Err(error) => return unavailable(&error),
                    };
                    match self.idem.store().get(&key, now).await {
                        Ok(Some(record)) => record,
                        Ok(None) => holder.record(contract.ttl.as_millis()),
                        Err(error) => return unavailable(&error),
                    }
                }
                Err(error) => return unavailable(&error),
            };
            let ended = record
                .lease()
                .is_some_and(|l| !self.idem.running().holds(l, now));
            if !ended || recoverer.is_none() || resumes(contract) {
                return Self::found(&self.idem, contract, &key, record, now).await;
            }
            match recover(&self.idem, contract, &key, &record, &mut recoverer).await {
                Recovered::Run(attempt) => {
                    if let Err(error) = attempt.release().await {
                        return unavailable(&error);
                    }
                }
                Recovered::Answer(_) | Recovered::Lost => {}
                Recovered::Failed(error) => return unavailable(&error),
            }
            last = Some(record);
        }
        match last {
            Some(record) => {
                let now = self.idem.now().await;
                Self::found(&self.idem, contract, &key, record, now).await
            }
            None => OperationStatus::NotFound,
        }
    }

    /// The report of `record`, with its step journal under `recovery = resume` (a journal
    /// that cannot be read is reported as the store being unavailable).
    async fn found(
        idem: &Idem,
        contract: &Contract,
        key: &RecordKey,
        record: Record,
        now: UnixMillis,
    ) -> OperationStatus {
        let mut report = OperationReport::new(key, record, now);
        if resumes(contract) {
            match idem
                .store()
                .steps(key, report.record.operation_id, now)
                .await
            {
                Ok(steps) => report.steps = steps,
                Err(error) => {
                    tracing::error!(operation = %contract.operation, error = %error, "idem: the status lookup cannot read the step journal");
                    return OperationStatus::Unavailable {
                        retry_after_secs: idem.unavailable_retry_after_secs(),
                    };
                }
            }
        }
        OperationStatus::Found(report)
    }
}

/// Whether the contract resumes its operations (`recovery = resume`).
fn resumes(contract: &Contract) -> bool {
    matches!(contract.recovery, idem_contract::Recovery::Resume)
}

/// The answer of a status lookup. As a response:
///
/// | case | answer |
/// |---|---|
/// | [`OperationStatus::Found`] | 200 `application/json`, see [`OperationReport::to_json`] |
/// | [`OperationStatus::NotFound`] | 404 `operation-not-found` |
/// | [`OperationStatus::InvalidKey`] | 400 `key-malformed` |
/// | [`OperationStatus::Unavailable`] | 503 `store-unavailable` with `Retry-After` |
#[derive(Debug)]
#[non_exhaustive]
pub enum OperationStatus {
    /// The operation is known.
    Found(OperationReport),
    /// No operation under this key: never registered, or its TTL has passed. Within the
    /// TTL, this means no attempt with the key ever reached the store, so a new key is
    /// safe.
    NotFound,
    /// The key breaks the key rules, so no operation can have it.
    InvalidKey(KeyError),
    /// The store failed.
    Unavailable {
        /// The `Retry-After`, in whole seconds.
        retry_after_secs: u64,
    },
}

/// What the status lookup knows about one operation.
#[derive(Clone, Debug)]
pub struct OperationReport {
    /// The contract's operation.
    pub operation: String,
    /// The idempotency key.
    pub key: String,
    /// The record.
    pub record: Record,
    /// When the report was made, in unix milliseconds.
    pub at: UnixMillis,
    /// The operation's step journal under `recovery = resume` (empty otherwise): which
    /// calls to other systems are done, failed, or pending.
    pub steps: Vec<Step>,
}

impl OperationReport {
    fn new(key: &RecordKey, record: Record, at: UnixMillis) -> OperationReport {
        OperationReport {
            operation: key.operation.clone(),
            key: key.key.clone(),
            record,
            at,
            steps: Vec::new(),
        }
    }

    /// The report as JSON:
    ///
    /// ```json
    /// {
    ///   "operation": "create_order",
    ///   "operation_id": "0191f6a4-6c1e-7c3a-9d5e-1b2c3d4e5f60",
    ///   "key": "order-7",
    ///   "state": "completed",
    ///   "attempt": 1,
    ///   "created_at": "2026-11-29T18:00:00.123Z",
    ///   "expires_at": "2026-11-30T18:00:00.123Z",
    ///   "new_key_safe": false,
    ///   "response": {
    ///     "status": 201,
    ///     "headers": { "content-type": "application/json", "location": "/orders/7" },
    ///     "body": { "id": 7 }
    ///   }
    /// }
    /// ```
    ///
    /// Times are RFC 3339, UTC, with milliseconds. `response` is there when the state is
    /// `completed`; its `body` is the stored body parsed as JSON when it is JSON, and left
    /// out otherwise; repeated headers are joined with `, `. `reason` is there when the
    /// state is `unknown`, and `retry_after` (whole seconds until the lease ends) when it
    /// is `processing`. `steps` is there when the operation has a step journal: each
    /// step's `name`, `state` (`pending`, `done` or `failed`) and `calls`, never its
    /// value. `new_key_safe` is true only for `released` without a step journal (a
    /// released operation that called another system resumes under the same key).
    pub fn to_json(&self) -> serde_json::Value {
        let r = &self.record;
        let mut out = serde_json::json!({
            "operation": self.operation,
            "operation_id": r.operation_id,
            "key": self.key,
            "state": r.state.kind().as_str(),
            "attempt": r.attempt,
            "created_at": rfc3339(r.created_at),
            "expires_at": rfc3339(r.expires_at),
            "new_key_safe": matches!(r.state, RecordState::Released) && self.steps.is_empty(),
        });
        if !self.steps.is_empty() {
            out["steps"] = self
                .steps
                .iter()
                .map(|step| {
                    serde_json::json!({
                        "name": step.name,
                        "state": step.state.as_str(),
                        "calls": step.calls,
                    })
                })
                .collect();
        }
        match &r.state {
            RecordState::Completed { response } => {
                let mut headers = serde_json::Map::new();
                for (name, value) in &response.headers {
                    let Ok(value) = value.to_str() else { continue };
                    match headers.get_mut(name.as_str()) {
                        Some(serde_json::Value::String(joined)) => {
                            joined.push_str(", ");
                            joined.push_str(value);
                        }
                        _ => {
                            headers.insert(name.as_str().to_owned(), value.into());
                        }
                    }
                }
                let is_json = response
                    .headers
                    .iter()
                    .find(|(n, _)| n == header::CONTENT_TYPE)
                    .is_none_or(|(_, v)| is_json_media_type(v));
                let mut stored =
                    serde_json::json!({ "status": response.status, "headers": headers });
                if is_json
                    && let Ok(body) = serde_json::from_slice::<serde_json::Value>(&response.body)
                {
                    stored["body"] = body;
                }
                out["response"] = stored;
            }
            RecordState::Unknown { reason } => out["reason"] = reason.as_str().into(),
            RecordState::Processing { lease } => {
                out["retry_after"] = lease
                    .until
                    .saturating_sub(self.at)
                    .div_ceil(1000)
                    .max(1)
                    .into();
            }
            RecordState::Released => {}
        }
        out
    }
}

/// `application/json` or any `+json` type (RFC 6839).
fn is_json_media_type(value: &HeaderValue) -> bool {
    let Ok(text) = value.to_str() else {
        return false;
    };
    let essence = text
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence.ends_with("+json")
}

fn rfc3339(ms: UnixMillis) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

impl IntoResponse for OperationStatus {
    fn into_response(self) -> Response {
        match self {
            OperationStatus::Found(report) => {
                let mut response = (StatusCode::OK, report.to_json().to_string()).into_response();
                let headers = response.headers_mut();
                headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                answer::with_operation_id(response, report.record.operation_id)
            }
            OperationStatus::NotFound => Problem::new(
                ProblemType::OperationNotFound,
                "no operation with this key is known for this client: it never reached the server, or its TTL has passed",
            )
            .with_operation_id(OperationId::new())
            .into_response(),
            OperationStatus::InvalidKey(error) => answer::key_malformed(&error).into_response(),
            OperationStatus::Unavailable { retry_after_secs } => Problem::new(
                ProblemType::StoreUnavailable,
                "the idempotency store cannot be reached; ask again later",
            )
            .with_operation_id(OperationId::new())
            .with_retry_after_secs(retry_after_secs)
            .into_response(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_media_types() {
        for yes in [
            "application/json",
            "application/problem+json",
            "Application/JSON; charset=utf-8",
        ] {
            assert!(is_json_media_type(&HeaderValue::from_static(yes)), "{yes}");
        }
        for no in ["text/plain", "application/jsonl", "text/json-ish"] {
            assert!(!is_json_media_type(&HeaderValue::from_static(no)), "{no}");
        }
        assert_eq!(rfc3339(1_800_000_000_123), "2027-01-15T08:00:00.123Z");
    }
}
