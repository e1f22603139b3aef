//! The status lookup, read at the end of each scenario, and what proof 2 makes of it: it
//! names the answers' operation; after a crash (whose attempt sent no answer) it alone
//! shows that the retries continued the crashed attempt's operation; and once the
//! operation has an outcome it must answer for the key.

use crate::report::{Scenario, Verdict};
use crate::seen::Seen;
use crate::send::Sender;

/// What the status lookup answered for a scenario's key.
#[derive(Clone, Debug)]
pub(super) enum Looked {
    /// No status lookup is configured.
    NotAsked,
    /// It answered with the operation's state (2xx, a JSON object).
    Found(serde_json::Value),
    /// It answered a state answer (a 409, 425 or 503 with `Retry-After`): ask again later.
    Later(String),
    /// It did not answer for the key: what it asked and what it got.
    Missing(String),
}

impl Looked {
    /// The operation's state, when the lookup gave it.
    pub(super) fn found(&self) -> Option<&serde_json::Value> {
        match self {
            Looked::Found(found) => Some(found),
            _ => None,
        }
    }
}

/// Asks the status lookup (`path`, with `{key}`) about `key`, as the client.
pub(super) async fn look(
    sender: &Sender,
    base: &reqwest::Url,
    path: Option<&str>,
    key: &str,
) -> Looked {
    let Some(path) = path else {
        return Looked::NotAsked;
    };
    let path = path.replace("{key}", key);
    let url = match base.join(&path) {
        Ok(url) => url,
        Err(e) => {
            return Looked::Missing(format!(
                "the status lookup `{path}` cannot be joined to the base URL: {e}"
            ));
        }
    };
    let asked = format!("the status lookup GET {url}");
    let seen = sender.get(url).await;
    let object = serde_json::from_slice::<serde_json::Value>(&seen.body)
        .ok()
        .filter(serde_json::Value::is_object);
    let two_hundred = seen.complete() && (200..300).contains(&seen.status());
    match object {
        Some(found) if two_hundred => Looked::Found(found),
        _ if two_hundred => Looked::Missing(format!(
            "{asked} answered {} with a body that is not a JSON object: the operation's state cannot be read from it",
            seen.describe()
        )),
        _ if seen.is_state() => Looked::Later(format!("{asked} answered {}", seen.describe())),
        _ => Looked::Missing(format!(
            "{asked} answered {}: it does not answer for the operation's key (the lookup's path is the contract's; Harness::status_lookup, or idem monday's --status-lookup, gives another)",
            seen.describe()
        )),
    }
}

/// Proof 2 with what the status lookup says. Once the operation has an outcome (the
/// scenario's last answer is complete and not a state answer), a lookup that does not
/// answer for its key fails the proof.
pub(super) fn with_lookup(
    scenario: Scenario,
    linked: Verdict,
    answers: &[Seen],
    looked: &Looked,
    effects: u64,
) -> Verdict {
    let ended = answers
        .last()
        .is_some_and(|a| a.complete() && !a.is_state());
    match (linked, looked) {
        (Verdict::Fail(why), Looked::Missing(missing)) if ended => {
            Verdict::Fail(format!("{why}; and {missing}"))
        }
        (Verdict::Pass(evidence), Looked::Missing(missing)) if ended => Verdict::Fail(format!(
            "{evidence}, but after the operation's outcome {missing}"
        )),
        (Verdict::Pass(evidence), looked) => {
            linked_by_lookup(scenario, evidence, answers, looked, effects)
        }
        (other, _) => other,
    }
}

/// Proof 2, the answers linked (`evidence`), with the lookup's state.
fn linked_by_lookup(
    scenario: Scenario,
    evidence: String,
    answers: &[Seen],
    looked: &Looked,
    effects: u64,
) -> Verdict {
    let crash = scenario == Scenario::Crash;
    let found = match looked {
        Looked::Found(found) => found,
        Looked::NotAsked if crash => {
            return Verdict::NotChecked(format!(
                "{evidence}, but the crashed attempt sent none: its link to the retries shows only in a status lookup (Harness::status_lookup)"
            ));
        }
        Looked::NotAsked => return Verdict::Pass(evidence),
        Looked::Later(got) | Looked::Missing(got) if crash => {
            return Verdict::NotChecked(format!(
                "{evidence}; {got}, so the crashed attempt's link to the retries is not shown"
            ));
        }
        Looked::Later(got) | Looked::Missing(got) => {
            return Verdict::Pass(format!("{evidence}; {got}"));
        }
    };
    let id = found.get("operation_id").and_then(|v| v.as_str());
    let first = answers.iter().find_map(|a| a.operation_id.as_deref());
    if let (Some(id), Some(first)) = (id, first)
        && id != first
    {
        return Verdict::Fail(format!(
            "{evidence}, but the status lookup names operation {id}"
        ));
    }
    if crash {
        match found.get("attempt").and_then(serde_json::Value::as_u64) {
            Some(n) if n >= 2 => {}
            Some(n) if crate::seen::crash_left_nothing(scenario, effects, Some(n)) => {
                return Verdict::Pass(format!(
                    "{evidence}; {}: the crashed attempt left nothing (its effect and its record rolled back together), and the retry ran as the operation's first attempt",
                    summary(found)
                ));
            }
            Some(n) => {
                return Verdict::Fail(format!(
                    "{evidence}, but the status lookup counts {n} attempt(s): the crashed attempt is not part of this operation"
                ));
            }
            None => {
                return Verdict::NotChecked(format!(
                    "{evidence}; the status lookup gives no attempt count, so the crashed attempt's link is not shown"
                ));
            }
        }
    }
    Verdict::Pass(format!("{evidence}; {}", summary(found)))
}

/// The lookup's state in a few words.
pub(super) fn summary(found: &serde_json::Value) -> String {
    format!(
        "status lookup: state {}, attempt {}",
        found.get("state").and_then(|v| v.as_str()).unwrap_or("?"),
        found
            .get("attempt")
            .map_or_else(|| "?".into(), |v| v.to_string())
    )
}
