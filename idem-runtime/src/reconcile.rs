//! What a reconcile function is, what it is given and what it answers: the types of the
//! contract's `recovery` property. [`crate::recovery`] says what the runtime does with
//! each answer.

use std::future::Future;

use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;

use crate::OperationId;
use crate::store::UnixMillis;

/// What a reconcile function decided about an operation whose outcome was unknown.
#[derive(Debug)]
pub enum Decision {
    /// The effect happened; this is the answer the first attempt would have given (build
    /// it from the business data). It is stored and replayed like a handler's answer.
    Applied(Response),
    /// The effect did not happen: running the handler again is safe.
    NotApplied,
    /// The reconcile function looked and cannot tell (the business data is there but
    /// says neither): the operation is parked as `unknown` with this reason for an
    /// operator, and answers 409 `operation-outcome-unknown` until then.
    Unknown(String),
    /// The reconcile function cannot decide now, with this reason: the business data
    /// could not be read (a database that is down, a timeout). Nothing is recorded; the
    /// operation stays recoverable, the client gets 503 `recovery-pending` with
    /// `Retry-After`, and the next retry or status lookup asks again.
    CannotDecideNow(String),
}

impl Decision {
    /// [`Decision::Applied`] from anything that is a response.
    pub fn applied(response: impl IntoResponse) -> Decision {
        Decision::Applied(response.into_response())
    }

    /// [`Decision::Unknown`] with `reason`.
    pub fn unknown(reason: impl Into<String>) -> Decision {
        Decision::Unknown(reason.into())
    }

    /// [`Decision::CannotDecideNow`] with `reason`, such as the error that kept the
    /// business data from being read.
    pub fn cannot_decide_now(reason: impl Into<String>) -> Decision {
        Decision::CannotDecideNow(reason.into())
    }
}

/// The operation a reconcile function must decide about.
#[derive(Clone)]
#[non_exhaustive]
pub struct UnknownOperation {
    /// The contract's operation, such as `create_order`.
    pub operation: String,
    /// The operation id, as every attempt's answer carried it: find the business record
    /// written under it. (Not the key alone: after its TTL a key names a new operation,
    /// and must not find an older one's effect.)
    pub operation_id: OperationId,
    /// The client's identity.
    pub client: String,
    /// The idempotency key, as the client meant it.
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
/// `async fn(state: T, op: UnknownOperation) -> Decision`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a reconcile function for the state `{T}`",
    label = "named in `recovery = ..`: not a reconcile function",
    note = "a reconcile function is `async fn(state: T, op: idem::UnknownOperation) -> idem::Decision`, where `T` is the handler's `State<T>` type"
)]
pub trait ReconcileWith<T>: Send + 'static {
    /// Calls the function.
    fn call(self, state: T, op: UnknownOperation) -> BoxFuture<'static, Decision>;
}

impl<T, F, Fut> ReconcileWith<T> for F
where
    T: Send + 'static,
    F: FnOnce(T, UnknownOperation) -> Fut + Send + 'static,
    Fut: Future<Output = Decision> + Send + 'static,
{
    fn call(self, state: T, op: UnknownOperation) -> BoxFuture<'static, Decision> {
        Box::pin(self(state, op))
    }
}

/// A reconcile function without state: `async fn(op: UnknownOperation) -> Decision`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a reconcile function",
    label = "named in `recovery = ..`: not a reconcile function",
    note = "a reconcile function is `async fn(op: idem::UnknownOperation) -> idem::Decision`, or `async fn(state: T, op: idem::UnknownOperation) -> idem::Decision` for a handler with `State<T>`"
)]
pub trait Reconcile: Send + 'static {
    /// Calls the function.
    fn call(self, op: UnknownOperation) -> BoxFuture<'static, Decision>;
}

impl<F, Fut> Reconcile for F
where
    F: FnOnce(UnknownOperation) -> Fut + Send + 'static,
    Fut: Future<Output = Decision> + Send + 'static,
{
    fn call(self, op: UnknownOperation) -> BoxFuture<'static, Decision> {
        Box::pin(self(op))
    }
}

pub(crate) type ReconcileFn =
    Box<dyn FnOnce(UnknownOperation) -> BoxFuture<'static, Decision> + Send>;

/// The contract's recovery, ready to run: a reconcile function (with its state) or the
/// manual path. Made by [`Recover::recoverer`](crate::recovery::Recover::recoverer).
pub struct Recoverer {
    pub(crate) reconcile: Option<ReconcileFn>,
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

/// What one pass of the reconciler did ([`Idem::reconcile`](crate::Idem::reconcile)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReconcilerPass {
    /// Records found with an ended lease.
    pub found: u64,
    /// Taken over and decided by this pass (applied, not applied, parked, or postponed
    /// because the recoverer could not decide now).
    pub recovered: u64,
    /// Taken over or finished by someone else first (another instance, a retry).
    pub lost: u64,
    /// Left alone: an attempt still alive in this process holds them.
    pub alive: u64,
    /// Left alone: operations under `recovery = resume` whose contract's deadline has
    /// not passed, which the client's retry resumes (after the deadline the reconciler
    /// releases one without steps and parks one with steps for an operator).
    pub waiting: u64,
    /// The store failed while recovering them; the next pass tries again.
    pub failed: u64,
}
