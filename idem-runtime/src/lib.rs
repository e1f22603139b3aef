//! The idem runtime: enforcement of the failure contract of critical commands on axum
//! handlers, and the stores behind it.
//!
//! Users reach this crate through `idem`, whose `#[idem::contract(..)]` attribute writes
//! the enforcement code below for them. A service needs three things from the runtime:
//!
//! 1. an [`Idem`] handle: a [`store`] and a way to tell clients apart
//!    ([`identity`]);
//! 2. its layer on the router, [`Idem::layer`], so that every request carries the handle;
//! 3. contracted handlers (made by the macro, or written by hand with
//!    [`enforce::Enforced`]) and their status lookups ([`Lookup`]).
//!
//! Every answer of idem's table (`docs/answers.md`) is produced here: a replay with
//! `Idempotent-Replayed: true`, the [problems](problem) (400, 401, 409, 422, 503) with a
//! stable `type` each, the concurrency answers, recovery of operations whose outcome is
//! unknown ([`recovery`]), and fail-closed 503s when the store fails. Every answer carries
//! the `Operation-Id` header.
//!
//! # Example, written by hand
//!
//! What the macro generates for a contracted handler, spelled out: the contract as a
//! `const`, the operation type, and a handler that takes [`enforce::Enforced`] and runs
//! its body through [`enforce::Guard::run`].
//!
//! ```
//! use std::borrow::Cow;
//! use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
//!
//! use axum::{Json, Router, extract::{Path, State}, http::StatusCode, response::Response, routing::{get, post}};
//! use idem_contract::*;
//! use idem_runtime::enforce::{Contracted, Enforced};
//! use idem_runtime::recovery::{Decision, Recover, Recoverer, UnknownOperation};
//! use idem_runtime::{Idem, Lookup, OperationStatus, identity, store::MemoryStore};
//!
//! #[derive(Clone, Default)]
//! struct App { orders: Arc<AtomicUsize> }
//!
//! // `create_order::CONTRACT` and `create_order::Operation`.
//! const CONTRACT: Contract = Contract {
//!     operation: Cow::Borrowed("create_order"),
//!     key_scope: KeyScope::CLIENT,
//!     fingerprint: Fingerprint::Fields(Cow::Borrowed(&[FieldPath::from_static("amount")])),
//!     fingerprint_query: Cow::Borrowed(&[]),
//!     ttl: Duration::from_millis(86_400_000),
//!     deadline: Deadline { total: Duration::from_millis(30_000), per_attempt: None },
//!     max_attempts: 4,
//!     retryable: Cow::Borrowed(&[Retryable::Status(StatusCode(503))]),
//!     concurrency: Concurrency::Conflict { retry_after: DEFAULT_CONFLICT_RETRY_AFTER },
//!     status_lookup: StatusLookup {
//!         handler: Cow::Borrowed("order_status"),
//!         path: Some(Cow::Borrowed("/orders/operations/{key}")),
//!     },
//!     recovery: Recovery::Reconcile { function: Cow::Borrowed("reconcile_order") },
//! };
//! struct CreateOrder;
//! impl Contracted for CreateOrder {
//!     const CONTRACT: &'static Contract = &CONTRACT;
//! }
//! impl Recover<App> for CreateOrder {
//!     fn recoverer(state: &App) -> Recoverer {
//!         Recoverer::reconcile_with(state.clone(), reconcile_order)
//!     }
//! }
//!
//! async fn reconcile_order(app: App, op: UnknownOperation) -> Decision {
//!     // Look for the order written under `op.key`; here: none was written.
//!     Decision::NotApplied
//! }
//!
//! async fn create_order(
//!     State(app): State<App>,
//!     enforced: Enforced<Json<serde_json::Value>, CreateOrder>,
//! ) -> Response {
//!     let (Json(body), guard) = enforced.into_parts();
//!     guard
//!         .run(async move {
//!             let id = app.orders.fetch_add(1, Ordering::SeqCst) + 1;
//!             (StatusCode::CREATED, Json(serde_json::json!({ "id": id, "amount": body["amount"] })))
//!         })
//!         .await
//! }
//!
//! async fn order_status(lookup: Lookup<CreateOrder>, Path(key): Path<String>) -> OperationStatus {
//!     lookup.status(&key).await
//! }
//!
//! let idem = Idem::new(MemoryStore::new(), identity::header("x-client-id"));
//! let app: Router = Router::new()
//!     .route("/orders", post(create_order))
//!     .route("/orders/operations/{key}", get(order_status))
//!     .with_state(App::default())
//!     .layer(idem.layer());
//! ```
//!
//! # How the crate reads
//!
//! A request goes layer → enforcement → store and back, and the modules import one way,
//! each only from the ones below it: [`store`] (and the leaf modules beside it:
//! operation ids, [`problem`], [`identity`]), the recovery types, the operation traits,
//! the [`Idem`] handle, the answers and the replay, the [`transaction`] (with a SQL
//! store), the attempt, [`recovery`], [`enforce`] and [`Lookup`], and the layer on top.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// The modules import one way, a request's path through them, from the store up:
// header, operation_id, store, problem, telemetry, identity, fault, reconcile, operation,
// serde_names, idem, answer, replay, transaction, mode, attempt, recovery, enforce, lookup,
// layer (and fingerprint beside them). `tests/layering.rs` checks it, and which crates of the
// workspace may depend on which.
mod answer;
mod attempt;
pub mod enforce;
mod fault;
pub mod fingerprint;
mod header;
mod idem;
pub mod identity;
mod layer;
mod lookup;
mod mode;
mod operation;
mod operation_id;
pub mod outbox;
pub mod problem;
mod reconcile;
mod reconciler;
pub mod recovery;
mod replay;
mod serde_names;
mod serve;
pub mod store;
pub mod telemetry;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub mod transaction;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

/// The sqlx crate this runtime was built with (features `sqlite` and `postgres`): the
/// transaction's connection ([`transaction::Tx::conn`]) is one of its types, so a handler
/// writes through this sqlx, `sqlx::query(..).execute(&mut *tx.conn().await?)`, with no
/// dependency of its own to keep at the same version. It has sqlx's runtime for tokio,
/// its SQLite and PostgreSQL drivers as the features say, and none of sqlx's own
/// optional features (the `query!` macros, `json`, `uuid`, `chrono`): a service that
/// needs them depends on sqlx itself, at the version `cargo tree -i sqlx` shows.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use sqlx;

pub use idem_contract::headers;

pub use crate::attempt::{Attempt, Journal};

/// The step journal: what a handler calls another system through ([`Journal::step`]),
/// the [`DownstreamKey`](journal::DownstreamKey) it sends, and how a call fails
/// ([`CallError`](journal::CallError), [`StepError`](journal::StepError)). The guide
/// "Calling another system" (`docs/steps.md`) shows a handler that charges a card.
pub mod journal {
    pub use crate::attempt::{CallError, DownstreamKey, Interrupted, Journal, StepError};
}
#[cfg(feature = "testing")]
pub use crate::fault::TestFault;
pub use crate::idem::{Idem, IdemBuilder, NotConfigured, Operations};
pub use crate::layer::{IdemLayer, IdemService};
pub use crate::lookup::{Lookup, OperationReport, OperationStatus};
pub use crate::operation_id::OperationId;
#[doc(no_inline)]
pub use crate::recovery::{Decision, UnknownOperation};
pub use crate::serve::{Serve, serve};
#[doc(no_inline)]
pub use crate::store::MemoryStore;
#[cfg(feature = "postgres")]
#[doc(no_inline)]
pub use crate::store::PostgresStore;
#[cfg(feature = "redis")]
#[doc(no_inline)]
pub use crate::store::RedisStore;
#[cfg(feature = "sqlite")]
#[doc(no_inline)]
pub use crate::store::SqliteStore;
#[cfg(feature = "postgres")]
#[doc(no_inline)]
pub use crate::transaction::PgTx;
#[cfg(feature = "sqlite")]
#[doc(no_inline)]
pub use crate::transaction::SqliteTx;
