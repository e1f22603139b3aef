//! Recovery of operations whose outcome is unknown.
//!
//! An attempt that ends without an answer (a crash, a panic, the server's deadline, a
//! dropped connection) leaves its record *processing* under a lease. When the lease has
//! ended, the next request with the key (or a status lookup) takes the lease over with
//! one compare-and-set, so exactly one caller recovers each ended lease, and asks the
//! contract's recoverer. An attempt still at work under the same [`Idem`] handle (a
//! handler blocking its thread past its lease) keeps its lease until it has ended: its
//! effect may still be on the way, and recovering it then could run the operation twice.
//!
//! | recoverer says | what happens |
//! |---|---|
//! | [`Resolution::Applied`]`(response)` | the effect happened: `response` is stored as the result and replayed |
//! | [`Resolution::NotApplied`] | the effect did not happen: the request runs the handler as the next attempt (a status lookup releases the key instead, so the client's next retry runs) |
//! | [`Resolution::Unknown`]`(reason)` | parked as `unknown` with `reason`: 409 `operation-outcome-unknown` until an operator resolves it |
//! | `recovery = manual("runbook")` | parked as `unknown` with the runbook |
//! | the reconcile function panics or outlasts the lease | parked as `unknown` |
//!
//! The reconcile function runs in a task of its own, so a client that hangs up does not
//! cancel it halfway.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use idem_contract::{Contract, Recovery};

use crate::enforce::answer;
use crate::enforce::guard::Held;
use crate::store::{Lease, OwnerToken, Record, RecordKey, StoreError, UnixMillis, unix_now};
use crate::{Idem, OperationId};

/// An operation that the macro made from a contracted handler: `create_order::Operation`.
///
/// Implemented by `#[idem::contract(..)]`; write it by hand only for a handler without
/// the macro.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a contracted operation",
    note = "`#[idem::contract(..)]` on `async fn create_order` makes `create_order::Operation`: name that type"
)]
pub trait Contracted: Send + Sync + 'static {
    /// The operation's contract.
    const CONTRACT: &'static Contract;

    /// The member names of the JSON body type as serde reads them (after `rename` and
    /// `rename_all`), when the handler takes `Json<T>` of a struct: the fingerprint's
    /// fields and a body key are looked up under these names. `None` (the default) takes
    /// the contract's field names as they are. The macro implements it with
    /// [`crate::__private::serde_fields`].
    fn body_fields() -> Option<&'static [&'static str]> {
        None
    }
}

/// How a contracted operation recovers, given the router's state `S`.
///
/// The macro implements it from `recovery = ..`: a reconcile function gets the
/// handler's `State<T>` (through `FromRef<S>`), `manual(..)` needs no state.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot recover with the router state `{S}`",
    note = "the reconcile function's state type must be reachable from the router's state through `axum::extract::FromRef`"
)]
pub trait Recover<S>: Contracted {
    /// The recoverer, made from the router's state.
    fn recoverer(state: &S) -> Recoverer;
}

/// What a reconcile function decided about an operation whose outcome was unknown.
#[derive(Debug)]
pub enum Resolution {
    /// The effect happened; this is the answer the first attempt would have given (build
    /// it from the business data). It is stored and replayed like a handler's answer.
    Applied(Response),
    /// The effect did not happen: running the handler again is safe.
    NotApplied,
    /// The reconcile function cannot tell: the operation is parked as `unknown` with this
    /// reason for an operator.
    Unknown(String),
}

impl Resolution {
    /// [`Resolution::Applied`] from anything that is a response.
    pub fn applied(response: impl IntoResponse) -> Resolution {
        Resolution::Applied(response.into_response())
    }

    /// [`Resolution::Unknown`] with `reason`.
    pub fn unknown(reason: impl Into<String>) -> Resolution {
        Resolution::Unknown(reason.into())
    }
}

/// The operation a reconcile function must decide about.
#[derive(Clone)]
#[non_exhaustive]
pub struct UnknownOperation {
    /// The contract's operation, such as `create_order`.
    pub operation: String,
    /// The operation id, as the first attempt's answer (if any) carried it.
    pub operation_id: OperationId,
    /// The client's identity.
    pub client: String,
    /// The idempotency key: find the business record written under it.
    pub key: String,
    /// The fingerprint of the significant content.
    pub fingerprint: String,
    /// The attempt whose outcome is unknown (1 for the first).
    pub attempt: u32,
    /// When the operation was first registered, in unix milliseconds.
    pub started_at: UnixMillis,
}

impl std::fmt::Debug for UnknownOperation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnknownOperation")
            .field("operation", &self.operation)
            .field("operation_id", &self.operation_id)
            .field("attempt", &self.attempt)
            .field("started_at", &self.started_at)
            .finish_non_exhaustive()
    }
}

/// A reconcile function that takes the handler's state:
/// `async fn(state: T, op: UnknownOperation) -> Resolution`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a reconcile function for the state `{T}`",
    label = "not a reconcile function",
    note = "a reconcile function is `async fn(state: T, op: idem::UnknownOperation) -> idem::Resolution`, where `T` is the handler's `State<T>` type"
)]
pub trait ReconcileWith<T>: Send + 'static {
    /// Calls the function.
    fn call(self, state: T, op: UnknownOperation) -> BoxFuture<'static, Resolution>;
}

impl<T, F, Fut> ReconcileWith<T> for F
where
    T: Send + 'static,
    F: FnOnce(T, UnknownOperation) -> Fut + Send + 'static,
    Fut: Future<Output = Resolution> + Send + 'static,
{
    fn call(self, state: T, op: UnknownOperation) -> BoxFuture<'static, Resolution> {
        Box::pin(self(state, op))
    }
}

/// A reconcile function without state: `async fn(op: UnknownOperation) -> Resolution`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a reconcile function",
    label = "not a reconcile function",
    note = "a reconcile function is `async fn(op: idem::UnknownOperation) -> idem::Resolution`, or `async fn(state: T, op: idem::UnknownOperation) -> idem::Resolution` for a handler with `State<T>`"
)]
pub trait Reconcile: Send + 'static {
    /// Calls the function.
    fn call(self, op: UnknownOperation) -> BoxFuture<'static, Resolution>;
}

impl<F, Fut> Reconcile for F
where
    F: FnOnce(UnknownOperation) -> Fut + Send + 'static,
    Fut: Future<Output = Resolution> + Send + 'static,
{
    fn call(self, op: UnknownOperation) -> BoxFuture<'static, Resolution> {
        Box::pin(self(op))
    }
}

type ReconcileFn = Box<dyn FnOnce(UnknownOperation) -> BoxFuture<'static, Resolution> + Send>;

/// The contract's recovery, ready to run: a reconcile function (with its state) or the
/// manual path. Made by [`Recover::recoverer`].
pub struct Recoverer {
    reconcile: Option<ReconcileFn>,
}

impl Recoverer {
    /// A reconcile function that takes the handler's state `state`.
    pub fn reconcile_with<T, F>(state: T, f: F) -> Recoverer
    where
        T: Send + 'static,
        F: ReconcileWith<T>,
    {
        Recoverer {
            reconcile: Some(Box::new(move |op| f.call(state, op))),
        }
    }

    /// A reconcile function without state.
    pub fn reconcile<F: Reconcile>(f: F) -> Recoverer {
        Recoverer {
            reconcile: Some(Box::new(move |op| f.call(op))),
        }
    }

    /// Manual recovery: park the operation as `unknown` with the contract's runbook.
    pub fn manual() -> Recoverer {
        Recoverer { reconcile: None }
    }
}

impl std::fmt::Debug for Recoverer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.reconcile.is_some() {
            "Recoverer::Reconcile"
        } else {
            "Recoverer::Manual"
        })
    }
}

/// What the recovery of one ended lease came to.
pub(crate) enum Recovered {
    /// Not applied: the caller holds a fresh lease on the record, as this attempt.
    Run(Held),
    /// Decided: applied (stored and replayed) or parked as unknown; this is the answer.
    Answer(Response),
    /// Someone else took the lease over first (or the record changed): look again.
    Lost,
    /// The store failed.
    Failed(StoreError),
}

/// The reason parked with `manual(..)`.
fn manual_reason(contract: &Contract) -> String {
    match &contract.recovery {
        Recovery::Manual { runbook } => {
            format!("manual recovery: an operator resolves it by following the runbook {runbook}")
        }
        Recovery::Reconcile { function } => {
            format!("manual recovery: no reconcile function ran (`{function}`)")
        }
    }
}

/// Takes over the ended lease of `record` and asks the recoverer once (see the module
/// docs). `make_recoverer` is called only by the caller that wins the takeover.
pub(crate) async fn recover<F>(
    idem: &Idem,
    contract: &'static Contract,
    key: &RecordKey,
    record: &Record,
    make_recoverer: &mut Option<F>,
) -> Recovered
where
    F: FnOnce() -> Recoverer,
{
    let Some(expired) = record.lease() else {
        return Recovered::Lost;
    };
    let lease_len = contract.lease();
    let now = unix_now();
    let lease = Lease {
        token: OwnerToken::random(),
        until: now.saturating_add(lease_len.as_millis()),
    };
    let deadline = tokio::time::Instant::now() + lease_len.to_std();
    let taken = match idem.store().take_over(key, expired.token, lease, now).await {
        Ok(taken) => taken,
        Err(StoreError::LeaseLost) => return Recovered::Lost,
        Err(error) => return Recovered::Failed(error),
    };
    let Some(make_recoverer) = make_recoverer.take() else {
        // Unreachable in practice: one request wins at most one takeover per round.
        return Recovered::Failed(StoreError::Corrupt("recovery ran twice".into()));
    };
    let attempt = Held {
        idem: idem.clone(),
        contract,
        key: key.clone(),
        token: lease.token,
        deadline,
        operation_id: taken.operation_id,
        attempt: taken.attempt,
        _alive: idem.running().enter(lease.token),
    };
    tracing::warn!(
        operation = %contract.operation,
        operation_id = %taken.operation_id,
        attempt = record.attempt,
        outcome = "unknown",
        "idem: an attempt's lease ended without an outcome; recovering"
    );
    let op = UnknownOperation {
        operation: contract.operation.to_string(),
        operation_id: record.operation_id,
        client: key.client.clone(),
        key: key.key.clone(),
        fingerprint: record.fingerprint.clone(),
        attempt: record.attempt,
        started_at: record.created_at,
    };
    let Some(reconcile) = make_recoverer().reconcile else {
        let reason = manual_reason(contract);
        return Recovered::Answer(attempt.park(&reason).await);
    };
    let operation_id = attempt.operation_id;
    match tokio::spawn(decide(attempt, reconcile, op)).await {
        Ok(recovered) => recovered,
        Err(_) => Recovered::Answer(answer::outcome_unknown(
            operation_id,
            "recovery was interrupted; it runs again when the lease ends",
        )),
    }
}

/// Runs the reconcile function under the new lease and acts on its resolution.
async fn decide(attempt: Held, reconcile: ReconcileFn, op: UnknownOperation) -> Recovered {
    let deadline = attempt.deadline;
    let resolution = match std::panic::catch_unwind(AssertUnwindSafe(move || reconcile(op))) {
        Ok(future) => {
            tokio::time::timeout_at(deadline, AssertUnwindSafe(future).catch_unwind()).await
        }
        Err(panic) => Ok(Err(panic)),
    };
    match resolution {
        Ok(Ok(Resolution::Applied(response))) => {
            tracing::info!(
                operation = %attempt.contract.operation,
                operation_id = %attempt.operation_id,
                attempt = attempt.attempt,
                outcome = "applied",
                "idem: recovery found the operation applied"
            );
            Recovered::Answer(attempt.complete_applied(response).await)
        }
        Ok(Ok(Resolution::NotApplied)) => {
            tracing::info!(
                operation = %attempt.contract.operation,
                operation_id = %attempt.operation_id,
                attempt = attempt.attempt,
                outcome = "not_applied",
                "idem: recovery found the operation not applied"
            );
            Recovered::Run(attempt)
        }
        Ok(Ok(Resolution::Unknown(reason))) => Recovered::Answer(attempt.park(&reason).await),
        Ok(Err(_panic)) => {
            tracing::error!(
                operation = %attempt.contract.operation,
                operation_id = %attempt.operation_id,
                "idem: the reconcile function panicked"
            );
            Recovered::Answer(attempt.park("the reconcile function panicked").await)
        }
        Err(_elapsed) => {
            let reason = format!(
                "the reconcile function did not finish within the lease of {}",
                attempt.contract.lease()
            );
            Recovered::Answer(attempt.park(&reason).await)
        }
    }
}
