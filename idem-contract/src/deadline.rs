//! `deadline`: the time budget of one business operation.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Duration;

/// Property 4, `deadline`: the total time budget of the operation over all attempts, and
/// an optional timeout of each attempt.
///
/// Written `deadline = "30s"` or `deadline = ("30s", per_attempt = "5s")`.
///
/// The server gives one attempt at most `per_attempt` (or `total` when no per-attempt
/// timeout is declared) before it treats the outcome as unknown: that time is the lease
/// of the attempt. A per-attempt timeout longer than the total is
/// refused at compile time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Deadline {
    /// The budget of all attempts together, retries and waits included.
    pub total: Duration,
    /// The timeout of one attempt, if shorter than the total.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_attempt: Option<Duration>,
}

impl Deadline {
    /// How long one attempt may take: the per-attempt timeout, or else the total.
    pub const fn attempt_timeout(&self) -> Duration {
        match self.per_attempt {
            Some(d) => d,
            None => self.total,
        }
    }
}
