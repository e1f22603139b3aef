//! The idem contract model: the nine properties of a critical API command as plain data,
//! the rules that tie them together, and (feature `parse`) the parser of the
//! `#[idem::contract(..)]` attribute that the macro and the `idem` command share.
//!
//! Users reach these types through the `idem` crate; this crate exists so that the macro,
//! the runtime and the command line read one model with one set of rules (the layout of
//! `serde_derive_internals` and `darling_core`).
//!
//! Every rule is documented where it is checked: [`check()`](fn@crate::check) for the rules that tie values
//! together, and the parser for the rest.
//!
//! ```
//! use idem_contract::{Contract, check};
//!
//! let json = r#"{
//!   "operation": "create_order",
//!   "key_scope": { "per": "client", "source": { "in": "header", "name": "Idempotency-Key" } },
//!   "fingerprint": { "fields": ["customer_id", "amount_minor"] },
//!   "ttl": "10s",
//!   "deadline": { "total": "30s" },
//!   "max_attempts": 4,
//!   "retryable": [429, 503, 404, "timeout"],
//!   "concurrency": { "response": "conflict", "retry_after": "1s" },
//!   "status_lookup": { "handler": "order_operation_status" },
//!   "recovery": { "kind": "manual", "runbook": "https://runbooks.example.com/orders" }
//! }"#;
//! let contract: Contract = serde_json::from_str(json)?;
//! let violations = check(&contract);
//! assert_eq!(violations.len(), 2); // ttl shorter than deadline, and 404 is permanent
//! # Ok::<(), serde_json::Error>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod check;
mod concurrency;
mod contract;
mod deadline;
mod duration;
pub mod extension;
pub mod file;
mod fingerprint;
pub mod headers;
pub mod key;
pub mod lookup;
#[cfg(feature = "parse")]
pub mod parse;
pub mod problem;
mod property;
mod recovery;
pub mod status;

pub use check::{Location, Violation, check};
pub use concurrency::{Concurrency, DEFAULT_CONFLICT_RETRY_AFTER};
pub use contract::{Contract, MAX_ATTEMPTS_CEILING};
pub use deadline::Deadline;
pub use duration::{ACCEPTED_FORMS, Duration, DurationError};
pub use file::{ContractEntry, ContractsFile, Target};
pub use fingerprint::{FieldPath, Fingerprint};
pub use key::{KeyError, KeyFormat, KeyScope, KeySource, Namespace};
pub use lookup::StatusLookup;
pub use property::Property;
pub use recovery::Recovery;
pub use status::{Retryable, StatusCode, TransportFailure};

/// The JSON Schema (draft 2020-12) of the OpenAPI extension `x-idempotency`, which is the
/// serialised form of [`extension::Extension`]: a contract as its consumers read it, without
/// the names of the server's functions.
pub fn schema() -> schemars::Schema {
    let mut schema = schemars::schema_for!(extension::Extension);
    schema.insert("title".into(), "x-idempotency".into());
    schema
}
