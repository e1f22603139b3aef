//! `concurrency`: what a duplicate gets while the first attempt is still running.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Duration;

/// The `Retry-After` of `concurrency = conflict` when the contract does not give one.
pub const DEFAULT_CONFLICT_RETRY_AFTER: Duration = Duration::from_millis(1000);

/// Property 7, `concurrency`: the answer to a request whose key is held by an attempt that
/// is still running.
///
/// Written `concurrency = conflict`, `concurrency = conflict(retry_after = "2s")`,
/// `concurrency = accepted` or `concurrency = wait("2s")`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "response", rename_all = "snake_case", deny_unknown_fields)]
pub enum Concurrency {
    /// `409 Conflict` with `Retry-After` (whole seconds, rounded up).
    Conflict {
        /// The `Retry-After` sent with the 409; one second by default.
        retry_after: Duration,
    },
    /// `202 Accepted` with a `Location` that points at the status lookup of the key. Needs
    /// the status lookup's `path`.
    Accepted,
    /// Wait up to `limit` for the first attempt to finish, then answer with its stored
    /// result, or with 409 and `Retry-After` if it is still running.
    Wait {
        /// The longest wait; never longer than the deadline.
        limit: Duration,
    },
}
