//! What the harness saw: one answer, and what one scenario observed.

use crate::report::Scenario;
use crate::send::Sender;

/// One answer as the harness saw it.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// Its status, when a status line arrived.
    pub status: Option<u16>,
    /// Its `Operation-Id`.
    pub operation_id: Option<String>,
    /// Whether it said `Idempotent-Replayed: true`.
    pub replayed: bool,
    /// Its `Retry-After`.
    pub retry_after: Option<String>,
    /// Its `Location`.
    pub location: Option<String>,
    /// The `type` of its problem body, if it is one.
    pub problem_type: Option<String>,
    /// Its body.
    pub body: Vec<u8>,
    /// Why the answer is not complete (the connection broke, the time ran out).
    pub error: Option<String>,
}

impl Seen {
    /// No complete answer, and why.
    pub(super) fn broken(why: String) -> Seen {
        Seen {
            error: Some(why),
            ..Seen::default()
        }
    }

    pub(super) fn complete(&self) -> bool {
        self.error.is_none() && self.status.is_some()
    }

    pub(super) fn status(&self) -> u16 {
        self.status.unwrap_or(0)
    }

    pub(super) fn success(&self) -> bool {
        self.complete() && (200..300).contains(&self.status()) && self.status() != 202
    }

    /// An answer that gives the state of an unfinished operation: 202, or a 409 / 425 /
    /// 503 that says when to come back (`Retry-After`).
    pub(super) fn is_state(&self) -> bool {
        self.complete()
            && (self.status() == 202
                || (matches!(self.status(), 409 | 425 | 503) && self.retry_after.is_some()))
    }

    /// An answer that says the operation is parked for an operator: idem's 409
    /// `operation-outcome-unknown` (it has no `Retry-After`: retrying does not help).
    pub fn is_parked(&self) -> bool {
        self.complete()
            && self.status() == 409
            && self
                .problem_type
                .as_deref()
                .is_some_and(|t| t.ends_with("operation-outcome-unknown"))
    }

    /// The answer in a few words: its status, its problem type, whether it was replayed.
    pub fn describe(&self) -> String {
        let mut out = match (self.status, &self.error) {
            (_, Some(error)) => format!("no complete answer ({error})"),
            (Some(status), None) => status.to_string(),
            (None, None) => "no answer".into(),
        };
        if let Some(t) = &self.problem_type {
            out.push_str(&format!(" {}", short_type(t)));
        }
        if self.replayed {
            out.push_str(" (replayed)");
        }
        out
    }
}

fn short_type(t: &str) -> &str {
    t.rsplit(':').next().unwrap_or(t)
}

/// What one scenario observed, handed to a plugged-in check of proof 4 or 5.
///
/// Made only by the harness (it can send the scenario's request again:
/// [`Evidence::resend`]).
#[derive(Clone, Debug)]
pub struct Evidence {
    /// The scenario.
    pub scenario: Scenario,
    /// Its idempotency key.
    pub key: String,
    /// The value of the first client header the harness sent
    /// ([`Harness::client_header`](crate::Harness::client_header)), if any.
    pub client: Option<String>,
    /// The answers, in the order they arrived (a lost answer as the proxy read it).
    pub answers: Vec<Seen>,
    /// The business effects counted during the scenario.
    pub effects: u64,
    /// The status lookup's answer at the end, if a lookup was configured and answered
    /// 2xx with a JSON object.
    pub lookup: Option<serde_json::Value>,
    pub(super) sender: Sender,
}

impl Evidence {
    /// The distinct `Operation-Id`s of the answers, in order.
    pub fn operation_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = Vec::new();
        for id in self.answers.iter().filter_map(|a| a.operation_id.clone()) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }

    /// Whether the crash scenario's crashed attempt left nothing behind, its effect and
    /// its record rolled back together (a transactional service that registers the key
    /// inside the attempt's transaction): one effect, and the operation counts one
    /// attempt, `attempts` (or, without it, the status lookup's count), so the one
    /// effect is the retry's. Such a crashed attempt is no part of the operation, and
    /// its request is not counted as one of the operation's attempts.
    pub fn crash_left_nothing(&self, attempts: Option<u64>) -> bool {
        let looked = self
            .lookup
            .as_ref()
            .and_then(|found| found.get("attempt"))
            .and_then(serde_json::Value::as_u64);
        crash_left_nothing(self.scenario, self.effects, attempts.or(looked))
    }

    /// The scenario's operation id: the first `Operation-Id` of its answers, else the
    /// one the status lookup names.
    pub fn operation_id(&self) -> Option<String> {
        self.operation_ids().into_iter().next().or_else(|| {
            self.lookup
                .as_ref()?
                .get("operation_id")?
                .as_str()
                .map(str::to_owned)
        })
    }

    /// Sends the scenario's request again, with its key and without a fault, straight to
    /// the service, and returns the answer (a check of proof 5 does, after an
    /// operator's resolution).
    pub async fn resend(&self) -> Seen {
        self.sender.send(&self.sender.base, &self.key, None).await
    }
}

/// [`Evidence::crash_left_nothing`], from the scenario, its effects and the operation's
/// count of attempts.
pub(super) fn crash_left_nothing(scenario: Scenario, effects: u64, attempts: Option<u64>) -> bool {
    scenario == Scenario::Crash && effects == 1 && attempts == Some(1)
}
