//! Recovery of operations whose outcome is unknown.
//!
//! An attempt that ends without an answer (a crash, a panic, the server's deadline, a
//! dropped connection) leaves its record *processing* under a lease. When the lease has
//! ended, the next request with the key (or a status lookup, or the
//! reconciler, below, without waiting for either) takes the lease over with
//! one compare-and-set, so exactly one caller recovers each ended lease, and asks the
//! contract's recoverer. An attempt still at work under the same [`Idem`] handle (a
//! handler blocking its thread past its lease) keeps its lease until it has ended: its
//! effect may still be on the way, and recovering it then could run the operation twice.
//!
//! | recoverer says | what happens |
//! |---|---|
//! | [`Decision::Applied`]`(response)` | the effect happened: `response` is stored as the result and replayed |
//! | [`Decision::NotApplied`] | the effect did not happen: the request runs the handler as the next attempt (a status lookup releases the key instead, so the client's next retry runs) |
//! | [`Decision::Unknown`]`(reason)` | parked as `unknown` with `reason`: 409 `operation-outcome-unknown` until an operator resolves it (`idem ops resolve`, [`OperatorStore::resolve`](crate::store::OperatorStore::resolve)) |
//! | [`Decision::CannotDecideNow`]`(reason)` | nothing is recorded and the lease ends at once: 503 `recovery-pending`, and the next retry, status lookup or reconciler pass asks again |
//! | the reconcile function panics or outlasts the lease | as `CannotDecideNow`, with a reason that says so |
//! | `recovery = manual("runbook")` | parked as `unknown` with the runbook; in the transactional mode, not applied (an attempt that did not commit took no effect in the database) |
//!
//! Only an explicit `Unknown`, or `manual(..)`, parks an operation. When the store write
//! a decision needs fails (complete, park, the end of the lease), the answer is 503
//! `store-unavailable` and the operation stays recoverable.
//!
//! The reconcile function runs in a task of its own, so a client that hangs up does not
//! cancel it halfway.
//!
//! # The reconciler
//!
//! Without it, an operation whose attempt died is recovered when its key is seen again (a
//! retry or a status lookup). A service that registers its recoverers with the handle
//! and spawns the reconciler has every ended lease recovered within one period, whether
//! or not the client comes back:
//!
//! ```
//! use std::time::Duration;
//! use idem_runtime::{Idem, identity, store::MemoryStore};
//! # use idem_runtime::enforce::Contracted;
//! # use idem_runtime::recovery::{Decision, Recover, Recoverer, UnknownOperation};
//! # pub mod create_order { pub struct Operation; }
//! # impl Contracted for create_order::Operation {
//! #     const CONTRACT: &'static idem_contract::Contract = &idem_contract::Contract::PLACEHOLDER;
//! # }
//! # impl Recover<AppState> for create_order::Operation {
//! #     fn recoverer(state: &AppState) -> Recoverer {
//! #         Recoverer::reconcile_with(state.clone(), |_: AppState, _: UnknownOperation| async {
//! #             Decision::NotApplied
//! #         })
//! #     }
//! # }
//! #[derive(Clone)]
//! struct AppState { /* the business database's pool */ }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let state = AppState {};
//! let idem = Idem::builder(MemoryStore::new(), identity::header("x-client-id"))
//!     // The reconcile function of `create_order`, with the router's state.
//!     .recover_with::<create_order::Operation, _>(&state)
//!     .build();
//! let reconciler = idem.spawn_reconciler(Duration::from_secs(10));
//! // let app = axum::Router::new() /* .route(…) */ .with_state(state).layer(idem.layer());
//! # reconciler.abort();
//! # }
//! ```
//!
//! Each pass lists, per registered operation, the processing records whose lease has ended
//! ([`OperatorStore::list`](crate::store::OperatorStore::list)), takes each over with one
//! compare-and-set ([`RecordStore::take_over`](crate::store::RecordStore::take_over): a new
//! fencing token, so exactly one of many instances recovers it, and the worker whose lease
//! ended can no longer write), asks the recoverer once, and records the decision exactly as
//! a status lookup does (the table above): applied is stored as the result, not applied
//! releases the key (the client's next retry runs the handler), unknown parks it for an
//! operator (`idem ops resolve`), and "cannot decide now" leaves it for the next pass. An
//! attempt still alive in this process is left alone. An operation under
//! `recovery = resume` is left to the client's retry until the contract's deadline (plus
//! one attempt's time) has passed; then it is released when its step journal is empty,
//! and parked for an operator, its steps named, when not.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use axum::response::Response;
use futures_util::FutureExt;
use idem_contract::{Contract, Recovery};
use tracing::Instrument;

use crate::Idem;
use crate::answer;
use crate::attempt::Held;
pub use crate::operation::Recover;
use crate::reconcile::ReconcileFn;
pub use crate::reconcile::{
    Decision, Reconcile, ReconcileWith, ReconcilerPass, Recoverer, UnknownOperation,
};
use crate::store::{Lease, OwnerToken, Record, RecordKey, StoreError};

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
        Recovery::Resume => "resumed recovery: the handler was not run again".into(),
    }
}

/// Takes over the ended lease of `record` and asks the recoverer once (see the module
/// docs). `make_recoverer` is called only by the caller that wins the takeover.
pub(crate) async fn recover<F>(
    idem: &Idem,
    contract: &'static Contract,
    key: &Arc<RecordKey>,
    record: &Record,
    make_recoverer: &mut Option<F>,
) -> Recovered
where
    F: FnOnce() -> Recoverer,
{
    let Some(expired) = record.lease() else {
        return Recovered::Lost;
    };
    let now = idem.now().await;
    let started = tokio::time::Instant::now();
    let lease = Lease {
        token: OwnerToken::random(),
        until: now.saturating_add(
            u64::try_from(idem.lease_for(contract).as_millis()).unwrap_or(u64::MAX),
        ),
    };
    let taken = match idem.store().take_over(key, expired.token, lease, now).await {
        Ok(taken) => taken,
        Err(StoreError::LeaseLost) => return Recovered::Lost,
        Err(error) => return Recovered::Failed(error),
    };
    let Some(make_recoverer) = make_recoverer.take() else {
        // Unreachable in practice: one request wins at most one takeover per round.
        return Recovered::Failed(StoreError::Corrupt("recovery ran twice".into()));
    };
    let (id, number) = (taken.operation_id, taken.attempt);
    let attempt = Held::start(idem, contract, key, lease.token, started, id, number);
    tracing::warn!(
        operation = %contract.operation,
        operation_id = %taken.operation_id,
        attempt = record.attempt,
        outcome = "unknown",
        "idem: an attempt's lease ended without an outcome; recovering"
    );
    match make_recoverer().reconcile {
        Some(reconcile) => {
            reconcile_in_task(attempt, reconcile, unknown(contract, key, record)).await
        }
        None => without_reconcile(attempt, record).await,
    }
}

/// The operation as a reconcile function is given it.
fn unknown(contract: &Contract, key: &RecordKey, record: &Record) -> UnknownOperation {
    UnknownOperation {
        operation: contract.operation.to_string(),
        operation_id: record.operation_id,
        client: key.client.clone(),
        key: key.key.clone(),
        fingerprint: record.fingerprint.clone(),
        attempt: record.attempt,
        started_at: record.created_at,
    }
}

/// `manual(..)` recovery: parked for an operator, unless the attempt ran in the
/// transactional mode, which did not commit and so took no effect in the database.
/// `resume`: the request runs the handler as the next attempt, its journal's steps
/// replayed or sent again under the same downstream keys.
async fn without_reconcile(attempt: Held, record: &Record) -> Recovered {
    if matches!(attempt.contract.recovery, Recovery::Resume) {
        tracing::info!(
            operation = %attempt.contract.operation,
            operation_id = %attempt.operation_id,
            attempt = attempt.attempt,
            outcome = "resumed",
            "idem: the attempt ended without an outcome; the operation resumes from its step journal"
        );
        return Recovered::Run(attempt);
    }
    if !record.transactional {
        let reason = manual_reason(attempt.contract);
        return Recovered::Answer(attempt.park(&reason).await);
    }
    tracing::info!(
        operation = %attempt.contract.operation,
        operation_id = %attempt.operation_id,
        attempt = attempt.attempt,
        outcome = "not_applied",
        "idem: the attempt ran in the transactional mode and did not commit; it is run again"
    );
    Recovered::Run(attempt)
}

/// Runs [`decide`] in a task of its own, so that a client that hangs up does not cancel
/// it halfway.
async fn reconcile_in_task(
    attempt: Held,
    reconcile: ReconcileFn,
    op: UnknownOperation,
) -> Recovered {
    let (idem, operation_id) = (attempt.idem.clone(), attempt.operation_id);
    match tokio::spawn(decide(attempt, reconcile, op).in_current_span()).await {
        Ok(recovered) => recovered,
        Err(_) => Recovered::Answer(answer::recovery_pending(
            &idem,
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
        Ok(Ok(Decision::Applied(response))) => {
            tracing::info!(
                operation = %attempt.contract.operation,
                operation_id = %attempt.operation_id,
                attempt = attempt.attempt,
                outcome = "applied",
                "idem: recovery found the operation applied"
            );
            Recovered::Answer(attempt.complete_applied(response).await)
        }
        Ok(Ok(Decision::NotApplied)) => {
            tracing::info!(
                operation = %attempt.contract.operation,
                operation_id = %attempt.operation_id,
                attempt = attempt.attempt,
                outcome = "not_applied",
                "idem: recovery found the operation not applied"
            );
            Recovered::Run(attempt)
        }
        Ok(Ok(Decision::Unknown(reason))) => Recovered::Answer(attempt.park(&reason).await),
        Ok(Ok(Decision::CannotDecideNow(reason))) => {
            Recovered::Answer(attempt.postpone(&reason).await)
        }
        Ok(Err(_panic)) => {
            tracing::error!(
                operation = %attempt.contract.operation,
                operation_id = %attempt.operation_id,
                "idem: the reconcile function panicked"
            );
            Recovered::Answer(attempt.postpone("the reconcile function panicked").await)
        }
        Err(_elapsed) => {
            let reason = format!(
                "the reconcile function did not finish within the lease of {}",
                attempt.contract.lease()
            );
            Recovered::Answer(attempt.postpone(&reason).await)
        }
    }
}
