//! The published side of an idem contract: the library behind the `idem` command (the
//! `idem-cli` package), with no store, server runtime or command-line parser in it.
//!
//! - [`extension`]: what a contract adds to an OpenAPI document: on its operation, the
//!   `x-idempotency` extension ([`idem_contract::extension::Extension`], described by
//!   [`idem_contract::schema`]: the nine properties, without the names of the server's
//!   functions), the key header parameter and the 400/401/409/413/422/429/503 problem
//!   answers; on its status lookup's operation, the lookup's answers.
//! - [`openapi`]: OpenAPI 3.0 and 3.1 documents in JSON or YAML, loaded with every key in
//!   its order, merged into, and saved in their own format.
//! - [`docs`]: consumer docs in Markdown and HTML.
//! - [`scan`] and [`contracts`]: contracts read from Rust source with the macro's own
//!   parser, or from a contracts file.
//! - `utoipa` (feature `utoipa`): contracts merged into a utoipa `OpenApi` value, in the
//!   service that serves it.
//!
//! ```
//! use std::path::Path;
//! use idem_codegen::{contracts, openapi::{self, Document}};
//!
//! let spec = "openapi: 3.0.3\ninfo: {title: Orders, version: '1'}\npaths:\n  /orders:\n    post:\n      operationId: create_order\n      responses:\n        '201': {description: Created}\n";
//! let mut doc = Document::parse(Path::new("orders.yaml"), spec)?;
//! let file = r#"{"version": 1, "contracts": [{"contract": {
//!   "operation": "create_order",
//!   "key_scope": {"per": "client", "source": {"in": "header", "name": "Idempotency-Key"}},
//!   "fingerprint": {"fields": ["customer_id", "amount_minor"]},
//!   "ttl": "24h", "deadline": {"total": "30s"}, "max_attempts": 4,
//!   "retryable": [429, 503, "timeout"],
//!   "concurrency": {"response": "conflict", "retry_after": "1s"},
//!   "status_lookup": {"handler": "order_status", "path": "/orders/operations/{key}"},
//!   "recovery": {"kind": "reconcile", "function": "reconcile_order"}}}]}"#;
//! let found = contracts::parse_file(Path::new("contracts.json"), file)?;
//! openapi::merge(&mut doc, &found)?;
//! let op = &doc.root["paths"]["/orders"]["post"];
//! assert_eq!(op["x-idempotency"]["ttl"], "1d");
//! assert_eq!(op["parameters"][0]["name"], "Idempotency-Key");
//! assert!(op["responses"]["409"]["headers"]["Retry-After"].is_object());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod contracts;
pub mod docs;
pub mod error;
pub mod extension;
pub mod io;
pub mod openapi;
pub mod problem;
pub mod scan;
#[cfg(feature = "utoipa")]
pub mod utoipa;
pub mod words;

pub use error::{Error, Errors, Position, Warning};
