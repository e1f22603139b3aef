//! What the harness found: scenarios × proofs, each with its verdict and evidence.

use std::fmt;

use crate::probe::FaultProbe;
use idem_runtime::TestFault;

/// One scenario of the Monday test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scenario {
    /// The answer is lost after the service sent it; the same request is sent again.
    LostAnswer,
    /// The operation answers 429 with `Retry-After`; the same request is sent again.
    TooManyRequests,
    /// The operation answers a transient 503; the same request is sent again.
    Transient503,
    /// The operation answers a permanent 400; the same request is sent again.
    Permanent400,
    /// Concurrent requests with one key.
    Concurrent,
    /// The attempt dies after its effect; recovery decides.
    Crash,
}

impl Scenario {
    /// Every scenario, in the order the harness runs them.
    pub const ALL: [Scenario; 6] = [
        Scenario::LostAnswer,
        Scenario::TooManyRequests,
        Scenario::Transient503,
        Scenario::Permanent400,
        Scenario::Concurrent,
        Scenario::Crash,
    ];

    /// The scenario's name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::LostAnswer => "lost answer",
            Scenario::TooManyRequests => "429 Retry-After",
            Scenario::Transient503 => "transient 503",
            Scenario::Permanent400 => "permanent 400",
            Scenario::Concurrent => "concurrent, one key",
            Scenario::Crash => "crash midway",
        }
    }

    /// The fault of the test-fault protocol the scenario makes the service apply, if it
    /// needs one (the lost answer and the concurrent requests do not).
    pub fn test_fault(self) -> Option<TestFault> {
        match self {
            Scenario::LostAnswer | Scenario::Concurrent => None,
            Scenario::TooManyRequests => Some(TestFault::Answer(429)),
            Scenario::Transient503 => Some(TestFault::Answer(503)),
            Scenario::Permanent400 => Some(TestFault::Answer(400)),
            Scenario::Crash => Some(TestFault::CrashAfterEffect),
        }
    }
}

/// The five proofs the Monday test checks in every scenario (docs/conformance.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proof {
    /// 1. The business data holds at most one result (exactly what the scenario
    ///    allows: one effect, or none after a permanent refusal).
    OneEffect,
    /// 2. The repeat is linked to the first attempt and creates no new operation.
    Linked,
    /// 3. The client gets the stored result or the state of the operation.
    ResultOrState,
    /// 4. The trace shows both physical attempts and one final outcome.
    Trace,
    /// 5. An operator can restore the state without editing the database by hand.
    OperatorRestore,
}

impl Proof {
    /// Every proof, in order.
    pub const ALL: [Proof; 5] = [
        Proof::OneEffect,
        Proof::Linked,
        Proof::ResultOrState,
        Proof::Trace,
        Proof::OperatorRestore,
    ];

    /// The proof's number (1 to 5) and name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Proof::OneEffect => "1 at most one result",
            Proof::Linked => "2 linked, no new operation",
            Proof::ResultOrState => "3 stored result or state",
            Proof::Trace => "4 trace: attempts, one outcome",
            Proof::OperatorRestore => "5 operator can restore",
        }
    }
}

/// The verdict on one proof, with its evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Checked, and it holds.
    Pass(String),
    /// Checked, and it does not hold.
    Fail(String),
    /// Not checked, and why (never counted as a pass).
    NotChecked(String),
}

impl Verdict {
    /// Whether this is a failure.
    pub fn is_fail(&self) -> bool {
        matches!(self, Verdict::Fail(_))
    }

    /// Whether this is a pass.
    pub fn is_pass(&self) -> bool {
        matches!(self, Verdict::Pass(_))
    }

    /// The evidence.
    pub fn evidence(&self) -> &str {
        match self {
            Verdict::Pass(e) | Verdict::Fail(e) | Verdict::NotChecked(e) => e,
        }
    }

    fn word(&self) -> &'static str {
        match self {
            Verdict::Pass(_) => "pass",
            Verdict::Fail(_) => "FAIL",
            Verdict::NotChecked(_) => "not checked",
        }
    }
}

/// The proofs of one scenario.
#[derive(Clone, Debug)]
pub struct ScenarioReport {
    /// The scenario.
    pub scenario: Scenario,
    /// The idempotency key it used (the concurrent requests' one key, the crash's key…);
    /// empty when the scenario was not run (the service does not honour the test-fault
    /// header).
    pub key: String,
    /// The verdict on each proof, in [`Proof::ALL`]'s order.
    pub proofs: [Verdict; 5],
}

impl ScenarioReport {
    /// The verdict on `proof`.
    pub fn verdict(&self, proof: Proof) -> &Verdict {
        &self.proofs[proof as usize]
    }

    /// A scenario none of whose proofs could be checked, for one reason.
    pub(super) fn not_checked(scenario: Scenario, key: String, why: &Verdict) -> ScenarioReport {
        ScenarioReport {
            scenario,
            key,
            proofs: std::array::from_fn(|_| why.clone()),
        }
    }
}

/// What the Monday test found: [`Display`](fmt::Display) prints it as a table.
#[derive(Clone, Debug)]
pub struct Report {
    /// The scenarios, in the order they ran.
    pub scenarios: Vec<ScenarioReport>,
    /// Whether the service honours the test-fault header, as found out before the
    /// scenarios that need it; `None` when none of them was to run.
    pub fault_probe: Option<FaultProbe>,
}

impl Report {
    /// Whether no proof failed (a proof not checked is not a failure, nor a pass).
    pub fn passed(&self) -> bool {
        self.failures().is_empty()
    }

    /// The failed proofs, scenario by scenario.
    pub fn failures(&self) -> Vec<(Scenario, Proof)> {
        self.filter(Verdict::is_fail)
    }

    /// The passed proofs, scenario by scenario.
    pub fn passes(&self) -> Vec<(Scenario, Proof)> {
        self.filter(Verdict::is_pass)
    }

    fn filter(&self, keep: impl Fn(&Verdict) -> bool) -> Vec<(Scenario, Proof)> {
        self.scenarios
            .iter()
            .flat_map(|s| {
                Proof::ALL
                    .into_iter()
                    .filter(|p| keep(s.verdict(*p)))
                    .map(|p| (s.scenario, p))
            })
            .collect()
    }

    /// The verdict on `proof` in `scenario`, if the scenario ran.
    pub fn verdict(&self, scenario: Scenario, proof: Proof) -> Option<&Verdict> {
        self.scenarios
            .iter()
            .find(|s| s.scenario == scenario)
            .map(|s| s.verdict(proof))
    }

    /// Panics with the table when a proof failed.
    #[track_caller]
    pub fn assert_passed(&self) {
        assert!(self.passed(), "the Monday test failed:\n{self}");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(probe) = &self.fault_probe {
            writeln!(f, "{}\n", probe.describe())?;
        }
        writeln!(
            f,
            "{:<20}  {:<30}  {:<11}  evidence",
            "scenario", "proof", "verdict"
        )?;
        for s in &self.scenarios {
            for (i, proof) in Proof::ALL.into_iter().enumerate() {
                let name = if i == 0 { s.scenario.name() } else { "" };
                let verdict = s.verdict(proof);
                writeln!(
                    f,
                    "{:<20}  {:<30}  {:<11}  {}",
                    name,
                    proof.name(),
                    verdict.word(),
                    verdict.evidence()
                )?;
            }
        }
        let failed = self.failures().len();
        let checked = self.passes().len() + failed;
        let total = self.scenarios.len() * Proof::ALL.len();
        write!(
            f,
            "{}: {} of {} proofs checked, {} failed, {} not checked",
            if failed == 0 { "passed" } else { "FAILED" },
            checked,
            total,
            failed,
            total - checked
        )
    }
}
