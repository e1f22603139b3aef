//! The payment provider: the foreign service that moves the money. Its protocol, a client
//! ([`Provider`]) and an in-process server that speaks it ([`serve`],
//! [`spawn_in_process`]), for running the service with nothing else.
//!
//! # The protocol
//!
//! One call: `POST {base URL}/charges` with the header `Idempotency-Key: <key>` (1 to 255
//! visible ASCII characters) and the JSON body [`ChargeRequest`]:
//!
//! ```json
//! {"amount_minor": 2500, "currency": "EUR", "source": "card_visa_4242"}
//! ```
//!
//! The provider deduplicates on the key: the first request with a key decides the charge
//! and stores its answer; a later request with the same key and the same request gets the
//! same answer again. Every answer that is not a charge has the body
//! `{"code": "…", "message": "…"}` ([`Decline`]'s form).
//!
//! | answer | what it means | [`Provider::charge`] returns |
//! |---|---|---|
//! | 201 `{"id": "ch_…"}` | charged | `Ok(`[`Charge`]`)` |
//! | 200 `{"id": "ch_…"}` | the key's charge again (`Idempotent-Replayed: true`) | `Ok(`[`Charge`]`)` |
//! | 402 `{"code": "card_declined", …}` | declined, for good; a replay is 402 again | [`ChargeError::Declined`] |
//! | 409 `request_in_progress` | the key's first request is still running | [`ChargeError::Unknown`] |
//! | 422 `idempotency_key_reused` | the key was used for another request | [`ChargeError::Unknown`] |
//! | 400 `invalid_idempotency_key`, `invalid_request` | the key or the body breaks a rule | [`ChargeError::Unknown`] |
//! | 429, 5xx, any other | | [`ChargeError::Unknown`] |
//!
//! A timeout, a connection closed or reset, or a 2xx whose body is not `{"id": "…"}` is
//! also [`ChargeError::Unknown`]: the charge may or may not exist, and the same request
//! with the same key finds out without charging twice.

mod client;
mod server;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use client::{Provider, SetupError};
pub use server::{DECLINED_SOURCE_PREFIX, router, serve, spawn_in_process};

/// The path of the charge call, under the provider's base URL.
pub const CHARGES_PATH: &str = "charges";

/// The longest idempotency key the provider takes, in bytes.
pub const MAX_KEY_LEN: usize = 255;

/// A charge to make: the body of `POST /charges`.
///
/// Its `Debug` form leaves the card source out.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChargeRequest {
    /// The amount in minor units (cents for EUR), at least 1.
    pub amount_minor: i64,
    /// The ISO 4217 currency code, such as `EUR`.
    pub currency: String,
    /// The card or account to charge, such as `card_visa_4242`.
    pub source: String,
}

impl fmt::Debug for ChargeRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChargeRequest")
            .field("amount_minor", &self.amount_minor)
            .field("currency", &self.currency)
            .field("source", &"<redacted>")
            .finish()
    }
}

/// A charge the provider made: the body of its 200 or 201 answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// The provider's id of the charge, such as `ch_0192…`.
    pub id: String,
}

/// A definite refusal of a charge: the body of the provider's 402 answer,
/// `{"code": "card_declined", "message": "The card was declined."}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decline {
    /// A stable, machine-readable reason, such as `card_declined`; [`Decline::UNREADABLE`]
    /// when the provider's body could not be read.
    pub code: String,
    /// A sentence for people (empty when the provider sent none).
    #[serde(default)]
    pub message: String,
}

impl Decline {
    /// The code of a 402 whose body is not the expected JSON: still a decline.
    pub const UNREADABLE: &str = "declined";
}

/// Why a charge is not a [`Charge`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChargeError {
    /// The provider declined the charge (402): nothing was charged, and the same key will
    /// be declined again.
    #[error("the provider declined the charge: {} ({})", .0.message, .0.code)]
    Declined(Decline),
    /// What happened is not known: a timeout, a connection that failed, a busy or failing
    /// provider, or an answer that cannot be read. The charge may exist; send the same
    /// request with the same idempotency key again to learn its outcome. The sentence says
    /// what happened and never contains the card source.
    #[error("the charge's outcome is unknown: {0}")]
    Unknown(String),
}

/// Whether `key` is 1 to [`MAX_KEY_LEN`] visible ASCII characters.
pub(crate) fn is_valid_key(key: &str) -> bool {
    (1..=MAX_KEY_LEN).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic())
}
