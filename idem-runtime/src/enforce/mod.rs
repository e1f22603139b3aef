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
//! | 5 | look: the key's record read before the extractor, where that read costs no round trip (a store that reads in this process, the memory store); a completed key with this request's fingerprint replayed from it, anything else (another fingerprint too: the extractor answers first) handed on to stage 8 | `look.rs` | a replay, 503 `store-unavailable` |
//! | 6 | the handler's own extractor `E`, on the same bytes (what it refuses did nothing, so nothing is registered); outside the attempt's span | `inner.rs` | `E`'s own rejection |
//! | 7 | the transactional mode's right to begin, taken before registration (on SQLite, the key marked in flight and read first) | `begin.rs` | 503 `store-unavailable` |
//! | 8 | register: claim the key atomically, or answer from its record | `register/` | a replay, 422 `fingerprint-mismatch`, the contract's concurrency answer, recovery's answer, 409 `operation-outcome-unknown`, 503 `store-unavailable` |
//! | 9 | begin the mode: the attempt's transaction begins once the key is held | `begin.rs` | 503 `store-unavailable` |
//! | 10 | run: the handler, detached from the connection, panics caught, in the attempt's span, within its time | `crate::attempt` (`guard.rs`, `run.rs`) | — |
//! | 11 | settle: record the answer, release the key, or hand the operation to recovery | `crate::attempt` (`settle.rs`, `transactional.rs`) | — |
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
mod look;
mod read;
mod register;
mod rejection;
mod significant;

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use futures_util::future::BoxFuture;
use http::request::Parts;
use idem_contract::Contract;
use tracing::Instrument;

pub(crate) use self::admit::admit;
use self::look::Seen;
pub use self::rejection::Rejection;
pub use crate::attempt::{Attempt, Guard};
use crate::fault::TestFault;
use crate::fingerprint::Fingerprints;
use crate::mode::Mode;
pub use crate::operation::{Contracted, HandlerMode};
use crate::operation::{OperationRef, Recover};
use crate::reconcile::Recoverer;
use crate::store::RecordKey;
use crate::telemetry::AttemptTelemetry;
use crate::{Idem, OperationId, answer, fault};

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
    ///
    /// Only the handler's own extractor (stage 6) and the recoverer depend on the
    /// handler's types: the stages before and after it (`Extraction::prepare`,
    /// `Extraction::hold`) are compiled once for every handler rather than once per
    /// handler.
    async fn from_request(request: Request, state: &S) -> Result<Self, Rejection> {
        let extraction = Extraction::start(C::CONTRACT, &request);
        let (extraction, parts, bytes, prepared) =
            extraction.prepare(request, OperationRef::of::<C>()).await?;
        let inner = inner::inner::<S, E, M>(parts, bytes, state).await;
        let inner = match inner.map_err(Rejection::refused) {
            Ok(inner) => inner,
            Err(rejection) => return Err(extraction.answered(rejection)),
        };
        let recoverer = || C::recoverer(state);
        let guard = extraction.hold(prepared, &recoverer).await?;
        Ok(Enforced {
            inner,
            guard,
            contract: PhantomData,
        })
    }
}

/// The stages that do not depend on the handler's types, as a boxed future: a handler's
/// future that held theirs by value would make every handler compile their layout and
/// drop glue again (most of what a contracted handler added to the build).
type Stages<'a, T> = BoxFuture<'a, Result<T, Rejection>>;

/// One request's way through the stages, with its telemetry: the part of
/// [`Enforced::from_request`] that is the same for every handler.
struct Extraction {
    telemetry: AttemptTelemetry,
}

impl Extraction {
    fn start(contract: &'static Contract, request: &Request) -> Extraction {
        Extraction {
            telemetry: AttemptTelemetry::start(contract, request),
        }
    }

    fn span(&self) -> tracing::Span {
        self.telemetry.span().clone()
    }

    /// Stages 1 to 5 ([`prepare`]), in the attempt's span.
    fn prepare(
        mut self,
        request: Request,
        operation: OperationRef,
    ) -> Stages<'static, (Extraction, Parts, Bytes, Prepared)> {
        Box::pin(async move {
            let span = self.span();
            match prepare(request, operation, &mut self.telemetry)
                .instrument(span)
                .await
            {
                Ok((parts, bytes, prepared)) => Ok((self, parts, bytes, prepared)),
                Err(rejection) => Err(self.answered(rejection)),
            }
        })
    }

    /// Stages 7 to 9 ([`Prepared::hold`]), in the attempt's span; the guard carries the
    /// telemetry on into the handler's run.
    fn hold(
        self,
        prepared: Prepared,
        make_recoverer: &(dyn Fn() -> Recoverer + Sync),
    ) -> Stages<'_, Guard> {
        Box::pin(async move {
            let span = self.span();
            match prepared.hold(make_recoverer).instrument(span).await {
                Ok(mut guard) => {
                    let mut telemetry = self.telemetry;
                    telemetry.registered(guard.operation_id(), guard.attempt());
                    guard.observe(telemetry);
                    Ok(guard)
                }
                Err(rejection) => Err(self.answered(rejection)),
            }
        })
    }

    /// Ends the telemetry with the answer `rejection` is, and returns it.
    fn answered(self, rejection: Rejection) -> Rejection {
        match &rejection {
            Rejection::Problem(problem) => self.telemetry.answered_problem(problem),
            Rejection::Replayed(response)
            | Rejection::Accepted(response)
            | Rejection::Recovered(response)
            | Rejection::Refused(response) => self.telemetry.answered(response),
        }
        rejection
    }
}

/// A request through stages 1 to 5: what registration needs of it.
struct Prepared {
    idem: Idem,
    contract: &'static Contract,
    key: Arc<RecordKey>,
    fingerprint: Fingerprints,
    mode: Mode,
    fault: Option<TestFault>,
    /// The record stage 5 read, if it read one.
    seen: Seen,
}

/// Stages 1 to 5: admits the request for `operation`, reads its key, its body and what
/// counts as the same request, and answers a completed key where its record is read
/// first. Returns the request's parts and body for the handler's extractor, and the rest
/// for registration.
async fn prepare(
    request: Request,
    operation: OperationRef,
    telemetry: &mut AttemptTelemetry,
) -> Result<(Parts, Bytes, Prepared), Rejection> {
    let contract = operation.contract;
    let (mut parts, body) = request.into_parts();
    let admitted = admit(&parts, &operation)?;
    telemetry.set_metrics(&admitted.claim.metrics);
    let names = admitted.serde_names(&contract.operation)?;
    let client = admitted.identify(&parts)?;
    let header_key = key::from_header(&parts.headers, names, contract)?;
    let read = read::read(&mut parts, body, contract).await?;
    let same = significant::significant(&parts, &read, names, header_key, contract)?;
    let mode = Mode::of(&parts.extensions);
    let fault = fault::requested(admitted.idem.test_faults(), &parts.headers)
        .map_err(answer::body_malformed)?;
    let key = Arc::new(RecordKey::new(
        contract.operation.as_ref(),
        client,
        same.key,
    ));
    let seen = look::look(&admitted.idem, contract, &key, &same.fingerprint).await?;
    let prepared = Prepared {
        idem: admitted.idem,
        contract,
        key,
        fingerprint: same.fingerprint,
        mode,
        fault,
        seen,
    };
    Ok((parts, read.bytes, prepared))
}

impl Prepared {
    /// Stages 7 to 9: the mode's right to begin, the key claimed (or the answer from its
    /// record), the attempt's transaction begun. `make_recoverer` makes the contract's
    /// recoverer, for a takeover.
    async fn hold(
        self,
        make_recoverer: &(dyn Fn() -> Recoverer + Sync),
    ) -> Result<Guard, Rejection> {
        let Prepared {
            idem,
            contract,
            key,
            fingerprint,
            mode,
            fault,
            seen,
        } = self;
        // The operation id of a new record, known before the key is registered: SQLite's
        // one commit marks the key in flight with it at stage 7.
        let id = OperationId::new();
        let seen = begin::reserve(&mode, &idem, contract, &key, seen, id).await?;
        let held = register::register(
            &idem,
            contract,
            &key,
            &fingerprint,
            register::Looked {
                seen,
                operation_id: id,
            },
            &mode,
            make_recoverer,
        )
        .await?;
        let held = begin::begin(mode, held, contract).await?;
        Ok(Guard::new(held, fault))
    }
}
