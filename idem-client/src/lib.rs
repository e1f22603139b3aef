//! The client side of an idem contract.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backoff;
pub mod budget;
pub mod retry_after;
