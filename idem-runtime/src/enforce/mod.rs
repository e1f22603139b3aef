//! Enforcement of a contract on one handler.
//!
//! `#[idem::contract(..)]` replaces the handler's last extractor `E` with
//! [`Enforced<E, Operation>`](Enforced) and runs the handler's body through
//! [`Guard::run`]. Written by hand, a contracted handler looks like this:
//!
//! ```
//! use axum::{Json, http::StatusCode, response::Response};
//! use idem_runtime::enforce::Enforced;
//! # use idem_runtime::{enforce::Contracted, recovery::{Recover, Recoverer}};
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
//! # The request path, stage by stage
//!
//! Each stage is a small function in its own file; a stage that refuses the request
//! answers with a [`Rejection`], and nothing after it runs.
//!
//! | # | stage | file | refuses with |
//! |---|---|---|---|
//! | 1 | admit: the idem handle, the operation's claim on its name, its serde names, the client's identity | `admit.rs` | 500 `not-configured`; the identity's refusal (401) |
//! | 2 | the key from its header, before the body is read | `key.rs` | 400 `key-missing`, `key-malformed` |
//! | 3 | read: the path parameters and the body, once (axum's `DefaultBodyLimit` applies), the body within the attempt's time | `read.rs` | 413 `body-too-large`, 400 `body-malformed`, 408 `request-timeout` |
//! | 4 | what counts as the same request: the body parsed once, a key in the body, the fingerprint of the body fields, path and query parameters | `significant.rs` | 400 `body-malformed`, `key-missing`, `key-malformed` |
//! | 5 | the handler's own extractor `E`, on the same bytes (what it refuses did nothing, so nothing is registered) | `inner.rs` | `E`'s own rejection |
//! | 6 | the transactional mode's right to begin, taken before registration | `begin.rs` | 503 `store-unavailable` |
//! | 7 | register: claim the key atomically, or answer from its record | `register/` | a replay, 422 `fingerprint-mismatch`, the contract's concurrency answer, recovery's answer, 409 `operation-outcome-unknown`, 503 `store-unavailable` |
//! | 8 | begin the mode: the attempt's transaction begins once the key is held | `begin.rs` | 503 `store-unavailable` |
//! | 9 | run: the handler, detached from the connection, panics caught, in the attempt's span, within its time | `crate::attempt` (`guard.rs`, `run.rs`) | — |
//! | 10 | settle: record the answer, release the key, or hand the operation to recovery | `crate::attempt` (`settle.rs`, `transactional.rs`) | — |
//!
//! # Where each property of the contract is enforced
//!
//! | property | enforced by |
//! |---|---|
//! | `key_scope` | `key.rs` and `significant.rs` (where the key is read, its rules); `admit.rs` (the client's identity, the key's namespace with the operation's name) |
//! | `fingerprint` | `significant.rs` (computed once from the bytes received); `register/existing.rs` (another fingerprint under the key: 422) |
//! | `ttl` | `register/claim.rs` (the record's expiry); the store's purge ([`Idem::spawn_purger`](crate::Idem::spawn_purger)) |
//! | `deadline` | its per-attempt part (or the whole deadline without one): the time the body may take to arrive (`read.rs`), then the attempt's time, `crate::attempt` (`run.rs`, less a margin kept to settle); its total across attempts: the client ([`idem_client`'s policy](https://docs.rs/idem-client)) |
//! | `max_attempts` | the client, which stops after it; the server counts every attempt that runs the handler ([`Attempt::attempt`], the record's attempt, shown by the status lookup and `idem ops`) but does not refuse the next one: a retry past the budget is a client's bug, and refusing it could not undo what earlier attempts did |
//! | `retryable` | `crate::attempt` (`settle.rs`: a retryable status releases the key; in the transactional mode its writes roll back first) |
//! | `concurrency` | `register/concurrency.rs` |
//! | `status_lookup` | [`crate::Lookup`]; the `Location` of `concurrency = accepted` |
//! | `recovery` | [`crate::recovery`] (the takeover of an ended lease, the recoverer's decision), asked from `register/existing.rs`, the status lookup and the reconciler (`reconciler.rs`) |
//!
//! Then [`Guard::run`] runs the handler and settles its answer.

mod admit;
mod begin;
mod inner;
mod key;
mod read;
mod register;
mod rejection;
mod significant;

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use axum::extract::{FromRequest, Request};
use idem_contract::Contract;
use tracing::Instrument;

pub(crate) use self::admit::admit;
pub use self::rejection::Rejection;
pub use crate::attempt::{Attempt, Guard};
use crate::mode::Mode;
use crate::operation::Recover;
pub use crate::operation::{Contracted, HandlerMode};
use crate::store::RecordKey;
use crate::telemetry::AttemptTelemetry;
use crate::{answer, fault};

/// The extractor of a contracted handler: the handler's own last extractor `E`, plus the
/// [`Guard`] of the attempt that holds the key of operation `C`.
///
/// Its rejection, [`Rejection`], is a complete answer (a problem, a replay, a
/// concurrency answer, recovery's answer, or the refusal of `E`), with the
/// `Operation-Id` header.
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
    type Rejection = Rejection;

    /// Runs the stages of the [module docs](self) in the attempt's span
    /// ([`crate::telemetry`]), which the guard carries on into the handler's run.
    async fn from_request(request: Request, state: &S) -> Result<Self, Rejection> {
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
            Err(rejection) => {
                match &rejection {
                    Rejection::Problem(problem) => telemetry.answered_problem(problem),
                    Rejection::Replayed(response)
                    | Rejection::Accepted(response)
                    | Rejection::Recovered(response)
                    | Rejection::Refused(response) => telemetry.answered(response),
                }
                Err(rejection)
            }
        }
    }
}

/// The stages of the module docs, one after the other.
async fn extract<S, E, M, C>(
    request: Request,
    state: &S,
    telemetry: &mut AttemptTelemetry,
) -> Result<Enforced<E, C>, Rejection>
where
    E: FromRequest<S, M> + Send,
    C: Recover<S>,
    S: Send + Sync,
{
    let contract: &'static Contract = C::CONTRACT;
    let (mut parts, body) = request.into_parts();
    let admitted = admit::<C>(&parts)?;
    telemetry.set_metrics(&admitted.claim.metrics);
    let names = admitted.serde_names(&contract.operation)?;
    let client = admitted.identify(&parts)?;
    let header_key = key::from_header(&parts.headers, contract)?;
    let read = read::read(&mut parts, body, state, contract).await?;
    let same = significant::significant(&parts, &read, names, header_key, contract)?;
    let mode = Mode::of(&parts.extensions);
    let fault = fault::requested(admitted.idem.test_faults(), &parts.headers)
        .map_err(answer::body_malformed)?;
    let inner = inner::inner::<S, E, M>(parts, read.bytes, state).await?;
    let idem = admitted.idem;
    let key = Arc::new(RecordKey::new(
        contract.operation.as_ref(),
        client,
        same.key,
    ));
    let seen = begin::reserve(&mode, &idem, contract, &key).await?;
    let recoverer = || C::recoverer(state);
    let fingerprint = &same.fingerprint;
    let held =
        register::register(&idem, contract, &key, fingerprint, seen, &mode, recoverer).await?;
    let held = begin::begin(mode, held, contract).await?;
    Ok(Enforced {
        inner,
        guard: Guard::new(held, fault),
        contract: PhantomData,
    })
}
