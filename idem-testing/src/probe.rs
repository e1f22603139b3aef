//! Before the scenarios that need the test-fault protocol: does the service honour
//! `Idem-Test-Fault` at all?
//!
//! The probe is one request with `Idem-Test-Fault: answer-400` under a fresh key that no
//! scenario uses. A service that honours the protocol answers the permanent refusal, 400,
//! without the effect (and records it under that key, which nothing asks for again). One
//! that ignores the header runs the request as any other: typically one effect, which the
//! probe counts as its own, so that no scenario is charged with it.

use crate::report::{Scenario, Verdict};
use crate::seen::Seen;

/// What to do so that the service honours the header, in a few words (each verdict).
const SHORT_RECIPE: &str = "honour it under test: IdemBuilder::test_faults() (feature `testing`) in an idem service, the header's values in any other";

/// What to do so that the service honours the header, in a sentence (the probe's line).
const RECIPE: &str = "honour it under test: an idem service builds its handle with IdemBuilder::test_faults() (feature `testing`, in its tests or a test command, never its own build); any other service implements the header's values (answer-429, answer-503, answer-400, crash-after-effect)";

/// Whether the service honours the test-fault header (`Idem-Test-Fault`), as one probe
/// found out before the scenarios that need it (429, 503, 400, crash).
#[derive(Clone, Debug)]
pub struct FaultProbe {
    /// The fresh key the probe was sent under (no scenario uses it).
    pub key: String,
    /// The answer to the probe: the request with `Idem-Test-Fault: answer-400`.
    pub answer: Seen,
    /// The business effects counted around the probe: none from a service that honours
    /// the header; typically one from a service that ignores it and runs the request
    /// (counted here, in no scenario).
    pub effects: u64,
}

impl FaultProbe {
    /// Whether the service honours the header: it answered the probe with 400, the
    /// protocol's permanent refusal.
    pub fn honoured(&self) -> bool {
        self.answer.complete() && self.answer.status == Some(400)
    }

    /// The probe and what it found, in a line (the report prints it above its table).
    pub fn describe(&self) -> String {
        if self.honoured() {
            format!(
                "test faults: honoured (Idem-Test-Fault: answer-400 under a fresh key got {}, {} effect(s))",
                got(&self.answer),
                self.effects
            )
        } else {
            format!(
                "test faults: NOT honoured (Idem-Test-Fault: answer-400 under a fresh key got {} and {} effect(s), counted here and in no scenario): the scenarios that need the header are not run; to run them, {RECIPE}",
                got(&self.answer),
                self.effects
            )
        }
    }

    /// The verdict on every proof of `scenario` when the service does not honour the
    /// header: not checked, with the reason and the recipe.
    pub(super) fn not_run(&self, scenario: Scenario) -> Verdict {
        Verdict::NotChecked(format!(
            "not run: the service does not honour Idem-Test-Fault, which the {} scenario needs (answer-400 got {}); {SHORT_RECIPE}",
            scenario.name(),
            got(&self.answer)
        ))
    }
}

/// An answer's status, or why there is none.
fn got(answer: &Seen) -> String {
    match answer.status {
        Some(status) if answer.complete() => status.to_string(),
        _ => answer.describe(),
    }
}

/// The verdict on every proof of a scenario whose fault the service did not apply
/// although it honoured the probe: nothing happened that the proofs could judge.
pub(super) fn fault_ignored(fault: &str, answer: &Seen, effects: u64) -> String {
    format!(
        "Idem-Test-Fault: {fault} was answered {} ({effects} effect(s)), as if the header were not there: the service honours answer-400 but not this value, so the scenario shows nothing; {SHORT_RECIPE}",
        got(answer)
    )
}
