//! The client side of an idem contract: the retry policy that the server's contract
//! declares, applied by the caller, so that a timeout never turns into a second order and
//! a retry never turns into a storm.
//!
//! ```no_run
//! use idem_client::{Call, Client, Intent, Outcome, RetryPolicy};
//!
//! # async fn run(openapi: &str) -> Result<(), Box<dyn std::error::Error>> {
//! // The contract as the API publishes it (`x-idempotency`); or `RetryPolicy::from_contract`.
//! let policy = RetryPolicy::from_openapi(openapi, "create_order")?;
//! let client = Client::new()?;
//! let order = serde_json::json!({"customer_id": "cus_42", "amount_minor": 1999});
//! let call = Call::post_json("http://127.0.0.1:3000/orders", &order)?.header("x-client-id", "acme")?;
//! match client.execute(Intent::new(policy), &call).await {   // one key for this intent
//!     Outcome::Completed(done) => println!("{} (replayed: {})", done.status, done.replayed),
//!     Outcome::Failed(failed) => println!("refused: {:?}", failed.problem),
//!     Outcome::Unknown(unknown) => println!("unknown: keep key {} and retry later", unknown.key()),
//! }
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backoff;
pub mod budget;
mod client;
mod intent;
mod outcome;
mod policy;
pub mod retry_after;
pub mod transport;

pub use backoff::{Backoff, Jitter};
pub use budget::RetryBudget;
pub use client::{Call, CallError, Client, LOOKUP_TIMEOUT};
pub use intent::{IdempotencyKey, Intent};
pub use outcome::{
    Completed, Failed, LastAttempt, LookupAnswer, OperationStatus, Outcome, Problem, StopReason,
    StoredAnswer, Unknown,
};
pub use policy::{PolicyBuilder, PolicyError, RetryPolicy};
pub use transport::{Answer, Reqwest, Transport, TransportError};
