//! The idem example: an order service.
//!
//! `POST /orders` creates an order under a full idempotency contract (all nine properties,
//! see [`api::create_order()`](fn@api::create_order)); `GET /orders/{id}` reads one; `GET /orders/operations/{key}`
//! is the contract's status lookup; [`api::reconcile_create_order`] decides an operation
//! whose outcome is unknown. By default orders and idem's records live in one SQLite
//! file, and each order commits in one transaction with its idempotency record
//! ([`idem::SqliteTx`]); on PostgreSQL the same, shared by any number of instances
//! ([`idem::PgTx`]); with the records in memory the order is written through the pool
//! ([`Backend`] lists them all).
//!
//! Run it with `cargo run -p orders`; `--help` lists the options.
#![forbid(unsafe_code)]

pub mod api;
pub mod db;
pub mod model;
pub mod monday;
pub mod problem;
pub mod publish;
mod service;

pub use service::{Backend, Config, OpenError, Service};
