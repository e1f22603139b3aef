//! Enforcement of a contract on one handler.
//!
//! `#[idem::contract(..)]` replaces the handler's last extractor `E` with
//! [`Enforced<E, Operation>`](Enforced) and runs the handler's body through
//! [`Guard::run`]. Written by hand, a contracted handler looks like this:
//!
//! ```
//! use axum::{Json, http::StatusCode, response::Response};
//! use idem_runtime::enforce::Enforced;
//! # use idem_runtime::{Contracted, Recover, Recoverer};
//! # pub struct CreateOrder;
//! # impl Contracted for CreateOrder { const CONTRACT: &'static idem_contract::Contract = &idem_contract::Contract::PLACEHOLDER; }
//! # impl<S> Recover<S> for CreateOrder { fn recoverer(_: &S) -> Recoverer { Recoverer::manual() } }
//!
//! async fn create_order(enforced: Enforced<Json<serde_json::Value>, CreateOrder>) -> Response {
//!     let (Json(body), guard) = enforced.into_parts();
//!     guard
//!         .run(async move { (StatusCode::CREATED, Json(body)) })
//!         .await
//! }
//! # let _: axum::Router = axum::Router::new().route("/orders", axum::routing::post(create_order));
//! ```
//!
//! For every request, [`Enforced`]'s extraction:
//!
//! 1. takes the [`Idem`] handle from the request's extensions (500 `not-configured`);
//! 2. asks the application who the client is ([`crate::identity`]);
//! 3. reads and checks the key (400 `key-missing`, `key-malformed`), before any store call;
//! 4. reads the body once (axum's `DefaultBodyLimit` applies: 413 `body-too-large` past
//!    it) and computes the fingerprint once from those bytes (400 `body-malformed`);
//! 5. runs the inner extractor `E` on the same bytes: a request it refuses (a wrong
//!    `Content-Type`, a body that does not deserialize) did nothing, so its rejection is
//!    answered as it is and nothing is registered;
//! 6. registers the key atomically, or answers from the record: a replay, 422
//!    `fingerprint-mismatch`, the contract's concurrency answer, a recovery, 409
//!    `operation-outcome-unknown`, or 503 `store-unavailable` (fail closed).
//!
//! Then [`Guard::run`] runs the handler and settles its answer.

mod register;

use std::fmt;
use std::marker::PhantomData;

use axum::body::{Body, Bytes};
use axum::extract::rejection::RawPathParamsRejection;
use axum::extract::{FromRequest, FromRequestParts, RawPathParams, Request};
use axum::response::{IntoResponse, Response};
use http::HeaderMap;
use idem_contract::{Contract, Fingerprint, KeyScope, KeySource};
use tracing::Instrument;

use self::register::{Registered, register};
use crate::Idem;
use crate::answer;
pub use crate::attempt::{Attempt, Guard};
use crate::fingerprint::{self, jcs::Value};
use crate::operation::Recover;
pub use crate::replay::IDEMPOTENT_REPLAYED_HEADER;
use crate::store::RecordKey;
use crate::telemetry::AttemptTelemetry;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::transaction::TxSlot;
use crate::wire::Wire;

/// The extractor of a contracted handler: the handler's own last extractor `E`, plus the
/// [`Guard`] of the attempt that holds the key of operation `C`.
///
/// Its rejection is a complete answer (a problem, a replay, a concurrency answer, or the
/// settled rejection of `E`), with the `Operation-Id` header.
pub struct Enforced<E, C> {
    inner: E,
    guard: Guard,
    contract: PhantomData<fn() -> C>,
}

impl<E, C> Enforced<E, C> {
    /// The inner extractor's value and the attempt's guard.
    pub fn into_parts(self) -> (E, Guard) {
        (self.inner, self.guard)
    }
}

impl<E, C> fmt::Debug for Enforced<E, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Enforced")
            .field("guard", &self.guard)
            .finish_non_exhaustive()
    }
}

impl<S, E, M, C> FromRequest<S, (M,)> for Enforced<E, C>
where
    E: FromRequest<S, M> + Send,
    C: Recover<S>,
    S: Send + Sync,
{
    type Rejection = Response;

    /// Runs the steps of the [module docs](self) in the attempt's span
    /// ([`crate::telemetry`]), which the guard carries on into the handler's run.
    async fn from_request(request: Request, state: &S) -> Result<Self, Response> {
        let mut telemetry = AttemptTelemetry::start(C::CONTRACT, &request);
        let span = telemetry.span().clone();
        match extract::<S, E, M, C>(request, state, &mut telemetry)
            .instrument(span)
            .await
        {
            Ok(mut enforced) => {
                telemetry.registered(enforced.guard.operation_id(), enforced.guard.attempt());
                enforced.guard.observe(telemetry);
                Ok(enforced)
            }
            Err(response) => {
                telemetry.answered(&response);
                Err(response)
            }
        }
    }
}

/// The extraction of [`Enforced`], step by step (see the module docs).
async fn extract<S, E, M, C>(
    request: Request,
    state: &S,
    telemetry: &mut AttemptTelemetry,
) -> Result<Enforced<E, C>, Response>
where
    E: FromRequest<S, M> + Send,
    C: Recover<S>,
    S: Send + Sync,
{
    // (The steps keep the indentation they had as the body of `from_request`.)
    {
        let contract: &'static Contract = C::CONTRACT;
        let (mut parts, body) = request.into_parts();
        let Some(idem) = parts.extensions.get::<Idem>().cloned() else {
            return Err(answer::not_configured());
        };
        let claim = idem
            .names()
            .claim::<C>()
            .map_err(|other| answer::operation_name_taken(contract, other))?;
        telemetry.set_metrics(&claim.metrics);
        let wire = claim
            .wire
            .as_ref()
            .as_ref()
            .map_err(|why| answer::misconfigured(contract, why))?;
        let client = idem
            .identity()
            .identify(&parts)
            .map_err(answer::with_fresh_id)?;
        let header_key = match &contract.key_scope.source {
            KeySource::Header { name } => Some(key_from_header(&parts.headers, name, contract)?),
            KeySource::Body { .. } => None,
        };

        // The path parameters name the resource the intent is about: always significant.
        let path_params: Vec<(String, String)> =
            match RawPathParams::from_request_parts(&mut parts, state).await {
                Ok(params) => params
                    .iter()
                    .map(|(name, value)| (name.to_owned(), value.to_owned()))
                    .collect(),
                Err(RawPathParamsRejection::MissingPathParams(_)) => Vec::new(),
                Err(rejection) => return Err(answer::with_fresh_id(rejection.into_response())),
            };

        // The body is read once, with the request's own `DefaultBodyLimit` (a shadow
        // request carries the extensions that hold it).
        let mut shadow = Request::new(body);
        *shadow.extensions_mut() = parts.extensions.clone();
        let bytes = Bytes::from_request(shadow, state)
            .await
            .map_err(|rejection| answer::body_unreadable(&rejection))?;

        // A form body (`Form<T>`) is read as a form; any other body, when a field or a
        // body key must be read from it, as JSON.
        let is_form = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| fingerprint::form::is_form(v.as_bytes()));
        // A form on GET or HEAD is its query string (as axum's `Form` reads it).
        let get_form = matches!(parts.method, http::Method::GET | http::Method::HEAD)
            && bytes.is_empty()
            && parts.uri.query().is_some();
        let is_form = is_form || get_form;
        let doc = if get_form {
            let query = parts.uri.query().unwrap_or_default();
            Some(fingerprint::form::parse(query.as_bytes()).map_err(answer::body_malformed)?)
        } else if is_form {
            Some(fingerprint::form::parse(&bytes).map_err(answer::body_malformed)?)
        } else if header_key.is_none() || matches!(contract.fingerprint, Fingerprint::Fields(_)) {
            Some(Value::parse(&bytes).map_err(|e| {
                answer::body_malformed(format_args!("the request body is not valid JSON: {e}"))
            })?)
        } else {
            None
        };
        let key = match (header_key, &doc) {
            (Some(key), _) => key,
            (None, Some(doc)) => key_from_body(doc, is_form, wire, contract)?,
            (None, None) => unreachable!("a body key always parses the body"),
        };
        // The significant query parameters the contract names, each with its values in
        // order; read like a form (the query string's encoding).
        let query = if wire.query.is_empty() {
            None
        } else {
            let string = parts.uri.query().unwrap_or_default();
            let fingerprint::jcs::Value::Object(all) = fingerprint::form::parse(string.as_bytes())
                .map_err(|e| {
                    answer::body_malformed(format_args!("the query string cannot be read: {e}"))
                })?
            else {
                return Err(answer::body_malformed("the query string cannot be read"));
            };
            Some(
                all.into_iter()
                    .filter(|(name, _)| wire.query.iter().any(|q| q == name))
                    .collect::<Vec<_>>(),
            )
        };
        let params: Vec<(&str, &str)> = path_params
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let fingerprint = match &doc {
            Some(doc) => fingerprint::of_parsed(&wire.fingerprint, &bytes, doc),
            None => fingerprint::compute(&wire.fingerprint, &bytes),
        }
        .and_then(|body| fingerprint::with_request_parts(body, &params, query))
        .map_err(answer::body_malformed)?;

        #[cfg(any(feature = "sqlite", feature = "postgres"))]
        let tx = parts.extensions.get::<TxSlot>().cloned();
        #[cfg(feature = "testing")]
        let fault =
            crate::fault::requested(idem.test_faults(), &parts.headers).map_err(|value| {
                answer::body_malformed(format_args!(
                    "the header `{}` names no fault: `{value}`; send one of {}",
                    crate::fault::TEST_FAULT_HEADER,
                    crate::fault::TestFault::ALL
                        .map(|(name, _)| name)
                        .join(", ")
                ))
            })?;

        // The inner extractor runs before anything is registered: what it refuses did
        // nothing, so it must not be stored and replayed for the whole TTL. (The rejection
        // becomes a response at once: it need not be `Send`.)
        let request = Request::from_parts(parts, Body::from(bytes));
        let inner = E::from_request(request, state)
            .await
            .map_err(|rejection| answer::with_fresh_id(rejection.into_response()))?;

        let key = std::sync::Arc::new(RecordKey::new(contract.operation.as_ref(), client, key));

        // The right to begin the transaction is taken before anything is registered: with
        // SQLite's one writer the wait happens here, where a client that gives up leaves
        // nothing behind, and it is not charged to the attempt's lease. A duplicate of a
        // key that is held or finished is answered from its record without waiting.
        #[cfg(any(feature = "sqlite", feature = "postgres"))]
        if let Some(TxSlot(tx)) = &tx
            && !tx.try_reserve().await
        {
            let now = crate::store::unix_now();
            let answered_from_record = match idem.store().get(&key, now).await {
                Ok(Some(record)) => !matches!(record.state, crate::store::RecordState::Released),
                Ok(None) => false,
                Err(error) => {
                    return Err(answer::store_unavailable(&idem, contract, None, &error));
                }
            };
            if !answered_from_record {
                tx.reserve()
                    .await
                    .map_err(|error| answer::store_unavailable(&idem, contract, None, &error))?;
            }
        }
        #[cfg(any(feature = "sqlite", feature = "postgres"))]
        let transactional = tx.is_some();
        #[cfg(not(any(feature = "sqlite", feature = "postgres")))]
        let transactional = false;
        let registered = register(&idem, contract, &key, &fingerprint, transactional, || {
            C::recoverer(state)
        });
        match registered.await {
            Registered::Answer(response) => Err(response),
            #[allow(unused_mut, reason = "set only in the transactional mode")]
            Registered::Run(mut attempt) => {
                // The transactional mode: the transaction begins once the key is held, so
                // that registration never waits behind it.
                #[cfg(any(feature = "sqlite", feature = "postgres"))]
                if let Some(TxSlot(tx)) = tx {
                    if let Err(error) = tx.begin().await {
                        // Nothing ran: give the key back for the retry.
                        let _ = attempt.release().await;
                        return Err(answer::store_unavailable(
                            &idem,
                            contract,
                            Some(attempt.operation_id),
                            &error,
                        ));
                    }
                    attempt.attach(tx);
                }
                let guard = Guard::new(attempt);
                #[cfg(feature = "testing")]
                let guard = guard.with_fault(fault);
                Ok(Enforced {
                    inner,
                    guard,
                    contract: PhantomData,
                })
            }
        }
    }
}

/// The key from the header `name` (matched case-insensitively, RFC 9110 §5.1).
#[allow(
    clippy::result_large_err,
    reason = "a response is what axum rejects with"
)]
fn key_from_header(
    headers: &HeaderMap,
    name: &str,
    contract: &Contract,
) -> Result<String, Response> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Err(answer::key_missing(contract));
    };
    if values.next().is_some() {
        return Err(answer::key_malformed_because(&format!(
            "the `{name}` header is sent more than once; send one key"
        )));
    }
    contract
        .key_scope
        .header_key(value.as_bytes())
        .map_err(|e| answer::key_malformed(&e))
}

/// The key from the body member the contract names; it must be a JSON string.
#[allow(
    clippy::result_large_err,
    reason = "a response is what axum rejects with"
)]
fn key_from_body(
    doc: &Value,
    is_form: bool,
    wire: &Wire,
    contract: &Contract,
) -> Result<String, Response> {
    let Some(field) = &wire.key_field else {
        return Err(answer::key_missing(contract));
    };
    match doc.pointer(field.segments()) {
        None | Some(Value::Null) => Err(answer::key_missing(contract)),
        Some(Value::String(key)) => checked_key(key.as_bytes(), &contract.key_scope),
        // A form field: the array of its values.
        Some(Value::Array(values)) if is_form => match values.as_slice() {
            [Value::String(key)] => checked_key(key.as_bytes(), &contract.key_scope),
            [] => Err(answer::key_missing(contract)),
            _ => Err(answer::key_malformed_because(&format!(
                "the idempotency key `{field}` is sent more than once; send one key"
            ))),
        },
        Some(_) => Err(answer::key_malformed_because(&format!(
            "the idempotency key `{field}` must be a JSON string"
        ))),
    }
}

/// Checks a key against the key rules (`KeyScope::validate_key`).
#[allow(
    clippy::result_large_err,
    reason = "a response is what axum rejects with"
)]
fn checked_key(key: &[u8], scope: &KeyScope) -> Result<String, Response> {
    scope
        .validate_key(key)
        .map_err(|e| answer::key_malformed(&e))?;
    // Visible ASCII only, so this is valid UTF-8.
    Ok(String::from_utf8_lossy(key).into_owned())
}

#[cfg(test)]
mod tests {
    use idem_contract::FieldPath;
    use proptest::prelude::*;

    use super::*;

    fn slug(response: &Response) -> String {
        let bytes = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.as_bytes().to_vec());
        assert_eq!(bytes.as_deref(), Some(&b"application/problem+json"[..]));
        assert!(response.headers().contains_key(crate::OPERATION_ID_HEADER));
        response.status().to_string()
    }

    proptest! {
        #[test]
        fn visible_ascii_keys_up_to_255_bytes_are_accepted(key in "[!-~]{1,255}") {
            prop_assert_eq!(checked_key(key.as_bytes(), &KeyScope::CLIENT).ok(), Some(key.clone()));
        }

        #[test]
        fn keys_with_any_other_character_are_refused(
            prefix in "[!-~]{0,10}",
            bad in "[^!-~]",
            suffix in "[!-~]{0,10}",
        ) {
            let key = format!("{prefix}{bad}{suffix}");
            let refused = checked_key(key.as_bytes(), &KeyScope::CLIENT).unwrap_err();
            prop_assert_eq!(slug(&refused), "400 Bad Request");
        }
    }

    #[test]
    fn header_keys() {
        let contract = &Contract::PLACEHOLDER;
        let mut headers = HeaderMap::new();
        let missing = key_from_header(&headers, "Idempotency-Key", contract).unwrap_err();
        assert_eq!(slug(&missing), "400 Bad Request");
        headers.append("idempotency-key", "k1".parse().unwrap());
        assert_eq!(
            key_from_header(&headers, "IDEMPOTENCY-KEY", contract).unwrap(),
            "k1"
        );
        headers.append("idempotency-key", "k2".parse().unwrap());
        assert!(key_from_header(&headers, "Idempotency-Key", contract).is_err());
    }

    #[test]
    #[allow(clippy::result_large_err)]
    fn body_keys() {
        let mut contract = Contract::PLACEHOLDER;
        contract.key_scope.source = KeySource::Body {
            field: FieldPath::from_static("ref.id"),
        };
        let wire = crate::wire::resolve(&contract, None, None).unwrap();
        let key = |json: &str| {
            key_from_body(
                &Value::parse(json.as_bytes()).unwrap(),
                false,
                &wire,
                &contract,
            )
        };
        assert_eq!(key(r#"{"ref":{"id":"k-1"}}"#).unwrap(), "k-1");
        for missing in [r#"{}"#, r#"{"ref":{"id":null}}"#, r#"{"ref":"k"}"#] {
            assert!(key(missing).is_err(), "{missing}");
        }
        assert!(key(r#"{"ref":{"id":7}}"#).is_err());
        assert!(key(r#"{"ref":{"id":"a b"}}"#).is_err());
    }
}
