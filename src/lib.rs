//! idem makes the failure behaviour of a critical API command — an order, a payment, an
//! application that must happen at most once, however the network fails — a contract
//! that the compiler checks and the server enforces.
//!
//! A timeout tells the client nothing: the order may exist already. So each critical
//! handler declares nine properties with [`#[idem::contract]`](macro@contract): where the
//! idempotency key comes from, which fields are significant, how long results are kept,
//! the deadline, the attempts, what may be retried, what a concurrent duplicate gets, how
//! to look the outcome up, and how an unknown outcome is recovered. An incomplete or
//! inconsistent contract does not compile. The same declaration drives the server-side
//! enforcement (at most one business effect per key, stored results replayed with
//! `Idempotent-Replayed: true`, concurrent duplicates answered, unknown outcomes
//! recovered) and the published OpenAPI extension and consumer docs (feature `codegen`,
//! and the `idem` command).
//!
//! ```
//! use axum::{Json, Router, extract::Path, http::StatusCode, routing::{get, post}};
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! struct CreateOrder { customer_id: String, amount_minor: i64 }
//!
//! #[idem::contract(
//!     key_scope     = client,
//!     fingerprint   = [customer_id, amount_minor],
//!     ttl           = "24h",
//!     deadline      = "30s",
//!     max_attempts  = 4,
//!     retryable     = [429, 503, timeout],
//!     concurrency   = conflict,
//!     status_lookup = order_status(path = "/orders/operations/{key}"),
//!     recovery      = manual("https://runbooks.example.com/orders"),
//! )]
//! async fn create_order(Json(order): Json<CreateOrder>) -> StatusCode {
//!     StatusCode::CREATED
//! }
//!
//! async fn order_status(lookup: idem::Lookup<create_order::Operation>, Path(key): Path<String>) -> idem::OperationStatus {
//!     lookup.status(&key).await
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let idem = idem::Idem::new(idem::SqliteStore::open("orders.db").await?, idem::identity::header("x-client-id"));
//! let app: Router = Router::new()
//!     .route("/orders", post(create_order))
//!     .route("/orders/operations/{key}", get(order_status))
//!     .layer(idem.layer());
//! # Ok(()) }
//! ```
//!
//! # Where to read on
//!
//! - [`contract`](macro@contract): the attribute, property by property.
//! - [`Idem`]: the runtime handle (store, client identity, limits) and its layer.
//! - [`problem`]: every answer idem gives of its own, with its stable `type`.
//! - [`transaction`]: the transactional mode, where a handler's business writes and the
//!   key's final state commit in one transaction ([`SqliteTx`], `PgTx`).
//! - [`store`]: the store trait and its backends ([`MemoryStore`], [`SqliteStore`],
//!   `PostgresStore` with the feature `postgres`, `RedisStore` with the feature `redis`).
//! - [`model`]: the contract as data, its rules ([`check()`](fn@check)) and its JSON Schema.
//! - `testing` (feature `testing`): the Monday test, a conformance harness pointed at a
//!   contracted operation, the test-fault protocol it drives (`Idem::with_test_faults`),
//!   and the checks of its proofs 4 and 5: `TraceCapture` (idem's spans) and
//!   `OperatorCheck` (the store's operator calls).
//!
//! The README lists every answer; [`problem`] every problem type.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "server")]
#[doc = include_str!("../docs/contract.md")]
pub use idem_macros::contract;

/// The contract as plain data: the nine properties, their rules, the contracts file and
/// the JSON Schema of the `x-idempotency` extension (the `idem-contract` crate).
pub mod model {
    pub use idem_contract::{
        ACCEPTED_FORMS, Concurrency, Contract, ContractEntry, ContractsFile,
        DEFAULT_CONFLICT_RETRY_AFTER, Deadline, Duration, DurationError, FieldPath, Fingerprint,
        KeyError, KeyFormat, KeyScope, KeySource, MAX_ATTEMPTS_CEILING, Namespace, Property,
        Recovery, Retryable, StatusCode, StatusLookup, Target, TransportFailure, Violation, check,
        schema,
    };
    pub use idem_contract::{Location, extension, key, lookup, status};
}

pub use idem_contract::{Contract, check};
#[cfg(feature = "redis")]
pub use idem_runtime::RedisStore;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use idem_runtime::Tx;
#[cfg(feature = "server")]
pub use idem_runtime::{
    Attempt, DEFAULT_HEARTBEAT_LEASE, DEFAULT_MAX_STORED_BODY, DEFAULT_REPLAYED_HEADERS,
    DEFAULT_UNAVAILABLE_RETRY_AFTER, IDEMPOTENT_REPLAYED_HEADER, Idem, IdemLayer, IdemService,
    Lookup, MIN_HEARTBEAT_LEASE, MemoryStore, OPERATION_ID_HEADER, OperationId, OperationReport,
    OperationStatus, Reconciled, Resolution, Store, StoreError, UnknownOperation, enforce,
    fingerprint, identity, problem, reconciler, recovery, store, telemetry,
};
#[cfg(feature = "postgres")]
pub use idem_runtime::{PgTx, PostgresStore};
#[cfg(feature = "sqlite")]
pub use idem_runtime::{SqliteStore, SqliteTx};
/// The Monday test: a conformance harness pointed at a contracted operation, its
/// loopback proxy, and the checks of its proofs 4 ([`TraceCapture`](testing::TraceCapture))
/// and 5 ([`OperatorCheck`](testing::OperatorCheck)) (the `idem-testing` crate).
#[cfg(feature = "testing")]
pub use idem_testing as testing;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[doc = include_str!("../docs/transaction.md")]
pub mod transaction {
    #[cfg(feature = "postgres")]
    pub use idem_runtime::transaction::PgTx;
    #[cfg(feature = "sqlite")]
    pub use idem_runtime::transaction::SqliteTx;
    pub use idem_runtime::transaction::Tx;
}

/// The client side of a contract: the retry policy it declares, one key per intent,
/// backoff, `Retry-After`, a retry budget and a typed outcome (the `idem-client` crate).
#[cfg(feature = "client")]
pub use idem_client as client;

/// The OpenAPI extension, the consumer docs and the contracts file: the library behind
/// the `idem` command (the `idem-codegen` crate).
#[cfg(feature = "codegen")]
pub use idem_codegen as codegen;

/// What the code generated by `#[idem::contract]` names. Not a public API: it changes
/// with the macro, which is pinned to the same version.
#[cfg(feature = "server")]
#[doc(hidden)]
pub mod __private {
    pub use idem_contract as contract;
    pub use idem_runtime::__private::*;
}
