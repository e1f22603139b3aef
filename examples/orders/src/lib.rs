//! The idem example: an order service.
//!
//! `POST /orders` creates an order under a full idempotency contract (all nine properties,
//! see [`api::create_order()`](fn@api::create_order)); `GET /orders/{id}` reads one; `GET /orders/operations/{key}`
//! is the contract's status lookup; [`api::reconcile_create_order`] decides an operation
//! whose outcome is unknown. Orders and idem's records live in one SQLite file, and each
//! order commits in one transaction with its idempotency record ([`idem::SqliteTx`]).
//!
//! Run it with `cargo run -p orders`; `--help` lists the options.
#![forbid(unsafe_code)]

pub mod api;
pub mod db;
pub mod model;
pub mod problem;
pub mod publish;
mod service;

pub use service::{Config, Service};
