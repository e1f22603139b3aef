//! The problem types (RFC 9457) a contracted operation answers with, as published in the
//! OpenAPI responses and the consumer docs.
//!
//! The catalogue is [`idem_contract::problem`], the one the runtime answers from, so the
//! published contract and the server cannot disagree about a status, a `state` or
//! `new_key_safe`.

pub use idem_contract::problem::{PROBLEM_JSON, ProblemType, TYPE_PREFIX};
