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
//! let store = idem::SqliteStore::open("orders.db").await?;
//! let idem = idem::Idem::new(store, idem::identity::header("x-client-id"));
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
//! - [`Idem`]: the runtime handle (store, client identity, limits; [`IdemBuilder`]), its
//!   layer, and the start-up check of the handlers it serves ([`Idem::check_handlers`]).
//! - [`problem`]: every answer idem gives of its own, with its stable `type`;
//!   [`headers`]: the header names idem and its clients share.
//! - [`recovery`]: what happens to an operation whose outcome is unknown: a reconcile
//!   function's [`Decision`], the reconciler, the manual path.
//! - [`transaction`]: the transactional mode, where a handler's business writes and the
//!   key's final state commit in one transaction ([`SqliteTx`], `PgTx`), written through
//!   [`sqlx`], the sqlx idem was built with.
//! - [`store`]: the store traits and their backends ([`MemoryStore`], [`SqliteStore`],
//!   `PostgresStore` with the feature `postgres`, `RedisStore` with the feature `redis`),
//!   and `store::open` for a store named by a URL.
//! - [`enforce`]: the request path, stage by stage, for a handler written without the
//!   macro; and where each property of the contract is enforced.
//! - [`model`]: the contract as data, its rules ([`check()`](fn@model::check)) and its JSON Schema.
//! - [`telemetry`]: the spans, events and counters, and what is never recorded.
//! - `testing` (feature `testing`): the Monday test, a conformance harness pointed at a
//!   contracted operation, the test-fault protocol it drives (`IdemBuilder::test_faults`),
//!   and the checks of its proofs 4 and 5: `TraceCapture` (idem's spans) and
//!   `OperatorCheck` (the store's operator calls).
//! - [`guide`]: every answer, recovery an operator can run, the stores, the Monday test,
//!   publishing, the client, a service of your own from scratch, and the design.
//!
//! [`guide::answers`] lists every answer; [`problem`] every problem type.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

/// The rustdoc targets of the links between the guides of the repository's `docs/`
/// folder, put before each guide's text. Each guide ends with its own definitions
/// (`[answers]: answers.md`), which serve GitHub; Markdown uses the first definition of a
/// label, so in rustdoc these win. A doctest of a guide with this prefix is reported
/// under `src/lib.rs` and its module (`guide::client`), not under its file: `contract`
/// and `transaction`, whose many examples are worth their file and line, link no other
/// guide and take no prefix.
macro_rules! guide_links {
    () => {
        concat!(
            "[answers]: crate::guide::answers\n",
            "[client]: crate::guide::client\n",
            "[conformance]: crate::guide::conformance\n",
            "[design]: crate::guide::design\n",
            "[operations]: crate::guide::operations\n",
            "[publishing]: crate::guide::publishing\n",
            "[stores]: crate::guide::stores\n",
            "[steps]: crate::guide::steps\n",
            "[your-own-service]: crate::guide::your_own_service\n",
            server_links!(),
            transaction_links!(),
        )
    };
}

#[cfg(feature = "server")]
macro_rules! server_links {
    () => {
        "[contract]: macro@crate::contract\n[telemetry]: crate::telemetry\n"
    };
}
#[cfg(not(feature = "server"))]
macro_rules! server_links {
    () => {
        ""
    };
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
macro_rules! transaction_links {
    () => {
        "[transaction]: crate::transaction\n"
    };
}
#[cfg(not(any(feature = "sqlite", feature = "postgres")))]
macro_rules! transaction_links {
    () => {
        ""
    };
}

#[cfg(feature = "server")]
#[doc = include_str!("../docs/contract.md")]
pub use idem_macros::contract;

/// The contract as plain data: the nine properties, their rules ([`check()`](fn@model::check)),
/// the contracts file and the JSON Schema of the `x-idempotency` extension (the
/// `idem-contract` crate).
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

pub use idem_contract::headers;

// What a service author types, at the root: the handle, what a handler and a reconcile
// function take and give, the stores and their transactions. Everything has one
// canonical path; the stores, the transactions and the recovery types are documented in
// their modules, and their root paths are conveniences (`doc(no_inline)`).
/// The sqlx crate idem was built with, for a handler's writes in the transactional mode
/// (features `sqlite` and `postgres`): [`Tx::conn`](transaction::Tx::conn) gives a
/// connection of this sqlx, so a service writes
/// `idem::sqlx::query(..).execute(&mut *tx.conn().await?)` with no `sqlx` dependency of
/// its own to keep at idem's version.
///
/// It has sqlx's runtime for tokio and the drivers of idem's features (SQLite, PostgreSQL
/// with rustls), and none of sqlx's own optional features: the `query!` macros (which need
/// a database at build time), `json`, `uuid`, `chrono`. A service that needs them depends
/// on sqlx itself, at the version idem uses (`cargo tree -i sqlx`), and names the
/// features it wants; cargo builds one sqlx for both.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use idem_runtime::sqlx;
#[cfg(feature = "redis")]
#[doc(no_inline)]
pub use idem_runtime::store::RedisStore;
#[cfg(feature = "server")]
pub use idem_runtime::{
    Attempt, Idem, IdemBuilder, IdemLayer, IdemService, Journal, Lookup, NotConfigured,
    OperationId, OperationReport, OperationStatus, Operations, Serve, serve,
};
#[cfg(feature = "server")]
pub use idem_runtime::{enforce, identity, journal, outbox, problem, recovery, store};
#[cfg(feature = "server")]
#[doc(no_inline)]
pub use idem_runtime::{
    recovery::{Decision, UnknownOperation},
    store::MemoryStore,
};
#[cfg(feature = "postgres")]
#[doc(no_inline)]
pub use idem_runtime::{store::PostgresStore, transaction::PgTx};
#[cfg(feature = "sqlite")]
#[doc(no_inline)]
pub use idem_runtime::{store::SqliteStore, transaction::SqliteTx};
/// The Monday test: a conformance harness pointed at a contracted operation, its
/// loopback proxy, and the checks of its proofs 4 ([`TraceCapture`](testing::TraceCapture))
/// and 5 ([`OperatorCheck`](testing::OperatorCheck)) (the `idem-testing` crate).
#[cfg(feature = "testing")]
pub use idem_testing as testing;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub mod transaction {
    // Inner docs: their links (`[`Tx::conn`]`) resolve in this module.
    #![doc = include_str!("../docs/transaction.md")]

    #[cfg(feature = "postgres")]
    pub use idem_runtime::transaction::PgTx;
    #[cfg(feature = "sqlite")]
    pub use idem_runtime::transaction::SqliteTx;
    pub use idem_runtime::transaction::Tx;
}

#[cfg(feature = "server")]
pub mod telemetry {
    // Inner docs: their links (`[`SPAN_ATTEMPT`]`) resolve in this module.
    #![doc = guide_links!()]
    #![doc = include_str!("../docs/telemetry.md")]

    #[doc(inline)]
    pub use idem_runtime::telemetry::*;
}

/// The guides: the pages of the repository's `docs/` folder, each a module here so that
/// their Rust examples compile as doctests. The attribute's reference is
/// [`contract`](macro@crate::contract), the transactional mode's
/// `transaction` (features `sqlite`, `postgres`), telemetry's `telemetry`.
pub mod guide {
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/your-own-service.md")]
    pub mod your_own_service {}
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/answers.md")]
    pub mod answers {}
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/operations.md")]
    pub mod operations {}
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/stores.md")]
    pub mod stores {}
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/steps.md")]
    pub mod steps {}
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/conformance.md")]
    pub mod conformance {}
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/publishing.md")]
    pub mod publishing {}
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/client.md")]
    pub mod client {}
    #[doc = guide_links!()]
    #[doc = include_str!("../docs/design.md")]
    pub mod design {}
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
