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
//! // The document names the header the server tells clients apart by (`X-Client-Id`):
//! // a call without it is refused before it is sent.
//! let identity = policy.client_identity_header().unwrap_or("x-client-id");
//! let call = Call::post_json("http://127.0.0.1:3000/orders", &order)?.header(identity, "acme")?;
//! // `?`: nothing was sent (the call cannot carry the key, or lacks the identity).
//! let outcome = client.execute(Intent::new(policy), &call).await?;   // one key for this intent
//! tracing::info!("{outcome}");   // one line: outcome=completed operation=create_order status=201 ...
//! match outcome {
//!     Outcome::Completed(done) => println!("order {}", done.json::<serde_json::Value>()?["id"]),
//!     Outcome::Failed(failed) => println!("refused: {:?}", failed.problem),
//!     // Save the key; `Intent::resume(policy, IdempotencyKey::parse(&saved)?)` later, or
//!     // `client.execute(unknown.intent, &call)` now: a new window under the same key.
//!     Outcome::Unknown(unknown) => println!("unknown: resume under key {}", unknown.key()),
//! }
//! # Ok(()) }
//! ```
//!
//! # The rules
//!
//! - **One key per intent.** [`Intent::new`] makes the key, before the first send; every
//!   attempt of the intent sends it unchanged, where the contract says (a header, or a
//!   member of the JSON body). An intent is not `Clone` and [`Client::execute`] takes it
//!   by value, so it cannot be sent for another purchase by mistake; an
//!   [`Outcome::Unknown`] gives it back, to resume with the same key.
//! - **Resuming.** Executing an intent again (the one an [`Outcome::Unknown`] gave back,
//!   or one made from a saved key with [`Intent::resume`] after a restart) opens a new
//!   window under the same key: a fresh `max_attempts` and deadline, after asking the
//!   status lookup first; an operation it finds completed is returned without sending
//!   the command again. [`Intent::resume`] says exactly what that guarantees.
//! - **Budgets.** At most `max_attempts` requests per window (one
//!   [`Client::execute`]), the first included; none starts after the deadline (counted
//!   from the start of `execute`); each is bounded by the per-attempt
//!   timeout; retries spend the client's [`RetryBudget`] (gRPC's retry throttling), and
//!   a spent budget stops them.
//! - **Spacing.** Capped exponential backoff with full jitter ([`Backoff`]), never sooner
//!   than the server's `Retry-After` (all RFC 9110 forms, [`retry_after::parse`]); a
//!   `Retry-After` longer than the time left stops at once, with an unknown outcome.
//! - **What is retried.** The statuses and transport failures the contract declares
//!   retryable, idem's 409 `operation-in-progress` (after its `Retry-After`), idem's
//!   408 `request-timeout` (the body came too slowly; nothing was registered) and idem's
//!   503 `step-outcome-unknown` (the server resumes the operation on the retry). Any
//!   other 4xx is final ([`Outcome::Failed`]); any other 5xx, and a failure the contract
//!   does not declare, leave the outcome unknown, and the status lookup is asked.
//!
//! # Exactly one layer retries
//!
//! reqwest 0.13 retries some protocol-level refusals by itself (`reqwest::retry`); the
//! [`Reqwest`] transport turns that off, so that `max_attempts` is what the server sees (a
//! test sends to an upstream that always answers 429 and counts 4 requests for 4
//! attempts). With reqwest-middleware, implement [`Transport`] for its
//! `ClientWithMiddleware` (one `execute` call, as [`Reqwest`] does) and keep
//! `RetryTransientMiddleware` out of its stack: middleware for authentication or tracing
//! is fine, a second retrying layer is not.
//!
//! # Telemetry
//!
//! A `tracing` span `idem.operation` per intent (`idem.operation`, `idem.operation_id`,
//! `idem.outcome`, `idem.attempts`) and a child `idem.attempt` per request, with
//! OpenTelemetry's `http.request.resend_count` (absent on the first attempt, n on the
//! n-th resend within the window), `http.response.status_code` and `error.type`; an
//! `info` event for each attempt that did not end the operation and for the status
//! lookup that opens a resumed window, and a `warn` event for an unknown outcome and for
//! a call refused before sending ([`NotSent`]). No body, header value, URL or key is
//! recorded. An [`Outcome`] prints as one log line of the same kind (its `Display`).
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
pub use client::{Call, CallError, Client, LOOKUP_TIMEOUT, NotSent, Refusal};
/// Why a key was refused ([`IdempotencyKey::parse`], [`Intent::resume`]): the server's
/// own key rules.
pub use idem_contract::KeyError;
/// The header names the server writes and the client reads (`Operation-Id`,
/// `Idempotent-Replayed`).
pub use idem_contract::headers;
pub use intent::{IdempotencyKey, Intent};
pub use outcome::{
    BodyError, Completed, Failed, LastAttempt, LookupAnswer, OperationStatus, Outcome, Problem,
    StopReason, StoredAnswer, Unknown,
};
pub use policy::{PolicyBuilder, PolicyError, RetryPolicy};
pub use transport::{Answer, Reqwest, Transport, TransportError};
